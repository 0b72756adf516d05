// The syscalls behind the permits live in a private module: not callable without a permit.
use std::os::fd::AsFd;

fn unlink_without_backup(dir: &std::fs::File) {
    checkpointfs::fs::gate::syscalls::unlinkat(dir.as_fd(), c"victim", 0).unwrap();
}

fn main() {}
