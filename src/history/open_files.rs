//! Copying files that are open for writing at a checkpoint, so that a view never shows a
//! content the file never had.
//!
//! With kernel passthrough the daemon never sees the writes to an open file: they go from
//! the caller to SRC's file directly, and continue while a checkpoint holds the epoch lock.
//! A plain read-loop copy then mixes several writes (issue 10 measured 88 views of 92
//! mixing 3–4 versions of a file rewritten whole). Two facts make a copy that holds:
//!
//! 1. **One direct read is atomic against buffered writes.** ext4 and XFS take the inode's
//!    I/O lock shared for an `O_DIRECT` read and exclusive for a buffered `write(2)` (which
//!    is what passthrough writes are on SRC's file), and the direct read first writes back
//!    and waits for the dirty pages in its range. So reading the whole file with a single
//!    `pread` on an `O_DIRECT` descriptor returns its content at one moment: between two
//!    `write` calls, never inside one ([`DirectRead`]). Where `O_DIRECT` is not
//!    available, or the file is larger than [`MAX_ATOMIC_COPY`], the copy falls back to a
//!    plain one, logged once.
//! 2. **A file whose change time has not moved has not been written.** Timestamps are
//!    multigrain (Linux ≥ 6.13 on ext4, XFS, btrfs, tmpfs): once the change time was read,
//!    the next write sets a new, distinct one. A write starts by updating the times, so if
//!    `(size, mtime, ctime)` read before a copy still holds at the checkpoint, no write began
//!    in between and the copy is the content at the checkpoint.
//!
//! A checkpoint therefore copies the files open for writing *before* it takes the epoch lock
//! ([`History::precopy_open`]), without stalling anyone, and under the lock keeps each copy
//! whose change key still holds; only files written in between are copied again, under the
//! lock ([`History::capture_open_files`]). Several such files are copied at the same time,
//! one thread each, made ready first and then started together behind a barrier, so that
//! their direct reads take the files' locks at nearly one moment: a program writing them in
//! turn is held at one file while the others are read. Then all their keys are checked
//! again; if any changed, every file is copied again (at least [`CONSISTENT_ROUNDS`] rounds,
//! more within [`CONSISTENT_BUDGET`]) until none changed during a round. A single file
//! read in one direct read needs no second round: there is nothing for it to agree with. A
//! writer that never pauses gets the last round, each file whole and all read together, and
//! a warning (logged once). Copies stay in memory until their round is kept, so discarded
//! rounds store nothing.
//!
//! Copies under the lock are bounded: every mutation waits for them. Files written since
//! their pre-copy are copied again there, smallest first, up to [`MAX_LOCKED_RECOPY`] bytes
//! in all (a file bigger than that alone gets no pre-copy); a bigger one's version is left
//! pending ([`State::open_fills`]) and filled right after the lock by the copier with a
//! copy of one moment (one direct read, fact 1). That copy is the file's own content at
//! one moment at or just after the checkpoint: it holds every write made before the
//! checkpoint, maybe a few made after, and it is not ordered with the other files open for
//! writing. A Layer 1 backup or a view of the path meanwhile makes the same copy first (it
//! fills the pending version); a checkpoint taken before the copy is made shares it.
//!
//! [`State::open_fills`]: super::model::State::open_fills
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use log::{debug, warn};

use super::track::meta_of;
use super::{History, VersionState};
use crate::sys;
use crate::transcript::record::{EntryKind, EntryMeta};

/// Largest file copied with one direct read (it needs a buffer that size).
pub const MAX_ATOMIC_COPY: u64 = 512 << 20;

/// The files open for writing are copied again, under the epoch lock, until their copies
/// show one moment across files: at least this many rounds...
pub const CONSISTENT_ROUNDS: usize = 3;

/// ...and more while the checkpoint has spent less than this on them (every mutation waits
/// meanwhile, so the budget is small; a round of a few MiB takes milliseconds).
pub const CONSISTENT_BUDGET: std::time::Duration = std::time::Duration::from_millis(200);

/// An upper bound on rounds whatever the time (tiny files under a writer that never pauses).
const MAX_ROUNDS: usize = 64;

/// The most a checkpoint copies again under the epoch lock (files written since their
/// pre-copy); bigger ones are filled after it (see the module docs). A direct read of this
/// much, its dirty pages written back first, takes tens of milliseconds here.
pub const MAX_LOCKED_RECOPY: u64 = 16 << 20;

/// Files open for writing copied at the same time (one thread each).
const MAX_PARALLEL_COPIES: usize = 16;

/// The alignment `O_DIRECT` needs for buffers, offsets and lengths: 4 KiB covers every
/// logical block size up to the page size.
const DIRECT_ALIGN: usize = 4096;

/// What changes when a file is written: see fact 2 in the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChangeKey {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl ChangeKey {
    fn of(st: &libc::stat) -> ChangeKey {
        ChangeKey {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
        }
    }
}

/// A copy of a file open for writing, and the change key read before it was made.
#[derive(Debug, Clone)]
pub struct OpenCopy {
    key: ChangeKey,
    content: CopyContent,
}

/// Where a copy's content is: in memory until a round of copies is known to show one moment
/// (so that the rounds a checkpoint discards leave nothing in the store), or stored.
#[derive(Debug, Clone)]
enum CopyContent {
    Read { meta: EntryMeta, data: Vec<u8> },
    Stored(VersionState),
}

/// One file whose copy is one direct read: that read is its content at one moment (fact 1),
/// and there is no other file for it to agree with, so a write since its change key was
/// read asks for no further round (which would stall every mutation for another read of a
/// possibly big file).
fn single_atomic(copies: &[(String, Option<OpenCopy>)]) -> bool {
    matches!(
        copies,
        [(
            _,
            Some(OpenCopy {
                content: CopyContent::Read { .. },
                ..
            })
        )]
    )
}

impl OpenCopy {
    /// The copy's version state, its content put into the store if it is not yet.
    fn store(self, history: &History) -> io::Result<OpenCopy> {
        let state = match self.content {
            CopyContent::Stored(state) => state,
            CopyContent::Read { meta, data } => VersionState::Present {
                meta,
                object: Some(history.store().put_bytes(&data)?.name),
            },
        };
        Ok(OpenCopy {
            key: self.key,
            content: CopyContent::Stored(state),
        })
    }

    fn into_state(self, history: &History) -> io::Result<VersionState> {
        match self.store(history)?.content {
            CopyContent::Stored(state) => Ok(state),
            CopyContent::Read { .. } => unreachable!("store() leaves a stored copy"),
        }
    }
}

/// A copy made ready to read (see [`DirectRead`]): everything but the read itself.
struct PreparedCopy {
    key: ChangeKey,
    meta: EntryMeta,
    /// `None`: no direct read possible here, copied piecewise instead.
    direct: Option<DirectRead>,
}

/// Copies made before a checkpoint, by path (see [`History::precopy_open`]).
pub type PreCopies = HashMap<String, OpenCopy>;

static PLAIN_COPY_LOGGED: AtomicBool = AtomicBool::new(false);
static INCONSISTENT_LOGGED: AtomicBool = AtomicBool::new(false);

/// Logs `msg()` as a warning the first time only (`flag` remembers).
pub(super) fn log_once(flag: &AtomicBool, msg: impl FnOnce() -> String) {
    if !flag.swap(true, Ordering::Relaxed) {
        warn!("{} (logged once)", msg());
    }
}

/// An `O_DIRECT`-aligned heap buffer. RAII: freed on drop.
struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    /// `len` bytes (a non-zero multiple of [`DIRECT_ALIGN`]), zeroed.
    fn new(len: usize) -> io::Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: `layout` has a non-zero size (the callers round up to at least one block).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(AlignedBuf { ptr, layout })
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size()` initialized (zeroed) bytes that this buffer
        // owns exclusively for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A whole-file direct read made ready: the descriptor opened `O_DIRECT` and a buffer for
/// the size the file has now, so that [`DirectRead::read`] is one `pread` and nothing else
/// (copies of several files can then start their reads together, see
/// [`History::copy_missing`]).
struct DirectRead {
    file: std::os::fd::OwnedFd,
    buf: AlignedBuf,
}

impl DirectRead {
    /// `None` when a direct read cannot be done here: the filesystem refuses `O_DIRECT`, or
    /// the file is larger than [`MAX_ATOMIC_COPY`].
    fn prepare(fd: BorrowedFd<'_>) -> io::Result<Option<DirectRead>> {
        let file = match sys::reopen_for_reading(fd.as_raw_fd(), libc::O_DIRECT) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e),
        };
        DirectRead::sized(file)
    }

    /// A buffer for the file's current size plus one spare block, which shows whether the
    /// read reached the end.
    fn sized(file: std::os::fd::OwnedFd) -> io::Result<Option<DirectRead>> {
        let size = sys::fstat(file.as_fd())?.st_size.max(0) as u64;
        if size > MAX_ATOMIC_COPY {
            return Ok(None);
        }
        let len = (size as usize).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN + DIRECT_ALIGN;
        Ok(Some(DirectRead {
            file,
            buf: AlignedBuf::new(len)?,
        }))
    }

    /// The whole content as of one moment (fact 1 in the module docs): one `pread`; if the
    /// file grew past the buffer meanwhile, again with the new size (a few times at most).
    fn read(mut self) -> io::Result<Option<Vec<u8>>> {
        for _ in 0..4 {
            let slice = self.buf.as_mut_slice();
            let len = slice.len();
            let n = loop {
                // SAFETY: `slice` is valid for `len` writable bytes; the fd is open.
                let r = unsafe {
                    libc::pread(self.file.as_raw_fd(), slice.as_mut_ptr().cast(), len, 0)
                };
                if r >= 0 {
                    break r as usize;
                }
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Alignment the device does not accept: no direct read here.
                    Some(libc::EINVAL) => return Ok(None),
                    _ => return Err(e),
                }
            };
            if n < len {
                return Ok(Some(slice[..n].to_vec()));
            }
            match DirectRead::sized(self.file)? {
                Some(bigger) => self = bigger,
                None => return Ok(None),
            }
        }
        // Growing faster than it can be read: not a moment we can catch.
        Ok(None)
    }
}

/// The whole content of the regular file behind `fd` (any descriptor of it, O_PATH will do)
/// as of one moment, read with a single direct read (fact 1 in the module docs). `None` when
/// that cannot be done here: the filesystem refuses `O_DIRECT`, or the file is larger than
/// [`MAX_ATOMIC_COPY`].
#[cfg(test)]
fn read_whole_atomically(fd: BorrowedFd<'_>) -> io::Result<Option<Vec<u8>>> {
    match DirectRead::prepare(fd)? {
        Some(r) => r.read(),
        None => Ok(None),
    }
}

impl History {
    /// Copies the files in `paths` (open for writing) now, before the checkpoint takes the
    /// epoch lock; [`History::capture_open_files`] keeps the copies still current then.
    /// Failures are left to that second step, which copies again.
    pub(crate) fn precopy_open(&self, paths: &[Vec<u8>]) -> PreCopies {
        let mut out = PreCopies::new();
        for rel in paths.iter().filter_map(|p| super::rel_key(p)) {
            if self.is_excluded(rel, Some(false)) {
                continue;
            }
            // Stored now, outside the epoch lock. A file too big to copy again under the lock
            // is copied after it in any case (see the module docs): a copy now would only
            // delay the marker.
            match self
                .copy_open(rel, MAX_LOCKED_RECOPY)
                .and_then(|c| c.map(|c| c.store(self)).transpose())
            {
                Ok(Some(copy)) => {
                    out.insert(rel.to_string(), copy);
                }
                Ok(None) => {}
                Err(e) => debug!("pre-copy of {rel} (open for writing): {e}"),
            }
        }
        out
    }

    /// The state of each of `paths` (files open for writing) at this checkpoint; called with
    /// the epoch lock held exclusively. See the module docs.
    pub(crate) fn capture_open_files(
        &self,
        paths: &[String],
        mut pre: PreCopies,
    ) -> io::Result<Vec<(String, VersionState)>> {
        let mut copies: Vec<(String, Option<OpenCopy>)> = Vec::with_capacity(paths.len());
        for rel in paths {
            let current = self.change_key(rel)?;
            let kept = match (pre.remove(rel), current) {
                (Some(c), Some(now)) if c.key == now && self.still_stored(&c.content) => Some(c),
                _ => None,
            };
            copies.push((rel.clone(), kept));
        }
        let left_pending = self.leave_big_copies_pending(&mut copies)?;
        let started = std::time::Instant::now();
        for round in 1..=MAX_ROUNDS {
            self.copy_missing(&mut copies)?;
            // Every copy still current at the same moment, now: they show one moment.
            let mut stale = 0;
            for (rel, copy) in &copies {
                if let Some(c) = copy
                    && self.change_key(rel)? != Some(c.key)
                {
                    stale += 1;
                }
            }
            if stale == 0 || single_atomic(&copies) {
                break;
            }
            let last = round == MAX_ROUNDS
                || (round >= CONSISTENT_ROUNDS && started.elapsed() >= CONSISTENT_BUDGET);
            if last {
                log_once(&INCONSISTENT_LOGGED, || {
                    format!(
                        "checkpoint: {stale} of {} files open for writing kept changing during \
                         {round} copy rounds ({:?}); each copy is whole, and the last round's \
                         reads started together, but they may show slightly different moments",
                        copies.len(),
                        started.elapsed()
                    )
                });
                break;
            }
            debug!("checkpoint: {stale} files open for writing changed during round {round}");
            // All of them again, not only the stale ones: reads started together show one
            // moment even when the writer never pauses (see `copy_missing`).
            for (_, copy) in copies.iter_mut() {
                *copy = None;
            }
        }
        let mut states: Vec<(String, VersionState)> = copies
            .into_iter()
            .map(|(rel, copy)| match copy {
                Some(c) => Ok((rel, c.into_state(self)?)),
                // Not a regular file (anymore): recorded like any other path.
                None => Ok((rel.clone(), self.capture(&rel)?.0)),
            })
            .collect::<io::Result<_>>()?;
        states.extend(
            left_pending
                .into_iter()
                .map(|rel| (rel, VersionState::Pending)),
        );
        Ok(states)
    }

    /// Takes out of `copies` the files still to copy that would make the copies under the
    /// lock exceed [`MAX_LOCKED_RECOPY`] (the biggest first) and returns their paths: their
    /// versions are left pending (see the module docs).
    fn leave_big_copies_pending(
        &self,
        copies: &mut Vec<(String, Option<OpenCopy>)>,
    ) -> io::Result<Vec<String>> {
        let mut to_copy: Vec<(u64, usize)> = Vec::new();
        for (i, (rel, copy)) in copies.iter().enumerate() {
            if copy.is_none() {
                let size = self.change_key(rel)?.map_or(0, |k| k.size.max(0) as u64);
                to_copy.push((size, i));
            }
        }
        to_copy.sort_unstable();
        let mut total = 0u64;
        let mut over: Vec<usize> = Vec::new();
        for (size, i) in to_copy {
            total = total.saturating_add(size);
            if total > MAX_LOCKED_RECOPY {
                over.push(i);
            }
        }
        over.sort_unstable_by(|a, b| b.cmp(a));
        Ok(over.into_iter().map(|i| copies.remove(i).0).collect())
    }

    /// The state of `rel`, a file open for writing whose checkpoint version was left
    /// pending (see the module docs): a copy of one moment, stored.
    pub(crate) fn capture_open(&self, rel: &str) -> io::Result<(VersionState, bool)> {
        match self.copy_open(rel, u64::MAX)? {
            Some(copy) => Ok((copy.into_state(self)?, true)),
            None => self.capture(rel),
        }
    }

    /// Makes the copies that are `None`, all at once: each in its own thread, made ready
    /// (opened, buffer allocated) first, then all direct reads started together behind a
    /// barrier, so that they take their files' locks at nearly the same moment. A writer
    /// that writes the files in turn is then held at one of them while the others are read,
    /// and the copies show one moment even when it never pauses.
    fn copy_missing(&self, copies: &mut [(String, Option<OpenCopy>)]) -> io::Result<()> {
        let mut missing: Vec<&mut (String, Option<OpenCopy>)> =
            copies.iter_mut().filter(|(_, c)| c.is_none()).collect();
        if missing.len() <= 1 {
            for (rel, copy) in missing {
                *copy = self.copy_open(rel, u64::MAX)?;
            }
            return Ok(());
        }
        let mut result: io::Result<()> = Ok(());
        for batch in missing.chunks_mut(MAX_PARALLEL_COPIES) {
            let start_together = std::sync::Barrier::new(batch.len());
            std::thread::scope(|scope| {
                let handles: Vec<_> = batch
                    .iter_mut()
                    .map(|entry| {
                        let rel = entry.0.clone();
                        let start_together = &start_together;
                        scope.spawn(move || {
                            let prepared = self.prepare_copy(&rel, u64::MAX);
                            // Every thread reaches the barrier, whatever its preparation gave.
                            start_together.wait();
                            match prepared {
                                Ok(Some(p)) => self.finish_copy(&rel, p).map(Some),
                                other => other.map(|_| None),
                            }
                        })
                    })
                    .collect();
                for (entry, handle) in batch.iter_mut().zip(handles) {
                    let outcome = handle.join().unwrap_or_else(|_| {
                        Err(io::Error::other(
                            "a copy thread of a file open for writing panicked",
                        ))
                    });
                    match outcome {
                        Ok(copy) => entry.1 = copy,
                        Err(e) if result.is_ok() => result = Err(e),
                        Err(_) => {}
                    }
                }
            });
        }
        result
    }

    fn change_key(&self, rel: &str) -> io::Result<Option<ChangeKey>> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok(None);
        };
        Ok(Some(ChangeKey::of(&sys::fstat(fd.as_fd())?)))
    }

    /// A pre-copy's object can have been swept by a gc that ran before the checkpoint.
    fn still_stored(&self, content: &CopyContent) -> bool {
        match content {
            CopyContent::Stored(VersionState::Present {
                object: Some(name), ..
            }) => self.store().contains(name),
            _ => true,
        }
    }

    /// A copy of the regular file `rel` as of one moment, with the change key from before
    /// it; `None` if `rel` is absent, not a regular file, or larger than `max_size`.
    fn copy_open(&self, rel: &str, max_size: u64) -> io::Result<Option<OpenCopy>> {
        match self.prepare_copy(rel, max_size)? {
            Some(p) => self.finish_copy(rel, p).map(Some),
            None => Ok(None),
        }
    }

    /// Everything a copy of `rel` needs before its read: its change key and metadata, and a
    /// direct read made ready. `None` if `rel` is absent, not a regular file, or larger
    /// than `max_size`.
    fn prepare_copy(&self, rel: &str, max_size: u64) -> io::Result<Option<PreparedCopy>> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok(None);
        };
        let st = sys::fstat(fd.as_fd())?;
        let Some(mut meta) = meta_of(&st) else {
            return Ok(None);
        };
        if meta.kind != EntryKind::File || meta.size > max_size {
            return Ok(None);
        }
        // Taken with the change key: an xattr change passes the gate, which waits for the
        // checkpoint, so they cannot change while the copy is made.
        meta.xattrs = self.record_xattrs(fd.as_fd(), meta.kind)?.0;
        Ok(Some(PreparedCopy {
            key: ChangeKey::of(&st),
            meta,
            direct: DirectRead::prepare(fd.as_fd())?,
        }))
    }

    /// The read of a prepared copy: one direct read, kept in memory; piecewise into the
    /// store where no direct read is possible.
    fn finish_copy(&self, rel: &str, p: PreparedCopy) -> io::Result<OpenCopy> {
        let data = match p.direct {
            Some(read) => read.read()?,
            None => None,
        };
        let Some(data) = data else {
            log_once(&PLAIN_COPY_LOGGED, || {
                format!(
                    "checkpoint: {rel} is open for writing and cannot be read in one direct \
                     read (no O_DIRECT on SRC's filesystem, or larger than {} MiB); it is \
                     copied piecewise, so its view can mix writes made during the copy",
                    MAX_ATOMIC_COPY >> 20
                )
            });
            let (state, _) = self.capture(rel)?;
            return Ok(OpenCopy {
                key: p.key,
                content: CopyContent::Stored(state),
            });
        };
        let mut meta = p.meta;
        meta.size = data.len() as u64;
        Ok(OpenCopy {
            key: p.key,
            content: CopyContent::Read { meta, data },
        })
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their trees directly"
)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_direct_read_returns_the_whole_file_at_any_size() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        for size in [0usize, 1, 4095, 4096, 4097, 3 * 4096 + 17, 1 << 20] {
            let path = dir.path().join(format!("f{size}"));
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            std::fs::File::create(&path)
                .unwrap()
                .write_all(&data)
                .unwrap();
            let f = std::fs::File::open(&path).unwrap();
            // /var/tmp is on the root disk (ext4 here and in CI), which has O_DIRECT.
            let read = read_whole_atomically(f.as_fd())
                .unwrap()
                .expect("a direct read on /var/tmp");
            assert!(read == data, "size {size}: content differs");
        }
    }

    #[test]
    fn the_change_key_moves_with_every_write() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        use std::os::unix::fs::FileExt;
        for i in 0..1000u32 {
            let before = ChangeKey::of(&sys::fstat(f.as_fd()).unwrap());
            f.write_at(&i.to_le_bytes(), 0).unwrap();
            let after = ChangeKey::of(&sys::fstat(f.as_fd()).unwrap());
            assert_ne!(before, after, "write {i} left the change key as it was");
        }
    }
}
