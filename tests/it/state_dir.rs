//! The state dir is the owner's alone (issue 11, item 2): another local user can neither
//! erase the history nor append records a later rewind would trust.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{TestMount, checkpoint, cli, is_mount_point, run, stderr};

/// `sh -c script` as the `nobody` user (uid 65534), with no groups.
fn sh_as_nobody(script: &str) -> std::process::Output {
    run(
        "setpriv",
        &[
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
        ],
        Path::new("/"),
    )
}

fn walk(dir: &Path, out: &mut Vec<(String, u32, bool)>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = fs::symlink_metadata(e.path()).unwrap();
        out.push((
            e.path().display().to_string(),
            meta.mode() & 0o7777,
            meta.is_dir(),
        ));
        if meta.is_dir() {
            walk(&e.path(), out);
        }
    }
}

#[test]
fn another_user_can_neither_erase_nor_extend_the_history() {
    let mut m = TestMount::unmounted(&[]);
    // As an admin would have made it beforehand: readable, not writable, by others.
    fs::set_permissions(&m.state, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(m.src.join("f"), "one\n").unwrap();
    m.mount();
    fs::write(m.mnt.join("f"), "two\n").unwrap();
    checkpoint(&m, "c1");
    fs::write(m.mnt.join("f"), "three\n").unwrap();
    m.umount();

    let transcript = m.state.join("transcript.jsonl");
    let before = fs::read(&transcript).unwrap();
    let t = transcript.display();
    let j = m.state.join("backups/journal.jsonl");
    let attack = format!(
        ": > {t}; echo '{{\"type\":\"file-history-snapshot\"}}' >> {t}; echo x >> {}",
        j.display()
    );
    let out = sh_as_nobody(&attack);
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(&transcript).unwrap(), before);
    let mut entries = Vec::new();
    walk(&m.state, &mut entries);
    for (path, mode, is_dir) in &entries {
        assert_eq!(mode & 0o022, 0, "{path} is writable by others: {mode:o}");
        if *is_dir {
            assert_eq!(mode & 0o077, 0, "{path}: {mode:o}");
        }
    }
    assert!(
        entries
            .iter()
            .any(|(p, _, _)| p.ends_with("transcript.jsonl"))
    );

    // Still the same history.
    m.mount();
    assert_eq!(
        fs::read_to_string(common::at(&m, "c1").join("f")).unwrap(),
        "two\n"
    );
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    let m = TestMount::unmounted(&[]);
    fs::set_permissions(&m.state, fs::Permissions::from_mode(0o777)).unwrap();
    let out = cli(&[
        "mount",
        m.src.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
        "--state-dir",
        m.state.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("writable by group or others") && stderr(&out).contains("chmod go-w"),
        "{}",
        stderr(&out)
    );
    assert!(!is_mount_point(&m.mnt));
}

#[test]
fn files_an_older_version_left_world_writable_are_made_private() {
    let mut m = TestMount::unmounted(&[]);
    m.mount();
    fs::write(m.mnt.join("f"), "x\n").unwrap();
    checkpoint(&m, "c1");
    m.umount();
    let transcript = m.state.join("transcript.jsonl");
    fs::set_permissions(&transcript, fs::Permissions::from_mode(0o666)).unwrap();
    m.mount();
    assert_eq!(fs::metadata(&transcript).unwrap().mode() & 0o777, 0o600);
}

#[test]
fn temp_files_of_killed_writes_are_removed_at_the_next_mount_and_nothing_else() {
    let mut m = TestMount::unmounted(&[]);
    m.mount();
    fs::write(m.mnt.join("f"), "x\n").unwrap();
    checkpoint(&m, "c1");
    m.umount();
    let settings = fs::read(m.state.join("settings.json")).unwrap();
    // What a write killed before its rename leaves (state::atomic's names, and the names
    // older versions used), and files that only look like them.
    let leftovers = [
        ".settings.json.tmp-99999-0123456789abcdef",
        ".transcript.jsonl.tmp-99999-fedcba9876543210",
        ".source.tmp",
    ];
    let lookalikes = [
        ".settings.json.tmp-99999-0123456789abcdef.keep",
        "notes.tmp-1-0123456789abcdef",
    ];
    for name in leftovers.iter().chain(&lookalikes) {
        fs::write(m.state.join(name), "half a file").unwrap();
    }
    m.mount();
    for name in leftovers {
        assert!(!m.state.join(name).exists(), "{name} survived the mount");
    }
    for name in lookalikes {
        assert!(m.state.join(name).exists(), "{name} was removed");
    }
    assert!(
        m.daemon_log()
            .contains("left by a write that did not finish"),
        "{}",
        m.daemon_log()
    );
    assert_eq!(fs::read(m.state.join("settings.json")).unwrap(), settings);
    assert_eq!(
        fs::read_to_string(common::at(&m, "c1").join("f")).unwrap(),
        "x\n"
    );
}
