//! Exit statuses of the `checkpointfs` command: 0 success, 1 runtime failure, 2 usage error
//! or refusal; `umount` has a few more (see [`UMOUNT_EXIT_STATUS`]).

use crate::mount::unmount::UmountOutcome;

pub const EXIT_OK: i32 = 0;

pub const EXIT_FAILURE: i32 = 1;

pub const EXIT_USAGE: i32 = 2;

/// `umount`: MNT is not mounted (any more) and no daemon runs for it.
pub const EXIT_UMOUNT_GONE: i32 = 3;

/// `umount`: MNT is busy (EBUSY) and was left mounted.
pub const EXIT_UMOUNT_BUSY: i32 = 4;

/// `umount`: unmounted or detached, but the daemon did not exit within --timeout.
pub const EXIT_UMOUNT_TIMEOUT: i32 = 5;

/// `checkpointfs umount --help`, the man page and the README say this.
pub const UMOUNT_EXIT_STATUS: &str = "Exit status:\n  \
    0  unmounted, and the daemon has flushed the history and exited\n  \
    1  any other failure (the message says what)\n  \
    2  usage error, or MNT is not a checkpointfs mount (nothing was done)\n  \
    3  MNT is not mounted and no daemon runs for it, so the history is complete: it was\n     \
    already unmounted (known from the record of mounts in $XDG_RUNTIME_DIR/checkpointfs\n     \
    or /run/checkpointfs, which is cleared at reboot), or its daemon had died (killed)\n     \
    and the dead mount was detached now (the next mount recovers the history from the\n     \
    state dir's journal)\n  \
    4  MNT is busy: a process has its working directory or a file open there (see:\n     \
    lsof +D MNT); it is still mounted. --lazy detaches it anyway\n  \
    5  unmounted (or detached with --lazy), but the daemon had not exited after --timeout\n     \
    seconds; its history is complete only once it has";

/// `umount`'s exit status for how it ended.
pub fn umount_exit_status(outcome: UmountOutcome) -> i32 {
    match outcome {
        UmountOutcome::Done => EXIT_OK,
        UmountOutcome::Refused => EXIT_USAGE,
        UmountOutcome::Failed => EXIT_FAILURE,
        UmountOutcome::Gone => EXIT_UMOUNT_GONE,
        UmountOutcome::Busy => EXIT_UMOUNT_BUSY,
        UmountOutcome::DaemonTimeout => EXIT_UMOUNT_TIMEOUT,
    }
}
