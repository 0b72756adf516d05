//! Reading extended attributes of an object reached by fd (or its `/proc` path).
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use super::{cvt, proc_fd_path};

/// The path an xattr call reaches an object by, and whether it must not follow a symlink
/// at its end (the `l*xattr` calls).
///
/// A regular file or directory is reached through its own O_PATH fd's proc link, followed.
/// A symlink cannot be: `l*xattr` on that link acts on the procfs link itself, and the
/// xattr calls refuse O_PATH fds (even `*xattrat` with AT_EMPTY_PATH). So a symlink is
/// reached as `/proc/self/fd/<parent dir fd>/<name>`, not followed: the proc link
/// resolves to the parent directory, and the last component is the real symlink.
pub struct XattrPath {
    path: CString,
    pub nofollow: bool,
}

impl XattrPath {
    pub fn of_fd(fd: RawFd) -> XattrPath {
        let mut buf = [0u8; 32];
        XattrPath {
            path: proc_fd_path(&mut buf, fd).to_owned(),
            nofollow: false,
        }
    }

    /// `name` in directory `dir`, not followed.
    pub fn in_dir(dir: RawFd, name: &CStr) -> XattrPath {
        let mut buf = [0u8; 32];
        let mut path = proc_fd_path(&mut buf, dir).to_bytes().to_vec();
        path.push(b'/');
        path.extend_from_slice(name.to_bytes());
        XattrPath {
            // A CStr's bytes hold no NUL, nor does the proc path.
            path: CString::new(path).expect("no interior NUL"),
            nofollow: true,
        }
    }

    pub fn as_ptr(&self) -> *const libc::c_char {
        self.path.as_ptr()
    }
}

pub fn getxattr(at: &XattrPath, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the path and name are C strings; buf is writable for its length (or empty).
    let n = unsafe {
        if at.nofollow {
            libc::lgetxattr(
                at.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        } else {
            libc::getxattr(
                at.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        }
    };
    cvt(n).map(|n| n as usize)
}

pub fn listxattr(at: &XattrPath, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the path is a C string; buf is writable for its length (or empty).
    let n = unsafe {
        if at.nofollow {
            libc::llistxattr(at.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        } else {
            libc::listxattr(at.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        }
    };
    cvt(n).map(|n| n as usize)
}

/// `listxattrat(2)` (Linux 6.13) of entry `name` of directory `dir`, not following a
/// symlink: the names, with no path resolved from the root and no descriptor opened.
/// ENOSYS where the kernel is older (the caller falls back to a path).
#[allow(
    clippy::disallowed_methods,
    reason = "listxattrat has no libc wrapper yet; it only reads attribute names"
)]
pub fn listxattr_at(dir: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    /// The syscall's number, the same on every architecture (the unified table since 5.x).
    const SYS_LISTXATTRAT: libc::c_long = 465;
    // SAFETY: dir is an open fd; name is a C string; buf is writable for its length (or
    // empty). listxattrat(dfd, path, at_flags, list, size) reads and writes nothing else.
    let n = unsafe {
        libc::syscall(
            SYS_LISTXATTRAT,
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    cvt(n).map(|n| n as usize)
}

/// fgetxattr(2) on an open (not O_PATH) fd.
pub fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: fd is open; the name is a C string; buf is writable for its length (or empty).
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    cvt(n).map(|n| n as usize)
}

/// flistxattr(2) on an open (not O_PATH) fd.
pub fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: fd is open; buf is writable for its length (or empty).
    let n = unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    cvt(n).map(|n| n as usize)
}
