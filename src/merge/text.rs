//! The line merge of a text file changed on both sides: [`diffy`]'s three-way merge, with
//! its conflicts re-rendered the way `git merge-file -L main -L base -L NAME` writes them
//! (`<<<<<<< main`, `=======`, `>>>>>>> NAME`, 7-character markers, lines both sides
//! share at the edges of a conflict moved out of it, and conflicts close together joined,
//! as git's default "zealous alnum" level does). Where a file repeats a line, diffy and
//! git may align a change differently (docs/design.md, "Merging a branch").
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

/// A piece of the merged file: lines taken as they are, or a conflict (with what base had
/// there).
#[derive(Debug)]
enum Piece {
    Lines(Vec<u8>),
    /// Base's, ours' and theirs' lines.
    Conflict([Vec<u8>; 3]),
}

/// How many unchanged lines between two conflicts make git join them into one
/// (`xdl_simplify_non_conflicts`); more lines join too when none holds a letter or digit.
const JOIN_GAP: usize = 3;

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
    let len = [b'<', b'|', b'=', b'>']
        .iter()
        .flat_map(|&c| [base, ours, theirs].map(|d| longest_marker_run(d, c)))
        .max()
        .unwrap_or(0)
        .max(MARKER_LEN)
        + 1;
    let out = match MergeOptions::new()
        .set_conflict_style(ConflictStyle::Diff3)
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
    let pieces = join_close_conflicts(parse(&out, len), [base, ours, theirs]);
    render(&pieces, ours_label, theirs_label)
}

/// Splits diffy's output (diff3 style, markers of length `len`) into pieces.
fn parse(out: &[u8], len: usize) -> Vec<Piece> {
    let marker = |c: u8, label: &[u8]| [vec![c; len], label.to_vec()].concat();
    let (start, base, middle, end) = (
        marker(b'<', b" ours\n"),
        marker(b'|', b" original\n"),
        marker(b'=', b"\n"),
        marker(b'>', b" theirs\n"),
    );
    let mut pieces = Vec::new();
    // The offsets where the current conflict's ours, base and theirs parts begin.
    let mut parts: Vec<(usize, usize)> = Vec::new();
    let mut plain = 0;
    let mut at = 0;
    while at < out.len() {
        let next = out[at..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(out.len(), |i| at + i + 1);
        let line = &out[at..next];
        let expected = [&start, &base, &middle, &end][parts.len()];
        if line == expected.as_slice() {
            if parts.is_empty() {
                pieces.push(Piece::Lines(out[plain..at].to_vec()));
            } else {
                let last = parts.len() - 1;
                parts[last].1 = at;
            }
            parts.push((next, next));
            if parts.len() == 4 {
                let part = |i: usize| out[parts[i].0..parts[i].1].to_vec();
                pieces.push(Piece::Conflict([part(1), part(0), part(2)]));
                parts.clear();
                plain = next;
            }
        }
        at = next;
    }
    pieces.push(Piece::Lines(out[plain..].to_vec()));
    pieces
}

/// Whether `needle` occurs in `hay` at the start of a line.
fn occurs_at_line_start(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || hay
            .windows(needle.len())
            .enumerate()
            .any(|(i, w)| w == needle && (i == 0 || hay[i - 1] == b'\n'))
}

/// How many lines both sides share at the end of `ours`/`theirs` (`from_end`) or at
/// their start.
fn common_lines(ours: &[u8], theirs: &[u8], from_end: bool) -> usize {
    let (o, t) = (lines(ours), lines(theirs));
    if from_end {
        o.iter()
            .rev()
            .zip(t.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
    } else {
        o.iter().zip(&t).take_while(|(a, b)| a == b).count()
    }
}

/// Joins conflicts that git would report as one: two conflicts with only unchanged lines
/// between them (lines the files all have there, `inputs` = base, ours, theirs), at most
/// [`JOIN_GAP`] of them or none with a letter or digit, counting the lines the conflicts
/// share at their facing edges (git moves those out first, then joins).
fn join_close_conflicts(pieces: Vec<Piece>, inputs: [&[u8]; 3]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut rest = pieces.into_iter().peekable();
    while let Some(piece) = rest.next() {
        let Piece::Lines(between) = piece else {
            out.push(piece);
            continue;
        };
        let (Some(Piece::Conflict(_)), Some(Piece::Conflict(_))) = (out.last(), rest.peek()) else {
            out.push(Piece::Lines(between));
            continue;
        };
        let (Some(Piece::Conflict(first)), Some(Piece::Conflict(second))) =
            (out.pop(), rest.next())
        else {
            unreachable!("checked above")
        };
        let ([_, o1, t1], [_, o2, t2]) = (&first, &second);
        let tail = lines(o1)[lines(o1).len() - common_lines(o1, t1, true)..].concat();
        let head = lines(o2)[..common_lines(o2, t2, false)].concat();
        let gap = [tail.as_slice(), &between, &head].concat();
        let gap_lines = lines(&gap);
        let short = gap_lines.len() <= JOIN_GAP
            || !gap_lines
                .iter()
                .any(|l| l.iter().any(u8::is_ascii_alphanumeric));
        // Unchanged: the same lines between the two conflicts in all three files (a change
        // of one side, or the same change on both, there keeps them apart in git).
        let joined = |i: usize| -> Vec<u8> { [first[i].as_slice(), &between, &second[i]].concat() };
        let unchanged = short && (0..3).all(|i| occurs_at_line_start(inputs[i], &joined(i)));
        if unchanged {
            out.push(Piece::Conflict(std::array::from_fn(joined)));
        } else {
            out.push(Piece::Conflict(first));
            out.push(Piece::Lines(between));
            out.push(Piece::Conflict(second));
        }
    }
    out
}

/// The lines of `data` (each with its `\n`, the last maybe without).
fn lines(data: &[u8]) -> Vec<&[u8]> {
    data.split_inclusive(|&b| b == b'\n').collect()
}

/// The merged file with git's markers and labels, and its conflicts.
fn render(pieces: &[Piece], ours_label: &str, theirs_label: &str) -> TextMerge {
    let mut merged = Vec::new();
    let mut hunks = Vec::new();
    let mut line = 1;
    let push = |merged: &mut Vec<u8>, line: &mut usize, data: &[u8]| {
        merged.extend_from_slice(data);
        *line += data.iter().filter(|&&b| b == b'\n').count();
    };
    for piece in pieces {
        match piece {
            Piece::Lines(data) => push(&mut merged, &mut line, data),
            Piece::Conflict([_, ours, theirs]) => {
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
