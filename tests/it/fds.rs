//! Bounded descriptors (issue 10): a daemon whose RLIMIT_NOFILE is 1024 (soft and hard, so
//! it cannot raise it) walks, reads, modifies and creates on a 30,000-file tree, takes a
//! checkpoint and serves its view, with zero errors and fewer fds than the limit: idle
//! inodes give their O_PATH fd back and are reopened on demand (by file handle as root, by
//! parent and name as a normal user).
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

const LIMIT: u64 = 1024;
const PER_DIR: usize = 100;

/// Directories of `PER_DIR` files: 300 (a 30k-file tree), or `CPFS_FDS_DIRS` for a run at
/// another size by hand (2000: the 200k-file tree; see docs/performance.md).
fn dirs() -> usize {
    std::env::var("CPFS_FDS_DIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

fn files() -> usize {
    dirs() * PER_DIR
}
const MODIFIED: usize = 1000;
const CREATED: usize = 1000;
/// The workload's mount, for the copy of this binary that runs it as another user.
const MNT_ENV: &str = "CPFS_FDS_WORKLOAD_MNT";

fn file(root: &Path, d: usize, f: usize) -> PathBuf {
    root.join(format!("d{d:03}/f{f:03}"))
}

fn content(d: usize, f: usize) -> String {
    format!("file {d}/{f}\n")
}

/// Writes the tree straight into SRC (before mounting: fast).
fn make_tree(src: &Path) {
    for d in 0..dirs() {
        fs::create_dir(src.join(format!("d{d:03}"))).unwrap();
        for f in 0..PER_DIR {
            fs::write(file(src, d, f), content(d, f)).unwrap();
        }
    }
}

/// Every regular file below `dir`, by `std::fs::read_dir` recursion.
fn files_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {dir:?}: {e}")) {
        let e = e.unwrap_or_else(|e| panic!("read_dir {dir:?}: {e}"));
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            files_below(&e.path(), out);
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
}

/// The whole workload on a mounted tree; panics at the first error.
fn workload(mnt: &Path) {
    // find(1): every entry, no error.
    let out = run("find", &[mnt.as_os_str()], Path::new("/"));
    assert!(out.status.success(), "find: {}", stderr(&out));
    assert_eq!(stderr(&out), "", "find reported errors");
    let found = stdout(&out).lines().count();
    // MNT, the dirs, the files (`.checkpoint` is hidden from readdir).
    assert_eq!(found, 1 + dirs() + files(), "find listed {found} entries");

    // read_dir recursion, then every file read and checked.
    let mut listed = Vec::new();
    files_below(mnt, &mut listed);
    assert_eq!(listed.len(), files());
    for d in 0..dirs() {
        for f in 0..PER_DIR {
            let p = file(mnt, d, f);
            let got = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {p:?}: {e}"));
            assert_eq!(got, content(d, f), "{p:?}");
        }
    }

    // Modify 1,000 (spread over all dirs), create 1,000.
    for i in 0..MODIFIED {
        let (d, f) = (i % dirs(), i / dirs());
        let p = file(mnt, d, f);
        fs::write(&p, format!("modified {i}\n")).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
    }
    for i in 0..CREATED {
        let p = mnt.join(format!("d{:03}/new{i:04}", i % dirs()));
        fs::write(&p, format!("new {i}\n")).unwrap_or_else(|e| panic!("create {p:?}: {e}"));
    }

    // A checkpoint, and its view: every file as it is now.
    fs::write(mnt.join(".checkpoint/ctl"), "c1\n").expect("checkpoint c1");
    let view = mnt.join(".checkpoint/at/c1");
    let mut in_view = Vec::new();
    files_below(&view, &mut in_view);
    assert_eq!(in_view.len(), files() + CREATED);
    for (i, p) in in_view.iter().enumerate() {
        fs::read(p).unwrap_or_else(|e| panic!("read {p:?} (#{i}): {e}"));
    }
    for i in 0..MODIFIED {
        let (d, f) = (i % dirs(), i / dirs());
        let got = fs::read_to_string(file(&view, d, f)).unwrap();
        assert_eq!(got, format!("modified {i}\n"));
    }
    for i in 0..CREATED {
        let got = fs::read_to_string(view.join(format!("d{:03}/new{i:04}", i % dirs()))).unwrap();
        assert_eq!(got, format!("new {i}\n"));
    }
    // The tree itself is still all readable after the churn.
    let again = run("find", &[mnt.as_os_str()], Path::new("/"));
    assert!(again.status.success(), "find: {}", stderr(&again));
    assert_eq!(
        stdout(&again).lines().count(),
        1 + dirs() + files() + CREATED
    );
}

/// Counts the daemon's open fds every 20 ms until stopped; the highest count seen.
struct FdSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdSampler {
    fn start(pid: i32) -> FdSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicUsize::new(0));
        let (s, m) = (stop.clone(), max.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) {
                    m.fetch_max(dir.count(), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        FdSampler {
            stop,
            max,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.max.load(Ordering::Relaxed)
    }
}

/// The unmount line's cache figures: (given back, reopened, how).
fn cache_figures(log: &str) -> (u64, u64, String) {
    let line = log
        .lines()
        .find(|l| l.contains("inode fd cache:") && l.contains("given back"))
        .unwrap_or_else(|| panic!("no fd cache line in the log:\n{log}"));
    let num_before = |word: &str| -> u64 {
        let head = &line[..line.find(word).unwrap()];
        head.split_whitespace().last().unwrap().parse().unwrap()
    };
    let how = line
        .rsplit("reopened by ")
        .next()
        .unwrap()
        .trim_end_matches(')');
    (
        num_before(" given back"),
        num_before(" reopened"),
        how.to_string(),
    )
}

fn check_run(m: &mut TestMount, sampler: FdSampler, expect_how: &str) {
    let max_fds = sampler.finish();
    eprintln!("daemon fds: at most {max_fds} (limit {LIMIT})");
    assert!(max_fds > 0, "no fd count sampled");
    assert!(
        (max_fds as u64) < LIMIT,
        "the daemon held {max_fds} fds (limit {LIMIT})"
    );
    m.umount();
    let log = m.daemon_log();
    let (given_back, reopened, how) = cache_figures(&log);
    eprintln!("{given_back} fds given back, {reopened} reopened by {how}");
    assert!(
        given_back as usize >= files() / 2,
        "the cache gave back {given_back} fds"
    );
    assert!(reopened > 0);
    assert_eq!(how, expect_how);
    assert!(!log.contains("out of file descriptors"), "{log}");
}

#[test]
fn root_daemon_under_a_1024_fd_limit_serves_a_30k_file_tree() {
    let mut m = TestMount::unmounted(&[]);
    make_tree(&m.src);
    m.mount_with_fd_limit(LIMIT, None);
    let sampler = FdSampler::start(m.pid().unwrap());
    workload(&m.mnt);
    check_run(&mut m, sampler, "file handle");
}

#[test]
fn user_daemon_under_a_1024_fd_limit_serves_a_30k_file_tree() {
    let (uid, gid) = test_user("cpfs-test-fds");
    let mut m = TestMount::unmounted(&[]);
    make_tree(&m.src);
    m.give_to(uid, gid);
    let _mode = DevFuseMode::set(0o666);
    m.mount_with_fd_limit(LIMIT, Some((uid, gid)));
    let sampler = FdSampler::start(m.pid().unwrap());
    // A user's mount is the user's alone: the workload runs as the user, in a copy of this
    // test binary.
    let me = std::env::current_exe().unwrap();
    let (u, g) = (uid.to_string(), gid.to_string());
    let out = Command::new("setpriv")
        .args(["--reuid", &u, "--regid", &g, "--clear-groups", "--"])
        .arg(&me)
        .args([
            "--exact",
            "fds::workload_as_the_mounting_user",
            "--ignored",
            "--nocapture",
        ])
        .env(MNT_ENV, &m.mnt)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success() && stdout(&out).contains("1 passed"),
        "workload as uid {uid}: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    check_run(&mut m, sampler, "parent and name");
}

/// Run by `user_daemon_under_a_1024_fd_limit_serves_a_30k_file_tree` as the user.
#[test]
#[ignore = "run as another user by user_daemon_under_a_1024_fd_limit_serves_a_30k_file_tree"]
fn workload_as_the_mounting_user() {
    let mnt = std::env::var_os(MNT_ENV)
        .unwrap_or_else(|| panic!("{MNT_ENV} must name the mount (set by the caller test)"));
    workload(Path::new(&mnt));
}

/// Renames (of a directory and of a file out of it) and the unlink of a hard link's origin
/// name, with a budget of 8 fds (constant give-backs and reopens): the kernel's cached
/// entries still open, read and change the right objects, and the view matches SRC.
/// (Not a proof that each origin update is needed: with the rename or unlink bookkeeping
/// disabled this still passed, so which entries get reopened here is not pinned down.)
fn renames_and_links_survive_give_backs(no_file_handles: bool) {
    let mut m = TestMount::unmounted(&[]);
    fs::create_dir_all(m.src.join("a")).unwrap();
    fs::create_dir_all(m.src.join("b")).unwrap();
    fs::create_dir_all(m.src.join("z")).unwrap();
    for i in 0..20 {
        fs::write(m.src.join(format!("a/f{i}")), format!("f{i}\n")).unwrap();
    }
    for i in 0..200 {
        fs::write(m.src.join(format!("z/churn{i}")), "x").unwrap();
    }
    fs::write(m.src.join("a/linked"), "shared\n").unwrap();
    fs::hard_link(m.src.join("a/linked"), m.src.join("b/other")).unwrap();
    m.set_env("CHECKPOINTFS_FD_BUDGET", "8");
    if no_file_handles {
        m.set_env("CHECKPOINTFS_NO_FILE_HANDLES", "1");
    }
    m.mount();
    let mnt = m.mnt.clone();
    let churn = || {
        for i in 0..200 {
            assert_eq!(fs::read(mnt.join(format!("z/churn{i}"))).unwrap(), b"x");
        }
    };
    // Entries known to the kernel (and so kept for a day), in this order: `b/other` first,
    // then `a/linked`, which becomes the origin of the linked object.
    fs::metadata(mnt.join("b/other")).unwrap();
    files_below(&mnt.join("a"), &mut Vec::new());
    fs::metadata(mnt.join("a/linked")).unwrap();
    let ino_other =
        std::os::unix::fs::MetadataExt::ino(&fs::metadata(mnt.join("b/other")).unwrap());

    fs::rename(mnt.join("a"), mnt.join("c")).unwrap();
    fs::rename(mnt.join("c/f0"), mnt.join("b/g0")).unwrap();
    churn();
    for i in 1..20 {
        assert_eq!(
            fs::read_to_string(mnt.join(format!("c/f{i}"))).unwrap(),
            format!("f{i}\n")
        );
    }
    assert_eq!(fs::read_to_string(mnt.join("b/g0")).unwrap(), "f0\n");
    fs::write(mnt.join("c/f1"), "changed\n").unwrap();
    churn();
    assert_eq!(fs::read_to_string(m.src.join("c/f1")).unwrap(), "changed\n");

    // The origin name of the linked object goes; the other name still reaches it.
    fs::remove_file(mnt.join("c/linked")).unwrap();
    churn();
    fs::write(mnt.join("b/other"), "still here\n").unwrap();
    churn();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(mnt.join("b/other"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::read_to_string(m.src.join("b/other")).unwrap(),
        "still here\n"
    );
    let st = fs::metadata(m.src.join("b/other")).unwrap();
    assert_eq!(st.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&st), ino_other);

    // A checkpoint and its view after all that.
    checkpoint(&m, "c1");
    assert_eq!(
        fs::read_to_string(at(&m, "c1").join("b/other")).unwrap(),
        "still here\n"
    );
    assert_eq!(tree_listing(&at(&m, "c1")), tree_listing(&m.src));
    m.umount();
    let (given_back, _, how) = cache_figures(&m.daemon_log());
    assert!(given_back > 400, "only {given_back} fds given back");
    assert_eq!(
        how,
        if no_file_handles {
            "parent and name"
        } else {
            "file handle"
        }
    );
}

#[test]
fn renames_and_links_survive_give_backs_by_parent_and_name() {
    renames_and_links_survive_give_backs(true);
}

#[test]
fn renames_and_links_survive_give_backs_by_file_handle() {
    renames_and_links_survive_give_backs(false);
}
