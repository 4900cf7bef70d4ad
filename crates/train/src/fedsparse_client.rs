//! FedSparse, client side (Louizos et al., "An Expectation-Maximization Perspective on
//! Federated Learning", section 3, Appendix H eq. 41, Appendix I Algorithm 2).
//!
//! Each group `g` (see [`Trainer::groups`]) has a gate. Its probability of being on is
//! `sigmoid((||w_g|| - softplus(v_g)) / T)` (eq. 23): a magnitude threshold `softplus(v_g)`
//! with temperature `T`. The server sends weights `w` and thresholds `v`; the client starts
//! from both and minimises, per mini-batch,
//!
//! ```text
//!   mean cross-entropy of the network with its units multiplied by gates z ~ HC(pi_s)
//!   + drift/2  * sum_g pi_sg ||w_sg - w_g||^2
//!   + lambda0  * sum_g |g| pi_sg
//!   - prior_scale * sum_g (pi_sg logit(theta_g) + log(1 - theta_g))
//! ```
//!
//! with `pi_s` from the client's `(w_s, v_s)` and `theta` from the server's `(w, v)`. The norm
//! in `pi_s` is detached, so the penalties move the thresholds `v_s` and never shrink weights
//! to switch gates off (section 3.2). Weights follow the configured optimizer; thresholds
//! follow Adamax. At the end one hard gate per group is drawn from `Bernoulli(pi_s)` and the
//! groups that drew 0 are zeroed.
//!
//! Scale: the data term is the mean over the batch (as in [`Trainer::fit_with`]), not the sum
//! over the client's data of eq. 17; `lambda0` and `drift` are relative to that mean, which is
//! the scale of the paper's `lambda0` presets (Appendix A).

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::activation::{sigmoid, softplus};
use burn::tensor::{Device, Tensor, TensorData};
// burn's tensor functions have the plain names.
use fedfuse_core::groups::{sigmoid as sigmoid_f64, softplus as softplus_f64};
use fedfuse_core::{GroupLayout, Params};
use fedfuse_data::Dataset;
use rand::SeedableRng;
use rand::distr::{Distribution, StandardUniform};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::{Result, TrainConfig, TrainError, Trainer, convert, hard_concrete, trainer};

/// FedSparse's sparsity presets (the paper's LeNet-5 `lambda0` values, Appendix A).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparsityPreset {
    /// `lambda0 = 5e-7`.
    Low,
    /// `lambda0 = 5e-6`.
    #[default]
    Mid,
    /// `lambda0 = 5e-5`.
    High,
}

impl SparsityPreset {
    /// The preset's `lambda0`.
    pub fn lambda0(self) -> f64 {
        match self {
            Self::Low => 5e-7,
            Self::Mid => 5e-6,
            Self::High => 5e-5,
        }
    }
}

/// FedSparse's client settings; `Default` holds the paper's Appendix A values, the defaults
/// of the run config's `[method] name = "fedsparse"` table.
#[derive(Clone, Debug, PartialEq)]
pub struct SparseConfig {
    /// L0 strength `lambda0`, per weight of a group that is on ([`SparsityPreset`]).
    pub lambda0: f64,
    /// Temperature `T` of the gate probabilities `sigmoid((||w_g|| - tau_g) / T)`.
    pub temperature: f64,
    /// Precision `lambda` of the drift term `lambda/2 sum_g pi_sg ||w_sg - w_g||^2`; the paper
    /// uses 0, since the client starts each round at the server's weights.
    pub drift: f64,
    /// Adamax learning rate of the client thresholds `v_s`.
    pub threshold_lr: f64,
    /// Factor on the cross-entropy between the client's and the server's gate probabilities;
    /// the paper down-scales it by 1e-4 because each round restarts at `pi_s = theta` and
    /// takes few steps.
    pub prior_scale: f64,
    /// Server gate probability `theta` that the first model's thresholds give every group
    /// ([`GroupLayout::initial_thresholds`]; 0.99: start dense).
    pub initial_theta: f64,
}

impl Default for SparseConfig {
    fn default() -> Self {
        Self {
            lambda0: SparsityPreset::default().lambda0(),
            temperature: 1e-3,
            drift: 0.0,
            threshold_lr: 1e-3,
            prior_scale: 1e-4,
            initial_theta: 0.99,
        }
    }
}

impl SparseConfig {
    /// Checks every setting once; training trusts them afterwards. Errors name a setting by
    /// its field here (the caller knows where it sits in a config file).
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::InvalidConfig { field, reason });
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !non_negative(self.lambda0) {
            return bad("lambda0", format!("{} is not >= 0", self.lambda0));
        }
        if !positive(self.temperature) {
            return bad(
                "temperature",
                format!("{} is not a positive number", self.temperature),
            );
        }
        if !non_negative(self.drift) {
            return bad("drift", format!("{} is not >= 0", self.drift));
        }
        if !positive(self.threshold_lr) {
            return bad(
                "threshold_lr",
                format!("{} is not a positive number", self.threshold_lr),
            );
        }
        if !non_negative(self.prior_scale) {
            return bad("prior_scale", format!("{} is not >= 0", self.prior_scale));
        }
        if !(self.initial_theta > 0.0 && self.initial_theta < 1.0) {
            return bad(
                "initial_theta",
                format!("{} is not in (0, 1)", self.initial_theta),
            );
        }
        Ok(())
    }
}

/// The outcome of FedSparse local training.
#[derive(Clone, Debug)]
pub struct SparseFit {
    /// The trained weights times the hard gates `z`: groups with `z = false` are exactly 0.
    pub params: Params,
    /// The client thresholds `v_s` (`tau_s = softplus(v_s)`), one per group.
    pub v: Vec<f32>,
    /// The final gate probabilities `pi_s` of the trained weights (before masking), one per
    /// group.
    pub pi: Vec<f32>,
    /// The hard gates drawn from `Bernoulli(pi_s)`, one per group.
    pub z: Vec<bool>,
    /// Mean cross-entropy (with sampled relaxed gates) over the last epoch, penalties excluded.
    pub loss: f64,
    /// Optimizer steps taken.
    pub steps: usize,
    /// Training examples seen per epoch.
    pub examples: usize,
}

impl SparseFit {
    /// Groups whose gate is on, and groups in all.
    pub fn kept(&self) -> (usize, usize) {
        (self.z.iter().filter(|&&z| z).count(), self.z.len())
    }
}

/// Adamax (Kingma & Ba 2015, Algorithm 2, PyTorch's defaults and epsilon placement) for the
/// thresholds: burn 0.22 has no Adamax, and the thresholds are a few hundred plain values.
struct Adamax {
    m: Vec<f64>,
    u: Vec<f64>,
    t: i32,
}

impl Adamax {
    const BETA1: f64 = 0.9;
    const BETA2: f64 = 0.999;
    const EPS: f64 = 1e-8;

    fn new(n: usize) -> Self {
        Self {
            m: vec![0.0; n],
            u: vec![0.0; n],
            t: 0,
        }
    }

    fn step(&mut self, lr: f64, v: &mut [f32], grad: &[f32]) {
        self.t += 1;
        let step = lr / (1.0 - Self::BETA1.powi(self.t));
        for (((v, &g), m), u) in v.iter_mut().zip(grad).zip(&mut self.m).zip(&mut self.u) {
            let g = f64::from(g);
            *m = Self::BETA1 * *m + (1.0 - Self::BETA1) * g;
            *u = (Self::BETA2 * *u).max(g.abs() + Self::EPS);
            *v = (f64::from(*v) - step * *m / *u) as f32;
        }
    }
}

/// The server's side of the prior term, constant during local training.
struct Prior {
    /// `logit(theta_g)` per grouped layer.
    logit: Vec<Tensor<1>>,
    /// `sum_g log(1 - theta_g)`.
    log1m_sum: f64,
}

impl Prior {
    /// From the server's gate logits, one per group of `groups`.
    fn new(logits: &[f64], groups: &GroupLayout, device: &Device) -> Self {
        Self {
            logit: (0..groups.layers().len())
                .map(|l| {
                    vector(
                        logits.get(groups.layer_groups(l)).unwrap_or_default(),
                        device,
                    )
                })
                .collect(),
            // log(1 - sigmoid(x)) = -softplus(x)
            log1m_sum: -logits.iter().map(|&x| softplus_f64(x)).sum::<f64>(),
        }
    }
}

fn vector(values: &[f64], device: &Device) -> Tensor<1> {
    let data: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(data, [values.len()]), device)
}

/// Squared norm of each group of `(weights [units, fan_in], bias [units])`.
fn sq_norms(w: Tensor<2>, b: Tensor<1>) -> Tensor<1> {
    let [units, _] = w.dims();
    w.square().sum_dim(1).reshape([units]) + b.square()
}

/// Client gate logits `(||w_sg|| - softplus(v_sg)) / T`; the norms are detached so that only
/// `v` receives gradients through them.
fn client_logits(
    units: &[(Tensor<2>, Tensor<1>)],
    v: &[Tensor<1>],
    temperature: f64,
) -> Vec<Tensor<1>> {
    units
        .iter()
        .zip(v)
        .map(|((w, b), v)| {
            let norm = sq_norms(w.clone().detach(), b.clone().detach()).sqrt();
            (norm - softplus(v.clone(), 1.0)).div_scalar(temperature)
        })
        .collect()
}

/// Relaxed gates `z ~ HC(log alpha)`, `log alpha = logit(pi) + beta ln(-gamma/zeta)` so that
/// `P(z > 0) = pi`; `noise` holds the logistic noise, one value per unit.
fn relaxed_gates(logit_pi: Tensor<1>, noise: &[f64]) -> Tensor<1> {
    use hard_concrete::{BETA, GAMMA, ZETA};
    let noise = vector(noise, &logit_pi.device());
    let s = sigmoid((logit_pi.add_scalar(hard_concrete::shift()) + noise).div_scalar(BETA));
    s.mul_scalar(ZETA - GAMMA).add_scalar(GAMMA).clamp(0.0, 1.0)
}

/// Everything in eq. 41 but the data term, as a differentiable scalar: L0, the prior
/// cross-entropy (times `prior_scale`) and, with `anchor` (the server's units), the drift.
/// `None` for a model without groups.
fn penalty(
    logit_pi: &[Tensor<1>],
    units: &[(Tensor<2>, Tensor<1>)],
    anchor: Option<&[(Tensor<2>, Tensor<1>)]>,
    prior: &Prior,
    sizes: &[usize],
    sparse: &SparseConfig,
) -> Option<Tensor<1>> {
    let mut total = None::<Tensor<1>>;
    let mut add = |t: Tensor<1>| {
        total = Some(match total.take() {
            Some(s) => s + t,
            None => t,
        });
    };
    for (l, logit) in logit_pi.iter().enumerate() {
        let pi = sigmoid(logit.clone());
        let size = sizes.get(l).copied().unwrap_or(0) as f64;
        add(pi.clone().sum().mul_scalar(sparse.lambda0 * size));
        if let Some(theta_logit) = prior.logit.get(l) {
            add((pi.clone() * theta_logit.clone())
                .sum()
                .mul_scalar(-sparse.prior_scale));
        }
        if let (Some(anchor), Some((w, b))) = (anchor, units.get(l))
            && sparse.drift > 0.0
            && let Some((aw, ab)) = anchor.get(l)
        {
            let sq = sq_norms(w.clone() - aw.clone(), b.clone() - ab.clone());
            add((pi * sq).sum().mul_scalar(sparse.drift / 2.0));
        }
    }
    total.map(|t| t.add_scalar(-sparse.prior_scale * prior.log1m_sum))
}

fn logistic_noise(rng: &mut StdRng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| hard_concrete::logistic_noise(StandardUniform.sample(rng)))
        .collect()
}

fn values(t: Tensor<1>) -> Result<Vec<f32>> {
    t.into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))
}

impl Trainer {
    /// FedSparse local training (Algorithm 2 with eq. 41) from the server's weights `start`
    /// and thresholds `thresholds` (one `v` per group of [`Self::groups`]).
    ///
    /// Per mini-batch: one relaxed gate per group, multiplied onto its unit's output; the loss
    /// of the module docs; a step of `cfg.optimizer` on the weights and of Adamax
    /// (`sparse.threshold_lr`) on the thresholds. Afterwards one hard gate per group is drawn
    /// from `Bernoulli(pi_s)` and the groups that drew 0 are zeroed in the returned weights.
    /// Everything random comes from one generator seeded with `seed`.
    pub fn fit_sparse(
        &self,
        start: &Params,
        thresholds: &[f32],
        data: &Dataset,
        cfg: &TrainConfig,
        sparse: &SparseConfig,
        seed: u64,
    ) -> Result<SparseFit> {
        cfg.check()?;
        sparse.check()?;
        self.check_data(data)?;
        if data.is_empty() {
            return Err(TrainError::DataMismatch("no training samples".into()));
        }
        let spec = self.spec();
        let groups = self.groups();
        let sizes: Vec<usize> = groups.layers().iter().map(|g| g.size()).collect();
        let device = Device::flex().autodiff();
        let mut net = convert::build(spec, start, &device)?;
        let prior = Prior::new(
            &groups.gate_logits(start, thresholds, sparse.temperature)?,
            groups,
            &device,
        );
        let anchor = if sparse.drift > 0.0 {
            Some(
                convert::build(spec, start, &device)?
                    .no_grad()
                    .group_units(),
            )
        } else {
            None
        };
        let mut v_s = thresholds.to_vec();
        let mut adamax = Adamax::new(v_s.len());
        let mut optim = trainer::optimizer(&cfg.optimizer);
        let widths = net.dropout_layers(cfg.dropout);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut steps = 0;
        let mut last_loss = f64::NAN;
        for epoch in 1..=cfg.epochs {
            order.shuffle(&mut rng);
            let mut loss_sum = 0.0;
            let mut penalty_sum = 0.0;
            for batch in order.chunks(cfg.batch_size) {
                let v: Vec<Tensor<1>> = self
                    .per_layer(&v_s, &device)
                    .into_iter()
                    .map(Tensor::require_grad)
                    .collect();
                let units = net.group_units();
                let logit_pi = client_logits(&units, &v, sparse.temperature);
                let gates: Vec<Tensor<1>> = logit_pi
                    .iter()
                    .map(|l| {
                        let [n] = l.dims();
                        relaxed_gates(l.clone(), &logistic_noise(&mut rng, n))
                    })
                    .collect();
                let (x, targets) = self.batch(data, batch, &device);
                let drop = trainer::dropout_masks(&widths, batch.len(), &mut rng, &device);
                let nll = trainer::cross_entropy(net.forward_train(x, &gates, &drop), targets);
                let pen = penalty(&logit_pi, &units, anchor.as_deref(), &prior, &sizes, sparse);
                loss_sum += f64::from(nll.clone().into_scalar::<f32>()) * batch.len() as f64;
                let loss = match pen {
                    Some(pen) => {
                        penalty_sum += f64::from(pen.clone().into_scalar::<f32>());
                        nll + pen
                    }
                    None => nll,
                };
                let mut grads = loss.backward();
                let mut grad_v = Vec::with_capacity(v_s.len());
                for v in &v {
                    match v.grad_remove(&mut grads) {
                        Some(g) => grad_v.extend(values(g)?),
                        None => grad_v.extend(std::iter::repeat_n(0.0, v.dims()[0])),
                    }
                }
                let grads = GradientsParams::from_grads(grads, &net);
                net = optim.step(cfg.lr, net, grads);
                adamax.step(sparse.threshold_lr, &mut v_s, &grad_v);
                steps += 1;
            }
            last_loss = loss_sum / data.len() as f64;
            if !(last_loss.is_finite() && penalty_sum.is_finite()) {
                return Err(TrainError::Diverged {
                    loss: last_loss + penalty_sum,
                    epoch,
                });
            }
        }
        let mut trained = convert::read(&net, spec)?;
        let logits = groups.gate_logits(&trained, &v_s, sparse.temperature)?;
        let pi = logits.iter().map(|&x| sigmoid_f64(x) as f32).collect();
        let z: Vec<bool> = logits
            .iter()
            .map(|&x| hard_concrete::sample_hard(x, StandardUniform.sample(&mut rng)))
            .collect();
        groups.mask(&mut trained, &z)?;
        Ok(SparseFit {
            params: trained,
            v: v_s,
            pi,
            z,
            loss: last_loss,
            steps,
            examples: data.len(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use rand::distr::Uniform;

    use fedfuse_core::ModelSpec;

    use super::*;
    use crate::net::Net;
    use crate::{Init, init_params};

    #[test]
    fn tensor_gates_follow_the_scalar_relaxation_and_pi() {
        let n = 50_000;
        let mut rng = StdRng::seed_from_u64(11);
        for logit in [-3.0, -0.5, 0.0, 1.2, 4.6] {
            let noise = logistic_noise(&mut rng, n);
            let z = values(relaxed_gates(
                vector(&vec![logit; n], &Device::flex()),
                &noise,
            ))
            .unwrap();
            let la = hard_concrete::log_alpha(logit);
            for (zi, &e) in z.iter().zip(&noise).take(500) {
                // The scalar form, from the uniform that gives this noise.
                let u = 1.0 / (1.0 + (-e).exp());
                assert!((f64::from(*zi) - hard_concrete::sample(la, u)).abs() < 1e-4);
            }
            let on = z.iter().filter(|&&v| v > 0.0).count() as f64 / n as f64;
            let pi = sigmoid_f64(logit);
            assert!(
                (on - pi).abs() < 0.01,
                "logit {logit}: P(z>0) {on} vs pi {pi}"
            );
            // Relaxed, not binary: some gates lie strictly inside (0, 1) unless pi is extreme.
            let inside = z.iter().filter(|&&v| v > 0.0 && v < 1.0).count();
            assert!(inside > n / 50, "logit {logit}: {inside} gates in (0, 1)");
        }
    }

    /// Two encoder blocks of 2 heads over 8x8 images: groups are heads and MLP units.
    fn tiny_vit() -> ModelSpec {
        let shape = fedfuse_core::VitShape {
            patch: 4,
            hidden: 8,
            layers: 2,
            heads: 2,
            mlp: 6,
            ..Default::default()
        };
        ModelSpec::Sequential {
            input: vec![1, 8, 8],
            layers: shape.layers(3),
        }
    }

    #[test]
    fn group_units_match_group_norms() {
        for spec in [
            ModelSpec::mlp(5, &[4, 3], 2),
            ModelSpec::LeNet5 {
                channels: 1,
                side: 28,
                classes: 10,
            },
            tiny_vit(),
        ] {
            let p = init_params(&spec, Init::Pfnm, 3);
            let net = convert::build(&spec, &p, &Device::flex()).unwrap();
            let want = GroupLayout::of_model(&spec).norms(&p).unwrap();
            let got: Vec<f32> = net
                .group_units()
                .into_iter()
                .flat_map(|(w, b)| values(sq_norms(w, b).sqrt()).unwrap())
                .collect();
            assert_eq!(got.len(), want.len());
            for (&g, &w) in got.iter().zip(&want) {
                let g = f64::from(g);
                assert!((g - w).abs() < 1e-5 * w.max(1.0), "{g} vs {w}");
            }
        }
    }

    #[test]
    fn gates_multiply_the_units_they_belong_to() {
        // A gate of 0 on a unit acts as its group zeroed, a gate of 1 as no gate: on a ViT, a
        // head (its q, k, v rows and biases) of the first block and an MLP unit of the last.
        for spec in [
            ModelSpec::mlp(6, &[5, 4], 3),
            ModelSpec::LeNet5 {
                channels: 1,
                side: 28,
                classes: 10,
            },
            tiny_vit(),
        ] {
            let p = init_params(&spec, Init::Pfnm, 8);
            let device = Device::flex();
            let n = spec.input_len();
            let x: Vec<f32> = (0..2 * n).map(|i| (i % 7) as f32 / 7.0).collect();
            let input = || Tensor::from_data(TensorData::new(x.clone(), [2, n]), &device);
            let layout = GroupLayout::of_model(&spec);
            let last = layout.layers().len() - 1;
            let mut keep = vec![true; layout.num_groups()];
            keep[layout.layer_groups(0).start + 1] = false;
            keep[layout.layer_groups(last).start] = false;
            let mut pruned = p.clone();
            layout.mask(&mut pruned, &keep).unwrap();
            let gates: Vec<Tensor<1>> = (0..=last)
                .map(|l| {
                    let z: Vec<f64> = keep[layout.layer_groups(l)]
                        .iter()
                        .map(|&on| if on { 1.0 } else { 0.0 })
                        .collect();
                    vector(&z, &device)
                })
                .collect();
            let net = convert::build(&spec, &p, &device).unwrap();
            let gated = values(net.forward_gated(input(), &gates).reshape([-1])).unwrap();
            let masked = convert::build(&spec, &pruned, &device).unwrap();
            let want = values(masked.forward(input()).reshape([-1])).unwrap();
            let plain = values(net.forward(input()).reshape([-1])).unwrap();
            assert_ne!(want, plain, "{spec:?}: the masked units matter");
            for (a, b) in gated.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{spec:?}: gated {a} vs masked {b}");
            }
        }
    }

    /// Hand-written eq. 41 penalty in f64 on plain values: client weights `ws`, server
    /// weights `w` (both `Params`), client thresholds `v`, server thresholds `v0`.
    fn reference_penalty(
        spec: &ModelSpec,
        ws: &Params,
        w: &Params,
        v: &[f64],
        v0: &[f32],
        cfg: &SparseConfig,
    ) -> f64 {
        let t = cfg.temperature;
        let mut total = 0.0;
        let layout = GroupLayout::of_model(spec);
        for (l, g) in layout.layers().iter().enumerate() {
            let (a, ab) = (ws.get(&g.weight).unwrap(), ws.get(&g.per_unit[0]).unwrap());
            let (b, bb) = (w.get(&g.weight).unwrap(), w.get(&g.per_unit[0]).unwrap());
            let first = layout.layer_groups(l).start;
            for u in 0..g.units {
                let row = |p: &fedfuse_core::Tensor, q: &fedfuse_core::Tensor| {
                    (0..g.fan_in)
                        .map(|i| f64::from(p.data[u * g.fan_in + i]))
                        .chain([f64::from(q.data[u])])
                        .collect::<Vec<_>>()
                };
                let (xs, x0) = (row(a, ab), row(b, bb));
                let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
                let pi = sigmoid_f64((norm(&xs) - softplus_f64(v[first + u])) / t);
                let theta = sigmoid_f64((norm(&x0) - softplus_f64(f64::from(v0[first + u]))) / t);
                let drift: f64 = xs.iter().zip(&x0).map(|(p, q)| (p - q).powi(2)).sum();
                total += cfg.lambda0 * g.size() as f64 * pi
                    - cfg.prior_scale * (pi * (theta / (1.0 - theta)).ln() + (1.0 - theta).ln())
                    + cfg.drift / 2.0 * pi * drift;
            }
        }
        total
    }

    /// burn's penalty, its gradient w.r.t. the thresholds and w.r.t. `layers.0.weight`
    /// (PyTorch layout, zeros where burn gives none).
    fn burn_penalty(
        spec: &ModelSpec,
        ws: &Params,
        w: &Params,
        v: &[f32],
        v0: &[f32],
        cfg: &SparseConfig,
    ) -> (f64, Vec<f32>, Vec<f32>) {
        let device = Device::flex().autodiff();
        let trainer = Trainer::new(spec.clone()).unwrap();
        let layout = trainer.groups();
        let net = convert::build(spec, ws, &device).unwrap();
        let anchor = convert::build(spec, w, &device)
            .unwrap()
            .no_grad()
            .group_units();
        let prior = Prior::new(
            &layout.gate_logits(w, v0, cfg.temperature).unwrap(),
            layout,
            &device,
        );
        let vt: Vec<Tensor<1>> = trainer
            .per_layer(v, &device)
            .into_iter()
            .map(Tensor::require_grad)
            .collect();
        let units = net.group_units();
        let sizes: Vec<usize> = layout.layers().iter().map(|g| g.size()).collect();
        let logits = client_logits(&units, &vt, cfg.temperature);
        let pen = penalty(&logits, &units, Some(&anchor), &prior, &sizes, cfg).unwrap();
        let value = f64::from(pen.clone().into_scalar::<f32>());
        let mut grads = pen.backward();
        let gv = vt
            .iter()
            .flat_map(|t| values(t.grad_remove(&mut grads).unwrap()).unwrap())
            .collect();
        let grads = GradientsParams::from_grads(grads, &net);
        let Net::Mlp(m) = &net else { unreachable!() };
        let layer = &m.layers[0];
        let [inp, out] = layer.weight.val().dims();
        let gw = match grads.get::<2>(layer.weight.id) {
            // burn's [in, out] back to [out, in].
            Some(g) => values(g.transpose().reshape([inp * out])).unwrap(),
            None => vec![0.0; inp * out],
        };
        (value, gv, gw)
    }

    #[test]
    fn penalty_gradients_reach_thresholds_only_through_pi() {
        let spec = ModelSpec::mlp(3, &[4], 2);
        let w = init_params(&spec, Init::Default, 1);
        let mut ws = w.clone();
        let noise = Uniform::new(-0.1f32, 0.1).unwrap();
        let mut rng = StdRng::seed_from_u64(2);
        ws.iter_mut()
            .for_each(|(_, t)| t.data.iter_mut().for_each(|v| *v += noise.sample(&mut rng)));
        // A temperature at which finite differences are accurate, thresholds near the norms
        // so that every pi is away from 0 and 1.
        let temperature = 0.05;
        let layout = GroupLayout::of_model(&spec);
        let v0 = layout.initial_thresholds(&w, 0.7, temperature).unwrap();
        let v = layout.initial_thresholds(&ws, 0.4, temperature).unwrap();
        let layer0 = &layout.layers()[0];
        for cfg in [
            // L0 alone, the prior alone, everything with drift.
            SparseConfig {
                lambda0: 0.3,
                prior_scale: 0.0,
                drift: 0.0,
                temperature,
                ..SparseConfig::default()
            },
            SparseConfig {
                lambda0: 0.0,
                prior_scale: 0.7,
                drift: 0.0,
                temperature,
                ..SparseConfig::default()
            },
            SparseConfig {
                lambda0: 0.05,
                prior_scale: 0.2,
                drift: 3.0,
                temperature,
                ..SparseConfig::default()
            },
        ] {
            let (value, gv, gw) = burn_penalty(&spec, &ws, &w, &v, &v0, &cfg);
            let v64: Vec<f64> = v.iter().map(|&x| f64::from(x)).collect();
            let reference = reference_penalty(&spec, &ws, &w, &v64, &v0, &cfg);
            assert!(
                (value - reference).abs() < 1e-4 * reference.abs().max(1.0),
                "{value} vs {reference}"
            );
            let mut largest = 0f64;
            for u in 0..layer0.units {
                let eps = 1e-5;
                let (mut plus, mut minus) = (v64.clone(), v64.clone());
                plus[u] += eps;
                minus[u] -= eps;
                let fd = (reference_penalty(&spec, &ws, &w, &plus, &v0, &cfg)
                    - reference_penalty(&spec, &ws, &w, &minus, &v0, &cfg))
                    / (2.0 * eps);
                let got = f64::from(gv[u]);
                assert!(
                    (got - fd).abs() < 1e-3 * fd.abs().max(1e-2),
                    "{cfg:?} v[{u}]: burn {got} vs fd {fd}"
                );
                largest = largest.max(fd.abs());
            }
            assert!(
                largest > 1e-2,
                "{cfg:?}: the penalty does not move the thresholds"
            );
            // The weights see only the drift, with pi held constant: drift * pi * (ws - w).
            let pi = layout.gate_probabilities(&ws, &v, temperature).unwrap();
            let (a, b) = (
                &ws.get(&layer0.weight).unwrap().data,
                &w.get(&layer0.weight).unwrap().data,
            );
            for (i, g) in gw.iter().enumerate() {
                let want = cfg.drift * pi[i / layer0.fan_in] * f64::from(a[i] - b[i]);
                assert!(
                    (f64::from(*g) - want).abs() < 1e-5,
                    "{cfg:?} w[{i}]: {g} vs {want}"
                );
            }
        }
    }
}
