//! The kernel mount options of a checkpointfs mount (`-o ro,noexec,noatime,...`), and how
//! each one is honoured.
//!
//! - `ro`/`rw`, `nodev`/`dev`, `nosuid`/`suid`, `noexec`/`exec`: flags of the FUSE mount
//!   itself (mount(2) flags as root, fusermount3 options as a normal user); the kernel
//!   enforces them (EROFS on writes, EACCES on devices and exec, setuid bits ignored).
//! - `noatime`, `relatime`, `strictatime`, `nodiratime`: the kernel marks FUSE inodes
//!   S_NOATIME, so atime on the mount is whatever the daemon's own accesses to the backing
//!   files do, under the rules of the mount the daemon opened SRC from. To apply other
//!   rules than SRC's mount has, the daemon opens SRC from a private detached clone of that
//!   mount (`open_tree(OPEN_TREE_CLONE)`) whose atime attributes it changes
//!   (`mount_setattr`); nobody else sees that clone. Both need CAP_SYS_ADMIN, so a normal
//!   user's mount refuses the atime options that would need it, as it refuses `dev`/`suid`
//!   (fusermount3 never allows those). Without kernel passthrough the kernel's page cache
//!   answers repeated reads without asking the daemon, so SRC sees no access; a
//!   `strictatime` mount therefore drops that cache at every open (a read in a new open
//!   updates atime, as xfstests generic/003 checks); the other modes keep it.
//!
//! The default keeps what checkpointfs always did: `rw,nodev,nosuid,exec`, and atime as
//! SRC's own mount has it (`atime`).
use std::ffi::CString;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How reads through the mount update the access time of SRC's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Atime {
    /// As SRC's own mount does (option `atime`; the default).
    #[default]
    Source,
    /// `relatime`: only when atime is older than mtime or ctime, or a day old.
    Relative,
    /// `noatime`: never.
    Never,
    /// `strictatime`: at every access.
    Strict,
}

/// The options of one mount; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountOptions {
    pub read_only: bool,
    pub atime: Atime,
    /// Directories' access times are not updated (else: as SRC's mount does).
    pub no_diratime: bool,
    /// Device nodes can be opened (`dev`).
    pub devices: bool,
    /// Set-user-id and set-group-id bits take effect (`suid`).
    pub setuid: bool,
    /// Files can be executed (`exec`).
    pub exec: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            read_only: false,
            atime: Atime::Source,
            no_diratime: false,
            devices: false,
            setuid: false,
            exec: true,
        }
    }
}

/// The options `-o` accepts, in the order the error message lists them.
pub const SUPPORTED: &str = "ro, rw, noatime, relatime, strictatime, atime, nodiratime, \
                             diratime, dev, nodev, suid, nosuid, exec, noexec";

/// The attributes the daemon's private clone of SRC's mount gets (`struct mount_attr`'s
/// `attr_set` and `attr_clr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtimeChange {
    pub attr_set: u64,
    pub attr_clr: u64,
}

impl MountOptions {
    /// The options after the comma-separated `lists`, applied in order over the defaults
    /// (a later option wins over an earlier one). Empty items are skipped.
    pub fn parse<S: AsRef<str>>(lists: &[S]) -> Result<MountOptions, String> {
        let mut o = MountOptions::default();
        for item in lists.iter().flat_map(|l| l.as_ref().split(',')) {
            match item.trim() {
                "" => {}
                "ro" => o.read_only = true,
                "rw" => o.read_only = false,
                "noatime" => o.atime = Atime::Never,
                "relatime" => o.atime = Atime::Relative,
                "strictatime" => o.atime = Atime::Strict,
                "atime" => o.atime = Atime::Source,
                "nodiratime" => o.no_diratime = true,
                "diratime" => o.no_diratime = false,
                "dev" => o.devices = true,
                "nodev" => o.devices = false,
                "suid" => o.setuid = true,
                "nosuid" => o.setuid = false,
                "exec" => o.exec = true,
                "noexec" => o.exec = false,
                other => {
                    return Err(format!(
                        "unknown mount option '{other}' (supported: {SUPPORTED})"
                    ));
                }
            }
        }
        Ok(o)
    }

    /// The effective options as one `-o` list, every setting spelled out
    /// (`rw,nodev,nosuid,exec,atime`); parsing it gives these options back.
    pub fn to_list(&self) -> String {
        let mut out = self.fusermount_options();
        if self.atime == Atime::Source {
            out.insert(4, "atime");
        }
        out.join(",")
    }

    /// The mount(2) flags of the FUSE mount (root's mount path). The atime flags change
    /// nothing for FUSE inodes (S_NOATIME) but show the options in /proc/mounts.
    pub fn ms_flags(&self) -> libc::c_ulong {
        let mut f = 0;
        if self.read_only {
            f |= libc::MS_RDONLY;
        }
        if !self.devices {
            f |= libc::MS_NODEV;
        }
        if !self.setuid {
            f |= libc::MS_NOSUID;
        }
        if !self.exec {
            f |= libc::MS_NOEXEC;
        }
        f |= match self.atime {
            Atime::Source => 0,
            Atime::Relative => libc::MS_RELATIME,
            Atime::Never => libc::MS_NOATIME,
            Atime::Strict => libc::MS_STRICTATIME,
        };
        if self.no_diratime {
            f |= libc::MS_NODIRATIME;
        }
        f
    }

    /// The same flags as fusermount3 `-o` options (a normal user's mount path), in
    /// [`Self::to_list`]'s order without its `atime`; fusermount3 adds `nosuid,nodev` for a
    /// normal user whatever it is given.
    pub fn fusermount_options(&self) -> Vec<&'static str> {
        let mut out = vec![
            if self.read_only { "ro" } else { "rw" },
            if self.devices { "dev" } else { "nodev" },
            if self.setuid { "suid" } else { "nosuid" },
            if self.exec { "exec" } else { "noexec" },
        ];
        match self.atime {
            Atime::Source => {}
            Atime::Relative => out.push("relatime"),
            Atime::Never => out.push("noatime"),
            Atime::Strict => out.push("strictatime"),
        }
        if self.no_diratime {
            out.push("nodiratime");
        }
        out
    }

    /// What the daemon's view of SRC must change so that its accesses follow these atime
    /// rules, given the `statvfs` `f_flag` of SRC's mount; `None` when SRC's mount already
    /// does exactly that (then no clone is made).
    pub fn atime_change(&self, src_flags: libc::c_ulong) -> Option<AtimeChange> {
        self.change_to(self.atime, src_flags)
    }

    /// What the daemon's own view of SRC must change: [`MountOptions::atime_change`], except
    /// that on a read-only mount the daemon's accesses never update an access time, where it
    /// may clone SRC's mount (`may_clone`: CAP_SYS_ADMIN). Nothing can change through a
    /// read-only mount, yet every readdir and read of it is the daemon's own access to SRC,
    /// under SRC's mount's rules (xfstests generic/003 saw a directory's atime move). Without
    /// the capability the daemon asks for O_NOATIME where it opens for reading instead
    /// (`fs::MountFacts::read_only`), which the kernel grants for the daemon's own files only.
    pub fn source_view_change(
        &self,
        src_flags: libc::c_ulong,
        may_clone: bool,
    ) -> Option<AtimeChange> {
        if self.read_only && may_clone {
            let mut change = self.change_to(Atime::Never, src_flags);
            // nodiratime means nothing once no atime moves.
            if let Some(c) = change.as_mut() {
                c.attr_set &= !libc::MOUNT_ATTR_NODIRATIME;
            }
            change.filter(|c| c.attr_set != 0 || c.attr_clr != 0)
        } else {
            self.atime_change(src_flags)
        }
    }

    fn change_to(&self, atime: Atime, src_flags: libc::c_ulong) -> Option<AtimeChange> {
        let src_atime = if src_flags & libc::ST_NOATIME != 0 {
            Atime::Never
        } else if src_flags & libc::ST_RELATIME != 0 {
            Atime::Relative
        } else {
            Atime::Strict
        };
        let mut change = AtimeChange {
            attr_set: 0,
            attr_clr: 0,
        };
        if atime != Atime::Source && atime != src_atime {
            change.attr_clr |= libc::MOUNT_ATTR__ATIME;
            change.attr_set |= match atime {
                Atime::Never => libc::MOUNT_ATTR_NOATIME,
                Atime::Strict => libc::MOUNT_ATTR_STRICTATIME,
                // MOUNT_ATTR_RELATIME is 0: clearing the atime bits selects it.
                _ => libc::MOUNT_ATTR_RELATIME,
            };
        }
        if self.no_diratime && src_flags & libc::ST_NODIRATIME == 0 {
            change.attr_set |= libc::MOUNT_ATTR_NODIRATIME;
        }
        (change.attr_set != 0 || change.attr_clr != 0).then_some(change)
    }

    /// Why a mount without CAP_SYS_ADMIN (through fusermount3) cannot have these options,
    /// given SRC's `statvfs` flags; `None` when it can.
    pub fn refusal_without_privilege(&self, src_flags: libc::c_ulong) -> Option<String> {
        let mut refused = Vec::new();
        if self.devices {
            refused.push("dev");
        }
        if self.setuid {
            refused.push("suid");
        }
        if let Some(change) = self.atime_change(src_flags) {
            if change.attr_clr & libc::MOUNT_ATTR__ATIME != 0 {
                refused.push(match self.atime {
                    Atime::Never => "noatime",
                    Atime::Strict => "strictatime",
                    _ => "relatime",
                });
            }
            if change.attr_set & libc::MOUNT_ATTR_NODIRATIME != 0 {
                refused.push("nodiratime");
            }
        }
        if refused.is_empty() {
            return None;
        }
        Some(format!(
            "-o {} needs root: a normal user's FUSE mount (through fusermount3) is always \
             nodev,nosuid, and access times other than the source's own mount's need a \
             private clone of that mount, which only root can make; mount as root, or \
             leave {} out",
            refused.join(","),
            if refused.len() == 1 { "it" } else { "them" }
        ))
    }
}

/// Whether the topmost mount at `mountpoint` in `mountinfo` (the text of
/// /proc/self/mountinfo) is read-only, per mount (`-o ro`) or per superblock (`mount -o
/// remount,ro`, which the daemon is not told about).
pub fn mounted_read_only(mountinfo: &[u8], mountpoint: &Path) -> bool {
    let has_ro = |field: &[u8]| field.split(|&b| b == b',').any(|o| o == b"ro");
    mountinfo
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = fields.iter().position(|f| *f == b"-")?;
            let point = crate::mount::mountinfo::unescape_mountinfo(fields.get(4)?);
            (sep >= 6 && Path::new(&point) == mountpoint)
                .then(|| has_ro(fields[5]) || fields.get(sep + 3).is_some_and(|f| has_ro(f)))
        })
        .next_back()
        .unwrap_or(false)
}

/// `statvfs(path).f_flag`.
pub fn statvfs_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: all-zero is a valid statvfs to be filled in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statvfs, both live for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag)
}

/// Opens SRC's root directory (O_PATH) for the daemon: as it is, or, when `opts` asks for
/// other atime rules than SRC's mount has, from a private detached clone of that mount
/// (with the mounts below SRC) with those rules. Every file the daemon opens beneath the
/// returned fd is on that clone, so its reads (and the kernel's passthrough reads of its
/// backing files) update atime by the clone's rules. Returns the fd and the change made.
#[allow(
    clippy::disallowed_methods,
    reason = "open_tree and mount_setattr have no libc wrappers; they change a detached \
              clone's mount attributes, never a file"
)]
pub fn open_source_root(
    source: &Path,
    opts: &MountOptions,
) -> io::Result<(OwnedFd, Option<AtimeChange>)> {
    let c = CString::new(source.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let change = opts.source_view_change(statvfs_flags(source)?, crate::sys::has_cap_sys_admin());
    let Some(change) = change else {
        return Ok((crate::sys::open_source(source)?, None));
    };
    let what = |step: &str, e: io::Error| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot apply -o {} to {}: {step}: {e}",
                opts.to_list(),
                source.display()
            ),
        )
    };
    // SAFETY: open_tree(2) takes a dirfd, a NUL-terminated path (`c`, live for the call)
    // and flags; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(what(
            "open_tree(OPEN_TREE_CLONE)",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: a fresh fd nobody else owns; dropping it frees the detached clone once no
    // file opened beneath it remains.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = libc::mount_attr {
        attr_set: change.attr_set,
        attr_clr: change.attr_clr,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr(2) on the fd we own, an empty NUL-terminated path (with
    // AT_EMPTY_PATH: the fd itself), and a pointer to `attr` with its exact size; the
    // kernel only reads `attr`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(what("mount_setattr", io::Error::last_os_error()));
    }
    Ok((tree, Some(change)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_only_mount_views_src_without_access_times_where_it_may_clone() {
        let ro = MountOptions::parse(&["ro,nodiratime"]).unwrap();
        let noatime = Some(AtimeChange {
            attr_set: libc::MOUNT_ATTR_NOATIME,
            attr_clr: libc::MOUNT_ATTR__ATIME,
        });
        assert_eq!(ro.source_view_change(libc::ST_RELATIME, true), noatime);
        assert_eq!(ro.source_view_change(0, true), noatime);
        assert_eq!(ro.source_view_change(libc::ST_NOATIME, true), None);
        // Without CAP_SYS_ADMIN: what the options ask for, and no more (O_NOATIME instead).
        assert_eq!(
            ro.source_view_change(libc::ST_RELATIME, false),
            ro.atime_change(libc::ST_RELATIME)
        );
        assert_eq!(ro.refusal_without_privilege(libc::ST_NODIRATIME), None);
        let rw = MountOptions::default();
        assert_eq!(rw.source_view_change(libc::ST_RELATIME, true), None);
    }

    #[test]
    fn the_default_is_what_checkpointfs_always_did() {
        let d = MountOptions::parse::<&str>(&[]).unwrap();
        assert_eq!(d, MountOptions::default());
        assert_eq!(d.to_list(), "rw,nodev,nosuid,exec,atime");
        assert_eq!(d.ms_flags(), libc::MS_NODEV | libc::MS_NOSUID);
        assert_eq!(d.fusermount_options(), ["rw", "nodev", "nosuid", "exec"]);
        assert_eq!(d.atime_change(libc::ST_RELATIME), None);
        assert_eq!(d.atime_change(libc::ST_NOATIME), None);
        assert_eq!(d.refusal_without_privilege(libc::ST_RELATIME), None);
    }

    #[test]
    fn later_options_win_across_lists_and_the_list_round_trips() {
        let o = MountOptions::parse(&["ro,noexec,dev", "rw,suid,strictatime,nodiratime"]).unwrap();
        assert!(!o.read_only && !o.exec && o.devices && o.setuid && o.no_diratime);
        assert_eq!(o.atime, Atime::Strict);
        assert_eq!(o.to_list(), "rw,dev,suid,noexec,strictatime,nodiratime");
        assert_eq!(MountOptions::parse(&[o.to_list()]).unwrap(), o);
        let o = MountOptions::parse(&["noatime,,relatime", "ro"]).unwrap();
        assert_eq!((o.atime, o.read_only), (Atime::Relative, true));
    }

    #[test]
    fn an_unknown_option_is_refused_with_the_supported_list() {
        let e = MountOptions::parse(&["ro,sync"]).unwrap_err();
        assert!(e.contains("unknown mount option 'sync'"), "{e}");
        for name in [
            "ro",
            "rw",
            "noatime",
            "strictatime",
            "nodiratime",
            "suid",
            "noexec",
        ] {
            assert!(e.contains(name), "{name} missing from: {e}");
        }
    }

    #[test]
    fn mount_flags_follow_the_options() {
        let o = MountOptions::parse(&["ro,noexec,dev,suid,noatime,nodiratime"]).unwrap();
        assert_eq!(
            o.ms_flags(),
            libc::MS_RDONLY | libc::MS_NOEXEC | libc::MS_NOATIME | libc::MS_NODIRATIME
        );
        let f = |s: &str| MountOptions::parse(&[s]).unwrap().ms_flags();
        assert_eq!(f("relatime") & libc::MS_RELATIME, libc::MS_RELATIME);
        assert_eq!(
            f("strictatime") & libc::MS_STRICTATIME,
            libc::MS_STRICTATIME
        );
        assert_eq!(
            MountOptions::parse(&["ro,noexec,strictatime"])
                .unwrap()
                .fusermount_options(),
            ["ro", "nodev", "nosuid", "noexec", "strictatime"]
        );
    }

    #[test]
    fn a_clone_is_needed_only_when_the_atime_rules_differ_from_the_source_mount() {
        let change = |s: &str, src| MountOptions::parse(&[s]).unwrap().atime_change(src);
        // Same rules as SRC's mount: nothing to change.
        assert_eq!(change("relatime", libc::ST_RELATIME), None);
        assert_eq!(change("noatime", libc::ST_NOATIME), None);
        assert_eq!(change("strictatime", 0), None);
        assert_eq!(
            change("nodiratime", libc::ST_RELATIME | libc::ST_NODIRATIME),
            None
        );
        assert_eq!(
            change("noatime", libc::ST_RELATIME),
            Some(AtimeChange {
                attr_set: libc::MOUNT_ATTR_NOATIME,
                attr_clr: libc::MOUNT_ATTR__ATIME
            })
        );
        assert_eq!(
            change("strictatime,nodiratime", libc::ST_RELATIME),
            Some(AtimeChange {
                attr_set: libc::MOUNT_ATTR_STRICTATIME | libc::MOUNT_ATTR_NODIRATIME,
                attr_clr: libc::MOUNT_ATTR__ATIME
            })
        );
        assert_eq!(
            change("relatime", libc::ST_NOATIME),
            Some(AtimeChange {
                attr_set: libc::MOUNT_ATTR_RELATIME,
                attr_clr: libc::MOUNT_ATTR__ATIME
            })
        );
    }

    #[test]
    fn read_only_is_seen_per_mount_and_per_superblock() {
        let info = b"36 25 0:40 / /m rw,nosuid - fuse.checkpointfs /s rw,user_id=0\n\
                     37 25 0:41 / /r ro,nosuid - fuse.checkpointfs /s rw,user_id=0\n\
                     38 25 0:42 / /x\\040y rw - fuse.checkpointfs /s ro,user_id=0\n";
        assert!(!mounted_read_only(info, Path::new("/m")));
        assert!(mounted_read_only(info, Path::new("/r")));
        assert!(mounted_read_only(info, Path::new("/x y")));
        assert!(!mounted_read_only(info, Path::new("/none")));
        // The topmost mount decides.
        let stacked = [&info[..], b"39 25 0:43 / /m ro - ext4 /dev/x rw\n"].concat();
        assert!(mounted_read_only(&stacked, Path::new("/m")));
    }

    #[test]
    fn a_normal_user_is_refused_what_needs_root() {
        let why = |s: &str| {
            MountOptions::parse(&[s])
                .unwrap()
                .refusal_without_privilege(libc::ST_RELATIME)
        };
        assert_eq!(why("ro,noexec,relatime"), None);
        let e = why("dev,suid").unwrap();
        assert!(e.starts_with("-o dev,suid needs root"), "{e}");
        let e = why("strictatime,nodiratime").unwrap();
        assert!(e.starts_with("-o strictatime,nodiratime needs root"), "{e}");
        assert!(why("nodiratime").unwrap().starts_with("-o nodiratime "));
        // Only what differs from SRC's (relatime) mount is refused.
        assert!(
            why("relatime,nodiratime")
                .unwrap()
                .starts_with("-o nodiratime ")
        );
    }
}
