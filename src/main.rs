fn main() {
    std::process::exit(checkpointfs::cli::main());
}
