//! Set-id modes in the history are restored only as the daemon recorded them (issue 11, last
//! item): a set-id entry carries a MAC under the mounting user's record key, kept outside the
//! state dir, and a replay refuses one whose MAC is missing or not that key's.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{
    BIN, TestMount, at, checkpoint, is_mount_point, rewind, stderr, transcript_records,
    tree_listing,
};
use serde_json::{Value, json};

/// A mount whose daemon keeps its record key in a directory of this test's own
/// (`XDG_CONFIG_HOME`), so the test knows the key's path and leaves root's alone.
fn mount_with_own_key() -> (TestMount, PathBuf) {
    let mut m = TestMount::unmounted(&[]);
    let config = m.root().join("config");
    fs::create_dir(&config).unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o700)).unwrap();
    m.set_env("XDG_CONFIG_HOME", config.to_str().unwrap());
    m.mount();
    (m, config.join("checkpointfs/record.key"))
}

/// `checkpointfs mount` run directly (a refused mount must not panic the harness), with
/// the same record key as the harness's mounts.
fn mount_cli(m: &TestMount) -> Output {
    Command::new(BIN)
        .args(["mount".as_ref(), m.src.as_os_str(), m.mnt.as_os_str()])
        .arg("--state-dir")
        .arg(&m.state)
        .env("XDG_CONFIG_HOME", m.root().join("config"))
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// The entry of `path` in the last record that has one.
fn last_entry(state: &Path, path: &str) -> Value {
    transcript_records(state)
        .iter()
        .rev()
        .find_map(|r| r["snapshot"]["trackedFileBackups"].get(path).cloned())
        .unwrap_or_else(|| panic!("no record of {path}"))
}

fn append(state: &Path, records: &[Value]) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(state.join("transcript.jsonl"))
        .unwrap();
    for r in records {
        writeln!(f, "{r}").unwrap();
    }
}

/// The two made-up records: a backup of `path` repeating its last version, then a
/// checkpoint `evil` giving it a new version with mode 04755 and uid 0 (and `mac`, if any).
fn forged_records(state: &Path, path: &str, mac: Option<&Value>) -> Vec<Value> {
    let seq = transcript_records(state)
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .max()
        .unwrap();
    let last = last_entry(state, path);
    let mut evil = last.clone();
    evil["version"] = (last["version"].as_u64().unwrap() + 1).into();
    evil["meta"]["mode"] = 0o4755.into();
    evil["meta"]["uid"] = 0.into();
    evil["meta"]["gid"] = 0.into();
    match mac {
        Some(mac) => evil["mac"] = mac.clone(),
        None => {
            evil.as_object_mut().unwrap().remove("mac");
        }
    }
    let record = |seq: u64, id: &str, update: bool, entry: Value| {
        json!({
            "type": "file-history-snapshot",
            "messageId": id,
            "snapshot": {
                "messageId": id,
                "trackedFileBackups": { path: entry },
                "timestamp": "2026-12-06T08:00:00.000Z",
            },
            "isSnapshotUpdate": update,
            "seq": seq,
            "delta": !update,
        })
    };
    vec![
        record(seq + 1, "c1", true, last),
        record(seq + 2, "evil", false, evil),
    ]
}

/// A history made through the mount (`chmod u+s`, checkpoint, `chmod u-s`, checkpoint) is
/// signed, survives a remount's replay, and its set-id mode comes back in the view and by
/// rewind.
#[test]
fn a_set_id_mode_made_through_the_mount_is_restored_after_a_remount() {
    let (mut m, key) = mount_with_own_key();
    let tool = m.mnt.join("tool");
    fs::write(&tool, "#!/bin/sh\necho tool\n").unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(mode(&tool), 0o4755);
    checkpoint(&m, "c1");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
    checkpoint(&m, "c2");
    m.umount();

    // The key: 32 bytes, 0600 in a 0700 directory, outside the state dir.
    assert_eq!(fs::metadata(&key).unwrap().len(), 32);
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(key.parent().unwrap()), 0o700);
    assert!(!key.starts_with(&m.state));
    // Every set-id entry of the transcript is signed, and only those.
    let mut signed = 0;
    for r in transcript_records(&m.state) {
        for (path, b) in r["snapshot"]["trackedFileBackups"].as_object().unwrap() {
            let setuid = b["meta"]["mode"].as_u64().is_some_and(|m| m & 0o4000 != 0);
            assert_eq!(b.get("mac").is_some(), setuid, "{path} in {r}");
            signed += usize::from(setuid);
        }
    }
    assert!(signed >= 1, "the setuid version at c1 is recorded signed");
    assert!(fs::read_to_string(m.state.join("signing-id")).is_ok());

    m.mount();
    assert_eq!(mode(&at(&m, "c1").join("tool")), 0o4755, "the view at c1");
    assert_eq!(mode(&at(&m, "c2").join("tool")), 0o755, "the view at c2");
    rewind(&m, "c1", &[]);
    assert_eq!(mode(&m.src.join("tool")), 0o4755, "rewound to c1");
    assert_eq!(
        fs::read_to_string(m.src.join("tool")).unwrap(),
        "#!/bin/sh\necho tool\n"
    );
}

/// The attack: records appended to an unmounted state dir that make a user's file
/// setuid root at a new version, with a checkpoint pointing at it. The next mount refuses
/// the history, naming the record, the path, the mode and the key, and SRC is untouched;
/// likewise with a valid MAC copied from another set-id entry.
#[test]
fn forged_set_id_records_are_refused_and_change_nothing() {
    let (mut m, key) = mount_with_own_key();
    let user_file = m.mnt.join("mine");
    fs::write(&user_file, "#!/bin/sh\nid -u\n").unwrap();
    std::os::unix::fs::chown(&user_file, Some(65534), Some(65534)).unwrap();
    fs::set_permissions(&user_file, fs::Permissions::from_mode(0o755)).unwrap();
    // A legitimate set-id file, whose valid MAC the second attack copies.
    let legit = m.mnt.join("legit");
    fs::write(&legit, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&legit, fs::Permissions::from_mode(0o4755)).unwrap();
    checkpoint(&m, "c1");
    m.umount();
    let transcript = m.state.join("transcript.jsonl");
    let good = fs::read(&transcript).unwrap();
    let src_before = tree_listing(&m.src);
    let owner = |p: &Path| {
        let md = fs::symlink_metadata(p).unwrap();
        (md.uid(), md.mode() & 0o7777)
    };
    assert_eq!(owner(&m.src.join("mine")), (65534, 0o755));

    // No MAC at all.
    append(&m.state, &forged_records(&m.state, "mine", None));
    let forged_seq = transcript_records(&m.state).last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    let out = mount_cli(&m);
    assert!(!out.status.success(), "mounted a forged set-id history");
    assert!(!is_mount_point(&m.mnt));
    let err = stderr(&out);
    for want in [
        format!(
            "transcript.jsonl line {}: the record with seq {forged_seq}",
            transcript_records(&m.state).len()
        ),
        "\"mine\" version 3 has set-id mode 4755 (uid 0, gid 0)".to_string(),
        format!("no signature from the record key {}", key.display()),
        "copy that account's record.key".to_string(),
        "nothing was mounted".to_string(),
    ] {
        assert!(err.contains(&want), "missing {want:?} in: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(tree_listing(&m.src), src_before, "SRC changed");
    assert_eq!(owner(&m.src.join("mine")), (65534, 0o755));

    // A valid MAC, copied from the legitimate set-id entry.
    fs::write(&transcript, &good).unwrap();
    let mac = last_entry(&m.state, "legit")["mac"].clone();
    assert!(mac.is_string(), "the legit setuid entry is signed");
    append(&m.state, &forged_records(&m.state, "mine", Some(&mac)));
    let out = mount_cli(&m);
    assert!(!out.status.success(), "mounted with a copied MAC");
    assert!(!is_mount_point(&m.mnt));
    let err = stderr(&out);
    assert!(
        err.contains(
            "\"mine\" version 3 has set-id mode 4755 (uid 0, gid 0) and a signature not made by"
        ),
        "{err}"
    );
    assert_eq!(tree_listing(&m.src), src_before, "SRC changed");
    assert_eq!(owner(&m.src.join("mine")), (65534, 0o755));

    // The history as it was still mounts, and the legitimate setuid mode is in its view.
    fs::write(&transcript, &good).unwrap();
    m.mount();
    assert_eq!(mode(&at(&m, "c1").join("legit")), 0o4755);
    assert_eq!(owner(&at(&m, "c1").join("mine")), (65534, 0o755));
}

/// A state dir from before signing (no `signing-id`, no MACs, unknown to the key) with a
/// setuid version is signed by its first mount; `gc --state-dir`, which renumbers versions,
/// signs them again; and the setuid mode still comes back by view and rewind.
#[test]
fn an_older_state_dir_is_signed_on_first_mount_and_survives_gc() {
    let (mut m, key) = mount_with_own_key();
    let tool = m.mnt.join("tool");
    fs::write(&tool, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
    checkpoint(&m, "c0");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o4755)).unwrap();
    checkpoint(&m, "c1");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
    checkpoint(&m, "c2");
    fs::write(&tool, "#!/bin/sh\necho 3\n").unwrap();
    checkpoint(&m, "c3");
    m.umount();

    // As a daemon before signing left it.
    let unsigned: Vec<String> = transcript_records(&m.state)
        .into_iter()
        .map(|mut r| {
            for b in r["snapshot"]["trackedFileBackups"]
                .as_object_mut()
                .unwrap()
                .values_mut()
            {
                b.as_object_mut().unwrap().remove("mac");
            }
            r.to_string()
        })
        .collect();
    // c1's setuid version, and its repeat when the chmod after c1 backs it up. When c1's
    // copy was still pending at that chmod (the copier fills it after the checkpoint), the
    // chmod's backup fills it instead and there is one entry, not two.
    let setuid_entries = unsigned
        .iter()
        .map(|l| l.matches("\"mode\":2541").count())
        .sum::<usize>();
    assert!(setuid_entries >= 1, "a 04755 entry");
    fs::write(m.state.join("transcript.jsonl"), unsigned.join("\n") + "\n").unwrap();
    fs::remove_file(m.state.join("signing-id")).unwrap();
    fs::remove_file(key.with_file_name("signed-state-dirs")).unwrap();

    m.mount();
    assert!(
        m.daemon_log()
            .contains(&format!("signed the {setuid_entries} already recorded")),
        "{}",
        m.daemon_log()
    );
    m.umount();
    let id = fs::read_to_string(m.state.join("signing-id")).unwrap();
    assert_eq!(id.trim().len(), 32, "{id:?}: complete, not pending");
    let signed = transcript_records(&m.state)
        .iter()
        .flat_map(|r| {
            r["snapshot"]["trackedFileBackups"]
                .as_object()
                .unwrap()
                .clone()
        })
        .filter(|(_, b)| b.get("mac").is_some())
        .count();
    assert_eq!(signed, setuid_entries, "every setuid entry, and only those");

    let out = Command::new(BIN)
        .args(["gc", "--state-dir"])
        .arg(&m.state)
        .args(["--keep", "3"])
        .env("XDG_CONFIG_HOME", m.root().join("config"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "gc: {}", stderr(&out));
    assert_eq!(
        last_entry(&m.state, "tool")["version"],
        json!(3),
        "renumbered: c1's setuid version is the base, version 1, signed again"
    );

    m.mount();
    assert_eq!(mode(&at(&m, "c1").join("tool")), 0o4755);
    rewind(&m, "c1", &[]);
    assert_eq!(mode(&m.src.join("tool")), 0o4755);
    assert_eq!(
        fs::read_to_string(m.src.join("tool")).unwrap(),
        "#!/bin/sh\n"
    );
}
