//! fedfuse-lab's integration tests, one binary (each test binary links burn).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod architecture;
mod docs;
mod federation;
mod fedmix;
mod femnist;
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
