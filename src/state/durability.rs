//! How durable Layer 1 backups are, and what that costs on the syscall path (`--durability`).
//!
//! Whatever the mode, a pre-image is in the page cache before the change it protects goes
//! ahead: the object's bytes are written (`write(2)` completed) and renamed onto its hash,
//! and its journal record is written, all before the gate lets the syscall proceed. The page
//! cache belongs to the kernel, so `kill -9` of the daemon (or a panic) never loses a
//! pre-image. The modes differ only in when that data reaches the disk, i.e. in what a power
//! loss or kernel crash can take:
//!
//! - [`Durability::Strict`]: each backup is on disk before the syscall proceeds, with **one**
//!   sync: `syncfs` of the store's filesystem after the object and the record are written.
//!   One call makes the object's data, its name (the directory entry) and the journal record
//!   durable together, where per-file syncs would need three (object, directory, journal).
//! - [`Durability::Batched`] (the default): no sync on the syscall path. A syncer thread makes
//!   every backup durable within [`SYNC_INTERVAL`]: it fdatasyncs the objects written since
//!   its last round, then the store directory, then the journal. A power loss loses at most
//!   the backups of the last [`SYNC_INTERVAL`] (plus the time one round takes).
//! - [`Durability::Process`]: no syncs by the store at all until unmount (which syncs
//!   everything); survives the daemon's death, and a power loss only as far as the kernel's
//!   own writeback got (typically up to 30 s).
//!
//! The transcript writer syncs the store before each of its fdatasyncs (in the strict and
//! batched modes), so a record that is durable in the transcript always has a durable object.
//!
//! Every sync in the crate's Layer 1 path goes through [`sync_file`] or [`syncfs`], which count
//! the syncs made by the calling thread ([`syncs_on_this_thread`]): that is how the history
//! measures the syncs a backup costs on the syscall path (reported at unmount and by
//! `status`).
use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The `--durability` levels (see the module docs for what survives what).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Durability {
    /// Every backup is on disk before the change proceeds (one syncfs per backup)
    Strict,
    /// No sync on the syscall path; backups reach the disk within 50 ms (a syncer thread)
    #[default]
    Batched,
    /// No syncs until unmount: survives kill -9 of the daemon, not a power loss
    Process,
}

impl Durability {
    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Strict => "strict",
            Durability::Batched => "batched",
            Durability::Process => "process",
        }
    }
}

/// How often the batched mode's syncer makes new backups durable: the most (plus one round's
/// time) a power loss can take in that mode.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(50);

thread_local! {
    static SYNCS: Cell<u64> = const { Cell::new(0) };
}

/// Syncs made so far by the calling thread through [`sync_file`] and [`syncfs`].
pub fn syncs_on_this_thread() -> u64 {
    SYNCS.with(Cell::get)
}

fn count() {
    SYNCS.with(|c| c.set(c.get() + 1));
}

/// `fdatasync` (`data_only`) or `fsync` of `file`, counted.
pub fn sync_file(file: &File, data_only: bool) -> io::Result<()> {
    count();
    if data_only {
        file.sync_data()
    } else {
        file.sync_all()
    }
}

/// `syncfs` of the filesystem holding `file`, counted: writes back and commits everything
/// dirty on that filesystem (data, inodes, directory entries) and reports writeback errors.
pub fn syncfs(file: &File) -> io::Result<()> {
    count();
    // SAFETY: `file` is an open fd for the duration of the call; syncfs touches no memory.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
