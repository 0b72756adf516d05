//! The inode table: FUSE inode numbers → objects in SRC, reached through O_PATH file
//! descriptors that are cached within a budget and reopened on demand.
//!
//! Invariants:
//! 1. An entry exists exactly while the kernel holds lookups on it (`lookups > 0`), except
//!    the root, which is never forgotten. `lookup`/`create`/`mkdir`/`readdirplus` entries add
//!    one; `forget(n)` subtracts n; at zero the entry goes.
//! 2. Objects are identified by `(st_dev, st_ino)`; one entry per object, so hard links share
//!    an inode number. An entry found for a key whose object has a different type is a new
//!    object that reused the number (the old one was freed while its fd was given back, see
//!    5): it gets a new entry and number, the old entry stays for the kernel until forgotten.
//! 3. The FUSE inode number of an object on SRC's own filesystem is its inode number there,
//!    so `st_ino` through MNT equals SRC's, and stays the same when the kernel forgets an
//!    object and looks it up again (tools keep inode numbers: git's index, `find -inum`,
//!    hard-link detection in tar/rsync/du), and plain READDIR's d_ino (SRC's) agrees with
//!    it. Objects elsewhere (mounts inside SRC), or whose number would collide with the
//!    root's [`ROOT_INO`], a reserved bit or a live entry (2), get a [`REMAPPED_BIT`]
//!    number, remembered for the daemon's lifetime so that it is stable too. FUSE allows
//!    reusing a node id after FORGET, so generation is always 0.
//! 4. Every entry can reopen its object without a cached fd (its *origin*): the parent
//!    entry and the name it was last looked up, created or renamed under (all through this
//!    mount, so the table sees every change of it), and, where the daemon has
//!    CAP_DAC_READ_SEARCH (root) and SRC's filesystem supports it, a kernel file handle
//!    taken from the fd before it is given back, opened with `open_by_handle_at` as
//!    virtiofsd does. A directory is reopened by its handle first, anything else by parent
//!    and name first, each way the other's fallback: a non-directory decoded from a handle
//!    while its dentry is not cached (memory pressure reclaims them) is disconnected, an
//!    fd without a path, and the gate needs the path (issue 28); the kernel connects a
//!    decoded directory. A reopen through the parent and name is accepted only if the
//!    fd's `(st_dev, st_ino)` and type are the entry's and, where the entry has a file
//!    handle, the fd's handle is the same (the same generation: not a new object under a
//!    reused number). If neither way finds the object the reopen fails with ESTALE, which
//!    is right only when the object is gone. By parent and name alone (no file handles),
//!    two cases keep that true: a rename through the mount re-points the moved object's
//!    origin, and when the origin name of an object with other links is unlinked or
//!    renamed over, the entry keeps its fd (it is never given back) until a lookup under
//!    another name gives it a new origin. The root's fd is never given back.
//! 5. The cached O_PATH fds are bounded by a budget: half the soft RLIMIT_NOFILE minus a
//!    reserve, leaving the rest to open handles, the store, the transcript and the FUSE
//!    channels. Over budget, the least recently used fds of idle entries (no open handle,
//!    not the root, not kept by 4) are given back in a batch. A request holds the fd it
//!    uses as an `Arc<OwnedFd>` ([`Inode::fd`]), so giving it back only drops the cache's
//!    reference and never closes an fd under a request. An open that still fails with
//!    EMFILE/ENFILE gives back half the cache and is retried once.
//! 6. An entry with an open handle keeps its fd (a handle pins it, see [`Inode::pin`]): the
//!    object may be unlinked, and the gate still needs the fd to see that.
//! 7. Export (file handles through MNT, as `open_by_handle_at` and NFS servers use them):
//!    the kernel encodes a node id and the entry's generation, and decodes a handle whose
//!    inode it has forgotten with LOOKUP "." on the node id; it reconnects a directory
//!    with LOOKUP "..". Only with file handles (4). An entry's generation is its object's
//!    own, read from its `FILEID_INO32_GEN` handle (else 0), so a handle of a deleted
//!    object whose number was reused fails in the kernel. A node id not in the table is
//!    reopened by number where SRC's filesystem takes a `FILEID_INO32_GEN` handle with
//!    generation 0 as "any" (ext2/3/4; tried at start): that also decodes handles taken
//!    before a remount (3 keeps the numbers). Elsewhere it is ESTALE. A decoded directory
//!    must lead up to SRC's root by ".." (else ESTALE). A file cannot be checked (it has
//!    no parent pointer), so a caller allowed to decode handles (CAP_DAC_READ_SEARCH, who
//!    can open any file of SRC's filesystem by handle directly) may read one outside SRC;
//!    the gate refuses to change an object whose path is not beneath SRC.
//!
//! 8. A non-directory's entry knows every name the kernel has looked it up under: its
//!    origin, and its *other names* (hard links). A lookup under a new name makes that the
//!    origin and keeps the previous one among the other names. Nothing else adds to them,
//!    and nothing is walked to find more: a name made in SRC behind the mount's back and
//!    never looked up is not known (the gate logs a change to a file with more links than
//!    known names). They are not kept right across unlinks and renames: whoever uses them
//!    checks that each still leads to the object, and drops those that do not. Layer 1
//!    records a change to the object under every one of them (fs/gate.rs).
//!
//! Lock order: `Shared::inner` (the table) → an entry's `fd` slot → `FdCache::registry`;
//! an entry's `origin` lock is a leaf. No lock is held across a reopen (IO): the slot is
//! filled after the open, and a concurrent reopen of the same entry just loses the race
//! and closes its own fd.
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};

use log::{info, warn};

use crate::sys::{self, FileId, errno};

pub const ROOT_INO: u64 = 1;

/// Set in the numbers of objects that cannot use their SRC inode number (see the module
/// docs). Bit 63 is the virtual tree's ([`super::virt::VIRTUAL_BIT`]).
pub const REMAPPED_BIT: u64 = 1 << 62;

/// Descriptors kept out of the cache's half of the limit (see invariant 5).
const FD_RESERVE: u64 = 64;
/// The smallest budget, whatever the limit.
const MIN_FD_BUDGET: usize = 32;
/// Environment variable that lowers the budget (tests: give back and reopen constantly).
pub const FD_BUDGET_ENV: &str = "CHECKPOINTFS_FD_BUDGET";
/// Environment variable that turns file handles off (tests: reopen by parent and name as
/// root).
pub const NO_FILE_HANDLES_ENV: &str = "CHECKPOINTFS_NO_FILE_HANDLES";

/// Coarse recency: bumped whenever a slot is filled, read when an fd is used.
static CLOCK: AtomicU64 = AtomicU64::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    pub dev: u64,
    pub ino: u64,
}

impl ObjectKey {
    pub fn of(st: &libc::stat) -> ObjectKey {
        ObjectKey {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// How an entry reopens its object (invariant 4). The root has neither.
#[derive(Default)]
struct Origin {
    parent: Option<Arc<Inode>>,
    name: CString,
    handle: Option<FileId>,
}

pub struct Inode {
    pub ino: u64,
    /// The object's generation on SRC's filesystem, or 0 (invariant 7).
    pub generation: u32,
    pub key: ObjectKey,
    /// `st_mode & S_IFMT` at lookup; an object never changes type.
    pub file_type: u32,
    /// The cached O_PATH | O_NOFOLLOW fd, `None` while given back. Lock order: after
    /// `Shared::inner`, before `FdCache::registry`; never held across an open.
    fd: Mutex<Option<Arc<OwnedFd>>>,
    /// Lock order: a leaf (nothing is taken while it is held).
    origin: Mutex<Origin>,
    /// [`CLOCK`] at the last use of the fd.
    last_used: AtomicU64,
    /// Open handles on this entry (invariant 6).
    pins: AtomicU32,
    /// The origin name was removed while other links remain (invariant 4).
    keep: AtomicBool,
    /// Names of a non-directory other than its origin under which the kernel has looked it
    /// up (hard links; invariant 8). Lock order: a leaf. Unchecked: callers check that each
    /// still leads to this object ([`Inode::names`]).
    other_names: Mutex<Vec<(Arc<Inode>, CString)>>,
    /// `st_nlink` at the last lookup (invariant 8: compared with the names seen).
    links: AtomicU64,
    /// A change was logged for having more links than names seen (invariant 8): once.
    unseen_links_logged: AtomicBool,
    me: Weak<Inode>,
    shared: Weak<Shared>,
    lookups: AtomicU64,
    /// The kernel wants one backing file per inode for all passthrough opens; handles hold
    /// the strong references, so the backing id closes when the last handle is released.
    /// Lock order: a leaf, held across the backing-open ioctl only (one per inode).
    pub backing: Mutex<Option<Weak<dyn super::BackingFile>>>,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("ino", &self.ino)
            .field("key", &self.key)
            .finish()
    }
}

/// Keeps an entry's fd cached while a handle is open on it (invariant 6).
pub struct Pin(Arc<Inode>);

impl Pin {
    pub fn inode(&self) -> &Arc<Inode> {
        &self.0
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.0.pins.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Inode {
    pub fn is_dir(&self) -> bool {
        self.file_type == libc::S_IFDIR
    }
    pub fn is_symlink(&self) -> bool {
        self.file_type == libc::S_IFLNK
    }
    pub fn is_regular(&self) -> bool {
        self.file_type == libc::S_IFREG
    }
    /// Runs `f` with the path xattr calls reach this object by (see [`sys::XattrPath`]):
    /// its own O_PATH fd's proc link, or for a symlink its name in its parent, checked to
    /// still be this object (ESTALE if not).
    pub fn with_xattr_path<R>(
        &self,
        f: impl FnOnce(&sys::XattrPath) -> io::Result<R>,
    ) -> io::Result<R> {
        if !self.is_symlink() {
            return f(&sys::XattrPath::of_fd(self.fd()?.as_raw_fd()));
        }
        let (parent, name) = self.origin().ok_or_else(|| errno(libc::ESTALE))?;
        let dir = parent.fd()?;
        let st = sys::fstatat(dir.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)
            .map_err(|_| errno(libc::ESTALE))?;
        if ObjectKey::of(&st) != self.key {
            return Err(errno(libc::ESTALE));
        }
        f(&sys::XattrPath::in_dir(dir.as_raw_fd(), &name))
    }

    /// The O_PATH fd of the object, reopened if it was given back. Hold the returned `Arc`
    /// only for the request: the cache may give its own reference back at any time.
    pub fn fd(&self) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = lock(&self.fd).as_ref() {
            self.last_used
                .store(CLOCK.load(Ordering::Relaxed), Ordering::Relaxed);
            return Ok(fd.clone());
        }
        let shared = self.shared.upgrade().ok_or_else(|| errno(libc::ESTALE))?;
        let fresh = shared.reopen(self)?;
        Ok(shared.install(self, fresh))
    }

    /// Keeps the fd cached until the returned guard drops. Take it before the handle's own
    /// open, so the fd that open used cannot be given back in between.
    pub fn pin(self: &Arc<Self>) -> Pin {
        self.pins.fetch_add(1, Ordering::Relaxed);
        Pin(self.clone())
    }

    fn evictable(&self) -> bool {
        self.ino != ROOT_INO
            && self.pins.load(Ordering::Relaxed) == 0
            && !self.keep.load(Ordering::Relaxed)
    }

    /// Records `parent`/`name` as where the object is now (invariant 4).
    fn set_origin(&self, parent: &Arc<Inode>, name: &CStr) {
        let mut o = lock(&self.origin);
        let same_parent = o.parent.as_ref().is_some_and(|p| Arc::ptr_eq(p, parent));
        if !same_parent || o.name.as_c_str() != name {
            o.parent = Some(parent.clone());
            o.name = name.to_owned();
        }
        drop(o);
        self.keep.store(false, Ordering::Relaxed);
    }

    /// The parent entry and name the object was last looked up, created or renamed under
    /// (invariant 4); `None` for the root. The name may be stale for an object with other
    /// links (`keep`): callers check the object found there.
    pub fn origin(&self) -> Option<(Arc<Inode>, CString)> {
        let o = lock(&self.origin);
        Some((o.parent.clone()?, o.name.clone()))
    }

    /// The object was looked up as `name` in `parent` (invariant 8): that name becomes its
    /// origin, and for a non-directory the previous origin, if it was another name, is
    /// remembered as one of its other names (a hard link). O(names seen), no IO.
    fn looked_up_as(&self, parent: &Arc<Inode>, name: &CStr) {
        if !self.is_dir() {
            let previous = {
                let o = lock(&self.origin);
                o.parent.clone().map(|p| (p, o.name.clone()))
            };
            let mut names = lock(&self.other_names);
            names.retain(|(p, n)| !(Arc::ptr_eq(p, parent) && n.as_c_str() == name));
            if let Some((p, n)) = previous
                && !(Arc::ptr_eq(&p, parent) && n.as_c_str() == name)
                && !names.iter().any(|(q, m)| Arc::ptr_eq(q, &p) && *m == n)
            {
                names.push((p, n));
            }
        }
        self.set_origin(parent, name);
    }

    /// Every name of this object the table has seen (invariant 8): its origin first, then
    /// the other names of a hard-linked file, each as `(parent, name)`. Unchecked: a name
    /// may have been unlinked or renamed since; callers check the object found there and
    /// give back the names that no longer lead to it with [`Inode::forget_names`].
    pub fn names(&self) -> Vec<(Arc<Inode>, CString)> {
        let mut all: Vec<(Arc<Inode>, CString)> = self.origin().into_iter().collect();
        all.extend(lock(&self.other_names).iter().cloned());
        all
    }

    /// Whether the table knows a name of this object other than its origin (a hard link
    /// looked up under two names): only then is [`Inode::names`] worth checking.
    pub fn has_other_names(&self) -> bool {
        !lock(&self.other_names).is_empty()
    }

    /// Drops `gone` from the other names (found no longer leading to this object).
    pub fn forget_names(&self, gone: &[(Arc<Inode>, CString)]) {
        lock(&self.other_names)
            .retain(|(p, n)| !gone.iter().any(|(q, m)| Arc::ptr_eq(p, q) && n == m));
    }

    /// The object's link count when it was last looked up.
    pub fn links_at_lookup(&self) -> u64 {
        self.links.load(Ordering::Relaxed)
    }

    /// Whether [`Inode::first_unseen_links_report`] said true already.
    pub fn unseen_links_reported(&self) -> bool {
        self.unseen_links_logged.load(Ordering::Relaxed)
    }

    /// True the first time it is called: for logging, once per entry, that the object has
    /// more links than names seen (invariant 8).
    pub fn first_unseen_links_report(&self) -> bool {
        !self.unseen_links_logged.swap(true, Ordering::Relaxed)
    }

    fn origin_is(&self, parent: &Inode, name: &CStr) -> bool {
        let o = lock(&self.origin);
        o.parent.as_ref().is_some_and(|p| p.key == parent.key) && o.name.as_c_str() == name
    }
}

impl Drop for Inode {
    fn drop(&mut self) {
        if self
            .fd
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
            && let Some(shared) = self.shared.upgrade()
        {
            shared.cache.open.fetch_sub(1, Ordering::Relaxed);
            lock(&shared.cache.registry).remove(&(self as *const Inode as usize));
        }
    }
}

/// The bounded set of cached fds (invariant 5).
struct FdCache {
    budget: usize,
    /// Filled slots, i.e. O_PATH fds the cache holds.
    open: AtomicUsize,
    /// Entries with a filled slot, by address; updated under the entry's slot lock. Lock
    /// order: last (after `Shared::inner` and an entry's `fd`).
    registry: Mutex<HashMap<usize, Weak<Inode>>>,
    /// One batch of give-backs at a time for the budget (an EMFILE retry does not wait).
    evicting: AtomicBool,
    /// `open_by_handle_at` works here (checked once at start).
    handles: bool,
    evictions: AtomicU64,
    reopens: AtomicU64,
    warned_emfile: AtomicBool,
    warned_handle: AtomicBool,
}

#[derive(Default)]
struct Inner {
    by_ino: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<ObjectKey, u64>,
    /// Numbers given to objects that cannot use their own; never pruned, so they stay the
    /// same across forgets (such objects are rare).
    remapped: HashMap<ObjectKey, u64>,
}

struct Shared {
    /// The table. Lock order: first (→ an entry's `fd` → `FdCache::registry`).
    inner: RwLock<Inner>,
    cache: FdCache,
    /// `open_by_handle_at`'s mount fd (SRC's root), when file handles work.
    mount_fd: Option<OwnedFd>,
    /// SRC's device: objects on it use their own inode number.
    root_dev: u64,
    /// A node id not in the table can be reopened by its number (invariant 7).
    decode_by_number: bool,
    next_remapped: AtomicU64,
}

pub struct InodeTable {
    shared: Arc<Shared>,
}

/// What the cache did, for the log and the docs' figures.
pub struct FdStats {
    pub open: usize,
    pub budget: usize,
    pub evictions: u64,
    pub reopens: u64,
    pub handles: bool,
}

/// The soft RLIMIT_NOFILE (1024 if it cannot be read).
fn soft_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    lim.rlim_cur
}

/// The mount fd for `open_by_handle_at` if objects can be reopened by file handle: tried
/// once on the root, as the capability check (CAP_DAC_READ_SEARCH) and the filesystem's
/// support both show there. (The mount fd must be a real open, not O_PATH: the kernel
/// refuses those with EBADF.)
fn file_handle_mount_fd(root: &OwnedFd) -> Result<OwnedFd, io::Error> {
    let mount_fd = sys::openat(
        root.as_fd(),
        sys::DOT,
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
    )?;
    let id = FileId::of(root.as_fd())?;
    id.open(mount_fd.as_fd(), libc::O_PATH)?;
    Ok(mount_fd)
}

/// Whether SRC's filesystem reopens an object from a `FILEID_INO32_GEN` handle with
/// generation 0 (invariant 7), tried on the root.
fn opens_by_number(mount_fd: &OwnedFd, root_fd: &OwnedFd, root: &libc::stat) -> bool {
    let Ok(id) = FileId::of(root_fd.as_fd()) else {
        return false;
    };
    let Some((ino, _)) = id
        .ino32_gen()
        .filter(|(ino, _)| u64::from(*ino) == root.st_ino)
    else {
        return false;
    };
    FileId::ino32_gen_handle(ino, 0)
        .open(mount_fd.as_fd(), libc::O_PATH)
        .and_then(|fd| sys::fstat(fd.as_fd()))
        .is_ok_and(|st| ObjectKey::of(&st) == ObjectKey::of(root))
}

/// The generation in `id` if it is `key`'s `FILEID_INO32_GEN` handle, else 0.
fn generation_in(id: Option<&FileId>, key: ObjectKey) -> u32 {
    id.and_then(FileId::ino32_gen)
        .filter(|(ino, _)| u64::from(*ino) == key.ino)
        .map_or(0, |(_, generation)| generation)
}

/// Deepest SRC a decoded directory is walked up from (invariant 7).
const MAX_DECODE_DEPTH: usize = 4096;

impl InodeTable {
    pub fn new(root_fd: OwnedFd) -> io::Result<InodeTable> {
        let st = sys::fstat(root_fd.as_fd())?;
        let limit = soft_fd_limit();
        let mut budget = usize::try_from((limit / 2).saturating_sub(FD_RESERVE))
            .unwrap_or(usize::MAX)
            .max(MIN_FD_BUDGET);
        // A smaller budget for tests, to exercise giving back and reopening everywhere.
        if let Some(small) = std::env::var(FD_BUDGET_ENV)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            budget = budget.min(small.max(2));
        }
        let tried = if std::env::var_os(NO_FILE_HANDLES_ENV).is_some() {
            Err(io::Error::other(format!("{NO_FILE_HANDLES_ENV} is set")))
        } else {
            file_handle_mount_fd(&root_fd)
        };
        let mount_fd = match tried {
            Ok(fd) => Some(fd),
            Err(e) => {
                info!(
                    "file handles unavailable ({e}: open_by_handle_at needs CAP_DAC_READ_SEARCH \
                     and a filesystem that exports handles); idle inodes are reopened by \
                     parent and name"
                );
                None
            }
        };
        let handles = mount_fd.is_some();
        let decode_by_number = mount_fd
            .as_ref()
            .is_some_and(|m| opens_by_number(m, &root_fd, &st));
        info!(
            "inode fd cache: up to {budget} O_PATH fds (soft limit {limit}), reopened by {}",
            if handles {
                "file handle"
            } else {
                "parent and name"
            }
        );
        let root_fd = Arc::new(root_fd);
        let shared = Arc::new_cyclic(|weak_shared: &Weak<Shared>| {
            let root = Arc::new_cyclic(|me| Inode {
                ino: ROOT_INO,
                generation: 0,
                key: ObjectKey::of(&st),
                file_type: st.st_mode & libc::S_IFMT,
                fd: Mutex::new(Some(root_fd.clone())),
                origin: Mutex::new(Origin::default()),
                last_used: AtomicU64::new(0),
                pins: AtomicU32::new(0),
                keep: AtomicBool::new(true),
                other_names: Mutex::new(Vec::new()),
                links: AtomicU64::new(0),
                unseen_links_logged: AtomicBool::new(false),
                me: me.clone(),
                shared: weak_shared.clone(),
                lookups: AtomicU64::new(1),
                backing: Mutex::new(None),
            });
            let mut inner = Inner::default();
            inner.by_key.insert(root.key, ROOT_INO);
            let mut registry = HashMap::new();
            registry.insert(Arc::as_ptr(&root) as usize, Arc::downgrade(&root));
            inner.by_ino.insert(ROOT_INO, root);
            Shared {
                inner: RwLock::new(inner),
                cache: FdCache {
                    budget,
                    open: AtomicUsize::new(1),
                    registry: Mutex::new(registry),
                    evicting: AtomicBool::new(false),
                    handles,
                    evictions: AtomicU64::new(0),
                    reopens: AtomicU64::new(0),
                    warned_emfile: AtomicBool::new(false),
                    warned_handle: AtomicBool::new(false),
                },
                mount_fd,
                root_dev: st.st_dev,
                decode_by_number,
                next_remapped: AtomicU64::new(1),
            }
        });
        Ok(InodeTable { shared })
    }

    /// The entry for a FUSE inode number; ENOENT-style `None` for unknown numbers (a
    /// misbehaving kernel or a race with forget must not crash the daemon).
    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.shared.read().by_ino.get(&ino).cloned()
    }

    /// Adds one lookup to the object `st` describes, if it is known, and records
    /// `parent`/`name` as its origin. Saves opening an fd.
    pub fn lookup_known(
        &self,
        st: &libc::stat,
        parent: &Arc<Inode>,
        name: &CStr,
    ) -> Option<Arc<Inode>> {
        let inode = self.add_lookup(st)?;
        inode.links.store(st.st_nlink, Ordering::Relaxed);
        inode.looked_up_as(parent, name);
        Some(inode)
    }

    /// Adds one lookup to the object `st` describes, if it is known.
    fn add_lookup(&self, st: &libc::stat) -> Option<Arc<Inode>> {
        let inner = self.shared.read();
        let ino = inner.by_key.get(&ObjectKey::of(st))?;
        let inode = inner.by_ino.get(ino)?;
        if inode.file_type != st.st_mode & libc::S_IFMT {
            return None; // a reused number: lookup_or_insert makes the new entry
        }
        // Under the read lock, a count never goes from 0 to 1: forget removes an entry at
        // zero under the write lock.
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        Some(inode.clone())
    }

    /// Adds one lookup to `inode` if it is still the table's entry for its number.
    fn add_lookup_to(&self, inode: &Arc<Inode>) -> bool {
        let inner = self.shared.read();
        let current = inner
            .by_ino
            .get(&inode.ino)
            .is_some_and(|i| Arc::ptr_eq(i, inode));
        if current {
            // Under the read lock, a count never goes from 0 to 1 (see `add_lookup`).
            inode.lookups.fetch_add(1, Ordering::Relaxed);
        }
        current
    }

    /// The entry of the non-directory `st` describes, if the table has one that was looked
    /// up under more than one name (a hard link; invariant 8).
    pub fn linked_entry(&self, st: &libc::stat) -> Option<Arc<Inode>> {
        if st.st_nlink <= 1 || st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return None;
        }
        self.shared
            .current(ObjectKey::of(st), st.st_mode & libc::S_IFMT)
            .filter(|inode| inode.has_other_names())
    }

    /// The FUSE inode number of the object `key`, if known, without adding a lookup.
    pub fn known_ino(&self, key: ObjectKey) -> Option<u64> {
        self.shared.read().by_key.get(&key).copied()
    }

    /// Adds one lookup to the object behind `fd` (whose stat is `st`, found as `name` in
    /// `parent`), inserting it if new. `fd` fills the entry's slot if it was given back.
    pub fn lookup_or_insert(
        &self,
        fd: OwnedFd,
        st: &libc::stat,
        parent: &Arc<Inode>,
        name: &CStr,
    ) -> Arc<Inode> {
        let handle = self.fresh_handle(&fd, st);
        let origin = Origin {
            parent: Some(parent.clone()),
            name: name.to_owned(),
            handle,
        };
        let (inode, known) = self.insert(st, origin);
        if known {
            inode.links.store(st.st_nlink, Ordering::Relaxed);
            inode.looked_up_as(parent, name);
        }
        // A known entry whose slot is empty may be a new object under a reused number:
        // its old file handle must not be used (a new one is taken at the next give-back).
        if self.shared.install_if_empty(&inode, fd) && known {
            lock(&inode.origin).handle = None;
        }
        inode
    }

    /// The file handle of a new entry's object, taken now (one syscall, no IO) for its
    /// generation (invariant 7); `None` for known objects, or without file handles.
    fn fresh_handle(&self, fd: &OwnedFd, st: &libc::stat) -> Option<FileId> {
        let key = ObjectKey::of(st);
        if !self.shared.cache.handles
            || key.dev != self.shared.root_dev
            || self
                .shared
                .current(key, st.st_mode & libc::S_IFMT)
                .is_some()
        {
            return None;
        }
        FileId::of(fd.as_fd()).ok()
    }

    /// Adds one lookup to the entry of the object `st` describes, or inserts one with
    /// `origin`. Returns the entry and whether it was known.
    fn insert(&self, st: &libc::stat, origin: Origin) -> (Arc<Inode>, bool) {
        let key = ObjectKey::of(st);
        let file_type = st.st_mode & libc::S_IFMT;
        let mut inner = self.shared.write();
        if let Some(inode) = inner.by_key.get(&key).and_then(|ino| inner.by_ino.get(ino))
            && inode.file_type == file_type
        {
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return (inode.clone(), true);
        }
        let ino = self.number_for(&mut inner, key);
        let generation = generation_in(origin.handle.as_ref(), key);
        let inode = Arc::new_cyclic(|me| Inode {
            ino,
            generation,
            key,
            file_type,
            fd: Mutex::new(None),
            origin: Mutex::new(origin),
            last_used: AtomicU64::new(0),
            pins: AtomicU32::new(0),
            keep: AtomicBool::new(false),
            other_names: Mutex::new(Vec::new()),
            links: AtomicU64::new(st.st_nlink),
            unseen_links_logged: AtomicBool::new(false),
            me: me.clone(),
            shared: Arc::downgrade(&self.shared),
            lookups: AtomicU64::new(1),
            backing: Mutex::new(None),
        });
        inner.by_key.insert(key, ino);
        inner.by_ino.insert(ino, inode.clone());
        (inode, false)
    }

    /// Whether the kernel may decode file handles of this mount (invariant 7).
    pub fn exports(&self) -> bool {
        self.shared.cache.handles
    }

    /// LOOKUP "." on node id `ino`: how the kernel decodes a file handle whose inode it
    /// has forgotten (invariant 7). On success the kernel holds one more lookup on the
    /// returned entry, which has number `ino`.
    pub fn lookup_self(&self, ino: u64) -> io::Result<(Arc<Inode>, libc::stat)> {
        if let Some(inode) = self.get(ino) {
            let st = sys::fstat(inode.fd()?.as_fd())?;
            if self.add_lookup_to(&inode) {
                return Ok((inode, st));
            }
        }
        let shared = &self.shared;
        let reserved = REMAPPED_BIT | super::virt::VIRTUAL_BIT;
        let Some(mount_fd) = shared.mount_fd.as_ref().filter(|_| shared.decode_by_number) else {
            return Err(errno(libc::ESTALE));
        };
        let number = u32::try_from(ino)
            .ok()
            .filter(|_| ino != ROOT_INO && ino & reserved == 0)
            .ok_or_else(|| errno(libc::ESTALE))?;
        let fd = shared
            .retry_on_emfile(|| {
                FileId::ino32_gen_handle(number, 0).open(mount_fd.as_fd(), libc::O_PATH)
            })
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ESTALE) | Some(libc::EINVAL) => errno(libc::ESTALE),
                _ => e,
            })?;
        let st = sys::fstat(fd.as_fd())?;
        if st.st_dev != shared.root_dev || st.st_ino != ino {
            return Err(errno(libc::ESTALE));
        }
        let inode = self.adopt_decoded(fd, &st)?;
        if inode.ino != ino {
            // Known under another number (invariant 2): not the object this handle names.
            self.forget(inode.ino, 1);
            return Err(errno(libc::ESTALE));
        }
        Ok((inode, st))
    }

    /// LOOKUP ".." in directory `ino`: how the kernel reconnects a decoded directory
    /// (invariant 7). The root's parent is the root (the mount ends there).
    pub fn lookup_parent(&self, ino: u64) -> io::Result<(Arc<Inode>, libc::stat)> {
        let dir = self.get(ino).ok_or_else(|| errno(libc::ESTALE))?;
        if !dir.is_dir() {
            return Err(errno(libc::ENOTDIR));
        }
        let dir_fd = dir.fd()?;
        if ino == ROOT_INO {
            let st = sys::fstat(dir_fd.as_fd())?;
            self.add_lookup_to(&dir);
            return Ok((dir, st));
        }
        let fd = self.shared.retry_on_emfile(|| {
            sys::openat(dir_fd.as_fd(), c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)
        })?;
        let st = sys::fstat(fd.as_fd())?;
        if let Some(inode) = self.add_lookup(&st) {
            return Ok((inode, st));
        }
        Ok((self.adopt_decoded(fd, &st)?, st))
    }

    /// Adds one lookup to the object a handle decoded to (`fd`, stat `st`), inserting it
    /// with no origin but its file handle. A directory must lie beneath SRC's root.
    fn adopt_decoded(&self, fd: OwnedFd, st: &libc::stat) -> io::Result<Arc<Inode>> {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            self.shared.check_beneath_root(&fd)?;
        }
        if let Some(inode) = self.add_lookup(st) {
            return Ok(inode);
        }
        let handle = FileId::of(fd.as_fd()).map_err(|_| errno(libc::ESTALE))?;
        let origin = Origin {
            parent: None,
            name: CString::default(),
            handle: Some(handle),
        };
        let (inode, _) = self.insert(st, origin);
        self.shared.install_if_empty(&inode, fd);
        Ok(inode)
    }

    /// The FUSE inode number for a new entry of object `key` (see the module docs).
    fn number_for(&self, inner: &mut Inner, key: ObjectKey) -> u64 {
        let reserved = REMAPPED_BIT | super::virt::VIRTUAL_BIT;
        if key.dev == self.shared.root_dev
            && key.ino != ROOT_INO
            && key.ino & reserved == 0
            && !inner.by_ino.contains_key(&key.ino)
        {
            return key.ino;
        }
        if let Some(&ino) = inner.remapped.get(&key)
            && !inner.by_ino.contains_key(&ino)
        {
            return ino;
        }
        let ino = REMAPPED_BIT | self.shared.next_remapped.fetch_add(1, Ordering::Relaxed);
        inner.remapped.insert(key, ino);
        ino
    }

    /// Drops `n` lookups; the entry goes at zero. Unknown inodes are ignored (forget has no
    /// reply, and a double forget must not take the daemon down).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inner = self.shared.write();
        let Some(inode) = inner.by_ino.get(&ino) else {
            drop(inner);
            log::warn!("forget of unknown inode {ino}");
            return;
        };
        let prev = inode.lookups.load(Ordering::Relaxed);
        let now = prev.saturating_sub(n);
        inode.lookups.store(now, Ordering::Relaxed);
        if now > 0 {
            return;
        }
        let key = inode.key;
        let gone = inner.by_ino.remove(&ino);
        // Only remove the key mapping if it still points at this entry.
        if inner.by_key.get(&key) == Some(&ino) {
            inner.by_key.remove(&key);
        }
        drop(inner);
        // The fd closes here (unless a request or a child's origin still holds the inode),
        // outside the lock: the kernel sends forgets by the thousand when it drops its
        // caches, while lookups wait.
        drop(gone);
    }

    /// Whether origins must be kept right across unlinks and renames over (invariant 4):
    /// when reopening goes by parent and name.
    pub fn tracks_names(&self) -> bool {
        !self.shared.cache.handles
    }

    /// `name` in `parent`, an object `st` describes, was renamed to `new_name` in
    /// `new_parent` through the mount: re-point its origin.
    pub fn renamed(&self, st: &libc::stat, new_parent: &Arc<Inode>, new_name: &CStr) {
        if let Some(inode) = self
            .shared
            .current(ObjectKey::of(st), st.st_mode & libc::S_IFMT)
        {
            inode.looked_up_as(new_parent, new_name);
        }
    }

    /// `name` in `parent`, an object `st` describes, is about to be unlinked or renamed
    /// over: if it is that object's origin and other links remain, keep its fd from now on
    /// (invariant 4). Only needed when [`InodeTable::tracks_names`]. Never fails the
    /// operation: an object that cannot be reopened now could not be later either.
    pub fn name_going(&self, st: &libc::stat, parent: &Inode, name: &CStr) {
        if st.st_nlink <= 1 || st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return; // the object goes with its name
        }
        let Some(inode) = self
            .shared
            .current(ObjectKey::of(st), st.st_mode & libc::S_IFMT)
        else {
            return;
        };
        if !inode.origin_is(parent, name) {
            return;
        }
        // Keep first, then make sure the fd is there: a give-back in between is then
        // impossible.
        inode.keep.store(true, Ordering::Relaxed);
        if let Err(e) = inode.fd() {
            log::debug!("inode {}: cannot keep its fd: {e}", inode.ino);
        }
    }

    /// Runs an open; on EMFILE/ENFILE gives back half the cached fds and retries once.
    pub fn retry_on_emfile<T>(&self, f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        self.shared.retry_on_emfile(f)
    }

    pub fn fd_stats(&self) -> FdStats {
        let c = &self.shared.cache;
        FdStats {
            open: c.open.load(Ordering::Relaxed),
            budget: c.budget,
            evictions: c.evictions.load(Ordering::Relaxed),
            reopens: c.reopens.load(Ordering::Relaxed),
            handles: c.handles,
        }
    }
}

impl Shared {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The table's entry for object `key` of type `file_type`, if any.
    fn current(&self, key: ObjectKey, file_type: u32) -> Option<Arc<Inode>> {
        let inner = self.read();
        let inode = inner.by_ino.get(inner.by_key.get(&key)?)?;
        (inode.file_type == file_type).then(|| inode.clone())
    }

    /// Ok if the directory `fd` leads up to SRC's root by "..", ESTALE if it reaches the
    /// top of its filesystem (or of the daemon's view) first (invariant 7).
    fn check_beneath_root(&self, fd: &OwnedFd) -> io::Result<()> {
        let root_key = self.read().by_ino.get(&ROOT_INO).map(|r| r.key);
        let mut key = ObjectKey::of(&sys::fstat(fd.as_fd())?);
        let mut up = None::<OwnedFd>;
        for _ in 0..MAX_DECODE_DEPTH {
            if Some(key) == root_key {
                return Ok(());
            }
            let here = up.as_ref().unwrap_or(fd);
            let parent = self.retry_on_emfile(|| {
                sys::openat(here.as_fd(), c"..", libc::O_PATH | libc::O_NOFOLLOW, 0)
            })?;
            let parent_key = ObjectKey::of(&sys::fstat(parent.as_fd())?);
            if parent_key == key {
                break; // "/": its own parent
            }
            key = parent_key;
            up = Some(parent);
        }
        Err(errno(libc::ESTALE))
    }

    /// Opens `inode`'s object again from its origin (invariant 4), two ways, each the other's
    /// fallback. No lock is held.
    ///
    /// - A directory by file handle first: the kernel connects a decoded directory up to
    ///   its filesystem's root (exportfs `reconnect_path`) or fails the decode, so its fd
    ///   has a path; the decode fails with ESTALE also for a live directory when that
    ///   reconnection loses a race with a rename, hence the fallback.
    /// - Anything else by parent and name first: decoded from its handle while its dentry
    ///   is not cached (the kernel reclaims unused dentries under memory pressure, as
    ///   `drop_caches` does), it is a *disconnected* dentry, an object without a path
    ///   (`/proc/self/fd` reads "/"). The gate names what it backs up by that path, so a
    ///   write open through such an fd failed with ESTALE (issue 28). The handle remains
    ///   the fallback for an object the name no longer leads to (renamed or its origin
    ///   name removed behind the table's back): reads and attributes still work there.
    ///
    /// ESTALE only when neither way finds the object and neither failed otherwise: gone.
    fn reopen(&self, inode: &Inode) -> io::Result<OwnedFd> {
        self.cache.reopens.fetch_add(1, Ordering::Relaxed);
        let (parent, name, handle) = {
            let o = lock(&inode.origin);
            (o.parent.clone(), o.name.clone(), o.handle.clone())
        };
        let by_name = || match &parent {
            Some(parent) => self.reopen_by_name(inode, parent, &name, handle.as_ref()),
            None => Err(errno(libc::ESTALE)),
        };
        let by_handle = || match &handle {
            Some(handle) => self.reopen_by_handle(inode, handle),
            None => Err(errno(libc::ESTALE)),
        };
        let ways: [&dyn Fn() -> io::Result<OwnedFd>; 2] = if inode.is_dir() {
            [&by_handle, &by_name]
        } else {
            [&by_name, &by_handle]
        };
        let first_err = match ways[0]() {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        };
        ways[1]().map_err(|e| {
            // A real failure says more than "gone", which only both ways together prove.
            let e = if e.raw_os_error() == Some(libc::ESTALE) {
                first_err
            } else {
                e
            };
            log::debug!(
                "inode {} ({:?} in inode {}): cannot reopen: {e}",
                inode.ino,
                name,
                parent.as_ref().map_or(0, |p| p.ino)
            );
            e
        })
    }

    /// `open_by_handle_at` of `handle`, checked to be `inode`'s object. ESTALE: the handle's
    /// object is gone (or, for a directory, could not be reconnected).
    fn reopen_by_handle(&self, inode: &Inode, handle: &FileId) -> io::Result<OwnedFd> {
        let mount_fd = self.mount_fd.as_ref().ok_or_else(|| errno(libc::ESTALE))?;
        match self.retry_on_emfile(|| handle.open(mount_fd.as_fd(), libc::O_PATH)) {
            Ok(fd) => Self::verified(inode, fd),
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => Err(e),
            Err(e) => {
                if !self.cache.warned_handle.swap(true, Ordering::Relaxed) {
                    warn!(
                        "open_by_handle_at failed ({e}); reopening by parent and name \
                         instead (logged once)"
                    );
                }
                Err(e)
            }
        }
    }

    /// `name` in `parent` (the origin), accepted only if it is still `inode`'s object: the
    /// same `(st_dev, st_ino)` and type and, where the entry has a file handle, the same
    /// handle, which holds the object's generation (ext4: `FILEID_INO32_GEN`), so a new
    /// object that reused the inode number under that name is refused. ESTALE otherwise.
    fn reopen_by_name(
        &self,
        inode: &Inode,
        parent: &Arc<Inode>,
        name: &CStr,
        handle: Option<&FileId>,
    ) -> io::Result<OwnedFd> {
        // Prefer the table's entry for the parent: a forgotten parent entry held only by
        // this origin would miss renames made since (the table's entry sees them).
        let parent = self
            .current(parent.key, parent.file_type)
            .unwrap_or_else(|| parent.clone());
        let dir = parent.fd()?;
        let fd = self
            .retry_on_emfile(|| sys::openat(dir.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::ENOTDIR) => errno(libc::ESTALE),
                _ => e,
            })?;
        drop(dir);
        let fd = Self::verified(inode, fd)?;
        if let Some(handle) = handle
            && FileId::of(fd.as_fd()).ok().as_ref() != Some(handle)
        {
            return Err(errno(libc::ESTALE));
        }
        Ok(fd)
    }

    /// `fd` if it is `inode`'s object, ESTALE if the name now holds another one.
    fn verified(inode: &Inode, fd: OwnedFd) -> io::Result<OwnedFd> {
        let st = sys::fstat(fd.as_fd())?;
        if ObjectKey::of(&st) != inode.key || st.st_mode & libc::S_IFMT != inode.file_type {
            return Err(errno(libc::ESTALE));
        }
        Ok(fd)
    }

    /// Puts `fd` in `inode`'s slot unless another reopen filled it first; returns the fd
    /// the slot holds.
    fn install(&self, inode: &Inode, fd: OwnedFd) -> Arc<OwnedFd> {
        let mut slot = lock(&inode.fd);
        if let Some(existing) = slot.as_ref() {
            return existing.clone(); // ours closes on return, after the lock
        }
        let fd = Arc::new(fd);
        *slot = Some(fd.clone());
        self.filled(inode);
        drop(slot);
        self.trim();
        fd
    }

    /// Fills an empty slot with `fd` (else closes it); whether it did.
    fn install_if_empty(&self, inode: &Inode, fd: OwnedFd) -> bool {
        let mut slot = lock(&inode.fd);
        if slot.is_some() {
            return false;
        }
        *slot = Some(Arc::new(fd));
        self.filled(inode);
        drop(slot);
        self.trim();
        true
    }

    /// Accounts a slot just filled; called under that slot's lock (see the lock order).
    fn filled(&self, inode: &Inode) {
        inode
            .last_used
            .store(CLOCK.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
        self.cache.open.fetch_add(1, Ordering::Relaxed);
        lock(&self.cache.registry).insert(inode as *const Inode as usize, inode.me.clone());
    }

    /// Over budget: give back the oldest fds down to 7/8 of the budget, one batch at a time.
    fn trim(&self) {
        let c = &self.cache;
        let open = c.open.load(Ordering::Relaxed);
        if open <= c.budget || c.evicting.swap(true, Ordering::Acquire) {
            return;
        }
        self.give_back(open - c.budget * 7 / 8);
        c.evicting.store(false, Ordering::Release);
    }

    /// Gives back up to `n` of the least recently used idle fds (invariant 5).
    fn give_back(&self, n: usize) {
        let mut candidates: Vec<Arc<Inode>> = {
            let registry = lock(&self.cache.registry);
            registry.values().filter_map(Weak::upgrade).collect()
        };
        // Upgraded references drop only after the registry lock is released (an entry's
        // Drop takes it).
        candidates.retain(|i| i.evictable());
        let n = n.min(candidates.len());
        if n == 0 {
            return;
        }
        candidates.select_nth_unstable_by_key(n - 1, |i| i.last_used.load(Ordering::Relaxed));
        for inode in &candidates[..n] {
            self.give_back_one(inode);
        }
    }

    fn give_back_one(&self, inode: &Inode) {
        if self.cache.handles && inode.key.dev == self.root_dev {
            self.take_handle(inode);
        }
        let taken = {
            let mut slot = lock(&inode.fd);
            let taken = slot.take();
            if taken.is_some() {
                self.cache.open.fetch_sub(1, Ordering::Relaxed);
                lock(&self.cache.registry).remove(&(inode as *const Inode as usize));
            }
            taken
        };
        if taken.is_some() {
            self.cache.evictions.fetch_add(1, Ordering::Relaxed);
        }
        // Closes the fd here, outside the locks, unless a request still holds it.
        drop(taken);
    }

    /// Takes the file handle of `inode` from its fd before the fd is given back (an object
    /// without one is reopened by parent and name).
    fn take_handle(&self, inode: &Inode) {
        if lock(&inode.origin).handle.is_some() {
            return;
        }
        let Some(fd) = lock(&inode.fd).clone() else {
            return;
        };
        if let Ok(id) = FileId::of(fd.as_fd()) {
            lock(&inode.origin).handle = Some(id);
        }
    }

    fn retry_on_emfile<T>(&self, mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        match f() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
                if !self.cache.warned_emfile.swap(true, Ordering::Relaxed) {
                    warn!(
                        "out of file descriptors ({e}) with {} cached O_PATH fds: giving half \
                         of them back and retrying (logged once; raise the hard RLIMIT_NOFILE \
                         if this repeats)",
                        self.cache.open.load(Ordering::Relaxed)
                    );
                }
                self.give_back(self.cache.open.load(Ordering::Relaxed) / 2);
                f()
            }
            r => r,
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "the tests build and rename a scratch tree of their own, not SRC, and drop caches"
)]
mod tests {
    use super::*;

    /// A table on a fresh directory holding `d/f`, with entries for `d` and `d/f`; `None`
    /// (the test is skipped) unless file handles work there (root, a filesystem that
    /// exports them).
    /// What the core's LOOKUP does with the table: `name` in `parent`, as an entry.
    fn look_up(table: &InodeTable, parent: &Arc<Inode>, name: &CStr) -> Arc<Inode> {
        let dir = parent.fd().unwrap();
        let fd = sys::openat(dir.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0).unwrap();
        let st = sys::fstat(fd.as_fd()).unwrap();
        table.lookup_or_insert(fd, &st, parent, name)
    }

    fn table_with_file() -> Option<(tempfile::TempDir, InodeTable, Arc<Inode>, Arc<Inode>)> {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/f"), b"f\n").unwrap();
        let root_fd = std::fs::File::open(tmp.path()).unwrap().into();
        let table = InodeTable::new(root_fd).unwrap();
        if !table.exports() {
            eprintln!("skipped: no file handles here (needs root and e.g. ext4)");
            return None;
        }
        let root = table.get(ROOT_INO).unwrap();
        let look = |parent: &Arc<Inode>, name: &CStr| look_up(&table, parent, name);
        let d = look(&root, c"d");
        let f = look(&d, c"f");
        Some((tmp, table, d, f))
    }

    fn path_of(inode: &Inode) -> String {
        let path = sys::fd_path(inode.fd().unwrap().as_raw_fd())
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&path).into_owned()
    }

    #[test]
    fn a_given_back_file_reopens_with_its_path_after_the_kernel_reclaims_its_dentry() {
        let Some((tmp, table, d, f)) = table_with_file() else {
            return;
        };
        let tmp = tmp.path().canonicalize().unwrap();
        table.shared.give_back_one(&f);
        table.shared.give_back_one(&d);
        // Nothing holds the dentries of `d` and `d/f` now: this reclaims them.
        std::fs::write("/proc/sys/vm/drop_caches", "2\n").unwrap();
        // Decoded from its handle the file would be disconnected: its path would read "/".
        assert_eq!(path_of(&f), tmp.join("d/f").to_string_lossy());
        assert_eq!(path_of(&d), tmp.join("d").to_string_lossy());
        assert!(table.fd_stats().reopens >= 2);
    }

    #[test]
    fn a_file_renamed_behind_the_table_is_reopened_by_its_handle() {
        let Some((tmp, table, _d, f)) = table_with_file() else {
            return;
        };
        table.shared.give_back_one(&f);
        std::fs::rename(tmp.path().join("d/f"), tmp.path().join("d/g")).unwrap();
        let st = sys::fstat(f.fd().unwrap().as_fd()).unwrap();
        assert_eq!(ObjectKey::of(&st), f.key);
    }

    #[test]
    fn the_origin_name_is_refused_for_an_object_of_another_generation() {
        let Some((_tmp, table, _d, f)) = table_with_file() else {
            return;
        };
        table.shared.give_back_one(&f);
        let Some((ino, generation)) = lock(&f.origin).handle.as_ref().and_then(FileId::ino32_gen)
        else {
            eprintln!("skipped: not a FILEID_INO32_GEN filesystem");
            return;
        };
        // As if the file had been deleted and its number reused by a new one under the same
        // name: same (st_dev, st_ino) and type by name, another generation. Both ways must
        // refuse it (by name the handles differ; by handle the filesystem says stale).
        lock(&f.origin).handle = Some(FileId::ino32_gen_handle(ino, generation.wrapping_add(1)));
        let e = f.fd().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
        // With the right handle the same name is accepted again.
        lock(&f.origin).handle = Some(FileId::ino32_gen_handle(ino, generation));
        f.fd().unwrap();
    }

    fn names_of(inode: &Inode) -> Vec<String> {
        inode
            .names()
            .iter()
            .map(|(parent, name)| format!("{}/{}", parent.ino, name.to_string_lossy()))
            .collect()
    }

    #[test]
    fn a_file_looked_up_under_two_names_knows_both_and_a_directory_only_its_last() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("a"), b"x").unwrap();
        std::fs::hard_link(tmp.path().join("a"), tmp.path().join("d/b")).unwrap();
        let table = InodeTable::new(std::fs::File::open(tmp.path()).unwrap().into()).unwrap();
        let root = table.get(ROOT_INO).unwrap();
        let look = |parent: &Arc<Inode>, name: &CStr| look_up(&table, parent, name);
        let d = look(&root, c"d");
        let a = look(&root, c"a");
        assert!(!a.has_other_names());
        assert_eq!(a.links_at_lookup(), 2);
        // Looked up again under the same name: nothing new.
        assert!(Arc::ptr_eq(&look(&root, c"a"), &a));
        assert!(!a.has_other_names());
        // Under its other name: one entry, both names, the latest first.
        let b = look(&d, c"b");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.has_other_names());
        let (root_ino, d_ino) = (root.ino, d.ino);
        assert_eq!(
            names_of(&a),
            [format!("{d_ino}/b"), format!("{root_ino}/a")]
        );
        // Back and forth: each name once.
        look(&root, c"a");
        look(&d, c"b");
        assert_eq!(
            names_of(&a),
            [format!("{d_ino}/b"), format!("{root_ino}/a")]
        );
        // A name found gone is dropped.
        a.forget_names(&[(root.clone(), c"a".to_owned())]);
        assert_eq!(names_of(&a), [format!("{d_ino}/b")]);
        assert!(!a.has_other_names());
        // A directory has one name (the last), never other names.
        std::fs::create_dir(tmp.path().join("e")).unwrap();
        let e = look(&root, c"e");
        std::fs::rename(tmp.path().join("e"), tmp.path().join("d/e")).unwrap();
        assert!(Arc::ptr_eq(&look(&d, c"e"), &e));
        assert!(!e.has_other_names());
        assert_eq!(names_of(&e), [format!("{d_ino}/e")]);
        // Unseen links are reported once per entry.
        assert!(!a.unseen_links_reported());
        assert!(a.first_unseen_links_report());
        assert!(a.unseen_links_reported());
        assert!(!a.first_unseen_links_report());
    }
}
