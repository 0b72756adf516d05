//! `checkpointfs completions SHELL` and `checkpointfs man [--dir DIR]`, checked against the
//! clap definitions themselves: every subcommand is completed and has a page.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use checkpointfs::Cli;
use clap::CommandFactory;
use common::{cli, stderr, stdout};

/// The subcommands of the real command line, as clap knows them.
fn subcommands() -> Vec<String> {
    let names: Vec<String> = Cli::command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_string())
        .collect();
    assert!(names.len() >= 9, "{names:?}");
    names
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ok(args: &[&str]) -> String {
    let out = cli(args);
    assert!(
        out.status.success(),
        "checkpointfs {args:?}: {}",
        stderr(&out)
    );
    stdout(&out)
}

/// Runs the generated bash completion for the words of `line` (the last one being
/// completed) and returns what it offers.
fn bash_complete(script: &str, words: &[&str]) -> Vec<String> {
    let words_q: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let driver = format!(
        "{script}\nCOMP_WORDS=({})\nCOMP_CWORD={}\n_checkpointfs checkpointfs '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words_q.join(" "),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let mut child = Command::new("bash")
        .arg("--norc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bash");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(driver.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "bash: {}", stderr(&out));
    stdout(&out).lines().map(str::to_string).collect()
}

#[test]
fn bash_completion_offers_every_subcommand_and_their_options() {
    let script = ok(&["completions", "bash"]);
    for sub in subcommands() {
        assert!(
            script.contains(&format!("checkpointfs,{sub})")),
            "{sub} missing from the bash script"
        );
    }
    assert!(
        have("bash"),
        "bash must be installed to run the bash completion"
    );
    let offered = bash_complete(&script, &["checkpointfs", ""]);
    for sub in subcommands() {
        assert!(offered.contains(&sub), "{sub} not offered: {offered:?}");
    }
    let offered = bash_complete(&script, &["checkpointfs", "diff", "--"]);
    for opt in ["--stat", "--json", "--state-dir"] {
        assert!(
            offered.contains(&opt.to_string()),
            "{opt} not offered: {offered:?}"
        );
    }
    let offered = bash_complete(&script, &["checkpointfs", "completions", ""]);
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        assert!(offered.contains(&shell.to_string()), "{shell}: {offered:?}");
    }
}

#[test]
fn every_shell_gets_a_script_naming_every_subcommand() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = ok(&["completions", shell]);
        for sub in subcommands() {
            assert!(script.contains(&sub), "{shell}: {sub} missing");
        }
        // Where the shell is installed, the script must at least parse.
        let check = match shell {
            "bash" => Some(("bash", vec!["-n"])),
            "zsh" => Some(("zsh", vec!["-n"])),
            "fish" => Some(("fish", vec!["--no-execute"])),
            _ => None,
        };
        let Some((prog, args)) = check else { continue };
        if !have(prog) {
            println!("skipped the syntax check of the {shell} script: {prog} is not installed");
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script");
        fs::write(&path, &script).unwrap();
        let out = Command::new(prog).args(&args).arg(&path).output().unwrap();
        assert!(out.status.success(), "{prog} -n: {}", stderr(&out));
    }
}

#[test]
fn completions_refuse_an_unknown_shell() {
    let out = cli(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid value 'tcsh'"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
}

#[test]
fn man_prints_the_top_level_page() {
    let page = ok(&["man"]);
    assert!(page.contains(".TH checkpointfs 1"), "{page}");
    for sub in subcommands() {
        assert!(
            page.contains(&format!("checkpointfs\\-{}(1)", sub.replace('-', "\\-"))),
            "{sub} not listed in the page"
        );
    }
}

#[test]
fn man_dir_writes_one_page_per_subcommand_that_man_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man/man1");
    let listed = ok(&["man", "--dir", dir.to_str().unwrap()]);
    let mut expected = vec!["checkpointfs.1".to_string()];
    expected.extend(subcommands().iter().map(|s| format!("checkpointfs-{s}.1")));
    let mut written: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(written, sorted);
    let listed: Vec<String> = listed.lines().map(str::to_string).collect();
    let expected_paths: Vec<String> = expected
        .iter()
        .map(|f| dir.join(f).display().to_string())
        .collect();
    assert_eq!(listed, expected_paths);

    assert!(
        have("man"),
        "man (package man-db) must be installed: scripts/install-test-deps.sh installs it"
    );
    for sub in Cli::command().get_subcommands() {
        let page = dir.join(format!("checkpointfs-{}.1", sub.get_name()));
        let out = Command::new("man")
            .arg("-l")
            .arg(&page)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "200")
            .output()
            .unwrap();
        assert!(out.status.success(), "man -l {page:?}: {}", stderr(&out));
        let text = stdout(&out);
        let about = sub
            .get_about()
            .expect("every subcommand has an about")
            .to_string();
        assert!(text.contains("NAME"), "{text}");
        assert!(
            text.contains(&format!("checkpointfs {}", env!("CARGO_PKG_VERSION"))),
            "the footer names the program: {text}"
        );
        assert!(text.contains(&about), "{about:?} not in:\n{text}");
    }
}

#[test]
fn man_dir_that_cannot_be_made_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("plain");
    fs::write(&file, "x").unwrap();
    let out = cli(&["man", "--dir", file.join("sub").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(&format!(
            "cannot write man pages to {}",
            file.join("sub").display()
        )),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).is_empty());
    assert_eq!(fs::read_to_string(&file).unwrap(), "x");
}
