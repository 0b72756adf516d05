//! The FUSE wire: requests in from the kernel, replies out.
//!
//! Today the session is fuser's (it reads `/dev/fuse`, decodes each request and calls the
//! [`adapter`], which calls the passthrough core and encodes the reply). Nothing here knows
//! about checkpoints: the adapter maps requests to [`crate::fs::PassthroughFs`]'s methods
//! and their `io::Error`s to errnos, and nothing else.
pub mod adapter;
