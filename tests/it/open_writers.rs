//! A checkpoint is one moment, also for files held open for writing (issue 10): with kernel
//! passthrough the daemon never sees those writes, so the copy a checkpoint makes of such a
//! file must still be a content the file really had.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{TestMount, at, checkpoint};

const BLOCK: usize = 4096;
const SIZE: usize = 4 << 20;

/// A python3 process in MNT that rewrites each of `files` whole, over and over, in order,
/// each with one `pwrite` of 4 MiB whose every 4 KiB block carries the round number. It
/// prints `ready` once every file holds round 0, and stops when its stdin closes.
fn start_writer(m: &TestMount, files: &[&str]) -> Child {
    start_writer_of(m, files, SIZE)
}

/// [`start_writer`] with files of `size` bytes.
fn start_writer_of(m: &TestMount, files: &[&str], size: usize) -> Child {
    let script = format!(
        r#"
import os, sys, threading
SIZE, BLOCK = {size}, {BLOCK}
fds = [os.open(p, os.O_WRONLY | os.O_CREAT, 0o644) for p in {files:?}]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
def content(k):
    block = (b"%12d\n" % k) * (BLOCK // 13) + b"\n" * (BLOCK % 13)
    return block * (SIZE // BLOCK)
k = 0
while not stop.is_set():
    data = content(k)
    for fd in fds:
        os.pwrite(fd, data, 0)
    if k == 0:
        print("ready", flush=True)
    k += 1
print(k, flush=True)
"#
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .current_dir(&m.mnt)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start python3");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

/// Stops the writer and returns how many rounds it wrote.
fn stop_writer(mut child: Child) -> u64 {
    drop(child.stdin.take());
    let mut out = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut out)
        .unwrap();
    assert!(child.wait().unwrap().success());
    out.trim().parse().unwrap()
}

/// The round numbers in a copy of a writer's file, one per 4 KiB block.
fn rounds(data: &[u8]) -> Vec<u64> {
    assert!(
        !data.is_empty() && data.len().is_multiple_of(BLOCK),
        "a view of the file has the wrong size: {}",
        data.len()
    );
    data.chunks(BLOCK)
        .map(|b| {
            std::str::from_utf8(&b[..12])
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(u64::MAX)
        })
        .collect()
}

/// The single round a copy shows, or `None` if it mixes rounds (a content that never was).
fn whole_round(data: &[u8]) -> Option<u64> {
    let r = rounds(data);
    r.iter().all(|&x| x == r[0]).then_some(r[0])
}

/// Takes `n` checkpoints 50 ms apart while the writer runs.
fn checkpoints_while_writing(m: &TestMount, tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            std::thread::sleep(Duration::from_millis(50));
            let id = format!("{tag}{i}");
            checkpoint(m, &id);
            id
        })
        .collect()
}

#[test]
fn a_file_rewritten_whole_is_never_torn_with_passthrough() {
    let m = TestMount::new();
    let status = common::cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(
        status.contains("file io:        kernel passthrough ("),
        "{status}"
    );
    let writer = start_writer(&m, &["f"]);
    let ids = checkpoints_while_writing(&m, "c", 40);
    let written = stop_writer(writer);
    let mut torn = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for id in &ids {
        let data = fs::read(at(&m, id).join("f")).unwrap();
        match whole_round(&data) {
            Some(r) => {
                seen.insert(r);
            }
            None => torn.push(id.clone()),
        }
    }
    assert!(
        torn.is_empty(),
        "{} of {} views mix rounds: {torn:?}",
        torn.len(),
        ids.len()
    );
    // The checkpoints really raced the writer: they saw different rounds.
    assert!(
        written > 40 && seen.len() > 5,
        "{written} rounds, views saw {seen:?}"
    );
}

#[test]
fn two_files_written_in_order_are_seen_in_order() {
    let m = TestMount::new();
    let writer = start_writer(&m, &["first", "second"]);
    let ids = checkpoints_while_writing(&m, "c", 40);
    stop_writer(writer);
    let mut bad = Vec::new();
    for id in &ids {
        let view = at(&m, id);
        let a = whole_round(&fs::read(view.join("first")).unwrap());
        let b = whole_round(&fs::read(view.join("second")).unwrap());
        // Round k of `first` is written before round k of `second`: a moment of the tree
        // has both at k, or `first` one ahead.
        match (a, b) {
            (Some(a), Some(b)) if a == b || a == b + 1 => {}
            other => bad.push(format!("{id}: {other:?}")),
        }
    }
    let mut report = std::io::stderr();
    let _ = writeln!(report, "{} of {} views out of order", bad.len(), ids.len());
    assert!(bad.is_empty(), "views that never existed: {bad:?}");
}

/// A file too big to copy again under the epoch lock (more than 16 MiB) gets a copy right
/// after it instead (history/open_files.rs): still one moment of the file, never torn, and
/// never older than what was written before the checkpoint, also when checkpoints come
/// faster than the copies (they share one).
#[test]
fn a_big_file_rewritten_whole_is_copied_after_the_lock_and_never_torn() {
    const BIG: usize = 24 << 20;
    let m = TestMount::new();
    let writer = start_writer_of(&m, &["big"], BIG);
    let src = m.src.join("big");
    let mut ids = Vec::new();
    for i in 0..20 {
        // Round r is being written, so every round before it is complete: the checkpoint
        // must show at least r - 1.
        let mut head = [0u8; 12];
        std::io::Read::read_exact(&mut fs::File::open(&src).unwrap(), &mut head).unwrap();
        let begun: u64 = std::str::from_utf8(&head).unwrap().trim().parse().unwrap();
        let id = format!("b{i}");
        checkpoint(&m, &id);
        ids.push((id, begun.saturating_sub(1)));
        std::thread::sleep(Duration::from_millis(20 * (i % 3) as u64));
    }
    let written = stop_writer(writer);
    let mut bad = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (id, at_least) in &ids {
        let data = fs::read(at(&m, id).join("big")).unwrap();
        match whole_round(&data) {
            Some(r) if r >= *at_least => {
                seen.insert(r);
            }
            other => bad.push(format!("{id}: {other:?} (at least {at_least})")),
        }
    }
    assert!(
        bad.is_empty(),
        "views that never existed or are too old: {bad:?}"
    );
    assert!(seen.len() > 2, "{written} rounds, views saw {seen:?}");
    // A rewind to one of them restores that content whole.
    let (id, _) = &ids[ids.len() / 2];
    let expected = fs::read(at(&m, id).join("big")).unwrap();
    common::rewind(&m, id, &[]);
    assert_eq!(fs::read(m.mnt.join("big")).unwrap(), expected);
}
