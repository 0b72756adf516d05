//! `checkpointfs ui` driven in a real terminal: tmux runs it against a real mount, keys go in
//! with `send-keys`, the screen comes back with `capture-pane`, and tmux's `alternate_on`
//! tells whether the alternate screen was left. tmux rather than a bare pty (python3's `pty`,
//! `expectrl`): it emulates the terminal, so the test reads the screen as the user sees it
//! instead of parsing escape sequences, and resizes it (`resize-window`) like a user does.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{BIN, TestMount, checkpoint, cli, sh, stderr, stdout, wait_until};

/// How long a screen may take to show what is expected (the machine may be loaded).
const SHOW: Duration = Duration::from_secs(20);

/// A tmux server of its own (`-L`), killed when dropped, running one shell script in a
/// window of `width`×`height`.
struct Tmux {
    socket: String,
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts `script` (sh) in a new detached session; `dir()` is its working directory.
    fn start(script: &str, width: u16, height: u16) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let socket = format!(
            "cpfs-ui-{}-{}",
            std::process::id(),
            dir.path().file_name().unwrap().to_string_lossy()
        );
        let t = Tmux { socket, dir };
        t.tmux(&[
            "new-session",
            "-d",
            "-s",
            "ui",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "-c",
            t.dir.path().to_str().unwrap(),
            "sh",
            "-c",
            script,
        ]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .env("TERM", "xterm-256color")
            .output()
            .expect("tmux (package tmux) must be installed");
        assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
        stdout(&out)
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "ui"])
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "ui"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    /// Waits until the screen shows every one of `texts`; the screen.
    fn wait_for(&self, texts: &[&str]) -> String {
        let mut screen = String::new();
        let shown = wait_until(SHOW, || {
            screen = self.screen();
            texts.iter().all(|t| screen.contains(t))
        });
        assert!(
            shown,
            "the screen never showed {texts:?}; it shows:\n{screen}"
        );
        screen
    }

    fn alternate_on(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", "ui", "#{alternate_on}"])
            .trim()
            == "1"
    }

    /// Waits for the file `name` in `dir()` (written by the script); its content.
    fn wait_file(&self, name: &str) -> String {
        let path = self.dir().join(name);
        assert!(
            wait_until(SHOW, || fs::metadata(&path).is_ok_and(|m| m.len() > 0)),
            "{name} never written; the screen:\n{}",
            self.screen()
        );
        fs::read_to_string(path).unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The script: records the terminal's settings, runs `checkpointfs ui ARGS` (its pid in
/// `pid`, its exit status in `rc`), records them again, then stays (so the pane can be read).
fn ui_script(args: &[&str], env: &str) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    format!(
        "stty -a > stty.before; {env} sh -c 'echo $$ > pid; exec \"$0\" ui \"$@\"' '{BIN}' {} ; \
         echo $? > rc; stty -a > stty.after; exec sleep 600",
        args.join(" ")
    )
}

/// a.txt: "one" at c1, "two" at c2, "three" now; b.txt added after c1.
fn history() -> TestMount {
    let mut m = TestMount::unmounted(&[]);
    fs::write(m.src.join("a.txt"), "one\n").unwrap();
    m.mount();
    checkpoint(&m, "c1");
    sh(&m, "sed -i 's/one/two/' a.txt && printf 'bee\\n' > b.txt");
    checkpoint(&m, "c2");
    sh(&m, "sed -i 's/two/three/' a.txt");
    m
}

fn mnt(m: &TestMount) -> &str {
    m.mnt.to_str().unwrap()
}

fn read(m: &TestMount, rel: &str) -> Option<Vec<u8>> {
    fs::read(m.mnt.join(rel)).ok()
}

fn stty_unchanged(t: &Tmux) {
    assert_eq!(t.wait_file("stty.after"), t.wait_file("stty.before"));
    assert!(!t.alternate_on(), "the alternate screen is still on");
}

#[test]
fn browse_diff_restore_rewind_undo_resize_and_quit() {
    let m = history();
    let t = Tmux::start(&ui_script(&[mnt(&m)], ""), 140, 40);
    // The timeline, newest first, with the summaries; the latest's files and diff.
    let screen = t.wait_for(&["Timeline 1/2", "c2  ", "c1  ", "by sed", "Files of c2 1"]);
    assert!(screen.contains("A1 M1 D0  +2 -1"), "{screen}");
    t.wait_for(&["-two", "+three"]);
    // c1: its prompt changed a.txt (one -> two) and added b.txt.
    t.keys(&["j"]);
    t.wait_for(&[
        "Timeline 2/2",
        "Files of c1 2",
        "A b.txt",
        "M a.txt",
        "-one",
        "+two",
    ]);
    // Into the files; restore a.txt to c1, confirmed.
    t.keys(&["Enter", "r"]);
    let screen = t.wait_for(&[
        "Restore this file?",
        "would rewrite",
        "undo with:",
        &format!("  checkpointfs rewind {} c1:before-rewind", mnt(&m)),
    ]);
    assert!(
        screen.contains(&format!("checkpointfs rewind {} c1 -- a.txt", mnt(&m))),
        "{screen}"
    );
    assert_eq!(
        read(&m, "a.txt").unwrap(),
        b"three\n",
        "changed before the y"
    );
    t.keys(&["y"]);
    t.wait_for(&["saved current state as c1:before-rewind"]);
    assert_eq!(read(&m, "a.txt").unwrap(), b"one\n");
    assert_eq!(
        read(&m, "b.txt").unwrap(),
        b"bee\n",
        "only a.txt is restored"
    );
    let log = stdout(&cli(&["log", mnt(&m)]));
    assert!(log.contains("c1:before-rewind"), "{log}");
    // The new checkpoint shows without a key.
    t.wait_for(&["c1:before-rewind [rewind]", "Timeline 3/3"]);
    // The undo id it printed undoes it.
    let out = cli(&["rewind", mnt(&m), "c1:before-rewind"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read(&m, "a.txt").unwrap(), b"three\n");

    // A whole rewind to c1 (selected: the oldest), then its undo, through the keys.
    t.keys(&["h", "G"]);
    t.wait_for(&["Timeline 4/4"]);
    t.keys(&["R"]);
    t.wait_for(&["Rewind the whole tree?", "would remove", "b.txt", "y/Enter"]);
    t.keys(&["y"]);
    t.wait_for(&["rewound to c1", "Timeline 5/5"]);
    assert_eq!(read(&m, "a.txt").unwrap(), b"one\n");
    assert_eq!(read(&m, "b.txt"), None);
    t.keys(&["u"]);
    let undo = t.wait_for(&["Undo the last rewind?", "y/Enter"]);
    assert!(
        undo.contains(&format!(
            "checkpointfs rewind {} c1:before-rewind-2",
            mnt(&m)
        )),
        "{undo}"
    );
    t.keys(&["y"]);
    t.wait_for(&["rewound to c1:before-rewind-2"]);
    assert_eq!(read(&m, "a.txt").unwrap(), b"three\n");
    assert_eq!(read(&m, "b.txt").unwrap(), b"bee\n");

    // 40×10 and back.
    t.tmux(&["resize-window", "-t", "ui", "-x", "40", "-y", "10"]);
    let small = t.wait_for(&["Timeline"]);
    assert!(!small.contains("Files of"), "{small}");
    t.tmux(&["resize-window", "-t", "ui", "-x", "140", "-y", "40"]);
    t.wait_for(&["Timeline", "Files of"]);
    t.keys(&["?"]);
    t.wait_for(&["Keys (any key closes)", "undo the last rewind"]);
    t.keys(&["x", "q"]);
    assert_eq!(t.wait_file("rc").trim(), "0");
    stty_unchanged(&t);
}

#[test]
fn sigterm_restores_the_terminal() {
    let m = history();
    let t = Tmux::start(&ui_script(&[mnt(&m)], "NO_COLOR=1"), 100, 30);
    t.wait_for(&["Timeline 1/2"]);
    assert!(t.alternate_on());
    let pid: i32 = t.wait_file("pid").trim().parse().unwrap();
    // SAFETY: kill with a pid this test's script started and a valid signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert_eq!(t.wait_file("rc").trim(), "143");
    stty_unchanged(&t);
}

#[test]
fn a_mount_that_goes_away_gives_a_message() {
    let mut m = history();
    let t = Tmux::start(&ui_script(&[mnt(&m)], ""), 100, 30);
    t.wait_for(&["Timeline 1/2"]);
    m.umount();
    t.wait_for(&["The mount went away", "Press q to quit"]);
    t.keys(&["q"]);
    assert_eq!(t.wait_file("rc").trim(), "0");
    stty_unchanged(&t);
}

#[test]
fn a_state_dir_browses_offline_and_refuses_to_change() {
    let mut m = history();
    m.umount();
    let state: PathBuf = m.state.clone();
    let t = Tmux::start(
        &ui_script(&["--state-dir", state.to_str().unwrap()], ""),
        140,
        40,
    );
    t.wait_for(&["Timeline 1/2", "Files of c2 1", "+three"]);
    t.keys(&["R"]);
    t.wait_for(&["read-only"]);
    t.keys(&["q"]);
    assert_eq!(t.wait_file("rc").trim(), "0");
}
