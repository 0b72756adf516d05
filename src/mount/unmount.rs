//! `checkpointfs umount`: unmount (umount2, or fusermount3 for a normal user's mount), then
//! wait for the daemon to flush its history and exit, with an exit status that says which
//! of those happened (see [`UmountOutcome`]).
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mount::mountinfo::{find_mount, is_checkpointfs_mount};
use crate::mount::registry::{
    PID_FILE, STATE_DIR_FILE, is_checkpointfs_process, parse_pid_file, process_alive,
    read_pid_file, recorded_state_dir,
};
use crate::sys::{errno_of, error_text, pidfd_open, poll_readable};

/// How `umount` ended (each has its own exit status: `crate::cli::exit_status`). What
/// happened has been printed already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UmountOutcome {
    /// Unmounted, and the daemon has flushed its history and exited.
    Done,
    /// Usage error, or MNT is not a checkpointfs mount: nothing was done.
    Refused,
    /// Any other failure.
    Failed,
    /// MNT is not mounted (any more) and no daemon runs for it.
    Gone,
    /// MNT is busy and was left mounted.
    Busy,
    /// Unmounted or detached, but the daemon did not exit within the timeout.
    DaemonTimeout,
}

/// The absolute, symlink-free path of a mount point that may be a dead FUSE mount (which
/// cannot be stat'ed): canonicalize it, or else its parent plus its name.
pub(crate) fn resolve_mountpoint(mnt: &Path) -> io::Result<PathBuf> {
    let err = match fs::canonicalize(mnt) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    let abs = std::path::absolute(mnt)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(fs::canonicalize(parent).map_err(|_| err)?.join(name)),
        _ => Err(err),
    }
}

/// Waits until `pid` has exited; `false` on timeout.
pub(crate) fn wait_for_exit(pid: i32, pidfd: Option<&OwnedFd>, timeout: Duration) -> bool {
    if let Some(fd) = pidfd
        && let Ok(done) = poll_readable(fd.as_raw_fd(), timeout)
    {
        return done || !process_alive(pid);
    }
    let deadline = Instant::now() + timeout;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

pub(crate) fn umount_syscall(path: &Path, lazy: bool) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How long a busy mount is tried again before `umount` says so.
const BUSY_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// [`umount_syscall`], trying again for up to [`BUSY_GRACE`] while the mount is busy. Some
/// references to a mount outlive what made them by moments: a process that forks (any
/// program spawning a child) copies every fd it has open there into the child until the
/// child's exec closes them, and a killed process holds its files until its exit is done,
/// which its parent need not wait for. A working directory or an open file held on purpose
/// does not go away, and is reported after the grace period.
fn umount_unless_busy(path: &Path, lazy: bool) -> io::Result<()> {
    let deadline = std::time::Instant::now() + BUSY_GRACE;
    let mut pause = std::time::Duration::from_millis(10);
    loop {
        match umount_syscall(path, lazy) {
            Err(e) if errno_of(&e) == libc::EBUSY && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// Without CAP_SYS_ADMIN, the setuid helper may still unmount a FUSE mount we own.
pub(crate) fn fusermount_unmount(path: &Path, lazy: bool) -> bool {
    for helper in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(helper);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        match cmd.arg(path).stdin(std::process::Stdio::null()).status() {
            Ok(s) => return s.success(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(_) => return false,
        }
    }
    false
}

/// `checkpointfs umount MNT`: unmounts and waits for the daemon to exit.
pub fn umount(mnt: &Path, lazy: bool, timeout: Duration) -> UmountOutcome {
    let shown = mnt.display();
    let not_ours = || {
        eprintln!("checkpointfs: {shown} is not a checkpointfs mount");
        UmountOutcome::Refused
    };
    let path = match resolve_mountpoint(mnt) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!("checkpointfs: {shown} does not exist");
            return UmountOutcome::Refused;
        }
        Err(e) => {
            eprintln!("checkpointfs: cannot access {shown}: {}", error_text(&e));
            return UmountOutcome::Failed;
        }
    };
    let entry = match find_mount(&path) {
        Ok(Some(entry)) => entry,
        Ok(None) if fs::symlink_metadata(&path).is_err() => {
            eprintln!("checkpointfs: {shown} does not exist");
            return UmountOutcome::Refused;
        }
        Ok(None) => match recorded_state_dir(&path) {
            Some(state) => return already_unmounted(mnt, &state, timeout),
            None => return not_ours(),
        },
        Err(e) => {
            eprintln!(
                "checkpointfs: cannot read /proc/self/mountinfo: {}",
                error_text(&e)
            );
            return UmountOutcome::Failed;
        }
    };
    if !entry.fstype.starts_with("fuse") {
        return not_ours();
    }
    // Find the daemon before unmounting: afterwards MNT no longer leads to it.
    let state_dir = match fs::read(path.join(STATE_DIR_FILE)) {
        Ok(raw) => Ok(PathBuf::from(OsString::from_vec(
            raw.strip_suffix(b"\n").unwrap_or(&raw).to_vec(),
        ))),
        // A mount root made for another user (`mount --owner`) is closed even to root; the
        // record of mounts knows its state dir.
        Err(e) if errno_of(&e) == libc::EACCES => recorded_state_dir(&path).ok_or(e),
        Err(e) => Err(e),
    };
    let daemon_pid = match state_dir {
        Ok(state) => match daemon_of(&state) {
            Some(pid) => Some(pid),
            None => {
                eprintln!(
                    "checkpointfs: warning: no running daemon recorded in {}/{PID_FILE}; \
                     unmounting without waiting for it",
                    state.display()
                );
                None
            }
        },
        Err(e) if endpoint_gone(&e) && is_checkpointfs_mount(&entry) => {
            return detach_dead_mount(mnt, &path);
        }
        Err(e) if is_checkpointfs_mount(&entry) => {
            eprintln!(
                "checkpointfs: warning: cannot reach the daemon of {shown} ({}); unmounting \
                 without waiting for it",
                error_text(&e)
            );
            None
        }
        Err(e) if endpoint_gone(&e) => {
            eprintln!(
                "checkpointfs: {shown} is a FUSE mount whose daemon is gone, and it is not \
                 recognizably checkpointfs; if it was, clean it up with: umount -l {shown}"
            );
            return UmountOutcome::Failed;
        }
        Err(_) => return not_ours(),
    };
    let pidfd = daemon_pid.and_then(pidfd_open);

    match umount_unless_busy(&path, lazy) {
        Ok(()) => {}
        Err(e) if errno_of(&e) == libc::EBUSY => {
            eprintln!(
                "checkpointfs: {shown} is busy (a process has its working directory or a file \
                 open there; see: lsof +D {shown}); close it, or detach it anyway with: \
                 checkpointfs umount --lazy {shown}"
            );
            return UmountOutcome::Busy;
        }
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(&path, lazy) => {}
        // Unmounted by someone else since we looked: what is left is to wait for the daemon.
        Err(e) if errno_of(&e) == libc::EINVAL => {
            return match daemon_pid {
                Some(pid) => wait_for_detached_daemon(mnt, pid, timeout),
                None => {
                    eprintln!("checkpointfs: {shown} is already unmounted");
                    UmountOutcome::Gone
                }
            };
        }
        Err(e) => {
            eprintln!("checkpointfs: cannot unmount {shown}: {}", error_text(&e));
            return UmountOutcome::Failed;
        }
    }

    let Some(pid) = daemon_pid else {
        return UmountOutcome::Done;
    };
    if wait_for_exit(pid, pidfd.as_ref(), timeout) {
        return UmountOutcome::Done;
    }
    timed_out(mnt, pid, lazy, timeout)
}

/// Exit status 5 with what is going on.
fn timed_out(mnt: &Path, pid: i32, lazy: bool, timeout: Duration) -> UmountOutcome {
    let shown = mnt.display();
    if lazy {
        eprintln!(
            "checkpointfs: {shown} is detached, but the daemon (pid {pid}) is still serving \
             open files after {} s; it exits once they are closed, and its state is complete \
             only then",
            timeout.as_secs()
        );
    } else {
        eprintln!(
            "checkpointfs: {shown} is unmounted, but the daemon (pid {pid}) has not exited \
             after {} s; its state may be incomplete until it does",
            timeout.as_secs()
        );
    }
    UmountOutcome::DaemonTimeout
}

/// MNT is not mounted, and the record of mounts says it was a checkpointfs mount of
/// `state`: exit 3 once no daemon runs for it any more.
fn already_unmounted(mnt: &Path, state: &Path, timeout: Duration) -> UmountOutcome {
    let shown = mnt.display();
    match read_pid_file(&state.join(PID_FILE)) {
        // Detached lazily before, and still serving files opened in it.
        Some(pid) if is_checkpointfs_process(pid) => wait_for_detached_daemon(mnt, pid, timeout),
        Some(_) => {
            eprintln!(
                "checkpointfs: {shown} is already unmounted, but its daemon did not exit \
                 cleanly ({}/{PID_FILE} remains); the next mount recovers the history from \
                 the journal in {}",
                state.display(),
                state.display()
            );
            UmountOutcome::Gone
        }
        None => {
            eprintln!(
                "checkpointfs: {shown} is already unmounted; its daemon has exited and the \
                 history in {} is complete",
                state.display()
            );
            UmountOutcome::Gone
        }
    }
}

/// MNT is no longer mounted but daemon `pid` still runs: wait for it as after an unmount.
fn wait_for_detached_daemon(mnt: &Path, pid: i32, timeout: Duration) -> UmountOutcome {
    eprintln!(
        "checkpointfs: {} is already unmounted; waiting for its daemon (pid {pid}) to exit",
        mnt.display()
    );
    let pidfd = pidfd_open(pid);
    if wait_for_exit(pid, pidfd.as_ref(), timeout) {
        UmountOutcome::Done
    } else {
        timed_out(mnt, pid, true, timeout)
    }
}

/// The running daemon of `state`: from its pid file, or, where that is root's and we are the
/// user a root daemon mounts for (`mount --owner`), from the daemon itself over the control
/// socket, which is ours.
fn daemon_of(state: &Path) -> Option<i32> {
    let pid = match fs::read_to_string(state.join(PID_FILE)) {
        Ok(text) => parse_pid_file(&text),
        Err(e) if errno_of(&e) == libc::EACCES => {
            let status = crate::mount::control_socket::Request::Status {
                path: None,
                path_is_dir: None,
                json: true,
            };
            let response = crate::mount::control_socket::request(state, &status).ok()?;
            let report: serde_json::Value = serde_json::from_str(&response.output).ok()?;
            report["daemon_pid"]
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
        }
        Err(_) => None,
    };
    pid.filter(|&p| process_alive(p))
}

/// Whether a failed request on a FUSE mount says its daemon is gone: ENOTCONN, or
/// ECONNABORTED / ECANCELED, which requests in flight get while the kernel aborts the
/// connection (the watchdog's abort, see `watchdog.rs`, or the daemon's exit).
pub(crate) fn endpoint_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN) | Some(libc::ECANCELED) | Some(libc::ECONNABORTED)
    )
}

/// The FUSE endpoint of a checkpointfs mount at `path` is dead (`endpoint_gone`: the daemon was
/// killed or crashed). Nothing can be flushed any more; detach the mount so that MNT is
/// usable again, and exit 3.
fn detach_dead_mount(mnt: &Path, path: &Path) -> UmountOutcome {
    let shown = mnt.display();
    let detached = match umount_syscall(path, true) {
        Ok(()) => Ok(()),
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(path, true) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = detached {
        eprintln!(
            "checkpointfs: the daemon serving {shown} is gone, and the dead mount cannot be \
             detached: {}",
            error_text(&e)
        );
        return UmountOutcome::Failed;
    }
    let state = recorded_state_dir(path)
        .map_or_else(|| "its state dir".to_string(), |s| s.display().to_string());
    eprintln!(
        "checkpointfs: the daemon serving {shown} was gone (killed or crashed); detached the \
         dead mount. Nothing was flushed now: the next mount of {state} recovers the history \
         from its journal"
    );
    UmountOutcome::Gone
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_is_gone_on_the_errnos_a_dead_fuse_mount_gives() {
        let gone = |code| endpoint_gone(&io::Error::from_raw_os_error(code));
        assert!(gone(libc::ENOTCONN) && gone(libc::ECANCELED) && gone(libc::ECONNABORTED));
        assert!(!gone(libc::ENOENT) && !gone(libc::EIO) && !gone(libc::EACCES));
        assert!(!endpoint_gone(&io::Error::other("no errno")));
    }
}
