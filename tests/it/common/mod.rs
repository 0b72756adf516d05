//! Shared harness for the integration tests: a [`TestMount`] that mounts the real binary
//! on fresh temporary directories and never leaves a mount or a daemon behind, plus helpers
//! to run commands and compare trees.

pub mod garage;

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tempfile::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_checkpointfs");

/// A mount of the real binary: `mount SRC MNT --state-dir STATE [args]`, with SRC, MNT and
/// STATE fresh directories under one temporary directory.
///
/// Dropping it (also while a test panics) unmounts (`checkpointfs umount`, then `umount`,
/// then `umount -l`) and kills the daemon it started if that is still alive.
pub struct TestMount {
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub state: PathBuf,
    args: Vec<String>,
    /// Extra environment for the `mount` command (and so the daemon it starts).
    env: Vec<(String, String)>,
    /// The daemon this mount started (from STATE/daemon.pid), while it may be alive.
    pid: Option<i32>,
    /// Mounted by another user (`setpriv`): root's `umount` of it cannot ask its daemon
    /// (the mount is that user's alone), so it unmounts without waiting for the daemon.
    mounted_by_user: bool,
    /// Declared last: removed only after `Drop::drop` has unmounted.
    tmp: TempDir,
}

impl TestMount {
    /// A fresh mount with default options.
    pub fn new() -> TestMount {
        TestMount::with_args(&[])
    }

    /// A fresh mount with extra `mount` arguments, e.g. `&["--no-passthrough"]`.
    pub fn with_args(args: &[&str]) -> TestMount {
        let mut m = TestMount::unmounted(args);
        m.mount();
        m
    }

    /// The directories, not mounted yet: fill `src` first, then call [`TestMount::mount`].
    pub fn unmounted(args: &[&str]) -> TestMount {
        become_subreaper();
        let tmp = tempfile::Builder::new()
            .prefix("checkpointfs-test-")
            .tempdir()
            .expect("create temp dir");
        let root = fs::canonicalize(tmp.path()).expect("canonicalize temp dir");
        let (src, mnt, state) = (root.join("src"), root.join("mnt"), root.join("state"));
        fs::create_dir(&src).expect("create src");
        fs::create_dir(&mnt).expect("create mnt");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&state)
            .expect("create state");
        TestMount {
            src,
            mnt,
            state,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            pid: None,
            mounted_by_user: false,
            tmp,
        }
    }

    /// The temporary directory holding src, mnt and state.
    pub fn root(&self) -> PathBuf {
        fs::canonicalize(self.tmp.path()).expect("canonicalize temp dir")
    }

    /// Sets `key=value` in the environment of later `mount`s (the daemon inherits it), e.g.
    /// `RUST_LOG=debug`. Unlike `std::env::set_var`, this affects only this mount.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Removes `key` from the environment [`TestMount::set_env`] gives later `mount`s.
    pub fn unset_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    /// Replaces the extra `mount` arguments for later `mount`s (e.g. a remount with other
    /// flags).
    pub fn set_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
    }

    /// The daemon's pid while mounted by this harness.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Mounts (panics with the daemon log if that fails).
    pub fn mount(&mut self) {
        self.mount_with_prefix(&[]);
    }

    /// Mounts as user `uid`:`gid` (through `setpriv`, so the daemon runs as that user);
    /// SRC, MNT and STATE must already be that user's. `Drop` still cleans up as root.
    pub fn mount_as(&mut self, uid: u32, gid: u32) {
        let (uid, gid) = (uid.to_string(), gid.to_string());
        self.mount_with_prefix(&[
            "setpriv",
            "--reuid",
            &uid,
            "--regid",
            &gid,
            "--clear-groups",
            "--",
        ]);
    }

    /// Mounts with RLIMIT_NOFILE set to `limit` (soft and hard, so the daemon cannot raise
    /// it), as user `uid`:`gid` if given (see [`TestMount::mount_as`]).
    pub fn mount_with_fd_limit(&mut self, limit: u64, user: Option<(u32, u32)>) {
        let nofile = format!("--nofile={limit}:{limit}");
        let mut prefix = vec!["prlimit", nofile.as_str(), "--"];
        let ids = user.map(|(uid, gid)| (uid.to_string(), gid.to_string()));
        if let Some((uid, gid)) = &ids {
            prefix.extend([
                "setpriv",
                "--reuid",
                uid,
                "--regid",
                gid,
                "--clear-groups",
                "--",
            ]);
        }
        self.mount_with_prefix(&prefix);
    }

    /// Gives SRC, MNT and STATE (and everything in them) to `uid`:`gid` and lets others
    /// reach them, for [`TestMount::mount_as`].
    pub fn give_to(&self, uid: u32, gid: u32) {
        self.give_dirs_to(&[&self.src, &self.mnt, &self.state], uid, gid);
    }

    /// Gives SRC and MNT to `uid`:`gid`, STATE staying root's, and lets others reach them:
    /// the tree of an `--owner` mount.
    pub fn give_tree_to(&self, uid: u32, gid: u32) {
        self.give_dirs_to(&[&self.src, &self.mnt], uid, gid);
    }

    fn give_dirs_to(&self, dirs: &[&Path], uid: u32, gid: u32) {
        fs::set_permissions(self.root(), fs::Permissions::from_mode(0o755)).unwrap();
        for dir in dirs {
            for entry in all_paths(dir) {
                std::os::unix::fs::lchown(&entry, Some(uid), Some(gid)).unwrap();
            }
        }
    }

    /// `prefix... checkpointfs mount ...`: a prefix runs the command through a wrapper.
    fn mount_with_prefix(&mut self, prefix: &[&str]) {
        assert!(self.pid.is_none(), "already mounted");
        let mut args: Vec<&OsStr> = prefix.iter().skip(1).map(OsStr::new).collect();
        if !prefix.is_empty() {
            args.push(BIN.as_ref());
        }
        args.extend([
            OsStr::new("mount"),
            self.src.as_os_str(),
            self.mnt.as_os_str(),
            "--state-dir".as_ref(),
            self.state.as_os_str(),
        ]);
        args.extend(self.args.iter().map(|a| OsStr::new(a.as_str())));
        let program = prefix.first().copied().unwrap_or(BIN);
        let out = Command::new(program)
            .args(&args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {BIN}: {e}"));
        if !out.status.success() {
            panic!(
                "checkpointfs mount failed ({}):\n{}\n--- daemon.log ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr),
                self.daemon_log()
            );
        }
        let pid = read_pid(&self.state.join("daemon.pid")).expect("STATE/daemon.pid after mount");
        self.pid = Some(pid);
        self.mounted_by_user = prefix.contains(&"setpriv");
        assert!(
            is_mount_point(&self.mnt),
            "mount returned but MNT is not mounted"
        );
    }

    /// `checkpointfs umount MNT`, asserting success and that the daemon is gone.
    pub fn umount(&mut self) {
        let out = cli(&["umount".as_ref(), self.mnt.as_os_str()]);
        assert!(
            out.status.success(),
            "checkpointfs umount failed ({}):\n{}\n--- daemon.log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.daemon_log()
        );
        assert!(!is_mount_point(&self.mnt), "still mounted after umount");
        if let Some(pid) = self.pid.take() {
            // `umount` waited for the daemon to exit (root's umount of a user's mount says it
            // cannot, and does not: then the daemon gets a moment to finish its flush); reap
            // it so the pid is really gone.
            if self.mounted_by_user {
                wait_until(Duration::from_secs(30), || !process_alive(pid));
            }
            assert!(
                !process_alive(pid),
                "daemon {pid} alive after umount returned"
            );
            reap(pid, Duration::from_secs(5));
        }
    }

    /// After an unmount made by someone else (another user's `checkpointfs umount`):
    /// asserts that the mount and its daemon are gone, and reaps the daemon.
    pub fn unmounted_by_other(&mut self) {
        assert!(!is_mount_point(&self.mnt), "still mounted");
        if let Some(pid) = self.pid.take() {
            assert!(
                !process_alive(pid),
                "daemon {pid} alive after umount returned"
            );
            reap(pid, Duration::from_secs(5));
        }
    }

    /// Unmount then mount again with the same arguments.
    pub fn remount(&mut self) {
        self.umount();
        self.mount();
    }

    /// Kills the daemon with SIGKILL (no chance to flush) and reaps it, leaving the dead
    /// mount (ENOTCONN) in place; `Drop` still detaches it.
    pub fn kill_daemon(&mut self) {
        let pid = self.pid.take().expect("kill_daemon: not mounted");
        // SAFETY: kill(2) takes plain integers; `pid` is the daemon this mount started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_until(Duration::from_secs(10), || !process_alive(pid));
        reap(pid, Duration::from_secs(5));
    }

    /// Kills the daemon with SIGKILL (no chance to flush), then detaches the dead mount with
    /// `umount -l`.
    pub fn kill9(&mut self) {
        self.kill_daemon();
        let out = run(
            "umount",
            &["-l".as_ref(), self.mnt.as_os_str()],
            Path::new("/"),
        );
        assert!(
            out.status.success(),
            "umount -l: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes `ID\n` to MNT/.checkpoint/ctl in one write.
    pub fn ctl(&self, id: &str) -> io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(self.mnt.join(".checkpoint/ctl"))?;
        let line = format!("{id}\n");
        let n = f.write(line.as_bytes())?;
        if n != line.len() {
            return Err(io::Error::other(format!("short write: {n} bytes")));
        }
        Ok(())
    }

    /// STATE/daemon.log, or a note that it is missing.
    pub fn daemon_log(&self) -> String {
        fs::read_to_string(self.state.join("daemon.log"))
            .unwrap_or_else(|e| format!("(no daemon.log: {e})"))
    }
}

impl Default for TestMount {
    fn default() -> Self {
        TestMount::new()
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {}/daemon.log ---\n{}",
                self.state.display(),
                self.daemon_log()
            );
        }
        // Never panic here: a second panic would abort and skip the cleanup.
        if is_mount_point(&self.mnt) {
            let _ = Command::new(BIN)
                .args([
                    "umount".as_ref(),
                    self.mnt.as_os_str(),
                    "--timeout".as_ref(),
                    "10".as_ref(),
                ])
                .stdin(Stdio::null())
                .output();
        }
        if is_mount_point(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).output();
        }
        if is_mount_point(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
        }
        if let Some(pid) = self.pid.take() {
            if process_alive(pid) {
                // SAFETY: kill(2) takes plain integers; `pid` is the daemon this mount started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            reap(pid, Duration::from_secs(5));
        }
    }
}

/// The uid and gid of the local user `name`, created (no home, no login) if missing.
pub fn test_user(name: &str) -> (u32, u32) {
    // One useradd at a time: two at once may fail on /etc/passwd's lock (all the tests
    // share this process).
    static USERADD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = USERADD.lock().unwrap_or_else(|e| e.into_inner());
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, name]).output().unwrap();
        out.status
            .success()
            .then(|| stdout(&out).trim().parse::<u32>().unwrap())
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args(["-M", "-s", "/usr/sbin/nologin", name])
            .output()
            .unwrap();
        assert!(
            out.status.success() || id("-u").is_some(),
            "useradd: {}",
            stderr(&out)
        );
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// Runs `sh -c script` in the mount, asserting success.
pub fn sh(m: &TestMount, script: &str) {
    let out = run("sh", &["-c", script], &m.mnt);
    assert!(
        out.status.success(),
        "sh -c {script:?} failed: {}",
        stderr(&out)
    );
}

/// Something mounted on a directory (`mount ARGS`) for the life of the guard; unmounted
/// lazily on drop (a daemon may still hold it then).
pub struct OtherMount(PathBuf);

impl OtherMount {
    pub fn new(args: &[&OsStr], at: &Path) -> OtherMount {
        let out = run("mount", args, Path::new("/"));
        assert!(
            out.status.success(),
            "mount {args:?} failed (the test needs root): {}",
            stderr(&out)
        );
        OtherMount(at.to_path_buf())
    }
}

impl Drop for OtherMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

/// Writes `filler` until its disk is full (ENOSPC, synced: nothing is left for anyone).
pub fn fill_disk(filler: &Path) {
    use std::io::Write as _;
    let mut file = fs::File::create(filler).unwrap();
    let chunk = vec![7u8; 1 << 20];
    loop {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_data()) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            return;
        }
    }
}

/// `MNT/.checkpoint/at/<id>`: the tree at checkpoint `id`.
pub fn at(m: &TestMount, id: &str) -> PathBuf {
    m.mnt.join(".checkpoint/at").join(id)
}

/// Takes checkpoint `id` through `.checkpoint/ctl`, asserting success.
pub fn checkpoint(m: &TestMount, id: &str) {
    m.ctl(id).unwrap_or_else(|e| panic!("checkpoint {id}: {e}"));
}

/// `checkpointfs rewind MNT ID [extra...]`, asserting success; returns its stdout.
pub fn rewind(m: &TestMount, id: &str, extra: &[&str]) -> String {
    let mut args = vec!["rewind", m.mnt.to_str().unwrap(), id];
    args.extend_from_slice(extra);
    let out = cli(&args);
    assert!(out.status.success(), "rewind {id}: {}", stderr(&out));
    stdout(&out)
}

/// Makes this test process the reaper of orphaned descendants, so detached daemons become
/// its children once `checkpointfs mount` exits and can be reaped (PID 1 in some containers
/// never reaps, leaving zombies for which `kill(pid, 0)` still succeeds).
fn become_subreaper() {
    static ONCE: Once = Once::new();
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes plain integers and changes only which
    // process reaps this one's orphans.
    ONCE.call_once(|| unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    });
}

/// Reaps `pid` if it is our child (see [`become_subreaper`]); returns its wait status.
pub fn reap(pid: i32, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut status = 0;
        // SAFETY: `status` is a live i32 for the call; WNOHANG never blocks.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(status);
        }
        if r < 0 || Instant::now() >= deadline {
            return None; // not our child, or still running
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` is running; zombies count as exited.
pub fn process_alive(pid: i32) -> bool {
    match fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.iter().rposition(|&b| b == b')') {
            Some(i) => !matches!(stat.get(i + 2), Some(b'Z') | Some(b'X') | None),
            None => true,
        },
        Err(_) => false,
    }
}

/// Polls `cond` every 10 ms until it holds; false on timeout.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Runs `cmd args` in `cwd` with stdin from /dev/null and captures its output.
pub fn run<S: AsRef<OsStr>>(cmd: impl AsRef<OsStr>, args: &[S], cwd: &Path) -> Output {
    let cmd = cmd.as_ref();
    Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs the checkpointfs binary with `args` (cwd `/`).
pub fn cli<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run(BIN, args, Path::new("/"))
}

/// Runs the checkpointfs binary with `args` in `cwd`.
pub fn cli_in<S: AsRef<OsStr>>(cwd: &Path, args: &[S]) -> Output {
    run(BIN, args, cwd)
}

/// `checkpointfs ARGS...` (cwd `/`), asserting success; its stdout.
pub fn cli_ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "checkpointfs {args:?} failed ({}): {}",
        out.status,
        stderr(&out)
    );
    stdout(&out)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Undoes mountinfo's octal escapes (space, tab, newline, backslash).
fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::new();
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        if field[i] == b'\\'
            && let Some(v) = octal
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(field[i]);
        i += 1;
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Mount points in this thread's mount namespace (a test may move one thread), with their
/// fstype, in table order.
pub fn mounts() -> Vec<(PathBuf, String)> {
    let text = fs::read("/proc/thread-self/mountinfo").expect("read /proc/thread-self/mountinfo");
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = f.iter().position(|x| *x == b"-")?;
            Some((
                unescape(f.get(4)?),
                String::from_utf8_lossy(f.get(sep + 1)?).into_owned(),
            ))
        })
        .collect()
}

/// The mountinfo entries (mount point and fstype) at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<(PathBuf, String)> {
    mounts()
        .into_iter()
        .filter(|(p, _)| p.starts_with(dir))
        .collect()
}

/// Makes the kernel forget every inode it can (FORGETs reach the daemons): sync, then
/// `echo 3 > /proc/sys/vm/drop_caches`.
pub fn drop_caches() {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3\n").expect("echo 3 > /proc/sys/vm/drop_caches");
}

pub fn is_mount_point(path: &Path) -> bool {
    mounts().iter().any(|(p, _)| p == path)
}

/// The lowercase hex SHA-256 of `data`, as the store names objects.
pub fn sha256_hex(data: &[u8]) -> String {
    base16ct::lower::encode_string(&Sha256::digest(data))
}

/// The checkpoint ids the mount shows in `MNT/.checkpoint/at/`, sorted by name.
pub fn checkpoint_ids_by_name(m: &TestMount) -> Vec<String> {
    let mut ids: Vec<String> = fs::read_dir(m.mnt.join(".checkpoint/at"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    ids
}

/// The checkpoint ids `log --json` lists, oldest first.
pub fn checkpoint_ids_oldest_first(m: &TestMount) -> Vec<String> {
    let log: serde_json::Value =
        serde_json::from_str(&cli_ok(&["log", m.mnt.to_str().unwrap(), "--json"])).unwrap();
    log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

/// A sorted listing of the whole tree under `dir`, one line per entry:
/// `relpath type mode sha256`, where relpath is `.` for `dir` itself, type is one of
/// file/dir/symlink/fifo/socket/chardev/blockdev, mode is the octal permission bits, and
/// sha256 is of the content (files) or the target (symlinks), `-` otherwise. Symlinks are
/// not followed; a top-level `.checkpoint` is skipped.
pub fn tree_listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, path: &Path, out: &mut Vec<String>) {
    let meta = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("lstat {path:?}: {e}"));
    let rel = match path.strip_prefix(root) {
        Ok(r) if r.as_os_str().is_empty() => ".".to_string(),
        Ok(r) => r.to_string_lossy().into_owned(),
        Err(_) => path.to_string_lossy().into_owned(),
    };
    let ft = meta.file_type();
    let mode = meta.permissions().mode() & 0o7777;
    let (kind, hash) = if ft.is_symlink() {
        let target = fs::read_link(path).unwrap_or_else(|e| panic!("readlink {path:?}: {e}"));
        ("symlink", sha256_hex(target.as_os_str().as_bytes()))
    } else if ft.is_file() {
        let data = fs::read(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
        ("file", sha256_hex(&data))
    } else if ft.is_dir() {
        ("dir", "-".to_string())
    } else if ft.is_fifo() {
        ("fifo", "-".to_string())
    } else if ft.is_socket() {
        ("socket", "-".to_string())
    } else if ft.is_char_device() {
        ("chardev", "-".to_string())
    } else {
        ("blockdev", "-".to_string())
    };
    out.push(format!("{rel} {kind} {mode:04o} {hash}"));
    if ft.is_dir() {
        let entries = fs::read_dir(path).unwrap_or_else(|e| panic!("readdir {path:?}: {e}"));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("readdir {path:?}: {e}"));
            if path == root && entry.file_name() == ".checkpoint" {
                continue;
            }
            walk(root, &entry.path(), out);
        }
    }
}

/// Sets the mode of /dev/fuse for the life of the guard, and puts the original back on
/// drop (also when the test panics). The device is machine-wide state: guards in one test
/// binary are taken one at a time (tests run on two threads), so one test's 0600 never
/// lands in the middle of another's user mount.
pub struct DevFuseMode {
    original: u32,
    _exclusive: std::sync::MutexGuard<'static, ()>,
}

impl DevFuseMode {
    pub fn set(mode: u32) -> DevFuseMode {
        static DEVICE_MODE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let exclusive = DEVICE_MODE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let original = fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(mode)).unwrap();
        DevFuseMode {
            original,
            _exclusive: exclusive,
        }
    }
}

impl Drop for DevFuseMode {
    fn drop(&mut self) {
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.original));
    }
}

/// `command args...` as `uid`:`gid` (no supplementary groups), from `/`.
pub fn run_as(uid: u32, gid: u32, command: &[&str]) -> std::process::Output {
    let (u, g) = (uid.to_string(), gid.to_string());
    let mut args = vec!["--reuid", &u, "--regid", &g, "--clear-groups", "--"];
    args.extend_from_slice(command);
    run("setpriv", &args, Path::new("/"))
}

/// `dir` and everything below it.
pub fn all_paths(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if out[i].is_dir() && !out[i].is_symlink() {
            for e in fs::read_dir(&out[i]).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    out
}

/// One checkpoint of a `log --json` document, for exact comparison: its id, session, ends,
/// and changes as (path, change, sessions).
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedCheckpoint {
    pub id: String,
    pub session: Option<String>,
    pub until: Option<String>,
    pub session_until: Option<String>,
    pub changes: Vec<(String, String, Vec<String>)>,
}

/// The checkpoints of a `log --json` document, asserting `files_changed` counts `changes`.
pub fn logged_checkpoints(log: &serde_json::Value) -> Vec<LoggedCheckpoint> {
    let text = |v: &serde_json::Value| v.as_str().unwrap().to_string();
    let opt = |v: &serde_json::Value| v.as_str().map(str::to_string);
    log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let changes: Vec<_> = c["changes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|ch| {
                    let sessions = ch["sessions"].as_array().unwrap();
                    (
                        text(&ch["path"]),
                        text(&ch["change"]),
                        sessions.iter().map(text).collect(),
                    )
                })
                .collect();
            assert_eq!(
                c["files_changed"].as_u64(),
                Some(changes.len() as u64),
                "{c}"
            );
            LoggedCheckpoint {
                id: text(&c["id"]),
                session: opt(&c["session"]),
                until: opt(&c["until"]),
                session_until: opt(&c["session_until"]),
                changes,
            }
        })
        .collect()
}

/// STATE/transcript.jsonl's records, as JSON values.
pub fn transcript_records(state: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(state.join("transcript.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The fuse module's `enable_uring` parameter (machine-wide; read by the kernel at each
/// mount's INIT), set for the life of the guard and put back on drop (also when the test
/// panics). Tests that set it, or that need the transport it decides, hold one: they run
/// one at a time (tests run on two threads), so one test's setting never lands in the
/// middle of another's mount. Other tests do not care which transport serves them.
pub struct EnableUring {
    original: String,
    _exclusive: std::sync::MutexGuard<'static, ()>,
}

/// Where the kernel exposes it (Linux 6.14+).
pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

impl EnableUring {
    /// Panics if this kernel has no FUSE over io_uring: the tests that take this guard are
    /// about it, and must not pass by doing nothing.
    pub fn set(on: bool) -> EnableUring {
        static PARAMETER: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let exclusive = PARAMETER
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let original = fs::read_to_string(ENABLE_URING).unwrap_or_else(|e| {
            panic!("{ENABLE_URING}: {e} (this test needs a kernel with FUSE over io_uring, 6.14+)")
        });
        fs::write(ENABLE_URING, if on { "Y" } else { "N" })
            .unwrap_or_else(|e| panic!("cannot set {ENABLE_URING}: {e}"));
        EnableUring {
            original: original.trim().to_string(),
            _exclusive: exclusive,
        }
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = fs::write(ENABLE_URING, &self.original);
    }
}

/// `status --json`'s `io` object of the live mount `m` (the transport in use among it),
/// once the transport is chosen: the daemon reports the mount ready before its session has
/// set up the ring (which needs the kernel's INIT first), so right after a mount it may
/// still say "starting".
pub fn status_io(m: &TestMount) -> serde_json::Value {
    let read = || {
        let out = cli_ok(&["status", m.mnt.to_str().unwrap(), "--json"]);
        let status: serde_json::Value = serde_json::from_str(&out).expect("status --json");
        status["io"].clone()
    };
    let mut io = read();
    let chosen = wait_until(Duration::from_secs(30), || {
        io = read();
        io["transport"] != "starting"
    });
    assert!(chosen, "the mount never chose its transport: {io}");
    io
}
