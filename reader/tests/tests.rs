//! Every integration test of this crate, in one binary (one link instead of one per file).

mod cache;
mod damage;
mod plans;
mod source;
mod stream;
