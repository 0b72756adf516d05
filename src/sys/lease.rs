//! Read leases: knowing that nobody has a file open for writing, and holding it so.
use std::io;
use std::os::fd::AsRawFd;

use super::{cvt, reopen_for_reading};

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
