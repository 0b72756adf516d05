//! The passthrough core: every FUSE operation as a plain method returning `io::Result`.
//!
//! The core knows nothing about the FUSE wire protocol (that is [`crate::transport::adapter`]);
//! it maps FUSE inode numbers and handles to fds on SRC ([`inodes`], [`handles`]), sends
//! every change through the [`gate`], and serves the virtual `.checkpoint/` tree ([`virt`]).
//!
//! Caching contract: entries and attributes are given long timeouts (a day, as libfuse's
//! passthrough_hp does) because every change to SRC is expected to go through this mount —
//! rewinds included. Changing SRC behind the mount's back is unsupported (see README).
pub mod branch;
pub mod gate;
pub mod handles;
pub mod inodes;
mod privs;
pub mod virt;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use log::{info, warn};

use self::gate::Gate;
use self::handles::{DirHandle, FileHandle, Handle, HandleFd, HandleTable};
use self::inodes::{Inode, InodeTable, ROOT_INO};
use crate::history::{CONTROL_DIR_NAME, Caller, History};
use crate::sys::{self, FsCredsGuard, errno, with_name};

/// Timeout for entries and attributes of real files (see the module docs).
pub const TTL: Duration = Duration::from_secs(86400);

pub struct FsConfig {
    pub passthrough: bool,
    pub state_dir: std::path::PathBuf,
    pub mountpoint: std::path::PathBuf,
    /// What the core needs of the kernel mount options the mount was made with.
    pub options: MountFacts,
    /// The normal user a root daemon mounts for (`--owner`): only that user's processes may
    /// use the mount (the kernel checks), and the control socket is theirs.
    pub owner: Option<crate::sys::UserIds>,
}

/// What the core needs of the kernel mount options the mount was made with (parsed and
/// applied by the mount layer): the one it honours itself, and what reports show. A later
/// `mount -o remount` may have changed ro/rw since; the mount table says what holds now.
#[derive(Debug, Clone)]
pub struct MountFacts {
    /// The options as a `-o` list (`rw,nodev,nosuid,exec,atime`), for `status`.
    pub list: String,
    /// Made read-only (`-o ro`). The daemon's own reads then never update an access time
    /// in SRC: it opens SRC from a clone of its mount with `noatime` where it may
    /// (`mount::options::MountOptions::source_view_change`), and asks for O_NOATIME on the
    /// files and directories it opens for the kernel in any case, which covers its own files
    /// without that privilege.
    pub read_only: bool,
    /// `strictatime`: every read must update atime in SRC, so what the daemon reads for
    /// the kernel is not kept in the page cache across opens.
    pub strict_atime: bool,
}

/// A looked-up entry: the kernel adds one lookup for every `Entry` it receives.
pub struct Entry {
    pub attr: FileAttr,
    pub ttl: Duration,
    /// The object's generation (see the inode table's invariant 7); 0 if unknown.
    pub generation: u64,
}

/// An opened file: `backing` is set when kernel passthrough serves its IO.
pub struct Opened {
    pub fh: u64,
    pub backing: Option<Arc<dyn BackingFile>>,
    pub direct_io: bool,
    pub keep_cache: bool,
    /// The kernel must send FLUSH at close(2), which waits for it (RELEASE comes
    /// asynchronously, possibly after the caller's next request). Three reasons: the handle
    /// writes a file the exclusion rules are read from, so the new rules are in force
    /// before close returns; it is `ctl`, which takes a last line without newline at close;
    /// or it can write through a shared mapping with kernel passthrough (open for reading
    /// and writing), so the kernel's cached attributes can be dropped before close returns
    /// (see [`PassthroughFs::flush`]). Any other handle closes without a round trip.
    pub flush_on_close: bool,
}

/// An opened directory. `cache_listing`: the kernel may keep the listing it reads through this
/// handle (FOPEN_CACHE_DIR) and keep it across opens (FOPEN_KEEP_CACHE), so a second `ls`,
/// `git status` or `find` of an unchanged directory sends no READDIR. That is sound because
/// the kernel drops the cached listing itself whenever the directory changes through the
/// mount (every create, unlink, rename, link bumps the directory's i_version), and the
/// daemon's own changes to SRC (rewinds) invalidate the directory's inode with its pages,
/// where the listing lives ([`PassthroughFs::kernel_forget_inode`]). A change made to SRC
/// behind the mount's back shows once the kernel forgets the directory, as names already do
/// (entries live for [`TTL`]).
pub struct OpenedDir {
    pub fh: u64,
    pub cache_listing: bool,
}

/// A file the kernel serves passthrough IO from: registered by the transport
/// (FUSE_DEV_IOC_BACKING_OPEN), unregistered when the last reference is dropped. The core
/// only hands it on and keeps it alive; the transport owns the device and the ioctls.
pub trait BackingFile: Send + Sync {
    /// The id the kernel gave it, for the OPEN/CREATE reply.
    fn id(&self) -> u32;
}

/// Registers an open file as the kernel's backing file for passthrough (the transport's
/// FUSE_DEV_IOC_BACKING_OPEN); `None` where no kernel open is behind a handle.
pub type MakeBacking<'a> = &'a dyn Fn(BorrowedFd<'_>) -> io::Result<Arc<dyn BackingFile>>;

/// How the core tells the kernel what the daemon changed on its own (FUSE notifications,
/// sent by the transport on `/dev/fuse`).
pub trait KernelNotifier: Send + Sync {
    /// Drops the kernel's dentry of `name` in `parent` (FUSE_NOTIFY_INVAL_ENTRY).
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()>;
    /// Drops the kernel's cached attributes of `ino`, and its pages from `offset` for `len`
    /// bytes (0: to the end) unless `offset` is negative (FUSE_NOTIFY_INVAL_INODE).
    fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()>;
}

/// What a setattr request asks for (the core's own view of it, not fuser's).
#[derive(Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub fh: Option<u64>,
}

impl SetAttr {
    /// Nothing to change: how the kernel asks us to drop privileges before a write.
    fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
    }
}

pub struct DirEntryOut<'a> {
    pub ino: u64,
    pub offset: i64,
    pub kind: FileType,
    pub name: &'a [u8],
}

pub struct PassthroughFs {
    inodes: InodeTable,
    handles: HandleTable,
    gate: Gate,
    virt: virt::VirtualTree,
    branches: branch::BranchFs,
    passthrough: AtomicBool,
    /// Why kernel passthrough is off; set once, when it goes off (or at start).
    passthrough_off: std::sync::OnceLock<String>,
    mountpoint: std::path::PathBuf,
    mount_options: MountFacts,
    owner: Option<crate::sys::UserIds>,
    /// The mount's device number (major, minor), from the kernel's mount table right after
    /// the mount; a rewind checks its root against it (see `history::rewind`).
    mount_dev: std::sync::OnceLock<(u32, u32)>,
    /// How the daemon tells the kernel what it changed on its own (a rewind) or behind a
    /// passthrough mapping: set once the FUSE session exists; until then nothing is cached.
    notifier: Arc<std::sync::OnceLock<Box<dyn KernelNotifier>>>,
}

/// A failed cache notification: ENOENT (nothing cached) is normal, anything else is logged
/// once.
fn note_notify_error(result: io::Result<()>) {
    if let Err(e) = result
        && e.raw_os_error() != Some(libc::ENOENT)
    {
        static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !LOGGED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "telling the kernel about a change the daemon made failed ({e}): it may show \
                 the old state until its cache expires (logged once)"
            );
        }
    }
}

impl PassthroughFs {
    /// The core over SRC's root fd `root` (O_PATH), recording into `history`. Kernel
    /// passthrough is on only if `cfg.passthrough` and the daemon has CAP_SYS_ADMIN.
    pub fn new(root: OwnedFd, history: Arc<History>, cfg: FsConfig) -> io::Result<PassthroughFs> {
        // The kernel's spelling of the root's path, which the gate strips from every
        // object's: SRC's path, or "/" when SRC is opened from a private clone of its mount
        // (mount attributes such as noatime, see mount/options.rs).
        let src_prefix = match sys::fd_path(root.as_raw_fd()) {
            Ok(Some(path)) => path,
            _ => history.source().as_os_str().as_bytes().to_vec(),
        };
        let src_prefix = if src_prefix == b"/" {
            Vec::new()
        } else {
            src_prefix
        };
        let passthrough_off = std::sync::OnceLock::new();
        let passthrough = if !cfg.passthrough {
            let _ = passthrough_off.set("switched off with --no-passthrough".to_string());
            false
        } else if !sys::has_cap_sys_admin() {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            let why = format!(
                "it needs CAP_SYS_ADMIN, which this daemon (uid {uid}) lacks, as any normal \
                 user's mount does"
            );
            info!("kernel passthrough off: {why}; reads and writes are served by the daemon");
            let _ = passthrough_off.set(why);
            false
        } else {
            true
        };
        Ok(PassthroughFs {
            inodes: InodeTable::new(root)?,
            handles: HandleTable::default(),
            gate: Gate::new(history, src_prefix),
            branches: branch::BranchFs::new(crate::history::branches::Branches::open(
                &cfg.state_dir,
            )?),
            virt: virt::VirtualTree::new(cfg.state_dir),
            passthrough: AtomicBool::new(passthrough),
            passthrough_off,
            mountpoint: cfg.mountpoint,
            mount_options: cfg.options,
            owner: cfg.owner,
            mount_dev: std::sync::OnceLock::new(),
            notifier: Arc::new(std::sync::OnceLock::new()),
        })
    }

    /// Where the daemon puts the session's notifier (the session is built after the core).
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<Box<dyn KernelNotifier>>> {
        self.notifier.clone()
    }

    /// Tells the kernel that the daemon itself changed what `name` in `parent` is (created
    /// or removed it): its cached dentry, positive or negative, goes (dentries live for
    /// [`TTL`]). Best effort: ENOENT means the kernel had nothing cached; anything else is
    /// logged once, since a stale entry only delays what a lookup sees.
    pub fn kernel_forget_entry(&self, parent: u64, name: &OsStr) {
        if let Some(n) = self.notifier.get() {
            note_notify_error(n.inval_entry(parent, name));
        }
    }

    /// Tells the kernel that the daemon itself changed inode `ino`: its cached attributes
    /// go, and with `content` its cached pages too. Best effort, as
    /// [`PassthroughFs::kernel_forget_entry`].
    pub fn kernel_forget_inode(&self, ino: u64, content: bool) {
        if let Some(n) = self.notifier.get() {
            let offset = if content { 0 } else { -1 };
            note_notify_error(n.inval_inode(ino, offset, 0));
        }
    }

    /// The mount point and the options the mount was made with.
    pub fn mount_info(&self) -> (&std::path::Path, &MountFacts) {
        (&self.mountpoint, &self.mount_options)
    }

    /// The normal user this root daemon mounts for (`--owner`), if any.
    pub fn owner(&self) -> Option<crate::sys::UserIds> {
        self.owner
    }

    /// Records the mount's device number, once, right after mounting.
    pub fn set_mount_dev(&self, dev: (u32, u32)) {
        let _ = self.mount_dev.set(dev);
    }

    /// The mount's device number, if the daemon found it when it mounted.
    pub fn mount_dev(&self) -> Option<(u32, u32)> {
        self.mount_dev.get().copied()
    }

    /// Why kernel passthrough is off, or `None` while it is on.
    pub fn passthrough_off_reason(&self) -> Option<&str> {
        if self.passthrough_enabled() {
            return None;
        }
        Some(self.passthrough_off.get().map_or("unknown", String::as_str))
    }

    /// The branches served under `.checkpoint/branches/`.
    pub fn branches(&self) -> &branch::BranchFs {
        &self.branches
    }

    /// The file-history system every change is recorded in.
    pub fn history(&self) -> &Arc<History> {
        self.gate.history()
    }

    /// Kernel passthrough could not be set up: serve IO in the daemon from now on.
    pub fn disable_passthrough(&self, why: &str) {
        if self.passthrough.swap(false, Ordering::Relaxed) {
            let _ = self.passthrough_off.set(why.to_string());
            warn!("kernel passthrough disabled: {why}; serving IO in the daemon");
        }
    }

    /// What the inode fd cache holds and did (inodes invariant 5).
    pub fn fd_stats(&self) -> inodes::FdStats {
        self.inodes.fd_stats()
    }

    /// Whether new opens of regular files get a kernel passthrough backing file.
    pub fn passthrough_enabled(&self) -> bool {
        self.passthrough.load(Ordering::Relaxed)
    }

    fn inode(&self, ino: u64) -> io::Result<Arc<Inode>> {
        // An unknown inode is a kernel/daemon disagreement, not a reason to die.
        self.inodes.get(ino).ok_or_else(|| errno(libc::ESTALE))
    }

    fn file_handle(&self, fh: u64) -> io::Result<Arc<Handle>> {
        self.handles.get(fh).ok_or_else(|| errno(libc::EBADF))
    }

    /// Rejects changes to the `.checkpoint` name at the root: it belongs to the mount.
    /// A branch's storage is the owner's state dir: users other than the owner and root
    /// may read a branch but not change it (`Budgets::check_branch_change`, EACCES).
    fn may_change_branch(&self, caller: &Caller) -> io::Result<()> {
        self.history().budgets().check_branch_change(caller.uid)
    }

    fn refuse_control_name(parent: &Inode, name: &OsStr) -> io::Result<()> {
        if parent.ino == ROOT_INO && name.as_bytes() == CONTROL_DIR_NAME {
            return Err(errno(libc::EPERM));
        }
        Ok(())
    }

    // ---- lookup / forget / attributes -------------------------------------------------

    /// Whether the kernel may decode file handles of this mount (FUSE_EXPORT_SUPPORT).
    pub fn exports(&self) -> bool {
        self.inodes.exports()
    }

    /// LOOKUP of `name` in `parent`, never following a symlink. Contract: on success the
    /// kernel holds one more lookup reference on the returned inode (released by
    /// [`PassthroughFs::forget`]); the inode table keeps the object's O_PATH fd (or the way
    /// to reopen it) until then. `.checkpoint` at the root is the virtual control directory.
    /// No change, so no gate.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> io::Result<Entry> {
        if branch::is_branch(parent) {
            return self.branches.lookup(self.history(), parent, name);
        }
        if virt::is_virtual(parent) {
            return self.virt.lookup(self, parent, name);
        }
        if parent == ROOT_INO && name.as_bytes() == CONTROL_DIR_NAME {
            return self.virt.control_dir_entry();
        }
        match name.as_bytes() {
            // Only the kernel's export operations send these (invariant 7 of the inode
            // table): a path walk resolves "." and ".." itself.
            b"." => {
                let (inode, st) = self.inodes.lookup_self(parent)?;
                return Ok(self.entry(&inode, &st));
            }
            b".." => {
                let (inode, st) = self.inodes.lookup_parent(parent)?;
                return Ok(self.entry(&inode, &st));
            }
            _ => {}
        }
        let parent = self.inode(parent)?;
        self.lookup_in(&parent, name)
    }

    fn lookup_in(&self, parent: &Arc<Inode>, name: &OsStr) -> io::Result<Entry> {
        with_name(name, |c| {
            // Open first, then stat the fd: two syscalls for an object not yet in the table
            // (the common case: a tree seen for the first time, or after the kernel dropped
            // its caches), and the stat is of the object we hold, whatever the name is now.
            let dir = parent.fd()?;
            let fd = self.inodes.retry_on_emfile(|| {
                sys::openat(dir.as_fd(), c, libc::O_PATH | libc::O_NOFOLLOW, 0)
            })?;
            drop(dir);
            let st = sys::fstat(fd.as_fd())?;
            let inode = self.inodes.lookup_or_insert(fd, &st, parent, c);
            Ok(self.entry(&inode, &st))
        })
    }

    /// Registers an object we just created through `fd` (any fd on it) as `name` in
    /// `parent`.
    fn adopt_created(
        &self,
        fd: BorrowedFd<'_>,
        parent: &Arc<Inode>,
        name: &std::ffi::CStr,
    ) -> io::Result<Entry> {
        let st = sys::fstat(fd)?;
        if let Some(inode) = self.inodes.lookup_known(&st, parent, name) {
            return Ok(self.entry(&inode, &st));
        }
        let path_fd = self
            .inodes
            .retry_on_emfile(|| sys::proc_reopen(fd.as_raw_fd(), libc::O_PATH))?;
        let inode = self.inodes.lookup_or_insert(path_fd, &st, parent, name);
        Ok(self.entry(&inode, &st))
    }

    fn entry(&self, inode: &Inode, st: &libc::stat) -> Entry {
        Entry {
            attr: attr_from_stat(inode.ino, st),
            ttl: TTL,
            generation: u64::from(inode.generation),
        }
    }

    /// FORGET: the kernel drops `nlookup` lookup references on `ino`; at zero the inode
    /// leaves the table and its fd is closed (outside the table's lock). Never fails.
    pub fn forget(&self, ino: u64, nlookup: u64) {
        if branch::is_branch(ino) {
            self.branches.forget(ino, nlookup);
        } else if virt::is_virtual(ino) {
            self.virt.forget(ino, nlookup);
        } else {
            self.inodes.forget(ino, nlookup);
        }
    }

    /// GETATTR: `fstat` of the handle `fh` if given (it survives an unlink), else of the
    /// inode's fd. Attributes are valid for [`TTL`].
    pub fn getattr(&self, ino: u64, fh: Option<u64>) -> io::Result<(FileAttr, Duration)> {
        if branch::is_branch(ino) {
            return self.branches.getattr(self.history(), ino, fh);
        }
        if virt::is_virtual(ino) {
            return self.virt.getattr(self, ino);
        }
        let inode = self.inode(ino)?;
        let st = match fh.and_then(|fh| self.handles.get(fh)) {
            Some(h) => match &*h {
                Handle::File(f) => sys::fstat(f.fd())?,
                Handle::Dir(_) => sys::fstat(inode.fd()?.as_fd())?,
            },
            None => sys::fstat(inode.fd()?.as_fd())?,
        };
        Ok((attr_from_stat(ino, &st), TTL))
    }

    /// SETATTR: chmod, chown, truncate and utimes in one request, in that order, through one
    /// [`gate::ObjectPermit`] (Layer 1 backs the object up first). `set.fh` names the handle
    /// the request came through: used for ftruncate/fchmod/futimens when it is on this
    /// inode. Clears setuid/setgid as the VFS would have (`privs`), judged on the mode
    /// before the change. Returns the attributes after the change.
    pub fn setattr(
        &self,
        caller: &Caller,
        ino: u64,
        set: SetAttr,
    ) -> io::Result<(FileAttr, Duration)> {
        if branch::is_branch(ino) {
            self.may_change_branch(caller)?;
            return self.branches.setattr(self.history(), ino, set);
        }
        if virt::is_virtual(ino) {
            return self.virt.setattr(ino, set);
        }
        let inode = self.inode(ino)?;
        let handle = match set.fh {
            Some(fh) => Some(self.file_handle(fh)?),
            None => None,
        };
        let handle_fd = match handle.as_deref() {
            Some(Handle::File(f)) => Some(f),
            _ => None,
        };
        let permit = self.gate.object_permit(caller, &inode)?;
        // Privilege dropping the kernel left to us (see `privs`), judged on the mode
        // before the change, as the VFS does.
        let to_drop = if set.mode.is_some() {
            0
        } else if set.is_empty() || set.size.is_some() {
            self.privs_to_drop(caller, &inode, privs::to_drop_on_write)?
        } else if set.uid.is_some() || set.gid.is_some() {
            self.privs_to_drop(caller, &inode, privs::to_drop_on_chown)?
        } else {
            0
        };
        if let Some(mode) = set.mode {
            permit.chmod(mode, handle_fd)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            permit.chown(set.uid.unwrap_or(u32::MAX), set.gid.unwrap_or(u32::MAX))?;
        }
        if let Some(size) = set.size {
            permit.truncate(size, handle_fd)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let times = [timespec_of(set.atime), timespec_of(set.mtime)];
            permit.set_times(&times, handle_fd)?;
        }
        permit.clear_mode_bits(to_drop)?;
        drop(permit);
        let st = sys::fstat(inode.fd()?.as_fd())?;
        Ok((attr_from_stat(ino, &st), TTL))
    }

    /// The setuid/setgid bits `caller` must lose on `inode` by the given rule; 0 without
    /// a `/proc` read for the files (nearly all) that carry neither bit.
    fn privs_to_drop(
        &self,
        caller: &Caller,
        inode: &Inode,
        rule: fn(u32, u32, &privs::Privilege) -> u32,
    ) -> io::Result<u32> {
        let st = sys::fstat(inode.fd()?.as_fd())?;
        if !privs::has_suidgid(st.st_mode) {
            return Ok(0);
        }
        Ok(rule(st.st_mode, st.st_gid, &privs::Privilege::of(caller)))
    }

    /// READLINK of a symlink inode (or a view's symlink). No change.
    pub fn readlink(&self, ino: u64) -> io::Result<Vec<u8>> {
        if branch::is_branch(ino) {
            return self.branches.readlink(self.history(), ino);
        }
        if virt::is_virtual(ino) {
            return self.virt.readlink(self, ino);
        }
        let inode = self.inode(ino)?;
        sys::readlinkat(inode.fd()?.as_fd(), sys::EMPTY)
    }

    // ---- namespace changes ---------------------------------------------------------------

    fn real_parent(&self, parent: u64) -> io::Result<Arc<Inode>> {
        if virt::is_virtual(parent) {
            return Err(errno(libc::EROFS));
        }
        self.inode(parent)
    }

    /// MKNOD of `name` in `parent` (fifo, socket, device; `umask` applied as SRC's
    /// filesystem does under FUSE_DONT_MASK), as the caller's fs uid/gid. The gate backs up
    /// the name (its absence) first. On success the kernel holds one lookup reference on
    /// the new inode.
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u64,
    ) -> io::Result<Entry> {
        if branch::is_branch(parent) {
            self.may_change_branch(caller)?;
            return self
                .branches
                .mknod(self.history(), caller, parent, name, mode, umask, rdev);
        }
        self.create_entry(caller, parent, name, false, &|permit| {
            sys::with_umask(umask, mode, |mode| permit.mknod(mode, rdev))
        })
    }

    /// MKDIR of `name` in `parent`, as the caller's fs uid/gid; the gate records the name's
    /// absence first (as a directory, for the exclusion rules). One lookup reference on
    /// success.
    pub fn mkdir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        if branch::is_branch(parent) {
            self.may_change_branch(caller)?;
            return self
                .branches
                .mkdir(self.history(), caller, parent, name, mode, umask);
        }
        self.create_entry(caller, parent, name, true, &|permit| {
            sys::with_umask(umask, mode, |mode| permit.mkdir(mode))
        })
    }

    /// SYMLINK `name` → `target` in `parent`, as the caller's fs uid/gid; the gate records
    /// the name's absence first. One lookup reference on success.
    pub fn symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
    ) -> io::Result<Entry> {
        if branch::is_branch(parent) {
            self.may_change_branch(caller)?;
            return self
                .branches
                .symlink(self.history(), caller, parent, name, target);
        }
        let target = std::ffi::CString::new(target.as_os_str().as_bytes())
            .map_err(|_| errno(libc::EINVAL))?;
        self.create_entry(caller, parent, name, false, &|permit| {
            permit.symlink(&target)
        })
    }

    /// The shared path of mknod, mkdir and symlink: gate the new name, create it with the
    /// caller's fs uid/gid (so it belongs to them), then look it up for the kernel.
    fn create_entry(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        is_dir: bool,
        make: &dyn Fn(&gate::EntryPermit<'_>) -> io::Result<()>,
    ) -> io::Result<Entry> {
        let parent = self.real_parent(parent)?;
        Self::refuse_control_name(&parent, name)?;
        with_name(name, |c| {
            let permit = self.gate.entry_permit(caller, &parent, c, is_dir)?;
            {
                let _creds = FsCredsGuard::switch(caller.uid, caller.gid);
                make(&permit)?;
            }
            drop(permit);
            self.lookup_in(&parent, name)
        })
    }

    /// LINK: a new name `new_name` in `new_parent` for inode `ino`. The gate records the
    /// new name's absence first (the object itself does not change). One lookup reference
    /// on success.
    pub fn link(
        &self,
        caller: &Caller,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
    ) -> io::Result<Entry> {
        if branch::is_branch(ino) || branch::is_branch(new_parent) {
            if !(branch::is_branch(ino) && branch::is_branch(new_parent)) {
                return Err(errno(libc::EXDEV));
            }
            self.may_change_branch(caller)?;
            return self
                .branches
                .link(self.history(), ino, new_parent, new_name);
        }
        if virt::is_virtual(ino) {
            return Err(errno(libc::EROFS));
        }
        let inode = self.inode(ino)?;
        let new_parent = self.real_parent(new_parent)?;
        Self::refuse_control_name(&new_parent, new_name)?;
        with_name(new_name, |c| {
            let permit = self.gate.link_permit(caller, &inode, &new_parent, c)?;
            permit.link(&inode)?;
            drop(permit);
            self.lookup_in(&new_parent, new_name)
        })
    }

    /// UNLINK `name` in `parent`: the gate backs up what the name holds first (Layer 1
    /// pre-image), then the name goes. Lookup references are the kernel's to drop.
    pub fn unlink(&self, caller: &Caller, parent: u64, name: &OsStr) -> io::Result<()> {
        self.remove(caller, parent, name, 0)
    }

    /// RMDIR `name` in `parent`: as [`PassthroughFs::unlink`], for an (empty) directory.
    pub fn rmdir(&self, caller: &Caller, parent: u64, name: &OsStr) -> io::Result<()> {
        self.remove(caller, parent, name, libc::AT_REMOVEDIR)
    }

    fn remove(&self, caller: &Caller, parent: u64, name: &OsStr, flags: i32) -> io::Result<()> {
        if branch::is_branch(parent) {
            self.may_change_branch(caller)?;
            let is_dir = flags & libc::AT_REMOVEDIR != 0;
            return self.branches.remove(self.history(), parent, name, is_dir);
        }
        let parent = self.real_parent(parent)?;
        Self::refuse_control_name(&parent, name)?;
        with_name(name, |c| {
            if flags & libc::AT_REMOVEDIR != 0 {
                return self.gate.entry_permit(caller, &parent, c, true)?.remove();
            }
            // One stat of the name serves both uses: a file the kernel knows under other
            // names too (a hard link) has those backed up as well, since their link count
            // changes; and where the table tracks names, the entry keeps a name that stays.
            let st = parent
                .fd()
                .ok()
                .and_then(|dir| sys::fstatat(dir.as_fd(), c, libc::AT_SYMLINK_NOFOLLOW).ok());
            let object = st.as_ref().and_then(|st| self.inodes.linked_entry(st));
            let permit = self
                .gate
                .removal_permit(caller, &parent, c, object.as_deref())?;
            if self.inodes.tracks_names()
                && let Some(st) = &st
            {
                self.inodes.name_going(st, &parent, c);
            }
            permit.remove()
        })
    }

    /// RENAME `name` in `parent` to `new_name` in `new_parent` with `flags`
    /// (RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT, passed to renameat2 as given).
    /// The gate records both names first; a moved directory's tracked subtree is recorded
    /// under both (never walking a symlink). The inode table's origins follow the move
    /// (and the exchange). `.checkpoint` at the root can be neither source nor target.
    pub fn rename(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        if branch::is_branch(parent) || branch::is_branch(new_parent) {
            if !(branch::is_branch(parent) && branch::is_branch(new_parent)) {
                return Err(errno(libc::EXDEV));
            }
            self.may_change_branch(caller)?;
            return self
                .branches
                .rename(self.history(), parent, name, new_parent, new_name, flags);
        }
        let parent = self.real_parent(parent)?;
        let new_parent = self.real_parent(new_parent)?;
        Self::refuse_control_name(&parent, name)?;
        Self::refuse_control_name(&new_parent, new_name)?;
        with_name(name, |from| {
            with_name(new_name, |to| {
                let permit =
                    self.gate
                        .rename_permit(caller, (&parent, from), (&new_parent, to), flags)?;
                let (dir, new_dir) = permit.dirs();
                let stat = |d, n| sys::fstatat(d, n, libc::AT_SYMLINK_NOFOLLOW);
                // The objects involved, for their origins (inodes invariant 4).
                let (moved, target) = (stat(dir, from).ok(), stat(new_dir, to).ok());
                let exchange = flags & libc::RENAME_EXCHANGE != 0;
                if let Some(st) = &target
                    && !exchange
                    && self.inodes.tracks_names()
                {
                    self.inodes.name_going(st, &new_parent, to);
                }
                permit.rename()?;
                if let Some(st) = &moved {
                    self.inodes.renamed(st, &new_parent, to);
                }
                if let Some(st) = target.as_ref().filter(|_| exchange) {
                    self.inodes.renamed(st, &parent, from);
                }
                Ok(())
            })
        })
    }

    // ---- files ----------------------------------------------------------------------------

    /// Flags for our own fd: O_CREAT/O_EXCL were handled by the kernel or `create`; O_DIRECT
    /// is left to the kernel (it would make our unaligned buffers fail) and signalled with
    /// FOPEN_DIRECT_IO instead.
    ///
    /// O_APPEND is the kernel's too: it turns every append into a WRITE at its idea of EOF,
    /// so our pwrite must land exactly at the offset it sends. With O_APPEND on our fd, Linux
    /// pwrite ignores the offset and appends — which breaks the writes the kernel sends for
    /// a shared mapping's dirty pages (at the page's offset) through an O_APPEND handle. (With
    /// kernel passthrough the backing file is reopened with the caller's flags anyway.)
    fn own_flags(flags: i32) -> i32 {
        flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT | libc::O_APPEND)
    }

    fn can_write(flags: i32) -> bool {
        flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
    }

    /// OPEN of inode `ino` with `flags`. An open that can write or truncate passes the gate
    /// (an [`gate::ObjectPermit`]: Layer 1 backs the file up first) and yields the handle's
    /// [`gate::WritableFd`]; a read-only open does not. With kernel passthrough a regular
    /// file also gets a backing id (`make_backing`), shared by the inode's handles.
    pub fn open(
        &self,
        caller: &Caller,
        ino: u64,
        flags: i32,
        make_backing: MakeBacking<'_>,
    ) -> io::Result<Opened> {
        if branch::is_branch(ino) {
            if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
                self.may_change_branch(caller)?;
            }
            return self.branches.open(self.history(), ino, flags);
        }
        if virt::is_virtual(ino) {
            return self.virt.open(self, ino, flags);
        }
        let inode = self.inode(ino)?;
        let pin = inode.pin();
        let own = Self::own_flags(flags);
        let writable = Self::can_write(flags);
        let path = inode.fd()?;
        let retry = |f: &dyn Fn() -> io::Result<OwnedFd>| self.inodes.retry_on_emfile(f);
        let (fd, writes_rules) = if writable {
            let permit = self.gate.object_permit(caller, &inode)?;
            let fd = self
                .inodes
                .retry_on_emfile(|| permit.open_for_writing(own))?;
            (HandleFd::Writable(fd), permit.touches_rules())
        } else {
            let noatime = self.mount_options.read_only;
            let fd = retry(&|| sys::reopen_readonly_like(path.as_raw_fd(), own, noatime))?;
            (HandleFd::ReadOnly(fd), false)
        };
        drop(path);
        self.finish_open(pin, fd, flags, writes_rules, Some(make_backing))
    }

    /// `writes_rules`: the gate found the file to be one the exclusion rules are read from
    /// (see `Opened::flush_on_close`).
    fn finish_open(
        &self,
        pin: inodes::Pin,
        fd: HandleFd,
        flags: i32,
        writes_rules: bool,
        make_backing: Option<MakeBacking<'_>>,
    ) -> io::Result<Opened> {
        let inode = pin.inode().clone();
        let writable = matches!(fd, HandleFd::Writable(_));
        let backing = match make_backing {
            Some(make) if inode.is_regular() && self.passthrough_enabled() => {
                self.backing_for(&inode, fd.as_fd(), make)
            }
            _ => None,
        };
        let passthrough = backing.is_some();
        // Only a handle open for reading and writing can carry a shared writable mapping
        // (mmap(2) wants FMODE_READ for any mapping, FMODE_WRITE for a shared writable one:
        // EACCES otherwise). A write-only handle changes data by write(2) alone, after which
        // the kernel drops the cached attributes itself; so it needs no FLUSH, which would
        // cost every `>>`/`>` redirection and every first write a round trip at close(2).
        let can_map_writable = flags & libc::O_ACCMODE == libc::O_RDWR;
        let direct_io = flags & libc::O_DIRECT != 0 && backing.is_none();
        // The kernel's page cache across opens, when the daemon serves the reads: a read it
        // answers never reaches SRC, so under `strictatime` (every read updates atime) each
        // open starts uncached instead.
        let keep_cache = backing.is_none() && !self.mount_options.strict_atime;
        let fh = self.handles.insert(Handle::File(FileHandle::new(
            fd,
            inode,
            pin,
            backing.clone(),
        )));
        Ok(Opened {
            fh,
            backing,
            direct_io,
            keep_cache,
            flush_on_close: writes_rules || (writable && can_map_writable && passthrough),
        })
    }

    /// The inode's backing id, registering `fd` as the backing file if it has none.
    fn backing_for(
        &self,
        inode: &Inode,
        fd: BorrowedFd<'_>,
        make_backing: MakeBacking<'_>,
    ) -> Option<Arc<dyn BackingFile>> {
        let mut slot = inode.backing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = slot.as_ref().and_then(|w| w.upgrade()) {
            return Some(existing);
        }
        match make_backing(fd) {
            Ok(id) => {
                *slot = Some(Arc::downgrade(&id));
                Some(id)
            }
            Err(e) => {
                self.disable_passthrough(&format!("FUSE_DEV_IOC_BACKING_OPEN failed: {e}"));
                None
            }
        }
    }

    /// CREATE: `name` in `parent`, created and opened with `flags` as the caller's fs
    /// uid/gid. The gate records the name's absence first. One lookup reference on the new
    /// inode, and a writable handle as [`PassthroughFs::open`] gives.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        make_backing: MakeBacking<'_>,
    ) -> io::Result<(Entry, Opened)> {
        self.create_with(
            caller,
            parent,
            name,
            (mode, umask),
            flags,
            Some(make_backing),
        )
    }

    /// CREATE for the daemon's own use (a rewind): as [`PassthroughFs::create`], never
    /// with a kernel backing file.
    pub fn create_unbacked(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(Entry, Opened)> {
        self.create_with(caller, parent, name, (mode, 0), flags, None)
    }

    fn create_with(
        &self,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        (mode, umask): (u32, u32),
        flags: i32,
        make_backing: Option<MakeBacking<'_>>,
    ) -> io::Result<(Entry, Opened)> {
        if branch::is_branch(parent) {
            self.may_change_branch(caller)?;
            return self
                .branches
                .create(self.history(), caller, parent, name, mode, umask, flags);
        }
        let parent = self.real_parent(parent)?;
        Self::refuse_control_name(&parent, name)?;
        with_name(name, |c| {
            let own =
                Self::own_flags(flags) | libc::O_CREAT | (flags & libc::O_EXCL) | libc::O_NOFOLLOW;
            let (fd, writes_rules) = {
                let permit = self.gate.entry_permit(caller, &parent, c, false)?;
                let _creds = FsCredsGuard::switch(caller.uid, caller.gid);
                let fd = self.inodes.retry_on_emfile(|| {
                    sys::with_umask(umask, mode, |mode| permit.create(own, mode))
                })?;
                (fd, permit.touches_rules())
            };
            let entry = self.adopt_created(fd.as_fd(), &parent, c)?;
            let pin = self.inode(entry.attr.ino.0)?.pin();
            let fd = HandleFd::Writable(fd);
            let opened = self.finish_open(pin, fd, flags, writes_rules, make_backing)?;
            Ok((entry, opened))
        })
    }

    /// READ of up to `size` bytes at `offset` through handle `fh` into `out` (shorter at
    /// EOF). No change.
    pub fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        if branch::is_branch(fh) {
            return self.branches.read(fh, offset, size, out);
        }
        if virt::is_virtual(ino) {
            return self.virt.read(self, ino, fh, offset, size, out);
        }
        let handle = self.file_handle(fh)?;
        let Handle::File(f) = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        out.resize(size as usize, 0);
        let mut filled = 0;
        while filled < out.len() {
            let n = sys::pread(f.fd(), &mut out[filled..], offset + filled as u64)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        out.truncate(filled);
        Ok(())
    }

    /// WRITE of `data` at `offset` through handle `fh`, which must have been opened for
    /// writing through the gate (its [`gate::WritableFd`]; EBADF otherwise). No backup of its
    /// own: the open was gated, and a checkpoint captures files open for writing. With
    /// `kill_suidgid`, clears setuid/setgid as the VFS would. Writes to `ctl` take checkpoint
    /// ids (see `virt`).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
        lock_owner: Option<u64>,
    ) -> io::Result<u32> {
        if branch::is_branch(fh) {
            return self.branches.write(fh, offset, data);
        }
        if virt::is_virtual(ino) {
            return self
                .virt
                .write(self, caller, ino, fh, offset, data, lock_owner);
        }
        let handle = self.file_handle(fh)?;
        let Handle::File(f) = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        let file = f.writable().ok_or_else(|| errno(libc::EBADF))?;
        let permit = self.gate.write_permit(file, &f.inode)?;
        if kill_suidgid {
            let to_drop = self.privs_to_drop(caller, &f.inode, privs::to_drop_on_write)?;
            permit.clear_mode_bits(to_drop)?;
        }
        let mut written = 0;
        while written < data.len() {
            let n = permit.pwrite(&data[written..], offset + written as u64)?;
            if n == 0 {
                break;
            }
            written += n;
        }
        Ok(written as u32)
    }

    /// FLUSH, at every close(2) of a handle opened with `flush_on_close`; close(2) waits for
    /// it (RELEASE may come later). For `ctl`, takes a last line without its newline. Returns
    /// whether the kernel's cached attributes of the inode must be dropped (the adapter tells
    /// the kernel before replying): the handle can write through kernel passthrough, where a
    /// write through a shared mapping goes to SRC's page cache without the FUSE inode hearing
    /// of it, so the mtime/ctime SRC's filesystem set at the page fault would otherwise stay
    /// hidden behind the day-long attribute timeout (xfstests generic/080, 215). write(2)
    /// through passthrough needs none of this: the kernel invalidates them itself; so a
    /// write-only handle, which cannot be mapped, is opened without FLUSH (`Opened`).
    pub fn flush(&self, _ino: u64, fh: u64, lock_owner: u64) -> io::Result<bool> {
        // Nothing buffered in the daemon but a `ctl` line without its newline; POSIX locks
        // are handled by the kernel.
        if branch::is_branch(fh) {
            return Ok(false);
        }
        if virt::is_virtual_handle(fh) {
            return self.virt.flush(self, fh, lock_owner).map(|()| false);
        }
        let Some(handle) = self.handles.get(fh) else {
            return Ok(false);
        };
        self.written_file_closed(&handle);
        Ok(matches!(&*handle, Handle::File(f) if f.is_writable() && f.backing.is_some()))
    }

    /// Data written through a handle is final once it is closed: that is when a written
    /// `.gitignore` changes the exclusion rules (its open only announced the change).
    fn written_file_closed(&self, handle: &Handle) {
        if let Handle::File(f) = handle
            && f.is_writable()
            && let Some(rel) = self.rules_file(&f.inode)
        {
            self.gate.history().exclusion_rules_changed(&rel);
        }
    }

    /// The path of `inode` if the exclusion rules are read from it (a `.gitignore` under
    /// --respect-gitignore).
    fn rules_file(&self, inode: &Inode) -> Option<Vec<u8>> {
        let history = self.gate.history();
        if !history.exclusions().uses_git_rules() {
            return None;
        }
        let rel = self.gate.rel_path_of(inode).ok()??;
        history
            .exclusion_rules_depend_on(&rel, false)
            .then_some(rel)
    }

    /// RELEASE of handle `fh`: the handle and its fd go. A written exclusion-rules file
    /// (`.gitignore`) takes effect here at the latest. Never fails.
    pub fn release(&self, fh: u64) {
        if branch::is_branch(fh) {
            self.branches.release(fh);
            return;
        }
        if virt::is_virtual_handle(fh) {
            self.virt.release(self, fh);
            return;
        }
        if let Some(handle) = self.handles.remove(fh) {
            // Also here: a mapping can still write after the last close.
            self.written_file_closed(&handle);
        }
    }

    /// FSYNC / FSYNCDIR of handle `fh` (fdatasync with `datasync`). No change to content.
    pub fn fsync(&self, fh: u64, datasync: bool) -> io::Result<()> {
        if branch::is_branch(fh) {
            return self.branches.fsync(fh, datasync);
        }
        if virt::is_virtual_handle(fh) {
            return Ok(());
        }
        match &*self.file_handle(fh)? {
            Handle::File(f) => sys::fsync(f.fd(), datasync),
            Handle::Dir(d) => {
                let stream = d.stream.lock().unwrap_or_else(|p| p.into_inner());
                // SAFETY: the stream's fd stays open while we hold the lock.
                sys::fsync(unsafe { BorrowedFd::borrow_raw(stream.fd()) }, datasync)
            }
        }
    }

    /// FALLOCATE through the writable handle `fh` (EBADF if it is not one): gated as a
    /// write.
    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> io::Result<()> {
        if branch::is_branch(fh) {
            return self.branches.fallocate(fh, offset, length, mode);
        }
        let handle = self.file_handle(fh)?;
        let Handle::File(f) = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        let file = f.writable().ok_or_else(|| errno(libc::EBADF))?;
        let permit = self.gate.write_permit(file, &f.inode)?;
        permit.fallocate(mode, offset, length)
    }

    /// LSEEK (SEEK_DATA/SEEK_HOLE included) on handle `fh`. No change.
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> io::Result<i64> {
        if branch::is_branch(fh) {
            return self.branches.lseek(fh, offset, whence);
        }
        if virt::is_virtual_handle(fh) {
            return self.virt.lseek(fh, offset, whence);
        }
        let handle = self.file_handle(fh)?;
        let Handle::File(f) = &*handle else {
            return Err(errno(libc::EISDIR));
        };
        sys::lseek(f.fd(), offset, whence)
    }

    /// COPY_FILE_RANGE from handle `fh_in` into the writable handle `fh_out` (EBADF if it is
    /// not one): gated as a write to `fh_out`. At most what a u32 reply can count.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
        flags: u32,
    ) -> io::Result<u32> {
        // The kernel copies through reads and writes instead (vfs_copy_file_range falls
        // back on EOPNOTSUPP).
        if branch::is_branch(fh_in) || branch::is_branch(fh_out) {
            return Err(errno(libc::EOPNOTSUPP));
        }
        let h_in = self.file_handle(fh_in)?;
        let h_out = self.file_handle(fh_out)?;
        let (Handle::File(fin), Handle::File(fout)) = (&*h_in, &*h_out) else {
            return Err(errno(libc::EISDIR));
        };
        let file = fout.writable().ok_or_else(|| errno(libc::EBADF))?;
        let permit = self.gate.write_permit(file, &fout.inode)?;
        // The reply carries a u32 count; ask for no more than fits.
        let len = len.min(u64::from(!0xfffu32));
        let n = permit.copy_from(fin.fd(), (offset_in, offset_out), len, flags)?;
        Ok(n as u32)
    }

    // ---- directories ------------------------------------------------------------------------

    /// OPENDIR: a directory handle with its own stream. No change.
    pub fn opendir(&self, ino: u64) -> io::Result<OpenedDir> {
        if branch::is_branch(ino) {
            return Ok(OpenedDir {
                fh: self.branches.opendir(self.history(), ino)?,
                cache_listing: false,
            });
        }
        if virt::is_virtual(ino) {
            // The control directories change with every checkpoint without the kernel
            // seeing it, and views are snapshots the daemon builds at each open: neither is
            // cached (see `virt`'s TTLs).
            let fh = self.virt.opendir(self, ino)?;
            return Ok(OpenedDir {
                fh,
                cache_listing: false,
            });
        }
        let inode = self.inode(ino)?;
        let pin = inode.pin();
        let path = inode.fd()?;
        let stream = self
            .inodes
            .retry_on_emfile(|| sys::DirStream::open(path.as_fd(), self.mount_options.read_only))?;
        drop(path);
        let fh = self.handles.insert(Handle::Dir(DirHandle {
            inode,
            _pin: pin,
            stream: std::sync::Mutex::new(stream),
        }));
        Ok(OpenedDir {
            fh,
            cache_listing: true,
        })
    }

    /// Lists entries after `offset`. `emit` returns `true` when the reply is full; the entry
    /// it was given was then *not* sent.
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>) -> bool,
    ) -> io::Result<()> {
        if branch::is_branch(ino) {
            return self.branches.readdir(ino, fh, offset, &mut |e| emit(e));
        }
        if virt::is_virtual(ino) {
            return self.virt.readdir(self, ino, fh, offset, &mut |e| emit(e));
        }
        self.each_entry(fh, offset, &mut |_, out| Ok(emit(out)))
    }

    /// The d_ino to report for entry `name` (SRC's inode number `src_ino`) of `dir`: the
    /// FUSE inode number `stat` through the mount shows. That is SRC's own number for most
    /// objects (see [`inodes`]); a remapped object has its number once the table knows it.
    /// `.` and `..` are the directory's and its parent's (the root's at the root).
    fn dirent_ino(&self, dir: &Inode, name: &[u8], src_ino: u64) -> u64 {
        match name {
            b"." => dir.ino,
            b".." if dir.ino == ROOT_INO => ROOT_INO,
            b".." => dir
                .fd()
                .and_then(|fd| sys::fstatat(fd.as_fd(), c"..", libc::AT_SYMLINK_NOFOLLOW))
                .ok()
                .and_then(|st| self.inodes.known_ino(inodes::ObjectKey::of(&st)))
                .unwrap_or(src_ino),
            _ => self
                .inodes
                .known_ino(inodes::ObjectKey {
                    dev: dir.key.dev,
                    ino: src_ino,
                })
                .unwrap_or(src_ino),
        }
    }

    /// Like `readdir`, with a lookup for every entry but `.` and `..`. `emit` gets the entry
    /// (None for the dot entries) and returns `true` when full, in which case the lookup it
    /// was given is undone.
    pub fn readdirplus(
        &self,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>, Option<&Entry>) -> bool,
    ) -> io::Result<()> {
        if branch::is_branch(ino) {
            return self
                .branches
                .readdirplus(self.history(), ino, fh, offset, emit);
        }
        if virt::is_virtual(ino) {
            return self.virt.readdirplus(self, ino, fh, offset, emit);
        }
        self.each_entry(fh, offset, &mut |dir, out| {
            if out.name == b"." || out.name == b".." {
                return Ok(emit(out, None));
            }
            let entry = match self.lookup_in(dir, OsStr::from_bytes(out.name)) {
                Ok(entry) => entry,
                // Raced with an unlink: skip it, as a later readdir would.
                Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
                Err(err) => return Err(err),
            };
            let full = emit(out, Some(&entry));
            if full {
                self.inodes.forget(entry.attr.ino.0, 1);
            }
            Ok(full)
        })
    }

    /// Walks directory handle `fh` from `offset`, hiding `.checkpoint` at the root, until
    /// `each` returns `true` (the reply is full) or the directory ends.
    fn each_entry(
        &self,
        fh: u64,
        offset: i64,
        each: &mut dyn FnMut(&Arc<Inode>, DirEntryOut<'_>) -> io::Result<bool>,
    ) -> io::Result<()> {
        let handle = self.file_handle(fh)?;
        let Handle::Dir(d) = &*handle else {
            return Err(errno(libc::ENOTDIR));
        };
        let hide_control = d.inode.ino == ROOT_INO;
        let mut stream = d.stream.lock().unwrap_or_else(|p| p.into_inner());
        stream.seek(offset);
        while let Some(e) = stream.next_entry()? {
            if hide_control && e.name == CONTROL_DIR_NAME {
                continue;
            }
            let out = DirEntryOut {
                ino: self.dirent_ino(&d.inode, e.name, e.ino),
                offset: e.offset,
                kind: kind_from_dtype(e.d_type),
                name: e.name,
            };
            if each(&d.inode, out)? {
                break;
            }
        }
        Ok(())
    }

    /// RELEASEDIR: the directory handle goes. Never fails.
    pub fn releasedir(&self, fh: u64) {
        self.release(fh);
    }

    // ---- misc ------------------------------------------------------------------------------

    /// STATFS of SRC's filesystem.
    pub fn statfs(&self) -> io::Result<libc::statvfs> {
        let root = self.inode(ROOT_INO)?;
        sys::fstatvfs(root.fd()?.as_fd())
    }

    /// ACCESS check of `mask` on `ino` (only asked without `default_permissions`). No change.
    pub fn access(&self, ino: u64, mask: i32) -> io::Result<()> {
        if branch::is_branch(ino) {
            return Ok(());
        }
        if virt::is_virtual(ino) {
            return self.virt.access(ino, mask);
        }
        let inode = self.inode(ino)?;
        sys::with_proc_path(inode.fd()?.as_raw_fd(), |p| {
            sys::faccessat(
                // SAFETY: AT_FDCWD is a valid "fd" for *at calls.
                unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
                p,
                mask,
                libc::AT_EACCESS,
            )
        })
    }

    /// Runs `f` with the path an xattr call reaches `inode` by (see [`sys::XattrPath`]). A
    /// symlink is reached through its origin's parent directory and name (inodes invariant
    /// 4), accepted only if the object there is this entry's (`(st_dev, st_ino)` checked
    /// just before; a rename racing that check is the window left, since no fd-based xattr
    /// call takes a symlink); otherwise ESTALE, as a failed reopen would be.
    fn xattr_name(name: &OsStr) -> io::Result<std::ffi::CString> {
        std::ffi::CString::new(name.as_bytes()).map_err(|_| errno(libc::EINVAL))
    }

    /// GETXATTR `name` of `ino` into `buf` (size query when `buf` is empty); a symlink's own
    /// xattrs, not its target's. No change.
    pub fn getxattr(&self, ino: u64, name: &OsStr, buf: &mut [u8]) -> io::Result<usize> {
        if branch::is_branch(ino) {
            return Err(errno(libc::ENODATA));
        }
        if virt::is_virtual(ino) {
            return self.virt.getxattr(self, ino, name, buf);
        }
        let inode = self.inode(ino)?;
        let name = Self::xattr_name(name)?;
        inode.with_xattr_path(|at| sys::getxattr(at, &name, buf))
    }

    /// LISTXATTR of `ino` into `buf` (size query when `buf` is empty). No change.
    pub fn listxattr(&self, ino: u64, buf: &mut [u8]) -> io::Result<usize> {
        if branch::is_branch(ino) {
            return Ok(0);
        }
        if virt::is_virtual(ino) {
            return self.virt.listxattr(self, ino, buf);
        }
        let inode = self.inode(ino)?;
        inode.with_xattr_path(|at| sys::listxattr(at, buf))
    }

    /// SETXATTR `name` on `ino` through an [`gate::ObjectPermit`] (the object is backed up
    /// first). Setting `system.posix_acl_access` may change the mode: setuid/setgid are
    /// then cleared as the VFS would.
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> io::Result<()> {
        if branch::is_branch(ino) {
            return Err(errno(libc::EOPNOTSUPP));
        }
        if virt::is_virtual(ino) {
            return Err(errno(libc::EROFS));
        }
        let inode = self.inode(ino)?;
        let name = Self::xattr_name(name)?;
        let permit = self.gate.object_permit(caller, &inode)?;
        permit.setxattr(&name, value, flags)?;
        // SRC's filesystem has set the mode from the ACL, judging the daemon's privilege.
        if name.as_bytes() == b"system.posix_acl_access" {
            let to_drop = self.privs_to_drop(caller, &inode, privs::to_drop_on_acl)?;
            permit.clear_mode_bits(to_drop)?;
        }
        Ok(())
    }

    /// REMOVEXATTR `name` from `ino` through an [`gate::ObjectPermit`].
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> io::Result<()> {
        if branch::is_branch(ino) {
            return Err(errno(libc::ENODATA));
        }
        if virt::is_virtual(ino) {
            return Err(errno(libc::EROFS));
        }
        let inode = self.inode(ino)?;
        let name = Self::xattr_name(name)?;
        let permit = self.gate.object_permit(caller, &inode)?;
        permit.removexattr(&name)
    }

    /// Paths (relative to the mount root) of files currently open for writing: a
    /// checkpoint must copy these at once, since their data can change at any moment.
    pub fn paths_open_for_write(&self) -> Vec<Vec<u8>> {
        self.handles
            .writable_inodes()
            .iter()
            .flat_map(|inode| self.gate.rel_paths_of(inode).unwrap_or_default())
            .collect()
    }

    /// Takes checkpoint `id` (Layer 2) for agent session `session` (`None`: outside any):
    /// excludes every mutation while the history records the consistent state, then lets
    /// background copying finish the rest.
    pub fn checkpoint(&self, id: &str, session: Option<String>) -> io::Result<()> {
        // Files open for writing are copied first, outside the epoch lock, so that copying a
        // big one does not stall every writer; under the lock only the copies of files
        // written meanwhile are made again (see history::open_files).
        let pre_copies = self.history().precopy_open(&self.paths_open_for_write());
        {
            let quiesced = self.history().quiesce();
            let open_for_write = self.paths_open_for_write();
            quiesced.make_checkpoint(id, session.clone(), &open_for_write, pre_copies)?;
        }
        match &session {
            Some(s) => info!("checkpoint {id} (session {s})"),
            None => info!("checkpoint {id}"),
        }
        Ok(())
    }

    /// Runs gc: planned with mutations running, then every mutation and checkpoint excluded
    /// until the transcript is compacted and the unreferenced objects removed; the packs
    /// that held them are rewritten with mutations running again (see `History::gc`).
    pub fn gc(
        &self,
        retention: crate::history::gc::Retention,
        dry_run: bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> io::Result<crate::history::gc::GcReport> {
        self.history().gc(retention, dry_run, progress)
    }
}

pub fn attr_from_stat(ino: u64, st: &libc::stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: system_time(st.st_atime, st.st_atime_nsec),
        mtime: system_time(st.st_mtime, st.st_mtime_nsec),
        ctime: system_time(st.st_ctime, st.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: kind_from_mode(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

pub fn system_time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(nsec as u64)
    }
}

pub fn kind_from_mode(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn kind_from_dtype(d_type: u8) -> FileType {
    match d_type {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn timespec_of(t: Option<TimeOrNow>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => libc::timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            },
            Err(before) => {
                let d = before.duration();
                let mut sec = -(d.as_secs() as i64);
                let mut nsec = i64::from(d.subsec_nanos());
                if nsec > 0 {
                    sec -= 1;
                    nsec = 1_000_000_000 - nsec;
                }
                libc::timespec {
                    tv_sec: sec,
                    tv_nsec: nsec,
                }
            }
        },
    }
}
