//! `fedfuse run`: config -> data -> federation -> output folder.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Context, LabError, Result, bail};
use fedfuse_core::flower::FlowerContent;
use fedfuse_core::{ConfigValue, ModelSpec, Params, TorchvisionNames};

use crate::wire::WireNames;
use fedfuse_data::{CdcOptions, Table, cache_dir, load_dataset};
use fedfuse_data::{ClientData, Dataset, client_splits, permute_clients, permute_features};
use fedfuse_fed::{
    BuildContext, Method, Population, Progress, RoundMetrics, RunResult, SERVER_ROUND, Session,
    SimConfig, derive_seed, simulate_session,
};
use fedfuse_train::{Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::Observer;
use crate::checkpoint;
use crate::config::{Config, Score, TableSection, cdc_split};
use crate::pipeline::{
    ClientTables, cdc_tables, client_data, client_data_by_ids, ggm_tables, server_split,
};

/// Runs the experiment of `cfg`, writing the resolved config, results.json, metrics.csv, the
/// final model and the plots under `out`, and a checkpoint beside it after every round
/// ([`checkpoint::path_for`]) until the run ends.
pub fn run(cfg: &Config, out: &Path, observer: &dyn Observer) -> Result<RunResult> {
    run_with(cfg, out, observer, false)
}

/// [`run`], continuing with `resume` from the checkpoint an interrupted run of the same config
/// left (or from round 1 when there is none).
pub fn run_with(
    cfg: &Config,
    out: &Path,
    observer: &dyn Observer,
    resume: bool,
) -> Result<RunResult> {
    run_until(cfg, out, observer, resume, None)
}

/// [`run_with`], stopped after the round during which `stop` is set (its checkpoint written):
/// then an error that says so and where the checkpoint is, which `resume` continues from.
pub fn run_until(
    cfg: &Config,
    out: &Path,
    observer: &dyn Observer,
    resume: bool,
    stop: Option<&AtomicBool>,
) -> Result<RunResult> {
    // The folder is replaced whole when the run ends (an earlier run's files go, a failed or
    // killed run changes nothing): refuse now, not after the run, a folder that holds more.
    crate::table::check_replaceable(out, &crate::table::RUN_FILES)?;
    let saved = checkpoint::path_for(out);
    let (result, spec) = federate_with(cfg, observer, Some((&saved, resume)), stop)?;
    // A zoo network's config.toml shows the layer list it expanded to.
    let mut shown = cfg.clone();
    if let (Some(model), Some(spec)) = (&cfg.model, &spec) {
        shown.model = Some(model.showing_layers(spec));
    }
    write_run_folder(out, &shown, &result)?;
    // The run is whole in `out`: nothing left to resume.
    for failed in checkpoint::remove(&saved) {
        observer.note(&failed);
    }
    if let Some(first) = nothing_accepted(&result) {
        bail!(
            "every client's reply was rejected in every round, so the model never left its \
             initial state (client {}: {}); results.json in {} lists every rejection",
            first.client,
            first.reason,
            out.display()
        );
    }
    let local_norm = cfg.model.as_ref().is_some_and(|m| m.local_norm);
    match result.rounds.last() {
        // FedBN's figure is the clients' own models; the global one keeps the initial norms.
        Some(last) if local_norm => observer.note(&format!(
            "final mean local accuracy {:.4} (each client's model with its own norms; the \
             global model, with the initial norms, {:.4}); results in {}",
            last.local_accuracy_mean,
            last.global_accuracy,
            out.display()
        )),
        Some(last) if cfg.table.is_none() => observer.note(&format!(
            "final global accuracy {:.4}; results in {}",
            last.global_accuracy,
            out.display()
        )),
        _ => observer.note(&format!("results in {}", out.display())),
    }
    Ok(result)
}

/// The first rejection of a run in which no round accepted any reply (a broken client step
/// or a config the clients cannot follow); `None` when some reply counted.
pub fn nothing_accepted(result: &RunResult) -> Option<&fedfuse_fed::Rejection> {
    let all_rejected = !result.rounds.is_empty()
        && result
            .rounds
            .iter()
            .all(|r| r.clients > 0 && r.rejected.len() >= r.clients);
    if all_rejected {
        result.rounds.first()?.rejected.first()
    } else {
        None
    }
}

/// Replaces `out` with a finished run's folder: config.toml, results.json, metrics.csv, the
/// model and the plots, all or nothing (the simulator's runs and those over Flower alike).
pub fn write_run_folder(out: &Path, cfg: &Config, result: &RunResult) -> Result<()> {
    crate::table::replace_folder(out, |dir| {
        crate::table::start_output(dir, "config.toml", cfg)?;
        write_outputs(dir, cfg, result)
    })
}

/// Writes a finished run's results.json, metrics.csv, model and plots under `out`.
pub fn write_outputs(out: &Path, cfg: &Config, result: &RunResult) -> Result<()> {
    crate::output::write_results(out, cfg, result)?;
    // A tabular method's model is no classifier: no accuracy to plot.
    if cfg.table.is_none() {
        crate::plot::write_plots(out, &result.rounds)?;
    }
    crate::table::write_model_atomic(
        &out.join("model.safetensors"),
        &saved_model(cfg, result)?,
        Default::default(),
    )
}

/// The final model as a run saves it: under torchvision's names for its networks (so
/// `load_state_dict` takes them), the list's otherwise.
pub fn saved_model(cfg: &Config, result: &RunResult) -> Result<Params> {
    Ok(
        match cfg.model.as_ref().and_then(|m| m.torchvision_names()) {
            Some(names) => result.params.clone().renamed(|n| names.torch_name(n))?,
            None => result.params.clone(),
        },
    )
}

/// The weights of `path` (`model.init_from`: a PyTorch `state_dict` as safetensors, or npz)
/// in `spec`'s layout, finite; torchvision's names are read where the network has them.
fn initial_weights(
    path: &Path,
    spec: &ModelSpec,
    names: Option<&TorchvisionNames>,
) -> Result<Params> {
    let what = || format!("model.init_from = {}", path.display());
    let loaded = fedfuse_core::load_params(path).with_context(what)?;
    let params = in_list_order(loaded, spec, names).with_context(what)?;
    params.check_values().with_context(what)?;
    Ok(params)
}

/// A model's tensors under `spec`'s names and in its order, matched by name: from the list's
/// names or from `names` (torchvision's, for its networks; a tensor already under the list's
/// name keeps it), every shape checked.
fn in_list_order(
    params: Params,
    spec: &ModelSpec,
    names: Option<&TorchvisionNames>,
) -> fedfuse_core::Result<Params> {
    let params = WireNames::of(spec, names).to_inside(params)?;
    params.arranged(&spec.param_shapes())
}

/// Loads the data of `cfg`, splits it among clients and runs the federation.
pub fn federate(cfg: &Config, observer: &dyn Observer) -> Result<RunResult> {
    Ok(federate_with(cfg, observer, None, None)?.0)
}

/// [`federate`], stopped after the round during which `stop` is set (an error then).
pub fn federate_until(
    cfg: &Config,
    observer: &dyn Observer,
    stop: &AtomicBool,
) -> Result<RunResult> {
    Ok(federate_with(cfg, observer, None, Some(stop))?.0)
}

/// [`federate`], writing a checkpoint to `saved.0` after every round and, with `saved.1`,
/// starting from the one there.
fn federate_with(
    cfg: &Config,
    observer: &dyn Observer,
    saved: Option<(&Path, bool)>,
    stop: Option<&AtomicBool>,
) -> Result<(RunResult, Option<ModelSpec>)> {
    let mut fed = Federation::prepare(cfg)?;
    observer.note(&fed.run_summary());
    let mut session = Session::default();
    let mut init = std::mem::take(&mut fed.init);
    let savable = fed.method.save_state().is_some();
    let checkpointer = saved
        .filter(|_| savable)
        .map(|(path, _)| checkpoint::Checkpointer::new(path));
    let after_round = |global: &Params, rounds: &[RoundMetrics], method: &dyn Method| {
        if let Some(c) = &checkpointer {
            c.write(cfg, global, rounds, method)
                .map_err(fedfuse_fed::BoxError::from)?;
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            let left = match saved {
                Some((path, _)) if savable => {
                    format!("its checkpoint {} resumes it", path.display())
                }
                _ => "no checkpoint was kept".into(),
            };
            return Err(format!("stopped after round {}: {left}", rounds.len()).into());
        }
        Ok(())
    };
    if stop.is_some() || checkpointer.is_some() {
        session.after_round = Some(&after_round);
    }
    if let Some((path, true)) = saved {
        if !savable {
            bail!(
                "`{}` keeps server state that fedfuse cannot save yet, so its runs cannot \
                 resume; run without --resume",
                fed.method.name()
            );
        }
        match checkpoint::read(path, cfg)? {
            Some(c) => {
                check_resumed(cfg, &c, &init)
                    .with_context(|| format!("checkpoint {}", path.display()))?;
                observer.note(&format!(
                    "resuming from {} after round {}",
                    path.display(),
                    c.rounds.len()
                ));
                if let Some(w) = &checkpointer {
                    w.resume_after(&c);
                }
                fed.method
                    .load_state(c.state)
                    .with_context(|| format!("checkpoint {}", path.display()))?;
                init = c.global;
                session.done = c.rounds;
            }
            None => observer.note(&format!(
                "no checkpoint at {}: starting at round 1",
                path.display()
            )),
        }
    }
    let log = match &cfg.logging.tensorboard {
        Some(dir) => {
            let mut log = crate::tensorboard::EventLog::create(dir, &session.done)?;
            let text = toml::to_string(cfg).context("cannot write the resolved config")?;
            log.text(0, "config", &format!("```toml\n{text}```"))?;
            observer.note(&format!("TensorBoard events in {}", log.path().display()));
            Some(std::sync::Mutex::new(log))
        }
        None => None,
    };
    let progress = |p: Progress<'_>| {
        if let (Progress::RoundEnd(m), Some(log)) = (&p, &log) {
            // A figure TensorBoard misses is no reason to lose the run: say so, go on.
            let written = match log.lock() {
                Ok(mut log) => log.round(m).map_err(|e| e.to_string()),
                Err(_) => Err("an earlier write panicked".into()),
            };
            if let Err(e) = written {
                observer.note(&format!("TensorBoard: round {}: {e}", m.round));
            }
        }
        observer.progress(p);
    };
    observer.run_started(cfg.rounds);
    let result = simulate_session(
        fed.method.as_mut(),
        fed.data.population(),
        init,
        &fed.sim,
        &progress,
        session,
    );
    observer.run_finished();
    Ok((result?, fed.spec))
}

/// Whether a checkpoint's global model and history can continue a run of `cfg` from `init`
/// (the config's initial model): rounds 1..k once each, every value finite and every buffer
/// in its domain, and the initial model's layout unless the method changes widths.
fn check_resumed(cfg: &Config, c: &checkpoint::Checkpoint, init: &Params) -> Result<()> {
    if let Some((i, r)) = c.rounds.iter().enumerate().find(|(i, r)| r.round != i + 1) {
        bail!(
            "its history's entry {} is round {}; a history holds rounds 1, 2, ... once each",
            i + 1,
            r.round
        );
    }
    if c.rounds.is_empty() {
        bail!("its history holds no round; delete it to start over");
    }
    c.global.check_values().context("its global model")?;
    if init.is_empty() {
        return Ok(());
    }
    let misfit = "its global model does not fit the config's model; delete the checkpoint to \
                  start over";
    if !cfg.method.matching() {
        return c.global.check_layout(&init.layout()).context(misfit);
    }
    // Matching may widen layers and name them after the layer list: only the count of tensors
    // and their ranks are the config's.
    let fits = c.global.len() == init.len()
        && c.global
            .iter()
            .zip(init.iter())
            .all(|((_, a), (_, b))| a.shape.len() == b.shape.len());
    if !fits {
        let first = |p: &Params| {
            p.iter()
                .map(|(n, t)| format!("{n} {:?}", t.shape))
                .take(3)
                .collect::<Vec<_>>()
                .join(", ")
        };
        bail!(
            "{misfit} ({} tensors: {}, ...; the config's {} tensors: {}, ...)",
            c.global.len(),
            first(&c.global),
            init.len(),
            first(init)
        );
    }
    Ok(())
}

/// Everything a run of a federation starts from, built from its config the same way wherever
/// it runs: in the simulator, or split between a Flower strategy (method, test data, initial
/// model) and Flower nodes (method, their client's data).
pub struct Federation {
    /// The method, built and checked.
    pub method: Box<dyn Method>,
    /// The clients' data and the server's test data.
    pub data: FederationData,
    /// The initial global model (empty for FedNGM, which builds its own).
    pub init: Params,
    /// The classifier's architecture (none for tables).
    pub spec: Option<ModelSpec>,
    /// Rounds, sampling, seeds and local training.
    pub sim: SimConfig,
    /// The names its tensors carry over Flower: torchvision's for its ResNets.
    pub wire: WireNames,
    /// One line saying what runs, for the person running it, without the rounds (over Flower
    /// the ServerApp decides them, not the config a node reads): see [`Self::run_summary`].
    pub summary: String,
}

impl Federation {
    /// [`Self::summary`] with the config's rounds, for a run that follows them (the
    /// simulator, fedfuse's strategy).
    pub fn run_summary(&self) -> String {
        let upto = match self.data {
            FederationData::Labelled { .. } => "",
            FederationData::Tables { .. } => "up to ",
        };
        format!("{}, {upto}{} rounds", self.summary, self.sim.rounds)
    }

    /// Loads the data of `cfg`, splits it among clients and builds the method.
    pub fn prepare(cfg: &Config) -> Result<Self> {
        if let Some(table) = &cfg.table {
            return prepare_tables(cfg, table);
        }
        let (Some(dataset), Some(model)) = (&cfg.dataset, &cfg.model) else {
            bail!("the config has no [dataset] and [model] to federate");
        };
        let data = load_dataset(&dataset.name, cfg.data_dir.as_deref())
            .with_context(|| format!("dataset `{}`", dataset.name))?;
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let data = dataset.limit(data, &mut rng)?;
        let mut split = server_split(&data.train, cfg.validation_fraction(), &mut rng)?;
        // FEMNIST by writer keeps LEAF's own split of each writer's samples.
        let by_ids = cfg.partition.column().is_some() && data.test.ids.is_some();
        let mut clients = if by_ids {
            client_data_by_ids(
                &split.pool,
                &data.test,
                cfg.clients,
                &cfg.partition,
                &mut rng,
            )?
        } else {
            client_data(
                &split.pool,
                cfg.clients,
                &cfg.partition,
                dataset.local_test_fraction,
                &mut rng,
            )?
        };
        let mut test = data.test;
        if dataset.permuted_clients > 0 {
            let seed = crate::config::permutation_seed(cfg.seed);
            permute_clients(&mut clients, dataset.permuted_clients, seed)?;
            let both = |d: &Dataset| -> Result<Dataset> {
                let mut out = d.clone();
                out.extend(&permute_features(d, seed))?;
                Ok(out)
            };
            test = both(&test)?;
            split.validation = match &split.validation {
                Some(v) => Some(Arc::new(both(v)?)),
                None => None,
            };
        }

        let scored = match (dataset.score, &split.validation) {
            (Score::Validation, Some(v)) => Dataset::clone(v),
            _ => test,
        };
        let scored_len = scored.len();
        let spec = model.spec(&data.train.sample_shape, data.train.num_classes)?;
        cfg.train.check_memory(&spec)?;
        let trainer = Trainer::new(spec.clone())?;
        let init = match &model.init_from {
            Some(path) => initial_weights(path, &spec, model.torchvision_names().as_ref())?,
            None => init_params(&spec, model.init, derive_seed(cfg.seed, 0, usize::MAX)),
        };
        if let fedfuse_fed::MethodConfig::FedMa(fedma) = &cfg.method {
            fedma.check_run(
                cfg.clients_per_round,
                cfg.clients,
                cfg.rounds,
                crate::config::MAX_ROUNDS,
                &spec,
            )?;
        }
        let method = cfg.build_method(
            BuildContext {
                init: model.init,
                seed: cfg.seed,
                spec: Some(spec.clone()),
                validation: split.validation,
            },
            &init,
        )?;
        let sim = SimConfig {
            rounds: cfg.rounds,
            clients_per_round: cfg.clients_per_round,
            seed: cfg.seed,
            train: cfg.train.to_train_config(),
            local_eval: cfg.local_eval,
            bounds: cfg
                .replies
                .or_largest_client(clients.iter().map(|c| c.train.len())),
            sampling: cfg.sampling,
            eval_every: cfg.eval_every,
        };
        let summary = format!(
            "{} on {} ({} train / {} {} samples), {} clients, model {} params",
            method.name(),
            dataset.name,
            data.train.len(),
            scored_len,
            match dataset.score {
                Score::Test => "test",
                Score::Validation => "validation",
            },
            cfg.clients,
            spec.num_params()
        );
        Ok(Self {
            method,
            wire: WireNames::of(&spec, model.torchvision_names().as_ref()),
            spec: Some(spec),
            data: FederationData::Labelled {
                trainer,
                clients,
                test: scored,
            },
            init,
            sim,
            summary,
        })
    }
}

impl Federation {
    /// Client `id`'s reply, as Flower content, to an instruction in Flower content (which
    /// holds `server-round`): the method's client step with the simulator's seed for that
    /// client and round. A Flower ClientApp and fedfuse's Rust node both run this.
    pub fn client_fit(&self, id: usize, instruction: &FlowerContent) -> Result<FlowerContent> {
        let record = self.wire.incoming(instruction)?;
        let round = record
            .config
            .get(SERVER_ROUND)
            .and_then(ConfigValue::as_f64)
            .filter(|r| *r >= 1.0 && r.fract() == 0.0)
            .ok_or_else(|| {
                LabError::Invalid("the instruction has no `server-round` of 1 or more".into())
            })? as usize;
        let seed = derive_seed(self.sim.seed, round, id);
        let reply = self.data.population().client_reply(
            self.method.as_ref(),
            record,
            id,
            (&self.sim.train, seed),
            self.sim.local_eval,
        )?;
        Ok(self.wire.outgoing(reply)?)
    }

    /// `(loss, accuracy, examples)` of the model in `content` on client `id`'s own test split.
    /// A table (whose model is no classifier) or an empty split gives `(0, 0, 0)`: every
    /// node's evaluate reply then carries the same keys, as Flower's strategies require, and
    /// zero examples weigh nothing in their weighted means.
    pub fn client_evaluate(&self, id: usize, content: &FlowerContent) -> Result<(f64, f64, usize)> {
        let record = self.wire.incoming(content)?;
        let FederationData::Labelled {
            trainer, clients, ..
        } = &self.data
        else {
            return Ok((0.0, 0.0, 0));
        };
        let data = &clients[id].test;
        if data.is_empty() {
            return Ok((0.0, 0.0, 0));
        }
        // Under `model.local_norm` the client runs the model with its own norms.
        let own = self.method.client_model(id, &record.params)?;
        let e = trainer.evaluate(own.as_ref().unwrap_or(&record.params), data)?;
        Ok((e.loss, e.accuracy, data.len()))
    }
    /// Puts a node's own samples in client `id`'s place (a SuperNode's local data, which
    /// never leaves it): split into training and local test rows as the run's partitions
    /// are (`dataset.local_test_fraction`, a seed of its own). The samples must have the
    /// run's features (in its units) and labels below its classes; `source` names them in
    /// errors.
    pub fn use_own_data(
        &mut self,
        cfg: &Config,
        id: usize,
        data: Dataset,
        source: &str,
    ) -> Result<()> {
        let FederationData::Labelled { clients, test, .. } = &mut self.data else {
            bail!(
                "{source}: this run federates tables; a node's own samples replace a labelled partition"
            );
        };
        let Some(slot) = clients.get_mut(id) else {
            bail!("{source}: client {id} is not a slot of this run");
        };
        if data.dim() != test.dim() {
            bail!(
                "{source}: samples have {} features; this run's model reads {} (sample shape {:?})",
                data.dim(),
                test.dim(),
                test.sample_shape
            );
        }
        let classes = test.num_classes;
        let data = Dataset::new(data.x, data.y, test.sample_shape.clone(), classes)
            .with_context(|| format!("{source}: labels must be class ids below {classes}"))?;
        let fraction = cfg.dataset.as_ref().map_or(0.0, |d| d.local_test_fraction);
        let mut rng = StdRng::seed_from_u64(derive_seed(cfg.seed, 1, id));
        let all: Vec<usize> = (0..data.len()).collect();
        let mut split = client_splits(&data, &[all], fraction, &mut rng)
            .with_context(|| format!("{source}: splitting off its local test rows"))?;
        *slot = split.remove(0);
        Ok(())
    }

    /// `(loss, accuracy)` of the model in `content` on the run's global test set, as the
    /// server scores its own model each round (NaN for a table, whose model is no
    /// classifier); for a stock Flower strategy's central evaluation.
    pub fn server_evaluate(&self, content: &FlowerContent) -> Result<(f64, f64)> {
        let record = self.wire.incoming(content)?;
        let FederationData::Labelled { trainer, test, .. } = &self.data else {
            return Ok((f64::NAN, f64::NAN));
        };
        let e = trainer.evaluate(&record.params, test)?;
        Ok((e.loss, e.accuracy))
    }

    /// `(loss, accuracy, samples)` of a model on the set the server scores on (the test set,
    /// or the validation split with `dataset.score = "validation"`), its tensors matched to
    /// the model by name, in any order (a `state_dict`, or a file that sorts its names), under
    /// the list's names or `names` (torchvision's, for its networks); every shape checked.
    pub fn score(
        &self,
        params: Params,
        names: Option<&TorchvisionNames>,
    ) -> Result<(f64, f64, usize)> {
        let (FederationData::Labelled { trainer, test, .. }, Some(spec)) = (&self.data, &self.spec)
        else {
            bail!("a tabular run's model is no classifier to score");
        };
        let params = in_list_order(params, spec, names)?;
        params.check_values()?;
        let e = trainer.evaluate(&params, test)?;
        Ok((e.loss, e.accuracy, test.len()))
    }
}

/// The clients' data of a run and what its server evaluates on.
// One per run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum FederationData {
    /// Labelled samples and a classifier.
    Labelled {
        /// Builds, trains and evaluates the model.
        trainer: Trainer,
        /// Every client's data, by client slot.
        clients: Vec<ClientData>,
        /// The global test set.
        test: Dataset,
    },
    /// Tables (FedNGM).
    Tables {
        /// Every client's rows, by client slot.
        clients: Vec<Table>,
        /// All clients' held-out rows.
        test: Table,
    },
}

impl FederationData {
    /// The whole population, as the simulator and a node see it.
    pub fn population(&self) -> Population<'_> {
        match self {
            Self::Labelled {
                trainer,
                clients,
                test,
            } => Population::Labelled {
                trainer,
                clients,
                test,
            },
            Self::Tables { clients, test } => Population::Tables {
                clients,
                test: Some(test),
            },
        }
    }

    /// What a server that holds no client data sees: the test data alone.
    pub fn server_view(&self) -> Population<'_> {
        match self.population() {
            Population::Labelled { trainer, test, .. } => Population::Labelled {
                trainer,
                clients: &[],
                test,
            },
            Population::Tables { test, .. } => Population::Tables { clients: &[], test },
        }
    }

    /// Client slots.
    pub fn num_clients(&self) -> usize {
        self.population().len()
    }

    /// Client `id`'s training examples (rows, for a table).
    pub fn num_examples(&self, id: usize) -> usize {
        match self {
            Self::Labelled { clients, .. } => clients[id].train.len(),
            Self::Tables { clients, .. } => clients[id].n_rows(),
        }
    }

    /// Client `id`'s local test rows (none for a table).
    pub fn local_test_len(&self, id: usize) -> usize {
        match self {
            Self::Labelled { clients, .. } => clients[id].test.len(),
            Self::Tables { .. } => 0,
        }
    }
}

/// The clients' tables of `table`, drawn or read for the run `cfg`.
pub fn client_tables(cfg: &Config, table: &TableSection) -> Result<ClientTables> {
    match table {
        TableSection::Synthetic(spec) => Ok(ggm_tables(spec, cfg.clients, cfg.seed)?.0),
        TableSection::Cdc {
            split,
            drop,
            test_every,
        } => {
            let dir = cfg.data_dir.clone().unwrap_or_else(cache_dir);
            let opts = CdcOptions::new(cdc_split(split).context("[table]")?);
            cdc_tables(&dir, &opts, drop, *test_every)
        }
    }
}

/// A tabular federation (FedNGM) over the clients' tables of `table`; after each round the
/// method scores its global model on all the held-out rows.
fn prepare_tables(cfg: &Config, table: &TableSection) -> Result<Federation> {
    let tables = client_tables(cfg, table)?;
    let test = Table::concat(&tables.test)?;
    let method = cfg.method.build_with(BuildContext {
        seed: cfg.seed,
        ..BuildContext::default()
    })?;
    let sim = SimConfig {
        rounds: cfg.rounds,
        clients_per_round: cfg.clients_per_round,
        seed: cfg.seed,
        local_eval: false,
        bounds: cfg
            .replies
            .or_largest_client(tables.train.iter().map(Table::n_rows)),
        sampling: cfg.sampling,
        eval_every: cfg.eval_every,
        ..SimConfig::default()
    };
    let rows: usize = tables.train.iter().map(Table::n_rows).sum();
    let summary = format!(
        "{} on {} tables ({rows} rows, {} held out), {} clients",
        method.name(),
        match table {
            TableSection::Synthetic(_) => "synthetic",
            TableSection::Cdc { .. } => "CDC",
        },
        test.n_rows(),
        tables.train.len(),
    );
    Ok(Federation {
        wire: WireNames::default(),
        method,
        data: FederationData::Tables {
            clients: tables.train,
            test,
        },
        init: Params::new(),
        spec: None,
        sim,
        summary,
    })
}
