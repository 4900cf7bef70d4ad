//! The fedfuse binary end to end, one test binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod cli;
mod fuse;
mod fuse_cnn;
mod partition;
mod resume;
mod sweep;
