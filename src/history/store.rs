//! The content-addressed object store that holds pre-image backups (`STATE/backups/`).
//!
//! An object is named by the lowercase hex SHA-256 of its content. Identical content is
//! therefore stored once, and a name says everything needed to find and check an object.
//! Objects of at most [`pack::MAX_ENTRY`] bytes without holes are appended to pack files
//! (`DIR/pack-<n>`, see [`pack`] and its own invariants): a backup of a small file is then
//! one `pwrite`, not a file creation. Bigger objects, and sparse ones, are plain files named
//! `DIR/<64 hex>` (where a reflink can share their extents and their holes are kept); the
//! invariants below are theirs.
//!
//! # Invariants
//!
//! 1. **A name always matches its content.** An object is never written in place: bytes go to
//!    a private temp file in the same directory, the hash is taken of exactly the bytes that
//!    landed there, and only then is the temp renamed onto `<hash>`. Objects are made read-only
//!    (mode 0400) so nobody edits one by accident.
//! 2. **A successful put is durable — or, with a deferred [`SyncPolicy`], in the page cache
//!    and known to the caller's sync.** With [`SyncPolicy::EachPut`] the temp's data (and
//!    mode) are fsynced *before* the rename, so after a crash a visible `<hash>` is always
//!    complete; the directory is fsynced *after* the rename, so the name itself survives a
//!    crash. The directory is fsynced even when the object already existed, because it may
//!    have been renamed into place a moment ago by another thread that has not yet fsynced
//!    the directory. With [`SyncPolicy::Batched`] or [`SyncPolicy::Caller`] a put does no
//!    sync: the object is complete in the page cache (which survives the death of this
//!    process, not a power loss) and is made durable by [`Store::sync_batch`] (batched: the
//!    store remembers what it wrote) or [`Store::sync_filesystem`]. Until then a power loss
//!    can leave a name whose content is short or missing; `verify` detects it.
//! 3. **A failed put leaves nothing behind and keeps its errno.** On any error the temp file is
//!    unlinked and the original `io::Error` is returned unchanged (no wrapping), so an `ENOSPC`
//!    reaches the FUSE caller as `ENOSPC`. The one exception is a failure of the final
//!    directory fsync: the object is then complete and valid (see 1) and stays, but the put
//!    still fails because its name is not known to be durable.
//! 4. **Crash leftovers are cleaned, in-flight temps are not.** Temp files are named
//!    `.tmp-<pid>-<counter>` and are held under `flock(LOCK_EX)` for their whole life.
//!    [`Store::open`] removes only temps whose lock it can take, i.e. those whose writer is
//!    gone. This keeps a second `Store` on the same directory (another process, e.g. a CLI
//!    reading backups while the daemon runs, or another instance in this process) from
//!    deleting a backup that is being written.
//!
//! 5. **Holes are kept.** An object is the file's logical content (holes read as zeros and
//!    hash as zeros), but only its data extents are stored: copies walk the source with
//!    `SEEK_DATA`/`SEEK_HOLE` and write data at its offset, so the store holds allocated data
//!    only. A rewind writes an object back the same way (`crate::rewind`, data extents
//!    only).
//! 6. **A linked object is invariant 1 by other means.** A file leaving SRC (unlinked or
//!    replaced by a rename) may become an object by a hard link instead of a copy
//!    ([`Store::put_by_link`]); its name is still the hash of exactly its content, which a
//!    read lease keeps fixed until the inode is the store's alone (see [`linked`]'s own
//!    invariants), else it is replaced by a copy.
//!
//! Removal ([`Store::remove`]) is not coordinated with puts: a caller that garbage-collects
//! objects must make sure nothing still refers to them (a put that reports `reused` relies on
//! the existing object staying). gc's removals are: it dooms the objects with mutations
//! excluded ([`Store::doom`]) and removes them with mutations running ([`Removals::run`]);
//! a put of a doomed object's content meanwhile claims it, and gc keeps it (see [`doomed`]).

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::{DirBuilder, File, OpenOptions, Permissions, TryLockError};
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use base16ct::lower as hex;
use sha2::{Digest, Sha256};

mod doomed;
mod linked;
mod pack;

pub use linked::{LinkPut, LinkedObject};

/// Size of the single copy/hash buffer used by one `put_file` call.
const BUF_SIZE: usize = 1 << 20;
/// Length of an object name: 32 bytes of SHA-256 as hex.
pub const OBJECT_NAME_LEN: usize = 64;
/// Prefix of temp files; object names are pure hex, so the two can never collide.
const TEMP_PREFIX: &str = ".tmp-";
/// Mode of a stored object: read-only, owner only (backups may hold private file content).
const OBJECT_MODE: u32 = 0o400;
/// Mode of a temp file while it is being written.
const TEMP_MODE: libc::mode_t = 0o600;
/// Mode of the store directory when `open` has to create it.
const DIR_MODE: u32 = 0o700;
/// How many temp names `create_temp` tries before giving up (each clash is an `EEXIST`).
const TEMP_ATTEMPTS: u32 = 128;

/// Process-wide, so two `Store`s on the same directory in one process never pick the same
/// temp name (the pid part is the same for both).
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A content-addressed store in one directory. `Send + Sync`: puts from several threads may
/// run at once.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    /// The store directory opened `O_DIRECTORY`: all object operations are relative to it
    /// (`openat`, `renameat`, ...), and it is what gets fsynced to make names durable.
    dir_fd: File,
    policy: SyncPolicy,
    /// Objects renamed into place and not yet synced ([`SyncPolicy::Batched`] only). Lock
    /// order: a leaf, never held across a sync (the list is taken out first).
    unsynced: Mutex<Vec<CString>>,
    /// The small objects.
    packs: pack::Packs,
    /// Objects up to this size go into a pack (`None`: none do, for tests of the plain-file
    /// path).
    pack_limit: Option<u64>,
    /// What gc is removing: every put claims its content's name here before it looks for
    /// an existing object.
    doomed: doomed::Doomed,
}

/// Objects gc doomed ([`Store::doom`]), to remove with mutations running. Dropped before
/// [`Removals::run`] ends (an error, a panic), the objects not yet removed are kept.
pub struct Removals<'s> {
    store: &'s Store,
    objects: Vec<(String, u64)>,
}

impl Removals<'_> {
    /// Removes each object no put has claimed since it was doomed; returns how many were
    /// removed and their bytes. `progress(done, total)` is called as it goes.
    pub fn run(self, progress: &mut dyn FnMut(usize, usize)) -> io::Result<(usize, u64)> {
        let (mut removed, mut bytes) = (0, 0);
        let total = self.objects.len();
        for (i, (name, size)) in self.objects.iter().enumerate() {
            if self.store.doomed.begin_removal(name) {
                let result = self.store.remove(name);
                self.store.doomed.end_removal(name);
                match result {
                    Ok(()) => {
                        removed += 1;
                        bytes += size;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!(
                                "gc: removing store object {name} in {}: {e} (the transcript \
                                 is already compacted; run gc again to remove the rest)",
                                self.store.dir.display()
                            ),
                        ));
                    }
                }
            }
            progress(i + 1, total);
        }
        Ok((removed, bytes))
    }
}

impl Drop for Removals<'_> {
    fn drop(&mut self) {
        self.store.doomed.clear();
    }
}

/// When a put's object reaches the disk (see invariant 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Each put fsyncs the object and the directory before it returns.
    EachPut,
    /// Puts do not sync; they remember the objects they wrote for [`Store::sync_batch`].
    Batched,
    /// Puts do not sync and remember nothing: the caller syncs the filesystem
    /// ([`Store::sync_filesystem`]) when it needs to.
    Caller,
}

/// Above this many objects to sync, one `syncfs` is cheaper than one fdatasync each (each
/// of which waits for its own journal commit on ext4).
const SYNCFS_THRESHOLD: usize = 4;

/// The result of a put.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    /// The object's name: lowercase hex SHA-256 of its content.
    pub name: String,
    /// Content length in bytes.
    pub size: u64,
    /// true when the object already existed (nothing new stored)
    pub reused: bool,
    /// how the copy was made
    pub method: CopyMethod,
}

/// Charges the new bytes of a put to whoever pays on this thread (see `budget`): its content,
/// or the blocks its source had allocated if fewer (holes are kept, invariant 5); nothing for
/// an object that was there already or shares its extents with the source (reflink).
fn charge_new_content(stored: &StoredObject, allocated: u64) {
    if !stored.reused && stored.method != CopyMethod::Reflink {
        crate::history::budget::charge(stored.size.min(allocated));
    }
}

/// How the bytes of a put reached the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// `ioctl(FICLONE)`: the object shares extents with the source (btrfs, XFS).
    Reflink,
    /// The bytes were copied through userspace.
    Copy,
    /// The bytes were appended to a pack (a small object).
    Packed,
    /// An object with this content was already stored; nothing new was kept.
    Existing,
    /// The file's own inode was linked into the store as it left SRC ([`linked`]).
    Linked,
}

/// Whether `name` is a well-formed object name: exactly 64 lowercase hex digits.
pub fn is_object_name(name: &str) -> bool {
    name.len() == OBJECT_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Store {
    /// Opens (creating with mode 0700 if needed) the store at `dir`; removes leftover temp
    /// files from a crash.
    ///
    /// Missing parent directories are created too (also 0700), and the parent of every
    /// directory created here is fsynced so the store itself survives a crash. Temp files that
    /// are still locked by a live writer are left alone (see the module docs).
    pub fn open(dir: &Path) -> io::Result<Store> {
        Store::open_with(dir, SyncPolicy::EachPut)
    }

    /// [`Store::open`] with a choice of when puts reach the disk. With a deferring policy the
    /// whole filesystem is synced once here, so objects that an earlier process left in the
    /// page cache (killed before its sync) are durable before anything refers to them anew.
    pub fn open_with(dir: &Path, policy: SyncPolicy) -> io::Result<Store> {
        create_dir_durably(dir)?;
        let dir_fd = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)?;
        let names: Vec<Vec<u8>> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.file_name().as_bytes().to_vec()))
            .collect();
        let packs = pack::Packs::open(&dir_fd, &names)?;
        let store = Store {
            dir: dir.to_path_buf(),
            dir_fd,
            policy,
            unsynced: Mutex::new(Vec::new()),
            packs,
            pack_limit: Some(pack::MAX_ENTRY),
            doomed: doomed::Doomed::default(),
        };
        store.remove_stale_temps()?;
        if policy != SyncPolicy::EachPut {
            store.sync_filesystem()?;
            // The daemon's store (a deferring policy): leaves an index beside every closed
            // pack that lacks one, for the next open.
            store.packs.write_indexes(&store.dir_fd);
        }
        Ok(store)
    }

    /// Stores the whole content of `src` (read from offset 0 to EOF with pread; the fd's file
    /// offset is left where it was, so do not use the same fd concurrently).
    ///
    /// First tries a reflink (`FICLONE`), which shares extents instead of copying when `src`
    /// and the store are on the same btrfs/XFS. The object is then hashed by reading the
    /// *clone*, not `src`: the clone is a frozen snapshot, while `src` could change between
    /// the clone and the read, and the name must match what was stored. Without a reflink the
    /// bytes are copied with pread into one 1 MiB buffer that feeds the hash and the write in
    /// the same pass, so the data is read once. A file that grows or shrinks meanwhile is
    /// copied up to the EOF that pread sees; whatever was copied is what gets named and kept.
    ///
    /// Holes are kept (invariant 5): the copy walks `src` with `SEEK_DATA`/`SEEK_HOLE`, writes
    /// only the data extents, at their offsets, and sets the length at the end; holes are
    /// hashed as zeros without being read. So a 1 GiB file with 4 KiB of data costs 4 KiB of
    /// store space (and the time to hash 1 GiB of zeros).
    ///
    /// `src` must be open for reading. Errors are returned with their raw errno.
    pub fn put_file(&self, src: &File) -> io::Result<StoredObject> {
        self.put_file_seen(src, None)
    }

    /// [`Store::put_file`] of a file the caller has just stat'ed (`st`, of the same inode):
    /// the store takes its size and allocated blocks from it instead of a stat of its own.
    /// They only choose between a pack and a file; a file that changed since is still
    /// stored whole, up to the EOF its reads see.
    pub fn put_file_stat(&self, src: &File, st: &libc::stat) -> io::Result<StoredObject> {
        let seen = (
            u64::try_from(st.st_size).unwrap_or(0),
            u64::try_from(st.st_blocks).unwrap_or(0),
        );
        self.put_file_seen(src, Some(seen))
    }

    /// `seen`: the size and 512-byte blocks of `src` if the caller knows them.
    fn put_file_seen(&self, src: &File, seen: Option<(u64, u64)>) -> io::Result<StoredObject> {
        // Budget (see `budget`): the blocks the copy can take, before it is made; a stat
        // only when another user pays (the owner's backups need none).
        let allocated = || match seen {
            Some((_, blocks)) => Ok(blocks * 512),
            None => crate::sys::fstat(src.as_fd())
                .map(|st| u64::try_from(st.st_blocks).unwrap_or(0) * 512),
        };
        crate::history::budget::check_room_with(allocated)?;
        let stored = match self.read_if_packable(src, seen)? {
            Some(data) => self.put_packed(&data)?,
            None => self.put_file_impl(src, true)?,
        };
        // The content's length bounds the charge where the blocks are unknown.
        charge_new_content(&stored, seen.map_or(u64::MAX, |(_, blocks)| blocks * 512));
        Ok(stored)
    }

    /// Stores `data`. Same atomicity and durability as [`Store::put_file`].
    pub fn put_bytes(&self, data: &[u8]) -> io::Result<StoredObject> {
        crate::history::budget::check_room(data.len() as u64)?;
        let stored = self.put_bytes_unbudgeted(data)?;
        charge_new_content(&stored, data.len() as u64);
        Ok(stored)
    }

    fn put_bytes_unbudgeted(&self, data: &[u8]) -> io::Result<StoredObject> {
        if self
            .pack_limit
            .is_some_and(|limit| data.len() as u64 <= limit)
        {
            return self.put_packed(data);
        }
        let temp = self.create_temp()?;
        let mut hasher = Sha256::new();
        hasher.update(data);
        write_all(&temp.file, data)?;
        self.commit(temp, hasher, data.len() as u64, CopyMethod::Copy)
    }

    /// The same store with packs switched off: every object a file of its own (for tests of
    /// that path with small data).
    #[cfg(test)]
    fn without_packs(mut self) -> Store {
        self.pack_limit = None;
        self
    }

    /// Opens an object read-only. Rejects names that are not 64 lowercase hex with
    /// `InvalidInput` (so a bad name can never reach outside the store directory). A packed
    /// object comes as a sealed memfd holding its (verified) content.
    pub fn open_object(&self, name: &str) -> io::Result<File> {
        let cname = object_cname(name)?;
        if let Some(data) = self.read_packed(name, false)? {
            return sealed_memfd(&data);
        }
        match openat(
            &self.dir_fd,
            &cname,
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0,
        ) {
            // Appended by another process since this store indexed its packs?
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                match self.read_packed(name, true)? {
                    Some(data) => sealed_memfd(&data),
                    // Its entry was found damaged and dropped (and logged then): still
                    // damaged, not missing.
                    None if pack::digest_of(name).is_some_and(|d| self.packs.is_damaged(&d)) => {
                        Err(pack::damaged_error(format!(
                            "store: object {name} is damaged (its pack entry did not match its \
                             name) and no good copy is stored"
                        )))
                    }
                    None => Err(e),
                }
            }
            other => other,
        }
    }

    /// Reads a whole object into memory.
    pub fn read_object(&self, name: &str) -> io::Result<Vec<u8>> {
        if let Some(data) = self.read_packed(name, false)? {
            return Ok(data);
        }
        let mut file = self.open_object(name)?;
        let len = file.metadata()?.len();
        let mut data = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.read_to_end(&mut data)?;
        Ok(data)
    }

    /// A packed object's content, verified; `None` if no pack holds it (`refresh`: after
    /// looking at what other processes appended since).
    fn read_packed(&self, name: &str, refresh: bool) -> io::Result<Option<Vec<u8>>> {
        match pack::digest_of(name) {
            Some(digest) => self.packs.read(&self.dir_fd, &digest, refresh),
            None => Ok(None),
        }
    }

    /// Re-hashes an object and reports whether its content still matches its name.
    pub fn verify(&self, name: &str) -> io::Result<bool> {
        // A pack entry is hashed by every read of it (see `pack`, invariant 1).
        match self.read_packed(name, false) {
            Ok(Some(_)) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(false),
            Err(e) => return Err(e),
            Ok(None) => {}
        }
        let file = match self.open_object(name) {
            Ok(file) => file,
            // A pack entry that does not match its name (see `pack`, invariant 1).
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(false),
            Err(e) => return Err(e),
        };
        let mut buf = vec![0u8; BUF_SIZE];
        let (hasher, _) = hash_file(&file, &mut buf)?;
        Ok(hex::encode_string(&hasher.finalize()) == name)
    }

    /// Whether an object with this name is stored (a regular file, or a pack entry).
    /// Invalid names are never contained.
    pub fn contains(&self, name: &str) -> bool {
        let Ok(cname) = object_cname(name) else {
            return false;
        };
        // Every valid object name is a digest. The index first (no syscall), then a file,
        // then what another process may have packed since this store indexed.
        let digest = pack::digest_of(name);
        if digest.is_some_and(|d| self.packs.contains(&self.dir_fd, &d, false)) {
            return true;
        }
        matches!(stat_at(&self.dir_fd, &cname), Ok(Some(st)) if is_regular(&st))
            || digest.is_some_and(|d| self.packs.contains(&self.dir_fd, &d, true))
    }

    /// gc, with mutations excluded: `objects` (name, size) are to be removed, by
    /// [`Removals::run`] once mutations run again. Until then, and while each is being
    /// removed, a put of the same content keeps the object (it claims it) or waits for it to
    /// be gone and stores it again, so no put ever reports `reused` for a removed object.
    pub fn doom(&self, objects: Vec<(String, u64)>) -> Removals<'_> {
        self.doomed
            .mark(objects.iter().map(|(name, _)| name.clone()));
        Removals {
            store: self,
            objects,
        }
    }

    /// Removes an object: unlinks its file, or drops a packed one from the index (its bytes
    /// go at the next [`Store::compact`]). Not fsynced: if the removal is lost in a crash the
    /// object simply comes back, which is harmless for content-addressed data; call
    /// [`Store::sync`] to make a batch of removals durable.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let cname = object_cname(name)?;
        let packed = pack::digest_of(name).is_some_and(|d| self.packs.remove(&d));
        match unlink_at(&self.dir_fd, &cname) {
            Err(e) if packed && e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other,
        }
    }

    /// Rewrites the packs that hold removed objects without them (gc's last step, with no
    /// put running). Returns the bytes given back.
    pub fn compact(&self) -> io::Result<u64> {
        self.packs.compact(self)
    }

    /// Every object, name and content length, sorted by name. Temp files and any other
    /// files in the directory (wrong names, non-regular files) are not objects and are
    /// skipped; an object both packed and a file is listed once.
    pub fn objects(&self) -> io::Result<Vec<(String, u64)>> {
        let mut all: BTreeMap<String, u64> = self.packs.objects().into_iter().collect();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !is_object_name(&name) {
                continue;
            }
            match entry.metadata() {
                Ok(m) if m.is_file() => {
                    all.insert(name, m.len());
                }
                Ok(_) => {}
                // Removed between readdir and the lookup.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(all.into_iter().collect())
    }

    /// Lists object names, sorted (see [`Store::objects`]).
    pub fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.objects()?.into_iter().map(|(name, _)| name).collect())
    }

    /// Bytes of all objects' content.
    pub fn total_size(&self) -> io::Result<u64> {
        Ok(self.objects()?.iter().map(|(_, size)| size).sum())
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Fsyncs the store directory (makes earlier [`Store::remove`]s durable).
    pub fn sync(&self) -> io::Result<()> {
        crate::state::durability::sync_file(&self.dir_fd, false)
    }

    /// Makes every object put so far durable, and the directory, with one `syncfs` of the
    /// store's filesystem (which also writes back whatever else is dirty there).
    pub fn sync_filesystem(&self) -> io::Result<()> {
        let taken = std::mem::take(&mut *self.lock_unsynced());
        let packs = self.packs.take_unsynced();
        crate::state::durability::syncfs(&self.dir_fd).inspect_err(|_| {
            self.put_back(taken);
            self.packs.put_back(packs);
        })
    }

    /// [`SyncPolicy::Batched`]: makes the objects put since the last call durable — an
    /// fdatasync of each (or one `syncfs` when there are many), then the directory. Returns
    /// how many objects it synced. On error they stay listed for the next call.
    pub fn sync_batch(&self) -> io::Result<usize> {
        let taken = std::mem::take(&mut *self.lock_unsynced());
        let packs = self.packs.take_unsynced();
        if taken.is_empty() && packs.is_empty() {
            return Ok(0);
        }
        let synced = (|| {
            if taken.len() > SYNCFS_THRESHOLD {
                return crate::state::durability::syncfs(&self.dir_fd);
            }
            // One fdatasync per pack written, however many objects it got.
            for file in &packs.files {
                crate::state::durability::sync_file(file, true)?;
            }
            if taken.is_empty() && !packs.new_name {
                return Ok(());
            }
            for name in &taken {
                match openat(
                    &self.dir_fd,
                    name,
                    libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                    0,
                ) {
                    Ok(f) => crate::state::durability::sync_file(&f, true)?,
                    // Removed meanwhile (gc): nothing left to make durable.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
            self.sync()
        })();
        let n = taken.len() + packs.files.len();
        match synced {
            Ok(()) => Ok(n),
            Err(e) => {
                self.put_back(taken);
                self.packs.put_back(packs);
                Err(e)
            }
        }
    }

    /// Whether a put since the last [`Store::sync_batch`] is not yet durable.
    pub fn has_unsynced(&self) -> bool {
        !self.lock_unsynced().is_empty() || self.packs.has_unsynced()
    }

    fn lock_unsynced(&self) -> std::sync::MutexGuard<'_, Vec<CString>> {
        // A list of names, each pushed whole: a panic elsewhere cannot leave it inconsistent.
        self.unsynced.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn put_back(&self, mut names: Vec<CString>) {
        if self.policy == SyncPolicy::Batched {
            self.lock_unsynced().append(&mut names);
        }
    }

    /// The whole content of `src` if it belongs in a pack: at most the pack limit, and no
    /// holes (allocated blocks cover its size; a sparse file stays a file of its own, so its
    /// holes are kept). `None` if it does not, also when it grew past the limit meanwhile.
    /// `seen`: its size and 512-byte blocks, if the caller has just stat'ed it.
    fn read_if_packable(
        &self,
        src: &File,
        seen: Option<(u64, u64)>,
    ) -> io::Result<Option<Vec<u8>>> {
        let Some(limit) = self.pack_limit else {
            return Ok(None);
        };
        let (len, blocks) = match seen {
            Some(seen) => seen,
            None => {
                let meta = src.metadata()?;
                (meta.len(), meta.blocks())
            }
        };
        if len > limit || blocks.saturating_mul(512) < len {
            return Ok(None);
        }
        // One byte more than the limit: reading that much means it grew, and is too big.
        let mut data = vec![0u8; usize::try_from(len + 1).unwrap_or(0)];
        let mut len = 0usize;
        loop {
            if len == data.len() {
                if len as u64 > limit {
                    return Ok(None);
                }
                data.resize((len * 2).clamp(1, limit as usize + 1), 0);
            }
            match src.read_at(&mut data[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if len as u64 > limit {
            return Ok(None);
        }
        data.truncate(len);
        Ok(Some(data))
    }

    fn put_packed(&self, data: &[u8]) -> io::Result<StoredObject> {
        let digest: [u8; 32] = Sha256::digest(data).into();
        let name = hex::encode_string(&digest);
        self.doomed.claim(&name);
        let reused = self.packs.put(&self.dir_fd, &digest, data, self.policy)?;
        Ok(StoredObject {
            name,
            size: data.len() as u64,
            reused,
            method: if reused {
                CopyMethod::Existing
            } else {
                CopyMethod::Packed
            },
        })
    }

    fn put_file_impl(&self, src: &File, try_reflink: bool) -> io::Result<StoredObject> {
        let temp = self.create_temp()?;
        let mut buf = buffer_for(src)?;
        if try_reflink && reflink(src, &temp.file)? {
            let (hasher, size) = hash_file(&temp.file, &mut buf)?;
            return self.commit(temp, hasher, size, CopyMethod::Reflink);
        }
        let (hasher, size) = copy_and_hash(src, &temp.file, &mut buf)?;
        self.commit(temp, hasher, size, CopyMethod::Copy)
    }

    /// Creates a fresh, locked temp file in the store directory.
    fn create_temp(&self) -> io::Result<TempFile<'_>> {
        let pid = std::process::id();
        for _ in 0..TEMP_ATTEMPTS {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = CString::new(format!("{TEMP_PREFIX}{pid}-{n}"))
                .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            let file = match openat(
                &self.dir_fd,
                &name,
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                TEMP_MODE,
            ) {
                Ok(file) => file,
                // A leftover from an earlier process with the same pid: take the next name.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(e),
            };
            let mut temp = TempFile {
                dir_fd: &self.dir_fd,
                name,
                file,
                linked: true,
            };
            // The lock tells `remove_stale_temps` that this temp is alive. It is best effort:
            // a filesystem without flock only loses that protection, not the backup.
            if let Err(e) = temp.file.lock() {
                log::debug!(
                    "store: cannot flock temp file in {}: {e}",
                    self.dir.display()
                );
            }
            // A cleaner in another `Store::open` may have taken the lock and unlinked the file
            // in the instant between our create and our flock. Then start over with a new name.
            if temp.file.metadata()?.nlink() == 0 {
                temp.linked = false;
                continue;
            }
            return Ok(temp);
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    /// Makes the temp read-only and durable, then gives it its content name (or drops it when
    /// that content is already stored), then fsyncs the directory.
    fn commit(
        &self,
        mut temp: TempFile<'_>,
        hasher: Sha256,
        size: u64,
        method: CopyMethod,
    ) -> io::Result<StoredObject> {
        temp.file
            .set_permissions(Permissions::from_mode(OBJECT_MODE))?;
        let each_put = self.policy == SyncPolicy::EachPut;
        if each_put {
            // Data and mode must be on disk before the name can point at them (invariant 2).
            crate::state::durability::sync_file(&temp.file, false)?;
        }
        let name = hex::encode_string(&hasher.finalize());
        let cname = object_cname(&name)?;
        self.doomed.claim(&name);

        let reused = match stat_at(&self.dir_fd, &cname)? {
            Some(st) if is_regular(&st) && u64::try_from(st.st_size).ok() == Some(size) => {
                temp.discard();
                true
            }
            Some(_) => {
                // Same hash, different size (or not a regular file): the stored copy is damaged.
                // Our temp holds verified content, so it replaces it atomically.
                log::warn!(
                    "store: object {name} in {} has the wrong size or type; replacing it",
                    self.dir.display()
                );
                rename_at(&self.dir_fd, &temp.name, &cname)?;
                temp.linked = false;
                false
            }
            None => match rename_noreplace(&self.dir_fd, &temp.name, &cname) {
                Ok(()) => {
                    temp.linked = false;
                    false
                }
                // Another put of the same content won the race; its object is complete.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    temp.discard();
                    true
                }
                Err(e) => return Err(e),
            },
        };
        drop(temp);

        match self.policy {
            // Makes the name durable: ours after a rename, or possibly another thread's that
            // was renamed just now and not yet fsynced (invariant 2).
            SyncPolicy::EachPut => self.sync()?,
            // A reused object is listed by whoever renamed it, if it is not durable yet.
            SyncPolicy::Batched if !reused => self.lock_unsynced().push(cname),
            SyncPolicy::Batched | SyncPolicy::Caller => {}
        }
        Ok(StoredObject {
            name,
            size,
            reused,
            method: if reused { CopyMethod::Existing } else { method },
        })
    }

    /// Renames a complete, read-only temp over the object `cname` (which holds the same
    /// content, verified by the caller), with invariant 2's syncs.
    fn commit_replacing(&self, mut temp: TempFile<'_>, cname: &CStr) -> io::Result<()> {
        if self.policy == SyncPolicy::EachPut {
            crate::state::durability::sync_file(&temp.file, false)?;
        }
        rename_at(&self.dir_fd, &temp.name, cname)?;
        temp.linked = false;
        match self.policy {
            SyncPolicy::EachPut => self.sync(),
            SyncPolicy::Batched => {
                self.lock_unsynced().push(cname.to_owned());
                Ok(())
            }
            SyncPolicy::Caller => Ok(()),
        }
    }

    /// Removes `.tmp-*` files left by a writer that is gone (crash, kill). A temp whose flock
    /// is held belongs to a live writer and stays.
    fn remove_stale_temps(&self) -> io::Result<()> {
        let mut removed = 0usize;
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let os_name = entry.file_name();
            if !os_name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
                continue;
            }
            let Ok(cname) = CString::new(os_name.as_bytes()) else {
                continue;
            };
            // O_NONBLOCK: never hang on a FIFO someone planted; O_NOFOLLOW: never follow links.
            let file = match openat(
                &self.dir_fd,
                &cname,
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                0,
            ) {
                Ok(file) => file,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => {
                    log::warn!(
                        "store: leaving {:?} in {}: cannot open it: {e}",
                        os_name,
                        self.dir.display()
                    );
                    continue;
                }
            };
            if !file.metadata()?.is_file() {
                continue;
            }
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => continue,
                // No flock on this filesystem: nothing can be told apart, treat it as stale.
                Err(TryLockError::Error(_)) => {}
            }
            match unlink_at(&self.dir_fd, &cname) {
                Ok(()) => removed += 1,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        if removed > 0 {
            log::info!(
                "store: removed {removed} leftover temp file(s) from {}",
                self.dir.display()
            );
            self.dir_fd.sync_all()?;
        }
        Ok(())
    }
}

/// A temp file in the store directory. Unlinked on drop unless it was renamed into place.
struct TempFile<'a> {
    dir_fd: &'a File,
    name: CString,
    file: File,
    /// Whether `name` still refers to this file (false after a rename or a discard).
    linked: bool,
}

impl TempFile<'_> {
    /// Unlinks the temp now. A failure only costs a leftover that the next `open` removes, so
    /// it is logged, not returned: it must not turn a durable backup into an error.
    fn discard(&mut self) {
        if self.linked {
            self.linked = false;
            if let Err(e) = unlink_at(self.dir_fd, &self.name) {
                log::warn!("store: cannot remove temp file {:?}: {e}", self.name);
            }
        }
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        self.discard();
    }
}

/// `mkdir` with mode 0700 (parents too), fsyncing the parent of each directory it creates.
fn create_dir_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur {
        if p.as_os_str().is_empty() || p.symlink_metadata().is_ok() {
            break;
        }
        missing.push(p);
        cur = p.parent();
    }
    for p in missing.iter().rev() {
        match DirBuilder::new().mode(DIR_MODE).create(p) {
            Ok(()) => {}
            // Created concurrently by someone else: fine, it exists.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
        let parent = match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(parent)?
            .sync_all()?;
    }
    Ok(())
}

/// Tries `ioctl(FICLONE)` from `src` into the empty `dst`. `Ok(false)` means "no reflink
/// here, copy instead" and leaves `dst` empty.
///
/// Reflink is only an optimisation, so every failure falls back to the copy (EOPNOTSUPP,
/// EXDEV, EINVAL, ENOTTY are the usual "not here", but e.g. EBADF also means "unsupported" on
/// some filesystems) — except ENOSPC, EDQUOT and EIO: the store is out of space or failing,
/// and a copy would only fail the same way more slowly. Real problems with `src` (not
/// readable, a directory) resurface with their own errno from the copy's pread.
fn reflink(src: &File, dst: &File) -> io::Result<bool> {
    // SAFETY: both fds are valid for the duration of the call; FICLONE takes the source fd
    // as its integer argument and touches no memory of ours.
    let ret = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EIO) => Err(err),
        _ => {
            log::trace!("store: no reflink ({err}); copying");
            // A failed clone should not have changed `dst`; truncating makes sure the copy
            // starts from an empty file either way. Only if needed: on ext4 a truncation to
            // 0 makes the close of the file write its data back at once (auto_da_alloc),
            // a disk wait on the syscall path.
            set_len_if_needed(dst, 0)?;
            Ok(false)
        }
    }
}

/// Zeros fed to the hash for holes, so a hole costs hashing time but no reads or allocation.
static ZEROS: [u8; 1 << 16] = [0; 1 << 16];

/// One region of a file, as [`walk_extents`] reports it.
enum Extent<'a> {
    /// Allocated bytes at this offset.
    Data(u64, &'a [u8]),
    /// A hole of this many bytes (reads as zeros).
    Hole(u64),
}

/// Walks `src` from offset 0 to EOF with pread, calling `on` with the allocated regions and
/// the holes between them, in order (holes found with
/// `SEEK_DATA`/`SEEK_HOLE`, so a hole is never read). Returns the length walked: the EOF that
/// the walk saw, even if the file grows or shrinks meanwhile (a shrink ends the walk at the
/// first short read; a hole past the end of what was read is only counted up to the size
/// `fstat` reports then).
///
/// Every byte in `[0, len)` is reported exactly once, in order, either as data or as part of
/// a hole: that is what makes the content hash (holes hash as zeros) match the copy.
/// A filesystem without `SEEK_DATA` (EINVAL) reports everything as data.
fn walk_extents(
    src: &File,
    buf: &mut [u8],
    on: impl FnMut(Extent<'_>) -> io::Result<()>,
) -> io::Result<u64> {
    // SEEK_DATA/SEEK_HOLE move the fd's offset; callers may share the fd (its offset is
    // theirs), so it is put back. Not atomic against a concurrent user of the same fd.
    let saved = seek(src, 0, libc::SEEK_CUR)?;
    let walked = walk_extents_from_zero(src, buf, on);
    let restored = seek(src, saved, libc::SEEK_SET);
    let len = walked?;
    restored?;
    Ok(len)
}

fn walk_extents_from_zero(
    src: &File,
    buf: &mut [u8],
    mut on: impl FnMut(Extent<'_>) -> io::Result<()>,
) -> io::Result<u64> {
    let mut off = 0u64;
    let mut sparse = true;
    loop {
        let (data, data_end) = if sparse {
            match seek(src, off, libc::SEEK_DATA) {
                Ok(data) => match seek(src, data, libc::SEEK_HOLE) {
                    Ok(hole) => (data, hole),
                    // Truncated below `data` in between: the file ends here.
                    Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return Ok(off),
                    Err(e) => return Err(e),
                },
                // No data at or after `off`: the rest, up to the current size, is a hole.
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    let size = src.metadata()?.len();
                    if size > off {
                        on(Extent::Hole(size - off))?;
                        off = size;
                    }
                    return Ok(off);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    sparse = false;
                    (off, u64::MAX)
                }
                Err(e) => return Err(e),
            }
        } else {
            (off, u64::MAX)
        };
        if data > off {
            on(Extent::Hole(data - off))?;
            off = data;
        }
        while off < data_end {
            let want = usize::try_from(data_end - off).map_or(buf.len(), |n| n.min(buf.len()));
            let n = match src.read_at(&mut buf[..want], off) {
                Ok(0) => return Ok(off),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            on(Extent::Data(off, &buf[..n]))?;
            off += n as u64;
        }
    }
}

/// Adds one extent to a content hash: data as is, a hole as zeros.
fn hash_extent(hasher: &mut Sha256, e: &Extent<'_>) {
    match *e {
        Extent::Data(_, data) => hasher.update(data),
        Extent::Hole(mut len) => {
            while len > 0 {
                let n = usize::try_from(len).map_or(ZEROS.len(), |l| l.min(ZEROS.len()));
                hasher.update(&ZEROS[..n]);
                len -= n as u64;
            }
        }
    }
}

/// Writes a data extent at its offset in `dst`; a hole is left alone (`dst` is empty there).
fn write_extent(dst: &File, e: &Extent<'_>) -> io::Result<()> {
    match *e {
        Extent::Data(off, data) => write_all_at(dst, data, off),
        Extent::Hole(_) => Ok(()),
    }
}

/// Copies `src` from offset 0 to EOF into the empty `dst` at the same offsets, hashing in
/// the same pass; holes stay holes in `dst` (only data extents are written, the length is
/// set at the end). Returns the hash and the number of bytes copied (holes included).
fn copy_and_hash(src: &File, dst: &File, buf: &mut [u8]) -> io::Result<(Sha256, u64)> {
    let mut hasher = Sha256::new();
    let len = walk_extents(src, buf, |e| {
        hash_extent(&mut hasher, &e);
        write_extent(dst, &e)
    })?;
    set_len_if_needed(dst, len)?;
    Ok((hasher, len))
}

/// Hashes `file` from offset 0 to EOF (holes as zeros, without reading them). Returns the
/// hash and the length.
fn hash_file(file: &File, buf: &mut [u8]) -> io::Result<(Sha256, u64)> {
    let mut hasher = Sha256::new();
    let len = walk_extents(file, buf, |e| {
        hash_extent(&mut hasher, &e);
        Ok(())
    })?;
    Ok((hasher, len))
}

/// The content hash of `file` as an object name (what [`Store::put_file`] would name it),
/// without reading its holes.
pub fn content_hash(file: &File) -> io::Result<String> {
    let mut buf = vec![0u8; BUF_SIZE];
    Ok(hex::encode_string(&hash_file(file, &mut buf)?.0.finalize()))
}

/// `ftruncate(len)` unless the file has that length already (a trailing hole needs it; a
/// file that ends in data does not, and a needless truncation to 0 costs a writeback on
/// ext4, see [`reflink`]).
fn set_len_if_needed(file: &File, len: u64) -> io::Result<()> {
    if file.metadata()?.len() != len {
        file.set_len(len)?;
    }
    Ok(())
}

/// The copy buffer for `src`: [`BUF_SIZE`], or less for a small file (zeroing 1 MiB for a
/// 300-byte file costs more than the copy). Only a size hint: a file that grows meanwhile is
/// still copied whole, in more reads.
fn buffer_for(src: &File) -> io::Result<Vec<u8>> {
    let size = src.metadata()?.len();
    let len = usize::try_from(size.saturating_add(1)).map_or(BUF_SIZE, |n| n.clamp(4096, BUF_SIZE));
    Ok(vec![0u8; len])
}

/// `lseek`, for `SEEK_DATA`/`SEEK_HOLE` (the fd's offset is not used by anything here: all
/// IO is pread/pwrite).
fn seek(file: &File, off: u64, whence: libc::c_int) -> io::Result<u64> {
    let off = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: `file` is an open fd; lseek touches no memory of ours.
    let ret = unsafe { libc::lseek(file.as_raw_fd(), off, whence) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as u64)
}

/// `pwrite()` until all of `data` is written at `off`, retrying short writes and EINTR; a
/// zero-length write becomes EIO (see [`write_all`]).
fn write_all_at(file: &File, mut data: &[u8], mut off: u64) -> io::Result<()> {
    while !data.is_empty() {
        match file.write_at(data, off) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Ok(n) => {
                data = &data[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `write()` until all of `data` is written, retrying short writes and EINTR. Unlike
/// `Write::write_all`, a zero-length write becomes a raw errno (EIO), so callers always get
/// an errno to pass on.
fn write_all(mut file: &File, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        match file.write(data) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Validates an object name and makes it a C string for the `*at` calls.
fn object_cname(name: &str) -> io::Result<CString> {
    if !is_object_name(name) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "invalid object name {name:?}: expected {OBJECT_NAME_LEN} lowercase hex digits"
            ),
        ));
    }
    CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The name an object with content `data` has (or would have) in the store: the lowercase hex
/// SHA-256 of `data`.
pub fn object_name(data: &[u8]) -> String {
    hex::encode_string(&Sha256::digest(data))
}

fn is_regular(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

fn openat(dir: &File, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is an open fd.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `fstatat` without following symlinks; `Ok(None)` when the name does not exist.
fn stat_at(dir: &File, name: &CStr) -> io::Result<Option<libc::stat>> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated, `st` is valid writable storage for a `stat`.
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if ret == 0 {
        // SAFETY: fstatat returned 0, so it filled in `st`.
        return Ok(Some(unsafe { st.assume_init() }));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(err)
    }
}

fn unlink_at(dir: &File, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; `dir` is an open fd.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn rename_at(dir: &File, from: &CStr, to: &CStr) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated; `dir` is an open fd.
    if unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `renameat2(RENAME_NOREPLACE)`, so a racing put of the same content is seen as `EEXIST`
/// (and reported as reused) instead of silently overwriting. Filesystems without the flag
/// get a plain rename, which is also correct here: both sides hold identical content.
fn rename_noreplace(dir: &File, from: &CStr, to: &CStr) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated; `dir` is an open fd.
    let ret =
        unsafe { libc::renameat2(fd, from.as_ptr(), fd, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if ret == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) => rename_at(dir, from, to),
        _ => Err(err),
    }
}

/// A memfd holding `data`, sealed against any change: how a packed object is handed to a
/// reader that wants a file (a view's open, a rewind's copy).
fn sealed_memfd(data: &[u8]) -> io::Result<File> {
    // SAFETY: the name is a NUL-terminated literal; memfd_create touches no other memory.
    let fd = unsafe {
        libc::memfd_create(
            c"checkpointfs-object".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    write_all_at(&file, data, 0)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: `file` is an open memfd; F_ADD_SEALS takes an int and touches no memory.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn sha256_hex(data: &[u8]) -> String {
        hex::encode_string(&Sha256::digest(data))
    }

    /// Deterministic pseudo-random bytes (xorshift64*), so big test files are not compressible
    /// patterns and hash bugs cannot hide behind repetition.
    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        out.truncate(len);
        out
    }

    fn source_file(dir: &Path, name: &str, data: &[u8]) -> File {
        let path = dir.join(name);
        std::fs::write(&path, data).expect("write source file");
        File::open(&path).expect("open source file")
    }

    fn dir_entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    fn setup() -> (tempfile::TempDir, Store) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&tmp.path().join("backups"))
            .expect("open store")
            .without_packs();
        (tmp, store)
    }

    #[test]
    fn put_bytes_then_read_back() {
        let (_tmp, store) = setup();
        let obj = store.put_bytes(b"hello store").expect("put");
        assert_eq!(obj.name, sha256_hex(b"hello store"));
        assert_eq!(obj.size, 11);
        assert!(!obj.reused);
        assert_eq!(obj.method, CopyMethod::Copy);
        assert!(store.contains(&obj.name));
        assert_eq!(store.read_object(&obj.name).expect("read"), b"hello store");
        assert!(store.verify(&obj.name).expect("verify"));
    }

    #[test]
    fn put_file_then_read_back() {
        let (tmp, store) = setup();
        let src = source_file(tmp.path(), "src", b"file content\n");
        let obj = store.put_file(&src).expect("put");
        assert_eq!(obj.name, sha256_hex(b"file content\n"));
        assert_eq!(obj.size, 13);
        assert!(!obj.reused);
        // /tmp is usually ext4 or tmpfs here, but a btrfs/XFS /tmp would legitimately reflink.
        assert!(matches!(obj.method, CopyMethod::Copy | CopyMethod::Reflink));
        let mut content = String::new();
        store
            .open_object(&obj.name)
            .expect("open object")
            .read_to_string(&mut content)
            .expect("read");
        assert_eq!(content, "file content\n");
    }

    /// `put_file_stat` with a stat taken before the file changed stores what the file holds
    /// at the put, whole: grown past the pack limit it becomes a file of its own, shrunk it
    /// is packed at its new length.
    #[test]
    fn put_file_stat_stores_the_content_at_the_put() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&tmp.path().join("backups")).expect("open store");
        let stat_then_write = |name: &str, before: &[u8], after: &[u8]| {
            let src = source_file(tmp.path(), name, before);
            let st = crate::sys::fstat(std::os::fd::AsFd::as_fd(&src)).expect("fstat");
            std::fs::write(tmp.path().join(name), after).expect("rewrite");
            store.put_file_stat(&src, &st).expect("put")
        };
        let same = stat_then_write("same", b"unchanged", b"unchanged");
        assert_eq!(same.method, CopyMethod::Packed);
        assert_eq!(same.name, sha256_hex(b"unchanged"));

        let big = pseudo_random(usize::try_from(pack::MAX_ENTRY).expect("limit") + 10, 3);
        let grown = stat_then_write("grown", b"small", &big);
        assert!(matches!(
            grown.method,
            CopyMethod::Copy | CopyMethod::Reflink
        ));
        assert_eq!(
            (grown.name.as_str(), grown.size),
            (sha256_hex(&big).as_str(), big.len() as u64)
        );
        assert_eq!(store.read_object(&grown.name).expect("read"), big);

        let shrunk = stat_then_write("shrunk", b"a longer content", b"abc");
        assert_eq!(shrunk.method, CopyMethod::Packed);
        assert_eq!(
            (shrunk.name.as_str(), shrunk.size),
            (sha256_hex(b"abc").as_str(), 3)
        );
        assert_eq!(store.read_object(&shrunk.name).expect("read"), b"abc");
    }

    #[test]
    fn put_file_userspace_copy_path_is_exact() {
        let (tmp, store) = setup();
        let data = pseudo_random(3 * BUF_SIZE + 12345, 7);
        let src = source_file(tmp.path(), "src", &data);
        let obj = store.put_file_impl(&src, false).expect("put");
        assert_eq!(obj.method, CopyMethod::Copy);
        assert_eq!(obj.size, data.len() as u64);
        assert_eq!(obj.name, sha256_hex(&data));
        assert_eq!(store.read_object(&obj.name).expect("read"), data);
    }

    #[test]
    fn put_file_reads_from_offset_zero_and_leaves_fd_offset_alone() {
        let (tmp, store) = setup();
        let mut src = source_file(tmp.path(), "src", b"0123456789abcdef");
        src.seek(SeekFrom::Start(10)).expect("seek");
        let obj = store.put_file(&src).expect("put");
        assert_eq!(obj.size, 16);
        assert_eq!(
            store.read_object(&obj.name).expect("read"),
            b"0123456789abcdef"
        );
        assert_eq!(src.stream_position().expect("tell"), 10);
        let obj2 = store.put_file_impl(&src, false).expect("put (copy path)");
        assert_eq!(obj2.name, obj.name);
        assert_eq!(src.stream_position().expect("tell"), 10);
    }

    /// A sparse file: `len` bytes, with `data` written at each offset and holes elsewhere.
    fn sparse_file(dir: &Path, name: &str, len: u64, data: &[(u64, &[u8])]) -> (File, Vec<u8>) {
        let path = dir.join(name);
        let f = File::create(&path).expect("create sparse file");
        f.set_len(len).expect("set_len");
        let mut logical = vec![0u8; usize::try_from(len).expect("len")];
        for (off, bytes) in data {
            f.write_all_at(bytes, *off).expect("write");
            let o = usize::try_from(*off).expect("off");
            logical[o..o + bytes.len()].copy_from_slice(bytes);
        }
        drop(f);
        (File::open(&path).expect("open sparse file"), logical)
    }

    fn allocated(path: &Path) -> u64 {
        std::fs::metadata(path).expect("stat").blocks() * 512
    }

    #[test]
    fn sparse_files_keep_their_holes_in_the_store_and_when_restored() {
        let (tmp, store) = setup();
        let len = 64 << 20;
        let cases: [&[(u64, &[u8])]; 4] = [
            &[(32 << 20, b"x")],
            &[(0, b"head"), (len - 5, b"tail!")],
            &[(1 << 20, &[7u8; 3 << 20])],
            &[],
        ];
        for (i, data) in cases.iter().enumerate() {
            let (src, logical) = sparse_file(tmp.path(), &format!("sparse{i}"), len, data);
            let data_bytes: u64 = data.iter().map(|(_, d)| d.len() as u64).sum();
            for try_reflink in [false, true] {
                let obj = store.put_file_impl(&src, try_reflink).expect("put sparse");
                assert_eq!(
                    obj.name,
                    sha256_hex(&logical),
                    "case {i}: holes hash as zeros"
                );
                assert_eq!(obj.size, len);
                let path = store.dir().join(&obj.name);
                // Each data run costs at most a few blocks on either side.
                let budget = data_bytes + 64 * 1024;
                assert!(
                    allocated(&path) <= budget,
                    "case {i}: object allocates {} bytes for {data_bytes} of data",
                    allocated(&path)
                );
                assert!(store.read_object(&obj.name).expect("read") == logical);
                assert!(store.verify(&obj.name).expect("verify"));
                assert_eq!(content_hash(&src).expect("hash"), obj.name);
            }
        }
    }

    /// gc dooms objects with mutations excluded and removes them with mutations running: a
    /// put of a doomed object's content in between keeps it (`reused` stays true, the object
    /// stays), and a put after the removal stores the content again. Packed and plain.
    #[test]
    fn a_put_between_doom_and_removal_keeps_the_object() {
        for packs in [true, false] {
            let (_tmp, store) = setup();
            let store = if packs { store } else { store.without_packs() };
            let kept = store.put_bytes(b"stored again meanwhile").expect("put");
            let gone = store.put_bytes(b"removed").expect("put");
            let removals = store.doom(vec![
                (kept.name.clone(), kept.size),
                (gone.name.clone(), gone.size),
            ]);
            let again = store.put_bytes(b"stored again meanwhile").expect("put");
            assert!(again.reused, "packs {packs}");
            let mut seen = Vec::new();
            let (removed, bytes) = removals
                .run(&mut |done, total| seen.push((done, total)))
                .expect("run");
            assert_eq!((removed, bytes), (1, gone.size), "packs {packs}");
            assert_eq!(seen, [(1, 2), (2, 2)]);
            assert!(store.contains(&kept.name), "packs {packs}");
            assert_eq!(
                store.read_object(&kept.name).expect("read"),
                b"stored again meanwhile"
            );
            assert!(!store.contains(&gone.name), "packs {packs}");
            let back = store.put_bytes(b"removed").expect("put");
            assert!(!back.reused, "removed, so stored anew (packs {packs})");
            assert_eq!(store.read_object(&gone.name).expect("read"), b"removed");
        }
    }

    /// Removals dropped before they ran (gc failed after dooming) keep every object, and
    /// leave nothing doomed for later puts.
    #[test]
    fn removals_dropped_unrun_keep_everything() {
        let (_tmp, store) = setup();
        let a = store.put_bytes(b"a").expect("put");
        drop(store.doom(vec![(a.name.clone(), a.size)]));
        assert!(store.contains(&a.name));
        assert!(store.put_bytes(b"a").expect("put").reused);
        let (removed, _) = store.doom(Vec::new()).run(&mut |_, _| {}).expect("run");
        assert_eq!(removed, 0);
        assert!(store.contains(&a.name));
    }

    #[test]
    fn same_content_twice_is_stored_once() {
        let (tmp, store) = setup();
        let first = store.put_bytes(b"dup").expect("first put");
        assert!(!first.reused);
        let src = source_file(tmp.path(), "src", b"dup");
        let second = store.put_file(&src).expect("second put");
        assert_eq!(second.name, first.name);
        assert!(second.reused);
        assert_eq!(second.method, CopyMethod::Existing);
        let third = store.put_bytes(b"dup").expect("third put");
        assert!(third.reused);
        assert_eq!(third.method, CopyMethod::Existing);
        assert_eq!(store.list().expect("list"), vec![first.name.clone()]);
        // No temp file is left behind by the reused puts either.
        assert_eq!(dir_entries(store.dir()), vec![first.name]);
    }

    #[test]
    fn empty_file_and_empty_bytes() {
        let (tmp, store) = setup();
        let src = source_file(tmp.path(), "empty", b"");
        let a = store.put_file(&src).expect("put empty file");
        assert_eq!(a.name, EMPTY_SHA256);
        assert_eq!(a.size, 0);
        assert!(!a.reused);
        let b = store.put_bytes(b"").expect("put empty bytes");
        assert_eq!(b.name, EMPTY_SHA256);
        assert!(b.reused);
        assert_eq!(store.read_object(EMPTY_SHA256).expect("read"), b"");
        assert_eq!(store.total_size().expect("total"), 0);
    }

    #[test]
    fn five_mib_pseudo_random_file_hash_matches_sha2() {
        let (tmp, store) = setup();
        let data = pseudo_random(5 << 20, 0x5eed);
        let src = source_file(tmp.path(), "big", &data);
        let obj = store.put_file(&src).expect("put");
        assert_eq!(obj.name, sha256_hex(&data));
        assert_eq!(obj.size, 5 << 20);
        let back = store.read_object(&obj.name).expect("read");
        assert!(back == data, "stored content differs from the source");
        assert!(store.verify(&obj.name).expect("verify"));
    }

    #[test]
    fn list_total_size_and_remove() {
        let (_tmp, store) = setup();
        assert!(store.list().expect("list").is_empty());
        let a = store.put_bytes(b"aaaa").expect("put a");
        let b = store.put_bytes(b"bbbbbbbbbb").expect("put b");
        let mut expected = vec![a.name.clone(), b.name.clone()];
        expected.sort();
        assert_eq!(store.list().expect("list"), expected);
        assert_eq!(store.total_size().expect("total"), 14);

        store.remove(&a.name).expect("remove a");
        assert!(!store.contains(&a.name));
        assert_eq!(store.list().expect("list"), vec![b.name.clone()]);
        assert_eq!(store.total_size().expect("total"), 10);
        let err = store.remove(&a.name).expect_err("second remove");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        store.sync().expect("sync");
    }

    #[test]
    fn list_skips_temp_and_foreign_files() {
        let (_tmp, store) = setup();
        let obj = store.put_bytes(b"x").expect("put");
        let dir = store.dir().to_path_buf();
        std::fs::write(dir.join("README"), b"not an object").expect("write");
        std::fs::write(dir.join(obj.name.to_uppercase()), b"x").expect("write");
        std::fs::create_dir(dir.join("0".repeat(64))).expect("mkdir");
        // A temp held by a live writer, so it is really "in flight".
        let temp = store.create_temp().expect("temp");
        assert_eq!(store.list().expect("list"), vec![obj.name.clone()]);
        assert_eq!(store.total_size().expect("total"), 1);
        assert!(
            !store.contains(&"0".repeat(64)),
            "a directory is not an object"
        );
        drop(temp);
    }

    #[test]
    fn invalid_names_are_rejected() {
        let (_tmp, store) = setup();
        let obj = store.put_bytes(b"valid").expect("put");
        let bad = [
            String::new(),
            obj.name.to_uppercase(),
            obj.name[..63].to_string(),
            format!("{}0", obj.name),
            format!("../{}", &obj.name[3..]),
            "g".repeat(64),
            format!("{}/", &obj.name[..63]),
            ".tmp-1-1".to_string(),
        ];
        for name in &bad {
            assert!(!is_object_name(name), "{name:?} accepted");
            let err = store.open_object(name).expect_err("open_object");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
            let err = store.read_object(name).expect_err("read_object");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
            let err = store.remove(name).expect_err("remove");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
            assert!(!store.contains(name));
        }
        assert!(is_object_name(&obj.name));
        let missing = "0".repeat(64);
        let err = store.open_object(&missing).expect_err("missing object");
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn objects_are_read_only() {
        let (tmp, store) = setup();
        let a = store.put_bytes(b"ro").expect("put bytes");
        let src = source_file(tmp.path(), "src", b"ro file");
        let b = store.put_file(&src).expect("put file");
        for name in [&a.name, &b.name] {
            let mode = std::fs::metadata(store.dir().join(name))
                .expect("stat")
                .mode();
            assert_eq!(mode & 0o7777, OBJECT_MODE, "object {name} mode {mode:o}");
        }
    }

    #[test]
    fn open_creates_missing_dirs_with_mode_0700() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("state").join("backups");
        let store = Store::open(&dir).expect("open").without_packs();
        assert_eq!(store.dir(), dir);
        for p in [&dir, &tmp.path().join("state")] {
            let mode = std::fs::metadata(p).expect("stat").mode();
            assert_eq!(mode & 0o7777, 0o700, "{} mode {mode:o}", p.display());
        }
        // Reopening an existing store is fine and keeps its objects.
        let obj = store.put_bytes(b"keep").expect("put");
        drop(store);
        let store = Store::open(&dir).expect("reopen").without_packs();
        assert_eq!(store.list().expect("list"), vec![obj.name]);
    }

    #[test]
    fn open_on_a_regular_file_fails() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("file");
        std::fs::write(&path, b"").expect("write");
        let err = Store::open(&path).expect_err("open on a file");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    }

    #[test]
    fn open_removes_leftover_temp_files() {
        let (_tmp, store) = setup();
        let obj = store.put_bytes(b"survivor").expect("put");
        let dir = store.dir().to_path_buf();
        // What a crashed writer leaves: temps nobody holds a lock on, some half written.
        std::fs::write(dir.join(".tmp-4242-0"), b"half a backu").expect("write");
        std::fs::write(dir.join(".tmp-4242-1"), b"").expect("write");
        std::fs::write(dir.join("unrelated"), b"kept").expect("write");
        drop(store);
        let store = Store::open(&dir).expect("reopen").without_packs();
        assert_eq!(dir_entries(&dir), {
            let mut v = vec![obj.name.clone(), "unrelated".to_string()];
            v.sort();
            v
        });
        assert_eq!(store.list().expect("list"), vec![obj.name]);
    }

    #[test]
    fn open_keeps_temp_files_of_a_live_writer() {
        let (_tmp, store) = setup();
        let temp = store.create_temp().expect("temp");
        let temp_name = temp.name.to_string_lossy().into_owned();
        assert!(temp_name.starts_with(".tmp-"), "{temp_name}");
        // A second Store on the same directory (as a CLI next to the daemon would open) must
        // not delete a backup that is being written.
        let other = Store::open(store.dir())
            .expect("second open")
            .without_packs();
        assert_eq!(dir_entries(store.dir()), vec![temp_name.clone()]);
        drop(temp);
        assert!(
            dir_entries(store.dir()).is_empty(),
            "dropped temp is unlinked"
        );
        drop(other);
    }

    #[test]
    fn a_damaged_object_is_replaced_by_a_new_put() {
        let (_tmp, store) = setup();
        let obj = store.put_bytes(b"precious content").expect("put");
        let path = store.dir().join(&obj.name);
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, b"trunc").expect("write damaged copy");
        assert!(!store.verify(&obj.name).expect("verify"));
        let again = store.put_bytes(b"precious content").expect("put again");
        assert_eq!(again.name, obj.name);
        assert!(!again.reused, "a damaged object must not count as reused");
        assert_eq!(again.method, CopyMethod::Copy);
        assert_eq!(
            store.read_object(&obj.name).expect("read"),
            b"precious content"
        );
        assert!(store.verify(&obj.name).expect("verify"));
    }

    #[test]
    fn concurrent_puts_of_the_same_content_store_one_object() {
        let (_tmp, store) = setup();
        let data = pseudo_random(300_000, 99);
        let results: Vec<StoredObject> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| store.put_bytes(&data).expect("put")))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .collect()
        });
        assert!(results.iter().all(|r| r.name == sha256_hex(&data)));
        // Exactly one writer stored it unless a damaged-object path hit (it cannot here).
        let fresh = results.iter().filter(|r| !r.reused).count();
        assert_eq!(fresh, 1, "{results:?}");
        assert_eq!(dir_entries(store.dir()), vec![sha256_hex(&data)]);
    }

    #[test]
    fn put_file_on_unreadable_fd_fails_cleanly() {
        let (tmp, store) = setup();
        let path = tmp.path().join("wo");
        std::fs::write(&path, b"data").expect("write");
        let wo = OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open O_WRONLY");
        let err = store.put_file(&wo).expect_err("put from a write-only fd");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        assert!(dir_entries(store.dir()).is_empty());
    }

    /// A tmpfs mounted for one test; unmounted on drop (lazily as a last resort).
    struct TmpfsMount {
        path: CString,
    }

    impl TmpfsMount {
        /// Mounts a tmpfs of `size` at `dir`. `Ok(None)` when we may not mount (not root).
        fn mount(dir: &Path, size: &str) -> io::Result<Option<TmpfsMount>> {
            let path = CString::new(dir.as_os_str().as_bytes())?;
            let opts = CString::new(format!("size={size},mode=0700"))?;
            // SAFETY: all strings are NUL-terminated and outlive the call.
            let ret = unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    path.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    opts.as_ptr().cast(),
                )
            };
            if ret == 0 {
                return Ok(Some(TmpfsMount { path }));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EPERM) => Ok(None),
                _ => Err(err),
            }
        }
    }

    impl Drop for TmpfsMount {
        fn drop(&mut self) {
            // SAFETY: `path` is NUL-terminated.
            if unsafe { libc::umount2(self.path.as_ptr(), 0) } != 0 {
                // SAFETY: as above.
                unsafe { libc::umount2(self.path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }

    #[test]
    fn enospc_on_tiny_tmpfs_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store_dir = tmp.path().join("tiny");
        std::fs::create_dir(&store_dir).expect("mkdir");
        let Some(_mount) = TmpfsMount::mount(&store_dir, "64k").expect("mount tmpfs") else {
            eprintln!("note: skipping enospc_on_tiny_tmpfs_leaves_nothing_behind: not root");
            return;
        };
        let store = Store::open(&store_dir)
            .expect("open store on tmpfs")
            .without_packs();
        let data = pseudo_random(1 << 20, 3);
        let src = source_file(tmp.path(), "big", &data);

        let err = store.put_file(&src).expect_err("1 MiB into 64 KiB");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err:?}");
        assert!(
            dir_entries(&store_dir).is_empty(),
            "{:?}",
            dir_entries(&store_dir)
        );

        let err = store.put_bytes(&data).expect_err("1 MiB into 64 KiB");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err:?}");
        assert!(
            dir_entries(&store_dir).is_empty(),
            "{:?}",
            dir_entries(&store_dir)
        );

        // The store still works for what fits.
        let small = store.put_bytes(b"fits").expect("small put after ENOSPC");
        assert_eq!(dir_entries(&store_dir), vec![small.name]);
    }
}
