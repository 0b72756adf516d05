//! Layer 1 (back up before the first change) and Layer 2 (checkpoints), plus replay.
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::SystemTime;

use log::{debug, info, warn};

use super::model::{apply_record, backup_of, impossible};
use super::store::{Store, SyncPolicy};
use super::{Caller, Checkpoint, History, HistoryConfig, State, Version, VersionState, rel_key};
use crate::durability::{self, Durability};
use crate::sys::{self, errno, open_source};
use crate::transcript::journal::Journal;
use crate::transcript::record::{Actor, EntryKind, EntryMeta, Record, rfc3339};
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

pub(crate) fn meta_of(st: &libc::stat) -> Option<EntryMeta> {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        libc::S_IFIFO => EntryKind::Fifo,
        libc::S_IFSOCK => EntryKind::Socket,
        libc::S_IFCHR => EntryKind::CharDevice,
        libc::S_IFBLK => EntryKind::BlockDevice,
        _ => return None,
    };
    let is_dev = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice);
    Some(EntryMeta {
        kind,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: if kind == EntryKind::Dir {
            0
        } else {
            st.st_size as u64
        },
        mtime_sec: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec as u32,
        rdev: is_dev.then_some(st.st_rdev),
    })
}

fn actor_key(a: &Actor) -> super::ActorKey {
    super::ActorKey {
        pid: a.pid,
        session: a.session.clone(),
    }
}

/// What a Layer 1 record still needs, after it is written, before the change may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayerSync {
    /// No record was written.
    Nothing,
    /// Written; the mode syncs later (or never).
    None,
    /// Strict, no new object: fdatasync the journal.
    Journal,
    /// Strict, with a new object: one syncfs covers object, name and record.
    Filesystem,
}

/// What Layer 1 must do for a path before it changes.
enum Need {
    Nothing,
    /// Tracked, its state at the last checkpoint is stored: just note it changed again.
    MarkDirty,
    /// Copy the current state as a new v1 (untracked) or into the pending latest version.
    Capture,
}

impl History {
    /// Layer 1: called by the gate before `rel` changes. Returns once the pre-image is
    /// durable (or known to be stored already); an error must fail the change. `is_dir`:
    /// whether the path is (or, about to be created, will be) a directory, for exclusion
    /// rules that match directories only; `None`: look at SRC if a rule needs it.
    pub fn before_change(
        &self,
        caller: &Caller,
        rel: &[u8],
        is_dir: Option<bool>,
    ) -> io::Result<()> {
        let Some(rel) = rel_key(rel) else {
            warn!(
                "not tracking a path that is not UTF-8: {:?}",
                String::from_utf8_lossy(rel)
            );
            return Ok(());
        };
        if self.is_excluded(rel, is_dir) {
            return Ok(());
        }
        self.track(rel, Some(caller), false)
    }

    /// Layer 1 for a rename: both names, and for a directory every path below it at its old
    /// and its new place (a directory rename moves its whole subtree).
    pub fn before_rename(
        &self,
        caller: &Caller,
        from: &[u8],
        to: &[u8],
        exchange: bool,
    ) -> io::Result<()> {
        let (Some(from), Some(to)) = (rel_key(from), rel_key(to)) else {
            warn!("not tracking a rename involving a non-UTF-8 path");
            return Ok(());
        };
        // After the rename `to` holds what `from` is now (exchanged: each the other's), so
        // an exclusion rule for directories must see `from`'s type at both names.
        let kind_of = |rel: &str| {
            self.exclusions
                .uses_git_rules()
                .then(|| self.is_dir_now(rel))
        };
        let from_is_dir = kind_of(from);
        let to_is_dir = if exchange { kind_of(to) } else { from_is_dir };
        self.before_change(caller, from.as_bytes(), from_is_dir)?;
        self.before_change(caller, to.as_bytes(), to_is_dir)?;
        self.track_subtree_move(caller, from, to)?;
        if exchange {
            self.track_subtree_move(caller, to, from)?;
        }
        Ok(())
    }

    fn track_subtree_move(&self, caller: &Caller, from: &str, to: &str) -> io::Result<()> {
        let mut stack = vec![String::new()];
        while let Some(sub) = stack.pop() {
            let dir = if sub.is_empty() {
                from.to_string()
            } else {
                format!("{from}/{sub}")
            };
            // Beneath SRC without following any symlink: renaming a symlink (or a directory
            // someone swapped for one) must never walk what it points to.
            let Some(dir_fd) = self.open_existing(&dir)? else {
                continue;
            };
            if sys::fstat(dir_fd.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR {
                continue;
            }
            let mut stream = sys::DirStream::open(dir_fd.as_fd())?;
            let mut names = Vec::new();
            while let Some(entry) = stream.next_entry()? {
                if entry.name != b"." && entry.name != b".." {
                    names.push((entry.name.to_vec(), entry.d_type));
                }
            }
            drop(stream);
            for (name, d_type) in names {
                let Ok(name) = String::from_utf8(name) else {
                    warn!("not tracking a path that is not UTF-8 under {dir}");
                    continue;
                };
                let child = if sub.is_empty() {
                    name.to_string()
                } else {
                    format!("{sub}/{name}")
                };
                let is_dir = match d_type {
                    libc::DT_DIR => true,
                    libc::DT_UNKNOWN => match self.open_existing(&format!("{dir}/{name}"))? {
                        Some(fd) => sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT == libc::S_IFDIR,
                        None => false,
                    },
                    _ => false,
                };
                self.before_change(caller, format!("{from}/{child}").as_bytes(), Some(is_dir))?;
                self.before_change(caller, format!("{to}/{child}").as_bytes(), Some(is_dir))?;
                if is_dir {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// The common path of Layer 1 (caller = Some) and the background copier (fill): records
    /// what is needed, then makes it as durable as the mode asks, with the state unlocked.
    fn track(&self, rel: &str, caller: Option<&Caller>, fill: bool) -> io::Result<()> {
        let syncs_before = durability::syncs_on_this_thread();
        let (sync, wrote) = self.track_locked(rel, caller, fill)?;
        let recorded = sync != LayerSync::Nothing;
        match sync {
            LayerSync::Nothing | LayerSync::None => {}
            LayerSync::Journal => self.recorder()?.journal.sync()?,
            // One syncfs: the object's data, its name and the journal record at once.
            LayerSync::Filesystem => self.store.sync_filesystem()?,
        }
        if caller.is_some() && !fill && recorded {
            let s = &self.layer1_stats;
            let syncs = durability::syncs_on_this_thread() - syncs_before;
            s.records.fetch_add(1, Ordering::Relaxed);
            s.with_content
                .fetch_add(u64::from(wrote), Ordering::Relaxed);
            s.syncs.fetch_add(syncs, Ordering::Relaxed);
            s.max_syncs.fetch_max(syncs, Ordering::Relaxed);
        }
        Ok(())
    }

    /// [`History::track`] under the state lock: returns what the record written (if any)
    /// still needs to be durable, and whether new content went into the store.
    fn track_locked(
        &self,
        rel: &str,
        caller: Option<&Caller>,
        fill: bool,
    ) -> io::Result<(LayerSync, bool)> {
        // Who the caller is, found (it reads /proc) only when a record needs it and only
        // with the state unlocked.
        let mut actor: Option<Actor> = None;
        let mut st = self.lock();
        loop {
            if st.busy.contains(rel) {
                st = self.busy_cond.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let need = match st.paths.get(rel) {
                None if fill => Need::Nothing,
                None => Need::Capture,
                Some(h) if h.latest_is_pending() => Need::Capture,
                Some(_) if fill => Need::Nothing,
                Some(h) if h.dirty => Need::Nothing,
                Some(_) => Need::MarkDirty,
            };
            match need {
                Need::Nothing => {
                    // Already changed in this message; a process or session not yet recorded
                    // for it gets a record of its own (the content is stored already).
                    let Some(c) = caller.filter(|_| !fill) else {
                        return Ok((LayerSync::Nothing, false));
                    };
                    let known = actor
                        .clone()
                        .or_else(|| super::process::cached_actor(c.pid, c.uid));
                    let Some(a) = known else {
                        drop(st);
                        actor = Some(self.actor(c));
                        st = self.lock();
                        continue;
                    };
                    if !st.note_actor(rel, actor_key(&a)) {
                        return Ok((LayerSync::Nothing, false));
                    }
                    let h = st.paths.get(rel).ok_or_else(|| errno(libc::EIO))?;
                    let n = h.versions.len() as u32;
                    let v = h.versions[n as usize - 1].clone();
                    debug!("layer 1: {rel} also changed by pid {}", a.pid);
                    return self
                        .emit_layer1(&mut st, rel, n, &v, Some(a), false, false)
                        .map(|s| (s, false));
                }
                Need::MarkDirty => {
                    if let (Some(c), None) = (caller, &actor) {
                        drop(st);
                        actor = Some(self.actor(c));
                        st = self.lock();
                        continue;
                    }
                    st.mark_dirty(rel);
                    let h = st.paths.get(rel).ok_or_else(|| errno(libc::EIO))?;
                    let n = h.versions.len() as u32;
                    let v = h.versions[n as usize - 1].clone();
                    let actor = actor.clone();
                    if let Some(a) = &actor {
                        st.note_actor(rel, actor_key(a));
                    }
                    debug!("layer 1: {rel} changes again (v{n} already stored)");
                    return self
                        .emit_layer1(&mut st, rel, n, &v, actor, false, false)
                        .map(|s| (s, false));
                }
                Need::Capture => {
                    st.busy.insert(rel.to_string());
                    drop(st);
                    if let (Some(c), None) = (caller, &actor) {
                        actor = Some(self.actor(c));
                    }
                    let captured = self.capture(rel);
                    st = self.lock();
                    st.busy.remove(rel);
                    self.busy_cond.notify_all();
                    let (state, fresh_content) = captured?;
                    let time = SystemTime::now();
                    let new_path = !st.paths.contains_key(rel);
                    let epoch = st.checkpoints.len();
                    let h = st.paths.entry(rel.to_string()).or_default();
                    if new_path {
                        h.first_epoch = epoch;
                    }
                    let version = if h.latest_is_pending() {
                        let last = h.versions.len() - 1;
                        h.versions[last].state = state;
                        h.versions[last].time = time;
                        h.versions.len()
                    } else {
                        h.versions.push(Version {
                            since: None,
                            state,
                            time,
                        });
                        h.versions.len()
                    };
                    let v = h.versions[version - 1].clone();
                    if !fill {
                        st.mark_dirty(rel);
                    }
                    if new_path {
                        st.track_child(rel);
                    }
                    let actor = actor.clone();
                    if let Some(a) = &actor {
                        st.note_actor(rel, actor_key(a));
                    }
                    debug!("layer 1: backed up {rel} as v{version}");
                    return self
                        .emit_layer1(&mut st, rel, version as u32, &v, actor, fill, fresh_content)
                        .map(|s| (s, fresh_content));
                }
            }
        }
    }

    /// `session ID PID` written to ctl: PID (an agent process, e.g. from its prompt hook)
    /// becomes the root of session ID; its tree's changes are attributed to the session.
    /// ESRCH: no such process; EPERM: another user's process (the line was parsed by
    /// [`crate::ids::take_ctl_lines`]).
    pub fn register_session(&self, caller: &Caller, id: &str, pid: u32) -> io::Result<()> {
        match super::process::register_session(id, pid, caller.uid) {
            Ok(()) => {
                info!("session {id}: process {pid} and its descendants (registered by {caller})");
                Ok(())
            }
            Err(super::process::RegisterError::NoProcess) => Err(errno(libc::ESRCH)),
            Err(super::process::RegisterError::NotYours) => {
                warn!("ctl: {caller} may not register another user's process {pid}");
                Err(errno(libc::EPERM))
            }
        }
    }

    /// The agent session process `pid` (a thread id is fine) belongs to, if any: the
    /// session a checkpoint it asks for is recorded under. Reads /proc: call it with the
    /// state unlocked.
    pub fn session_of(&self, pid: u32) -> Option<String> {
        super::process::of_thread(pid).session
    }

    /// Who `c` is. Reads /proc: call it with the state unlocked.
    fn actor(&self, c: &Caller) -> Actor {
        super::process::actor(c.pid, c.uid)
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_layer1(
        &self,
        st: &mut State,
        rel: &str,
        version: u32,
        v: &Version,
        actor: Option<Actor>,
        fill: bool,
        fresh_content: bool,
    ) -> io::Result<LayerSync> {
        let mut backups = BTreeMap::new();
        backups.insert(rel.to_string(), backup_of(version, v, actor, fill));
        let message = st.current_message();
        let record = Record::snapshot_update(
            message.as_deref(),
            st.next_seq,
            rfc3339(SystemTime::now()),
            backups,
        );
        st.next_seq += 1;
        // The journal is what makes the record survive a daemon crash; if it cannot be
        // written, the change must not go ahead. Syncing is left to the caller, which does it
        // with the state unlocked.
        let rec = self.recorder()?;
        rec.journal.append(&record, false)?;
        rec.transcript.append(record);
        Ok(self.sync_needed(fresh_content))
    }

    /// What a record written now still needs before the change may proceed.
    fn sync_needed(&self, fresh_content: bool) -> LayerSync {
        match self.durability {
            Durability::Strict if fresh_content => LayerSync::Filesystem,
            Durability::Strict => LayerSync::Journal,
            Durability::Batched | Durability::Process => LayerSync::None,
        }
    }

    /// The batched mode's syncer: every [`durability::SYNC_INTERVAL`], makes the objects and
    /// journal records written since its last round durable (objects first, then the
    /// directory, then the journal, so a durable record names a durable object). Runs
    /// until `shutdown`; the daemon unparks it then, and the final sync is `shutdown`'s.
    pub fn run_syncer(self: &Arc<Self>) {
        while !self.stopping.load(Ordering::Relaxed) {
            std::thread::park_timeout(durability::SYNC_INTERVAL);
            let round = (|| {
                self.store.sync_batch()?;
                if let Some(rec) = &self.recorder {
                    rec.journal.sync_if_needed()?;
                }
                io::Result::Ok(())
            })();
            match round {
                Ok(()) => {
                    if self.sync_failing.swap(false, Ordering::Relaxed) {
                        info!("syncer: backups are reaching the disk again");
                    }
                }
                // Once per run of failures: the next rounds retry the same objects.
                Err(e) if !self.sync_failing.swap(true, Ordering::Relaxed) => {
                    warn!(
                        "syncer: cannot make recent backups durable: {e}; they survive a crash \
                         of the daemon but not a power loss until this recovers (retrying)"
                    );
                }
                Err(_) => {}
            }
        }
    }

    /// One line on what Layer 1 cost on the syscall path, for the log at unmount.
    pub fn layer1_stats(&self) -> String {
        let s = &self.layer1_stats;
        let records = s.records.load(Ordering::Relaxed);
        let syncs = s.syncs.load(Ordering::Relaxed);
        format!(
            "layer 1 ({} durability): {records} backups ({} with new content), {syncs} syncs \
             on the syscall path, at most {} per backup",
            self.durability.name(),
            s.with_content.load(Ordering::Relaxed),
            s.max_syncs.load(Ordering::Relaxed)
        )
    }

    /// Opens `rel` beneath SRC without following any symlink (not even in the middle).
    /// Opens `rel` beneath SRC without following any symlink (not even in the middle).
    pub(crate) fn open_beneath(&self, rel: &str) -> io::Result<OwnedFd> {
        sys::open_beneath(self.source_fd.as_fd(), rel, libc::O_PATH, 0)
    }

    /// `open_beneath`, with "nothing there" as `None`: ENOENT, and also ENOTDIR (a parent is
    /// now a file) and ELOOP (a parent is a symlink), since then no such path is in the tree.
    pub(crate) fn open_existing(&self, rel: &str) -> io::Result<Option<OwnedFd>> {
        match self.open_beneath(rel) {
            Ok(fd) => Ok(Some(fd)),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Type, mode, owner, size and mtime of `rel` in SRC now, `None` if absent.
    pub(crate) fn current_meta(&self, rel: &str) -> io::Result<Option<EntryMeta>> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok(None);
        };
        Ok(meta_of(&sys::fstat(fd.as_fd())?))
    }

    /// The current state of `rel` in SRC, content copied into the store. The bool says
    /// whether the store was written (so the record must be synced with it).
    pub(crate) fn capture(&self, rel: &str) -> io::Result<(VersionState, bool)> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok((VersionState::Absent, false));
        };
        let st = sys::fstat(fd.as_fd())?;
        let Some(mut meta) = meta_of(&st) else {
            return Ok((VersionState::Absent, false));
        };
        let object = match meta.kind {
            EntryKind::File => {
                let file = File::from(sys::reopen_for_reading(fd.as_raw_fd(), 0)?);
                let obj = self.store.put_file(&file)?;
                meta.size = obj.size;
                Some(obj.name)
            }
            EntryKind::Symlink => {
                let target = sys::readlinkat(fd.as_fd(), sys::EMPTY)?;
                let obj = self.store.put_bytes(&target)?;
                Some(obj.name)
            }
            _ => None,
        };
        let wrote = object.is_some();
        Ok((VersionState::Present { meta, object }, wrote))
    }

    /// Layer 2, for [`super::Quiesced::make_checkpoint`] (every mutation excluded).
    pub(super) fn record_checkpoint(
        &self,
        id: &str,
        session: Option<String>,
        open_for_write: &[Vec<u8>],
        pre_copies: super::open_files::PreCopies,
    ) -> io::Result<()> {
        let t0 = std::time::Instant::now();
        let open: HashSet<&str> = open_for_write.iter().filter_map(|p| rel_key(p)).collect();
        let (k, dirty) = {
            let st = self.lock();
            if st.checkpoint_ids.contains_key(id) {
                return Err(errno(libc::EEXIST));
            }
            let dirty: Vec<String> = st.dirty_paths.iter().cloned().collect();
            (st.checkpoints.len(), dirty)
        };
        let now = SystemTime::now();
        // New versions, computed without `state` (copies of open files take time, and views
        // and status need not wait for them) and before touching it, so that a failed copy
        // (ENOSPC) leaves no half-made checkpoint behind. The caller's epoch lock keeps the
        // dirty set as it is: Layer 1 is excluded, and the copier and views only fill
        // pending versions, which no dirty path has.
        let (open_dirty, closed_dirty): (Vec<String>, Vec<String>) =
            dirty.into_iter().partition(|p| open.contains(p.as_str()));
        let mut new_versions: Vec<(String, VersionState, bool)> =
            Vec::with_capacity(open_dirty.len() + closed_dirty.len());
        for (path, state) in self.capture_open_files(&open_dirty, pre_copies)? {
            new_versions.push((path, state, true));
        }
        for path in closed_dirty {
            let state = self.capture_cheap(&path)?;
            new_versions.push((path, state, false));
        }
        let mut st = self.lock();
        // Files open for writing that were not dirty cannot exist (the open marked them),
        // except across a remount; treat them the same.
        st.checkpoints.push(Checkpoint {
            id: id.to_string(),
            time: now,
            session: session.clone(),
        });
        st.checkpoint_ids.insert(id.to_string(), k);
        st.clear_dirty();
        let mut delta = BTreeMap::new();
        let mut continuing = Vec::new();
        let mut to_fill = Vec::new();
        for (path, state, still_open) in new_versions {
            let h = st.paths.get_mut(&path).ok_or_else(|| errno(libc::EIO))?;
            let pending = state == VersionState::Pending;
            h.versions.push(Version {
                since: Some(k),
                state,
                time: now,
            });
            let n = h.versions.len() as u32;
            delta.insert(
                path.clone(),
                backup_of(n, &h.versions[n as usize - 1], None, false),
            );
            if pending {
                to_fill.push((path.clone(), n));
            }
            if still_open {
                continuing.push((path, n));
            }
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        // The record lists only the new versions: every other path keeps its version at the
        // previous checkpoint, which replay already has. So a checkpoint costs O(changed),
        // whatever the size of the tree. Journal first (it is what survives a crash), before
        // the marker returns.
        let mut record = Record::checkpoint_delta(id, seq, rfc3339(now), delta);
        record.session = session;
        let rec = self.recorder()?;
        rec.journal.append(&record, false)?;
        rec.transcript.append(record);
        let copied_open_files = !continuing.is_empty();
        for (path, n) in continuing {
            st.mark_dirty(&path);
            let v = st.paths[&path].versions[n as usize - 1].clone();
            self.emit_layer1(&mut st, &path, n, &v, None, false, false)?;
        }
        drop(st);
        // Strict: the checkpoint (and the copies of open files it made) are on disk before
        // the marker returns; one sync for all of it.
        match self.sync_needed(copied_open_files) {
            LayerSync::Journal => rec.journal.sync()?,
            LayerSync::Filesystem => self.store.sync_filesystem()?,
            LayerSync::Nothing | LayerSync::None => {}
        }
        debug!("checkpoint {id}: recorded in {:?}", t0.elapsed());
        if !to_fill.is_empty() {
            let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            q.extend(to_fill);
            self.pending_cond.notify_all();
        }
        Ok(())
    }

    /// The state of `path` at a checkpoint, without copying file data: regular files become
    /// pending (filled later), everything else is recorded at once.
    fn capture_cheap(&self, rel: &str) -> io::Result<VersionState> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok(VersionState::Absent);
        };
        let st = sys::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG {
            return Ok(VersionState::Pending);
        }
        drop(fd);
        Ok(self.capture(rel)?.0)
    }

    /// Fills a pending version now if `rel` has one (used before reading it in a view).
    pub(crate) fn fill_if_pending(&self, rel: &str) -> io::Result<()> {
        self.track(rel, None, true)
    }

    /// The background copier: fills pending versions until `shutdown`.
    pub fn run_copier(self: &Arc<Self>) {
        loop {
            let next = {
                let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(item) = q.pop_front() {
                        self.copying.fetch_add(1, Ordering::SeqCst);
                        break Some(item);
                    }
                    if self.stopping.load(Ordering::Relaxed) {
                        break None;
                    }
                    q = self.pending_cond.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some((path, _version)) = next else {
                return;
            };
            if let Err(e) = self.track(&path, None, true) {
                // The gate will copy it before the path changes, so nothing is lost; the
                // view falls back to the same copy-on-read.
                warn!(
                    "background copy of {path} failed: {e}; it will be copied on its next change"
                );
            }
            // Recorded (journal and transcript queue) or failed: no longer in flight.
            self.copying.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Stops the copier after the queue is drained, then flushes journal and transcript.
    pub fn shutdown(&self) -> io::Result<()> {
        self.stopping.store(true, Ordering::Relaxed);
        self.pending_cond.notify_all();
        if let Some(rec) = &self.recorder {
            // Whatever the mode, a clean unmount leaves every backup on disk: objects and
            // directory (one syncfs), then the journal and the transcript.
            self.store.sync_filesystem()?;
            rec.journal.sync()?;
            rec.transcript.flush()?;
        }
        Ok(())
    }

    /// Number of pending versions still to copy or being copied by the copier (for status
    /// and tests): 0 means every background copy so far is recorded.
    pub fn pending_copies(&self) -> usize {
        let q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        q.len() + self.copying.load(Ordering::SeqCst)
    }
}
