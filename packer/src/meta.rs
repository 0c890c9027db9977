//! What a pack records about its files besides their bytes (the ATTRS feature): each file's mode and
//! mtime and the tree's directories, taken from the plan before it is dropped.

use granary_format::{ChunkSummary, FileAttrs, Snapshot};

use crate::files::FileTable;
use crate::plan::Plan;
use crate::PackError;

/// The files' modes and mtimes (by path) and the directories of a plan.
pub(crate) struct Metadata {
    /// Paths sorted, with the mode and mtime columns only.
    files: FileTable,
    pub dirs: Vec<(Vec<u8>, FileAttrs)>,
}

impl Metadata {
    /// Takes them out of `plan` (its file table is left empty).
    pub fn take(plan: &mut Plan) -> Metadata {
        let mut files = std::mem::take(&mut plan.files);
        (files.size, files.ino, files.label) = (Vec::new(), Vec::new(), Vec::new());
        let d = &plan.dirs;
        let dirs = (0..d.len())
            .map(|i| {
                let a = FileAttrs {
                    mode: d.mode[i],
                    mtime_ns: d.mtime_ns[i],
                };
                (d.path(i).to_vec(), a)
            })
            .collect();
        Metadata { files, dirs }
    }

    /// The attributes of chunk `s`'s records, in record order, looked up by path (files
    /// skipped while packing have no record, so the plan's order cannot be used).
    pub fn attrs_of(&self, s: &ChunkSummary) -> Vec<FileAttrs> {
        let f = &self.files;
        s.paths
            .iter()
            .map(|p| {
                f.find(p).map_or_else(FileAttrs::default, |i| FileAttrs {
                    mode: f.mode[i],
                    mtime_ns: f.mtime_ns[i],
                })
            })
            .collect()
    }

    /// The directories of an append: the dataset's and the appended tree's (the dataset's
    /// attributes win where both have a directory).
    pub fn dirs_with<B: AsRef<[u8]>>(
        &self,
        snap: &Snapshot<B>,
    ) -> Result<Vec<(Vec<u8>, FileAttrs)>, PackError> {
        let mut all: std::collections::BTreeMap<Vec<u8>, FileAttrs> =
            self.dirs.iter().cloned().collect();
        for d in snap.dirs()? {
            if let Some(a) = d.attrs {
                all.insert(d.path, a);
            }
        }
        Ok(all.into_iter().collect())
    }
}
