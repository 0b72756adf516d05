//! FUSE over io_uring (Linux 6.14+): the per-CPU ring queues, with the `io-uring` crate.
//!
//! The kernel's side (fs/fuse/dev_uring.c) in short:
//! - INIT (always over `/dev/fuse`) offers `FUSE_OVER_IO_URING` only while the fuse module's
//!   `enable_uring` parameter is on; a server that answers with the flag set gets
//!   `fc->io_uring`, and from then on **every new request waits** (killably) in
//!   `fuse_get_req` until the ring is ready or registration fails.
//! - The ring has one queue per possible CPU (`nr_cpu_ids`, [`queue_count`]). A queue gets
//!   entries through `FUSE_IO_URING_CMD_REGISTER` uring commands on the `/dev/fuse` fd, in a
//!   ring set up with 128-byte SQEs; each command carries an iovec pair (`sqe->addr`,
//!   `sqe->len` = 2): a [`abi::fuse_uring_req_header`] and a payload buffer of at least
//!   `max(max_write, max_pages * PAGE_SIZE, 8192)` bytes.
//! - The kernel switches the connection to the ring when the last queue gets its first
//!   entry (`is_ring_ready`). A failed REGISTER clears `fc->io_uring` and releases the
//!   waiting requests, which then travel over `/dev/fuse` ([`force_fallback`] does that on
//!   purpose). Once switched, a request goes to the queue of the CPU its caller runs on.
//! - A command completes when a request is in its entry: `fuse_in_header` in `in_out`, the
//!   opcode's fixed argument struct in `op_in`, names and data in the payload,
//!   `ring_ent_in_out.{commit_id,payload_sz}` set. The reply goes back in the same buffers
//!   (`fuse_out_header` in `in_out`, body in the payload, `payload_sz`) with
//!   `FUSE_IO_URING_CMD_COMMIT_AND_FETCH` (`cmd_req.commit_id`, `qid`), which also re-arms
//!   the entry.
//! - FORGET, BATCH_FORGET and INTERRUPT still arrive on `/dev/fuse`; notifications go there.
//! - Teardown: unmount or abort completes every armed command with ENOTCONN/ECANCELED and
//!   ends the requests held by entries in userspace with ECONNABORTED
//!   (`fuse_uring_stop_queues`); the process exiting cancels armed commands
//!   (`IO_URING_F_CANCEL`).
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use zerocopy::IntoBytes;

use super::abi::{self, fuse_uring_cmd_req, fuse_uring_req_header};
use super::decode::{self, Proto, Request};
use super::encode::ReplyBuf;

/// The `enable_uring` parameter of the fuse module: `Some(true)` when on, `None` when the
/// kernel has no such parameter (no FUSE over io_uring: before 6.14, or built without it).
pub fn enable_uring_param() -> Option<bool> {
    let text = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").ok()?;
    Some(matches!(text.trim(), "Y" | "y" | "1"))
}

/// A CPU list as in `/sys/devices/system/cpu/possible` ("0-3,8,10-11").
pub fn parse_cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let mut ends = part.splitn(2, '-').map(|n| n.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpus.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b && b - a < 65536 => cpus.extend(a..=b),
            _ => {}
        }
    }
    cpus
}

/// The number of queues the kernel makes (`num_possible_cpus()`, i.e. `nr_cpu_ids` on
/// machines without holes in the possible map): the highest possible CPU + 1. Every one
/// needs an entry before the kernel uses the ring, online or not.
pub fn queue_count() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(&text)
        .iter()
        .max()
        .map(|n| n + 1)
        .ok_or_else(|| io::Error::other(format!("unreadable possible CPU list {text:?}")))
}

/// The payload buffer size the kernel requires (`ring->max_payload_sz`) for a connection
/// whose INIT reply said `max_write` and `max_pages`.
pub fn payload_size(max_write: u32, max_pages: u16) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    (max_write as usize)
        .max(usize::from(max_pages) * page)
        .max(abi::FUSE_MIN_READ_BUFFER)
}

/// Why a queue stopped or could not start.
#[derive(Debug)]
pub enum UringError {
    /// Setting up the io_uring instance failed (io_uring disabled by
    /// `kernel.io_uring_disabled`, not permitted, out of memory...).
    Setup(io::Error),
    /// `io_uring_enter` failed.
    Submit(io::Error),
    /// The kernel refused a REGISTER (the connection then stays on `/dev/fuse`).
    Register { qid: u16, errno: i32 },
    /// The kernel failed a COMMIT_AND_FETCH for a reason other than the end of the session.
    Commit { qid: u16, errno: i32 },
    /// The submission queue had no room (a bug: each entry has at most one command queued).
    SqFull,
}

impl fmt::Display for UringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UringError::Setup(e) => write!(f, "setting up an io_uring failed: {e}"),
            UringError::Submit(e) => write!(f, "io_uring_enter failed: {e}"),
            UringError::Register { qid, errno } => write!(
                f,
                "the kernel refused to register queue {qid}: {}",
                io::Error::from_raw_os_error(*errno)
            ),
            UringError::Commit { qid, errno } => write!(
                f,
                "the kernel failed a commit on queue {qid}: {}",
                io::Error::from_raw_os_error(*errno)
            ),
            UringError::SqFull => f.write_str("the submission queue is full"),
        }
    }
}

impl std::error::Error for UringError {}

/// Whether a command result means the session is over (unmount, abort, daemon exit).
fn session_ended(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECANCELED | libc::ENODEV | libc::ECONNABORTED
    )
}

/// One ring entry's buffers. Boxed, so their addresses stay put while the kernel holds
/// them (from REGISTER until the queue's ring is closed).
struct RingEntry {
    header: Box<fuse_uring_req_header>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
    /// A command of this entry is queued in the kernel (REGISTER or COMMIT_AND_FETCH).
    armed: bool,
}

// SAFETY: the raw pointers in `iov` point into the entry's own boxes; a RingEntry moves
// between threads only as a whole, with its Queue.
unsafe impl Send for RingEntry {}

impl RingEntry {
    fn new(payload_size: usize) -> RingEntry {
        let mut header = Box::new(fuse_uring_req_header::default());
        let mut payload = vec![0u8; payload_size].into_boxed_slice();
        let iov = Box::new([
            libc::iovec {
                iov_base: (&raw mut *header).cast(),
                iov_len: size_of::<fuse_uring_req_header>(),
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        RingEntry {
            header,
            payload,
            iov,
            armed: false,
        }
    }
}

/// A REGISTER or COMMIT_AND_FETCH command for `/dev/fuse` fd `dev`, tagged with the entry
/// index.
fn fuse_cmd(
    dev: i32,
    cmd_op: u32,
    req: &fuse_uring_cmd_req,
    iov: Option<u64>,
    tag: u64,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[..size_of::<fuse_uring_cmd_req>()].copy_from_slice(req.as_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(dev), cmd_op)
        .cmd(cmd)
        .addr(iov)
        .build()
        .user_data(tag);
    match iov {
        Some(_) => with_sqe_len(sqe, abi::FUSE_URING_IOV_SEGS),
        None => sqe,
    }
}

/// Sets `sqe->len`, which REGISTER needs (the iovec count) and io-uring 0.7's `UringCmd80`
/// builder has no setter for.
fn with_sqe_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    /// `offsetof(struct io_uring_sqe, len)`.
    const LEN_OFFSET: usize = 24;
    const _: () = assert!(size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is `#[repr(C)] (Entry, [u8; 64])` and Entry is `#[repr(C)]` over the
    // kernel's `io_uring_sqe` (64 bytes, `len: u32` at offset 24), so the 128 bytes are
    // exactly the SQE; every bit pattern of them is a valid Entry128 (plain integers and
    // byte arrays).
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(sqe);
        bytes[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}

/// One CPU's queue: its io_uring instance and ring entries. Served by one thread.
pub struct Queue {
    // Field order matters: the ring drops (and the kernel lets go of the buffers) before
    // the entries are freed.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<RingEntry>,
    dev: OwnedFd,
    qid: u16,
    /// Entries whose command completed with a request, not yet handed out by `wait_request`.
    ready: std::collections::VecDeque<usize>,
}

/// What [`Queue::wait_request`] found.
pub enum Next {
    /// A request is in entry `usize`.
    Request(usize),
    /// The session is over (unmount, abort): stop serving.
    Ended,
}

impl Queue {
    /// Sets up queue `qid` with `depth` entries of `payload_size` bytes, on a duplicate of
    /// `dev` (the session's `/dev/fuse`). Registers nothing yet: call this before the INIT
    /// reply, so a machine where io_uring cannot be set up never announces
    /// `FUSE_OVER_IO_URING` (after which requests would wait for a ring that never comes).
    pub fn new(
        dev: BorrowedFd<'_>,
        qid: u16,
        depth: usize,
        payload_size: usize,
    ) -> Result<Queue, UringError> {
        let dev = dev.try_clone_to_owned().map_err(UringError::Setup)?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            // Enabled by the serving thread in `register`, which so becomes the ring's
            // single issuer (it is created here, on the thread that answers INIT).
            .setup_r_disabled()
            .build((depth as u32).next_power_of_two().max(2))
            .map_err(UringError::Setup)?;
        let entries = (0..depth.max(1))
            .map(|_| RingEntry::new(payload_size))
            .collect();
        Ok(Queue {
            ring,
            entries,
            dev,
            qid,
            ready: std::collections::VecDeque::new(),
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    fn cmd_req(&self, commit_id: u64) -> fuse_uring_cmd_req {
        fuse_uring_cmd_req {
            flags: 0,
            commit_id,
            qid: self.qid,
            padding: [0; 6],
        }
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> Result<(), UringError> {
        // SAFETY: the command's buffers (the entry's boxes and its iovec array) live as long
        // as this Queue, and the ring is dropped before them (field order).
        unsafe { self.ring.submission().push(sqe) }.map_err(|_| UringError::SqFull)
    }

    /// Registers every entry (on the thread that serves the queue: the ring is
    /// single-issuer). The kernel completes a REGISTER only when a request arrives, so a
    /// refusal shows as an error completion right away, which this reports; once every
    /// queue has returned Ok, the kernel has switched the connection to the ring.
    pub fn register(&mut self) -> Result<(), UringError> {
        self.ring
            .submitter()
            .register_enable_rings()
            .map_err(UringError::Setup)?;
        let dev = self.dev.as_raw_fd();
        for i in 0..self.entries.len() {
            let iov = self.entries[i].iov.as_ptr() as u64;
            let sqe = fuse_cmd(
                dev,
                abi::FUSE_IO_URING_CMD_REGISTER,
                &self.cmd_req(0),
                Some(iov),
                i as u64,
            );
            self.push(&sqe)?;
            self.entries[i].armed = true;
        }
        self.ring.submit().map_err(UringError::Submit)?;
        self.reap(true)
    }

    /// Moves completions to `ready`; an error completion is returned as an error (a
    /// REGISTER's while `registering`, else a COMMIT_AND_FETCH's), except the end of the
    /// session, after which `ready` is left empty and [`Queue::wait_request`] says so.
    fn reap(&mut self, registering: bool) -> Result<(), UringError> {
        let mut failed = None;
        for cqe in self.ring.completion() {
            let idx = cqe.user_data() as usize;
            if let Some(e) = self.entries.get_mut(idx) {
                e.armed = false;
            }
            let res = cqe.result();
            if res >= 0 {
                self.ready.push_back(idx);
            } else if failed.is_none() {
                failed = Some(-res);
            }
        }
        match failed {
            None => Ok(()),
            Some(errno) if session_ended(errno) => Ok(()),
            Some(errno) if registering => Err(UringError::Register {
                qid: self.qid,
                errno,
            }),
            Some(errno) => Err(UringError::Commit {
                qid: self.qid,
                errno,
            }),
        }
    }

    /// Waits for the next request; [`Next::Ended`] once no entry is armed any more (every
    /// command completed with the end of the session).
    pub fn wait_request(&mut self) -> Result<Next, UringError> {
        loop {
            if let Some(idx) = self.ready.pop_front() {
                return Ok(Next::Request(idx));
            }
            if !self.entries.iter().any(|e| e.armed) {
                return Ok(Next::Ended);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(UringError::Submit(e)),
            }
            self.reap(false)?;
        }
    }

    /// Decodes the request in entry `idx`.
    pub fn request(&self, idx: usize, proto: &Proto) -> Result<Request<'_>, decode::Error> {
        let Some(e) = self.entries.get(idx) else {
            return Err(decode::Error {
                header: None,
                kind: decode::DecodeError::ShortHeader { have: 0 },
            });
        };
        let n = (e.header.ring_ent_in_out.payload_sz as usize).min(e.payload.len());
        decode::decode_split(&e.header.in_out, &e.header.op_in, &e.payload[..n], proto)
    }

    /// Entry `idx` as the kernel filled it: the whole `fuse_uring_req_header`, and the
    /// payload's first `payload_sz` bytes (for recording requests).
    pub fn raw(&self, idx: usize) -> (&[u8], &[u8]) {
        match self.entries.get(idx) {
            Some(e) => {
                let n = (e.header.ring_ent_in_out.payload_sz as usize).min(e.payload.len());
                (e.header.as_bytes(), &e.payload[..n])
            }
            None => (&[], &[]),
        }
    }

    /// The commit id of the request in entry `idx` (what COMMIT_AND_FETCH names).
    pub fn commit_id(&self, idx: usize) -> u64 {
        self.entries
            .get(idx)
            .map_or(0, |e| e.header.ring_ent_in_out.commit_id)
    }

    /// Puts `reply` into entry `idx` and queues its COMMIT_AND_FETCH (which also re-arms
    /// the entry). A body larger than the payload buffer is replaced by an EIO reply.
    /// Submitted at the next [`Queue::wait_request`], or now with [`Queue::submit`].
    pub fn commit(
        &mut self,
        idx: usize,
        unique: u64,
        reply: &mut ReplyBuf,
    ) -> Result<(), UringError> {
        let dev = self.dev.as_raw_fd();
        let Some(e) = self.entries.get_mut(idx) else {
            return Ok(());
        };
        if reply.body_len() > e.payload.len() {
            reply.error(unique, libc::EIO);
        }
        let header = reply.header();
        e.header.in_out[..header.len()].copy_from_slice(header);
        let body = reply.body();
        e.payload[..body.len()].copy_from_slice(body);
        e.header.ring_ent_in_out.payload_sz = body.len() as u32;
        let commit_id = e.header.ring_ent_in_out.commit_id;
        e.armed = true;
        let sqe = fuse_cmd(
            dev,
            abi::FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
            &self.cmd_req(commit_id),
            None,
            idx as u64,
        );
        self.push(&sqe)
    }

    /// Submits queued commits without waiting.
    pub fn submit(&mut self) -> Result<(), UringError> {
        self.ring.submit().map(|_| ()).map_err(UringError::Submit)
    }

    /// Submits queued commits as a SCHED_IDLE thread, so that the caller woken by the commit
    /// (which slept on this CPU, whose queue this is) preempts us here rather than being
    /// moved to another CPU, whose queue its next request would then use. Only when
    /// `may_hand_over()` said this thread can return to SCHED_OTHER.
    pub fn submit_handing_over(&mut self) -> Result<(), UringError> {
        set_policy(libc::SCHED_IDLE);
        let r = self.submit();
        set_policy(libc::SCHED_OTHER);
        r
    }
}

fn set_policy(policy: i32) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a valid sched_param; pid 0 is this thread.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Whether this thread may drop to SCHED_IDLE around a commit and come back: the kernel lets
/// a thread leave SCHED_IDLE with CAP_SYS_NICE or an RLIMIT_NICE that allows its nice value.
/// Tried both ways now, so a thread never gets stuck at idle priority later.
pub fn may_hand_over() -> bool {
    set_policy(libc::SCHED_IDLE) && set_policy(libc::SCHED_OTHER)
}

/// Pins the calling thread to `cpu` (a queue's thread runs where its callers run).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it for
    // cpu < CPU_SETSIZE (checked above); sched_setaffinity reads size_of bytes of it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes the kernel give up on the ring for this connection and release the requests
/// waiting for it to `/dev/fuse`: a REGISTER the kernel must refuse (an iovec count of 0,
/// EINVAL) clears `fc->io_uring` (dev_uring.c, `fuse_uring_cmd`). For a server that
/// announced `FUSE_OVER_IO_URING` but cannot bring every queue up. Never after every queue
/// registered: the connection would then be on the ring with `fc->io_uring` cleared, and
/// switching `enable_uring` off would fail its commits.
pub fn force_fallback(dev: BorrowedFd<'_>) -> Result<(), UringError> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
        .build(2)
        .map_err(UringError::Setup)?;
    let req = fuse_uring_cmd_req::default();
    let sqe = fuse_cmd(
        dev.as_raw_fd(),
        abi::FUSE_IO_URING_CMD_REGISTER,
        &req,
        None,
        0,
    );
    // SAFETY: the command carries no buffer (addr 0, len 0).
    unsafe { ring.submission().push(&sqe) }.map_err(|_| UringError::SqFull)?;
    ring.submit_and_wait(1).map_err(UringError::Submit)?;
    match ring.completion().next().map(|c| c.result()) {
        Some(res) if res < 0 => Ok(()),
        res => Err(UringError::Register {
            qid: 0,
            errno: res.map_or(libc::EIO, |r| -r.min(-1)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), vec![0, 1]);
        assert_eq!(parse_cpu_list("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("0"), vec![0]);
        assert!(parse_cpu_list("").is_empty());
        assert!(parse_cpu_list("3-1,x,-,1-").is_empty());
        // A huge range is refused rather than allocated.
        assert!(parse_cpu_list("0-99999999999").is_empty());
    }

    #[test]
    fn payload_size_is_the_kernels() {
        assert_eq!(payload_size(0, 0), abi::FUSE_MIN_READ_BUFFER);
        assert_eq!(payload_size(1 << 20, 0), 1 << 20);
        assert!(payload_size(4096, 256) >= 256 * 4096);
    }

    #[test]
    fn register_sqe_carries_iovec_count_and_command() {
        let req = fuse_uring_cmd_req {
            flags: 0,
            commit_id: 0x1122,
            qid: 3,
            padding: [0; 6],
        };
        let sqe = fuse_cmd(
            7,
            abi::FUSE_IO_URING_CMD_REGISTER,
            &req,
            Some(0xdead_b000),
            5,
        );
        // SAFETY: Entry128 is 128 plain bytes (see with_sqe_len).
        let bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(bytes[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(i32::from_ne_bytes(bytes[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u32::from_ne_bytes(bytes[8..12].try_into().unwrap()),
            1,
            "cmd_op"
        );
        assert_eq!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            0xdead_b000,
            "addr"
        );
        assert_eq!(
            u32::from_ne_bytes(bytes[24..28].try_into().unwrap()),
            2,
            "len"
        );
        assert_eq!(
            u64::from_ne_bytes(bytes[32..40].try_into().unwrap()),
            5,
            "user_data"
        );
        // sqe->cmd starts at byte 48: fuse_uring_cmd_req.
        assert_eq!(
            u64::from_ne_bytes(bytes[56..64].try_into().unwrap()),
            0x1122
        );
        assert_eq!(u16::from_ne_bytes(bytes[64..66].try_into().unwrap()), 3);
    }
}
