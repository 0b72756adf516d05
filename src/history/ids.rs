//! Checkpoint (message) ids: 1–128 bytes of `[A-Za-z0-9._:@-]`, not `.` or `..`.
//!
//! Ids become directory names under `.checkpoint/at/`, so the rule is strict: no slash, no
//! whitespace, nothing a shell would need quoting for.

use std::fmt;

pub const MAX_ID_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdError {
    Empty,
    TooLong(usize),
    BadByte(u8),
    DotName,
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdError::Empty => write!(f, "checkpoint id is empty"),
            IdError::TooLong(n) => {
                write!(f, "checkpoint id is {n} bytes long (at most {MAX_ID_LEN})")
            }
            IdError::BadByte(b) => write!(
                f,
                "checkpoint id contains {:?}; allowed: letters, digits and . _ : @ -",
                char::from(*b)
            ),
            IdError::DotName => write!(f, "checkpoint id may not be '.' or '..'"),
        }
    }
}

impl std::error::Error for IdError {}

/// Checks a checkpoint id. `raw` is exactly the id: callers strip one trailing newline first.
pub fn validate_id(raw: &[u8]) -> Result<&str, IdError> {
    if raw.is_empty() {
        return Err(IdError::Empty);
    }
    if raw.len() > MAX_ID_LEN {
        return Err(IdError::TooLong(raw.len()));
    }
    if let Some(&b) = raw
        .iter()
        .find(|&&b| !(b.is_ascii_alphanumeric() || b".-_:@".contains(&b)))
    {
        return Err(IdError::BadByte(b));
    }
    if raw == b"." || raw == b".." {
        return Err(IdError::DotName);
    }
    // All bytes are ASCII, so this cannot fail.
    Ok(std::str::from_utf8(raw).expect("ascii"))
}

/// The longest line `ctl` takes (`session ID PID` with a 128-byte id is 147 bytes); a
/// longer unterminated rest is refused rather than buffered without bound.
pub const MAX_CTL_LINE: usize = 256;

/// One line written to `.checkpoint/ctl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtlLine {
    /// `ID`: take checkpoint ID.
    Checkpoint(String),
    /// `session ID PID`: PID and its descendants become session ID.
    Session { id: String, pid: u32 },
}

/// Why a write to `ctl` is refused whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtlError {
    /// A malformed line (EINVAL).
    Invalid(String),
    /// The same id twice in one write (EEXIST).
    Repeated(String),
}

/// What a `ctl` handle takes from one write: its complete lines, and the unterminated rest
/// it keeps for the next write (or for close).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CtlBatch {
    pub lines: Vec<CtlLine>,
    pub rest: Vec<u8>,
}

/// `ID PID` of a `session ID PID` line, if well formed.
pub fn parse_session_args(args: &[u8]) -> Option<(&str, u32)> {
    let text = std::str::from_utf8(args).ok()?;
    let mut words = text.split(' ');
    let (Some(id), Some(pid), None) = (words.next(), words.next(), words.next()) else {
        return None;
    };
    Some((validate_id(id.as_bytes()).ok()?, pid.parse().ok()?))
}

/// Splits `pending` (the rest kept from earlier writes to the same handle) followed by
/// `data` into complete lines, so that an id cut across two writes is one id. With
/// `at_close`, a non-empty rest is the last line. All or nothing: on `Err` no line is taken
/// and the handle keeps `pending` as it was.
pub fn take_ctl_lines(pending: &[u8], data: &[u8], at_close: bool) -> Result<CtlBatch, CtlError> {
    let mut all = Vec::with_capacity(pending.len() + data.len());
    all.extend_from_slice(pending);
    all.extend_from_slice(data);
    let (complete, rest): (Option<&[u8]>, &[u8]) = match all.iter().rposition(|&b| b == b'\n') {
        _ if at_close => ((!all.is_empty()).then_some(&all[..]), &[]),
        Some(nl) => (Some(&all[..nl]), &all[nl + 1..]),
        None => (None, &all[..]),
    };
    if rest.len() > MAX_CTL_LINE {
        return Err(CtlError::Invalid(format!(
            "a line of more than {MAX_CTL_LINE} bytes with no newline"
        )));
    }
    let mut lines = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for line in complete.into_iter().flat_map(|c| c.split(|&b| b == b'\n')) {
        // Ids have no spaces, so `session ID PID` cannot be mistaken for one.
        let parsed = match line.strip_prefix(b"session ") {
            Some(args) => match parse_session_args(args) {
                Some((id, pid)) => CtlLine::Session {
                    id: id.to_string(),
                    pid,
                },
                None => {
                    return Err(CtlError::Invalid(format!(
                        "malformed session registration {:?} (want: session ID PID)",
                        String::from_utf8_lossy(line)
                    )));
                }
            },
            None => {
                let id = validate_id(line).map_err(|e| CtlError::Invalid(e.to_string()))?;
                if !ids.insert(id) {
                    return Err(CtlError::Repeated(id.to_string()));
                }
                CtlLine::Checkpoint(id.to_string())
            }
        };
        lines.push(parsed);
    }
    Ok(CtlBatch {
        lines,
        rest: rest.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_cut_across_two_writes_is_one_id() {
        let first = take_ctl_lines(b"", b"spl", false).unwrap();
        assert!(first.lines.is_empty());
        assert_eq!(first.rest, b"spl");
        let second = take_ctl_lines(&first.rest, b"it\nnext", false).unwrap();
        assert_eq!(second.lines, vec![CtlLine::Checkpoint("split".into())]);
        assert_eq!(second.rest, b"next");
        let closed = take_ctl_lines(&second.rest, b"", true).unwrap();
        assert_eq!(closed.lines, vec![CtlLine::Checkpoint("next".into())]);
        assert!(closed.rest.is_empty());
        assert_eq!(take_ctl_lines(b"", b"", true).unwrap(), CtlBatch::default());
    }

    #[test]
    fn a_ctl_write_is_taken_whole_or_refused_whole() {
        // One bad line refuses the good ones before it too.
        let bad = take_ctl_lines(b"", b"good-1\nbad id\ngood-2\n", false);
        assert!(matches!(bad, Err(CtlError::Invalid(_))), "{bad:?}");
        let twice = take_ctl_lines(b"", b"a\nb\na\n", false);
        assert_eq!(twice, Err(CtlError::Repeated("a".into())));
        let long = vec![b'x'; MAX_CTL_LINE + 1];
        assert!(matches!(
            take_ctl_lines(b"", &long, false),
            Err(CtlError::Invalid(_))
        ));
        // An empty line is an empty id, refused as before.
        assert!(take_ctl_lines(b"", b"\n", false).is_err());
        assert!(take_ctl_lines(b"", b"a\n\n", false).is_err());
        let s = take_ctl_lines(b"", b"session s-1 42\n", false).unwrap();
        assert_eq!(
            s.lines,
            vec![CtlLine::Session {
                id: "s-1".into(),
                pid: 42
            }]
        );
        assert!(take_ctl_lines(b"", b"session s-1\n", false).is_err());
    }

    #[test]
    fn accepts_good_ids() {
        for id in ["m1", "msg-9", "a.b_c:d@e-f", "...", &"x".repeat(128)] {
            assert_eq!(validate_id(id.as_bytes()), Ok(id));
        }
    }

    #[test]
    fn refuses_bad_ids() {
        assert_eq!(validate_id(b""), Err(IdError::Empty));
        assert_eq!(validate_id(&[b'x'; 129]), Err(IdError::TooLong(129)));
        assert_eq!(validate_id(b"a/b"), Err(IdError::BadByte(b'/')));
        assert_eq!(validate_id(b"a b"), Err(IdError::BadByte(b' ')));
        assert_eq!(validate_id(b"a\0"), Err(IdError::BadByte(0)));
        assert_eq!(validate_id(b"a\n"), Err(IdError::BadByte(b'\n')));
        assert_eq!(validate_id("é".as_bytes()), Err(IdError::BadByte(0xc3)));
        assert_eq!(validate_id(b"."), Err(IdError::DotName));
        assert_eq!(validate_id(b".."), Err(IdError::DotName));
    }
}
