//! The merge engine on real directories, against real git: trees built in temp dirs, the
//! plan applied to a plain copy of ours, results compared byte for byte.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build their trees in temp dirs and apply plans to them, never SRC"
)]
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

const NAME: &str = "agent-a";

/// A small deterministic generator (xorshift64*): the same trees on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A mount-like layout: `mnt/` is ours, the branch is served at
/// `mnt/.checkpoint/branches/NAME/` (so the commands a conflict proposes run as they
/// would on a real mount), base beside them.
struct Layout {
    _dir: tempfile::TempDir,
    base: PathBuf,
    mnt: PathBuf,
    theirs: PathBuf,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let mnt = dir.path().join("mnt");
        let theirs = mnt.join(BRANCHES_DIR).join(NAME);
        fs::create_dir_all(&base).unwrap();
        fs::create_dir_all(&theirs).unwrap();
        Layout {
            _dir: dir,
            base,
            mnt,
            theirs,
        }
    }

    /// Copies base to ours and theirs (both start as the fork point).
    fn fork(&self) {
        for to in [&self.mnt, &self.theirs] {
            let st = Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", self.base.display()))
                .arg(to)
                .status()
                .unwrap();
            assert!(st.success());
        }
    }

    fn plan(&self, mode: ConflictMode) -> Result<MergeOutcome, MergeError> {
        let base = DirTree::open(Side::Base, &self.base)?;
        let ours = DirTree::open(Side::Ours, &self.mnt)?;
        let theirs = DirTree::open(Side::Theirs, &self.theirs)?;
        let changed_ours = changed(&self.base, &self.mnt);
        let changed_theirs = changed(&self.base, &self.theirs);
        plan_merge(&MergeInput {
            base: &base,
            ours: &ours,
            theirs: &theirs,
            changed_ours: &changed_ours,
            changed_theirs: &changed_theirs,
            branch: NAME,
            mount: &self.mnt,
            mode,
        })
    }

    /// Applies `plan` to ours, as the gate will (content from theirs where the plan says).
    fn apply(&self, plan: &MergePlan) {
        apply(plan, &self.mnt, &self.theirs);
    }
}

/// Every entry of `root` (not `.checkpoint`), with its type, mode and content.
fn snapshot(root: &Path) -> BTreeMap<String, (NodeKind, u32, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if rel.is_empty() && name == ".checkpoint" {
                continue;
            }
            let path = child(&rel, &name);
            let md = fs::symlink_metadata(e.path()).unwrap();
            let mode = md.permissions().mode() & 0o7777;
            let entry = if md.file_type().is_symlink() {
                let t = fs::read_link(e.path()).unwrap();
                (
                    NodeKind::Symlink,
                    0,
                    t.into_os_string().into_encoded_bytes(),
                )
            } else if md.is_dir() {
                stack.push(path.clone());
                (NodeKind::Dir, mode, Vec::new())
            } else {
                (NodeKind::File, mode, fs::read(e.path()).unwrap())
            };
            out.insert(path, entry);
        }
    }
    out
}

/// The paths whose entry differs between `base` and `side` (what Layer 1 or a branch's
/// copy-on-write layer records).
fn changed(base: &Path, side: &Path) -> BTreeSet<String> {
    let (a, b) = (snapshot(base), snapshot(side));
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

fn apply(plan: &MergePlan, ours: &Path, theirs: &Path) {
    for c in &plan.changes {
        let at = ours.join(c.path());
        let content = |content: &Content| match content {
            Content::Theirs => fs::read(theirs.join(c.path())).unwrap(),
            Content::Bytes(b) => b.clone(),
            Content::None => Vec::new(),
        };
        match c {
            Change::Remove { kind, .. } => {
                if *kind == NodeKind::Dir {
                    fs::remove_dir(&at).unwrap();
                } else {
                    fs::remove_file(&at).unwrap();
                }
            }
            Change::Create {
                node,
                content: body,
                ..
            } => match node.kind {
                NodeKind::Dir => {
                    fs::create_dir(&at).unwrap();
                    fs::set_permissions(&at, fs::Permissions::from_mode(node.mode)).unwrap();
                }
                NodeKind::Symlink => {
                    symlink(fs::read_link(theirs.join(c.path())).unwrap(), &at).unwrap()
                }
                NodeKind::File => {
                    fs::write(&at, content(body)).unwrap();
                    fs::set_permissions(&at, fs::Permissions::from_mode(node.mode)).unwrap();
                }
                NodeKind::Special => panic!("no special files in these tests"),
            },
            Change::Rewrite {
                mode,
                content: body,
                ..
            } => {
                if fs::symlink_metadata(&at).unwrap().file_type().is_symlink() {
                    fs::remove_file(&at).unwrap();
                    symlink(fs::read_link(theirs.join(c.path())).unwrap(), &at).unwrap();
                } else {
                    fs::write(&at, content(body)).unwrap();
                    fs::set_permissions(&at, fs::Permissions::from_mode(*mode)).unwrap();
                }
            }
            Change::Chmod { mode, .. } => {
                fs::set_permissions(&at, fs::Permissions::from_mode(*mode)).unwrap()
            }
        }
    }
}

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

fn chmod(root: &Path, rel: &str, mode: u32) {
    fs::set_permissions(root.join(rel), fs::Permissions::from_mode(mode)).unwrap();
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = run(Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args));
    String::from_utf8(out.stdout).unwrap()
}

/// `git merge-file -p [-L main -L base -L NAME] ours base theirs`: the expected bytes, and
/// whether git saw conflicts.
fn git_merge_file(ours: &[u8], base: &[u8], theirs: &[u8], labels: bool) -> (Vec<u8>, bool) {
    let dir = tempfile::tempdir().unwrap();
    let files = [("o", ours), ("b", base), ("t", theirs)];
    for (n, d) in files {
        fs::write(dir.path().join(n), d).unwrap();
    }
    let mut cmd = Command::new("git");
    cmd.current_dir(dir.path()).args(["merge-file", "-p"]);
    if labels {
        cmd.args(["-L", "main", "-L", "base", "-L", NAME]);
    }
    let out = cmd.args(["o", "b", "t"]).output().unwrap();
    let code = out.status.code().unwrap();
    assert!((0..127).contains(&code), "git merge-file failed: {out:?}");
    (out.stdout, code > 0)
}

/// A base text of `n` distinct lines.
fn base_text(rng: &mut Rng, file: usize, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("file {file} line {i}: value {}\n", rng.below(1_000_000)))
        .collect()
}

/// `lines` with the block `[at, at + len)` replaced by `by` new lines (tagged `tag`).
fn edit(
    lines: &[String],
    at: usize,
    len: usize,
    by: usize,
    tag: &str,
    rng: &mut Rng,
) -> Vec<String> {
    let mut out = lines[..at].to_vec();
    for j in 0..by {
        out.push(format!("{tag} edit {j}: {}\n", rng.below(1_000_000)));
    }
    out.extend_from_slice(&lines[at + len..]);
    out
}

#[test]
fn clean_merge_of_1000_text_files_equals_git_merge_file() {
    let l = Layout::new();
    let mut rng = Rng(0x5eed_0001);
    let n = 1000;
    let mut texts = Vec::new();
    for f in 0..n {
        let len = 30 + rng.below(40);
        let base = base_text(&mut rng, f, len);
        // Ours edits the first half, theirs the second, at least two lines apart (lines
        // touching or adjacent edits are conflicts to git).
        let half = base.len() / 2;
        let (oa, ol) = (rng.below(half - 4), 1 + rng.below(3));
        let (ta, tl) = (half + 1 + rng.below(half - 5), 1 + rng.below(3));
        let ours = edit(&base, oa, ol, rng.below(4), "ours", &mut rng);
        let theirs = edit(
            &base,
            ta,
            tl.min(base.len() - ta),
            rng.below(4),
            "theirs",
            &mut rng,
        );
        // Some files end without a newline, some edits delete only.
        let strip = |v: Vec<String>, cut: bool| {
            let mut s = v.concat().into_bytes();
            if cut {
                s.pop();
            }
            s
        };
        let cut = f % 7 == 0;
        texts.push((
            format!("d{}/f{f}.txt", f % 13),
            strip(base, cut),
            strip(ours, cut),
            strip(theirs, cut),
        ));
    }
    for (p, b, _, _) in &texts {
        write(&l.base, p, b);
    }
    l.fork();
    for (p, _, o, t) in &texts {
        write(&l.mnt, p, o);
        write(&l.theirs, p, t);
    }
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(outcome.conflicts, vec![], "no conflicts");
    assert!(!outcome.refused);
    assert_eq!(outcome.plan.changes.len(), n);
    l.apply(&outcome.plan);
    for (p, b, o, t) in &texts {
        let (expected, conflicted) = git_merge_file(o, b, t, false);
        assert!(!conflicted, "git sees no conflict in {p}");
        assert_eq!(
            fs::read(l.mnt.join(p)).unwrap(),
            expected,
            "{p} equals git merge-file's"
        );
    }
}

/// A file's base, ours and theirs.
type Versions = (Vec<u8>, Vec<u8>, Vec<u8>);

/// Base, ours and theirs of a file both sides changed on overlapping lines, in `count`
/// separate places.
fn conflicting(rng: &mut Rng, f: usize, count: usize) -> Versions {
    let base = base_text(rng, f, 12 * count + 4);
    let (mut ours, mut theirs) = (base.clone(), base.clone());
    // Edit from the end so the earlier positions stay put.
    for k in (0..count).rev() {
        let at = 12 * k + 2 + rng.below(4);
        let len = 1 + rng.below(3);
        ours = edit(&ours, at, len, 1 + rng.below(3), "ours", rng);
        theirs = edit(
            &theirs,
            at + rng.below(len),
            1,
            1 + rng.below(3),
            "theirs",
            rng,
        );
    }
    (
        base.concat().into_bytes(),
        ours.concat().into_bytes(),
        theirs.concat().into_bytes(),
    )
}

#[test]
fn overlapping_edits_are_refused_with_nothing_planned() {
    let l = Layout::new();
    let mut rng = Rng(0x5eed_0002);
    let (b, o, t) = conflicting(&mut rng, 0, 2);
    write(&l.base, "src/lib.rs", &b);
    write(&l.base, "clean.txt", b"one\n");
    l.fork();
    write(&l.mnt, "src/lib.rs", &o);
    write(&l.theirs, "src/lib.rs", &t);
    write(&l.theirs, "clean.txt", b"two\n");
    let before = snapshot(&l.mnt);
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert!(outcome.refused);
    assert_eq!(
        outcome.plan.changes,
        vec![],
        "a refused merge changes nothing"
    );
    assert_eq!(outcome.conflicts.len(), 1);
    let c = &outcome.conflicts[0];
    assert_eq!(
        (c.path.as_str(), &c.kind),
        ("src/lib.rs", &ConflictKind::Text)
    );
    assert_eq!(c.hunks.len(), 2, "both regions reported: {:?}", c.hunks);
    for h in &c.hunks {
        let has = |side: &[u8], what: &str| String::from_utf8_lossy(side).contains(what);
        assert!(
            has(&h.ours, "ours edit") && !has(&h.ours, "theirs"),
            "{h:?}"
        );
        assert!(
            has(&h.theirs, "theirs edit") && !has(&h.theirs, "ours"),
            "{h:?}"
        );
    }
    assert!(!c.markers);
    let text = render_text(&outcome, NAME, ConflictMode::Refuse);
    assert!(text.contains("refused"), "{text}");
    assert!(text.contains("CONFLICT src/lib.rs"), "{text}");
    assert!(text.contains("--conflicts markers"), "{text}");
    let json: serde_json::Value =
        serde_json::from_str(&render_json(&outcome, NAME, ConflictMode::Refuse)).unwrap();
    assert_eq!(json["refused"], true);
    assert_eq!(json["conflicts"][0]["kind"], "text");
    assert_eq!(json["conflicts"][0]["hunks"].as_array().unwrap().len(), 2);
    assert_eq!(snapshot(&l.mnt), before);
}

#[test]
fn markers_equal_git_merge_file_and_git_diff_check_flags_them() {
    let l = Layout::new();
    let mut rng = Rng(0x5eed_0003);
    let files: Vec<(String, Versions)> = (0..50)
        .map(|f| (format!("f{f}.txt"), conflicting(&mut rng, f, 1 + f % 3)))
        .collect();
    for (p, (b, _, _)) in &files {
        write(&l.base, p, b);
    }
    l.fork();
    for (p, (_, o, t)) in &files {
        write(&l.mnt, p, o);
        write(&l.theirs, p, t);
    }
    git(&l.mnt, &["init", "-q"]);
    git(&l.mnt, &["add", "."]);
    git(&l.mnt, &["commit", "-qm", "ours"]);
    let outcome = l.plan(ConflictMode::Markers).unwrap();
    assert!(!outcome.refused);
    assert_eq!(outcome.conflicts.len(), files.len());
    assert!(outcome.conflicts.iter().all(|c| c.markers));
    l.apply(&outcome.plan);
    for (p, (b, o, t)) in &files {
        let (expected, conflicted) = git_merge_file(o, b, t, true);
        assert!(conflicted);
        let got = fs::read(l.mnt.join(p)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&expected),
            "{p}: markers as git merge-file writes them"
        );
    }
    let check = Command::new("git")
        .arg("-C")
        .arg(&l.mnt)
        .args(["diff", "--check"])
        .output()
        .unwrap();
    assert!(
        !check.status.success(),
        "git diff --check flags the markers"
    );
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(report.contains("leftover conflict marker"), "{report}");
}

#[test]
fn one_side_changes_are_taken_whole() {
    let l = Layout::new();
    write(&l.base, "keep.txt", b"keep\n");
    write(&l.base, "gone.txt", b"gone\n");
    write(&l.base, "tree/a/1.txt", b"1\n");
    write(&l.base, "tree/a/2.txt", b"2\n");
    write(&l.base, "tree/b.txt", b"b\n");
    write(&l.base, "script.sh", b"#!/bin/sh\n");
    write(&l.base, "was-file", b"file\n");
    write(&l.base, "was-dir/x", b"x\n");
    symlink("keep.txt", l.base.join("link")).unwrap();
    write(&l.base, "ours-only.txt", b"base\n");
    l.fork();
    // Theirs: adds, deletes (a file and a subtree), a mode, a symlink, two type changes.
    write(&l.theirs, "new/deep/dir/file.txt", b"new\n");
    write(&l.theirs, "added.bin", b"\0\x01binary");
    fs::remove_file(l.theirs.join("gone.txt")).unwrap();
    fs::remove_dir_all(l.theirs.join("tree")).unwrap();
    chmod(&l.theirs, "script.sh", 0o755);
    fs::remove_file(l.theirs.join("link")).unwrap();
    symlink("script.sh", l.theirs.join("link")).unwrap();
    fs::remove_file(l.theirs.join("was-file")).unwrap();
    write(&l.theirs, "was-file/now-dir.txt", b"d\n");
    fs::remove_dir_all(l.theirs.join("was-dir")).unwrap();
    symlink("keep.txt", l.theirs.join("was-dir")).unwrap();
    // Ours: its own change elsewhere, kept.
    write(&l.mnt, "ours-only.txt", b"ours\n");
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(outcome.conflicts, vec![]);
    // Removals come first, deepest first; creations after, shallowest first.
    let removals: Vec<&str> = outcome
        .plan
        .changes
        .iter()
        .take_while(|c| matches!(c, Change::Remove { .. }))
        .map(Change::path)
        .collect();
    assert_eq!(
        removals,
        [
            "was-file",
            "was-dir/x",
            "was-dir",
            "tree/b.txt",
            "tree/a/2.txt",
            "tree/a/1.txt",
            "tree/a",
            "tree",
            "gone.txt"
        ]
    );
    let creations: Vec<&str> = outcome.plan.changes[removals.len()..]
        .iter()
        .map(Change::path)
        .collect();
    let mut sorted = creations.clone();
    sorted.sort();
    assert_eq!(creations, sorted);
    l.apply(&outcome.plan);
    let mut expected = snapshot(&l.theirs);
    expected.insert(
        "ours-only.txt".into(),
        (NodeKind::File, 0o644, b"ours\n".to_vec()),
    );
    let got = snapshot(&l.mnt);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>()
    );
    for (k, v) in &expected {
        // The test's umask decides new files' modes in both trees alike.
        assert_eq!((&got[k].0, &got[k].2), (&v.0, &v.2), "{k}");
    }
    assert_eq!(got["script.sh"].1, 0o755);
}

#[test]
fn same_change_on_both_sides_is_taken_once() {
    let l = Layout::new();
    write(&l.base, "a.txt", b"a\n");
    write(&l.base, "m.txt", b"m\n");
    l.fork();
    for side in [&l.mnt, &l.theirs] {
        write(side, "a.txt", b"a changed\n");
        fs::remove_file(side.join("m.txt")).unwrap();
        write(side, "both-new.txt", b"same\n");
    }
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(
        (outcome.plan.changes.len(), outcome.conflicts.len()),
        (0, 0)
    );
}

/// The conflict at `path` in `outcome`.
fn conflict_at<'a>(outcome: &'a MergeOutcome, path: &str) -> &'a Conflict {
    outcome
        .conflicts
        .iter()
        .find(|c| c.path == path)
        .unwrap_or_else(|| panic!("no conflict at {path}: {:?}", outcome.conflicts))
}

#[test]
fn every_conflict_kind_is_reported_and_each_command_resolves_it() {
    let l = Layout::new();
    write(&l.base, "text.txt", b"one\ntwo\nthree\n");
    write(&l.base, "data.bin", b"\0base");
    write(&l.base, "mode.sh", b"x\n");
    write(&l.base, "type", b"file\n");
    symlink("a", l.base.join("link")).unwrap();
    write(&l.base, "delmod-ours.txt", b"d\n");
    write(&l.base, "delmod-theirs.txt", b"d\n");
    write(&l.base, "dir-ours/inner.txt", b"i\n");
    write(&l.base, "dir-theirs/sub/inner.txt", b"i\n");
    l.fork();
    // Both sides change each, differently.
    write(&l.mnt, "text.txt", b"one\nTWO main\nthree\n");
    write(&l.theirs, "text.txt", b"one\nTWO branch\nthree\n");
    write(&l.mnt, "added.txt", b"main's\n");
    write(&l.theirs, "added.txt", b"branch's\n");
    write(&l.mnt, "data.bin", b"\0ours");
    write(&l.theirs, "data.bin", b"\0theirs");
    chmod(&l.mnt, "mode.sh", 0o755);
    chmod(&l.theirs, "mode.sh", 0o600);
    fs::remove_file(l.mnt.join("type")).unwrap();
    fs::create_dir(l.mnt.join("type")).unwrap();
    fs::remove_file(l.theirs.join("type")).unwrap();
    symlink("x", l.theirs.join("type")).unwrap();
    for (side, target) in [(&l.mnt, "b"), (&l.theirs, "c")] {
        fs::remove_file(side.join("link")).unwrap();
        symlink(target, side.join("link")).unwrap();
    }
    fs::remove_file(l.mnt.join("delmod-ours.txt")).unwrap();
    write(&l.theirs, "delmod-ours.txt", b"changed\n");
    write(&l.mnt, "delmod-theirs.txt", b"changed\n");
    fs::remove_file(l.theirs.join("delmod-theirs.txt")).unwrap();
    fs::remove_dir_all(l.mnt.join("dir-ours")).unwrap();
    write(&l.theirs, "dir-ours/inner.txt", b"changed\n");
    write(&l.theirs, "dir-ours/new.txt", b"new\n");
    fs::remove_dir_all(l.theirs.join("dir-theirs")).unwrap();
    write(&l.mnt, "dir-theirs/sub/inner.txt", b"changed\n");
    write(&l.mnt, "dir-theirs/sub/new.txt", b"new\n");

    for mode in [ConflictMode::Refuse, ConflictMode::Markers] {
        let outcome = l.plan(mode).unwrap();
        assert!(
            outcome.refused,
            "non-text conflicts refuse in {mode:?} mode too"
        );
        assert_eq!(outcome.plan.changes, vec![]);
    }
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    let kinds: Vec<(&str, &ConflictKind)> = outcome
        .conflicts
        .iter()
        .map(|c| (c.path.as_str(), &c.kind))
        .collect();
    let dir_ours = ConflictKind::DirectoryRemoved {
        dir: "dir-ours".into(),
        removed_in: Side::Ours,
    };
    let dir_theirs = ConflictKind::DirectoryRemoved {
        dir: "dir-theirs".into(),
        removed_in: Side::Theirs,
    };
    assert_eq!(
        kinds,
        vec![
            ("added.txt", &ConflictKind::Text),
            ("data.bin", &ConflictKind::Binary),
            (
                "delmod-ours.txt",
                &ConflictKind::DeleteModify {
                    deleted_in: Side::Ours
                }
            ),
            (
                "delmod-theirs.txt",
                &ConflictKind::DeleteModify {
                    deleted_in: Side::Theirs
                }
            ),
            ("dir-ours/inner.txt", &dir_ours),
            ("dir-ours/new.txt", &dir_ours),
            ("dir-theirs/sub/inner.txt", &dir_theirs),
            ("dir-theirs/sub/new.txt", &dir_theirs),
            ("link", &ConflictKind::Symlink),
            (
                "mode.sh",
                &ConflictKind::Mode {
                    ours: 0o755,
                    theirs: 0o600
                }
            ),
            ("text.txt", &ConflictKind::Text),
            (
                "type",
                &ConflictKind::Type {
                    ours: NodeKind::Dir,
                    theirs: NodeKind::Symlink
                }
            ),
        ]
    );
    let text = render_text(&outcome, NAME, ConflictMode::Refuse);
    assert!(
        text.contains("deleted in main, changed in agent-a"),
        "{text}"
    );
    // Each conflict's commands are runnable: alternately take the branch's side and keep
    // main's, then the merge is clean and takes exactly what was chosen.
    for (i, c) in outcome.conflicts.iter().enumerate() {
        let r = c
            .resolve
            .iter()
            .filter(|r| !r.command.starts_with("checkpointfs"))
            .nth(i % 2)
            .unwrap_or_else(|| panic!("{}: {:?}", c.path, c.resolve));
        run(Command::new("sh").arg("-c").arg(&r.command));
    }
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(outcome.conflicts, vec![], "resolved");
    l.apply(&outcome.plan);
    let (ours, theirs) = (snapshot(&l.mnt), snapshot(&l.theirs));
    assert_eq!(
        ours, theirs,
        "both sides agree after the resolutions and the merge"
    );
}

#[test]
fn a_missing_base_is_a_typed_error() {
    let l = Layout::new();
    fs::remove_dir(&l.base).unwrap();
    let e = l.plan(ConflictMode::Refuse).unwrap_err();
    assert!(matches!(e, MergeError::BaseMissing { .. }), "{e:?}");
    assert_eq!(e.errno(), libc::ENOENT);
    assert!(e.to_string().contains("fork point"), "{e}");
    let e = DirTree::open(Side::Ours, &l.base).err().unwrap();
    assert!(
        matches!(
            &e,
            MergeError::Io {
                side: Side::Ours,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.errno(), libc::ENOENT);
}

#[test]
fn unreadable_paths_keep_their_errno_and_name() {
    let l = Layout::new();
    write(&l.base, "f.txt", b"a\n");
    l.fork();
    write(&l.mnt, "f.txt", b"b\nx\n");
    write(&l.theirs, "f.txt", b"c\ny\n");
    let base = DirTree::open(Side::Base, &l.base).unwrap();
    let ours = DirTree::open(Side::Ours, &l.mnt).unwrap();
    let theirs = DirTree::open(Side::Theirs, &l.theirs).unwrap();
    // Theirs says the file changed, but a name with a NUL cannot be looked up.
    let bad: BTreeSet<String> = ["f\0.txt".to_string()].into();
    let e = plan_merge(&MergeInput {
        base: &base,
        ours: &ours,
        theirs: &theirs,
        changed_ours: &BTreeSet::new(),
        changed_theirs: &bad,
        branch: NAME,
        mount: &l.mnt,
        mode: ConflictMode::Refuse,
    })
    .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    assert!(e.to_string().contains("f\0.txt"), "{e}");
}

#[test]
fn text_merge_labels_and_clean_merges() {
    let m = text::merge(
        b"a\nb\nc\nd\n",
        b"a\nB\nc\nd\n",
        b"a\nb\nc\nD\n",
        "main",
        NAME,
    );
    assert_eq!(
        (m.merged.as_slice(), m.hunks.len()),
        (&b"a\nB\nc\nD\n"[..], 0)
    );
    // Edits on adjacent lines conflict, as in git.
    let (b, o, t) = (b"a\nb\nc\n", b"a\nB\nc\n", b"a\nb\nC\n");
    let m = text::merge(b, o, t, "main", NAME);
    assert_eq!(m.merged, git_merge_file(o, b, t, true).0);
    assert_eq!(m.hunks.len(), 1);
    let m = text::merge(b"a\nb\nc\n", b"a\nX\nc\n", b"a\nY\nc\n", "main", NAME);
    assert_eq!(
        String::from_utf8(m.merged).unwrap(),
        "a\n<<<<<<< main\nX\n=======\nY\n>>>>>>> agent-a\nc\n"
    );
    assert_eq!(m.hunks[0].line, 2);
    // Inputs with marker-like lines are not mistaken for diffy's own markers.
    let b = b"<<<<<<< ours\nx\n=======\n";
    let m = text::merge(
        b,
        b"<<<<<<< ours\nX\n=======\n",
        b"<<<<<<< ours\nY\n=======\n",
        "main",
        NAME,
    );
    assert_eq!(
        String::from_utf8(m.merged).unwrap(),
        "<<<<<<< ours\n<<<<<<< main\nX\n=======\nY\n>>>>>>> agent-a\n=======\n"
    );
    assert!(text::is_binary(b"a\0b"));
    assert!(!text::is_binary("ünïcode\n".as_bytes()));
}

/// A repository at `dir` with one commit of `files`.
fn repo_with(dir: &Path, files: &[(&str, &str)]) {
    git(dir, &["init", "-q"]);
    for (p, d) in files {
        write(dir, p, d.as_bytes());
    }
    git(dir, &["add", "."]);
    git(dir, &["commit", "-qm", "base"]);
}

#[test]
fn git_objects_merge_as_a_union_and_the_branch_head_becomes_a_ref() {
    let l = Layout::new();
    repo_with(&l.base, &[("a.txt", "a\n"), ("b.txt", "b\n")]);
    l.fork();
    write(&l.mnt, "a.txt", b"a main\n");
    git(&l.mnt, &["commit", "-qam", "main's"]);
    write(&l.theirs, "b.txt", b"b branch\n");
    write(&l.theirs, "c.txt", b"c\n");
    git(&l.theirs, &["add", "."]);
    git(&l.theirs, &["commit", "-qm", "branch's"]);
    // A second commit packed, and its refs too: HEAD resolves through packed-refs.
    write(&l.theirs, "c.txt", b"c2\n");
    git(&l.theirs, &["commit", "-qam", "branch's second"]);
    git(&l.theirs, &["repack", "-q", "-d"]);
    git(&l.theirs, &["pack-refs", "--all"]);
    assert!(!l.theirs.join(".git/refs/heads/main").exists());
    let theirs_head = git(&l.theirs, &["rev-parse", "HEAD"]).trim().to_string();
    let (head, index, main_ref) = (
        fs::read(l.mnt.join(".git/HEAD")).unwrap(),
        fs::read(l.mnt.join(".git/index")).unwrap(),
        git(&l.mnt, &["rev-parse", "refs/heads/main"]),
    );
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(outcome.conflicts, vec![]);
    // No path of .git/ but objects and the new ref; the ref last; each pack's index after
    // its pack.
    let paths: Vec<&str> = outcome.plan.changes.iter().map(Change::path).collect();
    assert!(
        paths
            .iter()
            .filter(|p| p.starts_with(".git/"))
            .all(|p| p.starts_with(".git/objects/") || *p == ".git/refs/heads/agent-a"),
        "{paths:?}"
    );
    assert_eq!(paths.last(), Some(&".git/refs/heads/agent-a"));
    let pack = paths
        .iter()
        .position(|p| p.ends_with(".pack"))
        .expect("a pack copied");
    let idx = paths.iter().position(|p| p.ends_with(".idx")).unwrap();
    assert!(pack < idx);
    l.apply(&outcome.plan);
    git(&l.mnt, &["fsck", "--full", "--strict"]);
    assert_eq!(
        git(&l.mnt, &["rev-parse", "refs/heads/agent-a"]).trim(),
        theirs_head
    );
    assert_eq!(fs::read(l.mnt.join(".git/HEAD")).unwrap(), head);
    assert_eq!(fs::read(l.mnt.join(".git/index")).unwrap(), index);
    assert_eq!(git(&l.mnt, &["rev-parse", "refs/heads/main"]), main_ref);
    // The worktree files merged path by path: git sees the branch's changes already there.
    assert_eq!(fs::read(l.mnt.join("c.txt")).unwrap(), b"c2\n");
    git(&l.mnt, &["stash", "-q", "-u"]);
    git(&l.mnt, &["merge", "-q", "--no-edit", NAME]);
    assert_eq!(fs::read(l.mnt.join("b.txt")).unwrap(), b"b branch\n");
    assert_eq!(fs::read(l.mnt.join("a.txt")).unwrap(), b"a main\n");
    git(&l.mnt, &["fsck", "--full", "--strict"]);
}

#[test]
fn an_existing_ref_of_that_name_elsewhere_is_a_conflict() {
    let l = Layout::new();
    repo_with(&l.base, &[("a.txt", "a\n")]);
    l.fork();
    write(&l.mnt, "a.txt", b"main\n");
    git(&l.mnt, &["commit", "-qam", "main's"]);
    git(&l.mnt, &["branch", NAME]);
    write(&l.theirs, "b.txt", b"b\n");
    git(&l.theirs, &["add", "."]);
    git(&l.theirs, &["commit", "-qm", "branch's"]);
    let outcome = l.plan(ConflictMode::Markers).unwrap();
    assert!(outcome.refused);
    assert_eq!(outcome.plan.changes, vec![]);
    let c = conflict_at(&outcome, ".git/refs/heads/agent-a");
    assert!(matches!(c.kind, ConflictKind::GitRef { .. }), "{c:?}");
    // Its command moves main's branch away; then the merge goes through.
    run(Command::new("sh").arg("-c").arg(&c.resolve[0].command));
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    assert_eq!(outcome.conflicts, vec![]);
    l.apply(&outcome.plan);
    git(&l.mnt, &["fsck", "--full", "--strict"]);
    assert_eq!(
        git(&l.mnt, &["rev-parse", NAME]),
        git(&l.theirs, &["rev-parse", "HEAD"])
    );
}

#[test]
fn ref_names_follow_git_check_ref_format() {
    for ok in ["agent-a", "agents/a", "fix_1.2"] {
        assert!(git::valid_branch_name(ok), "{ok}");
    }
    for bad in [
        "", "-a", "a..b", "a b", "a/", ".a", "a.lock", "a~1", "a:b", "@",
    ] {
        assert!(!git::valid_branch_name(bad), "{bad}");
    }
}

#[test]
fn a_checkpoint_view_serves_as_base() {
    use crate::history::{HistoryConfig, open_history_readonly};
    let l = Layout::new();
    write(&l.base, "a.txt", b"one\ntwo\nthree\nfour\n");
    write(&l.base, "d/b.txt", b"b\n");
    symlink("a.txt", l.base.join("link")).unwrap();
    l.fork();
    write(&l.mnt, "a.txt", b"ONE\ntwo\nthree\nfour\n");
    write(&l.theirs, "a.txt", b"one\ntwo\nthree\nFOUR\n");
    fs::remove_dir_all(l.theirs.join("d")).unwrap();
    let state = l._dir.path().join("state");
    fs::create_dir(&state).unwrap();
    // The base read as a view of a history over it: nothing tracked, so every path is
    // served from the tree itself, through the view's own fd-relative reads.
    let history = open_history_readonly(HistoryConfig {
        source: l.base.clone(),
        root: None,
        state_dir: state,
        exclusions: Default::default(),
        durability: Default::default(),
    })
    .unwrap();
    let base = ViewTree::new(Side::Base, &history, 0);
    assert_eq!(base.list("").unwrap().len(), 3);
    assert_eq!(base.read("link").unwrap(), b"a.txt");
    let ours = DirTree::open(Side::Ours, &l.mnt).unwrap();
    let theirs = DirTree::open(Side::Theirs, &l.theirs).unwrap();
    let outcome = plan_merge(&MergeInput {
        base: &base,
        ours: &ours,
        theirs: &theirs,
        changed_ours: &BTreeSet::new(),
        changed_theirs: &["d".to_string()].into(),
        branch: NAME,
        mount: &l.mnt,
        mode: ConflictMode::Refuse,
    });
    let outcome = outcome.unwrap();
    // Only what the sets name is looked at: "d", removed whole, its entries listed from
    // ours (a.txt, in neither set here, is not even read).
    let paths: Vec<&str> = outcome.plan.changes.iter().map(Change::path).collect();
    assert_eq!(paths, ["d/b.txt", "d"]);
    let changed_theirs = changed(&l.base, &l.theirs);
    let outcome = plan_merge(&MergeInput {
        base: &base,
        ours: &ours,
        theirs: &theirs,
        changed_ours: &changed(&l.base, &l.mnt),
        changed_theirs: &changed_theirs,
        branch: NAME,
        mount: &l.mnt,
        mode: ConflictMode::Refuse,
    })
    .unwrap();
    l.apply(&outcome.plan);
    assert_eq!(
        fs::read(l.mnt.join("a.txt")).unwrap(),
        b"ONE\ntwo\nthree\nFOUR\n"
    );
    assert!(!l.mnt.join("d").exists());
}

/// A tree that counts what is asked of it.
struct Counting<'a> {
    tree: &'a dyn Tree,
    calls: std::cell::Cell<usize>,
}

impl Tree for Counting<'_> {
    fn side(&self) -> Side {
        self.tree.side()
    }
    fn node(&self, rel: &str) -> Result<Option<Node>, MergeError> {
        self.calls.set(self.calls.get() + 1);
        self.tree.node(rel)
    }
    fn read(&self, rel: &str) -> Result<Vec<u8>, MergeError> {
        self.calls.set(self.calls.get() + 1);
        self.tree.read(rel)
    }
    fn list(&self, rel: &str) -> Result<Vec<String>, MergeError> {
        self.calls.set(self.calls.get() + 1);
        self.tree.list(rel)
    }
}

fn counting(tree: &dyn Tree) -> Counting<'_> {
    Counting {
        tree,
        calls: std::cell::Cell::new(0),
    }
}

#[test]
fn the_cost_grows_with_what_changed_not_with_the_tree() {
    let l = Layout::new();
    for i in 0..3000 {
        write(&l.base, &format!("big/d{}/f{i}", i % 30), b"unchanged\n");
    }
    write(&l.base, "src/a.txt", b"1\n2\n3\n4\n5\n");
    l.fork();
    write(&l.mnt, "src/a.txt", b"one\n2\n3\n4\n5\n");
    write(&l.theirs, "src/a.txt", b"1\n2\n3\n4\nfive\n");
    write(&l.theirs, "src/new/b.txt", b"b\n");
    let open = |side, p: &Path| DirTree::open(side, p).unwrap();
    let (b, o, t) = (
        open(Side::Base, &l.base),
        open(Side::Ours, &l.mnt),
        open(Side::Theirs, &l.theirs),
    );
    let (b, o, t) = (counting(&b), counting(&o), counting(&t));
    let outcome = plan_merge(&MergeInput {
        base: &b,
        ours: &o,
        theirs: &t,
        changed_ours: &changed(&l.base, &l.mnt),
        changed_theirs: &changed(&l.base, &l.theirs),
        branch: NAME,
        mount: &l.mnt,
        mode: ConflictMode::Refuse,
    })
    .unwrap();
    assert_eq!(outcome.plan.changes.len(), 3, "{:?}", outcome.plan);
    let calls = b.calls.get() + o.calls.get() + t.calls.get();
    // 3 changed paths (and a new directory): a few lookups and reads each (17 today),
    // whatever the 3,000 untouched files.
    assert!(
        calls <= 30,
        "{calls} calls to the trees for 3 changed paths"
    );
}

#[test]
fn a_symlink_in_the_way_is_never_followed() {
    let l = Layout::new();
    let outside = l._dir.path().join("outside");
    write(&outside, "f.txt", b"not the tree's\n");
    write(&l.base, "d/f.txt", b"base\n");
    l.fork();
    // Ours swaps directory d for a symlink to a directory outside with the same names;
    // theirs changes d/f.txt.
    fs::remove_dir_all(l.mnt.join("d")).unwrap();
    symlink(&outside, l.mnt.join("d")).unwrap();
    write(&l.theirs, "d/f.txt", b"theirs\n");
    let outcome = l.plan(ConflictMode::Refuse).unwrap();
    let c = conflict_at(&outcome, "d/f.txt");
    assert_eq!(
        c.kind,
        ConflictKind::DirectoryRemoved {
            dir: "d".into(),
            removed_in: Side::Ours
        },
        "ours has no d/f.txt: d is a symlink there, not followed"
    );
    assert_eq!(outcome.plan.changes, vec![]);
    assert_eq!(
        fs::read(outside.join("f.txt")).unwrap(),
        b"not the tree's\n"
    );
}

#[test]
fn a_branch_name_with_slashes_becomes_a_nested_ref() {
    let l = Layout::new();
    repo_with(&l.base, &[("a.txt", "a\n")]);
    l.fork();
    write(&l.theirs, "b.txt", b"b\n");
    git(&l.theirs, &["add", "."]);
    git(&l.theirs, &["commit", "-qm", "branch's"]);
    let (base, ours, theirs) = (
        DirTree::open(Side::Base, &l.base).unwrap(),
        DirTree::open(Side::Ours, &l.mnt).unwrap(),
        DirTree::open(Side::Theirs, &l.theirs).unwrap(),
    );
    let (none, changed_theirs) = (BTreeSet::new(), changed(&l.base, &l.theirs));
    let input = |branch| MergeInput {
        base: &base,
        ours: &ours,
        theirs: &theirs,
        changed_ours: &none,
        changed_theirs: &changed_theirs,
        branch,
        mount: &l.mnt,
        mode: ConflictMode::Refuse,
    };
    let e = plan_merge(&input("bad..name")).unwrap_err();
    assert!(matches!(e, MergeError::BadRefName { .. }), "{e:?}");
    assert_eq!(e.errno(), libc::EINVAL);
    let outcome = plan_merge(&input("agents/a")).unwrap();
    assert_eq!(outcome.conflicts, vec![]);
    let tail: Vec<&str> = outcome
        .plan
        .changes
        .iter()
        .rev()
        .take(2)
        .map(Change::path)
        .collect();
    assert_eq!(tail, [".git/refs/heads/agents/a", ".git/refs/heads/agents"]);
    l.apply(&outcome.plan);
    git(&l.mnt, &["fsck", "--full", "--strict"]);
    assert_eq!(
        git(&l.mnt, &["rev-parse", "agents/a"]),
        git(&l.theirs, &["rev-parse", "HEAD"])
    );
}

/// Git joins two conflicts with at most 3 unchanged lines between them, or more that hold
/// no letter or digit, into one (`xdl_simplify_non_conflicts`), counting lines the
/// conflicts' sides share at their facing edges; a change of either side between them
/// keeps them apart. The same here, compared with git on each case.
#[test]
fn close_conflicts_join_as_in_git() {
    let cases: [(&str, &str, &str); 6] = [
        // 2 unchanged lines between: one conflict.
        (
            "a\nb\nc\nd\ne\nf\n",
            "a\nX\nc\nd\nY\nf\n",
            "a\nP\nc\nd\nQ\nf\n",
        ),
        // 4 between: two.
        (
            "a\nb\n1\n2\n3\n4\ne\nf\n",
            "a\nX\n1\n2\n3\n4\nY\nf\n",
            "a\nP\n1\n2\n3\n4\nQ\nf\n",
        ),
        // 5 between without a letter or digit: one.
        (
            "a\nb\n}\n}\n}\n}\n}\ne\nf\n",
            "a\nX\n}\n}\n}\n}\n}\nY\nf\n",
            "a\nP\n}\n}\n}\n}\n}\nQ\nf\n",
        ),
        // A change of ours between: two, and that change taken.
        (
            "a\nb\nc\nd\ne\nf\n",
            "a\nX\nC\nd\nY\nf\n",
            "a\nP\nc\nd\nQ\nf\n",
        ),
        // The sides share a middle line: one conflict.
        (
            "a\nb\nc\nd\ne\n",
            "a\n1\nSAME\n2\ne\n",
            "a\n3\nSAME\n4\ne\n",
        ),
        // They share a line at the edge: moved out.
        ("a\nb\nc\ne\n", "a\nX\nCOMMON\ne\n", "a\nY\nCOMMON\ne\n"),
    ];
    for (b, o, t) in cases {
        let m = text::merge(b.as_bytes(), o.as_bytes(), t.as_bytes(), "main", NAME);
        let git = git_merge_file(o.as_bytes(), b.as_bytes(), t.as_bytes(), true).0;
        assert_eq!(
            String::from_utf8(m.merged).unwrap(),
            String::from_utf8(git).unwrap()
        );
    }
}

/// Random small edits on both sides, overlapping, adjacent or apart, on files of distinct
/// lines: the line merge, and whether it conflicts, equal `git merge-file`'s on each. (With
/// repeated lines, where a diff can align a change to either copy, diffy and git's xdiff
/// may choose differently: see docs/design.md, "Merging a branch".)
#[test]
fn random_three_way_merges_equal_git_merge_file() {
    let mut rng = Rng(0x5eed_0004);
    let mut differ = Vec::new();
    for case in 0..1000 {
        let len = 8 + rng.below(12);
        let base = base_text(&mut rng, case, len);
        let mut side = |tag: &str| {
            let mut v = base.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(v.len());
                let len = rng.below(3).min(v.len() - at);
                let by = rng.below(3);
                v = edit(&v, at, len, by, tag, &mut rng);
            }
            v.concat().into_bytes()
        };
        let (o, t) = (side("ours"), side("theirs"));
        let b = base.concat().into_bytes();
        let m = text::merge(&b, &o, &t, "main", NAME);
        let (git, conflicted) = git_merge_file(&o, &b, &t, true);
        if m.merged != git || conflicted == m.hunks.is_empty() {
            differ.push(case);
        }
    }
    assert_eq!(
        differ,
        Vec::<usize>::new(),
        "cases whose merge differs from git's"
    );
}
