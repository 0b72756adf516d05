//! The inode table: FUSE inode numbers → objects in SRC, held by O_PATH file descriptors.
//!
//! Invariants:
//! - An entry exists exactly while the kernel holds lookups on it (`lookups > 0`), except
//!   the root, which is never forgotten. `lookup`/`create`/`mkdir`/`readdirplus` entries add
//!   one; `forget(n)` subtracts n; at zero the entry and its fd go.
//! - Objects are identified by `(st_dev, st_ino)`; one entry per object, so hard links share
//!   an inode number, and renames (of the object or any ancestor) never make an entry stale:
//!   the fd follows the object, not a path.
//! - The FUSE inode number of an object on SRC's own filesystem is its inode number there,
//!   so `st_ino` through MNT equals SRC's, and stays the same when the kernel forgets an
//!   object and looks it up again (tools keep inode numbers: git's index, `find -inum`,
//!   hard-link detection in tar/rsync/du), and plain READDIR's d_ino (SRC's) agrees with
//!   it. Objects elsewhere (mounts inside SRC), or whose number would collide with the
//!   root's [`ROOT_INO`] or a reserved bit, get a [`REMAPPED_BIT`] number, remembered for
//!   the daemon's lifetime so that it is stable too.
//! - A number is reused only when SRC reuses the inode number, which needs the old object
//!   freed — impossible while its entry (and O_PATH fd) exists, i.e. while the kernel still
//!   holds it. FUSE allows reusing a node id after FORGET, so generation is always 0.
//!
//! Lock order: `InodeTable::inner` is a leaf lock — nothing else is acquired while holding it.
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use fuser::BackingId;

pub const ROOT_INO: u64 = 1;

/// Set in the numbers of objects that cannot use their SRC inode number (see the module
/// docs). Bit 63 is the virtual tree's ([`super::virt::VIRTUAL_BIT`]).
pub const REMAPPED_BIT: u64 = 1 << 62;

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

pub struct Inode {
    pub ino: u64,
    pub key: ObjectKey,
    /// `st_mode & S_IFMT` at lookup; an object never changes type.
    pub file_type: u32,
    /// O_PATH | O_NOFOLLOW.
    pub fd: OwnedFd,
    lookups: AtomicU64,
    /// The kernel wants one backing file per inode for all passthrough opens; handles hold
    /// the strong references, so the backing id closes when the last handle is released.
    pub backing: Mutex<Weak<BackingId>>,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("ino", &self.ino)
            .field("key", &self.key)
            .finish()
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
}

#[derive(Default)]
struct Inner {
    by_ino: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<ObjectKey, u64>,
    /// Numbers given to objects that cannot use their own; never pruned, so they stay the
    /// same across forgets (such objects are rare).
    remapped: HashMap<ObjectKey, u64>,
}

pub struct InodeTable {
    inner: RwLock<Inner>,
    /// SRC's device: objects on it use their own inode number.
    root_dev: u64,
    next_remapped: AtomicU64,
}

impl InodeTable {
    pub fn new(root_fd: OwnedFd) -> io::Result<InodeTable> {
        let st = super::sys::fstat(root_fd.as_fd())?;
        let root = Arc::new(Inode {
            ino: ROOT_INO,
            key: ObjectKey::of(&st),
            file_type: st.st_mode & libc::S_IFMT,
            fd: root_fd,
            lookups: AtomicU64::new(1),
            backing: Mutex::new(Weak::new()),
        });
        let mut inner = Inner::default();
        inner.by_key.insert(root.key, ROOT_INO);
        inner.by_ino.insert(ROOT_INO, root);
        Ok(InodeTable {
            inner: RwLock::new(inner),
            root_dev: st.st_dev,
            next_remapped: AtomicU64::new(1),
        })
    }

    /// The entry for a FUSE inode number; ENOENT-style `None` for unknown numbers (a
    /// misbehaving kernel or a race with forget must not crash the daemon).
    pub fn get(&self, ino: u64) -> Option<Arc<Inode>> {
        self.read().by_ino.get(&ino).cloned()
    }

    /// Adds one lookup to the object `key`, if it is known. Saves opening an fd.
    pub fn lookup_known(&self, key: ObjectKey) -> Option<Arc<Inode>> {
        let inner = self.read();
        let ino = inner.by_key.get(&key)?;
        let inode = inner.by_ino.get(ino)?;
        // Under the read lock, a count never goes from 0 to 1: forget removes an entry
        // at zero under the write lock.
        inode.lookups.fetch_add(1, Ordering::Relaxed);
        Some(inode.clone())
    }

    /// The FUSE inode number of the object `key`, if known, without adding a lookup.
    pub fn known_ino(&self, key: ObjectKey) -> Option<u64> {
        self.read().by_key.get(&key).copied()
    }

    /// Adds one lookup to the object behind `fd` (whose stat is `st`), inserting it if new.
    pub fn lookup_or_insert(&self, fd: OwnedFd, st: &libc::stat) -> Arc<Inode> {
        let key = ObjectKey::of(st);
        let mut inner = self.write();
        if let Some(ino) = inner.by_key.get(&key).copied()
            && let Some(inode) = inner.by_ino.get(&ino)
        {
            inode.lookups.fetch_add(1, Ordering::Relaxed);
            return inode.clone();
        }
        let ino = self.number_for(&mut inner, key);
        let inode = Arc::new(Inode {
            ino,
            key,
            file_type: st.st_mode & libc::S_IFMT,
            fd,
            lookups: AtomicU64::new(1),
            backing: Mutex::new(Weak::new()),
        });
        inner.by_key.insert(key, ino);
        inner.by_ino.insert(ino, inode.clone());
        inode
    }

    /// The FUSE inode number for a new entry of object `key` (see the module docs).
    fn number_for(&self, inner: &mut Inner, key: ObjectKey) -> u64 {
        let reserved = REMAPPED_BIT | super::virt::VIRTUAL_BIT;
        if key.dev == self.root_dev
            && key.ino != ROOT_INO
            && key.ino & reserved == 0
            && !inner.by_ino.contains_key(&key.ino)
        {
            return key.ino;
        }
        *inner
            .remapped
            .entry(key)
            .or_insert_with(|| REMAPPED_BIT | self.next_remapped.fetch_add(1, Ordering::Relaxed))
    }

    /// Drops `n` lookups; the entry goes at zero. Unknown inodes are ignored (forget has no
    /// reply, and a double forget must not take the daemon down).
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let mut inner = self.write();
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
        // The fd closes here (unless a request still holds the inode), outside the lock: the
        // kernel sends forgets by the thousand when it drops its caches, while lookups wait.
        drop(gone);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}
