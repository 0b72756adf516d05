//! `STATE/format`: the version of the transcript's format a state dir holds.
//!
//! Formats 1–3 never wrote the file (their differences replay alike), so a state dir
//! without it is format 3 at most and replays exactly as it always did. Format 4 adds
//! rename records (docs/transcript-format.md); the daemon writes `4` — atomically, through
//! [`crate::state::dir::write_file`] — before the first such record, so a state dir holding
//! one always says so. A daemon refuses a state dir whose format is newer than it knows:
//! it would misread records it has no meaning for, and a rewind trusts that reading.
use std::io;
use std::path::Path;

/// The file's name in the state dir.
pub const FORMAT_FILE: &str = "format";

/// The newest format this binary reads and writes.
pub const CURRENT: u32 = 4;

/// The format a state dir without `STATE/format` holds (it cannot hold rename records).
pub const UNVERSIONED: u32 = 3;

/// The state dir's format: [`UNVERSIONED`] without the file. An unreadable or malformed
/// file is an error naming it, never a guess.
pub fn read(state_dir: &Path) -> io::Result<u32> {
    let path = state_dir.join(FORMAT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(UNVERSIONED),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", path.display()),
            ));
        }
    };
    text.trim().parse::<u32>().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {:?}, not a format number: the state dir was damaged or edited \
                 (a state dir from checkpointfs holds one line with a number)",
                path.display(),
                text.trim()
            ),
        )
    })
}

/// Refuses a state dir written in a format newer than [`CURRENT`], naming both numbers.
/// Returns the format found.
pub fn check(state_dir: &Path) -> io::Result<u32> {
    let found = read(state_dir)?;
    if found > CURRENT {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "state dir {} holds transcript format {found}, newer than format {CURRENT}, \
                 the newest this checkpointfs ({}) knows: use the checkpointfs that wrote it, \
                 or a newer one",
                state_dir.display(),
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    Ok(found)
}

/// Makes the state dir say format `n` (at least), atomically and durably, before a record
/// of that format is written. Writes nothing when it already says `n` or more.
pub fn ensure(state_dir: &Path, n: u32) -> io::Result<()> {
    if read(state_dir)? >= n {
        return Ok(());
    }
    crate::state::dir::write_file(state_dir, FORMAT_FILE, format!("{n}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_dir_without_the_file_is_format_3_and_ensure_writes_4_once() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), UNVERSIONED);
        assert_eq!(check(dir.path()).unwrap(), UNVERSIONED);
        ensure(dir.path(), 4).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FORMAT_FILE)).unwrap(),
            "4\n"
        );
        assert_eq!(check(dir.path()).unwrap(), 4);
        ensure(dir.path(), 3).unwrap();
        assert_eq!(read(dir.path()).unwrap(), 4, "never lowered");
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_numbers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FORMAT_FILE), "5\n").unwrap();
        let err = check(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("format 5") && msg.contains("format 4"),
            "{msg}"
        );
        std::fs::write(dir.path().join(FORMAT_FILE), "four").unwrap();
        let msg = check(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("not a format number"), "{msg}");
    }
}
