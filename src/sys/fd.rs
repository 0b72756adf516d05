//! Opening, reading and stat'ing through file descriptors: read-only openers (they refuse
//! writing flags, see [`refuse_writing`]), `/proc/self/fd` paths, opening beneath a root
//! without following symlinks, kernel file handles.
use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use super::{EMPTY, cvt, errno};

pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: valid fd, NUL-terminated name, st points to writable memory of the right size.
    cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded and filled `st`.
    Ok(unsafe { st.assume_init() })
}

/// `stat` of the object an fd refers to (works for O_PATH fds).
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    fstatat(fd, EMPTY, libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW)
}

/// Flags an opener in this module refuses (EINVAL): those that can write, create or
/// truncate. A write-capable open is a permit method of the gate.
pub const WRITING_FLAGS: i32 = libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC;

/// `EINVAL` for `flags` that could change what they open (see [`WRITING_FLAGS`]).
pub fn refuse_writing(flags: i32) -> io::Result<()> {
    if flags & WRITING_FLAGS != 0 {
        debug_assert!(
            false,
            "a read-only opener was given writing flags {flags:#o}"
        );
        return Err(errno(libc::EINVAL));
    }
    Ok(())
}

/// openat for reading or O_PATH only (see [`refuse_writing`]).
#[allow(
    clippy::disallowed_methods,
    reason = "read-only: writing flags are refused first"
)]
pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    refuse_writing(flags)?;
    // SAFETY: valid fd and C string; the returned fd is owned by us.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode,
        )
    })?;
    // SAFETY: fd was just returned by openat and is not owned elsewhere.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Re-opens an O_PATH fd with real access flags through /proc/self/fd, the only way to
/// turn an O_PATH fd into a readable/writable one without knowing its path.
///
/// Read-only flags only: an open that can write is [`crate::fs::gate::ObjectPermit::open_for_writing`].
/// `noatime`: with O_NOATIME where the kernel allows it (see [`with_noatime`]).
pub fn reopen_readonly_like(fd: RawFd, flags: i32, noatime: bool) -> io::Result<OwnedFd> {
    debug_assert_eq!(flags & (libc::O_CREAT | libc::O_TRUNC), 0);
    debug_assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
    if noatime {
        with_noatime(flags, |flags| proc_reopen(fd, flags))
    } else {
        proc_reopen(fd, flags)
    }
}

/// `open(flags | O_NOATIME)`, or `open(flags)` where the kernel refuses O_NOATIME (EPERM:
/// not the file's owner and no CAP_FOWNER): reads then leave access times alone wherever
/// that is allowed.
pub(crate) fn with_noatime(
    flags: i32,
    open: impl Fn(i32) -> io::Result<OwnedFd>,
) -> io::Result<OwnedFd> {
    match open(flags | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(flags),
        other => other,
    }
}

/// Opens the file behind `fd` (O_PATH will do) for reading by the daemon itself (backups,
/// views, checkpoint copies), plus `extra` flags: with O_NOATIME, so that its reads leave
/// the user's access times alone, where the kernel allows it (EPERM: not the file's owner and
/// no CAP_FOWNER), else without.
pub(crate) fn reopen_for_reading(fd: RawFd, extra: i32) -> io::Result<OwnedFd> {
    with_noatime(libc::O_RDONLY | extra, |flags| proc_reopen(fd, flags))
}

/// Re-opens an O_PATH fd through its /proc link, for reading or O_PATH only (see
/// [`refuse_writing`]).
#[allow(
    clippy::disallowed_methods,
    reason = "read-only: writing flags are refused first"
)]
pub(crate) fn proc_reopen(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
    refuse_writing(flags)?;
    let mut buf = [0u8; 32];
    let path = proc_fd_path(&mut buf, fd);
    let flags = (flags | libc::O_CLOEXEC) & !(libc::O_NOFOLLOW | libc::O_CREAT | libc::O_EXCL);
    // SAFETY: `path` is NUL-terminated; the returned fd is owned by us.
    let new = cvt(unsafe { libc::open(path.as_ptr(), flags) })?;
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Formats `/proc/self/fd/<fd>` into `buf` without allocating.
pub fn proc_fd_path(buf: &mut [u8; 32], fd: RawFd) -> &CStr {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let mut n = fd as u32;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let len = digits.len() - i;
    buf[prefix.len()..prefix.len() + len].copy_from_slice(&digits[i..]);
    buf[prefix.len() + len] = 0;
    CStr::from_bytes_until_nul(&buf[..]).expect("NUL written above")
}

/// The current absolute path of what `fd` refers to, or `None` if it has been deleted.
pub fn fd_path(fd: RawFd) -> io::Result<Option<Vec<u8>>> {
    let mut buf = [0u8; 32];
    let link = proc_fd_path(&mut buf, fd);
    let mut out = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `out` is writable for its length.
    let n =
        cvt(unsafe { libc::readlink(link.as_ptr(), out.as_mut_ptr().cast(), out.len()) })? as usize;
    out.truncate(n);
    if out.ends_with(b" (deleted)") {
        return Ok(None);
    }
    Ok(Some(out))
}

pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `out` is writable for its length.
    let n = cvt(unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            out.as_mut_ptr().cast(),
            out.len(),
        )
    })? as usize;
    out.truncate(n);
    Ok(out)
}

pub fn faccessat(dir: BorrowedFd<'_>, name: &CStr, mask: i32, flags: i32) -> io::Result<()> {
    // SAFETY: valid fd and C string.
    cvt(unsafe { libc::faccessat(dir.as_raw_fd(), name.as_ptr(), mask, flags) })?;
    Ok(())
}

pub fn fstatvfs(fd: BorrowedFd<'_>) -> io::Result<libc::statvfs> {
    let mut st = MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid fd; st is writable.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstatvfs succeeded.
    Ok(unsafe { st.assume_init() })
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: buf is writable for its length.
    let n = cvt(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as i64,
        )
    })?;
    Ok(n as usize)
}

pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) })
}

pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> io::Result<()> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })?;
    Ok(())
}

/// Runs `f` with the `/proc/self/fd/<fd>` path of an O_PATH fd (the f*xattr and fchmod
/// calls refuse O_PATH fds; a path call through the proc link reaches the object).
pub fn with_proc_path<R>(fd: RawFd, f: impl FnOnce(&CStr) -> io::Result<R>) -> io::Result<R> {
    let mut buf = [0u8; 32];
    f(proc_fd_path(&mut buf, fd))
}

/// A path of more than this many bytes is opened in pieces by [`open_beneath`]: the kernel
/// refuses one of PATH_MAX (4096, NUL included) or more with ENAMETOOLONG, though a tree may
/// go deeper.
const PATH_PIECE: usize = 4000;

/// Opens `rel` (a `/`-separated path, "" for `dir` itself) beneath `dir` with
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: no symlink is followed, not even the last
/// component (O_NOFOLLOW), so the result is always inside the tree `dir` roots.
///
/// For reading or O_PATH only (see [`refuse_writing`]).
#[allow(
    clippy::disallowed_methods,
    reason = "openat2 has no libc wrapper; read-only: writing flags are refused first"
)]
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    refuse_writing(flags)?;
    if rel.len() > PATH_PIECE
        && let Some(cut) = rel.as_bytes()[..PATH_PIECE]
            .iter()
            .rposition(|&b| b == b'/')
            .filter(|&cut| cut > 0)
    {
        // Each piece beneath the directory the one before opened, so beneath `dir` too.
        let head = open_beneath(dir, &rel[..cut], libc::O_PATH | libc::O_DIRECTORY, 0)?;
        return open_beneath(head.as_fd(), &rel[cut + 1..], flags, mode);
    }
    let path = if rel.is_empty() { "." } else { rel };
    let c = std::ffi::CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid fd, C string and open_how of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A kernel file handle (`struct file_handle`): names an object on its filesystem
/// independently of any path, as NFS servers and virtiofsd use it. Stored as u32 words so
/// the header (`handle_bytes`, `handle_type`) is suitably aligned. Equal handles name the
/// same object (the same inode and generation).
#[derive(Clone, PartialEq, Eq)]
pub struct FileId {
    words: Box<[u32]>,
}

impl FileId {
    const HEADER_WORDS: usize = 2;
    /// `FILEID_INO32_GEN` (include/linux/exportfs.h): a 32-bit inode number, then the
    /// inode's generation, as ext2/3/4 (and others using the generic helpers) encode them.
    const INO32_GEN: u32 = 1;

    /// `(inode number, generation)` if the handle has the `FILEID_INO32_GEN` layout.
    pub fn ino32_gen(&self) -> Option<(u32, u32)> {
        match *self.words {
            [8, Self::INO32_GEN, ino, generation] => Some((ino, generation)),
            _ => None,
        }
    }

    /// A `FILEID_INO32_GEN` handle for inode `ino` of `generation`. ext2/3/4 take
    /// generation 0 as "any": such a handle opens whatever inode has that number now.
    pub fn ino32_gen_handle(ino: u32, generation: u32) -> FileId {
        FileId {
            words: Box::new([8, Self::INO32_GEN, ino, generation]),
        }
    }

    /// The handle of the object `fd` refers to (an O_PATH fd is fine).
    pub fn of(fd: BorrowedFd<'_>) -> io::Result<FileId> {
        let max = libc::MAX_HANDLE_SZ as usize;
        let mut words = vec![0u32; Self::HEADER_WORDS + max.div_ceil(4)];
        words[0] = max as u32;
        let mut mount_id: libc::c_int = 0;
        // SAFETY: `words` starts with a file_handle header whose handle_bytes (MAX_HANDLE_SZ)
        // is no more than the room after it; mount_id is writable; "" with AT_EMPTY_PATH
        // names `fd` itself.
        cvt(unsafe {
            libc::name_to_handle_at(
                fd.as_raw_fd(),
                EMPTY.as_ptr(),
                words.as_mut_ptr().cast::<libc::file_handle>(),
                &mut mount_id,
                libc::AT_EMPTY_PATH,
            )
        })?;
        let used = Self::HEADER_WORDS + (words[0] as usize).div_ceil(4);
        words.truncate(used);
        Ok(FileId {
            words: words.into_boxed_slice(),
        })
    }

    /// Opens the object again with `flags` (O_PATH here); `mount_fd` is any fd on the same
    /// filesystem. Needs CAP_DAC_READ_SEARCH (EPERM otherwise); ESTALE when the object is
    /// gone.
    pub fn open(&self, mount_fd: BorrowedFd<'_>, flags: i32) -> io::Result<OwnedFd> {
        // The kernel only reads the handle, but the prototype takes it mutably: give it a
        // copy of our own.
        let mut words = self.words.to_vec();
        // SAFETY: `words` is a complete file_handle (header + handle_bytes as returned by
        // name_to_handle_at); the returned fd is owned by us.
        let fd = cvt(unsafe {
            libc::open_by_handle_at(
                mount_fd.as_raw_fd(),
                words.as_mut_ptr().cast::<libc::file_handle>(),
                flags | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: a fresh fd we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// poll(2) for POLLIN/POLLHUP on `fd`; `Ok(false)` on timeout.
pub fn poll_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd, live for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r > 0 {
            return Ok(true);
        }
        if r == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Opens SRC itself (an O_PATH directory fd): the root every operation on SRC is relative to.
#[allow(
    clippy::disallowed_methods,
    reason = "an O_PATH open, which cannot write"
)]
pub fn open_source(source: &std::path::Path) -> io::Result<OwnedFd> {
    let src_c = CString::new(source.as_os_str().as_bytes()).map_err(|_| errno(libc::EINVAL))?;
    // SAFETY: valid C string; the fd is owned below.
    let raw = unsafe {
        libc::open(
            src_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if raw < 0 {
        let e = io::Error::last_os_error();
        return Err(crate::sys::context(
            format!("cannot open the source directory {}", source.display()),
            e,
        ));
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their trees directly"
)]
mod tests {
    use super::*;

    #[test]
    fn a_path_longer_than_path_max_opens_in_pieces_beneath_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::File::open(dir.path()).unwrap();
        let name = "d".repeat(200);
        let mut rel = String::new();
        let mut parent = OwnedFd::from(root.try_clone().unwrap());
        for _ in 0..30 {
            let c = std::ffi::CString::new(name.as_str()).unwrap();
            // SAFETY: valid fd and C string.
            cvt(unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), 0o700) }).unwrap();
            parent =
                open_beneath(parent.as_fd(), &name, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
            rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
        }
        assert!(rel.len() > 6000);
        let fd = open_beneath(root.as_fd(), &rel, libc::O_PATH | libc::O_DIRECTORY, 0).unwrap();
        let (a, b) = (fstat(fd.as_fd()).unwrap(), fstat(parent.as_fd()).unwrap());
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
        // Still beneath the root in every piece: `..` out of a piece is refused.
        let up = format!("{rel}/{}", vec![".."; 31].join("/"));
        assert!(open_beneath(root.as_fd(), &up, libc::O_PATH, 0).is_err());
    }
}
