//! Opening a state dir: replay of the transcript and the store journal (refusing an
//! impossible history), migration of old forms, then the history a daemon records into or
//! a read-only one for reports.
use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

use log::{info, warn};

use super::model::{apply_record, impossible};
use super::store::{Store, SyncPolicy};
use super::{History, HistoryConfig, State};
use crate::state::durability::Durability;
use crate::sys::open_source;
use crate::transcript::journal::Journal;
use crate::transcript::mac::{
    RecordKey, Signer, StateId, new_state_id, read_state_id, write_state_id,
};
use crate::transcript::record::{Record, RenameIntent, TrackedFileBackup};
use crate::transcript::replay::{read_transcript, truncate_torn_tail};
use crate::transcript::writer::{TranscriptWriter, rewrite_atomically};

/// What replay found in a state dir.
struct Loaded {
    state: State,
    transcript_outcome: crate::transcript::replay::ReadOutcome,
    journal_tail: Vec<Record>,
}

/// Replays the transcript, then the journal records past its end, refusing an impossible
/// history (see [`impossible`]; `check_entry` judges set-id entries' MACs) with a clear
/// error. Reads only.
fn load(
    state_dir: &std::path::Path,
    store: &Store,
    check_entry: &dyn Fn(&str, &TrackedFileBackup) -> Option<String>,
) -> io::Result<Loaded> {
    // Before anything is read: records of a newer format would be misread.
    crate::state::format::check(state_dir)?;
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
        if let Some(why) = impossible(&state, r, &mut has_object, check_entry) {
            let file = if i < transcript_len {
                &transcript_path
            } else {
                &journal_path
            };
            let line = line_of_seq(file, r.seq).map_or(String::new(), |n| format!(" line {n}"));
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}{line}: the record with seq {} describes an impossible history: {why}. \
                     The file was damaged or edited; nothing was mounted. Restore the state \
                     dir {} from a backup, or move it aside to start a new history",
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

/// The 1-based line of `path` holding the record with `seq`, for the message of a refused
/// replay (seqs are unique in a file that replay read); `None` if it cannot be read again.
fn line_of_seq(path: &std::path::Path, seq: u64) -> Option<usize> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .position(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v.get("seq").and_then(serde_json::Value::as_u64) == Some(seq))
        })
        .map(|i| i + 1)
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
        budgets: Default::default(),
        epoch: std::sync::RwLock::new(()),
        state: Mutex::new(state),
        busy_cond: Condvar::new(),
        pending: Mutex::new(pending),
        copying: Default::default(),
        changers_cache: Default::default(),
        log_index_cache: Default::default(),
        pending_cond: Condvar::new(),
        stopping: Default::default(),
        rename_serial: Mutex::new(()),
        format4_written: AtomicBool::new(false),
        checkpoint_listeners: Default::default(),
    }))
}

/// Opens the history in `cfg.state_dir` for a daemon: replays the transcript and the store
/// journal, then starts recording.
pub fn open_history(mut cfg: HistoryConfig) -> io::Result<Arc<History>> {
    let source_fd = match cfg.root.take() {
        Some(fd) => fd,
        None => open_source(&cfg.source)?,
    };
    // Temp files of writes killed before their rename. The daemon holds the state lock, so
    // no write is under way.
    crate::state::dir::remove_leftover_temps(&cfg.state_dir)?;
    let policy = match cfg.durability {
        Durability::Batched => SyncPolicy::Batched,
        // Strict syncs the filesystem after each backup; process only at unmount.
        Durability::Strict | Durability::Process => SyncPolicy::Caller,
    };
    let store = Arc::new(Store::open_with(&cfg.state_dir.join("backups"), policy)?);
    let transcript_path = cfg.state_dir.join("transcript.jsonl");
    let journal_path = cfg.state_dir.join("backups").join("journal.jsonl");
    // Without a key the daemon still mounts: only set-id entries need one (replay refuses
    // them, and new ones are recorded unsigned, with an error in the log).
    let key = RecordKey::load_or_create().map(Arc::new).map_err(|e| {
        warn!("no record key, so set-id modes cannot be signed or checked: {e}");
        e.to_string()
    });
    let (loaded, signer) = prepare(&cfg.state_dir, &store, key)?;

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
    let history = assemble(
        cfg,
        source_fd,
        store,
        loaded.state,
        Some(super::Recorder {
            journal,
            transcript,
            signer,
        }),
    )?;
    history.settle_dangling_renames()?;
    Ok(history)
}

/// Replays a state dir for a daemon and migrates it: set-id entries are checked against
/// `key` once the state dir is signed, and signed on first use before (see migrate.rs); a
/// transcript with full checkpoints is rewritten in delta form; a torn tail is cut. Returns
/// what replay found, and the signer of the records the daemon will write.
fn prepare(
    state_dir: &std::path::Path,
    store: &Store,
    key: Result<Arc<RecordKey>, String>,
) -> io::Result<(Loaded, Signer)> {
    let transcript_path = state_dir.join("transcript.jsonl");
    let state_id = read_state_id(state_dir)?;
    let signed = state_id.as_ref().is_some_and(|s| s.complete);
    // A state dir without an id predates signing: trust on first use. One whose id is still
    // `pending` was being signed when its daemon stopped: signed again, with that id.
    let first_signing = !signed && key.is_ok();
    let resumed = state_id.is_some();
    let signer = Signer::new(
        key,
        match state_id {
            Some(s) => s.id,
            None => new_state_id()?,
        },
    );
    let check_entry = |path: &str, b: &TrackedFileBackup| signer.check(path, b);
    let unchecked = |_: &str, _: &TrackedFileBackup| None;
    let mut loaded = load(
        state_dir,
        store,
        if signed { &check_entry } else { &unchecked },
    )?;
    let rewritten = first_signing
        && sign_on_first_use(state_dir, &transcript_path, &mut loaded, &signer, resumed)?;
    if rewritten {
        // The signing rewrote it whole, in delta form, ending on a line boundary.
    } else if super::migrate::has_full_checkpoints(&loaded.transcript_outcome.records) {
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
    Ok((loaded, signer))
}

/// Trust on first use for a state dir from before signing (see migrate.rs): signs the set-id
/// entries of everything `loaded` replayed (transcript and journal tail), rewrites the
/// transcript with them (in delta form) if there are any, and says whether it did.
/// `signing-id` says `ID pending` from before the rewrite until after it, so a crash in
/// between leaves a state dir that the next mount signs again (`resumed`), with the same id;
/// then it says `ID`.
fn sign_on_first_use(
    state_dir: &std::path::Path,
    transcript_path: &std::path::Path,
    loaded: &mut Loaded,
    signer: &Signer,
    resumed: bool,
) -> io::Result<bool> {
    let records = &loaded.transcript_outcome.records;
    let signed_before = super::migrate::first_signed(records)
        .or_else(|| super::migrate::first_signed(&loaded.journal_tail));
    if let (false, Some((seq, path))) = (resumed, signed_before) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is missing, yet the record with seq {seq} signs {path:?}: the state dir's \
                 id was removed, and its set-id entries can no longer be checked; nothing was \
                 mounted. Restore the state dir {} from a backup, or move it aside to start a \
                 new history",
                state_dir
                    .join(crate::transcript::mac::STATE_ID_FILE)
                    .display(),
                state_dir.display()
            ),
        ));
    }
    let to_sign = super::migrate::set_id_entries(records)
        + super::migrate::set_id_entries(&loaded.journal_tail);
    // First use means first: a state dir this key began signing before, found again with
    // set-id entries and no id, had its id (and its MACs) removed. A new, empty one at the
    // same place signs nothing, so it is fine.
    let canonical = std::fs::canonicalize(state_dir)?;
    if let (false, true, Some(key)) = (resumed, to_sign > 0, signer.key())
        && let Some(old_id) = key.signed_before(&canonical)?
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is missing, but this state dir was signed before (as {old_id}, noted in \
                     {}): its id was removed, and its {to_sign} set-id entries cannot be \
                     trusted; nothing was mounted. Restore the state dir from a backup, or move \
                     it aside to start a new history (if it is a state dir from before signing \
                     restored here on purpose, remove that line from the list)",
                state_dir
                    .join(crate::transcript::mac::STATE_ID_FILE)
                    .display(),
                key.signed_list().display()
            ),
        ));
    }
    let mut id = StateId {
        id: signer.state_id().to_string(),
        complete: false,
    };
    if let Some(key) = signer.key() {
        key.remember_signed(&canonical, &id.id)?;
    }
    write_state_id(state_dir, &id)?;
    if to_sign > 0 {
        let mut records = std::mem::take(&mut loaded.transcript_outcome.records);
        if super::migrate::has_full_checkpoints(&records) {
            records = super::migrate::to_delta_form(records);
        }
        // The journal's tail goes into the rewritten transcript, signed; the journal is then
        // covered (its records' seqs are the transcript's), so nothing is re-appended.
        records.append(&mut loaded.journal_tail);
        super::migrate::sign_once(&mut records, signer);
        rewrite_atomically(transcript_path, &records)?;
    }
    id.complete = true;
    write_state_id(state_dir, &id)?;
    info!(
        "state dir {}: set-id entries are signed from now on; signed the {to_sign} already \
         recorded (trusted on first use: the state dir is writable by its owner only)",
        state_dir.display()
    );
    Ok(to_sign > 0)
}

/// Opens a state dir that no daemon serves, for `log`/`diff`/`status --state-dir`: replays
/// everything, changes nothing on disk. Set-id entries' MACs are not checked: nothing here
/// restores a mode (a rewind needs a mount, whose replay checks them).
pub fn open_history_readonly(cfg: HistoryConfig) -> io::Result<Arc<History>> {
    let source_fd = open_source(&cfg.source)?;
    let store = Arc::new(Store::open(&cfg.state_dir.join("backups"))?);
    let loaded = load(&cfg.state_dir, &store, &|_, _| None)?;
    let history = assemble(cfg, source_fd, store, loaded.state, None)?;
    history.settle_dangling_renames()?;
    Ok(history)
}

impl History {
    /// Decides each rename intent that replay found without an outcome (the daemon stopped
    /// between the two records) from SRC, as docs/design.md says: it happened iff `to` now
    /// holds `fromObject` (and, for an exchange, `from` holds `toObject`). Nothing else
    /// changes SRC through the mount while no daemon serves it. Logs the decision; a daemon
    /// also records it as the outcome (journal, then transcript), so that later changes of
    /// SRC cannot change it; a read-only open only applies it in memory.
    fn settle_dangling_renames(&self) -> io::Result<()> {
        let dangling: Vec<(u64, RenameIntent)> = self
            .lock()
            .renames
            .pending()
            .map(|(seq, intent)| (seq, intent.clone()))
            .collect();
        for (seq, intent) in dangling {
            let holds = |rel: &str, object: Option<(u64, u64)>| -> io::Result<bool> {
                let (Some(object), Some(fd)) = (object, self.open_existing(rel)?) else {
                    return Ok(false);
                };
                let st = crate::sys::fstat(fd.as_fd())?;
                Ok((st.st_dev as u64, st.st_ino as u64) == object)
            };
            let done = holds(&intent.to, intent.from_object)?
                && (!intent.exchange || holds(&intent.from, intent.to_object)?);
            warn!(
                "the rename of {:?} to {:?} (seq {seq}) has no recorded outcome (the daemon \
                 stopped in between); {:?} {}, so it {}",
                intent.from,
                intent.to,
                intent.to,
                if done {
                    "holds what was renamed"
                } else {
                    "does not hold what was to be renamed"
                },
                if done { "happened" } else { "did not happen" }
            );
            let mut st = self.lock();
            let message = st.current_message();
            let record = Record::rename_outcome(
                message.as_deref(),
                st.next_seq,
                crate::transcript::record::rfc3339(std::time::SystemTime::now()),
                seq,
                done,
            );
            st.next_seq += 1;
            if let Some(rec) = self.recorder.as_ref() {
                rec.journal.append(&record, false)?;
                rec.transcript.append(record.clone());
            }
            super::model::apply_record(&mut st, &record);
        }
        Ok(())
    }
}

fn to_io(e: crate::transcript::replay::ReplayError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests write state dirs directly, as an attacker would"
)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Write;

    use super::*;
    use crate::transcript::mac::needs_mac;
    use crate::transcript::testutil::file_entry;

    const T: &str = "2026-01-02T03:04:05.678Z";

    /// Key `byte`, as if read from `keys/k<byte>/record.key` (its list of signed state dirs
    /// goes beside it).
    fn key(keys: &std::path::Path, byte: u8) -> Result<Arc<RecordKey>, String> {
        let dir = keys.join(format!("k{byte}"));
        std::fs::create_dir_all(&dir).unwrap();
        let key = RecordKey::from_bytes([byte; 32], dir.join("record.key"));
        Ok(Arc::new(key))
    }

    fn entry(version: u32, object: &str, mode: u32, uid: u32) -> TrackedFileBackup {
        let mut b = file_entry(version, object, T);
        let m = b.meta.as_mut().expect("a file entry has meta");
        (m.mode, m.uid) = (mode, uid);
        b
    }

    fn one(path: &str, b: TrackedFileBackup) -> BTreeMap<String, TrackedFileBackup> {
        BTreeMap::from([(path.to_string(), b)])
    }

    /// A state dir as a daemon before signing left it: `tool` made setuid (v2 at c0), then
    /// not any more (v3 at c1). Returns it, a directory for keys, its store and the tool's
    /// object.
    fn old_state_dir() -> (tempfile::TempDir, tempfile::TempDir, Store, String) {
        let (dir, keys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let store = Store::open(&dir.path().join("backups")).unwrap();
        let object = store.put_bytes(b"#!/bin/sh\n").unwrap().name;
        let records = vec![
            Record::snapshot_update(
                None,
                1,
                T.into(),
                one("tool", entry(1, &object, 0o755, 1000)),
            ),
            Record::checkpoint_delta(
                "c0",
                2,
                T.into(),
                one("tool", entry(2, &object, 0o4755, 1000)),
            ),
            // Changed after c0: v2's repeat, with the setuid mode it had.
            Record::snapshot_update(
                Some("c0"),
                3,
                T.into(),
                one("tool", entry(2, &object, 0o4755, 1000)),
            ),
            Record::checkpoint_delta(
                "c1",
                4,
                T.into(),
                one("tool", entry(3, &object, 0o755, 1000)),
            ),
        ];
        rewrite_atomically(&dir.path().join("transcript.jsonl"), &records).unwrap();
        (dir, keys, store, object)
    }

    fn transcript(dir: &std::path::Path) -> Vec<Record> {
        read_transcript(&dir.join("transcript.jsonl"))
            .unwrap()
            .records
    }

    fn append(dir: &std::path::Path, records: &[Record]) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("transcript.jsonl"))
            .unwrap();
        for r in records {
            writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
        }
    }

    /// The attack: a made-up version giving `tool` mode 04755 and uid 0, and a
    /// checkpoint pointing at it.
    fn forged(object: &str, mac: Option<String>) -> Vec<Record> {
        let mut b = entry(4, object, 0o4755, 0);
        b.mac = mac;
        vec![
            Record::snapshot_update(
                Some("c1"),
                5,
                T.into(),
                one("tool", entry(3, object, 0o755, 1000)),
            ),
            Record::checkpoint_delta("evil", 6, T.into(), one("tool", b)),
        ]
    }

    #[test]
    fn an_older_state_dir_is_signed_once_then_checked() {
        let (dir, keys, store, object) = old_state_dir();
        let (loaded, signer) = prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        assert_eq!(loaded.state.checkpoints.len(), 2);
        let id = read_state_id(dir.path())
            .unwrap()
            .expect("signing-id written");
        assert!(id.complete);
        assert_eq!(id.id, signer.state_id());
        let records = transcript(dir.path());
        let macs: Vec<_> = records
            .iter()
            .flat_map(|r| r.snapshot.tracked_file_backups.values())
            .map(|b| (needs_mac(b.meta.as_ref()), b.mac.is_some()))
            .collect();
        assert_eq!(
            macs,
            [(false, false), (true, true), (true, true), (false, false)],
            "both setuid entries signed, no other"
        );
        // Exactly once: the next mount checks, and signs nothing.
        let (_, again) = prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        assert_eq!(again.state_id(), signer.state_id());
        assert_eq!(
            transcript(dir.path()),
            records,
            "the transcript is left as it is"
        );
        // An unsigned set-id record appended now is no longer trusted.
        append(dir.path(), &forged(&object, None));
        let e = prepare(dir.path(), &store, key(keys.path(), 7))
            .err()
            .unwrap();
        let msg = e.to_string();
        assert!(msg.contains("the record with seq 6"), "{msg}");
        assert!(
            msg.contains("\"tool\" version 4 has set-id mode 4755 (uid 0"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!(
                "no signature from the record key {}/k7/record.key",
                keys.path().display()
            )),
            "{msg}"
        );
        assert!(msg.contains("nothing was mounted"), "{msg}");
    }

    /// The valid MAC of v2 copied onto the forged v4 (the attack, with a signature
    /// taken from the history itself): refused, as is a key other than the signer's.
    #[test]
    fn a_copied_mac_or_another_key_is_refused() {
        let (dir, keys, store, object) = old_state_dir();
        prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        let mac = transcript(dir.path())[1].snapshot.tracked_file_backups["tool"]
            .mac
            .clone();
        assert!(mac.is_some());
        let e = prepare(dir.path(), &store, key(keys.path(), 8))
            .err()
            .unwrap();
        assert!(e.to_string().contains("a signature not made by"), "{e}");
        append(dir.path(), &forged(&object, mac));
        let e = prepare(dir.path(), &store, key(keys.path(), 7))
            .err()
            .unwrap();
        assert!(e.to_string().contains("\"tool\" version 4"), "{e}");
        assert!(e.to_string().contains("a signature not made by"), "{e}");
        let e = prepare(dir.path(), &store, Err("no home".into()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("no record key to check"), "{e}");
    }

    /// A signing cut short (the id still `pending`) is done again with the same id; an id
    /// removed from a signed state dir is not taken for an older state dir.
    #[test]
    fn an_interrupted_signing_resumes_and_a_removed_id_is_refused() {
        let (dir, keys, store, _) = old_state_dir();
        prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        let mut id = read_state_id(dir.path()).unwrap().unwrap();
        id.complete = false;
        write_state_id(dir.path(), &id).unwrap();
        let (_, signer) = prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        assert_eq!(signer.state_id(), id.id);
        assert!(read_state_id(dir.path()).unwrap().unwrap().complete);
        std::fs::remove_file(dir.path().join("signing-id")).unwrap();
        let e = prepare(dir.path(), &store, key(keys.path(), 7))
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("the state dir's id was removed"),
            "{e}"
        );
    }

    /// Write access to a signed state dir is not enough to have it signed again: with its id
    /// and every MAC stripped and a forged set-id record added, it looks like a state dir
    /// from before signing, but the key's list says it was signed, so it is refused. A new,
    /// empty state dir at the same place is a new history and is signed as usual.
    #[test]
    fn a_state_dir_stripped_of_its_id_and_macs_is_not_signed_again() {
        let (dir, keys, store, object) = old_state_dir();
        prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        let mut records = transcript(dir.path());
        for r in &mut records {
            for b in r.snapshot.tracked_file_backups.values_mut() {
                b.mac = None;
            }
        }
        records.extend(forged(&object, None));
        rewrite_atomically(&dir.path().join("transcript.jsonl"), &records).unwrap();
        std::fs::remove_file(dir.path().join("signing-id")).unwrap();
        let e = prepare(dir.path(), &store, key(keys.path(), 7))
            .err()
            .unwrap();
        let msg = e.to_string();
        assert!(msg.contains("this state dir was signed before"), "{msg}");
        assert!(msg.contains("signed-state-dirs"), "{msg}");
        assert!(
            read_state_id(dir.path()).unwrap().is_none(),
            "nothing signed"
        );
        assert_eq!(transcript(dir.path()), records, "nothing rewritten");

        // Moved aside, and a new history started in its place.
        std::fs::remove_file(dir.path().join("transcript.jsonl")).unwrap();
        let (loaded, signer) = prepare(dir.path(), &store, key(keys.path(), 7)).unwrap();
        assert!(loaded.state.paths.is_empty());
        assert_eq!(
            read_state_id(dir.path()).unwrap().unwrap().id,
            signer.state_id()
        );
    }

    /// A rename intent without its outcome (the daemon killed between the two records) is
    /// decided from SRC at replay: done iff `to` holds what `from` held, both ways.
    #[test]
    fn a_dangling_rename_intent_is_decided_from_src() {
        use std::os::unix::fs::MetadataExt;
        for happened in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let (src, state) = (dir.path().join("src"), dir.path().join("state"));
            std::fs::create_dir_all(src.join("a/deep")).unwrap();
            std::fs::create_dir(&state).unwrap();
            let md = std::fs::metadata(src.join("a")).unwrap();
            let intent = RenameIntent {
                from: "a".into(),
                to: "b".into(),
                exchange: false,
                from_object: Some((md.dev(), md.ino())),
                to_object: None,
            };
            let records = vec![
                Record::checkpoint_delta("c0", 1, T.into(), BTreeMap::new()),
                Record::rename_intent(Some("c0"), 2, T.into(), intent),
            ];
            rewrite_atomically(&state.join("transcript.jsonl"), &records).unwrap();
            if happened {
                std::fs::rename(src.join("a"), src.join("b")).unwrap();
            }
            let history = open_history_readonly(HistoryConfig {
                source: src.clone(),
                root: None,
                state_dir: state,
                exclusions: Default::default(),
                durability: Default::default(),
            })
            .unwrap();
            let st = history.lock();
            assert_eq!(st.renames.pending().count(), 0, "decided");
            let done: Vec<_> = st.renames.done().iter().map(|r| r.seq).collect();
            assert_eq!(done, if happened { vec![2] } else { vec![] });
            // The lookup follows the decision: `a/deep` at c0 is what is at `b/deep` now.
            let expect = if happened { "b/deep" } else { "a/deep" };
            assert_eq!(
                st.resolve("a/deep", Some(0)),
                crate::history::model::Resolved::Live(expect.into())
            );
        }
    }
}
