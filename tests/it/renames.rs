//! Renames through the mount (issue 28): what views and rewinds answer after `mv`,
//! `os.rename` and `renameat2(RENAME_EXCHANGE)` of files and directories, and what a
//! directory rename costs the state dir. The answers are pinned here before the history
//! records renames in O(1) (docs/design.md, "Renames in O(1)"), which must keep them.
use std::fs;
use std::path::Path;

use crate::common::{self, TestMount, at, checkpoint, sh, tree_listing};

/// `renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)` in the mount, through ctypes.
fn exchange(m: &TestMount, a: &str, b: &str) {
    let script = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
if libc.renameat2(AT_FDCWD, sys.argv[1].encode(), AT_FDCWD, sys.argv[2].encode(), RENAME_EXCHANGE):
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))
"#;
    let out = common::run("python3", &["-c", script, a, b], &m.mnt);
    assert!(out.status.success(), "renameat2: {}", common::stderr(&out));
}

/// Python's `os.rename(a, b)` in the mount.
fn os_rename(m: &TestMount, a: &str, b: &str) {
    let out = common::run(
        "python3",
        &[
            "-c",
            "import os, sys; os.rename(sys.argv[1], sys.argv[2])",
            a,
            b,
        ],
        &m.mnt,
    );
    assert!(out.status.success(), "os.rename: {}", common::stderr(&out));
}

/// A tree made in SRC directly (untracked), changed through the mount by every kind of
/// rename between checkpoints: each view is the tree as it was, byte for byte, and
/// rewinds go back and forth between them.
#[test]
fn renames_by_mv_os_rename_and_exchange_are_viewed_and_rewound_byte_for_byte() {
    renames_viewed_and_rewound(false);
}

/// The same, recorded in format 4 (a rename is two records, nothing below it).
#[test]
fn renames_by_mv_os_rename_and_exchange_are_viewed_and_rewound_byte_for_byte_in_format_4() {
    renames_viewed_and_rewound(true);
}

fn renames_viewed_and_rewound(format4: bool) {
    let mut m = TestMount::unmounted(&[]);
    if !format4 {
        m.set_env("CHECKPOINTFS_RENAMES_PER_PATH", "1");
    }
    for dir in ["a/s", "e", "keep"] {
        fs::create_dir_all(m.src.join(dir)).unwrap();
    }
    for (path, content) in [
        ("a/x", "x0\n"),
        ("a/s/y", "y0\n"),
        ("e/z", "z0\n"),
        ("f", "f0\n"),
        ("keep/k", "k0\n"),
    ] {
        fs::write(m.src.join(path), content).unwrap();
    }
    m.mount();
    let mut trees = vec![tree_listing(&m.src)];
    checkpoint(&m, "c0");

    // A directory by mv, a file by os.rename, two directories exchanged, then a change
    // below the exchanged one.
    sh(&m, "mv a b");
    os_rename(&m, "f", "g");
    exchange(&m, "b", "e");
    fs::write(m.mnt.join("e/x"), "x1\n").unwrap();
    trees.push(tree_listing(&m.src));
    checkpoint(&m, "c1");

    // Nested (e/s renamed, then e), the old name made again, a rename over an existing
    // empty directory, a file exchanged with a directory.
    sh(&m, "mv e/s e/t && mv e w && mkdir e && echo new > e/new");
    sh(&m, "mkdir empty && mv b empty");
    exchange(&m, "g", "keep");
    trees.push(tree_listing(&m.src));
    checkpoint(&m, "c2");

    // Back across checkpoints: w goes back to its first name.
    sh(&m, "mv w a && rm -r e");
    trees.push(tree_listing(&m.src));
    checkpoint(&m, "c3");

    for (n, tree) in trees.iter().enumerate() {
        let id = format!("c{n}");
        assert_eq!(&tree_listing(&at(&m, &id)), tree, "at/{id}/");
    }
    for n in [0, 2, 1, 3] {
        let id = format!("c{n}");
        common::rewind(&m, &id, &[]);
        assert_eq!(
            &tree_listing(&m.src),
            &trees[n],
            "SRC after rewinding to {id}"
        );
        assert_eq!(
            &tree_listing(&m.mnt),
            &trees[n],
            "MNT after rewinding to {id}"
        );
    }
}

/// Renames, then the daemon killed with SIGKILL before any clean shutdown: a remount
/// replays what was recorded, and views and a rewind give the trees as they were.
#[test]
fn renames_are_replayed_after_kill_9_mid_sequence() {
    renames_replayed_after_kill_9(false);
}

/// The same, recorded in format 4.
#[test]
fn renames_are_replayed_after_kill_9_mid_sequence_in_format_4() {
    renames_replayed_after_kill_9(true);
}

fn renames_replayed_after_kill_9(format4: bool) {
    let mut m = TestMount::unmounted(&[]);
    if !format4 {
        m.set_env("CHECKPOINTFS_RENAMES_PER_PATH", "1");
    }
    fs::create_dir_all(m.src.join("a/s")).unwrap();
    fs::write(m.src.join("a/x"), "x0\n").unwrap();
    fs::write(m.src.join("a/s/y"), "y0\n").unwrap();
    m.mount();
    let before = tree_listing(&m.src);
    checkpoint(&m, "c0");
    sh(&m, "mv a b && mkdir a && echo again > a/x && mv b/s s");
    let middle = tree_listing(&m.src);
    checkpoint(&m, "c1");
    sh(&m, "mv s b/s2 && mv b c");
    m.kill9();
    m.mount();
    assert_eq!(tree_listing(&at(&m, "c0")), before, "at/c0/ after kill -9");
    assert_eq!(tree_listing(&at(&m, "c1")), middle, "at/c1/ after kill -9");
    common::rewind(&m, "c0", &[]);
    assert_eq!(tree_listing(&m.src), before, "SRC after rewinding to c0");
}

/// The daemon dies (an abort, as `kill -9` would) between a rename's intent record and its
/// outcome record, once before the syscall and once after it: the next mount decides the
/// rename from SRC (`to` holds what `from` held), says so in the log, and views and a
/// rewind give the trees as they were.
#[test]
fn a_rename_cut_between_intent_and_outcome_is_decided_from_src_at_replay() {
    for (failpoint, happened) in [
        ("rename-after-intent", false),
        ("rename-before-outcome", true),
    ] {
        let mut m = TestMount::unmounted(&[]);
        fs::create_dir_all(m.src.join("a/s")).unwrap();
        fs::write(m.src.join("a/x"), "x0\n").unwrap();
        fs::write(m.src.join("a/s/y"), "y0\n").unwrap();
        m.set_env("CHECKPOINTFS_FAILPOINT", failpoint);
        m.mount();
        let before = tree_listing(&m.src);
        checkpoint(&m, "c0");
        let renamed = fs::rename(m.mnt.join("a"), m.mnt.join("b"));
        assert!(renamed.is_err(), "{failpoint}: the daemon should have died");
        m.kill9();
        assert_eq!(m.src.join("b").exists(), happened, "{failpoint}");
        m.set_env("CHECKPOINTFS_FAILPOINT", "");
        m.mount();
        let log = m.daemon_log();
        let decided = if happened {
            "holds what was renamed, so it happened"
        } else {
            "does not hold what was to be renamed, so it did not happen"
        };
        assert!(
            log.contains("has no recorded outcome") && log.contains(decided),
            "{failpoint}: {log}"
        );
        let now = tree_listing(&m.src);
        assert_eq!(tree_listing(&at(&m, "c0")), before, "{failpoint}: at/c0/");
        checkpoint(&m, "c1");
        assert_eq!(tree_listing(&at(&m, "c1")), now, "{failpoint}: at/c1/");
        common::rewind(&m, "c0", &[]);
        assert_eq!(
            tree_listing(&m.src),
            before,
            "{failpoint}: SRC after rewind"
        );
    }
}

/// `diff` lists the names below a renamed directory as before format 4, which records none
/// of them: computed from the two points when asked (`D a/x`, `A b/x`…), the same in both
/// formats, between checkpoints and against the live tree.
#[test]
fn diff_lists_the_names_a_rename_moved_in_both_formats() {
    let changes = |format4: bool| {
        let mut m = TestMount::unmounted(&[]);
        fs::create_dir_all(m.src.join("a/s")).unwrap();
        fs::write(m.src.join("a/x"), "x0\n").unwrap();
        fs::write(m.src.join("a/s/y"), "y0\n").unwrap();
        if !format4 {
            m.set_env("CHECKPOINTFS_RENAMES_PER_PATH", "1");
        }
        m.mount();
        checkpoint(&m, "c0");
        sh(&m, "mv a b && echo x1 > b/x");
        checkpoint(&m, "c1");
        sh(&m, "mv b/s s");
        let mnt = m.mnt.to_str().unwrap();
        let report = |args: &[&str]| {
            let out = common::cli(&[&["diff", mnt][..], args, &["--json"]].concat());
            assert!(out.status.success(), "{}", common::stderr(&out));
            let v: serde_json::Value = serde_json::from_str(&common::stdout(&out)).unwrap();
            v["files"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| format!("{} {}", f["change"], f["path"].as_str().unwrap()))
                .collect::<Vec<_>>()
        };
        (report(&["c0", "c1"]), report(&["c1"]), report(&["c0"]))
    };
    let (old, new) = (changes(false), changes(true));
    assert_eq!(new, old, "format 4 against the per-path form");
    assert!(
        old.0.iter().any(|l| l.ends_with(" a/s/y")) && old.0.iter().any(|l| l.ends_with(" b/x")),
        "{old:?}"
    );
}

/// The checkpoints under which the daemon's path history (`checkpointfs ui`'s `H`, the
/// `browse-path` request) lists a change of `path`, newest first, as "ID CHANGE".
fn path_history(m: &TestMount, path: &str) -> Vec<String> {
    use std::io::{BufRead, BufReader, Write};
    let socket = std::os::unix::net::UnixStream::connect(m.state.join("control.sock")).unwrap();
    let request = serde_json::json!({"cmd": "browse-path", "path": path});
    (&socket)
        .write_all(format!("{request}\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    BufReader::new(&socket).read_line(&mut line).unwrap();
    let response: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(response["ok"], true, "{response}");
    let answer: serde_json::Value =
        serde_json::from_str(response["output"].as_str().unwrap()).unwrap();
    answer["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r["id"].as_str().unwrap(), r["change"]))
        .collect()
}

/// A path's history lists the checkpoints where a rename of an ancestor moved content into
/// or out of it, as it did when every name below a renamed directory had records of its
/// own: format 4 records none of them, so the history finds those renames by endpoint.
#[test]
fn a_path_history_lists_what_an_ancestor_rename_moved_in_both_formats() {
    let paths = ["d/x", "e/x", "d/s/y", "e/s/y", "s/y"];
    let histories = |format4: bool| {
        let mut m = TestMount::unmounted(&[]);
        fs::create_dir_all(m.src.join("d/s")).unwrap();
        fs::write(m.src.join("d/x"), "x0\n").unwrap();
        fs::write(m.src.join("d/s/y"), "y0\n").unwrap();
        if !format4 {
            m.set_env("CHECKPOINTFS_RENAMES_PER_PATH", "1");
        }
        m.mount();
        checkpoint(&m, "c0");
        sh(&m, "mv d e");
        checkpoint(&m, "c1");
        sh(&m, "echo x1 > e/x");
        checkpoint(&m, "c2");
        sh(&m, "mv e/s s");
        checkpoint(&m, "c3");
        paths.map(|p| path_history(&m, p))
    };
    let (old, new) = (histories(false), histories(true));
    assert_eq!(new, old, "format 4 against the per-path form");
    let expected: [&[&str]; 5] = [
        &["c0 \"deleted\""],
        &["c1 \"modified\"", "c0 \"added\""],
        &["c0 \"deleted\""],
        &["c2 \"deleted\"", "c0 \"added\""],
        &["c2 \"added\""],
    ];
    for ((path, got), want) in paths.iter().zip(&old).zip(expected) {
        assert_eq!(got, want, "history of {path}");
    }
}

/// A state dir whose `format` is newer than this daemon knows is refused at mount, naming
/// both numbers, and nothing is mounted; one without the file (formats 1–3) mounts.
#[test]
fn a_state_dir_of_a_newer_format_is_refused_naming_both_numbers() {
    let mut m = TestMount::new();
    checkpoint(&m, "c0");
    m.umount();
    assert!(
        !m.state.join("format").exists(),
        "no rename yet: no format file"
    );
    fs::write(m.state.join("format"), "5\n").unwrap();
    let out = common::cli(&[
        "mount",
        m.src.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
        "--state-dir",
        m.state.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "mounted a format-5 state dir");
    let err = common::stderr(&out);
    assert!(
        err.contains("transcript format 5") && err.contains("format 4"),
        "{err}"
    );
    fs::remove_file(m.state.join("format")).unwrap();
    m.mount();
    assert!(at(&m, "c0").is_dir());
}

/// Bytes the state dir's files take on disk.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    common::all_paths(dir)
        .iter()
        .filter_map(|p| fs::symlink_metadata(p).ok())
        .map(|meta| meta.blocks() * 512)
        .sum()
}

/// Issue 28, item 7: another user can rename a big directory made in SRC directly (free
/// for them) back and forth, and each rename backs up every path below it at both names:
/// 300–400 MB in seconds for a 50k-file directory. A rename must cost the state dir O(1).
#[test]
fn renaming_a_20000_file_directory_ten_times_grows_the_state_dir_by_at_most_10_mb() {
    let mut m = TestMount::unmounted(&[]);
    // Format 4 (not yet the default: see docs/design.md, "Renames in O(1)").
    for d in 0..200 {
        let dir = m.src.join(format!("big/d{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            fs::write(dir.join(format!("f{f:03}")), format!("{d}/{f}\n")).unwrap();
        }
    }
    m.mount();
    checkpoint(&m, "before");
    m.umount();
    let state_before = allocated(&m.state);
    let transcript = |m: &TestMount| {
        ["transcript.jsonl", "backups/journal.jsonl"]
            .iter()
            .filter_map(|f| fs::metadata(m.state.join(f)).ok())
            .map(|meta| meta.len())
            .sum::<u64>()
    };
    let transcript_before = transcript(&m);
    m.mount();
    for round in 0..10 {
        let (from, to) = if round % 2 == 0 {
            ("big", "moved")
        } else {
            ("moved", "big")
        };
        fs::rename(m.mnt.join(from), m.mnt.join(to)).unwrap();
    }
    checkpoint(&m, "after");
    m.umount();
    let grew = allocated(&m.state).saturating_sub(state_before);
    let per_rename = transcript(&m).saturating_sub(transcript_before) / 10;
    assert!(
        grew <= 10 << 20,
        "the state dir grew by {grew} bytes for 10 renames"
    );
    // The endpoints' own records and the rename's two: about 1.2 KB, whatever is below
    // (17 MB and 40,402 records per rename in the per-path form).
    assert!(
        per_rename <= 4096,
        "{per_rename} transcript bytes per rename of a 20,000-file directory"
    );
    let transcript = fs::read_to_string(m.state.join("transcript.jsonl")).unwrap();
    assert_eq!(
        transcript.matches("\"renamed\":").count(),
        10,
        "one outcome per rename"
    );
    assert!(
        !transcript.contains("d000/f000"),
        "nothing below a renamed directory"
    );
    assert_eq!(fs::read_to_string(m.state.join("format")).unwrap(), "4\n");
}
