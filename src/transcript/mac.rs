//! Authenticating the set-id modes a rewind restores.
//!
//! A record is plain JSON that anyone who can write the state dir can forge, and a forged
//! entry that gives a user's file mode 04755 and uid 0 turns the next rewind by root into a
//! setuid-root binary. The state dir itself is refused at mount when others can write it
//! (`crate::state::dir`); this module is the second line: every entry that could raise
//! privilege carries an HMAC-SHA256 made with a per-user key kept *outside* the state dir,
//! and replay refuses such an entry whose MAC is missing or wrong. Whoever can write STATE
//! but cannot read the key cannot make one.
//!
//! Invariants:
//! 1. An entry needs a MAC iff [`needs_mac`]: its `meta` is a regular file with S_ISUID, or
//!    with S_ISGID and group-execute (S_ISGID without group-execute is the mandatory-locking
//!    marker and runs nothing; set-id bits on directories and other kinds raise nothing), or
//!    it records extended attributes (`EntryMeta::xattrs` names an object): a set can hold
//!    `security.capability`, privilege-bearing like a set-id mode, and which sets do is not
//!    visible in the record, so every one is signed.
//! 2. The MAC covers [`canonical`]: the state dir's id, the path, the version number, the
//!    object name, the kind, mode, uid and gid, and the xattr set's object when there is one
//!    (its name is the hash of its content), each length-prefixed or fixed-width, so no two
//!    different entries encode alike and a MAC moved to another path, version, object, owner
//!    or state dir no longer matches.
//! 3. Every record the daemon writes goes through [`Signer::sign_record`] first (Layer 1,
//!    checkpoints, gc's compacted transcript, the migration of an older state dir), so a
//!    history this daemon wrote with its key always verifies.
//! 4. The key is 32 random bytes in `record.key`, 0600 in a 0700 directory, both owned by the
//!    daemon's euid and writable by no one else; anything else is refused, never repaired.
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base16ct::lower as hex;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::record::{EntryKind, EntryMeta, Record, TrackedFileBackup};

/// The key's file name in its directory.
pub const KEY_FILE: &str = "record.key";
/// The key's length in bytes.
pub const KEY_LEN: usize = 32;
/// The state dir's id file: its presence means the state dir's set-id entries are signed
/// (see docs/transcript-format.md, "Signed set-id entries").
pub use crate::state::dir::SIGNING_ID_FILE as STATE_ID_FILE;
/// Beside the key: the state dirs it began signing, one JSON object a line.
pub const SIGNED_LIST_FILE: &str = "signed-state-dirs";
/// Starts every MAC'd message, so that a MAC of this kind can never be taken for another.
const DOMAIN: &[u8] = b"checkpointfs record mac v1\0";

/// Whether an entry with `meta` needs a MAC (invariant 1).
pub fn needs_mac(meta: Option<&EntryMeta>) -> bool {
    meta.is_some_and(|m| has_set_id(m) || m.xattrs_object().is_some())
}

/// Whether `m` is a regular file with a set-id mode that can raise privilege.
fn has_set_id(m: &EntryMeta) -> bool {
    m.kind == EntryKind::File
        && (m.mode & 0o4000 != 0 || (m.mode & 0o2000 != 0 && m.mode & 0o010 != 0))
}

/// What makes an entry with `meta` privilege-bearing, for messages.
fn what_needs_it(meta: &EntryMeta) -> String {
    if has_set_id(meta) {
        format!("set-id mode {:o}", meta.mode)
    } else {
        "xattrs (which can hold a file capability or an ACL)".to_string()
    }
}

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`, to finalize or verify.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(msg);
    mac
}

/// The bytes a MAC covers (invariant 2): the domain, then the state id, the path, the
/// version (u32 big-endian), the object (a 0 byte for none, else 1 and the name), the kind's
/// name, mode, uid and gid (u32 big-endian each). Strings are prefixed by their length as a
/// u64 big-endian.
pub fn canonical(state_id: &str, path: &str, b: &TrackedFileBackup, meta: &EntryMeta) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, s: &[u8]) {
        out.extend_from_slice(&(s.len() as u64).to_be_bytes());
        out.extend_from_slice(s);
    }
    let kind = match meta.kind {
        EntryKind::File => "file",
        EntryKind::Dir => "dir",
        EntryKind::Symlink => "symlink",
        EntryKind::Fifo => "fifo",
        EntryKind::Socket => "socket",
        EntryKind::CharDevice => "chardevice",
        EntryKind::BlockDevice => "blockdevice",
    };
    let mut out = DOMAIN.to_vec();
    field(&mut out, state_id.as_bytes());
    field(&mut out, path.as_bytes());
    out.extend_from_slice(&b.version.to_be_bytes());
    match &b.backup_file_name {
        None => out.push(0),
        Some(name) => {
            out.push(1);
            field(&mut out, name.as_bytes());
        }
    }
    field(&mut out, kind.as_bytes());
    for n in [meta.mode, meta.uid, meta.gid] {
        out.extend_from_slice(&n.to_be_bytes());
    }
    // Only when there are some, so the MACs of entries from before xattrs were recorded
    // still verify.
    if let Some(xattrs) = meta.xattrs_object() {
        field(&mut out, b"xattrs");
        field(&mut out, xattrs.as_bytes());
    }
    out
}

/// A line of [`SIGNED_LIST_FILE`].
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedStateDir {
    id: String,
    state_dir: String,
}

/// A record key: 32 secret bytes, and where they were read from (for messages).
pub struct RecordKey {
    key: [u8; KEY_LEN],
    path: PathBuf,
}

impl RecordKey {
    /// A key from its bytes (tests, and the fuzz harness's fixed key).
    pub fn from_bytes(key: [u8; KEY_LEN], path: PathBuf) -> RecordKey {
        RecordKey { key, path }
    }

    /// Where the key was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file beside the key listing the state dirs this key began signing (see
    /// [`RecordKey::signed_before`]).
    pub fn signed_list(&self) -> PathBuf {
        self.path.with_file_name(SIGNED_LIST_FILE)
    }

    /// The id under which this key last began signing the state dir at `state_dir` (a
    /// canonical path), if it did: a state dir found there later without `signing-id` had
    /// it removed, unless it is a new one. Kept beside the key, outside every state dir, so
    /// that write access to a state dir cannot make it look as if it had never been signed.
    pub fn signed_before(&self, state_dir: &Path) -> io::Result<Option<String>> {
        let list = self.signed_list();
        let text = match fs::read_to_string(&list) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(crate::sys::context(format!("{}", list.display()), e)),
        };
        let want = state_dir.to_string_lossy();
        // The last line for the path: a new history begun there since is the current one.
        Ok(text
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<SignedStateDir>(l).ok())
            .find(|e| e.state_dir == want)
            .map(|e| e.id))
    }

    /// Notes that this key begins signing the state dir at `state_dir` (a canonical path)
    /// under `id`: one JSON line appended in one write to a 0600 file beside the key.
    pub fn remember_signed(&self, state_dir: &Path, id: &str) -> io::Result<()> {
        let list = self.signed_list();
        let entry = SignedStateDir {
            id: id.to_string(),
            state_dir: state_dir.to_string_lossy().into_owned(),
        };
        let mut line = serde_json::to_string(&entry).map_err(io::Error::other)?;
        line.push('\n');
        let appended = (|| {
            let mut f = fs::OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&list)?;
            if f.metadata()?.uid() != euid() {
                return Err(refused("it belongs to another user".to_string()));
            }
            f.write_all(line.as_bytes())?;
            f.sync_all()
        })();
        appended.map_err(|e| crate::sys::context(format!("{}", list.display()), e))
    }

    fn mac(&self, state_id: &str, path: &str, b: &TrackedFileBackup, meta: &EntryMeta) -> String {
        let mac = hmac_sha256(&self.key, &canonical(state_id, path, b, meta));
        hex::encode_string(&mac.finalize().into_bytes())
    }

    /// Whether `mac` (lowercase hex, as [`RecordKey::mac`] writes it) is this key's MAC of
    /// the entry.
    fn verifies(
        &self,
        mac: &str,
        state_id: &str,
        path: &str,
        b: &TrackedFileBackup,
        meta: &EntryMeta,
    ) -> bool {
        // `verify_slice` compares in constant time: how much of a guess matched must not show.
        hex::decode_vec(mac).is_ok_and(|tag| {
            hmac_sha256(&self.key, &canonical(state_id, path, b, meta))
                .verify_slice(&tag)
                .is_ok()
        })
    }

    /// The key of the user this process runs as (its euid), created if there is none yet.
    pub fn load_or_create() -> io::Result<RecordKey> {
        let dir = key_dir()?;
        private_dir(&dir, true)?;
        let path = dir.join(KEY_FILE);
        match read_key(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_key(&dir, &path)?;
                read_key(&path)
            }
            other => other,
        }
    }

    /// The key of the user this process runs as, if it has one; never creates it.
    pub fn load() -> io::Result<Option<RecordKey>> {
        let dir = key_dir()?;
        match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            _ => private_dir(&dir, false)?,
        }
        match read_key(&dir.join(KEY_FILE)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            other => other.map(Some),
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// The directory for the key: `$XDG_CONFIG_HOME/checkpointfs`, else
/// `$HOME/.config/checkpointfs`, else the same under the password database's home of the
/// euid. An environment directory is used only if it exists and belongs to the euid: a root
/// daemon started with a user's `HOME` (sudo without `-H`) must not keep root's key where
/// that user can read or replace it.
fn key_dir() -> io::Result<PathBuf> {
    let me = euid();
    let ours = |base: &Path| {
        base.is_absolute() && fs::metadata(base).is_ok_and(|m| m.is_dir() && m.uid() == me)
    };
    if let Some(base) = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from) {
        if ours(&base) {
            return Ok(base.join("checkpointfs"));
        }
        log::info!(
            "XDG_CONFIG_HOME={} is not a directory of uid {me}: not keeping the record key there",
            base.display()
        );
    }
    let env_home = std::env::var_os("HOME").map(PathBuf::from);
    let passwd_home = crate::sys::home_of(me).ok().flatten();
    for home in env_home.into_iter().chain(passwd_home) {
        if ours(&home) {
            let config = home.join(".config");
            private_dir(&config, true)?;
            return Ok(config.join("checkpointfs"));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no directory of uid {me} to keep the record key in (the key that signs set-id \
             modes in the history): set XDG_CONFIG_HOME or HOME to a directory uid {me} owns"
        ),
    ))
}

/// Checks that `dir` is a directory (not a symlink) of the euid that nobody else can write,
/// creating it 0700 first if `create` and it is missing.
fn private_dir(dir: &Path, create: bool) -> io::Result<()> {
    if create {
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(crate::sys::context(
                    format!("creating {}", dir.display()),
                    e,
                ));
            }
            _ => {}
        }
    }
    let m = fs::symlink_metadata(dir)
        .map_err(|e| crate::sys::context(format!("{}", dir.display()), e))?;
    let (me, shown) = (euid(), dir.display());
    if !m.is_dir() {
        return Err(refused(format!(
            "{shown} is not a directory (a symlink?); the record key must live in a real \
             directory of uid {me} (remove it and mount again)"
        )));
    }
    if m.uid() != me {
        return Err(refused(format!(
            "{shown} belongs to uid {}, not to uid {me}: that user could read or replace the \
             record key (chown {me} {shown}, or set XDG_CONFIG_HOME to a directory of yours)",
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "{shown} is writable by group or others (mode {:o}): they could replace the \
             record key (chmod go-w {shown})",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Reads the key at `path`: opened without following a symlink, then checked on the open
/// file (so a swap between check and read changes nothing): a regular file of the euid that
/// nobody else can read or write, of exactly [`KEY_LEN`] bytes.
fn read_key(path: &Path) -> io::Result<RecordKey> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| crate::sys::context(format!("record key {}", path.display()), e))?;
    let m = f.metadata()?;
    let (me, shown) = (euid(), path.display());
    if !m.is_file() {
        return Err(refused(format!("record key {shown} is not a regular file")));
    }
    if m.uid() != me {
        return Err(refused(format!(
            "record key {shown} belongs to uid {}, not to uid {me}: that user could sign \
             set-id modes into the history (remove it; a new key is made at the next mount, \
             and state dirs signed with the old one are then refused)",
            m.uid()
        )));
    }
    if m.mode() & 0o077 != 0 {
        return Err(refused(format!(
            "record key {shown} has mode {:o}: others could read it and sign set-id modes \
             into the history (chmod 600 {shown})",
            m.mode() & 0o7777
        )));
    }
    let mut bytes = Vec::with_capacity(KEY_LEN);
    f.read_to_end(&mut bytes)
        .map_err(|e| crate::sys::context(format!("record key {shown}"), e))?;
    let key: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "record key {shown} is {} bytes, not {KEY_LEN}: not a key checkpointfs made \
                 (restore it from a backup; removing it makes a new key, and the state dirs \
                 signed with the old one are then refused)",
                bytes.len()
            ),
        )
    })?;
    Ok(RecordKey {
        key,
        path: path.to_owned(),
    })
}

/// Creates the key at `path`: 32 bytes from getrandom(2), written by the one atomic write
/// (`crate::state::atomic::create`: a temp file, fsync, a rename that never replaces, fsync of
/// the directory), 0600. If the name exists by then (a concurrent mount made the key first),
/// theirs is kept and read.
fn create_key(dir: &Path, path: &Path) -> io::Result<()> {
    let mut key = [0u8; KEY_LEN];
    getrandom::fill(&mut key)?;
    // An error names the file (and keeps its errno).
    if crate::state::atomic::create(dir, KEY_FILE, &key, 0o600)? {
        log::info!(
            "created the record key {} (it signs set-id modes in this user's histories; keep \
             it with them when moving a state dir to another account)",
            path.display()
        );
    }
    Ok(())
}

/// Signs and checks the entries of one state dir's records: its key (or why there is none)
/// and its id.
#[derive(Clone)]
pub struct Signer {
    key: Result<Arc<RecordKey>, String>,
    state_id: String,
}

impl Signer {
    pub fn new(key: Result<Arc<RecordKey>, String>, state_id: String) -> Signer {
        Signer { key, state_id }
    }

    /// The key, if there is one.
    pub fn key(&self) -> Option<&RecordKey> {
        self.key.as_deref().ok()
    }

    /// The state dir's id the MACs bind.
    pub fn state_id(&self) -> &str {
        &self.state_id
    }

    /// Sets the MAC of every entry of `r` that needs one, and clears it on every other
    /// (invariant 3). Without a key a set-id entry stays unsigned, with an error in the log:
    /// the next mount will refuse the history until the key is back.
    pub fn sign_record(&self, r: &mut Record) {
        for (path, b) in r.snapshot.tracked_file_backups.iter_mut() {
            b.mac = match (b.meta.as_ref().filter(|m| needs_mac(Some(m))), &self.key) {
                (None, _) => None,
                (Some(meta), Ok(key)) => Some(key.mac(&self.state_id, path, b, meta)),
                (Some(meta), Err(why)) => {
                    log::error!(
                        "{path:?} version {} has {} but cannot be signed ({why}): the next \
                         mount will refuse this history until a record key is there",
                        b.version,
                        what_needs_it(meta)
                    );
                    None
                }
            };
        }
    }

    /// Why the entry for `path` must not be replayed: it needs a MAC and has none, or one
    /// this key and state dir did not make. `None`: it is fine.
    pub fn check(&self, path: &str, b: &TrackedFileBackup) -> Option<String> {
        let meta = b.meta.as_ref().filter(|m| needs_mac(Some(m)))?;
        let what = format!(
            "{path:?} version {} has {} (uid {}, gid {})",
            b.version,
            what_needs_it(meta),
            meta.uid,
            meta.gid
        );
        let key = match &self.key {
            Ok(key) => key,
            Err(why) => {
                return Some(format!(
                    "{what}, and there is no record key to check its signature ({why}). If \
                     the state dir comes from another account, copy that account's {KEY_FILE} \
                     into place"
                ));
            }
        };
        let fine = b
            .mac
            .as_ref()
            .is_some_and(|mac| key.verifies(mac, &self.state_id, path, b, meta));
        (!fine).then(|| {
            format!(
                "{what} {} the record key {} (set-id modes and xattrs are restored only as this daemon \
                 recorded them; a forged or altered record cannot be). If the state dir was \
                 moved from another account, copy that account's {KEY_FILE} there too",
                if b.mac.is_none() {
                    "but no signature from"
                } else {
                    "and a signature not made by"
                },
                key.path().display()
            )
        })
    }
}

/// What `STATE/signing-id` says (see [`STATE_ID_FILE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateId {
    /// 32 hex digits, bound into every MAC of the state dir.
    pub id: String,
    /// `false` while the first signing of an older state dir is under way (the file reads
    /// `ID pending`): a mount that finds it so signs again, with the same id.
    pub complete: bool,
}

/// Reads the state dir's id; `None` if the state dir predates signing.
pub fn read_state_id(state_dir: &Path) -> io::Result<Option<StateId>> {
    let path = state_dir.join(STATE_ID_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(crate::sys::context(format!("{}", path.display()), e)),
    };
    let mut words = text.split_whitespace();
    let (id, complete) = match (words.next(), words.next(), words.next()) {
        (Some(id), None, None) => (id, true),
        (Some(id), Some("pending"), None) => (id, false),
        _ => ("", false),
    };
    if id.len() != 32 || !id.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is not a state id checkpointfs wrote (32 hex digits); the state dir was \
                 damaged or edited: restore it from a backup",
                path.display()
            ),
        ));
    }
    Ok(Some(StateId {
        id: id.to_string(),
        complete,
    }))
}

/// Writes the state dir's id, atomically and durably (`crate::state::atomic`).
pub fn write_state_id(state_dir: &Path, id: &StateId) -> io::Result<()> {
    let text = if id.complete {
        format!("{}\n", id.id)
    } else {
        format!("{} pending\n", id.id)
    };
    crate::state::dir::write_file(state_dir, STATE_ID_FILE, text.as_bytes())
}

/// A fresh random state id (16 bytes from getrandom(2), in hex).
pub fn new_state_id() -> io::Result<String> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id)?;
    Ok(hex::encode_string(&id))
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests make key files and directories others could read or replace, as an attacker would"
)]
mod tests {
    use super::*;
    use crate::transcript::testutil::file_entry;

    const T: &str = "2026-01-02T03:04:05Z";

    /// RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
    #[test]
    fn hmac_matches_rfc_4231() {
        let cases: [(Vec<u8>, &[u8], &str); 3] = [
            (
                vec![0x0b; 20],
                b"Hi There",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
        ];
        for (key, msg, want) in cases {
            let want = hex::decode_vec(want).unwrap();
            assert_eq!(hmac_sha256(&key, msg).finalize().into_bytes()[..], want);
            assert!(hmac_sha256(&key, msg).verify_slice(&want).is_ok());
        }
    }

    fn setuid(version: u32, uid: u32) -> TrackedFileBackup {
        let mut b = file_entry(version, &"ab".repeat(32), T);
        if let Some(m) = b.meta.as_mut() {
            m.mode = 0o4755;
            m.uid = uid;
        }
        b
    }

    fn signer(byte: u8, state_id: &str) -> Signer {
        let key = RecordKey::from_bytes([byte; KEY_LEN], PathBuf::from("/k/record.key"));
        Signer::new(Ok(Arc::new(key)), state_id.to_string())
    }

    fn signed(s: &Signer, path: &str, b: TrackedFileBackup) -> TrackedFileBackup {
        let mut r = Record::snapshot_update(
            None,
            1,
            T.into(),
            [(path.to_string(), b)].into_iter().collect(),
        );
        s.sign_record(&mut r);
        r.snapshot.tracked_file_backups.remove(path).unwrap()
    }

    #[test]
    fn which_modes_need_a_mac() {
        let mut b = file_entry(1, &"ab".repeat(32), T);
        let mut with = |kind, mode| {
            let m = b.meta.as_mut().unwrap();
            (m.kind, m.mode) = (kind, mode);
            needs_mac(b.meta.as_ref())
        };
        assert!(with(EntryKind::File, 0o4755));
        assert!(
            with(EntryKind::File, 0o4600),
            "setuid without exec still signed"
        );
        assert!(with(EntryKind::File, 0o2750), "setgid with group exec");
        assert!(
            !with(EntryKind::File, 0o2644),
            "setgid without group exec: locking"
        );
        assert!(!with(EntryKind::File, 0o1755));
        assert!(!with(EntryKind::File, 0o755));
        assert!(
            !with(EntryKind::Dir, 0o2775),
            "a directory's setgid raises nothing"
        );
        assert!(!with(EntryKind::Dir, 0o4755));
        assert!(!needs_mac(None), "absent");
    }

    #[test]
    fn an_entry_with_xattrs_is_signed_and_its_set_bound() {
        let s = signer(7, "00112233445566778899aabbccddeeff");
        let with_xattrs = |object: &str| {
            let mut b = file_entry(2, &"ab".repeat(32), T);
            b.meta.as_mut().unwrap().xattrs = Some(object.to_string());
            b
        };
        // None recorded ("") needs no MAC, as an entry from before the field.
        let none = signed(&s, "bin/tool", with_xattrs(""));
        assert!(!needs_mac(none.meta.as_ref()) && none.mac.is_none());
        assert_eq!(s.check("bin/tool", &none), None);
        // A set (which may hold security.capability) is signed like a set-id mode.
        let good = signed(&s, "bin/tool", with_xattrs(&"cd".repeat(32)));
        assert!(good.mac.is_some());
        assert_eq!(s.check("bin/tool", &good), None);
        // Another set under the same MAC, or no MAC at all: refused, saying why.
        let mut swapped = good.clone();
        swapped.meta.as_mut().unwrap().xattrs = Some("ef".repeat(32));
        let why = s.check("bin/tool", &swapped).unwrap();
        assert!(
            why.contains("xattrs") && why.contains("not made by"),
            "{why}"
        );
        let mut unsigned = good.clone();
        unsigned.mac = None;
        let why = s.check("bin/tool", &unsigned).unwrap();
        assert!(why.contains("no signature"), "{why}");
        // The MAC of an entry without xattrs is what it was before the field existed.
        let plain = setuid(2, 0);
        let mut recorded = plain.clone();
        recorded.meta.as_mut().unwrap().xattrs = Some(String::new());
        let meta = plain.meta.as_ref().unwrap();
        assert_eq!(
            canonical("id", "p", &plain, meta),
            canonical("id", "p", &recorded, recorded.meta.as_ref().unwrap())
        );
    }

    #[test]
    fn a_signed_set_id_entry_verifies_and_a_forged_one_does_not() {
        let s = signer(7, "00112233445566778899aabbccddeeff");
        let good = signed(&s, "bin/tool", setuid(2, 1000));
        assert!(good.mac.as_ref().is_some_and(|m| m.len() == 64));
        assert_eq!(s.check("bin/tool", &good), None);

        // No MAC at all: what the attacker appended.
        let forged = setuid(2, 0);
        let why = s.check("bin/tool", &forged).unwrap();
        assert!(
            why.contains("\"bin/tool\" version 2 has set-id mode 4755 (uid 0"),
            "{why}"
        );
        assert!(
            why.contains("no signature from the record key /k/record.key"),
            "{why}"
        );
        assert!(why.contains("copy that account's record.key"), "{why}");

        // A wrong MAC: garbage, or another key's.
        let mut wrong = good.clone();
        wrong.mac = Some("00".repeat(32));
        let why = s.check("bin/tool", &wrong).unwrap();
        assert!(why.contains("a signature not made by"), "{why}");
        // The right MAC spelled otherwise than the signer writes it: only its lowercase hex
        // is taken.
        let mac = good.mac.clone().unwrap();
        for spelled in [
            mac.to_uppercase(),
            mac[..62].to_string(),
            format!("{mac}00"),
            format!(" {mac}"),
        ] {
            wrong.mac = Some(spelled);
            assert!(s.check("bin/tool", &wrong).is_some(), "{:?}", wrong.mac);
        }
        let other = signed(&signer(8, s.state_id()), "bin/tool", setuid(2, 1000));
        assert!(s.check("bin/tool", &other).is_some(), "another key's MAC");
        let other = signed(
            &signer(7, "ffeeddccbbaa99887766554433221100"),
            "bin/tool",
            setuid(2, 1000),
        );
        assert!(
            s.check("bin/tool", &other).is_some(),
            "another state dir's MAC"
        );
    }

    /// A valid MAC copied onto another path, version, owner, mode or object is refused.
    #[test]
    fn a_valid_mac_moved_to_another_entry_is_refused() {
        let s = signer(7, "00112233445566778899aabbccddeeff");
        let good = signed(&s, "bin/tool", setuid(2, 1000));
        assert_eq!(s.check("bin/tool", &good), None);
        assert!(s.check("bin/other", &good).is_some(), "another path");
        let mut moved = good.clone();
        moved.version = 3;
        assert!(s.check("bin/tool", &moved).is_some(), "another version");
        let mut root = good.clone();
        root.meta.as_mut().unwrap().uid = 0;
        assert!(s.check("bin/tool", &root).is_some(), "a root-owned copy");
        let mut gid = good.clone();
        gid.meta.as_mut().unwrap().gid = 5;
        assert!(s.check("bin/tool", &gid).is_some(), "another group");
        let mut mode = good.clone();
        mode.meta.as_mut().unwrap().mode = 0o6755;
        assert!(s.check("bin/tool", &mode).is_some(), "another mode");
        let mut object = good;
        object.backup_file_name = Some("cd".repeat(32));
        assert!(s.check("bin/tool", &object).is_some(), "other content");
    }

    #[test]
    fn entries_without_set_id_bits_need_no_mac_and_get_none() {
        let s = signer(7, "00112233445566778899aabbccddeeff");
        let plain = file_entry(1, &"ab".repeat(32), T);
        assert_eq!(s.check("a", &plain), None);
        let mut stale = plain.clone();
        stale.mac = Some("00".repeat(32));
        assert_eq!(signed(&s, "a", stale).mac, None, "a stale MAC is cleared");
        let no_key = Signer::new(Err("no home".into()), "00".repeat(16));
        assert_eq!(no_key.check("a", &plain), None);
        let why = no_key.check("a", &setuid(1, 0)).unwrap();
        assert!(
            why.contains("no record key to check its signature (no home)"),
            "{why}"
        );
    }

    /// No two different entries encode alike: a path that ends where the object would
    /// begin cannot shift bytes between fields.
    #[test]
    fn the_encoding_is_unambiguous() {
        let b = setuid(1, 1000);
        let meta = b.meta.clone().unwrap();
        let a = canonical("id", "ab", &b, &meta);
        let c = canonical("ida", "b", &b, &meta);
        assert_ne!(a, c);
        let mut none = b.clone();
        none.backup_file_name = None;
        assert_ne!(canonical("id", "ab", &none, &meta), a);
    }

    #[test]
    fn key_files_others_could_read_or_replace_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        create_key(dir.path(), &path).unwrap();
        let key = read_key(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        // Not a key checkpointfs made: refused, not used.
        let short = dir.path().join("short.key");
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&short)
            .and_then(|mut f| f.write_all(b"0123"))
            .unwrap();
        let e = read_key(&short).err().unwrap();
        assert!(e.to_string().contains("is 4 bytes, not 32"), "{e}");
        // Created once: a second creation keeps the first key.
        create_key(dir.path(), &path).unwrap();
        assert_eq!(read_key(&path).unwrap().key, key.key);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_key(&path).err().unwrap();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_key(&link).is_err(), "a symlinked key is not followed");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(dir.path(), false).unwrap_err();
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        private_dir(dir.path(), false).unwrap();
    }
}
