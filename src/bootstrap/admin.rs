//! The HTTP admin listener: `/metrics`, `/healthz`, `/readyz` and `/admin/policies`, and the
//! reference's `/healthcheck` and `/json`. It shows configuration, never secrets and never
//! request values.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::Code, RateLimitRequest, RateLimitResponse,
};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;

use super::readiness::Readiness;
use crate::contract::Revision;
use crate::policy::{PolicySet, Rule};

/// The limiter's decision, as `/json` asks for it (the limiter is generic over its backend).
pub type Decide = Arc<
    dyn Fn(
            RateLimitRequest,
        )
            -> Pin<Box<dyn Future<Output = Result<RateLimitResponse, tonic::Status>> + Send>>
        + Send
        + Sync,
>;

#[derive(Clone)]
pub struct AdminState {
    pub readiness: Arc<Readiness>,
    pub policies: Arc<ArcSwap<PolicySet>>,
    pub metrics: PrometheusHandle,
    pub decide: Decide,
    /// Largest `/json` body accepted, in bytes (the gRPC message bound).
    pub max_json_bytes: usize,
}

pub fn router(state: AdminState) -> Router {
    let max = state.max_json_bytes;
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .route("/json", any(json).layer(DefaultBodyLimit::max(max)))
        .route("/admin/policies", get(policies))
        .route("/rlconfig", get(rlconfig))
        .with_state(state)
}

/// The reference's health check: `200 OK` while serving, `500` otherwise (starting, backend
/// unreachable, shutting down, or no policy loaded when that is required).
async fn healthcheck(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, TEXT)], "OK"),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, TEXT)],
            "",
        ),
    }
}

/// The reference's `/json`: a proto3-JSON `RateLimitRequest`, answered with the JSON
/// `RateLimitResponse`: 200 (OK), 429 (OVER_LIMIT), 500 (UNKNOWN overall code, or a backend
/// failure answered as a gRPC error), 400 (a body or request the service refuses).
async fn json(State(state): State<AdminState>, body: Bytes) -> axum::response::Response {
    let plain = |code: StatusCode, message: String| {
        (code, [(header::CONTENT_TYPE, TEXT)], message).into_response()
    };
    let request = match super::json::parse_request(&body) {
        Ok(request) => request,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("Bad Request: {e}\n")),
    };
    let response = match (state.decide)(request).await {
        Ok(response) => response,
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("Bad Request: {}\n", status.message()),
            )
        }
        Err(status) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: {}\n", status.message()),
            )
        }
    };
    let code = match Code::try_from(response.overall_code) {
        Ok(Code::Ok) => StatusCode::OK,
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        super::json::response_json(&response).to_string(),
    )
        .into_response()
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// Liveness: the process runs and its runtime answers.
async fn healthz() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, TEXT)], "ok\n")
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    match state.readiness.check() {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, TEXT)],
            "ready\n".to_owned(),
        ),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, TEXT)],
            format!("not ready: {reason}\n"),
        ),
    }
}

async fn policies(State(state): State<AdminState>) -> impl IntoResponse {
    let set = state.policies.load();
    match serde_json::to_string_pretty(&PoliciesView::of(&set)) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, TEXT)],
            format!("cannot render policies: {e}\n"),
        ),
    }
}

/// The reference's `/rlconfig`: one line per configured limit (configuration only).
async fn rlconfig(State(state): State<AdminState>) -> impl IntoResponse {
    let set = state.policies.load();
    let mut out = String::new();
    for row in PoliciesView::of(&set).limits {
        out.push_str(&format!(
            "{}: policy={} limit={} period_ms={} algorithm={} unlimited={} shadow_mode={}\n",
            row.display_path,
            row.policy_id.as_deref().unwrap_or("-"),
            row.limit.map_or("-".to_owned(), |l| l.to_string()),
            row.period_ms.map_or("-".to_owned(), |p| p.to_string()),
            row.algorithm.unwrap_or("-"),
            row.unlimited,
            row.shadow,
        ));
    }
    ([(header::CONTENT_TYPE, TEXT)], out)
}

/// `/admin/policies`: the loaded set, one row per configured limit (and per `unlimited` rule).
#[derive(Debug, Serialize)]
pub struct PoliciesView {
    /// 16 hex digits, as written in Redis keys.
    pub revision: String,
    pub domains: Vec<DomainView>,
    pub limits: Vec<LimitView>,
}

#[derive(Debug, Serialize)]
pub struct DomainView {
    pub domain: String,
    pub slug: String,
}

#[derive(Debug, Serialize)]
pub struct LimitView {
    pub domain: String,
    pub domain_slug: String,
    /// `None` for `unlimited` rules, which have no policy.
    pub policy_id: Option<String>,
    pub revision: Option<String>,
    pub name: Option<String>,
    pub algorithm: Option<&'static str>,
    /// Window limit, or bucket capacity.
    pub limit: Option<u64>,
    /// Window, or refill period, in milliseconds.
    pub period_ms: Option<u64>,
    pub display_path: String,
    pub shadow: bool,
    pub unlimited: bool,
}

impl PoliciesView {
    pub fn of(set: &PolicySet) -> Self {
        let domains: Vec<DomainView> = set
            .domains()
            .map(|d| DomainView {
                domain: d.to_owned(),
                slug: set.domain_slug(d).unwrap_or_default().to_owned(),
            })
            .collect();
        let mut limits = Vec::new();
        for rule in set.rules().filter(|r| r.has_limit()) {
            let domain = rule_domain(set, rule).unwrap_or_default().to_owned();
            let domain_slug = set.domain_slug(&domain).unwrap_or_default().to_owned();
            let row = |limit: Option<&crate::policy::Limit>| LimitView {
                domain: domain.clone(),
                domain_slug: domain_slug.clone(),
                policy_id: limit.map(|l| l.policy.id().to_string()),
                revision: limit.map(|l| Revision(l.policy.revision()).to_string()),
                name: limit.and_then(|l| l.name.clone()),
                algorithm: limit.map(|l| l.policy.algorithm().as_str()),
                limit: limit.map(|l| l.policy.params().limit()),
                period_ms: limit.map(|l| l.policy.params().period_ms()),
                display_path: rule.display_path.clone(),
                shadow: rule.shadow_mode,
                unlimited: rule.unlimited,
            };
            if rule.limits.is_empty() {
                limits.push(row(None));
            }
            limits.extend(rule.limits.iter().map(|l| row(Some(l))));
        }
        Self {
            revision: Revision(set.revision()).to_string(),
            domains,
            limits,
        }
    }
}

/// A rule's domain, read back from its display path (`domain=<name> / key=...`); the longest
/// configured name wins, so a domain that prefixes another cannot capture its rules.
pub fn rule_domain<'s>(set: &'s PolicySet, rule: &Rule) -> Option<&'s str> {
    set.domains()
        .filter(|d| {
            rule.display_path
                .strip_prefix("domain=")
                .and_then(|rest| rest.strip_prefix(*d))
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(" / "))
        })
        .max_by_key(|d| d.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::LoadOptions;

    #[test]
    fn view_lists_every_limit_with_its_domain_and_no_values_beyond_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.yaml"),
            "domain: edge\ndescriptors:\n  - key: ip\n    rate_limits:\n      - {name: per-s, unit: second, requests_per_unit: 5}\n      - {name: per-d, unit: day, requests_per_unit: 50}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.yaml"),
            "domain: edge2\ndescriptors:\n  - key: ip\n    value: 10.0.0.1\n    rate_limit: {unlimited: true}\n  - key: user\n    shadow_mode: true\n    rate_limit: {algorithm: token_bucket, unit: minute, requests_per_unit: 3, burst: 9}\n",
        )
        .unwrap();
        let set = PolicySet::load_dir(dir.path(), &LoadOptions::default()).unwrap();
        let view = PoliciesView::of(&set);
        assert_eq!(view.revision.len(), 16);
        assert_eq!(view.domains.len(), 2);
        assert_eq!(view.limits.len(), 4, "{view:#?}");
        let edge: Vec<_> = view.limits.iter().filter(|l| l.domain == "edge").collect();
        assert_eq!(edge.len(), 2);
        assert_eq!(edge[0].limit, Some(5));
        assert_eq!(edge[0].period_ms, Some(1000));
        assert_eq!(edge[0].algorithm, Some("fixed_window"));
        let unlimited = view.limits.iter().find(|l| l.unlimited).unwrap();
        assert_eq!(unlimited.domain, "edge2");
        assert!(unlimited.policy_id.is_none());
        let bucket = view.limits.iter().find(|l| l.shadow).unwrap();
        assert_eq!(bucket.algorithm, Some("token_bucket"));
        assert_eq!(bucket.limit, Some(9));
        assert!(bucket.revision.as_ref().is_some_and(|r| r.len() == 16));
    }
}
