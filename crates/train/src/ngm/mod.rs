//! Neural Graphical Models (Shrivastava & Chajewska 2022/23): an MLP `f_W : R^U -> R^U` whose
//! path-dependency matrix is pushed onto the support of a feature graph, plus the Neural Graph
//! Revealer (NGR) variant that learns the graph, and FedNGM's stitching.
//!
//! Data model: an NGM sees a row-major `n x U` f32 matrix of already normalised *units*
//! (min-max scaled reals, one-hot categoricals). [`FeatureBlock`]s map the `D` features onto
//! contiguous unit ranges; a [`FeatureGraph`] over features becomes a `U x U` unit mask with
//! [`unit_mask`]. [`Ngm`] ties blocks, graph and the categorical loss together and is the
//! entry point for training ([`Ngm::fit`], [`Ngm::fit_distill`]), prediction, inference
//! ([`Ngm::infer`]) and sampling ([`Ngm::sample`]).

mod fit;
mod infer;
mod ngr;
mod penalty;
mod sample;
mod stitch;

pub use fit::{Distill, EpochLog, LambdaSchedule, NgmConfig, NgmFit};
pub use infer::{InferConfig, InferMethod, Inference, Known};
pub use ngr::{BlockAggregate, ngr_graph, ngr_scores};
pub use penalty::{
    PathNorm, PenaltyKind, StructureReport, path_matrix, sensitivity_bounds, structure_penalty,
    structure_report,
};
pub use sample::{FirstDraw, Marginals, SampleConfig, SampleNoise};
pub use stitch::{StitchConfig, StitchMode, stitch_params};

use std::collections::VecDeque;

use fedfuse_core::{BlockKind, FeatureBlock, ModelSpec, Params};
use serde::{Deserialize, Serialize};

use crate::{Init, Result, TrainError, init_params};

/// Checks that `blocks` tile `0..U` in order without gaps or overlaps; returns `U`.
pub(crate) fn check_blocks(blocks: &[FeatureBlock]) -> Result<usize> {
    if blocks.is_empty() {
        return Err(TrainError::Blocks(
            "no feature blocks; give one block per feature".into(),
        ));
    }
    let mut next = 0;
    for (i, b) in blocks.iter().enumerate() {
        if b.start != next {
            return Err(TrainError::Blocks(format!(
                "block {i} (`{}`) starts at unit {} but the blocks before it end at {next}; \
                 blocks must be listed in order and cover the units without gaps or overlaps",
                b.name, b.start
            )));
        }
        let min = match b.kind {
            BlockKind::Real => 1,
            BlockKind::Categorical => 2,
        };
        if b.len < min {
            return Err(TrainError::Blocks(format!(
                "block {i} (`{}`) has {} unit(s); a {:?} block needs at least {min}",
                b.name, b.len, b.kind
            )));
        }
        next += b.len;
    }
    Ok(next)
}

/// A symmetric, loop-free graph over `D` features (row-major `D x D` adjacency).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGraph {
    features: usize,
    adj: Vec<bool>,
}

impl FeatureGraph {
    /// A graph from a row-major `features x features` adjacency (index `i` is the feature of
    /// block `i`), which must be symmetric with a false diagonal, as `fedfuse_fuse::Graph`'s:
    /// `FeatureGraph::new(g.d(), g.adj().to_vec())` converts one whose features are in block
    /// order.
    pub fn new(features: usize, adj: Vec<bool>) -> Result<Self> {
        if adj.len() != features * features {
            return Err(TrainError::Graph(format!(
                "adjacency has {} entries, a graph over {features} features needs {}",
                adj.len(),
                features * features
            )));
        }
        for i in 0..features {
            if adj[i * features + i] {
                return Err(TrainError::Graph(format!(
                    "self loop on feature {i}; a feature never feeds its own output, so graphs \
                     have none"
                )));
            }
            for j in 0..i {
                if adj[i * features + j] != adj[j * features + i] {
                    return Err(TrainError::Graph(format!(
                        "adjacency is not symmetric at ({i}, {j}); an NGM graph is undirected \
                         (moralise a DAG first)"
                    )));
                }
            }
        }
        Ok(Self { features, adj })
    }

    /// A graph with the given undirected edges.
    pub fn from_edges(features: usize, edges: &[(usize, usize)]) -> Result<Self> {
        let mut adj = vec![false; features * features];
        for &(i, j) in edges {
            if i >= features || j >= features || i == j {
                return Err(TrainError::Graph(format!(
                    "edge ({i}, {j}) is a self loop or names a feature beyond the {features} \
                     features"
                )));
            }
            adj[i * features + j] = true;
            adj[j * features + i] = true;
        }
        Self::new(features, adj)
    }

    /// Every pair connected (NGR's starting point).
    pub fn complete(features: usize) -> Self {
        let adj = (0..features * features)
            .map(|k| k / features != k % features)
            .collect();
        Self { features, adj }
    }

    /// Number of features `D`.
    pub fn features(&self) -> usize {
        self.features
    }

    /// The row-major `D x D` adjacency.
    pub fn adjacency(&self) -> &[bool] {
        &self.adj
    }

    /// Whether `i` and `j` are neighbours (false for out-of-range indices).
    pub fn has_edge(&self, i: usize, j: usize) -> bool {
        i < self.features && j < self.features && self.adj[i * self.features + j]
    }

    /// Edges `(i, j)` with `i < j`, in row-major order.
    pub fn edges(&self) -> Vec<(usize, usize)> {
        (0..self.features)
            .flat_map(|i| ((i + 1)..self.features).map(move |j| (i, j)))
            .filter(|&(i, j)| self.has_edge(i, j))
            .collect()
    }

    /// Breadth-first order from `start` (neighbours in index order); when a component is
    /// exhausted the search restarts from the lowest unvisited feature, so every feature
    /// appears exactly once. An out-of-range `start` begins at feature 0.
    pub fn bfs_order(&self, start: usize) -> Vec<usize> {
        let d = self.features;
        let mut seen = vec![false; d];
        let mut order = Vec::with_capacity(d);
        let mut roots = std::iter::once(if start < d { start } else { 0 }).chain(0..d);
        while order.len() < d {
            let Some(root) = roots.find(|&r| r < d && !seen[r]) else {
                break;
            };
            seen[root] = true;
            let mut queue = VecDeque::from([root]);
            while let Some(f) = queue.pop_front() {
                order.push(f);
                let row = &self.adj[f * d..(f + 1) * d];
                for (g, s) in seen.iter_mut().enumerate() {
                    if !*s && row[g] {
                        *s = true;
                        queue.push_back(g);
                    }
                }
            }
        }
        order
    }
}

/// The `U x U` unit mask of `graph` (row-major, `mask[a * U + b]`: input unit `a` may influence
/// output unit `b`): true iff the features owning `a` and `b` differ and are neighbours
/// (`fedfuse_fuse::expand_to_units` for blocks in graph order). A feature's own block,
/// including the off-diagonal units of a one-hot block, is forbidden, so no unit can
/// reconstruct itself or its siblings (as in the reference code, where `S^c = (S == 0)`
/// penalises the diagonal).
pub fn unit_mask(graph: &FeatureGraph, blocks: &[FeatureBlock]) -> Result<Vec<bool>> {
    let units = check_blocks(blocks)?;
    if graph.features() != blocks.len() {
        return Err(TrainError::Graph(format!(
            "the graph has {} features but there are {} feature blocks",
            graph.features(),
            blocks.len()
        )));
    }
    let owner = unit_owner(blocks, units);
    Ok((0..units * units)
        .map(|k| graph.has_edge(owner[k / units], owner[k % units]))
        .collect())
}

/// The feature index of each unit.
fn unit_owner(blocks: &[FeatureBlock], units: usize) -> Vec<usize> {
    let mut owner = vec![0; units];
    for (f, b) in blocks.iter().enumerate() {
        owner[b.range()].iter_mut().for_each(|o| *o = f);
    }
    owner
}

/// The loss on categorical output blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CategoricalLoss {
    /// Softmax cross-entropy over the block's logits (the note's recommendation); outputs are
    /// read as probabilities through a softmax.
    #[default]
    CrossEntropy,
    /// Squared error on the one-hot units, as the reference code (`main_generic.py`) does;
    /// outputs are read as scores, clipped at 0 and normalised when probabilities are needed.
    Mse,
}

/// An NGM's structure: feature blocks, feature graph, their unit mask, and the categorical
/// loss. Built once and validated; every method trusts it afterwards.
#[derive(Clone, Debug)]
pub struct Ngm {
    blocks: Vec<FeatureBlock>,
    units: usize,
    graph: FeatureGraph,
    allowed: Vec<bool>,
    categorical_loss: CategoricalLoss,
}

impl Ngm {
    /// An NGM over `blocks` (which must tile the units in order) with dependency graph `graph`
    /// (one node per block), using cross-entropy on categorical blocks.
    pub fn new(blocks: Vec<FeatureBlock>, graph: FeatureGraph) -> Result<Self> {
        let allowed = unit_mask(&graph, &blocks)?;
        let units = check_blocks(&blocks)?;
        Ok(Self {
            blocks,
            units,
            graph,
            allowed,
            categorical_loss: CategoricalLoss::default(),
        })
    }

    /// The same NGM with another categorical loss.
    pub fn with_categorical_loss(mut self, loss: CategoricalLoss) -> Self {
        self.categorical_loss = loss;
        self
    }

    /// Number of units `U` (input and output width).
    pub fn units(&self) -> usize {
        self.units
    }

    /// The feature blocks.
    pub fn blocks(&self) -> &[FeatureBlock] {
        &self.blocks
    }

    /// The feature graph.
    pub fn graph(&self) -> &FeatureGraph {
        &self.graph
    }

    /// The `U x U` unit mask (see [`unit_mask`]).
    pub fn allowed_units(&self) -> &[bool] {
        &self.allowed
    }

    /// The categorical loss.
    pub fn categorical_loss(&self) -> CategoricalLoss {
        self.categorical_loss
    }

    /// The MLP architecture `U -> hidden... -> U` (the output units play the role of classes).
    pub fn spec(&self, hidden: &[usize]) -> ModelSpec {
        ModelSpec::mlp(self.units, hidden, self.units)
    }

    /// Fresh parameters `U -> hidden... -> U` (PyTorch's default initialisation), seeded.
    pub fn init(&self, hidden: &[usize], seed: u64) -> Result<Params> {
        let spec = self.spec(hidden);
        spec.validate()?;
        Ok(init_params(&spec, Init::Default, seed))
    }

    /// The architecture of `params`, checked to take and give `U` units.
    pub(crate) fn spec_of(&self, params: &Params) -> Result<ModelSpec> {
        let spec = ModelSpec::infer_mlp(params)?;
        if spec.input_len() != self.units || spec.classes() != self.units {
            return Err(TrainError::DataMismatch(format!(
                "the parameters map {} inputs to {} outputs but this NGM has {} units; \
                 build them with `Ngm::init` for these blocks",
                spec.input_len(),
                spec.classes(),
                self.units
            )));
        }
        Ok(spec)
    }

    /// Rows in `x`, checking that it is a non-empty `n x U` matrix of finite values.
    pub(crate) fn check_matrix(&self, x: &[f32], what: &'static str) -> Result<usize> {
        check_matrix(x, self.units, what)
    }
}

/// Rows of the `n x units` matrix `x`, checked non-empty and finite.
pub(crate) fn check_matrix(x: &[f32], units: usize, what: &'static str) -> Result<usize> {
    if x.is_empty() {
        return Err(TrainError::EmptyData(what));
    }
    if units == 0 || !x.len().is_multiple_of(units) {
        return Err(TrainError::DataMismatch(format!(
            "{what} has {} values, not a whole number of rows of {units} units",
            x.len()
        )));
    }
    if let Some(k) = x.iter().position(|v| !v.is_finite()) {
        return Err(TrainError::NonFinite {
            what,
            row: k / units,
            unit: k % units,
        });
    }
    Ok(x.len() / units)
}
