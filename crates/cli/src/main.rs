//! `fedfuse`: run federated experiments, fetch datasets.

mod bench;
mod cli;
mod compare;
mod config;
mod data_cmd;
mod fuse_cmd;
mod gems_exp;
mod ngm_exp;
mod output;
mod plot;
mod progress;
mod run;
mod sweep;

/// The files `experiments/{prefix}*.toml` of the repository, for tests that check every
/// experiment file of a command parses.
#[cfg(test)]
fn experiment_files(prefix: &str) -> Vec<std::path::PathBuf> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .expect("experiments folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".toml")
        })
        .collect();
    files.sort();
    files
}

use std::process::ExitCode;

use clap::Parser;

/// Model-sized buffers (hundreds of KB) come and go for every client message; glibc serves
/// them with fresh mmaps and page faults, mimalloc reuses them (2.4x more simulated client
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
