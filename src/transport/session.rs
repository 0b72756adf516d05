//! The FUSE session: the INIT handshake, then reader threads on `/dev/fuse` that decode each
//! request ([`super::decode`]), hand it to the [`FuseAdapter`] and write its reply
//! ([`super::encode`]). The session ends when the kernel ends the connection (unmount or
//! abort: a read fails with ENODEV) or sends DESTROY; then the adapter flushes the history.
//!
//! With FUSE over io_uring ([`super::uring`]; `enable_uring` on, not `--no-io-uring`),
//! requests travel over per-CPU ring queues once every queue is registered; the
//! `/dev/fuse` readers stay for what the kernel still sends there (FORGET, INTERRUPT) and
//! for the time before the switch. Each queue gets [`ENTRIES_PER_QUEUE`] entries, each
//! served by a thread of its own with an io_uring of its own (the kernel ties an entry to
//! its queue by `qid`, not to a ring): a handler that blocks (a first write waits for its
//! file's backup, a rename for a checkpoint in progress) holds one entry and one thread,
//! and the queue's other entries go on serving that CPU's callers, as the other
//! `/dev/fuse` readers do. That keeps the fast path (the caller's CPU runs the handler
//! and commits the reply itself: no hand-over to a pool, no extra wake-up) and costs one
//! payload buffer (max_write) per entry.
//!
//! What fuser's `Session` did before, kept as it was: one fd per reader thread (clones by
//! FUSE_DEV_IOC_CLONE), INTERRUPT answered ENOSYS (the kernel then sends no more: no request
//! of ours is long enough to be worth cancelling), and, for a mount only its owner may use,
//! requests from any other uid refused with EACCES except those the kernel sends on its
//! own behalf.
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use log::{debug, info, warn};

use super::abi::{self, opcode};
use super::adapter::{FuseAdapter, MAX_WRITE};
use super::decode::{self, Op, Proto, Request};
use super::encode::ReplyBuf;
use super::uring::{self, Next, Queue};

/// How the daemon wants its session run.
#[derive(Clone)]
pub struct SessionConfig {
    /// Reader threads on `/dev/fuse`.
    pub threads: usize,
    /// Only the daemon's own uid may use the mount (no `allow_other`, no `--owner`).
    pub owner_only: bool,
    /// Use FUSE over io_uring when the kernel offers it (not `--no-io-uring`).
    pub io_uring: bool,
    /// Called when a ring queue thread fails after the kernel switched to the ring: its
    /// CPU's callers would otherwise wait forever. Must end the connection (the daemon
    /// exits, which closes /dev/fuse and so aborts it; the watchdog covers a stuck exit).
    pub on_fatal: Arc<dyn Fn(&str) + Send + Sync>,
    /// Test hook (the hidden `mount --test-park-ring-requests`, for tests/it/watchdog.rs):
    /// a ring request for the xattr [`PARK_IN_DAEMON`] parks its entry's thread before it
    /// is served, one for [`PARK_AWAITING_COMMIT`] after its reply is built and before it
    /// is committed; each logs a line first. Those threads never go on.
    pub test_park: bool,
}

/// The xattr name whose ring request the test hook parks in the daemon.
pub const PARK_IN_DAEMON: &str = "user.checkpointfs.test.park-in-daemon";
/// The xattr name whose ring request the test hook parks with its reply uncommitted.
pub const PARK_AWAITING_COMMIT: &str = "user.checkpointfs.test.park-awaiting-commit";

/// The test hook: logs where the request is parked, then never returns.
fn park_forever(unique: u64, qid: u16, state: &str) -> ! {
    info!("test hook: request {unique} on ring queue {qid} parked {state}");
    loop {
        std::thread::park();
    }
}

/// Whether the test hook parks `req` (a GETXATTR of `name`).
fn parks(req: &Request<'_>, name: &str) -> bool {
    matches!(&req.op, Op::Getxattr { name: n, .. } if *n == name)
}

/// Entries (and threads) per ring queue; see the module docs.
pub const ENTRIES_PER_QUEUE: usize = 2;

/// How long the queue threads may take to register before the session gives up on the
/// ring (requests wait for the ring meanwhile; the kernel answers a REGISTER at once).
const REGISTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The transport requests travel over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Before INIT, or while the ring queues register.
    Starting,
    /// Every request over `/dev/fuse`, and why not io_uring.
    DevFuse { why_not_io_uring: String },
    /// FUSE over io_uring: `queues` per-CPU queues of `entries` entries each.
    IoUring { queues: usize, entries: usize },
}

impl Transport {
    /// As `status` prints it: "io_uring (2 queues)", "/dev/fuse (--no-io-uring)".
    pub fn describe(&self) -> String {
        match self {
            Transport::Starting => "starting".to_string(),
            Transport::DevFuse { why_not_io_uring } => format!("/dev/fuse ({why_not_io_uring})"),
            Transport::IoUring { queues, entries } => format!(
                "io_uring ({queues} queue{}, {entries} entries each)",
                if *queues == 1 { "" } else { "s" }
            ),
        }
    }
}

/// The transport of this process's session (a daemon serves one mount), for `status`.
static TRANSPORT: std::sync::Mutex<Transport> = std::sync::Mutex::new(Transport::Starting);

fn publish(t: Transport) {
    *TRANSPORT.lock().unwrap_or_else(|p| p.into_inner()) = t;
}

/// The transport requests travel over now.
pub fn transport() -> Transport {
    TRANSPORT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The read buffer the kernel requires: a whole WRITE of `max_write` with its headers
/// (fs/fuse/dev.c refuses a smaller read with EINVAL).
const READ_BUF_SIZE: usize = MAX_WRITE as usize + 4096;

/// INTERRUPT requests seen (answered ENOSYS; see the module docs).
static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

/// Requests served, by opcode (both transports; INIT not counted): what `status --json`
/// reports as `io.requests`, so a benchmark can print how many requests an operation cost.
/// One relaxed increment per request.
static REQUESTS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Requests served so far, by opcode name (`LOOKUP`), only those seen at least once.
pub fn request_counts() -> std::collections::BTreeMap<String, u64> {
    REQUESTS
        .iter()
        .enumerate()
        .filter_map(|(op, n)| {
            let n = n.load(Ordering::Relaxed);
            (n > 0).then(|| {
                let name = opcode::name(op as u32).map_or_else(|| format!("OP{op}"), String::from);
                (name, n)
            })
        })
        .collect()
}

/// Serves the connection behind `dev` (a mounted `/dev/fuse` fd) until it ends. Calls the
/// adapter's `destroy` once every reader has stopped.
pub fn run(adapter: Arc<FuseAdapter>, dev: Arc<OwnedFd>, cfg: SessionConfig) -> io::Result<()> {
    let (proto, ring) = handshake(&adapter, dev.as_fd(), &cfg)?;
    let owner = if cfg.owner_only {
        // SAFETY: geteuid has no preconditions.
        Some(unsafe { libc::geteuid() })
    } else {
        None
    };
    let mut readers = Vec::with_capacity(cfg.threads.max(1));
    for i in 0..cfg.threads.max(1) {
        // The first reader reads the session's fd; the others their own clones of it.
        let fd = if i == 0 {
            None
        } else {
            match super::dev::clone_fd(dev.as_fd()) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    warn!("{e}; reader thread {i} shares the session's fd");
                    None
                }
            }
        };
        let (adapter, dev) = (adapter.clone(), dev.clone());
        let reader = std::thread::Builder::new()
            .name(format!("fuse-{i}"))
            .spawn(move || {
                let fd = fd.as_ref().map_or(dev.as_fd(), |f| f.as_fd());
                serve_dev(&adapter, fd, proto, owner)
            })?;
        readers.push(reader);
    }
    let queue_threads = match ring {
        Ok(queues) => start_ring(queues, &adapter, &dev, proto, owner, &cfg),
        Err(why_not) => {
            info!("FUSE over io_uring not used: {why_not}; requests travel over /dev/fuse");
            publish(Transport::DevFuse {
                why_not_io_uring: why_not,
            });
            Vec::new()
        }
    };
    let mut served = Ok(());
    for reader in readers {
        match reader.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if served.is_ok() {
                    served = Err(e);
                }
            }
            Err(_) => {
                if served.is_ok() {
                    served = Err(io::Error::other("a FUSE reader thread panicked"));
                }
            }
        }
    }
    for q in queue_threads {
        // Every entry's command ends with the connection (ENOTCONN/ECANCELED), so each
        // queue thread returns once the readers have seen ENODEV.
        let _ = q.join();
    }
    let interrupts = INTERRUPTS.load(Ordering::Relaxed);
    if interrupts > 0 {
        info!("{interrupts} FUSE INTERRUPT request(s) answered ENOSYS");
    }
    adapter.destroy();
    served
}

/// Ring queues set up before the INIT reply, or why the ring is not used.
type Prepared = Result<Vec<Queue>, String>;

/// Reads requests until INIT arrives and answers it. Returns the protocol in effect, and
/// the ring's queues when the reply announced FUSE_OVER_IO_URING.
fn handshake(
    adapter: &FuseAdapter,
    dev: BorrowedFd<'_>,
    cfg: &SessionConfig,
) -> io::Result<(Proto, Prepared)> {
    let mut buf = vec![0u8; READ_BUF_SIZE];
    let mut out = ReplyBuf::new();
    loop {
        let n = match read_request(dev, &mut buf)? {
            Some(n) => n,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the FUSE connection ended before INIT",
                ));
            }
        };
        let req = decode::decode(&buf[..n], &Proto::default())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("FUSE INIT: {e}")))?;
        let Op::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = req.op
        else {
            send(dev, out.error(req.header.unique, libc::EIO));
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("FUSE request (opcode {}) before INIT", req.header.opcode),
            ));
        };
        let unique = req.header.unique;
        if major > abi::FUSE_KERNEL_VERSION {
            // A newer major version: answer ours alone and wait for a second INIT.
            let ours = abi::fuse_init_out {
                major: abi::FUSE_KERNEL_VERSION,
                minor: abi::FUSE_KERNEL_MINOR_VERSION,
                ..Default::default()
            };
            send(dev, out.start(unique).init(&ours).finish());
            continue;
        }
        if major < abi::FUSE_KERNEL_VERSION || minor < abi::MIN_KERNEL_MINOR_VERSION {
            send(dev, out.error(unique, libc::EPROTO));
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "FUSE protocol {major}.{minor} is older than 7.{} (Linux 3.15), which \
                     this daemon needs",
                    abi::MIN_KERNEL_MINOR_VERSION
                ),
            ));
        }
        let mut init = adapter.init(flags, max_readahead);
        // Every queue exists before the reply announces the ring: from the reply on, the
        // kernel holds every request until the ring is ready or registration fails.
        let ring = prepare_ring(dev, cfg.io_uring, flags, &init);
        if ring.is_ok() {
            init.flags2 |= (abi::FUSE_OVER_IO_URING >> 32) as u32;
        }
        debug!(
            "INIT: kernel {major}.{minor} offers {flags:#x}; reply flags {:#x}, max write {}, \
             max readahead {}",
            u64::from(init.flags) | u64::from(init.flags2) << 32,
            init.max_write,
            init.max_readahead
        );
        let proto = Proto {
            minor: minor.min(abi::FUSE_KERNEL_MINOR_VERSION),
            setxattr_ext: u64::from(init.flags) & abi::FUSE_SETXATTR_EXT != 0,
        };
        if !send(dev, out.start(unique).init(&init).finish()) {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the kernel refused the INIT reply",
            ));
        }
        return Ok((proto, ring));
    }
}

/// Sets up every ring queue, or says why the ring is not used.
fn prepare_ring(
    dev: BorrowedFd<'_>,
    wanted: bool,
    offered: u64,
    init: &abi::fuse_init_out,
) -> Prepared {
    if !wanted {
        return Err("--no-io-uring".to_string());
    }
    if offered & abi::FUSE_OVER_IO_URING == 0 {
        return Err(match uring::enable_uring_param() {
            Some(false) => {
                "the kernel does not offer it: /sys/module/fuse/parameters/enable_uring is off"
                    .to_string()
            }
            Some(true) => "the kernel does not offer it, although enable_uring is on".to_string(),
            None => {
                "this kernel has no FUSE over io_uring (Linux 6.14+ with enable_uring)".to_string()
            }
        });
    }
    let queues =
        uring::queue_count().map_err(|e| format!("cannot count the possible CPUs: {e}"))?;
    let qids = u16::try_from(queues).map_err(|_| format!("{queues} CPUs are too many queues"))?;
    let size = uring::payload_size(init.max_write, init.max_pages);
    let mut prepared = Vec::with_capacity(queues * ENTRIES_PER_QUEUE);
    for qid in 0..qids {
        for _ in 0..ENTRIES_PER_QUEUE {
            prepared.push(Queue::new(dev, qid, 1, size).map_err(|e| e.to_string())?);
        }
    }
    Ok(prepared)
}

/// What the queue threads report of their registration.
#[derive(Default)]
struct Registration {
    /// One outcome per thread that tried.
    outcomes: Vec<Result<(), String>>,
    /// The session gave up on the ring (a failure or the timeout): threads that have not
    /// registered yet must not (the kernel would switch to a ring that was given up).
    abandoned: bool,
}

/// Starts one thread per prepared ring (each pinned to its queue's CPU), waits until all
/// have registered, and publishes the outcome; on a failure or the timeout makes the kernel
/// give up on the ring (requests then travel over `/dev/fuse`).
fn start_ring(
    queues: Vec<Queue>,
    adapter: &Arc<FuseAdapter>,
    dev: &Arc<OwnedFd>,
    proto: Proto,
    owner: Option<u32>,
    cfg: &SessionConfig,
) -> Vec<std::thread::JoinHandle<()>> {
    let total = queues.len();
    let nqueues = queues
        .iter()
        .map(|q| usize::from(q.qid()) + 1)
        .max()
        .unwrap_or(0);
    let registration = Arc::new((
        std::sync::Mutex::new(Registration::default()),
        std::sync::Condvar::new(),
    ));
    let mut threads = Vec::with_capacity(total);
    let mut spawn_error = None;
    for (i, mut queue) in queues.into_iter().enumerate() {
        let (adapter, registration, on_fatal) =
            (adapter.clone(), registration.clone(), cfg.on_fatal.clone());
        let test_park = cfg.test_park;
        let spawned = std::thread::Builder::new()
            .name(format!(
                "fuse-ring-{}.{}",
                queue.qid(),
                i % ENTRIES_PER_QUEUE
            ))
            .spawn(move || {
                let qid = queue.qid();
                if let Err(e) = uring::pin_to_cpu(usize::from(qid)) {
                    debug!("queue {qid}: cannot pin to CPU {qid}: {e}");
                }
                {
                    let (lock, cv) = &*registration;
                    let mut reg = lock.lock().unwrap_or_else(|p| p.into_inner());
                    if reg.abandoned {
                        return;
                    }
                    let outcome = queue.register().map_err(|e| e.to_string());
                    let ok = outcome.is_ok();
                    reg.outcomes.push(outcome);
                    cv.notify_all();
                    if !ok {
                        return;
                    }
                }
                // A panic or an error from here on would leave this entry's CPU with one
                // entry fewer, and its callers waiting for good once none is left.
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve_queue(&mut queue, &adapter, proto, owner, test_park)
                }));
                match served {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => on_fatal(&format!("FUSE ring queue {qid} failed: {e}")),
                    Err(_) => on_fatal(&format!("FUSE ring queue {qid}'s thread panicked")),
                }
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                spawn_error = Some(format!("cannot start a ring queue thread: {e}"));
                break;
            }
        }
    }
    let (lock, cv) = &*registration;
    let reg = lock.lock().unwrap_or_else(|p| p.into_inner());
    let (mut reg, _) = cv
        .wait_timeout_while(reg, REGISTER_TIMEOUT, |r| {
            spawn_error.is_none()
                && r.outcomes.len() < total
                && r.outcomes.iter().all(|o| o.is_ok())
        })
        .unwrap_or_else(|p| p.into_inner());
    let failure = spawn_error
        .or_else(|| reg.outcomes.iter().find_map(|o| o.clone().err()))
        .or_else(|| {
            (reg.outcomes.len() < total).then(|| {
                format!(
                    "only {} of {total} ring entries registered within {} s",
                    reg.outcomes.len(),
                    REGISTER_TIMEOUT.as_secs()
                )
            })
        });
    match failure {
        None => {
            info!(
                "FUSE over io_uring: {nqueues} queues, {ENTRIES_PER_QUEUE} entries each; \
                 /dev/fuse keeps FORGET, INTERRUPT and notifications"
            );
            publish(Transport::IoUring {
                queues: nqueues,
                entries: ENTRIES_PER_QUEUE,
            });
        }
        Some(why) => {
            reg.abandoned = true;
            // While the lock is held no thread registers, so the ring cannot become ready
            // behind our back: a failed REGISTER now makes the kernel give up on it.
            let forced = uring::force_fallback(dev.as_fd());
            drop(reg);
            let why = match forced {
                Ok(()) => why,
                Err(e) => format!("{why} (and making the kernel give up on the ring failed: {e})"),
            };
            warn!("FUSE over io_uring not used: {why}; requests travel over /dev/fuse");
            publish(Transport::DevFuse {
                why_not_io_uring: why,
            });
        }
    }
    threads
}

/// One ring entry's thread: wait for a request, serve it, commit the reply (which re-arms
/// the entry), until the connection ends. An error is fatal to the session (see
/// [`SessionConfig::on_fatal`]).
fn serve_queue(
    queue: &mut Queue,
    adapter: &FuseAdapter,
    proto: Proto,
    owner: Option<u32>,
    test_park: bool,
) -> Result<(), uring::UringError> {
    let mut out = ReplyBuf::new();
    // Measured (docs/performance.md, "Hand-over on the caller's CPU"): without it, the
    // caller woken by a commit is moved to the other, idle CPU (an IPI and a wake from
    // halt-polling), and its next request lands on that CPU's queue, whose thread must be
    // woken the same way: a bare round trip took 44-60 µs on a quiet machine, 18-21 µs
    // with the hand-over. Only where this thread can come back from SCHED_IDLE.
    let hand_over = uring::may_hand_over();
    loop {
        let idx = match queue.wait_request()? {
            Next::Request(idx) => idx,
            Next::Ended => return Ok(()),
        };
        let mut caller_waits = true;
        let unique = match queue.request(idx, &proto) {
            Ok(req) => {
                let unique = req.header.unique;
                caller_waits = caller_waits_for(req.header.opcode);
                if test_park && parks(&req, PARK_IN_DAEMON) {
                    park_forever(unique, queue.qid(), "in the daemon");
                }
                match handle(adapter, &req, owner, &mut out) {
                    Handled::Reply | Handled::Destroyed => {}
                    // Only FORGETs have no reply, and they never travel over the ring; a
                    // ring entry must be committed to be re-armed.
                    Handled::NoReply => {
                        out.error(unique, libc::ENOSYS);
                    }
                }
                if test_park && parks(&req, PARK_AWAITING_COMMIT) {
                    park_forever(unique, queue.qid(), "awaiting commit");
                }
                unique
            }
            Err(e) => {
                warn!(
                    "undecodable FUSE request on ring queue {}: {e}",
                    queue.qid()
                );
                let unique = e.header.map_or(queue.commit_id(idx), |h| h.unique);
                out.error(unique, libc::EIO);
                unique
            }
        };
        // Submitted by the next wait (one io_uring_enter for the commit and the wait;
        // with one entry per ring nothing else is ready before it).
        queue.commit(idx, unique, &mut out)?;
        if hand_over && caller_waits {
            queue.submit_handing_over()?;
        }
    }
}

/// Whether a caller sleeps waiting for this request's reply, so that handing the CPU over
/// to it makes sense. RELEASE and RELEASEDIR are sent in the background after the last
/// close: nobody waits for them, and handing over would only yield to whatever else runs.
fn caller_waits_for(opcode: u32) -> bool {
    !matches!(opcode, opcode::FUSE_RELEASE | opcode::FUSE_RELEASEDIR)
}

/// One reader thread: read, decode, dispatch, reply, until the connection ends.
fn serve_dev(
    adapter: &FuseAdapter,
    dev: BorrowedFd<'_>,
    proto: Proto,
    owner: Option<u32>,
) -> io::Result<()> {
    let mut buf = vec![0u8; READ_BUF_SIZE];
    let mut out = ReplyBuf::new();
    while let Some(n) = read_request(dev, &mut buf)? {
        let req = match decode::decode(&buf[..n], &proto) {
            Ok(req) => req,
            Err(e) => {
                // A request we cannot read: the caller gets EIO, nobody else notices.
                warn!("undecodable FUSE request: {e}");
                if let Some(h) = e.header.filter(|h| h.expects_reply()) {
                    send(dev, out.error(h.unique, libc::EIO));
                }
                continue;
            }
        };
        match handle(adapter, &req, owner, &mut out) {
            Handled::Reply => {
                send(dev, out.bytes());
            }
            Handled::NoReply => {}
            Handled::Destroyed => {
                send(dev, out.bytes());
                return Ok(());
            }
        }
    }
    Ok(())
}

/// What [`handle`] left in the reply buffer.
pub enum Handled {
    /// A reply to send.
    Reply,
    /// Nothing to send (FORGET, BATCH_FORGET).
    NoReply,
    /// DESTROY, answered: this reader stops.
    Destroyed,
}

/// Serves one request of either transport (anything but INIT): the session's own
/// answers (DESTROY, INTERRUPT, the owner check), else the adapter's.
pub fn handle(
    adapter: &FuseAdapter,
    req: &Request<'_>,
    owner: Option<u32>,
    out: &mut ReplyBuf,
) -> Handled {
    let unique = req.header.unique;
    if let Some(n) = REQUESTS.get(req.header.opcode as usize) {
        n.fetch_add(1, Ordering::Relaxed);
    }
    match req.op {
        Op::Destroy => {
            out.start(unique).finish();
            return Handled::Destroyed;
        }
        Op::Interrupt { .. } => {
            INTERRUPTS.fetch_add(1, Ordering::Relaxed);
            out.error(unique, libc::ENOSYS);
            return Handled::Reply;
        }
        Op::Init { .. } => {
            warn!("a second FUSE INIT, after the handshake: answered EIO");
            out.error(unique, libc::EIO);
            return Handled::Reply;
        }
        _ => {}
    }
    if let Some(owner) = owner
        && req.header.uid != owner
        && !sent_without_caller(req.header.opcode)
    {
        out.error(unique, libc::EACCES);
        return Handled::Reply;
    }
    if adapter.dispatch(req, out) {
        Handled::Reply
    } else {
        Handled::NoReply
    }
}

/// Requests the kernel may send with no caller's uid (writeback, readahead, forget,
/// release...): exempt from the owner check, as libfuse and fuser exempt them.
fn sent_without_caller(op: u32) -> bool {
    matches!(
        op,
        opcode::FUSE_READ
            | opcode::FUSE_READDIR
            | opcode::FUSE_READDIRPLUS
            | opcode::FUSE_BATCH_FORGET
            | opcode::FUSE_FORGET
            | opcode::FUSE_WRITE
            | opcode::FUSE_FSYNC
            | opcode::FUSE_FSYNCDIR
            | opcode::FUSE_RELEASE
            | opcode::FUSE_RELEASEDIR
    )
}

/// Reads one request into `buf`. `None`: the connection is gone (ENODEV).
fn read_request(dev: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes.
        let n = unsafe { libc::read(dev.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Interrupted, or the request was interrupted before we got it.
            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
            Some(libc::ENODEV) => return Ok(None),
            _ => return Err(crate::sys::context("reading /dev/fuse failed", e)),
        }
    }
}

/// Writes one reply. False if the kernel refused it: ENOENT (the caller was interrupted
/// or the request aborted) is normal; anything else is logged.
#[allow(
    clippy::disallowed_methods,
    reason = "a reply written to /dev/fuse, not a data write to SRC: the gate has no say"
)]
fn send(dev: BorrowedFd<'_>, reply: &[u8]) -> bool {
    // SAFETY: `reply` is a live buffer of `reply.len()` bytes.
    let n = unsafe { libc::write(dev.as_raw_fd(), reply.as_ptr().cast(), reply.len()) };
    if n >= 0 {
        return true;
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENODEV) => debug!("FUSE reply not taken: {e}"),
        _ => warn!("writing a FUSE reply failed: {e}"),
    }
    false
}
