//! `fedfuse sweep`: a grid of federations (seeds x partitions x client counts x depths), every
//! aggregator on the same local models, as a table (CSV + markdown) and plots.
//!
//! One round: clients train once; PFNM, GPI-FNM and FedAvg (separate inits) run their server
//! step on those same models; FedAvg (common init) trains its own; the mean local model, the
//! uniform ensemble and the pooled-data oracle are the papers' reference points. Several
//! rounds: each method runs as a federation ([`simulate`]) and every round is a row.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Context, Result, bail};
use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::{Dataset, PartitionSpec, load_dataset};
use fedfuse_fed::{
    Aggregate, BuildContext, ClientsPerRound, FedAvgSettings, MethodConfig, PfnmSettings,
    SimConfig, default_eps_grid, derive_seed, simulate,
};
use fedfuse_fuse::MatchOrder;
use fedfuse_train::{Init, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use crate::Observer;
use crate::config::TrainSection;
use crate::oneshot::{LocalModel, Start, replies, train_locals};
use crate::pipeline::{ServerSplit, client_data, server_split};
use crate::table::{mean_std, write_atomic};

/// Rows of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SweepMethod {
    /// PFNM.
    Pfnm,
    /// GPI-FNM, eps chosen on the validation split.
    GpiFnm,
    /// PFNM with deep networks matched from the input up ([`MatchOrder::BottomUp`]).
    PfnmBottomUp,
    /// GPI-FNM with deep networks matched from the input up.
    GpiFnmBottomUp,
    /// FedAvg of clients trained from their own initialisations.
    FedavgSeparate,
    /// FedAvg of clients trained from one common initialisation.
    FedavgCommon,
    /// Mean test accuracy of the local models.
    Local,
    /// Uniform softmax ensemble of the local models.
    Ensemble,
    /// One model trained on all clients' data pooled.
    Oracle,
}

impl SweepMethod {
    fn label(self) -> &'static str {
        match self {
            Self::Pfnm => "PFNM",
            Self::GpiFnm => "GPI-FNM",
            Self::PfnmBottomUp => "PFNM (bottom-up)",
            Self::GpiFnmBottomUp => "GPI-FNM (bottom-up)",
            Self::FedavgSeparate => "FedAvg (separate inits)",
            Self::FedavgCommon => "FedAvg (common init)",
            Self::Local => "local (mean)",
            Self::Ensemble => "ensemble",
            Self::Oracle => "oracle (pooled)",
        }
    }
}

fn one_round() -> usize {
    1
}
fn validation() -> f64 {
    0.1
}

/// `[matching]` when the file has none: GPI-FNM's grid written out, as a file's table reads.
fn default_matching() -> PfnmSettings {
    PfnmSettings {
        eps_grid: Some(default_eps_grid()),
        ..PfnmSettings::default()
    }
}

/// A sweep, as written in `experiments/*.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Title of the table and plots.
    pub title: String,
    /// Dataset name (`mnist`, `digits`, ...).
    pub dataset: String,
    /// Folder holding the dataset's files (`--data-dir` overrides this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Seeds; every setting runs once per seed (mean and std are over seeds).
    pub seeds: Vec<u64>,
    /// Numbers of clients.
    pub clients: Vec<usize>,
    /// Hidden widths of the MLPs, one list per architecture (`[[100], [100, 100]]`).
    pub hidden: Vec<Vec<usize>>,
    /// Partitions.
    pub partitions: Vec<PartitionSpec>,
    /// Communication rounds (1: one-shot comparison on shared local models).
    #[serde(default = "one_round")]
    pub rounds: usize,
    /// Rows of the table.
    pub methods: Vec<SweepMethod>,
    /// Fraction of the training set held out by the server to choose eps.
    #[serde(default = "validation")]
    pub validation_fraction: f64,
    /// Initialisation of local models.
    #[serde(default)]
    pub init: Init,
    /// PFNM / GPI-FNM settings: the keys of their `[method]` table, with its defaults.
    /// `order` is each method's (`pfnm-bottom-up`); `eps` and `eps_grid` are GPI-FNM's.
    #[serde(
        default = "default_matching",
        deserialize_with = "PfnmSettings::deserialize_gpi_fnm"
    )]
    pub matching: PfnmSettings,
    /// Local training (per round).
    #[serde(default)]
    pub train: TrainSection,
}

impl SweepConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self> {
        crate::config::load_checked(path, "sweep config", Self::check)
    }

    fn check(&self) -> Result<()> {
        for (field, empty) in [
            ("seeds", self.seeds.is_empty()),
            ("clients", self.clients.is_empty()),
            ("hidden", self.hidden.is_empty()),
            ("partitions", self.partitions.is_empty()),
            ("methods", self.methods.is_empty()),
        ] {
            if empty {
                bail!("`{field}` must list at least one value");
            }
        }
        if self.clients.contains(&0) {
            bail!("`clients` must be at least 1");
        }
        if self.hidden.iter().any(|h| h.is_empty() || h.contains(&0)) {
            bail!("`hidden`: every architecture needs at least one hidden layer of width >= 1");
        }
        if self.rounds == 0 {
            bail!("`rounds` must be at least 1");
        }
        if !(self.validation_fraction > 0.0 && self.validation_fraction < 1.0) {
            bail!(
                "`validation_fraction` = {} must lie in (0, 1): GPI-FNM chooses eps on it",
                self.validation_fraction
            );
        }
        if self.rounds > 1
            && let Some(m) = self.methods.iter().find(|m| {
                matches!(
                    m,
                    SweepMethod::Local | SweepMethod::Ensemble | SweepMethod::Oracle
                )
            })
        {
            bail!(
                "`methods`: `{}` is a one-round reference; with rounds > 1 use pfnm, gpi-fnm, \
                 pfnm-bottom-up, gpi-fnm-bottom-up, fedavg-separate, fedavg-common",
                method_key(*m)
            );
        }
        if self.matching.order != MatchOrder::TopDown {
            bail!(
                "`matching.order`: each method sets its own order; list `pfnm-bottom-up` or \
                 `gpi-fnm-bottom-up` in `methods` instead"
            );
        }
        self.train.to_train_config().check()?;
        // Every federated method's settings, checked once up front.
        let spec = ModelSpec::mlp(1, &self.hidden[0], 2);
        let validation = Dataset::new(vec![0.0], vec![0], vec![1], 2)?;
        for m in &self.methods {
            if let Some(mc) = self.method_config(*m) {
                mc.build_with(BuildContext {
                    spec: Some(spec.clone()),
                    validation: Some(Arc::new(validation.clone())),
                    ..BuildContext::default()
                })
                .with_context(|| format!("method `{}`", method_key(*m)))?;
            }
        }
        Ok(())
    }

    fn pfnm(&self, order: MatchOrder) -> PfnmSettings {
        PfnmSettings {
            eps: None,
            eps_grid: None,
            order,
            ..self.matching.clone()
        }
    }

    fn gpi_fnm(&self, order: MatchOrder) -> PfnmSettings {
        PfnmSettings {
            order,
            ..self.matching.clone()
        }
    }

    fn method_config(&self, m: SweepMethod) -> Option<MethodConfig> {
        match m {
            SweepMethod::Pfnm => Some(MethodConfig::Pfnm(self.pfnm(MatchOrder::TopDown))),
            SweepMethod::PfnmBottomUp => Some(MethodConfig::Pfnm(self.pfnm(MatchOrder::BottomUp))),
            SweepMethod::GpiFnm => Some(MethodConfig::GpiFnm(self.gpi_fnm(MatchOrder::TopDown))),
            SweepMethod::GpiFnmBottomUp => {
                Some(MethodConfig::GpiFnm(self.gpi_fnm(MatchOrder::BottomUp)))
            }
            SweepMethod::FedavgSeparate => Some(MethodConfig::FedAvg(FedAvgSettings {
                separate_inits: true,
            })),
            SweepMethod::FedavgCommon => Some(MethodConfig::FedAvg(FedAvgSettings {
                separate_inits: false,
            })),
            SweepMethod::Local | SweepMethod::Ensemble | SweepMethod::Oracle => None,
        }
    }
}

fn method_key(m: SweepMethod) -> String {
    toml::Value::try_from(m)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A partition as a short label (`iid`, `dirichlet(0.5)`).
fn partition_label(p: &PartitionSpec) -> String {
    match p {
        PartitionSpec::Iid {} => "iid".into(),
        PartitionSpec::Dirichlet { alpha, .. } => format!("dirichlet({alpha})"),
        other => toml::Value::try_from(other)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
            .unwrap_or_else(|| "partition".into()),
    }
}

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
    /// Hidden widths of the resulting model, `-`-joined (empty for local/ensemble).
    widths: String,
    /// GPI-FNM's chosen eps.
    eps: Option<f64>,
    /// PFNM's or GPI-FNM's sigma, chosen on the validation split (with a `sigma_grid`).
    #[serde(default)]
    sigma: Option<f64>,
    seconds: f64,
}

fn widths_of(p: &Params) -> String {
    ModelSpec::infer_mlp(p)
        .ok()
        .and_then(|s| s.mlp_widths())
        .map(|w| {
            w[1..w.len() - 1]
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("-")
        })
        .unwrap_or_default()
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
            widths: String::new(),
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
                    &trainer,
                    &clients,
                    self.test,
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
                    row.widths = (0..s.hidden.len())
                        .filter_map(|l| r.method.get(&format!("width.{l}")))
                        .map(|w| w.to_string())
                        .collect::<Vec<_>>()
                        .join("-");
                    if row.widths.is_empty() {
                        row.widths = self.row(s, m, 0).hidden;
                    }
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
                    row.widths = widths_of(&fused);
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
                    row.widths = widths_of(&avg);
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
                    row.widths = widths_of(&init);
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
                    row.widths = widths_of(&fitted.params);
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

/// Runs `fedfuse sweep`; with `resume`, the settings `out/runs.toml` holds from an
/// interrupted sweep of the same file are taken from it instead of run again.
pub fn run(
    cfg: &SweepConfig,
    out: &Path,
    data_dir: Option<&Path>,
    observer: &dyn Observer,
    resume: bool,
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

fn write_rows(out: &Path, rows: &[Row]) -> Result<()> {
    let mut csv = String::from(
        "partition,clients,hidden,layers,seed,round,method,accuracy,loss,widths,eps,sigma,seconds\n",
    );
    for r in rows {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{:.3}",
            r.partition,
            r.clients,
            r.hidden,
            r.layers,
            r.seed,
            r.round,
            method_key(r.method),
            r.accuracy,
            r.loss,
            r.widths,
            r.eps.map_or(String::new(), |e| e.to_string()),
            r.sigma.map_or(String::new(), |e| e.to_string()),
            r.seconds
        );
    }
    write_atomic(&out.join("results.csv"), csv.as_bytes())
}

/// Mean and spread over seeds of one (partition, clients, hidden, round, method).
#[derive(Clone, Debug)]
struct Summary {
    partition: String,
    clients: usize,
    hidden: String,
    layers: usize,
    round: usize,
    method: SweepMethod,
    n: usize,
    accuracy_mean: f64,
    accuracy_std: f64,
    loss_mean: f64,
    /// Mean total hidden width.
    width_mean: f64,
    eps: Vec<f64>,
    sigma: Vec<f64>,
}

fn summarise(rows: &[Row]) -> Vec<Summary> {
    /// (partition, layers, clients, hidden, round, method)
    type Key = (String, usize, usize, String, usize, SweepMethod);
    let mut groups: BTreeMap<Key, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((
                r.partition.clone(),
                r.layers,
                r.clients,
                r.hidden.clone(),
                r.round,
                r.method,
            ))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|((partition, layers, clients, hidden, round, method), g)| {
            let acc: Vec<f64> = g.iter().map(|r| r.accuracy).collect();
            let (accuracy_mean, accuracy_std) = mean_std(&acc);
            let widths: Vec<f64> = g
                .iter()
                .filter(|r| !r.widths.is_empty())
                .map(|r| {
                    r.widths
                        .split('-')
                        .filter_map(|w| w.parse::<f64>().ok())
                        .sum()
                })
                .collect();
            Summary {
                partition,
                clients,
                hidden,
                layers,
                round,
                method,
                n: g.len(),
                accuracy_mean,
                accuracy_std,
                loss_mean: g.iter().map(|r| r.loss).sum::<f64>() / g.len() as f64,
                width_mean: if widths.is_empty() {
                    f64::NAN
                } else {
                    widths.iter().sum::<f64>() / widths.len() as f64
                },
                eps: g.iter().filter_map(|r| r.eps).collect(),
                sigma: g.iter().filter_map(|r| r.sigma).collect(),
            }
        })
        .collect()
}

fn write_summary(out: &Path, cfg: &SweepConfig, summary: &[Summary]) -> Result<()> {
    let mut csv = String::from(
        "partition,clients,hidden,layers,round,method,seeds,accuracy_mean,accuracy_std,loss_mean,\
         hidden_units_mean,eps_chosen,sigma_chosen\n",
    );
    let mut md = format!(
        "# {}\n\nDataset `{}`; {} seed(s); test accuracy, mean ± std over seeds; hidden units = \
         total global hidden width (mean); eps and sigma as chosen on the validation split, one \
         per seed.\n\n| partition | J | hidden | round | method | accuracy | hidden units | eps \
         chosen | sigma chosen |\n|---|---|---|---|---|---|---|---|---|\n",
        cfg.title,
        cfg.dataset,
        cfg.seeds.len()
    );
    let joined = |v: &[f64]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let or_dash = |s: String| if s.is_empty() { "–".to_string() } else { s };
    for s in summary {
        let (eps, sigma) = (joined(&s.eps), joined(&s.sigma));
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.partition,
            s.clients,
            s.hidden,
            s.layers,
            s.round,
            method_key(s.method),
            s.n,
            s.accuracy_mean,
            s.accuracy_std,
            s.loss_mean,
            s.width_mean,
            eps,
            sigma
        );
        let width = if s.width_mean.is_nan() {
            "–".to_string()
        } else {
            format!("{:.0}", s.width_mean)
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.4} ± {:.4} | {} | {} | {} |",
            s.partition,
            s.clients,
            s.hidden,
            s.round,
            s.method.label(),
            s.accuracy_mean,
            s.accuracy_std,
            width,
            or_dash(eps),
            or_dash(sigma)
        );
    }
    write_atomic(&out.join("summary.csv"), csv.as_bytes())?;
    write_atomic(&out.join("summary.md"), md.as_bytes())
}

/// Lines of the sweep's plots: one chart per partition (and per fixed other axis), x the axis
/// that varies (round, clients or depth), one line per method.
fn sweep_lines(cfg: &SweepConfig, summary: &[Summary]) -> Vec<crate::plot::Chart> {
    let axis = if cfg.rounds > 1 {
        "round"
    } else if cfg.clients.len() > 1 || cfg.hidden.len() == 1 {
        "clients"
    } else {
        "hidden layers"
    };
    type Points = Vec<(f64, f64, f64)>;
    let mut charts: BTreeMap<String, BTreeMap<SweepMethod, Points>> = BTreeMap::new();
    for s in summary {
        let (facet, x) = match axis {
            "round" => (
                format!("{}, J={}, hidden {}", s.partition, s.clients, s.hidden),
                s.round as f64,
            ),
            "clients" => (
                format!("{}, hidden {}", s.partition, s.hidden),
                s.clients as f64,
            ),
            _ => (format!("{}, J={}", s.partition, s.clients), s.layers as f64),
        };
        charts
            .entry(facet)
            .or_default()
            .entry(s.method)
            .or_default()
            .push((x, s.accuracy_mean, s.accuracy_std));
    }
    charts
        .into_iter()
        .map(|(facet, lines)| crate::plot::Chart {
            title: format!("{}: {facet}", cfg.title),
            x_label: axis.to_string(),
            lines: lines
                .into_iter()
                .map(|(m, points)| crate::plot::Line {
                    label: m.label().to_string(),
                    points,
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
