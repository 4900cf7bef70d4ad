//! FedNGM and FedNGR as a [`Method`] over tabular clients: rounds are the protocol's stages,
//! as GEMS's rounds are its layers (see [`crate::fedngm`] for the protocol itself).
//!
//! | round | server sends | client replies |
//! |---|---|---|
//! | 1, statistics | the stage | its column statistics |
//! | 2, graphs | the merged encoding | its recovered graph (FedNGR: its feature list) |
//! | 3.., models | consensus encoding and graph, the global model after the first | its NGM, plus samples or marginal summaries |
//!
//! After each model round the server distils the global model; after `rounds` of them the
//! method is [finished](Method::finished). Clients keep nothing between rounds, so every
//! model round's instruction carries the consensus encoding and graph again.
//!
//! Each stage uses the replies that passed [`Method::check_reply`]: the encoding merges the
//! statistics that arrived, the consensus is over the graphs that arrived, the global model is
//! distilled from the client models that arrived. A client left out (its procedure failed or
//! its reply was malformed) is listed in that round's rejections by the simulator.

use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, CoreError, Params, Record};
use fedfuse_data::{Encoding, Table, TableStats};
use fedfuse_fuse::{Graph, GraphRecovery, consensus, recover_graph};
use fedfuse_train::{
    BlockAggregate, Distill, FeatureGraph, FirstDraw, InferConfig, InferMethod, Marginals, Ngm,
    NgmConfig, PathNorm, SampleConfig, SampleNoise, ngr_graph,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::fedngm::score_prediction;
use crate::method::{SERVER_ROUND, TableContext};
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

/// Which model family is federated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FedNgmVariant {
    /// FedNGM: client graphs, consensus graph, graph-constrained NGMs.
    #[default]
    Ngm,
    /// FedNGR: neural graph revealers (complete graph, sparsity penalty); the global graph is
    /// read off the global weights.
    Ngr,
}

/// Who draws the distillation samples from a client's model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleSite {
    /// The client, with Algorithm 3 as written (first feature from its own rows), and uploads
    /// the samples with its model.
    #[default]
    Client,
    /// The server, from the client's model and per-unit summaries (means, ranges) the client
    /// sends instead: no value of any row leaves the client, and the first feature is drawn
    /// uniformly over its range (the reference code's choice).
    Server,
}

/// How client models are weighted in the averaged outputs the global model is distilled onto.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientWeighting {
    /// `a_c = 1 / C`.
    #[default]
    Uniform,
    /// `a_c = n_c / sum n`.
    Examples,
}

/// How a client recovers its feature graph (see [`recover_graph`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphSettings {
    /// Graphical-lasso penalty on the unit correlation matrix.
    pub rho: f64,
    /// Fraction of feature pairs kept as edges.
    pub sparsity: f64,
    /// How a pair of multi-unit features scores from its unit links.
    pub aggregate: BlockAggregate,
}

impl Default for GraphSettings {
    fn default() -> Self {
        let r = GraphRecovery::default();
        GraphSettings {
            rho: r.rho,
            sparsity: r.sparsity,
            aggregate: r.aggregate,
        }
    }
}

impl GraphSettings {
    /// As the graph library's settings.
    pub fn recovery(&self) -> GraphRecovery {
        GraphRecovery {
            rho: self.rho,
            sparsity: self.sparsity,
            aggregate: self.aggregate,
        }
    }
}

/// Settings of a FedNGM run (`[method] name = "fedngm"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedNgmConfig {
    /// FedNGM or FedNGR.
    pub variant: FedNgmVariant,
    /// Client graph recovery (FedNGM only).
    pub graph: GraphSettings,
    /// Local training. Its `hidden` fixes the architecture of every model, the global one
    /// included; its `seed` is derived from [`seed`](Self::seed) per client and round, so a
    /// config file may not set it. Keys left out of a config file take FedNGM's defaults (one
    /// hidden layer of 64, 1000 epochs, lr 0.01), not those of a bare NGM.
    #[serde(
        deserialize_with = "local_over_defaults",
        serialize_with = "serialize_local"
    )]
    pub local: NgmConfig,
    /// The server's distillation. Its architecture is `local.hidden` and its seed derived as
    /// for `local`, so a config file may set neither; missing keys default as for `local`.
    #[serde(
        deserialize_with = "global_over_defaults",
        serialize_with = "serialize_global"
    )]
    pub global: NgmConfig,
    /// Rounds of local training and distillation; rounds after the first warm-start the
    /// clients from the global model. The federation runs two set-up rounds before them.
    pub rounds: usize,
    /// Samples drawn from each client's model per round.
    pub samples_per_client: usize,
    /// Who draws them.
    pub sample_at: SampleSite,
    /// Sampling (Algorithm 3). With `sample_at = "server"`, `first` is always `uniform`. The
    /// default noise is `residual` (each real value strays from its conditional mean by the
    /// model's residual spread), not the reference code's 5% relative noise, whose samples
    /// are far narrower than the data, so a model distilled on them extrapolates on real rows.
    /// `gibbs_sweeps` (0 by default, as Algorithm 3) redraws every feature from its full
    /// conditional, the spread `residual` noise describes. Keys left out of a config file
    /// take these defaults.
    #[serde(deserialize_with = "sample_over_defaults")]
    pub sample: SampleConfig,
    /// Copies of each sample added to the distillation inputs, each with one feature (drawn
    /// at random) set to the samples' mean, with the averaged outputs at the copy as its
    /// target. Inference starts an unknown feature at its mean and moves it from there, so
    /// the global model is then fitted where it will be read, not only on the samples.
    #[serde(skip_serializing_if = "is_zero")]
    pub masked_copies: usize,
    /// Weights of the client models in the distillation targets.
    pub weighting: ClientWeighting,
    /// Weight of the reconstruction loss on public rows (1 when not given). Setting it
    /// without public rows is an error, not a silent no-op.
    pub gamma: Option<f64>,
    /// FedNGR: fraction of feature pairs read off the global weights as edges.
    pub ngr_sparsity: f64,
    /// Seeds every random choice of the run. In a run config the run's `seed` replaces it.
    pub seed: u64,
}

/// FedNGM's NGM training defaults: one hidden layer of 64, 1000 full-batch epochs at lr
/// 0.01 (the reference code's two layers of 20 at lr 0.001 for 1200 epochs underfit here),
/// and the paper's raw path product with `lambda` 0.01 rather than the reference code's
/// row-normalised one at 1. Under row normalisation a penalty term is a path's *share* of its
/// input's mass, which a few hub outputs with large weights dilute; the other outputs are
/// then pushed to constants and predict the marginal mean (measured on the synthetic GGM:
/// one to four of eight features per model, docs/EXPERIMENTS.md).
pub(crate) fn fedngm_ngm_defaults() -> NgmConfig {
    NgmConfig {
        hidden: vec![64],
        epochs: 1000,
        lr: 1e-2,
        lambda: 0.01,
        path: PathNorm::Raw,
        ..NgmConfig::default()
    }
}

/// Keys of an [`NgmConfig`] that FedNGM sets itself: every model's architecture is
/// `local.hidden`, and every seed is derived from the run's.
const DERIVED_KEYS: [(&str, &str); 2] = [
    (
        "hidden",
        "the global model has the local models' architecture: set `local.hidden`",
    ),
    (
        "seed",
        "seeds are derived from the run's `seed` per client and round",
    ),
];

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Bound on [`FedNgmConfig::masked_copies`]: the distillation holds `1 + copies` times the
/// samples in memory.
const MAX_MASKED_COPIES: usize = 16;

/// FedNGM's sampling defaults: residual noise, no Gibbs sweeps.
fn fedngm_sample_defaults() -> SampleConfig {
    SampleConfig {
        noise: SampleNoise::Residual,
        ..SampleConfig::default()
    }
}

fn local_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<NgmConfig, D::Error> {
    over_defaults(deserializer, fedngm_ngm_defaults(), &DERIVED_KEYS[1..])
}

fn global_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<NgmConfig, D::Error> {
    over_defaults(deserializer, fedngm_ngm_defaults(), &DERIVED_KEYS)
}

fn sample_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<SampleConfig, D::Error> {
    over_defaults(deserializer, fedngm_sample_defaults(), &[])
}

fn serialize_local<S: serde::Serializer>(
    cfg: &NgmConfig,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serialize_without(cfg, &DERIVED_KEYS[1..], serializer)
}

fn serialize_global<S: serde::Serializer>(
    cfg: &NgmConfig,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serialize_without(cfg, &DERIVED_KEYS, serializer)
}

/// Writes an [`NgmConfig`] without the keys FedNGM derives, so a written config reads back.
fn serialize_without<S: serde::Serializer>(
    cfg: &NgmConfig,
    derived: &[(&str, &str)],
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::Error;
    let mut map = match serde_json::to_value(cfg) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(S::Error::custom("cannot lay out the NGM settings")),
    };
    for (key, _) in derived {
        map.remove(*key);
    }
    map.serialize(serializer)
}

/// Reads settings whose missing keys come from FedNGM's `defaults`; unknown keys and the
/// `refused` ones (with why) are errors.
fn over_defaults<'de, D: serde::Deserializer<'de>, T: Serialize + serde::de::DeserializeOwned>(
    deserializer: D,
    defaults: T,
    refused: &[(&str, &str)],
) -> std::result::Result<T, D::Error> {
    use serde::de::Error;
    let given = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    if let Some((key, why)) = refused.iter().find(|(k, _)| given.contains_key(*k)) {
        return Err(D::Error::custom(format!(
            "`{key}` cannot be set here: {why}"
        )));
    }
    let mut merged = match serde_json::to_value(defaults) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(D::Error::custom("cannot lay out the defaults")),
    };
    merged.extend(given);
    serde_json::from_value(serde_json::Value::Object(merged)).map_err(D::Error::custom)
}

impl Default for FedNgmConfig {
    fn default() -> Self {
        let ngm = fedngm_ngm_defaults();
        FedNgmConfig {
            variant: FedNgmVariant::Ngm,
            graph: GraphSettings::default(),
            local: ngm.clone(),
            global: ngm,
            rounds: 1,
            samples_per_client: 2000,
            sample_at: SampleSite::Client,
            sample: fedngm_sample_defaults(),
            masked_copies: 0,
            weighting: ClientWeighting::Uniform,
            gamma: None,
            ngr_sparsity: 1.0 / 3.0,
            seed: 0,
        }
    }
}

impl FedNgmConfig {
    /// Checks the settings that the parts do not check themselves.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(FedError::InvalidSetting { field, reason });
        if self.rounds == 0 {
            return bad("fedngm.rounds", "0 rounds; use at least 1".into());
        }
        if self.samples_per_client == 0 {
            return bad(
                "fedngm.samples_per_client",
                "0 samples: the global model would have nothing to learn from".into(),
            );
        }
        if self.masked_copies > MAX_MASKED_COPIES {
            return bad(
                "fedngm.masked_copies",
                format!(
                    "{} copies of every sample; use at most {MAX_MASKED_COPIES} (each copy \
                     adds the whole sample set to the distillation)",
                    self.masked_copies
                ),
            );
        }
        if let Some(gamma) = self.gamma.filter(|g| !(g.is_finite() && *g >= 0.0)) {
            return bad("fedngm.gamma", format!("{gamma} is not >= 0"));
        }
        if !(0.0..=1.0).contains(&self.ngr_sparsity) {
            return bad(
                "fedngm.ngr_sparsity",
                format!("{} is not a fraction in [0, 1]", self.ngr_sparsity),
            );
        }
        if self.variant == FedNgmVariant::Ngr
            && (self.local.path != PathNorm::Raw || self.global.path != PathNorm::Raw)
        {
            return bad(
                "fedngm.local.path / fedngm.global.path",
                "FedNGR needs path = \"raw\" for both: with the row-normalised path matrix the \
                 sparsity penalty routes every input to one output and the graph reads out as \
                 a star"
                    .into(),
            );
        }
        self.local.check()?;
        self.global.check()?;
        Ok(())
    }

    /// Rounds of a whole run: statistics, graphs, then [`rounds`](Self::rounds) model rounds.
    pub fn stages(&self) -> usize {
        2 + self.rounds
    }
}

/// FedNGR's settings as written under `[method] name = "fedngr"`: a [`FedNgmConfig`] whose
/// `variant` is `ngr`; every other key defaults as for FedNGM (raw paths included, which
/// FedNGR needs).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct FedNgrConfig(pub FedNgmConfig);

impl<'de> Deserialize<'de> for FedNgrConfig {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        use serde_json::Value;
        let mut given = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        match given.get("variant") {
            None => {
                given.insert("variant".into(), Value::from("ngr"));
            }
            Some(v) if v == "ngr" => {}
            Some(v) => {
                return Err(D::Error::custom(format!(
                    "`variant = {v}` under name = \"fedngr\": FedNGR is variant \"ngr\"; \
                     use name = \"fedngm\" for the other"
                )));
            }
        }
        serde_json::from_value(Value::Object(given))
            .map(FedNgrConfig)
            .map_err(D::Error::custom)
    }
}

/// Client models paired with their averaging weights `a_c` (unnormalised).
pub(crate) fn member_weights<'a>(
    locals: &'a [Params],
    examples: &[usize],
    weighting: ClientWeighting,
) -> Vec<(&'a Params, f64)> {
    locals
        .iter()
        .zip(examples)
        .map(|(p, &n)| {
            let a = match weighting {
                ClientWeighting::Uniform => 1.0,
                ClientWeighting::Examples => n as f64,
            };
            (p, a)
        })
        .collect()
}

const STAGE: &str = "fedngm_stage";
const MODEL_ROUND: &str = "fedngm_round";
const STATS: &str = "stats";
const GRAPHS: &str = "graphs";
const MODELS: &str = "models";
const DONE: &str = "done";
const TABLE_STATS: &str = "table_stats";
const ENCODING: &str = "encoding";
const FEATURES: &str = "features";
const ADJACENCY: &str = "adjacency";
const SAMPLES: &str = "samples";
const MEANS: &str = "marginals.means";
const MIN: &str = "marginals.min";
const MAX: &str = "marginals.max";
const RESIDUAL_SD: &str = "marginals.residual_sd";
/// Reply metric: the client's held-out loss at its selected epoch.
const LOSS: &str = "loss";

/// Where the protocol stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Stats,
    Graphs,
    /// Model round, from 1.
    Models(usize),
    Done,
}

impl Stage {
    fn name(self) -> &'static str {
        match self {
            Stage::Stats => STATS,
            Stage::Graphs => GRAPHS,
            Stage::Models(_) => MODELS,
            Stage::Done => DONE,
        }
    }
}

/// What the server agreed with the clients in the set-up rounds.
#[derive(Clone, Debug)]
struct Shared {
    consensus: Graph,
    /// The consensus features' encoding: the layout of every model.
    encoding: Encoding,
    ngm: Ngm,
    /// Public rows in that encoding, for the distillation.
    public_x: Option<Vec<f32>>,
}

/// Config key of FedNGM's checkpoint state (JSON).
const SAVED_STATE: &str = "fedngm_state";

/// A graph in a checkpoint.
#[derive(Serialize, Deserialize)]
struct SavedGraph {
    features: Vec<String>,
    adj: Vec<bool>,
}

impl SavedGraph {
    fn of(g: &Graph) -> Self {
        Self {
            features: g.features().to_vec(),
            adj: g.adj().to_vec(),
        }
    }
}

/// FedNGM's server state apart from its tensors.
#[derive(Serialize, Deserialize)]
struct SavedState {
    stage: String,
    model_round: usize,
    full_encoding: Option<Encoding>,
    client_graphs: Vec<(usize, SavedGraph)>,
    /// The last model round's clients and their rows (their models are tensors).
    locals: Vec<(usize, usize)>,
    global_graph: Option<SavedGraph>,
}

/// FedNGM (or FedNGR) in the federation; build it with [`FedNgm::new`] and run it with
/// [`simulate_tables`](crate::simulate_tables) for [`FedNgmConfig::stages`] rounds.
#[derive(Debug)]
pub struct FedNgm {
    cfg: FedNgmConfig,
    public: Option<Table>,
    stage: Stage,
    /// Encoding of every column any client has (for stitching).
    full_encoding: Option<Encoding>,
    /// Each client's graph, by client id.
    client_graphs: Vec<(usize, Graph)>,
    shared: Option<Shared>,
    /// The last model round's client models and rows, by client id.
    locals: Vec<(usize, Params, usize)>,
    global_graph: Option<Graph>,
    /// Unit means of the last distillation samples: inference's starting point when the
    /// server scores its model (it holds no client rows).
    means: Vec<f32>,
    report: BTreeMap<String, f64>,
}

/// A client model reply, split into the model and what the server distils from.
struct ModelReply {
    params: Params,
    drawn: Drawn,
    loss: f64,
}

enum Drawn {
    Samples(Vec<f32>),
    Summary {
        means: Vec<f32>,
        min: Vec<f32>,
        max: Vec<f32>,
        sd: Vec<f32>,
    },
}

impl FedNgm {
    /// FedNGM with `cfg`, and optional `public` rows for the server's distillation.
    pub fn new(cfg: FedNgmConfig, public: Option<Table>) -> Result<Self> {
        cfg.check()?;
        if cfg.gamma.is_some() && public.is_none() {
            return Err(FedError::InvalidSetting {
                field: "fedngm.gamma",
                reason: "weighs the loss on public rows, and this run has none; remove it".into(),
            });
        }
        Ok(Self {
            cfg,
            public,
            stage: Stage::Stats,
            full_encoding: None,
            client_graphs: Vec::new(),
            shared: None,
            locals: Vec::new(),
            global_graph: None,
            means: Vec::new(),
            report: BTreeMap::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &FedNgmConfig {
        &self.cfg
    }

    /// Encoding of every column any client has (after the statistics round).
    pub fn full_encoding(&self) -> Option<&Encoding> {
        self.full_encoding.as_ref()
    }

    /// Each client's recovered graph by client id (FedNGR: no edges), after the graph round.
    pub fn client_graphs(&self) -> &[(usize, Graph)] {
        &self.client_graphs
    }

    /// The consensus graph (after the graph round).
    pub fn consensus(&self) -> Option<&Graph> {
        self.shared.as_ref().map(|s| &s.consensus)
    }

    /// The consensus features' encoding, the layout of every model (after the graph round).
    pub fn encoding(&self) -> Option<&Encoding> {
        self.shared.as_ref().map(|s| &s.encoding)
    }

    /// The model structure shared by every client and the server (after the graph round).
    pub fn ngm(&self) -> Option<&Ngm> {
        self.shared.as_ref().map(|s| &s.ngm)
    }

    /// The last model round's client models with their client ids and rows.
    pub fn locals(&self) -> &[(usize, Params, usize)] {
        &self.locals
    }

    /// The global graph once finished: the consensus (FedNGM) or read off the global weights
    /// (FedNGR).
    pub fn global_graph(&self) -> Option<&Graph> {
        self.global_graph.as_ref()
    }

    fn shared(&self) -> Result<&Shared> {
        self.shared
            .as_ref()
            .ok_or_else(|| FedError::InvalidSetting {
                field: "fedngm",
                reason: "no consensus yet: the graph round has not completed".into(),
            })
    }

    /// Splits a model reply into the model and its samples or summaries, checking every
    /// tensor's length, finiteness and the model's shape.
    fn model_reply(&self, record: &Record) -> std::result::Result<ModelReply, String> {
        let shared = self.shared().map_err(|e| e.to_string())?;
        let u = shared.ngm.units();
        let mut params = record.params.clone();
        let mut take = |name: &str, len: usize| -> std::result::Result<Vec<f32>, String> {
            let t = params
                .remove(name)
                .ok_or_else(|| format!("no `{name}` tensor"))?;
            if t.data.len() != len || t.data.iter().any(|v| !v.is_finite()) {
                return Err(format!(
                    "`{name}` must hold {len} finite values; it has {} (finite: {})",
                    t.data.len(),
                    t.data.iter().all(|v| v.is_finite())
                ));
            }
            Ok(t.data)
        };
        // Samples or summaries come out of the record first, so that what remains is the model.
        let drawn = match self.cfg.sample_at {
            SampleSite::Client => Drawn::Samples(take(SAMPLES, self.cfg.samples_per_client * u)?),
            SampleSite::Server => Drawn::Summary {
                means: take(MEANS, u)?,
                min: take(MIN, u)?,
                max: take(MAX, u)?,
                sd: take(RESIDUAL_SD, u)?,
            },
        };
        params.check_finite().map_err(|e| e.to_string())?;
        // A model of the wrong shape is rejected before anything else reads it.
        shared
            .ngm
            .predict(&params, &vec![0.0; u])
            .map_err(|e| e.to_string())?;
        if record.num_examples == 0 {
            return Err("a model trained on 0 rows".into());
        }
        Ok(ModelReply {
            params,
            drawn,
            loss: record.metrics.get(LOSS).copied().unwrap_or(f64::NAN),
        })
    }

    /// The server's step after the statistics round: one encoding of every column.
    fn merge_stats(&mut self, replies: &[Reply]) -> Result<()> {
        let stats = replies
            .iter()
            .map(|r| {
                json::<TableStats>(&r.record, TABLE_STATS).map_err(|reason| FedError::BadReply {
                    client: r.client,
                    reason,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let merged = Encoding::merge(&stats)?;
        self.report
            .insert("features".into(), merged.features().len() as f64);
        self.full_encoding = Some(merged);
        self.stage = Stage::Graphs;
        Ok(())
    }

    /// The server's step after the graph round: the consensus graph and the model structure.
    fn agree_consensus(&mut self, replies: &[Reply]) -> Result<()> {
        let graphs = replies
            .iter()
            .map(|r| {
                let graph = graph_from_record(&r.record).map_err(|reason| FedError::BadReply {
                    client: r.client,
                    reason,
                })?;
                Ok((r.client, graph))
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = self.shared_of(&graphs)?;
        self.report
            .insert("consensus_features".into(), shared.consensus.d() as f64);
        self.report.insert(
            "consensus_edges".into(),
            shared.consensus.num_edges() as f64,
        );
        self.client_graphs = graphs;
        self.shared = Some(shared);
        self.stage = Stage::Models(1);
        Ok(())
    }

    /// What the clients' graphs agree on: the consensus, its encoding, the model structure and
    /// the public rows in that encoding.
    fn shared_of(&self, graphs: &[(usize, Graph)]) -> Result<Shared> {
        let received: Vec<Graph> = graphs.iter().map(|(_, g)| g.clone()).collect();
        let consensus = consensus(&received)?;
        if consensus.d() == 0 {
            return Err(FedError::InvalidSetting {
                field: "clients",
                reason: "the clients share no feature, so there is no consensus graph; give \
                         every client the common columns"
                    .into(),
            });
        }
        let full = self
            .full_encoding
            .as_ref()
            .ok_or_else(|| FedError::InvalidSetting {
                field: "fedngm",
                reason: "graphs before statistics".into(),
            })?;
        let encoding = full.subset(consensus.features())?;
        let ngm = structure(self.cfg.variant, &encoding, &consensus)?;
        let public_x = match &self.public {
            Some(t) => Some(encoding.encode(t)?.x),
            None => None,
        };
        Ok(Shared {
            consensus,
            encoding,
            ngm,
            public_x,
        })
    }

    /// The server state after a round: where the protocol stands, the merged encoding, the
    /// clients' graphs (the consensus and model structure are rebuilt from them), the last
    /// round's client models, the global graph once finished, and the distillation samples'
    /// means that inference starts from.
    fn state(&self) -> Result<Record> {
        let saved = SavedState {
            stage: self.stage.name().into(),
            model_round: match self.stage {
                Stage::Models(r) => r,
                _ => 0,
            },
            full_encoding: self.full_encoding.clone(),
            client_graphs: self
                .client_graphs
                .iter()
                .map(|(c, g)| (*c, SavedGraph::of(g)))
                .collect(),
            locals: self.locals.iter().map(|(c, _, n)| (*c, *n)).collect(),
            global_graph: self.global_graph.as_ref().map(SavedGraph::of),
        };
        let mut state = Record::default().with_config(SAVED_STATE, to_json(&saved)?);
        for (client, params, _) in &self.locals {
            for (name, t) in params.iter() {
                state.params.push(
                    format!("local.{client}.{name}"),
                    t.shape.clone(),
                    t.data.clone(),
                )?;
            }
        }
        state
            .params
            .push("means", vec![self.means.len()], self.means.clone())?;
        Ok(state)
    }

    /// Restores [`FedNgm::state`].
    fn restore(&mut self, state: &Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("FedNGM state: {why}"),
        };
        let saved: SavedState = json(state, SAVED_STATE).map_err(bad)?;
        let stage = match (saved.stage.as_str(), saved.model_round) {
            (STATS, _) => Stage::Stats,
            (GRAPHS, _) => Stage::Graphs,
            (MODELS, r) if (1..=self.cfg.rounds).contains(&r) => Stage::Models(r),
            (DONE, _) => Stage::Done,
            (other, r) => return Err(bad(format!("stage `{other}` (model round {r})"))),
        };
        let graph = |g: SavedGraph| Graph::new(g.features, g.adj).map_err(|e| bad(e.to_string()));
        let client_graphs = saved
            .client_graphs
            .into_iter()
            .map(|(c, g)| Ok((c, graph(g)?)))
            .collect::<Result<Vec<_>>>()?;
        let global_graph = saved.global_graph.map(graph).transpose()?;
        let mut locals = Vec::with_capacity(saved.locals.len());
        for (client, rows) in saved.locals {
            let prefix = format!("local.{client}.");
            let mut params = Params::new();
            for (name, t) in state.params.iter() {
                if let Some(name) = name.strip_prefix(&prefix) {
                    params.push(name, t.shape.clone(), t.data.clone())?;
                }
            }
            locals.push((client, params, rows));
        }
        let means = state.params.require("means")?.data.clone();
        let needs_consensus = matches!(stage, Stage::Models(_) | Stage::Done);
        if needs_consensus && (saved.full_encoding.is_none() || client_graphs.is_empty()) {
            return Err(bad(
                "model rounds without an encoding and the clients' graphs".into(),
            ));
        }
        self.full_encoding = saved.full_encoding;
        self.shared = if needs_consensus {
            Some(self.shared_of(&client_graphs)?)
        } else {
            None
        };
        self.stage = stage;
        self.client_graphs = client_graphs;
        self.locals = locals;
        self.global_graph = global_graph;
        self.means = means;
        Ok(())
    }

    /// The server's step after model round `round`: samples, averaged targets, distillation.
    fn distil(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Params> {
        let cfg = &self.cfg;
        let shared = self.shared()?;
        let ngm = &shared.ngm;
        let u = ngm.units();
        let mut report = BTreeMap::new();
        let mut samples = Vec::new();
        let mut locals = Vec::with_capacity(replies.len());
        for r in replies {
            let bad = |reason: String| FedError::BadReply {
                client: r.client,
                reason,
            };
            // `check_reply` passed it; the split only moves the tensors apart.
            let reply = self.model_reply(&r.record).map_err(bad)?;
            let drawn = match reply.drawn {
                Drawn::Samples(s) => s,
                Drawn::Summary {
                    means,
                    min,
                    max,
                    sd,
                } => {
                    let marg = Marginals::from_summary(ngm, means, min, max)?
                        .with_residual_sd(sd)
                        .map_err(|e| bad(e.to_string()))?;
                    let sample = SampleConfig {
                        first: FirstDraw::Uniform,
                        ..cfg.sample
                    };
                    let mut rng =
                        StdRng::seed_from_u64(derive_seed(cfg.seed, round, 1_000_000 + r.client));
                    ngm.sample(
                        &reply.params,
                        &marg,
                        cfg.samples_per_client,
                        &sample,
                        &mut rng,
                    )?
                }
            };
            samples.extend_from_slice(&drawn);
            report.insert(format!("local_loss.{}", r.client), reply.loss);
            locals.push((r.client, reply.params, r.record.num_examples as usize));
        }
        let params: Vec<Params> = locals.iter().map(|(_, p, _)| p.clone()).collect();
        let examples: Vec<usize> = locals.iter().map(|&(_, _, n)| n).collect();
        let members = member_weights(&params, &examples, cfg.weighting);
        let sample_means = Marginals::from_data(ngm, &samples)?.means().to_vec();
        let drawn_rows = samples.len() / u;
        if cfg.masked_copies > 0 {
            let mut rng = StdRng::seed_from_u64(derive_seed(cfg.seed, round, usize::MAX - 1));
            add_masked_copies(
                ngm,
                &mut samples,
                &sample_means,
                cfg.masked_copies,
                &mut rng,
            );
        }
        let targets = match cfg.variant {
            FedNgmVariant::Ngm => ngm.average_predictions(&members, &samples)?,
            FedNgmVariant::Ngr => leak_free_average(ngm, &members, &samples, &sample_means)?,
        };
        let mut gcfg = cfg.global.clone();
        gcfg.hidden = cfg.local.hidden.clone();
        gcfg.seed = derive_seed(cfg.seed, round, usize::MAX);
        let distill = Distill {
            inputs: &samples,
            targets: &targets,
            public: shared.public_x.as_deref(),
            gamma: cfg.gamma.unwrap_or(1.0),
        };
        // Round 1 distils from scratch; later rounds refine the global model.
        let start = (round > 1 && !global.is_empty()).then_some(global);
        let fit = match cfg.variant {
            FedNgmVariant::Ngm => ngm.fit_distill(start, distill, &gcfg)?,
            FedNgmVariant::Ngr => ngm.fit_distill_ngr(start, distill, &gcfg)?,
        };
        report.insert("model_round".into(), round as f64);
        report.insert("samples".into(), drawn_rows as f64);
        report.insert(
            "distill_loss".into(),
            fit.val_loss.unwrap_or(fit.train_loss),
        );
        report.insert("penalty".into(), fit.penalty);
        let last = round == cfg.rounds;
        let global_graph = if last {
            let graph = match cfg.variant {
                FedNgmVariant::Ngm => shared.consensus.clone(),
                FedNgmVariant::Ngr => {
                    let g = ngr_graph(
                        &fit.params,
                        ngm.blocks(),
                        cfg.ngr_sparsity,
                        cfg.global.path,
                        cfg.graph.aggregate,
                    )?;
                    Graph::new(shared.consensus.features().to_vec(), g.adjacency().to_vec())?
                }
            };
            report.insert("global_edges".into(), graph.num_edges() as f64);
            Some(graph)
        } else {
            None
        };
        self.report = report;
        self.locals = locals;
        self.means = sample_means;
        self.global_graph = global_graph;
        self.stage = if last {
            Stage::Done
        } else {
            Stage::Models(round + 1)
        };
        Ok(fit.params)
    }

    /// The client's model round: trains its model (warm-started from the global one after
    /// round 1) and replies with the weights, plus samples or marginal summaries.
    fn fit_model(&self, instruction: Record, ctx: &TableContext<'_>) -> Result<Record> {
        let cfg = &self.cfg;
        let round = match instruction.config.get(MODEL_ROUND) {
            Some(ConfigValue::Int(r)) => usize::try_from(*r).ok(),
            _ => None,
        }
        .ok_or_else(|| bad_server(format!("no model round (`{MODEL_ROUND}`)")))?;
        let encoding: Encoding = json(&instruction, ENCODING).map_err(bad_server)?;
        let consensus = graph_from_record(&instruction).map_err(bad_server)?;
        let ngm = structure(cfg.variant, &encoding, &consensus)?;
        let mut start = instruction.params;
        start.remove(ADJACENCY);
        let start = (!start.is_empty()).then_some(start);
        let x = encoding.encode(ctx.table)?.x;
        // Seeds by model round, not the simulator's round, so that a client's training does
        // not depend on how many set-up rounds came first.
        let seed = derive_seed(cfg.seed, round, ctx.id);
        let local = NgmConfig {
            seed,
            ..cfg.local.clone()
        };
        let fit = match cfg.variant {
            FedNgmVariant::Ngm => ngm.fit(start.as_ref(), &x, &local)?,
            FedNgmVariant::Ngr => ngm.fit_ngr(start.as_ref(), &x, &local)?,
        };
        let u = ngm.units();
        let n = x.len() / u;
        let mut params = fit.params;
        let marg = Marginals::from_data(&ngm, &x)?.with_residuals(&ngm, &params)?;
        match cfg.sample_at {
            SampleSite::Client => {
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5A4D_504C);
                let s = ngm.sample(
                    &params,
                    &marg,
                    cfg.samples_per_client,
                    &cfg.sample,
                    &mut rng,
                )?;
                params.push(SAMPLES, vec![cfg.samples_per_client, u], s)?;
            }
            SampleSite::Server => {
                params.push(MEANS, vec![u], marg.means().to_vec())?;
                params.push(MIN, vec![u], marg.min().to_vec())?;
                params.push(MAX, vec![u], marg.max().to_vec())?;
                params.push(RESIDUAL_SD, vec![u], marg.residual_sd().to_vec())?;
            }
        }
        let mut rec = Record::from_params(params).with_num_examples(n as u64);
        rec.metrics
            .insert(LOSS.into(), fit.val_loss.unwrap_or(fit.train_loss));
        Ok(rec)
    }
}

impl Method for FedNgm {
    fn name(&self) -> &'static str {
        match self.cfg.variant {
            FedNgmVariant::Ngm => "fedngm",
            FedNgmVariant::Ngr => "fedngr",
        }
    }

    fn tabular(&self) -> bool {
        true
    }

    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let mut record = match self.stage {
            Stage::Stats | Stage::Done => Record::default(),
            Stage::Graphs => {
                let full = self.full_encoding.as_ref().ok_or_else(|| {
                    bad_server("the graph round before the statistics round".into())
                })?;
                Record::default().with_config(ENCODING, to_json(full)?)
            }
            Stage::Models(r) => {
                let shared = self.shared()?;
                let mut record = graph_record(&shared.consensus)?
                    .with_config(ENCODING, to_json(&shared.encoding)?)
                    .with_config(MODEL_ROUND, ConfigValue::Int(r as i64));
                // Warm start: every round after the first trains from the global model.
                if r > 1 {
                    for (name, t) in global.iter() {
                        record.params.push(name, t.shape.clone(), t.data.clone())?;
                    }
                }
                record
            }
        };
        record = record
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
            .with_config(STAGE, ConfigValue::Str(self.stage.name().into()));
        Ok(record)
    }

    fn fit(&self, _instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        Err(FedError::BadReply {
            client: ctx.id,
            reason: format!(
                "{} federates tables; this client holds labelled samples",
                self.name()
            ),
        })
    }

    fn fit_table(&self, instruction: Record, ctx: &TableContext<'_>) -> Result<Record> {
        let stage = match instruction.config.get(STAGE) {
            Some(ConfigValue::Str(s)) => s.clone(),
            _ => return Err(bad_server(format!("no stage (`{STAGE}`)"))),
        };
        if stage == DONE {
            return Ok(Record::default());
        }
        // Too few rows for a correlation matrix or a validation split, in any stage.
        if ctx.table.n_rows() < 2 {
            return Err(FedError::BadReply {
                client: ctx.id,
                reason: format!(
                    "has {} row(s); every client needs at least 2 to recover a graph and train \
                     a model",
                    ctx.table.n_rows()
                ),
            });
        }
        match stage.as_str() {
            STATS => Ok(Record::default().with_config(TABLE_STATS, to_json(&ctx.table.stats())?)),
            GRAPHS => {
                let full: Encoding = json(&instruction, ENCODING).map_err(bad_server)?;
                let graph = match self.cfg.variant {
                    FedNgmVariant::Ngm => {
                        let x = full.subset(ctx.table.names())?.encode(ctx.table)?;
                        recover_graph(&x.x, x.n, &x.blocks, &self.cfg.graph.recovery())?
                    }
                    FedNgmVariant::Ngr => {
                        let names = ctx.table.names().to_vec();
                        let d = names.len();
                        Graph::new(names, vec![false; d * d])?
                    }
                };
                graph_record(&graph)
            }
            MODELS => self.fit_model(instruction, ctx),
            other => Err(bad_server(format!("unknown stage `{other}`"))),
        }
    }

    fn weighs_by_examples(&self) -> bool {
        false
    }

    fn check_reply(&self, _global: &Params, reply: &Record) -> Result<()> {
        let checked = match self.stage {
            Stage::Stats => json::<TableStats>(reply, TABLE_STATS).map(drop),
            Stage::Graphs => graph_from_record(reply).map(drop),
            Stage::Models(_) => self.model_reply(reply).map(drop),
            Stage::Done => Ok(()),
        };
        checked.map_err(|reason| bad_reply(self.stage, reason))
    }

    fn aggregate(
        &mut self,
        _round: usize,
        global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        self.report.clear();
        match self.stage {
            Stage::Stats => self.merge_stats(replies)?,
            Stage::Graphs => self.agree_consensus(replies)?,
            Stage::Models(r) => return Ok(Aggregate::Replace(self.distil(r, global, replies)?)),
            Stage::Done => {}
        }
        Ok(Aggregate::Keep)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.report.clone()
    }

    fn save_state(&self) -> Option<Result<Record>> {
        Some(self.state())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        self.restore(&state)
    }

    /// Predicts every consensus feature of the test rows from all the others with the global
    /// model (message passing from the distillation samples' means): `rmse.<feature>` in the
    /// feature's units, or `accuracy.<feature>`.
    fn evaluate_table(&self, global: &Params, test: &Table) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        let Some(shared) = &self.shared else {
            return Ok(out);
        };
        if global.is_empty() || self.means.is_empty() {
            return Ok(out);
        }
        let infer = InferConfig {
            method: InferMethod::MessagePassing,
            lr: 1e-2,
            max_itr: 200,
            eps: 1e-10,
        };
        let test = test.select_columns(shared.consensus.features())?;
        for feature in shared.consensus.features() {
            let s = score_prediction(
                &shared.ngm,
                global,
                &shared.encoding,
                &test,
                feature,
                &[],
                &self.means,
                &infer,
            )?;
            if let Some(rmse) = s.rmse {
                out.insert(format!("rmse.{feature}"), rmse);
            }
            if let Some(acc) = s.accuracy {
                out.insert(format!("accuracy.{feature}"), acc);
            }
        }
        Ok(out)
    }

    fn finished(&self) -> bool {
        self.stage == Stage::Done
    }
}

/// The model structure over `encoding`'s blocks: the consensus graph (FedNGM) or the complete
/// graph (FedNGR, whose graph is learnt).
fn structure(variant: FedNgmVariant, encoding: &Encoding, consensus: &Graph) -> Result<Ngm> {
    let d = consensus.d();
    let graph = match variant {
        FedNgmVariant::Ngm => FeatureGraph::new(d, consensus.adj().to_vec())?,
        FedNgmVariant::Ngr => FeatureGraph::complete(d),
    };
    Ok(Ngm::new(encoding.blocks(), graph)?)
}

/// FedNGR's distillation targets: the weighted average of each client model's conditional
/// means ([`Ngm::conditional_predictions`]). An NGR's raw outputs partly copy each feature's
/// own input; a global model distilled onto those spends its path budget on the copies and
/// its cross-feature paths, which the graph is read from, become noise.
fn leak_free_average(
    ngm: &Ngm,
    members: &[(&Params, f64)],
    samples: &[f32],
    means: &[f32],
) -> Result<Vec<f32>> {
    let total: f64 = members.iter().map(|(_, a)| a).sum();
    let infer = InferConfig {
        method: InferMethod::MessagePassing,
        lr: 1e-2,
        max_itr: 100,
        eps: 1e-8,
    };
    let parts: Vec<Vec<f32>> = members
        .par_iter()
        .map(|(p, _)| ngm.conditional_predictions(p, samples, means, &infer))
        .collect::<std::result::Result<_, _>>()?;
    let mut avg = vec![0.0f32; samples.len()];
    for ((_, a), part) in members.iter().zip(&parts) {
        let w = (a / total) as f32;
        avg.iter_mut().zip(part).for_each(|(m, v)| *m += w * v);
    }
    Ok(avg)
}

/// Appends `copies` copies of every row of `rows`, each with the units of one feature block
/// (uniform over blocks) replaced by `means`.
fn add_masked_copies(
    ngm: &Ngm,
    rows: &mut Vec<f32>,
    means: &[f32],
    copies: usize,
    rng: &mut StdRng,
) {
    let u = ngm.units();
    let n = rows.len() / u;
    let blocks = ngm.blocks();
    rows.reserve(n * u * copies);
    for _ in 0..copies {
        for r in 0..n {
            let at = rows.len();
            rows.extend_from_within(r * u..(r + 1) * u);
            let range = blocks[rng.random_range(0..blocks.len())].range();
            rows[at + range.start..at + range.end].copy_from_slice(&means[range]);
        }
    }
}

fn bad_server(reason: String) -> FedError {
    FedError::BadMessage {
        from: "server".into(),
        reason,
    }
}

/// A reply that fails the server's checks (the simulator lists it under the client's id).
fn bad_reply(stage: Stage, reason: String) -> FedError {
    FedError::Core(CoreError::Decode {
        what: format!("FedNGM {} reply", stage.name()),
        reason,
    })
}

/// The JSON text `key` of `record`, read as a `T`; the error is the reason.
fn json<T: serde::de::DeserializeOwned>(
    record: &Record,
    key: &str,
) -> std::result::Result<T, String> {
    match record.config.get(key) {
        Some(ConfigValue::Str(s)) => serde_json::from_str(s).map_err(|e| format!("`{key}`: {e}")),
        _ => Err(format!("no `{key}` text")),
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<ConfigValue> {
    serde_json::to_string(value)
        .map(ConfigValue::Str)
        .map_err(|e| FedError::InvalidSetting {
            field: "message",
            reason: format!("cannot serialise: {e}"),
        })
}

/// A graph as a message: its feature names and its adjacency as a sparse 0/1 tensor.
fn graph_record(graph: &Graph) -> Result<Record> {
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
fn graph_from_record(record: &Record) -> std::result::Result<Graph, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ngm_keys_take_fedngm_defaults_and_unknown_keys_fail() {
        let cfg: FedNgmConfig =
            serde_json::from_str(r#"{"local": {"lambda": 0.1}, "rounds": 2}"#).unwrap();
        assert_eq!(cfg.local.lambda, 0.1);
        assert_eq!(cfg.local.hidden, vec![64]);
        assert_eq!(cfg.local.epochs, 1000);
        assert_eq!(cfg.global, fedngm_ngm_defaults());
        assert_eq!((cfg.global.path, cfg.global.lambda), (PathNorm::Raw, 0.01));
        assert_eq!(cfg.rounds, 2);
        let err = serde_json::from_str::<FedNgmConfig>(r#"{"local": {"lamda": 0.1}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lamda"), "{err}");
        // A partial sampling table keeps FedNGM's residual noise.
        let cfg: FedNgmConfig = serde_json::from_str(r#"{"sample": {"gibbs_sweeps": 3}}"#).unwrap();
        assert_eq!(cfg.sample.gibbs_sweeps, 3);
        assert_eq!(cfg.sample.noise, SampleNoise::Residual);
        assert!(serde_json::from_str::<FedNgmConfig>(r#"{"sample": {"sweeps": 3}}"#).is_err());
    }

    #[test]
    fn fedngr_defaults_to_its_variant_and_raw_paths() {
        let ngr: FedNgrConfig = serde_json::from_str(r#"{"local": {"lambda": 0.05}}"#).unwrap();
        assert_eq!(ngr.0.variant, FedNgmVariant::Ngr);
        assert_eq!(ngr.0.local.path, PathNorm::Raw);
        assert_eq!(ngr.0.global.path, PathNorm::Raw);
        assert_eq!(ngr.0.local.lambda, 0.05);
        ngr.0.check().unwrap();
        let err = serde_json::from_str::<FedNgrConfig>(r#"{"variant": "ngm"}"#).unwrap_err();
        assert!(err.to_string().contains("fedngm"), "{err}");
        // What it writes, it reads back.
        let again: FedNgrConfig =
            serde_json::from_str(&serde_json::to_string(&ngr).unwrap()).unwrap();
        assert_eq!(again, ngr);
    }

    #[test]
    fn each_masked_copy_sets_exactly_one_feature_block_to_the_means() {
        let t = Table::new(vec![
            ("a".into(), fedfuse_data::Column::Real(vec![0.0, 1.0])),
            ("c".into(), fedfuse_data::Column::categorical(&["x", "y"])),
        ])
        .unwrap();
        let encoding = Encoding::merge(&[t.stats()]).unwrap();
        let graph = Graph::new(vec!["a".into(), "c".into()], vec![false; 4]).unwrap();
        let ngm = structure(FedNgmVariant::Ngm, &encoding, &graph).unwrap();
        assert_eq!(ngm.units(), 3, "one real unit, two one-hot units");
        let rows = vec![1.0, 0.0, 1.0, 2.0, 1.0, 0.0, 3.0, 0.0, 1.0];
        let means = [9.0, 0.25, 0.75];
        let mut aug = rows.clone();
        let mut rng = StdRng::seed_from_u64(7);
        add_masked_copies(&ngm, &mut aug, &means, 4, &mut rng);
        assert_eq!(aug.len(), rows.len() * 5);
        assert_eq!(
            aug[..rows.len()],
            rows[..],
            "the samples come first, untouched"
        );
        let mut masked = [0usize; 2];
        for (k, copy) in aug[rows.len()..].chunks(3).enumerate() {
            let row = &rows[(k % 3) * 3..(k % 3 + 1) * 3];
            let block = if copy[0] == 9.0 { 0 } else { 1 };
            masked[block] += 1;
            let (kept, set) = if block == 0 {
                (1..3, 0..1)
            } else {
                (0..1, 1..3)
            };
            assert_eq!(copy[kept.clone()], row[kept], "copy {k}");
            assert_eq!(copy[set.clone()], means[set], "copy {k}");
        }
        // Both blocks are drawn (12 draws; each block has probability 1/2).
        assert!(masked[0] > 0 && masked[1] > 0, "{masked:?}");
    }

    #[test]
    fn a_model_reply_with_bad_samples_is_refused_with_the_reason() {
        let mut m = FedNgm::new(FedNgmConfig::default(), None).unwrap();
        let consensus = Graph::new(vec!["a".into(), "b".into()], vec![false; 4]).unwrap();
        let t = Table::new(vec![
            ("a".into(), fedfuse_data::Column::Real(vec![0.0, 1.0])),
            ("b".into(), fedfuse_data::Column::Real(vec![1.0, 0.0])),
        ])
        .unwrap();
        let encoding = Encoding::merge(&[t.stats()]).unwrap();
        m.shared = Some(Shared {
            ngm: structure(FedNgmVariant::Ngm, &encoding, &consensus).unwrap(),
            consensus,
            encoding,
            public_x: None,
        });
        m.stage = Stage::Models(1);
        let mut params = m.ngm().unwrap().init(&[4], 0).unwrap();
        params.push(SAMPLES, vec![3], vec![0.0; 3]).unwrap();
        let reply = Record::from_params(params).with_num_examples(2);
        let err = m
            .check_reply(&Params::new(), &reply)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`samples` must hold 4000"), "{err}");
    }
}
