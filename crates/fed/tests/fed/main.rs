//! fedfuse-fed's integration tests, one binary (each test binary links burn).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;
mod errors;
mod fed;
mod feddrop;
mod fedl1;
mod fedmix;
mod fedngm;
mod fedopt;
mod fedprox;
mod fedsparse;
mod gems;
mod local_accuracy;
mod method_config;
mod wrappers;
