//! Serving the branches: `MNT/.checkpoint/branches/NAME/` is a writable tree whose lower
//! layer is the fork checkpoint's view and whose upper layer is the branch's directory in the
//! state dir (`history::branches`, which makes every change to it; docs/design.md,
//! "Branches").
//!
//! Node ids have [`BRANCH_BIT`] set: within the virtual range (so `virt::is_virtual` holds
//! and nothing of the passthrough tables can collide), beside the view nodes. A node is a
//! path in one branch, allocated at lookup and honouring the kernel's lookup counts like a
//! view node; a rename moves the paths of the nodes below it, so a node's number — the
//! `st_ino` tools see — stays the same across the copy-up of its file and across renames.
//! An unlinked or replaced node is detached from its path, so the name's next object gets a
//! new number.
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use fuser::{FileAttr, FileType, TimeOrNow};

use super::virt::{VIRTUAL_BIT, file_type_of, view_attr};
use super::{DirEntryOut, Entry, Opened, SetAttr, TTL, attr_from_stat};
use crate::history::branches::{AttrChange, Branch, Branches, Layer, New, join_rel, split_rel};
use crate::history::{Caller, History};
use crate::sys::{self, errno};
use crate::transcript::record::EntryKind;

/// Node ids and handles of branches: the virtual bit and bit 61.
pub const BRANCH_BIT: u64 = VIRTUAL_BIT | (1 << 61);

pub fn is_branch(n: u64) -> bool {
    n & BRANCH_BIT == BRANCH_BIT
}

struct Node {
    branch: Arc<Branch>,
    rel: Vec<u8>,
    lookups: u64,
}

#[derive(Default)]
struct Nodes {
    by_ino: HashMap<u64, Node>,
    by_key: HashMap<(String, Vec<u8>), u64>,
}

enum BranchHandle {
    /// A regular file of node `ino`: in the upper (`writable` if opened so), or the
    /// lower's content.
    File {
        file: File,
        writable: bool,
        ino: u64,
    },
    /// A snapshot of a merged directory listing, taken at opendir.
    Listing(Vec<(Vec<u8>, FileType)>),
}

pub struct BranchFs {
    branches: Branches,
    nodes: RwLock<Nodes>,
    next_ino: AtomicU64,
    handles: Mutex<HashMap<u64, Arc<BranchHandle>>>,
    next_fh: AtomicU64,
}

/// A path that no lookup produces (names beginning `.wh.` are refused), given to a node
/// whose object left its name.
const DETACHED: &[u8] = b".wh.detached";

fn ts(t: TimeOrNow) -> rustix::fs::Timespec {
    match t {
        TimeOrNow::Now => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        TimeOrNow::SpecificTime(t) => {
            let (sec, nsec) = match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
                Err(e) => {
                    let d = e.duration();
                    let mut sec = -(d.as_secs() as i64);
                    let mut nsec = -i64::from(d.subsec_nanos());
                    if nsec < 0 {
                        sec -= 1;
                        nsec += 1_000_000_000;
                    }
                    (sec, nsec)
                }
            };
            rustix::fs::Timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            }
        }
    }
}

/// The last component's name for an *at call in the parent's upper fd ("." for the root,
/// whose "parent" fd is the upper root itself).
fn at_name(rel: &[u8]) -> &[u8] {
    if rel.is_empty() {
        b"."
    } else {
        split_rel(rel).1
    }
}

impl BranchFs {
    pub fn new(branches: Branches) -> BranchFs {
        BranchFs {
            branches,
            nodes: RwLock::new(Nodes::default()),
            next_ino: AtomicU64::new(BRANCH_BIT | 1),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(BRANCH_BIT | 1),
        }
    }

    pub fn branches(&self) -> &Branches {
        &self.branches
    }

    /// The node's branch (ESTALE once dropped) and path.
    fn node(&self, ino: u64) -> io::Result<(Arc<Branch>, Vec<u8>)> {
        let nodes = self.nodes.read().unwrap_or_else(|p| p.into_inner());
        let node = nodes.by_ino.get(&ino).ok_or_else(|| errno(libc::ESTALE))?;
        match self.branches.get(&node.branch.info.name) {
            Some(b) if Arc::ptr_eq(&b, &node.branch) => Ok((b, node.rel.clone())),
            _ => Err(errno(libc::ESTALE)),
        }
    }

    fn node_inode(&self, branch: &Arc<Branch>, rel: &[u8]) -> u64 {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let key = (branch.info.name.clone(), rel.to_vec());
        if let Some(&ino) = nodes.by_key.get(&key)
            && let Some(node) = nodes.by_ino.get_mut(&ino)
            && Arc::ptr_eq(&node.branch, branch)
        {
            node.lookups += 1;
            return ino;
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        nodes.by_key.insert(key, ino);
        nodes.by_ino.insert(
            ino,
            Node {
                branch: branch.clone(),
                rel: rel.to_vec(),
                lookups: 1,
            },
        );
        ino
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let Some(node) = nodes.by_ino.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let key = (node.branch.info.name.clone(), node.rel.clone());
            nodes.by_ino.remove(&ino);
            if nodes.by_key.get(&key) == Some(&ino) {
                nodes.by_key.remove(&key);
            }
        }
    }

    /// The node at `rel` of `branch` leaves its name (unlinked, replaced).
    fn detach(&self, branch: &Branch, rel: &[u8]) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(ino) = nodes
            .by_key
            .remove(&(branch.info.name.clone(), rel.to_vec()))
            && let Some(node) = nodes.by_ino.get_mut(&ino)
        {
            node.rel = DETACHED.to_vec();
        }
    }

    /// The nodes at `from` and below move to `to` (and, with `exchange`, those at `to` to
    /// `from`).
    fn moved(&self, branch: &Branch, from: &[u8], to: &[u8], exchange: bool) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let name = &branch.info.name;
        let under = |rel: &[u8], base: &[u8]| {
            rel == base || (rel.starts_with(base) && rel.get(base.len()) == Some(&b'/'))
        };
        let mut changed = Vec::new();
        for (&ino, node) in nodes.by_ino.iter_mut() {
            if &node.branch.info.name != name {
                continue;
            }
            let new = if under(&node.rel, from) {
                let mut r = to.to_vec();
                r.extend_from_slice(&node.rel[from.len()..]);
                r
            } else if exchange && under(&node.rel, to) {
                let mut r = from.to_vec();
                r.extend_from_slice(&node.rel[to.len()..]);
                r
            } else {
                continue;
            };
            changed.push((ino, std::mem::replace(&mut node.rel, new.clone()), new));
        }
        for (ino, old, _) in &changed {
            let key = (name.clone(), old.clone());
            if nodes.by_key.get(&key) == Some(ino) {
                nodes.by_key.remove(&key);
            }
        }
        for (ino, _, new) in changed {
            nodes.by_key.insert((name.clone(), new), ino);
        }
    }

    fn entry_of(&self, ino: u64, layer: &Layer) -> Entry {
        Entry {
            attr: attr_of(ino, layer),
            ttl: TTL,
            generation: 0,
        }
    }

    fn lookup_rel(&self, history: &History, branch: &Arc<Branch>, rel: &[u8]) -> io::Result<Entry> {
        let layer = branch
            .resolve(history, rel)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let ino = self.node_inode(branch, rel);
        Ok(self.entry_of(ino, &layer))
    }

    /// LOOKUP of `.checkpoint/branches/NAME`: the branch's root.
    pub fn root_entry(&self, history: &History, name: &OsStr) -> io::Result<Entry> {
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| errno(libc::ENOENT))?;
        let branch = self.branches.get(name).ok_or_else(|| errno(libc::ENOENT))?;
        let entry = self.lookup_rel(history, &branch, b"")?;
        // The list of branches changes without the kernel seeing it.
        Ok(Entry {
            ttl: Duration::ZERO,
            ..entry
        })
    }

    pub fn lookup(&self, history: &History, parent: u64, name: &OsStr) -> io::Result<Entry> {
        let (branch, prel) = self.node(parent)?;
        if name.as_bytes().starts_with(b".wh.") {
            return Err(errno(libc::ENOENT));
        }
        self.lookup_rel(history, &branch, &join_rel(&prel, name.as_bytes()))
    }

    fn file(&self, fh: u64) -> io::Result<Arc<BranchHandle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or_else(|| errno(libc::EBADF))
    }

    pub fn getattr(
        &self,
        history: &History,
        ino: u64,
        fh: Option<u64>,
    ) -> io::Result<(FileAttr, Duration)> {
        if let Some(fh) = fh
            && let Ok(h) = self.file(fh)
            && let BranchHandle::File { file, .. } = &*h
        {
            // Survives an unlink; the lower's content has the lower's attributes.
            let (branch, rel) = self.node(ino)?;
            if let Some(Layer::Lower(e)) = branch.resolve(history, &rel)? {
                return Ok((view_attr(ino, &e), TTL));
            }
            return Ok((attr_from_stat(ino, &sys::fstat(file.as_fd())?), TTL));
        }
        let (branch, rel) = self.node(ino)?;
        match branch.resolve(history, &rel)? {
            Some(layer) => Ok((attr_of(ino, &layer), TTL)),
            // fstat(2) of a file unlinked while open comes without its handle: any open
            // handle of the node answers.
            None => match self.open_file_of(ino) {
                Some(h) => match &*h {
                    BranchHandle::File { file, .. } => {
                        Ok((attr_from_stat(ino, &sys::fstat(file.as_fd())?), TTL))
                    }
                    BranchHandle::Listing(_) => Err(errno(libc::ENOENT)),
                },
                None => Err(errno(libc::ENOENT)),
            },
        }
    }

    /// An open file handle of node `ino` (O(open handles): only for unlinked nodes).
    fn open_file_of(&self, ino: u64) -> Option<Arc<BranchHandle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|h| matches!(&***h, BranchHandle::File { ino: i, .. } if *i == ino))
            .cloned()
    }

    pub fn setattr(
        &self,
        history: &History,
        ino: u64,
        set: SetAttr,
    ) -> io::Result<(FileAttr, Duration)> {
        let (branch, rel) = self.node(ino)?;
        let handle = match set.fh {
            Some(fh) => Some(self.file(fh)?),
            None => None,
        };
        let file = match handle.as_deref() {
            Some(BranchHandle::File {
                file,
                writable: true,
                ..
            }) => Some(file),
            _ => None,
        };
        {
            let _changes = branch.lock_changes();
            let dir = branch.copy_up(history, &rel)?;
            let change = AttrChange {
                mode: set.mode,
                uid: set.uid,
                gid: set.gid,
                size: set.size,
                atime: set.atime.map(ts),
                mtime: set.mtime.map(ts),
            };
            branch.set_attr(dir.as_fd(), at_name(&rel), file, &change)?;
        }
        self.getattr(history, ino, None)
    }

    pub fn readlink(&self, history: &History, ino: u64) -> io::Result<Vec<u8>> {
        let (branch, rel) = self.node(ino)?;
        match branch.resolve(history, &rel)? {
            Some(Layer::Upper(st)) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                let dir = branch.upper_dir_fd(split_rel(&rel).0)?;
                let name =
                    std::ffi::CString::new(split_rel(&rel).1).map_err(|_| errno(libc::EINVAL))?;
                sys::readlinkat(dir.as_fd(), &name)
            }
            Some(Layer::Lower(e)) if e.meta.kind == EntryKind::Symlink => {
                history.view_symlink_target(&e)
            }
            Some(_) => Err(errno(libc::EINVAL)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    /// MKDIR, MKNOD, SYMLINK and CREATE: the name made in the upper (its parent copied up
    /// first), owned by the caller (the group of a setgid parent, which a new directory
    /// inherits), `mode` with the umask applied as the kernel left it to us.
    fn make(
        &self,
        history: &History,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        what: New<'_>,
    ) -> io::Result<(Entry, Option<File>)> {
        Branch::check_name(name)?;
        let (branch, prel) = self.node(parent)?;
        let rel = join_rel(&prel, name.as_bytes());
        let file = {
            let _changes = branch.lock_changes();
            if branch.resolve(history, &rel)?.is_some() {
                return Err(errno(libc::EEXIST));
            }
            let dir = branch.copy_up_dir(history, &prel)?;
            let pst = sys::fstat(dir.as_fd())?;
            let setgid = pst.st_mode & libc::S_ISGID != 0;
            let gid = if setgid { pst.st_gid } else { caller.gid };
            let what = match what {
                New::Dir { mode } if setgid => New::Dir {
                    mode: mode | libc::S_ISGID,
                },
                other => other,
            };
            self.detach(&branch, &rel);
            branch.make(dir.as_fd(), name.as_bytes(), &what, (caller.uid, gid))?
        };
        Ok((self.lookup_rel(history, &branch, &rel)?, file))
    }

    pub fn mkdir(
        &self,
        history: &History,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> io::Result<Entry> {
        let mode = mode & 0o7777 & !umask;
        Ok(self
            .make(history, caller, parent, name, New::Dir { mode })?
            .0)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        history: &History,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u64,
    ) -> io::Result<Entry> {
        let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !umask);
        Ok(self
            .make(history, caller, parent, name, New::Node { mode, rdev })?
            .0)
    }

    pub fn symlink(
        &self,
        history: &History,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        target: &std::path::Path,
    ) -> io::Result<Entry> {
        let target = target.as_os_str().as_bytes();
        Ok(self
            .make(history, caller, parent, name, New::Symlink { target })?
            .0)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        history: &History,
        caller: &Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> io::Result<(Entry, Opened)> {
        let mode = mode & 0o7777 & !umask;
        let (entry, file) = self.make(history, caller, parent, name, New::File { mode, flags })?;
        let file = file.ok_or_else(|| errno(libc::EIO))?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let ino = entry.attr.ino.0;
        Ok((
            entry,
            self.opened(BranchHandle::File {
                file,
                writable,
                ino,
            }),
        ))
    }

    pub fn link(
        &self,
        history: &History,
        ino: u64,
        new_parent: u64,
        new_name: &OsStr,
    ) -> io::Result<Entry> {
        Branch::check_name(new_name)?;
        let (branch, rel) = self.node(ino)?;
        let (to_branch, to_prel) = self.node(new_parent)?;
        if !Arc::ptr_eq(&branch, &to_branch) {
            return Err(errno(libc::EXDEV));
        }
        let to_rel = join_rel(&to_prel, new_name.as_bytes());
        {
            let _changes = branch.lock_changes();
            if branch.resolve(history, &to_rel)?.is_some() {
                return Err(errno(libc::EEXIST));
            }
            let from_dir = branch.copy_up(history, &rel)?;
            let to_dir = branch.copy_up_dir(history, &to_prel)?;
            self.detach(&branch, &to_rel);
            branch.link(
                from_dir.as_fd(),
                split_rel(&rel).1,
                to_dir.as_fd(),
                new_name.as_bytes(),
            )?;
        }
        self.lookup_rel(history, &branch, &to_rel)
    }

    /// UNLINK (`is_dir` false) or RMDIR: the upper entry goes, and a whiteout hides the
    /// lower's if it would show.
    pub fn remove(
        &self,
        history: &History,
        parent: u64,
        name: &OsStr,
        is_dir: bool,
    ) -> io::Result<()> {
        Branch::check_name(name).map_err(|_| errno(libc::ENOENT))?;
        let (branch, prel) = self.node(parent)?;
        let rel = join_rel(&prel, name.as_bytes());
        let _changes = branch.lock_changes();
        let layer = branch
            .resolve(history, &rel)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let dir = layer_is_dir(&layer);
        match (is_dir, dir) {
            (false, true) => return Err(errno(libc::EISDIR)),
            (true, false) => return Err(errno(libc::ENOTDIR)),
            _ => {}
        }
        if is_dir && !branch.list(history, &rel)?.is_empty() {
            return Err(errno(libc::ENOTEMPTY));
        }
        if let Layer::Upper(_) = layer {
            let pdir = branch.upper_dir_fd(&prel)?;
            branch.remove_upper(pdir.as_fd(), name.as_bytes(), is_dir)?;
        }
        branch.whiteout(history, &rel)?;
        self.detach(&branch, &rel);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rename(
        &self,
        history: &History,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: u32,
    ) -> io::Result<()> {
        Branch::check_name(name).map_err(|_| errno(libc::ENOENT))?;
        Branch::check_name(new_name)?;
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(errno(libc::EINVAL));
        }
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let (branch, prel) = self.node(parent)?;
        let (to_branch, to_prel) = self.node(new_parent)?;
        if !Arc::ptr_eq(&branch, &to_branch) {
            return Err(errno(libc::EXDEV));
        }
        let from = join_rel(&prel, name.as_bytes());
        let to = join_rel(&to_prel, new_name.as_bytes());
        let _changes = branch.lock_changes();
        let src = branch
            .resolve(history, &from)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let dst = branch.resolve(history, &to)?;
        if from == to {
            return Ok(());
        }
        match &dst {
            Some(_) if flags & libc::RENAME_NOREPLACE != 0 => return Err(errno(libc::EEXIST)),
            None if exchange => return Err(errno(libc::ENOENT)),
            Some(d) if !exchange => match (layer_is_dir(&src), layer_is_dir(d)) {
                (true, false) => return Err(errno(libc::ENOTDIR)),
                (false, true) => return Err(errno(libc::EISDIR)),
                (true, true) if !branch.list(history, &to)?.is_empty() => {
                    return Err(errno(libc::ENOTEMPTY));
                }
                _ => {}
            },
            _ => {}
        }
        // Both ends become upper entries that hold everything they show.
        let carry = |rel: &[u8], layer: &Layer| -> io::Result<()> {
            if layer_is_dir(layer) {
                branch.copy_up_tree(history, rel)
            } else {
                branch.copy_up(history, rel).map(drop)
            }
        };
        carry(&from, &src)?;
        if let Some(d) = dst.as_ref().filter(|_| exchange) {
            carry(&to, d)?;
        }
        if let Some(d) = dst.as_ref().filter(|d| !exchange && layer_is_dir(d))
            && let Layer::Upper(_) = d
        {
            branch.clear_own_names(&to)?;
        }
        let from_dir = branch.upper_dir_fd(&prel)?;
        let to_dir = branch.copy_up_dir(history, &to_prel)?;
        if !exchange {
            branch.before_create(to_dir.as_fd(), new_name.as_bytes())?;
            self.detach(&branch, &to);
        }
        branch.rename_upper(
            from_dir.as_fd(),
            name.as_bytes(),
            to_dir.as_fd(),
            new_name.as_bytes(),
            flags,
        )?;
        if !exchange {
            branch.whiteout(history, &from)?;
        }
        self.moved(&branch, &from, &to, exchange);
        Ok(())
    }

    fn opened(&self, handle: BranchHandle) -> Opened {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(handle));
        Opened {
            fh,
            backing: None,
            direct_io: false,
            keep_cache: false,
            flush_on_close: false,
        }
    }

    /// OPEN: a write or truncate copies the file up first (the branch's change lock held
    /// for the copy), then opens the upper; a read opens whichever layer has it.
    pub fn open(&self, history: &History, ino: u64, flags: i32) -> io::Result<Opened> {
        let (branch, rel) = self.node(ino)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable || flags & libc::O_TRUNC != 0 {
            let _changes = branch.lock_changes();
            match branch.resolve(history, &rel)? {
                Some(l) if layer_is_dir(&l) => return Err(errno(libc::EISDIR)),
                Some(_) => {}
                None => return Err(errno(libc::ENOENT)),
            }
            branch.copy_up(history, &rel)?;
            let file = branch.open_upper(&rel, flags)?;
            return Ok(self.opened(BranchHandle::File {
                file,
                writable,
                ino,
            }));
        }
        let file = match branch.resolve(history, &rel)? {
            Some(Layer::Upper(st)) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                return Err(errno(libc::EISDIR));
            }
            Some(Layer::Upper(_)) => branch.open_upper(&rel, flags)?,
            Some(Layer::Lower(e)) if e.meta.kind == EntryKind::File => history.view_open(&e)?,
            Some(Layer::Lower(e)) if e.meta.kind == EntryKind::Dir => {
                return Err(errno(libc::EISDIR));
            }
            Some(Layer::Lower(_)) => return Err(errno(libc::EACCES)),
            None => return Err(errno(libc::ENOENT)),
        };
        Ok(self.opened(BranchHandle::File {
            file,
            writable: false,
            ino,
        }))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32, out: &mut Vec<u8>) -> io::Result<()> {
        let h = self.file(fh)?;
        let BranchHandle::File { file, .. } = &*h else {
            return Err(errno(libc::EISDIR));
        };
        super::virt::read_at_most(file, offset, size, out)
    }

    fn writable(&self, fh: u64) -> io::Result<Arc<BranchHandle>> {
        let h = self.file(fh)?;
        match &*h {
            BranchHandle::File { writable: true, .. } => Ok(h),
            _ => Err(errno(libc::EBADF)),
        }
    }

    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> io::Result<u32> {
        let h = self.writable(fh)?;
        let BranchHandle::File { file, .. } = &*h else {
            return Err(errno(libc::EBADF));
        };
        let mut written = 0;
        while written < data.len() {
            let n = Branch::pwrite(file, &data[written..], offset + written as u64)?;
            if n == 0 {
                break;
            }
            written += n;
        }
        Ok(written as u32)
    }

    pub fn fallocate(&self, fh: u64, offset: u64, length: u64, mode: i32) -> io::Result<()> {
        let h = self.writable(fh)?;
        let BranchHandle::File { file, .. } = &*h else {
            return Err(errno(libc::EBADF));
        };
        Branch::fallocate(file, mode, offset, length)
    }

    pub fn fsync(&self, fh: u64, datasync: bool) -> io::Result<()> {
        match &*self.file(fh)? {
            BranchHandle::File { file, .. } => sys::fsync(file.as_fd(), datasync),
            BranchHandle::Listing(_) => Ok(()),
        }
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> io::Result<i64> {
        match &*self.file(fh)? {
            BranchHandle::File { file, .. } => sys::lseek(file.as_fd(), offset, whence),
            BranchHandle::Listing(_) => Err(errno(libc::ESPIPE)),
        }
    }

    pub fn release(&self, fh: u64) {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
    }

    pub fn opendir(&self, history: &History, ino: u64) -> io::Result<u64> {
        let (branch, rel) = self.node(ino)?;
        let items = branch
            .list(history, &rel)?
            .into_iter()
            .map(|(n, k)| (n, file_type_of(k)))
            .collect();
        Ok(self.opened(BranchHandle::Listing(items)).fh)
    }

    fn listing(&self, fh: u64) -> io::Result<Arc<BranchHandle>> {
        let h = self.file(fh)?;
        match &*h {
            BranchHandle::Listing(_) => Ok(h),
            BranchHandle::File { .. } => Err(errno(libc::ENOTDIR)),
        }
    }

    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>) -> bool,
    ) -> io::Result<()> {
        let h = self.listing(fh)?;
        let BranchHandle::Listing(items) = &*h else {
            return Err(errno(libc::ENOTDIR));
        };
        super::virt::emit_listing(ino, items, offset, emit);
        Ok(())
    }

    pub fn readdirplus(
        &self,
        history: &History,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>, Option<&Entry>) -> bool,
    ) -> io::Result<()> {
        let h = self.listing(fh)?;
        let BranchHandle::Listing(items) = &*h else {
            return Err(errno(libc::ENOTDIR));
        };
        super::virt::emit_listing_plus(
            ino,
            items,
            offset,
            &|name| self.lookup(history, ino, OsStr::from_bytes(name)),
            &|ino| self.forget(ino, 1),
            emit,
        );
        Ok(())
    }
}

fn layer_is_dir(layer: &Layer) -> bool {
    match layer {
        Layer::Upper(st) => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        Layer::Lower(e) => e.meta.kind == EntryKind::Dir,
    }
}

fn attr_of(ino: u64, layer: &Layer) -> FileAttr {
    match layer {
        Layer::Upper(st) => attr_from_stat(ino, st),
        Layer::Lower(e) => view_attr(ino, e),
    }
}
