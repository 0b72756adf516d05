//! Checkpoints pushed to an S3-compatible object store (issue 29; the layout is
//! docs/remote-format.md): the daemon's push worker ([`push`]), what one checkpoint uploads
//! ([`snapshot`]), reading a remote anywhere ([`restore`]), and the repository key that
//! seals and names everything in it ([`key`]).
//!
//! Its rule: nothing in `remote` runs on a FUSE request or the checkpoint marker, so no
//! network wait ever reaches a syscall. The history calls one notification after a
//! checkpoint ([`crate::history::History::on_checkpoint`]); the worker reads checkpoints
//! through the history's views, as `.checkpoint/at/<id>/` shows them, in its own thread.
pub mod format;
pub mod key;
pub mod push;
pub mod repo;
#[allow(
    clippy::disallowed_methods,
    reason = "a restore writes into the empty directory it was given, never SRC"
)]
pub mod restore;
pub mod snapshot;
#[allow(
    clippy::disallowed_methods,
    reason = "a file:// remote's own directory, never SRC"
)]
pub mod url;

pub use push::{PushStatus, Pusher, RemoteTarget};
pub use url::RemoteUrl;
