//! The state-of-the-world subscription: one `StreamRlsConfigs` stream at a time, each
//! response validated as a whole and then served (ACK) or refused (NACK, last good set kept),
//! reconnecting with capped exponential back-off whenever the stream ends.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::{mpsc, oneshot};
use tonic::codegen::http::uri::PathAndQuery;

use super::convert;
use super::proto::{RATE_LIMIT_CONFIG_TYPE_URL, STREAM_RLS_CONFIGS_PATH};
use crate::bootstrap::telemetry::{self, ReloadResult};
use crate::policy::{LoadOptions, PolicySet};

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;
/// Longest NACK message sent back; the full list is in the logs.
const MAX_ERROR_DETAIL_BYTES: usize = 16 * 1024;

/// Where and how to subscribe (from `xds:` or the reference's `CONFIG_GRPC_XDS_*`).
#[derive(Debug, Clone)]
pub struct XdsSettings {
    pub server_url: String,
    pub node_id: String,
    pub connect_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub max_message_bytes: usize,
    /// CA (and client certificate) for an `https://` server.
    pub tls: Option<crate::bootstrap::config::TlsConfig>,
    /// Name the server's certificate is verified for, instead of the URL's host.
    pub tls_server_name: Option<String>,
}

/// What one stream came to, for the back-off decision.
struct Session {
    /// A response arrived: the server was healthy, so the next attempt starts quickly.
    received: bool,
}

/// Subscribes until aborted. `first` fires once the first valid snapshot is served.
pub async fn run(
    settings: XdsSettings,
    options: LoadOptions,
    policies: Arc<ArcSwap<PolicySet>>,
    mut first: Option<oneshot::Sender<()>>,
) {
    let mut backoff = settings.backoff_initial;
    // The version last ACKed, repeated in NACKs and after a reconnect, as xDS clients do.
    let mut accepted = String::new();
    loop {
        let mut session = Session { received: false };
        let result = stream(
            &settings,
            &options,
            &policies,
            &mut accepted,
            &mut first,
            &mut session,
        )
        .await;
        match result {
            Ok(()) => tracing::warn!(
                server = %settings.server_url,
                "xDS stream closed by the management server; still serving the last good set"
            ),
            Err(error) => tracing::warn!(
                server = %settings.server_url,
                %error,
                "xDS stream failed; still serving the last good set"
            ),
        }
        if session.received {
            backoff = settings.backoff_initial;
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff.saturating_mul(2).min(settings.backoff_max);
    }
}

fn request(
    settings: &XdsSettings,
    version: &str,
    nonce: &str,
    error: Option<Status>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(Node {
            id: settings.node_id.clone(),
            user_agent_name: "edgelimit".into(),
            ..Node::default()
        }),
        type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
        response_nonce: nonce.to_owned(),
        error_detail: error,
        ..DiscoveryRequest::default()
    }
}

async fn stream(
    settings: &XdsSettings,
    options: &LoadOptions,
    policies: &Arc<ArcSwap<PolicySet>>,
    accepted: &mut String,
    first: &mut Option<oneshot::Sender<()>>,
    session: &mut Session,
) -> anyhow::Result<()> {
    let endpoint = tonic::transport::Endpoint::from_shared(settings.server_url.clone())?
        .connect_timeout(settings.connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = match &settings.tls {
        // Files are read on every connection, so rotated certificates are picked up.
        Some(tls) => {
            let config = super::tls::client_config(tls)?;
            tokio::time::timeout(
                settings.connect_timeout,
                endpoint.connect_with_connector(super::tls::connector_named(
                    config,
                    settings.tls_server_name.clone(),
                )),
            )
            .await
            .map_err(|_| anyhow::anyhow!("TLS connection timed out"))??
        }
        None => endpoint.connect().await?,
    };
    let mut grpc =
        tonic::client::Grpc::new(channel).max_decoding_message_size(settings.max_message_bytes);
    grpc.ready().await?;
    // One request in flight at most: the next is sent only after a response.
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(2);
    tx.send(request(settings, accepted, "", None)).await?;
    let codec = tonic_prost::ProstCodec::<DiscoveryRequest, DiscoveryResponse>::default();
    let mut responses = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            PathAndQuery::from_static(STREAM_RLS_CONFIGS_PATH),
            codec,
        )
        .await?
        .into_inner();
    tracing::info!(server = %settings.server_url, node = %settings.node_id, "xDS stream open");
    while let Some(response) = responses.message().await? {
        session.received = true;
        let reply = apply(settings, options, policies, accepted, first, response).await;
        tx.send(reply).await?;
    }
    Ok(())
}

/// Validates and serves one response; the ACK or NACK to send back.
async fn apply(
    settings: &XdsSettings,
    options: &LoadOptions,
    policies: &Arc<ArcSwap<PolicySet>>,
    accepted: &mut String,
    first: &mut Option<oneshot::Sender<()>>,
    response: DiscoveryResponse,
) -> DiscoveryRequest {
    let version = response.version_info.clone();
    let nonce = response.nonce.clone();
    if response.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
        let message = format!(
            "type_url: expected {RATE_LIMIT_CONFIG_TYPE_URL}, got {:?}",
            response.type_url
        );
        tracing::error!(%version, %message, "xDS response rejected");
        telemetry::record_reload(ReloadResult::Failure);
        return request(settings, accepted, &nonce, Some(nack(message)));
    }
    // Decoding and compiling a large set is CPU work: off the request threads.
    let job_options = options.clone();
    let built =
        tokio::task::spawn_blocking(move || convert::snapshot(&response.resources, &job_options))
            .await;
    match built {
        Ok(Ok(set)) => {
            telemetry::record_reload(ReloadResult::Success);
            if set.revision() != policies.load().revision() {
                telemetry::record_loaded(&set);
                tracing::info!(
                    %version,
                    revision = %crate::contract::Revision(set.revision()),
                    domains = set.domains().count(),
                    rules = set.len(),
                    "policies from xDS served"
                );
                policies.store(Arc::new(set));
            } else {
                tracing::debug!(%version, "xDS snapshot unchanged");
            }
            version.clone_into(accepted);
            if let Some(first) = first.take() {
                let _ = first.send(());
            }
            request(settings, accepted, &nonce, None)
        }
        Ok(Err(errors)) => {
            telemetry::record_reload(ReloadResult::Failure);
            for error in errors.errors() {
                tracing::error!(%version, %error, "xDS policy error");
            }
            tracing::error!(
                %version,
                errors = errors.errors().len(),
                "xDS snapshot rejected (NACK); still serving the last good set"
            );
            request(settings, accepted, &nonce, Some(nack(errors.to_string())))
        }
        Err(error) => {
            telemetry::record_reload(ReloadResult::Failure);
            tracing::error!(%error, "xDS snapshot validation task failed");
            request(
                settings,
                accepted,
                &nonce,
                Some(nack("internal error while validating".into())),
            )
        }
    }
}

fn nack(mut message: String) -> Status {
    if message.len() > MAX_ERROR_DETAIL_BYTES {
        let mut end = MAX_ERROR_DETAIL_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("\n(truncated)");
    }
    Status {
        code: INVALID_ARGUMENT,
        message,
        details: Vec::new(),
    }
}
