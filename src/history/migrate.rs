//! Transcript format 2: checkpoints in delta form ([`Record::delta`]).
//!
//! Before it, every checkpoint record spelled out the whole map of tracked paths, so the
//! transcript grew by the size of the tree at every checkpoint (1.2 MB per checkpoint at 10k
//! tracked paths) and replay cost O(checkpoints × tracked). Replay reads both forms the same
//! way, so old state dirs stay readable as they are; a daemon mounting one rewrites its
//! transcript in delta form once ([`to_delta_form`], atomically), so that later remounts and
//! `log` cost O(records).
use std::collections::HashSet;

use super::State;
use super::model::apply_record;
use crate::transcript::record::{FILE_HISTORY_SNAPSHOT, Record};

/// Whether `records` has a checkpoint in the old full form.
pub fn has_full_checkpoints(records: &[Record]) -> bool {
    records
        .iter()
        .any(|r| r.record_type == FILE_HISTORY_SNAPSHOT && r.is_checkpoint() && !r.delta)
}

/// `records` with every full-form checkpoint reduced to the entries replay acts on: paths
/// not tracked before it, and paths whose entry is a new version. Everything else in a full
/// map repeats a version replay already has, and replay skips it. So replaying the result
/// gives exactly the state replaying `records` gives; `seq`s and every other record are
/// unchanged.
pub fn to_delta_form(records: Vec<Record>) -> Vec<Record> {
    let mut state = State::default();
    let mut out = Vec::with_capacity(records.len());
    for mut r in records {
        let full_checkpoint =
            r.record_type == FILE_HISTORY_SNAPSHOT && r.is_checkpoint() && !r.delta;
        let keep: Option<HashSet<String>> = full_checkpoint.then(|| {
            r.snapshot
                .tracked_file_backups
                .iter()
                .filter(|(path, b)| {
                    state
                        .paths
                        .get(path.as_str())
                        .is_none_or(|h| b.version as usize == h.versions.len() + 1)
                })
                .map(|(path, _)| path.clone())
                .collect()
        });
        apply_record(&mut state, &r);
        if let Some(keep) = keep {
            r.snapshot
                .tracked_file_backups
                .retain(|path, _| keep.contains(path));
            r.delta = true;
        }
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::VersionState;
    use crate::transcript::record::TrackedFileBackup;

    const T: &str = "2026-01-02T03:04:05.678Z";

    fn file(version: u32, object: &str) -> TrackedFileBackup {
        crate::transcript::testutil::file_entry(version, object, T)
    }

    fn pending(version: u32) -> TrackedFileBackup {
        TrackedFileBackup {
            backup_file_name: None,
            meta: None,
            pending: true,
            ..file(version, "")
        }
    }

    /// A history in the old form: 50 paths backed up before c0, then at each of 20
    /// checkpoints path `p{i % 50}` changed, one of them still pending and filled later.
    fn full_form_history() -> Vec<Record> {
        let mut records = Vec::new();
        let mut seq = 0;
        let mut next = || {
            seq += 1;
            seq
        };
        let mut versions: BTreeMap<String, u32> = BTreeMap::new();
        for i in 0..50 {
            let p = format!("p{i}");
            let files = BTreeMap::from([(p.clone(), file(1, &format!("{p}v1")))]);
            records.push(Record::snapshot_update(None, next(), T.into(), files));
            versions.insert(p, 1);
        }
        let mut latest: Option<String> = None;
        for k in 0..20 {
            let changed = format!("p{}", k % 50);
            let v = versions[&changed] + 1;
            versions.insert(changed.clone(), v);
            let map = versions
                .iter()
                .map(|(p, &v)| {
                    let b = if *p == changed && k == 7 {
                        pending(v)
                    } else {
                        file(v, &format!("{p}v{v}"))
                    };
                    (p.clone(), b)
                })
                .collect();
            let id = format!("c{k}");
            records.push(Record::checkpoint(&id, next(), T.into(), map));
            if k == 7 {
                let fill = BTreeMap::from([(changed.clone(), file(v, "filled"))]);
                records.push(Record::snapshot_update(Some(&id), next(), T.into(), fill));
            }
            // Changed again after the checkpoint: the next one makes its new version.
            let files = BTreeMap::from([(changed, file(v, &format!("again{k}")))]);
            records.push(Record::snapshot_update(Some(&id), next(), T.into(), files));
            latest = Some(id);
        }
        assert!(latest.is_some());
        records
    }

    fn replay(records: &[Record]) -> State {
        let mut st = State::default();
        for r in records {
            apply_record(&mut st, r);
        }
        st
    }

    /// A path's first epoch, dirty flag, and versions (made at, state).
    type PathSummary = (usize, bool, Vec<(Option<usize>, String)>);

    /// Everything replay knows, in a comparable form.
    fn summary(st: &State) -> BTreeMap<String, PathSummary> {
        st.paths
            .iter()
            .map(|(p, h)| {
                let versions = h
                    .versions
                    .iter()
                    .map(|v| {
                        let state = match &v.state {
                            VersionState::Pending => "pending".to_string(),
                            VersionState::Absent => "absent".to_string(),
                            VersionState::Present { object, .. } => format!("{object:?}"),
                        };
                        (v.since, state)
                    })
                    .collect();
                (p.clone(), (h.first_epoch, h.dirty, versions))
            })
            .collect()
    }

    #[test]
    fn delta_form_replays_to_the_same_state_and_is_small() {
        let full = full_form_history();
        assert!(has_full_checkpoints(&full));
        let full_bytes = serde_json::to_vec(&full).unwrap().len();
        let before = replay(&full);
        let delta = to_delta_form(full.clone());
        assert!(!has_full_checkpoints(&delta));
        assert_eq!(delta.len(), full.len());
        for (a, b) in full.iter().zip(&delta) {
            assert_eq!(a.seq, b.seq);
            if b.is_checkpoint() {
                assert!(b.delta);
                assert_eq!(b.snapshot.tracked_file_backups.len(), 1, "seq {}", b.seq);
            } else {
                assert_eq!(a, b);
            }
        }
        let after = replay(&delta);
        assert_eq!(summary(&before), summary(&after));
        assert_eq!(
            before.checkpoints.iter().map(|c| &c.id).collect::<Vec<_>>(),
            after.checkpoints.iter().map(|c| &c.id).collect::<Vec<_>>()
        );
        assert_eq!(before.children, after.children);
        assert_eq!(before.dirty_paths, after.dirty_paths);
        let delta_bytes = serde_json::to_vec(&delta).unwrap().len();
        assert!(
            delta_bytes * 3 < full_bytes,
            "delta form {delta_bytes} B, full form {full_bytes} B"
        );
        // Idempotent: a delta transcript is left as it is.
        assert_eq!(to_delta_form(delta.clone()), delta);
    }

    #[test]
    fn a_repeated_checkpoint_id_stays_ignored() {
        let mut records = full_form_history();
        let seq = records.last().unwrap().seq + 1;
        records.push(Record::checkpoint(
            "c3",
            seq,
            T.into(),
            BTreeMap::from([("p0".to_string(), file(99, "x"))]),
        ));
        let before = replay(&records);
        let after = replay(&to_delta_form(records));
        assert_eq!(summary(&before), summary(&after));
        assert_eq!(before.checkpoints.len(), after.checkpoints.len());
    }
}
