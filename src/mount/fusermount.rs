//! Mounting as a normal user through the setuid `fusermount3` helper.
//!
//! Where `/dev/fuse` is root-only (mode 0600, as on many hardened machines), a normal user
//! cannot open it, but the setuid `fusermount3` can: it opens the device, mounts it at a
//! directory the user owns, and hands the open device back over a unix socket (the
//! `_FUSE_COMMFD` protocol libfuse uses). fuser 0.18 opens `/dev/fuse` itself first and
//! gives up on EACCES, so the daemon speaks the protocol here and passes the device to
//! `fuser::Session::from_fd`.
//!
//! Contract: on success the mount is live at `mountpoint`, owned by the caller, with
//! `default_permissions` (the kernel checks permissions as on SRC) and, when asked,
//! `allow_other` (which fusermount3 allows only with `user_allow_other` in /etc/fuse.conf).
//! The helper has exited by then; unmounting is `fusermount3 -u`, as for any user mount.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::mount::options::MountOptions;

/// The helper's name, looked up on PATH; `FUSERMOUNT_PATH` overrides it, as for libfuse.
fn helper() -> std::ffi::OsString {
    std::env::var_os("FUSERMOUNT_PATH").unwrap_or_else(|| "fusermount3".into())
}

/// `value` escaped for fusermount's `-o` list, where `,` separates options and `\` escapes
/// (libfuse's `fuse_opt_add_opt_escaped`): a source path with a comma stays one option.
fn escape_option(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c == ',' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The `-o` list for a mount of `source`: named `fuse.checkpointfs` in /proc/mounts like a
/// mount made as root, permissions checked by the kernel.
fn options(source: &Path, allow_other: bool, mount: &MountOptions) -> String {
    let mut opts = format!(
        "fsname={},subtype=checkpointfs,default_permissions",
        escape_option(&source.to_string_lossy())
    );
    if allow_other {
        opts.push_str(",allow_other");
    }
    for o in mount.fusermount_options() {
        opts.push(',');
        opts.push_str(o);
    }
    opts
}

/// Mounts through fusermount3 and returns the open `/dev/fuse` for the session.
pub fn mount(
    source: &Path,
    mountpoint: &Path,
    allow_other: bool,
    mount_options: &MountOptions,
) -> io::Result<OwnedFd> {
    check_device_access()?;
    let (ours, theirs) = socketpair()?;
    let theirs_raw = theirs.as_raw_fd();
    let mut cmd = Command::new(helper());
    cmd.arg("-o")
        .arg(options(source, allow_other, mount_options))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs_raw.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // The helper must inherit its end of the socket: clear close-on-exec in the child only.
    // SAFETY: the closure runs between fork and exec and only calls fcntl, which is
    // async-signal-safe; `theirs_raw` stays open in the parent until after spawn.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::fcntl(theirs_raw, libc::F_SETFD, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot run {} to mount as a normal user: {e} (install fuse3, or mount as root)",
                helper().to_string_lossy()
            ),
        )
    })?;
    // Our copy of the helper's end must go, or a helper that dies without sending would
    // leave recvmsg waiting for ever instead of seeing EOF.
    drop(theirs);
    let received = receive_fd(&ours);
    let output = child.wait_with_output()?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let why = match stderr.trim() {
            "" => format!("it exited with {}", output.status),
            text => text.to_string(),
        };
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "fusermount3 could not mount {}: {why}",
                mountpoint.display()
            ),
        ));
    }
    match received {
        Ok(Some(dev)) => Ok(dev),
        Ok(None) => Err(io::Error::other(format!(
            "fusermount3 exited without handing over the FUSE device for {}",
            mountpoint.display()
        ))),
        Err(e) => Err(crate::sys::context(
            "receiving the FUSE device from fusermount3",
            e,
        )),
    }
}

/// fusermount3 opens `/dev/fuse` with the calling user's permissions (it drops to the
/// user's fsuid first), so a root-only device means no normal user can mount FUSE at all.
/// Say so, and what to do, instead of passing on the helper's bare EACCES.
fn check_device_access() -> io::Result<()> {
    const DEVICE: &std::ffi::CStr = c"/dev/fuse";
    // SAFETY: `DEVICE` is a NUL-terminated string that lives for the call.
    if unsafe { libc::access(DEVICE.as_ptr(), libc::R_OK | libc::W_OK) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    let why = match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            "/dev/fuse is not readable and writable by you (fusermount3 opens it as you, so \
             no normal user can mount FUSE here); ask root to make it mode 0666, the usual \
             default (udev: KERNEL==\"fuse\", MODE=\"0666\"), or have root mount with \
             --allow-other"
                .to_string()
        }
        Some(libc::ENOENT) => "/dev/fuse does not exist (is the fuse module loaded? \
                               `modprobe fuse`)"
            .to_string(),
        _ => format!("/dev/fuse: {e}"),
    };
    Err(io::Error::new(
        e.kind(),
        format!("cannot mount as a normal user: {why}"),
    ))
}

fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a writable array of two ints, as socketpair requires.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair succeeded, so both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads one message from the helper and takes the fd it carries (SCM_RIGHTS). `None`: the
/// helper closed the socket without sending one (it failed; its stderr says why).
fn receive_fd(sock: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // Room for one fd, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header, filled in below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `sock` is open; `msg` points at `iov` and `control`, which outlive the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    if n == 0 {
        return Ok(None);
    }
    // SAFETY: `msg` was filled by a successful recvmsg, so the CMSG macros walk a valid
    // control buffer of `msg_controllen` bytes.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is non-null and points into `control` (see above).
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: an SCM_RIGHTS message carries at least one int; CMSG_DATA points at it,
            // possibly unaligned, hence the unaligned read.
            let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()) };
            if fd >= 0 {
                // SAFETY: the kernel installed this fd in our table for us; nothing else owns it.
                return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        // SAFETY: as above, CMSG_NXTHDR stays within the control buffer or returns null.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_and_backslashes_in_the_source_are_escaped() {
        let d = MountOptions::default();
        assert_eq!(
            options(Path::new("/home/a,b\\c"), false, &d),
            "fsname=/home/a\\,b\\\\c,subtype=checkpointfs,default_permissions,rw,nodev,nosuid,exec"
        );
        assert!(options(Path::new("/p"), true, &d).contains(",allow_other,"));
        let ro = MountOptions::parse(&["ro,noexec"]).unwrap();
        assert!(options(Path::new("/p"), false, &ro).ends_with(",ro,nodev,nosuid,noexec"));
    }
}
