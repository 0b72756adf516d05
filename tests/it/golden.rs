//! Golden tests: what the CLI prints (stdout, stderr, exit status) for a scripted session,
//! and how a state dir written by an older build (8a7cd74, kept in tests/golden/) mounts,
//! logs, diffs, browses and rewinds. They pin behaviour across restructurings: a change to
//! any golden file is a change of behaviour and must be deliberate.
//!
//! `CHECKPOINTFS_BLESS=1 cargo test --test golden` rewrites the golden files from the
//! current output (then review the diff before committing it).
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{TestMount, cli, run, stderr, tree_listing};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the golden file `name`, or rewrites it when blessing.
fn check_golden(name: &str, actual: &str) {
    let path = golden_dir().join(name);
    if std::env::var_os("CHECKPOINTFS_BLESS").is_some() {
        fs::write(&path, actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with CHECKPOINTFS_BLESS=1)", path.display()));
    if expected != actual {
        let diff = similar::TextDiff::from_lines(&expected, actual)
            .unified_diff()
            .header("golden", "actual")
            .to_string();
        panic!("{} differs from the output:\n{diff}", path.display());
    }
}

/// Replaces what legitimately differs from run to run: the temporary paths, times, pids.
struct Normaliser {
    paths: Vec<(String, &'static str)>,
}

impl Normaliser {
    fn new(m: &TestMount) -> Normaliser {
        let mut paths = vec![
            (m.state.display().to_string(), "$STATE"),
            (m.mnt.display().to_string(), "$MNT"),
            (m.src.display().to_string(), "$SRC"),
            (m.root().display().to_string(), "$ROOT"),
        ];
        // Longest first, so that no path is replaced inside a longer one.
        paths.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        Normaliser { paths }
    }

    fn apply(&self, text: &str) -> String {
        let mut s = text.to_string();
        for (path, name) in &self.paths {
            s = s.replace(path.as_str(), name);
        }
        let s = replace_times(&s);
        let s = replace_number_after(&s, "daemon pid ", "<PID>");
        let s = replace_number_after(&s, "\"daemon_pid\": ", "<PID>");
        let s = replace_number_after(&s, "\"time_unix_ns\": ", "<NS>");
        replace_request_counts(&s)
    }
}

/// `"requests": { ... }` (status's FUSE request counts, which depend on what the kernel
/// had cached) → `"requests": <COUNTS>`.
fn replace_request_counts(s: &str) -> String {
    const KEY: &str = "\"requests\": {";
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(KEY) {
        out.push_str(&rest[..at]);
        out.push_str("\"requests\": <COUNTS>");
        let after = &rest[at + KEY.len()..];
        rest = after.find('}').map_or("", |end| &after[end + 1..]);
    }
    out.push_str(rest);
    out
}

/// `2026-12-07T07:17:14.706Z` → `<TIME>`.
fn replace_times(s: &str) -> String {
    let shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    let b = s.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let fits = b.len() - i >= shape.len()
            && shape.bytes().zip(&b[i..]).all(|(want, &got)| match want {
                b'd' => got.is_ascii_digit(),
                other => other == got,
            });
        if fits {
            out.push_str("<TIME>");
            i += shape.len();
        } else {
            let ch = s[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// `{prefix}123` → `{prefix}{token}`, everywhere.
fn replace_number_after(s: &str, prefix: &str, token: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(prefix) {
        let after = &rest[at + prefix.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at + prefix.len()]);
        out.push_str(if digits > 0 { token } else { "" });
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// One transcript of commands: each with its exit status, stdout and stderr.
struct Session<'a> {
    norm: &'a Normaliser,
    text: String,
}

impl Session<'_> {
    fn cli(&mut self, args: &[&str]) -> Output {
        let out = cli(args);
        self.record(args, &out);
        out
    }

    fn record(&mut self, args: &[&str], out: &Output) {
        let shown: Vec<String> = args.iter().map(|a| self.norm.apply(a)).collect();
        let _ = writeln!(self.text, "$ checkpointfs {}", shown.join(" "));
        let _ = writeln!(self.text, "exit: {}", out.status.code().unwrap_or(-1));
        for (name, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            if !bytes.is_empty() {
                let _ = writeln!(self.text, "--- {name}");
                self.text
                    .push_str(&self.norm.apply(&String::from_utf8_lossy(bytes)));
                if !bytes.ends_with(b"\n") {
                    self.text.push_str("\n[no newline at end]\n");
                }
            }
        }
        self.text.push('\n');
    }
}

fn sh(m: &TestMount, script: &str) {
    let out = run("sh", &["-c", &format!("umask 022 && {script}")], &m.mnt);
    assert!(out.status.success(), "sh -c {script:?}: {}", stderr(&out));
}

#[test]
fn a_scripted_cli_session_prints_what_it_always_printed() {
    // Over /dev/fuse, so that `status` names the same transport on every machine (whether
    // FUSE over io_uring is offered depends on the kernel and the host's enable_uring).
    let mut m = TestMount::unmounted(&["--no-io-uring"]);
    fs::write(m.src.join("a.txt"), "alpha\nbeta\n").unwrap();
    fs::write(m.src.join("old.txt"), "x\ny\n").unwrap();
    fs::create_dir(m.src.join("sub")).unwrap();
    fs::write(m.src.join("sub/keep.txt"), "unchanged\n").unwrap();
    std::os::unix::fs::symlink("a.txt", m.src.join("link")).unwrap();
    m.mount();
    let norm = Normaliser::new(&m);
    let mut s = Session {
        norm: &norm,
        text: String::new(),
    };
    let (mnt, state, src) = (
        m.mnt.display().to_string(),
        m.state.display().to_string(),
        m.src.display().to_string(),
    );
    let missing = m.root().join("missing").display().to_string();

    s.cli(&[]);
    s.cli(&["no-such-command"]);
    s.cli(&["mount", &src, &missing]);
    s.cli(&["mount", &src, &mnt, "-o", "bogus"]);
    s.cli(&["checkpoint", &mnt, "m1"]);
    sh(
        &m,
        "printf 'ALPHA\\nbeta\\ngamma\\n' > a.txt && rm old.txt && mkdir d && \
         printf '1\\n2\\n' > d/new.txt && ln -sfn d/new.txt link && chmod 600 sub/keep.txt",
    );
    s.cli(&["checkpoint", &mnt, "m2"]);
    s.cli(&["checkpoint", &mnt, "m2"]);
    s.cli(&["checkpoint", &mnt, "bad/id"]);
    sh(&m, "printf 'more\\n' >> a.txt");
    s.cli(&["log", &mnt]);
    s.cli(&["log", &mnt, "--json"]);
    s.cli(&["diff", &mnt, "m1"]);
    s.cli(&["diff", &mnt, "m1", "m2", "--stat"]);
    s.cli(&["diff", &mnt, "m1", "--json"]);
    s.cli(&["diff", &mnt, "nosuch"]);
    s.cli(&["status", &mnt]);
    s.cli(&["status", &mnt, "--path", "a.txt"]);
    s.cli(&["status", &mnt, "--json"]);
    s.cli(&["rewind", &mnt, "m1", "--dry-run"]);
    s.cli(&["rewind", &mnt, "m1", "--", "a.txt"]);
    s.cli(&["rewind", &mnt, "m1"]);
    s.cli(&["rewind", &mnt, "m1:before-rewind"]);
    s.cli(&["rewind", &mnt, "nosuch"]);
    s.cli(&["gc", &mnt, "--keep", "2", "--dry-run"]);
    s.cli(&["gc", &mnt, "--keep", "0"]);
    s.cli(&["gc", &mnt, "--keep", "3"]);
    s.cli(&["log", &mnt]);
    s.cli(&["umount", &mnt]);
    s.cli(&["umount", &mnt]);
    s.cli(&["log", "--state-dir", &state]);
    s.cli(&["status", "--state-dir", &state]);
    s.cli(&["diff", "--state-dir", &state, "m2"]);
    s.cli(&["log", &mnt]);
    check_golden("cli-session.txt", &s.text);
}

/// The fixture: `state/` and `src/` as 8a7cd74 left them after the session of
/// tests/golden/make-state-fixture.sh, unmounted.
fn unpack_fixture(m: &TestMount) {
    let tar = golden_dir().join("state-8a7cd74.tar.gz");
    fs::remove_dir(&m.src).unwrap();
    fs::remove_dir(&m.state).unwrap();
    let out = run(
        "tar",
        &[
            "-xzpf".as_ref(),
            tar.as_os_str(),
            "--same-owner".as_ref(),
            "-C".as_ref(),
            m.root().as_os_str(),
        ],
        Path::new("/"),
    );
    assert!(out.status.success(), "tar: {}", stderr(&out));
}

/// What a tree holds, one line a path: kind, mode and content hash (as the listing helper
/// gives them).
fn listing(dir: &Path) -> String {
    tree_listing(dir).join("\n") + "\n"
}

#[test]
fn a_state_dir_written_by_8a7cd74_mounts_logs_diffs_and_rewinds_as_before() {
    // Over /dev/fuse, for a `status` that reads the same on every machine (see above).
    let mut m = TestMount::unmounted(&["--no-io-uring"]);
    unpack_fixture(&m);
    let norm = Normaliser::new(&m);
    let mut s = Session {
        norm: &norm,
        text: String::new(),
    };
    let (mnt, state) = (m.mnt.display().to_string(), m.state.display().to_string());

    s.cli(&["log", "--state-dir", &state]);
    m.mount();
    s.cli(&["log", &mnt]);
    s.cli(&["log", &mnt, "--json"]);
    s.cli(&["diff", &mnt, "m1"]);
    s.cli(&["diff", &mnt, "m1", "m3", "--stat"]);
    s.cli(&["status", &mnt]);
    let at = m.mnt.join(".checkpoint/at");
    let mut ids: Vec<String> = fs::read_dir(&at)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    for id in &ids {
        let _ = writeln!(s.text, "## view {id}\n{}", listing(&at.join(id)));
    }
    let _ = writeln!(s.text, "## live\n{}", listing(&m.mnt));
    s.cli(&["rewind", &mnt, "m1"]);
    let _ = writeln!(s.text, "## live after rewind to m1\n{}", listing(&m.mnt));
    assert_eq!(
        tree_listing(&m.mnt),
        tree_listing(&at.join("m1")),
        "a rewind to m1 gives the tree its view shows"
    );
    s.cli(&["rewind", &mnt, "m1:before-rewind"]);
    s.cli(&["rewind", &mnt, "m3"]);
    let _ = writeln!(s.text, "## live after rewind to m3\n{}", listing(&m.mnt));
    s.cli(&["log", &mnt]);
    m.umount();
    s.cli(&["log", "--state-dir", &state]);
    check_golden("state-8a7cd74.txt", &s.text);
}
