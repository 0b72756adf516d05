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
    /// The agent session whose process tree it belongs to (see [`register_session`]).
    pub session: Option<String>,
}

static CACHE: Mutex<Option<HashMap<u32, (Process, Instant)>>> = Mutex::new(None);

/// A registered agent session: its root process, identified by pid *and* start time, so a
/// reused pid is never mistaken for it.
#[derive(Clone, Debug)]
struct SessionRoot {
    session: String,
    start_time: u64,
}

/// Registered sessions by root pid. One daemon serves one mount, so one registry per process.
static SESSIONS: Mutex<Option<HashMap<u32, SessionRoot>>> = Mutex::new(None);

/// How far up the process tree a change is traced to a session root (agents run tools a few
/// levels down: agent → shell → tool → helper).
const MAX_DEPTH: usize = 64;

/// `(ppid, start time)` of `pid` from `/proc/<pid>/stat` (fields 4 and 22, after the
/// parenthesised comm, which may itself contain spaces and parentheses).
pub(crate) fn parent_and_start(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // `rest` starts at field 3 (state): ppid is field 4, starttime field 22.
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

/// Why a session could not be registered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RegisterError {
    /// No such process (or it exited).
    NoProcess,
    /// The process belongs to another user than the caller (and the caller is not root).
    NotYours,
}

/// Registers `pid` as the root of agent session `session`: changes made by it and its
/// descendants are attributed to the session from now on. Only the process's owner (or
/// root) may register it, so another user of an `--allow-other` mount cannot put their
/// changes under someone else's session, or someone else's under theirs.
pub(crate) fn register_session(
    session: &str,
    pid: u32,
    caller_uid: u32,
) -> Result<(), RegisterError> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(format!("/proc/{pid}"))
        .map_err(|_| RegisterError::NoProcess)?
        .uid();
    if caller_uid != 0 && owner != caller_uid {
        return Err(RegisterError::NotYours);
    }
    let (_, start_time) = parent_and_start(pid).ok_or(RegisterError::NoProcess)?;
    let mut sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
    let map = sessions.get_or_insert_with(HashMap::new);
    // Roots that exited can never match again (their start time would differ).
    map.retain(|&p, root| parent_and_start(p).is_some_and(|(_, t)| t == root.start_time));
    map.insert(
        pid,
        SessionRoot {
            session: session.to_string(),
            start_time,
        },
    );
    drop(sessions);
    // Identifications made before now may lack the session.
    CACHE.lock().unwrap_or_else(|p| p.into_inner()).take();
    Ok(())
}

/// The session whose root is `pid` or one of its ancestors, if any.
fn session_of(pid: u32) -> Option<String> {
    let roots: HashMap<u32, SessionRoot> = {
        let sessions = SESSIONS.lock().unwrap_or_else(|p| p.into_inner());
        match sessions.as_ref() {
            Some(map) if !map.is_empty() => map.clone(),
            _ => return None,
        }
    };
    let mut current = pid;
    for _ in 0..MAX_DEPTH {
        let (ppid, start) = parent_and_start(current)?;
        if let Some(root) = roots.get(&current)
            && root.start_time == start
        {
            return Some(root.session.clone());
        }
        if ppid <= 1 {
            return None;
        }
        current = ppid;
    }
    None
}

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
            session: None,
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
            session: session_of(pid),
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
        session: p.session,
    }
}

/// An identification made within the last moment, without reading /proc: callers holding a
/// lock use this and resolve a miss with [`actor`] after letting go.
pub(crate) fn cached_actor(tid: u32, uid: u32) -> Option<Actor> {
    let p = cached(tid, Instant::now())?;
    Some(Actor {
        pid: p.pid,
        uid,
        comm: p.comm,
        exe: p.exe,
        session: p.session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_found_after_a_comm_with_spaces_and_parentheses() {
        let stat = "4250 (Bun Pool (0) x) S 4242 4250 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 \
                    9 0 123456 1000 10 18446744073709551615";
        assert_eq!(parse_stat(stat), Some((4242, 123456)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_session_covers_its_root_and_descendants_only() {
        let me = std::process::id();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let child_pid = child.id();
        assert_eq!(session_of(child_pid), None);
        register_session("sess-test-1", me, uid).unwrap();
        assert_eq!(session_of(child_pid).as_deref(), Some("sess-test-1"));
        assert_eq!(session_of(me).as_deref(), Some("sess-test-1"));
        // Our parent (the test harness's parent) is not below the root.
        let (parent, _) = parent_and_start(me).unwrap();
        if parent > 1 {
            assert_eq!(session_of(parent), None);
        }
        assert_eq!(
            register_session("s", u32::MAX - 1, uid),
            Err(RegisterError::NoProcess)
        );
        if uid != 0 {
            assert_eq!(register_session("s", 1, uid), Err(RegisterError::NotYours));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        SESSIONS.lock().unwrap().take();
    }

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
