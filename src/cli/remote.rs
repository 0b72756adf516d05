//! `checkpointfs remote (set | push | log)` and `checkpointfs restore`: the command line of
//! the remote (docs/remote-format.md; the worker is `crate::remote::push`).
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::cli::commands::{ask_daemon, state_dir_of_mount};
use crate::cli::exit_status::*;
use crate::history::settings::RemoteSetting;
use crate::mount::control_socket::Request;
use crate::remote::RemoteUrl;
use crate::remote::key::{RepoKey, default_key_path};
use crate::remote::repo::Repo;
use crate::remote::restore;

#[derive(Debug, Args)]
pub struct RemoteArgs {
    #[command(subcommand)]
    pub command: RemoteCommand,
}

#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// Push the checkpoints of mount MNT to URL from now on (saved in its state dir)
    Set(RemoteSetArgs),
    /// Push now what the remote lacks; --wait returns when it is there
    Push(RemotePushArgs),
    /// List the sessions in a remote and their checkpoints
    Log(RemoteLogArgs),
}

#[derive(Debug, Args)]
pub struct RemoteSetArgs {
    /// The checkpointfs mount point
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,
    /// s3://BUCKET[/PREFIX] (endpoint, region and credentials from the AWS_* environment
    /// variables of the daemon) or file:///PATH
    #[arg(value_name = "URL")]
    pub url: String,
    /// The repository key file (created 0600 if missing) [default:
    /// $XDG_CONFIG_HOME/checkpointfs/remote.key]
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RemotePushArgs {
    /// The checkpointfs mount point
    #[arg(value_name = "MNT")]
    pub mnt: PathBuf,
    /// Wait until every checkpoint is in the remote, or an attempt fails (its error)
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after SECS seconds
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub timeout: u64,
}

#[derive(Debug, Args)]
pub struct RemoteLogArgs {
    #[arg(value_name = "URL")]
    pub url: String,
    /// Only this session
    #[arg(long, value_name = "S")]
    pub session: Option<String>,
    /// The repository key file [default: $XDG_CONFIG_HOME/checkpointfs/remote.key]
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[arg(value_name = "URL")]
    pub url: String,
    /// The session (as `checkpointfs remote log URL` lists it)
    #[arg(value_name = "SESSION")]
    pub session: String,
    /// The checkpoint id
    #[arg(value_name = "ID")]
    pub id: String,
    /// An empty (or missing) directory to restore into
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// The repository key file [default: $XDG_CONFIG_HOME/checkpointfs/remote.key]
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

/// `--key FILE` made absolute (the daemon runs elsewhere), or the default.
fn key_file(given: Option<&Path>) -> Result<PathBuf, String> {
    match given {
        Some(p) => std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display())),
        None => default_key_path().map_err(|e| e.to_string()),
    }
}

/// Checks `url` and the key path for `mount --remote` (nothing is created yet).
pub fn remote_setting(url: &str, key: Option<&Path>) -> Result<RemoteSetting, String> {
    let parsed: RemoteUrl = url.parse()?;
    Ok(RemoteSetting {
        url: parsed.text,
        key_file: key_file(key)?,
    })
}

pub fn run(a: RemoteArgs) -> i32 {
    match a.command {
        RemoteCommand::Set(a) => {
            let setting = match remote_setting(&a.url, a.key.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("checkpointfs: {e}");
                    return EXIT_USAGE;
                }
            };
            match state_dir_of_mount(&a.mnt) {
                Ok(dir) => ask_daemon(
                    &dir,
                    &Request::RemoteSet {
                        url: setting.url,
                        key_file: setting.key_file,
                    },
                ),
                Err(code) => code,
            }
        }
        RemoteCommand::Push(a) => match state_dir_of_mount(&a.mnt) {
            Ok(dir) => ask_daemon(
                &dir,
                &Request::RemotePush {
                    wait_secs: a.wait.then_some(a.timeout),
                },
            ),
            Err(code) => code,
        },
        RemoteCommand::Log(a) => with_repo(&a.url, a.key.as_deref(), |repo| {
            let sessions = restore::log(repo, a.session.as_deref())?;
            let mut out = String::new();
            for s in sessions {
                out.push_str(&format!(
                    "session {}  {} on {}\n",
                    s.info.mount_id, s.info.source, s.info.host
                ));
                for m in s.checkpoints {
                    out.push_str(&format!(
                        "  {}  {}  {} files, {} bytes\n",
                        m.time, m.id, m.files, m.bytes
                    ));
                }
            }
            if a.session.is_none() {
                let all = repo.list_all()?;
                let data = all.iter().filter(|(p, _)| p.contains("/data/"));
                let (n, bytes) = data.fold((0u64, 0u64), |(n, b), (_, s)| (n + 1, b + s));
                out.push_str(&format!(
                    "repository: {} objects, {} bytes; content: {n} objects, {bytes} bytes\n",
                    all.len(),
                    all.iter().map(|(_, s)| s).sum::<u64>()
                ));
            }
            print!("{out}");
            Ok(())
        }),
    }
}

pub fn restore_command(a: RestoreArgs) -> i32 {
    with_repo(&a.url, a.key.as_deref(), |repo| {
        let manifest = restore::find(repo, &a.session, &a.id)?;
        let report = restore::restore(repo, &manifest, &a.dir)?;
        println!(
            "restored {} of session {} into {}: {} files ({} bytes), {} directories, {} symlinks",
            manifest.id,
            manifest.mount_id,
            a.dir.display(),
            report.files,
            report.bytes,
            report.dirs,
            report.symlinks
        );
        for p in &report.setid_dropped {
            println!("set-id bits not restored: {p}");
        }
        for p in &report.skipped_special {
            println!("special file not restored: {p}");
        }
        Ok(())
    })
}

fn with_repo(url: &str, key: Option<&Path>, f: impl FnOnce(&Repo) -> std::io::Result<()>) -> i32 {
    let url: RemoteUrl = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            return EXIT_USAGE;
        }
    };
    let run = || -> std::io::Result<()> {
        let path = key_file(key).map_err(std::io::Error::other)?;
        let key = RepoKey::load(&path, false)?;
        let repo = Repo::open(url, key)?;
        f(&repo)
    };
    match run() {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("checkpointfs: {e}");
            EXIT_FAILURE
        }
    }
}
