//! Opening a state dir: replay of the transcript and the store journal (refusing an
//! impossible history), migration of old forms, then the history a daemon records into or
//! a read-only one for reports.
use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};

use log::{info, warn};

use super::model::{apply_record, impossible};
use super::store::{Store, SyncPolicy};
use super::{History, HistoryConfig, State};
use crate::durability::Durability;
use crate::sys::open_source;
use crate::transcript::journal::Journal;
use crate::transcript::record::Record;
use crate::transcript::replay::{read_transcript, truncate_torn_tail};
use crate::transcript::writer::{TranscriptWriter, rewrite_atomically};

/// What replay found in a state dir.
struct Loaded {
    state: State,
    transcript_outcome: crate::transcript::replay::ReadOutcome,
    journal_tail: Vec<Record>,
}

/// Replays the transcript, then the journal records past its end, refusing an impossible
/// history (see [`impossible`]) with a clear error. Reads only.
fn load(state_dir: &std::path::Path, store: &Store) -> io::Result<Loaded> {
    let transcript_path = state_dir.join("transcript.jsonl");
    let journal_path = state_dir.join("backups").join("journal.jsonl");
    let outcome = read_transcript(&transcript_path).map_err(to_io)?;
    if let Some(line) = outcome.dropped_torn_line {
        warn!(
            "transcript {}: dropped a torn last line ({line}), left by a crash during an append",
            transcript_path.display()
        );
    }
    let last_seq = outcome.records.last().map_or(0, |r| r.seq);
    let journal_tail = Journal::read_after(&journal_path, last_seq).map_err(to_io)?;
    let mut state = State::default();
    // One lookup per object, however many versions share it.
    let mut seen = HashSet::new();
    let mut has_object = |name: &str| {
        seen.contains(name) || {
            let found = store.contains(name);
            if found {
                seen.insert(name.to_string());
            }
            found
        }
    };
    let transcript_len = outcome.records.len();
    for (i, r) in outcome
        .records
        .iter()
        .chain(journal_tail.iter())
        .enumerate()
    {
        if let Some(why) = impossible(&state, r, &mut has_object) {
            let file = if i < transcript_len {
                &transcript_path
            } else {
                &journal_path
            };
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: the record with seq {} describes an impossible history: {why}. The \
                     file was damaged or edited; nothing was mounted. Restore the state dir \
                     {} from a backup, or move it aside to start a new history",
                    file.display(),
                    r.seq,
                    state_dir.display()
                ),
            ));
        }
        apply_record(&mut state, r);
    }
    state.next_seq = state.next_seq.max(last_seq + 1);
    info!(
        "replayed {} transcript records and {} journal records: {} checkpoints, {} tracked paths",
        outcome.records.len(),
        journal_tail.len(),
        state.checkpoints.len(),
        state.paths.len()
    );
    Ok(Loaded {
        state,
        transcript_outcome: outcome,
        journal_tail,
    })
}

fn assemble(
    cfg: HistoryConfig,
    source_fd: OwnedFd,
    store: Arc<Store>,
    state: State,
    recorder: Option<super::Recorder>,
) -> io::Result<Arc<History>> {
    let pending: VecDeque<(String, u32)> = state
        .paths
        .iter()
        .filter(|(_, h)| h.latest_is_pending())
        .map(|(p, h)| (p.clone(), h.versions.len() as u32))
        .collect();
    // Read only with git's rules on: without them the user's git config is none of ours.
    let global_excludes = cfg
        .exclusions
        .respect_gitignore
        .then(super::exclusions::global_excludes_file)
        .flatten();
    let exclusions = super::Exclusions::new(
        cfg.exclusions,
        &cfg.source,
        source_fd.try_clone()?,
        global_excludes,
    )?;
    Ok(Arc::new(History {
        source: cfg.source,
        source_fd,
        state_dir: cfg.state_dir,
        store,
        durability: cfg.durability,
        layer1_stats: Default::default(),
        sync_failing: Default::default(),
        recorder,
        exclusions,
        epoch: std::sync::RwLock::new(()),
        state: Mutex::new(state),
        busy_cond: Condvar::new(),
        pending: Mutex::new(pending),
        copying: Default::default(),
        pending_cond: Condvar::new(),
        stopping: Default::default(),
    }))
}

/// Opens the history in `cfg.state_dir` for a daemon: replays the transcript and the store
/// journal, then starts recording.
pub fn open_history(mut cfg: HistoryConfig) -> io::Result<Arc<History>> {
    let source_fd = match cfg.root.take() {
        Some(fd) => fd,
        None => open_source(&cfg.source)?,
    };
    // The daemon holds the state lock, so no gc is writing one of these right now.
    super::gc::remove_stale_rewrites(&cfg.state_dir)?;
    let policy = match cfg.durability {
        Durability::Batched => SyncPolicy::Batched,
        // Strict syncs the filesystem after each backup; process only at unmount.
        Durability::Strict | Durability::Process => SyncPolicy::Caller,
    };
    let store = Arc::new(Store::open_with(&cfg.state_dir.join("backups"), policy)?);
    let transcript_path = cfg.state_dir.join("transcript.jsonl");
    let journal_path = cfg.state_dir.join("backups").join("journal.jsonl");
    let mut loaded = load(&cfg.state_dir, &store)?;
    if super::migrate::has_full_checkpoints(&loaded.transcript_outcome.records) {
        // Once, for a state dir from before delta checkpoints: the rewrite also leaves the
        // file ending on a line boundary.
        let records = std::mem::take(&mut loaded.transcript_outcome.records);
        let before = std::fs::metadata(&transcript_path).map_or(0, |m| m.len());
        rewrite_atomically(&transcript_path, &super::migrate::to_delta_form(records))?;
        let after = std::fs::metadata(&transcript_path).map_or(0, |m| m.len());
        info!(
            "transcript {}: rewrote its checkpoints in delta form ({before} -> {after} bytes)",
            transcript_path.display()
        );
    } else {
        // Leaves the file ending on a line boundary, which the writer requires.
        truncate_torn_tail(&transcript_path, &loaded.transcript_outcome)?;
    }

    let journal = Arc::new(Journal::open(&journal_path)?);
    let transcript = TranscriptWriter::start(&transcript_path)?;
    {
        // Once the transcript holds everything the journal does, the journal can go.
        let journal = journal.clone();
        transcript.set_on_durable(Box::new(move |seq| {
            if let Err(e) = journal.truncate_if_covered(seq) {
                warn!("truncating the store journal: {e}");
            }
        }));
    }
    if cfg.durability == Durability::Batched {
        // A record durable in the transcript must not name an object a power loss can
        // still take (strict mode syncs each object before its record exists; process
        // mode promises nothing across a power loss).
        let store = store.clone();
        transcript.set_before_commit(Box::new(move || store.sync_batch().map(drop)));
    }
    // Records that reached only the journal before a crash belong in the transcript too.
    for r in loaded.journal_tail {
        transcript.append(r);
    }
    assemble(
        cfg,
        source_fd,
        store,
        loaded.state,
        Some(super::Recorder {
            journal,
            transcript,
        }),
    )
}

/// Opens a state dir that no daemon serves, for `log`/`diff`/`status --state-dir`: replays
/// everything, changes nothing on disk.
pub fn open_history_readonly(cfg: HistoryConfig) -> io::Result<Arc<History>> {
    let source_fd = open_source(&cfg.source)?;
    let store = Arc::new(Store::open(&cfg.state_dir.join("backups"))?);
    let loaded = load(&cfg.state_dir, &store)?;
    assemble(cfg, source_fd, store, loaded.state, None)
}

fn to_io(e: crate::transcript::replay::ReplayError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}
