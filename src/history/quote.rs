//! Names as text output shows them: git's C-style quoting (`quote.c`, `quote_c_style`), with
//! valid UTF-8 kept readable as with `core.quotePath=false`. A name that needs no quoting is
//! shown as it is; one that does is shown in double quotes, with
//!
//! - `\a \b \t \n \v \f \r` for those control characters, `\"` and `\\` for `"` and `\`;
//! - `\ooo` (three octal digits) for every other byte below 0x20, for DEL (0x7f), for each
//!   byte of a C1 control character (U+0080–U+009F, which some terminals obey as escape
//!   sequences: U+009B is CSI), and for each byte that is not part of valid UTF-8.
//!
//! Other non-ASCII characters are printed as they are (git with `core.quotePath=true`, its
//! default, octal-escapes them too). So the output of a quoted name holds no control byte,
//! and a name cannot forge a line or move the cursor. `--json` output does not use this: JSON
//! escapes strings itself. See docs/json-output.md, "Names in text output".
use std::borrow::Cow;
use std::fmt::Write as _;

/// The C escape of an ASCII byte that needs one, as git's `cq_lookup` table gives it.
fn c_escape(b: u8) -> Option<char> {
    Some(match b {
        0x07 => 'a',
        0x08 => 'b',
        b'\t' => 't',
        b'\n' => 'n',
        0x0b => 'v',
        0x0c => 'f',
        b'\r' => 'r',
        b'"' => '"',
        b'\\' => '\\',
        _ => return None,
    })
}

/// Whether `c` must be escaped: a C0 or C1 control character, DEL, `"` or `\`.
fn must_quote(c: char) -> bool {
    c.is_control() || c == '"' || c == '\\'
}

/// Appends the escaped form of `c` (one that [`must_quote`]).
fn push_escaped(out: &mut String, c: char) {
    let mut buf = [0; 4];
    for &b in c.encode_utf8(&mut buf).as_bytes() {
        push_byte(out, b);
    }
}

fn push_byte(out: &mut String, b: u8) {
    match c_escape(b) {
        Some(e) => {
            out.push('\\');
            out.push(e);
        }
        None => {
            let _ = write!(out, "\\{b:03o}");
        }
    }
}

/// `name` as text output shows it: as it is, or in double quotes with escapes (see the
/// module's documentation).
pub fn quote_name(name: &str) -> Cow<'_, str> {
    quote_bytes(name.as_bytes())
}

/// [`quote_name`] of a name given as bytes (which need not be UTF-8).
pub fn quote_bytes(name: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(name)
        && !s.chars().any(must_quote)
    {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    push_quoted_body(&mut out, name);
    out.push('"');
    Cow::Owned(out)
}

/// `prefix` and `name` quoted as one (git's `quote_two_c_style`): `a/x` or `"a/x\n"`.
pub fn quote_prefixed(prefix: &str, name: &str) -> String {
    let quoted = quote_name(name);
    if matches!(quoted, Cow::Borrowed(_)) {
        return format!("{prefix}{name}");
    }
    let mut out = String::with_capacity(prefix.len() + quoted.len());
    out.push('"');
    push_quoted_body(&mut out, prefix.as_bytes());
    push_quoted_body(&mut out, name.as_bytes());
    out.push('"');
    out
}

/// A pattern (an exclusion rule) as the text shows it: in single quotes (`'build/'`), or
/// quoted as a name (`"a\033b"`) when it holds a character [`quote_name`] escapes.
pub fn quote_pattern(pattern: &str) -> String {
    match quote_name(pattern) {
        Cow::Borrowed(p) => format!("'{p}'"),
        Cow::Owned(quoted) => quoted,
    }
}

/// The inside of the quotes: valid UTF-8 runs with their controls escaped, invalid bytes as
/// octal.
fn push_quoted_body(out: &mut String, mut bytes: &[u8]) {
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => return push_valid(out, s),
            Err(e) => {
                let (good, bad) = bytes.split_at(e.valid_up_to());
                push_valid(out, std::str::from_utf8(good).unwrap_or_default());
                let n = e.error_len().unwrap_or(bad.len());
                for &b in &bad[..n] {
                    push_byte(out, b);
                }
                bytes = &bad[n..];
            }
        }
    }
}

fn push_valid(out: &mut String, s: &str) {
    for c in s.chars() {
        if must_quote(c) {
            push_escaped(out, c);
        } else {
            out.push(c);
        }
    }
}

/// A word for a POSIX shell: as it is when it needs no quoting, else in single quotes, or,
/// when it holds a control character (which must not reach the terminal raw), in `$'...'`
/// with octal escapes (bash, zsh, ksh and POSIX.1-2024 shells read it back as the same word).
pub fn shell_word(w: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "._:@/=+,-%".contains(c);
    if !w.is_empty() && w.chars().all(plain) {
        w.to_string()
    } else if w.chars().any(char::is_control) {
        let mut out = String::from("$'");
        for c in w.chars() {
            match c {
                '\\' | '\'' => {
                    out.push('\\');
                    out.push(c);
                }
                c if c.is_control() => {
                    let mut buf = [0; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('\'');
        out
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_shown_as_they_are() {
        for n in ["README.md", "a b/c", "été/日本語.txt", "-x", "it's"] {
            assert_eq!(quote_name(n), n);
        }
    }

    #[test]
    fn controls_quotes_and_backslashes_are_escaped_as_git_does() {
        assert_eq!(quote_name("x\nD README.md"), r#""x\nD README.md""#);
        assert_eq!(quote_name("\x1b[1A\x1b[2K\r"), r#""\033[1A\033[2K\r""#);
        assert_eq!(
            quote_name("\x07\x08\t\x0b\x0c\"\\\x01\x7f"),
            r#""\a\b\t\v\f\"\\\001\177""#
        );
        // A C1 control (U+009B, CSI): its UTF-8 bytes in octal.
        assert_eq!(quote_name("a\u{9b}b"), r#""a\302\233b""#);
        // Other non-ASCII stays readable inside quotes too.
        assert_eq!(quote_name("é\n"), "\"é\\n\"");
    }

    #[test]
    fn invalid_utf8_bytes_are_octal() {
        assert_eq!(quote_bytes(b"bad\xff\xfe.txt"), r#""bad\377\376.txt""#);
        assert_eq!(quote_bytes(b"\xc3"), r#""\303""#);
        assert_eq!(quote_bytes(b"\xc3\xa9\xff\xc3\xa9"), "\"é\\377é\"");
    }

    #[test]
    fn a_prefix_is_quoted_with_the_name() {
        assert_eq!(quote_prefixed("a/", "x.txt"), "a/x.txt");
        assert_eq!(quote_prefixed("a/", "x\ny"), r#""a/x\ny""#);
    }

    #[test]
    fn the_output_never_holds_a_control_character() {
        let all: Vec<u8> = (0..=255).collect();
        let q = quote_bytes(&all);
        assert!(!q.chars().any(char::is_control), "{q}");
    }
}
