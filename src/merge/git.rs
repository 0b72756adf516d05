//! A repository's `.git/` is not merged path by path: any git command rewrites `.git/index`
//! on both sides, so every merge would conflict. Instead:
//!
//! - objects merge as a union: each loose object and pack file the branch added
//!   (`objects/`, from theirs' changed paths) that the main repository lacks is copied;
//!   one it has is never overwritten (an object's name is its content's hash);
//! - the branch's `HEAD` commit (through symbolic refs and `packed-refs`) becomes
//!   `refs/heads/NAME` in the main repository: refused (a conflict) if that ref, or a ref in
//!   its way, exists there and names something else;
//! - everything else in ours' git dir (its index, `HEAD`, checked-out refs, config) stays
//!   as it is, and theirs' other changes there are not taken.
use super::{Change, Conflict, ConflictKind, Content, MergeError, Planner, Side, git_dir_of};
use super::{NodeKind, child, parent_of};

/// How many symbolic refs `HEAD` may pass through (git allows 5).
const MAX_SYMREF_DEPTH: usize = 5;

/// Whether `rel` is a pack's index, which must come after the pack.
pub(super) fn is_pack_index(rel: &str) -> bool {
    git_dir_of(rel)
        .is_some_and(|(_, inside)| inside.starts_with("objects/pack/") && inside.ends_with(".idx"))
}

/// Whether `name` is a valid branch name (`git check-ref-format --branch`, the rules that
/// matter for a file under `refs/heads/`).
pub(super) fn valid_branch_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('-')
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && name != "@"
        && !name
            .chars()
            .any(|c| c.is_ascii_control() || " ~^:?*[\\".contains(c))
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.ends_with(".lock"))
}

/// Whether an object-store path is a finished object or pack file (not a temporary one a
/// git command was writing when the view was taken, nor `objects/info/`).
fn is_object_file(inside: &str) -> bool {
    let Some(rest) = inside.strip_prefix("objects/") else {
        return false;
    };
    let name = rest.rsplit('/').next().unwrap_or(rest);
    if name.starts_with("tmp") || name.starts_with(".tmp") || name.ends_with(".lock") {
        return false;
    }
    match rest.split_once('/') {
        Some(("pack", file)) => file.starts_with("pack-") && !file.contains('/'),
        Some((fan, file)) => {
            fan.len() == 2
                && fan.bytes().all(|b| b.is_ascii_hexdigit())
                && file.bytes().all(|b| b.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// Whether `s` is an object name (sha1 or sha256, lower-case hex).
fn is_object_name(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What a ref holds: an object, or another ref.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefValue {
    Object(String),
    Symbolic(String),
}

impl Planner<'_> {
    /// Ref `name` (e.g. `HEAD`, `refs/heads/main`) in `git_dir` of `side`, unresolved: its
    /// loose file, else its `packed-refs` line. `None`: no such ref.
    fn read_ref(
        &mut self,
        side: Side,
        git_dir: &str,
        name: &str,
    ) -> Result<Option<RefValue>, MergeError> {
        let loose = child(git_dir, name);
        let tree = self.tree(side);
        match tree.node(&loose)? {
            Some(n) if n.kind == NodeKind::File => {
                let text = String::from_utf8_lossy(&tree.read(&loose)?)
                    .trim()
                    .to_string();
                return Ok(Some(match text.strip_prefix("ref:") {
                    Some(target) => RefValue::Symbolic(target.trim().to_string()),
                    None => RefValue::Object(text),
                }));
            }
            // A directory (refs/heads/NAME/…) or other entry: not a ref itself.
            Some(_) => return Ok(None),
            None => {}
        }
        let packed = child(git_dir, "packed-refs");
        if tree.node(&packed)?.is_none_or(|n| n.kind != NodeKind::File) {
            return Ok(None);
        }
        let data = tree.read(&packed)?;
        Ok(String::from_utf8_lossy(&data)
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with('^'))
            .filter_map(|l| l.split_once(' '))
            .find(|(_, r)| *r == name)
            .map(|(object, _)| RefValue::Object(object.to_string())))
    }

    /// The object `HEAD` of `side`'s `git_dir` names, through symbolic refs; `None` when
    /// it names none (an unborn branch, no repository).
    fn head_commit(&mut self, side: Side, git_dir: &str) -> Result<Option<String>, MergeError> {
        let mut name = "HEAD".to_string();
        for _ in 0..=MAX_SYMREF_DEPTH {
            match self.read_ref(side, git_dir, &name)? {
                Some(RefValue::Object(o)) if is_object_name(&o) => return Ok(Some(o)),
                Some(RefValue::Symbolic(target)) => name = target,
                _ => return Ok(None),
            }
        }
        Ok(None)
    }

    /// What in ours' `git_dir` stands in the way of a new `refs/heads/<branch>` holding
    /// `commit`: `Ok(None)` when nothing (it is absent, or already holds `commit`), else a
    /// description of what is there.
    fn ref_in_the_way(
        &mut self,
        git_dir: &str,
        ref_name: &str,
        commit: &str,
    ) -> Result<Option<String>, MergeError> {
        match self.read_ref(Side::Ours, git_dir, ref_name)? {
            Some(RefValue::Object(o)) if o == commit => return Ok(None),
            Some(RefValue::Object(o)) => return Ok(Some(format!("{ref_name} at {o}"))),
            Some(RefValue::Symbolic(t)) => return Ok(Some(format!("{ref_name} -> {t}"))),
            None => {}
        }
        let loose = child(git_dir, ref_name);
        if let Some(n) = self.input.ours.node(&loose)? {
            return Ok(Some(format!("a {} at {ref_name}", n.kind.name())));
        }
        // A ref whose name is a prefix directory of this one (refs/heads/a for a/b).
        let mut at = parent_of(ref_name);
        while let Some(p) = at.filter(|p| *p != "refs/heads") {
            if let Some(RefValue::Object(o)) = self.read_ref(Side::Ours, git_dir, p)? {
                return Ok(Some(format!("{p} at {o}")));
            }
            at = parent_of(p);
        }
        Ok(None)
    }
}

/// The union of every repository theirs changed in: the object copies (to order with the
/// other creations) and the new refs (last in the plan). Conflicts go to `conflicts`.
pub(super) fn union(
    planner: &mut Planner<'_>,
    conflicts: &mut Vec<Conflict>,
) -> Result<(Vec<Change>, Vec<Change>), MergeError> {
    let mut repos: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for rel in planner.input.changed_theirs {
        if let Some((dir, inside)) = git_dir_of(rel)
            && planner.is_merged_as_repository(rel)?
        {
            repos
                .entry(dir.to_string())
                .or_default()
                .push(inside.to_string());
        }
    }
    let mut changes = Vec::new();
    let mut refs = Vec::new();
    for (dir, inside) in repos {
        let ours_dir = planner.input.ours.node(&dir)?;
        if ours_dir.is_none_or(|n| n.kind != NodeKind::Dir) {
            conflicts.push(Conflict::new(&dir, ConflictKind::GitRepository));
            continue;
        }
        // The object files theirs added, a directory added whole listed through.
        let mut queue: Vec<String> = inside.iter().map(|i| child(&dir, i)).collect();
        let mut objects = std::collections::BTreeSet::new();
        while let Some(rel) = queue.pop() {
            let Some((_, i)) = git_dir_of(&rel) else {
                continue;
            };
            if !(i == "objects" || i.starts_with("objects/")) {
                continue;
            }
            match planner.input.theirs.node(&rel)? {
                // The object directories themselves (objects/, pack/, a fan-out xx/).
                Some(n)
                    if n.kind == NodeKind::Dir
                        && (i == "objects"
                            || i == "objects/pack"
                            || i.len() == "objects/xx".len()) =>
                {
                    for name in planner.input.theirs.list(&rel)? {
                        queue.push(child(&rel, &name));
                    }
                }
                Some(n) if n.kind == NodeKind::File && is_object_file(i) => {
                    objects.insert((rel, n));
                }
                _ => {}
            }
        }
        let mut dirs_made = std::collections::BTreeSet::new();
        for (rel, node) in objects {
            // Never overwrite: an object ours has is the same object.
            if planner.input.ours.node(&rel)?.is_some() {
                continue;
            }
            let parent = parent_of(&rel).unwrap_or("");
            if !dirs_made.contains(parent) && planner.input.ours.node(parent)?.is_none() {
                let node = planner
                    .input
                    .theirs
                    .node(parent)?
                    .expect("the parent of a file theirs has");
                changes.push(Change::Create {
                    path: parent.to_string(),
                    node,
                    content: Content::None,
                });
                dirs_made.insert(parent.to_string());
            }
            changes.push(Change::Create {
                path: rel,
                node,
                content: Content::Theirs,
            });
        }
        // The branch's commit as refs/heads/NAME, if it committed since the fork.
        let Some(commit) = planner.head_commit(Side::Theirs, &dir)? else {
            continue;
        };
        if planner.head_commit(Side::Base, &dir)?.as_deref() == Some(commit.as_str()) {
            continue;
        }
        let branch = planner.input.branch;
        if !valid_branch_name(branch) {
            return Err(MergeError::BadRefName {
                name: branch.to_string(),
            });
        }
        let ref_name = format!("refs/heads/{branch}");
        if let Some(existing) = planner.ref_in_the_way(&dir, &ref_name, &commit)? {
            conflicts.push(Conflict::new(
                &child(&dir, &ref_name),
                ConflictKind::GitRef {
                    repository: dir.clone(),
                    commit,
                    existing,
                },
            ));
            continue;
        }
        let path = child(&dir, &ref_name);
        if planner.input.ours.node(&path)?.is_some() {
            continue; // holds `commit` already
        }
        // Directories of a branch name with slashes (refs/heads/agent/a).
        let mut missing = Vec::new();
        let mut at = parent_of(&path);
        while let Some(p) = at {
            if planner.input.ours.node(p)?.is_some() {
                break;
            }
            missing.push(p.to_string());
            at = parent_of(p);
        }
        let dir_node = planner
            .input
            .ours
            .node(&child(&dir, "refs"))?
            .filter(|n| n.kind == NodeKind::Dir);
        for p in missing.into_iter().rev() {
            let node = dir_node.unwrap_or(super::Node::new(libc::S_IFDIR, 0o755, 0, 0));
            refs.push(Change::Create {
                path: p,
                node,
                content: Content::None,
            });
        }
        let bytes = format!("{commit}\n").into_bytes();
        refs.push(Change::Create {
            path,
            node: super::Node::new(libc::S_IFREG, 0o644, bytes.len() as u64, 0),
            content: Content::Bytes(bytes),
        });
    }
    Ok((changes, refs))
}
