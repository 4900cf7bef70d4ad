//! `fedfuse._core`: the Rust half of the `fedfuse` Python package. Everything here is a thin
//! conversion around fedfuse-lab and fedfuse-fed; the Python half (`python/fedfuse`) turns
//! these plain tuples into numpy arrays and Flower records.
//!
//! Flower content crosses as `(arrays, config, metrics)`: `arrays` a list of
//! `(key, dtype, shape, stype, data)`, `config` a list of `(key, bool | int | float | str)`,
//! `metrics` a list of `(key, int | float)` ([`fedfuse_core::flower`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use fedfuse_core::flower::{FlowerArray, FlowerContent, MetricValue};
use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fed::{LastUploads, ReplyBounds, RoundMetrics, RoundState, RunResult, Sampler};
use fedfuse_fuse::{MatchOrder, PfnmConfig, WeightMatchingConfig};
use fedfuse_lab::Config;
use fedfuse_lab::fusion::{FuseMethod, FuseModel, FuseSettings, fuse_with};
use fedfuse_lab::run::Federation;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

create_exception!(
    _core,
    FedfuseError,
    PyValueError,
    "A fedfuse setting, input or reply was invalid; the message says which and why."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    FedfuseError::new_err(e.to_string())
}

/// A JSON value as the Python object `json.loads` would make of it, so that Python gets
/// dicts and lists from Rust rather than text to parse.
fn json_to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(fields) => {
            let dict = PyDict::new(py);
            for (k, v) in fields {
                dict.set_item(k, json_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// The Python object of `value` serialised: dicts, lists, numbers, strings, None.
fn to_py<'py>(py: Python<'py>, value: &impl serde::Serialize) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(py, &serde_json::to_value(value).map_err(err)?)
}

/// A Flower config value as Python gives it (bool before int: Python's bools are ints).
#[derive(FromPyObject, IntoPyObject)]
enum PyConfigValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl From<PyConfigValue> for ConfigValue {
    fn from(v: PyConfigValue) -> Self {
        match v {
            PyConfigValue::Bool(b) => Self::Bool(b),
            PyConfigValue::Int(i) => Self::Int(i),
            PyConfigValue::Float(f) => Self::Float(f),
            PyConfigValue::Str(s) => Self::Str(s),
        }
    }
}

impl From<ConfigValue> for PyConfigValue {
    fn from(v: ConfigValue) -> Self {
        match v {
            ConfigValue::Bool(b) => Self::Bool(b),
            ConfigValue::Int(i) => Self::Int(i),
            ConfigValue::Float(f) => Self::Float(f),
            ConfigValue::Str(s) => Self::Str(s),
        }
    }
}

/// A metric value as Python gives it.
#[derive(FromPyObject, IntoPyObject)]
enum PyMetric {
    Int(i64),
    Float(f64),
}

type PyArray<'py> = (String, String, Vec<usize>, String, Bound<'py, PyBytes>);
type PyArrays<'py> = Vec<PyArray<'py>>;
type PyContent<'py> = (
    PyArrays<'py>,
    Vec<(String, PyConfigValue)>,
    Vec<(String, PyMetric)>,
);

fn arrays_from_py(arrays: PyArrays<'_>) -> Vec<FlowerArray> {
    arrays
        .into_iter()
        .map(|(key, dtype, shape, stype, data)| FlowerArray {
            key,
            dtype,
            shape,
            stype,
            data: data.as_bytes().to_vec(),
        })
        .collect()
}

fn arrays_to_py(py: Python<'_>, arrays: Vec<FlowerArray>) -> PyArrays<'_> {
    arrays
        .into_iter()
        .map(|a| (a.key, a.dtype, a.shape, a.stype, PyBytes::new(py, &a.data)))
        .collect()
}

fn content_from_py(c: PyContent<'_>) -> FlowerContent {
    let (arrays, config, metrics) = c;
    FlowerContent {
        arrays: arrays_from_py(arrays),
        config: config.into_iter().map(|(k, v)| (k, v.into())).collect(),
        metrics: metrics
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    PyMetric::Int(i) => MetricValue::Int(i),
                    PyMetric::Float(f) => MetricValue::Float(f),
                };
                (k, v)
            })
            .collect(),
    }
}

fn content_to_py(py: Python<'_>, c: FlowerContent) -> PyContent<'_> {
    let arrays = arrays_to_py(py, c.arrays);
    let config = c.config.into_iter().map(|(k, v)| (k, v.into())).collect();
    let metrics = c
        .metrics
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                MetricValue::Int(i) => PyMetric::Int(i),
                MetricValue::Float(f) => PyMetric::Float(f),
            };
            (k, v)
        })
        .collect();
    (arrays, config, metrics)
}

/// Bytes a content puts on Flower's wire: its arrays' encoded data (records and protobuf
/// framing add a few dozen bytes per array).
fn wire_bytes(c: &FlowerContent) -> usize {
    c.arrays.iter().map(|a| a.data.len()).sum()
}

/// Tensors as `(name, shape, little-endian f32 bytes)` triples.
type PyTensors<'py> = Vec<(String, Vec<usize>, Bound<'py, PyBytes>)>;

fn params_from_py(model: PyTensors<'_>, client: usize) -> PyResult<Params> {
    let mut p = Params::new();
    for (name, shape, bytes) in model {
        let raw = bytes.as_bytes();
        if raw.len() % 4 != 0 {
            return Err(err(format!(
                "model {client}, tensor `{name}`: {} bytes are not whole float32 values",
                raw.len()
            )));
        }
        let data: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        p.push(name.clone(), shape, data)
            .map_err(|e| err(format!("model {client}, tensor `{name}`: {e}")))?;
    }
    Ok(p)
}

fn params_to_py<'py>(py: Python<'py>, p: &Params) -> PyTensors<'py> {
    p.iter()
        .map(|(name, t)| {
            let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name.to_string(), t.shape.clone(), PyBytes::new(py, &bytes))
        })
        .collect()
}

/// PFNM's defaults (`PfnmConfig::default()`) as a dict: the Python package's keyword
/// defaults.
#[pyfunction]
fn pfnm_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    to_py(py, &PfnmConfig::default())
}

/// Fuses pre-trained models (MLPs, or layer lists with `model`: a network name or a TOML
/// file); returns the fused tensors and the assignments as a dict (what `fedfuse fuse` writes
/// to `.assignments.json`), with `metadata`: what `fedfuse fuse` writes into the file's header.
#[pyfunction]
#[pyo3(signature = (models, method, class_counts, sigma, sigma0, gamma, iters, eps, max_global, bias_mean, order, seed, model))]
#[allow(clippy::too_many_arguments)]
fn fuse<'py>(
    py: Python<'py>,
    models: Vec<PyTensors<'py>>,
    method: &str,
    class_counts: Option<Vec<Vec<f64>>>,
    sigma: f64,
    sigma0: f64,
    gamma: f64,
    iters: usize,
    eps: f64,
    max_global: usize,
    bias_mean: f64,
    order: Option<&str>,
    seed: u64,
    model: Option<&str>,
) -> PyResult<(PyTensors<'py>, Bound<'py, PyAny>)> {
    let method = FuseMethod::parse(method).map_err(err)?;
    let order = order
        .map(str::parse::<MatchOrder>)
        .transpose()
        .map_err(err)?;
    let model = model.map(FuseModel::parse).transpose().map_err(err)?;
    let models = models
        .into_iter()
        .enumerate()
        .map(|(j, m)| Ok((format!("model {j}"), params_from_py(m, j)?)))
        .collect::<PyResult<Vec<_>>>()?;
    let settings = FuseSettings {
        method,
        pfnm: PfnmConfig {
            sigma,
            sigma0,
            gamma,
            iters,
            max_global,
            bias_mean,
            eps,
            ..PfnmConfig::default()
        },
        order,
        weight_matching: WeightMatchingConfig::default(),
        seed,
    };
    let (fused, metadata) = py
        .detach(|| {
            let fused = fuse_with(&models, model.as_ref(), class_counts.as_deref(), &settings)
                .map_err(|e| e.to_string())?;
            let metadata = fused.metadata().map_err(|e| e.to_string())?;
            Ok::<_, String>((fused, metadata))
        })
        .map_err(err)?;
    let report = to_py(py, &fused)?;
    report.set_item("metadata", to_py(py, &metadata)?)?;
    Ok((params_to_py(py, &fused.params), report))
}

/// A record's tensors, config and metrics as Flower content (`sparse`: tensors may travel
/// sparse), and back: the round trip the Flower strategy and ClientApp make.
#[pyfunction]
fn record_to_flower<'py>(
    py: Python<'py>,
    tensors: PyTensors<'py>,
    config: Vec<(String, PyConfigValue)>,
    metrics: Vec<(String, f64)>,
    num_examples: u64,
    sparse: bool,
) -> PyResult<PyContent<'py>> {
    let mut r = Record::from_params(params_from_py(tensors, 0)?)
        .with_num_examples(num_examples)
        .with_sparse(sparse);
    r.config = config.into_iter().map(|(k, v)| (k, v.into())).collect();
    r.metrics = metrics.into_iter().collect();
    Ok(content_to_py(py, r.to_flower().map_err(err)?))
}

/// The record in Flower content: `(tensors, config, metrics, num_examples, sparse)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn record_from_flower<'py>(
    py: Python<'py>,
    content: PyContent<'py>,
) -> PyResult<(
    PyTensors<'py>,
    Vec<(String, PyConfigValue)>,
    Vec<(String, f64)>,
    u64,
    bool,
)> {
    let r = Record::from_flower(&content_from_py(content)).map_err(err)?;
    let config = r.config.into_iter().map(|(k, v)| (k, v.into())).collect();
    let metrics = r.metrics.into_iter().collect();
    Ok((
        params_to_py(py, &r.params),
        config,
        metrics,
        r.num_examples,
        r.sparse,
    ))
}

fn load_config(config: &str, overrides: Vec<String>) -> PyResult<Config> {
    Config::load(Path::new(config), &overrides).map_err(err)
}

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
struct Server(Mutex<ServerState>);

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
            let content = record.to_flower().map_err(err)?;
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
            let global = &mut s.global;
            // The server holds no client data: the local mean is not measured.
            let view = s.fed.data.server_view();
            let metrics = py.detach(|| -> Result<(RoundMetrics, f64, f64), String> {
                let aggregating = Instant::now();
                for &client in &open.sampled {
                    let reply = match by_client.remove(&client) {
                        Some(Ok(content)) => Record::from_flower(&content)
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
            Record::from_params(s.global.clone())
                .to_flower()
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

/// One client slot of a run: its own data split and the method's client procedure, exactly
/// as the simulator runs them.
///
/// What the client keeps between its rounds (FedBN's own norm tensors under
/// `model.local_norm`) goes in and out of each step as `state`: Flower may run every round in
/// a new ClientApp process, so the ClientApp keeps it in its node's `Context.state`, and this
/// object holds none of it between calls.
#[pyclass(module = "fedfuse._core")]
struct Client {
    fed: Federation,
    id: usize,
    /// Held from putting a state in to taking it out, so that two calls on one object do not
    /// see each other's.
    step: Mutex<()>,
}

/// Why a client step with a stored state failed.
enum StepError {
    /// The stored state does not fit the method or model.
    State(String),
    /// The step itself failed.
    Step(String),
}

impl Client {
    /// Runs `f` with `state` as the method's stored state for this client (none when `None`);
    /// returns its result and the state after it.
    fn with_state<T: Send>(
        &self,
        py: Python<'_>,
        state: Option<PyArrays<'_>>,
        f: impl FnOnce(&Federation) -> Result<T, String> + Send,
    ) -> PyResult<(T, Option<Params>)> {
        let id = self.id;
        let unfit = |e: String| {
            err(format!(
                "client {id}: the state the ClientApp stored for it (in its node's \
                 Context.state) does not fit this run: {e}; this run's client did not write it \
                 (did the run's config change mid-run?): start a new run, whose nodes start \
                 with an empty state"
            ))
        };
        let state = match state {
            Some(arrays) => {
                let content = FlowerContent {
                    arrays: arrays_from_py(arrays),
                    ..FlowerContent::default()
                };
                let record = Record::from_flower(&content).map_err(|e| unfit(e.to_string()))?;
                Some(record.params)
            }
            None => None,
        };
        let method = self.fed.method.as_ref();
        let out = py.detach(|| {
            // Locked with the GIL released, so that a thread waiting here holds no GIL that
            // the holder needs to finish.
            let _step = self.step.lock().map_err(|_| {
                StepError::Step("an earlier call panicked; start a new Client".into())
            })?;
            method.set_client_state(id, state).map_err(|e| match e {
                // The message below names the client already.
                fedfuse_fed::FedError::ClientState { reason, .. } => StepError::State(reason),
                e => StepError::Step(e.to_string()),
            })?;
            let out = f(&self.fed).map_err(StepError::Step)?;
            let kept = method
                .client_state(id)
                .map_err(|e| StepError::Step(e.to_string()))?;
            Ok((out, kept))
        });
        out.map_err(|e| match e {
            StepError::State(e) => unfit(e),
            StepError::Step(e) => err(format!("client {id}: {e}")),
        })
    }
}

#[pymethods]
impl Client {
    /// Client `partition_id` of the run config at `config` with `overrides`.
    #[new]
    #[pyo3(signature = (config, partition_id, overrides = Vec::new()))]
    fn new(
        py: Python<'_>,
        config: &str,
        partition_id: usize,
        overrides: Vec<String>,
    ) -> PyResult<Self> {
        let cfg = load_config(config, overrides)?;
        let fed = py
            .detach(|| Federation::prepare(&cfg).map_err(|e| e.to_string()))
            .map_err(err)?;
        let clients = fed.data.num_clients();
        if partition_id >= clients {
            return Err(err(format!(
                "partition-id {partition_id} is out of range: {config} has {clients} clients \
                 (0 to {})",
                clients.saturating_sub(1)
            )));
        }
        Ok(Self {
            fed,
            id: partition_id,
            step: Mutex::new(()),
        })
    }

    /// Examples in this client's training split (rows, for a table).
    fn num_examples(&self) -> usize {
        self.fed.data.num_examples(self.id)
    }

    /// Runs the method's client step on an instruction (Flower content holding
    /// `server-round`) from `state`, what the client kept after its last step (`None` before
    /// its first); returns the reply as Flower content and the state to keep for the next
    /// step as Flower arrays (`None` when the method keeps nothing on its clients).
    #[pyo3(signature = (instruction, state = None))]
    #[allow(clippy::type_complexity)]
    fn fit<'py>(
        &self,
        py: Python<'py>,
        instruction: PyContent<'py>,
        state: Option<PyArrays<'py>>,
    ) -> PyResult<(PyContent<'py>, Option<PyArrays<'py>>)> {
        let content = content_from_py(instruction);
        let id = self.id;
        let (reply, kept) = self.with_state(py, state, |fed| {
            fed.client_fit(id, &content).map_err(|e| e.to_string())
        })?;
        let kept = match kept {
            Some(params) => {
                let arrays = Record::from_params(params).to_flower().map_err(err)?.arrays;
                Some(arrays_to_py(py, arrays))
            }
            None => None,
        };
        Ok((content_to_py(py, reply), kept))
    }

    /// `(loss, accuracy, examples)` of the model in `content` on this client's own test split,
    /// run as the client runs it from `state` (under `model.local_norm`, with its own norms);
    /// `(0, 0, 0)` for a table (its model is no classifier) or an empty split.
    #[pyo3(signature = (content, state = None))]
    fn evaluate(
        &self,
        py: Python<'_>,
        content: PyContent<'_>,
        state: Option<PyArrays<'_>>,
    ) -> PyResult<(f64, f64, usize)> {
        let content = content_from_py(content);
        let id = self.id;
        let (scores, _) = self.with_state(py, state, |fed| {
            fed.client_evaluate(id, &content).map_err(|e| e.to_string())
        })?;
        Ok(scores)
    }
}

/// Checks that a run's output folder is new or holds only an earlier run's files, so that
/// writing the run's outputs (which replaces the folder whole) loses nothing else.
#[pyfunction]
fn check_output_folder(out: &str) -> PyResult<()> {
    fedfuse_lab::table::check_replaceable(Path::new(out), &fedfuse_lab::table::RUN_FILES)
        .map_err(err)
}

/// ε at `delta` after `steps` releases of the Gaussian mechanism with `noise_multiplier` on a
/// Poisson sample of rate `q` (RDP accounting), and the order that gave it.
#[pyfunction]
fn rdp_epsilon(q: f64, noise_multiplier: f64, steps: usize, delta: f64) -> PyResult<(f64, f64)> {
    let valid = (0.0..=1.0).contains(&q)
        && (0.0..f64::INFINITY).contains(&noise_multiplier)
        && delta > 0.0
        && delta < 1.0;
    if !valid {
        return Err(err(format!(
            "rdp_epsilon needs q in [0, 1], noise_multiplier >= 0 and delta in (0, 1); got \
             q = {q}, noise_multiplier = {noise_multiplier}, delta = {delta}"
        )));
    }
    let mut acc = fedfuse_fuse::dp::RdpAccountant::default();
    acc.compose(q, noise_multiplier, steps);
    let spent = acc.epsilon(delta);
    Ok((spent.epsilon, spent.order))
}

/// The module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FedfuseError", m.py().get_type::<FedfuseError>())?;
    m.add_function(wrap_pyfunction!(fuse, m)?)?;
    m.add_function(wrap_pyfunction!(pfnm_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_output_folder, m)?)?;
    m.add_function(wrap_pyfunction!(rdp_epsilon, m)?)?;
    m.add_function(wrap_pyfunction!(record_to_flower, m)?)?;
    m.add_function(wrap_pyfunction!(record_from_flower, m)?)?;
    m.add_class::<Server>()?;
    m.add_class::<Client>()?;
    Ok(())
}
