//! Paged queries for browsing a history (`checkpointfs ui`): the newest checkpoint (a cheap
//! poll), a page of the timeline newest first, a page of one checkpoint's changed paths, one
//! path's history and one file's diff. Each answers with the same facts `log` and `diff`
//! report (it is computed by the same code, [`History::log_checkpoint`] and
//! [`History::file_diff`]), but costs what the page holds, not the whole log: a timeline
//! page lists the changes of its own checkpoints only.
//!
//! Every page but [`History::browse_head`] reads the transcript once for the attribution
//! (who changed what), as `log` does.
use std::io;

use serde::{Deserialize, Serialize};

use super::History;
use super::changes::{ChangeKind, Point};
use super::logdiff::{FileDiff, LogChange, LogIndex, Timestamp, session_matches};

pub const BROWSE_SCHEMA: &str = "checkpointfs.browse/1";

/// Above this many changed paths, a timeline row does not count lines (`insertions` and
/// `deletions` are `None`): counting reads every changed file on both sides.
pub const LINE_COUNT_LIMIT: usize = 200;

/// The newest checkpoint: what the UI polls to see new checkpoints. O(1) but for
/// `last_before_rewind`, a scan of the ids in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub schema: String,
    /// Kept checkpoints.
    pub checkpoints: usize,
    pub latest: Option<String>,
    /// Checkpoints ever made in this history's memory (changes on every checkpoint, also
    /// when gc drops as many as are made).
    pub made: usize,
    /// The newest `ID:before-rewind` checkpoint: rewinding to it undoes the last rewind.
    pub last_before_rewind: Option<String>,
}

/// A page of the timeline: checkpoints newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimelinePage {
    pub schema: String,
    /// Checkpoints in the whole timeline (with `session`: those `log --session` keeps).
    pub total: usize,
    /// Position of `rows[0]`, 0 being the newest.
    pub offset: usize,
    pub rows: Vec<TimelineRow>,
}

/// One checkpoint of the timeline, summing up what changed after it (as `log` lists it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineRow {
    pub id: String,
    #[serde(flatten)]
    pub time: Timestamp,
    pub session: Option<String>,
    pub added: usize,
    pub modified: usize,
    pub deleted: usize,
    /// Lines added and removed over the text files; `None` above [`LINE_COUNT_LIMIT`] paths.
    pub insertions: Option<usize>,
    pub deletions: Option<usize>,
    /// Every process that changed something listed, sorted, once.
    pub actors: Vec<String>,
}

/// A page of the paths one checkpoint changed (as `log` lists them), sorted by path.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChangesPage {
    pub schema: String,
    pub id: String,
    /// Paths matching the filter.
    pub total: usize,
    pub offset: usize,
    pub rows: Vec<LogChange>,
}

/// Every checkpoint whose listed changes include one path, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathHistory {
    pub schema: String,
    pub path: String,
    pub rows: Vec<PathHistoryRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathHistoryRow {
    /// The checkpoint after which it changed.
    pub id: String,
    #[serde(flatten)]
    pub time: Timestamp,
    pub session: Option<String>,
    pub change: ChangeKind,
    pub actors: Vec<String>,
}

/// What one file's diff is compared with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Against {
    /// The change `log` lists under the checkpoint: up to the next one (its session's next,
    /// when that session changed the path).
    Next,
    /// The live tree.
    Now,
    /// Another checkpoint.
    Checkpoint { id: String },
}

/// One file's diff between two points; `diff: None` when it does not differ.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileDiffAnswer {
    pub schema: String,
    pub from: String,
    /// `None`: the live tree.
    pub to: Option<String>,
    pub diff: Option<FileDiff>,
}

fn not_found(id: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no checkpoint named '{id}' (see: checkpointfs log MNT)"),
    )
}

fn position(log: &LogIndex, id: &str) -> io::Result<usize> {
    log.checkpoints
        .iter()
        .position(|c| c.id == id)
        .ok_or_else(|| not_found(id))
}

/// Positions (oldest first) of the checkpoints `log --session` would show, newest first.
fn timeline_positions(log: &LogIndex, session: Option<&str>) -> Vec<usize> {
    (0..log.len())
        .rev()
        .filter(|&i| session.is_none_or(|s| log.concerns_session(i, s)))
        .collect()
}

impl History {
    /// See [`Head`].
    pub fn browse_head(&self) -> Head {
        let st = self.lock();
        let kept = st.kept();
        Head {
            schema: BROWSE_SCHEMA.to_string(),
            checkpoints: kept.len(),
            latest: kept.last().map(|c| c.id.clone()),
            made: st.checkpoints.len(),
            last_before_rewind: kept
                .iter()
                .rev()
                .find(|c| c.id.contains(":before-rewind"))
                .map(|c| c.id.clone()),
        }
    }

    /// Checkpoint `i`'s listed changes, only `session`'s with one.
    fn listed_changes(
        &self,
        log: &LogIndex,
        i: usize,
        session: Option<&str>,
    ) -> io::Result<Vec<LogChange>> {
        let mut changes = self.log_checkpoint(log, i)?.changes;
        if let Some(s) = session {
            changes.retain(|c| c.sessions.iter().any(|x| session_matches(s, x)));
        }
        Ok(changes)
    }

    /// Up to `limit` timeline rows from position `offset` (0: the newest).
    pub fn timeline_page(
        &self,
        offset: usize,
        limit: usize,
        session: Option<&str>,
    ) -> io::Result<TimelinePage> {
        let log = self.log_index()?;
        let positions = timeline_positions(&log, session);
        let mut rows = Vec::new();
        for &i in positions.iter().skip(offset).take(limit) {
            let changes = self.listed_changes(&log, i, session)?;
            let count = |k: ChangeKind| changes.iter().filter(|c| c.change == k).count();
            let mut actors: Vec<String> = changes
                .iter()
                .flat_map(|c| c.actors.iter().cloned())
                .collect();
            actors.sort();
            actors.dedup();
            let (insertions, deletions) = if changes.len() <= LINE_COUNT_LIMIT {
                let mut lines = (0, 0);
                for c in &changes {
                    let path = if c.path == "." { "" } else { &c.path };
                    if let Some(d) = self.change_diff(log.change_span(i, path), path, false)? {
                        lines.0 += d.insertions;
                        lines.1 += d.deletions;
                    }
                }
                (Some(lines.0), Some(lines.1))
            } else {
                (None, None)
            };
            let c = &log.checkpoints[i];
            rows.push(TimelineRow {
                id: c.id.clone(),
                time: Timestamp::of(c.time),
                session: c.session.clone(),
                added: count(ChangeKind::Added),
                modified: count(ChangeKind::Modified),
                deleted: count(ChangeKind::Deleted),
                insertions,
                deletions,
                actors,
            });
        }
        Ok(TimelinePage {
            schema: BROWSE_SCHEMA.to_string(),
            total: positions.len(),
            offset,
            rows,
        })
    }

    /// Up to `limit` of the paths checkpoint `id` lists, from `offset`, of those whose path
    /// contains `filter` (case-insensitively).
    pub fn changes_page(
        &self,
        id: &str,
        offset: usize,
        limit: usize,
        filter: &str,
        session: Option<&str>,
    ) -> io::Result<ChangesPage> {
        let log = self.log_index()?;
        let i = position(&log, id)?;
        let needle = filter.to_lowercase();
        let mut changes = self.listed_changes(&log, i, session)?;
        if !needle.is_empty() {
            changes.retain(|c| c.path.to_lowercase().contains(&needle));
        }
        let total = changes.len();
        Ok(ChangesPage {
            schema: BROWSE_SCHEMA.to_string(),
            id: id.to_string(),
            total,
            offset,
            rows: changes.into_iter().skip(offset).take(limit).collect(),
        })
    }

    /// Every checkpoint under which `log` lists a change of `path`, newest first.
    pub fn path_history(&self, path: &str) -> io::Result<PathHistory> {
        let path = path.trim_matches('/');
        let log = self.log_index()?;
        let made_at: Vec<usize> = self
            .lock()
            .paths
            .get(path)
            .map(|h| h.versions.iter().filter_map(|v| v.since).collect())
            .unwrap_or_default();
        let mut candidates = log.candidates_for(path, &made_at);
        // Format 4: a rename of an ancestor moves content into or out of `path` with no
        // record of `path` itself; the checkpoint it falls after lists that change.
        candidates.extend(
            self.ancestor_rename_seqs(path)
                .into_iter()
                .filter_map(|seq| log.position_before(seq)),
        );
        // The latest checkpoint's changes run up to the live tree, which may differ anywhere.
        if log.len() > 0 {
            candidates.insert(log.len() - 1);
        }
        let mut rows = Vec::new();
        for &i in candidates.iter().rev() {
            let (from, to) = log.change_span(i, path);
            if let Some((change, _, _)) = self.change_of(from, to, path)? {
                let c = &log.checkpoints[i];
                rows.push(PathHistoryRow {
                    id: c.id.clone(),
                    time: Timestamp::of(c.time),
                    session: c.session.clone(),
                    change,
                    actors: log.changers_of(i, path).0,
                });
            }
        }
        Ok(PathHistory {
            schema: BROWSE_SCHEMA.to_string(),
            path: if path.is_empty() { "." } else { path }.to_string(),
            rows,
        })
    }

    /// The diff of `path` from checkpoint `id` to what `against` names, with its hunks.
    pub fn file_diff_of(
        &self,
        id: &str,
        path: &str,
        against: &Against,
    ) -> io::Result<FileDiffAnswer> {
        let path = path.trim_matches('/');
        let path = if path == "." { "" } else { path };
        let (span, to) = match against {
            Against::Next => {
                let log = self.log_index()?;
                let i = position(&log, id)?;
                let span = log.change_span(i, path);
                let to = match span.1 {
                    Point::Checkpoint(k) => self.checkpoint_at(k).map(|c| c.id),
                    _ => None,
                };
                (span, to)
            }
            Against::Now => ((self.point(id)?, Point::Now), None),
            Against::Checkpoint { id: other } => {
                ((self.point(id)?, self.point(other)?), Some(other.clone()))
            }
        };
        Ok(FileDiffAnswer {
            schema: BROWSE_SCHEMA.to_string(),
            from: id.to_string(),
            to,
            diff: self.change_diff(span, path, true)?,
        })
    }

    /// How `path` differs over `span`, with hunks when `with_patch`.
    fn change_diff(
        &self,
        span: (Point, Point),
        path: &str,
        with_patch: bool,
    ) -> io::Result<Option<FileDiff>> {
        match self.change_of(span.0, span.1, path)? {
            Some((change, before, after)) => self
                .file_diff(
                    path,
                    change,
                    before.as_ref(),
                    after.as_ref(),
                    with_patch,
                    false,
                )
                .map(Some),
            None => Ok(None),
        }
    }
}
