//! Processes and this process's descriptors and capabilities: pidfds, closing inherited
//! descriptors, CAP_SYS_ADMIN.
use std::os::fd::{FromRawFd, OwnedFd};

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

/// `pidfd_send_signal(pidfd, sig)`: signals the process `pidfd` refers to, which cannot be
/// another process that reused its pid.
#[allow(
    clippy::disallowed_methods,
    reason = "pidfd_send_signal has no libc wrapper; it signals a process and changes no file"
)]
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, sig: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal(2) takes an fd, a signal number, a null siginfo and flags 0.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
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

/// Whether this process has CAP_SYS_ADMIN in its effective set, which kernel passthrough
/// (FUSE_DEV_IOC_BACKING_OPEN) and a private clone of SRC's mount (`open_tree`) need. Read from `/proc/self/status`; if that
/// cannot be read, assume it does and let the first open find out.
pub(crate) fn has_cap_sys_admin() -> bool {
    has_effective_cap(CAP_SYS_ADMIN)
}

pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_SETFCAP: u32 = 31;

/// Whether this process has capability `cap` in its effective set, read from
/// `/proc/self/status`; if that cannot be read, assume it does and let the operation that
/// needs it find out.
pub fn has_effective_cap(cap: u32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_none_or(|caps| caps & (1 << cap) != 0)
}
