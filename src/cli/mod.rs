//! The command line: the clap definitions and the dispatch to the code that does the work:
//! `mount` is prepared ([`crate::mount::prepare`]), then starts the daemon
//! ([`crate::mount::spawn`]);
//! `umount` is [`crate::mount::unmount`]; `hook` is [`crate::cli::hook`] over
//! [`crate::mount::hook`]; the other subcommands are [`crate::cli::commands`],
//! [`crate::cli::install_hook`] and [`crate::cli::manuals`].
//!
//! Exit status: 0 success, 1 runtime failure, 2 usage error or refusal; `umount` has a few
//! more (see [`crate::cli::exit_status::UMOUNT_EXIT_STATUS`]).
pub mod commands;
pub mod exit_status;
pub mod hook;
pub mod install_hook;
#[allow(
    clippy::disallowed_methods,
    reason = "man pages written to the directory the user names, never SRC"
)]
pub mod manuals;
pub mod remote;
pub mod render;
pub mod ui;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand};

use crate::cli::commands::Target;
use crate::cli::exit_status::*;
use crate::history::logdiff::DiffFormat;
use crate::mount::prepare::{MountError, MountRequest};
use crate::mount::spawn::{init_logger, run_foreground, spawn_daemon};
use crate::mount::unmount::umount;
use crate::state::durability::Durability;
use crate::sys::error_text;

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
    /// Browse checkpoints, their changes and diffs in the terminal; restore with one key
    #[command(
        long_about = "Browse checkpoints, their changes and diffs in the terminal.\n\n\
        A timeline of checkpoints (newest first), the paths the selected one changed \
        (filter by typing after /), the selected file's diff (against the next checkpoint, \
        now with n, or a marked checkpoint with m), and a path's history (H, or p to type \
        one). r restores the selected file to the selected checkpoint, R rewinds the whole \
        tree to it, u undoes the last rewind: each after a confirmation showing what changes \
        and the id that undoes it, through the daemon as `checkpointfs rewind` does. ? lists \
        the keys, q quits. With --state-dir it is read-only."
    )]
    Ui(UiArgs),
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
        ~/.gemini/settings.json or DIR/.gemini/settings.json (Gemini CLI runs a project's \
        hooks only in a trusted folder).\n\n\
        The file is edited as JSON: other settings and hooks stay as they are. Running it \
        twice installs one hook; --remove takes out only ours. Outside a checkpointfs mount \
        the hook does nothing, so a user-level hook is harmless."
    )]
    InstallHook(InstallHookArgs),
    /// The checkpoint-per-prompt hook itself, as an agent runs it (JSON on stdin)
    #[command(
        long_about = "The checkpoint-per-prompt hook itself, as an agent runs it: reads the \
        agent's hook JSON on stdin, finds the checkpointfs mount holding its \"cwd\", \
        registers the session there and takes a checkpoint named \
        cc-<UTC yyyymmddTHHMMSSZ>-<session>-<NNNN> (gc-... for gemini). \
        mount-scripts/claude-code-hook and gemini-cli-hook run it; install-hook installs \
        them.\n\n\
        It never fails the prompt: it exits 0 whatever happens, bounds every access to the \
        mount to 5 s, and notes problems on stderr; for gemini it prints exactly one JSON \
        object on stdout ({} or {\"systemMessage\": ...}). `checkpointfs hook AGENT --help` \
        tells more.",
        disable_help_flag = true,
        disable_version_flag = true
    )]
    Hook(HookArgs),
    /// Push checkpoints to an object store, and list what one holds
    #[command(
        long_about = "Push checkpoints to an object store (s3://BUCKET/PREFIX on any \
        S3-compatible store, or file:///PATH), and list what one holds. Everything pushed is \
        encrypted and named by keyed hashes under the repository key; see \
        docs/remote-format.md and docs/usage.md."
    )]
    Remote(remote::RemoteArgs),
    /// Restore a pushed checkpoint into an empty directory, from the remote alone
    Restore(remote::RestoreArgs),
    /// Copy-on-write branches of the tree, served at MNT/.checkpoint/branches/NAME
    #[command(subcommand)]
    Branch(BranchCommand),
}

#[derive(Debug, clap::Subcommand)]
pub enum BranchCommand {
    /// Create branch NAME: a writable tree as of checkpoint ID (--at), or of now (a
    /// checkpoint is taken first). Prints the branch's absolute path.
    Create {
        /// The checkpointfs mount point
        #[arg(value_name = "MNT")]
        mnt: PathBuf,
        /// [A-Za-z0-9][A-Za-z0-9._-]{0,63}
        #[arg(value_name = "NAME")]
        name: String,
        /// Fork from this checkpoint instead of taking one
        #[arg(long, value_name = "ID")]
        at: Option<String>,
    },
    /// List the live branches: name, fork checkpoint, created, bytes written, path
    List {
        #[arg(value_name = "MNT")]
        mnt: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Drop branch NAME (gc frees its storage)
    Drop {
        #[arg(value_name = "MNT")]
        mnt: PathBuf,
        #[arg(value_name = "NAME")]
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The agent: claude or gemini
    #[arg(value_name = "AGENT", allow_hyphen_values = true)]
    pub agent: Option<OsString>,

    /// Ignored, with a note (a hook never fails the prompt); --help prints the hook's usage
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub rest: Vec<OsString>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("scope").args(["user", "project"])))]
pub struct InstallHookArgs {
    /// The agent
    #[arg(value_name = "AGENT", value_enum)]
    pub agent: crate::cli::install_hook::Agent,

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

    /// Serve requests over /dev/fuse even where the kernel offers FUSE over io_uring
    /// (Linux 6.14+ with the fuse module's enable_uring on; `status` says which is in use)
    #[arg(long)]
    pub no_io_uring: bool,

    /// Tests only (tests/it/watchdog.rs): ring requests for two reserved xattr names park
    /// their thread, in the daemon or awaiting commit, for good
    #[arg(long, hide = true)]
    pub test_park_ring_requests: bool,

    /// Do not use the kernel's FUSE passthrough for open files: every read and write then
    /// goes through the daemon (slower; for debugging or kernels without passthrough)
    #[arg(long)]
    pub no_passthrough: bool,

    /// Let users other than the mounting user access the mount (non-root users need
    /// `user_allow_other` in /etc/fuse.conf)
    #[arg(long)]
    pub allow_other: bool,

    /// What each user other than the owner and root may cost the owner's state dir on this
    /// mount (--allow-other, --owner): CHECKPOINTS ctl lines (checkpoint ids, session
    /// registrations) and SIZE bytes of backups and records (K, M, G suffixes). Past it,
    /// their changes and ctl writes fail with EDQUOT and change nothing. Saved in the state
    /// dir [default: 1000,8M]
    #[arg(long, value_name = "CHECKPOINTS,SIZE")]
    pub other_users_budget: Option<crate::history::budget::OthersBudget>,

    /// As root, mount for the normal user USER (a name or a uid), with kernel passthrough,
    /// which a user's own mount cannot have: only USER's processes may use the mount (the
    /// kernel checks), USER runs `checkpointfs log/diff/rewind/...` on it, and the state dir
    /// stays root's, so USER cannot change the history. Always nodev,nosuid. For a root-run
    /// service (see mount-scripts/checkpointfs@.service)
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,

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

    /// Push every checkpoint to URL in the background: s3://BUCKET[/PREFIX] (endpoint,
    /// region and credentials from the AWS_* environment variables; a URL carrying
    /// credentials is refused) or file:///PATH. Saved in the state dir like the exclusions
    #[arg(long, value_name = "URL")]
    pub remote: Option<String>,

    /// The repository key file for --remote (created 0600 if missing; never inside the state
    /// dir) [default: $XDG_CONFIG_HOME/checkpointfs/remote.key]
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub remote_key: Option<PathBuf>,

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

    /// Print JSON (schema "checkpointfs.log/3", see docs/json-output.md)
    #[arg(long)]
    pub json: bool,

    /// Only this agent session's checkpoints and the changes it made (its full id, or the
    /// first 8 or more characters the text log shows)
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
}

#[derive(Debug, Args)]
pub struct UiArgs {
    #[command(flatten)]
    pub target: TargetArgs,
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
    override_usage = "checkpointfs diff [--stat] [--json] [--full] MNT M [N]\n       \
    checkpointfs diff [--stat] [--json] [--full] --state-dir DIR M [N]"
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

    /// Diff text files above 8 MiB by lines too; without it such a file is reported as
    /// "large, N bytes changed" (compared in bounded memory)
    #[arg(long)]
    pub full: bool,
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

fn parse_glob(s: &str) -> Result<String, String> {
    crate::history::exclusions::check_glob(s).map(|()| s.to_string())
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
        .is_some_and(|a| a == crate::mount::watchdog::SUBCOMMAND)
    {
        init_logger();
        let rest: Vec<String> = args[2..]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return crate::mount::watchdog::run(&rest);
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if !matches!(cli.command, Command::Mount(_) | Command::Hook(_)) {
        // Report commands print to stdout: `checkpointfs log | head` must end quietly, as
        // other tools do, not panic in println!. Not for `mount`: the daemon it starts
        // writes to sockets and must get EPIPE, not die; nor for `hook`, which must exit 0.
        // SAFETY: signal(2) with SIG_DFL; called before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::Mount(a) => mount(a),
        Command::Umount(a) => {
            umount_exit_status(umount(&a.mnt, a.lazy, Duration::from_secs(a.timeout)))
        }
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
        Command::Ui(a) => match target(a.target) {
            Ok(t) => ui::run(&t),
            Err(code) => code,
        },
        Command::Status(a) => match target(a.target) {
            Ok(t) => commands::status(&t, a.path.as_deref(), a.json),
            Err(code) => code,
        },
        Command::Completions(a) => manuals::completions(Cli::command(), a.shell),
        Command::Man(a) => manuals::man(Cli::command(), a.dir.as_deref()),
        Command::Gc(a) => gc(a),
        Command::InstallHook(a) => install_hook(a),
        Command::Hook(a) => hook::run(a.agent.as_ref(), &a.rest),
        Command::Remote(a) => remote::run(a),
        Command::Restore(a) => remote::restore_command(a),
        Command::Branch(b) => commands::branch(b),
    }
}

fn install_hook(a: InstallHookArgs) -> i32 {
    use crate::cli::install_hook::{self as ih, Outcome, Scope};
    let scope = match &a.project {
        Some(dir) => match fs::canonicalize(dir) {
            Ok(d) if d.is_dir() => Scope::Project(d),
            Ok(d) => {
                eprintln!("checkpointfs: {} is not a directory", d.display());
                return EXIT_USAGE;
            }
            Err(e) => {
                eprintln!("checkpointfs: {}: {}", dir.display(), error_text(&e));
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
                .map_err(|e| crate::sys::context(format!("hook script {}", p.display()), e)),
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
            eprintln!("checkpointfs: {}", error_text(&e));
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
        full: a.full,
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
// mount: prepare (crate::mount::prepare), then start the daemon (crate::mount::spawn)
// ---------------------------------------------------------------------------------------

fn mount(a: MountArgs) -> i32 {
    let remote = match a
        .remote
        .as_deref()
        .map(|u| remote::remote_setting(u, a.remote_key.as_deref()))
    {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => {
            eprintln!("checkpointfs: {e}");
            return EXIT_USAGE;
        }
    };
    let request = MountRequest {
        src: a.src,
        mnt: a.mnt,
        state_dir: a.state_dir,
        options: a.options,
        owner: a.owner,
        excludes: a.excludes,
        exclude_from: a.exclude_from,
        no_exclude: a.no_exclude,
        respect_gitignore: a.respect_gitignore,
        no_respect_gitignore: a.no_respect_gitignore,
        threads: a.threads,
        no_passthrough: a.no_passthrough,
        no_io_uring: a.no_io_uring,
        test_park: a.test_park_ring_requests,
        allow_other: a.allow_other,
        other_users_budget: a.other_users_budget,
        durability: a.durability,
        remote,
    };
    let cfg = match crate::mount::prepare::prepare(&request) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            return match e {
                MountError::Refused(_) => EXIT_USAGE,
                MountError::Failed(_) => EXIT_FAILURE,
            };
        }
    };
    let started = if a.foreground {
        run_foreground(cfg)
    } else {
        spawn_daemon(cfg, a.verbose)
    };
    started.map_or(EXIT_FAILURE, |()| EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

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
