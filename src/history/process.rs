//! Who made a change: the *process* behind a FUSE request, not the thread.
//!
//! FUSE reports the calling thread's id. Programs that name their threads (Bun's "Bun Pool 0",
//! anything using `prctl(PR_SET_NAME)`) would be logged under the thread's name, so the
//! thread is mapped to its thread group (`Tgid:` in `/proc/<tid>/status`) and the process is
//! named by the group leader's `comm` and `exe`.
//!
//! Invariant: no lock is held while `/proc` is read (a slow or hung /proc read must not stall
//! other requests); the cache lock only guards map lookups and inserts.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::transcript::record::Actor;

/// How long an identification is reused: a tool making many changes (tar, git) costs one set
/// of /proc reads, and a thread id is not reused within a second in practice.
const FRESH: Duration = Duration::from_secs(1);

/// Entries beyond which stale ones are dropped, so the cache stays small.
const TRIM_AT: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    /// The thread group id: the process id `ps` shows.
    pub pid: u32,
    /// The process's `comm` (the main thread's name); empty when it was already gone.
    pub comm: String,
    /// The process's executable (`/proc/<pid>/exe`); `None` when it could not be read (gone,
    /// or another user's process and the daemon is not root).
    pub exe: Option<String>,
}

static CACHE: Mutex<Option<HashMap<u32, (Process, Instant)>>> = Mutex::new(None);

fn cached(tid: u32, now: Instant) -> Option<Process> {
    let cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let (process, at) = cache.as_ref()?.get(&tid)?;
    (now.duration_since(*at) < FRESH).then(|| process.clone())
}

fn remember(tid: u32, process: &Process, now: Instant) {
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    if map.len() > TRIM_AT {
        map.retain(|_, (_, at)| now.duration_since(*at) < FRESH);
    }
    map.insert(tid, (process.clone(), now));
}

/// The thread group of thread `tid`, from its `/proc/<tid>/status` text.
fn tgid_in_status(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Identifies the process that thread `tid` belongs to. Threads of this daemon (a rewind
/// writes through the mount from its own threads) are named `checkpointfs`.
pub(crate) fn of_thread(tid: u32) -> Process {
    let now = Instant::now();
    if let Some(p) = cached(tid, now) {
        return p;
    }
    let ours = std::process::id();
    let pid = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| tgid_in_status(&s))
        .unwrap_or(tid);
    let process = if pid == ours {
        Process {
            pid,
            comm: "checkpointfs".to_string(),
            exe: None,
        }
    } else {
        Process {
            pid,
            comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim_end().to_string())
                .unwrap_or_default(),
            exe: std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned()),
        }
    };
    remember(tid, &process, now);
    process
}

/// The transcript's record of who made a change.
pub(crate) fn actor(tid: u32, uid: u32) -> Actor {
    let p = of_thread(tid);
    Actor {
        pid: p.pid,
        uid,
        comm: p.comm,
        exe: p.exe,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tgid_is_read_from_status() {
        let status = "Name:\tBun Pool 0\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t4242\nNgid:\t0\nPid:\t4250\n";
        assert_eq!(tgid_in_status(status), Some(4242));
        assert_eq!(tgid_in_status("Name:\tx\n"), None);
        assert_eq!(tgid_in_status("Tgid:\tnot-a-number\n"), None);
    }

    #[test]
    fn a_live_named_thread_maps_to_its_process() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("worker-thread-x".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u32;
                tid_tx.send(tid).unwrap();
                done_rx.recv().unwrap();
            })
            .unwrap();
        let tid = tid_rx.recv().unwrap();
        let thread_comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert_eq!(thread_comm.trim_end(), "worker-thread-x");
        let p = of_thread(tid);
        assert_ne!(tid, std::process::id());
        assert_eq!(
            p.pid,
            std::process::id(),
            "thread {tid} maps to its thread group"
        );
        assert_eq!(p.comm, "checkpointfs", "this process is the daemon's own");
        done_tx.send(()).unwrap();
        worker.join().unwrap();
    }
}
