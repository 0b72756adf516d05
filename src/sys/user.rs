//! The password database: a user's ids and home directory.
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::errno;

/// A normal user a root daemon mounts for (`mount --owner USER`): its uid and primary gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserIds {
    pub uid: u32,
    pub gid: u32,
}

/// The uid and primary gid of `user`, a name from the password database or a numeric uid.
pub fn user_ids(user: &str) -> io::Result<UserIds> {
    with_passwd(user, |pwd| UserIds {
        uid: pwd.pw_uid,
        gid: pwd.pw_gid,
    })
}

/// The home directory the password database gives `uid` (`None`: the field is empty).
pub fn home_of(uid: u32) -> io::Result<Option<PathBuf>> {
    with_passwd(&uid.to_string(), |pwd| {
        if pwd.pw_dir.is_null() {
            return None;
        }
        // SAFETY: pw_dir is non-null and points to a NUL-terminated string in the buffer
        // `with_passwd` keeps alive for this call.
        let dir = unsafe { CStr::from_ptr(pwd.pw_dir) };
        let dir = OsStr::from_bytes(dir.to_bytes());
        (!dir.is_empty()).then(|| PathBuf::from(dir))
    })
}

/// The login name the password database gives `uid` (`None`: no entry, or an empty name).
pub fn name_of(uid: u32) -> Option<String> {
    with_passwd(&uid.to_string(), |pwd| {
        if pwd.pw_name.is_null() {
            return None;
        }
        // SAFETY: pw_name is non-null and points to a NUL-terminated string in the buffer
        // `with_passwd` keeps alive for this call.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) };
        let name = name.to_string_lossy().into_owned();
        (!name.is_empty()).then_some(name)
    })
    .ok()
    .flatten()
}

/// Calls `f` with the password database entry of `user` (a name or a numeric uid); the
/// entry's strings live only for the call.
fn with_passwd<T>(user: &str, f: impl FnOnce(&libc::passwd) -> T) -> io::Result<T> {
    let by_uid = user.parse::<u32>().ok();
    let name = CString::new(user).map_err(|_| errno(libc::EINVAL))?;
    let mut pwd = MaybeUninit::<libc::passwd>::uninit();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pwd, buf and found outlive the call, buf's length is passed; the result points
    // into pwd (which the call fills) or is null.
    let rc = unsafe {
        match by_uid {
            Some(uid) => libc::getpwuid_r(
                uid,
                pwd.as_mut_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            ),
            None => libc::getpwnam_r(
                name.as_ptr(),
                pwd.as_mut_ptr(),
                buf.as_mut_ptr(),
                buf.len(),
                &mut found,
            ),
        }
    };
    if rc != 0 {
        return Err(errno(rc));
    }
    if found.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no such user in the password database",
        ));
    }
    // SAFETY: found is non-null, so the call filled pwd; its strings point into buf, which
    // lives until this function returns, after `f`.
    let pwd = unsafe { pwd.assume_init() };
    Ok(f(&pwd))
}
