//! What the daemon does on a `/dev/fuse` fd besides reading requests and writing replies:
//! cloning it for more reader threads (FUSE_DEV_IOC_CLONE), registering backing files for
//! kernel passthrough (FUSE_DEV_IOC_BACKING_OPEN/CLOSE) and sending notifications
//! (FUSE_NOTIFY_INVAL_ENTRY/INODE). These stay on `/dev/fuse` whatever the request
//! transport: the kernel takes neither ioctls nor notifications (unique 0) over a ring.
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Weak};

use zerocopy::IntoBytes;

use super::abi;

const FUSE_DEV_IOC_MAGIC: u32 = 229;

/// `_IOC(dir, 229, nr, size)` as `<asm-generic/ioctl.h>` builds it.
const fn ioc(dir: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u32) << 16) | (FUSE_DEV_IOC_MAGIC << 8) | nr) as libc::c_ulong
}
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;
/// `_IOR(229, 0, uint32_t)`: makes the fd it is issued on a clone of the given session fd.
const FUSE_DEV_IOC_CLONE: libc::c_ulong = ioc(IOC_READ, 0, size_of::<u32>());
/// `_IOW(229, 1, struct fuse_backing_map)`: returns the new backing id.
const FUSE_DEV_IOC_BACKING_OPEN: libc::c_ulong =
    ioc(IOC_WRITE, 1, size_of::<abi::fuse_backing_map>());
/// `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = ioc(IOC_WRITE, 2, size_of::<u32>());

/// A new `/dev/fuse` fd reading the same connection as `dev`: the kernel hands each request
/// to one reader, so every reader thread gets its own fd and none contends on another's.
pub fn clone_fd(dev: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let clone = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| crate::sys::context("cannot open /dev/fuse for a reader thread", e))?;
    let mut source = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the source fd) through the pointer, which
    // points to a live u32; `clone` is an open /dev/fuse fd.
    let rc = unsafe { libc::ioctl(clone.as_raw_fd(), FUSE_DEV_IOC_CLONE, &mut source) };
    if rc != 0 {
        return Err(crate::sys::context(
            "FUSE_DEV_IOC_CLONE failed",
            io::Error::last_os_error(),
        ));
    }
    Ok(OwnedFd::from(clone))
}

/// A file registered as a passthrough backing file; dropping it unregisters it, unless the
/// connection (the session's `/dev/fuse` fd) is gone already, which released every id.
pub struct BackingId {
    dev: Weak<OwnedFd>,
    id: u32,
}

impl BackingId {
    /// FUSE_DEV_IOC_BACKING_OPEN of `file` on the session's fd (needs CAP_SYS_ADMIN and a
    /// connection that negotiated FUSE_PASSTHROUGH).
    pub fn open(dev: &Arc<OwnedFd>, file: BorrowedFd<'_>) -> io::Result<BackingId> {
        let map = abi::fuse_backing_map {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads one fuse_backing_map through the pointer, which points
        // to a live one; `dev` is an open /dev/fuse fd.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_OPEN, &map) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(BackingId {
            dev: Arc::downgrade(dev),
            id: rc as u32,
        })
    }
}

impl crate::fs::BackingFile for BackingId {
    fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for BackingId {
    fn drop(&mut self) {
        let Some(dev) = self.dev.upgrade() else {
            return;
        };
        // SAFETY: the ioctl reads one u32 through the pointer, which points to a live one;
        // `dev` is an open /dev/fuse fd.
        let rc = unsafe { libc::ioctl(dev.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, &self.id) };
        if rc != 0 {
            log::debug!(
                "FUSE_DEV_IOC_BACKING_CLOSE of backing id {}: {}",
                self.id,
                io::Error::last_os_error()
            );
        }
    }
}

/// Sends notifications on the session's `/dev/fuse` fd (unique 0, the notify code in the
/// error field), as fs/fuse/dev.c's `fuse_notify` reads them.
pub struct Notifier {
    dev: Arc<OwnedFd>,
}

impl Notifier {
    pub fn new(dev: Arc<OwnedFd>) -> Notifier {
        Notifier { dev }
    }

    /// One notification: header, fixed struct, then `tail` (a name and its NUL), in one
    /// writev (the kernel takes a message only whole).
    fn send(&self, code: i32, fixed: &[u8], tail: &[&[u8]]) -> io::Result<()> {
        let len = size_of::<abi::fuse_out_header>()
            + fixed.len()
            + tail.iter().map(|t| t.len()).sum::<usize>();
        let header = abi::fuse_out_header {
            len: u32::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?,
            error: code,
            unique: 0,
        };
        let mut iov = vec![io::IoSlice::new(header.as_bytes()), io::IoSlice::new(fixed)];
        iov.extend(tail.iter().map(|t| io::IoSlice::new(t)));
        // SAFETY: the iovecs point to live buffers for the duration of the call
        // (`IoSlice` is ABI-compatible with `struct iovec`).
        let n = unsafe {
            libc::writev(
                self.dev.as_raw_fd(),
                iov.as_ptr().cast(),
                iov.len() as libc::c_int,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl crate::fs::KernelNotifier for Notifier {
    fn inval_entry(&self, parent: u64, name: &OsStr) -> io::Result<()> {
        let name = name.as_bytes();
        let out = abi::fuse_notify_inval_entry_out {
            parent,
            namelen: u32::try_from(name.len())
                .map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?,
            flags: 0,
        };
        self.send(abi::FUSE_NOTIFY_INVAL_ENTRY, out.as_bytes(), &[name, b"\0"])
    }

    fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()> {
        let out = abi::fuse_notify_inval_inode_out {
            ino,
            off: offset,
            len,
        };
        self.send(abi::FUSE_NOTIFY_INVAL_INODE, out.as_bytes(), &[])
    }
}
