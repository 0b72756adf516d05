//! `mount` before the daemon starts: the request checked against the file system and the
//! mount table ([`super::validation`]), the cases `mount` resolves itself (its own dead
//! mount, a previous daemon still flushing), the state dir created and secured, and the
//! daemon's configuration assembled (exclusions merged with the saved settings, `--owner`
//! checked). A refusal changes nothing and says why; the CLI prints it.
use std::fmt;
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::history::budget::OthersBudget;
use crate::history::exclusions::{ExcludeFile, ExclusionConfig, check_glob};
use crate::mount::daemon::DaemonConfig;
use crate::mount::options::MountOptions;
use crate::mount::validation::{
    Environment, MountRefusal, ValidatedPaths, recover_own_dead_mount, validate_mount,
    wait_for_unmounted_daemon,
};
use crate::state::durability::Durability;
use crate::sys::error_text;

/// How long `mount` waits for the previous daemon of its state dir to exit once that
/// daemon's mount is gone (a plain `umount MNT` returns before the daemon has flushed).
const STATE_RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

/// What `checkpointfs mount` was asked for (its command line, parsed).
#[derive(Debug, Clone)]
pub struct MountRequest {
    pub src: PathBuf,
    pub mnt: PathBuf,
    pub state_dir: Option<PathBuf>,
    /// `-o` arguments, each comma-separated, a later one winning.
    pub options: Vec<String>,
    /// `--owner USER`.
    pub owner: Option<String>,
    pub excludes: Vec<String>,
    pub exclude_from: Vec<PathBuf>,
    pub no_exclude: bool,
    pub respect_gitignore: bool,
    pub no_respect_gitignore: bool,
    /// Worker threads (`None`: one per CPU).
    pub threads: Option<usize>,
    pub no_passthrough: bool,
    /// `--no-io-uring`: requests over /dev/fuse even where FUSE over io_uring is offered.
    pub no_io_uring: bool,
    /// The hidden `--test-park-ring-requests` (tests only).
    pub test_park: bool,
    pub allow_other: bool,
    /// `--other-users-budget`; `None`: the saved one, or the default.
    pub other_users_budget: Option<OthersBudget>,
    pub durability: Durability,
    /// `--remote URL` (checked), `--remote-key FILE`; `None`: the saved remote, if any.
    pub remote: Option<crate::history::settings::RemoteSetting>,
}

/// Why `mount` did not start a daemon. The message is whole (it names what and why);
/// nothing was mounted.
#[derive(Debug)]
pub enum MountError {
    /// The request cannot be honoured as given (a usage error).
    Refused(String),
    /// Something failed while preparing (a runtime failure).
    Failed(String),
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::Refused(msg) | MountError::Failed(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for MountError {}

fn refused(r: &MountRefusal) -> MountError {
    MountError::Refused(format!("cannot mount: {r}"))
}

/// Checks `req` and prepares everything the daemon needs, or says why not (changing
/// nothing but, when it did not exist yet, creating the state dir).
pub fn prepare(req: &MountRequest) -> Result<DaemonConfig, MountError> {
    let options = MountOptions::parse(&req.options)
        .map_err(|msg| MountError::Refused(format!("cannot mount: {msg}")))?;
    let env = mount_environment()?;
    let paths = match validate_mount(&req.src, &req.mnt, req.state_dir.as_deref(), &env) {
        Ok(p) => p,
        Err(MountRefusal::MountpointDead(dead)) => {
            if let Err(why) =
                recover_own_dead_mount(&req.src, req.state_dir.as_deref(), &dead, &env)
            {
                return Err(MountError::Refused(format!(
                    "cannot mount: {}; it is not recognisably this mount's own ({why}), so it \
                     was left alone",
                    MountRefusal::MountpointDead(dead.clone())
                )));
            }
            // The mount table changed: validate against the new one.
            revalidate(req)?
        }
        Err(MountRefusal::StateInUse { state, pid }) => {
            wait_for_unmounted_daemon(&state, pid, &env, STATE_RELEASE_TIMEOUT)
                .map_err(|r| refused(&r))?;
            revalidate(req)?
        }
        Err(r) => return Err(refused(&r)),
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let refusal = crate::mount::options::statvfs_flags(&paths.source)
            .map(|flags| options.refusal_without_privilege(flags));
        match refusal {
            Ok(None) => {}
            Ok(Some(why)) => return Err(MountError::Refused(format!("cannot mount: {why}"))),
            Err(e) => {
                return Err(MountError::Failed(format!(
                    "cannot mount: statvfs {}: {}",
                    paths.source.display(),
                    error_text(&e)
                )));
            }
        }
    }
    if !paths.state_dir_exists
        && let Err(e) = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&paths.state_dir)
    {
        return Err(MountError::Failed(format!(
            "cannot create state dir {}: {}",
            paths.state_dir.display(),
            error_text(&e)
        )));
    }
    crate::state::dir::secure(&paths.state_dir)
        .map_err(|e| MountError::Failed(format!("cannot mount: {}", error_text(&e))))?;
    let saved = crate::history::settings::load(&paths.state_dir)
        .map_err(|msg| MountError::Refused(format!("cannot mount: {msg}")))?;
    let other_users_budget = req
        .other_users_budget
        .or(saved.as_ref().and_then(|s| s.other_users_budget));
    let remote = req
        .remote
        .clone()
        .or(saved.as_ref().and_then(|s| s.remote.clone()));
    let exclusions = exclusions_for_mount(req, saved.map(|s| s.exclusions))
        .map_err(|msg| MountError::Refused(format!("cannot mount: {msg}")))?;
    let owner = req
        .owner
        .as_deref()
        .map(|user| owner_for(user, &options))
        .transpose()
        .map_err(|msg| MountError::Refused(format!("cannot mount: {msg}")))?;
    let threads = req
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    Ok(DaemonConfig {
        source: paths.source,
        mountpoint: paths.mountpoint,
        state_dir: paths.state_dir,
        threads,
        passthrough: !req.no_passthrough,
        io_uring: !req.no_io_uring,
        test_park: req.test_park,
        allow_other: req.allow_other,
        owner,
        exclusions,
        other_users_budget,
        options,
        durability: req.durability,
        remote,
    })
}

/// The environment `mount` validates against (it includes a snapshot of the mount table).
fn mount_environment() -> Result<Environment, MountError> {
    Environment::current().map_err(|e| {
        MountError::Failed(format!(
            "cannot read /proc/self/mountinfo: {}",
            error_text(&e)
        ))
    })
}

/// Validates again against a fresh look at the mount table, after `mount` changed it or
/// waited for it to change.
fn revalidate(req: &MountRequest) -> Result<ValidatedPaths, MountError> {
    let env = mount_environment()?;
    validate_mount(&req.src, &req.mnt, req.state_dir.as_deref(), &env).map_err(|r| refused(&r))
}

/// `--owner USER`: the user's ids, if root may mount for them with `options`.
fn owner_for(user: &str, options: &MountOptions) -> Result<crate::sys::UserIds, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "--owner {user} needs root: it is for a root-run service mounting for a normal \
             user; as that user, mount without --owner"
        ));
    }
    let ids = crate::sys::user_ids(user).map_err(|e| format!("--owner {user}: {e}"))?;
    if ids.uid == 0 {
        return Err(format!(
            "--owner {user}: that is root; mount without --owner"
        ));
    }
    if options.devices || options.setuid {
        return Err(format!(
            "--owner {user} with -o {}: a mount for a normal user is always nodev,nosuid (as \
             fusermount3 makes theirs), or they could plant device nodes or set-id programs \
             that work",
            if options.devices { "dev" } else { "suid" }
        ));
    }
    Ok(ids)
}

/// The patterns of an --exclude-from file; errors name the file and line.
fn read_exclude_file(path: &Path) -> Result<Vec<String>, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read --exclude-from file {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        check_glob(line)
            .map_err(|e| format!("{} line {}: '{line}': {e}", path.display(), i + 1))?;
        out.push(line.to_string());
    }
    Ok(out)
}

/// The exclusions of a mount: each setting given on the command line replaces its saved
/// value (`saved`, from the state dir); the others keep it. `--exclude-from` files are read
/// again at every mount, the saved ones too.
fn exclusions_for_mount(
    req: &MountRequest,
    saved: Option<ExclusionConfig>,
) -> Result<ExclusionConfig, String> {
    let saved = saved.unwrap_or_default();
    let (exclude, files): (Vec<String>, Vec<PathBuf>) = if req.no_exclude {
        (Vec::new(), Vec::new())
    } else if !req.excludes.is_empty() || !req.exclude_from.is_empty() {
        let files = req
            .exclude_from
            .iter()
            .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone()))
            .collect();
        (req.excludes.clone(), files)
    } else {
        let files = saved.exclude_from.iter().map(|f| f.file.clone()).collect();
        (saved.exclude.clone(), files)
    };
    let mut exclude_from = Vec::new();
    for file in files {
        let patterns = read_exclude_file(&file)?;
        exclude_from.push(ExcludeFile { file, patterns });
    }
    let respect_gitignore = if req.respect_gitignore {
        true
    } else if req.no_respect_gitignore {
        false
    } else {
        saved.respect_gitignore
    };
    Ok(ExclusionConfig {
        exclude,
        exclude_from,
        respect_gitignore,
    })
}
