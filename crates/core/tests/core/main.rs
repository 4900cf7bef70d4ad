//! fedfuse-core's integration tests, one binary (modules per area).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod fuzz;
mod groups;
mod layers;
mod npz;
mod sparse;
mod vit;
