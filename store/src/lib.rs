//! granary's store stack: where chunk bytes live and how they move.
//!
//! The seam ([`ChunkStore`] opens a chunk's file as a [`ChunkSource`], which reads batched
//! ranges and says where its bytes came from, [`BytesFrom`]); origin stores (a local
//! directory, [`LocalDir`]; an object store, [`object::ObjectChunks`], read and write); and
//! the layers that wrap another store: the node's local tier ([`TierStore`] over a
//! [`LocalTier`]) and the job's other nodes ([`PeerStore`]). A reader builds its
//! [`StoreStack`] (tier → peers → origin, any subset) once; the packer writes objects through
//! [`object::ObjectUrl`]. Errors say of which kind they are ([`StoreError`]).

pub mod append;
pub mod auth;
pub mod buf;
pub mod chunk_file;
pub mod config;
mod copy_name;
pub mod counts;
pub mod engine;
mod error;
pub mod file;
mod guard;
pub mod local;
mod location;
pub mod mapcache;
pub mod meter;
pub mod object;
pub mod peers;
mod seam;

mod stack;
pub mod testing;
pub mod tier;
pub use engine::verified;
pub mod write;

pub use config::StoreConfig;
pub use copy_name::{copy_file_name, parse_copy_file_name};
pub use counts::{Meter, MeterReading};
pub use error::{panic_message, RemoteKind, Result, StoreError};
pub use granary_format::DatasetId;
pub use local::{advise, effective_memory, resident_share, LocalDir, Opener};
pub use location::{open, write_destination, Location};
pub use meter::Metered;
pub use peers::request as serving;
pub use peers::{Ownership, PeerStore, Peers};
pub use seam::{
    Access, BytesFrom, ChunkSource, ChunkStore, IoMode, LocalRead, RangeRead, ReadPattern, Source,
};
pub use stack::StoreStack;
pub use tier::{
    decode_hot_map, decode_tier_index, hot_file_name, HotChunk, HotMap, HotRecord, LocalTier,
    TierPolicy, TierStats, TierStore,
};
