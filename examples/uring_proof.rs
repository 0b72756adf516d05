//! Proof that FUSE over io_uring works from Rust with our own codec (`checkpointfs::transport`)
//! and the `io-uring` crate on this kernel — groundwork for issue 26, not part of the daemon.
//!
//! A tiny in-memory filesystem served by one decoder and one encoder over both transports:
//!
//! ```text
//! uring_proof proof [--mnt DIR] [--iters N] [--rounds R] [--pin CPU] [--user]
//!     mounts, does INIT over /dev/fuse (with FUSE_OVER_IO_URING when asked), registers one
//!     queue per possible CPU, checks that a GETATTR of the root and a LOOKUP (ENOENT) are
//!     served over the ring, and times a bare round trip (getxattr -> ENODATA) on /dev/fuse
//!     and on the ring (with and without the SCHED_IDLE hand-over), alternating rounds.
//!     --user: mount through fusermount3 (run as a normal user).
//! uring_proof record DIR [--mnt DIR]
//!     runs a workload through the mount and saves the first request of every opcode, as
//!     /dev/fuse delivered it (DIR/NAME.bin) and as a ring entry delivered it
//!     (DIR/ring-NAME.bin: fuse_uring_req_header, then the payload).
//! uring_proof kill-test [--mnt DIR]
//!     (root) requests in each ring state — queued, in the daemon, awaiting commit — then
//!     kill -9 of the server, and SIGSTOP of it followed by an abort through fusectl (what
//!     the watchdog does): checks which callers SIGKILL ends and that every caller ends.
//! ```
//! Needs `enable_uring` on for the ring (the kill test and proof say so when it is off).
#![allow(
    clippy::disallowed_methods,
    reason = "acts only on its own toy mount and scratch directories, never on a SRC"
)]
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use checkpointfs::transport::abi::{self, opcode as op};
use checkpointfs::transport::decode::{self, Op, Proto, Request};
use checkpointfs::transport::encode::{Entry, Open, ReplyBuf, Statfs};
use checkpointfs::transport::uring::{self, Next, Queue};
use fuser::{FileAttr, FileType, INodeNo};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const MAX_WRITE: u32 = 1 << 20;
const MAX_PAGES: u16 = 256;

// ---------------------------------------------------------------------------------------
// The toy filesystem: one flat namespace of nodes, everything in memory.

struct Node {
    kind: FileType,
    perm: u16,
    data: Vec<u8>,
    target: Vec<u8>,
    xattrs: HashMap<Vec<u8>, Vec<u8>>,
    nlink: u32,
}

struct Toy {
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, Vec<u8>), u64>,
    next: u64,
}

impl Toy {
    fn new() -> Toy {
        let mut nodes = HashMap::new();
        nodes.insert(1, Node::new(FileType::Directory, 0o755));
        // "f": a file the tests getxattr on.
        nodes.insert(2, Node::new(FileType::RegularFile, 0o644));
        let mut names = HashMap::new();
        names.insert((1, b"f".to_vec()), 2);
        Toy {
            nodes,
            names,
            next: 3,
        }
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let n = self.nodes.get(&ino)?;
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Some(FileAttr {
            ino: INodeNo(ino),
            size: if n.kind == FileType::Symlink {
                n.target.len() as u64
            } else {
                n.data.len() as u64
            },
            blocks: (n.data.len() as u64).div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: n.kind,
            perm: n.perm,
            nlink: n.nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn add(&mut self, parent: u64, name: &OsStr, node: Node) -> u64 {
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, node);
        self.names.insert((parent, name.as_bytes().to_vec()), ino);
        ino
    }
}

impl Node {
    fn new(kind: FileType, perm: u16) -> Node {
        Node {
            kind,
            perm,
            data: Vec::new(),
            target: Vec::new(),
            xattrs: HashMap::new(),
            nlink: 1,
        }
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// What a handler decided besides its reply.
#[derive(PartialEq)]
enum Hook {
    None,
    /// Never answer (the request stays "in the daemon").
    Block,
    /// Build the reply, then never commit it ("awaiting commit").
    NoCommit,
}

/// Serves one request into `out`; false when the request takes no reply.
fn handle(toy: &Mutex<Toy>, req: &Request<'_>, out: &mut ReplyBuf) -> (bool, Hook) {
    let h = req.header;
    let unique = h.unique;
    let mut toy = toy.lock().unwrap_or_else(|p| p.into_inner());
    let zero = Duration::ZERO;
    let entry_of = |toy: &Toy, ino: u64, out: &mut ReplyBuf| match toy.attr(ino) {
        Some(a) => {
            // Entries cached for an hour (the kernel updates them for its own changes), so a
            // getxattr on a name is one round trip; attributes not cached.
            out.start(unique).entry(&Entry {
                nodeid: ino,
                generation: 0,
                entry_ttl: Duration::from_secs(3600),
                attr_ttl: zero,
                attr: &a,
            });
            out.finish();
        }
        None => {
            out.error(unique, libc::ENOENT);
        }
    };
    let ok = |out: &mut ReplyBuf| {
        out.start(unique).finish();
    };
    let err = |out: &mut ReplyBuf, e: i32| {
        out.error(unique, e);
    };
    match &req.op {
        Op::Forget { .. } | Op::BatchForget(_) | Op::Interrupt { .. } => {
            return (false, Hook::None);
        }
        Op::Init { .. } => err(out, libc::EIO),
        Op::Destroy => ok(out),
        Op::Lookup { name } => match toy.names.get(&(h.nodeid, name.as_bytes().to_vec())) {
            Some(&ino) => entry_of(&toy, ino, out),
            None => err(out, libc::ENOENT),
        },
        Op::Getattr { .. } => match toy.attr(h.nodeid) {
            Some(a) => {
                out.start(unique).attr(zero, &a);
                out.finish();
            }
            None => err(out, libc::ENOENT),
        },
        Op::Setattr(s) => {
            if let Some(n) = toy.nodes.get_mut(&h.nodeid) {
                if let Some(m) = s.mode {
                    n.perm = (m & 0o7777) as u16;
                }
                if let Some(size) = s.size {
                    n.data.resize(size.min(1 << 30) as usize, 0);
                }
            }
            match toy.attr(h.nodeid) {
                Some(a) => {
                    out.start(unique).attr(zero, &a);
                    out.finish();
                }
                None => err(out, libc::ENOENT),
            }
        }
        Op::Readlink => match toy.nodes.get(&h.nodeid) {
            Some(n) => {
                out.start(unique).data(&n.target);
                out.finish();
            }
            None => err(out, libc::ENOENT),
        },
        Op::Symlink { name, target } => {
            let mut n = Node::new(FileType::Symlink, 0o777);
            n.target = target.as_bytes().to_vec();
            let ino = toy.add(h.nodeid, name, n);
            entry_of(&toy, ino, out);
        }
        Op::Mknod { name, mode, .. } | Op::Mkdir { name, mode, .. } => {
            let kind = if matches!(req.op, Op::Mkdir { .. }) {
                FileType::Directory
            } else {
                kind_of(*mode)
            };
            let ino = toy.add(h.nodeid, name, Node::new(kind, (*mode & 0o7777) as u16));
            entry_of(&toy, ino, out);
        }
        Op::Create { name, mode, .. } => {
            let ino = toy.add(
                h.nodeid,
                name,
                Node::new(FileType::RegularFile, (*mode & 0o7777) as u16),
            );
            let a = toy.attr(ino);
            if let Some(a) = a {
                out.start(unique).create(
                    &Entry {
                        nodeid: ino,
                        generation: 0,
                        entry_ttl: zero,
                        attr_ttl: zero,
                        attr: &a,
                    },
                    &Open {
                        fh: ino,
                        open_flags: 0,
                        backing_id: None,
                    },
                );
                out.finish();
            }
        }
        Op::Link { oldnodeid, newname } => {
            toy.names
                .insert((h.nodeid, newname.as_bytes().to_vec()), *oldnodeid);
            if let Some(n) = toy.nodes.get_mut(oldnodeid) {
                n.nlink += 1;
            }
            entry_of(&toy, *oldnodeid, out);
        }
        Op::Unlink { name } | Op::Rmdir { name } => {
            match toy.names.remove(&(h.nodeid, name.as_bytes().to_vec())) {
                Some(_) => ok(out),
                None => err(out, libc::ENOENT),
            }
        }
        Op::Rename {
            name,
            newdir,
            newname,
            ..
        } => match toy.names.remove(&(h.nodeid, name.as_bytes().to_vec())) {
            Some(ino) => {
                toy.names
                    .insert((*newdir, newname.as_bytes().to_vec()), ino);
                ok(out)
            }
            None => err(out, libc::ENOENT),
        },
        Op::Open { .. } | Op::Opendir { .. } => {
            out.start(unique).open(&Open {
                fh: h.nodeid,
                open_flags: 0,
                backing_id: None,
            });
            out.finish();
        }
        Op::Read { offset, size, .. } => {
            let data = toy
                .nodes
                .get(&h.nodeid)
                .map(|n| n.data.as_slice())
                .unwrap_or(&[]);
            let start = (*offset as usize).min(data.len());
            let end = start.saturating_add(*size as usize).min(data.len());
            out.start(unique).data(&data[start..end]);
            out.finish();
        }
        Op::Write { offset, data, .. } => {
            if let Some(n) = toy.nodes.get_mut(&h.nodeid) {
                let end = *offset as usize + data.len();
                if n.data.len() < end {
                    n.data.resize(end, 0);
                }
                n.data[*offset as usize..end].copy_from_slice(data);
            }
            out.start(unique).written(data.len() as u32);
            out.finish();
        }
        Op::Statfs => {
            out.start(unique).statfs(&Statfs {
                blocks: 1000,
                bfree: 500,
                bavail: 500,
                files: 100,
                ffree: 50,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            });
            out.finish();
        }
        Op::Release { .. }
        | Op::Releasedir { .. }
        | Op::Fsync { .. }
        | Op::Fsyncdir { .. }
        | Op::Flush { .. }
        | Op::Access { .. }
        | Op::Fallocate { .. } => ok(out),
        Op::Setxattr { name, value, .. } => {
            if let Some(n) = toy.nodes.get_mut(&h.nodeid) {
                n.xattrs.insert(name.as_bytes().to_vec(), value.to_vec());
            }
            ok(out)
        }
        Op::Getxattr { name, size } => {
            if *name == "user.block" {
                return (true, Hook::Block);
            }
            let value = toy
                .nodes
                .get(&h.nodeid)
                .and_then(|n| n.xattrs.get(name.as_bytes()))
                .cloned();
            match value {
                None => err(out, libc::ENODATA),
                Some(v) if *size == 0 => {
                    out.start(unique).xattr_size(v.len() as u32);
                    out.finish();
                }
                Some(v) if v.len() > *size as usize => err(out, libc::ERANGE),
                Some(v) => {
                    out.start(unique).data(&v);
                    out.finish();
                }
            }
            if *name == "user.nocommit" {
                return (true, Hook::NoCommit);
            }
        }
        Op::Listxattr { size } => {
            let mut list = Vec::new();
            if let Some(n) = toy.nodes.get(&h.nodeid) {
                for k in n.xattrs.keys() {
                    list.extend_from_slice(k);
                    list.push(0);
                }
            }
            if *size == 0 {
                out.start(unique).xattr_size(list.len() as u32);
                out.finish();
            } else if list.len() > *size as usize {
                err(out, libc::ERANGE)
            } else {
                out.start(unique).data(&list);
                out.finish();
            }
        }
        Op::Removexattr { name } => {
            let removed = toy
                .nodes
                .get_mut(&h.nodeid)
                .and_then(|n| n.xattrs.remove(name.as_bytes()));
            match removed {
                Some(_) => ok(out),
                None => err(out, libc::ENODATA),
            }
        }
        Op::Readdir { offset, size, .. } | Op::Readdirplus { offset, size, .. } => {
            let plus = matches!(req.op, Op::Readdirplus { .. });
            let mut list: Vec<(u64, Vec<u8>)> =
                vec![(h.nodeid, b".".to_vec()), (1, b"..".to_vec())];
            let mut children: Vec<(u64, Vec<u8>)> = toy
                .names
                .iter()
                .filter(|((p, _), _)| *p == h.nodeid)
                .map(|((_, n), i)| (*i, n.clone()))
                .collect();
            children.sort();
            list.extend(children);
            out.start(unique);
            for (i, (ino, name)) in list.iter().enumerate().skip(*offset as usize) {
                let Some(a) = toy.attr(*ino) else { continue };
                let next = i as u64 + 1;
                let fits = if plus {
                    let dot = name == b"." || name == b"..";
                    out.direntplus(
                        *size as usize,
                        &Entry {
                            nodeid: if dot { 0 } else { *ino },
                            generation: 0,
                            entry_ttl: zero,
                            attr_ttl: zero,
                            attr: &a,
                        },
                        next,
                        name,
                    )
                } else {
                    out.dirent(*size as usize, *ino, next, a.kind, name)
                };
                if !fits {
                    break;
                }
            }
            out.finish();
        }
        Op::Lseek { offset, .. } => {
            out.start(unique).lseek(*offset);
            out.finish();
        }
        Op::Ioctl { .. } => err(out, libc::ENOTTY),
        Op::CopyFileRange { .. } | Op::Unsupported => err(out, libc::ENOSYS),
    }
    (true, Hook::None)
}

// ---------------------------------------------------------------------------------------
// The server: /dev/fuse reader, INIT, ring queues.

static DEV_REQUESTS: AtomicU64 = AtomicU64::new(0);
static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);

struct Server {
    toy: Mutex<Toy>,
    /// Where to save the first request of each opcode (record mode).
    record: Option<PathBuf>,
    recorded: Mutex<std::collections::HashSet<String>>,
    proto: Mutex<Proto>,
    /// Print a line when a hooked request parks (for the kill test).
    announce: bool,
}

fn op_name(opcode: u32) -> String {
    let names: &[(u32, &str)] = &[
        (op::FUSE_LOOKUP, "lookup"),
        (op::FUSE_FORGET, "forget"),
        (op::FUSE_GETATTR, "getattr"),
        (op::FUSE_SETATTR, "setattr"),
        (op::FUSE_READLINK, "readlink"),
        (op::FUSE_SYMLINK, "symlink"),
        (op::FUSE_MKNOD, "mknod"),
        (op::FUSE_MKDIR, "mkdir"),
        (op::FUSE_UNLINK, "unlink"),
        (op::FUSE_RMDIR, "rmdir"),
        (op::FUSE_RENAME, "rename"),
        (op::FUSE_LINK, "link"),
        (op::FUSE_OPEN, "open"),
        (op::FUSE_READ, "read"),
        (op::FUSE_WRITE, "write"),
        (op::FUSE_STATFS, "statfs"),
        (op::FUSE_RELEASE, "release"),
        (op::FUSE_FSYNC, "fsync"),
        (op::FUSE_SETXATTR, "setxattr"),
        (op::FUSE_GETXATTR, "getxattr"),
        (op::FUSE_LISTXATTR, "listxattr"),
        (op::FUSE_REMOVEXATTR, "removexattr"),
        (op::FUSE_FLUSH, "flush"),
        (op::FUSE_INIT, "init"),
        (op::FUSE_OPENDIR, "opendir"),
        (op::FUSE_READDIR, "readdir"),
        (op::FUSE_RELEASEDIR, "releasedir"),
        (op::FUSE_FSYNCDIR, "fsyncdir"),
        (op::FUSE_ACCESS, "access"),
        (op::FUSE_CREATE, "create"),
        (op::FUSE_INTERRUPT, "interrupt"),
        (op::FUSE_DESTROY, "destroy"),
        (op::FUSE_IOCTL, "ioctl"),
        (op::FUSE_BATCH_FORGET, "batch_forget"),
        (op::FUSE_FALLOCATE, "fallocate"),
        (op::FUSE_READDIRPLUS, "readdirplus"),
        (op::FUSE_RENAME2, "rename2"),
        (op::FUSE_LSEEK, "lseek"),
        (op::FUSE_COPY_FILE_RANGE, "copy_file_range"),
        (op::FUSE_STATX, "statx"),
    ];
    names
        .iter()
        .find(|(n, _)| *n == opcode)
        .map_or_else(|| format!("op{opcode}"), |(_, s)| (*s).to_string())
}

impl Server {
    fn save(&self, name: String, bytes: &[&[u8]]) {
        let Some(dir) = &self.record else { return };
        let mut done = self.recorded.lock().unwrap_or_else(|p| p.into_inner());
        if !done.insert(name.clone()) {
            return;
        }
        let mut all = Vec::new();
        for b in bytes {
            all.extend_from_slice(b);
        }
        let _ = std::fs::write(dir.join(format!("{name}.bin")), all);
    }
}

/// The ring's registration outcome, set once (None until every queue answered).
type RingReady = (Mutex<Option<Result<(), String>>>, std::sync::Condvar);

/// Everything a running mount needs to be stopped.
struct Mounted {
    mnt: PathBuf,
    user: bool,
    reader: std::thread::JoinHandle<()>,
    queues: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
    ring_ready: Arc<RingReady>,
}

fn mount(mnt: &Path, user: bool) -> Res<OwnedFd> {
    if user {
        let src = std::env::temp_dir();
        return Ok(checkpointfs::mount_with_fusermount(
            &src,
            mnt,
            false,
            &checkpointfs::MountOptions::default(),
        )?);
    }
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let dev = OwnedFd::from(dev);
    let opts = format!("fd={},rootmode=40000,user_id=0,group_id=0", dev.as_raw_fd());
    let c = |s: &[u8]| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let (source, target, fstype, data) = (
        c(b"uringproof")?,
        c(mnt.as_os_str().as_bytes())?,
        c(b"fuse.uringproof")?,
        c(opts.as_bytes())?,
    );
    // SAFETY: valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "mount {}: {}",
            mnt.display(),
            std::io::Error::last_os_error()
        )
        .into());
    }
    Ok(dev)
}

fn unmount(mnt: &Path, user: bool) {
    if user {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mnt)
            .status();
        return;
    }
    if let Ok(c) = CString::new(mnt.as_os_str().as_bytes()) {
        // SAFETY: a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Mounts at `mnt` and serves it; with `ring`, asks for FUSE over io_uring with `depth`
/// entries per queue. Returns once INIT is done and (with `ring`) every queue registered
/// or failed.
fn serve(
    server: Arc<Server>,
    mnt: &Path,
    user: bool,
    ring: bool,
    depth: usize,
    handover: bool,
) -> Res<Mounted> {
    let dev = Arc::new(File::from(mount(mnt, user)?));
    let queues = Arc::new(Mutex::new(Vec::new()));
    let ring_ready = Arc::new((Mutex::new(None), std::sync::Condvar::new()));
    let init_done = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let reader = {
        let (dev, server, queues, ring_ready, init_done) = (
            dev.clone(),
            server.clone(),
            queues.clone(),
            ring_ready.clone(),
            init_done.clone(),
        );
        std::thread::Builder::new()
            .name("dev-fuse".into())
            .spawn(move || {
                read_dev_fuse(
                    &dev,
                    &server,
                    ring,
                    depth,
                    handover,
                    &queues,
                    &ring_ready,
                    &init_done,
                )
            })?
    };
    let (lock, cv) = &*init_done;
    let mut done = lock.lock().unwrap_or_else(|p| p.into_inner());
    while !*done {
        let (d, t) = cv
            .wait_timeout(done, Duration::from_secs(10))
            .unwrap_or_else(|p| p.into_inner());
        done = d;
        if t.timed_out() && !*done {
            return Err("no INIT within 10 s".into());
        }
    }
    drop(done);
    Ok(Mounted {
        mnt: mnt.to_path_buf(),
        user,
        reader,
        queues,
        ring_ready,
    })
}

impl Mounted {
    /// The ring's registration outcome (None: the ring was not asked for).
    fn ring_status(&self, wanted: bool) -> Option<Result<(), String>> {
        if !wanted {
            return None;
        }
        let (lock, cv) = &*self.ring_ready;
        let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, Duration::from_secs(10), |s| s.is_none())
            .unwrap_or_else(|p| p.into_inner());
        Some(
            guard
                .clone()
                .unwrap_or(Err("no outcome within 10 s".into())),
        )
    }

    fn stop(self) {
        unmount(&self.mnt, self.user);
        let _ = self.reader.join();
        let queues = std::mem::take(&mut *self.queues.lock().unwrap_or_else(|p| p.into_inner()));
        for q in queues {
            let _ = q.join();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn read_dev_fuse(
    dev: &File,
    server: &Arc<Server>,
    ring: bool,
    depth: usize,
    handover: bool,
    queues: &Mutex<Vec<std::thread::JoinHandle<()>>>,
    ring_ready: &Arc<RingReady>,
    init_done: &(Mutex<bool>, std::sync::Condvar),
) {
    let mut buf = vec![0u8; MAX_WRITE as usize + 4096];
    let mut out = ReplyBuf::new();
    let mut reader: &File = dev;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOENT) | Some(libc::EAGAIN) => continue,
                _ => return, // ENODEV: unmounted
            },
        };
        let bytes = &buf[..n];
        let proto = *server.proto.lock().unwrap_or_else(|p| p.into_inner());
        let req = match decode::decode(bytes, &proto) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                if let Some(h) = e.header.filter(|h| h.expects_reply()) {
                    let _ = (&*dev).write(out.error(h.unique, libc::EIO));
                }
                continue;
            }
        };
        server.save(op_name(req.header.opcode), &[bytes]);
        DEV_REQUESTS.fetch_add(1, Ordering::Relaxed);
        if let Op::Init {
            major,
            minor,
            max_readahead,
            flags,
        } = req.op
        {
            let unique = req.header.unique;
            if major != abi::FUSE_KERNEL_VERSION || minor < abi::MIN_KERNEL_MINOR_VERSION {
                let _ = (&*dev).write(out.error(unique, libc::EPROTO));
                continue;
            }
            let minor = minor.min(abi::FUSE_KERNEL_MINOR_VERSION);
            server.proto.lock().unwrap_or_else(|p| p.into_inner()).minor = minor;
            // Queues are set up before the reply: FUSE_OVER_IO_URING is announced only if
            // every one exists, since requests then wait for the ring.
            let mut prepared = Vec::new();
            let mut why_not = None;
            if ring {
                if flags & abi::FUSE_OVER_IO_URING == 0 {
                    why_not = Some(format!(
                        "the kernel does not offer FUSE_OVER_IO_URING (enable_uring: {:?})",
                        uring::enable_uring_param()
                    ));
                } else {
                    match uring::queue_count() {
                        Ok(nq) => {
                            let size = uring::payload_size(MAX_WRITE, MAX_PAGES);
                            for qid in 0..nq {
                                match Queue::new(dev.as_fd(), qid as u16, depth, size) {
                                    Ok(q) => prepared.push(q),
                                    Err(e) => {
                                        why_not = Some(e.to_string());
                                        prepared.clear();
                                        break;
                                    }
                                }
                            }
                        }
                        Err(e) => why_not = Some(format!("no CPU count: {e}")),
                    }
                }
            }
            let use_ring = ring && why_not.is_none();
            let want = abi::FUSE_INIT_EXT
                | abi::FUSE_MAX_PAGES
                | fuser::InitFlags::FUSE_DO_READDIRPLUS.bits()
                | if use_ring { abi::FUSE_OVER_IO_URING } else { 0 };
            let got = flags & want;
            let init = abi::fuse_init_out {
                major: abi::FUSE_KERNEL_VERSION,
                minor: abi::FUSE_KERNEL_MINOR_VERSION,
                max_readahead,
                flags: got as u32,
                max_background: 16,
                congestion_threshold: 12,
                max_write: MAX_WRITE,
                time_gran: 1,
                max_pages: MAX_PAGES,
                map_alignment: 0,
                flags2: (got >> 32) as u32,
                max_stack_depth: 0,
                request_timeout: 0,
                unused: [0; 11],
            };
            out.start(unique).init(&init);
            if let Err(e) = (&*dev).write(out.finish()) {
                eprintln!("INIT reply: {e}");
                return;
            }
            if let Some(why) = &why_not {
                eprintln!("FUSE over io_uring not used: {why}; requests travel over /dev/fuse");
                *ring_ready.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(Err(why.clone()));
                ring_ready.1.notify_all();
            }
            if use_ring {
                start_queues(prepared, dev, server, handover, queues, ring_ready);
            }
            *init_done.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
            init_done.1.notify_all();
            continue;
        }
        let (reply, _hook) = handle(&server.toy, &req, &mut out);
        if reply {
            let _ = (&*dev).write(out.bytes());
        }
    }
}

fn start_queues(
    prepared: Vec<Queue>,
    dev: &File,
    server: &Arc<Server>,
    handover: bool,
    queues: &Mutex<Vec<std::thread::JoinHandle<()>>>,
    ring_ready: &Arc<RingReady>,
) {
    let total = prepared.len();
    let outcomes = Arc::new(Mutex::new(Vec::<Result<(), String>>::new()));
    let mut threads = queues.lock().unwrap_or_else(|p| p.into_inner());
    for mut q in prepared {
        let (server, outcomes, ring_ready) = (server.clone(), outcomes.clone(), ring_ready.clone());
        let dev_fd = dev.as_raw_fd();
        let spawned = std::thread::Builder::new()
            .name(format!("fuse-ring-{}", q.qid()))
            .spawn(move || {
                let _ = uring::pin_to_cpu(usize::from(q.qid()));
                let handover = handover && uring::may_hand_over();
                let registered = q.register().map_err(|e| e.to_string());
                {
                    let mut o = outcomes.lock().unwrap_or_else(|p| p.into_inner());
                    o.push(registered.clone());
                    if o.len() == total || registered.is_err() {
                        let first_err = o.iter().find(|r| r.is_err()).cloned();
                        if let Some(Err(e)) = &first_err {
                            // SAFETY: the session's /dev/fuse stays open while this thread
                            // runs (the reader holds it and joins us only at the end).
                            let dev = unsafe { BorrowedFd::borrow_raw(dev_fd) };
                            let _ = uring::force_fallback(dev);
                            eprintln!(
                                "FUSE over io_uring not used: {e}; requests travel over /dev/fuse"
                            );
                        }
                        let mut s = ring_ready.0.lock().unwrap_or_else(|p| p.into_inner());
                        if s.is_none() {
                            *s = Some(first_err.unwrap_or(Ok(())));
                        }
                        ring_ready.1.notify_all();
                    }
                }
                if registered.is_err() {
                    return;
                }
                serve_queue(&mut q, &server, handover);
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => eprintln!("queue thread: {e}"),
        }
    }
}

fn serve_queue(q: &mut Queue, server: &Server, handover: bool) {
    let mut out = ReplyBuf::new();
    loop {
        let idx = match q.wait_request() {
            Ok(Next::Request(idx)) => idx,
            Ok(Next::Ended) => return,
            Err(e) => {
                eprintln!("queue {}: {e}", q.qid());
                return;
            }
        };
        let proto = *server.proto.lock().unwrap_or_else(|p| p.into_inner());
        let (unique, hook, wakes) = {
            let req = match q.request(idx, &proto) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("{e}");
                    let unique = e.header.map_or(0, |h| h.unique);
                    out.error(unique, libc::EIO);
                    let _ = q.commit(idx, unique, &mut out);
                    continue;
                }
            };
            RING_REQUESTS.fetch_add(1, Ordering::Relaxed);
            if server.record.is_some() {
                // A recorded ring request: the whole fuse_uring_req_header, then the payload.
                let (h, p) = q.raw(idx);
                server.save(format!("ring-{}", op_name(req.header.opcode)), &[h, p]);
            }
            let (_, hook) = handle(&server.toy, &req, &mut out);
            let wakes = !matches!(req.op, Op::Release { .. } | Op::Releasedir { .. });
            (req.header.unique, hook, wakes)
        };
        if hook != Hook::None {
            if server.announce {
                println!(
                    "{} qid={} unique={unique}",
                    if hook == Hook::Block {
                        "IN-DAEMON"
                    } else {
                        "AWAITING-COMMIT"
                    },
                    q.qid()
                );
                let _ = std::io::stdout().flush();
            }
            loop {
                std::thread::park();
            }
        }
        if let Err(e) = q.commit(idx, unique, &mut out) {
            eprintln!("queue {}: {e}", q.qid());
            return;
        }
        let submitted = if handover && wakes {
            q.submit_handing_over()
        } else {
            q.submit()
        };
        if let Err(e) = submitted {
            eprintln!("queue {}: {e}", q.qid());
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Callers and measurements.

fn getxattr(path: &Path, name: &str) -> Result<usize, i32> {
    let p = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    let n = CString::new(name).map_err(|_| libc::EINVAL)?;
    let mut buf = [0u8; 64];
    // SAFETY: valid strings and a writable buffer of the given length.
    let rc = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(rc as usize)
    }
}

/// Median and mean µs of `iters` getxattr round trips on `path` (each → ENODATA).
fn time_roundtrip(path: &Path, iters: usize) -> (f64, f64) {
    for _ in 0..iters / 10 {
        let _ = getxattr(path, "user.none");
    }
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let r = getxattr(path, "user.none");
        times.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r, Err(libc::ENODATA));
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    times.sort_by(|a, b| a.total_cmp(b));
    (times[times.len() / 2], mean)
}

struct Flags {
    args: Vec<String>,
}

impl Flags {
    fn value(&self, name: &str) -> Option<String> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).cloned()
    }

    fn has(&self, name: &str) -> bool {
        self.args.iter().any(|a| a == name)
    }
}

fn new_server(record: Option<PathBuf>, announce: bool) -> Arc<Server> {
    Arc::new(Server {
        toy: Mutex::new(Toy::new()),
        record,
        recorded: Mutex::new(Default::default()),
        proto: Mutex::new(Proto::default()),
        announce,
    })
}

fn scratch_mnt(flags: &Flags, name: &str) -> Res<PathBuf> {
    let mnt = flags
        .value("--mnt")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(name));
    std::fs::create_dir_all(&mnt)?;
    Ok(mnt)
}

fn proof(flags: &Flags) -> Res<()> {
    let mnt = scratch_mnt(flags, "uring-proof-mnt")?;
    let user = flags.has("--user");
    let iters: usize = flags
        .value("--iters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let rounds: usize = flags
        .value("--rounds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // --pin CPU: the timing caller stays on one CPU (so on one ring queue).
    let pin: Option<usize> = flags.value("--pin").and_then(|v| v.parse().ok());
    println!(
        "enable_uring: {:?}; queues (possible CPUs): {}; euid {}",
        uring::enable_uring_param(),
        uring::queue_count()?,
        // SAFETY: no preconditions.
        unsafe { libc::geteuid() }
    );
    // 1. Functional check over the ring.
    {
        let server = new_server(None, false);
        let m = serve(server, &mnt, user, true, 2, true)?;
        let status = m.ring_status(true);
        println!("ring registration: {status:?}");
        let before = (
            DEV_REQUESTS.load(Ordering::Relaxed),
            RING_REQUESTS.load(Ordering::Relaxed),
        );
        let root = std::fs::metadata(&mnt);
        let missing = std::fs::symlink_metadata(mnt.join("no-such-name"));
        let after = (
            DEV_REQUESTS.load(Ordering::Relaxed),
            RING_REQUESTS.load(Ordering::Relaxed),
        );
        println!(
            "GETATTR of the root: {}; LOOKUP of a missing name: {}; requests served: /dev/fuse +{}, ring +{}",
            match &root {
                Ok(md) => format!(
                    "ok (dir: {}, mode {:o})",
                    md.is_dir(),
                    std::os::unix::fs::PermissionsExt::mode(&md.permissions())
                ),
                Err(e) => format!("error {e}"),
            },
            match &missing {
                Ok(_) => "found (wrong)".to_string(),
                Err(e) => format!("{e}"),
            },
            after.0 - before.0,
            after.1 - before.1
        );
        m.stop();
    }
    // 2. Round trips, alternating transports each round.
    let modes: [(&str, bool, bool); 3] = [
        ("/dev/fuse", false, false),
        ("io_uring", true, false),
        ("io_uring + SCHED_IDLE hand-over", true, true),
    ];
    let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); modes.len()];
    for round in 0..rounds {
        for k in 0..modes.len() {
            let i = (k + round) % modes.len();
            let (name, ring, handover) = modes[i];
            let server = new_server(None, false);
            let m = serve(server, &mnt, user, ring, 2, handover)?;
            if let Some(Err(e)) = m.ring_status(ring) {
                println!("{name}: ring not in use ({e})");
            }
            let before = (
                DEV_REQUESTS.load(Ordering::Relaxed),
                RING_REQUESTS.load(Ordering::Relaxed),
            );
            if let Some(cpu) = pin {
                uring::pin_to_cpu(cpu)?;
            }
            let r = time_roundtrip(&mnt.join("f"), iters);
            let after = (
                DEV_REQUESTS.load(Ordering::Relaxed),
                RING_REQUESTS.load(Ordering::Relaxed),
            );
            println!(
                "round {round} {name}: median {:.2} us, mean {:.2} us ({} via /dev/fuse, {} via ring)",
                r.0,
                r.1,
                after.0 - before.0,
                after.1 - before.1
            );
            results[i].push(r);
            m.stop();
        }
    }
    println!(
        "\ngetxattr round trip, {iters} calls a round, median of the {rounds} rounds' medians:"
    );
    let med = |v: &Vec<(f64, f64)>| {
        let mut m: Vec<f64> = v.iter().map(|r| r.0).collect();
        m.sort_by(|a, b| a.total_cmp(b));
        m[m.len() / 2]
    };
    let base = med(&results[0]);
    for (i, (name, _, _)) in modes.iter().enumerate() {
        let m = med(&results[i]);
        println!("  {name:34} {m:7.2} us  ({:.2}x /dev/fuse)", m / base);
    }
    Ok(())
}

fn record(flags: &Flags) -> Res<()> {
    let dir = PathBuf::from(flags.args.get(1).ok_or("record DIR")?);
    std::fs::create_dir_all(&dir)?;
    let mnt = scratch_mnt(flags, "uring-record-mnt")?;
    for ring in [false, true] {
        let server = new_server(Some(dir.clone()), false);
        let m = serve(server, &mnt, false, ring, 1, false)?;
        if let Some(Err(e)) = m.ring_status(ring) {
            return Err(format!("ring: {e}").into());
        }
        workload(&mnt)?;
        m.stop();
    }
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    println!(
        "recorded {} requests in {}: {names:?}",
        names.len(),
        dir.display()
    );
    Ok(())
}

/// Touches every opcode the adapter serves.
fn workload(mnt: &Path) -> Res<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
    let d = mnt.join("dir");
    std::fs::create_dir(&d)?; // LOOKUP, MKDIR
    let f = mnt.join("file");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o640)
        .open(&f)?; // CREATE
    file.write_all_at(b"hello, ring", 3)?; // WRITE
    let mut buf = [0u8; 32];
    let _ = file.read_at(&mut buf, 0)?; // READ
    file.sync_all()?; // FSYNC
    // SAFETY: a valid fd; fallocate and lseek change only this toy mount's file.
    unsafe {
        libc::fallocate(file.as_raw_fd(), 0, 0, 4096); // FALLOCATE
        libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA); // LSEEK
        libc::ioctl(file.as_raw_fd(), libc::FIONREAD, &mut 0i32 as *mut i32); // IOCTL
    }
    drop(file); // FLUSH, RELEASE
    let _ = std::fs::File::open(&f)?; // OPEN
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))?; // SETATTR
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap_or_default();
    let (cf, name) = (c(&f), CString::new("user.test").unwrap_or_default());
    let mut list = [0u8; 256];
    // SAFETY: valid strings and buffers.
    unsafe {
        libc::lsetxattr(cf.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0); // SETXATTR
        libc::lgetxattr(
            cf.as_ptr(),
            name.as_ptr(),
            list.as_mut_ptr().cast(),
            list.len(),
        ); // GETXATTR
        libc::llistxattr(cf.as_ptr(), list.as_mut_ptr().cast(), list.len()); // LISTXATTR
        libc::lremovexattr(cf.as_ptr(), name.as_ptr()); // REMOVEXATTR
        libc::access(cf.as_ptr(), libc::R_OK); // ACCESS (no default_permissions)
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(cf.as_ptr(), &mut st); // STATFS
    }
    std::os::unix::fs::symlink("file", mnt.join("link"))?; // SYMLINK
    let _ = std::fs::read_link(mnt.join("link"))?; // READLINK
    std::fs::hard_link(&f, mnt.join("hard"))?; // LINK
    std::fs::rename(mnt.join("hard"), d.join("moved"))?; // RENAME
    let cfifo = c(&mnt.join("fifo"));
    // SAFETY: a valid path string.
    unsafe { libc::mknod(cfifo.as_ptr(), libc::S_IFIFO | 0o600, 0) }; // MKNOD
    let _ = std::fs::read_dir(mnt)?.count(); // OPENDIR, READDIRPLUS, RELEASEDIR
    let dirf = std::fs::File::open(mnt)?;
    dirf.sync_all()?; // FSYNCDIR
    drop(dirf);
    let other = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(mnt.join("copy"))?;
    let src = std::fs::File::open(&f)?;
    // SAFETY: valid fds, null offsets (use the file positions).
    unsafe {
        libc::copy_file_range(
            src.as_raw_fd(),
            std::ptr::null_mut(),
            other.as_raw_fd(),
            std::ptr::null_mut(),
            4,
            0,
        ); // COPY_FILE_RANGE
        let renamed = c(&mnt.join("copy2"));
        let from = c(&mnt.join("copy"));
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            renamed.as_ptr(),
            libc::RENAME_NOREPLACE,
        ); // RENAME2
    }
    drop((src, other));
    std::fs::remove_file(mnt.join("link"))?; // UNLINK
    std::fs::remove_dir(mnt.join("dir")).ok(); // RMDIR (not empty in the toy: answered anyway)
    std::fs::remove_dir(&d).ok();
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The kill test.

/// `serve` subcommand: serve the ring with depth 1 until killed; prints READY.
fn serve_forever(flags: &Flags) -> Res<()> {
    let mnt = scratch_mnt(flags, "uring-kill-mnt")?;
    let server = new_server(None, true);
    let m = serve(server, &mnt, false, true, 1, false)?;
    match m.ring_status(true) {
        Some(Ok(())) => println!("READY"),
        other => println!("NO-RING {other:?}"),
    }
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}

/// `call CPU PATH NAME`: pinned to CPU, one getxattr; prints its outcome.
fn call(flags: &Flags) -> Res<()> {
    let cpu: usize = flags.args.get(1).ok_or("call CPU PATH NAME")?.parse()?;
    let path = PathBuf::from(flags.args.get(2).ok_or("PATH")?);
    let name = flags.args.get(3).ok_or("NAME")?;
    uring::pin_to_cpu(cpu)?;
    let r = getxattr(&path, name);
    println!("{r:?}");
    Ok(())
}

fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim().chars().next()
}

/// Waits up to `limit` for `child` to exit; its exit time or None.
fn exits_within(child: &mut Child, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok(Some(_)) = child.try_wait() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory preconditions; the pids are our own children.
    unsafe { libc::kill(pid as i32, sig) };
}

fn read_line_with(child: &mut Child, want: &str, limit: Duration) -> Res<String> {
    let out = child.stdout.as_mut().ok_or("no stdout")?;
    let fd = out.as_raw_fd();
    let t = Instant::now();
    let mut acc = Vec::new();
    while t.elapsed() < limit {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } > 0 {
            let mut b = [0u8; 256];
            let n = out.read(&mut b)?;
            if n == 0 {
                break;
            }
            acc.extend_from_slice(&b[..n]);
            if let Some(line) = String::from_utf8_lossy(&acc)
                .lines()
                .find(|l| l.contains(want))
            {
                return Ok(line.to_string());
            }
        }
    }
    Err(format!(
        "no {want:?} from the server within {limit:?} (got {:?})",
        String::from_utf8_lossy(&acc)
    )
    .into())
}

fn kill_test(flags: &Flags) -> Res<()> {
    if uring::enable_uring_param() != Some(true) {
        return Err("enable_uring is off: nothing to test".into());
    }
    // A private mount namespace: fusectl mounted here, and the toy mount, vanish with us.
    // SAFETY: unshare/mount with valid arguments; this process is single-threaded here.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(format!("unshare: {}", std::io::Error::last_os_error()).into());
        }
        let root = CString::new("/")?;
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        let (none, ctl, ty) = (
            CString::new("fusectl")?,
            CString::new("/sys/fs/fuse/connections")?,
            CString::new("fusectl")?,
        );
        libc::mount(
            none.as_ptr(),
            ctl.as_ptr(),
            ty.as_ptr(),
            0,
            std::ptr::null(),
        );
    }
    let me = std::env::current_exe()?;
    let mnt = scratch_mnt(flags, "uring-kill-mnt")?;
    let mut failures = 0;
    for scenario in ["kill -9", "SIGSTOP + abort"] {
        println!("--- {scenario} ---");
        let mut server = Command::new(&me)
            .args(["serve", "--mnt"])
            .arg(&mnt)
            .stdout(Stdio::piped())
            .spawn()?;
        read_line_with(&mut server, "READY", Duration::from_secs(10))?;
        let mountinfo = std::fs::read("/proc/self/mountinfo")?;
        let (major, minor) =
            checkpointfs::mount_dev(&mountinfo, &mnt).ok_or("mount not in mountinfo")?;
        let conn = checkpointfs::connection_name(major, minor);
        let f = mnt.join("f");
        let spawn_call = |cpu: &str, name: &str| {
            Command::new(&me)
                .args(["call", cpu])
                .arg(&f)
                .arg(name)
                .stdout(Stdio::null())
                .spawn()
        };
        // In the daemon: queue 0's only entry, parked in the handler.
        let mut in_daemon = spawn_call("0", "user.block")?;
        read_line_with(&mut server, "IN-DAEMON", Duration::from_secs(5))?;
        // Awaiting commit: queue 1's only entry, reply built, commit never sent.
        let mut awaiting = spawn_call("1", "user.nocommit")?;
        read_line_with(&mut server, "AWAITING-COMMIT", Duration::from_secs(5))?;
        // Queued: CPU 0's queue has no free entry.
        let mut queued = spawn_call("0", "user.other")?;
        std::thread::sleep(Duration::from_millis(300));
        println!(
            "states: in daemon {:?}, awaiting commit {:?}, queued {:?}",
            proc_state(in_daemon.id()),
            proc_state(awaiting.id()),
            proc_state(queued.id())
        );
        // SIGKILL every caller: the queued one ends; the two whose request the daemon holds
        // wait uninterruptibly for a reply (the hazard the watchdog exists for).
        for c in [&in_daemon, &awaiting, &queued] {
            signal(c.id(), libc::SIGKILL);
        }
        let q = exits_within(&mut queued, Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(500));
        let (d_alive, a_alive) = (
            in_daemon.try_wait()?.is_none(),
            awaiting.try_wait()?.is_none(),
        );
        println!(
            "after SIGKILL of the callers: queued one {}; in daemon {} (state {:?}); awaiting commit {} (state {:?})",
            q.map_or("still alive".to_string(), |t| format!("ended in {t:?}")),
            if d_alive { "still alive" } else { "ended" },
            proc_state(in_daemon.id()),
            if a_alive { "still alive" } else { "ended" },
            proc_state(awaiting.id()),
        );
        if q.is_none() {
            failures += 1;
        }
        let t = Instant::now();
        if scenario == "kill -9" {
            signal(server.id(), libc::SIGKILL);
        } else {
            signal(server.id(), libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(300));
            // What the watchdog does after STOPPED_BOUND.
            std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), "1")?;
        }
        let d = exits_within(&mut in_daemon, Duration::from_secs(5));
        let a = exits_within(&mut awaiting, Duration::from_secs(5));
        println!(
            "after {scenario} of the server: in-daemon caller {}, awaiting-commit caller {} (from the signal)",
            d.map_or("STILL STUCK".into(), |_| format!(
                "ended at {:?}",
                t.elapsed()
            )),
            a.map_or("STILL STUCK".into(), |_| format!(
                "ended at {:?}",
                t.elapsed()
            )),
        );
        if d.is_none() || a.is_none() {
            failures += 1;
        }
        // A new caller on the dead mount gets an error at once.
        let new = getxattr(&f, "user.none");
        println!(
            "a new request on the dead mount: {:?}",
            new.map_err(std::io::Error::from_raw_os_error)
        );
        signal(server.id(), libc::SIGCONT);
        signal(server.id(), libc::SIGKILL);
        let _ = server.wait();
        for c in [&mut in_daemon, &mut awaiting, &mut queued] {
            let _ = c.kill();
            let _ = c.wait();
        }
        unmount(&mnt, false);
    }
    if failures > 0 {
        return Err(format!("{failures} check(s) failed").into());
    }
    println!("kill test: every caller ended");
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flags = Flags { args };
    let r = match flags.args.first().map(String::as_str) {
        None | Some("proof") => proof(&flags),
        Some("record") => record(&flags),
        Some("kill-test") => kill_test(&flags),
        Some("serve") => serve_forever(&flags),
        Some("call") => call(&flags),
        Some(other) => {
            Err(format!("unknown subcommand {other:?} (proof, record, kill-test)").into())
        }
    };
    if let Err(e) = r {
        eprintln!("uring_proof: {e}");
        std::process::exit(1);
    }
}
