//! Migrations of older state dirs, each done once by the daemon that mounts one.
//!
//! Transcript format 2: checkpoints in delta form ([`Record::delta`]).
//!
//! Before it, every checkpoint record spelled out the whole map of tracked paths, so the
//! transcript grew by the size of the tree at every checkpoint (1.2 MB per checkpoint at 10k
//! tracked paths) and replay cost O(checkpoints × tracked). Replay reads both forms the same
//! way, so old state dirs stay readable as they are; a daemon mounting one rewrites its
//! transcript in delta form once ([`to_delta_form`], atomically), so that later remounts and
//! `log` cost O(records).
//!
//! Transcript format 3: signed set-id entries ([`crate::transcript::mac`]). A state dir
//! without `STATE/signing-id` predates them: its set-id entries carry no MAC. Policy: trust
//! on first use. The first daemon that mounts it (and so has just checked that nobody else
//! can write it, `crate::state::dir::secure`) replays it with every other check, signs its
//! set-id entries once ([`sign_once`]), rewrites the transcript atomically and only then
//! writes `signing-id`; from then on every set-id entry needs a valid MAC. A state dir with
//! no `signing-id` whose records carry MACs had its id removed, and is refused instead.
use std::collections::HashSet;

use super::State;
use super::model::apply_record;
use crate::transcript::mac::{Signer, needs_mac};
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

/// How many entries of `records` need a MAC ([`needs_mac`]).
pub fn set_id_entries(records: &[Record]) -> usize {
    records
        .iter()
        .flat_map(|r| r.snapshot.tracked_file_backups.values())
        .filter(|b| needs_mac(b.meta.as_ref()))
        .count()
}

/// The seq and path of the first entry of `records` that carries a MAC: in a state dir
/// without `signing-id`, proof that the id was removed (a daemon writes the id before any
/// MAC it makes can be replayed).
pub fn first_signed(records: &[Record]) -> Option<(u64, &str)> {
    records.iter().find_map(|r| {
        r.snapshot
            .tracked_file_backups
            .iter()
            .find(|(_, b)| b.mac.is_some())
            .map(|(path, _)| (r.seq, path.as_str()))
    })
}

/// Trust on first use (see the module docs): signs every set-id entry of `records`, the
/// whole replayed history of a state dir from before signing, with `signer`. Only for a
/// history replay accepted with every other check, from a state dir the mount checked
/// nobody else can write; never for one that has a `signing-id` (its MACs are checked).
pub fn sign_once(records: &mut [Record], signer: &Signer) {
    for r in records {
        signer.sign_record(r);
    }
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
