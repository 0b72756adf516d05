//! Layer 3's writer thread: the only code that appends to `STATE/transcript.jsonl`.
//!
//! FUSE request threads hand records to [`TranscriptWriter::append`], which only pushes onto an
//! unbounded crossbeam channel and so never waits for the disk. One thread drains the channel
//! and group-commits: it takes the first queued message, then everything else already queued
//! (up to [`MAX_BATCH_BYTES`] of serialized records), serializes the batch into one buffer,
//! writes it with one `write_all` on an `O_APPEND` descriptor and issues one `fdatasync`.
//!
//! Invariants:
//! - Every record is exactly one line: `serde_json` output (which never contains a raw `\n`)
//!   followed by `\n`. Only this thread writes, so lines never interleave.
//! - The file only ever grows by whole batches. If a write or `fdatasync` fails (ENOSPC,
//!   EIO, ...) the file is cut back to the end of the last committed batch and the batch stays
//!   queued; it is written again, together with later records, on the next attempt (the next
//!   batch or `flush`). Rewriting after a failed `fdatasync` is deliberate: Linux may drop the
//!   dirty pages and report success on a second `fdatasync`, so a retry must re-write the data.
//!   A torn line can therefore only come from a crash (or from power loss mid-batch).
//! - Records are written in the order they were appended. Replay requires strictly increasing
//!   `seq`, so callers must append in `seq` order: allocate the `seq` and call `append` under
//!   the same lock (cheap, as `append` never blocks). A record whose `seq` is not greater than
//!   the previous one is still written (dropping it could make a rewind silently wrong) but is
//!   logged as an error and reported by the next [`TranscriptWriter::flush`]; the transcript
//!   will then fail to replay with a `Corrupt` error naming that line.
//! - Errors never panic the thread: they are logged with `log::error!` and reported by the
//!   next `flush` (which also retries), and later records keep being tried.
//!
//! Startup sequence for a mount: [`read_transcript`](super::replay::read_transcript), then
//! [`truncate_torn_tail`](super::replay::truncate_torn_tail), then [`TranscriptWriter::start`]
//! (which refuses a file that does not end on a line boundary rather than glue new records to
//! a torn line).
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::PermissionsExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::fsutil;
use super::record::Record;

/// A batch stops draining the channel once this many serialized bytes are queued, bounding
/// both the buffer and how long the records at the front wait for their `fdatasync`.
pub const MAX_BATCH_BYTES: usize = 4 << 20;

/// How long the writer keeps gathering records into a batch after the first one arrives.
pub const GATHER_WINDOW: std::time::Duration = std::time::Duration::from_millis(20);

/// Called on the writer thread with the highest durable `seq`; see
/// [`TranscriptWriter::set_on_durable`].
pub type DurableCallback = Box<dyn Fn(u64) + Send>;

/// Called on the writer thread before records are written; see
/// [`TranscriptWriter::set_before_commit`].
pub type BeforeCommit = Box<dyn Fn() -> io::Result<()> + Send>;

type Reply = Sender<io::Result<u64>>;

enum Msg {
    Append(Record),
    Flush(Reply),
    OnDurable(DurableCallback),
    BeforeCommit(BeforeCommit),
    Rewrite(Vec<Record>, Reply),
}

/// Handle to the transcript's writer thread. See the module docs for the invariants.
pub struct TranscriptWriter {
    path: PathBuf,
    /// `None` once shut down.
    tx: Option<Sender<Msg>>,
    handle: Option<JoinHandle<()>>,
    #[cfg(test)]
    fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TranscriptWriter {
    /// Opens (creating) `path` for append and starts the writer thread.
    ///
    /// The file must be empty or end with `\n` (see the module docs for the startup sequence);
    /// otherwise this fails with `InvalidData`. The `seq` of the existing last line, if it has
    /// one, seeds both the value `flush` reports before anything new is written and the
    /// increasing-`seq` check, so a history system that restarted its counter is caught at the
    /// first append instead of at the next remount. The existing content is fdatasync'd first so
    /// that the seq reported as durable is.
    pub fn start(path: &Path) -> io::Result<TranscriptWriter> {
        let file = fsutil::open_append(path).map_err(|e| fsutil::with_path(path, "opening", e))?;
        let last_seq = match fsutil::last_complete_line(&file, path)? {
            Some(line) => serde_json::from_slice::<serde_json::Value>(&line)
                .ok()
                .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64)),
            None => None,
        };
        file.sync_data()
            .map_err(|e| fsutil::with_path(path, "syncing", e))?;
        let good_len = file.metadata()?.len();
        #[cfg(test)]
        let fail_writes = std::sync::Arc::<std::sync::atomic::AtomicBool>::default();
        let worker = Worker {
            path: path.to_owned(),
            file,
            good_len,
            dirty_tail: false,
            dir_unsynced: false,
            pending: Vec::new(),
            pending_max: None,
            accepted_seq: last_seq,
            durable_seq: last_seq.unwrap_or(0),
            last_error: None,
            sticky: None,
            on_durable: None,
            before_commit: None,
            #[cfg(test)]
            fail_writes: fail_writes.clone(),
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let handle = std::thread::Builder::new()
            .name("transcript-writer".to_owned())
            .spawn(move || worker.run(rx))?;
        Ok(TranscriptWriter {
            path: path.to_owned(),
            tx: Some(tx),
            handle: Some(handle),
            #[cfg(test)]
            fail_writes,
        })
    }

    /// The transcript's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queues `record`. Never blocks on I/O: FUSE request threads call this. Records are written
    /// in call order, which must be `seq` order (see the module docs). Durability comes later;
    /// callers that need it call [`flush`](Self::flush). If the writer thread is gone (only
    /// after a panic, which the thread avoids) the record is lost and an error is logged.
    pub fn append(&self, record: Record) {
        let seq = record.seq;
        let sent = match &self.tx {
            Some(tx) => tx.send(Msg::Append(record)).is_ok(),
            None => false,
        };
        if !sent {
            log::error!(
                "{}: transcript writer has stopped; record seq {seq} is lost",
                self.path.display()
            );
        }
    }

    /// Blocks until every record appended before this call is written and fdatasync'd, and
    /// returns the highest durable `seq` (which may include records appended meanwhile by
    /// other threads; 0 if nothing with a `seq` was ever written).
    ///
    /// Errs if those records could not be made durable even after a retry (they stay queued
    /// and are retried later), or to report, once, an error since the previous `flush` that
    /// cannot be retried: a record that failed to serialize, or a `seq` that went backwards.
    pub fn flush(&self) -> io::Result<u64> {
        self.request(Msg::Flush)
    }

    /// Registers `f`, replacing any previous callback; it runs on the writer thread after each
    /// successful `fdatasync` (and after [`rewrite`](Self::rewrite)) with the highest durable
    /// `seq`. The history system uses it to truncate its journal.
    ///
    /// The registration travels through the channel, so it applies to every batch committed
    /// after the records appended before this call: set it before records flow or earlier
    /// batches go unreported. `f` must be quick and must not call `flush`, `rewrite` or
    /// `shutdown` (they wait for this very thread); `append` is fine. A panic in `f` is caught
    /// and logged.
    pub fn set_on_durable(&self, f: DurableCallback) {
        if let Some(tx) = &self.tx
            && tx.send(Msg::OnDurable(f)).is_err()
        {
            log::error!(
                "{}: transcript writer has stopped; on_durable callback not set",
                self.path.display()
            );
        }
    }

    /// Registers `f`, replacing any previous one; it runs on the writer thread before each
    /// batch (and each [`rewrite`](Self::rewrite)) is written. If it fails, the batch is not
    /// written and is retried later, as after a failed write. The history system uses it to
    /// make the store's objects durable before any record naming them can be, so a durable
    /// transcript never points at an object a power loss took. Same channel-order rules and
    /// restrictions on `f` as [`set_on_durable`](Self::set_on_durable).
    pub fn set_before_commit(&self, f: BeforeCommit) {
        if let Some(tx) = &self.tx
            && tx.send(Msg::BeforeCommit(f)).is_err()
        {
            log::error!(
                "{}: transcript writer has stopped; before_commit callback not set",
                self.path.display()
            );
        }
    }

    /// Atomically replaces the transcript with `records` (gc compaction), on the writer
    /// thread, via [`rewrite_atomically`], then keeps appending to the new file. Returns the
    /// highest durable `seq`.
    ///
    /// The replacement happens in channel order: `records` must stand for everything appended
    /// before this call (records still queued are superseded by it), and later appends go to
    /// the new file. So compute `records` and call this under the lock that orders `append`s.
    /// `records` must have strictly increasing `seq`. On failure the old file is untouched and
    /// queued records are still written to it.
    ///
    /// Use this rather than calling [`rewrite_atomically`] on a live transcript: the writer's
    /// descriptor would keep appending to the replaced, unlinked file.
    pub fn rewrite(&self, records: Vec<Record>) -> io::Result<u64> {
        self.request(|reply| Msg::Rewrite(records, reply))
    }

    /// Flushes and joins the thread, reporting errors (the daemon relies on Drop, which
    /// does the same and can only log them).
    #[cfg(test)]
    pub fn shutdown(mut self) -> io::Result<()> {
        self.finish()
    }

    fn request(&self, msg: impl FnOnce(Reply) -> Msg) -> io::Result<u64> {
        let stopped = || {
            io::Error::other(format!(
                "{}: transcript writer has stopped",
                self.path.display()
            ))
        };
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        tx.send(msg(reply_tx)).map_err(|_| stopped())?;
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
        reply_rx.recv().map_err(|_| stopped())?
    }

    fn finish(&mut self) -> io::Result<()> {
        let flushed = match self.tx {
            Some(_) => self.flush().map(drop),
            None => Ok(()),
        };
        // Dropping the only sender ends the thread's receive loop.
        self.tx = None;
        let joined = match self.handle.take() {
            Some(h) => h.join().map_err(|_| {
                io::Error::other(format!(
                    "{}: transcript writer thread panicked",
                    self.path.display()
                ))
            }),
            None => Ok(()),
        };
        flushed.and(joined)
    }
}

impl Drop for TranscriptWriter {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::error!("shutting down the transcript writer: {e}");
        }
    }
}

/// The writer thread's state.
struct Worker {
    path: PathBuf,
    /// `O_APPEND`, so every write lands at the end whatever the file offset.
    file: File,
    /// File length through the last committed batch.
    good_len: u64,
    /// A failed attempt may have left bytes past `good_len`; cut them before writing again.
    dirty_tail: bool,
    /// A rewrite's rename is not yet known to be durable; fsync the directory again.
    dir_unsynced: bool,
    /// Serialized records not yet durable, in append order.
    pending: Vec<u8>,
    pending_max: Option<u64>,
    /// Highest `seq` accepted so far (written or pending), for the increasing-seq check.
    accepted_seq: Option<u64>,
    durable_seq: u64,
    /// Why the current `pending` could not be committed; `None` while things work.
    last_error: Option<io::Error>,
    /// A non-retryable error for the next `flush` to report.
    sticky: Option<io::Error>,
    on_durable: Option<DurableCallback>,
    before_commit: Option<BeforeCommit>,
    #[cfg(test)]
    fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            let mut waiters = Vec::new();
            self.handle(first, &mut waiters);
            // Gather what arrives in the next moments into the same batch: a burst of small
            // changes (an untar, a checkout) then costs one fdatasync, not one per record.
            // Nobody waits on this: Layer 1 durability comes from the store journal, and a
            // flush request ends the gathering at once.
            let deadline = std::time::Instant::now() + GATHER_WINDOW;
            loop {
                while self.pending.len() < MAX_BATCH_BYTES {
                    match rx.try_recv() {
                        Ok(msg) => self.handle(msg, &mut waiters),
                        Err(_) => break,
                    }
                }
                if self.pending.len() >= MAX_BATCH_BYTES || !waiters.is_empty() {
                    break;
                }
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                // Parked, not blocked on the channel: an append does not wake this thread
                // (one wake-up per batch, not per record, on a machine whose cores the FUSE
                // threads need); `request` unparks it, so a flush ends the gathering at once.
                std::thread::park_timeout(left);
            }
            self.commit();
            if !waiters.is_empty() {
                // Every waiter's records were queued before its Flush, so they are in this
                // batch or an earlier one.
                let result = self.flush_result();
                for w in waiters {
                    let _ = w.send(match &result {
                        Ok(seq) => Ok(*seq),
                        Err(e) => Err(crate::sys::clone_error(e)),
                    });
                }
            }
        }
        // The handle is gone (it flushed first, so this is normally a no-op).
        self.commit();
        if !self.pending.is_empty() {
            log::error!(
                "{}: transcript writer stopping with {} bytes of records unwritten",
                self.path.display(),
                self.pending.len()
            );
        }
    }

    fn handle(&mut self, msg: Msg, waiters: &mut Vec<Reply>) {
        match msg {
            Msg::Append(record) => self.accept(&record),
            Msg::Flush(reply) => waiters.push(reply),
            Msg::OnDurable(f) => self.on_durable = Some(f),
            Msg::BeforeCommit(f) => self.before_commit = Some(f),
            Msg::Rewrite(records, reply) => {
                let _ = reply.send(self.rewrite(&records));
            }
        }
    }

    fn accept(&mut self, record: &Record) {
        if let Some(prev) = self.accepted_seq
            && record.seq <= prev
        {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: record seq {} appended after seq {prev}; the transcript will not \
                     replay until that line is repaired",
                    self.path.display(),
                    record.seq
                ),
            );
            log::error!("{e}");
            self.sticky.get_or_insert(e);
        }
        let mark = self.pending.len();
        match serde_json::to_writer(&mut self.pending, record) {
            Ok(()) => {
                self.pending.push(b'\n');
                self.pending_max = self.pending_max.max(Some(record.seq));
                self.accepted_seq = self.accepted_seq.max(Some(record.seq));
            }
            Err(e) => {
                self.pending.truncate(mark);
                let e = io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{}: record seq {} could not be serialized and is lost: {e}",
                        self.path.display(),
                        record.seq
                    ),
                );
                log::error!("{e}");
                self.sticky.get_or_insert(e);
            }
        }
    }

    /// Writes and fdatasyncs `pending`, if any. On failure, keeps it for the next attempt.
    fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        match self.try_commit() {
            Ok(()) => {
                self.good_len += self.pending.len() as u64;
                self.pending.clear();
                if let Some(seq) = self.pending_max.take() {
                    self.durable_seq = self.durable_seq.max(seq);
                }
                if self.last_error.take().is_some() {
                    log::warn!(
                        "{}: transcript writes recovered; durable through seq {}",
                        self.path.display(),
                        self.durable_seq
                    );
                }
                self.notify_durable();
            }
            Err(e) => {
                let e = fsutil::with_path(&self.path, "appending to", e);
                // Log the first failure of a run, not every retry.
                if self.last_error.is_none() {
                    log::error!("{e}; {} bytes kept for retry", self.pending.len());
                } else {
                    log::debug!("{e} (retry)");
                }
                self.last_error = Some(e);
            }
        }
    }

    fn try_commit(&mut self) -> io::Result<()> {
        if self.dirty_tail {
            self.file.set_len(self.good_len)?;
            self.dirty_tail = false;
        }
        if self.dir_unsynced {
            fsutil::sync_parent_dir(&self.path)?;
            self.dir_unsynced = false;
        }
        self.run_before_commit()?;
        // Until the fdatasync succeeds, what is past good_len cannot be trusted.
        self.dirty_tail = true;
        #[cfg(test)]
        if self.fail_writes.load(std::sync::atomic::Ordering::SeqCst) {
            // Simulate ENOSPC after half the batch reached the file.
            self.file
                .write_all(&self.pending[..self.pending.len() / 2])?;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.file.write_all(&self.pending)?;
        self.file.sync_data()?;
        self.dirty_tail = false;
        Ok(())
    }

    fn flush_result(&mut self) -> io::Result<u64> {
        if let Some(e) = self.sticky.take() {
            return Err(e);
        }
        if !self.pending.is_empty() {
            return Err(match &self.last_error {
                Some(e) => crate::sys::clone_error(e),
                None => io::Error::other("transcript records not yet written"),
            });
        }
        Ok(self.durable_seq)
    }

    fn run_before_commit(&self) -> io::Result<()> {
        match &self.before_commit {
            Some(f) => catch_unwind(AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err(io::Error::other("before_commit callback panicked"))),
            None => Ok(()),
        }
    }

    fn rewrite(&mut self, records: &[Record]) -> io::Result<u64> {
        self.run_before_commit()?;
        let replaced = replace(&self.path, records)?;
        // The rename happened: from here on the old descriptor points at an unlinked file.
        self.file = replaced.file;
        self.good_len = replaced.len;
        self.dirty_tail = false;
        // Queued records are superseded by `records` (the caller's contract).
        self.pending.clear();
        self.pending_max = None;
        self.last_error = None;
        let last = records.last().map(|r| r.seq);
        self.accepted_seq = self.accepted_seq.max(last);
        self.durable_seq = self.durable_seq.max(self.accepted_seq.unwrap_or(0));
        if let Err(e) = replaced.dir_sync {
            // The error names the file and the step already.
            self.dir_unsynced = true;
            return Err(e);
        }
        self.notify_durable();
        Ok(self.durable_seq)
    }

    fn notify_durable(&self) {
        if let Some(f) = &self.on_durable {
            let seq = self.durable_seq;
            if catch_unwind(AssertUnwindSafe(|| f(seq))).is_err() {
                log::error!(
                    "{}: on_durable callback panicked (seq {seq})",
                    self.path.display()
                );
            }
        }
    }
}

/// Replaces `path` with a transcript holding exactly `records` (gc compaction), by the one
/// atomic write (`crate::state::atomic`): a temp file in the same directory, fsync, rename
/// over `path`, fsync of the directory.
///
/// A crash at any point leaves either the complete old file or the complete new one (plus,
/// before the rename, a stray temp file `.NAME.tmp-PID-RANDOM`, removed at the next mount).
/// On error before the rename the temp file is removed and `path` is untouched. `records` must
/// have strictly increasing `seq` (`InvalidInput` otherwise), so the result always replays.
/// The new file keeps the old one's permission bits.
///
/// Not for a transcript a [`TranscriptWriter`] has open: use [`TranscriptWriter::rewrite`].
pub fn rewrite_atomically(path: &Path, records: &[Record]) -> io::Result<()> {
    replace(path, records)?.dir_sync
}

struct Replaced {
    /// The new file, open for append (same flags as the writer's).
    file: File,
    len: u64,
    /// The rename is done either way; this says whether it is durable yet.
    dir_sync: io::Result<()>,
}

fn replace(path: &Path, records: &[Record]) -> io::Result<Replaced> {
    for pair in records.windows(2) {
        if pair[1].seq <= pair[0].seq {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rewriting {}: seq {} follows seq {}; seqs must strictly increase",
                    path.display(),
                    pair[1].seq,
                    pair[0].seq
                ),
            ));
        }
    }
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("rewriting {}: not a file path", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // The old file's bits, but never more than the owner's (see crate::state::dir).
    let mode = fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o600);
    let replaced = crate::state::atomic::replace(dir, name, mode, |file| {
        let mut w = BufWriter::with_capacity(1 << 20, &*file);
        for record in records {
            serde_json::to_writer(&mut w, record)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
        drop(w);
        Ok(file.metadata()?.len())
    })?;
    Ok(Replaced {
        file: replaced.file,
        len: replaced.value,
        dir_sync: replaced.dir_synced,
    })
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::transcript::replay::{ReplayError, read_transcript, truncate_torn_tail};
    use crate::transcript::testutil::{backup, checkpoint, write_lines};

    /// Every line of `path`, parsed strictly (no replay leniency).
    fn lines(path: &Path) -> Vec<Record> {
        let text = fs::read_to_string(path).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "unterminated file");
        text.lines()
            .map(|l| serde_json::from_str(l).expect("line parses"))
            .collect()
    }

    fn seqs(records: &[Record]) -> Vec<u64> {
        records.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn many_threads_one_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        const THREADS: u64 = 4;
        const EACH: u64 = 500;
        // The intended discipline: allocate the seq and append under one lock.
        let next = Mutex::new(0u64);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (writer, next) = (&writer, &next);
                s.spawn(move || {
                    for i in 0..EACH {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        let latest = format!("m{t}");
                        writer.append(backup(*n, Some(&latest)));
                        drop(n);
                        if i % 100 == 0 {
                            writer.flush().unwrap();
                        }
                    }
                });
            }
        });
        assert_eq!(writer.flush().unwrap(), THREADS * EACH);
        writer.shutdown().unwrap();
        let records = lines(&path);
        assert_eq!(seqs(&records), (1..=THREADS * EACH).collect::<Vec<_>>());
        assert_eq!(read_transcript(&path).unwrap().records, records);
    }

    #[test]
    fn flush_returns_max_seq_and_data_is_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        assert_eq!(writer.flush().unwrap(), 0);
        let sent = vec![backup(1, None), checkpoint("m1", 2), backup(7, Some("m1"))];
        for r in &sent {
            writer.append(r.clone());
        }
        assert_eq!(writer.flush().unwrap(), 7);
        // Visible while the writer is still running.
        assert_eq!(lines(&path), sent);
        assert_eq!(writer.flush().unwrap(), 7);
    }

    #[test]
    fn on_durable_sees_increasing_seqs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        writer.set_on_durable(Box::new(move |seq| sink.lock().unwrap().push(seq)));
        for seq in 1..=20 {
            writer.append(backup(seq, None));
        }
        assert_eq!(writer.flush().unwrap(), 20);
        let seen = seen.lock().unwrap().clone();
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert_eq!(seen.last(), Some(&20));
    }

    #[test]
    fn panicking_callback_does_not_stop_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        writer.set_on_durable(Box::new(|_| panic!("callback bug")));
        writer.append(backup(1, None));
        assert_eq!(writer.flush().unwrap(), 1);
        writer.append(backup(2, None));
        assert_eq!(writer.flush().unwrap(), 2);
        writer.shutdown().unwrap();
    }

    #[test]
    fn shutdown_and_drop_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        for seq in 1..=100 {
            writer.append(backup(seq, None));
        }
        writer.shutdown().unwrap();
        assert_eq!(lines(&path).len(), 100);

        let writer = TranscriptWriter::start(&path).unwrap();
        for seq in 101..=200 {
            writer.append(backup(seq, None));
        }
        drop(writer);
        assert_eq!(seqs(&lines(&path)), (1..=200).collect::<Vec<_>>());
    }

    #[test]
    fn start_continues_an_existing_transcript() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        write_lines(&path, &[backup(1, None), checkpoint("m1", 2)], true);
        let writer = TranscriptWriter::start(&path).unwrap();
        assert_eq!(writer.flush().unwrap(), 2);
        writer.append(backup(3, Some("m1")));
        writer.shutdown().unwrap();
        assert_eq!(seqs(&read_transcript(&path).unwrap().records), [1, 2, 3]);
    }

    #[test]
    fn start_refuses_a_torn_tail_until_it_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        write_lines(&path, &[backup(1, None)], true);
        let line = serde_json::to_string(&backup(2, None)).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&line.as_bytes()[..10]).unwrap();
        drop(f);

        let err = TranscriptWriter::start(&path).err().expect("refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let outcome = read_transcript(&path).unwrap();
        assert_eq!(outcome.dropped_torn_line, Some(2));
        truncate_torn_tail(&path, &outcome).unwrap();

        let writer = TranscriptWriter::start(&path).unwrap();
        assert_eq!(writer.flush().unwrap(), 1);
        writer.append(backup(2, None));
        writer.shutdown().unwrap();
        assert_eq!(seqs(&lines(&path)), [1, 2]);
    }

    #[test]
    fn seq_regression_is_written_and_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        writer.append(backup(5, None));
        writer.append(backup(4, None));
        let err = writer.flush().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(
            err.to_string().contains("seq 4 appended after seq 5"),
            "{err}"
        );
        assert_eq!(writer.flush().unwrap(), 5);
        writer.shutdown().unwrap();
        assert_eq!(seqs(&lines(&path)), [5, 4]);
        assert!(matches!(
            read_transcript(&path),
            Err(ReplayError::Corrupt { line: 2, .. })
        ));
    }

    #[test]
    fn write_errors_are_reported_and_retried_without_tearing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        writer.append(backup(1, None));
        assert_eq!(writer.flush().unwrap(), 1);

        writer.fail_writes.store(true, Ordering::SeqCst);
        writer.append(backup(2, None));
        writer.append(backup(3, None));
        let err = writer.flush().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        // Still alive and still failing; later records join the retry.
        writer.append(backup(4, None));
        assert!(writer.flush().is_err());

        writer.fail_writes.store(false, Ordering::SeqCst);
        assert_eq!(writer.flush().unwrap(), 4);
        writer.append(backup(5, None));
        writer.shutdown().unwrap();
        // The half-written batches were cut back: every line is whole and in order.
        assert_eq!(seqs(&lines(&path)), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn shutdown_reports_unwritable_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        writer.fail_writes.store(true, Ordering::SeqCst);
        writer.append(backup(1, None));
        assert_eq!(
            writer.shutdown().unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
    }

    #[test]
    fn rewrite_atomically_replaces_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        write_lines(
            &path,
            &(1..=10).map(|s| backup(s, None)).collect::<Vec<_>>(),
            true,
        );
        let compacted = vec![checkpoint("m1", 4), backup(10, Some("m1"))];
        rewrite_atomically(&path, &compacted).unwrap();
        assert_eq!(lines(&path), compacted);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["transcript.jsonl"], "no temp file left behind");

        let err = rewrite_atomically(&path, &[backup(3, None), backup(3, None)]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(lines(&path), compacted, "untouched on error");

        // Also creates a missing file; an empty list gives an empty file.
        let other = dir.path().join("new.jsonl");
        rewrite_atomically(&other, &[]).unwrap();
        assert_eq!(fs::metadata(&other).unwrap().len(), 0);
    }

    #[test]
    fn rewrite_on_a_live_writer_keeps_appending_to_the_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let writer = TranscriptWriter::start(&path).unwrap();
        for seq in 1..=5 {
            writer.append(backup(seq, None));
        }
        assert_eq!(
            writer
                .rewrite(vec![backup(2, None), checkpoint("m1", 5)])
                .unwrap(),
            5
        );
        writer.append(backup(6, Some("m1")));
        assert!(
            writer
                .rewrite(vec![backup(9, None), backup(8, None)])
                .is_err()
        );
        writer.append(backup(7, Some("m1")));
        writer.shutdown().unwrap();
        assert_eq!(seqs(&lines(&path)), [2, 5, 6, 7]);
    }
}
