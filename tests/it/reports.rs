//! `log` and `diff` on a real mount: `diff --stat` (git's format), and the `--json`
//! schemas of docs/json-output.md, parsed and checked value by value, online and from an
//! unmounted state dir.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;
use crate::common::sha256_hex;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::time::UNIX_EPOCH;

use common::{TestMount, cli, cli_ok as ok, run, stderr, stdout};
use serde_json::Value;

fn sh(m: &TestMount, script: &str) {
    let out = run("sh", &["-c", &format!("umask 022 && {script}")], &m.mnt);
    assert!(out.status.success(), "sh -c {script:?}: {}", stderr(&out));
}

fn json(args: &[&str]) -> Value {
    let text = ok(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}):\n{text}"))
}

const A_BEFORE: &str = "alpha\nbeta\n";
const A_AT_M2: &str = "ALPHA\nbeta\ngamma\n";
const A_LIVE: &str = "ALPHA\nbeta\ngamma\ndelta\n";
const BIN_BEFORE: &[u8] = b"\x00\x01\x02\x03";

/// m1: the seed. m2: every kind of change (text edit, binary rewrite, symlink retarget,
/// file and directory created, file deleted, mode change). Then one more edit, not
/// checkpointed.
fn scenario() -> TestMount {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("a.txt"), A_BEFORE).unwrap();
    fs::write(m.src.join("old.txt"), "x\ny\n").unwrap();
    fs::write(m.src.join("run.sh"), "echo hi\n").unwrap();
    fs::set_permissions(m.src.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(m.src.join("bin.dat"), BIN_BEFORE).unwrap();
    symlink("a.txt", m.src.join("link")).unwrap();
    fs::create_dir(m.src.join("sub")).unwrap();
    fs::write(m.src.join("sub/keep.txt"), "unchanged\n").unwrap();
    m.mount();
    m.ctl("m1").unwrap();
    sh(
        &m,
        &format!(
            "printf '{}' > a.txt && rm old.txt && printf '1\\n2\\n3\\n' > new.txt && \
             chmod 755 run.sh && ln -sfn new.txt link && \
             printf '\\000\\001\\002\\003\\004\\005\\006\\007\\010\\011' > bin.dat && \
             mkdir -m 755 newdir",
            A_AT_M2.replace('\n', "\\n")
        ),
    );
    m.ctl("m2").unwrap();
    sh(&m, "echo delta >> a.txt");
    m
}

const STAT_M1_M2: &str = " a.txt   | 3 ++-
 bin.dat | Bin 4 -> 10 bytes
 link    | 2 +-
 new.txt | 3 +++
 newdir  | 0
 old.txt | 2 --
 run.sh  | 0
 7 files changed, 6 insertions(+), 4 deletions(-)
 create file 0644 new.txt
 create dir 0755 newdir
 delete file 0644 old.txt
 mode change 0644 => 0755 run.sh
";

#[test]
fn diff_stat_between_checkpoints_and_against_the_live_tree() {
    let mut m = scenario();
    let mnt = m.mnt.to_str().unwrap().to_string();
    assert_eq!(ok(&["diff", &mnt, "m1", "m2", "--stat"]), STAT_M1_M2);
    assert_eq!(
        ok(&["diff", &mnt, "m2", "--stat"]),
        " a.txt | 1 +\n 1 file changed, 1 insertion(+)\n"
    );
    // No change: nothing, as git.
    assert_eq!(ok(&["diff", &mnt, "m2", "m2", "--stat"]), "");

    // The plain diff is still the patch.
    let patch = ok(&["diff", &mnt, "m1", "m2"]);
    assert!(
        patch.contains(
            "diff a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,3 @@\n-alpha\n+ALPHA\n beta\n+gamma\n"
        ),
        "{patch}"
    );
    assert!(
        patch.contains("diff a/run.sh b/run.sh\nold mode 0644 (File)\nnew mode 0755 (File)\n"),
        "{patch}"
    );
    assert!(
        patch.contains(
            "diff a/old.txt b/old.txt\ndeleted file mode 0644\n--- a/old.txt\n+++ /dev/null\n"
        ),
        "{patch}"
    );
    assert!(
        patch.contains("Binary files a/bin.dat and b/bin.dat differ\n"),
        "{patch}"
    );

    // From the state dir, once unmounted: the same.
    let state = m.state.to_str().unwrap().to_string();
    m.umount();
    assert_eq!(
        ok(&["diff", "--state-dir", &state, "m1", "m2", "--stat"]),
        STAT_M1_M2
    );
}

#[test]
fn diff_stat_scales_long_changes_to_the_line_width() {
    let m = TestMount::new();
    m.ctl("empty").unwrap();
    let big: String = (0..500).map(|i| format!("line {i}\n")).collect();
    fs::write(m.mnt.join("big.txt"), &big).unwrap();
    fs::write(m.mnt.join("small.txt"), "one\n").unwrap();
    let mnt = m.mnt.to_str().unwrap();
    let stat = ok(&["diff", mnt, "empty", "--stat"]);
    let lines: Vec<&str> = stat.lines().collect();
    assert!(lines[0].starts_with(" big.txt   | 500 +"), "{stat}");
    assert!(lines.iter().all(|l| l.len() <= 80), "{stat}");
    // git's scale: 80 - (9 + 3 + 5) = 63 columns for the largest change.
    assert_eq!(lines[0].matches('+').count(), 63, "{stat}");
    assert_eq!(lines[1], " small.txt |   1 +", "{stat}");
    assert_eq!(lines[2], " 2 files changed, 501 insertions(+)", "{stat}");
}

fn file<'a>(report: &'a Value, path: &str) -> &'a Value {
    report["files"]
        .as_array()
        .expect("files is an array")
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no {path} in {report:#}"))
}

/// The time string and the nanoseconds name the same instant.
fn check_time(v: &Value) -> u128 {
    let text = v["time"].as_str().expect("time is a string");
    assert!(text.ends_with('Z'), "UTC: {text}");
    let parsed = humantime::parse_rfc3339(text).unwrap();
    let ns = u128::from(v["time_unix_ns"].as_u64().expect("time_unix_ns"));
    let from_text = parsed.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    // Both in milliseconds, the transcript's precision.
    assert_eq!(ns, from_text, "{text} vs {ns}");
    assert_eq!(ns % 1_000_000, 0, "{ns}");
    ns
}

#[test]
fn diff_json_carries_paths_kinds_counts_sizes_and_hashes() {
    let m = scenario();
    let mnt = m.mnt.to_str().unwrap();
    let d = json(&["diff", mnt, "m1", "m2", "--json"]);
    assert_eq!(d["schema"], "checkpointfs.diff/1");
    assert_eq!(d["from"]["kind"], "checkpoint");
    assert_eq!(d["from"]["id"], "m1");
    assert_eq!(d["to"]["id"], "m2");
    assert!(check_time(&d["from"]) <= check_time(&d["to"]));
    assert_eq!(d["files_changed"], 7);
    assert_eq!(d["insertions"], 6);
    assert_eq!(d["deletions"], 4);
    let paths: Vec<&str> = d["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "a.txt", "bin.dat", "link", "new.txt", "newdir", "old.txt", "run.sh"
        ]
    );

    let a = file(&d, "a.txt");
    assert_eq!(a["change"], "modified");
    assert_eq!(a["content"], "text");
    assert_eq!(
        (a["insertions"].as_u64(), a["deletions"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(a["before"]["type"], "file");
    assert_eq!(a["before"]["mode"], "0644");
    assert_eq!(a["before"]["size"], A_BEFORE.len());
    assert_eq!(a["before"]["sha256"], sha256_hex(A_BEFORE.as_bytes()));
    assert_eq!(a["after"]["sha256"], sha256_hex(A_AT_M2.as_bytes()));
    assert_eq!(
        a["patch"],
        "@@ -1,2 +1,3 @@\n-alpha\n+ALPHA\n beta\n+gamma\n"
    );

    let bin = file(&d, "bin.dat");
    assert_eq!(bin["content"], "binary");
    assert_eq!(bin["before"]["size"], 4);
    assert_eq!(bin["after"]["size"], 10);
    assert_eq!(bin["before"]["sha256"], sha256_hex(BIN_BEFORE));
    assert!(bin.get("patch").is_none(), "{bin}");

    let link = file(&d, "link");
    assert_eq!(link["before"]["type"], "symlink");
    assert_eq!(link["before"]["target"], "a.txt");
    assert_eq!(link["after"]["target"], "new.txt");
    assert_eq!(link["after"]["sha256"], sha256_hex(b"new.txt"));
    assert_eq!(
        (link["insertions"].as_u64(), link["deletions"].as_u64()),
        (Some(1), Some(1))
    );

    let new = file(&d, "new.txt");
    assert_eq!(new["change"], "added");
    assert!(new["before"].is_null());
    assert_eq!(new["after"]["sha256"], sha256_hex(b"1\n2\n3\n"));
    assert_eq!(new["insertions"], 3);

    let dir = file(&d, "newdir");
    assert_eq!(dir["change"], "added");
    assert_eq!(dir["content"], "none");
    assert_eq!(dir["after"]["type"], "dir");
    assert!(dir["after"]["sha256"].is_null());

    let old = file(&d, "old.txt");
    assert_eq!(old["change"], "deleted");
    assert!(old["after"].is_null());
    assert_eq!(old["deletions"], 2);

    let run_sh = file(&d, "run.sh");
    assert_eq!(run_sh["content"], "none");
    assert_eq!(run_sh["before"]["mode"], "0644");
    assert_eq!(run_sh["after"]["mode"], "0755");
    assert_eq!(run_sh["before"]["sha256"], run_sh["after"]["sha256"]);

    // --stat --json: the same facts without the patches.
    let s = json(&["diff", mnt, "m1", "m2", "--stat", "--json"]);
    assert_eq!(s["files_changed"], 7);
    assert_eq!(file(&s, "a.txt")["insertions"], 2);
    assert!(
        s["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.get("patch").is_none()),
        "{s:#}"
    );

    // Against the live tree: the live file is hashed.
    let live = json(&["diff", mnt, "m2", "--json"]);
    assert_eq!(live["to"], serde_json::json!({"kind": "live"}));
    assert_eq!(live["files_changed"], 1);
    let a = file(&live, "a.txt");
    assert_eq!(a["after"]["sha256"], sha256_hex(A_LIVE.as_bytes()));
    assert_eq!(a["after"]["size"], A_LIVE.len());
    assert_eq!(a["insertions"], 1);
}

#[test]
fn log_json_lists_checkpoints_changes_and_actors_like_the_text() {
    let mut m = scenario();
    let mnt = m.mnt.to_str().unwrap().to_string();
    let text = ok(&["log", &mnt]);
    let log = json(&["log", &mnt, "--json"]);
    assert_eq!(log["schema"], "checkpointfs.log/3");
    let cps = log["checkpoints"].as_array().unwrap();
    let ids: Vec<&str> = cps.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["m1", "m2"]);
    assert!(check_time(&cps[0]) <= check_time(&cps[1]));
    for c in cps {
        // The text shows the same time.
        let line = format!(
            "{}  {}",
            c["id"].as_str().unwrap(),
            c["time"].as_str().unwrap()
        );
        assert!(text.contains(&line), "{line:?} not in:\n{text}");
    }
    // Nothing was changed before m1; the work done in answer to m1, up to m2, is m1's.
    assert_eq!(log["before_first"]["files_changed"], 0);
    assert_eq!(log["before_first"]["changes"], serde_json::json!([]));
    assert!(log["before_first"].get("dropped").is_none());
    assert_eq!(cps[0]["until"], "m2");
    assert_eq!(cps[0]["files_changed"], 7);
    let changes = cps[0]["changes"].as_array().unwrap();
    let change = |path: &str| {
        changes
            .iter()
            .find(|c| c["path"] == path)
            .unwrap_or_else(|| panic!("no {path} in {changes:?}"))
    };
    assert_eq!(change("a.txt")["change"], "modified");
    assert_eq!(change("old.txt")["change"], "deleted");
    assert_eq!(change("new.txt")["change"], "added");
    assert_eq!(change("a.txt")["actors"], serde_json::json!(["sh"]));
    assert_eq!(change("run.sh")["actors"], serde_json::json!(["chmod"]));
    assert_eq!(
        change("a.txt")["before"]["sha256"],
        sha256_hex(A_BEFORE.as_bytes())
    );
    assert_eq!(change("link")["before"]["target"], "a.txt");
    assert_eq!(change("link")["after"]["target"], "new.txt");
    assert!(text.contains("    M a.txt  (by sh)\n"), "{text}");
    assert!(text.contains("    M run.sh  (by chmod)\n"), "{text}");
    let m1_text = &text[text.find("m1  ").unwrap()..text.find("m2  ").unwrap()];
    assert!(m1_text.contains("    A new.txt"), "{text}");

    // The latest checkpoint's changes run up to the live tree.
    let latest = &cps[1];
    assert!(latest["until"].is_null());
    assert_eq!(latest["files_changed"], 1);
    assert_eq!(latest["changes"][0]["path"], "a.txt");
    assert_eq!(
        latest["changes"][0]["after"]["sha256"],
        sha256_hex(A_LIVE.as_bytes())
    );
    assert!(text.contains("  (up to now)\n    M a.txt"), "{text}");

    // Unmounted, from the state dir: the same history.
    let state = m.state.to_str().unwrap().to_string();
    m.umount();
    let offline = json(&["log", "--state-dir", &state, "--json"]);
    assert_eq!(offline["checkpoints"], log["checkpoints"]);
    assert_eq!(offline["before_first"], log["before_first"]);
}

#[test]
fn json_errors_go_to_stderr_and_print_no_json() {
    let m = TestMount::new();
    m.ctl("m1").unwrap();
    let mnt = m.mnt.to_str().unwrap();
    for args in [
        vec!["diff", mnt, "nope", "--json"],
        vec!["diff", mnt, "m1", "nope", "--stat", "--json"],
    ] {
        let out = cli(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no checkpoint named 'nope' (see: checkpointfs log MNT)"),
            "{}",
            stderr(&out)
        );
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    let log = json(&["log", mnt, "--json"]);
    assert_eq!(log["checkpoints"][0]["id"], "m1");
    let empty = TestMount::new();
    let log = json(&["log", empty.mnt.to_str().unwrap(), "--json"]);
    assert_eq!(log["checkpoints"], serde_json::json!([]));
    assert_eq!(log["before_first"]["files_changed"], 0);
}

#[test]
fn diff_stat_and_json_show_type_changes_and_directory_modes() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("was-file"), "one\ntwo\n").unwrap();
    fs::create_dir(m.src.join("dir")).unwrap();
    fs::set_permissions(m.src.join("dir"), fs::Permissions::from_mode(0o755)).unwrap();
    m.mount();
    m.ctl("before").unwrap();
    sh(&m, "rm was-file && ln -s target was-file && chmod 700 dir");
    let mnt = m.mnt.to_str().unwrap();
    assert_eq!(
        ok(&["diff", mnt, "before", "--stat"]),
        " dir      | 0
 was-file | 3 +--
 2 files changed, 1 insertion(+), 2 deletions(-)
 mode change 0755 => 0700 dir
 type change file 0644 => symlink 0777 was-file
"
    );
    let d = json(&["diff", mnt, "before", "--json"]);
    let f = file(&d, "was-file");
    assert_eq!(f["change"], "modified");
    assert_eq!(f["before"]["type"], "file");
    assert_eq!(f["after"]["type"], "symlink");
    assert_eq!(f["after"]["target"], "target");
    assert_eq!(f["content"], "text");
    let dir = file(&d, "dir");
    assert_eq!(dir["content"], "none");
    assert_eq!(
        (
            dir["before"]["mode"].as_str(),
            dir["after"]["mode"].as_str()
        ),
        (Some("0755"), Some("0700"))
    );
}

/// `diff` against the live tree sees changes made in SRC directly, behind the mount's back,
/// as it did when each path was opened from the root on its own (the live attributes are
/// now read a directory at a time): a file rewritten, a file removed, a tracked directory
/// replaced by a symlink to a directory holding the same names (what is below it is not in
/// the tree any more: a symlink is never followed), and a file replaced by a directory.
#[test]
fn diff_against_the_live_tree_sees_changes_made_behind_the_mounts_back() {
    let mut m = TestMount::unmounted(&[]);
    fs::create_dir_all(m.src.join("d/e")).unwrap();
    fs::write(m.src.join("d/e/deep.txt"), "deep\n").unwrap();
    fs::write(m.src.join("d/x.txt"), "x\n").unwrap();
    fs::write(m.src.join("top.txt"), "top\n").unwrap();
    fs::write(m.src.join("gone.txt"), "gone\n").unwrap();
    fs::write(m.src.join("f"), "file\n").unwrap();
    fs::write(m.src.join("attr.txt"), "same content\n").unwrap();
    m.mount();
    // Track everything through the mount, then checkpoint.
    sh(
        &m,
        "touch d/e/deep.txt d/x.txt top.txt gone.txt f attr.txt && chmod 644 d/e/deep.txt",
    );
    m.ctl("base").unwrap();
    let mnt = m.mnt.to_str().unwrap();
    assert_eq!(ok(&["diff", mnt, "base", "--stat"]), "");
    // Behind the mount's back.
    fs::write(m.src.join("top.txt"), "top, changed in SRC\n").unwrap();
    fs::remove_file(m.src.join("gone.txt")).unwrap();
    let elsewhere = m.root().join("elsewhere");
    fs::create_dir_all(elsewhere.join("e")).unwrap();
    fs::write(elsewhere.join("e/deep.txt"), "deep\n").unwrap();
    fs::write(elsewhere.join("x.txt"), "x\n").unwrap();
    fs::rename(m.src.join("d"), m.root().join("d-moved")).unwrap();
    symlink(&elsewhere, m.src.join("d")).unwrap();
    fs::remove_file(m.src.join("f")).unwrap();
    fs::create_dir(m.src.join("f")).unwrap();
    let out = run(
        "setfattr",
        &["-n", "user.note", "-v", "set in SRC", "attr.txt"],
        &m.src,
    );
    assert!(out.status.success(), "setfattr: {}", stderr(&out));
    let d = json(&["diff", mnt, "base", "--json"]);
    let change = |p: &str| file(&d, p)["change"].as_str().unwrap().to_string();
    assert_eq!(change("top.txt"), "modified");
    assert_eq!(change("gone.txt"), "deleted");
    assert_eq!(
        change("d/x.txt"),
        "deleted",
        "below a symlink: not in the tree"
    );
    assert_eq!(change("d/e/deep.txt"), "deleted");
    assert_eq!(change("f"), "modified");
    assert_eq!(file(&d, "f")["after"]["type"], "dir");
    assert_eq!(change("attr.txt"), "modified", "an xattr-only change");
}
