//! A check of the O(1) rename design (docs/design.md, "Renames in O(1)"), before it is
//! built: a toy tree is changed by a sequence of operations, recorded in the design's form
//! (per-name Layer 1 records and checkpoint versions, one record per rename, nothing below
//! a renamed directory), and every name is looked up at every checkpoint by the design's
//! forward resolution. The reference is the tree itself, snapshot at each checkpoint: what
//! today's per-path form answers (it records every path below a renamed directory, so its
//! views are the snapshots). Test-only. Every sequence is also recorded as format-4
//! records and replayed through the real model (`real_model` below: `apply_record`,
//! `State::resolve`), which must give the same answers.
//!
//! Left out of the toy: files open for writing across a checkpoint (captured by their
//! current names at each checkpoint, as now), pending versions (filled before a rename),
//! gc, and the rewind plan.
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What is at a name: a directory, or a file with a content number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Obj {
    Dir,
    File(u32),
}

/// The live tree: every present path (no leading slash) → what it is.
type Tree = BTreeMap<String, Obj>;

#[derive(Clone, Debug)]
enum Op {
    /// Create or overwrite a file (its parent must be a directory).
    Write(String, u32),
    Mkdir(String),
    /// Unlink a file or remove an empty directory.
    Remove(String),
    /// rename(2) (replacing an absent name, a file by a file, an empty directory by a
    /// directory) or, with `true`, renameat2(RENAME_EXCHANGE) of two present names.
    Rename(String, String, bool),
    Checkpoint,
}

fn parent(p: &str) -> Option<&str> {
    p.rfind('/').map(|i| &p[..i])
}

/// `p` strictly below `dir`: the rest after `dir/`.
fn below<'a>(dir: &str, p: &'a str) -> Option<&'a str> {
    p.strip_prefix(dir)?.strip_prefix('/')
}

fn at_or_below(dir: &str, p: &str) -> bool {
    p == dir || below(dir, p).is_some()
}

/// The toy's exclusion rule: any name with a component `ex` (as `node_modules/` might be).
fn excluded(p: &str) -> bool {
    p.split('/').any(|c| c == "ex")
}

/// Whether `op` is one the kernel would carry out on `tree` (the same checks, roughly).
fn valid(tree: &Tree, op: &Op) -> bool {
    let parent_is_dir = |p: &str| parent(p).is_none_or(|d| tree.get(d) == Some(&Obj::Dir));
    let empty_dir =
        |p: &str| tree.get(p) == Some(&Obj::Dir) && !tree.keys().any(|k| below(p, k).is_some());
    match op {
        Op::Write(p, _) => parent_is_dir(p) && tree.get(p) != Some(&Obj::Dir),
        Op::Mkdir(p) => parent_is_dir(p) && !tree.contains_key(p),
        Op::Remove(p) => match tree.get(p) {
            Some(Obj::File(_)) => true,
            Some(Obj::Dir) => empty_dir(p),
            None => false,
        },
        Op::Rename(from, to, exchange) => {
            let (Some(what), true) = (tree.get(from), parent_is_dir(to)) else {
                return false;
            };
            if from == to || at_or_below(from, to) || at_or_below(to, from) {
                return false;
            }
            match (tree.get(to), exchange) {
                (None, true) => false,
                (Some(_), true) | (None, false) => true,
                (Some(Obj::File(_)), false) => *what != Obj::Dir,
                (Some(Obj::Dir), false) => *what == Obj::Dir && empty_dir(to),
            }
        }
        Op::Checkpoint => true,
    }
}

/// `tree` after `op` (which must be valid).
fn apply(tree: &mut Tree, op: &Op) {
    match op {
        Op::Write(p, c) => {
            tree.insert(p.clone(), Obj::File(*c));
        }
        Op::Mkdir(p) => {
            tree.insert(p.clone(), Obj::Dir);
        }
        Op::Remove(p) => {
            tree.remove(p);
        }
        Op::Rename(from, to, exchange) => {
            let take = |tree: &mut Tree, root: &str| -> Vec<(String, Obj)> {
                let names: Vec<String> = tree
                    .keys()
                    .filter(|k| at_or_below(root, k))
                    .cloned()
                    .collect();
                names
                    .into_iter()
                    .map(|k| {
                        let o = tree.remove(&k).unwrap();
                        (k[root.len()..].to_string(), o)
                    })
                    .collect()
            };
            let moving = take(tree, from);
            let replaced = take(tree, to);
            for (rest, o) in moving {
                tree.insert(format!("{to}{rest}"), o);
            }
            if *exchange {
                for (rest, o) in replaced {
                    tree.insert(format!("{from}{rest}"), o);
                }
            }
        }
        Op::Checkpoint => {}
    }
}

struct Rename {
    seq: u64,
    from: String,
    to: String,
    exchange: bool,
}

/// The history in the design's form.
#[derive(Default)]
struct Recorded {
    next_seq: u64,
    /// The seq of each checkpoint's record, by index.
    checkpoint_seq: Vec<u64>,
    /// name → its Layer 1 records, in seq order: (seq, the name's state just before).
    layer1: HashMap<String, Vec<(u64, Option<Obj>)>>,
    /// name → checkpoint index → its version made there.
    versions: HashMap<String, BTreeMap<usize, Option<Obj>>>,
    dirty: BTreeSet<String>,
    renames: Vec<Rename>,
}

impl Recorded {
    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Whether the gate records changes of `p`: not excluded, or below where a recorded
    /// rename moved content to (content that came from tracked names stays tracked).
    fn records(&self, p: &str) -> bool {
        !excluded(p)
            || self.renames.iter().any(|r| {
                below(&r.to, p).is_some()
                    || p == r.to
                    || (r.exchange && (below(&r.from, p).is_some() || p == r.from))
            })
    }

    /// The ancestor renames of `p` (an endpoint is a proper ancestor) with seq in `after..`.
    fn ancestor_renames_after(&self, p: &str, after: u64) -> impl Iterator<Item = &Rename> {
        self.renames.iter().filter(move |r| {
            r.seq > after && (below(&r.from, p).is_some() || below(&r.to, p).is_some())
        })
    }

    /// Layer 1, before a direct change of `p` (the gate). The first change since the later
    /// of the last checkpoint and the last rename of an ancestor records the state just
    /// before it. Where the real Layer 1 would only repeat the
    /// stored version (tracked, and no ancestor renamed since its last record or version),
    /// that version must be what is there: the design's claim, checked here.
    fn before_change(&mut self, tree: &Tree, p: &str) {
        if !self.records(p) {
            return;
        }
        let now = tree.get(p).copied();
        if self.dirty.contains(p) {
            // Changed since the last checkpoint, so recorded then: again only if an ancestor
            // was renamed since that record (what is at the name now came from elsewhere).
            let last = self.layer1[p].last().map_or(0, |r| r.0);
            if self.ancestor_renames_after(p, last).next().is_none() {
                return;
            }
        }
        // The real Layer 1 repeats the name's latest version (made at the last checkpoint
        // where it was changed) instead of capturing, unless an ancestor was renamed since.
        let latest = self
            .versions
            .get(p)
            .and_then(|v| v.iter().next_back())
            .map(|(&k, &state)| (self.checkpoint_seq[k], state));
        if let Some((since, stored)) = latest
            && self.ancestor_renames_after(p, since).next().is_none()
        {
            assert_eq!(
                stored, now,
                "{p}: the version Layer 1 would repeat is not there"
            );
        }
        let seq = self.seq();
        self.layer1
            .entry(p.to_string())
            .or_default()
            .push((seq, now));
        self.dirty.insert(p.to_string());
    }

    fn checkpoint(&mut self, tree: &Tree) {
        let k = self.checkpoint_seq.len();
        let seq = self.seq();
        self.checkpoint_seq.push(seq);
        for p in std::mem::take(&mut self.dirty) {
            let state = tree.get(&p).copied();
            self.versions.entry(p).or_default().insert(k, state);
        }
    }

    /// The design's lookup: the state of name `q` at seq `t` (`k`: the checkpoint whose
    /// record `t` is, if any), resolved forward through the records after `t`.
    fn at(&self, q: &str, t: u64, k: Option<usize>, live: &Tree) -> Option<Obj> {
        if let Some(v) = k.and_then(|k| self.versions.get(q)?.get(&k)) {
            return *v;
        }
        let record = self
            .layer1
            .get(q)
            .and_then(|r| r.iter().find(|(s, _)| *s > t));
        let rename = self.ancestor_renames_after(q, t).next();
        match (record, rename) {
            (Some(&(s, state)), r) if r.is_none_or(|r| s < r.seq) => state,
            (_, Some(r)) => match (below(&r.from, q), below(&r.to, q)) {
                (Some(rest), _) => self.at(&format!("{}/{rest}", r.to), r.seq, None, live),
                (None, Some(rest)) if r.exchange => {
                    self.at(&format!("{}/{rest}", r.from), r.seq, None, live)
                }
                // Nothing was below a name a rename replaced (absent, a file, or empty).
                (None, Some(_)) => None,
                (None, None) => unreachable!("an ancestor rename has an endpoint above"),
            },
            (None, None) => live.get(q).copied(),
            (Some(_), None) => unreachable!("handled by the first arm"),
        }
    }
}

/// Runs `ops` from `initial` (made in SRC directly: untracked), recording in the design's
/// form, then compares the lookup of every name, at every checkpoint, with the snapshot.
/// Excluded names are left out, as their views are live in both forms. Returns the number
/// of lookups compared. Then the same through the real model ([`real_model::check_real`]).
fn check(initial: &[(&str, Obj)], ops: &[Op]) -> usize {
    let compared = check_toy(initial, ops);
    assert_eq!(real_model::check_real(initial, ops), compared);
    compared
}

fn check_toy(initial: &[(&str, Obj)], ops: &[Op]) -> usize {
    let rec = std::cell::RefCell::new(Recorded::default());
    drive(
        initial,
        ops,
        |tree, op| {
            let mut rec = rec.borrow_mut();
            match op {
                Op::Write(p, _) | Op::Mkdir(p) | Op::Remove(p) => rec.before_change(tree, p),
                Op::Rename(from, to, exchange) => {
                    rec.before_change(tree, from);
                    rec.before_change(tree, to);
                    let seq = rec.seq();
                    rec.renames.push(Rename {
                        seq,
                        from: from.clone(),
                        to: to.clone(),
                        exchange: *exchange,
                    });
                }
                Op::Checkpoint => rec.checkpoint(tree),
            }
        },
        |name, k, live| {
            let rec = rec.borrow();
            rec.at(name, rec.checkpoint_seq[k], Some(k), live)
        },
    )
}

/// Runs `ops` from `initial`, calling `record` before each op is applied to the tree, then
/// compares `lookup(name, k, final tree)` of every name at every checkpoint with the tree's
/// snapshot there. Excluded names are left out. Returns the number of lookups compared.
fn drive(
    initial: &[(&str, Obj)],
    ops: &[Op],
    mut record: impl FnMut(&Tree, &Op),
    lookup: impl Fn(&str, usize, &Tree) -> Option<Obj>,
) -> usize {
    let mut tree: Tree = initial.iter().map(|(p, o)| (p.to_string(), *o)).collect();
    let mut snapshots: Vec<Tree> = Vec::new();
    let mut names: BTreeSet<String> = tree.keys().cloned().collect();
    for op in ops {
        assert!(valid(&tree, op), "invalid {op:?} on {tree:?}");
        record(&tree, op);
        if let Op::Checkpoint = op {
            snapshots.push(tree.clone());
        }
        apply(&mut tree, op);
        names.extend(tree.keys().cloned());
        if let Op::Rename(from, to, _) = op {
            names.extend([from.clone(), to.clone()]);
        }
    }
    let mut compared = 0;
    for (k, snapshot) in snapshots.iter().enumerate() {
        for name in names.iter().filter(|n| !excluded(n)) {
            assert_eq!(
                lookup(name, k, &tree),
                snapshot.get(name).copied(),
                "{name} at checkpoint {k} after {ops:?} from {initial:?}"
            );
            compared += 1;
        }
    }
    compared
}

fn w(p: &str, c: u32) -> Op {
    Op::Write(p.into(), c)
}
fn mkdir(p: &str) -> Op {
    Op::Mkdir(p.into())
}
fn rm(p: &str) -> Op {
    Op::Remove(p.into())
}
fn mv(from: &str, to: &str) -> Op {
    Op::Rename(from.into(), to.into(), false)
}
fn xchg(a: &str, b: &str) -> Op {
    Op::Rename(a.into(), b.into(), true)
}
const CP: Op = Op::Checkpoint;
const D: Obj = Obj::Dir;
const F1: Obj = Obj::File(1);
const F2: Obj = Obj::File(2);

#[test]
fn a_file_rename() {
    check(&[("f", F1)], &[CP, mv("f", "g"), CP, w("g", 3), CP]);
}

#[test]
fn a_directory_rename_of_untracked_files_and_a_changed_one() {
    let initial = [("a", D), ("a/x", F1), ("a/s", D), ("a/s/y", F2)];
    check(
        &initial,
        &[CP, w("a/x", 5), CP, mv("a", "b"), CP, w("b/s/y", 6), CP],
    );
}

#[test]
fn renames_into_and_out_of_excluded_paths() {
    let initial = [
        ("a", D),
        ("a/x", F1),
        ("ex", D),
        ("ex/d", D),
        ("ex/d/y", F2),
    ];
    // Out of tracked into excluded, then changed there.
    check(&initial, &[CP, mv("a", "ex/a"), CP, w("ex/a/x", 7), CP]);
    // Out of excluded into tracked, then changed.
    check(&initial, &[CP, mv("ex/d", "d"), CP, w("d/y", 8), CP]);
}

#[test]
fn rename_exchange_of_directories_and_of_a_file_with_a_directory() {
    let initial = [
        ("a", D),
        ("a/x", F1),
        ("b", D),
        ("b/x", F2),
        ("f", Obj::File(3)),
    ];
    check(
        &initial,
        &[CP, xchg("a", "b"), CP, w("a/x", 9), CP, xchg("a", "f"), CP],
    );
}

#[test]
fn rename_over_an_existing_empty_directory_and_over_a_file() {
    let initial = [
        ("a", D),
        ("a/x", F1),
        ("b", D),
        ("f", F2),
        ("g", Obj::File(3)),
    ];
    check(&initial, &[CP, mv("a", "b"), CP, mv("f", "g"), CP]);
}

#[test]
fn rename_then_recreate_the_old_name() {
    let initial = [("a", D), ("a/x", F1)];
    check(
        &initial,
        &[CP, mv("a", "b"), mkdir("a"), w("a/x", 4), CP, rm("a/x"), CP],
    );
    // The same within one epoch as the old name's first change.
    check(
        &initial,
        &[w("a/x", 2), mv("a", "b"), mkdir("a"), w("a/x", 4), CP],
    );
}

#[test]
fn nested_renames() {
    let initial = [("a", D), ("a/b", D), ("a/b/x", F1), ("a/y", F2)];
    check(
        &initial,
        &[
            CP,
            mv("a/b", "a/c"),
            CP,
            mv("a", "z"),
            CP,
            w("z/c/x", 5),
            CP,
        ],
    );
    check(
        &initial,
        &[mv("a/b", "a/c"), mv("a", "z"), CP, mv("z/c", "c"), CP],
    );
}

#[test]
fn rename_across_checkpoints_and_back() {
    let initial = [("a", D), ("a/x", F1)];
    check(
        &initial,
        &[
            CP,
            mv("a", "b"),
            CP,
            w("b/x", 2),
            CP,
            mv("b", "a"),
            CP,
            w("a/x", 3),
            CP,
        ],
    );
    // Back within the same epoch.
    check(&initial, &[CP, mv("a", "b"), w("b/x", 2), mv("b", "a"), CP]);
}

#[test]
fn an_untracked_directory_with_tracked_files_below() {
    let initial = [("u", D), ("u/d", D), ("u/d/x", F1), ("u/y", F2)];
    check(
        &initial,
        &[
            w("u/d/x", 3),
            CP,
            rm("u/y"),
            CP,
            mv("u", "v"),
            CP,
            mv("v/d", "d"),
            CP,
        ],
    );
}

/// Random valid sequences over a few names (directories, files, the excluded `ex`), each
/// compared at every checkpoint: thousands of rename orders the cases above do not spell.
#[test]
fn random_sequences_agree_with_the_snapshots() {
    let names = [
        "a", "b", "ex", "a/x", "a/y", "b/x", "a/b", "a/b/x", "b/a", "ex/a", "ex/a/x", "c",
    ];
    let initial = [("a", D), ("a/x", F1), ("a/b", D), ("a/b/x", F2), ("ex", D)];
    // A small linear congruential generator: the same sequences on every run.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((seed >> 33) % n as u64) as usize
    };
    let mut compared = 0;
    for _ in 0..1500 {
        let mut tree: Tree = initial.iter().map(|(p, o)| (p.to_string(), *o)).collect();
        let mut ops = Vec::new();
        while ops.len() < 24 {
            let pick = |i: usize| names[i].to_string();
            let op = match next(6) {
                0 => Op::Write(pick(next(names.len())), next(5) as u32),
                1 => Op::Mkdir(pick(next(names.len()))),
                2 => Op::Remove(pick(next(names.len()))),
                3 | 4 => Op::Rename(pick(next(names.len())), pick(next(names.len())), false),
                _ if next(3) == 0 => {
                    Op::Rename(pick(next(names.len())), pick(next(names.len())), true)
                }
                _ => Op::Checkpoint,
            };
            if valid(&tree, &op) {
                apply(&mut tree, &op);
                ops.push(op);
            }
        }
        ops.push(Op::Checkpoint);
        compared += check(&initial, &ops);
    }
    assert!(compared > 50_000, "only {compared} lookups compared");
}

/// The same sequences recorded as a format-4 daemon writes them (Layer 1 records with
/// `preimage` entries, checkpoint deltas, a rename intent and its outcome), replayed through
/// the real model ([`super::model::impossible`], [`super::model::apply_record`]) and looked
/// up with [`super::model::State::resolve`], against the snapshots.
mod real_model {
    use std::collections::BTreeMap;

    use super::*;
    use crate::history::model::{Resolved, State, VersionState, apply_record, impossible};
    use crate::transcript::record::{EntryKind, Record, RenameIntent, TrackedFileBackup};
    use crate::transcript::testutil::{dir_meta, file_entry};

    const T: &str = "2026-01-02T03:04:05Z";

    fn object(c: u32) -> String {
        format!("{:064x}", c + 1)
    }

    fn entry(version: u32, o: Option<Obj>) -> TrackedFileBackup {
        let mut b = file_entry(version, &object(0), T);
        match o {
            None => {
                b.meta = None;
                b.backup_file_name = None;
            }
            Some(Obj::Dir) => {
                b.meta = Some(dir_meta());
                b.backup_file_name = None;
            }
            Some(Obj::File(c)) => b.backup_file_name = Some(object(c)),
        }
        b
    }

    fn obj_of(state: &VersionState) -> Option<Obj> {
        match state {
            VersionState::Absent => None,
            VersionState::Present { meta, object: o } => Some(match meta.kind {
                EntryKind::Dir => Obj::Dir,
                _ => Obj::File(u32::from_str_radix(o.as_deref().unwrap(), 16).unwrap() - 1),
            }),
            VersionState::Pending => panic!("no pending versions here"),
        }
    }

    struct Daemon {
        state: State,
        seq: u64,
    }

    impl Daemon {
        fn apply(&mut self, mut r: Record) {
            r.seq = self.seq;
            self.seq += 1;
            let why = impossible(&self.state, &r, &mut |_| true, &|_, _| None);
            assert_eq!(why, None, "{r:?}");
            apply_record(&mut self.state, &r);
        }

        fn message(&self) -> Option<String> {
            self.state.checkpoints.last().map(|c| c.id.clone())
        }

        /// Layer 1 by format 4's rules (docs/design.md), before a direct change of `p`.
        fn before_change(&mut self, tree: &Tree, p: &str) {
            let st = &self.state;
            if excluded(p) && !st.renames.moved_content_to(p) {
                return;
            }
            let now = tree.get(p).copied();
            let h = st.paths.get(p);
            let renamed_above_since =
                |s: u64| st.renames.first_ancestor_rename_after(p, Some(s)).is_some();
            if let Some(h) = h
                && h.dirty
            {
                let last = h.changes.last().map_or(0, |c| c.0);
                if !renamed_above_since(last) {
                    return;
                }
            }
            let b = match h {
                None => entry(1, now),
                Some(h) => {
                    let n = h.versions.len();
                    let latest = &h.versions[n - 1];
                    let since = match latest.since {
                        Some(k) => st.checkpoints[k].seq,
                        None => h.v1_seq.unwrap(),
                    };
                    let mut b = entry(n as u32, now);
                    if renamed_above_since(since) || h.dirty {
                        b.preimage = true;
                    } else {
                        assert_eq!(
                            obj_of(&latest.state),
                            now,
                            "{p}: the version Layer 1 would repeat is not there"
                        );
                    }
                    b
                }
            };
            let files = BTreeMap::from([(p.to_string(), b)]);
            let m = self.message();
            self.apply(Record::snapshot_update(m.as_deref(), 0, T.into(), files));
        }

        fn checkpoint(&mut self, tree: &Tree) {
            let k = self.state.checkpoints.len();
            let mut delta = BTreeMap::new();
            for p in &self.state.dirty_paths {
                let n = self.state.paths[p].versions.len() as u32 + 1;
                delta.insert(p.clone(), entry(n, tree.get(p).copied()));
            }
            self.apply(Record::checkpoint_delta(
                &format!("c{k}"),
                0,
                T.into(),
                delta,
            ));
        }

        fn rename(&mut self, from: &str, to: &str, exchange: bool) {
            let m = self.message();
            let intent = RenameIntent {
                from: from.into(),
                to: to.into(),
                exchange,
                from_object: None,
                to_object: None,
            };
            let seq = self.seq;
            self.apply(Record::rename_intent(m.as_deref(), 0, T.into(), intent));
            self.apply(Record::rename_outcome(m.as_deref(), 0, T.into(), seq, true));
        }
    }

    /// [`check`] through the real model.
    pub(super) fn check_real(initial: &[(&str, Obj)], ops: &[Op]) -> usize {
        let d = std::cell::RefCell::new(Daemon {
            state: State::default(),
            seq: 1,
        });
        drive(
            initial,
            ops,
            |tree, op| {
                let mut d = d.borrow_mut();
                match op {
                    Op::Write(p, _) | Op::Mkdir(p) | Op::Remove(p) => d.before_change(tree, p),
                    Op::Rename(from, to, exchange) => {
                        d.before_change(tree, from);
                        d.before_change(tree, to);
                        d.rename(from, to, *exchange);
                    }
                    Op::Checkpoint => d.checkpoint(tree),
                }
            },
            |name, k, live| {
                let d = d.borrow();
                match d.state.resolve(name, Some(k)) {
                    Resolved::Version { path, n } => {
                        obj_of(&d.state.paths[&path].versions[n - 1].state)
                    }
                    Resolved::State(s) => obj_of(&s),
                    Resolved::Live(q) => live.get(&q).copied(),
                }
            },
        )
    }
}
