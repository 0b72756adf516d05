//! The real Gemini CLI in a checkpointfs mount, end to end.
//!
//! The CLI (pinned, installed by scripts/install-test-deps.sh outside the repo) runs
//! non-interactively (`-p`, `--yolo`) against tests/agents/mock_gemini.py, a scripted
//! stand-in for the Gemini API on 127.0.0.1, so its own write_file, replace and
//! run_shell_command tools really change the tree. Its BeforeAgent hook is the one
//! `checkpointfs install-hook gemini` installs. Nothing leaves the machine: the mock binds
//! loopback only, every proxy variable points at a loopback trap that must see no connection
//! (NO_PROXY excepts the mock), HOME and TMPDIR are a temp dir, telemetry and update checks are off.
//!
//! Also: the hook script alone, fed Gemini CLI's hook input as the CLI does (no CLI needed).
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::*;
use serde_json::{Value, json};

/// The version scripts/install-test-deps.sh installs.
const GEMINI_CLI_VERSION: &str = "0.61.0";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The installed `gemini`; fails (never skips) when it is missing or not the pinned version.
fn gemini_bin() -> PathBuf {
    let dir = std::env::var_os("GEMINI_CLI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/checkpointfs-agents/gemini-cli"));
    let bin = dir.join("node_modules/.bin/gemini");
    let pkg = dir.join("node_modules/@google/gemini-cli/package.json");
    let version = fs::read_to_string(&pkg)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    assert!(
        bin.exists() && version.as_deref() == Some(GEMINI_CLI_VERSION),
        "Gemini CLI {GEMINI_CLI_VERSION} not found at {} (found version {version:?}): \
         run scripts/install-test-deps.sh",
        bin.display()
    );
    bin
}

/// tests/agents/mock_gemini.py, serving `prompts` (marker -> tool calls); killed on drop.
struct Mock {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mock {
    fn start(prompts: Value) -> Mock {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script.json");
        fs::write(&script, json!({ "prompts": prompts }).to_string()).unwrap();
        let (port_file, log) = (dir.path().join("port"), dir.path().join("requests.jsonl"));
        let mut child = Command::new("python3")
            .arg(repo().join("tests/agents/mock_gemini.py"))
            .args([&script, &port_file, &log])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run python3 tests/agents/mock_gemini.py");
        // The mock prints "ready PORT" once it listens: reading that line is the handshake.
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("mock_gemini.py said {line:?}"));
        assert_eq!(
            fs::read_to_string(&port_file).unwrap().trim(),
            port.to_string()
        );
        Mock {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// The requests served so far, one JSON object each.
    fn requests(&self) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A user of the Gemini CLI: a HOME of their own, with the settings a first run needs
/// (API-key auth, no telemetry, no update checks), and a proxy that is a trap.
struct User {
    home: tempfile::TempDir,
    /// Every proxy variable points here, NO_PROXY excepting only the mock: a connection
    /// to it is an attempt to leave the machine. Nothing answers (it is never accepted
    /// until [`User::assert_nothing_left`] looks), so such an attempt cannot succeed.
    proxy_trap: std::net::TcpListener,
}

impl User {
    fn new() -> User {
        let home = tempfile::tempdir().unwrap();
        fs::create_dir(home.path().join(".gemini")).unwrap();
        fs::create_dir(home.path().join("tmp")).unwrap();
        let settings = json!({
            "security": { "auth": { "selectedType": "gemini-api-key" } },
            "privacy": { "usageStatisticsEnabled": false },
            "telemetry": { "enabled": false },
            "general": { "enableAutoUpdate": false, "enableAutoUpdateNotification": false },
            "tools": { "useRipgrep": false },
        });
        fs::write(
            home.path().join(".gemini/settings.json"),
            serde_json::to_string_pretty(&settings).unwrap(),
        )
        .unwrap();
        let proxy_trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        proxy_trap.set_nonblocking(true).unwrap();
        User { home, proxy_trap }
    }

    /// `checkpointfs install-hook gemini --user` for this user.
    fn install_hook(&self) {
        let out = Command::new(BIN)
            .args(["install-hook", "gemini", "--user"])
            .env("HOME", self.home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// Asserts that nothing connected to the proxy trap: all traffic went to the mock.
    fn assert_nothing_left(&self) {
        match self.proxy_trap.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the Gemini CLI tried to reach the network via HTTPS_PROXY: {other:?}"),
        }
    }

    /// `gemini -p PROMPT --yolo SESSION_ARGS` in `cwd`, against `mock`.
    fn command(&self, mock: &Mock, cwd: &Path, session_args: &[&str], prompt: &str) -> Command {
        self.command_via(&[], mock, cwd, session_args, prompt)
    }

    /// As [`User::command`], run by `wrapper` (a program and its arguments, e.g.
    /// `with-checkpoints SRC --`), which gets the same environment.
    fn command_via(
        &self,
        wrapper: &[&OsStr],
        mock: &Mock,
        cwd: &Path,
        session_args: &[&str],
        prompt: &str,
    ) -> Command {
        let home = self.home.path();
        let proxy = format!("http://{}", self.proxy_trap.local_addr().unwrap());
        let bin = gemini_bin();
        let mut argv: Vec<&OsStr> = wrapper.to_vec();
        argv.extend([OsStr::new("timeout"), OsStr::new("120"), bin.as_os_str()]);
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..])
            .args(["-p", prompt, "--yolo", "-m", "gemini-2.5-flash"])
            .args(session_args)
            .current_dir(cwd)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", home)
            .env("TMPDIR", home.join("tmp"))
            .env("LANG", "C.UTF-8")
            .env("TERM", "dumb")
            .env("GEMINI_API_KEY", "dummy")
            .env(
                "GOOGLE_GEMINI_BASE_URL",
                format!("http://127.0.0.1:{}", mock.port),
            )
            // Project hooks run only in trusted folders; this trusts the mount.
            .env("GEMINI_CLI_TRUST_WORKSPACE", "true")
            // No /etc/gemini-cli settings from the machine.
            .env(
                "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
                home.join("no-system-settings.json"),
            )
            .env(
                "GEMINI_CLI_SYSTEM_DEFAULTS_PATH",
                home.join("no-system-defaults.json"),
            )
            .env("GEMINI_TELEMETRY_ENABLED", "false")
            .env("HTTPS_PROXY", &proxy)
            .env("HTTP_PROXY", &proxy)
            .env("https_proxy", &proxy)
            .env("http_proxy", &proxy)
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, mock: &Mock, cwd: &Path, session_args: &[&str], prompt: &str) -> Output {
        let out = self
            .command(mock, cwd, session_args, prompt)
            .output()
            .expect("run gemini");
        check_run(&out, prompt);
        out
    }
}

/// Asserts that a `gemini -p` run succeeded and ended with the mock's final answer.
fn check_run(out: &Output, prompt: &str) {
    let marker = &prompt[..prompt.find(']').unwrap() + 1];
    assert!(
        out.status.success() && stdout(out).contains(&format!("done: {marker}")),
        "gemini -p {prompt:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t.invalid"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Whether `id` is a Gemini CLI hook id for `session`'s prompt `n`:
/// gc-<yyyymmddTHHMMSSZ>-<first 8 chars of the session>-<n, 4 digits>.
fn is_hook_id(id: &str, session: &str, n: u32) -> bool {
    let parts: Vec<&str> = id.split('-').collect();
    parts.len() == 4
        && parts[0] == "gc"
        && parts[1].len() == 16
        && parts[1].as_bytes()[8] == b'T'
        && parts[1].ends_with('Z')
        && parts[2] == &session[..8]
        && parts[3] == format!("{n:04}")
}

fn write_file(path: &Path, content: &str) -> Value {
    json!({ "name": "write_file", "args": { "file_path": path, "content": content } })
}

fn replace(path: &Path, old: &str, new: &str) -> Value {
    json!({ "name": "replace", "args": {
        "file_path": path, "old_string": old, "new_string": new,
        "instruction": "edit as asked" } })
}

fn shell(command: &str) -> Value {
    json!({ "name": "run_shell_command", "args": { "command": command, "description": command } })
}

const SESSION: &str = "6e3c1a52-0d7b-4c39-9a51-6f1e0c2b9d01";
const SESSION_A: &str = "aaaa1111-5b2c-4d3e-8f40-000000000001";
const SESSION_B: &str = "bbbb2222-5b2c-4d3e-8f40-000000000002";

/// Paths changed in one checkpoint of `log --json`, and their sessions.
fn changes(cp: &Value) -> Vec<(String, String, Vec<String>)> {
    cp["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
                c["sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

/// Three prompts of one session (resumed between runs): one checkpoint each, every
/// `at/<id>/` byte-exact, the log grouped by prompt, rewind to prompt 1 and its undo.
#[test]
fn three_prompts_of_a_real_gemini_session_are_checkpointed_and_rewound() {
    let mut m = TestMount::unmounted(&[]);
    for (f, text) in [
        ("README.md", "# demo\n"),
        ("edit.txt", "colour = red\n"),
        ("sed.txt", "one\nfish\n"),
        ("rm.txt", "doomed\n"),
    ] {
        fs::write(m.src.join(f), text).unwrap();
    }
    git(&m.src, &["init", "-q", "-b", "main"]);
    git(&m.src, &["add", "-A"]);
    git(&m.src, &["commit", "-q", "-m", "initial"]);
    m.mount();
    let mnt = m.mnt.clone();
    let mnt_s = mnt.to_str().unwrap();
    let initial_commit = git(&mnt, &["rev-parse", "HEAD"]);

    let out = cli_ok(&["install-hook", "gemini", "--project", mnt_s]);
    assert!(out.contains("installed the checkpointfs hook in"), "{out}");
    let settings: Value =
        serde_json::from_str(&fs::read_to_string(mnt.join(".gemini/settings.json")).unwrap())
            .unwrap();
    let command = settings["hooks"]["BeforeAgent"][0]["hooks"][0]["command"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        command.ends_with("/mount-scripts/gemini-cli-hook"),
        "{command}"
    );

    let mock = Mock::start(json!({
        "[p1]": [
            write_file(&mnt.join("new.txt"), "written by gemini\n"),
            replace(&mnt.join("edit.txt"), "colour = red", "colour = blue"),
        ],
        "[p2]": [shell("sed -i 's/one/two/' sed.txt && rm rm.txt")],
        "[p3]": [shell(
            "git -c user.name=gemini -c user.email=gemini@mock.invalid add -A && \
             git -c user.name=gemini -c user.email=gemini@mock.invalid commit -q -m 'agent work'",
        )],
    }));
    let user = User::new();
    // The user-level hook as well: Gemini CLI runs identical hooks (name and command) once,
    // so this still takes one checkpoint per prompt.
    user.install_hook();
    let t0 = std::time::Instant::now();

    let tree0 = tree_listing(&mnt);
    user.run(
        &mock,
        &mnt,
        &["--session-id", SESSION],
        "[p1] write new.txt, edit edit.txt",
    );
    assert_eq!(
        fs::read_to_string(mnt.join("new.txt")).unwrap(),
        "written by gemini\n"
    );
    assert_eq!(
        fs::read_to_string(mnt.join("edit.txt")).unwrap(),
        "colour = blue\n"
    );
    let tree1 = tree_listing(&mnt);
    user.run(&mock, &mnt, &["--resume", SESSION], "[p2] sed and rm");
    assert_eq!(
        fs::read_to_string(mnt.join("sed.txt")).unwrap(),
        "two\nfish\n"
    );
    assert!(!mnt.join("rm.txt").exists());
    let tree2 = tree_listing(&mnt);
    user.run(&mock, &mnt, &["--resume", SESSION], "[p3] commit");
    assert_eq!(git(&mnt, &["log", "--format=%s"]), "agent work\ninitial\n");
    assert_eq!(git(&mnt, &["status", "--porcelain"]), "");
    let tree3 = tree_listing(&mnt);
    eprintln!("three gemini prompts took {:?}", t0.elapsed());
    user.assert_nothing_left();

    // The mock served every request the CLI made (none was 404), and really answered with
    // each tool, in order.
    assert!(
        mock.requests().iter().all(|r| r["answer"] != "404"),
        "{:?}",
        mock.requests()
    );
    let answers: Vec<String> = mock
        .requests()
        .iter()
        .filter(|r| r["marker"].is_string())
        .map(|r| {
            format!(
                "{} {}",
                r["marker"].as_str().unwrap(),
                r["answer"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        answers,
        [
            "[p1] write_file",
            "[p1] replace",
            "[p1] text",
            "[p2] run_shell_command",
            "[p2] text",
            "[p3] run_shell_command",
            "[p3] text"
        ],
        "{:?}",
        mock.requests()
    );

    // --resume really continued the conversation: prompt N's requests carry N prompts.
    for (marker, n) in [("[p1]", 1), ("[p2]", 2), ("[p3]", 3)] {
        assert!(
            mock.requests()
                .iter()
                .filter(|r| r["marker"] == marker)
                .all(|r| r["prompts"] == n),
            "{marker}: {:?}",
            mock.requests()
        );
    }

    // One checkpoint per prompt, named by the session; each is the tree as the prompt found it.
    let ids = common::checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (n, id) in ids.iter().enumerate() {
        assert!(is_hook_id(id, SESSION, n as u32 + 1), "{ids:?}");
    }
    for (id, expected) in ids.iter().zip([&tree0, &tree1, &tree2]) {
        assert_eq!(&tree_listing(&at(&m, id)), expected, "at/{id}/");
    }
    // .git as it was: prompt 3's checkpoint still has the initial commit only.
    let head_ref = "refs/heads/main";
    assert_eq!(
        fs::read_to_string(at(&m, &ids[2]).join(".git/HEAD")).unwrap(),
        format!("ref: {head_ref}\n")
    );
    assert_eq!(
        fs::read_to_string(at(&m, &ids[2]).join(".git").join(head_ref)).unwrap(),
        initial_commit
    );
    assert_ne!(
        fs::read_to_string(mnt.join(".git").join(head_ref)).unwrap(),
        initial_commit
    );

    // log --json: each checkpoint lists the work done in answer to its prompt, by the session.
    let log: Value = serde_json::from_str(&cli_ok(&["log", mnt_s, "--json"])).unwrap();
    assert_eq!(log["schema"], "checkpointfs.log/3");
    let cps = log["checkpoints"].as_array().unwrap();
    let c1 = changes(&cps[0]);
    let c2 = changes(&cps[1]);
    let c3 = changes(&cps[2]);
    let session = vec![SESSION.to_string()];
    assert_eq!(
        c1,
        [
            ("edit.txt".into(), "modified".into(), session.clone()),
            ("new.txt".into(), "added".into(), session.clone()),
        ],
        "{log:#}"
    );
    assert_eq!(
        c2,
        [
            ("rm.txt".into(), "deleted".into(), session.clone()),
            ("sed.txt".into(), "modified".into(), session.clone()),
        ],
        "{log:#}"
    );
    assert!(
        c3.iter()
            .any(|(p, ch, s)| p == ".git/refs/heads/main" && ch == "modified" && s == &session),
        "{log:#}"
    );
    assert!(
        c3.iter()
            .all(|(p, _, s)| p.starts_with(".git/") && s == &session),
        "prompt 3 changed only .git, as the session: {log:#}"
    );
    assert_eq!(cps[0]["until"], ids[1].as_str());
    assert_eq!(cps[2]["until"], Value::Null);
    let actors: BTreeSet<&str> = cps[1]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["actors"].as_array().unwrap())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(actors, BTreeSet::from(["rm", "sed"]), "{log:#}");
    // The text log names the session too.
    let text = cli_ok(&["log", mnt_s]);
    assert!(
        text.contains(&format!("session {}", &SESSION[..8])),
        "{text}"
    );

    // Rewind to prompt 1: the tree, .git included, is as prompt 1 found it; and undo.
    let out = rewind(&m, &ids[0], &[]);
    assert!(
        out.contains(&format!("saved current state as {}:before-rewind", ids[0])),
        "{out}"
    );
    assert_eq!(tree_listing(&mnt), tree0);
    assert_eq!(git(&mnt, &["rev-parse", "HEAD"]), initial_commit);
    rewind(&m, &format!("{}:before-rewind", ids[0]), &[]);
    assert_eq!(tree_listing(&mnt), tree3);
    assert_eq!(git(&mnt, &["log", "--format=%s"]), "agent work\ninitial\n");

    // The daemon had nothing to warn about while serving the CLI.
    let daemon_log = m.daemon_log();
    assert!(
        !daemon_log.contains(" WARN ") && !daemon_log.contains(" ERROR "),
        "{daemon_log}"
    );
}

/// Two Gemini sessions at once in one tree, each editing its own file, then both appending
/// to a shared one; the user edits a file meanwhile. `rewind ID --session A` refuses the
/// shared file (naming it, changing nothing), `--force` reverts all of A's work and only
/// A's, and the rewind is undone like any other.
#[test]
fn two_concurrent_gemini_sessions_are_rewound_separately() {
    let mut m = TestMount::unmounted(&[]);
    for f in ["a.txt", "b.txt", "shared.txt", "user.txt"] {
        fs::write(m.src.join(f), format!("{f} v0\n")).unwrap();
    }
    m.mount();
    let mnt = m.mnt.clone();
    let mnt_s = mnt.to_str().unwrap();
    cli_ok(&["install-hook", "gemini", "--project", mnt_s]);
    let mock = Mock::start(json!({
        "[a1]": [replace(&mnt.join("a.txt"), "a.txt v0", "a.txt by A")],
        "[b1]": [write_file(&mnt.join("b.txt"), "b.txt by B\n"),
                 write_file(&mnt.join("b-new.txt"), "new by B\n")],
        "[a2]": [shell("echo A >> shared.txt")],
        "[b2]": [shell("echo B >> shared.txt")],
    }));
    let (user_a, user_b) = (User::new(), User::new());
    let t0 = std::time::Instant::now();
    // Both at once: spawn both, then wait for both.
    let round = |a: (&[&str], &str), b: (&[&str], &str)| {
        let ca = user_a.command(&mock, &mnt, a.0, a.1).spawn().unwrap();
        let cb = user_b.command(&mock, &mnt, b.0, b.1).spawn().unwrap();
        check_run(&ca.wait_with_output().unwrap(), a.1);
        check_run(&cb.wait_with_output().unwrap(), b.1);
    };
    round(
        (&["--session-id", SESSION_A], "[a1] edit a.txt"),
        (&["--session-id", SESSION_B], "[b1] write b.txt"),
    );
    fs::write(mnt.join("user.txt"), "edited by the user\n").unwrap();
    round(
        (&["--resume", SESSION_A], "[a2] append to shared.txt"),
        (&["--resume", SESSION_B], "[b2] append to shared.txt"),
    );
    eprintln!(
        "two rounds of two concurrent sessions took {:?}",
        t0.elapsed()
    );
    let shared = fs::read_to_string(mnt.join("shared.txt")).unwrap();
    assert!(
        shared == "shared.txt v0\nA\nB\n" || shared == "shared.txt v0\nB\nA\n",
        "{shared:?}"
    );

    let ids = common::checkpoint_ids_oldest_first(&m);
    let a_ids: Vec<&String> = ids.iter().filter(|i| i.contains("-aaaa1111-")).collect();
    let b_ids: Vec<&String> = ids.iter().filter(|i| i.contains("-bbbb2222-")).collect();
    assert_eq!((a_ids.len(), b_ids.len(), ids.len()), (2, 2, 4), "{ids:?}");
    assert!(is_hook_id(a_ids[0], SESSION_A, 1) && is_hook_id(a_ids[1], SESSION_A, 2));
    assert!(is_hook_id(b_ids[0], SESSION_B, 1) && is_hook_id(b_ids[1], SESSION_B, 2));
    // Each session's log holds its own files only.
    let only_a = cli_ok(&["log", mnt_s, "--session", SESSION_A]);
    assert!(
        only_a.contains("a.txt") && only_a.contains("shared.txt"),
        "{only_a}"
    );
    assert!(
        !only_a.contains("b.txt") && !only_a.contains("b-new.txt") && !only_a.contains("user.txt"),
        "{only_a}"
    );

    // A's first checkpoint: A changed a.txt and shared.txt since; B changed shared.txt too.
    let a1 = a_ids[0].as_str();
    let before = tree_listing(&mnt);
    let out = cli(&["rewind", mnt_s, a1, "--session", SESSION_A]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("shared.txt (also changed by session bbbb2222"),
        "{err}"
    );
    assert!(!err.contains("a.txt (also"), "{err}");
    assert!(err.contains("Nothing was changed"), "{err}");
    let forced = format!("\n  checkpointfs rewind {mnt_s} {a1} --session {SESSION_A} --force\n");
    assert!(err.contains(&forced), "{forced:?} in {err}");
    assert_eq!(
        tree_listing(&mnt),
        before,
        "a refused rewind changed the tree"
    );

    let out = rewind(&m, a1, &["--session", SESSION_A, "--force"]);
    assert!(out.contains("forced: shared.txt"), "{out}");
    let read = |f: &str| fs::read_to_string(mnt.join(f)).unwrap();
    assert_eq!(read("a.txt"), "a.txt v0\n");
    assert_eq!(read("shared.txt"), "shared.txt v0\n");
    assert_eq!(read("b.txt"), "b.txt by B\n");
    assert_eq!(read("b-new.txt"), "new by B\n");
    assert_eq!(read("user.txt"), "edited by the user\n");
    rewind(&m, &format!("{a1}:before-rewind"), &[]);
    assert_eq!(tree_listing(&mnt), before);
    let daemon_log = m.daemon_log();
    assert!(
        !daemon_log.contains(" WARN ") && !daemon_log.contains(" ERROR "),
        "{daemon_log}"
    );
}

/// Runs `command` as Gemini CLI runs a hook: `bash -c COMMAND` from a parent process (the
/// agent, here python3) with the hook input on stdin and GEMINI_PROJECT_DIR & co. set; then,
/// as the agent's tool would, `tool` through `sh -c` in `cwd`. Returns the hook's stdout,
/// stderr and exit status as JSON.
fn gemini_like_agent(command: &str, input: &Value, cwd: &Path, tool: &str) -> Value {
    let script = r#"
import json, os, subprocess, sys
command, input, cwd, tool = sys.argv[1:5]
parsed = json.loads(input)
sid = parsed.get("session_id", "") if isinstance(parsed, dict) else ""
env = dict(os.environ, GEMINI_PROJECT_DIR=cwd, GEMINI_CWD=cwd, CLAUDE_PROJECT_DIR=cwd,
           GEMINI_SESSION_ID=sid)
r = subprocess.run(["bash", "-c", command], input=input.encode(), capture_output=True,
                   cwd=cwd, env=env, timeout=30)
if tool:
    subprocess.run(["sh", "-c", tool], cwd=cwd, check=True)
print(json.dumps({"status": r.returncode, "stdout": r.stdout.decode(),
                  "stderr": r.stderr.decode()}))
"#;
    let out = Command::new("python3")
        .args(["-c", script, command, &input.to_string()])
        .arg(cwd)
        .arg(tool)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn before_agent(session: &str, cwd: &Path, prompt: &str) -> Value {
    json!({
        "session_id": session,
        "transcript_path": "/tmp/none.json",
        "cwd": cwd,
        "hook_event_name": "BeforeAgent",
        "timestamp": "2026-01-02T03:04:05.678Z",
        "prompt": prompt,
    })
}

/// The hook script alone, with Gemini CLI's hook input: exactly `{}` on stdout and exit 0,
/// a gc- checkpoint per prompt with the counter running on, the session registered (its
/// tool's writes are attributed to it); outside a mount it still answers `{}`.
#[test]
fn the_gemini_hook_checkpoints_each_prompt_and_keeps_the_stdout_contract() {
    let m = TestMount::new();
    let hook = repo().join("mount-scripts/gemini-cli-hook");
    let hook_s = hook.to_str().unwrap();
    for n in 1..=3 {
        let input = before_agent(SESSION, &m.mnt, &format!("prompt {n}"));
        let r = gemini_like_agent(hook_s, &input, &m.mnt, &format!("echo {n} >> work.txt"));
        assert_eq!(r["status"], 0, "{r}");
        assert_eq!(r["stdout"], "{}\n", "{r}");
        assert_eq!(r["stderr"], "", "{r}");
    }
    let ids = common::checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (n, id) in ids.iter().enumerate() {
        assert!(is_hook_id(id, SESSION, n as u32 + 1), "{ids:?}");
    }
    assert_eq!(
        fs::read_to_string(at(&m, &ids[2]).join("work.txt")).unwrap(),
        "1\n2\n"
    );
    let log: Value =
        serde_json::from_str(&cli_ok(&["log", m.mnt.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(
        changes(&log["checkpoints"][0]),
        [(
            "work.txt".to_string(),
            "added".to_string(),
            vec![SESSION.to_string()]
        )]
    );
    // No "cwd" in the input: GEMINI_PROJECT_DIR (the CLI sets it to the project) is used.
    let mut input = before_agent(SESSION, &m.mnt, "prompt 4");
    input.as_object_mut().unwrap().remove("cwd");
    let r = gemini_like_agent(hook_s, &input, &m.mnt, "");
    assert_eq!(r["stdout"], "{}\n", "{r}");
    assert_eq!(common::checkpoint_ids_oldest_first(&m).len(), 4);
    assert!(is_hook_id(
        &common::checkpoint_ids_oldest_first(&m)[3],
        SESSION,
        4
    ));
    // The counter lives in the state dir, per session.
    assert_eq!(
        fs::read_to_string(m.state.join("hooks/gemini-cli-6e3c1a52.counter")).unwrap(),
        "4\n"
    );

    // Outside a mount, and on input that is not JSON: still {} and exit 0, a note on stderr.
    let elsewhere = tempfile::tempdir().unwrap();
    let r = gemini_like_agent(
        hook_s,
        &before_agent(SESSION, elsewhere.path(), "x"),
        elsewhere.path(),
        "",
    );
    assert_eq!(
        (&r["status"], &r["stdout"]),
        (&json!(0), &json!("{}\n")),
        "{r}"
    );
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("is not inside a checkpointfs mount"),
        "{r}"
    );
    let r = gemini_like_agent(hook_s, &json!("not an object"), elsewhere.path(), "");
    assert_eq!(
        (&r["status"], &r["stdout"]),
        (&json!(0), &json!("{}\n")),
        "{r}"
    );

    // A checkpoint that fails in a mount is shown to the user as a systemMessage, still
    // with exit 0: another user, who may not write the mount's ctl (no allow_other).
    let (uid, gid) = test_user("cpfs-test-gemini");
    let copy = tempfile::tempdir().unwrap();
    fs::set_permissions(copy.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["gemini-cli-hook", "claude-code-hook"] {
        fs::copy(
            repo().join("mount-scripts").join(name),
            copy.path().join(name),
        )
        .unwrap();
    }
    let input = before_agent(SESSION, &m.mnt, "denied").to_string();
    let out = run_as(
        uid,
        gid,
        &[
            "bash",
            "-c",
            "printf '%s' \"$1\" | CHECKPOINTFS=\"$3\" \"$2\"",
            "bash",
            &input,
            copy.path().join("gemini-cli-hook").to_str().unwrap(),
            common::BIN,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let answer: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {}", stdout(&out)));
    let msg = answer["systemMessage"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("gemini-cli-hook: checkpoint gc-") && msg.contains("failed"),
        "{answer}"
    );
    assert_eq!(
        common::checkpoint_ids_oldest_first(&m).len(),
        4,
        "no checkpoint was taken"
    );
}

/// `install-hook gemini --user`, run twice against settings that already have other hooks,
/// adds one hook and keeps the rest; the installed command, run as Gemini CLI runs it,
/// checkpoints the prompt; `--remove` puts the file back as it was.
#[test]
fn install_hook_gemini_installs_a_command_that_checkpoints() {
    let m = TestMount::new();
    let home = tempfile::tempdir().unwrap();
    let path = home.path().join(".gemini/settings.json");
    fs::create_dir(path.parent().unwrap()).unwrap();
    let theirs = json!({
        "general": { "vimMode": true },
        "hooks": {
            "BeforeAgent": [
                { "hooks": [ { "name": "ctx", "type": "command", "command": "git log -3" } ] }
            ],
            "BeforeTool": [
                { "matcher": "run_shell_command",
                  "hooks": [ { "type": "command", "command": "audit-shell" } ] }
            ]
        }
    });
    fs::write(&path, serde_json::to_string_pretty(&theirs).unwrap()).unwrap();
    let install = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["install-hook", "gemini", "--user"])
            .args(extra)
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        stdout(&out)
    };
    assert!(install(&[]).contains("installed the checkpointfs hook in"));
    let once = fs::read_to_string(&path).unwrap();
    assert!(install(&[]).contains("already installed"));
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        once,
        "a second install changed it"
    );
    let settings: Value = serde_json::from_str(&once).unwrap();
    let groups = settings["hooks"]["BeforeAgent"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{settings:#}");
    assert_eq!(groups[0], theirs["hooks"]["BeforeAgent"][0]);
    assert_eq!(
        settings["hooks"]["BeforeTool"],
        theirs["hooks"]["BeforeTool"]
    );
    assert_eq!(settings["general"], theirs["general"]);
    let hook = &groups[1]["hooks"][0];
    assert_eq!(hook["type"], "command");
    assert_eq!(hook["name"], "checkpointfs");
    assert_eq!(hook["timeout"], 10000);
    let command = hook["command"].as_str().unwrap();
    assert_eq!(
        Path::new(command),
        fs::canonicalize(repo().join("mount-scripts/gemini-cli-hook")).unwrap()
    );
    let r = gemini_like_agent(command, &before_agent(SESSION_B, &m.mnt, "hi"), &m.mnt, "");
    assert_eq!(
        (&r["status"], &r["stdout"]),
        (&json!(0), &json!("{}\n")),
        "{r}"
    );
    let ids = common::checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(is_hook_id(&ids[0], SESSION_B, 1), "{ids:?}");

    assert!(install(&["--remove"]).contains("removed the checkpointfs hook"));
    let back: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(back, theirs);
    assert!(install(&["--remove"]).contains("nothing to remove"));
}

/// Unmounts (lazily) whatever is still mounted below a directory when dropped: the mount
/// with-checkpoints makes, should the test fail while it is up.
struct UnmountBelow(PathBuf);

impl Drop for UnmountBelow {
    fn drop(&mut self) {
        for (mp, _) in mounts_under(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
    }
}

/// `with-checkpoints SRC -- gemini ...` twice: the mount is at the same path both times, so
/// `gemini --resume latest` (sessions are keyed by the project's path) finds the session,
/// and the hook's numbering goes on in the same history.
#[test]
fn gemini_under_with_checkpoints_resumes_its_session_next_run() {
    let m = TestMount::unmounted(&[]);
    let xdg = tempfile::tempdir().unwrap();
    fs::set_permissions(xdg.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let _unmount = UnmountBelow(xdg.path().to_path_buf());
    let user = User::new();
    user.install_hook();
    let mock = Mock::start(json!({
        "[w1]": [shell("echo one > w.txt")],
        "[w2]": [shell("echo two >> w.txt")],
    }));
    let script = repo().join("mount-scripts/with-checkpoints");
    let wrapper: Vec<&OsStr> = vec![
        script.as_os_str(),
        OsStr::new("--state-dir"),
        m.state.as_os_str(),
        m.src.as_os_str(),
        OsStr::new("--"),
    ];
    for (session_args, prompt) in [
        (&["--session-id", SESSION][..], "[w1] start"),
        (&["--resume", "latest"][..], "[w2] go on"),
    ] {
        let out = user
            .command_via(&wrapper, &mock, Path::new("/"), session_args, prompt)
            .env("CHECKPOINTFS", BIN)
            .env("XDG_RUNTIME_DIR", xdg.path())
            .output()
            .unwrap();
        check_run(&out, prompt);
        assert!(
            mounts_under(xdg.path()).is_empty(),
            "with-checkpoints left a mount"
        );
    }
    user.assert_nothing_left();
    assert_eq!(
        fs::read_to_string(m.src.join("w.txt")).unwrap(),
        "one\ntwo\n"
    );
    // The second run continued the first one's conversation...
    assert!(
        mock.requests()
            .iter()
            .filter(|r| r["marker"] == "[w2]")
            .all(|r| r["prompts"] == 2),
        "{:?}",
        mock.requests()
    );
    // ... and its session's checkpoint numbering, in one history.
    let log: Value = serde_json::from_str(&cli_ok(&[
        "log",
        "--state-dir",
        m.state.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    let cps = log["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), 2, "{log:#}");
    for (n, cp) in cps.iter().enumerate() {
        assert!(
            is_hook_id(cp["id"].as_str().unwrap(), SESSION, n as u32 + 1),
            "{log:#}"
        );
    }
    let session = vec![SESSION.to_string()];
    assert_eq!(
        changes(&cps[0]),
        [("w.txt".to_string(), "added".to_string(), session.clone())]
    );
    assert_eq!(
        changes(&cps[1]),
        [("w.txt".to_string(), "modified".to_string(), session)]
    );
}
