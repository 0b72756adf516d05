//! Tests of the codec from requests recorded on Linux 6.18 (`examples/uring_proof.rs
//! record`: every opcode the adapter serves, once as `/dev/fuse` delivered it, NAME.bin, and
//! once as a ring entry delivered it, ring-NAME.bin = `fuse_uring_req_header` + payload).
//! The same files seed the `fuse_decode` fuzz target (tests/fuzz-corpus/fuse_decode/).
use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use zerocopy::{FromBytes, IntoBytes};

use super::abi::{self, opcode as op};
use super::decode::{self, DecodeError, Op, Proto, Request, decode, decode_split};
use super::encode::{self, Entry, Open, ReplyBuf, Statfs};

macro_rules! recorded {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fuzz-corpus/fuse_decode/",
            $name,
            ".bin"
        ))
        .as_slice()
    };
}

/// Every recording, by name.
const RECORDED: &[(&str, &[u8])] = &[
    ("access", recorded!("access")),
    ("batch_forget", recorded!("batch_forget")),
    ("copy_file_range", recorded!("copy_file_range")),
    ("create", recorded!("create")),
    ("fallocate", recorded!("fallocate")),
    ("flush", recorded!("flush")),
    ("forget", recorded!("forget")),
    ("fsync", recorded!("fsync")),
    ("fsyncdir", recorded!("fsyncdir")),
    ("getattr", recorded!("getattr")),
    ("getxattr", recorded!("getxattr")),
    ("init", recorded!("init")),
    ("link", recorded!("link")),
    ("listxattr", recorded!("listxattr")),
    ("lookup", recorded!("lookup")),
    ("lseek", recorded!("lseek")),
    ("mkdir", recorded!("mkdir")),
    ("mknod", recorded!("mknod")),
    ("op53", recorded!("op53")),
    ("open", recorded!("open")),
    ("opendir", recorded!("opendir")),
    ("read", recorded!("read")),
    ("readdirplus", recorded!("readdirplus")),
    ("readlink", recorded!("readlink")),
    ("release", recorded!("release")),
    ("releasedir", recorded!("releasedir")),
    ("removexattr", recorded!("removexattr")),
    ("rename", recorded!("rename")),
    ("rename2", recorded!("rename2")),
    ("rmdir", recorded!("rmdir")),
    ("setattr", recorded!("setattr")),
    ("setxattr", recorded!("setxattr")),
    ("statfs", recorded!("statfs")),
    ("symlink", recorded!("symlink")),
    ("unlink", recorded!("unlink")),
    ("write", recorded!("write")),
];

const RING_RECORDED: &[(&str, &[u8])] = &[
    ("access", recorded!("ring-access")),
    ("copy_file_range", recorded!("ring-copy_file_range")),
    ("create", recorded!("ring-create")),
    ("fallocate", recorded!("ring-fallocate")),
    ("flush", recorded!("ring-flush")),
    ("fsync", recorded!("ring-fsync")),
    ("fsyncdir", recorded!("ring-fsyncdir")),
    ("getattr", recorded!("ring-getattr")),
    ("getxattr", recorded!("ring-getxattr")),
    ("link", recorded!("ring-link")),
    ("listxattr", recorded!("ring-listxattr")),
    ("lookup", recorded!("ring-lookup")),
    ("lseek", recorded!("ring-lseek")),
    ("mkdir", recorded!("ring-mkdir")),
    ("mknod", recorded!("ring-mknod")),
    ("op53", recorded!("ring-op53")),
    ("open", recorded!("ring-open")),
    ("opendir", recorded!("ring-opendir")),
    ("read", recorded!("ring-read")),
    ("readdirplus", recorded!("ring-readdirplus")),
    ("readlink", recorded!("ring-readlink")),
    ("release", recorded!("ring-release")),
    ("releasedir", recorded!("ring-releasedir")),
    ("removexattr", recorded!("ring-removexattr")),
    ("rename", recorded!("ring-rename")),
    ("rename2", recorded!("ring-rename2")),
    ("rmdir", recorded!("ring-rmdir")),
    ("setattr", recorded!("ring-setattr")),
    ("setxattr", recorded!("ring-setxattr")),
    ("statfs", recorded!("ring-statfs")),
    ("symlink", recorded!("ring-symlink")),
    ("unlink", recorded!("ring-unlink")),
    ("write", recorded!("ring-write")),
];

fn dev(name: &str) -> Request<'static> {
    let bytes = RECORDED.iter().find(|(n, _)| *n == name).unwrap().1;
    decode(bytes, &Proto::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const HDR: usize = size_of::<abi::fuse_uring_req_header>();

/// A recorded ring entry split as the queue hands it to the decoder.
fn ring_parts(bytes: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let h = abi::fuse_uring_req_header::read_from_bytes(&bytes[..HDR]).unwrap();
    let payload = &bytes[HDR..];
    assert_eq!(payload.len(), h.ring_ent_in_out.payload_sz as usize);
    (&bytes[..128], &bytes[128..256], payload)
}

fn ring(name: &str) -> Request<'static> {
    let bytes = RING_RECORDED.iter().find(|(n, _)| *n == name).unwrap().1;
    let (in_out, op_in, payload) = ring_parts(bytes);
    decode_split(in_out, op_in, payload, &Proto::default())
        .unwrap_or_else(|e| panic!("ring {name}: {e}"))
}

#[test]
fn every_recording_decodes_to_its_opcode() {
    for (name, bytes) in RECORDED {
        let r = decode(bytes, &Proto::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.header.len as usize, bytes.len(), "{name}");
        let unsupported = matches!(r.op, Op::Unsupported);
        assert_eq!(unsupported, *name == "op53", "{name}: {:?}", r.op);
    }
    for (name, _) in RING_RECORDED {
        let r = ring(name);
        assert_eq!(
            matches!(r.op, Op::Unsupported),
            *name == "op53",
            "ring {name}"
        );
    }
}

#[test]
fn init_from_linux_6_18() {
    let r = dev("init");
    assert_eq!(r.header.opcode, op::FUSE_INIT);
    assert_eq!(r.header.nodeid, 0);
    let Op::Init {
        major,
        minor,
        flags,
        ..
    } = r.op
    else {
        panic!("{:?}", r.op)
    };
    assert_eq!((major, minor), (7, 45));
    // Offered with enable_uring on (flags2 bit 9), and the flags this daemon asks for.
    assert_ne!(flags & abi::FUSE_OVER_IO_URING, 0);
    assert_ne!(flags & abi::FUSE_INIT_EXT, 0);
    assert_ne!(flags & fuser::InitFlags::FUSE_PASSTHROUGH.bits(), 0);
    assert_ne!(flags & fuser::InitFlags::FUSE_DO_READDIRPLUS.bits(), 0);
}

#[test]
fn named_requests_carry_their_names() {
    assert_eq!(
        dev("lookup").op,
        Op::Lookup {
            name: OsStr::new("dir")
        }
    );
    assert_eq!(
        ring("lookup").op,
        Op::Lookup {
            name: OsStr::new("dir")
        }
    );
    let Op::Mkdir { name, mode, umask } = dev("mkdir").op else {
        panic!()
    };
    assert_eq!(
        (name, mode & 0o7777, umask),
        // Without FUSE_DONT_MASK the kernel applied the umask itself and reports it too.
        (OsStr::new("dir"), 0o755, 0o022)
    );
    assert_eq!(
        dev("symlink").op,
        Op::Symlink {
            name: OsStr::new("link"),
            target: OsStr::new("file")
        }
    );
    assert_eq!(
        ring("symlink").op,
        Op::Symlink {
            name: OsStr::new("link"),
            target: OsStr::new("file")
        }
    );
    let Op::Rename {
        name,
        newname,
        flags,
        ..
    } = dev("rename2").op
    else {
        panic!()
    };
    assert_eq!(
        (name, newname, flags),
        (
            OsStr::new("copy"),
            OsStr::new("copy2"),
            libc::RENAME_NOREPLACE
        )
    );
    let Op::Rename {
        name,
        newname,
        flags,
        ..
    } = dev("rename").op
    else {
        panic!()
    };
    assert_eq!(
        (name, newname, flags),
        (OsStr::new("hard"), OsStr::new("moved"), 0)
    );
    let Op::Link { newname, .. } = dev("link").op else {
        panic!()
    };
    assert_eq!(newname, OsStr::new("hard"));
    let Op::Create {
        name, mode, flags, ..
    } = dev("create").op
    else {
        panic!()
    };
    assert_eq!(
        (name, mode, flags & libc::O_ACCMODE),
        (OsStr::new("file"), libc::S_IFREG | 0o640, libc::O_RDWR)
    );
    let Op::Mknod { name, mode, .. } = dev("mknod").op else {
        panic!()
    };
    assert_eq!(
        (name, mode & libc::S_IFMT),
        (OsStr::new("fifo"), libc::S_IFIFO)
    );
    assert_eq!(
        dev("unlink").op,
        Op::Unlink {
            name: OsStr::new("link")
        }
    );
    assert_eq!(
        dev("rmdir").op,
        Op::Rmdir {
            name: OsStr::new("dir")
        }
    );
}

#[test]
fn data_and_xattrs() {
    for r in [dev("write"), ring("write")] {
        let Op::Write { offset, data, .. } = r.op else {
            panic!()
        };
        assert_eq!((offset, data), (3, b"hello, ring".as_slice()));
    }
    for r in [dev("setxattr"), ring("setxattr")] {
        assert_eq!(
            r.op,
            Op::Setxattr {
                name: OsStr::new("user.test"),
                value: b"v",
                flags: 0
            }
        );
    }
    let Op::Getxattr { name, size } = dev("getxattr").op else {
        panic!()
    };
    // The first GETXATTR the kernel sent is its own probe before a write (kill-priv),
    // asking for the size only.
    assert_eq!((name, size), (OsStr::new("security.capability"), 0));
    assert_eq!(dev("listxattr").op, Op::Listxattr { size: 256 });
    assert_eq!(
        dev("removexattr").op,
        Op::Removexattr {
            name: OsStr::new("user.test")
        }
    );
    let Op::Read { offset, size, .. } = dev("read").op else {
        panic!()
    };
    assert_eq!(offset, 0);
    assert!(size >= 32);
    let Op::Setattr(s) = dev("setattr").op else {
        panic!()
    };
    assert_eq!(s.mode.map(|m| m & 0o7777), Some(0o600));
    assert_eq!((s.size, s.uid, s.atime), (None, None, None));
    let Op::Fallocate {
        offset,
        length,
        mode,
        ..
    } = dev("fallocate").op
    else {
        panic!()
    };
    assert_eq!((offset, length, mode), (0, 4096, 0));
    let Op::Lseek { whence, .. } = dev("lseek").op else {
        panic!()
    };
    assert_eq!(whence, libc::SEEK_DATA);
    let Op::CopyFileRange { len, .. } = dev("copy_file_range").op else {
        panic!()
    };
    assert_eq!(len, 4);
}

#[test]
fn forgets() {
    let r = dev("forget");
    assert!(!r.header.expects_reply());
    assert!(matches!(r.op, Op::Forget { nlookup } if nlookup >= 1));
    let Op::BatchForget(list) = dev("batch_forget").op else {
        panic!()
    };
    assert!(!list.is_empty());
    for (node, nlookup) in list {
        assert!(node > 1 && nlookup >= 1, "{node} {nlookup}");
    }
}

/// The ring's three pieces, put back together, are the /dev/fuse layout: both decoders
/// must agree on every recorded ring request.
#[test]
fn split_and_contiguous_agree() {
    for (name, bytes) in RING_RECORDED {
        let (in_out, op_in, payload) = ring_parts(bytes);
        let h = decode::decode_header(in_out).unwrap();
        let fixed = h.len as usize - 40 - payload.len();
        let mut joined = in_out[..40].to_vec();
        joined.extend_from_slice(&op_in[..fixed]);
        joined.extend_from_slice(payload);
        let a = decode(&joined, &Proto::default()).unwrap();
        let b = decode_split(in_out, op_in, payload, &Proto::default()).unwrap();
        assert_eq!(a, b, "{name}");
    }
}

#[test]
fn constructed_interrupt_and_destroy() {
    let header = |opcode, len| abi::fuse_in_header {
        len,
        opcode,
        unique: 0x21,
        nodeid: 0,
        ..Default::default()
    };
    let mut b = header(op::FUSE_INTERRUPT, 48).as_bytes().to_vec();
    b.extend_from_slice(&0x1234u64.to_ne_bytes());
    let r = decode(&b, &Proto::default()).unwrap();
    assert_eq!(r.op, Op::Interrupt { unique: 0x1234 });
    assert!(!r.header.expects_reply());
    let b = header(op::FUSE_DESTROY, 40).as_bytes().to_vec();
    assert_eq!(decode(&b, &Proto::default()).unwrap().op, Op::Destroy);
}

#[test]
fn every_truncation_and_bad_length_is_an_error() {
    for (name, bytes) in RECORDED {
        for cut in 0..bytes.len() {
            let r = decode(&bytes[..cut], &Proto::default());
            assert!(r.is_err(), "{name} cut to {cut}");
        }
        // Cut, with the header's length following: an error or a shorter valid request,
        // never a panic.
        for cut in 40..bytes.len() {
            let mut b = bytes[..cut].to_vec();
            b[..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            let _ = decode(&b, &Proto::default());
        }
    }
    assert_eq!(
        decode(&[0; 10], &Proto::default()).unwrap_err().kind,
        DecodeError::ShortHeader { have: 10 }
    );
}

fn with_name(opcode: u32, name: &[u8]) -> Vec<u8> {
    let mut b = abi::fuse_in_header {
        len: (40 + name.len()) as u32,
        opcode,
        unique: 2,
        nodeid: 1,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    b.extend_from_slice(name);
    b
}

#[test]
fn names_are_validated() {
    let p = Proto::default();
    let kind = |b: &[u8]| decode(b, &p).unwrap_err().kind;
    assert_eq!(
        kind(&with_name(op::FUSE_LOOKUP, b"a/b\0")),
        DecodeError::NameWithSlash
    );
    assert_eq!(
        kind(&with_name(op::FUSE_LOOKUP, b"abc")),
        DecodeError::MissingNul
    );
    assert_eq!(
        kind(&with_name(op::FUSE_UNLINK, b"\0")),
        DecodeError::EmptyName
    );
    // An xattr name may hold '/'.
    assert_eq!(
        decode(&with_name(op::FUSE_REMOVEXATTR, b"user.a/b\0"), &p)
            .unwrap()
            .op,
        Op::Removexattr {
            name: OsStr::new("user.a/b")
        }
    );
    // A symlink target may too, and bytes that are not UTF-8 pass through.
    assert_eq!(
        decode(&with_name(op::FUSE_SYMLINK, b"l\xff\0../t\0"), &p)
            .unwrap()
            .op,
        Op::Symlink {
            name: <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"l\xff"),
            target: OsStr::new("../t")
        }
    );
    // The error keeps the header, so the transport can still answer EIO.
    let e = decode(&with_name(op::FUSE_LOOKUP, b"abc"), &p).unwrap_err();
    assert_eq!(e.header.map(|h| h.unique), Some(2));
}

#[test]
fn counts_and_extensions_are_bounded() {
    let p = Proto::default();
    // BATCH_FORGET claiming more records than it has.
    let mut b = abi::fuse_in_header {
        len: 64,
        opcode: op::FUSE_BATCH_FORGET,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    b.extend_from_slice(
        abi::fuse_batch_forget_in {
            count: u32::MAX,
            dummy: 0,
        }
        .as_bytes(),
    );
    b.extend_from_slice(&[0; 16]);
    assert_eq!(
        decode(&b, &p).unwrap_err().kind,
        DecodeError::ForgetCount {
            count: u32::MAX,
            have: 16
        }
    );
    // Extensions longer than the body.
    let mut b = with_name(op::FUSE_LOOKUP, b"x\0");
    b[36] = 1; // total_extlen = 1 (8 bytes) > 2 bytes of body
    assert_eq!(
        decode(&b, &p).unwrap_err().kind,
        DecodeError::ExtensionsTooLong { extlen: 8, have: 2 }
    );
    // A WRITE whose size exceeds its data.
    let mut b = abi::fuse_in_header {
        len: 84,
        opcode: op::FUSE_WRITE,
        ..Default::default()
    }
    .as_bytes()
    .to_vec();
    b.extend_from_slice(
        abi::fuse_write_in {
            size: 1000,
            ..Default::default()
        }
        .as_bytes(),
    );
    b.extend_from_slice(&[7; 4]);
    assert_eq!(
        decode(&b, &p).unwrap_err().kind,
        DecodeError::ShortData {
            need: 1000,
            have: 4
        }
    );
    // A ring entry whose header length leaves more fixed bytes than op_in holds.
    let in_out = abi::fuse_in_header {
        len: 40 + 200,
        opcode: op::FUSE_GETATTR,
        ..Default::default()
    };
    let e = decode_split(in_out.as_bytes(), &[0; 128], &[], &p).unwrap_err();
    assert_eq!(e.kind, DecodeError::OpInTooLong { len: 200 });
    // Unknown opcodes are not errors.
    let b = abi::fuse_in_header {
        len: 40,
        opcode: 9999,
        ..Default::default()
    };
    assert_eq!(decode(b.as_bytes(), &p).unwrap().op, Op::Unsupported);
}

#[test]
fn setattr_times() {
    let p = Proto::default();
    let mut s = abi::fuse_setattr_in {
        valid: abi::fattr::ATIME | abi::fattr::ATIME_NOW | abi::fattr::MTIME | abi::fattr::CTIME,
        mtime: (-2i64) as u64,
        mtimensec: 500,
        ctime: 10,
        ..Default::default()
    };
    let req = |s: &abi::fuse_setattr_in| {
        let mut b = abi::fuse_in_header {
            len: 128,
            opcode: op::FUSE_SETATTR,
            ..Default::default()
        }
        .as_bytes()
        .to_vec();
        b.extend_from_slice(s.as_bytes());
        b
    };
    let b = req(&s);
    let Op::Setattr(a) = decode(&b, &p).unwrap().op else {
        panic!()
    };
    assert_eq!(a.atime, Some(TimeOrNow::Now));
    assert_eq!(
        a.mtime,
        Some(TimeOrNow::SpecificTime(
            SystemTime::UNIX_EPOCH - Duration::from_secs(2) + Duration::from_nanos(500)
        ))
    );
    assert_eq!(
        a.ctime,
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(10))
    );
    // Out of SystemTime's range, or nanoseconds past a second: an error or clamped, no panic.
    s.mtime = i64::MIN as u64;
    s.mtimensec = u32::MAX;
    let b = req(&s);
    let _ = decode(&b, &p);
}

fn attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 5,
        blocks: 1,
        atime: SystemTime::UNIX_EPOCH + Duration::new(100, 7),
        mtime: SystemTime::UNIX_EPOCH - Duration::new(1, 250_000_000),
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: 0o4755,
        nlink: 2,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

#[test]
fn replies_have_the_kernels_layout() {
    let mut r = ReplyBuf::new();
    let a = attr(9, FileType::Directory);
    let e = Entry {
        nodeid: 9,
        generation: 3,
        entry_ttl: Duration::new(1, 5),
        attr_ttl: Duration::from_millis(1500),
        attr: &a,
    };
    let bytes = r.start(77).entry(&e).finish().to_vec();
    assert_eq!(bytes.len(), 16 + 128);
    let (h, body) = abi::fuse_out_header::read_from_prefix(&bytes).unwrap();
    assert_eq!((h.len, h.error, h.unique), (144, 0, 77));
    let out = abi::fuse_entry_out::read_from_bytes(body).unwrap();
    assert_eq!(
        (
            out.nodeid,
            out.generation,
            out.entry_valid,
            out.entry_valid_nsec
        ),
        (9, 3, 1, 5)
    );
    assert_eq!((out.attr_valid, out.attr_valid_nsec), (1, 500_000_000));
    assert_eq!(out.attr.mode, libc::S_IFDIR | 0o4755);
    assert_eq!((out.attr.atime, out.attr.atimensec), (100, 7));
    // 1.25 s before the epoch: -2 s + 0.75 s, as the kernel's timespec normalises it.
    assert_eq!(
        (out.attr.mtime as i64, out.attr.mtimensec),
        (-2, 750_000_000)
    );
    assert_eq!(
        (out.attr.nlink, out.attr.uid, out.attr.gid, out.attr.blksize),
        (2, 1000, 100, 4096)
    );
    assert_eq!(r.header().len(), 16);
    assert_eq!(r.body().len(), 128);

    let bytes = r.error(78, libc::ENOENT).to_vec();
    assert_eq!(
        bytes,
        abi::fuse_out_header {
            len: 16,
            error: -libc::ENOENT,
            unique: 78
        }
        .as_bytes()
    );
    // An errno the kernel would refuse becomes EIO.
    let bytes = r.error(79, 0).to_vec();
    assert_eq!(
        abi::fuse_out_header::read_from_bytes(&bytes).unwrap().error,
        -libc::EIO
    );

    let o = Open {
        fh: 5,
        open_flags: fuser::FopenFlags::FOPEN_KEEP_CACHE.bits(),
        backing_id: Some(3),
    };
    let bytes = r.start(80).open(&o).finish().to_vec();
    let out = abi::fuse_open_out::read_from_bytes(&bytes[16..]).unwrap();
    assert_eq!((out.fh, out.backing_id), (5, 3));
    assert_eq!(
        out.open_flags,
        fuser::FopenFlags::FOPEN_KEEP_CACHE.bits() | abi::FOPEN_PASSTHROUGH
    );

    let bytes = r
        .start(81)
        .create(
            &e,
            &Open {
                fh: 6,
                open_flags: 0,
                backing_id: None,
            },
        )
        .finish()
        .to_vec();
    assert_eq!(bytes.len(), 16 + 128 + 16);

    for (len, build) in [
        (
            8usize,
            Box::new(|r: &mut ReplyBuf| {
                r.written(4096);
            }) as Box<dyn Fn(&mut ReplyBuf)>,
        ),
        (
            8,
            Box::new(|r: &mut ReplyBuf| {
                r.xattr_size(12);
            }),
        ),
        (
            8,
            Box::new(|r: &mut ReplyBuf| {
                r.lseek(-1);
            }),
        ),
        (
            8,
            Box::new(|r: &mut ReplyBuf| {
                r.poll(1);
            }),
        ),
        (
            80,
            Box::new(|r: &mut ReplyBuf| {
                r.statfs(&Statfs::default());
            }),
        ),
        (
            104,
            Box::new(|r: &mut ReplyBuf| {
                r.attr(Duration::ZERO, &a);
            }),
        ),
        (
            16 + 3,
            Box::new(|r: &mut ReplyBuf| {
                r.ioctl(0, b"abc");
            }),
        ),
        (
            64,
            Box::new(|r: &mut ReplyBuf| {
                r.init(&abi::fuse_init_out::default());
            }),
        ),
    ] {
        r.start(1);
        build(&mut r);
        assert_eq!(r.finish().len(), 16 + len);
    }
}

#[test]
fn directory_entries_are_packed_and_bounded() {
    let mut r = ReplyBuf::new();
    r.start(5);
    // 24 + 1 -> 32; 24 + 8 -> 32; 24 + 9 -> 40.
    assert!(r.dirent(4096, 1, 1, FileType::Directory, b"."));
    assert!(r.dirent(4096, 7, 2, FileType::RegularFile, b"12345678"));
    assert!(r.dirent(4096, 8, 3, FileType::Symlink, b"123456789"));
    assert_eq!(r.body_len(), 32 + 32 + 40);
    // Full: a 4th entry would pass the request's size and is not added.
    assert!(!r.dirent(104 + 31, 9, 4, FileType::RegularFile, b"x"));
    assert!(!r.dirent(4096, 9, 4, FileType::RegularFile, b""));
    let body = r.finish()[16..].to_vec();
    let (d, rest) = abi::fuse_dirent::read_from_prefix(&body[32..]).unwrap();
    assert_eq!(
        (d.ino, d.off, d.namelen, d.typ),
        (7, 2, 8, libc::DT_REG as u32)
    );
    assert_eq!(&rest[..8], b"12345678");
    let (d, rest) = abi::fuse_dirent::read_from_prefix(&body[64..]).unwrap();
    assert_eq!(
        (d.typ, &rest[..9], &rest[9..16]),
        (
            libc::DT_LNK as u32,
            b"123456789".as_slice(),
            [0u8; 7].as_slice()
        )
    );

    r.start(6);
    let a = attr(12, FileType::RegularFile);
    let e = Entry {
        nodeid: 12,
        generation: 0,
        entry_ttl: Duration::ZERO,
        attr_ttl: Duration::ZERO,
        attr: &a,
    };
    assert!(r.direntplus(4096, &e, 1, b"name"));
    assert_eq!(r.body_len(), 152 + 8);
    let plus = abi::fuse_direntplus::read_from_prefix(r.body()).unwrap().0;
    assert_eq!(
        (plus.entry_out.nodeid, plus.dirent.ino, plus.dirent.namelen),
        (12, 12, 4)
    );
    assert!(!r.direntplus(160 + 100, &e, 2, b"name"));
}

#[test]
fn time_parts_match_the_kernels_timespec() {
    assert_eq!(encode::time_parts(SystemTime::UNIX_EPOCH), (0, 0));
    assert_eq!(
        encode::time_parts(SystemTime::UNIX_EPOCH - Duration::from_secs(3)),
        ((-3i64) as u64, 0)
    );
    assert_eq!(
        encode::dirent_type(FileType::NamedPipe),
        libc::DT_FIFO as u32
    );
    assert_eq!(
        encode::dirent_type(FileType::Directory),
        libc::DT_DIR as u32
    );
}
