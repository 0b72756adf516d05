//! `STATE/settings.json`: the mount settings kept with the history, so that every mount of
//! one state dir treats paths the same way. Exclusions are such a setting: a path excluded
//! at one mount and tracked at the next would have a history with holes that nothing
//! explains. A mount that gives no exclusion flags uses the saved ones; flags given replace
//! the saved value of that setting (see `checkpointfs mount --help`).
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::history::exclusions::ExclusionConfig;

pub const SETTINGS_FILE: &str = "settings.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default)]
    pub exclusions: ExclusionConfig,
    /// `--other-users-budget`, once given (absent: the default, see `budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_users_budget: Option<crate::history::budget::OthersBudget>,
    /// `--remote URL` / `checkpointfs remote set`: where checkpoints are pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteSetting>,
}

/// A mount's remote: its URL (which never holds credentials: a URL with any is refused
/// before it is saved) and the repository key file (kept outside the state dir).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSetting {
    pub url: String,
    pub key_file: std::path::PathBuf,
}

/// The settings saved in `state_dir`, `None` if there are none yet (a state dir made
/// before settings were saved, or never mounted). A file that cannot be read or parsed is
/// an error naming it: guessing could track what the user excluded, or the reverse.
pub fn load(state_dir: &Path) -> Result<Option<Settings>, String> {
    let path = state_dir.join(SETTINGS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        format!(
            "{} is not valid ({e}); fix it, or delete it and give the exclusion flags again",
            path.display()
        )
    })
}

/// Saves `settings` in `state_dir`, atomically and durably (`crate::state::atomic`).
pub fn save(state_dir: &Path, settings: &Settings) -> io::Result<()> {
    let mut text = serde_json::to_vec_pretty(settings)?;
    text.push(b'\n');
    crate::state::dir::write_file(state_dir, SETTINGS_FILE, &text)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "a test writes a corrupt settings file directly, as a user could"
)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_absence_is_none() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(d.path()), Ok(None));
        let s = Settings {
            exclusions: ExclusionConfig {
                exclude: vec!["target".into()],
                exclude_from: Vec::new(),
                respect_gitignore: true,
            },
            other_users_budget: Some("10,1M".parse().unwrap()),
            remote: Some(RemoteSetting {
                url: "s3://bucket/prefix".into(),
                key_file: "/root/.config/checkpointfs/remote.key".into(),
            }),
        };
        save(d.path(), &s).unwrap();
        assert_eq!(load(d.path()), Ok(Some(s)));
    }

    #[test]
    fn a_corrupt_settings_file_is_an_error_naming_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(SETTINGS_FILE), "{ nope").unwrap();
        let err = load(d.path()).unwrap_err();
        assert!(err.contains("settings.json is not valid"), "{err}");
    }
}
