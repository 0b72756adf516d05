//! Reading the tree as it was at a checkpoint (the `.checkpoint/at/<id>/` views, diff and
//! rewind all use this).
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use super::CONTROL_DIR_NAME;
use super::model::Resolved;
use super::{History, VersionState};
use crate::sys::{self, errno};
use crate::transcript::record::{EntryKind, EntryMeta};

/// Where a view entry's content comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum ViewContent {
    /// Directories and special files.
    None,
    /// A store object (file content or symlink target).
    Object(String),
    /// The path in SRC (relative to its root), unchanged since the mount. Opened beneath
    /// SRC's root fd with no symlink followed, never by its absolute path: a user who can
    /// rename directories in the tree must not make a view read outside it.
    Live(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ViewEntry {
    pub meta: EntryMeta,
    pub content: ViewContent,
}

/// The view entry of a stored state.
fn present(meta: EntryMeta, object: Option<String>) -> ViewEntry {
    ViewEntry {
        meta,
        content: object.map_or(ViewContent::None, ViewContent::Object),
    }
}

impl History {
    /// `rel` (relative to the mount root, "" for the root) at checkpoint `k`, or `None` when
    /// it did not exist then.
    pub fn view_entry(&self, k: usize, rel: &[u8]) -> io::Result<Option<ViewEntry>> {
        self.entry_at(Some(k), rel)
    }

    /// Like `view_entry`; `None` for `at` means the origin: the tree before anything was
    /// changed through the mount (every tracked path at its v1).
    pub fn entry_at(&self, at: Option<usize>, rel: &[u8]) -> io::Result<Option<ViewEntry>> {
        let Some(rel) = super::rel_key(rel) else {
            return self.live_entry_bytes(rel);
        };
        if rel.split('/').next().map(str::as_bytes) == Some(CONTROL_DIR_NAME) {
            return Ok(None);
        }
        loop {
            let st = self.lock();
            if at.is_some_and(|k| k < st.first_kept) {
                // A view of a checkpoint gc dropped (the kernel may still cache its inode).
                return Err(errno(libc::ENOENT));
            }
            // The name whose version holds the state (`rel`, or the name it moved to).
            let (path, n) = match st.resolve(rel, at) {
                Resolved::Live(q) => {
                    drop(st);
                    return self.live_entry(&q);
                }
                Resolved::State(VersionState::Present { meta, object }) => {
                    return Ok(Some(present(meta, object)));
                }
                Resolved::State(VersionState::Absent) => return Ok(None),
                // A pre-image entry is never pending (replay refuses one).
                Resolved::State(VersionState::Pending) => return Err(errno(libc::EIO)),
                Resolved::Version { path, n } => (path, n),
            };
            let h = &st.paths[&path];
            let v = &h.versions[n - 1];
            match &v.state {
                VersionState::Absent => return Ok(None),
                VersionState::Present { meta, object } => {
                    return Ok(Some(present(meta.clone(), object.clone())));
                }
                // An older version is pending only while the copy that fills it is under
                // way (see `State::open_fills`): wait for it.
                VersionState::Pending if n < h.versions.len() && st.busy.contains(&path) => {
                    drop(self.busy_cond.wait(st).unwrap_or_else(|p| p.into_inner()));
                }
                // Otherwise no fill could ever reach it.
                VersionState::Pending if n < h.versions.len() => {
                    static LOGGED: std::sync::atomic::AtomicBool =
                        std::sync::atomic::AtomicBool::new(false);
                    super::open_files::log_once(&LOGGED, || {
                        format!(
                            "{path}: version {n} of {} is pending, which only the latest may \
                             be (a bug: its view answers EIO)",
                            h.versions.len()
                        )
                    });
                    return Err(errno(libc::EIO));
                }
                // Unchanged since that checkpoint: copy it now so the view can never see a
                // later change, then look again.
                VersionState::Pending => {
                    drop(st);
                    self.fill_if_pending(&path)?;
                }
            }
        }
    }

    /// `rel` as it is in SRC now (untracked paths in a view; the live side of a diff).
    pub(crate) fn live_entry(&self, rel: &str) -> io::Result<Option<ViewEntry>> {
        self.live_entry_bytes(rel.as_bytes())
    }

    fn live_entry_bytes(&self, rel: &[u8]) -> io::Result<Option<ViewEntry>> {
        let Ok(rel_str) = std::str::from_utf8(rel) else {
            return Ok(None);
        };
        Ok(live_view_entry(rel_str, self.current_meta(rel_str)?))
    }

    /// Names and kinds in directory `rel` at checkpoint `k`, sorted by name.
    pub fn view_list(&self, k: usize, rel: &[u8]) -> io::Result<Vec<(Vec<u8>, EntryKind)>> {
        let rel_s = super::rel_key(rel).ok_or_else(|| errno(libc::ENOENT))?;
        let mut out: BTreeMap<Vec<u8>, EntryKind> = BTreeMap::new();
        // The tracked children of every name the directory's content passed through since
        // `k`, and the live directory holding it now (format 4: renames move content).
        let (tracked, live_dir, renamed) = {
            let st = self.lock();
            if k < st.first_kept {
                return Err(errno(libc::ENOENT));
            }
            let (names, live_dir) = st.dir_sources(rel_s, k);
            let mut tracked: Vec<String> = names
                .iter()
                .filter_map(|n| st.children.get(n))
                .flatten()
                .cloned()
                .collect();
            tracked.sort();
            tracked.dedup();
            (tracked, live_dir, st.renamed_since(k))
        };
        // Untracked entries are unchanged since the mount, so they exist at every checkpoint
        // (where the directory's content is now; with a rename since `k`, each is checked
        // by its own lookup, as what it holds may have come or gone by a rename).
        if let Some(fd) = live_dir.and_then(|d| self.open_beneath(&d).ok()) {
            let dir_st = sys::fstat(fd.as_fd())?;
            if dir_st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                let mut stream = sys::DirStream::open(fd.as_fd(), true)?;
                while let Some(e) = stream.next_entry()? {
                    if e.name == b"." || e.name == b".." {
                        continue;
                    }
                    if rel_s.is_empty() && e.name == CONTROL_DIR_NAME {
                        continue;
                    }
                    let name = e.name.to_vec();
                    if let Ok(n) = std::str::from_utf8(&name)
                        && tracked.binary_search_by(|t| t.as_str().cmp(n)).is_ok()
                    {
                        continue;
                    }
                    let child = join(rel_s, &name);
                    if renamed {
                        if let Some(e) = self.view_entry(k, &child)? {
                            out.insert(name, e.meta.kind);
                        }
                        continue;
                    }
                    let kind = match e.d_type {
                        libc::DT_DIR => EntryKind::Dir,
                        libc::DT_LNK => EntryKind::Symlink,
                        libc::DT_FIFO => EntryKind::Fifo,
                        libc::DT_SOCK => EntryKind::Socket,
                        libc::DT_CHR => EntryKind::CharDevice,
                        libc::DT_BLK => EntryKind::BlockDevice,
                        libc::DT_REG => EntryKind::File,
                        _ => match self.view_entry(k, &child)? {
                            Some(e) => e.meta.kind,
                            None => continue,
                        },
                    };
                    out.insert(name, kind);
                }
            }
        }
        for name in tracked {
            let child = join(rel_s, name.as_bytes());
            if let Some(e) = self.view_entry(k, &child)? {
                out.insert(name.into_bytes(), e.meta.kind);
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Opens a view file for reading.
    pub fn view_open(&self, e: &ViewEntry) -> io::Result<File> {
        match &e.content {
            ViewContent::Object(name) => stored(name, self.store().open_object(name)),
            ViewContent::Live(rel) => {
                let fd = self.live_object(rel, libc::S_IFREG)?;
                use std::os::fd::AsRawFd;
                Ok(File::from(sys::reopen_for_reading(fd.as_raw_fd(), 0)?))
            }
            ViewContent::None => Err(errno(libc::EISDIR)),
        }
    }

    pub fn view_symlink_target(&self, e: &ViewEntry) -> io::Result<Vec<u8>> {
        match &e.content {
            ViewContent::Object(name) => stored(name, self.store().read_object(name)),
            ViewContent::Live(rel) => {
                let fd = self.live_object(rel, libc::S_IFLNK)?;
                sys::readlinkat(fd.as_fd(), sys::EMPTY)
            }
            ViewContent::None => Err(errno(libc::EINVAL)),
        }
    }

    /// An O_PATH fd on `rel` in SRC, opened beneath its root without following any symlink,
    /// and checked to be of type `kind` (`S_IFREG`, `S_IFLNK`) after the open: the entry's
    /// metadata was read earlier, and the path may have been swapped since. ENOENT if it is
    /// gone or changed type.
    fn live_object(&self, rel: &str, kind: u32) -> io::Result<std::os::fd::OwnedFd> {
        let fd = self
            .open_existing(rel)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        if sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT != kind {
            return Err(errno(libc::ENOENT));
        }
        Ok(fd)
    }

    /// Reads a view entry's whole content (files and symlink targets).
    pub fn view_read_all(&self, e: &ViewEntry) -> io::Result<Vec<u8>> {
        match e.meta.kind {
            EntryKind::Symlink => self.view_symlink_target(e),
            EntryKind::File => {
                let mut f = self.view_open(e)?;
                let mut buf = Vec::new();
                io::Read::read_to_end(&mut f, &mut buf)?;
                Ok(buf)
            }
            _ => Ok(Vec::new()),
        }
    }
}

/// A read of store object `name`, which the history names: an object missing from the
/// store is damage, reported as EIO with one log line naming it (the first time), never as
/// ENOENT, which would say that the file a view lists does not exist. A damaged pack entry
/// is EIO already, logged by the store when it dropped it.
pub(crate) fn stored<T>(name: &str, read: io::Result<T>) -> io::Result<T> {
    static REPORTED: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    match read {
        Err(e) if sys::os_error(&e) == Some(libc::ENOENT) => {
            let first = REPORTED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.to_string());
            if first {
                log::error!("store: object {name} is missing, though the history refers to it");
            }
            Err(sys::context(
                format!("store: object {name} is missing"),
                errno(libc::EIO),
            ))
        }
        other => other,
    }
}

pub(crate) fn join(parent: &str, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        v.extend_from_slice(parent.as_bytes());
        v.push(b'/');
    }
    v.extend_from_slice(name);
    v
}

/// The view entry of live path `rel` whose attributes are `meta` (`None`: absent).
pub(crate) fn live_view_entry(rel: &str, meta: Option<EntryMeta>) -> Option<ViewEntry> {
    let meta = meta?;
    let content = match meta.kind {
        EntryKind::File | EntryKind::Symlink => ViewContent::Live(rel.to_string()),
        _ => ViewContent::None,
    };
    Some(ViewEntry { meta, content })
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their trees directly"
)]
mod tests {
    use crate::history::{HistoryConfig, open_history_readonly};

    /// A view entry of an untracked file, made while its directory was real, is opened after
    /// the directory was swapped for a symlink to a root-only directory (the race of issue
    /// 11, item 3, made deterministic): the open fails instead of reading outside the tree.
    #[test]
    fn a_live_entry_is_never_read_through_a_swapped_in_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let (src, state, secret) = (
            dir.path().join("src"),
            dir.path().join("state"),
            dir.path().join("secret"),
        );
        for d in [&src, &state, &secret] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::create_dir(src.join("d")).unwrap();
        std::fs::write(src.join("d/x"), "public\n").unwrap();
        std::fs::write(secret.join("x"), "SECRET\n").unwrap();
        let history = open_history_readonly(HistoryConfig {
            source: src.clone(),
            root: None,
            state_dir: state,
            exclusions: Default::default(),
            durability: Default::default(),
        })
        .unwrap();
        let file = history.live_entry("d/x").unwrap().expect("d/x exists");
        assert_eq!(history.view_read_all(&file).unwrap(), b"public\n");
        std::fs::rename(src.join("d"), src.join("d.moved")).unwrap();
        std::os::unix::fs::symlink(&secret, src.join("d")).unwrap();
        let read = history.view_read_all(&file);
        assert!(read.is_err(), "read through the symlink: {read:?}");
    }
}
