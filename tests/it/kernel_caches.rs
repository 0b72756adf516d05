//! What the kernel keeps between requests (issue 26, "fewer round trips") must never show a
//! stale tree. Directory listings are cached by the kernel (FOPEN_CACHE_DIR with
//! FOPEN_KEEP_CACHE at opendir): each test lists a directory first so that its listing is
//! cached, then changes it — through the mount, or by a rewind, which the daemon does to SRC
//! itself — and lists it again.
use std::fs;
use std::path::Path;

use crate::common::{TestMount, checkpoint, rewind};

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn a_cached_listing_follows_changes_made_through_the_mount() {
    let m = TestMount::new();
    let d = m.mnt.join("d");
    let e = m.mnt.join("e");
    fs::create_dir(&d).unwrap();
    fs::create_dir(&e).unwrap();
    fs::write(d.join("a"), "a").unwrap();
    for _ in 0..2 {
        assert_eq!(names(&d), ["a"]);
    }
    fs::write(d.join("b"), "b").unwrap();
    assert_eq!(names(&d), ["a", "b"]);
    fs::create_dir(d.join("sub")).unwrap();
    fs::hard_link(d.join("a"), d.join("link")).unwrap();
    std::os::unix::fs::symlink("a", d.join("sym")).unwrap();
    assert_eq!(names(&d), ["a", "b", "link", "sub", "sym"]);
    assert!(names(&e).is_empty());
    fs::rename(d.join("b"), e.join("b")).unwrap();
    assert_eq!(names(&d), ["a", "link", "sub", "sym"]);
    assert_eq!(names(&e), ["b"]);
    fs::remove_file(d.join("link")).unwrap();
    fs::remove_dir(d.join("sub")).unwrap();
    assert_eq!(names(&d), ["a", "sym"]);
    // SRC agrees: nothing above was answered from a cache alone.
    assert_eq!(names(&m.src.join("d")), ["a", "sym"]);
    assert_eq!(names(&m.src.join("e")), ["b"]);
}

#[test]
fn a_cached_listing_follows_whole_and_selective_rewinds() {
    let m = TestMount::new();
    let d = m.mnt.join("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("kept"), "k").unwrap();
    fs::write(d.join("old"), "o").unwrap();
    checkpoint(&m, "c1");
    fs::remove_file(d.join("old")).unwrap();
    fs::write(d.join("new"), "n").unwrap();
    // Listed twice: the second comes from the kernel's cache. The rewind brings back a name
    // the kernel has no dentry for at all, so only the directory's own invalidation can
    // drop that cached listing.
    assert_eq!(names(&d), ["kept", "new"]);
    assert_eq!(names(&d), ["kept", "new"]);
    rewind(&m, "c1", &[]);
    assert_eq!(names(&d), ["kept", "old"]);
    assert_eq!(fs::read_to_string(d.join("old")).unwrap(), "o");
    rewind(&m, "c1:before-rewind", &["--", "d/new"]);
    assert_eq!(names(&d), ["kept", "new", "old"]);
    rewind(&m, "c1:before-rewind", &[]);
    assert_eq!(names(&d), ["kept", "new"]);
}
