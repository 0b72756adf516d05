//! The state dir (`--state-dir`, STATE): who may write it, its lock, how durable the
//! backups written into it are, the one way a file in it is replaced whole ([`atomic`]), and
//! the space it keeps for gc ([`reserve`]). (The settings kept with the history are `history::settings`: they are the
//! history's exclusions.)
//!
//! Everything here is about STATE, never SRC. ([`atomic`] also serves the agents' settings
//! files that `install-hook` edits: small files of the user's, never SRC either.)
pub mod atomic;
pub mod dir;
pub mod durability;
pub mod format;
pub mod lock;
pub mod reserve;
