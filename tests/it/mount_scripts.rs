//! The scripts in mount-scripts/, run for real: `with-checkpoints` (mount, run, unmount,
//! exit status, signals), the Claude Code hook (inside and outside a mount, bad input),
//! `checkpointed`, `checkpoint-now`, the mount(8) helper (directly, through
//! `mount -t fuse.checkpointfs`, and through an fstab line) and the systemd unit's command
//! lines. Every mount is unmounted on every path: by [`TestMount`]'s drop, or by
//! [`RootGuard`] for mounts the scripts make themselves.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{
    BIN, TestMount, cli, is_mount_point, mounts, mounts_under, stderr, stdout, wait_until,
};

fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-scripts")
}

fn script(name: &str) -> PathBuf {
    scripts_dir().join(name)
}

/// Runs `cmd args` in `cwd` with `env` added (and CHECKPOINTFS set to the binary under
/// test), feeding `stdin`; killed after 120 s.
fn run_with(cmd: &Path, args: &[&str], cwd: &Path, env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut c = Command::new("timeout");
    c.arg("120")
        .arg(cmd)
        .args(args)
        .current_dir(cwd)
        .env("CHECKPOINTFS", BIN);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut pipe = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = pipe.write_all(&data);
    });
    let out = child.wait_with_output().expect("wait");
    feeder.join().unwrap();
    out
}

fn run_script(name: &str, args: &[&str], cwd: &Path) -> Output {
    run_with(&script(name), args, cwd, &[], b"")
}

/// Lazily unmounts anything still mounted below a directory when dropped — for the mounts
/// the scripts make on their own (they should have unmounted them: the tests assert that).
struct RootGuard(PathBuf);

impl Drop for RootGuard {
    fn drop(&mut self) {
        for (p, _) in mounts_under(&self.0).into_iter().rev() {
            let _ = Command::new(BIN)
                .arg("umount")
                .arg(&p)
                .arg("--timeout")
                .arg("10")
                .output();
            if is_mount_point(&p) {
                let _ = Command::new("umount").arg("-l").arg(&p).output();
            }
        }
    }
}

fn assert_nothing_mounted_under(dir: &Path) {
    let left = mounts_under(dir);
    assert!(left.is_empty(), "still mounted below {dir:?}: {left:?}");
}

/// Checkpoint ids listed under MNT/.checkpoint/at/, sorted.
fn checkpoints(mnt: &Path) -> Vec<String> {
    let mut ids: Vec<String> = fs::read_dir(mnt.join(".checkpoint/at"))
        .expect("read .checkpoint/at")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn every_script_has_help_and_shares_one_common_block() {
    for name in [
        "with-checkpoints",
        "claude-code-hook",
        "gemini-cli-hook",
        "checkpointed",
        "checkpoint-now",
        "mount.fuse.checkpointfs",
    ] {
        let out = run_script(name, &["--help"], Path::new("/"));
        assert!(out.status.success(), "{name} --help: {}", stderr(&out));
        assert!(
            stdout(&out).starts_with("usage: "),
            "{name} --help: {}",
            stdout(&out)
        );
        let mode = fs::metadata(script(name)).unwrap().permissions().mode();
        assert!(mode & 0o111 != 0, "{name} is not executable");
    }
    let block = |name: &str| {
        let text = fs::read_to_string(script(name)).unwrap();
        let start = text.find("# --- BEGIN common").expect("BEGIN common");
        let end = text.find("# --- END common ---").expect("END common");
        text[start..end].to_string()
    };
    // The hooks are wrappers of `checkpointfs hook` now: the scripts that still share the
    // block are these two.
    assert_eq!(
        block("checkpoint-now"),
        block("checkpointed"),
        "checkpoint-now's common block differs from checkpointed's"
    );
    let settings: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(script("claude-code-settings.json")).unwrap())
            .expect("claude-code-settings.json is JSON");
    let hook = &settings["hooks"]["UserPromptSubmit"][0]["hooks"][0];
    assert_eq!(hook["type"], "command");
    assert!(
        hook["command"]
            .as_str()
            .unwrap()
            .ends_with("/mount-scripts/claude-code-hook")
    );
}

/// with-checkpoints --respect-gitignore: what git ignores is not backed up, and the setting
/// is saved in the state dir.
#[test]
fn with_checkpoints_passes_respect_gitignore() {
    let m = TestMount::unmounted(&[]);
    let _guard = RootGuard(m.root());
    fs::write(m.src.join(".gitignore"), "*.log\n").unwrap();
    let out = run_with(
        &script("with-checkpoints"),
        &[
            "--state-dir",
            m.state.to_str().unwrap(),
            "--respect-gitignore",
            m.src.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo l > a.log && echo t > a.txt",
        ],
        Path::new("/"),
        &[],
        b"",
    );
    assert!(out.status.success(), "with-checkpoints: {}", stderr(&out));
    assert_nothing_mounted_under(&m.root());
    let transcript = fs::read_to_string(m.state.join("transcript.jsonl")).unwrap();
    assert!(transcript.contains("\"a.txt\":"), "{transcript}");
    assert!(!transcript.contains("a.log"), "{transcript}");
    let settings = fs::read_to_string(m.state.join("settings.json")).unwrap();
    assert!(
        settings.contains("\"respect_gitignore\": true"),
        "{settings}"
    );
}

/// with-checkpoints around an edit that checkpoints first: nothing stays mounted, the
/// status passes through, and a later mount of the same state dir rewinds the edit.
#[test]
fn with_checkpoints_runs_unmounts_and_the_edit_can_be_rewound() {
    let mut m = TestMount::unmounted(&[]);
    let root = m.root();
    let _guard = RootGuard(root.clone());
    let a: Vec<u8> = b"alpha\n".iter().copied().chain(0u8..=255).collect();
    fs::write(m.src.join("a.txt"), &a).unwrap();
    fs::write(m.src.join("b.txt"), "bravo\n").unwrap();
    fs::create_dir(m.src.join("sub")).unwrap();
    let before = common::tree_listing(&m.src);

    // A mount point with a space: the scripts must undo mountinfo's \040.
    let spaced = root.join("with space");
    let scripts = scripts_dir();
    let edit = "\"$SCRIPTS/checkpoint-now\" start && pwd && echo edited > ../a.txt && rm ../b.txt";
    let out = run_with(
        &script("with-checkpoints"),
        &[
            "--mnt",
            spaced.to_str().unwrap(),
            "--state-dir",
            m.state.to_str().unwrap(),
            m.src.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            edit,
        ],
        &m.src.join("sub"),
        &[("SCRIPTS", scripts.to_str().unwrap())],
        b"",
    );
    assert!(out.status.success(), "with-checkpoints: {}", stderr(&out));
    // checkpoint-now printed the id; the command ran in the mount's copy of the caller's cwd.
    assert_eq!(
        stdout(&out),
        format!("start\n{}\n", spaced.join("sub").display())
    );
    assert_nothing_mounted_under(&root);
    assert!(!spaced.exists(), "--mnt dir it created was not removed");
    assert_eq!(fs::read_to_string(m.src.join("a.txt")).unwrap(), "edited\n");
    assert!(!m.src.join("b.txt").exists());

    // A failing command: its status comes back; from outside SRC it runs at the mount root.
    let tmp = root.join("tmp");
    fs::create_dir(&tmp).unwrap();
    let out = run_with(
        &script("with-checkpoints"),
        &[
            "--state-dir",
            m.state.to_str().unwrap(),
            m.src.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "pwd; ls; exit 3",
        ],
        Path::new("/"),
        &[("XDG_RUNTIME_DIR", tmp.to_str().unwrap())],
        b"",
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", stderr(&out));
    let lines: Vec<String> = stdout(&out).lines().map(String::from).collect();
    assert_eq!(
        lines[0],
        stable_mountpoint(&tmp, &m.src).display().to_string()
    );
    assert_eq!(&lines[1..], ["a.txt", "sub"]);
    assert_nothing_mounted_under(&root);
    assert!(
        !stable_mountpoint(&tmp, &m.src).exists(),
        "mount point left behind"
    );

    // Bad usage and a command that does not exist.
    let out = run_script(
        "with-checkpoints",
        &[m.src.to_str().unwrap(), "true"],
        Path::new("/"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("expected -- after SRC"),
        "{}",
        stderr(&out)
    );
    let out = run_with(
        &script("with-checkpoints"),
        &[
            "--state-dir",
            m.state.to_str().unwrap(),
            m.src.to_str().unwrap(),
            "--",
            "/nonexistent/cmd",
        ],
        Path::new("/"),
        &[("XDG_RUNTIME_DIR", tmp.to_str().unwrap())],
        b"",
    );
    assert_eq!(out.status.code(), Some(127), "stderr: {}", stderr(&out));
    assert_nothing_mounted_under(&root);

    // Mount the same state dir again: the checkpoint is there, and rewinding restores it.
    m.mount();
    assert!(checkpoints(&m.mnt).contains(&"start".to_string()));
    let out = cli(&["rewind", m.mnt.to_str().unwrap(), "start"]);
    assert!(out.status.success(), "rewind: {}", stderr(&out));
    assert_eq!(fs::read(m.mnt.join("a.txt")).unwrap(), a);
    assert_eq!(fs::read_to_string(m.mnt.join("b.txt")).unwrap(), "bravo\n");
    assert_eq!(common::tree_listing(&m.mnt), before);
    m.umount();
}

/// with-checkpoints' default mount point: $XDG_RUNTIME_DIR/checkpointfs/<name>-<16 hex of
/// sha256(SRC)>.
fn stable_mountpoint(xdg_runtime_dir: &Path, src: &Path) -> PathBuf {
    use sha2::{Digest, Sha256};
    let src = fs::canonicalize(src).unwrap();
    let hex = base16ct::lower::encode_string(&Sha256::digest(src.as_os_str().as_encoded_bytes()));
    xdg_runtime_dir.join("checkpointfs").join(format!(
        "{}-{}",
        src.file_name().unwrap().to_string_lossy(),
        &hex[..16]
    ))
}

/// Agents that key sessions by their cwd (`claude --continue`, folder trust) need the same
/// mount point every run; a second run while the first is live joins its mount; a base
/// directory someone else could have planted is refused.
#[test]
fn with_checkpoints_mounts_at_one_stable_path_and_joins_a_live_mount() {
    let m = TestMount::unmounted(&[]);
    let root = m.root();
    let _guard = RootGuard(root.clone());
    let xdg = root.join("xdg");
    fs::create_dir(&xdg).unwrap();
    fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
    let env = [("XDG_RUNTIME_DIR", xdg.to_str().unwrap())];
    let expected = stable_mountpoint(&xdg, &m.src);
    let state = m.state.to_str().unwrap();
    let src = m.src.to_str().unwrap();
    let run = |cmd: &str| {
        run_with(
            &script("with-checkpoints"),
            &["--state-dir", state, src, "--", "sh", "-c", cmd],
            Path::new("/"),
            &env,
            b"",
        )
    };
    for round in 1..=2 {
        let out = run("echo \"$CHECKPOINTFS_MNT\"; pwd");
        assert!(out.status.success(), "run {round}: {}", stderr(&out));
        let p = expected.display().to_string();
        assert_eq!(stdout(&out), format!("{p}\n{p}\n"), "run {round}");
        assert_nothing_mounted_under(&root);
    }

    // A live run holds the mount (it waits on a fifo); a second run joins it and leaves it
    // mounted; the first unmounts when it ends.
    let sync = root.join("sync");
    fs::create_dir(&sync).unwrap();
    let fifo = sync.join("go");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let first_cmd = format!(
        "echo ready > '{0}/ready' && read line < '{0}/go' && cat from-second.txt",
        sync.display()
    );
    let first = Command::new(script("with-checkpoints"))
        .args(["--state-dir", state, src, "--", "sh", "-c", &first_cmd])
        .env("CHECKPOINTFS", BIN)
        .env("XDG_RUNTIME_DIR", &xdg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || sync.join("ready").exists()),
        "the first run never started its command"
    );
    let out = run("echo second > from-second.txt; pwd");
    assert!(out.status.success(), "second run: {}", stderr(&out));
    assert!(
        stderr(&out).contains("already mounted at"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), format!("{}\n", expected.display()));
    assert!(
        is_mount_point(&expected),
        "the joining run unmounted the live mount"
    );
    fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .unwrap()
        .write_all(b"go\n")
        .unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "first run: {}", stderr(&out));
    assert_eq!(stdout(&out), "second\n");
    assert_nothing_mounted_under(&root);
    assert_eq!(
        fs::read_to_string(m.src.join("from-second.txt")).unwrap(),
        "second\n"
    );

    // A base directory that is a symlink (planted in a shared directory) is refused.
    let planted = root.join("planted");
    fs::create_dir(&planted).unwrap();
    let xdg2 = root.join("xdg2");
    fs::create_dir(&xdg2).unwrap();
    std::os::unix::fs::symlink(&planted, xdg2.join("checkpointfs")).unwrap();
    let out = run_with(
        &script("with-checkpoints"),
        &["--state-dir", state, src, "--", "true"],
        Path::new("/"),
        &[("XDG_RUNTIME_DIR", xdg2.to_str().unwrap())],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is a symlink"), "{}", stderr(&out));
    assert_eq!(fs::read_dir(&planted).unwrap().count(), 0);
    assert_nothing_mounted_under(&root);
}

/// SIGTERM to with-checkpoints: passed on to the command (killed after the grace period if
/// it ignores it), then everything is unmounted; the exit status is 128+15.
#[test]
fn with_checkpoints_unmounts_on_a_signal() {
    let m = TestMount::unmounted(&[]);
    let root = m.root();
    let _guard = RootGuard(root.clone());
    // Each command says it is running (its traps set) by creating `ready`.
    let ready = root.join("ready");
    let r = ready.to_str().unwrap();
    // A child that outlives the signal keeps the mount busy; each command's sleeps carry a
    // duration no other process uses, so survivors can be found (and are killed on failure).
    let marker = "61.25";
    for (cmd, min, max) in [
        (format!(": > {r}; sleep {marker}"), 0.0, 8.0),
        // Forks without pause: a child forked between the script's look at the process
        // tree and its kill must get the signal too.
        (
            format!(": > {r}; while :; do sleep {marker} & done"),
            0.0,
            8.0,
        ),
        // Ignores SIGTERM: killed (with its children) after CHECKPOINTFS_GRACE=2 s.
        (
            format!("trap '' TERM; : > {r}; while :; do sleep 0.1; done"),
            1.5,
            10.0,
        ),
    ] {
        let _ = fs::remove_file(&ready);
        let cmd = cmd.as_str();
        let mut child = Command::new(script("with-checkpoints"))
            .args([
                "--mnt",
                m.mnt.to_str().unwrap(),
                "--state-dir",
                m.state.to_str().unwrap(),
            ])
            .arg(&m.src)
            .args(["--", "sh", "-c", cmd])
            .env("CHECKPOINTFS", BIN)
            .env("CHECKPOINTFS_GRACE", "2")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let _kill = KillOnDrop(Some(child.id() as i32));
        assert!(
            wait_until(Duration::from_secs(20), || is_mount_point(&m.mnt)
                && ready.exists()),
            "never mounted, or the command never started"
        );
        let t = Instant::now();
        // SAFETY: kill(2) takes plain integers; `child` is ours and not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        let took = t.elapsed().as_secs_f64();
        let survivors = kill_processes_with_args(&["sleep", marker]);
        assert_eq!(survivors, 0, "{cmd}: processes outlived the signal");
        assert_eq!(status.code(), Some(143), "{cmd}: {status:?}");
        assert!(took >= min && took < max, "{cmd}: took {took:.1}s");
        assert_nothing_mounted_under(&root);
    }
}

/// SIGKILLs every process whose command line is exactly `args`; returns how many there were.
fn kill_processes_with_args(args: &[&str]) -> usize {
    let want: Vec<u8> = args
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let mut killed = 0;
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if fs::read(entry.path().join("cmdline")).is_ok_and(|c| c == want) {
            // SAFETY: kill(2) takes plain integers; the process runs this test's command line.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed += 1;
        }
    }
    killed
}

/// Kills a process (SIGKILL) when dropped, if still set.
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0
            && common::process_alive(pid)
        {
            // SAFETY: kill(2) takes plain integers; `pid` is the process this guard started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

fn hook_input(session: &str, cwd: &Path) -> Vec<u8> {
    serde_json::json!({
        "session_id": session,
        "transcript_path": format!("/root/.claude/projects/x/{session}.jsonl"),
        "cwd": cwd,
        "hook_event_name": "UserPromptSubmit",
        "prompt": "Fix the \"parser\" bug,\nthen run the tests",
    })
    .to_string()
    .into_bytes()
}

/// A PATH with the basic tools but neither jq nor python3, for the hook's last-resort parser.
fn minimal_path(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    for tool in [
        "bash", "cat", "tr", "sed", "grep", "awk", "timeout", "realpath", "date", "cut", "mkdir",
    ] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output()
            .unwrap();
        let path = String::from_utf8(out.stdout).unwrap();
        std::os::unix::fs::symlink(path.trim(), bin.join(tool)).unwrap();
    }
    bin
}

#[test]
fn claude_code_hook_checkpoints_each_prompt_and_never_fails() {
    let m = TestMount::new();
    let hook = script("claude-code-hook");
    fs::create_dir(m.mnt.join("sub")).unwrap();
    let session = "0b5c9e1e-4f4a-4f8e-9a57-1d0c6a6a2f10";

    let mut ids = Vec::new();
    for _ in 0..2 {
        // The hook's own cwd is elsewhere: it must go by the JSON's cwd.
        let out = run_with(
            &hook,
            &[],
            Path::new("/"),
            &[],
            &hook_input(session, &m.mnt.join("sub")),
        );
        assert!(out.status.success(), "hook: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "stdout would be added to the prompt");
        assert_eq!(stderr(&out), "");
        let now = checkpoints(&m.mnt);
        let new: Vec<&String> = now.iter().filter(|id| !ids.contains(*id)).collect();
        assert_eq!(new.len(), 1, "one new checkpoint per prompt: {now:?}");
        ids.push(new[0].clone());
    }
    let re_ok = |id: &str| {
        let p: Vec<&str> = id.split('-').collect();
        p.len() == 4
            && p[0] == "cc"
            && p[1].len() == 16
            && p[1].ends_with('Z')
            && p[2] == "0b5c9e1e"
    };
    assert!(ids.iter().all(|id| re_ok(id)), "{ids:?}");
    assert!(
        ids[0].ends_with("-0001") && ids[1].ends_with("-0002"),
        "{ids:?}"
    );
    assert!(ids[0] < ids[1], "ids sort in prompt order: {ids:?}");

    // Without jq and python3 the fallback parser still finds cwd and the session.
    let tmp = tempfile::tempdir().unwrap();
    let path = minimal_path(tmp.path());
    let out = run_with(
        &hook,
        &[],
        Path::new("/"),
        &[("PATH", path.to_str().unwrap())],
        &hook_input("feedbeef99", &m.mnt),
    );
    assert!(out.status.success(), "hook: {}", stderr(&out));
    assert_eq!(stderr(&out), "");
    assert!(
        checkpoints(&m.mnt)
            .iter()
            .any(|id| id.starts_with("cc-") && id.ends_with("-feedbeef-0001"))
    );
    let count = checkpoints(&m.mnt).len();

    // Outside any mount: exit 0, a note, nothing created.
    let outside = tmp.path().join("project");
    fs::create_dir(&outside).unwrap();
    let out = run_with(&hook, &[], &outside, &[], &hook_input(session, &outside));
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("not inside a checkpointfs mount"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(checkpoints(&m.mnt).len(), count);

    // Malformed or empty input: still exit 0, nothing on stdout.
    for input in [
        &b"{\"session_id\": \"x\", \"cwd\": "[..],
        b"",
        b"\xff\xfe not json",
    ] {
        let out = run_with(&hook, &[], &outside, &[], input);
        assert!(out.status.success(), "input {input:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "");
        assert!(!stderr(&out).is_empty(), "a note on stderr for {input:?}");
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(checkpoints(&m.mnt).len(), count);

    // A failed checkpoint (the mount's daemon is gone) is a note, not a failure.
    drop(m);
}

#[test]
fn checkpointed_takes_a_checkpoint_before_the_command() {
    let m = TestMount::new();
    let run = script("checkpointed");
    let out = run_with(&run, &["--", "sh", "-c", "echo x > f"], &m.mnt, &[], b"");
    assert!(out.status.success(), "checkpointed: {}", stderr(&out));
    assert_eq!(fs::read_to_string(m.mnt.join("f")).unwrap(), "x\n");
    let ids = checkpoints(&m.mnt);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(ids[0].starts_with("sh-"), "{ids:?}");
    assert!(
        stderr(&out).contains(&ids[0]),
        "the id is shown: {}",
        stderr(&out)
    );
    let view = m.mnt.join(".checkpoint/at").join(&ids[0]);
    assert!(view.is_dir());
    assert!(
        !view.join("f").exists(),
        "the view at the checkpoint has no f"
    );

    // A prefix, the command's status, and checkpoint-now next to it.
    let out = run_with(
        &run,
        &[
            "--id-prefix",
            "agent",
            "--",
            "sh",
            "-c",
            "echo y >> f; exit 5",
        ],
        &m.mnt,
        &[],
        b"",
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let agent: Vec<String> = checkpoints(&m.mnt)
        .into_iter()
        .filter(|i| i.starts_with("agent-"))
        .collect();
    assert_eq!(agent.len(), 1);
    assert_eq!(
        fs::read_to_string(m.mnt.join(".checkpoint/at").join(&agent[0]).join("f")).unwrap(),
        "x\n"
    );
    let out = run_script("checkpoint-now", &["mine"], &m.mnt);
    assert!(out.status.success());
    assert_eq!(stdout(&out), "mine\n");
    let out = run_script("checkpoint-now", &["mine"], &m.mnt);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    let out = run_script("checkpoint-now", &["bad id"], &m.mnt);
    assert_eq!(out.status.code(), Some(2));
    let out = run_script("checkpoint-now", &[], &m.mnt);
    assert!(out.status.success());
    assert!(stdout(&out).starts_with("manual-"));
    let out = run_script("checkpoint-now", &[], Path::new("/"));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not inside a checkpointfs mount"));

    // Outside a mount: a warning, and the command runs anyway — unless --strict.
    let tmp = tempfile::tempdir().unwrap();
    let out = run_with(&run, &["--", "sh", "-c", "echo ran"], tmp.path(), &[], b"");
    assert!(out.status.success());
    assert_eq!(stdout(&out), "ran\n");
    assert!(stderr(&out).contains("warning"), "{}", stderr(&out));
    let out = run_with(
        &run,
        &["--strict", "--", "sh", "-c", "echo ran"],
        tmp.path(),
        &[],
        b"",
    );
    assert_eq!(out.status.code(), Some(75));
    assert_eq!(stdout(&out), "");
}

fn dry_run(opts: &str) -> Output {
    run_script(
        "mount.fuse.checkpointfs",
        &["--dry-run", "/p/src", "/p/mnt", "-o", opts],
        Path::new("/"),
    )
}

#[test]
fn mount_helper_translates_exclusion_options() {
    let out = dry_run(
        "state_dir=/s,respect_gitignore,exclude_from=/etc/cpfs-excludes,exclude_from=/x,exclude=target",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "{BIN} mount /p/src /p/mnt --state-dir /s --respect-gitignore --exclude-from /etc/cpfs-excludes --exclude-from /x --exclude target -o dev\\,suid\n"
        )
    );
    let out = dry_run("no_respect_gitignore");
    assert_eq!(
        stdout(&out),
        format!("{BIN} mount /p/src /p/mnt --no-respect-gitignore -o dev\\,suid\n")
    );
    let out = dry_run("exclude_from=");
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("needs a value"), "{}", stderr(&out));
}

#[test]
fn mount_helper_translates_options() {
    let out = dry_run(
        "rw,defaults,state_dir=/var/lib/checkpointfs/p,exclude=target,exclude=*.o,nofail,noauto,user,_netdev,x-systemd.automount,allow_other,no_passthrough,threads=3",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "{BIN} mount /p/src /p/mnt --state-dir /var/lib/checkpointfs/p --exclude target --exclude \\*.o --allow-other --no-passthrough --threads 3 -o dev\\,suid\\,rw\n"
        )
    );
    // Kernel options become one `-o` list, in order (the binary lets a later one win), after
    // the defaults a local filesystem mounted by root has (dev,suid).
    let out = dry_run("ro,state_dir=/s,noatime,nodev,dev,suid,noexec,strictatime,nodiratime,rw");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "{BIN} mount /p/src /p/mnt --state-dir /s -o dev\\,suid\\,ro\\,noatime\\,nodev\\,dev\\,suid\\,noexec\\,strictatime\\,nodiratime\\,rw\n"
        )
    );
    // A remount (as mount(8) runs it: the mount's current options merged with the new ones)
    // changes only the kernel flags, with `mount -i`; FUSE's and our options are ignored.
    let out = dry_run(
        "ro,nosuid,nodev,noexec,relatime,remount,user_id=0,group_id=0,default_permissions,state_dir=/s",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "mount -i -o remount\\,ro\\,nosuid\\,nodev\\,noexec\\,relatime /p/mnt\n"
    );
    for (opts, msg) in [
        ("state_dir=/s,bogus", "unknown option 'bogus'"),
        ("sync", "option 'sync' is not supported"),
        ("state_dir=", "needs a value"),
        ("noexec,user_id=0", "unknown option 'user_id=0'"),
    ] {
        let out = dry_run(opts);
        assert_eq!(out.status.code(), Some(1), "{opts}");
        assert_eq!(stdout(&out), "", "{opts}: nothing run");
        assert!(stderr(&out).contains(msg), "{opts}: {}", stderr(&out));
    }
    // -s (sloppy) ignores what it does not know; -f (fake) does nothing; mount(8)'s -t.
    let out = run_script(
        "mount.fuse.checkpointfs",
        &[
            "--dry-run",
            "/p/src",
            "/p/mnt",
            "-s",
            "-o",
            "bogus,state_dir=/s",
            "-t",
            "fuse.checkpointfs",
        ],
        Path::new("/"),
    );
    assert!(out.status.success());
    assert!(stderr(&out).contains("ignoring unsupported option 'bogus'"));
    assert!(stdout(&out).ends_with(" mount /p/src /p/mnt --state-dir /s -o dev\\,suid\n"));
    let out = run_script(
        "mount.fuse.checkpointfs",
        &["/nonexistent", "/nonexistent", "-f", "-o", "rw"],
        Path::new("/"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_script("mount.fuse.checkpointfs", &["/p/src"], Path::new("/"));
    assert_eq!(out.status.code(), Some(2));
}

/// Runs this thread, and what it spawns, in a private mount namespace where
/// `/sbin/mount.fuse.checkpointfs` is this tree's helper: mount(8) finds helpers in /sbin
/// only, and whatever the host has installed there is not ours to replace. /sbin is
/// overlaid on a tmpfs in that namespace only. Mounts made meanwhile stay in it too
/// (propagation slave), so dropping the guard unmounts `mnt` there before the thread goes
/// back to the host's namespace.
struct PrivateSbinHelper {
    host_ns: fs::File,
    mnt: PathBuf,
    _scratch: tempfile::TempDir,
}

impl PrivateSbinHelper {
    fn install(mnt: &Path) -> Self {
        let host_ns = fs::File::open("/proc/thread-self/ns/mnt").unwrap();
        let scratch = tempfile::tempdir().unwrap();
        // SAFETY: plain syscall; CLONE_NEWNS moves only the calling thread (it implies
        // CLONE_FS, which unshare gives this thread its own copy of).
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
        assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
        let guard = PrivateSbinHelper {
            host_ns,
            mnt: mnt.to_path_buf(),
            _scratch: scratch,
        };
        sys_mount(
            "none",
            Path::new("/"),
            "",
            libc::MS_REC | libc::MS_SLAVE,
            "",
        );
        let scratch = guard._scratch.path();
        sys_mount("tmpfs", scratch, "tmpfs", 0, "mode=0700");
        for d in ["upper", "work"] {
            fs::create_dir(scratch.join(d)).unwrap();
        }
        let sbin = fs::canonicalize("/sbin").unwrap();
        let layers = format!(
            "lowerdir={},upperdir={},workdir={}",
            sbin.display(),
            scratch.join("upper").display(),
            scratch.join("work").display()
        );
        sys_mount("overlay", &sbin, "overlay", 0, &layers);
        let helper = sbin.join("mount.fuse.checkpointfs");
        let _ = fs::remove_file(&helper);
        fs::copy(script("mount.fuse.checkpointfs"), &helper).unwrap();
        fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
        guard
    }
}

impl Drop for PrivateSbinHelper {
    fn drop(&mut self) {
        if is_mount_point(&self.mnt) {
            let _ = cli(&["umount".as_ref(), self.mnt.as_os_str()]);
        }
        if is_mount_point(&self.mnt) {
            let path = std::ffi::CString::new(self.mnt.as_os_str().as_bytes()).unwrap();
            // SAFETY: `path` is a valid NUL-terminated string for the call's duration.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        // SAFETY: `host_ns` is an open mount-namespace fd; only this thread moves.
        let rc = unsafe { libc::setns(self.host_ns.as_raw_fd(), libc::CLONE_NEWNS) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

/// mount(2), panicking with the error.
fn sys_mount(source: &str, target: &Path, fstype: &str, flags: libc::c_ulong, data: &str) {
    let c = |s: &[u8]| std::ffi::CString::new(s).unwrap();
    let (source, target, fstype, data) = (
        c(source.as_bytes()),
        c(target.as_os_str().as_bytes()),
        c(fstype.as_bytes()),
        c(data.as_bytes()),
    );
    // SAFETY: every pointer is a valid NUL-terminated string for the call's duration.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(
        rc,
        0,
        "mount {target:?}: {}",
        std::io::Error::last_os_error()
    );
}

fn fstype_of(mnt: &Path) -> Option<String> {
    mounts()
        .into_iter()
        .rev()
        .find(|(p, _)| p == mnt)
        .map(|(_, t)| t)
}

/// The kernel's per-mount options of `mnt` (field 6 of this thread's mountinfo).
fn mount_flags_of(mnt: &Path) -> Vec<String> {
    let info = fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    info.lines()
        .rev()
        .map(|l| l.split(' ').collect::<Vec<_>>())
        .find(|f| f.len() > 5 && Path::new(f[4]) == mnt)
        .map(|f| f[5].split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

fn umount_cli(mnt: &Path) {
    let out = cli(&["umount".as_ref(), mnt.as_os_str()]);
    assert!(out.status.success(), "umount: {}", stderr(&out));
    assert!(!is_mount_point(mnt));
}

#[test]
fn mount_helper_mounts_directly_via_mount_8_and_via_fstab() {
    let m = TestMount::unmounted(&[]);
    fs::write(m.src.join("hello"), "hi\n").unwrap();
    let state = m.state.to_str().unwrap().to_string();

    // 1. Installed into a directory and called the way mount(8) calls it.
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("mount.fuse.checkpointfs");
    fs::copy(script("mount.fuse.checkpointfs"), &helper).unwrap();
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    let opts = format!("rw,state_dir={state},nofail,exclude=*.o");
    let out = run_with(
        &helper,
        &[
            m.src.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
            "-o",
            &opts,
        ],
        Path::new("/"),
        &[],
        b"",
    );
    assert!(out.status.success(), "helper: {}", stderr(&out));
    assert_eq!(fstype_of(&m.mnt).as_deref(), Some("fuse.checkpointfs"));
    assert_eq!(fs::read_to_string(m.mnt.join("hello")).unwrap(), "hi\n");
    assert_eq!(
        fs::read_to_string(m.mnt.join(".checkpoint/state-dir"))
            .unwrap()
            .trim_end(),
        state
    );
    let out = cli(&["status", m.mnt.to_str().unwrap(), "--path", "x.o"]);
    assert!(
        stdout(&out).contains("exclu"),
        "exclude=*.o reached the mount: {}",
        stdout(&out)
    );
    umount_cli(&m.mnt);

    // 2. Through mount(8), which runs /sbin/mount.fuse.checkpointfs.
    let _helper = PrivateSbinHelper::install(&m.mnt);
    let out = run_with(
        Path::new("mount"),
        &[
            "-t",
            "fuse.checkpointfs",
            m.src.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
            "-o",
            &format!("state_dir={state}"),
        ],
        Path::new("/"),
        &[],
        b"",
    );
    assert!(
        out.status.success(),
        "mount -t fuse.checkpointfs: {}",
        stderr(&out)
    );
    assert_eq!(fstype_of(&m.mnt).as_deref(), Some("fuse.checkpointfs"));
    // Mounted by root through mount(8): dev and suid, as a local filesystem (xfstests
    // generic/184, 306, 434 open device nodes made in the tree).
    let flags = mount_flags_of(&m.mnt);
    assert!(
        !flags.iter().any(|f| f == "nodev" || f == "nosuid"),
        "{flags:?}"
    );
    fs::write(m.mnt.join("hello"), "changed\n").unwrap();
    let out = run_script("checkpoint-now", &["via-mount8"], &m.mnt);
    assert!(out.status.success(), "{}", stderr(&out));
    umount_cli(&m.mnt);
    // An unknown option is refused through mount(8) too, and nothing is mounted.
    let out = run_with(
        Path::new("mount"),
        &[
            "-t",
            "fuse.checkpointfs",
            m.src.to_str().unwrap(),
            m.mnt.to_str().unwrap(),
            "-o",
            "state_dir=/x,bogus",
        ],
        Path::new("/"),
        &[],
        b"",
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown option 'bogus'"),
        "{}",
        stderr(&out)
    );
    assert!(!is_mount_point(&m.mnt));

    // 3. An fstab line (a private fstab file: mount -T), mounted by its mount point.
    let fstab = dir.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "{} {} fuse.checkpointfs state_dir={state},nofail,nodev 0 0\n",
            m.src.display(),
            m.mnt.display()
        ),
    )
    .unwrap();
    let out = run_with(
        Path::new("mount"),
        &["-T", fstab.to_str().unwrap(), m.mnt.to_str().unwrap()],
        Path::new("/"),
        &[],
        b"",
    );
    assert!(out.status.success(), "mount -T fstab: {}", stderr(&out));
    assert_eq!(fstype_of(&m.mnt).as_deref(), Some("fuse.checkpointfs"));
    // The fstab line's nodev wins over the default dev; suid stays.
    let flags = mount_flags_of(&m.mnt);
    assert!(flags.iter().any(|f| f == "nodev"), "{flags:?}");
    assert!(!flags.iter().any(|f| f == "nosuid"), "{flags:?}");
    assert!(
        checkpoints(&m.mnt).contains(&"via-mount8".to_string()),
        "same state dir"
    );
    umount_cli(&m.mnt);
}

/// The systemd unit's ExecStart/ExecStop, with an instance's EnvironmentFile substituted,
/// mount in the foreground and unmount.
#[test]
fn systemd_unit_command_lines_mount_and_unmount() {
    let unit = fs::read_to_string(script("checkpointfs@.service")).unwrap();
    for line in [
        "Type=simple",
        "Restart=on-failure",
        "EnvironmentFile=/etc/checkpointfs/%i.conf",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit lacks {line}");
    }
    let key = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}="))
            .to_string()
    };
    let m = TestMount::unmounted(&[]);
    fs::write(m.src.join("x.o"), "obj").unwrap();
    let env = [
        ("SRC", m.src.to_str().unwrap().to_string()),
        ("MNT", m.mnt.to_str().unwrap().to_string()),
        ("STATE", m.state.to_str().unwrap().to_string()),
        ("OPTS", "--exclude *.o --threads 2".to_string()),
    ];
    // systemd's expansion: ${X} as one word, $X split on whitespace.
    let expand = |cmd: &str| -> Vec<String> {
        cmd.split_whitespace()
            .flat_map(|w| {
                for (k, v) in &env {
                    if w == format!("${k}") {
                        return v.split_whitespace().map(String::from).collect();
                    }
                }
                let mut w = w.to_string();
                for (k, v) in &env {
                    w = w.replace(&format!("${{{k}}}"), v);
                }
                vec![w.replace("/usr/local/bin/checkpointfs", BIN)]
            })
            .collect()
    };
    let start = expand(&key("ExecStart"));
    assert!(
        start.contains(&"-f".to_string()),
        "foreground for Type=simple: {start:?}"
    );
    let mut daemon: Child = Command::new(&start[0])
        .args(&start[1..])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut kill = KillOnDrop(Some(daemon.id() as i32));
    assert!(
        wait_until(Duration::from_secs(20), || is_mount_point(&m.mnt)),
        "ExecStart did not mount"
    );
    let out = cli(&["status", m.mnt.to_str().unwrap(), "--path", "x.o"]);
    assert!(
        stdout(&out).contains("exclu"),
        "OPTS reached the mount: {}",
        stdout(&out)
    );
    // "-" (systemd: a failure is logged, not fatal) because a stop after an outside
    // `umount MNT` gets exit status 3.
    let stop_line = key("ExecStop");
    let stop = expand(stop_line.strip_prefix('-').expect("ExecStop=-…"));
    let out = Command::new(&stop[0]).args(&stop[1..]).output().unwrap();
    assert!(out.status.success(), "ExecStop: {}", stderr(&out));
    let status = daemon.wait().unwrap();
    kill.0 = None;
    assert!(status.success(), "daemon exited with {status:?}");
    assert!(!is_mount_point(&m.mnt));
    let out = Command::new(&stop[0]).args(&stop[1..]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "ExecStop once the mount is gone: {}",
        stderr(&out)
    );
}
