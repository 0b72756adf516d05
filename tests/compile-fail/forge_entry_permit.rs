// A permit is made only by the gate, after the backup: its fields are private, so no other
// module can build one to reach its mutations (here: unlink).
use checkpointfs::fs::gate::EntryPermit;

fn unlink_without_backup(name: &'static std::ffi::CStr, dir: std::sync::Arc<std::os::fd::OwnedFd>) {
    let permit = EntryPermit {
        dir,
        name,
        is_dir: false,
    };
    permit.remove().unwrap();
}

fn main() {}
