//! Extended attributes are content (issue 28, items 2 and 3): backups and checkpoints record
//! a file's and a directory's `user.*` xattrs, POSIX ACLs, file capability and `trusted.*`;
//! views show them and the kernel enforces a view's ACL as the live tree's; a rewind
//! restores them; an xattr-only change is a change; a capability is restored only by a
//! daemon that may set one, and only as this daemon recorded it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::common::{
    self, TestMount, at, checkpoint, checkpoint_ids_by_name, cli, rewind, run, run_as, stderr,
    stdout, test_user, transcript_records, tree_listing,
};

/// What the tools print about the xattrs of `names` (relative to `dir`, so the output of a
/// view and of the live tree compare byte for byte): `getfacl`, `getfattr -d -m -` and
/// `getcap`, each asserted to succeed.
fn xattr_report(dir: &Path, names: &[&str]) -> String {
    let mut out = String::new();
    for (tool, args) in [
        ("getfacl", vec!["-R"]),
        ("getfattr", vec!["-R", "-d", "-m", "-"]),
        ("getcap", vec!["-r"]),
    ] {
        let mut argv = args.clone();
        argv.extend_from_slice(names);
        let o = run(tool, &argv, dir);
        assert!(o.status.success(), "{tool} {argv:?}: {}", stderr(&o));
        out.push_str(&format!("$ {tool} {}\n{}", argv.join(" "), stdout(&o)));
    }
    out
}

/// Runs `tool args...` in `dir`, asserting success.
fn ok(tool: &str, args: &[&str], dir: &Path) {
    let o = run(tool, args, dir);
    assert!(o.status.success(), "{tool} {args:?}: {}", stderr(&o));
}

/// In `dir`: a directory `d` with a default ACL and a user xattr, holding `d/f` with an access
/// ACL (`group::r--` under `mask::rw-`: the group must not gain write) and two user xattrs,
/// and `tool`, an executable with a file capability.
fn make_decorated_tree(dir: &Path) {
    fs::create_dir(dir.join("d")).unwrap();
    fs::write(dir.join("d/f"), "file with an ACL\n").unwrap();
    fs::write(dir.join("tool"), "#!/bin/sh\necho tool\n").unwrap();
    ok("chmod", &["0640", "d/f"], dir);
    ok("chmod", &["0755", "tool"], dir);
    ok(
        "setfacl",
        &["-m", "u:nobody:rw-,g::r--,m::rw-,o::---", "d/f"],
        dir,
    );
    ok("setfacl", &["-m", "d:u:nobody:r-x,d:g::r-x", "d"], dir);
    ok("setfattr", &["-n", "user.colour", "-v", "blue", "d/f"], dir);
    ok("setfattr", &["-n", "user.empty", "d/f"], dir);
    ok(
        "setfattr",
        &["-n", "user.dir", "-v", "0xdeadbeef", "d"],
        dir,
    );
    ok("setcap", &["cap_net_raw+ep", "tool"], dir);
}

const DECORATED: &[&str] = &["d", "tool"];

#[test]
fn acls_xattrs_and_capabilities_survive_deletion_and_rewind_and_show_in_views() {
    let mut m = TestMount::unmounted(&[]);
    make_decorated_tree(&m.src);
    let original = xattr_report(&m.src, DECORATED);
    assert!(
        original.contains("user:nobody:rw-")
            && original.contains("mask::rw-")
            && original.contains("user.colour=\"blue\"")
            && original.contains("tool cap_net_raw=ep"),
        "{original}"
    );
    m.mount();
    assert_eq!(xattr_report(&m.mnt, DECORATED), original, "the live tree");
    checkpoint(&m, "c1");
    // Untracked: the view shows the live xattrs (and denies as the live ACL does).
    assert_eq!(
        xattr_report(&at(&m, "c1"), DECORATED),
        original,
        "the view of c1, untracked"
    );
    // Deleted through the mount: Layer 1 backs up each path with its xattrs.
    ok("rm", &["-rf", "d", "tool"], &m.mnt);
    checkpoint(&m, "c2");
    assert_eq!(
        xattr_report(&at(&m, "c1"), DECORATED),
        original,
        "the view of c1"
    );
    let out = rewind(&m, "c1", &[]);
    assert!(out.contains("rewound to c1"), "{out}");
    assert_eq!(
        xattr_report(&m.src, DECORATED),
        original,
        "SRC after the rewind"
    );
    assert_eq!(
        xattr_report(&m.mnt, DECORATED),
        original,
        "the mount after the rewind"
    );
    // The ACL's mask kept the group from write: mode 0660 is what the mask says, and the
    // effective group entry stays r--.
    let acl = stdout(&run("getfacl", &["-E", "d/f"], &m.mnt));
    assert!(acl.contains("group::r--"), "{acl}");

    // The xattrs are stored once per distinct set, as store objects: the transcript names
    // them and holds no attribute value.
    let transcript = fs::read_to_string(m.state.join("transcript.jsonl")).unwrap();
    assert!(
        !transcript.contains("blue") && !transcript.contains("colour"),
        "xattr values in the transcript"
    );
    let names: std::collections::BTreeSet<String> = transcript_records(&m.state)
        .iter()
        .flat_map(|r| {
            r["snapshot"]["trackedFileBackups"]
                .as_object()
                .unwrap()
                .values()
                .filter_map(|b| b["meta"]["xattrs"].as_str().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(names.len(), 3, "one object per distinct set: {names:?}");

    // It survives a remount (replay, signatures) and the undo of the rewind.
    m.umount();
    m.mount();
    rewind(&m, "c1:before-rewind", &[]);
    assert!(!m.src.join("d").exists() && !m.src.join("tool").exists());
    rewind(&m, "c1", &[]);
    assert_eq!(xattr_report(&m.src, DECORATED), original, "after a remount");
}

#[test]
fn an_xattr_only_change_is_recorded_shown_and_rewound() {
    let mut m = TestMount::unmounted(&[]);
    make_decorated_tree(&m.src);
    let original = xattr_report(&m.src, DECORATED);
    m.mount();
    checkpoint(&m, "c1");
    // Only xattrs change: set, remove, an ACL entry, the capability, on a file and a dir.
    ok(
        "setfattr",
        &["-n", "user.colour", "-v", "red", "d/f"],
        &m.mnt,
    );
    ok("setfattr", &["-x", "user.empty", "d/f"], &m.mnt);
    ok("setfacl", &["-m", "g::rw-", "d/f"], &m.mnt);
    ok("setfattr", &["-x", "user.dir", "d"], &m.mnt);
    ok("setcap", &["-r", "tool"], &m.mnt);
    let changed = xattr_report(&m.mnt, DECORATED);
    assert_ne!(changed, original);
    checkpoint(&m, "c2");

    // A change: log and diff name the paths, and the views tell the versions apart.
    let log = stdout(&cli(&["log", m.mnt.to_str().unwrap()]));
    for p in ["M d/f", "M tool"] {
        assert!(log.contains(p), "{p} missing from the log:\n{log}");
    }
    let diff = stdout(&cli(&["diff", m.mnt.to_str().unwrap(), "c1", "c2"]));
    for p in ["diff a/d/f b/d/f", "diff a/tool b/tool", "diff a/d b/d"] {
        assert!(diff.contains(p), "{p} missing from the diff:\n{diff}");
    }
    assert!(diff.contains("xattrs changed"), "{diff}");
    let json = stdout(&cli(&["diff", m.mnt.to_str().unwrap(), "c1", "--json"]));
    assert!(json.contains("\"xattrs\""), "{json}");
    assert_eq!(xattr_report(&at(&m, "c1"), DECORATED), original);
    assert_eq!(xattr_report(&at(&m, "c2"), DECORATED), changed);

    // Rewound, both ways, with nothing else to do.
    let out = rewind(&m, "c1", &[]);
    assert!(out.contains("3 paths changed"), "{out}");
    assert_eq!(xattr_report(&m.src, DECORATED), original);
    rewind(&m, "c2", &[]);
    assert_eq!(xattr_report(&m.src, DECORATED), changed);
    let dry = stdout(&cli(&[
        "rewind",
        m.mnt.to_str().unwrap(),
        "c2",
        "--dry-run",
    ]));
    assert!(dry.contains("nothing to change"), "{dry}");
}

#[test]
fn a_view_denies_whom_its_acl_denies_as_the_live_tree_does() {
    let (member_uid, gid) = test_user("cpfs-xattr-member");
    let (denied_uid, denied_gid) = test_user("cpfs-xattr-denied");
    let (allowed_uid, allowed_gid) = test_user("cpfs-xattr-allowed");
    let mut m = TestMount::unmounted(&["--allow-other"]);
    fs::write(m.src.join("secret"), "for the owner and one named user\n").unwrap();
    // The owning group is the member's; the mode's group bits show the mask (r--), which a
    // mode-only check would let the group read; the ACL's group entry denies it. A named
    // user is denied outright, though "other" may read.
    ok("chown", &[&format!("root:{gid}"), "secret"], &m.src);
    ok(
        "setfacl",
        &[
            "-m",
            &format!("u:{allowed_uid}:r--,u:{denied_uid}:---,g::---,m::r--,o::r--"),
            "secret",
        ],
        &m.src,
    );
    for p in [&m.root(), &m.src, &m.mnt] {
        ok("chmod", &["0755", p.to_str().unwrap()], Path::new("/"));
    }
    m.mount();
    checkpoint(&m, "c1");
    // Tracked: the view reads the recorded version, not the live file.
    fs::write(m.mnt.join("secret"), "changed\n").unwrap();
    ok(
        "setfacl",
        &["-m", &format!("u:{denied_uid}:r--,g::r--"), "secret"],
        &m.mnt,
    );
    checkpoint(&m, "c2");

    let cat = |uid: u32, gid: u32, path: &Path| run_as(uid, gid, &["cat", path.to_str().unwrap()]);
    let view = at(&m, "c1").join("secret");
    for (who, uid, gid) in [
        ("the group member", member_uid, gid),
        ("the named user", denied_uid, denied_gid),
    ] {
        let o = cat(uid, gid, &view);
        assert!(
            !o.status.success() && stderr(&o).contains("Permission denied"),
            "{who} read the view: {}{}",
            stdout(&o),
            stderr(&o)
        );
        // At c2 the ACL lets them read, as the live file does.
        let o = cat(uid, gid, &at(&m, "c2").join("secret"));
        assert!(o.status.success(), "{who}, c2: {}", stderr(&o));
        assert!(cat(uid, gid, &m.mnt.join("secret")).status.success());
    }
    // The user the ACL allows reads the view.
    let o = cat(allowed_uid, allowed_gid, &view);
    assert_eq!(
        stdout(&o),
        "for the owner and one named user\n",
        "{}",
        stderr(&o)
    );

    // Rewound, the live file denies them again.
    rewind(&m, "c1", &[]);
    let o = cat(member_uid, gid, &m.mnt.join("secret"));
    assert!(
        !o.status.success(),
        "the group member read the rewound file"
    );
}

/// A `--owner` mount of a tree holding a file with a capability and one with a trusted.*
/// xattr (set by root): the daemon (root) records both, but the owner's rewind may set
/// neither, so it refuses before changing anything, naming each path and attribute.
#[test]
fn a_rewind_that_cannot_restore_a_capability_or_trusted_xattr_refuses_first() {
    let (uid, gid) = test_user("cpfs-xattr-owner");
    let mut m = TestMount::unmounted(&["--owner", "cpfs-xattr-owner"]);
    fs::write(m.src.join("tool"), "#!/bin/sh\n").unwrap();
    fs::write(m.src.join("noted"), "noted\n").unwrap();
    fs::write(m.src.join("plain"), "plain\n").unwrap();
    ok("chmod", &["0755", "tool"], &m.src);
    m.give_tree_to(uid, gid);
    ok("setcap", &["cap_net_raw+ep", "tool"], &m.src);
    ok(
        "setfattr",
        &["-n", "trusted.note", "-v", "x", "noted"],
        &m.src,
    );
    ok("setfattr", &["-n", "user.note", "-v", "y", "plain"], &m.src);
    m.mount();
    let mnt = m.mnt.to_str().unwrap().to_string();
    let as_owner = |args: &[&str]| run_as(uid, gid, args);
    let o = as_owner(&[
        "sh",
        "-c",
        &format!(
            "cd {mnt} && echo c1 > .checkpoint/ctl && rm tool noted plain && echo c2 > .checkpoint/ctl"
        ),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let snapshot = || {
        (
            tree_listing(&m.src),
            xattr_report(&m.src, &["."]),
            checkpoints_as(&m, uid, gid),
        )
    };
    let before = snapshot();
    assert!(before.2.contains("c2"), "{}", before.2);
    let o = as_owner(&[common::BIN, "rewind", &mnt, "c1"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "rewind succeeded: {}", stdout(&o));
    assert!(
        err.contains(
            "tool: its xattr security.capability cannot be restored: that needs CAP_SETFCAP"
        ) && err
            .contains("noted: its xattr trusted.note cannot be restored: that needs CAP_SYS_ADMIN")
            && err.contains("Nothing was changed"),
        "{err}"
    );
    assert!(
        !err.contains("plain"),
        "a user xattr needs no privilege: {err}"
    );
    assert_eq!(snapshot(), before, "changed something");
    // What the owner may restore, they can.
    rewinds_plain_with_its_note(&m, uid, gid);
}

/// `rewind MNT c1 -- plain` as `uid`:`gid` succeeds and brings back `plain`'s `user.note`.
fn rewinds_plain_with_its_note(m: &TestMount, uid: u32, gid: u32) {
    let mnt = m.mnt.to_str().unwrap();
    let o = run_as(uid, gid, &[common::BIN, "rewind", mnt, "c1", "--", "plain"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let note = stdout(&run(
        "getfattr",
        &["-n", "user.note", "--only-values", "plain"],
        &m.src,
    ));
    assert_eq!(note, "y");
}

/// The checkpoint ids `.checkpoint/at` lists, as `uid`:`gid` (an `--owner` mount is not
/// root's).
fn checkpoints_as(m: &TestMount, uid: u32, gid: u32) -> String {
    let o = run_as(
        uid,
        gid,
        &["ls", m.mnt.join(".checkpoint/at").to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

/// The xattr set a rewind needs is damaged in the store: the view reads EIO, the rewind
/// refuses naming the path and the object, and nothing changes.
#[test]
fn a_damaged_xattr_set_is_refused_naming_it() {
    let mut m = TestMount::unmounted(&[]);
    let marker = "a value only this set holds: 7f3c9a";
    fs::write(m.src.join("f"), "content\n").unwrap();
    ok(
        "setfattr",
        &["-n", "user.marker", "-v", marker, "f"],
        &m.src,
    );
    m.mount();
    checkpoint(&m, "c1");
    fs::remove_file(m.mnt.join("f")).unwrap();
    checkpoint(&m, "c2");
    // The transcript is written in the background: whole once unmounted.
    m.umount();
    let object = transcript_records(&m.state)
        .iter()
        .find_map(|r| {
            r["snapshot"]["trackedFileBackups"]["f"]["meta"]["xattrs"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        })
        .expect("f's xattrs recorded");
    damage_stored(&m.state, marker.as_bytes());
    m.mount();

    let o = run("getfattr", &["-d", "f"], &at(&m, "c1"));
    assert!(
        !o.status.success() && stderr(&o).contains("Input/output error"),
        "the view: {}{}",
        stdout(&o),
        stderr(&o)
    );
    let snapshot = || (tree_listing(&m.src), checkpoint_ids_by_name(&m));
    let before = snapshot();
    let o = cli(&["rewind", m.mnt.to_str().unwrap(), "c1"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "rewind succeeded: {}", stdout(&o));
    assert!(
        err.contains(&format!(
            "f: its xattrs at 'c1' (store object {object}) are damaged"
        )) && err.contains("Nothing was changed"),
        "{err}"
    );
    assert_eq!(snapshot(), before);
}

/// Flips a byte of `data` where the store holds it (a pack or an object file of its own).
fn damage_stored(state: &Path, data: &[u8]) {
    for entry in fs::read_dir(state.join("backups")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() || path.to_string_lossy().ends_with(".idx") {
            continue;
        }
        let bytes = fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(data.len()).position(|w| w == data) {
            ok("chmod", &["u+w", path.to_str().unwrap()], Path::new("/"));
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(b"Z", (at + 3) as u64).unwrap();
            f.sync_all().unwrap();
            return;
        }
    }
    panic!("the store holds no such data");
}

/// A record is plain JSON: one that gives a file another entry's capability set, with no
/// MAC or with that entry's MAC copied, is refused at mount (nothing mounted, SRC
/// unchanged), as a forged set-id mode is.
#[test]
fn a_forged_capability_is_refused() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("tool"), "#!/bin/sh\n").unwrap();
    fs::write(m.src.join("mine"), "#!/bin/sh\nid -u\n").unwrap();
    ok("chmod", &["0755", "tool", "mine"], &m.src);
    ok("setcap", &["cap_setuid+ep", "tool"], &m.src);
    m.mount();
    checkpoint(&m, "c1");
    ok("sh", &["-c", "echo >> tool && echo >> mine"], &m.mnt);
    checkpoint(&m, "c2");
    m.umount();
    let transcript = m.state.join("transcript.jsonl");
    let good = fs::read(&transcript).unwrap();
    let last_entry = |path: &str| {
        transcript_records(&m.state)
            .iter()
            .rev()
            .find_map(|r| r["snapshot"]["trackedFileBackups"].get(path).cloned())
            .unwrap()
    };
    let signed = transcript_records(&m.state)
        .iter()
        .find_map(|r| {
            let e = r["snapshot"]["trackedFileBackups"].get("tool")?;
            (!e["meta"]["xattrs"].as_str()?.is_empty()).then(|| e.clone())
        })
        .expect("tool's capability recorded");
    assert!(
        signed["mac"].is_string(),
        "an entry with xattrs is signed: {signed}"
    );
    let src_before = (tree_listing(&m.src), xattr_report(&m.src, &["."]));
    for mac in [None, Some(signed["mac"].clone())] {
        fs::write(&transcript, &good).unwrap();
        let seq = transcript_records(&m.state)
            .iter()
            .filter_map(|r| r["seq"].as_u64())
            .max()
            .unwrap();
        let last = last_entry("mine");
        let mut evil = last.clone();
        evil["version"] = (last["version"].as_u64().unwrap() + 1).into();
        evil["meta"]["xattrs"] = signed["meta"]["xattrs"].clone();
        match &mac {
            Some(mac) => evil["mac"] = mac.clone(),
            None => {
                evil.as_object_mut().unwrap().remove("mac");
            }
        }
        let record = serde_json::json!({
            "type": "file-history-snapshot",
            "messageId": "evil",
            "snapshot": {
                "messageId": "evil",
                "trackedFileBackups": { "mine": evil },
                "timestamp": "2026-12-06T08:00:00.000Z",
            },
            "isSnapshotUpdate": false,
            "seq": seq + 1,
            "delta": true,
        });
        let mut text = String::from_utf8(good.clone()).unwrap();
        text.push_str(&format!("{record}\n"));
        fs::write(&transcript, text).unwrap();
        let out = run(
            common::BIN,
            &[
                "mount",
                m.src.to_str().unwrap(),
                m.mnt.to_str().unwrap(),
                "--state-dir",
                m.state.to_str().unwrap(),
            ],
            Path::new("/"),
        );
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "mounted a forged capability (mac {mac:?})"
        );
        assert!(!common::is_mount_point(&m.mnt));
        let want = if mac.is_none() {
            "no signature from the record key"
        } else {
            "a signature not made by the record key"
        };
        assert!(
            err.contains("\"mine\" version 3 has xattrs") && err.contains(want),
            "{err}"
        );
        assert_eq!(
            (tree_listing(&m.src), xattr_report(&m.src, &["."])),
            src_before,
            "SRC changed"
        );
    }
}

/// A normal user's own mount: its daemon records the capability root gave the user's file
/// (anyone may read one), but cannot set one (no CAP_SETFCAP), so the rewind that would
/// restore it refuses before changing anything, naming the path and the attribute.
#[test]
fn a_normal_users_rewind_refuses_a_capability_it_cannot_restore() {
    let (uid, gid) = test_user("cpfs-xattr-user");
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("tool"), "#!/bin/sh\n").unwrap();
    fs::write(m.src.join("plain"), "plain\n").unwrap();
    ok("chmod", &["0755", "tool"], &m.src);
    let config = m.root().join("config");
    fs::create_dir(&config).unwrap();
    ok("chmod", &["0700", config.to_str().unwrap()], Path::new("/"));
    m.give_to(uid, gid);
    std::os::unix::fs::chown(&config, Some(uid), Some(gid)).unwrap();
    ok("setcap", &["cap_net_raw+ep", "tool"], &m.src);
    ok("setfattr", &["-n", "user.note", "-v", "y", "plain"], &m.src);
    m.set_env("XDG_CONFIG_HOME", config.to_str().unwrap());
    let _mode = common::DevFuseMode::set(0o666);
    m.mount_as(uid, gid);
    let mnt = m.mnt.to_str().unwrap().to_string();
    let o = run_as(
        uid,
        gid,
        &[
            "sh",
            "-c",
            &format!("cd {mnt} && echo c1 > .checkpoint/ctl && rm tool plain"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let before = (tree_listing(&m.src), checkpoints_as(&m, uid, gid));
    let o = run_as(uid, gid, &[common::BIN, "rewind", &mnt, "c1"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "rewind succeeded: {}", stdout(&o));
    assert!(
        err.contains(
            "tool: its xattr security.capability cannot be restored: that needs CAP_SETFCAP"
        ) && err.contains("Nothing was changed"),
        "{err}"
    );
    assert_eq!(
        (tree_listing(&m.src), checkpoints_as(&m, uid, gid)),
        before,
        "changed something"
    );
    // The user's own xattrs come back.
    rewinds_plain_with_its_note(&m, uid, gid);
}
