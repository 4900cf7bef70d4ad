//! Graph maths of FedNGM on plain matrices: named undirected graphs, the consensus graph
//! (features intersected, edges united), the graphical lasso, partial correlations and the
//! top-fraction edge readout of uGLAD/NGR, edge precision/recall, and the unit-level mask of a
//! graph over encoded feature blocks.
//!
//! Matrices are `d x d`, row-major, `f64`.
//!
//! ```
//! use fedfuse_fuse::{GlassoConfig, Graph, consensus, graph_from_scores, graphical_lasso,
//!     partial_correlations};
//! # fn main() -> fedfuse_fuse::Result<()> {
//! // A client's graph from its sample covariance: glasso, partial correlations, top 1/3 of pairs.
//! let s = [1.0, 0.6, 0.0, 0.6, 1.0, 0.1, 0.0, 0.1, 1.0];
//! let fit = graphical_lasso(&s, 3, &GlassoConfig::new(0.05))?;
//! let pc = partial_correlations(&fit.precision, 3)?;
//! let g1 = graph_from_scores(vec!["a".into(), "b".into(), "c".into()], &pc, 1.0 / 3.0)?;
//! assert_eq!(g1.edges(), vec![(0, 1)]);
//! // Another client lacks "a" and links b - c; the consensus keeps b, c and unites edges.
//! let g2 = Graph::from_edges(vec!["c".into(), "b".into()], &[("b", "c")])?;
//! let g = consensus(&[g1, g2])?;
//! assert_eq!(g.features(), ["b".to_string(), "c".to_string()].as_slice());
//! assert_eq!(g.num_edges(), 1);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeSet;

use fedfuse_core::{BlockAggregate, FeatureBlock, block_scores};

use crate::{FuseError, Result};

/// An undirected graph over named features: symmetric adjacency, no self loops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    features: Vec<String>,
    adj: Vec<bool>,
}

impl Graph {
    /// Checks and wraps a `d x d` row-major adjacency over `features` (distinct names):
    /// it must be symmetric with a false diagonal.
    pub fn new(features: Vec<String>, adj: Vec<bool>) -> Result<Graph> {
        let d = features.len();
        if adj.len() != d * d {
            return Err(bad(format!(
                "adjacency has {} entries but {d} features need {}",
                adj.len(),
                d * d
            )));
        }
        let distinct: BTreeSet<&String> = features.iter().collect();
        if distinct.len() != d {
            return Err(bad(format!("feature names repeat in {features:?}")));
        }
        for i in 0..d {
            if adj[i * d + i] {
                return Err(bad(format!(
                    "self loop on feature {:?}; graphs have none",
                    features[i]
                )));
            }
            for j in i + 1..d {
                if adj[i * d + j] != adj[j * d + i] {
                    return Err(bad(format!(
                        "adjacency is not symmetric between {:?} and {:?}",
                        features[i], features[j]
                    )));
                }
            }
        }
        Ok(Graph { features, adj })
    }

    /// A graph with the given edges, named by feature; unknown names and self loops are errors.
    pub fn from_edges<S: AsRef<str>>(features: Vec<String>, edges: &[(S, S)]) -> Result<Graph> {
        let d = features.len();
        let mut g = Graph::new(features, vec![false; d * d])?;
        for (a, b) in edges {
            let (i, j) = (g.index_or_err(a.as_ref())?, g.index_or_err(b.as_ref())?);
            if i == j {
                return Err(bad(format!("self loop on feature {:?}", a.as_ref())));
            }
            g.adj[i * d + j] = true;
            g.adj[j * d + i] = true;
        }
        Ok(g)
    }

    /// Feature names, in node order.
    pub fn features(&self) -> &[String] {
        &self.features
    }

    /// Number of nodes.
    pub fn d(&self) -> usize {
        self.features.len()
    }

    /// The `d x d` row-major adjacency.
    pub fn adj(&self) -> &[bool] {
        &self.adj
    }

    /// The node index of a feature.
    pub fn index(&self, feature: &str) -> Option<usize> {
        self.features.iter().position(|f| f == feature)
    }

    /// Whether nodes `i` and `j` are adjacent (false out of range).
    pub fn has_edge(&self, i: usize, j: usize) -> bool {
        let d = self.d();
        i < d && j < d && self.adj[i * d + j]
    }

    /// Whether the named features are adjacent (false if either is absent).
    pub fn has_edge_between(&self, a: &str, b: &str) -> bool {
        match (self.index(a), self.index(b)) {
            (Some(i), Some(j)) => self.has_edge(i, j),
            _ => false,
        }
    }

    /// Edges `(i, j)` with `i < j`, in row order.
    pub fn edges(&self) -> Vec<(usize, usize)> {
        let d = self.d();
        (0..d)
            .flat_map(|i| (i + 1..d).map(move |j| (i, j)))
            .filter(|&(i, j)| self.adj[i * d + j])
            .collect()
    }

    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.edges().len()
    }

    /// The subgraph induced by `features`, in the order given (each must be a node).
    pub fn restrict<S: AsRef<str>>(&self, features: &[S]) -> Result<Graph> {
        let idx = features
            .iter()
            .map(|f| self.index_or_err(f.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let k = idx.len();
        let mut adj = vec![false; k * k];
        for (a, &i) in idx.iter().enumerate() {
            for (b, &j) in idx.iter().enumerate() {
                adj[a * k + b] = self.has_edge(i, j);
            }
        }
        Graph::new(
            features.iter().map(|f| f.as_ref().to_string()).collect(),
            adj,
        )
    }

    fn index_or_err(&self, f: &str) -> Result<usize> {
        self.index(f)
            .ok_or_else(|| bad(format!("feature {f:?} is not in {:?}", self.features)))
    }
}

fn bad(msg: String) -> FuseError {
    FuseError::InvalidGraph(msg)
}

/// FedNGM's consensus graph: nodes are the features every client graph has (sorted by name, a
/// canonical order independent of client order), edges the union of the clients' edges among
/// them. Edges touching a feature some client lacks are dropped.
pub fn consensus(graphs: &[Graph]) -> Result<Graph> {
    let Some(first) = graphs.first() else {
        return Err(FuseError::Empty);
    };
    let shared: BTreeSet<&String> = first
        .features
        .iter()
        .filter(|f| graphs.iter().all(|g| g.index(f).is_some()))
        .collect();
    let features: Vec<String> = shared.into_iter().cloned().collect();
    let d = features.len();
    let mut adj = vec![false; d * d];
    for g in graphs {
        // Node indices of the shared features in this client's graph.
        let idx: Vec<usize> = features
            .iter()
            .map(|f| g.index_or_err(f))
            .collect::<Result<_>>()?;
        for a in 0..d {
            for b in 0..d {
                adj[a * d + b] |= g.has_edge(idx[a], idx[b]);
            }
        }
    }
    Graph::new(features, adj)
}

/// Settings of [`graphical_lasso`].
#[derive(Clone, Debug, PartialEq)]
pub struct GlassoConfig {
    /// L1 penalty ρ ≥ 0 on every precision entry, diagonal included (Friedman et al.'s form).
    pub rho: f64,
    /// Stop when a sweep changes the covariance estimate by less than `tol` times the mean
    /// absolute off-diagonal of the input, on average per off-diagonal entry (Friedman et al.
    /// use 1e-3; the default 1e-8 is tighter because the problems here are small).
    pub tol: f64,
    /// Most outer sweeps.
    pub max_iter: usize,
    /// An inner lasso stops when no coefficient moves by more than this.
    pub lasso_tol: f64,
    /// Most inner coordinate-descent passes per lasso.
    pub lasso_max_iter: usize,
}

impl GlassoConfig {
    /// Penalty `rho`, tolerances 1e-8 (outer) and 1e-10 (inner), 1000 sweeps, 10,000 passes.
    pub fn new(rho: f64) -> GlassoConfig {
        GlassoConfig {
            rho,
            tol: 1e-8,
            max_iter: 1000,
            lasso_tol: 1e-10,
            lasso_max_iter: 10_000,
        }
    }
}

/// Result of [`graphical_lasso`].
#[derive(Clone, Debug, PartialEq)]
pub struct Glasso {
    /// Estimated precision Θ̂ (`d x d`, symmetrised).
    pub precision: Vec<f64>,
    /// Estimated covariance Ŵ (`d x d`), with Ŵ Θ̂ ≈ I.
    pub covariance: Vec<f64>,
    /// Outer sweeps run.
    pub iterations: usize,
    /// Whether the tolerance was met within `max_iter` sweeps.
    pub converged: bool,
}

/// The graphical lasso of Friedman, Hastie and Tibshirani (2008): maximises
/// `log det Θ − tr(SΘ) − ρ‖Θ‖₁` by block coordinate descent over the columns of the covariance
/// estimate W, each column a lasso solved by coordinate descent (warm-started).
///
/// `cov` is the `d x d` sample covariance S (symmetric, finite, positive diagonal). The diagonal
/// is penalised, so `W_ii = S_ii + ρ`; `ρ = 0` with an invertible S gives S⁻¹, and
/// `ρ ≥ max_{i≠j} |S_ij|` gives the diagonal precision `1 / (S_ii + ρ)`.
pub fn graphical_lasso(cov: &[f64], d: usize, cfg: &GlassoConfig) -> Result<Glasso> {
    check_square(cov, d, "covariance")?;
    for i in 0..d {
        if cov[i * d + i] <= 0.0 {
            return Err(FuseError::InvalidInput(format!(
                "covariance diagonal entry {i} is {}; variances must be positive (drop constant \
                 features first)",
                cov[i * d + i]
            )));
        }
        for j in i + 1..d {
            let (a, b) = (cov[i * d + j], cov[j * d + i]);
            if (a - b).abs() > 1e-9 * (1.0 + a.abs().max(b.abs())) {
                return Err(FuseError::InvalidInput(format!(
                    "covariance is not symmetric at ({i}, {j}): {a} vs {b}"
                )));
            }
        }
    }
    if !(cfg.rho >= 0.0 && cfg.rho.is_finite()) {
        return Err(setting("glasso.rho", format!("{} must be >= 0", cfg.rho)));
    }
    if !(cfg.tol > 0.0 && cfg.lasso_tol > 0.0) || cfg.max_iter == 0 || cfg.lasso_max_iter == 0 {
        return Err(setting(
            "glasso.tol",
            "tolerances must be positive and iteration limits at least 1".into(),
        ));
    }

    let rho = cfg.rho;
    let mut w = cov.to_vec();
    for i in 0..d {
        w[i * d + i] += rho;
    }
    // beta[j * d + k]: lasso coefficient of variable k in column j's regression (k != j).
    let mut beta = vec![0f64; d * d];
    let off_pairs = (d * (d - 1)).max(1) as f64;
    let mean_abs_off = (0..d)
        .flat_map(|i| (0..d).filter(move |&j| j != i).map(move |j| (i, j)))
        .map(|(i, j)| cov[i * d + j].abs())
        .sum::<f64>()
        / off_pairs;
    // A diagonal S has nothing off the diagonal to scale by; fall back to its mean diagonal.
    let scale = if mean_abs_off > 0.0 {
        mean_abs_off
    } else {
        (0..d).map(|i| cov[i * d + i]).sum::<f64>() / d as f64
    };

    let mut iterations = 0;
    let mut converged = d <= 1;
    while !converged && iterations < cfg.max_iter {
        iterations += 1;
        let mut change = 0.0;
        for j in 0..d {
            let b = &mut beta[j * d..(j + 1) * d];
            lasso_cd(&w, cov, d, j, rho, b, cfg);
            // w12 = W11 β: the new off-diagonal column j of W.
            for i in (0..d).filter(|&i| i != j) {
                let v: f64 = (0..d)
                    .filter(|&k| k != j)
                    .map(|k| w[i * d + k] * b[k])
                    .sum();
                change += (v - w[i * d + j]).abs();
                w[i * d + j] = v;
                w[j * d + i] = v;
            }
        }
        converged = change / off_pairs < cfg.tol * scale;
    }

    // Θ_jj = 1 / (W_jj − w12ᵀβ), θ12 = −β Θ_jj (Friedman et al., eq. 2.13).
    let mut theta = vec![0f64; d * d];
    for j in 0..d {
        let b = &beta[j * d..(j + 1) * d];
        let dot: f64 = (0..d)
            .filter(|&k| k != j)
            .map(|k| w[k * d + j] * b[k])
            .sum();
        let tjj = 1.0 / (w[j * d + j] - dot);
        theta[j * d + j] = tjj;
        for k in (0..d).filter(|&k| k != j) {
            theta[k * d + j] = -b[k] * tjj;
        }
    }
    for i in 0..d {
        for j in i + 1..d {
            let m = 0.5 * (theta[i * d + j] + theta[j * d + i]);
            theta[i * d + j] = m;
            theta[j * d + i] = m;
        }
    }
    Ok(Glasso {
        precision: theta,
        covariance: w,
        iterations,
        converged,
    })
}

/// Coordinate descent for `min_β ½βᵀW₁₁β − βᵀs₁₂ + ρ‖β‖₁`, column `j` left out; `b` holds the
/// warm start on entry and the solution on exit (`b[j]` unused).
fn lasso_cd(w: &[f64], s: &[f64], d: usize, j: usize, rho: f64, b: &mut [f64], cfg: &GlassoConfig) {
    for _ in 0..cfg.lasso_max_iter {
        let mut max_step = 0f64;
        for k in (0..d).filter(|&k| k != j) {
            let partial: f64 = (0..d)
                .filter(|&l| l != j && l != k)
                .map(|l| w[k * d + l] * b[l])
                .sum();
            let r = s[k * d + j] - partial;
            let new = soft_threshold(r, rho) / w[k * d + k];
            max_step = max_step.max((new - b[k]).abs());
            b[k] = new;
        }
        if max_step < cfg.lasso_tol {
            break;
        }
    }
}

fn soft_threshold(x: f64, t: f64) -> f64 {
    x.signum() * (x.abs() - t).max(0.0)
}

/// Partial correlations `ρ_ij = −Θ_ij / sqrt(Θ_ii Θ_jj)` of a precision matrix, 1 on the
/// diagonal (uGLAD's graph score).
pub fn partial_correlations(precision: &[f64], d: usize) -> Result<Vec<f64>> {
    check_square(precision, d, "precision")?;
    if let Some(i) = (0..d).find(|&i| precision[i * d + i] <= 0.0) {
        return Err(FuseError::InvalidInput(format!(
            "precision diagonal entry {i} is {}; a precision matrix has a positive diagonal",
            precision[i * d + i]
        )));
    }
    let mut out = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..d {
            out[i * d + j] = if i == j {
                1.0
            } else {
                -precision[i * d + j] / (precision[i * d + i] * precision[j * d + j]).sqrt()
            };
        }
    }
    Ok(out)
}

/// The uGLAD/NGR readout: a graph keeping the `round(sparsity · d(d−1)/2)` upper-triangle pairs
/// with the largest `|scores|` (ties broken by row order; exact zeros never become edges).
/// `scores` is `d x d`, only its upper triangle is read.
pub fn graph_from_scores(features: Vec<String>, scores: &[f64], sparsity: f64) -> Result<Graph> {
    let d = features.len();
    check_square(scores, d, "scores")?;
    if !(0.0..=1.0).contains(&sparsity) {
        return Err(setting(
            "graph.sparsity",
            format!("{sparsity} is not a fraction in [0, 1]"),
        ));
    }
    let mut pairs: Vec<(usize, usize)> = (0..d)
        .flat_map(|i| (i + 1..d).map(move |j| (i, j)))
        .collect();
    let keep = (sparsity * pairs.len() as f64).round() as usize;
    // Stable sort: equal scores keep row order, so the readout is deterministic.
    pairs.sort_by(|&(a, b), &(c, e)| scores[c * d + e].abs().total_cmp(&scores[a * d + b].abs()));
    let mut adj = vec![false; d * d];
    for &(i, j) in pairs.iter().take(keep) {
        if scores[i * d + j] != 0.0 {
            adj[i * d + j] = true;
            adj[j * d + i] = true;
        }
    }
    Graph::new(features, adj)
}

/// Edge-recovery scores of an estimated graph against the truth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EdgeMetrics {
    /// Edges in both.
    pub true_positives: usize,
    /// Estimated edges not in the truth.
    pub false_positives: usize,
    /// True edges not estimated.
    pub false_negatives: usize,
    /// `tp / (tp + fp)`; 1 when nothing was estimated.
    pub precision: f64,
    /// `tp / (tp + fn)`; 1 when the truth has no edges.
    pub recall: f64,
    /// Harmonic mean of precision and recall; 0 when both are 0.
    pub f1: f64,
}

/// Compares two graphs over the same feature set (matched by name, in any order).
pub fn edge_precision_recall(estimated: &Graph, truth: &Graph) -> Result<EdgeMetrics> {
    let a: BTreeSet<&String> = estimated.features.iter().collect();
    let b: BTreeSet<&String> = truth.features.iter().collect();
    if a != b {
        return Err(bad(format!(
            "estimated graph has features {:?} but the truth has {:?}; compare graphs over the \
             same features (use Graph::restrict)",
            estimated.features, truth.features
        )));
    }
    let (mut tp, mut fp, mut fn_) = (0, 0, 0);
    let d = truth.d();
    for i in 0..d {
        for j in i + 1..d {
            let t = truth.has_edge(i, j);
            let e = estimated.has_edge_between(&truth.features[i], &truth.features[j]);
            match (e, t) {
                (true, true) => tp += 1,
                (true, false) => fp += 1,
                (false, true) => fn_ += 1,
                (false, false) => {}
            }
        }
    }
    let ratio = |num: usize, den: usize| {
        if den == 0 {
            1.0
        } else {
            num as f64 / den as f64
        }
    };
    let precision = ratio(tp, tp + fp);
    let recall = ratio(tp, tp + fn_);
    let f1 = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    Ok(EdgeMetrics {
        true_positives: tp,
        false_positives: fp,
        false_negatives: fn_,
        precision,
        recall,
        f1,
    })
}

/// The unit-level `u x u` mask of a graph over encoded features (NGM hypernodes): unit `a` of
/// feature `i` and unit `b` of feature `j` are connected iff `i` and `j` are adjacent. Units of
/// one feature are never connected (that would let a feature predict itself).
///
/// `blocks` must tile `0..u` in order (`start` of each = end of the previous) and name features
/// of the graph; graph features without a block are left out.
pub fn expand_to_units(graph: &Graph, blocks: &[FeatureBlock]) -> Result<Vec<bool>> {
    let mut node = Vec::new();
    for b in blocks {
        if b.start != node.len() || b.len == 0 {
            return Err(bad(format!(
                "block {:?} starts at unit {} with {} units; blocks must tile the units in \
                 order from 0 without gaps",
                b.name, b.start, b.len
            )));
        }
        let i = graph.index_or_err(&b.name)?;
        node.extend(std::iter::repeat_n(i, b.len));
    }
    let u = node.len();
    let mut mask = vec![false; u * u];
    for a in 0..u {
        for c in 0..u {
            mask[a * u + c] = graph.has_edge(node[a], node[c]);
        }
    }
    Ok(mask)
}

/// The maximum-likelihood covariance (divides by `n`, as the graphical lasso expects) of `n`
/// row-major samples of `d` variables, f32 or f64.
pub fn covariance<T: Copy + Into<f64>>(x: &[T], n: usize, d: usize) -> Result<Vec<f64>> {
    if n == 0 || x.len() != n * d {
        return Err(FuseError::InvalidInput(format!(
            "{} values cannot be {n} samples of {d} variables (need n >= 1)",
            x.len()
        )));
    }
    let mut mean = vec![0f64; d];
    for row in x.chunks_exact(d) {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += v.into();
        }
    }
    mean.iter_mut().for_each(|m| *m /= n as f64);
    let mut cov = vec![0f64; d * d];
    let mut centred = vec![0f64; d];
    for row in x.chunks_exact(d) {
        for ((c, &v), m) in centred.iter_mut().zip(row).zip(&mean) {
            *c = v.into() - m;
        }
        for i in 0..d {
            for j in i..d {
                cov[i * d + j] += centred[i] * centred[j];
            }
        }
    }
    for i in 0..d {
        for j in i..d {
            let v = cov[i * d + j] / n as f64;
            cov[i * d + j] = v;
            cov[j * d + i] = v;
        }
    }
    if cov.iter().any(|v| !v.is_finite()) {
        return Err(FuseError::InvalidInput(
            "samples hold non-finite values".into(),
        ));
    }
    Ok(cov)
}

/// Settings of [`recover_graph`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphRecovery {
    /// Graphical-lasso penalty on the unit *correlation* matrix (so reals and one-hot units
    /// are penalised on one scale).
    pub rho: f64,
    /// Fraction of feature pairs kept as edges (the uGLAD/NGR readout).
    pub sparsity: f64,
    /// How a pair of multi-unit features scores from its unit partial correlations.
    pub aggregate: BlockAggregate,
}

impl Default for GraphRecovery {
    /// `rho` 0.05, a third of the pairs, strongest unit link.
    fn default() -> Self {
        GraphRecovery {
            rho: 0.05,
            sparsity: 1.0 / 3.0,
            aggregate: BlockAggregate::Max,
        }
    }
}

/// A client's feature graph from its encoded rows (`n x U`, laid out by `blocks`): the
/// graphical lasso on the units' correlation matrix, partial correlations, one score per
/// feature pair ([`block_scores`]), and the top `sparsity` fraction of pairs as edges.
/// Units without variance on this client (a level it never sees, a constant column) are
/// left out of the lasso and link to nothing.
pub fn recover_graph(
    x: &[f32],
    n: usize,
    blocks: &[FeatureBlock],
    cfg: &GraphRecovery,
) -> Result<Graph> {
    let u = blocks.iter().map(|b| b.start + b.len).max().unwrap_or(0);
    if blocks.is_empty() || n < 2 {
        return Err(FuseError::InvalidInput(format!(
            "graph recovery needs at least one feature and two rows ({} features, {n} rows)",
            blocks.len()
        )));
    }
    if !(cfg.rho.is_finite() && cfg.rho >= 0.0) {
        return Err(setting("graph.rho", format!("{} is not >= 0", cfg.rho)));
    }
    let cov = covariance(x, n, u)?;
    // Units with variance, and the correlation matrix among them.
    let live: Vec<usize> = (0..u).filter(|&k| cov[k * u + k] > 1e-12).collect();
    let m = live.len();
    let mut corr = vec![0f64; m * m];
    for (a, &i) in live.iter().enumerate() {
        for (b, &j) in live.iter().enumerate() {
            corr[a * m + b] = cov[i * u + j] / (cov[i * u + i] * cov[j * u + j]).sqrt();
        }
    }
    let mut unit_pc = vec![0f64; u * u];
    if m >= 2 {
        let fit = graphical_lasso(&corr, m, &GlassoConfig::new(cfg.rho))?;
        let pc = partial_correlations(&fit.precision, m)?;
        for (a, &i) in live.iter().enumerate() {
            for (b, &j) in live.iter().enumerate() {
                if i != j {
                    unit_pc[i * u + j] = pc[a * m + b];
                }
            }
        }
    }
    let scores = block_scores(&unit_pc, u, blocks, cfg.aggregate)?;
    let names = blocks.iter().map(|b| b.name.clone()).collect();
    graph_from_scores(names, &scores, cfg.sparsity)
}

fn check_square(m: &[f64], d: usize, what: &str) -> Result<()> {
    if m.len() != d * d {
        return Err(FuseError::InvalidInput(format!(
            "{what} has {} entries, not {d} x {d}",
            m.len()
        )));
    }
    if let Some(i) = m.iter().position(|v| !v.is_finite()) {
        return Err(FuseError::InvalidInput(format!(
            "{what} entry ({}, {}) is {}",
            i / d,
            i % d,
            m[i]
        )));
    }
    Ok(())
}

fn setting(field: &'static str, reason: String) -> FuseError {
    FuseError::InvalidSetting { field, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_threshold_shrinks_towards_zero() {
        assert_eq!(soft_threshold(3.0, 1.0), 2.0);
        assert_eq!(soft_threshold(-3.0, 1.0), -2.0);
        assert_eq!(soft_threshold(0.5, 1.0), 0.0);
    }

    #[test]
    fn graph_rejects_asymmetry_and_self_loops() {
        let f = vec!["a".to_string(), "b".to_string()];
        assert!(Graph::new(f.clone(), vec![false, true, false, false]).is_err());
        assert!(Graph::new(f.clone(), vec![true, false, false, false]).is_err());
        assert!(Graph::new(f, vec![false, true, true, false]).is_ok());
    }
}
