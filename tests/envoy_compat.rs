//! envoyproxy/ratelimit compatibility, behaviour by behaviour, against the real binary on
//! every backend (embedded, a private Redis, a private 3-master Cluster). Each test states the
//! reference behaviour it checks or the deliberate difference.

mod common;

use std::time::{Duration, Instant};

use common::backends::{Backend, Deployment};
use common::redis_server::RedisServer;
use common::server::{call, descriptor, request, EdgelimitServer, ServerOptions, OK, OVER_LIMIT};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;

const POLICY: &str = r#"
domain: compat
descriptors:
  - key: path
    value: /exact
    rate_limit: { unit: hour, requests_per_unit: 1, name: exact }
  - key: path
    value: /api/*
    rate_limit: { unit: hour, requests_per_unit: 2, name: wildcard }
  - key: path
    rate_limit: { unit: hour, requests_per_unit: 3, name: keyonly }
  - key: tier
    value: free
    rate_limit: { unit: hour, requests_per_unit: 2, name: tier }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 1, name: tier_user }
  - key: vip
    rate_limit: { unlimited: true }
  - key: multi
    rate_limits:
      - { unit: hour, requests_per_unit: 5, name: hourly }
      - { unit: day, requests_per_unit: 2, name: daily }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1, name: shadowed }
  - key: custom
    rate_limit: { window: 30s, requests_per_unit: 1, name: thirty_seconds }
  - key: costly
    rate_limit: { unit: hour, requests_per_unit: 10, max_cost: 3, name: costly }
  - key: replaced
    rate_limit: { unit: hour, requests_per_unit: 1, name: old_limit }
  - key: replacer
    rate_limit: { unit: hour, requests_per_unit: 5, name: new_limit }
    replaces:
      - name: old_limit
  - key: block
    rate_limit: { unit: hour, requests_per_unit: 0, name: blocked }
"#;

fn start(backend: Backend, extra: &str) -> Deployment {
    Deployment::start_with(backend, &[("compat.yaml", POLICY)], extra)
}

async fn ask(f: &Deployment, entries: &[(&str, &str)]) -> RateLimitResponse {
    let mut client = f.server.client().await;
    call(&mut client, request("compat", vec![descriptor(entries)]))
        .await
        .expect("call")
}

fn limit_name(r: &RateLimitResponse) -> Option<&str> {
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.name.as_str())
}

fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == key)
        .map(|h| h.value.as_str())
}

async fn exact_value_beats_wildcard_beats_key_only(backend: Backend) {
    let f = start(backend, "");
    assert_eq!(
        limit_name(&ask(&f, &[("path", "/exact")]).await),
        Some("exact")
    );
    assert_eq!(
        limit_name(&ask(&f, &[("path", "/api/users")]).await),
        Some("wildcard")
    );
    assert_eq!(
        limit_name(&ask(&f, &[("path", "/other")]).await),
        Some("keyonly")
    );
    // Key-only: each value has its own counter.
    let a = ask(&f, &[("path", "/one")]).await;
    let b = ask(&f, &[("path", "/two")]).await;
    assert_eq!(
        (a.statuses[0].limit_remaining, b.statuses[0].limit_remaining),
        (2, 2)
    );
    // Matching is case-sensitive.
    assert_eq!(limit_name(&ask(&f, &[("PATH", "/exact")]).await), None);
}

async fn a_limit_applies_only_at_the_depth_of_the_request(backend: Backend) {
    let f = start(backend, "");
    assert_eq!(
        limit_name(&ask(&f, &[("tier", "free")]).await),
        Some("tier")
    );
    assert_eq!(
        limit_name(&ask(&f, &[("tier", "free"), ("user", "u1")]).await),
        Some("tier_user")
    );
    let unmatched = ask(&f, &[("tier", "paid")]).await;
    assert_eq!(unmatched.overall_code, OK);
    assert!(unmatched.statuses[0].current_limit.is_none());
    assert_eq!(limit_name(&ask(&f, &[("user", "u1")]).await), None);
    let too_deep = ask(&f, &[("tier", "free"), ("user", "u1"), ("extra", "x")]).await;
    assert_eq!((too_deep.overall_code, limit_name(&too_deep)), (OK, None));
}

async fn unlimited_is_ok_with_maximum_remaining(backend: Backend) {
    let f = start(backend, "");
    let r = ask(&f, &[("vip", "anyone")]).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert!(r.statuses[0].current_limit.is_none());
}

async fn a_zero_limit_blocks_everything(backend: Backend) {
    let f = start(backend, "");
    let r = ask(&f, &[("block", "x")]).await;
    assert_eq!(
        (r.overall_code, limit_name(&r)),
        (OVER_LIMIT, Some("blocked"))
    );
}

async fn several_limits_report_the_most_restrictive(backend: Backend) {
    let f = start(backend, "");
    let first = ask(&f, &[("multi", "m")]).await;
    assert_eq!(first.overall_code, OK);
    assert_eq!(
        limit_name(&first),
        Some("daily"),
        "1 left of 2 beats 4 left of 5"
    );
    assert_eq!(first.statuses[0].limit_remaining, 1);
    assert_eq!(ask(&f, &[("multi", "m")]).await.overall_code, OK);
    let third = ask(&f, &[("multi", "m")]).await;
    assert_eq!(third.overall_code, OVER_LIMIT);
    assert_eq!(limit_name(&third), Some("daily"));
    assert_eq!(
        third.statuses[0].current_limit.as_ref().unwrap().unit,
        4,
        "DAY"
    );
}

async fn shadow_mode_rules_never_deny(backend: Backend) {
    let f = start(backend, "");
    for _ in 0..3 {
        let r = ask(&f, &[("shadow", "s")]).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }
    assert!(ask(&f, &[("shadow", "s")])
        .await
        .response_headers_to_add
        .is_empty());
}

async fn global_shadow_mode_never_denies(backend: Backend) {
    let f = start(backend, "shadow_mode: true");
    let r = ask(&f, &[("block", "x")]).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        limit_name(&r),
        Some("blocked"),
        "still evaluated and reported"
    );
    // As the reference: only the overall code is rewritten; the status stays as computed,
    // so Envoy's logs and headers still see the would-be denial.
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
}

async fn custom_window_lengths(backend: Backend) {
    let f = start(backend, "");
    let r = ask(&f, &[("custom", "c")]).await;
    assert_eq!(r.overall_code, OK);
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds <= 30, "{reset:?}");
    assert_eq!(ask(&f, &[("custom", "c")]).await.overall_code, OVER_LIMIT);
}

async fn request_hits_addend_is_the_cost(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let mut req = request("compat", vec![descriptor(&[("path", "/heavy")])]);
    req.hits_addend = 3;
    let r = call(&mut client, req.clone()).await.unwrap();
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    let r = call(&mut client, req).await.unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT);
}

async fn descriptor_hits_addend_zero_checks_without_consuming(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let mut peek = descriptor(&[("path", "/peek")]);
    peek.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..5 {
        let r = call(&mut client, request("compat", vec![peek.clone()]))
            .await
            .unwrap();
        assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 3));
    }
    let mut take_all = descriptor(&[("path", "/peek")]);
    take_all.hits_addend = Some(UInt64Value { value: 3 });
    let r = call(&mut client, request("compat", vec![take_all]))
        .await
        .unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let r = call(&mut client, request("compat", vec![peek]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT, "a peek reports exhaustion");
}

async fn cost_above_the_maximum_is_rejected_clearly(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let mut req = request("compat", vec![descriptor(&[("costly", "c")])]);
    req.hits_addend = 4;
    let err = call(&mut client, req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("maximum cost 3"),
        "{}",
        err.message()
    );
    assert_eq!(
        ask(&f, &[("costly", "c")]).await.overall_code,
        OK,
        "still serving"
    );
}

async fn descriptor_limit_override_replaces_the_configured_limit(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let mut d = descriptor(&[("anything", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 2,
        unit: 3,
    });
    let r = call(&mut client, request("compat", vec![d.clone()]))
        .await
        .unwrap();
    let limit = r.statuses[0]
        .current_limit
        .as_ref()
        .expect("override applies");
    assert_eq!((limit.requests_per_unit, limit.unit), (2, 3));
    call(&mut client, request("compat", vec![d.clone()]))
        .await
        .unwrap();
    let r = call(&mut client, request("compat", vec![d.clone()]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT);
    // Unknown domains ignore overrides, as the reference does.
    let r = call(&mut client, request("unknown", vec![d]))
        .await
        .unwrap();
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
}

async fn replaces_drops_the_named_limit_from_the_request(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let both = || {
        request(
            "compat",
            vec![
                descriptor(&[("replaced", "r")]),
                descriptor(&[("replacer", "r")]),
            ],
        )
    };
    for _ in 0..3 {
        let r = call(&mut client, both()).await.unwrap();
        assert_eq!(r.overall_code, OK, "old_limit (1/hour) no longer applies");
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(
            r.statuses[1].current_limit.as_ref().unwrap().name,
            "new_limit"
        );
    }
    let alone = ask(&f, &[("replaced", "r")]).await;
    assert_eq!(limit_name(&alone), Some("old_limit"));
}

async fn several_descriptors_answer_in_order_and_any_denial_is_overall(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let req = request(
        "compat",
        vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("block", "x")]),
            descriptor(&[("unmatched", "x")]),
        ],
    );
    let r = call(&mut client, req).await.unwrap();
    assert_eq!(r.overall_code, OVER_LIMIT);
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(codes, vec![OK, OVER_LIMIT, OK]);
}

async fn response_headers_draft_legacy_and_retry_after(backend: Backend) {
    let f = start(
        backend,
        "headers:\n  draft: true\n  legacy: true\n  retry_after: true",
    );
    let ok = ask(&f, &[("path", "/exact")]).await;
    assert_eq!(
        header(&ok, "RateLimit-Policy"),
        Some("\"exact\";q=1;w=3600")
    );
    let rl = header(&ok, "RateLimit").unwrap();
    assert!(rl.starts_with("\"exact\";r=0;t="), "{rl}");
    assert_eq!(header(&ok, "X-RateLimit-Limit"), Some("1"));
    assert_eq!(header(&ok, "X-RateLimit-Remaining"), Some("0"));
    assert_eq!(header(&ok, "Retry-After"), None);
    let denied = ask(&f, &[("path", "/exact")]).await;
    let retry: u64 = header(&denied, "Retry-After").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry));
    let reset: u64 = header(&denied, "X-RateLimit-Reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset <= 3600);
}

#[tokio::test]
async fn grpc_unavailable_failure_mode_returns_an_error_not_ok() {
    let mut redis = RedisServer::start();
    let server = EdgelimitServer::start(
        ServerOptions::redis(&redis.url(), &[("compat.yaml", POLICY)])
            .extra("failure_mode: grpc_unavailable"),
    );
    let mut client = server.client().await;
    let req = || request("compat", vec![descriptor(&[("path", "/x")])]);
    assert_eq!(call(&mut client, req()).await.unwrap().overall_code, OK);
    redis.stop();
    let err = call(&mut client, req()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // Descriptors without a limit need no backend and still answer.
    let r = call(
        &mut client,
        request("compat", vec![descriptor(&[("unmatched", "x")])]),
    )
    .await
    .unwrap();
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn a_deadline_shorter_than_the_command_timeout_is_the_backends_budget() {
    // The harness configures a 2 s command timeout; Envoy's default filter timeout is 20 ms.
    let f = start(Backend::Redis, "");
    let mut client = f.server.client().await;
    // 200 ms, below the command timeout, is the backend's budget: decided.
    let mut req = tonic::Request::new(request("compat", vec![descriptor(&[("path", "/d")])]));
    req.set_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let r = client
        .should_rate_limit(req)
        .await
        .expect("answered")
        .into_inner();
    assert!(started.elapsed() < Duration::from_millis(200) + Duration::from_secs(5));
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        f.redis.as_ref().expect("redis").cli(&["DBSIZE"]).trim(),
        "1"
    );
}

async fn bad_requests_are_invalid_argument_and_the_server_keeps_serving(backend: Backend) {
    let f = start(backend, "");
    let mut client = f.server.client().await;
    let long = "v".repeat(10_000);
    let bad = [
        request("", vec![descriptor(&[("path", "/x")])]),
        request("compat", vec![]),
        request("compat", vec![descriptor(&[("", "x")])]),
        request("compat", vec![descriptor(&[("path", &long)])]),
        request(
            "compat",
            (0..100).map(|_| descriptor(&[("path", "/x")])).collect(),
        ),
    ];
    for req in bad {
        let err = call(&mut client, req).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!err.message().is_empty());
    }
    assert_eq!(ask(&f, &[("path", "/fine")]).await.overall_code, OK);
    // A descriptor without entries is a no-match, as in the reference: OK without a limit,
    // and the other descriptors are still decided.
    let r = call(
        &mut client,
        request(
            "compat",
            vec![descriptor(&[]), descriptor(&[("block", "x")])],
        ),
    )
    .await
    .expect("answered");
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(r.statuses[1].code, OVER_LIMIT);
}

#[tokio::test]
async fn grpc_health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let f = start(Backend::Redis, "");
    let endpoint = format!("http://127.0.0.1:{}", f.server.grpc_port);
    let channel = tonic::transport::Channel::from_shared(endpoint)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = health
            .check(HealthCheckRequest {
                service: "envoy.service.ratelimit.v3.RateLimitService".into(),
            })
            .await
            .map(|r| r.into_inner().status);
        if status.as_ref().ok() == Some(&(ServingStatus::Serving as i32)) {
            break;
        }
        assert!(Instant::now() < deadline, "never SERVING: {status:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(tokio_stream::iter(vec![list]))
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = response.message_response else {
        panic!("unexpected reflection response");
    };
    let names: Vec<String> = services.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
    assert!(
        names.len() <= 4,
        "only RLS, health and reflection: {names:?}"
    );
}

on_every_backend!(
    exact_value_beats_wildcard_beats_key_only_on,
    exact_value_beats_wildcard_beats_key_only
);
on_every_backend!(
    a_limit_applies_only_at_the_depth_of_the_request_on,
    a_limit_applies_only_at_the_depth_of_the_request
);
on_every_backend!(
    unlimited_is_ok_with_maximum_remaining_on,
    unlimited_is_ok_with_maximum_remaining
);
on_every_backend!(
    a_zero_limit_blocks_everything_on,
    a_zero_limit_blocks_everything
);
on_every_backend!(
    several_limits_report_the_most_restrictive_on,
    several_limits_report_the_most_restrictive
);
on_every_backend!(
    shadow_mode_rules_never_deny_on,
    shadow_mode_rules_never_deny
);
on_every_backend!(
    global_shadow_mode_never_denies_on,
    global_shadow_mode_never_denies
);
on_every_backend!(custom_window_lengths_on, custom_window_lengths);
on_every_backend!(
    request_hits_addend_is_the_cost_on,
    request_hits_addend_is_the_cost
);
on_every_backend!(
    descriptor_hits_addend_zero_checks_without_consuming_on,
    descriptor_hits_addend_zero_checks_without_consuming
);
on_every_backend!(
    cost_above_the_maximum_is_rejected_clearly_on,
    cost_above_the_maximum_is_rejected_clearly
);
on_every_backend!(
    descriptor_limit_override_replaces_the_configured_limit_on,
    descriptor_limit_override_replaces_the_configured_limit
);
on_every_backend!(
    replaces_drops_the_named_limit_from_the_request_on,
    replaces_drops_the_named_limit_from_the_request
);
on_every_backend!(
    several_descriptors_answer_in_order_and_any_denial_is_overall_on,
    several_descriptors_answer_in_order_and_any_denial_is_overall
);
on_every_backend!(
    response_headers_draft_legacy_and_retry_after_on,
    response_headers_draft_legacy_and_retry_after
);
on_every_backend!(
    bad_requests_are_invalid_argument_and_the_server_keeps_serving_on,
    bad_requests_are_invalid_argument_and_the_server_keeps_serving
);
