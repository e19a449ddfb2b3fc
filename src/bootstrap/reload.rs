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
    /// The configured path resolves to another directory (or its watch was lost).
    Replaced,
}

/// How often the configured path is checked for having been replaced, should no event
/// say so (a parent further up swapped, a watch lost): the upper bound on noticing.
pub const IDENTITY_CHECK: Duration = Duration::from_secs(1);

/// Watches the policy directory and follows the configured path: the directory itself (so
/// Kubernetes' `..data` symlink swap is seen) and its parent (so a replaced directory, a
/// swapped symlink as git-sync does it, a rename in place or a delete-then-recreate are
/// seen). Whenever the path resolves to another directory the watch moves to it and the set
/// reloads; a lost watch is logged and retried every [`IDENTITY_CHECK`]. Listens for SIGHUP
/// too; reloads after each debounced burst. Runs until aborted.
pub fn spawn(reloader: Reloader) -> tokio::task::JoinHandle<()> {
    let reloader = Arc::new(reloader);
    tokio::spawn(async move {
        let (tx, mut rx) = mpsc::channel::<Trigger>(64);
        let configured =
            std::path::absolute(&reloader.dir).unwrap_or_else(|_| reloader.dir.clone());
        let mut watch = Followed::start(&configured, tx.clone());
        spawn_hangup(tx.clone());
        let mut ticks = tokio::time::interval(IDENTITY_CHECK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let first = tokio::select! {
                received = rx.recv() => match received {
                    Some(trigger) => trigger,
                    None => break,
                },
                _ = ticks.tick() => {
                    if !watch.moved(&configured) {
                        continue;
                    }
                    Trigger::Replaced
                }
            };
            let mut trigger = first;
            if matches!(first, Trigger::Files) {
                // Wait for the burst to end; a SIGHUP meanwhile is folded into this reload.
                while let Ok(Some(next)) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    if matches!(next, Trigger::Hangup) {
                        trigger = next;
                    }
                }
            }
            if watch.moved(&configured) {
                trigger = Trigger::Replaced;
            }
            if matches!(trigger, Trigger::Replaced) {
                watch = Followed::start(&configured, tx.clone());
            }
            let label = match trigger {
                Trigger::Files => "files",
                Trigger::Hangup => "sighup",
                Trigger::Replaced => "replaced",
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

/// The directory a path resolves to: its canonical path and inode. A replaced directory, a
/// swapped symlink or a recreated directory each resolve to another one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    resolved: PathBuf,
    inode: (u64, u64),
}

fn identity(path: &std::path::Path) -> Option<Identity> {
    use std::os::unix::fs::MetadataExt;
    let resolved = std::fs::canonicalize(path).ok()?;
    let meta = std::fs::metadata(&resolved).ok()?;
    meta.is_dir().then(|| Identity {
        resolved,
        inode: (meta.dev(), meta.ino()),
    })
}

/// The watch of one resolution of the configured path.
struct Followed {
    /// Kept alive while this resolution is followed; dropping it stops the watch.
    _watcher: Option<notify::RecommendedWatcher>,
    /// What the path resolved to when the watch started; `None` if it was missing or the
    /// watch could not be set up (retried on the next check).
    target: Option<Identity>,
    /// The watch reported an error: set it up again.
    lost: Arc<std::sync::atomic::AtomicBool>,
}

impl Followed {
    fn start(configured: &std::path::Path, tx: mpsc::Sender<Trigger>) -> Self {
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let target = identity(configured);
        let Some(id) = target.clone() else {
            tracing::warn!(
                dir = %configured.display(),
                "the policy directory is missing; still serving the previous set, checking every second"
            );
            return Self {
                _watcher: None,
                target: None,
                lost,
            };
        };
        match watch(configured, &id.resolved, tx, lost.clone()) {
            Ok(w) => {
                tracing::info!(
                    dir = %configured.display(),
                    resolved = %id.resolved.display(),
                    "watching the policy directory for changes"
                );
                Self {
                    _watcher: Some(w),
                    target,
                    lost,
                }
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    dir = %configured.display(),
                    "cannot watch the policy directory; retrying every second (SIGHUP reloads)"
                );
                Self {
                    _watcher: None,
                    target: None,
                    lost,
                }
            }
        }
    }

    /// Whether the configured path now resolves elsewhere, or the watch must be set up again.
    fn moved(&self, configured: &std::path::Path) -> bool {
        if self.lost.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let now = identity(configured);
        // Missing before and still missing: nothing to follow yet (logged once, at start).
        if now.is_none() && self.target.is_none() {
            return false;
        }
        now != self.target
    }
}

fn watch(
    configured: &std::path::Path,
    resolved: &std::path::Path,
    tx: mpsc::Sender<Trigger>,
    lost: Arc<std::sync::atomic::AtomicBool>,
) -> notify::Result<notify::RecommendedWatcher> {
    let (path, inside) = (configured.to_owned(), resolved.to_owned());
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(event) if event.kind.is_access() => {}
        // The parent's events matter only for the configured entry; a full channel already
        // holds a pending reload.
        Ok(event) => {
            // An event about the directory entry itself (deleted, renamed, replaced): the
            // watch may now be on a dead inode, and a recreated directory may even reuse its
            // number, so the watch is set up again whatever the path resolves to.
            if event.paths.iter().any(|p| p == &path || p == &inside) {
                lost.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if event
                .paths
                .iter()
                .any(|p| p == &path || p.starts_with(&inside))
            {
                let _ = tx.try_send(Trigger::Files);
            }
        }
        Err(error) => {
            tracing::warn!(%error, "policy directory watch error; setting it up again");
            lost.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let mut watcher = notify::recommended_watcher(handler)?;
    watcher.watch(resolved, RecursiveMode::NonRecursive)?;
    if let Some(parent) = configured.parent() {
        watcher.watch(parent, RecursiveMode::NonRecursive)?;
    }
    Ok(watcher)
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
