//! The daemon's control socket, `STATE/control.sock`: how the CLI asks a running mount to
//! take a checkpoint, flush its transcript or rewind.
//!
//! Protocol: one JSON request per connection, one JSON response, then the connection closes.
//! A request that asked for progress (`"progress": true`: gc, rewind) may first get lines
//! `{"progress":"..."}`, each a complete status to show in place of the previous one.
//! Only root and the mount's owner may connect (the socket is mode 0600 in a 0700 dir).
//!
//! The server's *maintenance lock* (a read-write lock) keeps gc apart from the requests that
//! read the history as a whole: rewind, log, diff and status hold it shared, gc exclusively,
//! so a gc never deletes an object a rewind is about to restore nor compacts the transcript
//! under a log reading it. Checkpoint and flush do not take it.
//! Lock order: maintenance → the history's epoch lock (`history::epoch`) → `History::state`
//! (see `history`).
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, warn};
use serde::{Deserialize, Serialize};

use crate::fs::PassthroughFs;
use crate::history::logdiff::json_document;
use crate::mount::remote::RemoteControl;

pub const SOCKET_NAME: &str = "control.sock";

/// The protocol version this daemon speaks, sent in every response. 1 added the report
/// formats (`json` on log, diff and status; `stat` on diff; `path_is_dir`) and `gc`. A daemon from
/// before that sends none (read as 0) and ignores fields it does not know, answering in
/// text: [`request`] refuses such an answer rather than pass text off as JSON.
/// 3 added the browse requests (`checkpointfs ui`). 4 added `remote-set`, `remote-push` and
/// the status report's `remote`.
pub const PROTOCOL: u32 = 5;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Checkpoint {
        id: String,
    },
    Flush,
    Rewind {
        id: String,
        dry_run: bool,
        paths: Vec<String>,
        /// Rewind agent state too (see `history::agent_state`); by default it is kept.
        #[serde(default)]
        rewind_agent_state: bool,
        /// Stream progress lines (the CLI asks when its stderr is a terminal).
        #[serde(default)]
        progress: bool,
    },
    /// A rewind of only what one agent session changed (protocol 2). A variant of its own,
    /// not a field of `Rewind`: a daemon that predates it refuses it as unknown instead of
    /// ignoring the field and rewinding everyone's work.
    SessionRewind {
        id: String,
        dry_run: bool,
        paths: Vec<String>,
        #[serde(default)]
        rewind_agent_state: bool,
        session: String,
        /// Rewind paths others changed too.
        #[serde(default)]
        force: bool,
        #[serde(default)]
        progress: bool,
    },
    /// `checkpointfs gc`: exactly one of `keep` and `older_than_secs`. The response's
    /// `output` is the [`GcReport`](crate::history::gc::GcReport) as JSON.
    Gc {
        keep: Option<usize>,
        older_than_secs: Option<u64>,
        dry_run: bool,
        #[serde(default)]
        progress: bool,
    },
    Log {
        #[serde(default)]
        json: bool,
        /// Only the changes this agent session made (protocol 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    Diff {
        from: String,
        to: Option<String>,
        #[serde(default)]
        stat: bool,
        #[serde(default)]
        json: bool,
        /// Only the paths this agent session changed in between (protocol 2).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
        /// Diff files above the large-file limit by lines too. A daemon that predates it
        /// ignores it, and diffs every file whole, as it always did.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        full: bool,
    },
    Status {
        path: Option<String>,
        /// For a `path` that does not exist: whether to take it as a directory (`P/`).
        #[serde(default)]
        path_is_dir: Option<bool>,
        #[serde(default)]
        json: bool,
    },
    /// `checkpointfs ui` (protocol 3, each answered with a `checkpointfs.browse/1` document
    /// from `history::browse`): the newest checkpoint, polled for new ones.
    BrowseHead,
    /// A page of the timeline, newest first.
    BrowseTimeline {
        offset: usize,
        limit: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// A page of the paths checkpoint `id` lists, those containing `filter`.
    BrowseChanges {
        id: String,
        offset: usize,
        limit: usize,
        #[serde(default)]
        filter: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session: Option<String>,
    },
    /// Every checkpoint that lists a change of `path`.
    BrowsePath {
        path: String,
    },
    /// One file's diff from checkpoint `id`.
    BrowseDiff {
        id: String,
        path: String,
        against: crate::history::browse::Against,
    },
    /// The `ID:before-rewind` id a rewind to `id` would save the current state as now.
    UndoId {
        id: String,
    },
    /// `checkpointfs branch create MNT NAME [--at ID]` (protocol 5): without `at`, a
    /// checkpoint is taken first and the branch forks from it. Answers the branch's path.
    BranchCreate {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<String>,
    },
    /// `checkpointfs branch list MNT [--json]` (protocol 5).
    BranchList {
        #[serde(default)]
        json: bool,
    },
    /// `checkpointfs branch drop MNT NAME` (protocol 5).
    BranchDrop {
        name: String,
    },
    /// `checkpointfs remote set MNT URL` (protocol 4).
    RemoteSet {
        url: String,
        key_file: PathBuf,
    },
    /// `checkpointfs remote push MNT [--wait]` (protocol 4): `wait_secs` bounds the wait.
    RemotePush {
        #[serde(default)]
        wait_secs: Option<u64>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Response {
    pub ok: bool,
    /// Human-readable output for the CLI to print.
    #[serde(default)]
    pub output: String,
    #[serde(default)]
    pub error: String,
    /// The errno behind `error`, when there is one.
    #[serde(default)]
    pub errno: Option<i32>,
    /// Set only on progress lines, which come before the response proper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The daemon's [`PROTOCOL`]; 0 from a daemon that predates the field.
    #[serde(default)]
    pub protocol: u32,
}

impl Request {
    /// The lowest daemon [`PROTOCOL`] that understands this request as meant.
    fn protocol_needed(&self) -> u32 {
        match self {
            // Protocol 2: per-session reports (an older daemon would ignore the field) and
            // rewinds (it refuses the variant anyway, as unknown).
            Request::Log {
                session: Some(_), ..
            }
            | Request::Diff {
                session: Some(_), ..
            }
            | Request::SessionRewind { .. } => 2,
            Request::Log { json, .. } => u32::from(*json),
            Request::Diff { stat, json, .. } => u32::from(*stat || *json),
            Request::Status {
                json, path_is_dir, ..
            } => u32::from(*json || path_is_dir.is_some()),
            // New with protocol 1: an older daemon refuses it anyway, as unknown.
            Request::Gc { .. } => 1,
            Request::BrowseHead
            | Request::BrowseTimeline { .. }
            | Request::BrowseChanges { .. }
            | Request::BrowsePath { .. }
            | Request::BrowseDiff { .. }
            | Request::UndoId { .. } => 3,
            Request::RemoteSet { .. } | Request::RemotePush { .. } => 4,
            Request::BranchCreate { .. }
            | Request::BranchList { .. }
            | Request::BranchDrop { .. } => 5,
            // An older daemon only sends no progress lines.
            Request::Checkpoint { .. } | Request::Flush | Request::Rewind { .. } => 0,
        }
    }
}

impl Response {
    fn ok(output: String) -> Response {
        Response {
            ok: true,
            output,
            protocol: PROTOCOL,
            ..Default::default()
        }
    }

    fn err(e: &io::Error) -> Response {
        Response {
            ok: false,
            error: e.to_string(),
            // A refusal on a read-only mount carries EROFS for the client's exit status.
            errno: e
                .raw_os_error()
                .or((e.kind() == io::ErrorKind::ReadOnlyFilesystem).then_some(libc::EROFS)),
            protocol: PROTOCOL,
            ..Default::default()
        }
    }
}

pub struct ControlServer {
    path: PathBuf,
    stopping: Arc<AtomicBool>,
    /// A second descriptor of the listening socket, to wake the accept loop with
    /// `shutdown` (a throwaway connection would need the socket's path, which someone may
    /// have deleted).
    listener: UnixListener,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Stops accepting requests and removes the socket.
    pub fn stop(mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        // Makes the blocked accept fail (EINVAL), after which the loop sees `stopping`.
        // SAFETY: shutdown on a descriptor we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Starts serving `STATE/control.sock` (`state_dir`) for the mount whose core is `fs`, each
/// connection on a thread of its own; [`ControlServer::stop`] ends it.
pub fn start_server(
    fs: Arc<PassthroughFs>,
    state_dir: &Path,
    remote: Arc<RemoteControl>,
) -> io::Result<ControlServer> {
    let path = state_dir.join(SOCKET_NAME);
    // A socket left by a crashed daemon: nobody listens on it any more.
    if path.exists() && UnixStream::connect(&path).is_err() {
        std::fs::remove_file(&path)?;
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    if let Some(owner) = fs.owner() {
        // The user this mount is for runs the CLI; it reaches this socket (and nothing else)
        // through the state dir's 0711.
        std::os::unix::fs::chown(&path, Some(owner.uid), Some(owner.gid))?;
    }
    let listener_handle = listener.try_clone()?;
    let stopping = Arc::new(AtomicBool::new(false));
    let stop = stopping.clone();
    let maintenance = Arc::new(RwLock::new(()));
    let thread = std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match conn {
                    Ok(stream) => {
                        // Rewinds and gc take a while; serve each connection on its own
                        // thread so a slow one blocks nothing.
                        let fs = fs.clone();
                        let maintenance = maintenance.clone();
                        let remote = remote.clone();
                        let spawned = std::thread::Builder::new()
                            .name("control-conn".into())
                            .spawn(move || {
                                if let Err(e) = serve_connection(&fs, &maintenance, &remote, stream)
                                {
                                    debug!("control connection: {e}");
                                }
                            });
                        if let Err(e) = spawned {
                            warn!("control: cannot start a thread: {e}");
                        }
                    }
                    Err(e) => warn!("control socket accept: {e}"),
                }
            }
        })?;
    Ok(ControlServer {
        path,
        stopping,
        listener: listener_handle,
        thread: Some(thread),
    })
}

/// Serves only root, the daemon's own user and the user the mount is for (`--owner`). The
/// socket's mode (0600, in the state dir) already keeps others out; this holds even if it
/// did not (a connection made before the mode was set, a state dir an admin loosened).
fn check_peer(fs: &PassthroughFs, stream: &UnixStream) -> Result<(), Response> {
    let refuse = |error: String, errno: i32| Response {
        ok: false,
        error,
        errno: Some(errno),
        protocol: PROTOCOL,
        ..Default::default()
    };
    let cred = crate::sys::peer_cred(stream.as_fd()).map_err(|e| {
        refuse(
            format!("cannot tell who is asking (SO_PEERCRED): {e}"),
            libc::EACCES,
        )
    })?;
    // SAFETY: geteuid has no preconditions.
    let daemon_uid = unsafe { libc::geteuid() };
    let owner_uid = fs.owner().map(|o| o.uid);
    if cred.uid == 0 || cred.uid == daemon_uid || Some(cred.uid) == owner_uid {
        return Ok(());
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        warn!(
            "control: refused a connection from uid {} (pid {}); only root and the mount's \
             user are served (further refusals are not logged)",
            cred.uid, cred.pid
        );
    });
    Err(refuse(
        format!(
            "permission denied: uid {} may not control this mount; only root and uid {} can",
            cred.uid,
            owner_uid.unwrap_or(daemon_uid)
        ),
        libc::EACCES,
    ))
}

/// How often progress lines are sent at most.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// The longest request the daemon reads, newline included. The largest real one is a
/// rewind's path list; anything longer is refused (with a reply) unread.
pub const MAX_REQUEST: usize = 16 << 20;

/// How long a client may take to send its request; one that sends nothing (or no newline)
/// gets an error reply after this, and its thread ends.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request line is refused, as the reply's `error`. `line` is what was read,
/// `terminated` whether it ended with the newline (a request without one was cut short).
pub fn parse_request(line: &[u8], terminated: bool) -> Result<Request, String> {
    let text = std::str::from_utf8(line).map_err(|e| {
        format!(
            "bad control request: not valid UTF-8 (byte {} of {}); send one JSON object \
             per line",
            e.valid_up_to(),
            line.len()
        )
    })?;
    serde_json::from_str::<Request>(text).map_err(|e| {
        if terminated || !e.is_eof() {
            format!("bad control request: {e}")
        } else {
            format!(
                "bad control request: truncated after {} bytes, with no newline: {e}",
                line.len()
            )
        }
    })
}

/// Reads the request line: at most [`MAX_REQUEST`] bytes, within [`REQUEST_TIMEOUT`].
/// `Err` is the reply's error text.
fn read_request(stream: &UnixStream) -> Result<Request, String> {
    let mut line = Vec::new();
    let read = stream
        .set_read_timeout(Some(REQUEST_TIMEOUT))
        .and_then(|()| {
            BufReader::new(stream)
                .take(MAX_REQUEST as u64)
                .read_until(b'\n', &mut line)
        });
    match read {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(format!(
                "bad control request: no complete request within {} s",
                REQUEST_TIMEOUT.as_secs()
            ))
        }
        Err(e) => Err(format!("bad control request: reading it failed: {e}")),
        Ok(_) if line.last() == Some(&b'\n') => {
            line.pop();
            parse_request(&line, true)
        }
        Ok(n) if n >= MAX_REQUEST => Err(format!(
            "bad control request: longer than {MAX_REQUEST} bytes, refused unread"
        )),
        Ok(_) => parse_request(&line, false),
    }
}

/// Serves one connection: every request gets exactly one final reply, an error when it is
/// malformed or when its handler panicked (the daemon goes on serving either way).
fn serve_connection(
    fs: &PassthroughFs,
    maintenance: &RwLock<()>,
    remote: &RemoteControl,
    stream: UnixStream,
) -> io::Result<()> {
    if let Err(refusal) = check_peer(fs, &stream) {
        // Read (and ignore) the request first, within the same bounds as anyone's: closing
        // with it unread could reset the connection before the client's send, and the client
        // would never see why it was refused.
        let _ = read_request(&stream);
        let mut out = serde_json::to_vec(&refusal)?;
        out.push(b'\n');
        return (&stream).write_all(&out);
    }
    let request = read_request(&stream);
    let mut last_sent: Option<Instant> = None;
    // A client that went away only loses its progress lines; the work goes on.
    let mut send_progress = |text: String, last: bool| {
        if !last && last_sent.is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL) {
            return;
        }
        last_sent = Some(Instant::now());
        let line = Response {
            progress: Some(text),
            ..Default::default()
        };
        if let Ok(mut out) = serde_json::to_vec(&line) {
            out.push(b'\n');
            let _ = (&stream).write_all(&out);
        }
    };
    let response = match request {
        Ok(req) => {
            // A checkpoint (also a rewind's `ID:before-rewind`) is recorded under the agent
            // session of the process that asked, when it belongs to one (an agent running
            // the CLI): the peer's pid, traced up the process tree as for changes.
            let session = match req {
                Request::Checkpoint { .. }
                | Request::Rewind { .. }
                | Request::SessionRewind { .. } => crate::sys::peer_pid(stream.as_fd())
                    .ok()
                    .and_then(|pid| fs.history().session_of(pid)),
                _ => None,
            };
            let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match req {
                // Reads of memory only.
                Request::Checkpoint { .. }
                | Request::Flush
                | Request::BrowseHead
                | Request::UndoId { .. } => handle(fs, req, session, &mut send_progress),
                // The remote's worker reads through the history's own locks.
                Request::RemoteSet { .. } | Request::RemotePush { .. } => {
                    handle_remote(remote, req)
                }
                Request::Status { .. } => {
                    let _shared = maintenance.read().unwrap_or_else(|p| p.into_inner());
                    let mut response = handle(fs, req, session, &mut send_progress);
                    if let Some(status) = remote.status() {
                        add_remote_status(&mut response, status);
                    }
                    response
                }
                Request::Gc { .. } => {
                    let _alone = maintenance.write().unwrap_or_else(|p| p.into_inner());
                    handle(fs, req, session, &mut send_progress)
                }
                _ => {
                    let _shared = maintenance.read().unwrap_or_else(|p| p.into_inner());
                    handle(fs, req, session, &mut send_progress)
                }
            }));
            served.unwrap_or_else(|_| {
                warn!("control: a request's handler panicked; answered with an error");
                Response {
                    ok: false,
                    error: "internal error: the daemon's handler of this request panicked \
                            (see STATE/daemon.log); the mount goes on serving"
                        .to_string(),
                    protocol: PROTOCOL,
                    ..Default::default()
                }
            })
        }
        Err(error) => {
            debug!("control: {error}");
            Response {
                ok: false,
                error,
                errno: Some(libc::EINVAL),
                protocol: PROTOCOL,
                ..Default::default()
            }
        }
    };
    let mut out = serde_json::to_vec(&response)?;
    out.push(b'\n');
    (&stream).write_all(&out)
}

/// Whether the mount is read-only now (`-o ro`, or remounted ro since); from the mount
/// table, since the kernel does not tell the daemon about a remount.
fn mounted_read_only(fs: &PassthroughFs) -> bool {
    let (mountpoint, options) = fs.mount_info();
    match std::fs::read("/proc/self/mountinfo") {
        Ok(info) => crate::mount::options::mounted_read_only(&info, mountpoint),
        Err(_) => options.read_only,
    }
}

/// A rewind, streaming `rewind: DONE/TOTAL paths` lines when `wanted`. Refused on a
/// read-only mount (a dry run is not: it changes nothing).
fn rewind_request(
    fs: &PassthroughFs,
    id: &str,
    opts: &crate::rewind::RewindOptions,
    wanted: bool,
    progress: &mut dyn FnMut(String, bool),
) -> io::Result<String> {
    if !opts.dry_run && mounted_read_only(fs) {
        let mnt = fs.mount_info().0.display();
        return Err(io::Error::new(
            io::ErrorKind::ReadOnlyFilesystem,
            format!(
                "cannot rewind {mnt}: it is mounted read-only, and a rewind changes its files; \
                 remount it read-write first (mount -o remount,rw {mnt}), or mount it without \
                 -o ro (--dry-run shows what a rewind would change)"
            ),
        ));
    }
    let mut step = |done: usize, total: usize| {
        if wanted {
            progress(format!("rewind: {done}/{total} paths"), done == total);
        }
    };
    crate::rewind::rewind(fs, id, opts, &mut step)
}

/// The remote's requests (see `mount::remote`).
fn handle_remote(remote: &RemoteControl, req: Request) -> Response {
    let result = match req {
        Request::RemoteSet { url, key_file } => {
            remote.set(crate::history::settings::RemoteSetting { url, key_file })
        }
        Request::RemotePush { wait_secs } => remote.push(wait_secs.map(Duration::from_secs)),
        _ => Err(io::Error::other("not a remote request")),
    };
    match result {
        Ok(out) => Response::ok(out),
        Err(e) => Response::err(&e),
    }
}

/// Puts the push's lag into a status response's report (a JSON document).
fn add_remote_status(response: &mut Response, status: crate::history::status::RemoteStatus) {
    if !response.ok {
        return;
    }
    if let Ok(mut report) =
        serde_json::from_str::<crate::history::status::StatusReport>(&response.output)
    {
        report.remote = Some(status);
        if let Ok(doc) = json_document(&report) {
            response.output = doc;
        }
    }
}

/// `progress(text, last)` streams a progress line to the client, if it asked for them.
/// `session`: the agent session of the client, if any, for the checkpoints it takes.
fn handle(
    fs: &PassthroughFs,
    req: Request,
    session: Option<String>,
    progress: &mut dyn FnMut(String, bool),
) -> Response {
    let result = match req {
        Request::Checkpoint { id } => match crate::history::ids::validate_id(id.as_bytes()) {
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string())),
            Ok(id) => fs
                .checkpoint(id, session)
                .map(|()| format!("checkpoint {id}\n")),
        },
        Request::Flush => fs.history().flush().map(|()| String::new()),
        Request::Rewind {
            id,
            dry_run,
            paths,
            rewind_agent_state,
            progress: wanted,
        } => {
            let opts = crate::rewind::RewindOptions {
                paths,
                dry_run,
                rewind_agent_state,
                session: None,
                force: false,
                checkpoint_session: session,
            };
            rewind_request(fs, &id, &opts, wanted, progress)
        }
        Request::SessionRewind {
            id,
            dry_run,
            paths,
            rewind_agent_state,
            session: rewound,
            force,
            progress: wanted,
        } => {
            let session_of_client = session;
            let opts = crate::rewind::RewindOptions {
                paths,
                dry_run,
                rewind_agent_state,
                session: Some(rewound),
                force,
                checkpoint_session: session_of_client,
            };
            rewind_request(fs, &id, &opts, wanted, progress)
        }
        Request::Gc {
            keep,
            older_than_secs,
            dry_run,
            progress: wanted,
        } => gc_request(keep, older_than_secs).and_then(|retention| {
            let mut step = |done: usize, total: usize| {
                if wanted {
                    progress(format!("gc: swept {done}/{total} objects"), done == total);
                }
            };
            let report = fs.gc(retention, dry_run, &mut step)?;
            Ok(serde_json::to_string(&report)?)
        }),
        // Reports read the transcript: make it complete first.
        // Reports are data: the answer is the report's JSON document whatever `json` asks
        // (the CLI has always asked for it, and renders text itself).
        Request::Log { json: _, session } => fs.history().flush().and_then(|()| {
            let mut report = fs.history().log_report()?;
            if let Some(s) = &session {
                report.keep_only_session(s);
            }
            json_document(&report)
        }),
        Request::Diff {
            from,
            to,
            stat,
            json: _,
            session,
            full,
        } => {
            // Attribution for --session is read from the transcript.
            let flushed = match session {
                Some(_) => fs.history().flush(),
                None => Ok(()),
            };
            flushed.and_then(|()| {
                let history = fs.history();
                json_document(&history.diff_report_of(
                    &from,
                    to.as_deref(),
                    !stat,
                    session.as_deref(),
                    full,
                )?)
            })
        }
        Request::Status {
            path,
            path_is_dir,
            json: _,
        } => fs
            .history()
            .status_report(path.as_deref(), path_is_dir)
            .and_then(|mut report| {
                report.mounted = true;
                report.daemon_pid = Some(std::process::id());
                report.io = Some(crate::history::status::IoMode {
                    kernel_passthrough: fs.passthrough_enabled(),
                    passthrough_off_reason: fs.passthrough_off_reason().map(str::to_string),
                    // SAFETY: geteuid has no preconditions.
                    daemon_uid: unsafe { libc::geteuid() },
                    owner_uid: fs.owner().map(|o| o.uid),
                    mount_options: fs.mount_info().1.list.clone(),
                    read_only: mounted_read_only(fs),
                    transport: Some(crate::transport::session::transport().describe()),
                    io_uring: matches!(
                        crate::transport::session::transport(),
                        crate::transport::session::Transport::IoUring { .. }
                    ),
                    requests: crate::transport::session::request_counts(),
                });
                json_document(&report)
            }),
        Request::BranchCreate { name, at } => {
            branch_create(fs, &name, at.as_deref(), session).map(|path| format!("{path}\n"))
        }
        Request::BranchList { json } => branch_list(fs, json),
        Request::BranchDrop { name } => fs
            .branches()
            .branches()
            .drop_branch(&name)
            .map(|()| format!("dropped branch {name} (gc frees its storage)\n")),
        Request::BrowseHead => json_document(&fs.history().browse_head()),
        Request::UndoId { id } => fs
            .history()
            .point(&id)
            .map(|_| fs.history().unused_rewind_id(&id)),
        // The pages read the transcript (who changed what): make it complete first.
        Request::BrowseTimeline {
            offset,
            limit,
            session,
        } => fs.history().flush().and_then(|()| {
            json_document(
                &fs.history()
                    .timeline_page(offset, limit, session.as_deref())?,
            )
        }),
        Request::BrowseChanges {
            id,
            offset,
            limit,
            filter,
            session,
        } => fs.history().flush().and_then(|()| {
            json_document(&fs.history().changes_page(
                &id,
                offset,
                limit,
                &filter,
                session.as_deref(),
            )?)
        }),
        Request::BrowsePath { path } => fs
            .history()
            .flush()
            .and_then(|()| json_document(&fs.history().path_history(&path)?)),
        Request::BrowseDiff { id, path, against } => fs
            .history()
            .flush()
            .and_then(|()| json_document(&fs.history().file_diff_of(&id, &path, &against)?)),
        Request::RemoteSet { .. } | Request::RemotePush { .. } => Err(io::Error::other(
            "internal error: a remote request reached the history's handler",
        )),
    };
    match result {
        Ok(out) => Response::ok(out),
        Err(e) => Response::err(&e),
    }
}

/// The retention a gc request asks for: exactly one of its two fields.
/// `branch create`: checks the name before anything is done, resolves or takes the fork
/// checkpoint, then makes the branch (O(1): `history::branches::Branches::create`).
/// Returns the branch's absolute path.
fn branch_create(
    fs: &PassthroughFs,
    name: &str,
    at: Option<&str>,
    session: Option<String>,
) -> io::Result<String> {
    use crate::history::branches::name_problem;
    let branches = fs.branches().branches();
    if let Some(why) = name_problem(name) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    if branches.get(name).is_some() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("a branch named '{name}' exists already (see: checkpointfs branch list)"),
        ));
    }
    let history = fs.history();
    let fork = match at {
        Some(id) => {
            if history.checkpoint_index(id).is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no checkpoint '{}' to fork branch '{name}' from (see: checkpointfs log)",
                        id.escape_debug()
                    ),
                ));
            }
            id.to_owned()
        }
        None => {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            let id = format!("branch-{name}@{ms}");
            fs.checkpoint(&id, session)?;
            id
        }
    };
    let k = history
        .checkpoint_index(&fork)
        .ok_or_else(|| io::Error::other(format!("checkpoint {fork} went away")))?;
    let root = history
        .view_entry(k, b"")?
        .ok_or_else(|| io::Error::other(format!("checkpoint {fork} has no root")))?;
    branches.create(name, &fork, &root.meta)?;
    let (mountpoint, _) = fs.mount_info();
    Ok(mountpoint
        .join(".checkpoint/branches")
        .join(name)
        .display()
        .to_string())
}

/// `branch list`: name, fork checkpoint, creation time, bytes in the upper, path; text or
/// JSON (`checkpointfs.branches/1`).
fn branch_list(fs: &PassthroughFs, json: bool) -> io::Result<String> {
    let (mountpoint, _) = fs.mount_info();
    let rows: Vec<serde_json::Value> = fs
        .branches()
        .branches()
        .all()
        .iter()
        .map(|b| {
            serde_json::json!({
                "name": b.info.name,
                "fork": b.info.fork,
                "created": b.info.created,
                "upper_bytes": b.upper_bytes(),
                "path": mountpoint.join(".checkpoint/branches").join(&b.info.name),
            })
        })
        .collect();
    if json {
        let doc = serde_json::json!({ "schema": "checkpointfs.branches/1", "branches": rows });
        return Ok(format!("{doc}\n"));
    }
    if rows.is_empty() {
        return Ok("no branches\n".to_owned());
    }
    let mut out = String::from("NAME\tFORK\tCREATED\tBYTES\tPATH\n");
    for r in &rows {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            r["name"].as_str().unwrap_or(""),
            r["fork"].as_str().unwrap_or(""),
            r["created"].as_str().unwrap_or(""),
            r["upper_bytes"],
            r["path"].as_str().unwrap_or(""),
        ));
    }
    Ok(out)
}

fn gc_request(
    keep: Option<usize>,
    older_than_secs: Option<u64>,
) -> io::Result<crate::history::gc::Retention> {
    use crate::history::gc::Retention;
    match (keep, older_than_secs) {
        (Some(n), None) if n >= 1 => Ok(Retention::Keep(n)),
        (None, Some(secs)) if secs >= 1 => Ok(Retention::OlderThan(Duration::from_secs(secs))),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "gc needs exactly one of --keep N (N >= 1) and --older-than DURATION",
        )),
    }
}

/// Whether a daemon is listening on the state dir's control socket.
pub fn daemon_is_serving(state_dir: &Path) -> bool {
    UnixStream::connect(state_dir.join(SOCKET_NAME)).is_ok()
}

/// Sends one request to the daemon whose state dir is `state_dir`.
pub fn request(state_dir: &Path, req: &Request) -> io::Result<Response> {
    request_with_progress(state_dir, req, &mut |_| {})
}

/// Like [`request`]; progress lines that come before the response go to `on_progress`.
pub fn request_with_progress(
    state_dir: &Path,
    req: &Request,
    on_progress: &mut dyn FnMut(&str),
) -> io::Result<Response> {
    let path = state_dir.join(SOCKET_NAME);
    let stream = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot reach the checkpointfs daemon at {}: {e} (is the directory mounted?)",
                path.display()
            ),
        )
    })?;
    let mut msg = serde_json::to_vec(req)?;
    msg.push(b'\n');
    (&stream).write_all(&msg)?;
    let mut reader = BufReader::new(&stream);
    // The daemon ends every line with '\n' and closes only after its answer: an end before
    // that is a daemon that died (was killed, crashed) while it worked on the request.
    let died = |what: &str| {
        format!(
            "the daemon serving {} {what} before it answered: it exited or was killed while \
             working on the request, which may be partly done. See {} for why, and \
             `checkpointfs status MNT` for the mount's state (if it says the mount is gone: \
             `checkpointfs umount MNT`, then mount again)",
            state_dir.display(),
            state_dir.join("daemon.log").display()
        )
    };
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(_) if !line.ends_with('\n') => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    died("closed the connection"),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(crate::sys::context(died("dropped the connection"), e));
            }
            Err(e) => return Err(e),
        }
        let response: Response = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad response from the daemon: {e}"),
            )
        })?;
        match &response.progress {
            Some(text) => on_progress(text),
            None if response.protocol < req.protocol_needed() => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "the daemon at {} runs an older checkpointfs, which does not know \
                         this option (--json, --stat, --session or a directory --path); \
                         unmount and \
                         mount again with this checkpointfs to use it",
                        path.display()
                    ),
                ));
            }
            None => return Ok(response),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A daemon that answers every connection with `answer`; the requests it got.
    fn fake_daemon(dir: &Path, answer: String) -> JoinHandle<Vec<String>> {
        let listener = UnixListener::bind(dir.join(SOCKET_NAME)).unwrap();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            for _ in 0..2 {
                let (stream, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&stream).read_line(&mut line).unwrap();
                got.push(line);
                (&stream).write_all(answer.as_bytes()).unwrap();
            }
            got
        })
    }

    #[test]
    fn a_daemon_that_predates_the_formats_is_refused_for_them_only() {
        let dir = tempfile::tempdir().unwrap();
        let old = fake_daemon(
            dir.path(),
            "{\"ok\":true,\"output\":\"m1  2025\\n\"}\n".to_string(),
        );
        let plain = request(
            dir.path(),
            &Request::Log {
                json: false,
                session: None,
            },
        )
        .unwrap();
        assert_eq!(plain.output, "m1  2025\n");
        let err = request(
            dir.path(),
            &Request::Log {
                json: true,
                session: None,
            },
        )
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        assert!(
            err.to_string().contains("runs an older checkpointfs"),
            "{err}"
        );
        let got = old.join().unwrap();
        assert_eq!(got[1], "{\"cmd\":\"log\",\"json\":true}\n");
    }

    #[test]
    fn this_daemon_answers_with_its_protocol() {
        let dir = tempfile::tempdir().unwrap();
        let answer = serde_json::to_string(&Response::ok("{}".into())).unwrap() + "\n";
        let new = fake_daemon(dir.path(), answer);
        let diff = Request::Diff {
            from: "m1".into(),
            to: None,
            stat: true,
            json: true,
            session: None,
            full: false,
        };
        assert_eq!(request(dir.path(), &diff).unwrap().protocol, PROTOCOL);
        let err = Response::err(&io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(err.protocol, PROTOCOL);
        assert!(request(dir.path(), &Request::Flush).is_ok());
        new.join().unwrap();
    }

    #[test]
    fn a_daemon_that_dies_while_answering_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        for answer in ["", "{\"ok\":tr"] {
            let _ = std::fs::remove_file(dir.path().join(SOCKET_NAME));
            let listener = UnixListener::bind(dir.path().join(SOCKET_NAME)).unwrap();
            let daemon = std::thread::spawn(move || {
                let (stream, _) = listener.accept().unwrap();
                let mut line = String::new();
                BufReader::new(&stream).read_line(&mut line).unwrap();
                (&stream).write_all(answer.as_bytes()).unwrap();
            });
            let err = request(dir.path(), &Request::Flush).unwrap_err();
            daemon.join().unwrap();
            let text = err.to_string();
            assert!(!text.contains("bad response"), "{text}");
            assert!(text.contains("exited or was killed"), "{text}");
            assert!(text.contains("daemon.log"), "{text}");
        }
    }
}
