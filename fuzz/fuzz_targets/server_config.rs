//! Bytes as the server config file: parsed or refused with a message, never a panic.
#![no_main]

use edgelimit::bootstrap::ServerConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = ServerConfig::parse(text) {
        // What serving derives from an accepted config must not panic either.
        let _ = config.limits.request_bounds();
        let _ = config.backend_kind();
        let _ = config.require_policies();
        let _ = config.redis.settings();
    }
});
