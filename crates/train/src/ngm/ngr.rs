//! Neural Graph Revealers (note 1.5): an NGM trained without a given graph, whose sparse path
//! matrix is read as the graph.

pub use fedfuse_core::BlockAggregate;
use fedfuse_core::Params;
use fedfuse_core::block_scores;

use super::fit::Task;
use super::penalty::{PathNorm, path_of};
use super::{
    Distill, FeatureBlock, FeatureGraph, Ngm, NgmConfig, NgmFit, check_blocks, unit_owner,
};
use crate::{Result, TrainError};

impl Ngm {
    /// NGR training: like [`fit`](Self::fit) but ignoring the graph, with the penalty
    /// `lambda (sum |P_sym| / U^2 + sum_{same feature} |P_sym|)` (a sparsity term and a
    /// "no self-paths" term; the note's `D` is the unit count here, the reference code's
    /// diagonal generalises to each feature's own block, and its weight is an NGM's for a
    /// forbidden path rather than the reference code's `1 / U^2`, see `ngr_weights`). `P_sym = (P + P^T) / 2` has the same
    /// weighted sum as `P` against these symmetric weights, so `P` is penalised directly. The
    /// reference demo uses `lambda = 100`, a wide hidden layer and a low learning rate; here,
    /// with the regression loss averaged over units, use [`PathNorm::Raw`] and `lambda` around
    /// 0.01-0.1 (with the row-normalised `P` the all-entries term is minimised by routing
    /// every input to one output, and the readout collapses to a star).
    pub fn fit_ngr(&self, start: Option<&Params>, x: &[f32], cfg: &NgmConfig) -> Result<NgmFit> {
        self.fit_task(
            start,
            Task {
                inputs: x,
                targets: x,
                public: None,
                weights: self.ngr_weights(),
                frozen: None,
            },
            cfg,
        )
    }

    /// FedNGR's server step: [`fit_distill`](Self::fit_distill) under the NGR penalty of
    /// [`fit_ngr`](Self::fit_ngr) instead of the graph's, so the global graph can be read off
    /// the distilled weights with [`ngr_graph`].
    ///
    /// Distillation targets that are NGRs' conditional means have already been shrunk
    /// towards the marginal by the clients' own penalty; the same `lambda` here shrinks them a
    /// second time, and a penalty the clients bear can leave the distilled model a constant
    /// (CDC, clients and server at 0.1: the majority class on every categorical target).
    /// Choose the server's `lambda` on its own, below the clients' (docs/EXPERIMENTS.md).
    pub fn fit_distill_ngr(
        &self,
        start: Option<&Params>,
        data: Distill<'_>,
        cfg: &NgmConfig,
    ) -> Result<NgmFit> {
        self.distill_task(start, data, self.ngr_weights(), cfg)
    }

    /// NGR penalty weights `1 / U^2 + [same feature]`: the sparsity term on every path, and
    /// self-paths forbidden at an NGM's weight for a missing edge (1), not the reference code's
    /// `1 / U^2`. At `1 / U^2` copying a feature's own input to its output costs far less than
    /// the squared error it removes, so each output mostly copies its input, its paths from
    /// the other features shrink by a feature-dependent factor and the read-out ranks pairs
    /// badly (synthetic GGM, development seeds 5-9: edge F1 0.47 for the clients' NGRs at
    /// `2 / U^2`, 0.82 at 1; docs/EXPERIMENTS.md). The fit is then a regression of each
    /// feature on the others, whose held-out loss can choose `lambda`.
    fn ngr_weights(&self) -> Vec<f32> {
        let u = self.units();
        let owner = unit_owner(self.blocks(), u);
        let scale = 1.0 / (u * u) as f32;
        (0..u * u)
            .map(|k| {
                let same = owner[k / u] == owner[k % u];
                scale + if same { 1.0 } else { 0.0 }
            })
            .collect()
    }
}

/// Symmetric `D x D` feature scores (zero diagonal) from `P_sym = (P + P^T) / 2` of `params`
/// (`P` of kind `path`, as trained), aggregated over each pair of blocks.
pub fn ngr_scores(
    params: &Params,
    blocks: &[FeatureBlock],
    path: PathNorm,
    aggregate: BlockAggregate,
) -> Result<Vec<f32>> {
    let u = check_blocks(blocks)?;
    let p = path_of(params, path)?;
    if p.len() != u * u {
        return Err(TrainError::DataMismatch(format!(
            "the parameters' path matrix has {} entries but the blocks cover {u} units",
            p.len()
        )));
    }
    let p: Vec<f64> = p.into_iter().map(f64::from).collect();
    let scores = block_scores(&p, u, blocks, aggregate)?;
    Ok(scores.into_iter().map(|v| v as f32).collect())
}

/// The NGR graph: the top `sparsity` fraction (rounded, in `[0, 1]`) of the `D (D - 1) / 2`
/// feature pairs by [`ngr_scores`] (ties broken by index), as the reference code's
/// `graph_from_partial_correlations` keeps its top entries.
pub fn ngr_graph(
    params: &Params,
    blocks: &[FeatureBlock],
    sparsity: f64,
    path: PathNorm,
    aggregate: BlockAggregate,
) -> Result<FeatureGraph> {
    if !(0.0..=1.0).contains(&sparsity) {
        return Err(TrainError::InvalidConfig {
            field: "ngr.sparsity",
            reason: format!("{sparsity} is not a fraction in [0, 1]"),
        });
    }
    let scores = ngr_scores(params, blocks, path, aggregate)?;
    let d = blocks.len();
    let mut pairs: Vec<(usize, usize)> = (0..d)
        .flat_map(|i| ((i + 1)..d).map(move |j| (i, j)))
        .collect();
    pairs.sort_by(|&(a, b), &(c, e)| scores[c * d + e].total_cmp(&scores[a * d + b]));
    let keep = (sparsity * pairs.len() as f64).round() as usize;
    FeatureGraph::from_edges(d, &pairs[..keep.min(pairs.len())])
}
