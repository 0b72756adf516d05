//! The history subcommands: `checkpoint`, `rewind`, `log`, `diff`, `status`, `gc`.
//!
//! Each returns the process exit status (0 success, 1 runtime failure, 2 usage error or
//! refusal) and prints its own one-line errors. `checkpoint` writes to the mount's ctl file;
//! the others talk to the daemon over its control socket, or read an unmounted state dir.
use std::fs::OpenOptions;
use std::io::{self, IsTerminal, Write};
use std::os::fd::{IntoRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::cli::exit_status::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::history::gc::{GcReport, Retention, gc_state_dir};
use crate::history::ids::validate_id;
use crate::history::logdiff::DiffFormat;
use crate::history::quote::quote_bytes;
use crate::history::status::StatusReport;
use crate::history::{History, HistoryConfig, open_history_readonly};
use crate::mount::control_socket::{self, Request};
use crate::state::lock::StateLock;

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
        Err(e) if crate::mount::unmount::endpoint_gone(&e) => return gone(),
        Err(e) if matches!(errno(&e), libc::EACCES | libc::EPERM) => {
            eprintln!("checkpointfs: {}", not_your_mount(mnt, &e));
            return EXIT_USAGE;
        }
        // A read-only mount (`-o ro`, or remounted ro): the kernel refuses to open ctl for
        // writing, but checkpoints change only the state dir, so ask the daemon directly.
        Err(e) if errno(&e) == libc::EROFS => return checkpoint_over_socket(mnt, id),
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
        Err(e) if crate::mount::unmount::endpoint_gone(&e) => gone(),
        Err(e) => {
            eprintln!("checkpointfs: cannot create checkpoint '{quoted}': {e}");
            EXIT_FAILURE
        }
    }
}

/// `checkpointfs branch (create | list | drop)`: over the control socket.
pub fn branch(cmd: crate::cli::BranchCommand) -> i32 {
    use crate::cli::BranchCommand;
    let (mnt, req) = match cmd {
        BranchCommand::Create { mnt, name, at } => (mnt, Request::BranchCreate { name, at }),
        BranchCommand::List { mnt, json } => (mnt, Request::BranchList { json }),
        BranchCommand::Drop { mnt, name } => (mnt, Request::BranchDrop { name }),
    };
    match state_dir_of_mount(&mnt) {
        Ok(state_dir) => ask_daemon(&state_dir, &req),
        Err(code) => code,
    }
}

/// `checkpoint` on a read-only mount: the same request over the control socket.
fn checkpoint_over_socket(mnt: &Path, id: &str) -> i32 {
    let state_dir = match state_dir_of_mount(mnt) {
        Ok(d) => d,
        Err(code) => return code,
    };
    ask_daemon(&state_dir, &Request::Checkpoint { id: id.to_string() })
}

/// The state dir of the mount at `mnt`, from its virtual `.checkpoint/state-dir` file.
pub(crate) fn state_dir_of_mount(mnt: &Path) -> Result<PathBuf, i32> {
    match std::fs::read_to_string(mnt.join(".checkpoint/state-dir")) {
        Ok(s) => Ok(PathBuf::from(s.trim_end_matches('\n'))),
        Err(e) if crate::mount::unmount::endpoint_gone(&e) => {
            eprintln!(
                "checkpointfs: the daemon serving {} is gone; clean up with: umount -l {}",
                mnt.display(),
                mnt.display()
            );
            Err(EXIT_FAILURE)
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            eprintln!("checkpointfs: {}", not_your_mount(mnt, &e));
            Err(EXIT_USAGE)
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

/// "alice (uid 1001)", or "uid 1001" for a uid the password database does not know.
fn user_text(uid: u32) -> String {
    match crate::sys::name_of(uid) {
        Some(name) => format!("user {name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

/// Why `mnt` refused us (`e`: EACCES or EPERM): a FUSE mount without `allow_other` lets
/// only its `user_id` in, root included (an `--owner` mount, or another user's).
fn not_your_mount(mnt: &Path, e: &io::Error) -> String {
    let shown = mnt.display();
    let canonical = std::fs::canonicalize(mnt).unwrap_or_else(|_| mnt.to_path_buf());
    let entry = crate::mount::mountinfo::find_mount(&canonical)
        .ok()
        .flatten()
        .filter(crate::mount::mountinfo::is_checkpointfs_mount);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    match entry.as_ref().and_then(|m| m.fuse_user_id()) {
        Some(owner) if owner != me && entry.as_ref().is_some_and(|m| m.allows_others()) => {
            format!(
                "{shown} is a checkpointfs mount of {}, shared with --allow-other: you may use \
                 its files, but only its owner can take checkpoints, read its history or \
                 rewind it ({e})",
                user_text(owner)
            )
        }
        Some(owner) if owner != me => {
            let who = user_text(owner);
            let root = if me == 0 {
                " (an --owner mount, or one the user made: without --allow-other the kernel \
                 lets no one else in, root included)"
            } else {
                ""
            };
            format!(
                "{shown} is a checkpointfs mount of {who}, not yours{root}: only that user can \
                 use it and its history. Run the command as them (e.g. `setpriv --reuid \
                 {owner} --init-groups checkpointfs ...`), or read the history with \
                 `checkpointfs ... --state-dir STATE` as a user who can read STATE ({e})"
            )
        }
        _ => format!(
            "cannot use {shown}: {e} (a checkpointfs mount of another user, or a directory \
             you may not read)"
        ),
    }
}

/// Why a state dir refused us (`e`: EACCES or EPERM): it is another user's.
fn not_your_state_dir(state_dir: &Path, e: &io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    let shown = state_dir.display();
    let owner = std::fs::metadata(state_dir)
        .map(|m| user_text(m.uid()))
        .unwrap_or_else(|_| "another user".to_string());
    format!(
        "the history of this mount ({shown}) belongs to {owner}, not to you: the mount may let \
         you use its files (--allow-other), but only its owner (or root) can read its history \
         or rewind it ({e})"
    )
}

/// One status line on stderr ("gc: swept 1200/5000 objects"), rewritten in place, shown only
/// when stderr is a terminal (a log file or a pipe gets nothing); cleared when dropped.
struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: io::stderr().is_terminal(),
            shown: false,
        }
    }

    fn show(&mut self, line: &str) {
        if self.tty {
            eprint!("\r\x1b[K{line}");
            self.shown = true;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
        }
    }
}

/// Sends `req` to the daemon, showing its progress lines; its output, or the exit status
/// after printing the error.
fn daemon_answer(state_dir: &Path, req: &Request) -> Result<String, i32> {
    let mut progress = Progress::new();
    let answer =
        control_socket::request_with_progress(state_dir, req, &mut |line| progress.show(line));
    drop(progress);
    match answer {
        Ok(resp) if resp.ok => Ok(resp.output),
        Ok(resp) => {
            eprintln!("checkpointfs: {}", resp.error);
            // Refused on a read-only mount: nothing was done.
            Err(if resp.errno == Some(libc::EROFS) {
                EXIT_USAGE
            } else {
                EXIT_FAILURE
            })
        }
        // The socket is in the state dir (0700): another user's.
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            eprintln!("checkpointfs: {}", not_your_state_dir(state_dir, &e));
            Err(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            Err(EXIT_FAILURE)
        }
    }
}

/// Sends `req` to the daemon and prints its answer.
pub(crate) fn ask_daemon(state_dir: &Path, req: &Request) -> i32 {
    ask_daemon_rendered(state_dir, req, Ok)
}

/// Sends `req` and prints what `render` makes of the daemon's answer.
fn ask_daemon_rendered(
    state_dir: &Path,
    req: &Request,
    render: impl FnOnce(String) -> io::Result<String>,
) -> i32 {
    match daemon_answer(state_dir, req).map(render) {
        Ok(Ok(out)) => {
            print!("{out}");
            EXIT_OK
        }
        Ok(Err(e)) => {
            eprintln!("checkpointfs: {e}");
            EXIT_FAILURE
        }
        Err(code) => code,
    }
}

/// The state dir `target` names.
pub(crate) fn state_dir_of(target: &Target) -> Result<PathBuf, i32> {
    match target {
        Target::Mount(mnt) => state_dir_of_mount(mnt),
        Target::StateDir(d) => Ok(d.clone()),
    }
}

/// The SRC recorded in an unmounted state dir; refuses a directory that is not one.
fn source_of_state_dir(state_dir: &Path) -> Result<PathBuf, i32> {
    match std::fs::read_to_string(state_dir.join("source")) {
        Ok(s) => Ok(PathBuf::from(s.trim_end_matches('\n'))),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            eprintln!("checkpointfs: {}", not_your_state_dir(state_dir, &e));
            Err(EXIT_USAGE)
        }
        Err(e) => {
            eprintln!(
                "checkpointfs: {} is not a checkpointfs state dir (no 'source' file: {e})",
                state_dir.display()
            );
            Err(EXIT_USAGE)
        }
    }
}

/// Runs a report on `target`: through the daemon when one serves it, else by reading the
/// state dir (read-only) directly.
/// `req` asks the daemon for the report's JSON document; `render` makes the output from it.
fn report(
    target: &Target,
    req: Request,
    offline: impl FnOnce(&History) -> io::Result<String>,
    render: impl FnOnce(String) -> io::Result<String>,
) -> i32 {
    let state_dir = match state_dir_of(target) {
        Ok(d) => d,
        Err(code) => return code,
    };
    if control_socket::daemon_is_serving(&state_dir) {
        return ask_daemon_rendered(&state_dir, &req, render);
    }
    let history = match open_offline(&state_dir) {
        Ok(h) => h,
        Err(code) => return code,
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

/// The history of an unmounted state dir, opened read-only; the exit status after printing
/// why not.
pub(crate) fn open_offline(state_dir: &Path) -> Result<std::sync::Arc<History>, i32> {
    let source = source_of_state_dir(state_dir)?;
    // The exclusions the last mount used, so that `status` explains paths as it did.
    let exclusions = match crate::history::settings::load(state_dir) {
        Ok(saved) => saved.unwrap_or_default().exclusions,
        Err(msg) => {
            eprintln!("checkpointfs: {msg}");
            return Err(EXIT_FAILURE);
        }
    };
    open_history_readonly(HistoryConfig {
        root: None,
        source,
        state_dir: state_dir.to_path_buf(),
        exclusions,
        // Read-only: nothing is backed up, so no durability applies.
        durability: Default::default(),
    })
    .map_err(|e| {
        eprintln!("checkpointfs: cannot read {}: {e}", state_dir.display());
        EXIT_FAILURE
    })
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
                quote_bytes(p.as_os_str().as_bytes()),
                mnt.display()
            ));
        }
        Err(_) => p.to_path_buf(),
    };
    rel.to_str()
        .map(|s| s.trim_matches('/').to_string())
        .ok_or_else(|| {
            format!(
                "{} is not valid UTF-8 (such names are not tracked)",
                quote_bytes(p.as_os_str().as_bytes())
            )
        })
}

/// An absolute `p` given with `--state-dir`, relative to the mount root: under the last
/// mount point or the source the state dir names (`STATE/mountpoint`, `STATE/source`).
fn path_in_saved_tree(state_dir: &Path, p: &Path) -> Result<String, String> {
    let roots: Vec<PathBuf> = [crate::mount::registry::MOUNTPOINT_FILE, "source"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(state_dir.join(f)).ok())
        .map(|s| PathBuf::from(s.trim_end_matches('\n')))
        .collect();
    roots
        .iter()
        .find_map(|root| p.strip_prefix(root).ok())
        .and_then(|rel| rel.to_str())
        .map(|rel| rel.trim_matches('/').to_string())
        .ok_or_else(|| {
            let names: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
            format!(
                "{} is not inside the tree of {} ({})",
                p.display(),
                state_dir.display(),
                names.join(" or ")
            )
        })
}

/// `checkpointfs rewind MNT ID [--dry-run] [-- PATH...]`.
/// How `checkpointfs rewind` was asked to rewind (its flags).
pub struct RewindFlags<'a> {
    pub dry_run: bool,
    pub rewind_agent_state: bool,
    pub session: Option<&'a str>,
    pub force: bool,
}

pub fn rewind(mnt: &Path, id: &str, flags: RewindFlags<'_>, paths: &[PathBuf]) -> i32 {
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
    let progress = io::stderr().is_terminal();
    let req = match flags.session {
        None => Request::Rewind {
            id: id.to_string(),
            dry_run: flags.dry_run,
            paths: rels,
            rewind_agent_state: flags.rewind_agent_state,
            progress,
        },
        Some(session) => Request::SessionRewind {
            id: id.to_string(),
            dry_run: flags.dry_run,
            paths: rels,
            rewind_agent_state: flags.rewind_agent_state,
            session: session.to_string(),
            force: flags.force,
            progress,
        },
    };
    ask_daemon(&state_dir, &req)
}

/// `checkpointfs log MNT | --state-dir DIR [--json]`.
pub fn log(target: &Target, json: bool, session: Option<&str>) -> i32 {
    // The whole tree's log: the session's part is taken here, as offline.
    let req = Request::Log {
        json: true,
        session: None,
    };
    report(
        target,
        req,
        |h| crate::cli::render::log_output(h, json, session),
        |doc| match (json, session) {
            (true, None) => Ok(doc),
            _ => crate::cli::render::log_from_report(
                crate::cli::render::from_daemon(&doc)?,
                json,
                session,
            ),
        },
    )
}

/// `checkpointfs diff MNT M [N] | --state-dir DIR M [N]` with `--stat` / `--json`;
/// `to == None`: the current tree.
pub fn diff(
    target: &Target,
    from: &str,
    to: Option<&str>,
    format: DiffFormat,
    session: Option<&str>,
) -> i32 {
    let req = Request::Diff {
        from: from.to_string(),
        to: to.map(str::to_string),
        stat: format.stat,
        json: true,
        session: session.map(str::to_string),
        full: format.full,
    };
    report(
        target,
        req,
        |h| crate::cli::render::diff_output(h, from, to, format, session),
        |doc| match format.json {
            true => Ok(doc),
            false => crate::cli::render::diff_from_report(
                &crate::cli::render::from_daemon(&doc)?,
                format,
            ),
        },
    )
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
        (Target::StateDir(dir), Some(p)) if p.is_absolute() => match path_in_saved_tree(dir, p) {
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
        json: true,
    };
    report(
        target,
        req,
        |h| h.status_report(rel.as_deref(), path_is_dir)?.render(json),
        |doc| match json {
            true => Ok(doc),
            false => Ok(crate::cli::render::from_daemon::<StatusReport>(&doc)?.to_text()),
        },
    )
}

/// `checkpointfs gc MNT | --state-dir DIR (--keep N | --older-than DURATION) [--dry-run]
/// [--json]`: in the daemon when one serves the state dir (so its memory stays in step with
/// the transcript), else on the state dir directly, under the state lock.
pub fn gc(target: &Target, retention: Retention, dry_run: bool, json: bool) -> i32 {
    let state_dir = match state_dir_of(target) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let report = if control_socket::daemon_is_serving(&state_dir) {
        let (keep, older_than_secs) = match retention {
            Retention::Keep(n) => (Some(n), None),
            Retention::OlderThan(d) => (None, Some(d.as_secs())),
        };
        let req = Request::Gc {
            keep,
            older_than_secs,
            dry_run,
            progress: io::stderr().is_terminal(),
        };
        let output = match daemon_answer(&state_dir, &req) {
            Ok(o) => o,
            Err(code) => return code,
        };
        match serde_json::from_str::<GcReport>(&output) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("checkpointfs: bad gc report from the daemon: {e}");
                return EXIT_FAILURE;
            }
        }
    } else {
        if let Err(code) = source_of_state_dir(&state_dir) {
            return code;
        }
        let _lock = match StateLock::acquire(&state_dir) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("checkpointfs: {e}");
                return EXIT_FAILURE;
            }
        };
        let mut progress = Progress::new();
        let done = gc_state_dir(&state_dir, retention, dry_run, &mut |done, total| {
            progress.show(&format!("gc: swept {done}/{total} objects"));
        });
        drop(progress);
        match done {
            Ok(r) => r,
            Err(e) => {
                eprintln!("checkpointfs: gc of {} failed: {e}", state_dir.display());
                return EXIT_FAILURE;
            }
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("checkpointfs: {e}");
                return EXIT_FAILURE;
            }
        }
    } else {
        print!("{}", gc_summary(&report));
    }
    EXIT_OK
}

/// `msg-1`, `msg-1, msg-2`, or `msg-1 … msg-40`.
fn id_range(ids: &[String]) -> String {
    match ids {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a}, {b}"),
        [first, .., last] => format!("{first} … {last}"),
    }
}

/// `4.2 MiB`: bytes in binary units, one decimal from KiB on.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// The human summary of a gc: what was dropped, removed and freed, and what is kept.
pub fn gc_summary(r: &GcReport) -> String {
    let listed = |ids: &[String]| {
        if ids.is_empty() {
            String::new()
        } else {
            format!(" ({})", id_range(ids))
        }
    };
    let (drop, remove, free, keep) = if r.dry_run {
        ("would drop", "would remove", "would free", "would keep")
    } else {
        ("dropped", "removed", "freed", "kept")
    };
    let mut out = format!(
        "{drop} {}{}, {remove} {}, {free} {}; {keep} {}{}\n",
        plural(r.dropped.len(), "checkpoint"),
        listed(&r.dropped),
        plural(r.objects_removed, "object"),
        human_bytes(r.bytes_freed),
        plural(r.kept.len(), "checkpoint"),
        listed(&r.kept),
    );
    if r.dry_run {
        out.push_str("dry run: nothing was changed\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(dropped: usize, kept: usize, dry_run: bool) -> GcReport {
        let ids = |from: usize, n: usize| (from..from + n).map(|i| format!("msg-{i}")).collect();
        GcReport {
            schema: crate::history::gc::GC_SCHEMA.to_string(),
            dry_run,
            dropped: ids(1, dropped),
            kept: ids(dropped + 1, kept),
            objects_removed: 123,
            bytes_freed: 4_404_019,
            objects_kept: 7,
            bytes_kept: 100,
            transcript_bytes_before: 1000,
            transcript_bytes_after: 100,
        }
    }

    #[test]
    fn gc_summary_names_what_was_dropped_freed_and_kept() {
        assert_eq!(
            gc_summary(&report(40, 10, false)),
            "dropped 40 checkpoints (msg-1 … msg-40), removed 123 objects, freed 4.2 MiB; \
             kept 10 checkpoints (msg-41 … msg-50)\n"
        );
        assert_eq!(
            gc_summary(&report(0, 1, true)),
            "would drop 0 checkpoints, would remove 123 objects, would free 4.2 MiB; \
             would keep 1 checkpoint (msg-1)\ndry run: nothing was changed\n"
        );
    }

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
