//! The FUSE protocol adapter: decode a request, call [`PassthroughFs`], encode the reply.
//!
//! No filesystem logic lives here. [`errno_of`] is the one mapping from `io::Error` to an
//! errno; every failed request goes through it.
use std::cell::RefCell;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use log::{debug, info, warn};

use crate::fs::{Opened, PassthroughFs, SetAttr};
use crate::history::Caller;

/// Largest write the kernel may send; libfuse's passthrough_hp uses the same.
const MAX_WRITE: u32 = 4 * 1024 * 1024;

pub struct FuseAdapter {
    fs: Arc<PassthroughFs>,
}

impl FuseAdapter {
    pub fn new(fs: Arc<PassthroughFs>) -> FuseAdapter {
        FuseAdapter { fs }
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages).
    fn invalidate_attrs(&self, ino: INodeNo) {
        self.fs.kernel_forget_inode(ino.0, false);
    }
}

/// The one io::Error → errno mapping. Errors without an OS code are internal failures
/// (e.g. a bad record); EIO tells the caller the truth without inventing a cause.
pub fn errno_of(e: &io::Error) -> Errno {
    if let Some(code) = crate::sys::os_error(e) {
        return Errno::from_i32(code);
    }
    match e.kind() {
        io::ErrorKind::NotFound => Errno::ENOENT,
        io::ErrorKind::PermissionDenied => Errno::EACCES,
        io::ErrorKind::AlreadyExists => Errno::EEXIST,
        io::ErrorKind::InvalidInput => Errno::EINVAL,
        io::ErrorKind::StorageFull => Errno::ENOSPC,
        _ => Errno::EIO,
    }
}

fn fail(op: &str, e: io::Error) -> Errno {
    let errno = errno_of(&e);
    debug!("{op}: {e}");
    errno
}

fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
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

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
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
        for flag in wanted.iter() {
            if config.add_capabilities(flag).is_err() {
                debug!("kernel lacks capability {flag:?}");
            }
        }
        if self.fs.passthrough_enabled() {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(2).is_ok();
            if !ok {
                self.fs
                    .disable_passthrough("the kernel does not offer FUSE passthrough");
            }
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let _ = config.set_max_background(64);
        let on_off = |b: bool| if b { "on" } else { "off" };
        info!(
            "FUSE session initialised (kernel passthrough: {})",
            on_off(self.fs.passthrough_enabled())
        );
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name) {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(e.generation)),
            // A negative entry (node id 0) the kernel may cache: names only appear through
            // this mount, which updates the kernel's dentries itself. Saves a round trip for
            // every repeated miss (git, compilers and shells probe many absent paths). Not
            // for "." and "..", which only file-handle decoding asks for.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    && !crate::fs::virt::is_virtual(parent.0)
                    && name != "."
                    && name != ".." =>
            {
                reply.entry(
                    &crate::fs::TTL,
                    &bare_attr(0, FileType::RegularFile),
                    Generation(0),
                )
            }
            Err(e) => reply.error(fail("lookup", e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0, fh.map(|f| f.0)) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(fail("getattr", e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
            fh: fh.map(|f| f.0),
        };
        match self.fs.setattr(&caller(req), ino.0, set) {
            Ok((attr, ttl)) => reply.attr(&ttl, &attr),
            Err(e) => reply.error(fail("setattr", e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(fail("readlink", e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        match self
            .fs
            .mknod(&caller(req), parent.0, name, mode, umask, u64::from(rdev))
        {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(e.generation)),
            Err(e) => reply.error(fail("mknod", e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.fs.mkdir(&caller(req), parent.0, name, mode, umask) {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(e.generation)),
            Err(e) => reply.error(fail("mkdir", e)),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.unlink(&caller(req), parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("unlink", e)),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.rmdir(&caller(req), parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("rmdir", e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        match self.fs.symlink(&caller(req), parent.0, link_name, target) {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(e.generation)),
            Err(e) => reply.error(fail("symlink", e)),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.fs.rename(
            &caller(req),
            parent.0,
            name,
            newparent.0,
            newname,
            flags.bits(),
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("rename", e)),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        match self.fs.link(&caller(req), ino.0, newparent.0, newname) {
            Ok(e) => reply.entry(&e.ttl, &e.attr, Generation(e.generation)),
            Err(e) => reply.error(fail("link", e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let make_backing = |fd: std::os::fd::BorrowedFd<'_>| reply.open_backing(fd);
        match self.fs.open(&caller(req), ino.0, flags.0, &make_backing) {
            Ok(o) => match &o.backing {
                Some(id) => reply.opened_passthrough(FileHandle(o.fh), fopen_flags(&o), id),
                None => reply.opened(FileHandle(o.fh), fopen_flags(&o)),
            },
            Err(e) => reply.error(fail("open", e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUF.with_borrow_mut(|buf| match self.fs.read(ino.0, fh.0, offset, size, buf) {
            Ok(()) => reply.data(buf),
            Err(e) => reply.error(fail("read", e)),
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let kill_suidgid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let owner = lock_owner.map(|o| o.0);
        match self
            .fs
            .write(&caller(req), ino.0, fh.0, offset, data, kill_suidgid, owner)
        {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fail("write", e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        match self.fs.flush(ino.0, fh.0, lock_owner.0) {
            Ok(stale_attrs) => {
                if stale_attrs {
                    self.invalidate_attrs(ino);
                }
                reply.ok()
            }
            Err(e) => reply.error(fail("flush", e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("fsync", e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            Ok(dir) => {
                let flags = if dir.cache_listing {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(dir.fh), flags)
            }
            Err(e) => reply.error(fail("opendir", e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let result = self.fs.readdir(ino.0, fh.0, offset as i64, &mut |e| {
            reply.add(
                INodeNo(e.ino),
                e.offset as u64,
                e.kind,
                OsStr::from_bytes(e.name),
            )
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdir", e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let result = self
            .fs
            .readdirplus(ino.0, fh.0, offset as i64, &mut |e, entry| {
                let name = OsStr::from_bytes(e.name);
                match entry {
                    Some(entry) => reply.add(
                        entry.attr.ino,
                        e.offset as u64,
                        name,
                        &entry.ttl,
                        &entry.attr,
                        Generation(entry.generation),
                    ),
                    None => {
                        // "." and "..": node id 0 tells the kernel not to make a dentry.
                        let attr = bare_attr(e.ino, e.kind);
                        reply.add(
                            INodeNo(0),
                            e.offset as u64,
                            name,
                            &std::time::Duration::ZERO,
                            &attr,
                            Generation(0),
                        )
                    }
                }
            });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("readdirplus", e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.fsync(fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("fsyncdir", e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(fail("statfs", e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        match self.fs.setxattr(&caller(req), ino.0, name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("setxattr", e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        READ_BUF.with_borrow_mut(|buf| {
            buf.resize(size as usize, 0);
            match self.fs.getxattr(ino.0, name, buf) {
                Ok(n) if size == 0 => reply.size(n as u32),
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(fail("getxattr", e)),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        READ_BUF.with_borrow_mut(|buf| {
            buf.resize(size as usize, 0);
            match self.fs.listxattr(ino.0, buf) {
                Ok(n) if size == 0 => reply.size(n as u32),
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(fail("listxattr", e)),
            }
        });
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.fs.removexattr(&caller(req), ino.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("removexattr", e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.fs.access(ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("access", e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let make_backing = |fd: std::os::fd::BorrowedFd<'_>| reply.open_backing(fd);
        match self.fs.create(
            &caller(req),
            parent.0,
            name,
            mode,
            umask,
            flags,
            &make_backing,
        ) {
            Ok((e, o)) => match &o.backing {
                Some(id) => reply.created_passthrough(
                    &e.ttl,
                    &e.attr,
                    Generation(e.generation),
                    FileHandle(o.fh),
                    fopen_flags(&o),
                    id,
                ),
                None => reply.created(
                    &e.ttl,
                    &e.attr,
                    Generation(e.generation),
                    FileHandle(o.fh),
                    fopen_flags(&o),
                ),
            },
            Err(e) => reply.error(fail("create", e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.fs.fallocate(fh.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("fallocate", e)),
        }
    }

    /// No ioctl is supported: every one is answered ENOTTY ("not a terminal / no such
    /// ioctl"), which is what `isatty()` and tools probing for features expect. The kernel
    /// keeps sending them (unlike ENOSYS replies to poll or locks, an ioctl reply is not
    /// cached), and Python does one per `open()`, so this is logged once per daemon.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        static LOGGED: AtomicBool = AtomicBool::new(false);
        if !LOGGED.swap(true, Ordering::Relaxed) {
            info!(
                "ioctl {cmd:#x} on a file in the mount answered ENOTTY: ioctls are not supported \
                 (logged once; later ones are answered the same way silently)"
            );
        } else {
            debug!("ioctl {cmd:#x}: ENOTTY");
        }
        reply.error(Errno::ENOTTY);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        match self.fs.lseek(fh.0, offset, whence) {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(fail("lseek", e)),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.fs.copy_file_range(
            fh_in.0,
            offset_in,
            fh_out.0,
            offset_out,
            len,
            flags.bits() as u32,
        ) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fail("copy_file_range", e)),
        }
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.history().shutdown() {
            warn!("flushing history at unmount failed: {e}");
        }
    }
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
