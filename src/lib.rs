//! checkpointfs: a FUSE passthrough filesystem with a transparent undo stack.
//!
//! Layout: each folder is one layer of docs/design.md's layer table, and a layer imports
//! only from the layers below it (tests/it/layers.rs checks the order):
//!
//! | module | layer |
//! |---|---|
//! | [`cli`] | the command line: clap definitions, dispatch, rendering, exit statuses |
//! | [`mount`] | validation, options, spawn, the daemon, unmount, watchdog, registry, control socket |
//! | [`transport`] | the FUSE wire: the adapter between the kernel's requests and the core |
//! | [`rewind`] | a rewind's plan, executed through the passthrough core's gate |
//! | [`merge`] | a branch's three-way merge back into the main tree, as a plan (no mount) |
//! | [`fs`] | the passthrough core, the virtual `.checkpoint/` tree, the mutation gate |
//! | [`history`] | Layer 1, checkpoints, the store, views, gc, reports' facts |
//! | [`remote`] | checkpoints pushed to an object store (docs/remote-format.md) |
//! | [`transcript`] | Layer 3: records, writer thread, journal, replay, MACs |
//! | [`state`] | the state dir: who may write it, its lock, durability modes |
//! | [`sys`] | thin syscall helpers, split by concern |
//!
//! `rewind.rs` is the one file beside `main.rs` and `lib.rs` at the top: a layer of a single
//! module.
//!
//! ## Public surface
//! Every module is `pub(crate)` but two, so the compiler reports dead code:
//! - [`fs`]: the gate's compile-fail tests (tests/compile-fail/) try to forge its permits
//!   from outside the crate and must fail for the gate's own reasons;
//! - [`transport`]: the FUSE codec's fuzz target and examples/uring_proof.rs drive it.
//!
//! Re-exported at the root, for main.rs, the integration tests (tests/it/), the fuzz
//! targets (tests/fuzz/props.rs) and the examples: [`main`] and [`Cli`]; checkpoint ids and
//! `ctl` lines ([`validate_id`], [`take_ctl_lines`], [`CtlLine`], [`MAX_CTL_LINE`]); the
//! control socket's parser ([`parse_request`], [`MAX_REQUEST`]); replay
//! ([`read_transcript`], [`replay_for_fuzzing`]), the store journal ([`Journal`],
//! [`JOURNAL_FILE_NAME`]) and record signing ([`RecordKey`], [`Signer`], [`rfc3339`]); the
//! store ([`Store`], [`CopyMethod`]); mounting helpers the examples use
//! ([`mount_with_fusermount`], [`MountOptions`], [`mount_dev`], [`connection_name`]).
// Every unsafe block states the invariant that makes it sound.
#![warn(clippy::undocumented_unsafe_blocks)]
// Changes to SRC only through the gate's permits: clippy.toml lists the raw mutating calls,
// refused everywhere but in src/fs/gate.rs's private `syscalls` and the modules whose
// `allow` says what else (never SRC) they change.

pub(crate) mod cli;
// Public: the gate's compile-fail tests (tests/compile-fail/) try to forge its types from
// outside the crate, and must fail for the gate's own reasons.
pub mod fs;
pub(crate) mod history;
pub(crate) mod merge;
pub(crate) mod mount;
pub(crate) mod remote;
pub(crate) mod rewind;
#[allow(
    clippy::disallowed_methods,
    reason = "the state dir itself (STATE), never SRC"
)]
pub(crate) mod state;
pub(crate) mod sys;
pub(crate) mod transcript;
// Public: the FUSE codec's fuzz target and examples/uring_proof.rs drive it directly.
pub mod transport;

// The rest of the public surface: what main.rs, the integration tests (tests/it/), the fuzz
// targets (tests/fuzz/props.rs) and the examples use. Everything else is `pub(crate)`, so
// the compiler reports dead code.
pub use cli::{Cli, main};
pub use history::ids::{CtlLine, MAX_CTL_LINE, take_ctl_lines, validate_id};
pub use history::replay_for_fuzzing;
pub use history::store::{CopyMethod, Store};
pub use mount::control_socket::{MAX_REQUEST, parse_request};
pub use mount::fusermount::mount as mount_with_fusermount;
pub use mount::options::MountOptions;
pub use mount::watchdog::{connection_name, mount_dev};
pub use transcript::journal::{JOURNAL_FILE_NAME, Journal};
pub use transcript::mac::{RecordKey, Signer};
pub use transcript::record::rfc3339;
pub use transcript::replay::read_transcript;
