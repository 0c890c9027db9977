//! `granary mount`: a packed dataset as a read-only file system, so that unmodified training
//! code (an `ImageFolder`, a `list_files`, a shell script) reads it with the snapshot's O(1)
//! metadata and the local tier underneath.
//!
//! - [`Tree`]: the directory tree, materialised only for directories (files are samples,
//!   found and listed through the snapshot's namespace).
//! - [`TieredReader`]: whole samples, CRC-checked, from the local tier or the dataset's
//!   storage, with Monarch's placement (a chunk's first touch copies it into the tier in the
//!   background).
//! - [`MountFs`]: the file-system methods, callable without a mount (tests use them).
//! - [`serve`]: mounts with FUSE (fuser: the kernel protocol in Rust, no libfuse) and serves
//!   until unmounted or stopped.

mod fs;
mod fuse;
mod tiered;
mod tree;

pub use fs::{FsResult, MountFs, XATTR_DATASET, XATTR_PID, XATTR_STATS};
pub use fuse::{serve, unmount, Ended, MountOptions, FS_SOURCE_PREFIX, FS_TYPE};
pub use tiered::{ReadStats, TieredReader};
pub use tree::{Entry, Node, Tree, ROOT_INO};
