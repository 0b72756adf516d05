//! Thin, allocation-free wrappers over the syscalls that the layers above share: the layer
//! below all of them, importing nothing of ours.
//!
//! Syscalls that change SRC are the methods of the gate's permits ([`crate::fs::gate`]);
//! nothing here modifies a filesystem. Its openers refuse flags that could write, create or
//! truncate ([`refuse_writing`]), so an fd from here is never a way around the gate. What
//! else is here changes only this process: a thread's credentials ([`creds`]), leases on
//! files it opened ([`lease`]), its own descriptors ([`process`]).
//!
//! Split by concern: [`fd`], [`creds`], [`dir`], [`xattr`], [`user`], [`process`],
//! [`lease`]; their items are re-exported here, so callers name `crate::sys::ITEM`.
use std::ffi::{CStr, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;

mod creds;
mod dir;
mod fd;
mod lease;
mod process;
mod user;
mod xattr;

pub use creds::*;
pub use dir::*;
pub use fd::*;
pub use lease::*;
pub(crate) use process::*;
pub use user::*;
pub use xattr::*;

/// An `io::Error` for the errno `code`.
pub fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// The errno of `e`, or 0 if it carries none.
pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// `e` as a message for a person: without the " (os error N)" the standard library adds.
pub fn error_text(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Converts a `-1` return into the thread's errno.
pub fn cvt<T: PartialOrd + From<i8>>(ret: T) -> io::Result<T> {
    if ret < T::from(0) {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Runs `f` with `name` as a NUL-terminated C string built on the stack.
///
/// FUSE names are at most NAME_MAX (255) bytes and never contain NUL or `/`, so a
/// 256-byte buffer always suffices; anything else is refused rather than allocated for.
pub fn with_name<R>(name: &OsStr, f: impl FnOnce(&CStr) -> io::Result<R>) -> io::Result<R> {
    let bytes = name.as_bytes();
    if bytes.len() > 255 {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    if bytes.is_empty() || bytes.contains(&0) || bytes.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut buf = [0u8; 256];
    buf[..bytes.len()].copy_from_slice(bytes);
    // The buffer holds `bytes` followed by at least one NUL and no interior NUL.
    let c =
        CStr::from_bytes_until_nul(&buf).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    f(c)
}

pub const EMPTY: &CStr = c"";
pub const DOT: &CStr = c".";

pub fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}
