//! The file-history system: what changed, when, and how to get it back.
pub mod store;
