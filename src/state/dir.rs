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
use std::os::unix::ffi::OsStrExt;
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
    crate::state::reserve::GC_RESERVE_FILE,
    crate::state::format::FORMAT_FILE,
];

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// Writes `contents` to `dir/name` with mode 0600 (rule 2), atomically and durably: see
/// [`crate::state::atomic`] for what survives a crash at each step.
pub fn write_file(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    crate::state::atomic::write(dir, name, contents, FILE_MODE)
}

/// The directory of a state dir where the agents' prompt hooks keep their per-session
/// counters (`crate::mount::hook`).
pub const HOOKS_DIR: &str = "hooks";

/// `STATE/hooks`, created (mode 0700, rule 2) if missing. Fails when `state_dir` is not a
/// directory or cannot be written (a hook run by another user than the daemon's).
pub fn hooks_dir(state_dir: &Path) -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    if !state_dir.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
    }
    let dir = state_dir.join(HOOKS_DIR);
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .or_else(|e| if dir.is_dir() { Ok(()) } else { Err(e) })
            .map_err(|e| crate::sys::context(format!("cannot create {}", dir.display()), e))?;
    }
    Ok(dir)
}

/// The mode of every file the daemon keeps in a state dir (rule 2).
pub const FILE_MODE: u32 = 0o600;

/// The names of the temp files older versions left when killed mid-write: `.NAME.tmp` of the
/// files they replaced whole, and the transcript's `.transcript.jsonl.rewrite-PID-NANOS-N`.
fn is_older_temp_name(name: &[u8]) -> bool {
    const REPLACED: &[&str] = &[
        "source",
        "settings.json",
        SIGNING_ID_FILE,
        "daemon.pid",
        "mountpoint",
    ];
    if let Some(numbers) = name.strip_prefix(b".transcript.jsonl.rewrite-") {
        let parts: Vec<&[u8]> = numbers.split(|&b| b == b'-').collect();
        return parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.iter().all(u8::is_ascii_digit));
    }
    REPLACED.iter().any(|f| {
        name.strip_prefix(b".")
            .and_then(|n| n.strip_suffix(b".tmp"))
            == Some(f.as_bytes())
    })
}

/// Removes from `state_dir` the temp files of writes that were killed before their rename
/// ([`crate::state::atomic`]'s `.NAME.tmp-PID-RANDOM`, and the names older versions used),
/// with a warning for each. Only a regular file of this user with such a name is removed:
/// nothing is followed, and a symlink or directory of that name stays. A state dir that is
/// not this user's alone (rule 1, checked on the open directory) is left as it is: `secure`
/// refuses it.
///
/// Call it only while holding the state lock ([`crate::state::lock`]), when the state dir is
/// opened for changes (the daemon's open of the history, `gc --state-dir`): the state dir's
/// writers hold that lock, so no temp file is then in use. (The one write before the lock is
/// a starting daemon's `daemon.pid` and `mountpoint`; a second daemon that writes them while
/// this one opens may fail its write, and then fails at the lock anyway.)
pub fn remove_leftover_temps(state_dir: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::fs::OpenOptionsExt;

    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(state_dir)
        .map_err(|e| with_path(state_dir, "opening", e))?;
    let me = euid();
    let meta = dir
        .metadata()
        .map_err(|e| with_path(state_dir, "stat", e))?;
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Ok(());
    }
    let mut names = Vec::new();
    let mut stream = crate::sys::DirStream::open(dir.as_fd(), false)
        .map_err(|e| with_path(state_dir, "reading", e))?;
    while let Some(entry) = stream
        .next_entry()
        .map_err(|e| with_path(state_dir, "reading", e))?
    {
        if crate::state::atomic::is_temp_name(entry.name) || is_older_temp_name(entry.name) {
            names.push(CString::new(entry.name).map_err(io::Error::other)?);
        }
    }
    drop(stream);
    for name in names {
        let path = state_dir.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
        let st = match crate::sys::fstatat(dir.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(with_path(&path, "stat", e)),
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != me {
            continue;
        }
        warn!(
            "removing {}, left by a write that did not finish (a process killed mid-write)",
            path.display()
        );
        // SAFETY: a valid directory fd and a NUL-terminated name; unlinkat never follows.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(with_path(&path, "removing", e));
            }
        }
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    crate::sys::context(format!("{what} {}", path.display()), e)
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

    #[test]
    fn leftover_temp_files_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let outside = tempfile::tempdir().unwrap();
        let precious = outside.path().join("precious");
        fs::write(&precious, b"not ours to remove").unwrap();
        let leftovers = [
            ".settings.json.tmp-4242-0123456789abcdef",
            ".transcript.jsonl.tmp-1-fedcba9876543210",
            ".source.tmp",
            ".signing-id.tmp",
            ".transcript.jsonl.rewrite-4242-1-0",
        ];
        for name in leftovers {
            fs::write(d.join(name), b"half").unwrap();
        }
        let kept_files = [
            "settings.json",
            "transcript.jsonl",
            ".notes.tmp",
            "settings.json.tmp-4242-0123456789abcdef",
            ".settings.json.tmp-4242-0123456789ABCDEF",
            ".settings.json.tmp-4242-0123456789abcdef.mine",
            ".transcript.jsonl.rewrite-x",
        ];
        for name in kept_files {
            fs::write(d.join(name), b"keep").unwrap();
        }
        // A temp file's name on a symlink or a directory: neither followed nor removed.
        let link = d.join(".daemon.pid.tmp-7-0123456789abcdef");
        std::os::unix::fs::symlink(&precious, &link).unwrap();
        let subdir = d.join(".mountpoint.tmp-7-0123456789abcdef");
        fs::create_dir(&subdir).unwrap();
        fs::write(subdir.join("inside"), b"keep").unwrap();

        remove_leftover_temps(d).unwrap();
        let mut left: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want: Vec<String> = kept_files.iter().map(|s| s.to_string()).collect();
        want.push(".daemon.pid.tmp-7-0123456789abcdef".into());
        want.push(".mountpoint.tmp-7-0123456789abcdef".into());
        want.sort();
        assert_eq!(left, want);
        assert_eq!(fs::read(&precious).unwrap(), b"not ours to remove");
        assert!(subdir.join("inside").exists());
    }

    #[test]
    fn a_state_dir_others_can_write_keeps_its_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join(".source.tmp-1-0123456789abcdef");
        fs::write(&temp, b"half").unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        remove_leftover_temps(dir.path()).unwrap();
        assert!(
            temp.exists(),
            "not trusted: secure() refuses it, nothing is removed"
        );
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        remove_leftover_temps(dir.path()).unwrap();
        assert!(!temp.exists());
    }
}
