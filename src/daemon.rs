//! One mount's daemon: builds the filesystem, mounts it, serves until unmounted or signalled,
//! then flushes history and transcript.
use std::path::PathBuf;

/// Everything the daemon needs; paths are canonical and already validated by the CLI.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub source: PathBuf,
    pub mountpoint: PathBuf,
    pub state_dir: PathBuf,
    pub threads: usize,
    pub passthrough: bool,
    pub allow_other: bool,
    pub excludes: Vec<String>,
}
