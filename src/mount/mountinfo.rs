//! The kernel's mount table (/proc/self/mountinfo): parsing, and recognising a checkpointfs
//! mount without asking its daemon (which may be dead).
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The filesystem type of a checkpointfs mount in /proc/self/mountinfo.
pub const FSTYPE: &str = "fuse.checkpointfs";

/// One line of /proc/self/mountinfo (the parts we need).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: OsString,
    /// The super block's options (`rw,user_id=1000,group_id=1000,...`).
    pub super_options: String,
}

impl MountEntry {
    /// A FUSE mount's `user_id=`: the only uid the kernel lets in without `allow_other`.
    pub fn fuse_user_id(&self) -> Option<u32> {
        self.super_options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }

    /// Whether the FUSE mount lets other users in (`allow_other`).
    pub fn allows_others(&self) -> bool {
        self.super_options.split(',').any(|o| o == "allow_other")
    }
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash.
pub(crate) fn unescape_mountinfo(field: &[u8]) -> OsString {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && i + 4 <= field.len()
            && field[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = field[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push((v & 0xff) as u8);
            i += 4;
        } else {
            out.push(field[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// Parses /proc/self/mountinfo; malformed lines are skipped.
pub fn parse_mountinfo(text: &[u8]) -> Vec<MountEntry> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            let sep = fields.iter().position(|f| *f == b"-")?;
            if sep < 6 {
                return None;
            }
            let fstype = fields.get(sep + 1)?;
            let source = fields.get(sep + 2).copied().unwrap_or(b"");
            Some(MountEntry {
                mount_point: PathBuf::from(unescape_mountinfo(fields[4])),
                fstype: String::from_utf8_lossy(fstype).into_owned(),
                source: unescape_mountinfo(source),
                super_options: fields
                    .get(sep + 3)
                    .map(|o| String::from_utf8_lossy(o).into_owned())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// Whether a mount table entry is recognizably checkpointfs without asking its daemon:
/// fstype `fuse.checkpointfs` (mounted through fusermount with a subtype), or a FUSE
/// mount whose source is `checkpointfs` (fuser's direct mount(2) always uses fstype `fuse`
/// and takes the source from FSName, else Subtype).
pub fn is_checkpointfs_mount(entry: &MountEntry) -> bool {
    entry.fstype == FSTYPE
        || ((entry.fstype == "fuse" || entry.fstype.starts_with("fuse."))
            && entry.source == "checkpointfs")
}

/// The innermost mount holding the absolute, resolved path `dir`: the entry with the longest
/// mount point that is `dir` or one of its parents (by whole path components; the last such
/// line, the mount on top, among equal ones). Compared as bytes, with no resolution: give it
/// a canonical path.
pub fn innermost_mount<'a>(entries: &'a [MountEntry], dir: &Path) -> Option<&'a MountEntry> {
    let dir = dir.as_os_str().as_bytes();
    let mut best: Option<&MountEntry> = None;
    for e in entries {
        let mp = e.mount_point.as_os_str().as_bytes();
        let holds = mp == b"/"
            || dir == mp
            || (dir.len() > mp.len() && dir.starts_with(mp) && dir[mp.len()] == b'/');
        if holds && best.is_none_or(|b| mp.len() >= b.mount_point.as_os_str().len()) {
            best = Some(e);
        }
    }
    best
}

/// The topmost mount at `mount_point`, if any.
pub fn find_mount(mount_point: &Path) -> io::Result<Option<MountEntry>> {
    let text = fs::read("/proc/self/mountinfo")?;
    Ok(parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == mount_point))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_mount_holding_a_path_is_found_by_whole_components() {
        let text = b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
                     2 1 0:50 / /tmp/m rw - fuse.checkpointfs /src rw,user_id=0\n\
                     3 2 0:51 / /tmp/m/in rw - tmpfs tmpfs rw\n\
                     4 1 0:52 / /tmp/m rw - fuse.checkpointfs /src2 rw,user_id=0\n";
        let m = parse_mountinfo(text);
        let at = |p: &str| innermost_mount(&m, Path::new(p)).map(|e| e.source.clone());
        assert_eq!(at("/tmp/m"), Some("/src2".into()), "the mount on top wins");
        assert_eq!(at("/tmp/m/a/b"), Some("/src2".into()));
        assert_eq!(at("/tmp/m/in/x"), Some("tmpfs".into()));
        assert_eq!(at("/tmp/mm"), Some("/dev/sda1".into()), "not a path prefix");
        assert_eq!(at("/"), Some("/dev/sda1".into()));
        assert_eq!(innermost_mount(&[], Path::new("/x")), None);
    }

    #[test]
    fn parses_mountinfo() {
        let text = b"36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                     40 35 0:50 / /tmp/m rw,nosuid,nodev,relatime shared:5 - fuse.checkpointfs /src rw,user_id=0\n\
                     garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].fstype, "ext3");
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/m"));
        assert_eq!(m[1].fstype, FSTYPE);
        assert_eq!(m[1].source, OsString::from("/src"));
        assert!(is_checkpointfs_mount(&m[1]));
        assert!(!is_checkpointfs_mount(&m[0]));
        let direct = MountEntry {
            mount_point: "/m".into(),
            fstype: "fuse".into(),
            source: "checkpointfs".into(),
            super_options: "rw,user_id=1000,group_id=1000".into(),
        };
        assert_eq!(direct.fuse_user_id(), Some(1000));
        assert!(!direct.allows_others());
        assert_eq!(m[1].fuse_user_id(), Some(0));
        assert!(is_checkpointfs_mount(&direct));
        let other = MountEntry {
            source: "sshfs#host:".into(),
            ..direct
        };
        assert!(!is_checkpointfs_mount(&other));
        assert_eq!(
            unescape_mountinfo(b"a\\134b\\011c\\012"),
            OsString::from("a\\b\tc\n")
        );
        assert_eq!(
            unescape_mountinfo(b"trailing\\04"),
            OsString::from("trailing\\04")
        );
    }
}
