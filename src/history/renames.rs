//! Format 4's renames (docs/design.md, "Renames in O(1)"): the rename outcomes replay and
//! live recording applied, indexed by endpoint, and the intents still waiting for their
//! outcome.
//!
//! Invariants:
//! 1. `done` is in seq order (the intent's seq): renames through the mount are serialized
//!    from intent to outcome, so outcomes arrive in intent order.
//! 2. The trie holds, at the node of each endpoint (`from` and `to`), the indices into
//!    `done` of the renames with that endpoint, in increasing order (so in seq order).
//! 3. A rename is in `done` only once its `renamed` outcome was applied; a failed one is
//!    forgotten, and one without an outcome stays in `pending` until replay decides it.
use std::collections::{BTreeMap, HashMap};

use crate::transcript::record::RenameIntent;

/// A rename that happened: `seq` is its intent's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rename {
    pub seq: u64,
    pub from: String,
    pub to: String,
    pub exchange: bool,
    /// `(st_dev, st_ino)` of what was at `from` and at `to` just before (a rewind undoes
    /// the rename only where `to` still holds what it moved).
    pub from_object: Option<(u64, u64)>,
    pub to_object: Option<(u64, u64)>,
}

#[derive(Debug, Default, Clone)]
struct Node {
    children: HashMap<String, Node>,
    /// Indices into `Renames::done` of the renames with this node as an endpoint.
    renames: Vec<usize>,
}

/// The renames of a history (see the module's invariants).
#[derive(Debug, Default, Clone)]
pub struct Renames {
    done: Vec<Rename>,
    trie: Node,
    pending: BTreeMap<u64, RenameIntent>,
}

/// `p` strictly below `dir`: the rest after `dir/`.
pub(crate) fn below<'a>(dir: &str, p: &'a str) -> Option<&'a str> {
    p.strip_prefix(dir)?.strip_prefix('/')
}

impl Renames {
    /// The intent of a rename, recorded with `seq`: waits for its outcome.
    pub fn intend(&mut self, seq: u64, intent: RenameIntent) {
        self.pending.insert(seq, intent);
    }

    /// The outcome of the intent with seq `intent_seq`: applied if `done`, forgotten if not.
    /// `false` if no such intent waits.
    pub fn settle(&mut self, intent_seq: u64, done: bool) -> bool {
        let Some(intent) = self.pending.remove(&intent_seq) else {
            return false;
        };
        if done {
            let i = self.done.len();
            for end in [&intent.from, &intent.to] {
                let mut node = &mut self.trie;
                for c in end.split('/') {
                    node = node.children.entry(c.to_string()).or_default();
                }
                node.renames.push(i);
            }
            self.done.push(Rename {
                seq: intent_seq,
                from: intent.from,
                to: intent.to,
                exchange: intent.exchange,
                from_object: intent.from_object,
                to_object: intent.to_object,
            });
        }
        true
    }

    /// Whether an intent with this seq waits for its outcome.
    pub fn is_pending(&self, seq: u64) -> bool {
        self.pending.contains_key(&seq)
    }

    /// The intents without an outcome, in seq order.
    pub fn pending(&self) -> impl Iterator<Item = (u64, &RenameIntent)> {
        self.pending.iter().map(|(s, i)| (*s, i))
    }

    /// Every rename that happened, in seq order.
    pub fn done(&self) -> &[Rename] {
        &self.done
    }

    /// The renames with seq after `t` (`None`: all), in seq order.
    pub fn after(&self, t: Option<u64>) -> &[Rename] {
        let i = self.done.partition_point(|r| Some(r.seq) <= t);
        &self.done[i..]
    }

    /// The first rename after `t` (`None`: from the start) with an endpoint that is a proper
    /// ancestor of `p` (an *ancestor rename* of `p`): O(depth · log renames per endpoint).
    pub fn first_ancestor_rename_after(&self, p: &str, t: Option<u64>) -> Option<&Rename> {
        let mut node = &self.trie;
        let mut best: Option<usize> = None;
        let mut components = p.split('/').peekable();
        while let Some(c) = components.next() {
            if components.peek().is_none() {
                break; // `p` itself: a rename of `p` is a direct change, not an ancestor's.
            }
            let Some(next) = node.children.get(c) else {
                break;
            };
            node = next;
            let i = node
                .renames
                .partition_point(|&i| Some(self.done[i].seq) <= t);
            if let Some(&first) = node.renames.get(i) {
                best = Some(best.map_or(first, |b| b.min(first)));
            }
        }
        best.map(|i| &self.done[i])
    }

    /// Whether a rename that happened moved content to `p` or above it (its `to`, or either
    /// endpoint of an exchange, at or above `p`): such a name stays recorded even if
    /// excluded, since lookups of older checkpoints resolve to what is there.
    pub fn moved_content_to(&self, p: &str) -> bool {
        let mut node = &self.trie;
        let mut walked = 0;
        for c in p.split('/') {
            let Some(next) = node.children.get(c) else {
                return false;
            };
            node = next;
            walked += c.len() + usize::from(walked > 0);
            // This node is the endpoint `p[..walked]` of each rename it lists.
            let here = &p[..walked];
            if node
                .renames
                .iter()
                .any(|&i| self.done[i].exchange || self.done[i].to == here)
            {
                return true;
            }
        }
        false
    }
}
