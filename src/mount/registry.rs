//! Where a mount leaves word of itself: the state dir's pid and mount-point files, and the
//! per-user record of mounts (`$XDG_RUNTIME_DIR/checkpointfs`, or `/run/checkpointfs` for
//! root; cleared at reboot) that lets `umount` tell "already unmounted" from "never mounted".
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// File in the state dir holding the daemon's pid (decimal + "\n"); removed on clean exit.
pub const PID_FILE: &str = "daemon.pid";

/// File in the state dir holding the absolute mount point + "\n".
pub const MOUNTPOINT_FILE: &str = "mountpoint";

/// The detached daemon's stdout/stderr (appended to).
pub const LOG_FILE: &str = "daemon.log";

/// Virtual file inside a live mount: the absolute state dir + "\n".
pub const STATE_DIR_FILE: &str = ".checkpoint/state-dir";

/// Reads a pid file ("PID\n"); `None` if missing or malformed.
pub fn read_pid_file(path: &Path) -> Option<i32> {
    parse_pid_file(&fs::read_to_string(path).ok()?)
}

/// A pid file's content ("PID\n"); `None` if malformed.
pub fn parse_pid_file(text: &str) -> Option<i32> {
    text.trim().parse::<i32>().ok().filter(|&p| p > 0)
}

/// Whether `pid` is a running (not zombie) process. Zombies count as gone: where PID 1
/// does not reap orphans, an exited daemon can stay a zombie indefinitely.
pub fn process_alive(pid: i32) -> bool {
    match fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            match stat.iter().rposition(|&b| b == b')') {
                Some(i) => !matches!(stat.get(i + 2), Some(b'Z') | Some(b'X') | None),
                None => true,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        // No usable /proc: fall back to signal 0.
        // SAFETY: kill(2) with signal 0 sends nothing; __errno_location returns this thread's
        // errno slot, valid for the thread's lifetime.
        Err(_) => unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM },
    }
}

/// Whether `pid` is alive and runs under the same command name as this process.
pub(crate) fn is_checkpointfs_process(pid: i32) -> bool {
    if !process_alive(pid) {
        return false;
    }
    let comm = |p: &str| fs::read(format!("/proc/{p}/comm")).ok();
    match (comm(&pid.to_string()), comm("self")) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => true, // cannot tell: assume it is, refusing is the safe side
    }
}

/// Records this process as the daemon of `state_dir` mounted at `mountpoint`: the pid and
/// mount-point files, and the registry entry.
pub(crate) fn write_pid_and_mountpoint(state_dir: &Path, mountpoint: &Path) -> io::Result<()> {
    let pid = std::process::id();
    crate::state::dir::write_file(state_dir, PID_FILE, format!("{pid}\n").as_bytes())?;
    let mut mp = mountpoint.as_os_str().as_bytes().to_vec();
    mp.push(b'\n');
    crate::state::dir::write_file(state_dir, MOUNTPOINT_FILE, &mp)?;
    // Only `umount`'s exit status for an already unmounted MNT depends on it.
    if let Err(e) = record_mount(mountpoint, state_dir) {
        log::warn!("cannot record the mount in the mount registry: {e}");
    }
    Ok(())
}

/// The record of mounts: one symlink per mount point, named by a hash of its path and
/// pointing at its state dir, so that `umount` can tell a former checkpointfs mount point
/// (exit 3) from any other directory (exit 2). On a tmpfs ($XDG_RUNTIME_DIR, or /run for
/// root), so it forgets at reboot; `None` when there is neither.
pub(crate) fn mount_registry() -> Option<PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => {
            Some(PathBuf::from(d).join("checkpointfs/mounts"))
        }
        // SAFETY: geteuid(2) cannot fail.
        _ if unsafe { libc::geteuid() } == 0 => Some(PathBuf::from("/run/checkpointfs/mounts")),
        _ => None,
    }
}

pub(crate) fn registry_entry(mountpoint: &Path) -> Option<PathBuf> {
    let digest = Sha256::digest(mountpoint.as_os_str().as_bytes());
    Some(mount_registry()?.join(base16ct::lower::encode_string(&digest[..16])))
}

pub(crate) fn record_mount(mountpoint: &Path, state_dir: &Path) -> io::Result<()> {
    let Some(entry) = registry_entry(mountpoint) else {
        return Ok(());
    };
    let dir = entry.parent().unwrap_or(Path::new("/"));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // Replace any older record atomically: a new symlink renamed over it.
    let tmp = dir.join(format!(".tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(state_dir, &tmp)?;
    fs::rename(&tmp, &entry)?;
    // Records whose state dir was removed can never answer anything: drop them, so that the
    // registry stays as small as the set of state dirs that exist.
    for e in fs::read_dir(dir)?.flatten() {
        if fs::metadata(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::NotFound) {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// The state dir recorded for `mountpoint`, if its `mountpoint` file still names it (a
/// later mount of that state dir elsewhere makes the record stale).
pub(crate) fn recorded_state_dir(mountpoint: &Path) -> Option<PathBuf> {
    let state = fs::read_link(registry_entry(mountpoint)?).ok()?;
    let recorded = fs::read(state.join(MOUNTPOINT_FILE)).ok()?;
    (recorded.strip_suffix(b"\n") == Some(mountpoint.as_os_str().as_bytes())).then_some(state)
}

/// Removes STATE/daemon.pid if it still names this process.
pub(crate) fn remove_pid_file(state_dir: &Path) {
    let path = state_dir.join(PID_FILE);
    if read_pid_file(&path) == Some(std::process::id() as i32)
        && let Err(e) = fs::remove_file(&path)
    {
        log::warn!("cannot remove {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn process_liveness() {
        assert!(process_alive(std::process::id() as i32));
        assert!(!process_alive(2147483646));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Wait until it is a zombie, then check it counts as gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_alive(pid), "a zombie counts as exited");
        child.wait().unwrap();
    }
}
