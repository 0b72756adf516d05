//! Mounting and serving, and the agents' prompt hook that checkpoints a mount ([`hook`]):
//! checking a mount request before anything is mounted
//! ([`prepare`], [`validation`], [`options`], [`mountinfo`]), starting the daemon ([`spawn`],
//! [`fusermount`] for a normal user), the daemon itself ([`daemon`]) with its
//! [`control_socket`] and [`watchdog`], the record of mounts ([`registry`]), and
//! unmounting ([`unmount`]).
#[allow(
    clippy::disallowed_methods,
    reason = "the control socket's file in STATE, never SRC"
)]
pub mod control_socket;
pub mod daemon;
pub mod fusermount;
pub mod hook;
pub mod mountinfo;
pub mod options;
pub mod prepare;
#[allow(
    clippy::disallowed_methods,
    reason = "the per-user mount registry under XDG_RUNTIME_DIR, never SRC"
)]
pub mod registry;
pub mod remote;
pub mod spawn;
pub mod unmount;
pub mod validation;
pub mod watchdog;
