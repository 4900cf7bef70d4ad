//! NGM inference (Algorithm 2): gradient-based, or message passing, batched over rows.

use burn::optim::{AdamConfig, Optimizer};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor};
use fedfuse_core::Params;
use serde::{Deserialize, Serialize};

use super::fit::{LossLayout, row_loss, tensor2, values};
use fedfuse_core::BlockKind;

use super::{CategoricalLoss, Ngm};
use crate::net::Net;
use crate::{Result, TrainError, convert};

/// Which inference procedure of Algorithm 2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InferMethod {
    /// Optimise the unknown inputs with Adam so that the model reconstructs the *known*
    /// coordinates; the answer is the optimised input (the paper's main procedure). Note that
    /// this inverts the learned regressions: with `x1, x2` known in a chain `x1 - x2 - x3`, it
    /// picks `x3` with `f_2(x1, x3) = x2`, which is not `E[x3 | x1, x2]`.
    #[default]
    Gradient,
    /// Iterate `x_u <- f(x)_u` with the knowns clamped until the squared change of every row
    /// is at most `eps` (the paper's alternative). For a Gaussian model its fixed point is the
    /// conditional mean of the unknowns.
    MessagePassing,
}

/// Settings of inference; defaults are the reference code's (Adam lr 1e-3, 1000 iterations,
/// stop when the loss is below 1e-6).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InferConfig {
    /// Gradient-based or message passing.
    pub method: InferMethod,
    /// Adam learning rate on the unknown inputs (gradient-based only).
    pub lr: f64,
    /// Iteration cap.
    pub max_itr: usize,
    /// Stop when every row's loss (gradient-based) or squared change (message passing) is
    /// below this.
    pub eps: f64,
}

impl Default for InferConfig {
    fn default() -> Self {
        Self {
            method: InferMethod::Gradient,
            lr: 1e-3,
            max_itr: 1000,
            eps: 1e-6,
        }
    }
}

impl InferConfig {
    /// Checks every setting once.
    pub fn check(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(TrainError::InvalidConfig {
                field: "infer.lr",
                reason: format!("{} is not a positive number", self.lr),
            });
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(TrainError::InvalidConfig {
                field: "infer.eps",
                reason: format!("{} is not >= 0", self.eps),
            });
        }
        Ok(())
    }
}

/// Which units are evidence.
#[derive(Clone, Copy, Debug)]
pub enum Known<'a> {
    /// The same `U` flags for every row.
    Units(&'a [bool]),
    /// Row-major `n x U` flags, one set per row.
    PerRow(&'a [bool]),
}

/// The outcome of inference.
#[derive(Clone, Debug)]
pub struct Inference {
    /// `n x U` completed rows: known entries exactly as given, unknown real units inferred,
    /// unknown categorical blocks as probability vectors.
    pub x: Vec<f32>,
    /// Per row: the loss on the known coordinates at the returned point.
    pub loss: Vec<f32>,
    /// Iterations run.
    pub iterations: usize,
}

/// Column segments of the input: runs of real units, and categorical blocks.
fn segments(ngm: &Ngm) -> Vec<(usize, usize, bool)> {
    let mut segs: Vec<(usize, usize, bool)> = Vec::new();
    for b in ngm.blocks() {
        let cat = b.kind == BlockKind::Categorical;
        match segs.last_mut() {
            Some((_, len, false)) if !cat => *len += b.len,
            _ => segs.push((b.start, b.len, cat)),
        }
    }
    segs
}

/// Free variables to inputs: real units as they are, categorical blocks through a softmax,
/// so that an inferred categorical input always is a probability vector.
fn assemble(v: Tensor<2>, segs: &[(usize, usize, bool)]) -> Tensor<2> {
    if segs.iter().all(|s| !s.2) {
        return v;
    }
    let pieces = segs
        .iter()
        .map(|&(start, len, cat)| {
            let p = v.clone().narrow(1, start, len);
            if cat { softmax(p, 1) } else { p }
        })
        .collect();
    Tensor::cat(pieces, 1)
}

/// Outputs read as inputs for message passing: probabilities on categorical blocks (softmax
/// under cross-entropy; clipped at 0 and normalised under squared error).
fn outputs_as_inputs(
    out: Tensor<2>,
    segs: &[(usize, usize, bool)],
    loss: CategoricalLoss,
) -> Tensor<2> {
    if segs.iter().all(|s| !s.2) {
        return out;
    }
    let pieces = segs
        .iter()
        .map(|&(start, len, cat)| {
            let p = out.clone().narrow(1, start, len);
            match (cat, loss) {
                (false, _) => p,
                (true, CategoricalLoss::CrossEntropy) => softmax(p, 1),
                (true, CategoricalLoss::Mse) => {
                    let p = p.clamp_min(0.0).add_scalar(1e-6);
                    p.clone() / p.sum_dim(1)
                }
            }
        })
        .collect();
    Tensor::cat(pieces, 1)
}

impl Ngm {
    /// Completes the rows of `x` (`n x U`; unknown entries are ignored and may be NaN) given
    /// which units are `known`, starting the unknowns at `means` (length `U`, normalised
    /// space; for a categorical block its category frequencies). Weights stay frozen. All rows
    /// form one batch; the loss is a sum of per-row losses, so rows do not interact, and each
    /// row keeps its own best iterate.
    ///
    /// Gradient-based: unknown real units are free; an unknown categorical block is
    /// parametrised as the softmax of free logits (started at the log of its means), which
    /// keeps it on the probability simplex without a projection step. The loss is the
    /// training loss restricted to known coordinates. A categorical block must be wholly known
    /// or wholly unknown in each row.
    pub fn infer(
        &self,
        params: &Params,
        x: &[f32],
        known: Known<'_>,
        means: &[f32],
        cfg: &InferConfig,
    ) -> Result<Inference> {
        cfg.check()?;
        let u = self.units;
        if x.is_empty() {
            return Err(TrainError::EmptyData("x"));
        }
        if !x.len().is_multiple_of(u) {
            return Err(TrainError::DataMismatch(format!(
                "x has {} values, not a whole number of rows of {u} units",
                x.len()
            )));
        }
        let n = x.len() / u;
        let known: Vec<bool> = match known {
            Known::Units(k) if k.len() == u => k.iter().copied().cycle().take(n * u).collect(),
            Known::PerRow(k) if k.len() == n * u => k.to_vec(),
            Known::Units(k) | Known::PerRow(k) => {
                return Err(TrainError::DataMismatch(format!(
                    "the known-mask has {} flags; give {u} (one per unit) as `Known::Units` \
                     or {} (n x U) as `Known::PerRow`",
                    k.len(),
                    n * u
                )));
            }
        };
        if means.len() != u {
            return Err(TrainError::DataMismatch(format!(
                "{} means for {u} units; use `Marginals::means`",
                means.len()
            )));
        }
        if let Some(k) = means.iter().position(|m| !m.is_finite()) {
            return Err(TrainError::NonFinite {
                what: "means",
                row: 0,
                unit: k,
            });
        }
        if let Some(k) = (0..n * u).find(|&k| known[k] && !x[k].is_finite()) {
            return Err(TrainError::NonFinite {
                what: "x (known entries)",
                row: k / u,
                unit: k % u,
            });
        }
        for b in self
            .blocks()
            .iter()
            .filter(|b| b.kind == BlockKind::Categorical)
        {
            for r in 0..n {
                let row = &known[r * u..(r + 1) * u];
                if row[b.range()].iter().any(|&k| k != row[b.start]) {
                    return Err(TrainError::DataMismatch(format!(
                        "row {r}: categorical feature `{}` is partly known; mark all its \
                         units known or all unknown",
                        b.name
                    )));
                }
            }
        }
        let spec = self.spec_of(params)?;
        let plain = Device::flex();
        let net = convert::build(&spec, params, &plain)?;
        let layout = self.loss_layout();
        let segs = segments(self);
        let x0: Vec<f32> = x
            .iter()
            .zip(&known)
            .map(|(&v, &k)| if k { v } else { 0.0 })
            .collect();
        let known_f: Vec<f32> = known.iter().map(|&k| f32::from(u8::from(k))).collect();
        // Free variables: means for reals, log-frequencies for categorical logits.
        let mut init_row = means.to_vec();
        for b in self
            .blocks()
            .iter()
            .filter(|b| b.kind == BlockKind::Categorical)
        {
            init_row[b.range()]
                .iter_mut()
                .for_each(|v| *v = v.max(1e-6).ln());
        }
        let v0: Vec<f32> = init_row.iter().copied().cycle().take(n * u).collect();
        let (best, loss, iterations) = match cfg.method {
            InferMethod::Gradient => {
                gradient(&net, &layout, &segs, [n, u], (x0, known_f, v0), cfg)?
            }
            InferMethod::MessagePassing => message_passing(
                &net,
                &layout,
                &segs,
                self.categorical_loss(),
                [n, u],
                (x0, known_f, v0),
                cfg,
            )?,
        };
        // Known entries exactly as given.
        let x_out = best
            .iter()
            .zip(x.iter().zip(&known))
            .map(|(&b, (&v, &k))| if k { v } else { b })
            .collect();
        Ok(Inference {
            x: x_out,
            loss,
            iterations,
        })
    }
}

type Problem = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Gradient-based inference; returns the best inputs, their per-row losses and the iterations.
fn gradient(
    net: &Net,
    layout: &LossLayout,
    segs: &[(usize, usize, bool)],
    [n, u]: [usize; 2],
    (x0, known_f, v0): Problem,
    cfg: &InferConfig,
) -> Result<(Vec<f32>, Vec<f32>, usize)> {
    let plain = Device::flex();
    let ad = plain.clone().autodiff();
    let x0 = tensor2(x0, [n, u], &ad);
    let known = tensor2(known_f, [n, u], &ad);
    let unknown = known.clone().neg().add_scalar(1.0);
    let sq_w = known.clone() * tensor2(layout.sq_units.clone(), [1, u], &ad);
    let adam = AdamConfig::new()
        .with_beta_1(0.9)
        .with_beta_2(0.999)
        .with_epsilon(1e-8)
        .build();
    let mut state = None;
    let mut v = tensor2(v0, [n, u], &ad).require_grad();
    let mut best_x = tensor2(vec![0.0; n * u], [n, u], &plain);
    let mut best_loss = tensor2(vec![f32::MAX; n], [n, 1], &plain);
    let mut iterations = 0;
    for it in 0..=cfg.max_itr {
        let xin = x0.clone() * known.clone() + assemble(v.clone(), segs) * unknown.clone();
        let rl = row_loss(
            net.forward(xin.clone()),
            x0.clone(),
            layout,
            sq_w.clone(),
            Some(&known),
        );
        let rl_plain = rl.clone().inner();
        let improved: Tensor<2, Bool> = rl_plain.clone().lower(best_loss.clone());
        best_loss = best_loss.mask_where(improved.clone(), rl_plain);
        best_x = best_x.mask_where(improved.expand([n, u]), xin.inner());
        iterations = it;
        let worst = f64::from(best_loss.clone().max().into_scalar::<f32>());
        if it == cfg.max_itr || worst < cfg.eps || !worst.is_finite() {
            break;
        }
        let grads = rl.sum().backward();
        let Some(g) = v.grad(&grads) else {
            break;
        };
        let (next, s) = adam.step(cfg.lr, v.inner(), g, state);
        state = s;
        v = next.autodiff().require_grad();
    }
    Ok((values(best_x)?, values(best_loss)?, iterations))
}

/// Message passing; returns the final inputs, their per-row known-coordinate losses and the
/// iterations.
fn message_passing(
    net: &Net,
    layout: &LossLayout,
    segs: &[(usize, usize, bool)],
    loss: CategoricalLoss,
    [n, u]: [usize; 2],
    (x0, known_f, v0): Problem,
    cfg: &InferConfig,
) -> Result<(Vec<f32>, Vec<f32>, usize)> {
    let plain = Device::flex();
    let x0 = tensor2(x0, [n, u], &plain);
    let known = tensor2(known_f, [n, u], &plain);
    let unknown = known.clone().neg().add_scalar(1.0);
    let mut x =
        x0.clone() * known.clone() + assemble(tensor2(v0, [n, u], &plain), segs) * unknown.clone();
    let mut iterations = 0;
    for it in 1..=cfg.max_itr {
        let out = outputs_as_inputs(net.forward(x.clone()), segs, loss);
        let next = x0.clone() * known.clone() + out * unknown.clone();
        let change = (next.clone() - x).square().sum_dim(1).max();
        x = next;
        iterations = it;
        let change = f64::from(change.into_scalar::<f32>());
        if change <= cfg.eps || !change.is_finite() {
            break;
        }
    }
    let sq_w = known.clone() * tensor2(layout.sq_units.clone(), [1, u], &plain);
    let rl = row_loss(net.forward(x.clone()), x0, layout, sq_w, Some(&known));
    Ok((values(x)?, values(rl)?, iterations))
}

impl Ngm {
    /// For every feature, the model's conditional mean of it given all the others, on each
    /// row of `x` (`n x U`): message passing (`cfg`) with that feature's block unknown and
    /// started at `means`. For a model whose outputs never read their own feature (an NGM that
    /// respects its graph) this is [`predict`](Self::predict); for one that lets a feature
    /// leak into its own output (an NGR at small `lambda`) it removes the leak, which is what
    /// distillation targets of FedNGR need.
    pub fn conditional_predictions(
        &self,
        params: &Params,
        x: &[f32],
        means: &[f32],
        cfg: &InferConfig,
    ) -> Result<Vec<f32>> {
        let u = self.units;
        let mut out = vec![0.0f32; x.len()];
        for b in &self.blocks {
            let mut known = vec![true; u];
            known[b.range()].iter_mut().for_each(|k| *k = false);
            let inf = self.infer(params, x, Known::Units(&known), means, cfg)?;
            for (o, i) in out.chunks_exact_mut(u).zip(inf.x.chunks_exact(u)) {
                o[b.range()].copy_from_slice(&i[b.range()]);
            }
        }
        Ok(out)
    }
}
