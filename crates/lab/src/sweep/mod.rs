//! `fedfuse sweep`: a grid of federations (seeds x partitions x client counts x depths), every
//! aggregator on the same local models, as a table (CSV + markdown) and plots.
//!
//! One round: clients train once; PFNM, GPI-FNM and FedAvg (separate inits) run their server
//! step on those same models; FedAvg (common init) trains its own; the mean local model, the
//! uniform ensemble and the pooled-data oracle are the papers' reference points. Several
//! rounds: each method runs as a federation ([`simulate`]) and every round is a row.
mod config;
mod summary;

pub use config::{SweepConfig, SweepMethod};
use config::{method_key, partition_label};
use summary::{summarise, sweep_lines, write_rows, write_summary};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Context, Result, bail};
use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::{Dataset, PartitionSpec, load_dataset};
use fedfuse_fed::{
    Aggregate, BuildContext, ClientsPerRound, Population, SimConfig, derive_seed, simulate,
};
use fedfuse_train::{Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::Observer;
use crate::oneshot::{LocalModel, Start, replies, train_locals};
use crate::pipeline::{ServerSplit, client_data, server_split};
use crate::table::HiddenWidths;

/// One measured row.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Row {
    partition: String,
    clients: usize,
    hidden: String,
    layers: usize,
    seed: u64,
    round: usize,
    method: SweepMethod,
    accuracy: f64,
    loss: f64,
    /// Hidden widths of the resulting model (empty for local/ensemble).
    widths: HiddenWidths,
    /// GPI-FNM's chosen eps.
    eps: Option<f64>,
    /// PFNM's or GPI-FNM's sigma, chosen on the validation split (with a `sigma_grid`).
    #[serde(default)]
    sigma: Option<f64>,
    seconds: f64,
}

fn evaluate(p: &Params, test: &Dataset) -> Result<(f64, f64)> {
    let e = Trainer::new(ModelSpec::infer_mlp(p)?)?.evaluate(p, test)?;
    Ok((e.accuracy, e.loss))
}

/// One (seed, partition, clients, architecture) setting.
struct Setting<'a> {
    seed: u64,
    partition: &'a PartitionSpec,
    clients: usize,
    hidden: &'a [usize],
}

struct Sweep<'a> {
    cfg: &'a SweepConfig,
    pool: &'a Dataset,
    validation: Option<Arc<Dataset>>,
    test: &'a Dataset,
}

impl Sweep<'_> {
    fn row(&self, s: &Setting<'_>, method: SweepMethod, round: usize) -> Row {
        Row {
            partition: partition_label(s.partition),
            clients: s.clients,
            hidden: s
                .hidden
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("-"),
            layers: s.hidden.len(),
            seed: s.seed,
            round,
            method,
            accuracy: f64::NAN,
            loss: f64::NAN,
            widths: HiddenWidths::default(),
            eps: None,
            sigma: None,
            seconds: 0.0,
        }
    }

    fn build(
        &self,
        m: SweepMethod,
        spec: &ModelSpec,
        seed: u64,
    ) -> Result<Option<Box<dyn fedfuse_fed::Method>>> {
        self.cfg
            .method_config(m)
            .map(|mc| {
                mc.build_with(BuildContext {
                    init: self.cfg.init,
                    seed,
                    spec: Some(spec.clone()),
                    validation: self.validation.clone(),
                })
                .map_err(crate::LabError::from)
            })
            .transpose()
    }

    /// Rows of one setting.
    fn run(
        &self,
        s: &Setting<'_>,
        oracle: &mut BTreeMap<(u64, Vec<usize>), Row>,
    ) -> Result<Vec<Row>> {
        let mut rng = StdRng::seed_from_u64(derive_seed(s.seed, 0, s.clients));
        let clients = client_data(self.pool, s.clients, s.partition, 0.0, &mut rng)?;
        let spec = ModelSpec::mlp(self.pool.dim(), s.hidden, self.pool.num_classes);
        let trainer = Trainer::new(spec.clone())?;
        let train = self.cfg.train.to_train_config();
        let init = init_params(&spec, self.cfg.init, derive_seed(s.seed, 0, usize::MAX));
        let mut rows = Vec::new();

        if self.cfg.rounds > 1 {
            for &m in &self.cfg.methods {
                let Some(mut method) = self.build(m, &spec, s.seed)? else {
                    continue;
                };
                let sim = SimConfig {
                    rounds: self.cfg.rounds,
                    clients_per_round: ClientsPerRound::Fraction(1.0),
                    seed: s.seed,
                    train: train.clone(),
                    local_eval: false,
                    ..SimConfig::default()
                };
                let started = Instant::now();
                let run = simulate(
                    method.as_mut(),
                    Population::labelled(&trainer, &clients, self.test),
                    init.clone(),
                    &sim,
                    &|_| {},
                )?;
                let per_round = started.elapsed().as_secs_f64() / self.cfg.rounds as f64;
                for r in &run.rounds {
                    let mut row = self.row(s, m, r.round);
                    row.accuracy = r.global_accuracy;
                    row.loss = r.global_loss;
                    row.eps = r.method.get("eps").copied();
                    row.sigma = r.method.get("sigma").copied();
                    // Matching reports the global widths; the others keep the clients'.
                    let reported: Vec<usize> = (0..s.hidden.len())
                        .filter_map(|l| r.method.get(&format!("width.{l}")))
                        .map(|&w| w as usize)
                        .collect();
                    row.widths = HiddenWidths(if reported.is_empty() {
                        s.hidden.to_vec()
                    } else {
                        reported
                    });
                    row.seconds = per_round;
                    rows.push(row);
                }
            }
            return Ok(rows);
        }

        let needs_separate = self.cfg.methods.iter().any(|m| {
            matches!(
                m,
                SweepMethod::Pfnm
                    | SweepMethod::GpiFnm
                    | SweepMethod::PfnmBottomUp
                    | SweepMethod::GpiFnmBottomUp
                    | SweepMethod::FedavgSeparate
                    | SweepMethod::Local
                    | SweepMethod::Ensemble
            )
        });
        let started = Instant::now();
        let separate: Vec<LocalModel> = if needs_separate {
            train_locals(
                &trainer,
                &clients,
                &train,
                self.cfg.init,
                Start::Separate,
                s.seed,
            )?
        } else {
            Vec::new()
        };
        let local_seconds = started.elapsed().as_secs_f64();
        let sent = replies(&separate);
        for &m in &self.cfg.methods {
            let started = Instant::now();
            let mut row = self.row(s, m, 1);
            match m {
                SweepMethod::Pfnm
                | SweepMethod::GpiFnm
                | SweepMethod::PfnmBottomUp
                | SweepMethod::GpiFnmBottomUp
                | SweepMethod::FedavgSeparate => {
                    let Some(mut method) = self.build(m, &spec, s.seed)? else {
                        continue;
                    };
                    let Aggregate::Replace(fused) = method.aggregate(1, &init, &sent)? else {
                        bail!("{} kept the initial model", m.label());
                    };
                    (row.accuracy, row.loss) = evaluate(&fused, self.test)?;
                    row.widths = HiddenWidths::of(&fused);
                    let chosen = method.round_metrics();
                    row.eps = chosen.get("eps").copied();
                    row.sigma = chosen.get("sigma").copied();
                    row.seconds = local_seconds + started.elapsed().as_secs_f64();
                }
                SweepMethod::FedavgCommon => {
                    let common = train_locals(
                        &trainer,
                        &clients,
                        &train,
                        self.cfg.init,
                        Start::Common,
                        s.seed,
                    )?;
                    let Some(mut method) = self.build(m, &spec, s.seed)? else {
                        continue;
                    };
                    let Aggregate::Replace(avg) = method.aggregate(1, &init, &replies(&common))?
                    else {
                        bail!("FedAvg kept the initial model");
                    };
                    (row.accuracy, row.loss) = evaluate(&avg, self.test)?;
                    row.widths = HiddenWidths::of(&avg);
                    row.seconds = started.elapsed().as_secs_f64();
                }
                SweepMethod::Local => {
                    let evals = separate
                        .iter()
                        .map(|l| trainer.evaluate(&l.params, self.test))
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    let n = evals.len().max(1) as f64;
                    row.accuracy = evals.iter().map(|e| e.accuracy).sum::<f64>() / n;
                    row.loss = evals.iter().map(|e| e.loss).sum::<f64>() / n;
                    row.widths = HiddenWidths::of(&init);
                    row.seconds = local_seconds;
                }
                SweepMethod::Ensemble => {
                    let members: Vec<&Params> = separate.iter().map(|l| &l.params).collect();
                    let e = trainer.evaluate_ensemble(&members, self.test)?;
                    (row.accuracy, row.loss) = (e.accuracy, e.loss);
                    row.seconds = local_seconds + started.elapsed().as_secs_f64();
                }
                SweepMethod::Oracle => {
                    // The pooled model depends on neither the partition nor the client count.
                    let key = (s.seed, s.hidden.to_vec());
                    if let Some(cached) = oracle.get(&key) {
                        let mut r = cached.clone();
                        r.partition = row.partition;
                        r.clients = s.clients;
                        rows.push(r);
                        continue;
                    }
                    let fitted = trainer.fit_with(
                        &init,
                        self.pool,
                        &train,
                        None,
                        derive_seed(s.seed, 1, usize::MAX),
                    )?;
                    (row.accuracy, row.loss) = evaluate(&fitted.params, self.test)?;
                    row.widths = HiddenWidths::of(&fitted.params);
                    row.seconds = started.elapsed().as_secs_f64();
                    oracle.insert(key, row.clone());
                }
            }
            rows.push(row);
        }
        Ok(rows)
    }
}

/// The settings a sweep finished, as `runs.toml` keeps them for `--resume`.
#[derive(Default, Serialize, Deserialize)]
struct SavedSweep {
    /// The sweep's resolved settings: rows are reused only under the very same ones.
    config: String,
    /// Rows by setting key ([`setting_key`]).
    settings: BTreeMap<String, Vec<Row>>,
}

fn setting_key(s: &Setting<'_>) -> String {
    format!(
        "seed {} | {} | {} clients | hidden {:?}",
        s.seed,
        partition_label(s.partition),
        s.clients,
        s.hidden
    )
}

/// One setting's rows as TensorBoard runs, one per method: accuracy and loss at step = round.
fn log_setting(dir: &Path, rows: &[Row]) -> Result<()> {
    let mut methods: Vec<SweepMethod> = rows.iter().map(|r| r.method).collect();
    methods.dedup();
    for m in methods {
        let mut log = crate::tensorboard::EventLog::create(&dir.join(method_key(m)), &[])?;
        for r in rows.iter().filter(|r| r.method == m) {
            log.scalars(
                r.round as i64,
                &[("accuracy".into(), r.accuracy), ("loss".into(), r.loss)],
            )?;
        }
    }
    Ok(())
}

/// Runs `fedfuse sweep`; with `resume`, the settings `out/runs.toml` holds from an
/// interrupted sweep of the same file are taken from it instead of run again. Setting `stop`
/// ends the sweep before its next setting (an error then; the finished ones stay in `out`).
/// With `tensorboard`, each setting's methods are TensorBoard runs of their own
/// (`tensorboard/{setting}/{method}`: accuracy and loss by round).
pub fn run(
    cfg: &SweepConfig,
    out: &Path,
    data_dir: Option<&Path>,
    observer: &dyn Observer,
    resume: bool,
    stop: Option<&std::sync::atomic::AtomicBool>,
    tensorboard: Option<&Path>,
) -> Result<()> {
    crate::table::check_replaceable_by(out, crate::table::is_experiment_file)?;
    let config = toml::to_string(cfg).context("cannot write the sweep's settings")?;
    let saved_path = out.join("runs.toml");
    let mut earlier = SavedSweep::default();
    if resume && saved_path.exists() {
        let text = std::fs::read_to_string(&saved_path)
            .with_context(|| format!("cannot read {}", saved_path.display()))?;
        earlier = toml::from_str(&text).with_context(|| format!("{}", saved_path.display()))?;
        if earlier.config != config {
            bail!(
                "{} belongs to a sweep of other settings; run without --resume to start over",
                saved_path.display()
            );
        }
    }
    let mut saved = SavedSweep {
        config,
        settings: BTreeMap::new(),
    };
    let data = load_dataset(&cfg.dataset, data_dir.or(cfg.data_dir.as_deref()))
        .with_context(|| format!("dataset `{}`", cfg.dataset))?;
    let mut settings = Vec::new();
    for &seed in &cfg.seeds {
        for hidden in &cfg.hidden {
            for p in &cfg.partitions {
                for &clients in &cfg.clients {
                    settings.push(Setting {
                        seed,
                        partition: p,
                        clients,
                        hidden,
                    });
                }
            }
        }
    }
    observer.note(&format!(
        "{}: {} settings x {} methods on {} ({} train / {} test)",
        cfg.title,
        settings.len(),
        cfg.methods.len(),
        cfg.dataset,
        data.train.len(),
        data.test.len()
    ));
    let mut rows = Vec::new();
    let mut oracle = BTreeMap::new();
    // The server's validation split of the current seed, drawn before any partition.
    let mut held: Option<(u64, ServerSplit<'_>)> = None;
    for (i, s) in settings.iter().enumerate() {
        let key = setting_key(s);
        if let Some(done) = earlier.settings.remove(&key) {
            observer.note(&format!(
                "[{}/{}] {key}: finished before, from {}",
                i + 1,
                settings.len(),
                saved_path.display()
            ));
            rows.extend(done.iter().cloned());
            saved.settings.insert(key, done);
            publish(out, cfg, &rows, &saved, false)?;
            continue;
        }
        if stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
            bail!(
                "stopped after {i} of {} settings; --resume takes them from {}",
                settings.len(),
                saved_path.display()
            );
        }
        let (_, split) = match held.take() {
            Some((seed, split)) if seed == s.seed => held.insert((seed, split)),
            _ => {
                let mut rng = StdRng::seed_from_u64(s.seed);
                let split = server_split(&data.train, cfg.validation_fraction, &mut rng)?;
                held.insert((s.seed, split))
            }
        };
        let ctx = Sweep {
            cfg,
            pool: &split.pool,
            validation: split.validation.clone(),
            test: &data.test,
        };
        let started = Instant::now();
        let new_rows = ctx.run(s, &mut oracle).with_context(|| {
            format!(
                "seed {}, {}, {} clients, hidden {:?}",
                s.seed,
                partition_label(s.partition),
                s.clients,
                s.hidden
            )
        })?;
        let mut line = format!(
            "[{}/{}] seed {} {} J={} hidden {:?} ({:.0} s):",
            i + 1,
            settings.len(),
            s.seed,
            partition_label(s.partition),
            s.clients,
            s.hidden,
            started.elapsed().as_secs_f64()
        );
        for r in new_rows.iter().filter(|r| r.round == cfg.rounds) {
            let _ = write!(line, " {} {:.3}", method_key(r.method), r.accuracy);
        }
        observer.note(&line);
        if let Some(dir) = tensorboard {
            log_setting(&dir.join(crate::tensorboard::folder_name(&key)), &new_rows)?;
        }
        saved.settings.insert(key, new_rows.clone());
        rows.extend(new_rows);
        // Partial results survive an interrupted sweep.
        publish(out, cfg, &rows, &saved, false)?;
    }
    publish(out, cfg, &rows, &saved, true)?;
    observer.note(&format!("results in {}", out.display()));
    Ok(())
}

/// Replaces `out` whole with the settings and the rows so far, and at the end the summary and
/// the plots.
fn publish(
    out: &Path,
    cfg: &SweepConfig,
    rows: &[Row],
    saved: &SavedSweep,
    end: bool,
) -> Result<()> {
    let runs = toml::to_string(saved).context("cannot write runs.toml")?;
    crate::table::replace_folder(out, |dir| {
        crate::table::start_output(dir, "sweep.toml", cfg)?;
        write_rows(dir, rows)?;
        crate::table::write_atomic(&dir.join("runs.toml"), runs.as_bytes())?;
        if end {
            let summary = summarise(rows);
            write_summary(dir, cfg, &summary)?;
            crate::plot::write_sweep_plots(dir, &cfg.title, &sweep_lines(cfg, &summary))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::mean_std;

    #[test]
    fn every_experiment_is_valid() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../experiments");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // Comparisons (`[[arms]]`) are `fedfuse compare` files, checked in compare.rs;
            // `gems-*` and `ngm-*` are `fedfuse gems` / `fedfuse ngm` files, checked in
            // gems_exp.rs and ngm_exp.rs.
            let comparison = std::fs::read_to_string(&path).is_ok_and(|t| t.contains("[[arms]]"));
            let gems = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("gems-") || n.starts_with("ngm-"));
            if path.extension().is_some_and(|e| e == "toml") && !comparison && !gems {
                SweepConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 4, "{n} experiments");
    }

    #[test]
    fn summary_is_mean_and_sample_std() {
        let (m, s) = mean_std(&[0.8, 0.9, 1.0]);
        assert!((m - 0.9).abs() < 1e-12);
        assert!((s - 0.1).abs() < 1e-12);
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
    }
}
