//! A mixture-of-Gaussians prior over client models (fedsparse-em, App. J.2): the server keeps
//! `K` models `w_1..w_K` (an ensemble) and the hard-EM M-step is a Gaussian-mixture EM step on
//! the client models.
//!
//! With prior `p(w_s) = sum_k pi_k N(w_s; w_k, I / lambda)` the responsibilities (eq. 51) are
//!
//! ```text
//! r_sk = pi_k exp(-lambda/2 ||w_s - w_k||^2) / sum_j pi_j exp(-lambda/2 ||w_s - w_j||^2)
//! ```
//!
//! computed in log space: distances are taken relative to the nearest component and the
//! log-sum-exp is shifted by its maximum, so huge distances give hard 0/1 responsibilities
//! instead of `0/0`. The centre update is eq. 52 with client weights `a_s`:
//!
//! ```text
//! w_k = sum_s a_s r_sk w_s / sum_s a_s r_sk
//! ```
//!
//! The paper's eq. 52 is unweighted (`a_s = 1`); pass `a_s = num_examples` to weight clients as
//! FedAvg does. With `K = 1` every `r_s1` is exactly 1 and the update is
//! [`weighted_mean_params`](crate::weighted_mean_params) with the same weights, bit for bit.
//! A component whose total responsibility `sum_s a_s r_sk` is zero (or below the smallest
//! normal f64) keeps its centre unchanged: no client supports it.
//!
//! Mixing weights: the appendix uses `K` equiprobable components (`pi_k = 1/K`, eq. 47), which
//! is the default. With [`MixtureConfig::learn_weights`] they follow the standard GMM M-step
//! `pi_k = sum_s a_s r_sk / sum_s a_s` (not in the paper); a component whose weight reaches 0 is
//! then never responsible again.
//!
//! The normalising constants `Z_k` of eq. 48-51 are equal (one shared `lambda`) and cancel.

use fedfuse_core::{ParamShape, Params};

use crate::{FuseError, Result, WeightedSum};

/// Settings of the mixture prior.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixtureConfig {
    /// Precision `lambda` of each component, > 0. Larger means harder assignments.
    pub lambda: f64,
    /// Learn the mixing weights (`pi_k = mean responsibility`) instead of keeping `1/K`.
    pub learn_weights: bool,
}

impl Default for MixtureConfig {
    /// `lambda = 1`, fixed equal weights (as App. J.2).
    fn default() -> Self {
        Self {
            lambda: 1.0,
            learn_weights: false,
        }
    }
}

impl MixtureConfig {
    /// Checks `lambda`.
    pub fn check(&self) -> Result<()> {
        check_lambda(self.lambda)
    }
}

fn check_lambda(lambda: f64) -> Result<()> {
    if lambda.is_finite() && lambda > 0.0 {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field: "lambda",
            reason: format!("{lambda} is not a positive number"),
        })
    }
}

/// Responsibilities of `K` components for one client from its squared distances `sq_dist[k]`
/// to the centres and the log mixing weights `log_weights[k]` (`-inf` for a weight of zero).
///
/// Adding the same constant to every distance leaves the result unchanged (up to rounding of
/// the sums), and any finite distances, however large, give finite responsibilities summing
/// to one.
pub fn responsibilities_from_sq_distances(
    sq_dist: &[f64],
    log_weights: &[f64],
    lambda: f64,
) -> Result<Vec<f64>> {
    check_lambda(lambda)?;
    if sq_dist.is_empty() {
        return Err(FuseError::Empty);
    }
    if sq_dist.len() != log_weights.len() {
        return Err(FuseError::InvalidInput(format!(
            "{} distances for {} mixture weights",
            sq_dist.len(),
            log_weights.len()
        )));
    }
    if let Some(k) = sq_dist.iter().position(|d| !d.is_finite()) {
        return Err(FuseError::InvalidInput(format!(
            "squared distance to component {k} is {}",
            sq_dist[k]
        )));
    }
    if let Some(k) = log_weights
        .iter()
        .position(|w| w.is_nan() || *w == f64::INFINITY)
    {
        return Err(FuseError::InvalidInput(format!(
            "log mixing weight of component {k} is {}",
            log_weights[k]
        )));
    }
    // Distances relative to the nearest component that can be responsible: its logit is then
    // its finite log weight, so the maximum below is finite.
    let reference = sq_dist
        .iter()
        .zip(log_weights)
        .filter(|(_, w)| w.is_finite())
        .map(|(d, _)| *d)
        .fold(f64::INFINITY, f64::min);
    if reference == f64::INFINITY {
        return Err(FuseError::InvalidInput(
            "every mixing weight is zero".into(),
        ));
    }
    let logits: Vec<f64> = sq_dist
        .iter()
        .zip(log_weights)
        .map(|(d, w)| w - 0.5 * lambda * (d - reference))
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    Ok(exps.into_iter().map(|e| e / total).collect())
}

/// The outcome of one EM step.
#[derive(Clone, Debug, PartialEq)]
pub struct MixtureStep {
    /// `r_sk` per client (rows) and component (columns), from the centres before the step.
    pub responsibilities: Vec<Vec<f64>>,
    /// `sum_s a_s r_sk` per component.
    pub totals: Vec<f64>,
    /// Components left unchanged for lack of responsibility.
    pub unchanged: Vec<bool>,
}

/// `K` server models with a Gaussian-mixture prior (see the module docs).
#[derive(Clone, Debug)]
pub struct GaussianMixture {
    config: MixtureConfig,
    layout: Vec<ParamShape>,
    centres: Vec<Params>,
    log_weights: Vec<f64>,
}

impl GaussianMixture {
    /// A mixture with the given centres (all in one layout, finite) and equal weights `1/K`.
    pub fn new(centres: Vec<Params>, config: MixtureConfig) -> Result<Self> {
        config.check()?;
        let first = centres.first().ok_or(FuseError::Empty)?;
        let layout = first.layout();
        for c in &centres {
            c.check_layout(&layout)?;
            c.check_finite()?;
        }
        let k = centres.len();
        Ok(Self {
            config,
            layout,
            centres,
            log_weights: vec![-(k as f64).ln(); k],
        })
    }

    /// `k` centres picked among the clients by farthest-point traversal (Gonzalez): the first
    /// client, then repeatedly the client farthest from every centre so far (the first on
    /// ties). Deterministic; an error if fewer than `k` clients are distinct.
    pub fn farthest_point_init(
        clients: &[&Params],
        k: usize,
        config: MixtureConfig,
    ) -> Result<Self> {
        let first = *clients.first().ok_or(FuseError::Empty)?;
        if k == 0 || k > clients.len() {
            return Err(FuseError::InvalidSetting {
                field: "mixture.k",
                reason: format!("{k} components from {} clients", clients.len()),
            });
        }
        let layout = first.layout();
        for c in clients {
            c.check_layout(&layout)?;
            c.check_finite()?;
        }
        let mut nearest: Vec<f64> = clients.iter().map(|c| c.sq_distance(first)).collect();
        let mut centres = vec![first.clone()];
        while centres.len() < k {
            let (far, dist) =
                nearest
                    .iter()
                    .enumerate()
                    .fold((0, f64::NEG_INFINITY), |best, (i, d)| {
                        if *d > best.1 { (i, *d) } else { best }
                    });
            if dist <= 0.0 {
                return Err(FuseError::InvalidInput(format!(
                    "only {} distinct client models for {k} components",
                    centres.len()
                )));
            }
            let c = clients[far];
            for (n, other) in nearest.iter_mut().zip(clients) {
                *n = n.min(other.sq_distance(c));
            }
            centres.push(c.clone());
        }
        Self::new(centres, config)
    }

    /// Number of components `K`.
    pub fn k(&self) -> usize {
        self.centres.len()
    }

    /// The settings.
    pub fn config(&self) -> &MixtureConfig {
        &self.config
    }

    /// The centres `w_1..w_K`.
    pub fn centres(&self) -> &[Params] {
        &self.centres
    }

    /// `ln pi_k`, exactly as held (a checkpoint keeps these, not the rounded weights).
    pub fn log_weights(&self) -> &[f64] {
        &self.log_weights
    }

    /// A mixture restored from its centres and `ln pi_k` ([`Self::log_weights`]).
    pub fn from_parts(
        centres: Vec<Params>,
        log_weights: Vec<f64>,
        config: MixtureConfig,
    ) -> Result<Self> {
        let mut m = Self::new(centres, config)?;
        if log_weights.len() != m.k() || log_weights.iter().any(|l| l.is_nan() || *l > 0.0) {
            return Err(FuseError::InvalidInput(format!(
                "{} log mixing weights (each at most 0) for {} components",
                log_weights.len(),
                m.k()
            )));
        }
        m.log_weights = log_weights;
        Ok(m)
    }

    /// The mixing weights `pi_k`.
    pub fn weights(&self) -> Vec<f64> {
        self.log_weights.iter().map(|l| l.exp()).collect()
    }

    /// Sets the mixing weights (non-negative, not all zero; normalised here).
    pub fn set_weights(&mut self, pi: &[f64]) -> Result<()> {
        if pi.len() != self.k() {
            return Err(FuseError::InvalidInput(format!(
                "{} mixing weights for {} components",
                pi.len(),
                self.k()
            )));
        }
        let total: f64 = pi.iter().sum();
        if pi.iter().any(|p| !(p.is_finite() && *p >= 0.0)) || !(total > 0.0 && total.is_finite()) {
            return Err(FuseError::InvalidSetting {
                field: "mixture.weights",
                reason: format!("{pi:?} are not non-negative weights with a positive sum"),
            });
        }
        self.log_weights = pi.iter().map(|p| (p / total).ln()).collect();
        Ok(())
    }

    fn check_client(&self, client: &Params) -> Result<()> {
        client.check_layout(&self.layout)?;
        Ok(client.check_finite()?)
    }

    /// `r_sk` of one client model over the components.
    pub fn responsibilities(&self, client: &Params) -> Result<Vec<f64>> {
        self.check_client(client)?;
        self.responsibilities_unchecked(client)
    }

    fn responsibilities_unchecked(&self, client: &Params) -> Result<Vec<f64>> {
        let d: Vec<f64> = self.centres.iter().map(|c| client.sq_distance(c)).collect();
        responsibilities_from_sq_distances(&d, &self.log_weights, self.config.lambda)
    }

    /// The most responsible component for a client model (the lowest index on ties): the
    /// model a client starts its local training from.
    pub fn assign(&self, client: &Params) -> Result<usize> {
        let r = self.responsibilities(client)?;
        Ok(r.iter()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (k, r)| {
                if *r > best.1 { (k, *r) } else { best }
            })
            .0)
    }

    /// `sum_s a_s ln sum_k pi_k exp(-lambda/2 ||w_s - w_k||^2)`: the weighted log-likelihood of
    /// the client models without the constant `-(D/2) ln(2 pi / lambda)`. EM never lowers it.
    pub fn log_likelihood(&self, clients: &[(&Params, f64)]) -> Result<f64> {
        let mut total = 0.0;
        for (c, a) in clients {
            self.check_client(c)?;
            check_weight(*a)?;
            let logits: Vec<f64> = self
                .centres
                .iter()
                .zip(&self.log_weights)
                .map(|(w, l)| l - 0.5 * self.config.lambda * c.sq_distance(w))
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
            total += a * lse;
        }
        Ok(total)
    }

    /// One EM step on the client models `(w_s, a_s)`: responsibilities with the current
    /// centres (E), then eq. 52 for every centre and, if learned, the mixing weights (M).
    /// Nothing changes on error.
    pub fn em_step(&mut self, clients: &[(&Params, f64)]) -> Result<MixtureStep> {
        if clients.is_empty() {
            return Err(FuseError::Empty);
        }
        for (c, a) in clients {
            self.check_client(c)?;
            check_weight(*a)?;
        }
        let responsibilities = clients
            .iter()
            .map(|(c, _)| self.responsibilities_unchecked(c))
            .collect::<Result<Vec<_>>>()?;
        let k = self.k();
        let mut totals = vec![0f64; k];
        let mut centres = self.centres.clone();
        let mut unchanged = vec![false; k];
        for (j, centre) in centres.iter_mut().enumerate() {
            let mut sum = WeightedSum::new();
            for ((c, a), r) in clients.iter().zip(&responsibilities) {
                let weight = a * r[j];
                sum.add(c, weight)?;
                totals[j] += weight;
            }
            if totals[j] < f64::MIN_POSITIVE {
                unchanged[j] = true;
            } else {
                *centre = sum.mean()?;
            }
        }
        let all: f64 = totals.iter().sum();
        if all <= 0.0 {
            return Err(FuseError::InvalidSetting {
                field: "num_examples",
                reason: "all client weights are zero".into(),
            });
        }
        if self.config.learn_weights {
            self.log_weights = totals.iter().map(|t| (t / all).ln()).collect();
        }
        self.centres = centres;
        Ok(MixtureStep {
            responsibilities,
            totals,
            unchanged,
        })
    }
}

fn check_weight(a: f64) -> Result<()> {
    if a.is_finite() && a >= 0.0 {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field: "num_examples",
            reason: format!("weight {a} is not a non-negative number"),
        })
    }
}
