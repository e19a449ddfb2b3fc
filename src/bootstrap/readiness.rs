//! One readiness source for `/readyz` and gRPC health: policies loaded, backend ready, and not
//! shutting down. Both views read the same state, so they cannot disagree for long.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::Notify;

use crate::contract::{BackendReadiness, RateLimitPort};
use crate::policy::PolicySet;

#[derive(Debug)]
pub struct Readiness {
    policies_loaded: AtomicBool,
    /// Why the backend is not ready; `None` once it reported `Ready`.
    backend_not_ready: ArcSwapOption<String>,
    shutting_down: AtomicBool,
    /// Set with `readiness.require_policies`: not ready while this set has no domain.
    required_policies: std::sync::OnceLock<Arc<ArcSwap<PolicySet>>>,
    changed: Notify,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            policies_loaded: AtomicBool::new(false),
            backend_not_ready: ArcSwapOption::from_pointee(
                "backend readiness not checked yet".to_owned(),
            ),
            shutting_down: AtomicBool::new(false),
            required_policies: std::sync::OnceLock::new(),
            changed: Notify::new(),
        }
    }
}

impl Readiness {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set_policies_loaded(&self) {
        self.policies_loaded.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// `readiness.require_policies`: from now on, not ready while `policies` (the live,
    /// reloaded set) holds no domain.
    pub fn require_policies(&self, policies: Arc<ArcSwap<PolicySet>>) {
        let _ = self.required_policies.set(policies);
        self.changed.notify_waiters();
    }

    pub fn set_backend(&self, readiness: BackendReadiness) {
        match readiness {
            BackendReadiness::Ready => self.backend_not_ready.store(None),
            BackendReadiness::NotReady(reason) => {
                self.backend_not_ready.store(Some(Arc::new(reason)))
            }
        }
    }

    /// Irreversible: from now on every view reports not ready.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// `Ok` when ready, else a one-line reason.
    pub fn check(&self) -> Result<(), String> {
        if self.is_shutting_down() {
            return Err("shutting down".into());
        }
        if !self.policies_loaded.load(Ordering::SeqCst) {
            return Err("policies not loaded".into());
        }
        if let Some(policies) = self.required_policies.get() {
            if policies.load().domains().next().is_none() {
                return Err("no policy domain loaded (readiness.require_policies)".into());
            }
        }
        if let Some(reason) = self.backend_not_ready.load_full() {
            return Err(format!("backend not ready: {reason}"));
        }
        Ok(())
    }
}

/// Polls the backend and keeps gRPC health in step with [`Readiness::check`]: `SERVING` only
/// while ready, `NOT_SERVING` otherwise (including during shutdown).
pub async fn track<B: RateLimitPort>(
    readiness: Arc<Readiness>,
    backend: Arc<B>,
    reporter: tonic_health::server::HealthReporter,
) {
    let mut last = None;
    loop {
        readiness.set_backend(backend.readiness().await);
        let ready = readiness.check().is_ok();
        if last != Some(ready) {
            set_health(&reporter, ready).await;
            last = Some(ready);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = readiness.changed.notified() => {}
        }
    }
}

pub async fn set_health(reporter: &tonic_health::server::HealthReporter, ready: bool) {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;
    let status = if ready {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    reporter.set_service_status(SERVICE_NAME, status).await;
    reporter.set_service_status("", status).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_policies_backend_and_no_shutdown() {
        let r = Readiness::default();
        assert!(r.check().unwrap_err().contains("policies"));
        r.set_policies_loaded();
        assert!(r.check().unwrap_err().contains("backend"));
        r.set_backend(BackendReadiness::Ready);
        assert_eq!(r.check(), Ok(()));
        r.set_backend(BackendReadiness::NotReady(
            "no live Redis connection".into(),
        ));
        assert_eq!(
            r.check(),
            Err("backend not ready: no live Redis connection".into())
        );
        r.set_backend(BackendReadiness::Ready);
        r.begin_shutdown();
        assert_eq!(r.check(), Err("shutting down".into()));
        r.set_backend(BackendReadiness::Ready);
        assert_eq!(r.check(), Err("shutting down".into()), "irreversible");
    }
}
