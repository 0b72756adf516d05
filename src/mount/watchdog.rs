//! The watchdog: a small process, started by the daemon right after it mounts, that aborts
//! this mount's FUSE connection when the daemon can no longer serve it, so that no fault of
//! the daemon leaves a caller waiting forever.
//!
//! Two faults need it; everything else ends with the daemon's exit, which closes /dev/fuse
//! and so aborts the connection by itself:
//! - the daemon was killed while one of its own threads waited on its own mount (a rewind
//!   works through MNT): that thread sleeps uninterruptibly for a reply only the dead daemon
//!   could send, so the process never finishes exiting and /dev/fuse never closes;
//! - the daemon is stopped (SIGSTOP, a tracer): a request it had already read waits for it,
//!   and its caller cannot be killed, until it runs again.
//!
//! The kernel's own FUSE request timeout (Linux 6.14+, `FUSE_REQUEST_TIMEOUT` in INIT) would
//! bound both; our session does not set `fuse_init_out.request_timeout` yet, and the
//! `fs.fuse.default_request_timeout` sysctl is machine-wide, so it is left to the admin.
//!
//! Over FUSE over io_uring a stopped daemon needs one more step: a request the kernel
//! handed to one of its ring entries waits for the stopped thread to take it, and the
//! abort does not end it; so after aborting, the watchdog kills a stopped daemon.
//!
//! It is a process, not a thread, so that whatever stops or kills the daemon leaves it
//! running; it has its own process group, so a Ctrl-C meant for a foreground daemon does not
//! reach it. It holds no fd of the mount or of /dev/fuse (it closes every inherited fd but
//! the abort file), so it never keeps the connection alive itself.
//!
//! Which connection: the daemon looks up its live mount's device number N and passes it;
//! the watchdog opens `/sys/fs/fuse/connections/<N>/abort` at once, while the daemon is
//! alive and serving that mount, and reports back before the daemon goes on. Once the
//! connection is gone the kernel detaches the open file from it (a write then fails with
//! ENOTCONN), so a later write can never abort another mount that reused N.
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use log::{info, warn};

/// How long the daemon may stay stopped before the watchdog aborts its connection: callers
/// whose request the daemon had already read are released (with ECONNABORTED) after at most
/// this plus [`POLL`].
pub const STOPPED_BOUND: Duration = Duration::from_secs(10);

/// How often the watchdog looks at the daemon's state while it runs.
const POLL: Duration = Duration::from_millis(500);

/// Where the fusectl filesystem lists FUSE connections by device number.
const CONNECTIONS: &str = "/sys/fs/fuse/connections";

/// The name of the hidden subcommand that runs [`run`].
pub const SUBCOMMAND: &str = "__watchdog";

/// The device number (major, minor) of the topmost mount at `mount_point` in a
/// /proc/self/mountinfo text.
pub fn mount_dev(mountinfo: &[u8], mount_point: &Path) -> Option<(u32, u32)> {
    mountinfo
        .split(|&b| b == b'\n')
        .rev()
        .filter_map(|line| {
            let mut fields = line.split(|&b| b == b' ');
            let dev = fields.nth(2)?;
            let point = fields.nth(1)?;
            if crate::mount::mountinfo::unescape_mountinfo(point).as_bytes()
                != mount_point.as_os_str().as_bytes()
            {
                return None;
            }
            let dev = std::str::from_utf8(dev).ok()?;
            let (major, minor) = dev.split_once(':')?;
            Some((major.parse().ok()?, minor.parse().ok()?))
        })
        .next()
}

/// The fusectl name of the connection of a FUSE mount with device (major, minor): the
/// kernel's internal dev_t, `major << 20 | minor`, in decimal.
pub fn connection_name(major: u32, minor: u32) -> String {
    (u64::from(major) << 20 | u64::from(minor)).to_string()
}

/// The fusectl name of the connection of the live mount at `mount_point`.
fn connection_of(mount_point: &Path) -> io::Result<String> {
    let mountinfo = std::fs::read("/proc/self/mountinfo")?;
    let (major, minor) = mount_dev(&mountinfo, mount_point).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not in /proc/self/mountinfo", mount_point.display()),
        )
    })?;
    Ok(connection_name(major, minor))
}

/// Starts the watchdog for the live mount at `mount_point`, served by this process, and
/// waits until it holds the connection's abort file. Fails if it cannot (fusectl neither
/// mounted nor mountable, the file not ours to write); the caller decides whether to go on
/// without it.
pub fn start(mount_point: &Path) -> io::Result<Child> {
    let name = connection_of(mount_point)?;
    let mut child = Command::new("/proc/self/exe")
        .arg(SUBCOMMAND)
        .arg(std::process::id().to_string())
        .arg(&name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| crate::sys::context("cannot start the watchdog", e))?;
    // It writes one line, READY or the reason it gave up, and closes stdout; it never waits
    // on the mount, so this read cannot hang on it.
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        io::BufRead::read_line(&mut io::BufReader::new(out), &mut line)?;
    }
    if line.trim_end() != READY {
        let _ = child.wait();
        let why = line.trim_end();
        return Err(io::Error::other(if why.is_empty() {
            "the watchdog exited at once".to_string()
        } else {
            why.to_string()
        }));
    }
    info!(
        "watchdog {} holds FUSE connection {name} (aborts it if this daemon dies with a request pending, or stays stopped {} s)",
        child.id(),
        STOPPED_BOUND.as_secs()
    );
    Ok(child)
}

/// What the watchdog prints once it holds the abort file.
const READY: &str = "READY";

/// Opens `/sys/fs/fuse/connections/<conn>/abort` for writing. Where fusectl is not mounted
/// (as on this kind of VM), mounts it in a mount namespace of this process's own, opens the
/// file there and returns to the machine's namespace, so that nothing changes for anyone
/// else (needs root; the caller is single-threaded).
fn open_abort_file(conn: &str) -> io::Result<File> {
    let path = PathBuf::from(CONNECTIONS).join(conn).join("abort");
    let open = || std::fs::OpenOptions::new().write(true).open(&path);
    match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let home = File::open("/proc/self/ns/mnt")?;
            mount_private_fusectl()?;
            let opened = open();
            // Back to the machine's namespace at once: the private one holds a copy of every
            // mount, FUSE mounts included, and would keep them alive after their umount. It is
            // freed with its last process; the open abort file keeps only fusectl.
            // SAFETY: setns(2) on an open namespace fd; this process has one thread.
            if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
                let e = io::Error::last_os_error();
                return Err(crate::sys::context(
                    "cannot leave the private mount namespace",
                    e,
                ));
            }
            opened
        }
        other => other,
    }
    .map_err(|e| crate::sys::context(format!("cannot open {}", path.display()), e))
}

fn mount_private_fusectl() -> io::Result<()> {
    let check = |rc: i32, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            let e = io::Error::last_os_error();
            Err(crate::sys::context(what, e))
        }
    };
    check(
        // SAFETY: unshare(2) takes a flag; this process has one thread (required for NEWNS).
        unsafe { libc::unshare(libc::CLONE_NEWNS) },
        "cannot make a private mount namespace for fusectl",
    )?;
    check(
        // SAFETY: static NUL-terminated strings; null fstype and data are allowed for a
        // propagation change.
        unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        },
        "cannot make the private mount namespace private",
    )?;
    check(
        // SAFETY: static NUL-terminated strings; fusectl takes no data.
        unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        },
        "cannot mount fusectl at /sys/fs/fuse/connections",
    )
}

/// What the watchdog makes of the daemon's state letter in /proc/PID/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaemonState {
    Running,
    /// SIGSTOP or a tracer.
    Stopped,
    /// The main thread has exited but the process has not (a thread is stuck).
    Dying,
}

/// Parses the state letter out of a /proc/PID/stat text ("pid (comm) S ...": the state
/// follows the last ')', as comm may hold anything).
pub fn parse_state(stat: &[u8]) -> Option<DaemonState> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    match stat.get(close + 2)? {
        b'T' | b't' => Some(DaemonState::Stopped),
        b'Z' | b'X' | b'x' => Some(DaemonState::Dying),
        _ => Some(DaemonState::Running),
    }
}

/// Decides, from the state seen now and when the daemon was first seen stopped, whether to
/// abort, and the new "stopped since".
pub fn should_abort(
    state: DaemonState,
    stopped_since: Option<Instant>,
    now: Instant,
    bound: Duration,
) -> (bool, Option<Instant>) {
    match state {
        DaemonState::Running => (false, None),
        DaemonState::Dying => (true, stopped_since),
        DaemonState::Stopped => {
            let since = stopped_since.unwrap_or(now);
            (now.duration_since(since) >= bound, Some(since))
        }
    }
}

/// The watchdog process: `args` are the daemon's pid and the connection name. Reports on
/// stdout (see [`start`]), then watches. Returns the exit status.
pub fn run(args: &[String]) -> i32 {
    // Nothing inherited but stdio may stay open (stderr is the daemon's log): an inherited
    // /dev/fuse fd would keep the connection alive.
    // None of the descriptors above 2 is used by this process (it was just exec'd and has not
    // opened any yet).
    crate::sys::close_descriptors_from(3);
    let (Some(pid), Some(conn)) = (
        args.first().and_then(|p| p.parse::<i32>().ok()),
        args.get(1),
    ) else {
        eprintln!("checkpointfs {SUBCOMMAND}: usage: {SUBCOMMAND} DAEMON_PID CONNECTION");
        return 2;
    };
    let Some(pidfd) = crate::sys::pidfd_open(pid) else {
        println!("cannot watch daemon {pid}: {}", io::Error::last_os_error());
        return 1;
    };
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != pid {
        println!("daemon {pid} died before it could be watched");
        return 1;
    }
    // Opened while the daemon is alive and serving the mount, so <conn> is its connection.
    let mut abort = match open_abort_file(conn) {
        Ok(f) => f,
        Err(e) => {
            println!("{e}");
            return 1;
        }
    };
    println!("{READY}");
    // The daemon's read ends at EOF; anything printed later goes to the log.
    // SAFETY: dup2 of two open descriptors (stdio) replaces fd 1 atomically.
    unsafe { libc::dup2(2, 1) };
    let mut stopped_since = None;
    loop {
        match poll_readable(&pidfd, POLL) {
            // Exited and reaped-able: its /dev/fuse fds are closed, the kernel has aborted
            // the connection itself.
            Ok(true) => return 0,
            Ok(false) => {}
            Err(e) => {
                warn!("watchdog: poll on daemon {pid} failed: {e}");
                return 1;
            }
        }
        // The pidfd is not readable, so `pid` is still the daemon (it cannot be reused
        // before the daemon is reaped).
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(state) = parse_state(&stat) else {
            continue;
        };
        let (abort_now, since) = should_abort(state, stopped_since, Instant::now(), STOPPED_BOUND);
        stopped_since = since;
        if abort_now {
            match state {
                DaemonState::Dying => warn!(
                    "watchdog: daemon {pid} died with a thread stuck on its own mount; aborting FUSE connection {conn}"
                ),
                _ => warn!(
                    "watchdog: daemon {pid} has been stopped for {} s; aborting FUSE connection {conn} so that its callers are released, and killing the daemon",
                    STOPPED_BOUND.as_secs()
                ),
            }
            let aborted = abort_connection(&mut abort, conn);
            if state == DaemonState::Stopped {
                // With FUSE over io_uring, a request the kernel handed to a ring entry of
                // the stopped daemon waits for the daemon's thread to take it (the copy
                // into its buffers runs as that thread's task work), and the abort cannot
                // end it until that thread runs or dies: its caller stays unkillable. The
                // mount is dead after the abort anyway, so the daemon dies too (its history
                // is crash-safe: the next mount replays it).
                if let Err(e) = crate::sys::pidfd_send_signal(&pidfd, libc::SIGKILL) {
                    warn!("watchdog: cannot kill the stopped daemon {pid}: {e}");
                }
            }
            return aborted;
        }
    }
}

fn abort_connection(abort: &mut File, conn: &str) -> i32 {
    match abort.write_all(b"1") {
        Ok(()) => 0,
        // The connection is already gone.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => 0,
        Err(e) => {
            warn!("watchdog: aborting FUSE connection {conn} failed: {e}");
            1
        }
    }
}

/// Whether `fd` became readable within `timeout`.
fn poll_readable(fd: &OwnedFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `p` is one valid pollfd for the duration of the call.
    match unsafe { libc::poll(&mut p, 1, ms) } {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &[u8] = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        90 22 0:61 / /tmp/a\\040b rw,nosuid,nodev - fuse.checkpointfs /src rw,user_id=0\n\
        91 22 0:62 / /tmp/m rw - fuse.checkpointfs /src rw\n\
        92 91 0:70 / /tmp/m rw - fuse.checkpointfs /src2 rw\n\
        malformed\n";

    #[test]
    fn mount_dev_finds_the_topmost_mount_and_unescapes() {
        assert_eq!(mount_dev(MOUNTINFO, Path::new("/tmp/a b")), Some((0, 61)));
        assert_eq!(mount_dev(MOUNTINFO, Path::new("/tmp/m")), Some((0, 70)));
        assert_eq!(mount_dev(MOUNTINFO, Path::new("/")), Some((8, 1)));
        assert_eq!(mount_dev(MOUNTINFO, Path::new("/tmp")), None);
        assert_eq!(mount_dev(b"", Path::new("/")), None);
        assert_eq!(
            mount_dev(b"1 2 x:y / /q rw - fuse s rw\n", Path::new("/q")),
            None
        );
    }

    #[test]
    fn connection_name_is_the_kernel_dev_t() {
        assert_eq!(connection_name(0, 61), "61");
        assert_eq!(connection_name(0, 1_048_575), "1048575");
        assert_eq!(connection_name(1, 2), "1048578");
    }

    #[test]
    fn parse_state_reads_the_letter_after_the_last_paren() {
        assert_eq!(
            parse_state(b"12 (checkpointfs) S 1 2"),
            Some(DaemonState::Running)
        );
        assert_eq!(parse_state(b"12 (a) b) T 1 2"), Some(DaemonState::Stopped));
        assert_eq!(parse_state(b"12 (x) t 1"), Some(DaemonState::Stopped));
        assert_eq!(parse_state(b"12 (x) Z 1"), Some(DaemonState::Dying));
        assert_eq!(parse_state(b"12 (x) D 1"), Some(DaemonState::Running));
        assert_eq!(parse_state(b"12 (x)"), None);
        assert_eq!(parse_state(b"garbage"), None);
    }

    #[test]
    fn should_abort_when_dying_at_once_and_when_stopped_past_the_bound() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(10);
        assert_eq!(
            should_abort(DaemonState::Running, None, t0, bound),
            (false, None)
        );
        assert_eq!(
            should_abort(DaemonState::Dying, None, t0, bound),
            (true, None)
        );
        let (abort, since) = should_abort(DaemonState::Stopped, None, t0, bound);
        assert_eq!((abort, since), (false, Some(t0)));
        let t9 = t0 + Duration::from_secs(9);
        assert_eq!(
            should_abort(DaemonState::Stopped, since, t9, bound),
            (false, Some(t0))
        );
        let t10 = t0 + bound;
        assert_eq!(
            should_abort(DaemonState::Stopped, since, t10, bound),
            (true, Some(t0))
        );
        // Continued in between: the clock starts again.
        assert_eq!(
            should_abort(DaemonState::Running, since, t9, bound),
            (false, None)
        );
    }
}
