//! No fault of the daemon leaves a caller waiting forever (issue 11 items 4 and 5): the
//! watchdog aborts the mount's FUSE connection when the daemon dies with a thread stuck on
//! its own mount (kill -9 during a rewind) or stays stopped longer than its bound.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestMount, checkpoint, cli, is_mount_point, process_alive, reap, stdout, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_checkpointfs");

/// The watchdog's bound for a stopped daemon (src/mount/watchdog.rs `STOPPED_BOUND`), plus its
/// poll interval and slack for a loaded machine.
const STOPPED_BOUND: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_secs(5);

/// Sends SIGCONT to the daemon on every exit path, so that a failing test never leaves a
/// stopped daemon behind.
struct Continue(i32);

impl Drop for Continue {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid this test stopped.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Kills and reaps a child on every exit path.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reaped {
    /// Waits for the child to exit; its status, or `None` past `timeout`.
    fn wait_for(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn state_letter(pid: u32) -> Option<u8> {
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Whether `pid` is asleep inside a FUSE request (its kernel wait channel is FUSE's).
fn waits_on_fuse(pid: u32) -> bool {
    let wchan = fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    matches!(state_letter(pid), Some(b'S') | Some(b'D'))
        && (wchan.contains("fuse") || wchan.contains("request_wait_answer"))
}

/// `checkpointfs umount MNT`, which must return within 30 s whatever state the daemon is
/// in; returns its exit code.
fn umount_within_30s(mnt: &Path) -> i32 {
    let child = Command::new(BIN)
        .arg("umount")
        .arg(mnt)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let status = child.wait_for(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "checkpointfs umount {} did not return in 30 s",
            mnt.display()
        )
    });
    status.code().unwrap_or(-1)
}

/// With the daemon stopped, a caller blocked on the mount dies at SIGKILL, and a caller whose
/// request the daemon cannot answer is released within the watchdog's bound; then `umount`
/// returns within 30 s and MNT answers again. On both transports: over io_uring the
/// kernel hands the request to a ring entry of the stopped daemon, which the abort alone
/// cannot end (the watchdog also kills the daemon).
#[test]
fn stopped_daemon_leaves_callers_killable_and_released_within_the_bound() {
    stopped_daemon_releases_callers(&[], true);
}

#[test]
fn stopped_daemon_leaves_callers_killable_and_released_within_the_bound_over_dev_fuse() {
    stopped_daemon_releases_callers(&["--no-io-uring"], false);
}

fn stopped_daemon_releases_callers(args: &[&str], ring: bool) {
    let _on = common::EnableUring::set(true);
    let m = TestMount::with_args(args);
    assert_eq!(common::status_io(&m)["io_uring"], ring);
    fs::write(m.mnt.join("x"), "content").unwrap();
    let daemon = m.pid().unwrap();
    // SAFETY: kill(2) on the daemon this test mounted.
    assert_eq!(unsafe { libc::kill(daemon, libc::SIGSTOP) }, 0);
    let _cont = Continue(daemon);
    let stopped_at = Instant::now();
    assert!(wait_until(Duration::from_secs(5), || state_letter(
        daemon as u32
    ) == Some(b'T')));

    let mut cat = Reaped(
        Command::new("cat")
            .arg(m.mnt.join("x"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let cat_pid = cat.0.id();
    assert!(
        wait_until(Duration::from_secs(5), || waits_on_fuse(cat_pid)),
        "cat never blocked on the stopped daemon (state {:?})",
        state_letter(cat_pid).map(char::from)
    );
    cat.0.kill().unwrap();
    let killed_at = Instant::now();
    let status = cat
        .wait_for(STOPPED_BOUND + SLACK)
        .expect("a SIGKILLed caller outlived the watchdog's bound");
    assert!(!status.success());
    eprintln!("SIGKILLed cat reaped after {:?}", killed_at.elapsed());

    // A caller that just waits: released by the watchdog's abort, with an error. A name
    // never looked up, so its LOOKUP must reach the daemon (x's attributes may be answered
    // from the kernel's cache: a write-only handle's close sends no FLUSH, so nothing
    // invalidated them).
    let mut stat = Reaped(
        Command::new("stat")
            .arg(m.mnt.join("never-looked-up"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = stat
        .wait_for(STOPPED_BOUND + SLACK)
        .expect("a caller of the stopped daemon was not released within the bound");
    assert!(!status.success(), "stat of an aborted mount succeeded");
    assert!(stopped_at.elapsed() >= STOPPED_BOUND - Duration::from_secs(1));
    let log = m.daemon_log();
    assert!(
        log.contains("has been stopped for 10 s; aborting FUSE connection"),
        "{log}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || !process_alive(daemon)),
        "the watchdog did not kill the stopped daemon"
    );

    drop(_cont);
    let code = umount_within_30s(&m.mnt);
    assert!(code == 0 || code == 3, "umount exit {code}");
    assert!(!is_mount_point(&m.mnt));
    fs::read_dir(&m.mnt).expect("MNT answers again");
    assert!(wait_until(Duration::from_secs(10), || !process_alive(
        daemon
    )));
    reap(daemon, Duration::from_secs(5));
}

/// A small deterministic RNG (xorshift64*), so that the kill points are random but every
/// run tries the same ones.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

fn listing(dir: &Path) -> Vec<(String, Vec<u8>, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = fs::symlink_metadata(e.path()).unwrap();
            let content = if md.is_file() {
                fs::read(e.path()).unwrap()
            } else {
                Vec::new()
            };
            (
                e.file_name().to_string_lossy().into_owned(),
                content,
                md.mode(),
            )
        })
        .collect();
    out.sort();
    out
}

/// kill -9 of the daemon at random points of a rewind, 20 times: each time `umount` returns
/// within 30 s, MNT answers again, a remount shows every checkpoint, and nothing outside
/// SRC changed.
#[test]
fn kill9_during_rewind_never_hangs_the_mount() {
    let mut m = TestMount::new();
    let outside = m.root().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), "outside SRC").unwrap();
    std::os::unix::fs::symlink(&outside, m.src.join("link-out")).unwrap();
    let outside_before = listing(&outside);
    fs::create_dir(m.mnt.join("d")).unwrap();
    for i in 0..300 {
        fs::write(m.mnt.join(format!("d/f{i}")), format!("v1 {i}")).unwrap();
    }
    checkpoint(&m, "c1");
    for i in 0..300 {
        fs::write(
            m.mnt.join(format!("d/f{i}")),
            format!("v2 {i} {}", "x".repeat(i)),
        )
        .unwrap();
    }
    checkpoint(&m, "c2");

    let mut rng = Rng(0x5eed_cafe_f00d_1234);
    for trial in 0..20 {
        let delay = Duration::from_millis(rng.below(400));
        let target = if trial % 2 == 0 { "c1" } else { "c2" };
        let rewind = Reaped(
            Command::new(BIN)
                .args(["rewind".as_ref(), m.mnt.as_os_str(), target.as_ref()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // The fault injection point, not a synchronisation: any moment of the rewind will do.
        std::thread::sleep(delay);
        m.kill_daemon();
        let mut rewind = rewind;
        rewind
            .wait_for(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("trial {trial}: the rewind command hung after kill -9"));
        let code = umount_within_30s(&m.mnt);
        assert!(
            code == 0 || code == 3,
            "trial {trial} ({delay:?}): umount exit {code}\n{}",
            m.daemon_log()
        );
        assert!(!is_mount_point(&m.mnt), "trial {trial}: still mounted");
        fs::read_dir(&m.mnt).unwrap_or_else(|e| panic!("trial {trial}: MNT does not answer: {e}"));
        assert_eq!(
            listing(&outside),
            outside_before,
            "trial {trial}: outside SRC changed"
        );

        m.mount();
        let log = cli(&["log".as_ref(), m.mnt.as_os_str()]);
        let log = stdout(&log);
        for id in ["c1", "c2"] {
            assert!(
                log.contains(id),
                "trial {trial}: checkpoint {id} missing after remount:\n{log}"
            );
        }
        assert_eq!(
            listing(&outside),
            outside_before,
            "trial {trial}: outside SRC changed"
        );
    }
    m.umount();
}

/// A `getfattr -n NAME FILE` pinned to CPU 0, so that its request goes to ring queue 0.
fn pinned_getxattr(file: &Path, name: &str) -> Reaped {
    Reaped(
        Command::new("taskset")
            .args(["-c", "0", "getfattr", "-n", name])
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Whether `pid` is inside getxattr(2) (/proc/PID/syscall starts with its number).
fn in_getxattr(pid: u32) -> bool {
    let syscall = fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    syscall.split(' ').next() == Some(&libc::SYS_getxattr.to_string())
}

/// How a [`ring_requests_in_every_state_end_when_the_daemon`] test stops the daemon.
enum Stop {
    Kill9,
    /// SIGSTOP: the watchdog aborts the connection after its bound.
    Sigstop,
}

/// With FUSE over io_uring, requests in each ring state: one parked in the daemon, one
/// whose reply is built but not committed (the test hook of `--test-park-ring-requests`;
/// together they hold both entries of queue 0), and one queued behind them in the kernel.
/// Every caller is SIGKILLed: the queued one ends at once; the two the daemon holds end
/// once the daemon is killed (kill -9) or stopped past the watchdog's bound.
fn ring_requests_in_every_state_end_when_the_daemon(stop: Stop) {
    let _on = common::EnableUring::set(true);
    let mut m = TestMount::unmounted(&["--test-park-ring-requests"]);
    fs::write(m.src.join("f"), "x").unwrap();
    m.mount();
    let io = common::status_io(&m);
    assert_eq!(io["io_uring"], true, "the ring is not in use: {io}");
    assert!(
        io["transport"].as_str().unwrap().contains("2 entries each"),
        "{io}"
    );
    let daemon = m.pid().unwrap();
    let file = m.mnt.join("f");
    let parked = |state: &str| {
        m.daemon_log()
            .lines()
            .filter(|l| l.contains("test hook: request") && l.contains(state))
            .count()
    };

    let mut in_daemon = pinned_getxattr(&file, "user.checkpointfs.test.park-in-daemon");
    assert!(
        wait_until(Duration::from_secs(10), || parked("parked in the daemon")
            == 1),
        "{}",
        m.daemon_log()
    );
    let mut awaiting_commit = pinned_getxattr(&file, "user.checkpointfs.test.park-awaiting-commit");
    assert!(
        wait_until(Duration::from_secs(10), || parked("parked awaiting commit")
            == 1),
        "{}",
        m.daemon_log()
    );
    assert!(
        m.daemon_log()
            .contains("on ring queue 0 parked awaiting commit")
    );
    // Both entries of queue 0 are held: this one waits in the kernel's queue.
    let mut queued = pinned_getxattr(&file, "user.absent");
    let queued_pid = queued.0.id();
    assert!(
        wait_until(Duration::from_secs(10), || in_getxattr(queued_pid)
            && waits_on_fuse(queued_pid)),
        "the third caller never blocked on the mount (state {:?})",
        state_letter(queued_pid).map(char::from)
    );
    assert_eq!(
        queued.0.try_wait().unwrap(),
        None,
        "the queued caller was answered"
    );

    for caller in [&mut in_daemon, &mut awaiting_commit, &mut queued] {
        caller.0.kill().unwrap();
    }
    queued
        .wait_for(Duration::from_secs(10))
        .expect("a SIGKILLed caller queued on the ring did not end");

    let stopped_at = Instant::now();
    let (bound, _cont) = match stop {
        Stop::Kill9 => {
            m.kill_daemon();
            (Duration::from_secs(20), None)
        }
        Stop::Sigstop => {
            // SAFETY: kill(2) on the daemon this test mounted.
            assert_eq!(unsafe { libc::kill(daemon, libc::SIGSTOP) }, 0);
            (STOPPED_BOUND + SLACK, Some(Continue(daemon)))
        }
    };
    in_daemon
        .wait_for(bound)
        .expect("a caller whose request was parked in the daemon never ended");
    awaiting_commit
        .wait_for(bound)
        .expect("a caller whose reply awaited its commit never ended");
    eprintln!(
        "both held callers ended {:?} after the stop",
        stopped_at.elapsed()
    );
    if let Stop::Sigstop = stop {
        assert!(
            m.daemon_log()
                .contains("has been stopped for 10 s; aborting FUSE connection"),
            "{}",
            m.daemon_log()
        );
    }
}

#[test]
fn kill9_with_ring_requests_queued_in_the_daemon_and_awaiting_commit_ends_every_caller() {
    ring_requests_in_every_state_end_when_the_daemon(Stop::Kill9);
}

#[test]
fn sigstop_with_ring_requests_queued_in_the_daemon_and_awaiting_commit_ends_every_caller() {
    ring_requests_in_every_state_end_when_the_daemon(Stop::Sigstop);
}
