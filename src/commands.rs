//! The history subcommands: `checkpoint`, `rewind`, `log`, `diff`, `status`.
//!
//! Each returns the process exit status (0 success, 1 runtime failure, 2 usage error or
//! refusal) and prints its own one-line errors. Only `checkpoint` is implemented in the cli
//! branch; the others are stubs for the core author to replace.
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::{IntoRawFd, RawFd};
use std::path::{Path, PathBuf};

use crate::cli::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::ids::validate_id;

/// Where a read-only history command finds its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A live mount point: its state dir is in `MNT/.checkpoint/state-dir`.
    Mount(PathBuf),
    /// A state dir, read directly (the mount need not be live).
    StateDir(PathBuf),
}

/// The control file inside a mount; writing `ID\n` creates checkpoint ID.
pub const CTL_FILE: &str = ".checkpoint/ctl";

fn close_checked(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` came from `into_raw_fd` and is closed exactly once, here.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `checkpointfs checkpoint MNT ID`: writes `ID\n` to `MNT/.checkpoint/ctl` in one write.
pub fn checkpoint(mnt: &Path, id: &str) -> i32 {
    let shown = mnt.display();
    let quoted = id.escape_debug();
    if let Err(e) = validate_id(id.as_bytes()) {
        eprintln!("checkpointfs: invalid checkpoint id '{quoted}': {e}");
        return EXIT_USAGE;
    }
    let errno = |e: &io::Error| e.raw_os_error().unwrap_or(0);
    let gone = || {
        eprintln!(
            "checkpointfs: the daemon serving {shown} is gone (transport endpoint is not \
             connected); clean up with: umount -l {shown}"
        );
        EXIT_FAILURE
    };
    let file = match OpenOptions::new().write(true).open(mnt.join(CTL_FILE)) {
        Ok(f) => f,
        Err(e) if matches!(errno(&e), libc::ENOENT | libc::ENOTDIR) => {
            eprintln!("checkpointfs: {shown} is not a checkpointfs mount");
            return EXIT_USAGE;
        }
        Err(e) if errno(&e) == libc::ENOTCONN => return gone(),
        Err(e) => {
            eprintln!("checkpointfs: cannot open {shown}/{CTL_FILE}: {e}");
            return EXIT_FAILURE;
        }
    };
    let line = format!("{id}\n");
    let mut file = file;
    let written = file.write(line.as_bytes());
    // Close explicitly: FUSE reports flush errors from close(2).
    let closed = close_checked(file.into_raw_fd());
    match written.and_then(|n| closed.map(|()| n)) {
        Ok(n) if n == line.len() => {
            println!("checkpoint {id}");
            EXIT_OK
        }
        Ok(n) => {
            eprintln!(
                "checkpointfs: cannot create checkpoint '{quoted}': short write to {shown}/{CTL_FILE} \
                 ({n} of {} bytes)",
                line.len()
            );
            EXIT_FAILURE
        }
        Err(e) if errno(&e) == libc::EINVAL => {
            eprintln!(
                "checkpointfs: invalid checkpoint id '{quoted}': refused by the filesystem (EINVAL)"
            );
            EXIT_USAGE
        }
        Err(e) if errno(&e) == libc::EEXIST => {
            eprintln!(
                "checkpointfs: a checkpoint named '{quoted}' already exists (see: checkpointfs log \
                 {shown})"
            );
            EXIT_FAILURE
        }
        Err(e) if errno(&e) == libc::ENOTCONN => gone(),
        Err(e) => {
            eprintln!("checkpointfs: cannot create checkpoint '{quoted}': {e}");
            EXIT_FAILURE
        }
    }
}

fn not_implemented(cmd: &str) -> i32 {
    eprintln!("checkpointfs: {cmd} is not implemented in this build");
    EXIT_FAILURE
}

/// `checkpointfs rewind MNT ID [--dry-run] [-- PATH...]`.
pub fn rewind(mnt: &Path, id: &str, dry_run: bool, paths: &[PathBuf]) -> i32 {
    let _ = (mnt, id, dry_run, paths);
    not_implemented("rewind")
}

/// `checkpointfs log MNT | --state-dir DIR`.
pub fn log(target: &Target) -> i32 {
    let _ = target;
    not_implemented("log")
}

/// `checkpointfs diff MNT M [N] | --state-dir DIR M [N]`; `to == None`: the current tree.
pub fn diff(target: &Target, from: &str, to: Option<&str>) -> i32 {
    let _ = (target, from, to);
    not_implemented("diff")
}

/// `checkpointfs status MNT | --state-dir DIR [--path P]`.
pub fn status(target: &Target, path: Option<&Path>) -> i32 {
    let _ = (target, path);
    not_implemented("status")
}
