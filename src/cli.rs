//! The command line: argument parsing (clap), mount validation, the daemon lifecycle
//! (detach, readiness, pid file) and `umount`. The other subcommands dispatch to
//! [`crate::commands`].
//!
//! Exit status: 0 success, 1 runtime failure, 2 usage error or refusal; `umount` has a few
//! more (see [`UMOUNT_EXIT_STATUS`]).
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand};
use sha2::{Digest, Sha256};

use crate::commands::{self, Target};
use crate::daemon::{self, DaemonConfig};
use crate::durability::Durability;
use crate::history::exclusions::{ExcludeFile, ExclusionConfig};
use crate::history::logdiff::DiffFormat;
use crate::manuals;
use crate::mount_options::MountOptions;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
/// `umount`: MNT is not mounted (any more) and no daemon runs for it.
pub const EXIT_UMOUNT_GONE: i32 = 3;
/// `umount`: MNT is busy (EBUSY) and was left mounted.
pub const EXIT_UMOUNT_BUSY: i32 = 4;
/// `umount`: unmounted or detached, but the daemon did not exit within --timeout.
pub const EXIT_UMOUNT_TIMEOUT: i32 = 5;

/// `checkpointfs umount --help`, the man page and the README say this.
pub const UMOUNT_EXIT_STATUS: &str = "Exit status:\n  \
    0  unmounted, and the daemon has flushed the history and exited\n  \
    1  any other failure (the message says what)\n  \
    2  usage error, or MNT is not a checkpointfs mount (nothing was done)\n  \
    3  MNT is not mounted and no daemon runs for it, so the history is complete: it was\n     \
    already unmounted (known from the record of mounts in $XDG_RUNTIME_DIR/checkpointfs\n     \
    or /run/checkpointfs, which is cleared at reboot), or its daemon had died (killed)\n     \
    and the dead mount was detached now (the next mount recovers the history from the\n     \
    state dir's journal)\n  \
    4  MNT is busy: a process has its working directory or a file open there (see:\n     \
    lsof +D MNT); it is still mounted. --lazy detaches it anyway\n  \
    5  unmounted (or detached with --lazy), but the daemon had not exited after --timeout\n     \
    seconds; its history is complete only once it has";

/// File in the state dir holding the daemon's pid (decimal + "\n"); removed on clean exit.
pub const PID_FILE: &str = "daemon.pid";
/// File in the state dir holding the absolute mount point + "\n".
pub const MOUNTPOINT_FILE: &str = "mountpoint";
/// The detached daemon's stdout/stderr (appended to).
pub const LOG_FILE: &str = "daemon.log";
/// Virtual file inside a live mount: the absolute state dir + "\n".
pub const STATE_DIR_FILE: &str = ".checkpoint/state-dir";
/// The filesystem type of a checkpointfs mount in /proc/self/mountinfo.
pub const FSTYPE: &str = "fuse.checkpointfs";

/// How long `mount` waits for a detached daemon to report that the mount is live.
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `mount` waits for the previous daemon of its state dir to exit once that
/// daemon's mount is gone (a plain `umount MNT` returns before the daemon has flushed).
const STATE_RELEASE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long `umount` waits for the daemon to exit by default.
const DEFAULT_UMOUNT_TIMEOUT_SECS: u64 = 60;

// ---------------------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------------------

/// A FUSE filesystem that passes a source directory through at a mount point and keeps a
/// transparent undo stack: every change made through the mount is recorded, named
/// checkpoints can be taken, browsed under MNT/.checkpoint/, and rewound to.
#[derive(Debug, Parser)]
#[command(name = "checkpointfs", version, propagate_version = true)]
#[command(after_help = "Typical session:\n  \
    checkpointfs mount ~/project /tmp/project\n  \
    checkpointfs checkpoint /tmp/project msg-1\n  \
    ... edit files under /tmp/project ...\n  \
    checkpointfs log /tmp/project\n  \
    checkpointfs rewind /tmp/project msg-1\n  \
    checkpointfs umount /tmp/project\n\n\
    Exit status: 0 success, 1 runtime failure, 2 usage error or refused request \
    (umount has more: see checkpointfs umount --help).")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount SRC at MNT and start recording history
    #[command(long_about = "Mount SRC at MNT and start recording history.\n\n\
        By default the daemon detaches and this command returns once the mount is live; \
        the daemon's log goes to STATE/daemon.log. MNT must be an existing empty directory \
        that is neither inside SRC nor contains it, and is not already a mount point. \
        History is kept in the state dir, which must be outside both SRC and MNT.")]
    Mount(MountArgs),
    /// Unmount MNT and wait for the daemon to finish writing its state
    #[command(
        long_about = "Unmount MNT and wait for the daemon to finish writing its state.\n\n\
        When this returns successfully the daemon has exited and the history in the state \
        dir is complete.",
        after_help = UMOUNT_EXIT_STATUS
    )]
    Umount(UmountArgs),
    /// Record a named checkpoint of the current tree
    Checkpoint(CheckpointArgs),
    /// Restore the tree (or some paths) to a checkpoint
    Rewind(RewindArgs),
    /// List checkpoints
    Log(LogArgs),
    /// Show what changed between two checkpoints (or a checkpoint and now)
    Diff(DiffArgs),
    /// Show tracked paths and their versions
    Status(StatusArgs),
    /// Drop old checkpoints and delete the backups nothing kept needs
    #[command(
        long_about = "Drop old checkpoints and delete the backups nothing kept needs.\n\n\
        Keeps the newest N checkpoints (--keep N) or those taken less than DURATION ago \
        (--older-than DURATION); the newest checkpoint is always kept. Kept checkpoints still \
        browse and rewind exactly as before. Deletes every store object that no kept \
        checkpoint and no backup since refers to, and compacts the transcript (written to a \
        temp file and renamed into place: a crash during gc loses nothing). Done by the \
        daemon while mounted; with --state-dir and no daemon, on the state dir directly."
    )]
    Gc(GcArgs),
    /// Print a shell completion script
    #[command(long_about = "Print a shell completion script to stdout.\n\n\
        bash:       checkpointfs completions bash > /etc/bash_completion.d/checkpointfs\n\
        zsh:        checkpointfs completions zsh > \"${fpath[1]}/_checkpointfs\"\n\
        fish:       checkpointfs completions fish > ~/.config/fish/completions/checkpointfs.fish\n\
        elvish:     checkpointfs completions elvish >> ~/.config/elvish/rc.elv\n\
        powershell: checkpointfs completions powershell >> $PROFILE")]
    Completions(CompletionsArgs),
    /// Print the man page, or write all man pages to a directory
    #[command(
        long_about = "Print the man page of checkpointfs to stdout, or with --dir \
        write checkpointfs.1 and one page per subcommand (checkpointfs-mount.1, ...) to DIR \
        and print their paths.\n\n\
        Install: checkpointfs man --dir /usr/local/share/man/man1 && mandb"
    )]
    Man(ManArgs),
    /// Install (or remove) the checkpoint-per-prompt hook in an agent's settings
    #[command(
        long_about = "Install the hook that takes a checkpoint at every prompt into an \
        agent's settings.json, or remove it with --remove.\n\n\
        claude: a UserPromptSubmit hook running mount-scripts/claude-code-hook, in \
        ~/.claude/settings.json (--user, the default: every session, started anywhere) or \
        DIR/.claude/settings.json (--project DIR: sessions started in DIR).\n\
        gemini: a BeforeAgent hook running mount-scripts/gemini-cli-hook, in \
        ~/.gemini/settings.json or DIR/.gemini/settings.json.\n\n\
        The file is edited as JSON: other settings and hooks stay as they are. Running it \
        twice installs one hook; --remove takes out only ours. Outside a checkpointfs mount \
        the hook does nothing, so a user-level hook is harmless."
    )]
    InstallHook(InstallHookArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("scope").args(["user", "project"])))]
pub struct InstallHookArgs {
    /// The agent
    #[arg(value_name = "AGENT", value_enum)]
    pub agent: crate::install_hook::Agent,

    /// The user's settings (~/.claude/settings.json, ~/.gemini/settings.json); the default
    #[arg(long)]
    pub user: bool,

    /// The settings of the project in DIR (DIR/.claude/settings.json, ...)
    #[arg(long, value_name = "DIR")]
    pub project: Option<PathBuf>,

    /// Remove the hook instead
    #[arg(long)]
    pub remove: bool,

    /// The hook script to run (default: found next to this binary's checkout or install)
    #[arg(long, value_name = "PATH", conflicts_with = "remove")]
    pub hook: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_name = "SHELL", value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write checkpointfs.1 and checkpointfs-SUBCOMMAND.1 here (created if missing)
    /// instead of printing the top-level page
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// Source directory to pass through (must exist)
    #[arg(value_name = "SRC")]
    pub src: PathBuf,

    /// Mount point: an existing, empty directory outside SRC
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,

    /// Where history, backups and the log are kept (created with mode 0700 if missing).
    /// Must be outside SRC and MNT. Default:
    /// $XDG_DATA_HOME/checkpointfs/<name of SRC>-<hash of SRC path>
    /// ($XDG_DATA_HOME defaults to ~/.local/share)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Stay in the foreground and log to stderr; Ctrl-C or `umount MNT` stops it
    #[arg(short = 'f', long)]
    pub foreground: bool,

    /// Number of threads reading requests from /dev/fuse [default: number of CPUs]
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    pub threads: Option<usize>,

    /// Accepted and ignored, for scripts written for earlier versions: requests always
    /// travel over /dev/fuse (FUSE over io_uring is not used)
    #[arg(long)]
    pub no_io_uring: bool,

    /// Do not use the kernel's FUSE passthrough for open files: every read and write then
    /// goes through the daemon (slower; for debugging or kernels without passthrough)
    #[arg(long)]
    pub no_passthrough: bool,

    /// Let users other than the mounting user access the mount (non-root users need
    /// `user_allow_other` in /etc/fuse.conf)
    #[arg(long)]
    pub allow_other: bool,

    /// Do not record history for paths matching GLOB; may be given several times. A
    /// pattern without '/' matches a name at any depth ('target', '*.o'); one with '/' is
    /// anchored at the mount root ('build/out'). Everything below a matched directory is
    /// excluded too. Excluded paths are still passed through; rewind leaves them alone.
    /// Exclusion settings are saved in the state dir: a later mount without exclusion
    /// flags uses them; --exclude or --exclude-from replace the saved patterns.
    #[arg(long = "exclude", value_name = "GLOB", value_parser = parse_glob)]
    pub excludes: Vec<String>,

    /// Read more --exclude patterns from FILE: one per line, blank lines and lines
    /// starting with '#' ignored; may be given several times (re-read at every mount)
    #[arg(long = "exclude-from", value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,

    /// Forget the saved --exclude and --exclude-from patterns
    #[arg(long, conflicts_with_all = ["excludes", "exclude_from"])]
    pub no_exclude: bool,

    /// Do not record history for paths git ignores: .gitignore files in every directory,
    /// .git/info/exclude and the global core.excludesFile, with git's precedence and
    /// negations. The git directory itself is tracked. Saved in the state dir like --exclude.
    #[arg(long)]
    pub respect_gitignore: bool,

    /// Turn a saved --respect-gitignore off
    #[arg(long, conflicts_with = "respect_gitignore")]
    pub no_respect_gitignore: bool,

    /// Kernel mount options, comma-separated; may be given several times, a later option
    /// winning: ro, rw, noatime, relatime, strictatime, atime, nodiratime, diratime, dev,
    /// nodev, suid, nosuid, exec, noexec. Default: rw,nodev,nosuid,exec,atime (atime: access
    /// times as SRC's own mount updates them). dev, suid, and atime rules other than SRC's
    /// mount has need root. Checkpoints work on a ro mount; rewind is refused there
    #[arg(short = 'o', long = "options", value_name = "OPTS")]
    pub options: Vec<String>,

    /// When Layer 1 backups reach the disk. Every mode survives kill -9 of the daemon.
    /// strict: each backup is on disk before the change proceeds (one syncfs per backup);
    /// batched: a power loss loses at most the last 50 ms of backups, no sync on the
    /// syscall path; process: no syncs until unmount (a power loss can lose any backup not
    /// yet written back by the kernel)
    #[arg(long, value_enum, value_name = "MODE", default_value_t = Durability::Batched)]
    pub durability: Durability,

    /// Print one line with the state dir and daemon pid once mounted
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Debug, Args)]
pub struct UmountArgs {
    /// The checkpointfs mount point
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,

    /// Detach the mount even if it is busy (MNT_DETACH); the daemon exits once the last
    /// open file or working directory in it is released
    #[arg(short = 'l', long)]
    pub lazy: bool,

    /// Seconds to wait for the daemon to exit after unmounting
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_UMOUNT_TIMEOUT_SECS)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The checkpointfs mount point
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,

    /// Checkpoint id: 1-128 characters from letters, digits and . _ : @ -
    #[arg(value_name = "ID")]
    pub id: String,
}

#[derive(Debug, Args)]
#[command(override_usage = "checkpointfs rewind [--dry-run] MNT ID [-- PATH...]")]
pub struct RewindArgs {
    /// The checkpointfs mount point
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,

    /// The checkpoint to restore
    #[arg(value_name = "ID")]
    pub id: String,

    /// Print what would change without changing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,

    /// Rewind agent state too (.claude/settings.local.json, aider's histories: see
    /// docs/usage.md), which a rewind otherwise leaves as it is
    #[arg(long)]
    pub rewind_agent_state: bool,

    /// Rewind only the paths this agent session changed since ID (its full id, or 8 or
    /// more leading characters), keeping everyone else's changes; refused if others changed
    /// any of them too
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,

    /// With --session: rewind the paths others changed too
    #[arg(long, requires = "session")]
    pub force: bool,

    /// Restore only these paths (relative to MNT, or absolute paths under MNT)
    #[arg(last = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
#[command(override_usage = "checkpointfs log [--json] MNT\n       \
    checkpointfs log [--json] --state-dir DIR")]
pub struct LogArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Print JSON (schema "checkpointfs.log/2", see docs/json-output.md)
    #[arg(long)]
    pub json: bool,

    /// Only the changes made by this agent session (its full id, or the first 8 or more
    /// characters the text log shows)
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
}

/// Where a history command finds its data: MNT, or `--state-dir DIR` (exactly one).
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The checkpointfs mount point (or give --state-dir instead)
    #[arg(
        value_name = "MNT",
        required_unless_present = "state_dir",
        conflicts_with = "state_dir"
    )]
    pub mnt: Option<PathBuf>,

    /// Use this state dir instead of MNT: through its daemon if it is mounted, else
    /// directly (works while unmounted)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(
    override_usage = "checkpointfs diff [--stat] [--json] MNT M [N]\n       \
    checkpointfs diff [--stat] [--json] --state-dir DIR M [N]"
)]
pub struct DiffArgs {
    /// MNT M [N], or M [N] with --state-dir: compare checkpoint M with checkpoint N, or
    /// with the current tree when N is omitted
    #[arg(value_name = "ARGS", num_args = 1..=3, required = true)]
    pub args: Vec<OsString>,

    /// Read the history from this state dir directly (works while unmounted)
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Per path, the number of lines added and removed (as `git diff --stat`) instead of
    /// the patch
    #[arg(long)]
    pub stat: bool,

    /// Print JSON (schema "checkpointfs.diff/1", see docs/json-output.md); with --stat,
    /// without the patches
    #[arg(long)]
    pub json: bool,

    /// Only the paths this agent session changed between M and N (its full id, or 8 or
    /// more leading characters)
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
}

#[derive(Debug, Args)]
#[command(override_usage = "checkpointfs status MNT [--path P]\n       \
    checkpointfs status --state-dir DIR [--path P]")]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Also say whether and why P is tracked: which exclusion rule (file and line) decides
    /// it, and whether it was backed up in the current message. P is relative to MNT (or
    /// absolute inside MNT; with --state-dir: relative to the mount root, or absolute under
    /// the last mount point or SRC) and need not exist; `P/` is taken as a directory
    #[arg(long, value_name = "P")]
    pub path: Option<PathBuf>,

    /// Print JSON (schema "checkpointfs.status/1", see docs/json-output.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    override_usage = "checkpointfs gc MNT (--keep N | --older-than DURATION) [--dry-run] [--json]\n       \
    checkpointfs gc --state-dir DIR (--keep N | --older-than DURATION) [--dry-run] [--json]"
)]
#[command(group(ArgGroup::new("retention").required(true).args(["keep", "older_than"])))]
pub struct GcArgs {
    #[command(flatten)]
    pub target: TargetArgs,

    /// Keep the newest N checkpoints, N >= 1 (0 is refused: gc always keeps the newest)
    #[arg(long, value_name = "N", value_parser = parse_keep)]
    pub keep: Option<usize>,

    /// Drop the checkpoints taken more than DURATION ago: a whole number and a unit s, m,
    /// h, d or w (30m, 12h, 7d, 2w). The newest checkpoint is always kept
    #[arg(long, value_name = "DURATION", value_parser = crate::history::gc::parse_duration)]
    pub older_than: Option<Duration>,

    /// Print what gc would drop and free, change nothing
    #[arg(short = 'n', long)]
    pub dry_run: bool,

    /// Print the report as JSON (schema "checkpointfs.gc/1", see docs/json-output.md)
    #[arg(long)]
    pub json: bool,
}

fn parse_keep(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err(
            "--keep 0 would drop every checkpoint; gc always keeps at least the newest \
             (give N >= 1)"
                .to_string(),
        ),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a number of checkpoints (N >= 1)")),
    }
}

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a thread count between 1 and 1024")),
    }
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
        parse_glob(line)
            .map_err(|e| format!("{} line {}: '{line}': {e}", path.display(), i + 1))?;
        out.push(line.to_string());
    }
    Ok(out)
}

/// The exclusions of a mount: each setting given on the command line replaces its saved
/// value (`saved`, from the state dir); the others keep it. `--exclude-from` files are read
/// again at every mount, the saved ones too.
fn exclusions_for_mount(
    a: &MountArgs,
    saved: Option<ExclusionConfig>,
) -> Result<ExclusionConfig, String> {
    let saved = saved.unwrap_or_default();
    let (exclude, files): (Vec<String>, Vec<PathBuf>) = if a.no_exclude {
        (Vec::new(), Vec::new())
    } else if !a.excludes.is_empty() || !a.exclude_from.is_empty() {
        let files = a
            .exclude_from
            .iter()
            .map(|f| std::path::absolute(f).unwrap_or_else(|_| f.clone()))
            .collect();
        (a.excludes.clone(), files)
    } else {
        let files = saved.exclude_from.iter().map(|f| f.file.clone()).collect();
        (saved.exclude.clone(), files)
    };
    let mut exclude_from = Vec::new();
    for file in files {
        let patterns = read_exclude_file(&file)?;
        exclude_from.push(ExcludeFile { file, patterns });
    }
    let respect_gitignore = if a.respect_gitignore {
        true
    } else if a.no_respect_gitignore {
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

fn parse_glob(s: &str) -> Result<String, String> {
    globset::Glob::new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("invalid glob: {e}"))
}

// ---------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------

/// Runs the command line of this process; returns the exit status.
pub fn main() -> i32 {
    run(std::env::args_os())
}

/// Parses `args` (including argv\[0\]) and runs the command; returns the exit status.
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // The daemon's watchdog process (not a user command, so not in the clap definitions).
    if args
        .get(1)
        .is_some_and(|a| a == crate::watchdog::SUBCOMMAND)
    {
        init_logger();
        let rest: Vec<String> = args[2..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return crate::watchdog::run(&rest);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if !matches!(cli.command, Command::Mount(_)) {
        // Report commands print to stdout: `checkpointfs log | head` must end quietly, as
        // other tools do, not panic in println!. Not for `mount`: the daemon it starts
        // writes to sockets and must get EPIPE, not die.
        // SAFETY: signal(2) with SIG_DFL; called before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Mount(a) => mount(a),
        Command::Umount(a) => umount(&a.mnt, a.lazy, Duration::from_secs(a.timeout)),
        Command::Checkpoint(a) => commands::checkpoint(&a.mnt, &a.id),
        Command::Rewind(a) => {
            let flags = commands::RewindFlags {
                dry_run: a.dry_run,
                rewind_agent_state: a.rewind_agent_state,
                session: a.session.as_deref(),
                force: a.force,
            };
            commands::rewind(&a.mnt, &a.id, flags, &a.paths)
        }
        Command::Log(a) => match target(a.target) {
            Ok(t) => commands::log(&t, a.json, a.session.as_deref()),
            Err(code) => code,
        },
        Command::Diff(a) => diff(a),
        Command::Status(a) => match target(a.target) {
            Ok(t) => commands::status(&t, a.path.as_deref(), a.json),
            Err(code) => code,
        },
        Command::Completions(a) => manuals::completions(a.shell),
        Command::Man(a) => manuals::man(a.dir.as_deref()),
        Command::Gc(a) => gc(a),
        Command::InstallHook(a) => install_hook(a),
    }
}

fn install_hook(a: InstallHookArgs) -> i32 {
    use crate::install_hook::{self as ih, Outcome, Scope};
    let scope = match &a.project {
        Some(dir) => match fs::canonicalize(dir) {
            Ok(d) if d.is_dir() => Scope::Project(d),
            Ok(d) => {
                eprintln!("checkpointfs: {} is not a directory", d.display());
                return EXIT_USAGE;
            }
            Err(e) => {
                eprintln!("checkpointfs: {}: {}", dir.display(), io_error_text(&e));
                return EXIT_USAGE;
            }
        },
        None => match std::env::var_os("HOME").filter(|h| Path::new(h).is_absolute()) {
            Some(home) => Scope::User { home: home.into() },
            None => {
                eprintln!("checkpointfs: HOME is not set to an absolute path; use --project DIR");
                return EXIT_USAGE;
            }
        },
    };
    let file = scope.settings_file(a.agent);
    let result = if a.remove {
        ih::remove(a.agent, &file)
    } else {
        let script = match &a.hook {
            Some(p) => fs::canonicalize(p)
                .map_err(|e| io::Error::new(e.kind(), format!("hook script {}: {e}", p.display()))),
            None => ih::find_script(a.agent),
        };
        script.and_then(|s| {
            ih::install(a.agent, &file, &s)
                .map(|o| (o, s))
                .map(|(o, s)| {
                    if matches!(o, Outcome::Installed | Outcome::Updated) {
                        println!("hook: {}", s.display());
                    }
                    o
                })
        })
    };
    let shown = file.display();
    match result {
        Ok(Outcome::Installed) => println!("installed the checkpointfs hook in {shown}"),
        Ok(Outcome::Updated) => println!("updated the checkpointfs hook in {shown}"),
        Ok(Outcome::AlreadyInstalled) => {
            println!("the checkpointfs hook is already installed in {shown}")
        }
        Ok(Outcome::Removed(n)) => println!(
            "removed the checkpointfs hook from {shown}{}",
            if n > 1 {
                format!(" ({n} entries)")
            } else {
                String::new()
            }
        ),
        Ok(Outcome::NotInstalled) => {
            println!("no checkpointfs hook in {shown}: nothing to remove")
        }
        Err(e) => {
            eprintln!("checkpointfs: {}", io_error_text(&e));
            return EXIT_FAILURE;
        }
    }
    0
}

fn usage_error(subcommand: &str, msg: &str) -> i32 {
    let mut cmd = Cli::command();
    let err = match cmd.find_subcommand_mut(subcommand) {
        Some(sub) => sub.error(clap::error::ErrorKind::WrongNumberOfValues, msg),
        None => cmd.error(clap::error::ErrorKind::WrongNumberOfValues, msg),
    };
    let _ = err.print();
    EXIT_USAGE
}

fn target(a: TargetArgs) -> Result<Target, i32> {
    match (a.mnt, a.state_dir) {
        (Some(m), None) => Ok(Target::Mount(m)),
        (None, Some(s)) => Ok(Target::StateDir(s)),
        // clap enforces exactly one; keep a clean error rather than a panic anyway.
        _ => {
            eprintln!("checkpointfs: give either MNT or --state-dir DIR (exactly one)");
            Err(EXIT_USAGE)
        }
    }
}

fn gc(a: GcArgs) -> i32 {
    use crate::history::gc::Retention;
    let retention = match (a.keep, a.older_than) {
        (Some(n), None) => Retention::Keep(n),
        (None, Some(d)) => Retention::OlderThan(d),
        // clap's ArgGroup enforces exactly one.
        _ => {
            return usage_error(
                "gc",
                "give exactly one of --keep N and --older-than DURATION",
            );
        }
    };
    match target(a.target) {
        Ok(t) => commands::gc(&t, retention, a.dry_run, a.json),
        Err(code) => code,
    }
}

fn diff(a: DiffArgs) -> i32 {
    let format = DiffFormat {
        stat: a.stat,
        json: a.json,
    };
    let mut args = a.args.into_iter();
    let target = match a.state_dir {
        Some(dir) => Target::StateDir(dir),
        None => match args.next() {
            Some(m) => Target::Mount(PathBuf::from(m)),
            None => return usage_error("diff", "expected MNT M [N]"),
        },
    };
    let rest: Vec<OsString> = args.collect();
    let (from, to) = match rest.as_slice() {
        [m] => (m, None),
        [m, n] => (m, Some(n)),
        _ => {
            let msg = match target {
                Target::StateDir(_) => "with --state-dir, expected M [N] (no MNT)",
                Target::Mount(_) => "expected MNT M [N]",
            };
            return usage_error("diff", msg);
        }
    };
    let (Some(from), to) = (from.to_str(), to.map(|n| n.to_str())) else {
        eprintln!("checkpointfs: checkpoint ids must be valid UTF-8");
        return EXIT_USAGE;
    };
    let to = match to {
        None => None,
        Some(Some(n)) => Some(n),
        Some(None) => {
            eprintln!("checkpointfs: checkpoint ids must be valid UTF-8");
            return EXIT_USAGE;
        }
    };
    commands::diff(&target, from, to, format, a.session.as_deref())
}

// ---------------------------------------------------------------------------------------
// Mount validation
// ---------------------------------------------------------------------------------------

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

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn io_error_text(e: &io::Error) -> String {
    // Drop the " (os error N)" suffix the standard library adds.
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

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
    for b in &digest[..8] {
        name.push(format!("{b:02x}"));
    }
    Some(base.join("checkpointfs").join(name))
}

/// Makes `path` absolute and resolves symlinks, `.` and `..` in its longest existing
/// prefix; the non-existing rest is normalized lexically (it cannot contain symlinks).
fn canonicalize_lenient(path: &Path) -> io::Result<(PathBuf, bool)> {
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
            error: io_error_text(e),
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

// ---------------------------------------------------------------------------------------
// /proc helpers
// ---------------------------------------------------------------------------------------

/// One line of /proc/self/mountinfo (the parts we need).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: OsString,
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash.
pub(crate) fn unescape_mountinfo(field: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && i + 4 <= field.len()
            && field[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = field[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push((v & 0xff) as u8);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Parses /proc/self/mountinfo; malformed lines are skipped.
pub fn parse_mountinfo(text: &[u8]) -> Vec<MountEntry> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = fields.iter().position(|f| *f == b"-")?;
            if sep < 6 {
                return None;
            }
            let fstype = fields.get(sep + 1)?;
            let source = fields.get(sep + 2).copied().unwrap_or(b"");
            Some(MountEntry {
                mount_point: PathBuf::from(unescape_mountinfo(fields[4])),
                fstype: String::from_utf8_lossy(fstype).into_owned(),
                source: unescape_mountinfo(source),
            })
        })
        .collect()
}

/// Whether a mount table entry is recognizably checkpointfs without asking its daemon:
/// fstype `fuse.checkpointfs` (mounted through fusermount with a subtype), or a FUSE
/// mount whose source is `checkpointfs` (fuser's direct mount(2) always uses fstype `fuse`
/// and takes the source from FSName, else Subtype).
pub fn is_checkpointfs_mount(entry: &MountEntry) -> bool {
    entry.fstype == FSTYPE
        || ((entry.fstype == "fuse" || entry.fstype.starts_with("fuse."))
            && entry.source == "checkpointfs")
}

/// The topmost mount at `mount_point`, if any.
pub fn find_mount(mount_point: &Path) -> io::Result<Option<MountEntry>> {
    let text = fs::read("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == mount_point))
}

/// Reads a pid file ("PID\n"); `None` if missing or malformed.
pub fn read_pid_file(path: &Path) -> Option<i32> {
    let s = fs::read_to_string(path).ok()?;
    s.trim().parse::<i32>().ok().filter(|&p| p > 0)
}

/// Whether `pid` is a running (not zombie) process. Zombies count as gone: where PID 1
/// does not reap orphans, an exited daemon can stay a zombie indefinitely.
pub fn process_alive(pid: i32) -> bool {
    match fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // "pid (comm) S ...": the state follows the last ')'.
            match stat.iter().rposition(|&b| b == b')') {
                Some(i) => !matches!(stat.get(i + 2), Some(b'Z') | Some(b'X') | None),
                None => true,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        // No usable /proc: fall back to signal 0.
        // SAFETY: kill(2) with signal 0 sends nothing; __errno_location returns this thread's
        // errno slot, valid for the thread's lifetime.
        Err(_) => unsafe { libc::kill(pid, 0) == 0 || *libc::__errno_location() == libc::EPERM },
    }
}

/// Whether `pid` is alive and runs under the same command name as this process.
fn is_checkpointfs_process(pid: i32) -> bool {
    if !process_alive(pid) {
        return false;
    }
    let comm = |p: &str| fs::read(format!("/proc/{p}/comm")).ok();
    match (comm(&pid.to_string()), comm("self")) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => true, // cannot tell: assume it is, refusing is the safe side
    }
}

fn thread_count() -> usize {
    fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1)
}

// ---------------------------------------------------------------------------------------
// mount
// ---------------------------------------------------------------------------------------

fn refuse(r: &MountRefusal) -> i32 {
    eprintln!("checkpointfs: cannot mount: {r}");
    EXIT_USAGE
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
fn recover_own_dead_mount(a: &MountArgs, dead: &Path, env: &Environment) -> Result<(), String> {
    let mnt = resolve_mountpoint(dead).map_err(|e| format!("cannot resolve it: {e}"))?;
    let source = fs::canonicalize(&a.src).map_err(|e| format!("source: {e}"))?;
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
    let state = match &a.state_dir {
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
    drop(crate::state_lock::StateLock::acquire(&state).map_err(|e| e.to_string())?);
    let old_pid = read_pid_file(&state.join(PID_FILE));
    match umount_syscall(&mnt, true) {
        Ok(()) => {}
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(&mnt, true) => {}
        Err(e) => return Err(format!("detaching it failed: {}", io_error_text(&e))),
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
fn wait_for_unmounted_daemon(
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
    let pidfd = pidfd_open(pid);
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

/// The environment `mount` validates against (it includes a snapshot of the mount table).
fn mount_environment() -> Result<Environment, i32> {
    Environment::current().map_err(|e| {
        eprintln!(
            "checkpointfs: cannot read /proc/self/mountinfo: {}",
            io_error_text(&e)
        );
        EXIT_FAILURE
    })
}

/// Validates again against a fresh look at the mount table, after `mount` changed it or
/// waited for it to change.
fn revalidate(a: &MountArgs) -> Result<ValidatedPaths, i32> {
    let env = mount_environment()?;
    validate_mount(&a.src, &a.mnt, a.state_dir.as_deref(), &env).map_err(|r| refuse(&r))
}

fn mount(a: MountArgs) -> i32 {
    let options = match MountOptions::parse(&a.options) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("checkpointfs: cannot mount: {msg}");
            return EXIT_USAGE;
        }
    };
    let env = match mount_environment() {
        Ok(env) => env,
        Err(code) => return code,
    };
    let paths = match validate_mount(&a.src, &a.mnt, a.state_dir.as_deref(), &env) {
        Ok(p) => p,
        Err(MountRefusal::MountpointDead(dead)) => {
            if let Err(why) = recover_own_dead_mount(&a, &dead, &env) {
                eprintln!(
                    "checkpointfs: cannot mount: {}; it is not recognisably this mount's own \
                     ({why}), so it was left alone",
                    MountRefusal::MountpointDead(dead.clone())
                );
                return EXIT_USAGE;
            }
            // The mount table changed: validate against the new one.
            match revalidate(&a) {
                Ok(p) => p,
                Err(code) => return code,
            }
        }
        Err(MountRefusal::StateInUse { state, pid }) => {
            if let Err(r) = wait_for_unmounted_daemon(&state, pid, &env, STATE_RELEASE_TIMEOUT) {
                return refuse(&r);
            }
            match revalidate(&a) {
                Ok(p) => p,
                Err(code) => return code,
            }
        }
        Err(r) => return refuse(&r),
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let refusal = crate::mount_options::statvfs_flags(&paths.source)
            .map(|flags| options.refusal_without_privilege(flags));
        match refusal {
            Ok(None) => {}
            Ok(Some(why)) => {
                eprintln!("checkpointfs: cannot mount: {why}");
                return EXIT_USAGE;
            }
            Err(e) => {
                eprintln!(
                    "checkpointfs: cannot mount: statvfs {}: {}",
                    paths.source.display(),
                    io_error_text(&e)
                );
                return EXIT_FAILURE;
            }
        }
    }
    if !paths.state_dir_exists
        && let Err(e) = fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&paths.state_dir)
    {
        eprintln!(
            "checkpointfs: cannot create state dir {}: {}",
            paths.state_dir.display(),
            io_error_text(&e)
        );
        return EXIT_FAILURE;
    }
    if let Err(e) = crate::state_dir::secure(&paths.state_dir) {
        eprintln!("checkpointfs: cannot mount: {}", io_error_text(&e));
        return EXIT_FAILURE;
    }
    let exclusions = match crate::settings::load(&paths.state_dir)
        .and_then(|saved| exclusions_for_mount(&a, saved.map(|s| s.exclusions)))
    {
        Ok(e) => e,
        Err(msg) => {
            eprintln!("checkpointfs: cannot mount: {msg}");
            return EXIT_USAGE;
        }
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let cfg = DaemonConfig {
        source: paths.source,
        mountpoint: paths.mountpoint,
        state_dir: paths.state_dir,
        threads,
        passthrough: !a.no_passthrough,
        allow_other: a.allow_other,
        exclusions,
        options,
        durability: a.durability,
    };
    if a.foreground {
        run_foreground(cfg)
    } else {
        spawn_daemon(cfg, a.verbose)
    }
}

fn write_pid_and_mountpoint(cfg: &DaemonConfig) -> io::Result<()> {
    let pid = std::process::id();
    crate::state_dir::write_file(&cfg.state_dir, PID_FILE, format!("{pid}\n").as_bytes())?;
    let mut mp = cfg.mountpoint.as_os_str().as_bytes().to_vec();
    mp.push(b'\n');
    crate::state_dir::write_file(&cfg.state_dir, MOUNTPOINT_FILE, &mp)?;
    // Only `umount`'s exit status for an already unmounted MNT depends on it.
    if let Err(e) = record_mount(&cfg.mountpoint, &cfg.state_dir) {
        log::warn!("cannot record the mount in the mount registry: {e}");
    }
    Ok(())
}

/// The record of mounts: one symlink per mount point, named by a hash of its path and
/// pointing at its state dir, so that `umount` can tell a former checkpointfs mount point
/// (exit 3) from any other directory (exit 2). On a tmpfs ($XDG_RUNTIME_DIR, or /run for
/// root), so it forgets at reboot; `None` when there is neither.
fn mount_registry() -> Option<PathBuf> {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => {
            Some(PathBuf::from(d).join("checkpointfs/mounts"))
        }
        // SAFETY: geteuid(2) cannot fail.
        _ if unsafe { libc::geteuid() } == 0 => Some(PathBuf::from("/run/checkpointfs/mounts")),
        _ => None,
    }
}

fn registry_entry(mountpoint: &Path) -> Option<PathBuf> {
    let digest = Sha256::digest(mountpoint.as_os_str().as_bytes());
    let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Some(mount_registry()?.join(name))
}

fn record_mount(mountpoint: &Path, state_dir: &Path) -> io::Result<()> {
    let Some(entry) = registry_entry(mountpoint) else {
        return Ok(());
    };
    let dir = entry.parent().unwrap_or(Path::new("/"));
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // Replace any older record atomically: a new symlink renamed over it.
    let tmp = dir.join(format!(".tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(state_dir, &tmp)?;
    fs::rename(&tmp, &entry)?;
    // Records whose state dir was removed can never answer anything: drop them, so that the
    // registry stays as small as the set of state dirs that exist.
    for e in fs::read_dir(dir)?.flatten() {
        if fs::metadata(e.path()).is_err_and(|err| err.kind() == io::ErrorKind::NotFound) {
            let _ = fs::remove_file(e.path());
        }
    }
    Ok(())
}

/// The state dir recorded for `mountpoint`, if its `mountpoint` file still names it (a
/// later mount of that state dir elsewhere makes the record stale).
fn recorded_state_dir(mountpoint: &Path) -> Option<PathBuf> {
    let state = fs::read_link(registry_entry(mountpoint)?).ok()?;
    let recorded = fs::read(state.join(MOUNTPOINT_FILE)).ok()?;
    (recorded.strip_suffix(b"\n") == Some(mountpoint.as_os_str().as_bytes())).then_some(state)
}

/// Removes STATE/daemon.pid if it still names this process.
fn remove_pid_file(state_dir: &Path) {
    let path = state_dir.join(PID_FILE);
    if read_pid_file(&path) == Some(std::process::id() as i32)
        && let Err(e) = fs::remove_file(&path)
    {
        log::warn!("cannot remove {}: {e}", path.display());
    }
}

fn init_logger() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .try_init();
}

fn run_foreground(cfg: DaemonConfig) -> i32 {
    init_logger();
    if let Err(e) = write_pid_and_mountpoint(&cfg) {
        eprintln!(
            "checkpointfs: cannot write {}/{PID_FILE}: {}",
            cfg.state_dir.display(),
            io_error_text(&e)
        );
        return EXIT_FAILURE;
    }
    let state_dir = cfg.state_dir.clone();
    let (src, mnt) = (cfg.source.clone(), cfg.mountpoint.clone());
    let on_ready: Box<dyn FnOnce() + Send> = Box::new(move || {
        log::info!("mounted {} at {}", src.display(), mnt.display());
    });
    let result = daemon::serve(cfg, on_ready);
    remove_pid_file(&state_dir);
    match result {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("checkpointfs: mount failed: {e}");
            EXIT_FAILURE
        }
    }
}

/// What the daemon child writes to the readiness pipe.
const READY: u8 = b'R';
const FAILED: u8 = b'E';

fn spawn_daemon(cfg: DaemonConfig, verbose: bool) -> i32 {
    let log_path = cfg.state_dir.join(LOG_FILE);
    let log_file = match fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&log_path)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "checkpointfs: cannot open {}: {}",
                log_path.display(),
                io_error_text(&e)
            );
            return EXIT_FAILURE;
        }
    };
    let devnull = match fs::File::open("/dev/null") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("checkpointfs: cannot open /dev/null: {}", io_error_text(&e));
            return EXIT_FAILURE;
        }
    };
    let (reader, writer) = match io::pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("checkpointfs: cannot create a pipe: {}", io_error_text(&e));
            return EXIT_FAILURE;
        }
    };
    // fork() only duplicates the calling thread; serve() creates threads, so none may exist
    // yet. Nothing before this point starts one, but make sure.
    if thread_count() > 1 {
        eprintln!("checkpointfs: internal error: cannot detach a multi-threaded process; use -f");
        return EXIT_FAILURE;
    }
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
    // SAFETY: the process is single-threaded (checked above).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!(
            "checkpointfs: fork failed: {}",
            io_error_text(&io::Error::last_os_error())
        );
        return EXIT_FAILURE;
    }
    if pid == 0 {
        drop(reader);
        return daemon_child(cfg, log_file, devnull, writer);
    }
    drop(writer);
    drop(log_file);
    drop(devnull);
    wait_ready(pid, reader, &cfg, &log_path, verbose)
}

/// The parent side: waits for the child's readiness report.
fn wait_ready(
    child: libc::pid_t,
    mut reader: io::PipeReader,
    cfg: &DaemonConfig,
    log_path: &Path,
    verbose: bool,
) -> i32 {
    let failed = |msg: &str| {
        eprintln!(
            "checkpointfs: mount failed: {msg} (see {})",
            log_path.display()
        );
        EXIT_FAILURE
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut buf = Vec::new();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match poll_readable(reader.as_raw_fd(), remaining) {
            Ok(true) => {}
            Ok(false) => {
                // Still not ready: stop it rather than leave a daemon the user was told failed.
                // SAFETY: kill(2) takes plain integers; `child` is our own unreaped child, so
                // its pid cannot have been reused.
                unsafe { libc::kill(child, libc::SIGTERM) };
                return failed(&format!(
                    "the daemon (pid {child}) did not report the mount ready within {} s and was \
                     sent SIGTERM",
                    READY_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return failed(&format!("waiting for the daemon: {}", io_error_text(&e))),
        }
        let mut chunk = [0u8; 4096];
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if buf.first() == Some(&READY) {
                    if verbose {
                        println!(
                            "checkpointfs: mounted {} at {} (state dir {}, daemon pid {child})",
                            cfg.source.display(),
                            cfg.mountpoint.display(),
                            cfg.state_dir.display()
                        );
                    }
                    return EXIT_OK;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return failed(&format!("waiting for the daemon: {}", io_error_text(&e))),
        }
    }
    // EOF without READY: the child failed (and said why) or died.
    let status = reap(child);
    match buf.split_first() {
        Some((&FAILED, msg)) => failed(String::from_utf8_lossy(msg).trim_end()),
        _ => failed(&format!(
            "the daemon exited before the mount was ready ({status})"
        )),
    }
}

/// Waits for a child and describes how it ended.
fn reap(child: libc::pid_t) -> String {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a live, writable c_int for the duration of the call.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            break;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return "exit status unknown".to_string();
        }
    }
    if libc::WIFEXITED(status) {
        format!("exit status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        "exit status unknown".to_string()
    }
}

/// poll(2) for POLLIN/POLLHUP on `fd`; `Ok(false)` on timeout.
fn poll_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd, live for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r > 0 {
            return Ok(true);
        }
        if r == 0 {
            return Ok(false);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn writer_fd(pipe: &Mutex<Option<io::PipeWriter>>) -> Option<i32> {
    let guard = pipe.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().map(|w| w.as_raw_fd())
}

/// Closes every descriptor >= 3 except `keep`.
fn close_inherited_fds(keep: Option<i32>) {
    let fds: Vec<i32> = match fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed by now and may show up in the list.
    for fd in fds {
        if fd > 2 && Some(fd) != keep {
            // SAFETY: nothing in this process owns these descriptors: the only File/OwnedFd
            // values alive here are the readiness pipe, which is `keep`.
            unsafe { libc::close(fd) };
        }
    }
}

/// The detached daemon. Returns the process's exit status.
fn daemon_child(
    cfg: DaemonConfig,
    log_file: fs::File,
    devnull: fs::File,
    writer: io::PipeWriter,
) -> i32 {
    let pipe = Arc::new(Mutex::new(Some(writer)));
    let report_failure = |pipe: &Mutex<Option<io::PipeWriter>>, msg: &str| {
        let taken = pipe.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut w) = taken {
            let mut buf = vec![FAILED];
            buf.extend_from_slice(msg.as_bytes());
            let _ = w.write_all(&buf);
        }
    };
    // SAFETY: plain syscalls on fds we own.
    unsafe {
        libc::setsid();
        libc::dup2(devnull.as_raw_fd(), 0);
        libc::dup2(log_file.as_raw_fd(), 1);
        libc::dup2(log_file.as_raw_fd(), 2);
    }
    drop(devnull);
    drop(log_file);
    // Do not hold on to descriptors inherited from the caller (a pipe kept open here would
    // keep, e.g., a `$(checkpointfs mount ...)` waiting forever).
    close_inherited_fds(writer_fd(&pipe));
    init_logger();
    if let Err(e) = std::env::set_current_dir("/") {
        log::warn!("cannot chdir to /: {e}");
    }
    if let Err(e) = write_pid_and_mountpoint(&cfg) {
        let msg = format!(
            "cannot write {}/{PID_FILE}: {}",
            cfg.state_dir.display(),
            io_error_text(&e)
        );
        log::error!("{msg}");
        report_failure(&pipe, &msg);
        return EXIT_FAILURE;
    }
    log::info!(
        "checkpointfs {} daemon (pid {}): mounting {} at {}, state dir {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        cfg.source.display(),
        cfg.mountpoint.display(),
        cfg.state_dir.display()
    );
    let state_dir = cfg.state_dir.clone();
    let ready_pipe = Arc::clone(&pipe);
    let on_ready: Box<dyn FnOnce() + Send> = Box::new(move || {
        let taken = ready_pipe.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut w) = taken {
            let _ = w.write_all(&[READY]);
        }
        log::info!("mount is live");
    });
    let result = daemon::serve(cfg, on_ready);
    remove_pid_file(&state_dir);
    match result {
        Ok(()) => {
            // serve() returning Ok without on_ready would be a bug in serve; still tell the
            // parent rather than let it guess.
            report_failure(&pipe, "the filesystem exited before the mount was ready");
            log::info!("daemon exiting");
            EXIT_OK
        }
        Err(e) => {
            log::error!("mount failed: {e}");
            report_failure(&pipe, &e.to_string());
            EXIT_FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// umount
// ---------------------------------------------------------------------------------------

/// The absolute, symlink-free path of a mount point that may be a dead FUSE mount (which
/// cannot be stat'ed): canonicalize it, or else its parent plus its name.
fn resolve_mountpoint(mnt: &Path) -> io::Result<PathBuf> {
    let err = match fs::canonicalize(mnt) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    let abs = std::path::absolute(mnt)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(fs::canonicalize(parent).map_err(|_| err)?.join(name)),
        _ => Err(err),
    }
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is a fresh file descriptor we own.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until `pid` has exited; `false` on timeout.
fn wait_for_exit(pid: i32, pidfd: Option<&OwnedFd>, timeout: Duration) -> bool {
    if let Some(fd) = pidfd
        && let Ok(done) = poll_readable(fd.as_raw_fd(), timeout)
    {
        return done || !process_alive(pid);
    }
    let deadline = Instant::now() + timeout;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

fn umount_syscall(path: &Path, lazy: bool) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Without CAP_SYS_ADMIN, the setuid helper may still unmount a FUSE mount we own.
fn fusermount_unmount(path: &Path, lazy: bool) -> bool {
    for helper in ["fusermount3", "fusermount"] {
        let mut cmd = std::process::Command::new(helper);
        cmd.arg("-u");
        if lazy {
            cmd.arg("-z");
        }
        match cmd.arg(path).stdin(std::process::Stdio::null()).status() {
            Ok(s) => return s.success(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(_) => return false,
        }
    }
    false
}

/// `checkpointfs umount MNT`: unmounts and waits for the daemon to exit.
pub fn umount(mnt: &Path, lazy: bool, timeout: Duration) -> i32 {
    let shown = mnt.display();
    let not_ours = || {
        eprintln!("checkpointfs: {shown} is not a checkpointfs mount");
        EXIT_USAGE
    };
    let path = match resolve_mountpoint(mnt) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!("checkpointfs: {shown} does not exist");
            return EXIT_USAGE;
        }
        Err(e) => {
            eprintln!("checkpointfs: cannot access {shown}: {}", io_error_text(&e));
            return EXIT_FAILURE;
        }
    };
    let entry = match find_mount(&path) {
        Ok(Some(entry)) => entry,
        Ok(None) if fs::symlink_metadata(&path).is_err() => {
            eprintln!("checkpointfs: {shown} does not exist");
            return EXIT_USAGE;
        }
        Ok(None) => match recorded_state_dir(&path) {
            Some(state) => return already_unmounted(mnt, &state, timeout),
            None => return not_ours(),
        },
        Err(e) => {
            eprintln!(
                "checkpointfs: cannot read /proc/self/mountinfo: {}",
                io_error_text(&e)
            );
            return EXIT_FAILURE;
        }
    };
    if !entry.fstype.starts_with("fuse") {
        return not_ours();
    }
    // Find the daemon before unmounting: afterwards MNT no longer leads to it.
    let daemon_pid = match fs::read(path.join(STATE_DIR_FILE)) {
        Ok(raw) => {
            let state = PathBuf::from(OsString::from_vec(
                raw.strip_suffix(b"\n").unwrap_or(&raw).to_vec(),
            ));
            match read_pid_file(&state.join(PID_FILE)) {
                Some(pid) if process_alive(pid) => Some(pid),
                _ => {
                    eprintln!(
                        "checkpointfs: warning: no running daemon recorded in {}/{PID_FILE}; \
                         unmounting without waiting for it",
                        state.display()
                    );
                    None
                }
            }
        }
        Err(e) if endpoint_gone(&e) && is_checkpointfs_mount(&entry) => {
            return detach_dead_mount(mnt, &path);
        }
        Err(e) if is_checkpointfs_mount(&entry) => {
            eprintln!(
                "checkpointfs: warning: cannot reach the daemon of {shown} ({}); unmounting \
                 without waiting for it",
                io_error_text(&e)
            );
            None
        }
        Err(e) if endpoint_gone(&e) => {
            eprintln!(
                "checkpointfs: {shown} is a FUSE mount whose daemon is gone, and it is not \
                 recognizably checkpointfs; if it was, clean it up with: umount -l {shown}"
            );
            return EXIT_FAILURE;
        }
        Err(_) => return not_ours(),
    };
    let pidfd = daemon_pid.and_then(pidfd_open);

    match umount_syscall(&path, lazy) {
        Ok(()) => {}
        Err(e) if errno_of(&e) == libc::EBUSY => {
            eprintln!(
                "checkpointfs: {shown} is busy (a process has its working directory or a file \
                 open there; see: lsof +D {shown}); close it, or detach it anyway with: \
                 checkpointfs umount --lazy {shown}"
            );
            return EXIT_UMOUNT_BUSY;
        }
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(&path, lazy) => {}
        // Unmounted by someone else since we looked: what is left is to wait for the daemon.
        Err(e) if errno_of(&e) == libc::EINVAL => {
            return match daemon_pid {
                Some(pid) => wait_for_detached_daemon(mnt, pid, timeout),
                None => {
                    eprintln!("checkpointfs: {shown} is already unmounted");
                    EXIT_UMOUNT_GONE
                }
            };
        }
        Err(e) => {
            eprintln!(
                "checkpointfs: cannot unmount {shown}: {}",
                io_error_text(&e)
            );
            return EXIT_FAILURE;
        }
    }

    let Some(pid) = daemon_pid else {
        return EXIT_OK;
    };
    if wait_for_exit(pid, pidfd.as_ref(), timeout) {
        return EXIT_OK;
    }
    timed_out(mnt, pid, lazy, timeout)
}

/// Exit status 5 with what is going on.
fn timed_out(mnt: &Path, pid: i32, lazy: bool, timeout: Duration) -> i32 {
    let shown = mnt.display();
    if lazy {
        eprintln!(
            "checkpointfs: {shown} is detached, but the daemon (pid {pid}) is still serving \
             open files after {} s; it exits once they are closed, and its state is complete \
             only then",
            timeout.as_secs()
        );
    } else {
        eprintln!(
            "checkpointfs: {shown} is unmounted, but the daemon (pid {pid}) has not exited \
             after {} s; its state may be incomplete until it does",
            timeout.as_secs()
        );
    }
    EXIT_UMOUNT_TIMEOUT
}

/// MNT is not mounted, and the record of mounts says it was a checkpointfs mount of
/// `state`: exit 3 once no daemon runs for it any more.
fn already_unmounted(mnt: &Path, state: &Path, timeout: Duration) -> i32 {
    let shown = mnt.display();
    match read_pid_file(&state.join(PID_FILE)) {
        // Detached lazily before, and still serving files opened in it.
        Some(pid) if is_checkpointfs_process(pid) => wait_for_detached_daemon(mnt, pid, timeout),
        Some(_) => {
            eprintln!(
                "checkpointfs: {shown} is already unmounted, but its daemon did not exit \
                 cleanly ({}/{PID_FILE} remains); the next mount recovers the history from \
                 the journal in {}",
                state.display(),
                state.display()
            );
            EXIT_UMOUNT_GONE
        }
        None => {
            eprintln!(
                "checkpointfs: {shown} is already unmounted; its daemon has exited and the \
                 history in {} is complete",
                state.display()
            );
            EXIT_UMOUNT_GONE
        }
    }
}

/// MNT is no longer mounted but daemon `pid` still runs: wait for it as after an unmount.
fn wait_for_detached_daemon(mnt: &Path, pid: i32, timeout: Duration) -> i32 {
    eprintln!(
        "checkpointfs: {} is already unmounted; waiting for its daemon (pid {pid}) to exit",
        mnt.display()
    );
    let pidfd = pidfd_open(pid);
    if wait_for_exit(pid, pidfd.as_ref(), timeout) {
        EXIT_OK
    } else {
        timed_out(mnt, pid, true, timeout)
    }
}

/// Whether a failed request on a FUSE mount says its daemon is gone: ENOTCONN, or
/// ECONNABORTED / ECANCELED, which requests in flight get while the kernel aborts the
/// connection (the watchdog's abort, see `watchdog.rs`, or the daemon's exit).
pub(crate) fn endpoint_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN) | Some(libc::ECANCELED) | Some(libc::ECONNABORTED)
    )
}

/// The FUSE endpoint of a checkpointfs mount at `path` is dead (`endpoint_gone`: the daemon was
/// killed or crashed). Nothing can be flushed any more; detach the mount so that MNT is
/// usable again, and exit 3.
fn detach_dead_mount(mnt: &Path, path: &Path) -> i32 {
    let shown = mnt.display();
    let detached = match umount_syscall(path, true) {
        Ok(()) => Ok(()),
        Err(e) if errno_of(&e) == libc::EPERM && fusermount_unmount(path, true) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = detached {
        eprintln!(
            "checkpointfs: the daemon serving {shown} is gone, and the dead mount cannot be \
             detached: {}",
            io_error_text(&e)
        );
        return EXIT_FAILURE;
    }
    let state = recorded_state_dir(path)
        .map_or_else(|| "its state dir".to_string(), |s| s.display().to_string());
    eprintln!(
        "checkpointfs: the daemon serving {shown} was gone (killed or crashed); detached the \
         dead mount. Nothing was flushed now: the next mount of {state} recovers the history \
         from its journal"
    );
    EXIT_UMOUNT_GONE
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_daemon_is_gone_on_the_errnos_a_dead_fuse_mount_gives() {
        let gone = |code| endpoint_gone(&io::Error::from_raw_os_error(code));
        assert!(gone(libc::ENOTCONN) && gone(libc::ECANCELED) && gone(libc::ECONNABORTED));
        assert!(!gone(libc::ENOENT) && !gone(libc::EIO) && !gone(libc::EACCES));
        assert!(!endpoint_gone(&io::Error::other("no errno")));
    }

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
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
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

    #[test]
    fn parses_mountinfo() {
        let text = b"36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                     40 35 0:50 / /tmp/m rw,nosuid,nodev,relatime shared:5 - fuse.checkpointfs /src rw,user_id=0\n\
                     garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].fstype, "ext3");
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/m"));
        assert_eq!(m[1].fstype, FSTYPE);
        assert_eq!(m[1].source, OsString::from("/src"));
        assert!(is_checkpointfs_mount(&m[1]));
        assert!(!is_checkpointfs_mount(&m[0]));
        let direct = MountEntry {
            mount_point: "/m".into(),
            fstype: "fuse".into(),
            source: "checkpointfs".into(),
        };
        assert!(is_checkpointfs_mount(&direct));
        let other = MountEntry {
            source: "sshfs#host:".into(),
            ..direct
        };
        assert!(!is_checkpointfs_mount(&other));
        assert_eq!(
            unescape_mountinfo(b"a\\134b\\011c\\012"),
            OsString::from("a\\b\tc\n")
        );
        assert_eq!(
            unescape_mountinfo(b"trailing\\04"),
            OsString::from("trailing\\04")
        );
    }

    #[test]
    fn process_liveness() {
        assert!(process_alive(std::process::id() as i32));
        assert!(!process_alive(2147483646));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Wait until it is a zombie, then check it counts as gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_alive(pid), "a zombie counts as exited");
        child.wait().unwrap();
    }

    #[test]
    fn parses_command_lines() {
        let parse = |args: &[&str]| Cli::try_parse_from(args.iter().copied());
        let c = parse(&[
            "checkpointfs",
            "mount",
            "a",
            "b",
            "--exclude",
            "target/**",
            "--exclude",
            "*.o",
            "--threads",
            "3",
        ])
        .unwrap();
        match c.command {
            Command::Mount(m) => {
                assert_eq!(m.excludes, vec!["target/**", "*.o"]);
                assert_eq!(m.threads, Some(3));
                assert!(!m.foreground && !m.no_passthrough && !m.allow_other);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["checkpointfs", "mount", "a", "b", "--threads", "0"]).is_err());
        assert!(parse(&["checkpointfs", "mount", "a", "b", "--exclude", "a[b"]).is_err());
        assert!(parse(&["checkpointfs", "log"]).is_err());
        assert!(parse(&["checkpointfs", "log", "m", "--state-dir", "s"]).is_err());
        assert!(parse(&["checkpointfs", "log", "--state-dir", "s"]).is_ok());
        match parse(&[
            "checkpointfs",
            "rewind",
            "m",
            "id",
            "--dry-run",
            "--",
            "a",
            "--b",
        ])
        .unwrap()
        .command
        {
            Command::Rewind(r) => {
                assert!(r.dry_run);
                assert_eq!(r.paths, vec![PathBuf::from("a"), PathBuf::from("--b")]);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["checkpointfs", "status", "--state-dir", "s", "--path", "p"]).is_ok());
        Cli::command().debug_assert();
    }
}
