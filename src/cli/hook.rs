//! `checkpointfs hook claude|gemini`: the agents' checkpoint-per-prompt hook
//! ([`crate::mount::hook`] does the work). What only the command line does: the arguments
//! (never refused: a hook must not fail the prompt), `--help`, and the stdout contract —
//! nothing for Claude Code (which would add it to the prompt), exactly one JSON object for
//! Gemini CLI (`{}`, or `{"systemMessage": ...}` when the checkpoint failed in a mount).
//! The exit status is always 0, even if the work panics.
use std::ffi::OsString;
use std::io::Write;

use crate::mount::hook::{self, HookAgent, HookEnv};

const CLAUDE_USAGE: &str = "\
usage: checkpointfs hook claude   (reads Claude Code's hook JSON on stdin)
       mount-scripts/claude-code-hook runs it

A Claude Code UserPromptSubmit hook. Install it with `checkpointfs install-hook claude` or
mount-scripts/claude-code-settings.json (see docs/usage.md). For each prompt it reads the
hook input
  {\"session_id\": ..., \"transcript_path\": ..., \"cwd\": ..., \"hook_event_name\": ..., \"prompt\": ...}
finds the checkpointfs mount holding \"cwd\" (else $CLAUDE_PROJECT_DIR, else its own cwd),
registers the session there (the agent process, its nearest non-shell ancestor, and all its
descendants: `session ID PID` to ctl) and takes a checkpoint there, named
  cc-<UTC yyyymmddTHHMMSSZ>-<first 8 chars of session_id>-<prompt counter, 4 digits>
e.g. cc-20250102T030405Z-3f9a1c2b-0007 — unique, and sorted in prompt order. The counter is
kept per session in STATE/hooks/ (STATE = the mount's state dir); an id that is taken anyway
is retried with the next counter.

It never blocks or fails the prompt: it always exits 0, writes nothing on stdout (which
Claude Code would add to the prompt), bounds every access to the mount to 5 s, and prints a
one-line note on stderr when there is no mount or the checkpoint fails.
";

const GEMINI_USAGE: &str = "\
usage: checkpointfs hook gemini   (reads Gemini CLI's hook JSON on stdin)
       mount-scripts/gemini-cli-hook runs it

A Gemini CLI BeforeAgent hook (it fires once per user prompt, before the agent acts). Install
it with `checkpointfs install-hook gemini [--user | --project DIR]` (see docs/usage.md). For
each prompt it reads the hook input
  {\"session_id\": ..., \"transcript_path\": ..., \"cwd\": ..., \"hook_event_name\": \"BeforeAgent\",
   \"timestamp\": ..., \"prompt\": ...}
finds the checkpointfs mount holding \"cwd\" (else $GEMINI_PROJECT_DIR, else its own cwd),
registers the session there (the agent process, its nearest non-shell ancestor, and all its
descendants: `session ID PID` to ctl) and takes a checkpoint there, named
  gc-<UTC yyyymmddTHHMMSSZ>-<first 8 chars of session_id>-<prompt counter, 4 digits>
e.g. gc-20250102T030405Z-3f9a1c2b-0007 — unique, and sorted in prompt order. The counter is
kept per session in STATE/hooks/ (STATE = the mount's state dir), so a resumed session
(`gemini --resume`) continues it; an id that is taken anyway is retried with the next one.

It never blocks or fails the prompt: it always exits 0 and prints exactly one JSON object on
stdout, as Gemini CLI requires: {} — or {\"systemMessage\": \"gemini-cli-hook: ...\"} when the
checkpoint fails in a mount, which Gemini CLI shows to the user. It bounds every access to
the mount to 5 s; other notes (no mount here) go to stderr only.
";

fn is_help(a: &OsString) -> bool {
    a == "-h" || a == "--help"
}

/// Runs the hook for `agent` (`claude` or `gemini`; anything else is noted and taken as
/// `claude`, as the script did), with `rest` the arguments after it. Always 0.
pub fn run(agent: Option<&OsString>, rest: &[OsString]) -> i32 {
    let name = agent.map(|a| a.to_string_lossy().into_owned());
    let chosen = name.as_deref().and_then(HookAgent::from_name);
    if agent.is_some_and(is_help) || rest.first().is_some_and(is_help) {
        let usage = match chosen {
            Some(HookAgent::Gemini) => GEMINI_USAGE,
            _ => CLAUDE_USAGE,
        };
        let _ = std::io::stdout().write_all(usage.as_bytes());
        return 0;
    }
    let agent = chosen.unwrap_or_else(|| {
        eprintln!(
            "checkpointfs hook: unknown agent '{}' (claude or gemini); taken as claude",
            name.as_deref().unwrap_or_default()
        );
        HookAgent::Claude
    });
    if let Some(extra) = rest.first() {
        eprintln!(
            "{}: unexpected argument '{}' (see --help); ignored",
            agent.me(),
            extra.to_string_lossy()
        );
    }
    let user_msg = std::panic::catch_unwind(|| {
        let input = hook::read_stdin(hook::BOUND);
        hook::run(agent, &input, &HookEnv::from_process(agent))
    })
    .unwrap_or_else(|_| Some(format!("{}: failed unexpectedly (see stderr)", agent.me())));
    if agent == HookAgent::Gemini {
        let answer = match user_msg {
            Some(msg) => format!(
                "{{\"systemMessage\": {}}}\n",
                serde_json::Value::String(hook::one_line(&msg))
            ),
            None => "{}\n".to_string(),
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(answer.as_bytes());
        let _ = out.flush();
    }
    0
}
