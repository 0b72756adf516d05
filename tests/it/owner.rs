//! `mount --owner USER`: root mounts for a normal user, so that user gets kernel passthrough
//! (which a user's own fusermount3 mount cannot have) while only their processes may use the
//! mount and the history stays out of their reach.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;

/// A mount of a tree owned by `user`, made by root `--owner user`; SRC and MNT are the
/// user's, STATE stays root's.
fn owner_mount(user: &str) -> (TestMount, u32, u32) {
    let (uid, gid) = test_users(user);
    let mut m = TestMount::unmounted(&["--owner", user]);
    fs::write(m.src.join("a.txt"), "one\n").unwrap();
    m.give_tree_to(uid, gid);
    m.mount();
    (m, uid, gid)
}

/// The ids of `user`, after making sure both users these tests use exist: useradd rewrites
/// /etc/passwd, and a fusermount3 reading it meanwhile (another test's) cannot name its user.
fn test_users(user: &str) -> (u32, u32) {
    test_user("cpfs-test-owner2");
    test_user(user)
}

fn ok_as(uid: u32, gid: u32, command: &[&str]) -> String {
    let out = run_as(uid, gid, command);
    assert!(
        out.status.success(),
        "{command:?} as uid {uid} failed: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

#[test]
fn a_mount_for_an_owner_is_theirs_alone_with_kernel_passthrough() {
    let (mut m, uid, gid) = owner_mount("cpfs-test-owner");
    let mnt = m.mnt.to_str().unwrap().to_string();
    let sh = |script: &str| ok_as(uid, gid, &["sh", "-c", &format!("cd {mnt} && {script}")]);

    // The owner works in it as in their own directory, with kernel passthrough on.
    sh("echo two >> a.txt && echo new > b.txt && echo c1 > .checkpoint/ctl");
    let status = ok_as(uid, gid, &[BIN, "status", &mnt]);
    assert!(
        status.contains(&format!("mounted by:     root (mount(2)) for uid {uid}"))
            && status.contains("file io:        kernel passthrough (")
            && status.contains("mount options:  rw,nodev,nosuid,"),
        "{status}"
    );
    let b = fs::metadata(m.src.join("b.txt")).unwrap();
    assert_eq!((b.uid(), b.gid()), (uid, gid), "created as the owner");

    // Nobody else may use it: not another user, and not root (the kernel checks, before the
    // daemon sees a request).
    let (other_uid, other_gid) = test_user("cpfs-test-owner2");
    let other = run_as(other_uid, other_gid, &["cat", &format!("{mnt}/a.txt")]);
    assert!(
        !other.status.success(),
        "another user read the owner's mount"
    );
    let err = fs::metadata(m.mnt.join("a.txt")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "root: {err}");

    // The history is root's: the owner reaches the control socket, not the transcript.
    let read = run_as(
        uid,
        gid,
        &["cat", m.state.join("transcript.jsonl").to_str().unwrap()],
    );
    assert!(!read.status.success(), "the owner read the transcript");
    let mode = fs::metadata(&m.state).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o711, "state dir mode {mode:o}");

    // log, a rewind and its undo, all run by the owner.
    sh("echo three > a.txt && rm b.txt && echo later > c.txt");
    let log = ok_as(uid, gid, &[BIN, "log", &mnt]);
    assert!(log.contains("c1") && log.contains("A c.txt"), "{log}");
    let rewound = ok_as(uid, gid, &[BIN, "rewind", &mnt, "c1"]);
    assert!(rewound.contains("rewound to c1"), "{rewound}");
    assert_eq!(
        fs::read_to_string(m.src.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(fs::read_to_string(m.src.join("b.txt")).unwrap(), "new\n");
    assert!(!m.src.join("c.txt").exists());
    for f in ["a.txt", "b.txt"] {
        let meta = fs::metadata(m.src.join(f)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{f} after the rewind");
    }
    ok_as(uid, gid, &[BIN, "rewind", &mnt, "c1:before-rewind"]);
    assert_eq!(fs::read_to_string(m.src.join("a.txt")).unwrap(), "three\n");
    assert_eq!(fs::read_to_string(m.src.join("c.txt")).unwrap(), "later\n");
    assert!(!m.src.join("b.txt").exists());

    // The owner unmounts it (fusermount3), waiting for the daemon as for their own mount.
    let out = run_as(uid, gid, &[BIN, "umount", &mnt]);
    assert!(out.status.success(), "umount: {}", stderr(&out));
    assert!(
        !stderr(&out).contains("without waiting"),
        "umount did not find the daemon: {}",
        stderr(&out)
    );
    m.unmounted_by_other();
    // The next mount finds the history whole.
    m.mount();
    let log = ok_as(uid, gid, &[BIN, "log", &mnt]);
    assert!(log.contains("c1:before-rewind"), "{log}");
}

#[test]
fn root_unmounts_a_mount_for_an_owner_and_waits_for_its_daemon() {
    let (mut m, _, _) = owner_mount("cpfs-test-owner");
    let out = cli(&["umount", m.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "umount: {}", stderr(&out));
    assert!(
        !stderr(&out).contains("without waiting"),
        "root's umount did not find the daemon: {}",
        stderr(&out)
    );
    m.unmounted_by_other();
}

#[test]
fn owner_is_refused_where_it_cannot_be_safe() {
    let (uid, gid) = test_users("cpfs-test-owner");
    let m = TestMount::unmounted(&[]);
    let (src, mnt, state) = (
        m.src.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
        m.state.to_str().unwrap(),
    );
    let refused = |args: &[&str], want: &str| {
        let mut all = vec!["mount", src, mnt, "--state-dir", state];
        all.extend_from_slice(args);
        let out = cli(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{args:?}: {}", stderr(&out));
        assert!(!is_mount_point(Path::new(mnt)));
    };
    refused(
        &["--owner", "no-such-user-cpfs"],
        "no such user in the password database",
    );
    refused(&["--owner", "root"], "that is root");
    refused(&["--owner", "0"], "that is root");
    refused(
        &["--owner", "cpfs-test-owner", "-o", "suid"],
        "always nodev,nosuid",
    );
    refused(
        &["--owner", "cpfs-test-owner", "-o", "dev"],
        "always nodev,nosuid",
    );
    // Only root mounts for somebody else.
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    for dir in [&m.src, &m.mnt, &m.state] {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).unwrap();
    }
    let out = run_as(
        uid,
        gid,
        &[
            BIN,
            "mount",
            src,
            mnt,
            "--state-dir",
            state,
            "--owner",
            "cpfs-test-owner",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("needs root"), "{}", stderr(&out));
    assert!(!is_mount_point(&m.mnt));
}
