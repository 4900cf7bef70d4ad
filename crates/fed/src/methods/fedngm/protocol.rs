//! FedNGM and FedNGR as a [`Method`] over tabular clients: rounds are the protocol's stages,
//! as GEMS's rounds are its layers (the module above describes the protocol).
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

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_data::{Encoding, Table, TableStats};
use fedfuse_fuse::{Graph, consensus, recover_graph};
use fedfuse_train::{
    Distill, FeatureGraph, FirstDraw, InferConfig, InferMethod, Marginals, Ngm, NgmConfig,
    SampleConfig,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;

use super::records::{
    ADJACENCY, DONE, ENCODING, GRAPHS, LOSS, MAX, MEANS, MIN, MODEL_ROUND, MODELS, RESIDUAL_SD,
    SAMPLES, SAVED_STATE, STAGE, STATS, SavedGraph, SavedState, Stage, TABLE_STATS, bad_reply,
    bad_server, graph_from_record, graph_record, json, to_json,
};
use super::run::read_ngr_graph;
use super::scoring::score_prediction;
use super::settings::{FedNgmConfig, FedNgmVariant, SampleSite, member_weights};
use crate::method::{SERVER_ROUND, TableContext};
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};
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

/// FedNGM (or FedNGR) in the federation; build it with [`FedNgm::new`] and run it with
/// [`simulate`](crate::simulate) on [`Population::Tables`](crate::Population::Tables) for [`FedNgmConfig::stages`] rounds.
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
    /// FedNGM with checked settings `cfg` ([`FedNgmConfig::check`]), and optional `public`
    /// rows for the server's distillation.
    pub fn new(cfg: FedNgmConfig, public: Option<Table>) -> Result<Self> {
        if cfg.gamma.is_some() && public.is_none() {
            return Err(FedError::MethodSetting {
                field: "gamma",
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
                    read_ngr_graph(ngm, shared.consensus.features(), &fit.params, cfg)?
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

#[cfg(test)]
mod tests {
    use super::*;

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
