//! fedfuse-fuse's integration tests, one binary (modules per area).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod channels;
mod fedsparse;
mod gems;
mod graph;
mod matching;
mod mixture;
mod residual;
mod serveropt;
mod vit;
