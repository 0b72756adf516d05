//! Small objects, packed into append-only files (`STATE/backups/pack-<8 digits>`).
//!
//! Layer 1 backs up a file before its first change, on the syscall path. For a small file one
//! object file per backup costs an inode allocation, a rename, and waits behind the store
//! directory's metadata writeback: on ext4 that is most of the time of a first write. A pack
//! makes the backup of a small file one `pwrite` into a file that is already open; the
//! store's index (in memory) maps an object name to its place.
//!
//! # Format
//!
//! A pack is a sequence of entries and nothing else, read by walking from offset 0:
//!
//! ```text
//! MAGIC (4 bytes, "cpo1") | data length (u32 LE, <= MAX_ENTRY) | SHA-256 of data (32) | data
//! ```
//!
//! # Invariants
//!
//! 1. **An entry is used only while its data matches its name.** Entries are written whole
//!    (header and data in one `pwrite` under the append lock), but what a power loss leaves of
//!    an unsynced tail can read as zeros or old blocks. So an entry found on disk (by
//!    [`Packs::open`] or a refresh) is *unverified*: its data is hashed before it is served
//!    or reported as already stored ([`Packs::lookup_verified`]); an entry that fails is
//!    dropped from the index. Entries this process wrote are verified by construction.
//! 2. **A pack's walk stops at the first entry that is not whole** (bad magic, a length
//!    over [`MAX_ENTRY`], data past the end of the file). Only the process that appends to a
//!    pack truncates such a tail away, before its first append (invariant 3), so appends
//!    never follow a torn entry.
//! 3. **One appender per pack.** The appending process holds `flock(LOCK_EX)` on the pack
//!    for as long as it appends to it; a pack whose lock is taken is never appended to nor
//!    truncated by anyone else (a second `Store` on the same directory starts a pack of its
//!    own). Within a process, the append lock serialises appenders.
//! 4. **Durability is the store's [`SyncPolicy`](super::SyncPolicy):** with `EachPut` an
//!    append is fdatasynced (and a new pack's name fsynced) before the put returns; otherwise
//!    the packs written since the last [`Packs::take_unsynced`] are handed to the store's
//!    sync, which syncs them before the journal that names their objects.
//! 5. **Compaction never loses a live entry.** [`Packs::compact`] writes the live entries of
//!    a pack with removed ones to a new pack, syncs it and its name, and only then unlinks
//!    the old pack. A crash in between leaves both; an entry in two packs is the same bytes.
//!
//! 6. **A pack's `.idx` is a cache.** `pack-<n>.idx` lists a pack's entries (name, offset,
//!    length), the pack's length and a SHA-256 of the index itself. It is used only when it
//!    is whole and the pack still has that length; otherwise the pack is walked. Its entries
//!    are as unverified as a walk's (invariant 1).
//!
//! Lock order: `append` before `index`; `unsynced` is a leaf. `index` is never held across
//! IO (walks read with it unlocked, then merge). `append` is held across an append's one
//! `pwrite` of at most [`MAX_ENTRY`] bytes into the page cache (so that a failed append can
//! be cut off before the next one lands after it), while it opens or creates the pack to
//! append to (once per pack), and across a sync only during
//! [`Packs::compact`] (gc, with every mutation quiesced) and an `EachPut` append (the CLI's
//! offline store, where no request waits).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use base16ct::lower as hex;
use sha2::{Digest, Sha256};

use super::{SyncPolicy, openat, unlink_at, write_all_at};

/// The entry header's first four bytes.
const MAGIC: [u8; 4] = *b"cpo1";
/// Header length: magic, length, SHA-256.
const HEADER: usize = 4 + 4 + 32;
/// The largest object a pack holds; bigger ones are files of their own (where a reflink can
/// share their extents and their holes are kept).
pub(super) const MAX_ENTRY: u64 = 64 << 10;
/// A pack that has reached this size is closed and the next append starts a new one, so a
/// compaction rewrites a bounded amount.
const ROLL_SIZE: u64 = 32 << 20;
/// Pack file names: this prefix and eight decimal digits.
const PACK_PREFIX: &str = "pack-";
/// Mode of a pack (backups may hold private file content).
const PACK_MODE: libc::mode_t = 0o600;
/// How much of a pack one read of the walk takes.
const WALK_CHUNK: usize = 256 << 10;

/// Where an object's data is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    pack: u32,
    /// Offset of the data (after the header).
    offset: u64,
    len: u32,
    /// Whether the data is known to match the name (invariant 1).
    verified: bool,
}

/// The pack an appender is writing.
#[derive(Debug)]
struct Appender {
    pack: u32,
    file: Arc<File>,
    /// Where the next entry goes: the end of the last whole entry.
    end: u64,
}

/// Packs written and not yet synced, for the store's batched sync.
#[derive(Debug, Default)]
pub(super) struct Unsynced {
    pub(super) files: Vec<Arc<File>>,
    /// A pack was created: the store directory must be synced too.
    pub(super) new_name: bool,
}

impl Unsynced {
    pub(super) fn is_empty(&self) -> bool {
        self.files.is_empty() && !self.new_name
    }
}

#[derive(Debug, Default)]
struct Index {
    objects: HashMap<[u8; 32], Place>,
    /// Every pack seen, with the end of the walk so far (where a refresh resumes).
    walked: BTreeMap<u32, u64>,
    /// Packs with removed entries, for [`Packs::compact`].
    holed: BTreeSet<u32>,
    /// Packs walked whole for want of a valid `.idx`: what [`Packs::write_indexes`] writes.
    unindexed: Vec<(u32, u64, Vec<Found>)>,
    /// Objects whose entry failed verification and was dropped, while no good copy is
    /// indexed: a read of one is EIO (the history still names it), never "no such object".
    damaged: HashSet<[u8; 32]>,
    /// The pack [`Packs::compact`] is rewriting: no appender opens it meanwhile, so its
    /// entries are exactly those the compaction copies.
    compacting: Option<u32>,
}

impl Index {
    /// Indexes entries found on disk, unverified. A later entry with the same name replaces
    /// an unverified earlier one: content is stored again only when its earlier entry failed
    /// verification (invariant 1), so the latest is the one to try.
    fn add_found(&mut self, pack: u32, found: Vec<Found>) {
        for f in found {
            let place = Place {
                pack,
                offset: f.offset,
                len: f.len,
                verified: false,
            };
            match self.objects.get(&f.digest) {
                Some(p) if p.verified => {}
                _ => {
                    self.objects.insert(f.digest, place);
                }
            }
        }
    }
}

/// The packs of one store directory.
#[derive(Debug)]
pub(super) struct Packs {
    /// The pack this process appends to. Lock order: before `index`.
    append: Mutex<Option<Appender>>,
    index: Mutex<Index>,
    /// Packs written since the last [`Packs::take_unsynced`]. A leaf lock.
    unsynced: Mutex<Unsynced>,
}

/// The error of a read of a damaged object: `InvalidData` (what it is) carrying EIO (what a
/// reader through the mount gets), with `what` naming the object.
pub(super) fn damaged_error(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        crate::sys::context(what, io::Error::from_raw_os_error(libc::EIO)),
    )
}

/// Locks a mutex whose data stays consistent at every unlock (each update is one insert or
/// one assignment), so a panic elsewhere does not make it unusable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pack_name(pack: u32) -> CString {
    CString::new(format!("{PACK_PREFIX}{pack:08}")).expect("no NUL in a pack name")
}

/// The pack number in a directory entry's name, if it is a pack.
pub(super) fn pack_number(name: &[u8]) -> Option<u32> {
    let digits = name.strip_prefix(PACK_PREFIX.as_bytes())?;
    if digits.len() != 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Parses an object name (64 lowercase hex digits) into its digest.
pub(super) fn digest_of(name: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    // `lower::decode` takes lowercase digits only, as `is_object_name` does.
    (hex::decode(name, &mut out).ok()?.len() == out.len()).then_some(out)
}

/// One entry found by a walk.
#[derive(Debug, Clone)]
struct Found {
    digest: [u8; 32],
    offset: u64,
    len: u32,
}

/// Walks `file` from `from` (an entry boundary) and returns the whole entries found and
/// where the walk stopped (invariant 2).
fn walk(file: &File, from: u64) -> io::Result<(Vec<Found>, u64)> {
    let size = file.metadata()?.len();
    let mut found = Vec::new();
    let mut at = from;
    let mut buf = vec![0u8; WALK_CHUNK];
    // `buf[..filled]` holds the pack from offset `buf_at`.
    let (mut buf_at, mut filled) = (at, 0usize);
    while at + HEADER as u64 <= size {
        if at < buf_at || at + HEADER as u64 > buf_at + filled as u64 {
            buf_at = at;
            filled = read_full_at(file, &mut buf, at)?;
            if filled < HEADER {
                break;
            }
        }
        let h = &buf[(at - buf_at) as usize..][..HEADER];
        if h[..4] != MAGIC {
            break;
        }
        let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
        let end = at + HEADER as u64 + u64::from(len);
        if u64::from(len) > MAX_ENTRY || end > size {
            break;
        }
        found.push(Found {
            digest: h[8..40].try_into().expect("32 bytes"),
            offset: at + HEADER as u64,
            len,
        });
        at = end;
    }
    Ok((found, at))
}

/// `pread` until `buf` is full or EOF; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn open_pack(dir: &File, pack: u32, flags: libc::c_int) -> io::Result<File> {
    openat(
        dir,
        &pack_name(pack),
        flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        PACK_MODE,
    )
}

/// The entry header of an index file.
const IDX_MAGIC: [u8; 4] = *b"cpi1";
/// One entry of an index file: SHA-256, offset of the data, length.
const IDX_ENTRY: usize = 32 + 8 + 4;

fn idx_name(pack: u32) -> CString {
    CString::new(format!("{PACK_PREFIX}{pack:08}.idx")).expect("no NUL in an index name")
}

/// Writes `pack`'s index (invariant 6): to a temp name, then renamed over the index name.
/// Not synced: a lost index is walked again.
fn write_index(dir: &File, pack: u32, pack_len: u64, found: &[Found]) -> io::Result<()> {
    let mut out = Vec::with_capacity(16 + found.len() * IDX_ENTRY + 32);
    out.extend_from_slice(&IDX_MAGIC);
    out.extend_from_slice(&pack_len.to_le_bytes());
    out.extend_from_slice(&(found.len() as u32).to_le_bytes());
    for f in found {
        out.extend_from_slice(&f.digest);
        out.extend_from_slice(&f.offset.to_le_bytes());
        out.extend_from_slice(&f.len.to_le_bytes());
    }
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    let temp = CString::new(format!(".tmp-{}-idx-{pack}", std::process::id()))
        .expect("no NUL in a temp name");
    let file = openat(
        dir,
        &temp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        PACK_MODE,
    )?;
    let written =
        write_all_at(&file, &out, 0).and_then(|()| super::rename_at(dir, &temp, &idx_name(pack)));
    if written.is_err() {
        let _ = unlink_at(dir, &temp);
    }
    written
}

/// `pack`'s entries from its index, if the index is whole and describes a pack of
/// `pack_len` bytes (invariant 6).
fn read_index(dir: &File, pack: u32, pack_len: u64) -> Option<Vec<Found>> {
    let file = openat(
        dir,
        &idx_name(pack),
        libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        0,
    )
    .ok()?;
    let size = usize::try_from(file.metadata().ok()?.len()).ok()?;
    if size < 16 + 32 || (size - 16 - 32) % IDX_ENTRY != 0 {
        return None;
    }
    let mut data = vec![0u8; size];
    if read_full_at(&file, &mut data, 0).ok()? != size {
        return None;
    }
    let (body, sum) = data.split_at(size - 32);
    if Sha256::digest(body).as_slice() != sum
        || body[..4] != IDX_MAGIC
        || u64::from_le_bytes(body[4..12].try_into().ok()?) != pack_len
        || u32::from_le_bytes(body[12..16].try_into().ok()?) as usize
            != (size - 16 - 32) / IDX_ENTRY
    {
        return None;
    }
    let found: Vec<Found> = body[16..]
        .chunks_exact(IDX_ENTRY)
        .map(|e| Found {
            digest: e[..32].try_into().expect("32 bytes"),
            offset: u64::from_le_bytes(e[32..40].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(e[40..44].try_into().expect("4 bytes")),
        })
        .collect();
    // Every entry must lie inside the pack, as a walk would have found it.
    found
        .iter()
        .all(|f| {
            f.offset >= HEADER as u64
                && u64::from(f.len) <= MAX_ENTRY
                && f.offset + u64::from(f.len) <= pack_len
        })
        .then_some(found)
}

impl Packs {
    /// Indexes the packs in the store directory (`names`: its entries), from their `.idx`
    /// where one is valid, else by walking them; what it finds is unverified (invariant 1).
    pub(super) fn open(dir: &File, names: &[Vec<u8>]) -> io::Result<Packs> {
        let packs = Packs {
            append: Mutex::new(None),
            index: Mutex::new(Index::default()),
            unsynced: Mutex::new(Unsynced::default()),
        };
        let mut numbers: Vec<u32> = names.iter().filter_map(|n| pack_number(n)).collect();
        numbers.sort_unstable();
        lock(&packs.index)
            .walked
            .extend(numbers.into_iter().map(|n| (n, 0)));
        packs.walk_new(dir)?;
        Ok(packs)
    }

    /// Continues every known pack's walk from where it stopped (another process may have
    /// appended), and looks for packs created since.
    fn walk_new(&self, dir: &File) -> io::Result<()> {
        // The reads happen with the index unlocked; what they found is merged after. Two
        // walks of the same range add the same places, and a place someone verified (an
        // append, a compaction) is never replaced by one found on disk (`add_found`).
        // Known packs, then those created since (found by their next numbers), each with the
        // file opened by that search if it opened one.
        let mut packs: Vec<(u32, u64, Option<File>)> = {
            let index = lock(&self.index);
            index.walked.iter().map(|(p, e)| (*p, *e, None)).collect()
        };
        let next = packs.last().map_or(1, |(n, _, _)| n + 1);
        for pack in next.. {
            match open_pack(dir, pack, libc::O_RDONLY) {
                Ok(file) => packs.push((pack, 0, Some(file))),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Err(e) => return Err(e),
            }
        }
        enum Walked {
            /// Compacted away meanwhile (by another process's gc).
            Gone,
            /// Entries found and where the walk ended; `whole`: read from the pack's start
            /// for want of an index (so one is worth writing).
            Found {
                found: Vec<Found>,
                end: u64,
                whole: bool,
            },
        }
        let mut walked = Vec::with_capacity(packs.len());
        for (pack, from, opened) in packs {
            let file = match opened.map_or_else(|| open_pack(dir, pack, libc::O_RDONLY), Ok) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    walked.push((pack, Walked::Gone));
                    continue;
                }
                Err(e) => return Err(e),
            };
            if from == 0 {
                let size = file.metadata()?.len();
                if let Some(found) = read_index(dir, pack, size) {
                    let (end, whole) = (size, false);
                    walked.push((pack, Walked::Found { found, end, whole }));
                    continue;
                }
            }
            let (found, end) = walk(&file, from)?;
            let whole = from == 0;
            walked.push((pack, Walked::Found { found, end, whole }));
        }
        let mut index = lock(&self.index);
        for (pack, w) in walked {
            match w {
                Walked::Gone => {
                    index.walked.remove(&pack);
                }
                Walked::Found { found, end, whole } => {
                    if whole {
                        index.unindexed.push((pack, end, found.clone()));
                    }
                    index.add_found(pack, found);
                    let e = index.walked.entry(pack).or_default();
                    *e = (*e).max(end);
                }
            }
        }
        Ok(())
    }

    /// Writes the `.idx` of every pack but the last that was walked whole at open, so the
    /// next open reads a few bytes per entry instead of the pack (invariant 6). Only the
    /// last pack is ever appended to; an index that no longer matches its pack's length is
    /// ignored anyway. Best effort: a failure costs the next open a walk, nothing else.
    pub(super) fn write_indexes(&self, dir: &File) {
        let (last, unindexed) = {
            let mut index = lock(&self.index);
            let last = index.walked.keys().next_back().copied();
            (last, std::mem::take(&mut index.unindexed))
        };
        for (pack, len, found) in unindexed {
            if Some(pack) == last {
                continue;
            }
            if let Err(e) = write_index(dir, pack, len, &found) {
                log::info!(
                    "store: cannot write the index of {} ({e}); it is read whole at each open",
                    pack_name(pack).to_string_lossy()
                );
            }
        }
    }

    /// Whether an object is in a pack. `refresh`: on a miss, look at what other processes
    /// appended since (a reader's index is a snapshot).
    pub(super) fn contains(&self, dir: &File, digest: &[u8; 32], refresh: bool) -> bool {
        self.place(dir, digest, refresh).is_some()
    }

    fn place(&self, dir: &File, digest: &[u8; 32], refresh: bool) -> Option<Place> {
        if let Some(p) = lock(&self.index).objects.get(digest) {
            return Some(*p);
        }
        if !refresh {
            return None;
        }
        if let Err(e) = self.walk_new(dir) {
            log::warn!("store: cannot read the packs: {e}");
        }
        lock(&self.index).objects.get(digest).copied()
    }

    /// An object's data, verified (invariant 1); `None` if no pack holds it. A damaged
    /// entry is dropped from the index and reported as `InvalidData`.
    pub(super) fn read(
        &self,
        dir: &File,
        digest: &[u8; 32],
        refresh: bool,
    ) -> io::Result<Option<Vec<u8>>> {
        // A compaction may move the entry between the lookup and the open: look again then
        // (the moved entry is found by a refresh).
        for attempt in 0..3 {
            let Some(place) = self.place(dir, digest, refresh || attempt > 0) else {
                return Ok(None);
            };
            let file = match open_pack(dir, place.pack, libc::O_RDONLY) {
                Ok(f) => f,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    self.forget_pack_if_unchanged(digest, place);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut data = vec![0u8; place.len as usize];
            let n = read_full_at(&file, &mut data, place.offset)?;
            if n == data.len() && Sha256::digest(&data).as_slice() == digest {
                self.mark_verified(digest, place);
                return Ok(Some(data));
            }
            self.drop_damaged(digest, place);
            return Err(damaged_error(format!(
                "store: object {} in {} at offset {} does not match its name (damaged by a \
                 power loss?); it is no longer used",
                hex::encode_string(digest),
                pack_name(place.pack).to_string_lossy(),
                place.offset
            )));
        }
        Err(io::Error::from_raw_os_error(libc::ESTALE))
    }

    fn forget_pack_if_unchanged(&self, digest: &[u8; 32], place: Place) {
        let mut index = lock(&self.index);
        if index.objects.get(digest) == Some(&place) {
            index.objects.remove(digest);
            index.walked.remove(&place.pack);
        }
    }

    fn mark_verified(&self, digest: &[u8; 32], place: Place) {
        if let Some(p) = lock(&self.index).objects.get_mut(digest)
            && p.pack == place.pack
            && p.offset == place.offset
        {
            p.verified = true;
        }
    }

    /// Whether `digest`'s only entry was found damaged and dropped (no good copy since).
    pub(super) fn is_damaged(&self, digest: &[u8; 32]) -> bool {
        let index = lock(&self.index);
        index.damaged.contains(digest) && !index.objects.contains_key(digest)
    }

    fn drop_damaged(&self, digest: &[u8; 32], place: Place) {
        log::warn!(
            "store: dropping damaged pack entry {} ({} at offset {})",
            hex::encode_string(digest),
            pack_name(place.pack).to_string_lossy(),
            place.offset
        );
        let mut index = lock(&self.index);
        if index
            .objects
            .get(digest)
            .is_some_and(|p| p.offset == place.offset && p.pack == place.pack)
        {
            index.objects.remove(digest);
            index.damaged.insert(*digest);
        }
    }

    /// Whether the object is stored and its data checked (invariant 1): what a put may
    /// report as reused.
    fn lookup_verified(&self, dir: &File, digest: &[u8; 32]) -> bool {
        match self.place(dir, digest, false) {
            None => false,
            Some(p) if p.verified => true,
            Some(_) => matches!(self.read(dir, digest, false), Ok(Some(_))),
        }
    }

    /// Stores `data` (at most [`MAX_ENTRY`] bytes) named `digest`, its SHA-256. Returns
    /// whether it was stored already. On error nothing of it stays in the pack.
    pub(super) fn put(
        &self,
        dir: &File,
        digest: &[u8; 32],
        data: &[u8],
        policy: SyncPolicy,
    ) -> io::Result<bool> {
        debug_assert!(data.len() as u64 <= MAX_ENTRY);
        if self.lookup_verified(dir, digest) {
            if policy == SyncPolicy::EachPut {
                // It may have been appended a moment ago by a put that has not synced yet.
                self.sync_appender()?;
            }
            return Ok(true);
        }
        let entry = entry_bytes(digest, data);
        let mut append = lock(&self.append);
        // A racing put of the same content may have appended it while we waited.
        if matches!(lock(&self.index).objects.get(digest), Some(p) if p.verified) {
            return Ok(true);
        }
        let mut created = false;
        if append.as_ref().is_none_or(|a| a.end >= ROLL_SIZE) {
            if let Some(full) = append.take()
                && policy == SyncPolicy::Batched
            {
                lock(&self.unsynced).files.push(full.file);
            }
            let (a, new) = self.start_appending(dir)?;
            created = new;
            *append = Some(a);
        }
        let a = append.as_mut().expect("an appender was just set");
        if let Err(e) = write_all_at(&a.file, &entry, a.end) {
            // Leave no part of the entry behind (invariant 2 would stop later walks there).
            if let Err(t) = a.file.set_len(a.end) {
                log::warn!("store: cannot cut a failed append from a pack: {t}");
                *append = None;
            }
            return Err(e);
        }
        let place = Place {
            pack: a.pack,
            offset: a.end + HEADER as u64,
            len: data.len() as u32,
            verified: true,
        };
        a.end += entry.len() as u64;
        let (pack, end, file) = (a.pack, a.end, a.file.clone());
        {
            let mut index = lock(&self.index);
            index.objects.insert(*digest, place);
            index.damaged.remove(digest);
            index.walked.insert(pack, end);
        }
        match policy {
            SyncPolicy::EachPut => {
                crate::state::durability::sync_file(&file, true)?;
                if created {
                    crate::state::durability::sync_file(dir, false)?;
                }
            }
            SyncPolicy::Batched => {
                drop(append);
                let mut u = lock(&self.unsynced);
                if !u.files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                    u.files.push(file);
                }
                u.new_name |= created;
            }
            SyncPolicy::Caller => {}
        }
        Ok(false)
    }

    /// Opens the pack to append to: the last one if this process can lock it and it has
    /// room (its torn tail cut away, invariant 2), else a new one. Returns whether a pack
    /// was created.
    fn start_appending(&self, dir: &File) -> io::Result<(Appender, bool)> {
        let (last, compacting) = {
            self.walk_new(dir)?;
            let index = lock(&self.index);
            let last = index.walked.iter().next_back().map(|(p, e)| (*p, *e));
            (last, index.compacting)
        };
        if let Some((pack, _)) = last.filter(|(p, _)| Some(*p) != compacting) {
            match open_pack(dir, pack, libc::O_RDWR) {
                Ok(file) => {
                    if file.try_lock().is_ok() {
                        // Locked: nobody else appends now, so a walk to the end is final.
                        let from = lock(&self.index).walked.get(&pack).copied().unwrap_or(0);
                        let (found, end) = walk(&file, from)?;
                        if end < ROLL_SIZE {
                            if file.metadata()?.len() > end {
                                log::info!(
                                    "store: cutting a torn entry from the end of {}",
                                    pack_name(pack).to_string_lossy()
                                );
                                file.set_len(end)?;
                            }
                            let mut index = lock(&self.index);
                            index.add_found(pack, found);
                            index.walked.insert(pack, end);
                            let file = Arc::new(file);
                            return Ok((Appender { pack, file, end }, false));
                        }
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        let (pack, file) = self.create_pack(dir, last.map_or(1, |(p, _)| p + 1))?;
        lock(&self.index).walked.insert(pack, 0);
        Ok((
            Appender {
                pack,
                file: Arc::new(file),
                end: 0,
            },
            true,
        ))
    }

    /// Creates (exclusively) and locks the first free pack number from `from`.
    fn create_pack(&self, dir: &File, from: u32) -> io::Result<(u32, File)> {
        let mut pack = from;
        loop {
            match open_pack(dir, pack, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) {
                Ok(file) => {
                    file.lock()?;
                    return Ok((pack, file));
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    pack = pack
                        .checked_add(1)
                        .ok_or_else(|| io::Error::other("store: out of pack numbers"))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// fdatasyncs the pack being appended to (for an `EachPut` reuse).
    fn sync_appender(&self) -> io::Result<()> {
        let file = lock(&self.append).as_ref().map(|a| a.file.clone());
        match file {
            Some(f) => crate::state::durability::sync_file(&f, true),
            None => Ok(()),
        }
    }

    /// The packs written since the last call (invariant 4). The caller syncs them, then the
    /// directory if `new_name`; on failure it gives them back with [`Packs::put_back`].
    pub(super) fn take_unsynced(&self) -> Unsynced {
        std::mem::take(&mut *lock(&self.unsynced))
    }

    pub(super) fn put_back(&self, mut u: Unsynced) {
        let mut mine = lock(&self.unsynced);
        mine.files.append(&mut u.files);
        mine.new_name |= u.new_name;
    }

    pub(super) fn has_unsynced(&self) -> bool {
        !lock(&self.unsynced).is_empty()
    }

    /// Every packed object: name and length.
    pub(super) fn objects(&self) -> Vec<(String, u64)> {
        lock(&self.index)
            .objects
            .iter()
            .map(|(d, p)| (hex::encode_string(d), u64::from(p.len)))
            .collect()
    }

    /// Removes an object from the index; its bytes stay in the pack until
    /// [`Packs::compact`]. Returns whether a pack held it.
    pub(super) fn remove(&self, digest: &[u8; 32]) -> bool {
        let mut index = lock(&self.index);
        match index.objects.remove(digest) {
            Some(p) => {
                index.holed.insert(p.pack);
                true
            }
            None => false,
        }
    }

    /// Rewrites every pack that has removed entries without them (invariant 5), through a
    /// locked temp file of the store that is renamed to a new pack name. Returns the bytes
    /// given back.
    ///
    /// Puts and reads go on meanwhile (gc runs it after mutations are admitted again): no
    /// lock is held across its IO. A pack being rewritten gets no appends (the appender
    /// leaves it, and none reopens it while `compacting` names it), and no entry of it is
    /// removed (only gc removes, before it compacts), so its indexed entries are exactly
    /// the ones copied; a put of content it holds meanwhile finds the old entry, which
    /// stays readable until the index points to the copy. The caller runs one compaction
    /// at a time (gc holds the control maintenance lock).
    pub(super) fn compact(&self, store: &super::Store) -> io::Result<u64> {
        let holed = std::mem::take(&mut lock(&self.index).holed);
        let mut freed = 0u64;
        let mut holed = holed.into_iter();
        while let Some(pack) = holed.next() {
            let rewritten = self.compact_pack(store, pack);
            let mut index = lock(&self.index);
            index.compacting = None;
            match rewritten {
                Ok(n) => freed += n,
                Err(e) => {
                    // Left for the next compaction.
                    index.holed.insert(pack);
                    index.holed.extend(holed);
                    return Err(e);
                }
            }
        }
        Ok(freed)
    }

    /// [`Packs::compact`] of one pack; returns the bytes given back.
    fn compact_pack(&self, store: &super::Store, pack: u32) -> io::Result<u64> {
        let dir = &store.dir_fd;
        let left = {
            let mut append = lock(&self.append);
            lock(&self.index).compacting = Some(pack);
            // Stop appending there; the next put starts a new pack.
            append.take_if(|a| a.pack == pack)
        };
        if let Some(a) = left {
            crate::state::durability::sync_file(&a.file, true)?;
        }
        let old = match open_pack(dir, pack, libc::O_RDONLY) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(0),
            Err(e) => return Err(e),
        };
        let old_size = old.metadata()?.len();
        let live: Vec<([u8; 32], Place)> = lock(&self.index)
            .objects
            .iter()
            .filter(|(_, p)| p.pack == pack)
            .map(|(d, p)| (*d, *p))
            .collect();
        let mut moved = Vec::with_capacity(live.len());
        let mut kept = 0u64;
        let mut temp = None;
        if !live.is_empty() {
            let t = store.create_temp()?;
            for (digest, place) in &live {
                let mut data = vec![0u8; place.len as usize];
                let n = read_full_at(&old, &mut data, place.offset)?;
                if n != data.len() || Sha256::digest(&data).as_slice() != digest {
                    log::warn!(
                        "store: gc drops damaged pack entry {}",
                        hex::encode_string(digest)
                    );
                    continue;
                }
                write_all_at(&t.file, &entry_bytes(digest, &data), kept)?;
                moved.push((*digest, kept + HEADER as u64, place.len));
                kept += (HEADER + data.len()) as u64;
            }
            crate::state::durability::sync_file(&t.file, true)?;
            temp = Some(t);
        }
        // The new pack's name is made durable before the old pack goes, and with the
        // index unlocked (readers keep using the old pack until the switch below).
        let mut number = None;
        if let Some(mut t) = temp {
            let mut n = lock(&self.index)
                .walked
                .keys()
                .next_back()
                .map_or(1, |n| n + 1);
            loop {
                match super::rename_noreplace(dir, &t.name, &pack_name(n)) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => n += 1,
                    Err(e) => return Err(e),
                }
            }
            t.linked = false;
            crate::state::durability::sync_file(dir, false)?;
            number = Some(n);
        }
        let mut index = lock(&self.index);
        index.objects.retain(|_, p| p.pack != pack);
        if let Some(number) = number {
            for (digest, offset, len) in moved {
                let place = Place {
                    pack: number,
                    offset,
                    len,
                    verified: true,
                };
                index.objects.insert(digest, place);
            }
            index.walked.insert(number, kept);
        }
        index.walked.remove(&pack);
        drop(index);
        unlink_at(dir, &pack_name(pack))?;
        match unlink_at(dir, &idx_name(pack)) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
            _ => {}
        }
        crate::state::durability::sync_file(dir, false)?;
        Ok(old_size.saturating_sub(kept))
    }
}

/// An entry as it is written: header, then data.
fn entry_bytes(digest: &[u8; 32], data: &[u8]) -> Vec<u8> {
    let mut entry = Vec::with_capacity(HEADER + data.len());
    entry.extend_from_slice(&MAGIC);
    entry.extend_from_slice(&(data.len() as u32).to_le_bytes());
    entry.extend_from_slice(digest);
    entry.extend_from_slice(data);
    entry
}

#[cfg(test)]
mod tests {
    use super::super::{Store, SyncPolicy};
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Path;

    fn sha(data: &[u8]) -> String {
        hex::encode_string(&Sha256::digest(data))
    }

    /// The directory's entries, sorted.
    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn pack_path(dir: &Path, n: u32) -> std::path::PathBuf {
        dir.join(pack_name(n).to_str().expect("ascii"))
    }

    #[test]
    fn small_objects_go_into_one_pack_and_read_back_from_a_new_store() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open(&dir).expect("open");
        let src = tmp.path().join("src.txt");
        std::fs::write(&src, b"a small file\n").expect("write");
        let a = store
            .put_file(&File::open(&src).expect("open src"))
            .expect("put_file");
        let b = store.put_bytes(b"link/target").expect("put_bytes");
        let empty = store.put_bytes(b"").expect("put empty");
        assert_eq!(a.method, super::super::CopyMethod::Packed);
        assert_eq!(a.name, sha(b"a small file\n"));
        assert_eq!(empty.name, sha(b""));
        assert!(store.put_bytes(b"link/target").expect("again").reused);
        // No object file: one pack.
        assert_eq!(entries(&dir), vec!["pack-00000001".to_string()]);

        let again = Store::open(&dir).expect("reopen");
        for (obj, data) in [
            (&a, &b"a small file\n"[..]),
            (&b, b"link/target"),
            (&empty, b""),
        ] {
            assert!(again.contains(&obj.name));
            assert_eq!(again.read_object(&obj.name).expect("read"), data);
            assert!(again.verify(&obj.name).expect("verify"));
            let f = again.open_object(&obj.name).expect("open_object");
            let mut got = Vec::new();
            (&f).read_to_end(&mut got).expect("read memfd");
            assert_eq!(got, data);
            // A sealed memfd: the content handed out cannot be changed through it.
            assert!(f.write_at(b"x", 0).is_err());
        }
        let mut names = vec![a.name.clone(), b.name.clone(), empty.name.clone()];
        names.sort();
        assert_eq!(again.list().expect("list"), names);
        assert_eq!(again.total_size().expect("size"), 13 + 11);
        // A reopened store trusts nothing it did not write: a put of known content checks
        // the entry and then reports it as stored.
        let reput = again.put_bytes(b"a small file\n").expect("put");
        assert!(reput.reused);
        assert_eq!(entries(&dir), vec!["pack-00000001".to_string()]);
    }

    #[test]
    fn big_or_sparse_files_stay_files_of_their_own() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open(&dir).expect("open");
        let big = vec![7u8; MAX_ENTRY as usize + 1];
        let big_obj = store.put_bytes(&big).expect("put big");
        assert_eq!(big_obj.method, super::super::CopyMethod::Copy);
        // 40 KiB with a hole in the middle: small, but its hole must be kept.
        let sparse = tmp.path().join("sparse");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&sparse)
            .expect("create");
        f.write_at(b"head", 0).expect("write");
        f.write_at(b"tail", 40 << 10).expect("write");
        let sparse_obj = store.put_file(&f).expect("put sparse");
        let mut want = vec![big_obj.name.clone(), sparse_obj.name.clone()];
        want.sort();
        assert_eq!(entries(&dir), want);
    }

    #[test]
    fn a_torn_tail_is_ignored_then_cut_by_the_next_appender() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let first = {
            let store = Store::open(&dir).expect("open");
            store.put_bytes(b"whole entry").expect("put").name
        };
        let pack = pack_path(&dir, 1);
        let whole = std::fs::metadata(&pack).expect("stat").len();
        // What a kill -9 in the middle of an append leaves: a header and part of the data.
        let mut torn = entry_bytes(&[9u8; 32], &[1u8; 1000]);
        torn.truncate(HEADER + 300);
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&pack)
            .expect("open pack");
        f.write_at(&torn, whole).expect("append torn");
        drop(f);

        let store = Store::open(&dir).expect("reopen");
        assert_eq!(store.list().expect("list"), vec![first.clone()]);
        assert_eq!(store.read_object(&first).expect("read"), b"whole entry");
        let second = store.put_bytes(b"after the tear").expect("put");
        let store = Store::open(&dir).expect("reopen again");
        assert_eq!(
            store.read_object(&second.name).expect("read"),
            b"after the tear"
        );
        assert_eq!(
            std::fs::metadata(&pack).expect("stat").len(),
            whole + (HEADER + 14) as u64,
            "the torn entry was cut before the append"
        );
    }

    fn drop_file(_: File) -> Vec<u8> {
        Vec::new()
    }

    #[test]
    fn a_damaged_entry_is_never_served_nor_reused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let data = b"content a power loss garbled";
        let name = Store::open(&dir)
            .expect("open")
            .put_bytes(data)
            .expect("put")
            .name;
        let pack = pack_path(&dir, 1);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&pack)
            .expect("open pack");
        f.write_at(b"X", HEADER as u64 + 3).expect("damage");
        drop(f);

        let store = Store::open(&dir).expect("reopen");
        let err = store
            .read_object(&name)
            .expect_err("a damaged entry must not be read");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert_eq!(crate::sys::os_error(&err), Some(libc::EIO), "{err}");
        assert!(err.to_string().contains("does not match its name"), "{err}");
        // Read again (its entry is out of the index now): still damaged, never ENOENT.
        for again in [
            store.read_object(&name),
            store.open_object(&name).map(drop_file),
        ] {
            let err = again.expect_err("a damaged entry must not be read");
            assert_eq!(crate::sys::os_error(&err), Some(libc::EIO), "{err}");
            assert!(err.to_string().contains(&name), "{err}");
        }
        assert!(
            !Store::open(&dir)
                .expect("reopen")
                .verify(&name)
                .expect("verify")
        );
        // Stored anew, not reported as already stored.
        let store = Store::open(&dir).expect("reopen");
        let again = store.put_bytes(data).expect("put");
        assert!(!again.reused);
        assert_eq!(store.read_object(&name).expect("read"), data);
        assert_eq!(
            Store::open(&dir)
                .expect("reopen")
                .read_object(&name)
                .expect("read"),
            data
        );
    }

    #[test]
    fn compaction_drops_removed_entries_and_keeps_the_rest() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open(&dir).expect("open");
        let keep: Vec<String> = (0..20)
            .map(|i| {
                store
                    .put_bytes(format!("keep {i}").as_bytes())
                    .expect("put")
                    .name
            })
            .collect();
        let doomed: Vec<String> = (0..20)
            .map(|i| {
                store
                    .put_bytes(format!("doomed {i} {}", "x".repeat(1000)).as_bytes())
                    .expect("put")
                    .name
            })
            .collect();
        let before = std::fs::metadata(pack_path(&dir, 1)).expect("stat").len();
        for name in &doomed {
            store.remove(name).expect("remove");
        }
        assert!(!store.contains(&doomed[0]));
        let freed = store.compact().expect("compact");
        assert!(freed >= 20 * 1000, "freed only {freed} bytes");
        assert!(!pack_path(&dir, 1).exists(), "the old pack is gone");
        let packs: Vec<String> = entries(&dir)
            .into_iter()
            .filter(|n| n.starts_with(PACK_PREFIX))
            .collect();
        assert_eq!(packs.len(), 1, "{packs:?}");
        let after = std::fs::metadata(dir.join(&packs[0])).expect("stat").len();
        assert_eq!(before - after, freed);
        for (i, name) in keep.iter().enumerate() {
            assert_eq!(
                store.read_object(name).expect("read"),
                format!("keep {i}").as_bytes()
            );
        }
        // Appends go on after a compaction, and a new store sees the same.
        let more = store.put_bytes(b"after gc").expect("put");
        let reopened = Store::open(&dir).expect("reopen");
        let mut want = keep.clone();
        want.push(more.name.clone());
        want.sort();
        assert_eq!(reopened.list().expect("list"), want);
        assert_eq!(reopened.read_object(&more.name).expect("read"), b"after gc");
    }

    /// gc compacts with mutations running: puts of new content, of content the pack being
    /// rewritten holds, and of content just removed, and reads, all during the compaction.
    /// Nothing is lost, each content is readable, and a new store sees exactly the kept,
    /// the new and the stored-again objects.
    #[test]
    fn puts_and_reads_during_a_compaction_lose_nothing() {
        // The daemon's two policies: Batched keeps a full pack's file (and its lock) until
        // the batch syncs it, Caller does not.
        for policy in [SyncPolicy::Batched, SyncPolicy::Caller] {
            puts_and_reads_during_a_compaction(policy);
        }
    }

    fn puts_and_reads_during_a_compaction(policy: SyncPolicy) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open_with(&dir, policy).expect("open");
        let content = |kind: &str, i: usize| format!("{kind} {i} {}", "z".repeat(900)).into_bytes();
        let put_all = |kind: &str| -> Vec<String> {
            (0..1500)
                .map(|i| store.put_bytes(&content(kind, i)).expect("put").name)
                .collect()
        };
        let keep = put_all("keep");
        let doomed = put_all("doomed");
        for name in &doomed {
            store.remove(name).expect("remove");
        }
        let done = std::sync::atomic::AtomicBool::new(false);
        let (mut added, mut again) = (Vec::new(), Vec::new());
        std::thread::scope(|s| {
            let compaction = s.spawn(|| {
                let freed = store.compact().expect("compact");
                done.store(true, std::sync::atomic::Ordering::Release);
                freed
            });
            let (store, done, keep) = (&store, &done, &keep);
            let writer = s.spawn(move || {
                let (mut added, mut again) = (Vec::new(), Vec::new());
                let mut i = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || i < 200 {
                    added.push(store.put_bytes(&content("new", i)).expect("put").name);
                    assert_eq!(
                        store
                            .put_bytes(&content("keep", i % 1500))
                            .expect("put")
                            .name,
                        keep[i % 1500]
                    );
                    if i < 1500 {
                        again.push((i, store.put_bytes(&content("doomed", i)).expect("put").name));
                    }
                    i += 1;
                }
                (added, again)
            });
            let reader = s.spawn(move || {
                let mut i = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || i < 200 {
                    let k = (i * 7) % 1500;
                    assert_eq!(
                        store.read_object(&keep[k]).expect("read"),
                        content("keep", k)
                    );
                    i += 1;
                }
            });
            let freed = compaction.join().expect("compaction");
            assert!(freed >= 1000 * 900, "freed only {freed} bytes");
            (added, again) = writer.join().expect("writer");
            reader.join().expect("reader");
        });
        store.sync().expect("sync");
        let reopened = Store::open(&dir).expect("reopen");
        for (i, name) in keep.iter().enumerate() {
            assert_eq!(
                reopened.read_object(name).expect("read"),
                content("keep", i)
            );
        }
        for (i, name) in added.iter().enumerate() {
            assert_eq!(reopened.read_object(name).expect("read"), content("new", i));
        }
        for (i, name) in &again {
            assert_eq!(
                reopened.read_object(name).expect("read"),
                content("doomed", *i)
            );
        }
        let mut want: Vec<String> = keep.iter().chain(&added).cloned().collect();
        want.extend(again.iter().map(|(_, n)| n.clone()));
        want.sort();
        want.dedup();
        assert_eq!(reopened.list().expect("list"), want);
    }

    #[test]
    fn two_stores_on_one_directory_append_to_packs_of_their_own_and_see_each_other() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let one = Store::open(&dir).expect("open");
        let two = Store::open(&dir).expect("second open");
        let a = one.put_bytes(b"from one").expect("put");
        let b = two.put_bytes(b"from two").expect("put");
        assert_eq!(
            entries(&dir),
            vec!["pack-00000001".to_string(), "pack-00000002".to_string()]
        );
        // Each finds the other's object (its index is refreshed on a miss).
        assert_eq!(one.read_object(&b.name).expect("read"), b"from two");
        assert!(two.contains(&a.name));
        assert_eq!(two.read_object(&a.name).expect("read"), b"from one");
    }

    #[test]
    fn concurrent_puts_append_each_content_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open_with(&dir, SyncPolicy::Batched).expect("open");
        let contents: Vec<Vec<u8>> = (0..50)
            .map(|i| format!("content {i} {}", "y".repeat(i * 100)).into_bytes())
            .collect();
        std::thread::scope(|s| {
            for t in 0..8usize {
                let (store, contents) = (&store, &contents);
                s.spawn(move || {
                    for k in 0..200usize {
                        let data = &contents[(t * 7 + k * 13) % contents.len()];
                        let obj = store.put_bytes(data).expect("put");
                        assert_eq!(obj.name, sha(data));
                    }
                });
            }
        });
        // Every content once in the pack, each readable from a new store.
        let file = File::open(pack_path(&dir, 1)).expect("open pack");
        let (found, end) = walk(&file, 0).expect("walk");
        assert_eq!(found.len(), contents.len());
        assert_eq!(end, file.metadata().expect("stat").len());
        let reopened = Store::open(&dir).expect("reopen");
        for data in &contents {
            assert_eq!(&reopened.read_object(&sha(data)).expect("read"), data);
        }
    }

    #[test]
    fn a_full_pack_is_closed_and_the_next_append_starts_another() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open_with(&dir, SyncPolicy::Caller).expect("open");
        let per = ROLL_SIZE / MAX_ENTRY + 2;
        let mut names = Vec::new();
        for i in 0..per {
            let mut data = vec![0u8; MAX_ENTRY as usize];
            data[..8].copy_from_slice(&i.to_le_bytes());
            names.push(store.put_bytes(&data).expect("put").name);
        }
        assert!(pack_path(&dir, 2).exists(), "{:?}", entries(&dir));
        let reopened = Store::open(&dir).expect("reopen");
        assert_eq!(reopened.list().expect("list").len(), names.len());
        let mut data = vec![0u8; MAX_ENTRY as usize];
        data[..8].copy_from_slice(&(per - 1).to_le_bytes());
        assert_eq!(
            reopened
                .read_object(&names[per as usize - 1])
                .expect("read"),
            data
        );
    }

    /// Fills pack 1 and starts pack 2 through a daemon-like store; returns the names put.
    fn two_packs(dir: &Path) -> Vec<String> {
        let store = Store::open_with(dir, SyncPolicy::Caller).expect("open");
        (0..ROLL_SIZE / MAX_ENTRY + 2)
            .map(|i| {
                let mut data = vec![1u8; MAX_ENTRY as usize];
                data[..8].copy_from_slice(&i.to_le_bytes());
                store.put_bytes(&data).expect("put").name
            })
            .collect()
    }

    #[test]
    fn a_closed_pack_gets_an_index_that_the_next_open_reads_instead_of_the_pack() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let names = two_packs(&dir);
        assert!(!dir.join("pack-00000001.idx").exists());
        // The daemon's next open writes the closed pack's index, not the last pack's.
        drop(Store::open_with(&dir, SyncPolicy::Batched).expect("daemon open"));
        assert!(
            dir.join("pack-00000001.idx").exists(),
            "{:?}",
            entries(&dir)
        );
        assert!(!dir.join("pack-00000002.idx").exists());
        // Spoil the first entry's header in the pack: a walk would now find nothing in it,
        // so finding every object proves the index was read.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(pack_path(&dir, 1))
            .expect("open pack");
        f.write_at(b"XXXX", 0).expect("spoil");
        drop(f);
        let store = Store::open(&dir).expect("open");
        let mut want = names.clone();
        want.sort();
        assert_eq!(store.list().expect("list"), want);
        assert_eq!(
            store.read_object(&names[0]).expect("read")[..8],
            0u64.to_le_bytes()
        );
        // An index that no longer matches its pack (here: a longer pack) is not used.
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(pack_path(&dir, 1))
            .expect("open pack");
        f.write_at(b"!", f.metadata().expect("stat").len())
            .expect("grow");
        drop(f);
        let store = Store::open(&dir).expect("open");
        assert_eq!(
            store.list().expect("list").len(),
            2,
            "pack 1 walked (and found nothing), pack 2's two entries listed"
        );
    }

    #[test]
    fn a_damaged_index_is_ignored_and_the_pack_walked() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let names = two_packs(&dir);
        drop(Store::open_with(&dir, SyncPolicy::Batched).expect("daemon open"));
        let idx = dir.join("pack-00000001.idx");
        let mut data = std::fs::read(&idx).expect("read idx");
        data[20] ^= 0xff;
        std::fs::write(&idx, &data).expect("damage idx");
        let store = Store::open(&dir).expect("open");
        assert_eq!(store.list().expect("list").len(), names.len());
        // The daemon's next open writes a good one again.
        drop(Store::open_with(&dir, SyncPolicy::Batched).expect("daemon open"));
        assert_ne!(std::fs::read(&idx).expect("read idx"), data);
    }

    #[test]
    fn batched_puts_are_synced_by_the_batch_and_a_failed_append_leaves_nothing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("backups");
        let store = Store::open_with(&dir, SyncPolicy::Batched).expect("open");
        store.put_bytes(b"one").expect("put");
        store.put_bytes(b"two").expect("put");
        assert!(store.has_unsynced());
        assert_eq!(store.sync_batch().expect("sync"), 1, "one pack, one sync");
        assert!(!store.has_unsynced());

        // A pack that cannot grow: RLIMIT_FSIZE is per process, so use a read-only reopen of
        // the pack file instead to make the append fail.
        let packs = Packs::open(&store.dir_fd, &[b"pack-00000001".to_vec()]).expect("open");
        let ro = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(pack_path(&dir, 1))
            .expect("open ro");
        let size = ro.metadata().expect("stat").len();
        *lock(&packs.append) = Some(Appender {
            pack: 1,
            file: Arc::new(ro),
            end: size,
        });
        let digest: [u8; 32] = Sha256::digest(b"three").into();
        let err = packs
            .put(&store.dir_fd, &digest, b"three", SyncPolicy::Batched)
            .expect_err("a read-only pack cannot take an append");
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "{err}");
        assert!(!packs.contains(&store.dir_fd, &digest, false));
        assert_eq!(
            std::fs::metadata(pack_path(&dir, 1)).expect("stat").len(),
            size
        );
    }
}
