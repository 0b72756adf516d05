//! The one way a whole file is written: every file of the state dir that is written whole
//! (`source`, `daemon.pid`, `mountpoint`, `signing-id`, `settings.json`, the transcript when gc
//! compacts it), the agents' settings files that `install-hook` edits, and the record key
//! (created once, never replaced: [`create`]).
//!
//! # Durability contract
//!
//! [`replace`] (and [`write`], built on it) replaces `DIR/NAME` in five steps, each begun
//! only once the one before succeeded:
//!
//! 1. **create** a temp file `DIR/.NAME.tmp-PID-RANDOM` (`O_CREAT | O_EXCL | O_NOFOLLOW`, so
//!    never an existing file or a symlink), and `fchmod` it to exactly the mode the caller
//!    gives (0600 for the state dir's files, `crate::state::dir` rule 2): no umask applies;
//! 2. **fill**: the caller writes the new content into it;
//! 3. **fsync** the temp file: its data and inode are on disk;
//! 4. **rename** it over `NAME` (`renameat`: atomic, for every reader);
//! 5. **fsync `DIR`**: the rename itself is on disk.
//!
//! What a crash at each point leaves at `NAME`:
//!
//! | crash                         | the process dies (`kill -9`, abort) | the machine dies (power loss) |
//! |-------------------------------|-------------------------------------|-------------------------------|
//! | before step 4 completed       | the old file (or none)              | the old file (or none)        |
//! | after step 4, before 5 ended  | the new file                        | the old file or the new one   |
//! | after step 5                  | the new file                        | the new file                  |
//!
//! `NAME` is never torn: whoever reads it, now or after any crash, reads the whole old file
//! or the whole new one (after a power loss, the new name can only have survived with its
//! data, because step 3 came before step 4). A crash before step 4 may leave the temp file:
//! it holds nothing anyone needs, its name says so ([`is_temp_name`]), and
//! [`crate::state::dir::remove_leftover_temps`] removes it the next time the state dir is
//! opened for changes (a mount, or `gc --state-dir`).
//!
//! Errors: if a step before the rename fails, the temp file is removed and `NAME` is
//! untouched. A failed directory fsync (step 5) comes after the rename: `NAME` holds the new
//! content, which a power loss may still undo; [`replace`] reports it apart
//! ([`Replaced::dir_synced`]) so that a caller keeping the file open (the transcript writer)
//! knows the rename happened. Every error names `NAME` and the step, and keeps the failed
//! call's `io::Error` (so its errno, see `crate::sys::errno_of`) as its source.
//!
//! [`create`] takes the same steps, but its step 4 never replaces: `renameat2` with
//! `RENAME_NOREPLACE`, or, where the filesystem lacks that, `link` then `unlink` of the temp
//! file (a kill between the two leaves the temp file as a second name of the new file). If
//! `NAME` exists by then, it is left as it is and the temp file goes. What a crash leaves at
//! `NAME` is the table above with "the old file (or none)" read as "none" (or whoever else
//! created it first).
//!
//! Concurrent replacements of one `NAME` are safe (each has its own temp file; the last
//! rename wins) but nothing orders them: the state dir's writers hold its lock
//! (`crate::state::lock`).
use std::ffi::{CString, OsStr};
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `contents` to `dir/name` with mode `mode`, through a temp file, fsync, rename and
/// fsync of `dir` (see the module docs for what survives a crash at each step).
pub fn write(dir: &Path, name: impl AsRef<OsStr>, contents: &[u8], mode: u32) -> io::Result<()> {
    replace(dir, name.as_ref(), mode, |file| file.write_all(contents))?.dir_synced
}

/// Creates `dir/name` holding `contents`, with mode `mode`, unless it exists: the steps of
/// [`write`], with a rename that never replaces (see the module docs). `Ok(false)`: `name`
/// existed (made by someone else meanwhile, say); it is left as it is, and the temp file is
/// gone.
pub fn create(dir: &Path, name: impl AsRef<OsStr>, contents: &[u8], mode: u32) -> io::Result<bool> {
    let name = name.as_ref();
    let dir_fd = open_dir(dir, name)?;
    match put_at(dir_fd.as_fd(), dir, name, mode, Onto::Absent, |file| {
        file.write_all(contents)
    })? {
        Some(created) => created.dir_synced.map(|()| true),
        None => Ok(false),
    }
}

/// The outcome of a [`replace`] whose rename happened.
#[derive(Debug)]
pub struct Replaced<T> {
    /// The new file, now named `NAME`, still open: read-write, in append mode
    /// (`O_RDWR | O_APPEND`, close-on-exec), so that a writer can go on appending to it.
    pub file: File,
    /// What the fill closure returned.
    pub value: T,
    /// Whether the rename is durable yet (step 5). An `Err` here does not undo the rename.
    pub dir_synced: io::Result<()>,
}

/// Replaces `dir/name` with a new file of mode `mode` whose content `fill` writes (it may
/// write as much as it likes, buffered or not); then fsync, rename over `name`, fsync of
/// `dir`. `Err`: `name` is untouched and the temp file is gone. `Ok`: the rename happened;
/// [`Replaced::dir_synced`] says whether it is durable yet.
pub fn replace<T>(
    dir: &Path,
    name: &OsStr,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<T>,
) -> io::Result<Replaced<T>> {
    let dir_fd = open_dir(dir, name)?;
    replace_at(dir_fd.as_fd(), dir, name, mode, fill)
}

fn open_dir(dir: &Path, name: &OsStr) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| failed(Step::OpenDir, dir, name, e))
}

/// [`replace`] in the directory `dir` (an open directory fd: every step is relative to it);
/// `dir_path` is only for messages.
pub fn replace_at<T>(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<T>,
) -> io::Result<Replaced<T>> {
    let replaced = put_at(dir, dir_path, name, mode, Onto::Replace, fill)?;
    Ok(replaced.expect("a replacing rename never finds the name taken"))
}

/// What step 4 may do to an existing `NAME`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Onto {
    /// Replace it (`renameat`).
    Replace,
    /// Leave it (and report `None`).
    Absent,
}

/// The five steps (see the module docs). `None`: `onto` is `Absent` and `NAME` exists.
fn put_at<T>(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &OsStr,
    mode: u32,
    onto: Onto,
    fill: impl FnOnce(&mut File) -> io::Result<T>,
) -> io::Result<Option<Replaced<T>>> {
    let fail = |step, e| failed(step, dir_path, name, e);
    let target = file_name(name).map_err(|e| fail(Step::Create, e))?;
    let (temp, mut file) = Temp::create(dir, name, mode).map_err(|e| fail(Step::Create, e))?;
    reached(Step::Create);
    let value = fill(&mut file).map_err(|e| fail(Step::Fill, e))?;
    reached(Step::Fill);
    file.sync_all().map_err(|e| fail(Step::SyncFile, e))?;
    reached(Step::SyncFile);
    match temp.rename_to(&target, onto) {
        Ok(()) => {}
        // The temp file went with `temp`.
        Err(e) if onto == Onto::Absent && e.raw_os_error() == Some(libc::EEXIST) => {
            return Ok(None);
        }
        Err(e) => return Err(fail(Step::Rename, e)),
    }
    reached(Step::Rename);
    // SAFETY: `dir` is an open fd for the duration of the call; fsync touches no memory.
    let dir_synced = match unsafe { libc::fsync(dir.as_raw_fd()) } {
        0 => Ok(()),
        _ => Err(fail(Step::SyncDir, io::Error::last_os_error())),
    };
    reached(Step::SyncDir);
    Ok(Some(Replaced {
        file,
        value,
        dir_synced,
    }))
}

/// Whether `name` is one [`replace`] gives its temp files: `.NAME.tmp-PID-RANDOM`, with a
/// non-empty `NAME`, a decimal `PID` and 16 lowercase hex digits of `RANDOM`.
pub fn is_temp_name(name: &[u8]) -> bool {
    const MARK: &[u8] = b".tmp-";
    let Some(rest) = name.strip_prefix(b".") else {
        return false;
    };
    let Some(at) = rest.windows(MARK.len()).rposition(|w| w == MARK) else {
        return false;
    };
    let (base, tail) = (&rest[..at], &rest[at + MARK.len()..]);
    let mut parts = tail.splitn(2, |&b| b == b'-');
    let (Some(pid), Some(random)) = (parts.next(), parts.next()) else {
        return false;
    };
    !base.is_empty()
        && !pid.is_empty()
        && pid.iter().all(u8::is_ascii_digit)
        && random.len() == RANDOM_DIGITS
        && random
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

const RANDOM_DIGITS: usize = 16;

/// The most of `NAME` a temp file's name keeps, so that it stays under `NAME_MAX` (255).
const NAME_KEPT: usize = 200;

/// A step of [`replace_at`], for messages (and the tests' pauses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    OpenDir,
    Create,
    Fill,
    SyncFile,
    Rename,
    SyncDir,
}

impl Step {
    fn doing(self) -> &'static str {
        match self {
            Step::OpenDir => "opening its directory",
            Step::Create => "creating a temporary file beside it",
            Step::Fill => "writing the temporary file",
            Step::SyncFile => "syncing the temporary file",
            Step::Rename => "renaming the temporary file over it",
            Step::SyncDir => {
                "syncing its directory: the new content is in place, but a power loss may \
                 undo that"
            }
        }
    }
}

/// The error of `step` on `dir/name`: `cannot write PATH (STEP): ERROR`, keeping `source`
/// (and its errno) as its source.
fn failed(step: Step, dir: &Path, name: &OsStr, source: io::Error) -> io::Error {
    let path = dir.join(name);
    crate::sys::context(
        format!("cannot write {} ({})", path.display(), step.doing()),
        source,
    )
}

/// `name` as a C string, if it names an entry of a directory (no `/`, not `.` or `..`).
fn file_name(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.contains(&b'/') || bytes == b"." || bytes == b".." {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A temp file of [`replace_at`]: unlinked when dropped, unless renamed into place first
/// (so also on an early return or a panic in the fill closure).
struct Temp<'a> {
    dir: BorrowedFd<'a>,
    name: CString,
    renamed: bool,
}

impl<'a> Temp<'a> {
    fn create(dir: BorrowedFd<'a>, target: &OsStr, mode: u32) -> io::Result<(Temp<'a>, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = &target.as_bytes()[..target.len().min(NAME_KEPT)];
        let mut tries = 0;
        loop {
            let random = {
                use std::hash::{BuildHasher, Hasher};
                // Keyed by the OS's randomness once per thread, then by a counter.
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
                h.finish()
            };
            let mut name = b".".to_vec();
            name.extend_from_slice(base);
            name.extend_from_slice(format!(".tmp-{}-{random:016x}", std::process::id()).as_bytes());
            let name =
                CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            let flags = libc::O_RDWR
                | libc::O_APPEND
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOFOLLOW
                | libc::O_CLOEXEC;
            // SAFETY: a valid directory fd and a NUL-terminated name; the fd returned is ours.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, 0o600) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                tries += 1;
                if e.raw_os_error() == Some(libc::EEXIST) && tries < 16 {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: `fd` was just returned by openat and nothing else owns it.
            let file = unsafe { File::from_raw_fd(fd) };
            let temp = Temp {
                dir,
                name,
                renamed: false,
            };
            // The exact mode, whatever the umask took from the one given to openat.
            file.set_permissions(Permissions::from_mode(mode))?;
            return Ok((temp, file));
        }
    }

    /// Step 4: the temp file becomes `target`. With [`Onto::Absent`], `EEXIST` if `target`
    /// exists (the temp file is then removed when `self` drops).
    fn rename_to(mut self, target: &CString, onto: Onto) -> io::Result<()> {
        let dir = self.dir.as_raw_fd();
        let (from, to) = (self.name.as_ptr(), target.as_ptr());
        let flags = match onto {
            Onto::Replace => 0,
            Onto::Absent => libc::RENAME_NOREPLACE,
        };
        // SAFETY: a valid directory fd and two NUL-terminated names.
        let renamed = unsafe {
            if flags == 0 {
                libc::renameat(dir, from, dir, to)
            } else {
                libc::renameat2(dir, from, dir, to, flags)
            }
        };
        if renamed == 0 {
            self.renamed = true;
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match (onto, e.raw_os_error()) {
            // No RENAME_NOREPLACE here (an older kernel, some network filesystems).
            (Onto::Absent, Some(libc::EINVAL | libc::ENOSYS)) => self.link_to(target),
            _ => Err(e),
        }
    }

    /// [`Onto::Absent`]'s step 4 without `RENAME_NOREPLACE`: a hard link, which never
    /// replaces; the temp name is unlinked when `self` drops.
    fn link_to(self, target: &CString) -> io::Result<()> {
        let dir = self.dir.as_raw_fd();
        // SAFETY: a valid directory fd and two NUL-terminated names; no flag: the temp file
        // is not a symlink (O_NOFOLLOW|O_EXCL made it), and nothing is followed.
        if unsafe { libc::linkat(dir, self.name.as_ptr(), dir, target.as_ptr(), 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            // SAFETY: a valid directory fd and a NUL-terminated name. Unlinking never
            // follows a symlink; the name is the file this Temp created.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0) };
        }
    }
}

/// Where the tests pause a write (see `tests::reached`); nothing outside tests.
fn reached(step: Step) {
    #[cfg(test)]
    tests::reached(step);
    let _ = step;
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::fs;
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};

    use super::*;

    /// A write's steps after its directory is open, in the contract's order.
    const STEPS: [Step; 5] = [
        Step::Create,
        Step::Fill,
        Step::SyncFile,
        Step::Rename,
        Step::SyncDir,
    ];

    thread_local! {
        /// The steps this thread's writes reached, in order.
        static REACHED: RefCell<Vec<Step>> = const { RefCell::new(Vec::new()) };
    }

    /// Set in a kill test's child: the step after which its write stops, says so on stdout
    /// and waits to be killed.
    const PAUSE_ENV: &str = "CHECKPOINTFS_TEST_ATOMIC_PAUSE_AFTER";
    /// Set in a kill test's child: the directory it writes `target` in.
    const DIR_ENV: &str = "CHECKPOINTFS_TEST_ATOMIC_DIR";
    /// Set in a kill test's child: write again and again (and say so after each), instead
    /// of once.
    const LOOP_ENV: &str = "CHECKPOINTFS_TEST_ATOMIC_LOOP";
    const PAUSED: &str = "atomic write paused after ";
    const WROTE: &str = "atomic write done: ";

    pub(super) fn reached(step: Step) {
        REACHED.with(|s| s.borrow_mut().push(step));
        if std::env::var(PAUSE_ENV).is_ok_and(|at| at == format!("{step:?}")) {
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{PAUSED}{step:?}");
            let _ = out.flush();
            drop(out);
            // Until the parent's SIGKILL.
            loop {
                std::thread::park();
            }
        }
    }

    fn steps_taken(f: impl FnOnce()) -> Vec<Step> {
        REACHED.with(|s| s.borrow_mut().clear());
        f();
        REACHED.with(|s| s.take())
    }

    /// The entries of `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn temps(dir: &Path) -> Vec<String> {
        listing(dir)
            .into_iter()
            .filter(|n| is_temp_name(n.as_bytes()))
            .collect()
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// The errno the error chain of `e` carries.
    fn errno(e: &io::Error) -> i32 {
        crate::sys::errno_of(e)
    }

    #[test]
    fn writes_the_content_with_the_mode_asked_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("f");
        for (content, want) in [(&b"one\n"[..], 0o600), (b"", 0o644), (b"three", 0o666)] {
            let steps = steps_taken(|| write(dir.path(), "f", content, want).unwrap());
            assert_eq!(steps, STEPS, "the steps run in the contract's order");
            assert_eq!(fs::read(&target).unwrap(), content);
            // Exactly, whatever the umask (0666 is more than a 022 umask lets open give).
            assert_eq!(mode(&target), want);
            assert_eq!(listing(dir.path()), ["f"]);
        }
    }

    #[test]
    fn replace_hands_back_the_new_file_open_for_appending() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("t"), b"old\n").unwrap();
        let mut done = replace(dir.path(), OsStr::new("t"), 0o600, |f| {
            f.write_all(b"new\n")?;
            Ok(4u64)
        })
        .unwrap();
        done.dir_synced.unwrap();
        assert_eq!(done.value, 4);
        done.file.write_all(b"more\n").unwrap();
        assert_eq!(fs::read(dir.path().join("t")).unwrap(), b"new\nmore\n");
    }

    #[test]
    fn create_makes_a_missing_file_and_leaves_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("record.key");
        assert!(create(dir.path(), "record.key", b"first", 0o600).unwrap());
        assert_eq!(fs::read(&key).unwrap(), b"first");
        assert_eq!(mode(&key), 0o600);
        assert!(!create(dir.path(), "record.key", b"second", 0o644).unwrap());
        assert_eq!(fs::read(&key).unwrap(), b"first", "never replaced");
        assert_eq!(mode(&key), 0o600);
        assert_eq!(listing(dir.path()), ["record.key"]);
    }

    /// Where the filesystem has no RENAME_NOREPLACE: a link, which never replaces either.
    #[test]
    fn create_by_link_never_replaces_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let fd = dir.path_fd();
        let target = CString::new("k").unwrap();
        for (content, made) in [(&b"first"[..], true), (b"second", false)] {
            let (temp, mut file) = Temp::create(fd, OsStr::new("k"), 0o600).unwrap();
            file.write_all(content).unwrap();
            let linked = temp.link_to(&target);
            if made {
                linked.unwrap();
            } else {
                assert_eq!(linked.unwrap_err().raw_os_error(), Some(libc::EEXIST));
            }
            assert_eq!(listing(dir.path()), ["k"]);
            assert_eq!(fs::read(dir.path().join("k")).unwrap(), b"first");
        }
    }

    #[test]
    fn a_failed_fill_removes_the_temp_file_leaves_the_target_and_keeps_the_errno() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("settings.json");
        fs::write(&target, b"old").unwrap();
        let err = write_failing(dir.path(), "settings.json", libc::ENOSPC).unwrap_err();
        assert_eq!(errno(&err), libc::ENOSPC);
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(
            err.to_string().contains(&format!(
                "cannot write {} (writing the temporary file)",
                target.display()
            )),
            "{err}"
        );
        assert_eq!(fs::read(&target).unwrap(), b"old");
        assert_eq!(listing(dir.path()), ["settings.json"]);
    }

    /// Half of a megabyte, then `errno`, as a full disk does.
    fn write_failing(dir: &Path, name: &str, errno: i32) -> io::Result<Replaced<()>> {
        replace(dir, OsStr::new(name), 0o600, |f| {
            f.write_all(&vec![b'x'; 512 << 10])?;
            Err(io::Error::from_raw_os_error(errno))
        })
    }

    #[test]
    fn a_panic_while_filling_removes_the_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let caught = std::panic::catch_unwind(|| {
            let _ = replace(dir.path(), OsStr::new("f"), 0o600, |f| -> io::Result<()> {
                f.write_all(b"partial")?;
                panic!("fill panics");
            });
        });
        assert!(caught.is_err());
        assert!(listing(dir.path()).is_empty());
    }

    #[test]
    fn a_missing_directory_or_a_bad_name_is_an_error_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let err = write(&gone, "f", b"x", 0o600).unwrap_err();
        assert_eq!(errno(&err), libc::ENOENT);
        assert!(err.to_string().contains("opening its directory"), "{err}");
        for bad in ["", ".", "..", "a/b"] {
            let err = write(dir.path(), bad, b"x", 0o600).unwrap_err();
            assert_eq!(errno(&err), libc::EINVAL, "{bad:?}");
        }
        assert!(listing(dir.path()).is_empty());
    }

    /// A real full disk: a 64 KiB tmpfs (needs root; skipped otherwise).
    #[test]
    fn enospc_on_a_full_tmpfs_removes_the_temp_file() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let mnt = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let mounted = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                mnt.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                c"size=64k,mode=0700".as_ptr().cast(),
            )
        };
        if mounted != 0 {
            eprintln!(
                "skipped: cannot mount a tmpfs: {}",
                io::Error::last_os_error()
            );
            return;
        }
        struct Unmount(CString);
        impl Drop for Unmount {
            fn drop(&mut self) {
                // SAFETY: a NUL-terminated path.
                unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _unmount = Unmount(mnt);
        write(dir.path(), "f", b"old", 0o600).unwrap();
        let err = write(dir.path(), "f", &vec![7u8; 1 << 20], 0o600).unwrap_err();
        assert_eq!(errno(&err), libc::ENOSPC, "{err}");
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"old");
        assert_eq!(listing(dir.path()), ["f"]);
    }

    #[test]
    fn temp_names_are_recognised_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let (temp, _file) =
            Temp::create(dir.path_fd(), OsStr::new("settings.json"), 0o600).unwrap();
        let made = temp.name.to_bytes().to_vec();
        assert!(is_temp_name(&made), "{}", String::from_utf8_lossy(&made));
        drop(temp);
        assert!(listing(dir.path()).is_empty(), "dropped temp file removed");
        let long = "n".repeat(255);
        let (temp, _file) = Temp::create(dir.path_fd(), OsStr::new(&long), 0o600).unwrap();
        assert!(is_temp_name(temp.name.to_bytes()));
        for yes in [
            ".a.tmp-1-0123456789abcdef",
            ".source.tmp-4242-fedcba9876543210",
            ".x.tmp-y.tmp-7-0000000000000000",
        ] {
            assert!(is_temp_name(yes.as_bytes()), "{yes}");
        }
        for no in [
            "settings.json",
            "a.tmp-1-0123456789abcdef",
            "..tmp-1-0123456789abcdef",
            ".a.tmp-1-0123456789abcde",
            ".a.tmp-1-0123456789abcdef0",
            ".a.tmp-1-0123456789ABCDEF",
            ".a.tmp--0123456789abcdef",
            ".a.tmp-x-0123456789abcdef",
            ".a.tmp-1-0123456789abcdef.keep",
            ".a.tmp",
            ".settings.json.tmp",
            ".transcript.jsonl.rewrite-1-2-3",
        ] {
            assert!(!is_temp_name(no.as_bytes()), "{no}");
        }
    }

    trait PathFd {
        fn path_fd(&self) -> BorrowedFd<'static>;
    }

    impl PathFd for tempfile::TempDir {
        /// A directory fd on the temp dir, leaked for the test's lifetime.
        fn path_fd(&self) -> BorrowedFd<'static> {
            let f = File::open(self.path()).unwrap();
            let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
            // SAFETY: the fd is leaked, so it stays open for the rest of the process.
            unsafe { BorrowedFd::borrow_raw(fd) }
        }
    }

    // ----- Kill tests: a child process writes; SIGKILL at each step, or at random points.

    /// Not a test of its own: the child process of the kill tests (it does nothing unless
    /// started by one). It replaces `target` in `$CHECKPOINTFS_TEST_ATOMIC_DIR` once (paused
    /// by `$CHECKPOINTFS_TEST_ATOMIC_PAUSE_AFTER`), or, with `$CHECKPOINTFS_TEST_ATOMIC_LOOP`,
    /// with version after version, saying on stdout when each is done.
    #[test]
    fn kill_test_child() {
        let Some(dir) = std::env::var_os(DIR_ENV).map(PathBuf::from) else {
            return;
        };
        if std::env::var_os(LOOP_ENV).is_none() {
            write(&dir, "target", &version(1), 0o600).unwrap();
            return;
        }
        let mut out = io::stdout().lock();
        for n in 0.. {
            write(&dir, "target", &version(n), 0o600).unwrap();
            writeln!(out, "{WROTE}{n}").unwrap();
            out.flush().unwrap();
        }
    }

    /// Version `n` of the target: its number, then 4 to 64 pages of a byte that depends on
    /// it, so that a torn or mixed file cannot pass for a version.
    fn version(n: u64) -> Vec<u8> {
        let mut v = n.to_le_bytes().to_vec();
        let len = 4096 * (4 + (n * 7919 % 61) as usize);
        v.resize(len, (n % 251) as u8);
        v
    }

    /// The version `bytes` is, if it is one whole.
    fn version_of(bytes: &[u8]) -> Option<u64> {
        let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
        (version(n) == bytes).then_some(n)
    }

    /// The child, killed (SIGKILL) and reaped when dropped, also if the test fails first.
    struct Killed(Child);

    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn start_child(
        dir: &Path,
        env: (&str, &str),
    ) -> (Killed, BufReader<std::process::ChildStdout>) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "state::atomic::tests::kill_test_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(DIR_ENV, dir)
            .env(env.0, env.1)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        (Killed(child), out)
    }

    /// Reads the child's stdout up to the next line with `prefix` in it; returns the rest of
    /// that line.
    fn next_line(out: &mut impl BufRead, prefix: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the child ended before printing {prefix:?}"
            );
            // The harness may have begun the line ("test NAME ... ").
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim_end().to_string();
            }
        }
    }

    /// SIGKILL, and reaped: gone when this returns.
    fn kill(mut child: Killed) {
        child.0.kill().unwrap();
        let status = child.0.wait().unwrap();
        assert!(!status.success(), "{status:?}");
    }

    /// Then opening the state dir for changes removes the temp file the kill left.
    fn open_removes_the_temps(dir: &Path) {
        crate::state::dir::remove_leftover_temps(dir).unwrap();
        assert_eq!(
            temps(dir),
            Vec::<String>::new(),
            "temp file left after the open"
        );
        assert_eq!(listing(dir), ["target"]);
    }

    #[test]
    fn killed_after_each_step_the_target_is_the_old_file_or_the_new_one() {
        for step in STEPS {
            let dir = tempfile::tempdir().unwrap();
            let target = dir.path().join("target");
            fs::write(&target, version(0)).unwrap();
            let (child, mut out) = start_child(dir.path(), (PAUSE_ENV, &format!("{step:?}")));
            assert_eq!(next_line(&mut out, PAUSED), format!("{step:?}"));
            kill(child);
            let renamed = step >= Step::Rename;
            assert_eq!(
                version_of(&fs::read(&target).unwrap()),
                Some(if renamed { 1 } else { 0 }),
                "killed after {step:?}"
            );
            assert_eq!(
                temps(dir.path()).len(),
                if renamed { 0 } else { 1 },
                "killed after {step:?}: {:?}",
                listing(dir.path())
            );
            open_removes_the_temps(dir.path());
            assert_eq!(
                version_of(&fs::read(&target).unwrap()),
                Some(renamed as u64)
            );
        }
    }

    #[test]
    fn killed_at_random_points_the_target_is_always_a_whole_version() {
        const ROUNDS: u64 = 40;
        let mut temps_left = 0;
        for round in 0..ROUNDS {
            let dir = tempfile::tempdir().unwrap();
            let (child, mut out) = start_child(dir.path(), (LOOP_ENV, "1"));
            // Kill while version `done + 1` is somewhere in its steps.
            let wait_for = round % 4;
            let mut done = 0;
            for _ in 0..=wait_for {
                done = next_line(&mut out, WROTE).parse::<u64>().unwrap();
            }
            kill(child);
            let found = version_of(&fs::read(dir.path().join("target")).unwrap());
            // The child may have gone on past `done` before the kill: any later version
            // will do, as long as it is whole.
            assert!(
                found.is_some_and(|n| n >= done),
                "round {round}: after version {done}, the target is {found:?}"
            );
            temps_left += temps(dir.path()).len();
            open_removes_the_temps(dir.path());
        }
        eprintln!("{temps_left} of {ROUNDS} kills came before a rename and left a temp file");
    }

    // ----- Power loss: an ext4 image shut down without flushing its journal.

    /// `_IOR('X', 125, __u32)`: shuts an ext4 filesystem down; with
    /// `EXT4_GOING_FLAGS_NOLOGFLUSH` (2) what its journal has not committed yet is lost, as in
    /// a power loss (xfstests' `godown` does the same).
    const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587d;
    const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;

    /// An ext4 image on a loop device, mounted `noauto_da_alloc` (else ext4 flushes a file
    /// replaced by a rename on its own, and a missing fsync would go unseen).
    struct Ext4 {
        image: PathBuf,
        mnt: PathBuf,
        mounted: bool,
    }

    impl Ext4 {
        /// `None` (the test is skipped) without root, mkfs.ext4 or loop devices.
        fn new(dir: &Path) -> Option<Ext4> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("skipped: a loop mount needs root");
                return None;
            }
            let image = dir.join("ext4.img");
            File::create(&image).unwrap().set_len(32 << 20).unwrap();
            let made = Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&image)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if !made.is_ok_and(|s| s.success()) {
                eprintln!("skipped: no mkfs.ext4");
                return None;
            }
            let mnt = dir.join("mnt");
            fs::create_dir(&mnt).unwrap();
            let mut fs = Ext4 {
                image,
                mnt,
                mounted: false,
            };
            if !fs.mount() {
                eprintln!("skipped: cannot loop-mount an ext4 image here");
                return None;
            }
            Some(fs)
        }

        fn mount(&mut self) -> bool {
            self.mounted = Command::new("mount")
                .args(["-t", "ext4", "-o", "loop,noauto_da_alloc"])
                .arg(&self.image)
                .arg(&self.mnt)
                .status()
                .is_ok_and(|s| s.success());
            self.mounted
        }

        fn umount(&mut self) {
            let done = Command::new("umount").arg(&self.mnt).status().unwrap();
            assert!(done.success(), "umount {}", self.mnt.display());
            self.mounted = false;
        }

        /// The power goes; then it comes back and the filesystem is mounted again (its
        /// journal replayed).
        fn lose_power(&mut self) {
            let root = File::open(&self.mnt).unwrap();
            let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
            // SAFETY: an open fd and a pointer to a u32 that outlives the call, as the ioctl
            // expects.
            let r = unsafe { libc::ioctl(root.as_raw_fd(), EXT4_IOC_SHUTDOWN, &flags) };
            assert_eq!(r, 0, "EXT4_IOC_SHUTDOWN: {}", io::Error::last_os_error());
        }

        fn restart(&mut self) {
            self.umount();
            assert!(self.mount(), "mount {} again", self.image.display());
        }
    }

    impl Drop for Ext4 {
        fn drop(&mut self) {
            if self.mounted {
                let _ = Command::new("umount").arg(&self.mnt).status();
            }
        }
    }

    fn syncfs(dir: &Path) {
        let f = File::open(dir).unwrap();
        // SAFETY: an open fd; syncfs touches no memory.
        assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
    }

    /// The contract's right-hand column: a power loss before the rename leaves the old file,
    /// between the rename and the end of the directory fsync the old or the new one, after it
    /// the new one; never a torn file. A dropped file fsync (an empty or partial target) or a
    /// directory fsync before the rename (the old target after `write` returned) fails here.
    #[test]
    fn power_lost_after_each_step_the_target_is_whole_and_durable_once_written() {
        let tmp = tempfile::tempdir().unwrap();
        let Some(mut ext4) = Ext4::new(tmp.path()) else {
            return;
        };
        let dir = ext4.mnt.join("state");
        fs::create_dir(&dir).unwrap();
        for step in STEPS {
            let target = dir.join("target");
            fs::write(&target, version(0)).unwrap();
            syncfs(&dir);
            let (child, mut out) = start_child(&dir, (PAUSE_ENV, &format!("{step:?}")));
            assert_eq!(next_line(&mut out, PAUSED), format!("{step:?}"));
            ext4.lose_power();
            kill(child);
            ext4.restart();
            let found = version_of(&fs::read(&target).unwrap());
            let allowed: &[u64] = match step {
                Step::Rename => &[0, 1],
                s if s > Step::Rename => &[1],
                _ => &[0],
            };
            assert!(
                found.is_some_and(|n| allowed.contains(&n)),
                "power lost after {step:?}: the target is {found:?}, not one of {allowed:?}"
            );
            open_removes_the_temps(&dir);
        }
    }
}
