//! The three trees a merge reads, through one small trait: [`Tree`]. [`DirTree`] reads a
//! plain directory (fd-relative beneath its root, no symlink followed), [`ViewTree`] a
//! checkpoint view of the main tree (`.checkpoint/at/<id>/`).
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{MergeError, Side};
use crate::history::History;
use crate::sys::{self, DirStream, errno};
use crate::transcript::record::EntryKind;

/// The type of an entry, as a merge compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    File,
    Dir,
    Symlink,
    /// A fifo, socket or device: never merged by content, only taken whole from one side.
    Special,
}

impl NodeKind {
    pub fn name(self) -> &'static str {
        match self {
            NodeKind::File => "file",
            NodeKind::Dir => "directory",
            NodeKind::Symlink => "symlink",
            NodeKind::Special => "special file",
        }
    }
}

/// What a path is in one tree: enough to tell whether two sides differ, before any content
/// is read. Owner and times are not compared (a merge takes content and mode, as git does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub kind: NodeKind,
    /// Permission bits (incl. setuid/setgid/sticky); 0 for symlinks, whose mode means nothing.
    pub mode: u32,
    /// Content length for files and symlinks (a cheap "differs" before reading).
    pub size: u64,
    /// The `S_IF*` type bits (which special file it is).
    pub file_type: u32,
    /// The device number of a character or block device (0 otherwise).
    pub rdev: u64,
}

/// A tree a merge reads: base, ours or theirs. Paths are relative to the tree's root, `/`
/// separated, `""` for the root itself. No method follows a symlink: a symlink is read as
/// what it is (its target), so a tree cannot lead the merge outside itself.
pub trait Tree {
    /// Which of the three trees this is (for errors).
    fn side(&self) -> Side;
    /// What `rel` is, or `None` when it does not exist (nor does a parent, or a parent is
    /// not a directory).
    fn node(&self, rel: &str) -> Result<Option<Node>, MergeError>;
    /// A file's content or a symlink's target.
    fn read(&self, rel: &str) -> Result<Vec<u8>, MergeError>;
    /// The names in directory `rel` (read only for a directory added or removed whole).
    fn list(&self, rel: &str) -> Result<Vec<String>, MergeError>;
}

/// A plain directory: tests' trees, and any tree on a local filesystem.
pub struct DirTree {
    side: Side,
    root: OwnedFd,
    path: PathBuf,
}

impl DirTree {
    /// Opens `path` as the `side` tree; a missing base is [`MergeError::BaseMissing`].
    pub fn open(side: Side, path: &Path) -> Result<DirTree, MergeError> {
        let root = sys::open_source(path).map_err(|e| {
            if side == Side::Base && sys::errno_of(&e) == libc::ENOENT {
                MergeError::BaseMissing {
                    what: path.display().to_string(),
                }
            } else {
                MergeError::io(side, "", e)
            }
        })?;
        Ok(DirTree {
            side,
            root,
            path: path.to_path_buf(),
        })
    }

    /// The tree beneath `root`, a directory fd (O_PATH is enough) the caller opened, e.g.
    /// SRC's root fd in the daemon; `path` is for messages only.
    pub fn at(side: Side, root: OwnedFd, path: &Path) -> DirTree {
        DirTree {
            side,
            root,
            path: path.to_path_buf(),
        }
    }

    /// The directory this tree reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_beneath(&self, rel: &str, flags: i32) -> io::Result<OwnedFd> {
        sys::open_beneath(self.root.as_fd(), rel, flags, 0)
    }
}

/// `rel`'s parent and last name (`("", rel)` at the top).
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

impl Node {
    /// The node of an entry of type `file_type` (`S_IF*`), with permission bits in `mode`
    /// (other bits ignored), content length `size` and device number `rdev`.
    pub fn new(file_type: u32, mode: u32, size: u64, rdev: u64) -> Node {
        let kind = match file_type {
            libc::S_IFREG => NodeKind::File,
            libc::S_IFDIR => NodeKind::Dir,
            libc::S_IFLNK => NodeKind::Symlink,
            _ => NodeKind::Special,
        };
        Node {
            kind,
            mode: if kind == NodeKind::Symlink {
                0
            } else {
                mode & 0o7777
            },
            size: match kind {
                NodeKind::File | NodeKind::Symlink => size,
                _ => 0,
            },
            file_type,
            rdev: if kind == NodeKind::Special { rdev } else { 0 },
        }
    }
}

/// The [`Node`] of a `stat`.
pub(crate) fn node_of(st: &libc::stat) -> Node {
    Node::new(
        st.st_mode & libc::S_IFMT,
        st.st_mode,
        st.st_size as u64,
        st.st_rdev,
    )
}

impl Tree for DirTree {
    fn side(&self) -> Side {
        self.side
    }

    fn node(&self, rel: &str) -> Result<Option<Node>, MergeError> {
        let (parent, name) = split(rel);
        let lookup = || -> io::Result<libc::stat> {
            if rel.is_empty() {
                return sys::fstat(self.root.as_fd());
            }
            let dir = self.open_beneath(parent, libc::O_PATH | libc::O_DIRECTORY)?;
            let c = CString::new(name).map_err(|_| errno(libc::EINVAL))?;
            sys::fstatat(dir.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)
        };
        match lookup() {
            Ok(st) => Ok(Some(node_of(&st))),
            // Absent, or beneath something that is not a directory (or is a symlink, which
            // this tree does not follow): nothing at this path.
            Err(e)
                if matches!(
                    sys::errno_of(&e),
                    libc::ENOENT | libc::ENOTDIR | libc::ELOOP
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(MergeError::io(self.side, rel, e)),
        }
    }

    fn read(&self, rel: &str) -> Result<Vec<u8>, MergeError> {
        let read = || -> io::Result<Vec<u8>> {
            let (parent, name) = split(rel);
            let dir = self.open_beneath(parent, libc::O_PATH | libc::O_DIRECTORY)?;
            let c = CString::new(name).map_err(|_| errno(libc::EINVAL))?;
            let st = sys::fstatat(dir.as_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return sys::readlinkat(dir.as_fd(), &c);
            }
            let fd = sys::openat(dir.as_fd(), &c, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
            let mut out = Vec::new();
            File::from(fd).read_to_end(&mut out)?;
            Ok(out)
        };
        read().map_err(|e| MergeError::io(self.side, rel, e))
    }

    fn list(&self, rel: &str) -> Result<Vec<String>, MergeError> {
        let list = || -> io::Result<Vec<String>> {
            let dir = self.open_beneath(rel, libc::O_PATH | libc::O_DIRECTORY)?;
            let mut stream = DirStream::open(dir.as_fd(), false)?;
            let mut names = Vec::new();
            while let Some(e) = stream.next_entry()? {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                // Paths are UTF-8 throughout checkpointfs's history (its keys are `str`).
                let name = std::str::from_utf8(e.name).map_err(|_| errno(libc::EILSEQ))?;
                names.push(name.to_string());
            }
            Ok(names)
        };
        list().map_err(|e| MergeError::io(self.side, rel, e))
    }
}

/// The main tree as it was at a checkpoint: the same content `.checkpoint/at/<id>/` shows
/// (stored versions, and SRC for what is unchanged since), read without a mount.
pub struct ViewTree<'a> {
    side: Side,
    history: &'a History,
    checkpoint: usize,
}

impl<'a> ViewTree<'a> {
    /// The tree at checkpoint index `checkpoint` of `history`.
    pub fn new(side: Side, history: &'a History, checkpoint: usize) -> ViewTree<'a> {
        ViewTree {
            side,
            history,
            checkpoint,
        }
    }

    fn entry(&self, rel: &str) -> Result<Option<crate::history::ViewEntry>, MergeError> {
        match self.history.view_entry(self.checkpoint, rel.as_bytes()) {
            Ok(e) => Ok(e),
            // A checkpoint gc dropped answers ENOENT for everything, its root included.
            Err(e) if rel.is_empty() && sys::errno_of(&e) == libc::ENOENT => {
                Err(MergeError::BaseMissing {
                    what: format!("checkpoint #{}", self.checkpoint),
                })
            }
            Err(e) => Err(MergeError::io(self.side, rel, e)),
        }
    }
}

impl Tree for ViewTree<'_> {
    fn side(&self) -> Side {
        self.side
    }

    fn node(&self, rel: &str) -> Result<Option<Node>, MergeError> {
        Ok(self.entry(rel)?.map(|e| {
            let file_type = match e.meta.kind {
                EntryKind::File => libc::S_IFREG,
                EntryKind::Dir => libc::S_IFDIR,
                EntryKind::Symlink => libc::S_IFLNK,
                EntryKind::Fifo => libc::S_IFIFO,
                EntryKind::Socket => libc::S_IFSOCK,
                EntryKind::CharDevice => libc::S_IFCHR,
                EntryKind::BlockDevice => libc::S_IFBLK,
            };
            Node::new(
                file_type,
                e.meta.mode,
                e.meta.size,
                e.meta.rdev.unwrap_or(0),
            )
        }))
    }

    fn read(&self, rel: &str) -> Result<Vec<u8>, MergeError> {
        let Some(entry) = self.entry(rel)? else {
            return Err(MergeError::io(self.side, rel, errno(libc::ENOENT)));
        };
        self.history
            .view_read_all(&entry)
            .map_err(|e| MergeError::io(self.side, rel, e))
    }

    fn list(&self, rel: &str) -> Result<Vec<String>, MergeError> {
        let names = self
            .history
            .view_list(self.checkpoint, rel.as_bytes())
            .map_err(|e| MergeError::io(self.side, rel, e))?;
        names
            .into_iter()
            .map(|(name, _)| {
                String::from_utf8(name)
                    .map_err(|_| MergeError::io(self.side, rel, errno(libc::EILSEQ)))
            })
            .collect()
    }
}

/// The path of `rel` under `root` (for messages and commands).
pub(crate) fn joined(root: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(std::ffi::OsStr::from_bytes(rel.as_bytes()))
    }
}
