//! Layer 3: the JSONL transcript (record types, writer thread, replay).
pub mod record;
pub mod replay;
pub mod writer;
