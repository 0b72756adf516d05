//! The history subcommands: `checkpoint`, `rewind`, `log`, `diff`, `status`.
//!
//! Each returns the process exit status (0 success, 1 runtime failure, 2 usage error or
//! refusal) and prints its own one-line errors. `checkpoint` writes to the mount's ctl file;
//! the others talk to the daemon over its control socket, or read an unmounted state dir.
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::cli::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::control::{self, Request};
use crate::history::logdiff::DiffFormat;
use crate::history::{History, HistoryConfig, open_history_readonly};
use crate::ids::validate_id;

/// Where a read-only history command finds its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A live mount point: its state dir is in `MNT/.checkpoint/state-dir`.
    Mount(PathBuf),
    /// A state dir, read directly (the mount need not be live).
    StateDir(PathBuf),
}

/// The control file inside a mount; writing `ID\n` creates checkpoint ID.
pub const CTL_FILE: &str = ".checkpoint/ctl";

fn close_checked(fd: RawFd) -> io::Result<()> {
    // SAFETY: `fd` came from `into_raw_fd` and is closed exactly once, here.
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `checkpointfs checkpoint MNT ID`: writes `ID\n` to `MNT/.checkpoint/ctl` in one write.
pub fn checkpoint(mnt: &Path, id: &str) -> i32 {
    let shown = mnt.display();
    let quoted = id.escape_debug();
    if let Err(e) = validate_id(id.as_bytes()) {
        eprintln!("checkpointfs: invalid checkpoint id '{quoted}': {e}");
        return EXIT_USAGE;
    }
    let errno = |e: &io::Error| e.raw_os_error().unwrap_or(0);
    let gone = || {
        eprintln!(
            "checkpointfs: the daemon serving {shown} is gone (transport endpoint is not \
             connected); clean up with: umount -l {shown}"
        );
        EXIT_FAILURE
    };
    let file = match OpenOptions::new().write(true).open(mnt.join(CTL_FILE)) {
        Ok(f) => f,
        Err(e) if matches!(errno(&e), libc::ENOENT | libc::ENOTDIR) => {
            eprintln!("checkpointfs: {shown} is not a checkpointfs mount");
            return EXIT_USAGE;
        }
        Err(e) if errno(&e) == libc::ENOTCONN => return gone(),
        Err(e) => {
            eprintln!("checkpointfs: cannot open {shown}/{CTL_FILE}: {e}");
            return EXIT_FAILURE;
        }
    };
    let line = format!("{id}\n");
    let mut file = file;
    let written = file.write(line.as_bytes());
    // Close explicitly: FUSE reports flush errors from close(2).
    let closed = close_checked(file.into_raw_fd());
    match written.and_then(|n| closed.map(|()| n)) {
        Ok(n) if n == line.len() => {
            println!("checkpoint {id}");
            EXIT_OK
        }
        Ok(n) => {
            eprintln!(
                "checkpointfs: cannot create checkpoint '{quoted}': short write to {shown}/{CTL_FILE} \
                 ({n} of {} bytes)",
                line.len()
            );
            EXIT_FAILURE
        }
        Err(e) if errno(&e) == libc::EINVAL => {
            eprintln!(
                "checkpointfs: invalid checkpoint id '{quoted}': refused by the filesystem (EINVAL)"
            );
            EXIT_USAGE
        }
        Err(e) if errno(&e) == libc::EEXIST => {
            eprintln!(
                "checkpointfs: a checkpoint named '{quoted}' already exists (see: checkpointfs log \
                 {shown})"
            );
            EXIT_FAILURE
        }
        Err(e) if errno(&e) == libc::ENOTCONN => gone(),
        Err(e) => {
            eprintln!("checkpointfs: cannot create checkpoint '{quoted}': {e}");
            EXIT_FAILURE
        }
    }
}

/// The state dir of the mount at `mnt`, from its virtual `.checkpoint/state-dir` file.
fn state_dir_of_mount(mnt: &Path) -> Result<PathBuf, i32> {
    match std::fs::read_to_string(mnt.join(".checkpoint/state-dir")) {
        Ok(s) => Ok(PathBuf::from(s.trim_end_matches('\n'))),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            eprintln!(
                "checkpointfs: the daemon serving {} is gone; clean up with: umount -l {}",
                mnt.display(),
                mnt.display()
            );
            Err(EXIT_FAILURE)
        }
        Err(_) => {
            eprintln!(
                "checkpointfs: {} is not a checkpointfs mount",
                mnt.display()
            );
            Err(EXIT_USAGE)
        }
    }
}

/// Sends `req` to the daemon and prints its answer.
fn ask_daemon(state_dir: &Path, req: &Request) -> i32 {
    match control::request(state_dir, req) {
        Ok(resp) if resp.ok => {
            print!("{}", resp.output);
            EXIT_OK
        }
        Ok(resp) => {
            eprintln!("checkpointfs: {}", resp.error);
            EXIT_FAILURE
        }
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            EXIT_FAILURE
        }
    }
}

/// Runs a report on `target`: through the daemon when one serves it, else by reading the
/// state dir (read-only) directly.
fn report(
    target: &Target,
    req: Request,
    offline: impl FnOnce(&History) -> io::Result<String>,
) -> i32 {
    let state_dir = match target {
        Target::Mount(mnt) => match state_dir_of_mount(mnt) {
            Ok(d) => d,
            Err(code) => return code,
        },
        Target::StateDir(d) => d.clone(),
    };
    if control::daemon_is_serving(&state_dir) {
        return ask_daemon(&state_dir, &req);
    }
    let source = match std::fs::read_to_string(state_dir.join("source")) {
        Ok(s) => PathBuf::from(s.trim_end_matches('\n')),
        Err(e) => {
            eprintln!(
                "checkpointfs: {} is not a checkpointfs state dir (no 'source' file: {e})",
                state_dir.display()
            );
            return EXIT_USAGE;
        }
    };
    // The exclusions the last mount used, so that `status` explains paths as it did.
    let exclusions = match crate::settings::load(&state_dir) {
        Ok(saved) => saved.unwrap_or_default().exclusions,
        Err(msg) => {
            eprintln!("checkpointfs: {msg}");
            return EXIT_FAILURE;
        }
    };
    let history = match open_history_readonly(HistoryConfig {
        source,
        state_dir: state_dir.clone(),
        exclusions,
    }) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("checkpointfs: cannot read {}: {e}", state_dir.display());
            return EXIT_FAILURE;
        }
    };
    match offline(&history) {
        Ok(out) => {
            print!("{out}");
            EXIT_OK
        }
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            EXIT_FAILURE
        }
    }
}

/// A PATH given to `rewind -- PATH...`, as a path relative to the mount root: absolute
/// paths and paths relative to the working directory are taken as they point into MNT;
/// anything else is read as relative to the mount root.
fn path_in_mount(mnt: &Path, p: &Path) -> Result<String, String> {
    let mnt = std::fs::canonicalize(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let mut norm = PathBuf::new();
    for c in joined.components() {
        match c {
            std::path::Component::ParentDir => {
                norm.pop();
            }
            std::path::Component::CurDir => {}
            other => norm.push(other),
        }
    }
    let rel = match norm.strip_prefix(&mnt) {
        Ok(r) => r.to_path_buf(),
        Err(_) if p.is_absolute() => {
            return Err(format!(
                "{} is not inside the mount {}",
                p.display(),
                mnt.display()
            ));
        }
        Err(_) => p.to_path_buf(),
    };
    rel.to_str()
        .map(|s| s.trim_matches('/').to_string())
        .ok_or_else(|| format!("{} is not valid UTF-8", p.display()))
}

/// `checkpointfs rewind MNT ID [--dry-run] [-- PATH...]`.
pub fn rewind(mnt: &Path, id: &str, dry_run: bool, paths: &[PathBuf]) -> i32 {
    let state_dir = match state_dir_of_mount(mnt) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let mut rels = Vec::new();
    for p in paths {
        match path_in_mount(mnt, p) {
            Ok(r) => rels.push(r),
            Err(e) => {
                eprintln!("checkpointfs: {e}");
                return EXIT_USAGE;
            }
        }
    }
    ask_daemon(
        &state_dir,
        &Request::Rewind {
            id: id.to_string(),
            dry_run,
            paths: rels,
        },
    )
}

/// `checkpointfs log MNT | --state-dir DIR [--json]`.
pub fn log(target: &Target, json: bool) -> i32 {
    report(target, Request::Log { json }, |h| h.log_output(json))
}

/// `checkpointfs diff MNT M [N] | --state-dir DIR M [N]` with `--stat` / `--json`;
/// `to == None`: the current tree.
pub fn diff(target: &Target, from: &str, to: Option<&str>, format: DiffFormat) -> i32 {
    let req = Request::Diff {
        from: from.to_string(),
        to: to.map(str::to_string),
        stat: format.stat,
        json: format.json,
    };
    report(target, req, |h| h.diff_output(from, to, format))
}

/// `checkpointfs status MNT | --state-dir DIR [--path P] [--json]`.
pub fn status(target: &Target, path: Option<&Path>, json: bool) -> i32 {
    let rel = match (target, path) {
        (Target::Mount(mnt), Some(p)) => match path_in_mount(mnt, p) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("checkpointfs: {e}");
                return EXIT_USAGE;
            }
        },
        (Target::StateDir(_), Some(p)) => Some(p.to_string_lossy().trim_matches('/').to_string()),
        (_, None) => None,
    };
    // `P/` names a directory, also one that does not exist yet.
    let path_is_dir = path
        .filter(|p| p.as_os_str().as_bytes().ends_with(b"/"))
        .map(|_| true);
    let req = Request::Status {
        path: rel.clone(),
        path_is_dir,
        json,
    };
    report(target, req, |h| {
        h.status_report(rel.as_deref(), path_is_dir)?.render(json)
    })
}
