//! The round loop, once: sample clients, instruct, fit in parallel, check, aggregate, evaluate.

mod config;
mod population;
mod round;
mod sampling;

pub use config::{ClientsPerRound, ReplyBounds, Sampling, SimConfig};
pub use population::{Population, client_step, evaluate_classifier};
pub use round::{LastUploads, Rejection, RoundMetrics, RoundState, RoundTally};
pub use sampling::Sampler;

use std::time::Instant;

use fedfuse_core::{Params, Record};

use rayon::prelude::*;

use crate::{FedError, Method, Result, derive_seed};
use population::{Exchange, client_task};

/// Replies in flight per worker thread when a method folds replies as they arrive.
const FOLD_CHUNK_PER_THREAD: usize = 16;

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

/// Runs `cfg.rounds` rounds of `method` over `population` from the global model `init`: a
/// fresh run ([`simulate_session`] resumes one or writes checkpoints).
///
/// A client whose procedure fails, or whose reply is malformed (wrong layout, NaN/Inf), is
/// left out of that round's aggregate and listed in [`RoundMetrics::rejected`]; the round goes
/// on. When no reply is usable the global model is kept. A tabular method
/// ([`Method::tabular`], e.g. FedNGM) runs on [`Population::Tables`] (`cfg.train` and
/// `cfg.local_eval` do not apply; after each round it scores its own global model on the
/// held-out rows, if any); every other method on [`Population::Labelled`].
pub fn simulate(
    method: &mut dyn Method,
    population: Population<'_>,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<RunResult> {
    simulate_session(method, population, init, cfg, progress, Session::default())
}

/// What a checkpoint callback gets after a round: the global model, every round so far, and
/// the method (for [`Method::save_state`]).
pub type AfterRound<'a> =
    &'a (dyn Fn(&Params, &[RoundMetrics], &dyn Method) -> std::result::Result<(), BoxError> + Sync);

/// Any error, boxed: what a checkpoint callback may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

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

/// [`simulate`] from where `session` says, calling its checkpoint callback after each round.
pub fn simulate_session(
    method: &mut dyn Method,
    population: Population<'_>,
    init: Params,
    cfg: &SimConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
    session: Session<'_>,
) -> Result<RunResult> {
    match (&population, method.tabular()) {
        (Population::Labelled { .. }, false) => cfg.train.check()?,
        (Population::Tables { .. }, true) => {}
        (_, tabular) => {
            return Err(FedError::WrongData {
                method: method.name(),
                tabular,
            });
        }
    }
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
            let round = rounds.len();
            after(&global, &rounds, method)
                .map_err(|source| FedError::Checkpoint { round, source })?;
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
