//! The store's I/O engine, as the reader's streams use it (see [`granary_store::engine`]).

pub use granary_store::engine::*;
