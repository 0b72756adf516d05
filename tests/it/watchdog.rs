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
/// returns within 30 s and MNT answers again.
#[test]
fn stopped_daemon_leaves_callers_killable_and_released_within_the_bound() {
    let m = TestMount::new();
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
