//! Exclusions on real mounts: `--respect-gitignore` with nested `.gitignore` files,
//! negations, directory and anchored patterns, `.git/info/exclude`, the git directory,
//! rules edited through the mount, `--exclude` alongside, settings kept across remounts,
//! and `status --path` / `status --json` explaining each case.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::Path;

use common::{TestMount, at, checkpoint, cli, rewind, sh, stderr, stdout};
use serde_json::Value;

/// Bytes no text tool would produce, to check restores byte for byte.
fn binary(seed: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8).wrapping_mul(seed)).collect()
}

fn write(root: &Path, rel: &str, data: impl AsRef<[u8]>) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

/// A project with nested ignore rules:
/// - `.gitignore`: `*.log` (line 2), `/only-root.tmp` (3), `build/` (4)
/// - `sub/.gitignore`: `!keep.log` (1)
fn seed_project(src: &Path) {
    write(
        src,
        ".gitignore",
        "# generated\n*.log\n/only-root.tmp\nbuild/\n",
    );
    write(src, "sub/.gitignore", "!keep.log\n");
    write(src, "a.txt", "alpha\n");
    write(src, "sub/code.bin", binary(7));
    write(src, "sub/keep.log", "kept log\n");
    write(src, "sub/drop.log", "dropped log\n");
    write(src, "app.log", "app log\n");
    write(src, "only-root.tmp", "root tmp\n");
    write(src, "sub/only-root.tmp", "sub tmp\n");
    write(src, "build/out.o", "object\n");
    write(src, "sub/build/x.txt", "nested build\n");
}

/// Unmounted directories whose daemon sees no git configuration but `gitconfig` (the
/// global excludes file is found through it), so the machine's own cannot change results.
fn unmounted_with_gitconfig(args: &[&str], gitconfig: &str) -> TestMount {
    let mut m = TestMount::unmounted(args);
    let home = m.root().join("home");
    fs::create_dir(&home).unwrap();
    let config = home.join("gitconfig");
    fs::write(&config, gitconfig).unwrap();
    for (key, value) in [
        ("HOME", home.to_str().unwrap()),
        ("XDG_CONFIG_HOME", home.to_str().unwrap()),
        ("GIT_CONFIG_GLOBAL", config.to_str().unwrap()),
        ("GIT_CONFIG_SYSTEM", "/dev/null"),
    ] {
        m.set_env(key, value);
    }
    m
}

fn unmounted(args: &[&str]) -> TestMount {
    unmounted_with_gitconfig(args, "")
}

fn mounted(args: &[&str]) -> TestMount {
    let mut m = unmounted(args);
    seed_project(&m.src);
    m.mount();
    m
}

fn transcript(m: &TestMount) -> String {
    let out = cli(&["log", m.mnt.to_str().unwrap()]); // flushes the transcript
    assert!(out.status.success(), "{}", stderr(&out));
    fs::read_to_string(m.state.join("transcript.jsonl")).unwrap()
}

/// Whether `rel` has a backup record in the transcript.
fn recorded(transcript: &str, rel: &str) -> bool {
    transcript.contains(&format!("\"{rel}\":"))
}

/// `status MNT --path P`: one line, the answer for P.
fn status_path(m: &TestMount, p: &str) -> String {
    let out = cli(&["status", m.mnt.to_str().unwrap(), "--path", p]);
    assert!(out.status.success(), "status --path {p}: {}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "status --path {p}: {text}");
    text.trim_end().to_string()
}

fn status_json(args: &[&str]) -> Value {
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = cli(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

fn read(root: &Path, rel: &str) -> Vec<u8> {
    fs::read(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn nested_gitignore_rules_decide_what_is_backed_up_and_what_rewind_restores() {
    nested_rules(&[]);
}

#[test]
fn nested_gitignore_rules_without_passthrough() {
    nested_rules(&["--no-passthrough"]);
}

/// `--respect-gitignore` and `extra`.
fn gitignore_and<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--respect-gitignore"];
    args.extend_from_slice(extra);
    args
}

fn nested_rules(extra: &[&str]) {
    let m = mounted(&gitignore_and(extra));
    checkpoint(&m, "m1");

    // Every file changes: with std::fs, sed -i (temp file + rename) and shell appends.
    fs::write(m.mnt.join("sub/code.bin"), binary(13)).unwrap();
    fs::write(m.mnt.join("only-root.tmp"), "root tmp changed\n").unwrap();
    sh(
        &m,
        "sed -i 's/alpha/ALPHA/' a.txt && sed -i 's/kept/KEPT/' sub/keep.log \
         && echo more >> app.log && echo more >> sub/drop.log \
         && echo changed > sub/only-root.tmp && echo changed > build/out.o \
         && echo changed > sub/build/x.txt && mkdir -p build/new sub/build/deep \
         && echo new > build/new/n.o && echo new > sub/build/deep/keep.log \
         && echo new > new.txt && echo new > new.log",
    );
    checkpoint(&m, "m2");

    let t = transcript(&m);
    for tracked in [
        "a.txt",
        "sub/code.bin",
        "sub/keep.log",
        "sub/only-root.tmp",
        "new.txt",
    ] {
        assert!(recorded(&t, tracked), "{tracked} not backed up:\n{t}");
    }
    for ignored in [
        "app.log",
        "sub/drop.log",
        "only-root.tmp",
        "build",
        "build/out.o",
        "build/new",
        "build/new/n.o",
        "sub/build/x.txt",
        "sub/build/deep/keep.log",
        "new.log",
    ] {
        assert!(!recorded(&t, ignored), "{ignored} was backed up:\n{t}");
    }

    // The view of m1: tracked files as they were, ignored ones as they are (untracked).
    let m1 = at(&m, "m1");
    assert_eq!(read(&m1, "a.txt"), b"alpha\n");
    assert_eq!(read(&m1, "sub/code.bin"), binary(7));
    assert_eq!(read(&m1, "sub/keep.log"), b"kept log\n");
    assert!(!m1.join("new.txt").exists());
    assert_eq!(read(&m1, "app.log"), b"app log\nmore\n");

    rewind(&m, "m1", &[]);
    // Tracked files are back byte for byte; the new tracked file is gone.
    assert_eq!(read(&m.mnt, "a.txt"), b"alpha\n");
    assert_eq!(read(&m.mnt, "sub/code.bin"), binary(7));
    assert_eq!(read(&m.mnt, "sub/keep.log"), b"kept log\n");
    assert_eq!(read(&m.mnt, "sub/only-root.tmp"), b"sub tmp\n");
    assert!(!m.mnt.join("new.txt").exists());
    // Ignored files are left exactly as they are, new ones included.
    assert_eq!(read(&m.mnt, "app.log"), b"app log\nmore\n");
    assert_eq!(read(&m.mnt, "sub/drop.log"), b"dropped log\nmore\n");
    assert_eq!(read(&m.mnt, "only-root.tmp"), b"root tmp changed\n");
    assert_eq!(read(&m.mnt, "build/out.o"), b"changed\n");
    assert_eq!(read(&m.mnt, "build/new/n.o"), b"new\n");
    assert_eq!(read(&m.mnt, "sub/build/x.txt"), b"changed\n");
    assert_eq!(read(&m.mnt, "sub/build/deep/keep.log"), b"new\n");
    assert_eq!(read(&m.mnt, "new.log"), b"new\n");
}

#[test]
fn editing_a_gitignore_through_the_mount_changes_what_is_tracked_next() {
    edited_rules(&[]);
}

#[test]
fn editing_a_gitignore_without_passthrough() {
    edited_rules(&["--no-passthrough"]);
}

fn edited_rules(extra: &[&str]) {
    let mut m = unmounted(&gitignore_and(extra));
    write(&m.src, "sub/.gitignore", "*.tmp\n");
    write(&m.src, "sub/x.tmp", "x0\n");
    write(&m.src, "sub/y.dat", "y0\n");
    write(&m.src, "sub/z.tmp", "z0\n");
    m.mount();
    checkpoint(&m, "m1");

    sh(&m, "echo x1 > sub/x.tmp");
    assert!(!recorded(&transcript(&m), "sub/x.tmp"));

    // Appended through a handle: the rule counts once the file is closed.
    sh(&m, "echo '!x.tmp' >> sub/.gitignore");
    assert!(status_path(&m, "sub/x.tmp").contains("(negation) — tracked"));
    sh(&m, "echo x2 > sub/x.tmp");
    assert!(recorded(&transcript(&m), "sub/x.tmp"));

    // Rewritten by sed -i (a new file renamed over the old one).
    sh(&m, "sed -i 's/^\\*\\.tmp$/*.dat/' sub/.gitignore");
    assert_eq!(
        fs::read_to_string(m.mnt.join("sub/.gitignore")).unwrap(),
        "*.dat\n!x.tmp\n"
    );
    sh(&m, "echo y1 > sub/y.dat");
    assert!(!recorded(&transcript(&m), "sub/y.dat"));
    // The .tmp rule is gone: z.tmp is tracked from its next change on (not before).
    assert!(!recorded(&transcript(&m), "sub/z.tmp"));
    sh(&m, "echo z1 > sub/z.tmp");
    assert!(recorded(&transcript(&m), "sub/z.tmp"));

    // Written through a handle held open while other changes load the rules: what is
    // written counts once the file is closed.
    let py = "f = open('sub/.gitignore', 'a')\n\
              f.write('*.gen\\n'); f.flush()\n\
              open('sub/mid.txt', 'w').write('m')\n\
              f.write('*.late\\n'); f.flush()\n\
              open('sub/mid2.txt', 'w').write('m')\n\
              f.close()\n\
              open('sub/after.late', 'w').write('a')\n";
    let out = common::run("python3", &["-c", py], &m.mnt);
    assert!(out.status.success(), "{}", stderr(&out));
    let t = transcript(&m);
    assert!(
        recorded(&t, "sub/mid.txt") && !recorded(&t, "sub/after.late"),
        "{t}"
    );
    sh(&m, "printf '*.dat\\n!x.tmp\\n' > sub/.gitignore");

    // Deleted: nothing in sub is ignored any more.
    sh(&m, "rm sub/.gitignore && echo y2 > sub/y.dat");
    assert!(recorded(&transcript(&m), "sub/y.dat"));

    // Created, then the directory renamed: the rules move with it. But a change below where
    // a rename moved tracked content is recorded even when excluded (format 4: a view of an
    // older checkpoint resolves `sub/a.gen` through the rename to `moved/a.gen`, which must
    // show it absent then), until gc drops the rename.
    sh(
        &m,
        "echo '*.gen' > sub/.gitignore && mv sub moved && echo g > moved/a.gen",
    );
    assert!(recorded(&transcript(&m), "moved/a.gen"));
    let status = status_path(&m, "moved/a.gen");
    assert!(
        status.contains(
            "excluded by moved/.gitignore:1 '*.gen', but tracked: a rename in the history moved \
             tracked content here"
        ),
        "{status}"
    );
    sh(&m, "mkdir sub && echo g > sub/a.gen");
    assert!(recorded(&transcript(&m), "sub/a.gen"));
}

#[test]
fn git_info_exclude_applies_and_the_git_directory_stays_tracked() {
    let mut m = unmounted(&["--respect-gitignore"]);
    write(&m.src, ".git/HEAD", "ref: refs/heads/main\n");
    write(&m.src, ".git/info/exclude", "secret.txt\n");
    // Even a rule that names git's files does not exclude the git directory.
    write(&m.src, ".gitignore", "HEAD\nindex\n");
    write(&m.src, "secret.txt", "s0\n");
    write(&m.src, "other.txt", "o0\n");
    m.mount();
    checkpoint(&m, "m1");

    sh(
        &m,
        "echo s1 > secret.txt && echo 'ref: refs/heads/x' > .git/HEAD && echo i > .git/index",
    );
    let t = transcript(&m);
    assert!(!recorded(&t, "secret.txt"), "{t}");
    assert!(
        recorded(&t, ".git/HEAD") && recorded(&t, ".git/index"),
        "{t}"
    );
    assert!(status_path(&m, "secret.txt").contains("excluded by .git/info/exclude:1 'secret.txt'"));
    assert!(status_path(&m, ".git/HEAD").contains("tracked (in the git directory"));

    // .git/info/exclude edited through the mount applies to the next change.
    sh(
        &m,
        "echo other.txt >> .git/info/exclude && echo o1 > other.txt",
    );
    assert!(!recorded(&transcript(&m), "other.txt"));

    rewind(&m, "m1", &[]);
    assert_eq!(read(&m.mnt, ".git/HEAD"), b"ref: refs/heads/main\n");
    assert!(!m.mnt.join(".git/index").exists());
    assert_eq!(read(&m.mnt, "secret.txt"), b"s1\n");
}

#[test]
fn status_explains_each_path_and_lists_the_exclusion_sources() {
    let m = mounted(&["--respect-gitignore", "--exclude", "target"]);
    checkpoint(&m, "m1");
    sh(
        &m,
        "echo changed > a.txt && mkdir target && echo t > target/x",
    );
    let mnt = m.mnt.to_str().unwrap();

    let cases = [
        (
            "a.txt",
            "a.txt: tracked; backed up in the current message 'm1'; 1 version in the history",
        ),
        (
            "sub/code.bin",
            "sub/code.bin: tracked; no backup in the current message 'm1'",
        ),
        (
            "target/x",
            "target/x: excluded by --exclude 'target'; no backup in the current message 'm1'",
        ),
        (
            "app.log",
            "app.log: excluded by .gitignore:2 '*.log'; no backup in the current message 'm1'",
        ),
        (
            "only-root.tmp",
            "only-root.tmp: excluded by .gitignore:3 '/only-root.tmp'; no backup",
        ),
        ("sub/only-root.tmp", "sub/only-root.tmp: tracked; no backup"),
        (
            "sub/keep.log",
            "sub/keep.log: not excluded by sub/.gitignore:1 '!keep.log' (negation) — tracked; no backup",
        ),
        (
            "sub/build/keep.log",
            "sub/build/keep.log: excluded by .gitignore:4 'build/' (matches its parent directory sub/build); does not exist",
        ),
        (
            "build",
            "build: excluded by .gitignore:4 'build/'; no backup",
        ),
        (
            "sub/new.log",
            "sub/new.log: excluded by .gitignore:2 '*.log'; does not exist",
        ),
        ("sub/new.txt", "sub/new.txt: tracked; does not exist"),
        // A directory that does not exist yet, named as one.
        (
            "newdir/build/",
            "newdir/build: excluded by .gitignore:4 'build/'; does not exist",
        ),
        ("newdir/build", "newdir/build: tracked; does not exist"),
    ];
    for (p, expected) in cases {
        let line = status_path(&m, p);
        assert!(
            line.starts_with(expected),
            "{p}:\n  got  {line}\n  want {expected}..."
        );
    }
    // Absolute paths inside the mount work; outside it is a usage error.
    let abs = m.mnt.join("app.log");
    assert!(
        status_path(&m, abs.to_str().unwrap()).starts_with("app.log: excluded by .gitignore:2")
    );
    let out = cli(&["status", mnt, "--path", "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("is not inside the mount"),
        "{}",
        stderr(&out)
    );

    assert!(
        m.daemon_log()
            .contains("exclusions: --exclude 'target', gitignore on"),
        "{}",
        m.daemon_log()
    );
    let out = cli(&["status", mnt]);
    let text = stdout(&out);
    assert!(text.contains("exclude:        'target'\n"), "{text}");
    assert!(text.contains("exclude-from:   (none)\n"), "{text}");
    assert!(
        text.contains("gitignore:      on: .gitignore, sub/.gitignore\n"),
        "{text}"
    );

    let j = status_json(&[mnt, "--path", "sub/build/keep.log"]);
    assert_eq!(j["schema"], "checkpointfs.status/1");
    assert_eq!(j["mounted"], true);
    assert_eq!(j["checkpoints"]["count"], 1);
    assert_eq!(j["checkpoints"]["latest"]["id"], "m1");
    let ns = j["checkpoints"]["latest"]["time_unix_ns"].as_i64().unwrap();
    assert!(
        ns > 0 && ns % 1_000_000 == 0,
        "milliseconds, as the transcript keeps: {ns}"
    );
    assert_eq!(j["exclusions"]["exclude"], serde_json::json!(["target"]));
    assert_eq!(j["exclusions"]["respect_gitignore"], true);
    assert_eq!(
        j["exclusions"]["ignore_files"],
        serde_json::json!([".gitignore", "sub/.gitignore"])
    );
    let p = &j["path"];
    assert_eq!(p["path"], "sub/build/keep.log");
    assert_eq!(p["exists"], false);
    assert_eq!(p["tracked"], false);
    assert_eq!(p["reason"]["kind"], "gitignore");
    assert_eq!(p["reason"]["source"], ".gitignore");
    assert_eq!(p["reason"]["line"], 4);
    assert_eq!(p["reason"]["pattern"], "build/");
    assert_eq!(p["reason"]["parent"], "sub/build");
    assert_eq!(
        p["text"].as_str().unwrap(),
        status_path(&m, "sub/build/keep.log")
    );

    let a = &status_json(&[mnt, "--path", "a.txt"])["path"];
    assert_eq!(a["tracked"], true);
    assert_eq!(a["reason"]["kind"], "none");
    assert_eq!(a["backup_in_current_message"], true);
    assert_eq!(a["current_message"], "m1");
    assert_eq!(a["versions"], 1);
    let keep = &status_json(&[mnt, "--path", "sub/keep.log"])["path"];
    assert_eq!(keep["reason"]["kind"], "gitignore-negation");
    assert_eq!(keep["reason"]["pattern"], "!keep.log");
    assert_eq!(keep["backup_in_current_message"], false);
    let t = &status_json(&[mnt, "--path", "target/x"])["path"];
    assert_eq!(t["reason"]["kind"], "exclude");
    assert_eq!(t["reason"]["source"], "--exclude");
}

#[test]
fn remount_keeps_the_exclusion_settings_and_flags_replace_them() {
    let lists = tempfile::tempdir().unwrap();
    let list = lists.path().join("more-excludes");
    fs::write(&list, "*.gen\n").unwrap();
    let list = list.to_str().unwrap().to_string();
    let mut m = mounted(&[
        "--respect-gitignore",
        "--exclude",
        "target",
        "--exclude-from",
        &list,
    ]);
    m.umount();

    // No exclusion flags: the saved settings apply, as the unmounted status says too.
    m.set_args(&[]);
    m.mount();
    let state = m.state.to_str().unwrap().to_string();
    sh(
        &m,
        "echo x >> app.log && mkdir target && echo t > target/t && echo g > a.gen",
    );
    let t = transcript(&m);
    assert!(!recorded(&t, "app.log") && !recorded(&t, "target/t") && !recorded(&t, "a.gen"));
    m.umount();
    let j = status_json(&["--state-dir", &state, "--path", "app.log"]);
    assert_eq!(j["mounted"], false);
    assert_eq!(j["exclusions"]["respect_gitignore"], true);
    assert_eq!(j["exclusions"]["exclude"], serde_json::json!(["target"]));
    assert_eq!(j["exclusions"]["exclude_from"][0]["file"], list.as_str());
    assert_eq!(
        j["exclusions"]["exclude_from"][0]["patterns"],
        serde_json::json!(["*.gen"])
    );
    assert_eq!(j["path"]["reason"]["kind"], "gitignore");
    // Absolute paths name the tree through the last mount point or the source.
    for root in [&m.mnt, &m.src] {
        let abs = root.join("sub/keep.log");
        let j = status_json(&["--state-dir", &state, "--path", abs.to_str().unwrap()]);
        assert_eq!(j["path"]["path"], "sub/keep.log");
        assert_eq!(j["path"]["reason"]["kind"], "gitignore-negation");
    }
    let out = cli(&["status", "--state-dir", &state, "--path", "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("is not inside the tree of"),
        "{}",
        stderr(&out)
    );

    // An --exclude-from file is read again at each mount.
    fs::write(&list, "*.gen2\n").unwrap();
    // A flag replaces its own setting only.
    m.set_args(&["--no-respect-gitignore"]);
    m.mount();
    let mnt = m.mnt.to_str().unwrap().to_string();
    let j = status_json(&[&mnt]);
    assert_eq!(j["exclusions"]["respect_gitignore"], false);
    assert_eq!(j["exclusions"]["exclude"], serde_json::json!(["target"]));
    assert_eq!(
        j["exclusions"]["exclude_from"][0]["patterns"],
        serde_json::json!(["*.gen2"])
    );
    sh(&m, "echo y >> app.log");
    assert!(recorded(&transcript(&m), "app.log"));
    m.umount();

    m.set_args(&["--no-exclude"]);
    m.mount();
    let j = status_json(&[&mnt]);
    assert_eq!(j["exclusions"]["exclude"], serde_json::json!([]));
    assert_eq!(j["exclusions"]["exclude_from"], serde_json::json!([]));
    assert_eq!(j["exclusions"]["respect_gitignore"], false);
    m.umount();

    // A corrupt settings file refuses the mount, naming it; nothing is mounted or changed.
    let settings = m.state.join("settings.json");
    fs::write(&settings, "{ not json").unwrap();
    let out = cli(&[
        "mount",
        m.src.to_str().unwrap(),
        &mnt,
        "--state-dir",
        &state,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("settings.json is not valid"),
        "{}",
        stderr(&out)
    );
    assert!(!common::is_mount_point(&m.mnt));
    assert_eq!(fs::read_to_string(&settings).unwrap(), "{ not json");
}

#[test]
fn the_global_core_excludes_file_applies_below_the_gitignore_files() {
    let outside = tempfile::tempdir().unwrap();
    let global = outside.path().join("global-ignore");
    fs::write(&global, "*.bak\n").unwrap();
    let gitconfig = format!("[core]\n\texcludesFile = {}\n", global.display());
    let mut m = unmounted_with_gitconfig(&["--respect-gitignore"], &gitconfig);
    write(&m.src, ".gitignore", "!important.bak\n");
    write(&m.src, "old.bak", "o\n");
    write(&m.src, "important.bak", "i\n");
    m.mount();
    checkpoint(&m, "m1");
    sh(&m, "echo o1 > old.bak && echo i1 > important.bak");
    let t = transcript(&m);
    assert!(
        !recorded(&t, "old.bak") && recorded(&t, "important.bak"),
        "{t}"
    );

    let global = global.to_str().unwrap();
    assert!(
        status_path(&m, "old.bak").starts_with(&format!("old.bak: excluded by {global}:1 '*.bak'")),
        "{}",
        status_path(&m, "old.bak")
    );
    let j = status_json(&[m.mnt.to_str().unwrap()]);
    assert_eq!(j["exclusions"]["global_excludes_file"], global);
    assert_eq!(
        j["exclusions"]["ignore_files"],
        serde_json::json!([".gitignore", global])
    );
}
