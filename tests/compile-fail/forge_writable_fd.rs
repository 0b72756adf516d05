// A write permit is issued only for a WritableFd, which only a permit's open makes: an fd
// opened some other way cannot be passed off as one.
use checkpointfs::fs::gate::WritableFd;

fn pass_off(fd: std::os::fd::OwnedFd) -> WritableFd {
    WritableFd(fd)
}

fn main() {}
