//! The facts behind `checkpointfs log` and `checkpointfs diff`.
//!
//! Each report is computed once into a serializable model ([`LogReport`], [`DiffReport`]);
//! [`crate::cli::render`] renders the human text and the JSON (documented in
//! docs/json-output.md) from it, so they always carry the same facts. Nothing here renders.
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::History;
use super::changes::{ChangeKind, Point};
use super::store::object_name;
use super::view::{ViewContent, ViewEntry};
use crate::transcript::record::{EntryKind, FILE_HISTORY_SNAPSHOT, rfc3339};

pub const LOG_SCHEMA: &str = "checkpointfs.log/3";
pub const DIFF_SCHEMA: &str = "checkpointfs.diff/1";

/// How `diff` shows its result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiffFormat {
    /// A per-path summary of changed lines instead of the patch.
    pub stat: bool,
    pub json: bool,
    /// Diff files above [`LARGE_FILE`] by lines too (when they are text).
    pub full: bool,
}

/// A time as both an RFC 3339 UTC string and nanoseconds since the Unix epoch.
///
/// Both are in milliseconds, the precision the transcript keeps: a checkpoint's time must
/// read the same from the daemon (which knows it to the nanosecond until it exits) and from
/// the state dir (replayed from the transcript).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamp {
    pub time: String,
    pub time_unix_ns: i64,
}

impl Timestamp {
    pub fn of(t: SystemTime) -> Timestamp {
        let ms = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            // Before 1970: round towards the past, as the string does.
            Err(e) => {
                i64::try_from(e.duration().as_nanos().div_ceil(1_000_000)).map_or(i64::MIN, |n| -n)
            }
        };
        Timestamp {
            time: rfc3339(t),
            time_unix_ns: ms.saturating_mul(1_000_000),
        }
    }
}

/// What a path was on one side of a change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryFacts {
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// Permission bits in octal, e.g. "0644".
    pub mode: String,
    pub size: u64,
    /// Of the content (files) or the target (symlinks); `None` for other types.
    pub sha256: Option<String>,
    /// Symlinks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// The sha256 of the canonical encoding of its extended attributes (see
    /// `history::xattrs`); absent when it has none, or they were not recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<String>,
}

/// Above this size (either side) `diff` does not read a file for a line diff: it reports it
/// as `large`, with the number of bytes that differ, found in bounded memory
/// ([`super::compare`]), unless `--full` asks for the line diff. A line diff holds both
/// sides and `similar`'s tables (a few times their size) in the daemon, so 8 MiB keeps one
/// well under 64 MB, while source files, the ones worth a patch, are far smaller.
pub const LARGE_FILE: u64 = 8 << 20;

/// A side's content as a report reads it: a symlink's target, or a file, opened but not
/// read (it may be big, and sparse).
enum Content {
    Target(Vec<u8>),
    File(std::fs::File),
}

impl Content {
    fn len(&self) -> io::Result<u64> {
        match self {
            Content::Target(t) => Ok(t.len() as u64),
            Content::File(f) => Ok(f.metadata()?.len()),
        }
    }

    fn is_text(&self) -> io::Result<bool> {
        match self {
            Content::Target(t) => Ok(is_text(t)),
            Content::File(f) => super::compare::is_text(f),
        }
    }

    /// The whole content (called for what is at most [`LARGE_FILE`], or text with --full).
    fn bytes(self) -> io::Result<Vec<u8>> {
        match self {
            Content::Target(t) => Ok(t),
            Content::File(mut f) => {
                let mut buf = Vec::new();
                io::Read::read_to_end(&mut f, &mut buf)?;
                Ok(buf)
            }
        }
    }
}

/// The content of a file or symlink entry; `None` for directories and special files.
fn content_of(h: &History, e: Option<&ViewEntry>) -> io::Result<Option<Content>> {
    match e {
        Some(e) if e.meta.kind == EntryKind::Symlink => {
            Ok(Some(Content::Target(h.view_symlink_target(e)?)))
        }
        Some(e) if e.meta.kind == EntryKind::File => Ok(Some(Content::File(h.view_open(e)?))),
        _ => Ok(None),
    }
}

/// How often a report looks a live path up again when it was replaced or removed between
/// the listing and the read (a writer saving by tmp+rename does that all the time).
const LIVE_RETRIES: usize = 8;

/// The entry and its content (see [`content_of`]), for a report. A live file that vanished
/// or was replaced after it was listed is looked up again: the report shows it as it is
/// now, or as absent if it is gone, instead of failing with ENOENT.
fn read_side(
    h: &History,
    path: &str,
    e: Option<&ViewEntry>,
) -> io::Result<(Option<ViewEntry>, Option<Content>)> {
    let mut entry = e.cloned();
    for _ in 0..LIVE_RETRIES {
        match content_of(h, entry.as_ref()) {
            Err(err)
                if err.raw_os_error() == Some(libc::ENOENT)
                    && entry
                        .as_ref()
                        .is_some_and(|e| matches!(e.content, ViewContent::Live(_))) =>
            {
                entry = h.live_entry(path)?;
            }
            other => return other.map(|c| (entry, c)),
        }
    }
    Err(io::Error::other(format!(
        "{path}: replaced {LIVE_RETRIES} times while being read; try again"
    )))
}

/// `content` is the entry's content as read by [`content_of`]; a file is hashed as it is
/// read, in bounded memory.
fn facts(e: &ViewEntry, content: Option<&Content>) -> io::Result<EntryFacts> {
    let sha256 = match (&e.content, content) {
        // A store object is named by the sha256 of its content: no need to hash again.
        (ViewContent::Object(name), _) => Some(name.clone()),
        (_, Some(Content::Target(bytes))) => Some(object_name(bytes)),
        (_, Some(Content::File(f))) => Some(super::store::content_hash(f)?),
        (_, None) => None,
    };
    let target = match (e.meta.kind, content) {
        (EntryKind::Symlink, Some(Content::Target(t))) => {
            Some(String::from_utf8_lossy(t).into_owned())
        }
        _ => None,
    };
    Ok(EntryFacts {
        kind: e.meta.kind,
        mode: format!("{:04o}", e.meta.mode),
        size: e.meta.size,
        sha256,
        target,
        // "" (none) is left out like "not recorded", so reports of trees without xattrs
        // read as before.
        xattrs: e.meta.xattrs_object().map(str::to_owned),
    })
}

/// The path as reports show it: the mount root is ".".
fn shown(path: &str) -> String {
    if path.is_empty() {
        ".".to_string()
    } else {
        path.to_string()
    }
}

// ---------------------------------------------------------------------------------------
// log
// ---------------------------------------------------------------------------------------

/// The log, organised by prompt: a checkpoint is taken when a prompt is submitted, so each
/// checkpoint lists what changed *after* it — the work done in answer to that prompt — up to
/// the next checkpoint (the last: up to the live tree).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogReport {
    pub schema: String,
    /// What changed before the first checkpoint, from the tree as it was before anything
    /// changed through the mount.
    pub before_first: LogSpan,
    /// Oldest first.
    pub checkpoints: Vec<LogCheckpoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogSpan {
    pub files_changed: usize,
    pub changes: Vec<LogChange>,
    /// `checkpointfs gc` dropped the checkpoints before the first one: what changed before
    /// it is no longer known, so `changes` is empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogCheckpoint {
    pub id: String,
    #[serde(flatten)]
    pub time: Timestamp,
    /// The agent session that took it (its process tree wrote the id); `None`: none known
    /// (the user, a script, or a record from before sessions were recorded).
    pub session: Option<String>,
    /// The next checkpoint of the tree, where the changes of everyone but `session` end;
    /// `None`: this is the latest, and they run up to the live tree.
    pub until: Option<String>,
    /// With `session`: that session's next checkpoint, where its own changes listed here
    /// end; `None`: this is its latest, and they run up to the live tree (without `session`:
    /// always `None`).
    pub session_until: Option<String>,
    pub files_changed: usize,
    /// `session`'s changes from this checkpoint to `session_until`, and everyone else's
    /// from it to `until` (see `attribute` for who is "everyone else").
    pub changes: Vec<LogChange>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogChange {
    pub path: String,
    pub change: ChangeKind,
    /// Names of the processes that changed the path (`pid N` when the name is unknown).
    pub actors: Vec<String>,
    /// The agent sessions whose processes changed it (see `session ID PID` in ctl).
    pub sessions: Vec<String>,
    pub before: Option<EntryFacts>,
    pub after: Option<EntryFacts>,
}

/// A report's JSON document: what `--json` prints, and what the daemon sends the CLI.
pub fn json_document<T: Serialize>(report: &T) -> io::Result<String> {
    let mut s = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
    s.push('\n');
    Ok(s)
}

impl History {
    /// (epoch, path) → who changed it, from the transcript. Epoch k is the time between
    /// checkpoint k-1 and checkpoint k (0: before the first).
    ///
    /// Kept between calls ([`ChangersCache`]): the first reads the whole transcript, later
    /// ones only what was appended since, so a page of `checkpointfs ui` or a `log` costs
    /// what was recorded since the last one, not the session's length.
    pub(crate) fn changers_by_epoch(&self) -> io::Result<Arc<BTreeMap<(usize, String), Changers>>> {
        let path = self.state_dir().join("transcript.jsonl");
        let mut cache = self
            .changers_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        cache.catch_up(&path)?;
        Ok(cache.changers.clone())
    }

    /// Every checkpoint, oldest first, with what changed after it and who changed it (see
    /// [`attribute`]: a session's changes up to its own next checkpoint, everyone else's up
    /// to the tree's next one; the last: up to now); and what changed before the first.
    pub fn log_report(&self) -> io::Result<LogReport> {
        let log = self.log_index()?;
        let before_first = self.log_before_first(&log)?;
        let mut out = Vec::with_capacity(log.len());
        for i in 0..log.len() {
            out.push(self.log_checkpoint(&log, i)?);
        }
        Ok(LogReport {
            schema: LOG_SCHEMA.to_string(),
            before_first: LogSpan {
                files_changed: before_first.len(),
                changes: before_first,
                dropped: log.history_dropped,
            },
            checkpoints: out,
        })
    }

    /// What the log of every checkpoint needs, read once (the transcript's changers, the
    /// version index, the attribution); [`History::log_checkpoint`] then lists any one
    /// checkpoint at the cost of its own changes, so a page of the log costs that page.
    ///
    /// Kept between requests while nothing was recorded (the key: where the transcript was
    /// read to, and the next record's seq), so that paging through `checkpointfs ui` costs
    /// each page its own rows.
    pub(crate) fn log_index(&self) -> io::Result<Arc<LogIndex>> {
        let changers = self.changers_by_epoch()?;
        // Read before building: an index built from a newer state than its key is rebuilt
        // at the next request, never one from an older state kept.
        let key = {
            let cache = self
                .changers_cache
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            (cache.file, cache.read.offset, self.lock().next_seq)
        };
        let mut kept = self
            .log_index_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((k, index)) = kept.as_ref()
            && *k == key
        {
            return Ok(index.clone());
        }
        let index = Arc::new(self.build_log_index(changers));
        *kept = Some((key, index.clone()));
        Ok(index)
    }

    fn build_log_index(&self, changers: Arc<BTreeMap<(usize, String), Changers>>) -> LogIndex {
        let checkpoints = self.checkpoints();
        let index = self.versions_by_checkpoint();
        // Epoch `i` counts intervals as the transcript does (gc compacts it, so epoch 0 ends
        // at the oldest kept checkpoint); `first_kept + i` is checkpoint i's index in memory.
        let (first_kept, history_dropped) = self.first_kept();
        let sessions: Vec<Option<&str>> =
            checkpoints.iter().map(|c| c.session.as_deref()).collect();
        let next_own = next_of_same_session(&sessions);
        let slots = attribute(&sessions, &changers);
        LogIndex {
            checkpoints,
            changers,
            index,
            first_kept,
            history_dropped,
            next_own,
            slots,
        }
    }

    /// What changed before the first checkpoint (nothing known if gc dropped older ones).
    pub(crate) fn log_before_first(&self, log: &LogIndex) -> io::Result<Vec<LogChange>> {
        if log.history_dropped {
            return Ok(Vec::new());
        }
        let span = Span {
            from: Point::Origin,
            until: log.point(0),
            own_until: log.point(0),
            epoch: 0,
        };
        self.log_changes(&span, &log.slots[0], &log.changers, &log.index)
    }

    /// Checkpoint `i` (by position, oldest first) as `log` lists it.
    pub(crate) fn log_checkpoint(&self, log: &LogIndex, i: usize) -> io::Result<LogCheckpoint> {
        let c = &log.checkpoints[i];
        let own_next = log.next_own[i];
        let span = log.span(i);
        let changes = self.log_changes(&span, &log.slots[i + 1], &log.changers, &log.index)?;
        Ok(LogCheckpoint {
            id: c.id.clone(),
            time: Timestamp::of(c.time),
            session: c.session.clone(),
            until: log.checkpoints.get(i + 1).map(|n| n.id.clone()),
            session_until: own_next.map(|j| log.checkpoints[j].id.clone()),
            files_changed: changes.len(),
            changes,
        })
    }

    /// The changes listed under one checkpoint (or before the first): the paths `slot`
    /// attributes to it, and the paths that differ over the tree's span but were changed by
    /// nobody recorded (a file open for writing across the checkpoint). A path its own
    /// session changed is compared up to that session's next checkpoint, any other up to
    /// the tree's next one.
    fn log_changes(
        &self,
        span: &Span,
        slot: &BTreeMap<String, Attributed>,
        changers: &BTreeMap<(usize, String), Changers>,
        index: &super::changes::VersionIndex,
    ) -> io::Result<Vec<LogChange>> {
        let mut picked: BTreeMap<String, (super::changes::Change, Option<&Changers>)> =
            BTreeMap::new();
        for (path, change) in self.changes_with(index, span.from, span.until)? {
            let here = slot.get(&path);
            let recorded = changers.contains_key(&(span.epoch, path.clone()));
            match here {
                // Taken below, over the session's own span.
                Some(h) if h.own => {}
                Some(h) => {
                    picked.insert(path, (change, Some(&h.who)));
                }
                // Changed only by sessions whose changes are listed under their own
                // checkpoints.
                None if recorded => {}
                None => {
                    picked.insert(path, (change, None));
                }
            }
        }
        for (path, h) in slot.iter().filter(|(_, h)| h.own) {
            if let Some(change) = self.change_of(span.from, span.own_until, path)? {
                picked.insert(path.clone(), (change, Some(&h.who)));
            }
        }
        let mut out = Vec::with_capacity(picked.len());
        for (path, ((change, before, after), who)) in picked {
            let side = |e: Option<&ViewEntry>| -> io::Result<Option<EntryFacts>> {
                let Some(e) = e else { return Ok(None) };
                // Store objects are named by their hash: only live files, and symlinks (for
                // their target), are read.
                let read =
                    matches!(e.content, ViewContent::Live(_)) || e.meta.kind == EntryKind::Symlink;
                if !read {
                    return facts(e, None).map(Some);
                }
                let (e, content) = read_side(self, &path, Some(e))?;
                e.map(|e| facts(&e, content.as_ref())).transpose()
            };
            out.push(LogChange {
                before: side(before.as_ref())?,
                after: side(after.as_ref())?,
                actors: who.map(Changers::actors).unwrap_or_default(),
                sessions: who.map(Changers::sessions).unwrap_or_default(),
                path: shown(&path),
                change,
            });
        }
        Ok(out)
    }
}

/// Who changed a path in one interval: process names by agent session (`None`: processes in
/// no registered session — the user, a script).
#[derive(Debug, Default, Clone)]
pub(crate) struct Changers {
    pub by_session: BTreeMap<Option<String>, BTreeSet<String>>,
    /// A rewind (by this daemon) changed it too.
    pub rewound: bool,
}

/// What a kept [`LogIndex`] was built from: the transcript read so far (file, offset) and
/// the model's next seq.
pub(crate) type LogIndexKey = (Option<(u64, u64)>, u64, u64);

/// The transcript's changers as far as it was read: see [`History::changers_by_epoch`].
/// Between gcs the transcript is only appended to; gc and the format migrations replace it
/// whole (a rename over it: a new inode), after which it is read again from the start.
#[derive(Default)]
pub(crate) struct ChangersCache {
    /// (st_dev, st_ino) of the file read so far.
    file: Option<(u64, u64)>,
    /// Where the last complete line read ends.
    read: crate::transcript::replay::Position,
    /// The epoch the records after `read` are in.
    epoch: usize,
    changers: Arc<BTreeMap<(usize, String), Changers>>,
}

impl ChangersCache {
    /// Reads what the transcript at `path` gained since the last call (everything, if it was
    /// replaced or is read for the first time).
    fn catch_up(&mut self, path: &std::path::Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                *self = ChangersCache::default();
                return Ok(());
            }
            Err(e) => {
                return Err(crate::sys::context(
                    format!("opening {}", path.display()),
                    e,
                ));
            }
        };
        let meta = file
            .metadata()
            .map_err(|e| crate::sys::context(format!("reading {}", path.display()), e))?;
        let id = (meta.dev(), meta.ino());
        if self.file != Some(id) || meta.len() < self.read.offset {
            *self = ChangersCache {
                file: Some(id),
                ..ChangersCache::default()
            };
        }
        if meta.len() == self.read.offset {
            return Ok(());
        }
        // Copy-on-write: a LogIndex still holding the map keeps its own, unchanged copy.
        let changers = Arc::make_mut(&mut self.changers);
        let epoch = &mut self.epoch;
        match crate::transcript::replay::scan_transcript_from(path, file, self.read, |r| {
            add_changers(changers, epoch, r)
        }) {
            Ok(end) => {
                self.read = end;
                Ok(())
            }
            Err(e) => {
                // Part of what was read is in the map already: start over next time.
                *self = ChangersCache::default();
                Err(e.into())
            }
        }
    }
}

/// Folds one transcript record into `changers`; a checkpoint record starts the next epoch.
fn add_changers(
    changers: &mut BTreeMap<(usize, String), Changers>,
    epoch: &mut usize,
    r: crate::transcript::record::Record,
) {
    if r.record_type != FILE_HISTORY_SNAPSHOT {
        return;
    }
    if !r.is_snapshot_update {
        *epoch += 1;
        return;
    }
    for (path, b) in r.snapshot.tracked_file_backups {
        let Some(a) = b.actor else {
            continue;
        };
        if is_own_rewind(&a) {
            // A rewind restores recorded states: it is nobody's new work.
            changers.entry((*epoch, path)).or_default().rewound = true;
            continue;
        }
        let name = if a.comm.is_empty() {
            format!("pid {}", a.pid)
        } else {
            a.comm
        };
        changers
            .entry((*epoch, path))
            .or_default()
            .by_session
            .entry(a.session)
            .or_default()
            .insert(name);
    }
}

/// Whether a record's actor is the daemon itself, i.e. a rewind writing through the mount:
/// the daemon names its own threads `checkpointfs` and records no executable for them.
fn is_own_rewind(a: &crate::transcript::record::Actor) -> bool {
    a.comm == "checkpointfs" && a.exe.is_none() && a.session.is_none()
}

impl Changers {
    /// Every process name, sorted, once (`checkpointfs` for a rewind).
    pub(crate) fn actors(&self) -> Vec<String> {
        let mut all: BTreeSet<&str> = self
            .by_session
            .values()
            .flatten()
            .map(String::as_str)
            .collect();
        if self.rewound {
            all.insert("checkpointfs");
        }
        all.into_iter().map(str::to_string).collect()
    }

    pub(crate) fn sessions(&self) -> Vec<String> {
        self.by_session.keys().flatten().cloned().collect()
    }
}

/// Where the changes listed under one checkpoint start and end.
struct Span {
    from: Point,
    /// The tree's next checkpoint (or now): the end for everyone but the checkpoint's session.
    until: Point,
    /// The end for the checkpoint's own session: its next checkpoint (or now).
    own_until: Point,
    /// The transcript epoch right after `from` (see [`History::changers_by_epoch`]).
    epoch: usize,
}

/// See [`History::log_index`].
pub(crate) struct LogIndex {
    /// The kept checkpoints, oldest first.
    pub checkpoints: Vec<super::model::Checkpoint>,
    changers: Arc<BTreeMap<(usize, String), Changers>>,
    index: super::changes::VersionIndex,
    first_kept: usize,
    history_dropped: bool,
    next_own: Vec<Option<usize>>,
    /// See [`attribute`]: slot `i + 1` is checkpoint `i`.
    slots: Vec<BTreeMap<String, Attributed>>,
}

impl LogIndex {
    pub fn len(&self) -> usize {
        self.checkpoints.len()
    }

    /// Checkpoint `i` (by position) as a point; past the last: now.
    pub fn point(&self, i: usize) -> Point {
        if i < self.checkpoints.len() {
            Point::Checkpoint(self.first_kept + i)
        } else {
            Point::Now
        }
    }

    fn span(&self, i: usize) -> Span {
        Span {
            from: self.point(i),
            until: self.point(i + 1),
            own_until: self.next_own[i].map_or(Point::Now, |j| self.point(j)),
            epoch: i + 1,
        }
    }

    /// The position of the latest kept checkpoint recorded before seq `seq` (none: `seq`
    /// comes before the oldest kept one).
    pub fn position_before(&self, seq: u64) -> Option<usize> {
        self.checkpoints
            .partition_point(|c| c.seq < seq)
            .checked_sub(1)
    }

    /// Where the change of `path` listed under checkpoint `i` is compared: from the
    /// checkpoint to its session's next one when that session changed it, else to the
    /// tree's next one (see [`attribute`]).
    pub fn change_span(&self, i: usize, path: &str) -> (Point, Point) {
        let span = self.span(i);
        match self.slots[i + 1].get(path) {
            Some(a) if a.own => (span.from, span.own_until),
            _ => (span.from, span.until),
        }
    }

    /// The processes and sessions recorded as changing `path` under checkpoint `i`.
    pub fn changers_of(&self, i: usize, path: &str) -> (Vec<String>, Vec<String>) {
        self.slots[i + 1]
            .get(path)
            .map(|a| (a.who.actors(), a.who.sessions()))
            .unwrap_or_default()
    }

    /// Whether agent session `session` (see [`session_matches`]) took checkpoint `i` or is
    /// recorded as changing something listed under it: the checkpoints `log --session` keeps.
    pub fn concerns_session(&self, i: usize, session: &str) -> bool {
        self.checkpoints[i]
            .session
            .as_deref()
            .is_some_and(|s| session_matches(session, s))
            || self.slots[i + 1].values().any(|a| {
                a.who
                    .by_session
                    .keys()
                    .flatten()
                    .any(|s| session_matches(session, s))
            })
    }

    /// Positions of the checkpoints `path` is attributed to (see [`attribute`]), and of
    /// those whose next checkpoint (index in memory, from `made_at`) made a version of it:
    /// the checkpoints whose listed changes may include it.
    pub fn candidates_for(&self, path: &str, made_at: &[usize]) -> BTreeSet<usize> {
        let mut out: BTreeSet<usize> = (0..self.len())
            .filter(|&i| self.slots[i + 1].contains_key(path))
            .collect();
        for &k in made_at {
            if k > self.first_kept && k - self.first_kept <= self.len() {
                out.insert(k - self.first_kept - 1);
            }
        }
        out
    }
}

/// The changers of one path attributed to one checkpoint.
#[derive(Debug, Default, Clone)]
pub(crate) struct Attributed {
    pub who: Changers,
    /// The checkpoint's own session is among them: the path is compared up to that
    /// session's next checkpoint.
    pub own: bool,
}

/// For each checkpoint (by position), the position of the next one of the same session;
/// `None` for the latest of its session, and for checkpoints without a session.
fn next_of_same_session(sessions: &[Option<&str>]) -> Vec<Option<usize>> {
    let mut next: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut out = vec![None; sessions.len()];
    for (i, s) in sessions.iter().enumerate().rev() {
        if let Some(s) = s {
            out[i] = next.insert(s, i);
        }
    }
    out
}

/// Which checkpoint each recorded change is listed under, by slot: 0 is before the first
/// checkpoint, `i + 1` is checkpoint `i` (by position; `sessions[i]` is its session).
///
/// With several agent sessions in one tree the checkpoints of all of them form one
/// sequence, but a prompt of session S lasts from S's checkpoint to S's *next* one, however
/// many checkpoints other sessions take meanwhile. So a change made by S in epoch `e` (after
/// checkpoint `e - 1`) goes under S's latest checkpoint at or before `e - 1`. Changes by no
/// session (the user, a script), by the daemon's rewinds, and by a session that took no
/// checkpoint before them (not yet, or its checkpoints were recorded before sessions were)
/// go under the tree's latest checkpoint, `e - 1`, as with one session. With a single
/// session, or none, this is exactly "each checkpoint lists what changed up to the next".
pub(crate) fn attribute(
    sessions: &[Option<&str>],
    changers: &BTreeMap<(usize, String), Changers>,
) -> Vec<BTreeMap<String, Attributed>> {
    let n = sessions.len();
    let mut slots: Vec<BTreeMap<String, Attributed>> = vec![BTreeMap::new(); n + 1];
    // session → its latest checkpoint before the epoch being read (the map is sorted by
    // epoch first); `seen` checkpoints are in it.
    let mut latest: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut seen = 0;
    for ((epoch, path), who) in changers {
        // An epoch past the last kept checkpoint cannot be (every checkpoint record counts
        // one); clamped rather than trusted.
        let e = (*epoch).min(n);
        while seen < e {
            if let Some(s) = sessions[seen] {
                latest.insert(s, seen);
            }
            seen += 1;
        }
        for (s, names) in &who.by_session {
            let own = s.as_deref().and_then(|s| latest.get(s)).copied();
            let a = slots[own.map_or(e, |j| j + 1)]
                .entry(path.clone())
                .or_default();
            a.own |= own.is_some();
            a.who
                .by_session
                .entry(s.clone())
                .or_default()
                .extend(names.iter().cloned());
        }
        if who.rewound {
            slots[e].entry(path.clone()).or_default().who.rewound = true;
        }
    }
    slots
}

/// path → the others who also changed it (see [`History::session_changes_since`]).
pub(crate) type SessionChanges = BTreeMap<String, BTreeSet<String>>;

impl History {
    /// The paths session `session` changed after checkpoint `k` (an index in memory), each
    /// with the others who also changed it then (`session XXXXXXXX (names)`, or `names` for
    /// processes in no session): empty means only the session did.
    pub(crate) fn session_changes_since(
        &self,
        k: usize,
        session: &str,
    ) -> io::Result<SessionChanges> {
        self.session_changes_between(k, None, session)
    }

    /// As [`History::session_changes_since`], but only up to checkpoint `until` (an index in
    /// memory; `None`: up to now).
    pub(crate) fn session_changes_between(
        &self,
        k: usize,
        until: Option<usize>,
        session: &str,
    ) -> io::Result<SessionChanges> {
        let (first_kept, _) = self.first_kept();
        // Epoch e of the transcript ends at checkpoint first_kept + e; changes after k are in
        // the epochs after k's, and those up to `until` in the epochs up to its own.
        let after = k.saturating_sub(first_kept) + 1;
        let last = until.map_or(usize::MAX, |u| u.saturating_sub(first_kept));
        let mut by_path: BTreeMap<String, Changers> = BTreeMap::new();
        for ((epoch, path), who) in self.changers_by_epoch()?.iter() {
            if *epoch < after || *epoch > last {
                continue;
            }
            let merged = by_path.entry(path.clone()).or_default();
            merged.rewound |= who.rewound;
            for (s, names) in &who.by_session {
                merged
                    .by_session
                    .entry(s.clone())
                    .or_default()
                    .extend(names.iter().cloned());
            }
        }
        let mut out = BTreeMap::new();
        for (path, who) in by_path {
            let ours = who
                .by_session
                .keys()
                .flatten()
                .any(|s| session_matches(session, s));
            if !ours {
                continue;
            }
            let others: BTreeSet<String> = who
                .by_session
                .iter()
                .filter(|(s, _)| !s.as_deref().is_some_and(|s| session_matches(session, s)))
                .map(|(s, names)| {
                    let names = names.iter().cloned().collect::<Vec<_>>().join(", ");
                    match s {
                        Some(s) => format!("session {} ({names})", s.get(..8).unwrap_or(s)),
                        None => names,
                    }
                })
                .collect();
            out.insert(path, others);
        }
        Ok(out)
    }
}

/// Whether `session` (a full id, or a prefix of at least 8 characters, as the text log
/// shows) names `id`.
pub(crate) fn session_matches(session: &str, id: &str) -> bool {
    id == session || (session.len() >= 8 && id.starts_with(session))
}

impl LogReport {
    /// The log of one session: its own checkpoints, each with the changes it made after
    /// it (up to its next checkpoint), and what it made before its first. A change of the
    /// session listed under a checkpoint of no session or another one (made before the
    /// session took any, or recorded before checkpoints carried their session) keeps that
    /// checkpoint in, so nothing the session did is left out.
    pub fn keep_only_session(&mut self, session: &str) {
        let keep = |changes: &mut Vec<LogChange>| {
            changes.retain(|c| c.sessions.iter().any(|s| session_matches(session, s)));
        };
        keep(&mut self.before_first.changes);
        self.before_first.files_changed = self.before_first.changes.len();
        for c in &mut self.checkpoints {
            keep(&mut c.changes);
            c.files_changed = c.changes.len();
        }
        self.checkpoints.retain(|c| {
            c.session
                .as_deref()
                .is_some_and(|s| session_matches(session, s))
                || !c.changes.is_empty()
        });
    }
}

// ---------------------------------------------------------------------------------------
// diff
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiffReport {
    pub schema: String,
    pub from: DiffPoint,
    pub to: DiffPoint,
    pub files_changed: usize,
    pub insertions: usize,
    pub deletions: usize,
    pub files: Vec<FileDiff>,
}

/// One end of a diff: a checkpoint, or the live tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DiffPoint {
    Checkpoint {
        id: String,
        #[serde(flatten)]
        time: Timestamp,
    },
    Live,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentChange {
    /// Both sides are text (or absent): lines were counted.
    Text,
    /// A side is not UTF-8 text or contains a NUL byte: sizes only.
    Binary,
    /// No content changed: directories, special files, or a change of mode or type only.
    None,
    /// A side is bigger than [`LARGE_FILE`]: compared, not diffed by lines (see
    /// `bytes_changed`); `--full` diffs it.
    Large,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileDiff {
    pub path: String,
    pub change: ChangeKind,
    pub before: Option<EntryFacts>,
    pub after: Option<EntryFacts>,
    pub content: ContentChange,
    /// Lines added and removed (0 unless `content` is text).
    pub insertions: usize,
    pub deletions: usize,
    /// The unified diff's hunks (3 lines of context), for text content, unless `--stat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// With `content` `large`: how many bytes differ (at the same offset, plus the
    /// difference of the sizes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_changed: Option<u64>,
}

fn is_text(b: &[u8]) -> bool {
    !b.contains(&0) && std::str::from_utf8(b).is_ok()
}

impl History {
    fn diff_point(&self, p: Point) -> DiffPoint {
        match p {
            Point::Checkpoint(k) => match self.checkpoint_at(k) {
                Some(c) => DiffPoint::Checkpoint {
                    id: c.id.clone(),
                    time: Timestamp::of(c.time),
                },
                // Indices are never reused while mounted (gc leaves placeholders), and a
                // report holds the maintenance lock, so an index once found stays valid.
                None => DiffPoint::Live,
            },
            Point::Origin | Point::Now => DiffPoint::Live,
        }
    }

    /// What changed from checkpoint `from` to `to` (default: the live tree); with
    /// `with_patch`, the hunks of each text file too.
    pub fn diff_report(
        &self,
        from: &str,
        to: Option<&str>,
        with_patch: bool,
        full: bool,
    ) -> io::Result<DiffReport> {
        let a = self.point(from)?;
        let b = match to {
            Some(id) => self.point(id)?,
            None => Point::Now,
        };
        let mut files = Vec::new();
        for (path, (change, before, after)) in self.changes(a, b)? {
            files.push(self.file_diff(
                &path,
                change,
                before.as_ref(),
                after.as_ref(),
                with_patch,
                full,
            )?);
        }
        Ok(DiffReport {
            schema: DIFF_SCHEMA.to_string(),
            from: self.diff_point(a),
            to: self.diff_point(b),
            files_changed: files.len(),
            insertions: files.iter().map(|f| f.insertions).sum(),
            deletions: files.iter().map(|f| f.deletions).sum(),
            files,
        })
    }

    /// [`History::diff_report`], and with `session` only the paths that agent session
    /// changed between the two points.
    pub fn diff_report_of(
        &self,
        from: &str,
        to: Option<&str>,
        with_patch: bool,
        session: Option<&str>,
        full: bool,
    ) -> io::Result<DiffReport> {
        let mut report = self.diff_report(from, to, with_patch, full)?;
        if let Some(s) = session {
            let k = |id: &str| {
                self.checkpoint_index(id).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no checkpoint named '{id}' (see: checkpointfs log MNT)"),
                    )
                })
            };
            let until = to.map(k).transpose()?;
            let theirs = self.session_changes_between(k(from)?, until, s)?;
            report.files.retain(|f| theirs.contains_key(&f.path));
            report.files_changed = report.files.len();
            report.insertions = report.files.iter().map(|f| f.insertions).sum();
            report.deletions = report.files.iter().map(|f| f.deletions).sum();
        }
        Ok(report)
    }

    /// One path's diff. Memory stays bounded by [`LARGE_FILE`] per side whatever the sizes,
    /// but with `full` for text files, which are then read whole for a line diff (a sparse
    /// file never is text: its holes read as NUL bytes).
    pub(crate) fn file_diff(
        &self,
        path: &str,
        change: ChangeKind,
        before: Option<&ViewEntry>,
        after: Option<&ViewEntry>,
        with_patch: bool,
        full: bool,
    ) -> io::Result<FileDiff> {
        let (before, old) = read_side(self, path, before)?;
        let (after, new) = read_side(self, path, after)?;
        let mut d = FileDiff {
            path: shown(path),
            change,
            before: before
                .as_ref()
                .map(|e| facts(e, old.as_ref()))
                .transpose()?,
            after: after.as_ref().map(|e| facts(e, new.as_ref())).transpose()?,
            content: ContentChange::None,
            insertions: 0,
            deletions: 0,
            patch: None,
            bytes_changed: None,
        };
        if old.is_none() && new.is_none() {
            return Ok(d);
        }
        let len = |c: &Option<Content>| c.as_ref().map_or(Ok(0), Content::len);
        let (old_len, new_len) = (len(&old)?, len(&new)?);
        if old_len.max(new_len) > LARGE_FILE {
            let text = |c: &Option<Content>| c.as_ref().map_or(Ok(true), Content::is_text);
            if !(full && text(&old)? && text(&new)?) {
                let changed = match (&old, &new) {
                    (Some(Content::File(a)), Some(Content::File(b))) => {
                        super::compare::bytes_changed(a, b)?
                    }
                    // Added, deleted, or of another type: all of it.
                    _ => old_len.max(new_len),
                };
                if changed > 0 {
                    if full {
                        d.content = ContentChange::Binary;
                    } else {
                        d.content = ContentChange::Large;
                        d.bytes_changed = Some(changed);
                    }
                }
                return Ok(d);
            }
        }
        let bytes = |c: Option<Content>| c.map_or(Ok(Vec::new()), Content::bytes);
        let (old, new) = (bytes(old)?, bytes(new)?);
        if old == new {
            return Ok(d);
        }
        if !is_text(&old) || !is_text(&new) {
            d.content = ContentChange::Binary;
            return Ok(d);
        }
        let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
        let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
        for c in diff.iter_all_changes() {
            match c.tag() {
                similar::ChangeTag::Insert => d.insertions += 1,
                similar::ChangeTag::Delete => d.deletions += 1,
                similar::ChangeTag::Equal => {}
            }
        }
        d.content = ContentChange::Text;
        if with_patch {
            d.patch = Some(diff.unified_diff().context_radius(3).to_string());
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Layer 1 record of `path` changed by `comm`, or a checkpoint record (`comm` None).
    fn line(seq: u64, path: &str, comm: Option<&str>) -> String {
        use crate::transcript::record::{Actor, Record};
        use crate::transcript::testutil::file_entry;
        const T: &str = "2026-01-02T03:04:05.678Z";
        let r = match comm {
            Some(comm) => {
                let mut b = file_entry(1, &"0".repeat(64), T);
                b.actor = Some(Actor {
                    pid: 7,
                    uid: 0,
                    comm: comm.to_string(),
                    exe: Some("/bin/x".into()),
                    session: None,
                });
                Record::snapshot_update(None, seq, T.into(), BTreeMap::from([(path.into(), b)]))
            }
            None => Record::checkpoint_delta(&format!("c{seq}"), seq, T.into(), BTreeMap::new()),
        };
        serde_json::to_string(&r).unwrap() + "\n"
    }

    fn names(map: &BTreeMap<(usize, String), Changers>) -> Vec<(usize, String, Vec<String>)> {
        map.iter()
            .map(|((e, p), c)| (*e, p.clone(), c.actors()))
            .collect()
    }

    /// The cache read in steps as the transcript grows (with a write under way at the end)
    /// gives what one read of the whole file gives; a transcript replaced whole (gc) is read
    /// again from the start.
    #[test]
    #[allow(
        clippy::disallowed_methods,
        reason = "the test writes a transcript as the writer and gc would"
    )]
    fn the_changers_cache_reads_only_what_was_appended_and_starts_over_on_a_new_file() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut cache = ChangersCache::default();
        cache.catch_up(&path).unwrap();
        assert!(cache.changers.is_empty());

        file.write_all(line(1, "a", Some("sed")).as_bytes())
            .unwrap();
        file.write_all(line(2, "", None).as_bytes()).unwrap();
        cache.catch_up(&path).unwrap();
        let held = cache.changers.clone(); // a LogIndex of an earlier request
        // A record written halfway: not read until its line is complete.
        let third = line(3, "b", Some("vim"));
        let (head, tail) = third.split_at(20);
        file.write_all(head.as_bytes()).unwrap();
        cache.catch_up(&path).unwrap();
        assert_eq!(
            names(&cache.changers),
            [(0, "a".into(), vec!["sed".into()])]
        );
        file.write_all(tail.as_bytes()).unwrap();
        file.write_all(line(4, "", None).as_bytes()).unwrap();
        file.write_all(line(5, "a", Some("bash")).as_bytes())
            .unwrap();
        cache.catch_up(&path).unwrap();
        let expected = [
            (0, "a".to_string(), vec!["sed".to_string()]),
            (1, "b".into(), vec!["vim".into()]),
            (2, "a".into(), vec!["bash".into()]),
        ];
        assert_eq!(names(&cache.changers), expected);
        assert_eq!(names(&held), expected[..1], "the earlier map is unchanged");
        let mut whole = ChangersCache::default();
        whole.catch_up(&path).unwrap();
        assert_eq!(names(&whole.changers), expected);
        assert_eq!(whole.read, cache.read);

        // gc: a compacted transcript renamed over the old one.
        let new = dir.path().join("new.jsonl");
        std::fs::write(&new, line(9, "z", Some("cp"))).unwrap();
        std::fs::rename(&new, &path).unwrap();
        cache.catch_up(&path).unwrap();
        assert_eq!(names(&cache.changers), [(0, "z".into(), vec!["cp".into()])]);
    }

    /// A damaged line stops the read with its line number, and the next read starts over
    /// rather than counting the records before it twice.
    #[test]
    #[allow(
        clippy::disallowed_methods,
        reason = "the test writes a transcript as the writer and gc would"
    )]
    fn the_changers_cache_names_a_damaged_line_and_then_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let good = line(1, "a", Some("sed")) + &line(2, "", None);
        std::fs::write(&path, format!("{good}{{not json\n")).unwrap();
        let mut cache = ChangersCache::default();
        let e = cache.catch_up(&path).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        std::fs::write(&path, &good).unwrap();
        cache.catch_up(&path).unwrap();
        assert_eq!(
            names(&cache.changers),
            [(0, "a".into(), vec!["sed".into()])]
        );
        assert_eq!(cache.epoch, 1);
    }

    fn who(session: Option<&str>, name: &str) -> Changers {
        let mut c = Changers::default();
        c.by_session
            .entry(session.map(str::to_string))
            .or_default()
            .insert(name.to_string());
        c
    }

    /// One attributed path: (path, its sessions, own).
    type Shaped<'a> = (&'a str, Vec<Option<&'a str>>, bool);

    /// slot → its attributed paths, for comparison.
    fn shape(slots: &[BTreeMap<String, Attributed>]) -> Vec<Vec<Shaped<'_>>> {
        slots
            .iter()
            .map(|slot| {
                slot.iter()
                    .map(|(p, a)| {
                        let s = a.who.by_session.keys().map(Option::as_deref).collect();
                        (p.as_str(), s, a.own)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn each_session_s_changes_go_under_its_own_latest_checkpoint() {
        // Checkpoints: A(0), B(1), A(2), user(3).
        let sessions = [Some("A"), Some("B"), Some("A"), None];
        assert_eq!(next_of_same_session(&sessions), [Some(2), None, None, None]);
        let mut changers = BTreeMap::new();
        // Before any checkpoint, by A: before the first.
        changers.insert((0, "early".to_string()), who(Some("A"), "sh"));
        // After B(1): A's under A(0), B's under B(1), the user's under B(1).
        changers.insert((2, "a".to_string()), who(Some("A"), "sh"));
        changers.insert((2, "b".to_string()), who(Some("B"), "sed"));
        changers.insert((2, "u".to_string()), who(None, "vim"));
        // After user(3): A's under A(2), B's under B(1), a rewind's under user(3); C never
        // took a checkpoint: under the tree's latest.
        let mut both = who(Some("A"), "sh");
        both.by_session
            .entry(Some("B".to_string()))
            .or_default()
            .insert("sh".to_string());
        both.rewound = true;
        changers.insert((4, "shared".to_string()), both);
        changers.insert((4, "c".to_string()), who(Some("C"), "sh"));
        let slots = attribute(&sessions, &changers);
        assert_eq!(
            shape(&slots),
            vec![
                vec![("early", vec![Some("A")], false)],
                vec![("a", vec![Some("A")], true)],
                vec![
                    ("b", vec![Some("B")], true),
                    ("shared", vec![Some("B")], true),
                    ("u", vec![None], false),
                ],
                vec![("shared", vec![Some("A")], true)],
                vec![("c", vec![Some("C")], false), ("shared", vec![], false)],
            ]
        );
        assert!(slots[4]["shared"].who.rewound);
        assert!(!slots[3]["shared"].who.rewound);
    }

    #[test]
    fn with_checkpoints_of_no_session_everything_goes_under_the_tree_s_latest() {
        // A transcript from before checkpoints carried their session.
        let sessions = [None, None];
        let mut changers = BTreeMap::new();
        changers.insert((1, "a".to_string()), who(Some("A"), "sh"));
        changers.insert((2, "a".to_string()), who(Some("A"), "sh"));
        changers.insert((2, "u".to_string()), who(None, "vim"));
        let slots = attribute(&sessions, &changers);
        assert_eq!(
            shape(&slots),
            vec![
                vec![],
                vec![("a", vec![Some("A")], false)],
                vec![("a", vec![Some("A")], false), ("u", vec![None], false)],
            ]
        );
    }
}
