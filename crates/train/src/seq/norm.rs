//! Normalisation layers of a layer list: batch, group and layer norm, and batch norm's
//! running statistics.
//!
//! Batch norm computes its batch statistics with plain tensor operations (or the fused kernel
//! of `batch_norm.rs`), so that the running statistics follow PyTorch exactly: the running
//! variance takes the unbiased batch variance, and `num_batches_tracked` counts training
//! forward passes. The running statistics are not module parameters (nothing differentiates
//! them): they live beside the module, shared by its copies, and the conversion back to
//! `Params` (`crate::convert`) writes them out.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::module::{Module, Param};
use burn::tensor::{Tensor, TensorData};

use super::act::{Act, Mode};
use super::batch_norm;

/// Running statistics of one batch norm, and its count of training batches.
#[derive(Clone, Debug)]
pub(crate) struct RunningStats {
    pub(crate) mean: Vec<f32>,
    pub(crate) var: Vec<f32>,
    pub(crate) batches: f32,
    /// Whether the statistics are re-estimated from scratch: every batch then weighs the
    /// same (`momentum = 1 / batches`, PyTorch's `momentum=None`), not the norm's momentum.
    pub(crate) cumulative: bool,
}

impl RunningStats {
    /// Zero means, unit variances, no batch seen, averaged cumulatively from now on: what
    /// PyTorch's `reset_running_stats()` with `momentum=None` starts from.
    pub(crate) fn restart(&mut self) {
        self.mean.iter_mut().for_each(|m| *m = 0.0);
        self.var.iter_mut().for_each(|v| *v = 1.0);
        self.batches = 0.0;
        self.cumulative = true;
    }
}

/// The running statistics of a network's batch norms, in forward order.
pub(crate) type SharedStats = Arc<Mutex<Vec<RunningStats>>>;

pub(crate) fn lock(stats: &SharedStats) -> MutexGuard<'_, Vec<RunningStats>> {
    // A panic elsewhere cannot leave the statistics half-written: each update is one store.
    stats.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A normalisation layer's kind and settings.
#[derive(Clone, Copy, Debug)]
pub(crate) enum NormKind {
    /// Batch norm; `slot` is its place among the network's running statistics.
    Batch {
        eps: f64,
        momentum: f64,
        slot: usize,
    },
    Group {
        groups: usize,
        eps: f64,
    },
    /// Over every axis of a sample; the scale and shift are flattened.
    Layer {
        eps: f64,
    },
}

/// An affine normalisation.
#[derive(Module, Debug)]
pub(crate) struct Norm {
    pub(crate) weight: Param<Tensor<1>>,
    pub(crate) bias: Param<Tensor<1>>,
    #[module(skip)]
    pub(crate) kind: NormKind,
}

/// `x - mean` and the (biased) variance over axes 0 and 2 of `[n, c, m]`: per channel.
fn centre(x: Tensor<3>) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
    let mean = x.clone().mean_dim(2).mean_dim(0);
    let centred = x - mean.clone();
    let var = centred.clone().square().mean_dim(2).mean_dim(0);
    (centred, mean, var)
}

impl Norm {
    pub(crate) fn forward(&self, x: Act, mode: Mode, stats: &SharedStats) -> Act {
        let w = self.weight.val();
        let b = self.bias.val();
        let [c] = w.dims();
        match self.kind {
            NormKind::Batch {
                eps,
                momentum,
                slot,
            } => {
                // [n, c, h*w] (or [n, c, 1] for flat features).
                let (x3, dims) = match x {
                    Act::Img(x) => {
                        let d = x.dims();
                        (x.reshape([d[0], d[1], d[2] * d[3]]), Some(d))
                    }
                    // A checked spec puts no batch norm on tokens.
                    x => {
                        let x = x.flat();
                        let [n, c] = x.dims();
                        (x.reshape([n, c, 1]), None)
                    }
                };
                let [n, _, hw] = x3.dims();
                // Scale and shift per channel first, so the full-size work is one centring
                // and one multiply-add: each full pass costs as much as the reductions.
                let y = match mode {
                    Mode::Train => match batch_norm::train(&x3, &w, &b, eps) {
                        Some(out) => {
                            update_stats(stats, slot, &out.mean, &out.var, n * hw, momentum);
                            out.y
                        }
                        None => {
                            let (centred, mean, var) = centre(x3);
                            let (m, v) = (values_of(&mean), values_of(&var));
                            update_stats(stats, slot, &m, &v, n * hw, momentum);
                            let scale = var.add_scalar(eps).sqrt().recip() * w.reshape([1, c, 1]);
                            centred * scale + b.reshape([1, c, 1])
                        }
                    },
                    Mode::Eval => {
                        let s = lock(stats);
                        let device = w.device();
                        let (m, v) = match s.get(slot) {
                            Some(r) => (r.mean.clone(), r.var.clone()),
                            None => (vec![0.0; c], vec![1.0; c]),
                        };
                        drop(s);
                        let mean: Tensor<3> =
                            Tensor::from_data(TensorData::new(m, [1, c, 1]), &device);
                        let var: Tensor<3> =
                            Tensor::from_data(TensorData::new(v, [1, c, 1]), &device);
                        let scale = var.add_scalar(eps).sqrt().recip() * w.reshape([1, c, 1]);
                        let shift = b.reshape([1, c, 1]) - mean * scale.clone();
                        x3 * scale + shift
                    }
                };
                match dims {
                    Some(d) => Act::Img(y.reshape(d)),
                    None => Act::Flat(y.reshape([n, c])),
                }
            }
            NormKind::Group { groups, eps } => {
                let x = x.img();
                let d = x.dims();
                let x3 = x.reshape([d[0], groups, d[1] / groups * d[2] * d[3]]);
                let centred = x3.clone() - x3.mean_dim(2);
                let var = centred.clone().square().mean_dim(2);
                let y = (centred * var.add_scalar(eps).sqrt().recip()).reshape(d);
                Act::Img(y * w.reshape([1, c, 1, 1]) + b.reshape([1, c, 1, 1]))
            }
            NormKind::Layer { eps } => {
                let norm = |x2: Tensor<2>| {
                    let centred = x2.clone() - x2.mean_dim(1);
                    let var = centred.clone().square().mean_dim(1);
                    centred * var.add_scalar(eps).sqrt().recip() * w.reshape([1, c])
                        + b.reshape([1, c])
                };
                match x {
                    Act::Img(x) => {
                        let d = x.dims();
                        Act::Img(norm(x.flatten(1, 3)).reshape(d))
                    }
                    Act::Flat(x) => Act::Flat(norm(x)),
                    Act::Tokens(x) => {
                        let d = x.dims();
                        Act::Tokens(norm(x.flatten(1, 2)).reshape(d))
                    }
                }
            }
        }
    }
}

/// A per-channel statistic's values, converted from whatever float type the backend keeps
/// (burn-flex keeps `f32`), so that no statistic is lost to a failed conversion.
fn values_of(t: &Tensor<3>) -> Vec<f32> {
    t.clone().into_data().iter::<f32>().collect()
}

/// PyTorch's update: `running = (1 - momentum) running + momentum batch`, the variance
/// unbiased (`n / (n - 1)` of the batch's; a single value per channel gives 0), one more
/// batch tracked.
fn update_stats(stats: &SharedStats, slot: usize, m: &[f32], v: &[f32], n: usize, momentum: f64) {
    let unbiased = if n > 1 {
        n as f64 / (n - 1) as f64
    } else {
        0.0
    };
    let mut s = lock(stats);
    if let Some(r) = s.get_mut(slot) {
        let momentum = match r.cumulative {
            true => 1.0 / (f64::from(r.batches) + 1.0),
            false => momentum,
        };
        let blend = |old: &mut f32, new: f64| {
            *old = ((1.0 - momentum) * f64::from(*old) + momentum * new) as f32;
        };
        r.mean
            .iter_mut()
            .zip(m)
            .for_each(|(o, &x)| blend(o, f64::from(x)));
        r.var
            .iter_mut()
            .zip(v)
            .for_each(|(o, &x)| blend(o, f64::from(x) * unbiased));
        r.batches += 1.0;
    }
}
