//! What is not tracked: `--exclude` globs (also read from `--exclude-from` files) and, with
//! `--respect-gitignore`, git's ignore rules. Excluded paths pass through untracked: Layer 1
//! does not back them up and rewind leaves them alone.
//!
//! ## Git's rules, as git applies them
//! - `.gitignore` in any directory, its patterns relative to that directory; a deeper file
//!   overrides a shallower one; within one file the last matching line wins; `!pattern`
//!   re-includes. Below all `.gitignore` files: `.git/info/exclude`, then the user's global
//!   `core.excludesFile` (both relative to the mount root).
//! - A path below an ignored directory is ignored, whatever the rules say about the path
//!   itself: git never looks inside an ignored directory, so a negation cannot re-include a
//!   file whose parent is excluded. Hence each ancestor directory is checked first, top down.
//! - The git directory itself (any path with a component `.git`) is never excluded by ignore
//!   rules, only by `--exclude`: git does not apply ignore rules to it, and a rewind that
//!   restored the worktree but not the repository (HEAD, index, refs) would leave the two
//!   inconsistent.
//!
//! ## Cost on the mutation path
//! The matcher of each directory is built once, from its `.gitignore` (or the absence of
//! one), and cached; checking a path costs hash lookups and glob matches, no filesystem
//! access. The cache follows changes made through the mount: the gate reports every change
//! of a path named `.gitignore`, of `.git/info/exclude` and every rename once the mutation
//! is done (for data written through a handle: when the handle is closed, and again when
//! it is released), which drops the affected matchers; they are rebuilt on next use. A path
//! excluded when it changed has no backup; if a rule change un-ignores it, it is tracked
//! from its next change on. Changes made to SRC behind the mount are not seen until the
//! next mount.
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use log::{debug, warn};
use serde::{Deserialize, Serialize};

use crate::sys;

/// The exclusion settings of a mount, as given on the command line (or saved in the state
/// dir by the previous mount, see `STATE/settings.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExclusionConfig {
    /// `--exclude` patterns, in the order given.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// `--exclude-from` files (absolute paths) and the patterns read from them.
    #[serde(default)]
    pub exclude_from: Vec<ExcludeFile>,
    /// `--respect-gitignore`.
    #[serde(default)]
    pub respect_gitignore: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExcludeFile {
    pub file: PathBuf,
    pub patterns: Vec<String>,
}

/// Why a path is or is not excluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No rule applies: tracked.
    Tracked,
    /// Inside a git directory: ignore rules do not apply there (only `--exclude` does).
    GitDir,
    /// Matches an `--exclude` pattern (`file: None`) or one read from an `--exclude-from` file.
    Glob {
        pattern: String,
        file: Option<PathBuf>,
    },
    /// Ignored by a git rule; `parent`: the ancestor directory the rule ignores, when it is
    /// not the path itself.
    Ignored { rule: Rule, parent: Option<String> },
    /// A negation (`!pattern`) re-includes it: tracked.
    Negated { rule: Rule },
}

impl Verdict {
    pub fn is_excluded(&self) -> bool {
        matches!(self, Verdict::Glob { .. } | Verdict::Ignored { .. })
    }
}

/// One line of an ignore file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The file, relative to the mount root (`sub/.gitignore`, `.git/info/exclude`), or
    /// absolute for the global excludes file.
    pub file: String,
    /// 1-based.
    pub line: usize,
    pub pattern: String,
}

/// One ignore file's matcher, with the line of each pattern (for `status --path`).
struct RuleFile {
    matcher: Gitignore,
    /// Where each pattern (as `Glob::original` spells it) was last given: the last matching
    /// line wins, so the last line with that text is the one that decided.
    lines: HashMap<String, usize>,
    name: String,
}

impl RuleFile {
    /// Builds the matcher of `text`, whose patterns are relative to `root`. Lines that are
    /// not valid patterns are skipped with a warning, as git does.
    fn parse(root: &Path, name: &str, text: &str) -> RuleFile {
        let mut builder = GitignoreBuilder::new(root);
        let mut lines = HashMap::new();
        let from = PathBuf::from(name);
        for (i, line) in text.lines().enumerate() {
            let line = if i == 0 {
                line.trim_start_matches('\u{feff}')
            } else {
                line
            };
            if let Err(e) = builder.add_line(Some(from.clone()), line) {
                warn!("{name}:{}: skipping an invalid pattern: {e}", i + 1);
                continue;
            }
            // Comments and blank lines land here too; no pattern is spelled like them.
            lines.insert(line.trim_end().to_string(), i + 1);
        }
        let matcher = builder.build().unwrap_or_else(|e| {
            warn!("{name}: cannot build its matcher ({e}); it is not applied");
            Gitignore::empty()
        });
        RuleFile {
            matcher,
            lines,
            name: name.to_string(),
        }
    }

    /// The rule deciding `path` (relative to this file's directory), if any.
    fn decide(&self, path: &str, is_dir: bool) -> Option<(bool, Rule)> {
        let (ignored, glob) = match self.matcher.matched(path, is_dir) {
            Match::None => return None,
            Match::Ignore(g) => (true, g),
            Match::Whitelist(g) => (false, g),
        };
        let pattern = glob.original().to_string();
        let line = self.lines.get(&pattern).copied().unwrap_or(0);
        Some((
            ignored,
            Rule {
                file: self.name.clone(),
                line,
                pattern,
            },
        ))
    }
}

/// Ignore-file matchers by directory (relative to the mount root; "" is the root), built
/// on first use. `None`: the directory has no `.gitignore`.
type DirCache = BTreeMap<String, Option<Arc<RuleFile>>>;

struct GitRules {
    source: PathBuf,
    /// O_PATH on SRC: ignore files are read beneath it, never through a symlink.
    source_fd: OwnedFd,
    dirs: RwLock<DirCache>,
    /// `.git/info/exclude`; outer `None`: not loaded yet.
    info_exclude: RwLock<Option<Option<Arc<RuleFile>>>>,
    /// The global `core.excludesFile`, read once at mount.
    global: Option<Arc<RuleFile>>,
    global_path: Option<PathBuf>,
    /// Bumped by every invalidation: a matcher built while it changed may have read an old
    /// file, so it is used once but not cached.
    generation: AtomicU64,
}

const GITIGNORE: &str = ".gitignore";
const INFO_EXCLUDE: &str = ".git/info/exclude";

/// Whether `rel` is in a git directory (a component named `.git`).
fn in_git_dir(rel: &str) -> bool {
    rel.split('/').any(|c| c == ".git")
}

/// `a/b/c` → `a`, `a/b`: the ancestor directories, shallowest first.
fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    rel.match_indices('/').map(move |(i, _)| &rel[..i])
}

/// `rel` relative to directory `dir` ("" is the root).
fn relative_to<'a>(rel: &'a str, dir: &str) -> &'a str {
    if dir.is_empty() {
        rel
    } else {
        &rel[dir.len() + 1..]
    }
}

/// The user's global `core.excludesFile` if it exists, found as git does (`GIT_CONFIG_GLOBAL`,
/// `~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`, `/etc/gitconfig`, then the default
/// `$XDG_CONFIG_HOME/git/ignore`), in this process's environment.
pub fn global_excludes_file() -> Option<PathBuf> {
    ignore::gitignore::gitconfig_excludes_path().filter(|p| p.is_file())
}

impl GitRules {
    fn new(source: &Path, source_fd: OwnedFd, global_path: Option<PathBuf>) -> GitRules {
        let global = global_path.as_ref().and_then(|p| match std::fs::read(p) {
            Ok(bytes) => Some(Arc::new(RuleFile::parse(
                source,
                &p.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            ))),
            Err(e) => {
                warn!("cannot read the global excludes file {}: {e}", p.display());
                None
            }
        });
        GitRules {
            source: source.to_path_buf(),
            source_fd,
            dirs: RwLock::new(BTreeMap::new()),
            info_exclude: RwLock::new(None),
            global,
            global_path,
            generation: AtomicU64::new(0),
        }
    }

    /// Reads the ignore file `rel` beneath SRC; `None` when there is none (or it cannot be
    /// read: then the rules are applied without it, with a warning).
    fn load(&self, rel: &str, root: &str) -> Option<Arc<RuleFile>> {
        let text = match sys::open_beneath(self.source_fd.as_fd(), rel, libc::O_RDONLY, 0) {
            Ok(fd) => {
                let mut bytes = Vec::new();
                match std::fs::File::from(fd).read_to_end(&mut bytes) {
                    Ok(_) => String::from_utf8_lossy(&bytes).into_owned(),
                    Err(e) if e.raw_os_error() == Some(libc::EISDIR) => return None,
                    Err(e) => {
                        warn!("cannot read {rel}: {e}; its rules are not applied");
                        return None;
                    }
                }
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
                ) =>
            {
                return None;
            }
            Err(e) => {
                warn!("cannot open {rel}: {e}; its rules are not applied");
                return None;
            }
        };
        debug!("exclusions: loaded {rel}");
        Some(Arc::new(RuleFile::parse(
            &self.source.join(root),
            rel,
            &text,
        )))
    }

    fn dir_rules(&self, dir: &str) -> Option<Arc<RuleFile>> {
        if let Some(cached) = self.dirs.read().unwrap_or_else(|p| p.into_inner()).get(dir) {
            return cached.clone();
        }
        let generation = self.generation.load(Ordering::Acquire);
        let file = if dir.is_empty() {
            GITIGNORE.to_string()
        } else {
            format!("{dir}/{GITIGNORE}")
        };
        let rules = self.load(&file, dir);
        let mut dirs = self.dirs.write().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) == generation {
            dirs.insert(dir.to_string(), rules.clone());
        }
        rules
    }

    fn info_exclude_rules(&self) -> Option<Arc<RuleFile>> {
        if let Some(cached) = &*self.info_exclude.read().unwrap_or_else(|p| p.into_inner()) {
            return cached.clone();
        }
        let generation = self.generation.load(Ordering::Acquire);
        let rules = self.load(INFO_EXCLUDE, "");
        let mut slot = self.info_exclude.write().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) == generation {
            *slot = Some(rules.clone());
        }
        rules
    }

    /// The rule deciding `rel` by itself (its ancestors aside): the deepest `.gitignore`
    /// with a matching line, then `.git/info/exclude`, then the global file.
    fn decide_one(&self, rel: &str, is_dir: bool) -> Option<(bool, Rule)> {
        let deepest_first = rel
            .rmatch_indices('/')
            .map(|(i, _)| &rel[..i])
            .chain(std::iter::once(""));
        for dir in deepest_first {
            if let Some(rules) = self.dir_rules(dir)
                && let Some(d) = rules.decide(relative_to(rel, dir), is_dir)
            {
                return Some(d);
            }
        }
        [self.info_exclude_rules(), self.global.clone()]
            .into_iter()
            .flatten()
            .find_map(|rules| rules.decide(rel, is_dir))
    }

    fn verdict(&self, rel: &str, is_dir: impl FnOnce() -> bool) -> Verdict {
        if in_git_dir(rel) {
            return Verdict::GitDir;
        }
        for dir in ancestors(rel) {
            if let Some((true, rule)) = self.decide_one(dir, true) {
                return Verdict::Ignored {
                    rule,
                    parent: Some(dir.to_string()),
                };
            }
        }
        match self.decide_one(rel, is_dir()) {
            None => Verdict::Tracked,
            Some((true, rule)) => Verdict::Ignored { rule, parent: None },
            Some((false, rule)) => Verdict::Negated { rule },
        }
    }

    /// Drops the matchers that a change of `rel` can make stale: its directory's if it is a
    /// `.gitignore`, `.git/info/exclude`'s if it is that file or one of its directories, and
    /// every matcher at or below `rel` (a directory renamed or removed with its files).
    fn invalidate(&self, rel: &str) {
        let mut dirs = self.dirs.write().unwrap_or_else(|p| p.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        let (parent, name) = super::split_parent(rel);
        if name == GITIGNORE {
            dirs.remove(parent);
        }
        let below = format!("{rel}/");
        let stale: Vec<String> = dirs
            .range(rel.to_string()..)
            .map(|(k, _)| k)
            .take_while(|k| *k == rel || k.starts_with(&below))
            .cloned()
            .collect();
        for k in stale {
            dirs.remove(&k);
        }
        drop(dirs);
        if INFO_EXCLUDE == rel || INFO_EXCLUDE.starts_with(&below) {
            *self.info_exclude.write().unwrap_or_else(|p| p.into_inner()) = None;
        }
        debug!("exclusions: rules invalidated by a change of {rel}");
    }
}

/// The exclusion matcher of one mount.
pub struct Exclusions {
    config: ExclusionConfig,
    globs: GlobSet,
    /// For each glob in `globs`: the pattern and the `--exclude-from` file it came from.
    glob_origin: Vec<(String, Option<PathBuf>)>,
    git: Option<GitRules>,
}

impl Exclusions {
    /// `source_fd`: O_PATH on SRC (the ignore files are read beneath it). `global_excludes`:
    /// the global ignore file to apply with git's rules (see [`global_excludes_file`]).
    pub fn new(
        config: ExclusionConfig,
        source: &Path,
        source_fd: OwnedFd,
        global_excludes: Option<PathBuf>,
    ) -> io::Result<Self> {
        let mut builder = GlobSetBuilder::new();
        let mut glob_origin = Vec::new();
        let given = config.exclude.iter().map(|p| (p, None));
        let from_files = config
            .exclude_from
            .iter()
            .flat_map(|f| f.patterns.iter().map(move |p| (p, Some(f.file.clone()))));
        for (pattern, file) in given.chain(from_files) {
            for glob in globs_of(pattern)? {
                builder.add(glob);
                glob_origin.push((pattern.clone(), file.clone()));
            }
        }
        let globs = builder
            .build()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let git = config
            .respect_gitignore
            .then(|| GitRules::new(source, source_fd, global_excludes));
        Ok(Exclusions {
            config,
            globs,
            glob_origin,
            git,
        })
    }

    pub fn config(&self) -> &ExclusionConfig {
        &self.config
    }

    /// One line for the daemon's log: `--exclude 'target', --exclude-from /x (2 patterns),
    /// gitignore on`.
    pub fn summary(&self) -> String {
        let c = &self.config;
        let mut parts: Vec<String> = c
            .exclude
            .iter()
            .map(|p| format!("--exclude '{p}'"))
            .collect();
        parts.extend(c.exclude_from.iter().map(|f| {
            format!(
                "--exclude-from {} ({} patterns)",
                f.file.display(),
                f.patterns.len()
            )
        }));
        parts.push(format!(
            "gitignore {}",
            if c.respect_gitignore { "on" } else { "off" }
        ));
        parts.join(", ")
    }

    /// Why `rel` (relative to the mount root, not empty) is or is not excluded. `is_dir` is
    /// asked only when a git rule needs it (`build/` matches directories only).
    pub fn verdict(&self, rel: &str, is_dir: impl FnOnce() -> bool) -> Verdict {
        if let Some(i) = self.globs.matches(rel).first() {
            let (pattern, file) = self.glob_origin[*i].clone();
            return Verdict::Glob { pattern, file };
        }
        match &self.git {
            Some(git) => git.verdict(rel, is_dir),
            None => Verdict::Tracked,
        }
    }

    pub fn is_excluded(&self, rel: &str, is_dir: impl FnOnce() -> bool) -> bool {
        if self.globs.is_match(rel) {
            return true;
        }
        self.git
            .as_ref()
            .is_some_and(|git| git.verdict(rel, is_dir).is_excluded())
    }

    /// Whether git's rules apply (then a rule may depend on whether a path is a directory,
    /// as `build/` does, and changes of ignore files matter).
    pub fn uses_git_rules(&self) -> bool {
        self.git.is_some()
    }

    /// Whether a change of `rel` can change the rules (so the gate must report it with
    /// [`Exclusions::rules_changed`] once the change is done). Renames always can: they may
    /// move a directory holding ignore files.
    pub fn rules_depend_on(&self, rel: &str, rename: bool) -> bool {
        if self.git.is_none() {
            return false;
        }
        rename
            || super::split_parent(rel).1 == GITIGNORE
            || rel == INFO_EXCLUDE
            || INFO_EXCLUDE.starts_with(&format!("{rel}/"))
    }

    /// A change of `rel` (see [`Exclusions::rules_depend_on`]) is done.
    pub fn rules_changed(&self, rel: &str) {
        if let Some(git) = &self.git {
            git.invalidate(rel);
        }
    }

    /// The ignore files in effect now: every `.gitignore` in the tree outside excluded
    /// directories and git directories (found by walking SRC: for `status`, not the
    /// mutation path), then `.git/info/exclude` and the global file if they exist.
    pub fn ignore_files(&self) -> Vec<String> {
        let Some(git) = &self.git else {
            return Vec::new();
        };
        let mut found = Vec::new();
        let mut stack = vec![String::new()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(git.source.join(&dir)) else {
                continue;
            };
            let mut names: Vec<(String, bool)> = entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let is_dir = e.file_type().ok()?.is_dir();
                    Some((name, is_dir))
                })
                .collect();
            names.sort();
            for (name, is_dir) in names {
                let rel = if dir.is_empty() {
                    name.clone()
                } else {
                    format!("{dir}/{name}")
                };
                if is_dir && name != ".git" && !self.is_excluded(&rel, || true) {
                    stack.push(rel);
                } else if !is_dir && name == GITIGNORE {
                    found.push(rel);
                }
            }
        }
        found.sort_by(|a, b| {
            a.matches('/')
                .count()
                .cmp(&b.matches('/').count())
                .then(a.cmp(b))
        });
        if git.info_exclude_rules().is_some() {
            found.push(INFO_EXCLUDE.to_string());
        }
        if let Some(p) = &git.global_path {
            found.push(p.display().to_string());
        }
        found
    }

    /// The global `core.excludesFile`, if one applies.
    pub fn global_excludes_file(&self) -> Option<&Path> {
        self.git.as_ref()?.global_path.as_deref()
    }
}

/// The globs of one `--exclude` pattern. A pattern without `/` matches a name at any depth
/// (like `.gitignore`); one with `/` is anchored at the mount root. Either way, everything
/// below a matched directory is excluded too.
fn globs_of(pattern: &str) -> io::Result<Vec<globset::Glob>> {
    let p = pattern.trim_end_matches('/');
    let anchored = p.trim_start_matches('/');
    let bases: Vec<String> = if p.contains('/') {
        vec![anchored.to_string()]
    } else {
        vec![anchored.to_string(), format!("**/{anchored}")]
    };
    let mut out = Vec::new();
    for base in bases {
        for g in [base.clone(), format!("{base}/**")] {
            let glob = GlobBuilder::new(&g)
                .literal_separator(true)
                .build()
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("bad --exclude pattern '{p}': {e}"),
                    )
                })?;
            out.push(glob);
        }
    }
    Ok(out)
}

/// Checks that `pattern` is a glob the matchers accept (`--exclude`, `--exclude-from`).
pub fn check_glob(pattern: &str) -> Result<(), String> {
    globset::Glob::new(pattern)
        .map(|_| ())
        .map_err(|e| format!("invalid glob: {e}"))
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their trees directly"
)]
mod tests {
    use super::*;

    fn open_dir(p: &Path) -> OwnedFd {
        std::fs::File::open(p).unwrap().into()
    }

    fn with(config: ExclusionConfig, dir: &Path) -> Exclusions {
        Exclusions::new(config, dir, open_dir(dir), None).unwrap()
    }

    fn globs(patterns: &[&str]) -> Exclusions {
        let dir = tempfile::tempdir().unwrap();
        let config = ExclusionConfig {
            exclude: patterns.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        with(config, dir.path())
    }

    fn gitignore(dir: &Path) -> Exclusions {
        let config = ExclusionConfig {
            respect_gitignore: true,
            ..Default::default()
        };
        with(config, dir)
    }

    fn file(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn rule(file: &str, line: usize, pattern: &str) -> Rule {
        Rule {
            file: file.into(),
            line,
            pattern: pattern.into(),
        }
    }

    #[test]
    fn excludes_match_names_at_any_depth_and_anchor_paths_with_slashes() {
        let g = globs(&["target", "*.o", "build/out"]);
        let ex = |p: &str| g.is_excluded(p, || false);
        assert!(ex("target"));
        assert!(ex("target/debug/x"));
        assert!(ex("sub/target/x"));
        assert!(ex("a.o"));
        assert!(ex("src/a.o"));
        assert!(ex("build/out/x"));
        assert!(!ex("sub/build/out"));
        assert!(!ex("targets"));
        assert!(!ex("src/main.rs"));
        assert_eq!(
            g.verdict("src/a.o", || false),
            Verdict::Glob {
                pattern: "*.o".into(),
                file: None
            }
        );
    }

    #[test]
    fn bad_exclude_pattern_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = ExclusionConfig {
            exclude: vec!["a[".into()],
            ..Default::default()
        };
        let err = Exclusions::new(config, dir.path(), open_dir(dir.path()), None)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("bad --exclude pattern 'a['"),
            "{err}"
        );
    }

    #[test]
    fn nested_gitignore_files_deeper_overrides_shallower_and_negation_reincludes() {
        let d = tempfile::tempdir().unwrap();
        file(
            d.path(),
            ".gitignore",
            "# logs\n*.log\n/only-root.tmp\nbuild/\n",
        );
        file(d.path(), "sub/.gitignore", "!keep.log\n");
        let g = gitignore(d.path());
        let v = |p: &str| g.verdict(p, || false);
        let ignored = |line, pattern| Verdict::Ignored {
            rule: rule(".gitignore", line, pattern),
            parent: None,
        };
        assert_eq!(v("a.log"), ignored(2, "*.log"));
        assert_eq!(v("sub/deep/x.log"), ignored(2, "*.log"));
        assert_eq!(
            v("sub/keep.log"),
            Verdict::Negated {
                rule: rule("sub/.gitignore", 1, "!keep.log")
            }
        );
        assert_eq!(v("keep.log"), ignored(2, "*.log"));
        assert_eq!(v("only-root.tmp"), ignored(3, "/only-root.tmp"));
        assert_eq!(v("sub/only-root.tmp"), Verdict::Tracked);
        assert_eq!(v("src/main.rs"), Verdict::Tracked);
    }

    #[test]
    fn a_directory_pattern_excludes_the_directory_and_everything_below_but_not_a_file() {
        let d = tempfile::tempdir().unwrap();
        file(d.path(), ".gitignore", "build/\n");
        file(d.path(), "sub/.gitignore", "!keep.log\n");
        let g = gitignore(d.path());
        assert!(g.is_excluded("build", || true));
        assert!(!g.is_excluded("build", || false), "a file named build");
        assert_eq!(
            g.verdict("sub/build/x/keep.log", || false),
            Verdict::Ignored {
                rule: rule(".gitignore", 1, "build/"),
                parent: Some("sub/build".into())
            },
            "a negation cannot re-include a file whose parent is excluded"
        );
    }

    #[test]
    fn the_git_directory_is_never_ignored_by_git_rules_but_info_exclude_applies_elsewhere() {
        let d = tempfile::tempdir().unwrap();
        file(d.path(), ".gitignore", "*\n!*/\n!.gitignore\n");
        file(d.path(), ".git/info/exclude", "secret.txt\n");
        let g = gitignore(d.path());
        assert_eq!(g.verdict(".git/HEAD", || false), Verdict::GitDir);
        assert_eq!(g.verdict(".git", || true), Verdict::GitDir);
        assert!(g.is_excluded("a.txt", || false));

        let d = tempfile::tempdir().unwrap();
        file(d.path(), ".git/info/exclude", "secret.txt\n");
        let g = gitignore(d.path());
        assert_eq!(
            g.verdict("x/secret.txt", || false),
            Verdict::Ignored {
                rule: rule(".git/info/exclude", 1, "secret.txt"),
                parent: None
            }
        );
        assert_eq!(g.ignore_files(), vec![".git/info/exclude".to_string()]);
    }

    #[test]
    fn matchers_are_cached_until_the_gate_reports_a_change() {
        let d = tempfile::tempdir().unwrap();
        file(d.path(), "sub/.gitignore", "*.tmp\n");
        let g = gitignore(d.path());
        assert!(g.is_excluded("sub/a.tmp", || false));
        // A change behind the matcher's back is not seen (cached, no filesystem access)...
        file(d.path(), "sub/.gitignore", "*.bak\n");
        assert!(g.is_excluded("sub/a.tmp", || false));
        assert!(!g.rules_depend_on("sub/a.tmp", false));
        assert!(g.rules_depend_on("sub/.gitignore", false));
        // ...until it is reported.
        g.rules_changed("sub/.gitignore");
        assert!(!g.is_excluded("sub/a.tmp", || false));
        assert!(g.is_excluded("sub/a.bak", || false));
        // A renamed directory takes its matchers with it.
        std::fs::rename(d.path().join("sub"), d.path().join("moved")).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        g.rules_changed("sub");
        assert!(!g.is_excluded("sub/a.bak", || false));
        assert!(g.is_excluded("moved/a.bak", || false));
    }

    #[test]
    fn ignore_files_lists_gitignores_outside_ignored_directories() {
        let d = tempfile::tempdir().unwrap();
        file(d.path(), ".gitignore", "build/\n");
        file(d.path(), "sub/.gitignore", "!keep.log\n");
        file(d.path(), "build/.gitignore", "x\n");
        let g = gitignore(d.path());
        assert_eq!(g.ignore_files(), vec![".gitignore", "sub/.gitignore"]);
        assert!(globs(&[]).ignore_files().is_empty());
    }

    #[test]
    fn the_global_excludes_file_comes_last() {
        let d = tempfile::tempdir().unwrap();
        let global = tempfile::tempdir().unwrap();
        let global_file = global.path().join("ignore");
        std::fs::write(&global_file, "*.bak\n").unwrap();
        file(d.path(), ".gitignore", "!important.bak\n");
        let config = ExclusionConfig {
            respect_gitignore: true,
            ..Default::default()
        };
        let g = Exclusions::new(
            config,
            d.path(),
            open_dir(d.path()),
            Some(global_file.clone()),
        )
        .unwrap();
        let global_name = global_file.display().to_string();
        assert_eq!(
            g.verdict("x/old.bak", || false),
            Verdict::Ignored {
                rule: rule(&global_name, 1, "*.bak"),
                parent: None
            }
        );
        assert!(!g.is_excluded("important.bak", || false));
        assert_eq!(
            g.ignore_files(),
            vec![".gitignore".to_string(), global_name]
        );
    }

    #[test]
    fn an_invalid_line_is_skipped_and_the_others_still_apply() {
        let d = tempfile::tempdir().unwrap();
        file(d.path(), ".gitignore", "a{b\n*.log\n");
        let g = gitignore(d.path());
        assert_eq!(g.verdict("a{b", || false), Verdict::Tracked);
        assert_eq!(
            g.verdict("x.log", || false),
            Verdict::Ignored {
                rule: rule(".gitignore", 2, "*.log"),
                parent: None
            }
        );
    }
}
