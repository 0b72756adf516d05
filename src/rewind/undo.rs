//! The renames a whole-tree rewind undoes first (format 4), worked out before anything
//! changes, and the tree as it will be once they are undone, read from SRC as it is now.
//!
//! A rewind is checked first, then done (issue 28): its per-path plan must be made and
//! checked against the tree the undos leave, before the first undo. Undoing a rename only
//! moves names, so that tree is SRC seen through a map: a name after the undos holds what
//! some name holds now ([`Now::At`]), nothing ([`Now::Gone`]), or a directory the undos make
//! (the parents of an undone rename's `from` that existed at the checkpoint; [`Now::Made`]).
//! The same decisions are taken again when the undos are done; the rewind then plans and
//! checks once more against the real tree, in case a writer changed it in between.

use std::io;

use crate::history::renames::{Rename, below};
use crate::history::split_parent;
use crate::transcript::record::EntryKind;

/// What the undos read of SRC as it is now, and of the checkpoint rewound to.
pub(super) trait LiveTree {
    /// `(st_dev, st_ino)` of what is at `rel` now, if anything.
    fn object(&self, rel: &str) -> io::Result<Option<(u64, u64)>>;
    /// The kind of what is at `rel` now, if anything.
    fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>>;
    /// The names in directory `rel` now, each with whether it is a directory.
    fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>>;
    /// The kind of what `rel` held at the checkpoint rewound to, if anything.
    fn at_checkpoint(&self, rel: &str) -> io::Result<Option<EntryKind>>;
}

/// One rename to undo: `to` goes back to `from`, exchanged with what is at `from` when
/// `exchange` (an exchange, or a plain rename whose `from` was made again since).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Undo {
    pub from: String,
    pub to: String,
    pub exchange: bool,
    /// Directories above `from` made first, shallowest first: missing now, directories at
    /// the checkpoint.
    pub made: Vec<String>,
}

/// Where a name after some of the undos has its content now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Now {
    /// What this name of SRC holds now.
    At(String),
    /// A directory the undos make (as it was at the checkpoint).
    Made,
    /// Nothing.
    Gone,
}

/// The undos, in the order they are done (the renames newest first).
#[derive(Debug, Default)]
pub(super) struct Undos {
    pub steps: Vec<Undo>,
}

/// `p` with the prefix `dir` replaced by `to` when `p` is `dir` or below it.
fn moved(p: &str, dir: &str, to: &str) -> Option<String> {
    if p == dir {
        Some(to.to_string())
    } else {
        below(dir, p).map(|rest| format!("{to}/{rest}"))
    }
}

impl Undos {
    /// Decides which of `renames` (oldest first) are undone: one whose `to` still holds
    /// what it moved (and for an exchange, whose `from` still holds what came back), in the
    /// tree the newer undos leave, and whose `from` has a parent then. The others were
    /// undone, moved or removed since: the per-path pass restores their content.
    ///
    /// Nor is a rename undone that brings nothing back: both endpoints absent at the
    /// checkpoint, and no older rename with an endpoint at, above or below them (`ln -sfn`
    /// renames a new temporary name over the link: undone, the new link would move to the
    /// temporary name only to be removed there). An older rename that went through the
    /// name (`mv a tmp; mv tmp b`) needs it undone first.
    pub fn plan(renames: &[Rename], live: &impl LiveTree) -> io::Result<Undos> {
        let mut undos = Undos::default();
        for (i, r) in renames.iter().enumerate().rev() {
            let related = |p: &str| {
                renames[..i].iter().any(|o| {
                    [&o.from, &o.to]
                        .iter()
                        .any(|e| *e == p || below(e, p).is_some() || below(p, e).is_some())
                })
            };
            let brings_back = live.at_checkpoint(&r.from)?.is_some()
                || (r.exchange && live.at_checkpoint(&r.to)?.is_some())
                || related(&r.from)
                || related(&r.to);
            if !brings_back {
                continue;
            }
            let holds = |rel: &str, object: Option<(u64, u64)>| -> io::Result<bool> {
                Ok(match (object, undos.now(rel)) {
                    (Some(object), Now::At(q)) => live.object(&q)? == Some(object),
                    _ => false,
                })
            };
            if !holds(&r.to, r.from_object)? || (r.exchange && !holds(&r.from, r.to_object)?) {
                continue;
            }
            let exchange = r.exchange || undos.kind(&r.from, live)?.is_some();
            let mut made = Vec::new();
            let mut end = 0;
            while let Some(i) = r.from[end..].find('/') {
                end += i;
                let dir = &r.from[..end];
                end += 1;
                if undos.kind(dir, live)?.is_some() {
                    continue;
                }
                if live.at_checkpoint(dir)? != Some(EntryKind::Dir) {
                    break;
                }
                made.push(dir.to_string());
            }
            let parent = split_parent(&r.from).0;
            let has_parent = parent.is_empty()
                || made.iter().any(|m| m == parent)
                || undos.kind(parent, live)? == Some(EntryKind::Dir);
            if !has_parent {
                continue; // The undo would fail with ENOENT: left to the per-path pass.
            }
            undos.steps.push(Undo {
                from: r.from.clone(),
                to: r.to.clone(),
                exchange,
                made,
            });
        }
        Ok(undos)
    }

    /// Where name `p` has its content now, once every undo is done.
    pub fn now(&self, p: &str) -> Now {
        self.now_after(p, self.steps.len())
    }

    /// Where name `p` has its content now, once the first `n` undos are done.
    fn now_after(&self, p: &str, n: usize) -> Now {
        let mut p = p.to_string();
        for u in self.steps[..n].iter().rev() {
            if u.made.contains(&p) {
                return Now::Made;
            }
            if let Some(q) = moved(&p, &u.from, &u.to) {
                p = q;
            } else if let Some(q) = moved(&p, &u.to, &u.from) {
                if !u.exchange {
                    return Now::Gone;
                }
                p = q;
            }
        }
        Now::At(p)
    }

    /// The kind of what name `p` holds once every undo is done.
    pub fn kind(&self, p: &str, live: &impl LiveTree) -> io::Result<Option<EntryKind>> {
        self.kind_after(p, self.steps.len(), live)
    }

    fn kind_after(&self, p: &str, n: usize, live: &impl LiveTree) -> io::Result<Option<EntryKind>> {
        match self.now_after(p, n) {
            Now::At(q) => live.kind(&q),
            Now::Made => Ok(Some(EntryKind::Dir)),
            Now::Gone => Ok(None),
        }
    }

    /// The names in directory `dir` once every undo is done, each with whether it is a
    /// directory, in no particular order.
    pub fn list(&self, dir: &str, live: &impl LiveTree) -> io::Result<Vec<(Vec<u8>, bool)>> {
        self.list_after(dir, self.steps.len(), live)
    }

    fn list_after(
        &self,
        dir: &str,
        n: usize,
        live: &impl LiveTree,
    ) -> io::Result<Vec<(Vec<u8>, bool)>> {
        let Some(u) = n.checked_sub(1).map(|i| &self.steps[i]) else {
            return live.list(dir);
        };
        // Before undo `n`: the directory's own name then, and its names.
        let mut names = if u.made.iter().any(|m| m == dir) {
            Vec::new()
        } else if let Some(q) = moved(dir, &u.from, &u.to) {
            self.list_after(&q, n - 1, live)?
        } else if let Some(q) = moved(dir, &u.to, &u.from) {
            if u.exchange {
                self.list_after(&q, n - 1, live)?
            } else {
                Vec::new()
            }
        } else {
            self.list_after(dir, n - 1, live)?
        };
        // What the undo changed in this directory itself.
        let mut set = |name: &str, is_dir: Option<bool>| {
            names.retain(|(n, _)| n != name.as_bytes());
            if let Some(is_dir) = is_dir {
                names.push((name.as_bytes().to_vec(), is_dir));
            }
        };
        let is_dir = |p: &str| -> io::Result<bool> {
            Ok(self.kind_after(p, n - 1, live)? == Some(EntryKind::Dir))
        };
        for m in &u.made {
            let (parent, name) = split_parent(m);
            if parent == dir {
                set(name, Some(true));
            }
        }
        let (to_parent, to_name) = split_parent(&u.to);
        if to_parent == dir {
            let now = if u.exchange {
                Some(is_dir(&u.from)?)
            } else {
                None
            };
            set(to_name, now);
        }
        let (from_parent, from_name) = split_parent(&u.from);
        if from_parent == dir {
            let now = is_dir(&u.to)?;
            set(from_name, Some(now));
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A tree of names with an inode each (directories end with `/` in the builder).
    struct FakeTree {
        entries: BTreeMap<String, (u64, bool)>,
        /// What the tree held at the checkpoint rewound to.
        at_checkpoint: BTreeMap<String, EntryKind>,
    }

    impl FakeTree {
        fn new(names: &[&str]) -> FakeTree {
            let entries = names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let dir = n.ends_with('/');
                    (n.trim_end_matches('/').to_string(), (i as u64 + 1, dir))
                })
                .collect();
            FakeTree {
                entries,
                at_checkpoint: BTreeMap::new(),
            }
        }

        /// This tree, now, after `at_k` at the checkpoint.
        fn since(mut self, at_k: &FakeTree) -> FakeTree {
            self.at_checkpoint = at_k
                .entries
                .keys()
                .map(|p| (p.clone(), at_k.kind(p).unwrap().unwrap()))
                .collect();
            self
        }

        fn ino(&self, rel: &str) -> u64 {
            self.entries[rel].0
        }

        /// The tree after renaming `from` to `to` (a plain rename, nothing at `to`).
        fn renamed(&self, from: &str, to: &str) -> FakeTree {
            let entries = self
                .entries
                .iter()
                .map(|(p, v)| (moved(p, from, to).unwrap_or_else(|| p.clone()), *v))
                .collect();
            FakeTree {
                entries,
                at_checkpoint: self.at_checkpoint.clone(),
            }
        }
    }

    impl LiveTree for FakeTree {
        fn object(&self, rel: &str) -> io::Result<Option<(u64, u64)>> {
            Ok(self.entries.get(rel).map(|&(ino, _)| (1, ino)))
        }
        fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>> {
            Ok(self.entries.get(rel).map(|&(_, dir)| match dir {
                true => EntryKind::Dir,
                false => EntryKind::File,
            }))
        }
        fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>> {
            Ok(self
                .entries
                .iter()
                .filter(|(p, _)| split_parent(p).0 == rel && !p.is_empty())
                .map(|(p, &(_, dir))| (split_parent(p).1.as_bytes().to_vec(), dir))
                .collect())
        }
        fn at_checkpoint(&self, rel: &str) -> io::Result<Option<EntryKind>> {
            Ok(self.at_checkpoint.get(rel).copied())
        }
    }

    fn rename(seq: u64, from: &str, to: &str, from_ino: u64, exchange: bool) -> Rename {
        Rename {
            seq,
            from: from.to_string(),
            to: to.to_string(),
            exchange,
            from_object: Some((1, from_ino)),
            to_object: None,
        }
    }

    /// The undos as `(from, to)`, in order.
    fn undone(undos: &Undos) -> Vec<(&str, &str)> {
        undos.steps.iter().map(|u| (&*u.from, &*u.to)).collect()
    }

    fn listed(undos: &Undos, dir: &str, live: &FakeTree) -> Vec<String> {
        let mut names: Vec<String> = undos
            .list(dir, live)
            .unwrap()
            .into_iter()
            .map(|(n, d)| format!("{}{}", String::from_utf8(n).unwrap(), ["", "/"][d as usize]))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn nested_renames_are_undone_newest_first_and_the_tree_after_them_is_read_through_them() {
        // At the checkpoint: a/ with a/x and a/s/y. Then `mv a b`, `mv b/s t`.
        let at_k = FakeTree::new(&["a/", "a/x", "a/s/", "a/s/y", "keep"]);
        let a = at_k.ino("a");
        let s = at_k.ino("a/s");
        let now = at_k.renamed("a", "b").renamed("b/s", "t").since(&at_k);
        let renames = [
            rename(1, "a", "b", a, false),
            rename(2, "b/s", "t", s, false),
        ];
        let undos = Undos::plan(&renames, &now).unwrap();
        assert_eq!(undone(&undos), [("b/s", "t"), ("a", "b")]);
        assert_eq!(undos.now("a/s/y"), Now::At("t/y".to_string()));
        assert_eq!(undos.now("a/x"), Now::At("b/x".to_string()));
        assert_eq!(undos.now("b"), Now::Gone);
        assert_eq!(undos.now("t"), Now::Gone);
        assert_eq!(undos.now("keep"), Now::At("keep".to_string()));
        assert_eq!(listed(&undos, "", &now), ["a/", "keep"]);
        assert_eq!(listed(&undos, "a", &now), ["s/", "x"]);
        assert_eq!(listed(&undos, "a/s", &now), ["y"]);
        assert_eq!(undos.kind("a/s", &now).unwrap(), Some(EntryKind::Dir));
        assert_eq!(undos.kind("b/s", &now).unwrap(), None);
    }

    #[test]
    fn a_rename_whose_content_moved_on_is_not_undone() {
        let at_k = FakeTree::new(&["a/", "a/x"]);
        let a = at_k.ino("a");
        // `mv a b`, then b removed and made again: `b` no longer holds what moved.
        let mut now = FakeTree::new(&["b/"]).since(&at_k);
        now.entries.insert("b".to_string(), (99, true));
        let undos = Undos::plan(&[rename(1, "a", "b", a, false)], &now).unwrap();
        assert!(undos.steps.is_empty());
        assert_eq!(undos.now("b"), Now::At("b".to_string()));
    }

    #[test]
    fn a_rename_that_brings_nothing_back_is_not_undone_unless_an_older_one_needs_it() {
        // `ln -sfn t link`: a new symlink `tmp` renamed over `link`. Undone, it would move the
        // new link to `tmp` only for the per-path pass to remove it there.
        let at_k = FakeTree::new(&["link", "a/", "a/x"]);
        let now = FakeTree::new(&["link", "a/", "a/x"]).since(&at_k);
        let over = rename(1, "tmp", "link", now.ino("link"), false);
        assert!(Undos::plan(&[over], &now).unwrap().steps.is_empty());
        // `mv a tmp; mv tmp b`: `tmp` is new, but the older rename needs it back.
        let now = at_k.renamed("a", "b").since(&at_k);
        let chain = [
            rename(1, "a", "tmp", at_k.ino("a"), false),
            rename(2, "tmp", "b", at_k.ino("a"), false),
        ];
        let undos = Undos::plan(&chain, &now).unwrap();
        assert_eq!(undone(&undos), [("tmp", "b"), ("a", "tmp")]);
        assert_eq!(undos.now("a/x"), Now::At("b/x".to_string()));
        assert_eq!(listed(&undos, "", &now), ["a/", "link"]);
    }

    #[test]
    fn a_name_made_again_is_exchanged_and_missing_parents_are_made() {
        // At the checkpoint p/ held p/a/; `mv p/a q`, then p removed: its undo makes p
        // first. And `mv c d; mkdir c`: undone by an exchange.
        let at_k = FakeTree::new(&["p/", "p/a/", "p/a/f", "c/", "c/g"]);
        let (pa, c) = (at_k.ino("p/a"), at_k.ino("c"));
        let mut now = FakeTree::new(&["q/", "q/f", "d/", "d/g", "c/", "c/new"]).since(&at_k);
        now.entries.insert("q".to_string(), (pa, true));
        now.entries.insert("d".to_string(), (c, true));
        let renames = [
            rename(1, "p/a", "q", pa, false),
            rename(2, "c", "d", c, false),
        ];
        let undos = Undos::plan(&renames, &now).unwrap();
        assert_eq!(undos.steps.len(), 2);
        assert!(
            undos.steps[0].exchange,
            "c was made again: {:?}",
            undos.steps[0]
        );
        assert_eq!(undos.steps[1].made, ["p"]);
        assert_eq!(undos.now("p"), Now::Made);
        assert_eq!(undos.now("c/g"), Now::At("d/g".to_string()));
        assert_eq!(undos.now("d/new"), Now::At("c/new".to_string()));
        assert_eq!(listed(&undos, "", &now), ["c/", "d/", "p/"]);
        assert_eq!(listed(&undos, "p", &now), ["a/"]);
        assert_eq!(listed(&undos, "p/a", &now), ["f"]);
        assert_eq!(listed(&undos, "d", &now), ["new"]);
    }
}
