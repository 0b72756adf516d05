//! Storing a file that is about to leave SRC (unlinked, or replaced by a rename) by linking
//! its inode into the store instead of copying it: the pre-image then costs one read (for
//! its hash) and no write, and no new blocks.
//!
//! The danger of sharing an inode with a live file is that the object changes under its
//! name (store invariant 1) — and because identical content is stored once, a changed
//! object would be what every later backup of that content restores. The rules below keep
//! the content of a linked object fixed from before it is hashed for as long as it is in
//! the store.
//!
//! # Invariants
//!
//! L1. **Only a file nobody else can change is linked.** It must be a regular file with
//!     exactly one name, on the store's filesystem, too big for a pack, and the daemon must
//!     get a read lease on it ([`ReadLease`]): granted only while nobody anywhere has it open
//!     for writing. Anything else is copied, as before.
//! L2. **The content cannot change while it is linked and shared.** The lease is held from
//!     before the hash until the SRC name is gone and the object is sealed (L3) or replaced
//!     by a copy (L4). While it is held an open for writing or a truncate waits; the caller
//!     has the path marked busy, so no change through the mount reaches it either.
//! L3. **Sealing, once the SRC name is gone** ([`LinkedObject::removed`]): the object gets
//!     the store's owner and mode 0400, so that a leftover fd of another process can no
//!     longer be reopened for writing through `/proc/PID/fd`. If it still has another name,
//!     or an opener already passed its permission check and waits for the lease, it is
//!     replaced by a copy (L4) while the lease still holds its content. After the lease is
//!     released one more check catches an opener that passed its permission check before the
//!     chmod but counted itself as a writer only after the first check (a window of a few
//!     instructions inside one open(2)); the object is then replaced by a copy if it still
//!     hashes to its name, and the mismatch is logged if it does not.
//! L4. **A removal that fails leaves no live file shared with the store**
//!     ([`LinkedObject::kept`]): the object is replaced by a verified copy (temp, hash
//!     checked against the name, rename over it) before the lease is released.
use std::ffi::CString;
use std::fs::{File, Permissions};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use base16ct::lower as hex;
use sha2::Digest;

use super::{
    BUF_SIZE, CopyMethod, OBJECT_MODE, Store, StoredObject, SyncPolicy, copy_and_hash, hash_file,
    object_cname,
};
use crate::sys::{self, ReadLease};

/// What [`Store::put_by_link`] did.
pub enum LinkPut<'s> {
    /// Not linkable (L1): store the file by copying it, as [`Store::put_file`] does. The
    /// file comes back for that.
    Copy(File),
    /// This content is stored already: nothing was linked, nothing is left to do.
    Stored(StoredObject),
    /// Linked: the object shares the file's inode until the caller says how its removal
    /// went ([`LinkedObject::removed`] or [`LinkedObject::kept`]).
    Linked(LinkedObject<'s>),
}

/// An object that is, for now, a second name of a file still in SRC (L2). Dropping it
/// without a verdict counts as [`LinkedObject::kept`]: the removal did not happen.
pub struct LinkedObject<'s> {
    store: &'s Store,
    /// The file, open read-only, with the lease that keeps its content fixed.
    lease: Option<ReadLease>,
    object: StoredObject,
    cname: CString,
}

impl Store {
    /// Stores `src` (open read-only) by linking its inode into the store when L1 allows,
    /// else hands it back for a copy. Durability as [`Store::put_file`]: with
    /// [`SyncPolicy::EachPut`] the data and the name are synced before this returns.
    pub fn put_by_link(&self, src: File) -> io::Result<LinkPut<'_>> {
        let meta = src.metadata()?;
        let store_dev = self.dir_fd.metadata()?.dev();
        if !meta.is_file()
            || meta.nlink() != 1
            || meta.dev() != store_dev
            || self.pack_limit.is_none_or(|limit| meta.len() <= limit)
        {
            return Ok(LinkPut::Copy(src));
        }
        let lease = match ReadLease::take(src) {
            Ok(lease) => lease,
            // Open for writing somewhere (EAGAIN), not ours (EACCES), no leases here (EINVAL).
            Err((_, src)) => return Ok(LinkPut::Copy(src)),
        };
        let mut buf = vec![0u8; BUF_SIZE];
        let (hasher, size) = hash_file(lease.file(), &mut buf)?;
        if !lease.still_held() {
            // A writer waited out the lease while we read: what we hashed may be gone.
            return Ok(LinkPut::Copy(lease.release()));
        }
        let name = hex::encode_string(&hasher.finalize());
        let stored_already = |name| {
            Ok(LinkPut::Stored(StoredObject {
                name,
                size,
                reused: true,
                method: CopyMethod::Existing,
            }))
        };
        self.doomed.claim(&name);
        if self.contains(&name) {
            return stored_already(name);
        }
        let cname = object_cname(&name)?;
        match link_into(lease.file(), &self.dir_fd, &cname) {
            Ok(()) => {}
            // Stored meanwhile by another put of the same content.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return stored_already(name),
            // EXDEV, EPERM (protected_hardlinks), EMLINK...: copy instead.
            Err(e) => {
                log::debug!("store: cannot link a backup into the store ({e}); copying it");
                return Ok(LinkPut::Copy(lease.release()));
            }
        }
        let linked = LinkedObject {
            store: self,
            lease: Some(lease),
            object: StoredObject {
                name,
                size,
                reused: false,
                method: CopyMethod::Linked,
            },
            cname,
        };
        linked.make_durable()?;
        Ok(LinkPut::Linked(linked))
    }
}

/// `linkat` of an open file into `dir` as `name`, through its /proc link (AT_EMPTY_PATH
/// would need CAP_DAC_READ_SEARCH).
fn link_into(file: &File, dir: &File, name: &CString) -> io::Result<()> {
    sys::with_proc_path(file.as_raw_fd(), |path| {
        // SAFETY: valid fds and NUL-terminated paths; linkat does not retain them.
        sys::cvt(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                path.as_ptr(),
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })?;
        Ok(())
    })
}

impl LinkedObject<'_> {
    /// The object as stored (its name goes into the backup record).
    pub fn object(&self) -> &StoredObject {
        &self.object
    }

    /// Invariant 2 for a linked object: its data and its name are synced now
    /// ([`SyncPolicy::EachPut`]) or listed for the batch.
    fn make_durable(&self) -> io::Result<()> {
        match self.store.policy {
            SyncPolicy::EachPut => {
                if let Some(lease) = &self.lease {
                    crate::state::durability::sync_file(lease.file(), true)?;
                }
                self.store.sync()
            }
            SyncPolicy::Batched => {
                self.store.lock_unsynced().push(self.cname.clone());
                Ok(())
            }
            SyncPolicy::Caller => Ok(()),
        }
    }

    /// The SRC name is gone: seals the object (L3), or replaces it by a copy when it cannot
    /// be sealed. Never fails the removal, which has happened: what goes wrong is logged.
    pub fn removed(mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        match seal(lease.file()) {
            Ok(()) if !lease.writer_waiting() => {}
            Ok(()) => {
                log::debug!(
                    "store: a writer waits for backup {}; storing a copy instead",
                    self.object.name
                );
                return self.replace_by_copy(lease);
            }
            Err(e) => {
                log::debug!(
                    "store: cannot seal backup {} ({e}); storing a copy",
                    self.object.name
                );
                return self.replace_by_copy(lease);
            }
        }
        let file = lease.release();
        // L3's last check: an opener that passed its permission check before the chmod.
        match ReadLease::take(file) {
            Ok(lease) => drop(lease),
            Err((e, _)) if e.raw_os_error() == Some(libc::EAGAIN) => self.replace_late(),
            Err(_) => {}
        }
    }

    /// The removal failed and the file stays in SRC: the object must stop sharing its inode
    /// (L4). Dropping the object does that.
    pub fn kept(self) {}

    /// L4: a verified copy replaces the linked object, read while `lease` still holds the
    /// content.
    fn replace_by_copy(&self, lease: ReadLease) {
        if let Err(e) = self.copy_over(lease.file()) {
            log::error!(
                "store: backup {} still shares its inode with a file that can change: cannot \
                 replace it by a copy: {e}",
                self.object.name
            );
        }
        drop(lease);
    }

    /// After the lease: a writer got in. The object stays only if it still matches its name.
    fn replace_late(&self) {
        let result = (|| {
            let file = super::openat(
                &self.store.dir_fd,
                &self.cname,
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0,
            )?;
            self.copy_over(&file)
        })();
        if let Err(e) = result {
            log::error!(
                "store: a process opened backup {} for writing as it was stored, and it \
                 could not be replaced by a copy: {e}; views of it may show what that process \
                 wrote",
                self.object.name
            );
        }
    }

    /// Copies `from` into a temp, checks that it hashes to the object's name, and renames it
    /// over the object.
    fn copy_over(&self, from: &File) -> io::Result<()> {
        let store = self.store;
        let temp = store.create_temp()?;
        let mut buf = vec![0u8; BUF_SIZE];
        let (hasher, _) = copy_and_hash(from, &temp.file, &mut buf)?;
        let name = hex::encode_string(&hasher.finalize());
        if name != self.object.name {
            return Err(io::Error::other(format!(
                "its content changed (it now hashes to {name})"
            )));
        }
        temp.file
            .set_permissions(Permissions::from_mode(OBJECT_MODE))?;
        store.commit_replacing(temp, &self.cname)
    }
}

impl Drop for LinkedObject<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.replace_by_copy(lease);
        }
    }
}

/// Gives a linked object the store's owner (when the daemon may chown) and mode.
fn seal(file: &File) -> io::Result<()> {
    let meta = file.metadata()?;
    if meta.nlink() != 1 {
        return Err(io::Error::other("it has another name"));
    }
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 && (meta.uid() != uid || meta.gid() != gid) {
        // SAFETY: plain fchown on an fd we own; the file has left SRC (its only name is ours).
        sys::cvt(unsafe { libc::fchown(file.as_fd().as_raw_fd(), uid, gid) })?;
    }
    file.set_permissions(Permissions::from_mode(OBJECT_MODE))
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build and remove their own files in a temp dir"
)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    /// 2 MiB of pseudo-random bytes (too big for a pack), then a 1 MiB hole and 4 KiB more.
    fn write_big_file(path: &Path, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut data = Vec::with_capacity(2 << 20);
        while data.len() < 2 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        let file = File::create(path).expect("create");
        file.write_all_at(&data, 0).expect("write");
        file.write_all_at(&data[..4096], (3 << 20) as u64)
            .expect("write tail");
        let mut whole = data;
        whole.resize(3 << 20, 0);
        let head = whole[..4096].to_vec();
        whole.extend_from_slice(&head);
        whole
    }

    fn setup() -> (tempfile::TempDir, Store, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&tmp.path().join("store")).expect("store");
        let src = tmp.path().join("src");
        (tmp, store, src)
    }

    fn put<'s>(store: &'s Store, path: &Path) -> LinkPut<'s> {
        store
            .put_by_link(File::open(path).expect("open"))
            .expect("put_by_link")
    }

    fn ino(path: &Path) -> u64 {
        std::fs::symlink_metadata(path).expect("stat").ino()
    }

    fn object_path(store: &Store, name: &str) -> PathBuf {
        store.dir().join(name)
    }

    #[test]
    fn a_file_leaving_src_is_linked_then_sealed() {
        let (_tmp, store, src) = setup();
        let content = write_big_file(&src, 1);
        let src_ino = ino(&src);
        let LinkPut::Linked(linked) = put(&store, &src) else {
            panic!("a lone file nobody writes must be linked");
        };
        let name = linked.object().name.clone();
        assert_eq!(linked.object().method, CopyMethod::Linked);
        assert_eq!(
            ino(&object_path(&store, &name)),
            src_ino,
            "no copy was made"
        );
        std::fs::remove_file(&src).expect("unlink");
        linked.removed();
        let meta = std::fs::metadata(object_path(&store, &name)).expect("object");
        assert_eq!(meta.ino(), src_ino);
        assert_eq!(meta.nlink(), 1);
        assert_eq!(meta.mode() & 0o7777, OBJECT_MODE);
        // SAFETY: plain getter.
        if unsafe { libc::geteuid() } == 0 {
            assert_eq!((meta.uid(), meta.gid()), (0, 0));
        }
        assert_eq!(store.read_object(&name).expect("read"), content);
        assert!(store.verify(&name).expect("verify"));
    }

    #[test]
    fn a_removal_that_fails_leaves_the_file_alone_and_a_copy_in_the_store() {
        let (_tmp, store, src) = setup();
        let content = write_big_file(&src, 2);
        let src_ino = ino(&src);
        let LinkPut::Linked(linked) = put(&store, &src) else {
            panic!("expected a link");
        };
        let name = linked.object().name.clone();
        linked.kept();
        assert_ne!(
            ino(&object_path(&store, &name)),
            src_ino,
            "replaced by a copy"
        );
        assert_eq!(std::fs::metadata(&src).expect("src").nlink(), 1);
        assert_eq!(std::fs::read(&src).expect("src"), content);
        assert!(store.verify(&name).expect("verify"));

        // No verdict at all (an error between the backup and the removal) counts as kept.
        let other = src.with_file_name("other");
        write_big_file(&other, 6);
        let other_ino = ino(&other);
        let LinkPut::Linked(linked) = put(&store, &other) else {
            panic!("expected a link");
        };
        let name = linked.object().name.clone();
        drop(linked);
        assert_ne!(ino(&object_path(&store, &name)), other_ino);
        assert_eq!(std::fs::metadata(&other).expect("other").nlink(), 1);
    }

    #[test]
    fn what_someone_else_could_change_is_copied() {
        let (tmp, store, src) = setup();
        write_big_file(&src, 4);
        // A second name.
        let alias = tmp.path().join("alias");
        std::fs::hard_link(&src, &alias).expect("link");
        assert!(matches!(put(&store, &src), LinkPut::Copy(_)));
        std::fs::remove_file(&alias).expect("unlink alias");
        // An open writer (anywhere: this one is outside any mount).
        let writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&src)
            .expect("open for writing");
        assert!(matches!(put(&store, &src), LinkPut::Copy(_)));
        drop(writer);
        // Small enough for a pack.
        let small = tmp.path().join("small");
        std::fs::write(&small, b"a small file").expect("write");
        assert!(matches!(put(&store, &small), LinkPut::Copy(_)));
        // Stored already: nothing to link.
        let stored = store
            .put_file(&File::open(&src).expect("open"))
            .expect("put");
        let LinkPut::Stored(object) = put(&store, &src) else {
            panic!("the content is stored already");
        };
        assert_eq!(object.name, stored.name);
        assert_eq!(std::fs::metadata(&src).expect("src").nlink(), 1);
        // Nothing is linked now.
        assert_ne!(ino(&object_path(&store, &object.name)), ino(&src));
    }

    /// Whether some process has `path` open for writing or waits to: a read lease on a
    /// fresh open file is then refused.
    fn writer_counted(path: &Path) -> bool {
        let file = File::open(path).expect("open");
        matches!(ReadLease::take(file), Err((e, _)) if e.raw_os_error() == Some(libc::EAGAIN))
    }

    #[test]
    fn a_writer_that_waits_for_the_lease_gets_the_old_inode_not_the_object() {
        let (_tmp, store, src) = setup();
        let content = write_big_file(&src, 5);
        let src_ino = ino(&src);
        let LinkPut::Linked(linked) = put(&store, &src) else {
            panic!("expected a link");
        };
        let name = linked.object().name.clone();
        // Opens (and so resolves the name) now, waits for the lease, then writes.
        let writer = {
            let src = src.clone();
            std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&src)
                    .expect("open for writing");
                f.write_all(b"written after the backup").expect("write");
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !writer_counted(&src) {
            assert!(
                Instant::now() < deadline,
                "the writer never started its open"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!writer.is_finished(), "the open must wait for the lease");
        std::fs::remove_file(&src).expect("unlink");
        linked.removed();
        writer.join().expect("writer");
        let object = object_path(&store, &name);
        assert_ne!(
            ino(&object),
            src_ino,
            "the waiting writer's inode left the store"
        );
        assert_eq!(std::fs::read(&object).expect("object"), content);
        assert!(store.verify(&name).expect("verify"));
    }
}
