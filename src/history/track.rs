//! Layer 1: back up a path before its first change in a message (the gate calls
//! [`History::before_change`] and [`History::before_rename`]), the captures Layer 2 shares,
//! and how backups reach the disk (`--durability`).
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use log::{debug, info, warn};

use super::model::backup_of;
use super::store::{LinkPut, LinkedObject};
use super::{Caller, History, State, Version, VersionState, rel_key};
use crate::state::durability::{self, Durability};
use crate::sys::{self, FsCredsGuard, errno};
use crate::transcript::record::{Actor, EntryKind, EntryMeta, LinkMeta, Record, rfc3339};

/// The kind of an `st_mode`, `None` for an unknown file type.
pub(crate) fn kind_of_mode(mode: u32) -> Option<EntryKind> {
    Some(match mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Symlink,
        libc::S_IFIFO => EntryKind::Fifo,
        libc::S_IFSOCK => EntryKind::Socket,
        libc::S_IFCHR => EntryKind::CharDevice,
        libc::S_IFBLK => EntryKind::BlockDevice,
        _ => return None,
    })
}

pub(crate) fn meta_of(st: &libc::stat) -> Option<EntryMeta> {
    let kind = kind_of_mode(st.st_mode)?;
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
        xattrs: None,
        link: link_of(st, kind),
    })
}

/// [`EntryMeta::link`] of an object: recorded for a regular file with more than one link
/// (format 4; a daemon before it ignores the field, and restores such names as files of
/// their own).
fn link_of(st: &libc::stat, kind: EntryKind) -> Option<LinkMeta> {
    let linked = kind == EntryKind::File && st.st_nlink > 1;
    linked.then_some(LinkMeta {
        dev: st.st_dev,
        ino: st.st_ino,
        nlink: st.st_nlink,
    })
}

/// The recorded xattrs of a regular file or directory `fd` (O_PATH) refers to; `None` for
/// other kinds (not recorded) or a set that could not be read.
fn read_xattrs(fd: BorrowedFd<'_>, kind: EntryKind) -> Option<super::xattrs::XattrSet> {
    matches!(kind, EntryKind::File | EntryKind::Dir)
        .then(|| super::xattrs::read_fd(fd))
        .flatten()
}

/// What `EntryMeta::xattrs` of a capture of `fd` (O_PATH, an object of kind `kind`) would
/// say now: the name its set has or would have in the store (not stored), `""` for none.
fn xattrs_name_of(fd: BorrowedFd<'_>, kind: EntryKind) -> Option<String> {
    read_xattrs(fd, kind).map(|set| {
        if set.is_empty() {
            String::new()
        } else {
            super::store::object_name(&super::xattrs::encode(&set))
        }
    })
}

/// [`xattrs_name_of`] of entry `name` of directory `dir`. Most files have no recorded
/// attributes: one `listxattrat` says so, with no descriptor opened; the set is read
/// through the object itself only when a recorded name is listed (or the kernel has no
/// `listxattrat`).
fn entry_xattrs_name(dir: BorrowedFd<'_>, name: &CStr, kind: EntryKind) -> Option<String> {
    let mut buf = [0u8; 256];
    match sys::listxattr_at(dir, name, &mut buf) {
        Ok(n) if !buf[..n].split(|&b| b == 0).any(super::xattrs::is_recorded) => {
            return Some(String::new());
        }
        // As a read of the set does (`xattrs::read_fd`): no xattrs here, an empty set.
        Err(e) if sys::os_error(&e) == Some(libc::ENOTSUP) => return Some(String::new()),
        // Recorded names, a list longer than the buffer (ERANGE), no listxattrat (ENOSYS).
        _ => {}
    }
    let obj = sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0).ok()?;
    xattrs_name_of(obj.as_fd(), kind)
}

fn actor_key(a: &Actor) -> super::ActorKey {
    super::ActorKey {
        pid: a.pid,
        session: a.session.clone(),
    }
}

/// What a Layer 1 record still needs, after it is written, before the change may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LayerSync {
    /// No record was written.
    Nothing,
    /// Written; the mode syncs later (or never).
    None,
    /// Strict, no new object: fdatasync the journal.
    Journal,
    /// Strict, with a new object: one syncfs covers object, name and record.
    Filesystem,
}

/// Why Layer 1 is asked to capture a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capture {
    /// The path is about to change (the gate).
    Change,
    /// The path is about to leave SRC: unlinked or replaced by a rename (the gate).
    Leaving,
    /// The background copier fills a pending version (no change).
    Fill,
}

/// Where a backup reads what is at the path it backs up.
#[derive(Clone, Copy)]
enum At<'a> {
    /// Open the path beneath SRC's root.
    Path,
    /// An O_PATH fd of the object at the path, held by the caller.
    Object(BorrowedFd<'a>),
    /// Entry `name` of a directory held by the caller: the path's parent.
    Entry(BorrowedFd<'a>, &'a CStr),
    /// As `Object`, for one of several names of a hard-linked file changed at once: the
    /// first capture of the object is kept in the cell and is the state of the other names
    /// too (one object, one content; read and hashed once).
    Linked(BorrowedFd<'a>, &'a RefCell<Option<VersionState>>),
}

/// What Layer 1 must do for a path before it changes.
enum Need {
    Nothing,
    /// Tracked, its state at the last checkpoint is stored: just note it changed again.
    MarkDirty,
    /// Copy the current state as a new v1 (untracked) or into the pending latest version.
    Capture,
    /// Copy the current state as a pre-image entry that makes no version (format 4: an
    /// ancestor was renamed since the path's latest version or record).
    Preimage,
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
        self.layer1(caller, rel, is_dir, Capture::Change, At::Path)
            .map(drop)
    }

    /// [`History::before_change`] for a change to one object that the caller holds open:
    /// `object` is an O_PATH fd of what is at `rel` (the gate found `rel` from it). A backup
    /// reads the object through that fd instead of resolving `rel` again beneath SRC (an
    /// open, a stat and a close fewer on a first write). The same object either way: a
    /// change through the mount that could put another one at `rel` (a rename, an unlink)
    /// passes the gate for `rel` first, which backs it up (or waits while this backup has
    /// `rel` busy), so by then `rel` is changed in this message and is not copied again.
    pub fn before_object_change(
        &self,
        caller: &Caller,
        rel: &[u8],
        object: BorrowedFd<'_>,
        is_dir: Option<bool>,
    ) -> io::Result<()> {
        self.layer1(caller, rel, is_dir, Capture::Change, At::Object(object))
            .map(drop)
    }

    /// [`History::before_object_change`] of one object under each of `rels`, its names (a
    /// hard-linked file): the object is captured once, and that state is each name's
    /// pre-image where one is needed.
    pub fn before_linked_object_change(
        &self,
        caller: &Caller,
        rels: &[Vec<u8>],
        object: BorrowedFd<'_>,
        is_dir: Option<bool>,
    ) -> io::Result<()> {
        let memo = RefCell::new(None);
        for rel in rels {
            self.layer1(
                caller,
                rel,
                is_dir,
                Capture::Change,
                At::Linked(object, &memo),
            )?;
        }
        Ok(())
    }

    /// [`History::before_change`] for entry `name` of directory `dir` (an O_PATH fd the
    /// caller holds, the parent of `rel`), which is about to appear or go (create, mkdir,
    /// unlink, rmdir…): the backup looks at `name` in `dir` with one `openat`, instead of
    /// resolving `rel` again beneath SRC, a walk of every component (issue 28: at depth
    /// 5,000 that walk was most of a create's cost). The same object either way, as for
    /// [`History::before_object_change`].
    pub fn before_entry_change(
        &self,
        caller: &Caller,
        rel: &[u8],
        (dir, name): (BorrowedFd<'_>, &CStr),
        is_dir: Option<bool>,
    ) -> io::Result<()> {
        self.layer1(caller, rel, is_dir, Capture::Change, At::Entry(dir, name))
            .map(drop)
    }

    /// Layer 1 for a name about to leave SRC: `rel` is unlinked, or replaced by a rename
    /// (`is_dir`: what is there, if known). As [`History::before_change`], except that a
    /// regular file nobody else can change is backed up by linking its inode into the store
    /// instead of copying it (store invariant 6). Then the caller must say how the removal
    /// went, with [`LinkedObject::removed`] or [`LinkedObject::kept`] (dropping it counts as
    /// kept); until then writers of that file wait.
    pub fn before_removal(
        &self,
        caller: &Caller,
        rel: &[u8],
        is_dir: Option<bool>,
    ) -> io::Result<Option<LinkedObject<'_>>> {
        self.layer1(caller, rel, is_dir, Capture::Leaving, At::Path)
    }

    /// [`History::before_removal`] of entry `name` of directory `dir`, the parent of `rel`
    /// (see [`History::before_entry_change`]).
    pub fn before_entry_removal(
        &self,
        caller: &Caller,
        rel: &[u8],
        (dir, name): (BorrowedFd<'_>, &CStr),
        is_dir: Option<bool>,
    ) -> io::Result<Option<LinkedObject<'_>>> {
        self.layer1(caller, rel, is_dir, Capture::Leaving, At::Entry(dir, name))
    }

    /// What the `before_*` entry points share: as the daemon, a UTF-8 path that is not
    /// excluded is tracked (a non-UTF-8 one is not, and is logged).
    fn layer1(
        &self,
        caller: &Caller,
        rel: &[u8],
        is_dir: Option<bool>,
        how: Capture,
        at: At<'_>,
    ) -> io::Result<Option<LinkedObject<'_>>> {
        // Layer 1 reads SRC and writes the store as the daemon, also in the middle of a
        // change made as another user (a rewind asked for by an `--owner`).
        let _daemon = FsCredsGuard::as_daemon();
        let _payer = self.budgets.pay_as(caller.uid)?;
        let Some(rel) = rel_key(rel) else {
            warn!(
                "not tracking a path that is not UTF-8: {:?}",
                String::from_utf8_lossy(rel)
            );
            return Ok(None);
        };
        // Excluded, unless a rename moved tracked content there (format 4: lookups of
        // older checkpoints resolve to what is there now).
        if self.is_excluded(rel, is_dir) && !self.lock().renames.moved_content_to(rel) {
            return Ok(None);
        }
        self.track_as(rel, Some(caller), how, at)
    }

    /// Layer 1 for a rename: both names, and for a directory every path below it at its old
    /// and its new place (a directory rename moves its whole subtree).
    /// `replaces`: the rename may replace what is at `to` (neither RENAME_EXCHANGE nor
    /// RENAME_NOREPLACE); that is then backed up as [`History::before_removal`] does, and the
    /// caller must give the verdict on the returned object the same way.
    pub fn before_rename(
        &self,
        caller: &Caller,
        from: &[u8],
        to: &[u8],
        exchange: bool,
        replaces: bool,
    ) -> io::Result<super::rename::RenameBackup<'_>> {
        let _daemon = FsCredsGuard::as_daemon();
        let _payer = self.budgets.pay_as(caller.uid)?;
        let (Some(from), Some(to)) = (rel_key(from), rel_key(to)) else {
            warn!("not tracking a rename involving a non-UTF-8 path");
            return Ok(super::rename::RenameBackup {
                replaced: None,
                record: None,
            });
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
        if !super::rename::renames_per_path_for_tests() {
            return self.before_rename_v4(
                caller,
                (from.as_bytes(), to.as_bytes()),
                (from_is_dir, to_is_dir),
                exchange,
                replaces,
            );
        }
        self.before_change(caller, from.as_bytes(), from_is_dir)?;
        let linked = if replaces {
            self.before_removal(caller, to.as_bytes(), to_is_dir)?
        } else {
            self.before_change(caller, to.as_bytes(), to_is_dir)?;
            None
        };
        self.track_subtree_move(caller, from, to)?;
        if exchange {
            self.track_subtree_move(caller, to, from)?;
        }
        Ok(super::rename::RenameBackup {
            replaced: linked,
            record: None,
        })
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
            let mut stream = sys::DirStream::open(dir_fd.as_fd(), true)?;
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
    pub(super) fn track(&self, rel: &str, caller: Option<&Caller>, fill: bool) -> io::Result<()> {
        let how = if fill { Capture::Fill } else { Capture::Change };
        self.track_as(rel, caller, how, At::Path).map(drop)
    }

    /// [`History::track`], and for [`Capture::Leaving`] the object that still shares the
    /// file's inode, if it was linked. `at`: where to read what is at `rel`.
    fn track_as(
        &self,
        rel: &str,
        caller: Option<&Caller>,
        how: Capture,
        at: At<'_>,
    ) -> io::Result<Option<LinkedObject<'_>>> {
        let fill = how == Capture::Fill;
        let syncs_before = durability::syncs_on_this_thread();
        let (sync, wrote, linked) = self.track_locked(rel, caller, how, at)?;
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
        Ok(linked)
    }

    /// [`History::track`] under the state lock: returns what the record written (if any)
    /// still needs to be durable, whether new content went into the store, and a linked
    /// object (see [`History::before_removal`]).
    #[allow(clippy::type_complexity)]
    fn track_locked(
        &self,
        rel: &str,
        caller: Option<&Caller>,
        how: Capture,
        at: At<'_>,
    ) -> io::Result<(LayerSync, bool, Option<LinkedObject<'_>>)> {
        let fill = how == Capture::Fill;
        // Who the caller is, found (it reads /proc) only when a record needs it and only
        // with the state unlocked.
        let mut actor: Option<Actor> = None;
        let mut st = self.lock();
        loop {
            if st.busy.contains(rel) || (fill && st.fills_paused) {
                st = self.busy_cond.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let need = match st.paths.get(rel) {
                None if fill => Need::Nothing,
                None => Need::Capture,
                Some(h) if h.latest_is_pending() => Need::Capture,
                Some(_) if fill => Need::Nothing,
                // Format 4: a change is recorded once since the later of the last checkpoint
                // and the last rename of an ancestor (what is at the name may have come
                // from elsewhere since); then as a pre-image, no version.
                Some(h) if h.dirty => {
                    let last = h.changes.last().map_or(0, |c| c.0);
                    if st.renamed_above_since(rel, last) {
                        Need::Preimage
                    } else {
                        Need::Nothing
                    }
                }
                Some(h) if st.renamed_above_since(rel, st.latest_version_seq(h)) => Need::Preimage,
                Some(_) => Need::MarkDirty,
            };
            match need {
                Need::Nothing => {
                    // Already changed in this message; a process or session not yet recorded
                    // for it gets a record of its own (the content is stored already).
                    let Some(c) = caller.filter(|_| !fill) else {
                        return Ok((LayerSync::Nothing, false, None));
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
                        return Ok((LayerSync::Nothing, false, None));
                    }
                    let h = st.paths.get(rel).ok_or_else(|| errno(libc::EIO))?;
                    let n = h.versions.len() as u32;
                    let v = h.versions[n as usize - 1].clone();
                    debug!("layer 1: {rel} also changed by pid {}", a.pid);
                    return self
                        .emit_layer1(&mut st, rel, n, &v, Some(a), false, false)
                        .map(|s| (s, false, None));
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
                        .map(|s| (s, false, None));
                }
                Need::Preimage => {
                    st.busy.insert(rel.to_string());
                    drop(st);
                    if let (Some(c), None) = (caller, &actor) {
                        actor = Some(self.actor(c));
                    }
                    let leaving = how == Capture::Leaving;
                    let captured = match at {
                        At::Object(fd) => self.capture_fd(fd, leaving),
                        At::Entry(dir, name) => self.capture_entry(dir, name, leaving),
                        At::Path => self.capture_as(rel, leaving),
                        At::Linked(fd, memo) => self.capture_linked(fd, memo, leaving),
                    };
                    st = self.lock();
                    st.busy.remove(rel);
                    self.busy_cond.notify_all();
                    let (state, fresh_content, linked) = captured?;
                    let n = st.paths.get(rel).map_or(0, |h| h.versions.len());
                    let v = Version {
                        since: None,
                        state,
                        time: SystemTime::now(),
                    };
                    let mut backup = backup_of(n as u32, &v, actor.clone(), false);
                    backup.preimage = true;
                    st.mark_dirty(rel);
                    if let Some(a) = &actor {
                        st.note_actor(rel, actor_key(a));
                    }
                    debug!("layer 1: {rel} below a renamed directory, pre-image recorded");
                    return self
                        .emit_backup(&mut st, rel, backup, fresh_content)
                        .map(|s| (s, fresh_content, linked));
                }
                Need::Capture => {
                    st.busy.insert(rel.to_string());
                    let open_fill = st.open_fills.contains(rel);
                    // The version this copy is of. A checkpoint may add a newer (pending)
                    // version meanwhile (a fill holds no epoch lock): the copy still fills
                    // this one, which the checkpoint did not share because it was busy.
                    let target = st
                        .paths
                        .get(rel)
                        .filter(|h| h.latest_is_pending())
                        .map(|h| h.versions.len());
                    drop(st);
                    if let (Some(c), None) = (caller, &actor) {
                        actor = Some(self.actor(c));
                    }
                    let mut linked = None;
                    let leaving = how == Capture::Leaving;
                    let captured = if open_fill {
                        self.capture_open(rel)
                    } else {
                        match at {
                            At::Object(fd) => self.capture_fd(fd, leaving),
                            At::Entry(dir, name) => self.capture_entry(dir, name, leaving),
                            At::Path => self.capture_as(rel, leaving),
                            At::Linked(fd, memo) => self.capture_linked(fd, memo, leaving),
                        }
                        .map(|(state, wrote, l)| {
                            linked = l;
                            (state, wrote)
                        })
                    };
                    // A linked object's file can no longer change (its lease): the path need
                    // not stay busy while the caller removes it.
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
                    let still_pending = target.filter(|&n| {
                        h.versions
                            .get(n - 1)
                            .is_some_and(|v| v.state == VersionState::Pending)
                    });
                    let version = if let Some(n) = still_pending {
                        h.versions[n - 1].state = state;
                        h.versions[n - 1].time = time;
                        n
                    } else {
                        h.versions.push(Version {
                            since: None,
                            state,
                            time,
                        });
                        h.versions.len()
                    };
                    let v = h.versions[version - 1].clone();
                    if !h.latest_is_pending() {
                        st.open_fills.remove(rel);
                    }
                    st.note_pending(rel);
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
                        .map(|s| (s, fresh_content, linked));
                }
            }
        }
    }

    /// `session ID PID` written to ctl: PID (an agent process, e.g. from its prompt hook)
    /// becomes the root of session ID; its tree's changes are attributed to the session.
    /// ESRCH: no such process; EPERM: another user's process (the line was parsed by
    /// [`crate::history::ids::take_ctl_lines`]).
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
    pub(super) fn emit_layer1(
        &self,
        st: &mut State,
        rel: &str,
        version: u32,
        v: &Version,
        actor: Option<Actor>,
        fill: bool,
        fresh_content: bool,
    ) -> io::Result<LayerSync> {
        self.emit_backup(st, rel, backup_of(version, v, actor, fill), fresh_content)
    }

    /// Writes the Layer 1 record of `backup` for `rel` (journal, then the transcript's
    /// queue) and notes it in the model.
    fn emit_backup(
        &self,
        st: &mut State,
        rel: &str,
        backup: crate::transcript::record::TrackedFileBackup,
        fresh_content: bool,
    ) -> io::Result<LayerSync> {
        let mut backups = BTreeMap::new();
        if let Some(h) = st.paths.get_mut(rel) {
            super::model::note_layer1(h, st.next_seq, &backup);
        }
        backups.insert(rel.to_string(), backup);
        let message = st.current_message();
        let mut record = Record::snapshot_update(
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
        rec.signer.sign_record(&mut record);
        let recorded = rec.journal.append(&record, false)?;
        // The same line goes to the transcript as well.
        super::budget::charge(2 * recorded);
        rec.transcript.append(record);
        Ok(self.sync_needed(fresh_content))
    }

    /// What a record written now still needs before the change may proceed.
    pub(super) fn sync_needed(&self, fresh_content: bool) -> LayerSync {
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

    /// [`History::current_meta`] of many paths, with their xattrs' names as
    /// [`History::current_xattrs_name`] gives them, each parent directory opened once while the
    /// paths that follow share it (sorted paths mostly do): a comparison of every tracked
    /// path with the live tree then costs an `fstatat` per path, not a walk from the root
    /// and an open. Same answers: the parent is opened beneath SRC without following a
    /// symlink (a symlink or a file on the way: absent), the name is not followed either.
    pub(crate) fn current_metas<'a>(
        &self,
        rels: impl IntoIterator<Item = &'a str>,
    ) -> io::Result<std::collections::HashMap<&'a str, Option<EntryMeta>>> {
        let mut out = std::collections::HashMap::new();
        // The parent the last path had, and its fd (`None`: not in the tree).
        let mut parent: Option<(&str, Option<OwnedFd>)> = None;
        for rel in rels {
            if rel.is_empty() {
                let root = self.source_fd.as_fd();
                let meta = meta_of(&sys::fstat(root)?).map(|mut meta| {
                    meta.xattrs = xattrs_name_of(root, meta.kind);
                    meta
                });
                out.insert(rel, meta);
                continue;
            }
            let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
            if parent.as_ref().is_none_or(|(d, _)| *d != dir) {
                let fd = if dir.is_empty() {
                    Some(self.source_fd.try_clone()?)
                } else {
                    self.open_existing(dir)?
                };
                parent = Some((dir, fd));
            }
            let meta = match parent.as_ref().and_then(|(_, fd)| fd.as_ref()) {
                None => None,
                Some(fd) => {
                    let name = std::ffi::CString::new(name).map_err(|_| errno(libc::EINVAL))?;
                    match sys::fstatat(fd.as_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
                        // With its xattrs, as `History::entry_at_point` reads them for
                        // now: through the object itself (no path walk from the root).
                        Ok(st) => meta_of(&st).map(|mut meta| {
                            if matches!(meta.kind, EntryKind::File | EntryKind::Dir) {
                                meta.xattrs = entry_xattrs_name(fd.as_fd(), &name, meta.kind);
                            }
                            meta
                        }),
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::ENOENT) | Some(libc::ENOTDIR)
                            ) =>
                        {
                            None
                        }
                        Err(e) => return Err(e),
                    }
                }
            };
            out.insert(rel, meta);
        }
        Ok(out)
    }

    /// The current state of `rel` in SRC, content copied into the store. The bool says
    /// whether the store was written (so the record must be synced with it).
    pub(crate) fn capture(&self, rel: &str) -> io::Result<(VersionState, bool)> {
        self.capture_as(rel, false)
            .map(|(state, wrote, _)| (state, wrote))
    }

    /// [`History::capture`]; with `leaving` (the path is about to leave SRC) a regular file
    /// is linked into the store when it can be (store invariant 6), and the linked object
    /// comes back with it.
    #[allow(clippy::type_complexity)]
    fn capture_as(
        &self,
        rel: &str,
        leaving: bool,
    ) -> io::Result<(VersionState, bool, Option<LinkedObject<'_>>)> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok((VersionState::Absent, false, None));
        };
        self.capture_fd(fd.as_fd(), leaving)
    }

    /// [`History::capture_as`] of entry `name` of directory `dir` (not following a
    /// symlink): what is at the path being captured, absent if nothing.
    #[allow(clippy::type_complexity)]
    fn capture_entry(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        leaving: bool,
    ) -> io::Result<(VersionState, bool, Option<LinkedObject<'_>>)> {
        match sys::openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
            Ok(fd) => self.capture_fd(fd.as_fd(), leaving),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                Ok((VersionState::Absent, false, None))
            }
            Err(e) => Err(e),
        }
    }

    /// [`History::capture_as`] of the object `fd` (O_PATH, not following a symlink) refers
    /// to: what is at the path being captured.
    #[allow(clippy::type_complexity)]
    /// [`History::capture_fd`] of a hard-linked object, once for all its names: the state
    /// in `memo` if an earlier name captured it, else captured now and kept there.
    #[allow(clippy::type_complexity)]
    fn capture_linked(
        &self,
        fd: BorrowedFd<'_>,
        memo: &RefCell<Option<VersionState>>,
        leaving: bool,
    ) -> io::Result<(VersionState, bool, Option<LinkedObject<'_>>)> {
        if let Some(state) = memo.borrow().clone() {
            return Ok((state, false, None));
        }
        let captured = self.capture_fd(fd, leaving)?;
        *memo.borrow_mut() = Some(captured.0.clone());
        Ok(captured)
    }

    fn capture_fd(
        &self,
        fd: BorrowedFd<'_>,
        leaving: bool,
    ) -> io::Result<(VersionState, bool, Option<LinkedObject<'_>>)> {
        let st = sys::fstat(fd)?;
        let Some(mut meta) = meta_of(&st) else {
            return Ok((VersionState::Absent, false, None));
        };
        let mut linked = None;
        let mut xattrs = None;
        let object = match meta.kind {
            EntryKind::File => {
                let file = File::from(sys::reopen_for_reading(fd.as_raw_fd(), 0)?);
                // Through the open file: no path to resolve (see `xattrs::read_open`).
                xattrs = Some(super::xattrs::read_open(file.as_fd()));
                let obj = if leaving {
                    match self.store.put_by_link(file)? {
                        LinkPut::Copy(file) => self.store.put_file(&file)?,
                        LinkPut::Stored(obj) => obj,
                        LinkPut::Linked(l) => linked.insert(l).object().clone(),
                    }
                } else {
                    // The stat above is of this very inode: the store need not take its own.
                    self.store.put_file_stat(&file, &st)?
                };
                meta.size = obj.size;
                Some(obj.name)
            }
            EntryKind::Symlink => {
                let target = sys::readlinkat(fd, sys::EMPTY)?;
                let obj = self.store.put_bytes(&target)?;
                Some(obj.name)
            }
            _ => None,
        };
        let set = xattrs.unwrap_or_else(|| read_xattrs(fd, meta.kind));
        let (xattrs, wrote_xattrs) = self.store_xattrs(set)?;
        meta.xattrs = xattrs;
        let wrote = object.is_some() || wrote_xattrs;
        Ok((VersionState::Present { meta, object }, wrote, linked))
    }

    /// The extended attributes of the object `fd` refers to, for a version of kind `kind`,
    /// as `EntryMeta::xattrs` holds them (see [`History::store_xattrs`]). Costs a
    /// listxattr, and a getxattr per recorded name.
    pub(super) fn record_xattrs(
        &self,
        fd: BorrowedFd<'_>,
        kind: EntryKind,
    ) -> io::Result<(Option<String>, bool)> {
        self.store_xattrs(read_xattrs(fd, kind))
    }

    /// A set read for a version as `EntryMeta::xattrs` holds it: put into the store (`""`
    /// if empty, no object), `None` if it was not read. The bool says whether the store
    /// was written.
    fn store_xattrs(
        &self,
        set: Option<super::xattrs::XattrSet>,
    ) -> io::Result<(Option<String>, bool)> {
        match set {
            None => Ok((None, false)),
            Some(set) if set.is_empty() => Ok((Some(String::new()), false)),
            Some(set) => {
                let obj = self.store.put_bytes(&super::xattrs::encode(&set))?;
                Ok((Some(obj.name), true))
            }
        }
    }

    /// The name the object holding `rel`'s current extended attributes has or would have
    /// in the store (not stored): what `EntryMeta::xattrs` of a capture now would say.
    pub(crate) fn current_xattrs_name(&self, rel: &str) -> io::Result<Option<String>> {
        let Some(fd) = self.open_existing(rel)? else {
            return Ok(None);
        };
        let Some(meta) = meta_of(&sys::fstat(fd.as_fd())?) else {
            return Ok(None);
        };
        Ok(xattrs_name_of(fd.as_fd(), meta.kind))
    }
}
