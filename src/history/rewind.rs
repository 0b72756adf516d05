//! Rewind: make the tree equal to a checkpoint, through the mount.
use std::io;

use crate::fs::PassthroughFs;

pub fn rewind(_fs: &PassthroughFs, id: &str, _dry_run: bool, _paths: &[String]) -> io::Result<String> {
    Err(io::Error::other(format!("rewind to '{id}' is not implemented yet")))
}
