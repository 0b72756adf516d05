//! Issue 28 item 7: another user of an `--allow-other` mount cannot fill the owner's state
//! dir. Each uid but the owner's and root's has a budget of `ctl` lines and state bytes
//! (`history::budget`); past it they get EDQUOT, nothing of theirs is changed or recorded,
//! and the owner's own work goes on.
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::{
    TestMount, checkpoint, checkpoint_ids_oldest_first, run_as, stderr, stdout, test_user,
};

/// The bytes of every file below `dir`.
fn bytes_below(dir: &Path) -> u64 {
    crate::common::all_paths(dir)
        .iter()
        .filter_map(|p| fs::symlink_metadata(p).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// A mount that lets `cpfs-test-budget` in, with a world-writable `shared/` in SRC, where
/// `before_mount` puts files directly (untracked: a first change must copy them).
fn shared_mount(budget: Option<&str>, before_mount: impl FnOnce(&Path)) -> (TestMount, u32, u32) {
    let (uid, gid) = test_user("cpfs-test-budget");
    let mut args = vec!["--allow-other"];
    if let Some(b) = budget {
        args.extend(["--other-users-budget", b]);
    }
    let mut m = TestMount::unmounted(&args);
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let shared = m.src.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    before_mount(&shared);
    m.mount();
    (m, uid, gid)
}

/// Runs a python3 program as the other user; returns its stdout. The system's python3: a
/// python3 found on root's PATH may live where the other user cannot reach it.
fn python_as(uid: u32, gid: u32, program: &str, args: &[&str]) -> String {
    let mut command = vec!["/usr/bin/python3", "-c", program];
    command.extend_from_slice(args);
    let out = run_as(uid, gid, &command);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn another_users_ctl_lines_stop_at_their_budget_and_the_owner_goes_on() {
    let (m, uid, gid) = shared_mount(Some("25,1M"), |_| {});
    let ctl = m.mnt.join(".checkpoint/ctl");
    let out = python_as(uid, gid, CTL_FLOOD, &[ctl.to_str().unwrap(), "600", "1000"]);
    assert_eq!(out.trim(), "25 975 {}", "{out}");
    // The refused line was not taken: 25 checkpoints of theirs, and the owner's still work.
    checkpoint(&m, "owner-1");
    fs::write(m.mnt.join("owner.txt"), "mine\n").unwrap();
    checkpoint(&m, "owner-2");
    let ids = checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.iter().filter(|id| id.starts_with("guest-")).count(), 25);
    assert!(
        ids.ends_with(&["owner-1".into(), "owner-2".into()]),
        "{ids:?}"
    );
    assert!(
        m.daemon_log()
            .contains(&format!("uid {uid} reached its budget of 25 ctl lines")),
        "{}",
        m.daemon_log()
    );
}

/// Appends to each file in turn; prints how many appends succeeded and the errno that
/// stopped them.
const APPEND_EACH: &str = r#"
import os, sys
done, err = 0, 0
for path in sys.argv[1:]:
    try:
        with open(path, "ab") as f:
            f.write(b"guest\n")
        done += 1
    except OSError as e:
        err = e.errno
        break
print(done, err)
"#;

#[test]
fn another_users_changes_stop_at_their_byte_budget_and_change_nothing() {
    // Five 20 KB files of the owner's, which anyone may write, untracked: each first write
    // by the other user copies one into the store.
    let (m, uid, gid) = shared_mount(Some("1000,64K"), |shared| {
        for i in 0..5u8 {
            let f = shared.join(format!("f{i}"));
            fs::write(&f, vec![b'a' + i; 20_000]).unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
        }
    });
    let paths: Vec<_> = (0..5).map(|i| m.mnt.join(format!("shared/f{i}"))).collect();
    checkpoint(&m, "c1");
    let args: Vec<&str> = paths.iter().map(|p| p.to_str().unwrap()).collect();
    let out = python_as(uid, gid, APPEND_EACH, &args);
    // 3 × 20 KB fit in 64 KiB; the fourth backup would not.
    assert_eq!(out.trim(), format!("3 {}", libc::EDQUOT), "{out}");
    assert_eq!(
        fs::read(&paths[3]).unwrap(),
        vec![b'd'; 20_000],
        "unchanged"
    );
    // Nothing of theirs is recorded once over: not even a rename, which needs no new content.
    let out = run_as(
        uid,
        gid,
        &[
            "mv",
            m.mnt.join("shared/f4").to_str().unwrap(),
            m.mnt.join("shared/g4").to_str().unwrap(),
        ],
    );
    assert!(
        stderr(&out).contains("Disk quota exceeded"),
        "{}",
        stderr(&out)
    );
    assert!(m.src.join("shared/f4").exists());
    // The owner's changes to the same files go on, and are recorded.
    fs::write(&paths[3], "owner\n").unwrap();
    checkpoint(&m, "c2");
    assert_eq!(
        fs::read(m.mnt.join(".checkpoint/at/c1/shared/f3")).unwrap(),
        vec![b'd'; 20_000]
    );
    let usage = crate::common::cli_ok(&["status", m.mnt.to_str().unwrap(), "--json"]);
    let usage: serde_json::Value = serde_json::from_str(&usage).unwrap();
    let others = &usage["other_users"]["usage"];
    assert_eq!(others[0]["uid"], uid, "{usage:#}");
    assert!(
        others[0]["state_bytes"].as_u64().unwrap() <= 64 << 10,
        "{usage:#}"
    );
}

/// Writes `ctl` lines one at a time for `seconds` or `lines` lines, whichever ends first,
/// going on after refusals; prints how many were taken, how many refused with EDQUOT, and
/// any other errno with its count.
const CTL_FLOOD: &str = r#"
import collections, errno, os, sys, time
ctl, seconds, lines = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
taken, errors, i = 0, collections.Counter(), 0
end = time.monotonic() + seconds
while time.monotonic() < end and i < lines:
    try:
        fd = os.open(ctl, os.O_WRONLY)
        try:
            os.write(fd, b"guest-%d\n" % i)
        finally:
            os.close(fd)
        taken += 1
    except OSError as e:
        errors[e.errno] += 1
    i += 1
print(taken, errors.pop(errno.EDQUOT, 0), dict(errors))
"#;

/// Issue 28 item 7, the issue's attack at full scale, on a state dir of its own disk (a
/// 256 MiB tmpfs): another user floods `ctl` for 60 s while the owner writes and takes
/// checkpoints; then renames a 50,000-file directory it made directly in SRC back and
/// forth 10 times through the mount. The owner's state dir grows ≤ 10 MB, none of the
/// owner's writes and checkpoints fails, and once the disk is full, the owner's `gc` still
/// frees space and the owner can write again.
#[test]
fn a_60s_flood_then_50k_file_renames_by_another_user_cost_the_owner_at_most_ten_megabytes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    // Declared first: unmounted after the FUSE mount that keeps its state dir there.
    let disk = tempfile::tempdir().unwrap();
    let _tmpfs = crate::common::OtherMount::new(
        &[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "-o".as_ref(),
            "size=256m,mode=0700".as_ref(),
            "tmpfs".as_ref(),
            disk.path().as_os_str(),
        ],
        disk.path(),
    );
    let (uid, gid) = test_user("cpfs-test-budget");
    let mut m = TestMount::unmounted(&["--allow-other"]);
    m.state = disk.path().join("state");
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let shared = m.src.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let big = shared.join("big");
    fs::create_dir(&big).unwrap();
    for d in 0..50 {
        let dir = big.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..1000 {
            fs::write(dir.join(format!("f{f}")), format!("{d}/{f}\n")).unwrap();
        }
    }
    for p in crate::common::all_paths(&big) {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
    }
    m.mount();
    let m = Arc::new(m);
    checkpoint(&m, "before");
    let before = bytes_below(&m.state);

    // The owner works all through the flood: a changed file and a checkpoint ten times a
    // second (an agent's pace; paced, not synchronised: the owner's own history is not
    // what is measured); any failure panics the thread, and the join below fails the test.
    let flooding = Arc::new(AtomicBool::new(true));
    let owner = {
        let (m, flooding) = (Arc::clone(&m), Arc::clone(&flooding));
        std::thread::spawn(move || {
            let mut n = 0u32;
            while flooding.load(Ordering::Relaxed) {
                fs::write(m.mnt.join("owner-during-flood.txt"), format!("{n}\n")).unwrap();
                checkpoint(&m, &format!("owner-flood-{n}"));
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            n
        })
    };
    let ctl = m.mnt.join(".checkpoint/ctl");
    let out = python_as(
        uid,
        gid,
        CTL_FLOOD,
        &[ctl.to_str().unwrap(), "60", "100000000"],
    );
    flooding.store(false, Ordering::Relaxed);
    let owner_checkpoints = owner.join().expect("an owner's write or checkpoint failed");
    let fields: Vec<&str> = out.split_whitespace().collect();
    let (taken, refused) = (fields[0], fields[1]);
    eprintln!(
        "flood: {taken} lines taken, {refused} refused with EDQUOT, other errors {}; \
         the owner took {owner_checkpoints} checkpoints meanwhile",
        fields[2..].join(" ")
    );
    assert_eq!(
        taken, "1000",
        "the default budget is 1,000 ctl lines: {out}"
    );
    assert!(refused.parse::<u64>().unwrap() > 1000, "{out}");
    assert_eq!(fields[2..].join(" "), "{}", "only EDQUOT refusals: {out}");
    assert!(owner_checkpoints > 0);

    // A directory rename is one record (format 4), so all ten fit the budget.
    let (mut from, mut to) = (m.mnt.join("shared/big"), m.mnt.join("shared/big2"));
    for i in 0..10 {
        let out = run_as(
            uid,
            gid,
            &["mv", from.to_str().unwrap(), to.to_str().unwrap()],
        );
        assert!(out.status.success(), "rename {i}: {}", stderr(&out));
        std::mem::swap(&mut from, &mut to);
        fs::write(m.mnt.join(format!("owner-{i}.txt")), "mine\n").unwrap();
        checkpoint(&m, &format!("owner-{i}"));
    }
    let grown = bytes_below(&m.state) - before;
    eprintln!("state dir grew {grown} bytes");
    assert!(grown <= 10_000_000, "state dir grew {grown} bytes");

    // Now the state disk fills up (another process writes to it). Versions of a 4 MiB file
    // the owner made first give gc something to free.
    let owned = m.mnt.join("owned.bin");
    for i in 0..4u8 {
        fs::write(&owned, vec![i; 4 << 20]).unwrap();
        checkpoint(&m, &format!("owned-{i}"));
    }
    crate::common::fill_disk(&disk.path().join("filler"));
    let err = fs::write(&owned, vec![9u8; 4 << 20]).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "the disk is full: {err}"
    );
    assert_eq!(
        fs::read(&owned).unwrap(),
        vec![3u8; 4 << 20],
        "a failed backup changes nothing"
    );
    let out = crate::common::cli(&["gc", m.mnt.to_str().unwrap(), "--keep", "1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        report["bytes_freed"].as_u64().unwrap() >= 12 << 20,
        "{report:#}"
    );
    fs::write(&owned, vec![9u8; 4 << 20]).unwrap();
    assert_eq!(fs::read(&owned).unwrap(), vec![9u8; 4 << 20]);
}
