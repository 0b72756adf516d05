//! The store's write-ahead journal, `STATE/backups/journal.jsonl`.
//!
//! The transcript writer is asynchronous: a Layer 1 backup whose record is still queued when
//! the daemon is `kill -9`ed would be lost from the transcript even though its object is in
//! the store. So the store also appends each such record here, synchronously, before the
//! operation that needed the backup proceeds. On remount, records here with a `seq` greater
//! than the transcript's last are applied and re-appended to the transcript; once the
//! transcript is durable through a `seq` covering the whole journal (the writer's
//! `on_durable` callback), the journal is truncated to empty.
//!
//! Same line format and reader as the transcript (one [`Record`] per line, torn last line
//! dropped, strictly increasing `seq`), so callers must append in `seq` order here too:
//! allocate the `seq`, append to the journal and to the transcript writer under one lock.
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::fsutil;
use super::record::Record;
use super::replay::{self, ReplayError};

pub use super::replay::JOURNAL_FILE_NAME;

/// An open journal. `append` and `truncate_if_covered` serialize on one mutex, so a
/// truncation can never drop a record appended concurrently but not yet covered.
pub struct Journal {
    path: PathBuf,
    /// `O_APPEND`; written only under `state`'s lock, synced outside it.
    file: File,
    /// Lock order: a leaf (taken under `History::state`, never the other way); held across
    /// an append's write(2) to the page cache, never across a sync.
    state: Mutex<State>,
    /// An append since the last sync was not synced (for [`Journal::sync_if_needed`]).
    unsynced: AtomicBool,
}

struct State {
    /// File length through the last complete appended line.
    len: u64,
    /// Highest `seq` in the file (`None` when it holds no records).
    max_seq: Option<u64>,
    /// A failed append may have left a partial line past `len` that could not be cut yet.
    dirty_tail: bool,
}

impl Journal {
    /// Opens (creating) the journal at `path` for append.
    ///
    /// Reads the existing content first, to learn its highest `seq` (so `truncate_if_covered`
    /// is right straight after a remount) and to repair its tail: a torn last line is cut off
    /// and an unterminated valid one gets its `\n`, so appends start on a fresh line. A torn
    /// line is an append cut short by a crash; it is unreadable either way, and leaving it
    /// would glue it to the next record and corrupt that. Call [`Journal::read_after`] before
    /// this if you want to know whether a line was dropped (it is also logged). A corrupt
    /// journal fails with `InvalidData`.
    pub fn open(path: &Path) -> io::Result<Journal> {
        let file = fsutil::open_append(path).map_err(|e| fsutil::with_path(path, "opening", e))?;
        let mut max_seq = None;
        let torn = replay::scan_transcript(path, |r| max_seq = max_seq.max(Some(r.seq)))?;
        replay::repair_tail(path, torn.is_some())?;
        let len = file.metadata()?.len();
        Ok(Journal {
            path: path.to_owned(),
            file,
            state: Mutex::new(State {
                len,
                max_seq,
                dirty_tail: false,
            }),
            unsynced: AtomicBool::new(false),
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record` synchronously as one `write(2)` of the whole line on an `O_APPEND`
    /// descriptor, so a crash leaves at most a torn last line. When `sync` is true, also
    /// fdatasyncs before returning (outside the lock, so concurrent appenders are not
    /// serialized behind the disk).
    ///
    /// On error the record is not in the journal: a partial write is cut back (if even that
    /// fails, it is cut before the next append). A short write is completed with further
    /// writes, to either finish the line or surface the real errno (usually ENOSPC). An
    /// fdatasync error means the line is in the file but may not survive a crash; treat the
    /// record as not durable. Returns the bytes the line took.
    pub fn append(&self, record: &Record, sync: bool) -> io::Result<u64> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        let mut st = self.lock();
        let written = (|| {
            if st.dirty_tail {
                self.file.set_len(st.len)?;
                st.dirty_tail = false;
            }
            write_line(&self.file, &line)
        })();
        if let Err(e) = written {
            if self.file.set_len(st.len).is_err() {
                st.dirty_tail = true;
            }
            return Err(fsutil::with_path(&self.path, "appending to", e));
        }
        st.len += line.len() as u64;
        st.max_seq = st.max_seq.max(Some(record.seq));
        drop(st);
        if sync {
            self.sync()?;
        } else {
            self.unsynced.store(true, Ordering::Release);
        }
        Ok(line.len() as u64)
    }

    /// fdatasyncs the journal (counted, see [`crate::state::durability`]).
    pub fn sync(&self) -> io::Result<()> {
        // Cleared first: an append racing this sync sets it again and is synced next time.
        self.unsynced.store(false, Ordering::Release);
        crate::state::durability::sync_file(&self.file, true).map_err(|e| {
            self.unsynced.store(true, Ordering::Release);
            fsutil::with_path(&self.path, "syncing", e)
        })
    }

    /// fdatasyncs the journal if an append since the last sync was not synced. Returns
    /// whether it synced.
    pub fn sync_if_needed(&self) -> io::Result<bool> {
        if !self.unsynced.load(Ordering::Acquire) {
            return Ok(false);
        }
        self.sync().map(|()| true)
    }

    /// Truncates the journal to empty if every record in it has `seq <= durable_seq`, i.e.
    /// the transcript is durable through all of them. Returns whether it truncated (`false`
    /// for an already empty journal).
    ///
    /// Checks the highest `seq` in the file rather than the last appended one, so an
    /// out-of-order append cannot get a record dropped early. The truncation is not synced: if
    /// a crash undoes it, the records reappear but are all covered by the transcript and
    /// skipped by `read_after`. Lines without a `seq` (future record kinds) are dropped with
    /// the rest.
    pub fn truncate_if_covered(&self, durable_seq: u64) -> io::Result<bool> {
        let mut st = self.lock();
        if st.len == 0 && !st.dirty_tail {
            return Ok(false);
        }
        if st.max_seq.is_some_and(|max| max > durable_seq) {
            return Ok(false);
        }
        self.file
            .set_len(0)
            .map_err(|e| fsutil::with_path(&self.path, "truncating", e))?;
        *st = State {
            len: 0,
            max_seq: None,
            dirty_tail: false,
        };
        Ok(true)
    }

    /// The records in the journal at `path` with `seq > after_seq`, in file order. A missing
    /// file has none; a torn last line is dropped (and logged), as for the transcript.
    pub fn read_after(path: &Path, after_seq: u64) -> Result<Vec<Record>, ReplayError> {
        let mut records = Vec::new();
        replay::scan_transcript(path, |r| {
            if r.seq > after_seq {
                records.push(r);
            }
        })?;
        Ok(records)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a few integers updated after each successful syscall; a panic while
        // holding the lock leaves it describing the file correctly.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One `write(2)` of `line`, retried on EINTR; a short write is completed by further writes.
fn write_line(mut file: &File, line: &[u8]) -> io::Result<()> {
    loop {
        match file.write(line) {
            Ok(n) if n == line.len() => return Ok(()),
            Ok(n) => return file.write_all(&line[n..]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests write journal files directly, as a crash or an attacker would leave them"
)]
mod tests {
    use std::fs;
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::transcript::testutil::{backup, checkpoint, write_lines};

    fn seqs(records: &[Record]) -> Vec<u64> {
        records.iter().map(|r| r.seq).collect()
    }

    fn journal_path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join(JOURNAL_FILE_NAME)
    }

    #[test]
    fn append_and_read_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        assert!(Journal::read_after(&path, 0).unwrap().is_empty());
        let journal = Journal::open(&path).unwrap();
        let records = vec![backup(1, None), checkpoint("m1", 2), backup(3, Some("m1"))];
        for (i, r) in records.iter().enumerate() {
            journal.append(r, i % 2 == 0).unwrap();
        }
        journal.sync().unwrap();
        assert_eq!(Journal::read_after(&path, 0).unwrap(), records);
        assert_eq!(seqs(&Journal::read_after(&path, 2).unwrap()), [3]);
        assert!(Journal::read_after(&path, 3).unwrap().is_empty());
    }

    #[test]
    fn truncate_if_covered_both_ways() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        let journal = Journal::open(&path).unwrap();
        assert!(
            !journal.truncate_if_covered(100).unwrap(),
            "empty: nothing to do"
        );
        for seq in 1..=3 {
            journal.append(&backup(seq, None), false).unwrap();
        }
        assert!(!journal.truncate_if_covered(2).unwrap());
        assert_eq!(seqs(&Journal::read_after(&path, 0).unwrap()), [1, 2, 3]);
        assert!(journal.truncate_if_covered(3).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        // Appends after a truncation start at offset 0 again.
        journal.append(&backup(4, None), true).unwrap();
        assert_eq!(seqs(&Journal::read_after(&path, 0).unwrap()), [4]);
        assert!(!journal.truncate_if_covered(3).unwrap());
        assert!(journal.truncate_if_covered(10).unwrap());
        assert!(!journal.truncate_if_covered(10).unwrap());
    }

    #[test]
    fn reopen_learns_the_highest_seq() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        let journal = Journal::open(&path).unwrap();
        for seq in 1..=3 {
            journal.append(&backup(seq, None), false).unwrap();
        }
        drop(journal);
        let journal = Journal::open(&path).unwrap();
        assert!(!journal.truncate_if_covered(2).unwrap());
        journal.append(&backup(4, None), false).unwrap();
        assert_eq!(seqs(&Journal::read_after(&path, 0).unwrap()), [1, 2, 3, 4]);
        assert!(journal.truncate_if_covered(4).unwrap());
    }

    #[test]
    fn torn_tail_is_dropped_and_cut_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        write_lines(&path, &[backup(1, None), backup(2, None)], true);
        let line = serde_json::to_string(&backup(3, None)).unwrap();
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&line.as_bytes()[..line.len() - 3]).unwrap();
        drop(f);

        assert_eq!(seqs(&Journal::read_after(&path, 0).unwrap()), [1, 2]);
        let journal = Journal::open(&path).unwrap();
        assert!(fs::read(&path).unwrap().ends_with(b"}\n"));
        journal.append(&backup(3, None), true).unwrap();
        assert_eq!(seqs(&Journal::read_after(&path, 1).unwrap()), [2, 3]);
    }

    #[test]
    fn corrupt_journal_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        let good = serde_json::to_string(&backup(1, None)).unwrap();
        fs::write(&path, format!("garbage\n{good}\n")).unwrap();
        let err = Journal::open(&path).err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            err.to_string().starts_with("store journal "),
            "names the journal: {err}"
        );
        assert!(matches!(
            Journal::read_after(&path, 0),
            Err(ReplayError::Corrupt { line: 1, .. })
        ));
    }

    /// A truncation racing appends never loses a record it does not cover. Each round, one
    /// thread appends a run of records while another truncates once, as soon as the journal is
    /// covered by what it has seen appended; afterwards the journal must hold exactly the seqs
    /// after the truncation point.
    #[test]
    fn truncate_races_appends_safely() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_path(&dir);
        let journal = Journal::open(&path).unwrap();
        const ROUNDS: u64 = 300;
        const RUN: u64 = 20;
        let appended = AtomicU64::new(0);
        let mut truncations = 0;
        for round in 0..ROUNDS {
            let base = round * RUN;
            let truncated_at = std::thread::scope(|s| {
                s.spawn(|| {
                    for seq in base + 1..=base + RUN {
                        journal.append(&backup(seq, None), false).unwrap();
                        appended.store(seq, Ordering::SeqCst);
                    }
                });
                s.spawn(|| {
                    loop {
                        let d = appended.load(Ordering::SeqCst);
                        if d > base && journal.truncate_if_covered(d).unwrap() {
                            return Some(d);
                        }
                        if d == base + RUN {
                            return None;
                        }
                    }
                })
                .join()
                .unwrap()
            });
            let from = match truncated_at {
                Some(d) => {
                    truncations += 1;
                    d + 1
                }
                None => base + 1,
            };
            let left = seqs(&Journal::read_after(&path, 0).unwrap());
            assert_eq!(
                left,
                (from..=base + RUN).collect::<Vec<_>>(),
                "round {round}"
            );
            assert_eq!(
                journal.truncate_if_covered(base + RUN).unwrap(),
                !left.is_empty()
            );
        }
        assert!(truncations > 0, "the race was never exercised");
    }
}
