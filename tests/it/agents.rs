//! What agents and their users meet: changes attributed to processes (not threads), ioctls
//! answered quietly, and a normal user mounting through fusermount3.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::*;

/// Runs `python3 -c script` in `dir`, asserting success.
fn python(dir: &Path, script: &str) {
    let out = run("python3", &["-c", script], dir);
    assert!(out.status.success(), "python3 failed: {}", stderr(&out));
}

#[test]
fn writes_from_a_named_thread_are_logged_under_the_process_name() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("f.txt"), "one\n").unwrap();
    m.mount();
    // The writer thread renames itself, as Bun's "Bun Pool 0" threads do; FUSE reports that
    // thread's id.
    python(
        &m.mnt,
        r#"
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
def work():
    assert libc.prctl(15, b"Pool Worker 7", 0, 0, 0) == 0   # PR_SET_NAME
    assert open("/proc/thread-self/comm").read().strip() == "Pool Worker 7"
    with open("f.txt", "a") as f:
        f.write("two\n")
t = threading.Thread(target=work)
t.start()
t.join()
"#,
    );
    checkpoint(&m, "c1");
    let log = cli_ok(&["log", m.mnt.to_str().unwrap()]);
    assert!(log.contains("M f.txt  (by python3)"), "log:\n{log}");
    // As root, the mount is made with mount(2) and reads and writes bypass the daemon.
    let status = cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(
        status.contains("file io:        kernel passthrough (")
            && status.contains("mounted by:     root (mount(2))"),
        "{status}"
    );
    assert!(!log.contains("Pool Worker"), "log names the thread:\n{log}");
    m.umount();
    // The transcript records the process: its pid is the thread group, with its executable.
    let transcript = fs::read_to_string(m.state.join("transcript.jsonl")).unwrap();
    let actor = transcript
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find_map(|r| {
            r["snapshot"]["trackedFileBackups"]["f.txt"]["actor"]
                .as_object()
                .cloned()
        })
        .expect("an actor for f.txt");
    assert_eq!(actor["comm"], "python3");
    let exe = actor["exe"].as_str().expect("exe recorded");
    assert!(
        Path::new(exe)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("python3"),
        "exe {exe}"
    );
}

#[test]
fn ioctls_are_answered_enotty_and_logged_once() {
    let mut m = TestMount::new();
    // Python's open() asks isatty() (TCGETS) of every file it opens in buffered mode.
    python(
        &m.mnt,
        r#"
import errno, fcntl, termios
for i in range(100):
    with open(f"f{i}", "w") as f:
        f.write("x")
with open("f0", "rb") as f:
    assert not f.isatty()
    try:
        fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
        raise SystemExit("TCGETS succeeded on a regular file")
    except OSError as e:
        assert e.errno == errno.ENOTTY, e
"#,
    );
    m.umount();
    let log = m.daemon_log();
    let ioctl_lines = log.lines().filter(|l| l.contains("ioctl")).count();
    assert!(
        ioctl_lines <= 1,
        "{ioctl_lines} ioctl log lines for 100 opens:\n{log}"
    );
    assert!(!log.contains("Not Implemented"), "log:\n{log}");
}

/// The uid and gid of this file's local test user, created if missing.
fn test_user() -> (u32, u32) {
    common::test_user("cpfs-test-agents")
}

/// `sh -c script` in `dir` as `uid`:`gid`, asserting success; returns stdout.
fn sh_as(uid: u32, gid: u32, dir: &Path, script: &str) -> String {
    let script = format!("cd '{}' && {script}", dir.display());
    let out = run_as(uid, gid, &["sh", "-c", &script]);
    assert!(
        out.status.success(),
        "sh -c {script:?} as {uid}: {}",
        stderr(&out)
    );
    stdout(&out)
}

#[test]
fn a_normal_user_mounts_through_fusermount3() {
    assert!(
        Path::new("/usr/bin/fusermount3").exists() || which("fusermount3"),
        "fusermount3 (fuse3) must be installed: scripts/install-test-deps.sh installs it"
    );
    let (uid, gid) = test_user();
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("notes.txt"), "v1\n").unwrap();
    m.give_to(uid, gid);
    let bin = BIN;
    let mnt = m.mnt.to_str().unwrap().to_string();

    // Root-only /dev/fuse: fusermount3 opens it as the user, so no user can mount; the
    // error says why and what to do, and nothing is mounted.
    {
        let _mode = DevFuseMode::set(0o600);
        let out = run_as(
            uid,
            gid,
            &[
                bin,
                "mount",
                m.src.to_str().unwrap(),
                &mnt,
                "--state-dir",
                m.state.to_str().unwrap(),
            ],
        );
        assert!(!out.status.success(), "mounted with a root-only /dev/fuse");
        let err = stderr(&out);
        assert!(
            err.contains("/dev/fuse") && err.contains("0666"),
            "unclear error: {err}"
        );
        assert!(!is_mount_point(&m.mnt));
    }

    // The usual 0666 /dev/fuse: the mount goes through the setuid fusermount3. The mode
    // stays for the mount's life, as on a machine set up so: each FUSE worker thread opens
    // its own clone of the device.
    let _mode = DevFuseMode::set(0o666);
    m.mount_as(uid, gid);
    let pid = m.pid().unwrap();
    let daemon_uid = fs::metadata(format!("/proc/{pid}")).unwrap().uid();
    assert_eq!(daemon_uid, uid, "the daemon runs as the user");
    let line = mounts()
        .into_iter()
        .find(|(p, _)| p == &m.mnt)
        .expect("listed in /proc/mounts");
    assert_eq!(line.1, "fuse.checkpointfs");

    // Without allow_other, a user's FUSE mount is the user's alone (not even root may enter
    // it), so everything below runs as the user, from outside the mount.
    sh_as(
        uid,
        gid,
        &m.mnt,
        "echo v2 > notes.txt && echo c1 > .checkpoint/ctl && echo v3 > notes.txt && rm notes.txt",
    );
    let at_c1 = sh_as(uid, gid, &m.mnt, "cat .checkpoint/at/c1/notes.txt");
    assert_eq!(at_c1, "v2\n");
    let rewound = sh_as(uid, gid, &m.mnt, &format!("{bin} rewind {mnt} c1"));
    assert!(rewound.contains("before-rewind"), "{rewound}");
    assert_eq!(sh_as(uid, gid, &m.mnt, "cat notes.txt"), "v2\n");
    let status = sh_as(uid, gid, &m.mnt, &format!("{bin} status {mnt}"));
    assert!(status.contains("checkpoints:    2"), "{status}");
    assert!(
        status.contains(&format!(
            "file io:        served by the daemon (kernel passthrough is off: it needs \
             CAP_SYS_ADMIN, which this daemon (uid {uid}) lacks"
        )),
        "{status}"
    );
    assert!(
        status.contains(&format!("mounted by:     uid {uid} (fusermount3)")),
        "{status}"
    );
    sh_as(uid, gid, Path::new("/"), &format!("{bin} umount {mnt}"));
    assert!(!is_mount_point(&m.mnt));
    assert!(
        wait_until(std::time::Duration::from_secs(10), || !process_alive(pid)),
        "daemon {pid} still alive after umount"
    );
    reap(pid, std::time::Duration::from_secs(5));
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Waits until the dead mount at `mnt` answers ENOTCONN (for a moment after the daemon's
/// death, requests in flight get ECONNABORTED or ECANCELED instead).
fn wait_for_dead_endpoint(mnt: &Path) {
    let settled = wait_until(std::time::Duration::from_secs(10), || {
        fs::metadata(mnt.join("probe"))
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::ENOTCONN)
    });
    assert!(settled, "the dead mount never answered ENOTCONN");
}

#[test]
fn mount_after_kill9_recovers_its_own_dead_mount() {
    let mut t = TestMount::new();
    fs::write(t.mnt.join("f"), "at c1\n").unwrap();
    checkpoint(&t, "c1");
    fs::write(t.mnt.join("f"), "after c1\n").unwrap();
    t.kill_daemon();
    wait_for_dead_endpoint(&t.mnt);

    // Someone else's dead mount is not touched: another SRC and state dir at the same MNT.
    let other = TestMount::unmounted(&[]);
    let out = cli(&[
        "mount".as_ref(),
        other.src.as_os_str(),
        t.mnt.as_os_str(),
        "--state-dir".as_ref(),
        other.state.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not recognisably this mount's own"),
        "{}",
        stderr(&out)
    );
    assert!(is_mount_point(&t.mnt), "a foreign dead mount was detached");

    // The same mount again needs no manual step: the dead mount is detached, the history
    // recovered from the journal.
    let out = cli(&[
        "mount".as_ref(),
        t.src.as_os_str(),
        t.mnt.as_os_str(),
        "--state-dir".as_ref(),
        t.state.as_os_str(),
    ]);
    assert!(out.status.success(), "remount: {}", stderr(&out));
    assert!(
        stderr(&out).contains("detached that dead mount and mounting again"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_to_string(t.mnt.join("f")).unwrap(), "after c1\n");
    assert_eq!(
        fs::read_to_string(at(&t, "c1").join("f")).unwrap(),
        "at c1\n"
    );
    t.umount();
}

#[test]
fn a_rewind_keeps_agent_state_unless_asked() {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("main.rs"), "v1\n").unwrap();
    fs::write(m.src.join(".aider.chat.history.md"), "# turn 1\n").unwrap();
    m.mount();
    checkpoint(&m, "c1");
    // The agent's work, and what the agent writes about itself meanwhile: Claude Code's
    // granted permissions (in a new .claude/), aider's chat history.
    sh(
        &m,
        "echo v2 > main.rs && mkdir .claude && \
         echo '{\"permissions\":{\"allow\":[\"Bash(cargo test)\"]}}' > .claude/settings.local.json && \
         echo '# turn 2' >> .aider.chat.history.md",
    );
    let settings = fs::read(m.mnt.join(".claude/settings.local.json")).unwrap();
    let history = fs::read(m.mnt.join(".aider.chat.history.md")).unwrap();

    let dry = rewind(&m, "c1", &["--dry-run"]);
    assert!(
        dry.contains("would keep .claude/settings.local.json (agent state"),
        "{dry}"
    );
    assert!(
        dry.contains("would keep .claude (holds agent state"),
        "{dry}"
    );
    assert!(dry.contains("would rewrite  main.rs"), "{dry}");

    let out = rewind(&m, "c1", &[]);
    assert!(out.contains("kept .claude/settings.local.json"), "{out}");
    assert!(out.contains("kept .aider.chat.history.md"), "{out}");
    assert_eq!(fs::read_to_string(m.mnt.join("main.rs")).unwrap(), "v1\n");
    assert_eq!(
        fs::read(m.mnt.join(".claude/settings.local.json")).unwrap(),
        settings
    );
    assert_eq!(
        fs::read(m.mnt.join(".aider.chat.history.md")).unwrap(),
        history
    );

    // Naming an agent-state path rewinds it; --rewind-agent-state rewinds all of it.
    rewind(&m, "c1", &["--", ".aider.chat.history.md"]);
    assert_eq!(
        fs::read_to_string(m.mnt.join(".aider.chat.history.md")).unwrap(),
        "# turn 1\n"
    );
    assert!(m.mnt.join(".claude/settings.local.json").exists());
    rewind(&m, "c1", &["--rewind-agent-state"]);
    assert!(!m.mnt.join(".claude").exists());
    assert_eq!(
        tree_listing(&m.mnt),
        tree_listing(&at(&m, "c1")),
        "the whole tree equals c1"
    );
}

#[test]
fn install_hook_merges_into_settings_is_idempotent_and_removable() {
    let m = TestMount::new();
    let home = tempfile::tempdir().unwrap();
    let settings = home.path().join(".claude/settings.json");
    fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let theirs = serde_json::json!({
        "env": { "FOO": "1" },
        "hooks": {
            "UserPromptSubmit": [ { "hooks": [ { "type": "command", "command": "other-hook" } ] } ],
            "Stop": [ { "hooks": [ { "type": "command", "command": "say done" } ] } ]
        }
    });
    fs::write(&settings, serde_json::to_string_pretty(&theirs).unwrap()).unwrap();
    let install = |extra: &[&str]| {
        let mut args = vec!["install-hook", "claude"];
        args.extend_from_slice(extra);
        let out = Command::new(BIN)
            .args(&args)
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let first = install(&[]);
    assert!(
        first.contains("installed the checkpointfs hook in"),
        "{first}"
    );
    let after_first = fs::read_to_string(&settings).unwrap();
    let second = install(&["--user"]);
    assert!(second.contains("already installed"), "{second}");
    assert_eq!(fs::read_to_string(&settings).unwrap(), after_first);

    let v: serde_json::Value = serde_json::from_str(&after_first).unwrap();
    let groups = v["hooks"]["UserPromptSubmit"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{v}");
    assert_eq!(groups[0], theirs["hooks"]["UserPromptSubmit"][0]);
    assert_eq!(v["hooks"]["Stop"], theirs["hooks"]["Stop"]);
    assert_eq!(v["env"], theirs["env"]);
    let command = groups[1]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let expected = fs::canonicalize(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-scripts/claude-code-hook"),
    )
    .unwrap();
    assert_eq!(Path::new(&command), expected);

    // The installed command really checkpoints a prompt, as Claude Code would run it.
    let input = serde_json::json!({
        "session_id": "5e55e55e-0000-4000-8000-000000000001",
        "hook_event_name": "UserPromptSubmit",
        "cwd": m.mnt,
        "prompt": "hello",
    })
    .to_string();
    let mut child = Command::new("sh")
        .args(["-c", &command])
        .env("CHECKPOINTFS", BIN)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let ids: Vec<String> = fs::read_dir(m.mnt.join(".checkpoint/at"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(
        ids[0].starts_with("cc-") && ids[0].contains("-5e55e55e-"),
        "{ids:?}"
    );

    let removed = install(&["--remove"]);
    assert!(
        removed.contains("removed the checkpointfs hook"),
        "{removed}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(v, theirs);
    assert!(install(&["--remove"]).contains("nothing to remove"));

    // Gemini CLI, per project, with an explicit script.
    let project = tempfile::tempdir().unwrap();
    let script = project.path().join("gemini-cli-hook");
    fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let out = cli(&[
        "install-hook",
        "gemini",
        "--project",
        project.path().to_str().unwrap(),
        "--hook",
        script.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(project.path().join(".gemini/settings.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        v["hooks"]["BeforeAgent"][0]["hooks"][0]["command"],
        fs::canonicalize(&script).unwrap().to_str().unwrap()
    );

    // A settings file that is not JSON is refused and left alone.
    fs::write(&settings, "{ oops").unwrap();
    let out = Command::new(BIN)
        .args(["install-hook", "claude"])
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not valid JSON"), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(&settings).unwrap(), "{ oops");
}

/// Runs one "prompt" of a fake agent: a python3 process (the agent) that runs the real
/// Claude Code hook as Claude Code does (`sh -c HOOK`, JSON on stdin), then `cmd` through
/// `sh -c` in the mount, as an agent's Bash tool would.
fn agent_prompt(m: &TestMount, session: &str, cmd: &str) {
    let hook = Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-scripts/claude-code-hook");
    let script = r#"
import json, os, subprocess, sys
hook, session, mnt, cmd = sys.argv[1:5]
event = {"session_id": session, "cwd": mnt, "hook_event_name": "UserPromptSubmit",
         "prompt": "do it"}
r = subprocess.run(["sh", "-c", hook], input=json.dumps(event).encode(),
                   capture_output=True)
assert r.returncode == 0 and r.stderr == b"", r
subprocess.run(["sh", "-c", cmd], cwd=mnt, check=True)
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            hook.to_str().unwrap(),
            session,
            m.mnt.to_str().unwrap(),
            cmd,
        ])
        .env("CHECKPOINTFS", BIN)
        .output()
        .unwrap();
    assert!(out.status.success(), "agent {session}: {}", stderr(&out));
}

const SESSION_A: &str = "aaaaaaaa-1111-4000-8000-000000000001";
const SESSION_B: &str = "bbbbbbbb-2222-4000-8000-000000000002";

#[test]
fn two_sessions_in_one_tree_are_logged_and_rewound_separately() {
    let mut m = TestMount::unmounted(&[]);
    for f in ["a.txt", "b.txt", "user.txt", "shared.txt"] {
        fs::write(m.src.join(f), format!("{f} v0\n")).unwrap();
    }
    m.mount();
    checkpoint(&m, "start");
    agent_prompt(
        &m,
        SESSION_A,
        "echo A1 >> a.txt && mkdir adir && echo A > adir/new.txt",
    );
    agent_prompt(&m, SESSION_B, "sed -i 's/v0/B1/' b.txt");
    fs::write(m.mnt.join("user.txt"), "edited by the user\n").unwrap();
    agent_prompt(&m, SESSION_A, "echo A2 >> a.txt");

    // The log names the session of each change; --session shows only that session's.
    let mnt = m.mnt.to_str().unwrap();
    let log = cli_ok(&["log", mnt]);
    assert!(log.contains("M a.txt  (by sh; session aaaaaaaa)"), "{log}");
    assert!(log.contains("M b.txt  (by sed; session bbbbbbbb)"), "{log}");
    let only_a = cli_ok(&["log", mnt, "--session", "aaaaaaaa"]);
    assert!(
        only_a.contains("a.txt") && only_a.contains("adir/new.txt"),
        "{only_a}"
    );
    assert!(
        !only_a.contains("b.txt") && !only_a.contains("user.txt"),
        "{only_a}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&cli_ok(&["log", mnt, "--json", "--session", SESSION_B])).unwrap();
    let paths: Vec<&str> = json["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["changes"].as_array().unwrap())
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["b.txt"]);
    // diff --session: only that session's paths, with their patches.
    let diff = cli_ok(&["diff", mnt, "start", "--session", "aaaaaaaa"]);
    assert!(
        diff.contains("+A2") && diff.contains("adir/new.txt"),
        "{diff}"
    );
    assert!(
        !diff.contains("b.txt") && !diff.contains("user.txt"),
        "{diff}"
    );
    let diff_b = cli_ok(&["diff", mnt, "start", "--session", SESSION_B, "--stat"]);
    assert!(
        diff_b.contains("b.txt") && !diff_b.contains("a.txt"),
        "{diff_b}"
    );

    // Session A's rewind to `start` undoes A's work only.
    let before = tree_listing(&m.mnt);
    let out = rewind(&m, "start", &["--session", "aaaaaaaa"]);
    assert!(
        out.contains("saved current state as start:before-rewind"),
        "{out}"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("a.txt")).unwrap(),
        "a.txt v0\n"
    );
    assert!(!m.mnt.join("adir").exists());
    assert_eq!(
        fs::read_to_string(m.mnt.join("b.txt")).unwrap(),
        "b.txt B1\n"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("user.txt")).unwrap(),
        "edited by the user\n"
    );
    // ... and is undone like any rewind.
    rewind(&m, "start:before-rewind", &[]);
    assert_eq!(tree_listing(&m.mnt), before);

    // Both sessions change one file: A's rewind refuses, names the conflict, changes nothing.
    agent_prompt(&m, SESSION_A, "echo A3 >> shared.txt");
    agent_prompt(&m, SESSION_B, "echo B3 >> shared.txt");
    let before = tree_listing(&m.mnt);
    let out = cli(&["rewind", mnt, "start", "--session", SESSION_A]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        stdout(&out),
        cli_ok(&["log", mnt])
    );
    let err = stderr(&out);
    assert!(
        err.contains("shared.txt (also changed by session bbbbbbbb (sh))"),
        "{err}"
    );
    assert!(err.contains("Nothing was changed"), "{err}");
    assert_eq!(tree_listing(&m.mnt), before);
    // --force rewinds it too; B's own file stays.
    let out = rewind(&m, "start", &["--session", SESSION_A, "--force"]);
    assert!(out.contains("forced: shared.txt"), "{out}");
    assert_eq!(
        fs::read_to_string(m.mnt.join("shared.txt")).unwrap(),
        "shared.txt v0\n"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("a.txt")).unwrap(),
        "a.txt v0\n"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("b.txt")).unwrap(),
        "b.txt B1\n"
    );
}

#[test]
fn a_session_cannot_be_registered_for_another_users_process() {
    let m = TestMount::with_args(&["--allow-other"]);
    let (uid, gid) = test_user();
    // The user names root's process (pid 1, and the daemon): refused with EPERM.
    let ctl = m.mnt.join(".checkpoint/ctl");
    let daemon = m.pid().unwrap();
    let out = run_as(
        uid,
        gid,
        &[
            "bash",
            "-c",
            &format!("printf 'session evil-1 {daemon}\\n' > '{}'", ctl.display()),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Operation not permitted"),
        "{}",
        stderr(&out)
    );
    // Malformed registrations are EINVAL; a process that does not exist is ESRCH.
    for (line, errno) in [
        ("session only-id", libc::EINVAL),
        ("session bad/id 1", libc::EINVAL),
        ("session s1 notapid", libc::EINVAL),
        ("session s1 4194304999", libc::ESRCH),
    ] {
        let err = fs::OpenOptions::new()
            .write(true)
            .open(&ctl)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(errno), "{line}: {err}");
    }
}

/// One step of agent `session` without a real agent: a fresh `sh` registers itself as the
/// session's root on ctl, then runs `cmd` with builtins only, so every write and checkpoint
/// of the step is made by that very shell.
fn as_session(m: &TestMount, session: &str, cmd: &str) {
    sh(
        m,
        &format!("printf 'session {session} %s\\n' $$ > .checkpoint/ctl && {cmd}"),
    );
}

/// A checkpoint taken by `session` (as its prompt hook would, from the agent's tree).
fn session_checkpoint(m: &TestMount, session: &str, id: &str) {
    as_session(m, session, &format!("printf '{id}\\n' > .checkpoint/ctl"));
}

/// The size after a change listed in `log`, by checkpoint id and path.
fn size_after(log: &serde_json::Value, id: &str, path: &str) -> u64 {
    let c = log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {log}"));
    let ch = c["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|ch| ch["path"] == path)
        .unwrap_or_else(|| panic!("no {path} under {id} in {log}"));
    ch["after"]["size"].as_u64().unwrap()
}

#[test]
fn two_interleaved_sessions_each_list_their_work_under_their_own_prompts() {
    let mut m = TestMount::unmounted(&[]);
    for f in ["a.txt", "b.txt", "shared.txt", "user.txt"] {
        fs::write(m.src.join(f), "v0\n").unwrap();
    }
    m.mount();
    let (a, b) = (SESSION_A, SESSION_B);
    // A's prompt 1, B's prompt 1, then both work at once.
    session_checkpoint(&m, a, "A-1");
    session_checkpoint(&m, b, "B-1");
    as_session(&m, a, "echo A1 >> a.txt");
    as_session(&m, b, "echo B1 >> b.txt");
    as_session(&m, a, "echo A1 >> shared.txt");
    // A's prompt 2 while B is still on its first; the user edits a file meanwhile.
    session_checkpoint(&m, a, "A-2");
    as_session(&m, b, "echo B1 > b2.txt");
    fs::write(m.mnt.join("user.txt"), "user 1\n").unwrap();
    // B's prompt 2; both go on, B touches A's shared file.
    session_checkpoint(&m, b, "B-2");
    as_session(&m, a, "echo A2 >> a.txt");
    as_session(&m, b, "echo B2 >> shared.txt && echo B2 >> b.txt");
    // The user takes a checkpoint of their own; A is still answering prompt 2.
    checkpoint(&m, "u-1");
    as_session(&m, a, "echo A3 > a3.txt");
    fs::write(m.mnt.join("user.txt"), "user 2\n").unwrap();

    let mnt_path = m.mnt.clone();
    let read = |f: &str| fs::read_to_string(mnt_path.join(f)).unwrap();
    let mnt = mnt_path.to_str().unwrap();
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["log", mnt, "--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&cli_ok(&all)).unwrap()
    };
    let s = |x: &str| Some(x.to_string());
    let ch = |p: &str, c: &str, sess: &[&str]| {
        (
            p.to_string(),
            c.to_string(),
            sess.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    // Each session's prompt runs from its checkpoint to its own next one; the user's
    // changes go under the tree's latest checkpoint, as with one session.
    let a1 = LoggedCheckpoint {
        id: "A-1".to_string(),
        session: s(a),
        until: s("B-1"),
        session_until: s("A-2"),
        changes: vec![
            ch("a.txt", "modified", &[a]),
            ch("shared.txt", "modified", &[a]),
        ],
    };
    let b1 = LoggedCheckpoint {
        id: "B-1".to_string(),
        session: s(b),
        until: s("A-2"),
        session_until: s("B-2"),
        changes: vec![ch("b.txt", "modified", &[b]), ch("b2.txt", "added", &[b])],
    };
    let a2 = LoggedCheckpoint {
        id: "A-2".to_string(),
        session: s(a),
        until: s("B-2"),
        session_until: None,
        changes: vec![
            ch("a.txt", "modified", &[a]),
            ch("a3.txt", "added", &[a]),
            ch("user.txt", "modified", &[]),
        ],
    };
    let b2 = LoggedCheckpoint {
        id: "B-2".to_string(),
        session: s(b),
        until: s("u-1"),
        session_until: None,
        changes: vec![
            ch("b.txt", "modified", &[b]),
            ch("shared.txt", "modified", &[b]),
        ],
    };
    let u1 = LoggedCheckpoint {
        id: "u-1".to_string(),
        session: None,
        until: None,
        session_until: None,
        changes: vec![ch("user.txt", "modified", &[])],
    };
    let log = json(&[]);
    assert_eq!(log["schema"], "checkpointfs.log/3");
    assert_eq!(log["before_first"]["files_changed"], 0, "{log}");
    assert_eq!(
        logged_checkpoints(&log),
        vec![a1.clone(), b1.clone(), a2.clone(), b2.clone(), u1.clone()],
        "{log:#}"
    );
    // The ends of each span: A's a.txt after prompt 1 is as it was at A-2 ("v0 A1"), not
    // at B-1; A's shared.txt at A-2 has no B2 yet; B's shared.txt runs to now.
    assert_eq!(size_after(&log, "A-1", "a.txt"), 6);
    assert_eq!(size_after(&log, "A-1", "shared.txt"), 6);
    assert_eq!(size_after(&log, "A-2", "a.txt"), 9);
    assert_eq!(size_after(&log, "B-2", "shared.txt"), 9);
    assert_eq!(size_after(&log, "A-2", "user.txt"), 7);

    // Per session: its own checkpoints, its own changes only.
    let only_a = json(&["--session", a]);
    let mut a2_own = a2.clone();
    a2_own.changes.retain(|c| c.0 != "user.txt");
    assert_eq!(
        logged_checkpoints(&only_a),
        vec![a1.clone(), a2_own],
        "{only_a:#}"
    );
    let only_b = json(&["--session", "bbbbbbbb"]);
    assert_eq!(
        logged_checkpoints(&only_b),
        vec![b1.clone(), b2.clone()],
        "{only_b:#}"
    );

    // A session that did nothing here is told so, not "no checkpoints yet".
    let none = cli_ok(&["log", mnt, "--session", "cccccccc"]);
    assert_eq!(
        none,
        "session cccccccc: no checkpoint and no change of it is recorded (a session is named \
         by its full id or 8 or more leading characters, as the log shows it)\n"
    );
    assert_eq!(
        logged_checkpoints(&json(&["--session", "cccccccc"])),
        [],
        "the JSON is the empty log"
    );

    // The text shows each checkpoint's session, and "(up to now)" where its changes do.
    let text = cli_ok(&["log", mnt]);
    let headers: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with(' '))
        .map(|l| {
            let mut w = l.split("  ");
            let id = w.next().unwrap();
            let _time = w.next().unwrap();
            let rest: Vec<&str> = w.collect();
            format!("{id} {}", rest.join(" "))
        })
        .collect();
    assert_eq!(
        headers,
        [
            "A-1 session aaaaaaaa",
            "B-1 session bbbbbbbb",
            "A-2 session aaaaaaaa (up to now)",
            "B-2 session bbbbbbbb (up to now)",
            "u-1 (up to now)",
        ],
        "{text}"
    );
    assert!(
        text.contains("A-1  ")
            && text.contains(
                "session aaaaaaaa\n    M a.txt  (by sh; session aaaaaaaa)\n    M shared.txt  (by sh; session aaaaaaaa)\n"
            ),
        "{text}"
    );

    // diff and rewind --session are by time, whoever's checkpoint: A changed a.txt, a3.txt
    // and shared.txt since A-1; B changed shared.txt after it too.
    let diff = cli_ok(&["diff", mnt, "A-1", "--session", a, "--stat"]);
    for p in ["a.txt", "a3.txt", "shared.txt"] {
        assert!(diff.contains(&format!(" {p} ")), "{diff}");
    }
    assert!(
        !diff.contains("b.txt") && !diff.contains("user.txt"),
        "{diff}"
    );
    let before = tree_listing(&m.mnt);
    let out = cli(&["rewind", mnt, "A-1", "--session", "aaaaaaaa"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert_eq!(tree_listing(&m.mnt), before);
    // The refusal suggests runnable commands: the real mount, the id, --session.
    let own = format!("checkpointfs rewind {mnt} A-1 --session aaaaaaaa -- a.txt a3.txt");
    let forced = format!("checkpointfs rewind {mnt} A-1 --session aaaaaaaa --force");
    assert!(err.contains(&format!("\n  {own}\n")), "{err}");
    assert!(err.ends_with(&format!("\n  {forced}\n")), "{err}");
    assert!(!err.contains("MNT"), "{err}");
    // Session A runs the first suggestion as printed (the CLI in A's tree, over the control
    // socket): A's own files go back, shared.txt stays.
    let bin_dir = Path::new(BIN).parent().unwrap();
    as_session(&m, a, &format!("PATH={}:$PATH {own}", bin_dir.display()));
    assert_eq!(read("a.txt"), "v0\n");
    assert!(!m.mnt.join("a3.txt").exists());
    assert_eq!(read("shared.txt"), "v0\nA1\nB2\n");
    assert_eq!(read("b.txt"), "v0\nB1\nB2\n");
    // Undone by the user.
    rewind(&m, "A-1:before-rewind", &[]);
    assert_eq!(tree_listing(&m.mnt), before);

    // The saved state is a checkpoint of A (who asked for the rewind), so A's prompt 2 now
    // ends there; the undo's is the user's. The rewinds' own changes are nobody's work.
    let log = json(&[]);
    let all = logged_checkpoints(&log);
    let ids: Vec<(&str, Option<&str>)> = all
        .iter()
        .map(|c| (c.id.as_str(), c.session.as_deref()))
        .collect();
    assert_eq!(
        ids,
        [
            ("A-1", Some(a)),
            ("B-1", Some(b)),
            ("A-2", Some(a)),
            ("B-2", Some(b)),
            ("u-1", None),
            ("A-1:before-rewind", Some(a)),
            ("A-1:before-rewind:before-rewind", None),
        ],
        "{log:#}"
    );
    let a2_ended = LoggedCheckpoint {
        session_until: s("A-1:before-rewind"),
        ..a2
    };
    assert_eq!(all[..4], [a1, b1, a2_ended, b2][..], "{log:#}");
    assert_eq!(all[4].until, s("A-1:before-rewind"));

    // Sessions of checkpoints survive a remount (replay): the same log.
    m.remount();
    assert_eq!(json(&[]), log);
}
