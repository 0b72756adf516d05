//! Open file and directory handles.
//!
//! A handle owns a real fd (not O_PATH) on the object, so it stays usable after the object
//! is unlinked or renamed. Writable handles are what a checkpoint must capture eagerly:
//! data can change through them (with kernel passthrough, without the daemon seeing it).
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::gate::WritableFd;
use super::inodes::{Inode, Pin};
use crate::sys::DirStream;

/// The fd of an open file: a write-capable one only as the gate made it.
pub enum HandleFd {
    ReadOnly(OwnedFd),
    Writable(WritableFd),
}

impl AsFd for HandleFd {
    /// For reading, stat, lseek, fsync and a passthrough backing file: nothing that writes.
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            HandleFd::ReadOnly(fd) => fd.as_fd(),
            HandleFd::Writable(fd) => fd.as_fd(),
        }
    }
}

pub struct FileHandle {
    fd: HandleFd,
    pub inode: Arc<Inode>,
    /// Keeps the inode's O_PATH fd cached while the handle is open (inodes invariant 6).
    pub _pin: Pin,
    /// Kept alive while the handle is open (see `Inode::backing`).
    pub backing: Option<Arc<dyn super::BackingFile>>,
}

impl FileHandle {
    pub fn new(
        fd: HandleFd,
        inode: Arc<Inode>,
        pin: Pin,
        backing: Option<Arc<dyn super::BackingFile>>,
    ) -> FileHandle {
        FileHandle {
            fd,
            inode,
            _pin: pin,
            backing,
        }
    }

    /// For reading, stat, lseek, fsync: nothing that writes.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The gated write-capable fd, if the handle was opened for writing: what a
    /// [`super::gate::WritePermit`] is issued for.
    pub fn writable(&self) -> Option<&WritableFd> {
        match &self.fd {
            HandleFd::ReadOnly(_) => None,
            HandleFd::Writable(fd) => Some(fd),
        }
    }

    pub fn is_writable(&self) -> bool {
        self.writable().is_some()
    }
}

pub struct DirHandle {
    pub inode: Arc<Inode>,
    pub _pin: Pin,
    /// Lock order: a leaf, held across one getdents batch (READDIR on this handle only).
    pub stream: Mutex<DirStream>,
}

pub enum Handle {
    File(FileHandle),
    Dir(DirHandle),
}

pub struct HandleTable {
    /// Lock order: a leaf; handles are cloned out (`Arc`) before any IO on them.
    map: RwLock<HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
}

impl Default for HandleTable {
    fn default() -> Self {
        HandleTable {
            map: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }
}

impl HandleTable {
    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(handle));
        fh
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
    }

    pub fn remove(&self, fh: u64) -> Option<Arc<Handle>> {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh)
    }

    /// Inodes with at least one handle open for writing, deduplicated.
    pub fn writable_inodes(&self) -> Vec<Arc<Inode>> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut seen = std::collections::HashSet::new();
        map.values()
            .filter_map(|h| match &**h {
                Handle::File(f) if f.is_writable() && seen.insert(f.inode.ino) => {
                    Some(f.inode.clone())
                }
                _ => None,
            })
            .collect()
    }
}
