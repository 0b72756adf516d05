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
    /// Use FUSE over io_uring where the kernel offers it (not `--no-io-uring`).
    pub io_uring: bool,
    /// The hidden `--test-park-ring-requests` (see `transport::session::SessionConfig`).
    pub test_park: bool,
    pub allow_other: bool,
    /// As root, mount for this normal user (`--owner`): the kernel lets only that user's
    /// processes use the mount, and the control socket is theirs.
    pub owner: Option<crate::sys::UserIds>,
    pub exclusions: crate::history::exclusions::ExclusionConfig,
    /// `--other-users-budget` as given or saved; `None`: the default, not saved.
    pub other_users_budget: Option<crate::history::budget::OthersBudget>,
    pub options: crate::mount::options::MountOptions,
    pub durability: crate::state::durability::Durability,
    /// Where checkpoints are pushed (`--remote`, or saved), if anywhere.
    pub remote: Option<crate::history::settings::RemoteSetting>,
}

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use log::{info, warn};

use crate::fs::{FsConfig, PassthroughFs};
use crate::history::{CONTROL_DIR_NAME, HistoryConfig, open_history};
use crate::transport::adapter::FuseAdapter;
use crate::transport::session::SessionConfig;

/// Mounts `cfg.source` at `cfg.mountpoint` and serves until the mount is unmounted from
/// outside (`umount MNT`) or SIGINT/SIGTERM arrives; then flushes history and transcript.
/// Calls `on_ready` exactly once, after the mount is live. Creates threads: call it only
/// after any fork.
pub fn serve(cfg: DaemonConfig, on_ready: Box<dyn FnOnce() + Send>) -> io::Result<()> {
    // Signals go to one thread that turns them into an unmount; block them everywhere else
    // (the mask is inherited by every thread spawned from here on).
    let signals = block_termination_signals()?;
    raise_fd_limit();
    // Held until this function returns: no gc of the state dir, or second daemon, meanwhile.
    let _state_lock = crate::state::lock::StateLock::acquire(&cfg.state_dir)?;
    // The kernel has applied the caller's umask to every mode it sends; ours must not be
    // applied a second time.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0) };
    crate::state::dir::secure(&cfg.state_dir)?;
    if cfg.owner.is_some() {
        // The owner reaches the control socket in it, and nothing else: every file in it is
        // 0600 root's, and the directory is not writable to them.
        crate::state::dir::let_others_reach_the_socket(&cfg.state_dir)?;
    }
    crate::state::dir::write_file(
        &cfg.state_dir,
        "source",
        format!("{}\n", cfg.source.display()).as_bytes(),
    )?;

    let (root, atime_change) = crate::mount::options::open_source_root(&cfg.source, &cfg.options)?;
    info!(
        "mount options: {}{}",
        cfg.options.to_list(),
        match atime_change {
            Some(c) => format!(
                " (SRC opened from a private clone of its mount with mount attributes set \
                 {:#x}, cleared {:#x}: store reflinks from it fall back to copies)",
                c.attr_set, c.attr_clr
            ),
            None => String::new(),
        }
    );
    if cfg
        .source
        .join(std::ffi::OsStr::from_bytes(CONTROL_DIR_NAME))
        .symlink_metadata()
        .is_ok()
    {
        warn!(
            "{}/.checkpoint exists in the source; it is hidden under the mount by the control directory",
            cfg.source.display()
        );
    }
    let history = open_history(HistoryConfig {
        source: cfg.source.clone(),
        // The history reads SRC (backups) beneath the same root, so under the same atime
        // rules as the requests.
        root: Some(root.try_clone()?),
        state_dir: cfg.state_dir.clone(),
        exclusions: cfg.exclusions.clone(),
        durability: cfg.durability,
    })?;
    // Saved once the history is known to be readable: a state dir refused for a corrupt
    // transcript keeps its settings. (An error names the file and keeps its errno.)
    crate::history::settings::save(
        &cfg.state_dir,
        &crate::history::settings::Settings {
            exclusions: cfg.exclusions.clone(),
            other_users_budget: cfg.other_users_budget,
            remote: cfg.remote.clone(),
        },
    )?;
    // The owner: the `--owner` user, else whoever mounted (this daemon's user).
    // SAFETY: geteuid has no preconditions.
    let owner_uid = cfg
        .owner
        .map_or_else(|| unsafe { libc::geteuid() }, |o| o.uid);
    let budget = cfg.other_users_budget.unwrap_or_default();
    history.budgets().configure(owner_uid, budget);
    info!("other users' budget: {budget} (ctl lines, state bytes; owner uid {owner_uid})");
    // So that gc can run even once the state dir's disk is full (see state::reserve).
    crate::state::reserve::renew(
        &cfg.state_dir,
        std::fs::metadata(cfg.state_dir.join("transcript.jsonl")).map_or(0, |m| m.len()),
    );
    info!("exclusions: {}", history.exclusions().summary());
    let copier = {
        let h = history.clone();
        std::thread::Builder::new()
            .name("copier".into())
            .spawn(move || h.run_copier())?
    };
    let syncer = match cfg.durability {
        crate::state::durability::Durability::Batched => {
            let h = history.clone();
            Some(
                std::thread::Builder::new()
                    .name("syncer".into())
                    .spawn(move || h.run_syncer())?,
            )
        }
        _ => None,
    };
    let fs = Arc::new(PassthroughFs::new(
        root,
        history.clone(),
        FsConfig {
            passthrough: cfg.passthrough,
            state_dir: cfg.state_dir.clone(),
            mountpoint: cfg.mountpoint.clone(),
            options: crate::fs::MountFacts {
                list: cfg.options.to_list(),
                read_only: cfg.options.read_only,
                strict_atime: cfg.options.atime == crate::mount::options::Atime::Strict,
            },
            owner: cfg.owner,
        },
    )?);
    // The push worker starts before the mount is live: a key that cannot be read or made
    // refuses the mount, while a remote that cannot be reached is only a lag in `status`.
    let remote = Arc::new(crate::mount::remote::RemoteControl::new(history.clone()));
    if let Some(setting) = &cfg.remote {
        remote.start(setting)?;
    }
    let control =
        crate::mount::control_socket::start_server(fs.clone(), &cfg.state_dir, remote.clone())?;

    // A mount for an owner serves requests from that user, not from us: the kernel already
    // admits only the owner's processes (`user_id`/`group_id` of the mount).
    let session_cfg = SessionConfig {
        threads: cfg.threads.max(1),
        owner_only: !(cfg.allow_other || cfg.owner.is_some()),
        io_uring: cfg.io_uring,
        test_park: cfg.test_park,
        on_fatal: Arc::new({
            let mountpoint = cfg.mountpoint.clone();
            move |why: &str| end_connection(why, &mountpoint)
        }),
    };
    let notifier_slot = fs.notifier_slot();
    // As root, mount ourselves so the type reads `fuse.checkpointfs`; a normal user cannot
    // mount(2) and may not even open /dev/fuse, so the setuid fusermount3 mounts for it.
    // SAFETY: geteuid has no preconditions.
    let dev = if unsafe { libc::geteuid() } == 0 {
        mount_fuse(&cfg)?
    } else {
        crate::mount::fusermount::mount(
            &cfg.source,
            &cfg.mountpoint,
            cfg.allow_other,
            &cfg.options,
        )?
    };
    // The device number the kernel gave this mount, read before any request is served:
    // a rewind checks its root against it, never against a path alone.
    match std::fs::read("/proc/self/mountinfo")
        .ok()
        .and_then(|info| crate::mount::watchdog::mount_dev(&info, &cfg.mountpoint))
    {
        Some(dev) => fs.set_mount_dev(dev),
        None => warn!(
            "{} is not in /proc/self/mountinfo after mounting: rewinds will be refused",
            cfg.mountpoint.display()
        ),
    }
    let dev = Arc::new(dev);
    let adapter = Arc::new(FuseAdapter::new(fs.clone(), dev.clone()));
    let _ = notifier_slot.set(Box::new(crate::transport::dev::Notifier::new(dev.clone())));
    info!(
        "mounted {} at {} (state {}, {} threads, durability {})",
        cfg.source.display(),
        cfg.mountpoint.display(),
        cfg.state_dir.display(),
        cfg.threads,
        cfg.durability.name()
    );
    // Dropping the handle neither kills nor waits for it: it exits after this process.
    let _watchdog = match crate::mount::watchdog::start(&cfg.mountpoint) {
        Ok(child) => Some(child),
        Err(e) => {
            warn!(
                "no watchdog for this mount ({e}): if this daemon is killed during a rewind or stays stopped, its callers wait until the connection is aborted by hand"
            );
            None
        }
    };
    let mountpoint = cfg.mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || wait_for_signal_then_unmount(signals, &mountpoint))?;
    on_ready();

    let served = crate::transport::session::run(adapter, dev, session_cfg);
    // If the session ended on an error (not an unmount), do not leave a dead mount behind.
    if served.is_err() {
        let _ = lazy_unmount(&cfg.mountpoint);
    }
    let fds = fs.fd_stats();
    info!(
        "unmounted; flushing history (inode fd cache: {} of {} O_PATH fds held, {} given back, \
         {} reopened by {})",
        fds.open,
        fds.budget,
        fds.evictions,
        fds.reopens,
        if fds.handles {
            "file handle"
        } else {
            "parent and name"
        }
    );
    control.stop();
    remote.stop();
    history.shutdown()?;
    if copier.join().is_err() {
        warn!("the background copier panicked; pending copies are redone at the next mount");
    }
    if let Some(syncer) = syncer {
        syncer.thread().unpark();
        if syncer.join().is_err() {
            warn!("the syncer thread panicked; the final sync below still runs");
        }
    }
    history.shutdown()?;
    info!("{}", history.layer1_stats());
    served
}

/// A ring queue failed while the connection is on the ring: its CPU's callers would wait
/// for good. The mount is detached and the process exits, which closes every /dev/fuse fd
/// and so aborts the connection: every waiting caller gets ENOTCONN. (If a thread of ours is
/// stuck on our own mount and the exit cannot finish, the watchdog aborts the connection.)
/// The history needs no flush: what it has recorded is on disk per its durability, and
/// pending copies are redone at the next mount.
fn end_connection(why: &str, mountpoint: &std::path::Path) {
    log::error!("{why}; ending the FUSE connection (the daemon exits)");
    if let Err(e) = lazy_unmount(mountpoint) {
        warn!("detaching {} failed: {e}", mountpoint.display());
    }
    std::process::exit(70);
}

/// Opens /dev/fuse and mounts it at the mount point as `fuse.checkpointfs`, with
/// `default_permissions` (the kernel checks permissions as on the underlying filesystem)
/// and the flags of `cfg.options` (ro, nodev, nosuid, noexec, atime).
fn mount_fuse(cfg: &DaemonConfig) -> io::Result<OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| crate::sys::context("cannot open /dev/fuse", e))?;
    let dev = OwnedFd::from(dev);
    let root_mode = std::fs::metadata(&cfg.source)?.mode() & libc::S_IFMT;
    let owner = cfg.owner.unwrap_or(crate::sys::UserIds { uid: 0, gid: 0 });
    let mut opts = format!(
        "fd={},rootmode={:o},user_id={},group_id={},default_permissions",
        std::os::fd::AsRawFd::as_raw_fd(&dev),
        root_mode,
        owner.uid,
        owner.gid
    );
    if cfg.allow_other {
        opts.push_str(",allow_other");
    }
    let c = |s: &[u8]| {
        std::ffi::CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    };
    let source = c(cfg.source.as_os_str().as_bytes())?;
    let target = c(cfg.mountpoint.as_os_str().as_bytes())?;
    let fstype = c(b"fuse.checkpointfs")?;
    let data = c(opts.as_bytes())?;
    // SAFETY: valid C strings.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            cfg.options.ms_flags(),
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(crate::sys::context(
            format!("mount of {} failed", cfg.mountpoint.display()),
            e,
        ));
    }
    Ok(dev)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit, as libfuse's passthrough_hp
/// (`maximize_fd_limit`) does: the daemon holds an fd per open handle and caches O_PATH fds
/// of inodes the kernel knows (bounded by a budget derived from this limit, see
/// [`crate::fs::inodes`]). Failure is not fatal: the cache then works within the lower limit.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        warn!(
            "cannot read RLIMIT_NOFILE: {}; keeping the inherited limit",
            io::Error::last_os_error()
        );
        return;
    }
    let before = lim.rlim_cur;
    if before >= lim.rlim_max {
        info!("file descriptor limit: {before} (already the hard limit)");
        return;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit; raising the soft limit up to the hard one needs no
    // privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        warn!(
            "cannot raise the file descriptor limit from {before} to {}: {}; keeping {before}",
            lim.rlim_max,
            io::Error::last_os_error()
        );
        return;
    }
    info!(
        "file descriptor limit raised from {before} to {} (the hard limit)",
        lim.rlim_max
    );
}

fn block_termination_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset manipulation on a local, then pthread_sigmask on the calling thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

/// Lazily unmounts on the first termination signal: the session loop then ends on its own
/// and `serve` flushes everything, exactly as after an external `umount`.
fn wait_for_signal_then_unmount(set: libc::sigset_t, mountpoint: &std::path::Path) {
    let mut sig = 0;
    // SAFETY: `set` is a valid signal set; sig is writable.
    let rc = unsafe { libc::sigwait(&set, &mut sig) };
    if rc != 0 {
        warn!("sigwait failed: {}", io::Error::from_raw_os_error(rc));
        return;
    }
    info!("signal {sig}: unmounting {}", mountpoint.display());
    if let Err(e) = lazy_unmount(mountpoint) {
        warn!(
            "unmounting {} after signal {sig} failed: {e}",
            mountpoint.display()
        );
    }
}

/// Detaches the mount (EINVAL: it is not mounted any more, which is fine). As non-root,
/// fusermount3 does it for us.
fn lazy_unmount(mountpoint: &std::path::Path) -> io::Result<()> {
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(()),
        Some(libc::EPERM) => std::process::Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(mountpoint)
            .status()
            .map(|_| ()),
        _ => Err(e),
    }
}
