// Gate::write_permit takes the handle's gated WritableFd, not any fd.
use checkpointfs::fs::gate::Gate;
use checkpointfs::fs::inodes::Inode;

fn write_through(gate: &Gate, inode: &Inode, fd: &std::os::fd::OwnedFd) {
    let permit = gate.write_permit(fd, inode).unwrap();
    permit.pwrite(b"x", 0).unwrap();
}

fn main() {}
