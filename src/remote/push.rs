//! The daemon's push worker: after each checkpoint, in its own thread, uploads what the
//! remote lacks and then the checkpoint's manifest.
//!
//! Nothing here runs on a FUSE request or the checkpoint marker: the history only calls
//! [`Pusher::kick`]'s notification (a flag and a condvar) after a checkpoint. A remote that is
//! down or slow holds up this thread alone; its attempts back off (1 s doubling to 60 s).
//!
//! Resumable: `STATE/remote-push.json` records the newest checkpoint whose manifest is in
//! the remote (the push cursor), written after that manifest. Checkpoints are pushed in
//! order, so after a remount or `kill -9` the worker goes on from the cursor, and nothing
//! is skipped; what a killed push had uploaded already is found in the remote by name and not
//! uploaded again.
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{info, warn};
use serde::{Deserialize, Serialize};

use super::format::{self, Manifest, SessionInfo};
use super::key::RepoKey;
use super::repo::Repo;
use super::snapshot::Snapshotter;
use super::url::RemoteUrl;
use crate::history::History;
use crate::transcript::record::rfc3339;

pub const PUSH_STATE_FILE: &str = "remote-push.json";

/// `STATE/remote-push.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushState {
    /// This state dir's session name in remotes: random, made once.
    pub mount_id: String,
    /// The remote and key the cursor is about; another URL or key starts from the oldest
    /// kept checkpoint again.
    #[serde(default)]
    pub url: String,
    #[serde(default)]
    pub key_check: String,
    /// The newest checkpoint index whose manifest is in that remote.
    #[serde(default)]
    pub pushed_through: Option<usize>,
}

pub fn load_state(state_dir: &Path) -> io::Result<PushState> {
    let path = state_dir.join(PUSH_STATE_FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not valid ({e})", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut id = [0u8; 8];
            getrandom::fill(&mut id).map_err(io::Error::other)?;
            Ok(PushState {
                mount_id: base16ct::lower::encode_string(&id),
                ..Default::default()
            })
        }
        Err(e) => Err(e),
    }
}

fn save_state(state_dir: &Path, st: &PushState) -> io::Result<()> {
    let mut text = serde_json::to_vec_pretty(st)?;
    text.push(b'\n');
    crate::state::dir::write_file(state_dir, PUSH_STATE_FILE, &text)
}

pub use crate::history::status::RemoteStatus as PushStatus;

struct Shared {
    /// Set by a checkpoint, a `remote push` request or the stop; cleared by the worker.
    wake: bool,
    /// Set by a `remote push` request: also cuts a backoff short (a checkpoint does not,
    /// so checkpoints during an outage do not turn the backoff into a busy retry).
    urgent: bool,
    stop: bool,
    /// Attempts finished (ok or not), so a waiter knows one began after its request.
    attempts: u64,
    status: PushStatus,
    pushed_through: Option<usize>,
}

pub struct Pusher {
    shared: Mutex<Shared>,
    cond: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// The remote a mount pushes to, as saved in its settings.
#[derive(Debug, Clone)]
pub struct RemoteTarget {
    pub url: RemoteUrl,
    pub key_file: PathBuf,
}

impl Pusher {
    /// Starts the worker for `history`, pushing to `target`. Fails (before any thread) when
    /// the key cannot be read or made or the state file is damaged; a remote that cannot
    /// be reached is not an error here, only a lag.
    pub fn start(history: Arc<History>, target: RemoteTarget) -> io::Result<Arc<Pusher>> {
        let state_dir = history.state_dir().to_path_buf();
        if target.key_file.starts_with(&state_dir) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the repository key {} must not be inside the state dir {}",
                    target.key_file.display(),
                    state_dir.display()
                ),
            ));
        }
        let key = RepoKey::load(&target.key_file, true)?;
        let mut st = load_state(&state_dir)?;
        if st.url != target.url.text || st.key_check != key.check() {
            st.url = target.url.text.clone();
            st.key_check = key.check().to_string();
            st.pushed_through = None;
        }
        save_state(&state_dir, &st)?;
        let pusher = Arc::new(Pusher {
            shared: Mutex::new(Shared {
                wake: true,
                urgent: false,
                stop: false,
                attempts: 0,
                status: PushStatus {
                    url: target.url.text.clone(),
                    session: st.mount_id.clone(),
                    ..Default::default()
                },
                pushed_through: st.pushed_through,
            }),
            cond: Condvar::new(),
            worker: Mutex::new(None),
        });
        {
            let p = Arc::downgrade(&pusher);
            history.on_checkpoint(Box::new(move || {
                if let Some(p) = p.upgrade() {
                    p.kick();
                }
            }));
        }
        let worker = {
            let p = pusher.clone();
            std::thread::Builder::new()
                .name("remote-push".into())
                .spawn(move || p.run(history, target.url, key, st))?
        };
        *pusher.worker.lock().unwrap_or_else(|e| e.into_inner()) = Some(worker);
        Ok(pusher)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the worker to look for unpushed checkpoints (never blocks on it); `urgent` (a
    /// `remote push` request) also cuts a backoff short.
    pub fn kick(&self) {
        self.lock().wake = true;
        self.cond.notify_all();
    }

    pub fn kick_now(&self) {
        let mut sh = self.lock();
        sh.wake = true;
        sh.urgent = true;
        drop(sh);
        self.cond.notify_all();
    }

    pub fn status(&self, history: &History) -> PushStatus {
        // The history's locks are taken without ours held (a checkpoint's kick takes ours
        // under the epoch lock).
        let (first, _) = history.first_kept();
        let ids = history.checkpoint_ids();
        let (mut s, pushed_through) = {
            let sh = self.lock();
            (sh.status.clone(), sh.pushed_through)
        };
        let done = pushed_through.map_or(0, |p| (p + 1).saturating_sub(first));
        s.unpushed_checkpoints = ids.len().saturating_sub(done);
        s.pushed_through = pushed_through
            .and_then(|p| history.checkpoint_at(p))
            .map(|c| c.id);
        s
    }

    /// `remote push --wait`: kicks the worker and waits until every checkpoint kept now is
    /// in the remote, or an attempt begun after this call failed (its error), or `timeout`.
    pub fn push_and_wait(&self, history: &History, timeout: Duration) -> io::Result<PushStatus> {
        let target = history.checkpoint_ids().len();
        let (first, _) = history.first_kept();
        let deadline = Instant::now() + timeout;
        let mut sh = self.lock();
        let start_attempts = sh.attempts;
        sh.wake = true;
        sh.urgent = true;
        self.cond.notify_all();
        loop {
            let done = target == 0 || sh.pushed_through.is_some_and(|p| p + 1 >= first + target);
            if done {
                drop(sh);
                return Ok(self.status(history));
            }
            // An attempt that began after the request (attempts + 2: the one running when
            // we asked may have begun before) failed.
            if (sh.attempts >= start_attempts + 2 || (sh.attempts > start_attempts && !sh.wake))
                && let Some(e) = &sh.status.last_error
            {
                return Err(io::Error::other(format!("push failed: {e}")));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the push did not finish within {} s", timeout.as_secs()),
                ));
            }
            sh = self
                .cond
                .wait_timeout(sh, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Stops the worker: waits up to `grace` for the object in flight, then leaves it (the
    /// process is exiting; the cursor names only complete manifests).
    pub fn stop(&self, grace: Duration) {
        self.lock().stop = true;
        self.cond.notify_all();
        let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let deadline = Instant::now() + grace;
        while !worker.is_finished() && Instant::now() < deadline {
            // The worker notifies `cond` when it exits its loop.
            let sh = self.lock();
            drop(
                self.cond
                    .wait_timeout(sh, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner()),
            );
        }
        if worker.is_finished() {
            let _ = worker.join();
        } else {
            warn!(
                "remote push: still busy after {} s at exit; what is unpushed is pushed by the next mount",
                grace.as_secs()
            );
        }
    }

    fn run(
        self: Arc<Self>,
        history: Arc<History>,
        url: RemoteUrl,
        key: RepoKey,
        mut st: PushState,
    ) {
        let state_dir = history.state_dir().to_path_buf();
        let mut backoff = Duration::from_secs(1);
        let mut repo: Option<Repo> = None;
        let mut snap = Snapshotter::default();
        loop {
            {
                let mut sh = self.lock();
                while !sh.wake && !sh.stop {
                    sh = self.cond.wait(sh).unwrap_or_else(|p| p.into_inner());
                }
                if sh.stop {
                    break;
                }
                sh.wake = false;
                sh.urgent = false;
            }
            let attempt = std::panic::AssertUnwindSafe(|| -> io::Result<()> {
                if repo.is_none() {
                    let r = Repo::open(url.clone(), key.clone())?;
                    r.init()?;
                    let info = SessionInfo {
                        format: format::FORMAT,
                        mount_id: st.mount_id.clone(),
                        source: history.source().display().to_string(),
                        host: hostname(),
                    };
                    r.put_sealed(
                        &format!("{}/info", format::session_dir(&st.mount_id)),
                        &serde_json::to_vec(&info)?,
                    )?;
                    repo = Some(r);
                }
                let r = repo.as_ref().expect("opened above");
                self.push_pending(&history, r, &mut snap, &mut st, &state_dir)
            });
            // A panic is a failed attempt (with a fresh snapshot cache after it), not a
            // dead worker that a `remote push --wait` would wait on for good.
            let result = std::panic::catch_unwind(attempt).unwrap_or_else(|_| {
                snap = Snapshotter::default();
                Err(io::Error::other(
                    "internal error: the push panicked (see the daemon log); retried",
                ))
            });
            let mut sh = self.lock();
            sh.attempts += 1;
            match result {
                Ok(()) => {
                    sh.status.last_error = None;
                    backoff = Duration::from_secs(1);
                }
                Err(e) => {
                    warn!(
                        "remote push to {url}: {e} (retrying in {} s)",
                        backoff.as_secs()
                    );
                    sh.status.last_error = Some(e.to_string());
                    self.cond.notify_all();
                    // Back off, unless stopped or asked to push now; a checkpoint's kick
                    // during the wait is kept for after it.
                    let until = Instant::now() + backoff;
                    while !sh.stop && !sh.urgent && Instant::now() < until {
                        let left = until.saturating_duration_since(Instant::now());
                        sh = self
                            .cond
                            .wait_timeout(sh, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                    sh.wake = true;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
            self.cond.notify_all();
        }
        self.cond.notify_all();
    }

    /// Pushes every kept checkpoint after the cursor, oldest first.
    fn push_pending(
        &self,
        history: &History,
        repo: &Repo,
        snap: &mut Snapshotter,
        st: &mut PushState,
        state_dir: &Path,
    ) -> io::Result<()> {
        loop {
            if self.lock().stop {
                return Ok(());
            }
            let (first, _) = history.first_kept();
            let next = st.pushed_through.map_or(first, |p| (p + 1).max(first));
            if let Some(p) = st.pushed_through
                && p + 1 < first
            {
                warn!(
                    "remote push: checkpoints {}..{} were dropped by gc before they were pushed",
                    p + 1,
                    first - 1
                );
            }
            let Some(cp) = history.checkpoint_at(next) else {
                return Ok(());
            };
            let t0 = Instant::now();
            let (root, stats) = snap.push(history, repo, next)?;
            let manifest = Manifest {
                format: format::FORMAT,
                mount_id: st.mount_id.clone(),
                index: next,
                id: cp.id.clone(),
                time: rfc3339(cp.time),
                agent_session: cp.session.clone(),
                root,
                files: stats.files,
                bytes: stats.bytes,
            };
            let m = repo.put_sealed(
                &format::manifest_name(&st.mount_id, next),
                &serde_json::to_vec(&manifest)?,
            )?;
            st.pushed_through = Some(next);
            save_state(state_dir, st)?;
            info!(
                "remote push: checkpoint {} ({} files, {} bytes) in {:.2} s: {} objects, {} bytes uploaded, {} directories walked",
                cp.id,
                stats.files,
                stats.bytes,
                t0.elapsed().as_secs_f64(),
                stats.objects + 1,
                stats.uploaded + m,
                stats.dirs_walked
            );
            let mut sh = self.lock();
            sh.pushed_through = Some(next);
            sh.status.uploaded_bytes += stats.uploaded + m;
            self.cond.notify_all();
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}
