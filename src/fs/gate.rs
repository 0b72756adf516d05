//! The mutation gate: the one place through which every change to SRC passes.
//!
//! Every syscall that can change content, metadata or the namespace of SRC lives in
//! [`mutate`] and takes a [`Permit`]. A `Permit` can only be made by [`Gate::permit`], which
//! first hands the affected paths to the file-history system (Layer 1: the pre-image is
//! backed up before the change). So an operation that forgets the gate does not compile —
//! the rule is enforced by the type system, not by convention.
//!
//! A permit also holds the *epoch lock* in shared mode for as long as the mutation runs. A
//! checkpoint takes it exclusively, so a checkpoint never falls between a mutation's backup
//! and the mutation itself (which would make the checkpoint record the pre-change state
//! while the change lands unbacked in the next epoch).
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use log::debug;

use super::inodes::{Inode, ObjectKey};
use crate::history::{Caller, History};
use crate::sys;

/// What an operation is about to change. Paths are resolved by the gate, not the caller.
#[derive(Debug)]
pub enum Change<'a> {
    /// Open with write access or O_TRUNC, truncate, chmod/chown/utimes, xattr changes,
    /// fallocate: the object itself changes.
    Object(&'a Inode),
    /// Data written through a handle that was opened (and gated) for writing.
    WriteThrough(&'a Inode),
    /// A name appears or disappears in a directory: create, mkdir, mknod, symlink, link,
    /// unlink, rmdir. `is_dir`: the entry is a directory (mkdir, rmdir).
    Entry {
        parent: &'a Inode,
        name: &'a OsStr,
        is_dir: bool,
    },
    /// rename(2) in all its forms. `exchange`: RENAME_EXCHANGE.
    Rename {
        parent: &'a Inode,
        name: &'a OsStr,
        new_parent: &'a Inode,
        new_name: &'a OsStr,
        exchange: bool,
    },
}

/// Proof that a change went through the gate. Hold it while the mutation runs.
pub struct Permit<'g> {
    _epoch: RwLockReadGuard<'g, ()>,
    history: &'g History,
    /// Changed paths on which the exclusion rules depend (a `.gitignore`, a renamed
    /// directory): reported to the history when the permit is dropped, i.e. once the
    /// mutation is done and the new rules are on disk.
    rules_touched: Vec<Vec<u8>>,
}

impl Permit<'_> {
    /// Whether the change touches a file the exclusion rules are read from.
    pub fn touches_rules(&self) -> bool {
        !self.rules_touched.is_empty()
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        for rel in &self.rules_touched {
            self.history.exclusion_rules_changed(rel);
        }
    }
}

pub struct Gate {
    history: Arc<History>,
    /// Shared by mutations, exclusive for checkpoints (see the module docs).
    epoch_lock: RwLock<()>,
    /// SRC as the daemon sees it, to turn fd paths into paths relative to the mount root.
    src_prefix: Vec<u8>,
}

impl Gate {
    pub fn new(history: Arc<History>, src_prefix: Vec<u8>) -> Gate {
        Gate {
            history,
            epoch_lock: RwLock::new(()),
            src_prefix,
        }
    }

    pub fn history(&self) -> &Arc<History> {
        &self.history
    }

    /// Runs `f` with every mutation excluded: used to take a consistent checkpoint.
    pub fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        let _guard = self
            .epoch_lock
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f()
    }

    /// Backs up what `change` is about to modify, then returns the permit for the mutation.
    /// An error (the backup failed) must fail the operation with that errno.
    pub fn permit(&self, caller: &Caller, change: Change<'_>) -> io::Result<Permit<'_>> {
        let guard = self
            .epoch_lock
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut rules_touched = Vec::new();
        match change {
            // Writes through a handle need no backup of their own: the open that made the
            // handle writable was gated, and a checkpoint captures files open for writing.
            // (A `.gitignore` written this way is reported when the handle is released.)
            Change::WriteThrough(_) => {}
            Change::Object(inode) => {
                if let Some(rel) = self.rel_path_of(inode)? {
                    debug!(
                        "gate: {} modifies {:?}",
                        caller,
                        String::from_utf8_lossy(&rel)
                    );
                    self.history
                        .before_change(caller, &rel, Some(inode.is_dir()))?;
                    self.note_rules_dependency(&mut rules_touched, rel, false);
                }
            }
            Change::Entry {
                parent,
                name,
                is_dir,
            } => {
                if let Some(rel) = self.rel_child(parent, name)? {
                    debug!(
                        "gate: {} adds/removes {:?}",
                        caller,
                        String::from_utf8_lossy(&rel)
                    );
                    self.history.before_change(caller, &rel, Some(is_dir))?;
                    self.note_rules_dependency(&mut rules_touched, rel, false);
                }
            }
            Change::Rename {
                parent,
                name,
                new_parent,
                new_name,
                exchange,
            } => {
                let from = self.rel_child(parent, name)?;
                let to = self.rel_child(new_parent, new_name)?;
                if let (Some(from), Some(to)) = (from, to) {
                    debug!(
                        "gate: {} renames {:?} -> {:?}{}",
                        caller,
                        String::from_utf8_lossy(&from),
                        String::from_utf8_lossy(&to),
                        if exchange { " (exchange)" } else { "" }
                    );
                    self.history.before_rename(caller, &from, &to, exchange)?;
                    self.note_rules_dependency(&mut rules_touched, from, true);
                    self.note_rules_dependency(&mut rules_touched, to, true);
                }
            }
        }
        Ok(Permit {
            _epoch: guard,
            history: &self.history,
            rules_touched,
        })
    }

    fn note_rules_dependency(&self, touched: &mut Vec<Vec<u8>>, rel: Vec<u8>, rename: bool) {
        if self.history.exclusion_rules_depend_on(&rel, rename) {
            touched.push(rel);
        }
    }

    /// The path of `inode` relative to the mount root (empty for the root itself), or
    /// `None` when the object is no longer reachable (unlinked), so no tree path changes.
    pub fn rel_path_of(&self, inode: &Inode) -> io::Result<Option<Vec<u8>>> {
        match sys::fd_path(inode.fd()?.as_raw_fd()) {
            Ok(Some(abs)) => Ok(self.strip_src(&abs)),
            Ok(None) => Ok(None),
            // The kernel spells an fd's path in one page; deeper paths are legal.
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                self.rel_path_by_origins(inode)
            }
            Err(e) => Err(e),
        }
    }

    /// The path of `inode` from the names it was reached under (its origins, invariant 4 of
    /// the inode table), up to the nearest ancestor whose path the kernel can spell. Each
    /// name is checked to still lead to its object (`fstatat` without following, same
    /// `(st_dev, st_ino)`): a rename made in SRC behind the mount's back gives ESTALE, not a
    /// wrong path whose backup would be of another file.
    fn rel_path_by_origins(&self, inode: &Inode) -> io::Result<Option<Vec<u8>>> {
        let mut names: Vec<CString> = Vec::new();
        let mut child_key = inode.key;
        let mut up = inode.origin();
        let mut prefix = loop {
            let Some((parent, name)) = up else {
                break Vec::new(); // reached the root by names alone
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
            match sys::fd_path(parent_fd.as_raw_fd()) {
                Ok(Some(abs)) => match self.strip_src(&abs) {
                    Some(rel) => break rel,
                    None => return Ok(None),
                },
                Ok(None) => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                    child_key = parent.key;
                    up = parent.origin();
                }
                Err(e) => return Err(e),
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

    fn rel_child(&self, parent: &Inode, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
        let Some(mut rel) = self.rel_path_of(parent)? else {
            return Ok(None);
        };
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(sys::name_bytes(name));
        Ok(Some(rel))
    }

    fn strip_src(&self, abs: &[u8]) -> Option<Vec<u8>> {
        let rest = abs.strip_prefix(self.src_prefix.as_slice())?;
        match rest {
            [] => Some(Vec::new()),
            [b'/', tail @ ..] => Some(tail.to_vec()),
            // Only happens for SRC = "/", whose prefix is empty after trimming.
            _ => None,
        }
    }
}

/// Every syscall that changes SRC. Each takes a [`Permit`] so it cannot be reached without
/// passing the gate. Keep this module the only place with such calls.
pub mod mutate {
    use std::ffi::CStr;
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

    use super::Permit;
    use crate::sys::{XattrPath, cvt, proc_reopen, with_proc_path};

    /// Opens (maybe creating) `name` in `dir` with flags that can write.
    pub fn openat(
        _: &Permit<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: i32,
        mode: u32,
    ) -> io::Result<OwnedFd> {
        crate::sys::openat(dir, name, flags, mode)
    }

    /// Re-opens an O_PATH fd with flags that can write or truncate.
    pub fn reopen(_: &Permit<'_>, fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
        proc_reopen(fd, flags)
    }

    pub fn mkdirat(_: &Permit<'_>, dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd and C string.
        cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
        Ok(())
    }

    pub fn mknodat(
        _: &Permit<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        mode: u32,
        rdev: u64,
    ) -> io::Result<()> {
        // SAFETY: valid fd and C string.
        cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) })?;
        Ok(())
    }

    pub fn symlinkat(
        _: &Permit<'_>,
        target: &CStr,
        dir: BorrowedFd<'_>,
        name: &CStr,
    ) -> io::Result<()> {
        // SAFETY: valid fd and C strings.
        cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
        Ok(())
    }

    /// Hard-links the object behind an O_PATH fd (AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH,
    /// which root has; the /proc link form with AT_SYMLINK_FOLLOW works for everyone).
    pub fn linkat(_: &Permit<'_>, fd: RawFd, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: valid C strings and fds.
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

    pub fn unlinkat(
        _: &Permit<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: i32,
    ) -> io::Result<()> {
        // SAFETY: valid fd and C string.
        cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
        Ok(())
    }

    pub fn renameat2(
        _: &Permit<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        new_dir: BorrowedFd<'_>,
        new_name: &CStr,
        flags: u32,
    ) -> io::Result<()> {
        // SAFETY: valid fds and C strings.
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
    pub fn chmod(_: &Permit<'_>, fd: RawFd, mode: u32) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: valid C string; the /proc link resolves to the object itself.
            cvt(unsafe { libc::chmod(p.as_ptr(), mode) })?;
            Ok(())
        })
    }

    pub fn fchmod(_: &Permit<'_>, fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
        Ok(())
    }

    /// chown of the object behind an O_PATH fd, never following a symlink.
    pub fn chown(_: &Permit<'_>, fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
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

    pub fn ftruncate(_: &Permit<'_>, fd: BorrowedFd<'_>, size: u64) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) })?;
        Ok(())
    }

    /// utimensat on the object behind an O_PATH fd (symlinks included, via AT_EMPTY_PATH).
    pub fn utimens(_: &Permit<'_>, fd: RawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
        with_proc_path(fd, |p| {
            // SAFETY: valid C string and times array; for symlinks the proc link must not be
            // followed, for everything else it must.
            cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) })?;
            Ok(())
        })
    }

    pub fn futimens(
        _: &Permit<'_>,
        fd: BorrowedFd<'_>,
        times: &[libc::timespec; 2],
    ) -> io::Result<()> {
        // SAFETY: valid fd and times array.
        cvt(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })?;
        Ok(())
    }

    pub fn pwrite(
        _: &Permit<'_>,
        fd: BorrowedFd<'_>,
        data: &[u8],
        offset: u64,
    ) -> io::Result<usize> {
        // SAFETY: data is readable for its length.
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

    pub fn fallocate(
        _: &Permit<'_>,
        fd: BorrowedFd<'_>,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> io::Result<()> {
        // SAFETY: valid fd.
        cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset as i64, len as i64) })?;
        Ok(())
    }

    pub fn copy_file_range(
        _: &Permit<'_>,
        fd_in: BorrowedFd<'_>,
        off_in: u64,
        fd_out: BorrowedFd<'_>,
        off_out: u64,
        len: u64,
        flags: u32,
    ) -> io::Result<usize> {
        let mut off_in = off_in as i64;
        let mut off_out = off_out as i64;
        // SAFETY: valid fds and offset pointers.
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

    pub fn setxattr(
        _: &Permit<'_>,
        at: &XattrPath,
        name: &CStr,
        value: &[u8],
        flags: i32,
    ) -> io::Result<()> {
        let (value_ptr, len) = (value.as_ptr().cast(), value.len());
        // SAFETY: the path and name are C strings; value is readable for its length.
        cvt(unsafe {
            if at.nofollow {
                libc::lsetxattr(at.as_ptr(), name.as_ptr(), value_ptr, len, flags)
            } else {
                libc::setxattr(at.as_ptr(), name.as_ptr(), value_ptr, len, flags)
            }
        })?;
        Ok(())
    }

    pub fn removexattr(_: &Permit<'_>, at: &XattrPath, name: &CStr) -> io::Result<()> {
        // SAFETY: the path and name are C strings.
        cvt(unsafe {
            if at.nofollow {
                libc::lremovexattr(at.as_ptr(), name.as_ptr())
            } else {
                libc::removexattr(at.as_ptr(), name.as_ptr())
            }
        })?;
        Ok(())
    }

    /// Opens a fresh O_PATH fd for a name just created (no mutation, but it belongs to the
    /// create sequence and keeps `OwnedFd::from_raw_fd` out of the core).
    pub fn adopt(fd: RawFd) -> OwnedFd {
        // SAFETY: callers pass an fd they own and never use again.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }
}
