//! checkpointfs: a FUSE passthrough filesystem with a transparent undo stack.
//!
//! Layout: each folder is one layer of docs/design.md's layer table, and a layer imports
//! only from the layers below it (tests/it/layers.rs checks the order):
//!
//! | module | layer |
//! |---|---|
//! | [`cli`] | the command line: clap definitions, dispatch, rendering, exit statuses |
//! | [`mount`] | validation, options, spawn, the daemon, unmount, watchdog, registry, control socket |
//! | [`transport`] | the FUSE wire: the adapter between the kernel's requests and the core |
//! | [`rewind`] | a rewind's plan, executed through the passthrough core's gate |
//! | [`fs`] | the passthrough core, the virtual `.checkpoint/` tree, the mutation gate |
//! | [`history`] | Layer 1, checkpoints, the store, views, gc, reports' facts |
//! | [`remote`] | (reserved) checkpoints pushed to an object store |
//! | [`transcript`] | Layer 3: records, writer thread, journal, replay, MACs |
//! | [`state`] | the state dir: who may write it, its lock, durability modes |
//! | [`sys`] | thin syscall helpers, split by concern |
//!
//! `rewind.rs` is the one file beside `main.rs` and `lib.rs` at the top: a layer of a single
//! module.
// Every unsafe block states the invariant that makes it sound.
#![warn(clippy::undocumented_unsafe_blocks)]
// Changes to SRC only through the gate's permits: clippy.toml lists the raw mutating calls,
// refused everywhere but in src/fs/gate.rs's private `syscalls` and the modules whose
// `allow` says what else (never SRC) they change.

pub mod cli;
pub mod fs;
pub mod history;
pub mod mount;
pub mod remote;
pub mod rewind;
#[allow(
    clippy::disallowed_methods,
    reason = "the state dir itself (STATE), never SRC"
)]
pub mod state;
pub mod sys;
pub mod transcript;
pub mod transport;
