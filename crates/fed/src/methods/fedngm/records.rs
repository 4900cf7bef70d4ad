//! FedNGM's messages: the keys of its records, the stage each round names, graphs and JSON
//! values on the wire, and the server's checkpoint state.

use fedfuse_core::{ConfigValue, CoreError, Params, Record};
use fedfuse_data::Encoding;
use fedfuse_fuse::Graph;
use serde::{Deserialize, Serialize};

use crate::{FedError, Result};

pub(super) const STAGE: &str = "fedngm_stage";
pub(super) const MODEL_ROUND: &str = "fedngm_round";
pub(super) const STATS: &str = "stats";
pub(super) const GRAPHS: &str = "graphs";
pub(super) const MODELS: &str = "models";
pub(super) const DONE: &str = "done";
pub(super) const TABLE_STATS: &str = "table_stats";
pub(super) const ENCODING: &str = "encoding";
pub(super) const FEATURES: &str = "features";
pub(super) const ADJACENCY: &str = "adjacency";
pub(super) const SAMPLES: &str = "samples";
pub(super) const MEANS: &str = "marginals.means";
pub(super) const MIN: &str = "marginals.min";
pub(super) const MAX: &str = "marginals.max";
pub(super) const RESIDUAL_SD: &str = "marginals.residual_sd";
/// Reply metric: the client's held-out loss at its selected epoch.
pub(super) const LOSS: &str = "loss";

/// Where the protocol stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Stats,
    Graphs,
    /// Model round, from 1.
    Models(usize),
    Done,
}

impl Stage {
    pub(super) fn name(self) -> &'static str {
        match self {
            Stage::Stats => STATS,
            Stage::Graphs => GRAPHS,
            Stage::Models(_) => MODELS,
            Stage::Done => DONE,
        }
    }
}

/// Config key of FedNGM's checkpoint state (JSON).
pub(super) const SAVED_STATE: &str = "fedngm_state";

/// A graph in a checkpoint.
#[derive(Serialize, Deserialize)]
pub(super) struct SavedGraph {
    pub(super) features: Vec<String>,
    pub(super) adj: Vec<bool>,
}

impl SavedGraph {
    pub(super) fn of(g: &Graph) -> Self {
        Self {
            features: g.features().to_vec(),
            adj: g.adj().to_vec(),
        }
    }
}

/// FedNGM's server state apart from its tensors.
#[derive(Serialize, Deserialize)]
pub(super) struct SavedState {
    pub(super) stage: String,
    pub(super) model_round: usize,
    pub(super) full_encoding: Option<Encoding>,
    pub(super) client_graphs: Vec<(usize, SavedGraph)>,
    /// The last model round's clients and their rows (their models are tensors).
    pub(super) locals: Vec<(usize, usize)>,
    pub(super) global_graph: Option<SavedGraph>,
}

pub(super) fn bad_server(reason: String) -> FedError {
    FedError::BadMessage {
        from: "server".into(),
        reason,
    }
}

/// A reply that fails the server's checks (the simulator lists it under the client's id).
pub(super) fn bad_reply(stage: Stage, reason: String) -> FedError {
    FedError::Core(CoreError::Decode {
        what: format!("FedNGM {} reply", stage.name()),
        reason,
    })
}

/// The JSON text `key` of `record`, read as a `T`; the error is the reason.
pub(super) fn json<T: serde::de::DeserializeOwned>(
    record: &Record,
    key: &str,
) -> std::result::Result<T, String> {
    match record.config.get(key) {
        Some(ConfigValue::Str(s)) => serde_json::from_str(s).map_err(|e| format!("`{key}`: {e}")),
        _ => Err(format!("no `{key}` text")),
    }
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<ConfigValue> {
    serde_json::to_string(value)
        .map(ConfigValue::Str)
        .map_err(|source| FedError::SaveState {
            what: "a FedNGM message",
            source,
        })
}

/// A graph as a message: its feature names and its adjacency as a sparse 0/1 tensor.
pub(super) fn graph_record(graph: &Graph) -> Result<Record> {
    let d = graph.d();
    let mut params = Params::new();
    let adj = graph
        .adj()
        .iter()
        .map(|&a| f32::from(u8::from(a)))
        .collect();
    params.push(ADJACENCY, vec![d, d], adj)?;
    Ok(Record::from_params(params)
        .with_sparse(true)
        .with_config(FEATURES, to_json(&graph.features())?))
}

/// The graph of a message; the error is the reason.
pub(super) fn graph_from_record(record: &Record) -> std::result::Result<Graph, String> {
    let features: Vec<String> = json(record, FEATURES)?;
    let adj = record
        .params
        .get(ADJACENCY)
        .ok_or_else(|| format!("no `{ADJACENCY}` tensor"))?;
    let d = features.len();
    if adj.shape != [d, d] {
        return Err(format!(
            "adjacency of shape {:?} for {d} features",
            adj.shape
        ));
    }
    Graph::new(features, adj.data.iter().map(|&v| v != 0.0).collect()).map_err(|e| e.to_string())
}
