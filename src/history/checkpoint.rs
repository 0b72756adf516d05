//! Layer 2: a checkpoint (as a method of [`super::Quiesced`]: every mutation excluded), the
//! background copier that fills pending versions, and the flush at shutdown.
use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use log::{debug, warn};

use super::model::backup_of;
use super::track::LayerSync;
use super::{Checkpoint, History, Version, VersionState, rel_key};
use crate::sys::{self, errno};
use crate::transcript::record::{Record, rfc3339};

impl History {
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
        let (k, dirty, unfilled) = {
            let st = self.lock();
            if st.checkpoint_ids.contains_key(id) {
                return Err(errno(libc::EEXIST));
            }
            // A file open for writing whose version at an earlier checkpoint is still
            // waiting for its copy (`State::open_fills`), not yet begun, gets no new version:
            // this checkpoint shares that one, whose copy will be of a moment at or after
            // both. A copy already under way is of a moment before this checkpoint: the path
            // gets a new pending version (once), and that copy fills the one it began for.
            let unbegun = |p: &String| {
                let Some(h) = st.paths.get(p) else {
                    return false;
                };
                let pending = |back: usize| {
                    h.versions.len() >= back
                        && h.versions[h.versions.len() - back].state == VersionState::Pending
                };
                st.open_fills.contains(p) && pending(1) && (!st.busy.contains(p) || pending(2))
            };
            let (unfilled, dirty): (Vec<String>, Vec<String>) =
                st.dirty_paths.iter().cloned().partition(unbegun);
            (st.checkpoints.len(), dirty, unfilled)
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
        let seq = st.next_seq;
        st.next_seq += 1;
        st.checkpoints.push(Checkpoint {
            id: id.to_string(),
            seq,
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
            st.note_pending(&path);
            let h = &st.paths[&path];
            delta.insert(
                path.clone(),
                backup_of(n, &h.versions[n as usize - 1], None, false),
            );
            if pending {
                if still_open {
                    // Too big to copy under the lock: filled by a copy of one moment.
                    st.open_fills.insert(path.clone());
                }
                to_fill.push((path.clone(), n));
            }
            if still_open {
                continuing.push((path, n));
            }
        }
        // The record lists only the new versions: every other path keeps its version at the
        // previous checkpoint, which replay already has. So a checkpoint costs O(changed),
        // whatever the size of the tree. Journal first (it is what survives a crash), before
        // the marker returns.
        let mut record = Record::checkpoint_delta(id, seq, rfc3339(now), delta);
        record.session = session;
        let rec = self.recorder()?;
        rec.signer.sign_record(&mut record);
        rec.journal.append(&record, false)?;
        rec.transcript.append(record);
        let copied_open_files = !continuing.is_empty();
        for path in unfilled {
            if let Some(h) = st.paths.get(&path) {
                continuing.push((path, h.versions.len() as u32));
            }
        }
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
