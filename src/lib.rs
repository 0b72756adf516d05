//! checkpointfs: a FUSE passthrough filesystem with a transparent undo stack.
//!
//! Layout: the modules sit in layers, and each imports only from the layers below it
//! (`cli` → subcommands → `daemon`/`unmount` → `control`/`watchdog`/`registry` → `rewind`,
//! [`fuse_adapter`] → [`fs`] (core and gate) → [`history`] → [`transcript`] → [`sys`] and
//! the other leaves). docs/design.md "Code layout" says what each module does;
//! tests/layers.rs enforces the order.
// Every unsafe block states the invariant that makes it sound.
#![warn(clippy::undocumented_unsafe_blocks)]
// Changes to SRC only through the gate's permits: clippy.toml lists the raw mutating calls,
// refused everywhere but in src/fs/gate.rs's private `syscalls` and the modules below whose
// `allow` says what else (never SRC) they change.

pub mod cli;
pub mod commands;
#[allow(
    clippy::disallowed_methods,
    reason = "the control socket's file in STATE, never SRC"
)]
pub mod control;
pub mod daemon;
pub mod durability;
pub mod exit_status;
pub mod fs;
pub mod fuse_adapter;
pub mod fusermount;
pub mod history;
pub mod ids;
#[allow(
    clippy::disallowed_methods,
    reason = "the agents' own settings.json files, never SRC"
)]
pub mod install_hook;
#[allow(
    clippy::disallowed_methods,
    reason = "man pages written to the directory the user names, never SRC"
)]
pub mod manuals;
pub mod mount_options;
pub mod mount_validation;
pub mod mountinfo;
#[allow(
    clippy::disallowed_methods,
    reason = "the per-user mount registry under XDG_RUNTIME_DIR, never SRC"
)]
pub mod registry;
pub mod report;
pub mod rewind;
#[allow(
    clippy::disallowed_methods,
    reason = "the settings file in STATE, never SRC"
)]
pub mod settings;
pub mod spawn;
#[allow(
    clippy::disallowed_methods,
    reason = "the state dir itself (STATE), never SRC"
)]
pub mod state_dir;
pub mod state_lock;
pub mod sys;
#[allow(
    clippy::disallowed_methods,
    reason = "the transcript and journal in STATE, never SRC"
)]
pub mod transcript;
pub mod transport;
pub mod unmount;
pub mod watchdog;
