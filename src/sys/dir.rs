//! Reading directories: a stream over a duplicate of a directory fd.
use std::ffi::CStr;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};

use super::{DOT, openat};

/// A directory stream over a duplicate of a directory fd.
pub struct DirStream {
    dir: *mut libc::DIR,
}

// SAFETY: the DIR is only used through &mut self (callers keep it behind a Mutex).
unsafe impl Send for DirStream {}

pub struct DirEntryRaw<'a> {
    pub ino: u64,
    pub offset: i64,
    pub d_type: u8,
    pub name: &'a [u8],
}

impl DirStream {
    /// Opens a stream on directory `fd` (an O_PATH fd is fine: it is re-opened); `noatime`:
    /// with O_NOATIME where the kernel allows it ([`super::with_noatime`]).
    pub fn open(fd: BorrowedFd<'_>, noatime: bool) -> io::Result<DirStream> {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let dirfd = if noatime {
            super::with_noatime(flags, |flags| openat(fd, DOT, flags, 0))?
        } else {
            openat(fd, DOT, flags, 0)?
        };
        let raw = std::os::fd::IntoRawFd::into_raw_fd(dirfd);
        // SAFETY: raw is a valid directory fd whose ownership passes to the DIR on success.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let err = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so we still own raw.
            unsafe { libc::close(raw) };
            return Err(err);
        }
        Ok(DirStream { dir })
    }

    pub fn seek(&mut self, offset: i64) {
        // SAFETY: valid DIR.
        unsafe { libc::seekdir(self.dir, offset) }
    }

    /// The next entry, or `None` at the end. The name borrows the stream's buffer.
    pub fn next_entry(&mut self) -> io::Result<Option<DirEntryRaw<'_>>> {
        // readdir signals errors only through errno, so clear it first.
        // SAFETY: errno location is thread-local and always valid.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: valid DIR.
        let ent = unsafe { libc::readdir64(self.dir) };
        if ent.is_null() {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(0) | None => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: readdir returned a valid entry that lives until the next call on this DIR,
        // which the borrow of &mut self guarantees.
        let ent = unsafe { &*ent };
        // SAFETY: d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ent.d_name.as_ptr()) }.to_bytes();
        Ok(Some(DirEntryRaw {
            ino: ent.d_ino,
            offset: ent.d_off,
            d_type: ent.d_type,
            name,
        }))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: valid DIR.
        unsafe { libc::dirfd(self.dir) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: valid DIR, closed exactly once.
        unsafe { libc::closedir(self.dir) };
    }
}
