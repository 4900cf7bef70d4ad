//! The strategy's server half: a fedfuse run's method, global model, sampling and rounds.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use fedfuse_core::flower::FlowerContent;
use fedfuse_core::{Params, Record};
use fedfuse_fed::{LastUploads, ReplyBounds, RoundMetrics, RoundState, RunResult, Sampler};
use fedfuse_lab::Config;
use fedfuse_lab::run::Federation;
use pyo3::prelude::*;

use crate::convert::*;

struct OpenRound {
    round: usize,
    sampled: Vec<usize>,
    state: RoundState,
    started: Instant,
}

struct ServerState {
    cfg: Config,
    fed: Federation,
    global: Params,
    sampler: Sampler,
    open: Option<OpenRound>,
    rounds: Vec<RoundMetrics>,
    /// Each client's last upload accuracy, for the rounds' `client_accuracy_last_mean`.
    last_uploads: LastUploads,
    /// Bounds on replies: the config's `[replies]`, with the strategy's `max_examples` over
    /// it when given.
    bounds: ReplyBounds,
}

/// The server half of a fedfuse run: the method, the global model, client sampling and each
/// round's aggregation and evaluation, exactly as `fedfuse run` does them in process.
#[pyclass(module = "fedfuse._core")]
pub(crate) struct Server(Mutex<ServerState>);

impl Server {
    fn with<T>(&self, f: impl FnOnce(&mut ServerState) -> PyResult<T>) -> PyResult<T> {
        let mut guard = self
            .0
            .lock()
            .map_err(|_| err("an earlier call panicked; start a new Server"))?;
        f(&mut guard)
    }
}

#[pymethods]
impl Server {
    /// The server of the run config at `config` (a `fedfuse run` TOML file) with `overrides`
    /// (`key=value`, as `--set`).
    #[new]
    #[pyo3(signature = (config, overrides = Vec::new(), max_examples = None))]
    fn new(
        py: Python<'_>,
        config: &str,
        overrides: Vec<String>,
        max_examples: Option<u64>,
    ) -> PyResult<Self> {
        let cfg = load_config(config, overrides)?;
        let fed = py
            .detach(|| Federation::prepare(&cfg).map_err(|e| e.to_string()))
            .map_err(err)?;
        let sampler = Sampler::new(&fed.sim, fed.data.num_clients()).map_err(err)?;
        let bounds = ReplyBounds {
            max_examples: max_examples.or(fed.sim.bounds.max_examples),
            ..fed.sim.bounds
        };
        Ok(Self(Mutex::new(ServerState {
            global: fed.init.clone(),
            cfg,
            fed,
            sampler,
            open: None,
            rounds: Vec::new(),
            last_uploads: LastUploads::default(),
            bounds,
        })))
    }

    /// Rounds the run config asks for.
    fn num_rounds(&self) -> PyResult<usize> {
        self.with(|s| Ok(s.fed.sim.rounds))
    }

    /// Client slots of the run (Flower's `num-partitions`).
    fn num_clients(&self) -> PyResult<usize> {
        self.with(|s| Ok(s.fed.data.num_clients()))
    }

    /// What the run does, in one line.
    fn summary(&self) -> PyResult<String> {
        self.with(|s| Ok(s.fed.run_summary()))
    }

    /// Whether the method has built its final model (one-shot methods stop early).
    fn finished(&self) -> PyResult<bool> {
        self.with(|s| Ok(s.fed.method.finished()))
    }

    /// Opens the next round; returns its sampled client slots, in increasing order.
    fn start_round(&self) -> PyResult<Vec<usize>> {
        self.with(|s| {
            if s.open.is_some() {
                return Err(err("the previous round is still open: finish it first"));
            }
            let round = s.rounds.len() + 1;
            let sampled = s.sampler.next_round();
            s.open = Some(OpenRound {
                round,
                state: RoundState::new(s.fed.method.as_ref(), round, sampled.len())
                    .bounded(s.bounds),
                sampled: sampled.clone(),
                started: Instant::now(),
            });
            Ok(sampled)
        })
    }

    /// The open round's instruction for `client`, as Flower content.
    fn instruct<'py>(&self, py: Python<'py>, client: usize) -> PyResult<PyContent<'py>> {
        let content = self.with(|s| {
            let open = s.open.as_mut().ok_or_else(|| err("no open round"))?;
            if !open.sampled.contains(&client) {
                return Err(err(format!("client {client} is not sampled this round")));
            }
            let record = s
                .fed
                .method
                .instruct(open.round, client, &s.global)
                .map_err(err)?;
            let content = s.fed.wire.outgoing(record).map_err(err)?;
            open.state.count_down(wire_bytes(&content));
            Ok(content)
        })?;
        Ok(content_to_py(py, content))
    }

    /// Closes the open round with `replies`: `(client, content)` for a reply, `(client,
    /// reason)` for a failure. Replies are folded in client-slot order whatever order they
    /// arrived in; a sampled client without a reply is listed as failed. Returns the
    /// round's metrics as a dict (one entry of results.json's `rounds`, plus the seconds the
    /// server spent folding replies, `aggregate_seconds`, and evaluating, `evaluate_seconds`).
    fn finish_round<'py>(
        &self,
        py: Python<'py>,
        replies: Vec<(usize, Bound<'py, PyAny>)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut by_client: BTreeMap<usize, Result<FlowerContent, String>> = BTreeMap::new();
        for (client, reply) in replies {
            // A reply that cannot be read (a negative shape, a dtype that is no string) is
            // that client's failure, not the round's.
            let reply = match reply.extract::<String>() {
                Ok(reason) => Err(reason),
                Err(_) => reply
                    .extract::<PyContent<'_>>()
                    .map(content_from_py)
                    .map_err(|e| format!("its content cannot be read: {e}")),
            };
            if by_client.insert(client, reply).is_some() {
                return Err(err(format!("two replies for client {client}")));
            }
        }
        self.with(|s| {
            let mut open = s.open.take().ok_or_else(|| err("no open round"))?;
            let method = s.fed.method.as_mut();
            let wire = &s.fed.wire;
            let global = &mut s.global;
            // The server holds no client data: the local mean is not measured.
            let view = s.fed.data.server_view();
            let metrics = py.detach(|| -> Result<(RoundMetrics, f64, f64), String> {
                let aggregating = Instant::now();
                for &client in &open.sampled {
                    let reply = match by_client.remove(&client) {
                        Some(Ok(content)) => wire
                            .incoming(&content)
                            .map_err(Into::into)
                            .map(|r| (r, wire_bytes(&content))),
                        Some(Err(reason)) => {
                            Err(fedfuse_fed::FedError::BadReply { client, reason })
                        }
                        None => Err(fedfuse_fed::FedError::BadReply {
                            client,
                            reason: "no reply: the node timed out or left".into(),
                        }),
                    };
                    open.state
                        .offer(method, global, client, reply)
                        .map_err(|e| e.to_string())?;
                }
                for client in by_client.keys() {
                    open.state
                        .reject(*client, "replied but was not sampled this round".into());
                }
                let tally = open
                    .state
                    .finish(method, global)
                    .map_err(|e| e.to_string())?;
                let aggregate_seconds = aggregating.elapsed().as_secs_f64();
                let evaluating = Instant::now();
                let (figures, scores) = view
                    .evaluate(method, global, false)
                    .map_err(|e| e.to_string())?;
                let evaluate_seconds = evaluating.elapsed().as_secs_f64();
                let metrics = tally.metrics(global, figures, scores, open.started);
                Ok((metrics, aggregate_seconds, evaluate_seconds))
            });
            let (mut metrics, aggregate_seconds, evaluate_seconds) = metrics.map_err(err)?;
            s.last_uploads.update(&mut metrics);
            // Timings of the server step for the Flower Result and benchmarks; results.json
            // keeps the simulator's format.
            let mut json = serde_json::to_value(&metrics).map_err(err)?;
            if let Some(fields) = json.as_object_mut() {
                fields.insert("aggregate_seconds".into(), aggregate_seconds.into());
                fields.insert("evaluate_seconds".into(), evaluate_seconds.into());
            }
            s.rounds.push(metrics);
            json_to_py(py, &json)
        })
    }

    /// `(loss, accuracy)` of a model (Flower content, e.g. a stock strategy's arrays) on the
    /// run's test set, the one the server scores its own model on.
    fn evaluate(&self, py: Python<'_>, content: PyContent<'_>) -> PyResult<(f64, f64)> {
        let content = content_from_py(content);
        self.with(|s| {
            let fed = &s.fed;
            py.detach(|| fed.server_evaluate(&content).map_err(|e| e.to_string()))
                .map_err(err)
        })
    }

    /// The global model as Flower content (dense).
    fn global_model<'py>(&self, py: Python<'py>) -> PyResult<PyContent<'py>> {
        let content = self.with(|s| {
            s.fed
                .wire
                .outgoing(Record::from_params(s.global.clone()))
                .map_err(err)
        })?;
        Ok(content_to_py(py, content))
    }

    /// Replaces `out` with the run's config.toml, results.json, metrics.csv, model and plots,
    /// all or nothing, as `fedfuse run` does.
    fn write_outputs(&self, out: &str) -> PyResult<()> {
        self.with(|s| {
            let result = RunResult {
                rounds: s.rounds.clone(),
                params: s.global.clone(),
            };
            fedfuse_lab::run::write_run_folder(Path::new(out), &s.cfg, &result).map_err(err)
        })
    }
}
