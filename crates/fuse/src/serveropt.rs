//! Server optimizers (FedOpt, Reddi et al. 2021, "Adaptive federated optimization"): the server
//! treats `delta = mean(client models) - x_t` as an ascent direction ("pseudo-gradient"
//! `g = -delta`) and feeds it to SGD, Adam, Yogi, Adagrad or Adamax.
//!
//! In the hard-EM view of FedAvg (fedsparse-em, section 2) `delta` is the M-step's gradient up to
//! the prior precision `lambda`, so a server learning rate is a partial M-step and `Sgd { lr: 1,
//! momentum: 0 }` is the full M-step, i.e. FedAvg.
//!
//! Per element, with `D` the ascent direction of this round and `t = 1, 2, ...` the step count
//! (state `m = v = u = 0` before the first step, as Flower):
//!
//! | variant | update |
//! |---|---|
//! | `Sgd` (FedAvgM) | `m = momentum m + D`; `x += lr m` |
//! | `Adam` (FedAdam) | `m = b1 m + (1-b1) D`; `v = b2 v + (1-b2) D^2`; `x += lr m / (sqrt(v) + tau)` |
//! | `Yogi` (FedYogi) | `m` as Adam; `v = v - (1-b2) D^2 sign(v - D^2)`, `sign(0) = 0`; `x` as Adam |
//! | `Adagrad` (FedAdagrad) | `m = D`; `v = v + D^2`; `x` as Adam |
//! | `Adamax` | `m` as Adam; `u = max(b2 u, abs(D))`; `x += lr / (1 - b1^t) m / (u + eps)` |
//! | `KingmaAdam` | `m`, `v` as Adam; `x += lr m_hat / (sqrt(v_hat) + eps)`, `m_hat = m / (1 - b1^t)`, `v_hat = v / (1 - b2^t)` |
//!
//! `Adam`, `Yogi` and `Adagrad` are exactly Flower's `FedAdam`, `FedYogi` and `FedAdagrad` (no
//! bias correction, as Algorithm 2 of Reddi et al.; Flower's Adagrad also fixes `b1 = 0`; the
//! moments start at zero as in Flower, where the paper allows `v_{-1} >= tau^2`).
//! `Adamax` is Kingma & Ba's Algorithm 2 (bias correction on `m` only) with `eps` added to the
//! denominator (outside the max, unlike PyTorch, which puts it inside) so that an all-zero
//! history gives a zero step instead of `0/0`. `KingmaAdam` is Adam with bias correction as
//! `torch.optim.Adam`: FedSparse's server optimizer for the weights (paper, App. A: "Adam with
//! the default hyperparameters of Kingma & Ba").
//!
//! State is stored in f32 (one or two values per parameter); each update is computed in f64.
//! Batch norm's running statistics and counters ([`TensorRole`]) are no parameters: they take
//! the whole direction, so under FedOpt they are the clients' mean, as under FedAvg.

use fedfuse_core::{ParamShape, Params, Record, TensorRole};

use crate::{FuseError, Result};

/// A server optimizer and its hyperparameters (see the module table for the exact formulas).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ServerOptimizer {
    /// SGD with heavy-ball momentum (FedAvgM, Hsu et al. 2019); `lr = 1, momentum = 0` is FedAvg.
    Sgd {
        /// Server learning rate, > 0.
        lr: f64,
        /// Momentum in [0, 1).
        momentum: f64,
    },
    /// FedAdam (no bias correction).
    Adam {
        /// Server learning rate, > 0.
        lr: f64,
        /// First-moment decay in [0, 1).
        beta1: f64,
        /// Second-moment decay in [0, 1).
        beta2: f64,
        /// Adaptivity, > 0 (added to `sqrt(v)`).
        tau: f64,
    },
    /// Adamax (Kingma & Ba, Algorithm 2), with bias correction on the first moment.
    Adamax {
        /// Learning rate, > 0.
        lr: f64,
        /// First-moment decay in [0, 1).
        beta1: f64,
        /// Decay of the infinity norm in [0, 1).
        beta2: f64,
        /// Added to the infinity norm, > 0.
        eps: f64,
    },
    /// FedYogi (no bias correction).
    Yogi {
        /// Server learning rate, > 0.
        lr: f64,
        /// First-moment decay in [0, 1).
        beta1: f64,
        /// Second-moment rate in [0, 1) (`v` moves by `(1 - beta2) D^2`).
        beta2: f64,
        /// Adaptivity, > 0.
        tau: f64,
    },
    /// FedAdagrad (no momentum, as Flower).
    Adagrad {
        /// Server learning rate, > 0.
        lr: f64,
        /// Adaptivity, > 0.
        tau: f64,
    },
    /// Adam with Kingma & Ba's bias correction (`torch.optim.Adam`).
    KingmaAdam {
        /// Learning rate, > 0.
        lr: f64,
        /// First-moment decay in [0, 1).
        beta1: f64,
        /// Second-moment decay in [0, 1).
        beta2: f64,
        /// Added to `sqrt(v_hat)`, > 0.
        eps: f64,
    },
}

impl Default for ServerOptimizer {
    /// FedAvg: `Sgd { lr: 1, momentum: 0 }`.
    fn default() -> Self {
        Self::fedavg()
    }
}

impl ServerOptimizer {
    /// Plain FedAvg as a server step: `Sgd { lr: 1, momentum: 0 }`.
    pub fn fedavg() -> Self {
        Self::Sgd {
            lr: 1.0,
            momentum: 0.0,
        }
    }

    /// Flower's `FedAdam` defaults: `lr = 0.1, beta1 = 0.9, beta2 = 0.99, tau = 1e-9`.
    pub fn fedadam() -> Self {
        Self::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-9,
        }
    }

    /// Flower's `FedYogi` defaults: `lr = 0.01, beta1 = 0.9, beta2 = 0.99, tau = 1e-3`.
    pub fn fedyogi() -> Self {
        Self::Yogi {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-3,
        }
    }

    /// Flower's `FedAdagrad` defaults: `lr = 0.1, tau = 1e-9`.
    pub fn fedadagrad() -> Self {
        Self::Adagrad { lr: 0.1, tau: 1e-9 }
    }

    /// Kingma & Ba's Adamax defaults (`lr = 0.002, beta1 = 0.9, beta2 = 0.999`) with PyTorch's
    /// `eps = 1e-8`.
    pub fn adamax() -> Self {
        Self::Adamax {
            lr: 0.002,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// Kingma & Ba's Adam defaults: `lr = 0.001, beta1 = 0.9, beta2 = 0.999, eps = 1e-8`.
    pub fn kingma_adam() -> Self {
        Self::KingmaAdam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// The learning rate of any variant.
    pub fn lr(&self) -> f64 {
        match *self {
            Self::Sgd { lr, .. }
            | Self::Adam { lr, .. }
            | Self::Adamax { lr, .. }
            | Self::Yogi { lr, .. }
            | Self::Adagrad { lr, .. }
            | Self::KingmaAdam { lr, .. } => lr,
        }
    }

    /// Checks every hyperparameter, naming the first bad one (`server.lr`, `server.beta1`, ...).
    pub fn check(&self) -> Result<()> {
        positive("server.lr", self.lr())?;
        match *self {
            Self::Sgd { momentum, .. } => unit("server.momentum", momentum),
            Self::Adam {
                beta1, beta2, tau, ..
            }
            | Self::Yogi {
                beta1, beta2, tau, ..
            } => {
                unit("server.beta1", beta1)?;
                unit("server.beta2", beta2)?;
                positive("server.tau", tau)
            }
            Self::Adamax {
                beta1, beta2, eps, ..
            }
            | Self::KingmaAdam {
                beta1, beta2, eps, ..
            } => {
                unit("server.beta1", beta1)?;
                unit("server.beta2", beta2)?;
                positive("server.eps", eps)
            }
            Self::Adagrad { tau, .. } => positive("server.tau", tau),
        }
    }

    /// One element's update at step `t >= 1`: returns the new value and updates the moments.
    /// `d` is the ascent direction.
    fn update(&self, t: u64, x: f64, d: f64, m: &mut f32, v: &mut f32) -> f64 {
        let (m0, v0) = (f64::from(*m), f64::from(*v));
        let (x, m1, v1) = match *self {
            Self::Sgd { lr, momentum } => {
                let m1 = momentum * m0 + d;
                (x + lr * m1, m1, 0.0)
            }
            Self::Adam {
                lr,
                beta1,
                beta2,
                tau,
            } => {
                let m1 = beta1 * m0 + (1.0 - beta1) * d;
                let v1 = beta2 * v0 + (1.0 - beta2) * d * d;
                (x + lr * m1 / (v1.sqrt() + tau), m1, v1)
            }
            Self::Yogi {
                lr,
                beta1,
                beta2,
                tau,
            } => {
                let m1 = beta1 * m0 + (1.0 - beta1) * d;
                let d2 = d * d;
                // numpy's sign (0 at 0), not f64::signum (+1 at +0).
                let sign = if v0 > d2 {
                    1.0
                } else if v0 < d2 {
                    -1.0
                } else {
                    0.0
                };
                // Clamp: f32 storage could round a tiny v below zero, and sqrt needs v >= 0.
                let v1 = (v0 - (1.0 - beta2) * d2 * sign).max(0.0);
                (x + lr * m1 / (v1.sqrt() + tau), m1, v1)
            }
            Self::Adagrad { lr, tau } => {
                let v1 = v0 + d * d;
                (x + lr * d / (v1.sqrt() + tau), d, v1)
            }
            Self::Adamax {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let m1 = beta1 * m0 + (1.0 - beta1) * d;
                let u1 = (beta2 * v0).max(d.abs());
                let correction = 1.0 - beta1.powf(t as f64);
                (x + lr / correction * m1 / (u1 + eps), m1, u1)
            }
            Self::KingmaAdam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                let m1 = beta1 * m0 + (1.0 - beta1) * d;
                let v1 = beta2 * v0 + (1.0 - beta2) * d * d;
                let m_hat = m1 / (1.0 - beta1.powf(t as f64));
                let v_hat = v1 / (1.0 - beta2.powf(t as f64));
                (x + lr * m_hat / (v_hat.sqrt() + eps), m1, v1)
            }
        };
        *m = m1 as f32;
        *v = v1 as f32;
        x
    }
}

fn positive(field: &'static str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field,
            reason: format!("{value} is not a positive number"),
        })
    }
}

fn unit(field: &'static str, value: f64) -> Result<()> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(FuseError::InvalidSetting {
            field,
            reason: format!("{value} is not in [0, 1)"),
        })
    }
}

/// The state of a [`ServerOptimizer`] across rounds: moments per parameter and the step count.
///
/// The first step fixes the layout (names and shapes); a later step with another layout is an
/// error ([`FuseError::Layout`], naming the tensor) and leaves the state untouched.
#[derive(Clone, Debug)]
pub struct ServerOptState {
    opt: ServerOptimizer,
    layout: Option<Vec<ParamShape>>,
    /// First moment (`m`) per tensor.
    m: Vec<Vec<f32>>,
    /// Second moment (`v`), or infinity norm (`u`) for Adamax, per tensor; unused by Sgd.
    v: Vec<Vec<f32>>,
    steps: u64,
}

impl ServerOptState {
    /// A fresh state (no step taken); checks the hyperparameters.
    pub fn new(opt: ServerOptimizer) -> Result<Self> {
        opt.check()?;
        Ok(Self {
            opt,
            layout: None,
            m: Vec::new(),
            v: Vec::new(),
            steps: 0,
        })
    }

    /// The optimizer.
    pub fn optimizer(&self) -> &ServerOptimizer {
        &self.opt
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The layout fixed by the first step, if any.
    pub fn layout(&self) -> Option<&[ParamShape]> {
        self.layout.as_deref()
    }

    /// The state, for a checkpoint: the moments as tensors `m/{name}` and `v/{name}` and the
    /// step count as the metric `steps` ([`Self::restore`] reads it back exactly).
    pub fn save(&self) -> Result<Record> {
        let mut params = Params::new();
        if let Some(layout) = &self.layout {
            for (shape, (m, v)) in layout.iter().zip(self.m.iter().zip(&self.v)) {
                params.push(format!("m/{}", shape.name), shape.shape.clone(), m.clone())?;
                params.push(format!("v/{}", shape.name), shape.shape.clone(), v.clone())?;
            }
        }
        let mut record = Record::from_params(params);
        record.metrics.insert("steps".into(), self.steps as f64);
        Ok(record)
    }

    /// Restores a state written by [`Self::save`] (same optimizer; the caller checks that the
    /// checkpoint belongs to the same run).
    pub fn restore(&mut self, state: &Record) -> Result<()> {
        let bad = |why: String| FuseError::InvalidState(format!("server optimizer: {why}"));
        let steps = state.metrics.get("steps").copied().unwrap_or(0.0);
        if !(steps >= 0.0 && steps.fract() == 0.0 && steps < 2f64.powi(53)) {
            return Err(bad(format!("step count {steps} is not a whole number")));
        }
        self.reset();
        self.steps = steps as u64;
        let tensors: Vec<(&str, &fedfuse_core::Tensor)> = state.params.iter().collect();
        if tensors.is_empty() {
            return Ok(());
        }
        if !tensors.len().is_multiple_of(2) {
            return Err(bad("moments come in pairs m/NAME, v/NAME".into()));
        }
        let mut layout = Vec::new();
        for pair in tensors.chunks(2) {
            let ((mn, m), (vn, v)) = (pair[0], pair[1]);
            let name = mn
                .strip_prefix("m/")
                .filter(|n| vn.strip_prefix("v/") == Some(*n) && m.shape == v.shape)
                .ok_or_else(|| bad(format!("`{mn}` and `{vn}` are no pair of moments")))?;
            if m.data.iter().chain(&v.data).any(|x| !x.is_finite()) {
                return Err(bad(format!("the moments of `{name}` are not all finite")));
            }
            // The second moment is a running mean of squares.
            if let Some(x) = v.data.iter().find(|x| **x < 0.0) {
                return Err(bad(format!(
                    "the second moment of `{name}` holds {x}, and a mean of squares is at least 0"
                )));
            }
            layout.push(ParamShape {
                name: name.to_string(),
                shape: m.shape.clone(),
            });
            self.m.push(m.data.clone());
            self.v.push(v.data.clone());
        }
        self.layout = Some(layout);
        Ok(())
    }

    /// Forgets the moments, step count and layout.
    pub fn reset(&mut self) {
        self.layout = None;
        self.m.clear();
        self.v.clear();
        self.steps = 0;
    }

    /// One server step from the aggregate of the clients: `delta = mean - global`.
    ///
    /// `mean` is the (example-weighted) mean of the client models, e.g. from
    /// [`weighted_mean_params`](crate::weighted_mean_params). Plain SGD without momentum is
    /// computed as `(1 - lr) x + lr mean`, the same step written so that `lr = 1` returns
    /// `mean` bit for bit (FedAvg).
    pub fn step(&mut self, global: &Params, mean: &Params) -> Result<Params> {
        self.check_inputs(global, mean)?;
        if let ServerOptimizer::Sgd { lr, momentum } = self.opt
            && momentum == 0.0
        {
            self.start(global);
            self.steps += 1;
            return convex(global, mean, lr);
        }
        let deltas: Vec<Vec<f64>> = global
            .iter()
            .zip(mean.iter())
            .map(|((_, x), (_, y))| {
                x.data
                    .iter()
                    .zip(&y.data)
                    .map(|(a, b)| f64::from(*b) - f64::from(*a))
                    .collect()
            })
            .collect();
        self.apply(global, &deltas)
    }

    /// One server step along a given ascent direction `delta` (same layout as `global`):
    /// `delta = mean - global` for FedOpt, or an accumulated gradient (FedSparse).
    pub fn step_with_delta(&mut self, global: &Params, delta: &Params) -> Result<Params> {
        self.check_inputs(global, delta)?;
        let deltas: Vec<Vec<f64>> = delta
            .iter()
            .map(|(_, t)| t.data.iter().map(|d| f64::from(*d)).collect())
            .collect();
        self.apply(global, &deltas)
    }

    /// [`Self::step_with_delta`] with an f64 direction per tensor (in `global`'s order), for
    /// callers that accumulate in f64.
    pub fn step_with_delta_f64(&mut self, global: &Params, delta: &[Vec<f64>]) -> Result<Params> {
        self.check_layout(global)?;
        global.check_finite()?;
        if delta.len() != global.len() {
            return Err(FuseError::InvalidInput(format!(
                "{} direction tensors where {} were expected",
                delta.len(),
                global.len()
            )));
        }
        for ((name, t), d) in global.iter().zip(delta) {
            if d.len() != t.data.len() {
                return Err(FuseError::InvalidInput(format!(
                    "direction for tensor `{name}` has {} values where {} were expected",
                    d.len(),
                    t.data.len()
                )));
            }
            if let Some(i) = d.iter().position(|v| !v.is_finite()) {
                return Err(FuseError::InvalidInput(format!(
                    "direction for tensor `{name}` is not finite at index {i}"
                )));
            }
        }
        self.apply(global, delta)
    }

    fn check_layout(&self, global: &Params) -> Result<()> {
        if let Some(layout) = &self.layout {
            global.check_layout(layout)?;
        }
        Ok(())
    }

    /// Everything is checked before any state changes, so a refused step leaves no trace.
    fn check_inputs(&self, global: &Params, other: &Params) -> Result<()> {
        self.check_layout(global)?;
        other.check_layout(&global.layout())?;
        global.check_finite()?;
        other.check_finite()?;
        Ok(())
    }

    /// Fixes the layout and zero moments on the first step.
    fn start(&mut self, global: &Params) {
        if self.layout.is_none() {
            self.layout = Some(global.layout());
            self.m = global
                .iter()
                .map(|(_, t)| vec![0.0; t.data.len()])
                .collect();
            self.v = self.m.clone();
        }
    }

    fn apply(&mut self, global: &Params, deltas: &[Vec<f64>]) -> Result<Params> {
        self.start(global);
        self.steps += 1;
        let t = self.steps;
        let mut out = Params::new();
        for (i, (name, x)) in global.iter().enumerate() {
            if TensorRole::of(name) != TensorRole::Param {
                // Running statistics are no parameters to optimise: they take the whole
                // direction (FedOpt's: the clients' mean).
                let data = x
                    .data
                    .iter()
                    .zip(&deltas[i])
                    .map(|(x, d)| (f64::from(*x) + d) as f32)
                    .collect();
                out.push(name, x.shape.clone(), data)?;
                continue;
            }
            let (m, v) = (&mut self.m[i], &mut self.v[i]);
            let data = x
                .data
                .iter()
                .zip(&deltas[i])
                .zip(m.iter_mut().zip(v.iter_mut()))
                .map(|((x, d), (m, v))| self.opt.update(t, f64::from(*x), *d, m, v) as f32)
                .collect();
            out.push(name, x.shape.clone(), data)?;
        }
        Ok(out)
    }
}

/// `(1 - lr) x + lr y` per element, in f64; running statistics take `y`.
fn convex(x: &Params, y: &Params, lr: f64) -> Result<Params> {
    let mut out = Params::new();
    for ((name, a), (_, b)) in x.iter().zip(y.iter()) {
        let lr = if TensorRole::of(name) == TensorRole::Param {
            lr
        } else {
            1.0
        };
        let data = a
            .data
            .iter()
            .zip(&b.data)
            .map(|(a, b)| ((1.0 - lr) * f64::from(*a) + lr * f64::from(*b)) as f32)
            .collect();
        out.push(name, a.shape.clone(), data)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(values: &[f32]) -> Params {
        let mut p = Params::new();
        p.push("w", vec![values.len()], values.to_vec()).unwrap();
        p
    }

    #[test]
    fn a_restored_state_steps_as_the_original() {
        let opt = ServerOptimizer::fedadam();
        let mut a = ServerOptState::new(opt).unwrap();
        let g = a.step(&model(&[0.0, 1.0]), &model(&[1.0, -1.0])).unwrap();
        let mut b = ServerOptState::new(opt).unwrap();
        b.restore(&a.save().unwrap()).unwrap();
        assert_eq!(b.steps(), 1);
        let next = model(&[0.5, 0.25]);
        assert_eq!(a.step(&g, &next).unwrap(), b.step(&g, &next).unwrap());
        // A fresh state saves nothing but its zero step count.
        let mut fresh = ServerOptState::new(opt).unwrap();
        fresh
            .restore(&ServerOptState::new(opt).unwrap().save().unwrap())
            .unwrap();
        assert_eq!((fresh.steps(), fresh.layout()), (0, None));
        let mut odd = a.save().unwrap();
        odd.params.remove("v/w");
        assert!(fresh.restore(&odd).is_err());
    }
}
