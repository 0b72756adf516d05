//! Record fixtures for the transcript tests.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use super::record::{EntryKind, EntryMeta, Record, TrackedFileBackup};

const T: &str = "2026-01-02T03:04:05.678Z";

fn file_backup(version: u32) -> TrackedFileBackup {
    TrackedFileBackup {
        backup_file_name: Some(format!("{:064x}", version)),
        version,
        backup_time: T.to_owned(),
        meta: Some(EntryMeta {
            kind: EntryKind::File,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            size: 12,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 5,
            rdev: None,
            xattrs: None,
            link: None,
        }),
        pending: false,
        actor: None,
        fill: false,
        mac: None,
        preimage: false,
    }
}

/// A 1-byte regular file's entry, content in `object`, captured at `time`.
pub(crate) fn file_entry(version: u32, object: &str, time: &str) -> TrackedFileBackup {
    TrackedFileBackup {
        backup_file_name: Some(object.to_string()),
        version,
        backup_time: time.to_string(),
        meta: Some(EntryMeta {
            kind: EntryKind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            size: 1,
            mtime_sec: 0,
            mtime_nsec: 0,
            rdev: None,
            xattrs: None,
            link: None,
        }),
        pending: false,
        actor: None,
        fill: false,
        mac: None,
        preimage: false,
    }
}

/// A directory's meta (mode 0755, root's).
pub(crate) fn dir_meta() -> EntryMeta {
    EntryMeta {
        kind: EntryKind::Dir,
        mode: 0o755,
        uid: 0,
        gid: 0,
        size: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
        rdev: None,
        xattrs: None,
        link: None,
    }
}

/// A Layer 1 record backing up `src/lib.rs` at version `seq`.
pub(crate) fn backup(seq: u64, latest_checkpoint: Option<&str>) -> Record {
    let files = BTreeMap::from([("src/lib.rs".to_owned(), file_backup(seq as u32))]);
    Record::snapshot_update(latest_checkpoint, seq, T.to_owned(), files)
}

/// A checkpoint record `id` tracking `src/lib.rs`.
pub(crate) fn checkpoint(id: &str, seq: u64) -> Record {
    let files = BTreeMap::from([("src/lib.rs".to_owned(), file_backup(1))]);
    Record::checkpoint(id, seq, T.to_owned(), files)
}

/// Writes `records` one per line, the last one with a `\n` only if `terminate_last`.
pub(crate) fn write_lines(path: &Path, records: &[Record], terminate_last: bool) {
    let mut f = std::fs::File::create(path).unwrap();
    for (i, r) in records.iter().enumerate() {
        serde_json::to_writer(&mut f, r).unwrap();
        if terminate_last || i + 1 < records.len() {
            f.write_all(b"\n").unwrap();
        }
    }
}
