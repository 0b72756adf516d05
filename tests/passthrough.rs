//! The passthrough behaves like the directory underneath: every operation through MNT, checked
//! in SRC, in both IO modes (kernel passthrough and `--no-passthrough`).
mod common;

use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use common::{TestMount, run, stderr, stdout, tree_listing};

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn with_kernel_passthrough() {
                super::$name(&[]);
            }
            #[test]
            fn without_passthrough() {
                super::$name(&["--no-passthrough"]);
            }
        }
    };
}

fn file_io(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("f");
    fs::write(&p, b"hello world").unwrap();
    assert_eq!(fs::read(m.src.join("f")).unwrap(), b"hello world");
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    f.write_at(b"HELLO", 0).unwrap();
    let mut buf = [0u8; 5];
    f.read_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world");
    drop(f);
    let mut a = fs::OpenOptions::new().append(true).open(&p).unwrap();
    a.write_all(b"!").unwrap();
    drop(a);
    assert_eq!(fs::read(m.src.join("f")).unwrap(), b"HELLO world!");
    // O_EXCL on an existing name
    let err = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    // O_TRUNC
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(m.src.join("f")).unwrap().len(), 0);
    // 64 MiB round trip
    let big: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    fs::write(m.mnt.join("big"), &big).unwrap();
    assert!(fs::read(m.mnt.join("big")).unwrap() == big);
    assert!(fs::read(m.src.join("big")).unwrap() == big);
    // sparse file: holes and data where SRC has them
    let mut s = fs::File::create(m.mnt.join("sparse")).unwrap();
    s.seek(SeekFrom::Start(8 << 20)).unwrap();
    s.write_all(b"tail").unwrap();
    s.sync_all().unwrap();
    let data = unsafe { libc::lseek(s.as_raw_fd(), 0, libc::SEEK_DATA) };
    let src = fs::File::open(m.src.join("sparse")).unwrap();
    let src_data = unsafe { libc::lseek(src.as_raw_fd(), 0, libc::SEEK_DATA) };
    assert_eq!(data, src_data);
    assert_eq!(unsafe { libc::lseek(s.as_raw_fd(), 0, libc::SEEK_HOLE) }, 0);
    // fallocate, punch hole
    let rc = unsafe { libc::fallocate(s.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(rc, 0);
    let rc = unsafe {
        libc::fallocate(
            s.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4096,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(
        fs::metadata(m.src.join("sparse")).unwrap().len(),
        (8 << 20) + 4
    );
    // copy_file_range between two files in the mount
    let from = fs::File::open(m.mnt.join("big")).unwrap();
    let to = fs::File::create(m.mnt.join("copy")).unwrap();
    let (mut oi, mut oo) = (0i64, 0i64);
    let n = unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut oi,
            to.as_raw_fd(),
            &mut oo,
            1 << 20,
            0,
        )
    };
    assert_eq!(n, 1 << 20);
    to.sync_data().unwrap();
    assert_eq!(fs::read(m.src.join("copy")).unwrap(), &big[..1 << 20]);
    fs::File::open(&m.mnt).unwrap().sync_all().unwrap();
}
both_modes!(file_io);

fn attributes(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("a");
    fs::write(&p, b"0123456789").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(m.src.join("a")).unwrap().mode() & 0o7777,
        0o640
    );
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    let st = fs::metadata(m.src.join("a")).unwrap();
    assert_eq!((st.uid(), st.gid()), (65534, 65534));
    // truncate by path and by fd
    assert_eq!(unsafe { libc::truncate(c(&p).as_ptr(), 4) }, 0);
    assert_eq!(fs::metadata(m.src.join("a")).unwrap().len(), 4);
    let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(2).unwrap();
    assert_eq!(fs::metadata(m.src.join("a")).unwrap().len(), 2);
    // utimensat: a specific mtime, UTIME_OMIT for atime; then futimens UTIME_NOW
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123,
        },
    ];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c(&p).as_ptr(), times.as_ptr(), 0) },
        0
    );
    let st = fs::metadata(m.src.join("a")).unwrap();
    assert_eq!((st.mtime(), st.mtime_nsec()), (1_000_000_000, 123));
    assert_eq!(fs::metadata(&p).unwrap().mtime(), 1_000_000_000);
    let now = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    assert_eq!(unsafe { libc::futimens(f.as_raw_fd(), now.as_ptr()) }, 0);
    assert!(fs::metadata(m.src.join("a")).unwrap().mtime() > 1_000_000_000);
    // xattrs
    let name = CString::new("user.k").unwrap();
    assert_eq!(
        unsafe { libc::setxattr(c(&p).as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0) },
        0
    );
    let mut buf = [0u8; 16];
    let n = unsafe {
        libc::getxattr(
            c(&m.src.join("a")).as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            16,
        )
    };
    assert_eq!(&buf[..n as usize], b"v1");
    let n = unsafe { libc::getxattr(c(&p).as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(n, 2);
    let n = unsafe { libc::listxattr(c(&p).as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert!(buf[..n as usize].starts_with(b"user.k\0"));
    assert_eq!(
        unsafe { libc::removexattr(c(&p).as_ptr(), name.as_ptr()) },
        0
    );
    let n = unsafe { libc::getxattr(c(&p).as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENODATA)
    );
    // statfs agrees with SRC's filesystem
    let mut a: libc::statvfs = unsafe { std::mem::zeroed() };
    let mut b: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c(&m.mnt).as_ptr(), &mut a) }, 0);
    assert_eq!(unsafe { libc::statvfs(c(&m.src).as_ptr(), &mut b) }, 0);
    assert_eq!((a.f_blocks, a.f_bsize), (b.f_blocks, b.f_bsize));
    assert_eq!(unsafe { libc::access(c(&p).as_ptr(), libc::R_OK) }, 0);
}
both_modes!(attributes);

fn namespace(args: &[&str]) {
    let m = TestMount::with_args(args);
    let mnt = &m.mnt;
    fs::create_dir(mnt.join("d")).unwrap();
    fs::write(mnt.join("d/x"), b"x").unwrap();
    assert_eq!(
        fs::remove_dir(mnt.join("d")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::rename(mnt.join("d/x"), mnt.join("y")).unwrap();
    assert!(m.src.join("y").exists() && !m.src.join("d/x").exists());
    fs::write(mnt.join("z"), b"z").unwrap();
    fs::rename(mnt.join("z"), mnt.join("y")).unwrap();
    assert_eq!(fs::read(m.src.join("y")).unwrap(), b"z");
    fs::write(mnt.join("a"), b"A").unwrap();
    let rn = |from: &str, to: &str, flags: u32| unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c(&mnt.join(from)).as_ptr(),
            libc::AT_FDCWD,
            c(&mnt.join(to)).as_ptr(),
            flags,
        )
    };
    assert_eq!(rn("a", "y", libc::RENAME_NOREPLACE), -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(rn("a", "y", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(m.src.join("a")).unwrap(), b"z");
    assert_eq!(fs::read(m.src.join("y")).unwrap(), b"A");
    // hard links: one inode through the mount, nlink in both views
    fs::hard_link(mnt.join("a"), mnt.join("a2")).unwrap();
    let (s1, s2) = (
        fs::metadata(mnt.join("a")).unwrap(),
        fs::metadata(mnt.join("a2")).unwrap(),
    );
    assert_eq!((s1.ino(), s1.nlink()), (s2.ino(), 2));
    assert_eq!(fs::metadata(m.src.join("a2")).unwrap().nlink(), 2);
    symlink("a", mnt.join("l")).unwrap();
    assert_eq!(fs::read_link(m.src.join("l")).unwrap(), Path::new("a"));
    assert_eq!(fs::read(mnt.join("l")).unwrap(), b"z");
    // fifo, socket, char device
    assert_eq!(
        unsafe { libc::mkfifo(c(&mnt.join("fifo")).as_ptr(), 0o644) },
        0
    );
    let _sock = std::os::unix::net::UnixListener::bind(mnt.join("sock")).unwrap();
    let dev = unsafe {
        libc::mknod(
            c(&mnt.join("null")).as_ptr(),
            libc::S_IFCHR | 0o644,
            libc::makedev(1, 3),
        )
    };
    assert_eq!(dev, 0);
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(m.src.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(
        fs::symlink_metadata(m.src.join("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert_eq!(
        fs::symlink_metadata(m.src.join("null")).unwrap().rdev(),
        libc::makedev(1, 3)
    );
    fs::remove_file(mnt.join("a2")).unwrap();
    assert!(!m.src.join("a2").exists());
    fs::remove_dir(mnt.join("d")).unwrap();
    assert_eq!(tree_listing(mnt), tree_listing(&m.src));
}
both_modes!(namespace);

fn inodes_follow_renames_and_survive_unlink(args: &[&str]) {
    let m = TestMount::with_args(args);
    fs::create_dir_all(m.mnt.join("g/p")).unwrap();
    let mut f = fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.mnt.join("g/p/f"))
        .unwrap();
    f.write_all(b"one ").unwrap();
    fs::rename(m.mnt.join("g/p"), m.mnt.join("g/q")).unwrap();
    fs::rename(m.mnt.join("g"), m.mnt.join("h")).unwrap();
    f.write_all(b"two").unwrap();
    f.flush().unwrap();
    assert_eq!(fs::read(m.mnt.join("h/q/f")).unwrap(), b"one two");
    fs::write(m.mnt.join("h/q/f2"), b"new path works").unwrap();
    assert_eq!(fs::read(m.src.join("h/q/f2")).unwrap(), b"new path works");
    fs::remove_file(m.mnt.join("h/q/f")).unwrap();
    f.write_all(b" three").unwrap();
    let mut back = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "one two three");
    // Make the kernel forget everything, then use the tree again.
    for i in 0..200 {
        fs::write(m.mnt.join(format!("h/n{i}")), format!("{i}")).unwrap();
    }
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    for i in 0..200 {
        assert_eq!(
            fs::read_to_string(m.mnt.join(format!("h/n{i}"))).unwrap(),
            format!("{i}")
        );
    }
    // A big directory lists every name exactly once (readdir and readdirplus paths).
    fs::create_dir(m.mnt.join("big")).unwrap();
    for i in 0..2000 {
        fs::write(m.mnt.join(format!("big/e{i:04}")), b"").unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.mnt.join("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut want: Vec<String> = fs::read_dir(m.src.join("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    want.sort();
    assert_eq!(names.len(), 2000);
    assert_eq!(names, want);
    let out = run("ls", &["-f", "big"], &m.mnt);
    assert_eq!(stdout(&out).lines().count(), 2002);
}
both_modes!(inodes_follow_renames_and_survive_unlink);

fn real_tools(args: &[&str]) {
    let m = TestMount::with_args(args);
    let sh = |script: &str| {
        let out = run("sh", &["-c", script], &m.mnt);
        assert!(out.status.success(), "{script}: {}", stderr(&out));
        stdout(&out)
    };
    let orig = tempfile::tempdir().unwrap();
    let o = orig.path().display().to_string();
    let out = run(
        "sh",
        &[
            "-c",
            &format!(
                "mkdir -p {o}/t/sub && echo a > {o}/t/a && printf 'b\\n' > {o}/t/sub/b && ln -s a {o}/t/l && chmod 751 {o}/t/sub"
            ),
        ],
        Path::new("/"),
    );
    assert!(out.status.success());
    sh(&format!("cp -a {o}/t copy && diff -r {o}/t copy"));
    sh(&format!(
        "tar -C {o} -cf - t | tar -xf - -C . --transform s/^t/untarred/ && diff -r {o}/t untarred"
    ));
    sh("sed -i 's/a/sed-was-here/' copy/a && grep -q sed-was-here copy/a");
    sh(
        "python3 -c \"import os; open('tmp.w','w').write('atomic'); os.replace('tmp.w','target.txt')\"",
    );
    assert_eq!(
        fs::read_to_string(m.src.join("target.txt")).unwrap(),
        "atomic"
    );
    sh(
        "git init -q repo && cd repo && echo hi > f && git add f && git -c user.name=t -c user.email=t@t commit -qm one && echo more >> f && touch new",
    );
    let through = sh("cd repo && git status --porcelain");
    let direct = run("git", &["status", "--porcelain"], &m.src.join("repo"));
    assert_eq!(through, stdout(&direct));
    assert_eq!(through, " M f\n?? new\n");
    // .checkpoint is found but not listed; find and grep -r do not descend into it.
    assert!(!sh("ls -a").contains(".checkpoint"));
    assert!(!sh("find .").contains(".checkpoint"));
    assert!(sh("stat -c %F .checkpoint").contains("directory"));
    assert!(run("mkdir", &[".checkpoint/x"], &m.mnt).status.code() != Some(0));
    assert_eq!(
        fs::remove_dir(m.mnt.join(".checkpoint"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EPERM)
    );
}
both_modes!(real_tools);

#[test]
fn files_created_by_another_user_belong_to_that_user() {
    let m = TestMount::with_args(&["--allow-other"]);
    fs::create_dir(m.mnt.join("shared")).unwrap();
    fs::set_permissions(m.mnt.join("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(m.mnt.join("rootfile"), b"root").unwrap();
    let as_nobody = |script: &str| {
        run(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                script,
            ],
            &m.mnt,
        )
    };
    let out = as_nobody("echo mine > shared/f && mkdir shared/d");
    assert!(out.status.success(), "{}", stderr(&out));
    for p in ["shared/f", "shared/d"] {
        let st = fs::metadata(m.src.join(p)).unwrap();
        assert_eq!((st.uid(), st.gid()), (65534, 65534), "{p}");
    }
    let out = as_nobody("echo x >> rootfile");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(m.src.join("rootfile")).unwrap(), b"root");
}

#[test]
fn a_checkpoint_entry_in_src_is_shadowed_with_a_warning() {
    let mut m = TestMount::unmounted(&[]);
    fs::create_dir(m.src.join(".checkpoint")).unwrap();
    fs::write(m.src.join(".checkpoint/mine"), b"keep").unwrap();
    m.mount();
    assert!(
        m.daemon_log().contains("hidden under the mount"),
        "{}",
        m.daemon_log()
    );
    assert!(!m.mnt.join(".checkpoint/mine").exists());
    assert!(m.mnt.join(".checkpoint/ctl").exists());
    m.umount();
    assert_eq!(fs::read(m.src.join(".checkpoint/mine")).unwrap(), b"keep");
}

#[test]
fn debug_logging_shows_every_mutation_through_the_gate() {
    let mut m = TestMount::unmounted(&[]);
    m.set_env("RUST_LOG", "checkpointfs=debug");
    m.mount();
    fs::write(m.mnt.join("logged.txt"), b"x").unwrap();
    fs::remove_file(m.mnt.join("logged.txt")).unwrap();
    let log = m.daemon_log();
    assert!(log.contains("gate:") && log.contains("logged.txt"), "{log}");
}
