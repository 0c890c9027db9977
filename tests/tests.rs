//! Every integration test of this crate, in one binary (one link instead of one per file).

mod common;

mod chaos;
mod cli;
mod crash;
mod delete;
mod docs;
mod faults;
mod golden;
mod mix;
mod mount;
mod peers;
mod regression;
mod resume;
mod s3;
mod shard;
mod timeouts;
mod vectors;
mod view;
mod webdataset;
