//! The three-way merge of a branch back into the main tree (issue 27), as a plan: what to
//! change in the main tree ("ours") so it holds both its own changes and the branch's
//! ("theirs") since the branch forked ("base"), or the conflicts that stop it.
//!
//! Pure: it reads three [`Tree`]s and changes nothing. Applying the plan (through the gate,
//! after a `NAME:before-merge` checkpoint, like a rewind) is its caller's work; see
//! docs/design.md, "Merging a branch".
//!
//! Only the paths the caller names as changed since the fork, on either side, are looked
//! at (plus the content of a directory added or removed whole), so the cost grows with
//! what changed, never with the tree. The contract on those sets: every path whose entry
//! (type, mode, content) differs between base and that side is in its set, or beneath a
//! directory in the set that was added, removed or replaced whole on that side. Extra
//! paths are harmless.
//!
//! Per path: changed on one side only → that side; the same on both → it; a text file
//! changed on both → merged line by line ([`text`]); anything else changed on both sides
//! (overlapping lines, binary content, mode, type, a symlink's target, delete/modify, a
//! directory removed on one side with changes inside on the other) is a [`Conflict`],
//! never guessed. A repository's `.git/` is not merged path by path ([`git`]).
#![allow(
    dead_code,
    unused_imports,
    reason = "wired into `checkpointfs branch merge` once branches land (docs/design.md, \
              \"Merging a branch\"); until then only its tests call it"
)]
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::sys;

mod git;
mod report;
#[cfg(test)]
mod tests;
pub mod text;
pub mod tree;

pub use report::{render_json, render_text};
pub use text::Hunk;
pub use tree::{DirTree, Node, NodeKind, Tree, ViewTree};

/// Where the daemon serves branches, relative to the mount point.
pub const BRANCHES_DIR: &str = ".checkpoint/branches";

/// Which of the three trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Base,
    Ours,
    Theirs,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Base => "the branch's fork point",
            Side::Ours => "the main tree",
            Side::Theirs => "the branch",
        }
    }
}

/// Why a merge could not even be planned. Conflicts are not errors: they are in the plan.
#[derive(Debug)]
pub enum MergeError {
    /// The branch's fork point is gone (a gc removed its checkpoint) or was never there:
    /// without it nothing can tell which side changed what.
    BaseMissing { what: String },
    /// Reading `path` in one tree failed; `source` keeps the errno.
    Io {
        side: Side,
        path: String,
        source: io::Error,
    },
    /// The branch name cannot be a git ref (`git check-ref-format`).
    BadRefName { name: String },
}

impl MergeError {
    pub(crate) fn io(side: Side, path: &str, source: io::Error) -> MergeError {
        MergeError::Io {
            side,
            path: path.to_string(),
            source,
        }
    }

    /// The errno a caller should exit with or answer.
    pub fn errno(&self) -> i32 {
        match self {
            MergeError::BaseMissing { .. } => libc::ENOENT,
            MergeError::Io { source, .. } => match sys::errno_of(source) {
                0 => libc::EIO,
                e => e,
            },
            MergeError::BadRefName { .. } => libc::EINVAL,
        }
    }
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeError::BaseMissing { what } => write!(
                f,
                "cannot merge: the branch's fork point ({what}) is gone (a gc may have \
                 removed it), so its changes cannot be told from the main tree's"
            ),
            MergeError::Io { side, path, source } => {
                let path = if path.is_empty() { "/" } else { path };
                write!(
                    f,
                    "cannot read {path} in {}: {}",
                    side.name(),
                    sys::error_text(source)
                )
            }
            MergeError::BadRefName { name } => write!(
                f,
                "cannot merge: the branch name {name:?} is not a valid git branch name"
            ),
        }
    }
}

impl std::error::Error for MergeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MergeError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// What to do with conflicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConflictMode {
    /// Any conflict: the plan changes nothing.
    Refuse,
    /// Conflicting text files get git's markers; any other conflict still refuses.
    Markers,
}

/// Where a change's content comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Nothing to write: a directory or a special file.
    None,
    /// The same path in theirs (files: its bytes; symlinks: its target). Read when the plan
    /// is applied, so theirs must be a frozen tree (the branch's checkpoint view).
    Theirs,
    /// These bytes: a merged text file, a git ref.
    Bytes(Vec<u8>),
}

/// One change to ours, in plan order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Remove `path` (a directory is empty by then: its entries come first).
    Remove { path: String, kind: NodeKind },
    /// Create `path` (absent in ours, or removed by an earlier change): type, mode, device
    /// of `node`, content from `content`.
    Create {
        path: String,
        node: Node,
        content: Content,
    },
    /// Replace the content of the file or symlink at `path` (same type), and set `mode`.
    Rewrite {
        path: String,
        mode: u32,
        content: Content,
    },
    /// Set the permission bits of `path`.
    Chmod { path: String, mode: u32 },
}

impl Change {
    pub fn path(&self) -> &str {
        match self {
            Change::Remove { path, .. }
            | Change::Create { path, .. }
            | Change::Rewrite { path, .. }
            | Change::Chmod { path, .. } => path,
        }
    }
}

/// What makes a path a conflict.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ConflictKind {
    /// A text file both sides changed on overlapping lines (or added with other content).
    Text,
    /// A binary file both sides changed.
    Binary,
    /// Both sides changed the permission bits, differently.
    Mode { ours: u32, theirs: u32 },
    /// The two sides made it of different types (file, directory, symlink, special).
    Type { ours: NodeKind, theirs: NodeKind },
    /// Both sides changed a symlink's target, differently.
    Symlink,
    /// Both sides changed a special file (fifo, socket, device), differently.
    Special,
    /// One side deleted it, the other changed it.
    DeleteModify { deleted_in: Side },
    /// One side removed (or replaced) directory `dir`, the other changed something in it.
    DirectoryRemoved { dir: String, removed_in: Side },
    /// The branch's commit cannot become `refs/heads/NAME` in the main repository:
    /// `existing` is what that ref (or a ref in the way of it) holds there.
    GitRef {
        repository: String,
        commit: String,
        existing: String,
    },
    /// The branch committed in a repository the main tree removed or replaced.
    GitRepository,
}

impl ConflictKind {
    /// Whether `--conflicts markers` can write this conflict as markers.
    pub fn is_text(&self) -> bool {
        matches!(self, ConflictKind::Text)
    }

    fn describe(&self, branch: &str) -> String {
        match self {
            ConflictKind::Text => "both sides changed the same lines".to_string(),
            ConflictKind::Binary => "binary file changed on both sides".to_string(),
            ConflictKind::Mode { ours, theirs } => {
                format!("mode changed on both sides: main {ours:04o}, {branch} {theirs:04o}")
            }
            ConflictKind::Type { ours, theirs } => {
                format!("a {} in main, a {} in {branch}", ours.name(), theirs.name())
            }
            ConflictKind::Symlink => "symlink target changed on both sides".to_string(),
            ConflictKind::Special => "special file changed on both sides".to_string(),
            ConflictKind::DeleteModify { deleted_in } => match deleted_in {
                Side::Ours => format!("deleted in main, changed in {branch}"),
                _ => format!("deleted in {branch}, changed in main"),
            },
            ConflictKind::DirectoryRemoved { dir, removed_in } => match removed_in {
                Side::Ours => format!("directory {dir} removed in main, changed in {branch}"),
                _ => format!("directory {dir} removed in {branch}, changed in main"),
            },
            ConflictKind::GitRef {
                commit, existing, ..
            } => format!(
                "{branch}'s commit {commit} cannot become refs/heads/{branch}: main has {existing}"
            ),
            ConflictKind::GitRepository => {
                format!("{branch} committed in a repository main removed or replaced")
            }
        }
    }
}

/// A command that resolves a conflict one way, to copy and run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Resolution {
    /// What it does, in words.
    pub action: String,
    pub command: String,
}

/// A path the merge cannot decide.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    pub path: String,
    #[serde(flatten)]
    pub kind: ConflictKind,
    /// Text conflicts: each conflicting region, both sides.
    pub hunks: Vec<Hunk>,
    /// Whether the plan writes this conflict as markers (`--conflicts markers`).
    pub markers: bool,
    /// Ways to resolve it; after any, the merge runs again cleanly for this path.
    pub resolve: Vec<Resolution>,
}

impl Conflict {
    pub(crate) fn new(path: &str, kind: ConflictKind) -> Conflict {
        Conflict {
            path: path.to_string(),
            kind,
            hunks: Vec::new(),
            markers: false,
            resolve: Vec::new(),
        }
    }
}

/// The changes a merge makes to ours, in order: removals deepest first (a directory's
/// entries before it), then creations and rewrites shallowest first (a directory before
/// its entries), as a rewind orders them; then packs' indexes (a pack is usable once its
/// `.idx` exists, so that comes after the pack) and last the new git refs (once every
/// object they reach is there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergePlan {
    pub changes: Vec<Change>,
}

/// A merge's plan and conflicts. With conflicts in `Refuse` mode, or any conflict that
/// is not text, `plan` is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergeOutcome {
    pub plan: MergePlan,
    pub conflicts: Vec<Conflict>,
    /// Whether the conflicts made the merge refuse (the plan is empty because of them).
    pub refused: bool,
}

/// What a merge is asked to do.
pub struct MergeInput<'a> {
    /// The tree at the branch's fork point.
    pub base: &'a dyn Tree,
    /// The main tree now.
    pub ours: &'a dyn Tree,
    /// The branch now (a frozen view: its content is read again when the plan is applied).
    pub theirs: &'a dyn Tree,
    /// Paths changed between base and ours.
    pub changed_ours: &'a BTreeSet<String>,
    /// Paths changed between base and theirs.
    pub changed_theirs: &'a BTreeSet<String>,
    /// The branch's name: the label of its side of a conflict, the git ref it becomes.
    pub branch: &'a str,
    /// The mount point, for the commands that resolve conflicts.
    pub mount: &'a Path,
    pub mode: ConflictMode,
}

/// The three trees' nodes at one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Nodes {
    base: Option<Node>,
    ours: Option<Node>,
    theirs: Option<Node>,
}

/// What the merge decides for one path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// Ours stays as it is.
    Keep,
    /// Theirs' entry, content and all.
    Theirs,
    /// A file with this content and mode (a line merge, or ours' content with theirs' mode).
    File { mode: u32, bytes: Vec<u8> },
    /// Ours' entry with theirs' mode.
    Mode(u32),
    /// Not decided.
    Conflict,
}

/// The first `.git` component of `rel`: the repository's git dir, and the rest.
fn git_dir_of(rel: &str) -> Option<(&str, &str)> {
    let mut at = 0;
    for part in rel.split('/') {
        if part == ".git" {
            let end = at + part.len();
            return Some((&rel[..end], rel.get(end + 1..).unwrap_or("")));
        }
        at += part.len() + 1;
    }
    None
}

/// `rel`'s parent (`""` at the top; `None` for the root itself).
fn parent_of(rel: &str) -> Option<&str> {
    if rel.is_empty() {
        return None;
    }
    Some(rel.rsplit_once('/').map_or("", |(p, _)| p))
}

fn child(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The planner's state: the inputs, and what it has read.
struct Planner<'a> {
    input: &'a MergeInput<'a>,
    nodes: BTreeMap<String, Nodes>,
    /// Contents read, by side and path (files and symlinks compared or merged).
    read: BTreeMap<(u8, String), Vec<u8>>,
}

impl<'a> Planner<'a> {
    fn tree(&self, side: Side) -> &'a dyn Tree {
        match side {
            Side::Base => self.input.base,
            Side::Ours => self.input.ours,
            Side::Theirs => self.input.theirs,
        }
    }

    fn nodes(&mut self, rel: &str) -> Result<Nodes, MergeError> {
        if let Some(n) = self.nodes.get(rel) {
            return Ok(*n);
        }
        let n = Nodes {
            base: self.input.base.node(rel)?,
            ours: self.input.ours.node(rel)?,
            theirs: self.input.theirs.node(rel)?,
        };
        self.nodes.insert(rel.to_string(), n);
        Ok(n)
    }

    fn content(&mut self, side: Side, rel: &str) -> Result<&[u8], MergeError> {
        let key = (side as u8, rel.to_string());
        if !self.read.contains_key(&key) {
            let data = self.tree(side).read(rel)?;
            self.read.insert(key.clone(), data);
        }
        Ok(&self.read[&key])
    }

    /// Whether `x` (in `xs`) and `y` (in `ys`) are the same entry: type, mode, content.
    fn same(
        &mut self,
        rel: &str,
        (x, xs): (Option<Node>, Side),
        (y, ys): (Option<Node>, Side),
    ) -> Result<bool, MergeError> {
        let (Some(x), Some(y)) = (x, y) else {
            return Ok(x.is_none() && y.is_none());
        };
        if x != y {
            return Ok(false);
        }
        if !matches!(x.kind, NodeKind::File | NodeKind::Symlink) {
            return Ok(true);
        }
        let a = self.content(xs, rel)?.to_vec();
        Ok(a == self.content(ys, rel)?)
    }

    /// The candidate paths: both sets, without git dirs' insides (see [`git`]), plus the
    /// entries of directories whose content must be created or removed whole.
    fn candidates(&mut self) -> Result<BTreeSet<String>, MergeError> {
        let mut queue = Vec::new();
        for p in self
            .input
            .changed_ours
            .iter()
            .chain(self.input.changed_theirs)
        {
            if !self.is_merged_as_repository(p)? {
                queue.push(p.clone());
            }
        }
        let mut out = BTreeSet::new();
        while let Some(rel) = queue.pop() {
            if !out.insert(rel.clone()) {
                continue;
            }
            let n = self.nodes(&rel)?;
            let is_dir = |n: Option<Node>| n.is_some_and(|n| n.kind == NodeKind::Dir);
            // Theirs made a directory here: its entries are to be created. Ours has a
            // directory theirs removed or replaced: its entries are to be removed (or
            // conflict). A directory all three have lists its changed entries itself.
            let mut list = Vec::new();
            if is_dir(n.theirs) && !is_dir(n.base) {
                list.push(Side::Theirs);
            }
            if is_dir(n.ours) && is_dir(n.base) && !is_dir(n.theirs) {
                list.push(Side::Ours);
            }
            for side in list {
                for name in self.tree(side).list(&rel)? {
                    let c = child(&rel, &name);
                    if !self.is_merged_as_repository(&c)? {
                        queue.push(c);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether `rel` is in a git dir merged as a repository (the union in [`git`]) rather
    /// than path by path: one ours has as a directory, or base had. (A repository only the
    /// branch has is new, and taken path by path like any new directory.)
    fn is_merged_as_repository(&mut self, rel: &str) -> Result<bool, MergeError> {
        let Some((dir, _)) = git_dir_of(rel) else {
            return Ok(false);
        };
        let n = self.nodes(dir)?;
        Ok(n.ours.is_some_and(|o| o.kind == NodeKind::Dir) || n.base.is_some())
    }

    fn decide(&mut self, rel: &str, conflicts: &mut Vec<Conflict>) -> Result<Decision, MergeError> {
        let n = self.nodes(rel)?;
        let (b, o, t) = (n.base, n.ours, n.theirs);
        if self.same(rel, (o, Side::Ours), (t, Side::Theirs))? {
            return Ok(Decision::Keep);
        }
        if self.same(rel, (b, Side::Base), (o, Side::Ours))? {
            return Ok(Decision::Theirs);
        }
        if self.same(rel, (b, Side::Base), (t, Side::Theirs))? {
            return Ok(Decision::Keep);
        }
        // Changed on both sides, differently.
        let conflict = |conflicts: &mut Vec<Conflict>, kind| {
            conflicts.push(Conflict::new(rel, kind));
            Ok(Decision::Conflict)
        };
        let (o, t) = match (o, t) {
            (Some(o), Some(t)) => (o, t),
            (None, _) => {
                return conflict(
                    conflicts,
                    ConflictKind::DeleteModify {
                        deleted_in: Side::Ours,
                    },
                );
            }
            (_, None) => {
                return conflict(
                    conflicts,
                    ConflictKind::DeleteModify {
                        deleted_in: Side::Theirs,
                    },
                );
            }
        };
        if o.kind != t.kind || o.file_type != t.file_type {
            return conflict(
                conflicts,
                ConflictKind::Type {
                    ours: o.kind,
                    theirs: t.kind,
                },
            );
        }
        let base_same_kind = b.filter(|b| b.kind == o.kind && b.file_type == o.file_type);
        // The permission bits, merged on their own: one side's change is taken.
        let mode = if o.mode == t.mode || base_same_kind.is_some_and(|b| b.mode == t.mode) {
            Some(o.mode)
        } else if base_same_kind.is_some_and(|b| b.mode == o.mode) {
            Some(t.mode)
        } else {
            None
        };
        let Some(mode) = mode else {
            // Both sides changed the mode; content differences are reported below too.
            conflict(
                conflicts,
                ConflictKind::Mode {
                    ours: o.mode,
                    theirs: t.mode,
                },
            )?;
            if o.kind == NodeKind::File && o.size == t.size {
                let same = self.content(Side::Ours, rel)?.to_vec();
                if same == self.content(Side::Theirs, rel)? {
                    return Ok(Decision::Conflict);
                }
            }
            if o.kind != NodeKind::File {
                return Ok(Decision::Conflict);
            }
            self.merge_file(rel, b, o.mode, conflicts)?;
            return Ok(Decision::Conflict);
        };
        match o.kind {
            NodeKind::Dir => Ok(Decision::Mode(mode)),
            NodeKind::Special => {
                if o.rdev == t.rdev {
                    Ok(Decision::Mode(mode))
                } else {
                    conflict(conflicts, ConflictKind::Special)
                }
            }
            NodeKind::Symlink => {
                let ours = self.content(Side::Ours, rel)?.to_vec();
                if ours == self.content(Side::Theirs, rel)? {
                    Ok(Decision::Keep)
                } else {
                    conflict(conflicts, ConflictKind::Symlink)
                }
            }
            NodeKind::File => self.merge_file(rel, b, mode, conflicts),
        }
    }

    /// The content of a file both sides have, merged, with `mode`.
    fn merge_file(
        &mut self,
        rel: &str,
        base: Option<Node>,
        mode: u32,
        conflicts: &mut Vec<Conflict>,
    ) -> Result<Decision, MergeError> {
        let ours = self.content(Side::Ours, rel)?.to_vec();
        let theirs = self.content(Side::Theirs, rel)?.to_vec();
        // A file both sides added merges against an empty base, as git's add/add does.
        let base = match base {
            Some(b) if b.kind == NodeKind::File => self.content(Side::Base, rel)?.to_vec(),
            _ => Vec::new(),
        };
        if ours == theirs || base == theirs {
            return Ok(Decision::File { mode, bytes: ours });
        }
        if base == ours {
            return Ok(Decision::File {
                mode,
                bytes: theirs,
            });
        }
        let mut conflict = |kind, hunks, markers| {
            conflicts.push(Conflict {
                path: rel.to_string(),
                kind,
                hunks,
                markers,
                resolve: Vec::new(),
            });
        };
        if [&base, &ours, &theirs].iter().any(|d| text::is_binary(d)) {
            conflict(ConflictKind::Binary, Vec::new(), false);
            return Ok(Decision::Conflict);
        }
        let merged = text::merge(&base, &ours, &theirs, "main", self.input.branch);
        if merged.hunks.is_empty() {
            return Ok(Decision::File {
                mode,
                bytes: merged.merged,
            });
        }
        let markers = self.input.mode == ConflictMode::Markers;
        conflict(ConflictKind::Text, merged.hunks, markers);
        Ok(if markers {
            Decision::File {
                mode,
                bytes: merged.merged,
            }
        } else {
            Decision::Conflict
        })
    }

    /// The changes that make ours' `rel` what `decision` says.
    fn changes_for(&mut self, rel: &str, decision: Decision) -> Result<Vec<Change>, MergeError> {
        let n = self.nodes(rel)?;
        let mut out = Vec::new();
        let path = rel.to_string();
        match decision {
            Decision::Keep | Decision::Conflict => {}
            Decision::Mode(mode) => {
                if n.ours.is_some_and(|o| o.mode != mode) {
                    out.push(Change::Chmod { path, mode });
                }
            }
            Decision::File { mode, bytes } => {
                let o = n.ours.expect("a merged file exists in ours");
                if bytes != self.content(Side::Ours, rel)? {
                    out.push(Change::Rewrite {
                        path,
                        mode,
                        content: Content::Bytes(bytes),
                    });
                } else if o.mode != mode {
                    out.push(Change::Chmod { path, mode });
                }
            }
            Decision::Theirs => match (n.ours, n.theirs) {
                (Some(o), None) => out.push(Change::Remove { path, kind: o.kind }),
                (o, Some(t))
                    if o.is_none_or(|o| o.kind != t.kind || o.file_type != t.file_type) =>
                {
                    if let Some(o) = o {
                        out.push(Change::Remove {
                            path: path.clone(),
                            kind: o.kind,
                        });
                    }
                    let content = match t.kind {
                        NodeKind::File | NodeKind::Symlink => Content::Theirs,
                        _ => Content::None,
                    };
                    out.push(Change::Create {
                        path,
                        node: t,
                        content,
                    });
                }
                (Some(o), Some(t)) => {
                    let differs = match t.kind {
                        NodeKind::File | NodeKind::Symlink => {
                            let ours = self.content(Side::Ours, rel)?.to_vec();
                            ours != self.content(Side::Theirs, rel)?
                        }
                        // Same type: a device with another number is made again.
                        NodeKind::Special => o.rdev != t.rdev,
                        NodeKind::Dir => false,
                    };
                    if differs && t.kind == NodeKind::Special {
                        out.push(Change::Remove {
                            path: path.clone(),
                            kind: o.kind,
                        });
                        out.push(Change::Create {
                            path,
                            node: t,
                            content: Content::None,
                        });
                    } else if differs {
                        out.push(Change::Rewrite {
                            path,
                            mode: t.mode,
                            content: Content::Theirs,
                        });
                    } else if o.mode != t.mode {
                        out.push(Change::Chmod { path, mode: t.mode });
                    }
                }
                (None, _) => {}
            },
        }
        Ok(out)
    }

    /// What `rel` will be after the merge, if decided here.
    fn result_kind(
        &self,
        rel: &str,
        decisions: &BTreeMap<String, Decision>,
    ) -> Option<Option<NodeKind>> {
        let d = decisions.get(rel)?;
        let n = self.nodes.get(rel)?;
        Some(match d {
            Decision::Theirs => n.theirs.map(|t| t.kind),
            _ => n.ours.map(|o| o.kind),
        })
    }

    /// Paths that would end up present in a directory that is not one (removed or replaced
    /// by one side while the other changed or added something inside): conflicts.
    fn orphans(
        &mut self,
        decisions: &BTreeMap<String, Decision>,
        conflicts: &mut Vec<Conflict>,
    ) -> Result<Vec<String>, MergeError> {
        let mut found = Vec::new();
        for (rel, d) in decisions {
            if matches!(d, Decision::Conflict) {
                continue;
            }
            let Some(Some(_)) = self.result_kind(rel, decisions) else {
                continue;
            };
            let Some(parent) = parent_of(rel) else {
                continue;
            };
            let n = self
                .nodes
                .get(rel)
                .copied()
                .expect("decided paths were looked up");
            let new_here = matches!(d, Decision::Theirs) && n.ours.is_none();
            let parent_kind = match self.result_kind(parent, decisions) {
                Some(k) => k,
                // Undecided: as in ours. Only a path new to ours can lack its parent there.
                None if new_here => self.nodes(parent)?.ours.map(|o| o.kind),
                None => continue,
            };
            if parent_kind == Some(NodeKind::Dir) {
                continue;
            }
            // The side whose parent is not a directory removed (or replaced) it.
            let pn = self.nodes(parent)?;
            let removed_in = if pn.ours.is_some_and(|o| o.kind == NodeKind::Dir) {
                Side::Theirs
            } else {
                Side::Ours
            };
            let dir = self.removed_top(parent, removed_in)?;
            conflicts.push(Conflict::new(
                rel,
                ConflictKind::DirectoryRemoved { dir, removed_in },
            ));
            found.push(rel.clone());
        }
        Ok(found)
    }

    /// The topmost directory above and including `dir` that `side` removed or replaced.
    fn removed_top(&mut self, dir: &str, side: Side) -> Result<String, MergeError> {
        let mut top = dir.to_string();
        let mut at = parent_of(dir).map(str::to_string);
        while let Some(p) = at {
            let n = self.nodes(&p)?;
            let there = match side {
                Side::Ours => n.ours,
                _ => n.theirs,
            };
            if there.is_some_and(|x| x.kind == NodeKind::Dir) {
                break;
            }
            at = parent_of(&p).map(str::to_string);
            top = p;
        }
        Ok(top)
    }
}

/// Plans the merge of `input.theirs` into `input.ours`: see the module's documentation.
pub fn plan_merge(input: &MergeInput<'_>) -> Result<MergeOutcome, MergeError> {
    if input.base.node("")?.is_none_or(|n| n.kind != NodeKind::Dir) {
        return Err(MergeError::BaseMissing {
            what: "its root".to_string(),
        });
    }
    let mut planner = Planner {
        input,
        nodes: BTreeMap::new(),
        read: BTreeMap::new(),
    };
    let mut conflicts = Vec::new();
    let mut decisions = BTreeMap::new();
    for rel in planner.candidates()? {
        let d = planner.decide(&rel, &mut conflicts)?;
        decisions.insert(rel, d);
    }
    for rel in planner.orphans(&decisions, &mut conflicts)? {
        decisions.insert(rel, Decision::Conflict);
    }
    // A delete/modify under a directory the deleting side removed whole is that.
    for c in &mut conflicts {
        if let ConflictKind::DeleteModify { deleted_in } = c.kind
            && let Some(parent) = parent_of(&c.path)
        {
            let there = planner.nodes(parent)?;
            let gone = match deleted_in {
                Side::Ours => there.ours,
                _ => there.theirs,
            };
            if gone.is_none_or(|g| g.kind != NodeKind::Dir) {
                c.kind = ConflictKind::DirectoryRemoved {
                    dir: planner.removed_top(parent, deleted_in)?,
                    removed_in: deleted_in,
                };
            }
        }
    }
    let mut changes = Vec::new();
    for (rel, d) in decisions {
        changes.extend(planner.changes_for(&rel, d)?);
    }
    let (git_changes, git_refs) = git::union(&mut planner, &mut conflicts)?;
    changes.extend(git_changes);
    let mut plan = order(changes);
    plan.changes.extend(git_refs);
    for c in &mut conflicts {
        c.resolve = report::resolutions(&mut planner, c)?;
    }
    conflicts.sort_by(|a, b| a.path.cmp(&b.path));
    let refused = !conflicts.is_empty()
        && (input.mode == ConflictMode::Refuse || conflicts.iter().any(|c| !c.kind.is_text()));
    if refused {
        plan.changes.clear();
        for c in &mut conflicts {
            c.markers = false;
        }
    }
    Ok(MergeOutcome {
        plan,
        conflicts,
        refused,
    })
}

/// `changes` in plan order (see [`MergePlan`]).
fn order(changes: Vec<Change>) -> MergePlan {
    let (mut removals, rest): (Vec<Change>, Vec<Change>) = changes
        .into_iter()
        .partition(|c| matches!(c, Change::Remove { .. }));
    // Removals deepest first, so directories are empty when their turn comes.
    removals.sort_by(|a, b| b.path().cmp(a.path()));
    // Creations and rewrites shallowest first, so parents exist; a pack's index after the
    // pack (git takes a pack as present once its index is).
    let (mut indexes, mut writes): (Vec<Change>, Vec<Change>) =
        rest.into_iter().partition(|c| git::is_pack_index(c.path()));
    writes.sort_by(|a, b| a.path().cmp(b.path()));
    indexes.sort_by(|a, b| a.path().cmp(b.path()));
    removals.extend(writes);
    removals.extend(indexes);
    MergePlan { changes: removals }
}

/// Where `rel` of the branch is served under the mount point.
pub fn branch_path(mount: &Path, branch: &str, rel: &str) -> PathBuf {
    tree::joined(&mount.join(BRANCHES_DIR).join(branch), rel)
}
