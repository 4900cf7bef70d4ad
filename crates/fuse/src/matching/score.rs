//! Assignment scores of one client's units against the global units, PFNM plus the GPI-FNM
//! term, as one matrix product per client match.
//!
//! For global unit `i` the score of client unit `l` is `base_i + sum_p (2 x_p eta_ip A'_ip +
//! x_p^2 A'_ip)` (see [`pfnm_scores`]). The squared part needs one number per *run* of
//! coordinates over which the prior precision, the client precisions and every global unit's
//! `lambda` are constant: there `sum_p x_p^2 A'_ip = A'_i,run * sum_p x_p^2`. In PFNM's layers
//! all incoming weights and the bias share one precision, so the product is `[x, per-run sums
//! of x^2] . [2 eta*A', A'_run]`, `P + runs` wide instead of `2P`, and its left side is
//! computed once per client and layer.

use std::ops::Range;

use fedfuse_core::linalg::{Mat, matmul};
use rayon::prelude::*;

use super::types::{
    Global, GlobalUnits, LayerPrior, LayerSettings, Matrix, NO_UNIT, POPULARITY_CAP,
};
use crate::{FuseError, Result};

/// Roughly the number of values one parallel task should handle: below this, handing work to
/// another thread costs more than it saves.
const VALUES_PER_TASK: usize = 1 << 14;

/// Rows of `p` values per parallel task.
pub(super) fn min_rows_per_task(p: usize) -> usize {
    VALUES_PER_TASK.div_ceil(p.max(1))
}

/// Splits `0..len` into maximal runs of consecutive coordinates `p` with `same(start, p)`.
pub(super) fn runs(len: usize, same: impl Fn(usize, usize) -> bool) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for p in 1..=len {
        if p == len || !same(start, p) {
            out.push(start..p);
            start = p;
        }
    }
    out
}

/// Runs of coordinates where the prior precision and every client's precision are constant:
/// every global unit's lambda is then constant there too, since each coordinate of a run sees
/// the same additions and subtractions, so lambda is kept once per run.
pub(super) fn precision_runs(prior: &LayerPrior, precisions: &[&[f64]]) -> Vec<Range<usize>> {
    runs(prior.precision.len(), |a, b| {
        prior.precision[a] == prior.precision[b] && precisions.iter().all(|s| s[a] == s[b])
    })
}

/// One client's units, prepared once per layer: rows `[x, per-run sums of x^2]` and the score of
/// opening a new unit without its column penalty (neither depends on the global units).
#[derive(Clone, Debug)]
pub(super) struct ClientRows {
    rows: usize,
    p: usize,
    width: usize,
    lhs: Vec<f64>,
    new_value: Vec<f64>,
    s_runs: Vec<f64>,
}

impl ClientRows {
    /// `fill_x(l, row)` writes `x_l = s * w_l` into `row` (`P` long).
    pub(super) fn new(
        rows: usize,
        s: &[f64],
        prior: &LayerPrior,
        runs: &[Range<usize>],
        eps: f64,
        mut fill_x: impl FnMut(usize, &mut [f64]),
    ) -> Self {
        let p = s.len();
        let width = p + runs.len();
        let mut lhs = vec![0.0; rows * width];
        let prior_norm: f64 = prior
            .mean
            .iter()
            .zip(&prior.precision)
            .map(|(m, t)| m * t * m)
            .sum();
        let mut new_value = Vec::with_capacity(rows);
        for (l, row) in lhs.chunks_exact_mut(width).enumerate() {
            let (x, sq) = row.split_at_mut(p);
            fill_x(l, x);
            for (q, r) in sq.iter_mut().zip(runs) {
                *q = sum4(&x[r.clone()], |v| v * v);
            }
            // Per run: tau0 and s are one number each, so one division per run.
            let mut v = -prior_norm;
            let mut c = 0.0;
            for r in runs {
                let (t, sp) = (prior.precision[r.start], s[r.start]);
                let inv = 1.0 / (t + sp);
                let (xr, mr) = (&x[r.clone()], &prior.mean[r.clone()]);
                v += inv * sum4_pairs(xr, mr, |xv, m| (t * m + xv) * (t * m + xv));
                if eps != 0.0 {
                    // GPI-FNM cost of a new unit, Q(tau0 mu0 + x, tau0 + s).
                    let d2 = sum4_pairs(xr, mr, |xv, m| (xv - sp * m) * (xv - sp * m));
                    c += sp * inv * inv * d2;
                }
            }
            new_value.push(v - eps * c);
        }
        Self {
            rows,
            p,
            width,
            lhs,
            new_value,
            s_runs: runs.iter().map(|r| s[r.start]).collect(),
        }
    }

    /// The client's precision on each run.
    pub(super) fn s_runs(&self) -> &[f64] {
        &self.s_runs
    }

    /// Number of units.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// `x_l = s * w_l`.
    pub(super) fn x(&self, l: usize) -> &[f64] {
        &self.lhs[l * self.width..l * self.width + self.p]
    }
}

/// Scores client units against global units, reusing its buffers from one match to the next.
#[derive(Debug)]
pub(super) struct Scorer<'a> {
    prior: &'a LayerPrior,
    runs: &'a [Range<usize>],
    gamma: f64,
    eps: f64,
    clients: usize,
    /// `L x (P + runs)`: `[2 eta*A', A'_run]` per global unit.
    rhs: Vec<f64>,
    /// `L`: the score's part that does not depend on the client unit.
    base: Vec<f64>,
    /// `-2 log k + 2 log(gamma/J)` of new column `k = 1..`, as far as needed so far.
    new_penalty: Vec<f64>,
}

impl<'a> Scorer<'a> {
    pub(super) fn new(
        prior: &'a LayerPrior,
        runs: &'a [Range<usize>],
        settings: &LayerSettings,
        clients: usize,
    ) -> Self {
        Self {
            prior,
            runs,
            gamma: settings.gamma,
            eps: settings.eps,
            clients,
            rhs: Vec::new(),
            base: Vec::new(),
            new_penalty: Vec::new(),
        }
    }

    /// Writes the negated `L_j x (L + new)` scores of `client` into `out` (the solver
    /// minimises). First, in the same pass over `eta`, global unit `i` gains `x` of unit
    /// `add.1[i]` of client `add.0` and loses `x` of unit `remove[i]` of `client` (unless
    /// [`NO_UNIT`]); both lookups are `L` long.
    pub(super) fn score(
        &mut self,
        global: &mut Global,
        client: &ClientRows,
        add: (&ClientRows, &[usize]),
        remove: &[usize],
        new: usize,
        out: &mut Vec<f64>,
    ) {
        let l_glob = global.counts.len();
        let width = l_glob + new;
        let k = client.width;
        let p = client.p;
        out.clear();
        out.resize(client.rows * width, 0.0);
        if l_glob > 0 {
            self.rhs.resize(l_glob * k, 0.0);
            self.base.resize(l_glob, 0.0);
            let (prior, runs, eps, clients) = (self.prior, self.runs, self.eps, self.clients);
            let (lambda, counts) = (&global.lambda, &global.counts);
            self.rhs
                .par_chunks_mut(k)
                .zip(&mut self.base)
                .zip(global.eta.data_mut().par_chunks_mut(p))
                .zip(add.1.par_iter().zip(remove))
                .enumerate()
                .with_min_len(min_rows_per_task(k))
                .for_each(|(i, (((row, b), eta), (&plus, &minus)))| {
                    // The reference's order: x added after the last match, then removed.
                    match (plus != NO_UNIT, minus != NO_UNIT) {
                        (true, true) => {
                            let (xa, xr) = (add.0.x(plus), client.x(minus));
                            for ((e, a), r) in eta.iter_mut().zip(xa).zip(xr) {
                                *e = *e + a - r;
                            }
                        }
                        (true, false) => {
                            for (e, a) in eta.iter_mut().zip(add.0.x(plus)) {
                                *e += a;
                            }
                        }
                        (false, true) => {
                            for (e, r) in eta.iter_mut().zip(client.x(minus)) {
                                *e -= r;
                            }
                        }
                        (false, false) => {}
                    }
                    let c = counts[i].min(POPULARITY_CAP) as f64;
                    let popularity = (c / (clients as f64 - c)).ln();
                    let (lam, s) = (lambda.row(i), &client.s_runs);
                    *b = -(negated_rhs_row(eta, lam, s, prior, runs, eps, row) + popularity);
                });
            // out = base + lhs . rhs^T; client units split across threads when worth it.
            let work = client.rows * l_glob * k;
            let tasks = if work < 64 * VALUES_PER_TASK {
                1
            } else {
                rayon::current_num_threads()
            };
            let rows_per_task = client.rows.div_ceil(tasks).max(1);
            let (rhs, base) = (&self.rhs, &self.base);
            out.par_chunks_mut(rows_per_task * width)
                .zip(client.lhs.par_chunks(rows_per_task * k))
                .for_each(|(out, lhs)| {
                    for row in out.chunks_exact_mut(width) {
                        row[..l_glob].copy_from_slice(base);
                    }
                    product_nt(out, width, lhs, rhs, k);
                });
        }
        if new > self.new_penalty.len() {
            let shift = 2.0 * (self.gamma / self.clients as f64).ln();
            let from = self.new_penalty.len();
            self.new_penalty
                .extend((from..new).map(|n| -2.0 * ((n + 1) as f64).ln() + shift));
        }
        let penalty = &self.new_penalty[..new];
        for (row, v) in out.chunks_exact_mut(width).zip(&client.new_value) {
            for (o, pen) in row[l_glob..].iter_mut().zip(penalty) {
                *o = -(v + pen);
            }
        }
    }
}

/// One global unit's row of the product's right-hand side, negated (the solver minimises):
/// `-[2 eta*A', A'_run]`, from its `eta`, its `lam`bda per run and the client's precision `s`
/// per run; returns its base score (not negated, without popularity).
///
/// PFNM: `A = 1/(lambda + s)`, base `sum_p eta^2 (A - 1/lambda)`. GPI-FNM subtracts `eps` times
/// `Q(eta + x, a) - Q(eta, lambda)` with `a = lambda + s`, which expands to
/// `sum_p B e^2 + 2 x B e + x^2 B - Q(eta, lambda)`, `B = (a - tau0)/a^2`, `e = eta - a mu0`:
/// the same shape, so `A' = A - eps B` and the linear coefficient is `eta A - eps B e`.
fn negated_rhs_row(
    eta: &[f64],
    lam: &[f64],
    s: &[f64],
    prior: &LayerPrior,
    runs: &[Range<usize>],
    eps: f64,
    row: &mut [f64],
) -> f64 {
    let p = eta.len();
    let (linear, squared) = row.split_at_mut(p);
    let mut base = 0.0;
    for (((r, sq), &l), &sp) in runs.iter().zip(squared).zip(lam).zip(s) {
        // Within a run lambda, s and tau0 are one number each.
        let t = prior.precision[r.start];
        let a = l + sp;
        let inv = 1.0 / a;
        let eta_r = &eta[r.clone()];
        let lin_r = &mut linear[r.clone()];
        // eta^2 (1/a - 1/lambda) without the cancellation.
        let shrink = -sp / (l * a);
        if eps == 0.0 {
            // Plain PFNM: no GPI arithmetic at all. Scaling by -2 is exact.
            base += shrink * scale_and_sum_squares(lin_r, eta_r, -2.0 * inv);
            *sq = -inv;
        } else {
            let bb = (a - t) * inv * inv;
            let q_scale = (l - t) / (l * l);
            let mean_r = &prior.mean[r.clone()];
            for ((o, e), m) in lin_r.iter_mut().zip(eta_r).zip(mean_r) {
                *o = -2.0 * (e * inv - eps * bb * (e - a * m));
            }
            let ea2 = sum4_pairs(eta_r, mean_r, |e, m| (e - a * m) * (e - a * m));
            let el2 = sum4_pairs(eta_r, mean_r, |e, m| (e - l * m) * (e - l * m));
            base += shrink * sum4(eta_r, |e| e * e) - eps * (bb * ea2 - q_scale * el2);
            *sq = -(inv - eps * bb);
        }
    }
    base
}

/// `out = factor * v`, returning `sum_p v_p^2`, in one pass with four partial sums.
fn scale_and_sum_squares(out: &mut [f64], v: &[f64], factor: f64) -> f64 {
    let mut acc = [0.0; 4];
    let mut oc = out.chunks_exact_mut(4);
    let mut vc = v.chunks_exact(4);
    for (o4, v4) in (&mut oc).zip(&mut vc) {
        for ((o, x), a) in o4.iter_mut().zip(v4).zip(&mut acc) {
            *o = x * factor;
            *a += x * x;
        }
    }
    let mut tail = 0.0;
    for (o, x) in oc.into_remainder().iter_mut().zip(vc.remainder()) {
        *o = x * factor;
        tail += x * x;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `sum_p f(v_p)` with four partial sums: one long chain of dependent additions would leave
/// the adder waiting.
fn sum4(v: &[f64], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0.0; 4];
    let mut chunks = v.chunks_exact(4);
    for c in &mut chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += f(*x);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|x| f(*x)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `sum_p f(u_p, v_p)` with four partial sums (as [`sum4`]).
fn sum4_pairs(u: &[f64], v: &[f64], f: impl Fn(f64, f64) -> f64) -> f64 {
    let mut acc = [0.0; 4];
    let mut cu = u.chunks_exact(4);
    let mut cv = v.chunks_exact(4);
    for (a4, b4) in (&mut cu).zip(&mut cv) {
        for ((a, x), y) in acc.iter_mut().zip(a4).zip(b4) {
            *a += f(*x, *y);
        }
    }
    let tail: f64 = cu
        .remainder()
        .iter()
        .zip(cv.remainder())
        .map(|(x, y)| f(*x, *y))
        .sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// `out[r][c] += lhs[r] . rhs[c]` for the first `rhs.len() / k` columns of every `out` row
/// (`out_stride` apart); `lhs` and `rhs` are row-major with rows `k` long.
pub(super) fn product_nt(out: &mut [f64], out_stride: usize, lhs: &[f64], rhs: &[f64], k: usize) {
    let m = lhs.len() / k;
    let n = rhs.len() / k;
    let (lhs, rhs) = (Mat::rows(lhs, m, k, k), Mat::rows(rhs, n, k, k).t());
    matmul(out, (out_stride, 1), lhs, rhs, true);
}

/// The assignment score (maximised) of client units against the current global units:
/// `L_j x (L + new)`; columns `L..` offer `new` fresh global units.
///
/// `x` are the client's precision-weighted units `s_j * w` (`L_j x P`), `s` its precisions;
/// `settings` gives `gamma` and `eps`, `clients` is `J`.
/// PFNM, existing unit `i`: `sum_p[(eta+x)^2/(lambda+s) - eta^2/lambda] + log(c/(J-c))`, `c =
/// min(count, 10)`; new unit `k = 1..new`:
/// `sum_p[(tau0 mu0 + x)^2/(tau0+s) - (tau0 mu0)^2/tau0] - 2 log k + 2 log(gamma/J)`. The
/// parameter part is computed as `base_i + [2x, x*x] . [eta*A, A]^T` with `A = 1/(lambda+s)`:
/// one matrix product, whose squared half shrinks to one column per run of coordinates with
/// equal precisions.
///
/// With `eps > 0` (GPI-FNM) `eps` times [`gpi_cost`] is subtracted. That cost has the same
/// shape in `x` (a constant, a linear and a squared term per coordinate), so it is folded into
/// the same product: `G = [eta*A - eps*B*e, A - eps*B]` with `B = (a - tau0)/a^2`,
/// `e = eta - a*mu0`, `a = lambda + s`.
///
/// Fails if `x`, `s`, the prior and the global units disagree on `P`, or `counts` on `L`.
pub fn pfnm_scores(
    global: &GlobalUnits,
    x: &Matrix,
    s: &[f64],
    prior: &LayerPrior,
    settings: &LayerSettings,
    clients: usize,
    new: usize,
) -> Result<Matrix> {
    check_shapes(global, x, s, prior)?;
    let p = x.cols();
    // Here lambda is arbitrary: a run must also have one lambda per global unit.
    let runs = runs(p, |a, b| {
        s[a] == s[b]
            && prior.precision[a] == prior.precision[b]
            && (0..global.counts.len()).all(|i| global.lambda.get(i, a) == global.lambda.get(i, b))
    });
    let rows = ClientRows::new(x.rows(), s, prior, &runs, settings.eps, |l, row| {
        row.copy_from_slice(x.row(l));
    });
    let l_glob = global.counts.len();
    let mut lambda = Matrix::zeros(0, runs.len());
    for i in 0..l_glob {
        lambda.push_row(runs.iter().map(|r| global.lambda.get(i, r.start)));
    }
    let mut global = Global {
        eta: global.eta.clone(),
        lambda,
        counts: global.counts.clone(),
    };
    let mut scorer = Scorer::new(prior, &runs, settings, clients);
    let mut out = Vec::new();
    let none = vec![NO_UNIT; l_glob];
    scorer.score(&mut global, &rows, (&rows, &none), &none, new, &mut out);
    // Negation is exact: these are the scores the matching minimises, sign flipped.
    out.iter_mut().for_each(|v| *v = -*v);
    Ok(Matrix::from_parts(x.rows(), l_glob + new, out))
}

/// `x`, `s`, the prior and the global units must agree on `P`; `counts` on `L`.
fn check_shapes(global: &GlobalUnits, x: &Matrix, s: &[f64], prior: &LayerPrior) -> Result<()> {
    let p = x.cols();
    let l_glob = global.counts.len();
    let shapes = [
        ("precisions", s.len(), p),
        ("prior means", prior.mean.len(), p),
        ("prior precisions", prior.precision.len(), p),
        ("eta columns", global.eta.cols(), p),
        ("lambda columns", global.lambda.cols(), p),
        ("eta rows", global.eta.rows(), l_glob),
        ("lambda rows", global.lambda.rows(), l_glob),
    ];
    match shapes.iter().find(|(_, got, want)| got != want) {
        Some((what, got, want)) => Err(FuseError::InvalidInput(format!(
            "{got} {what} where {want} were expected (units have {p} coordinates, there are \
             {l_glob} global units)"
        ))),
        None => Ok(()),
    }
}

/// `Q(eta, lambda) = sum_p (lambda_p - tau0_p) ((eta_p - lambda_p mu0_p) / lambda_p)^2`: for a
/// global unit with natural parameters `eta`, `lambda`, the precision-weighted squared distance
/// of its posterior mean from the prior mean, summed over its members (the paper's
/// `n_i ||theta_i - mu0||^2 / sigma^2` with per-coordinate precisions).
fn gpi_q(
    eta: impl Iterator<Item = f64>,
    lambda: impl Iterator<Item = f64>,
    prior: &LayerPrior,
) -> f64 {
    eta.zip(lambda)
        .zip(prior.precision.iter().zip(&prior.mean))
        .map(|((e, l), (t, m))| {
            let d = (e - l * m) / l;
            (l - t) * d * d
        })
        .sum()
}

/// The GPI-FNM cost `C` (eq. 11 of Xiao & Cheng, per-coordinate precisions), computed straight
/// from its definition: `L_j x (L + new)`, the assignment score of GPI-FNM being the PFNM score
/// minus `eps * C`.
///
/// With `Q` the members' precision-weighted squared distance of a unit's posterior mean from
/// the prior mean, `Q(eta, lambda) = sum_p (lambda_p - tau0_p) ((eta_p - lambda_p mu0_p) /
/// lambda_p)^2`: existing unit `i`, `C = Q(eta_i + x_l, lambda_i + s) - Q(eta_i, lambda_i)`;
/// every new column, `C = Q(tau0 mu0 + x_l, tau0 + s)`. `x` and `s` are as in [`pfnm_scores`],
/// which checks the same shapes.
pub fn gpi_cost(
    global: &GlobalUnits,
    x: &Matrix,
    s: &[f64],
    prior: &LayerPrior,
    new: usize,
) -> Result<Matrix> {
    check_shapes(global, x, s, prior)?;
    let l_glob = global.eta.rows();
    let width = l_glob + new;
    let mut out = Vec::with_capacity(x.rows() * width);
    let without: Vec<f64> = (0..l_glob)
        .map(|i| {
            gpi_q(
                global.eta.row(i).iter().copied(),
                global.lambda.row(i).iter().copied(),
                prior,
            )
        })
        .collect();
    for l in 0..x.rows() {
        let xl = x.row(l);
        for (i, q0) in without.iter().enumerate() {
            let eta = global.eta.row(i).iter().zip(xl).map(|(e, xv)| e + xv);
            let lam = global.lambda.row(i).iter().zip(s).map(|(lv, sp)| lv + sp);
            out.push(gpi_q(eta, lam, prior) - q0);
        }
        let eta = prior
            .mean
            .iter()
            .zip(&prior.precision)
            .zip(xl)
            .map(|((m, t), xv)| t * m + xv);
        let lam = prior.precision.iter().zip(s).map(|(t, sp)| t + sp);
        let c_new = gpi_q(eta, lam, prior);
        out.extend(std::iter::repeat_n(c_new, new));
    }
    Ok(Matrix::from_parts(x.rows(), width, out))
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    fn random(rng: &mut StdRng, rows: usize, cols: usize, lo: f64, hi: f64) -> Matrix {
        let data = (0..rows * cols).map(|_| rng.random_range(lo..hi)).collect();
        Matrix::from_parts(rows, cols, data)
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
        let l_glob = global.eta.rows();
        let mut out = vec![0.0; x.rows() * (l_glob + new)];
        for l in 0..x.rows() {
            for i in 0..l_glob {
                let mut v = 0.0;
                for p in 0..x.cols() {
                    let e = global.eta.get(i, p);
                    let lam = global.lambda.get(i, p);
                    let xv = x.get(l, p);
                    v += (e + xv).powi(2) / (lam + s[p]) - e.powi(2) / lam;
                }
                let c = global.counts[i].min(10) as f64;
                out[l * (l_glob + new) + i] = v + (c / (clients as f64 - c)).ln();
            }
            for k in 0..new {
                let mut v = 0.0;
                for p in 0..x.cols() {
                    let m = prior.mean[p] * prior.precision[p];
                    v += (m + x.get(l, p)).powi(2) / (prior.precision[p] + s[p])
                        - m * m / prior.precision[p];
                }
                v += -2.0 * ((k + 1) as f64).ln() + 2.0 * (gamma / clients as f64).ln();
                out[l * (l_glob + new) + l_glob + k] = v;
            }
        }
        Matrix::from_parts(x.rows(), l_glob + new, out)
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
            let fast = pfnm_scores(&global, &x, &s, &prior, &settings(1.7, 0.0), 20, new)
                .expect("shapes agree");
            let slow = per_row_scores(&global, &x, &s, &prior, 1.7, 20, new);
            assert_eq!((fast.rows(), fast.cols()), (slow.rows(), slow.cols()));
            for (a, b) in fast.data().iter().zip(slow.data()) {
                assert!(
                    (a - b).abs() <= 1e-9 * (1.0 + b.abs()),
                    "{a} vs {b} ({lj}x{l_glob}x{p})"
                );
            }
        }
    }

    fn settings(gamma: f64, eps: f64) -> LayerSettings {
        LayerSettings {
            gamma,
            iters: 0,
            max_global: 700,
            eps,
        }
    }

    #[test]
    fn folded_gpi_score_equals_pfnm_score_minus_eps_times_direct_cost() {
        let mut rng = StdRng::seed_from_u64(11);
        for (lj, l_glob, p, new) in [(5, 7, 9, 5), (3, 0, 4, 3), (8, 12, 33, 1), (1, 1, 1, 1)] {
            let eta = random(&mut rng, l_glob, p, -3.0, 3.0);
            let x = random(&mut rng, lj, p, -5.0, 5.0);
            // Non-uniform precisions; lambda >= tau0 as for any real global unit.
            let mut s: Vec<f64> = (0..p).map(|_| rng.random_range(0.0..20.0)).collect();
            s[0] = 0.0;
            let prior = LayerPrior {
                mean: (0..p).map(|_| rng.random_range(-0.2..0.2)).collect(),
                precision: (0..p).map(|_| rng.random_range(0.1..2.0)).collect(),
            };
            let lambda_data = (0..l_glob * p)
                .map(|k| prior.precision[k % p] + rng.random_range(0.0..40.0))
                .collect();
            let global = GlobalUnits {
                eta,
                lambda: Matrix::from_parts(l_glob, p, lambda_data),
                counts: (0..l_glob).map(|i| 1 + i % 13).collect(),
            };
            let pfnm = per_row_scores(&global, &x, &s, &prior, 1.7, 20, new);
            let cost = gpi_cost(&global, &x, &s, &prior, new).expect("shapes agree");
            for eps in [0.05, 1.0, 30.0] {
                let fast = pfnm_scores(&global, &x, &s, &prior, &settings(1.7, eps), 20, new)
                    .expect("shapes agree");
                for ((a, b), c) in fast.data().iter().zip(pfnm.data()).zip(cost.data()) {
                    let want = b - eps * c;
                    // Relative to the terms' size: the difference of two large sums cancels.
                    let scale = 1.0 + b.abs() + (eps * c).abs();
                    assert!(
                        (a - want).abs() <= 1e-9 * scale,
                        "{a} vs {want} ({lj}x{l_glob}x{p}, eps {eps})"
                    );
                }
            }
        }
    }

    #[test]
    fn gpi_cost_of_a_one_coordinate_example() {
        // tau0 = 1, mu0 = 0, s = 1; one global unit with one member w = 2: eta = 2, lambda = 2,
        // Q = (2 - 1) (2/2)^2 = 1. Client unit w = 4 (x = 4): joining gives Q(6, 3) = 2 (6/3)^2
        // = 8, so C = 7; a new unit gives Q(4, 2) = 1 (4/2)^2 = 4.
        let global = GlobalUnits {
            eta: Matrix::new(1, 1, vec![2.0]).expect("1 x 1"),
            lambda: Matrix::new(1, 1, vec![2.0]).expect("1 x 1"),
            counts: vec![1],
        };
        let x = Matrix::new(1, 1, vec![4.0]).expect("1 x 1");
        let prior = LayerPrior {
            mean: vec![0.0],
            precision: vec![1.0],
        };
        let c = gpi_cost(&global, &x, &[1.0], &prior, 2).expect("shapes agree");
        assert_eq!(c.data(), [7.0, 4.0, 4.0]);

        // The folded score: PFNM's (6^2/3 - 2^2/2 + ln(1/(2-1)) = 10 for the existing unit,
        // 4^2/2 - 2 ln k + 2 ln(1/2) for new ones) minus eps * C.
        let eps = 0.5;
        let sc = pfnm_scores(&global, &x, &[1.0], &prior, &settings(1.0, eps), 2, 2)
            .expect("shapes agree");
        let half = 2.0 * 0.5f64.ln();
        let want = [
            10.0 - eps * 7.0,
            8.0 + half - eps * 4.0,
            8.0 - 2.0 * 2f64.ln() + half - eps * 4.0,
        ];
        for (a, b) in sc.data().iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
    }

    /// PFNM's layout: one precision over the incoming weights and bias, per-class precisions
    /// on the outgoing weights, lambda = tau0 + members * s; the squared term then takes one
    /// column per run.
    #[test]
    fn runs_of_equal_precision_score_as_per_row() {
        let mut rng = StdRng::seed_from_u64(3);
        let (lj, l_glob, d, k, new) = (6, 9, 20, 4, 6);
        let p = d + 1 + k;
        let mut s = vec![4.0; p];
        for (kk, sp) in s[d + 1..].iter_mut().enumerate() {
            *sp = 4.0 * (kk + 1) as f64 / 10.0;
        }
        let prior = LayerPrior {
            mean: (0..p).map(|q| if q == d { 0.1 } else { 0.0 }).collect(),
            precision: vec![0.5; p],
        };
        let counts: Vec<usize> = (0..l_glob).map(|i| 1 + i % 4).collect();
        let lambda: Vec<f64> = counts
            .iter()
            .flat_map(|&c| s.iter().map(move |sp| 0.5 + c as f64 * sp))
            .collect();
        let global = GlobalUnits {
            eta: random(&mut rng, l_glob, p, -3.0, 3.0),
            lambda: Matrix::from_parts(l_glob, p, lambda),
            counts,
        };
        let r = runs(p, |a, b| {
            s[a] == s[b] && (0..l_glob).all(|i| global.lambda.get(i, a) == global.lambda.get(i, b))
        });
        assert_eq!(r.len(), 1 + k, "{r:?}");
        let x = random(&mut rng, lj, p, -5.0, 5.0);
        let slow = per_row_scores(&global, &x, &s, &prior, 0.7, 12, new);
        let cost = gpi_cost(&global, &x, &s, &prior, new).expect("shapes agree");
        for eps in [0.0, 0.3] {
            let fast = pfnm_scores(&global, &x, &s, &prior, &settings(0.7, eps), 12, new)
                .expect("shapes agree");
            for ((a, b), c) in fast.data().iter().zip(slow.data()).zip(cost.data()) {
                let want = b - eps * c;
                let scale = 1.0 + b.abs() + (eps * c).abs();
                assert!(
                    (a - want).abs() <= 1e-9 * scale,
                    "{a} vs {want} (eps {eps})"
                );
            }
        }
    }

    #[test]
    fn disagreeing_shapes_are_errors() {
        let global = GlobalUnits {
            eta: Matrix::zeros(2, 3),
            lambda: Matrix::zeros(2, 3),
            counts: vec![1, 1],
        };
        let prior = LayerPrior {
            mean: vec![0.0; 3],
            precision: vec![1.0; 3],
        };
        let x = Matrix::zeros(1, 3);
        let err = pfnm_scores(&global, &x, &[1.0; 2], &prior, &settings(1.0, 0.0), 4, 1);
        assert!(err.is_err_and(|e| e.to_string().contains("2 precisions")));
        let short = GlobalUnits {
            counts: vec![1],
            ..global
        };
        assert!(gpi_cost(&short, &x, &[1.0; 3], &prior, 1).is_err());
    }
}
