//! `checkpointfs install-hook AGENT`: puts the checkpoint-per-prompt hook into an agent's
//! settings file, or takes it out again.
//!
//! Contract:
//! - The settings file is edited as JSON (serde_json, key order kept), never as text: every
//!   other setting and every other hook stays exactly as it was.
//! - Idempotent: installing twice leaves one entry (a moved script is updated in place).
//!   Our entries are recognised by the script's file name, so `--remove` also finds one
//!   installed from another checkout.
//! - Atomic: the new file is written next to the old one, synced, and renamed over it (the
//!   one atomic write, `crate::state::atomic`), so a crash leaves the old or the new file,
//!   never a mix. A symlinked settings file (dotfile managers) is edited at its target and
//!   stays a symlink.
//! - A file that is not a JSON object is refused with a clear error and left untouched.
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// An agent whose prompts a hook can checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Agent {
    /// Claude Code: a `UserPromptSubmit` hook in `.claude/settings.json`
    Claude,
    /// Gemini CLI: a `BeforeAgent` hook in `.gemini/settings.json`
    Gemini,
}

impl Agent {
    /// The directory holding the settings file, in HOME (user) or a project.
    fn settings_dir(self) -> &'static str {
        match self {
            Agent::Claude => ".claude",
            Agent::Gemini => ".gemini",
        }
    }

    /// The hook event that fires once per user prompt, before the agent acts on it.
    fn event(self) -> &'static str {
        match self {
            Agent::Claude => "UserPromptSubmit",
            Agent::Gemini => "BeforeAgent",
        }
    }

    /// The script in mount-scripts/ that takes the checkpoint.
    pub fn script_name(self) -> &'static str {
        match self {
            Agent::Claude => "claude-code-hook",
            Agent::Gemini => "gemini-cli-hook",
        }
    }

    /// Our hook configuration. The scripts bound their own work to a few seconds; the
    /// agent's timeout (seconds for Claude Code, milliseconds for Gemini CLI) is the backstop.
    fn hook_config(self, command: &str) -> Value {
        match self {
            Agent::Claude => json!({ "type": "command", "command": command, "timeout": 10 }),
            Agent::Gemini => json!({
                "name": "checkpointfs",
                "type": "command",
                "command": command,
                "timeout": 10000,
            }),
        }
    }
}

/// Where the settings file is.
#[derive(Debug, Clone)]
pub enum Scope {
    /// `~/.claude/settings.json` (or `.gemini`): every session of the user, started
    /// anywhere — the hook itself does nothing outside a checkpointfs mount.
    User { home: PathBuf },
    /// `DIR/.claude/settings.json`: sessions started in DIR.
    Project(PathBuf),
}

impl Scope {
    pub fn settings_file(&self, agent: Agent) -> PathBuf {
        let base = match self {
            Scope::User { home } => home,
            Scope::Project(dir) => dir,
        };
        base.join(agent.settings_dir()).join("settings.json")
    }
}

/// What [`install`] or [`remove`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Installed,
    /// An entry of ours pointed elsewhere; it now points at the given script.
    Updated,
    AlreadyInstalled,
    Removed(usize),
    NotInstalled,
}

/// Finds the agent's hook script: `CHECKPOINTFS_SCRIPTS`, then the mount-scripts/ of the
/// checkout this binary was built in (`target/release/../../mount-scripts`), then the
/// installed locations.
pub fn find_script(agent: Agent) -> io::Result<PathBuf> {
    let name = agent.script_name();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("CHECKPOINTFS_SCRIPTS") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe().and_then(fs::canonicalize)
        && let Some(bin_dir) = exe.parent()
    {
        dirs.push(bin_dir.join("../../mount-scripts"));
        dirs.push(bin_dir.join("../share/checkpointfs/mount-scripts"));
    }
    dirs.push("/usr/local/share/checkpointfs/mount-scripts".into());
    dirs.push("/usr/share/checkpointfs/mount-scripts".into());
    for d in &dirs {
        let candidate = d.join(name);
        if let Ok(meta) = fs::metadata(&candidate)
            && meta.is_file()
            && meta.permissions().mode() & 0o111 != 0
        {
            return fs::canonicalize(candidate);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "cannot find the {name} script (looked in: {}); pass --hook PATH or set \
             CHECKPOINTFS_SCRIPTS to the mount-scripts directory",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// Whether a hook configuration is ours: its command runs a script with our script's name.
fn is_ours(hook: &Value, script_name: &str) -> bool {
    hook.get("command")
        .and_then(Value::as_str)
        .and_then(|c| c.split_whitespace().next())
        .is_some_and(|program| Path::new(program).file_name() == Some(script_name.as_ref()))
}

fn invalid(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}: {what}; it was left as it is (fix it, or move it away, and run this again)",
            path.display()
        ),
    )
}

/// The settings as a JSON object (empty if the file does not exist).
fn read_settings(path: &Path) -> io::Result<Map<String, Value>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(e) => {
            return Err(crate::sys::context(
                format!("cannot read {}", path.display()),
                e,
            ));
        }
    };
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid(path, "it is JSON but not an object")),
        Err(e) => Err(invalid(path, &format!("it is not valid JSON ({e})"))),
    }
}

/// `settings.hooks.<event>` as a mutable array, created if missing.
fn event_groups<'a>(
    settings: &'a mut Map<String, Value>,
    event: &str,
    path: &Path,
) -> io::Result<&'a mut Vec<Value>> {
    let hooks = settings
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| invalid(path, "its \"hooks\" is not an object"))?;
    hooks
        .entry(event)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| invalid(path, &format!("its \"hooks\".\"{event}\" is not an array")))
}

/// Installs the hook running `script` into `settings_file`.
pub fn install(agent: Agent, settings_file: &Path, script: &Path) -> io::Result<Outcome> {
    let target = resolve_symlink(settings_file)?;
    let mut settings = read_settings(&target)?;
    let command = script.to_string_lossy().into_owned();
    let groups = event_groups(&mut settings, agent.event(), &target)?;
    let mut outcome = Outcome::Installed;
    for group in groups.iter_mut() {
        let Some(hooks) = group.get_mut("hooks").and_then(Value::as_array_mut) else {
            continue;
        };
        for hook in hooks.iter_mut() {
            if is_ours(hook, agent.script_name()) {
                if hook.get("command").and_then(Value::as_str) == Some(command.as_str()) {
                    return Ok(Outcome::AlreadyInstalled);
                }
                *hook = agent.hook_config(&command);
                outcome = Outcome::Updated;
            }
        }
    }
    if outcome == Outcome::Installed {
        groups.push(json!({ "hooks": [agent.hook_config(&command)] }));
    }
    write_atomically(&target, &settings)?;
    Ok(outcome)
}

/// Removes every hook of ours from `settings_file`, and the groups and keys that held only
/// them.
pub fn remove(agent: Agent, settings_file: &Path) -> io::Result<Outcome> {
    let target = resolve_symlink(settings_file)?;
    if !target.exists() {
        return Ok(Outcome::NotInstalled);
    }
    let mut settings = read_settings(&target)?;
    let event = agent.event();
    let Some(hooks) = settings.get_mut("hooks").and_then(Value::as_object_mut) else {
        return Ok(Outcome::NotInstalled);
    };
    let Some(groups) = hooks.get_mut(event).and_then(Value::as_array_mut) else {
        return Ok(Outcome::NotInstalled);
    };
    let mut removed = 0;
    groups.retain_mut(|group| {
        let Some(list) = group.get_mut("hooks").and_then(Value::as_array_mut) else {
            return true;
        };
        let before = list.len();
        list.retain(|h| !is_ours(h, agent.script_name()));
        removed += before - list.len();
        // A group that held only our hooks goes with them; one that was already empty stays.
        !(list.is_empty() && before > 0)
    });
    if removed == 0 {
        return Ok(Outcome::NotInstalled);
    }
    if groups.is_empty() {
        hooks.remove(event);
    }
    if hooks.is_empty() {
        settings.remove("hooks");
    }
    write_atomically(&target, &settings)?;
    Ok(Outcome::Removed(removed))
}

/// The file a settings path names: itself, or the target of a symlink (so the symlink stays).
fn resolve_symlink(path: &Path) -> io::Result<PathBuf> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} is a symlink whose target cannot be resolved: {e}",
                    path.display()
                ),
            )
        }),
        _ => Ok(path.to_path_buf()),
    }
}

/// Writes `settings` to `path`, atomically and durably (`crate::state::atomic`: a crash
/// leaves the old file or the new one), with the old file's mode (0600 for a new one:
/// settings may hold tokens). Creates the agent's directory first if it is missing.
#[allow(
    clippy::disallowed_methods,
    reason = "creates the agent's settings directory (~/.claude, ...), never SRC"
)]
fn write_atomically(path: &Path, settings: &Map<String, Value>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(dir)
        .map_err(|e| crate::sys::context(format!("cannot create {}", dir.display()), e))?;
    let mode = fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o7777);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file name", path.display()),
        )
    })?;
    let mut text = serde_json::to_string_pretty(&Value::Object(settings.clone()))?;
    text.push('\n');
    crate::state::atomic::write(dir, name, text.as_bytes(), mode)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests write agents' settings files directly, as the agents and users do"
)]
mod tests {
    use super::*;

    fn settings_with_other_hooks(dir: &Path) -> PathBuf {
        let path = dir.join("settings.json");
        fs::write(
            &path,
            r#"{
  "model": "opus",
  "permissions": { "allow": ["Bash(ls)"] },
  "hooks": {
    "UserPromptSubmit": [
      { "hooks": [ { "type": "command", "command": "/usr/bin/notify-send prompt" } ] }
    ],
    "PreToolUse": [
      { "matcher": "Bash", "hooks": [ { "type": "command", "command": "audit" } ] }
    ]
  }
}
"#,
        )
        .unwrap();
        path
    }

    #[test]
    fn install_twice_then_remove_leaves_other_settings_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let path = settings_with_other_hooks(dir.path());
        let original: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let script = Path::new("/opt/cpfs/mount-scripts/claude-code-hook");

        assert_eq!(
            install(Agent::Claude, &path, script).unwrap(),
            Outcome::Installed
        );
        let once = fs::read_to_string(&path).unwrap();
        assert_eq!(
            install(Agent::Claude, &path, script).unwrap(),
            Outcome::AlreadyInstalled
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            once,
            "second install changed it"
        );
        let v: Value = serde_json::from_str(&once).unwrap();
        let groups = v["hooks"]["UserPromptSubmit"].as_array().unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0], original["hooks"]["UserPromptSubmit"][0]);
        assert_eq!(
            groups[1]["hooks"][0]["command"],
            "/opt/cpfs/mount-scripts/claude-code-hook"
        );
        assert_eq!(v["hooks"]["PreToolUse"], original["hooks"]["PreToolUse"]);
        assert_eq!(v["model"], "opus");
        // Key order is kept: the file still starts with "model".
        assert!(once.trim_start().starts_with("{\n  \"model\""), "{once}");

        // A moved checkout: the entry is updated, not duplicated.
        let moved = Path::new("/home/me/cpfs/mount-scripts/claude-code-hook");
        assert_eq!(
            install(Agent::Claude, &path, moved).unwrap(),
            Outcome::Updated
        );
        let v: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["hooks"]["UserPromptSubmit"].as_array().unwrap().len(), 2);

        assert_eq!(remove(Agent::Claude, &path).unwrap(), Outcome::Removed(1));
        let v: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v, original);
        assert_eq!(remove(Agent::Claude, &path).unwrap(), Outcome::NotInstalled);
    }

    #[test]
    fn a_new_file_gets_only_the_hook_and_remove_takes_the_hooks_key_away() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".gemini/settings.json");
        let script = Path::new("/x/gemini-cli-hook");
        assert_eq!(
            install(Agent::Gemini, &path, script).unwrap(),
            Outcome::Installed
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let v: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"hooks": {"BeforeAgent": [{"hooks": [{
                "name": "checkpointfs", "type": "command",
                "command": "/x/gemini-cli-hook", "timeout": 10000
            }]}]}})
        );
        assert_eq!(remove(Agent::Gemini, &path).unwrap(), Outcome::Removed(1));
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}\n");
    }

    #[test]
    fn bad_files_are_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new("/x/claude-code-hook");
        for bad in [
            "{ not json",
            "[1, 2]",
            r#"{"hooks": []}"#,
            r#"{"hooks": {"UserPromptSubmit": {}}}"#,
        ] {
            let path = dir.path().join("settings.json");
            fs::write(&path, bad).unwrap();
            let err = install(Agent::Claude, &path, script).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{bad}: {err}");
            assert!(err.to_string().contains("left as it is"), "{err}");
            assert_eq!(fs::read_to_string(&path).unwrap(), bad);
        }
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a temp file was left behind"
        );
    }

    #[test]
    fn a_symlinked_settings_file_is_edited_at_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let real = settings_with_other_hooks(dir.path());
        let link_dir = dir.path().join(".claude");
        fs::create_dir(&link_dir).unwrap();
        let link = link_dir.join("settings.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        install(Agent::Claude, &link, Path::new("/x/claude-code-hook")).unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            fs::read_to_string(&real)
                .unwrap()
                .contains("/x/claude-code-hook")
        );
    }
}
