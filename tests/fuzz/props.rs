//! What each fuzz target checks of one input, shared by the stable mutation fuzzer
//! (tests/it/fuzz.rs) and the coverage-guided cargo-fuzz targets (fuzz/fuzz_targets/, which
//! include this file by path). A `check_*` panics when a property fails: the library panicked,
//! an error does not name the problem, or a target's own property does not hold.
//!
//! Where a check has a free choice (the journal's `after`, where a ctl write is cut), the input
//! picks it (`pick`), so a failing input fails again alone, whichever fuzzer found it.
#![allow(
    dead_code,
    reason = "each cargo-fuzz target includes this file for its one check"
)]
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use checkpointfs::read_transcript;
use checkpointfs::{CtlLine, MAX_CTL_LINE, take_ctl_lines, validate_id};
use checkpointfs::{JOURNAL_FILE_NAME, Journal};
use checkpointfs::{MAX_REQUEST, parse_request};
use checkpointfs::{RecordKey, Signer};

/// A number below `n` (at least 1) that the input picks: its FNV-1a hash.
fn pick(input: &[u8], n: usize) -> usize {
    let h = input.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % n.max(1) as u64) as usize
}

/// This process's scratch directory, for the parsers that read a file: made on first use, in
/// /dev/shm where there is one (rewriting a file by truncation on ext4 starts writeback at
/// every close, auto_da_alloc, which would cost most of the budget), and removed at exit by
/// atexit(3), since libFuzzer ends a run with exit(3) and drops nothing. (A crash ends it with
/// _exit(2): the directory, /dev/shm/checkpointfs-fuzz-*, is then left.)
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    #[allow(
        clippy::disallowed_methods,
        reason = "the fuzz targets' own scratch directory, not SRC"
    )]
    extern "C" fn remove_scratch() {
        if let Some(dir) = DIR.get() {
            let _ = fs::remove_dir_all(dir);
        }
    }
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("checkpointfs-fuzz-");
        let dir = if shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        };
        let dir = dir
            .expect("a scratch directory for the fuzz targets")
            .keep();
        // SAFETY: registers a plain function with no arguments, as atexit(3) asks.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// Writes `input` to `name` in the scratch directory, for a parser to read back.
#[allow(
    clippy::disallowed_methods,
    reason = "the fuzz targets' own scratch file, not SRC"
)]
fn scratch_file(name: &str, input: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    fs::write(&path, input).expect("writing a scratch file");
    path
}

/// The transcript parser, then replay of what it read: seqs strictly increase, replay refuses
/// an impossible history with a reason rather than panic, and every path is looked up at every
/// checkpoint. Returns whether the input got as far as a full replay.
pub fn check_transcript(input: &[u8]) -> bool {
    // Not named like the journal, so errors must say "transcript" for themselves.
    let path = scratch_file("session.jsonl", input);
    match read_transcript(&path) {
        Ok(outcome) => {
            let seqs: Vec<u64> = outcome.records.iter().map(|r| r.seq).collect();
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seqs {seqs:?}");
            // Some objects present, some missing, decided by name.
            let mut has_object = |name: &str| !name.starts_with('0');
            // A fixed key: a set-id entry the input did not sign with it is refused.
            let key = RecordKey::from_bytes([7; 32], "fuzz/record.key".into());
            let signer = Signer::new(Ok(std::sync::Arc::new(key)), "0".repeat(32));
            let check = |path: &str, b: &_| signer.check(path, b);
            match checkpointfs::replay_for_fuzzing(&outcome.records, &mut has_object, &check) {
                Ok(_) => true,
                Err(why) => {
                    assert!(!why.is_empty(), "replay refused with no reason");
                    false
                }
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("transcript") && msg.contains("line"),
                "unclear error: {msg}"
            );
            false
        }
    }
}

/// The store journal parser: only records after the asked-for seq, and errors that name the
/// store journal.
pub fn check_journal(input: &[u8]) {
    // The store journal's own name, which is what makes errors say "store journal".
    let path = scratch_file(JOURNAL_FILE_NAME, input);
    let after = pick(input, 20) as u64;
    match Journal::read_after(&path, after) {
        Ok(records) => assert!(records.iter().all(|r| r.seq > after), "after {after}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("store journal"), "unclear error: {msg}");
        }
    }
}

/// The control-protocol request parser, the line (without its newline, at most the daemon's
/// limit) taken as terminated and as cut short: errors start "bad control request: ", and
/// whatever the daemon accepts, the client can send. Returns whether a request parsed.
pub fn check_control(input: &[u8]) -> bool {
    let line = input.strip_suffix(b"\n").unwrap_or(input);
    let line = &line[..line.len().min(MAX_REQUEST)];
    let mut parsed = false;
    for terminated in [true, false] {
        match parse_request(line, terminated) {
            Ok(req) => {
                parsed = true;
                let again = serde_json::to_vec(&req).expect("a parsed request serializes");
                parse_request(&again, true).expect("a request as the client sends it");
            }
            Err(why) => assert!(why.starts_with("bad control request: "), "{why}"),
        }
    }
    parsed
}

/// `ctl` lines: a valid id is short and has no separator; every checkpoint id taken is valid;
/// what is left over is one partial line, taken whole at close; and the lines of the input
/// taken in one write, or cut into two writes, are the same (an id cut across writes is one
/// id).
pub fn check_ctl(input: &[u8]) {
    if let Ok(id) = validate_id(input) {
        assert!(id.len() <= 128 && !id.contains(['/', ' ', '\n']), "{id:?}");
    }
    let whole = take_ctl_lines(b"", input, false);
    let cut = pick(input, input.len() + 1);
    let first = take_ctl_lines(b"", &input[..cut], false);
    if let Ok(batch) = &whole {
        assert!(batch.rest.len() <= MAX_CTL_LINE && !batch.rest.contains(&b'\n'));
        for line in &batch.lines {
            if let CtlLine::Checkpoint(id) = line {
                assert!(validate_id(id.as_bytes()).is_ok(), "{id:?}");
            }
        }
        if let Ok(closed) = take_ctl_lines(&batch.rest, b"", true) {
            assert!(closed.rest.is_empty() && closed.lines.len() <= 1);
        }
    }
    if let (Ok(whole), Ok(first)) = (&whole, &first) {
        let second = take_ctl_lines(&first.rest, &input[cut..], false)
            .expect("the whole write was taken, so its second part is");
        let mut lines = first.lines.clone();
        lines.extend(second.lines);
        assert_eq!(whole.lines, lines, "cut at {cut}");
        assert_eq!(whole.rest, second.rest, "cut at {cut}");
    }
}

/// The FUSE request decoder (src/transport/decode.rs) on `input` as a `/dev/fuse` read and
/// as a ring entry (the first 288 bytes a `fuse_uring_req_header`, the rest the payload, cut
/// to its `payload_sz`), under both SETXATTR layouts. It must not panic; an accepted
/// `/dev/fuse` request is exactly as long as its header says; a failure keeps the header
/// when one was readable; and the ring entry, laid out as `/dev/fuse` would deliver it,
/// decodes to the same request. True when the `/dev/fuse` decoding accepted the input.
pub fn check_fuse_decode(input: &[u8]) -> bool {
    use checkpointfs::transport::decode::{Proto, decode, decode_split};
    let mut accepted = false;
    for setxattr_ext in [false, true] {
        let proto = Proto {
            minor: 45,
            setxattr_ext,
        };
        match decode(input, &proto) {
            Ok(r) => {
                assert_eq!(
                    r.header.len as usize,
                    input.len(),
                    "accepted a wrong length"
                );
                accepted = true;
            }
            Err(e) => assert_eq!(
                e.header.is_some(),
                input.len() >= 40,
                "a readable header was dropped (or invented): {e}"
            ),
        }
        if input.len() < 288 {
            continue;
        }
        let (in_out, op_in) = (&input[..128], &input[128..256]);
        let payload_sz = u32::from_ne_bytes([input[272], input[273], input[274], input[275]]);
        let payload = &input[288..];
        let payload = &payload[..(payload_sz as usize).min(payload.len())];
        if let Ok(split) = decode_split(in_out, op_in, payload, &proto) {
            let fixed = split.header.len as usize - 40 - payload.len();
            let mut joined = in_out[..40].to_vec();
            joined.extend_from_slice(&op_in[..fixed]);
            joined.extend_from_slice(payload);
            // Where op_in held nothing (the name-only opcodes), both layouts are the same
            // bytes in the same order and must decode alike. (With a fixed struct longer than
            // the decoder reads, a newer kernel's, they legitimately differ.)
            if fixed == 0 {
                let whole = decode(&joined, &proto).map(|r| format!("{:?}", r.op));
                assert_eq!(
                    whole.as_deref().ok(),
                    Some(format!("{:?}", split.op).as_str()),
                    "ring and /dev/fuse layouts disagree"
                );
            }
        }
    }
    accepted
}
