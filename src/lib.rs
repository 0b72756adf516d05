//! checkpointfs: a FUSE passthrough filesystem with a transparent undo stack.
//!
//! Layout (each layer only talks to the one below it):
//! - [`fuse_adapter`]: the FUSE protocol adapter. Decodes a request, calls the core, maps
//!   `io::Error` to an errno in exactly one place.
//! - [`fs`]: the passthrough core (inode and handle tables, the virtual `.checkpoint/` tree)
//!   and the mutation gate through which every change to SRC must pass.
//! - [`history`]: the file-history system: Layer 1 tracking, Layer 2 snapshots, the
//!   content-addressed store and rewind.
//! - [`transcript`]: Layer 3: record types, the writer thread and replay.
//! - [`daemon`]: wiring for one mount (session, signals, shutdown); [`watchdog`]: the
//!   process that aborts the mount's FUSE connection when the daemon dies or stays stopped.
//! - [`cli`]: the command line; [`manuals`]: its completion scripts and man pages.
//! - [`settings`]: mount settings kept in the state dir (exclusions); [`mount_options`]: the
//!   kernel mount options (`-o ro,noexec,noatime,...`).
// Every unsafe block states the invariant that makes it sound.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod commands;
pub mod control;
pub mod daemon;
pub mod durability;
pub mod fs;
pub mod fuse_adapter;
pub mod fusermount;
pub mod history;
pub mod ids;
pub mod install_hook;
pub mod manuals;
pub mod mount_options;
pub mod rewind;
pub mod settings;
pub mod state_dir;
pub mod state_lock;
pub mod sys;
pub mod transcript;
pub mod watchdog;
