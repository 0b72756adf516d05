//! `checkpointfs status`: where the history is, how big it is, what is excluded from it, and
//! for one path whether and why it is tracked. One [`StatusReport`] gives both the text and
//! the JSON (`checkpointfs.status/1`, documented in docs/json-output.md), both rendered by
//! [`crate::cli::render`], so the two always carry the same facts.
use std::fmt::Write as _;
use std::io;
use std::os::unix::ffi::OsStrExt;

use serde::{Deserialize, Serialize};

use super::History;
use super::exclusions::{ExcludeFile, Verdict};
use super::logdiff::Timestamp;
use super::quote::{quote_bytes, quote_name, quote_pattern};
use crate::transcript::record::EntryKind;

pub const STATUS_SCHEMA: &str = "checkpointfs.status/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReport {
    pub schema: String,
    /// Whether a daemon serves the state dir (else it was read directly).
    pub mounted: bool,
    pub daemon_pid: Option<u32>,
    pub state_dir: String,
    pub source: String,
    pub checkpoints: CheckpointSummary,
    pub tracked_paths: usize,
    pub changed_since_last_checkpoint: usize,
    pub store: StoreUsage,
    pub pending_copies: usize,
    pub exclusions: ExclusionSummary,
    /// How reads and writes are served; known only when a daemon answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<IoMode>,
    /// What users other than the owner may cost the state dir, and have; known only when a
    /// daemon answers (see `history::budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_users: Option<crate::history::budget::OtherUsers>,
    /// The answer for `--path`.
    pub path: Option<PathStatus>,
    /// The push to the mount's remote, when it has one and a daemon answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteStatus>,
}

/// How far the push to the remote is behind (docs/remote-format.md). Filled by the
/// daemon's push worker; it never holds credentials (the URL cannot carry any).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteStatus {
    pub url: String,
    /// This state dir's session name in the remote.
    pub session: String,
    /// The newest checkpoint in the remote, by id.
    pub pushed_through: Option<String>,
    /// Kept checkpoints not yet in the remote.
    pub unpushed_checkpoints: usize,
    /// Bytes uploaded since the daemon started.
    pub uploaded_bytes: u64,
    /// The last attempt's error, until an attempt succeeds.
    pub last_error: Option<String>,
}

/// How a live mount serves file reads and writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IoMode {
    /// Kernel FUSE passthrough: the kernel reads and writes the backing files itself.
    pub kernel_passthrough: bool,
    /// Why kernel passthrough is off (`null` while it is on).
    pub passthrough_off_reason: Option<String>,
    /// The uid the daemon runs as (0: mounted with mount(2); else through fusermount3).
    pub daemon_uid: u32,
    /// The normal user a root daemon mounts for (`--owner`), or `null`.
    pub owner_uid: Option<u32>,
    /// The kernel mount options the mount was made with (`-o`), every setting spelled out.
    pub mount_options: String,
    /// The mount is read-only now: `-o ro`, or a later `mount -o remount,ro`.
    pub read_only: bool,
    /// What FUSE requests travel over: "io_uring (N queues, ...)" or "/dev/fuse (why not
    /// io_uring)". Absent from daemons before it was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    /// FUSE over io_uring is in use.
    #[serde(default)]
    pub io_uring: bool,
    /// FUSE requests the daemon has served since it started, by opcode (`LOOKUP`: n); a
    /// benchmark reads it before and after an operation to count the requests it sent.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub requests: std::collections::BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointSummary {
    pub count: usize,
    pub latest: Option<CheckpointRef>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointRef {
    pub id: String,
    /// `time` and `time_unix_ns`, as in `log --json`.
    #[serde(flatten)]
    pub time: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoreUsage {
    pub objects: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExclusionSummary {
    pub exclude: Vec<String>,
    pub exclude_from: Vec<ExcludeFile>,
    pub respect_gitignore: bool,
    /// The ignore files in effect (with `respect_gitignore`): `.gitignore` files relative to
    /// the mount root, `.git/info/exclude`, the global file (absolute).
    pub ignore_files: Vec<String>,
    pub global_excludes_file: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathStatus {
    /// Relative to the mount root.
    pub path: String,
    pub exists: bool,
    pub is_dir: bool,
    /// Whether a change of the path is (would be) backed up.
    pub tracked: bool,
    pub reason: Reason,
    /// Versions in the history (0: never backed up).
    pub versions: usize,
    /// The latest checkpoint: Layer 1 backups made now belong to this message.
    pub current_message: Option<String>,
    /// Whether the path was backed up since the latest checkpoint (changed in this message).
    pub backup_in_current_message: bool,
    /// The human line, as `status --path` prints it.
    pub text: String,
}

/// The rule behind a path's verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reason {
    /// `none` (no rule applies), `git-dir`, `exclude`, `exclude-from`, `gitignore`,
    /// `gitignore-negation`.
    pub kind: String,
    /// `--exclude`, the `--exclude-from` file, or the ignore file.
    pub source: Option<String>,
    pub line: Option<usize>,
    pub pattern: Option<String>,
    /// The excluded ancestor directory, when the rule matched it rather than the path.
    pub parent: Option<String>,
}

impl Reason {
    fn of(v: &Verdict) -> Reason {
        let none = Reason {
            kind: "none".into(),
            source: None,
            line: None,
            pattern: None,
            parent: None,
        };
        match v {
            Verdict::Tracked => none,
            Verdict::GitDir => Reason {
                kind: "git-dir".into(),
                ..none
            },
            Verdict::Glob { pattern, file } => Reason {
                kind: if file.is_some() {
                    "exclude-from".into()
                } else {
                    "exclude".into()
                },
                source: Some(match file {
                    Some(f) => f.display().to_string(),
                    None => "--exclude".to_string(),
                }),
                pattern: Some(pattern.clone()),
                ..none
            },
            Verdict::Ignored { rule, parent } => Reason {
                kind: "gitignore".into(),
                source: Some(rule.file.clone()),
                line: Some(rule.line),
                pattern: Some(rule.pattern.clone()),
                parent: parent.clone(),
            },
            Verdict::Negated { rule } => Reason {
                kind: "gitignore-negation".into(),
                source: Some(rule.file.clone()),
                line: Some(rule.line),
                pattern: Some(rule.pattern.clone()),
                parent: None,
            },
        }
    }
}

/// `P: tracked`, `P: excluded by sub/.gitignore:3 'build/'`, … (git check-ignore's
/// `file:line` form for rules).
fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Tracked => "tracked".to_string(),
        Verdict::GitDir => {
            "tracked (in the git directory, where ignore rules do not apply)".to_string()
        }
        Verdict::Glob {
            pattern,
            file: None,
        } => format!("excluded by --exclude {}", quote_pattern(pattern)),
        Verdict::Glob {
            pattern,
            file: Some(f),
        } => format!(
            "excluded by --exclude-from {} {}",
            quote_bytes(f.as_os_str().as_bytes()),
            quote_pattern(pattern)
        ),
        Verdict::Ignored { rule, parent } => {
            let mut s = format!(
                "excluded by {}:{} {}",
                quote_name(&rule.file),
                rule.line,
                quote_pattern(&rule.pattern)
            );
            if let Some(parent) = parent {
                let _ = write!(s, " (matches its parent directory {})", quote_name(parent));
            }
            s
        }
        Verdict::Negated { rule } => format!(
            "not excluded by {}:{} {} (negation) — tracked",
            quote_name(&rule.file),
            rule.line,
            quote_pattern(&rule.pattern)
        ),
    }
}

impl History {
    /// The status of this history; with `path` (relative to the mount root), why that
    /// path is or is not tracked. `path_is_dir`: what to assume for a path that does not
    /// exist (`P/` was given); otherwise it is looked up. `mounted`/`daemon_pid` are the
    /// caller's to fill in.
    pub fn status_report(
        &self,
        path: Option<&str>,
        path_is_dir: Option<bool>,
    ) -> io::Result<StatusReport> {
        let checkpoints = self.checkpoints();
        let (tracked_paths, changed) = {
            let st = self.lock();
            (st.paths.len(), st.dirty_paths.len())
        };
        let latest = checkpoints.last().map(|c| CheckpointRef {
            id: c.id.clone(),
            time: Timestamp::of(c.time),
        });
        let config = self.exclusions().config();
        let exclusions = ExclusionSummary {
            exclude: config.exclude.clone(),
            exclude_from: config.exclude_from.clone(),
            respect_gitignore: config.respect_gitignore,
            ignore_files: self.exclusions().ignore_files(),
            global_excludes_file: self
                .exclusions()
                .global_excludes_file()
                .map(|p| p.display().to_string()),
        };
        let path = match path {
            Some(p) => Some(self.path_status(p, path_is_dir)?),
            None => None,
        };
        Ok(StatusReport {
            schema: STATUS_SCHEMA.to_string(),
            mounted: false,
            daemon_pid: None,
            state_dir: self.state_dir().display().to_string(),
            source: self.source().display().to_string(),
            checkpoints: CheckpointSummary {
                count: checkpoints.len(),
                latest,
            },
            tracked_paths,
            changed_since_last_checkpoint: changed,
            store: StoreUsage {
                objects: self.store().list()?.len(),
                bytes: self.store().total_size()?,
            },
            pending_copies: self.pending_copies(),
            exclusions,
            io: None,
            other_users: self.budgets().status(),
            path,
            remote: None,
        })
    }

    fn path_status(&self, rel: &str, is_dir_hint: Option<bool>) -> io::Result<PathStatus> {
        let rel = rel.trim_matches('/');
        let meta = self.current_meta(rel)?;
        let exists = meta.is_some();
        let is_dir = match &meta {
            Some(m) => m.kind == EntryKind::Dir,
            None => is_dir_hint.unwrap_or(false),
        };
        let verdict = self.exclusion_verdict(rel, Some(is_dir));
        let (versions, dirty) = self
            .lock()
            .paths
            .get(rel)
            .map_or((0, false), |h| (h.versions.len(), h.dirty));
        let current_message = self.checkpoints().last().map(|c| c.id.clone());
        let message = match &current_message {
            Some(id) => format!("the current message '{id}'"),
            None => "the current message (before the first checkpoint)".to_string(),
        };
        let history = match versions {
            0 => String::new(),
            1 => "; 1 version in the history".to_string(),
            n => format!("; {n} versions in the history"),
        };
        let backup = if dirty {
            format!("backed up in {message}{history}")
        } else if !exists && versions == 0 {
            "does not exist".to_string()
        } else {
            format!("no backup in {message}{history}")
        };
        // The text quotes names (`path` has the name as it is).
        let shown = if rel.is_empty() {
            ".".into()
        } else {
            quote_name(rel)
        };
        // Format 4: an excluded name where a rename moved tracked content is recorded (views
        // of older checkpoints resolve to it) until gc drops that rename.
        let moved_here = verdict.is_excluded() && self.lock().renames.moved_content_to(rel);
        let why = match moved_here {
            true => format!(
                "{}, but tracked: a rename in the history moved tracked content here (until gc \
                 drops it)",
                verdict_text(&verdict)
            ),
            false => verdict_text(&verdict),
        };
        let text = format!("{shown}: {why}; {backup}");
        Ok(PathStatus {
            path: rel.to_string(),
            exists,
            is_dir,
            tracked: !verdict.is_excluded() || moved_here,
            reason: Reason::of(&verdict),
            versions,
            current_message,
            backup_in_current_message: dirty,
            text,
        })
    }
}
