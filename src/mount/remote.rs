//! The daemon's side of its remote: the push worker it runs (if the mount has a remote),
//! started at mount and by `checkpointfs remote set`, asked by `remote push` and `status`,
//! stopped at unmount within a bounded wait.
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use log::info;

use crate::history::History;
use crate::history::settings::RemoteSetting;
use crate::remote::{PushStatus, Pusher, RemoteTarget, RemoteUrl};

/// How long unmount waits for an upload in flight before the daemon exits anyway
/// (`CHECKPOINTFS_REMOTE_EXIT_WAIT`, seconds). Nothing is lost by not waiting: the cursor
/// names only complete manifests, and the next mount pushes the rest.
pub fn exit_wait() -> Duration {
    std::env::var("CHECKPOINTFS_REMOTE_EXIT_WAIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs)
}

pub struct RemoteControl {
    history: Arc<History>,
    pusher: Mutex<Option<Arc<Pusher>>>,
}

impl RemoteControl {
    pub fn new(history: Arc<History>) -> RemoteControl {
        RemoteControl {
            history,
            pusher: Mutex::new(None),
        }
    }

    fn current(&self) -> Option<Arc<Pusher>> {
        self.pusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Starts pushing to `setting` (replacing the worker of an earlier remote).
    pub fn start(&self, setting: &RemoteSetting) -> io::Result<()> {
        let url: RemoteUrl = setting
            .url
            .parse()
            .map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let pusher = Pusher::start(
            self.history.clone(),
            RemoteTarget {
                url,
                key_file: setting.key_file.clone(),
            },
        )?;
        info!("remote: pushing checkpoints to {}", setting.url);
        let old = self
            .pusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(pusher);
        if let Some(old) = old {
            old.stop(exit_wait());
        }
        Ok(())
    }

    /// `checkpointfs remote set MNT URL`: saved with the other settings, then pushed to.
    pub fn set(&self, setting: RemoteSetting) -> io::Result<String> {
        let dir = self.history.state_dir();
        let mut settings = crate::history::settings::load(dir)
            .map_err(io::Error::other)?
            .unwrap_or_default();
        // Checked (URL, key) before it is saved.
        self.start(&setting)?;
        settings.remote = Some(setting.clone());
        crate::history::settings::save(dir, &settings)?;
        Ok(format!("remote set to {}\n", setting.url))
    }

    pub fn status(&self) -> Option<PushStatus> {
        self.current().map(|p| p.status(&self.history))
    }

    /// `checkpointfs remote push MNT [--wait]`.
    pub fn push(&self, wait: Option<Duration>) -> io::Result<String> {
        let p = self.current().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "this mount has no remote: give one with `checkpointfs remote set MNT URL`",
            )
        })?;
        match wait {
            None => {
                p.kick_now();
                Ok("push started\n".into())
            }
            Some(t) => {
                let s = p.push_and_wait(&self.history, t)?;
                Ok(format!(
                    "pushed through {} to {}\n",
                    s.pushed_through.as_deref().unwrap_or("(no checkpoint)"),
                    s.url
                ))
            }
        }
    }

    /// At unmount: stops the worker (bounded by [`exit_wait`]) and says what is unpushed.
    pub fn stop(&self) {
        let Some(p) = self.current() else {
            return;
        };
        p.stop(exit_wait());
        let s = p.status(&self.history);
        if s.unpushed_checkpoints > 0 {
            log::warn!(
                "remote: {} checkpoint(s) not pushed to {} yet{}; the next mount pushes them",
                s.unpushed_checkpoints,
                s.url,
                s.last_error
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            );
        }
    }
}
