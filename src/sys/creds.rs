//! Credentials: the fs ids a thread acts with ([`FsCredsGuard`]), the umask a create
//! applies, acting as a mount's owner on one thread, and a socket peer's credentials.
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::{UserIds, cvt, errno};

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
