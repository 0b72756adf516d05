//! The text of `log`, `diff` and `status`: computed from a history, online (in the daemon)
//! or offline (a state dir opened read-only).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io;

use super::History;
use super::view::ViewEntry;
use crate::transcript::record::{EntryKind, FILE_HISTORY_SNAPSHOT};
use crate::transcript::replay::read_transcript;

/// A point in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Before anything was changed through the mount.
    Origin,
    Checkpoint(usize),
    /// The live tree.
    Now,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
        }
    }
}

fn not_found(id: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no checkpoint named '{id}' (see: checkpointfs log MNT)"),
    )
}

/// How a path changed, with its entry before and after (`None`: absent).
pub type Change = (ChangeKind, Option<ViewEntry>, Option<ViewEntry>);

impl History {
    pub fn point(&self, id: &str) -> io::Result<Point> {
        self.checkpoint_index(id)
            .map(Point::Checkpoint)
            .ok_or_else(|| not_found(id))
    }

    fn entry_at_point(&self, p: Point, rel: &str) -> io::Result<Option<ViewEntry>> {
        match p {
            Point::Origin => self.entry_at(None, rel.as_bytes()),
            Point::Checkpoint(k) => self.entry_at(Some(k), rel.as_bytes()),
            Point::Now => self.live_entry(rel),
        }
    }

    /// Tracked paths that differ between `a` and `b`, with the entries on each side.
    pub fn changes(&self, a: Point, b: Point) -> io::Result<BTreeMap<String, Change>> {
        let paths: BTreeSet<String> = self.lock().paths.keys().cloned().collect();
        let mut out = BTreeMap::new();
        for p in paths {
            let before = self.entry_at_point(a, &p)?;
            let after = self.entry_at_point(b, &p)?;
            let kind = match (&before, &after) {
                (None, None) => continue,
                (None, Some(_)) => ChangeKind::Added,
                (Some(_), None) => ChangeKind::Deleted,
                (Some(x), Some(y)) => {
                    if self.same(x, y)? {
                        continue;
                    }
                    ChangeKind::Modified
                }
            };
            out.insert(p, (kind, before, after));
        }
        Ok(out)
    }

    /// Same type, mode and content. Directories compare by mode only.
    fn same(&self, x: &ViewEntry, y: &ViewEntry) -> io::Result<bool> {
        use super::view::ViewContent;
        if x.meta.kind != y.meta.kind || x.meta.mode != y.meta.mode {
            return Ok(false);
        }
        if !matches!(x.meta.kind, EntryKind::File | EntryKind::Symlink) {
            return Ok(true);
        }
        if x.meta.kind == EntryKind::File && x.meta.size != y.meta.size {
            return Ok(false);
        }
        if let (ViewContent::Object(a), ViewContent::Object(b)) = (&x.content, &y.content) {
            return Ok(a == b);
        }
        Ok(self.view_read_all(x)? == self.view_read_all(y)?)
    }

    /// (epoch, path) → names of the processes that changed it, from the transcript. Epoch k
    /// is the time between checkpoint k-1 and checkpoint k (0: before the first).
    fn actors_by_epoch(&self) -> io::Result<BTreeMap<(usize, String), BTreeSet<String>>> {
        let outcome = read_transcript(&self.state_dir().join("transcript.jsonl"))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let mut epoch = 0;
        let mut out: BTreeMap<(usize, String), BTreeSet<String>> = BTreeMap::new();
        for r in outcome.records {
            if r.record_type != FILE_HISTORY_SNAPSHOT {
                continue;
            }
            if !r.is_snapshot_update {
                epoch += 1;
                continue;
            }
            for (path, b) in r.snapshot.tracked_file_backups {
                if let Some(a) = b.actor {
                    let name = if a.comm.is_empty() {
                        format!("pid {}", a.pid)
                    } else {
                        a.comm
                    };
                    out.entry((epoch, path)).or_default().insert(name);
                }
            }
        }
        Ok(out)
    }

    /// `checkpointfs log`: every checkpoint, oldest first, with what changed since the one
    /// before it and who changed it; then what changed since the last one.
    pub fn log_text(&self) -> io::Result<String> {
        let checkpoints = self.checkpoints();
        let actors = self.actors_by_epoch()?;
        let mut out = String::new();
        if checkpoints.is_empty() {
            out.push_str("no checkpoints yet (write an id to MNT/.checkpoint/ctl, or: checkpointfs checkpoint MNT ID)\n");
        }
        let mut prev = Point::Origin;
        for (k, c) in checkpoints.iter().enumerate() {
            let _ = writeln!(
                out,
                "{}  {}",
                c.id,
                super::super::transcript::record::rfc3339(c.time)
            );
            self.write_changes(&mut out, prev, Point::Checkpoint(k), k, &actors)?;
            prev = Point::Checkpoint(k);
        }
        let now = self.changes(prev, Point::Now)?;
        if !now.is_empty() {
            let _ = writeln!(
                out,
                "(since {}, not yet checkpointed)",
                checkpoints.last().map_or("the mount", |c| c.id.as_str())
            );
            self.write_changes(&mut out, prev, Point::Now, checkpoints.len(), &actors)?;
        }
        Ok(out)
    }

    fn write_changes(
        &self,
        out: &mut String,
        a: Point,
        b: Point,
        epoch: usize,
        actors: &BTreeMap<(usize, String), BTreeSet<String>>,
    ) -> io::Result<()> {
        let changes = self.changes(a, b)?;
        if changes.is_empty() {
            out.push_str("    (no changes)\n");
        }
        for (path, (kind, _, _)) in changes {
            let shown = if path.is_empty() { "." } else { path.as_str() };
            let _ = write!(out, "    {} {shown}", kind.letter());
            if let Some(who) = actors.get(&(epoch, path.clone())) {
                let who: Vec<&str> = who.iter().map(String::as_str).collect();
                let _ = write!(out, "  (by {})", who.join(", "));
            }
            out.push('\n');
        }
        Ok(())
    }

    /// `checkpointfs diff M [N]`: a unified diff from checkpoint `from` to `to` (default: the
    /// live tree). Binary files are named, not printed.
    pub fn diff_text(&self, from: &str, to: Option<&str>) -> io::Result<String> {
        let a = self.point(from)?;
        let b = match to {
            Some(id) => self.point(id)?,
            None => Point::Now,
        };
        let mut out = String::new();
        for (path, (_, before, after)) in self.changes(a, b)? {
            self.write_file_diff(&mut out, &path, before.as_ref(), after.as_ref())?;
        }
        Ok(out)
    }

    fn write_file_diff(
        &self,
        out: &mut String,
        path: &str,
        before: Option<&ViewEntry>,
        after: Option<&ViewEntry>,
    ) -> io::Result<()> {
        let _ = writeln!(out, "diff a/{path} b/{path}");
        let mode = |e: Option<&ViewEntry>| e.map(|e| (e.meta.kind, e.meta.mode));
        match (mode(before), mode(after)) {
            (None, Some((_, m))) => {
                let _ = writeln!(out, "new file mode {m:04o}");
            }
            (Some((_, m)), None) => {
                let _ = writeln!(out, "deleted file mode {m:04o}");
            }
            (Some((k1, m1)), Some((k2, m2))) if k1 != k2 || m1 != m2 => {
                let _ = writeln!(
                    out,
                    "old mode {m1:04o} ({k1:?})\nnew mode {m2:04o} ({k2:?})"
                );
            }
            _ => {}
        }
        let content = |e: Option<&ViewEntry>| -> io::Result<Option<Vec<u8>>> {
            match e {
                Some(e) if matches!(e.meta.kind, EntryKind::File | EntryKind::Symlink) => {
                    self.view_read_all(e).map(Some)
                }
                _ => Ok(None),
            }
        };
        let (old, new) = (content(before)?, content(after)?);
        if old.is_none() && new.is_none() {
            return Ok(());
        }
        let old = old.unwrap_or_default();
        let new = new.unwrap_or_default();
        if old == new {
            return Ok(());
        }
        let is_text = |b: &[u8]| !b.contains(&0) && std::str::from_utf8(b).is_ok();
        if !is_text(&old) || !is_text(&new) {
            let _ = writeln!(out, "Binary files a/{path} and b/{path} differ");
            return Ok(());
        }
        let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
        let a_name = if before.is_some() {
            format!("a/{path}")
        } else {
            "/dev/null".to_string()
        };
        let b_name = if after.is_some() {
            format!("b/{path}")
        } else {
            "/dev/null".to_string()
        };
        let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
        let _ = write!(
            out,
            "{}",
            diff.unified_diff()
                .context_radius(3)
                .header(&a_name, &b_name)
        );
        Ok(())
    }

    /// `checkpointfs status`: where things are and how big they are; with `path`, why that
    /// path is or is not tracked.
    pub fn status_text(&self, path: Option<&str>) -> io::Result<String> {
        let mut out = String::new();
        let checkpoints = self.checkpoints();
        let (tracked, dirty) = {
            let st = self.lock();
            (
                st.paths.len(),
                st.paths.values().filter(|h| h.dirty).count(),
            )
        };
        let objects = self.store().list()?.len();
        let bytes = self.store().total_size()?;
        let _ = writeln!(out, "state dir:      {}", self.state_dir().display());
        let _ = writeln!(out, "source:         {}", self.source().display());
        match checkpoints.last() {
            Some(c) => {
                let _ = writeln!(
                    out,
                    "checkpoints:    {} (latest: {} at {})",
                    checkpoints.len(),
                    c.id,
                    super::super::transcript::record::rfc3339(c.time)
                );
            }
            None => {
                let _ = writeln!(out, "checkpoints:    0");
            }
        }
        let _ = writeln!(
            out,
            "tracked paths:  {tracked} ({dirty} changed since the last checkpoint)"
        );
        let _ = writeln!(out, "store:          {objects} objects, {bytes} bytes");
        let _ = writeln!(out, "pending copies: {}", self.pending_copies());
        if self.exclude_patterns().is_empty() {
            let _ = writeln!(out, "excluded:       (nothing)");
        } else {
            let _ = writeln!(
                out,
                "excluded:       {}",
                self.exclude_patterns().join(", ")
            );
        }
        if let Some(p) = path {
            let p = p.trim_matches('/');
            let versions = self
                .lock()
                .paths
                .get(p)
                .map(|h| (h.versions.len(), h.dirty));
            let why = if self.is_excluded(p) {
                format!(
                    "excluded (matches an --exclude pattern: {})",
                    self.exclude_patterns().join(", ")
                )
            } else if let Some((n, dirty)) = versions {
                format!(
                    "tracked: {n} version{}{}",
                    if n == 1 { "" } else { "s" },
                    if dirty {
                        ", changed since the last checkpoint"
                    } else {
                        ""
                    }
                )
            } else {
                "not tracked yet: unchanged through the mount (it is tracked from its first change)"
                    .to_string()
            };
            let _ = writeln!(out, "path {p}: {why}");
        }
        Ok(out)
    }
}
