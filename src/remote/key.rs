//! The repository key: 32 random bytes in a file of its own (mode 0600, never inside the state
//! dir, so copying a state dir or a bucket never copies it). Everything put in a remote is
//! sealed with keys derived from it, and every object name is a keyed hash under it: a bucket
//! reader without the key learns neither content, names nor which known file a project holds.
//! Mounts deduplicate among themselves exactly when they share this key.
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::Mac;
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 24;
/// Prefix of every sealed object: a reader of a newer envelope refuses it by name.
const ENVELOPE_MAGIC: &[u8; 8] = b"cpfsrv1\0";

/// The repository key and the subkeys derived from it (HMAC-SHA256 of a fixed label).
#[derive(Clone)]
pub struct RepoKey {
    /// Names content: `name = HMAC(name_key, domain || plaintext)`.
    name_key: [u8; KEY_LEN],
    cipher: XChaCha20Poly1305,
    /// Public: names the key's `keys/<check>.json` in a remote without revealing the key.
    check: String,
}

impl std::fmt::Debug for RepoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RepoKey({})", self.check)
    }
}

fn derive(master: &[u8], label: &str) -> [u8; KEY_LEN] {
    let mut mac = <HmacSha256 as hmac::KeyInit>::new_from_slice(master).expect("any key length");
    mac.update(b"checkpointfs-remote/v1/");
    mac.update(label.as_bytes());
    mac.finalize().into_bytes().into()
}

/// Where the key lives when `--key` is not given: `$XDG_CONFIG_HOME/checkpointfs/remote.key`,
/// else `$HOME/.config/checkpointfs/remote.key`.
pub fn default_key_path() -> io::Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
            Some(h) => PathBuf::from(h).join(".config"),
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "neither XDG_CONFIG_HOME nor HOME is set: give the repository key file \
                     with --key FILE",
                ));
            }
        },
    };
    Ok(base.join("checkpointfs").join("remote.key"))
}

impl RepoKey {
    pub fn from_bytes(master: &[u8; KEY_LEN]) -> RepoKey {
        let aead = derive(master, "aead");
        let check = derive(master, "check");
        RepoKey {
            name_key: derive(master, "names"),
            cipher: XChaCha20Poly1305::new(&aead.into()),
            check: base16ct::lower::encode_string(&check[..16]),
        }
    }

    /// Reads the key file (64 hex digits). `create`: make one (0600, O_EXCL) when it is
    /// missing; a restore never creates one, since a new key could read nothing.
    pub fn load(path: &Path, create: bool) -> io::Result<RepoKey> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                return Self::create(path);
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot read the repository key {}: {e}", path.display()),
                ));
            }
        };
        let meta = std::fs::metadata(path)?;
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the repository key {} is readable by others (mode {:o}); chmod 600 it",
                    path.display(),
                    meta.permissions().mode() & 0o777
                ),
            ));
        }
        let mut master = [0u8; KEY_LEN];
        base16ct::mixed::decode(text.trim().as_bytes(), &mut master)
            .ok()
            .filter(|d| d.len() == KEY_LEN)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a repository key (64 hex digits expected)",
                        path.display()
                    ),
                )
            })?;
        Ok(RepoKey::from_bytes(&master))
    }

    fn create(path: &Path) -> io::Result<RepoKey> {
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let mut master = [0u8; KEY_LEN];
        getrandom::fill(&mut master).map_err(io::Error::other)?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot create the repository key {}: {e}", path.display()),
                )
            })?;
        f.write_all(format!("{}\n", base16ct::lower::encode_string(&master)).as_bytes())?;
        f.sync_all()?;
        log::info!("created a new repository key in {}", path.display());
        Ok(RepoKey::from_bytes(&master))
    }

    /// The public name of this key (the first 128 bits of an HMAC of a fixed label).
    pub fn check(&self) -> &str {
        &self.check
    }

    /// The keyed hash naming `plaintext` of kind `domain` (content chunk, tree, ...).
    pub fn name(&self, domain: &str, plaintext: &[u8]) -> String {
        let mut mac =
            <HmacSha256 as hmac::KeyInit>::new_from_slice(&self.name_key).expect("any key length");
        mac.update(domain.as_bytes());
        mac.update(b"\0");
        mac.update(plaintext);
        base16ct::lower::encode_string(&mac.finalize().into_bytes())
    }

    /// `magic || nonce || XChaCha20-Poly1305(plaintext, aad = object path)`: binding the
    /// path means an object moved to another name fails to open, like a changed byte.
    pub fn seal(&self, object_path: &str, plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS random source");
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext,
                    aad: object_path.as_bytes(),
                },
            )
            .expect("encryption of an in-memory buffer cannot fail");
        let mut out = Vec::with_capacity(ENVELOPE_MAGIC.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(ENVELOPE_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// Opens what [`RepoKey::seal`] made for `object_path`; an error names the object.
    pub fn open(&self, object_path: &str, sealed: &[u8]) -> io::Result<Vec<u8>> {
        let damaged = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("remote object {object_path} is damaged or was tampered with: {why}"),
            )
        };
        let head = ENVELOPE_MAGIC.len() + NONCE_LEN;
        if sealed.len() < head + 16 {
            return Err(damaged("truncated"));
        }
        if &sealed[..ENVELOPE_MAGIC.len()] != ENVELOPE_MAGIC {
            return Err(damaged("not a checkpointfs v1 envelope"));
        }
        let nonce: [u8; NONCE_LEN] = sealed[ENVELOPE_MAGIC.len()..head]
            .try_into()
            .expect("length checked above");
        self.cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: &sealed[head..],
                    aad: object_path.as_bytes(),
                },
            )
            .map_err(|_| {
                damaged("authentication failed (a changed byte, or sealed with another key)")
            })
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "a test loosens its own key file's mode, as a user could"
)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_any_flipped_byte_or_moved_name_is_refused_by_name() {
        let k = RepoKey::from_bytes(&[7; 32]);
        let sealed = k.seal("data/ab/abc", b"secret text");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(k.open("data/ab/abc", &sealed).unwrap(), b"secret text");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            let e = k.open("data/ab/abc", &bad).unwrap_err().to_string();
            assert!(e.contains("data/ab/abc"), "{e}");
        }
        assert!(k.open("data/ab/abd", &sealed).is_err());
        assert!(k.open("data/ab/abc", &sealed[..20]).is_err());
        let other = RepoKey::from_bytes(&[8; 32]);
        assert!(other.open("data/ab/abc", &sealed).is_err());
    }

    #[test]
    fn names_are_keyed_and_domain_separated() {
        let a = RepoKey::from_bytes(&[1; 32]);
        let b = RepoKey::from_bytes(&[2; 32]);
        assert_eq!(a.name("chunk", b"x"), a.name("chunk", b"x"));
        assert_ne!(a.name("chunk", b"x"), b.name("chunk", b"x"));
        assert_ne!(a.name("chunk", b"x"), a.name("tree", b"x"));
        assert_ne!(a.check(), b.check());
    }

    #[test]
    fn key_file_is_created_0600_and_a_readable_one_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/remote.key");
        assert!(RepoKey::load(&p, false).is_err());
        let k1 = RepoKey::load(&p, true).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let k2 = RepoKey::load(&p, false).unwrap();
        assert_eq!(k1.check(), k2.check());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = RepoKey::load(&p, false).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
