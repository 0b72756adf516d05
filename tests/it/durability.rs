//! `--durability strict|batched|process` on a real mount: in every mode, `kill -9` of the
//! daemon right after many changes loses no pre-image (views and rewind give every file back
//! byte for byte), and the strict mode makes at most one sync per backup on the syscall path.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use crate::common;

use std::fs;
use std::path::Path;

use common::{TestMount, at, checkpoint, rewind, sh, tree_listing};

const FILES: usize = 60;

/// Distinct content for file `i`, some of it big enough to take more than one write.
fn content(i: usize, round: &str) -> Vec<u8> {
    let mut v = format!("{round} {i}\n").into_bytes();
    if i.is_multiple_of(10) {
        v.extend(
            (0..200_000u32)
                .map(|n| (n.wrapping_mul(2_654_435_761).wrapping_add(i as u32) >> 24) as u8),
        );
    }
    v
}

fn seed(src: &Path) {
    fs::create_dir(src.join("d")).unwrap();
    for i in 0..FILES {
        fs::write(src.join(format!("d/f{i:03}")), content(i, "original")).unwrap();
    }
}

/// Changes every file in every way Layer 1 backs up: overwrite, append, truncate, remove
/// (or re-create), rename over, and a new file.
fn change_everything(m: &TestMount, round: &str) {
    for i in 0..FILES {
        let p = m.mnt.join(format!("d/f{i:03}"));
        match i % 5 {
            0 => fs::write(&p, content(i, round)).unwrap(),
            1 => {
                use std::io::Write;
                let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
                f.write_all(round.as_bytes()).unwrap();
            }
            2 => fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .and_then(|f| f.set_len(1))
                .unwrap(),
            // Removed in one round, back in the next.
            3 if p.exists() => fs::remove_file(&p).unwrap(),
            3 => fs::write(&p, content(i, round)).unwrap(),
            _ => {
                let tmp = m.mnt.join(format!("d/tmp{i:03}"));
                fs::write(&tmp, content(i, round)).unwrap();
                fs::rename(&tmp, &p).unwrap();
            }
        }
    }
    fs::write(m.mnt.join(format!("d/new-{round}")), round).unwrap();
}

/// The last stats line the daemon logged at unmount, as (backups, syncs, max per backup).
fn layer1_stats(log: &str, mode: &str) -> (u64, u64, u64) {
    let tag = format!("layer 1 ({mode} durability): ");
    let line = log
        .lines()
        .rfind(|l| l.contains(&tag))
        .unwrap_or_else(|| panic!("no {tag:?} line in the daemon log:\n{log}"));
    let rest = &line[line.find(&tag).unwrap() + tag.len()..];
    let num = |after: &str| -> u64 {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let i = words
            .iter()
            .position(|w| *w == after)
            .unwrap_or_else(|| panic!("no {after:?} in {line:?}"));
        words[i - 1]
            .trim_start_matches('(')
            .parse()
            .unwrap_or_else(|_| panic!("{line:?}"))
    };
    let max = rest
        .rsplit("at most ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no maximum in {line:?}"));
    (num("backups"), num("syncs"), max)
}

fn kill9_keeps_every_pre_image(mode: &str) {
    let mut m = TestMount::unmounted(&["--durability", mode]);
    seed(&m.src);
    m.mount();
    checkpoint(&m, "c1");
    let at_c1 = tree_listing(&m.mnt);
    change_everything(&m, "second");
    checkpoint(&m, "c2");
    let at_c2 = tree_listing(&m.mnt);
    // Pre-images of c2's state taken by Layer 1 and nothing else: no checkpoint after them,
    // no unmount, no flush.
    change_everything(&m, "third");
    sh(&m, "rm -r d/new-second && mkdir d/sub && echo x > d/sub/y");
    m.kill9();

    m.mount();
    assert_eq!(
        tree_listing(&at(&m, "c1")),
        at_c1,
        "{mode}: at/c1 after kill -9"
    );
    assert_eq!(
        tree_listing(&at(&m, "c2")),
        at_c2,
        "{mode}: at/c2 after kill -9"
    );
    for i in 0..FILES {
        let view = at(&m, "c1").join(format!("d/f{i:03}"));
        assert_eq!(
            fs::read(&view).unwrap(),
            content(i, "original"),
            "{mode}: {}",
            view.display()
        );
    }
    rewind(&m, "c2", &[]);
    assert_eq!(
        tree_listing(&m.mnt),
        at_c2,
        "{mode}: rewind to c2 after kill -9"
    );
    rewind(&m, "c1", &[]);
    assert_eq!(
        tree_listing(&m.mnt),
        at_c1,
        "{mode}: rewind to c1 after kill -9"
    );
    assert_eq!(tree_listing(&m.src), at_c1, "{mode}: SRC after the rewind");

    // What the syscall path paid, from the line the daemon logs at unmount.
    change_everything(&m, "fourth");
    m.umount();
    let (backups, syncs, max) = layer1_stats(&m.daemon_log(), mode);
    assert!(
        backups >= FILES as u64,
        "{mode}: only {backups} Layer 1 backups counted for {FILES} changed files"
    );
    match mode {
        "strict" => {
            assert!(
                max <= 1,
                "{mode}: a backup made {max} syncs on the syscall path"
            );
            assert!(
                syncs >= backups,
                "{mode}: {syncs} syncs for {backups} backups: some were not durable"
            );
        }
        _ => assert_eq!(syncs, 0, "{mode}: syncs on the syscall path"),
    }
}

#[test]
fn strict_kill9_keeps_every_pre_image_with_one_sync_per_backup() {
    kill9_keeps_every_pre_image("strict");
}

#[test]
fn batched_kill9_keeps_every_pre_image_without_syncs_on_the_syscall_path() {
    kill9_keeps_every_pre_image("batched");
}

#[test]
fn process_kill9_keeps_every_pre_image() {
    kill9_keeps_every_pre_image("process");
}

#[test]
fn an_unknown_durability_is_refused_with_the_choices() {
    let out = common::cli(&[
        "mount",
        "/nonexistent-src",
        "/nonexistent-mnt",
        "--durability",
        "fast",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(
        err.contains("strict") && err.contains("batched") && err.contains("process"),
        "{err}"
    );
}
