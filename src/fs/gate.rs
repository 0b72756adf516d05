//! The mutation gate: the one place through which every change to SRC passes.
//!
//! A change to SRC needs a *permit*, and the permit is the only thing that can make it:
//!
//! - [`ObjectPermit`] (chmod, chown, utimes, truncate, xattrs, an open that can write) is
//!   bound to one inode;
//! - [`EntryPermit`] (create, mkdir, mknod, symlink, link, unlink, rmdir) to one name in
//!   one directory;
//! - [`RenamePermit`] to the two names of a rename;
//! - [`WritePermit`] (write, fallocate, copy_file_range into) to one handle, and only a
//!   [`WritableFd`] yields one — an fd that only a permit's open can make.
//!
//! Each permit is made by a `Gate::*_permit` method, which first hands the affected paths
//! to the file-history system (Layer 1: the pre-image is backed up before the change). Its
//! fields are private, so no other module can make one, and the mutations are its methods,
//! acting on the target it was issued for. The syscalls behind them live in the private
//! [`syscalls`] module; clippy's `disallowed-methods` (clippy.toml) refuses the raw mutating
//! libc and std::fs calls everywhere else, so a change that skips the gate does not pass
//! `cargo clippy -D warnings`, and one that calls a mutation without its permit does not
//! compile (tests/gate_compile_fail.rs).
//!
//! A permit also holds the history's *epoch lock* shared ([`MutationAdmitted`]) for as long
//! as the mutation runs; a checkpoint or gc holds it alone (`History::quiesce`), so a
//! checkpoint never falls between a mutation's backup and the mutation itself.
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use log::debug;

use super::handles::FileHandle;
use super::inodes::{Inode, ObjectKey};
use crate::history::store::LinkedObject;
use crate::history::{Caller, History, MutationAdmitted, RenameRecord};
use crate::sys::{self, errno};

/// What every permit holds while its mutation runs: the epoch lock (shared) and the paths
/// whose change the exclusion rules depend on.
struct Admission<'g> {
    _epoch: MutationAdmitted<'g>,
    history: &'g History,
    /// Changed paths on which the exclusion rules depend (a `.gitignore`, a renamed
    /// directory): reported to the history when the permit is dropped, i.e. once the
    /// mutation is done and the new rules are on disk.
    rules_touched: Vec<Vec<u8>>,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        for rel in &self.rules_touched {
            self.history.exclusion_rules_changed(rel);
        }
    }
}

/// An fd that can change a file's data in SRC. Only a permit's open makes one
/// ([`ObjectPermit::open_for_writing`], [`EntryPermit::create`]), so holding one proves the
/// open was gated; a [`WritePermit`] for writes through it comes from [`Gate::write_permit`].
pub struct WritableFd(OwnedFd);

impl AsFd for WritableFd {
    /// For reading, stat, fsync and kernel passthrough's backing file: every write-capable
    /// call in this crate is a permit method (clippy.toml refuses the raw ones).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Permission to change one object (see the module docs). Made by [`Gate::object_permit`].
pub struct ObjectPermit<'g> {
    admission: Admission<'g>,
    inode: &'g Inode,
}

/// Permission to add or remove one name in one directory. Made by [`Gate::entry_permit`].
pub struct EntryPermit<'g> {
    admission: Admission<'g>,
    /// The parent directory, opened as the daemon when the permit was issued (before any
    /// switch to the caller's credentials).
    dir: Arc<OwnedFd>,
    name: &'g CStr,
    is_dir: bool,
    /// The backup of a file being unlinked, when it was linked into the store: it learns
    /// from [`EntryPermit::remove`] whether the unlink happened.
    leaving: Option<LinkedObject<'g>>,
}

/// Permission for one rename(2). Made by [`Gate::rename_permit`].
pub struct RenamePermit<'g> {
    /// The format-4 record of the rename, whose outcome [`RenamePermit::rename`] records
    /// (dropped unused: recorded as failed). First, so that it is dropped before the
    /// admission: no checkpoint falls between a rename's intent and its outcome.
    record: Option<RenameRecord<'g>>,
    _admission: Admission<'g>,
    dir: Arc<OwnedFd>,
    name: &'g CStr,
    new_dir: Arc<OwnedFd>,
    new_name: &'g CStr,
    flags: u32,
    /// The backup of the file the rename replaces, when it was linked into the store: it
    /// learns from [`RenamePermit::rename`] whether the rename happened.
    replaced: Option<LinkedObject<'g>>,
}

/// Permission to write through one gated handle. Made by [`Gate::write_permit`].
pub struct WritePermit<'g> {
    _admission: Admission<'g>,
    file: &'g WritableFd,
    inode: &'g Inode,
}

pub struct Gate {
    history: Arc<History>,
    /// SRC as the daemon sees it, to turn fd paths into paths relative to the mount root.
    src_prefix: Vec<u8>,
}

impl Gate {
    pub fn new(history: Arc<History>, src_prefix: Vec<u8>) -> Gate {
        Gate {
            history,
            src_prefix,
        }
    }

    pub fn history(&self) -> &Arc<History> {
        &self.history
    }

    fn admit(&self) -> Admission<'_> {
        Admission {
            _epoch: self.history.admit_mutation(),
            history: &self.history,
            rules_touched: Vec::new(),
        }
    }

    /// Backs up `inode` (chmod/chown/utimes, truncate, xattr changes, an open that can
    /// write), then returns the permit to change it. An error (the backup failed) must fail
    /// the operation with that errno, the object untouched.
    pub fn object_permit<'g>(
        &'g self,
        caller: &Caller,
        inode: &'g Inode,
    ) -> io::Result<ObjectPermit<'g>> {
        let mut admission = self.admit();
        self.back_up_object(caller, inode, &mut admission)?;
        Ok(ObjectPermit { admission, inode })
    }

    /// Layer 1 for a change to `inode`'s object: backs it up under every name of it the
    /// inode table knows (a hard-linked file is one object: a change through one name is a
    /// change of all; [`Gate::rel_paths_of`]).
    fn back_up_object(
        &self,
        caller: &Caller,
        inode: &Inode,
        admission: &mut Admission<'_>,
    ) -> io::Result<()> {
        let paths = self.rel_paths_of(inode)?;
        if paths.is_empty() {
            return Ok(());
        }
        // The backup reads the object through its own fd: every name leads to it.
        let fd = inode.fd()?;
        for rel in &paths {
            debug!(
                "gate: {} modifies {:?}",
                caller,
                String::from_utf8_lossy(rel)
            );
        }
        let is_dir = Some(inode.is_dir());
        if let [rel] = paths.as_slice() {
            self.history
                .before_object_change(caller, rel, fd.as_fd(), is_dir)?;
        } else {
            // A hard link: one capture serves every name.
            self.history
                .before_linked_object_change(caller, &paths, fd.as_fd(), is_dir)?;
        }
        for rel in paths {
            self.note_rules_dependency(&mut admission.rules_touched, rel, false);
        }
        Ok(())
    }

    /// The permit to make `name` in `parent` a new link to `existing`: backs up the new
    /// name, and `existing` under every name it has (its link count is part of what a
    /// checkpoint records of each, and a rewind links names recorded as one object).
    pub fn link_permit<'g>(
        &'g self,
        caller: &Caller,
        existing: &Inode,
        parent: &'g Inode,
        name: &'g CStr,
    ) -> io::Result<EntryPermit<'g>> {
        let mut permit = self.issue_entry_permit(caller, parent, name, false, false)?;
        self.back_up_object(caller, existing, &mut permit.admission)?;
        Ok(permit)
    }

    /// Backs up `name` in `parent` (it appears or disappears: create, mkdir, mknod,
    /// symlink, link, unlink, rmdir; `is_dir` for mkdir and rmdir), then returns the permit.
    pub fn entry_permit<'g>(
        &'g self,
        caller: &Caller,
        parent: &'g Inode,
        name: &'g CStr,
        is_dir: bool,
    ) -> io::Result<EntryPermit<'g>> {
        self.issue_entry_permit(caller, parent, name, is_dir, false)
    }

    /// The permit to unlink `name` (not a directory) in `parent`: as
    /// [`Gate::entry_permit`], except that the file may be backed up by linking it into the
    /// store (Layer 1's [`History::before_removal`]); [`EntryPermit::remove`] then settles
    /// that backup.
    /// `object`: the table's entry of the file at `name`, if it has one; when the file has
    /// other links, they are backed up too (their link count changes).
    pub fn removal_permit<'g>(
        &'g self,
        caller: &Caller,
        parent: &'g Inode,
        name: &'g CStr,
        object: Option<&Inode>,
    ) -> io::Result<EntryPermit<'g>> {
        let mut permit = self.issue_entry_permit(caller, parent, name, false, true)?;
        if let Some(object) = object.filter(|o| !o.is_dir() && o.has_other_names()) {
            self.back_up_object(caller, object, &mut permit.admission)?;
        }
        Ok(permit)
    }

    fn issue_entry_permit<'g>(
        &'g self,
        caller: &Caller,
        parent: &'g Inode,
        name: &'g CStr,
        is_dir: bool,
        removal: bool,
    ) -> io::Result<EntryPermit<'g>> {
        let mut admission = self.admit();
        let mut leaving = None;
        let dir = parent.fd()?;
        if let Some(rel) = self.rel_child(parent, name)? {
            debug!(
                "gate: {} {} {:?}",
                caller,
                if removal { "removes" } else { "adds/removes" },
                String::from_utf8_lossy(&rel)
            );
            // The backup looks at `name` in the very directory the permit changes.
            let entry = (dir.as_fd(), name);
            if removal {
                leaving = self
                    .history
                    .before_entry_removal(caller, &rel, entry, Some(is_dir))?;
            } else {
                self.history
                    .before_entry_change(caller, &rel, entry, Some(is_dir))?;
            }
            self.note_rules_dependency(&mut admission.rules_touched, rel, false);
        }
        Ok(EntryPermit {
            admission,
            dir,
            name,
            is_dir,
            leaving,
        })
    }

    /// Backs up both names of a rename(2) with `flags` (RENAME_EXCHANGE, RENAME_NOREPLACE,
    /// RENAME_WHITEOUT), then returns the permit.
    pub fn rename_permit<'g>(
        &'g self,
        caller: &Caller,
        (parent, name): (&'g Inode, &'g CStr),
        (new_parent, new_name): (&'g Inode, &'g CStr),
        flags: u32,
    ) -> io::Result<RenamePermit<'g>> {
        let mut admission = self.admit();
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let replaces = flags & (libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) == 0;
        let from = self.rel_child(parent, name)?;
        let to = self.rel_child(new_parent, new_name)?;
        let mut replaced = None;
        let mut record = None;
        if let (Some(from), Some(to)) = (from, to) {
            debug!(
                "gate: {} renames {:?} -> {:?}{}",
                caller,
                String::from_utf8_lossy(&from),
                String::from_utf8_lossy(&to),
                if exchange { " (exchange)" } else { "" }
            );
            let backup = self
                .history
                .before_rename(caller, &from, &to, exchange, replaces)?;
            (replaced, record) = (backup.replaced, backup.record);
            self.note_rules_dependency(&mut admission.rules_touched, from, true);
            self.note_rules_dependency(&mut admission.rules_touched, to, true);
        }
        Ok(RenamePermit {
            _admission: admission,
            dir: parent.fd()?,
            name,
            new_dir: new_parent.fd()?,
            new_name,
            flags,
            replaced,
            record,
        })
    }

    /// The permit to write through `file`, a handle on `inode` opened through the gate.
    /// It needs no backup of its own: the open that made `file` was gated, and a checkpoint
    /// captures files open for writing. (A `.gitignore` written this way is reported when
    /// the handle is released.)
    pub fn write_permit<'g>(
        &'g self,
        file: &'g WritableFd,
        inode: &'g Inode,
    ) -> io::Result<WritePermit<'g>> {
        Ok(WritePermit {
            _admission: self.admit(),
            file,
            inode,
        })
    }

    fn note_rules_dependency(&self, touched: &mut Vec<Vec<u8>>, rel: Vec<u8>, rename: bool) {
        if self.history.exclusion_rules_depend_on(&rel, rename) {
            touched.push(rel);
        }
    }

    /// Every path of `inode`'s object relative to the mount root, for Layer 1: the one its
    /// fd has ([`Gate::rel_path_of`]), and for a non-directory looked up under more than one
    /// name (a hard link) each other name the inode table has seen that still leads to the
    /// object (one `fstatat` each; the names that no longer do are dropped). Empty when
    /// the object has no path (unlinked). Cost: O(names), never a walk (inodes.rs,
    /// invariant 8); a file with more links than names seen is logged, once per entry.
    pub fn rel_paths_of(&self, inode: &Inode) -> io::Result<Vec<Vec<u8>>> {
        let primary = self.rel_path_of(inode)?;
        if inode.is_dir() || !inode.has_other_names() {
            self.report_unseen_links(inode, primary.iter().count(), primary.as_deref());
            return Ok(primary.into_iter().collect());
        }
        let mut paths: Vec<Vec<u8>> = primary.into_iter().collect();
        let mut gone = Vec::new();
        for (parent, name) in inode.names() {
            let found = parent
                .fd()
                .and_then(|dir| sys::fstatat(dir.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW));
            match found {
                Ok(st) if ObjectKey::of(&st) == inode.key => {}
                Ok(_) => {
                    gone.push((parent, name));
                    continue;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                    gone.push((parent, name));
                    continue;
                }
                Err(e) => return Err(e),
            }
            match self.rel_child(&parent, &name) {
                Ok(Some(rel)) if !paths.contains(&rel) => paths.push(rel),
                Ok(_) => {}
                // The link's directory left SRC behind the mount's back: the change
                // through this name is still recorded under the others.
                Err(e) => log::warn!(
                    "not recording a change of inode {} under its link {:?}: {e}",
                    inode.ino,
                    name
                ),
            }
        }
        inode.forget_names(&gone);
        self.report_unseen_links(inode, paths.len(), paths.first().map(Vec::as_slice));
        Ok(paths)
    }

    /// Logs, once per inode entry, a change to a file with more links than names the
    /// daemon has seen: the unseen names (made in SRC directly and never looked up through
    /// the mount) are not recorded, so views of earlier checkpoints show their live content
    /// until a lookup makes them known.
    fn report_unseen_links(&self, inode: &Inode, seen: usize, rel: Option<&[u8]>) {
        if inode.is_dir() || inode.links_at_lookup() <= seen as u64 || inode.unseen_links_reported()
        {
            return;
        }
        // The count from the last lookup may be stale (a link removed since): look again.
        let links = match inode.fd().and_then(|fd| sys::fstat(fd.as_fd())) {
            Ok(st) => st.st_nlink,
            Err(_) => return,
        };
        if links <= seen as u64 || !inode.first_unseen_links_report() {
            return;
        }
        log::warn!(
            "{}: {links} links, {seen} seen through the mount: a change is recorded under \
             the names seen only; a name never looked up through the mount (made in SRC \
             directly) shows its live content in views until it is",
            String::from_utf8_lossy(rel.unwrap_or(b"?"))
        );
    }

    /// The path of `inode` relative to the mount root (empty for the root itself), or
    /// `None` when the object is no longer reachable (unlinked), so no tree path changes.
    /// ESTALE for a linked object whose path is not beneath SRC (moved out behind the
    /// mount's back, or a file decoded from a file handle the kernel has not connected to
    /// a path yet): a change to it could not be tracked.
    pub fn rel_path_of(&self, inode: &Inode) -> io::Result<Option<Vec<u8>>> {
        let fd = inode.fd()?;
        match sys::fd_path(fd.as_raw_fd()) {
            Ok(Some(abs)) => match self.strip_src(inode, &abs) {
                Some(rel) => Ok(Some(rel)),
                None if sys::fstat(fd.as_fd())?.st_nlink == 0 => Ok(None),
                None => Err(sys::errno(libc::ESTALE)),
            },
            Ok(None) => Ok(None),
            // The kernel spells an fd's path in one page; deeper paths are legal.
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                self.rel_path_by_origins(inode)
            }
            Err(e) => Err(e),
        }
    }

    /// The path of `inode` from the names it was reached under (its origins, invariant 4 of
    /// the inode table), for a path too long for the kernel to spell. Checked once, end to
    /// end: the path, opened beneath SRC without following symlinks, must lead to `inode`'s
    /// object. Only when it does not (a rename in SRC behind the mount's back, an unlinked
    /// name) is each step checked, to tell the cases apart ([`Gate::rel_path_step_by_step`]).
    /// O(depth) either way (issue 28: a create at depth 5,000 cost 0.19 s, quadratic, nearly
    /// all of it in the kernel's `prepend_path` asked to spell every ancestor; then 12 ms at
    /// depth 2,500 with one `fstatat` per level).
    fn rel_path_by_origins(&self, inode: &Inode) -> io::Result<Option<Vec<u8>>> {
        if let Some(rel) = Self::path_from_origins(inode)
            && let Ok(rel_str) = std::str::from_utf8(&rel)
            && let Ok(Some(fd)) = self.history.open_existing(rel_str)
            && let Ok(st) = sys::fstat(fd.as_fd())
            && ObjectKey::of(&st) == inode.key
        {
            return Ok(Some(rel));
        }
        self.rel_path_step_by_step(inode)
    }

    /// The names from the root to `inode` by origins alone, unchecked; `None` when an
    /// ancestor has no origin (decoded from a file handle) before the root.
    fn path_from_origins(inode: &Inode) -> Option<Vec<u8>> {
        let mut names: Vec<CString> = Vec::new();
        let mut up = inode.origin();
        while let Some((parent, name)) = up {
            names.push(name);
            if parent.ino == crate::fs::ROOT_INO {
                return Some(names.iter().rev().fold(Vec::new(), |mut path, name| {
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name.as_bytes());
                    path
                }));
            }
            up = parent.origin();
        }
        None
    }

    /// [`Gate::rel_path_by_origins`] checking each step: the path of `inode` from its
    /// origins up to the root, or up to the nearest ancestor without an origin (a
    /// directory decoded from a file handle), whose path the kernel then spells. Each name
    /// is checked to still lead to its object (`fstatat` without following, same
    /// `(st_dev, st_ino)`): a rename made in SRC behind the mount's back gives ESTALE, not a
    /// wrong path whose backup would be of another file. The kernel is not asked to spell
    /// each ancestor on the way up: each `fd_path` walks that ancestor's whole dentry chain,
    /// even when it does not fit.
    fn rel_path_step_by_step(&self, inode: &Inode) -> io::Result<Option<Vec<u8>>> {
        let mut names: Vec<CString> = Vec::new();
        let mut child_key = inode.key;
        let mut up = inode.origin();
        let mut prefix = loop {
            let Some((parent, name)) = up else {
                // Only `inode` itself can lack an origin here (ancestors are handled below):
                // a file decoded from a handle whose path is too long for the kernel.
                return Err(sys::errno(libc::ESTALE));
            };
            let parent_fd = parent.fd()?;
            match sys::fstatat(parent_fd.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if ObjectKey::of(&st) == child_key => {}
                Ok(_) => return Err(sys::errno(libc::ESTALE)),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    // Unlinked (as "(deleted)" says for short paths), or renamed by someone
                    // else: only the first leaves no tree path to back up.
                    let st = sys::fstat(inode.fd()?.as_fd())?;
                    return if st.st_nlink == 0 && names.is_empty() {
                        Ok(None)
                    } else {
                        Err(sys::errno(libc::ESTALE))
                    };
                }
                Err(e) => return Err(e),
            }
            names.push(name);
            if parent.ino == crate::fs::ROOT_INO {
                break Vec::new();
            }
            child_key = parent.key;
            up = parent.origin();
            if up.is_none() {
                // Decoded from a file handle: the kernel connected it (a directory), so it
                // can spell its path if that fits in a page.
                match sys::fd_path(parent_fd.as_raw_fd()) {
                    Ok(Some(abs)) => match self.strip_src(&parent, &abs) {
                        Some(rel) => break rel,
                        None => return Err(sys::errno(libc::ESTALE)),
                    },
                    Ok(None) => return Ok(None),
                    Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                        return Err(sys::errno(libc::ESTALE));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        for name in names.iter().rev() {
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(name.as_bytes());
        }
        Ok(Some(prefix))
    }

    fn rel_child(&self, parent: &Inode, name: &CStr) -> io::Result<Option<Vec<u8>>> {
        let Some(mut rel) = self.rel_path_of(parent)? else {
            return Ok(None);
        };
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(name.to_bytes());
        Ok(Some(rel))
    }

    /// `abs`, the kernel's spelling of `inode`'s path, relative to SRC's root; `None` if it
    /// is not beneath it. The root's own spelling (empty after the prefix, or "/") counts
    /// only for the root: the kernel also spells a dentry it cannot connect to the mount
    /// (a file decoded from a handle, or one outside SRC's mount clone) as "/".
    fn strip_src(&self, inode: &Inode, abs: &[u8]) -> Option<Vec<u8>> {
        let rest = abs.strip_prefix(self.src_prefix.as_slice())?;
        let rel = match rest {
            [] => Vec::new(),
            [b'/', tail @ ..] => tail.to_vec(),
            // A sibling whose name starts with SRC's ("/src2" for "/src").
            _ => return None,
        };
        (!rel.is_empty() || inode.ino == crate::fs::ROOT_INO).then_some(rel)
    }
}

/// Tells a backup linked into the store whether the file really left SRC.
fn settle(backup: LinkedObject<'_>, result: &io::Result<()>) {
    // The store is the daemon's, also when the removal was made as another user.
    let _daemon = sys::FsCredsGuard::as_daemon();
    match result {
        Ok(()) => backup.removed(),
        Err(_) => backup.kept(),
    }
}

/// `via` if it is a handle on `inode` (a setattr names the handle it came through), else
/// `EBADF`: a permit acts on its own target only.
fn handle_on<'h>(inode: &Inode, via: Option<&'h FileHandle>) -> io::Result<Option<&'h FileHandle>> {
    match via {
        Some(h) if h.inode.ino != inode.ino => Err(errno(libc::EBADF)),
        other => Ok(other),
    }
}

/// Clears `bits` from the mode `inode` has now (a chown may already have cleared some of
/// them: re-applying the mode seen before it would set them again).
fn clear_mode_bits(inode: &Inode, bits: u32) -> io::Result<()> {
    if bits == 0 {
        return Ok(());
    }
    let fd = inode.fd()?;
    let st = sys::fstat(fd.as_fd())?;
    syscalls::chmod_object(fd.as_raw_fd(), st.st_mode & 0o7777 & !bits)
}

impl ObjectPermit<'_> {
    /// Whether the object is a file the exclusion rules are read from.
    pub fn touches_rules(&self) -> bool {
        !self.admission.rules_touched.is_empty()
    }

    /// chmod; through `via` (a handle on this object) when the request came with one.
    pub fn chmod(&self, mode: u32, via: Option<&FileHandle>) -> io::Result<()> {
        match handle_on(self.inode, via)? {
            Some(h) => syscalls::fchmod(h.fd(), mode),
            None => syscalls::chmod_object(self.inode.fd()?.as_raw_fd(), mode),
        }
    }

    /// chown (`u32::MAX` leaves that id alone), never following a symlink.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        syscalls::chown(self.inode.fd()?.as_fd(), uid, gid)
    }

    /// truncate; through `via` when it is a handle on this object open for writing, else
    /// through a fresh write-only open.
    pub fn truncate(&self, size: u64, via: Option<&FileHandle>) -> io::Result<()> {
        if let Some(w) = handle_on(self.inode, via)?.and_then(FileHandle::writable) {
            return syscalls::ftruncate(w.0.as_fd(), size);
        }
        if !self.inode.is_regular() {
            return Err(errno(if self.inode.is_dir() {
                libc::EISDIR
            } else {
                libc::EINVAL
            }));
        }
        let fd = syscalls::reopen(self.inode.fd()?.as_raw_fd(), libc::O_WRONLY)?;
        syscalls::ftruncate(fd.as_fd(), size)
    }

    /// utimensat (atime, mtime); through `via` when the request came with a handle.
    pub fn set_times(
        &self,
        times: &[libc::timespec; 2],
        via: Option<&FileHandle>,
    ) -> io::Result<()> {
        match handle_on(self.inode, via)? {
            Some(h) => syscalls::futimens(h.fd(), times),
            None => syscalls::utimens_object(self.inode.fd()?.as_raw_fd(), times),
        }
    }

    /// Clears set-id `bits` the kernel left to us to drop (see `fs::privs`).
    pub fn clear_mode_bits(&self, bits: u32) -> io::Result<()> {
        clear_mode_bits(self.inode, bits)
    }

    pub fn setxattr(&self, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
        self.inode
            .with_xattr_path(|at| syscalls::setxattr(at, name, value, flags))
    }

    pub fn removexattr(&self, name: &CStr) -> io::Result<()> {
        self.inode
            .with_xattr_path(|at| syscalls::removexattr(at, name))
    }

    /// Opens the object with `flags` that can write or truncate (no O_CREAT: it exists).
    pub fn open_for_writing(&self, flags: i32) -> io::Result<WritableFd> {
        syscalls::reopen(self.inode.fd()?.as_raw_fd(), flags).map(WritableFd)
    }
}

impl EntryPermit<'_> {
    /// Whether the new name is a file the exclusion rules are read from.
    pub fn touches_rules(&self) -> bool {
        !self.admission.rules_touched.is_empty()
    }

    /// The directory the entry is in, for looking at what is there now.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    fn expect_dir(&self, is_dir: bool) -> io::Result<()> {
        if self.is_dir == is_dir {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "gate: the permit for {:?} was issued for a {}",
            self.name,
            if self.is_dir {
                "directory"
            } else {
                "non-directory"
            }
        )))
    }

    /// Creates the entry as a regular file and opens it with `flags` (O_CREAT added).
    pub fn create(&self, flags: i32, mode: u32) -> io::Result<WritableFd> {
        self.expect_dir(false)?;
        syscalls::openat(self.dir(), self.name, flags | libc::O_CREAT, mode).map(WritableFd)
    }

    pub fn mkdir(&self, mode: u32) -> io::Result<()> {
        self.expect_dir(true)?;
        syscalls::mkdirat(self.dir(), self.name, mode)
    }

    pub fn mknod(&self, mode: u32, rdev: u64) -> io::Result<()> {
        self.expect_dir(false)?;
        syscalls::mknodat(self.dir(), self.name, mode, rdev)
    }

    pub fn symlink(&self, target: &CStr) -> io::Result<()> {
        self.expect_dir(false)?;
        syscalls::symlinkat(target, self.dir(), self.name)
    }

    /// Makes the entry a new hard link to `existing`.
    pub fn link(&self, existing: &Inode) -> io::Result<()> {
        self.expect_dir(false)?;
        syscalls::linkat(existing.fd()?.as_raw_fd(), self.dir(), self.name)
    }

    /// unlink, or rmdir for a permit issued for a directory.
    pub fn remove(mut self) -> io::Result<()> {
        let flags = if self.is_dir { libc::AT_REMOVEDIR } else { 0 };
        let result = syscalls::unlinkat(self.dir(), self.name, flags);
        if let Some(backup) = self.leaving.take() {
            settle(backup, &result);
        }
        result
    }
}

impl RenamePermit<'_> {
    /// The source and target directories, for looking at what is there now.
    pub fn dirs(&self) -> (BorrowedFd<'_>, BorrowedFd<'_>) {
        (self.dir.as_fd(), self.new_dir.as_fd())
    }

    /// The rename the permit was issued for, with its flags.
    pub fn rename(mut self) -> io::Result<()> {
        let result = syscalls::renameat2(
            self.dir.as_fd(),
            self.name,
            self.new_dir.as_fd(),
            self.new_name,
            self.flags,
        );
        if let Some(backup) = self.replaced.take() {
            settle(backup, &result);
        }
        if let Some(record) = self.record.take() {
            record.settle(result.is_ok());
        }
        result
    }
}

impl WritePermit<'_> {
    pub fn pwrite(&self, data: &[u8], offset: u64) -> io::Result<usize> {
        syscalls::pwrite(self.file.0.as_fd(), data, offset)
    }

    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        syscalls::fallocate(self.file.0.as_fd(), mode, offset, len)
    }

    /// copy_file_range from `source` (any readable fd) into this handle's file.
    pub fn copy_from(
        &self,
        source: BorrowedFd<'_>,
        (off_in, off_out): (u64, u64),
        len: u64,
        flags: u32,
    ) -> io::Result<usize> {
        syscalls::copy_file_range(source, off_in, self.file.0.as_fd(), off_out, len, flags)
    }

    /// Clears set-id `bits` a write must drop (see `fs::privs`).
    pub fn clear_mode_bits(&self, bits: u32) -> io::Result<()> {
        clear_mode_bits(self.inode, bits)
    }
}

/// Every syscall that can change SRC, for the permits' methods above and nothing else: the
/// module is private, and clippy.toml refuses these calls everywhere but here.
#[allow(
    clippy::disallowed_methods,
    reason = "the gate's own syscalls: reachable only through a permit's methods"
)]
mod syscalls {
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

    use crate::sys::{XattrPath, cvt, with_proc_path};

    /// Opens (maybe creating) `name` in `dir` with flags that can write.
    pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        // SAFETY: valid fd and NUL-terminated name; the returned fd is owned by nobody else.
        let fd = cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode,
            )
        })?;
        // SAFETY: `fd` was just returned by openat and is not owned elsewhere.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Re-opens an O_PATH fd through /proc/self/fd with flags that can write or truncate.
    pub fn reopen(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
        let flags = (flags | libc::O_CLOEXEC) & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
        with_proc_path(fd, |path| {
            // SAFETY: `path` is NUL-terminated; the returned fd is owned by nobody else.
            let new = cvt(unsafe { libc::open(path.as_ptr(), flags) })?;
            // SAFETY: `new` was just returned by open and is not owned elsewhere.
            Ok(unsafe { OwnedFd::from_raw_fd(new) })
        })
    }

    pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name.
        cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
        Ok(())
    }

    pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name.
        cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) })?;
        Ok(())
    }

    pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated strings.
        cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
        Ok(())
    }

    /// Hard-links the object behind an O_PATH fd (AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH,
    /// which root has; the /proc link form with AT_SYMLINK_FOLLOW works for everyone).
    pub fn linkat(fd: RawFd, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: valid fds and NUL-terminated strings.
            cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    p.as_ptr(),
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
            Ok(())
        })
    }

    pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
        // SAFETY: valid fd and NUL-terminated name.
        cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
        Ok(())
    }

    pub fn renameat2(
        dir: BorrowedFd<'_>,
        name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        // SAFETY: valid fds and NUL-terminated names.
        cvt(unsafe {
            libc::renameat2(
                dir.as_raw_fd(),
                name.as_ptr(),
                new_dir.as_raw_fd(),
                new_name.as_ptr(),
                flags,
            )
        })?;
        Ok(())
    }

    /// chmod of the object behind an O_PATH fd (never a symlink: Linux has no lchmod).
    pub fn chmod_object(fd: RawFd, mode: u32) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: NUL-terminated path; the /proc link resolves to the object itself.
            cvt(unsafe { libc::chmod(p.as_ptr(), mode) })?;
            Ok(())
        })
    }

    pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
        Ok(())
    }

    /// chown of the object behind an O_PATH fd, never following a symlink.
    pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
        // SAFETY: valid fd, empty path with AT_EMPTY_PATH.
        cvt(unsafe {
            libc::fchownat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                uid,
                gid,
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
        let size = i64::try_from(size).map_err(|_| crate::sys::errno(libc::EFBIG))?;
        // SAFETY: valid fd.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })?;
        Ok(())
    }

    /// utimensat on the object behind an O_PATH fd, through its /proc link.
    pub fn utimens_object(fd: RawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: NUL-terminated path and a times array of two; the /proc link is
            // followed to the object itself.
            cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) })?;
            Ok(())
        })
    }

    pub fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
        // SAFETY: valid fd and a times array of two.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })?;
        Ok(())
    }

    pub fn pwrite(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> io::Result<usize> {
        // SAFETY: `data` is readable for its length.
        let n = cvt(unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                offset as i64,
            )
        })?;
        Ok(n as usize)
    }

    pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset as i64, len as i64) })?;
        Ok(())
    }

    pub fn copy_file_range(
        fd_in: BorrowedFd<'_>,
        off_in: u64,
        fd_out: BorrowedFd<'_>,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> io::Result<usize> {
        let mut off_in = off_in as i64;
        let mut off_out = off_out as i64;
        // SAFETY: valid fds and pointers to two live offsets.
        let n = cvt(unsafe {
            libc::copy_file_range(
                fd_in.as_raw_fd(),
                &mut off_in,
                fd_out.as_raw_fd(),
                &mut off_out,
                len as usize,
                flags,
            )
        })?;
        Ok(n as usize)
    }

    pub fn setxattr(at: &XattrPath, name: &CStr, value: &[u8], flags: i32) -> io::Result<()> {
        let (value_ptr, len) = (value.as_ptr().cast(), value.len());
        // SAFETY: the path and name are NUL-terminated; `value` is readable for its length.
        cvt(unsafe {
            if at.nofollow {
                libc::lsetxattr(at.as_ptr(), name.as_ptr(), value_ptr, len, flags)
            } else {
                libc::setxattr(at.as_ptr(), name.as_ptr(), value_ptr, len, flags)
            }
        })?;
        Ok(())
    }

    pub fn removexattr(at: &XattrPath, name: &CStr) -> io::Result<()> {
        // SAFETY: the path and name are NUL-terminated.
        cvt(unsafe {
            if at.nofollow {
                libc::lremovexattr(at.as_ptr(), name.as_ptr())
            } else {
                libc::removexattr(at.as_ptr(), name.as_ptr())
            }
        })?;
        Ok(())
    }
}
