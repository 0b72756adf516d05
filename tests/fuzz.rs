//! Bounded fuzzing on stable Rust (issue 11): the transcript parser and replay, the store
//! journal parser, the control-protocol request parser and `ctl` line parsing, each fed the
//! committed corpus (tests/fuzz-corpus/<target>/) and then mutations of it from a seeded
//! PRNG until its time budget runs out. Asserts no panic and clean errors (a message that
//! names the problem), plus each target's own properties.
//!
//! Budget: `CHECKPOINTFS_FUZZ_SECS` seconds per target (default 2; scripts/test.sh runs 20).
//! Seed: `CHECKPOINTFS_FUZZ_SEED` (default fixed, so a plain run is reproducible); a failure
//! prints the seed and writes the input to target/fuzz-crashes/<target>-<n>.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use std::fs;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use checkpointfs::control::{MAX_REQUEST, parse_request};
use checkpointfs::ids::{CtlLine, MAX_CTL_LINE, take_ctl_lines, validate_id};
use checkpointfs::transcript::journal::{JOURNAL_FILE_NAME, Journal};
use checkpointfs::transcript::replay::read_transcript;

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

/// Bytes that matter to the formats: JSON syntax, the record fields, ctl separators.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b":",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"4294967296",
    b"18446744073709551616",
    b"\"version\":",
    b"\"seq\":",
    b"\"type\":\"file-history-snapshot\"",
    b"\"isSnapshotUpdate\":false",
    b"\"pending\":true",
    b"\"backupFileName\":\"../x\"",
    b"\"mode\":3565",
    b"\"cmd\":\"rewind\"",
    b"session ",
    b" ",
    b"\xff",
    b"\\u0000",
];

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
                let t = TOKENS[rng.below(TOKENS.len())];
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
fn fuzz(target: &str, check: impl Fn(&[u8], &mut Rng)) -> u64 {
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
        let mut case_rng = Rng(rng.next() | 1);
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&input, &mut case_rng))) {
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
                "fuzz target {target}: input {runs} failed (seed {seed}, \
                 CHECKPOINTFS_FUZZ_SEED to replay; input saved as {}): {msg}",
                path.display()
            );
        }
        runs += 1;
    }
    eprintln!("fuzz {target}: {runs} inputs in {:?}", budget());
    runs
}

/// A scratch file, rewritten for every input (a parser that reads paths needs one). In
/// /dev/shm where there is one: rewriting a file by truncation on ext4 starts writeback at
/// every close (auto_da_alloc), which would cost most of the budget.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let path = dir.path().join(name);
    (dir, path)
}

#[test]
fn fuzz_transcript_parser_and_replay() {
    let (_dir, path) = scratch("transcript.jsonl");
    let replayed = std::cell::Cell::new(0u64);
    let runs = fuzz("transcript", |input, _| {
        fs::write(&path, input).unwrap();
        match read_transcript(&path) {
            Ok(outcome) => {
                let seqs: Vec<u64> = outcome.records.iter().map(|r| r.seq).collect();
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs {seqs:?}");
                // Some objects present, some missing, decided by name.
                let mut has_object = |name: &str| !name.starts_with('0');
                match checkpointfs::history::replay_for_fuzzing(&outcome.records, &mut has_object) {
                    Ok(_) => replayed.set(replayed.get() + 1),
                    Err(why) => assert!(!why.is_empty()),
                }
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("transcript") && msg.contains("line"),
                    "unclear error: {msg}"
                );
            }
        }
    });
    assert!(runs > 0);
    assert!(replayed.get() > 0, "no input got as far as a full replay");
}

#[test]
fn fuzz_journal_parser() {
    let (dir, _) = scratch("");
    let path = dir.path().join(JOURNAL_FILE_NAME);
    fuzz("journal", |input, rng| {
        fs::write(&path, input).unwrap();
        let after = rng.below(20) as u64;
        match Journal::read_after(&path, after) {
            Ok(records) => assert!(records.iter().all(|r| r.seq > after)),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("store journal"), "unclear error: {msg}");
            }
        }
    });
}

#[test]
fn fuzz_control_requests() {
    let parsed = std::cell::Cell::new(0u64);
    fuzz("control", |input, rng| {
        let line = input.strip_suffix(b"\n").unwrap_or(input);
        let line = &line[..line.len().min(MAX_REQUEST)];
        let terminated = rng.below(2) == 0;
        match parse_request(line, terminated) {
            Ok(req) => {
                parsed.set(parsed.get() + 1);
                // What the daemon accepts, the client can send.
                let again = serde_json::to_vec(&req).unwrap();
                parse_request(&again, true).expect("a request as the client sends it");
            }
            Err(why) => assert!(why.starts_with("bad control request: "), "{why}"),
        }
    });
    assert!(parsed.get() > 0);
}

/// The lines of `data` taken in one write, or split at any byte into two writes, are the
/// same: an id cut across writes is one id.
#[test]
fn fuzz_ctl_lines() {
    fuzz("ctl", |input, rng| {
        if let Ok(id) = validate_id(input) {
            assert!(id.len() <= 128 && !id.contains(['/', ' ', '\n']));
        }
        let whole = take_ctl_lines(b"", input, false);
        let cut = rng.below(input.len() + 1);
        let first = take_ctl_lines(b"", &input[..cut], false);
        if let Ok(batch) = &whole {
            assert!(batch.rest.len() <= MAX_CTL_LINE && !batch.rest.contains(&b'\n'));
            for line in &batch.lines {
                if let CtlLine::Checkpoint(id) = line {
                    assert!(validate_id(id.as_bytes()).is_ok(), "{id:?}");
                }
            }
            let closed = take_ctl_lines(&batch.rest, b"", true);
            if let Ok(closed) = closed {
                assert!(closed.rest.is_empty() && closed.lines.len() <= 1);
            }
        }
        if let (Ok(whole), Ok(first)) = (&whole, &first) {
            let second = take_ctl_lines(&first.rest, &input[cut..], false)
                .expect("the whole write was taken, so its second part is");
            let mut lines = first.lines.clone();
            lines.extend(second.lines);
            assert_eq!(whole.lines, lines, "cut at {cut}");
            assert_eq!(whole.rest, second.rest);
        }
    });
}
