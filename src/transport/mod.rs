//! The FUSE wire: requests in from the kernel, replies out. Nothing here knows about
//! checkpoints.
//!
//! Today the session is fuser's (it reads `/dev/fuse`, decodes each request and calls the
//! [`adapter`], which calls the passthrough core and encodes the reply): the adapter maps
//! requests to [`crate::fs::PassthroughFs`]'s methods and their `io::Error`s to errnos, and
//! nothing else.
//!
//! Beside it, not yet serving the daemon (issue 26; see docs/transport-uring.md for the
//! integration plan): our own decoding of requests ([`decode`]) and encoding of replies
//! ([`encode`]) over the wire structs ([`abi`]), one codec for both transports, and the
//! FUSE-over-io_uring queues ([`uring`]). fuser 0.18 keeps its request parser private, so
//! a transport of our own needs its own codec; fuser still provides the public ABI flag
//! types (`InitFlags`, `FopenFlags`, ...), `FileAttr`/`FileType`, and mounting.
pub mod abi;
pub mod adapter;
pub mod decode;
pub mod dev;
pub mod encode;
pub mod session;
pub mod uring;

#[cfg(test)]
mod tests;
