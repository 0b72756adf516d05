//! Open file and directory handles.
//!
//! A handle owns a real fd (not O_PATH) on the object, so it stays usable after the object
//! is unlinked or renamed. Writable handles are what a checkpoint must capture eagerly:
//! data can change through them (with kernel passthrough, without the daemon seeing it).
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fuser::BackingId;

use super::inodes::{Inode, Pin};
use crate::sys::DirStream;

pub struct FileHandle {
    pub fd: OwnedFd,
    pub inode: Arc<Inode>,
    /// Keeps the inode's O_PATH fd cached while the handle is open (inodes invariant 6).
    pub _pin: Pin,
    pub writable: bool,
    /// Kept alive while the handle is open (see `Inode::backing`).
    pub backing: Option<Arc<BackingId>>,
}

pub struct DirHandle {
    pub inode: Arc<Inode>,
    pub _pin: Pin,
    pub stream: Mutex<DirStream>,
}

pub enum Handle {
    File(FileHandle),
    Dir(DirHandle),
}

pub struct HandleTable {
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
                Handle::File(f) if f.writable && seen.insert(f.inode.ino) => Some(f.inode.clone()),
                _ => None,
            })
            .collect()
    }
}
