//! The state dir's lock, `STATE/lock`: one process at a time may change a state dir.
//!
//! The daemon takes it when it starts serving and holds it until it exits (the kernel drops
//! it when the process dies, even by `kill -9`); `checkpointfs gc --state-dir` takes it while
//! it compacts an unmounted state dir, so a mount cannot start in the middle of a gc, and a
//! gc cannot start under a running daemon. Readers (`log`, `diff`, `status --state-dir`)
//! change nothing and do not take it.
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The lock file's name in the state dir.
pub const LOCK_FILE: &str = "lock";

/// Holds `STATE/lock` (an exclusive `flock`: std's `File::try_lock` is flock(2) on Linux, so
/// flock(1) and older binaries see the same lock) until dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Takes the lock without waiting; fails with `WouldBlock` and a message naming the
    /// state dir if another process holds it.
    pub fn acquire(state_dir: &Path) -> io::Result<StateLock> {
        let path = state_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| crate::sys::context(format!("cannot open {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => Ok(StateLock { _file: file }),
            Err(TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "the state dir {} is in use by another checkpointfs process (a running \
                     mount, or a gc of it)",
                    state_dir.display()
                ),
            )),
            Err(TryLockError::Error(e)) => Err(crate::sys::context(
                format!("cannot lock {}", path.display()),
                e,
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(dir.path()).unwrap();
        let err = StateLock::acquire(dir.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(
            err.to_string()
                .contains("in use by another checkpointfs process"),
            "{err}"
        );
        drop(first);
        StateLock::acquire(dir.path()).unwrap();
    }
}
