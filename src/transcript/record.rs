//! The transcript's record types: one JSON object per line, shaped as in Claude Code's
//! `file-history-snapshot` records, plus a few extra fields (documented in
//! docs/transcript-format.md) that a rewind needs and the seed format lacks.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const FILE_HISTORY_SNAPSHOT: &str = "file-history-snapshot";

/// One transcript line.
///
/// `is_snapshot_update == true`: a Layer 1 record (a path's pre-image was backed up, or a
/// pending Layer 2 version was filled). `false`: a checkpoint (Layer 2), mapping every tracked
/// path to its version at that moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(rename = "type")]
    pub record_type: String,
    /// The checkpoint this record belongs to: for a checkpoint its own id, for a Layer 1
    /// record the latest checkpoint before it (`null` before the first checkpoint).
    pub message_id: Option<String>,
    pub snapshot: Snapshot,
    pub is_snapshot_update: bool,
    /// Extra: strictly increasing per state dir; replay uses it to merge the store journal.
    pub seq: u64,
    /// Extra: written by `checkpointfs gc`. This Layer 1 record, the first of a compacted
    /// transcript, gives every path tracked by the oldest kept checkpoint its state there,
    /// as version 1; the checkpoints before it were dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gc_base: bool,
    /// Extra: only in checkpoints, only when `true`: `trackedFileBackups` lists just the
    /// paths that got a new version at this checkpoint; every other tracked path keeps its
    /// version at the previous one. Written by every checkpoint since transcript format 2, so
    /// a checkpoint costs what changed, not the size of the tree. Replay composes both forms
    /// the same way (a full map repeats versions already known, which replay skips).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delta: bool,
    /// Extra: only in checkpoints, only when known: the agent session whose process tree
    /// took this checkpoint (the process that wrote the id to ctl, or that asked over the
    /// control socket, is the registered session root or one of its descendants). Absent in
    /// records from before the field, and for checkpoints taken outside any session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Extra (format 4): a rename through the mount, written ahead of the syscall (journal
    /// first, like every backup). Replay applies it only together with its outcome, a later
    /// record with `renamed` (it happened) or `renameFailed` (it did not) naming this seq.
    /// Boxed: most records have none, and every record goes through the writer's channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<Box<RenameIntent>>,
    /// Extra (format 4): the rename whose intent has this seq happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed: Option<u64>,
    /// Extra (format 4): the rename whose intent has this seq failed; nothing moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename_failed: Option<u64>,
}

/// What a rename is about to do (the `rename` field of a format-4 record). Nothing below
/// the two names is listed: what is below `from` moves with it, and lookups resolve through
/// the rename (docs/design.md, "Renames in O(1)").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenameIntent {
    pub from: String,
    pub to: String,
    /// `renameat2(RENAME_EXCHANGE)`: each name gets what the other held.
    pub exchange: bool,
    /// `(st_dev, st_ino)` of what is at `from` just before the rename (`null`: nothing).
    /// Replay decides a rename whose outcome is missing (a crash between the two records)
    /// by looking for this object at `to`.
    pub from_object: Option<(u64, u64)>,
    /// `(st_dev, st_ino)` of what is at `to` just before the rename (`null`: nothing).
    pub to_object: Option<(u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub message_id: Option<String>,
    /// Keyed by the path relative to the mount root, `/`-separated, no leading slash.
    pub tracked_file_backups: BTreeMap<String, TrackedFileBackup>,
    /// RFC 3339, UTC.
    pub timestamp: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackedFileBackup {
    /// The store object holding the content (regular files) or the target (symlinks).
    /// `null` with no `meta`: the path was absent. `null` with `meta`: a directory or a
    /// special file, which have no content. `null` with `pending`: see `pending`.
    pub backup_file_name: Option<String>,
    /// Per-path version, counting from 1.
    pub version: u32,
    /// RFC 3339, UTC.
    pub backup_time: String,
    /// Extra: type, mode, size, mtime of the path in this version; absent when the path was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<EntryMeta>,
    /// Extra: in a checkpoint record, this version's content is still being copied in the
    /// background; a later Layer 1 record with the same version fills it in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// Extra: the process whose request caused a Layer 1 backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<Actor>,
    /// Extra: in a Layer 1 record, the background copier filled in a pending version; the
    /// path did not change (replay must not mark it changed since the checkpoint).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fill: bool,
    /// Extra: only on entries whose `meta` has set-id bits that can raise privilege (see
    /// [`super::mac::needs_mac`]): the HMAC-SHA256, in hex, of the entry under the mounting
    /// user's record key ([`super::mac`]). Replay refuses such an entry without a valid one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Extra (format 4), only in Layer 1 records of a tracked path: this entry is the path's
    /// state just before a change, captured because an ancestor of the path was renamed
    /// since its latest version (so that version is not what was there). It makes no
    /// version: `version` is the path's latest, which it leaves as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preimage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryMeta {
    pub kind: EntryKind,
    /// Permission bits (incl. setuid/setgid/sticky), without the file-type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    /// Device number, for character and block devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<u64>,
    /// Extra: the extended attributes this version had (regular files and directories;
    /// `crate::history::xattrs` says which names): the store object holding their canonical
    /// encoding, one object per distinct set; `""` when it had none of them. Absent: not
    /// recorded (a record from before the field, a symlink or special file, or a set that
    /// could not be read), so nothing about them is known and a rewind leaves them alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<String>,
    /// Extra (format 4): the object this version was, when it was a regular file with more
    /// than one hard link. Versions of several paths naming the same object and the same
    /// content were one file linked under those names, and a rewind that restores several
    /// of them links them again. Absent: one link, or not recorded (records from before
    /// the field or without format 4), so a rewind restores the path as a file of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkMeta>,
}

/// A hard-linked file's identity in one version ([`EntryMeta::link`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LinkMeta {
    /// `st_dev` and `st_ino` in SRC when the version was captured.
    pub dev: u64,
    pub ino: u64,
    /// `st_nlink` then (more than 1).
    pub nlink: u64,
}

impl EntryMeta {
    /// The store object holding this version's extended attributes, when it had any
    /// recorded ones.
    pub fn xattrs_object(&self) -> Option<&str> {
        self.xattrs.as_deref().filter(|name| !name.is_empty())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Actor {
    pub pid: u32,
    pub uid: u32,
    /// `/proc/<pid>/comm` at the time of the request (empty when the process was gone).
    pub comm: String,
    /// `/proc/<pid>/exe` at the time of the request, when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
    /// The agent session whose process tree made the request, if one was registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// RFC 3339 (UTC, milliseconds) for a point in time.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl Record {
    /// A checkpoint (Layer 2) record in full form: `messageId` and `snapshot.messageId` are
    /// both the checkpoint's own id, and `tracked_file_backups` maps every tracked path to its
    /// version at that moment. (The daemon writes [`Record::checkpoint_delta`].)
    pub fn checkpoint(
        id: &str,
        seq: u64,
        timestamp: String,
        tracked_file_backups: BTreeMap<String, TrackedFileBackup>,
    ) -> Record {
        Record::new(
            Some(id.to_owned()),
            seq,
            timestamp,
            tracked_file_backups,
            false,
        )
    }

    /// A checkpoint record in delta form: `changed` holds only the paths that got a new
    /// version at this checkpoint (see [`Record::delta`]).
    pub fn checkpoint_delta(
        id: &str,
        seq: u64,
        timestamp: String,
        changed: BTreeMap<String, TrackedFileBackup>,
    ) -> Record {
        let mut r = Record::checkpoint(id, seq, timestamp, changed);
        r.delta = true;
        r
    }

    /// A Layer 1 record (`isSnapshotUpdate: true`): a backup or the fill of a pending version.
    /// `latest_checkpoint` is the newest checkpoint id before this record, `None` before the
    /// first checkpoint; both `messageId` fields carry it, as in the seed format.
    pub fn snapshot_update(
        latest_checkpoint: Option<&str>,
        seq: u64,
        timestamp: String,
        tracked_file_backups: BTreeMap<String, TrackedFileBackup>,
    ) -> Record {
        Record::new(
            latest_checkpoint.map(str::to_owned),
            seq,
            timestamp,
            tracked_file_backups,
            true,
        )
    }

    fn new(
        message_id: Option<String>,
        seq: u64,
        timestamp: String,
        tracked_file_backups: BTreeMap<String, TrackedFileBackup>,
        is_snapshot_update: bool,
    ) -> Record {
        Record {
            record_type: FILE_HISTORY_SNAPSHOT.to_owned(),
            message_id: message_id.clone(),
            snapshot: Snapshot {
                message_id,
                tracked_file_backups,
                timestamp,
            },
            is_snapshot_update,
            seq,
            gc_base: false,
            delta: false,
            session: None,
            rename: None,
            renamed: None,
            rename_failed: None,
        }
    }

    /// A rename's intent (format 4): a Layer 1 record with no entries and a `rename` field.
    pub fn rename_intent(
        latest_checkpoint: Option<&str>,
        seq: u64,
        timestamp: String,
        intent: RenameIntent,
    ) -> Record {
        let mut r = Record::snapshot_update(latest_checkpoint, seq, timestamp, BTreeMap::new());
        r.rename = Some(Box::new(intent));
        r
    }

    /// A rename's outcome (format 4): the rename of intent `intent_seq` happened (`done`) or
    /// failed.
    pub fn rename_outcome(
        latest_checkpoint: Option<&str>,
        seq: u64,
        timestamp: String,
        intent_seq: u64,
        done: bool,
    ) -> Record {
        let mut r = Record::snapshot_update(latest_checkpoint, seq, timestamp, BTreeMap::new());
        if done {
            r.renamed = Some(intent_seq);
        } else {
            r.rename_failed = Some(intent_seq);
        }
        r
    }

    /// True for a checkpoint (Layer 2) record, false for a Layer 1 record.
    pub fn is_checkpoint(&self) -> bool {
        !self.is_snapshot_update
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_s_session_is_optional_and_round_trips() {
        // As written before the field existed: reads as no session.
        let old = r#"{"type":"file-history-snapshot","messageId":"m1","snapshot":{"messageId":"m1","trackedFileBackups":{},"timestamp":"2026-03-02T10:15:07.000Z"},"isSnapshotUpdate":false,"seq":3,"delta":true}"#;
        let r: Record = serde_json::from_str(old).unwrap();
        assert_eq!(r.session, None);
        assert_eq!(serde_json::to_string(&r).unwrap(), old, "written as before");
        let mut r = r;
        r.session = Some("0b5c9e1e-4f4a".to_string());
        let line = serde_json::to_string(&r).unwrap();
        assert!(
            line.ends_with(r#""delta":true,"session":"0b5c9e1e-4f4a"}"#),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    }

    /// Format 4's two rename records, as docs/transcript-format.md shows them.
    #[test]
    fn a_link_is_optional_in_meta_and_round_trips_in_the_documented_shape() {
        // As written before the field existed (and by daemons without format 4).
        let old =
            r#"{"kind":"file","mode":420,"uid":0,"gid":0,"size":3,"mtimeSec":1,"mtimeNsec":2}"#;
        let meta: EntryMeta = serde_json::from_str(old).unwrap();
        assert_eq!(meta.link, None);
        assert_eq!(serde_json::to_string(&meta).unwrap(), old);
        let linked = EntryMeta {
            link: Some(LinkMeta {
                dev: 2049,
                ino: 1312,
                nlink: 2,
            }),
            ..meta
        };
        let json = serde_json::to_string(&linked).unwrap();
        assert!(
            json.ends_with(r#","link":{"dev":2049,"ino":1312,"nlink":2}}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<EntryMeta>(&json).unwrap(), linked);
    }

    #[test]
    fn rename_records_round_trip_in_the_documented_shape() {
        let intent = Record::rename_intent(
            Some("c4"),
            57,
            "2026-03-02T10:15:07.000Z".into(),
            RenameIntent {
                from: "a".into(),
                to: "b".into(),
                exchange: false,
                from_object: Some((2049, 1312)),
                to_object: None,
            },
        );
        let line = serde_json::to_string(&intent).unwrap();
        assert_eq!(
            line,
            r#"{"type":"file-history-snapshot","messageId":"c4","snapshot":{"messageId":"c4","trackedFileBackups":{},"timestamp":"2026-03-02T10:15:07.000Z"},"isSnapshotUpdate":true,"seq":57,"rename":{"from":"a","to":"b","exchange":false,"fromObject":[2049,1312],"toObject":null}}"#
        );
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), intent);
        let done =
            Record::rename_outcome(Some("c4"), 58, "2026-03-02T10:15:07.000Z".into(), 57, true);
        let line = serde_json::to_string(&done).unwrap();
        assert!(line.ends_with(r#""seq":58,"renamed":57}"#), "{line}");
        let failed = Record::rename_outcome(None, 59, "2026-03-02T10:15:07.000Z".into(), 57, false);
        let line = serde_json::to_string(&failed).unwrap();
        assert!(line.ends_with(r#""seq":59,"renameFailed":57}"#), "{line}");
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), failed);
    }
}
