//! Who may write a state dir.
//!
//! The transcript, the journal and the store are what a rewind trusts: whoever can write
//! them can make the next rewind (often run as root) put any content, mode — setuid
//! included — or owner on any path of the tree. So:
//!
//! 1. The state dir belongs to the user the daemon runs as and is writable by nobody else
//!    (no group or other write bit): otherwise another user could replace any file in it.
//!    A state dir that breaks this is refused, with the `chmod`/`chown` that fixes it.
//! 2. Every file the daemon keeps there is created with mode 0600 (directories 0700),
//!    whatever the umask: the daemon runs with umask 0, because the kernel has already
//!    applied the caller's umask to the modes it sends.
//! 3. Files left group- or world-accessible by checkpointfs before this rule (they were
//!    0666) are made 0600 at mount, with a warning. A state file that is a symlink, or that
//!    belongs to another user, is refused: checkpointfs never made one.
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use log::warn;

/// The state dir's id, which the MACs of its set-id entries bind (`crate::transcript::mac`).
pub const SIGNING_ID_FILE: &str = "signing-id";

/// The files and directories the daemon keeps in a state dir (relative paths).
const STATE_ENTRIES: &[&str] = &[
    "transcript.jsonl",
    "source",
    "settings.json",
    SIGNING_ID_FILE,
    "daemon.log",
    "daemon.pid",
    "mountpoint",
    "lock",
    "backups",
    "backups/journal.jsonl",
];

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// Writes `contents` to `dir/name` (mode 0600, rule 2) through a temporary file, fsync and
/// rename, so that a reader sees the old content or the new, never a part.
pub fn write_file(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, dir.join(name))
}

/// Checks rule 1 for `state_dir` and rule 3 for what is in it (see the module docs),
/// repairing modes where rule 3 allows. `state_dir` must exist.
pub fn secure(state_dir: &Path) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let dir = fs::metadata(state_dir)?;
    let shown = state_dir.display();
    if !dir.is_dir() {
        return Err(refused(format!("state dir {shown} is not a directory")));
    }
    if dir.uid() != me {
        return Err(refused(format!(
            "state dir {shown} belongs to uid {}, not to uid {me} that mounts: another user \
             could change the history a rewind trusts (chown {me} {shown}, or use another \
             --state-dir)",
            dir.uid()
        )));
    }
    if dir.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "state dir {shown} is writable by group or others (mode {:o}): they could change \
             the history a rewind trusts (chmod go-w {shown}, or use another --state-dir)",
            dir.mode() & 0o7777
        )));
    }
    for rel in STATE_ENTRIES {
        let path = state_dir.join(rel);
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let shown = path.display();
        if meta.file_type().is_symlink() {
            return Err(refused(format!(
                "{shown} is a symlink; checkpointfs never makes one there (remove it, or use \
                 another --state-dir)"
            )));
        }
        if meta.uid() != me {
            return Err(refused(format!(
                "{shown} belongs to uid {}, not to uid {me} that mounts (remove it, or use \
                 another --state-dir)",
                meta.uid()
            )));
        }
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            warn!(
                "{shown} had mode {mode:o} (left by an older checkpointfs): made {want:o}, so \
                 that only its owner can read or change the history"
            );
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & want))?;
        }
    }
    Ok(())
}

/// Makes `dir` 0711: others may reach the control socket in it (the `--owner` user) but
/// neither list nor change anything; every file in it stays 0600 root's.
pub fn let_others_reach_the_socket(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_group_or_world_writable_state_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in [0o777, 0o775, 0o757] {
            fs::set_permissions(dir.path(), fs::Permissions::from_mode(bad)).unwrap();
            let e = secure(dir.path()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("chmod go-w"), "{e}");
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        secure(dir.path()).unwrap();
    }

    #[test]
    fn files_left_world_writable_are_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let transcript = dir.path().join("transcript.jsonl");
        let backups = dir.path().join("backups");
        fs::write(&transcript, b"").unwrap();
        fs::create_dir(&backups).unwrap();
        fs::write(backups.join("journal.jsonl"), b"").unwrap();
        fs::set_permissions(&transcript, fs::Permissions::from_mode(0o666)).unwrap();
        fs::set_permissions(&backups, fs::Permissions::from_mode(0o777)).unwrap();
        fs::set_permissions(
            backups.join("journal.jsonl"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        secure(dir.path()).unwrap();
        assert_eq!(mode(&transcript), 0o600);
        assert_eq!(mode(&backups), 0o700);
        assert_eq!(mode(&backups.join("journal.jsonl")), 0o600);
    }

    #[test]
    fn a_symlinked_state_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("transcript.jsonl")).unwrap();
        let e = secure(dir.path()).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
    }
}
