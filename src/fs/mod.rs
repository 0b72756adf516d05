//! The passthrough core.
