//! Policies from an xDS management server (Envoy Gateway's way of configuring the reference):
//! `RateLimitConfigDiscoveryService/StreamRlsConfigs`, state of the world.

pub mod client;
pub mod convert;
pub mod proto;
pub mod tls;

pub use client::XdsSettings;

use std::time::Duration;

use serde::Deserialize;

use super::config::TlsConfig;
use super::duration::serde_duration;

/// `xds:` in the server configuration: policies come from this management server instead of
/// `policy_dir`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XdsConfig {
    /// `http://host:port` (`https://` with `tls`).
    pub server_url: String,
    /// Sent as `node.id`; the management server picks the snapshot by it.
    pub node_id: String,
    /// Serve (with no policies) before the first snapshot instead of waiting for it.
    #[serde(default)]
    pub force_start_without_initial_config: bool,
    /// CA to verify the management server (Mozilla's roots when `ca_file` is unset), and a
    /// client certificate for mTLS.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Verify the management server's certificate for this name rather than the URL's host
    /// (the reference's `CONFIG_GRPC_XDS_SERVER_TLS_SAN`).
    #[serde(default)]
    pub tls_server_name: Option<String>,
    #[serde(default = "default_connect_timeout", with = "serde_duration")]
    pub connect_timeout: Duration,
    #[serde(default = "default_backoff_initial", with = "serde_duration")]
    pub backoff_initial: Duration,
    #[serde(default = "default_backoff_max", with = "serde_duration")]
    pub backoff_max: Duration,
    /// Largest `DiscoveryResponse` accepted.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_backoff_initial() -> Duration {
    Duration::from_millis(500)
}
fn default_backoff_max() -> Duration {
    Duration::from_secs(30)
}
fn default_max_message_bytes() -> usize {
    16 * 1024 * 1024
}

impl XdsConfig {
    pub fn new(server_url: String, node_id: String) -> Self {
        Self {
            server_url,
            node_id,
            force_start_without_initial_config: false,
            tls: None,
            tls_server_name: None,
            connect_timeout: default_connect_timeout(),
            backoff_initial: default_backoff_initial(),
            backoff_max: default_backoff_max(),
            max_message_bytes: default_max_message_bytes(),
        }
    }

    /// Checks what serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        let url = self.server_url.as_str();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "xds.server_url: expected http://host:port or https://host:port, got {url:?}"
            ));
        }
        // Never plaintext when TLS was asked for, and never TLS without its settings.
        match (&self.tls, url.starts_with("https://")) {
            (Some(_), false) => {
                return Err("xds.tls: set, so xds.server_url must be https://".into())
            }
            (None, true) => {
                return Err(
                    "xds.server_url: https:// needs xds.tls (an empty one verifies against Mozilla's roots)"
                        .into(),
                )
            }
            _ => {}
        }
        if let Some(name) = &self.tls_server_name {
            if self.tls.is_none() {
                return Err("xds.tls_server_name: needs xds.tls".into());
            }
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                return Err(format!(
                    "xds.tls_server_name: {name:?} is not a DNS name or IP address"
                ));
            }
        }
        if self.node_id.is_empty() {
            return Err("xds.node_id: must not be empty".into());
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return Err(
                "xds.backoff_initial: must be above zero and at most xds.backoff_max".into(),
            );
        }
        if self.max_message_bytes == 0 {
            return Err("xds.max_message_bytes: must be at least 1".into());
        }
        Ok(())
    }

    pub fn settings(&self) -> XdsSettings {
        XdsSettings {
            server_url: self.server_url.clone(),
            node_id: self.node_id.clone(),
            connect_timeout: self.connect_timeout,
            backoff_initial: self.backoff_initial,
            backoff_max: self.backoff_max,
            max_message_bytes: self.max_message_bytes,
            tls: self.tls.clone(),
            tls_server_name: self.tls_server_name.clone(),
        }
    }
}

/// Starts the subscription. Unless `force_start_without_initial_config`, returns only once
/// the first valid snapshot is served, so the listeners never open on an empty set.
pub async fn start(
    config: &XdsConfig,
    options: crate::policy::LoadOptions,
    policies: std::sync::Arc<arc_swap::ArcSwap<crate::policy::PolicySet>>,
) -> tokio::task::JoinHandle<()> {
    let (first, got_first) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(client::run(
        config.settings(),
        options,
        policies,
        Some(first),
    ));
    if config.force_start_without_initial_config {
        tracing::warn!(
            server = %config.server_url,
            "starting without initial configuration: no limits are served until the first xDS snapshot"
        );
    } else {
        tracing::info!(server = %config.server_url, "waiting for the first xDS snapshot");
        let _ = got_first.await;
    }
    task
}
