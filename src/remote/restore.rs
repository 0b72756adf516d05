//! `checkpointfs restore URL SESSION ID DIR` and `checkpointfs remote log URL`: reading a
//! remote anywhere, with nothing from the machine that pushed it but the key.
//!
//! A restore downloads only the trees and chunks the checkpoint names, verifies each
//! (authenticated decryption bound to the object's name, then its keyed hash), and writes
//! beneath DIR through fds (openat/mkdirat/symlinkat relative to the directory being
//! filled, never following a symlink it made). A file is written under a temporary name and
//! renamed into place once all its chunks verified, so a damaged object leaves no file
//! written from it; the error names the object and the path.
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::format::{self, Content, Entry, Manifest, SessionInfo, Tree};
use super::repo::Repo;
use crate::transcript::record::EntryKind;

/// What a restore did.
#[derive(Debug, Default)]
pub struct RestoreReport {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    /// Paths whose set-id bits were not restored (see docs/remote-format.md).
    pub setid_dropped: Vec<String>,
    /// Special files (fifos, sockets, devices) not recreated.
    pub skipped_special: Vec<String>,
}

/// A session as `remote log` lists it.
#[derive(Debug)]
pub struct SessionLog {
    pub info: SessionInfo,
    pub checkpoints: Vec<Manifest>,
}

/// Every session in the remote readable with the repository's key, or only `only`, with
/// their checkpoints oldest first.
pub fn log(repo: &Repo, only: Option<&str>) -> io::Result<Vec<SessionLog>> {
    let mut out = Vec::new();
    for id in repo.list_dir("sessions")? {
        if only.is_some_and(|s| s != id) {
            continue;
        }
        out.push(session_log(repo, &id)?);
    }
    if let Some(s) = only
        && out.is_empty()
    {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no session {s} in {} for this key", repo.url()),
        ));
    }
    Ok(out)
}

fn session_log(repo: &Repo, id: &str) -> io::Result<SessionLog> {
    let dir = format::session_dir(id);
    let info: SessionInfo = repo.get_json(&format!("{dir}/info"))?;
    let mut checkpoints = Vec::new();
    for n in repo.list_dir(&format!("{dir}/checkpoints"))? {
        let m: Manifest = repo.get_json(&format!("{dir}/checkpoints/{n}"))?;
        if m.mount_id != id
            || format::manifest_name(id, m.index) != format!("{dir}/checkpoints/{n}")
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "remote object {dir}/checkpoints/{n} describes another checkpoint ({} {})",
                    m.mount_id, m.index
                ),
            ));
        }
        checkpoints.push(m);
    }
    checkpoints.sort_by_key(|m| m.index);
    Ok(SessionLog { info, checkpoints })
}

/// The manifest of checkpoint `id` of `session`.
pub fn find(repo: &Repo, session: &str, id: &str) -> io::Result<Manifest> {
    let s = session_log(repo, session).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no session {session} in {} for this key (`checkpointfs remote log URL` lists them)", repo.url()),
            )
        } else {
            e
        }
    })?;
    // The newest of that id (an id is unique among kept checkpoints; gc may free one).
    s.checkpoints
        .into_iter()
        .rev()
        .find(|m| m.id == id)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("session {session} has no checkpoint {id} in {}", repo.url()),
            )
        })
}

fn cstr(name: &[u8]) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a name holds a NUL byte"))
}

/// Materialises `manifest` into `dir`, which must be empty (made when missing).
pub fn restore(repo: &Repo, manifest: &Manifest, dir: &Path) -> io::Result<RestoreReport> {
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if std::fs::read_dir(dir)?.next().is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is not empty: a restore goes into an empty directory",
                        dir.display()
                    ),
                ));
            }
        }
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot create {}: {e}", dir.display()),
            ));
        }
    }
    let root = File::open(dir)?;
    let mut report = RestoreReport::default();
    let Content::Dir { tree } = &manifest.root.content else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the manifest's root is not a directory",
        ));
    };
    restore_tree(repo, root.as_fd(), "", tree, &mut report)?;
    apply_meta(root.as_fd(), None, &manifest.root, "", &mut report)?;
    Ok(report)
}

fn restore_tree(
    repo: &Repo,
    dirfd: std::os::fd::BorrowedFd<'_>,
    rel: &str,
    tree: &str,
    report: &mut RestoreReport,
) -> io::Result<()> {
    let plain = repo.get_data(format::DOMAIN_TREE, tree)?;
    let tree: Tree = serde_json::from_slice(&plain).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("tree {tree} of {rel:?}: not a valid tree ({e})"),
        )
    })?;
    for e in &tree.entries {
        let name = e
            .name_bytes()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidData, m))?;
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "tree of {rel:?} names an entry {:?}, which no directory can hold",
                    String::from_utf8_lossy(&name)
                ),
            ));
        }
        let path = if rel.is_empty() {
            String::from_utf8_lossy(&name).into_owned()
        } else {
            format!("{rel}/{}", String::from_utf8_lossy(&name))
        };
        let c = cstr(&name)?;
        let with_path = |err: io::Error| io::Error::new(err.kind(), format!("{path}: {err}"));
        match (&e.kind, &e.content) {
            (EntryKind::Dir, Content::Dir { tree }) => {
                // SAFETY: `c` is a valid C string and `dirfd` an open directory.
                if unsafe { libc::mkdirat(dirfd.as_raw_fd(), c.as_ptr(), 0o700) } != 0 {
                    return Err(with_path(io::Error::last_os_error()));
                }
                let sub = openat(
                    dirfd,
                    &c,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                )
                .map_err(with_path)?;
                restore_tree(repo, sub.as_fd(), &path, tree, report)?;
                apply_meta(sub.as_fd(), None, e, &path, report).map_err(with_path)?;
                report.dirs += 1;
            }
            (EntryKind::File, Content::File { chunks }) => {
                restore_file(repo, dirfd, &c, &path, e, chunks, report)?;
                report.files += 1;
                report.bytes += e.size;
            }
            (EntryKind::Symlink, Content::Symlink { target }) => {
                let t = base16ct::mixed::decode_vec(target).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{path}: bad symlink target"),
                    )
                })?;
                let t = cstr(&t)?;
                // SAFETY: valid C strings, open directory fd.
                if unsafe { libc::symlinkat(t.as_ptr(), dirfd.as_raw_fd(), c.as_ptr()) } != 0 {
                    return Err(with_path(io::Error::last_os_error()));
                }
                apply_meta(dirfd, Some(&c), e, &path, report).map_err(with_path)?;
                report.symlinks += 1;
            }
            (EntryKind::Dir | EntryKind::File | EntryKind::Symlink, _) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{path}: the tree's entry holds content of another kind"),
                ));
            }
            _ => report.skipped_special.push(path),
        }
    }
    Ok(())
}

fn openat(
    dirfd: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: i32,
) -> io::Result<OwnedFd> {
    // SAFETY: valid C string and directory fd; the result is checked and owned below.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes a file's chunks into a temporary name, each verified before it is written, and
/// renames it into place; on any error the temporary file is removed.
fn restore_file(
    repo: &Repo,
    dirfd: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::CStr,
    path: &str,
    e: &Entry,
    chunks: &[format::Chunk],
    report: &mut RestoreReport,
) -> io::Result<()> {
    let tmp = cstr(format!(".checkpointfs-restore-{}", std::process::id()).as_bytes())?;
    let fd = openat(
        dirfd,
        &tmp,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
    )
    .map_err(|err| io::Error::new(err.kind(), format!("{path}: {err}")))?;
    let mut f = File::from(fd);
    let written = (|| -> io::Result<()> {
        let mut offset = 0u64;
        for c in chunks {
            if let Some(n) = &c.name {
                let data = repo.get_data(format::DOMAIN_CHUNK, n)?;
                if data.len() as u64 != c.len {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "remote content {n} has {} bytes where its tree says {}",
                            data.len(),
                            c.len
                        ),
                    ));
                }
                std::os::unix::fs::FileExt::write_all_at(&f, &data, offset)?;
            }
            offset += c.len;
        }
        if offset != e.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "its chunks hold {offset} bytes where its entry says {}",
                    e.size
                ),
            ));
        }
        // Trailing zero chunks are a hole: the length is set, nothing written.
        f.set_len(offset)?;
        f.flush()?;
        apply_meta(f.as_fd(), None, e, path, report)?;
        // SAFETY: valid C strings and directory fd.
        if unsafe {
            libc::renameat(
                dirfd.as_raw_fd(),
                tmp.as_ptr(),
                dirfd.as_raw_fd(),
                name.as_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })();
    if let Err(err) = written {
        // SAFETY: valid C string and directory fd.
        unsafe { libc::unlinkat(dirfd.as_raw_fd(), tmp.as_ptr(), 0) };
        return Err(io::Error::new(
            err.kind(),
            format!("{path}: {err}; nothing was written for it"),
        ));
    }
    Ok(())
}

/// Owner (as root), mode and mtime of `e` on `fd` (or on `name` in directory `fd`, for a
/// symlink: no mode, no follow). Set-id bits are dropped and listed: the remote's
/// authentication is the repository key, which every mount sharing the bucket holds, so it
/// cannot vouch for a set-id mode the way the local record key does.
fn apply_meta(
    fd: std::os::fd::BorrowedFd<'_>,
    name: Option<&std::ffi::CStr>,
    e: &Entry,
    path: &str,
    report: &mut RestoreReport,
) -> io::Result<()> {
    let (target, flags) = match name {
        Some(n) => (n.as_ptr(), libc::AT_SYMLINK_NOFOLLOW),
        None => (c"".as_ptr(), libc::AT_EMPTY_PATH),
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: valid fd and C string.
        if unsafe { libc::fchownat(fd.as_raw_fd(), target, e.uid, e.gid, flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if name.is_none() {
        let mut mode = e.mode & 0o7777;
        if mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            mode &= !(libc::S_ISUID | libc::S_ISGID);
            report.setid_dropped.push(if path.is_empty() {
                ".".into()
            } else {
                path.to_string()
            });
        }
        // SAFETY: valid fd.
        if unsafe { libc::fchmod(fd.as_raw_fd(), mode) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: e.mtime_sec,
            tv_nsec: e.mtime_nsec as i64,
        },
    ];
    let set = match name {
        // SAFETY: valid fd, C string and a two-element array.
        Some(_) => unsafe { libc::utimensat(fd.as_raw_fd(), target, times.as_ptr(), flags) },
        // SAFETY: valid fd and a two-element array.
        None => unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) },
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
