//! One remote repository: a URL, its object store, and the key that seals and names what is
//! in it. Every object goes through here, sealed on the way up and verified on the way down
//! (authenticated decryption bound to the object's name, then the keyed hash of the
//! plaintext against the name for content): a damaged, moved or truncated object is an error
//! naming it, never data.
use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex};

use futures_util::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::format::{self, Config, data_name};
use super::key::RepoKey;
use super::url::RemoteUrl;

pub struct Repo {
    url: RemoteUrl,
    store: Arc<dyn ObjectStore>,
    key: RepoKey,
    rt: tokio::runtime::Runtime,
    /// Content names known to be in the remote (uploaded or seen by this process): content is
    /// immutable and never deleted under a live push (remote gc's grace period, see
    /// docs/remote-format.md), so once seen it need not be asked for again.
    known: Mutex<HashSet<String>>,
}

/// An error about `what` in the remote, keeping object_store's kind (not found vs other).
fn remote_error(url: &RemoteUrl, what: &str, e: object_store::Error) -> io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, redact(format!("remote {url}: {what}: {e}")))
}

/// `text` with the values of the credential variables replaced by their names.
/// object_store's messages name the request's path and status, and never the secret; but a
/// server's error body may quote the access key id ("no such key GK..."), and a message must
/// not carry any of them into a log, `status` or the terminal.
pub fn redact(mut text: String) -> String {
    for var in [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ] {
        if let Ok(value) = std::env::var(var)
            && value.len() >= 4
        {
            text = text.replace(&value, &format!("<{var}>"));
        }
    }
    text
}

impl Repo {
    pub fn open(url: RemoteUrl, key: RepoKey) -> io::Result<Repo> {
        let store = url.open().map_err(io::Error::other)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Repo {
            url,
            store,
            key,
            rt,
            known: Mutex::new(HashSet::new()),
        })
    }

    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// The path of `rel` (relative to this key's repository) in the store, and as text.
    fn path(&self, rel: &str) -> (object_store::path::Path, String) {
        let p = self
            .url
            .object_path(&format!("r/{}/{rel}", self.key.check()));
        let s = p.to_string();
        (p, s)
    }

    /// Writes `config.json` (same bytes for every writer with this key: a duplicate PUT does
    /// no harm), or checks the one there is of a format this code reads.
    pub fn init(&self) -> io::Result<()> {
        let (path, shown) = self.path("config.json");
        match self.rt.block_on(async {
            let got = self.store.get(&path).await?;
            got.bytes().await
        }) {
            Ok(bytes) => {
                let cfg: Config = serde_json::from_slice(&bytes).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{shown}: {e}"))
                })?;
                if cfg.format > format::FORMAT {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "remote {} has format {} and this checkpointfs reads up to {}: \
                             upgrade checkpointfs",
                            self.url,
                            cfg.format,
                            format::FORMAT
                        ),
                    ));
                }
                Ok(())
            }
            Err(object_store::Error::NotFound { .. }) => {
                let text = serde_json::to_vec_pretty(&Config::current())?;
                self.rt
                    .block_on(self.store.put(&path, PutPayload::from(text)))
                    .map_err(|e| remote_error(&self.url, &format!("writing {shown}"), e))?;
                Ok(())
            }
            Err(e) => Err(remote_error(&self.url, &format!("reading {shown}"), e)),
        }
    }

    /// Uploads `plaintext` as the content object its keyed hash names, unless the remote
    /// holds it already. Returns its name and the bytes uploaded (0 when it was there).
    pub fn put_data(&self, domain: &str, plaintext: &[u8]) -> io::Result<(String, u64)> {
        let name = self.key.name(domain, plaintext);
        if self.is_known(&name) {
            return Ok((name, 0));
        }
        let (path, shown) = self.path(&data_name(&name));
        match self.rt.block_on(self.store.head(&path)) {
            Ok(_) => {
                self.note_known(&name);
                return Ok((name, 0));
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(remote_error(&self.url, &format!("looking up {shown}"), e)),
        }
        let sealed = self.key.seal(&shown, plaintext);
        let n = sealed.len() as u64;
        self.rt
            .block_on(self.store.put(&path, PutPayload::from(sealed)))
            .map_err(|e| remote_error(&self.url, &format!("writing {shown}"), e))?;
        self.note_known(&name);
        Ok((name, n))
    }

    /// Whether content `name` is known to be in the remote (a tree known there has its whole
    /// subtree there: a tree is uploaded only after everything it names).
    pub fn is_known(&self, name: &str) -> bool {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(name)
    }

    fn note_known(&self, name: &str) {
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
    }

    /// Downloads content object `name`, checks it, and returns its plaintext.
    pub fn get_data(&self, domain: &str, name: &str) -> io::Result<Vec<u8>> {
        if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a remote record names content {name:?}, which is not a content name"),
            ));
        }
        let rel = data_name(name);
        let plain = self.get_sealed(&rel)?;
        if self.key.name(domain, &plain) != name {
            let (_, shown) = self.path(&rel);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "remote object {shown} is damaged or was tampered with: its content does not match its name"
                ),
            ));
        }
        Ok(plain)
    }

    /// Seals `plaintext` into `rel` (a name unique to its writer: manifests, session info).
    pub fn put_sealed(&self, rel: &str, plaintext: &[u8]) -> io::Result<u64> {
        let (path, shown) = self.path(rel);
        let sealed = self.key.seal(&shown, plaintext);
        let n = sealed.len() as u64;
        self.rt
            .block_on(self.store.put(&path, PutPayload::from(sealed)))
            .map_err(|e| remote_error(&self.url, &format!("writing {shown}"), e))?;
        Ok(n)
    }

    /// Reads and opens `rel`; a missing object is NotFound naming it.
    pub fn get_sealed(&self, rel: &str) -> io::Result<Vec<u8>> {
        let (path, shown) = self.path(rel);
        let bytes = self
            .rt
            .block_on(async {
                let got = self.store.get(&path).await?;
                got.bytes().await
            })
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("remote object {shown} is missing from {}", self.url),
                ),
                e => remote_error(&self.url, &format!("reading {shown}"), e),
            })?;
        self.key.open(&shown, &bytes)
    }

    /// A sealed JSON object.
    pub fn get_json<T: serde::de::DeserializeOwned>(&self, rel: &str) -> io::Result<T> {
        let plain = self.get_sealed(rel)?;
        serde_json::from_slice(&plain).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("remote object {rel}: not a valid record ({e})"),
            )
        })
    }

    /// The names directly below `rel/` (one level), sorted.
    pub fn list_dir(&self, rel: &str) -> io::Result<Vec<String>> {
        let (path, shown) = self.path(rel);
        let listed = self
            .rt
            .block_on(self.store.list_with_delimiter(Some(&path)))
            .map_err(|e| remote_error(&self.url, &format!("listing {shown}"), e))?;
        let mut out: Vec<String> = listed
            .common_prefixes
            .iter()
            .chain(listed.objects.iter().map(|o| &o.location))
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Every object's path and size under the repository (`remote log`'s totals).
    pub fn list_all(&self) -> io::Result<Vec<(String, u64)>> {
        let (path, shown) = self.path("");
        self.rt
            .block_on(
                self.store
                    .list(Some(&path))
                    .map_ok(|m| (m.location.to_string(), m.size))
                    .try_collect::<Vec<_>>(),
            )
            .map_err(|e| remote_error(&self.url, &format!("listing {shown}"), e))
    }
}
