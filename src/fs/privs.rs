//! Clearing setuid/setgid on the kernel's behalf (`FUSE_HANDLE_KILLPRIV_V2`).
//!
//! Why we negotiate it: without it the kernel cannot mark FUSE inodes `S_NOSEC`, so every
//! `write(2)` first asks the daemon for `security.capability` (one synchronous GETXATTR
//! round trip per write syscall — half the throughput of 4 KiB writes). With it the kernel
//! leaves the clearing of setuid/setgid to us, and the backing filesystem cannot do it for
//! us because the daemon (root, `CAP_FSETID`) performs the operations. So we apply the VFS
//! rules (`setattr_should_drop_suidgid` / `setattr_should_drop_sgid` in fs/attr.c) with the
//! *caller's* privileges, at the three places the kernel tells us about:
//!
//! - a SETATTR with nothing to set: the kernel's `file_remove_privs` before a write by a
//!   caller that must drop privileges. It is the only notice we get of a kernel-passthrough
//!   write, which never reaches the daemon;
//! - a SETATTR that changes the size (truncate, `O_TRUNC` — we do not negotiate
//!   `FUSE_ATOMIC_O_TRUNC`, so opens with `O_TRUNC` arrive as a size change);
//! - a daemon-served WRITE carrying `FUSE_WRITE_KILL_SUIDGID`.
//!
//! fuser does not pass on `FATTR_KILL_SUIDGID`, hence we decide "caller lacks `CAP_FSETID`"
//! ourselves from `/proc/<pid>/status`. That is read only when the file actually carries a
//! setuid or setgid bit, so the common path costs one `fstat` at most.
//!
//! Chown needs one case only: the backing filesystem already clears setuid, and setgid with
//! group-execute, on any chown; what the daemon's privilege hides is the setgid without
//! group-execute that an unprivileged caller outside the file's group must lose.
use std::fs;

use crate::history::Caller;

const CAP_FSETID: u32 = 4;

/// What the kernel would have consulted about the calling process.
#[derive(Debug, PartialEq, Eq)]
pub struct Privilege {
    has_fsetid: bool,
    fsgid: u32,
    groups: Vec<u32>,
}

impl Privilege {
    /// The caller's privilege, from `/proc/<pid>/status` (FUSE gives pids in the daemon's
    /// pid namespace). If the process is gone, judge by its uid/gid alone: root is
    /// privileged, anyone else is only in their primary group.
    pub fn of(caller: &Caller) -> Privilege {
        fs::read_to_string(format!("/proc/{}/status", caller.pid))
            .ok()
            .and_then(|text| Privilege::parse_status(&text))
            .unwrap_or(Privilege {
                has_fsetid: caller.uid == 0,
                fsgid: caller.gid,
                groups: Vec::new(),
            })
    }

    fn parse_status(text: &str) -> Option<Privilege> {
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let cap_eff = u64::from_str_radix(field("CapEff")?, 16).ok()?;
        // "Gid:" lists real, effective, saved and filesystem gid; the kernel checks the last.
        let fsgid = field("Gid")?.split_whitespace().nth(3)?.parse().ok()?;
        let groups = field("Groups")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        Some(Privilege {
            has_fsetid: cap_eff & (1 << CAP_FSETID) != 0,
            fsgid,
            groups,
        })
    }

    fn in_group_or_capable(&self, gid: u32) -> bool {
        self.has_fsetid || self.fsgid == gid || self.groups.contains(&gid)
    }
}

/// Whether a file with this mode could lose a bit at all (the cheap pre-check).
pub fn has_suidgid(mode: u32) -> bool {
    mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

/// `setattr_should_drop_sgid`: the setgid bit to clear (0 or `S_ISGID`).
fn sgid_to_drop(mode: u32, file_gid: u32, caller: &Privilege) -> u32 {
    if mode & libc::S_ISGID == 0 {
        0
    } else if mode & libc::S_IXGRP != 0 || !caller.in_group_or_capable(file_gid) {
        libc::S_ISGID
    } else {
        0
    }
}

/// The bits a write or truncate by `caller` clears (`setattr_should_drop_suidgid`).
pub fn to_drop_on_write(mode: u32, file_gid: u32, caller: &Privilege) -> u32 {
    let kill = (mode & libc::S_ISUID) | sgid_to_drop(mode, file_gid, caller);
    let regular = mode & libc::S_IFMT == libc::S_IFREG;
    if kill != 0 && regular && !caller.has_fsetid {
        kill
    } else {
        0
    }
}

/// The bit setting an access ACL by `caller` clears (`posix_acl_update_mode`): setgid,
/// on any file type, unless the caller is in the file's group or has `CAP_FSETID`. SRC's
/// filesystem judges the daemon instead, and fuser cannot negotiate `FUSE_SETXATTR_EXT`,
/// the kernel's way of passing `FUSE_SETXATTR_ACL_KILL_SGID` on.
pub fn to_drop_on_acl(mode: u32, file_gid: u32, caller: &Privilege) -> u32 {
    if mode & libc::S_ISGID != 0 && !caller.in_group_or_capable(file_gid) {
        libc::S_ISGID
    } else {
        0
    }
}

/// The bits a chown by `caller` clears that a chown by the daemon would keep.
pub fn to_drop_on_chown(mode: u32, file_gid: u32, caller: &Privilege) -> u32 {
    let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
    let sgid_without_exec = mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID;
    if !is_dir && sgid_without_exec {
        sgid_to_drop(mode, file_gid, caller)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REG: u32 = libc::S_IFREG;

    fn user(groups: &[u32]) -> Privilege {
        Privilege {
            has_fsetid: false,
            fsgid: 1000,
            groups: groups.to_vec(),
        }
    }

    fn root() -> Privilege {
        Privilege {
            has_fsetid: true,
            fsgid: 0,
            groups: Vec::new(),
        }
    }

    #[test]
    fn parses_proc_status() {
        let text = "Name:\tsh\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t101\n\
                    Groups:\t4 27 100 \nCapEff:\t0000000000000010\n";
        assert_eq!(
            Privilege::parse_status(text),
            Some(Privilege {
                has_fsetid: true,
                fsgid: 101,
                groups: vec![4, 27, 100],
            })
        );
        let no_groups = "Gid:\t0\t0\t0\t0\nGroups:\t\nCapEff:\t0000000000000000\n";
        assert_eq!(
            Privilege::parse_status(no_groups),
            Some(Privilege {
                has_fsetid: false,
                fsgid: 0,
                groups: vec![],
            })
        );
        assert_eq!(Privilege::parse_status("Gid:\t0\t0\t0\t0\n"), None);
        assert_eq!(
            Privilege::parse_status("Gid:\t0\nGroups:\t\nCapEff:\tzz\n"),
            None
        );
    }

    #[test]
    fn reads_this_process() {
        let me = Caller::daemon();
        let privilege = Privilege::of(&me);
        // SAFETY: getegid has no preconditions.
        let egid = unsafe { libc::getegid() };
        assert!(privilege.in_group_or_capable(egid));
        let gone = Caller {
            pid: u32::MAX,
            uid: 1000,
            gid: 1000,
        };
        assert_eq!(Privilege::of(&gone), user(&[]));
    }

    #[test]
    fn write_drops_suid_always_and_sgid_with_group_exec() {
        let me = user(&[]);
        assert_eq!(to_drop_on_write(REG | 0o4755, 5, &me), libc::S_ISUID);
        assert_eq!(
            to_drop_on_write(REG | 0o6775, 5, &me),
            libc::S_ISUID | libc::S_ISGID
        );
        assert_eq!(to_drop_on_write(REG | 0o0644, 5, &me), 0);
    }

    #[test]
    fn write_keeps_sgid_without_group_exec_for_group_members() {
        assert_eq!(to_drop_on_write(REG | 0o2664, 7, &user(&[7])), 0);
        assert_eq!(to_drop_on_write(REG | 0o2664, 1000, &user(&[])), 0);
        assert_eq!(to_drop_on_write(REG | 0o2664, 7, &user(&[])), libc::S_ISGID);
    }

    #[test]
    fn privileged_callers_and_non_files_keep_everything() {
        assert_eq!(to_drop_on_write(REG | 0o6777, 5, &root()), 0);
        assert_eq!(to_drop_on_write(libc::S_IFDIR | 0o6777, 5, &user(&[])), 0);
    }

    #[test]
    fn chown_adds_only_sgid_without_group_exec() {
        let me = user(&[]);
        assert_eq!(to_drop_on_chown(REG | 0o2664, 7, &me), libc::S_ISGID);
        assert_eq!(to_drop_on_chown(REG | 0o2664, 7, &user(&[7])), 0);
        assert_eq!(to_drop_on_chown(REG | 0o6775, 7, &me), 0);
        assert_eq!(to_drop_on_chown(libc::S_IFDIR | 0o2664, 7, &me), 0);
        assert_eq!(to_drop_on_chown(REG | 0o2664, 7, &root()), 0);
    }

    #[test]
    fn access_acl_drops_sgid_outside_the_group() {
        let me = user(&[]);
        assert_eq!(to_drop_on_acl(REG | 0o2755, 7, &me), libc::S_ISGID);
        assert_eq!(
            to_drop_on_acl(libc::S_IFDIR | 0o2775, 7, &me),
            libc::S_ISGID
        );
        assert_eq!(to_drop_on_acl(REG | 0o2755, 7, &user(&[7])), 0);
        assert_eq!(to_drop_on_acl(REG | 0o2755, 7, &root()), 0);
        assert_eq!(to_drop_on_acl(REG | 0o4755, 7, &me), 0);
    }

    #[test]
    fn suidgid_precheck() {
        assert!(has_suidgid(REG | 0o4000));
        assert!(has_suidgid(REG | 0o2000));
        assert!(!has_suidgid(REG | 0o1777));
    }
}
