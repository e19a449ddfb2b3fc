//! TLS and mTLS on the gRPC listener, with certificates made by `openssl`: a client with a
//! certificate from the configured client CA is served; plaintext, an anonymous client and a
//! client that does not trust the server's certificate are refused.

mod common;

use std::path::Path;
use std::time::Duration;

use common::server::{call, descriptor, request, EdgelimitServer, ServerOptions, OK};
use common::topologies::Certs;
use edgelimit::bootstrap::config::TlsConfig;
use edgelimit::bootstrap::xds::tls::{client_config, connector};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Endpoint;

const POLICY: &str =
    "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// One ShouldRateLimit over TLS as `client` (CA to trust, optional client certificate).
async fn ask_tls(
    server: &EdgelimitServer,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<i32, String> {
    let tls = TlsConfig {
        ca_file: Some(ca.to_owned()),
        cert_file: identity.map(|(c, _)| c.to_owned()),
        key_file: identity.map(|(_, k)| k.to_owned()),
    };
    let config = client_config(&tls).map_err(|e| e.to_string())?;
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", server.grpc_port))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(connector(config))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut client = RateLimitServiceClient::new(channel);
    call(&mut client, request("tls", vec![descriptor(&[("k", "v")])]))
        .await
        .map(|r| r.overall_code)
        .map_err(|e| format!("call: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_listener_serves_trusted_clients_only() {
    let dir = tempfile::tempdir().expect("cert dir");
    let certs = Certs::generate(dir.path());
    let server = EdgelimitServer::start(ServerOptions::memory(&[("tls.yaml", POLICY)]).extra(
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n  client_ca_file: {}\n",
            certs.server_cert.display(),
            certs.server_key.display(),
            certs.ca.display()
        ),
    ));
    let identity = Some((certs.client_cert.as_path(), certs.client_key.as_path()));

    assert_eq!(
        ask_tls(&server, &certs.ca, identity).await,
        Ok(OK),
        "{}",
        server.log_text()
    );

    // Plaintext HTTP/2 to a TLS listener gets no answer.
    let plaintext = async {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{}", server.grpc_port))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = RateLimitServiceClient::new(channel);
        call(&mut client, request("tls", vec![descriptor(&[("k", "v")])]))
            .await
            .map(|r| r.overall_code)
            .map_err(|e| e.to_string())
    };
    assert!(plaintext.await.is_err(), "plaintext refused");

    // mTLS: no client certificate, refused.
    assert!(
        ask_tls(&server, &certs.ca, None).await.is_err(),
        "anonymous client refused"
    );
    // The client does not trust the server's certificate.
    assert!(
        ask_tls(&server, &certs.other_ca, identity).await.is_err(),
        "untrusted server refused"
    );

    // The listener still serves trusted clients after the refusals, which are counted.
    assert_eq!(ask_tls(&server, &certs.ca, identity).await, Ok(OK));
    assert_refused_handshakes_counted(&server, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_client_ca_serves_any_client_over_tls() {
    let dir = tempfile::tempdir().expect("cert dir");
    let certs = Certs::generate(dir.path());
    let server = EdgelimitServer::start(ServerOptions::memory(&[("tls.yaml", POLICY)]).extra(
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            certs.server_cert.display(),
            certs.server_key.display()
        ),
    ));
    assert_eq!(
        ask_tls(&server, &certs.ca, None).await,
        Ok(OK),
        "{}",
        server.log_text()
    );
}

/// Replaces `to` with `from`'s content atomically (write aside, rename), as a secret update.
fn replace_file(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).expect("copy");
    std::fs::rename(&tmp, to).expect("rename");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_to_new_connections_without_dropping_old_ones() {
    let dir = tempfile::tempdir().expect("cert dir");
    let old = Certs::generate(&mkdir(dir.path().join("old")));
    let new = Certs::generate(&mkdir(dir.path().join("new")));
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    replace_file(&old.server_cert, &cert);
    replace_file(&old.server_key, &key);
    let server = EdgelimitServer::start(ServerOptions::memory(&[("tls.yaml", POLICY)]).extra(
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n",
            cert.display(),
            key.display()
        ),
    ));
    assert_eq!(
        ask_tls(&server, &old.ca, None).await,
        Ok(OK),
        "{}",
        server.log_text()
    );
    // An established connection from before the rotation.
    let tls = TlsConfig {
        ca_file: Some(old.ca.clone()),
        cert_file: None,
        key_file: None,
    };
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", server.grpc_port))
        .expect("endpoint")
        .connect_with_connector(connector(client_config(&tls).expect("tls")))
        .await
        .expect("connect");
    let mut established = RateLimitServiceClient::new(channel);

    replace_file(&new.server_cert, &cert);
    replace_file(&new.server_key, &key);
    let mut rotated = false;
    for _ in 0..100 {
        if ask_tls(&server, &new.ca, None).await == Ok(OK) {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rotated, "new certificate served:\n{}", server.log_text());
    assert!(
        ask_tls(&server, &old.ca, None).await.is_err(),
        "the old certificate is no longer served"
    );
    let answer = call(
        &mut established,
        request("tls", vec![descriptor(&[("k", "v")])]),
    )
    .await
    .map(|r| r.overall_code);
    assert_eq!(
        answer.ok(),
        Some(OK),
        "the established connection survived the rotation"
    );
}

fn mkdir(path: std::path::PathBuf) -> std::path::PathBuf {
    std::fs::create_dir_all(&path).expect("mkdir");
    path
}

/// At least `at_least` TLS handshakes refused, in the server's metrics.
fn assert_refused_handshakes_counted(server: &EdgelimitServer, at_least: f64) {
    let refused = common::server::metric(
        &server.metrics(),
        "edgelimit_grpc_tls_handshake_failures_total",
        &[("reason", "refused")],
    );
    assert!(
        refused.is_some_and(|n| n >= at_least),
        "refused handshakes counted: {refused:?}"
    );
}

/// A client certificate signed by the test CA, valid for `san` (DNS).
fn client_cert_with_san(
    dir: &Path,
    name: &str,
    san: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    Certs::issue(
        dir,
        name,
        "client",
        &format!("subjectAltName=DNS:{san}\nextendedKeyUsage=clientAuth\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_san_admits_only_the_configured_name() {
    let dir = tempfile::tempdir().expect("cert dir");
    let certs = Certs::generate(dir.path());
    let (good_cert, good_key) = client_cert_with_san(dir.path(), "envoy", "envoy.gateway.local");
    let (other_cert, other_key) = client_cert_with_san(dir.path(), "other", "other.local");
    let server = EdgelimitServer::start(ServerOptions::memory(&[("tls.yaml", POLICY)]).extra(
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n  client_ca_file: {}\n  client_san: envoy.gateway.local\n",
            certs.server_cert.display(),
            certs.server_key.display(),
            certs.ca.display()
        ),
    ));
    assert_eq!(
        ask_tls(&server, &certs.ca, Some((&good_cert, &good_key))).await,
        Ok(OK),
        "{}",
        server.log_text()
    );
    // Same CA, other SAN; and the harness's client certificate, which has no SAN at all.
    assert!(ask_tls(&server, &certs.ca, Some((&other_cert, &other_key)))
        .await
        .is_err());
    let no_san = Some((certs.client_cert.as_path(), certs.client_key.as_path()));
    assert!(ask_tls(&server, &certs.ca, no_san).await.is_err());
    assert_refused_handshakes_counted(&server, 2.0);
    assert_eq!(
        ask_tls(&server, &certs.ca, Some((&good_cert, &good_key))).await,
        Ok(OK)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_client_ca_is_used_for_new_handshakes() {
    let dir = tempfile::tempdir().expect("cert dir");
    let old = Certs::generate(&mkdir(dir.path().join("old")));
    let new = Certs::generate(&mkdir(dir.path().join("new")));
    let ca = dir.path().join("client-ca.crt");
    replace_file(&old.ca, &ca);
    let server = EdgelimitServer::start(ServerOptions::memory(&[("tls.yaml", POLICY)]).extra(
        &format!(
            "tls:\n  cert_file: {}\n  key_file: {}\n  client_ca_file: {}\n",
            old.server_cert.display(),
            old.server_key.display(),
            ca.display()
        ),
    ));
    let old_client = Some((old.client_cert.as_path(), old.client_key.as_path()));
    let new_client = Some((new.client_cert.as_path(), new.client_key.as_path()));
    assert_eq!(
        ask_tls(&server, &old.ca, old_client).await,
        Ok(OK),
        "{}",
        server.log_text()
    );
    assert!(
        ask_tls(&server, &old.ca, new_client).await.is_err(),
        "new CA not yet trusted"
    );

    replace_file(&new.ca, &ca);
    let mut rotated = false;
    for _ in 0..100 {
        if ask_tls(&server, &old.ca, new_client).await == Ok(OK) {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        rotated,
        "client of the new CA admitted:\n{}",
        server.log_text()
    );
    assert!(
        ask_tls(&server, &old.ca, old_client).await.is_err(),
        "the old CA's clients are refused after the rotation"
    );
    assert!(server.log_text().contains("client CA reloaded"));
}
