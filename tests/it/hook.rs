//! `checkpointfs hook claude|gemini` through a real mount, run as the agents run it (a
//! parent process that is the agent, `sh -c` / `bash -c`, the JSON on stdin): outside a
//! mount, on malformed input, with a stopped daemon, the ids across prompts and a resumed
//! session, and the settings an older `install-hook` wrote (naming the script in
//! mount-scripts/) still checkpointing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::{BIN, TestMount, checkpoint_ids_oldest_first, cli_ok, stderr, stdout};
use serde_json::{Value, json};

const SESSION: &str = "5ca1ab1e-0000-4000-8000-0000000000a1";

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("mount-scripts")
        .join(name)
}

/// What one run of a hook gave: exit status, stdout, stderr, and how long it took.
struct Ran {
    status: i64,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `command` as an agent does: a python3 process (the agent) runs it through `shell -c`
/// in `cwd` with `input` on stdin, then `tool` through `sh -c` in `cwd` (as the agent's
/// Bash tool would, so its changes show whose session they are).
fn agent_runs(shell: &str, command: &str, input: &[u8], cwd: &Path, tool: &str) -> Ran {
    let script = r#"
import json, subprocess, sys, time
shell, command, cwd, tool = sys.argv[1:5]
data = sys.stdin.buffer.read()
t = time.monotonic()
r = subprocess.run([shell, "-c", command], input=data, capture_output=True, cwd=cwd,
                   timeout=60)
took = time.monotonic() - t
if tool:
    subprocess.run(["sh", "-c", tool], cwd=cwd, check=True)
print(json.dumps({"status": r.returncode, "stdout": r.stdout.decode(),
                  "stderr": r.stderr.decode(), "took": took}))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, shell, command])
        .arg(cwd)
        .arg(tool)
        .env_remove("CHECKPOINTFS")
        .env_remove("CLAUDE_PROJECT_DIR")
        .env_remove("GEMINI_PROJECT_DIR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "agent: {}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    Ran {
        status: v["status"].as_i64().unwrap(),
        stdout: v["stdout"].as_str().unwrap().to_string(),
        stderr: v["stderr"].as_str().unwrap().to_string(),
        took: Duration::from_secs_f64(v["took"].as_f64().unwrap()),
    }
}

/// `checkpointfs hook AGENT` as the command an agent runs.
fn hook_command(agent: &str) -> String {
    format!("{BIN} hook {agent}")
}

fn input(session: &str, cwd: &Path) -> Vec<u8> {
    json!({
        "session_id": session,
        "transcript_path": "/tmp/none.jsonl",
        "cwd": cwd,
        "hook_event_name": "UserPromptSubmit",
        "prompt": "do \"it\"\nnow",
    })
    .to_string()
    .into_bytes()
}

/// The UTC stamp of the hook's ids for time `t`.
fn stamp(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y%m%dT%H%M%SZ"])
        .output()
        .unwrap();
    stdout(&out).trim().to_string()
}

/// Whether `id` is `PREFIX-<stamp>-SID8-NNNN` for prompt `n`.
fn is_id(id: &str, prefix: &str, sid8: &str, n: u32) -> bool {
    let p: Vec<&str> = id.split('-').collect();
    p.len() == 4
        && p[0] == prefix
        && p[1].len() == 16
        && p[1].ends_with('Z')
        && p[1].as_bytes()[8] == b'T'
        && p[2] == sid8
        && p[3] == format!("{n:04}")
}

#[test]
fn outside_any_mount_the_hook_does_nothing_and_exits_0() {
    let elsewhere = tempfile::tempdir().unwrap();
    for agent in ["claude", "gemini"] {
        let r = agent_runs(
            "sh",
            &hook_command(agent),
            &input(SESSION, elsewhere.path()),
            elsewhere.path(),
            "",
        );
        assert_eq!(r.status, 0, "{}", r.stderr);
        let expected = if agent == "gemini" { "{}\n" } else { "" };
        assert_eq!(r.stdout, expected);
        assert!(
            r.stderr
                .contains("is not inside a checkpointfs mount; no checkpoint taken"),
            "{}",
            r.stderr
        );
    }
    assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[test]
fn malformed_input_is_a_note_and_the_hooks_own_cwd_is_used() {
    let m = TestMount::new();
    let elsewhere = tempfile::tempdir().unwrap();
    for bad in [
        &b"{\"session_id\": \"x\", \"cwd\": "[..],
        b"",
        b"\xff\xfe not json",
    ] {
        for agent in ["claude", "gemini"] {
            let r = agent_runs("bash", &hook_command(agent), bad, elsewhere.path(), "");
            assert_eq!(r.status, 0, "{bad:?}: {}", r.stderr);
            let expected = if agent == "gemini" { "{}\n" } else { "" };
            assert_eq!(r.stdout, expected, "{bad:?}");
            assert!(
                r.stderr.contains("could not read the hook input as JSON"),
                "{bad:?}: {}",
                r.stderr
            );
        }
    }
    assert!(checkpoint_ids_oldest_first(&m).is_empty());
    // In the mount, the hook's own cwd is used: a checkpoint with no session.
    let r = agent_runs("sh", &hook_command("claude"), b"oops", &m.mnt, "");
    assert_eq!((r.status, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    let ids = checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(is_id(&ids[0], "cc", "nosession", 1), "{ids:?}");
    // Unknown arguments are noted, never refused.
    let r = agent_runs(
        "sh",
        &format!("{} --frobnicate", hook_command("gemini")),
        &input(SESSION, &m.mnt),
        &m.mnt,
        "",
    );
    assert_eq!((r.status, r.stdout.as_str()), (0, "{}\n"), "{}", r.stderr);
    assert!(r.stderr.contains("unexpected argument"), "{}", r.stderr);
    assert_eq!(checkpoint_ids_oldest_first(&m).len(), 2);
}

/// A stopped daemon: the hook gives up on the mount within its bound (5 s), exits 0, and
/// Gemini CLI gets a systemMessage; Claude Code's hook prints nothing on stdout.
#[test]
fn a_stopped_daemon_holds_the_prompt_no_longer_than_the_bound() {
    let m = TestMount::new();
    let pid = m.pid().expect("daemon pid");
    // Over /dev/fuse a request the stopped daemon never read is killable, so the hook's
    // abandoned access dies with it at its own 5 s bound. Over io_uring the kernel hands a
    // request to a ring entry at once, and a request in the daemon is not killable: the
    // hook's process cannot end before the watchdog ends the stopped daemon (10 s; see
    // tests/it/watchdog.rs). Known limit of the ring transport, written in its docs.
    let ring = crate::common::status_io(&m)["io_uring"] == true;
    let bound = if ring {
        Duration::from_secs(13)
    } else {
        Duration::from_secs(8)
    };
    // Warm the kernel's caches of the mount root, as an agent working there would have.
    let _ = fs::read_dir(&m.mnt).unwrap().count();
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: kill(2) with a pid and a signal; no memory is involved.
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }
    // SAFETY: kill(2) with a pid and a signal; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let cont = Cont(pid);
    let elsewhere = tempfile::tempdir().unwrap();
    // Both at once: each must give up within its own bound, well before the watchdog's
    // abort of the stopped daemon (10 s), which would answer the second one otherwise.
    let (r, r2) = std::thread::scope(|s| {
        let gemini = s.spawn(|| {
            agent_runs(
                "bash",
                &hook_command("gemini"),
                &input(SESSION, &m.mnt),
                elsewhere.path(),
                "",
            )
        });
        let claude = s.spawn(|| {
            agent_runs(
                "sh",
                &hook_command("claude"),
                &input(SESSION, &m.mnt),
                elsewhere.path(),
                "",
            )
        });
        (gemini.join().unwrap(), claude.join().unwrap())
    });
    drop(cont);
    for r in [&r, &r2] {
        assert_eq!(r.status, 0, "{}", r.stderr);
        assert!(
            r.took < bound,
            "took {:?} (io_uring: {ring}): {}",
            r.took,
            r.stderr
        );
        assert!(r.stderr.contains("timed out"), "{}", r.stderr);
    }
    let answer: Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {:?}", r.stdout));
    let msg = answer["systemMessage"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("gemini-cli-hook: checkpoint gc-") && msg.contains("timed out"),
        "{answer}"
    );
    assert_eq!(answer.as_object().unwrap().len(), 1, "{answer}");
    assert_eq!(r2.stdout, "");
}

/// The ids run on across prompts, per session and agent; the counter is in STATE/hooks/, so
/// a session resumed after a remount continues it; an id taken anyway is skipped.
#[test]
fn ids_run_on_across_prompts_and_a_resumed_session() {
    let mut m = TestMount::new();
    let sid8 = &SESSION[..8];
    for n in 1..=3 {
        let r = agent_runs(
            "sh",
            &hook_command("claude"),
            &input(SESSION, &m.mnt),
            &m.mnt,
            &format!("echo {n} >> work.txt"),
        );
        assert_eq!(
            (r.status, r.stdout.as_str(), r.stderr.as_str()),
            (0, "", "")
        );
    }
    let ids = checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (i, id) in ids.iter().enumerate() {
        assert!(is_id(id, "cc", sid8, i as u32 + 1), "{ids:?}");
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "sorted: {ids:?}");
    let counter = m.state.join(format!("hooks/claude-code-{sid8}.counter"));
    assert_eq!(fs::read_to_string(&counter).unwrap(), "3\n");
    // The session was registered from the agent's process: its tool's change is its own.
    let log = cli_ok(&["log", m.mnt.to_str().unwrap()]);
    assert!(log.contains(&format!("session {sid8}")), "{log}");

    // Gemini CLI's prompts in the same session count apart.
    let r = agent_runs(
        "bash",
        &hook_command("gemini"),
        &input(SESSION, &m.mnt),
        &m.mnt,
        "",
    );
    assert_eq!((r.status, r.stdout.as_str()), (0, "{}\n"), "{}", r.stderr);
    let last = checkpoint_ids_oldest_first(&m).pop().unwrap();
    assert!(is_id(&last, "gc", sid8, 1), "{last}");

    // Resumed after a remount: prompt 4. Then ids 5 and 6 taken already: prompt 7.
    m.remount();
    let r = agent_runs(
        "sh",
        &hook_command("claude"),
        &input(SESSION, &m.mnt),
        &m.mnt,
        "",
    );
    assert_eq!((r.status, r.stderr.as_str()), (0, ""));
    let last = checkpoint_ids_oldest_first(&m).pop().unwrap();
    assert!(is_id(&last, "cc", sid8, 4), "{last}");
    let now = SystemTime::now();
    for s in 0..4 {
        let t = stamp(now + Duration::from_secs(s));
        for n in [5, 6] {
            common::checkpoint(&m, &format!("cc-{t}-{sid8}-{n:04}"));
        }
    }
    let r = agent_runs(
        "sh",
        &hook_command("claude"),
        &input(SESSION, &m.mnt),
        &m.mnt,
        "",
    );
    assert_eq!((r.status, r.stderr.as_str()), (0, ""));
    let last = checkpoint_ids_oldest_first(&m).pop().unwrap();
    assert!(is_id(&last, "cc", sid8, 7), "{last}");
    assert_eq!(fs::read_to_string(&counter).unwrap(), "7\n");
}

/// Settings written by an older install-hook name the scripts in mount-scripts/; they are
/// wrappers now, and the agent's hook flow through them still checkpoints and registers
/// the session. install-hook sees them as already installed.
#[test]
fn settings_naming_the_old_scripts_still_checkpoint() {
    let m = TestMount::new();
    let home = tempfile::tempdir().unwrap();
    let claude_cmd = fs::canonicalize(script("claude-code-hook")).unwrap();
    let gemini_cmd = fs::canonicalize(script("gemini-cli-hook")).unwrap();
    // Exactly what install-hook wrote before `checkpointfs hook` existed.
    let old = [
        (
            ".claude/settings.json",
            json!({"hooks": {"UserPromptSubmit": [{"hooks": [
                {"type": "command", "command": claude_cmd, "timeout": 10}]}]}}),
        ),
        (
            ".gemini/settings.json",
            json!({"hooks": {"BeforeAgent": [{"hooks": [
                {"name": "checkpointfs", "type": "command", "command": gemini_cmd,
                 "timeout": 10000}]}]}}),
        ),
    ];
    for (file, settings) in &old {
        let path = home.path().join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, serde_json::to_string_pretty(settings).unwrap()).unwrap();
    }
    for agent in ["claude", "gemini"] {
        let out = Command::new(BIN)
            .args(["install-hook", agent])
            .env("HOME", home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stdout(&out).contains("already installed"),
            "{}",
            stdout(&out)
        );
    }
    let read = |file: &str| -> Value {
        serde_json::from_str(&fs::read_to_string(home.path().join(file)).unwrap()).unwrap()
    };
    // As each agent runs its hook: Claude Code through `sh -c`, Gemini CLI `bash -c`.
    for (file, event, shell, tool, expected) in [
        (
            ".claude/settings.json",
            "UserPromptSubmit",
            "sh",
            "echo c > c.txt",
            "",
        ),
        (
            ".gemini/settings.json",
            "BeforeAgent",
            "bash",
            "echo g > g.txt",
            "{}\n",
        ),
    ] {
        let settings = read(file);
        let command = settings["hooks"][event][0]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .to_string();
        let r = agent_runs(shell, &command, &input(SESSION, &m.mnt), &m.mnt, tool);
        assert_eq!(
            (r.status, r.stdout.as_str(), r.stderr.as_str()),
            (0, expected, "")
        );
    }
    let ids = checkpoint_ids_oldest_first(&m);
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(is_id(&ids[0], "cc", &SESSION[..8], 1), "{ids:?}");
    assert!(is_id(&ids[1], "gc", &SESSION[..8], 1), "{ids:?}");
    let log = cli_ok(&["log", m.mnt.to_str().unwrap(), "--session", SESSION]);
    assert!(log.contains("c.txt") && log.contains("g.txt"), "{log}");
    let started = Instant::now();
    // The wrapper with no binary to find still exits 0 (and keeps Gemini CLI's contract).
    let lonely = tempfile::tempdir().unwrap();
    for name in ["claude-code-hook", "gemini-cli-hook"] {
        fs::copy(script(name), lonely.path().join(name)).unwrap();
    }
    let r = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "echo '{{}}' | PATH=/usr/bin:/bin {}",
            lonely.path().join("gemini-cli-hook").display()
        ))
        .env_remove("CHECKPOINTFS")
        .output()
        .unwrap();
    assert!(r.status.success());
    let answer: Value = serde_json::from_str(&stdout(&r)).unwrap();
    assert!(
        answer["systemMessage"]
            .as_str()
            .unwrap()
            .contains("checkpointfs is not found"),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}
