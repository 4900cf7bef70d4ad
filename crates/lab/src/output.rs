//! results.json and metrics.csv.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Context, Result};
use fedfuse_fed::{RoundMetrics, RunResult};
use serde::Serialize;

use crate::config::Config;

#[derive(Serialize)]
struct Results<'a> {
    config: &'a Config,
    rounds: &'a [RoundMetrics],
    #[serde(rename = "final")]
    last: Final,
}

#[derive(Serialize)]
struct Final {
    global_accuracy: f64,
    global_loss: f64,
    local_accuracy_mean: f64,
    client_accuracy_mean: f64,
    bytes_total: u64,
    rejected_total: usize,
    seconds_total: f64,
    /// Why a figure above is null (not measured), by figure.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    unmeasured: BTreeMap<&'static str, String>,
}

/// Why the last round's `local_accuracy_mean` is NaN (written as null) although `local_eval`
/// asked for it, if it is.
fn local_accuracy_missing(cfg: &Config, last: Option<&RoundMetrics>) -> Option<String> {
    let missing = last.is_some_and(|r| r.local_accuracy_mean.is_nan());
    if !missing || !cfg.local_eval || cfg.table.is_some() {
        return None;
    }
    Some(
        if cfg
            .dataset
            .as_ref()
            .is_some_and(|d| d.local_test_fraction == 0.0)
        {
            "no client holds local test samples: set `dataset.local_test_fraction` above 0 \
         (e.g. 0.2)"
                .into()
        } else {
            "no client holds a local test sample: their data is too small for \
         `dataset.local_test_fraction`; raise it"
                .into()
        },
    )
}

/// What results.json holds: the resolved config, every round, the final figures (what
/// Python's `fedfuse.run` returns too).
pub fn results<'a>(cfg: &'a Config, run: &'a RunResult) -> impl Serialize + 'a {
    let last = run.rounds.last();
    Results {
        config: cfg,
        rounds: &run.rounds,
        last: Final {
            global_accuracy: last.map_or(f64::NAN, |r| r.global_accuracy),
            global_loss: last.map_or(f64::NAN, |r| r.global_loss),
            local_accuracy_mean: last.map_or(f64::NAN, |r| r.local_accuracy_mean),
            client_accuracy_mean: last.map_or(f64::NAN, |r| r.client_accuracy_mean),
            bytes_total: run.rounds.iter().map(|r| r.bytes_up + r.bytes_down).sum(),
            rejected_total: run.rounds.iter().map(|r| r.rejected.len()).sum(),
            seconds_total: run.rounds.iter().map(|r| r.seconds).sum(),
            unmeasured: local_accuracy_missing(cfg, last)
                .map(|why| ("local_accuracy_mean", why))
                .into_iter()
                .collect(),
        },
    }
}

/// Writes `results.json` and `metrics.csv` into `out`.
pub fn write_results(out: &Path, cfg: &Config, run: &RunResult) -> Result<()> {
    let path = out.join("results.json");
    let json =
        serde_json::to_string_pretty(&results(cfg, run)).context("cannot serialise results")?;
    crate::table::write_atomic(&path, json.as_bytes())?;

    // Method-specific figures (chosen eps, widths, ...) become extra columns.
    let extra: BTreeSet<&str> = run
        .rounds
        .iter()
        .flat_map(|r| r.method.keys().map(String::as_str))
        .collect();
    let mut csv = String::from(
        "round,global_accuracy,global_loss,local_accuracy_mean,client_accuracy_mean,\
         client_accuracy_last_mean,train_loss,bytes_up,bytes_down,global_params,clients,rejected,\
         seconds",
    );
    for k in &extra {
        let _ = write!(csv, ",{k}");
    }
    csv.push('\n');
    for r in &run.rounds {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.round,
            r.global_accuracy,
            r.global_loss,
            r.local_accuracy_mean,
            r.client_accuracy_mean,
            r.client_accuracy_last_mean,
            r.train_loss,
            r.bytes_up,
            r.bytes_down,
            r.global_params,
            r.clients,
            r.rejected.len(),
            r.seconds
        );
        csv.pop();
        for k in &extra {
            match r.method.get(*k) {
                Some(v) => {
                    let _ = write!(csv, ",{v}");
                }
                None => csv.push(','),
            }
        }
        csv.push('\n');
    }
    let path = out.join("metrics.csv");
    crate::table::write_atomic(&path, csv.as_bytes())?;
    Ok(())
}
