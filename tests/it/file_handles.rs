//! File handles through the mount (FUSE export support; issue 14, xfstests generic/426,
//! 467, 477, 756, 777): `name_to_handle_at` on MNT gives handles that `open_by_handle_at`
//! still opens after the kernel forgot the inode and after a remount, that go stale when
//! the file is deleted (even if its inode number is reused), and that never let a caller
//! change, or list, something outside SRC.
//!
//! Needs root (open_by_handle_at needs CAP_DAC_READ_SEARCH) and SRC on ext2/3/4 (handles
//! are decoded by inode number after a remount there; TMPDIR decides where SRC is).
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{TestMount, at, checkpoint, drop_caches};

const EXT4_SUPER_MAGIC: i64 = 0xEF53;
/// FILEID_INO64_GEN: how FUSE encodes a handle (node id high, node id low, generation).
const FUSE_HANDLE_TYPE: i32 = 0x81;

/// A `struct file_handle` as u32 words: handle_bytes, handle_type, then the handle.
#[derive(Clone, Debug, PartialEq)]
struct Handle(Vec<u32>);

impl Handle {
    fn of(path: &Path) -> Handle {
        let mut words = vec![0u32; 2 + 32];
        words[0] = 128;
        let mut mount_id = 0;
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `words` is a file_handle header with room for 128 handle bytes.
        let rc = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c.as_ptr(),
                words.as_mut_ptr().cast(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(
            rc,
            0,
            "name_to_handle_at {path:?}: {}",
            io::Error::last_os_error()
        );
        words.truncate(2 + (words[0] as usize).div_ceil(4));
        Handle(words)
    }

    /// A FUSE handle for node id `nodeid` of `generation`, as the kernel would encode it.
    fn forged(nodeid: u64, generation: u32) -> Handle {
        Handle(vec![
            12,
            FUSE_HANDLE_TYPE as u32,
            (nodeid >> 32) as u32,
            nodeid as u32,
            generation,
        ])
    }

    fn open(&self, mount: &File, flags: i32) -> io::Result<File> {
        let mut words = self.0.clone();
        // SAFETY: `words` is a complete file_handle; the fd returned is ours.
        let fd =
            unsafe { libc::open_by_handle_at(mount.as_raw_fd(), words.as_mut_ptr().cast(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd we own.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut out = Vec::new();
    f.read_to_end(&mut out).unwrap();
    out
}

fn errno_of<T>(r: io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn fd_path(f: &File) -> std::path::PathBuf {
    fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
}

fn assert_src_on_ext4(m: &TestMount) {
    let c = CString::new(m.src.as_os_str().as_bytes()).unwrap();
    // SAFETY: `st` is writable; `c` is a valid path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a live out-struct for the call.
    assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
    assert_eq!(
        st.f_type as i64, EXT4_SUPER_MAGIC,
        "this test needs SRC on ext2/3/4 (set TMPDIR to a directory there)"
    );
}

#[test]
fn handles_open_after_forget_and_remount_and_go_stale_on_delete() {
    let mut m = TestMount::new();
    assert_src_on_ext4(&m);
    let d = m.mnt.join("d");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("a"), b"content of a\n").unwrap();
    fs::write(d.join("sub/b"), b"content of b\n").unwrap();
    let (ha, hsub, hb) = (
        Handle::of(&d.join("a")),
        Handle::of(&d.join("sub")),
        Handle::of(&d.join("sub/b")),
    );
    let ino_a = fs::metadata(d.join("a")).unwrap().ino();

    // The kernel forgets the inodes: it decodes through the daemon (LOOKUP ".").
    drop_caches();
    let mount = File::open(&m.mnt).unwrap();
    assert_eq!(
        read_all(ha.open(&mount, libc::O_RDONLY).unwrap()),
        b"content of a\n"
    );
    let sub = hsub
        .open(&mount, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap();
    assert_eq!(
        sub.metadata().unwrap().ino(),
        fs::metadata(d.join("sub")).unwrap().ino()
    );
    drop((mount, sub));

    // A new daemon: the same handles still name the same objects. The directory is
    // renamed first, so the kernel reconnects the decoded directory by LOOKUP "..".
    fs::rename(&d, m.mnt.join("renamed")).unwrap();
    m.remount();
    drop_caches();
    let mount = File::open(&m.mnt).unwrap();
    assert_eq!(
        read_all(hb.open(&mount, libc::O_RDONLY).unwrap()),
        b"content of b\n"
    );
    let sub = hsub
        .open(&mount, libc::O_RDONLY | libc::O_DIRECTORY)
        .unwrap();
    assert_eq!(fd_path(&sub), m.mnt.join("renamed/sub"));
    let a = ha.open(&mount, libc::O_RDONLY).unwrap();
    assert_eq!(
        a.metadata().unwrap().ino(),
        ino_a,
        "st_ino through MNT stays SRC's"
    );
    drop((a, sub));

    // Deleted: stale.
    fs::remove_file(m.mnt.join("renamed/a")).unwrap();
    drop_caches();
    assert_eq!(
        errno_of(ha.open(&mount, libc::O_RDONLY)),
        Some(libc::ESTALE)
    );
    // A number given to a new file: the old handle names the same node id with the old
    // generation, which the new file does not have. Made deterministic by handing the
    // number of a live file over with another generation, as ext4 does on reuse.
    let b = m.mnt.join("renamed/sub/b");
    let hb_now = Handle::of(&b);
    assert_eq!(hb_now, hb, "a file's handle is the same in every daemon");
    let stale = Handle::forged(fs::metadata(&b).unwrap().ino(), hb.0[4].wrapping_add(1));
    drop_caches();
    assert_eq!(
        errno_of(stale.open(&mount, libc::O_RDONLY)),
        Some(libc::ESTALE)
    );
    assert_eq!(
        read_all(hb.open(&mount, libc::O_RDONLY).unwrap()),
        b"content of b\n"
    );
}

#[test]
fn a_forged_handle_never_changes_or_lists_anything_outside_src() {
    let m = TestMount::new();
    assert_src_on_ext4(&m);
    // Beside SRC on the same filesystem: a file and a directory the mount must not reach.
    let outside = m.root().join("outside");
    let outside_dir = m.root().join("outside-dir");
    fs::write(&outside, b"not yours\n").unwrap();
    fs::create_dir(&outside_dir).unwrap();
    fs::write(outside_dir.join("secret"), b"x").unwrap();
    fs::write(m.mnt.join("inside"), b"in\n").unwrap();

    let generation = |p: &Path| {
        let h = Handle::of(p); // ext4: FILEID_INO32_GEN (ino, generation)
        assert_eq!(h.0[1], 1, "ext4 handle type");
        h.0[3]
    };
    let file = Handle::forged(fs::metadata(&outside).unwrap().ino(), generation(&outside));
    let dir = Handle::forged(
        fs::metadata(&outside_dir).unwrap().ino(),
        generation(&outside_dir),
    );
    // The forgery has the kernel's own layout: a real handle of the mount matches it.
    let inside = Handle::of(&m.mnt.join("inside"));
    assert_eq!(
        inside,
        Handle::forged(
            fs::metadata(m.mnt.join("inside")).unwrap().ino(),
            generation(&m.src.join("inside"))
        )
    );

    drop_caches();
    let mount = File::open(&m.mnt).unwrap();
    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_APPEND,
    ] {
        let r = mount_open(&file, &mount, flags);
        assert_eq!(
            r,
            Some(libc::ESTALE),
            "open flags {flags:#o} of a file outside SRC"
        );
    }
    // Opened for reading (allowed, see the inode table's invariant 7), it still cannot be
    // changed: its mode, size and xattrs stay.
    {
        let f = file
            .open(&mount, libc::O_RDONLY)
            .expect("read-only open by handle");
        // SAFETY: plain syscalls on an fd we own.
        assert_eq!(unsafe { libc::fchmod(f.as_raw_fd(), 0o777) }, -1);
        assert_eq!(
            io::Error::last_os_error().raw_os_error(),
            Some(libc::ESTALE)
        );
        let name = c"user.planted";
        let rc =
            // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
            unsafe { libc::fsetxattr(f.as_raw_fd(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
        assert_eq!(rc, -1, "setxattr on a file outside SRC");
    }
    assert_eq!(fs::metadata(&outside).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(fs::read(&outside).unwrap(), b"not yours\n");
    assert_eq!(
        mount_open(&dir, &mount, libc::O_RDONLY | libc::O_DIRECTORY),
        Some(libc::ESTALE),
        "a directory outside SRC decoded through the mount"
    );
    // Inside SRC, a decoded file reads, and a change to it is always tracked. Changing it
    // needs its path (Layer 1 backs up a path): a file decoded by number while SRC's own
    // caches were cold has none until a lookup of its name connects it, and a write open
    // is ESTALE until then (changing nothing); if the caches still held its name, it opens.
    assert_eq!(
        read_all(inside.open(&mount, libc::O_RDONLY).unwrap()),
        b"in\n"
    );
    checkpoint(&m, "before-write");
    let append = libc::O_WRONLY | libc::O_APPEND;
    let f = match inside.open(&mount, append) {
        Ok(f) => f,
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}");
            assert_eq!(fs::read(m.src.join("inside")).unwrap(), b"in\n");
            // Looked up by name (and kept open, so the kernel keeps the inode): it opens.
            let _by_name = File::open(m.mnt.join("inside")).unwrap();
            inside.open(&mount, append).unwrap()
        }
    };
    std::io::Write::write_all(&mut &f, b"more\n").unwrap();
    drop(f);
    assert_eq!(fs::read(m.src.join("inside")).unwrap(), b"in\nmore\n");
    checkpoint(&m, "after-write");
    assert_eq!(
        fs::read(at(&m, "before-write").join("inside")).unwrap(),
        b"in\n"
    );
    assert_eq!(
        fs::read(at(&m, "after-write").join("inside")).unwrap(),
        b"in\nmore\n"
    );
}

/// The errno of opening `h` through `mount` with `flags`, `None` if it opened.
fn mount_open(h: &Handle, mount: &File, flags: i32) -> Option<i32> {
    errno_of(h.open(mount, flags))
}
