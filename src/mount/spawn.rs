//! Starting the daemon: in the foreground, or detached (fork, setsid, a readiness pipe the
//! parent waits on, inherited fds closed), with its pid and mount point recorded.
use std::fs;
use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
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
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    // A log file (the detached daemon's STATE/daemon.log) gets whole lines; a terminal keeps
    // env_logger's own (coloured) stderr.
    //
    // The writer is fd 2 itself, looked up at each record, never a duplicate of it: the
    // watchdog closes every descriptor from 3 up once the logger is set up, and a duplicate
    // would be among them (its abort message would be lost).
    if !io::stderr().is_terminal() {
        builder.target(env_logger::Target::Pipe(Box::new(LogLines::new(
            io::stderr(),
        ))));
    }
    let _ = builder.try_init();
}

/// The daemon's log file as env_logger writes to it: each record (one line, or a few when a
/// message has newlines) goes out in one write(2), so records never interleave or split. A
/// write cut short by a full disk is taken back (the file is truncated to where the record
/// began), so the log never holds half a line; the next record that fits says how many were
/// lost.
struct LogLines<W: Write + AsFd> {
    file: W,
    pending: Vec<u8>,
    lost: u64,
}

impl<W: Write + AsFd> LogLines<W> {
    fn new(file: W) -> LogLines<W> {
        LogLines {
            file,
            pending: Vec::new(),
            lost: 0,
        }
    }

    /// Writes the complete lines of `pending` in one write(2).
    fn write_lines(&mut self) {
        let Some(end) = self.pending.iter().rposition(|&b| b == b'\n') else {
            return;
        };
        let mut record: Vec<u8> = self.pending.drain(..=end).collect();
        if self.lost > 0 {
            let note = format!(
                "[checkpointfs] {} log record(s) lost before this one: the disk holding \
                 the log was full\n",
                self.lost
            );
            record.splice(0..0, note.into_bytes());
        }
        match self.file.write(&record) {
            Ok(n) if n == record.len() => self.lost = 0,
            Ok(n) => {
                // Part of the record went in: take it back (the file is opened O_APPEND and
                // only this process's logger, under env_logger's lock, writes to it).
                if let Ok(fd) = self.file.as_fd().try_clone_to_owned() {
                    let file = fs::File::from(fd);
                    if let Ok(meta) = file.metadata()
                        && meta.is_file()
                    {
                        let _ = file.set_len(meta.len().saturating_sub(n as u64));
                    }
                }
                self.lost += 1;
            }
            Err(_) => self.lost += 1,
        }
    }
}

impl<W: Write + AsFd> Write for LogLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_lines();
        Ok(())
    }
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

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "log files on a tmpfs of the test's own, never SRC"
)]
mod tests {
    use super::*;

    /// A tmpfs of `pages` pages at a new temporary directory (root only), unmounted when
    /// dropped.
    struct TinyTmpfs(tempfile::TempDir);

    impl TinyTmpfs {
        fn new(pages: usize) -> Option<TinyTmpfs> {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return None;
            }
            let dir = tempfile::tempdir().ok()?;
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={}", pages * 4096))
                .arg("tmpfs")
                .arg(dir.path())
                .status()
                .ok()?
                .success();
            ok.then_some(TinyTmpfs(dir))
        }
    }

    impl Drop for TinyTmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg(self.0.path())
                .status();
        }
    }

    /// Writes numbered 100-byte records with `write` until the disk is full.
    fn fill(mut write: impl FnMut(&[u8])) {
        for i in 0..200 {
            let line = format!("{i:04} {}\n", "x".repeat(94));
            write(line.as_bytes());
        }
    }

    fn cut_lines(log: &[u8]) -> bool {
        !log.is_empty() && !log.ends_with(b"\n")
            || log
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .any(|l| l.len() != 99 && !l.starts_with(b"[checkpointfs]"))
    }

    #[test]
    fn log_records_are_never_cut_on_a_full_disk() {
        let Some(tmp) = TinyTmpfs::new(2) else {
            eprintln!("skipped: needs root to mount a tmpfs");
            return;
        };
        let open = |name: &str| {
            fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(tmp.0.path().join(name))
                .unwrap()
        };
        // What env_logger does on stderr (write_all): the record that meets the full disk
        // is cut.
        let mut plain = open("plain.log");
        fill(|line| {
            let _ = plain.write_all(line);
        });
        assert!(cut_lines(
            &fs::read(tmp.0.path().join("plain.log")).unwrap()
        ));
        drop(plain);
        fs::remove_file(tmp.0.path().join("plain.log")).unwrap();

        let mut log = LogLines::new(open("daemon.log"));
        fill(|line| {
            // As env_logger's pipe target: the record, then a flush.
            log.write_all(line).unwrap();
            log.flush().unwrap();
        });
        let path = tmp.0.path().join("daemon.log");
        let written = fs::read(&path).unwrap();
        assert!(
            !cut_lines(&written),
            "{}",
            String::from_utf8_lossy(&written)
        );
        assert!(log.lost > 0);
        // Space again (the log is cut back by hand here): the next record says what was lost.
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        log.write_all(b"0999 after\n").unwrap();
        log.flush().unwrap();
        let after = String::from_utf8(fs::read(&path).unwrap()).unwrap();
        assert!(
            after.starts_with("[checkpointfs] ") && after.ends_with("\n0999 after\n"),
            "{after}"
        );
        assert_eq!(log.lost, 0);
    }
}
