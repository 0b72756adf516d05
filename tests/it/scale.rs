//! Costs that must grow with what changes, never with the size of the tree or the length of
//! the session (issue 10): the transcript bytes a checkpoint adds, and the one-time rewrite
//! of a transcript from before delta checkpoints.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::collections::BTreeMap;
use std::fs;

use common::{TestMount, at, checkpoint, cli_ok, transcript_records, tree_listing};
use serde_json::Value;

fn transcript_len(m: &TestMount) -> u64 {
    fs::metadata(m.state.join("transcript.jsonl"))
        .unwrap()
        .len()
}

fn is_checkpoint(r: &Value) -> bool {
    r["isSnapshotUpdate"] == Value::Bool(false)
}

/// The same history with every checkpoint spelling out the whole map of tracked paths, as
/// transcripts were written before delta checkpoints (composed here independently of the
/// daemon: a path's entry is the last one recorded for it, Layer 1 or checkpoint).
fn to_full_form(records: &[Value]) -> Vec<Value> {
    let mut latest: BTreeMap<String, Value> = BTreeMap::new();
    let mut out = Vec::new();
    for r in records {
        let mut r = r.clone();
        let backups = r["snapshot"]["trackedFileBackups"]
            .as_object()
            .unwrap()
            .clone();
        if is_checkpoint(&r) {
            for (path, b) in backups {
                latest.insert(path, b);
            }
            let full: serde_json::Map<String, Value> = latest
                .iter()
                .map(|(p, b)| {
                    let mut b = b.clone();
                    let o = b.as_object_mut().unwrap();
                    o.remove("actor");
                    o.remove("fill");
                    (p.clone(), b)
                })
                .collect();
            r["snapshot"]["trackedFileBackups"] = Value::Object(full);
            r.as_object_mut().unwrap().remove("delta");
        } else {
            for (path, b) in backups {
                // A Layer 1 record of a new version, or the fill of a pending one.
                let newer = latest
                    .get(&path)
                    .is_none_or(|old| b["version"].as_u64() >= old["version"].as_u64());
                if newer {
                    latest.insert(path, b);
                }
            }
        }
        out.push(r);
    }
    out
}

#[test]
fn a_checkpoint_adds_what_changed_to_the_transcript_not_the_tree() {
    const TRACKED: usize = 10_000;
    const CHECKPOINTS: usize = 20;
    let mut m = TestMount::new();
    // 10,000 paths tracked through the mount (each create is a Layer 1 record).
    let py = format!(
        "import os\nfor d in range({}):\n    os.mkdir(f'd{{d}}')\n    for i in range(100):\n        \
         open(f'd{{d}}/f{{i}}', 'w').write(f'{{d}}/{{i}}\\n')\n",
        TRACKED / 100
    );
    let out = common::run("python3", &["-c", &py], &m.mnt);
    assert!(out.status.success(), "{}", common::stderr(&out));
    checkpoint(&m, "c0");
    m.remount();
    let before = transcript_len(&m);
    for k in 1..=CHECKPOINTS {
        for j in 0..5 {
            let p = m.mnt.join(format!("d{}/f{}", (k * 7 + j) % 100, j));
            fs::write(&p, format!("changed at {k}\n")).unwrap();
        }
        checkpoint(&m, &format!("c{k}"));
    }
    m.umount();
    let per_checkpoint = (transcript_len(&m) - before) / CHECKPOINTS as u64;
    assert!(
        per_checkpoint <= 20_000,
        "{per_checkpoint} transcript bytes per checkpoint with {TRACKED} tracked paths"
    );
    // Each checkpoint record lists exactly its 5 new versions.
    let recs = transcript_records(&m.state);
    let sizes: Vec<usize> = recs
        .iter()
        .filter(|r| is_checkpoint(r))
        .skip(1)
        .map(|r| {
            r["snapshot"]["trackedFileBackups"]
                .as_object()
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, vec![5; CHECKPOINTS]);

    // Replay composes the deltas: every view shows its own moment.
    m.mount();
    for k in [1, 7, CHECKPOINTS] {
        let view = at(&m, &format!("c{k}"));
        for j in 0..5 {
            let rel = format!("d{}/f{}", (k * 7 + j) % 100, j);
            assert_eq!(
                fs::read_to_string(view.join(&rel)).unwrap(),
                format!("changed at {k}\n"),
                "at/c{k}/{rel}"
            );
        }
    }
    assert_eq!(
        fs::read_to_string(at(&m, "c0").join("d7/f0")).unwrap(),
        "7/0\n"
    );
    let log = cli_ok(&["log", "--json", m.mnt.to_str().unwrap()]);
    let log: Value = serde_json::from_str(&log).unwrap();
    let counts: Vec<u64> = log["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["files_changed"].as_u64().unwrap())
        .collect();
    let mut expected = vec![5; CHECKPOINTS];
    expected.push(0);
    assert_eq!(counts, expected, "files changed after each checkpoint");
}

#[test]
fn a_transcript_with_full_checkpoints_is_rewritten_in_delta_form_with_the_same_history() {
    let mut m = TestMount::unmounted(&[]);
    for i in 0..50 {
        fs::write(m.src.join(format!("f{i}")), format!("seed {i}\n")).unwrap();
    }
    m.mount();
    let mut views = Vec::new();
    for k in 0..6 {
        for i in (k..50).step_by(7) {
            fs::write(m.mnt.join(format!("f{i}")), format!("v{k} {i}\n")).unwrap();
        }
        if k == 3 {
            fs::remove_file(m.mnt.join("f1")).unwrap();
            fs::create_dir(m.mnt.join("newdir")).unwrap();
        }
        let id = format!("c{k}");
        checkpoint(&m, &id);
        views.push((id.clone(), tree_listing(&at(&m, &id))));
    }
    fs::write(m.mnt.join("f2"), "after the last\n").unwrap();
    let log_before = cli_ok(&["log", m.mnt.to_str().unwrap()]);
    m.umount();

    let full = to_full_form(&transcript_records(&m.state));
    let full_text: String = full
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    fs::write(m.state.join("transcript.jsonl"), &full_text).unwrap();
    // The old form is readable as it is, without a daemon.
    let offline = cli_ok(&["log", "--state-dir", m.state.to_str().unwrap()]);
    assert!(offline.contains("c5"), "{offline}");

    m.mount();
    for (id, listing) in &views {
        assert_eq!(
            &tree_listing(&at(&m, id)),
            listing,
            "at/{id} after migration"
        );
    }
    assert_eq!(cli_ok(&["log", m.mnt.to_str().unwrap()]), log_before);
    m.umount();
    let migrated = transcript_records(&m.state);
    assert_eq!(migrated.len(), full.len());
    for r in migrated.iter().filter(|r| is_checkpoint(r)) {
        assert_eq!(r["delta"], Value::Bool(true), "{r}");
    }
    assert!(
        transcript_len(&m) < full_text.len() as u64,
        "{} bytes after, {} before",
        transcript_len(&m),
        full_text.len()
    );
}
