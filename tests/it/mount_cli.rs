//! The `mount` / `umount` command line: refused mounts, and the mount lifecycle.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------
// Refused mounts: exit 2, one line naming the problem, nothing mounted, nothing created.
// ---------------------------------------------------------------------------------------

/// Runs `checkpointfs mount ARGS` in `t.root()` and checks it was refused: status 2, a single
/// `checkpointfs: cannot mount: ...` line containing `expect`, no mount appeared or vanished
/// under the temp dir, and no file under it was created or changed.
fn assert_refused(t: &TestMount, args: &[&OsStr], envs: &[(&str, Option<&OsStr>)], expect: &str) {
    let root = t.root();
    let before_tree = tree_listing(&root);
    let before_mounts = mounts_under(&root);
    let mut cmd = Command::new(BIN);
    cmd.arg("mount")
        .args(args)
        .current_dir(&root)
        .stdin(Stdio::null());
    for (k, v) in envs {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = cmd.output().expect("run checkpointfs");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "expected exit 2; stderr: {err}");
    assert!(
        err.starts_with("checkpointfs: cannot mount: ") && err.ends_with('\n'),
        "stderr: {err:?}"
    );
    assert_eq!(err.lines().count(), 1, "one line only: {err:?}");
    assert!(
        err.contains(expect),
        "stderr {err:?} should contain {expect:?}"
    );
    assert!(stdout(&out).is_empty());
    assert_eq!(mounts_under(&root), before_mounts, "mount table changed");
    assert_eq!(
        tree_listing(&root),
        before_tree,
        "files changed under {root:?}"
    );
}

fn os(p: &Path) -> &OsStr {
    p.as_os_str()
}

fn fresh() -> TestMount {
    let t = TestMount::unmounted(&[]);
    fs::write(t.src.join("file"), b"content").unwrap();
    t
}

#[test]
fn refuses_missing_source() {
    let t = fresh();
    let missing = t.root().join("nope");
    let msg = format!("source directory {} does not exist", missing.display());
    assert_refused(
        &t,
        &[
            os(&missing),
            os(&t.mnt),
            "--state-dir".as_ref(),
            os(&t.state),
        ],
        &[],
        &msg,
    );
}

#[test]
fn refuses_source_that_is_a_file() {
    let t = fresh();
    let file = t.src.join("file");
    let msg = format!("source {} is not a directory", file.display());
    assert_refused(
        &t,
        &[os(&file), os(&t.mnt), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_missing_mountpoint() {
    let t = fresh();
    let missing = t.root().join("nope");
    let msg = format!("mount point {} does not exist", missing.display());
    assert_refused(
        &t,
        &[
            os(&t.src),
            os(&missing),
            "--state-dir".as_ref(),
            os(&t.state),
        ],
        &[],
        &msg,
    );
}

#[test]
fn refuses_mountpoint_that_is_a_file() {
    let t = fresh();
    let file = t.root().join("plain");
    fs::write(&file, b"").unwrap();
    let msg = format!("mount point {} is not a directory", file.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&file), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_nonempty_mountpoint() {
    let t = fresh();
    fs::write(t.mnt.join(".hidden"), b"").unwrap();
    let msg = format!("mount point {} is not empty", t.mnt.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_mountpoint_equal_to_source() {
    let t = fresh();
    assert_refused(
        &t,
        &[os(&t.src), os(&t.src), "--state-dir".as_ref(), os(&t.state)],
        &[],
        "mount point and source are the same directory",
    );
    // Also when spelled differently.
    assert_refused(
        &t,
        &[
            "src/.".as_ref(),
            "./src".as_ref(),
            "--state-dir".as_ref(),
            "state".as_ref(),
        ],
        &[],
        "mount point and source are the same directory",
    );
}

#[test]
fn refuses_mountpoint_inside_source() {
    let t = fresh();
    let inner = t.src.join("sub");
    fs::create_dir(&inner).unwrap();
    let msg = format!(
        "mount point {} is inside the source {}",
        inner.display(),
        t.src.display()
    );
    assert_refused(
        &t,
        &[os(&t.src), os(&inner), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_mountpoint_inside_source_through_a_symlink_and_relative_paths() {
    let t = fresh();
    let inner = t.src.join("sub");
    fs::create_dir(&inner).unwrap();
    symlink(&inner, t.root().join("link")).unwrap();
    let msg = format!(
        "mount point {} is inside the source {}",
        inner.display(),
        t.src.display()
    );
    assert_refused(
        &t,
        &[
            "src".as_ref(),
            "link".as_ref(),
            "--state-dir".as_ref(),
            "state".as_ref(),
        ],
        &[],
        &msg,
    );
}

#[test]
fn refuses_source_inside_mountpoint() {
    let t = fresh();
    let inner = t.mnt.join("inner");
    fs::create_dir(&inner).unwrap();
    let msg = format!(
        "source {} is inside the mount point {}",
        inner.display(),
        t.mnt.display()
    );
    assert_refused(
        &t,
        &[os(&inner), os(&t.mnt), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_state_dir_inside_source() {
    let t = fresh();
    let state = t.src.join(".state/deeper");
    let msg = format!(
        "state dir {} is inside the source {}",
        state.display(),
        t.src.display()
    );
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&state)],
        &[],
        &msg,
    );
    assert!(!t.src.join(".state").exists());
}

#[test]
fn refuses_state_dir_inside_mountpoint() {
    let t = fresh();
    let state = t.mnt.join("state");
    let msg = format!(
        "state dir {} is inside the mount point {}",
        state.display(),
        t.mnt.display()
    );
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&state)],
        &[],
        &msg,
    );
    assert!(fs::read_dir(&t.mnt).unwrap().next().is_none());
}

#[test]
fn refuses_state_dir_that_is_a_file() {
    let t = fresh();
    let state = t.root().join("statefile");
    fs::write(&state, b"").unwrap();
    let msg = format!(
        "state dir {} exists and is not a directory",
        state.display()
    );
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_mountpoint_that_is_already_mounted() {
    let t = fresh();
    let _m = OtherMount::new(
        &[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "cpfs-test".as_ref(),
            os(&t.mnt),
        ],
        &t.mnt,
    );
    let msg = format!("mount point {} is already a mount point", t.mnt.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn refuses_bind_mounted_mountpoint_on_the_same_filesystem() {
    // Same st_dev as its parent: only /proc/self/mountinfo gives it away.
    let t = fresh();
    let other = t.root().join("other");
    fs::create_dir(&other).unwrap();
    let _m = OtherMount::new(&["--bind".as_ref(), os(&other), os(&t.mnt)], &t.mnt);
    let msg = format!("mount point {} is already a mount point", t.mnt.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt), "--state-dir".as_ref(), os(&t.state)],
        &[],
        &msg,
    );
}

#[test]
fn default_state_dir_is_derived_from_source_and_checked() {
    let t = fresh();
    let xdg = t.src.join("xdg");
    let digest = Sha256::digest(t.src.as_os_str().as_encoded_bytes());
    let hex = base16ct::lower::encode_string(&digest[..8]);
    let expected = xdg.join("checkpointfs").join(format!("src-{hex}"));
    let msg = format!("state dir {} is inside the source", expected.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt)],
        &[
            ("XDG_DATA_HOME", Some(xdg.as_os_str())),
            ("HOME", Some("/nonexistent".as_ref())),
        ],
        &msg,
    );
    // Without XDG_DATA_HOME: $HOME/.local/share.
    let home = t.src.join("home");
    let expected = home
        .join(".local/share/checkpointfs")
        .join(format!("src-{hex}"));
    let msg = format!("state dir {} is inside the source", expected.display());
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt)],
        &[("XDG_DATA_HOME", None), ("HOME", Some(home.as_os_str()))],
        &msg,
    );
    assert!(!xdg.exists() && !home.exists());
}

#[test]
fn refuses_without_any_state_dir() {
    let t = fresh();
    assert_refused(
        &t,
        &[os(&t.src), os(&t.mnt)],
        &[("XDG_DATA_HOME", None), ("HOME", None)],
        "pass --state-dir",
    );
}

// ---------------------------------------------------------------------------------------
// Other usage errors that need no filesystem.
// ---------------------------------------------------------------------------------------

fn assert_exit(out: &Output, code: i32, expect: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(
        err.contains(expect),
        "stderr {err:?} should contain {expect:?}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let t = fresh();
    let (src, mnt) = (os(&t.src), os(&t.mnt));
    assert_exit(
        &cli(&[
            "mount".as_ref(),
            src,
            mnt,
            "--threads".as_ref(),
            "0".as_ref(),
        ]),
        2,
        "--threads",
    );
    assert_exit(
        &cli(&[
            "mount".as_ref(),
            src,
            mnt,
            "--exclude".as_ref(),
            "a[".as_ref(),
        ]),
        2,
        "--exclude",
    );
    assert_exit(&cli(&["mount", "only-one"]), 2, "MNT");
    assert_exit(&cli(&["log"]), 2, "MNT");
    assert_exit(
        &cli(&["log", "/m", "--state-dir", "/s"]),
        2,
        "cannot be used with",
    );
    assert_exit(
        &cli(&["status", "/m", "--state-dir", "/s"]),
        2,
        "cannot be used with",
    );
    assert_exit(
        &cli(&["diff", "--state-dir", "/s", "a", "b", "c"]),
        2,
        "expected M [N]",
    );
    assert_exit(&cli(&["diff", "/m"]), 2, "expected MNT M [N]");
    assert_exit(&cli(&["frobnicate"]), 2, "frobnicate");
    assert_eq!(cli(&["--help"]).status.code(), Some(0));
    assert_eq!(cli(&["mount", "--help"]).status.code(), Some(0));
    assert_eq!(cli(&["--version"]).status.code(), Some(0));
}

#[test]
fn checkpoint_refuses_bad_ids_before_touching_the_mount() {
    let t = fresh();
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "a/b".as_ref()]);
    assert_exit(
        &out,
        2,
        "invalid checkpoint id 'a/b': checkpoint id contains '/'",
    );
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "".as_ref()]);
    assert_exit(&out, 2, "invalid checkpoint id '': checkpoint id is empty");
    let long = "x".repeat(129);
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), long.as_ref()]);
    assert_exit(&out, 2, "129 bytes long (at most 128)");
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "..".as_ref()]);
    assert_exit(&out, 2, "may not be '.' or '..'");
}

#[test]
fn checkpoint_on_a_plain_directory_is_not_a_mount() {
    let t = fresh();
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "m1".as_ref()]);
    assert_exit(
        &out,
        2,
        &format!("{} is not a checkpointfs mount", t.mnt.display()),
    );
    assert!(fs::read_dir(&t.mnt).unwrap().next().is_none());
}

#[test]
fn umount_refuses_what_is_not_a_checkpointfs_mount() {
    let t = fresh();
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert_exit(
        &out,
        2,
        &format!("{} is not a checkpointfs mount", t.mnt.display()),
    );
    let missing = t.root().join("nope");
    assert_exit(
        &cli(&["umount".as_ref(), os(&missing)]),
        2,
        "does not exist",
    );

    // Another filesystem mounted there is left alone, even with a fake state-dir file.
    let _m = OtherMount::new(
        &[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "cpfs-test".as_ref(),
            os(&t.mnt),
        ],
        &t.mnt,
    );
    fs::create_dir(t.mnt.join(".checkpoint")).unwrap();
    fs::write(
        t.mnt.join(".checkpoint/state-dir"),
        format!("{}\n", t.state.display()),
    )
    .unwrap();
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert_exit(&out, 2, "is not a checkpointfs mount");
    assert!(
        is_mount_point(&t.mnt),
        "umount must not unmount a foreign filesystem"
    );
}

// ---------------------------------------------------------------------------------------
// The mount lifecycle. These need the real serve() from the filesystem core.
// ---------------------------------------------------------------------------------------

#[test]
fn mount_then_umount_leaves_no_mount_and_no_process() {
    let mut t = TestMount::new();
    let pid = t.pid().unwrap();
    assert!(process_alive(pid));
    assert_eq!(
        fs::read_to_string(t.mnt.join(".checkpoint/state-dir")).unwrap(),
        format!("{}\n", t.state.display())
    );
    assert_eq!(
        fs::read_to_string(t.state.join("mountpoint")).unwrap(),
        format!("{}\n", t.mnt.display())
    );
    assert_eq!(
        fs::metadata(&t.state).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(t.state.join("daemon.log").exists());

    t.umount();
    assert!(mounts_under(&t.root()).is_empty());
    // Reaped by the harness, so the pid is gone, not a zombie.
    assert_eq!(
        // SAFETY: kill(2) takes plain integers; the pid is this test's own child or daemon.
        unsafe { libc::kill(pid, 0) },
        -1,
        "daemon {pid} still exists"
    );
    assert!(
        !t.state.join("daemon.pid").exists(),
        "daemon.pid removed on clean exit"
    );
}

#[test]
fn daemon_is_detached_with_its_own_session_and_log() {
    let t = TestMount::new();
    let pid = t.pid().unwrap();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    assert_eq!(fields[3], pid.to_string(), "session id == pid (setsid)");
    assert_eq!(
        fs::read_link(format!("/proc/{pid}/fd/0")).unwrap(),
        PathBuf::from("/dev/null")
    );
    for fd in [1, 2] {
        assert_eq!(
            fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap(),
            t.state.join("daemon.log")
        );
    }
    assert_eq!(
        fs::read_link(format!("/proc/{pid}/cwd")).unwrap(),
        PathBuf::from("/")
    );
}

#[test]
fn mount_passes_the_source_through() {
    let mut t = TestMount::unmounted(&[]);
    fs::create_dir_all(t.src.join("a/b")).unwrap();
    fs::write(t.src.join("a/b/f"), b"hello").unwrap();
    fs::set_permissions(t.src.join("a/b/f"), fs::Permissions::from_mode(0o640)).unwrap();
    symlink("b/f", t.src.join("a/l")).unwrap();
    t.mount();
    assert_eq!(tree_listing(&t.mnt), tree_listing(&t.src));
}

#[test]
fn remount_and_kill9_recovery() {
    let mut t = TestMount::with_args(&["--no-passthrough", "--threads", "1"]);
    fs::write(t.mnt.join("f"), b"1").unwrap();
    t.remount();
    assert_eq!(fs::read(t.mnt.join("f")).unwrap(), b"1");
    t.kill9();
    assert!(!is_mount_point(&t.mnt));
    // A stale daemon.pid does not block the next mount.
    assert!(t.state.join("daemon.pid").exists());
    t.mount();
    assert_eq!(fs::read(t.src.join("f")).unwrap(), b"1");
}

#[test]
fn second_mount_of_the_same_state_dir_is_refused() {
    let t = TestMount::new();
    let other = t.root().join("mnt2");
    fs::create_dir(&other).unwrap();
    let before = mounts_under(&t.root());
    let out = cli(&[
        "mount".as_ref(),
        os(&t.src),
        os(&other),
        "--state-dir".as_ref(),
        os(&t.state),
    ]);
    assert_exit(&out, 2, "is in use by a running checkpointfs daemon");
    assert_eq!(mounts_under(&t.root()), before);
    // A mounted MNT is refused as a mount point.
    let out = cli(&[
        "mount".as_ref(),
        os(&t.src),
        os(&t.mnt),
        "--state-dir".as_ref(),
        os(&other),
    ]);
    assert_exit(&out, 2, "is already a mount point");
}

#[test]
fn umount_of_a_busy_mount_fails_then_lazy_waits_for_the_daemon() {
    let t = TestMount::new();
    let pid = t.pid().unwrap();
    let mut busy = Command::new("sleep")
        .arg("60")
        .current_dir(&t.mnt)
        .spawn()
        .unwrap();
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    let shown = t.mnt.display();
    assert_exit(
        &out,
        4,
        &format!(
            "{shown} is busy (a process has its working directory or a file open there; see: \
             lsof +D {shown}); close it, or detach it anyway with: checkpointfs umount --lazy \
             {shown}"
        ),
    );
    assert!(is_mount_point(&t.mnt) && process_alive(pid));

    // Lazy: detached at once, but the daemon serves the busy process until it lets go.
    let out = cli(&[
        "umount".as_ref(),
        os(&t.mnt),
        "--lazy".as_ref(),
        "--timeout".as_ref(),
        "1".as_ref(),
    ]);
    assert_exit(&out, 5, "still serving open files");
    assert!(!is_mount_point(&t.mnt));
    assert!(process_alive(pid));
    // Detached, but its daemon still runs: umount waits for it again, and times out again.
    let out = cli(&[
        "umount".as_ref(),
        os(&t.mnt),
        "--timeout".as_ref(),
        "1".as_ref(),
    ]);
    assert_exit(&out, 5, "waiting for its daemon");
    busy.kill().unwrap();
    busy.wait().unwrap();
    assert!(wait_until(Duration::from_secs(30), || !process_alive(pid)));
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert_exit(&out, 3, "is already unmounted; its daemon has exited");
}

#[test]
fn umount_exit_status_0_then_3_when_already_unmounted() {
    let mut t = TestMount::new();
    fs::write(t.mnt.join("f"), "x").unwrap();
    // Exit status 0 (success), no longer mounted, the daemon gone: checked by the harness.
    t.umount();

    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert_exit(
        &out,
        3,
        &format!(
            "{} is already unmounted; its daemon has exited and the history in {} is complete",
            t.mnt.display(),
            t.state.display()
        ),
    );
    // A directory that was never mounted is still "not a checkpointfs mount".
    let never = t.root().join("never");
    fs::create_dir(&never).unwrap();
    assert_exit(
        &cli(&["umount".as_ref(), os(&never)]),
        2,
        "is not a checkpointfs mount",
    );
    // The history is intact.
    let out = cli(&["log".as_ref(), "--state-dir".as_ref(), os(&t.state)]);
    assert!(stdout(&out).contains("A f"), "{}", stdout(&out));
}

#[test]
fn umount_of_a_dead_endpoint_detaches_it_and_exits_3() {
    let mut t = TestMount::new();
    fs::write(t.mnt.join("f"), "before the crash").unwrap();
    t.ctl("c1").unwrap();
    t.kill_daemon();
    // ECONNABORTED or ECANCELED for a moment while the kernel aborts the connection;
    // ENOTCONN from then on.
    let err = fs::metadata(t.mnt.join("f")).unwrap_err();
    assert!(
        matches!(
            err.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ECANCELED) | Some(libc::ECONNABORTED)
        ),
        "{err}"
    );
    let settled = wait_until(Duration::from_secs(10), || {
        fs::metadata(t.mnt.join("f"))
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::ENOTCONN)
    });
    assert!(settled, "the dead mount never answered ENOTCONN");
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert_exit(
        &out,
        3,
        &format!(
            "the daemon serving {} was gone (killed or crashed); detached the dead mount. \
             Nothing was flushed now: the next mount of {} recovers the history from its \
             journal",
            t.mnt.display(),
            t.state.display()
        ),
    );
    assert!(!is_mount_point(&t.mnt));
    // ... and so it does.
    t.mount();
    assert_eq!(
        fs::read_to_string(t.mnt.join("f")).unwrap(),
        "before the crash"
    );
    assert!(t.mnt.join(".checkpoint/at/c1").is_dir());
}

#[test]
fn umount_help_documents_the_exit_statuses() {
    let help = stdout(&cli(&["umount", "--help"]));
    for line in [
        "0  unmounted, and the daemon has flushed",
        "2  usage error, or MNT is not a checkpointfs mount",
        "3  MNT is not mounted and no daemon runs for it",
        "4  MNT is busy",
        "lsof +D MNT",
        "5  unmounted (or detached with --lazy), but the daemon had not exited",
    ] {
        assert!(help.contains(line), "{line:?} not in:\n{help}");
    }
}

#[test]
fn foreground_mount_serves_until_unmounted() {
    let t = TestMount::unmounted(&[]);
    let mut child = Command::new(BIN)
        .args([
            "mount".as_ref(),
            os(&t.src),
            os(&t.mnt),
            "-f".as_ref(),
            "--state-dir".as_ref(),
            os(&t.state),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(30), || is_mount_point(&t.mnt));
    if !up {
        let _ = child.kill();
    }
    assert!(up, "foreground mount did not come up");
    assert_eq!(
        read_pid(&t.state.join("daemon.pid")),
        Some(child.id() as i32)
    );
    let out = cli(&["umount".as_ref(), os(&t.mnt)]);
    assert!(out.status.success(), "{}", stderr(&out));
    // umount waited for the foreground process to exit.
    let status = child.try_wait().unwrap().expect("foreground daemon exited");
    assert!(status.success());
    assert!(!t.state.join("daemon.pid").exists());
}

#[test]
fn sigterm_unmounts_and_exits_cleanly() {
    let t = TestMount::new();
    let pid = t.pid().unwrap();
    // SAFETY: kill(2) takes plain integers; the pid is this test's own child or daemon.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(wait_until(Duration::from_secs(30), || !process_alive(pid)));
    let status = reap(pid, Duration::from_secs(5));
    if let Some(status) = status {
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status:#x}"
        );
    }
    assert!(!is_mount_point(&t.mnt));
    assert!(!t.state.join("daemon.pid").exists());
}

#[test]
fn checkpoint_command() {
    let t = TestMount::new();
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "m1".as_ref()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "checkpoint m1\n");
    let out = cli(&["checkpoint".as_ref(), os(&t.mnt), "m1".as_ref()]);
    assert_exit(
        &out,
        1,
        &format!(
            "a checkpoint named 'm1' already exists (see: checkpointfs log {})",
            t.mnt.display()
        ),
    );
    t.ctl("m2").unwrap();
    let e = t.ctl("m2").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
}

#[test]
fn the_record_of_mounts_follows_xdg_runtime_dir_and_drops_stale_records() {
    let mut t = TestMount::unmounted(&[]);
    let runtime = t.root().join("runtime");
    let registry = runtime.join("checkpointfs/mounts");
    fs::create_dir_all(&registry).unwrap();
    symlink(t.root().join("removed-state"), registry.join("stale")).unwrap();
    t.set_env("XDG_RUNTIME_DIR", runtime.to_str().unwrap());
    t.mount();
    let records: Vec<PathBuf> = fs::read_dir(&registry)
        .unwrap()
        .map(|e| fs::read_link(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(
        records,
        vec![t.state.clone()],
        "the stale record is dropped"
    );
    t.umount();

    let umount_with_runtime = |runtime: &Path| {
        Command::new(BIN)
            .args(["umount".as_ref(), os(&t.mnt)])
            .env("XDG_RUNTIME_DIR", runtime)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    assert_exit(
        &umount_with_runtime(&runtime),
        3,
        "is already unmounted; its daemon has exited",
    );
    // Another registry knows nothing of it: "not a checkpointfs mount".
    let other = t.root().join("other-runtime");
    fs::create_dir(&other).unwrap();
    assert_exit(
        &umount_with_runtime(&other),
        2,
        "is not a checkpointfs mount",
    );
}

/// Shutting down does not depend on the control socket's path: a daemon whose socket was
/// deleted from the state dir still exits when unmounted.
#[test]
fn umount_ends_the_daemon_even_without_its_control_socket() {
    let mut m = TestMount::new();
    fs::remove_file(m.state.join("control.sock")).unwrap();
    m.umount();
}
