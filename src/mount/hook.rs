//! `checkpointfs hook claude|gemini`: the checkpoint-per-prompt hook of Claude Code
//! (`UserPromptSubmit`) and Gemini CLI (`BeforeAgent`). mount-scripts/claude-code-hook and
//! gemini-cli-hook are wrappers that run it, so the settings files that name them keep
//! working.
//!
//! For each prompt it reads the hook's JSON on stdin (`session_id`, `cwd`), finds the
//! checkpointfs mount holding `cwd` (else `$CLAUDE_PROJECT_DIR` / `$GEMINI_PROJECT_DIR`, else
//! its own cwd) in /proc/self/mountinfo, registers the session there (`session ID PID` to
//! `MNT/.checkpoint/ctl`, written by this process, a descendant of the agent: the daemon
//! accepts it only from the owner of PID, see `crate::history::process::register_session`,
//! and PID is the agent, the nearest ancestor that is not a shell) and takes a checkpoint
//! through `ctl`, named `cc-<UTC yyyymmddTHHMMSSZ>-<sid8>-<NNNN>` (`gc-` for Gemini CLI).
//! The counter `NNNN` is kept per session in `STATE/hooks/`, so a resumed session continues
//! it; an id taken anyway is retried with the next one (10 tries).
//!
//! It never fails the prompt: [`run`] reports nothing but notes (on stderr, as it goes) and
//! the message for the user, if any. Every access to the mount is bounded to [`BOUND`] (on a
//! thread, abandoned when it does not answer: a stopped daemon cannot hold the prompt), and
//! once one access timed out the mount is not touched again, so the whole hook stays
//! within about one bound.
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::mount::mountinfo::{innermost_mount, is_checkpointfs_mount, parse_mountinfo};
use crate::sys::error_text;

/// The longest a hook waits for any one access to the mount (and for its stdin).
pub const BOUND: Duration = Duration::from_secs(5);

/// How many ids a hook tries when the one it made is taken.
const TRIES: u64 = 10;

/// The processes between an agent and its hook that are not the agent: the shells the
/// agents run hooks through (Claude Code `sh -c`, Gemini CLI `bash -c`) and wrappers.
const NOT_THE_AGENT: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "timeout", "env", "nice", "nohup",
];

/// The agent a hook runs for: its ids' prefix, its counter files and its notes' name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookAgent {
    Claude,
    Gemini,
}

impl HookAgent {
    /// `claude` or `gemini`.
    pub fn from_name(name: &str) -> Option<HookAgent> {
        match name {
            "claude" => Some(HookAgent::Claude),
            "gemini" => Some(HookAgent::Gemini),
            _ => None,
        }
    }

    /// The name its notes start with: the script's, which users and tests know.
    pub fn me(self) -> &'static str {
        match self {
            HookAgent::Claude => "claude-code-hook",
            HookAgent::Gemini => "gemini-cli-hook",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            HookAgent::Claude => "cc",
            HookAgent::Gemini => "gc",
        }
    }

    fn counter_name(self) -> &'static str {
        match self {
            HookAgent::Claude => "claude-code",
            HookAgent::Gemini => "gemini-cli",
        }
    }

    /// The variable the agent sets to the project's directory.
    fn project_env(self) -> &'static str {
        match self {
            HookAgent::Claude => "CLAUDE_PROJECT_DIR",
            HookAgent::Gemini => "GEMINI_PROJECT_DIR",
        }
    }
}

/// The fields of the hook input a hook uses; empty when missing or not strings, and both
/// empty when the input is not a JSON object.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HookInput {
    pub cwd: String,
    pub session: String,
}

/// Parses the hook's JSON input.
pub fn parse_input(bytes: &[u8]) -> HookInput {
    let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) else {
        return HookInput::default();
    };
    let field = |k: &str| {
        map.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    HookInput {
        cwd: field("cwd"),
        session: field("session_id"),
    }
}

/// The session's part of an id: its first 8 characters of `[A-Za-z0-9._@-]`, or `nosession`.
pub fn short_session(session: &str) -> String {
    let sid: String = session
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._@-".contains(*c))
        .take(8)
        .collect();
    if sid.is_empty() {
        "nosession".to_string()
    } else {
        sid
    }
}

/// A sortable UTC timestamp, e.g. `20250102T030405Z`.
pub fn utc_stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect()
}

/// The checkpoint id of prompt `n`: `PREFIX-STAMP-SID-NNNN`.
pub fn checkpoint_id(agent: HookAgent, stamp: &str, sid: &str, n: u64) -> String {
    format!("{}-{stamp}-{sid}-{n:04}", agent.prefix())
}

/// The counter file's name in `STATE/hooks/`.
pub fn counter_file_name(agent: HookAgent, sid: &str) -> String {
    format!("{}-{sid}.counter", agent.counter_name())
}

/// The last prompt number in a counter file's text: the digits of its first line (0 when
/// there are none, or too many).
pub fn parse_counter(text: &str) -> u64 {
    let digits: String = text
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// Control characters as spaces, so the message is one line.
pub fn one_line(msg: &str) -> String {
    msg.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Runs `f` on a thread and waits at most `bound` for it: a `TimedOut` error when it does
/// not answer by then (the thread is left to finish, or to die with the process).
fn bounded<T: Send + 'static>(
    bound: Duration,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("hook-io".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| crate::sys::context("cannot start a thread", e))?;
    match rx.recv_timeout(bound) {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

fn timed_out(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut && e.raw_os_error().is_none()
}

/// Reads stdin to its end, within the bound (a writer that never closes it gets what it
/// wrote by then: nothing, as `timeout 5 cat` gave).
pub fn read_stdin(bound: Duration) -> Vec<u8> {
    bounded(bound, || {
        let mut buf = Vec::new();
        io::stdin().lock().read_to_end(&mut buf)?;
        Ok(buf)
    })
    .unwrap_or_default()
}

/// The agent process that ran this hook: the nearest ancestor that is not a shell or a
/// wrapper ([`NOT_THE_AGENT`]), at most 8 levels up.
fn agent_pid() -> Option<u32> {
    let mut p = std::os::unix::process::parent_id();
    for _ in 0..8 {
        if p <= 1 {
            return None;
        }
        let comm = fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
        if !NOT_THE_AGENT.contains(&comm.trim()) {
            return Some(p);
        }
        p = crate::history::process::parent_and_start(p)?.0;
    }
    None
}

/// One mount, every access to it bounded; after one timed out, the mount is not touched
/// again (each later access fails at once as timed out).
struct Mount {
    path: PathBuf,
    bound: Duration,
    stuck: bool,
}

impl Mount {
    fn access<T: Send + 'static>(
        &mut self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        if self.stuck {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
        }
        let r = bounded(self.bound, f);
        if r.as_ref().is_err_and(timed_out) {
            self.stuck = true;
        }
        r
    }

    fn ctl(&self) -> PathBuf {
        self.path.join(".checkpoint/ctl")
    }

    /// Writes one line to `ctl`, in one write.
    fn write_ctl(&mut self, line: String) -> io::Result<()> {
        let ctl = self.ctl();
        self.access(move || {
            let mut f = fs::OpenOptions::new().write(true).open(&ctl)?;
            f.write_all(format!("{line}\n").as_bytes())
        })
    }

    /// The mount's state dir, from its `.checkpoint/state-dir`.
    fn state_dir(&mut self) -> io::Result<PathBuf> {
        let file = self.path.join(".checkpoint/state-dir");
        self.access(move || fs::read(file)).map(|mut b| {
            while b.last() == Some(&b'\n') {
                b.pop();
            }
            PathBuf::from(OsString::from_vec(b))
        })
    }
}

/// Where a hook runs: what it takes from its environment (apart for tests).
#[derive(Debug, Clone)]
pub struct HookEnv {
    /// The agent's project directory variable (`CLAUDE_PROJECT_DIR`, ...).
    pub project_dir: Option<OsString>,
    /// The hook's own cwd.
    pub cwd: Option<PathBuf>,
    /// The time the id is stamped with.
    pub now: SystemTime,
    pub bound: Duration,
}

impl HookEnv {
    pub fn from_process(agent: HookAgent) -> HookEnv {
        HookEnv {
            project_dir: std::env::var_os(agent.project_env()),
            cwd: std::env::current_dir().ok(),
            now: SystemTime::now(),
            bound: BOUND,
        }
    }
}

/// One run of the hook: notes go to stderr as they come; the return value is the message
/// for the user (`ME: ...`), when the mount was found but the session or the checkpoint
/// failed. Never fails.
pub fn run(agent: HookAgent, input: &[u8], env: &HookEnv) -> Option<String> {
    let me = agent.me();
    let note = |msg: &str| eprintln!("{me}: {msg}");
    let mut user_msg = None;
    // A note the user should see, too: the last one wins.
    let warn = |user_msg: &mut Option<String>, msg: String| {
        note(&msg);
        *user_msg = Some(format!("{me}: {msg}"));
    };

    let input = parse_input(input);
    if input.cwd.is_empty() && input.session.is_empty() {
        note("could not read the hook input as JSON; using the current directory");
    }
    let cwd: OsString = if input.cwd.starts_with('/') {
        input.cwd.into()
    } else {
        match env.project_dir.clone().filter(|d| !d.is_empty()) {
            Some(d) => d,
            None => env.cwd.clone().unwrap_or_default().into_os_string(),
        }
    };
    let cwd = PathBuf::from(cwd);
    let Some((mount_point, stuck)) = mount_of(&cwd, env.bound) else {
        note(&format!(
            "{} is not inside a checkpointfs mount; no checkpoint taken",
            cwd.display()
        ));
        return None;
    };
    let mut mnt = Mount {
        path: mount_point,
        bound: env.bound,
        stuck,
    };
    let shown = mnt.path.display().to_string();
    let sid = short_session(&input.session);

    // Register the session, so that what the agent's process tree changes is attributed to
    // it. Best effort: a failure is noted only.
    if crate::history::ids::validate_id(input.session.as_bytes()).is_ok()
        && let Some(apid) = agent_pid()
        && let Err(e) = mnt.write_ctl(format!("session {} {apid}", input.session))
    {
        let why = if timed_out(&e) {
            format!("timed out writing {}", mnt.ctl().display())
        } else {
            error_text(&e)
        };
        warn(
            &mut user_msg,
            format!("could not register session {sid} (pid {apid}) with {shown}: {why}"),
        );
    }

    // The per-session counter, in STATE/hooks/ when that can be made.
    let counter_dir = mnt
        .state_dir()
        .ok()
        .filter(|s| !s.as_os_str().is_empty())
        .and_then(|s| crate::state::dir::hooks_dir(&s).ok());
    let counter_name = counter_file_name(agent, &sid);
    let mut n = counter_dir
        .as_ref()
        .and_then(|d| fs::read_to_string(d.join(&counter_name)).ok())
        .map_or(0, |t| parse_counter(&t));

    let stamp = utc_stamp(env.now);
    let mut id = String::new();
    let mut why = String::new();
    for _ in 0..TRIES {
        n += 1;
        id = checkpoint_id(agent, &stamp, &sid, n);
        match mnt.write_ctl(id.clone()) {
            Ok(()) => {
                if let Some(d) = &counter_dir {
                    let _ = crate::state::dir::write_file(
                        d,
                        &counter_name,
                        format!("{n}\n").as_bytes(),
                    );
                }
                return user_msg;
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                why = format!("ids up to {id} are taken");
            }
            Err(e) => {
                why = if timed_out(&e) {
                    format!("timed out writing {}", mnt.ctl().display())
                } else {
                    error_text(&e)
                };
                break;
            }
        }
    }
    warn(
        &mut user_msg,
        format!("checkpoint {id} of {shown} failed: {why}"),
    );
    user_msg
}

/// The mount point of the checkpointfs mount holding `dir`: the innermost mount holding it
/// (after resolving it, within the bound; unresolved if that fails), if that is a
/// checkpointfs mount; and whether resolving it timed out (the mount is then taken as stuck).
fn mount_of(dir: &Path, bound: Duration) -> Option<(PathBuf, bool)> {
    let owned = dir.to_path_buf();
    let (real, stuck) = match bounded(bound, move || fs::canonicalize(owned)) {
        Ok(real) => (real, false),
        Err(e) => (dir.to_path_buf(), timed_out(&e)),
    };
    if !real.is_absolute() {
        return None;
    }
    let table = parse_mountinfo(&fs::read("/proc/self/mountinfo").ok()?);
    innermost_mount(&table, &real)
        .filter(|e| is_checkpointfs_mount(e))
        .map(|e| (e.mount_point.clone(), stuck))
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests write counter files in a temp dir"
)]
mod tests {
    use super::*;

    #[test]
    fn the_input_gives_cwd_and_session_and_nothing_else() {
        let ok = br#"{"session_id": "3f9a1c2b-x", "cwd": "/tmp/p", "prompt": "hi"}"#;
        assert_eq!(
            parse_input(ok),
            HookInput {
                cwd: "/tmp/p".into(),
                session: "3f9a1c2b-x".into()
            }
        );
        // Escapes are decoded, as a JSON parser does.
        assert_eq!(parse_input(br#"{"cwd": "/a\"b\u00e9"}"#).cwd, "/a\"b\u{e9}");
        // Fields that are not strings are empty.
        assert_eq!(
            parse_input(br#"{"session_id": 7, "cwd": ["/x"]}"#),
            HookInput::default()
        );
        for bad in [
            &b""[..],
            b"{\"session_id\": \"x\", \"cwd\": ",
            b"\xff\xfe not json",
            b"\"not an object\"",
            b"[1, 2]",
            b"null",
        ] {
            assert_eq!(parse_input(bad), HookInput::default(), "{bad:?}");
        }
    }

    #[test]
    fn ids_are_prefix_stamp_session_and_a_four_digit_counter() {
        assert_eq!(short_session("3f9a1c2b-0000-4000"), "3f9a1c2b");
        assert_eq!(short_session("a/b c$d"), "abcd");
        assert_eq!(short_session(""), "nosession");
        assert_eq!(short_session("///"), "nosession");
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_735_787_045);
        assert_eq!(utc_stamp(t), "20250102T030405Z");
        assert_eq!(
            checkpoint_id(HookAgent::Claude, "20250102T030405Z", "3f9a1c2b", 7),
            "cc-20250102T030405Z-3f9a1c2b-0007"
        );
        assert_eq!(
            checkpoint_id(HookAgent::Gemini, "20250102T030405Z", "nosession", 12345),
            "gc-20250102T030405Z-nosession-12345"
        );
        let id = checkpoint_id(HookAgent::Claude, &utc_stamp(t), "x", 1);
        assert!(crate::history::ids::validate_id(id.as_bytes()).is_ok());
        assert_eq!(
            counter_file_name(HookAgent::Gemini, "6e3c1a52"),
            "gemini-cli-6e3c1a52.counter"
        );
    }

    #[test]
    fn counter_files_are_read_leniently_and_written_in_state_hooks() {
        assert_eq!(parse_counter("4\n"), 4);
        assert_eq!(parse_counter("0007"), 7);
        assert_eq!(parse_counter(" 1x2 \nextra 99\n"), 12);
        assert_eq!(parse_counter(""), 0);
        assert_eq!(parse_counter("garbage"), 0);
        assert_eq!(parse_counter(&"9".repeat(40)), 0);

        let state = tempfile::tempdir().unwrap();
        let dir = crate::state::dir::hooks_dir(state.path()).unwrap();
        assert_eq!(dir, state.path().join("hooks"));
        assert_eq!(crate::state::dir::hooks_dir(state.path()).unwrap(), dir);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        crate::state::dir::write_file(&dir, "claude-code-x.counter", b"3\n").unwrap();
        assert_eq!(
            parse_counter(&fs::read_to_string(dir.join("claude-code-x.counter")).unwrap()),
            3
        );
        assert!(crate::state::dir::hooks_dir(&state.path().join("missing")).is_err());
    }

    #[test]
    fn messages_are_one_line() {
        assert_eq!(one_line("a\nb\tc\u{7}"), "a b c ");
    }

    #[test]
    fn a_stuck_access_times_out_within_the_bound() {
        let start = std::time::Instant::now();
        let r = bounded(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(5));
            Ok(())
        });
        assert!(r.as_ref().is_err_and(timed_out), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(bounded(Duration::from_secs(5), || Ok(3)).unwrap(), 3);
        let e = bounded::<()>(Duration::from_secs(5), || {
            Err(io::Error::from_raw_os_error(libc::EEXIST))
        })
        .unwrap_err();
        assert!(!timed_out(&e));
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    }

    #[test]
    fn outside_any_checkpointfs_mount_nothing_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let env = HookEnv {
            project_dir: None,
            cwd: Some(dir.path().to_path_buf()),
            now: SystemTime::now(),
            bound: BOUND,
        };
        let input = format!(
            r#"{{"session_id": "s", "cwd": "{}"}}"#,
            dir.path().display()
        );
        assert_eq!(run(HookAgent::Gemini, input.as_bytes(), &env), None);
        assert_eq!(run(HookAgent::Claude, b"not json", &env), None);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
