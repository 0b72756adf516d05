//! The space a state dir keeps so that `gc` can always run on a full disk (issue 28 item 7).
//!
//! gc frees space only after it has written: first the compacted transcript (at most the old
//! one's size; the crash order in `history::gc` needs the new one durable before any object
//! goes), then each pack rewritten without its dead entries (at most one pack, 32 MiB, at a
//! time). On a disk that something filled, that first write failed with ENOSPC and nothing
//! could be freed. So the state dir holds `gc-reserve`, a file of allocated but unwritten
//! blocks (`fallocate`, no data written) as large as gc's writes need: gc deletes it before
//! it writes, and makes it again, sized for the new transcript, once it is done.
//!
//! The reserve is sized when the daemon starts and after each gc; a transcript that grows
//! past it in between can still find the disk too full, which gc's error then names. It never
//! takes more than half of the free space (a warning says when that is less than it wants).
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The reserve's file name in the state dir.
pub const GC_RESERVE_FILE: &str = "gc-reserve";

/// One pack's worth (packs roll at 32 MiB) plus a margin for the journal and temp files.
const FLOOR: u64 = 40 << 20;
/// A reserve never takes more than this, whatever the transcript.
const CEILING: u64 = 1 << 30;

/// The reserve that lets gc compact a transcript of `transcript_len` bytes.
pub fn size_for(transcript_len: u64) -> u64 {
    transcript_len.saturating_add(8 << 20).clamp(FLOOR, CEILING)
}

/// Makes `STATE/gc-reserve` hold `bytes` allocated bytes. Returns the bytes it holds: fewer
/// when they would take more than half of the disk's free space.
pub fn keep(state_dir: &Path, bytes: u64) -> io::Result<u64> {
    let path = state_dir.join(GC_RESERVE_FILE);
    #[allow(
        clippy::disallowed_methods,
        reason = "the state dir's own file, 0600 and never a symlink (O_NOFOLLOW)"
    )]
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(super::dir::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| crate::sys::context(format!("creating {}", path.display()), e))?;
    let have = file.metadata()?.len();
    if have > bytes {
        file.set_len(bytes)?;
        return Ok(bytes);
    }
    // Never more than half of what is free: a reserve that filled a nearly full disk would
    // fail the very backups it is there to make room for.
    let st = crate::sys::fstatvfs(file.as_fd())?;
    let avail = st.f_bavail.saturating_mul(st.f_frsize);
    let want = bytes.min(have + avail / 2);
    let len = libc::off_t::try_from(want).unwrap_or(libc::off_t::MAX);
    // SAFETY: fallocate(2) on an fd we own, mode 0 (allocate and extend), a range of plain
    // integers.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } == 0 {
        return Ok(want);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // Another writer took the space meanwhile: keep what there is.
        Some(libc::ENOSPC) => Ok(have),
        _ => Err(crate::sys::context(
            format!("allocating {want} bytes for {}", path.display()),
            err,
        )),
    }
}

/// Deletes the reserve, giving its space to gc. Missing already: nothing to do.
pub fn release(state_dir: &Path) -> io::Result<()> {
    let path = state_dir.join(GC_RESERVE_FILE);
    #[allow(clippy::disallowed_methods, reason = "the state dir's own file")]
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(crate::sys::context(
            format!("removing {}", path.display()),
            e,
        )),
        _ => Ok(()),
    }
}

/// Sizes the reserve for a transcript of `transcript_len` bytes, logging what it could not
/// get. Best effort: a reserve is insurance, never a reason to fail a mount or a gc.
pub fn renew(state_dir: &Path, transcript_len: u64) {
    let want = size_for(transcript_len);
    match keep(state_dir, want) {
        Ok(got) if got >= want => {}
        Ok(got) => log::warn!(
            "the state dir's disk has room for {got} of the {want} bytes gc keeps in reserve \
             ({}): gc on a full disk may fail; free space on it",
            state_dir.join(GC_RESERVE_FILE).display()
        ),
        Err(e) => log::warn!("cannot keep gc's reserve: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_covers_the_transcript_and_a_pack_within_bounds() {
        assert_eq!(size_for(0), FLOOR);
        assert_eq!(size_for(100 << 20), (108 << 20));
        assert_eq!(size_for(u64::MAX), CEILING);
    }

    #[test]
    fn keep_allocates_shrinks_and_release_removes() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        assert_eq!(keep(d.path(), 4 << 20).unwrap(), 4 << 20);
        let md = std::fs::metadata(d.path().join(GC_RESERVE_FILE)).unwrap();
        assert_eq!(md.len(), 4 << 20);
        assert!(md.blocks() * 512 >= 4 << 20, "allocated, not sparse");
        assert_eq!(md.mode() & 0o777, 0o600);
        assert_eq!(keep(d.path(), 1 << 20).unwrap(), 1 << 20);
        assert_eq!(
            std::fs::metadata(d.path().join(GC_RESERVE_FILE))
                .unwrap()
                .len(),
            1 << 20
        );
        release(d.path()).unwrap();
        release(d.path()).unwrap();
        assert!(!d.path().join(GC_RESERVE_FILE).exists());
    }
}
