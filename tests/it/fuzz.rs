//! Bounded fuzzing on stable Rust with no instrumentation (issue 11): the transcript parser
//! and replay, the store journal parser, the control-protocol request parser and `ctl` line
//! parsing, each fed the committed corpus (tests/fuzz-corpus/<target>/) and then mutations of
//! it from a seeded PRNG until its time budget runs out. What each input must satisfy (no
//! panic, errors that name the problem, each target's own properties) is in fuzz/props.rs,
//! which the coverage-guided cargo-fuzz targets (fuzz/fuzz_targets/) check too.
//!
//! Budget: `CHECKPOINTFS_FUZZ_SECS` seconds per target (default 2). Seed:
//! `CHECKPOINTFS_FUZZ_SEED` (default fixed, so a plain run is reproducible). A failing input
//! fails again alone (props.rs draws nothing from the PRNG): it is written to
//! target/fuzz-crashes/<target>-<n>, and `cargo fuzz run <target> <file>` replays it.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use std::cell::Cell;
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

#[path = "../fuzz/props.rs"]
mod props;

/// xorshift64*: small, fast, and the same sequence for the same seed everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The tokens of tests/fuzz-corpus/formats.dict (libFuzzer's `-dict=` format: one quoted
/// token a line, with `\\`, `\"` and `\xNN` escapes), spliced in as one of the mutations.
static TOKENS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus/formats.dict");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tokens: Vec<Vec<u8>> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let quoted = l
                .strip_prefix('"')
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{}: not a quoted token: {l}", path.display()));
            let mut token = Vec::new();
            let mut rest = quoted.as_bytes();
            while let Some((&b, tail)) = rest.split_first() {
                rest = tail;
                if b != b'\\' {
                    token.push(b);
                } else if let [b'x', hi, lo, tail @ ..] = rest {
                    let byte = std::str::from_utf8(&[*hi, *lo])
                        .ok()
                        .and_then(|hex| u8::from_str_radix(hex, 16).ok());
                    token.push(
                        byte.unwrap_or_else(|| panic!("{}: bad \\x escape in {l}", path.display())),
                    );
                    rest = tail;
                } else if let [escaped, tail @ ..] = rest {
                    token.push(*escaped);
                    rest = tail;
                }
            }
            token
        })
        .collect();
    assert!(!tokens.is_empty(), "{} holds no token", path.display());
    tokens
});

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut data = corpus[rng.below(corpus.len())].clone();
    for _ in 0..=rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(8) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let t = &TOKENS[rng.below(TOKENS.len())];
                data.splice(at..at, t.iter().copied());
            }
            2 if !data.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                data.drain(at.min(end)..end);
            }
            3 => data.truncate(at),
            4 => {
                // A run of digits becomes another number (versions, seqs, modes, sizes).
                if let Some(start) = (at..data.len()).find(|&i| data[i].is_ascii_digit()) {
                    let end = (start..data.len())
                        .find(|&i| !data[i].is_ascii_digit())
                        .unwrap_or(data.len());
                    let n = match rng.below(4) {
                        0 => rng.below(4) as u64,
                        1 => rng.next() >> rng.below(64),
                        _ => rng.below(100) as u64,
                    };
                    data.splice(start..end, n.to_string().into_bytes());
                }
            }
            5 => {
                // Splice in part of another corpus entry (or of this one).
                let other = &corpus[rng.below(corpus.len())];
                let from = rng.below(other.len() + 1);
                let to = (from + rng.below(256)).min(other.len());
                data.splice(at..at, other[from..to].iter().copied());
            }
            6 if !data.is_empty() => {
                // Duplicate a line-sized chunk (repeated records, repeated ids).
                let end = (at + rng.below(512)).min(data.len());
                let chunk = data[at.min(end)..end].to_vec();
                data.splice(end..end, chunk);
            }
            _ => {
                let b = rng.next() as u8;
                data.insert(at, b);
            }
        }
    }
    data
}

fn budget() -> Duration {
    let secs = std::env::var("CHECKPOINTFS_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs.max(0.0))
}

fn seed(target: &str) -> u64 {
    let base = std::env::var("CHECKPOINTFS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0x5eed_c0ff_ee15_600d);
    // Different targets, different sequences; never the all-zero state.
    target.bytes().fold(base, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-corpus")
        .join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files.iter().map(|p| fs::read(p).unwrap()).collect();
    assert!(!inputs.is_empty(), "{} holds no corpus", dir.display());
    inputs
}

/// Runs `check` on every corpus entry, then on mutations until the budget is spent. Returns
/// how many inputs ran.
fn fuzz(target: &str, check: impl Fn(&[u8])) -> u64 {
    let inputs = corpus(target);
    let seed = seed(target);
    let mut rng = Rng(seed);
    let deadline = Instant::now() + budget();
    let mut runs = 0u64;
    let mut i = 0;
    loop {
        let input = if i < inputs.len() {
            inputs[i].clone()
        } else if Instant::now() < deadline {
            mutate(&mut rng, &inputs)
        } else {
            break;
        };
        i += 1;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&input))) {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes");
            fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("{target}-{runs}"));
            fs::write(&path, &input).unwrap();
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "fuzz target {target}: input {runs} failed (seed {seed}): {msg}\n\
                 input saved as {0}; replay it alone, in the repository, with \
                 `RUSTC_BOOTSTRAP=1 cargo fuzz run {target} {0}`",
                path.display()
            );
        }
        runs += 1;
    }
    eprintln!("fuzz {target}: {runs} inputs in {:?}", budget());
    runs
}

#[test]
fn fuzz_transcript_parser_and_replay() {
    let replayed = Cell::new(0u64);
    let runs = fuzz("transcript", |input| {
        if props::check_transcript(input) {
            replayed.set(replayed.get() + 1);
        }
    });
    assert!(runs > 0);
    assert!(replayed.get() > 0, "no input got as far as a full replay");
}

#[test]
fn fuzz_journal_parser() {
    fuzz("journal", props::check_journal);
}

#[test]
fn fuzz_control_requests() {
    let parsed = Cell::new(0u64);
    fuzz("control", |input| {
        if props::check_control(input) {
            parsed.set(parsed.get() + 1);
        }
    });
    assert!(parsed.get() > 0, "no input parsed as a request");
}

/// The lines of `data` taken in one write, or split at any byte into two writes, are the
/// same: an id cut across writes is one id.
#[test]
fn fuzz_ctl_lines() {
    fuzz("ctl", props::check_ctl);
}

/// The FUSE request decoder, as a /dev/fuse read and as a ring entry (issue 26).
#[test]
fn fuzz_fuse_decoder() {
    let accepted = Cell::new(0u64);
    fuzz("fuse_decode", |input| {
        if props::check_fuse_decode(input) {
            accepted.set(accepted.get() + 1);
        }
    });
    assert!(accepted.get() > 0, "no input decoded as a request");
}
