//! The integration tests: one binary (as jj does), so the shared harness in [`common`] is
//! compiled once and its dead code is reported. Each module is one area; every file in this
//! folder must be declared here (`every_test_file_is_declared` checks it), and the only other
//! test target is tests/gate_compile_fail.rs (trybuild).
//!
//! Most tests mount real FUSE file systems and need root.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]

mod common;

mod agent_claude_code;
mod agent_gemini_cli;
mod agents;
mod branches;
mod budgets;
mod checked_rewind;
mod checkpoints;
mod depth;
mod diff_memory;
mod durability;
mod exclusions;
mod fds;
mod file_handles;
mod fuzz;
mod gc;
mod golden;
mod hardlinks;
mod hook;
mod kernel_caches;
mod layers;
mod leaving;
mod manuals;
mod memory_pressure;
mod messages;
mod mount_cli;
mod mount_options;
mod mount_scripts;
mod open_writers;
mod owner;
mod passthrough;
mod remote;
mod renames;
mod reports;
mod safety;
mod scale;
mod setid;
mod sparse;
mod state_dir;
mod store_reflink;
mod transport;
mod ui;
mod watchdog;
mod xattrs;

/// A test file left out of this list would silently never run.
#[test]
fn every_test_file_is_declared() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("it/main.rs")).unwrap();
    let declared = |name: &str| main.lines().any(|l| l == format!("mod {name};"));
    for entry in std::fs::read_dir(dir.join("it")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() || name == "main" {
            continue;
        }
        assert!(
            declared(&name),
            "tests/it/{name}.rs is not declared in tests/it/main.rs"
        );
    }
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            assert_eq!(
                path.file_name().unwrap(),
                "gate_compile_fail.rs",
                "{} is a test target of its own: put it in tests/it/ and declare it in main.rs",
                path.display()
            );
        }
    }
}
