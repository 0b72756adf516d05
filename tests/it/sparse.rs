//! Sparse files on a real mount: a 1-byte write into a 1 GiB hole costs the store a few
//! blocks, not a gigabyte; views answer `SEEK_DATA`/`SEEK_HOLE`; a rewind leaves the file
//! sparse and byte-exact.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::{TestMount, at, checkpoint, rewind};
use sha2::{Digest, Sha256};

const GIB: u64 = 1 << 30;
const OFFSET: u64 = 512 << 20;
/// The most a 1-byte change into a hole may add to the store (issue 10).
const BUDGET: u64 = 4 << 20;

/// Bytes allocated (st_blocks × 512) by every file under `dir`.
fn allocated_under(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in fs::read_dir(dir).expect("read_dir") {
        let entry = entry.expect("entry");
        let meta = entry.metadata().expect("stat");
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += allocated_under(&entry.path());
        }
    }
    total
}

fn sha_of(path: &Path) -> String {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    base16ct::lower::encode_string(&hasher.finalize())
}

/// The SHA-256 of `len` zero bytes with `byte` at `at` (if any).
fn expected_sha(len: u64, byte: Option<(u64, u8)>) -> String {
    let zeros = vec![0u8; 1 << 20];
    let mut hasher = Sha256::new();
    let mut off = 0;
    while off < len {
        let n = (len - off).min(zeros.len() as u64);
        match byte {
            Some((at, b)) if (off..off + n).contains(&at) => {
                let mut chunk = zeros[..n as usize].to_vec();
                chunk[(at - off) as usize] = b;
                hasher.update(&chunk);
            }
            _ => hasher.update(&zeros[..n as usize]),
        }
        off += n;
    }
    base16ct::lower::encode_string(&hasher.finalize())
}

fn seek_data(path: &Path, from: i64) -> Result<i64, i32> {
    let f = File::open(path).expect("open for lseek");
    // SAFETY: `f` is an open fd; lseek touches no memory of ours.
    let r = unsafe { libc::lseek(f.as_raw_fd(), from, libc::SEEK_DATA) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn assert_sparse(path: &Path, what: &str) {
    let meta = fs::metadata(path).expect("stat");
    assert_eq!(meta.len(), GIB, "{what}: size");
    assert!(
        meta.blocks() * 512 <= BUDGET,
        "{what}: {} bytes allocated, the file was made dense",
        meta.blocks() * 512
    );
}

fn one_byte_into_a_gib_hole(args: &[&str]) {
    let mut m = TestMount::unmounted(args);
    File::create(m.src.join("f"))
        .and_then(|f| f.set_len(GIB))
        .expect("truncate -s 1G");
    m.mount();
    checkpoint(&m, "hole");
    let before = allocated_under(&m.state.join("backups"));

    OpenOptions::new()
        .write(true)
        .open(m.mnt.join("f"))
        .and_then(|f| f.write_all_at(b"!", OFFSET))
        .expect("write 1 byte at 512 MiB");
    checkpoint(&m, "byte");

    let with_byte = expected_sha(GIB, Some((OFFSET, b'!')));
    let zeros = expected_sha(GIB, None);
    // Reading the views also makes sure the background copy of `byte` is in the store.
    assert_eq!(sha_of(&at(&m, "hole").join("f")), zeros, "view at/hole");
    assert_eq!(sha_of(&at(&m, "byte").join("f")), with_byte, "view at/byte");
    let added = allocated_under(&m.state.join("backups")) - before;
    assert!(
        added <= BUDGET,
        "a 1-byte write into a 1 GiB hole added {added} bytes to the store"
    );
    // Views answer SEEK_DATA from the object, so sparse-aware copies keep the holes.
    let data = seek_data(&at(&m, "byte").join("f"), 0).expect("SEEK_DATA in at/byte");
    assert!(
        (OFFSET as i64 - 65536..=OFFSET as i64).contains(&data),
        "SEEK_DATA in at/byte: {data}"
    );
    assert_eq!(
        seek_data(&at(&m, "hole").join("f"), 0),
        Err(libc::ENXIO),
        "at/hole has no data"
    );

    rewind(&m, "hole", &[]);
    assert_sparse(&m.src.join("f"), "after rewind to hole");
    assert_eq!(
        sha_of(&m.mnt.join("f")),
        zeros,
        "content after rewind to hole"
    );
    rewind(&m, "byte", &[]);
    assert_sparse(&m.src.join("f"), "after rewind to byte");
    assert_eq!(
        sha_of(&m.mnt.join("f")),
        with_byte,
        "content after rewind to byte"
    );
    let added = allocated_under(&m.state.join("backups")) - before;
    assert!(
        added <= BUDGET,
        "two rewinds of a 1 GiB sparse file brought the store to {added} added bytes"
    );
}

#[test]
fn one_byte_into_a_gib_hole_stays_small_and_sparse() {
    one_byte_into_a_gib_hole(&[]);
}

#[test]
fn one_byte_into_a_gib_hole_without_passthrough() {
    one_byte_into_a_gib_hole(&["--no-passthrough"]);
}
