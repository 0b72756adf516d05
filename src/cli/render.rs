//! How reports are shown: `log`, `diff` and `status` as text (and their JSON documents),
//! rendered from the models the history computes ([`LogReport`], [`DiffReport`],
//! [`StatusReport`]) and nothing else, so the text and the JSON always carry the same facts.
//! The history never renders. The daemon answers the CLI with the report's JSON document
//! (the `--json` output), which the CLI renders here ([`from_daemon`]); the CLI renders a
//! state dir it reads itself (no daemon) the same way.
use std::fmt::Write as _;
use std::io;

use serde::Serialize;

use crate::history::History;
use crate::history::logdiff::{
    ContentChange, DiffFormat, DiffReport, EntryFacts, LogChange, LogReport,
};
use crate::history::quote::{quote_bytes, quote_name, quote_pattern, quote_prefixed};
use crate::history::status::StatusReport;

/// The width git's `--stat` fits its lines into (it uses the terminal's; reports here do
/// not know the terminal, which may be on the other side of the control socket).
const STAT_LINE_WIDTH: usize = 80;

/// A report's JSON document, as `--json` prints it (and the daemon sends it to the CLI).
pub fn to_json<T: Serialize>(report: &T) -> io::Result<String> {
    crate::history::logdiff::json_document(report)
}

// ---- log ----------------------------------------------------------------------------

/// `checkpointfs log`, as text or as JSON; with `session`, only the changes that
/// session made.
pub fn log_output(history: &History, json: bool, session: Option<&str>) -> io::Result<String> {
    log_from_report(history.log_report()?, json, session)
}

/// [`log_output`] from the whole tree's report, computed here or by the daemon.
pub fn log_from_report(
    mut report: LogReport,
    json: bool,
    session: Option<&str>,
) -> io::Result<String> {
    let whole_tree_has_checkpoints = !report.checkpoints.is_empty();
    if let Some(s) = session {
        report.keep_only_session(s);
    }
    if json {
        to_json(&report)
    } else if let Some(s) = session
        && whole_tree_has_checkpoints
        && report.checkpoints.is_empty()
        && report.before_first.changes.is_empty()
    {
        // Not "no checkpoints yet": the tree has some, none of them the session's.
        Ok(format!(
            "session {s}: no checkpoint and no change of it is recorded (a session is \
             named by its full id or 8 or more leading characters, as the log shows it)\n"
        ))
    } else {
        Ok(render_log(&report))
    }
}

fn render_log(report: &LogReport) -> String {
    let mut out = String::new();
    let before = &report.before_first;
    if before.dropped {
        out.push_str("(earlier checkpoints were dropped by gc)\n");
    } else if !before.changes.is_empty() || report.checkpoints.is_empty() {
        out.push_str(if report.checkpoints.is_empty() {
            "(no checkpoint yet: changes since the mount)\n"
        } else {
            "(before the first checkpoint)\n"
        });
        render_log_changes(&mut out, &before.changes);
    }
    if report.checkpoints.is_empty() {
        out.push_str("no checkpoints yet (write an id to MNT/.checkpoint/ctl, or: checkpointfs checkpoint MNT ID)\n");
    }
    for c in &report.checkpoints {
        // The session's own changes run to its next checkpoint, the others' to the tree's.
        let (who, last) = match &c.session {
            Some(s) => (
                format!("  session {}", s.get(..8).unwrap_or(s)),
                c.session_until.is_none(),
            ),
            None => (String::new(), c.until.is_none()),
        };
        let upto = if last { "  (up to now)" } else { "" };
        let _ = writeln!(out, "{}  {}{who}{upto}", c.id, c.time.time);
        render_log_changes(&mut out, &c.changes);
    }
    out
}

fn render_log_changes(out: &mut String, changes: &[LogChange]) {
    if changes.is_empty() {
        out.push_str("    (no changes)\n");
    }
    for c in changes {
        let _ = write!(out, "    {} {}", c.change.letter(), quote_name(&c.path));
        if !c.actors.is_empty() {
            // Process names are names too: a process can give itself any.
            let actors: Vec<_> = c.actors.iter().map(|a| quote_name(a)).collect();
            let _ = write!(out, "  (by {}", actors.join(", "));
            if !c.sessions.is_empty() {
                let short: Vec<_> = c
                    .sessions
                    .iter()
                    .map(|s| quote_name(s.get(..8).unwrap_or(s)))
                    .collect();
                let _ = write!(out, "; session {}", short.join(", "));
            }
            out.push(')');
        }
        out.push('\n');
    }
}

// ---- diff ---------------------------------------------------------------------------

/// `checkpointfs diff M [N] [--stat] [--json]`.
/// `checkpointfs diff`; with `session`, only the paths that agent session changed
/// between the two points.
pub fn diff_output(
    history: &History,
    from: &str,
    to: Option<&str>,
    format: DiffFormat,
    session: Option<&str>,
) -> io::Result<String> {
    diff_from_report(
        &history.diff_report_of(from, to, !format.stat, session, format.full)?,
        format,
    )
}

/// A diff report (computed here or by the daemon) as `format` asks.
pub fn diff_from_report(report: &DiffReport, format: DiffFormat) -> io::Result<String> {
    if format.json {
        to_json(report)
    } else if format.stat {
        Ok(render_stat(report))
    } else {
        Ok(render_patch(report))
    }
}

/// The unified diff: a `diff a/P b/P` header per path, mode lines, then the hunks (or a
/// note for binary content).
fn render_patch(report: &DiffReport) -> String {
    let mut out = String::new();
    for f in &report.files {
        // The text has always named the mount root by its empty relative path ("a/").
        // A name that needs quoting is quoted with its `a/`, `b/` prefix, as git does.
        let path = if f.path == "." { "" } else { f.path.as_str() };
        let (a, b) = (quote_prefixed("a/", path), quote_prefixed("b/", path));
        let _ = writeln!(out, "diff {a} {b}");
        match (&f.before, &f.after) {
            (None, Some(new)) => {
                let _ = writeln!(out, "new file mode {}", new.mode);
            }
            (Some(old), None) => {
                let _ = writeln!(out, "deleted file mode {}", old.mode);
            }
            (Some(old), Some(new)) if old.kind != new.kind || old.mode != new.mode => {
                let _ = writeln!(
                    out,
                    "old mode {} ({:?})\nnew mode {} ({:?})",
                    old.mode, old.kind, new.mode, new.kind
                );
            }
            _ => {}
        }
        if let (Some(old), Some(new)) = (&f.before, &f.after)
            && old.xattrs != new.xattrs
        {
            let _ = writeln!(out, "xattrs changed (user.*, ACLs, capabilities)");
        }
        match f.content {
            ContentChange::Binary => {
                let _ = writeln!(out, "Binary files {a} and {b} differ");
            }
            ContentChange::Large => {
                let _ = writeln!(
                    out,
                    "Large files {a} and {b} differ: {} bytes changed (--full diffs them)",
                    f.bytes_changed.unwrap_or(0)
                );
            }
            ContentChange::Text => {
                let patch = f.patch.as_deref().unwrap_or_default();
                if !patch.is_empty() {
                    let old = if f.before.is_some() {
                        a.as_str()
                    } else {
                        "/dev/null"
                    };
                    let new = if f.after.is_some() {
                        b.as_str()
                    } else {
                        "/dev/null"
                    };
                    let _ = write!(out, "--- {old}\n+++ {new}\n{patch}");
                }
            }
            ContentChange::None => {}
        }
    }
    out
}

/// git's `scale_linear`: `n` of `max` scaled to `width` columns, at least 1 when `n > 0`.
fn scale_linear(n: usize, width: usize, max: usize) -> usize {
    if n == 0 || max == 0 {
        0
    } else {
        1 + n * (width.saturating_sub(1)) / max
    }
}

/// `diff --stat`, as git prints it: ` PATH | N +++--` per path (`Bin X -> Y bytes` for
/// binary content), the totals, then one line per path created, deleted, or changed in
/// mode or type.
fn render_stat(report: &DiffReport) -> String {
    let mut out = String::new();
    if report.files.is_empty() {
        return out;
    }
    let names: Vec<_> = report.files.iter().map(|f| quote_name(&f.path)).collect();
    let name_width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    let max_change = report
        .files
        .iter()
        .map(|f| f.insertions + f.deletions)
        .max()
        .unwrap_or(0);
    let number_width = max_change.to_string().len();
    // " NAME | N " then the graph.
    let graph_width = STAT_LINE_WIDTH
        .saturating_sub(name_width + number_width + 5)
        .max(10);
    for (f, name) in report.files.iter().zip(&names) {
        let _ = write!(out, " {name:<name_width$} | ");
        if f.content == ContentChange::Binary {
            let size = |e: &Option<EntryFacts>| e.as_ref().map_or(0, |e| e.size);
            let _ = writeln!(out, "Bin {} -> {} bytes", size(&f.before), size(&f.after));
            continue;
        }
        if f.content == ContentChange::Large {
            let size = |e: &Option<EntryFacts>| e.as_ref().map_or(0, |e| e.size);
            let _ = writeln!(
                out,
                "large, {} bytes changed ({} -> {} bytes)",
                f.bytes_changed.unwrap_or(0),
                size(&f.before),
                size(&f.after)
            );
            continue;
        }
        let (mut add, mut del) = (f.insertions, f.deletions);
        let total = add + del;
        if total == 0 {
            let _ = writeln!(out, "{total:>number_width$}");
            continue;
        }
        if max_change > graph_width {
            let mut scaled = scale_linear(total, graph_width, max_change);
            if scaled < 2 && add > 0 && del > 0 {
                scaled = 2;
            }
            if add < del {
                add = scale_linear(add, graph_width, max_change);
                del = scaled - add;
            } else {
                del = scale_linear(del, graph_width, max_change);
                add = scaled - del;
            }
        }
        let _ = writeln!(
            out,
            "{total:>number_width$} {}{}",
            "+".repeat(add),
            "-".repeat(del)
        );
    }
    let plural = |n: usize, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let _ = write!(
        out,
        " {}",
        plural(report.files_changed, "file changed", "files changed")
    );
    // As git: a zero count is shown only when both are zero.
    if report.insertions > 0 || report.deletions == 0 {
        let _ = write!(
            out,
            ", {}",
            plural(report.insertions, "insertion(+)", "insertions(+)")
        );
    }
    if report.deletions > 0 || report.insertions == 0 {
        let _ = write!(
            out,
            ", {}",
            plural(report.deletions, "deletion(-)", "deletions(-)")
        );
    }
    out.push('\n');
    for (f, name) in report.files.iter().zip(&names) {
        let kind = |e: &EntryFacts| format!("{:?}", e.kind).to_lowercase();
        match (&f.before, &f.after) {
            (None, Some(new)) => {
                let _ = writeln!(out, " create {} {} {}", kind(new), new.mode, name);
            }
            (Some(old), None) => {
                let _ = writeln!(out, " delete {} {} {}", kind(old), old.mode, name);
            }
            (Some(old), Some(new)) => {
                // One line per path; a type change names both modes (a symlink's is 0777).
                if old.kind != new.kind {
                    let _ = writeln!(
                        out,
                        " type change {} {} => {} {} {}",
                        kind(old),
                        old.mode,
                        kind(new),
                        new.mode,
                        name
                    );
                } else if old.mode != new.mode {
                    let _ = writeln!(out, " mode change {} => {} {}", old.mode, new.mode, name);
                }
            }
            (None, None) => {}
        }
    }
    out
}

// ---- status -------------------------------------------------------------------------

impl StatusReport {
    /// The report as `status` prints it: JSON or text.
    pub fn render(&self, json: bool) -> io::Result<String> {
        if json {
            to_json(self)
        } else {
            Ok(self.to_text())
        }
    }

    /// The whole status, or with `--path` only the answer for that path (one line, so a
    /// script can use it as it is; `--json` has both).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if let Some(p) = &self.path {
            let _ = writeln!(out, "{}", p.text);
            return out;
        }
        let mount = match (self.mounted, self.daemon_pid) {
            (true, Some(pid)) => format!("live (daemon pid {pid})"),
            (true, None) => "live".to_string(),
            (false, _) => "not mounted (read from the state dir)".to_string(),
        };
        let _ = writeln!(out, "mount:          {mount}");
        let _ = writeln!(out, "state dir:      {}", quote_name(&self.state_dir));
        let _ = writeln!(out, "source:         {}", quote_name(&self.source));
        match &self.checkpoints.latest {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "checkpoints:    {} (latest: {} at {})",
                    self.checkpoints.count, c.id, c.time.time
                );
            }
            None => {
                let _ = writeln!(out, "checkpoints:    0");
            }
        }
        let _ = writeln!(
            out,
            "tracked paths:  {} ({} changed since the last checkpoint)",
            self.tracked_paths, self.changed_since_last_checkpoint
        );
        let _ = writeln!(
            out,
            "store:          {} objects, {} bytes",
            self.store.objects, self.store.bytes
        );
        let _ = writeln!(out, "pending copies: {}", self.pending_copies);
        if let Some(io) = &self.io {
            let how = match &io.passthrough_off_reason {
                None => "kernel passthrough (the kernel reads and writes SRC's files itself)"
                    .to_string(),
                Some(why) => format!("served by the daemon (kernel passthrough is off: {why})"),
            };
            let _ = writeln!(out, "file io:        {how}");
            if let Some(transport) = &io.transport {
                let _ = writeln!(out, "transport:      {transport}");
            }
            let mounted_by = if let Some(owner) = io.owner_uid {
                format!("root (mount(2)) for uid {owner} (--owner: only that user may use it)")
            } else if io.daemon_uid == 0 {
                "root (mount(2))".to_string()
            } else {
                format!("uid {} (fusermount3)", io.daemon_uid)
            };
            let _ = writeln!(out, "mounted by:     {mounted_by}");
            let now = match (io.read_only, io.mount_options.starts_with("ro,")) {
                (true, false) => " (read-only now: remounted ro)",
                (false, true) => " (read-write now: remounted rw)",
                _ => "",
            };
            let _ = writeln!(out, "mount options:  {}{now}", io.mount_options);
        }
        // Only once another user has used the mount: a private mount has nothing to say.
        if let Some(others) = self.other_users.as_ref().filter(|o| !o.usage.is_empty()) {
            for u in &others.usage {
                let _ = writeln!(
                    out,
                    "other user:     uid {}: {} of {} ctl lines, {} of {} (--other-users-budget)",
                    u.uid,
                    u.ctl_lines,
                    others.budget.ctl_lines,
                    super::commands::human_bytes(u.state_bytes),
                    super::commands::human_bytes(others.budget.bytes)
                );
            }
        }
        if let Some(r) = &self.remote {
            let _ = writeln!(
                out,
                "remote:         {} (session {}): pushed through {}, {} checkpoint(s) not pushed, {} uploaded since mount{}",
                r.url,
                r.session,
                r.pushed_through.as_deref().unwrap_or("nothing yet"),
                r.unpushed_checkpoints,
                super::commands::human_bytes(r.uploaded_bytes),
                r.last_error
                    .as_deref()
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default()
            );
        }
        self.exclusions_text(&mut out);
        out
    }

    fn exclusions_text(&self, out: &mut String) {
        let e = &self.exclusions;
        let quoted = |patterns: &[String]| {
            patterns
                .iter()
                .map(|p| quote_pattern(p))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if e.exclude.is_empty() {
            let _ = writeln!(out, "exclude:        (none)");
        } else {
            let _ = writeln!(out, "exclude:        {}", quoted(&e.exclude));
        }
        if e.exclude_from.is_empty() {
            let _ = writeln!(out, "exclude-from:   (none)");
        }
        for f in &e.exclude_from {
            let patterns = if f.patterns.is_empty() {
                "(no patterns)".to_string()
            } else {
                quoted(&f.patterns)
            };
            let file = f.file.as_os_str().as_encoded_bytes();
            let _ = writeln!(out, "exclude-from:   {}: {patterns}", quote_bytes(file));
        }
        let gitignore = match (e.respect_gitignore, e.ignore_files.is_empty()) {
            (false, _) => "off".to_string(),
            (true, true) => "on (no ignore files)".to_string(),
            (true, false) => {
                let files: Vec<_> = e.ignore_files.iter().map(|f| quote_name(f)).collect();
                format!("on: {}", files.join(", "))
            }
        };
        let _ = writeln!(out, "gitignore:      {gitignore}");
    }
}

/// A report model from the JSON document the daemon sent (the same document `--json`
/// prints), for the CLI to render.
pub fn from_daemon<T: serde::de::DeserializeOwned>(document: &str) -> io::Result<T> {
    serde_json::from_str(document).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the daemon's report is not the JSON this checkpointfs reads: {e}"),
        )
    })
}
