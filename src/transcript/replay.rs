//! Reading a transcript (or the store journal, which has the same line format) back.
//!
//! Rules, in the order they are applied to each line (line numbers are 1-based and count
//! every physical line, blank ones included, so they match what an editor shows):
//! - A blank (whitespace-only) line is skipped.
//! - The final line of the file, if it has no trailing `\n` and is not valid JSON, is a *torn
//!   line*: the write that produced it was cut short by a crash. It is dropped with a warning
//!   and reported in [`ReadOutcome::dropped_torn_line`]. Nothing is truncated here; see
//!   [`truncate_torn_tail`]. An unterminated final line that *is* valid JSON is kept.
//! - Any other line that is not valid JSON, not a JSON object, or has no string `type` is
//!   [`ReplayError::Corrupt`]. A torn line can only ever be the last one, so garbage anywhere
//!   else means the file was damaged or edited, and guessing would risk a wrong rewind.
//! - A line whose `type` is not `file-history-snapshot` is a record kind from a future version
//!   and is skipped (logged at debug level).
//! - A `file-history-snapshot` line must deserialize as a [`Record`] (missing or mistyped
//!   fields are `Corrupt`) and its `seq` must be greater than the previous record's.
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::fsutil;
use super::record::{FILE_HISTORY_SNAPSHOT, Record};

/// What [`read_transcript`] found.
#[derive(Debug, Default)]
pub struct ReadOutcome {
    /// The records, in file order (so in strictly increasing `seq`).
    pub records: Vec<Record>,
    /// Some(line number) when a torn last line was dropped
    pub dropped_torn_line: Option<usize>,
}

impl ReadOutcome {
    /// The `seq` of the last record, `None` when there are none.
    pub fn last_seq(&self) -> Option<u64> {
        self.records.last().map(|r| r.seq)
    }
}

/// The store journal's file name inside `STATE/backups/`. Defined here, below the journal
/// (which re-exports it), because this reader serves both files and names which one is
/// corrupt.
pub const JOURNAL_FILE_NAME: &str = "journal.jsonl";

/// Why a transcript could not be read.
#[derive(Debug)]
pub enum ReplayError {
    /// Reading failed; the message names the file.
    Io(io::Error),
    /// A line other than a torn last line is unusable. `line` is 1-based.
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Io(e) => write!(f, "{e}"),
            ReplayError::Corrupt { path, line, reason } => {
                // The journal shares this reader; name the file for what it is.
                let what = if path.file_name().is_some_and(|n| n == JOURNAL_FILE_NAME) {
                    "store journal"
                } else {
                    "transcript"
                };
                write!(
                    f,
                    "{what} {} line {line} is corrupt: {reason} \
                     (move the file aside or repair that line)",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for ReplayError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReplayError::Io(e) => Some(e),
            ReplayError::Corrupt { .. } => None,
        }
    }
}

impl From<ReplayError> for io::Error {
    /// `Corrupt` becomes `InvalidData` carrying the full message.
    fn from(e: ReplayError) -> io::Error {
        match e {
            ReplayError::Io(e) => e,
            corrupt @ ReplayError::Corrupt { .. } => {
                io::Error::new(io::ErrorKind::InvalidData, corrupt.to_string())
            }
        }
    }
}

/// Reads every record of the transcript at `path`. A missing file is an empty transcript.
pub fn read_transcript(path: &Path) -> Result<ReadOutcome, ReplayError> {
    let mut records = Vec::new();
    let dropped_torn_line = scan_transcript(path, |r| records.push(r))?;
    Ok(ReadOutcome {
        records,
        dropped_torn_line,
    })
}

/// Streams the records of `path` to `visit`, in file order, without collecting them; returns
/// the line number of a dropped torn last line. Same rules as [`read_transcript`] (which is
/// this plus a `Vec`). On `Err`, `visit` has already seen the records before the bad line.
pub fn scan_transcript(
    path: &Path,
    visit: impl FnMut(Record),
) -> Result<Option<usize>, ReplayError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReplayError::Io(fsutil::with_path(path, "opening", e))),
    };
    scan_lines(path, file, Position::default(), true, visit).map(|(_, torn)| torn)
}

/// Where a scan of a transcript stopped: just after the `line`th line, `offset` bytes into
/// the file.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub offset: u64,
    pub line: usize,
}

/// The records of the complete (`\n`-terminated) lines of `file` (the transcript at
/// `path`) from `from` on, for a reader that keeps up with a growing transcript: returns
/// where the last complete line ends, from where the next call goes on. An unterminated last
/// line is left for then (a write under way); the rules are otherwise
/// [`scan_transcript`]'s, with line numbers counted from `from.line`. The caller makes sure
/// `from` is a line boundary of this very file (the file is only ever appended to, or
/// replaced whole).
pub fn scan_transcript_from(
    path: &Path,
    file: File,
    from: Position,
    visit: impl FnMut(Record),
) -> Result<Position, ReplayError> {
    scan_lines(path, file, from, false, visit).map(|(end, _)| end)
}

fn scan_lines(
    path: &Path,
    mut file: File,
    from: Position,
    visit_unterminated: bool,
    mut visit: impl FnMut(Record),
) -> Result<(Position, Option<usize>), ReplayError> {
    use std::io::Seek;
    if from.offset > 0 {
        file.seek(io::SeekFrom::Start(from.offset))
            .map_err(|e| ReplayError::Io(fsutil::with_path(path, "reading", e)))?;
    }
    let mut end = from;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let corrupt = |line: usize, reason: String| ReplayError::Corrupt {
        path: path.to_owned(),
        line,
        reason,
    };
    let mut buf = Vec::new();
    let mut line_no = from.line;
    let mut prev: Option<(u64, usize)> = None;
    loop {
        buf.clear();
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| ReplayError::Io(fsutil::with_path(path, "reading", e)))?;
        if n == 0 {
            return Ok((end, None));
        }
        line_no += 1;
        // read_until only stops without a '\n' at end of file, so an unterminated line is
        // always the last one.
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            end = Position {
                offset: end.offset + n as u64,
                line: line_no,
            };
        } else if !visit_unterminated {
            return Ok((end, None));
        }
        let text = if terminated {
            &buf[..buf.len() - 1]
        } else {
            &buf[..]
        };
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) if !terminated => {
                log::warn!(
                    "{}: dropping torn last line {line_no} ({} bytes, {}): a write cut short \
                     by a crash",
                    path.display(),
                    text.len(),
                    syntax_reason(&e)
                );
                return Ok((end, Some(line_no)));
            }
            Err(e) => return Err(corrupt(line_no, syntax_reason(&e))),
        };
        if !value.is_object() {
            return Err(corrupt(line_no, "not a JSON object".to_owned()));
        }
        match value.get("type") {
            Some(Value::String(t)) if t == FILE_HISTORY_SNAPSHOT => {}
            Some(Value::String(t)) => {
                log::debug!(
                    "{}: skipping line {line_no} of unknown type {t:?}",
                    path.display()
                );
                continue;
            }
            Some(_) => return Err(corrupt(line_no, "`type` is not a string".to_owned())),
            None => return Err(corrupt(line_no, "missing field `type`".to_owned())),
        }
        let record: Record =
            serde_json::from_value(value).map_err(|e| corrupt(line_no, e.to_string()))?;
        if let Some((prev_seq, prev_line)) = prev
            && record.seq <= prev_seq
        {
            return Err(corrupt(
                line_no,
                format!(
                    "seq {} is not greater than seq {prev_seq} on line {prev_line}",
                    record.seq
                ),
            ));
        }
        prev = Some((record.seq, line_no));
        visit(record);
    }
}

/// serde_json's message with the position reduced to the column (every parse is one line).
fn syntax_reason(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let base = msg.strip_suffix(&suffix).unwrap_or(&msg);
    if e.line() == 0 {
        base.to_owned()
    } else {
        format!("{base} at column {}", e.column())
    }
}

/// Makes `path` end on a line boundary, so that appends after a remount start on a fresh line
/// instead of gluing themselves to a torn one (which would turn a harmless torn tail into a
/// corrupt middle line). `outcome` is what [`read_transcript`] returned for this file just now.
///
/// - If `outcome.dropped_torn_line` is set, the file is cut back to just after its last `\n`
///   (or to empty).
/// - Otherwise, if the file still does not end with `\n` (a kept unterminated last line, or
///   trailing blanks), a `\n` is appended.
///
/// The change is fsynced. Returns whether the file was changed; a missing or empty file, or
/// one already ending in `\n`, is left alone. No writer may have the file open meanwhile.
pub fn truncate_torn_tail(path: &Path, outcome: &ReadOutcome) -> io::Result<bool> {
    repair_tail(path, outcome.dropped_torn_line.is_some())
}

/// [`truncate_torn_tail`], given only whether a torn line was dropped.
pub(crate) fn repair_tail(path: &Path, torn: bool) -> io::Result<bool> {
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(fsutil::with_path(path, "opening", e)),
    };
    let repair = |file: &mut File| -> io::Result<bool> {
        let len = file.metadata()?.len();
        match fsutil::last_byte(file)? {
            None | Some(b'\n') => return Ok(false),
            Some(_) => {}
        }
        if torn {
            let keep = fsutil::last_newline_before(file, len)?.map_or(0, |nl| nl + 1);
            log::warn!(
                "{}: cutting {} bytes of torn last line",
                path.display(),
                len - keep
            );
            file.set_len(keep)?;
        } else {
            use std::io::{Seek, SeekFrom};
            file.seek(SeekFrom::End(0))?;
            file.write_all(b"\n")?;
        }
        file.sync_data()?;
        Ok(true)
    };
    repair(&mut file).map_err(|e| fsutil::with_path(path, "repairing the tail of", e))
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests write transcripts directly, torn and corrupt ones included"
)]
mod tests {
    use super::*;
    use crate::transcript::testutil::{backup, checkpoint, write_lines};

    fn read(path: &Path) -> ReadOutcome {
        read_transcript(path).expect("read")
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let out = read(&dir.path().join("transcript.jsonl"));
        assert!(out.records.is_empty());
        assert_eq!(out.dropped_torn_line, None);
        assert_eq!(out.last_seq(), None);
        assert!(!truncate_torn_tail(&dir.path().join("transcript.jsonl"), &out).unwrap());
    }

    #[test]
    fn roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let records = vec![backup(1, None), checkpoint("m1", 2), backup(3, Some("m1"))];
        write_lines(&path, &records, true);
        let out = read(&path);
        assert_eq!(out.records, records);
        assert_eq!(out.dropped_torn_line, None);
        assert_eq!(out.last_seq(), Some(3));
    }

    #[test]
    fn torn_last_line_is_dropped_then_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let records = vec![backup(1, None), checkpoint("m1", 2)];
        write_lines(&path, &records, true);
        let full = serde_json::to_string(&backup(3, Some("m1"))).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&full.as_bytes()[..full.len() / 2]).unwrap();
        drop(f);

        let out = read(&path);
        assert_eq!(out.records, records);
        assert_eq!(out.dropped_torn_line, Some(3));

        assert!(truncate_torn_tail(&path, &out).unwrap());
        assert!(!truncate_torn_tail(&path, &read(&path)).unwrap());
        // Appending after the cut starts on a fresh line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "{full}").unwrap();
        drop(f);
        let out = read(&path);
        assert_eq!(out.dropped_torn_line, None);
        assert_eq!(out.last_seq(), Some(3));
        assert_eq!(out.records.len(), 3);
    }

    #[test]
    fn torn_only_line_cuts_to_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        std::fs::write(&path, b"{\"type\":\"file-hist").unwrap();
        let out = read(&path);
        assert_eq!(out.dropped_torn_line, Some(1));
        assert!(truncate_torn_tail(&path, &out).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[test]
    fn unterminated_valid_last_line_is_kept_and_terminated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let records = vec![backup(1, None), checkpoint("m1", 2)];
        write_lines(&path, &records, false);
        let out = read(&path);
        assert_eq!(out.records, records);
        assert_eq!(out.dropped_torn_line, None);
        assert!(truncate_torn_tail(&path, &out).unwrap());
        assert!(std::fs::read(&path).unwrap().ends_with(b"}\n"));
        assert_eq!(read(&path).records, records);
    }

    #[test]
    fn corrupt_middle_line_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let good = serde_json::to_string(&backup(1, None)).unwrap();
        let bad = r#"{"type":"file-history-snapshot" "messageId":null}"#;
        let last = serde_json::to_string(&backup(2, None)).unwrap();
        // Line 2 is blank (skipped but counted), line 3 is bad.
        std::fs::write(&path, format!("{good}\n\n{bad}\n{last}\n")).unwrap();
        let err = read_transcript(&path).unwrap_err();
        match &err {
            ReplayError::Corrupt { line, reason, .. } => {
                assert_eq!(*line, 3);
                assert_eq!(reason, "expected `,` or `}` at column 33");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!(
                "transcript {} line 3 is corrupt: expected `,` or `}}` at column 33 \
                 (move the file aside or repair that line)",
                path.display()
            )
        );
    }

    #[test]
    fn torn_looking_line_in_the_middle_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let good = serde_json::to_string(&backup(2, None)).unwrap();
        std::fs::write(&path, format!("{{\"type\":\"file-hist\n{good}\n")).unwrap();
        match read_transcript(&path) {
            Err(ReplayError::Corrupt { line: 1, .. }) => {}
            other => panic!("expected Corrupt on line 1, got {other:?}"),
        }
    }

    #[test]
    fn snapshot_with_missing_fields_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let mut v = serde_json::to_value(backup(1, None)).unwrap();
        v.as_object_mut().unwrap().remove("seq");
        std::fs::write(&path, format!("{v}\n")).unwrap();
        match read_transcript(&path) {
            Err(ReplayError::Corrupt {
                line: 1, reason, ..
            }) => {
                assert!(reason.contains("missing field `seq`"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // Without a trailing newline it is valid JSON, so still corrupt, not torn.
        std::fs::write(&path, v.to_string()).unwrap();
        assert!(matches!(
            read_transcript(&path),
            Err(ReplayError::Corrupt { line: 1, .. })
        ));
    }

    #[test]
    fn non_objects_and_missing_type_are_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        for (text, want) in [
            ("[1,2]", "not a JSON object"),
            ("{\"seq\":1}", "missing field `type`"),
            ("{\"type\":7}", "`type` is not a string"),
        ] {
            std::fs::write(&path, format!("{text}\n")).unwrap();
            match read_transcript(&path) {
                Err(ReplayError::Corrupt {
                    line: 1, reason, ..
                }) => assert_eq!(reason, want),
                other => panic!("{text}: expected Corrupt, got {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_types_and_blank_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let a = serde_json::to_string(&backup(1, None)).unwrap();
        let b = serde_json::to_string(&checkpoint("m1", 2)).unwrap();
        let future = r#"{"type":"future-kind","whatever":[1,2,3]}"#;
        std::fs::write(&path, format!("\n{a}\n  \n{future}\n{b}\n\n")).unwrap();
        let out = read(&path);
        assert_eq!(out.records, vec![backup(1, None), checkpoint("m1", 2)]);
        assert_eq!(out.dropped_torn_line, None);
    }

    #[test]
    fn non_increasing_seq_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        for seqs in [[1, 3, 3], [1, 5, 4]] {
            let records: Vec<_> = seqs.iter().map(|&s| backup(s, None)).collect();
            write_lines(&path, &records, true);
            match read_transcript(&path) {
                Err(ReplayError::Corrupt {
                    line: 3, reason, ..
                }) => {
                    assert_eq!(
                        reason,
                        format!(
                            "seq {} is not greater than seq {} on line 2",
                            seqs[2], seqs[1]
                        )
                    );
                }
                other => panic!("{seqs:?}: expected Corrupt on line 3, got {other:?}"),
            }
        }
    }

    #[test]
    fn scan_streams_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        let records: Vec<_> = (1..=50).map(|s| backup(s, None)).collect();
        write_lines(&path, &records, true);
        let mut seen = 0;
        assert_eq!(scan_transcript(&path, |_| seen += 1).unwrap(), None);
        assert_eq!(seen, 50);
    }

    #[test]
    fn corrupt_converts_to_invalid_data_naming_the_file_kind() {
        let e: io::Error = ReplayError::Corrupt {
            path: PathBuf::from("/s/backups/journal.jsonl"),
            line: 2,
            reason: "x".into(),
        }
        .into();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            "store journal /s/backups/journal.jsonl line 2 is corrupt: x \
             (move the file aside or repair that line)"
        );
    }

    /// The worked example in docs/transcript-format.md is real output and replays.
    #[test]
    fn doc_example_replays() {
        let doc = include_str!("../../docs/transcript-format.md");
        let block = doc
            .split("```jsonl\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("jsonl block");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("transcript.jsonl");
        std::fs::write(&path, block).unwrap();
        let out = read(&path);
        assert_eq!(out.dropped_torn_line, None);
        let r = &out.records;
        assert_eq!(r.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(
            r.iter().map(Record::is_checkpoint).collect::<Vec<_>>(),
            [false, false, true, false]
        );
        let absent = &r[0].snapshot.tracked_file_backups["src/new.rs"];
        assert!(absent.backup_file_name.is_none() && absent.meta.is_none());
        let pending = &r[2].snapshot.tracked_file_backups["src/lib.rs"];
        assert!(pending.pending && pending.backup_file_name.is_none());
        let fill = &r[3].snapshot.tracked_file_backups["src/lib.rs"];
        assert_eq!(fill.version, pending.version);
        assert!(!fill.pending && fill.backup_file_name.is_some());
        assert_eq!(r[3].message_id.as_deref(), Some("msg-01"));
        // Byte-for-byte what the writer would produce.
        let rewritten: String = r
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        assert_eq!(rewritten, block);
    }
}
