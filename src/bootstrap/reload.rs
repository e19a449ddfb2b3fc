//! Hot reload of the policy directory, on file changes and on SIGHUP.
//!
//! The whole set is loaded and validated before it replaces the old one in a single
//! `ArcSwap::store`; on any error the old set stays and every error is logged with its
//! location. Unchanged limits keep their policy id and revision, and so their counters.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::telemetry::{self, ReloadResult};
use crate::policy::{LoadOptions, PolicySet};

/// Quiet time after the last file event before reloading: one atomic write-then-rename, or a
/// ConfigMap symlink swap, produces a burst of events.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// What one reload attempt came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reloaded {
    /// A new set is being served.
    Changed { revision: u64 },
    /// The directory still yields the set being served.
    Unchanged,
    /// The set is invalid; the previous one is still served.
    Rejected { errors: usize },
}

pub struct Reloader {
    dir: PathBuf,
    options: LoadOptions,
    policies: Arc<ArcSwap<PolicySet>>,
}

impl Reloader {
    pub fn new(dir: PathBuf, options: LoadOptions, policies: Arc<ArcSwap<PolicySet>>) -> Self {
        Self {
            dir,
            options,
            policies,
        }
    }

    /// Loads the directory and, if it is valid and different, serves it.
    pub fn reload(&self, trigger: &'static str) -> Reloaded {
        match PolicySet::load_dir(&self.dir, &self.options) {
            Ok(set) => {
                telemetry::record_reload(ReloadResult::Success);
                let old = self.policies.load().revision();
                if set.revision() == old {
                    tracing::debug!(trigger, "policy directory unchanged");
                    return Reloaded::Unchanged;
                }
                let revision = set.revision();
                telemetry::record_loaded(&set);
                tracing::info!(
                    trigger,
                    revision = %crate::contract::Revision(revision),
                    domains = set.domains().count(),
                    rules = set.len(),
                    "policies reloaded"
                );
                self.policies.store(Arc::new(set));
                Reloaded::Changed { revision }
            }
            Err(errors) => {
                telemetry::record_reload(ReloadResult::Failure);
                for error in errors.errors() {
                    // `file:line:column: field: message`; values quoted there come from the
                    // policy file, never from a request.
                    tracing::error!(trigger, %error, "policy error");
                }
                tracing::error!(
                    trigger,
                    dir = %self.dir.display(),
                    errors = errors.errors().len(),
                    "policy reload rejected; still serving the previous set"
                );
                Reloaded::Rejected {
                    errors: errors.errors().len(),
                }
            }
        }
    }
}

/// Why a reload was asked for.
#[derive(Debug, Clone, Copy)]
enum Trigger {
    Files,
    Hangup,
}

/// Watches the policy directory (the directory itself, so Kubernetes' `..data` symlink swap
/// is seen) and listens for SIGHUP; reloads after each debounced burst. Runs until aborted.
pub fn spawn(reloader: Reloader) -> tokio::task::JoinHandle<()> {
    let reloader = Arc::new(reloader);
    tokio::spawn(async move {
        let (tx, mut rx) = mpsc::channel::<Trigger>(64);
        // Kept alive for as long as this task runs; dropping it stops the watch.
        let _watcher = watch(&reloader.dir, tx.clone());
        spawn_hangup(tx);
        while let Some(first) = rx.recv().await {
            let mut trigger = first;
            if matches!(first, Trigger::Files) {
                // Wait for the burst to end; a SIGHUP meanwhile is folded into this reload.
                while let Ok(Some(next)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    if matches!(next, Trigger::Hangup) {
                        trigger = next;
                    }
                }
            }
            let label = match trigger {
                Trigger::Files => "files",
                Trigger::Hangup => "sighup",
            };
            // Reading and parsing files blocks; keep it off the request threads.
            let job = reloader.clone();
            match tokio::task::spawn_blocking(move || job.reload(label)).await {
                Ok(result) => tracing::debug!(?result, "reload finished"),
                Err(error) => tracing::error!(%error, "policy reload task failed"),
            }
        }
    })
}

fn watch(dir: &std::path::Path, tx: mpsc::Sender<Trigger>) -> Option<notify::RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(event) if event.kind.is_access() => {}
        // A full channel already holds a pending reload.
        Ok(_) => {
            let _ = tx.try_send(Trigger::Files);
        }
        Err(error) => tracing::warn!(%error, "policy directory watch error"),
    };
    let watcher = notify::recommended_watcher(handler).and_then(|mut w| {
        w.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match watcher {
        Ok(w) => {
            tracing::info!(dir = %dir.display(), "watching the policy directory for changes");
            Some(w)
        }
        Err(error) => {
            tracing::warn!(
                %error,
                dir = %dir.display(),
                "cannot watch the policy directory; reload with SIGHUP"
            );
            None
        }
    }
}

#[cfg(unix)]
fn spawn_hangup(tx: mpsc::Sender<Trigger>) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hangups) => {
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    if tx.send(Trigger::Hangup).await.is_err() {
                        break;
                    }
                }
            });
        }
        Err(error) => tracing::warn!(%error, "cannot listen for SIGHUP"),
    }
}

#[cfg(not(unix))]
fn spawn_hangup(_tx: mpsc::Sender<Trigger>) {}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    const OTHER: &str = "domain: o\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n";

    fn id_and_revision(set: &PolicySet, domain: &str) -> (String, u64) {
        let rule = set.find(domain, [("k", "x")]).unwrap();
        let p = &rule.limits[0].policy;
        (p.id().to_string(), p.revision())
    }

    #[test]
    fn valid_change_swaps_invalid_keeps_old_and_unchanged_limits_keep_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d.yaml"), V1).unwrap();
        std::fs::write(dir.path().join("o.yaml"), OTHER).unwrap();
        let options = LoadOptions::default();
        let first = PolicySet::load_dir(dir.path(), &options).unwrap();
        let other_before = id_and_revision(&first, "o");
        let policies = Arc::new(ArcSwap::from_pointee(first));
        let reloader = Reloader::new(dir.path().to_owned(), options, policies.clone());

        assert_eq!(reloader.reload("test"), Reloaded::Unchanged);

        std::fs::write(dir.path().join("d.yaml"), V1.replace(": 1}", ": 2}")).unwrap();
        assert!(matches!(reloader.reload("test"), Reloaded::Changed { .. }));
        let set = policies.load();
        assert_eq!(
            set.find("d", [("k", "x")]).unwrap().limits[0].requests_per_unit,
            2
        );
        assert_eq!(
            id_and_revision(&set, "o"),
            other_before,
            "untouched limits keep id and revision (and so their Redis keys)"
        );

        std::fs::write(dir.path().join("d.yaml"), "domain: d\ndescriptors: [").unwrap();
        assert!(matches!(
            reloader.reload("test"),
            Reloaded::Rejected { errors } if errors >= 1
        ));
        assert_eq!(
            policies.load().find("d", [("k", "x")]).unwrap().limits[0].requests_per_unit,
            2,
            "old set kept"
        );
    }
}
