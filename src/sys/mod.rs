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

/// The errno of `e`, or 0 if it carries none (looking through [`context`] wraps).
pub fn errno_of(e: &io::Error) -> i32 {
    os_error(e).unwrap_or(0)
}

/// The OS error code `e` carries: its own, or that of the error a [`context`] (or
/// [`clone_error`]) wrap keeps. So an EDQUOT or EROFS deep in a backup still reaches the
/// caller as EDQUOT or EROFS, never as a generic EIO.
pub fn os_error(e: &io::Error) -> Option<i32> {
    if let Some(code) = e.raw_os_error() {
        return Some(code);
    }
    let inner = e.get_ref()?;
    if let Some(c) = inner.downcast_ref::<Context>() {
        return os_error(&c.source);
    }
    // An error of another kind around one of these (e.g. `InvalidData` carrying EIO).
    if let Some(e) = inner.downcast_ref::<io::Error>() {
        return os_error(e);
    }
    inner.downcast_ref::<Cloned>().and_then(|c| c.errno)
}

/// An error with what was being done in front of it ("cannot open /x"), keeping the
/// original as its source: see [`context`].
#[derive(Debug)]
pub struct Context {
    what: String,
    source: io::Error,
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// `e` with `what` in front of it (`"{what}: {e}"`), keeping its kind, and its errno for
/// [`errno_of`]: the one way to add a path or an action to an `io::Error`. (Rebuilding an
/// error from its kind and a message would turn EDQUOT, EROFS and the like into EIO.)
pub fn context(what: impl Into<String>, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        Context {
            what: what.into(),
            source: e,
        },
    )
}

/// What [`clone_error`] copies of an error: its message and errno.
#[derive(Debug)]
struct Cloned {
    text: String,
    errno: Option<i32>,
}

impl std::fmt::Display for Cloned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Cloned {}

/// A copy of `e` (`io::Error` is not `Clone`): the same kind, message and errno.
pub fn clone_error(e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        Cloned {
            text: e.to_string(),
            errno: os_error(e),
        },
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errno_survives_every_wrap_and_copy() {
        for code in [
            libc::EDQUOT,
            libc::EROFS,
            libc::ENOSPC,
            libc::EIO,
            libc::ESTALE,
        ] {
            let wrapped = context("cannot back up a/b", context("store", errno(code)));
            assert_eq!(errno_of(&wrapped), code);
            assert_eq!(wrapped.kind(), errno(code).kind());
            let copy = clone_error(&wrapped);
            assert_eq!(errno_of(&copy), code);
            assert_eq!(copy.to_string(), wrapped.to_string());
            assert_eq!(errno_of(&context("again", copy)), code);
        }
        let e = context("cannot open /x", errno(libc::EROFS));
        assert!(e.to_string().starts_with("cannot open /x: "), "{e}");
        assert_eq!(error_text(&e), "cannot open /x: Read-only file system");
        assert_eq!(errno_of(&io::Error::other("no errno")), 0);
        assert_eq!(errno_of(&clone_error(&io::Error::other("none"))), 0);
    }
}
