//! Small file helpers shared by the writer, the journal and replay.
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Opens `path` for reading and appending (`O_APPEND`), creating it if missing.
///
/// When the file is created here, its parent directory is fsynced:
/// `fdatasync` on the file makes its data durable but not its directory entry, and a
/// transcript whose name vanishes in a crash is as lost as one whose data does.
pub(crate) fn open_append(path: &Path) -> io::Result<File> {
    let open = |create_new: bool| {
        let mut options = OpenOptions::new();
        // Only the owner may read or change the history (see crate::state::dir).
        options.read(true).append(true).mode(0o600);
        if create_new {
            options.create_new(true);
        }
        options.open(path)
    };
    match open(false) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let file = match open(true) {
                Ok(file) => file,
                // Lost a race with another creator: the file exists now.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return open(false),
                Err(e) => return Err(e),
            };
            sync_parent_dir(path)?;
            Ok(file)
        }
        Err(e) => Err(e),
    }
}

/// fsyncs the directory containing `path`, making a create or rename in it durable.
pub(crate) fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

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

/// The last complete line of `file` (without its `\n`), provided the file ends with `\n`.
/// `Ok(None)` when the file is empty; `Err(InvalidData)` when it does not end with `\n`.
pub(crate) fn last_complete_line(file: &File, path: &Path) -> io::Result<Option<Vec<u8>>> {
    let len = file.metadata()?.len();
    match last_byte(file)? {
        None => return Ok(None),
        Some(b'\n') => {}
        Some(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} does not end with a newline (a torn or unterminated last line); \
                     read it with replay::read_transcript and call replay::truncate_torn_tail \
                     before appending",
                    path.display()
                ),
            ));
        }
    }
    let start = match last_newline_before(file, len - 1)? {
        Some(nl) => nl + 1,
        None => 0,
    };
    let mut line = vec![0u8; (len - 1 - start) as usize];
    file.read_exact_at(&mut line, start)?;
    Ok(Some(line))
}

/// An `io::Error` with `path` in its message, keeping the kind and the errno.
pub(crate) fn with_path(path: &Path, what: &str, e: io::Error) -> io::Error {
    crate::sys::context(format!("{what} {}", path.display()), e)
}
