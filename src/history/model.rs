//! The history model: what a tracked path's versions are, what a checkpoint is, and how a
//! record changes them. Pure: no filesystem, no locks, no clock. Replay and live use both
//! apply records through [`apply_record`], so what is recorded is exactly what is replayed,
//! and [`impossible`] is the one judge of a history no daemon could have written.
//!
//! Invariants (kept by [`apply_record`] for every record [`impossible`] lets through):
//! 1. A tracked path has at least one version; v1 is its pre-image (`since: None`).
//! 2. Versions are numbered 1, 2, … with no gap; a record names version n only when the path
//!    has n−1 (a new version) or at least n (a fill of a pending one, or a repeat).
//! 3. `Version::since` increases along the list: a version made by checkpoint k follows every
//!    version made before it.
//! 4. So the state of a path at checkpoint k is its last version with `since <= k`, or v1
//!    ([`PathHistory::version_at`]), and that index is always within the list.
//! 5. A checkpoint record lists only the paths with a new version (delta form); every other
//!    path keeps the version it had, so composing deltas gives the full state at each one.
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::SystemTime;

use super::renames::{Renames, below};
use crate::transcript::record::{
    Actor, EntryMeta, FILE_HISTORY_SNAPSHOT, Record, TrackedFileBackup, rfc3339,
};

/// One version of one path.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    /// The checkpoint (index) that created this version; `None` for v1, the pre-image.
    pub since: Option<usize>,
    pub state: VersionState,
    pub time: SystemTime,
}

#[derive(Debug, Clone, PartialEq)]
pub enum VersionState {
    /// Content still to be copied; the path is unchanged since the checkpoint that made it.
    Pending,
    Absent,
    /// `object`: the store object with the content (files) or the target (symlinks).
    Present {
        meta: EntryMeta,
        object: Option<String>,
    },
}

/// What a Layer 1 record of a path says: the path's state just before a change.
#[derive(Debug, Clone, PartialEq)]
pub enum Before {
    /// That version (1-based): a new v1, or a repeat of the version stored last.
    Version(usize),
    /// A `preimage` entry (format 4): a state that is no version.
    State(VersionState),
}

#[derive(Debug, Default)]
pub struct PathHistory {
    pub versions: Vec<Version>,
    /// The path's Layer 1 records that are changes (neither fills nor gc bases), in seq
    /// order: (seq, what it says). Lookups through renames read the first one after a seq.
    pub changes: Vec<(u64, Before)>,
    /// The seq of the record that made v1 (a gcBase's: before the oldest kept checkpoint).
    pub v1_seq: Option<u64>,
    /// Changed since the last checkpoint (or open for writing across it).
    pub dirty: bool,
    /// Number of checkpoints when the path was first tracked: checkpoint k lists the path
    /// iff `first_epoch <= k`.
    pub first_epoch: usize,
}

impl PathHistory {
    /// The version number (1-based) holding the state at checkpoint `k`.
    pub fn version_at(&self, k: usize) -> usize {
        self.versions
            .iter()
            .rposition(|v| v.since.is_some_and(|c| c <= k))
            .map_or(1, |i| i + 1)
    }

    pub(crate) fn latest_is_pending(&self) -> bool {
        matches!(
            self.versions.last().map(|v| &v.state),
            Some(VersionState::Pending)
        )
    }
}

#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub id: String,
    /// The seq of its record (`c_k` in docs/design.md, "Renames in O(1)").
    pub seq: u64,
    pub time: SystemTime,
    /// The agent session that took it (see [`Record::session`](crate::transcript::record::Record::session)),
    /// if one is known.
    pub session: Option<String>,
}

#[derive(Default)]
pub(crate) struct State {
    pub paths: HashMap<String, PathHistory>,
    /// The paths with `dirty` set, so that a checkpoint costs O(changed), not O(tracked).
    /// Changed only through [`State::mark_dirty`] and [`State::clear_dirty`].
    pub dirty_paths: HashSet<String>,
    /// parent path → names of its tracked children, for views of directories.
    pub children: HashMap<String, BTreeSet<String>>,
    /// Every checkpoint this daemon has known, by index; those before `first_kept` were
    /// dropped by gc. Indices are never reused or shifted while mounted: views, rewinds and
    /// versions (`Version::since`) refer to checkpoints by index.
    pub checkpoints: Vec<Checkpoint>,
    /// The ids of the kept checkpoints (`first_kept..`) → index.
    pub checkpoint_ids: HashMap<String, usize>,
    /// Index of the oldest checkpoint not dropped by gc (0 until a gc in this daemon).
    pub first_kept: usize,
    /// gc dropped older checkpoints at some point (a `gcBase` record was replayed, or a gc
    /// ran): the state before the oldest kept checkpoint is unknown.
    pub history_dropped: bool,
    pub next_seq: u64,
    /// Paths whose content is being copied right now (by the gate or the copier).
    pub busy: HashSet<String>,
    /// gc is running: no fill (copier, view) may start, since it could record an object the
    /// sweep deletes. Fills wait on `busy_cond` meanwhile.
    pub fills_paused: bool,
    /// Files open for writing whose checkpoint version was left pending because copying
    /// them would have held every mutation too long (see history/open_files.rs): their fill
    /// is a copy of one moment, not a plain read-loop copy. Invariant: only a path's latest
    /// version is pending, except the one a copy under way (`busy`) is filling, which that
    /// copy fills; so a checkpoint gives a path listed here no new version while its latest
    /// is pending and no copy has begun for it.
    pub open_fills: HashSet<String>,
    /// path → (epoch, the processes/sessions recorded as changing it in that epoch): a
    /// further changer of a path already changed in this message is recorded once too, so
    /// `log` names everyone and a session-scoped rewind sees conflicts. An entry of an older
    /// epoch counts as empty.
    pub message_actors: HashMap<String, (usize, Vec<ActorKey>)>,
    /// Format 4's renames: those that happened, indexed by endpoint, and intents waiting
    /// for their outcome.
    pub renames: Renames,
    /// The paths whose latest version is pending, sorted, so that a rename finds those at
    /// or below its endpoints in O(log n + found) (the copier reads by name: they are
    /// filled before the names move). Kept by [`State::note_pending`].
    pub pending_paths: BTreeSet<String>,
}

/// Who changed a path, as far as attribution goes: the process and its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ActorKey {
    pub pid: u32,
    pub session: Option<String>,
}

impl State {
    /// Notes that `key` changed `rel` in the current epoch; `false` if that was known.
    pub(crate) fn note_actor(&mut self, rel: &str, key: ActorKey) -> bool {
        let epoch = self.checkpoints.len();
        let entry = self
            .message_actors
            .entry(rel.to_string())
            .or_insert_with(|| (epoch, Vec::new()));
        if entry.0 != epoch {
            *entry = (epoch, Vec::new());
        }
        if entry.1.contains(&key) {
            return false;
        }
        entry.1.push(key);
        true
    }
}

impl State {
    /// Updates [`State::pending_paths`] for `rel` after its versions changed.
    pub(crate) fn note_pending(&mut self, rel: &str) {
        if self
            .paths
            .get(rel)
            .is_some_and(PathHistory::latest_is_pending)
        {
            if !self.pending_paths.contains(rel) {
                self.pending_paths.insert(rel.to_string());
            }
        } else {
            self.pending_paths.remove(rel);
        }
    }

    /// The paths at or below `dir` whose latest version is pending.
    pub(crate) fn pending_at_or_below(&self, dir: &str) -> Vec<String> {
        self.pending_paths
            .range(dir.to_string()..)
            .take_while(|p| p.starts_with(dir))
            .filter(|p| p.len() == dir.len() || p.as_bytes()[dir.len()] == b'/')
            .cloned()
            .collect()
    }

    /// Whether an ancestor of `rel` was renamed after seq `t` (so what is at `rel` now is
    /// not what its records or versions up to `t` say).
    pub(crate) fn renamed_above_since(&self, rel: &str, t: u64) -> bool {
        self.renames
            .first_ancestor_rename_after(rel, Some(t))
            .is_some()
    }

    /// The seq at which `rel`'s latest version was made (its checkpoint's, or v1's record).
    pub(crate) fn latest_version_seq(&self, h: &PathHistory) -> u64 {
        match h.versions.last().and_then(|v| v.since) {
            Some(k) => self.checkpoints.get(k).map_or(0, |c| c.seq),
            None => h.v1_seq.unwrap_or(0),
        }
    }

    /// Marks tracked path `rel` changed since the last checkpoint.
    pub fn mark_dirty(&mut self, rel: &str) {
        if let Some(h) = self.paths.get_mut(rel) {
            h.dirty = true;
            if !self.dirty_paths.contains(rel) {
                self.dirty_paths.insert(rel.to_owned());
            }
        }
    }

    /// A checkpoint was taken: nothing is changed since it. Returns the paths that were.
    pub fn clear_dirty(&mut self) -> Vec<String> {
        let dirty: Vec<String> = self.dirty_paths.drain().collect();
        for p in &dirty {
            if let Some(h) = self.paths.get_mut(p) {
                h.dirty = false;
            }
        }
        dirty
    }

    /// The checkpoints that were not dropped by gc, oldest first.
    pub fn kept(&self) -> &[Checkpoint] {
        &self.checkpoints[self.first_kept.min(self.checkpoints.len())..]
    }

    pub(crate) fn current_message(&self) -> Option<String> {
        self.checkpoints.last().map(|c| c.id.clone())
    }

    pub(crate) fn track_child(&mut self, rel: &str) {
        let (parent, name) = split_parent(rel);
        self.children
            .entry(parent.to_string())
            .or_default()
            .insert(name.to_string());
    }
}

/// Splits `a/b/c` into (`a/b`, `c`); a top-level name has parent "" (the root).
pub fn split_parent(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

/// Why record `r` cannot follow the records replayed into `state`: a history no daemon could
/// have written (a version gap or a version 0, an object name that is not one, or one the
/// store does not hold), or an entry `check_entry` refuses: a set-id mode without a valid MAC
/// ([`crate::transcript::mac::Signer::check`]; the key's IO is the caller's, this stays
/// pure). `has_object` answers for the store.
pub(crate) fn impossible(
    state: &State,
    r: &Record,
    has_object: &mut dyn FnMut(&str) -> bool,
    check_entry: &dyn Fn(&str, &TrackedFileBackup) -> Option<String>,
) -> Option<String> {
    if r.record_type != FILE_HISTORY_SNAPSHOT
        || (!r.is_snapshot_update
            && r.message_id
                .as_ref()
                .is_none_or(|id| state.checkpoint_ids.contains_key(id)))
    {
        // Not applied (see `apply_record`), so nothing to check.
        return None;
    }
    if let Some(why) = impossible_rename(state, r) {
        return Some(why);
    }
    for (path, b) in &r.snapshot.tracked_file_backups {
        let known = state.paths.get(path).map_or(0, |h| h.versions.len());
        if b.version == 0 || b.version as usize > known + 1 {
            return Some(format!(
                "{path:?} jumps to version {} after {known} version{}",
                b.version,
                if known == 1 { "" } else { "s" }
            ));
        }
        if b.preimage && (!r.is_snapshot_update || b.pending || b.fill || known == 0) {
            return Some(format!(
                "{path:?} has a pre-image entry that is not one of a tracked path's changes"
            ));
        }
        if b.preimage && b.version as usize != known {
            return Some(format!(
                "{path:?} has a pre-image entry at version {} of {known}; it names the latest",
                b.version
            ));
        }
        // Invariant 3: only a checkpoint makes a version after v1. A Layer 1 record backs up
        // an untracked path (v1) or fills or repeats a version that exists.
        if r.is_snapshot_update && known > 0 && b.version as usize == known + 1 {
            return Some(format!(
                "{path:?} gets version {} from a backup record; only a checkpoint makes a \
                 version after the first",
                b.version
            ));
        }
        if let Some(name) = &b.backup_file_name {
            if !super::store::is_object_name(name) {
                return Some(format!(
                    "{path:?} version {} names {name:?}, which is not a store object name",
                    b.version
                ));
            }
            if !b.pending && !has_object(name) {
                return Some(format!(
                    "{path:?} version {} needs store object {name}, which is missing",
                    b.version
                ));
            }
        }
        if let Some(name) = b.meta.as_ref().and_then(EntryMeta::xattrs_object) {
            if !super::store::is_object_name(name) {
                return Some(format!(
                    "{path:?} version {} names xattrs {name:?}, which is not a store object name",
                    b.version
                ));
            }
            if !has_object(name) {
                return Some(format!(
                    "{path:?} version {} needs store object {name} (its xattrs), which is \
                     missing",
                    b.version
                ));
            }
        }
        // Every entry of an applied record, repeats included: whatever a rewind could
        // restore was signed by the daemon that recorded it.
        if let Some(why) = check_entry(path, b) {
            return Some(why);
        }
    }
    None
}

/// Why the rename fields of `r` (format 4) cannot follow `state`: a rename record with
/// entries, an endpoint that is not a relative path, endpoints one inside the other, an
/// intent repeated, or an outcome of no intent waiting for one.
fn impossible_rename(state: &State, r: &Record) -> Option<String> {
    let fields = [
        r.rename.is_some(),
        r.renamed.is_some(),
        r.rename_failed.is_some(),
    ];
    let n = fields.iter().filter(|f| **f).count();
    if n == 0 {
        return None;
    }
    if n > 1 || !r.is_snapshot_update || !r.snapshot.tracked_file_backups.is_empty() {
        return Some(
            "a rename record must be a Layer 1 record with no entries and one of rename, \
             renamed, renameFailed"
                .to_string(),
        );
    }
    if let Some(intent) = &r.rename {
        let bad = |p: &str| {
            p.is_empty()
                || p.split('/')
                    .any(|c| c.is_empty() || c == "." || c == ".." || c.contains('\0'))
        };
        for end in [&intent.from, &intent.to] {
            if bad(end) {
                return Some(format!("rename endpoint {end:?} is not a relative path"));
            }
        }
        if intent.from == intent.to
            || below(&intent.from, &intent.to).is_some()
            || below(&intent.to, &intent.from).is_some()
        {
            return Some(format!(
                "rename of {:?} to {:?}: one is inside the other",
                intent.from, intent.to
            ));
        }
        if state.renames.is_pending(r.seq) {
            return Some(format!("rename intent {} repeated", r.seq));
        }
    }
    if let Some(seq) = r.renamed.or(r.rename_failed)
        && !state.renames.is_pending(seq)
    {
        return Some(format!(
            "the outcome of rename {seq}, which no intent before it waits for"
        ));
    }
    None
}

/// Replays `records` as a mount does (refusing an impossible history with replay's
/// message), then looks every path up at every checkpoint as views and rewinds do; returns
/// the number of lookups. For the fuzz harness (tests/it/fuzz.rs): a panic here is a bug.
#[doc(hidden)]
pub fn replay_for_fuzzing(
    records: &[Record],
    has_object: &mut dyn FnMut(&str) -> bool,
    check_entry: &dyn Fn(&str, &TrackedFileBackup) -> Option<String>,
) -> Result<usize, String> {
    let mut state = State::default();
    for r in records {
        if let Some(why) = impossible(&state, r, has_object, check_entry) {
            return Err(why);
        }
        apply_record(&mut state, r);
    }
    let mut lookups = 0;
    for (path, h) in &state.paths {
        for k in 0..=state.checkpoints.len() {
            let n = h.version_at(k);
            // The invariant replay's checks keep: every tracked path has its version at k.
            assert!(
                (1..=h.versions.len()).contains(&n),
                "{path:?} at checkpoint {k}: version {n} of {}",
                h.versions.len()
            );
            lookups += 1;
        }
    }
    Ok(lookups)
}

/// Applies one record to the in-memory state (replay and live use share this, so what is
/// recorded is exactly what is replayed).
pub(crate) fn apply_record(state: &mut State, r: &Record) {
    if r.record_type != FILE_HISTORY_SNAPSHOT {
        return;
    }
    state.next_seq = state.next_seq.max(r.seq + 1);
    state.history_dropped |= r.gc_base;
    if !r.is_snapshot_update {
        let Some(id) = r.message_id.clone() else {
            return;
        };
        if state.checkpoint_ids.contains_key(&id) {
            return;
        }
        let k = state.checkpoints.len();
        let time =
            humantime::parse_rfc3339(&r.snapshot.timestamp).unwrap_or(SystemTime::UNIX_EPOCH);
        state.checkpoints.push(Checkpoint {
            id: id.clone(),
            seq: r.seq,
            time,
            session: r.session.clone(),
        });
        state.checkpoint_ids.insert(id, k);
        state.clear_dirty();
        for (path, b) in &r.snapshot.tracked_file_backups {
            let new_path = !state.paths.contains_key(path);
            let h = state.paths.entry(path.clone()).or_default();
            if new_path {
                h.first_epoch = k;
            }
            if b.version as usize == h.versions.len() + 1 {
                h.versions.push(Version {
                    since: Some(k),
                    state: state_of(b),
                    time: parse_time(&b.backup_time),
                });
            }
            if new_path {
                state.track_child(path);
            }
            state.note_pending(path);
        }
        return;
    }
    if let Some(intent) = &r.rename {
        state.renames.intend(r.seq, intent.as_ref().clone());
    }
    if let Some(seq) = r.renamed {
        state.renames.settle(seq, true);
    }
    if let Some(seq) = r.rename_failed {
        state.renames.settle(seq, false);
    }
    let epoch = state.checkpoints.len();
    for (path, b) in &r.snapshot.tracked_file_backups {
        let new_path = !state.paths.contains_key(path);
        let h = state.paths.entry(path.clone()).or_default();
        if new_path {
            h.first_epoch = epoch;
        }
        let v = b.version as usize;
        if b.preimage {
            // A state that is no version (`impossible` checked the path is tracked).
        } else if v == h.versions.len() + 1 {
            h.versions.push(Version {
                since: None,
                state: state_of(b),
                time: parse_time(&b.backup_time),
            });
        } else if v >= 1
            && v <= h.versions.len()
            && h.versions[v - 1].state == VersionState::Pending
        {
            h.versions[v - 1].state = state_of(b);
        }
        note_layer1(h, r.seq, b);
        state.note_pending(path);
        if !b.fill {
            state.mark_dirty(path);
        }
        if new_path {
            state.track_child(path);
        }
    }
}

/// Notes Layer 1 entry `b` of record `seq` in its path's history `h`, after its version (if
/// any) was added: a change goes to `changes`, and the record that made v1 gives `v1_seq`.
/// Replay and live recording share it.
pub(crate) fn note_layer1(h: &mut PathHistory, seq: u64, b: &TrackedFileBackup) {
    if h.v1_seq.is_none() && b.version == 1 && !b.preimage {
        h.v1_seq = Some(seq);
    }
    if b.fill {
        return;
    }
    let before = if b.preimage {
        Before::State(state_of(b))
    } else {
        Before::Version(b.version as usize)
    };
    h.changes.push((seq, before));
}

/// Where the state of a name at a checkpoint is ([`State::resolve`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// Version `n` (1-based) of tracked name `path` (perhaps another name than the one
    /// looked up: what was there moved).
    Version { path: String, n: usize },
    /// A state recorded as no version (a `preimage` entry), or absent.
    State(VersionState),
    /// What is at `path` in SRC now: nothing changed it since (it is where the content
    /// moved to, if it moved).
    Live(String),
}

impl State {
    /// The state of name `p` at checkpoint `k`: `at(p, c_k)` of docs/design.md ("Lookups
    /// resolve forward"). O(depth · (1 + h)) for `h` ancestor renames met after `k`; with no
    /// rename records, exactly [`PathHistory::version_at`] (or `Live` for an untracked
    /// name). `None` for `k`: the origin (the tree before any change through the mount; the
    /// oldest kept checkpoint once gc dropped the ones before).
    pub fn resolve(&self, p: &str, k: Option<usize>) -> Resolved {
        match k {
            Some(k) => self.at(p, self.checkpoints.get(k).map(|c| c.seq), Some(k)),
            None if self.history_dropped => self.resolve(p, Some(self.first_kept)),
            None => self.at(p, None, None),
        }
    }

    /// Where the entries of directory `dir` at checkpoint `k` are to be found: the names its
    /// content passed through from `k` to now (`dir` first; each holds tracked children of
    /// it), and the live directory that holds it now (`None`: a rename replaced it with
    /// something that had no entries, so none of its entries are live).
    pub fn dir_sources(&self, dir: &str, k: usize) -> (Vec<String>, Option<String>) {
        if dir.is_empty() {
            // The root is never renamed.
            return (vec![String::new()], Some(String::new()));
        }
        // A name no record names: only renames move it, so the lookup ends where the
        // directory's content is now.
        const PROBE: &str = "/\0";
        let mut trace = Vec::new();
        let t = self.checkpoints.get(k).map(|c| c.seq);
        let live = match self.at_traced(&format!("{dir}{PROBE}"), t, None, Some(&mut trace)) {
            Resolved::Live(q) => q.strip_suffix(PROBE).map(str::to_string),
            _ => None,
        };
        let names = trace
            .into_iter()
            .filter_map(|q| q.strip_suffix(PROBE).map(str::to_string))
            .collect();
        (names, live)
    }

    /// The renames after checkpoint `k`, oldest first.
    pub fn renames_since(&self, k: usize) -> Vec<super::renames::Rename> {
        self.renames
            .after(self.checkpoints.get(k).map(|c| c.seq))
            .to_vec()
    }

    /// The names a rewind to `k` compares beyond the tracked names that changed: every
    /// tracked name at or below an endpoint of a rename since `k`, and the names their
    /// content had before each such rename (so that a rename the rewind could not undo is
    /// made good path by path). O(renames since k x tracked names).
    pub fn names_moved_since(&self, k: usize) -> BTreeSet<String> {
        let renames = self.renames_since(k);
        let mut names = BTreeSet::new();
        if renames.is_empty() {
            return names;
        }
        let at_or_below = |dir: &str, p: &str| p == dir || below(dir, p).is_some();
        names.extend(
            self.paths
                .keys()
                .filter(|p| {
                    renames
                        .iter()
                        .any(|r| at_or_below(&r.from, p) || at_or_below(&r.to, p))
                })
                .cloned(),
        );
        for r in renames.iter().rev() {
            let mapped: Vec<String> = names
                .iter()
                .filter_map(|p| {
                    if let Some(rest) = below(&r.to, p) {
                        Some(format!("{}/{rest}", r.from))
                    } else if let (Some(rest), true) = (below(&r.from, p), r.exchange) {
                        Some(format!("{}/{rest}", r.to))
                    } else {
                        None
                    }
                })
                .collect();
            names.extend(mapped);
        }
        names
    }

    /// Whether a rename happened after checkpoint `k`: without one, every lookup at `k`
    /// is today's per-path answer, and untracked names are what they were.
    pub fn renamed_since(&self, k: usize) -> bool {
        !self
            .renames
            .after(self.checkpoints.get(k).map(|c| c.seq))
            .is_empty()
    }

    /// `at(q, t)`: the state of `q` just after seq `t` (`None`: before every record), `k`
    /// the checkpoint whose record `t` is.
    fn at(&self, q: &str, t: Option<u64>, k: Option<usize>) -> Resolved {
        self.at_traced(q, t, k, None)
    }

    /// [`State::at`], pushing onto `trace` each name the lookup passed through (`q` first,
    /// then the name after each rename hop).
    fn at_traced(
        &self,
        q: &str,
        mut t: Option<u64>,
        mut k: Option<usize>,
        mut trace: Option<&mut Vec<String>>,
    ) -> Resolved {
        let mut q = q.to_string();
        loop {
            if let Some(trace) = trace.as_deref_mut() {
                trace.push(q.clone());
            }
            let h = self.paths.get(&q);
            // 1. A version made at k itself.
            if let (Some(k), Some(h)) = (k, h)
                && let Some(i) = h.versions.iter().rposition(|v| v.since == Some(k))
            {
                return Resolved::Version { path: q, n: i + 1 };
            }
            // 2. The first after t of q's next change record and its next ancestor rename.
            let change = h.and_then(|h| {
                let i = h.changes.partition_point(|(s, _)| Some(*s) <= t);
                h.changes.get(i)
            });
            let rename = self.renames.first_ancestor_rename_after(&q, t);
            if let Some((_, before)) = change.filter(|(s, _)| rename.is_none_or(|r| *s < r.seq)) {
                return match before {
                    Before::Version(n) => Resolved::Version { path: q, n: *n },
                    Before::State(state) => Resolved::State(state.clone()),
                };
            }
            let Some(r) = rename else {
                // 3. Neither.
                return self.unchanged_since(&q, t);
            };
            if let Some(rest) = below(&r.from, &q) {
                q = format!("{}/{rest}", r.to);
            } else if let (Some(rest), true) = (below(&r.to, &q), r.exchange) {
                q = format!("{}/{rest}", r.from);
            } else {
                // Below `to` of a plain rename: it replaced an absent name, a
                // non-directory or an empty directory, so nothing was below it.
                return Resolved::State(VersionState::Absent);
            }
            t = Some(r.seq);
            k = None;
        }
    }

    /// 3. Nothing changed `q` after `t`: its latest version at or before `t`, if nothing
    ///    changed it between that version and `t` either (today's answer, which keeps a
    ///    view stable against changes behind the mount's back), else SRC's `q`.
    fn unchanged_since(&self, q: &str, t: Option<u64>) -> Resolved {
        let live = || Resolved::Live(q.to_string());
        let Some(h) = self.paths.get(q) else {
            return live();
        };
        let seq_of = |v: &Version| match v.since {
            Some(j) => self.checkpoints.get(j).map(|c| c.seq),
            None => h.v1_seq,
        };
        let Some((i, vseq)) = h
            .versions
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, v)| seq_of(v).filter(|&s| Some(s) <= t).map(|s| (i, s)))
        else {
            return live();
        };
        let changed_between = h.changes.iter().any(|(s, _)| *s > vseq && Some(*s) <= t)
            || self
                .renames
                .first_ancestor_rename_after(q, Some(vseq))
                .is_some_and(|r| Some(r.seq) <= t);
        if changed_between {
            live()
        } else {
            Resolved::Version {
                path: q.to_string(),
                n: i + 1,
            }
        }
    }
}

fn parse_time(s: &str) -> SystemTime {
    humantime::parse_rfc3339(s).unwrap_or(SystemTime::UNIX_EPOCH)
}

fn state_of(b: &TrackedFileBackup) -> VersionState {
    if b.pending {
        return VersionState::Pending;
    }
    match &b.meta {
        None => VersionState::Absent,
        Some(meta) => VersionState::Present {
            meta: meta.clone(),
            object: b.backup_file_name.clone(),
        },
    }
}

pub(crate) fn backup_of(
    version: u32,
    v: &Version,
    actor: Option<Actor>,
    fill: bool,
) -> TrackedFileBackup {
    let (name, meta, pending) = match &v.state {
        VersionState::Pending => (None, None, true),
        VersionState::Absent => (None, None, false),
        VersionState::Present { meta, object } => (object.clone(), Some(meta.clone()), false),
    };
    TrackedFileBackup {
        backup_file_name: name,
        version,
        backup_time: rfc3339(v.time),
        meta,
        pending,
        actor,
        fill,
        // Set when the record is written (`Signer::sign_record`), with the key.
        mac: None,
        preimage: false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::transcript::testutil::file_entry;

    const T: &str = "2026-01-02T03:04:05Z";

    /// No entry refused for its MAC (the tests of everything else).
    fn no_mac(_: &str, _: &TrackedFileBackup) -> Option<String> {
        None
    }

    fn obj(n: u8) -> String {
        base16ct::lower::encode_string(&[n; 32])
    }

    fn update(seq: u64, path: &str, b: TrackedFileBackup) -> Record {
        let files = BTreeMap::from([(path.to_owned(), b)]);
        Record::snapshot_update(None, seq, T.into(), files)
    }

    fn delta(id: &str, seq: u64, files: &[(&str, TrackedFileBackup)]) -> Record {
        let files = files
            .iter()
            .map(|(p, b)| (p.to_string(), b.clone()))
            .collect();
        Record::checkpoint_delta(id, seq, T.into(), files)
    }

    /// Replays `records` as a mount does: each checked, then applied.
    fn replay(records: &[Record]) -> Result<State, String> {
        let mut state = State::default();
        for r in records {
            if let Some(why) = impossible(&state, r, &mut |_| true, &no_mac) {
                return Err(why);
            }
            apply_record(&mut state, r);
        }
        Ok(state)
    }

    /// The store object holding `path`'s state at checkpoint `k` (`None`: absent).
    fn object_at(state: &State, path: &str, k: usize) -> Option<String> {
        let h = &state.paths[path];
        match &h.versions[h.version_at(k) - 1].state {
            VersionState::Present { object, .. } => object.clone(),
            VersionState::Absent => None,
            VersionState::Pending => Some("pending".into()),
        }
    }

    #[test]
    fn version_at_picks_the_last_version_made_at_or_before_the_checkpoint() {
        let v = |since| Version {
            since,
            state: VersionState::Absent,
            time: SystemTime::UNIX_EPOCH,
        };
        let h = PathHistory {
            versions: vec![v(None), v(Some(2)), v(Some(5))],
            dirty: false,
            first_epoch: 0,
            ..PathHistory::default()
        };
        assert_eq!(h.version_at(0), 1);
        assert_eq!(h.version_at(1), 1);
        assert_eq!(h.version_at(2), 2);
        assert_eq!(h.version_at(4), 2);
        assert_eq!(h.version_at(5), 3);
        assert_eq!(h.version_at(9), 3);
    }

    #[test]
    fn split_parent_handles_top_level_and_nested() {
        assert_eq!(split_parent("a"), ("", "a"));
        assert_eq!(split_parent("a/b/c"), ("a/b", "c"));
    }

    /// Invariant 5: a path a checkpoint's delta does not list keeps the version it had, so
    /// the composed deltas give every path's state at every checkpoint.
    #[test]
    fn checkpoint_deltas_compose_into_the_state_at_each_checkpoint() {
        let state = replay(&[
            update(1, "f", file_entry(1, &obj(1), T)), // f's pre-image
            delta("c0", 2, &[("f", file_entry(2, &obj(2), T))]),
            update(3, "g", file_entry(1, &obj(3), T)), // g first changed after c0
            delta("c1", 4, &[("g", file_entry(2, &obj(4), T))]), // f unchanged at c1
            delta("c2", 5, &[]),
            update(6, "f", file_entry(2, &obj(2), T)), // f changed after c2: stored already
            delta("c3", 7, &[("f", file_entry(3, &obj(5), T))]),
        ])
        .unwrap();
        assert_eq!(state.checkpoints.len(), 4);
        let f: Vec<_> = (0..4).map(|k| object_at(&state, "f", k)).collect();
        assert_eq!(f, [Some(obj(2)), Some(obj(2)), Some(obj(2)), Some(obj(5))]);
        assert_eq!(state.paths["f"].versions.len(), 3);
        assert_eq!(state.paths["f"].versions[2].since, Some(3));
        let g: Vec<_> = (1..4).map(|k| object_at(&state, "g", k)).collect();
        assert_eq!(g, [Some(obj(4)), Some(obj(4)), Some(obj(4))]);
        assert_eq!(state.paths["g"].first_epoch, 1);
        assert_eq!(state.checkpoint_ids["c3"], 3);
        assert!(
            state.dirty_paths.is_empty(),
            "a checkpoint clears the dirty set"
        );
    }

    /// The full form (every tracked path listed, unchanged ones at their current version)
    /// and the delta form replay to the same history.
    #[test]
    fn full_and_delta_checkpoint_records_replay_alike() {
        let pre = [
            update(1, "a", file_entry(1, &obj(1), T)),
            update(2, "b", file_entry(1, &obj(2), T)),
        ];
        let mut full = pre.to_vec();
        let mut delta_form = pre.to_vec();
        let both = |a: u32, ao: u8, b: u32, bo: u8| {
            BTreeMap::from([
                ("a".to_string(), file_entry(a, &obj(ao), T)),
                ("b".to_string(), file_entry(b, &obj(bo), T)),
            ])
        };
        full.push(Record::checkpoint("c0", 3, T.into(), both(2, 3, 2, 4)));
        full.push(Record::checkpoint("c1", 4, T.into(), both(3, 5, 2, 4)));
        delta_form.push(delta(
            "c0",
            3,
            &[
                ("a", file_entry(2, &obj(3), T)),
                ("b", file_entry(2, &obj(4), T)),
            ],
        ));
        delta_form.push(delta("c1", 4, &[("a", file_entry(3, &obj(5), T))]));
        let (x, y) = (replay(&full).unwrap(), replay(&delta_form).unwrap());
        for path in ["a", "b"] {
            assert_eq!(x.paths[path].versions, y.paths[path].versions, "{path}");
        }
        assert_eq!(object_at(&y, "a", 1), Some(obj(5)));
        assert_eq!(object_at(&y, "b", 1), Some(obj(4)));
    }

    /// A pending version (content still to copy) is filled in place by a later record with
    /// the same version number, and a fill does not mark the path changed.
    #[test]
    fn a_fill_completes_a_pending_version() {
        let mut pending = file_entry(2, &obj(9), T);
        pending.pending = true;
        pending.backup_file_name = None;
        pending.meta = None;
        let mut fill = file_entry(2, &obj(2), T);
        fill.fill = true;
        let state = replay(&[
            update(1, "f", file_entry(1, &obj(1), T)),
            delta("c0", 2, &[("f", pending)]),
        ])
        .unwrap();
        assert_eq!(object_at(&state, "f", 0).as_deref(), Some("pending"));
        let mut state = state;
        let r = update(3, "f", fill);
        assert_eq!(impossible(&state, &r, &mut |_| true, &no_mac), None);
        apply_record(&mut state, &r);
        assert_eq!(object_at(&state, "f", 0), Some(obj(2)));
        assert!(state.dirty_paths.is_empty(), "a fill is not a change");
    }

    /// A checkpoint id seen twice (a journal record also in the transcript) is applied once.
    #[test]
    fn a_repeated_checkpoint_record_is_applied_once() {
        let c0 = delta("c0", 2, &[("f", file_entry(2, &obj(2), T))]);
        let state = replay(&[update(1, "f", file_entry(1, &obj(1), T)), c0.clone(), c0]).unwrap();
        assert_eq!(state.checkpoints.len(), 1);
        assert_eq!(state.paths["f"].versions.len(), 2);
        assert_eq!(state.next_seq, 3);
    }

    #[test]
    fn replay_refuses_gapped_and_corrupt_histories() {
        let mut state = State::default();
        let mut all = |_: &str| true;
        let first = update(1, "f", file_entry(1, &obj(1), T));
        assert_eq!(impossible(&state, &first, &mut all, &no_mac), None);
        apply_record(&mut state, &first);
        // A version gap, in a Layer 1 record and in a checkpoint.
        let gap = update(2, "f", file_entry(3, &obj(1), T));
        let why = impossible(&state, &gap, &mut all, &no_mac).unwrap();
        assert!(why.contains("jumps to version 3 after 1 version"), "{why}");
        let gap = delta("c0", 2, &[("f", file_entry(4, &obj(1), T))]);
        assert!(impossible(&state, &gap, &mut all, &no_mac).is_some());
        // A first version that is not 1.
        let zero = update(2, "g", file_entry(0, &obj(1), T));
        assert!(impossible(&state, &zero, &mut all, &no_mac).is_some());
        let late = update(2, "g", file_entry(2, &obj(1), T));
        assert!(impossible(&state, &late, &mut all, &no_mac).is_some());
        // A version after v1 made by a backup record (invariant 3).
        let by_backup = update(2, "f", file_entry(2, &obj(2), T));
        let why = impossible(&state, &by_backup, &mut all, &no_mac).unwrap();
        assert!(why.contains("only a checkpoint makes a version"), "{why}");
        // An object name that is not one (a path out of the store).
        let name = delta("c0", 2, &[("f", file_entry(2, "../../etc/shadow", T))]);
        let why = impossible(&state, &name, &mut all, &no_mac).unwrap();
        assert!(why.contains("not a store object name"), "{why}");
        // An object the store lacks.
        let next = delta("c0", 2, &[("f", file_entry(2, &obj(2), T))]);
        let why = impossible(&state, &next, &mut |_| false, &no_mac).unwrap();
        assert!(why.contains("which is missing"), "{why}");
        assert_eq!(impossible(&state, &next, &mut all, &no_mac), None);
        // Record types replay does not know are skipped, so never refused.
        let mut other = gap.clone();
        other.record_type = "summary".into();
        assert_eq!(impossible(&state, &other, &mut all, &no_mac), None);
        apply_record(&mut state, &other);
        assert!(state.checkpoints.is_empty());
    }

    /// Every entry of a record replay applies goes to the MAC check, whose refusal is
    /// replay's; a repeated checkpoint record, which replay skips, is not checked.
    #[test]
    fn replay_refuses_what_the_mac_check_refuses() {
        let refuse_g = |path: &str, _: &TrackedFileBackup| {
            (path == "g").then(|| "\"g\" has set-id mode 4755 but no signature".to_string())
        };
        let mut state = State::default();
        let c0 = delta("c0", 1, &[("f", file_entry(1, &obj(1), T))]);
        assert_eq!(impossible(&state, &c0, &mut |_| true, &refuse_g), None);
        apply_record(&mut state, &c0);
        let forged = delta("c1", 2, &[("g", file_entry(1, &obj(2), T))]);
        let why = impossible(&state, &forged, &mut |_| true, &refuse_g).unwrap();
        assert!(why.contains("no signature"), "{why}");
        let repeated = delta("c0", 3, &[("g", file_entry(1, &obj(2), T))]);
        assert_eq!(
            impossible(&state, &repeated, &mut |_| true, &refuse_g),
            None
        );
        let err = replay_for_fuzzing(&[c0, forged], &mut |_| true, &refuse_g).unwrap_err();
        assert!(err.contains("no signature"), "{err}");
    }

    /// The replay the fuzz harness runs: every path has its version at every checkpoint.
    #[test]
    fn every_path_has_a_version_at_every_checkpoint_after_replay() {
        let dir = |v: u32| TrackedFileBackup {
            meta: Some(crate::transcript::testutil::dir_meta()),
            backup_file_name: None,
            ..file_entry(v, &obj(0), T)
        };
        let records = [
            update(1, "d", dir(1)),
            delta("c0", 2, &[]),
            update(3, "d/x", file_entry(1, &obj(1), T)),
            delta("c1", 4, &[("d/x", file_entry(2, &obj(2), T))]),
        ];
        let lookups = replay_for_fuzzing(&records, &mut |_| true, &no_mac).unwrap();
        assert_eq!(lookups, 2 * 3, "two paths, checkpoints 0..=2");
        let state = replay(&records).unwrap();
        assert_eq!(state.children[""], BTreeSet::from(["d".to_string()]));
        assert_eq!(state.children["d"], BTreeSet::from(["x".to_string()]));
    }
}
