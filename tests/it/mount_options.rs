//! Kernel mount options on real mounts (`checkpointfs mount -o ...`): ro, noexec, dev,
//! suid, noatime/strictatime, remount ro/rw through mount(8), a refused option, and a mount
//! right after a plain umount(8) (it waits for the old daemon instead of refusing).
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::ffi::CString;
use std::fs;
use std::io::{BufRead, BufReader, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use common::*;

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// `mount SRC MNT --state-dir STATE -o OPTS` for `m`.
fn mount_args<'a>(m: &'a TestMount, opts: &'a str) -> Vec<&'a std::ffi::OsStr> {
    vec![
        "mount".as_ref(),
        m.src.as_os_str(),
        m.mnt.as_os_str(),
        "--state-dir".as_ref(),
        m.state.as_os_str(),
        "-o".as_ref(),
        opts.as_ref(),
    ]
}

#[test]
fn an_unknown_option_is_refused_and_nothing_is_mounted() {
    let m = TestMount::unmounted(&[]);
    let out = cli(&mount_args(&m, "ro,bogus"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("unknown mount option 'bogus'"), "{err}");
    assert!(
        err.contains("strictatime") && err.contains("nosuid"),
        "{err}"
    );
    assert!(!is_mount_point(&m.mnt));
    assert!(!m.state.join("daemon.pid").exists(), "no daemon started");
}

#[test]
fn ro_refuses_writes_but_reads_checkpoints_and_views_work() {
    let mut m = TestMount::unmounted(&["-o", "ro"]);
    fs::write(m.src.join("f"), "one\n").unwrap();
    m.mount();
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "one\n");
    let e = fs::write(m.mnt.join("f"), "two\n").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS, "{e}");
    let e = fs::write(m.mnt.join("new"), "x").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS, "{e}");
    let e = fs::create_dir(m.mnt.join("d")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS, "{e}");
    assert!(!m.src.join("new").exists());

    // The ctl file cannot be opened for writing, but the CLI checkpoints anyway.
    assert_eq!(errno_of(&m.ctl("c0").unwrap_err()), libc::EROFS);
    let out = cli(&["checkpoint", m.mnt.to_str().unwrap(), "c1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "checkpoint c1\n");
    let log = cli_ok(&["log", m.mnt.to_str().unwrap()]);
    assert!(log.contains("c1"), "{log}");
    assert_eq!(fs::read_to_string(at(&m, "c1").join("f")).unwrap(), "one\n");

    let out = cli(&["rewind", m.mnt.to_str().unwrap(), "c1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("mounted read-only"),
        "{}",
        stderr(&out)
    );
    let status = cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(
        status.contains("mount options:  ro,nodev,nosuid,exec,atime\n"),
        "{status}"
    );
    assert!(
        m.daemon_log()
            .contains("mount options: ro,nodev,nosuid,exec,atime")
    );
}

fn write_script(path: &Path) {
    fs::write(path, "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn noexec_refuses_exec_and_the_default_allows_it() {
    let mut m = TestMount::unmounted(&[]);
    write_script(&m.src.join("s.sh"));
    m.mount();
    let out = run(m.mnt.join("s.sh"), &[] as &[&str], Path::new("/"));
    assert_eq!(stdout(&out), "ran\n");
    m.umount();
    m.set_args(&["-o", "noexec"]);
    m.mount();
    let e = Command::new(m.mnt.join("s.sh")).output().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
}

#[test]
fn device_nodes_open_only_with_dev() {
    let mut m = TestMount::unmounted(&[]);
    let node = CString::new(m.src.join("null").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; creates a char device like /dev/null (1:3).
    let rc = unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
    m.mount();
    let e = fs::File::open(m.mnt.join("null")).unwrap_err();
    assert_eq!(errno_of(&e), libc::EACCES, "nodev by default: {e}");
    m.umount();
    m.set_args(&["-o", "dev"]);
    m.mount();
    let data = fs::read(m.mnt.join("null")).expect("opens with -o dev");
    assert!(data.is_empty());
    fs::write(m.mnt.join("null"), "discarded").expect("writes to the device");
    assert!(cli_ok(&["status", m.mnt.to_str().unwrap()]).contains("rw,dev,nosuid"));
}

/// The effective uid a setuid-root copy of `id` reports when a normal user runs it from MNT.
/// `command...` as `user` (uid, gid; no supplementary groups), from `/`.
fn as_user<S: AsRef<std::ffi::OsStr>>(user: (u32, u32), command: &[S]) -> std::process::Output {
    let (u, g) = (user.0.to_string(), user.1.to_string());
    let flags = ["--reuid", &u, "--regid", &g, "--clear-groups", "--"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(command.iter().map(|c| c.as_ref()));
    run("setpriv", &args, Path::new("/"))
}

/// The effective uid a setuid-root copy of `id` reports when a normal user runs it from MNT.
fn euid_of_setuid_id(m: &TestMount, user: (u32, u32)) -> String {
    let out = as_user(user, &[m.mnt.join("id").as_os_str(), "-u".as_ref()]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn setuid_takes_effect_only_with_suid() {
    let user = test_user("cpfs-test-opts");
    let mut m = TestMount::unmounted(&["--allow-other"]);
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::copy("/usr/bin/id", m.src.join("id")).unwrap();
    fs::set_permissions(m.src.join("id"), fs::Permissions::from_mode(0o4755)).unwrap();
    m.mount();
    assert_eq!(euid_of_setuid_id(&m, user), user.0.to_string(), "nosuid");
    m.umount();
    m.set_args(&["--allow-other", "-o", "suid"]);
    m.mount();
    assert_eq!(euid_of_setuid_id(&m, user), "0", "suid: runs as the owner");
}

fn atime(path: &Path) -> (i64, i64) {
    let md = fs::metadata(path).unwrap();
    (md.atime(), md.atime_nsec())
}

/// Sets atime and mtime of `path` to 2001-09-09.
fn set_old_times(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: 1_000_000_000,
        tv_nsec: 0,
    };
    // SAFETY: a valid path and two timespecs that live for the call.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) };
    assert_eq!(rc, 0);
}

/// SRC's own mount must be relatime for these tests to tell the options apart.
fn src_is_relatime(m: &TestMount) -> bool {
    let c = CString::new(m.src.as_os_str().as_bytes()).unwrap();
    // SAFETY: all-zero is a valid statvfs; a valid path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live out-struct for the call.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_flag & (libc::ST_RELATIME | libc::ST_NOATIME) == libc::ST_RELATIME
}

#[test]
fn noatime_leaves_atime_alone_where_the_default_updates_it() {
    let mut m = TestMount::unmounted(&[]);
    assert!(src_is_relatime(&m), "TMPDIR must be on a relatime mount");
    let f = m.src.join("f");
    fs::write(&f, "data\n").unwrap();
    set_old_times(&f);
    m.mount();
    fs::read(m.mnt.join("f")).unwrap();
    assert_ne!(
        atime(&f).0,
        1_000_000_000,
        "default (SRC's relatime) updates"
    );
    m.umount();
    set_old_times(&f);
    m.set_args(&["-o", "noatime"]);
    m.mount();
    assert_eq!(fs::read(m.mnt.join("f")).unwrap(), b"data\n");
    assert_eq!(atime(&f), (1_000_000_000, 0), "noatime: unchanged");
    assert!(m.daemon_log().contains("private clone of its mount"));
}

/// Issue 28 item 10: a read-only mount changes nothing in SRC, access times included. Every
/// readdir and read through it is the daemon's own access to SRC, which SRC's relatime
/// would stamp (xfstests generic/003 saw a directory's atime move once caches were cold).
#[test]
fn a_read_only_mount_moves_no_access_time_in_src() {
    for args in [&["-o", "ro"][..], &["-o", "ro", "--no-passthrough"][..]] {
        let mut m = TestMount::unmounted(args);
        assert!(src_is_relatime(&m), "TMPDIR must be on a relatime mount");
        let dir = m.src.join("dir");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("f"), "data\n").unwrap();
        set_old_times(&dir.join("f"));
        set_old_times(&dir);
        m.mount();
        // A fresh mount: the kernel has nothing cached, so both go to the daemon.
        let names: Vec<_> = fs::read_dir(m.mnt.join("dir"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"], "{args:?}");
        assert_eq!(fs::read(m.mnt.join("dir/f")).unwrap(), b"data\n");
        assert_eq!(atime(&dir), (1_000_000_000, 0), "{args:?}: directory");
        assert_eq!(atime(&dir.join("f")), (1_000_000_000, 0), "{args:?}: file");
    }
}

/// With an option SRC's own mount lacks (noatime here), SRC is served from a private clone
/// of its mount, where the kernel spells paths from the clone's root: every change must
/// still be tracked under its path in the tree (it once counted as "not in the tree" and
/// went unrecorded), and an object the clone cannot name stays refused.
#[test]
fn changes_are_tracked_when_src_is_served_from_a_clone_of_its_mount() {
    let m = TestMount::with_args(&["-o", "noatime,nodiratime"]);
    assert!(m.daemon_log().contains("private clone of its mount"));
    fs::create_dir(m.mnt.join("d")).unwrap();
    fs::write(m.mnt.join("d/f"), "one\n").unwrap();
    fs::write(m.mnt.join("top"), "top\n").unwrap();
    checkpoint(&m, "c1");
    fs::write(m.mnt.join("d/f"), "two\n").unwrap();
    fs::remove_file(m.mnt.join("top")).unwrap();
    fs::rename(m.mnt.join("d"), m.mnt.join("e")).unwrap();
    checkpoint(&m, "c2");
    let c1 = at(&m, "c1");
    assert_eq!(fs::read_to_string(c1.join("d/f")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(c1.join("top")).unwrap(), "top\n");
    assert!(!c1.join("e").exists());
    assert_eq!(
        fs::read_to_string(at(&m, "c2").join("e/f")).unwrap(),
        "two\n"
    );
    rewind(&m, "c1", &[]);
    assert_eq!(fs::read_to_string(m.mnt.join("d/f")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(m.mnt.join("top")).unwrap(), "top\n");
    assert!(!m.mnt.join("e").exists());
}

/// Waits until the clock is past `t` by a margin, so that a new atime can differ.
fn let_the_clock_pass(t: (i64, i64)) {
    let until =
        SystemTime::UNIX_EPOCH + Duration::new(t.0 as u64, t.1 as u32) + Duration::from_millis(30);
    while SystemTime::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn strictatime_updates_atime_on_every_read_where_relatime_does_not() {
    // Without passthrough the kernel's page cache would answer the second read (a new
    // open) itself: a strictatime mount drops it at every open.
    let cases = [
        (&["-o", "strictatime"][..], true),
        (&["-o", "strictatime", "--no-passthrough"][..], true),
        (&[][..], false),
    ];
    for (args, updates) in cases {
        let mut m = TestMount::unmounted(args);
        assert!(src_is_relatime(&m));
        let f = m.src.join("f");
        fs::write(&f, "data\n").unwrap();
        m.mount();
        fs::read(m.mnt.join("f")).unwrap();
        let first = atime(&f);
        let_the_clock_pass(first);
        fs::read(m.mnt.join("f")).unwrap();
        let second = atime(&f);
        assert_eq!(
            second > first,
            updates,
            "{args:?}: {first:?} then {second:?}"
        );
    }
}

/// `checkpointfs mount` of `m`'s SRC, MNT and state dir, with stderr piped.
fn spawn_mount(m: &TestMount) -> std::process::Child {
    Command::new(BIN)
        .args(["mount".as_ref(), m.src.as_os_str(), m.mnt.as_os_str()])
        .args(["--state-dir".as_ref(), m.state.as_os_str()])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn mount_right_after_umount_8_waits_for_the_old_daemon() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("f"), "x").unwrap();
    m.mount();
    // 1. A plain umount(8) and a mount straight away, a few times: each mount succeeds
    // (waiting when the old daemon is still flushing, quietly for the first seconds).
    for _ in 0..3 {
        let out = run("umount", &[m.mnt.as_os_str()], Path::new("/"));
        assert!(out.status.success(), "umount: {}", stderr(&out));
        let out = spawn_mount(&m).wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "mount after umount(8): {}",
            stderr(&out)
        );
        // Silent, as a local filesystem's mount is (a short wait says nothing).
        assert_eq!(stderr(&out), "", "mount after umount(8) printed");
        assert!(is_mount_point(&m.mnt));
    }
    // 2. Deterministically: the mount is gone from the mount table but the daemon still
    // runs (detached with a file still open in it, as it still flushes after umount(8)).
    let old = read_pid(&m.state.join("daemon.pid")).unwrap();
    let open = fs::File::open(m.mnt.join("f")).unwrap();
    let out = run(
        "umount",
        &["-l".as_ref(), m.mnt.as_os_str()],
        Path::new("/"),
    );
    assert!(out.status.success(), "umount -l: {}", stderr(&out));
    assert!(!is_mount_point(&m.mnt) && process_alive(old));
    let mut child = spawn_mount(&m);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains(&format!("(pid {old})")) && line.contains("waiting"),
        "{line}"
    );
    assert!(child.try_wait().unwrap().is_none(), "it waits");
    drop(open);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{status}: {rest}");
    assert!(is_mount_point(&m.mnt));
    assert_ne!(read_pid(&m.state.join("daemon.pid")), Some(old));
    assert!(!process_alive(old));
    // The daemons started here are not the harness's: unmount and wait for the last one.
    let out = cli(&["umount".as_ref(), m.mnt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_second_mount_of_a_live_state_dir_says_how_to_get_a_second_view() {
    let m = TestMount::new();
    let other = tempfile::tempdir().unwrap();
    let out = cli(&[
        "mount".as_ref(),
        m.src.as_os_str(),
        other.path().as_os_str(),
        "--state-dir".as_ref(),
        m.state.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("in use by a running checkpointfs daemon"),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}/.checkpoint/at/<id>/", m.mnt.display())),
        "{err}"
    );
    assert!(err.contains("another --state-dir"), "{err}");
    assert!(!is_mount_point(other.path()));
}

/// `mount -o remount,ro|rw MNT` through mount(8), which runs the helper
/// mount.fuse.checkpointfs: in a private mount namespace where this checkout's helper is
/// the one in /sbin (the machine's /sbin is left alone). The superblock flag it changes is
/// shared with this namespace's view of the mount.
fn remount(mnt: &Path, flag: &str) {
    let helpers = tempfile::tempdir().unwrap();
    let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-scripts/mount.fuse.checkpointfs");
    fs::copy(&ours, helpers.path().join("mount.fuse.checkpointfs")).unwrap();
    let sbin = fs::canonicalize("/sbin").unwrap();
    let script = format!("mount --bind \"$1\" \"$2\" && mount -o remount,{flag} \"$3\"",);
    let out = run(
        "unshare",
        &[
            "-m".as_ref(),
            "--propagation".as_ref(),
            "private".as_ref(),
            "sh".as_ref(),
            "-c".as_ref(),
            script.as_ref(),
            "sh".as_ref(),
            helpers.path().as_os_str(),
            sbin.as_os_str(),
            mnt.as_os_str(),
        ],
        Path::new("/"),
    );
    assert!(out.status.success(), "remount,{flag}: {}", stderr(&out));
}

#[test]
fn remount_ro_and_back_rw_through_mount_8() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("f"), "one\n").unwrap();
    m.mount();
    // An agent session registered while the mount is writable: a shell that takes a
    // checkpoint with the CLI once told to (over the control socket, the mount being ro).
    let mut agent = Command::new("sh")
        .args([
            "-c",
            "read _ && exec \"$0\" checkpoint \"$1\" by-agent",
            BIN,
        ])
        .arg(&m.mnt)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    m.ctl(&format!("session agent-ro-1 {}", agent.id()))
        .unwrap();
    remount(&m.mnt, "ro");
    let e = fs::write(m.mnt.join("f"), "two\n").unwrap_err();
    assert_eq!(errno_of(&e), libc::EROFS, "{e}");
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "one\n");
    let status = cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(status.contains("(read-only now: remounted ro)"), "{status}");
    cli_ok(&["checkpoint", m.mnt.to_str().unwrap(), "c1"]);
    std::io::Write::write_all(agent.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert!(agent.wait().unwrap().success());
    // The checkpoint over the socket is recorded under the asking process's session.
    let log: serde_json::Value =
        serde_json::from_str(&cli_ok(&["log", m.mnt.to_str().unwrap(), "--json"])).unwrap();
    let sessions: Vec<(&str, &serde_json::Value)> = log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), &c["session"]))
        .collect();
    assert_eq!(
        sessions,
        [
            ("c1", &serde_json::Value::Null),
            ("by-agent", &serde_json::json!("agent-ro-1"))
        ],
        "{log:#}"
    );
    let out = cli(&["rewind", m.mnt.to_str().unwrap(), "c1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    remount(&m.mnt, "rw");
    fs::write(m.mnt.join("f"), "two\n").unwrap();
    rewind(&m, "c1", &[]);
    assert_eq!(fs::read_to_string(m.src.join("f")).unwrap(), "one\n");
}

#[test]
fn a_normal_user_mounts_ro_noexec_and_is_refused_what_needs_root() {
    let (uid, gid) = test_user("cpfs-test-opts");
    let mut m = TestMount::unmounted(&["-o", "ro,noexec"]);
    // A normal user mounts through fusermount3, which opens /dev/fuse as the user: give it
    // its usual 0666 (this machine's is root-only) for the test's life.
    let _mode = DevFuseMode::set(0o666);
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    write_script(&m.src.join("s.sh"));
    for p in [&m.src, &m.mnt, &m.state, &m.src.join("s.sh")] {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    }
    for opts in ["dev", "suid", "strictatime", "nodiratime"] {
        let mut command = vec![BIN.as_ref()];
        command.extend(mount_args(&m, opts));
        let out = as_user((uid, gid), &command);
        assert_eq!(out.status.code(), Some(2), "-o {opts}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&format!("-o {opts} needs root")), "{err}");
        assert!(!is_mount_point(&m.mnt));
        assert!(!m.state.join("daemon.pid").exists(), "-o {opts}: no daemon");
    }
    // The user's own files keep their access times through a read-only mount, though
    // without CAP_SYS_ADMIN the daemon cannot clone SRC's mount (O_NOATIME instead).
    set_old_times(&m.src.join("s.sh"));
    set_old_times(&m.src);
    // ro and noexec reach the mount through fusermount3 (only the user may enter it).
    m.mount_as(uid, gid);
    let sh = |script: &str| as_user((uid, gid), &["sh", "-c", script]);
    let f = m.mnt.join("s.sh");
    let f = f.to_str().unwrap();
    let out = sh(&format!(
        "cat {f} && {{ echo x > {f}; echo \"write: $?\"; }}"
    ));
    assert!(stdout(&out).starts_with("#!/bin/sh\n"), "{}", stderr(&out));
    assert!(stdout(&out).ends_with("write: 2\n"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("Read-only file system"),
        "{}",
        stderr(&out)
    );
    let out = sh(f);
    assert!(
        !out.status.success() && stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = sh(&format!("ls {}", m.mnt.display()));
    assert!(stdout(&out).contains("s.sh"), "{}", stderr(&out));
    assert_eq!(atime(&m.src.join("s.sh")), (1_000_000_000, 0), "file");
    assert_eq!(atime(&m.src), (1_000_000_000, 0), "directory");
    let status = cli_ok(&["status", "--state-dir", m.state.to_str().unwrap()]);
    assert!(
        status.contains("mount options:  ro,nodev,nosuid,noexec,atime"),
        "{status}"
    );
}
