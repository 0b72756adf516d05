//! Layer 3: the JSONL transcript (record types, writer thread, replay).
//!
//! The format is documented in docs/transcript-format.md.
mod fsutil;
pub mod journal;
pub mod mac;
pub mod record;
pub mod replay;
#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "the tests' transcripts, written directly"
)]
pub(crate) mod testutil;
pub mod writer;
