//! FedNGM and FedNGR (note 1.7): federated neural graphical models over mixed-type tables.
//!
//! One run, in the order of the protocol (every message an encoded [`Record`], so the traffic
//! figures are real message sizes):
//! 1. **Shared preprocessing.** Clients send column statistics ([`TableStats`]); the server
//!    merges them into one normalisation and one-hot vocabulary ([`Encoding::merge`]).
//! 2. **Graphs.** Each client recovers a feature graph from its own encoded rows
//!    ([`recover_graph`]: graphical lasso, top fraction of pairs) and sends it. The server
//!    forms the consensus graph ([`consensus`]: features every client has, union of edges).
//!    FedNGR sends feature lists only: its graph is learnt.
//! 3. **Local models.** Each client trains an NGM on the consensus features under the
//!    consensus graph (FedNGR: an NGR, complete graph and sparsity penalty), warm-started from
//!    the global model after the first round, and sends its weights.
//! 4. **Global model.** Samples are drawn from every client model (Algorithm 3; by the client
//!    from its own data's marginals, or by the server from summaries), the server averages
//!    the client models' outputs on them (weights uniform or by examples) and distils one
//!    global NGM of the same, constant size onto that average, plus `gamma` times the
//!    reconstruction loss on optional public rows. FedNGR reads the global graph off the
//!    distilled weights ([`ngr_graph`]).
//! 5. Further rounds repeat 3-4.
//!
//! [`stitch_client`] then extends the global model with a client's own features.

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_data::{Column, Encoding, Table, TableStats};
use fedfuse_fuse::{Graph, GraphRecovery, consensus, recover_graph};
use fedfuse_train::{
    BlockAggregate, Distill, FeatureGraph, FirstDraw, InferConfig, Known, Marginals, Ngm,
    NgmConfig, NgmFit, PathNorm, SampleConfig, SampleNoise, StitchConfig, ngr_graph,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::{FedError, Result, derive_seed};

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

/// Settings of a FedNGM run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedNgmConfig {
    /// FedNGM or FedNGR.
    pub variant: FedNgmVariant,
    /// Client graph recovery (FedNGM only).
    pub graph: GraphSettings,
    /// Local training. Its `hidden` fixes the architecture of every model, the global one
    /// included; its `seed` is ignored (derived from [`seed`](Self::seed) per client and
    /// round). Keys left out of a config file take FedNGM's defaults (one hidden layer of
    /// 64, 1000 epochs, lr 0.01), not those of a bare NGM.
    #[serde(deserialize_with = "ngm_over_defaults")]
    pub local: NgmConfig,
    /// The server's distillation. `hidden` and `seed` are ignored as for `local`; missing
    /// keys default as for `local`.
    #[serde(deserialize_with = "ngm_over_defaults")]
    pub global: NgmConfig,
    /// Rounds of local training and distillation; rounds after the first warm-start the
    /// clients from the global model.
    pub rounds: usize,
    /// Samples drawn from each client's model per round.
    pub samples_per_client: usize,
    /// Who draws them.
    pub sample_at: SampleSite,
    /// Sampling (Algorithm 3). With `sample_at = "server"`, `first` is always `uniform`. The
    /// default noise is `residual` (each real value strays from its conditional mean by the
    /// model's residual spread), not the reference code's 5% relative noise, whose samples
    /// are far narrower than the data, so a model distilled on them extrapolates on real rows.
    pub sample: SampleConfig,
    /// Weights of the client models in the distillation targets.
    pub weighting: ClientWeighting,
    /// Weight of the reconstruction loss on public rows, when there are any.
    pub gamma: f64,
    /// FedNGR: fraction of feature pairs read off the global weights as edges.
    pub ngr_sparsity: f64,
    /// Seeds every random choice of the run.
    pub seed: u64,
}

/// FedNGM's NGM training defaults: one hidden layer of 64, 1000 full-batch epochs at lr
/// 0.01 (the reference code's two layers of 20 at lr 0.001 for 1200 epochs underfit here).
fn fedngm_ngm_defaults() -> NgmConfig {
    NgmConfig {
        hidden: vec![64],
        epochs: 1000,
        lr: 1e-2,
        ..NgmConfig::default()
    }
}

/// Reads an [`NgmConfig`] whose missing keys come from [`fedngm_ngm_defaults`] (unknown keys
/// are still refused).
fn ngm_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<NgmConfig, D::Error> {
    use serde::de::Error;
    let given = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    let mut merged = match serde_json::to_value(fedngm_ngm_defaults()) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(D::Error::custom("cannot lay out the NGM defaults")),
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
            sample: SampleConfig {
                noise: SampleNoise::Residual,
                ..SampleConfig::default()
            },
            weighting: ClientWeighting::Uniform,
            gamma: 1.0,
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
        if !(self.gamma.is_finite() && self.gamma >= 0.0) {
            return bad("fedngm.gamma", format!("{} is not >= 0", self.gamma));
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
}

/// A client's data for [`run_fedngm`].
#[derive(Clone, Copy, Debug)]
pub struct FedNgmClient<'a> {
    /// Name, for messages.
    pub name: &'a str,
    /// Its rows: any columns; the consensus features must be among them.
    pub table: &'a Table,
}

/// Bytes on the wire, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Column statistics and graphs, client to server.
    pub setup_up: u64,
    /// The shared encoding and the consensus graph, server to clients.
    pub setup_down: u64,
    /// Client models (and samples or summaries), every round.
    pub model_up: u64,
    /// Global models, server to clients (warm starts and the final model).
    pub model_down: u64,
}

/// One round of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FedNgmRound {
    /// From 1.
    pub round: usize,
    /// Each client's held-out regression loss at its selected epoch (training loss when it
    /// holds nothing out).
    pub local_loss: Vec<f64>,
    /// Distillation samples the global model was fitted on.
    pub samples: usize,
    /// The global model's loss against the averaged outputs, on held-out samples when the
    /// distillation holds some out.
    pub distill_loss: f64,
    /// The global model's structure penalty.
    pub penalty: f64,
    /// Bytes up this round.
    pub bytes_up: u64,
    /// Bytes down this round (the warm start it began with).
    pub bytes_down: u64,
}

/// What a run produces.
#[derive(Clone, Debug)]
pub struct FedNgmRun {
    /// Encoding of every column any client has (for stitching).
    pub full_encoding: Encoding,
    /// The shared encoding of the consensus features, the layout of every model.
    pub encoding: Encoding,
    /// Each client's recovered graph (FedNGR: no edges).
    pub client_graphs: Vec<Graph>,
    /// Consensus features and (FedNGM) edges.
    pub consensus: Graph,
    /// The model structure shared by every client and the server.
    pub ngm: Ngm,
    /// The client models of the last round.
    pub locals: Vec<Params>,
    /// Rows each client trained on.
    pub examples: Vec<usize>,
    /// The global model.
    pub global: Params,
    /// The global graph: the consensus graph (FedNGM) or read off the global weights (FedNGR).
    pub global_graph: Graph,
    /// Per round.
    pub rounds: Vec<FedNgmRound>,
    /// Bytes on the wire.
    pub traffic: Traffic,
}

impl FedNgmRun {
    /// The client models with the weights the run averaged them with.
    pub fn members(&self, weighting: ClientWeighting) -> Vec<(&Params, f64)> {
        member_weights(&self.locals, &self.examples, weighting)
    }
}

/// Client models paired with their averaging weights `a_c` (unnormalised).
fn member_weights<'a>(
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

const TABLE_STATS: &str = "table_stats";
const ENCODING: &str = "encoding";
const FEATURES: &str = "features";
const ADJACENCY: &str = "adjacency";
const SAMPLES: &str = "samples";
const MEANS: &str = "marginals.means";
const MIN: &str = "marginals.min";
const MAX: &str = "marginals.max";
const RESIDUAL_SD: &str = "marginals.residual_sd";

/// Encodes a message and decodes it again on the receiving side, counting its bytes.
fn transmit(record: &Record, counter: &mut u64, from: &str) -> Result<Record> {
    let bytes = record.encode()?;
    *counter += bytes.len() as u64;
    Record::decode(&bytes).map_err(|e| FedError::BadMessage {
        from: from.to_string(),
        reason: e.to_string(),
    })
}

fn text(record: &Record, key: &str, from: &str) -> Result<String> {
    match record.config.get(key) {
        Some(ConfigValue::Str(s)) => Ok(s.clone()),
        _ => Err(FedError::BadMessage {
            from: from.to_string(),
            reason: format!("no `{key}` text"),
        }),
    }
}

fn json<T: serde::de::DeserializeOwned>(record: &Record, key: &str, from: &str) -> Result<T> {
    serde_json::from_str(&text(record, key, from)?).map_err(|e| FedError::BadMessage {
        from: from.to_string(),
        reason: format!("`{key}`: {e}"),
    })
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

fn graph_from_record(record: &Record, from: &str) -> Result<Graph> {
    let features: Vec<String> = json(record, FEATURES, from)?;
    let bad = |reason: String| FedError::BadMessage {
        from: from.to_string(),
        reason,
    };
    let adj = record
        .params
        .get(ADJACENCY)
        .ok_or_else(|| bad(format!("no `{ADJACENCY}` tensor")))?;
    let d = features.len();
    if adj.shape != [d, d] {
        return Err(bad(format!(
            "adjacency of shape {:?} for {d} features",
            adj.shape
        )));
    }
    Graph::new(features, adj.data.iter().map(|&v| v != 0.0).collect())
        .map_err(|e| bad(e.to_string()))
}

/// The tensor `name` of a reply, checked to hold `len` finite values.
fn reply_tensor(record: &Record, name: &str, len: usize, client: usize) -> Result<Vec<f32>> {
    let t = record.params.get(name).ok_or_else(|| FedError::BadReply {
        client,
        reason: format!("no `{name}` tensor"),
    })?;
    if t.data.len() != len || t.data.iter().any(|v| !v.is_finite()) {
        return Err(FedError::BadReply {
            client,
            reason: format!(
                "`{name}` must hold {len} finite values; it has {} (finite: {})",
                t.data.len(),
                t.data.iter().all(|v| v.is_finite())
            ),
        });
    }
    Ok(t.data.clone())
}

/// Runs FedNGM (or FedNGR) over `clients`, with optional `public` rows for the server's
/// distillation. `progress` is called after each round.
pub fn run_fedngm(
    clients: &[FedNgmClient<'_>],
    public: Option<&Table>,
    cfg: &FedNgmConfig,
    progress: &(dyn Fn(&FedNgmRound) + Sync),
) -> Result<FedNgmRun> {
    cfg.check()?;
    if clients.is_empty() {
        return Err(FedError::InvalidSetting {
            field: "clients",
            reason: "no clients; FedNGM needs at least one".into(),
        });
    }
    if let Some(c) = clients.iter().find(|c| c.table.n_rows() < 2) {
        return Err(FedError::InvalidSetting {
            field: "clients",
            reason: format!(
                "client `{}` has {} row(s); every client needs at least 2 to recover a graph \
                 and train a model",
                c.name,
                c.table.n_rows()
            ),
        });
    }
    let n_clients = clients.len() as u64;
    let mut traffic = Traffic::default();

    // 1. Shared preprocessing.
    let mut stats = Vec::with_capacity(clients.len());
    for c in clients {
        let rec = Record::default().with_config(TABLE_STATS, to_json(&c.table.stats())?);
        let got = transmit(&rec, &mut traffic.setup_up, c.name)?;
        stats.push(json::<TableStats>(&got, TABLE_STATS, c.name)?);
    }
    let full_encoding = Encoding::merge(&stats)?;
    let down = Record::default().with_config(ENCODING, to_json(&full_encoding)?);
    let mut one = 0u64;
    let full_encoding: Encoding = json(&transmit(&down, &mut one, "server")?, ENCODING, "server")?;
    traffic.setup_down += one * n_clients;

    // 2. Graphs (clients in parallel), then the consensus.
    let client_graphs: Vec<Graph> = clients
        .par_iter()
        .map(|c| -> Result<Graph> {
            match cfg.variant {
                FedNgmVariant::Ngm => {
                    let x = full_encoding.subset(c.table.names())?.encode(c.table)?;
                    Ok(recover_graph(&x.x, x.n, &x.blocks, &cfg.graph.recovery())?)
                }
                FedNgmVariant::Ngr => {
                    let names: Vec<String> = c.table.names().to_vec();
                    let d = names.len();
                    Ok(Graph::new(names, vec![false; d * d])?)
                }
            }
        })
        .collect::<Result<_>>()?;
    let mut received = Vec::with_capacity(clients.len());
    for (c, g) in clients.iter().zip(&client_graphs) {
        let got = transmit(&graph_record(g)?, &mut traffic.setup_up, c.name)?;
        received.push(graph_from_record(&got, c.name)?);
    }
    let consensus = consensus(&received)?;
    if consensus.d() == 0 {
        return Err(FedError::InvalidSetting {
            field: "clients",
            reason: "the clients share no feature, so there is no consensus graph; give every \
                     client the common columns"
                .into(),
        });
    }
    let mut one = 0u64;
    let consensus = graph_from_record(
        &transmit(&graph_record(&consensus)?, &mut one, "server")?,
        "server",
    )?;
    traffic.setup_down += one * n_clients;

    let encoding = full_encoding.subset(consensus.features())?;
    let d = consensus.d();
    let feature_graph = match cfg.variant {
        FedNgmVariant::Ngm => FeatureGraph::new(d, consensus.adj().to_vec())?,
        FedNgmVariant::Ngr => FeatureGraph::complete(d),
    };
    let ngm = Ngm::new(encoding.blocks(), feature_graph)?;
    let u = ngm.units();
    let data: Vec<Vec<f32>> = clients
        .iter()
        .map(|c| Ok(encoding.encode(c.table)?.x))
        .collect::<Result<_>>()?;
    let examples: Vec<usize> = clients.iter().map(|c| c.table.n_rows()).collect();
    let public_x = public.map(|t| encoding.encode(t)).transpose()?;

    // 3-5. Rounds.
    let mut global: Option<Params> = None;
    let mut locals = Vec::new();
    let mut rounds = Vec::with_capacity(cfg.rounds);
    for round in 1..=cfg.rounds {
        let (up0, down0) = (traffic.model_up, traffic.model_down);
        let start = match &global {
            Some(g) => {
                let mut one = 0u64;
                let got = transmit(&Record::from_params(g.clone()), &mut one, "server")?;
                traffic.model_down += one * n_clients;
                Some(got.params)
            }
            None => None,
        };
        let replies: Vec<Vec<u8>> = clients
            .par_iter()
            .zip(&data)
            .enumerate()
            .map(|(i, (_c, x))| client_round(&ngm, start.as_ref(), x, cfg, round, i))
            .collect::<Result<_>>()?;
        let mut samples = Vec::new();
        let mut local_loss = Vec::with_capacity(clients.len());
        locals.clear();
        for (i, bytes) in replies.iter().enumerate() {
            traffic.model_up += bytes.len() as u64;
            let mut rec = Record::decode(bytes).map_err(|e| FedError::BadReply {
                client: i,
                reason: e.to_string(),
            })?;
            // Samples (client site) or summaries (server site) come out of the record first,
            // so that what remains is the model.
            let mut drawn = Vec::new();
            let mut summary = None;
            match cfg.sample_at {
                SampleSite::Client => {
                    drawn = reply_tensor(&rec, SAMPLES, cfg.samples_per_client * u, i)?;
                    rec.params.remove(SAMPLES);
                }
                SampleSite::Server => {
                    let [means, min, max, sd] = [MEANS, MIN, MAX, RESIDUAL_SD].map(|name| {
                        let t = reply_tensor(&rec, name, u, i);
                        rec.params.remove(name);
                        t
                    });
                    summary = Some((means?, min?, max?, sd?));
                }
            }
            let params = rec.params;
            let bad = |e: String| FedError::BadReply {
                client: i,
                reason: e,
            };
            params.check_finite().map_err(|e| bad(e.to_string()))?;
            // A model of the wrong shape is rejected before anything else reads it.
            ngm.predict(&params, &vec![0.0; u])
                .map_err(|e| bad(e.to_string()))?;
            if let Some((means, min, max, sd)) = summary {
                let marg = Marginals::from_summary(&ngm, means, min, max)?
                    .with_residual_sd(sd)
                    .map_err(|e| bad(e.to_string()))?;
                let sample = SampleConfig {
                    first: FirstDraw::Uniform,
                    ..cfg.sample
                };
                let mut rng = StdRng::seed_from_u64(derive_seed(cfg.seed, round, 1_000_000 + i));
                drawn = ngm.sample(&params, &marg, cfg.samples_per_client, &sample, &mut rng)?;
            }
            samples.extend_from_slice(&drawn);
            local_loss.push(rec.metrics.get("loss").copied().unwrap_or(f64::NAN));
            locals.push(params);
        }
        let members = member_weights(&locals, &examples, cfg.weighting);
        let targets = match cfg.variant {
            FedNgmVariant::Ngm => ngm.average_predictions(&members, &samples)?,
            FedNgmVariant::Ngr => {
                let start = Marginals::from_data(&ngm, &samples)?;
                leak_free_average(&ngm, &members, &samples, start.means())?
            }
        };
        let mut gcfg = cfg.global.clone();
        gcfg.hidden = cfg.local.hidden.clone();
        gcfg.seed = derive_seed(cfg.seed, round, usize::MAX);
        let distill = Distill {
            inputs: &samples,
            targets: &targets,
            public: public_x.as_ref().map(|p| p.x.as_slice()),
            gamma: cfg.gamma,
        };
        let fit = match cfg.variant {
            FedNgmVariant::Ngm => ngm.fit_distill(global.as_ref(), distill, &gcfg)?,
            FedNgmVariant::Ngr => ngm.fit_distill_ngr(global.as_ref(), distill, &gcfg)?,
        };
        let log = FedNgmRound {
            round,
            local_loss,
            samples: samples.len() / u,
            distill_loss: fit.val_loss.unwrap_or(fit.train_loss),
            penalty: fit.penalty,
            bytes_up: traffic.model_up - up0,
            bytes_down: traffic.model_down - down0,
        };
        progress(&log);
        rounds.push(log);
        global = Some(fit.params);
    }
    let Some(global) = global else {
        return Err(FedError::InvalidSetting {
            field: "fedngm.rounds",
            reason: "0 rounds; use at least 1".into(),
        });
    };
    // The final model goes to every client.
    let mut one = 0u64;
    transmit(&Record::from_params(global.clone()), &mut one, "server")?;
    traffic.model_down += one * n_clients;

    let global_graph = match cfg.variant {
        FedNgmVariant::Ngm => consensus.clone(),
        FedNgmVariant::Ngr => {
            let g = ngr_graph(
                &global,
                ngm.blocks(),
                cfg.ngr_sparsity,
                cfg.global.path,
                cfg.graph.aggregate,
            )?;
            Graph::new(consensus.features().to_vec(), g.adjacency().to_vec())?
        }
    };
    Ok(FedNgmRun {
        full_encoding,
        encoding,
        client_graphs,
        consensus,
        ngm,
        locals,
        examples,
        global,
        global_graph,
        rounds,
        traffic,
    })
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
        method: fedfuse_train::InferMethod::MessagePassing,
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

/// A client's round: trains its model (warm-started from the global one after round 1) and
/// encodes its reply: the weights, plus samples or marginal summaries.
fn client_round(
    ngm: &Ngm,
    start: Option<&Params>,
    x: &[f32],
    cfg: &FedNgmConfig,
    round: usize,
    client: usize,
) -> Result<Vec<u8>> {
    let seed = derive_seed(cfg.seed, round, client);
    let local = NgmConfig {
        seed,
        ..cfg.local.clone()
    };
    let fit = match cfg.variant {
        FedNgmVariant::Ngm => ngm.fit(start, x, &local)?,
        FedNgmVariant::Ngr => ngm.fit_ngr(start, x, &local)?,
    };
    let u = ngm.units();
    let n = x.len() / u;
    let mut params = fit.params;
    let marg = Marginals::from_data(ngm, x)?.with_residuals(ngm, &params)?;
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
        .insert("loss".into(), fit.val_loss.unwrap_or(fit.train_loss));
    Ok(rec.encode()?)
}

/// A client's stitched model.
#[derive(Clone, Debug)]
pub struct Stitched {
    /// The extended layout: the consensus features, then the client's extras.
    pub encoding: Encoding,
    /// The extended structure (global graph plus the client's edges touching an extra).
    pub ngm: Ngm,
    /// The trained extended model.
    pub fit: NgmFit,
}

/// Stitching (note 1.7, step 7), on the client: extends the global model of `run` with
/// `extras` (columns of `table` outside the consensus) and trains the new connections on
/// `table` (`cfg.mode`: frozen global part, or fine-tuning everything). The extended graph is
/// the global graph plus the edges touching an extra in the client's own recovered graph
/// (`graph`), recovered over the consensus features and the extras together.
pub fn stitch_client(
    run: &FedNgmRun,
    table: &Table,
    extras: &[String],
    graph: &GraphSettings,
    cfg: &StitchConfig,
) -> Result<Stitched> {
    if extras.is_empty() {
        return Err(FedError::InvalidSetting {
            field: "stitch.extras",
            reason: "no extra features to stitch".into(),
        });
    }
    if let Some(e) = extras.iter().find(|e| run.consensus.index(e).is_some()) {
        return Err(FedError::InvalidSetting {
            field: "stitch.extras",
            reason: format!("`{e}` is already a global feature; stitch only client-only columns"),
        });
    }
    let names: Vec<String> = run
        .consensus
        .features()
        .iter()
        .chain(extras)
        .cloned()
        .collect();
    let encoding = run.full_encoding.subset(&names)?;
    let x = encoding.encode(table)?;
    let local = recover_graph(&x.x, x.n, &x.blocks, &graph.recovery())?;
    let d = names.len();
    let d_g = run.consensus.d();
    let mut adj = vec![false; d * d];
    for i in 0..d {
        for j in 0..d {
            adj[i * d + j] = if i < d_g && j < d_g {
                run.global_graph.has_edge_between(&names[i], &names[j])
            } else {
                local.has_edge(i, j)
            };
        }
    }
    let ngm = Ngm::new(x.blocks.clone(), FeatureGraph::new(d, adj)?)?;
    let fit = ngm.stitch(&run.global, run.ngm.blocks(), &x.x, cfg)?;
    Ok(Stitched { encoding, ngm, fit })
}

/// How well one feature is predicted from evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictionScore {
    /// The predicted feature.
    pub feature: String,
    /// Rows scored.
    pub rows: usize,
    /// Real feature: root mean squared error, in the feature's own units.
    pub rmse: Option<f64>,
    /// Real feature: mean absolute error, in the feature's own units.
    pub mae: Option<f64>,
    /// Categorical feature: share of rows whose most probable level is the true one.
    pub accuracy: Option<f64>,
}

/// Scores predictions of `target` given as encoded rows `predicted` (`n x width` of
/// `encoding`; only the target's block is read) against the rows of `test`: reals decoded to
/// their own units, categoricals by their most probable level.
pub fn score_rows(
    encoding: &Encoding,
    target: &str,
    predicted: &[f32],
    test: &Table,
) -> Result<PredictionScore> {
    let one = encoding.subset(&[target])?;
    let block = encoding
        .blocks()
        .into_iter()
        .find(|b| b.name == target)
        .ok_or_else(|| FedError::InvalidSetting {
            field: "target",
            reason: format!("`{target}` is not a feature of the model"),
        })?;
    let n = test.n_rows();
    let w = encoding.width();
    if predicted.len() != n * w {
        return Err(FedError::InvalidSetting {
            field: "predicted",
            reason: format!("{} values for {n} rows of {w} units", predicted.len()),
        });
    }
    let cut: Vec<f32> = predicted
        .chunks_exact(w)
        .flat_map(|r| r[block.range()].iter().copied())
        .collect();
    let pred = one.decode(&cut, n)?;
    let missing = || FedError::InvalidSetting {
        field: "target",
        reason: format!("the test rows have no column `{target}`"),
    };
    let (p, t) = (
        pred.column(target).ok_or_else(missing)?,
        test.column(target).ok_or_else(missing)?,
    );
    let mut score = PredictionScore {
        feature: target.to_string(),
        rows: n,
        rmse: None,
        mae: None,
        accuracy: None,
    };
    match (p, t) {
        (Column::Real(p), Column::Real(t)) => {
            let (mut se, mut ae) = (0.0f64, 0.0f64);
            for (a, b) in p.iter().zip(t) {
                let e = f64::from(*a) - f64::from(*b);
                se += e * e;
                ae += e.abs();
            }
            score.rmse = Some((se / n as f64).sqrt());
            score.mae = Some(ae / n as f64);
        }
        _ => {
            let hits = (0..n)
                .filter(|&r| p.level(r).is_some() && p.level(r) == t.level(r))
                .count();
            score.accuracy = Some(hits as f64 / n as f64);
        }
    }
    Ok(score)
}

/// Predicts `target` on every row of `test` with `params` of `ngm` (laid out by `encoding`),
/// every other feature known except those in `hidden` (e.g. a column derived from the
/// target), by `infer` (message passing gives conditional means) from the starting point
/// `means`, and scores it with [`score_rows`].
#[allow(clippy::too_many_arguments)]
pub fn score_prediction(
    ngm: &Ngm,
    params: &Params,
    encoding: &Encoding,
    test: &Table,
    target: &str,
    hidden: &[String],
    means: &[f32],
    infer: &InferConfig,
) -> Result<PredictionScore> {
    let x = encoding.encode(test)?;
    let mut known = vec![true; ngm.units()];
    for b in ngm
        .blocks()
        .iter()
        .filter(|b| b.name == target || hidden.contains(&b.name))
    {
        known[b.range()].iter_mut().for_each(|k| *k = false);
    }
    let inf = ngm.infer(params, &x.x, Known::Units(&known), means, infer)?;
    score_rows(encoding, target, &inf.x, test)
}

/// The no-model baseline: every test row predicted by the training mean (real) or most
/// frequent level (categorical), i.e. `means` read as a prediction.
pub fn score_marginal(
    encoding: &Encoding,
    target: &str,
    means: &[f32],
    test: &Table,
) -> Result<PredictionScore> {
    let rows: Vec<f32> = means
        .iter()
        .copied()
        .cycle()
        .take(test.n_rows() * means.len())
        .collect();
    score_rows(encoding, target, &rows, test)
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
        assert_eq!(cfg.rounds, 2);
        let err = serde_json::from_str::<FedNgmConfig>(r#"{"local": {"lamda": 0.1}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lamda"), "{err}");
    }
}
