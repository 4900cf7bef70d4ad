//! The ClientApp's client half: one client slot of a run.

use std::sync::Mutex;

use fedfuse_core::flower::FlowerContent;
use fedfuse_core::{Params, Record};
use fedfuse_lab::run::Federation;
use pyo3::prelude::*;

use crate::convert::*;

/// One client slot of a run: its own data split and the method's client procedure, exactly
/// as the simulator runs them.
///
/// What the client keeps between its rounds (FedBN's own norm tensors under
/// `model.local_norm`) goes in and out of each step as `state`: Flower may run every round in
/// a new ClientApp process, so the ClientApp keeps it in its node's `Context.state`, and this
/// object holds none of it between calls.
#[pyclass(module = "fedfuse._core")]
pub(crate) struct Client {
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
