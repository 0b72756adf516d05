//! A file that leaves SRC through the mount (rm, or replaced by mv) is backed up by linking
//! its own inode into the store, not by copying it (issue 10) — unless someone else could
//! still change it (a second name, a writer anywhere), which is copied as before; and a
//! removal that fails leaves the file alone with a copy in the store. Views, a remount and
//! a rewind give the old content back byte for byte.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TestMount, at, checkpoint, rewind, sh};
use sha2::{Digest, Sha256};

/// 3 MiB of pseudo-random bytes: too big for a pack, so a backup is a file of its own.
fn content(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut data = Vec::with_capacity(3 << 20);
    while data.len() < 3 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data
}

fn object(m: &TestMount, data: &[u8]) -> PathBuf {
    let name = base16ct::lower::encode_string(&Sha256::digest(data));
    m.state.join("backups").join(name)
}

fn ino(path: &Path) -> u64 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .ino()
}

struct Original {
    name: &'static str,
    data: Vec<u8>,
    ino: u64,
}

fn original(m: &TestMount, name: &'static str, seed: u64) -> Original {
    let data = content(seed);
    fs::write(m.src.join(name), &data).expect("write into SRC");
    Original {
        name,
        ino: ino(&m.src.join(name)),
        data,
    }
}

fn removals_and_replacements(args: &[&str]) {
    let mut m = TestMount::unmounted(args);
    // Untracked project files (there before the mount), as an agent finds them.
    let removed = original(&m, "removed", 1);
    let replaced = original(&m, "replaced", 2);
    let twin = original(&m, "twin", 3);
    fs::hard_link(m.src.join("twin"), m.src.join("twin-alias")).expect("hard link");
    let written = original(&m, "written", 4);
    fs::write(m.src.join("newer"), b"the file that replaces `replaced`").expect("write");
    m.mount();
    checkpoint(&m, "before");

    // A writer outside the mount holds `written` open while the agent removes it.
    let writer = fs::OpenOptions::new()
        .append(true)
        .open(m.src.join("written"))
        .expect("open for writing in SRC");
    sh(&m, "rm removed twin written && mv newer replaced");
    drop(writer);
    checkpoint(&m, "after");

    // The lone files are their own backups: same inode, now the store's (0400, one name).
    for o in [&removed, &replaced] {
        let obj = object(&m, &o.data);
        let meta =
            fs::metadata(&obj).unwrap_or_else(|e| panic!("{}: no backup object: {e}", o.name));
        assert_eq!(
            meta.ino(),
            o.ino,
            "{}: the backup is a copy, not the file",
            o.name
        );
        assert_eq!(
            meta.nlink(),
            1,
            "{}: the store's name is its only one",
            o.name
        );
        assert_eq!(meta.mode() & 0o7777, 0o400, "{}: object mode", o.name);
        assert_eq!(meta.uid(), 0, "{}: object owner", o.name);
    }
    // A file with another name, or open for writing elsewhere, is copied.
    for o in [&twin, &written] {
        let obj = object(&m, &o.data);
        assert_ne!(
            ino(&obj),
            o.ino,
            "{}: someone could change it; copy it",
            o.name
        );
    }
    assert_eq!(
        fs::read(m.src.join("twin-alias")).expect("alias"),
        twin.data,
        "the other name keeps its content"
    );

    let check_views = |m: &TestMount, when: &str| {
        for o in [&removed, &replaced, &twin, &written] {
            assert_eq!(
                fs::read(at(m, "before").join(o.name)).expect("view"),
                o.data,
                "{when}: at/before/{}",
                o.name
            );
        }
        for gone in ["removed", "twin", "written", "newer"] {
            assert!(
                !at(m, "after").join(gone).exists(),
                "{when}: at/after/{gone} must not exist"
            );
        }
    };
    check_views(&m, "live");
    m.remount();
    check_views(&m, "after a remount");

    rewind(&m, "before", &[]);
    for o in [&removed, &replaced, &twin, &written] {
        assert_eq!(
            fs::read(m.mnt.join(o.name)).expect("rewound file"),
            o.data,
            "rewound {}",
            o.name
        );
    }
    assert_eq!(
        fs::read(m.mnt.join("newer")).expect("newer is back"),
        b"the file that replaces `replaced`"
    );
    // The store kept its objects (the rewind copied them out).
    for o in [&removed, &replaced] {
        assert_eq!(ino(&object(&m, &o.data)), o.ino);
    }
}

#[test]
fn leaving_files_are_linked_into_the_store() {
    removals_and_replacements(&[]);
}

#[test]
fn leaving_files_are_linked_into_the_store_strict_and_without_passthrough() {
    removals_and_replacements(&["--durability", "strict", "--no-passthrough"]);
}

/// An unlink that fails (an immutable file: EPERM) changes nothing, and the store does not
/// keep sharing the live file's inode: a later change to the file must not change its
/// backup.
#[test]
fn a_removal_that_fails_leaves_the_file_and_a_separate_backup() {
    let mut m = TestMount::unmounted(&[]);
    let stuck = original(&m, "stuck", 5);
    let path = m.src.join("stuck");
    let chattr = |flag: &str| {
        let out = Command::new("chattr")
            .arg(flag)
            .arg(&path)
            .output()
            .expect("run chattr");
        assert!(
            out.status.success(),
            "chattr {flag}: {} (needs root and a filesystem with the immutable flag, e.g. ext4 \
             as TMPDIR)",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    chattr("+i");
    m.mount();
    checkpoint(&m, "before");
    let err = fs::remove_file(m.mnt.join("stuck")).expect_err("rm of an immutable file");
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{err}");
    chattr("-i");
    assert_eq!(
        fs::read(m.src.join("stuck")).expect("still there"),
        stuck.data
    );
    let obj = object(&m, &stuck.data);
    assert!(obj.exists(), "the backup was made before the unlink");
    assert_ne!(
        ino(&obj),
        stuck.ino,
        "the backup must not share the live file's inode"
    );
    assert_eq!(fs::metadata(m.src.join("stuck")).expect("stat").nlink(), 1);

    // The file changes afterwards; its backup does not.
    File::options()
        .write(true)
        .open(m.mnt.join("stuck"))
        .and_then(|f| std::os::unix::fs::FileExt::write_all_at(&f, b"changed", 0))
        .expect("write");
    assert_eq!(fs::read(&obj).expect("object"), stuck.data);
    assert_eq!(
        fs::read(at(&m, "before").join("stuck")).expect("view"),
        stuck.data
    );
}
