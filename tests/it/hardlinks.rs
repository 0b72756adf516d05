//! Hard links are one object (issue 28, item 4): a change through any name of a file is
//! recorded under every name of it the daemon has seen, views of later checkpoints give all
//! of them the new content, and a rewind that restores several names of one file makes
//! them one inode again. Finding the names costs nothing on the syscall path but what
//! changes: no walk of the tree.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{TestMount, at, checkpoint, rewind, run, stderr};

fn append(path: &Path, data: &str) {
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path:?} for appending: {e}"));
    f.write_all(data.as_bytes())
        .unwrap_or_else(|e| panic!("append to {path:?}: {e}"));
}

/// A mount of a fresh SRC filled by `fill` (format 4: a version records a hard link, so
/// that a rewind can make the link again).
fn mount_filled(fill: impl FnOnce(&Path)) -> TestMount {
    let mut m = TestMount::unmounted(&[]);
    fill(&m.src);
    m.mount();
    m
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"))
}

/// Asserts that `names` (in `dir`) are one inode with exactly that many links.
fn assert_linked(dir: &Path, names: &[&str]) {
    let metas: Vec<fs::Metadata> = names
        .iter()
        .map(|n| fs::symlink_metadata(dir.join(n)).unwrap_or_else(|e| panic!("stat {n}: {e}")))
        .collect();
    for (n, m) in names.iter().zip(&metas) {
        assert_eq!(
            (m.ino(), m.nlink()),
            (metas[0].ino(), names.len() as u64),
            "{n} in {dir:?} is not linked with {}",
            names[0]
        );
    }
}

/// The reproduction: `a` and `b` are one inode, both seen through the mount, and a
/// write goes through `b`. On 8a7cd74 the change was recorded under `a` only: the view of
/// the next checkpoint showed `b`'s old content, and a rewind after `rm a b` restored `a`
/// new and `b` old, as two files.
#[test]
fn a_write_through_one_name_is_seen_under_both_and_a_rewind_relinks_them() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("a"), "old\n").unwrap();
    fs::hard_link(m.src.join("a"), m.src.join("b")).unwrap();
    m.mount();
    checkpoint(&m, "before");
    // `a` first, so that the daemon's entry for the inode was reached by `a`.
    assert_eq!(read(&m.mnt.join("a")), "old\n");
    append(&m.mnt.join("b"), "new\n");
    checkpoint(&m, "after");
    for name in ["a", "b"] {
        assert_eq!(
            read(&at(&m, "after").join(name)),
            "old\nnew\n",
            "{name} at after"
        );
        assert_eq!(
            read(&at(&m, "before").join(name)),
            "old\n",
            "{name} at before"
        );
    }
    fs::remove_file(m.mnt.join("a")).unwrap();
    fs::remove_file(m.mnt.join("b")).unwrap();
    rewind(&m, "after", &[]);
    for dir in [&m.mnt, &m.src] {
        assert_eq!(read(&dir.join("a")), "old\nnew\n");
        assert_eq!(read(&dir.join("b")), "old\nnew\n");
        assert_linked(dir, &["a", "b"]);
    }
    // Back before the write: both names old, still one file.
    rewind(&m, "before", &[]);
    for dir in [&m.mnt, &m.src] {
        assert_eq!(read(&dir.join("a")), "old\n");
        assert_eq!(read(&dir.join("b")), "old\n");
        assert_linked(dir, &["a", "b"]);
    }
    // A selective rewind of one name restores that name alone, as a file of its own.
    fs::remove_file(m.mnt.join("a")).unwrap();
    fs::remove_file(m.mnt.join("b")).unwrap();
    rewind(&m, "after", &["--", "b"]);
    assert!(!m.mnt.join("a").exists());
    assert_eq!(read(&m.mnt.join("b")), "old\nnew\n");
    assert_linked(&m.mnt, &["b"]);
}

/// A link made through the mount (`ln`), then written through either name: every
/// checkpoint's view gives both names the content of that moment.
#[test]
fn a_link_made_through_the_mount_is_one_file_in_every_view() {
    let m = mount_filled(|_| {});
    fs::write(m.mnt.join("a"), "1\n").unwrap();
    checkpoint(&m, "c0");
    let ln = run("ln", &["a", "b"], &m.mnt);
    assert!(ln.status.success(), "ln: {}", stderr(&ln));
    checkpoint(&m, "c1");
    append(&m.mnt.join("a"), "2\n");
    checkpoint(&m, "c2");
    append(&m.mnt.join("b"), "3\n");
    checkpoint(&m, "c3");
    for (id, want) in [("c1", "1\n"), ("c2", "1\n2\n"), ("c3", "1\n2\n3\n")] {
        for name in ["a", "b"] {
            assert_eq!(read(&at(&m, id).join(name)), want, "{name} at {id}");
        }
    }
    assert!(!at(&m, "c0").join("b").exists());
    fs::remove_file(m.mnt.join("b")).unwrap();
    fs::remove_file(m.mnt.join("a")).unwrap();
    rewind(&m, "c2", &[]);
    assert_eq!(read(&m.mnt.join("a")), "1\n2\n");
    assert_linked(&m.mnt, &["a", "b"]);
    assert_linked(&m.src, &["a", "b"]);
    rewind(&m, "c0", &[]);
    assert!(!m.mnt.join("b").exists());
    assert_eq!(read(&m.mnt.join("a")), "1\n");
    assert_linked(&m.mnt, &["a"]);
}

/// `sed -i` writes a new file and renames it over its name: the link breaks, and each
/// view shows each name as it was (before: one file; after: two).
#[test]
fn sed_in_place_on_one_name_breaks_the_link_and_both_views_are_right() {
    let m = mount_filled(|src| {
        fs::write(src.join("a"), "x\n").unwrap();
        fs::hard_link(src.join("a"), src.join("b")).unwrap();
    });
    assert_eq!(read(&m.mnt.join("a")), "x\n");
    assert_eq!(read(&m.mnt.join("b")), "x\n");
    append(&m.mnt.join("a"), "y\n");
    checkpoint(&m, "linked");
    let sed = run("sed", &["-i", "s/x/z/", "b"], &m.mnt);
    assert!(sed.status.success(), "sed: {}", stderr(&sed));
    checkpoint(&m, "broken");
    assert_eq!(read(&at(&m, "linked").join("a")), "x\ny\n");
    assert_eq!(read(&at(&m, "linked").join("b")), "x\ny\n");
    assert_eq!(read(&at(&m, "broken").join("a")), "x\ny\n");
    assert_eq!(read(&at(&m, "broken").join("b")), "z\ny\n");
    // A write through `a` now is `a`'s alone.
    append(&m.mnt.join("a"), "w\n");
    checkpoint(&m, "apart");
    assert_eq!(read(&at(&m, "apart").join("a")), "x\ny\nw\n");
    assert_eq!(read(&at(&m, "apart").join("b")), "z\ny\n");
    rewind(&m, "linked", &[]);
    assert_eq!(read(&m.mnt.join("a")), "x\ny\n");
    assert_eq!(read(&m.mnt.join("b")), "x\ny\n");
    assert_linked(&m.mnt, &["a", "b"]);
    // And forward again, from one file to two: rewriting `a` must not write into `b`.
    rewind(&m, "apart", &[]);
    assert_eq!(read(&m.mnt.join("a")), "x\ny\nw\n");
    assert_eq!(read(&m.mnt.join("b")), "z\ny\n");
    assert_linked(&m.mnt, &["a"]);
    assert_linked(&m.mnt, &["b"]);
}

/// pnpm's layout: every package file is a hard link from a content store into
/// `node_modules`. Edited through the `node_modules` name, the store's name changes too,
/// in the view and in a rewind (which links them again).
#[test]
fn a_pnpm_style_store_edited_through_node_modules_shows_in_both_names() {
    let m = mount_filled(|src| {
        let store = src.join(".pnpm-store/v3/files");
        fs::create_dir_all(&store).unwrap();
        for i in 0..40 {
            let pkg = src.join(format!("node_modules/pkg{i}"));
            fs::create_dir_all(&pkg).unwrap();
            let stored = store.join(format!("{i:02x}-index"));
            fs::write(&stored, format!("module.exports = {i};\n")).unwrap();
            fs::hard_link(&stored, pkg.join("index.js")).unwrap();
        }
    });
    // The agent's tools look at the whole tree (a build, `find`, an editor's indexer).
    let find = run("find", &["."], &m.mnt);
    assert!(find.status.success(), "find: {}", stderr(&find));
    checkpoint(&m, "installed");
    append(&m.mnt.join("node_modules/pkg7/index.js"), "// patched\n");
    checkpoint(&m, "patched");
    let patched = "module.exports = 7;\n// patched\n";
    let view = at(&m, "patched");
    assert_eq!(read(&view.join("node_modules/pkg7/index.js")), patched);
    assert_eq!(read(&view.join(".pnpm-store/v3/files/07-index")), patched);
    assert_eq!(
        read(&at(&m, "installed").join(".pnpm-store/v3/files/07-index")),
        "module.exports = 7;\n"
    );
    // Undo the patch: both names go back, still one file.
    rewind(&m, "installed", &[]);
    assert_eq!(
        read(&m.mnt.join("node_modules/pkg7/index.js")),
        "module.exports = 7;\n"
    );
    assert_linked(
        &m.mnt,
        &[
            "node_modules/pkg7/index.js",
            ".pnpm-store/v3/files/07-index",
        ],
    );
    // `rm -rf node_modules` and a rewind: every package links to its store file again.
    fs::remove_dir_all(m.mnt.join("node_modules")).unwrap();
    fs::remove_dir_all(m.mnt.join(".pnpm-store")).unwrap();
    rewind(&m, "patched", &[]);
    for i in [0, 7, 39] {
        let names = [
            format!("node_modules/pkg{i}/index.js"),
            format!(".pnpm-store/v3/files/{i:02x}-index"),
        ];
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_linked(&m.src, &names);
    }
    assert_eq!(read(&m.mnt.join(".pnpm-store/v3/files/07-index")), patched);
}

/// A name made in SRC behind the mount's back and never looked up through it cannot be
/// known without a walk. The daemon says so in its log (the file has more links than
/// names it has seen), records the change under the names it knows, and once the other
/// name is looked up (any `ls` of its directory), records later changes under it too.
#[test]
fn a_name_never_looked_up_is_logged_and_tracked_once_seen() {
    let mut m = TestMount::unmounted(&[]);
    fs::create_dir(m.src.join("hidden")).unwrap();
    fs::write(m.src.join("a"), "1\n").unwrap();
    fs::hard_link(m.src.join("a"), m.src.join("hidden/c")).unwrap();
    m.mount();
    checkpoint(&m, "c0");
    append(&m.mnt.join("a"), "2\n");
    checkpoint(&m, "c1");
    assert_eq!(read(&at(&m, "c1").join("a")), "1\n2\n");
    let log = m.daemon_log();
    assert!(
        log.contains("a: 2 links, 1 seen through the mount"),
        "no warning about the unseen link in the log:\n{log}"
    );
    // Now `hidden/c` is seen: the next change is recorded under it as well.
    let ls = run("ls", &["-l", "hidden"], &m.mnt);
    assert!(ls.status.success(), "ls: {}", stderr(&ls));
    append(&m.mnt.join("a"), "3\n");
    checkpoint(&m, "c2");
    append(&m.mnt.join("a"), "4\n");
    checkpoint(&m, "c3");
    assert_eq!(read(&at(&m, "c2").join("hidden/c")), "1\n2\n3\n");
    assert_eq!(read(&at(&m, "c3").join("hidden/c")), "1\n2\n3\n4\n");
    assert_eq!(read(&at(&m, "c2").join("a")), "1\n2\n3\n");
}

/// The daemon's syscalls during one first write through a hard-linked name, counted by
/// `perf stat` on the daemon's threads (tracepoints: nothing is stopped, unlike a ptrace):
/// `(total, getdents64)`. Counting is switched on and off through perf's control fifo, each
/// switch acknowledged, so exactly the write is counted.
fn syscalls_of_a_first_write(files_beside: usize) -> (u64, u64) {
    let mut m = TestMount::unmounted(&[]);
    fs::create_dir(m.src.join("dir")).unwrap();
    for i in 0..files_beside {
        fs::write(m.src.join(format!("dir/f{i}")), "x").unwrap();
    }
    fs::write(m.src.join("dir/a"), "old\n").unwrap();
    fs::hard_link(m.src.join("dir/a"), m.src.join("dir/b")).unwrap();
    m.mount();
    // Both names seen, and everything the kernel needs cached, before counting.
    assert_eq!(read(&m.mnt.join("dir/a")), "old\n");
    assert_eq!(read(&m.mnt.join("dir/b")), "old\n");
    let pid = m.pid().expect("the daemon's pid");
    let work = m.state.parent().unwrap().to_path_buf();
    let (ctl, ack, out) = (
        work.join("perf.ctl"),
        work.join("perf.ack"),
        work.join("perf.out"),
    );
    for fifo in [&ctl, &ack] {
        let made = run("mkfifo", &[fifo], &work);
        assert!(made.status.success(), "mkfifo: {}", stderr(&made));
    }
    let control = format!("fifo:{},{}", ctl.display(), ack.display());
    let mut perf = Command::new("perf")
        .args(["stat", "-x,", "-D", "-1", "--control", &control, "-o"])
        .arg(&out)
        .args(["-e", "raw_syscalls:sys_enter,syscalls:sys_enter_getdents64"])
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("perf (scripts/install-test-deps.sh installs it)");
    // Opening the fifos waits for perf to open its ends.
    let mut ctl_w = fs::OpenOptions::new().write(true).open(&ctl).unwrap();
    let mut ack_r = fs::File::open(&ack).unwrap();
    let mut switch = |cmd: &str| {
        ctl_w.write_all(format!("{cmd}\n").as_bytes()).unwrap();
        let mut buf = [0u8; 5];
        ack_r.read_exact(&mut buf).expect("perf's ack");
        assert_eq!(&buf, b"ack\n\0", "perf's answer to {cmd}");
    };
    switch("enable");
    append(&m.mnt.join("dir/b"), "new\n");
    switch("disable");
    // SAFETY: kill(2) of the perf this test started, by its pid: it then writes the counts.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    perf.wait().expect("perf");
    let summary = fs::read_to_string(&out).expect("perf's counts");
    let count = |event: &str| -> u64 {
        summary
            .lines()
            .find(|l| l.contains(event))
            .and_then(|l| l.split(',').next())
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or_else(|| panic!("no count of {event} in:\n{summary}"))
    };
    let (total, getdents) = (
        count("raw_syscalls:sys_enter"),
        count("sys_enter_getdents64"),
    );
    assert!(total > 0, "no syscalls counted:\n{summary}");
    assert_eq!(read(&m.src.join("dir/a")), "old\nnew\n");
    (total, getdents)
}

/// What a first write through one name of a hard-linked file costs the daemon does not
/// depend on how many files are beside it: no directory is listed (no `getdents64`) and
/// the syscall count is the same for 10 and 5,000 neighbours (a small tolerance for the
/// daemon's own housekeeping threads, which perf counts too).
#[test]
fn a_first_write_through_a_link_costs_the_same_whatever_the_tree() {
    let (small, small_dents) = syscalls_of_a_first_write(10);
    let (big, big_dents) = syscalls_of_a_first_write(5_000);
    eprintln!("first write through a link: {small} syscalls (10 files), {big} (5,000 files)");
    assert_eq!((small_dents, big_dents), (0, 0), "a directory was listed");
    assert!(
        big <= small + small / 4 + 10,
        "{big} syscalls beside 5,000 files vs {small} beside 10"
    );
}
