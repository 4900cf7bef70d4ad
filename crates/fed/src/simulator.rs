//! The round loop, once: sample clients, instruct, fit in parallel, check, aggregate, evaluate.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::time::Instant;

use fedfuse_core::{ModelSpec, Params, Record};
use fedfuse_data::{ClientData, Dataset, Table};
use fedfuse_train::{TrainConfig, Trainer};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::method::{LOCAL_ACCURACY, TableContext};
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

/// Replies in flight per worker thread when a method folds replies as they arrive.
const FOLD_CHUNK_PER_THREAD: usize = 16;

/// How many clients take part in a round.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClientsPerRound {
    /// Exactly this many (at most all).
    Count(usize),
    /// This fraction of all clients, at least one (Flower's `fraction_train`).
    Fraction(f64),
}

/// How a round's clients are drawn (`sampling` in a run config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sampling {
    /// Exactly `clients_per_round` of them, uniformly without replacement (as Flower's
    /// strategies sample).
    #[default]
    Fixed,
    /// Each client on its own with probability `clients_per_round` (a count `c` of `n`
    /// clients: `c / n`), so a round's size varies and may be zero. This is the sampling
    /// differential privacy's accountant amplifies by.
    Poisson,
}

/// Bounds a reply must keep to be aggregated (`[replies]` in a run config); none by default.
/// A reply outside them is listed with the reason in the round's rejections, as a malformed
/// one is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyBounds {
    /// Most examples a reply may claim: its FedAvg weight, which a client could otherwise
    /// inflate at will.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_examples: Option<u64>,
    /// Longest update a reply may carry: the L2 norm of reply minus global model over all
    /// tensors (methods whose replies are models of the global model's layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_update_norm: Option<f64>,
}

impl ReplyBounds {
    /// Whether no bound is set.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the bounds' own ranges.
    pub fn check(&self) -> Result<()> {
        if self.max_examples == Some(0) {
            return Err(FedError::InvalidSetting {
                field: "replies.max_examples",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(n) = self.max_update_norm
            && !(n.is_finite() && n > 0.0)
        {
            return Err(FedError::InvalidSetting {
                field: "replies.max_update_norm",
                reason: format!("{n} must be a positive number"),
            });
        }
        Ok(())
    }

    /// These bounds with `max_examples`, when unset, at the largest client's example count
    /// (`sizes`, one per client): no honest client of the run holds more, and without a bound
    /// one reply claiming 2^63 examples would take the whole of any example-weighted mean.
    pub fn or_largest_client(self, sizes: impl IntoIterator<Item = usize>) -> Self {
        let largest = sizes.into_iter().max().map(|n| (n as u64).max(1));
        Self {
            max_examples: self.max_examples.or(largest),
            ..self
        }
    }

    /// Why `reply` breaks a bound, if it does.
    fn violation(&self, global: &Params, reply: &Record) -> Option<String> {
        if let Some(max) = self.max_examples
            && reply.num_examples > max
        {
            return Some(format!(
                "it claims {} examples, more than max_examples = {max} (by default the run's \
                 largest client; set `replies.max_examples` for nodes holding more)",
                reply.num_examples
            ));
        }
        let max = self.max_update_norm?;
        match fedfuse_fuse::dp::update_norm(global, &reply.params) {
            Ok(norm) if norm <= max => None,
            Ok(norm) => Some(format!(
                "its update has L2 norm {norm:.4e}, more than max_update_norm = {max}"
            )),
            Err(e) => Some(format!("its update cannot be measured: {e}")),
        }
    }
}

/// Simulation settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Communication rounds.
    pub rounds: usize,
    /// Clients per round.
    pub clients_per_round: ClientsPerRound,
    /// Seed of every random choice (client sampling, batches).
    pub seed: u64,
    /// Local training.
    pub train: TrainConfig,
    /// Evaluate the global model on every client's local test split each round.
    pub local_eval: bool,
    /// Bounds on replies.
    pub bounds: ReplyBounds,
    /// How each round's clients are drawn.
    pub sampling: Sampling,
    /// Evaluate the global model (test set, clients' splits, the method's own scores) after
    /// every `eval_every`-th round and after the last; the rounds between report NaN there.
    /// Long runs spend most of a round evaluating otherwise. The clients' accuracies of their
    /// own uploads are measured every round.
    pub eval_every: NonZeroUsize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            rounds: 5,
            clients_per_round: ClientsPerRound::Fraction(1.0),
            seed: 0,
            train: TrainConfig::default(),
            local_eval: true,
            bounds: ReplyBounds::default(),
            sampling: Sampling::Fixed,
            eval_every: NonZeroUsize::MIN,
        }
    }
}

impl SimConfig {
    /// Whether the global model is evaluated after `round` (1-based).
    pub fn evaluates_after(&self, round: usize) -> bool {
        round.is_multiple_of(self.eval_every.get()) || round >= self.rounds
    }

    /// Clients sampled per round out of `n`, checking the setting.
    pub fn sample_size(&self, n: usize) -> Result<usize> {
        let bad = |reason: String| FedError::InvalidSetting {
            field: "clients_per_round",
            reason,
        };
        match self.clients_per_round {
            ClientsPerRound::Count(0) => Err(bad("must be at least 1".into())),
            ClientsPerRound::Count(c) => Ok(c.min(n)),
            ClientsPerRound::Fraction(f) if f > 0.0 && f <= 1.0 => {
                Ok(((f * n as f64).floor() as usize).clamp(1, n))
            }
            ClientsPerRound::Fraction(f) => Err(bad(format!(
                "{f} is neither a count (integer) nor a fraction in (0, 1]"
            ))),
        }
    }

    /// The chance that a given client of `n` takes part in a round under Poisson sampling:
    /// the fraction, or a count over `n`.
    pub fn sampling_rate(&self, n: usize) -> Result<f64> {
        let k = self.sample_size(n)?;
        Ok(match self.clients_per_round {
            ClientsPerRound::Fraction(f) => f,
            ClientsPerRound::Count(_) => k as f64 / n.max(1) as f64,
        })
    }
}

/// A reply left out of the aggregate, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// Client id.
    pub client: usize,
    /// What was wrong.
    pub reason: String,
}

/// What one round measured.
///
/// In a tabular federation ([`simulate_tables`]) the global model is no classifier: the
/// accuracies and `global_loss` are NaN and the method's own scores are in `method`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundMetrics {
    /// Round, from 1.
    pub round: usize,
    /// Accuracy of the global model on the global test set (NaN for tabular methods).
    pub global_accuracy: f64,
    /// Mean cross-entropy of the global model on the global test set (NaN for tabular
    /// methods).
    pub global_loss: f64,
    /// Mean over clients of the global model's accuracy on each client's own test split
    /// (NaN when local evaluation is off, and for tabular methods).
    pub local_accuracy_mean: f64,
    /// Mean over accepted replies of each client's uploaded model on its own test split (the
    /// FedSparse paper's "local accuracy"; NaN when local evaluation is off, and for tabular
    /// methods).
    #[serde(default = "nan")]
    pub client_accuracy_mean: f64,
    /// Mean over every client that has had an upload accepted of its last one's accuracy on
    /// its own test split: the FedSparse paper's "local accuracy" ("the model configuration
    /// that the shard last communicated"), over all shards, not only this round's. NaN until
    /// some client measured one, and in records written before it was kept.
    #[serde(default = "nan")]
    pub client_accuracy_last_mean: f64,
    /// This round's accepted uploads' accuracies on their own test split, by client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_accuracies: Vec<(usize, f64)>,
    /// Mean training loss reported by the accepted clients, weighted by examples.
    pub train_loss: f64,
    /// Bytes of encoded replies (client to server).
    pub bytes_up: u64,
    /// Bytes of encoded instructions (server to client).
    pub bytes_down: u64,
    /// Parameters in the global model after the round.
    pub global_params: usize,
    /// Clients sampled.
    pub clients: usize,
    /// Replies left out of the aggregate.
    pub rejected: Vec<Rejection>,
    /// Method-specific figures ([`Method::round_metrics`]), and its evaluation
    /// ([`Method::evaluate`], [`Method::evaluate_table`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub method: BTreeMap<String, f64>,
    /// Wall time of the round in seconds.
    pub seconds: f64,
}

fn nan() -> f64 {
    f64::NAN
}

/// Each client's accuracy of its last accepted upload, kept across rounds for
/// [`RoundMetrics::client_accuracy_last_mean`]; rebuilt from the rounds on resume.
#[derive(Clone, Debug, Default)]
pub struct LastUploads {
    accuracy: BTreeMap<usize, f64>,
}

impl LastUploads {
    /// The table after `rounds`.
    pub fn replay(rounds: &[RoundMetrics]) -> Self {
        let mut last = Self::default();
        for r in rounds {
            last.note(r);
        }
        last
    }

    fn note(&mut self, round: &RoundMetrics) {
        self.accuracy
            .extend(round.client_accuracies.iter().copied());
    }

    /// Takes in `round`'s uploads and sets its `client_accuracy_last_mean`.
    pub fn update(&mut self, round: &mut RoundMetrics) {
        self.note(round);
        round.client_accuracy_last_mean = if self.accuracy.is_empty() {
            f64::NAN
        } else {
            self.accuracy.values().sum::<f64>() / self.accuracy.len() as f64
        };
    }
}

/// A finished simulation.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Per-round metrics.
    pub rounds: Vec<RoundMetrics>,
    /// The final global model.
    pub params: Params,
}

/// Progress events, for a progress bar.
#[derive(Debug)]
pub enum Progress<'a> {
    /// A round starts with this many clients.
    RoundStart {
        /// Round, from 1.
        round: usize,
        /// Clients sampled.
        clients: usize,
    },
    /// One client of the round finished.
    ClientDone {
        /// Round, from 1.
        round: usize,
    },
    /// A round ended.
    RoundEnd(&'a RoundMetrics),
}

/// The messages of one client in one round, as encoded bytes.
struct Exchange {
    /// Length of the instruction sent (counted even when the client then fails).
    down: usize,
    /// The encoded reply, or why there is none.
    up: Result<Vec<u8>>,
}

/// A global model's `(accuracy, loss, mean local accuracy)`, NaN where not measured.
pub type Scores = (f64, f64, f64);

/// The clients' data, and what the server evaluates the global model on. A Flower server
/// holds the second half only: its population has no clients.
#[derive(Clone, Copy)]
pub enum Population<'a> {
    /// Labelled samples: the global model is a classifier that `trainer` evaluates on `test`.
    Labelled {
        /// Builds, trains and evaluates the classifier.
        trainer: &'a Trainer,
        /// Every client's data, by client slot.
        clients: &'a [ClientData],
        /// The global test set.
        test: &'a Dataset,
    },
    /// Tables: the method scores its own global model on `test`, if any.
    Tables {
        /// Every client's rows, by client slot.
        clients: &'a [Table],
        /// The held-out rows.
        test: Option<&'a Table>,
    },
}

impl Population<'_> {
    /// Client slots.
    pub fn len(&self) -> usize {
        match self {
            Population::Labelled { clients, .. } => clients.len(),
            Population::Tables { clients, .. } => clients.len(),
        }
    }

    /// Whether there are no clients (the server's view on Flower).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Client `id`'s reply to `instruction`: [`client_step`] on labelled data, the method's
    /// tabular procedure on a table. The simulator and a node on Flower both run this.
    pub fn client_reply(
        &self,
        method: &dyn Method,
        instruction: Record,
        id: usize,
        (train, seed): (&TrainConfig, u64),
        local_eval: bool,
    ) -> Result<Record> {
        match *self {
            Population::Labelled {
                trainer, clients, ..
            } => {
                let ctx = ClientContext {
                    id,
                    data: &clients[id],
                    trainer,
                    train,
                    seed,
                };
                client_step(method, instruction, &ctx, local_eval)
            }
            Population::Tables { clients, .. } => {
                let ctx = TableContext {
                    id,
                    table: &clients[id],
                    seed,
                };
                method.fit_table(instruction, &ctx)
            }
        }
    }

    /// The global model's scores after a round: `(global accuracy, global loss, mean local
    /// accuracy)`, NaN where not measured (a table's model is no classifier; the local mean
    /// needs `local_eval` and the clients' data), and the method's own figures.
    pub fn evaluate(
        &self,
        method: &dyn Method,
        global: &Params,
        local_eval: bool,
    ) -> Result<(Scores, BTreeMap<String, f64>)> {
        let mut scores = method.round_metrics();
        let figures = match *self {
            Population::Labelled {
                trainer,
                clients,
                test,
            } => {
                let (eval, local, extra) =
                    evaluate_classifier(method, trainer, clients, test, global, local_eval)?;
                scores.extend(extra);
                (eval.accuracy, eval.loss, local)
            }
            Population::Tables { test, .. } => {
                if let Some(test) = test {
                    scores.extend(method.evaluate_table(global, test)?);
                }
                (f64::NAN, f64::NAN, f64::NAN)
            }
        };
        Ok((figures, scores))
    }
}

/// One client's task: receive, fit, reply.
fn client_task(
    method: &dyn Method,
    round: usize,
    id: usize,
    global: &Params,
    ctx: (Population<'_>, &TrainConfig, u64),
    local_eval: bool,
) -> Exchange {
    let down = match method
        .instruct(round, id, global)
        .and_then(|r| Ok(r.encode()?))
    {
        Ok(bytes) => bytes,
        Err(e) => {
            return Exchange {
                down: 0,
                up: Err(e),
            };
        }
    };
    let (population, train, seed) = ctx;
    let up = Record::decode(&down)
        .map_err(FedError::from)
        .and_then(|received| {
            population.client_reply(method, received, id, (train, seed), local_eval)
        })
        .and_then(|reply| Ok(reply.encode()?));
    Exchange {
        down: down.len(),
        up,
    }
}

/// A client's whole step on an instruction: the method's local procedure, plus, when
/// `local_eval` is on, the accuracy of its upload on its own test split (unless the method
/// reported one). The simulator and a client on Flower both run exactly this.
pub fn client_step(
    method: &dyn Method,
    instruction: Record,
    ctx: &ClientContext<'_>,
    local_eval: bool,
) -> Result<Record> {
    let mut reply = method.fit(instruction, ctx)?;
    if local_eval
        && !reply.metrics.contains_key(LOCAL_ACCURACY)
        && let Some(acc) = own_accuracy(&reply.params, ctx.data, ctx.trainer)
    {
        reply.metrics.insert(LOCAL_ACCURACY.into(), acc);
    }
    Ok(reply)
}

/// The accuracy of a client's uploaded model on its own test split, as the client would
/// measure it (the model's own architecture if it differs from the trainer's); `None` when
/// there is no test split or the upload is not a model the trainer can run.
fn own_accuracy(params: &Params, data: &ClientData, trainer: &Trainer) -> Option<f64> {
    if data.test.is_empty() {
        return None;
    }
    if params.check_layout(&trainer.spec().param_shapes()).is_ok() {
        return trainer
            .evaluate(params, &data.test)
            .ok()
            .map(|e| e.accuracy);
    }
    let own = Trainer::new(ModelSpec::infer_mlp(params).ok()?).ok()?;
    own.evaluate(params, &data.test).ok().map(|e| e.accuracy)
}

/// Runs `cfg.rounds` rounds of `method` over `clients` from the global model `init`.
///
/// A client whose procedure fails, or whose reply is malformed (wrong layout, NaN/Inf), is
/// left out of that round's aggregate and listed in [`RoundMetrics::rejected`]; the round goes
/// on. When no reply is usable the global model is kept.
pub fn simulate(
    method: &mut dyn Method,
    trainer: &Trainer,
    clients: &[ClientData],
    test: &Dataset,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<RunResult> {
    cfg.train.check()?;
    if method.tabular() {
        return Err(FedError::InvalidSetting {
            field: "method",
            reason: format!(
                "`{}` federates tables, not labelled samples; run it on a tabular dataset",
                method.name()
            ),
        });
    }
    let population = Population::Labelled {
        trainer,
        clients,
        test,
    };
    run_rounds(method, population, init, cfg, progress, Session::default())
}

/// [`simulate`] from where `session` says, calling its checkpoint callback after each round.
pub fn simulate_session(
    method: &mut dyn Method,
    (trainer, clients, test): (&Trainer, &[ClientData], &Dataset),
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    session: Session<'_>,
) -> Result<RunResult> {
    cfg.train.check()?;
    if method.tabular() {
        return simulate(method, trainer, clients, test, init, cfg, progress);
    }
    let population = Population::Labelled {
        trainer,
        clients,
        test,
    };
    run_rounds(method, population, init, cfg, progress, session)
}

/// Runs up to `cfg.rounds` rounds of the tabular `method` ([`Method::tabular`], e.g. FedNGM)
/// over clients holding `clients`, from the global model `init` (FedNGM's is empty: it builds
/// its own). After each round the method scores its global model on `test`, if given
/// ([`Method::evaluate_table`]). `cfg.train` and `cfg.local_eval` do not apply; rejections,
/// traffic and seeds are as in [`simulate`].
pub fn simulate_tables(
    method: &mut dyn Method,
    clients: &[Table],
    test: Option<&Table>,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<RunResult> {
    if !method.tabular() {
        return Err(FedError::InvalidSetting {
            field: "method",
            reason: format!(
                "`{}` trains classifiers on labelled samples; it cannot run on tables",
                method.name()
            ),
        });
    }
    simulate_tables_session(
        method,
        clients,
        test,
        init,
        cfg,
        progress,
        Session::default(),
    )
}

/// [`simulate_tables`] from where `session` says, calling its checkpoint callback after each
/// round.
pub fn simulate_tables_session(
    method: &mut dyn Method,
    clients: &[Table],
    test: Option<&Table>,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    session: Session<'_>,
) -> Result<RunResult> {
    if !method.tabular() {
        return simulate_tables(method, clients, test, init, cfg, progress);
    }
    run_rounds(
        method,
        Population::Tables { clients, test },
        init,
        cfg,
        progress,
        session,
    )
}

/// What a checkpoint callback gets after a round: the global model, every round so far, and
/// the method (for [`Method::save_state`]).
pub type AfterRound<'a> =
    &'a (dyn Fn(&Params, &[RoundMetrics], &dyn Method) -> std::result::Result<(), String> + Sync);

/// Where a run starts and what happens after each round: a fresh run by default.
#[derive(Default)]
pub struct Session<'a> {
    /// The rounds an interrupted run of the same config finished, whose global model is the
    /// one passed in and whose state the method has restored ([`Method::load_state`]); they
    /// lead the result, and the run goes on with the next round.
    pub done: Vec<RoundMetrics>,
    /// Called after each round, e.g. to write a checkpoint; an error ends the run.
    pub after_round: Option<AfterRound<'a>>,
}

/// Which clients take part in each round, drawn with the run's seed as `cfg.sampling` says,
/// in increasing order. The simulator and the Flower strategy draw the same sequence.
pub struct Sampler {
    rng: StdRng,
    n: usize,
    draw: Draw,
}

enum Draw {
    Fixed(usize),
    Poisson(f64),
}

impl Sampler {
    /// The sampler of a run of `cfg` over `n` clients.
    pub fn new(cfg: &SimConfig, n: usize) -> Result<Self> {
        let draw = match cfg.sampling {
            Sampling::Fixed => Draw::Fixed(cfg.sample_size(n)?),
            Sampling::Poisson => Draw::Poisson(cfg.sampling_rate(n)?),
        };
        Ok(Self {
            rng: StdRng::seed_from_u64(cfg.seed),
            n,
            draw,
        })
    }

    /// The next round's clients, in increasing order.
    pub fn next_round(&mut self) -> Vec<usize> {
        match self.draw {
            Draw::Fixed(k) => {
                let mut sampled = rand::seq::index::sample(&mut self.rng, self.n, k).into_vec();
                sampled.sort_unstable();
                sampled
            }
            Draw::Poisson(q) => (0..self.n)
                .filter(|_| self.rng.random::<f64>() < q)
                .collect(),
        }
    }
}

/// The round loop shared by [`simulate`] and [`simulate_tables`].
fn run_rounds(
    method: &mut dyn Method,
    population: Population<'_>,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    session: Session<'_>,
) -> Result<RunResult> {
    let n_clients = population.len();
    if n_clients == 0 {
        return Err(FedError::InvalidSetting {
            field: "clients",
            reason: "no clients to federate".into(),
        });
    }
    let mut sampler = Sampler::new(cfg, n_clients)?;
    let mut global = init;
    let mut rounds = session.done;
    // The rounds done drew their clients: draw them again so the next round's are the same.
    for _ in &rounds {
        sampler.next_round();
    }
    let mut last_uploads = LastUploads::replay(&rounds);
    let first = rounds.len() + 1;
    for round in first..=cfg.rounds {
        let started = Instant::now();
        let sampled = sampler.next_round();
        progress(Progress::RoundStart {
            round,
            clients: sampled.len(),
        });

        // Methods with a streaming server step fold replies chunk by chunk, in sampled order
        // (so results do not depend on thread count); the others get all replies at once.
        let mut state = RoundState::new(method, round, sampled.len()).bounded(cfg.bounds);
        let chunk = if state.folds() {
            FOLD_CHUNK_PER_THREAD * rayon::current_num_threads()
        } else {
            sampled.len()
        };
        for ids in sampled.chunks(chunk.max(1)) {
            let shared: &dyn Method = method;
            let outcomes: Vec<(usize, Exchange)> = ids
                .par_iter()
                .map(|&id| {
                    let seed = derive_seed(cfg.seed, round, id);
                    let out = client_task(
                        shared,
                        round,
                        id,
                        &global,
                        (population, &cfg.train, seed),
                        cfg.local_eval,
                    );
                    progress(Progress::ClientDone { round });
                    (id, out)
                })
                .collect();
            for (client, ex) in outcomes {
                state.count_down(ex.down);
                let reply = ex.up.and_then(|up| {
                    let record = Record::decode(&up)?;
                    Ok((record, up.len()))
                });
                state.offer(method, &global, client, reply)?;
            }
        }
        let tally = state.finish(method, &mut global)?;
        let (figures, method_metrics) = if cfg.evaluates_after(round) || method.finished() {
            population.evaluate(method, &global, cfg.local_eval)?
        } else {
            ((f64::NAN, f64::NAN, f64::NAN), method.round_metrics())
        };
        let mut metrics = tally.metrics(&global, figures, method_metrics, started);
        last_uploads.update(&mut metrics);
        progress(Progress::RoundEnd(&metrics));
        rounds.push(metrics);
        if let Some(after) = session.after_round {
            after(&global, &rounds, method).map_err(|reason| FedError::Checkpoint { reason })?;
        }
        if method.finished() {
            break;
        }
    }
    Ok(RunResult {
        rounds,
        params: global,
    })
}

/// The server's side of one round: each reply checked, folded in the order offered (the
/// simulator and the Flower strategy both offer in client-slot order), traffic and the
/// clients' figures tallied. The simulator and `fedfuse.flwr.Strategy` both run exactly this.
pub struct RoundState {
    round: usize,
    bounds: ReplyBounds,
    clients: usize,
    fold: Option<Box<dyn crate::Fold>>,
    replies: Vec<Reply>,
    bytes_up: u64,
    bytes_down: u64,
    loss_sum: f64,
    examples: f64,
    accepted: usize,
    own: Vec<(usize, f64)>,
    rejected: Vec<Rejection>,
}

/// What is wrong with a reply's metrics, checked as its parameters are: every value finite,
/// and the figures the round reports in their range (a client claiming an accuracy of 5 or a
/// negative loss would otherwise move the round's means at will).
fn metrics_violation(record: &Record) -> Option<String> {
    for (key, &value) in &record.metrics {
        let range = match key.as_str() {
            LOCAL_ACCURACY => Some((0.0, 1.0)),
            "train_loss" => Some((0.0, f64::INFINITY)),
            _ => None,
        };
        if !value.is_finite() {
            return Some(format!("metric `{key}` is {value}, not a finite number"));
        }
        if let Some((lo, hi)) = range
            && !(lo..=hi).contains(&value)
        {
            return Some(format!(
                "metric `{key}` = {value} lies outside [{lo}, {hi}]"
            ));
        }
    }
    None
}

impl RoundState {
    /// Round `round` with `clients` sampled clients.
    pub fn new(method: &dyn Method, round: usize, clients: usize) -> Self {
        Self {
            round,
            bounds: ReplyBounds::default(),
            clients,
            fold: method.fold(),
            replies: Vec::new(),
            bytes_up: 0,
            bytes_down: 0,
            loss_sum: 0.0,
            examples: 0.0,
            accepted: 0,
            own: Vec::new(),
            rejected: Vec::new(),
        }
    }

    /// The round with `bounds` on its replies.
    pub fn bounded(mut self, bounds: ReplyBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Whether the method folds replies as they come (so callers may offer them in chunks).
    pub fn folds(&self) -> bool {
        self.fold.is_some()
    }

    /// Counts an instruction of `bytes` sent to a client.
    pub fn count_down(&mut self, bytes: usize) {
        self.bytes_down += bytes as u64;
    }

    /// A client's decoded reply and its size on the wire, or why there is none. A failed or
    /// malformed reply is listed in the round's rejections; only the method's own fold can
    /// fail the round.
    pub fn offer(
        &mut self,
        method: &dyn Method,
        global: &Params,
        client: usize,
        reply: Result<(Record, usize)>,
    ) -> Result<()> {
        let checked = reply.and_then(|(record, bytes)| {
            self.bytes_up += bytes as u64;
            method.check_reply(global, &record)?;
            let weightless = (record.num_examples == 0 && method.weighs_by_examples())
                .then(|| "it claims 0 examples, so it has no weight in the aggregate".to_string());
            match weightless
                .or_else(|| self.bounds.violation(global, &record))
                .or_else(|| metrics_violation(&record))
            {
                Some(reason) => Err(FedError::BadReply { client, reason }),
                None => Ok(record),
            }
        });
        let record = match checked {
            Ok(record) => record,
            Err(e) => {
                self.reject(client, e.to_string());
                return Ok(());
            }
        };
        if let Some(&acc) = record.metrics.get(LOCAL_ACCURACY) {
            self.own.push((client, acc));
        }
        let n = record.num_examples as f64;
        if let Some(loss) = record.metrics.get("train_loss") {
            self.loss_sum += loss * n;
            self.examples += n;
        }
        self.accepted += 1;
        let reply = Reply { client, record };
        match self.fold.as_mut() {
            Some(f) => f.add(reply),
            None => {
                self.replies.push(reply);
                Ok(())
            }
        }
    }

    /// Lists `client` as sampled but without a usable reply.
    pub fn reject(&mut self, client: usize, reason: String) {
        self.rejected.push(Rejection { client, reason });
    }

    /// Aggregates the accepted replies into `global` (with none, what
    /// [`Method::aggregate_no_replies`] says: kept, for most methods).
    pub fn finish(self, method: &mut dyn Method, global: &mut Params) -> Result<RoundTally> {
        let next = match self.fold {
            Some(f) if self.accepted > 0 => f.finish(self.round, global)?,
            None if self.accepted > 0 => method.aggregate(self.round, global, &self.replies)?,
            _ => method.aggregate_no_replies(self.round, global)?,
        };
        if let Aggregate::Replace(next) = next {
            *global = next;
        }
        Ok(RoundTally {
            round: self.round,
            clients: self.clients,
            train_loss: self.loss_sum / self.examples.max(1.0),
            client_accuracy_mean: if self.own.is_empty() {
                f64::NAN
            } else {
                self.own.iter().map(|o| o.1).sum::<f64>() / self.own.len() as f64
            },
            client_accuracies: self.own,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            rejected: self.rejected,
        })
    }
}

/// What a finished round measured before the global model is evaluated.
#[derive(Clone, Debug)]
pub struct RoundTally {
    round: usize,
    clients: usize,
    train_loss: f64,
    client_accuracy_mean: f64,
    client_accuracies: Vec<(usize, f64)>,
    bytes_up: u64,
    bytes_down: u64,
    rejected: Vec<Rejection>,
}

impl RoundTally {
    /// The round's metrics, given the evaluation of `global` (accuracy, loss and local mean,
    /// NaN where not measured) and the method's own figures.
    pub fn metrics(
        self,
        global: &Params,
        (global_accuracy, global_loss, local_accuracy_mean): (f64, f64, f64),
        method: BTreeMap<String, f64>,
        started: Instant,
    ) -> RoundMetrics {
        RoundMetrics {
            round: self.round,
            global_accuracy,
            global_loss,
            local_accuracy_mean,
            client_accuracy_mean: self.client_accuracy_mean,
            client_accuracy_last_mean: f64::NAN,
            client_accuracies: self.client_accuracies,
            train_loss: self.train_loss,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            global_params: global.num_values(),
            clients: self.clients,
            rejected: self.rejected,
            method,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// The classifier's evaluation after a round: on the global test set, the mean over clients'
/// own test splits (NaN when `local_eval` is off; a server on Flower has none) and the
/// method's own figures.
pub fn evaluate_classifier(
    method: &dyn Method,
    trainer: &Trainer,
    clients: &[ClientData],
    test: &Dataset,
    global: &Params,
    local_eval: bool,
) -> Result<(fedfuse_train::Evaluation, f64, BTreeMap<String, f64>)> {
    // Matching methods change widths: evaluate the global model as what it now is.
    let reshaped;
    let evaluator = if global.check_layout(&trainer.spec().param_shapes()).is_ok() {
        trainer
    } else {
        reshaped = Trainer::new(ModelSpec::infer_mlp(global)?)?;
        &reshaped
    };
    let eval = evaluator.evaluate(global, test)?;
    let local_accuracy_mean = if local_eval {
        let accs = clients
            .par_iter()
            .filter(|c| !c.test.is_empty())
            .map(|c| evaluator.evaluate(global, &c.test).map(|e| e.accuracy))
            .collect::<std::result::Result<Vec<f64>, _>>()?;
        accs.iter().sum::<f64>() / accs.len().max(1) as f64
    } else {
        f64::NAN
    };
    let scores = method.evaluate(evaluator, test)?;
    Ok((eval, local_accuracy_mean, scores))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_sampling_draws_each_client_at_its_rate_and_replays_by_seed() {
        let cfg = SimConfig {
            clients_per_round: ClientsPerRound::Fraction(0.3),
            sampling: Sampling::Poisson,
            seed: 5,
            ..SimConfig::default()
        };
        let mut sampler = Sampler::new(&cfg, 50).unwrap();
        let rounds: Vec<Vec<usize>> = (0..400).map(|_| sampler.next_round()).collect();
        let drawn: usize = rounds.iter().map(Vec::len).sum();
        // 400 x 50 Bernoulli(0.3) draws: mean 6000, sd 65.
        assert!((drawn as f64 - 6000.0).abs() < 300.0, "{drawn}");
        let sizes: std::collections::BTreeSet<usize> = rounds.iter().map(Vec::len).collect();
        assert!(sizes.len() > 5, "{sizes:?}");
        assert!(rounds.iter().all(|r| r.windows(2).all(|w| w[0] < w[1])));
        let mut again = Sampler::new(&cfg, 50).unwrap();
        assert!(rounds.iter().all(|r| *r == again.next_round()));
        // A count is a rate of count / n.
        let count = SimConfig {
            clients_per_round: ClientsPerRound::Count(10),
            ..cfg
        };
        assert_eq!(count.sampling_rate(50).unwrap(), 0.2);
    }

    #[test]
    fn replies_with_metrics_out_of_range_are_rejected_with_the_metric_named() {
        let method = crate::FedAvg;
        let mut global = Params::new();
        global.push("w", vec![2], vec![0.0, 0.0]).unwrap();
        let mut state = RoundState::new(&method, 1, 4);
        let reply = |key: &str, value: f64| {
            let mut r = Record::from_params(global.clone()).with_num_examples(10);
            r.metrics.insert(key.into(), value);
            Ok((r, 100))
        };
        state
            .offer(&method, &global, 0, reply(LOCAL_ACCURACY, 5.0))
            .unwrap();
        state
            .offer(&method, &global, 1, reply("train_loss", -1e30))
            .unwrap();
        state
            .offer(&method, &global, 2, reply("anything", f64::INFINITY))
            .unwrap();
        state
            .offer(&method, &global, 3, reply("train_loss", 0.5))
            .unwrap();
        let rejected: Vec<(usize, &str)> = state
            .rejected
            .iter()
            .map(|r| (r.client, r.reason.as_str()))
            .collect();
        assert_eq!(rejected.len(), 3, "{rejected:?}");
        assert!(
            rejected[0].1.contains("`local_accuracy` = 5"),
            "{rejected:?}"
        );
        assert!(rejected[1].1.contains("`train_loss`"), "{rejected:?}");
        assert!(rejected[2].1.contains("`anything` is inf"), "{rejected:?}");
        assert_eq!(state.accepted, 1);
    }
}
