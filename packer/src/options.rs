//! What every write is told, whichever way samples arrive (`pack`, the [`Writer`], WebDataset
//! import): where the dataset goes and how its chunks are cut. [`PackOptions`] and
//! [`WriterOptions`] each hold one [`OutputOptions`], so the shared settings, defaults and
//! checks are written once. Plain data, (de)serialized by field names (Python's keywords).
//!
//! [`Writer`]: crate::Writer
//! [`PackOptions`]: crate::PackOptions
//! [`WriterOptions`]: crate::WriterOptions

use std::path::PathBuf;
use std::sync::Arc;

use granary_store::object::ObjectUrl;
use granary_store::StoreConfig;
use serde::{Deserialize, Serialize};

use crate::encode::CompressMode;
use crate::shard::ShardSpec;
use crate::PackError;

/// Default target chunk size (see docs/packing.md: measured on this project's reference machine).
pub const DEFAULT_CHUNK_SIZE: u64 = 32 << 20;
/// Default most files in one chunk. What a chunk costs the packer while it is read and written
/// grows with its file count (~250 bytes a file), so a tree of 50-byte files would otherwise
/// make 32 MiB chunks of 700,000 files; 65,536 files keep that under ~16 MiB a chunk and only
/// change chunks whose files average under 512 bytes.
pub const DEFAULT_CHUNK_FILES: u64 = 65_536;

/// Where a dataset is written and how its chunks are cut.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct OutputOptions {
    /// The dataset directory to create (or, with `destination`, the name used in messages).
    pub out: PathBuf,
    /// Upload the dataset here instead (chunks as they are written, the snapshot last);
    /// `staging` must then name a local directory for the build. Set by the front end from an
    /// `out` that is a URL.
    #[serde(skip)]
    pub destination: Option<Arc<ObjectUrl>>,
    /// The local build directory of a dataset uploaded to `destination`.
    pub staging: Option<PathBuf>,
    /// Write only this shard's part of the dataset, as a part of `out` for `merge`.
    pub shard: Option<ShardSpec>,
    pub compress: CompressMode,
    /// Most bytes of encoded records in one chunk.
    pub chunk_size: u64,
    /// Most samples in one chunk.
    pub chunk_files: u64,
    /// Seed of the order in which samples are mixed across chunks.
    pub seed: u64,
    /// Continue an interrupted write of `out`, keeping what it finished.
    pub resume: bool,
    /// Replace an existing dataset at `out`.
    pub force: bool,
    /// Draw a progress bar on standard error.
    pub progress: bool,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions::new(PathBuf::new())
    }
}

impl OutputOptions {
    /// The documented defaults, writing to `out`.
    pub fn new(out: impl Into<PathBuf>) -> Self {
        OutputOptions {
            out: out.into(),
            destination: None,
            staging: None,
            shard: None,
            compress: CompressMode::Auto,
            chunk_size: DEFAULT_CHUNK_SIZE,
            chunk_files: DEFAULT_CHUNK_FILES,
            seed: 0,
            resume: false,
            force: false,
            progress: false,
        }
    }

    /// Points the write at an object store when `out` is a URL: `destination`, and `staging` (as
    /// given, or the default one for that destination). Returns the staging directory then;
    /// `None` for a local `out`. Every front end resolves its output here.
    pub fn resolve_destination(
        &mut self,
        cfg: &StoreConfig,
    ) -> Result<Option<&std::path::Path>, PackError> {
        let out = self.out.to_string_lossy().into_owned();
        let dest = granary_store::write_destination(&out, self.staging.as_deref(), cfg)
            .map_err(PackError::Usage)?;
        Ok(dest.map(|(u, staging)| {
            self.destination = Some(u);
            &**self.staging.insert(staging)
        }))
    }

    /// The checks every write makes before it touches anything.
    pub(crate) fn check(&self) -> Result<(), PackError> {
        if self.chunk_size == 0 {
            return Err(usage!("chunk size must be at least 1 byte"));
        }
        if self.chunk_files == 0 {
            return Err(usage!("a chunk must be allowed at least 1 file"));
        }
        if let Some(d) = &self.destination {
            if self.shard.is_some() {
                return Err(usage!(
                    "a shard is written to a directory (local or on a shared file system), \
                     not to an object store"
                ));
            }
            if self.staging.is_none() {
                return Err(usage!(
                    "writing to {} needs a local staging directory",
                    d.url()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{CompressMode, ShardSpec, WriterOptions};

    #[test]
    fn options_are_data_with_the_defaults_written_once() {
        let o: WriterOptions = serde_json::from_str(
            r#"{"output": {"shard": [1, 3], "compress": "zstd:5", "seed": 7}, "buckets": 8}"#,
        )
        .unwrap();
        assert_eq!(o.output.shard, Some(ShardSpec::new(1, 3).unwrap()));
        assert_eq!(o.output.compress, CompressMode::Zstd(5));
        assert_eq!((o.output.seed, o.buckets), (7, 8));
        let d = WriterOptions::default();
        assert_eq!(o.output.chunk_size, d.output.chunk_size);
        assert_eq!(o.gather_memory, d.gather_memory);
        // What serializes reads back as the same settings.
        let again: WriterOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(again.settings(&[0; 16]), o.settings(&[0; 16]));
        for bad in [
            r#"{"output": {"shard": [3, 2]}}"#,
            r#"{"output": {"compress": "gzip"}}"#,
            r#"{"output": {"chunk_size": -1}}"#,
        ] {
            assert!(serde_json::from_str::<WriterOptions>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_write_checks_its_sizes() {
        let mut o = super::OutputOptions::new("x");
        assert!(o.check().is_ok());
        o.chunk_files = 0;
        assert!(o.check().unwrap_err().to_string().contains("1 file"));
        o.chunk_files = 1;
        o.chunk_size = 0;
        assert!(o.check().unwrap_err().to_string().contains("1 byte"));
    }
}
