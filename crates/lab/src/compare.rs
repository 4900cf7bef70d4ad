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
        let text = crate::config::read_settings_file(path, "comparison")?;
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
/// `resume`, the runs `out/runs.toml` holds under the same config are taken from it. With
/// `tensorboard`, each run writes its events to `tensorboard/{arm}/seed-{seed}` (TensorBoard
/// shows each as a run of its own). Setting `stop` stops the run in progress after its round
/// (an error then; the finished runs stay in `out` for `resume`).
pub fn run(
    cfg: &CompareConfig,
    out: &Path,
    data_dir: Option<&Path>,
    observer: &dyn Observer,
    resume: bool,
    tensorboard: Option<&Path>,
    stop: Option<&std::sync::atomic::AtomicBool>,
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
            let mut run_cfg = cfg.arm_config(arm, seed, data_dir)?;
            run_cfg.logging.tensorboard = tensorboard.map(|dir| {
                dir.join(crate::tensorboard::folder_name(&arm.label))
                    .join(format!("seed-{seed}"))
            });
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
                    match stop {
                        Some(stop) => crate::run::federate_until(&run_cfg, observer, stop),
                        None => crate::run::federate(&run_cfg, observer),
                    }
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
        "arm,seed,round,global_accuracy,global_loss,client_accuracy_mean,client_accuracy_last_mean,\
         local_accuracy_mean,\
         bytes_up,bytes_down,cumulative_gb,weights_zero,groups_pruned,tv_mean\n",
    );
    for run in runs {
        let mut total = 0u64;
        for r in &run.rounds {
            total += r.bytes_up + r.bytes_down;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(&cfg.arms[run.arm].label),
                run.seed,
                r.round,
                r.global_accuracy,
                r.global_loss,
                r.client_accuracy_mean,
                r.client_accuracy_last_mean,
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

/// The figure a comparison reports as "local accuracy": the paper's, the mean over every
/// client of its last upload on its own test split, when every run recorded it; else (runs
/// recorded before fedfuse kept it) the mean over the round's uploads, for every arm alike.
fn local_measure(runs: &[Run]) -> fn(&RoundMetrics) -> f64 {
    let recorded = runs.iter().all(|run| {
        run.rounds
            .last()
            .is_some_and(|r| r.client_accuracy_last_mean.is_finite())
    });
    if recorded {
        |r| r.client_accuracy_last_mean
    } else {
        |r| r.client_accuracy_mean
    }
}

/// Cumulative traffic in GB after each round of `rounds`.
fn cumulative_gb(rounds: &[RoundMetrics]) -> impl Iterator<Item = (f64, &RoundMetrics)> {
    rounds.iter().scan(0u64, |total, r| {
        *total += r.bytes_up + r.bytes_down;
        Some((*total as f64 / 1e9, r))
    })
}

/// The figure `f` of a run at `gb` of its cumulative traffic: linear in GB between the rounds
/// that measured it (`eval_every`). None before its first measurement or past its last.
fn at_traffic(rounds: &[RoundMetrics], gb: f64, f: impl Fn(&RoundMetrics) -> f64) -> Option<f64> {
    let mut before: Option<(f64, f64)> = None;
    for (x, r) in cumulative_gb(rounds) {
        let y = f(r);
        if !y.is_finite() {
            continue;
        }
        if x >= gb {
            return match before {
                _ if x == gb => Some(y),
                Some((x0, y0)) => Some(y0 + (y - y0) * (gb - x0) / (x - x0)),
                None => None,
            };
        }
        before = Some((x, y));
    }
    None
}

/// An arm against the reference (the first arm) at equal traffic, per seed both ran: the
/// paper's Figure 3 reading. `(seed, reference's global, arm minus reference: global,
/// reference's local, arm minus reference: local)`, accuracies as fractions; a seed whose
/// reference never sent the arm's traffic is left out.
struct EqualTraffic {
    seeds: Vec<(u64, f64, f64, f64, f64)>,
}

impl EqualTraffic {
    fn of(runs: &[Run], arm: usize) -> Self {
        let local_accuracy = local_measure(runs);
        let seeds = runs
            .iter()
            .filter(|r| r.arm == arm)
            .filter_map(|run| {
                let reference = runs.iter().find(|r| r.arm == 0 && r.seed == run.seed)?;
                let (gb, last) = cumulative_gb(&run.rounds).last()?;
                let global = at_traffic(&reference.rounds, gb, |r| r.global_accuracy)?;
                let local = at_traffic(&reference.rounds, gb, local_accuracy).unwrap_or(f64::NAN);
                Some((
                    run.seed,
                    global,
                    last.global_accuracy - global,
                    local,
                    local_accuracy(last) - local,
                ))
            })
            .collect();
        Self { seeds }
    }

    /// Mean and std over seeds of column `i` (1-4 as in `seeds`).
    fn stat(&self, i: usize) -> (f64, f64) {
        mean_std(self.seeds.iter().map(|s| [s.1, s.2, s.3, s.4][i - 1]))
    }
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
    let local_accuracy = local_measure(runs);
    let mine: Vec<&Run> = runs.iter().filter(|r| r.arm == arm).collect();
    let last = |f: &dyn Fn(&RoundMetrics) -> f64| {
        mean_std(mine.iter().filter_map(|r| r.rounds.last()).map(f))
    };
    (!mine.is_empty()).then(|| ArmSummary {
        seeds: mine.len(),
        global: last(&|r| r.global_accuracy),
        local: last(&local_accuracy),
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
         gb,gb_std,weights_zero,reference_global_at_gb,global_minus_reference_at_gb,\
         global_minus_reference_at_gb_std,reference_local_at_gb,local_minus_reference_at_gb,\
         local_minus_reference_at_gb_std\n",
    );
    for (a, arm) in cfg.arms.iter().enumerate() {
        if let Some(m) = summarise(runs, a) {
            let eq = EqualTraffic::of(runs, a);
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_field(&arm.label),
                m.seeds,
                m.global.0,
                m.global.1,
                m.local.0,
                m.local.1,
                m.gb.0,
                m.gb.1,
                m.weights_zero.0,
                eq.stat(1).0,
                eq.stat(2).0,
                eq.stat(2).1,
                eq.stat(3).0,
                eq.stat(4).0,
                eq.stat(4).1,
            );
        }
    }
    s
}

fn summary_markdown(cfg: &CompareConfig, runs: &[Run]) -> String {
    let reference_label = &cfg.arms[0].label;
    let mut s = format!(
        "## {}\n\n| method | seeds | global acc. (%) | local acc. (%) | GB comm. | traffic vs \
         {reference_label} | sparsity (%) | {reference_label} at the same GB: global / local (%) \
         | minus {reference_label} there: global / local (points) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        cfg.title
    );
    let mut per_seed = String::new();
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
        let eq = EqualTraffic::of(runs, a);
        let (at, minus) = if a == 0 || eq.seeds.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let signed = |v: (f64, f64)| {
                if v.0.is_nan() {
                    "-".into()
                } else {
                    format!("{:+.1} ± {:.1}", 100.0 * v.0, 100.0 * v.1)
                }
            };
            (
                format!(
                    "{} / {}",
                    pm(eq.stat(1), 100.0, 1),
                    pm(eq.stat(3), 100.0, 1)
                ),
                format!("{} / {}", signed(eq.stat(2)), signed(eq.stat(4))),
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {saving} | {sparsity} | {at} | {minus} |",
            arm.label,
            m.seeds,
            pm(m.global, 100.0, 1),
            pm(m.local, 100.0, 1),
            pm(m.gb, 1.0, 3),
        );
        if a > 0 && !eq.seeds.is_empty() {
            let list = |i: usize| {
                eq.seeds
                    .iter()
                    .map(|v| format!("{:+.1}", 100.0 * [v.2, v.4][i]))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let seeds: Vec<String> = eq.seeds.iter().map(|v| v.0.to_string()).collect();
            let _ = writeln!(
                per_seed,
                "- {} minus {reference_label} at the same traffic, seeds {}: global {} points, \
                 local {}",
                arm.label,
                seeds.join(", "),
                list(0),
                list(1)
            );
        }
    }
    if !per_seed.is_empty() {
        let _ = write!(
            s,
            "\nAt the same traffic: {reference_label}'s accuracy where its cumulative traffic \
             reaches the arm's total (linear between the rounds it was evaluated), on the same \
             seed.\n\n{per_seed}"
        );
    }
    s
}

/// Accuracy against cumulative GB per arm: per round, the mean over seeds of both.
fn curves(cfg: &CompareConfig, runs: &[Run], local: bool) -> Vec<Line> {
    let local_accuracy = local_measure(runs);
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
                        local_accuracy(r)
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
        // Subfolders (experiments/fedmix/, matching/, recipes/) are loaded by
        // tests/lab/shipped.rs.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                continue;
            }
            let table: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
            if table.contains_key("arms") {
                CompareConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
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
            client_accuracy_last_mean: f64::NAN,
            client_accuracies: Vec::new(),
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
        // FedAvg measured nothing below 1 GB: no reading at the arm's 0.5 GB.
        assert!(md.contains("-50.0% | 50.0 | - | - |"), "{md}");
    }

    /// A round sending `gb` in all, with the global and the clients' own accuracy.
    fn sent(round: usize, gb: f64, global: f64, local: f64) -> RoundMetrics {
        RoundMetrics {
            round,
            global_accuracy: global,
            global_loss: 0.0,
            local_accuracy_mean: f64::NAN,
            client_accuracy_mean: local,
            client_accuracy_last_mean: f64::NAN,
            client_accuracies: Vec::new(),
            train_loss: 0.0,
            bytes_up: (gb * 0.5e9) as u64,
            bytes_down: (gb * 0.5e9) as u64,
            global_params: 0,
            clients: 1,
            rejected: Vec::new(),
            method: BTreeMap::new(),
            seconds: 0.0,
        }
    }

    #[test]
    fn local_accuracy_is_the_papers_only_when_every_run_recorded_it() {
        let cfg = CompareConfig::parse(TEXT).unwrap();
        let run = |arm: usize, last: f64| {
            let mut r = sent(1, 1.0, 0.9, 0.8);
            r.client_accuracy_last_mean = last;
            Run {
                arm,
                seed: 1,
                rounds: vec![r],
            }
        };
        let both = summary_markdown(&cfg, &[run(0, 0.7), run(1, 0.6)]);
        assert!(
            both.contains("| FedAvg | 1 | 90.0 ± 0.0 | 70.0 ± 0.0 |"),
            "{both}"
        );
        assert!(
            both.contains("| FedSparse, mid | 1 | 90.0 ± 0.0 | 60.0 ± 0.0 |"),
            "{both}"
        );
        // One run recorded before the paper's figure was kept: the round's uploads for all.
        let mixed = summary_markdown(&cfg, &[run(0, 0.7), run(1, f64::NAN)]);
        assert!(
            mixed.contains("| FedAvg | 1 | 90.0 ± 0.0 | 80.0 ± 0.0 |"),
            "{mixed}"
        );
        assert!(
            mixed.contains("| FedSparse, mid | 1 | 90.0 ± 0.0 | 80.0 ± 0.0 |"),
            "{mixed}"
        );
    }

    #[test]
    fn equal_traffic_reads_the_reference_between_its_evaluated_rounds() {
        let nan = f64::NAN;
        // The reference evaluated its global model every other round (eval_every = 2).
        let reference: Vec<RoundMetrics> = [(nan, 0.5), (0.6, 0.6), (nan, 0.7), (0.8, 0.8)]
            .iter()
            .enumerate()
            .map(|(i, &(g, l))| sent(i + 1, 0.25, g, l))
            .collect();
        let global = |r: &RoundMetrics| r.global_accuracy;
        assert_eq!(at_traffic(&reference, 0.5, global), Some(0.6));
        // 0.6 GB lies a fifth of the way from 0.5 GB (0.6) to 1.0 GB (0.8).
        let mid = at_traffic(&reference, 0.6, global).unwrap();
        assert!((mid - 0.64).abs() < 1e-12, "{mid}");
        assert_eq!(at_traffic(&reference, 0.4, global), None);
        assert_eq!(at_traffic(&reference, 1.1, global), None);

        // Three rounds of 0.2 GB: 0.6 GB in all.
        let arm = |seed: u64| Run {
            arm: 1,
            seed,
            rounds: (1..=3).map(|i| sent(i, 0.2, 0.75, 0.65)).collect(),
        };
        let runs = vec![
            Run {
                arm: 0,
                seed: 1,
                rounds: reference,
            },
            arm(1),
            // No reference run on seed 2: left out.
            arm(2),
        ];
        let eq = EqualTraffic::of(&runs, 1);
        assert_eq!(eq.seeds.len(), 1);
        let (seed, g, dg, l, dl) = eq.seeds[0];
        assert_eq!(seed, 1);
        assert!(
            (g - 0.64).abs() < 1e-9 && (dg - 0.11).abs() < 1e-9,
            "{g} {dg}"
        );
        // The clients' accuracy is measured every round: 0.6 at 0.5 GB, 0.7 at 0.75 GB.
        assert!(
            (l - 0.64).abs() < 1e-9 && (dl - 0.01).abs() < 1e-9,
            "{l} {dl}"
        );
        let cfg = CompareConfig::parse(TEXT).unwrap();
        let md = summary_markdown(&cfg, &runs);
        assert!(
            md.contains("| 64.0 ± 0.0 / 64.0 ± 0.0 | +11.0 ± 0.0 / +1.0 ± 0.0 |"),
            "{md}"
        );
        assert!(
            md.contains("seeds 1: global +11.0 points, local +1.0"),
            "{md}"
        );
    }
}
