//! Integration tests of fedfuse-data, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "data/common.rs"]
mod common;

#[path = "data/cifar.rs"]
mod cifar;
#[path = "data/csv.rs"]
mod csv;
#[path = "data/digits.rs"]
mod digits;
#[path = "data/download.rs"]
mod download;
#[path = "data/femnist.rs"]
mod femnist;
#[path = "data/femnist_files.rs"]
pub mod femnist_files;
#[path = "data/fuzz.rs"]
mod fuzz;
#[path = "data/idx.rs"]
mod idx;
#[path = "data/partition.rs"]
mod partition;
#[path = "data/tabular.rs"]
mod tabular;
