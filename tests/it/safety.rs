//! Issue 11 item 7 and its "what to build" list: the control socket answers every request,
//! a rewind works only on this mount's root as the kernel sees it, replay refuses impossible
//! histories, and `ctl` takes each write whole.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use common::{TestMount, at, checkpoint, cli, is_mount_point, stderr};

/// Sends `request` as is on a fresh connection to the daemon's control socket (then shuts
/// down the writing side) and returns its reply, parsed.
fn raw_request(m: &TestMount, request: &[u8]) -> serde_json::Value {
    let stream = UnixStream::connect(m.state.join("control.sock")).expect("connect");
    (&stream).write_all(request).expect("send");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .expect("read the reply");
    assert!(
        line.ends_with('\n'),
        "no complete reply to {request:?}: {line:?}"
    );
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?}: {e}"))
}

fn assert_refused(reply: &serde_json::Value, wanted: &str) {
    assert_eq!(reply["ok"], false, "{reply}");
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("bad control request") && error.contains(wanted),
        "wanted {wanted:?} in {reply}"
    );
    assert_eq!(reply["errno"], libc::EINVAL, "{reply}");
}

#[test]
fn every_control_request_gets_a_reply_and_the_daemon_keeps_serving() {
    let m = TestMount::new();
    fs::write(m.mnt.join("f"), "one\n").unwrap();
    assert_refused(&raw_request(&m, b"\xff\xfe{}\n"), "not valid UTF-8");
    assert_refused(&raw_request(&m, b"not json\n"), "expected");
    assert_refused(&raw_request(&m, b"[1, 2]\n"), "invalid type");
    assert_refused(
        &raw_request(&m, b"{\"cmd\":\"explode\"}\n"),
        "unknown variant `explode`",
    );
    assert_refused(
        &raw_request(&m, b"{\"cmd\":\"checkpoint\",\"id\":\"c"),
        "truncated after",
    );
    assert_refused(&raw_request(&m, b""), "truncated after 0 bytes");
    // 16 MiB with no newline: refused once that much is read, not buffered on.
    let big = vec![b'x'; 16 << 20];
    assert_refused(&raw_request(&m, &big), "longer than 16777216 bytes");
    // Still serving, requests as the CLI sends them included.
    let ok = raw_request(&m, b"{\"cmd\":\"checkpoint\",\"id\":\"after-junk\"}\n");
    assert_eq!(ok["ok"], true, "{ok}");
    assert_eq!(
        fs::read_to_string(at(&m, "after-junk").join("f")).unwrap(),
        "one\n"
    );
    let out = cli(&["log", m.mnt.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(common::stdout(&out).contains("after-junk"));
}

/// Puts the mount's parent directory back where it was on every exit path, so that `Drop`
/// of the mount finds it.
struct MovedBack {
    parent: PathBuf,
    moved: PathBuf,
}

impl Drop for MovedBack {
    fn drop(&mut self) {
        if self.moved.exists() {
            // The decoy holds no mount: only the moved directory does.
            let _ = fs::remove_dir_all(&self.parent);
            let _ = fs::rename(&self.moved, &self.parent);
        }
    }
}

fn rewind_request(m: &TestMount, id: &str) -> serde_json::Value {
    let req = format!("{{\"cmd\":\"rewind\",\"id\":\"{id}\",\"dry_run\":false,\"paths\":[]}}\n");
    raw_request(m, req.as_bytes())
}

/// The rewind root is verified from the kernel: a user who owns a parent of the mount point
/// moves the mount away and puts a plain directory in its place; the rewind (as root)
/// refuses, and changes nothing in either place.
#[test]
fn a_rewind_refuses_a_mount_point_that_is_no_longer_this_mount() {
    let mut m = TestMount::unmounted(&[]);
    let parent = m.root().join("p");
    fs::create_dir(&parent).unwrap();
    m.mnt = parent.join("mnt");
    fs::create_dir(&m.mnt).unwrap();
    m.mount();
    fs::write(m.mnt.join("f"), "old\n").unwrap();
    checkpoint(&m, "c1");
    fs::write(m.mnt.join("f"), "new\n").unwrap();

    let moved = m.root().join("q");
    fs::rename(&parent, &moved).unwrap();
    let _back = MovedBack {
        parent: parent.clone(),
        moved: moved.clone(),
    };
    fs::create_dir_all(&m.mnt).unwrap();
    fs::write(m.mnt.join("f"), "decoy\n").unwrap();
    let reply = rewind_request(&m, "c1");
    assert_eq!(reply["ok"], false, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains("is not this mount's root any more")
            && error.contains("not a FUSE mount")
            && error.contains("Nothing was changed"),
        "{error}"
    );
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "decoy\n");
    assert_eq!(fs::read_to_string(moved.join("mnt/f")).unwrap(), "new\n");
    // Not even the `:before-rewind` checkpoint was taken.
    assert!(!moved.join("mnt/.checkpoint/at/c1:before-rewind").exists());

    // A symlink in its place to a directory inside the mount: the same device, not its root.
    fs::remove_dir_all(&m.mnt).unwrap();
    fs::create_dir(moved.join("mnt/sub")).unwrap();
    std::os::unix::fs::symlink(moved.join("mnt/sub"), &m.mnt).unwrap();
    let reply = rewind_request(&m, "c1");
    assert_eq!(reply["ok"], false, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("a directory inside this mount, not its root"),
        "{reply}"
    );
    assert_eq!(fs::read_to_string(moved.join("mnt/f")).unwrap(), "new\n");
    assert!(!moved.join("mnt/sub/f").exists());

    // Back in place, the same rewind works.
    fs::remove_file(&m.mnt).unwrap();
    fs::remove_dir(moved.join("mnt/sub")).unwrap();
    drop(_back);
    let reply = rewind_request(&m, "c1");
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "old\n");
}

/// STATE/mountpoint is the CLI's note, never the rewind's root: a wrong one sends the
/// rewind nowhere else.
#[test]
fn a_wrong_mountpoint_file_does_not_move_the_rewind() {
    let m = TestMount::new();
    fs::write(m.mnt.join("f"), "old\n").unwrap();
    checkpoint(&m, "c1");
    fs::write(m.mnt.join("f"), "new\n").unwrap();
    let decoy = m.root().join("decoy");
    fs::create_dir(&decoy).unwrap();
    fs::write(decoy.join("f"), "decoy\n").unwrap();
    let note = m.state.join("mountpoint");
    let before = fs::read(&note).ok();
    fs::write(&note, format!("{}\n", decoy.display())).unwrap();
    let reply = rewind_request(&m, "c1");
    if let Some(before) = before {
        fs::write(&note, before).unwrap();
    }
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "old\n");
    assert_eq!(fs::read_to_string(decoy.join("f")).unwrap(), "decoy\n");
    assert_eq!(fs::read_dir(&decoy).unwrap().count(), 1);
}

fn mount_cli(m: &TestMount) -> std::process::Output {
    cli(&[
        "mount",
        m.src.to_str().unwrap(),
        m.mnt.to_str().unwrap(),
        "--state-dir",
        m.state.to_str().unwrap(),
    ])
}

/// The transcript's records with `edit` applied to the backups of the last one that has
/// any, appended as a new record with the next seq.
fn append_edited_record(state: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = state.join("transcript.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let mut last: serde_json::Value = text
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["snapshot"]["trackedFileBackups"]
                .as_object()
                .is_some_and(|b| !b.is_empty())
        })
        .expect("a record with backups");
    let seq = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["seq"].as_u64())
        .max()
        .unwrap();
    last["seq"] = (seq + 1).into();
    last["isSnapshotUpdate"] = true.into();
    for (_, b) in last["snapshot"]["trackedFileBackups"]
        .as_object_mut()
        .unwrap()
        .iter_mut()
    {
        edit(b);
    }
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    writeln!(f, "{last}").unwrap();
}

/// A version gap, or a record naming an object the store lacks, fails the mount with a
/// message that says what is wrong and what to do, never a panic on a FUSE thread later.
#[test]
fn replay_refuses_impossible_histories_with_a_clear_error() {
    let mut m = TestMount::new();
    fs::write(m.mnt.join("f"), "one\n").unwrap();
    checkpoint(&m, "c1");
    fs::write(m.mnt.join("f"), "two\n").unwrap();
    checkpoint(&m, "c2");
    m.umount();
    let transcript = m.state.join("transcript.jsonl");
    let good = fs::read(&transcript).unwrap();

    append_edited_record(&m.state, |b| b["version"] = 9.into());
    let out = mount_cli(&m);
    assert!(!out.status.success(), "mounted an impossible history");
    assert!(!is_mount_point(&m.mnt));
    let err = stderr(&out);
    assert!(
        err.contains("impossible history") && err.contains("jumps to version 9"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    fs::write(&transcript, &good).unwrap();
    append_edited_record(&m.state, |b| {
        b["version"] = 3.into();
        b["backupFileName"] = "../../../etc/shadow".into();
    });
    let err = stderr(&mount_cli(&m));
    assert!(err.contains("not a store object name"), "{err}");

    fs::write(&transcript, &good).unwrap();
    append_edited_record(&m.state, |b| {
        b["version"] = 3.into();
        b["backupFileName"] = "ab".repeat(32).into();
    });
    let err = stderr(&mount_cli(&m));
    assert!(
        err.contains(&format!(
            "needs store object {}, which is missing",
            "ab".repeat(32)
        )) && err.contains("move it aside"),
        "{err}"
    );
    assert!(!is_mount_point(&m.mnt));

    // The history as it was mounts, with both checkpoints.
    fs::write(&transcript, &good).unwrap();
    m.mount();
    assert_eq!(fs::read_to_string(at(&m, "c1").join("f")).unwrap(), "one\n");
    assert_eq!(fs::read_to_string(at(&m, "c2").join("f")).unwrap(), "two\n");
}

fn ids_in(m: &TestMount) -> Vec<String> {
    let mut ids: Vec<String> = fs::read_dir(m.mnt.join(".checkpoint/at"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ids.sort();
    ids
}

/// An id split across two write(2) calls is one checkpoint; a line without newline is taken
/// at close (by the writer's close: a forked child closing its inherited copy takes nothing,
/// and this test's process forks for the other tests meanwhile); a write with one bad line
/// is refused whole.
#[test]
fn ctl_takes_each_line_whole_across_writes() {
    let m = TestMount::new();
    let open = || {
        fs::OpenOptions::new()
            .write(true)
            .open(m.mnt.join(".checkpoint/ctl"))
            .unwrap()
    };
    let mut f = open();
    assert_eq!(f.write(b"spl").unwrap(), 3);
    // A child inherits the descriptor and exits: its close (a FLUSH) takes nothing.
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor this test owns.
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) }, 0);
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
    // SAFETY: as above.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    assert!(ids_in(&m).is_empty(), "{:?}", ids_in(&m));
    assert_eq!(f.write(b"it\nlast").unwrap(), 7);
    assert_eq!(ids_in(&m), ["split"]);
    drop(f);
    assert_eq!(ids_in(&m), ["last", "split"]);

    let mut f = open();
    let err = f.write(b"good-1\nbad id\ngood-2\n").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    let err = f.write(b"good-1\nsplit\n").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    let err = f.write(b"twice\ntwice\n").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
    assert_eq!(ids_in(&m), ["last", "split"]);
    // A refused write leaves what was buffered as it was.
    f.write_all(b"pend").unwrap();
    assert!(f.write(&[b'x'; 300]).is_err());
    f.write_all(b"ing\n").unwrap();
    assert_eq!(ids_in(&m), ["last", "pending", "split"]);
    // A bad last line without newline fails close(2).
    f.write_all(b"bad id").unwrap();
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: closing the fd this test owns, once.
    let rc = unsafe { libc::close(fd) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );

    // One 3.4 MB write, which the kernel splits into FUSE requests of at most 1 MiB at
    // arbitrary bytes (the issue's 30,000 ids, 3 of which came out cut in two).
    let ids: Vec<String> = (0..30_000)
        .map(|i| format!("bulk-{i:05}-{}", "x".repeat(100)))
        .collect();
    let data = ids.iter().map(|id| format!("{id}\n")).collect::<String>();
    assert!(data.len() > 3_300_000);
    let mut f = open();
    assert_eq!(f.write(data.as_bytes()).unwrap(), data.len());
    drop(f);
    let got = ids_in(&m);
    let extra: Vec<&String> = got
        .iter()
        .filter(|g| !ids.contains(g) && !["last", "pending", "split"].contains(&g.as_str()))
        .collect();
    assert_eq!(got.len(), 30_003, "ids cut in two? {extra:?}");
    for id in &ids {
        assert!(got.binary_search(id).is_ok(), "{id} missing");
    }
}

/// log and diff tolerate files that vanish under them: a writer saving by tmp+rename made
/// 10 of 450 runs fail with ENOENT before (2 % of runs, as in the issue's 73 of 2,032).
#[test]
fn log_and_diff_tolerate_files_replaced_under_them() {
    let m = TestMount::new();
    for i in 0..20 {
        fs::write(m.mnt.join(format!("f{i}")), "0\n").unwrap();
    }
    checkpoint(&m, "c0");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, mnt) = (stop.clone(), m.mnt.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let i = n % 20;
                let tmp = mnt.join(format!(".t{i}"));
                fs::write(&tmp, format!("{n}\n")).unwrap();
                fs::rename(&tmp, mnt.join(format!("f{i}"))).unwrap();
                n += 1;
            }
            n
        })
    };
    let mnt = m.mnt.to_str().unwrap();
    let mut failures = Vec::new();
    for _ in 0..100 {
        for args in [
            vec!["log", mnt],
            vec!["diff", mnt, "c0"],
            vec!["status", mnt],
        ] {
            let out = cli(&args);
            if !out.status.success() {
                failures.push(format!("{args:?}: {}", stderr(&out)));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let saves = writer.join().unwrap();
    assert!(saves > 100, "the writer saved only {saves} times");
    assert!(
        failures.is_empty(),
        "{} of 300 failed: {failures:?}",
        failures.len()
    );
}

/// A Python helper that walks `dir` down `levels` directories named `name` with `dir_fd`
/// (so no path string is ever longer than one name), then runs `action` on file `f` there.
fn deep_python(dir: &Path, levels: usize, name: &str, action: &str) -> std::process::Output {
    let script = format!(
        r#"
import os, sys
fd = os.open({dir:?}, os.O_RDONLY | os.O_DIRECTORY)
for _ in range({levels}):
    if sys.argv[1] == "mkdir":
        try:
            os.mkdir({name:?}, dir_fd=fd)
        except FileExistsError:
            pass
    nfd = os.open({name:?}, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
if sys.argv[1] in ("mkdir", "write"):
    w = os.open("f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
    os.write(w, sys.argv[2].encode())
    os.close(w)
else:
    r = os.open("f", os.O_RDONLY, dir_fd=fd)
    sys.stdout.write(os.read(r, 1 << 16).decode())
    os.close(r)
"#,
        dir = dir.to_str().unwrap(),
    );
    let mut cmd = vec!["-c", script.as_str()];
    cmd.extend(action.split(' '));
    common::run("python3", &cmd, Path::new("/"))
}

#[test]
fn paths_longer_than_path_max_are_tracked_viewed_and_rewound() {
    let m = TestMount::new();
    // 24 levels of 250-byte names: a relative path of 6,025 bytes, past PATH_MAX (4,096),
    // which the kernel allows when each step is relative.
    let (levels, name) = (24, "d".repeat(250));
    let ok = |out: std::process::Output| {
        assert!(out.status.success(), "python: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    ok(deep_python(&m.mnt, levels, &name, "mkdir first"));
    checkpoint(&m, "before");
    ok(deep_python(&m.mnt, levels, &name, "write second"));
    assert_eq!(ok(deep_python(&m.mnt, levels, &name, "read")), "second");
    // The view shows the content at the checkpoint, the rewind brings it back.
    assert_eq!(
        ok(deep_python(&at(&m, "before"), levels, &name, "read")),
        "first"
    );
    common::rewind(&m, "before", &[]);
    assert_eq!(ok(deep_python(&m.mnt, levels, &name, "read")), "first");
    assert_eq!(ok(deep_python(&m.src, levels, &name, "read")), "first");
}

/// What another local user gets from the control socket: `EACCES` at connect while its mode
/// (0600, root's) holds, and a refusal without effect when the socket is reachable anyway (a
/// connection made before the mode was set, or a mode an admin loosened).
#[test]
fn another_user_cannot_control_the_mount_through_its_socket() {
    use std::os::unix::fs::PermissionsExt;
    let m = TestMount::new();
    let (uid, gid) = common::test_user("cpfs-test-peer");
    fs::write(m.mnt.join("f"), "mine\n").unwrap();
    // Let the other user reach the state dir (others may read it; only writing is refused).
    for dir in [m.state.parent().unwrap(), &m.state] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let socket = m.state.join("control.sock");
    let script = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("EACCES at connect")
    sys.exit(0)
s.sendall(b'{"cmd":"checkpoint","id":"intruder"}\n')
print(s.makefile().readline(), end="")
"#;
    let as_other = || {
        let out = common::run_as(
            uid,
            gid,
            &["/usr/bin/python3", "-c", script, socket.to_str().unwrap()],
        );
        assert!(out.status.success(), "python: {}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(as_other().trim(), "EACCES at connect");

    fs::set_permissions(&socket, fs::Permissions::from_mode(0o666)).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&as_other()).unwrap();
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["errno"], libc::EACCES, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("uid {uid} may not control this mount")),
        "{error}"
    );
    assert!(
        !at(&m, "intruder").exists(),
        "the refused checkpoint was taken"
    );
    assert!(m.daemon_log().contains("refused a connection from uid"));
    // Root is still served.
    checkpoint(&m, "mine");
    assert_eq!(
        fs::read_to_string(at(&m, "mine").join("f")).unwrap(),
        "mine\n"
    );
}

/// Issue 11 item 1: a local user who owns a directory in the tree swaps it for a symlink to a
/// root-only file outside, over and over, while root rewinds (each rewind changes that
/// directory's mode). Nothing outside the tree may change: not the file's mode, owner or
/// content. Before the fix, root's rewind made the target 0777 in 6 of 6 trials.
#[test]
fn a_directory_swapped_for_a_symlink_during_rewinds_never_leads_them_out_of_the_tree() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut m = TestMount::unmounted(&[]);
    let (uid, gid) = common::test_user("cpfs-test-swap");
    let target = m.root().join("root-only");
    fs::write(&target, "root's secret\n").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).unwrap();
    // pub/ is writable by everyone (so the user may rename in it); pub/u is the user's.
    let public = m.src.join("pub");
    fs::create_dir(&public).unwrap();
    fs::set_permissions(&public, fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(public.join("u")).unwrap();
    fs::write(public.join("u/f"), "user file\n").unwrap();
    for p in [public.join("u"), public.join("u/f")] {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
    }
    std::os::unix::fs::symlink(&target, public.join("lnk")).unwrap();
    std::os::unix::fs::lchown(public.join("lnk"), Some(uid), Some(gid)).unwrap();
    for dir in [m.root(), m.src.clone()] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    m.mount();
    // Two checkpoints between which pub/u's mode differs: every rewind sets it.
    fs::set_permissions(m.mnt.join("pub/u"), fs::Permissions::from_mode(0o700)).unwrap();
    checkpoint(&m, "c700");
    fs::set_permissions(m.mnt.join("pub/u"), fs::Permissions::from_mode(0o755)).unwrap();
    checkpoint(&m, "c755");

    // The attacker: RENAME_EXCHANGE pub/u <-> pub/lnk in SRC as fast as it can, until its
    // stdin closes.
    let script = format!(
        r#"
import ctypes, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
os.chdir({public:?})
print("ready", flush=True)
n = 0
while not stop.is_set():
    if libc.renameat2(-100, b"u", -100, b"lnk", 2) == 0:
        n += 1
print(n, flush=True)
"#,
        public = public.to_str().unwrap()
    );
    let (u, g) = (uid.to_string(), gid.to_string());
    let mut attacker = std::process::Command::new("setpriv")
        .args(["--reuid", &u, "--regid", &g, "--clear-groups", "--"])
        .args(["/usr/bin/python3", "-c", &script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(attacker.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let (mut ok, mut refused) = (0, 0);
    for i in 0..40 {
        let id = if i % 2 == 0 { "c700" } else { "c755" };
        let r = cli(&["rewind", m.mnt.to_str().unwrap(), id]);
        if r.status.success() {
            ok += 1;
        } else {
            // What is there is not what was planned: reported and left alone.
            refused += 1;
        }
        let st = fs::symlink_metadata(&target).unwrap();
        assert_eq!(
            (st.mode() & 0o7777, st.uid(), st.gid()),
            (0o600, 0, 0),
            "rewind {i} changed the file outside the tree"
        );
    }
    drop(attacker.stdin.take());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(attacker.wait().unwrap().success());
    let swaps: u64 = line.trim().parse().unwrap();
    eprintln!("{ok} rewinds done, {refused} refused, {swaps} swaps meanwhile");
    assert_eq!(fs::read_to_string(&target).unwrap(), "root's secret\n");
    assert!(swaps > 40, "the attacker swapped only {swaps} times");
    assert!(
        ok + refused == 40 && ok > 0,
        "{ok} rewinds done, {refused} refused"
    );
}
