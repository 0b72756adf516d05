//! `checkpointfs gc`: retention on real mounts. A history of 50 checkpoints over files of
//! varied sizes and change rates is modelled exactly, so the test knows which store objects
//! gc must keep and which it must free; kept checkpoints must browse and rewind byte for
//! byte as before; a crash between the transcript's rename and the sweep loses nothing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;
use crate::common::sha256_hex;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use checkpointfs::Store;
use common::{TestMount, cli, cli_ok as checked, stderr, stdout, tree_listing};

/// What a path holds in the model: a file's bytes or a symlink's target.
#[derive(Clone, Debug, PartialEq)]
enum Content {
    File(Vec<u8>),
    Link(String),
}

impl Content {
    fn stored_bytes(&self) -> Vec<u8> {
        match self {
            Content::File(b) => b.clone(),
            Content::Link(t) => t.as_bytes().to_vec(),
        }
    }
}

/// Deterministic, distinct bytes: `len` bytes from a seed.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The tree at mount time (besides `static.txt`, which is never changed, so never tracked).
fn initial() -> BTreeMap<String, Content> {
    BTreeMap::from([
        ("big.bin".into(), Content::File(bytes(1, 200 << 10))),
        ("small.txt".into(), Content::File(b"small 0\n".to_vec())),
        ("once.dat".into(), Content::File(bytes(2, 64 << 10))),
        ("dir/sub/nested.txt".into(), Content::File(bytes(3, 3000))),
        ("doomed.txt".into(), Content::File(bytes(4, 5000))),
    ])
}

/// The changes made while answering message `i` (after checkpoint `msg-i`).
fn epoch(i: u64, tree: &mut BTreeMap<String, Content>) {
    // Changed at every message, large and small.
    tree.insert(
        "big.bin".into(),
        Content::File(bytes(1000 + i, (200 << 10) + i as usize)),
    );
    tree.insert(
        "small.txt".into(),
        Content::File(format!("small {i}\n").into_bytes()),
    );
    if i == 3 {
        tree.insert("once.dat".into(), Content::File(bytes(2000, 80 << 10)));
    }
    if i.is_multiple_of(5) {
        tree.insert(
            "dir/sub/nested.txt".into(),
            Content::File(bytes(3000 + i, 3000 + i as usize)),
        );
    }
    if i == 10 {
        tree.insert("link".into(), Content::Link("small.txt".into()));
    }
    if i == 20 || i == 44 {
        tree.insert("created.txt".into(), Content::File(bytes(4000 + i, 7000)));
    }
    if i == 30 {
        tree.remove("doomed.txt");
    }
}

/// The model's tree after the changes of messages 1..=n.
fn tree_after(n: u64) -> BTreeMap<String, Content> {
    let mut t = initial();
    for i in 1..=n {
        epoch(i, &mut t);
    }
    t
}

/// Makes `tree` (the model after epoch `i - 1`) become the model after epoch `i`, through
/// the mount.
fn apply_epoch(mnt: &Path, before: &BTreeMap<String, Content>, i: u64) {
    let mut after = before.clone();
    epoch(i, &mut after);
    for (path, c) in &after {
        if before.get(path) == Some(c) {
            continue;
        }
        let p = mnt.join(path);
        match c {
            Content::File(b) => fs::write(&p, b).unwrap(),
            Content::Link(t) => symlink(t, &p).unwrap(),
        }
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        fs::remove_file(mnt.join(path)).unwrap();
    }
}

/// The paths changed (so tracked) in epochs 1..=n.
fn tracked(n: u64) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in 1..=n {
        let (before, after) = (tree_after(i - 1), tree_after(i));
        for p in before.keys().chain(after.keys()) {
            if before.get(p) != after.get(p) && !out.contains(p) {
                out.push(p.clone());
            }
        }
    }
    out
}

/// Hashes and sizes of the store objects the checkpoints `from..=to` need, in a history of
/// `n` epochs (checkpoint `msg-k` sees the tree after epoch k-1; only tracked paths are
/// stored, the others are read from SRC).
fn objects_for(from: u64, to: u64, n: u64) -> BTreeMap<String, u64> {
    let tracked = tracked(n);
    let mut out = BTreeMap::new();
    for k in from..=to {
        for (path, c) in tree_after(k - 1) {
            if tracked.contains(&path) {
                let b = c.stored_bytes();
                out.insert(sha256_hex(&b), b.len() as u64);
            }
        }
    }
    out
}

/// The objects in STATE/backups (files and pack entries), name → size, as a store opened
/// beside the daemon's sees them.
fn store_objects(state: &Path) -> BTreeMap<String, u64> {
    Store::open(&state.join("backups"))
        .unwrap()
        .objects()
        .unwrap()
        .into_iter()
        .collect()
}

fn store_bytes(state: &Path) -> u64 {
    store_objects(state).values().sum()
}

/// Waits for the background copier to store everything the model says the history holds.
fn wait_for_store(state: &Path, expected: &BTreeMap<String, u64>) {
    let done = common::wait_until(Duration::from_secs(30), || {
        &store_objects(state) == expected
    });
    assert!(
        done,
        "store never matched the model:\nmissing {:?}\nextra {:?}",
        expected
            .keys()
            .filter(|k| !store_objects(state).contains_key(*k))
            .collect::<Vec<_>>(),
        store_objects(state)
            .keys()
            .filter(|k| !expected.contains_key(*k))
            .collect::<Vec<_>>()
    );
}

/// Waits until the background copier is done and its records are in the transcript, so
/// the state dir's bytes stay as they are until the test changes something.
fn settle(m: &TestMount, expected: &BTreeMap<String, u64>) {
    wait_for_store(&m.state, expected);
    let mnt = m.mnt.to_str().unwrap();
    // 0 once every copy, queued or in flight, is recorded.
    assert!(common::wait_until(Duration::from_secs(30), || {
        checked(&["status", mnt]).contains("pending copies: 0")
    }));
    checked(&["log", mnt]); // flushes the transcript
}

/// A mount with checkpoints msg-1..=msg-n, each followed by its epoch's changes.
fn mount_with_history(n: u64, env: &[(&str, &str)]) -> TestMount {
    let mut m = TestMount::unmounted(&[]);
    for (path, c) in initial() {
        let p = m.src.join(&path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, c.stored_bytes()).unwrap();
    }
    fs::write(m.src.join("static.txt"), b"never changed\n").unwrap();
    for (k, v) in env {
        m.set_env(k, v);
    }
    m.mount();
    let mut tree = initial();
    for i in 1..=n {
        m.ctl(&format!("msg-{i}")).unwrap();
        apply_epoch(&m.mnt, &tree, i);
        epoch(i, &mut tree);
    }
    m
}

fn at_list(m: &TestMount) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(m.mnt.join(".checkpoint/at"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort_by_key(|id| {
        id.trim_start_matches("msg-")
            .split(':')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    v
}

fn ids(range: std::ops::RangeInclusive<u64>) -> Vec<String> {
    range.map(|i| format!("msg-{i}")).collect()
}

/// tree_listing of every checkpoint in `range`, by id.
fn views(m: &TestMount, range: std::ops::RangeInclusive<u64>) -> BTreeMap<String, Vec<String>> {
    range
        .map(|k| {
            let id = format!("msg-{k}");
            let listing = tree_listing(&m.mnt.join(".checkpoint/at").join(&id));
            (id, listing)
        })
        .collect()
}

/// The model tree `t`, plus static.txt, as the mount shows it: path → content.
fn assert_tree_is(dir: &Path, t: &BTreeMap<String, Content>) {
    for (path, c) in t {
        let p = dir.join(path);
        match c {
            Content::File(b) => assert!(fs::read(&p).unwrap() == *b, "{} differs", p.display()),
            Content::Link(target) => {
                assert_eq!(fs::read_link(&p).unwrap().to_str(), Some(target.as_str()))
            }
        }
    }
    for gone in ["doomed.txt", "created.txt", "link"] {
        if !t.contains_key(gone) {
            assert!(
                fs::symlink_metadata(dir.join(gone)).is_err(),
                "{gone} exists"
            );
        }
    }
    assert_eq!(
        fs::read(dir.join("static.txt")).unwrap(),
        b"never changed\n"
    );
}

fn transcript(m: &TestMount) -> Vec<u8> {
    fs::read(m.state.join("transcript.jsonl")).unwrap()
}

fn gc(m: &TestMount, args: &[&str]) -> String {
    let mut all = vec!["gc", m.mnt.to_str().unwrap()];
    all.extend_from_slice(args);
    checked(&all)
}

/// `checkpointfs gc --state-dir STATE ARGS...`.
fn gc_state_dir(m: &TestMount, args: &[&str]) -> std::process::Output {
    let mut all = vec!["gc", "--state-dir", m.state.to_str().unwrap()];
    all.extend_from_slice(args);
    cli(&all)
}

#[test]
fn gc_keep_10_of_50_frees_exactly_what_only_dropped_checkpoints_needed() {
    let mut m = mount_with_history(50, &[]);
    // Everything any checkpoint (and the pre-images, = msg-1's view) needed is stored.
    let all = objects_for(1, 50, 50);
    wait_for_store(&m.state, &all);
    let before_bytes = store_bytes(&m.state);
    let kept_views = views(&m, 41..=50);
    let live_before = tree_listing(&m.mnt);

    let out = gc(&m, &["--keep", "10"]);
    let expected_kept = objects_for(41, 50, 50);
    let removed: u64 = all
        .iter()
        .filter(|(k, _)| !expected_kept.contains_key(*k))
        .map(|(_, s)| s)
        .sum();
    assert!(
        removed > 40 * (200 << 10),
        "the model frees too little: {removed}"
    );
    let removed_count = all.len() - expected_kept.len();
    assert!(
        out.starts_with(&format!(
            "dropped 40 checkpoints (msg-1 … msg-40), removed {removed_count} objects, freed "
        )),
        "{out}"
    );
    assert!(
        out.ends_with("; kept 10 checkpoints (msg-41 … msg-50)\n"),
        "{out}"
    );
    // Exactly the objects the kept checkpoints need are left: once.dat (changed at message
    // 3, long dropped) and nested.txt (last changed at 40) are among them.
    assert_eq!(store_objects(&m.state), expected_kept);
    assert_eq!(store_bytes(&m.state), before_bytes - removed);
    assert_transcript_objects_stored(&m.state);
    assert!(expected_kept.contains_key(&sha256_hex(&bytes(2000, 80 << 10))));

    assert_eq!(at_list(&m), ids(41..=50));
    assert!(fs::symlink_metadata(m.mnt.join(".checkpoint/at/msg-40")).is_err());
    assert_eq!(views(&m, 41..=50), kept_views);
    assert_tree_is(&m.mnt.join(".checkpoint/at/msg-41"), &tree_after(40));
    assert_eq!(tree_listing(&m.mnt), live_before);

    // Rewind to the oldest kept checkpoint: byte for byte; and undo it.
    let out = checked(&["rewind", m.mnt.to_str().unwrap(), "msg-41"]);
    assert!(
        out.contains("saved current state as msg-41:before-rewind"),
        "{out}"
    );
    assert_tree_is(&m.mnt, &tree_after(40));
    assert_eq!(tree_listing(&m.mnt), kept_views["msg-41"]);
    checked(&["rewind", m.mnt.to_str().unwrap(), "msg-41:before-rewind"]);
    assert_eq!(tree_listing(&m.mnt), live_before);
    assert_tree_is(&m.mnt, &tree_after(50));

    // Remount: the compacted transcript replays to the same log and the same views.
    let log = checked(&["log", m.mnt.to_str().unwrap()]);
    assert!(
        log.starts_with("(earlier checkpoints were dropped by gc)\nmsg-41  "),
        "{log}"
    );
    m.remount();
    assert_transcript_objects_stored(&m.state);
    assert_eq!(checked(&["log", m.mnt.to_str().unwrap()]), log);
    assert_eq!(views(&m, 41..=50), kept_views);
    assert_eq!(tree_listing(&m.mnt), live_before);
    checked(&["rewind", m.mnt.to_str().unwrap(), "msg-45"]);
    assert_tree_is(&m.mnt, &tree_after(44));
}

#[test]
fn gc_twice_is_idempotent_and_dry_run_changes_nothing() {
    let m = mount_with_history(12, &[]);
    settle(&m, &objects_for(1, 12, 12));
    let (store_before, transcript_before) = (store_objects(&m.state), transcript(&m));

    let out = gc(&m, &["--keep", "4", "--dry-run"]);
    assert!(
        out.starts_with("would drop 8 checkpoints (msg-1 … msg-8), would remove "),
        "{out}"
    );
    assert!(out.contains("dry run: nothing was changed"), "{out}");
    assert_eq!(store_objects(&m.state), store_before);
    assert_eq!(transcript(&m), transcript_before);
    assert_eq!(at_list(&m), ids(1..=12));

    // Browsed before gc, so the kernel has the entries cached: they must go with it.
    let dropped_file = m.mnt.join(".checkpoint/at/msg-2/small.txt");
    assert_eq!(fs::read(&dropped_file).unwrap(), b"small 1\n");
    gc(&m, &["--keep", "4"]);
    assert!(fs::symlink_metadata(m.mnt.join(".checkpoint/at/msg-2")).is_err());
    assert!(fs::symlink_metadata(&dropped_file).is_err());
    assert!(fs::read(&dropped_file).is_err());
    let (store_once, transcript_once) = (store_objects(&m.state), transcript(&m));
    assert_eq!(store_once, objects_for(9, 12, 12));
    let again = gc(&m, &["--keep", "4"]);
    assert_eq!(
        again,
        "dropped 0 checkpoints, removed 0 objects, freed 0 B; kept 4 checkpoints (msg-9 … \
         msg-12)\n"
    );
    assert_eq!(store_objects(&m.state), store_once);
    assert_eq!(transcript(&m), transcript_once);
}

/// Dates every record of an unmounted state dir's transcript `age` in the past: how a
/// test gets checkpoints of a known age without waiting for them to grow old.
fn backdate_transcript(state: &Path, age: Duration) {
    let when = checkpointfs::rfc3339(std::time::SystemTime::now() - age);
    let path = state.join("transcript.jsonl");
    let mut out = String::new();
    for line in fs::read_to_string(&path).unwrap().lines() {
        let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
        r["snapshot"]["timestamp"] = serde_json::json!(when);
        if let Some(backups) = r["snapshot"]["trackedFileBackups"].as_object_mut() {
            for b in backups.values_mut() {
                b["backupTime"] = serde_json::json!(when);
            }
        }
        out.push_str(&serde_json::to_string(&r).unwrap());
        out.push('\n');
    }
    fs::write(&path, out).unwrap();
}

#[test]
fn gc_older_than_drops_checkpoints_before_the_boundary_and_reports_json() {
    let mut m = TestMount::new();
    for i in 1..=3 {
        m.ctl(&format!("old-{i}")).unwrap();
        fs::write(m.mnt.join("f.txt"), format!("old {i}\n")).unwrap();
    }
    m.umount();
    backdate_transcript(&m.state, Duration::from_secs(2 * 3600));
    m.mount();
    for i in 1..=3 {
        m.ctl(&format!("new-{i}")).unwrap();
        fs::write(m.mnt.join("f.txt"), format!("new {i}\n")).unwrap();
    }
    let new_1 = fs::read(m.mnt.join(".checkpoint/at/new-1/f.txt")).unwrap();
    assert_eq!(new_1, b"old 3\n");
    // old-* are 2 h old, new-* a moment old: a 1 h boundary lies between them.
    let out = gc(&m, &["--older-than", "1h", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&out).expect("gc --json is JSON");
    assert_eq!(report["schema"], "checkpointfs.gc/1");
    assert_eq!(report["dry_run"], false);
    assert_eq!(
        report["dropped"],
        serde_json::json!(["old-1", "old-2", "old-3"])
    );
    assert_eq!(
        report["kept"],
        serde_json::json!(["new-1", "new-2", "new-3"])
    );
    // "old 1" and "old 2" (and the empty pre-image... none: f.txt was created) are gone.
    assert_eq!(report["objects_removed"], 2);
    assert_eq!(report["bytes_freed"], 12);
    assert_eq!(
        fs::read(m.mnt.join(".checkpoint/at/new-1/f.txt")).unwrap(),
        new_1
    );
    m.umount();
    // Offline, through the state dir; every checkpoint is 2 h old now, but the newest
    // checkpoint is always kept.
    backdate_transcript(&m.state, Duration::from_secs(2 * 3600));
    let out = gc_state_dir(&m, &["--older-than", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = stdout(&out);
    assert!(out.contains("kept 1 checkpoint (new-3)"), "{out}");
    m.mount();
    assert_eq!(at_list(&m), vec!["new-3"]);
    assert_eq!(
        fs::read(m.mnt.join(".checkpoint/at/new-3/f.txt")).unwrap(),
        b"new 2\n"
    );
    checked(&["rewind", m.mnt.to_str().unwrap(), "new-3"]);
    assert_eq!(fs::read(m.mnt.join("f.txt")).unwrap(), b"new 2\n");
}

#[test]
fn gc_bad_input_is_refused_with_exit_2_and_changes_nothing() {
    let m = mount_with_history(3, &[]);
    settle(&m, &objects_for(1, 3, 3));
    let (store_before, transcript_before) = (store_objects(&m.state), transcript(&m));
    let mnt = m.mnt.to_str().unwrap();
    let not_a_mount = m.src.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["gc", mnt, "--keep", "1", "--older-than", "1d"],
            "cannot be used with",
        ),
        (&["gc", mnt], "--keep <N>"),
        (&["gc", mnt, "--older-than", "7x"], "unknown unit 'x'"),
        (&["gc", mnt, "--older-than=-1d"], "invalid duration '-1d'"),
        (&["gc", mnt, "--older-than="], "invalid duration '': empty"),
        (
            &["gc", mnt, "--keep", "0"],
            "gc always keeps at least the newest",
        ),
        (
            &["gc", mnt, "--keep", "many"],
            "is not a number of checkpoints",
        ),
        (
            &["gc", not_a_mount, "--keep", "1"],
            "is not a checkpointfs mount",
        ),
        (
            &["gc", "--state-dir", not_a_mount, "--keep", "1"],
            "is not a checkpointfs state dir",
        ),
    ];
    for (args, message) in cases {
        let out = cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(store_objects(&m.state), store_before);
    assert_eq!(transcript(&m), transcript_before);
    assert_eq!(at_list(&m), ids(1..=3));
}

#[test]
fn gc_crash_after_rename_loses_nothing_and_the_next_gc_sweeps_the_orphans() {
    let mut m = mount_with_history(10, &[("CHECKPOINTFS_FAILPOINT", "gc-after-rename")]);
    let all = objects_for(1, 10, 10);
    wait_for_store(&m.state, &all);
    let kept_views = views(&m, 8..=10);
    let live = tree_listing(&m.mnt);

    let out = cli(&["gc", m.mnt.to_str().unwrap(), "--keep", "3"]);
    assert_eq!(out.status.code(), Some(1), "the daemon should have aborted");
    m.kill9(); // reaps the aborted daemon and detaches its dead mount
    // The new transcript is in place; the objects it no longer needs are still there.
    let text = String::from_utf8(transcript(&m)).unwrap();
    assert!(
        text.lines().next().unwrap().contains("\"gcBase\":true"),
        "{text}"
    );
    assert_eq!(store_objects(&m.state), all);
    // A temp transcript from a crash before a rename is garbage: removed at mount.
    let stale = m.state.join(".transcript.jsonl.rewrite-4242-1-0");
    fs::write(&stale, b"half a transcript").unwrap();

    m.set_env("CHECKPOINTFS_FAILPOINT", "");
    m.mount();
    assert!(!stale.exists(), "stale rewrite temp survived the mount");
    assert_eq!(at_list(&m), ids(8..=10));
    assert_eq!(views(&m, 8..=10), kept_views);
    assert_eq!(tree_listing(&m.mnt), live);
    // The next gc sweeps every unreferenced object, also the orphans of the crashed one.
    let orphans = all.len() - objects_for(8, 10, 10).len();
    let out = gc(&m, &["--keep", "3"]);
    assert!(
        out.starts_with(&format!("dropped 0 checkpoints, removed {orphans} objects")),
        "{out}"
    );
    assert_eq!(store_objects(&m.state), objects_for(8, 10, 10));
    checked(&["rewind", m.mnt.to_str().unwrap(), "msg-8"]);
    assert_tree_is(&m.mnt, &tree_after(7));
}

#[test]
fn gc_state_dir_is_refused_while_another_process_holds_the_state_lock() {
    let mut m = mount_with_history(3, &[]);
    m.umount();
    // A foreground daemon started by hand would hold the lock; so does this flock(1).
    let lock = m.state.join("lock");
    let mut holder = std::process::Command::new("flock")
        .arg(&lock)
        .arg("sleep")
        .arg("30")
        .spawn()
        .expect("flock(1)");
    assert!(common::wait_until(Duration::from_secs(5), || {
        fs::metadata(&lock).is_ok()
            && std::process::Command::new("flock")
                .args(["-n", lock.to_str().unwrap(), "true"])
                .status()
                .is_ok_and(|s| !s.success())
    }));
    let transcript_before = transcript(&m);
    let out = gc_state_dir(&m, &["--keep", "1"]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is in use by another checkpointfs process"),
        "{}",
        stderr(&out)
    );
    assert_eq!(transcript(&m), transcript_before);
}

/// Every object the transcript names is in the store: nothing a kept checkpoint or a backup
/// since still needs was deleted.
fn assert_transcript_objects_stored(state: &Path) {
    let text = fs::read_to_string(state.join("transcript.jsonl")).unwrap();
    let objects = store_objects(state);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let backups = v["snapshot"]["trackedFileBackups"].as_object().unwrap();
        for (path, b) in backups {
            if let Some(name) = b["backupFileName"].as_str() {
                assert!(
                    objects.contains_key(name),
                    "{path}: object {name} is named by the transcript but gone"
                );
            }
        }
    }
}

#[test]
fn gc_while_files_change_and_checkpoints_are_taken_loses_no_backup() {
    let mut m = mount_with_history(10, &[]);
    let mnt = m.mnt.clone();
    let busy = mnt.join("busy.txt");
    let writer = std::thread::spawn(move || {
        let mut taken = Vec::new();
        for j in 0..3000u32 {
            fs::write(&busy, format!("w{j}\n")).unwrap();
            if j % 100 == 0 {
                let id = format!("live-{j}");
                fs::write(mnt.join(".checkpoint/ctl"), format!("{id}\n")).unwrap();
                taken.push((id, format!("w{j}\n")));
            }
        }
        taken
    });
    // gc over and over while the writer runs: each time with mutations and checkpoints
    // waiting on it, and fills of pending versions racing its sweep.
    let mut concurrent = 0;
    while !writer.is_finished() {
        gc(&m, &["--keep", "3"]);
        concurrent += 1;
    }
    let taken = writer.join().expect("writer thread");
    assert!(concurrent >= 2, "the writer was done before gc ran twice");
    gc(&m, &["--keep", "3"]);
    assert_transcript_objects_stored(&m.state);
    let kept = at_list(&m);
    assert_eq!(kept.len(), 3, "{kept:?}");
    let check_views = |m: &TestMount| {
        for (id, content) in taken.iter().filter(|(id, _)| kept.contains(id)) {
            let at = m.mnt.join(".checkpoint/at").join(id);
            assert_eq!(
                fs::read_to_string(at.join("busy.txt")).unwrap(),
                *content,
                "{id}"
            );
            assert_tree_is(&at, &tree_after(10));
        }
    };
    check_views(&m);
    m.remount();
    assert_eq!(at_list(&m), kept);
    check_views(&m);
    assert_transcript_objects_stored(&m.state);
}

#[test]
fn gc_state_dir_after_a_daemon_crash_keeps_what_only_the_journal_recorded() {
    let mut m = mount_with_history(8, &[]);
    m.kill9(); // the transcript may lack the last records; the journal has them
    let out = gc_state_dir(&m, &["--keep", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("dropped 5 checkpoints (msg-1 … msg-5)"),
        "{}",
        stdout(&out)
    );
    let allowed = objects_for(6, 8, 8);
    assert!(
        store_objects(&m.state)
            .keys()
            .all(|k| allowed.contains_key(k)),
        "gc kept objects no kept checkpoint needs"
    );
    assert_transcript_objects_stored(&m.state);
    m.mount();
    assert_eq!(at_list(&m), ids(6..=8));
    for k in 6..=8 {
        assert_tree_is(
            &m.mnt.join(format!(".checkpoint/at/msg-{k}")),
            &tree_after(k - 1),
        );
    }
    assert_tree_is(&m.mnt, &tree_after(8));
    checked(&["rewind", m.mnt.to_str().unwrap(), "msg-6"]);
    assert_tree_is(&m.mnt, &tree_after(5));
}

/// Runs `checkpointfs ARGS...` with a terminal as stdin/stdout/stderr (script(1)); what the
/// terminal showed.
fn on_terminal(args: &[&str]) -> String {
    let line = std::iter::once(common::BIN)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let out = common::run("script", &["-qec", &line, "/dev/null"], Path::new("/"));
    assert!(out.status.success(), "{line}: {}", stdout(&out));
    stdout(&out)
}

#[test]
fn progress_goes_to_a_terminal_and_nowhere_else() {
    let m = mount_with_history(6, &[]);
    let mnt = m.mnt.to_str().unwrap();
    let shown = on_terminal(&["gc", mnt, "--keep", "4"]);
    assert!(
        shown.contains("\rgc: swept ") || shown.contains("gc: swept "),
        "{shown:?}"
    );
    assert!(shown.contains("dropped 2 checkpoints"), "{shown:?}");
    let shown = on_terminal(&["rewind", mnt, "msg-5"]);
    assert!(shown.contains("rewind: "), "{shown:?}");
    assert!(shown.contains(" paths"), "{shown:?}");
    // Not a terminal: stderr stays empty.
    let out = cli(&["gc", mnt, "--keep", "2"]);
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
    let out = cli(&["rewind", mnt, "msg-6"]);
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
}

/// Issue 28 item 7: once the state dir's disk is full — here a 128 MiB tmpfs that another
/// file fills — the owner's backups fail with ENOSPC, and gc must still free space: it needs
/// room to write the compacted transcript before it may delete anything, which the state
/// dir's reserve (`gc-reserve`) gives it.
#[test]
fn gc_frees_space_on_a_full_state_disk() {
    // Declared first: unmounted after the FUSE mount that keeps its state dir there.
    let disk = tempfile::tempdir().unwrap();
    let _tmpfs = common::OtherMount::new(
        &[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "-o".as_ref(),
            "size=128m,mode=0700".as_ref(),
            "tmpfs".as_ref(),
            disk.path().as_os_str(),
        ],
        disk.path(),
    );
    let mut m = TestMount::unmounted(&[]);
    m.state = disk.path().join("state");
    m.mount();
    let reserve = fs::metadata(m.state.join("gc-reserve")).unwrap().len();
    assert!(reserve >= 40 << 20, "reserve {reserve}");
    // Five versions of a 4 MiB file: 16 MiB of backups gc can drop with --keep 1.
    let f = m.mnt.join("big.bin");
    for i in 0..6 {
        fs::write(&f, bytes(i, 4 << 20)).unwrap();
        common::checkpoint(&m, &format!("c{i}"));
    }
    // Fill what is left of the disk.
    common::fill_disk(&disk.path().join("filler"));
    let err = fs::write(&f, bytes(99, 4 << 20)).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOSPC),
        "the disk is full: {err}"
    );
    let before = store_bytes(&m.state);
    let report: serde_json::Value =
        serde_json::from_str(&gc(&m, &["--keep", "1", "--json"])).unwrap();
    assert!(
        report["bytes_freed"].as_u64().unwrap() >= 16 << 20,
        "{report:#}"
    );
    assert!(store_bytes(&m.state) + (16 << 20) <= before);
    // What gc freed is the owner's again (the reserve is made again within half of it).
    fs::write(&f, bytes(99, 4 << 20)).unwrap();
    assert_eq!(fs::read(&f).unwrap(), bytes(99, 4 << 20));
    assert!(m.state.join("gc-reserve").exists());
    m.umount();
}
