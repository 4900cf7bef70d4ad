//! A whole FedNGM run over named clients ([`run_fedngm`]), what it built ([`FedNgmRun`]),
//! and stitching a client's own features onto the global model ([`stitch_client`]).

use fedfuse_core::{Params, Record};
use fedfuse_data::{Encoding, Table};
use fedfuse_fuse::{Graph, recover_graph};
use fedfuse_train::{FeatureGraph, Ngm, NgmFit, StitchConfig, ngr_graph};
use serde::Serialize;

use super::FedNgm;
use super::settings::{ClientWeighting, FedNgmConfig, GraphSettings, member_weights};
use crate::{
    ClientsPerRound, FedError, Population, Progress, Result, RoundMetrics, RunResult, SimConfig,
    simulate,
};
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
    /// The set-up rounds' instructions: the stage, then the shared encoding.
    pub setup_down: u64,
    /// Client models (and samples or summaries), every round.
    pub model_up: u64,
    /// The model rounds' instructions (consensus encoding and graph, and the global model
    /// after the first), and the final global model to every client.
    pub model_down: u64,
}

/// One model round of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FedNgmRound {
    /// From 1.
    pub round: usize,
    /// Each client's held-out regression loss at its selected epoch (training loss when it
    /// holds nothing out), by client id.
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
    /// Bytes down this round (its instructions).
    pub bytes_down: u64,
}

impl FedNgmRound {
    /// The model round a simulator round of [`FedNgm`] reports, if it was one (the set-up
    /// rounds were not).
    pub fn from_metrics(m: &RoundMetrics) -> Option<Self> {
        let get = |key: &str| m.method.get(key).copied();
        let round = get("model_round")? as usize;
        let mut losses: Vec<(usize, f64)> = m
            .method
            .iter()
            .filter_map(|(k, &v)| Some((k.strip_prefix("local_loss.")?.parse().ok()?, v)))
            .collect();
        losses.sort_by_key(|&(id, _)| id);
        Some(FedNgmRound {
            round,
            local_loss: losses.into_iter().map(|(_, v)| v).collect(),
            samples: get("samples").unwrap_or(0.0) as usize,
            distill_loss: get("distill_loss").unwrap_or(f64::NAN),
            penalty: get("penalty").unwrap_or(f64::NAN),
            bytes_up: m.bytes_up,
            bytes_down: m.bytes_down,
        })
    }
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
    /// Per model round.
    pub rounds: Vec<FedNgmRound>,
    /// Bytes on the wire.
    pub traffic: Traffic,
}

impl FedNgmRun {
    /// The client models with the weights the run averaged them with.
    pub fn members(&self, weighting: ClientWeighting) -> Vec<(&Params, f64)> {
        member_weights(&self.locals, &self.examples, weighting)
    }

    /// The NGR graph of `params` (an NGR of this run's structure: the global model, a client's
    /// or one trained on pooled rows) as FedNGR reads its global graph ([`read_ngr_graph`]).
    pub fn ngr_graph(&self, params: &Params, cfg: &FedNgmConfig) -> Result<Graph> {
        read_ngr_graph(&self.ngm, self.consensus.features(), params, cfg)
    }

    /// What a finished simulation of `method` over the clients `names` (by client id)
    /// built. Every client must have taken part in every round: the first rejected reply is
    /// the error, naming its client.
    pub fn from_simulation(method: FedNgm, result: RunResult, names: &[&str]) -> Result<Self> {
        let name = |id: usize| names.get(id).copied().unwrap_or("?");
        if let Some(r) = result.rounds.iter().flat_map(|r| &r.rejected).next() {
            return Err(FedError::BadMessage {
                from: format!("client {} (`{}`)", r.client, name(r.client)),
                reason: r.reason.clone(),
            });
        }
        let unfinished = |what: &str| FedError::InvalidSetting {
            field: "rounds",
            reason: format!(
                "FedNGM stopped before {what}; it needs {} rounds",
                method.config().stages()
            ),
        };
        let (Some(full_encoding), Some(encoding), Some(consensus), Some(ngm)) = (
            method.full_encoding(),
            method.encoding(),
            method.consensus(),
            method.ngm(),
        ) else {
            return Err(unfinished("agreeing a consensus"));
        };
        let Some(global_graph) = method.global_graph() else {
            return Err(unfinished("its last model round"));
        };
        let graph_ids: Vec<usize> = method.client_graphs().iter().map(|(id, _)| *id).collect();
        let local_ids: Vec<usize> = method.locals().iter().map(|(id, _, _)| *id).collect();
        let all: Vec<usize> = (0..names.len()).collect();
        if graph_ids != all || local_ids != all {
            return Err(FedError::InvalidSetting {
                field: "clients_per_round",
                reason: "a FedNGM run needs every client in every round".into(),
            });
        }
        // The final model goes to every client.
        let final_down =
            Record::from_params(result.params.clone()).encode()?.len() as u64 * names.len() as u64;
        let mut traffic = Traffic::default();
        let mut rounds = Vec::new();
        for m in &result.rounds {
            match FedNgmRound::from_metrics(m) {
                Some(r) => {
                    traffic.model_up += m.bytes_up;
                    traffic.model_down += m.bytes_down;
                    rounds.push(r);
                }
                None => {
                    traffic.setup_up += m.bytes_up;
                    traffic.setup_down += m.bytes_down;
                }
            }
        }
        traffic.model_down += final_down;
        Ok(FedNgmRun {
            full_encoding: full_encoding.clone(),
            encoding: encoding.clone(),
            client_graphs: method
                .client_graphs()
                .iter()
                .map(|(_, g)| g.clone())
                .collect(),
            consensus: consensus.clone(),
            ngm: ngm.clone(),
            locals: method.locals().iter().map(|(_, p, _)| p.clone()).collect(),
            examples: method.locals().iter().map(|&(_, _, n)| n).collect(),
            global: result.params,
            global_graph: global_graph.clone(),
            rounds,
            traffic,
        })
    }
}

/// FedNGR's read-out of a graph over `features` from an NGR's `params` (the one definition
/// the global graph, the clients' and a pooled NGR's graphs share, so that they compare):
/// the top `cfg.ngr_sparsity` of feature pairs by the symmetrised path scores of
/// `cfg.global.path`, blocks aggregated by `cfg.graph.aggregate`.
pub(crate) fn read_ngr_graph(
    ngm: &Ngm,
    features: &[String],
    params: &Params,
    cfg: &FedNgmConfig,
) -> Result<Graph> {
    let g = ngr_graph(
        params,
        ngm.blocks(),
        cfg.ngr_sparsity,
        cfg.global.path,
        cfg.graph.aggregate,
    )?;
    Ok(Graph::new(features.to_vec(), g.adjacency().to_vec())?)
}

/// Runs FedNGM (or FedNGR) over `clients`, with optional `public` rows for the server's
/// distillation: the [`FedNgm`] method through [`simulate`](crate::simulate) for
/// [`FedNgmConfig::stages`] rounds, every client in every round, seeded by `cfg.seed`.
/// `progress` receives the simulator's events ([`FedNgmRound::from_metrics`] reads a model
/// round's figures off its end).
pub fn run_fedngm(
    clients: &[FedNgmClient<'_>],
    public: Option<&Table>,
    cfg: &FedNgmConfig,
    progress: &(dyn Fn(Progress<'_>) + Sync),
) -> Result<FedNgmRun> {
    cfg.check()?;
    if clients.is_empty() {
        return Err(FedError::InvalidSetting {
            field: "clients",
            reason: "no clients; FedNGM needs at least one".into(),
        });
    }
    // Checked here too so that a bad client stops the run before anyone trains.
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
    let tables: Vec<Table> = clients.iter().map(|c| c.table.clone()).collect();
    let names: Vec<&str> = clients.iter().map(|c| c.name).collect();
    let mut method = FedNgm::new(cfg.clone(), public.cloned())?;
    let sim = SimConfig {
        rounds: cfg.stages(),
        clients_per_round: ClientsPerRound::Fraction(1.0),
        seed: cfg.seed,
        local_eval: false,
        ..SimConfig::default()
    };
    let result = simulate(
        &mut method,
        Population::tables(&tables, None),
        Params::new(),
        &sim,
        progress,
    )?;
    FedNgmRun::from_simulation(method, result, &names)
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
