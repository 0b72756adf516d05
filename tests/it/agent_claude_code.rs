//! End to end with the real Claude Code CLI (npm `@anthropic-ai/claude-code`, pinned below and
//! installed by scripts/install-test-deps.sh) in a checkpointfs mount. Its model is
//! tests/agents/mock_anthropic.py on 127.0.0.1, which answers each prompt with scripted tool
//! calls, so the CLI really runs its Write, Edit and Bash tools; the hook is the real
//! `mount-scripts/claude-code-hook`, installed with `checkpointfs install-hook claude`.
//!
//! Nothing leaves the machine: the mock binds loopback only, telemetry, error reporting,
//! updates and non-essential traffic are off, and HTTP(S)_PROXY point at the mock with only
//! 127.0.0.1/localhost exempt, so any other connection the CLI tried would be refused there —
//! and logged: the tests assert that there was none.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tempfile::TempDir;

/// The Claude Code version the test is written against (scripts/install-test-deps.sh installs
/// exactly this one).
const CLAUDE_CODE_VERSION: &str = "2.1.332";
/// Where scripts/install-test-deps.sh puts it (`CLAUDE_CODE_DIR` there and here).
const CLAUDE_CODE_DIR: &str = "/var/tmp/checkpointfs-agents/claude-code";
/// How long one `claude -p` run may take (a scripted prompt takes about a second).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The installed CLI, checked to be the pinned version; fails (never skips) when it is not.
fn claude_bin() -> PathBuf {
    let dir = std::env::var_os("CLAUDE_CODE_DIR").map_or(CLAUDE_CODE_DIR.into(), PathBuf::from);
    let bin = dir.join("node_modules/.bin/claude");
    assert!(
        bin.exists(),
        "the Claude Code CLI {CLAUDE_CODE_VERSION} is not installed at {}: run \
         scripts/install-test-deps.sh",
        bin.display()
    );
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(&bin)
        .arg("--version")
        .env("HOME", home.path())
        .env("DISABLE_AUTOUPDATER", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let version = stdout(&out);
    assert!(
        version.starts_with(&format!("{CLAUDE_CODE_VERSION} ")),
        "{} --version says {version:?}, not {CLAUDE_CODE_VERSION}: run \
         scripts/install-test-deps.sh",
        bin.display()
    );
    bin
}

/// The mock Messages API, killed on drop.
struct Mock {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl Mock {
    /// Starts tests/agents/mock_anthropic.py with `script` and waits for its port file.
    fn start(script: &Value) -> Mock {
        let dir = tempfile::tempdir().unwrap();
        let script_file = dir.path().join("script.json");
        fs::write(&script_file, script.to_string()).unwrap();
        let (port_file, log) = (dir.path().join("port"), dir.path().join("requests.jsonl"));
        let mock = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/mock_anthropic.py");
        let mut child = Command::new("python3")
            .arg(&mock)
            .args([&script_file, &port_file, &log])
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 runs the mock");
        let up = wait_until(Duration::from_secs(20), || {
            port_file.exists() || child.try_wait().unwrap().is_some()
        });
        assert!(up && port_file.exists(), "the mock did not start");
        let port = fs::read_to_string(&port_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        Mock {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    /// Every request the mock has logged, in order.
    fn requests(&self) -> Vec<Value> {
        fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The requests of one scripted prompt.
    fn requests_for(&self, key: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r["key"] == key)
            .collect()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Claude Code user: a fresh HOME with our hook installed, and the mock as the API.
struct Claude {
    bin: PathBuf,
    home: TempDir,
    mock: Mock,
}

/// A `claude` process running in the background, its output going to files.
struct Running {
    child: Child,
    what: String,
    out: PathBuf,
    err: PathBuf,
}

impl Running {
    /// Waits for it to exit (at most [`RUN_TIMEOUT`]), asserting success; its stdout.
    fn wait(mut self, mock: &Mock) -> String {
        let start = Instant::now();
        let exited = wait_until(RUN_TIMEOUT, || self.child.try_wait().unwrap().is_some());
        if !exited {
            let _ = self.child.kill();
        }
        let status = self.child.wait().unwrap();
        let (out, err) = (
            fs::read_to_string(&self.out).unwrap_or_default(),
            fs::read_to_string(&self.err).unwrap_or_default(),
        );
        assert!(
            exited && status.success(),
            "{} {} after {:?}\nstdout:\n{out}\nstderr:\n{err}\nmock requests:\n{:#?}",
            self.what,
            if exited { "failed" } else { "timed out" },
            start.elapsed(),
            mock.requests()
        );
        out
    }
}

impl Drop for Running {
    /// A run the test did not wait for (it failed first) is not left behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Claude {
    fn new(script: &Value) -> Claude {
        Claude {
            bin: claude_bin(),
            home: tempfile::tempdir().unwrap(),
            mock: Mock::start(script),
        }
    }

    /// `checkpointfs install-hook claude SCOPE...` with our HOME: the real installer, putting
    /// the repo's mount-scripts/claude-code-hook into HOME/.claude/settings.json (`--user`)
    /// or DIR/.claude/settings.json (`--project DIR`).
    fn install_hook(&self, scope: &[&str]) {
        let out = Command::new(BIN)
            .args(["install-hook", "claude"])
            .args(scope)
            .env("HOME", self.home.path())
            // This checkout's script, wherever the binary was built (CARGO_TARGET_DIR).
            .env(
                "CHECKPOINTFS_SCRIPTS",
                Path::new(env!("CARGO_MANIFEST_DIR")).join("mount-scripts"),
            )
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "install-hook: {}", stderr(&out));
    }

    /// Starts `claude ARGS...` in `cwd`.
    ///
    /// Permissions: we run as root, where Claude Code refuses `--dangerously-skip-permissions`
    /// (and `--permission-mode bypassPermissions`) unless IS_SANDBOX=1 says it is in a sandbox.
    /// We need no bypass: `--allowedTools` pre-approves exactly the tools the script uses, and
    /// in `-p` mode anything not allowed is denied rather than asked for, so a run never
    /// waits on a prompt (stdin is /dev/null besides).
    fn spawn(&self, cwd: &Path, args: &[&str]) -> Running {
        let n = fs::read_dir(self.home.path()).unwrap().count();
        let (out, err) = (
            self.home.path().join(format!("run{n}.out")),
            self.home.path().join(format!("run{n}.err")),
        );
        let child = Command::new(&self.bin)
            .args(args)
            .args(["--allowedTools", "Read Write Edit Bash"])
            .current_dir(cwd)
            .env_clear()
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Running {
            child,
            what: format!("claude {args:?}"),
            out,
            err,
        }
    }

    /// Runs `claude ARGS...` in `cwd` to completion, asserting success; its stdout.
    fn run(&self, cwd: &Path, args: &[&str]) -> String {
        self.spawn(cwd, args).wait(&self.mock)
    }

    /// The CLI's whole environment (it starts from an empty one).
    fn env(&self) -> Vec<(&'static str, String)> {
        let base = format!("http://127.0.0.1:{}", self.mock.port);
        // Any connection not to loopback goes through the "proxy", which is the mock: it logs
        // and refuses it (see assert_nothing_left).
        let dead_proxy = format!("http://127.0.0.1:{}", self.mock.port);
        let mut env: Vec<(&'static str, String)> = vec![
            (
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOME", self.home.path().to_str().unwrap().into()),
            ("LANG", "C.UTF-8".into()),
            ("ANTHROPIC_BASE_URL", base),
            ("ANTHROPIC_API_KEY", "sk-ant-mock-key".into()),
            ("DISABLE_TELEMETRY", "1".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
            ("HTTPS_PROXY", dead_proxy.clone()),
            ("HTTP_PROXY", dead_proxy.clone()),
            ("https_proxy", dead_proxy.clone()),
            ("http_proxy", dead_proxy),
            ("NO_PROXY", "127.0.0.1,localhost".into()),
            ("no_proxy", "127.0.0.1,localhost".into()),
            // For the agent's `git commit`.
            ("GIT_AUTHOR_NAME", "Agent".into()),
            ("GIT_AUTHOR_EMAIL", "agent@checkpointfs.invalid".into()),
            ("GIT_COMMITTER_NAME", "Agent".into()),
            ("GIT_COMMITTER_EMAIL", "agent@checkpointfs.invalid".into()),
        ];
        // Its scratch files (claude-UID/, cc-socks/) go with HOME, not into the shared TMPDIR.
        let tmp = self.home.path().join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        env.push(("TMPDIR", tmp.to_str().unwrap().into()));
        env
    }
}

/// Asserts that every scripted turn of prompt `key` was answered, and every tool call the
/// CLI ran came back without an error; returns the session header of its requests.
fn assert_prompt_ran(mock: &Mock, key: &str, tool_calls: usize) -> Vec<String> {
    let reqs = mock.requests_for(key);
    let turns: Vec<u64> = reqs.iter().map(|r| r["turn"].as_u64().unwrap()).collect();
    assert_eq!(
        turns,
        (0..=tool_calls as u64).collect::<Vec<_>>(),
        "prompt {key}: {reqs:#?}"
    );
    let last = reqs.last().unwrap();
    let results = last["tool_results"].as_array().unwrap();
    assert_eq!(results.len(), tool_calls, "{last:#}");
    for r in results {
        assert_eq!(r["is_error"], false, "prompt {key}: a tool failed: {r:#}");
    }
    reqs.iter()
        .map(|r| r["session"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Asserts that the CLI tried no connection beyond the mock: none came through the proxy.
fn assert_nothing_left(mock: &Mock) {
    let escapes: Vec<Value> = mock
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "CONNECT" || !r["path"].as_str().unwrap().starts_with('/'))
        .collect();
    assert!(
        escapes.is_empty(),
        "the CLI tried to reach out: {escapes:#?}"
    );
}

/// Whether `id` is the hook's id for prompt `n` of the session starting with `sid8`:
/// `cc-<yyyymmddTHHMMSSZ>-<sid8>-<n, 4 digits>`.
fn is_hook_id(id: &str, sid8: &str, n: u32) -> bool {
    let Some(rest) = id.strip_prefix("cc-") else {
        return false;
    };
    let ts = rest.get(..16).unwrap_or("");
    let ts_ok = ts.len() == 16
        && ts[..8].bytes().all(|b| b.is_ascii_digit())
        && &ts[8..9] == "T"
        && ts[9..15].bytes().all(|b| b.is_ascii_digit())
        && &ts[15..] == "Z";
    ts_ok && rest[16..] == format!("-{sid8}-{n:04}")
}

/// `git ARGS...` in `dir`, asserting success.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "User")
        .env("GIT_AUTHOR_EMAIL", "user@checkpointfs.invalid")
        .env("GIT_COMMITTER_NAME", "User")
        .env("GIT_COMMITTER_EMAIL", "user@checkpointfs.invalid")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// `(path, change)` of each change `log --json` files under checkpoint `id`.
fn changes_of(log: &Value, id: &str) -> Vec<(String, String)> {
    entry_of(log, id)["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["change"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The `log --json` entry of checkpoint `id`.
fn entry_of<'a>(log: &'a Value, id: &str) -> &'a Value {
    log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("{id} not in the log: {log:#}"))
}

/// The change of `path` under checkpoint `id`.
fn change<'a>(log: &'a Value, id: &str, path: &str) -> &'a Value {
    entry_of(log, id)["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == path)
        .unwrap_or_else(|| panic!("{path} not under {id}: {log:#}"))
}

/// The id a rewind printed as "saved current state as ID".
fn saved_as(out: &str) -> String {
    out.lines()
        .find_map(|l| l.split("saved current state as ").nth(1))
        .unwrap_or_else(|| panic!("no 'saved current state as' in: {out}"))
        .trim()
        .to_string()
}

const SESSION: &str = "c0de0001-0000-4000-8000-000000000001";

#[test]
fn three_prompts_of_a_real_claude_code_session_are_checkpointed_and_rewound() {
    let t0 = Instant::now();
    let mut m = TestMount::unmounted(&[]);
    let mnt = m.mnt.clone();
    let p = |name: &str| mnt.join(name).to_str().unwrap().to_string();
    let script = json!({
        // Prompt 1: the Write tool creates a file, the Edit tool (after the Read it
        // requires) changes another.
        "p1": [
            {"tool": "Write", "input": {"file_path": p("notes/new.md"), "content": "# Notes\nwritten by Write\n"}},
            {"tool": "Read", "input": {"file_path": p("edit.txt")}},
            {"tool": "Edit", "input": {"file_path": p("edit.txt"), "old_string": "colour", "new_string": "color"}},
            {"text": "Wrote notes/new.md and edited edit.txt."}
        ],
        // Prompt 2: Bash runs sed -i on one file and rm on another.
        "p2": [
            {"tool": "Bash", "input": {"command": "sed -i 's/alpha/ALPHA/' sed.txt", "description": "sed"}},
            {"tool": "Bash", "input": {"command": "rm gone.txt", "description": "rm"}},
            {"text": "Done."}
        ],
        // Prompt 3: Bash commits everything.
        "p3": [
            {"tool": "Bash", "input": {"command": "git add -A && git commit -q -m 'agent: prompts 1 and 2'", "description": "commit"}},
            {"text": "Committed."}
        ]
    });
    let claude = Claude::new(&script);

    fs::write(m.src.join("edit.txt"), "the colour of money\n").unwrap();
    fs::write(m.src.join("sed.txt"), "alpha\nbeta\n").unwrap();
    fs::write(m.src.join("gone.txt"), "delete me\n").unwrap();
    git(&m.src, &["init", "-q", "-b", "main"]);
    git(&m.src, &["add", "-A"]);
    git(&m.src, &["commit", "-q", "-m", "initial"]);
    m.mount();
    claude.install_hook(&["--user"]);

    // Three prompts in one session: a new one with a fixed id, then --continue, then --resume.
    let mut trees = vec![tree_listing(&m.mnt)];
    claude.run(
        &m.mnt,
        &[
            "-p",
            "[[p1]] Write notes and fix the spelling.",
            "--session-id",
            SESSION,
        ],
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("notes/new.md")).unwrap(),
        "# Notes\nwritten by Write\n"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("edit.txt")).unwrap(),
        "the color of money\n"
    );
    trees.push(tree_listing(&m.mnt));
    claude.run(&m.mnt, &["-p", "--continue", "[[p2]] Now sed and rm."]);
    assert_eq!(
        fs::read_to_string(m.mnt.join("sed.txt")).unwrap(),
        "ALPHA\nbeta\n"
    );
    assert!(!m.mnt.join("gone.txt").exists());
    trees.push(tree_listing(&m.mnt));
    claude.run(&m.mnt, &["-p", "--resume", SESSION, "[[p3]] Commit it."]);
    assert!(git(&m.mnt, &["log", "--format=%s"]).starts_with("agent: prompts 1 and 2\n"));
    let latest = tree_listing(&m.mnt);

    // The CLI really ran every tool call, and all three prompts were one session.
    for (key, calls) in [("p1", 3), ("p2", 2), ("p3", 1)] {
        let sessions = assert_prompt_ran(&claude.mock, key, calls);
        assert!(sessions.iter().all(|s| s == SESSION), "{key}: {sessions:?}");
    }
    assert_nothing_left(&claude.mock);

    // One checkpoint per prompt, named by the hook from the session; each is the tree as it
    // was when its prompt was submitted, byte for byte, .git included.
    let ids = common::checkpoint_ids_by_name(&m);
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (n, id) in ids.iter().enumerate() {
        assert!(is_hook_id(id, &SESSION[..8], n as u32 + 1), "{ids:?}");
        assert_eq!(tree_listing(&at(&m, id)), trees[n], "at/{id}/");
    }
    assert!(trees[2].iter().any(|l| l.starts_with(".git/HEAD ")));
    assert!(
        latest
            .iter()
            .any(|l| l.starts_with(".git/refs/heads/main "))
    );

    // The log files each prompt's work under that prompt's checkpoint.
    let s = m.mnt.to_str().unwrap();
    let log: Value = serde_json::from_str(&cli_ok(&["log", s, "--json"])).unwrap();
    assert_eq!(log["schema"], "checkpointfs.log/3");
    assert_eq!(log["before_first"]["changes"], json!([]), "{log:#}");
    let logged: Vec<&str> = log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(logged, ids);
    let pair = |p: &str, c: &str| (p.to_string(), c.to_string());
    assert_eq!(
        changes_of(&log, &ids[0]),
        [
            pair("edit.txt", "modified"),
            pair("notes", "added"),
            pair("notes/new.md", "added")
        ]
    );
    assert_eq!(
        changes_of(&log, &ids[1]),
        [pair("gone.txt", "deleted"), pair("sed.txt", "modified")]
    );
    let commit = changes_of(&log, &ids[2]);
    assert!(
        commit.iter().all(|(p, _)| p.starts_with(".git/"))
            && commit.contains(&pair(".git/refs/heads/main", "modified")),
        "{commit:?}"
    );
    for (id, path, actor) in [
        (&ids[0], "notes/new.md", "claude"),
        (&ids[0], "edit.txt", "claude"),
        (&ids[1], "sed.txt", "sed"),
        (&ids[1], "gone.txt", "rm"),
        (&ids[2], ".git/refs/heads/main", "git"),
    ] {
        let c = change(&log, id, path);
        assert_eq!(c["actors"], json!([actor]), "{path}: {c:#}");
        assert_eq!(c["sessions"], json!([SESSION]), "{path}: {c:#}");
    }

    // Rewind to prompt 1: the tree, .git included, is as it was before the agent's work; and
    // its undo brings back the latest state.
    let out = rewind(&m, &ids[0], &[]);
    let undo = saved_as(&out);
    assert_eq!(undo, format!("{}:before-rewind", ids[0]));
    assert_eq!(tree_listing(&m.mnt), trees[0]);
    assert_eq!(git(&m.mnt, &["log", "--format=%s"]), "initial\n");
    rewind(&m, &undo, &[]);
    assert_eq!(tree_listing(&m.mnt), latest);
    assert!(git(&m.mnt, &["status", "--porcelain"]).is_empty());
    eprintln!("three prompts, checks and rewinds took {:?}", t0.elapsed());
}

const SESSION_A: &str = "aaaaaaaa-1111-4000-8000-000000000001";
const SESSION_B: &str = "bbbbbbbb-2222-4000-8000-000000000002";

#[test]
fn two_concurrent_claude_code_sessions_are_rewound_separately() {
    let t0 = Instant::now();
    let mut m = TestMount::unmounted(&[]);
    let bash = |cmd: &str| json!({"tool": "Bash", "input": {"command": cmd, "description": cmd}});
    // Each session's first reply waits until both sessions have asked for it: both CLIs
    // then run at the same time, and both hooks have checkpointed and registered their
    // session before either changes anything.
    let mut first_a = bash("echo A >> a.txt");
    first_a["barrier"] = json!(["start", 2]);
    let mut first_b = bash("echo B >> b.txt");
    first_b["barrier"] = json!(["start", 2]);
    let script = json!({
        "sa": [first_a, bash("echo A >> shared.txt"), {"text": "A done"}],
        "sb": [first_b, bash("echo B >> shared.txt"), {"text": "B done"}],
    });
    let claude = Claude::new(&script);
    for f in ["a.txt", "b.txt", "shared.txt"] {
        fs::write(m.src.join(f), format!("{f} v0\n")).unwrap();
    }
    m.mount();
    // Per project this time: MNT/.claude/settings.json, read by sessions started in MNT.
    claude.install_hook(&["--project", m.mnt.to_str().unwrap()]);
    assert!(m.mnt.join(".claude/settings.json").exists());

    let a = claude.spawn(
        &m.mnt,
        &["-p", "[[sa]] Session A.", "--session-id", SESSION_A],
    );
    let b = claude.spawn(
        &m.mnt,
        &["-p", "[[sb]] Session B.", "--session-id", SESSION_B],
    );
    b.wait(&claude.mock);
    a.wait(&claude.mock);
    for (key, session) in [("sa", SESSION_A), ("sb", SESSION_B)] {
        let sessions = assert_prompt_ran(&claude.mock, key, 2);
        assert!(sessions.iter().all(|s| s == session), "{key}: {sessions:?}");
    }
    assert_nothing_left(&claude.mock);
    let ids = common::checkpoint_ids_by_name(&m);
    assert_eq!(ids.len(), 2, "{ids:?}");
    let id_a = ids
        .iter()
        .find(|id| is_hook_id(id, &SESSION_A[..8], 1))
        .unwrap_or_else(|| panic!("no checkpoint of session A: {ids:?}"))
        .clone();
    assert!(
        ids.iter().any(|id| is_hook_id(id, &SESSION_B[..8], 1)),
        "{ids:?}"
    );
    let read = |f: &str| fs::read_to_string(m.mnt.join(f)).unwrap();
    assert_eq!(read("a.txt"), "a.txt v0\nA\n");
    assert_eq!(read("b.txt"), "b.txt v0\nB\n");
    let shared = read("shared.txt");
    assert!(
        shared == "shared.txt v0\nA\nB\n" || shared == "shared.txt v0\nB\nA\n",
        "{shared:?}"
    );
    let s = m.mnt.to_str().unwrap();
    let log: Value = serde_json::from_str(&cli_ok(&["log", s, "--json"])).unwrap();
    let sessions_of = |path: &str| -> Value {
        let all: Vec<&Value> = log["checkpoints"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["changes"].as_array().unwrap())
            .filter(|c| c["path"] == path)
            .flat_map(|c| c["sessions"].as_array().unwrap())
            .collect();
        let mut v: Vec<&str> = all.iter().map(|s| s.as_str().unwrap()).collect();
        v.sort();
        v.dedup();
        json!(v)
    };
    assert_eq!(sessions_of("a.txt"), json!([SESSION_A]), "{log:#}");
    assert_eq!(sessions_of("b.txt"), json!([SESSION_B]), "{log:#}");
    assert_eq!(
        sessions_of("shared.txt"),
        json!([SESSION_A, SESSION_B]),
        "{log:#}"
    );
    // Each checkpoint is its session's, and lists that session's work in answer to its
    // prompt, up to its own next checkpoint (none: now) — although the other session's
    // checkpoint came in between, whichever came first.
    let own = |session: &str| {
        let id = ids
            .iter()
            .find(|id| is_hook_id(id, &session[..8], 1))
            .unwrap()
            .clone();
        let file = if session == SESSION_A {
            "a.txt"
        } else {
            "b.txt"
        };
        let change = |p: &str| {
            (
                p.to_string(),
                "modified".to_string(),
                vec![session.to_string()],
            )
        };
        (
            id,
            Some(session.to_string()),
            None,
            vec![change(file), change("shared.txt")],
        )
    };
    // (`until` is the other's checkpoint or none, as the race decides.)
    let grouped = |log: &Value| {
        let mut all: Vec<_> = logged_checkpoints(log)
            .into_iter()
            .map(|c| (c.id, c.session, c.session_until, c.changes))
            .collect();
        all.sort_by(|x, y| x.1.cmp(&y.1));
        all
    };
    assert_eq!(
        grouped(&log),
        vec![own(SESSION_A), own(SESSION_B)],
        "{log:#}"
    );
    for session in [SESSION_A, SESSION_B] {
        let only: Value =
            serde_json::from_str(&cli_ok(&["log", s, "--json", "--session", session])).unwrap();
        assert_eq!(grouped(&only), vec![own(session)], "{only:#}");
    }

    // Session A's rewind: B also changed shared.txt, so it refuses, names it, changes nothing.
    let before = tree_listing(&m.mnt);
    let out = cli(&["rewind", s, &id_a, "--session", SESSION_A]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("shared.txt (also changed by session bbbbbbbb"),
        "{err}"
    );
    assert!(!err.contains("a.txt (") && !err.contains("b.txt"), "{err}");
    assert!(err.contains("Nothing was changed"), "{err}");
    // ... and suggests the commands to run, as they can be run.
    for hint in [
        format!("\n  checkpointfs rewind {s} {id_a} --session {SESSION_A} -- a.txt\n"),
        format!("\n  checkpointfs rewind {s} {id_a} --session {SESSION_A} --force\n"),
    ] {
        assert!(err.contains(&hint), "{hint:?} in {err}");
    }
    assert_eq!(tree_listing(&m.mnt), before);
    assert_eq!(
        common::checkpoint_ids_by_name(&m),
        ids,
        "a refused rewind saves nothing"
    );

    // Limited to A's own file, it goes ahead: only a.txt is reverted; undone as any rewind.
    let out = rewind(&m, &id_a, &["--session", SESSION_A, "--", "a.txt"]);
    assert_eq!(read("a.txt"), "a.txt v0\n");
    assert_eq!(read("b.txt"), "b.txt v0\nB\n");
    assert_eq!(read("shared.txt"), shared);
    rewind(&m, &saved_as(&out), &[]);
    assert_eq!(tree_listing(&m.mnt), before);

    // --force: A's files are reverted, shared.txt too; B's own file keeps B's work.
    let out = rewind(&m, &id_a, &["--session", SESSION_A, "--force"]);
    assert!(out.contains("forced: shared.txt"), "{out}");
    assert_eq!(read("a.txt"), "a.txt v0\n");
    assert_eq!(read("shared.txt"), "shared.txt v0\n");
    assert_eq!(read("b.txt"), "b.txt v0\nB\n");
    rewind(&m, &saved_as(&out), &[]);
    assert_eq!(tree_listing(&m.mnt), before);
    eprintln!("two sessions, checks and rewinds took {:?}", t0.elapsed());
}
