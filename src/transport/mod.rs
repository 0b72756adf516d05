//! The FUSE transport below the adapter: our own decoding of requests and encoding of
//! replies (one codec for both transports, `/dev/fuse` and FUSE over io_uring), and the
//! io_uring ring queues.
//!
//! fuser 0.18 keeps its request parser private, so a transport of our own needs its own
//! codec; fuser still provides the public ABI flag types (`InitFlags`, `FopenFlags`, ...),
//! `FileAttr`/`FileType`, and mounting. See docs/transport-uring.md.
pub mod abi;
pub mod decode;
pub mod encode;
pub mod uring;

#[cfg(test)]
mod tests;
