//! Layer 1 for a rename, format 4 (docs/design.md, "Renames in O(1)"): the two names pass
//! the gate as any change does, pending versions at or below them are filled (the copier
//! reads by name), then one intent record is written ahead of the syscall and one outcome
//! record after it. Nothing below the names is walked, copied or recorded.
use std::io;
use std::os::fd::AsFd;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use log::error;

use super::store::LinkedObject;
use super::track::LayerSync;
use super::{Caller, History, rel_key};
use crate::sys::{self, FsCredsGuard};
use crate::transcript::record::{Record, RenameIntent, rfc3339};

/// Whether this daemon records renames in the per-path form of formats 1-3 (a backup of
/// every path below), instead of format 4's two records. Only for the tests that compare
/// the two forms' answers (`CHECKPOINTFS_RENAMES_PER_PATH=1`): a state dir written so
/// replays as format 3 did.
pub(crate) fn renames_per_path_for_tests() -> bool {
    std::env::var_os("CHECKPOINTFS_RENAMES_PER_PATH").is_some_and(|v| v == "1")
}

/// A rename recorded ahead of its syscall: its outcome is recorded by [`RenameRecord::settle`]
/// (or, dropped unsettled, as failed). Holds the history's rename lock meanwhile, so that
/// renames are recorded in the order they happen.
pub struct RenameRecord<'h> {
    history: &'h History,
    intent_seq: u64,
    settled: bool,
    _serial: MutexGuard<'h, ()>,
}

impl RenameRecord<'_> {
    /// Records whether the rename happened.
    pub fn settle(mut self, done: bool) {
        // Test-only: the daemon dies after the syscall, before its outcome is recorded.
        super::gc::failpoint("rename-before-outcome");
        self.record(done);
    }

    fn record(&mut self, done: bool) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if let Err(e) = self.history.record_rename_outcome(self.intent_seq, done) {
            // The next replay decides it from SRC instead (as after a crash in between).
            error!(
                "recording the outcome of rename {} failed: {e}; the next mount decides it \
                 from the tree",
                self.intent_seq
            );
        }
    }
}

impl Drop for RenameRecord<'_> {
    fn drop(&mut self) {
        self.record(false);
    }
}

/// What a rename's Layer 1 leaves to its caller.
pub struct RenameBackup<'h> {
    /// The backup of the file the rename replaces, when it was linked into the store.
    pub replaced: Option<LinkedObject<'h>>,
    /// The format-4 record to settle after the syscall.
    pub record: Option<RenameRecord<'h>>,
}

impl History {
    /// Layer 1 for a rename in format 4 (see the module). `from_is_dir`, `to_is_dir`: the
    /// types each name will hold, for exclusion rules; `replaces`: as
    /// [`History::before_rename`].
    pub(super) fn before_rename_v4<'h>(
        &'h self,
        caller: &Caller,
        (from, to): (&[u8], &[u8]),
        (from_is_dir, to_is_dir): (Option<bool>, Option<bool>),
        exchange: bool,
        replaces: bool,
    ) -> io::Result<RenameBackup<'h>> {
        let (Some(from_s), Some(to_s)) = (rel_key(from), rel_key(to)) else {
            log::warn!("not tracking a rename involving a non-UTF-8 path");
            return Ok(RenameBackup {
                replaced: None,
                record: None,
            });
        };
        let recorded = |rel: &str, is_dir| {
            !self.is_excluded(rel, is_dir) || self.lock().renames.moved_content_to(rel)
        };
        if !recorded(from_s, from_is_dir) && !recorded(to_s, to_is_dir) {
            // Between untracked names: no lookup of a tracked name passes through them.
            return Ok(RenameBackup {
                replaced: None,
                record: None,
            });
        }
        let serial = self.rename_serial.lock().unwrap_or_else(|p| p.into_inner());
        self.before_change(caller, from, from_is_dir)?;
        let replaced = if replaces {
            self.before_removal(caller, to, to_is_dir)?
        } else {
            self.before_change(caller, to, to_is_dir)?;
            None
        };
        let _daemon = FsCredsGuard::as_daemon();
        // The copier reads a pending version's content by name: fill those that move.
        let pending = {
            let st = self.lock();
            let mut p = st.pending_at_or_below(from_s);
            p.extend(st.pending_at_or_below(to_s));
            p
        };
        for path in pending {
            self.track(&path, None, true)?;
        }
        let object = |rel: &str| -> io::Result<Option<(u64, u64)>> {
            Ok(match self.open_existing(rel)? {
                Some(fd) => {
                    let st = sys::fstat(fd.as_fd())?;
                    Some((st.st_dev as u64, st.st_ino as u64))
                }
                None => None,
            })
        };
        let intent = RenameIntent {
            from: from_s.to_string(),
            to: to_s.to_string(),
            exchange,
            from_object: object(from_s)?,
            to_object: object(to_s)?,
        };
        if !self.format4_written.load(Ordering::Acquire) {
            // Before the first rename record: a state dir holding one says format 4.
            crate::state::format::ensure(&self.state_dir, crate::state::format::CURRENT)?;
            self.format4_written.store(true, Ordering::Release);
        }
        let intent_seq = {
            let mut st = self.lock();
            let seq = st.next_seq;
            let message = st.current_message();
            let record =
                Record::rename_intent(message.as_deref(), seq, rfc3339(SystemTime::now()), intent);
            self.emit_record(&mut st, record)?;
            seq
        };
        if self.sync_needed(false) == LayerSync::Journal {
            self.recorder()?.journal.sync()?;
        }
        // Test-only: the daemon dies between the intent and the syscall.
        super::gc::failpoint("rename-after-intent");
        Ok(RenameBackup {
            replaced,
            record: Some(RenameRecord {
                history: self,
                intent_seq,
                settled: false,
                _serial: serial,
            }),
        })
    }

    /// The outcome record of the rename of intent `intent_seq` (one journal write, no sync
    /// of its own: replay decides a missing one from SRC).
    fn record_rename_outcome(&self, intent_seq: u64, done: bool) -> io::Result<()> {
        let mut st = self.lock();
        let message = st.current_message();
        let record = Record::rename_outcome(
            message.as_deref(),
            st.next_seq,
            rfc3339(SystemTime::now()),
            intent_seq,
            done,
        );
        self.emit_record(&mut st, record)
    }

    /// Writes `record` (whose seq is `st.next_seq`) to the journal and the transcript's
    /// queue, and applies it to the model.
    fn emit_record(&self, st: &mut super::State, record: Record) -> io::Result<()> {
        let rec = self.recorder()?;
        let written = rec.journal.append(&record, false)?;
        super::budget::charge(2 * written);
        st.next_seq += 1;
        super::model::apply_record(st, &record);
        rec.transcript.append(record);
        Ok(())
    }
}
