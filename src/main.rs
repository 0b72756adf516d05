fn main() {
    std::process::exit(checkpointfs::main());
}
