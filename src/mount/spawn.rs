//! Starting the daemon: in the foreground, or detached (fork, setsid, a readiness pipe the
//! parent waits on, inherited fds closed), with its pid and mount point recorded.
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mount::daemon::{self, DaemonConfig};
use crate::mount::registry::{LOG_FILE, remove_pid_file, write_pid_and_mountpoint};
use crate::sys::{error_text, poll_readable};

/// How long `mount` waits for a detached daemon to report that the mount is live.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A failure already reported: on stderr, and for the detached daemon itself in its log
/// and through the readiness pipe. The command exits with status 1.
#[derive(Debug)]
pub struct Reported;

fn thread_count() -> usize {
    fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1)
}

pub(crate) fn init_logger() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .try_init();
}

pub(crate) fn run_foreground(cfg: DaemonConfig) -> Result<(), Reported> {
    init_logger();
    if let Err(e) = write_pid_and_mountpoint(&cfg.state_dir, &cfg.mountpoint) {
        // The error names the file ("cannot write STATE/daemon.pid (...)").
        eprintln!("checkpointfs: {}", error_text(&e));
        return Err(Reported);
    }
    let state_dir = cfg.state_dir.clone();
    let (src, mnt) = (cfg.source.clone(), cfg.mountpoint.clone());
    let on_ready: Box<dyn FnOnce() + Send> = Box::new(move || {
        log::info!("mounted {} at {}", src.display(), mnt.display());
    });
    let result = daemon::serve(cfg, on_ready);
    remove_pid_file(&state_dir);
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            eprintln!("checkpointfs: mount failed: {e}");
            Err(Reported)
        }
    }
}

/// What the daemon child writes to the readiness pipe.
const READY: u8 = b'R';

const FAILED: u8 = b'E';

pub(crate) fn spawn_daemon(cfg: DaemonConfig, verbose: bool) -> Result<(), Reported> {
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
                error_text(&e)
            );
            return Err(Reported);
        }
    };
    let devnull = match fs::File::open("/dev/null") {
        Ok(f) => f,
        Err(e) => {
            eprintln!("checkpointfs: cannot open /dev/null: {}", error_text(&e));
            return Err(Reported);
        }
    };
    let (reader, writer) = match io::pipe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("checkpointfs: cannot create a pipe: {}", error_text(&e));
            return Err(Reported);
        }
    };
    // fork() only duplicates the calling thread; serve() creates threads, so none may exist
    // yet. Nothing before this point starts one, but make sure.
    if thread_count() > 1 {
        eprintln!("checkpointfs: internal error: cannot detach a multi-threaded process; use -f");
        return Err(Reported);
    }
    let _ = io::stdout().flush();
    let _ = io::stderr().flush();
    // SAFETY: the process is single-threaded (checked above).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        eprintln!(
            "checkpointfs: fork failed: {}",
            error_text(&io::Error::last_os_error())
        );
        return Err(Reported);
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
) -> Result<(), Reported> {
    let failed = |msg: &str| {
        eprintln!(
            "checkpointfs: mount failed: {msg} (see {})",
            log_path.display()
        );
        Err(Reported)
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
            Err(e) => return failed(&format!("waiting for the daemon: {}", error_text(&e))),
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
                    return Ok(());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return failed(&format!("waiting for the daemon: {}", error_text(&e))),
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

/// The detached daemon. Returns how the process ends.
fn daemon_child(
    cfg: DaemonConfig,
    log_file: fs::File,
    devnull: fs::File,
    writer: io::PipeWriter,
) -> Result<(), Reported> {
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
    if let Err(e) = write_pid_and_mountpoint(&cfg.state_dir, &cfg.mountpoint) {
        // The error names the file ("cannot write STATE/daemon.pid (...)").
        let msg = error_text(&e);
        log::error!("{msg}");
        report_failure(&pipe, &msg);
        return Err(Reported);
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
            Ok(())
        }
        Err(e) => {
            log::error!("mount failed: {e}");
            report_failure(&pipe, &e.to_string());
            Err(Reported)
        }
    }
}
