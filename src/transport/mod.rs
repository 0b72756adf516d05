//! The FUSE wire: requests in from the kernel, replies out. Nothing here knows about
//! checkpoints.
//!
//! The session is ours ([`session`]): INIT, `/dev/fuse` readers and, where the kernel
//! offers it, the FUSE-over-io_uring queues ([`uring`]); each request is decoded by
//! [`decode`] over the wire structs of [`abi`], served by the [`adapter`] (which maps it
//! to [`crate::fs::PassthroughFs`]'s methods and their `io::Error`s to errnos, nothing
//! else) and answered through [`encode`]: one codec for both transports. [`dev`] holds
//! what stays on `/dev/fuse` whatever the transport: fd clones, passthrough backing ids,
//! notifications. fuser 0.18 keeps its request parser private, so it only lends its
//! public ABI flag types (`InitFlags`, `FopenFlags`, ...) and `FileAttr`/`FileType`; see
//! docs/design.md, "Transport".
pub mod abi;
pub mod adapter;
pub mod decode;
pub mod dev;
pub mod encode;
pub mod session;
pub mod uring;

#[cfg(test)]
mod tests;
