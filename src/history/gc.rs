//! Retention: `checkpointfs gc` drops the oldest checkpoints, compacts the transcript and
//! deletes every store object nothing kept refers to any more.
//!
//! # What must survive (the reachability invariant)
//! gc keeps the newest checkpoints (`--keep N`, or those not older than `--older-than`; the
//! newest checkpoint is always kept). Let `F` be the oldest kept checkpoint. Everything the
//! kept part of the history can still be asked for must stay:
//! - **views and rewinds of kept checkpoints**: the state of a path at a kept checkpoint `k`
//!   is its last version made at or before `k`. For `k = F` that version may have been made
//!   under a *dropped* checkpoint (a file untouched since), or be the path's pre-image. So for
//!   every path tracked at `F`, its version at `F` becomes its new version 1 (the *base*, one
//!   `gcBase` record at the head of the compacted transcript), and every record from `F`'s
//!   own checkpoint record on is kept as it was (versions renumbered to follow the base).
//! - **the live state and the undo of a rewind**: Layer 1 records since the newest
//!   checkpoint (what changed since, and the pre-images), pending versions and their fills
//!   all come after `F`, so they are kept. Undoing a rewind is rewinding to its
//!   `<M>:before-rewind` checkpoint: a checkpoint like any other, kept by the same rule. A
//!   later rewind saves the current state as a new checkpoint, which needs only the live tree.
//! - Versions made before `F` that are not a base, and the records of the dropped
//!   checkpoints, are gone: nothing kept can reach them.
//!
//! The store objects to keep are exactly the ones the compacted transcript names; every
//! other object in the store is deleted, also orphans left by an earlier gc that crashed
//! between its rename and its sweep.
//!
//! # Crash order
//! 1. the compacted transcript is written to a temp file, fsync'd, renamed over
//!    `transcript.jsonl`, and the directory fsync'd ([`TranscriptWriter::rewrite`],
//!    [`rewrite_atomically`]);
//! 2. only then are unreferenced objects deleted.
//!
//! A crash before the rename leaves the old transcript (and a stray temp, removed at the next
//! mount); a crash after it leaves the new transcript plus orphan objects, which the next gc
//! sweeps. The base record keeps the `seq` numbering increasing and ends at the old last
//! `seq`, so the store journal's records are still covered (ignored at replay).
//!
//! # Locks
//! In the daemon, gc runs as a method of [`super::Quiesced`]: with the epoch lock held
//! exclusively (no mutation, so no Layer 1 capture, and no checkpoint) and with the control
//! server's maintenance lock (no rewind, log or diff meanwhile), then takes `History::state`
//! for the rest: from the moment no fill is in flight (`busy` empty) until the unreferenced
//! objects are removed, nothing can put an object into the store, so a put can never
//! "reuse" an object the sweep is deleting. Then mutations run again while the packs that
//! held removed objects are rewritten without them ([`Store::compact`]: no entry of a pack
//! being rewritten is removed or added meanwhile), still under the maintenance lock.
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use log::info;
use serde::{Deserialize, Serialize};

use super::model::{Resolved, apply_record, backup_of};
use super::store::{Removals, Store};
use super::{Checkpoint, History, State};
use crate::transcript::journal::{JOURNAL_FILE_NAME, Journal};
use crate::transcript::mac::{RecordKey, Signer, read_state_id};
use crate::transcript::record::{FILE_HISTORY_SNAPSHOT, Record};
use crate::transcript::replay::{Position, ReplayError, read_transcript, scan_transcript_from};
use crate::transcript::writer::rewrite_atomically;

#[cfg(doc)]
use crate::transcript::writer::TranscriptWriter;

/// The schema name of `checkpointfs gc --json` output.
pub const GC_SCHEMA: &str = "checkpointfs.gc/1";

/// Environment variable naming a failpoint for the crash tests (see [`failpoint`]).
pub const FAILPOINT_ENV: &str = "CHECKPOINTFS_FAILPOINT";

/// The transcript's file name in the state dir.
const TRANSCRIPT_FILE: &str = "transcript.jsonl";

/// Which checkpoints to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Retention {
    /// The newest N (N >= 1).
    Keep(usize),
    /// Those taken less than this long ago (and always the newest).
    OlderThan(Duration),
}

/// What a gc did (or, with `dry_run`, would do). Serialized as `checkpointfs gc --json`
/// (snake_case field names, like the other JSON reports; docs/json-output.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    pub schema: String,
    pub dry_run: bool,
    /// Ids of the dropped checkpoints, oldest first.
    pub dropped: Vec<String>,
    /// Ids of the kept checkpoints, oldest first.
    pub kept: Vec<String>,
    /// Store objects deleted (all unreferenced ones, including orphans of an earlier gc).
    pub objects_removed: usize,
    pub bytes_freed: u64,
    /// Store objects left, and their bytes.
    pub objects_kept: usize,
    pub bytes_kept: u64,
    pub transcript_bytes_before: u64,
    pub transcript_bytes_after: u64,
}

/// The checkpoints to drop and the transcript that results (pure; see [`plan`]).
pub struct Plan {
    /// How many of the oldest checkpoints are dropped.
    pub drop: usize,
    pub dropped: Vec<String>,
    pub kept: Vec<String>,
    /// The compacted transcript (the input itself when nothing is dropped).
    pub records: Vec<Record>,
    /// The input replayed, and then the records [`Plan::extend`] carried.
    state: State,
    /// How records after the input are carried (none: nothing is dropped).
    carry: Option<Carry>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("drop", &self.drop)
            .field("dropped", &self.dropped)
            .field("kept", &self.kept)
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Whether [`Plan::extend`] can carry `tail`; if not, the whole transcript must be
    /// planned again. Not if what a base is may depend on `tail`: a path's base is its
    /// state at the oldest kept checkpoint F, which a lookup resolves forward through the
    /// renames of its ancestors after F (format 4), and a base may be a version whose
    /// content a later record fills in. Nor if `tail` names a version before the base (the
    /// fill of a version the plan drops).
    pub fn can_carry(&self, tail: &[Record]) -> bool {
        let Some(carry) = &self.carry else {
            return true;
        };
        if carry.base_has_pending {
            return false;
        }
        let names_a_dropped_version = tail.iter().any(|r| {
            r.snapshot.tracked_file_backups.iter().any(|(p, b)| {
                carry
                    .removed_versions
                    .get(p)
                    .is_some_and(|&n| b.version <= n)
            })
        });
        if names_a_dropped_version {
            return false;
        }
        let above_a_tracked_path = |dir: &str| {
            let prefix = format!("{dir}/");
            carry
                .removed_versions
                .range(prefix.clone()..)
                .next()
                .is_some_and(|(p, _)| p.starts_with(&prefix))
        };
        !tail
            .iter()
            .filter_map(|r| r.rename.as_ref())
            .any(|r| above_a_tracked_path(&r.from) || above_a_tracked_path(&r.to))
    }

    /// Carries `tail`, the records appended to the transcript after the input of [`plan`],
    /// into the compacted transcript as `plan` carried the input's kept records: so gc can
    /// plan with mutations running, and hold them only for what they appended meanwhile.
    /// The checkpoints to drop stay those `plan` chose. Only when [`Plan::can_carry`].
    pub fn extend(&mut self, tail: Vec<Record>) -> io::Result<()> {
        for r in tail {
            let before = self.state.checkpoints.len();
            apply_record(&mut self.state, &r);
            let accepted = self.state.checkpoints.len() > before;
            if r.record_type == FILE_HISTORY_SNAPSHOT && r.is_checkpoint() {
                match accepted {
                    true => {
                        let id = &self.state.checkpoints[before].id;
                        self.kept.push(id.clone());
                    }
                    false if self.carry.is_some() => continue,
                    false => {}
                }
            }
            match &mut self.carry {
                Some(carry) => self.records.push(carry.carry(r)?),
                None => self.records.push(r),
            }
        }
        Ok(())
    }
}

/// How [`compact`] carries a record from the oldest kept checkpoint on: versions
/// renumbered to follow the base.
#[derive(Debug, Default)]
struct Carry {
    /// Versions before the base are gone: path -> how many. Every path tracked at F.
    removed_versions: BTreeMap<String, u32>,
    /// Paths whose state at F resolves through a kept rename: their first entry after F
    /// becomes their version 1.
    first_is_v1: HashSet<String>,
    /// A base entry is a version whose content was still being copied: its fill may come.
    base_has_pending: bool,
}

impl Carry {
    fn carry(&mut self, mut r: Record) -> io::Result<Record> {
        for (path, b) in r.snapshot.tracked_file_backups.iter_mut() {
            let Some(&removed) = self.removed_versions.get(path.as_str()) else {
                continue;
            };
            if b.version <= removed {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "gc: transcript record seq {} refers to version {} of {path}, older than \
                         its version at the oldest kept checkpoint; the transcript is \
                         inconsistent, nothing was changed",
                        r.seq, b.version
                    ),
                ));
            }
            b.version -= removed;
            if self.first_is_v1.remove(path.as_str()) {
                b.version = 1;
                b.preimage = false;
            }
        }
        Ok(r)
    }
}

/// A parsed `--older-than` DURATION: a whole number and a unit, `s`, `m`, `h`, `d` or `w`
/// (`30m`, `12h`, `7d`, `2w`). Zero, negative, fractional or unit-less values are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!(
            "invalid duration '{s}': {why} (expected a whole number and a unit s, m, h, d or w, \
             e.g. 30m, 12h, 7d, 2w)"
        )
    };
    let s_trim = s.trim();
    if s_trim.is_empty() {
        return Err(bad("empty"));
    }
    let split = s_trim
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| bad("no unit"))?;
    let (digits, unit) = s_trim.split_at(split);
    if digits.is_empty() {
        return Err(bad("it must start with a number"));
    }
    let n: u64 = digits.parse().map_err(|_| bad("number too large"))?;
    let unit_secs: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad(&format!("unknown unit '{unit}'"))),
    };
    if n == 0 {
        return Err(bad("it must be greater than zero"));
    }
    n.checked_mul(unit_secs)
        .map(Duration::from_secs)
        .ok_or_else(|| bad("too large"))
}

/// How many of the oldest `checkpoints` `retention` drops at time `now`. Never all of them:
/// the newest checkpoint stays (it is what the next checkpoint's changes are relative to).
/// Only a prefix is dropped, so with `OlderThan` a checkpoint older than the cutoff that
/// follows a newer one (a clock step) is kept.
pub fn checkpoints_to_drop(
    checkpoints: &[Checkpoint],
    retention: Retention,
    now: SystemTime,
) -> usize {
    let droppable = checkpoints.len().saturating_sub(1);
    match retention {
        Retention::Keep(keep) => checkpoints.len().saturating_sub(keep.max(1)),
        Retention::OlderThan(age) => {
            let cutoff = now.checked_sub(age).unwrap_or(UNIX_EPOCH);
            checkpoints
                .iter()
                .take(droppable)
                .take_while(|c| c.time < cutoff)
                .count()
        }
    }
}

/// Replays `records` into a fresh state, as a mount would; also returns the position in
/// `records` of each checkpoint record that replay accepted, in checkpoint order.
fn replay(records: &[Record]) -> (State, Vec<usize>) {
    let mut state = State::default();
    let mut positions = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let before = state.checkpoints.len();
        apply_record(&mut state, r);
        if state.checkpoints.len() > before {
            positions.push(i);
        }
    }
    (state, positions)
}

/// The transcript without its `drop` oldest checkpoints: a `gcBase` record giving every path
/// tracked at the oldest kept checkpoint `F` its state there as version 1, then every record
/// from `F`'s checkpoint record on, with versions renumbered to follow the base. `state` and
/// `positions` are [`replay`] of `records`; `drop` must be less than the number of
/// checkpoints.
fn compact(
    records: &[Record],
    state: &State,
    positions: &[usize],
    drop: usize,
) -> io::Result<(Vec<Record>, Carry)> {
    let Some(&first_kept_pos) = positions.get(drop) else {
        return Err(io::Error::other(format!(
            "gc: cannot drop {drop} of {} checkpoints",
            positions.len()
        )));
    };
    let first = &records[first_kept_pos];
    let mut base = BTreeMap::new();
    let mut carry = Carry::default();
    for (path, h) in &state.paths {
        if h.first_epoch > drop || h.versions.is_empty() {
            // First tracked after F: its own records, all kept, say everything.
            continue;
        }
        let n = h.version_at(drop);
        carry.removed_versions.insert(path.clone(), n as u32 - 1);
        // Format 4: a path whose state at F resolves through a kept rename (to another
        // name, or SRC) gets no base entry, as if it had never changed before F; its first
        // entry after F becomes its v1 (a pre-image entry there states it).
        match state.resolve(path, Some(drop)) {
            Resolved::Version { path: q, .. } if q == *path => {}
            _ => {
                carry.first_is_v1.insert(path.clone());
                continue;
            }
        }
        // `fill`: the base is not a change, it must not mark the path changed.
        let entry = backup_of(1, &h.versions[n - 1], None, true);
        carry.base_has_pending |= entry.pending;
        base.insert(path.clone(), entry);
    }
    // `first.seq - 1` belonged to a dropped record (there is at least one: checkpoint 0), so
    // seqs stay strictly increasing and the compacted file still ends at the old last seq.
    let mut base_record =
        Record::snapshot_update(None, first.seq - 1, first.snapshot.timestamp.clone(), base);
    base_record.gc_base = true;
    let accepted: HashSet<usize> = positions.iter().copied().collect();
    let mut out = Vec::with_capacity(records.len() - first_kept_pos + 1);
    out.push(base_record);
    for (i, r) in records.iter().enumerate().skip(first_kept_pos) {
        // A checkpoint record replay ignored (a repeated id) could be taken for a new
        // checkpoint once the first one with that id is dropped: leave it out.
        if r.record_type == FILE_HISTORY_SNAPSHOT && r.is_checkpoint() && !accepted.contains(&i) {
            continue;
        }
        out.push(carry.carry(r.clone())?);
    }
    Ok((out, carry))
}

/// gc renumbers versions and a MAC binds its entry's version, so gc signs the compacted
/// records again; it must never sign what no daemon recorded. So every set-id entry of
/// `records`, as they are before renumbering, must verify first; then the plan's records
/// are signed.
fn check_and_sign(
    signer: &Signer,
    records: &[Record],
    plan: impl FnOnce(Vec<Record>) -> io::Result<Plan>,
) -> io::Result<Plan> {
    check_signatures(signer, records)?;
    let mut plan = plan(records.to_vec())?;
    for r in &mut plan.records {
        signer.sign_record(r);
    }
    Ok(plan)
}

/// [`check_and_sign`] for records appended after the plan's input: checked, carried
/// ([`Plan::extend`]), and signed.
fn check_and_sign_tail(signer: &Signer, plan: &mut Plan, tail: Vec<Record>) -> io::Result<()> {
    check_signatures(signer, &tail)?;
    let from = plan.records.len();
    plan.extend(tail)?;
    for r in &mut plan.records[from..] {
        signer.sign_record(r);
    }
    Ok(())
}

/// Every set-id entry of `records` verifies (see [`check_and_sign`]).
fn check_signatures(signer: &Signer, records: &[Record]) -> io::Result<()> {
    for r in records {
        for (path, b) in &r.snapshot.tracked_file_backups {
            if let Some(why) = signer.check(path, b) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "gc: the transcript record with seq {}: {why}. Nothing was changed",
                        r.seq
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The signer for gc of a state dir no daemon serves: `None` for one from before signing
/// (its next mount signs it, gc leaves its entries as they are).
fn offline_signer(state_dir: &Path) -> io::Result<Option<Signer>> {
    let Some(id) = read_state_id(state_dir)?.filter(|id| id.complete) else {
        return Ok(None);
    };
    let key = match RecordKey::load() {
        Ok(Some(key)) => Ok(std::sync::Arc::new(key)),
        Ok(None) => Err("this user has none".to_string()),
        Err(e) => Err(e.to_string()),
    };
    Ok(Some(Signer::new(key, id.id)))
}

/// Decides what gc does with the history in `records` (a whole transcript, in order).
#[cfg(test)]
pub fn plan(records: Vec<Record>, retention: Retention, now: SystemTime) -> io::Result<Plan> {
    plan_pinned(records, retention, now, &std::collections::BTreeSet::new())
}

/// [`plan`], never dropping a checkpoint in `pinned` (a live branch's fork: its lower
/// layer) or any after it, since gc drops only a prefix.
pub fn plan_pinned(
    records: Vec<Record>,
    retention: Retention,
    now: SystemTime,
    pinned: &std::collections::BTreeSet<String>,
) -> io::Result<Plan> {
    let (state, positions) = replay(&records);
    let first_pinned = state
        .checkpoints
        .iter()
        .position(|c| pinned.contains(&c.id))
        .unwrap_or(usize::MAX);
    let drop = checkpoints_to_drop(&state.checkpoints, retention, now).min(first_pinned);
    let ids = |cs: &[Checkpoint]| cs.iter().map(|c| c.id.clone()).collect::<Vec<_>>();
    let dropped = ids(&state.checkpoints[..drop]);
    let kept = ids(&state.checkpoints[drop..]);
    let (records, carry) = if drop == 0 {
        (records, None)
    } else {
        let (records, carry) = compact(&records, &state, &positions, drop)?;
        (records, Some(carry))
    };
    Ok(Plan {
        drop,
        dropped,
        kept,
        records,
        state,
        carry,
    })
}

/// Every store object `records` name: the objects gc must keep.
pub fn referenced_objects(records: &[Record]) -> HashSet<String> {
    records
        .iter()
        .flat_map(|r| r.snapshot.tracked_file_backups.values())
        .flat_map(|b| {
            let xattrs = b.meta.as_ref().and_then(|m| m.xattrs_object());
            b.backup_file_name
                .iter()
                .cloned()
                .chain(xattrs.map(str::to_owned))
        })
        .collect()
}

/// Store objects to delete, with their sizes, and what stays.
struct Sweep {
    doomed: Vec<(String, u64)>,
    kept_objects: usize,
    kept_bytes: u64,
}

impl Sweep {
    fn of(store: &Store, keep: &HashSet<String>) -> io::Result<Sweep> {
        let mut sweep = Sweep {
            doomed: Vec::new(),
            kept_objects: 0,
            kept_bytes: 0,
        };
        for (name, size) in store.objects()? {
            if keep.contains(&name) {
                sweep.kept_objects += 1;
                sweep.kept_bytes += size;
            } else {
                sweep.doomed.push((name, size));
            }
        }
        Ok(sweep)
    }

    /// Deletes the doomed objects ([`Removals::run`]), then gives back the space of the
    /// packed ones ([`compact_packs`]).
    fn run(self, store: &Store, progress: &mut dyn FnMut(usize, usize)) -> io::Result<()> {
        store.doom(self.doomed).run(progress)?;
        compact_packs(store)
    }

    fn report(&self, plan: &Plan, dry_run: bool, before: u64, after: u64) -> GcReport {
        GcReport {
            schema: GC_SCHEMA.to_string(),
            dry_run,
            dropped: plan.dropped.clone(),
            kept: plan.kept.clone(),
            objects_removed: self.doomed.len(),
            bytes_freed: self.doomed.iter().map(|(_, s)| s).sum(),
            objects_kept: self.kept_objects,
            bytes_kept: self.kept_bytes,
            transcript_bytes_before: before,
            transcript_bytes_after: after,
        }
    }
}

/// gc's last step: the packs that held removed objects are rewritten without them, then the
/// store directory is fsync'd. Puts and reads may run meanwhile ([`Store::compact`]).
fn compact_packs(store: &Store) -> io::Result<()> {
    store.compact().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "gc: rewriting the store's packs: {e} (the transcript is already compacted \
                 and the objects removed; run gc again to reclaim the space)"
            ),
        )
    })?;
    store.sync()
}

/// The part of a daemon's gc that runs after mutations are admitted again: see
/// [`History::gc_quiesced`].
#[must_use = "the packs' space is given back only by `finish`"]
/// What gc does after its quiesce, with mutations running: the removal of the objects it
/// doomed and of dropped branches' storage, then the rewrite of the packs that held some of
/// the objects (the bulk of its IO).
pub(super) struct AfterQuiesce<'h> {
    store: &'h Store,
    state_dir: &'h Path,
    removals: Removals<'h>,
    /// Made again once the removals have given space back (dropped after them).
    _reserve: ReserveReleased,
}

impl AfterQuiesce<'_> {
    /// Removes the doomed objects and compacts the packs; corrects `report` for the objects
    /// a put claimed meanwhile (kept). `progress(done, total)` follows the removals.
    pub fn finish(
        self,
        report: &mut GcReport,
        progress: &mut dyn FnMut(usize, usize),
    ) -> io::Result<()> {
        let started = std::time::Instant::now();
        let (removed, bytes) = self.removals.run(progress)?;
        let claimed = report.objects_removed - removed;
        report.objects_kept += claimed;
        report.bytes_kept += report.bytes_freed - bytes;
        report.objects_removed = removed;
        report.bytes_freed = bytes;
        let removing = started.elapsed();
        // No branch request runs meanwhile: gc holds the control maintenance lock alone.
        let branch_bytes = super::branches::free_dropped(self.state_dir)?;
        if branch_bytes > 0 {
            info!("gc: freed {branch_bytes} bytes of dropped branches");
        }
        compact_packs(self.store)?;
        info!(
            "gc: with mutations running, removed {removed} objects in {removing:?} ({claimed} \
             kept: stored again meanwhile), then compacted the packs in {:?}",
            started.elapsed() - removing
        );
        Ok(())
    }
}

/// Bytes `records` take as transcript lines.
fn transcript_len(records: &[Record]) -> io::Result<u64> {
    let mut n = 0u64;
    for r in records {
        n += serde_json::to_vec(r)?.len() as u64 + 1;
    }
    Ok(n)
}

/// gc's hold on the state dir's reserve ([`crate::state::reserve`]): made when gc is about to
/// write, it deletes the reserve so that gc's writes find room on a full disk; dropped (gc
/// done, or failed), it makes the reserve again, sized for the transcript as it is then.
struct ReserveReleased {
    state_dir: PathBuf,
    transcript: PathBuf,
}

impl ReserveReleased {
    fn new(state_dir: &Path, transcript: &Path) -> io::Result<Self> {
        crate::state::reserve::release(state_dir)?;
        Ok(ReserveReleased {
            state_dir: state_dir.to_path_buf(),
            transcript: transcript.to_path_buf(),
        })
    }
}

impl Drop for ReserveReleased {
    fn drop(&mut self) {
        let len = file_len(&self.transcript).unwrap_or(0);
        crate::state::reserve::renew(&self.state_dir, len);
    }
}

fn file_len(path: &Path) -> io::Result<u64> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// (device, inode) of `path`: tells whether a rename replaced it.
fn file_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

fn replay_error(e: ReplayError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Test-only crash injection: if `$CHECKPOINTFS_FAILPOINT` is `name`, abort the process on
/// the spot (no unwinding, no flush), as a crash or `kill -9` would.
pub fn failpoint(name: &str) {
    if std::env::var(FAILPOINT_ENV).is_ok_and(|v| v == name) {
        log::error!("failpoint {name}: aborting");
        std::process::abort();
    }
}

/// gc's plan, made with mutations running ([`History::gc_plan`]): the transcript up to
/// `end` of file `file`, compacted.
pub(super) struct GcPlanned {
    plan: Plan,
    file: (u64, u64),
    end: Position,
    retention: Retention,
    now: SystemTime,
    took: Duration,
}

impl History {
    /// Reads, checks and plans the transcript as it is now, with mutations running (the
    /// caller holds the control maintenance lock, so no other gc or rewind runs): the bulk
    /// of gc's work on a long history, kept out of the pause of mutations. The checkpoints
    /// to drop are chosen here; [`History::gc_quiesced`] carries what is appended meanwhile.
    pub(super) fn gc_plan(&self, retention: Retention) -> io::Result<GcPlanned> {
        let started = std::time::Instant::now();
        let rec = self.recorder()?;
        rec.transcript.flush()?;
        let path = rec.transcript.path().to_path_buf();
        let file = std::fs::File::open(&path)
            .map_err(|e| crate::sys::context(format!("gc: opening {}", path.display()), e))?;
        let id = {
            use std::os::unix::fs::MetadataExt;
            let m = file.metadata()?;
            (m.dev(), m.ino())
        };
        let mut records = Vec::new();
        let end = scan_transcript_from(&path, file, Position::default(), |r| records.push(r))
            .map_err(replay_error)?;
        let now = SystemTime::now();
        let pinned = super::branches::live_forks(&self.state_dir)?;
        let plan = check_and_sign(&rec.signer, &records, |r| {
            plan_pinned(r, retention, now, &pinned)
        })?;
        Ok(GcPlanned {
            plan,
            file: id,
            end,
            retention,
            now,
            took: started.elapsed(),
        })
    }

    /// gc in the daemon, for [`super::Quiesced::gc`] (every mutation excluded): the records
    /// appended since `planned` carried into its compacted transcript, which replaces the
    /// transcript, memory swapped to it, the unreferenced objects doomed. What is left, their
    /// removal and the rewrite of the packs that held some, is returned, for the caller to
    /// run once mutations are admitted again. So the pause of mutations is what was appended
    /// while gc planned, and the compacted transcript's write and replay: not the reading
    /// and planning of the whole history, nor a removal per object, nor the packs' copying.
    pub(super) fn gc_quiesced(
        &self,
        planned: GcPlanned,
        dry_run: bool,
    ) -> io::Result<(GcReport, Option<AfterQuiesce<'_>>)> {
        let rec = self.recorder()?;
        // Mutations are excluded (quiesced) and fills paused, so nothing but gc changes the
        // history until `_paused` goes: the IO below runs with `state` unlocked, and views
        // go on reading the old state until `adopt` swaps in the new one.
        let _paused = PausedFills::new(self);
        let started = std::time::Instant::now();
        // Makes the fills that finished before the pause part of the transcript.
        rec.transcript.flush()?;
        let path = rec.transcript.path().to_path_buf();
        let before = file_len(&path)?;
        let mut plan = planned.plan;
        let mut tail = None;
        if file_id(&path)? == planned.file {
            let mut records = Vec::new();
            let file = std::fs::File::open(&path)?;
            scan_transcript_from(&path, file, planned.end, |r| records.push(r))
                .map_err(replay_error)?;
            tail = Some(records);
        }
        if let Some(tail) = tail.filter(|t| plan.can_carry(t)) {
            check_and_sign_tail(&rec.signer, &mut plan, tail)?;
        } else {
            // Replaced since it was planned (no gc runs beside this one, but be sure), or
            // an ancestor of a path the plan gives a base was renamed since: planned again
            // from the whole file.
            let records = read_transcript(&path).map_err(replay_error)?.records;
            let pinned = super::branches::live_forks(&self.state_dir)?;
            plan = check_and_sign(&rec.signer, &records, |r| {
                plan_pinned(r, planned.retention, planned.now, &pinned)
            })?;
        }
        let after = transcript_len(&plan.records)?;
        let sweep = Sweep::of(&self.store, &referenced_objects(&plan.records))?;
        let report = sweep.report(&plan, dry_run, before, after);
        if dry_run {
            return Ok((report, None));
        }
        let carried = started.elapsed();
        let _reserve = ReserveReleased::new(&self.state_dir, &path)?;
        if plan.drop > 0 {
            let old_file = file_id(&path)?;
            let rewritten = rec.transcript.rewrite(plan.records.clone());
            // The rewrite can fail after its rename (syncing the directory): the writer then
            // appends to the new file, so memory must follow it either way.
            let renamed = rewritten.is_ok() || file_id(&path).is_ok_and(|id| id != old_file);
            if renamed {
                let (replayed, _) = replay(&plan.records);
                let mut st = self.lock();
                let shift = st.first_kept + plan.drop;
                adopt(&mut st, replayed, shift);
            }
            if let Err(e) = rewritten {
                let what = if renamed {
                    "the transcript was compacted but no object was removed; run gc again"
                } else {
                    "nothing was changed"
                };
                return Err(crate::sys::context(format!("gc ({what})"), e));
            }
        }
        failpoint("gc-after-rename");
        let rewritten = started.elapsed();
        // Doomed with every mutation excluded and no fill running, so that every put from
        // now on sees the doom (and claims what it reuses); removed after the quiesce.
        let removals = self.store.doom(sweep.doomed);
        info!(
            "gc: dropped {} checkpoints, {} objects ({} bytes) to remove; planned in {:?} with \
             mutations running, then mutations held for {:?} (what was appended meanwhile \
             carried {carried:?}, transcript rewritten and adopted {:?}, objects doomed {:?})",
            report.dropped.len(),
            report.objects_removed,
            report.bytes_freed,
            planned.took,
            started.elapsed(),
            rewritten - carried,
            started.elapsed() - rewritten,
        );
        let after = AfterQuiesce {
            store: &self.store,
            state_dir: &self.state_dir,
            removals,
            _reserve,
        };
        Ok((report, Some(after)))
    }
}

/// While alive, no fill starts ([`State::fills_paused`]); made once every fill in flight is
/// recorded (`busy` empty).
struct PausedFills<'h> {
    history: &'h History,
}

impl<'h> PausedFills<'h> {
    fn new(history: &'h History) -> PausedFills<'h> {
        let mut st = history.lock();
        st.fills_paused = true;
        while !st.busy.is_empty() {
            st = history
                .busy_cond
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
        PausedFills { history }
    }
}

impl Drop for PausedFills<'_> {
    fn drop(&mut self) {
        self.history.lock().fills_paused = false;
        self.history.busy_cond.notify_all();
    }
}

/// Replaces the daemon's state by `replayed` (the compacted transcript, replayed), keeping
/// checkpoint indices as they were: `replayed` numbers the oldest kept checkpoint 0, memory
/// numbers it `shift`. The dropped checkpoints stay in `checkpoints` as placeholders below
/// `first_kept`, so indices held by views and the kernel's caches keep their meaning.
fn adopt(st: &mut State, mut replayed: State, shift: usize) {
    for h in replayed.paths.values_mut() {
        h.first_epoch += shift;
        for v in &mut h.versions {
            if let Some(k) = v.since.as_mut() {
                *k += shift;
            }
        }
    }
    let mut checkpoints = st.checkpoints[..shift.min(st.checkpoints.len())].to_vec();
    checkpoints.append(&mut replayed.checkpoints);
    st.checkpoints = checkpoints;
    st.checkpoint_ids = replayed
        .checkpoint_ids
        .into_iter()
        .map(|(id, k)| (id, k + shift))
        .collect();
    st.paths = replayed.paths;
    st.dirty_paths = replayed.dirty_paths;
    st.pending_paths = replayed.pending_paths;
    // Only the renames after F: lookups at kept checkpoints read nothing older.
    st.renames = replayed.renames;
    st.children = replayed.children;
    st.first_kept = shift;
    st.history_dropped = true;
    st.next_seq = st.next_seq.max(replayed.next_seq);
}

/// gc of a state dir no daemon serves. The caller holds the state lock
/// ([`crate::state::lock::StateLock`]), so no mount can start meanwhile.
pub fn gc_state_dir(
    state_dir: &Path,
    retention: Retention,
    dry_run: bool,
    progress: &mut dyn FnMut(usize, usize),
) -> io::Result<GcReport> {
    let transcript = state_dir.join(TRANSCRIPT_FILE);
    let journal_path = state_dir.join("backups").join(JOURNAL_FILE_NAME);
    crate::state::format::check(state_dir)?;
    if !dry_run {
        // The caller holds the state lock, so no write is under way.
        crate::state::dir::remove_leftover_temps(state_dir)?;
    }
    let store = Store::open(&state_dir.join("backups"))?;
    let outcome = read_transcript(&transcript).map_err(replay_error)?;
    let last_seq = outcome.last_seq().unwrap_or(0);
    let mut records = outcome.records;
    // Records that reached only the journal (a crashed daemon) are history too.
    records.extend(Journal::read_after(&journal_path, last_seq).map_err(replay_error)?);
    let before = file_len(&transcript)?;
    let now = SystemTime::now();
    let pinned = super::branches::live_forks(state_dir)?;
    let plan = match offline_signer(state_dir)? {
        Some(signer) => check_and_sign(&signer, &records, |r| {
            plan_pinned(r, retention, now, &pinned)
        })?,
        None => plan_pinned(records, retention, now, &pinned)?,
    };
    let after = transcript_len(&plan.records)?;
    let sweep = Sweep::of(&store, &referenced_objects(&plan.records))?;
    let report = sweep.report(&plan, dry_run, before, after);
    if dry_run {
        return Ok(report);
    }
    let _reserve = ReserveReleased::new(state_dir, &transcript)?;
    super::branches::free_dropped(state_dir)?;
    if plan.drop > 0 {
        rewrite_atomically(&transcript, &plan.records)?;
        // Every journal record is in the new transcript now (its seqs are covered).
        let new_last = plan.records.last().map_or(0, |r| r.seq);
        Journal::open(&journal_path)?.truncate_if_covered(new_last)?;
    }
    failpoint("gc-after-rename");
    sweep.run(&store, progress)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::record::{TrackedFileBackup, rfc3339};

    const T0: u64 = 1_800_000_000;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn file(version: u32, object: &str) -> TrackedFileBackup {
        crate::transcript::testutil::file_entry(version, object, &rfc3339(at(T0)))
    }

    fn absent(version: u32) -> TrackedFileBackup {
        TrackedFileBackup {
            backup_file_name: None,
            meta: None,
            ..file(version, "")
        }
    }

    /// Builds a transcript the way the daemon writes one.
    struct Script {
        records: Vec<Record>,
        latest: Option<String>,
    }

    impl Script {
        fn new() -> Script {
            Script {
                records: Vec::new(),
                latest: None,
            }
        }

        fn seq(&self) -> u64 {
            self.records.len() as u64 + 1
        }

        fn backup(&mut self, path: &str, b: TrackedFileBackup) -> &mut Script {
            let r = Record::snapshot_update(
                self.latest.as_deref(),
                self.seq(),
                rfc3339(at(T0)),
                BTreeMap::from([(path.to_string(), b)]),
            );
            self.records.push(r);
            self
        }

        fn checkpoint(&mut self, id: &str, secs: u64, map: &[(&str, TrackedFileBackup)]) {
            let map = map
                .iter()
                .map(|(p, b)| (p.to_string(), b.clone()))
                .collect();
            let r = Record::checkpoint(id, self.seq(), rfc3339(at(secs)), map);
            self.records.push(r);
            self.latest = Some(id.to_string());
        }
    }

    /// gc renumbers a setuid entry's version, so it signs it again, and only after it checked
    /// the MACs as they were: a forged set-id entry is never signed by gc.
    #[test]
    fn gc_signs_renumbered_set_id_entries_and_never_a_forged_one() {
        use crate::transcript::mac::RecordKey;
        let key = RecordKey::from_bytes([7; 32], "/k/record.key".into());
        let signer = Signer::new(Ok(std::sync::Arc::new(key)), "ab".repeat(16));
        let setuid = |version: u32, object: &str| {
            let mut b = file(version, object);
            b.meta.as_mut().unwrap().mode = 0o4755;
            b
        };
        let mut records = history();
        records.push(Record::checkpoint_delta(
            "c4",
            records.len() as u64 + 1,
            rfc3339(at(T0 + 40)),
            BTreeMap::from([("a".to_string(), setuid(5, "a4"))]),
        ));
        for r in &mut records {
            signer.sign_record(r);
        }
        let p = check_and_sign(&signer, &records, |r| {
            plan(r, Retention::Keep(2), at(T0 + 100))
        })
        .unwrap();
        let a = &p.records.last().unwrap().snapshot.tracked_file_backups["a"];
        assert!(a.version < 5, "renumbered to {}", a.version);
        assert_eq!(
            signer.check("a", a),
            None,
            "signed again for its new version"
        );

        let mut forged = records.clone();
        let last = forged.last_mut().unwrap();
        last.snapshot.tracked_file_backups.get_mut("a").unwrap().mac = None;
        let e = check_and_sign(&signer, &forged, |r| plan(r, Retention::Keep(2), at(T0)))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("gc: the transcript record with seq"),
            "{e}"
        );
        assert!(e.to_string().contains("no signature from"), "{e}");
    }

    /// `a` changes at every checkpoint; `b` once, before c1; `c` is created after c2.
    /// Objects are named after the content: a0 (pre-image) a1 a2 a3, b0 b1, c1.
    fn history() -> Vec<Record> {
        let mut s = Script::new();
        s.backup("a", file(1, "a0")).backup("b", file(1, "b0"));
        s.checkpoint("c1", T0 + 10, &[("a", file(2, "a1")), ("b", file(2, "b1"))]);
        s.backup("a", file(2, "a1"));
        s.checkpoint("c2", T0 + 20, &[("a", file(3, "a2")), ("b", file(2, "b1"))]);
        s.backup("a", file(3, "a2")).backup("c", absent(1));
        s.checkpoint(
            "c3",
            T0 + 30,
            &[
                ("a", file(4, "a3")),
                ("b", file(2, "b1")),
                ("c", file(2, "c1")),
            ],
        );
        // Changed since c3: a's pre-image is a3, already stored.
        s.backup("a", file(4, "a3"));
        s.records
    }

    fn names(set: &HashSet<String>) -> Vec<&str> {
        let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
        v.sort();
        v
    }

    #[test]
    fn xattr_sets_are_referenced_objects_and_none_is_no_object() {
        let with_xattrs = |version, object: &str, xattrs: &str| {
            let mut b = file(version, object);
            b.meta.as_mut().unwrap().xattrs = Some(xattrs.to_string());
            b
        };
        let record = Record::snapshot_update(
            None,
            1,
            rfc3339(at(T0)),
            [
                ("a".to_string(), with_xattrs(1, "a1", "x1")),
                ("b".to_string(), with_xattrs(1, "b1", "")),
                ("d".to_string(), {
                    let mut d = with_xattrs(1, "", "x2");
                    d.backup_file_name = None;
                    d
                }),
            ]
            .into_iter()
            .collect(),
        );
        assert_eq!(
            names(&referenced_objects(&[record])),
            vec!["a1", "b1", "x1", "x2"]
        );
    }

    /// The state of every path at every checkpoint (by id), as replay sees it.
    fn views(records: &[Record]) -> BTreeMap<(String, String), Option<String>> {
        let (st, _) = replay(records);
        let mut out = BTreeMap::new();
        for (k, c) in st.checkpoints.iter().enumerate() {
            for (path, h) in &st.paths {
                let v = &h.versions[h.version_at(k) - 1];
                let object = match &v.state {
                    super::super::VersionState::Present { object, .. } => object.clone(),
                    _ => None,
                };
                out.insert((c.id.clone(), path.clone()), object);
            }
        }
        out
    }

    #[test]
    fn keep_two_drops_the_oldest_and_keeps_what_the_kept_ones_reach() {
        let records = history();
        let plan = plan(records.clone(), Retention::Keep(2), at(T0 + 100)).unwrap();
        assert_eq!(plan.drop, 1);
        assert_eq!(plan.dropped, vec!["c1"]);
        assert_eq!(plan.kept, vec!["c2", "c3"]);
        // b is unchanged since c1 (dropped): its version there, b1, is kept; a0 and b0 (the
        // pre-images) and a1 (a at c1 only) are unreachable.
        assert_eq!(
            names(&referenced_objects(&plan.records)),
            vec!["a2", "a3", "b1", "c1"]
        );
        // Every kept checkpoint sees exactly what it saw before.
        let before = views(&records);
        let after = views(&plan.records);
        for ((id, path), object) in &after {
            assert_eq!(
                before.get(&(id.clone(), path.clone())),
                Some(object),
                "{id} {path}"
            );
        }
        assert_eq!(after.len(), 6, "{after:?}");
    }

    #[test]
    fn compacted_transcript_replays_with_the_same_state_after_the_oldest_kept() {
        let records = history();
        let plan = plan(records.clone(), Retention::Keep(2), at(T0 + 100)).unwrap();
        let base = &plan.records[0];
        assert!(base.gc_base && base.is_snapshot_update && base.message_id.is_none());
        assert_eq!(base.seq, plan.records[1].seq - 1);
        assert_eq!(
            plan.records.last().unwrap().seq,
            records.last().unwrap().seq
        );
        assert!(plan.records.windows(2).all(|w| w[0].seq < w[1].seq));
        let (old, _) = replay(&records);
        let (new, _) = replay(&plan.records);
        assert!(new.history_dropped);
        assert_eq!(new.checkpoints.len(), 2);
        assert_eq!(new.checkpoint_ids["c2"], 0);
        for (path, h) in &old.paths {
            let n = &new.paths[path];
            // Changed since the newest checkpoint: still known.
            assert_eq!(n.dirty, h.dirty, "{path}");
            // Same latest version, renumbered.
            assert_eq!(
                n.versions.last().unwrap().state,
                h.versions.last().unwrap().state
            );
        }
        assert!(new.paths["a"].dirty);
        // c was first tracked after c2 was taken: untouched by the base.
        assert_eq!(new.paths["c"].versions.len(), 2);
        assert!(!base.snapshot.tracked_file_backups.contains_key("c"));
    }

    /// The daemon's state after gc (the compacted records replayed, shifted back to the
    /// daemon's checkpoint indices) answers every question about a kept checkpoint exactly
    /// as the state before gc did, under the same index.
    #[test]
    fn adopted_state_keeps_indices_and_views_of_kept_checkpoints() {
        let records = history();
        let (before, _) = replay(&records);
        let mut st = replay(&records).0;
        let p = plan(records, Retention::Keep(2), at(T0)).unwrap();
        adopt(&mut st, replay(&p.records).0, p.drop);
        assert_eq!(st.first_kept, 1);
        assert_eq!(st.kept().len(), 2);
        assert_eq!(st.checkpoint_ids.get("c1"), None);
        assert_eq!(st.checkpoint_ids["c2"], before.checkpoint_ids["c2"]);
        assert_eq!(st.checkpoint_ids["c3"], before.checkpoint_ids["c3"]);
        for k in 1..=2 {
            for (path, h) in &before.paths {
                let a = &h.versions[h.version_at(k) - 1].state;
                let g = &st.paths[path];
                assert_eq!(&g.versions[g.version_at(k) - 1].state, a, "{path} at {k}");
                assert_eq!(g.dirty, h.dirty, "{path}");
                assert_eq!(
                    g.first_epoch <= k,
                    h.first_epoch <= k,
                    "{path} listed at {k}"
                );
            }
        }
        // A checkpoint taken next gets the next index, as before gc.
        assert_eq!(st.checkpoints.len(), before.checkpoints.len());
    }

    #[test]
    fn the_newest_checkpoint_is_always_kept() {
        let records = history();
        let p = plan(
            records.clone(),
            Retention::OlderThan(Duration::from_secs(1)),
            at(T0 + 1000),
        )
        .unwrap();
        assert_eq!(p.kept, vec!["c3"]);
        let p = plan(records, Retention::Keep(0), at(T0)).unwrap();
        assert_eq!(
            p.kept,
            vec!["c3"],
            "keep 0 is treated as 1 here; the CLI refuses it"
        );
    }

    #[test]
    fn older_than_drops_checkpoints_strictly_older_than_the_cutoff() {
        let cs: Vec<Checkpoint> = [10, 20, 30, 40]
            .iter()
            .map(|s| Checkpoint {
                id: format!("c{s}"),
                seq: *s,
                time: at(T0 + s),
                session: None,
            })
            .collect();
        let older = |secs| Retention::OlderThan(Duration::from_secs(secs));
        // now = T0+50: cutoff T0+30 drops c10 and c20; c30 is exactly at the cutoff: kept.
        assert_eq!(checkpoints_to_drop(&cs, older(20), at(T0 + 50)), 2);
        assert_eq!(checkpoints_to_drop(&cs, older(19), at(T0 + 50)), 3);
        assert_eq!(checkpoints_to_drop(&cs, older(1000), at(T0 + 50)), 0);
        assert_eq!(checkpoints_to_drop(&cs, Retention::Keep(3), at(T0)), 1);
        assert_eq!(checkpoints_to_drop(&cs, Retention::Keep(9), at(T0)), 0);
        assert_eq!(checkpoints_to_drop(&[], Retention::Keep(1), at(T0)), 0);
        assert_eq!(checkpoints_to_drop(&[], older(1), at(T0)), 0);
    }

    #[test]
    fn nothing_to_drop_keeps_the_transcript_as_is() {
        let records = history();
        let p = plan(records.clone(), Retention::Keep(10), at(T0)).unwrap();
        assert_eq!(p.drop, 0);
        assert_eq!(p.records, records);
        // Only unreferenced objects would go: none of these.
        assert_eq!(referenced_objects(&p.records).len(), 7);
    }

    #[test]
    fn gc_twice_is_idempotent() {
        let once = plan(history(), Retention::Keep(2), at(T0 + 100)).unwrap();
        let twice = plan(once.records.clone(), Retention::Keep(2), at(T0 + 100)).unwrap();
        assert_eq!(twice.drop, 0);
        assert_eq!(twice.records, once.records);
        // Compacting a compacted transcript further works too.
        let more = plan(once.records.clone(), Retention::Keep(1), at(T0 + 100)).unwrap();
        assert_eq!(more.kept, vec!["c3"]);
        assert_eq!(
            names(&referenced_objects(&more.records)),
            vec!["a3", "b1", "c1"]
        );
        assert_eq!(
            views(&more.records),
            views(&history())
                .into_iter()
                .filter(|((id, _), _)| id == "c3")
                .collect()
        );
    }

    #[test]
    fn a_pending_version_at_the_oldest_kept_checkpoint_stays_pending_until_filled() {
        let mut s = Script::new();
        s.backup("a", file(1, "a0"));
        s.checkpoint("c1", T0 + 10, &[("a", file(2, "a1"))]);
        s.backup("a", file(2, "a1"));
        let pending = TrackedFileBackup {
            backup_file_name: None,
            meta: None,
            pending: true,
            ..file(3, "")
        };
        s.checkpoint("c2", T0 + 20, &[("a", pending.clone())]);
        s.checkpoint("c3", T0 + 30, &[("a", pending)]);
        // The fill of c2's pending version comes after c3.
        let fill = TrackedFileBackup {
            fill: true,
            ..file(3, "a2")
        };
        s.backup("a", fill);
        let p = plan(s.records.clone(), Retention::Keep(2), at(T0)).unwrap();
        assert_eq!(p.kept, vec!["c2", "c3"]);
        // The base holds the filled content (replay had it), and the fill still applies.
        assert_eq!(
            p.records[0].snapshot.tracked_file_backups["a"].backup_file_name,
            Some("a2".to_string())
        );
        assert_eq!(
            p.records.last().unwrap().snapshot.tracked_file_backups["a"].version,
            1
        );
        assert_eq!(names(&referenced_objects(&p.records)), vec!["a2"]);
        assert!(!replay(&p.records).0.paths["a"].dirty);
    }

    #[test]
    fn an_inconsistent_transcript_is_refused() {
        let mut records = history();
        // A record after c2 naming a version of `a` from before c2.
        let n = records.len();
        records[n - 1]
            .snapshot
            .tracked_file_backups
            .get_mut("a")
            .unwrap()
            .version = 1;
        let err = plan(records, Retention::Keep(2), at(T0)).unwrap_err();
        assert!(err.to_string().contains("inconsistent"), "{err}");
    }

    /// The gcBase example in docs/transcript-format.md is what the writer produces, and
    /// replays as a compacted history.
    #[test]
    fn doc_example_of_a_compacted_transcript_replays() {
        let doc = include_str!("../../docs/transcript-format.md");
        let section = doc
            .split("## After gc: the `gcBase` record")
            .nth(1)
            .expect("gc section");
        let block = section
            .split("```jsonl\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("jsonl block");
        let records: Vec<Record> = block
            .lines()
            .map(|l| serde_json::from_str(l).expect("line parses"))
            .collect();
        let rewritten: String = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        assert_eq!(rewritten, block);
        assert!(records[0].gc_base && !records[1].gc_base);
        let (st, _) = replay(&records);
        assert!(st.history_dropped);
        assert_eq!(st.checkpoints.len(), 1);
        let h = &st.paths["src/lib.rs"];
        assert_eq!(h.versions.len(), 1);
        assert!(!h.dirty);
    }

    #[test]
    fn durations_parse_with_units_and_bad_ones_are_refused() {
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(14 * 86400)));
        assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
        for bad in [
            "",
            " ",
            "7x",
            "-1d",
            "d",
            "7",
            "1.5h",
            "0d",
            "7 d",
            "99999999999999999999w",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("invalid duration"), "{bad:?}: {err}");
        }
    }

    /// What every name resolves to at every checkpoint (format 4's lookup), by id: a store
    /// object, absent, or the live name it is at.
    fn resolved(records: &[Record], names: &[&str]) -> BTreeMap<(String, String), String> {
        let (st, _) = replay(records);
        let mut out = BTreeMap::new();
        for (k, c) in st.checkpoints.iter().enumerate() {
            for name in names {
                let state = match st.resolve(name, Some(k)) {
                    Resolved::Version { path, n } => st.paths[&path].versions[n - 1].state.clone(),
                    Resolved::State(state) => state,
                    Resolved::Live(q) => {
                        out.insert((c.id.clone(), name.to_string()), format!("live {q}"));
                        continue;
                    }
                };
                let text = match state {
                    super::super::VersionState::Present { object, .. } => {
                        format!("{object:?}")
                    }
                    other => format!("{other:?}"),
                };
                out.insert((c.id.clone(), name.to_string()), text);
            }
        }
        out
    }

    /// Format 4: records before the oldest kept checkpoint go, renames included; a path
    /// whose state there resolves through a kept rename gets no base entry, and every kept
    /// checkpoint resolves every name as before.
    #[test]
    fn gc_keeps_what_lookups_through_renames_read() {
        let records = renamed_history();
        let names = ["a", "a/x", "b", "b/x", "d"];
        let before = resolved(&records, &names);
        for keep in [3, 2, 1] {
            let p = plan(records.clone(), Retention::Keep(keep), at(T0 + 100)).unwrap();
            let mut state = State::default();
            for r in &p.records {
                let why = super::super::model::impossible(&state, r, &mut |_| true, &|_, _| None);
                assert_eq!(why, None, "keep {keep}: {r:?}");
                apply_record(&mut state, r);
            }
            let after = resolved(&p.records, &names);
            for (key, v) in &after {
                assert_eq!(Some(v), before.get(key), "keep {keep}: {key:?}");
            }
            assert_eq!(after.len(), names.len() * keep, "keep {keep}");
        }
    }

    /// gc plans with mutations running, then carries what they appended meanwhile: for
    /// every point the plan could have read up to, and every number of checkpoints it could
    /// drop, the plan extended with the rest equals the plan of the whole.
    #[test]
    fn a_plan_extended_with_what_was_appended_meanwhile_equals_the_plan_of_the_whole() {
        for records in [history(), renamed_history()] {
            let checkpoints = |r: &[Record]| replay(r).0.checkpoints.len();
            let all = checkpoints(&records);
            for n in 0..=records.len() {
                let head = checkpoints(&records[..n]);
                for keep in 1..=head.max(1) {
                    let mut p = plan(records[..n].to_vec(), Retention::Keep(keep), at(T0)).unwrap();
                    if !p.can_carry(&records[n..]) {
                        // gc plans the whole again: a rename above a path with a base.
                        assert!(
                            records[n..].iter().any(|r| r.rename.is_some()),
                            "read up to {n}, keep {keep}"
                        );
                        continue;
                    }
                    p.extend(records[n..].to_vec()).unwrap();
                    let whole =
                        plan(records.clone(), Retention::Keep(keep + all - head), at(T0)).unwrap();
                    assert_eq!(p.records, whole.records, "read up to {n}, keep {keep}");
                    assert_eq!((&p.dropped, &p.kept), (&whole.dropped, &whole.kept));
                }
            }
        }
    }

    /// `a/x` renamed with its directory to `b` and back, changed between the renames.
    fn renamed_history() -> Vec<Record> {
        use crate::transcript::record::RenameIntent;
        let o = |n: u8| format!("{n:064x}");
        let mut s = Script::new();
        s.backup("a/x", file(1, &o(1)));
        s.checkpoint("c0", T0, &[("a/x", file(2, &o(2)))]);
        s.backup("d", absent(1));
        s.checkpoint("c1", T0 + 10, &[("d", file(2, &o(5)))]);
        let rename = |s: &mut Script, from: &str, to: &str| {
            let seq = s.seq();
            s.records.push(Record::rename_intent(
                s.latest.as_deref(),
                seq,
                rfc3339(at(T0)),
                RenameIntent {
                    from: from.into(),
                    to: to.into(),
                    exchange: false,
                    from_object: None,
                    to_object: None,
                },
            ));
            let done =
                Record::rename_outcome(s.latest.as_deref(), seq + 1, rfc3339(at(T0)), seq, true);
            s.records.push(done);
        };
        rename(&mut s, "a", "b");
        s.backup("b/x", file(1, &o(2)));
        s.checkpoint("c2", T0 + 20, &[("b/x", file(2, &o(3)))]);
        rename(&mut s, "b", "a");
        // a/x changed again below a renamed directory: a pre-image entry, no version.
        let mut pre = file(2, &o(3));
        pre.preimage = true;
        s.backup("a/x", pre);
        s.checkpoint("c3", T0 + 30, &[("a/x", file(3, &o(4)))]);
        s.records
    }
}
