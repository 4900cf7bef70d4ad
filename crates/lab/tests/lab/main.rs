//! fedfuse-lab's integration tests, one binary (each test binary links burn).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod architecture;
mod docs;
mod federation;
mod fedmix;
mod femnist;
// FEMNIST files in both forms, written as the data tests write them.
#[allow(dead_code)]
#[path = "../../../data/tests/data/femnist_files.rs"]
mod femnist_files;
mod fuzz;
mod golden;
mod hostile;
mod local_norm;
mod matching;
mod naming;
mod ngm;
mod privacy;
mod residual;
mod shipped;
mod transformer;
mod zoo;
