//! Comparing file contents in bounded memory, for `diff` and `log`.
//!
//! A file's size costs its maker nothing when it is sparse (a 4 GiB file of holes takes no
//! disk), so nothing here holds a file in memory: two buffers of [`CHUNK`] bytes are all a
//! comparison needs, and a range that is a hole in both files is skipped unread (holes read
//! as zeros, so two holes are equal).
use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use crate::sys;

/// The most of each file held in memory at once.
const CHUNK: usize = 1 << 20;

/// The offset of the first data at or after `off` in `file`, `end` if none before it.
fn next_data(file: &File, off: u64, end: u64) -> io::Result<u64> {
    if off >= end {
        return Ok(end);
    }
    match sys::lseek(file.as_fd(), off as i64, libc::SEEK_DATA) {
        Ok(at) => Ok((at as u64).min(end)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(end),
        Err(e) => Err(e),
    }
}

/// The offset of the first hole at or after `off` (data at `off`), at most `end`.
fn next_hole(file: &File, off: u64, end: u64) -> io::Result<u64> {
    match sys::lseek(file.as_fd(), off as i64, libc::SEEK_HOLE) {
        Ok(at) => Ok((at as u64).min(end)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(end),
        Err(e) => Err(e),
    }
}

/// Fills `buf` from `file` at `off`; what lies past its end (it shrank meanwhile) reads as
/// zeros, as a hole does.
fn read_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match sys::pread(file.as_fd(), &mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(())
}

/// How many bytes differ between `a` and `b`: bytes at the same offset that differ, plus
/// the difference of their lengths. 0 means equal. Holes in both are not read.
pub fn bytes_changed(a: &File, b: &File) -> io::Result<u64> {
    let (len_a, len_b) = (a.metadata()?.len(), b.metadata()?.len());
    let common = len_a.min(len_b);
    let mut changed = len_a.max(len_b) - common;
    let (mut buf_a, mut buf_b) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut off = 0;
    while off < common {
        let (data_a, data_b) = (next_data(a, off, common)?, next_data(b, off, common)?);
        let start = data_a.min(data_b);
        if start >= common {
            break;
        }
        // Up to where either file switches between data and hole, one chunk at most.
        let end_a = match data_a == start {
            true => next_hole(a, start, common)?,
            false => data_a,
        };
        let end_b = match data_b == start {
            true => next_hole(b, start, common)?,
            false => data_b,
        };
        let end = end_a.min(end_b).min(start + CHUNK as u64);
        let n = (end - start) as usize;
        for (file, has_data, buf) in [
            (a, data_a == start, &mut buf_a),
            (b, data_b == start, &mut buf_b),
        ] {
            match has_data {
                true => read_at(file, &mut buf[..n], start)?,
                false => buf[..n].fill(0),
            }
        }
        if buf_a[..n] != buf_b[..n] {
            changed += buf_a[..n]
                .iter()
                .zip(&buf_b[..n])
                .filter(|(x, y)| x != y)
                .count() as u64;
        }
        off = end;
    }
    Ok(changed)
}

/// Whether `file` is text as `diff` means it: UTF-8 without a NUL byte. A hole reads as
/// NUL bytes, so a sparse file is not text (and is decided without reading it).
pub fn is_text(file: &File) -> io::Result<bool> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(true);
    }
    if next_data(file, 0, len)? != 0 || next_hole(file, 0, len)? != len {
        return Ok(false);
    }
    let mut buf = vec![0u8; CHUNK];
    // The start of a character cut by the end of the previous chunk.
    let mut carry = 0;
    let mut off = 0;
    loop {
        let n = sys::pread(file.as_fd(), &mut buf[carry..], off)?;
        if n == 0 {
            return Ok(carry == 0);
        }
        off += n as u64;
        let filled = carry + n;
        if buf[carry..filled].contains(&0) {
            return Ok(false);
        }
        match std::str::from_utf8(&buf[..filled]) {
            Ok(_) => carry = 0,
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                buf.copy_within(valid..filled, 0);
                carry = filled - valid;
            }
            Err(_) => return Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn file(dir: &tempfile::TempDir, name: &str, len: u64, writes: &[(u64, &[u8])]) -> File {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join(name))
            .unwrap();
        f.set_len(len).unwrap();
        for (off, data) in writes {
            f.write_all_at(data, *off).unwrap();
        }
        f
    }

    #[test]
    fn sparse_files_compare_by_their_bytes_across_holes_and_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let gib = 1u64 << 30;
        let a = file(&dir, "a", gib, &[(5, b"hello"), (gib - 3, b"end")]);
        let b = file(&dir, "b", gib, &[(5, b"hellO"), (gib - 3, b"end")]);
        assert_eq!(bytes_changed(&a, &a).unwrap(), 0);
        assert_eq!(bytes_changed(&a, &b).unwrap(), 1);
        // Data against a hole; a range across a chunk boundary; a length difference.
        let c = file(
            &dir,
            "c",
            gib + 10,
            &[(5, b"hello"), (CHUNK as u64 - 2, b"abcd")],
        );
        assert_eq!(bytes_changed(&a, &c).unwrap(), 4 + 3 + 10);
        assert_eq!(bytes_changed(&c, &a).unwrap(), 4 + 3 + 10);
        // Zeros written as data equal a hole.
        let d = file(&dir, "d", 100, &[(10, &[0u8; 50])]);
        let e = file(&dir, "e", 100, &[]);
        assert_eq!(bytes_changed(&d, &e).unwrap(), 0);
    }

    #[test]
    fn text_is_utf8_without_nul_even_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = vec![b'a'; CHUNK - 1];
        text.extend_from_slice("é and more\n".as_bytes());
        assert!(is_text(&file(&dir, "t", 0, &[(0, &text)])).unwrap());
        assert!(is_text(&file(&dir, "empty", 0, &[])).unwrap());
        assert!(!is_text(&file(&dir, "nul", 0, &[(0, b"a\0b")])).unwrap());
        assert!(!is_text(&file(&dir, "cut", 0, &[(0, b"ab\xc3")])).unwrap());
        assert!(!is_text(&file(&dir, "bad", 0, &[(0, b"ab\xff")])).unwrap());
        assert!(!is_text(&file(&dir, "sparse", 1 << 20, &[(0, b"text")])).unwrap());
    }
}
