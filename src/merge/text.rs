//! The line merge of a text file changed on both sides: [`diffy`]'s three-way merge, with
//! its conflicts re-rendered the way `git merge-file -L main -L base -L NAME` writes them
//! (`<<<<<<< main`, `=======`, `>>>>>>> NAME`, 7-character markers, lines both sides
//! share at the edges of a conflict moved out of it, as git's "zealous" level does).
use diffy::{ConflictStyle, IncompleteHunkStyle, MergeOptions};

/// How git decides a file is binary (`buffer_is_binary`): a NUL in its first 8000 bytes.
const BINARY_PROBE: usize = 8000;

/// Git's conflict marker length.
const MARKER_LEN: usize = 7;

/// Whether `data` is binary to git (and so never merged line by line).
pub fn is_binary(data: &[u8]) -> bool {
    data[..data.len().min(BINARY_PROBE)].contains(&0)
}

/// One conflicting region: what each side has there (whole lines, as bytes).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hunk {
    /// The 1-based line of the merged file where the region starts (in the file with
    /// markers: the `<<<<<<<` line).
    pub line: usize,
    #[serde(serialize_with = "lossy")]
    pub ours: Vec<u8>,
    #[serde(serialize_with = "lossy")]
    pub theirs: Vec<u8>,
}

fn lossy<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(v))
}

/// The outcome of a line merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMerge {
    /// The merged file; with markers where `hunks` is not empty.
    pub merged: Vec<u8>,
    /// The conflicting regions; empty for a clean merge.
    pub hunks: Vec<Hunk>,
}

/// A piece of the merged file: lines taken as they are, or a conflict.
enum Piece<'a> {
    Lines(&'a [u8]),
    Conflict { ours: &'a [u8], theirs: &'a [u8] },
}

/// The longest run of `c` that starts a line of `data`.
fn longest_marker_run(data: &[u8], c: u8) -> usize {
    data.split(|&b| b == b'\n')
        .map(|l| l.iter().take_while(|&&b| b == c).count())
        .max()
        .unwrap_or(0)
}

/// Merges `base` → `ours` and `base` → `theirs` line by line, labelling a conflict's sides
/// `ours_label` and `theirs_label`.
pub fn merge(
    base: &[u8],
    ours: &[u8],
    theirs: &[u8],
    ours_label: &str,
    theirs_label: &str,
) -> TextMerge {
    // diffy labels its markers "ours"/"theirs" itself. Its markers are made longer than any
    // run of marker characters that starts a line of the inputs, so the conflicts can be
    // read back from its output without mistaking an input line for a marker.
    let len = [b'<', b'=', b'>']
        .iter()
        .flat_map(|&c| [base, ours, theirs].map(|d| longest_marker_run(d, c)))
        .max()
        .unwrap_or(0)
        .max(MARKER_LEN)
        + 1;
    let out = match MergeOptions::new()
        .set_conflict_style(ConflictStyle::Merge)
        .set_conflict_marker_length(len)
        .set_incomplete_hunk_style(IncompleteHunkStyle::Git)
        .merge_bytes(base, ours, theirs)
    {
        Ok(merged) => {
            return TextMerge {
                merged,
                hunks: Vec::new(),
            };
        }
        Err(out) => out,
    };
    let pieces = parse(&out, len);
    render(&pieces, ours_label, theirs_label)
}

/// Splits diffy's output (markers of length `len`) into pieces.
fn parse(out: &[u8], len: usize) -> Vec<Piece<'_>> {
    let start: Vec<u8> = [vec![b'<'; len], b" ours\n".to_vec()].concat();
    let middle: Vec<u8> = [vec![b'='; len], b"\n".to_vec()].concat();
    let end: Vec<u8> = [vec![b'>'; len], b" theirs\n".to_vec()].concat();
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut plain = 0;
    let mut state: Option<(usize, Option<(usize, usize)>)> = None;
    while at < out.len() {
        let next = out[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(out.len(), |i| at + i + 1);
        let line = &out[at..next];
        match state {
            None if line == start.as_slice() => {
                pieces.push(Piece::Lines(&out[plain..at]));
                state = Some((next, None));
            }
            Some((ours_from, None)) if line == middle.as_slice() => {
                state = Some((ours_from, Some((at, next))));
            }
            Some((ours_from, Some((ours_to, theirs_from)))) if line == end.as_slice() => {
                pieces.push(Piece::Conflict {
                    ours: &out[ours_from..ours_to],
                    theirs: &out[theirs_from..at],
                });
                state = None;
                plain = next;
            }
            _ => {}
        }
        at = next;
    }
    pieces.push(Piece::Lines(&out[plain..]));
    pieces
}

/// The lines of `data` (each with its `\n`, the last maybe without).
fn lines(data: &[u8]) -> Vec<&[u8]> {
    data.split_inclusive(|&b| b == b'\n').collect()
}

/// The merged file with git's markers and labels, and its conflicts.
fn render(pieces: &[Piece<'_>], ours_label: &str, theirs_label: &str) -> TextMerge {
    let mut merged = Vec::new();
    let mut hunks = Vec::new();
    let mut line = 1;
    let push = |merged: &mut Vec<u8>, line: &mut usize, data: &[u8]| {
        merged.extend_from_slice(data);
        *line += data.iter().filter(|&&b| b == b'\n').count();
    };
    for piece in pieces {
        match *piece {
            Piece::Lines(data) => push(&mut merged, &mut line, data),
            Piece::Conflict { ours, theirs } => {
                // Lines both sides have at the start or end of the region are not in
                // conflict: git's zealous merge writes them outside the markers.
                let (o, t) = (lines(ours), lines(theirs));
                let head = o.iter().zip(&t).take_while(|(a, b)| a == b).count();
                let tail = o[head..]
                    .iter()
                    .rev()
                    .zip(t[head..].iter().rev())
                    .take_while(|(a, b)| a == b)
                    .count();
                let (o_mid, t_mid) = (&o[head..o.len() - tail], &t[head..t.len() - tail]);
                push(&mut merged, &mut line, &o[..head].concat());
                if o_mid.is_empty() && t_mid.is_empty() {
                    push(&mut merged, &mut line, &o[o.len() - tail..].concat());
                    continue;
                }
                let (ours, theirs) = (o_mid.concat(), t_mid.concat());
                hunks.push(Hunk {
                    line,
                    ours: ours.clone(),
                    theirs: theirs.clone(),
                });
                let marker = |c: u8, label: &str| {
                    let mut m = vec![c; MARKER_LEN];
                    if !label.is_empty() {
                        m.push(b' ');
                        m.extend_from_slice(label.as_bytes());
                    }
                    m.push(b'\n');
                    m
                };
                push(&mut merged, &mut line, &marker(b'<', ours_label));
                push(&mut merged, &mut line, &ours);
                push(&mut merged, &mut line, &marker(b'=', ""));
                push(&mut merged, &mut line, &theirs);
                push(&mut merged, &mut line, &marker(b'>', theirs_label));
                push(&mut merged, &mut line, &o[o.len() - tail..].concat());
            }
        }
    }
    TextMerge { merged, hunks }
}
