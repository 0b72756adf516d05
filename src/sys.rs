//! Thin, allocation-free wrappers over the *read-only* syscalls that the passthrough core
//! (`fs`) and the history (`history`) both need: the layer below both.
//!
//! Syscalls that change SRC are the methods of the gate's permits ([`crate::fs::gate`]);
//! nothing in this file may modify the filesystem. Its openers refuse flags that could
//! write, create or truncate ([`refuse_writing`]), so an fd from here is never a way
//! around the gate.
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

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
pub fn reopen_readonly_like(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
    debug_assert_eq!(flags & (libc::O_CREAT | libc::O_TRUNC), 0);
    debug_assert_eq!(flags & libc::O_ACCMODE, libc::O_RDONLY);
    proc_reopen(fd, flags)
}

/// Opens the file behind `fd` (O_PATH will do) for reading by the daemon itself (backups,
/// views, checkpoint copies), plus `extra` flags: with O_NOATIME, so that its reads leave
/// the user's access times alone, where the kernel allows it (EPERM: not the file's owner and
/// no CAP_FOWNER), else without.
pub(crate) fn reopen_for_reading(fd: RawFd, extra: i32) -> io::Result<OwnedFd> {
    match proc_reopen(fd, libc::O_RDONLY | libc::O_NOATIME | extra) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => proc_reopen(fd, libc::O_RDONLY | extra),
        other => other,
    }
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

/// The credentials of the peer of a connected Unix socket (`SO_PEERCRED`: the process that
/// connected and its uid and gid, as of the connect).
pub fn peer_cred(fd: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd; `cred` is writable for `len` bytes, the size SO_PEERCRED fills.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    })?;
    Ok(cred)
}

/// The process id of the peer of a connected Unix socket (see [`peer_cred`]).
pub fn peer_pid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    u32::try_from(peer_cred(fd)?.pid).map_err(|_| errno(libc::ESRCH))
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
    /// Opens a stream on directory `fd` (an O_PATH fd is fine: it is re-opened).
    pub fn open(fd: BorrowedFd<'_>) -> io::Result<DirStream> {
        let dirfd = openat(fd, DOT, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
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

/// Switches the calling thread's filesystem uid/gid for the guard's lifetime, so that files
/// created on behalf of another user belong to that user, and what the thread changes is
/// checked as that user's (a non-zero fsuid drops the daemon's file capabilities), as the
/// kernel would do. The ids the thread had before come back on drop, so guards nest.
///
/// setfsuid/setfsgid are per-thread at the syscall level, which is what we want: each FUSE
/// worker thread switches only itself. A daemon that is not root cannot switch (a no-op).
/// A switch to the ids the thread has already costs no syscall: [`FsCredsGuard::as_daemon`]
/// runs on every gated change, nearly always on a thread that is the daemon already.
pub struct FsCredsGuard {
    /// The thread's fs ids before the switch, if it switched.
    previous: Option<(u32, u32)>,
}

thread_local! {
    /// The fs ids this thread runs with, as the guards set them: (0, 0), the daemon's own
    /// (root's), until a guard switches. Nothing else changes them on a thread that uses
    /// guards ([`act_as_user_on_this_thread`]'s thread only checks a path and ends).
    static FS_IDS: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

impl FsCredsGuard {
    pub fn switch(uid: u32, gid: u32) -> FsCredsGuard {
        let current = FS_IDS.get();
        // SAFETY: geteuid has no preconditions.
        if current == (uid, gid) || unsafe { libc::geteuid() } != 0 {
            return FsCredsGuard { previous: None };
        }
        set_fs_ids(uid, gid);
        FS_IDS.set((uid, gid));
        FsCredsGuard {
            previous: Some(current),
        }
    }

    /// Back to the daemon's own (root's) fs ids for the guard's lifetime: for what the
    /// daemon does for itself in the middle of a change made as another user (Layer 1 reads
    /// SRC and writes the store, which is root's alone).
    pub fn as_daemon() -> FsCredsGuard {
        FsCredsGuard::switch(0, 0)
    }
}

/// Sets this thread's fs ids: fsuid first when going back to root (its file capabilities
/// return with it), gid first otherwise.
#[allow(
    clippy::disallowed_methods,
    reason = "setfsgid/setfsuid: this thread's filesystem ids, no change to any file"
)]
fn set_fs_ids(uid: u32, gid: u32) {
    // SAFETY: raw syscalls on this thread's credentials; any id is accepted (an id the
    // thread may not take leaves it unchanged).
    unsafe {
        if uid == 0 {
            libc::syscall(libc::SYS_setfsuid, uid);
            libc::syscall(libc::SYS_setfsgid, gid);
        } else {
            libc::syscall(libc::SYS_setfsgid, gid);
            libc::syscall(libc::SYS_setfsuid, uid);
        }
    }
}

impl Drop for FsCredsGuard {
    fn drop(&mut self) {
        if let Some(ids) = self.previous {
            set_fs_ids(ids.0, ids.1);
            FS_IDS.set(ids);
        }
    }
}

/// Runs `create` with the caller's `umask` applied the way a local filesystem applies it:
/// by the filesystem underneath, which ignores the umask when the parent directory has a
/// default POSIX ACL (the ACL's mask decides instead). With `FUSE_DONT_MASK` the kernel
/// sends the mode unmasked plus the umask, so that rule can only be applied here; libfuse's
/// and virtiofsd's servers do the same with a scoped per-thread umask.
///
/// The umask lives in the `fs_struct`, which all threads share: the calling thread first
/// gets its own (`unshare(CLONE_FS)`, once per thread), so that no other thread's creations
/// see it. Invariant: outside this function every thread's umask is 0 (see `daemon::serve`).
/// If a thread cannot have its own, `create` gets `mode & !umask` (what the kernel does
/// without FUSE_DONT_MASK: right except under a default ACL), logged once.
pub fn with_umask<R>(umask: u32, mode: u32, create: impl FnOnce(u32) -> R) -> R {
    thread_local! {
        static OWN_FS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    let umask = umask & 0o777;
    if umask == 0 {
        return create(mode);
    }
    let own = OWN_FS.with(|own| {
        if let Some(known) = own.get() {
            return known;
        }
        let got = (|| {
            // SAFETY: unshare(CLONE_FS) only gives this thread a private copy of its
            // fs_struct (root, cwd, umask); no memory is involved.
            if unsafe { libc::unshare(libc::CLONE_FS) } == 0 {
                return true;
            }
            static LOGGED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!(
                    "unshare(CLONE_FS) failed ({}): the umask is applied to new files even \
                     under a default ACL (logged once)",
                    io::Error::last_os_error()
                );
            }
            false
        })();
        own.set(Some(got));
        got
    });
    if !own {
        return create(mode & !umask);
    }
    // SAFETY: umask has no preconditions; this thread's fs_struct is its own (above).
    unsafe { libc::umask(umask as libc::mode_t) };
    let out = create(mode);
    // SAFETY: as above; back to the invariant's 0.
    unsafe { libc::umask(0) };
    out
}

pub fn name_bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
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
/// the header (`handle_bytes`, `handle_type`) is suitably aligned.
#[derive(Clone)]
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
        return Err(io::Error::new(
            e.kind(),
            format!("cannot open the source directory {}: {e}", source.display()),
        ));
    }
    // SAFETY: fresh fd.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

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

/// `pidfd_open(2)`: a descriptor that becomes readable when process `pid` exits (`None` if
/// there is no such process, or the kernel has no pidfds).
#[allow(
    clippy::disallowed_methods,
    reason = "pidfd_open has no libc wrapper; it only opens a process descriptor"
)]
pub(crate) fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes plain integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `close_range(first, ~0, 0)`: closes every descriptor from `first` up. Best effort (an
/// old kernel without it leaves them open).
#[allow(
    clippy::disallowed_methods,
    reason = "close_range has no libc wrapper; it only closes this process's descriptors"
)]
pub(crate) fn close_descriptors_from(first: u32) {
    // SAFETY: close_range(2) only closes descriptors; the caller owns every one from `first`
    // up and uses none of them afterwards.
    unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
}

/// Makes the calling thread, and only it, act as `user` on a mount made for that user: no
/// supplementary groups, real, effective and saved ids all `user`'s (what the kernel's FUSE
/// access check compares with the mount's `user_id`/`group_id`: root itself is refused by a
/// mount made for another user), and of root's capabilities only CAP_DAC_READ_SEARCH.
///
/// Irreversible for the thread: call it on a thread that ends with the work (a rewind's
/// check of the mount root runs on one of its own). Raw syscalls on purpose: glibc's wrappers would change every thread of the
/// process.
#[allow(
    clippy::disallowed_methods,
    reason = "setgroups/setresgid/setresuid/capset: this thread's credentials, no file"
)]
pub fn act_as_user_on_this_thread(user: UserIds) -> io::Result<()> {
    const CAP_DAC_READ_SEARCH: u32 = 2;
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let check = |rc: libc::c_long| {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: prctl(PR_SET_KEEPCAPS) takes integer arguments and changes this thread's
    // securebits only.
    check(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) }.into())?;
    // SAFETY: setgroups with a count of 0 never reads the (null) list; like the two id
    // syscalls after it, issued raw, it changes this thread's credentials only.
    check(unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) })?;
    // SAFETY: integer arguments; this thread's credentials only.
    check(unsafe { libc::syscall(libc::SYS_setresgid, user.gid, user.gid, user.gid) })?;
    // SAFETY: integer arguments; this thread's credentials only. With KEEPCAPS set the
    // permitted capabilities survive, to be cut down to one just below.
    check(unsafe { libc::syscall(libc::SYS_setresuid, user.uid, user.uid, user.uid) })?;
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let keep = 1 << CAP_DAC_READ_SEARCH;
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and data are the v3 layout the kernel reads (one header, two data
    // words), alive for the call; pid 0 is the calling thread.
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) })?;
    // SAFETY: as above.
    check(unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) }.into())
}

/// A read lease (`F_SETLEASE`, `F_RDLCK`) on an open file, released on drop (or by
/// [`ReadLease::release`]).
///
/// The kernel grants it only while nobody has the file open for writing (anywhere, any
/// process), and while it is held an open for writing or a truncate of the file waits for
/// its release, up to `/proc/sys/fs/lease-break-time` (default 45 s) after which the kernel
/// takes it away. An opener counts itself as a writer (`i_writecount`) *before* it waits,
/// which is what [`ReadLease::writer_waiting`] sees. Needs the file's owner or `CAP_LEASE`
/// and a filesystem with leases (EINVAL/EACCES otherwise, EAGAIN with a writer).
///
/// A lease belongs to the open file description, not the fd: a `dup` keeps it alive, which
/// is why release is an explicit `F_UNLCK`. A lease break is signalled to the holder with
/// SIGIO, whose default action would end the daemon: taking a lease first sets SIGIO to
/// ignored for the whole process (nothing here uses SIGIO); the holder keeps the lease
/// until it is done.
pub struct ReadLease {
    file: Option<std::fs::File>,
}

impl ReadLease {
    /// Takes a read lease on `file` (open read-only). On failure the file comes back.
    pub fn take(file: std::fs::File) -> Result<ReadLease, (io::Error, std::fs::File)> {
        static IGNORE_SIGIO: std::sync::Once = std::sync::Once::new();
        IGNORE_SIGIO.call_once(|| {
            // SAFETY: SIG_IGN is a valid disposition and SIGIO a valid signal; no handler runs.
            unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        });
        // SAFETY: plain fcntl on an fd `file` owns.
        match cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) }) {
            Ok(_) => Ok(ReadLease { file: Some(file) }),
            Err(e) => Err((e, file)),
        }
    }

    pub fn file(&self) -> &std::fs::File {
        self.file
            .as_ref()
            .expect("a ReadLease holds its file until release or drop")
    }

    /// Whether the lease is still whole: false once the kernel started breaking it (an
    /// opener for writing waits) or took it away (lease-break-time passed).
    pub fn still_held(&self) -> bool {
        // SAFETY: plain fcntl on an fd we own.
        let ty = unsafe { libc::fcntl(self.file().as_raw_fd(), libc::F_GETLEASE) };
        ty == libc::F_RDLCK
    }

    /// Whether someone has the file open for writing or is waiting to (an open for writing
    /// counts itself before it waits for this lease): a second read lease, on a fresh open
    /// file, is then refused with EAGAIN. Any other failure counts as "yes", the cautious
    /// answer.
    pub fn writer_waiting(&self) -> bool {
        let Ok(probe) = reopen_for_reading(self.file().as_raw_fd(), 0) else {
            return true;
        };
        // SAFETY: plain fcntl on an fd we own; the probe's lease ends when it closes below
        // (the probe is its only fd).
        let ret = unsafe { libc::fcntl(probe.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) };
        ret != 0
    }

    /// Ends the lease and gives the file back (a waiting writer proceeds now).
    pub fn release(mut self) -> std::fs::File {
        let file = self
            .file
            .take()
            .expect("a ReadLease holds its file until release or drop");
        unlock_lease(&file);
        file
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            unlock_lease(&file);
        }
    }
}

fn unlock_lease(file: &std::fs::File) {
    // SAFETY: plain fcntl on an fd we own. A failure means there is no lease to end (the
    // kernel took it away), and closing the file ends whatever is left.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
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
