//! The FUSE reply encoder: typed results → `fuse_out_header` + reply body.
//!
//! One [`ReplyBuf`] per serving thread, reused: [`ReplyBuf::start`] begins a reply to one
//! request, the body methods append the opcode's reply struct (or data, or directory
//! entries), [`ReplyBuf::finish`] fills the header and returns the bytes. An error reply is
//! the header alone ([`ReplyBuf::error`]).
//!
//! Both transports send the same bytes: `/dev/fuse` takes the whole reply in one write; a
//! ring entry takes [`ReplyBuf::header`] in its `in_out` area and [`ReplyBuf::body`] in its
//! payload buffer (with `payload_sz` = the body's length).
//!
//! Attributes come as `fuser::FileAttr`, which the passthrough core already produces.
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType};
use zerocopy::{Immutable, IntoBytes};

use super::abi;

const OUT_HEADER: usize = size_of::<abi::fuse_out_header>();

/// `(seconds, nanoseconds)` of a cache timeout.
fn ttl_parts(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

/// A time as the kernel's signed seconds (as u64 bits) and nanoseconds; times before 1970
/// count back from it, and times beyond an i64 of seconds saturate.
pub fn time_parts(t: SystemTime) -> (u64, u32) {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX) as u64,
            d.subsec_nanos(),
        ),
        Err(e) => {
            let d = e.duration();
            let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            if d.subsec_nanos() == 0 {
                ((-secs) as u64, 0)
            } else {
                (
                    (-secs).saturating_sub(1) as u64,
                    1_000_000_000 - d.subsec_nanos(),
                )
            }
        }
    }
}

/// The `S_IF*` bits of a file type.
pub fn mode_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

/// The `DT_*` value of a file type, as directory entries carry it.
pub fn dirent_type(kind: FileType) -> u32 {
    mode_bits(kind) >> 12
}

/// `fuser::FileAttr` → `fuse_attr`.
pub fn fuse_attr(a: &FileAttr) -> abi::fuse_attr {
    let (atime, atimensec) = time_parts(a.atime);
    let (mtime, mtimensec) = time_parts(a.mtime);
    let (ctime, ctimensec) = time_parts(a.ctime);
    abi::fuse_attr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: mode_bits(a.kind) | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: a.flags,
    }
}

/// An entry reply's contents (LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, CREATE; each READDIRPLUS
/// entry). `nodeid` 0 with a non-zero `entry_ttl` is a negative entry the kernel caches.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
    pub attr: &'a FileAttr,
}

fn entry_out(e: &Entry<'_>) -> abi::fuse_entry_out {
    let (entry_valid, entry_valid_nsec) = ttl_parts(e.entry_ttl);
    let (attr_valid, attr_valid_nsec) = ttl_parts(e.attr_ttl);
    abi::fuse_entry_out {
        nodeid: e.nodeid,
        generation: e.generation,
        entry_valid,
        attr_valid,
        entry_valid_nsec,
        attr_valid_nsec,
        attr: fuse_attr(e.attr),
    }
}

/// An OPEN/OPENDIR/CREATE result: the handle, `FOPEN_*` flags, and the backing id of a
/// kernel-passthrough open (which adds `FOPEN_PASSTHROUGH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: Option<u32>,
}

fn open_out(o: &Open) -> abi::fuse_open_out {
    let (flags, id) = match o.backing_id {
        Some(id) => (o.open_flags | abi::FOPEN_PASSTHROUGH, id as i32),
        None => (o.open_flags, 0),
    };
    abi::fuse_open_out {
        fh: o.fh,
        open_flags: flags,
        backing_id: id,
    }
}

/// STATFS contents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// One reply being built. Holds its buffer across requests (no allocation per reply once
/// it has grown to the largest reply).
#[derive(Debug, Default)]
pub struct ReplyBuf {
    buf: Vec<u8>,
    unique: u64,
}

impl ReplyBuf {
    pub fn new() -> ReplyBuf {
        ReplyBuf {
            buf: Vec::with_capacity(4096),
            unique: 0,
        }
    }

    /// Begins the reply to request `unique` (any previous reply is dropped).
    pub fn start(&mut self, unique: u64) -> &mut Self {
        self.buf.clear();
        self.buf.resize(OUT_HEADER, 0);
        self.unique = unique;
        self
    }

    fn push<T: IntoBytes + Immutable>(&mut self, t: &T) -> &mut Self {
        self.buf.extend_from_slice(t.as_bytes());
        self
    }

    fn set_header(&mut self, error: i32) {
        let h = abi::fuse_out_header {
            len: u32::try_from(self.buf.len()).unwrap_or(u32::MAX),
            error,
            unique: self.unique,
        };
        self.buf[..OUT_HEADER].copy_from_slice(h.as_bytes());
    }

    /// Completes a successful reply and returns it (header and body).
    pub fn finish(&mut self) -> &[u8] {
        if self.buf.len() < OUT_HEADER {
            self.buf.resize(OUT_HEADER, 0);
        }
        self.set_header(0);
        &self.buf
    }

    /// An error reply to `unique`: the header alone, with `-errno`. An errno outside
    /// 1..=4095 (which the kernel would refuse as a protocol error) is sent as EIO.
    pub fn error(&mut self, unique: u64, errno: i32) -> &[u8] {
        let errno = if (1..4096).contains(&errno) {
            errno
        } else {
            libc::EIO
        };
        self.start(unique);
        self.set_header(-errno);
        &self.buf
    }

    /// The finished reply as it stands (after [`ReplyBuf::finish`] or [`ReplyBuf::error`]).
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The `fuse_out_header` of the finished reply.
    pub fn header(&self) -> &[u8] {
        &self.buf[..OUT_HEADER.min(self.buf.len())]
    }

    /// The body of the finished reply (what follows the header).
    pub fn body(&self) -> &[u8] {
        self.buf.get(OUT_HEADER..).unwrap_or(&[])
    }

    /// Bytes in the body so far.
    pub fn body_len(&self) -> usize {
        self.buf.len().saturating_sub(OUT_HEADER)
    }

    pub fn entry(&mut self, e: &Entry<'_>) -> &mut Self {
        self.push(&entry_out(e))
    }

    pub fn attr(&mut self, ttl: Duration, attr: &FileAttr) -> &mut Self {
        let (attr_valid, attr_valid_nsec) = ttl_parts(ttl);
        self.push(&abi::fuse_attr_out {
            attr_valid,
            attr_valid_nsec,
            dummy: 0,
            attr: fuse_attr(attr),
        })
    }

    pub fn open(&mut self, o: &Open) -> &mut Self {
        self.push(&open_out(o))
    }

    pub fn create(&mut self, e: &Entry<'_>, o: &Open) -> &mut Self {
        self.push(&entry_out(e)).push(&open_out(o))
    }

    pub fn written(&mut self, size: u32) -> &mut Self {
        self.push(&abi::fuse_write_out { size, padding: 0 })
    }

    pub fn statfs(&mut self, s: &Statfs) -> &mut Self {
        self.push(&abi::fuse_statfs_out {
            st: abi::fuse_kstatfs {
                blocks: s.blocks,
                bfree: s.bfree,
                bavail: s.bavail,
                files: s.files,
                ffree: s.ffree,
                bsize: s.bsize,
                namelen: s.namelen,
                frsize: s.frsize,
                padding: 0,
                spare: [0; 6],
            },
        })
    }

    /// READ, READLINK, GETXATTR/LISTXATTR with a buffer: the bytes themselves.
    pub fn data(&mut self, data: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(data);
        self
    }

    /// GETXATTR/LISTXATTR asked with size 0: the size the value needs.
    pub fn xattr_size(&mut self, size: u32) -> &mut Self {
        self.push(&abi::fuse_getxattr_out { size, padding: 0 })
    }

    pub fn lseek(&mut self, offset: i64) -> &mut Self {
        self.push(&abi::fuse_lseek_out {
            offset: offset as u64,
        })
    }

    pub fn poll(&mut self, revents: u32) -> &mut Self {
        self.push(&abi::fuse_poll_out {
            revents,
            padding: 0,
        })
    }

    /// A successful IOCTL (no retry): its result and output data.
    pub fn ioctl(&mut self, result: i32, data: &[u8]) -> &mut Self {
        self.push(&abi::fuse_ioctl_out {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        })
        .data(data)
    }

    pub fn init(&mut self, out: &abi::fuse_init_out) -> &mut Self {
        self.push(out)
    }

    /// Appends one READDIR entry if it fits in `max` body bytes (the request's size);
    /// returns false, adding nothing, when it does not (the reply is then full).
    pub fn dirent(&mut self, max: usize, ino: u64, off: u64, kind: FileType, name: &[u8]) -> bool {
        let fixed = size_of::<abi::fuse_dirent>();
        let Some(len) = dirent_len(fixed, name.len()) else {
            return false;
        };
        if self.body_len().saturating_add(len) > max {
            return false;
        }
        self.push(&abi::fuse_dirent {
            ino,
            off,
            namelen: name.len() as u32,
            typ: dirent_type(kind),
        });
        self.pad_name(name, len - fixed);
        true
    }

    /// Appends one READDIRPLUS entry if it fits in `max` body bytes; `entry.nodeid` 0 (with
    /// zero TTLs) for "." and "..", which the kernel then makes no dentry for.
    pub fn direntplus(&mut self, max: usize, e: &Entry<'_>, off: u64, name: &[u8]) -> bool {
        let fixed = size_of::<abi::fuse_direntplus>();
        let Some(len) = dirent_len(fixed, name.len()) else {
            return false;
        };
        if self.body_len().saturating_add(len) > max {
            return false;
        }
        self.push(&abi::fuse_direntplus {
            entry_out: entry_out(e),
            dirent: abi::fuse_dirent {
                ino: e.attr.ino.0,
                off,
                namelen: name.len() as u32,
                typ: dirent_type(e.attr.kind),
            },
        });
        self.pad_name(name, len - fixed);
        true
    }

    fn pad_name(&mut self, name: &[u8], room: usize) {
        self.buf.extend_from_slice(name);
        self.buf.resize(self.buf.len() + (room - name.len()), 0);
    }
}

/// A directory entry's length: the fixed part and the name, rounded up to 8 bytes
/// (`FUSE_DIRENT_ALIGN`). None for a name no entry can carry.
fn dirent_len(fixed: usize, name_len: usize) -> Option<usize> {
    if name_len == 0 || name_len > u32::MAX as usize {
        return None;
    }
    fixed.checked_add(name_len)?.checked_next_multiple_of(8)
}
