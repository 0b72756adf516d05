//! Reserved for checkpoints pushed to an S3-compatible object store (issue 29): a push
//! queue fed by what `history::store` has sealed, the remote layout, restore and gc.
//!
//! Its rule, decided before its code: nothing in `remote` runs on a FUSE request or the
//! checkpoint marker, so no network wait ever reaches a syscall. It may import
//! `history::store` (data), `state` and `sys`, and nothing above.
