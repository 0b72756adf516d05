//! Rewinds are checked first, then done (issue 28, items 5 and 6): a damaged backup or an
//! untracked file in the way is refused before anything changes, naming the path and the
//! object; a damaged backup reads as EIO in a view and in `diff`, never ENOENT; a failure
//! after the first change (a full disk) says so, and `ID:before-rewind` undoes it exactly.
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::common::{
    self, OtherMount, TestMount, checkpoint, checkpoint_ids_by_name, cli, sha256_hex, stderr,
    stdout, tree_listing,
};

const ORIGINAL: &[u8] = b"zulu: the content whose backup gets damaged\n";

/// `rewind MNT ID [extra]`, expected to fail: its stderr.
fn refused_rewind(m: &TestMount, id: &str, extra: &[&str]) -> String {
    let mut args = vec!["rewind", m.mnt.to_str().unwrap(), id];
    args.extend_from_slice(extra);
    let out = cli(&args);
    assert!(
        !out.status.success(),
        "rewind {id} {extra:?} succeeded: {}",
        stdout(&out)
    );
    stderr(&out)
}

/// Flips one byte of `data` in the pack of STATE/backups that holds it (where Layer 1
/// backed it up): the damage a bad disk or a stray write does.
fn damage_packed(state: &Path, data: &[u8]) {
    for entry in fs::read_dir(state.join("backups")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("pack-") || name.ends_with(".idx") {
            continue;
        }
        let bytes = fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(data.len()).position(|w| w == data) {
            let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(b"Z", (at + 3) as u64).unwrap();
            f.sync_all().unwrap();
            return;
        }
    }
    panic!("no pack holds the backup");
}

/// A mount whose checkpoint m1 has z.txt = ORIGINAL and a.txt = "alpha"; since then both
/// changed and b.txt was removed, and z.txt's backup is damaged.
fn damaged_mount() -> TestMount {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("a.txt"), "alpha\n").unwrap();
    fs::write(m.src.join("b.txt"), "bravo\n").unwrap();
    fs::write(m.src.join("z.txt"), ORIGINAL).unwrap();
    m.mount();
    checkpoint(&m, "m1");
    fs::write(m.mnt.join("a.txt"), "ALPHA\n").unwrap();
    fs::write(m.mnt.join("z.txt"), "ZULU\n").unwrap();
    fs::remove_file(m.mnt.join("b.txt")).unwrap();
    damage_packed(&m.state, ORIGINAL);
    m
}

#[test]
fn a_damaged_backup_reads_as_eio_in_views_and_diff_with_one_log_line() {
    let m = damaged_mount();
    let object = sha256_hex(ORIGINAL);
    let view = common::at(&m, "m1").join("z.txt");
    // Listed, and its attributes known, but its content is damaged: EIO, every time (the
    // store drops the entry after the first read), never ENOENT.
    assert!(fs::symlink_metadata(&view).unwrap().is_file());
    for _ in 0..3 {
        let err = fs::read(&view).expect_err("a damaged backup must not be read");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    let naming: Vec<String> = m
        .daemon_log()
        .lines()
        .filter(|l| l.contains(&object))
        .map(str::to_string)
        .collect();
    assert_eq!(naming.len(), 1, "{naming:#?}");
    // The other files of the view read as they were.
    assert_eq!(
        fs::read(common::at(&m, "m1").join("a.txt")).unwrap(),
        b"alpha\n"
    );
    let out = cli(&["diff", m.mnt.to_str().unwrap(), "m1"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains(&object) && err.contains("damaged"), "{err}");
    assert!(!err.contains("No such file"), "{err}");
}

#[test]
fn a_damaged_backup_is_refused_before_any_change() {
    let m = damaged_mount();
    let object = sha256_hex(ORIGINAL);
    let before = tree_listing(&m.mnt);
    let ids = checkpoint_ids_by_name(&m);
    for extra in [&[][..], &["--dry-run"], &["--", "z.txt"]] {
        let err = refused_rewind(&m, "m1", extra);
        assert!(
            err.contains("z.txt") && err.contains(&object) && err.contains("damaged"),
            "{extra:?}: {err}"
        );
        assert!(err.contains("Nothing was changed"), "{err}");
        assert!(!err.contains("No such file"), "{err}");
        assert_eq!(tree_listing(&m.mnt), before, "{extra:?}");
        // Not even the `:before-rewind` checkpoint was taken.
        assert_eq!(checkpoint_ids_by_name(&m), ids);
    }
    // What the refusal suggests: the paths that do not need the damaged backup rewind.
    let out = common::rewind(&m, "m1", &["--", "a.txt", "b.txt"]);
    assert!(out.contains("2 paths changed"), "{out}");
    assert_eq!(fs::read(m.mnt.join("a.txt")).unwrap(), b"alpha\n");
    assert_eq!(fs::read(m.mnt.join("b.txt")).unwrap(), b"bravo\n");
    assert_eq!(fs::read(m.mnt.join("z.txt")).unwrap(), b"ZULU\n");
}

#[test]
fn an_untracked_file_in_a_directory_to_remove_is_refused_before_any_change() {
    let mut m = TestMount::unmounted(&["--exclude", "*.log"]);
    fs::write(m.src.join("a.txt"), "alpha\n").unwrap();
    m.mount();
    checkpoint(&m, "m1");
    // New since m1: a.txt's change, and directories a rewind to m1 removes. One holds an
    // excluded file deep down, one a name that is not UTF-8: neither is in the history.
    fs::write(m.mnt.join("a.txt"), "ALPHA\n").unwrap();
    fs::create_dir_all(m.mnt.join("new/sub")).unwrap();
    fs::write(m.mnt.join("new/x.txt"), "x\n").unwrap();
    fs::write(m.mnt.join("new/sub/keep.log"), "the only copy\n").unwrap();
    fs::create_dir(m.mnt.join("raw")).unwrap();
    let raw_name = m.mnt.join("raw").join(OsStr::from_bytes(b"caf\xe9"));
    fs::write(&raw_name, "latin-1 name\n").unwrap();
    let before = tree_listing(&m.mnt);
    let ids = checkpoint_ids_by_name(&m);
    for extra in [&[][..], &["--dry-run"]] {
        let err = refused_rewind(&m, "m1", extra);
        assert!(
            err.contains(
                "new/sub: must be removed, but holds new/sub/keep.log (excluded by '*.log')"
            ),
            "{err}"
        );
        assert!(
            err.contains("raw: must be removed, but holds \"raw/caf\\351\""),
            "{err}"
        );
        assert!(err.contains("not UTF-8"), "{err}");
        assert!(err.contains("Nothing was changed"), "{err}");
        assert!(!err.contains("Directory not empty"), "{err}");
        assert_eq!(tree_listing(&m.mnt), before, "{extra:?}");
        assert_eq!(checkpoint_ids_by_name(&m), ids);
    }
    // A selective rewind that removes neither directory is not in their way.
    common::rewind(&m, "m1", &["--", "a.txt"]);
    assert_eq!(fs::read(m.mnt.join("a.txt")).unwrap(), b"alpha\n");
    // What the refusal says to do: move them out of the way, then rewind again.
    fs::remove_file(m.mnt.join("new/sub/keep.log")).unwrap();
    fs::remove_file(&raw_name).unwrap();
    common::rewind(&m, "m1", &[]);
    assert!(!m.mnt.join("new").exists() && !m.mnt.join("raw").exists());
}

/// A whole-tree rewind undoes the renames since the checkpoint first (format 4), and the
/// per-path plan is checked against the tree those undos leave before either starts: here
/// the undo of `mv a b` (with `a` made again) moves the new `a`, which holds an excluded
/// file, to `b`, which the plan must then remove. Refused with nothing changed: no rename
/// undone, no checkpoint taken. Then `--dry-run` lists the undo, and once the file is out
/// of the way the rewind gives the checkpoint's tree, byte for byte.
#[test]
fn a_refusal_after_undoing_renames_is_found_before_any_change() {
    let mut m = TestMount::unmounted(&["--exclude", "*.log"]);
    fs::create_dir(m.src.join("a")).unwrap();
    fs::write(m.src.join("a/x.txt"), "x0\n").unwrap();
    m.mount();
    checkpoint(&m, "m1");
    let at_m1 = tree_listing(&m.mnt);
    common::sh(
        &m,
        "mv a b && mkdir a && echo junk > a/keep.log && echo x1 > b/x.txt",
    );
    let before = tree_listing(&m.src);
    let ids = checkpoint_ids_by_name(&m);
    for extra in [&[][..], &["--dry-run"]] {
        let err = refused_rewind(&m, "m1", extra);
        assert!(
            err.contains("b: must be removed, but holds b/keep.log (excluded by '*.log')"),
            "{err}"
        );
        assert!(err.contains("Nothing was changed"), "{err}");
        assert_eq!(tree_listing(&m.src), before, "{extra:?}");
        assert_eq!(checkpoint_ids_by_name(&m), ids);
    }
    fs::remove_file(m.mnt.join("a/keep.log")).unwrap();
    let out = cli(&["rewind", m.mnt.to_str().unwrap(), "m1", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("would exchange b -> a"),
        "{}",
        stdout(&out)
    );
    common::rewind(&m, "m1", &[]);
    assert_eq!(tree_listing(&m.mnt), at_m1);
    assert_eq!(tree_listing(&m.src), at_m1);
}

/// A failure that no check can rule out (the disk fills up after the first change): the
/// rewind says it stopped part-way and what undoes it, and that undoes it exactly.
#[test]
fn a_failure_after_the_first_change_is_undone_by_before_rewind() {
    let mut m = TestMount::unmounted(&["--exclude", "*.log"]);
    // SRC is a 1 MiB file system: room for big.bin or for fill.log, not both.
    let tmpfs = OtherMount::new(
        &["-t", "tmpfs", "-o", "size=1m", "tmpfs"]
            .map(OsStr::new)
            .into_iter()
            .chain([m.src.as_os_str()])
            .collect::<Vec<_>>(),
        &m.src,
    );
    fs::write(m.src.join("a.txt"), "alpha\n").unwrap();
    let big: Vec<u8> = (0..600u32 << 10).map(|i| (i % 251) as u8).collect();
    fs::write(m.src.join("big.bin"), &big).unwrap();
    m.mount();
    checkpoint(&m, "m1");
    fs::write(m.mnt.join("a.txt"), "ALPHA\n").unwrap();
    // Emptied (its backup is made before the truncation, so its space is free after it).
    fs::File::create(m.mnt.join("big.bin")).unwrap();
    // Excluded, so the rewind leaves it, and the space it takes.
    fs::write(m.mnt.join("fill.log"), vec![b'l'; 700 << 10]).unwrap();
    let before = tree_listing(&m.mnt);

    let err = refused_rewind(&m, "m1", &[]);
    // a.txt is rewritten first, then big.bin cannot be written back.
    assert!(err.contains("failed after 1 of 2 changes"), "{err}");
    assert!(err.contains("partly rewound"), "{err}");
    assert!(
        err.contains("big.bin") && err.contains("No space left"),
        "{err}"
    );
    let undo = format!("checkpointfs rewind {} m1:before-rewind", m.mnt.display());
    assert!(err.contains(&undo), "{err}");
    assert_eq!(fs::read(m.mnt.join("a.txt")).unwrap(), b"alpha\n");
    assert_ne!(tree_listing(&m.mnt), before);

    common::rewind(&m, "m1:before-rewind", &[]);
    assert_eq!(tree_listing(&m.mnt), before);
    drop(m);
    drop(tmpfs);
}

/// A backup file deleted from the store (big enough to be a file of its own, not a pack
/// entry): the view reads EIO with one log line naming it, and the rewind refuses, saying
/// the object is missing.
#[test]
fn a_missing_backup_reads_as_eio_and_is_refused() {
    let mut m = TestMount::unmounted(&[]);
    let original: Vec<u8> = (0..100u32 << 10).map(|i| b'a' + (i % 26) as u8).collect();
    fs::write(m.src.join("big.txt"), &original).unwrap();
    m.mount();
    checkpoint(&m, "m1");
    fs::write(m.mnt.join("big.txt"), "short now\n").unwrap();
    let object = sha256_hex(&original);
    fs::remove_file(m.state.join("backups").join(&object)).unwrap();

    let view = common::at(&m, "m1").join("big.txt");
    assert_eq!(
        fs::symlink_metadata(&view).unwrap().len(),
        original.len() as u64
    );
    for _ in 0..3 {
        let err = fs::read(&view).expect_err("a missing backup must not be read");
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    }
    let naming = m
        .daemon_log()
        .lines()
        .filter(|l| l.contains(&object))
        .count();
    assert_eq!(naming, 1, "{}", m.daemon_log());

    let before = tree_listing(&m.mnt);
    let err = refused_rewind(&m, "m1", &[]);
    assert!(
        err.contains(&format!(
            "big.txt: its content at 'm1' (store object {object}) is missing from the store"
        )),
        "{err}"
    );
    assert!(err.contains("Nothing was changed"), "{err}");
    assert_eq!(tree_listing(&m.mnt), before);
}
