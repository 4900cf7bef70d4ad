//! Synthetic Gaussian graphical models (GGMs): a sparse graph, a positive-definite precision
//! matrix with exactly that zero pattern, and samples from `N(0, precision⁻¹)`; plus the exact
//! Gaussian conditional mean, the ground truth for NGM inference tests.
//!
//! Matrices are `d x d`, row-major `Vec<f64>`; samples are `n x d`, row-major.

use rand::{Rng, RngExt};
use rand_distr::StandardNormal;

use crate::error::{DataError, Result};

/// The sparsity pattern of a synthetic GGM.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum GraphShape {
    /// Erdős–Rényi: each of the `d(d-1)/2` pairs is an edge with probability `edge_prob`.
    Random {
        /// Edge probability in `[0, 1]`.
        edge_prob: f64,
    },
    /// A path `0 - 1 - ... - (d-1)`.
    Chain,
    /// A 4-neighbour lattice, `d / cols` rows of `cols` nodes (`d` a multiple of `cols`);
    /// node `r * cols + c`.
    Grid {
        /// Nodes per lattice row.
        cols: usize,
    },
}

/// Settings of [`sample_ggm`].
#[derive(Clone, Debug, PartialEq)]
pub struct GgmConfig {
    /// Number of variables.
    pub d: usize,
    /// Number of samples.
    pub n: usize,
    /// Graph pattern.
    pub shape: GraphShape,
    /// Off-diagonal precision magnitudes are uniform in `[lo, hi]` (`0 < lo <= hi`), with a
    /// random sign.
    pub weight: (f64, f64),
    /// Each diagonal entry is the sum of its row's off-diagonal magnitudes plus this margin
    /// (`> 0`): strict diagonal dominance makes the matrix positive definite without an
    /// eigen-decomposition. Larger margins weaken the partial correlations.
    pub diag_margin: f64,
}

impl GgmConfig {
    /// `d` variables, `n` samples, the given shape, weights in `[0.5, 1.0]`, margin 0.5.
    pub fn new(d: usize, n: usize, shape: GraphShape) -> GgmConfig {
        GgmConfig {
            d,
            n,
            shape,
            weight: (0.5, 1.0),
            diag_margin: 0.5,
        }
    }
}

/// A sampled GGM.
#[derive(Clone, Debug, PartialEq)]
pub struct Ggm {
    /// Number of variables.
    pub d: usize,
    /// Number of samples.
    pub n: usize,
    /// `d x d` symmetric adjacency, false on the diagonal.
    pub adjacency: Vec<bool>,
    /// `d x d` precision Θ: non-zero off the diagonal exactly where `adjacency` is true.
    pub precision: Vec<f64>,
    /// `d x d` covariance Θ⁻¹.
    pub covariance: Vec<f64>,
    /// `n x d` samples from `N(0, covariance)`, row-major.
    pub samples: Vec<f64>,
}

impl Ggm {
    /// Number of edges.
    pub fn num_edges(&self) -> usize {
        self.adjacency.iter().filter(|&&a| a).count() / 2
    }

    /// Feature names `x0`, `x1`, ... (zero-padded to sort in index order).
    pub fn feature_names(&self) -> Vec<String> {
        let width = self.d.saturating_sub(1).to_string().len();
        (0..self.d).map(|k| format!("x{k:0width$}")).collect()
    }

    /// Samples `rows` as a table of real columns named by [`feature_names`](Self::feature_names).
    pub fn table(&self, rows: std::ops::Range<usize>) -> Result<crate::Table> {
        if rows.start > rows.end || rows.end > self.n {
            return Err(DataError::InvalidArgument {
                field: "rows",
                msg: format!("rows {rows:?} of {} samples", self.n),
            });
        }
        let d = self.d;
        let columns = self
            .feature_names()
            .into_iter()
            .enumerate()
            .map(|(k, name)| {
                let v = rows
                    .clone()
                    .map(|r| self.samples[r * d + k] as f32)
                    .collect();
                (name, crate::Column::Real(v))
            })
            .collect();
        crate::Table::new(columns)
    }
}

/// Draws a graph, a precision matrix with that pattern and `n` samples, all from `rng`.
pub fn sample_ggm(cfg: &GgmConfig, rng: &mut impl Rng) -> Result<Ggm> {
    let d = cfg.d;
    let (lo, hi) = cfg.weight;
    let arg = |field: &'static str, msg: String| DataError::InvalidArgument { field, msg };
    if d == 0 {
        return Err(arg("ggm.d", "need at least one variable".into()));
    }
    if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
        return Err(arg(
            "ggm.weight",
            format!("({lo}, {hi}) must satisfy 0 < lo <= hi < inf"),
        ));
    }
    if !(cfg.diag_margin > 0.0 && cfg.diag_margin.is_finite()) {
        return Err(arg(
            "ggm.diag_margin",
            format!("{} must be positive and finite", cfg.diag_margin),
        ));
    }
    let adjacency = graph_pattern(d, &cfg.shape, rng)?;

    let mut precision = vec![0f64; d * d];
    for i in 0..d {
        for j in i + 1..d {
            if adjacency[i * d + j] {
                let mag = if hi > lo {
                    rng.random_range(lo..hi)
                } else {
                    lo
                };
                let w = if rng.random_bool(0.5) { mag } else { -mag };
                precision[i * d + j] = w;
                precision[j * d + i] = w;
            }
        }
    }
    for i in 0..d {
        let off: f64 = (0..d).map(|j| precision[i * d + j].abs()).sum();
        precision[i * d + i] = off + cfg.diag_margin;
    }

    let chol = cholesky(&precision, d).ok_or_else(|| DataError::InvalidArgument {
        field: "ggm",
        msg: "precision matrix is not positive definite (numerically); lower the weights \
                  or raise diag_margin"
            .into(),
    })?;
    let covariance = inverse_from_cholesky(&chol, d);

    // With Θ = L Lᵀ and z ~ N(0, I), x solving Lᵀ x = z has covariance (L Lᵀ)⁻¹ = Θ⁻¹.
    let mut samples = vec![0f64; cfg.n * d];
    for row in samples.chunks_exact_mut(d) {
        for v in row.iter_mut() {
            *v = rng.sample(StandardNormal);
        }
        solve_upper_transposed(&chol, d, row);
    }
    Ok(Ggm {
        d,
        n: cfg.n,
        adjacency,
        precision,
        covariance,
        samples,
    })
}

fn graph_pattern(d: usize, shape: &GraphShape, rng: &mut impl Rng) -> Result<Vec<bool>> {
    let mut adj = vec![false; d * d];
    let mut link = |i: usize, j: usize| {
        adj[i * d + j] = true;
        adj[j * d + i] = true;
    };
    match shape {
        GraphShape::Random { edge_prob } => {
            if !(0.0..=1.0).contains(edge_prob) {
                return Err(DataError::InvalidArgument {
                    field: "ggm.edge_prob",
                    msg: format!("{edge_prob} is not a probability in [0, 1]"),
                });
            }
            for i in 0..d {
                for j in i + 1..d {
                    if rng.random_bool(*edge_prob) {
                        link(i, j);
                    }
                }
            }
        }
        GraphShape::Chain => {
            for i in 1..d {
                link(i - 1, i);
            }
        }
        GraphShape::Grid { cols } => {
            let cols = *cols;
            if cols == 0 || !d.is_multiple_of(cols) {
                return Err(DataError::InvalidArgument {
                    field: "ggm.grid.cols",
                    msg: format!("d = {d} is not a positive multiple of cols = {cols}"),
                });
            }
            for i in 0..d {
                if (i + 1) % cols != 0 {
                    link(i, i + 1);
                }
                if i + cols < d {
                    link(i, i + cols);
                }
            }
        }
    }
    Ok(adj)
}

/// The lower Cholesky factor `L` (row-major, `A = L Lᵀ`) of a symmetric `d x d` matrix, or
/// `None` when it is not (numerically) positive definite — which makes this the positive
/// definiteness test too.
pub fn cholesky(a: &[f64], d: usize) -> Option<Vec<f64>> {
    if a.len() != d * d {
        return None;
    }
    let mut l = vec![0f64; d * d];
    for i in 0..d {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i * d + k] * l[j * d + k]).sum();
            if i == j {
                let v = a[i * d + i] - s;
                if v.is_nan() || v <= 0.0 {
                    return None;
                }
                l[i * d + i] = v.sqrt();
            } else {
                l[i * d + j] = (a[i * d + j] - s) / l[j * d + j];
            }
        }
    }
    Some(l)
}

/// Solves `L y = b` in place (forward substitution).
fn solve_lower(l: &[f64], d: usize, b: &mut [f64]) {
    for i in 0..d {
        let s: f64 = (0..i).map(|k| l[i * d + k] * b[k]).sum();
        b[i] = (b[i] - s) / l[i * d + i];
    }
}

/// Solves `Lᵀ x = b` in place (back substitution on the transpose).
fn solve_upper_transposed(l: &[f64], d: usize, b: &mut [f64]) {
    for i in (0..d).rev() {
        let s: f64 = (i + 1..d).map(|k| l[k * d + i] * b[k]).sum();
        b[i] = (b[i] - s) / l[i * d + i];
    }
}

fn inverse_from_cholesky(l: &[f64], d: usize) -> Vec<f64> {
    let mut inv = vec![0f64; d * d];
    let mut col = vec![0f64; d];
    for j in 0..d {
        col.iter_mut().for_each(|v| *v = 0.0);
        col[j] = 1.0;
        solve_lower(l, d, &mut col);
        solve_upper_transposed(l, d, &mut col);
        for i in 0..d {
            inv[i * d + j] = col[i];
        }
    }
    // Symmetrise away rounding so downstream code may rely on exact symmetry.
    for i in 0..d {
        for j in i + 1..d {
            let m = 0.5 * (inv[i * d + j] + inv[j * d + i]);
            inv[i * d + j] = m;
            inv[j * d + i] = m;
        }
    }
    inv
}

/// The exact conditional mean `E[x_u | x_k = values]` of a Gaussian with the given `d x d`
/// precision Θ and mean μ: `μ_u − Θ_uu⁻¹ Θ_uk (values − μ_k)`.
///
/// `known` lists the observed variables (distinct, `< d`) and `values` their values, in the same
/// order. Returns the means of the other variables in increasing index order.
pub fn conditional_mean(
    precision: &[f64],
    mean: &[f64],
    known: &[usize],
    values: &[f64],
) -> Result<Vec<f64>> {
    let d = mean.len();
    let arg = |msg: String| DataError::InvalidArgument {
        field: "conditional_mean",
        msg,
    };
    if precision.len() != d * d {
        return Err(arg(format!(
            "precision has {} entries; a mean of length {d} needs {}",
            precision.len(),
            d * d
        )));
    }
    if known.len() != values.len() {
        return Err(arg(format!(
            "{} known indices but {} values",
            known.len(),
            values.len()
        )));
    }
    let mut is_known = vec![false; d];
    for &k in known {
        if k >= d || is_known[k] {
            return Err(arg(format!(
                "known index {k} is out of range (d = {d}) or repeated"
            )));
        }
        is_known[k] = true;
    }
    let unknown: Vec<usize> = (0..d).filter(|&i| !is_known[i]).collect();
    let u = unknown.len();
    let mut quu = vec![0f64; u * u];
    let mut rhs = vec![0f64; u];
    for (a, &i) in unknown.iter().enumerate() {
        for (b, &j) in unknown.iter().enumerate() {
            quu[a * u + b] = precision[i * d + j];
        }
        rhs[a] = known
            .iter()
            .zip(values)
            .map(|(&k, &v)| precision[i * d + k] * (v - mean[k]))
            .sum();
    }
    let l = cholesky(&quu, u).ok_or_else(|| {
        arg("the unknown variables' block of the precision is not positive definite".into())
    })?;
    solve_lower(&l, u, &mut rhs);
    solve_upper_transposed(&l, u, &mut rhs);
    Ok(unknown
        .iter()
        .zip(rhs)
        .map(|(&i, delta)| mean[i] - delta)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_of_2x2() {
        let l = cholesky(&[4.0, 2.0, 2.0, 3.0], 2).unwrap();
        let expect = [2.0, 0.0, 1.0, 2f64.sqrt()];
        for (a, b) in l.iter().zip(expect) {
            assert!((a - b).abs() < 1e-12);
        }
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn grid_pattern_has_lattice_edges() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let adj = graph_pattern(6, &GraphShape::Grid { cols: 3 }, &mut rng).unwrap();
        // 2 rows of 3: 2*2 horizontal + 3 vertical edges.
        assert_eq!(adj.iter().filter(|&&a| a).count() / 2, 7);
        assert!(adj[1] && adj[3] && !adj[2 * 6 + 3]);
    }
}
