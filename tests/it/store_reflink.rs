//! The store's reflink path on real copy-on-write filesystems: a btrfs and an XFS loop image.
//!
//! Needs root (loop devices and mount) and the mkfs tools: `mkfs.btrfs` from the Debian
//! package `btrfs-progs`, `mkfs.xfs` from `xfsprogs`. A missing tool FAILS the test with the
//! package to install (CI installs both): a reflink test that quietly passes without running
//! would hide exactly the regression it exists for. Without root the tests are skipped with a
//! printed note, as loop mounts are impossible then.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]

use crate::common::sha256_hex;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use checkpointfs::{CopyMethod, Store};

/// mkfs.xfs refuses images smaller than 300 MiB; btrfs is happy with it too. Sparse, so it
/// costs almost no disk.
const IMAGE_SIZE: u64 = 300 << 20;

#[derive(Clone, Copy, Debug)]
enum Fs {
    Btrfs,
    Xfs,
}

impl Fs {
    fn name(self) -> &'static str {
        match self {
            Fs::Btrfs => "btrfs",
            Fs::Xfs => "xfs",
        }
    }
    fn mkfs(self) -> &'static str {
        match self {
            Fs::Btrfs => "mkfs.btrfs",
            Fs::Xfs => "mkfs.xfs",
        }
    }
    fn package(self) -> &'static str {
        match self {
            Fs::Btrfs => "btrfs-progs",
            Fs::Xfs => "xfsprogs",
        }
    }
    fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            Fs::Btrfs => &["-q", "-f"],
            Fs::Xfs => &["-q", "-f", "-m", "reflink=1"],
        }
    }
}

/// A loop device with (maybe) a filesystem mounted from it. Drop unmounts (lazily if a plain
/// umount fails) and detaches the loop device, so a failing test leaves no mount behind.
struct LoopMount {
    mountpoint: PathBuf,
    device: String,
    mounted: bool,
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted && !run_quiet("umount", &[self.mountpoint.as_os_str()]) {
            let _ = run_quiet("umount", &["-l".as_ref(), self.mountpoint.as_os_str()]);
        }
        // Detaching an already auto-cleared device fails harmlessly.
        let _ = run_quiet("losetup", &["-d".as_ref(), self.device.as_ref()]);
    }
}

/// A mounted test filesystem. Field order matters: the mount is dropped (unmounted) before
/// the temp dir holding the image and the mountpoint is removed.
struct Fixture {
    mount: LoopMount,
    _tmp: tempfile::TempDir,
}

impl Fixture {
    fn root(&self) -> &Path {
        &self.mount.mountpoint
    }
}

fn run_quiet(prog: &str, args: &[&std::ffi::OsStr]) -> bool {
    Command::new(prog)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Runs a setup command and panics with its output if it fails.
fn run_checked(prog: &Path, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", prog.display()));
    assert!(
        out.status.success(),
        "{} {:?} failed ({}): {}",
        prog.display(),
        args,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Finds a tool on PATH or in the sbin directories (which a non-login PATH may lack).
fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn require_tool(name: &str, package: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| {
        panic!(
            "`{name}` not found: install the Debian package `{package}` \
             (apt-get install -y {package}); CI installs it, and this test must not pass \
             without running"
        )
    })
}

/// Makes, mounts and returns a fresh filesystem of `fs` (needs root, as every mounting test
/// here). Panics with a clear message on anything that goes wrong.
fn mount_fresh(fs: Fs) -> Fixture {
    // SAFETY: geteuid has no preconditions.
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "the {} reflink test needs root (loop mounts): run the tests as root, as \
         scripts/test.sh does",
        fs.name()
    );
    let mkfs = require_tool(fs.mkfs(), fs.package());
    let losetup = require_tool("losetup", "mount");
    let mount = require_tool("mount", "mount");

    let tmp = tempfile::tempdir().expect("tempdir");
    let image = tmp.path().join(format!("{}.img", fs.name()));
    File::create(&image)
        .and_then(|f| f.set_len(IMAGE_SIZE))
        .expect("create sparse image");
    let mut mkfs_args: Vec<&std::ffi::OsStr> = fs.mkfs_args().iter().map(|a| a.as_ref()).collect();
    mkfs_args.push(image.as_os_str());
    run_checked(&mkfs, &mkfs_args);

    let mountpoint = tmp.path().join("mnt");
    std::fs::create_dir(&mountpoint).expect("mkdir mountpoint");
    let device = run_checked(
        &losetup,
        &["--find".as_ref(), "--show".as_ref(), image.as_os_str()],
    );
    assert!(device.starts_with("/dev/"), "losetup printed {device:?}");
    // From here on the guard owns the loop device, even if mounting fails.
    let mut guard = LoopMount {
        mountpoint,
        device,
        mounted: false,
    };
    run_checked(
        &mount,
        &[
            "-t".as_ref(),
            fs.name().as_ref(),
            guard.device.as_ref(),
            guard.mountpoint.as_os_str(),
        ],
    );
    guard.mounted = true;
    Fixture {
        mount: guard,
        _tmp: tmp,
    }
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn write_file(path: &Path, data: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(path, data).expect("write source");
}

/// The shared scenario: a project file and the store live on the same CoW filesystem, so a
/// put must reflink, name the object by its content, and stay independent of later writes.
fn reflink_scenario(fx: &Fixture) {
    let project = fx.root().join("project");
    let store = Store::open(&fx.root().join("state").join("backups")).expect("open store");

    // Not a multiple of the block size, and bigger than the 1 MiB hash buffer.
    let data = pseudo_random((3 << 20) + 777, 42);
    let src_path = project.join("big.bin");
    write_file(&src_path, &data);
    let src = File::open(&src_path).expect("open source");

    let obj = store.put_file(&src).expect("put_file");
    assert_eq!(obj.method, CopyMethod::Reflink, "{obj:?}");
    assert!(!obj.reused);
    assert_eq!(obj.size, data.len() as u64);
    assert_eq!(obj.name, sha256_hex(&data));
    assert!(
        store.read_object(&obj.name).expect("read object") == data,
        "reflinked object differs from the source"
    );
    assert!(store.verify(&obj.name).expect("verify"));

    // Overwrite the source in place: the clone must keep the pre-image (that is the backup).
    let writer = OpenOptions::new()
        .write(true)
        .open(&src_path)
        .expect("open source for writing");
    writer
        .write_all_at(b"CHANGED AFTER BACKUP", 4096)
        .expect("modify source");
    writer.sync_all().expect("sync source");
    assert!(
        store.read_object(&obj.name).expect("read object") == data,
        "writing the source changed the stored pre-image"
    );
    let modified = std::fs::read(&src_path).expect("read modified source");
    let obj2 = store.put_file(&src).expect("put modified");
    assert_eq!(obj2.method, CopyMethod::Reflink);
    assert_eq!(obj2.name, sha256_hex(&modified));
    assert_ne!(obj2.name, obj.name);

    // The original content again, from another file: deduplicated.
    let copy_path = project.join("copy.bin");
    write_file(&copy_path, &data);
    let again = store
        .put_file(&File::open(&copy_path).expect("open copy"))
        .expect("put copy");
    assert_eq!(again.name, obj.name);
    assert!(again.reused);
    assert_eq!(again.method, CopyMethod::Existing);

    // A tiny file (btrfs may keep it inline in metadata) and an empty one.
    let small_path = project.join("small.txt");
    write_file(&small_path, b"tiny\n");
    let small = store
        .put_file(&File::open(&small_path).expect("open small"))
        .expect("put small");
    assert_eq!(small.name, sha256_hex(b"tiny\n"));
    assert_eq!(
        store.read_object(&small.name).expect("read small"),
        b"tiny\n"
    );
    let empty_path = project.join("empty");
    write_file(&empty_path, b"");
    let empty = store
        .put_file(&File::open(&empty_path).expect("open empty"))
        .expect("put empty");
    assert_eq!(empty.name, sha256_hex(b""));
    assert_eq!(empty.size, 0);

    let mut expected = vec![obj.name, obj2.name, small.name, empty.name];
    expected.sort();
    assert_eq!(store.list().expect("list"), expected);
}

#[test]
fn btrfs_put_file_on_same_filesystem_uses_reflink() {
    let fx = mount_fresh(Fs::Btrfs);
    reflink_scenario(&fx);
}

#[test]
fn xfs_put_file_on_same_filesystem_uses_reflink() {
    let fx = mount_fresh(Fs::Xfs);
    reflink_scenario(&fx);
}

#[test]
fn btrfs_put_file_into_store_on_another_filesystem_falls_back_to_copy() {
    let fx = mount_fresh(Fs::Btrfs);
    let data = pseudo_random((2 << 20) + 5, 7);
    let src_path = fx.root().join("project").join("f.bin");
    write_file(&src_path, &data);
    // The store is on the disk that holds the temp dir, not on the btrfs: FICLONE gets EXDEV.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&elsewhere.path().join("backups")).expect("open store");
    let obj = store
        .put_file(&File::open(&src_path).expect("open source"))
        .expect("put_file");
    assert_eq!(obj.method, CopyMethod::Copy, "{obj:?}");
    assert_eq!(obj.name, sha256_hex(&data));
    assert!(store.read_object(&obj.name).expect("read") == data);
}
