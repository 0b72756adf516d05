//! A merge's outcome for people (text) and programs (JSON), and the commands that resolve
//! each conflict.
//!
//! The commands work on the mounted trees: the main tree at `MNT/PATH`, the branch at
//! `MNT/.checkpoint/branches/NAME/PATH`. Each makes the two sides agree on the path one way
//! ("take the branch's" copies the branch's entry over main's; "keep main's" copies main's
//! into the branch), after which the path is "the same change on both sides" and the merge
//! runs again cleanly for it. Text conflicts also offer `--conflicts markers`.
use std::path::Path;

use serde::Serialize;

use super::{
    Change, Conflict, ConflictKind, ConflictMode, MergeError, MergeOutcome, NodeKind, Planner,
    Resolution, Side, branch_path, tree::joined,
};
use crate::history::quote::{quote_bytes, quote_name, shell_word};

fn word(p: &Path) -> String {
    shell_word(&p.to_string_lossy())
}

/// `cp` of `from` over `to` (whatever `to` is now), making `to`'s parent first if it is
/// missing (`mkdir_parent`).
fn copy_over(from: &Path, to: &Path, mkdir_parent: bool) -> String {
    let mut cmd = String::new();
    if mkdir_parent && let Some(p) = to.parent() {
        cmd.push_str(&format!("mkdir -p -- {} && ", word(p)));
    }
    cmd.push_str(&format!(
        "rm -rf -- {to} && cp -a -- {} {to}",
        word(from),
        to = word(to)
    ));
    cmd
}

/// The commands that resolve `c`.
pub(super) fn resolutions(
    planner: &mut Planner<'_>,
    c: &Conflict,
) -> Result<Vec<Resolution>, MergeError> {
    let input = planner.input;
    let (mnt, name) = (input.mount, input.branch);
    let ours = joined(mnt, &c.path);
    let theirs = branch_path(mnt, name, &c.path);
    let mut out = Vec::new();
    if let ConflictKind::GitRef { repository, .. } = &c.kind {
        let repo = joined(mnt, super::parent_of(repository).unwrap_or(""));
        out.push(Resolution {
            action: format!("rename main's branch {name} out of the way, then merge again"),
            command: format!(
                "git -C {} branch -m {} {}",
                word(&repo),
                shell_word(name),
                shell_word(&format!("{name}-main"))
            ),
        });
        return Ok(out);
    }
    if c.kind.is_text() {
        out.push(Resolution {
            action: "write git-style conflict markers into main's file, to edit".to_string(),
            command: format!(
                "checkpointfs branch merge {} {} --conflicts markers",
                word(mnt),
                shell_word(name)
            ),
        });
    }
    if let ConflictKind::Mode { ours: o, theirs: t } = c.kind {
        out.push(Resolution {
            action: format!("take the branch's mode ({t:04o})"),
            command: format!("chmod {t:04o} -- {}", word(&ours)),
        });
        out.push(Resolution {
            action: format!("keep main's mode ({o:04o})"),
            command: format!("chmod {o:04o} -- {}", word(&theirs)),
        });
        return Ok(out);
    }
    let parent = super::parent_of(&c.path).unwrap_or("");
    let n = planner.nodes(&c.path)?;
    let ours_parent_missing = !parent.is_empty()
        && planner
            .nodes(parent)?
            .ours
            .is_none_or(|p| p.kind != NodeKind::Dir);
    let theirs_parent_missing = !parent.is_empty()
        && planner
            .nodes(parent)?
            .theirs
            .is_none_or(|p| p.kind != NodeKind::Dir);
    out.push(Resolution {
        action: "take the branch's version".to_string(),
        command: match n.theirs {
            Some(_) => copy_over(&theirs, &ours, ours_parent_missing),
            None => format!("rm -rf -- {}", word(&ours)),
        },
    });
    out.push(Resolution {
        action: "keep main's version".to_string(),
        command: match n.ours {
            Some(_) => copy_over(&ours, &theirs, theirs_parent_missing),
            None => format!("rm -rf -- {}", word(&theirs)),
        },
    });
    Ok(out)
}

/// One line of the plan, for people.
fn describe(c: &Change) -> String {
    match c {
        Change::Remove { path, .. } => format!("remove   {}", quote_name(path)),
        Change::Create { path, node, .. } => {
            format!("create   {} ({})", quote_name(path), node.kind.name())
        }
        Change::Rewrite { path, .. } => format!("write    {}", quote_name(path)),
        Change::Chmod { path, mode } => format!("chmod    {} (mode {mode:04o})", quote_name(path)),
    }
}

/// The outcome as text: the plan, then each conflict with its hunks and commands.
pub fn render_text(outcome: &MergeOutcome, branch: &str, mode: ConflictMode) -> String {
    let mut out = String::new();
    let n = outcome.conflicts.len();
    if outcome.refused {
        out.push_str(&format!(
            "merge of {branch} refused: {n} conflict{}; nothing changed\n",
            if n == 1 { "" } else { "s" }
        ));
        if mode == ConflictMode::Markers {
            out.push_str("(only text conflicts can be written as markers)\n");
        }
    } else {
        out.push_str(&format!(
            "merge of {branch}: {} change{}",
            outcome.plan.changes.len(),
            if outcome.plan.changes.len() == 1 {
                ""
            } else {
                "s"
            }
        ));
        if n > 0 {
            out.push_str(&format!(
                ", {n} conflict{} written as markers",
                if n == 1 { "" } else { "s" }
            ));
        }
        out.push('\n');
        for c in &outcome.plan.changes {
            out.push_str(&format!("  {}\n", describe(c)));
        }
    }
    for c in &outcome.conflicts {
        out.push_str(&format!(
            "\nCONFLICT {}: {}\n",
            quote_name(&c.path),
            c.kind.describe(branch)
        ));
        for h in &c.hunks {
            out.push_str(&format!("  at line {}:\n", h.line));
            for (label, lines) in [("main", &h.ours), (branch, &h.theirs)] {
                out.push_str(&format!("    {label}:\n"));
                for l in lines.split_inclusive(|&b| b == b'\n') {
                    let l = l.strip_suffix(b"\n").unwrap_or(l);
                    out.push_str(&format!("      | {}\n", quote_bytes(l)));
                }
            }
        }
        for r in &c.resolve {
            out.push_str(&format!("  to {}:\n    {}\n", r.action, r.command));
        }
    }
    out
}

#[derive(Serialize)]
struct JsonChange<'a> {
    action: &'static str,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<NodeKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<u32>,
}

#[derive(Serialize)]
struct JsonOutcome<'a> {
    branch: &'a str,
    conflicts_mode: ConflictMode,
    refused: bool,
    changes: Vec<JsonChange<'a>>,
    conflicts: &'a [super::Conflict],
}

/// The outcome as one JSON object (`changes`: `action` remove/create/write/chmod;
/// `conflicts`: `path`, `kind` and its fields, `hunks`, `markers`, `resolve`).
pub fn render_json(outcome: &MergeOutcome, branch: &str, mode: ConflictMode) -> String {
    let changes = outcome
        .plan
        .changes
        .iter()
        .map(|c| match c {
            Change::Remove { path, kind } => JsonChange {
                action: "remove",
                path,
                kind: Some(*kind),
                mode: None,
            },
            Change::Create { path, node, .. } => JsonChange {
                action: "create",
                path,
                kind: Some(node.kind),
                mode: Some(node.mode),
            },
            Change::Rewrite { path, mode, .. } => JsonChange {
                action: "write",
                path,
                kind: None,
                mode: Some(*mode),
            },
            Change::Chmod { path, mode } => JsonChange {
                action: "chmod",
                path,
                kind: None,
                mode: Some(*mode),
            },
        })
        .collect();
    let json = JsonOutcome {
        branch,
        conflicts_mode: mode,
        refused: outcome.refused,
        changes,
        conflicts: &outcome.conflicts,
    };
    serde_json::to_string_pretty(&json).expect("plain data serializes")
}

impl Side {
    /// The label of this side in conflicts.
    pub fn label(self, branch: &str) -> &str {
        match self {
            Side::Ours => "main",
            Side::Theirs => branch,
            Side::Base => "base",
        }
    }
}
