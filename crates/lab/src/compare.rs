//! `fedfuse compare`: several methods ("arms") on one federation set-up over seeds, as the
//! FedSparse paper compares them (its Table 1 and Figure 3): every round as a row, a final
//! table of global and mean local accuracy, traffic and sparsity, and plots of accuracy
//! against cumulative traffic.
//!
//! Each arm is a `fedfuse run` config: the shared `[base]` table plus the arm's `method` table
//! and its own `set` overrides, parsed and checked exactly as `fedfuse run` would.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Context, Result, bail};
use fedfuse_fed::RoundMetrics;
use serde::{Deserialize, Serialize};

use crate::Observer;
use crate::config::Config;
use crate::plot::{Chart, Line, write_chart};
use crate::table::{Stats, Tables, csv_field, pm};

/// A comparison, as written in `experiments/*.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareConfig {
    /// Title of the table and plots.
    pub title: String,
    /// Seeds; every arm runs once per seed (mean and std are over seeds).
    pub seeds: Vec<u64>,
    /// The set-up every arm shares: a `fedfuse run` config without `seed` and `[method]`.
    pub base: toml::Table,
    /// The methods compared; the first is the reference for traffic savings.
    pub arms: Vec<Arm>,
}

/// One method of a comparison.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arm {
    /// Row label.
    pub label: String,
    /// The `[method]` table of a run config.
    pub method: toml::Table,
    /// The `[server]` table of a run config (a server optimizer step after the method's
    /// aggregate), if any.
    #[serde(default)]
    pub server: Option<toml::Table>,
    /// Overrides of the base for this arm only, as `fedfuse run --set` takes them.
    #[serde(default)]
    pub set: Vec<String>,
}

impl CompareConfig {
    /// Reads and checks `path`: every arm must make a valid run config.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read comparison {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("comparison {}", path.display()))
    }

    /// Parses and checks a comparison.
    pub fn parse(text: &str) -> Result<Self> {
        let cfg: Self = toml::from_str(text)?;
        if cfg.seeds.is_empty() {
            bail!("`seeds` is empty: give at least one seed");
        }
        if cfg.arms.is_empty() {
            bail!("no `[[arms]]`: give at least one method to run");
        }
        for key in ["method", "server", "seed"] {
            if cfg.base.contains_key(key) {
                bail!("`base.{key}` is set per arm and per seed; remove it from [base]");
            }
        }
        let mut labels = std::collections::BTreeSet::new();
        for arm in &cfg.arms {
            if !labels.insert(arm.label.as_str()) {
                bail!("two arms are labelled `{}`", arm.label);
            }
            cfg.arm_config(arm, cfg.seeds[0], None)?;
        }
        Ok(cfg)
    }

    /// The run config of `arm` with `seed` (and the data folder, if given), checked.
    pub fn arm_config(&self, arm: &Arm, seed: u64, data_dir: Option<&Path>) -> Result<Config> {
        let mut table = self.base.clone();
        table.insert("method".into(), toml::Value::Table(arm.method.clone()));
        if let Some(server) = &arm.server {
            table.insert("server".into(), toml::Value::Table(server.clone()));
        }
        table.insert("seed".into(), toml::Value::Integer(seed as i64));
        let text = toml::to_string(&table)?;
        let mut cfg =
            Config::parse(&text, &arm.set).with_context(|| format!("arm `{}`", arm.label))?;
        if let Some(dir) = data_dir {
            cfg.data_dir = Some(PathBuf::from(dir));
        }
        Ok(cfg)
    }
}

/// One finished run.
struct Run {
    arm: usize,
    seed: u64,
    rounds: Vec<RoundMetrics>,
}

/// A finished run as `runs.toml` keeps it, so that `--resume` need not run it again.
#[derive(Serialize, Deserialize)]
struct SavedRun {
    arm: String,
    seed: u64,
    /// The run's resolved config: a run is reused only under the very same one.
    config: String,
    rounds: Vec<RoundMetrics>,
}

/// `runs.toml` (TOML keeps the NaN of unmeasured figures, which JSON cannot).
#[derive(Default, Serialize, Deserialize)]
struct SavedRuns {
    runs: Vec<SavedRun>,
}

/// Runs every arm for every seed, writing `results.csv`, `summary.csv`, `summary.md`, the
/// plots and `runs.toml` into `out`, which is replaced whole after every run (the results so
/// far survive an interrupted comparison, and never mix with an earlier one's). With
/// `resume`, the runs `out/runs.toml` holds under the same config are taken from it.
pub fn run(
    cfg: &CompareConfig,
    out: &Path,
    data_dir: Option<&Path>,
    observer: &dyn Observer,
    resume: bool,
) -> Result<()> {
    crate::table::check_replaceable_by(out, crate::table::is_experiment_file)?;
    let saved_path = out.join("runs.toml");
    let mut earlier = SavedRuns::default();
    if resume && saved_path.exists() {
        let text = std::fs::read_to_string(&saved_path)
            .with_context(|| format!("cannot read {}", saved_path.display()))?;
        earlier = toml::from_str(&text).with_context(|| format!("{}", saved_path.display()))?;
    }
    let mut runs = Vec::new();
    let mut saved = SavedRuns::default();
    for &seed in &cfg.seeds {
        for (a, arm) in cfg.arms.iter().enumerate() {
            let run_cfg = cfg.arm_config(arm, seed, data_dir)?;
            let config = toml::to_string(&run_cfg).context("cannot write a run's config")?;
            let done = earlier
                .runs
                .iter()
                .position(|r| r.arm == arm.label && r.seed == seed && r.config == config);
            let rounds = match done {
                Some(i) => {
                    observer.note(&format!(
                        "== {} (seed {seed}): finished before, from {}",
                        arm.label,
                        saved_path.display()
                    ));
                    std::mem::take(&mut earlier.runs[i].rounds)
                }
                None => {
                    observer.note(&format!("== {} (seed {seed})", arm.label));
                    crate::run::federate(&run_cfg, observer)
                        .with_context(|| format!("arm `{}`, seed {seed}", arm.label))?
                        .rounds
                }
            };
            saved.runs.push(SavedRun {
                arm: arm.label.clone(),
                seed,
                config,
                rounds: rounds.clone(),
            });
            runs.push(Run {
                arm: a,
                seed,
                rounds,
            });
            let text = toml::to_string(&saved).context("cannot write runs.toml")?;
            crate::table::replace_folder(out, |dir| {
                write_all(cfg, dir, &runs)?;
                crate::table::write_atomic(&dir.join("runs.toml"), text.as_bytes())
            })?;
        }
    }
    observer.note(summary_markdown(cfg, &runs).trim_end());
    observer.note(&format!("results in {}", out.display()));
    Ok(())
}

fn write_all(cfg: &CompareConfig, out: &Path, runs: &[Run]) -> Result<()> {
    Tables {
        results_csv: results_csv(cfg, runs),
        summary_csv: summary_csv(cfg, runs),
        summary_md: summary_markdown(cfg, runs),
    }
    .write(out)?;
    for (stem, what, local) in [
        ("global_accuracy_vs_traffic", "global model", false),
        ("local_accuracy_vs_traffic", "clients' own models", true),
    ] {
        let chart = Chart {
            title: format!("{}: {what}", cfg.title),
            x_label: "GB communicated (up + down)".into(),
            lines: curves(cfg, runs, local),
        };
        if chart.lines.iter().any(|l| !l.points.is_empty()) {
            write_chart(out, stem, &chart)?;
        }
    }
    Ok(())
}

fn figure(r: &RoundMetrics, key: &str) -> f64 {
    r.method.get(key).copied().unwrap_or(f64::NAN)
}

fn results_csv(cfg: &CompareConfig, runs: &[Run]) -> String {
    let mut s = String::from(
        "arm,seed,round,global_accuracy,global_loss,client_accuracy_mean,local_accuracy_mean,\
         bytes_up,bytes_down,cumulative_gb,weights_zero,groups_pruned,tv_mean\n",
    );
    for run in runs {
        let mut total = 0u64;
        for r in &run.rounds {
            total += r.bytes_up + r.bytes_down;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(&cfg.arms[run.arm].label),
                run.seed,
                r.round,
                r.global_accuracy,
                r.global_loss,
                r.client_accuracy_mean,
                r.local_accuracy_mean,
                r.bytes_up,
                r.bytes_down,
                total as f64 / 1e9,
                figure(r, "weights_zero"),
                figure(r, "groups_pruned"),
                figure(r, "tv_mean"),
            );
        }
    }
    s
}

/// Mean and sample standard deviation (0 for one value); NaNs are skipped.
fn mean_std(values: impl Iterator<Item = f64>) -> (f64, f64) {
    Stats::of_finite(values).pair()
}

/// Final figures of one arm over its seeds.
struct ArmSummary {
    seeds: usize,
    global: (f64, f64),
    local: (f64, f64),
    gb: (f64, f64),
    weights_zero: (f64, f64),
}

fn summarise(runs: &[Run], arm: usize) -> Option<ArmSummary> {
    let mine: Vec<&Run> = runs.iter().filter(|r| r.arm == arm).collect();
    let last = |f: &dyn Fn(&RoundMetrics) -> f64| {
        mean_std(mine.iter().filter_map(|r| r.rounds.last()).map(f))
    };
    (!mine.is_empty()).then(|| ArmSummary {
        seeds: mine.len(),
        global: last(&|r| r.global_accuracy),
        local: last(&|r| r.client_accuracy_mean),
        gb: mean_std(mine.iter().map(|r| {
            r.rounds
                .iter()
                .map(|m| (m.bytes_up + m.bytes_down) as f64)
                .sum::<f64>()
                / 1e9
        })),
        weights_zero: last(&|r| figure(r, "weights_zero")),
    })
}

fn summary_csv(cfg: &CompareConfig, runs: &[Run]) -> String {
    let mut s = String::from(
        "arm,seeds,global_accuracy,global_accuracy_std,local_accuracy,local_accuracy_std,\
         gb,gb_std,weights_zero\n",
    );
    for (a, arm) in cfg.arms.iter().enumerate() {
        if let Some(m) = summarise(runs, a) {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{}",
                csv_field(&arm.label),
                m.seeds,
                m.global.0,
                m.global.1,
                m.local.0,
                m.local.1,
                m.gb.0,
                m.gb.1,
                m.weights_zero.0
            );
        }
    }
    s
}

fn summary_markdown(cfg: &CompareConfig, runs: &[Run]) -> String {
    let mut s = format!(
        "## {}\n\n| method | seeds | global acc. (%) | local acc. (%) | GB comm. | traffic vs {} | \
         sparsity (%) |\n|---|---|---|---|---|---|---|\n",
        cfg.title, cfg.arms[0].label
    );
    let reference = summarise(runs, 0).map(|m| m.gb.0);
    for (a, arm) in cfg.arms.iter().enumerate() {
        let Some(m) = summarise(runs, a) else {
            continue;
        };
        let saving = match reference {
            Some(r) if r > 0.0 => format!("{:+.1}%", 100.0 * (m.gb.0 / r - 1.0)),
            _ => "-".into(),
        };
        let sparsity = if m.weights_zero.0.is_nan() {
            "-".into()
        } else {
            format!("{:.1}", 100.0 * m.weights_zero.0)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {saving} | {sparsity} |",
            arm.label,
            m.seeds,
            pm(m.global, 100.0, 1),
            pm(m.local, 100.0, 1),
            pm(m.gb, 1.0, 3),
        );
    }
    s
}

/// Accuracy against cumulative GB per arm: per round, the mean over seeds of both.
fn curves(cfg: &CompareConfig, runs: &[Run], local: bool) -> Vec<Line> {
    cfg.arms
        .iter()
        .enumerate()
        .map(|(a, arm)| {
            let mine: Vec<&Run> = runs.iter().filter(|r| r.arm == a).collect();
            let rounds = mine.iter().map(|r| r.rounds.len()).min().unwrap_or(0);
            let mut by_round: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
            for run in &mine {
                let mut total = 0u64;
                for r in run.rounds.iter().take(rounds) {
                    total += r.bytes_up + r.bytes_down;
                    let acc = if local {
                        r.client_accuracy_mean
                    } else {
                        r.global_accuracy
                    };
                    by_round
                        .entry(r.round)
                        .or_default()
                        .push((total as f64 / 1e9, acc));
                }
            }
            let points = by_round
                .values()
                .filter_map(|v| {
                    let gb = mean_std(v.iter().map(|p| p.0)).0;
                    let (acc, std) = mean_std(v.iter().map(|p| p.1));
                    acc.is_finite().then_some((gb, acc, std))
                })
                .collect();
            Line {
                label: arm.label.clone(),
                points,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
title = "t"
seeds = [1, 2]
[base]
rounds = 2
clients = 4
[base.dataset]
name = "digits"
[base.model]
kind = "mlp"
hidden = [16]
[[arms]]
label = "FedAvg"
method = { name = "fedavg" }
server = { optimizer = "kingma-adam", lr = 0.01 }
[[arms]]
label = "FedSparse, mid"
method = { name = "fedsparse", preset = "mid" }
set = ["train.lr=0.1"]
"#;

    #[test]
    fn arms_become_run_configs_with_their_method_seed_and_overrides() {
        let cfg = CompareConfig::parse(TEXT).unwrap();
        let run = cfg.arm_config(&cfg.arms[1], 7, None).unwrap();
        assert_eq!(run.seed, 7);
        assert_eq!(run.train.lr, 0.1);
        assert!(matches!(
            run.method,
            fedfuse_fed::MethodConfig::FedSparse { .. }
        ));
        let first = cfg.arm_config(&cfg.arms[0], 1, None).unwrap();
        assert!(first.train.lr != 0.1);
        assert_eq!(first.server.unwrap().lr, Some(0.01));
        // FedSparse steps its own server: a [server] table on it is refused, naming the arm.
        let both = TEXT.replace(
            "preset = \"mid\" }",
            "preset = \"mid\" }\nserver = { optimizer = \"adam\" }",
        );
        let err = format!("{:#}", CompareConfig::parse(&both).unwrap_err());
        assert!(
            err.contains("FedSparse, mid") && err.contains("[server]"),
            "{err}"
        );
    }

    #[test]
    fn bad_arms_and_misplaced_keys_are_named() {
        let bad_key = TEXT.replace("preset = \"mid\"", "preset = \"mid\", lamda0 = 1");
        let err = format!("{:#}", CompareConfig::parse(&bad_key).unwrap_err());
        assert!(
            err.contains("FedSparse, mid") && err.contains("lamda0"),
            "{err}"
        );
        let seeded = TEXT.replace("[base]\n", "[base]\nseed = 3\n");
        let err = format!("{:#}", CompareConfig::parse(&seeded).unwrap_err());
        assert!(err.contains("base.seed"), "{err}");
        let twice = TEXT.replace("FedSparse, mid", "FedAvg");
        assert!(CompareConfig::parse(&twice).is_err());
    }

    #[test]
    fn experiment_files_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("[[arms]]") {
                CompareConfig::load(&path).unwrap();
                seen += 1;
            }
        }
        assert!(seen > 0);
    }

    #[test]
    fn summary_reports_means_and_the_traffic_saving() {
        let cfg = CompareConfig::parse(TEXT).unwrap();
        let round = |acc: f64, up: u64, zero: Option<f64>| RoundMetrics {
            round: 1,
            global_accuracy: acc,
            global_loss: 0.0,
            local_accuracy_mean: f64::NAN,
            client_accuracy_mean: acc,
            train_loss: 0.0,
            bytes_up: up,
            bytes_down: up,
            global_params: 0,
            clients: 1,
            rejected: Vec::new(),
            method: zero
                .map(|z| BTreeMap::from([("weights_zero".to_string(), z)]))
                .unwrap_or_default(),
            seconds: 0.0,
        };
        let runs = vec![
            Run {
                arm: 0,
                seed: 1,
                rounds: vec![round(0.9, 500_000_000, None)],
            },
            Run {
                arm: 1,
                seed: 1,
                rounds: vec![round(0.8, 250_000_000, Some(0.5))],
            },
            Run {
                arm: 1,
                seed: 2,
                rounds: vec![round(0.9, 250_000_000, Some(0.5))],
            },
        ];
        let md = summary_markdown(&cfg, &runs);
        assert!(md.contains("| FedAvg | 1 | 90.0 ± 0.0 |"), "{md}");
        assert!(md.contains("| FedSparse, mid | 2 | 85.0 ± 7.1 |"), "{md}");
        assert!(md.contains("-50.0% | 50.0 |"), "{md}");
    }
}
