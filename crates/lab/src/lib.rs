//! fedfuse's experiments as a library: the run config and its validation, the data pipeline,
//! `run`, `sweep`, `compare`, the GEMS and FedNGM experiments, their tables, plots and output
//! folders. The binary (`fedfuse`) only parses arguments and draws progress; code and other
//! front ends (Python) call these functions directly.
//!
//! ```no_run
//! let cfg = fedfuse_lab::Config::load("examples/quickstart.toml".as_ref(), &[])?;
//! let result = fedfuse_lab::run::federate(&cfg, &fedfuse_lab::Silent)?;
//! println!("{:.3}", result.rounds.last().map_or(0.0, |r| r.global_accuracy));
//! # Ok::<(), fedfuse_lab::LabError>(())
//! ```
#![deny(missing_docs)]

pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod error;
mod finished;
pub mod fusion;
pub mod gems_experiment;
pub mod ngm_experiment;
pub mod oneshot;
pub mod output;
pub mod pipeline;
pub mod plot;
pub mod run;
pub mod sweep;
pub mod table;
pub mod tensorboard;
pub mod wire;

pub use config::Config;
pub use error::LabError;
use fedfuse_fed::Progress;

/// What an experiment reports while it runs. The binary draws progress bars and prints the
/// lines; tests and Python pass [`Silent`].
pub trait Observer: Sync {
    /// A federation of `rounds` rounds starts.
    fn run_started(&self, _rounds: usize) {}
    /// The simulator's progress within the current federation.
    fn progress(&self, _p: Progress<'_>) {}
    /// The current federation ended.
    fn run_finished(&self) {}
    /// A status line for the person running the experiment.
    fn note(&self, _line: &str) {}
}

/// Reports nothing.
pub struct Silent;

impl Observer for Silent {}

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
