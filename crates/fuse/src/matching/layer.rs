//! PFNM for one layer on plain matrices: hidden units are rows, the score is built from matrix
//! products, each client's units are assigned by a rectangular linear sum assignment (`lsap`).
//!
//! Follows `match_layer` of IBM/probabilistic-federated-neural-matching `matching/pfnm.py`
//! (@ f44cf42): natural parameters `eta = tau0*mu0 + sum s_j*w`, `lambda = tau0 + sum s_j`, greedy
//! initial pass in order of decreasing width, then `iters` refinement passes in a random client
//! order, each removing one client's contributions and matching it again.

use rand::Rng;
use rand::seq::SliceRandom;

use crate::{FuseError, Result};

/// Popularity counts are truncated at this value in the score (as the reference code).
pub const POPULARITY_CAP: usize = 10;

/// A dense row-major f64 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Matrix {
    /// A matrix from row-major values; `data.len()` must be `rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(FuseError::InvalidInput(format!(
                "a {rows} x {cols} matrix needs {} values but {} were given",
                rows.saturating_mul(cols),
                data.len()
            )));
        }
        Ok(Self { rows, cols, data })
    }

    /// A matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row-major values.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// Row `r`.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`, mutable.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row_mut(&mut self, r: usize) -> &mut [f64] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The entry at row `r`, column `c`.
    ///
    /// # Panics
    /// If out of range.
    pub fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    /// The transpose.
    pub fn transpose(&self) -> Matrix {
        let mut t = Matrix::zeros(self.cols, self.rows);
        for r in 0..self.rows {
            for c in 0..self.cols {
                t.data[c * self.rows + r] = self.data[r * self.cols + c];
            }
        }
        t
    }

    /// Columns `from..to` of every row, as a new matrix.
    ///
    /// # Panics
    /// If `from > to` or `to > cols`.
    pub fn columns(&self, from: usize, to: usize) -> Matrix {
        let mut data = Vec::with_capacity(self.rows * (to - from));
        for r in 0..self.rows {
            data.extend_from_slice(&self.row(r)[from..to]);
        }
        Matrix {
            rows: self.rows,
            cols: to - from,
            data,
        }
    }

    fn push_row(&mut self, row: impl IntoIterator<Item = f64>) {
        self.data.extend(row);
        self.rows += 1;
        debug_assert_eq!(self.data.len(), self.rows * self.cols);
    }

    fn remove_row(&mut self, r: usize) {
        self.data.drain(r * self.cols..(r + 1) * self.cols);
        self.rows -= 1;
    }
}

/// One client's hidden units for a layer: unit vectors as rows and the client's precision
/// (inverse variance) per coordinate.
#[derive(Clone, Debug)]
pub struct ClientUnits {
    /// `L_j x P`: one row per local unit (incoming weights, bias, outgoing weights, as the
    /// layer's coordinate layout says).
    pub units: Matrix,
    /// `P` precisions `s_j`; 0 marks a coordinate the client did not observe.
    pub precision: Vec<f64>,
}

/// The Gaussian prior of global units, per coordinate.
#[derive(Clone, Debug)]
pub struct LayerPrior {
    /// Prior mean `mu0` (0 for weights, 0.1 for biases in the reference).
    pub mean: Vec<f64>,
    /// Prior precision `tau0 = 1/sigma0` (positive).
    pub precision: Vec<f64>,
}

/// Settings of one layer's matching (already checked).
#[derive(Clone, Copy, Debug)]
pub struct LayerSettings {
    /// Mass parameter of the Beta process (`gamma`, positive).
    pub gamma: f64,
    /// Refinement passes after the greedy pass.
    pub iters: usize,
    /// Soft cap on global units: a client is offered `min(L_j, max(cap - L, 1))` new units.
    pub max_global: usize,
}

/// Where the client order of each refinement pass comes from.
pub trait OrderSource {
    /// A permutation of `0..clients` for the next refinement pass.
    fn next_order(&mut self, clients: usize) -> Result<Vec<usize>>;
}

/// Fresh random orders from a seeded generator (the reference's `np.random.permutation(J)`).
#[derive(Debug)]
pub struct RngOrder<'a, R: Rng + ?Sized>(pub &'a mut R);

impl<R: Rng + ?Sized> OrderSource for RngOrder<'_, R> {
    fn next_order(&mut self, clients: usize) -> Result<Vec<usize>> {
        let mut order: Vec<usize> = (0..clients).collect();
        order.shuffle(self.0);
        Ok(order)
    }
}

/// Replays recorded orders, one per (layer, pass) in the order they are asked for (top hidden
/// layer first, passes in order): parity with runs of the reference code.
#[derive(Clone, Debug)]
pub struct ReplayOrder {
    orders: Vec<Vec<usize>>,
    next: usize,
}

impl ReplayOrder {
    /// Replays `orders` in turn.
    pub fn new(orders: Vec<Vec<usize>>) -> Self {
        Self { orders, next: 0 }
    }

    /// Orders not yet replayed.
    pub fn remaining(&self) -> usize {
        self.orders.len() - self.next
    }
}

impl OrderSource for ReplayOrder {
    fn next_order(&mut self, clients: usize) -> Result<Vec<usize>> {
        let Some(order) = self.orders.get(self.next) else {
            return Err(FuseError::InvalidInput(format!(
                "replay: refinement pass {} asked for an order but only {} were recorded",
                self.next + 1,
                self.orders.len()
            )));
        };
        let mut seen = vec![false; clients];
        for &j in order {
            match seen.get_mut(j) {
                Some(s) if !*s => *s = true,
                _ => {
                    return Err(FuseError::InvalidInput(format!(
                        "replay: order {} ({order:?}) is not a permutation of 0..{clients}",
                        self.next
                    )));
                }
            }
        }
        if order.len() != clients {
            return Err(FuseError::InvalidInput(format!(
                "replay: order {} ({order:?}) is not a permutation of 0..{clients}",
                self.next
            )));
        }
        self.next += 1;
        Ok(order.clone())
    }
}

/// The result of matching one layer.
#[derive(Clone, Debug)]
pub struct LayerMatch {
    /// Client -> local unit -> global unit.
    pub assignments: Vec<Vec<usize>>,
    /// `L x P` precision-weighted sums `eta`.
    pub eta: Matrix,
    /// `L x P` posterior precisions `lambda`.
    pub lambda: Matrix,
    /// Number of clients matched to each global unit.
    pub counts: Vec<usize>,
}

impl LayerMatch {
    /// Number of global units.
    pub fn width(&self) -> usize {
        self.counts.len()
    }

    /// Posterior means `eta / lambda` (the global units, `L x P`).
    pub fn posterior_mean(&self) -> Matrix {
        Matrix {
            rows: self.eta.rows,
            cols: self.eta.cols,
            data: self
                .eta
                .data
                .iter()
                .zip(&self.lambda.data)
                .map(|(e, l)| e / l)
                .collect(),
        }
    }
}

/// Current global units in natural parameters (all clients but the one being matched).
#[derive(Clone, Debug)]
pub struct GlobalUnits {
    /// `L x P` precision-weighted sums.
    pub eta: Matrix,
    /// `L x P` posterior precisions.
    pub lambda: Matrix,
    /// Clients matched to each unit.
    pub counts: Vec<usize>,
}

/// The PFNM assignment score (maximised) of client units against the current global units:
/// `L_j x (L + new)`; columns `L..` offer `new` fresh global units.
///
/// `x` are the client's precision-weighted units `s_j * w` (`L_j x P`), `s` its precisions.
/// Existing unit `i`: `sum_p[(eta+x)^2/(lambda+s) - eta^2/lambda] + log(c/(J-c))`, `c =
/// min(count, 10)`; new unit `k = 1..new`: `sum_p[(tau0 mu0 + x)^2/(tau0+s) - (tau0 mu0)^2/tau0]
/// - 2 log k + 2 log(gamma/J)`. The parameter part is computed as
/// `base_i + [2x, x*x] . [eta*A, A]^T` with `A = 1/(lambda+s)`: one matrix product.
///
/// A GPI-FNM term (`- eps * KL`) is another `L_j x (L + new)` matrix added to this one.
pub fn pfnm_scores(
    global: &GlobalUnits,
    x: &Matrix,
    s: &[f64],
    prior: &LayerPrior,
    gamma: f64,
    clients: usize,
    new: usize,
) -> Matrix {
    let l_glob = global.eta.rows;
    let p = x.cols;
    let lj = x.rows;
    let width = l_glob + new;
    let mut out = Matrix::zeros(lj, width);

    // Existing units: G = [eta*A, A] (L x 2P), base_i, then X2 = [2x, x*x] (Lj x 2P).
    if l_glob > 0 {
        let mut g = Vec::with_capacity(l_glob * 2 * p);
        let mut base = Vec::with_capacity(l_glob);
        for i in 0..l_glob {
            let eta = global.eta.row(i);
            let lam = global.lambda.row(i);
            let mut b = 0.0;
            let start = g.len();
            for ((e, l), sp) in eta.iter().zip(lam).zip(s) {
                let a = 1.0 / (l + sp);
                b += e * e * a - e * e / l;
                g.push(e * a);
            }
            for (l, sp) in lam.iter().zip(s) {
                g.push(1.0 / (l + sp));
            }
            debug_assert_eq!(g.len() - start, 2 * p);
            let c = global.counts[i].min(POPULARITY_CAP) as f64;
            base.push(b + (c / (clients as f64 - c)).ln());
        }
        let mut x2 = Vec::with_capacity(lj * 2 * p);
        for l in 0..lj {
            let row = x.row(l);
            x2.extend(row.iter().map(|v| 2.0 * v));
            x2.extend(row.iter().map(|v| v * v));
        }
        let n = 2 * p;
        // Four client rows at a time share each load of a global row.
        let mut l = 0;
        while l < lj {
            let block = (lj - l).min(4);
            for (i, bi) in base.iter().enumerate() {
                let gi = &g[i * n..(i + 1) * n];
                let d = if block == 4 {
                    dot4(&x2[l * n..(l + 4) * n], gi, n)
                } else {
                    let mut d = [0.0; 4];
                    for (r, dr) in d.iter_mut().enumerate().take(block) {
                        *dr = dot(&x2[(l + r) * n..(l + r + 1) * n], gi);
                    }
                    d
                };
                for (r, dr) in d.iter().enumerate().take(block) {
                    out.data[(l + r) * width + i] = bi + dr;
                }
            }
            l += block;
        }
    }

    // New units: the same value for every offered column but the -2 log k penalty.
    if new > 0 {
        let mu_norm: Vec<f64> = prior
            .mean
            .iter()
            .zip(&prior.precision)
            .map(|(m, t)| m * t)
            .collect();
        let prior_norm: f64 = mu_norm
            .iter()
            .zip(&prior.precision)
            .map(|(m, t)| m * m / t)
            .sum();
        let shift = 2.0 * (gamma / clients as f64).ln();
        for l in 0..lj {
            let v: f64 = x
                .row(l)
                .iter()
                .zip(&mu_norm)
                .zip(prior.precision.iter().zip(s))
                .map(|((xv, m), (t, sp))| (m + xv) * (m + xv) / (t + sp))
                .sum::<f64>()
                - prior_norm;
            let o = &mut out.data[l * width + l_glob..(l + 1) * width];
            for (k, oi) in o.iter_mut().enumerate() {
                *oi = v - 2.0 * ((k + 1) as f64).ln() + shift;
            }
        }
    }
    out
}

/// Dot product with four accumulators (lets the compiler vectorise).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut ca = a.chunks_exact(4);
    let mut cb = b.chunks_exact(4);
    for (x, y) in (&mut ca).zip(&mut cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Dot products of four consecutive rows of `a` (each `n` long) with `b`.
fn dot4(a: &[f64], b: &[f64], n: usize) -> [f64; 4] {
    let (a0, rest) = a.split_at(n);
    let (a1, rest) = rest.split_at(n);
    let (a2, a3) = rest.split_at(n);
    let mut acc = [[0.0f64; 4]; 4];
    let rows = [a0, a1, a2, a3].map(|r| r.chunks_exact(4));
    let [mut c0, mut c1, mut c2, mut c3] = rows;
    for bc in b.chunks_exact(4) {
        let (Some(x0), Some(x1), Some(x2), Some(x3)) = (c0.next(), c1.next(), c2.next(), c3.next())
        else {
            break;
        };
        for q in 0..4 {
            acc[0][q] += x0[q] * bc[q];
            acc[1][q] += x1[q] * bc[q];
            acc[2][q] += x2[q] * bc[q];
            acc[3][q] += x3[q] * bc[q];
        }
    }
    let tail_b = &b[n - n % 4..n];
    let mut out = [0.0; 4];
    for (r, (o, ar)) in out.iter_mut().zip([a0, a1, a2, a3]).enumerate() {
        let t: f64 = ar[n - n % 4..].iter().zip(tail_b).map(|(x, y)| x * y).sum();
        *o = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]) + t;
    }
    out
}

/// Matches one layer: greedy pass, then `settings.iters` refinement passes whose client orders
/// come from `orders`.
///
/// Every client must have at least one unit, `P` precisions (finite, non-negative) and `P`
/// columns; the prior must have `P` positive precisions.
pub fn match_layer(
    clients: &[ClientUnits],
    prior: &LayerPrior,
    settings: &LayerSettings,
    orders: &mut dyn OrderSource,
) -> Result<LayerMatch> {
    let j_total = clients.len();
    let Some(first) = clients.first() else {
        return Err(FuseError::Empty);
    };
    let p = first.units.cols;
    if prior.mean.len() != p || prior.precision.len() != p {
        return Err(FuseError::InvalidInput(format!(
            "layer prior has {} means and {} precisions for {p} coordinates",
            prior.mean.len(),
            prior.precision.len()
        )));
    }
    if let Some(t) = prior
        .precision
        .iter()
        .find(|t| !(t.is_finite() && **t > 0.0))
    {
        return Err(FuseError::InvalidInput(format!(
            "layer prior precision {t} is not a positive number"
        )));
    }
    for (j, c) in clients.iter().enumerate() {
        if c.units.cols != p || c.precision.len() != p {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: {} coordinates and {} precisions per unit where {p} were expected",
                c.units.cols,
                c.precision.len()
            )));
        }
        if c.units.rows == 0 {
            return Err(FuseError::InvalidInput(format!("client {j}: no units")));
        }
        if c.precision.iter().any(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: precisions must be finite and non-negative"
            )));
        }
        if c.units.data.iter().any(|v| !v.is_finite()) {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: unit values must be finite"
            )));
        }
    }

    // x_j = s_j * w_j
    let xs: Vec<Matrix> = clients
        .iter()
        .map(|c| Matrix {
            rows: c.units.rows,
            cols: p,
            data: c
                .units
                .data
                .chunks_exact(p)
                .flat_map(|row| row.iter().zip(&c.precision).map(|(w, s)| w * s))
                .collect(),
        })
        .collect();
    let mu_norm: Vec<f64> = prior
        .mean
        .iter()
        .zip(&prior.precision)
        .map(|(m, t)| m * t)
        .collect();

    // Greedy order: widest first, stable.
    let mut order0: Vec<usize> = (0..j_total).collect();
    order0.sort_by_key(|&j| std::cmp::Reverse(clients[j].units.rows));
    let j0 = order0[0];
    let mut global = GlobalUnits {
        eta: Matrix::zeros(0, p),
        lambda: Matrix::zeros(0, p),
        counts: Vec::new(),
    };
    let mut assignments = vec![Vec::new(); j_total];
    for l in 0..xs[j0].rows {
        global
            .eta
            .push_row(mu_norm.iter().zip(xs[j0].row(l)).map(|(m, x)| m + x));
        global.lambda.push_row(
            prior
                .precision
                .iter()
                .zip(&clients[j0].precision)
                .map(|(t, s)| t + s),
        );
        global.counts.push(1);
        assignments[j0].push(l);
    }
    let ctx = Ctx {
        clients,
        xs: &xs,
        prior,
        mu_norm: &mu_norm,
        settings,
    };
    for &j in &order0[1..] {
        assignments[j] = ctx.match_client(&mut global, j)?;
    }

    for _ in 0..settings.iters {
        let order = orders.next_order(j_total)?;
        for j in order {
            // Remove client j, highest global index first.
            let mut pairs: Vec<(usize, usize)> =
                assignments[j].iter().copied().enumerate().collect();
            pairs.sort_by_key(|&(_, i)| std::cmp::Reverse(i));
            for (l, i) in pairs {
                global.counts[i] -= 1;
                if global.counts[i] == 0 {
                    global.counts.remove(i);
                    global.eta.remove_row(i);
                    global.lambda.remove_row(i);
                    for (jc, a) in assignments.iter_mut().enumerate() {
                        if jc != j {
                            for g in a.iter_mut().filter(|g| **g > i) {
                                *g -= 1;
                            }
                        }
                    }
                } else {
                    for (e, x) in global.eta.row_mut(i).iter_mut().zip(xs[j].row(l)) {
                        *e -= x;
                    }
                    for (lam, s) in global
                        .lambda
                        .row_mut(i)
                        .iter_mut()
                        .zip(&clients[j].precision)
                    {
                        *lam -= s;
                    }
                }
            }
            assignments[j] = ctx.match_client(&mut global, j)?;
        }
    }

    Ok(LayerMatch {
        assignments,
        eta: global.eta,
        lambda: global.lambda,
        counts: global.counts,
    })
}

struct Ctx<'a> {
    clients: &'a [ClientUnits],
    xs: &'a [Matrix],
    prior: &'a LayerPrior,
    mu_norm: &'a [f64],
    settings: &'a LayerSettings,
}

impl Ctx<'_> {
    /// Scores client `j` against `global`, solves the assignment and adds `j` to `global`.
    fn match_client(&self, global: &mut GlobalUnits, j: usize) -> Result<Vec<usize>> {
        let x = &self.xs[j];
        let s = &self.clients[j].precision;
        let l_glob = global.counts.len();
        let lj = x.rows;
        // Reference: min(L_j, max(cap - L, 1)); never fewer than needed to place every unit.
        let new = lj
            .min(self.settings.max_global.saturating_sub(l_glob).max(1))
            .max(lj.saturating_sub(l_glob));
        let score = pfnm_scores(
            global,
            x,
            s,
            self.prior,
            self.settings.gamma,
            self.clients.len(),
            new,
        );
        let (rows, cols) = lsap::solve(lj, score.cols, &score.data, true).map_err(|e| {
            FuseError::Solver(format!(
                "client {j}: assignment of {lj} units to {} columns failed ({e:?}); the score \
                 has non-finite entries: check sigma, sigma0 and gamma",
                score.cols
            ))
        })?;
        if rows.len() != lj {
            return Err(FuseError::Solver(format!(
                "client {j}: only {} of {lj} units were assigned",
                rows.len()
            )));
        }
        let mut col_of = vec![0usize; lj];
        for (r, c) in rows.into_iter().zip(cols) {
            col_of[r] = c;
        }
        let mut assignment = Vec::with_capacity(lj);
        for (l, &c) in col_of.iter().enumerate() {
            if c < l_glob {
                global.counts[c] += 1;
                for (e, xv) in global.eta.row_mut(c).iter_mut().zip(x.row(l)) {
                    *e += xv;
                }
                for (lam, sp) in global.lambda.row_mut(c).iter_mut().zip(s) {
                    *lam += sp;
                }
                assignment.push(c);
            } else {
                // New units are numbered in row order, whichever offered column was picked.
                assignment.push(global.counts.len());
                global.counts.push(1);
                global
                    .eta
                    .push_row(self.mu_norm.iter().zip(x.row(l)).map(|(m, xv)| m + xv));
                global
                    .lambda
                    .push_row(self.prior.precision.iter().zip(s).map(|(t, sp)| t + sp));
            }
        }
        Ok(assignment)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    fn random(rng: &mut StdRng, rows: usize, cols: usize, lo: f64, hi: f64) -> Matrix {
        let data = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
        Matrix { rows, cols, data }
    }

    /// The reference's `compute_cost`: one row at a time, no algebra.
    #[allow(clippy::needless_range_loop)]
    fn per_row_scores(
        global: &GlobalUnits,
        x: &Matrix,
        s: &[f64],
        prior: &LayerPrior,
        gamma: f64,
        clients: usize,
        new: usize,
    ) -> Matrix {
        let l_glob = global.eta.rows;
        let mut out = Matrix::zeros(x.rows, l_glob + new);
        for l in 0..x.rows {
            for i in 0..l_glob {
                let mut v = 0.0;
                for p in 0..x.cols {
                    let e = global.eta.get(i, p);
                    let lam = global.lambda.get(i, p);
                    let xv = x.get(l, p);
                    v += (e + xv).powi(2) / (lam + s[p]) - e.powi(2) / lam;
                }
                let c = global.counts[i].min(10) as f64;
                out.data[l * (l_glob + new) + i] = v + (c / (clients as f64 - c)).ln();
            }
            for k in 0..new {
                let mut v = 0.0;
                for p in 0..x.cols {
                    let m = prior.mean[p] * prior.precision[p];
                    v += (m + x.get(l, p)).powi(2) / (prior.precision[p] + s[p])
                        - m * m / prior.precision[p];
                }
                v += -2.0 * ((k + 1) as f64).ln() + 2.0 * (gamma / clients as f64).ln();
                out.data[l * (l_glob + new) + l_glob + k] = v;
            }
        }
        out
    }

    #[test]
    fn matrix_product_score_equals_per_row_score() {
        let mut rng = StdRng::seed_from_u64(7);
        for (lj, l_glob, p, new) in [(5, 7, 9, 5), (3, 0, 4, 3), (8, 12, 33, 1), (1, 1, 1, 1)] {
            let eta = random(&mut rng, l_glob, p, -3.0, 3.0);
            let lambda = random(&mut rng, l_glob, p, 0.5, 40.0);
            let counts = (0..l_glob).map(|i| 1 + i % 13).collect();
            let global = GlobalUnits {
                eta,
                lambda,
                counts,
            };
            let x = random(&mut rng, lj, p, -5.0, 5.0);
            let mut s: Vec<f64> = (0..p).map(|_| rng.random_range(0.0..20.0)).collect();
            s[0] = 0.0;
            let prior = LayerPrior {
                mean: (0..p).map(|_| rng.random_range(-0.2..0.2)).collect(),
                precision: (0..p).map(|_| rng.random_range(0.1..2.0)).collect(),
            };
            let fast = pfnm_scores(&global, &x, &s, &prior, 1.7, 20, new);
            let slow = per_row_scores(&global, &x, &s, &prior, 1.7, 20, new);
            assert_eq!((fast.rows, fast.cols), (slow.rows, slow.cols));
            for (a, b) in fast.data.iter().zip(&slow.data) {
                assert!(
                    (a - b).abs() <= 1e-9 * (1.0 + b.abs()),
                    "{a} vs {b} ({lj}x{l_glob}x{p})"
                );
            }
        }
    }

    #[test]
    fn replay_rejects_non_permutations() {
        let mut r = ReplayOrder::new(vec![vec![0, 0, 1], vec![2, 0]]);
        assert!(r.next_order(3).is_err());
        let mut r = ReplayOrder::new(vec![vec![2, 0]]);
        assert!(r.next_order(3).is_err());
        let mut r = ReplayOrder::new(vec![vec![2, 0, 1]]);
        assert_eq!(r.next_order(3).ok(), Some(vec![2, 0, 1]));
        assert!(r.next_order(3).is_err());
    }

    #[test]
    fn a_tight_cap_still_places_every_unit() {
        let mut rng = StdRng::seed_from_u64(2);
        let clients = [5usize, 2, 4].map(|h| ClientUnits {
            units: random(&mut rng, h, 3, -10.0, 10.0),
            precision: vec![100.0; 3],
        });
        let prior = LayerPrior {
            mean: vec![0.0; 3],
            precision: vec![1.0; 3],
        };
        let settings = LayerSettings {
            gamma: 1.0,
            iters: 3,
            max_global: 1,
        };
        let m = match_layer(&clients, &prior, &settings, &mut RngOrder(&mut rng))
            .expect("a tight cap is feasible");
        for (c, a) in clients.iter().zip(&m.assignments) {
            assert_eq!(a.len(), c.units.rows());
            let mut s = a.clone();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), a.len());
            assert!(a.iter().all(|&g| g < m.width()));
        }
        let total: usize = m.counts.iter().sum();
        assert_eq!(total, 11);
    }

    #[test]
    fn one_client_keeps_its_units() {
        let mut rng = StdRng::seed_from_u64(1);
        let units = random(&mut rng, 4, 3, -1.0, 1.0);
        let clients = [ClientUnits {
            units: units.clone(),
            precision: vec![1.0; 3],
        }];
        let prior = LayerPrior {
            mean: vec![0.0; 3],
            precision: vec![1.0; 3],
        };
        let settings = LayerSettings {
            gamma: 1.0,
            iters: 2,
            max_global: 700,
        };
        let m = match_layer(&clients, &prior, &settings, &mut RngOrder(&mut rng))
            .expect("one client matches");
        assert_eq!(m.assignments, vec![vec![0, 1, 2, 3]]);
        let mean = m.posterior_mean();
        for (a, b) in mean.data.iter().zip(&units.data) {
            assert!((a - b / 2.0).abs() < 1e-12);
        }
    }
}
