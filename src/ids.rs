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

#[cfg(test)]
mod tests {
    use super::*;

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
