//! The FUSE request decoder: bytes from the kernel → a typed [`Request`].
//!
//! One decoder for both transports. A request read from `/dev/fuse` is one contiguous
//! buffer (`fuse_in_header`, the opcode's fixed argument struct, then names and data):
//! [`decode`]. A request taken from an io_uring ring entry arrives in three pieces (the
//! header in `in_out`, the fixed struct in `op_in`, the rest in the payload buffer):
//! [`decode_split`]. Both end in the same per-opcode parser, which reads through [`Args`].
//!
//! The input is trusted to come from the kernel, but a decoder bug would take every caller
//! of the mount down with the daemon, so nothing here panics on any input: every read is
//! bounds-checked, names must be NUL-terminated, non-empty and (for directory entries)
//! free of `/`, lengths must agree with the header, and every failure is a [`DecodeError`].
//! Unknown or unserved opcodes are not errors: they decode to [`Op::Unsupported`], which
//! the caller answers with ENOSYS as fuser does. `fuzz/fuzz_targets/fuse_decode.rs` feeds
//! it arbitrary bytes.
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime};

use fuser::TimeOrNow;
use zerocopy::{FromBytes, Immutable, KnownLayout};

use super::abi::{self, opcode as op};

/// What INIT negotiated that changes how later requests are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proto {
    /// The protocol minor version in effect (the smaller of the kernel's and ours).
    pub minor: u32,
    /// `FUSE_SETXATTR_EXT` was negotiated: SETXATTR carries the 16-byte `fuse_setxattr_in`.
    pub setxattr_ext: bool,
}

impl Default for Proto {
    /// What the decoder assumes before INIT (INIT itself has one layout in every version).
    fn default() -> Self {
        Proto {
            minor: abi::FUSE_KERNEL_MINOR_VERSION,
            setxattr_ext: false,
        }
    }
}

/// The part of `fuse_in_header` a handler uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Total length of the request in bytes, header included.
    pub len: u32,
    pub opcode: u32,
    /// The request's id; the reply carries it back.
    pub unique: u64,
    /// The inode the request is about (0 for INIT and the like).
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Header {
    /// Whether the kernel expects no reply (FORGET, BATCH_FORGET). An INTERRUPT gets one only
    /// to ask the kernel to resend it (EAGAIN), which this crate never does.
    pub fn expects_reply(&self) -> bool {
        !matches!(
            self.opcode,
            op::FUSE_FORGET | op::FUSE_BATCH_FORGET | op::FUSE_INTERRUPT
        )
    }
}

/// One decoded request.
#[derive(Debug, PartialEq)]
pub struct Request<'a> {
    pub header: Header,
    pub op: Op<'a>,
}

/// The attributes a SETATTR changes (`None`: left alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetattrIn {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub ctime: Option<SystemTime>,
    pub fh: Option<u64>,
    pub lock_owner: Option<u64>,
    /// `FATTR_KILL_SUIDGID` (with `FUSE_HANDLE_KILLPRIV_V2`): clear set-id bits.
    pub kill_suidgid: bool,
}

/// The `fuse_forget_one` records of a BATCH_FORGET, read lazily (bounds checked at decode).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Forgets<'a> {
    bytes: &'a [u8],
}

impl fmt::Debug for Forgets<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(*self).finish()
    }
}

impl<'a> Forgets<'a> {
    pub fn len(&self) -> usize {
        self.bytes.len() / size_of::<abi::fuse_forget_one>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> IntoIterator for Forgets<'a> {
    type Item = (u64, u64);
    type IntoIter = ForgetIter<'a>;

    fn into_iter(self) -> ForgetIter<'a> {
        ForgetIter { rest: self.bytes }
    }
}

/// Yields `(nodeid, nlookup)` pairs.
pub struct ForgetIter<'a> {
    rest: &'a [u8],
}

impl Iterator for ForgetIter<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        let (one, rest) = abi::fuse_forget_one::read_from_prefix(self.rest).ok()?;
        self.rest = rest;
        Some((one.nodeid, one.nlookup))
    }
}

/// A request's operation and arguments. Names borrow from the request buffer.
#[derive(Debug, PartialEq)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        /// `flags | flags2 << 32` (flags2 only with `FUSE_INIT_EXT`).
        flags: u64,
    },
    Destroy,
    Interrupt {
        unique: u64,
    },
    Forget {
        nlookup: u64,
    },
    BatchForget(Forgets<'a>),
    Lookup {
        name: &'a OsStr,
    },
    Getattr {
        fh: Option<u64>,
    },
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a OsStr,
    },
    Mknod {
        name: &'a OsStr,
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Mkdir {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        name: &'a OsStr,
        newdir: u64,
        newname: &'a OsStr,
        flags: u32,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open {
        flags: i32,
    },
    Read {
        fh: u64,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Write {
        fh: u64,
        offset: u64,
        data: &'a [u8],
        write_flags: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Statfs,
    Release {
        fh: u64,
        flags: i32,
        flush: bool,
        lock_owner: Option<u64>,
    },
    Fsync {
        fh: u64,
        datasync: bool,
    },
    Setxattr {
        name: &'a OsStr,
        value: &'a [u8],
        flags: i32,
    },
    Getxattr {
        name: &'a OsStr,
        size: u32,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush {
        fh: u64,
        lock_owner: u64,
    },
    Opendir {
        flags: i32,
    },
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Releasedir {
        fh: u64,
        flags: i32,
    },
    Fsyncdir {
        fh: u64,
        datasync: bool,
    },
    Access {
        mask: i32,
    },
    Create {
        name: &'a OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    },
    Ioctl {
        fh: u64,
        flags: u32,
        cmd: u32,
        arg: u64,
        in_data: &'a [u8],
        out_size: u32,
    },
    Fallocate {
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Readdirplus {
        fh: u64,
        offset: u64,
        size: u32,
    },
    Lseek {
        fh: u64,
        offset: i64,
        whence: i32,
    },
    CopyFileRange {
        fh_in: u64,
        off_in: u64,
        nodeid_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u64,
    },
    /// An opcode the adapter does not serve (locks, BMAP, POLL, STATX, ... or one newer
    /// than this code): answered ENOSYS, after which the kernel mostly stops sending it.
    Unsupported,
}

/// Why a request could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than a `fuse_in_header`.
    ShortHeader { have: usize },
    /// `fuse_in_header.len` disagrees with the bytes received.
    LengthMismatch { header_len: u32, have: usize },
    /// The fixed argument struct of the opcode is cut short.
    ShortArgument { need: usize, have: usize },
    /// A name or string has no terminating NUL within the request.
    MissingNul,
    /// A name is empty.
    EmptyName,
    /// A directory entry name contains `/`.
    NameWithSlash,
    /// The data (WRITE, SETXATTR, IOCTL) is shorter than its size field says.
    ShortData { need: u64, have: usize },
    /// `total_extlen` is longer than what follows the fixed arguments.
    ExtensionsTooLong { extlen: usize, have: usize },
    /// A BATCH_FORGET's count is larger than its records.
    ForgetCount { count: u32, have: usize },
    /// A time field is beyond what `SystemTime` holds.
    TimeOutOfRange,
    /// A ring entry's fixed argument would not fit `op_in`.
    OpInTooLong { len: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::ShortHeader { have } => {
                write!(f, "{have} bytes, shorter than a fuse_in_header")
            }
            DecodeError::LengthMismatch { header_len, have } => {
                write!(f, "the header says {header_len} bytes, {have} arrived")
            }
            DecodeError::ShortArgument { need, have } => {
                write!(f, "argument struct of {need} bytes cut to {have}")
            }
            DecodeError::MissingNul => f.write_str("a name without its terminating NUL"),
            DecodeError::EmptyName => f.write_str("an empty name"),
            DecodeError::NameWithSlash => f.write_str("a name containing '/'"),
            DecodeError::ShortData { need, have } => {
                write!(f, "data of {need} bytes cut to {have}")
            }
            DecodeError::ExtensionsTooLong { extlen, have } => {
                write!(
                    f,
                    "{extlen} bytes of extensions in {have} bytes of arguments"
                )
            }
            DecodeError::ForgetCount { count, have } => {
                write!(f, "BATCH_FORGET of {count} in {have} bytes")
            }
            DecodeError::TimeOutOfRange => f.write_str("a time out of range"),
            DecodeError::OpInTooLong { len } => {
                write!(f, "fixed argument of {len} bytes, more than op_in holds")
            }
        }
    }
}

/// A request that could not be decoded, with its header when that much was readable (so
/// the transport can still answer it, with EIO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error {
    pub header: Option<Header>,
    pub kind: DecodeError,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.header {
            Some(h) => write!(
                f,
                "undecodable FUSE request (opcode {}, unique {}): {}",
                h.opcode, h.unique, self.kind
            ),
            None => write!(f, "undecodable FUSE request: {}", self.kind),
        }
    }
}

impl std::error::Error for Error {}

type Result<T> = std::result::Result<T, DecodeError>;

const IN_HEADER: usize = size_of::<abi::fuse_in_header>();

/// Reads the `fuse_in_header` at the start of `bytes`.
pub fn decode_header(bytes: &[u8]) -> std::result::Result<Header, DecodeError> {
    let (h, _) = abi::fuse_in_header::read_from_prefix(bytes)
        .map_err(|_| DecodeError::ShortHeader { have: bytes.len() })?;
    Ok(Header {
        len: h.len,
        opcode: h.opcode,
        unique: h.unique,
        nodeid: h.nodeid,
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    })
}

fn extlen_of(bytes: &[u8]) -> usize {
    abi::fuse_in_header::read_from_prefix(bytes)
        .map(|(h, _)| usize::from(h.total_extlen) * 8)
        .unwrap_or(0)
}

/// Decodes one request as read from `/dev/fuse` (`buf` is exactly what one read returned).
pub fn decode<'a>(buf: &'a [u8], proto: &Proto) -> std::result::Result<Request<'a>, Error> {
    let header = decode_header(buf).map_err(|kind| Error { header: None, kind })?;
    let fail = |kind| Error {
        header: Some(header),
        kind,
    };
    if header.len as usize != buf.len() {
        return Err(fail(DecodeError::LengthMismatch {
            header_len: header.len,
            have: buf.len(),
        }));
    }
    let body = &buf[IN_HEADER..];
    let body = strip_extensions(body, extlen_of(buf)).map_err(fail)?;
    let args = Args {
        fixed: None,
        rest: body,
    };
    let op = parse(header.opcode, args, proto).map_err(fail)?;
    Ok(Request { header, op })
}

/// Decodes one request taken from an io_uring ring entry: `in_out` and `op_in` are the
/// fields of the entry's `fuse_uring_req_header`, `payload` the first
/// `ring_ent_in_out.payload_sz` bytes of its payload buffer (the caller bounds that by the
/// buffer's size).
pub fn decode_split<'a>(
    in_out: &'a [u8],
    op_in: &'a [u8],
    payload: &'a [u8],
    proto: &Proto,
) -> std::result::Result<Request<'a>, Error> {
    let header = decode_header(in_out).map_err(|kind| Error { header: None, kind })?;
    let fail = |kind| Error {
        header: Some(header),
        kind,
    };
    // header.len counts the header, the fixed struct (in op_in) and the payload.
    let fixed_len = (header.len as usize)
        .checked_sub(IN_HEADER + payload.len())
        .ok_or(fail(DecodeError::LengthMismatch {
            header_len: header.len,
            have: IN_HEADER + payload.len(),
        }))?;
    let fixed = op_in
        .get(..fixed_len)
        .ok_or(fail(DecodeError::OpInTooLong { len: fixed_len }))?;
    let rest = strip_extensions(payload, extlen_of(in_out)).map_err(fail)?;
    let args = Args {
        fixed: Some(fixed),
        rest,
    };
    let op = parse(header.opcode, args, proto).map_err(fail)?;
    Ok(Request { header, op })
}

/// Request extensions (`total_extlen`, e.g. security contexts) follow all arguments. None
/// is negotiated by this crate; they are cut off, not interpreted.
fn strip_extensions(body: &[u8], extlen: usize) -> Result<&[u8]> {
    body.len()
        .checked_sub(extlen)
        .map(|n| &body[..n])
        .ok_or(DecodeError::ExtensionsTooLong {
            extlen,
            have: body.len(),
        })
}

/// A request's arguments. From /dev/fuse everything is in `rest`, the fixed struct first;
/// from a ring entry the fixed struct is alone in `fixed` (the `op_in` area) and the rest
/// in the payload.
struct Args<'a> {
    fixed: Option<&'a [u8]>,
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    /// The opcode's fixed argument struct.
    fn fixed<T: FromBytes + KnownLayout + Immutable>(&mut self) -> Result<T> {
        let need = size_of::<T>();
        match self.fixed.take() {
            // A ring entry: op_in holds this struct alone; a longer one (a newer kernel's
            // larger struct) is read by its known prefix.
            Some(fixed) => {
                T::read_from_prefix(fixed)
                    .map(|(t, _)| t)
                    .map_err(|_| DecodeError::ShortArgument {
                        need,
                        have: fixed.len(),
                    })
            }
            None => {
                let (t, rest) =
                    T::read_from_prefix(self.rest).map_err(|_| DecodeError::ShortArgument {
                        need,
                        have: self.rest.len(),
                    })?;
                self.rest = rest;
                Ok(t)
            }
        }
    }

    /// A NUL-terminated string, non-empty.
    fn string(&mut self) -> Result<&'a OsStr> {
        let nul = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::MissingNul)?;
        let (s, rest) = self.rest.split_at(nul);
        self.rest = &rest[1..];
        if s.is_empty() {
            return Err(DecodeError::EmptyName);
        }
        Ok(OsStr::from_bytes(s))
    }

    /// A directory entry name: a string without `/`.
    fn name(&mut self) -> Result<&'a OsStr> {
        let s = self.string()?;
        if s.as_bytes().contains(&b'/') {
            return Err(DecodeError::NameWithSlash);
        }
        Ok(s)
    }

    /// Exactly `n` bytes of data.
    fn bytes(&mut self, n: u32) -> Result<&'a [u8]> {
        let need = n as usize;
        if self.rest.len() < need {
            return Err(DecodeError::ShortData {
                need: u64::from(n),
                have: self.rest.len(),
            });
        }
        let (data, rest) = self.rest.split_at(need);
        self.rest = rest;
        Ok(data)
    }
}

/// A kernel time (seconds since the epoch as the bits of an i64, and nanoseconds).
fn system_time(secs: u64, nsecs: u32) -> Result<SystemTime> {
    let nanos = Duration::from_nanos(u64::from(nsecs.min(999_999_999)));
    let secs = secs as i64;
    let base = if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs as u64))
    } else {
        SystemTime::UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    };
    base.and_then(|t| t.checked_add(nanos))
        .ok_or(DecodeError::TimeOutOfRange)
}

fn when(set: bool, now: bool, secs: u64, nsecs: u32) -> Result<Option<TimeOrNow>> {
    Ok(match (set, now) {
        (false, _) => None,
        (true, true) => Some(TimeOrNow::Now),
        (true, false) => Some(TimeOrNow::SpecificTime(system_time(secs, nsecs)?)),
    })
}

fn setattr(a: &abi::fuse_setattr_in) -> Result<SetattrIn> {
    use abi::fattr::*;
    let has = |bit: u32| a.valid & bit != 0;
    Ok(SetattrIn {
        mode: has(MODE).then_some(a.mode),
        uid: has(UID).then_some(a.uid),
        gid: has(GID).then_some(a.gid),
        size: has(SIZE).then_some(a.size),
        atime: when(has(ATIME), has(ATIME_NOW), a.atime, a.atimensec)?,
        mtime: when(has(MTIME), has(MTIME_NOW), a.mtime, a.mtimensec)?,
        ctime: if has(CTIME) {
            Some(system_time(a.ctime, a.ctimensec)?)
        } else {
            None
        },
        fh: has(FH).then_some(a.fh),
        lock_owner: has(LOCKOWNER).then_some(a.lock_owner),
        kill_suidgid: has(KILL_SUIDGID),
    })
}

fn parse<'a>(opcode: u32, mut a: Args<'a>, proto: &Proto) -> Result<Op<'a>> {
    Ok(match opcode {
        op::FUSE_INIT => {
            // Kernels before 7.36 send 16 bytes; newer ones 64 with flags2.
            let c: abi::fuse_init_in_compat = a.fixed()?;
            let mut flags = u64::from(c.flags);
            if flags & abi::FUSE_INIT_EXT != 0 {
                let flags2 = a
                    .rest
                    .get(..4)
                    .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                flags |= u64::from(flags2) << 32;
            }
            Op::Init {
                major: c.major,
                minor: c.minor,
                max_readahead: c.max_readahead,
                flags,
            }
        }
        op::FUSE_DESTROY => Op::Destroy,
        op::FUSE_INTERRUPT => {
            let i: abi::fuse_interrupt_in = a.fixed()?;
            Op::Interrupt { unique: i.unique }
        }
        op::FUSE_FORGET => {
            let f: abi::fuse_forget_in = a.fixed()?;
            Op::Forget { nlookup: f.nlookup }
        }
        op::FUSE_BATCH_FORGET => {
            let b: abi::fuse_batch_forget_in = a.fixed()?;
            let need = (b.count as usize).checked_mul(size_of::<abi::fuse_forget_one>());
            match need.and_then(|n| a.rest.get(..n)) {
                Some(bytes) => Op::BatchForget(Forgets { bytes }),
                None => {
                    return Err(DecodeError::ForgetCount {
                        count: b.count,
                        have: a.rest.len(),
                    });
                }
            }
        }
        op::FUSE_LOOKUP => {
            // From a ring entry LOOKUP's op_in is empty (the kernel's zero-size arg 0).
            a.fixed = None;
            Op::Lookup { name: a.name()? }
        }
        op::FUSE_GETATTR => {
            let g: abi::fuse_getattr_in = a.fixed()?;
            Op::Getattr {
                fh: (g.getattr_flags & abi::FUSE_GETATTR_FH != 0).then_some(g.fh),
            }
        }
        op::FUSE_SETATTR => Op::Setattr(setattr(&a.fixed()?)?),
        op::FUSE_READLINK => Op::Readlink,
        op::FUSE_SYMLINK => {
            a.fixed = None;
            let name = a.name()?;
            let target = a.string()?;
            Op::Symlink { name, target }
        }
        op::FUSE_MKNOD => {
            let m: abi::fuse_mknod_in = a.fixed()?;
            Op::Mknod {
                name: a.name()?,
                mode: m.mode,
                rdev: m.rdev,
                umask: m.umask,
            }
        }
        op::FUSE_MKDIR => {
            let m: abi::fuse_mkdir_in = a.fixed()?;
            Op::Mkdir {
                name: a.name()?,
                mode: m.mode,
                umask: m.umask,
            }
        }
        op::FUSE_UNLINK => {
            a.fixed = None;
            Op::Unlink { name: a.name()? }
        }
        op::FUSE_RMDIR => {
            a.fixed = None;
            Op::Rmdir { name: a.name()? }
        }
        op::FUSE_RENAME => {
            let r: abi::fuse_rename_in = a.fixed()?;
            Op::Rename {
                name: a.name()?,
                newdir: r.newdir,
                newname: a.name()?,
                flags: 0,
            }
        }
        op::FUSE_RENAME2 => {
            let r: abi::fuse_rename2_in = a.fixed()?;
            Op::Rename {
                name: a.name()?,
                newdir: r.newdir,
                newname: a.name()?,
                flags: r.flags,
            }
        }
        op::FUSE_LINK => {
            let l: abi::fuse_link_in = a.fixed()?;
            Op::Link {
                oldnodeid: l.oldnodeid,
                newname: a.name()?,
            }
        }
        op::FUSE_OPEN => {
            let o: abi::fuse_open_in = a.fixed()?;
            Op::Open {
                flags: o.flags as i32,
            }
        }
        op::FUSE_OPENDIR => {
            let o: abi::fuse_open_in = a.fixed()?;
            Op::Opendir {
                flags: o.flags as i32,
            }
        }
        op::FUSE_READ | op::FUSE_READDIR | op::FUSE_READDIRPLUS => {
            let r: abi::fuse_read_in = a.fixed()?;
            match opcode {
                op::FUSE_READ => Op::Read {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                    flags: r.flags as i32,
                    lock_owner: (r.read_flags & abi::FUSE_READ_LOCKOWNER != 0)
                        .then_some(r.lock_owner),
                },
                op::FUSE_READDIR => Op::Readdir {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                },
                _ => Op::Readdirplus {
                    fh: r.fh,
                    offset: r.offset,
                    size: r.size,
                },
            }
        }
        op::FUSE_WRITE => {
            let w: abi::fuse_write_in = a.fixed()?;
            Op::Write {
                fh: w.fh,
                offset: w.offset,
                data: a.bytes(w.size)?,
                write_flags: w.write_flags,
                flags: w.flags as i32,
                lock_owner: (w.write_flags & abi::FUSE_WRITE_LOCKOWNER != 0)
                    .then_some(w.lock_owner),
            }
        }
        op::FUSE_STATFS => Op::Statfs,
        op::FUSE_RELEASE => {
            let r: abi::fuse_release_in = a.fixed()?;
            Op::Release {
                fh: r.fh,
                flags: r.flags as i32,
                flush: r.release_flags & abi::FUSE_RELEASE_FLUSH != 0,
                lock_owner: (r.release_flags
                    & (abi::FUSE_RELEASE_FLUSH | abi::FUSE_RELEASE_FLOCK_UNLOCK)
                    != 0)
                    .then_some(r.lock_owner),
            }
        }
        op::FUSE_RELEASEDIR => {
            let r: abi::fuse_release_in = a.fixed()?;
            Op::Releasedir {
                fh: r.fh,
                flags: r.flags as i32,
            }
        }
        op::FUSE_FSYNC | op::FUSE_FSYNCDIR => {
            let f: abi::fuse_fsync_in = a.fixed()?;
            let datasync = f.fsync_flags & abi::FUSE_FSYNC_FDATASYNC != 0;
            if opcode == op::FUSE_FSYNC {
                Op::Fsync { fh: f.fh, datasync }
            } else {
                Op::Fsyncdir { fh: f.fh, datasync }
            }
        }
        op::FUSE_SETXATTR => {
            let (size, flags) = if proto.setxattr_ext {
                let s: abi::fuse_setxattr_in = a.fixed()?;
                (s.size, s.flags)
            } else {
                let s: abi::fuse_setxattr_in_compat = a.fixed()?;
                (s.size, s.flags)
            };
            let name = a.string()?;
            Op::Setxattr {
                name,
                value: a.bytes(size)?,
                flags: flags as i32,
            }
        }
        op::FUSE_GETXATTR => {
            let g: abi::fuse_getxattr_in = a.fixed()?;
            Op::Getxattr {
                name: a.string()?,
                size: g.size,
            }
        }
        op::FUSE_LISTXATTR => {
            let g: abi::fuse_getxattr_in = a.fixed()?;
            Op::Listxattr { size: g.size }
        }
        op::FUSE_REMOVEXATTR => {
            a.fixed = None;
            Op::Removexattr { name: a.string()? }
        }
        op::FUSE_FLUSH => {
            let f: abi::fuse_flush_in = a.fixed()?;
            Op::Flush {
                fh: f.fh,
                lock_owner: f.lock_owner,
            }
        }
        op::FUSE_ACCESS => {
            let x: abi::fuse_access_in = a.fixed()?;
            Op::Access {
                mask: x.mask as i32,
            }
        }
        op::FUSE_CREATE => {
            let c: abi::fuse_create_in = a.fixed()?;
            Op::Create {
                name: a.name()?,
                mode: c.mode,
                umask: c.umask,
                flags: c.flags as i32,
            }
        }
        op::FUSE_IOCTL => {
            let i: abi::fuse_ioctl_in = a.fixed()?;
            Op::Ioctl {
                fh: i.fh,
                flags: i.flags,
                cmd: i.cmd,
                arg: i.arg,
                in_data: a.bytes(i.in_size)?,
                out_size: i.out_size,
            }
        }
        op::FUSE_FALLOCATE => {
            let f: abi::fuse_fallocate_in = a.fixed()?;
            Op::Fallocate {
                fh: f.fh,
                offset: f.offset,
                length: f.length,
                mode: f.mode as i32,
            }
        }
        op::FUSE_LSEEK => {
            let l: abi::fuse_lseek_in = a.fixed()?;
            Op::Lseek {
                fh: l.fh,
                offset: l.offset as i64,
                whence: l.whence as i32,
            }
        }
        op::FUSE_COPY_FILE_RANGE => {
            let c: abi::fuse_copy_file_range_in = a.fixed()?;
            Op::CopyFileRange {
                fh_in: c.fh_in,
                off_in: c.off_in,
                nodeid_out: c.nodeid_out,
                fh_out: c.fh_out,
                off_out: c.off_out,
                len: c.len,
                flags: c.flags,
            }
        }
        _ => Op::Unsupported,
    })
}
