//! PFNM for one layer on plain matrices: hidden units are rows, the score is built from matrix
//! products (`score`), each client's units are assigned by a rectangular linear sum assignment
//! (the `lsap` crate, scipy's algorithm).
//!
//! Follows `match_layer` of IBM/probabilistic-federated-neural-matching `matching/pfnm.py`
//! (@ f44cf42): natural parameters `eta = tau0*mu0 + sum s_j*w`, `lambda = tau0 + sum s_j`, greedy
//! initial pass in order of decreasing width, then `iters` refinement passes in a random client
//! order, each removing one client's contributions and matching it again.

use std::ops::Range;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::SliceRandom;

use rayon::prelude::*;

use super::score::{self, ClientRows, Scorer};
use super::types::{Global, LayerPrior, LayerSettings, Matrix, NO_UNIT, check_score_size};
use crate::{FuseError, Result};

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

/// Where one layer's matching spent its time (wall clock).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MatchTimings {
    /// The whole layer: preparing the clients' units and matching them.
    pub total: Duration,
    /// Building assignment scores.
    pub score: Duration,
    /// Solving the linear sum assignments.
    pub solve: Duration,
    /// Linear sum assignments solved (fewer than `(J - 1) + iters * J` when the refinement
    /// settled early).
    pub solves: usize,
}

/// `0.030 s; score 0.021 s (70 %), solver 0.006 s (19 %), 39 solves` (precision as given,
/// 3 decimals by default): what the timing examples print per layer.
impl std::fmt::Display for MatchTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(3);
        let total = self.total.as_secs_f64();
        let share = |x: Duration| 100.0 * x.as_secs_f64() / total.max(1e-12);
        write!(
            f,
            "{total:.p$} s; score {:.p$} s ({:.0} %), solver {:.p$} s ({:.0} %), {} solves",
            self.score.as_secs_f64(),
            share(self.score),
            self.solve.as_secs_f64(),
            share(self.solve),
            self.solves
        )
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
    /// Where the time went.
    pub timings: MatchTimings,
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

/// Matches one layer: greedy pass, then `settings.iters` refinement passes whose client orders
/// come from `orders`.
///
/// A refinement pass in which no client moves and no unit is emptied is a fixed point: every
/// later pass would repeat it, so they are skipped (their orders are still drawn). The result
/// is the full run's up to rounding.
///
/// Every client must have at least one unit, `P` precisions (finite, non-negative) and `P`
/// columns; the prior must have `P` positive precisions.
pub fn match_layer(
    clients: &[ClientUnits],
    prior: &LayerPrior,
    settings: &LayerSettings,
    orders: &mut dyn OrderSource,
) -> Result<LayerMatch> {
    let started = Instant::now();
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
    if let Some(m) = prior.mean.iter().find(|m| !m.is_finite()) {
        return Err(FuseError::InvalidInput(format!(
            "layer prior mean {m} is not finite"
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

    let precisions: Vec<&[f64]> = clients.iter().map(|c| c.precision.as_slice()).collect();
    let runs = score::precision_runs(prior, &precisions);
    let rows: Vec<ClientRows> = clients
        .par_iter()
        .map(|c| {
            ClientRows::new(
                c.units.rows,
                &c.precision,
                prior,
                &runs,
                settings.eps,
                |l, x| {
                    for ((xv, w), s) in x.iter_mut().zip(c.units.row(l)).zip(&c.precision) {
                        *xv = w * s;
                    }
                },
            )
        })
        .collect();
    match_rows(&rows, prior, &runs, settings, orders, started, true)
}

/// [`match_layer`] on checked, prepared clients; `runs` as [`score::precision_runs`] gives
/// them, `started` is when the caller began (for the timings). `skip_settled`: once a pass
/// moves no client and empties no unit, skip the remaining passes (they would repeat it;
/// tests turn it off to check that).
pub(super) fn match_rows(
    rows: &[ClientRows],
    prior: &LayerPrior,
    runs: &[Range<usize>],
    settings: &LayerSettings,
    orders: &mut dyn OrderSource,
    started: Instant,
    skip_settled: bool,
) -> Result<LayerMatch> {
    let j_total = rows.len();
    let p = prior.mean.len();
    // The largest score matrix this matching can build: the widest client's units against
    // every global unit plus as many new ones. The global layer holds at most every client's
    // units, and past the soft cap grows by at most one unit a client matched.
    let widest = rows.iter().map(ClientRows::rows).max().unwrap_or(0);
    let total: usize = rows.iter().map(ClientRows::rows).sum();
    let passes = settings.iters.saturating_add(1);
    let global_most = total.min(
        widest
            .max(settings.max_global)
            .saturating_add(j_total.saturating_mul(passes)),
    );
    check_score_size(widest, global_most.saturating_add(widest), || {
        format!("matching the units of {j_total} clients ({widest} in the widest)")
    })?;
    let mu_norm: Vec<f64> = prior
        .mean
        .iter()
        .zip(&prior.precision)
        .map(|(m, t)| m * t)
        .collect();
    let prior_runs: Vec<f64> = runs.iter().map(|r| prior.precision[r.start]).collect();
    let mut m = Matcher {
        rows,
        mu_norm: &mu_norm,
        prior_runs: &prior_runs,
        settings,
        scorer: Scorer::new(prior, runs, settings, j_total),
        score: Vec::new(),
        timings: MatchTimings::default(),
        global: Global {
            eta: Matrix::zeros(0, p),
            lambda: Matrix::zeros(0, runs.len()),
            counts: Vec::new(),
        },
        pending: Pending::default(),
    };

    // Greedy order: widest first, stable; the widest client's units open the global layer.
    let mut order0: Vec<usize> = (0..j_total).collect();
    order0.sort_by_key(|&j| std::cmp::Reverse(rows[j].rows()));
    let Some((&j0, rest)) = order0.split_first() else {
        return Err(FuseError::Empty);
    };
    let mut assignments = vec![Vec::new(); j_total];
    assignments[j0] = (0..rows[j0].rows()).map(|l| m.open(j0, l)).collect();
    for &j in rest {
        assignments[j] = m.match_client(j)?;
    }

    let mut settled = false;
    for _ in 0..settings.iters {
        let order = orders.next_order(j_total)?;
        if settled {
            // Drawn all the same, so the order source ends where the full run would.
            continue;
        }
        let before = assignments.clone();
        let mut emptied = false;
        for j in order {
            emptied |= m.remove(j, &mut assignments);
            assignments[j] = m.match_client(j)?;
        }
        // A pass in which no client moved and no unit was emptied (and so renumbered) is a
        // fixed point: each client was matched against exactly the global units it will see
        // in the next pass, whatever the order, so the remaining passes would repeat it.
        settled = skip_settled && !emptied && assignments == before;
    }

    let mut timings = m.timings;
    let global = m.finish();
    let mut lambda = Matrix::zeros(global.counts.len(), p);
    for (i, row) in lambda.data.chunks_exact_mut(p).enumerate() {
        for (r, lam) in runs.iter().zip(global.lambda.row(i)) {
            row[r.clone()].fill(*lam);
        }
    }
    timings.total = started.elapsed();
    Ok(LayerMatch {
        assignments,
        eta: global.eta,
        lambda,
        counts: global.counts,
        timings,
    })
}

/// Changes to `eta` not made yet: they are made while the next score is built, in the same
/// pass over `eta` (first `add`, then `remove`, the order of the reference's updates).
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// The client whose units `add` refers to.
    pub(super) added: usize,
    /// Per global unit: the unit of client `added` whose `x` it gains, or [`NO_UNIT`].
    pub(super) add: Vec<usize>,
    /// Per global unit: the unit of the client being matched whose `x` it loses, or
    /// [`NO_UNIT`].
    pub(super) remove: Vec<usize>,
}

/// The state of one layer's matching.
struct Matcher<'a> {
    rows: &'a [ClientRows],
    mu_norm: &'a [f64],
    prior_runs: &'a [f64],
    settings: &'a LayerSettings,
    scorer: Scorer<'a>,
    /// The last score matrix (negated: the solver minimises), reused.
    score: Vec<f64>,
    timings: MatchTimings,
    global: Global,
    /// Kept as long as `global.eta`'s rows.
    pending: Pending,
}

impl Matcher<'_> {
    /// Takes client `j` out of the global units, highest global index first. Emptied units go
    /// now (renumbering the other clients' assignments); the others lose `x_j` while the next
    /// score is built. Returns whether a unit was emptied.
    fn remove(&mut self, j: usize, assignments: &mut [Vec<usize>]) -> bool {
        let mut emptied = false;
        let g = &mut self.global;
        let mut pairs: Vec<(usize, usize)> = assignments[j].iter().copied().enumerate().collect();
        pairs.sort_by_key(|&(_, i)| std::cmp::Reverse(i));
        for (l, i) in pairs {
            g.counts[i] -= 1;
            if g.counts[i] == 0 {
                emptied = true;
                g.counts.remove(i);
                g.eta.remove_row(i);
                g.lambda.remove_row(i);
                self.pending.add.remove(i);
                self.pending.remove.remove(i);
                for (jc, a) in assignments.iter_mut().enumerate() {
                    if jc != j {
                        for gi in a.iter_mut().filter(|gi| **gi > i) {
                            *gi -= 1;
                        }
                    }
                }
            } else {
                for (lam, s) in g.lambda.row_mut(i).iter_mut().zip(self.rows[j].s_runs()) {
                    *lam -= s;
                }
                self.pending.remove[i] = l;
            }
        }
        emptied
    }

    /// Scores client `j` against the global units, solves the assignment and adds `j`.
    fn match_client(&mut self, j: usize) -> Result<Vec<usize>> {
        let rows = &self.rows[j];
        let lj = rows.rows();
        let l_glob = self.global.counts.len();
        // Reference: min(L_j, max(cap - L, 1)); never fewer than needed to place every unit.
        let new = lj
            .min(self.settings.max_global.saturating_sub(l_glob).max(1))
            .max(lj.saturating_sub(l_glob));
        let width = l_glob + new;
        let t0 = Instant::now();
        let added = &self.rows[self.pending.added];
        self.scorer.score(
            &mut self.global,
            rows,
            (added, &self.pending.add),
            &self.pending.remove,
            new,
            &mut self.score,
        );
        self.pending.add.fill(NO_UNIT);
        self.pending.remove.fill(NO_UNIT);
        let t1 = Instant::now();
        // `score` holds negated PFNM scores: minimising it maximises the score.
        let solved = lsap::solve(lj, width, &self.score, false).map(|(_, cols)| cols);
        self.timings.score += t1 - t0;
        self.timings.solve += t1.elapsed();
        self.timings.solves += 1;
        let col_of = solved.map_err(|e| {
            FuseError::Solver(format!(
                "client {j}: assignment of {lj} units to {width} columns failed ({e}); check \
                 sigma, sigma0 and gamma"
            ))
        })?;

        // Matched units gain x_j with the next score; new ones are appended now.
        let g = &mut self.global;
        self.pending.added = j;
        let mut assignment = Vec::with_capacity(lj);
        let mut opened = Vec::new();
        for (l, &c) in col_of.iter().enumerate() {
            if c < l_glob {
                g.counts[c] += 1;
                for (lam, sp) in g.lambda.row_mut(c).iter_mut().zip(rows.s_runs()) {
                    *lam += sp;
                }
                self.pending.add[c] = l;
                assignment.push(c);
            } else {
                // New units are numbered in row order, whichever offered column was picked.
                opened.push(l);
                assignment.push(l_glob + opened.len() - 1);
            }
        }
        for l in opened {
            self.open(j, l);
        }
        Ok(assignment)
    }

    /// Appends a global unit made of unit `l` of client `j` alone; returns its index.
    fn open(&mut self, j: usize, l: usize) -> usize {
        let (g, rows) = (&mut self.global, &self.rows[j]);
        g.counts.push(1);
        g.eta
            .push_row(self.mu_norm.iter().zip(rows.x(l)).map(|(m, xv)| m + xv));
        g.lambda.push_row(
            self.prior_runs
                .iter()
                .zip(rows.s_runs())
                .map(|(t, sp)| t + sp),
        );
        self.pending.add.push(NO_UNIT);
        self.pending.remove.push(NO_UNIT);
        g.counts.len() - 1
    }

    /// The global units with every pending change made.
    fn finish(mut self) -> Global {
        let added = &self.rows[self.pending.added];
        let p = self.global.eta.cols();
        self.global
            .eta
            .data_mut()
            .par_chunks_mut(p)
            .zip(&self.pending.add)
            .with_min_len(score::min_rows_per_task(p))
            .for_each(|(eta, &l)| {
                if l != NO_UNIT {
                    for (e, xv) in eta.iter_mut().zip(added.x(l)) {
                        *e += xv;
                    }
                }
            });
        self.global
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
            eps: 0.0,
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
            eps: 0.0,
        };
        let m = match_layer(&clients, &prior, &settings, &mut RngOrder(&mut rng))
            .expect("one client matches");
        assert_eq!(m.assignments, vec![vec![0, 1, 2, 3]]);
        let mean = m.posterior_mean();
        for (a, b) in mean.data.iter().zip(&units.data) {
            assert!((a - b / 2.0).abs() < 1e-12);
        }
    }

    /// Matches 8 clients holding noisy copies of 6..9 of 10 planted units (8 passes), with
    /// and without skipping settled passes.
    fn settle_case(seed: u64, noise: f64) -> (LayerMatch, LayerMatch) {
        let mut rng = StdRng::seed_from_u64(seed);
        let (p, planted, clients) = (12, 10, 8);
        let atoms = random(&mut rng, planted, p, -1.0, 1.0);
        let prior = LayerPrior {
            mean: vec![0.0; p],
            precision: vec![1.0; p],
        };
        let precision = vec![100.0; p];
        let runs = score::precision_runs(&prior, &[&precision]);
        let rows: Vec<ClientRows> = (0..clients)
            .map(|j| {
                let mut atoms_j: Vec<usize> = (0..planted).collect();
                atoms_j.shuffle(&mut rng);
                atoms_j.truncate(6 + j % 4);
                let noise: Vec<f64> = (0..atoms_j.len() * p)
                    .map(|_| rng.random_range(-noise..noise))
                    .collect();
                ClientRows::new(atoms_j.len(), &precision, &prior, &runs, 0.0, |l, x| {
                    for (q, xv) in x.iter_mut().enumerate() {
                        *xv = 100.0 * (atoms.get(atoms_j[l], q) + noise[l * p + q]);
                    }
                })
            })
            .collect();
        let settings = LayerSettings {
            gamma: 1.0,
            iters: 8,
            max_global: 700,
            eps: 0.0,
        };
        let run = |skip: bool| {
            let mut orders = RngOrder(&mut StdRng::seed_from_u64(seed + 1));
            match_rows(
                &rows,
                &prior,
                &runs,
                &settings,
                &mut orders,
                Instant::now(),
                skip,
            )
            .expect("matches")
        };
        (run(true), run(false))
    }

    /// Once a refinement pass moves no client (and empties no unit) the remaining passes
    /// change nothing but rounding, so skipping them gives the full run's matching.
    #[test]
    fn skipping_settled_passes_changes_nothing() {
        // Seed 0: the first pass moves units, the second settles; seed 1: the greedy pass
        // is already settled.
        for (seed, passes_run) in [(0, 2), (1, 1)] {
            let (fast, full) = settle_case(seed, 0.1);
            assert_eq!(fast.timings.solves, 7 + 8 * passes_run, "seed {seed}");
            assert_eq!(full.timings.solves, 7 + 8 * 8);
            assert_eq!(fast.assignments, full.assignments);
            assert_eq!(fast.counts, full.counts);
            let (a, b) = (fast.eta.data().iter(), full.eta.data().iter());
            for (a, b) in a.chain(fast.lambda.data()).zip(b.chain(full.lambda.data())) {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }
}
