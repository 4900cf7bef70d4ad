//! Command-line arguments and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::config::Config;

/// fedfuse: federated learning that fuses client networks.
#[derive(Parser, Debug)]
#[command(name = "fedfuse", version, about)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the experiment a TOML config describes.
    Run {
        /// The config file.
        config: PathBuf,
        /// Output folder (created): resolved config, results.json, metrics.csv, model, plots.
        #[arg(long)]
        out: PathBuf,
        /// Folder holding the dataset files (instead of the cache).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Override a config key, e.g. `--set partition.alpha=0.1` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        quiet: bool,
    },
    /// Fetch, verify and describe datasets.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Download a dataset's files into the cache (or --dir), verifying sha256.
    Get {
        /// Dataset name (`mnist`, `fashion-mnist`, `cifar10`).
        name: String,
        /// Destination folder (default: the cache folder of the dataset).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Check the sha256 of a dataset's files.
    Verify {
        /// Dataset name.
        name: String,
        /// Folder to check (default: the cache folder of the dataset).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Describe the known datasets and where they are cached.
    Info {
        /// One dataset (default: all).
        name: Option<String>,
    },
}

/// Dispatches a parsed command line.
pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Command::Run {
            config,
            out,
            data_dir,
            overrides,
            quiet,
        } => {
            let mut cfg = Config::load(&config, &overrides)?;
            if data_dir.is_some() {
                cfg.data_dir = data_dir;
            }
            crate::run::run(&cfg, &out, quiet)
        }
        Command::Data { command } => crate::data_cmd::run(command),
    }
}
