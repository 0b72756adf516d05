//! The state dir (`--state-dir`, STATE): who may write it, its lock, and how durable the
//! backups written into it are. (The settings kept with the history are
//! `history::settings`: they are the history's exclusions.)
//!
//! Everything here is about STATE, never SRC.
pub mod dir;
pub mod durability;
pub mod lock;
