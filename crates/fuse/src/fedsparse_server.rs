//! The server side of FedSparse (Louizos et al., "An expectation-maximization perspective on
//! federated learning", section 3 and Appendix I, Algorithm 1) with group sparsity.
//!
//! The server holds weights `w` and one threshold parameter `v_g` per group `g` of a
//! [`GroupLayout`] (the same groups the clients gate). Group inclusion probabilities are
//! (eq. 23, [`GroupLayout::gate_probabilities`])
//!
//! ```text
//! theta_g = sigmoid((||w_g||_2 - softplus(v_g)) / T)
//! ```
//!
//! One round (Algorithm 1): compute `theta`, prune the groups with `theta_g < eps`, send `w`
//! and `v`; each client `s` answers with binary gates `z_s` (one per group) and
//! `w_hat_s = z_s * w_s` (only kept groups need to be sent; the values of dropped groups are
//! ignored here). The server then forms the ascent directions
//!
//! ```text
//! grad_w = (1/S) sum_s z_sg (w_hat_s - w)                                (per value of group g)
//! grad_v = (1/S) sum_s -(z_sg (1 - theta_g) - (1 - z_sg) theta_g) sigmoid(v_g) / T
//! ```
//!
//! and takes one step `w += Adam(grad_w)`, `v += Adamax(grad_v)` (both maximize the objective).
//! `grad_v` is the chain rule of eq. 19's `dL/dtheta = z/theta - (1-z)/(1-theta)` through
//! `dtheta/dv = -theta (1-theta) sigmoid(v) / T` (softplus' = sigmoid); `theta` is detached from
//! `w` as in the paper, so `grad_w` has no `theta` term.
//!
//! Choices made here, where the paper leaves room:
//! - Both sums are divided by the number of replies `S` (the paper sums; eq. 19 over a
//!   subsample is an estimate only up to `lambda S_total / S`, which the learning rate absorbs).
//!   Adam and Adamax are invariant to that scale except through their `eps`.
//! - Clients are unweighted, as Algorithm 1 and eq. 20 (not by `num_examples`).
//! - Tensors marked ungated (e.g. the output layer) behave as if every client kept them:
//!   `grad_w = mean_s (w_s - w)`, never pruned.
//! - A group is pruned when `theta_g < eps` (the paper's text; Algorithm 1 writes
//!   `I[theta > eps]`, which differs only at equality).
//! - The weights optimizer defaults to Adam with Kingma & Ba's bias correction and defaults
//!   (App. A), the thresholds optimizer to Adamax with `lr = 1e-2` (App. A); both are
//!   [`ServerOptimizer`]s and can be changed.
//!
//! Worked example (the test `one_server_step_by_hand`): one group of two weights `w = [3, 4]`,
//! `T = 1`, `v = ln(e - 1)` so `softplus(v) = 1`, `sigmoid(v) = 1 - 1/e = 0.632121`:
//! `theta = sigmoid(5 - 1) = 0.982014`. Client 1 keeps the group with `w_1 = [4, 4]`, client 2
//! drops it. `grad_w = ((4 - 3, 4 - 4) + 0) / 2 = (0.5, 0)`;
//! `grad_v = (-(1 - theta) + theta) * 0.632121 / 2 = 0.964028 * 0.632121 / 2 = 0.304691`
//! (> 0: the threshold rises and theta falls towards the clients' mean gate 0.5). A first
//! bias-corrected Adam/Adamax step moves each coordinate by `lr * sign(grad)` (up to `eps`):
//! with `lr = 0.01`, `w = [3.01, 4]` and `v = ln(e - 1) + 0.01`.

use std::ops::Range;

use fedfuse_core::groups::sigmoid;
use fedfuse_core::{GroupLayout, Params, Record};

use crate::serveropt::{ServerOptState, ServerOptimizer};
use crate::{FuseError, Result};

fn check_temperature(t: f64) -> Result<()> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field: "temperature",
            reason: format!("{t} is not a positive number"),
        })
    }
}

fn check_prune_eps(eps: f64) -> Result<()> {
    if (0.0..=1.0).contains(&eps) {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field: "prune_eps",
            reason: format!("{eps} is not in [0, 1]"),
        })
    }
}

fn check_probabilities(what: &str, p: &[f64]) -> Result<()> {
    match p.iter().position(|x| !(0.0..=1.0).contains(x)) {
        Some(g) => Err(FuseError::InvalidInput(format!(
            "{what} of group {g} is {}, not a probability",
            p[g]
        ))),
        None => Ok(()),
    }
}

/// Calls `f(group, range)` for each gated row of tensor `tensor`'s values.
fn for_each_span(layout: &GroupLayout, tensor: usize, mut f: impl FnMut(usize, Range<usize>)) {
    if let Some(rows) = layout.grouped_rows(tensor) {
        for (g, span) in rows.spans() {
            f(g, span);
        }
    }
}

/// Zeroes every group with `theta_g < eps` in place; returns the kept mask (`true` = kept).
pub fn prune(w: &mut Params, theta: &[f64], eps: f64, layout: &GroupLayout) -> Result<Vec<bool>> {
    check_prune_eps(eps)?;
    layout.check_per_group(theta, "theta")?;
    check_probabilities("theta", theta)?;
    let keep: Vec<bool> = theta.iter().map(|t| *t >= eps).collect();
    layout.mask(w, &keep)?;
    Ok(keep)
}

/// One client's answer: gates `z` (one per group, `true` = kept) and `w_hat = z * w_s` in the
/// server's layout; values of dropped groups are ignored (zeros on the wire).
#[derive(Clone, Copy, Debug)]
pub struct SparseReply<'a> {
    /// Sampled gates, one per group.
    pub z: &'a [bool],
    /// The client's weights on its kept groups (and all of its ungated tensors).
    pub w_hat: &'a Params,
}

impl SparseReply<'_> {
    fn check(&self, layout: &GroupLayout) -> Result<()> {
        layout.check_per_group(self.z, "gates `z`")?;
        layout.check(self.w_hat)?;
        Ok(self.w_hat.check_finite()?)
    }
}

/// Ascent directions of one round, already divided by the number of clients.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseGradients {
    /// `grad_w` per tensor, in layout order.
    pub w: Vec<Vec<f64>>,
    /// `grad_v` per group.
    pub v: Vec<f64>,
    /// Replies summed.
    pub clients: usize,
}

/// A running sum of the FedSparse gradients over client replies (bounded memory).
#[derive(Clone, Debug)]
pub struct SparseGradSum {
    theta: Vec<f64>,
    /// `sigmoid(v_g) / T`: the factor of `dtheta/dv` besides `theta (1 - theta)`.
    v_scale: Vec<f64>,
    w: Vec<Vec<f64>>,
    v: Vec<f64>,
    clients: usize,
}

impl SparseGradSum {
    /// An empty sum for a round whose server state was `theta`, `v` (before the clients ran).
    pub fn new(layout: &GroupLayout, theta: Vec<f64>, v: &[f32], temperature: f64) -> Result<Self> {
        check_temperature(temperature)?;
        layout.check_thresholds(v)?;
        layout.check_per_group(&theta, "theta")?;
        check_probabilities("theta", &theta)?;
        Ok(Self {
            theta,
            v_scale: v
                .iter()
                .map(|v| sigmoid(f64::from(*v)) / temperature)
                .collect(),
            w: layout
                .shapes()
                .iter()
                .map(|s| vec![0.0; s.shape.iter().product()])
                .collect(),
            v: vec![0.0; layout.num_groups()],
            clients: 0,
        })
    }

    /// Adds one reply; `w` is the (pruned) server model the clients started from.
    pub fn add(&mut self, layout: &GroupLayout, w: &Params, reply: SparseReply<'_>) -> Result<()> {
        layout.check(w)?;
        reply.check(layout)?;
        if self.v.len() != layout.num_groups() || self.w.len() != layout.shapes().len() {
            return Err(FuseError::InvalidInput(
                "gradient sum was made for another group layout".into(),
            ));
        }
        for (i, ((_, server), (_, client))) in w.iter().zip(reply.w_hat.iter()).enumerate() {
            let acc = &mut self.w[i];
            let mut add = |r: Range<usize>| {
                for ((a, x), y) in acc[r.clone()]
                    .iter_mut()
                    .zip(&server.data[r.clone()])
                    .zip(&client.data[r])
                {
                    *a += f64::from(*y) - f64::from(*x);
                }
            };
            if layout.grouped_rows(i).is_none() {
                add(0..server.data.len());
            } else {
                for_each_span(layout, i, |g, r| {
                    if reply.z[g] {
                        add(r);
                    }
                });
            }
        }
        for (g, gv) in self.v.iter_mut().enumerate() {
            let t = self.theta[g];
            // -(z (1 - theta) - (1 - z) theta) for z in {0, 1}.
            let dl = if reply.z[g] { -(1.0 - t) } else { t };
            *gv += dl * self.v_scale[g];
        }
        self.clients += 1;
        Ok(())
    }

    /// Replies added so far.
    pub fn clients(&self) -> usize {
        self.clients
    }

    /// The mean gradients over the replies added.
    pub fn finish(&self) -> Result<SparseGradients> {
        if self.clients == 0 {
            return Err(FuseError::Empty);
        }
        let s = self.clients as f64;
        Ok(SparseGradients {
            w: self
                .w
                .iter()
                .map(|t| t.iter().map(|x| x / s).collect())
                .collect(),
            v: self.v.iter().map(|x| x / s).collect(),
            clients: self.clients,
        })
    }
}

/// The gradients of one round from all replies at once (see [`SparseGradSum`]).
pub fn fedsparse_gradients(
    w: &Params,
    v: &[f32],
    theta: &[f64],
    temperature: f64,
    layout: &GroupLayout,
    replies: &[SparseReply<'_>],
) -> Result<SparseGradients> {
    let mut sum = SparseGradSum::new(layout, theta.to_vec(), v, temperature)?;
    for r in replies {
        sum.add(layout, w, *r)?;
    }
    sum.finish()
}

/// The closed-form M-step (eq. 20 with the 1-sample estimates of eq. 21/22).
#[derive(Clone, Debug, PartialEq)]
pub struct Stationary {
    /// `w_g = sum_s z_sg w_sg / sum_s z_sg`; ungated tensors: the mean over all clients;
    /// groups no client kept: unchanged from the server's `w` (no evidence; `theta_g = 0`
    /// prunes them anyway).
    pub weights: Params,
    /// `theta_g = mean_s z_sg`.
    pub theta: Vec<f64>,
}

/// The stationary point of the server objective given the replies (unweighted, as eq. 20).
pub fn fedsparse_stationary(
    w: &Params,
    layout: &GroupLayout,
    replies: &[SparseReply<'_>],
) -> Result<Stationary> {
    if replies.is_empty() {
        return Err(FuseError::Empty);
    }
    layout.check(w)?;
    for r in replies {
        r.check(layout)?;
    }
    let g_count = layout.num_groups();
    let mut kept = vec![0usize; g_count];
    for r in replies {
        for (k, z) in kept.iter_mut().zip(r.z) {
            *k += usize::from(*z);
        }
    }
    let s = replies.len() as f64;
    let mut weights = Params::new();
    for (i, (name, server)) in w.iter().enumerate() {
        let mut sum = vec![0f64; server.data.len()];
        let mut out = server.data.clone();
        let tensors = replies.iter().filter_map(|r| r.w_hat.tensor_at(i));
        if layout.grouped_rows(i).is_none() {
            for t in tensors {
                for (a, y) in sum.iter_mut().zip(&t.data) {
                    *a += f64::from(*y);
                }
            }
            for (o, a) in out.iter_mut().zip(&sum) {
                *o = (a / s) as f32;
            }
        } else {
            for (r, t) in replies.iter().zip(tensors) {
                for_each_span(layout, i, |g, span| {
                    if r.z[g] {
                        for (a, y) in sum[span.clone()].iter_mut().zip(&t.data[span]) {
                            *a += f64::from(*y);
                        }
                    }
                });
            }
            for_each_span(layout, i, |g, span| {
                if kept[g] > 0 {
                    let n = kept[g] as f64;
                    for (o, a) in out[span.clone()].iter_mut().zip(&sum[span]) {
                        *o = (a / n) as f32;
                    }
                }
            });
        }
        weights.push(name, server.shape.clone(), out)?;
    }
    Ok(Stationary {
        weights,
        theta: kept.iter().map(|k| *k as f64 / s).collect(),
    })
}

/// Total variation between the clients' gate distributions and the server's (App. C, eq. 26):
/// `TV_sg = |pi_sg - theta_g|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TotalVariation {
    /// Mean over clients and groups.
    pub mean: f64,
    /// Largest over clients and groups.
    pub max: f64,
}

/// [`TotalVariation`] of each client's `pi_s` (one probability per group) against `theta`.
pub fn total_variation(pi_clients: &[&[f64]], theta: &[f64]) -> Result<TotalVariation> {
    if pi_clients.is_empty() || theta.is_empty() {
        return Err(FuseError::Empty);
    }
    check_probabilities("theta", theta)?;
    let (mut sum, mut max) = (0f64, 0f64);
    for (s, pi) in pi_clients.iter().enumerate() {
        if pi.len() != theta.len() {
            return Err(FuseError::InvalidInput(format!(
                "client {s}: {} gate probabilities for {} groups",
                pi.len(),
                theta.len()
            )));
        }
        check_probabilities(&format!("client {s}: pi"), pi)?;
        for (p, t) in pi.iter().zip(theta) {
            let d = (p - t).abs();
            sum += d;
            max = max.max(d);
        }
    }
    Ok(TotalVariation {
        mean: sum / (pi_clients.len() * theta.len()) as f64,
        max,
    })
}

/// FedSparse server settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FedSparseConfig {
    /// Sigmoid temperature `T` of eq. 23 (App. A: `1e-3`).
    pub temperature: f64,
    /// Groups with `theta < prune_eps` are pruned at the start of each round (paper: `0.1`).
    pub prune_eps: f64,
    /// Optimizer of the weights on `grad_w` (App. A: Adam with Kingma & Ba's defaults).
    pub weights_opt: ServerOptimizer,
    /// Optimizer of the thresholds on `grad_v` (App. A: Adamax, `lr = 1e-2`).
    pub thresholds_opt: ServerOptimizer,
}

impl Default for FedSparseConfig {
    fn default() -> Self {
        Self {
            temperature: 1e-3,
            prune_eps: 0.1,
            weights_opt: ServerOptimizer::kingma_adam(),
            thresholds_opt: ServerOptimizer::Adamax {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        }
    }
}

impl FedSparseConfig {
    /// Checks every setting, naming the first bad one.
    pub fn check(&self) -> Result<()> {
        check_temperature(self.temperature)?;
        check_prune_eps(self.prune_eps)?;
        self.weights_opt.check()?;
        self.thresholds_opt.check()
    }
}

/// What the server sends at the start of a round.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundStart {
    /// `theta` of every group, from `w` and `v` before pruning (used by the gradient of `v`).
    pub theta: Vec<f64>,
    /// Groups that survived pruning.
    pub kept: Vec<bool>,
}

/// The FedSparse server: weights, thresholds, their optimizers, and the open round.
///
/// Per round: [`Self::begin_round`] (theta, prune), send [`Self::weights`] and
/// [`Self::thresholds`], [`Self::add_reply`] for each client, [`Self::finish_round`].
#[derive(Clone, Debug)]
pub struct FedSparseServer {
    config: FedSparseConfig,
    layout: GroupLayout,
    w: Params,
    v: Vec<f32>,
    w_opt: ServerOptState,
    v_opt: ServerOptState,
    round: Option<SparseGradSum>,
}

/// Name of the single tensor the thresholds are optimized as.
const V_NAME: &str = "fedsparse.v";

impl FedSparseServer {
    /// A server with weights `w` and thresholds `v` (one per group).
    pub fn new(
        config: FedSparseConfig,
        layout: GroupLayout,
        w: Params,
        v: Vec<f32>,
    ) -> Result<Self> {
        config.check()?;
        layout.check(&w)?;
        w.check_finite()?;
        layout.check_thresholds(&v)?;
        Ok(Self {
            w_opt: ServerOptState::new(config.weights_opt)?,
            v_opt: ServerOptState::new(config.thresholds_opt)?,
            config,
            layout,
            w,
            v,
            round: None,
        })
    }

    /// A server whose thresholds give every group `theta = theta0` (App. A: `0.99`), see
    /// [`GroupLayout::initial_thresholds`].
    pub fn with_initial_theta(
        config: FedSparseConfig,
        layout: GroupLayout,
        w: Params,
        theta0: f64,
    ) -> Result<Self> {
        config.check()?;
        let v = layout.initial_thresholds(&w, theta0, config.temperature)?;
        Self::new(config, layout, w, v)
    }

    /// The server weights (pruned once a round has begun).
    pub fn weights(&self) -> &Params {
        &self.w
    }

    /// The threshold parameters `v`, one per group (`tau = softplus(v)`).
    pub fn thresholds(&self) -> &[f32] {
        &self.v
    }

    /// The group layout.
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// The settings.
    pub fn config(&self) -> &FedSparseConfig {
        &self.config
    }

    /// `theta` of the current weights and thresholds.
    pub fn theta(&self) -> Result<Vec<f64>> {
        Ok(self
            .layout
            .gate_probabilities(&self.w, &self.v, self.config.temperature)?)
    }

    /// Starts a round: computes `theta`, prunes `w` to the groups with `theta >= eps`, and
    /// opens an empty gradient sum. Replies of an unfinished round are discarded.
    pub fn begin_round(&mut self) -> Result<RoundStart> {
        let theta = self.theta()?;
        let kept = prune(&mut self.w, &theta, self.config.prune_eps, &self.layout)?;
        self.round = Some(SparseGradSum::new(
            &self.layout,
            theta.clone(),
            &self.v,
            self.config.temperature,
        )?);
        Ok(RoundStart { theta, kept })
    }

    /// Adds one client's reply to the open round.
    pub fn add_reply(&mut self, reply: SparseReply<'_>) -> Result<()> {
        let sum = self.round.as_mut().ok_or_else(|| {
            FuseError::InvalidInput("no FedSparse round is open (call begin_round)".into())
        })?;
        sum.add(&self.layout, &self.w, reply)
    }

    /// Replies in the open round.
    pub fn replies(&self) -> usize {
        self.round.as_ref().map_or(0, SparseGradSum::clients)
    }

    /// `theta` of the open round (empty when none is open).
    pub fn theta_of_open_round(&self) -> &[f64] {
        self.round.as_ref().map_or(&[], |sum| &sum.theta)
    }

    /// The server between rounds, for a checkpoint: weights `w/{name}`, thresholds `v`, both
    /// optimizers' states (`w_opt:`, `v_opt:`), and the open round's `theta` as exact metrics
    /// `theta.{i}`. The open round must hold no reply yet.
    pub fn save(&self) -> Result<Record> {
        let theta = match &self.round {
            Some(sum) if sum.clients() == 0 => sum.theta.clone(),
            _ => {
                return Err(FuseError::InvalidInput(
                    "a FedSparse server is saved between rounds, with its next round open and \
                     empty"
                        .into(),
                ));
            }
        };
        let mut r = Record::default();
        for (name, t) in self.w.iter() {
            r.params
                .push(format!("w/{name}"), t.shape.clone(), t.data.clone())?;
        }
        r.params.push("v", vec![self.v.len()], self.v.clone())?;
        for (prefix, opt) in [("w_opt:", &self.w_opt), ("v_opt:", &self.v_opt)] {
            let saved = opt.save()?;
            for (name, t) in saved.params.iter() {
                r.params
                    .push(format!("{prefix}{name}"), t.shape.clone(), t.data.clone())?;
            }
            for (k, v) in saved.metrics {
                r.metrics.insert(format!("{prefix}{k}"), v);
            }
        }
        for (i, t) in theta.iter().enumerate() {
            r.metrics.insert(format!("theta.{i}"), *t);
        }
        Ok(r)
    }

    /// A server restored from [`Self::save`], with its next round open as it was.
    pub fn restore(config: FedSparseConfig, layout: GroupLayout, saved: &Record) -> Result<Self> {
        let mut w = Params::new();
        let mut opts = [Record::default(), Record::default()];
        let mut v = None;
        for (name, t) in saved.params.iter() {
            if let Some(n) = name.strip_prefix("w/") {
                w.push(n, t.shape.clone(), t.data.clone())?;
            } else if name == "v" {
                v = Some(t.data.clone());
            } else if let Some((i, n)) = name
                .strip_prefix("w_opt:")
                .map(|n| (0, n))
                .or_else(|| name.strip_prefix("v_opt:").map(|n| (1, n)))
            {
                opts[i].params.push(n, t.shape.clone(), t.data.clone())?;
            }
        }
        for (k, val) in &saved.metrics {
            if let Some(n) = k.strip_prefix("w_opt:") {
                opts[0].metrics.insert(n.to_string(), *val);
            } else if let Some(n) = k.strip_prefix("v_opt:") {
                opts[1].metrics.insert(n.to_string(), *val);
            }
        }
        let v =
            v.ok_or_else(|| FuseError::InvalidInput("saved FedSparse server has no v".into()))?;
        let theta = (0..layout.num_groups())
            .map(|i| {
                saved
                    .metrics
                    .get(&format!("theta.{i}"))
                    .copied()
                    .ok_or_else(|| {
                        FuseError::InvalidInput(format!("saved FedSparse server lacks theta.{i}"))
                    })
            })
            .collect::<Result<Vec<f64>>>()?;
        let mut server = Self::new(config, layout, w, v)?;
        server.w_opt.restore(&opts[0])?;
        server.v_opt.restore(&opts[1])?;
        server.round = Some(SparseGradSum::new(
            &server.layout,
            theta,
            &server.v,
            server.config.temperature,
        )?);
        Ok(server)
    }

    /// Ends the round: `w += weights_opt(grad_w)`, `v += thresholds_opt(grad_v)`. Returns the
    /// gradients used. Without replies the round stays open and [`FuseError::Empty`] is
    /// returned.
    pub fn finish_round(&mut self) -> Result<SparseGradients> {
        let sum = self.round.as_ref().ok_or_else(|| {
            FuseError::InvalidInput("no FedSparse round is open (call begin_round)".into())
        })?;
        let grads = sum.finish()?;
        let mut v_params = Params::new();
        v_params.push(V_NAME, vec![self.v.len()], self.v.clone())?;
        // Inputs were validated on the way in, so neither step can fail halfway in practice;
        // nothing is stored before both have succeeded.
        let w = self.w_opt.step_with_delta_f64(&self.w, &grads.w)?;
        let v = self
            .v_opt
            .step_with_delta_f64(&v_params, std::slice::from_ref(&grads.v))?;
        self.w = w;
        self.v = v.require(V_NAME)?.data.clone();
        self.round = None;
        Ok(grads)
    }
}
