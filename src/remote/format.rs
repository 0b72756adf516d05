//! The objects of remote format 1 (docs/remote-format.md): trees, checkpoint manifests and
//! session records. All are JSON, sealed with the repository key before upload; none is a
//! copy of a local transcript record, so the remote format does not change when the local
//! one does (format 4 renames, hard links): it describes what a checkpoint's view shows.
use serde::{Deserialize, Serialize};

use crate::transcript::record::{EntryKind, EntryMeta};

/// The remote format this code writes and the newest it reads.
pub const FORMAT: u32 = 1;

/// Files are cut into chunks of this size (the last one shorter); each chunk is one
/// content object, so an upload or download holds at most one chunk in memory, and an
/// aligned chunk of zeros is stored as a hole (nothing uploaded, nothing written).
pub const CHUNK_SIZE: usize = 1 << 20;

/// Keyed-hash domains: a chunk and a tree with the same bytes get different names.
pub const DOMAIN_CHUNK: &str = "chunk";
pub const DOMAIN_TREE: &str = "tree";

/// `r/<key check>/config.json`, written in plain text (it holds nothing secret) and always
/// with the same bytes for one key, so concurrent first pushes write the same object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub format: u32,
    pub cipher: String,
    pub names: String,
    pub chunk_size: usize,
}

impl Config {
    pub fn current() -> Config {
        Config {
            format: FORMAT,
            cipher: "XChaCha20-Poly1305".into(),
            names: "HMAC-SHA256".into(),
            chunk_size: CHUNK_SIZE,
        }
    }
}

/// One piece of a file: a content object, or (`name: None`) `len` zero bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub len: u64,
}

/// What an entry holds besides its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum Content {
    /// Special files.
    None,
    File {
        chunks: Vec<Chunk>,
    },
    /// The target's bytes, hex.
    Symlink {
        target: String,
    },
    /// The directory's tree object.
    Dir {
        tree: String,
    },
}

/// An entry of a tree (and the root, in a manifest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The name's bytes, hex (names need not be UTF-8).
    pub name: String,
    pub kind: EntryKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<u64>,
    /// The extended-attribute set as the history records it (its canonical encoding, see
    /// `history::xattrs`), as one content object; absent: none recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xattrs: Option<String>,
    pub content: Content,
}

impl Entry {
    pub fn new(name: &[u8], meta: &EntryMeta, content: Content) -> Entry {
        Entry {
            name: base16ct::lower::encode_string(name),
            kind: meta.kind,
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            size: meta.size,
            mtime_sec: meta.mtime_sec,
            mtime_nsec: meta.mtime_nsec,
            rdev: meta.rdev,
            xattrs: None,
            content,
        }
    }

    pub fn name_bytes(&self) -> Result<Vec<u8>, String> {
        base16ct::mixed::decode_vec(&self.name).map_err(|_| format!("bad name {:?}", self.name))
    }
}

/// A directory's entries, sorted by name bytes; named by the keyed hash of its JSON, so an
/// unchanged subtree is the same object at every checkpoint and every mount sharing the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Tree {
    pub entries: Vec<Entry>,
}

/// `r/<key>/sessions/<mount id>/info`: what the session is, for `remote log`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub format: u32,
    pub mount_id: String,
    pub source: String,
    pub host: String,
}

/// `r/<key>/sessions/<mount id>/checkpoints/<index, 12 digits>`: one checkpoint, written after
/// every object it names (so a manifest that is listed is complete).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub mount_id: String,
    /// The checkpoint's index in the local history (never reused by one state dir).
    pub index: usize,
    pub id: String,
    /// RFC 3339.
    pub time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_session: Option<String>,
    /// The root directory (its name is empty).
    pub root: Entry,
    pub files: u64,
    pub bytes: u64,
}

pub fn session_dir(mount_id: &str) -> String {
    format!("sessions/{mount_id}")
}

pub fn manifest_name(mount_id: &str, index: usize) -> String {
    format!("sessions/{mount_id}/checkpoints/{index:012}")
}

pub fn data_name(name: &str) -> String {
    format!("data/{}/{name}", &name[..2.min(name.len())])
}
