//! What changed between two points of a history ([`History::changes`]); computed online
//! (in the daemon) or offline (a state dir opened read-only). `log`, `diff` and `status` are
//! computed in [`super::logdiff`] and [`super::status`] and rendered in [`crate::cli::render`].
use std::collections::{BTreeMap, BTreeSet};
use std::io;

use super::History;
use super::view::ViewEntry;
use crate::transcript::record::{EntryKind, EntryMeta};

/// A point in the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Before anything was changed through the mount.
    Origin,
    Checkpoint(usize),
    /// The live tree.
    Now,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Modified => 'M',
            ChangeKind::Deleted => 'D',
        }
    }
}

fn not_found(id: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no checkpoint named '{id}' (see: checkpointfs log MNT)"),
    )
}

/// See [`History::versions_by_checkpoint`].
pub(crate) type VersionIndex = BTreeMap<usize, Vec<String>>;

/// How a path changed, with its entry before and after (`None`: absent).
pub type Change = (ChangeKind, Option<ViewEntry>, Option<ViewEntry>);

impl History {
    pub fn point(&self, id: &str) -> io::Result<Point> {
        self.checkpoint_index(id)
            .map(Point::Checkpoint)
            .ok_or_else(|| not_found(id))
    }

    fn entry_at_point(&self, p: Point, rel: &str) -> io::Result<Option<ViewEntry>> {
        match p {
            Point::Origin => self.entry_at(None, rel.as_bytes()),
            Point::Checkpoint(k) => self.entry_at(Some(k), rel.as_bytes()),
            // With its xattrs' object name (not stored), to compare with a recorded one.
            Point::Now => {
                let mut entry = self.live_entry(rel)?;
                if let Some(e) = entry.as_mut() {
                    e.meta.xattrs = self.current_xattrs_name(rel)?;
                }
                Ok(entry)
            }
        }
    }

    /// Tracked paths that differ between `a` and `b`, with the entries on each side.
    pub fn changes(&self, a: Point, b: Point) -> io::Result<BTreeMap<String, Change>> {
        let index = self.versions_by_checkpoint();
        self.changes_with(&index, a, b)
    }

    /// checkpoint index → the paths that got a version at it. Built once per report, in
    /// O(versions), so that comparing two checkpoints looks only at what changed between
    /// them, not at every tracked path.
    pub(crate) fn versions_by_checkpoint(&self) -> VersionIndex {
        let st = self.lock();
        let mut index: VersionIndex = BTreeMap::new();
        for (path, h) in &st.paths {
            for k in h.versions.iter().filter_map(|v| v.since) {
                index.entry(k).or_default().push(path.clone());
            }
        }
        index
    }

    /// [`History::changes`] with an index from [`History::versions_by_checkpoint`].
    pub(crate) fn changes_with(
        &self,
        index: &VersionIndex,
        a: Point,
        b: Point,
    ) -> io::Result<BTreeMap<String, Change>> {
        // Between two recorded points a path can differ only if it has a version made
        // between them (from the origin: at or before the later one); otherwise both sides
        // are the same version. The live tree can differ anywhere (a change made in SRC
        // directly), so against it every tracked path is compared.
        let recorded = |p: Point| match p {
            Point::Origin => Some(None),
            Point::Checkpoint(k) => Some(Some(k)),
            Point::Now => None,
        };
        let paths: BTreeSet<String> = match (recorded(a), recorded(b)) {
            (Some(x), Some(y)) => {
                let (lo, hi) = if x <= y { (x, y) } else { (y, x) };
                let hi = hi.unwrap_or(0);
                let range = match lo {
                    None => index.range(..=hi),
                    Some(lo) if lo < hi => index.range(lo + 1..=hi),
                    Some(_) => index.range(1..1),
                };
                range.flat_map(|(_, ps)| ps.iter().cloned()).collect()
            }
            _ => self.lock().paths.keys().cloned().collect(),
        };
        let mut paths = paths;
        // Format 4: a rename between the points moved every name below its endpoints
        // without a record of each: they are listed now, at both points (O(subtree), what
        // the report's output is anyway), and compared like the others.
        for dir in self.renamed_between(a, b) {
            for point in [a, b] {
                self.names_below(point, &dir, &mut paths)?;
            }
        }
        // Against the live tree, every path's attributes at once (a stat each).
        let live = if a == Point::Now || b == Point::Now {
            Some(self.current_metas(paths.iter().map(String::as_str))?)
        } else {
            None
        };
        let mut out = BTreeMap::new();
        for p in &paths {
            let now = live.as_ref().and_then(|l| l.get(p.as_str()));
            if let Some(change) = self.change_between(a, b, p, now)? {
                out.insert(p.clone(), change);
            }
        }
        Ok(out)
    }

    /// The endpoints of the renames between points `a` and `b` (format 4).
    fn renamed_between(&self, a: Point, b: Point) -> BTreeSet<String> {
        let st = self.lock();
        if st.renames.done().is_empty() {
            return BTreeSet::new();
        }
        let seq = |p: Point| match p {
            Point::Origin => None,
            Point::Checkpoint(k) => st.checkpoints.get(k).map(|c| c.seq),
            Point::Now => Some(u64::MAX),
        };
        let (x, y) = (seq(a), seq(b));
        let (lo, hi) = if x <= y { (x, y) } else { (y, x) };
        st.renames
            .after(lo)
            .iter()
            .take_while(|r| Some(r.seq) <= hi)
            .flat_map(|r| [r.from.clone(), r.to.clone()])
            .collect()
    }

    /// Adds to `out` every name below directory `dir` at point `p` (not excluded ones from
    /// the live tree). The origin is not listed: its lookups are v1's, whatever moved.
    fn names_below(&self, p: Point, dir: &str, out: &mut BTreeSet<String>) -> io::Result<()> {
        let mut stack = vec![dir.to_string()];
        while let Some(d) = stack.pop() {
            let children: Vec<(String, bool)> = match p {
                Point::Origin => return Ok(()),
                Point::Checkpoint(k) => {
                    if !self
                        .entry_at(Some(k), d.as_bytes())?
                        .is_some_and(|e| e.meta.kind == EntryKind::Dir)
                    {
                        continue;
                    }
                    self.view_list(k, d.as_bytes())?
                        .into_iter()
                        .filter_map(|(n, kind)| {
                            Some((String::from_utf8(n).ok()?, kind == EntryKind::Dir))
                        })
                        .collect()
                }
                Point::Now => {
                    let Some(fd) = self.open_existing(&d)? else {
                        continue;
                    };
                    use std::os::fd::AsFd;
                    if crate::sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR {
                        continue;
                    }
                    let mut stream = crate::sys::DirStream::open(fd.as_fd(), true)?;
                    let mut v = Vec::new();
                    while let Some(e) = stream.next_entry()? {
                        if e.name == b"." || e.name == b".." {
                            continue;
                        }
                        if let Ok(n) = String::from_utf8(e.name.to_vec()) {
                            let maybe_dir = matches!(e.d_type, libc::DT_DIR | libc::DT_UNKNOWN);
                            v.push((n, maybe_dir));
                        }
                    }
                    v
                }
            };
            for (name, is_dir) in children {
                let child = format!("{d}/{name}");
                if self.is_excluded(&child, Some(is_dir))
                    && !self.lock().renames.moved_content_to(&child)
                {
                    continue;
                }
                if is_dir {
                    stack.push(child.clone());
                }
                out.insert(child);
            }
        }
        Ok(())
    }

    /// How tracked path `p` differs between `a` and `b`; `None`: it does not.
    pub(crate) fn change_of(&self, a: Point, b: Point, p: &str) -> io::Result<Option<Change>> {
        self.change_between(a, b, p, None)
    }

    /// [`History::change_of`], with `p`'s live attributes if the caller has them already.
    fn change_between(
        &self,
        a: Point,
        b: Point,
        p: &str,
        now: Option<&Option<EntryMeta>>,
    ) -> io::Result<Option<Change>> {
        let entry = |at: Point| match (at, now) {
            (Point::Now, Some(meta)) => Ok(super::view::live_view_entry(p, meta.clone())),
            _ => self.entry_at_point(at, p),
        };
        let before = entry(a)?;
        let after = entry(b)?;
        let kind = match (&before, &after) {
            (None, None) => return Ok(None),
            (None, Some(_)) => ChangeKind::Added,
            (Some(_), None) => ChangeKind::Deleted,
            (Some(x), Some(y)) => {
                if self.same(x, y)? {
                    return Ok(None);
                }
                ChangeKind::Modified
            }
        };
        Ok(Some((kind, before, after)))
    }

    /// Same type, mode, xattrs (where both sides recorded them) and content. Directories
    /// compare by mode and xattrs only.
    fn same(&self, x: &ViewEntry, y: &ViewEntry) -> io::Result<bool> {
        use super::view::ViewContent;
        if x.meta.kind != y.meta.kind || x.meta.mode != y.meta.mode {
            return Ok(false);
        }
        if let (Some(a), Some(b)) = (&x.meta.xattrs, &y.meta.xattrs)
            && a != b
        {
            return Ok(false);
        }
        if !matches!(x.meta.kind, EntryKind::File | EntryKind::Symlink) {
            return Ok(true);
        }
        if x.meta.kind == EntryKind::File && x.meta.size != y.meta.size {
            return Ok(false);
        }
        if let (ViewContent::Object(a), ViewContent::Object(b)) = (&x.content, &y.content) {
            return Ok(a == b);
        }
        // A recorded version against the live file with the same size and mtime: the same
        // content (a change sets the mtime; only a deliberate utimensat from outside the
        // mount could hide one, as for git's index). Saves reading every tracked file when
        // `log` and `diff` compare the last checkpoint with the live tree.
        if x.meta.kind == EntryKind::File
            && (x.meta.mtime_sec, x.meta.mtime_nsec) == (y.meta.mtime_sec, y.meta.mtime_nsec)
            && matches!(
                (&x.content, &y.content),
                (ViewContent::Object(_), ViewContent::Live(_))
                    | (ViewContent::Live(_), ViewContent::Object(_))
            )
        {
            return Ok(true);
        }
        if x.meta.kind == EntryKind::Symlink {
            return Ok(self.view_symlink_target(x)? == self.view_symlink_target(y)?);
        }
        // Compared in bounded memory: a file may be big, and sparse.
        let (a, b) = (self.view_open(x)?, self.view_open(y)?);
        Ok(super::compare::bytes_changed(&a, &b)? == 0)
    }
}
