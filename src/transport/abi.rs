//! The FUSE wire format (include/uapi/linux/fuse.h, protocol 7.45) as plain `repr(C)` structs.
//!
//! fuser 0.18 keeps its copies of these structs crate-private (`ll::fuse_abi`) and exports
//! only the flag sets (`InitFlags`, `FopenFlags`, ...) and a few constants, so the decoder
//! and encoder of `crate::transport` read and write their own. Every struct here is a
//! fixed-size, padding-free record (the kernel's explicit `padding`/`dummy` fields included):
//! [`zerocopy`] reads them from any byte slice, aligned or not, with no `unsafe` here, and
//! the `const` assertions below pin each size to the kernel's.
//!
//! Also here: the FUSE-over-io_uring records (`fuse_uring_*`, Linux 6.14+) and the opcode
//! numbers, which fuser does not export either.
#![allow(
    non_camel_case_types,
    reason = "the kernel's names, so each struct can be found in fuse.h"
)]
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol major version this code speaks.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// The minor version we announce in the INIT reply (the kernel uses the smaller of its own
/// and ours).
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;
/// The oldest minor version the decoder accepts: 7.23 (Linux 3.15) is where `fuse_init_out`
/// took its current length and every request struct below has its current size (the
/// `FUSE_COMPAT_*` sizes of older kernels are not decoded).
pub const MIN_KERNEL_MINOR_VERSION: u32 = 23;
/// Bit 0 of `unique` marks an INTERRUPT's own id (`FUSE_INT_REQ_BIT`, fs/fuse/fuse_dev_i.h);
/// ordinary ids step by 2.
pub const FUSE_INT_REQ_BIT: u64 = 1 << 0;
/// The smallest read buffer the kernel accepts for /dev/fuse.
pub const FUSE_MIN_READ_BUFFER: usize = 8192;

/// Opcodes (`enum fuse_opcode`).
pub mod opcode {
    pub const FUSE_LOOKUP: u32 = 1;
    pub const FUSE_FORGET: u32 = 2;
    pub const FUSE_GETATTR: u32 = 3;
    pub const FUSE_SETATTR: u32 = 4;
    pub const FUSE_READLINK: u32 = 5;
    pub const FUSE_SYMLINK: u32 = 6;
    pub const FUSE_MKNOD: u32 = 8;
    pub const FUSE_MKDIR: u32 = 9;
    pub const FUSE_UNLINK: u32 = 10;
    pub const FUSE_RMDIR: u32 = 11;
    pub const FUSE_RENAME: u32 = 12;
    pub const FUSE_LINK: u32 = 13;
    pub const FUSE_OPEN: u32 = 14;
    pub const FUSE_READ: u32 = 15;
    pub const FUSE_WRITE: u32 = 16;
    pub const FUSE_STATFS: u32 = 17;
    pub const FUSE_RELEASE: u32 = 18;
    pub const FUSE_FSYNC: u32 = 20;
    pub const FUSE_SETXATTR: u32 = 21;
    pub const FUSE_GETXATTR: u32 = 22;
    pub const FUSE_LISTXATTR: u32 = 23;
    pub const FUSE_REMOVEXATTR: u32 = 24;
    pub const FUSE_FLUSH: u32 = 25;
    pub const FUSE_INIT: u32 = 26;
    pub const FUSE_OPENDIR: u32 = 27;
    pub const FUSE_READDIR: u32 = 28;
    pub const FUSE_RELEASEDIR: u32 = 29;
    pub const FUSE_FSYNCDIR: u32 = 30;
    pub const FUSE_GETLK: u32 = 31;
    pub const FUSE_SETLK: u32 = 32;
    pub const FUSE_SETLKW: u32 = 33;
    pub const FUSE_ACCESS: u32 = 34;
    pub const FUSE_CREATE: u32 = 35;
    pub const FUSE_INTERRUPT: u32 = 36;
    pub const FUSE_BMAP: u32 = 37;
    pub const FUSE_DESTROY: u32 = 38;
    pub const FUSE_IOCTL: u32 = 39;
    pub const FUSE_POLL: u32 = 40;
    pub const FUSE_NOTIFY_REPLY: u32 = 41;
    pub const FUSE_BATCH_FORGET: u32 = 42;
    pub const FUSE_FALLOCATE: u32 = 43;
    pub const FUSE_READDIRPLUS: u32 = 44;
    pub const FUSE_RENAME2: u32 = 45;
    pub const FUSE_LSEEK: u32 = 46;
    pub const FUSE_COPY_FILE_RANGE: u32 = 47;
    pub const FUSE_SETUPMAPPING: u32 = 48;
    pub const FUSE_REMOVEMAPPING: u32 = 49;
    pub const FUSE_SYNCFS: u32 = 50;
    pub const FUSE_TMPFILE: u32 = 51;
    pub const FUSE_STATX: u32 = 52;

    /// The opcode's name without `FUSE_` (`LOOKUP`), for counters and logs.
    pub fn name(op: u32) -> Option<&'static str> {
        Some(match op {
            FUSE_LOOKUP => "LOOKUP",
            FUSE_FORGET => "FORGET",
            FUSE_GETATTR => "GETATTR",
            FUSE_SETATTR => "SETATTR",
            FUSE_READLINK => "READLINK",
            FUSE_SYMLINK => "SYMLINK",
            FUSE_MKNOD => "MKNOD",
            FUSE_MKDIR => "MKDIR",
            FUSE_UNLINK => "UNLINK",
            FUSE_RMDIR => "RMDIR",
            FUSE_RENAME => "RENAME",
            FUSE_LINK => "LINK",
            FUSE_OPEN => "OPEN",
            FUSE_READ => "READ",
            FUSE_WRITE => "WRITE",
            FUSE_STATFS => "STATFS",
            FUSE_RELEASE => "RELEASE",
            FUSE_FSYNC => "FSYNC",
            FUSE_SETXATTR => "SETXATTR",
            FUSE_GETXATTR => "GETXATTR",
            FUSE_LISTXATTR => "LISTXATTR",
            FUSE_REMOVEXATTR => "REMOVEXATTR",
            FUSE_FLUSH => "FLUSH",
            FUSE_INIT => "INIT",
            FUSE_OPENDIR => "OPENDIR",
            FUSE_READDIR => "READDIR",
            FUSE_RELEASEDIR => "RELEASEDIR",
            FUSE_FSYNCDIR => "FSYNCDIR",
            FUSE_GETLK => "GETLK",
            FUSE_SETLK => "SETLK",
            FUSE_SETLKW => "SETLKW",
            FUSE_ACCESS => "ACCESS",
            FUSE_CREATE => "CREATE",
            FUSE_INTERRUPT => "INTERRUPT",
            FUSE_BMAP => "BMAP",
            FUSE_DESTROY => "DESTROY",
            FUSE_IOCTL => "IOCTL",
            FUSE_POLL => "POLL",
            FUSE_NOTIFY_REPLY => "NOTIFY_REPLY",
            FUSE_BATCH_FORGET => "BATCH_FORGET",
            FUSE_FALLOCATE => "FALLOCATE",
            FUSE_READDIRPLUS => "READDIRPLUS",
            FUSE_RENAME2 => "RENAME2",
            FUSE_LSEEK => "LSEEK",
            FUSE_COPY_FILE_RANGE => "COPY_FILE_RANGE",
            FUSE_SETUPMAPPING => "SETUPMAPPING",
            FUSE_REMOVEMAPPING => "REMOVEMAPPING",
            FUSE_SYNCFS => "SYNCFS",
            FUSE_TMPFILE => "TMPFILE",
            FUSE_STATX => "STATX",
            _ => return None,
        })
    }
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const FUSE_GETATTR_FH: u32 = 1 << 0;
/// `fuse_read_in.read_flags` / `fuse_write_in.write_flags`: `lock_owner` is valid.
pub const FUSE_READ_LOCKOWNER: u32 = 1 << 1;
pub const FUSE_WRITE_LOCKOWNER: u32 = 1 << 1;
/// `fuse_release_in.release_flags`.
pub const FUSE_RELEASE_FLUSH: u32 = 1 << 0;
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// `fuse_fsync_in.fsync_flags`: fdatasync.
pub const FUSE_FSYNC_FDATASYNC: u32 = 1 << 0;
/// `fuse_open_out.open_flags`: `backing_id` names a backing file (kernel passthrough).
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;
/// INIT flag bit 30: `flags2` carries the upper 32 flag bits.
pub const FUSE_INIT_EXT: u64 = 1 << 30;
/// INIT flag bit 41: the server will serve requests over io_uring (fuser:
/// `InitFlags::FUSE_OVER_IO_URING`; repeated here for the ring code's own checks).
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;
/// INIT flag bit 29: `fuse_setxattr_in` is the 16-byte extended form.
pub const FUSE_SETXATTR_EXT: u64 = 1 << 29;
/// INIT flag bit 22: `max_pages` in the reply is valid.
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
/// Notification codes (`enum fuse_notify_code`), sent in `fuse_out_header.error`.
pub const FUSE_NOTIFY_INVAL_INODE: i32 = 2;
pub const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;

/// `FUSE_DEV_IOC_BACKING_OPEN`'s argument.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_backing_map {
    pub fd: i32,
    pub flags: u32,
    pub padding: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_notify_inval_inode_out {
    pub ino: u64,
    pub off: i64,
    pub len: i64,
}

/// Followed by the name and a NUL.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_notify_inval_entry_out {
    pub parent: u64,
    pub namelen: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_in_header {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the request extensions after the arguments, in 8-byte units.
    pub total_extlen: u16,
    pub padding: u16,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_out_header {
    pub len: u32,
    pub error: i32,
    pub unique: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_kstatfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
    pub padding: u32,
    pub spare: [u32; 6],
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_entry_out {
    pub nodeid: u64,
    pub generation: u64,
    pub entry_valid: u64,
    pub attr_valid: u64,
    pub entry_valid_nsec: u32,
    pub attr_valid_nsec: u32,
    pub attr: fuse_attr,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_forget_in {
    pub nlookup: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_forget_one {
    pub nodeid: u64,
    pub nlookup: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_batch_forget_in {
    pub count: u32,
    pub dummy: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_getattr_in {
    pub getattr_flags: u32,
    pub dummy: u32,
    pub fh: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_attr_out {
    pub attr_valid: u64,
    pub attr_valid_nsec: u32,
    pub dummy: u32,
    pub attr: fuse_attr,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_mknod_in {
    pub mode: u32,
    pub rdev: u32,
    pub umask: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_mkdir_in {
    pub mode: u32,
    pub umask: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_rename_in {
    pub newdir: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_rename2_in {
    pub newdir: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_link_in {
    pub oldnodeid: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_setattr_in {
    pub valid: u32,
    pub padding: u32,
    pub fh: u64,
    pub size: u64,
    pub lock_owner: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub unused4: u32,
    pub uid: u32,
    pub gid: u32,
    pub unused5: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_open_in {
    pub flags: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_create_in {
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
    pub open_flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_open_out {
    pub fh: u64,
    pub open_flags: u32,
    pub backing_id: i32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_release_in {
    pub fh: u64,
    pub flags: u32,
    pub release_flags: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_flush_in {
    pub fh: u64,
    pub unused: u32,
    pub padding: u32,
    pub lock_owner: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_read_in {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub read_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_write_in {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    pub write_flags: u32,
    pub lock_owner: u64,
    pub flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_write_out {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_statfs_out {
    pub st: fuse_kstatfs,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_fsync_in {
    pub fh: u64,
    pub fsync_flags: u32,
    pub padding: u32,
}

/// `fuse_setxattr_in` without `FUSE_SETXATTR_EXT` (`FUSE_COMPAT_SETXATTR_IN_SIZE`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_setxattr_in_compat {
    pub size: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_setxattr_in {
    pub size: u32,
    pub flags: u32,
    pub setxattr_flags: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_getxattr_in {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_getxattr_out {
    pub size: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_access_in {
    pub mask: u32,
    pub padding: u32,
}

/// The first 16 bytes of `fuse_init_in`: all that kernels before 7.36 send.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_init_in_compat {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_init_in {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub flags2: u32,
    pub unused: [u32; 11],
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_init_out {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u32,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    pub map_alignment: u16,
    pub flags2: u32,
    pub max_stack_depth: u32,
    pub request_timeout: u16,
    pub unused: [u16; 11],
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_interrupt_in {
    pub unique: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_ioctl_in {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_ioctl_out {
    pub result: i32,
    pub flags: u32,
    pub in_iovs: u32,
    pub out_iovs: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_poll_in {
    pub fh: u64,
    pub kh: u64,
    pub flags: u32,
    pub events: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_poll_out {
    pub revents: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_fallocate_in {
    pub fh: u64,
    pub offset: u64,
    pub length: u64,
    pub mode: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_lseek_in {
    pub fh: u64,
    pub offset: u64,
    pub whence: u32,
    pub padding: u32,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_lseek_out {
    pub offset: u64,
}

#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_copy_file_range_in {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

/// The fixed part of `fuse_dirent`; the name follows, then zeros to an 8-byte boundary.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_dirent {
    pub ino: u64,
    pub off: u64,
    pub namelen: u32,
    pub typ: u32,
}

/// The fixed part of `fuse_direntplus`; the name follows as for [`fuse_dirent`].
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_direntplus {
    pub entry_out: fuse_entry_out,
    pub dirent: fuse_dirent,
}

// ---- FUSE over io_uring (Linux 6.14+) ----

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for `fuse_in_header` (request) / `fuse_out_header`
/// (reply) at the start of [`fuse_uring_req_header`].
pub const FUSE_URING_IN_OUT_HEADER_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for the opcode's fixed argument struct.
pub const FUSE_URING_OP_IN_OUT_SZ: usize = 128;
/// `enum fuse_uring_cmd`: the `cmd_op` of an `IORING_OP_URING_CMD` on /dev/fuse.
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// The iovec count REGISTER needs in `sqe->len` (`FUSE_URING_IOV_SEGS`: header, payload).
pub const FUSE_URING_IOV_SEGS: u32 = 2;

/// `struct fuse_uring_ent_in_out`: per-request ring metadata (the kernel fills `commit_id`
/// and `payload_sz` with a request; the server sets `payload_sz` with its reply).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_uring_ent_in_out {
    pub flags: u64,
    pub commit_id: u64,
    pub payload_sz: u32,
    pub padding: u32,
    pub reserved: u64,
}

/// `struct fuse_uring_req_header`: the first of the two buffers of a ring entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct fuse_uring_req_header {
    pub in_out: [u8; FUSE_URING_IN_OUT_HEADER_SZ],
    pub op_in: [u8; FUSE_URING_OP_IN_OUT_SZ],
    pub ring_ent_in_out: fuse_uring_ent_in_out,
}

impl Default for fuse_uring_req_header {
    fn default() -> Self {
        fuse_uring_req_header {
            in_out: [0; FUSE_URING_IN_OUT_HEADER_SZ],
            op_in: [0; FUSE_URING_OP_IN_OUT_SZ],
            ring_ent_in_out: fuse_uring_ent_in_out::default(),
        }
    }
}

/// `struct fuse_uring_cmd_req`: the command area (`sqe->cmd`, 80 bytes in a 128-byte SQE)
/// of REGISTER and COMMIT_AND_FETCH.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct fuse_uring_cmd_req {
    pub flags: u64,
    /// The request being answered (COMMIT_AND_FETCH): its `ring_ent_in_out.commit_id`.
    pub commit_id: u64,
    /// The queue: the CPU number whose requests this entry serves.
    pub qid: u16,
    pub padding: [u8; 6],
}

// The kernel's sizes (fuse.h, 7.45); a wrong field breaks the build, not the protocol.
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<fuse_in_header>() == 40);
    assert!(size_of::<fuse_out_header>() == 16);
    assert!(size_of::<fuse_attr>() == 88);
    assert!(size_of::<fuse_kstatfs>() == 80);
    assert!(size_of::<fuse_entry_out>() == 128);
    assert!(size_of::<fuse_attr_out>() == 104);
    assert!(size_of::<fuse_getattr_in>() == 16);
    assert!(size_of::<fuse_mknod_in>() == 16);
    assert!(size_of::<fuse_mkdir_in>() == 8);
    assert!(size_of::<fuse_rename2_in>() == 16);
    assert!(size_of::<fuse_setattr_in>() == 88);
    assert!(size_of::<fuse_open_in>() == 8);
    assert!(size_of::<fuse_create_in>() == 16);
    assert!(size_of::<fuse_open_out>() == 16);
    assert!(size_of::<fuse_release_in>() == 24);
    assert!(size_of::<fuse_flush_in>() == 24);
    assert!(size_of::<fuse_read_in>() == 40);
    assert!(size_of::<fuse_write_in>() == 40);
    assert!(size_of::<fuse_fsync_in>() == 16);
    assert!(size_of::<fuse_setxattr_in>() == 16);
    assert!(size_of::<fuse_setxattr_in_compat>() == 8);
    assert!(size_of::<fuse_init_in>() == 64);
    assert!(size_of::<fuse_init_out>() == 64);
    assert!(size_of::<fuse_ioctl_in>() == 32);
    assert!(size_of::<fuse_ioctl_out>() == 16);
    assert!(size_of::<fuse_poll_in>() == 24);
    assert!(size_of::<fuse_fallocate_in>() == 32);
    assert!(size_of::<fuse_lseek_in>() == 24);
    assert!(size_of::<fuse_copy_file_range_in>() == 56);
    assert!(size_of::<fuse_dirent>() == 24);
    assert!(size_of::<fuse_direntplus>() == 152);
    assert!(size_of::<fuse_uring_ent_in_out>() == 32);
    assert!(size_of::<fuse_uring_req_header>() == 288);
    assert!(size_of::<fuse_uring_cmd_req>() == 24);
    assert!(size_of::<fuse_backing_map>() == 16);
    assert!(size_of::<fuse_notify_inval_inode_out>() == 24);
    assert!(size_of::<fuse_notify_inval_entry_out>() == 16);
};
