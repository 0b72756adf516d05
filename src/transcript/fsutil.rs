//! Small file helpers shared by the writer, the journal and replay.
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The offset of the last `\n` in `file[..end]`, reading backwards in chunks so that only the
/// tail of a large file is touched.
pub(crate) fn last_newline_before(file: &File, end: u64) -> io::Result<Option<u64>> {
    const CHUNK: u64 = 64 * 1024;
    let mut buf = vec![0u8; CHUNK.min(end) as usize];
    let mut hi = end;
    while hi > 0 {
        let lo = hi.saturating_sub(CHUNK);
        let chunk = &mut buf[..(hi - lo) as usize];
        file.read_exact_at(chunk, lo)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(lo + i as u64));
        }
        hi = lo;
    }
    Ok(None)
}

/// The last byte of `file`, if it is not empty.
pub(crate) fn last_byte(file: &File) -> io::Result<Option<u8>> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, len - 1)?;
    Ok(Some(b[0]))
}

/// An `io::Error` with `path` in its message, keeping the kind.
pub(crate) fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}
