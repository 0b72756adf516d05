//! Mount validation: SRC, MNT and the state dir made canonical and checked against each other
//! and against the mount table before anything is mounted, so a refusal changes nothing; and
//! the two cases `mount` resolves itself (its own dead mount, a previous daemon still
//! flushing).
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::mount::mountinfo::{find_mount, is_checkpointfs_mount, parse_mountinfo};
use crate::mount::registry::{MOUNTPOINT_FILE, PID_FILE, is_checkpointfs_process, read_pid_file};
use crate::mount::unmount::{
    endpoint_gone, fusermount_unmount, resolve_mountpoint, umount_syscall, wait_for_exit,
};
use crate::sys::{errno_of, error_text};

/// What validation reads from outside the filesystem, so that tests can supply it.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    pub xdg_data_home: Option<OsString>,
    pub home: Option<OsString>,
    /// The contents of /proc/self/mountinfo.
    pub mountinfo: Vec<u8>,
}

impl Environment {
    pub fn current() -> io::Result<Environment> {
        Ok(Environment {
            xdg_data_home: std::env::var_os("XDG_DATA_HOME"),
            home: std::env::var_os("HOME"),
            mountinfo: fs::read("/proc/self/mountinfo")?,
        })
    }
}

/// Canonical, validated paths for one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedPaths {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    /// Absolute and free of symlinks, `.` and `..`, but possibly not existing yet.
    pub state_dir: PathBuf,
    pub state_dir_exists: bool,
}

/// Why a mount is refused. Displayed after "checkpointfs: cannot mount: ".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRefusal {
    SourceMissing(PathBuf),
    SourceNotDir(PathBuf),
    MountpointMissing(PathBuf),
    MountpointNotDir(PathBuf),
    /// A FUSE mount whose daemon is gone (see `endpoint_gone`).
    MountpointDead(PathBuf),
    MountpointNotEmpty(PathBuf),
    MountpointIsMounted(PathBuf),
    MountpointIsSource(PathBuf),
    MountpointInsideSource {
        mnt: PathBuf,
        src: PathBuf,
    },
    SourceInsideMountpoint {
        src: PathBuf,
        mnt: PathBuf,
    },
    StateInsideSource {
        state: PathBuf,
        src: PathBuf,
    },
    StateInsideMountpoint {
        state: PathBuf,
        mnt: PathBuf,
    },
    StateNotDir(PathBuf),
    StateInUse {
        state: PathBuf,
        pid: i32,
    },
    /// Neither XDG_DATA_HOME nor HOME is usable and no --state-dir was given.
    NoDefaultStateDir,
    /// Any other error while looking at a path.
    Inaccessible {
        what: &'static str,
        path: PathBuf,
        error: String,
    },
}

impl std::fmt::Display for MountRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use MountRefusal::*;
        match self {
            SourceMissing(p) => write!(f, "source directory {} does not exist", p.display()),
            SourceNotDir(p) => write!(f, "source {} is not a directory", p.display()),
            MountpointMissing(p) => write!(f, "mount point {} does not exist", p.display()),
            MountpointNotDir(p) => write!(f, "mount point {} is not a directory", p.display()),
            MountpointDead(p) => write!(
                f,
                "mount point {} is a FUSE mount whose daemon is gone (transport endpoint is \
                 not connected); detach it with: umount -l {}",
                p.display(),
                p.display()
            ),
            MountpointNotEmpty(p) => write!(f, "mount point {} is not empty", p.display()),
            MountpointIsMounted(p) => {
                write!(f, "mount point {} is already a mount point", p.display())
            }
            MountpointIsSource(p) => write!(
                f,
                "mount point and source are the same directory ({})",
                p.display()
            ),
            MountpointInsideSource { mnt, src } => write!(
                f,
                "mount point {} is inside the source {}",
                mnt.display(),
                src.display()
            ),
            SourceInsideMountpoint { src, mnt } => write!(
                f,
                "source {} is inside the mount point {}",
                src.display(),
                mnt.display()
            ),
            StateInsideSource { state, src } => write!(
                f,
                "state dir {} is inside the source {}",
                state.display(),
                src.display()
            ),
            StateInsideMountpoint { state, mnt } => write!(
                f,
                "state dir {} is inside the mount point {}",
                state.display(),
                mnt.display()
            ),
            StateNotDir(p) => write!(f, "state dir {} exists and is not a directory", p.display()),
            StateInUse { state, pid } => {
                let mnt = fs::read(state.join(MOUNTPOINT_FILE))
                    .ok()
                    .map(|m| {
                        PathBuf::from(OsString::from_vec(
                            m.strip_suffix(b"\n").unwrap_or(&m).to_vec(),
                        ))
                    })
                    .unwrap_or_else(|| PathBuf::from("MNT"));
                write!(
                    f,
                    "state dir {} is in use by a running checkpointfs daemon (pid {pid}, \
                     mounted at {}). One state dir serves one mount. For a second view of \
                     the files: browse {}/.checkpoint/at/<id>/ (each checkpoint, read-only), \
                     or mount with another --state-dir (a separate history)",
                    state.display(),
                    mnt.display(),
                    mnt.display()
                )
            }
            NoDefaultStateDir => write!(
                f,
                "cannot choose a state dir: neither XDG_DATA_HOME nor HOME is set; \
                 pass --state-dir DIR"
            ),
            Inaccessible { what, path, error } => {
                write!(f, "cannot access {what} {}: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for MountRefusal {}

/// The default state dir for a canonical source path:
/// `$XDG_DATA_HOME/checkpointfs/<basename>-<16 hex of sha256(path)>`, with
/// `$HOME/.local/share` when XDG_DATA_HOME is unset, empty or relative (as the XDG spec
/// says). `None` when neither variable is usable.
pub fn default_state_dir(
    canonical_src: &Path,
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> Option<PathBuf> {
    let usable = |v: Option<&OsStr>| v.filter(|v| Path::new(v).is_absolute()).map(PathBuf::from);
    let base = match usable(xdg_data_home) {
        Some(x) => x,
        None => usable(home)?.join(".local").join("share"),
    };
    let digest = Sha256::digest(canonical_src.as_os_str().as_bytes());
    let mut name = OsString::from(canonical_src.file_name().unwrap_or(OsStr::new("root")));
    name.push("-");
    name.push(base16ct::lower::encode_string(&digest[..8]));
    Some(base.join("checkpointfs").join(name))
}

/// Makes `path` absolute and resolves symlinks, `.` and `..` in its longest existing
/// prefix; the non-existing rest is normalized lexically (it cannot contain symlinks).
pub(crate) fn canonicalize_lenient(path: &Path) -> io::Result<(PathBuf, bool)> {
    let abs = std::path::absolute(path)?;
    let mut prefix = abs.as_path();
    let mut tail: Vec<&OsStr> = Vec::new();
    loop {
        match fs::canonicalize(prefix) {
            Ok(mut p) => {
                let exists = tail.is_empty();
                for c in tail.iter().rev() {
                    match Path::new(c).components().next() {
                        Some(Component::ParentDir) => {
                            p.pop();
                        }
                        Some(Component::CurDir) | None => {}
                        Some(_) => p.push(c),
                    }
                }
                return Ok((p, exists));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // `..` after a missing component: the kernel would fail, but lexically it
                // is still well defined; keep the raw last component for the tail.
                let name = match prefix.file_name() {
                    Some(n) => n,
                    None => prefix
                        .components()
                        .next_back()
                        .map(|c| c.as_os_str())
                        .unwrap_or(OsStr::new(".")),
                };
                tail.push(name);
                match prefix.parent() {
                    Some(parent) => prefix = parent,
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Checks everything `mount` needs before anything is created or mounted. Reads the
/// filesystem (metadata, directory listings, STATE/daemon.pid, /proc/PID) but changes
/// nothing. `state` is the `--state-dir` argument; `None` derives the default.
pub fn validate_mount(
    src: &Path,
    mnt: &Path,
    state: Option<&Path>,
    env: &Environment,
) -> Result<ValidatedPaths, MountRefusal> {
    let inaccessible =
        |what: &'static str, path: &Path, e: &io::Error| MountRefusal::Inaccessible {
            what,
            path: path.to_path_buf(),
            error: error_text(e),
        };

    // SRC: an existing directory.
    let source = match fs::metadata(src) {
        Ok(m) if m.is_dir() => {
            fs::canonicalize(src).map_err(|e| inaccessible("source", src, &e))?
        }
        Ok(_) => return Err(MountRefusal::SourceNotDir(src.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountRefusal::SourceMissing(src.to_path_buf()));
        }
        Err(e) if errno_of(&e) == libc::ENOTDIR => {
            return Err(MountRefusal::SourceMissing(src.to_path_buf()));
        }
        Err(e) => return Err(inaccessible("source", src, &e)),
    };

    // MNT: an existing directory.
    let mnt_meta = match fs::metadata(mnt) {
        Ok(m) if m.is_dir() => m,
        Ok(_) => return Err(MountRefusal::MountpointNotDir(mnt.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(MountRefusal::MountpointMissing(mnt.to_path_buf()));
        }
        Err(e) if errno_of(&e) == libc::ENOTDIR => {
            return Err(MountRefusal::MountpointMissing(mnt.to_path_buf()));
        }
        Err(e) if endpoint_gone(&e) => {
            return Err(MountRefusal::MountpointDead(mnt.to_path_buf()));
        }
        Err(e) => return Err(inaccessible("mount point", mnt, &e)),
    };
    let mountpoint = fs::canonicalize(mnt).map_err(|e| inaccessible("mount point", mnt, &e))?;

    // SRC and MNT must be disjoint trees.
    if mountpoint == source {
        return Err(MountRefusal::MountpointIsSource(source));
    }
    if mountpoint.starts_with(&source) {
        return Err(MountRefusal::MountpointInsideSource {
            mnt: mountpoint,
            src: source,
        });
    }
    if source.starts_with(&mountpoint) {
        return Err(MountRefusal::SourceInsideMountpoint {
            src: source,
            mnt: mountpoint,
        });
    }

    // STATE: outside both.
    let state_arg = match state {
        Some(s) => s.to_path_buf(),
        None => default_state_dir(&source, env.xdg_data_home.as_deref(), env.home.as_deref())
            .ok_or(MountRefusal::NoDefaultStateDir)?,
    };
    let (state_dir, state_dir_exists) =
        canonicalize_lenient(&state_arg).map_err(|e| inaccessible("state dir", &state_arg, &e))?;
    if state_dir.starts_with(&source) {
        return Err(MountRefusal::StateInsideSource {
            state: state_dir,
            src: source,
        });
    }
    if state_dir.starts_with(&mountpoint) {
        return Err(MountRefusal::StateInsideMountpoint {
            state: state_dir,
            mnt: mountpoint,
        });
    }

    // MNT: not a mount point already (checked first: a mount is rarely empty), and empty.
    let in_mountinfo = parse_mountinfo(&env.mountinfo)
        .iter()
        .any(|m| m.mount_point == mountpoint);
    let dev_differs = match mountpoint.parent() {
        Some(parent) => match fs::metadata(parent) {
            Ok(pm) => pm.dev() != mnt_meta.dev(),
            Err(e) => return Err(inaccessible("the parent of mount point", mnt, &e)),
        },
        None => true, // "/" is always a mount point
    };
    if in_mountinfo || dev_differs {
        return Err(MountRefusal::MountpointIsMounted(mountpoint));
    }
    let mut entries =
        fs::read_dir(&mountpoint).map_err(|e| inaccessible("mount point", mnt, &e))?;
    if entries.next().is_some() {
        return Err(MountRefusal::MountpointNotEmpty(mnt.to_path_buf()));
    }

    // STATE: a directory if it exists, and not used by a live daemon.
    if state_dir_exists {
        match fs::metadata(&state_dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(MountRefusal::StateNotDir(state_dir)),
            Err(e) => return Err(inaccessible("state dir", &state_dir, &e)),
        }
        if let Some(pid) = read_pid_file(&state_dir.join(PID_FILE))
            && is_checkpointfs_process(pid)
        {
            return Err(MountRefusal::StateInUse {
                state: state_dir,
                pid,
            });
        }
    }

    Ok(ValidatedPaths {
        source,
        mountpoint,
        state_dir,
        state_dir_exists,
    })
}

/// `mount` found MNT to be a dead FUSE mount (its daemon was killed or crashed). When it is
/// recognisably this mount's own, it is detached and the mount goes ahead, recovering the
/// history from the state dir's journal as after any crash. "Its own" means all of:
/// - the kernel's mount table lists it as a checkpointfs mount of the same SRC;
/// - the state dir this mount uses records MNT as its mount point;
/// - no process holds that state dir's lock (the daemon is really gone: the kernel drops the
///   lock when a process dies, even by `kill -9`).
///
/// Anything else is not ours to touch: the reason is returned and nothing is changed.
pub(crate) fn recover_own_dead_mount(
    src: &Path,
    state_dir: Option<&Path>,
    dead: &Path,
    env: &Environment,
) -> Result<(), String> {
    let mnt = resolve_mountpoint(dead).map_err(|e| format!("cannot resolve it: {e}"))?;
    let source = fs::canonicalize(src).map_err(|e| format!("source: {e}"))?;
    let entry = find_mount(&mnt)
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?
        .ok_or("it is not in the mount table")?;
    if !is_checkpointfs_mount(&entry) {
        return Err(format!("it is a {} mount", entry.fstype));
    }
    if entry.source.as_bytes() != source.as_os_str().as_bytes() {
        return Err(format!(
            "it mounted {}, not {}",
            entry.source.to_string_lossy(),
            source.display()
        ));
    }
    let state = match state_dir {
        Some(s) => canonicalize_lenient(s).map(|(p, _)| p).ok(),
        None => default_state_dir(&source, env.xdg_data_home.as_deref(), env.home.as_deref()),
    }
    .ok_or("no state dir")?;
    let recorded = fs::read(state.join(MOUNTPOINT_FILE))
        .map_err(|e| format!("{}/{MOUNTPOINT_FILE}: {e}", state.display()))?;
    if recorded.strip_suffix(b"\n") != Some(mnt.as_os_str().as_bytes()) {
        return Err(format!(
            "the state dir {} records another mount point",
            state.display()
        ));
    }
    // Held only for the check: the daemon takes it again when it starts.
    drop(crate::state::lock::StateLock::acquire(&state).map_err(|e| e.to_string())?);
    let old_pid = read_pid_file(&state.join(PID_FILE));
    match umount_syscall(&mnt, true) {
        Ok(()) => {}
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(&mnt, true) => {}
        Err(e) => return Err(format!("detaching it failed: {}", error_text(&e))),
    }
    eprintln!(
        "checkpointfs: {} was still mounted by a daemon that is gone{} (killed or crashed); \
         detached that dead mount and mounting again, recovering the history from {}",
        mnt.display(),
        old_pid.map_or_else(String::new, |p| format!(" (pid {p})")),
        state.display()
    );
    Ok(())
}

/// How long `mount` waits for an unmounted previous daemon before saying that it waits.
const QUIET_UNMOUNT_WAIT: Duration = Duration::from_secs(5);

/// The state dir is held by daemon `pid`. If that daemon's mount is already gone from the
/// mount table (a plain `umount MNT`, which returns while the daemon still flushes its
/// history), waits up to `timeout` for the daemon to exit; if it is still mounted, or does
/// not exit in time, the mount is refused as before.
pub(crate) fn wait_for_unmounted_daemon(
    state: &Path,
    pid: i32,
    env: &Environment,
    timeout: Duration,
) -> Result<(), MountRefusal> {
    let in_use = || MountRefusal::StateInUse {
        state: state.to_path_buf(),
        pid,
    };
    let recorded = fs::read(state.join(MOUNTPOINT_FILE)).map_err(|_| in_use())?;
    let mountpoint = Path::new(OsStr::from_bytes(
        recorded.strip_suffix(b"\n").unwrap_or(&recorded),
    ));
    let still_mounted = parse_mountinfo(&env.mountinfo)
        .iter()
        .any(|m| m.mount_point == mountpoint && is_checkpointfs_mount(m));
    if still_mounted {
        return Err(in_use());
    }
    // Opened before the check below: a pid that exits and is reused after it cannot fool us.
    let pidfd = crate::sys::pidfd_open(pid);
    if !is_checkpointfs_process(pid) {
        return Ok(());
    }
    // A short wait is said nothing about: a mount right after umount(8) succeeds silently,
    // as a local filesystem's does (xfstests compares the output of tests that remount).
    let quiet = QUIET_UNMOUNT_WAIT.min(timeout);
    if wait_for_exit(pid, pidfd.as_ref(), quiet) {
        return Ok(());
    }
    eprintln!(
        "checkpointfs: the previous daemon of {} (pid {pid}) is unmounted but still writing its \
         history; waiting for it to exit (up to {} s)",
        state.display(),
        timeout.as_secs()
    );
    if wait_for_exit(pid, pidfd.as_ref(), timeout - quiet) {
        Ok(())
    } else {
        Err(in_use())
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their trees directly"
)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Dirs {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        src: PathBuf,
        mnt: PathBuf,
    }

    fn dirs() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let src = root.join("src");
        let mnt = root.join("mnt");
        fs::create_dir(&src).unwrap();
        fs::create_dir(&mnt).unwrap();
        fs::write(src.join("file"), b"x").unwrap();
        Dirs {
            _tmp: tmp,
            root,
            src,
            mnt,
        }
    }

    fn env() -> Environment {
        Environment {
            xdg_data_home: None,
            home: Some("/nonexistent-home".into()),
            mountinfo: b"22 27 0:21 / /proc rw,relatime - proc proc rw\n".to_vec(),
        }
    }

    fn check(
        d: &Dirs,
        src: &Path,
        mnt: &Path,
        state: &Path,
    ) -> Result<ValidatedPaths, MountRefusal> {
        let _ = d;
        validate_mount(src, mnt, Some(state), &env())
    }

    #[test]
    fn accepts_a_good_mount() {
        let d = dirs();
        let state = d.root.join("state");
        let v = check(&d, &d.src, &d.mnt, &state).unwrap();
        assert_eq!(
            v,
            ValidatedPaths {
                source: d.src.clone(),
                mountpoint: d.mnt.clone(),
                state_dir: state.clone(),
                state_dir_exists: false,
            }
        );
        assert!(!state.exists(), "validation must not create anything");
        fs::create_dir(&state).unwrap();
        assert!(check(&d, &d.src, &d.mnt, &state).unwrap().state_dir_exists);
    }

    #[test]
    fn canonicalizes_relative_and_symlinked_paths() {
        let d = dirs();
        symlink(&d.src, d.root.join("srclink")).unwrap();
        let state = d.root.join("a/b/../c/./state");
        let v = check(&d, &d.root.join("srclink"), &d.root.join("mnt/."), &state).unwrap();
        assert_eq!(v.source, d.src);
        assert_eq!(v.mountpoint, d.mnt);
        assert_eq!(v.state_dir, d.root.join("a/c/state"));
        assert!(!v.state_dir_exists);
    }

    #[test]
    fn refuses_bad_source() {
        let d = dirs();
        let state = d.root.join("state");
        let missing = d.root.join("nope");
        assert_eq!(
            check(&d, &missing, &d.mnt, &state),
            Err(MountRefusal::SourceMissing(missing))
        );
        let file = d.src.join("file");
        assert_eq!(
            check(&d, &file, &d.mnt, &state),
            Err(MountRefusal::SourceNotDir(file))
        );
    }

    #[test]
    fn refuses_bad_mountpoint() {
        let d = dirs();
        let state = d.root.join("state");
        let missing = d.root.join("nope");
        assert_eq!(
            check(&d, &d.src, &missing, &state),
            Err(MountRefusal::MountpointMissing(missing))
        );
        let file = d.root.join("plainfile");
        fs::write(&file, b"").unwrap();
        assert_eq!(
            check(&d, &d.src, &file, &state),
            Err(MountRefusal::MountpointNotDir(file))
        );
        fs::write(d.mnt.join("x"), b"").unwrap();
        assert_eq!(
            check(&d, &d.src, &d.mnt, &state),
            Err(MountRefusal::MountpointNotEmpty(d.mnt.clone()))
        );
    }

    #[test]
    fn refuses_overlapping_source_and_mountpoint() {
        let d = dirs();
        let state = d.root.join("state");
        assert_eq!(
            check(&d, &d.src, &d.src, &state),
            Err(MountRefusal::MountpointIsSource(d.src.clone()))
        );
        let inner = d.src.join("sub");
        fs::create_dir(&inner).unwrap();
        assert_eq!(
            check(&d, &d.src, &inner, &state),
            Err(MountRefusal::MountpointInsideSource {
                mnt: inner.clone(),
                src: d.src.clone()
            })
        );
        // Through a symlink, too.
        symlink(&inner, d.root.join("sublink")).unwrap();
        assert_eq!(
            check(&d, &d.src, &d.root.join("sublink"), &state),
            Err(MountRefusal::MountpointInsideSource {
                mnt: inner,
                src: d.src.clone()
            })
        );
        let src_in_mnt = d.mnt.join("s");
        fs::create_dir(&src_in_mnt).unwrap();
        assert_eq!(
            check(&d, &src_in_mnt, &d.mnt, &state),
            Err(MountRefusal::SourceInsideMountpoint {
                src: src_in_mnt,
                mnt: d.mnt.clone()
            })
        );
    }

    #[test]
    fn compares_by_components_not_string_prefix() {
        let d = dirs();
        // "srcfoo" starts with the string "src" but is not inside it.
        let mnt = d.root.join("srcfoo");
        fs::create_dir(&mnt).unwrap();
        let state = d.root.join("src-state");
        let v = check(&d, &d.src, &mnt, &state).unwrap();
        assert_eq!(v.mountpoint, mnt);
    }

    #[test]
    fn refuses_state_inside_source_or_mountpoint() {
        let d = dirs();
        let state = d.src.join("not-yet/state");
        assert_eq!(
            check(&d, &d.src, &d.mnt, &state),
            Err(MountRefusal::StateInsideSource {
                state,
                src: d.src.clone()
            })
        );
        assert_eq!(
            check(&d, &d.src, &d.mnt, &d.src),
            Err(MountRefusal::StateInsideSource {
                state: d.src.clone(),
                src: d.src.clone()
            })
        );
        let state = d.mnt.join("state");
        assert_eq!(
            check(&d, &d.src, &d.mnt, &state),
            Err(MountRefusal::StateInsideMountpoint {
                state,
                mnt: d.mnt.clone()
            })
        );
        // `..` out of a missing directory is resolved lexically.
        let sneaky = d.root.join("missing/../src/x");
        assert_eq!(
            check(&d, &d.src, &d.mnt, &sneaky),
            Err(MountRefusal::StateInsideSource {
                state: d.src.join("x"),
                src: d.src.clone()
            })
        );
    }

    #[test]
    fn refuses_state_that_is_a_file() {
        let d = dirs();
        let state = d.root.join("statefile");
        fs::write(&state, b"").unwrap();
        assert_eq!(
            check(&d, &d.src, &d.mnt, &state),
            Err(MountRefusal::StateNotDir(state))
        );
    }

    #[test]
    fn refuses_state_in_use_but_not_a_stale_pid_file() {
        let d = dirs();
        let state = d.root.join("state");
        fs::create_dir(&state).unwrap();
        // Our own pid: alive and with our command name.
        let me = std::process::id() as i32;
        fs::write(state.join(PID_FILE), format!("{me}\n")).unwrap();
        assert_eq!(
            check(&d, &d.src, &d.mnt, &state),
            Err(MountRefusal::StateInUse {
                state: state.clone(),
                pid: me
            })
        );
        // A pid that cannot exist (beyond pid_max).
        fs::write(state.join(PID_FILE), "2147483646\n").unwrap();
        assert!(check(&d, &d.src, &d.mnt, &state).is_ok());
    }

    #[test]
    fn refuses_mountpoint_listed_in_mountinfo() {
        let d = dirs();
        let mut e = env();
        let escaped = d.mnt.to_str().unwrap().replace(' ', "\\040");
        e.mountinfo
            .extend_from_slice(format!("99 27 0:99 / {escaped} rw - tmpfs none rw\n").as_bytes());
        assert_eq!(
            validate_mount(&d.src, &d.mnt, Some(&d.root.join("state")), &e),
            Err(MountRefusal::MountpointIsMounted(d.mnt.clone()))
        );
    }

    #[test]
    fn refuses_root_as_mountpoint() {
        let d = dirs();
        // "/" is never empty, but it is also a mount point; either refusal is fine.
        assert!(check(&d, &d.src, Path::new("/"), &d.root.join("state")).is_err());
    }

    #[test]
    fn default_state_dir_derivation() {
        let src = Path::new("/home/u/proj");
        let digest = Sha256::digest(b"/home/u/proj");
        let hex = base16ct::lower::encode_string(&digest[..8]);
        assert_eq!(hex.len(), 16);
        let expect = |base: &str| PathBuf::from(format!("{base}/checkpointfs/proj-{hex}"));

        assert_eq!(
            default_state_dir(src, Some(OsStr::new("/xdg")), Some(OsStr::new("/h"))),
            Some(expect("/xdg"))
        );
        assert_eq!(
            default_state_dir(src, None, Some(OsStr::new("/h"))),
            Some(expect("/h/.local/share"))
        );
        // Empty or relative XDG_DATA_HOME is ignored, as the XDG spec says.
        assert_eq!(
            default_state_dir(src, Some(OsStr::new("")), Some(OsStr::new("/h"))),
            Some(expect("/h/.local/share"))
        );
        assert_eq!(
            default_state_dir(src, Some(OsStr::new("rel")), Some(OsStr::new("/h"))),
            Some(expect("/h/.local/share"))
        );
        assert_eq!(default_state_dir(src, None, None), None);
        assert_eq!(default_state_dir(src, None, Some(OsStr::new(""))), None);

        // Different paths with the same basename get different dirs.
        let other = default_state_dir(Path::new("/other/proj"), Some(OsStr::new("/x")), None);
        assert_ne!(other, default_state_dir(src, Some(OsStr::new("/x")), None));

        // The root directory has no basename.
        let root = default_state_dir(Path::new("/"), Some(OsStr::new("/x")), None).unwrap();
        assert!(
            root.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("root-")
        );
    }

    #[test]
    fn default_state_dir_known_value() {
        // echo -n /tmp/src | sha256sum
        let got = default_state_dir(Path::new("/tmp/src"), Some(OsStr::new("/d")), None).unwrap();
        assert_eq!(got, PathBuf::from("/d/checkpointfs/src-e8b5a464948e166f"));
    }

    #[test]
    fn default_state_dir_is_used_when_no_state_dir_given() {
        let d = dirs();
        let mut e = env();
        e.xdg_data_home = Some(d.root.join("xdg").into_os_string());
        let v = validate_mount(&d.src, &d.mnt, None, &e).unwrap();
        assert_eq!(
            Some(v.state_dir),
            default_state_dir(&d.src, e.xdg_data_home.as_deref(), None)
        );
        // ... and it is checked like an explicit one.
        e.xdg_data_home = Some(d.src.join("xdg").into_os_string());
        assert!(matches!(
            validate_mount(&d.src, &d.mnt, None, &e),
            Err(MountRefusal::StateInsideSource { .. })
        ));
        e.xdg_data_home = None;
        e.home = None;
        assert_eq!(
            validate_mount(&d.src, &d.mnt, None, &e),
            Err(MountRefusal::NoDefaultStateDir)
        );
    }
}
