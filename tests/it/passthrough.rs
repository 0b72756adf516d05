//! The passthrough behaves exactly like the directory underneath: every operation through
//! MNT is checked against SRC (and reads of SRC's content through MNT), in both IO modes —
//! kernel passthrough (the default) and `--no-passthrough` (IO served by the daemon).
//!
//! Each body is a plain `fn(args)`; [`both_modes!`] makes the `#[test]`s.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{
    DirBuilderExt, DirEntryExt, FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt,
    symlink,
};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{
    TestMount, drop_caches, process_alive, run, stderr, stdout, tree_listing, wait_until,
};
use sha2::{Digest, Sha256};

/// Two `#[test]`s per body: `NAME::passthrough` and `NAME::no_passthrough`.
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            #[test]
            fn passthrough() {
                super::$name(&[]);
            }
            #[test]
            fn no_passthrough() {
                super::$name(&["--no-passthrough"]);
            }
        })*
    };
}

both_modes!(
    create_read_write_at_offsets,
    append_semantics,
    large_file_roundtrip,
    sparse_seek_data_hole,
    fallocate_modes,
    copy_file_range_in_mount,
    fsync_fdatasync_fsyncdir,
    mixed_access_modes_share_one_file,
    setattr_mode_owner_size,
    setattr_times,
    mmap_write_updates_times,
    write_only_close_shows_new_size_and_times,
    mkdir_rmdir_unlink,
    rename_variants,
    hard_links,
    symlinks,
    fifo_socket_and_device_nodes,
    statfs_matches_source,
    access_checks,
    xattrs,
    posix_acls,
    symlink_xattrs,
    open_fd_survives_renames_of_ancestors,
    open_fd_survives_unlink,
    forgets_after_drop_caches,
    readdir_2000_entries,
    control_dir_is_hidden_and_protected,
    concurrent_clients,
    control_dir_shadows_source_entry,
    real_tools_cp_tar_sed_python,
    git_in_the_mount,
    creation_as_another_user,
    writes_by_others_clear_setuid_and_setgid,
    debug_log_shows_gate_lines,
);

// ---- helpers --------------------------------------------------------------------------

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `Ok(ret)` or the errno of a libc call returning -1.
fn cvt(ret: i64) -> io::Result<i64> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("no errno: {e}")),
    }
}

fn lstat(p: &Path) -> libc::stat {
    // SAFETY: an all-zero libc::stat is a valid value (plain integers).
    let mut st = unsafe { std::mem::zeroed::<libc::stat>() };
    // SAFETY: a NUL-terminated path and a live out-struct for the call.
    let r = unsafe { libc::lstat(c(p).as_ptr(), &mut st) };
    assert_eq!(r, 0, "lstat {p:?}: {}", io::Error::last_os_error());
    st
}

fn sh(dir: &Path, script: &str) -> String {
    let out = run("sh", &["-c", script], dir);
    assert!(
        out.status.success(),
        "sh -c {script:?} in {dir:?} failed: {}",
        stderr(&out)
    );
    stdout(&out)
}

/// Deterministic pseudo-random bytes (xorshift64), `seed` picks the stream.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn sha_file(p: &Path) -> String {
    let mut f = File::open(p).unwrap_or_else(|e| panic!("open {p:?}: {e}"));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    base16ct::lower::encode_string(&h.finalize())
}

/// Maps the first `len` bytes of `f` shared and writable, stores `byte` at offset 0 through
/// the mapping, msyncs it if `sync`, and unmaps.
fn write_first_byte_mapped(f: &File, len: usize, byte: u8, sync: bool) {
    // SAFETY: a fresh shared mapping of `len` bytes of `f`, written and unmapped here only.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(addr, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        *(addr as *mut u8) = byte;
        if sync {
            assert_eq!(libc::msync(addr, len, libc::MS_SYNC), 0);
        }
        libc::munmap(addr, len);
    }
}

fn lseek(f: &File, off: i64, whence: i32) -> io::Result<i64> {
    // SAFETY: a valid fd owned by this test; plain integer arguments.
    cvt(unsafe { libc::lseek(f.as_raw_fd(), off, whence) })
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

// ---- data ------------------------------------------------------------------------------

fn create_read_write_at_offsets(args: &[&str]) {
    let mut m = TestMount::unmounted(args);
    fs::write(m.src.join("pre.txt"), "from src\n").unwrap();
    fs::write(m.src.join("pre2.txt"), "second\n").unwrap();
    m.mount();

    // Content that was in SRC before the mount reads back through MNT.
    assert_eq!(fs::read(m.mnt.join("pre.txt")).unwrap(), b"from src\n");

    // Create + write, visible in SRC.
    let p = m.mnt.join("f");
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .open(&p)
        .unwrap();
    f.write_all(b"hello world").unwrap();
    drop(f);
    assert_eq!(fs::read(m.src.join("f")).unwrap(), b"hello world");
    assert_eq!(mode_of(&m.src.join("f")), 0o640);

    // O_EXCL: EEXIST for a name created through the mount and for one that was only ever
    // in SRC (never looked up before).
    let e = OpenOptions::new().write(true).create_new(true).open(&p);
    assert_eq!(errno(e), libc::EEXIST);
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.mnt.join("pre2.txt"));
    assert_eq!(errno(e), libc::EEXIST);
    assert_eq!(fs::read(m.src.join("pre2.txt")).unwrap(), b"second\n");

    // pwrite/pread at offsets, including past EOF (leaving a zero-filled gap).
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.write_all_at(b"WORLD", 6).unwrap();
    f.write_all_at(b"!", 20).unwrap();
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"WORLD");
    let mut want = b"hello WORLD".to_vec();
    want.resize(20, 0);
    want.push(b'!');
    assert_eq!(fs::read(m.src.join("f")).unwrap(), want);
    assert_eq!(fs::read(&p).unwrap(), want);
    assert_eq!(f.metadata().unwrap().len(), 21);
    // A read at EOF returns 0 bytes, a read across EOF is short.
    assert_eq!(f.read_at(&mut buf, 21).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 19).unwrap(), 2);
    drop(f);

    // O_TRUNC empties the file in SRC; writing after it starts at 0.
    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    assert_eq!(fs::metadata(m.src.join("f")).unwrap().len(), 0);
    assert_eq!(fs::metadata(&p).unwrap().len(), 0);
    t.write_all(b"new").unwrap();
    drop(t);
    assert_eq!(fs::read(m.src.join("f")).unwrap(), b"new");

    // A read-only fd cannot write; a write-only fd cannot read.
    let mut ro = File::open(&p).unwrap();
    assert_eq!(errno(ro.write(b"x")), libc::EBADF);
    let mut wo = OpenOptions::new().write(true).open(&p).unwrap();
    assert_eq!(errno(wo.read(&mut buf)), libc::EBADF);

    // Sequential reads through a plain read loop, with the fd position advancing.
    fs::write(&p, pattern(100_000, 1)).unwrap();
    let mut r = File::open(&p).unwrap();
    r.seek(SeekFrom::Start(12_345)).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, pattern(100_000, 1)[12_345..]);
}

fn append_semantics(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("log");
    fs::write(&p, "0123456789").unwrap();

    // O_APPEND writes land at the end whatever the fd offset.
    let mut a = OpenOptions::new().append(true).open(&p).unwrap();
    a.seek(SeekFrom::Start(0)).unwrap();
    a.write_all(b"A").unwrap();
    assert_eq!(fs::read(m.src.join("log")).unwrap(), b"0123456789A");

    // Another fd extends the file; the next append goes after that, not after "A".
    let o = OpenOptions::new().write(true).open(&p).unwrap();
    o.write_all_at(b"B", 20).unwrap();
    a.write_all(b"C").unwrap();
    let mut want = b"0123456789A".to_vec();
    want.resize(20, 0);
    want.extend_from_slice(b"BC");
    assert_eq!(fs::read(m.src.join("log")).unwrap(), want);
    assert_eq!(fs::read(&p).unwrap(), want);
    drop((a, o));

    // A shared writable mapping of an O_RDWR|O_APPEND fd: the page written back at
    // offset 0 must land at offset 0 (the mapping's offset), not be appended.
    let p = m.mnt.join("mapped");
    fs::write(&p, "0123456789").unwrap();
    let f = OpenOptions::new().read(true).append(true).open(&p).unwrap();
    write_first_byte_mapped(&f, 10, b'X', true);
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(m.src.join("mapped")).unwrap(), b"X123456789");
    assert_eq!(fs::read(&p).unwrap(), b"X123456789");
}

fn large_file_roundtrip(args: &[&str]) {
    const MIB: usize = 1 << 20;
    let m = TestMount::with_args(args);
    let p = m.mnt.join("big.bin");
    let mut f = File::create(&p).unwrap();
    let mut h = Sha256::new();
    for i in 0..64 {
        let chunk = pattern(MIB, 1000 + i);
        h.update(&chunk);
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let want = base16ct::lower::encode_string(&h.finalize());
    assert_eq!(fs::metadata(&p).unwrap().len(), 64 * MIB as u64);
    assert_eq!(
        fs::metadata(m.src.join("big.bin")).unwrap().len(),
        64 * MIB as u64
    );
    assert_eq!(sha_file(&m.src.join("big.bin")), want, "SRC content");
    assert_eq!(sha_file(&p), want, "MNT content");
    // A read straddling a chunk boundary at an odd offset.
    let f = File::open(&p).unwrap();
    let mut buf = vec![0u8; 3000];
    let off = 33 * MIB - 1000;
    f.read_exact_at(&mut buf, off as u64).unwrap();
    let mut both = pattern(MIB, 1032);
    both.extend(pattern(MIB, 1033));
    assert_eq!(buf, both[MIB - 1000..MIB + 2000]);
}

/// SEEK_DATA / SEEK_HOLE answers through MNT equal SRC's at every probe offset.
fn assert_seek_matches(mnt_file: &File, src_file: &File, probes: &[i64]) {
    for &off in probes {
        for (whence, name) in [
            (libc::SEEK_DATA, "SEEK_DATA"),
            (libc::SEEK_HOLE, "SEEK_HOLE"),
        ] {
            let a = lseek(mnt_file, off, whence).map_err(|e| e.raw_os_error());
            let b = lseek(src_file, off, whence).map_err(|e| e.raw_os_error());
            assert_eq!(a, b, "{name} at {off}: MNT vs SRC");
        }
    }
}

fn sparse_seek_data_hole(args: &[&str]) {
    const MIB: i64 = 1 << 20;
    let m = TestMount::with_args(args);
    let p = m.mnt.join("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&[1u8; 4096], 0).unwrap();
    f.write_all_at(&[2u8; 8192], MIB as u64).unwrap();
    f.write_all_at(&[3u8; 4096], 8 * MIB as u64).unwrap();
    f.set_len(16 * MIB as u64).unwrap();
    f.sync_all().unwrap();
    let s = File::open(m.src.join("sparse")).unwrap();
    let probes = [
        0,
        100,
        4096,
        5000,
        MIB - 1,
        MIB,
        MIB + 4096,
        3 * MIB,
        8 * MIB,
        8 * MIB + 4095,
        12 * MIB,
        16 * MIB - 1,
        16 * MIB,
        20 * MIB,
    ];
    assert_seek_matches(&f, &s, &probes);
    // The holes really are holes on both sides: far fewer blocks than the size.
    let st = lstat(&m.src.join("sparse"));
    assert!(st.st_blocks * 512 < 4 * MIB, "SRC blocks {}", st.st_blocks);
    assert_eq!(lstat(&p).st_blocks, st.st_blocks, "st_blocks MNT vs SRC");
    // Holes read as zeros.
    let mut buf = vec![0xffu8; 4096];
    f.read_exact_at(&mut buf, 4 * MIB as u64).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    assert_eq!(
        sha_file(&p),
        sha_file(&m.src.join("sparse")),
        "content MNT vs SRC"
    );
}

fn fallocate_modes(args: &[&str]) {
    const K: i64 = 1024;
    let m = TestMount::with_args(args);
    let p = m.mnt.join("falloc");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all_at(&[0xab; 64 * 1024], 0).unwrap();
    f.sync_all().unwrap();
    let fa = |mode: i32, off: i64, len: i64| {
        // SAFETY: a valid fd owned by this test; plain integer arguments.
        cvt(unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) } as i64)
    };

    // Mode 0 past EOF extends the size.
    fa(0, 64 * K, 64 * K).unwrap();
    assert_eq!(
        fs::metadata(m.src.join("falloc")).unwrap().len(),
        128 * K as u64
    );
    assert_eq!(f.metadata().unwrap().len(), 128 * K as u64);

    // KEEP_SIZE allocates without changing the size.
    let before = lstat(&m.src.join("falloc")).st_blocks;
    fa(libc::FALLOC_FL_KEEP_SIZE, 128 * K, 64 * K).unwrap();
    assert_eq!(
        fs::metadata(m.src.join("falloc")).unwrap().len(),
        128 * K as u64
    );
    assert_eq!(fs::metadata(&p).unwrap().len(), 128 * K as u64);
    assert!(lstat(&m.src.join("falloc")).st_blocks > before);

    // PUNCH_HOLE|KEEP_SIZE: zeros in the range, the rest intact, a hole at 4 KiB.
    fa(
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        4 * K,
        8 * K,
    )
    .unwrap();
    let mut want = vec![0xabu8; 64 * 1024];
    want[4096..12288].fill(0);
    want.resize(128 * 1024, 0);
    let mut got = vec![0u8; 128 * 1024];
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == want, "content through the fd after punching");
    assert_eq!(
        fs::read(m.src.join("falloc")).unwrap(),
        want,
        "SRC after punch"
    );
    assert_eq!(fs::read(&p).unwrap(), want, "MNT after punch");
    let s = File::open(m.src.join("falloc")).unwrap();
    assert_eq!(lseek(&f, 0, libc::SEEK_HOLE).unwrap(), 4 * K);
    assert_seek_matches(&f, &s, &[0, 4 * K, 6 * K, 12 * K, 64 * K, 100 * K]);
    f.sync_all().unwrap();
    assert_eq!(
        lstat(&p).st_blocks,
        lstat(&m.src.join("falloc")).st_blocks,
        "st_blocks MNT vs SRC"
    );

    // PUNCH_HOLE without KEEP_SIZE is refused, as everywhere.
    assert_eq!(
        errno(fa(libc::FALLOC_FL_PUNCH_HOLE, 0, 4 * K)),
        libc::EOPNOTSUPP
    );
}

fn copy_file_range_in_mount(args: &[&str]) {
    let m = TestMount::with_args(args);
    let data = pattern((1 << 20) + 123, 7);
    fs::write(m.mnt.join("a"), &data).unwrap();
    let a = File::open(m.mnt.join("a")).unwrap();
    let b = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.mnt.join("b"))
        .unwrap();

    // With explicit offsets: 500 000 bytes from 1000 in a to 10 in b.
    let (mut off_in, mut off_out): (i64, i64) = (1000, 10);
    let mut left = 500_000usize;
    while left > 0 {
        // SAFETY: valid fds owned by this test; the offsets are live locals.
        let n = unsafe {
            libc::copy_file_range(
                a.as_raw_fd(),
                &mut off_in,
                b.as_raw_fd(),
                &mut off_out,
                left,
                0,
            )
        };
        let n = cvt(n as i64).unwrap() as usize;
        assert!(n > 0, "copy_file_range returned 0 before the end");
        left -= n;
    }
    assert_eq!((off_in, off_out), (501_000, 500_010));
    let mut want = vec![0u8; 10];
    want.extend_from_slice(&data[1000..501_000]);
    assert_eq!(fs::read(m.src.join("b")).unwrap(), want);
    assert_eq!(fs::read(m.mnt.join("b")).unwrap(), want);

    // With the file positions (NULL offsets): the whole of a into a fresh c.
    let c_file = File::create(m.mnt.join("c")).unwrap();
    let mut a2 = File::open(m.mnt.join("a")).unwrap();
    let copied = io::copy(&mut a2, &mut &c_file).unwrap();
    assert_eq!(copied, data.len() as u64);
    let mut total = 0usize;
    let d = File::create(m.mnt.join("d")).unwrap();
    let a3 = File::open(m.mnt.join("a")).unwrap();
    loop {
        // SAFETY: valid fds owned by this test; the offsets are live locals.
        let n = unsafe {
            libc::copy_file_range(
                a3.as_raw_fd(),
                std::ptr::null_mut(),
                d.as_raw_fd(),
                std::ptr::null_mut(),
                1 << 30,
                0,
            )
        };
        let n = cvt(n as i64).unwrap() as usize;
        if n == 0 {
            break;
        }
        total += n;
    }
    assert_eq!(total, data.len());
    assert_eq!(fs::read(m.src.join("c")).unwrap(), data);
    assert_eq!(fs::read(m.src.join("d")).unwrap(), data);
    assert_eq!(fs::read(m.mnt.join("d")).unwrap(), data);
}

fn fsync_fdatasync_fsyncdir(args: &[&str]) {
    let m = TestMount::with_args(args);
    fs::create_dir(m.mnt.join("dir")).unwrap();
    let mut f = File::create(m.mnt.join("dir/f")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    let ro = File::open(m.mnt.join("dir/f")).unwrap();
    ro.sync_all().unwrap();
    assert_eq!(fs::read(m.src.join("dir/f")).unwrap(), b"durable");
    for d in [m.mnt.join("dir"), m.mnt.clone()] {
        let dir = File::open(&d).unwrap();
        assert_eq!(
            // SAFETY: a valid fd owned by this test; plain integer arguments.
            cvt(unsafe { libc::fsync(dir.as_raw_fd()) } as i64).map_err(|e| e.to_string()),
            Ok(0),
            "fsync of dir {d:?}"
        );
        assert_eq!(
            // SAFETY: a valid fd owned by this test; plain integer arguments.
            cvt(unsafe { libc::fdatasync(dir.as_raw_fd()) } as i64).map_err(|e| e.to_string()),
            Ok(0),
            "fdatasync of dir {d:?}"
        );
    }
    // SAFETY: a valid fd owned by this test; plain integer arguments.
    assert_eq!(unsafe { libc::syncfs(f.as_raw_fd()) }, 0);
}

/// Read-only, write-only and read-write opens of one file at the same time: each works
/// whatever the order they came in (with kernel passthrough they share one backing file).
fn mixed_access_modes_share_one_file(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("shared");
    fs::write(&p, "0123456789").unwrap();

    let reader = File::open(&p).unwrap();
    let writer = OpenOptions::new().write(true).open(&p).unwrap();
    writer.write_all_at(b"AB", 0).unwrap();
    let mut buf = [0u8; 10];
    reader.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"AB23456789");
    drop((reader, writer));

    let p = m.mnt.join("shared2");
    fs::write(&p, "0123456789").unwrap();
    let writer = OpenOptions::new().write(true).open(&p).unwrap();
    let reader = File::open(&p).unwrap();
    writer.write_all_at(b"CD", 2).unwrap();
    reader.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"01CD456789");
    let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    rw.write_all_at(b"E", 9).unwrap();
    rw.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"01CD45678E");
    drop((writer, reader, rw));
    assert_eq!(fs::read(m.src.join("shared2")).unwrap(), b"01CD45678E");
}

// ---- setattr ---------------------------------------------------------------------------

fn setattr_mode_owner_size(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("attr");
    let sp = m.src.join("attr");
    fs::write(&p, "0123456789").unwrap();

    // chmod by path and by fd, setuid bits included.
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(mode_of(&sp), 0o640);
    assert_eq!(mode_of(&p), 0o640);
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o4755))
        .unwrap();
    assert_eq!(mode_of(&sp), 0o4755);
    assert_eq!(mode_of(&p), 0o4755);
    fs::create_dir(m.mnt.join("d")).unwrap();
    fs::set_permissions(m.mnt.join("d"), fs::Permissions::from_mode(0o711)).unwrap();
    assert_eq!(mode_of(&m.src.join("d")), 0o711);

    // chown by path, by fd, and lchown of a symlink (the target keeps its owner).
    std::os::unix::fs::chown(&p, Some(1234), Some(5678)).unwrap();
    let st = fs::metadata(&sp).unwrap();
    assert_eq!((st.uid(), st.gid()), (1234, 5678));
    let st = fs::metadata(&p).unwrap();
    assert_eq!((st.uid(), st.gid()), (1234, 5678));
    std::os::unix::fs::fchown(&f, Some(4321), None).unwrap();
    let st = fs::metadata(&sp).unwrap();
    assert_eq!((st.uid(), st.gid()), (4321, 5678));
    symlink("attr", m.mnt.join("link")).unwrap();
    std::os::unix::fs::lchown(m.mnt.join("link"), Some(777), Some(888)).unwrap();
    let l = fs::symlink_metadata(m.src.join("link")).unwrap();
    assert_eq!((l.uid(), l.gid()), (777, 888));
    assert_eq!(fs::metadata(&sp).unwrap().uid(), 4321);
    let l = fs::symlink_metadata(m.mnt.join("link")).unwrap();
    assert_eq!((l.uid(), l.gid()), (777, 888));

    // truncate by path (no open fd involved), shrinking and growing.
    drop(f);
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::truncate(c(&p).as_ptr(), 3) };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
    assert_eq!(fs::read(&sp).unwrap(), b"012");
    assert_eq!(fs::metadata(&p).unwrap().len(), 3);
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::truncate(c(&p).as_ptr(), 5000) };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
    let mut want = b"012".to_vec();
    want.resize(5000, 0);
    assert_eq!(fs::read(&sp).unwrap(), want);
    assert_eq!(fs::read(&p).unwrap(), want);
    // ftruncate on an open fd.
    let f = OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(2).unwrap();
    assert_eq!(fs::read(&sp).unwrap(), b"01");
    assert_eq!(f.metadata().unwrap().len(), 2);
    // truncate of a directory fails as on any filesystem.
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::truncate(c(&m.mnt.join("d")).as_ptr(), 0) };
    assert_eq!(r, -1);
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::EISDIR)
    );
    // truncate of a read-only (0444) file by root by path works, as underneath.
    fs::write(m.mnt.join("ro"), "readonly").unwrap();
    fs::set_permissions(m.mnt.join("ro"), fs::Permissions::from_mode(0o444)).unwrap();
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::truncate(c(&m.mnt.join("ro")).as_ptr(), 4) };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
    assert_eq!(fs::read(m.src.join("ro")).unwrap(), b"read");
}

fn ts(sec: i64, nsec: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    }
}

fn times_of(p: &Path) -> ((i64, i64), (i64, i64)) {
    let st = lstat(p);
    (
        (st.st_atime, st.st_atime_nsec),
        (st.st_mtime, st.st_mtime_nsec),
    )
}

fn utimensat(p: &Path, t: [libc::timespec; 2], flags: i32) {
    // SAFETY: `t` is two live timespecs; the path or fd is valid for the call.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c(p).as_ptr(), t.as_ptr(), flags) };
    assert_eq!(r, 0, "utimensat {p:?}: {}", io::Error::last_os_error());
}

fn futimens(f: &File, t: [libc::timespec; 2]) {
    // SAFETY: `t` is two live timespecs; the path or fd is valid for the call.
    let r = unsafe { libc::futimens(f.as_raw_fd(), t.as_ptr()) };
    assert_eq!(r, 0, "futimens: {}", io::Error::last_os_error());
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A write through a shared mapping, then close: stat through MNT shows the mtime and ctime
/// the filesystem underneath set (xfstests generic/080, 215), though the attributes were
/// cached before (with kernel passthrough the daemon never sees that write).
fn mmap_write_updates_times(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("mapped");
    fs::write(&p, "0123456789").unwrap();
    // Times in the past, then a stat that caches them in the kernel.
    utimensat(&p, [ts(1_000_000_000, 0), ts(1_000_000_000, 0)], 0);
    let before = lstat(&p);
    assert_eq!(before.st_mtime, 1_000_000_000);
    let start = now_secs();
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    write_first_byte_mapped(&f, 10, b'X', false);
    drop(f);
    let after = lstat(&p);
    let src = lstat(&m.src.join("mapped"));
    assert!(src.st_mtime >= start, "SRC's mtime {}", src.st_mtime);
    assert_eq!(
        (
            after.st_mtime,
            after.st_mtime_nsec,
            after.st_ctime,
            after.st_ctime_nsec
        ),
        (
            src.st_mtime,
            src.st_mtime_nsec,
            src.st_ctime,
            src.st_ctime_nsec
        ),
        "times through MNT vs SRC after a mapped write"
    );
    assert!(
        (after.st_ctime, after.st_ctime_nsec) > (before.st_ctime, before.st_ctime_nsec),
        "ctime not updated"
    );
    assert_eq!(fs::read(&p).unwrap(), b"X123456789");
}

/// A write-only handle closes without a FLUSH round trip (it cannot be mapped; see
/// `Opened::flush_on_close` in src/fs/mod.rs): right after close, size, mtime and ctime
/// through MNT are SRC's, though the attributes were cached before the write. And a mapping
/// of such a handle is refused, as natively, so no write can bypass write(2) through it.
fn write_only_close_shows_new_size_and_times(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("appended");
    fs::write(&p, "0123456789").unwrap();
    utimensat(&p, [ts(1_000_000_000, 0), ts(1_000_000_000, 0)], 0);
    let before = lstat(&p);
    assert_eq!(before.st_mtime, 1_000_000_000);
    let start = now_secs();
    let mut f = OpenOptions::new().append(true).open(&p).unwrap();
    // SAFETY: a request for a new mapping of a valid fd; the kernel refuses it (asserted),
    // and a mapping it made would never be used.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            10,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_eq!(addr, libc::MAP_FAILED, "a write-only fd was mapped");
    assert_eq!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    f.write_all(b"abc").unwrap();
    drop(f);
    let after = lstat(&p);
    let src = lstat(&m.src.join("appended"));
    assert!(src.st_mtime >= start, "SRC's mtime {}", src.st_mtime);
    assert_eq!(
        (
            after.st_size,
            after.st_mtime,
            after.st_mtime_nsec,
            after.st_ctime,
            after.st_ctime_nsec
        ),
        (
            src.st_size,
            src.st_mtime,
            src.st_mtime_nsec,
            src.st_ctime,
            src.st_ctime_nsec
        ),
        "size and times through MNT vs SRC after a write-only handle's close"
    );
    assert_eq!(after.st_size, 13);
    assert_eq!(fs::read(&p).unwrap(), b"0123456789abc");
}

fn setattr_times(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("t");
    let sp = m.src.join("t");
    fs::write(&p, "times").unwrap();
    let omit = ts(0, libc::UTIME_OMIT);
    let now = ts(0, libc::UTIME_NOW);

    // Specific times, to the nanosecond, by path with no fd open.
    utimensat(
        &p,
        [
            ts(1_000_000_000, 123_456_789),
            ts(1_500_000_000, 987_654_321),
        ],
        0,
    );
    let want = ((1_000_000_000, 123_456_789), (1_500_000_000, 987_654_321));
    assert_eq!(times_of(&sp), want);
    assert_eq!(times_of(&p), want);

    // UTIME_OMIT keeps one, sets the other.
    utimensat(&p, [omit, ts(1_600_000_000, 5)], 0);
    let want = ((1_000_000_000, 123_456_789), (1_600_000_000, 5));
    assert_eq!(times_of(&sp), want);
    assert_eq!(times_of(&p), want);
    utimensat(&p, [ts(1_100_000_000, 0), omit], 0);
    let want = ((1_100_000_000, 0), (1_600_000_000, 5));
    assert_eq!(times_of(&sp), want);
    assert_eq!(times_of(&p), want);

    // UTIME_NOW for mtime only.
    let before = now_secs();
    utimensat(&p, [omit, now], 0);
    let after = now_secs();
    let ((a, an), (mt, _)) = times_of(&sp);
    assert_eq!((a, an), (1_100_000_000, 0));
    assert!(before - 1 <= mt && mt <= after + 1, "mtime {mt} not now");
    assert_eq!(times_of(&p), times_of(&sp));

    // With an fd open: futimens, and utimensat by path while the fd is open.
    let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    futimens(&f, [ts(1_200_000_000, 1), ts(1_300_000_000, 2)]);
    let want = ((1_200_000_000, 1), (1_300_000_000, 2));
    assert_eq!(times_of(&sp), want);
    assert_eq!(times_of(&p), want);
    futimens(&f, [now, omit]);
    let ((a, _), m2) = times_of(&sp);
    assert!(a >= before - 1, "atime {a} not now");
    assert_eq!(m2, (1_300_000_000, 2));
    utimensat(&p, [ts(1_400_000_000, 3), ts(1_400_000_000, 4)], 0);
    assert_eq!(times_of(&sp), ((1_400_000_000, 3), (1_400_000_000, 4)));
    // A read-only fd works for futimens too (root owns the file).
    let ro = File::open(&p).unwrap();
    futimens(&ro, [omit, ts(1_450_000_000, 0)]);
    assert_eq!(times_of(&sp).1, (1_450_000_000, 0));
    drop((f, ro));
    assert_eq!(times_of(&p), times_of(&sp));

    // A symlink's own times (AT_SYMLINK_NOFOLLOW) change; its target's do not.
    symlink("t", m.mnt.join("l")).unwrap();
    let target_before = times_of(&sp);
    utimensat(
        &m.mnt.join("l"),
        [ts(1_010_000_000, 0), ts(1_020_000_000, 0)],
        libc::AT_SYMLINK_NOFOLLOW,
    );
    assert_eq!(
        times_of(&m.src.join("l")),
        ((1_010_000_000, 0), (1_020_000_000, 0))
    );
    assert_eq!(
        times_of(&sp),
        target_before,
        "target of the symlink changed"
    );
    // And following the symlink changes the target.
    utimensat(
        &m.mnt.join("l"),
        [ts(1_030_000_000, 0), ts(1_040_000_000, 0)],
        0,
    );
    assert_eq!(times_of(&sp), ((1_030_000_000, 0), (1_040_000_000, 0)));
    // Directories too.
    fs::create_dir(m.mnt.join("d")).unwrap();
    utimensat(
        &m.mnt.join("d"),
        [ts(1_050_000_000, 7), ts(1_060_000_000, 8)],
        0,
    );
    assert_eq!(
        times_of(&m.src.join("d")),
        ((1_050_000_000, 7), (1_060_000_000, 8))
    );
}

// ---- namespace -------------------------------------------------------------------------

fn mkdir_rmdir_unlink(args: &[&str]) {
    let m = TestMount::with_args(args);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(m.mnt.join("d"))
        .unwrap();
    assert!(fs::metadata(m.src.join("d")).unwrap().is_dir());
    assert_eq!(mode_of(&m.src.join("d")), 0o700);
    assert_eq!(mode_of(&m.mnt.join("d")), 0o700);
    assert_eq!(errno(fs::create_dir(m.mnt.join("d"))), libc::EEXIST);
    fs::write(m.mnt.join("d/x"), "x").unwrap();
    assert_eq!(errno(fs::remove_dir(m.mnt.join("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(m.mnt.join("d/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(m.mnt.join("d"))), libc::EISDIR);
    fs::remove_file(m.mnt.join("d/x")).unwrap();
    assert!(!m.src.join("d/x").exists());
    assert_eq!(errno(fs::metadata(m.mnt.join("d/x"))), libc::ENOENT);
    assert_eq!(errno(fs::remove_file(m.mnt.join("d/x"))), libc::ENOENT);
    fs::remove_dir(m.mnt.join("d")).unwrap();
    assert!(!m.src.join("d").exists());
    assert_eq!(errno(fs::remove_dir(m.mnt.join("d"))), libc::ENOENT);
    // A deep chain, then the same names again after removal.
    fs::create_dir_all(m.mnt.join("a/b/c/d")).unwrap();
    fs::write(m.mnt.join("a/b/c/d/leaf"), "leaf").unwrap();
    assert_eq!(fs::read(m.src.join("a/b/c/d/leaf")).unwrap(), b"leaf");
    fs::remove_dir_all(m.mnt.join("a")).unwrap();
    assert!(!m.src.join("a").exists());
    fs::create_dir_all(m.mnt.join("a/b")).unwrap();
    assert!(m.src.join("a/b").is_dir());
    // Names in SRC that were never looked up can be removed too.
    assert_eq!(tree_listing(&m.mnt), tree_listing(&m.src));
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    // SAFETY: NUL-terminated paths that live for the call; plain integer flags.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            c(from).as_ptr(),
            libc::AT_FDCWD,
            c(to).as_ptr(),
            flags,
        )
    };
    cvt(r as i64).map(|_| ())
}

fn rename_variants(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);

    // A file.
    fs::write(mn.join("a"), "A").unwrap();
    fs::rename(mn.join("a"), mn.join("b")).unwrap();
    assert!(!sr.join("a").exists());
    assert_eq!(fs::read(sr.join("b")).unwrap(), b"A");
    assert_eq!(fs::read(mn.join("b")).unwrap(), b"A");

    // A directory with contents, across directories.
    fs::create_dir_all(mn.join("d1/sub")).unwrap();
    fs::write(mn.join("d1/sub/f"), "deep").unwrap();
    fs::create_dir(mn.join("other")).unwrap();
    fs::rename(mn.join("d1"), mn.join("other/d2")).unwrap();
    assert!(!sr.join("d1").exists());
    assert_eq!(fs::read(sr.join("other/d2/sub/f")).unwrap(), b"deep");
    assert_eq!(fs::read(mn.join("other/d2/sub/f")).unwrap(), b"deep");

    // Over an existing file: the target is replaced; an fd on the old target keeps it.
    fs::write(mn.join("x"), "X").unwrap();
    fs::write(mn.join("y"), "Y").unwrap();
    let old_y = File::open(mn.join("y")).unwrap();
    fs::rename(mn.join("x"), mn.join("y")).unwrap();
    assert!(!sr.join("x").exists());
    assert_eq!(fs::read(sr.join("y")).unwrap(), b"X");
    assert_eq!(fs::read(mn.join("y")).unwrap(), b"X");
    let mut s = String::new();
    (&old_y).read_to_string(&mut s).unwrap();
    assert_eq!(s, "Y");

    // RENAME_NOREPLACE: EEXIST over an existing name, both untouched; fine otherwise.
    fs::write(mn.join("n1"), "one").unwrap();
    fs::write(mn.join("n2"), "two").unwrap();
    assert_eq!(
        errno(renameat2(
            &mn.join("n1"),
            &mn.join("n2"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    assert_eq!(fs::read(sr.join("n1")).unwrap(), b"one");
    assert_eq!(fs::read(sr.join("n2")).unwrap(), b"two");
    renameat2(&mn.join("n1"), &mn.join("n3"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(sr.join("n3")).unwrap(), b"one");
    assert!(!sr.join("n1").exists());

    // RENAME_EXCHANGE swaps a file and a directory.
    fs::write(mn.join("e1"), "file").unwrap();
    fs::create_dir(mn.join("e2")).unwrap();
    fs::write(mn.join("e2/child"), "c").unwrap();
    renameat2(&mn.join("e1"), &mn.join("e2"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(sr.join("e2")).unwrap(), b"file");
    assert_eq!(fs::read(sr.join("e1/child")).unwrap(), b"c");
    assert_eq!(fs::read(mn.join("e2")).unwrap(), b"file");
    assert_eq!(fs::read(mn.join("e1/child")).unwrap(), b"c");
    assert_eq!(
        errno(renameat2(
            &mn.join("e1"),
            &mn.join("nope"),
            libc::RENAME_EXCHANGE
        )),
        libc::ENOENT
    );

    // The errors rename(2) gives underneath.
    fs::create_dir_all(mn.join("full/x")).unwrap();
    fs::create_dir(mn.join("empty")).unwrap();
    assert_eq!(
        errno(fs::rename(mn.join("empty"), mn.join("full"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs::rename(mn.join("full"), mn.join("full/x/inside"))),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs::rename(mn.join("b"), mn.join("full"))),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs::rename(mn.join("full"), mn.join("b"))),
        libc::ENOTDIR
    );
    // A directory over an empty directory works.
    fs::rename(mn.join("full"), mn.join("empty")).unwrap();
    assert!(sr.join("empty/x").is_dir());
    assert_eq!(tree_listing(mn), tree_listing(sr));
}

fn hard_links(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);
    fs::write(mn.join("l1"), "shared").unwrap();
    fs::hard_link(mn.join("l1"), mn.join("l2")).unwrap();
    let (a, b) = (lstat(&mn.join("l1")), lstat(&mn.join("l2")));
    assert_eq!((a.st_nlink, b.st_nlink), (2, 2), "nlink through MNT");
    assert_eq!(
        a.st_ino, b.st_ino,
        "one inode number for both names through MNT"
    );
    let (sa, sb) = (lstat(&sr.join("l1")), lstat(&sr.join("l2")));
    assert_eq!((sa.st_nlink, sb.st_nlink), (2, 2), "nlink in SRC");
    assert_eq!(sa.st_ino, sb.st_ino);
    assert_eq!(a.st_ino, sa.st_ino, "st_ino MNT vs SRC");

    // Writes through one name show through the other.
    OpenOptions::new()
        .append(true)
        .open(mn.join("l2"))
        .unwrap()
        .write_all(b"+more")
        .unwrap();
    assert_eq!(fs::read(mn.join("l1")).unwrap(), b"shared+more");

    // Renaming one name keeps the link.
    fs::create_dir(mn.join("sub")).unwrap();
    fs::rename(mn.join("l1"), mn.join("sub/l3")).unwrap();
    assert_eq!(fs::read(mn.join("l2")).unwrap(), b"shared+more");
    let (c3, c2) = (lstat(&mn.join("sub/l3")), lstat(&mn.join("l2")));
    assert_eq!(c3.st_ino, c2.st_ino);
    assert_eq!((c3.st_nlink, c2.st_nlink), (2, 2));
    assert_eq!(
        lstat(&sr.join("sub/l3")).st_ino,
        lstat(&sr.join("l2")).st_ino
    );

    // A third link, then unlinking brings the counts down on both sides.
    fs::hard_link(mn.join("l2"), mn.join("sub/l4")).unwrap();
    assert_eq!(lstat(&mn.join("sub/l3")).st_nlink, 3);
    assert_eq!(lstat(&sr.join("sub/l3")).st_nlink, 3);
    fs::remove_file(mn.join("l2")).unwrap();
    fs::remove_file(mn.join("sub/l4")).unwrap();
    assert_eq!(lstat(&mn.join("sub/l3")).st_nlink, 1);
    assert_eq!(lstat(&sr.join("sub/l3")).st_nlink, 1);
    assert_eq!(fs::read(mn.join("sub/l3")).unwrap(), b"shared+more");

    // The errors link(2) gives.
    assert_eq!(
        errno(fs::hard_link(mn.join("sub"), mn.join("sublink"))),
        libc::EPERM
    );
    fs::write(mn.join("z"), "z").unwrap();
    assert_eq!(
        errno(fs::hard_link(mn.join("z"), mn.join("sub/l3"))),
        libc::EEXIST
    );
    // A link to a file that was only ever in SRC... created through the mount.
    assert_eq!(tree_listing(mn), tree_listing(sr));
}

fn symlinks(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);
    symlink("target.txt", mn.join("s1")).unwrap();
    assert_eq!(
        fs::read_link(sr.join("s1")).unwrap(),
        Path::new("target.txt")
    );
    assert_eq!(
        fs::read_link(mn.join("s1")).unwrap(),
        Path::new("target.txt")
    );
    assert!(
        fs::symlink_metadata(mn.join("s1"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Dangling until the target exists.
    assert_eq!(errno(fs::metadata(mn.join("s1"))), libc::ENOENT);
    fs::write(mn.join("target.txt"), "t").unwrap();
    assert_eq!(fs::read(mn.join("s1")).unwrap(), b"t");
    // To a directory, followed in path walks.
    fs::create_dir(mn.join("dir")).unwrap();
    fs::write(mn.join("dir/in"), "in").unwrap();
    symlink("dir", mn.join("sd")).unwrap();
    assert_eq!(fs::read(mn.join("sd/in")).unwrap(), b"in");
    // Absolute and long targets are stored byte for byte.
    symlink("/nonexistent/abs", mn.join("abs")).unwrap();
    assert_eq!(
        fs::read_link(sr.join("abs")).unwrap(),
        Path::new("/nonexistent/abs")
    );
    let long = "x/".repeat(1000) + "end";
    symlink(&long, mn.join("long")).unwrap();
    assert_eq!(fs::read_link(mn.join("long")).unwrap(), Path::new(&long));
    assert_eq!(fs::read_link(sr.join("long")).unwrap(), Path::new(&long));
    assert_eq!(lstat(&mn.join("long")).st_size, long.len() as i64);
    // Replacing a symlink (ln -sfn) and removing one.
    sh(mn, "ln -sfn target.txt sd");
    assert_eq!(
        fs::read_link(sr.join("sd")).unwrap(),
        Path::new("target.txt")
    );
    assert_eq!(fs::read(mn.join("sd")).unwrap(), b"t");
    fs::remove_file(mn.join("s1")).unwrap();
    assert!(fs::symlink_metadata(sr.join("s1")).is_err());
    assert!(sr.join("target.txt").exists());
    assert_eq!(errno(symlink("x", mn.join("abs"))), libc::EEXIST);
    assert_eq!(tree_listing(mn), tree_listing(sr));
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    cvt(unsafe { libc::mknod(c(p).as_ptr(), mode, dev) } as i64).map(|_| ())
}

fn fifo_socket_and_device_nodes(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);

    // FIFO: made through the mount, a FIFO in SRC, and it works as a pipe in the mount.
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::mkfifo(c(&mn.join("fifo")).as_ptr(), 0o644) };
    assert_eq!(r, 0, "{}", io::Error::last_os_error());
    assert!(
        fs::symlink_metadata(sr.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(
        fs::symlink_metadata(mn.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert_eq!(mode_of(&sr.join("fifo")), 0o644);
    let fifo = mn.join("fifo");
    let writer = std::thread::spawn(move || fs::write(fifo, b"through the pipe"));
    assert_eq!(fs::read(mn.join("fifo")).unwrap(), b"through the pipe");
    writer.join().unwrap().unwrap();

    // Unix socket bound in the mount: a socket in SRC, and connectable through MNT.
    let sock = mn.join("sock");
    let listener = UnixListener::bind(&sock).unwrap();
    assert!(
        fs::symlink_metadata(sr.join("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert!(fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
    let mut client = UnixStream::connect(&sock).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    drop((client, server, listener));
    fs::remove_file(&sock).unwrap();
    assert!(fs::symlink_metadata(sr.join("sock")).is_err());

    // Character devices (as root): device numbers survive both ways, small and large.
    for (name, major, minor) in [("null", 1, 3), ("big", 240, 70_000), ("mid", 10, 300)] {
        let dev = libc::makedev(major, minor);
        mknod(&mn.join(name), libc::S_IFCHR | 0o666, dev).unwrap();
        let s = lstat(&sr.join(name));
        assert_eq!(s.st_mode & libc::S_IFMT, libc::S_IFCHR, "{name} in SRC");
        assert_eq!(s.st_rdev, dev, "{name}: rdev in SRC");
        let t = lstat(&mn.join(name));
        assert_eq!(t.st_mode & libc::S_IFMT, libc::S_IFCHR, "{name} in MNT");
        assert_eq!(t.st_rdev, dev, "{name}: rdev through MNT");
    }
    // The mount is nodev (as FUSE mounts are): opening the node is refused. See
    // docs/posix-compliance.md, "Known differences".
    assert_eq!(errno(File::open(mn.join("null"))), libc::EACCES);
    // mknod of a regular file works like creat.
    mknod(&mn.join("reg"), libc::S_IFREG | 0o600, 0).unwrap();
    assert!(fs::metadata(sr.join("reg")).unwrap().is_file());
    assert_eq!(mode_of(&sr.join("reg")), 0o600);
    assert_eq!(
        errno(mknod(&mn.join("reg"), libc::S_IFIFO | 0o600, 0)),
        libc::EEXIST
    );
}

fn statvfs(p: &Path) -> libc::statvfs {
    // SAFETY: an all-zero libc::statvfs is a valid value (plain integers).
    let mut s = unsafe { std::mem::zeroed::<libc::statvfs>() };
    // SAFETY: a NUL-terminated path and a live out-struct for the call.
    let r = unsafe { libc::statvfs(c(p).as_ptr(), &mut s) };
    assert_eq!(r, 0, "statvfs {p:?}: {}", io::Error::last_os_error());
    s
}

fn statfs_matches_source(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (a, b) = (statvfs(&m.mnt), statvfs(&m.src));
    assert_eq!(a.f_bsize, b.f_bsize, "f_bsize");
    assert_eq!(a.f_frsize, b.f_frsize, "f_frsize");
    assert_eq!(a.f_blocks, b.f_blocks, "f_blocks");
    assert_eq!(a.f_files, b.f_files, "f_files");
    assert_eq!(a.f_namemax, b.f_namemax, "f_namemax");
    // Free counts move with other tests writing; allow 1% of the size.
    let slack = b.f_blocks / 100;
    assert!(
        a.f_bfree.abs_diff(b.f_bfree) <= slack,
        "f_bfree {} vs {}",
        a.f_bfree,
        b.f_bfree
    );
    assert!(a.f_bavail.abs_diff(b.f_bavail) <= slack, "f_bavail");
    assert!(
        a.f_ffree.abs_diff(b.f_ffree) <= b.f_files / 100 + 1000,
        "f_ffree"
    );
    // A statfs of a file inside the mount answers the same.
    fs::write(m.mnt.join("f"), "x").unwrap();
    assert_eq!(statvfs(&m.mnt.join("f")).f_blocks, b.f_blocks);
}

fn access(p: &Path, mode: i32) -> Result<(), i32> {
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::access(c(p).as_ptr(), mode) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn access_checks(args: &[&str]) {
    let m = TestMount::with_args(args);
    fs::write(m.mnt.join("f"), "x").unwrap();
    fs::set_permissions(m.mnt.join("f"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.mnt.join("d")).unwrap();
    symlink("missing", m.mnt.join("dangling")).unwrap();
    let cases = [
        ("f", libc::F_OK),
        ("f", libc::R_OK | libc::W_OK),
        ("f", libc::X_OK),
        ("d", libc::X_OK | libc::W_OK),
        ("missing", libc::F_OK),
        ("dangling", libc::F_OK),
    ];
    let check = |want_x: bool| {
        for (name, mode) in cases {
            let got = access(&m.mnt.join(name), mode);
            let want = access(&m.src.join(name), mode);
            assert_eq!(got, want, "access({name}, {mode}) MNT vs SRC");
        }
        assert_eq!(access(&m.mnt.join("f"), libc::X_OK).is_ok(), want_x);
    };
    check(false);
    assert_eq!(
        access(&m.mnt.join("missing"), libc::F_OK),
        Err(libc::ENOENT)
    );
    fs::set_permissions(m.mnt.join("f"), fs::Permissions::from_mode(0o744)).unwrap();
    check(true);
}

// ---- xattrs ----------------------------------------------------------------------------

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
    let r = unsafe {
        libc::setxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    };
    cvt(r as i64).map(|_| ())
}

fn getxattr_raw(p: &Path, name: &str, buf: &mut [u8]) -> io::Result<usize> {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
    let r = unsafe {
        libc::getxattr(
            c(p).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    cvt(r as i64).map(|n| n as usize)
}

fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let size = getxattr_raw(p, name, &mut [])?;
    let mut buf = vec![0u8; size];
    let n = getxattr_raw(p, name, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn listxattr(p: &Path) -> BTreeSet<String> {
    // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
    let size = unsafe { libc::listxattr(c(p).as_ptr(), std::ptr::null_mut(), 0) };
    assert!(size >= 0, "listxattr size: {}", io::Error::last_os_error());
    let mut buf = vec![0u8; size as usize];
    // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
    let n = unsafe { libc::listxattr(c(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: {}", io::Error::last_os_error());
    buf.truncate(n as usize);
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated path and name, and a buffer live and sized as passed.
    cvt(unsafe { libc::removexattr(c(p).as_ptr(), n.as_ptr()) } as i64).map(|_| ())
}

fn xattrs(args: &[&str]) {
    let m = TestMount::with_args(args);
    fs::write(m.mnt.join("f"), "x").unwrap();
    fs::create_dir(m.mnt.join("d")).unwrap();
    for name in ["f", "d"] {
        let p = m.mnt.join(name);
        let sp = m.src.join(name);
        setxattr(&p, "user.one", b"first value", 0).unwrap();
        setxattr(&p, "user.two", &[0, 1, 2, 255], 0).unwrap();
        // The size probe, then the value; both seen in SRC.
        assert_eq!(getxattr_raw(&p, "user.one", &mut []).unwrap(), 11);
        assert_eq!(getxattr(&p, "user.one").unwrap(), b"first value");
        assert_eq!(getxattr(&sp, "user.one").unwrap(), b"first value");
        assert_eq!(getxattr(&p, "user.two").unwrap(), [0, 1, 2, 255]);
        // Too small a buffer: ERANGE.
        let mut small = [0u8; 3];
        assert_eq!(
            errno(getxattr_raw(&p, "user.one", &mut small)),
            libc::ERANGE
        );
        // Missing names: ENODATA.
        assert_eq!(errno(getxattr(&p, "user.none")), libc::ENODATA);
        assert_eq!(errno(removexattr(&p, "user.none")), libc::ENODATA);
        // Listing agrees with SRC.
        let names = listxattr(&p);
        assert!(
            names.contains("user.one") && names.contains("user.two"),
            "{names:?}"
        );
        assert_eq!(names, listxattr(&sp));
        // XATTR_CREATE / XATTR_REPLACE.
        assert_eq!(
            errno(setxattr(&p, "user.one", b"x", libc::XATTR_CREATE)),
            libc::EEXIST
        );
        assert_eq!(
            errno(setxattr(&p, "user.three", b"x", libc::XATTR_REPLACE)),
            libc::ENODATA
        );
        setxattr(&p, "user.one", b"replaced", libc::XATTR_REPLACE).unwrap();
        assert_eq!(getxattr(&sp, "user.one").unwrap(), b"replaced");
        // An empty value is a value.
        setxattr(&p, "user.empty", b"", 0).unwrap();
        assert_eq!(getxattr(&p, "user.empty").unwrap(), b"");
        // Remove.
        removexattr(&p, "user.one").unwrap();
        assert_eq!(errno(getxattr(&p, "user.one")), libc::ENODATA);
        assert_eq!(errno(getxattr(&sp, "user.one")), libc::ENODATA);
        assert!(!listxattr(&p).contains("user.one"));
    }
}

/// Runs `script` with `sh -e` in a fresh directory `name` under MNT and under a plain
/// directory on the same disk as SRC, and asserts both print the same: the mount behaves
/// as the filesystem underneath. Returns that output. Both directories are 0777, reachable
/// by other users (the script may switch with `setpriv`).
fn same_as_underneath(m: &TestMount, name: &str, script: &str) -> String {
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let plain = m.root().join("plain");
    fs::create_dir_all(&plain).unwrap();
    let mut outs = Vec::new();
    for base in [&m.mnt, &plain] {
        let dir = base.join(name);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let out = run("sh", &["-ec", script], &dir);
        assert!(
            out.status.success(),
            "in {}: {}{}",
            dir.display(),
            stdout(&out),
            stderr(&out)
        );
        outs.push(stdout(&out));
    }
    assert_eq!(
        outs[0], outs[1],
        "through the mount vs. the disk underneath"
    );
    outs.swap_remove(0)
}

/// POSIX ACLs (FUSE_POSIX_ACL): inheritance of a default ACL with the umask ignored under
/// it (and applied elsewhere), ACL entries of the owner/group/other shown in the mode,
/// chmod rewriting the ACL, access decided by named entries, and setgid cleared by a
/// setfacl from outside the file's group — all as on ext4 underneath.
fn posix_acls(args: &[&str]) {
    let m = TestMount::with_args(&[args, &["--allow-other"]].concat());
    let out = same_as_underneath(
        &m,
        "acl",
        "umask 022
         mkdir d
         setfacl -d -m u::rwx,g::rwx,o::rwx,u:65534:r-x d
         touch d/f; mkdir d/sub; mkfifo d/p; touch plain; mkdir plaindir
         stat -c '%n %a' d/f d/sub d/p plain plaindir
         getfacl -cpn d/f d/sub
         touch o; setfacl -m u::r,g::r,o::- o; stat -c '%n %a' o
         chmod 0751 o; getfacl -cpn o
         echo secret > s; chmod 0600 s; setfacl -m u:65534:rw s
         setpriv --reuid 65534 --regid 65534 --clear-groups -- sh -c 'echo more >> s; cat s'
         setfacl -m m::r s
         setpriv --reuid 65534 --regid 65534 --clear-groups -- sh -c 'echo x >> s' \
             2>/dev/null || echo denied by the mask
         touch g; chown 65534:0 g; chmod 2775 g
         setpriv --reuid 65534 --regid 65534 --clear-groups -- setfacl -m o::r g
         stat -c '%n %a' g
         setfacl -b o; getfacl -cpn o",
    );
    // Not just equal: what the kernel's ACL rules say (umask 022 throughout).
    for expected in [
        "d/f 666",
        "d/sub 777",
        "d/p 666",
        "plain 644",
        "plaindir 755",
        "o 440",
        "secret\nmore\n",
        "denied by the mask",
        "g 774",
        "default:user:65534:r-x",
        "user::rwx\ngroup::r-x\nother::--x",
    ] {
        assert!(out.contains(expected), "{expected:?} missing in:\n{out}");
    }
}

/// xattrs on a symlink act on the symlink itself (not on the procfs link the daemon's O_PATH
/// fd is, nor on the target), also after a rename of the link: `trusted.*` works as root,
/// `user.*` is refused, as on ext4 underneath.
fn symlink_xattrs(args: &[&str]) {
    let m = TestMount::with_args(args);
    let out = same_as_underneath(
        &m,
        "sx",
        "ln -s nowhere l
         setfattr -h -n trusted.a -v one l
         getfattr -h --only-values -n trusted.a l; echo
         setfattr -h -n user.a -v one l 2>&1 || echo user refused
         mv l l2
         setfattr -h -n trusted.b -v two l2
         getfattr -h -d -m trusted l2
         setfattr -h -x trusted.a l2
         getfattr -h -d -m trusted l2
         echo data > f; setfattr -n trusted.f -v target f; ln -s f lf
         getfattr -h -n trusted.f lf 2>&1 || echo not on the link
         getfattr --only-values -n trusted.f lf; echo",
    );
    for expected in [
        "one\n",
        "user refused",
        "trusted.a=\"one\"\ntrusted.b=\"two\"",
        "not on the link",
        "target\n",
    ] {
        assert!(out.contains(expected), "{expected:?} missing in:\n{out}");
    }
    // Seen in SRC on the link itself.
    let link = c(&m.src.join("sx/l2"));
    let mut buf = [0u8; 16];
    // SAFETY: C strings; buf is writable for its length.
    let n = unsafe {
        libc::lgetxattr(
            link.as_ptr(),
            c"trusted.b".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert_eq!(&buf[..usize::try_from(n).unwrap()], b"two");
}

// ---- inode-table robustness ------------------------------------------------------------

fn open_fd_survives_renames_of_ancestors(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);
    fs::create_dir_all(mn.join("g/p")).unwrap();
    fs::write(mn.join("g/p/f"), "start;").unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .append(true)
        .open(mn.join("g/p/f"))
        .unwrap();

    // Rename the parent: the old fd and the new path both work.
    fs::rename(mn.join("g/p"), mn.join("g/q")).unwrap();
    f.write_all(b"after-parent;").unwrap();
    assert_eq!(fs::read(mn.join("g/q/f")).unwrap(), b"start;after-parent;");
    assert_eq!(fs::read(sr.join("g/q/f")).unwrap(), b"start;after-parent;");
    OpenOptions::new()
        .append(true)
        .open(mn.join("g/q/f"))
        .unwrap()
        .write_all(b"new-path;")
        .unwrap();

    // Rename the grandparent too.
    fs::rename(mn.join("g"), mn.join("h")).unwrap();
    f.write_all(b"after-grandparent;").unwrap();
    let want = b"start;after-parent;new-path;after-grandparent;";
    assert_eq!(fs::read(mn.join("h/q/f")).unwrap(), want);
    assert_eq!(fs::read(sr.join("h/q/f")).unwrap(), want);
    let mut s = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut s).unwrap();
    assert_eq!(s, want);

    // Metadata changes through the old fd land on the renamed file.
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    assert_eq!(mode_of(&sr.join("h/q/f")), 0o600);
    f.set_len(5).unwrap();
    assert_eq!(fs::read(sr.join("h/q/f")).unwrap(), b"start");
    // Namespace changes in the renamed directories, by their new paths.
    fs::write(mn.join("h/q/g2"), "second").unwrap();
    assert_eq!(fs::read(sr.join("h/q/g2")).unwrap(), b"second");
    fs::create_dir(mn.join("h/q/sub")).unwrap();
    fs::rename(mn.join("h/q/f"), mn.join("h/q/sub/f")).unwrap();
    f.write_all(b"!").unwrap();
    assert_eq!(fs::read(sr.join("h/q/sub/f")).unwrap(), b"start!");
    // The old names are gone on both sides.
    assert!(!mn.join("g").exists() && !sr.join("g").exists());
    assert_eq!(tree_listing(mn), tree_listing(sr));
}

fn open_fd_survives_unlink(args: &[&str]) {
    let m = TestMount::with_args(args);
    let p = m.mnt.join("doomed");
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.write_all(b"before unlink;").unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!m.src.join("doomed").exists());
    assert_eq!(errno(fs::metadata(&p)), libc::ENOENT);
    f.write_all(b"after unlink").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before unlink;after unlink");
    let st = f.metadata().unwrap();
    assert_eq!(st.nlink(), 0);
    assert_eq!(st.len(), 26);
    // setattr on the unlinked file through the fd.
    f.set_len(6).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .unwrap();
    let st = f.metadata().unwrap();
    assert_eq!((st.len(), st.mode() & 0o7777), (6, 0o600));
    let mut buf = [0u8; 6];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before");
    // A new file with the same name is a different file.
    fs::write(&p, "fresh").unwrap();
    assert_eq!(fs::read(m.src.join("doomed")).unwrap(), b"fresh");
    assert_ne!(lstat(&p).st_ino, f.metadata().unwrap().ino());
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"before");
    // A directory removed while a process has it as cwd-like open fd.
    fs::create_dir(m.mnt.join("gone")).unwrap();
    let d = File::open(m.mnt.join("gone")).unwrap();
    fs::remove_dir(m.mnt.join("gone")).unwrap();
    assert_eq!(d.metadata().unwrap().nlink(), 0);
}

fn forgets_after_drop_caches(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);
    for d in 0..10 {
        fs::create_dir(mn.join(format!("d{d}"))).unwrap();
        for f in 0..50 {
            fs::write(mn.join(format!("d{d}/f{f}")), format!("{d}/{f}")).unwrap();
        }
    }
    fs::hard_link(mn.join("d0/f0"), mn.join("d9/link")).unwrap();
    let mut held = OpenOptions::new()
        .read(true)
        .append(true)
        .open(mn.join("d3/f7"))
        .unwrap();
    let inos: Vec<u64> = (0..10)
        .map(|d| lstat(&mn.join(format!("d{d}/f1"))).st_ino)
        .collect();

    for round in 0..3 {
        // Many lookups, then the kernel forgets all it can.
        for d in 0..10 {
            for f in 0..50 {
                fs::metadata(mn.join(format!("d{d}/f{f}"))).unwrap();
            }
        }
        drop_caches();
        // Everything still works after the forgets.
        for d in 0..10 {
            for f in 0..50 {
                let want = if (d, f) == (3, 7) {
                    format!("3/7{}", "+".repeat(round))
                } else {
                    format!("{d}/{f}")
                };
                assert_eq!(
                    fs::read_to_string(mn.join(format!("d{d}/f{f}"))).unwrap(),
                    want,
                    "d{d}/f{f} in round {round}"
                );
            }
        }
        held.write_all(b"+").unwrap();
        assert_eq!(
            lstat(&mn.join("d0/f0")).st_ino,
            lstat(&mn.join("d9/link")).st_ino
        );
        assert_eq!(lstat(&mn.join("d9/link")).st_nlink, 2);
    }
    // Inode numbers of objects the kernel forgot and looked up again: unchanged, and
    // SRC's own.
    let again: Vec<u64> = (0..10)
        .map(|d| lstat(&mn.join(format!("d{d}/f1"))).st_ino)
        .collect();
    assert_eq!(again, inos, "inode numbers changed across forgets");
    let in_src: Vec<u64> = (0..10)
        .map(|d| lstat(&sr.join(format!("d{d}/f1"))).st_ino)
        .collect();
    assert_eq!(again, in_src, "inode numbers MNT vs SRC");
    // Changes after the forgets.
    fs::rename(mn.join("d3"), mn.join("d3r")).unwrap();
    held.write_all(b"!").unwrap();
    assert_eq!(fs::read_to_string(sr.join("d3r/f7")).unwrap(), "3/7+++!");
    fs::remove_dir_all(mn.join("d5")).unwrap();
    drop_caches();
    fs::create_dir(mn.join("d5")).unwrap();
    fs::write(mn.join("d5/new"), "new").unwrap();
    assert_eq!(tree_listing(mn), tree_listing(sr));
    let log = m.daemon_log();
    assert!(!log.contains("forget of unknown inode"), "{log}");
    assert!(process_alive(m.pid().unwrap()), "daemon died");
}

fn names_via_read_dir(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Sorted; panics on duplicates.
fn sorted_unique(mut names: Vec<String>, what: &str) -> Vec<String> {
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "{what}: duplicate names");
    names
}

fn readdir_2000_entries(args: &[&str]) {
    let m = TestMount::with_args(args);
    let big = m.mnt.join("big");
    fs::create_dir(&big).unwrap();
    for i in 0..2000 {
        // Varying name lengths so entries straddle reply buffers at odd places.
        let name = format!("e{i:04}_{}", "n".repeat(i % 120));
        match i % 40 {
            0 => fs::create_dir(big.join(&name)).unwrap(),
            1 => symlink("target", big.join(&name)).unwrap(),
            _ => fs::write(big.join(&name), "").unwrap(),
        }
    }
    let want = sorted_unique(names_via_read_dir(&m.src.join("big")), "SRC");
    assert_eq!(want.len(), 2000);

    // Cold (after forgets: readdirplus from the start), then warm (plain readdir for
    // later batches with READDIRPLUS_AUTO), then through the tools.
    drop_caches();
    assert_eq!(
        sorted_unique(names_via_read_dir(&big), "cold read_dir"),
        want
    );
    assert_eq!(
        sorted_unique(names_via_read_dir(&big), "warm read_dir"),
        want
    );
    let ls: Vec<String> = sh(&big, "ls -f")
        .lines()
        .filter(|l| *l != "." && *l != "..")
        .map(String::from)
        .collect();
    assert_eq!(sorted_unique(ls, "ls -f"), want);
    let find: Vec<String> = sh(&m.mnt, "find big -mindepth 1 -maxdepth 1 -printf '%f\\n'")
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(sorted_unique(find, "find"), want);
    let py = "import os\nfor e in os.scandir('big'): print(e.name)\n";
    let out = run("python3", &["-c", py], &m.mnt);
    assert!(out.status.success(), "{}", stderr(&out));
    let scandir: Vec<String> = stdout(&out).lines().map(String::from).collect();
    assert_eq!(sorted_unique(scandir, "os.scandir"), want);

    // d_type and d_ino from readdir agree with lstat through the mount. The listing is
    // read to the end before any lookup: with READDIRPLUS_AUTO the kernel then asks for
    // the batches after the first with plain READDIR (a lookup in between would switch
    // it back to READDIRPLUS), so both paths are covered.
    for cold in [true, false] {
        if cold {
            drop_caches();
        }
        let listed: Vec<_> = fs::read_dir(&big)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path(), e.ino(), e.file_type().unwrap())
            })
            .collect();
        assert_eq!(listed.len(), 2000);
        for (path, ino, kind) in listed {
            let st = fs::symlink_metadata(&path).unwrap();
            assert_eq!(kind, st.file_type(), "d_type of {path:?}");
            assert_eq!(ino, st.ino(), "d_ino vs st_ino of {path:?} (cold: {cold})");
        }
    }
    // And for the dot entries (`ls -fi` lists them with their d_ino).
    let dots: Vec<(u64, String)> = sh(&big, "ls -fi")
        .lines()
        .filter_map(|l| {
            let (ino, name) = l.trim().split_once(' ')?;
            Some((ino.parse().ok()?, name.to_string()))
        })
        .filter(|(_, n)| n == "." || n == "..")
        .collect();
    let want_dots = [
        (lstat(&big).st_ino, ".".to_string()),
        (lstat(&m.mnt).st_ino, "..".to_string()),
    ];
    assert_eq!(
        dots.iter().cloned().collect::<BTreeSet<_>>(),
        want_dots.into_iter().collect::<BTreeSet<_>>(),
        "d_ino of . and .."
    );
}

// ---- .checkpoint -----------------------------------------------------------------------

fn control_dir_is_hidden_and_protected(args: &[&str]) {
    let m = TestMount::with_args(args);
    let (mn, sr) = (&m.mnt, &m.src);
    fs::write(mn.join("needle.txt"), "needle-xyzzy\n").unwrap();
    fs::create_dir(mn.join("sub")).unwrap();
    m.ctl("c1").unwrap();
    // The checkpoint's view has the file too: tools must not descend there.
    assert!(mn.join(".checkpoint/at/c1/needle.txt").exists());

    let ls = sh(mn, "ls -a");
    assert!(ls.lines().any(|l| l == "needle.txt"), "{ls}");
    assert!(!ls.contains(".checkpoint"), "ls -a shows it: {ls}");
    assert!(!names_via_read_dir(mn).iter().any(|n| n == ".checkpoint"));
    let find = sh(mn, "find .");
    assert!(!find.contains(".checkpoint"), "find descends: {find}");
    assert!(find.lines().any(|l| l == "./needle.txt"), "{find}");
    let grep = sh(mn, "grep -r needle-xyzzy .");
    assert_eq!(
        grep.lines().collect::<Vec<_>>(),
        ["./needle.txt:needle-xyzzy"]
    );

    // Looked up by name, it is there.
    let st = fs::metadata(mn.join(".checkpoint")).unwrap();
    assert!(st.is_dir());
    assert!(mn.join(".checkpoint/ctl").exists());

    // No way to create, replace, rename or remove it at the root.
    assert!(fs::create_dir(mn.join(".checkpoint")).is_err());
    assert!(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(mn.join(".checkpoint"))
            .is_err()
    );
    assert!(File::create(mn.join(".checkpoint")).is_err());
    assert!(fs::rename(mn.join("needle.txt"), mn.join(".checkpoint")).is_err());
    assert!(fs::rename(mn.join("sub"), mn.join(".checkpoint")).is_err());
    assert!(fs::rename(mn.join(".checkpoint"), mn.join("elsewhere")).is_err());
    assert!(
        renameat2(
            &mn.join("sub"),
            &mn.join(".checkpoint"),
            libc::RENAME_EXCHANGE
        )
        .is_err()
    );
    assert!(fs::remove_dir(mn.join(".checkpoint")).is_err());
    assert!(fs::remove_file(mn.join(".checkpoint")).is_err());
    assert!(symlink("x", mn.join(".checkpoint")).is_err());
    assert!(fs::hard_link(mn.join("needle.txt"), mn.join(".checkpoint")).is_err());
    assert!(mknod(&mn.join(".checkpoint"), libc::S_IFIFO | 0o644, 0).is_err());
    assert!(
        fs::metadata(mn.join(".checkpoint/ctl")).is_ok(),
        "control dir damaged"
    );
    assert!(
        fs::symlink_metadata(sr.join(".checkpoint")).is_err(),
        "SRC got one"
    );
    assert!(sr.join("needle.txt").exists() && sr.join("sub").is_dir());
    assert!(!sr.join("elsewhere").exists());

    // Below the root, `.checkpoint` is an ordinary name.
    fs::create_dir(mn.join("sub/.checkpoint")).unwrap();
    fs::write(mn.join("sub/.checkpoint/f"), "ordinary").unwrap();
    assert_eq!(fs::read(sr.join("sub/.checkpoint/f")).unwrap(), b"ordinary");
    assert!(
        sh(&mn.join("sub"), "ls -a")
            .lines()
            .any(|l| l == ".checkpoint")
    );
    fs::rename(mn.join("sub/.checkpoint"), mn.join("sub/renamed")).unwrap();
    assert!(sr.join("sub/renamed/f").exists());
}

fn control_dir_shadows_source_entry(args: &[&str]) {
    let mut m = TestMount::unmounted(args);
    fs::create_dir(m.src.join(".checkpoint")).unwrap();
    fs::write(m.src.join(".checkpoint/mine"), "keep me").unwrap();
    fs::write(m.src.join("other"), "o").unwrap();
    m.mount();
    let log = m.daemon_log();
    assert!(
        log.contains(".checkpoint exists in the source") && log.contains("hidden"),
        "no warning in daemon.log:\n{log}"
    );
    // The mount's control dir, not SRC's entry.
    assert!(m.mnt.join(".checkpoint/ctl").exists());
    assert!(!m.mnt.join(".checkpoint/mine").exists());
    assert!(
        !names_via_read_dir(&m.mnt)
            .iter()
            .any(|n| n == ".checkpoint")
    );
    assert!(fs::remove_dir_all(m.mnt.join(".checkpoint")).is_err());
    fs::write(m.mnt.join("other"), "changed").unwrap();
    m.ctl("c1").unwrap();
    m.remount();
    assert_eq!(
        fs::read_to_string(m.src.join(".checkpoint/mine")).unwrap(),
        "keep me"
    );
    assert_eq!(names_via_read_dir(&m.src.join(".checkpoint")), ["mine"]);
    assert!(m.mnt.join(".checkpoint/at/c1").is_dir());
    assert_eq!(fs::read(m.src.join("other")).unwrap(), b"changed");
}

// ---- real tools ------------------------------------------------------------------------

/// A tree with the usual kinds of entries, outside the mount.
fn fixture(dir: &Path) {
    fs::create_dir_all(dir.join("src/nested/deeper")).unwrap();
    fs::create_dir(dir.join("empty")).unwrap();
    fs::write(dir.join("README"), "readme\n").unwrap();
    fs::write(dir.join("src/main.c"), "int main(void) { return 0; }\n").unwrap();
    fs::write(dir.join("src/nested/deeper/data.bin"), pattern(300_000, 9)).unwrap();
    fs::write(dir.join("run.sh"), "#!/bin/sh\necho ok\n").unwrap();
    fs::set_permissions(dir.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(dir.join("src/main.c"), fs::Permissions::from_mode(0o600)).unwrap();
    symlink("README", dir.join("readme-link")).unwrap();
    symlink("src/nested", dir.join("dir-link")).unwrap();
    fs::hard_link(dir.join("README"), dir.join("README.hard")).unwrap();
    // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
    let r = unsafe { libc::mkfifo(c(&dir.join("pipe")).as_ptr(), 0o600) };
    assert_eq!(r, 0);
}

fn diff_r(a: &Path, b: &Path) {
    let out = run(
        "diff",
        &[
            "-r".as_ref(),
            "--no-dereference".as_ref(),
            // diff cannot compare FIFOs; tree_listing checks them.
            "-x".as_ref(),
            "pipe".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
        ],
        Path::new("/"),
    );
    assert!(
        out.status.success(),
        "diff -r {a:?} {b:?}:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
}

fn real_tools_cp_tar_sed_python(args: &[&str]) {
    let m = TestMount::with_args(args);
    let fix = m.root().join("fixture");
    fixture(&fix);
    let want = tree_listing(&fix);

    // cp -a into the mount.
    let copy = m.mnt.join("copy");
    let out = run(
        "cp",
        &["-a".as_ref(), fix.as_os_str(), copy.as_os_str()],
        Path::new("/"),
    );
    assert!(out.status.success(), "cp -a: {}", stderr(&out));
    diff_r(&fix, &m.mnt.join("copy"));
    diff_r(&fix, &m.src.join("copy"));
    assert_eq!(tree_listing(&m.mnt.join("copy")), want);
    assert_eq!(tree_listing(&m.src.join("copy")), want);
    // cp -a kept times and the hard link.
    let (a, b) = (
        lstat(&fix.join("src/main.c")),
        lstat(&m.src.join("copy/src/main.c")),
    );
    assert_eq!((a.st_mtime, a.st_mtime_nsec), (b.st_mtime, b.st_mtime_nsec));
    assert_eq!(
        lstat(&m.mnt.join("copy/README")).st_ino,
        lstat(&m.mnt.join("copy/README.hard")).st_ino
    );

    // tar c from the mount, tar x into the mount.
    let tarball = m.root().join("t.tar");
    sh(&m.mnt, &format!("tar cf {} copy", tarball.display()));
    fs::create_dir(m.mnt.join("untar")).unwrap();
    sh(
        &m.mnt.join("untar"),
        &format!("tar xpf {}", tarball.display()),
    );
    diff_r(&fix, &m.mnt.join("untar/copy"));
    assert_eq!(tree_listing(&m.src.join("untar/copy")), want);
    // And an archive written into the mount, extracted outside.
    sh(&m.mnt, "tar cf inside.tar copy");
    let outside = m.root().join("outside");
    fs::create_dir(&outside).unwrap();
    sh(
        &outside,
        &format!("tar xpf {}", m.mnt.join("inside.tar").display()),
    );
    assert_eq!(tree_listing(&outside.join("copy")), want);

    // sed -i (temp file + rename).
    fs::write(m.mnt.join("s.txt"), "one\ntwo\nthree\n").unwrap();
    sh(&m.mnt, "sed -i 's/two/TWO/' s.txt");
    assert_eq!(
        fs::read_to_string(m.src.join("s.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );
    assert_eq!(
        fs::read_to_string(m.mnt.join("s.txt")).unwrap(),
        "one\nTWO\nthree\n"
    );

    // python: atomic replace via a temp file.
    fs::write(m.mnt.join("config.json"), "{\"v\": 1}").unwrap();
    let py = "import os\n\
              with open('config.json.tmp', 'w') as f:\n    f.write('{\"v\": 2}')\n    f.flush()\n    os.fsync(f.fileno())\n\
              os.replace('config.json.tmp', 'config.json')\n\
              print(open('config.json').read())\n";
    let out = run("python3", &["-c", py], &m.mnt);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "{\"v\": 2}");
    assert_eq!(
        fs::read_to_string(m.src.join("config.json")).unwrap(),
        "{\"v\": 2}"
    );
    assert!(!m.src.join("config.json.tmp").exists());

    // No stray temp files anywhere; the whole tree agrees.
    assert_eq!(tree_listing(&m.mnt), tree_listing(&m.src));
}

fn git(dir: &Path, home: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?} in {dir:?}: {}",
        stderr(&out)
    );
    stdout(&out)
}

fn git_in_the_mount(args: &[&str]) {
    let m = TestMount::with_args(args);
    let home = m.root();
    let repo = m.mnt.join("repo");
    let srepo = m.src.join("repo");
    fs::create_dir(&repo).unwrap();
    git(&repo, &home, &["init", "-q"]);
    fixture(&repo.join("tree"));
    fs::remove_file(repo.join("tree/pipe")).unwrap();
    fs::write(repo.join("a.txt"), "a\n").unwrap();
    fs::write(repo.join("b.txt"), "b\n").unwrap();
    git(&repo, &home, &["add", "-A"]);
    git(&repo, &home, &["commit", "-q", "-m", "first"]);
    assert_eq!(git(&repo, &home, &["status", "--porcelain"]), "");
    // The same repo seen in SRC is clean too (without refreshing SRC's index).
    assert_eq!(
        git(
            &srepo,
            &home,
            &["--no-optional-locks", "status", "--porcelain"]
        ),
        ""
    );

    // Some changes of every kind.
    fs::write(repo.join("a.txt"), "a changed\n").unwrap();
    fs::remove_file(repo.join("b.txt")).unwrap();
    fs::write(repo.join("untracked.txt"), "u\n").unwrap();
    fs::rename(repo.join("tree/README"), repo.join("tree/README.moved")).unwrap();
    fs::write(repo.join("staged.txt"), "s\n").unwrap();
    git(&repo, &home, &["add", "staged.txt"]);
    let mnt_status = git(&repo, &home, &["status", "--porcelain"]);
    let src_status = git(
        &srepo,
        &home,
        &["--no-optional-locks", "status", "--porcelain"],
    );
    assert!(
        mnt_status.contains(" M a.txt") && mnt_status.contains("A  staged.txt"),
        "{mnt_status}"
    );
    assert_eq!(mnt_status, src_status, "git status MNT vs SRC");

    git(&repo, &home, &["add", "-A"]);
    git(&repo, &home, &["commit", "-q", "-m", "second"]);
    let log = git(&repo, &home, &["log", "--format=%s"]);
    assert_eq!(log, "second\nfirst\n");
    assert_eq!(git(&srepo, &home, &["log", "--format=%s"]), log);
    assert_eq!(git(&repo, &home, &["status", "--porcelain"]), "");
    assert_eq!(
        git(
            &srepo,
            &home,
            &["--no-optional-locks", "status", "--porcelain"]
        ),
        ""
    );
    git(&repo, &home, &["fsck", "--strict", "--no-progress"]);
    // Checking out the first commit again restores its files.
    git(&repo, &home, &["checkout", "-q", "HEAD~1"]);
    assert_eq!(fs::read_to_string(srepo.join("b.txt")).unwrap(), "b\n");
    assert_eq!(fs::read_to_string(srepo.join("a.txt")).unwrap(), "a\n");
}

// ---- other users -----------------------------------------------------------------------

/// Runs `f` in a child process running as uid/gid 65534 without supplementary groups;
/// returns its result (the child's error reaches us through `spawn`'s error).
fn as_nobody(
    cwd: &Path,
    f: impl FnMut() -> io::Result<()> + Send + Sync + 'static,
) -> io::Result<()> {
    let mut f = f;
    let mut cmd = Command::new("/bin/true");
    cmd.current_dir(cwd);
    // SAFETY: the closure calls only async-signal-safe setgroups/setgid/setuid in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(io::Error::last_os_error());
            }
            f()
        });
    }
    let status = cmd.status()?;
    assert!(status.success());
    Ok(())
}

fn creation_as_another_user(args: &[&str]) {
    let mut all = args.to_vec();
    all.push("--allow-other");
    let m = TestMount::with_args(&all);
    // The temporary directory is 0700: let others reach MNT.
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let shared = m.mnt.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(shared.join("rootfile"), "root's\n").unwrap();
    fs::set_permissions(shared.join("rootfile"), fs::Permissions::from_mode(0o644)).unwrap();

    let out = run(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            "echo hi > f && mkdir d && ln -s f l && mkfifo p && echo in > d/inner && cat rootfile",
        ],
        &shared,
    );
    assert!(out.status.success(), "as 65534: {}", stderr(&out));
    assert_eq!(stdout(&out), "root's\n");
    for name in ["f", "d", "l", "p", "d/inner"] {
        let st = lstat(&m.src.join("shared").join(name));
        assert_eq!(
            (st.st_uid, st.st_gid),
            (65534, 65534),
            "owner of {name} in SRC"
        );
        let st = lstat(&shared.join(name));
        assert_eq!(
            (st.st_uid, st.st_gid),
            (65534, 65534),
            "owner of {name} in MNT"
        );
    }
    assert_eq!(fs::read(m.src.join("shared/f")).unwrap(), b"hi\n");

    // default_permissions: writing root's 0644 file is EACCES, and so is creating in a
    // root-owned 0755 directory.
    let rootfile = c(&shared.join("rootfile"));
    let r = as_nobody(&shared, move || {
        // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
        let fd = unsafe { libc::open(rootfile.as_ptr(), libc::O_WRONLY | libc::O_APPEND) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    });
    assert_eq!(errno(r), libc::EACCES);
    let newfile = c(&m.mnt.join("not-allowed"));
    let r = as_nobody(&shared, move || {
        // SAFETY: a NUL-terminated path that lives for the call; plain integer arguments.
        let fd = unsafe { libc::open(newfile.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o644) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    });
    assert_eq!(errno(r), libc::EACCES);
    let out = run(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            "echo x >> rootfile",
        ],
        &shared,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        fs::read(m.src.join("shared/rootfile")).unwrap(),
        b"root's\n"
    );
    assert!(!m.src.join("not-allowed").exists());
    // The other user may remove their own files from the sticky-less 0777 dir.
    let out = run(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
            "rm -r d f l p",
        ],
        &shared,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(names_via_read_dir(&m.src.join("shared")), ["rootfile"]);
}

/// The kernel leaves clearing setuid/setgid to the daemon (FUSE_HANDLE_KILLPRIV_V2): every
/// way of writing must clear them exactly as the VFS does on a local filesystem, in both IO
/// modes (with kernel passthrough the write itself never reaches the daemon).
fn writes_by_others_clear_setuid_and_setgid(args: &[&str]) {
    let mut all = args.to_vec();
    all.push("--allow-other");
    let m = TestMount::with_args(&all);
    fs::set_permissions(m.root(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = m.mnt.join("bits");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    // (file, mode, gid, who runs the command, command, mode expected afterwards)
    let cases: &[(&str, u32, u32, &str, &str, u32)] = &[
        ("append", 0o6777, 0, "nobody", "echo x >> append", 0o777),
        ("trunc", 0o6777, 0, "nobody", "truncate -s 1 trunc", 0o777),
        ("otrunc", 0o6777, 0, "nobody", "echo y > otrunc", 0o777),
        (
            "dd",
            0o4766,
            0,
            "nobody",
            "echo z | dd of=dd conv=notrunc status=none",
            0o766,
        ),
        // setgid without group-execute: kept for a member of the file's group only.
        (
            "sgid-other",
            0o2666,
            0,
            "nobody",
            "echo x >> sgid-other",
            0o666,
        ),
        (
            "sgid-member",
            0o2666,
            65534,
            "nobody",
            "echo x >> sgid-member",
            0o2666,
        ),
        // A caller with CAP_FSETID (root) keeps both bits.
        (
            "root",
            0o6777,
            0,
            "root",
            "echo x >> root; truncate -s 1 root",
            0o6777,
        ),
    ];
    for &(name, mode, gid, _, _, _) in cases {
        let path = dir.join(name);
        fs::write(&path, "content\n").unwrap();
        std::os::unix::fs::chown(&path, Some(0), Some(gid)).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
    for &(name, _, _, who, script, expected) in cases {
        let out = if who == "root" {
            run("sh", &["-c", script], &dir)
        } else {
            run(
                "setpriv",
                &[
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "sh",
                    "-c",
                    script,
                ],
                &dir,
            )
        };
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        for (place, path) in [
            ("MNT", dir.join(name)),
            ("SRC", m.src.join("bits").join(name)),
        ] {
            assert_eq!(
                lstat(&path).st_mode & 0o7777,
                expected,
                "{name}: mode in {place} after `{script}` as {who}"
            );
        }
    }
    // chgrp by the owner (not in the old group 0) to their own group: setgid with
    // group-execute is always cleared (by the backing filesystem), and without it too — the
    // one case the daemon's own chown (as root) would not clear.
    for (name, mode, expected) in [("chg", 0o2674, 0o674), ("chg2", 0o2664, 0o664)] {
        let script = format!("echo f > {name} && chown 65534:0 {name} && chmod {mode:o} {name}");
        let out = run("sh", &["-c", &script], &dir);
        assert!(out.status.success(), "{}", stderr(&out));
        let as_owner = [
            "--reuid=65534",
            "--regid=65534",
            "--groups=65534",
            "chgrp",
            "65534",
            name,
        ];
        let out = run("setpriv", &as_owner, &dir);
        assert!(out.status.success(), "chgrp {name}: {}", stderr(&out));
        let st = lstat(&m.src.join("bits").join(name));
        assert_eq!(st.st_mode & 0o7777, expected, "{name} after chgrp");
        assert_eq!(st.st_gid, 65534, "{name} after chgrp");
    }
}

// ---- logging ---------------------------------------------------------------------------

fn debug_log_shows_gate_lines(args: &[&str]) {
    let mut m = TestMount::unmounted(args);
    m.set_env("RUST_LOG", "debug");
    m.mount();
    fs::write(m.mnt.join("logged.txt"), "x").unwrap();
    fs::write(m.mnt.join("logged.txt"), "y").unwrap();
    let found = wait_until(Duration::from_secs(5), || {
        m.daemon_log()
            .lines()
            .any(|l| l.contains("gate:") && l.contains("logged.txt"))
    });
    assert!(found, "no gate: line for logged.txt:\n{}", m.daemon_log());
}

/// `--no-io-uring` is still accepted (scripts written for earlier versions pass it) and
/// changes nothing: requests travel over /dev/fuse either way.
#[test]
fn no_io_uring_is_accepted_and_changes_nothing() {
    let m = TestMount::with_args(&["--no-io-uring"]);
    fs::write(m.mnt.join("f"), "over /dev/fuse").unwrap();
    assert_eq!(
        fs::read_to_string(m.mnt.join("f")).unwrap(),
        "over /dev/fuse"
    );
    assert_eq!(
        fs::read_to_string(m.src.join("f")).unwrap(),
        "over /dev/fuse"
    );
}

/// Eight threads at once, each creating, writing (sizes up to 1 MiB, so replies and payloads
/// of every size cross the transport), reading back, renaming, listing and deleting its own
/// files, while the mount's queues serve them all: every byte must come back as written and
/// SRC must end up as the threads left it.
fn concurrent_clients(args: &[&str]) {
    let m = TestMount::with_args(args);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let dir = m.mnt.join(format!("t{t}"));
            std::thread::spawn(move || {
                fs::create_dir(&dir).unwrap();
                for i in 0..40u32 {
                    let len = [0usize, 1, 4095, 4096, 65_537, 1 << 20][(i % 6) as usize];
                    let data: Vec<u8> = (0..len).map(|k| (k as u32 ^ i ^ (t << 8)) as u8).collect();
                    let p = dir.join(format!("f{i}"));
                    fs::write(&p, &data).unwrap();
                    assert_eq!(fs::read(&p).unwrap(), data, "{}", p.display());
                    let q = dir.join(format!("g{i}"));
                    fs::rename(&p, &q).unwrap();
                    assert_eq!(fs::metadata(&q).unwrap().len(), len as u64);
                    if i % 2 == 0 {
                        fs::remove_file(&q).unwrap();
                    }
                    // The odd-numbered files stay.
                    assert_eq!(
                        fs::read_dir(&dir).unwrap().count(),
                        (i as usize).div_ceil(2)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    for t in 0..8 {
        let mut names: Vec<String> = fs::read_dir(m.src.join(format!("t{t}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        let mut want: Vec<String> = (0..40)
            .filter(|i| i % 2 == 1)
            .map(|i| format!("g{i}"))
            .collect();
        want.sort();
        assert_eq!(names, want, "t{t}");
    }
}
