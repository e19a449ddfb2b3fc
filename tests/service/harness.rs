use crate::common;

use common::redis_server::RedisServer;

#[test]
fn private_redis_starts_answers_and_restarts_empty() {
    let mut redis = RedisServer::start();
    assert_eq!(redis.cli(&["PING"]).trim(), "PONG");
    redis.cli(&["SET", "k", "v"]);
    redis.restart();
    assert_eq!(redis.cli(&["EXISTS", "k"]).trim(), "0");
}
