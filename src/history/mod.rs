//! The file-history system: Layer 1 (track), Layer 2 (snapshot), and what reads them back
//! (views, log, diff, rewind).
//!
//! ## Model
//! Every *tracked* path (one that was changed through the mount since the state dir was
//! created) has a list of versions v1, v2, …. v1 is its pre-image, captured by Layer 1 before
//! its first change. A later version v_i was created by checkpoint `c_i` and holds the path's
//! state at that checkpoint. So the state of a path at checkpoint `k` is the last version
//! with `c_i <= k`, or v1 when there is none; a path that is not tracked is unchanged since
//! the mount and is read from SRC.
//!
//! ## Why a checkpoint is consistent without copying the tree
//! Between two checkpoints, a path can only change through the gate. At a checkpoint, each
//! path changed since the previous one (the *dirty* set, which the gate maintains) gets a new
//! version:
//! - files held open for writing are copied at once (their data can change at any moment,
//!   without the daemon seeing it when the kernel serves IO by passthrough);
//! - other files become *pending*: their content at the checkpoint is exactly their content
//!   now and until their next change. A background copier fills them in, and the gate fills
//!   one itself (copy-on-write) before letting a change to it proceed, whichever comes first;
//! - directories, symlinks and absent paths are recorded at once (no data to copy).
//!
//! Checkpoints take the epoch lock exclusively ([`epoch`]: a [`Quiesced`] guard, whose
//! methods are the checkpoint and gc), so no mutation is between its backup and its syscall
//! while the checkpoint is taken.
//!
//! ## Durability
//! A Layer 1 backup (its object and its journal record) is in the page cache before the
//! change proceeds, so it survives a `kill -9` of the daemon in every mode; when it reaches
//! the disk depends on `--durability` (strict: one sync on the syscall path; batched, the
//! default: a syncer thread within its interval; see docs/design.md "Durability,
//! precisely"). The transcript is written asynchronously by its own thread.
//!
//! Lock order: control maintenance lock (gc exclusive; rewind and reports shared) → the
//! epoch lock (exclusive for checkpoints and gc) → `History::state` → (store, journal,
//! transcript: leaf locks). Nothing holds `state` while copying file data or syncing: a path
//! being copied is marked busy instead, and other threads wanting that path wait on
//! `busy_cond`; gc pauses fills the same way (`State::fills_paused`) and does its IO with
//! `state` unlocked. The
//! exclusion matchers' caches (`exclusions`) are leaf locks, never taken with `state` held
//! and never one inside the other.
pub mod agent_state;
#[allow(
    clippy::disallowed_methods,
    reason = "a branch's upper layer in STATE/branches, never SRC"
)]
pub mod branches;
pub mod browse;
pub mod budget;
pub mod changes;
mod checkpoint;
mod compare;
pub mod epoch;
pub mod exclusions;
pub mod gc;
pub mod ids;
pub mod logdiff;
mod migrate;
pub mod model;
mod open;
mod open_files;
pub(crate) mod process;
pub mod quote;
mod rename;
#[cfg(test)]
mod rename_design;
pub mod renames;
pub mod settings;
pub mod status;
#[allow(
    clippy::disallowed_methods,
    reason = "the backup store in STATE, never SRC"
)]
pub mod store;
mod track;
mod view;
pub mod xattrs;

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};

use crate::state::durability::Durability;
use crate::transcript::journal::Journal;
use crate::transcript::writer::TranscriptWriter;
use exclusions::{ExclusionConfig, Exclusions, Verdict};
use store::Store;

pub use epoch::MutationAdmitted;
pub(crate) use model::{ActorKey, State};
pub use model::{Checkpoint, Version, VersionState, split_parent};
pub use rename::RenameRecord;
pub use view::{ViewContent, ViewEntry};

/// Name of the virtual control directory at the mount root. The passthrough core serves it;
/// the history never tracks it and hides a real entry of that name in views.
pub const CONTROL_DIR_NAME: &[u8] = b".checkpoint";

/// Who asked for a change (from the FUSE request header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Caller {
    /// The daemon itself (replay fills, rewinds), with its own effective ids.
    pub fn daemon() -> Caller {
        // SAFETY: plain getters without preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Caller {
            pid: std::process::id(),
            uid,
            gid,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {} (uid {})", self.pid, self.uid)
    }
}

pub struct HistoryConfig {
    pub source: PathBuf,
    /// SRC's root already opened (O_PATH), e.g. the daemon's from a private clone of SRC's
    /// mount with other atime rules; `None`: open `source`.
    pub root: Option<std::os::fd::OwnedFd>,
    pub state_dir: PathBuf,
    pub exclusions: ExclusionConfig,
    /// When Layer 1 backups reach the disk (`--durability`).
    pub durability: Durability,
}

/// What Layer 1 cost on the syscall path, for the stats line at unmount (and tests: the
/// strict mode promises at most one sync per backup).
#[derive(Debug, Default)]
pub(crate) struct Layer1Stats {
    /// Layer 1 records written for a change (not for a background fill).
    pub records: AtomicU64,
    /// Of those, the ones that stored new content.
    pub with_content: AtomicU64,
    /// Syncs (fsync, fdatasync, syncfs) made on the syscall path by those backups.
    pub syncs: AtomicU64,
    /// The most syncs one backup made.
    pub max_syncs: AtomicU64,
}

/// The two places a record is written: the store journal (synchronously, before the change
/// proceeds) and the transcript (through its writer thread).
pub(crate) struct Recorder {
    pub journal: std::sync::Arc<Journal>,
    pub transcript: TranscriptWriter,
    /// Signs each record's set-id entries before it is written to either (see
    /// [`crate::transcript::mac`]).
    pub signer: crate::transcript::mac::Signer,
}

pub struct History {
    source: PathBuf,
    /// O_PATH fd on SRC: captures resolve paths beneath it without following symlinks.
    source_fd: OwnedFd,
    state_dir: PathBuf,
    store: Arc<Store>,
    durability: Durability,
    pub(crate) layer1_stats: Layer1Stats,
    /// The batched mode's syncer: whether its last round failed (so a failure is logged
    /// once, and its recovery).
    pub(crate) sync_failing: AtomicBool,
    /// Where records go; `None` when the state dir was opened read-only (no daemon).
    recorder: Option<Recorder>,
    exclusions: Exclusions,
    /// What users other than the owner may cost the state dir (see [`budget`]).
    budgets: budget::Budgets,
    /// Shared by mutations, exclusive for checkpoints and gc (see [`epoch`]). Lock order:
    /// the control maintenance lock → `epoch` → `state` → (store, journal, transcript).
    epoch: std::sync::RwLock<()>,
    /// The model. Lock order: after `epoch`, before the store's, journal's and transcript's
    /// own locks; never held across a copy, a sync or a /proc read (a path being copied is
    /// marked `busy` instead), except gc waiting on the transcript writer (which never takes
    /// it).
    state: Mutex<State>,
    busy_cond: Condvar,
    /// (path, version) pairs waiting for the background copier. Lock order: a leaf.
    pending: Mutex<VecDeque<(String, u32)>>,
    /// Copies the copier took off `pending` and has not yet recorded; changed only under
    /// `pending`'s lock when it grows, so queued + in flight is never seen as 0 between.
    copying: std::sync::atomic::AtomicUsize,
    pending_cond: Condvar,
    stopping: std::sync::atomic::AtomicBool,
    /// Who changed what, read from the transcript as it grows (see
    /// [`History::changers_by_epoch`]). Lock order: a leaf; held across the read of the
    /// transcript's new lines, which only log and browse requests wait for.
    changers_cache: Mutex<logdiff::ChangersCache>,
    /// The last [`History::log_index`] and its key. Held while an index is built (log and
    /// browse requests only), which takes `state`: lock order before `state`, never taken
    /// with `changers_cache` held.
    log_index_cache: Mutex<Option<(logdiff::LogIndexKey, Arc<logdiff::LogIndex>)>>,
    /// Held by a format-4 rename from its intent record to its outcome record, so that
    /// renames are recorded in the order they happen. Lock order: after `epoch`, before
    /// `state`.
    rename_serial: Mutex<()>,
    /// `STATE/format` says 4 (written before the first rename record).
    format4_written: AtomicBool,
    /// Called after each checkpoint, with the epoch lock held: each only notifies (the
    /// remote push worker's wake-up), never waits. Lock order: a leaf.
    checkpoint_listeners: Mutex<Vec<CheckpointListener>>,
}

/// See [`History::on_checkpoint`].
pub type CheckpointListener = Box<dyn Fn() + Send + Sync>;

impl History {
    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// What users other than the owner may cost the state dir; the daemon configures it.
    pub fn budgets(&self) -> &budget::Budgets {
        &self.budgets
    }

    pub fn exclusions(&self) -> &Exclusions {
        &self.exclusions
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `rel` is excluded from tracking (`--exclude`, `--respect-gitignore`).
    /// `is_dir`: whether it is (or, about to be created, will be) a directory; `None`: look
    /// at SRC, only if a rule needs to know.
    pub fn is_excluded(&self, rel: &str, is_dir: Option<bool>) -> bool {
        !rel.is_empty()
            && self
                .exclusions
                .is_excluded(rel, || is_dir.unwrap_or_else(|| self.is_dir_now(rel)))
    }

    /// Why `rel` is or is not excluded (see [`History::is_excluded`]).
    pub fn exclusion_verdict(&self, rel: &str, is_dir: Option<bool>) -> Verdict {
        if rel.is_empty() {
            return Verdict::Tracked;
        }
        self.exclusions
            .verdict(rel, || is_dir.unwrap_or_else(|| self.is_dir_now(rel)))
    }

    /// Whether a change of `rel` can change the exclusion rules (see
    /// [`Exclusions::rules_depend_on`]).
    pub fn exclusion_rules_depend_on(&self, rel: &[u8], rename: bool) -> bool {
        rel_key(rel).is_some_and(|rel| self.exclusions.rules_depend_on(rel, rename))
    }

    /// A change of `rel` that can change the exclusion rules is done.
    pub fn exclusion_rules_changed(&self, rel: &[u8]) {
        if let Some(rel) = rel_key(rel) {
            self.exclusions.rules_changed(rel);
        }
    }

    /// Whether `rel` is a directory in SRC now (false if absent).
    fn is_dir_now(&self, rel: &str) -> bool {
        matches!(self.current_meta(rel), Ok(Some(m)) if m.kind == crate::transcript::record::EntryKind::Dir)
    }

    /// Registers `listener`, called after every checkpoint from then on. It runs on the
    /// checkpoint's path (the marker, the control request), so it must only notify.
    pub fn on_checkpoint(&self, listener: CheckpointListener) {
        self.checkpoint_listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(listener);
    }

    pub(crate) fn notify_checkpoint_listeners(&self) {
        for l in self
            .checkpoint_listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            l();
        }
    }

    pub fn checkpoint_ids(&self) -> Vec<String> {
        self.lock().kept().iter().map(|c| c.id.clone()).collect()
    }

    pub fn checkpoint_index(&self, id: &str) -> Option<usize> {
        self.lock().checkpoint_ids.get(id).copied()
    }

    /// The kept checkpoints, oldest first (see [`History::first_kept`] for their indices).
    pub fn checkpoints(&self) -> Vec<Checkpoint> {
        self.lock().kept().to_vec()
    }

    /// The renames after checkpoint `k`, oldest first (format 4; none before it).
    pub fn renames_since(&self, k: usize) -> Vec<renames::Rename> {
        self.lock().renames_since(k)
    }

    /// The seqs of the renames of a proper ancestor of `path` (format 4), oldest first:
    /// O(depth · (1 + those renames)) through the endpoint trie.
    pub fn ancestor_rename_seqs(&self, path: &str) -> Vec<u64> {
        let st = self.lock();
        let mut seqs = Vec::new();
        let mut after = None;
        while let Some(r) = st.renames.first_ancestor_rename_after(path, after) {
            seqs.push(r.seq);
            after = Some(r.seq);
        }
        seqs
    }

    /// The kept checkpoint with index `k`, if any.
    pub fn checkpoint_at(&self, k: usize) -> Option<Checkpoint> {
        let st = self.lock();
        if k < st.first_kept {
            return None;
        }
        st.checkpoints.get(k).cloned()
    }

    /// The index of the oldest kept checkpoint, and whether gc dropped older ones.
    pub fn first_kept(&self) -> (usize, bool) {
        let st = self.lock();
        (st.first_kept, st.history_dropped)
    }

    /// Blocks until the transcript holds everything recorded so far.
    pub fn flush(&self) -> io::Result<()> {
        match &self.recorder {
            Some(r) => r.transcript.flush().map(|_| ()),
            None => Ok(()),
        }
    }

    fn recorder(&self) -> io::Result<&Recorder> {
        self.recorder.as_ref().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                "the state dir is opened read-only (no daemon is serving it)",
            )
        })
    }
}

/// Bytes of a path relative to the mount root as a tracking key; `None` for names that are
/// not UTF-8 (they pass through untracked: the transcript is JSON).
pub fn rel_key(rel: &[u8]) -> Option<&str> {
    std::str::from_utf8(rel).ok()
}

pub use model::replay_for_fuzzing;
pub use open::{open_history, open_history_readonly};
