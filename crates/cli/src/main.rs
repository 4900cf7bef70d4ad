//! `fedfuse`: run federated experiments, fetch datasets.

mod bench;
mod cli;
mod config;
mod data_cmd;
mod output;
mod plot;
mod progress;
mod run;

use std::process::ExitCode;

use clap::Parser;

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
