//! The FUSE protocol adapter: a decoded request in, [`PassthroughFs`] called, the reply
//! encoded. Both transports (`/dev/fuse` and io_uring, see [`super::session`]) call
//! [`FuseAdapter::dispatch`]; it neither reads nor writes the device itself, except for
//! registering passthrough backing files ([`super::dev::BackingId`]).
//!
//! No filesystem logic lives here. [`errno_of`] is the one mapping from `io::Error` to an
//! errno; every failed request goes through it.
use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{FileType, FopenFlags, INodeNo, InitFlags, WriteFlags};
use log::{debug, info, warn};

use super::abi;
use super::decode::{Op, Request};
use super::encode::{Entry, Open, ReplyBuf, Statfs};
use crate::fs::{BackingFile, Opened, PassthroughFs, SetAttr};
use crate::history::Caller;

/// Largest write the kernel may send; libfuse's passthrough_hp uses the same.
pub const MAX_WRITE: u32 = 4 * 1024 * 1024;
/// The most background requests (readahead, async direct IO) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;

pub struct FuseAdapter {
    fs: Arc<PassthroughFs>,
    /// The session's `/dev/fuse` fd, for FUSE_DEV_IOC_BACKING_OPEN.
    dev: Arc<OwnedFd>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<PassthroughFs>, dev: Arc<OwnedFd>) -> FuseAdapter {
        FuseAdapter { fs, dev }
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages).
    fn invalidate_attrs(&self, ino: u64) {
        self.fs.kernel_forget_inode(ino, false);
    }

    /// Registers `fd` as a passthrough backing file.
    fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<Arc<dyn BackingFile>> {
        Ok(Arc::new(super::dev::BackingId::open(&self.dev, fd)?))
    }
}

/// The one io::Error → errno mapping. Errors without an OS code are internal failures
/// (e.g. a bad record); EIO tells the caller the truth without inventing a cause.
pub fn errno_of(e: &io::Error) -> i32 {
    if let Some(code) = crate::sys::os_error(e) {
        return code;
    }
    match e.kind() {
        io::ErrorKind::NotFound => libc::ENOENT,
        io::ErrorKind::PermissionDenied => libc::EACCES,
        io::ErrorKind::AlreadyExists => libc::EEXIST,
        io::ErrorKind::InvalidInput => libc::EINVAL,
        io::ErrorKind::StorageFull => libc::ENOSPC,
        _ => libc::EIO,
    }
}

fn fail(op: &str, e: io::Error) -> i32 {
    let errno = errno_of(&e);
    debug!("{op}: {e}");
    errno
}

fn caller(req: &Request<'_>) -> Caller {
    Caller {
        pid: req.header.pid,
        uid: req.header.uid,
        gid: req.header.gid,
    }
}

/// An entry reply for a looked-up or created object (the kernel takes one lookup
/// reference per positive entry).
fn entry_of(e: &crate::fs::Entry) -> Entry<'_> {
    Entry {
        nodeid: e.attr.ino.0,
        generation: e.generation,
        entry_ttl: e.ttl,
        attr_ttl: e.ttl,
        attr: &e.attr,
    }
}

fn open_of(o: &Opened) -> Open {
    Open {
        fh: o.fh,
        open_flags: fopen_flags(o).bits(),
        backing_id: o.backing.as_ref().map(|b| b.id()),
    }
}

thread_local! {
    /// One read buffer per FUSE worker thread, reused across requests.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn fopen_flags(o: &Opened) -> FopenFlags {
    // The daemon buffers nothing and the kernel keeps POSIX locks itself, so a flush on
    // close(2) is a round trip that does nothing, except for rule files (see `Opened`).
    let mut f = FopenFlags::empty();
    if !o.flush_on_close {
        f |= FopenFlags::FOPEN_NOFLUSH;
    }
    if o.direct_io {
        f |= FopenFlags::FOPEN_DIRECT_IO;
    }
    if o.keep_cache {
        f |= FopenFlags::FOPEN_KEEP_CACHE;
    }
    f
}

impl FuseAdapter {
    /// The INIT reply to a kernel offering `offered` (`flags | flags2 << 32`) and
    /// `max_readahead`: what the core needs of the connection, as the kernel offers it.
    /// (`minor`, and FUSE_OVER_IO_URING, are the session's.)
    pub fn init(&self, offered: u64, max_readahead: u32) -> abi::fuse_init_out {
        // FUSE_ASYNC_READ, FUSE_BIG_WRITES and FUSE_MAX_PAGES are what fuser asked for by
        // default, which the daemon was built and measured with.
        let wanted = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // POSIX ACLs: the kernel enforces them from the system.posix_acl_* xattrs
            // (passed through to SRC), and with FUSE_DONT_MASK it sends modes unmasked
            // plus the umask, which `fs::sys::with_umask` applies as SRC's filesystem
            // does (not under a default ACL). SRC's filesystem also keeps mode and ACL in
            // step on chmod and setfacl.
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK;
        // File handles through the mount (open_by_handle_at, NFS): the inode table
        // decodes them (its invariant 7), where the daemon can reopen by file handle.
        let wanted = if self.fs.exports() {
            wanted | InitFlags::FUSE_EXPORT_SUPPORT
        } else {
            wanted
        };
        let offered_flags = InitFlags::from_bits_retain(offered);
        for flag in wanted.iter() {
            if !offered_flags.contains(flag) {
                debug!("kernel lacks capability {flag:?}");
            }
        }
        let mut flags = wanted.bits();
        let mut max_stack_depth = 0;
        if self.fs.passthrough_enabled() {
            if offered & InitFlags::FUSE_PASSTHROUGH.bits() != 0 {
                flags |= InitFlags::FUSE_PASSTHROUGH.bits();
                max_stack_depth = 2;
            } else {
                self.fs
                    .disable_passthrough("the kernel does not offer FUSE passthrough");
            }
        }
        let flags = (flags | abi::FUSE_INIT_EXT) & offered;
        // Readahead as large as a write, if the kernel allows that much (it offers its
        // limit); otherwise the kernel's.
        let max_readahead = if MAX_WRITE <= max_readahead {
            MAX_WRITE
        } else {
            max_readahead
        };
        let page = page_size();
        let on_off = |b: bool| if b { "on" } else { "off" };
        info!(
            "FUSE session initialised (kernel passthrough: {})",
            on_off(self.fs.passthrough_enabled())
        );
        abi::fuse_init_out {
            major: abi::FUSE_KERNEL_VERSION,
            minor: abi::FUSE_KERNEL_MINOR_VERSION,
            max_readahead,
            flags: flags as u32,
            max_background: MAX_BACKGROUND,
            congestion_threshold: MAX_BACKGROUND * 3 / 4,
            max_write: MAX_WRITE,
            time_gran: 1,
            max_pages: ((MAX_WRITE.max(max_readahead) - 1) / page + 1) as u16,
            map_alignment: 0,
            flags2: (flags >> 32) as u32,
            max_stack_depth,
            request_timeout: 0,
            unused: [0; 11],
        }
    }

    /// History shutdown at the end of the session (DESTROY, or the device gone).
    pub fn destroy(&self) {
        if let Err(e) = self.fs.history().shutdown() {
            warn!("flushing history at unmount failed: {e}");
        }
    }

    /// Serves one request (not INIT, DESTROY or INTERRUPT, which the session answers):
    /// returns whether `out` holds a reply to send (FORGET and BATCH_FORGET have none).
    pub fn dispatch(&self, req: &Request<'_>, out: &mut ReplyBuf) -> bool {
        let unique = req.header.unique;
        let ino = req.header.nodeid;
        let result: Result<(), i32> = match &req.op {
            Op::Forget { nlookup } => {
                self.fs.forget(ino, *nlookup);
                return false;
            }
            Op::BatchForget(forgets) => {
                for (nodeid, nlookup) in *forgets {
                    self.fs.forget(nodeid, nlookup);
                }
                return false;
            }
            Op::Lookup { name } => self.lookup(ino, name, out, unique),
            Op::Getattr { fh } => reply_with(
                out,
                unique,
                "getattr",
                self.fs.getattr(ino, *fh),
                |o, (attr, ttl)| {
                    o.attr(ttl, &attr);
                },
            ),
            Op::Setattr(s) => {
                let set = SetAttr {
                    mode: s.mode,
                    uid: s.uid,
                    gid: s.gid,
                    size: s.size,
                    atime: s.atime,
                    mtime: s.mtime,
                    fh: s.fh,
                };
                reply_with(
                    out,
                    unique,
                    "setattr",
                    self.fs.setattr(&caller(req), ino, set),
                    |o, (attr, ttl)| {
                        o.attr(ttl, &attr);
                    },
                )
            }
            Op::Readlink => reply_with(
                out,
                unique,
                "readlink",
                self.fs.readlink(ino),
                |o, target| {
                    o.data(&target);
                },
            ),
            Op::Mknod {
                name,
                mode,
                rdev,
                umask,
            } => reply_entry(
                out,
                unique,
                "mknod",
                self.fs
                    .mknod(&caller(req), ino, name, *mode, *umask, u64::from(*rdev)),
            ),
            Op::Mkdir { name, mode, umask } => reply_entry(
                out,
                unique,
                "mkdir",
                self.fs.mkdir(&caller(req), ino, name, *mode, *umask),
            ),
            Op::Unlink { name } => reply_empty(
                out,
                unique,
                "unlink",
                self.fs.unlink(&caller(req), ino, name),
            ),
            Op::Rmdir { name } => {
                reply_empty(out, unique, "rmdir", self.fs.rmdir(&caller(req), ino, name))
            }
            Op::Symlink { name, target } => reply_entry(
                out,
                unique,
                "symlink",
                self.fs.symlink(&caller(req), ino, name, Path::new(*target)),
            ),
            Op::Rename {
                name,
                newdir,
                newname,
                flags,
            } => reply_empty(
                out,
                unique,
                "rename",
                self.fs
                    .rename(&caller(req), ino, name, *newdir, newname, *flags),
            ),
            Op::Link { oldnodeid, newname } => reply_entry(
                out,
                unique,
                "link",
                self.fs.link(&caller(req), *oldnodeid, ino, newname),
            ),
            Op::Open { flags } => {
                let make_backing = |fd: BorrowedFd<'_>| self.open_backing(fd);
                reply_with(
                    out,
                    unique,
                    "open",
                    self.fs.open(&caller(req), ino, *flags, &make_backing),
                    |reply, opened| {
                        reply.open(&open_of(&opened));
                    },
                )
            }
            Op::Read {
                fh, offset, size, ..
            } => READ_BUF.with_borrow_mut(|buf| {
                reply_with(
                    out,
                    unique,
                    "read",
                    self.fs.read(ino, *fh, *offset, *size, buf),
                    |o, ()| {
                        o.data(buf);
                    },
                )
            }),
            Op::Write {
                fh,
                offset,
                data,
                write_flags,
                lock_owner,
                ..
            } => {
                let kill_suidgid = write_flags & WriteFlags::FUSE_WRITE_KILL_SUIDGID.bits() != 0;
                reply_with(
                    out,
                    unique,
                    "write",
                    self.fs.write(
                        &caller(req),
                        ino,
                        *fh,
                        *offset,
                        data,
                        kill_suidgid,
                        *lock_owner,
                    ),
                    |o, n| {
                        o.written(n);
                    },
                )
            }
            Op::Flush { fh, lock_owner } => match self.fs.flush(ino, *fh, *lock_owner) {
                Ok(stale_attrs) => {
                    if stale_attrs {
                        self.invalidate_attrs(ino);
                    }
                    out.start(unique);
                    Ok(())
                }
                Err(e) => Err(fail("flush", e)),
            },
            Op::Release { fh, .. } => {
                self.fs.release(*fh);
                out.start(unique);
                Ok(())
            }
            Op::Fsync { fh, datasync } => {
                reply_empty(out, unique, "fsync", self.fs.fsync(*fh, *datasync))
            }
            Op::Opendir { .. } => match self.fs.opendir(ino) {
                Ok(dir) => {
                    let open_flags = if dir.cache_listing {
                        (FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE).bits()
                    } else {
                        0
                    };
                    out.start(unique).open(&Open {
                        fh: dir.fh,
                        open_flags,
                        backing_id: None,
                    });
                    Ok(())
                }
                Err(e) => Err(fail("opendir", e)),
            },
            Op::Readdir { fh, offset, size } => {
                out.start(unique);
                let max = *size as usize;
                let result = self.fs.readdir(ino, *fh, *offset as i64, &mut |e| {
                    !out.dirent(max, e.ino, e.offset as u64, e.kind, e.name)
                });
                result.map_err(|e| fail("readdir", e))
            }
            Op::Readdirplus { fh, offset, size } => {
                out.start(unique);
                let max = *size as usize;
                let result = self
                    .fs
                    .readdirplus(ino, *fh, *offset as i64, &mut |e, entry| match entry {
                        Some(entry) => {
                            !out.direntplus(max, &entry_of(entry), e.offset as u64, e.name)
                        }
                        None => {
                            // "." and "..": node id 0 tells the kernel not to make a dentry.
                            let attr = bare_attr(e.ino, e.kind);
                            let dot = Entry {
                                nodeid: 0,
                                generation: 0,
                                entry_ttl: Duration::ZERO,
                                attr_ttl: Duration::ZERO,
                                attr: &attr,
                            };
                            !out.direntplus(max, &dot, e.offset as u64, e.name)
                        }
                    });
                result.map_err(|e| fail("readdirplus", e))
            }
            Op::Releasedir { fh, .. } => {
                self.fs.releasedir(*fh);
                out.start(unique);
                Ok(())
            }
            Op::Fsyncdir { fh, datasync } => {
                reply_empty(out, unique, "fsyncdir", self.fs.fsync(*fh, *datasync))
            }
            Op::Statfs => match self.fs.statfs() {
                Ok(s) => {
                    out.start(unique).statfs(&Statfs {
                        blocks: s.f_blocks,
                        bfree: s.f_bfree,
                        bavail: s.f_bavail,
                        files: s.f_files,
                        ffree: s.f_ffree,
                        bsize: s.f_bsize as u32,
                        namelen: s.f_namemax as u32,
                        frsize: s.f_frsize as u32,
                    });
                    Ok(())
                }
                Err(e) => Err(fail("statfs", e)),
            },
            Op::Setxattr { name, value, flags } => reply_empty(
                out,
                unique,
                "setxattr",
                self.fs.setxattr(&caller(req), ino, name, value, *flags),
            ),
            Op::Getxattr { name, size } => reply_xattr(out, unique, "getxattr", *size, |buf| {
                self.fs.getxattr(ino, name, buf)
            }),
            Op::Listxattr { size } => reply_xattr(out, unique, "listxattr", *size, |buf| {
                self.fs.listxattr(ino, buf)
            }),
            Op::Removexattr { name } => reply_empty(
                out,
                unique,
                "removexattr",
                self.fs.removexattr(&caller(req), ino, name),
            ),
            Op::Access { mask } => reply_empty(out, unique, "access", self.fs.access(ino, *mask)),
            Op::Create {
                name,
                mode,
                umask,
                flags,
            } => {
                let make_backing = |fd: BorrowedFd<'_>| self.open_backing(fd);
                reply_with(
                    out,
                    unique,
                    "create",
                    self.fs.create(
                        &caller(req),
                        ino,
                        name,
                        *mode,
                        *umask,
                        *flags,
                        &make_backing,
                    ),
                    |reply, (e, opened)| {
                        reply.create(&entry_of(&e), &open_of(&opened));
                    },
                )
            }
            Op::Fallocate {
                fh,
                offset,
                length,
                mode,
            } => reply_empty(
                out,
                unique,
                "fallocate",
                self.fs.fallocate(*fh, *offset, *length, *mode),
            ),
            Op::Ioctl { cmd, .. } => Err(ioctl_unsupported(*cmd)),
            Op::Lseek { fh, offset, whence } => reply_with(
                out,
                unique,
                "lseek",
                self.fs.lseek(*fh, *offset, *whence),
                |o, off| {
                    o.lseek(off);
                },
            ),
            Op::CopyFileRange {
                fh_in,
                off_in,
                fh_out,
                off_out,
                len,
                flags,
                ..
            } => reply_with(
                out,
                unique,
                "copy_file_range",
                self.fs
                    .copy_file_range(*fh_in, *off_in, *fh_out, *off_out, *len, *flags as u32),
                |o, n| {
                    o.written(n);
                },
            ),
            // Locks (the kernel keeps POSIX and flock locks itself when they are not
            // served), BMAP, POLL, STATX, TMPFILE, SYNCFS...: ENOSYS, which the kernel
            // remembers for most of them.
            Op::Unsupported => Err(libc::ENOSYS),
            // The session answers these itself; reaching here is a second INIT or a
            // request after DESTROY.
            Op::Init { .. } | Op::Destroy | Op::Interrupt { .. } => Err(libc::EIO),
        };
        if let Err(errno) = result {
            out.error(unique, errno);
        } else {
            out.finish();
        }
        true
    }

    fn lookup(
        &self,
        parent: u64,
        name: &OsStr,
        out: &mut ReplyBuf,
        unique: u64,
    ) -> Result<(), i32> {
        match self.fs.lookup(parent, name) {
            Ok(e) => {
                out.start(unique).entry(&entry_of(&e));
                Ok(())
            }
            // A negative entry (node id 0) the kernel may cache: names only appear through
            // this mount, which updates the kernel's dentries itself. Saves a round trip for
            // every repeated miss (git, compilers and shells probe many absent paths). Not
            // for "." and "..", which only file-handle decoding asks for.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    && !crate::fs::virt::is_virtual(parent)
                    && name != "."
                    && name != ".." =>
            {
                let attr = bare_attr(0, FileType::RegularFile);
                out.start(unique).entry(&Entry {
                    nodeid: 0,
                    generation: 0,
                    entry_ttl: crate::fs::TTL,
                    attr_ttl: crate::fs::TTL,
                    attr: &attr,
                });
                Ok(())
            }
            Err(e) => Err(fail("lookup", e)),
        }
    }
}

/// A successful `result`'s reply, its body written by `body`; else its errno.
fn reply_with<T>(
    out: &mut ReplyBuf,
    unique: u64,
    op: &str,
    result: io::Result<T>,
    body: impl FnOnce(&mut ReplyBuf, T),
) -> Result<(), i32> {
    match result {
        Ok(v) => {
            body(out.start(unique), v);
            Ok(())
        }
        Err(e) => Err(fail(op, e)),
    }
}

/// GETXATTR/LISTXATTR of `size` bytes: with size 0 the size the value needs, else the value
/// (`get` fills the buffer of `size` bytes and returns the length, or ERANGE).
fn reply_xattr(
    out: &mut ReplyBuf,
    unique: u64,
    op: &str,
    size: u32,
    get: impl FnOnce(&mut Vec<u8>) -> io::Result<usize>,
) -> Result<(), i32> {
    READ_BUF.with_borrow_mut(|buf| {
        buf.resize(size as usize, 0);
        let got = get(buf);
        reply_with(out, unique, op, got, |o, n| {
            if size == 0 {
                o.xattr_size(n as u32);
            } else {
                o.data(&buf[..n]);
            }
        })
    })
}

fn reply_entry(
    out: &mut ReplyBuf,
    unique: u64,
    op: &str,
    result: io::Result<crate::fs::Entry>,
) -> Result<(), i32> {
    reply_with(out, unique, op, result, |o, e| {
        o.entry(&entry_of(&e));
    })
}

fn reply_empty(
    out: &mut ReplyBuf,
    unique: u64,
    op: &str,
    result: io::Result<()>,
) -> Result<(), i32> {
    reply_with(out, unique, op, result, |_, ()| {})
}

/// No ioctl is supported: every one is answered ENOTTY ("not a terminal / no such ioctl"),
/// which is what `isatty()` and tools probing for features expect. The kernel keeps sending
/// them (unlike ENOSYS replies to poll or locks, an ioctl reply is not cached), and Python
/// does one per `open()`, so this is logged once per daemon.
fn ioctl_unsupported(cmd: u32) -> i32 {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    if !LOGGED.swap(true, Ordering::Relaxed) {
        info!(
            "ioctl {cmd:#x} on a file in the mount answered ENOTTY: ioctls are not supported \
             (logged once; later ones are answered the same way silently)"
        );
    } else {
        debug!("ioctl {cmd:#x}: ENOTTY");
    }
    libc::ENOTTY
}

/// The page size, which `max_pages` counts in.
fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// Attributes that carry only an inode number and a type (dot entries, negative entries).
fn bare_attr(ino: u64, kind: FileType) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}
