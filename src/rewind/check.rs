//! A rewind's plan, checked before its first change.
//!
//! A rewind that stops half-way leaves a tree that is neither the one the user had nor the
//! one they asked for. Everything that can be known beforehand is checked here, before the
//! `:before-rewind` checkpoint and the first change, so that a refusal changes nothing:
//!
//! - every store object a step restores is present, readable and matches its name (a
//!   flipped byte in a pack, a deleted backup): [`object_problems`];
//! - every directory the plan removes holds nothing but what the plan removes too, or what
//!   the history can bring back: an excluded path or a name that is not UTF-8 (which the
//!   history cannot record) would be lost for good, so it is in the way ([`tree_problems`]);
//! - every path the plan restores has a directory for a parent once the plan is done (a
//!   parent that is a file now and not part of the rewind, e.g. outside `-- PATH`).
//!
//! What cannot be known beforehand (a full disk, an I/O error, a change made meanwhile) can
//! still stop a rewind after its first change; `rewind` then says so, and the
//! `:before-rewind` checkpoint taken before that change brings the tree back.
use std::collections::{HashMap, HashSet};
use std::io;

use super::Step;
use crate::history::ViewContent;
use crate::history::quote::{quote_bytes, quote_name};
use crate::history::xattrs::{Privilege, XattrSet, privilege_needed};
use crate::sys;
use crate::transcript::record::EntryKind;

/// Why a rewind cannot start.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Problem {
    /// The content a step restores is damaged, missing or unreadable in the store.
    Object {
        path: String,
        object: String,
        why: String,
    },
    /// Directory `dir`, which the plan removes, holds `inside` (a path relative to the
    /// root, in bytes: it may not be UTF-8), which the history does not hold.
    InTheWay {
        dir: String,
        inside: Vec<u8>,
        why: String,
    },
    /// The xattr set a step restores is damaged, missing or unreadable in the store.
    Xattrs {
        path: String,
        object: String,
        why: String,
    },
    /// A step restores `attribute` on `path`, which needs `privilege` this rewind lacks.
    Privilege {
        path: String,
        attribute: String,
        privilege: &'static str,
    },
    /// `path` is restored beneath `parent`, which is not a directory once the plan is done.
    NotADirectory {
        path: String,
        parent: String,
        is_now: String,
    },
}

/// What [`tree_problems`] needs to know of the tree as it is now.
pub(super) trait Tree {
    /// The names in directory `rel` and whether each is a directory; empty when `rel` is
    /// gone or not a directory.
    fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>>;
    /// The type of what is at `rel`, if anything.
    fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>>;
    /// Why the history does not hold `rel` (an exclusion rule), if it does not.
    fn untracked_why(&self, rel: &str, is_dir: bool) -> Option<String>;
}

/// The objects the steps restore that are damaged, missing or unreadable. `verify(name)` is
/// the store's check (true: present and matching its name). Each object is checked once,
/// however many paths restore it.
pub(super) fn object_problems(
    steps: &[Step],
    verify: impl Fn(&str) -> io::Result<bool>,
) -> Vec<Problem> {
    let mut seen = HashSet::new();
    let mut problems = Vec::new();
    for step in steps {
        let (Step::Create { path, target } | Step::Rewrite { path, target }) = step else {
            continue;
        };
        let ViewContent::Object(object) = &target.content else {
            continue;
        };
        if !seen.insert(object.as_str()) {
            continue;
        }
        let why = match verify(object) {
            Ok(true) => continue,
            Ok(false) => "damaged: its content does not match its name".to_string(),
            Err(e) if sys::os_error(&e) == Some(libc::ENOENT) => {
                "missing from the store".to_string()
            }
            Err(e) => format!("unreadable: {}", sys::error_text(&e)),
        };
        problems.push(Problem::Object {
            path: path.clone(),
            object: object.clone(),
            why,
        });
    }
    problems
}

/// The attributes of one xattr set this rewind may not restore, with the privilege each
/// needs.
type Unprivileged = Vec<(String, Privilege)>;

/// The xattr sets the steps restore that cannot be read back whole (`read(name)`: the set,
/// verified), and the attributes in them that need a privilege `may(privilege)` says this
/// rewind lacks (a file capability on a normal user's mount or an `--owner`'s). Each set is
/// read once, however many paths restore it.
pub(super) fn xattr_problems(
    steps: &[Step],
    read: impl Fn(&str) -> io::Result<XattrSet>,
    may: impl Fn(Privilege) -> bool,
) -> Vec<Problem> {
    let mut sets: HashMap<&str, Result<Unprivileged, String>> = HashMap::new();
    let mut problems = Vec::new();
    for step in steps {
        let (Step::Create { path, target }
        | Step::Rewrite { path, target }
        | Step::Metadata { path, target }) = step
        else {
            continue;
        };
        let Some(object) = target.meta.xattrs_object() else {
            continue;
        };
        let first = !sets.contains_key(object);
        let needs = sets.entry(object).or_insert_with(|| {
            read(object)
                .map(|set| {
                    set.keys()
                        .filter_map(|name| {
                            let p = privilege_needed(name)?;
                            Some((String::from_utf8_lossy(name).into_owned(), p))
                        })
                        .filter(|(_, p)| !may(*p))
                        .collect()
                })
                .map_err(|e| match sys::os_error(&e) {
                    Some(libc::ENOENT) => "missing from the store".to_string(),
                    _ if e.kind() == io::ErrorKind::InvalidData => {
                        "damaged: its content does not match its name".to_string()
                    }
                    _ => format!("unreadable: {}", sys::error_text(&e)),
                })
        });
        match needs {
            // A damaged set is named once, at the first path that needs it.
            Err(why) if first => problems.push(Problem::Xattrs {
                path: path.clone(),
                object: object.to_string(),
                why: why.clone(),
            }),
            Err(_) => {}
            Ok(needs) => problems.extend(needs.iter().map(|(attribute, p)| Problem::Privilege {
                path: path.clone(),
                attribute: attribute.clone(),
                privilege: p.name,
            })),
        }
    }
    problems
}

/// What is in the way of the steps in the tree as it is now (see the module docs). Costs a
/// listing of each directory the plan removes (what it removes anyway) and a look at each
/// ancestor of a restored path.
pub(super) fn tree_problems(steps: &[Step], tree: &impl Tree) -> io::Result<Vec<Problem>> {
    let removed: HashSet<&str> = steps
        .iter()
        .filter(|s| matches!(s, Step::Remove { .. }))
        .map(Step::path)
        .collect();
    let created: HashMap<&str, EntryKind> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Create { path, target } => Some((path.as_str(), target.meta.kind)),
            _ => None,
        })
        .collect();
    let mut problems = Vec::new();
    for step in steps {
        if let Step::Remove {
            path,
            kind: EntryKind::Dir,
        } = step
        {
            in_the_way(path, path, &removed, tree, &mut problems)?;
        }
    }
    // The type each ancestor of a restored path has once the plan is done, looked at once.
    let mut parents: HashMap<&str, Option<EntryKind>> = HashMap::new();
    for step in steps.iter().filter(|s| !matches!(s, Step::Remove { .. })) {
        let path = step.path();
        for (i, _) in path.match_indices('/') {
            let parent = &path[..i];
            if parents.contains_key(parent) {
                continue;
            }
            let after = match created.get(parent) {
                Some(kind) => Some(*kind),
                None if removed.contains(parent) => None,
                None => tree.kind(parent)?,
            };
            parents.insert(parent, after);
            if after != Some(EntryKind::Dir) {
                problems.push(Problem::NotADirectory {
                    path: path.to_string(),
                    parent: parent.to_string(),
                    is_now: match after {
                        None => "absent".to_string(),
                        Some(kind) => format!("a {}", kind_name(kind)),
                    },
                });
            }
        }
    }
    Ok(problems)
}

/// Adds what `dir` (beneath `top`, the directory the plan removes) holds that the plan does
/// not remove and the history does not hold; descends into what the history holds (its
/// removal is recorded, so `:before-rewind` brings it back, but it may hold what is not).
fn in_the_way(
    top: &str,
    dir: &str,
    removed: &HashSet<&str>,
    tree: &impl Tree,
    problems: &mut Vec<Problem>,
) -> io::Result<()> {
    for (name, is_dir) in tree.list(dir)? {
        let inside = join(dir, &name);
        let Ok(child) = std::str::from_utf8(&inside) else {
            problems.push(Problem::InTheWay {
                dir: top.to_string(),
                inside,
                why: "its name is not UTF-8, which the history cannot record".to_string(),
            });
            continue;
        };
        if removed.contains(child) {
            // A step of its own removes it (and checks a directory's content itself).
            continue;
        }
        if let Some(why) = tree.untracked_why(child, is_dir) {
            problems.push(Problem::InTheWay {
                dir: top.to_string(),
                inside,
                why,
            });
            continue;
        }
        if is_dir {
            in_the_way(top, child, removed, tree, problems)?;
        }
    }
    Ok(())
}

/// `name` in directory `dir` ("" for the root), as a path relative to the root.
fn join(dir: &str, name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir.as_bytes());
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Dir => "directory",
        EntryKind::Symlink => "symlink",
        EntryKind::Fifo => "fifo",
        EntryKind::Socket => "socket",
        EntryKind::CharDevice => "character device",
        EntryKind::BlockDevice => "block device",
    }
}

/// How many problems a refusal lists before it says how many more there are.
const SHOWN: usize = 20;

/// The refusal of a rewind to `id` for `problems` (not empty): each path or object and why,
/// that nothing was changed, and what to do.
pub(super) fn refusal(id: &str, problems: &[Problem]) -> io::Error {
    let mut lines = Vec::new();
    let (mut objects, mut in_the_way, mut parents, mut privileges) = (false, false, false, false);
    for p in problems.iter().take(SHOWN) {
        lines.push(match p {
            Problem::Object { path, object, why } => {
                objects = true;
                format!(
                    "{}: its content at '{id}' (store object {object}) is {why}",
                    quote_name(path)
                )
            }
            Problem::Xattrs { path, object, why } => {
                objects = true;
                format!(
                    "{}: its xattrs at '{id}' (store object {object}) are {why}",
                    quote_name(path)
                )
            }
            Problem::Privilege {
                path,
                attribute,
                privilege,
            } => {
                privileges = true;
                format!(
                    "{}: its xattr {} cannot be restored: that needs {privilege}, which this \
                     rewind does not have",
                    quote_name(path),
                    quote_name(attribute)
                )
            }
            Problem::InTheWay { dir, inside, why } => {
                in_the_way = true;
                format!(
                    "{}: must be removed, but holds {} ({why}); the history does not hold \
                     it, so its removal could not be undone",
                    quote_name(dir),
                    quote_bytes(inside)
                )
            }
            Problem::NotADirectory {
                path,
                parent,
                is_now,
            } => {
                parents = true;
                format!(
                    "{}: cannot be restored, since {} will be {is_now}, not a directory, and \
                     this rewind does not change it",
                    quote_name(path),
                    quote_name(parent)
                )
            }
        });
    }
    if problems.len() > SHOWN {
        lines.push(format!("... and {} more", problems.len() - SHOWN));
    }
    let mut todo = Vec::new();
    if objects {
        todo.push(
            "A damaged or missing backup cannot be restored: rewind the other paths (name \
             them after `--`), or to another checkpoint.",
        );
    }
    if in_the_way {
        todo.push("Move what is in the way out of the tree (or delete it), then rewind again.");
    }
    if parents {
        todo.push("Rewind the parent too (name it after `--`), or move it away.");
    }
    if privileges {
        todo.push(
            "A file capability (security.capability) or a trusted.* xattr is restored only by \
             a daemon that has the privilege (root's own mount, not a normal user's or an \
             --owner's): rewind the other paths (name them after `--`), or have root restore \
             these.",
        );
    }
    io::Error::other(format!(
        "cannot rewind to '{id}':\n  {}\nNothing was changed and no checkpoint was taken. {}",
        lines.join("\n  "),
        todo.join(" ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ViewEntry;
    use crate::transcript::record::EntryMeta;
    use std::collections::BTreeMap;

    /// A tree in memory: path → (kind, excluded).
    struct FakeTree(BTreeMap<Vec<u8>, (EntryKind, bool)>);

    impl FakeTree {
        fn new(entries: &[(&[u8], EntryKind, bool)]) -> FakeTree {
            FakeTree(
                entries
                    .iter()
                    .map(|(p, k, x)| (p.to_vec(), (*k, *x)))
                    .collect(),
            )
        }
    }

    impl Tree for FakeTree {
        fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>> {
            let mut prefix = rel.as_bytes().to_vec();
            prefix.push(b'/');
            Ok(self
                .0
                .iter()
                .filter_map(|(p, (k, _))| {
                    let name = p.strip_prefix(prefix.as_slice())?;
                    (!name.is_empty() && !name.contains(&b'/'))
                        .then(|| (name.to_vec(), *k == EntryKind::Dir))
                })
                .collect())
        }
        fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>> {
            Ok(self.0.get(rel.as_bytes()).map(|(k, _)| *k))
        }
        fn untracked_why(&self, rel: &str, _: bool) -> Option<String> {
            self.0
                .get(rel.as_bytes())
                .is_some_and(|(_, x)| *x)
                .then(|| "excluded".to_string())
        }
    }

    fn entry(kind: EntryKind, object: Option<&str>) -> ViewEntry {
        ViewEntry {
            meta: EntryMeta {
                kind,
                mode: 0o644,
                uid: 0,
                gid: 0,
                size: 0,
                mtime_sec: 0,
                mtime_nsec: 0,
                rdev: None,
                xattrs: None,
                link: None,
            },
            content: object.map_or(ViewContent::None, |o| ViewContent::Object(o.to_string())),
        }
    }

    fn remove(path: &str, kind: EntryKind) -> Step {
        Step::Remove {
            path: path.to_string(),
            kind,
        }
    }

    fn create(path: &str, kind: EntryKind, object: Option<&str>) -> Step {
        Step::Create {
            path: path.to_string(),
            target: entry(kind, object),
        }
    }

    use EntryKind::{Dir, File};

    #[test]
    fn xattr_sets_are_read_once_and_privileged_names_refused_without_the_privilege() {
        let with_set = |path: &str, set: &str| {
            let mut step = create(path, File, Some("c"));
            if let Step::Create { target, .. } = &mut step {
                target.meta.xattrs = Some(set.to_string());
            }
            step
        };
        let steps = [
            with_set("tool", "caps"),
            with_set("tool2", "caps"),
            with_set("plain", "user"),
            with_set("none", ""),
            with_set("broken", "bad"),
            with_set("broken2", "bad"),
        ];
        let reads = std::cell::RefCell::new(Vec::new());
        let read = |name: &str| {
            reads.borrow_mut().push(name.to_string());
            let pairs: &[(&[u8], &[u8])] = match name {
                "caps" => &[(b"security.capability", b"x"), (b"trusted.a", b"y")],
                "user" => &[(b"user.a", b"1")],
                _ => return Err(io::Error::from(io::ErrorKind::InvalidData)),
            };
            Ok(pairs
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect())
        };
        // A daemon with CAP_SYS_ADMIN but not CAP_SETFCAP.
        let problems = xattr_problems(&steps, read, |p| p.name == "CAP_SYS_ADMIN");
        let mut sorted = reads.borrow().clone();
        sorted.sort();
        assert_eq!(
            sorted,
            ["bad", "caps", "user"],
            "each set read once, none for \"\""
        );
        let privilege = |path: &str| Problem::Privilege {
            path: path.to_string(),
            attribute: "security.capability".to_string(),
            privilege: "CAP_SETFCAP",
        };
        assert_eq!(
            problems,
            [
                privilege("tool"),
                privilege("tool2"),
                Problem::Xattrs {
                    path: "broken".to_string(),
                    object: "bad".to_string(),
                    why: "damaged: its content does not match its name".to_string(),
                },
            ]
        );
        let refusal = refusal("c1", &problems).to_string();
        assert!(
            refusal.contains("tool: its xattr security.capability cannot be restored")
                && refusal.contains("broken: its xattrs at 'c1' (store object bad) are damaged")
                && refusal.contains("Nothing was changed"),
            "{refusal}"
        );
    }

    #[test]
    fn a_directory_to_remove_may_hold_only_what_the_plan_or_the_history_holds() {
        let tree = FakeTree::new(&[
            (b"new", Dir, false),
            (b"new/a", File, false),
            (b"new/sub", Dir, false),
            (b"new/sub/kept.log", File, true),
            (b"new/\xff\xfe", File, false),
            (b"new/tracked", File, false),
            (b"other", Dir, false),
            (b"other/x.log", File, true),
        ]);
        let steps = [remove("new", Dir), remove("new/a", File)];
        let problems = tree_problems(&steps, &tree).unwrap();
        let inside: Vec<&[u8]> = problems
            .iter()
            .map(|p| match p {
                Problem::InTheWay { dir, inside, .. } => {
                    assert_eq!(dir, "new");
                    inside.as_slice()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        // new/tracked and new/sub are the history's (their removal is recorded); what is
        // excluded beneath them, and a name it cannot record, are not.
        assert_eq!(inside, [&b"new/sub/kept.log"[..], b"new/\xff\xfe"]);
        // Nothing in the way: the plan removes everything, or only files.
        let tree = FakeTree::new(&[(b"d", Dir, false), (b"d/x", File, false)]);
        let steps = [remove("d", Dir), remove("d/x", File)];
        assert_eq!(tree_problems(&steps, &tree).unwrap(), []);
    }

    #[test]
    fn a_restored_path_needs_a_directory_for_a_parent() {
        // `a` is a file now and outside the selection; `b` becomes a directory by the plan;
        // `c` is removed and not created again.
        let tree = FakeTree::new(&[(b"a", File, false), (b"b", File, false), (b"c", Dir, false)]);
        let steps = [
            create("a/x", File, Some("1")),
            create("a/y", File, Some("1")),
            remove("b", File),
            create("b", Dir, None),
            create("b/x", File, Some("1")),
            remove("c", Dir),
            create("c/x/y", File, Some("1")),
        ];
        let problems = tree_problems(&steps, &tree).unwrap();
        assert_eq!(
            problems,
            [
                Problem::NotADirectory {
                    path: "a/x".into(),
                    parent: "a".into(),
                    is_now: "a file".into()
                },
                Problem::NotADirectory {
                    path: "c/x/y".into(),
                    parent: "c".into(),
                    is_now: "absent".into()
                },
                Problem::NotADirectory {
                    path: "c/x/y".into(),
                    parent: "c/x".into(),
                    is_now: "absent".into()
                },
            ]
        );
    }

    #[test]
    fn each_object_is_verified_once_and_named_with_a_path() {
        let steps = [
            create("a", File, Some("good")),
            create("b", File, Some("bad")),
            create("c", File, Some("bad")),
            create("d", File, Some("gone")),
            create("e", File, Some("eio")),
            create("f", Dir, None),
        ];
        let calls = std::cell::RefCell::new(Vec::new());
        let problems = object_problems(&steps, |name| {
            calls.borrow_mut().push(name.to_string());
            match name {
                "good" => Ok(true),
                "bad" => Ok(false),
                "gone" => Err(sys::errno(libc::ENOENT)),
                _ => Err(sys::errno(libc::EIO)),
            }
        });
        assert_eq!(*calls.borrow(), ["good", "bad", "gone", "eio"]);
        let named: Vec<(&str, &str)> = problems
            .iter()
            .map(|p| match p {
                Problem::Object { path, object, .. } => (path.as_str(), object.as_str()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(named, [("b", "bad"), ("d", "gone"), ("e", "eio")]);
        let text = refusal("m1", &problems).to_string();
        assert!(
            text.contains("b: its content at 'm1' (store object bad) is damaged"),
            "{text}"
        );
        assert!(text.contains("missing from the store"), "{text}");
        assert!(text.contains("Nothing was changed"), "{text}");
    }
}
