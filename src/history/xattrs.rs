//! Extended attributes as part of a path's state (issue 28: "xattrs are content").
//!
//! A version of a regular file or directory records its extended attributes as one store
//! object: the set's canonical encoding ([`encode`]), so equal sets are one object however
//! many paths and versions have them, and the transcript carries only the object's name
//! (`EntryMeta::xattrs`; `""` for "none", which needs no object).
//!
//! Invariants:
//! 1. Only the names [`is_recorded`] accepts are recorded, compared and restored: `user.*`,
//!    the POSIX ACLs, `security.capability`, and `trusted.*` (which the kernel lists only to
//!    a daemon with CAP_SYS_ADMIN). Others (`security.selinux`, `system.nfs4_acl`...) belong
//!    to the host's policy, not to the project's content, and are left alone.
//! 2. The encoding is canonical: names sorted bytewise, each name and value length-prefixed,
//!    after a fixed header. So a set's object name is a function of the set alone, and two
//!    sets are equal iff their object names are.
//! 3. A set that cannot be read (EACCES, a file system without xattrs answering oddly) is
//!    *not recorded* (`None`), never recorded as empty: a rewind must not remove what it
//!    never saw.
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use crate::transcript::record::EntryKind;

use crate::sys::{self, XattrPath};

/// A set of extended attributes: name → value.
pub type XattrSet = BTreeMap<Vec<u8>, Vec<u8>>;

/// Starts every encoded set (invariant 2).
const HEADER: &[u8] = b"checkpointfs xattrs v1\n";

/// The file capability, which raises the privilege of whoever executes the file.
pub const CAPABILITY: &[u8] = b"security.capability";

/// Whether an attribute of this name is part of a path's recorded state (invariant 1).
pub fn is_recorded(name: &[u8]) -> bool {
    name.starts_with(b"user.")
        || name.starts_with(b"trusted.")
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
        || name == CAPABILITY
}

/// A capability that restoring an attribute needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Privilege {
    pub name: &'static str,
    /// Its number, as `capabilities(7)` has it.
    pub cap: u32,
}

/// What restoring `name` needs beyond owning the file, if anything.
pub fn privilege_needed(name: &[u8]) -> Option<Privilege> {
    if name == CAPABILITY {
        Some(Privilege {
            name: "CAP_SETFCAP",
            cap: sys::CAP_SETFCAP,
        })
    } else if name.starts_with(b"trusted.") {
        Some(Privilege {
            name: "CAP_SYS_ADMIN",
            cap: sys::CAP_SYS_ADMIN,
        })
    } else {
        None
    }
}

impl super::History {
    /// The xattrs a view shows for `rel`, whose entry in the view is `entry`: the recorded
    /// set; for a path the history does not track (unchanged since the mount: an xattr
    /// change passes the gate, which tracks the path), the live one; none for a version
    /// recorded before xattrs were. A damaged set is EIO, with a log line naming it.
    pub fn view_xattrs(&self, rel: &[u8], entry: &super::ViewEntry) -> io::Result<XattrSet> {
        if let Some(name) = entry.meta.xattrs_object() {
            return self.xattrs_of(name).map_err(|e| {
                log::error!(
                    "view of {}: cannot read its xattrs: {e}",
                    String::from_utf8_lossy(rel)
                );
                sys::errno(libc::EIO)
            });
        }
        if entry.meta.xattrs.is_some() {
            return Ok(XattrSet::new());
        }
        let Some(rel) = super::rel_key(rel) else {
            return Ok(XattrSet::new());
        };
        if self.lock().paths.contains_key(rel)
            || !matches!(entry.meta.kind, EntryKind::File | EntryKind::Dir)
        {
            return Ok(XattrSet::new());
        }
        let _daemon = sys::FsCredsGuard::as_daemon();
        Ok(match self.open_existing(rel)? {
            Some(fd) => read_fd(fd.as_fd()).unwrap_or_default(),
            None => XattrSet::new(),
        })
    }

    /// The xattr set stored as object `name`, verified against its name: a damaged object
    /// is InvalidData naming it, never a wrong set.
    pub fn xattrs_of(&self, name: &str) -> io::Result<XattrSet> {
        let data = self.store().read_object(name)?;
        if super::store::object_name(&data) != name {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "store object {name} (an xattr set) is damaged: its content does not match its name"
                ),
            ));
        }
        decode(&data).map_err(|e| sys::context(format!("store object {name}"), e))
    }
}

/// The canonical encoding of `set` (invariant 2): the header, then per attribute in name
/// order the name's length (u32 big-endian), the name, the value's length, the value.
pub fn encode(set: &XattrSet) -> Vec<u8> {
    let mut out = HEADER.to_vec();
    for (name, value) in set {
        for field in [name, value] {
            out.extend_from_slice(&(field.len() as u32).to_be_bytes());
            out.extend_from_slice(field);
        }
    }
    out
}

/// The set [`encode`] made `bytes` from; InvalidData if they are not such an encoding (a
/// damaged or foreign object), naming what is wrong.
pub fn decode(bytes: &[u8]) -> io::Result<XattrSet> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not an encoded xattr set: {why}"),
        )
    };
    let mut rest = bytes.strip_prefix(HEADER).ok_or_else(|| bad("no header"))?;
    let mut set = XattrSet::new();
    while !rest.is_empty() {
        let (Some(name), Some(value)) = (take_field(&mut rest), take_field(&mut rest)) else {
            return Err(bad("cut short"));
        };
        if set.last_key_value().is_some_and(|(last, _)| *last >= name) || !is_recorded(&name) {
            return Err(bad("names out of order, repeated or not recorded ones"));
        }
        set.insert(name, value);
    }
    Ok(set)
}

/// One length-prefixed field off the front of `rest`; `None` if it is cut short.
fn take_field(rest: &mut &[u8]) -> Option<Vec<u8>> {
    let (len, tail) = rest.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    let value = tail.get(..len)?.to_vec();
    *rest = &tail[len..];
    Some(value)
}

/// The recorded attributes of the object `fd` refers to (an O_PATH or open fd of a regular
/// file or directory; followed through its proc link). `None` when they cannot be read
/// (invariant 3); an empty set when it has none (or its file system has no xattrs).
pub fn read_fd(fd: BorrowedFd<'_>) -> Option<XattrSet> {
    let at = XattrPath::of_fd(fd.as_raw_fd());
    settle(
        fd,
        read_with(
            |buf| sys::listxattr(&at, buf),
            |name, buf| sys::getxattr(&at, name, buf),
        ),
    )
}

/// [`read_fd`] of an fd open for reading (not O_PATH): the f*xattr calls, with no path
/// to resolve (a listxattr through `/proc/self/fd/N` costs a few µs more, on every first
/// backup).
pub fn read_open(fd: BorrowedFd<'_>) -> Option<XattrSet> {
    settle(
        fd,
        read_with(
            |buf| sys::flistxattr(fd, buf),
            |name, buf| sys::fgetxattr(fd, name, buf),
        ),
    )
}

/// A read's result as [`read_fd`] gives it (invariant 3).
fn settle(fd: BorrowedFd<'_>, read: io::Result<XattrSet>) -> Option<XattrSet> {
    match read {
        Ok(set) => Some(set),
        Err(e) if sys::os_error(&e) == Some(libc::ENOTSUP) => Some(XattrSet::new()),
        Err(e) => {
            log::debug!("xattrs of fd {} not recorded: {e}", fd.as_raw_fd());
            None
        }
    }
}

fn read_with(
    mut list: impl FnMut(&mut [u8]) -> io::Result<usize>,
    mut get: impl FnMut(&CStr, &mut [u8]) -> io::Result<usize>,
) -> io::Result<XattrSet> {
    let names = read_growing(&mut list)?;
    let mut set = XattrSet::new();
    for name in names.split(|&b| b == 0).filter(|n| is_recorded(n)) {
        let cname = CString::new(name).map_err(|_| sys::errno(libc::EINVAL))?;
        match read_growing(|buf| get(&cname, buf)) {
            Ok(value) => {
                set.insert(name.to_vec(), value);
            }
            // Removed between the listing and the read: not there.
            Err(e) if sys::os_error(&e) == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(set)
}

/// The bytes `call` fills in (a listxattr or getxattr), with a buffer grown until they fit (a list or value can grow
/// between the size query and the read: ERANGE, then again).
pub fn read_growing(mut call: impl FnMut(&mut [u8]) -> io::Result<usize>) -> io::Result<Vec<u8>> {
    // Most objects have no attributes, or a few short ones: one call.
    let mut buf = vec![0u8; 256];
    loop {
        match call(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if sys::os_error(&e) == Some(libc::ERANGE) => {
                let size = call(&mut [])?;
                buf.resize(size.max(buf.len() * 2), 0);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&str, &[u8])]) -> XattrSet {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn encoding_round_trips_and_is_canonical() {
        let s = set(&[
            ("user.b", b"2"),
            ("user.a", b""),
            ("system.posix_acl_access", b"\x02\0\0\0"),
        ]);
        let bytes = encode(&s);
        assert_eq!(decode(&bytes).unwrap(), s);
        assert_eq!(decode(&encode(&XattrSet::new())).unwrap(), XattrSet::new());
        // Built in another order, the same bytes.
        let mut other = XattrSet::new();
        for (n, v) in s.iter().rev() {
            other.insert(n.clone(), v.clone());
        }
        assert_eq!(encode(&other), bytes);
    }

    #[test]
    fn damaged_encodings_are_refused() {
        let bytes = encode(&set(&[("user.a", b"xyz")]));
        for cut in 0..bytes.len() {
            if cut != HEADER.len() {
                assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut unsorted = HEADER.to_vec();
        for name in ["user.b", "user.a"] {
            for f in [name.as_bytes(), b"v"] {
                unsorted.extend_from_slice(&(f.len() as u32).to_be_bytes());
                unsorted.extend_from_slice(f);
            }
        }
        assert!(decode(&unsorted).is_err());
        let foreign = encode(&set(&[("security.selinux", b"x")]));
        assert!(decode(&foreign).is_err(), "not a recorded name");
    }

    #[test]
    fn which_names_are_recorded_and_which_need_privilege() {
        for n in [
            "user.x",
            "trusted.x",
            "security.capability",
            "system.posix_acl_access",
            "system.posix_acl_default",
        ] {
            assert!(is_recorded(n.as_bytes()), "{n}");
        }
        for n in [
            "security.selinux",
            "system.nfs4_acl",
            "security.ima",
            "userx",
        ] {
            assert!(!is_recorded(n.as_bytes()), "{n}");
        }
        assert_eq!(privilege_needed(CAPABILITY).unwrap().name, "CAP_SETFCAP");
        assert_eq!(
            privilege_needed(b"trusted.a").unwrap().name,
            "CAP_SYS_ADMIN"
        );
        assert_eq!(privilege_needed(b"user.a"), None);
    }
}
