//! Copy-on-write branches of the tree (issue 27): the branch table and each branch's upper
//! layer, a real directory in the state dir (docs/design.md, "Branches").
//!
//! ```text
//! STATE/branches/                 0700
//! ├── NAME/                       one live branch
//! │   ├── branch.json             {name, fork, created}: written before the rename below
//! │   └── upper/                  the branch's writes, overlayfs-style
//! ├── .creating-NAME-RANDOM/      a create a crash cut short (never a branch; gc removes it)
//! └── .dropped-NAME-RANDOM/       a dropped branch, until gc frees it
//! ```
//!
//! Invariants:
//! 1. A branch exists exactly when `STATE/branches/NAME/branch.json` does. Creation builds the
//!    whole directory under a temp name and renames it into place (then fsyncs `branches/`),
//!    so a crash leaves either no branch or a complete one; a drop is one rename away from
//!    `NAME`, so it is all or nothing too.
//! 2. Every operation on an upper layer is relative to the branch's `upper/` fd and follows
//!    no symlink: opens go through `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, and the
//!    *at calls take the last component in a directory fd opened that way.
//! 3. The merged tree at a path is the upper entry if there is one; otherwise, unless a
//!    whiteout `.wh.NAME` in the upper parent or an opaque upper ancestor (one holding
//!    `.wh..wh..opq`) hides it, the fork checkpoint's view entry (`History::view_entry`).
//!    Names beginning `.wh.` are the layer's own: never shown, never created (EINVAL).
//! 4. A copy-up writes a temp entry (`.wh..cpup-…`, hidden by 3) and renames it into place,
//!    so a failure (ENOSPC) leaves the upper as it was and returns the errno.
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use serde::{Deserialize, Serialize};

use super::{History, ViewEntry};
use crate::sys::{self, errno};
use crate::transcript::record::{EntryKind, EntryMeta};

/// `STATE/branches`.
pub const BRANCHES_DIR: &str = "branches";
const INFO_FILE: &str = "branch.json";
const UPPER_DIR: &str = "upper";
const CREATING_PREFIX: &str = ".creating-";
const DROPPED_PREFIX: &str = ".dropped-";
/// The prefix of every name the upper layer keeps for itself (invariant 3).
pub const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// What `branch.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchInfo {
    pub name: String,
    /// The checkpoint the branch was forked from: its lower layer is that checkpoint's view.
    pub fork: String,
    /// RFC 3339, UTC.
    pub created: String,
}

/// Why a branch name is refused, or `None`: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`. A name is
/// one path component that sorts and quotes plainly and never starts with `.` (the state
/// dir's temp names do).
pub fn name_problem(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Some("a branch name cannot be empty".into());
    }
    if bytes.len() > 64 {
        return Some(format!(
            "a branch name is at most 64 characters, '{name}' has {}",
            bytes.len()
        ));
    }
    if !bytes[0].is_ascii_alphanumeric() {
        return Some(format!(
            "a branch name starts with a letter or digit: '{}'",
            name.escape_debug()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "a branch name holds only letters, digits, '.', '_' and '-', not {c:?}"
        ));
    }
    None
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn cstr(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| errno(libc::EINVAL))
}

fn whiteout_name(name: &[u8]) -> Vec<u8> {
    let mut w = WHITEOUT_PREFIX.to_vec();
    w.extend_from_slice(name);
    w
}

/// Splits `rel` ("" is the root) into its parent and last component.
pub fn split_rel(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (b"", rel),
    }
}

pub fn join_rel(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut rel = parent.to_vec();
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name);
    rel
}

/// One live branch.
pub struct Branch {
    pub info: BranchInfo,
    /// `STATE/branches/NAME/upper`, O_PATH.
    upper: OwnedFd,
    /// `STATE/branches/NAME`, for the size report.
    dir: PathBuf,
    /// Serialises the branch's namespace changes and copy-ups (each is a few syscalls
    /// in the upper plus, for a copy-up, the file's data): two copy-ups of one file must
    /// not race, nor a rename with a copy-up below it. Reads and writes through open
    /// handles never take it. One lock per branch: the main tree never waits on it.
    changes: Mutex<()>,
}

/// Where a merged path's entry comes from.
pub enum Layer {
    /// The upper has it: its `stat` now.
    Upper(libc::stat),
    /// Only the fork checkpoint has it.
    Lower(ViewEntry),
}

impl Branch {
    /// The upper's directory `rel`, O_PATH, or ENOENT/ENOTDIR.
    fn upper_dir(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        let rel = std::str::from_utf8(rel).map_err(|_| errno(libc::ENOENT))?;
        sys::open_beneath(self.upper.as_fd(), rel, libc::O_PATH | libc::O_DIRECTORY, 0)
    }

    fn stat_in(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Option<libc::stat>> {
        match sys::fstatat(dir, &cstr(name)?, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the layer's own name `name` (a whiteout, a marker) is in `dir`. The whiteout
    /// of a name of more than 251 bytes cannot exist (ENAMETOOLONG): no.
    fn has(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<bool> {
        match Self::stat_in(dir, name) {
            Ok(found) => Ok(found.is_some()),
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `rel` in the merged tree (invariant 3), `None` when absent. One walk down the upper,
    /// O(depth) syscalls, then at most one view lookup.
    pub fn resolve(&self, history: &History, rel: &[u8]) -> io::Result<Option<Layer>> {
        if rel.is_empty() {
            return Ok(Some(Layer::Upper(sys::fstat(self.upper.as_fd())?)));
        }
        let mut dir: Option<OwnedFd> = Some(self.upper.try_clone()?);
        let mut lower_shows = true;
        let parts: Vec<&[u8]> = rel.split(|&b| b == b'/').collect();
        for (i, part) in parts.iter().enumerate() {
            if part.starts_with(WHITEOUT_PREFIX) {
                return Ok(None);
            }
            let last = i + 1 == parts.len();
            let Some(d) = dir.take() else { break };
            match Self::stat_in(d.as_fd(), part)? {
                Some(st) if last => return Ok(Some(Layer::Upper(st))),
                Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                    let next = sys::openat(
                        d.as_fd(),
                        &cstr(part)?,
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                        0,
                    )?;
                    if Self::has(next.as_fd(), OPAQUE_MARKER.as_bytes())? {
                        lower_shows = false;
                    }
                    dir = Some(next);
                }
                Some(_) => return Err(errno(libc::ENOTDIR)),
                None => {
                    if Self::has(d.as_fd(), &whiteout_name(part))? {
                        return Ok(None);
                    }
                    // Below an opaque directory nothing of the lower shows, upper or not.
                    if !lower_shows {
                        return Ok(None);
                    }
                }
            }
        }
        if !lower_shows {
            return Ok(None);
        }
        Ok(self.lower_entry(history, rel)?.map(Layer::Lower))
    }

    /// `rel` in the fork checkpoint's view (no upper consulted).
    fn lower_entry(&self, history: &History, rel: &[u8]) -> io::Result<Option<ViewEntry>> {
        let k = history.checkpoint_index(&self.info.fork).ok_or_else(|| {
            log::warn!(
                "branch {}: its fork checkpoint {} is gone",
                self.info.name,
                self.info.fork
            );
            errno(libc::EIO)
        })?;
        history.view_entry(k, rel)
    }

    /// Whether the lower's `rel` would show if the upper had no entry of that name: what
    /// decides if removing or renaming the upper entry needs a whiteout. No upper ancestor
    /// may be opaque, and the lower must have it.
    fn lower_shows_through(&self, history: &History, rel: &[u8]) -> io::Result<bool> {
        let (parent, _) = split_rel(rel);
        Ok(self.lower_shows_through_dir(parent)? && self.lower_entry(history, rel)?.is_some())
    }

    /// The merged listing of directory `rel`: names and kinds, sorted, without the upper's
    /// own names.
    pub fn list(&self, history: &History, rel: &[u8]) -> io::Result<Vec<(Vec<u8>, EntryKind)>> {
        let mut out: BTreeMap<Vec<u8>, EntryKind> = BTreeMap::new();
        let mut hidden: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut opaque = false;
        match self.resolve(history, rel)? {
            Some(Layer::Upper(st)) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
                return Err(errno(libc::ENOTDIR));
            }
            Some(Layer::Upper(_)) => {
                let d = self.upper_dir(rel)?;
                let mut stream = sys::DirStream::open(d.as_fd(), false)?;
                while let Some(e) = stream.next_entry()? {
                    let name = e.name;
                    if name == b"." || name == b".." {
                        continue;
                    }
                    if name == OPAQUE_MARKER.as_bytes() {
                        opaque = true;
                    } else if let Some(hid) = name.strip_prefix(WHITEOUT_PREFIX) {
                        hidden.insert(hid.to_vec());
                    } else {
                        let st = Self::stat_in(d.as_fd(), name)?;
                        if let Some(st) = st {
                            out.insert(
                                name.to_vec(),
                                super::track::kind_of_mode(st.st_mode).unwrap_or(EntryKind::File),
                            );
                        }
                    }
                }
                opaque = opaque || !self.lower_shows_through_dir(rel)?;
            }
            Some(Layer::Lower(e)) if e.meta.kind != EntryKind::Dir => {
                return Err(errno(libc::ENOTDIR));
            }
            Some(Layer::Lower(_)) => {}
            None => return Err(errno(libc::ENOENT)),
        }
        if !opaque && let Some(k) = history.checkpoint_index(&self.info.fork) {
            match history.view_list(k, rel) {
                Ok(lower) => {
                    for (name, kind) in lower {
                        if !hidden.contains(&name) {
                            out.entry(name).or_insert(kind);
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Whether no upper ancestor of directory `rel` (itself included) is opaque and the
    /// lower has a directory there.
    fn lower_shows_through_dir(&self, rel: &[u8]) -> io::Result<bool> {
        let mut prefix: &[u8] = rel;
        loop {
            if let Ok(d) = self.upper_dir(prefix)
                && Self::has(d.as_fd(), OPAQUE_MARKER.as_bytes())?
            {
                return Ok(false);
            }
            if prefix.is_empty() {
                return Ok(true);
            }
            prefix = split_rel(prefix).0;
        }
    }

    /// Takes the branch's change lock (see [`Branch::changes`]).
    pub fn lock_changes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure the upper has `rel` (copied up from the lower with its parents if it
    /// had not), and returns the upper's parent directory fd. Caller holds the change lock.
    pub fn copy_up(&self, history: &History, rel: &[u8]) -> io::Result<OwnedFd> {
        if rel.is_empty() {
            return self.upper.try_clone();
        }
        let (parent, name) = split_rel(rel);
        let parent_fd = self.copy_up_dir(history, parent)?;
        if Self::has(parent_fd.as_fd(), name)? {
            return Ok(parent_fd);
        }
        let entry = match self.resolve(history, rel)? {
            Some(Layer::Lower(e)) => e,
            Some(Layer::Upper(_)) => return Ok(parent_fd),
            None => return Err(errno(libc::ENOENT)),
        };
        self.copy_entry_up(history, parent_fd.as_fd(), name, &entry)?;
        Ok(parent_fd)
    }

    /// The upper's directory `rel`, created (copied up, with its ancestors) as needed.
    pub fn copy_up_dir(&self, history: &History, rel: &[u8]) -> io::Result<OwnedFd> {
        if let Ok(fd) = self.upper_dir(rel) {
            return Ok(fd);
        }
        let parent_fd = self.copy_up(history, rel)?;
        let (_, name) = split_rel(rel);
        let fd = sys::openat(
            parent_fd.as_fd(),
            &cstr(name)?,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        Ok(fd)
    }

    /// Copies the lower `entry` to `name` in the upper directory `dir` (invariant 4).
    fn copy_entry_up(
        &self,
        history: &History,
        dir: BorrowedFd<'_>,
        name: &[u8],
        entry: &ViewEntry,
    ) -> io::Result<()> {
        let temp = temp_name();
        let meta = &entry.meta;
        let result = (|| -> io::Result<()> {
            let mode = Mode::from_raw_mode(meta.mode & 0o7777);
            let fd: Option<OwnedFd> = match meta.kind {
                EntryKind::Dir => {
                    rustix::fs::mkdirat(dir, temp.as_c_str(), Mode::from_raw_mode(0o700))?;
                    Some(open_in(dir, &temp, OFlags::DIRECTORY | OFlags::RDONLY)?)
                }
                EntryKind::File => {
                    let out = rustix::fs::openat(
                        dir,
                        temp.as_c_str(),
                        OFlags::CREATE
                            | OFlags::EXCL
                            | OFlags::WRONLY
                            | OFlags::NOFOLLOW
                            | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )?;
                    let src = history.view_open(entry)?;
                    copy_sparse(&src, out.as_fd(), meta.size)?;
                    Some(out)
                }
                EntryKind::Symlink => {
                    let target = history.view_symlink_target(entry)?;
                    rustix::fs::symlinkat(cstr(&target)?.as_c_str(), dir, temp.as_c_str())?;
                    None
                }
                other => {
                    let (ft, _) = match other {
                        EntryKind::Fifo => (rustix::fs::FileType::Fifo, 0),
                        EntryKind::Socket => (rustix::fs::FileType::Socket, 0),
                        EntryKind::CharDevice => (rustix::fs::FileType::CharacterDevice, 0),
                        _ => (rustix::fs::FileType::BlockDevice, 0),
                    };
                    rustix::fs::mknodat(dir, temp.as_c_str(), ft, mode, meta.rdev.unwrap_or(0))?;
                    None
                }
            };
            set_meta(dir, &temp, fd.as_ref(), meta)?;
            rustix::fs::renameat_with(
                dir,
                temp.as_c_str(),
                dir,
                cstr(name)?.as_c_str(),
                RenameFlags::NOREPLACE,
            )?;
            Ok(())
        })();
        if let Err(e) = result {
            let flags = if meta.kind == EntryKind::Dir {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            let _ = rustix::fs::unlinkat(dir, temp.as_c_str(), flags);
            return Err(e);
        }
        Ok(())
    }

    /// Copies up the whole subtree at `rel` (a directory about to be renamed: its lower
    /// content must move with it) and marks it opaque, so it no longer depends on the
    /// lower at its old name. O(the subtree).
    pub fn copy_up_tree(&self, history: &History, rel: &[u8]) -> io::Result<()> {
        // Wholly in the upper already (opaque, or the lower has nothing there): O(1).
        if self.upper_dir(rel).is_ok()
            && !(self.lower_shows_through_dir(rel)? && self.lower_entry(history, rel)?.is_some())
        {
            return Ok(());
        }
        let fd = self.copy_up_dir(history, rel)?;
        for (name, kind) in self.list(history, rel)? {
            let child = join_rel(rel, &name);
            if kind == EntryKind::Dir {
                self.copy_up_tree(history, &child)?;
            } else {
                self.copy_up(history, &child)?;
            }
        }
        self.mark_opaque(fd.as_fd())
    }

    fn mark_opaque(&self, dir: BorrowedFd<'_>) -> io::Result<()> {
        // Its whiteouts mean nothing under an opaque directory.
        clear_whiteouts(dir)?;
        make_marker(dir, OPAQUE_MARKER.as_bytes())
    }

    /// Refuses a name the upper keeps for itself.
    pub fn check_name(name: &OsStr) -> io::Result<()> {
        if name.as_bytes().starts_with(WHITEOUT_PREFIX) {
            return Err(errno(libc::EINVAL));
        }
        Ok(())
    }

    /// Before a new entry `name` is made in the upper `dir` at merged `rel`: its whiteout
    /// goes, and a new directory where the lower had something becomes opaque (the caller
    /// marks it after making it: [`Branch::after_mkdir`]).
    pub fn before_create(&self, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<bool> {
        let wh = whiteout_name(name);
        let had_whiteout = Self::has(dir, &wh)?;
        if had_whiteout {
            rustix::fs::unlinkat(dir, cstr(&wh)?.as_c_str(), AtFlags::empty())?;
        }
        Ok(had_whiteout)
    }

    /// A directory just made in the upper: opaque, so a lower directory of the same name
    /// (removed before, or hidden by an opaque ancestor) never shows through it.
    pub fn after_mkdir(&self, dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
        let fd = open_in(dir, &cstr(name)?, OFlags::DIRECTORY | OFlags::RDONLY)?;
        make_marker(fd.as_fd(), OPAQUE_MARKER.as_bytes())
    }

    /// Hides the lower's `rel` (after its upper entry, if any, was removed).
    pub fn whiteout(&self, history: &History, rel: &[u8]) -> io::Result<()> {
        if !self.lower_shows_through(history, rel)? {
            return Ok(());
        }
        let (parent, name) = split_rel(rel);
        let dir = self.copy_up_dir(history, parent)?;
        make_marker(dir.as_fd(), &whiteout_name(name))
    }

    /// Empties the upper directory `rel` of the layer's own names, so rmdir/rename over it
    /// can succeed once the merged directory is empty.
    pub fn clear_own_names(&self, rel: &[u8]) -> io::Result<()> {
        if let Ok(d) = self.upper_dir(rel) {
            let fd = open_in(d.as_fd(), c".", OFlags::DIRECTORY | OFlags::RDONLY)?;
            clear_whiteouts(fd.as_fd())?;
            let _ = rustix::fs::unlinkat(&fd, OPAQUE_MARKER, AtFlags::empty());
        }
        Ok(())
    }

    /// The upper's directory `rel` (an O_PATH fd), if it has one.
    pub fn upper_dir_fd(&self, rel: &[u8]) -> io::Result<OwnedFd> {
        self.upper_dir(rel)
    }

    /// Opens the upper's `rel` (a regular file) with `flags` (O_CREAT/O_EXCL stripped).
    pub fn open_upper(&self, rel: &[u8], flags: i32) -> io::Result<File> {
        let (parent, name) = split_rel(rel);
        let dir = self.upper_dir(parent)?;
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_APPEND);
        let fd = rustix::fs::openat(
            &dir,
            cstr(name)?.as_c_str(),
            OFlags::from_bits_retain(flags as u32) | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// MKDIR/MKNOD/SYMLINK/CREATE of `name` in the upper directory `dir` (already copied
    /// up), owned by `owner`: its whiteout goes first, a new directory is opaque. Returns
    /// the created file opened with `flags` for CREATE, else `None`.
    pub fn make(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        what: &New<'_>,
        owner: (u32, u32),
    ) -> io::Result<Option<File>> {
        let c = cstr(name)?;
        self.before_create(dir, name)?;
        let mut file = None;
        let mode = match *what {
            New::Dir { mode } => {
                rustix::fs::mkdirat(dir, c.as_c_str(), Mode::from_raw_mode(0o700))?;
                Some(mode)
            }
            New::Node { mode, rdev } => {
                let ft = rustix::fs::FileType::from_raw_mode(mode);
                rustix::fs::mknodat(dir, c.as_c_str(), ft, Mode::from_raw_mode(0o600), rdev)?;
                Some(mode & 0o7777)
            }
            New::Symlink { target } => {
                rustix::fs::symlinkat(cstr(target)?.as_c_str(), dir, c.as_c_str())?;
                None
            }
            New::File { mode, flags } => {
                let own = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_APPEND);
                let fd = rustix::fs::openat(
                    dir,
                    c.as_c_str(),
                    OFlags::from_bits_retain(own as u32)
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                file = Some(File::from(fd));
                Some(mode)
            }
        };
        let done = (|| -> io::Result<()> {
            rustix::fs::chownat(
                dir,
                c.as_c_str(),
                Some(rustix::fs::Uid::from_raw(owner.0)),
                Some(rustix::fs::Gid::from_raw(owner.1)),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
            if let Some(mode) = mode {
                rustix::fs::chmodat(
                    dir,
                    c.as_c_str(),
                    Mode::from_raw_mode(mode & 0o7777),
                    AtFlags::empty(),
                )?;
            }
            if matches!(what, New::Dir { .. }) {
                self.after_mkdir(dir, name)?;
            }
            Ok(())
        })();
        if let Err(e) = done {
            let flags = if matches!(what, New::Dir { .. }) {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            if matches!(what, New::Dir { .. }) {
                let _ = rustix::fs::unlinkat(
                    dir,
                    format!("{}/{OPAQUE_MARKER}", String::from_utf8_lossy(name)),
                    AtFlags::empty(),
                );
            }
            let _ = rustix::fs::unlinkat(dir, c.as_c_str(), flags);
            return Err(e);
        }
        Ok(file)
    }

    /// LINK: `from_name` in upper dir `from` gets the new name `to_name` in upper dir `to`.
    pub fn link(
        &self,
        from: BorrowedFd<'_>,
        from_name: &[u8],
        to: BorrowedFd<'_>,
        to_name: &[u8],
    ) -> io::Result<()> {
        self.before_create(to, to_name)?;
        rustix::fs::linkat(
            from,
            cstr(from_name)?.as_c_str(),
            to,
            cstr(to_name)?.as_c_str(),
            AtFlags::empty(),
        )?;
        Ok(())
    }

    /// Removes the upper entry `name` of upper dir `dir` (a directory: with the layer's
    /// own names inside it, which the caller found to be all it holds).
    pub fn remove_upper(&self, dir: BorrowedFd<'_>, name: &[u8], is_dir: bool) -> io::Result<()> {
        let c = cstr(name)?;
        if is_dir {
            let d = open_in(dir, c.as_c_str(), OFlags::DIRECTORY | OFlags::RDONLY)?;
            clear_whiteouts(d.as_fd())?;
            match rustix::fs::unlinkat(&d, OPAQUE_MARKER, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
            rustix::fs::unlinkat(dir, c.as_c_str(), AtFlags::REMOVEDIR)?;
        } else {
            rustix::fs::unlinkat(dir, c.as_c_str(), AtFlags::empty())?;
        }
        Ok(())
    }

    /// renameat2 between two upper directories.
    pub fn rename_upper(
        &self,
        from: BorrowedFd<'_>,
        from_name: &[u8],
        to: BorrowedFd<'_>,
        to_name: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        rustix::fs::renameat_with(
            from,
            cstr(from_name)?.as_c_str(),
            to,
            cstr(to_name)?.as_c_str(),
            RenameFlags::from_bits_retain(flags),
        )?;
        Ok(())
    }

    /// SETATTR of the upper's `name` in `dir` (copied up already): `file`, if given, is an
    /// open handle on it, used for truncation.
    pub fn set_attr(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        file: Option<&File>,
        set: &AttrChange,
    ) -> io::Result<()> {
        let c = cstr(name)?;
        if set.uid.is_some() || set.gid.is_some() {
            rustix::fs::chownat(
                dir,
                c.as_c_str(),
                set.uid.map(rustix::fs::Uid::from_raw),
                set.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(mode) = set.mode {
            rustix::fs::chmodat(
                dir,
                c.as_c_str(),
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )?;
        }
        if let Some(size) = set.size {
            match file {
                Some(f) => rustix::fs::ftruncate(f, size)?,
                None => {
                    let f = open_in(dir, c.as_c_str(), OFlags::WRONLY)?;
                    rustix::fs::ftruncate(&f, size)?;
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let omit = rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            };
            let times = rustix::fs::Timestamps {
                last_access: set.atime.unwrap_or(omit),
                last_modification: set.mtime.unwrap_or(omit),
            };
            rustix::fs::utimensat(dir, c.as_c_str(), &times, AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    }

    /// pwrite through a branch handle's file (in the upper: never SRC).
    pub fn pwrite(file: &File, data: &[u8], offset: u64) -> io::Result<usize> {
        Ok(rustix::io::pwrite(file, data, offset)?)
    }

    /// fallocate through a branch handle's file.
    pub fn fallocate(file: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        rustix::fs::fallocate(
            file,
            rustix::fs::FallocateFlags::from_bits_retain(mode as u32),
            offset,
            len,
        )?;
        Ok(())
    }

    /// Bytes the upper holds (allocated blocks), for `branch list`.
    pub fn upper_bytes(&self) -> u64 {
        dir_bytes(&self.dir.join(UPPER_DIR))
    }
}

/// What [`Branch::make`] creates. Modes are final (the caller applied the umask).
pub enum New<'a> {
    Dir { mode: u32 },
    Node { mode: u32, rdev: u64 },
    Symlink { target: &'a [u8] },
    File { mode: u32, flags: i32 },
}

/// A SETATTR's changes (times already resolved: `UTIME_NOW` allowed).
#[derive(Default)]
pub struct AttrChange {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<rustix::fs::Timespec>,
    pub mtime: Option<rustix::fs::Timespec>,
}

fn temp_name() -> CString {
    let mut r = [0u8; 8];
    let _ = getrandom::fill(&mut r);
    CString::new(format!(".wh..cpup-{}", u64::from_le_bytes(r))).unwrap_or_default()
}

fn open_in(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// An empty 0600 file `name` in `dir`, made if missing.
fn make_marker(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rustix::fs::openat(
        dir,
        cstr(name)?.as_c_str(),
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(_) => Ok(()),
        Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every whiteout in the (readable) directory `dir`.
fn clear_whiteouts(dir: BorrowedFd<'_>) -> io::Result<()> {
    let rd = open_in(dir, c".", OFlags::DIRECTORY | OFlags::RDONLY)?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&rd)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n.starts_with(WHITEOUT_PREFIX) && n != OPAQUE_MARKER.as_bytes() {
            names.push(n.to_vec());
        }
    }
    for n in names {
        rustix::fs::unlinkat(&rd, cstr(&n)?.as_c_str(), AtFlags::empty())?;
    }
    Ok(())
}

/// Owner, mode and times of `meta` on `name` in `dir` (`fd`: an open fd on it, if any).
fn set_meta(
    dir: BorrowedFd<'_>,
    name: &CStr,
    fd: Option<&OwnedFd>,
    meta: &EntryMeta,
) -> io::Result<()> {
    let uid = rustix::fs::Uid::from_raw(meta.uid);
    let gid = rustix::fs::Gid::from_raw(meta.gid);
    rustix::fs::chownat(dir, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)?;
    // After the chown, which clears setuid/setgid; a symlink has no mode of its own.
    if meta.kind != EntryKind::Symlink {
        match fd {
            Some(fd) => rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode & 0o7777))?,
            None => rustix::fs::chmodat(
                dir,
                name,
                Mode::from_raw_mode(meta.mode & 0o7777),
                AtFlags::empty(),
            )?,
        }
    }
    let t = rustix::fs::Timespec {
        tv_sec: meta.mtime_sec,
        tv_nsec: i64::from(meta.mtime_nsec),
    };
    let times = rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Copies `size` bytes of `src` into `out` keeping holes: only the data extents
/// SEEK_DATA/SEEK_HOLE report are copied (copy_file_range), the rest stays a hole.
fn copy_sparse(src: &File, out: BorrowedFd<'_>, size: u64) -> io::Result<()> {
    let mut pos = 0u64;
    while pos < size {
        let data = match sys::lseek(src.as_fd(), pos as i64, libc::SEEK_DATA) {
            Ok(d) => d as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) => return Err(e),
        };
        let hole = (sys::lseek(src.as_fd(), data as i64, libc::SEEK_HOLE)? as u64).min(size);
        copy_range(src, out, data, hole)?;
        pos = hole;
    }
    rustix::fs::ftruncate(out, size)?;
    Ok(())
}

/// Copies bytes `[from, to)` of `src` to the same offsets of `out`: copy_file_range, or
/// read and pwrite where the kernel cannot copy between the two (EXDEV across filesystems
/// or mounts, EOPNOTSUPP, EINVAL).
fn copy_range(src: &File, out: BorrowedFd<'_>, from: u64, to: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut at = from;
    let mut fallback = false;
    let mut buf = Vec::new();
    while at < to {
        let want = (to - at).min(1 << 20) as usize;
        if !fallback {
            let (mut off_in, mut off_out) = (at, at);
            match rustix::fs::copy_file_range(src, Some(&mut off_in), out, Some(&mut off_out), want)
            {
                Ok(0) => return Err(errno(libc::EIO)),
                Ok(n) => {
                    at += n as u64;
                    continue;
                }
                Err(
                    rustix::io::Errno::XDEV
                    | rustix::io::Errno::OPNOTSUPP
                    | rustix::io::Errno::INVAL,
                ) => {
                    fallback = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
        buf.resize(want, 0);
        let n = src.read_at(&mut buf, at)?;
        if n == 0 {
            return Err(errno(libc::EIO));
        }
        let mut done = 0;
        while done < n {
            done += rustix::io::pwrite(out, &buf[done..n], at + done as u64)?;
        }
        at += n as u64;
    }
    Ok(())
}

/// Allocated bytes under `path` (not following symlinks).
fn dir_bytes(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&p) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(m) = e.metadata() {
                use std::os::unix::fs::MetadataExt;
                total += m.blocks() * 512;
                if m.is_dir() {
                    stack.push(e.path());
                }
            }
        }
    }
    total
}

/// The branch table of one state dir.
pub struct Branches {
    root: PathBuf,
    /// Read by every FUSE request into a branch: held only to look up or change the map,
    /// never across IO (a create's or drop's directory syncs happen outside it).
    table: RwLock<BTreeMap<String, Arc<Branch>>>,
    /// Serialises creates and drops (control requests only), so that a name checked free
    /// or present stays so through the IO done without `table`.
    renaming: Mutex<()>,
}

/// `created` of a branch made now.
fn now_rfc3339() -> String {
    crate::transcript::record::rfc3339(std::time::SystemTime::now())
}

impl Branches {
    /// Loads `STATE/branches` (creating it, 0700). A directory without `branch.json` is not
    /// a branch (invariant 1): it is logged and left for gc.
    pub fn open(state_dir: &Path) -> io::Result<Branches> {
        let root = state_dir.join(BRANCHES_DIR);
        match std::fs::create_dir(&root) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(sys::context(root.display().to_string(), e)),
        }
        let mut table = BTreeMap::new();
        for info in read_infos(&root)? {
            match Self::load(&root, info) {
                Ok(b) => {
                    table.insert(b.info.name.clone(), Arc::new(b));
                }
                Err(e) => log::warn!("{}: a branch that cannot be served: {e}", root.display()),
            }
        }
        Ok(Branches {
            root,
            table: RwLock::new(table),
            renaming: Mutex::new(()),
        })
    }

    fn load(root: &Path, info: BranchInfo) -> io::Result<Branch> {
        let dir = root.join(&info.name);
        let upper_path = dir.join(UPPER_DIR);
        let upper = match File::open(&upper_path) {
            Ok(f) => OwnedFd::from(f),
            Err(e) => return Err(sys::context(upper_path.display().to_string(), e)),
        };
        Ok(Branch {
            info,
            upper,
            dir,
            changes: Mutex::new(()),
        })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Branch>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    pub fn all(&self) -> Vec<Arc<Branch>> {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Creates branch `name` forked from checkpoint `fork` (which must exist), whose root
    /// directory takes `root_meta` (the fork's root). O(1) in the tree: one directory, one
    /// small file, one rename. Durable when it returns (invariant 1).
    pub fn create(&self, name: &str, fork: &str, root_meta: &EntryMeta) -> io::Result<Arc<Branch>> {
        if let Some(why) = name_problem(name) {
            return Err(invalid(why));
        }
        let _renaming = self.renaming.lock().unwrap_or_else(|p| p.into_inner());
        if self.get(name).is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a branch named '{name}' exists already (see: checkpointfs branch list)"),
            ));
        }
        let temp = self
            .root
            .join(format!("{CREATING_PREFIX}{name}-{}", random_hex()));
        let made = (|| -> io::Result<()> {
            std::fs::create_dir(&temp)?;
            let upper = temp.join(UPPER_DIR);
            std::fs::create_dir(&upper)?;
            let info = BranchInfo {
                name: name.to_owned(),
                fork: fork.to_owned(),
                created: now_rfc3339(),
            };
            let json = serde_json::to_vec_pretty(&info).map_err(io::Error::other)?;
            crate::state::dir::write_file(&temp, INFO_FILE, &json)?;
            let upper_fd = File::open(&upper)?;
            let root_dir = File::open(&temp)?;
            set_meta(
                root_dir.as_fd(),
                c"upper",
                Some(&OwnedFd::from(upper_fd)),
                root_meta,
            )?;
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o700))?;
            }
            std::fs::rename(&temp, self.root.join(name))?;
            File::open(&self.root)?.sync_all()?;
            Ok(())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&temp);
            return Err(sys::context(self.root.join(name).display().to_string(), e));
        }
        let info = read_info(&self.root.join(name))?;
        let branch = Arc::new(Self::load(&self.root, info)?);
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), branch.clone());
        Ok(branch)
    }

    /// Drops branch `name`: renamed out of the table's names at once (durably); its
    /// storage is freed by the next gc.
    pub fn drop_branch(&self, name: &str) -> io::Result<()> {
        let _renaming = self.renaming.lock().unwrap_or_else(|p| p.into_inner());
        if self.get(name).is_none() {
            return Err(unknown(name));
        }
        let to = self
            .root
            .join(format!("{DROPPED_PREFIX}{name}-{}", random_hex()));
        std::fs::rename(self.root.join(name), &to)
            .map_err(|e| sys::context(to.display().to_string(), e))?;
        File::open(&self.root)?.sync_all()?;
        self.table
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        Ok(())
    }
}

/// The error for a branch name that is not in the table.
pub fn unknown(name: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no branch named '{}' (see: checkpointfs branch list)",
            name.escape_debug()
        ),
    )
}

fn random_hex() -> String {
    let mut r = [0u8; 6];
    let _ = getrandom::fill(&mut r);
    r.iter().map(|b| format!("{b:02x}")).collect()
}

fn read_info(dir: &Path) -> io::Result<BranchInfo> {
    let path = dir.join(INFO_FILE);
    let bytes = std::fs::read(&path).map_err(|e| sys::context(path.display().to_string(), e))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        sys::context(
            path.display().to_string(),
            io::Error::new(io::ErrorKind::InvalidData, e),
        )
    })
}

/// The live branches recorded under `STATE/branches` (`root`), by their `branch.json`.
fn read_infos(root: &Path) -> io::Result<Vec<BranchInfo>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(sys::context(root.display().to_string(), e)),
    };
    for e in rd {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue;
        }
        match read_info(&e.path()) {
            Ok(info) if info.name == name => out.push(info),
            Ok(info) => log::warn!(
                "{}: branch.json names '{}', not its directory: ignored",
                e.path().display(),
                info.name
            ),
            Err(err) => log::warn!("{}: not a branch, ignored: {err}", e.path().display()),
        }
    }
    Ok(out)
}

/// The fork checkpoints of the live branches of a state dir: gc keeps them.
pub fn live_forks(state_dir: &Path) -> io::Result<BTreeSet<String>> {
    Ok(read_infos(&state_dir.join(BRANCHES_DIR))?
        .into_iter()
        .map(|i| i.fork)
        .collect())
}

/// Frees the storage of dropped branches and of creates a crash cut short (gc's part).
/// Returns the bytes freed.
pub fn free_dropped(state_dir: &Path) -> io::Result<u64> {
    let root = state_dir.join(BRANCHES_DIR);
    let rd = match std::fs::read_dir(&root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(sys::context(root.display().to_string(), e)),
    };
    let mut freed = 0;
    for e in rd {
        let e = e?;
        let name = e.file_name();
        let n = name.as_bytes();
        let dead = n.starts_with(DROPPED_PREFIX.as_bytes())
            || n.starts_with(CREATING_PREFIX.as_bytes())
            || (!n.starts_with(b".") && !e.path().join(INFO_FILE).exists());
        if dead {
            freed += dir_bytes(&e.path());
            std::fs::remove_dir_all(e.path())
                .map_err(|err| sys::context(e.path().display().to_string(), err))?;
        }
    }
    Ok(freed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_names_follow_the_rule() {
        for good in ["a", "A1", "fix-bug_2.x", &"x".repeat(64)] {
            assert_eq!(name_problem(good), None, "{good}");
        }
        for bad in ["", ".a", "-a", "a/b", "a b", "é", &"x".repeat(65), "a\0"] {
            assert!(name_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn rel_paths_split_and_join() {
        assert_eq!(split_rel(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        assert_eq!(split_rel(b"c"), (&b""[..], &b"c"[..]));
        assert_eq!(join_rel(b"", b"c"), b"c");
        assert_eq!(join_rel(b"a", b"c"), b"a/c");
    }
}
