//! What the CLI prints is safe and true (issue 28, items 9 and 11): names with control
//! characters are quoted in every text output (no raw control byte reaches the terminal, no
//! name forges a line), and each failure says what is true and what to do: a daemon that
//! died while answering, another user's mount or state dir, root on an `--owner` mount, a
//! selective rewind of a path that matches nothing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// The names the test creates, and how the text output must show them.
const NAMES: &[(&[u8], &str)] = &[
    // A newline would forge a `D README.md` line of its own.
    (b"x\nD README.md", r#""x\nD README.md""#),
    // Cursor up, erase the line, carriage return: rewrites the previous line.
    (
        b"esc\x1b[1A\x1b[2K\rM README.md (by vim)",
        r#""esc\033[1A\033[2K\rM README.md (by vim)""#,
    ),
    (b"cr\rname", r#""cr\rname""#),
    (b"tab\tdel\x7f", r#""tab\tdel\177""#),
    (b"quote\"back\\slash", r#""quote\"back\\slash""#),
    // Valid UTF-8 stays readable, a C1 control (CSI) does not reach the terminal.
    (b"caf\xc3\xa9", "café"),
    (b"csi\xc2\x9b2J", r#""csi\302\2332J""#),
];

/// Not UTF-8: passes through untracked, so it is in no report; `status --path` refuses it.
const INVALID: &[u8] = b"bad\xff\xfe\x1b";

/// The bytes of `out` hold no control byte but the newlines ending lines, and no DEL or
/// C1 control (UTF-8 0xc2 0x80..0x9f).
fn assert_no_control_bytes(what: &str, out: &[u8]) {
    let text = String::from_utf8_lossy(out);
    for (i, &b) in out.iter().enumerate() {
        assert!(
            (b >= 0x20 && b != 0x7f) || b == b'\n',
            "{what}: raw byte {b:#04x} at {i}:\n{text}"
        );
        assert!(
            !(b == 0xc2 && out.get(i + 1).is_some_and(|n| (0x80..0xa0).contains(n))),
            "{what}: raw C1 control at {i}:\n{text}"
        );
    }
    assert!(out.is_empty() || out.ends_with(b"\n"), "{what}:\n{text}");
}

fn output_of(what: &str, out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        stdout(out),
        stderr(out)
    );
    assert_no_control_bytes(what, &out.stdout);
    assert_no_control_bytes(what, &out.stderr);
    stdout(out)
}

/// A mount of a SRC holding `file` (one line), checkpointed as `c1`; MNT as a string.
fn mount_at_c1(file: &str) -> (TestMount, String) {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join(file), "one\n").unwrap();
    m.mount();
    checkpoint(&m, "c1");
    let mnt = m.mnt.to_str().unwrap().to_string();
    (m, mnt)
}

#[test]
fn names_with_control_characters_are_quoted_in_every_text_output() {
    let (mut m, mnt) = mount_at_c1("README.md");
    for (name, _) in NAMES {
        fs::write(m.mnt.join(OsStr::from_bytes(name)), "new\n").unwrap();
    }
    fs::write(m.mnt.join(OsStr::from_bytes(INVALID)), "untracked\n").unwrap();

    let log = output_of("log", &cli(&["log", &mnt]));
    let diff = output_of("diff", &cli(&["diff", &mnt, "c1"]));
    let stat = output_of("diff --stat", &cli(&["diff", &mnt, "c1", "--stat"]));
    let dry = output_of(
        "rewind --dry-run",
        &cli(&["rewind", &mnt, "c1", "--dry-run"]),
    );
    // The README itself never changed: no line may claim it did.
    for (what, out) in [("log", &log), ("diff --stat", &stat), ("dry-run", &dry)] {
        assert!(
            !out.lines()
                .any(|l| l.trim_start().starts_with("D README.md")
                    || l.trim_start().starts_with("M README.md")),
            "{what} has a forged line:\n{out}"
        );
    }
    for (name, quoted) in NAMES {
        let shown = String::from_utf8_lossy(name);
        // One line each, in the quoted form.
        assert!(
            log.lines()
                .any(|l| l.starts_with(&format!("    A {quoted}  (by "))),
            "log lacks {shown:?} as {quoted}:\n{log}"
        );
        let bare = quoted.trim_matches('"');
        let (a, b) = if quoted.starts_with('"') {
            (format!("\"a/{bare}\""), format!("\"b/{bare}\""))
        } else {
            (format!("a/{bare}"), format!("b/{bare}"))
        };
        for line in [
            format!("diff {a} {b}"),
            "--- /dev/null".to_string(),
            format!("+++ {b}"),
        ] {
            assert!(
                diff.lines().any(|l| l == line),
                "diff lacks {line}:\n{diff}"
            );
        }
        assert!(
            stat.lines()
                .any(|l| l.starts_with(&format!(" {quoted} ")) && l.ends_with("| 1 +")),
            "--stat lacks {quoted}:\n{stat}"
        );
        assert!(
            stat.lines()
                .any(|l| l.starts_with(" create file ") && l.ends_with(&format!(" {quoted}"))),
            "--stat lacks the create line of {quoted}:\n{stat}"
        );
        assert!(
            dry.lines().any(|l| l == format!("would remove   {quoted}")),
            "dry-run lacks {quoted}:\n{dry}"
        );
        let status = output_of(
            "status --path",
            &cli_in(
                &m.mnt,
                &[
                    OsStr::new("status"),
                    OsStr::new(&mnt),
                    OsStr::new("--path"),
                    OsStr::from_bytes(name),
                ],
            ),
        );
        assert!(
            status.starts_with(&format!("{quoted}: tracked; backed up in"))
                && status.lines().count() == 1,
            "status --path {shown:?}: {status}"
        );
    }
    // The untracked, non-UTF-8 name is in no report, and named quoted where refused.
    assert!(!log.contains("bad"), "{log}");
    let out = cli_in(
        &m.mnt,
        &[
            OsStr::new("status"),
            OsStr::new(&mnt),
            OsStr::new("--path"),
            OsStr::from_bytes(INVALID),
        ],
    );
    assert!(!out.status.success());
    assert_no_control_bytes("status --path (not UTF-8)", &out.stderr);
    assert!(
        stderr(&out).contains(r#""bad\377\376\033" is not valid UTF-8"#),
        "{}",
        stderr(&out)
    );

    // --json is unchanged: the names as they are, JSON-escaped.
    let json = cli_ok(&["log", &mnt, "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let paths: Vec<&str> = doc["checkpoints"][0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    for (name, _) in NAMES {
        assert!(
            paths.contains(&std::str::from_utf8(name).unwrap()),
            "{paths:?}"
        );
    }

    // The rewind itself, and its summary.
    let out = output_of("rewind", &cli(&["rewind", &mnt, "c1"]));
    assert!(out.contains("rewound to c1: 7 paths changed"), "{out}");
    m.umount();
}

#[test]
fn a_rewind_of_a_path_that_matches_nothing_is_an_error_and_changes_nothing() {
    let (mut m, mnt) = mount_at_c1("a.txt");
    fs::write(m.mnt.join("a.txt"), "two\n").unwrap();
    let before = cli_ok(&["log", &mnt, "--json"]);

    let out = cli(&["rewind", &mnt, "c1", "--", "nosuchpath", "a.txt", "no/such"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("nothing to rewind at nosuchpath, no/such")
            && err.contains("Nothing was changed and no checkpoint was taken"),
        "{err}"
    );
    // Nothing changed, no `c1:before-rewind` was taken.
    assert_eq!(fs::read_to_string(m.mnt.join("a.txt")).unwrap(), "two\n");
    assert_eq!(cli_ok(&["log", &mnt, "--json"]), before);
    let dry = cli(&["rewind", &mnt, "c1", "--dry-run", "--", "nosuchpath"]);
    assert!(!dry.status.success());

    // Paths that match something still work: one unchanged since c1 (nothing to do), one
    // changed, one that existed only at c1.
    fs::write(m.mnt.join("gone.txt"), "x\n").unwrap();
    checkpoint(&m, "c2");
    fs::remove_file(m.mnt.join("gone.txt")).unwrap();
    let out = rewind(&m, "c2", &["--", "gone.txt", "a.txt"]);
    assert!(out.contains("rewound to c2: 1 path changed"), "{out}");
    assert!(m.mnt.join("gone.txt").exists());
    m.umount();
}

#[test]
fn a_daemon_killed_while_answering_is_reported_as_such() {
    let mut m = TestMount::new();
    let state = m.state.to_str().unwrap().to_string();
    checkpoint(&m, "c1");
    let pid = m.pid().unwrap();
    // Stopped, the daemon leaves the request in the socket's backlog; killed, it closes the
    // connection without an answer.
    // SAFETY: kill(2) takes plain integers; `pid` is this mount's daemon.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let child = Command::new(BIN)
        .args(["log", "--state-dir", &state])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    m.kill9();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(!err.contains("bad response"), "{err}");
    assert!(
        err.contains("exited or was killed while working on the request")
            && err.contains(&format!("{state}/daemon.log")),
        "{err}"
    );
}

/// A second user, on a mount that lets them in (`--allow-other`) and on one that does not.
#[test]
fn another_users_mount_is_reported_as_theirs() {
    let (uid, gid) = test_user("cpfs-test-other");
    for allow_other in [true, false] {
        let args: &[&str] = if allow_other { &["--allow-other"] } else { &[] };
        let mut m = TestMount::unmounted(args);
        fs::write(m.src.join("a.txt"), "one\n").unwrap();
        fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
        m.mount();
        checkpoint(&m, "c1");
        let mnt = m.mnt.to_str().unwrap().to_string();
        for cmd in [
            vec![BIN, "log", &mnt],
            vec![BIN, "status", &mnt],
            vec![BIN, "rewind", &mnt, "c1", "--dry-run"],
        ] {
            let out = run_as(uid, gid, &cmd);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
            assert!(
                !err.contains("is not a checkpointfs") && !err.contains("no 'source' file"),
                "{cmd:?}: {err}"
            );
            let expected = if allow_other {
                "belongs to user root (uid 0), not to you"
            } else {
                "is a checkpointfs mount of user root (uid 0), not yours"
            };
            assert!(
                err.contains(expected) && err.contains("Permission denied"),
                "{cmd:?} (--allow-other: {allow_other}): {err}"
            );
        }
        m.umount();
    }
}

#[test]
fn root_on_an_owner_mount_is_told_whose_it_is() {
    let (uid, gid) = test_user("cpfs-test-owner");
    let mut m = TestMount::unmounted(&["--owner", "cpfs-test-owner"]);
    fs::write(m.src.join("a.txt"), "one\n").unwrap();
    m.give_tree_to(uid, gid);
    m.mount();
    let mnt = m.mnt.to_str().unwrap().to_string();
    for args in [
        vec!["log", mnt.as_str()],
        vec!["checkpoint", mnt.as_str(), "c1"],
    ] {
        let out = cli(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            !err.contains("is not a checkpointfs mount"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains(&format!(
                "is a checkpointfs mount of user cpfs-test-owner (uid {uid}), not yours"
            )) && err.contains("root included"),
            "{args:?}: {err}"
        );
    }
    m.umount();
}
