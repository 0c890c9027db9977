//! Where a dataset's files are, for the commands that rewrite it in place (`reindex`,
//! `upgrade`, `delete`, `compact`): a local directory (locked while they run) or objects under
//! a writable URL prefix (no lock: a snapshot is replaced by one PUT).

use std::path::{Path, PathBuf};

use granary_format::{chunk_file_name, Snapshot, SnapshotBuilder, SNAPSHOT_FILE};
use granary_store::file::ChunkBytes;
use granary_store::object::ObjectUrl;
use granary_store::{LocalDir, Location, StoreConfig};

use crate::{write_file_atomic, IoAt, PackError};

/// Where the dataset's files are: a directory, or objects under a URL prefix.
pub(crate) enum Place {
    Dir(PathBuf),
    Url(std::sync::Arc<ObjectUrl>),
}

impl Place {
    /// A local directory, or a writable object-store URL.
    pub(crate) fn of(dataset: &Path, cfg: &StoreConfig) -> Result<Place, PackError> {
        let url = match granary_store::open(dataset, cfg)? {
            Location::Local(d) if d.is_dir() => return Ok(Place::Dir(d)),
            Location::Local(d) => {
                return Err(usage!(
                    "{}: not a dataset directory (give the directory holding {SNAPSHOT_FILE}; a \
                     view file is rewritten by making it again)",
                    d.display()
                ))
            }
            Location::Object(u) => u,
        };
        if !url.writable() {
            return Err(usage!(
                "{}: read-only (plain HTTP); a command that rewrites a dataset needs a store it \
                 can write (s3://, gs://, az://)",
                url.url()
            ));
        }
        Ok(Place::Url(url))
    }

    /// Locks a local dataset's directory for a command that rewrites it (`what`); an object
    /// store has no lock (its snapshot is replaced by one PUT).
    pub(crate) fn lock(&self, what: &str) -> Result<Option<crate::output::DirLock>, PackError> {
        match self {
            Place::Dir(d) => crate::output::DirLock::dataset(d, what).map(Some),
            Place::Url(_) => Ok(None),
        }
    }

    /// An error if an intact snapshot is there (every section's checksum right).
    pub(crate) fn refuse_intact_snapshot(&self) -> Result<(), PackError> {
        let Some(old) = self.read(SNAPSHOT_FILE)? else {
            return Ok(());
        };
        if granary_format::is_legacy_snapshot(&old) {
            if let Ok(l) = granary_format::read_legacy_snapshot(&old) {
                return Err(usage!(
                    "{}: an intact snapshot of format {}.{} is there ({} samples); `granary \
                     upgrade {}` rewrites it as 2.0 keeping everything it records (file modes, \
                     mtimes, empty directories, which chunks do not hold); reindex replaces it \
                     only with --force",
                    self.location(SNAPSHOT_FILE).display(),
                    l.version.0,
                    l.version.1,
                    l.chunks.iter().map(|c| c.entries.len()).sum::<usize>(),
                    self.show()
                ));
            }
        }
        let intact =
            Snapshot::open(&old[..]).map(|s| (s.check_blocks().is_empty(), s.sample_count()));
        match intact {
            Ok((true, samples)) => Err(usage!(
                "{}: an intact snapshot is there ({samples} samples, every checksum right); \
                 reindex replaces it only with --force",
                self.location(SNAPSHOT_FILE).display()
            )),
            _ => Ok(()),
        }
    }

    pub(crate) fn location(&self, name: &str) -> PathBuf {
        match self {
            Place::Dir(d) => d.join(name),
            Place::Url(u) => PathBuf::from(u.object_url(name)),
        }
    }

    pub(crate) fn show(&self) -> String {
        match self {
            Place::Dir(d) => d.display().to_string(),
            Place::Url(u) => u.url().to_string(),
        }
    }

    /// The names of all files (objects) directly in it.
    pub(crate) fn names(&self) -> Result<Vec<String>, PackError> {
        match self {
            Place::Dir(d) => {
                let rd = std::fs::read_dir(d).at("listing", d)?;
                rd.map(|e| {
                    e.map(|e| e.file_name().to_string_lossy().into_owned())
                        .at("listing", d)
                })
                .collect()
            }
            Place::Url(u) => Ok(u.list()?.into_iter().map(|(n, _)| n).collect()),
        }
    }

    /// The whole of chunk `id`'s file, read through the store; `None` if there is none.
    pub(crate) fn read_chunk(&self, id: u32) -> Result<Option<ChunkBytes>, PackError> {
        match self {
            Place::Dir(d) => {
                let src = match granary_store::ChunkStore::open_chunk(&LocalDir::new(d), id) {
                    Ok(src) => src,
                    Err(granary_store::StoreError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Ok(None)
                    }
                    Err(e) => return Err(e.into()),
                };
                Ok(Some(granary_store::file::read_whole(&*src)?))
            }
            Place::Url(_) => Ok(self.read(&chunk_file_name(id))?.map(ChunkBytes::Owned)),
        }
    }

    /// The whole of file `name`; `None` if there is none.
    pub(crate) fn read(&self, name: &str) -> Result<Option<Vec<u8>>, PackError> {
        match self {
            Place::Dir(d) => match std::fs::read(d.join(name)) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(PackError::io("reading", &d.join(name), e)),
            },
            Place::Url(u) => match u.get(name) {
                Ok(b) => Ok(Some(b.to_vec())),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// Writes file `name` whole or not at all: a local file is written under a temporary name,
    /// synced and renamed; an object appears whole with its PUT.
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> Result<(), PackError> {
        match self {
            Place::Dir(d) => write_file_atomic(&d.join(name), bytes),
            Place::Url(u) => Ok(u.put_bytes(name, bytes.to_vec())?),
        }
    }

    /// The identity (dataset id, content digest) of the snapshot there now, from its header.
    pub(crate) fn snapshot_key(&self) -> Result<([u8; 16], [u8; 16]), PackError> {
        let n = granary_format::SNAPSHOT_HEADER_LEN;
        let head = match self {
            Place::Dir(d) => {
                let p = d.join(SNAPSHOT_FILE);
                let mut b = vec![0u8; n];
                std::fs::File::open(&p)
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
                    .at("reading", &p)?;
                b
            }
            Place::Url(u) => u.get_range(SNAPSHOT_FILE, 0..n as u64)?.to_vec(),
        };
        Ok(granary_format::snapshot_key(&head)?)
    }

    /// The whole of file `name`, read through the store.
    pub(crate) fn read_named(&self, name: &str) -> Result<ChunkBytes, PackError> {
        match self {
            Place::Dir(d) => {
                let p = d.join(name);
                let f = granary_store::file::open_regular(&p, 0).at("opening", &p)?;
                let f = granary_store::file::IoFile::unmapped(f, &p, false)?;
                Ok(granary_store::file::read_whole(&f)?)
            }
            Place::Url(u) => Ok(ChunkBytes::Owned(u.get(name)?.to_vec())),
        }
    }

    /// Aborts the multipart uploads left open under an object-store prefix whose objects
    /// `ours` names (a killed run's); returns their names. Nothing for a directory, or a store
    /// that does not list them.
    pub(crate) fn abort_uploads(
        &self,
        ours: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, PackError> {
        let Place::Url(u) = self else {
            return Ok(Vec::new());
        };
        let mut done = Vec::new();
        for up in u.open_uploads()?.unwrap_or_default() {
            if ours(&up.name) {
                u.abort_upload(&up)?;
                done.push(up.name);
            }
        }
        Ok(done)
    }

    /// The dataset's snapshot, read whole and every block checked: what a command that rewrites
    /// it extends.
    pub(crate) fn snapshot(&self) -> Result<Snapshot<Vec<u8>>, PackError> {
        let bytes = self.read(SNAPSHOT_FILE)?.ok_or_else(|| {
            usage!(
                "{} is not a granary dataset (no {SNAPSHOT_FILE})",
                self.show()
            )
        })?;
        let snap = Snapshot::open(bytes)?;
        if let Some(e) = snap.check_blocks().into_iter().next() {
            return Err(usage!(
                "{} is damaged ({e}); run granary verify",
                self.location(SNAPSHOT_FILE).display()
            ));
        }
        Ok(snap)
    }

    /// Removes file `name` (absent is fine).
    pub(crate) fn remove(&self, name: &str) -> Result<(), PackError> {
        match self {
            Place::Dir(d) => match std::fs::remove_file(d.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(PackError::io("removing", &d.join(name), e))
                }
                _ => Ok(()),
            },
            Place::Url(u) => Ok(u.delete(name)?),
        }
    }

    /// When file `name` was last written.
    pub(crate) fn modified(&self, name: &str) -> Result<std::time::SystemTime, PackError> {
        match self {
            Place::Dir(d) => {
                let p = d.join(name);
                let m = std::fs::metadata(&p).at("inspecting", &p)?;
                m.modified().at("inspecting", &p)
            }
            Place::Url(u) => Ok(u.modified(name)?),
        }
    }

    /// A directory for the temporary files of a rewrite: the dataset's own, or (an object
    /// store's) the system's.
    pub(crate) fn scratch(&self) -> PathBuf {
        match self {
            Place::Dir(d) => d.clone(),
            Place::Url(_) => std::env::temp_dir(),
        }
    }

    /// Publishes the snapshot `b` builds as the dataset's, whole or not at all (a local file
    /// renamed into place, synced; one PUT); returns its length.
    pub(crate) fn publish_snapshot(&self, b: SnapshotBuilder) -> Result<u64, PackError> {
        match self {
            Place::Dir(d) => {
                let path = d.join(SNAPSHOT_FILE);
                let (pending, len) = crate::publish::write_snapshot_pending(&path, b)?;
                granary_store::write::crash_point("rename", &path);
                pending.publish().at("renaming into place", &path)?;
                crate::publish::sync_dir(d)?;
                Ok(len)
            }
            Place::Url(u) => {
                let mut bytes = Vec::new();
                b.write_to(&mut bytes).map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData => PackError::Usage(e.to_string()),
                    _ => PackError::io("building the snapshot of", Path::new(u.url()), e),
                })?;
                let len = bytes.len() as u64;
                let ours = granary_format::snapshot_key(&bytes)?;
                u.put_bytes(SNAPSHOT_FILE, bytes)?;
                // No lock: another command's PUT may have landed over ours. Said, not hidden.
                if self.snapshot_key()? != ours {
                    return Err(PackError::Usage(format!(
                        "{}: another command replaced the snapshot right after this one \
                         published it: this command's change is lost; run it again (one \
                         rewriting command at a time per dataset in an object store)",
                        u.url()
                    )));
                }
                Ok(len)
            }
        }
    }

    /// Publishes the local file `path` (written whole) as file `name` of the dataset: renamed
    /// into a local dataset (it is there already when written in place), uploaded to an
    /// object store (then removed).
    pub(crate) fn publish_file(&self, name: &str, path: &Path) -> Result<(), PackError> {
        match self {
            Place::Dir(d) if d.join(name) == path => Ok(()),
            Place::Dir(d) => std::fs::rename(path, d.join(name)).at("renaming", path),
            Place::Url(u) => {
                u.put_file(name, path, &|_| {})?;
                std::fs::remove_file(path).at("removing", path)
            }
        }
    }
}
