//! One checkpoint's view, uploaded as trees and content (docs/remote-format.md).
//!
//! Cost grows with what changed: the snapshotter keeps, for the last checkpoint it pushed,
//! every directory's tree (its entries and name). For the next checkpoint it asks the
//! history which paths changed in between ([`History::changes`], which follows format 4's
//! renames), recomputes only those paths' parents and the directories above them, and reuses
//! every other subtree by name: no stat, read or request for it. A file whose path did not
//! change keeps its chunk list. The first push of a process walks the whole view (untracked
//! files included), uploading only what the remote lacks.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, Read};

use super::format::{self, Chunk, Content, Entry, Tree};
use super::repo::Repo;
use crate::history::changes::Point;
use crate::history::{History, ViewContent, ViewEntry};
use crate::transcript::record::EntryKind;

/// A directory as last pushed: its entries by name and its tree object's name.
#[derive(Clone)]
struct DirNode {
    entries: BTreeMap<Vec<u8>, Entry>,
    tree: String,
}

/// What one checkpoint's push did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PushStats {
    /// Bytes uploaded (sealed sizes), content and trees.
    pub uploaded: u64,
    /// Objects uploaded.
    pub objects: u64,
    /// Files and bytes the checkpoint's view holds.
    pub files: u64,
    pub bytes: u64,
    /// Directories listed (those not reused from the previous checkpoint).
    pub dirs_walked: u64,
}

#[derive(Default)]
pub struct Snapshotter {
    /// The checkpoint `dirs` describes, and its directories by path ("" the root).
    last: Option<usize>,
    dirs: HashMap<String, DirNode>,
    /// File totals of `last` (kept so an incremental push reports the whole view's).
    totals: (u64, u64),
}

/// The work of one push, applied to the snapshotter only when it succeeds: a failed push
/// leaves the cache describing the last pushed checkpoint.
struct Pass<'a> {
    history: &'a History,
    repo: &'a Repo,
    k: usize,
    /// Paths whose entry changed since `last` (and the directories above them).
    changed: BTreeSet<String>,
    dirty_dirs: BTreeSet<String>,
    old: &'a HashMap<String, DirNode>,
    new: HashMap<String, DirNode>,
    stats: PushStats,
}

fn join(parent: &str, name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    Some(if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    })
}

impl Snapshotter {
    /// Uploads checkpoint `k`'s view and returns its root entry and what it cost.
    pub fn push(
        &mut self,
        history: &History,
        repo: &Repo,
        k: usize,
    ) -> io::Result<(Entry, PushStats)> {
        let (changed, incremental) = match self.last {
            Some(j) if j < k && history.checkpoint_at(j).is_some() => (
                history
                    .changes(Point::Checkpoint(j), Point::Checkpoint(k))?
                    .into_keys()
                    .collect::<BTreeSet<String>>(),
                true,
            ),
            _ => (BTreeSet::new(), false),
        };
        let mut dirty_dirs = BTreeSet::new();
        for p in &changed {
            dirty_dirs.insert(p.clone());
            let mut q = p.as_str();
            while let Some(i) = q.rfind('/') {
                q = &q[..i];
                dirty_dirs.insert(q.to_string());
            }
            dirty_dirs.insert(String::new());
        }
        let empty = HashMap::new();
        let mut pass = Pass {
            history,
            repo,
            k,
            changed,
            dirty_dirs,
            old: if incremental { &self.dirs } else { &empty },
            new: HashMap::new(),
            stats: PushStats::default(),
        };
        let root_meta = history
            .view_entry(k, b"")?
            .ok_or_else(|| io::Error::other("the view's root is missing"))?;
        let tree = pass.dir("")?;
        let root = Entry::new(b"", &root_meta.meta, Content::Dir { tree });
        let mut stats = pass.stats;
        let new = pass.new;
        // Directories gone from a recomputed parent leave the cache with their subtree.
        let mut gone = Vec::new();
        for (path, node) in &new {
            if let Some(o) = self.dirs.get(path) {
                for (name, e) in &o.entries {
                    let still = node
                        .entries
                        .get(name)
                        .is_some_and(|n| n.kind == EntryKind::Dir);
                    if e.kind == EntryKind::Dir && !still {
                        gone.extend(join(path, name));
                    }
                }
            }
        }
        // The view's totals, kept up to date by what leaves and enters the cache.
        let mut totals = if incremental { self.totals } else { (0, 0) };
        if !incremental {
            self.dirs.clear();
        }
        if !gone.is_empty() {
            // One pass over the cache (memory only), each path checked by its ancestors.
            let gone: std::collections::HashSet<String> = gone.into_iter().collect();
            self.dirs.retain(|p, node| {
                let mut q = p.as_str();
                let under = loop {
                    if gone.contains(q) {
                        break true;
                    }
                    match q.rfind('/') {
                        Some(i) => q = &q[..i],
                        None => break false,
                    }
                };
                if under {
                    forget(&mut totals, node);
                }
                !under
            });
        }
        for (path, node) in new {
            let (f, b) = file_totals(&node);
            if let Some(old) = self.dirs.insert(path, node) {
                forget(&mut totals, &old);
            }
            totals.0 += f;
            totals.1 += b;
        }
        (stats.files, stats.bytes) = totals;
        self.totals = (stats.files, stats.bytes);
        self.last = Some(k);
        Ok((root, stats))
    }
}

/// Takes `node`'s files out of `totals`.
fn forget(totals: &mut (u64, u64), node: &DirNode) {
    let (f, b) = file_totals(node);
    totals.0 = totals.0.saturating_sub(f);
    totals.1 = totals.1.saturating_sub(b);
}

fn file_totals(node: &DirNode) -> (u64, u64) {
    node.entries
        .values()
        .filter(|e| e.kind == EntryKind::File)
        .fold((0, 0), |(f, b), e| (f + 1, b + e.size))
}

impl Pass<'_> {
    /// The tree name of directory `rel` at `k`, reusing the last push's when nothing below
    /// it changed.
    fn dir(&mut self, rel: &str) -> io::Result<String> {
        if !self.dirty_dirs.contains(rel)
            && let Some(node) = self.old.get(rel)
        {
            return Ok(node.tree.clone());
        }
        self.stats.dirs_walked += 1;
        let mut entries = BTreeMap::new();
        for (name, _kind) in self.history.view_list(self.k, rel.as_bytes())? {
            // Names that are not UTF-8 are not tracked and have no view path: skipped, as
            // the local views skip them.
            let Some(child) = join(rel, &name) else {
                continue;
            };
            let Some(e) = self.history.view_entry(self.k, child.as_bytes())? else {
                continue;
            };
            let entry = self.entry(rel, &name, &child, &e)?;
            entries.insert(name, entry);
        }
        let tree = Tree {
            entries: entries.values().cloned().collect(),
        };
        let json = serde_json::to_vec(&tree)?;
        let (name, up) = self.repo.put_data(format::DOMAIN_TREE, &json)?;
        self.count(up);
        self.new.insert(
            rel.to_string(),
            DirNode {
                entries,
                tree: name.clone(),
            },
        );
        Ok(name)
    }

    fn count(&mut self, uploaded: u64) {
        if uploaded > 0 {
            self.stats.uploaded += uploaded;
            self.stats.objects += 1;
        }
    }

    fn entry(
        &mut self,
        parent: &str,
        name: &[u8],
        child: &str,
        e: &ViewEntry,
    ) -> io::Result<Entry> {
        let content = match e.meta.kind {
            EntryKind::Dir => Content::Dir {
                tree: self.dir(child)?,
            },
            EntryKind::Symlink => Content::Symlink {
                target: base16ct::lower::encode_string(&self.history.view_symlink_target(e)?),
            },
            EntryKind::File => {
                let reused = (!self.changed.contains(child))
                    .then(|| self.old.get(parent).and_then(|n| n.entries.get(name)))
                    .flatten()
                    .filter(|o| o.kind == EntryKind::File && o.size == e.meta.size);
                match reused.map(|o| o.content.clone()) {
                    Some(c @ Content::File { .. }) => c,
                    _ => Content::File {
                        chunks: self.upload_file(child, e)?,
                    },
                }
            }
            _ => Content::None,
        };
        let mut entry = Entry::new(name, &e.meta, content);
        if let Some(set) = e.meta.xattrs_object() {
            let bytes = self.history.store().read_object(set)?;
            let (n, up) = self.repo.put_data(format::DOMAIN_CHUNK, &bytes)?;
            self.count(up);
            entry.xattrs = Some(n);
        }
        Ok(entry)
    }

    /// Uploads a file's chunks (what the remote lacks) and returns its chunk list. A file
    /// read from SRC (untracked) is checked again after the read: if its entry changed
    /// meanwhile (a write through the mount backed it up first), the read is redone from
    /// what the view shows now.
    fn upload_file(&mut self, child: &str, e: &ViewEntry) -> io::Result<Vec<Chunk>> {
        let mut e = e.clone();
        for _ in 0..3 {
            let chunks = self.upload_chunks(&e)?;
            if !matches!(e.content, ViewContent::Live(_)) {
                return Ok(chunks);
            }
            match self.history.view_entry(self.k, child.as_bytes())? {
                Some(now) if now == e => return Ok(chunks),
                Some(now) => e = now,
                None => {
                    return Err(io::Error::other(format!(
                        "{child} vanished during its push"
                    )));
                }
            }
        }
        Err(io::Error::other(format!(
            "{child} kept changing while it was read for the push; retried later"
        )))
    }

    fn upload_chunks(&mut self, e: &ViewEntry) -> io::Result<Vec<Chunk>> {
        let mut f = self.history.view_open(e)?;
        let mut chunks = Vec::new();
        let mut buf = vec![0u8; format::CHUNK_SIZE];
        loop {
            let mut n = 0;
            while n < buf.len() {
                match f.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(m) => n += m,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => return Err(err),
                }
            }
            if n == 0 {
                break;
            }
            let data = &buf[..n];
            if data.iter().all(|&b| b == 0) {
                chunks.push(Chunk {
                    name: None,
                    len: n as u64,
                });
            } else {
                let (name, up) = self.repo.put_data(format::DOMAIN_CHUNK, data)?;
                self.count(up);
                chunks.push(Chunk {
                    name: Some(name),
                    len: n as u64,
                });
            }
            if n < buf.len() {
                break;
            }
        }
        Ok(chunks)
    }
}
