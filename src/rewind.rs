//! Rewind: make the tree (or some paths of it) equal to a checkpoint.
//!
//! The daemon does the work itself, from a control thread, through the passthrough core's
//! own operations ([`Changer`]): every change passes the gate's permits and Layer 1 (the
//! rewind is itself recorded and can be undone), none waits on the daemon's own mount, and
//! the kernel is told what changed. Paths are resolved by lookups from the root inode, which
//! never follow a symlink, so a rewind cannot be led out of the tree by a symlink planted in
//! it.
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileType, TimeOrNow};
use log::{info, warn};

use crate::fs::inodes::ROOT_INO;
use crate::fs::virt::file_type_of;
use crate::fs::{Entry, PassthroughFs, SetAttr};
use crate::history::logdiff::SessionChanges;
use crate::history::quote::{quote_bytes, quote_name, shell_word};
use crate::history::{CONTROL_DIR_NAME, Caller, ViewContent, ViewEntry, split_parent};
use crate::history::{History, agent_state, xattrs};
use crate::sys::{self, FsCredsGuard, errno};
use crate::transcript::record::EntryKind;
use undo::{Now, Undo, Undos};

mod check;
mod undo;

/// One difference between the current tree and the target checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Exists now, did not exist at the target: remove it.
    Remove { path: String, kind: EntryKind },
    /// Missing now or of another type: (re)create it.
    Create { path: String, target: ViewEntry },
    /// Same type, other content (files, symlinks): rewrite it (and its metadata).
    Rewrite { path: String, target: ViewEntry },
    /// Same type and content, other mode/owner/mtime.
    Metadata { path: String, target: ViewEntry },
}

impl Step {
    pub fn path(&self) -> &str {
        match self {
            Step::Remove { path, .. }
            | Step::Create { path, .. }
            | Step::Rewrite { path, .. }
            | Step::Metadata { path, .. } => path,
        }
    }

    fn describe(&self) -> String {
        match self {
            Step::Remove { path, .. } => format!("remove   {}", quote_name(path)),
            Step::Create { path, .. } => format!("restore  {}", quote_name(path)),
            Step::Rewrite { path, .. } => format!("rewrite  {}", quote_name(path)),
            Step::Metadata { path, target } => {
                let path = quote_name(path);
                format!("chmod    {path} (mode {:04o})", target.meta.mode)
            }
        }
    }
}

impl History {
    /// Whether the content of `rel` now equals the target's (called only when the kinds
    /// and, for files, the sizes agree).
    fn same_content(&self, rel: &str, target: &ViewEntry) -> io::Result<bool> {
        let crate::history::ViewContent::Object(name) = &target.content else {
            // Live content: unchanged since the mount means equal.
            return Ok(true);
        };
        let fd = self.open_beneath(rel)?;
        match target.meta.kind {
            EntryKind::Symlink => {
                let now = sys::readlinkat(fd.as_fd(), sys::EMPTY)?;
                Ok(self.store().read_object(name)? == now)
            }
            EntryKind::File => {
                let file = File::from(sys::proc_reopen(fd.as_raw_fd(), libc::O_RDONLY)?);
                Ok(&crate::history::store::content_hash(&file)? == name)
            }
            _ => Ok(true),
        }
    }

    /// `target` of a path whose content is at `now` in SRC (none: nothing), with content
    /// that lives at another name in SRC (format 4: the state at the checkpoint moved there
    /// by a rename the rewind could not undo) taken into the store first: the per-path pass
    /// may remove or change that name before it writes the path.
    fn stored_if_moved(
        &self,
        now: Option<&str>,
        target: Option<ViewEntry>,
    ) -> io::Result<Option<ViewEntry>> {
        let Some(ViewEntry {
            content: crate::history::ViewContent::Live(q),
            ..
        }) = &target
        else {
            return Ok(target);
        };
        if Some(q.as_str()) == now {
            return Ok(target);
        }
        Ok(match self.capture(q)?.0 {
            crate::history::VersionState::Present { meta, object } => Some(ViewEntry {
                meta,
                content: object.map_or(
                    crate::history::ViewContent::None,
                    crate::history::ViewContent::Object,
                ),
            }),
            _ => None,
        })
    }

    /// The steps that make the tracked paths selected by `only` (all when empty) equal to
    /// checkpoint `k`, once `undos` are done (read from SRC as it is now through them).
    /// Untracked paths are unchanged since the mount, so they already are.
    fn plan_rewind(&self, k: usize, only: &[String], undos: &Undos) -> io::Result<Vec<Step>> {
        // A path unchanged since its latest version, which is also its version at k, is
        // already as it was at k: only the others need comparing (reading and hashing
        // every tracked file would make a rewind cost O(bytes tracked)).
        let tracked: Vec<String> = {
            let st = self.lock();
            let mut v: Vec<String> = st
                .paths
                .iter()
                .filter(|(_, h)| {
                    !h.versions.is_empty() && (h.dirty || h.version_at(k) != h.versions.len())
                })
                .map(|(p, _)| p.clone())
                .collect();
            // Format 4: names moved by renames since k (none without rename records).
            let moved = st.names_moved_since(k);
            if !moved.is_empty() {
                v.extend(moved);
                v.sort();
                v.dedup();
            }
            v.sort();
            v
        };
        let selected = |p: &str| {
            only.is_empty()
                || only.iter().any(|o| {
                    o.is_empty()
                        || p == o
                        || (p.starts_with(o.as_str()) && p.as_bytes().get(o.len()) == Some(&b'/'))
                })
        };
        let mut steps = Vec::new();
        for path in tracked
            .iter()
            .filter(|p| selected(p) && !self.is_excluded(p, None))
        {
            // Where the content this name has after the undos is now.
            let now = match undos.now(path) {
                Now::At(q) => Some(q),
                Now::Gone => None,
                // Made by the undos as it was at k.
                Now::Made => continue,
            };
            let target =
                self.stored_if_moved(now.as_deref(), self.view_entry(k, path.as_bytes())?)?;
            let current = match &now {
                Some(q) => self.current_meta(q)?,
                None => None,
            };
            let now = now.as_deref().unwrap_or(path);
            match (current, target) {
                (None, None) => {}
                (Some(cur), None) => steps.push(Step::Remove {
                    path: path.clone(),
                    kind: cur.kind,
                }),
                (None, Some(target)) => steps.push(Step::Create {
                    path: path.clone(),
                    target,
                }),
                (Some(cur), Some(target)) => {
                    let m = &target.meta;
                    if cur.kind != m.kind {
                        steps.push(Step::Remove {
                            path: path.clone(),
                            kind: cur.kind,
                        });
                        steps.push(Step::Create {
                            path: path.clone(),
                            target,
                        });
                    } else if (m.kind == EntryKind::File && cur.size != m.size)
                        || !self.same_content(now, &target)?
                    {
                        steps.push(Step::Rewrite {
                            path: path.clone(),
                            target,
                        });
                    } else if cur.mode != m.mode
                        || cur.uid != m.uid
                        || cur.gid != m.gid
                        || (m.kind == EntryKind::File
                            && (cur.mtime_sec, cur.mtime_nsec) != (m.mtime_sec, m.mtime_nsec))
                        || (m.xattrs.is_some() && m.xattrs != self.current_xattrs_name(now)?)
                    {
                        steps.push(Step::Metadata {
                            path: path.clone(),
                            target,
                        });
                    }
                }
            }
        }
        Ok(steps)
    }

    /// The paths of `only` that match nothing: absent now and at checkpoint `k`, with no
    /// change of them or beneath them in the history. A rewind of them could only be a typo's
    /// silent success.
    fn unmatched_paths(&self, k: usize, only: &[String]) -> io::Result<Vec<String>> {
        let mut unmatched = Vec::new();
        for o in only.iter().filter(|o| !o.is_empty()) {
            let in_history = {
                let st = self.lock();
                st.paths.keys().any(|p| agent_state::is_at_or_below(p, o))
            };
            if in_history
                || self.current_meta(o)?.is_some()
                || self.view_entry(k, o.as_bytes())?.is_some()
            {
                continue;
            }
            unmatched.push(o.clone());
        }
        Ok(unmatched)
    }

    pub(crate) fn unused_rewind_id(&self, to: &str) -> String {
        let st = self.lock();
        let base_len = 128 - ":before-rewind-9999".len();
        let short: String = to.chars().take(base_len).collect();
        (1..)
            .map(|n| {
                if n == 1 {
                    format!("{short}:before-rewind")
                } else {
                    format!("{short}:before-rewind-{n}")
                }
            })
            .find(|id| !st.checkpoint_ids.contains_key(id))
            .unwrap_or_default()
    }
}

/// A path a rewind leaves as it is, and why.
struct Kept {
    path: String,
    why: String,
}

/// Splits off the steps a rewind leaves alone as agent state (see [`agent_state`]): paths a
/// rule matches, unless `only` names them (or the agent-state directory holding them), and the
/// removal of a directory that would still hold a kept path.
fn keep_agent_state(steps: Vec<Step>, only: &[String]) -> (Vec<Step>, Vec<Kept>) {
    let named = |path: &str| {
        only.iter().any(|o| {
            !o.is_empty()
                && agent_state::matching_rule(o).is_some()
                && agent_state::is_at_or_below(path, o)
        })
    };
    let mut kept = Vec::new();
    let mut rest = Vec::new();
    for step in steps {
        match agent_state::matching_rule(step.path()) {
            Some(rule) if !named(step.path()) => kept.push(Kept {
                path: step.path().to_string(),
                why: format!("agent state, rule '{rule}'"),
            }),
            _ => rest.push(step),
        }
    }
    let holds_kept = |dir: &str| {
        kept.iter()
            .any(|k| k.path != dir && agent_state::is_at_or_below(&k.path, dir))
    };
    let (holding, steps): (Vec<Step>, Vec<Step>) = rest.into_iter().partition(
        |s| matches!(s, Step::Remove { kind: EntryKind::Dir, path } if holds_kept(path)),
    );
    kept.extend(holding.into_iter().map(|s| Kept {
        path: s.path().to_string(),
        why: "holds agent state".to_string(),
    }));
    (steps, kept)
}

/// What to rewind, and how.
#[derive(Debug, Default, Clone)]
pub struct RewindOptions {
    /// Only these paths (relative to the mount root); all when empty.
    pub paths: Vec<String>,
    /// Report what would change, change nothing.
    pub dry_run: bool,
    /// Rewind agent state too (see [`agent_state`]); by default it is kept.
    pub rewind_agent_state: bool,
    /// Only what this agent session changed since the checkpoint.
    pub session: Option<String>,
    /// With `session`: rewind paths others changed too.
    pub force: bool,
    /// The agent session of whoever asked for the rewind, if any: its `ID:before-rewind`
    /// checkpoint is recorded under it, as a checkpoint that process took itself would be.
    pub checkpoint_session: Option<String>,
}

/// The command that runs this session rewind again, as the user typed it, but `--force`
/// when `force` and for `paths` (all of them when empty): a suggestion to copy and run.
fn session_rewind_command(
    mnt: &std::path::Path,
    id: &str,
    opts: &RewindOptions,
    session: &str,
    force: bool,
    paths: &[String],
) -> String {
    let mut words = vec![
        "checkpointfs".to_string(),
        "rewind".to_string(),
        shell_word(&mnt.to_string_lossy()),
        shell_word(id),
        "--session".to_string(),
        shell_word(session),
    ];
    if force {
        words.push("--force".to_string());
    }
    if opts.rewind_agent_state {
        words.push("--rewind-agent-state".to_string());
    }
    if opts.dry_run {
        words.push("--dry-run".to_string());
    }
    if !paths.is_empty() {
        words.push("--".to_string());
        words.extend(paths.iter().map(|p| shell_word(p)));
    }
    words.join(" ")
}

/// Narrows `only` to what `opts.session` changed after checkpoint `k`. Refuses (changing
/// nothing) when others changed any of those paths too, unless `opts.force`; the report
/// notes them either way. The refusal suggests the commands to run instead, for the real
/// mount point.
fn session_selection(
    fs: &PassthroughFs,
    k: usize,
    id: &str,
    session: &str,
    opts: &RewindOptions,
    only: &[String],
    out: &mut String,
) -> io::Result<(Vec<String>, SessionChanges)> {
    let (history, mnt) = (fs.history(), fs.mount_info().0);
    // Attribution is read from the transcript: everything recorded so far must be in it.
    history.flush()?;
    let changed = history.session_changes_since(k, session)?;
    let within =
        |p: &str| only.is_empty() || only.iter().any(|o| agent_state::is_at_or_below(p, o));
    let changed: SessionChanges = changed
        .into_iter()
        .filter(|(p, _)| !p.is_empty() && within(p))
        .collect();
    if changed.is_empty() {
        out.push_str(&format!("session {session} changed nothing since '{id}'\n"));
    }
    let conflicts: Vec<String> = changed
        .iter()
        .filter(|(_, others)| !others.is_empty())
        .map(|(p, others)| {
            format!(
                "{} (also changed by {})",
                quote_name(p),
                others
                    .iter()
                    .map(|o| quote_name(o))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        })
        .collect();
    if !conflicts.is_empty() && !opts.force {
        let own_only: Vec<String> = changed
            .iter()
            .filter(|(_, others)| others.is_empty())
            .map(|(p, _)| p.clone())
            .collect();
        let mut hint = String::new();
        if !own_only.is_empty() {
            hint.push_str(&format!(
                "Rewind only the paths no one else changed with:\n  {}\nor all of them",
                session_rewind_command(mnt, id, opts, session, false, &own_only)
            ));
        } else {
            hint.push_str("Rewind them");
        }
        hint.push_str(&format!(
            ", undoing the others' changes to them too, with:\n  {}",
            session_rewind_command(mnt, id, opts, session, true, only)
        ));
        return Err(io::Error::other(format!(
            "refusing to rewind session {session} to '{id}': others changed these paths \
             after it too, so rewinding them would undo their work:\n  {}\nNothing was \
             changed. {hint}",
            conflicts.join("\n  ")
        )));
    }
    for c in &conflicts {
        out.push_str(&format!("forced: {c}\n"));
    }
    Ok((changed.keys().cloned().collect(), changed))
}

/// Rewinds the mounted tree to checkpoint `id` as `opts` say. Returns the report the CLI
/// prints; `progress(done, total)` follows the changes as they are made.
pub fn rewind(
    fs: &PassthroughFs,
    id: &str,
    opts: &RewindOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> io::Result<String> {
    let history = fs.history();
    let dry_run = opts.dry_run;
    let k = history.checkpoint_index(id).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no checkpoint named '{id}' (see: checkpointfs log MNT)"),
        )
    })?;
    let mut only: Vec<String> = opts
        .paths
        .iter()
        .map(|p| p.trim_matches('/').to_string())
        .collect();
    for p in &only {
        if p.split('/').any(|c| c == ".." || c == ".") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "path '{}' must be relative to the mount root, without '.' or '..'",
                    quote_name(p)
                ),
            ));
        }
    }
    let unmatched = history.unmatched_paths(k, &only)?;
    if !unmatched.is_empty() {
        let names: Vec<_> = unmatched.iter().map(|p| quote_name(p)).collect();
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "nothing to rewind at {}: {} neither now nor at '{id}', and the history has no \
                 change of {} (PATHs are relative to the mount root, or absolute inside \
                 it). Nothing was changed and no checkpoint was taken; check the name{}, or \
                 see `checkpointfs diff MNT {id}` for the paths that changed",
                names.join(", "),
                if names.len() == 1 {
                    "it exists"
                } else {
                    "they exist"
                },
                if names.len() == 1 { "it" } else { "them" },
                if names.len() == 1 { "" } else { "s" },
            ),
        ));
    }
    let mut out = String::new();
    let mut session_paths = None;
    if let Some(session) = &opts.session {
        let (paths, changed) = session_selection(fs, k, id, session, opts, &only, &mut out)?;
        if paths.is_empty() {
            return Ok(out);
        }
        only = paths;
        session_paths = Some(changed);
    }
    // Format 4: a whole-tree rewind first undoes the renames since k as renames, newest
    // first (the moved files keep their inodes, and nothing below is copied); the per-path
    // plan is made for the tree they leave, so that both are checked before either starts.
    let src_now = SrcNow { history, k };
    let undos = if only.is_empty() {
        Undos::plan(&history.renames_since(k), &src_now)?
    } else {
        Undos::default()
    };
    let steps = history.plan_rewind(k, &only, &undos)?;
    // A session's rewind must not reach what others made inside a directory it created or
    // removed (rewinding `d` would remove their `d/x` too).
    if let Some(changed) = &session_paths {
        let collateral: Vec<&str> = steps
            .iter()
            .map(Step::path)
            .filter(|p| !changed.contains_key(*p))
            .collect();
        if !collateral.is_empty() && !opts.force {
            return Err(io::Error::other(format!(
                "refusing to rewind the session to '{id}': it would also change paths the \
                 session did not change:\n  {}\nNothing was changed. Rewind them too with:\n  {}",
                collateral
                    .iter()
                    .map(|p| quote_name(p))
                    .collect::<Vec<_>>()
                    .join("\n  "),
                session_rewind_command(
                    fs.mount_info().0,
                    id,
                    opts,
                    opts.session.as_deref().unwrap_or_default(),
                    true,
                    &opts.paths
                )
            )));
        }
    }
    let (steps, kept) = if opts.rewind_agent_state {
        (steps, Vec::new())
    } else {
        keep_agent_state(steps, &only)
    };
    for k in &kept {
        out.push_str(&format!(
            "{} {} ({}; --rewind-agent-state rewinds it)\n",
            if dry_run { "would keep" } else { "kept" },
            quote_name(&k.path),
            k.why
        ));
    }
    // Checked before anything changes (a dry run reports the same refusal).
    check_plan(
        history,
        id,
        &steps,
        fs.owner().is_some(),
        &AfterUndos {
            src: &src_now,
            undos: &undos,
        },
    )?;
    if dry_run {
        if steps.is_empty() && undos.steps.is_empty() {
            out.push_str(&format!(
                "nothing to change: the tree already equals '{id}'\n"
            ));
        }
        for u in &undos.steps {
            out.push_str(&format!("would {}\n", describe_undo(u)));
        }
        for s in &steps {
            out.push_str(&format!("would {}\n", s.describe()));
        }
        return Ok(out);
    }
    // Verified before anything changes, the `:before-rewind` checkpoint included.
    check_mount_root(fs)?;
    let saved = history.unused_rewind_id(id);
    fs.checkpoint(&saved, opts.checkpoint_session.clone())?;
    out.push_str(&format!("saved current state as {saved}\n"));
    let done = std::cell::Cell::new(0);
    let total = undos.steps.len() + steps.len();
    let applied = undo_renames(fs, k, &undos).and_then(|()| {
        done.set(undos.steps.len());
        // Planned again from the tree the undos left: the same plan unless a writer
        // changed the tree since it was checked, which is then checked again.
        let steps = if undos.steps.is_empty() {
            steps
        } else {
            let steps = history.plan_rewind(k, &only, &Undos::default())?;
            let steps = if opts.rewind_agent_state {
                steps
            } else {
                keep_agent_state(steps, &only).0
            };
            check_plan(
                history,
                id,
                &steps,
                fs.owner().is_some(),
                &LiveTree(history),
            )?;
            steps
        };
        apply(fs, &steps, &mut |n, _| {
            done.set(undos.steps.len() + n);
            progress(n, steps.len());
        })?;
        Ok(steps.len())
    });
    let changed = match applied {
        Ok(changed) => changed,
        Err(e) => {
            // What was changed is recorded: the undo below needs it in the transcript too.
            if let Err(f) = history.flush() {
                log::error!("after a failed rewind, cannot flush the history: {f}");
            }
            log::error!("rewind to {id} failed after {} changes: {e}", done.get());
            return Err(sys::context(
                format!(
                    "the rewind to '{id}' failed after {} of {} changes, so the tree is partly \
                 rewound. `checkpointfs rewind {} {}` puts it back exactly as it was before \
                 this rewind. The failure",
                    done.get(),
                    total,
                    shell_word(&fs.mount_info().0.to_string_lossy()),
                    shell_word(&saved)
                ),
                e,
            ));
        }
    };
    history.flush()?;
    let renames = match undos.steps.len() {
        0 => String::new(),
        1 => " and 1 rename undone".to_string(),
        n => format!(" and {n} renames undone"),
    };
    info!("rewound to {id}: {changed} changes{renames}");
    out.push_str(&format!(
        "rewound to {id}: {changed} path{} changed{renames}\n",
        if changed == 1 { "" } else { "s" }
    ));
    Ok(out)
}

/// Does `undos` (see [`undo`]), in order, each as one rename through the mount's core (so
/// recorded like any change): `to` back to `from`, with RENAME_NOREPLACE, or exchanged
/// with what is at `from` (an exchange, or a plain rename whose `from` was made again
/// since: `from` gets its content back, and what was made there moves to `to`, where the
/// per-path pass removes or rewrites it like any later change). The directories above
/// `from` that existed at k and are gone (removed by an earlier rewind, say) are made first.
fn undo_renames(fs: &PassthroughFs, k: usize, undos: &Undos) -> io::Result<()> {
    let changer = Changer::new(fs);
    for u in &undos.steps {
        changer.make_parents(&u.from, k)?;
        let flags = if u.exchange {
            libc::RENAME_EXCHANGE
        } else {
            libc::RENAME_NOREPLACE
        };
        changer
            .rename(&u.to, &u.from, flags)
            .map_err(|e| sys::context(format!("undoing: {}", describe_undo(u)), e))?;
    }
    Ok(())
}

/// An undo as the rewind's report shows it.
fn describe_undo(u: &Undo) -> String {
    format!(
        "{} {} -> {}",
        if u.exchange { "exchange" } else { "rename  " },
        quote_name(&u.to),
        quote_name(&u.from)
    )
}

/// Refuses, changing nothing, a plan that could not be carried out whole as far as can be
/// known before its first change (see [`check`]).
/// `for_owner`: the rewind runs as an `--owner`'s, so it restores nothing that needs a
/// privilege beyond theirs.
/// `tree`: the tree the steps start from.
fn check_plan(
    history: &History,
    id: &str,
    steps: &[Step],
    for_owner: bool,
    tree: &impl check::Tree,
) -> io::Result<()> {
    let mut problems = check::object_problems(steps, |name| history.store().verify(name));
    problems.extend(check::xattr_problems(
        steps,
        |name| history.xattrs_of(name),
        |p| !for_owner && sys::has_effective_cap(p.cap),
    ));
    problems.extend(check::tree_problems(steps, tree).map_err(|e| {
        sys::context(
            format!(
                "cannot rewind to '{id}': checking the tree first failed (nothing was changed)"
            ),
            e,
        )
    })?);
    if problems.is_empty() {
        return Ok(());
    }
    let refusal = check::refusal(id, &problems);
    log::warn!("{}", refusal.to_string().replace('\n', " "));
    Err(refusal)
}

/// The tree in SRC as [`check::tree_problems`] sees it: read beneath SRC's root, no
/// symlink followed.
struct LiveTree<'a>(&'a History);

impl check::Tree for LiveTree<'_> {
    fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>> {
        list_dir(self.0, rel)?
            .into_iter()
            .map(|(name, d_type)| {
                let is_dir = match d_type {
                    libc::DT_UNKNOWN => match std::str::from_utf8(&name) {
                        Ok(n) => self.kind(&format!("{rel}/{n}"))? == Some(EntryKind::Dir),
                        Err(_) => false,
                    },
                    t => t == libc::DT_DIR,
                };
                Ok((name, is_dir))
            })
            .collect()
    }

    fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>> {
        Ok(self.0.current_meta(rel)?.map(|m| m.kind))
    }

    fn untracked_why(&self, rel: &str, is_dir: bool) -> Option<String> {
        use crate::history::exclusions::Verdict;
        match self.0.exclusion_verdict(rel, Some(is_dir)) {
            Verdict::Glob { pattern, .. } => Some(format!("excluded by '{pattern}'")),
            Verdict::Ignored { .. } => Some("ignored by a git rule".to_string()),
            _ => None,
        }
    }
}

/// SRC as it is now, and checkpoint `k`, as [`undo::Undos`] reads them.
struct SrcNow<'a> {
    history: &'a History,
    k: usize,
}

impl undo::LiveTree for SrcNow<'_> {
    fn object(&self, rel: &str) -> io::Result<Option<(u64, u64)>> {
        let Some(fd) = self.history.open_existing(rel)? else {
            return Ok(None);
        };
        let st = sys::fstat(fd.as_fd())?;
        Ok(Some((st.st_dev as u64, st.st_ino as u64)))
    }

    fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>> {
        check::Tree::kind(&LiveTree(self.history), rel)
    }

    fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>> {
        check::Tree::list(&LiveTree(self.history), rel)
    }

    fn at_checkpoint(&self, rel: &str) -> io::Result<Option<EntryKind>> {
        Ok(self
            .history
            .view_entry(self.k, rel.as_bytes())?
            .map(|e| e.meta.kind))
    }
}

/// The tree as it will be once the undos are done, for [`check::tree_problems`].
struct AfterUndos<'a> {
    src: &'a SrcNow<'a>,
    undos: &'a Undos,
}

impl check::Tree for AfterUndos<'_> {
    fn list(&self, rel: &str) -> io::Result<Vec<(Vec<u8>, bool)>> {
        self.undos.list(rel, self.src)
    }

    fn kind(&self, rel: &str) -> io::Result<Option<EntryKind>> {
        self.undos.kind(rel, self.src)
    }

    fn untracked_why(&self, rel: &str, is_dir: bool) -> Option<String> {
        LiveTree(self.src.history).untracked_why(rel, is_dir)
    }
}

/// The names in directory `rel` of SRC and their `d_type`s (none when it is gone or not a
/// directory), listed beneath SRC's root without following a symlink.
fn list_dir(history: &History, rel: &str) -> io::Result<Vec<(Vec<u8>, u8)>> {
    let Some(fd) = history.open_existing(rel)? else {
        return Ok(Vec::new());
    };
    if sys::fstat(fd.as_fd())?.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    let mut stream = sys::DirStream::open(fd.as_fd(), true)?;
    while let Some(e) = stream.next_entry()? {
        if e.name != b"." && e.name != b".." {
            names.push((e.name.to_vec(), e.d_type));
        }
    }
    Ok(names)
}

/// `statfs.f_type` of every FUSE mount.
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Checks that the mount point the user knows is still this daemon's mount, from the
/// kernel: a FUSE file system (`fstatfs`), with the device number the daemon recorded when it
/// mounted, and the root of that mount (`statx` STATX_ATTR_MOUNT_ROOT). The rewind itself
/// never goes through it, but a user who owns a parent of the mount point can move the mount
/// away and put a directory or symlink in its place; rewinding a tree the user no longer sees
/// there would surprise them, so this refuses before anything changes.
fn check_mount_root(fs: &PassthroughFs) -> io::Result<()> {
    let mnt = fs.mount_info().0;
    let refuse = |why: String| {
        io::Error::other(format!(
            "cannot rewind: {} is not this mount's root any more ({why}); was the mount \
             point or one of its parent directories moved or replaced? Nothing was changed. \
             Unmount (checkpointfs umount), then mount again where it should be",
            mnt.display()
        ))
    };
    let Some(expected) = fs.mount_dev() else {
        return Err(refuse(
            "the daemon did not find its mount's device number when it mounted".into(),
        ));
    };
    let check = || -> Result<(), String> {
        let fd = open_path(mnt)?;
        verify_mount_root(fd.as_fd(), expected)
    };
    let checked = match fs.owner() {
        None => check(),
        // A mount made for another user admits that user's processes alone, root's not:
        // the check runs on a thread of its own that becomes the owner for good.
        Some(owner) => std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    sys::act_as_user_on_this_thread(owner)
                        .map_err(|e| format!("cannot act as the owner (uid {}): {e}", owner.uid))?;
                    check()
                })
                .join()
                .unwrap_or_else(|_| Err("the check's thread panicked".into()))
        }),
    };
    checked.map_err(refuse)
}

/// Opens `path` O_PATH (a directory, followed as given: the kernel's checks decide).
#[allow(
    clippy::disallowed_methods,
    reason = "an O_PATH open of MNT, to check it: it can neither write nor create"
)]
fn open_path(path: &Path) -> Result<OwnedFd, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "its path contains a NUL byte".to_string())?;
    // SAFETY: valid C string; the fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(format!("opening it failed: {}", io::Error::last_os_error()));
    }
    // SAFETY: fresh fd, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why `fd` is not the root of the FUSE mount with device `(major, minor)`, if it is not.
pub fn verify_mount_root(
    fd: std::os::fd::BorrowedFd<'_>,
    expected: (u32, u32),
) -> Result<(), String> {
    // SAFETY: `statfs` is plain old data, for which all-zero bytes are a valid value.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `sfs` a live, writable statfs buffer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sfs) } != 0 {
        return Err(format!("fstatfs failed: {}", io::Error::last_os_error()));
    }
    if sfs.f_type as i64 != FUSE_SUPER_MAGIC {
        return Err(format!(
            "it is not a FUSE mount: file system type {:#x}, not {FUSE_SUPER_MAGIC:#x}",
            sfs.f_type
        ));
    }
    // SAFETY: `statx` is plain old data, for which all-zero bytes are a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open, the path an empty C string and `stx` a live, writable buffer;
    // AT_EMPTY_PATH makes it describe the fd's own inode.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(format!("statx failed: {}", io::Error::last_os_error()));
    }
    let dev = (stx.stx_dev_major, stx.stx_dev_minor);
    if dev != expected {
        return Err(format!(
            "it is another FUSE mount: device {}:{}, this mount's is {}:{}",
            dev.0, dev.1, expected.0, expected.1
        ));
    }
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if stx.stx_attributes_mask & root != 0 && stx.stx_attributes & root == 0 {
        return Err("it is a directory inside this mount, not its root".into());
    }
    Ok(())
}

fn apply(
    fs: &PassthroughFs,
    steps: &[Step],
    progress: &mut dyn FnMut(usize, usize),
) -> io::Result<()> {
    let changer = Changer::new(fs);
    let total = steps.len();
    let mut done = 0;
    let mut step_done = || {
        done += 1;
        progress(done, total);
    };
    // Removals deepest first, so directories are empty when their turn comes.
    let mut removals: Vec<&Step> = steps
        .iter()
        .filter(|s| matches!(s, Step::Remove { .. }))
        .collect();
    removals.sort_by(|a, b| b.path().cmp(a.path()));
    let at = |path: &str, e: io::Error| sys::context(quote_name(path), e);
    for s in removals {
        if let Step::Remove { path, kind } = s {
            changer.remove(path, *kind).map_err(|e| at(path, e))?;
        }
        step_done();
    }
    // Creations and rewrites shallowest first, so parents exist.
    let mut writes: Vec<&Step> = steps
        .iter()
        .filter(|s| !matches!(s, Step::Remove { .. }))
        .collect();
    writes.sort_by(|a, b| a.path().cmp(b.path()));
    let mut dirs_meta: Vec<(&str, &ViewEntry)> = Vec::new();
    // Names recorded as one hard-linked file (format 4, `EntryMeta::link`): the first
    // restored is written, the others are linked to it.
    let mut linked: HashMap<LinkGroup, &str> = HashMap::new();
    for s in writes {
        match s {
            Step::Create { path, target } | Step::Rewrite { path, target } => {
                let create = matches!(s, Step::Create { .. });
                let group = link_group(target);
                let first = group.as_ref().and_then(|g| linked.get(g).copied());
                let made_link = match first {
                    Some(first) => changer
                        .link(first, path, !create)
                        .map_err(|e| at(path, e))?,
                    None => false,
                };
                if !made_link {
                    changer
                        .write_entry(path, target, create)
                        .map_err(|e| at(path, e))?;
                    if let Some(g) = group {
                        linked.entry(g).or_insert(path.as_str());
                    }
                }
                if target.meta.kind == EntryKind::Dir {
                    dirs_meta.push((path, target));
                } else {
                    changer.set_meta(path, target).map_err(|e| at(path, e))?;
                }
            }
            Step::Metadata { path, target } => {
                if target.meta.kind == EntryKind::Dir {
                    dirs_meta.push((path, target));
                } else {
                    changer.set_meta(path, target).map_err(|e| at(path, e))?;
                }
            }
            Step::Remove { .. } => {}
        }
        step_done();
    }
    // Directory modes and times last, deepest first: filling a directory changes its mtime,
    // and a read-only mode set early would stop the filling.
    dirs_meta.sort_by(|a, b| b.0.cmp(a.0));
    for (path, target) in dirs_meta {
        changer.set_meta(path, target).map_err(|e| at(path, e))?;
    }
    Ok(())
}

/// What makes restored names one file again: the object they were (`st_dev`, `st_ino`)
/// and the content they had, as their versions recorded it.
type LinkGroup = (u64, u64, String);

/// The link group of a regular file's target, if it was recorded as hard-linked.
fn link_group(target: &ViewEntry) -> Option<LinkGroup> {
    let link = target.meta.link?;
    match (&target.meta.kind, &target.content) {
        (EntryKind::File, ViewContent::Object(object)) => {
            Some((link.dev, link.ino, object.clone()))
        }
        _ => None,
    }
}

/// Makes a rewind's changes in the daemon itself, through the passthrough core's own
/// operations (lookup, unlink, mkdir, create, write, setattr...): each passes the gate, so
/// Layer 1 backs up what it changes exactly as for the same request through the mount, and
/// the rewind is recorded and can be undone. None of them goes through the daemon's own
/// mount, so a rewind never waits on a FUSE request that only this daemon could answer.
///
/// Paths are resolved by lookups from the root inode, one component at a time: a lookup
/// never follows a symlink, and a symlink (or anything but a directory) met on the way ends
/// the walk with ENOTDIR, so a rewind cannot be led out of the tree by a symlink planted in
/// it; the gate refuses (ESTALE) an object someone moved out of SRC meanwhile. What is found
/// is checked against the plan before it is changed. The kernel is told about every change:
/// its entry and attribute caches last a day.
///
/// On a mount for an `--owner`, the rewind is that user's: every operation runs with the
/// owner's fs ids ([`Changer::as_caller`]), so SRC's filesystem checks each change as the
/// owner's own, as the kernel checked the owner's requests through the mount; Layer 1 and
/// the store stay the daemon's (`FsCredsGuard::as_daemon` in the history).
struct Changer<'a> {
    fs: &'a PassthroughFs,
    history: &'a History,
    caller: Caller,
}

/// The lookup references a change took on the core's inodes, given back (FORGET) when it
/// is done, as the kernel does with its own.
struct Looked<'a> {
    fs: &'a PassthroughFs,
    refs: Vec<u64>,
}

impl Looked<'_> {
    fn keep(&mut self, e: &Entry) -> u64 {
        self.refs.push(e.attr.ino.0);
        e.attr.ino.0
    }
}

impl Drop for Looked<'_> {
    fn drop(&mut self) {
        for &ino in &self.refs {
            self.fs.forget(ino, 1);
        }
    }
}

/// `e` from `doing` (removing, setting...) xattr `name`, naming it.
fn xattr_context(name: &[u8], doing: &str, e: io::Error) -> io::Error {
    sys::context(format!("{doing} xattr {}", quote_bytes(name)), e)
}

fn is_errno(e: &io::Error, code: i32) -> bool {
    e.raw_os_error() == Some(code)
}

impl<'a> Changer<'a> {
    fn new(fs: &'a PassthroughFs) -> Changer<'a> {
        let caller = match fs.owner() {
            Some(owner) => Caller {
                pid: std::process::id(),
                uid: owner.uid,
                gid: owner.gid,
            },
            None => Caller::daemon(),
        };
        Changer {
            fs,
            history: fs.history(),
            caller,
        }
    }

    /// Runs one operation of the core with the caller's fs ids (see the type's docs).
    fn as_caller<R>(&self, op: impl FnOnce() -> R) -> R {
        let _creds = FsCredsGuard::switch(self.caller.uid, self.caller.gid);
        op()
    }

    fn looked(&self) -> Looked<'a> {
        Looked {
            fs: self.fs,
            refs: Vec::new(),
        }
    }

    /// The inode of the directory `rel` ("" for the root).
    fn dir(&self, rel: &str, looked: &mut Looked<'_>) -> io::Result<u64> {
        let mut ino = ROOT_INO;
        for name in rel.split('/').filter(|c| !c.is_empty()) {
            if ino == ROOT_INO && name.as_bytes() == CONTROL_DIR_NAME {
                return Err(errno(libc::EPERM));
            }
            let e = self.as_caller(|| self.fs.lookup(ino, OsStr::new(name)))?;
            ino = looked.keep(&e);
            if e.attr.kind != FileType::Directory {
                return Err(errno(libc::ENOTDIR));
            }
        }
        Ok(ino)
    }

    /// `rel`'s parent directory inode and its last component. A name with a NUL byte is a
    /// clear error, never an empty name (whose ENOENT would read as success).
    fn parent<'r>(&self, rel: &'r str, looked: &mut Looked<'_>) -> io::Result<(u64, &'r OsStr)> {
        let (parent, name) = split_parent(rel);
        if name.is_empty() || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot rewind {rel:?}: not a name"),
            ));
        }
        Ok((self.dir(parent, looked)?, OsStr::new(name)))
    }

    /// The kernel forgets what it knew of `name` in `parent`, and of `parent` itself (its
    /// mtime, its size, a cached listing).
    fn tell_kernel_entry(&self, parent: u64, name: &OsStr) {
        self.fs.kernel_forget_entry(parent, name);
        self.fs.kernel_forget_inode(parent, true);
    }

    /// Creates the directories above `rel` that are missing now and were directories at
    /// checkpoint `k` (shallowest first); stops at the first that was not.
    fn make_parents(&self, rel: &str, k: usize) -> io::Result<()> {
        let mut end = 0;
        while let Some(i) = rel[end..].find('/') {
            end += i;
            let dir = &rel[..end];
            end += 1;
            if self.history.current_meta(dir)?.is_some() {
                continue;
            }
            match self.history.view_entry(k, dir.as_bytes())? {
                Some(target) if target.meta.kind == EntryKind::Dir => {
                    self.write_entry(dir, &target, true)?;
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// Renames `from` to `to` with `flags`, through the core (the gate records it).
    fn rename(&self, from: &str, to: &str, flags: u32) -> io::Result<()> {
        let mut looked = self.looked();
        let (parent, name) = self.parent(from, &mut looked)?;
        let (new_parent, new_name) = self.parent(to, &mut looked)?;
        self.as_caller(|| {
            self.fs
                .rename(&self.caller, parent, name, new_parent, new_name, flags)
        })?;
        self.tell_kernel_entry(parent, name);
        self.tell_kernel_entry(new_parent, new_name);
        Ok(())
    }

    fn remove(&self, rel: &str, kind: EntryKind) -> io::Result<()> {
        let mut looked = self.looked();
        let (parent, name) = match self.parent(rel, &mut looked) {
            Ok(found) => found,
            // Its parent is gone already: nothing left to remove.
            Err(e) if is_errno(&e, libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let unlink = || {
            self.as_caller(|| {
                if kind == EntryKind::Dir {
                    self.fs.rmdir(&self.caller, parent, name)
                } else {
                    self.fs.unlink(&self.caller, parent, name)
                }
            })
        };
        let result = match unlink() {
            Err(e) if is_errno(&e, libc::ENOTEMPTY) => {
                // Something the plan does not remove lives inside a directory that did not
                // exist at the checkpoint: what the history holds goes with it (removed as
                // any other step, so recorded and undone by `:before-rewind`). What it
                // does not hold (excluded, or a name that is not UTF-8) was refused by the
                // check; one that appeared since stays, and the rmdir below fails on it.
                let names = list_dir(self.history, rel)?
                    .into_iter()
                    .filter_map(|(n, t)| {
                        let n = String::from_utf8(n).ok()?;
                        (!self.history.is_excluded(&format!("{rel}/{n}"), None)).then_some((n, t))
                    });
                for (n, t) in names {
                    let k = if t == libc::DT_DIR {
                        EntryKind::Dir
                    } else {
                        EntryKind::File
                    };
                    self.remove(&format!("{rel}/{n}"), k)?;
                }
                unlink()
            }
            Err(e) if is_errno(&e, libc::ENOENT) => Ok(()),
            other => other,
        };
        self.tell_kernel_entry(parent, name);
        result
    }

    /// Makes `rel` a hard link to `existing` (restored just before it), replacing what is
    /// at `rel` when `replace`. Returns false, having changed nothing, when the link cannot
    /// be made (EMLINK, EXDEV, EPERM under protected_hardlinks...): the caller writes the
    /// file instead, with the same content, as a file of its own.
    fn link(&self, existing: &str, rel: &str, replace: bool) -> io::Result<bool> {
        let mut looked = self.looked();
        let (existing_parent, existing_name) = self.parent(existing, &mut looked)?;
        let found = self.as_caller(|| self.fs.lookup(existing_parent, existing_name))?;
        let ino = looked.keep(&found);
        let (parent, name) = self.parent(rel, &mut looked)?;
        if replace {
            match self.as_caller(|| self.fs.unlink(&self.caller, parent, name)) {
                Ok(()) => {}
                Err(e) if is_errno(&e, libc::ENOENT) => {}
                Err(e) => return Err(e),
            }
            self.tell_kernel_entry(parent, name);
        }
        match self.as_caller(|| self.fs.link(&self.caller, ino, parent, name)) {
            Ok(entry) => {
                looked.keep(&entry);
                self.tell_kernel_entry(parent, name);
                // Its link count changed.
                self.fs.kernel_forget_inode(ino, true);
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMLINK | libc::EXDEV | libc::EPERM)
                ) =>
            {
                warn!(
                    "rewind: {} restored as a file of its own, not as a link to {}: {e}",
                    quote_name(rel),
                    quote_name(existing)
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn write_entry(&self, rel: &str, target: &ViewEntry, create: bool) -> io::Result<()> {
        let mut looked = self.looked();
        let (parent, name) = self.parent(rel, &mut looked)?;
        let m = &target.meta;
        let result = match m.kind {
            EntryKind::Dir => {
                match self.as_caller(|| self.fs.mkdir(&self.caller, parent, name, 0o700, 0)) {
                    Ok(e) => {
                        looked.keep(&e);
                        Ok(())
                    }
                    Err(e) if is_errno(&e, libc::EEXIST) && !create => Ok(()),
                    Err(e) => Err(e),
                }
            }
            EntryKind::File => {
                self.unshare(parent, name, create, &mut looked)?;
                self.write_file(parent, name, target, &mut looked)
            }
            EntryKind::Symlink => {
                let link_target = self.history.view_symlink_target(target)?;
                self.as_caller(|| {
                    if !create {
                        // Best effort: what is there is replaced, and if it cannot be
                        // removed the symlink's creation below says why.
                        let _ = self.fs.unlink(&self.caller, parent, name);
                    }
                    self.fs.symlink(
                        &self.caller,
                        parent,
                        name,
                        Path::new(OsStr::from_bytes(&link_target)),
                    )
                })
                .map(|e| {
                    looked.keep(&e);
                })
            }
            EntryKind::Fifo
            | EntryKind::Socket
            | EntryKind::CharDevice
            | EntryKind::BlockDevice => {
                let t = match m.kind {
                    EntryKind::Fifo => libc::S_IFIFO,
                    EntryKind::Socket => libc::S_IFSOCK,
                    EntryKind::CharDevice => libc::S_IFCHR,
                    _ => libc::S_IFBLK,
                };
                self.as_caller(|| {
                    self.fs.mknod(
                        &self.caller,
                        parent,
                        name,
                        t | (m.mode & 0o777),
                        0,
                        m.rdev.unwrap_or(0),
                    )
                })
                .map(|e| {
                    looked.keep(&e);
                })
            }
        };
        self.tell_kernel_entry(parent, name);
        result
    }

    /// Before a file is rewritten in place: if `name` in `parent` is one of several links
    /// of a file, unlink it, so that the rewrite changes this name only (writing through it
    /// would change the other names too, which the plan restores on their own).
    fn unshare(
        &self,
        parent: u64,
        name: &OsStr,
        create: bool,
        looked: &mut Looked<'_>,
    ) -> io::Result<()> {
        if create {
            return Ok(());
        }
        let found = match self.as_caller(|| self.fs.lookup(parent, name)) {
            Ok(found) => found,
            Err(e) if is_errno(&e, libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        looked.keep(&found);
        if found.attr.kind != FileType::RegularFile || found.attr.nlink <= 1 {
            return Ok(());
        }
        self.as_caller(|| self.fs.unlink(&self.caller, parent, name))?;
        self.tell_kernel_entry(parent, name);
        self.fs.kernel_forget_inode(found.attr.ino.0, true);
        Ok(())
    }

    /// Creates (or truncates) `name` in `parent` and writes the target's content into it,
    /// data extents only, so a sparse file comes back sparse (and a hole costs no writes).
    fn write_file(
        &self,
        parent: u64,
        name: &OsStr,
        target: &ViewEntry,
        looked: &mut Looked<'_>,
    ) -> io::Result<()> {
        let content = self.history.view_open(target)?;
        // The core opens with O_NOFOLLOW: a symlink at `name` fails with ELOOP.
        let (entry, opened) = self.as_caller(|| {
            self.fs.create_unbacked(
                &self.caller,
                parent,
                name,
                0o600,
                libc::O_WRONLY | libc::O_TRUNC,
            )
        })?;
        let ino = looked.keep(&entry);
        let written = self.copy_extents(&content, ino, opened.fh);
        self.fs.release(opened.fh);
        self.fs.kernel_forget_inode(ino, true);
        written
    }

    fn copy_extents(&self, content: &File, ino: u64, fh: u64) -> io::Result<()> {
        let len = content.metadata()?.len();
        let mut buf = vec![0u8; 1 << 20];
        let mut end = 0;
        let mut off = 0;
        while off < len {
            let data = match sys::lseek(content.as_fd(), off as i64, libc::SEEK_DATA) {
                Ok(d) => d as u64,
                Err(e) if is_errno(&e, libc::ENXIO) => break,
                Err(e) => return Err(e),
            };
            let hole = sys::lseek(content.as_fd(), data as i64, libc::SEEK_HOLE)? as u64;
            let mut at = data;
            while at < hole {
                let want = ((hole - at) as usize).min(buf.len());
                let n = sys::pread(content.as_fd(), &mut buf[..want], at)?;
                if n == 0 {
                    break;
                }
                let mut done = 0;
                while done < n {
                    let w = self.fs.write(
                        &self.caller,
                        ino,
                        fh,
                        at + done as u64,
                        &buf[done..n],
                        false,
                        None,
                    )? as usize;
                    if w == 0 {
                        return Err(errno(libc::EIO));
                    }
                    done += w;
                }
                at += n as u64;
            }
            end = at;
            off = hole;
        }
        if end < len {
            // A trailing hole: the length says where the file ends.
            let size = SetAttr {
                size: Some(len),
                fh: Some(fh),
                ..SetAttr::default()
            };
            self.as_caller(|| self.fs.setattr(&self.caller, ino, size))?;
        }
        Ok(())
    }

    /// Makes the recorded xattrs of inode `ino` the set stored as `name` (`""`: none):
    /// removes the recorded names it has and the set lacks, sets those that differ. Names
    /// not recorded (`security.selinux`...) are left alone.
    fn set_xattrs(&self, ino: u64, name: &str) -> io::Result<()> {
        let target = if name.is_empty() {
            Default::default()
        } else {
            self.history.xattrs_of(name)?
        };
        let listed = xattrs::read_growing(|buf| self.as_caller(|| self.fs.listxattr(ino, buf)))?;
        for have in listed.split(|&b| b == 0).filter(|n| xattrs::is_recorded(n)) {
            if !target.contains_key(have) {
                let os = OsStr::from_bytes(have);
                match self.as_caller(|| self.fs.removexattr(&self.caller, ino, os)) {
                    Err(e) if !is_errno(&e, libc::ENODATA) => {
                        return Err(xattr_context(have, "removing", e));
                    }
                    _ => {}
                }
            }
        }
        for (n, value) in &target {
            let os = OsStr::from_bytes(n);
            let same =
                match xattrs::read_growing(|buf| self.as_caller(|| self.fs.getxattr(ino, os, buf)))
                {
                    Ok(v) => v == *value,
                    Err(e) if is_errno(&e, libc::ENODATA) => false,
                    Err(e) => return Err(xattr_context(n, "reading", e)),
                };
            if !same {
                self.as_caller(|| self.fs.setxattr(&self.caller, ino, os, value, 0))
                    .map_err(|e| xattr_context(n, "setting", e))?;
            }
        }
        Ok(())
    }

    /// Owner, mode and mtime of `rel` as the target has them, on the object found there if
    /// it is of the planned type (else it is left alone, with an error).
    fn set_meta(&self, rel: &str, target: &ViewEntry) -> io::Result<()> {
        let m = &target.meta;
        let mut looked = self.looked();
        let (parent, name) = self.parent(rel, &mut looked)?;
        let e = self.as_caller(|| self.fs.lookup(parent, name))?;
        let ino = looked.keep(&e);
        if e.attr.kind != file_type_of(m.kind) {
            return Err(io::Error::other(format!(
                "{rel}: changed type during the rewind, left alone"
            )));
        }
        // The owner first: a chown clears setuid/setgid, which the mode then restores.
        let owner = SetAttr {
            uid: Some(m.uid),
            gid: Some(m.gid),
            ..SetAttr::default()
        };
        match self.as_caller(|| self.fs.setattr(&self.caller, ino, owner)) {
            // A daemon that may not chown (a normal user's mount) keeps the owner it has.
            Err(e) if !is_errno(&e, libc::EPERM) => return Err(e),
            _ => {}
        }
        // After the owner (a chown drops a file capability), before the mode (an access ACL
        // sets the group bits, which the recorded mode then states exactly).
        if let Some(name) = &m.xattrs {
            self.set_xattrs(ino, name)?;
        }
        let mtime = UNIX_EPOCH + Duration::new(m.mtime_sec.max(0) as u64, m.mtime_nsec);
        let rest = SetAttr {
            // A symlink has no mode of its own.
            mode: (m.kind != EntryKind::Symlink).then_some(m.mode),
            mtime: Some(TimeOrNow::SpecificTime(mtime)),
            ..SetAttr::default()
        };
        let result = self
            .as_caller(|| self.fs.setattr(&self.caller, ino, rest))
            .map(drop);
        self.fs.kernel_forget_inode(ino, false);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stored_regular_files_recorded_as_linked_have_a_link_group() {
        use crate::transcript::record::{EntryMeta, LinkMeta};
        let entry = |kind, link, content| ViewEntry {
            meta: EntryMeta {
                kind,
                link,
                ..crate::transcript::testutil::dir_meta()
            },
            content,
        };
        let link = Some(LinkMeta {
            dev: 7,
            ino: 42,
            nlink: 2,
        });
        let object = || ViewContent::Object("ab".repeat(32));
        assert_eq!(
            link_group(&entry(EntryKind::File, link, object())),
            Some((7, 42, "ab".repeat(32)))
        );
        // Same object, other content: another group.
        assert_ne!(
            link_group(&entry(EntryKind::File, link, object())),
            link_group(&entry(
                EntryKind::File,
                link,
                ViewContent::Object("cd".repeat(32))
            ))
        );
        assert_eq!(link_group(&entry(EntryKind::File, None, object())), None);
        assert_eq!(link_group(&entry(EntryKind::Symlink, link, object())), None);
        assert_eq!(
            link_group(&entry(EntryKind::File, link, ViewContent::Live("a".into()))),
            None
        );
    }

    #[test]
    fn suggested_commands_are_shell_words() {
        assert_eq!(shell_word("/tmp/my project"), "'/tmp/my project'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("cc-2025:01@x/a.txt"), "cc-2025:01@x/a.txt");
        assert_eq!(shell_word("x\nD README.md"), r"$'x\012D README.md'");
        assert_eq!(shell_word("a'\x1b"), r"$'a\'\033'");
        let opts = RewindOptions {
            rewind_agent_state: true,
            ..Default::default()
        };
        assert_eq!(
            session_rewind_command(
                std::path::Path::new("/tmp/my project"),
                "m1",
                &opts,
                "aaaaaaaa",
                true,
                &["a b.txt".to_string(), "c".to_string()],
            ),
            "checkpointfs rewind '/tmp/my project' m1 --session aaaaaaaa --force \
             --rewind-agent-state -- 'a b.txt' c"
        );
    }

    #[test]
    fn a_plain_directory_is_not_a_mount_root() {
        let dir = tempfile::tempdir().unwrap();
        let fd = File::open(dir.path()).unwrap();
        let why = verify_mount_root(fd.as_fd(), (0, 1)).unwrap_err();
        assert!(why.starts_with("it is not a FUSE mount"), "{why}");
    }
}
