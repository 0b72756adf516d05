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

// STUB (cli branch): the real serve() lives on main
/// Mounts cfg.source at cfg.mountpoint and serves until the mount is unmounted from outside
/// (`umount MNT`) or SIGINT/SIGTERM arrives; then flushes history + transcript and returns.
/// Calls `on_ready` exactly once, after the mount is live. Creates threads: call it only after
/// any fork.
pub fn serve(cfg: DaemonConfig, on_ready: Box<dyn FnOnce() + Send>) -> std::io::Result<()> {
    let _ = (cfg, on_ready);
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the filesystem core is not part of this build (cli branch stub)",
    ))
}
