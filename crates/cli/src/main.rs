//! `fedfuse`: run federated experiments, fetch datasets.

mod bench;
mod cli;
mod data_cmd;
mod fuse_cmd;
mod node_cmd;
mod progress;

use std::process::ExitCode;

use clap::Parser;

/// Model-sized buffers (hundreds of KB) come and go for every client message; glibc serves
/// them with fresh mmaps and page faults, mimalloc reuses them (1.8x more simulated client
/// updates per second, docs/BENCHMARKS.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
