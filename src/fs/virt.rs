//! The virtual `.checkpoint/` tree. Never passed through to SRC.
//!
//! ```text
//! .checkpoint/            found by lookup, hidden from readdir of the root (like ZFS's .zfs)
//! ├── ctl                 write a checkpoint id (one per line) to take a checkpoint, or
//! │                       `session ID PID` to register an agent session
//! ├── state-dir           the absolute path of this mount's state dir
//! ├── at/                 one read-only directory per checkpoint, in creation order
//! │   └── <id>/…          the whole tree as it was at that checkpoint
//! └── branches/           one writable copy-on-write tree per live branch (`super::branch`)
//!     └── <name>/…
//! ```
//!
//! Inode numbers and handles of this tree have [`VIRTUAL_BIT`] set, so they can never collide
//! with those of the passthrough tables. View nodes (`at/<id>/path`) are allocated on lookup
//! and honour the kernel's lookup counts like real inodes.
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo};

use super::{DirEntryOut, Entry, Opened, PassthroughFs, SetAttr, system_time};
use crate::history::ids::{CtlError, CtlLine, take_ctl_lines};
use crate::history::xattrs::XattrSet;
use crate::history::{Caller, ViewEntry};
use crate::sys::errno;
use crate::transcript::record::EntryKind;

pub const VIRTUAL_BIT: u64 = 1 << 63;
const CONTROL_DIR: u64 = VIRTUAL_BIT | 1;
const CTL: u64 = VIRTUAL_BIT | 2;
const STATE_DIR_FILE: u64 = VIRTUAL_BIT | 3;
const AT_DIR: u64 = VIRTUAL_BIT | 4;
const BRANCHES_DIR: u64 = VIRTUAL_BIT | 5;
const FIRST_VIEW_INO: u64 = VIRTUAL_BIT | 16;

/// Views never change once taken, so the kernel may cache them as long as it likes; the
/// control entries change (new checkpoints), so they are never cached, nor is `at/<id>`
/// (gc can drop the checkpoint).
const VIEW_TTL: Duration = Duration::from_secs(86400);
const CONTROL_TTL: Duration = Duration::ZERO;

pub fn is_virtual(ino: u64) -> bool {
    ino & VIRTUAL_BIT != 0
}

pub fn is_virtual_handle(fh: u64) -> bool {
    fh & VIRTUAL_BIT != 0
}

/// A path inside one checkpoint's view: `rel` is relative to the mount root.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ViewKey {
    checkpoint: usize,
    rel: Vec<u8>,
}

struct ViewNode {
    key: ViewKey,
    lookups: u64,
}

#[derive(Default)]
struct Views {
    by_ino: HashMap<u64, ViewNode>,
    by_key: HashMap<ViewKey, u64>,
}

enum VirtualHandle {
    /// `ctl`, open for writing.
    Ctl(Mutex<CtlState>),
    StateDir,
    /// A file in a view: the store object or the (unchanged since mount) file in SRC.
    ViewFile(File),
    /// A snapshot of a directory listing, taken at opendir: (name, kind, ino-or-0).
    Listing(Vec<(Vec<u8>, FileType)>),
}

/// What an open `ctl` holds between writes.
#[derive(Default)]
struct CtlState {
    /// The unterminated rest of the data taken so far (see [`crate::history::ids::take_ctl_lines`]),
    /// taken as the last line when the file is closed.
    pending: Vec<u8>,
    /// The offset up to which data was taken.
    next: u64,
    /// Requests that came before the one at `next`, by offset.
    ahead: std::collections::BTreeMap<u64, Vec<u8>>,
    /// Who left `pending` (or `ahead`) non-empty: the FUSE lock owner of its file table
    /// (`u64::MAX` when the kernel sent none), and the caller.
    writer: Option<(u64, Caller)>,
}

/// The most data an open `ctl` keeps waiting for an earlier request of the same write
/// (a write(2) is cut into FUSE requests of at most `fuse_adapter::MAX_WRITE`).
const MAX_CTL_AHEAD: usize = 64 << 20;

pub struct VirtualTree {
    state_dir: PathBuf,
    mounted_at: SystemTime,
    views: RwLock<Views>,
    next_ino: AtomicU64,
    handles: Mutex<HashMap<u64, Arc<VirtualHandle>>>,
    next_fh: AtomicU64,
}

impl VirtualTree {
    pub fn new(state_dir: PathBuf) -> VirtualTree {
        VirtualTree {
            state_dir,
            mounted_at: SystemTime::now(),
            views: RwLock::new(Views::default()),
            next_ino: AtomicU64::new(FIRST_VIEW_INO),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(VIRTUAL_BIT | 1),
        }
    }

    fn state_dir_contents(&self) -> Vec<u8> {
        let mut v = self.state_dir.as_os_str().as_bytes().to_vec();
        v.push(b'\n');
        v
    }

    fn fixed_attr(&self, ino: u64, kind: FileType, perm: u16, size: u64) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn fixed(&self, ino: u64) -> Option<FileAttr> {
        Some(match ino {
            CONTROL_DIR => self.fixed_attr(ino, FileType::Directory, 0o555, 0),
            // World-writable so agents running as any user can take checkpoints.
            CTL => self.fixed_attr(ino, FileType::RegularFile, 0o222, 0),
            STATE_DIR_FILE => self.fixed_attr(
                ino,
                FileType::RegularFile,
                0o444,
                self.state_dir_contents().len() as u64,
            ),
            AT_DIR | BRANCHES_DIR => self.fixed_attr(ino, FileType::Directory, 0o555, 0),
            _ => return None,
        })
    }

    pub fn control_dir_entry(&self) -> io::Result<Entry> {
        Ok(Entry {
            attr: self.fixed(CONTROL_DIR).ok_or_else(|| errno(libc::EIO))?,
            ttl: CONTROL_TTL,
            generation: 0,
        })
    }

    fn view_key(&self, ino: u64) -> io::Result<ViewKey> {
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        views
            .by_ino
            .get(&ino)
            .map(|n| n.key.clone())
            .ok_or_else(|| errno(libc::ESTALE))
    }

    fn view_inode(&self, key: ViewKey) -> u64 {
        let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&ino) = views.by_key.get(&key) {
            if let Some(node) = views.by_ino.get_mut(&ino) {
                node.lookups += 1;
            }
            return ino;
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        views.by_key.insert(key.clone(), ino);
        views.by_ino.insert(ino, ViewNode { key, lookups: 1 });
        ino
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let mut views = self.views.write().unwrap_or_else(|p| p.into_inner());
        let Some(node) = views.by_ino.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let key = node.key.clone();
            views.by_ino.remove(&ino);
            views.by_key.remove(&key);
        }
    }

    pub fn lookup(&self, fs: &PassthroughFs, parent: u64, name: &OsStr) -> io::Result<Entry> {
        let name = name.as_bytes();
        match parent {
            CONTROL_DIR => {
                let ino = match name {
                    b"ctl" => CTL,
                    b"state-dir" => STATE_DIR_FILE,
                    b"at" => AT_DIR,
                    b"branches" => BRANCHES_DIR,
                    _ => return Err(errno(libc::ENOENT)),
                };
                self.fixed(ino)
                    .map(|attr| Entry {
                        attr,
                        ttl: CONTROL_TTL,
                        generation: 0,
                    })
                    .ok_or_else(|| errno(libc::EIO))
            }
            AT_DIR => {
                let id = std::str::from_utf8(name).map_err(|_| errno(libc::ENOENT))?;
                let checkpoint = fs
                    .history()
                    .checkpoint_index(id)
                    .ok_or_else(|| errno(libc::ENOENT))?;
                // `at/<id>` itself can disappear (gc drops the checkpoint), so the kernel
                // must ask again each time; a path walk into a view then fails as soon as its
                // checkpoint is gone, whatever it cached below it.
                self.view_child(
                    fs,
                    ViewKey {
                        checkpoint,
                        rel: Vec::new(),
                    },
                )
                .map(|entry| Entry {
                    ttl: CONTROL_TTL,
                    generation: 0,
                    ..entry
                })
            }
            BRANCHES_DIR => fs
                .branches()
                .root_entry(fs.history(), OsStr::from_bytes(name)),
            CTL | STATE_DIR_FILE => Err(errno(libc::ENOTDIR)),
            _ => {
                let mut key = self.view_key(parent)?;
                if !key.rel.is_empty() {
                    key.rel.push(b'/');
                }
                key.rel.extend_from_slice(name);
                self.view_child(fs, key)
            }
        }
    }

    fn view_child(&self, fs: &PassthroughFs, key: ViewKey) -> io::Result<Entry> {
        let entry = fs
            .history()
            .view_entry(key.checkpoint, &key.rel)?
            .ok_or_else(|| errno(libc::ENOENT))?;
        let ino = self.view_inode(key);
        Ok(Entry {
            attr: view_attr(ino, &entry),
            ttl: VIEW_TTL,
            generation: 0,
        })
    }

    fn resolve(&self, fs: &PassthroughFs, ino: u64) -> io::Result<ViewEntry> {
        let key = self.view_key(ino)?;
        fs.history()
            .view_entry(key.checkpoint, &key.rel)?
            .ok_or_else(|| errno(libc::ENOENT))
    }

    pub fn getattr(&self, fs: &PassthroughFs, ino: u64) -> io::Result<(FileAttr, Duration)> {
        if let Some(attr) = self.fixed(ino) {
            return Ok((attr, CONTROL_TTL));
        }
        let entry = self.resolve(fs, ino)?;
        Ok((view_attr(ino, &entry), VIEW_TTL))
    }

    pub fn setattr(&self, ino: u64, set: SetAttr) -> io::Result<(FileAttr, Duration)> {
        // `echo id > ctl` opens with O_TRUNC, which the kernel turns into a size-0 setattr.
        if ino == CTL
            && set.size.is_none_or(|s| s == 0)
            && set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
        {
            return Ok((
                self.fixed(CTL).ok_or_else(|| errno(libc::EIO))?,
                CONTROL_TTL,
            ));
        }
        Err(errno(libc::EROFS))
    }

    pub fn readlink(&self, fs: &PassthroughFs, ino: u64) -> io::Result<Vec<u8>> {
        let entry = self.resolve(fs, ino)?;
        if entry.meta.kind != EntryKind::Symlink {
            return Err(errno(libc::EINVAL));
        }
        fs.history().view_symlink_target(&entry)
    }

    fn insert_handle(&self, h: VirtualHandle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, Arc::new(h));
        fh
    }

    fn handle(&self, fh: u64) -> io::Result<Arc<VirtualHandle>> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&fh)
            .cloned()
            .ok_or_else(|| errno(libc::EBADF))
    }

    /// The last close of a handle: what a `ctl` still holds (a last line without newline
    /// that no FLUSH of its writer took) is taken now; nobody waits for the answer, so a
    /// refusal is only logged.
    pub fn release(&self, fs: &PassthroughFs, fh: u64) {
        let handle = self
            .handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&fh);
        if let Some(handle) = handle
            && let VirtualHandle::Ctl(state) = &*handle
        {
            let writer = state.lock().unwrap_or_else(|p| p.into_inner()).writer;
            if let Some((_, caller)) = writer
                && let Err(e) = take_ctl(fs, &caller, state, 0, b"", true)
            {
                log::warn!(
                    "ctl: the last line {caller} wrote without a newline was refused at close: {e}"
                );
            }
        }
    }

    pub fn open(&self, fs: &PassthroughFs, ino: u64, flags: i32) -> io::Result<Opened> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let handle = match ino {
            CTL if flags & libc::O_ACCMODE == libc::O_WRONLY => {
                VirtualHandle::Ctl(Mutex::default())
            }
            CTL => return Err(errno(libc::EACCES)),
            STATE_DIR_FILE if !writes => VirtualHandle::StateDir,
            CONTROL_DIR | AT_DIR | BRANCHES_DIR => return Err(errno(libc::EISDIR)),
            _ if writes || flags & libc::O_TRUNC != 0 => return Err(errno(libc::EROFS)),
            STATE_DIR_FILE => return Err(errno(libc::EACCES)),
            _ => {
                let entry = self.resolve(fs, ino)?;
                match entry.meta.kind {
                    EntryKind::File => VirtualHandle::ViewFile(fs.history().view_open(&entry)?),
                    EntryKind::Dir => return Err(errno(libc::EISDIR)),
                    // FIFOs, sockets and devices are shown but not opened from a view.
                    _ => return Err(errno(libc::EACCES)),
                }
            }
        };
        let direct_io = !matches!(handle, VirtualHandle::ViewFile(_));
        // close(2) of `ctl` takes a last line written without its newline.
        let flush_on_close = matches!(handle, VirtualHandle::Ctl(_));
        Ok(Opened {
            fh: self.insert_handle(handle),
            backing: None,
            direct_io,
            keep_cache: !direct_io,
            flush_on_close,
        })
    }

    pub fn read(
        &self,
        _fs: &PassthroughFs,
        _ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        match &*self.handle(fh)? {
            VirtualHandle::StateDir => {
                let data = self.state_dir_contents();
                let start = (offset as usize).min(data.len());
                let end = (start + size as usize).min(data.len());
                out.clear();
                out.extend_from_slice(&data[start..end]);
                Ok(())
            }
            VirtualHandle::ViewFile(file) => read_at_most(file, offset, size, out),
            VirtualHandle::Ctl(_) => Err(errno(libc::EBADF)),
            VirtualHandle::Listing(_) => Err(errno(libc::EISDIR)),
        }
    }

    /// `lseek` on a view file: `SEEK_DATA`/`SEEK_HOLE` answer from the stored object, so a
    /// sparse-aware copy out of a view (`cp --sparse=auto`, rsync -S) keeps its holes. Reads
    /// use pread, so the object fd's own offset means nothing and may move.
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> io::Result<i64> {
        match &*self.handle(fh)? {
            VirtualHandle::ViewFile(file) => crate::sys::lseek(file.as_fd(), offset, whence),
            _ => Err(errno(libc::ESPIPE)),
        }
    }

    /// A write to `ctl`: each line is a checkpoint id (or `session ID PID`); a line cut
    /// across writes is kept until its newline or the close. Taken whole or refused whole:
    /// EINVAL for a malformed line, EEXIST for an id used already (or twice in the write),
    /// and then no line of it is applied. `lock_owner` identifies the writer's file table.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        fs: &PassthroughFs,
        caller: &Caller,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        lock_owner: Option<u64>,
    ) -> io::Result<u32> {
        if ino != CTL {
            return Err(errno(libc::EROFS));
        }
        let handle = self.handle(fh)?;
        let VirtualHandle::Ctl(state) = &*handle else {
            return Err(errno(libc::EBADF));
        };
        take_ctl(fs, caller, state, offset, data, false)?;
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.pending.is_empty() || !st.ahead.is_empty() {
            // Without a lock owner, no FLUSH matches: the rest is taken at the last close.
            st.writer = Some((lock_owner.unwrap_or(u64::MAX), *caller));
        }
        Ok(data.len() as u32)
    }

    /// FLUSH, at every close(2) of a descriptor of the handle: when it comes from the file
    /// table that wrote a `ctl` line without newline, that line is taken now and its error
    /// is close(2)'s. A FLUSH from elsewhere (a forked child closing its inherited copy
    /// while the writer goes on writing) takes nothing.
    pub fn flush(&self, fs: &PassthroughFs, fh: u64, lock_owner: u64) -> io::Result<()> {
        let handle = self.handle(fh)?;
        let VirtualHandle::Ctl(state) = &*handle else {
            return Ok(());
        };
        let writer = state.lock().unwrap_or_else(|p| p.into_inner()).writer;
        match writer {
            Some((owner, caller)) if owner == lock_owner => {
                take_ctl(fs, &caller, state, 0, b"", true)
            }
            _ => Ok(()),
        }
    }

    pub fn opendir(&self, fs: &PassthroughFs, ino: u64) -> io::Result<u64> {
        let dir = FileType::Directory;
        let file = FileType::RegularFile;
        let listing = match ino {
            CONTROL_DIR => vec![
                (b"ctl".to_vec(), file),
                (b"state-dir".to_vec(), file),
                (b"at".to_vec(), dir),
                (b"branches".to_vec(), dir),
            ],
            BRANCHES_DIR => fs
                .branches()
                .branches()
                .names()
                .into_iter()
                .map(|n| (n.into_bytes(), dir))
                .collect(),
            AT_DIR => fs
                .history()
                .checkpoint_ids()
                .into_iter()
                .map(|id| (id.into_bytes(), dir))
                .collect(),
            CTL | STATE_DIR_FILE => return Err(errno(libc::ENOTDIR)),
            _ => {
                let key = self.view_key(ino)?;
                let entry = fs
                    .history()
                    .view_entry(key.checkpoint, &key.rel)?
                    .ok_or_else(|| errno(libc::ENOENT))?;
                if entry.meta.kind != EntryKind::Dir {
                    return Err(errno(libc::ENOTDIR));
                }
                fs.history()
                    .view_list(key.checkpoint, &key.rel)?
                    .into_iter()
                    .map(|(name, kind)| (name, file_type_of(kind)))
                    .collect()
            }
        };
        Ok(self.insert_handle(VirtualHandle::Listing(listing)))
    }

    fn listing(&self, fh: u64) -> io::Result<Arc<VirtualHandle>> {
        let h = self.handle(fh)?;
        match &*h {
            VirtualHandle::Listing(_) => Ok(h),
            _ => Err(errno(libc::ENOTDIR)),
        }
    }

    /// Offsets: see [`emit_listing`].
    pub fn readdir(
        &self,
        _fs: &PassthroughFs,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>) -> bool,
    ) -> io::Result<()> {
        let h = self.listing(fh)?;
        let VirtualHandle::Listing(items) = &*h else {
            return Err(errno(libc::ENOTDIR));
        };
        emit_listing(ino, items, offset, emit);
        Ok(())
    }

    pub fn readdirplus(
        &self,
        fs: &PassthroughFs,
        ino: u64,
        fh: u64,
        offset: i64,
        emit: &mut dyn FnMut(DirEntryOut<'_>, Option<&Entry>) -> bool,
    ) -> io::Result<()> {
        let h = self.listing(fh)?;
        let VirtualHandle::Listing(items) = &*h else {
            return Err(errno(libc::ENOTDIR));
        };
        emit_listing_plus(
            ino,
            items,
            offset,
            &|name| self.lookup(fs, ino, OsStr::from_bytes(name)),
            &|ino| fs.forget(ino, 1),
            emit,
        );
        Ok(())
    }

    /// GETXATTR of a virtual inode: a view shows the xattrs recorded for its version
    /// (`History::view_xattrs`); with FUSE_POSIX_ACL the kernel takes the view's ACL from
    /// here and enforces it as on the live tree. The control files have none.
    pub fn getxattr(
        &self,
        fs: &PassthroughFs,
        ino: u64,
        name: &OsStr,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let set = self.xattrs(fs, ino)?;
        let value = set
            .get(name.as_bytes())
            .ok_or_else(|| errno(libc::ENODATA))?;
        copy_xattr_reply(value, buf)
    }

    /// LISTXATTR of a virtual inode (see [`VirtualTree::getxattr`]).
    pub fn listxattr(&self, fs: &PassthroughFs, ino: u64, buf: &mut [u8]) -> io::Result<usize> {
        let set = self.xattrs(fs, ino)?;
        let mut names = Vec::new();
        for name in set.keys() {
            names.extend_from_slice(name);
            names.push(0);
        }
        copy_xattr_reply(&names, buf)
    }

    fn xattrs(&self, fs: &PassthroughFs, ino: u64) -> io::Result<XattrSet> {
        if self.fixed(ino).is_some() {
            return Ok(XattrSet::new());
        }
        let key = self.view_key(ino)?;
        let entry = self.resolve(fs, ino)?;
        fs.history().view_xattrs(&key.rel, &entry)
    }

    pub fn access(&self, ino: u64, mask: i32) -> io::Result<()> {
        if mask & libc::W_OK != 0 && ino != CTL {
            return Err(errno(libc::EROFS));
        }
        Ok(())
    }
}

/// Reads up to `size` bytes of `file` at `offset` into `out` (shorter only at EOF).
pub fn read_at_most(file: &File, offset: u64, size: u32, out: &mut Vec<u8>) -> io::Result<()> {
    out.resize(size as usize, 0);
    let mut filled = 0;
    while filled < out.len() {
        let n = file.read_at(&mut out[filled..], offset + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    out.truncate(filled);
    Ok(())
}

/// READDIR of a listing snapshot after `offset`: 1 = after ".", 2 = after "..",
/// 2 + i + 1 = after listing entry i. Inode numbers are informational (lookups give the
/// real ones).
pub fn emit_listing(
    ino: u64,
    items: &[(Vec<u8>, FileType)],
    offset: i64,
    emit: &mut dyn FnMut(DirEntryOut<'_>) -> bool,
) {
    let dots: [(&[u8], FileType); 2] = [(b".", FileType::Directory), (b"..", FileType::Directory)];
    let mut pos = offset.max(0) as usize;
    while pos < 2 + items.len() {
        let (name, kind) = if pos < 2 {
            dots[pos]
        } else {
            let (n, k) = &items[pos - 2];
            (n.as_slice(), *k)
        };
        let full = emit(DirEntryOut {
            ino: ino & !VIRTUAL_BIT,
            offset: (pos + 1) as i64,
            kind,
            name,
        });
        if full {
            break;
        }
        pos += 1;
    }
}

/// READDIRPLUS of a listing snapshot (offsets as [`emit_listing`]): each entry looked up
/// with `lookup` (skipped if it went meanwhile), its lookup given back with `forget` when
/// the reply had no room for it.
pub fn emit_listing_plus(
    ino: u64,
    items: &[(Vec<u8>, FileType)],
    offset: i64,
    lookup: &dyn Fn(&[u8]) -> io::Result<Entry>,
    forget: &dyn Fn(u64),
    emit: &mut dyn FnMut(DirEntryOut<'_>, Option<&Entry>) -> bool,
) {
    let mut pos = offset.max(0) as usize;
    while pos < 2 + items.len() {
        if pos < 2 {
            let name: &[u8] = if pos == 0 { b"." } else { b".." };
            let out = DirEntryOut {
                ino: ino & !VIRTUAL_BIT,
                offset: (pos + 1) as i64,
                kind: FileType::Directory,
                name,
            };
            if emit(out, None) {
                break;
            }
            pos += 1;
            continue;
        }
        let (name, kind) = &items[pos - 2];
        let Ok(entry) = lookup(name) else {
            pos += 1;
            continue;
        };
        let out = DirEntryOut {
            ino: entry.attr.ino.0,
            offset: (pos + 1) as i64,
            kind: *kind,
            name,
        };
        if emit(out, Some(&entry)) {
            forget(entry.attr.ino.0);
            break;
        }
        pos += 1;
    }
}

/// An xattr reply: `value`'s length when `buf` is empty (the size query), else `value`
/// copied into `buf`, ERANGE if it does not fit.
fn copy_xattr_reply(value: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    if buf.is_empty() {
        return Ok(value.len());
    }
    let dst = buf
        .get_mut(..value.len())
        .ok_or_else(|| errno(libc::ERANGE))?;
    dst.copy_from_slice(value);
    Ok(value.len())
}

/// Takes what a write at `offset` (or, with `at_close`, the close) completes. One
/// write(2) larger than a FUSE request comes as several requests, which may be served
/// concurrently and out of order: data is taken in offset order, a request ahead of
/// the next expected offset waits in the handle. A write at an earlier offset (O_APPEND,
/// where every offset is 0, or a pwrite) is taken as the next data.
fn take_ctl(
    fs: &PassthroughFs,
    caller: &Caller,
    state: &Mutex<CtlState>,
    offset: u64,
    data: &[u8],
    at_close: bool,
) -> io::Result<()> {
    // Held while the lines are applied too, on purpose: only writes to this same open
    // `ctl` wait on it, and their checkpoints must be taken in the order written.
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    log::debug!(
        "ctl: {} bytes at {offset} (taken up to {}, {} requests ahead, close {at_close})",
        data.len(),
        st.next,
        st.ahead.len()
    );
    if !at_close && offset > st.next {
        let waiting: usize = st.ahead.values().map(Vec::len).sum();
        if waiting + data.len() > MAX_CTL_AHEAD {
            log::warn!(
                "ctl: refused a write from {caller}: more than {MAX_CTL_AHEAD} bytes ahead of a gap"
            );
            return Err(errno(libc::EINVAL));
        }
        st.ahead.insert(offset, data.to_vec());
        return Ok(());
    }
    let mut next = if at_close {
        st.next
    } else {
        st.next.max(offset + data.len() as u64)
    };
    let mut all = data.to_vec();
    let mut drained = Vec::new();
    for (&at, chunk) in &st.ahead {
        if at != next && !(at_close || at < next) {
            break;
        }
        all.extend_from_slice(chunk);
        next = next.max(at + chunk.len() as u64);
        drained.push(at);
    }
    let batch = take_ctl_lines(&st.pending, &all, at_close).map_err(|e| {
        let (why, code) = match e {
            CtlError::Invalid(why) => (why, libc::EINVAL),
            CtlError::Repeated(id) => (format!("id {id} twice"), libc::EEXIST),
        };
        log::warn!("ctl: refused a write from {caller} (nothing taken): {why}");
        errno(code)
    })?;
    let history = fs.history();
    if let Some(CtlLine::Checkpoint(id)) = batch
        .lines
        .iter()
        .find(|l| matches!(l, CtlLine::Checkpoint(id) if history.checkpoint_index(id).is_some()))
    {
        log::warn!("ctl: refused a write from {caller} (nothing taken): {id} exists");
        return Err(errno(libc::EEXIST));
    }
    // Each line costs the owner's state dir a record: another user's are counted against
    // their budget, and refused whole past it (`history::budget`).
    if let Err(e) = history
        .budgets()
        .charge_ctl_lines(caller.uid, batch.lines.len() as u64)
    {
        log::debug!("ctl: refused a write from {caller} (nothing taken): over its budget");
        return Err(e);
    }
    st.pending = batch.rest;
    st.next = next;
    if at_close {
        st.writer = None;
    }
    for at in drained {
        st.ahead.remove(&at);
    }
    // The session the writer belongs to (the Claude Code hook is a descendant of its
    // agent), looked up once per batch, after any registration the batch itself makes.
    let mut session: Option<Option<String>> = None;
    for line in batch.lines {
        match line {
            CtlLine::Session { id, pid } => {
                history.register_session(caller, &id, pid)?;
                session = None;
            }
            CtlLine::Checkpoint(id) => {
                let session = session
                    .get_or_insert_with(|| history.session_of(caller.pid))
                    .clone();
                fs.checkpoint(&id, session)?;
            }
        }
    }
    Ok(())
}

/// The attributes of a view entry (also a branch's lower entries).
pub fn view_attr(ino: u64, e: &ViewEntry) -> FileAttr {
    let m = &e.meta;
    let kind = file_type_of(m.kind);
    FileAttr {
        ino: INodeNo(ino),
        size: m.size,
        blocks: m.size.div_ceil(512),
        atime: system_time(m.mtime_sec, i64::from(m.mtime_nsec)),
        mtime: system_time(m.mtime_sec, i64::from(m.mtime_nsec)),
        ctime: system_time(m.mtime_sec, i64::from(m.mtime_nsec)),
        crtime: system_time(m.mtime_sec, i64::from(m.mtime_nsec)),
        kind,
        perm: (m.mode & 0o7777) as u16,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid: m.uid,
        gid: m.gid,
        rdev: m.rdev.unwrap_or(0) as u32,
        blksize: 4096,
        flags: 0,
    }
}

pub fn file_type_of(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Fifo => FileType::NamedPipe,
        EntryKind::Socket => FileType::Socket,
        EntryKind::CharDevice => FileType::CharDevice,
        EntryKind::BlockDevice => FileType::BlockDevice,
    }
}
