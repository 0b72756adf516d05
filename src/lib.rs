//! checkpointfs: a FUSE passthrough filesystem with a transparent undo stack.
//!
//! Layout: the modules sit in layers, and each imports only from the layers below it
//! (`cli` → subcommands → `daemon`/`unmount` → `control`/`watchdog`/`registry` → `rewind`,
//! [`fuse_adapter`] → [`fs`] (core and gate) → [`history`] → [`transcript`] → [`sys`] and
//! the other leaves). docs/design.md "Code layout" says what each module does;
//! tests/layers.rs enforces the order.
// Every unsafe block states the invariant that makes it sound.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod cli;
pub mod commands;
pub mod control;
pub mod daemon;
pub mod durability;
pub mod exit_status;
pub mod fs;
pub mod fuse_adapter;
pub mod fusermount;
pub mod history;
pub mod ids;
pub mod install_hook;
pub mod manuals;
pub mod mount_options;
pub mod mount_validation;
pub mod mountinfo;
pub mod registry;
pub mod rewind;
pub mod settings;
pub mod spawn;
pub mod state_dir;
pub mod state_lock;
pub mod sys;
pub mod transcript;
pub mod unmount;
pub mod watchdog;
