//! Layer-list networks ([`ModelSpec::Sequential`]) as a burn module, and the moves of their
//! tensors in and out of [`Params`].
//!
//! Batch norm computes its batch statistics with plain tensor operations, so that the running
//! statistics follow PyTorch exactly: the running variance takes the unbiased batch variance,
//! and `num_batches_tracked` counts training forward passes. The running statistics are not
//! module parameters (nothing differentiates them): they live beside the module, shared by its
//! copies, and [`read`] writes them back.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::module::{Module, Param, ParamId};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use fedfuse_core::layers::{self, BlockNorm, LayerSpec};
use fedfuse_core::{ModelSpec, Params};

use crate::{Result, TrainError};

/// Defines `$name` to run `$body` (an `#[inline(always)]` function) compiled for the widest
/// vector unit of this machine: AVX-512F, AVX2 or the baseline. Only for loops whose
/// results do not depend on the width: element by element, or sums over lanes the code
/// itself fixes (Rust fuses no multiply-add on its own), so every copy gives the same bits.
macro_rules! widest {
    ($(#[$doc:meta])* fn $name:ident => $body:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: this CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: this CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

mod affine;
mod batch_norm;
pub(crate) mod conv;
mod linear;
pub(crate) mod pool;
mod winograd;

/// Running statistics of one batch norm, and its count of training batches.
#[derive(Clone, Debug)]
pub(crate) struct RunningStats {
    mean: Vec<f32>,
    var: Vec<f32>,
    batches: f32,
}

/// The running statistics of a network's batch norms, in forward order.
pub(crate) type SharedStats = Arc<Mutex<Vec<RunningStats>>>;

fn lock(stats: &SharedStats) -> MutexGuard<'_, Vec<RunningStats>> {
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
    weight: Param<Tensor<1>>,
    bias: Param<Tensor<1>>,
    #[module(skip)]
    kind: NormKind,
}

/// A layer without parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    GlobalAvg,
    Relu,
    Dropout { p: f64 },
    Flatten,
}

/// A parameter-free layer.
#[derive(Module, Debug)]
pub(crate) struct Op {
    #[module(skip)]
    kind: OpKind,
}

/// He et al.'s basic block.
#[derive(Module, Debug)]
pub(crate) struct Block {
    conv1: Conv2d,
    norm1: Option<Norm>,
    conv2: Conv2d,
    norm2: Option<Norm>,
    shortcut: Option<Conv2d>,
    shortcut_norm: Option<Norm>,
}

/// One entry of the list.
// burn's `Module` derive does not accept a boxed variant; a block is a few hundred bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub(crate) enum Layer {
    Conv(Conv2d),
    Linear(Linear),
    Norm(Norm),
    MaxPool(MaxPool2d),
    AvgPool(AvgPool2d),
    Block(Block),
    Op(Op),
}

/// A layer-list network.
#[derive(Module, Debug)]
pub(crate) struct SeqNet {
    layers: Vec<Layer>,
    /// Shape of one sample.
    #[module(skip)]
    input: Vec<usize>,
    /// Per layer, the gate slot that multiplies its output (for a block: its inner channels).
    #[module(skip)]
    gate_at: Vec<Option<usize>>,
    /// Per gate slot, the layer whose filters or units it gates.
    #[module(skip)]
    gate_src: Vec<usize>,
    /// Values per sample entering each layer.
    #[module(skip)]
    widths_in: Vec<usize>,
    #[module(skip)]
    stats: SharedStats,
}

/// Activations between layers.
enum Act {
    Img(Tensor<4>),
    Flat(Tensor<2>),
}

impl Act {
    fn flat(self) -> Tensor<2> {
        match self {
            Self::Img(x) => x.flatten(1, 3),
            Self::Flat(x) => x,
        }
    }

    fn img(self) -> Tensor<4> {
        match self {
            Self::Img(x) => x,
            // A checked spec never feeds flat features to an image layer.
            Self::Flat(x) => {
                let [b, d] = x.dims();
                x.reshape([b, d, 1, 1])
            }
        }
    }

    /// Multiplies channel (or unit) `u` by `g[u]`.
    fn scale(self, g: &Tensor<1>) -> Self {
        let [c] = g.dims();
        match self {
            Self::Img(x) => Self::Img(x * g.clone().reshape([1, c, 1, 1])),
            Self::Flat(x) => Self::Flat(x * g.clone().reshape([1, c])),
        }
    }
}

/// Whether a forward pass trains (batch statistics, dropout) or evaluates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Train,
    Eval,
}

/// `x - mean` and the (biased) variance over axes 0 and 2 of `[n, c, m]`: per channel.
fn centre(x: Tensor<3>) -> (Tensor<3>, Tensor<3>, Tensor<3>) {
    let mean = x.clone().mean_dim(2).mean_dim(0);
    let centred = x - mean.clone();
    let var = centred.clone().square().mean_dim(2).mean_dim(0);
    (centred, mean, var)
}

impl Norm {
    fn forward(&self, x: Act, mode: Mode, stats: &SharedStats) -> Act {
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
                    Act::Flat(x) => {
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
                let (x2, dims) = match x {
                    Act::Img(x) => {
                        let d = x.dims();
                        (x.flatten(1, 3), Some(d))
                    }
                    Act::Flat(x) => (x, None),
                };
                let centred = x2.clone() - x2.mean_dim(1);
                let var = centred.clone().square().mean_dim(1);
                let y = centred * var.add_scalar(eps).sqrt().recip() * w.reshape([1, c])
                    + b.reshape([1, c]);
                match dims {
                    Some(d) => Act::Img(y.reshape(d)),
                    None => Act::Flat(y),
                }
            }
        }
    }
}

/// A per-channel statistic's values.
fn values_of(t: &Tensor<3>) -> Vec<f32> {
    t.clone()
        .into_data()
        .try_into_vec::<f32>()
        .unwrap_or_default()
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

impl Block {
    fn forward(
        &self,
        x: Tensor<4>,
        gate: Option<&Tensor<1>>,
        mode: Mode,
        s: &SharedStats,
    ) -> Tensor<4> {
        let norm = |n: &Option<Norm>, y: Tensor<4>| match n {
            Some(n) => n.forward(Act::Img(y), mode, s).img(),
            None => y,
        };
        let mut y = Act::Img(norm(&self.norm1, conv::forward(&self.conv1, x.clone())));
        if let Some(g) = gate {
            y = y.scale(g);
        }
        let y = norm(&self.norm2, conv::forward(&self.conv2, relu(y.img())));
        let short = match &self.shortcut {
            Some(conv) => norm(&self.shortcut_norm, conv::forward(conv, x)),
            None => x,
        };
        relu(y + short)
    }
}

impl SeqNet {
    /// Logits of flattened samples `[batch, input_len]`: `gates[slot]` multiplies the outputs
    /// of the gated layers, `drop[k]` (`[batch, units]`) the values entering the k-th dropout
    /// layer with `p > 0`, in training only.
    pub(crate) fn forward(
        &self,
        x: Tensor<2>,
        gates: &[Tensor<1>],
        drop: &[Tensor<2>],
        mode: Mode,
    ) -> Tensor<2> {
        let [b, _] = x.dims();
        let mut a = match self.input[..] {
            [c, h, w] => Act::Img(x.reshape([b, c, h, w])),
            _ => Act::Flat(x),
        };
        let mut next_drop = 0;
        for (i, layer) in self.layers.iter().enumerate() {
            let gate = self.gate_at[i].and_then(|slot| gates.get(slot));
            a = match layer {
                Layer::Conv(conv) => Act::Img(conv::forward(conv, a.img())),
                Layer::Linear(lin) => Act::Flat(linear::forward(lin, a.flat())),
                Layer::Norm(n) => n.forward(a, mode, &self.stats),
                Layer::MaxPool(p) => Act::Img(pool::forward(p, a.img())),
                Layer::AvgPool(p) => Act::Img(p.forward(a.img())),
                Layer::Block(block) => Act::Img(block.forward(a.img(), gate, mode, &self.stats)),
                Layer::Op(op) => match op.kind {
                    OpKind::Relu => match a {
                        Act::Img(x) => Act::Img(relu(x)),
                        Act::Flat(x) => Act::Flat(relu(x)),
                    },
                    OpKind::Flatten => Act::Flat(a.flat()),
                    OpKind::GlobalAvg => {
                        let x = a.img();
                        let [n, c, h, w] = x.dims();
                        Act::Img(x.reshape([n, c, h * w]).mean_dim(2).reshape([n, c, 1, 1]))
                    }
                    OpKind::Dropout { p } if p > 0.0 && mode == Mode::Train => {
                        let mask = drop.get(next_drop);
                        next_drop += 1;
                        match (mask, a) {
                            (Some(m), Act::Img(x)) => {
                                let d = x.dims();
                                Act::Img((x.flatten(1, 3) * m.clone()).reshape(d))
                            }
                            (Some(m), Act::Flat(x)) => Act::Flat(x * m.clone()),
                            (None, a) => a,
                        }
                    }
                    OpKind::Dropout { .. } => a,
                },
            };
            if let (Some(g), false) = (gate, matches!(layer, Layer::Block(_))) {
                a = a.scale(g);
            }
        }
        a.flat()
    }

    /// `(values per sample, p)` of each dropout layer with `p > 0`, in order.
    pub(crate) fn dropout_layers(&self) -> Vec<(usize, f64)> {
        self.layers
            .iter()
            .zip(&self.widths_in)
            .filter_map(|(layer, &width)| match layer {
                Layer::Op(Op {
                    kind: OpKind::Dropout { p },
                }) if *p > 0.0 => Some((width, *p)),
                _ => None,
            })
            .collect()
    }
}

fn tensor<const D: usize>(data: Vec<f32>, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(data, shape), device)
}

fn param<const D: usize>(data: Vec<f32>, shape: [usize; D], device: &Device) -> Param<Tensor<D>> {
    Param::from_tensor(tensor(data, shape, device))
}

/// Takes a list's tensors in `state_dict` order.
struct Source<'a> {
    tensors: std::vec::IntoIter<&'a fedfuse_core::Tensor>,
    device: &'a Device,
    stats: Vec<RunningStats>,
}

impl Source<'_> {
    fn next(&mut self) -> Result<Vec<f32>> {
        // The layout was checked against the spec: the tensors are all there, in order.
        self.tensors
            .next()
            .map(|t| t.data.clone())
            .ok_or_else(|| TrainError::DataMismatch("a layer list ran out of tensors".into()))
    }

    fn conv(
        &mut self,
        c: [usize; 2],
        k: usize,
        stride: usize,
        pad: usize,
        groups: usize,
        bias: bool,
    ) -> Result<Conv2d> {
        let [c_in, c_out] = c;
        let mut layer = Conv2dConfig::new([c_in, c_out], [k, k])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
            .with_groups(groups)
            .with_bias(bias)
            .init(self.device);
        layer.weight = param(self.next()?, [c_out, c_in / groups, k, k], self.device);
        layer.bias = match bias {
            true => Some(param(self.next()?, [c_out], self.device)),
            false => None,
        };
        Ok(layer)
    }

    fn norm(&mut self, kind: NormKind, c: usize) -> Result<Norm> {
        let weight = param(self.next()?, [c], self.device);
        let bias = param(self.next()?, [c], self.device);
        let kind = match kind {
            NormKind::Batch { eps, momentum, .. } => {
                let mean = self.next()?;
                let var = self.next()?;
                let batches = self.next()?.first().copied().unwrap_or(0.0);
                self.stats.push(RunningStats { mean, var, batches });
                NormKind::Batch {
                    eps,
                    momentum,
                    slot: self.stats.len() - 1,
                }
            }
            other => other,
        };
        Ok(Norm { weight, bias, kind })
    }

    fn block_norm(&mut self, norm: BlockNorm, groups: usize, c: usize) -> Result<Option<Norm>> {
        let kind = match norm {
            BlockNorm::None => return Ok(None),
            BlockNorm::Batch => NormKind::Batch {
                eps: 1e-5,
                momentum: 0.1,
                slot: 0,
            },
            BlockNorm::Group => NormKind::Group { groups, eps: 1e-5 },
        };
        Ok(Some(self.norm(kind, c)?))
    }
}

/// The network of the layer list `spec` holding `params` (checked against its layout).
pub(crate) fn build(spec: &ModelSpec, params: &Params, device: &Device) -> Result<SeqNet> {
    let ModelSpec::Sequential { input, layers } = spec else {
        return Err(TrainError::DataMismatch(
            "not a layer list (model.kind = \"sequential\")".into(),
        ));
    };
    let layout = spec.param_shapes();
    params.check_layout(&layout)?;
    let (shapes, _) = layers::chain(fedfuse_core::FeatureShape::of(input)?, layers)?;
    let points = layers::gate_points(input, layers)?;
    let first = fedfuse_core::FeatureShape::of(input)?;
    let ins: Vec<_> = std::iter::once(first)
        .chain(shapes.iter().copied())
        .collect();
    let mut src = Source {
        tensors: params
            .iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .into_iter(),
        device,
        stats: Vec::new(),
    };
    let mut built = Vec::with_capacity(layers.len());
    for (layer, at) in layers.iter().zip(&ins) {
        let c = at.channels();
        let op = |kind| Layer::Op(Op { kind });
        built.push(match *layer {
            LayerSpec::Conv2d {
                out,
                kernel,
                stride,
                padding,
                groups,
                bias,
            } => Layer::Conv(src.conv([c, out], kernel, stride, padding, groups, bias)?),
            LayerSpec::Linear { out, bias } => {
                let inp = at.len();
                let w = crate::params::transpose(&src.next()?, out, inp);
                Layer::Linear(Linear {
                    weight: param(w, [inp, out], device),
                    bias: match bias {
                        true => Some(param(src.next()?, [out], device)),
                        false => None,
                    },
                })
            }
            LayerSpec::BatchNorm2d { eps, momentum } | LayerSpec::BatchNorm1d { eps, momentum } => {
                Layer::Norm(src.norm(
                    NormKind::Batch {
                        eps,
                        momentum,
                        slot: 0,
                    },
                    c,
                )?)
            }
            LayerSpec::GroupNorm { groups, eps } => {
                Layer::Norm(src.norm(NormKind::Group { groups, eps }, c)?)
            }
            LayerSpec::LayerNorm { eps } => {
                Layer::Norm(src.norm(NormKind::Layer { eps }, at.len())?)
            }
            LayerSpec::MaxPool2d { kernel, stride } => {
                let s = stride.unwrap_or(kernel);
                Layer::MaxPool(
                    MaxPool2dConfig::new([kernel, kernel])
                        .with_strides([s, s])
                        .init(),
                )
            }
            LayerSpec::AvgPool2d { kernel, stride } => {
                let s = stride.unwrap_or(kernel);
                Layer::AvgPool(
                    AvgPool2dConfig::new([kernel, kernel])
                        .with_strides([s, s])
                        .init(),
                )
            }
            LayerSpec::GlobalAvgpool => op(OpKind::GlobalAvg),
            LayerSpec::Relu => op(OpKind::Relu),
            LayerSpec::Dropout { p } => op(OpKind::Dropout { p }),
            LayerSpec::Flatten => op(OpKind::Flatten),
            LayerSpec::Residual {
                out,
                stride,
                norm,
                groups,
            } => {
                let bias = norm == BlockNorm::None;
                let conv1 = src.conv([c, out], 3, stride, 1, 1, bias)?;
                let norm1 = src.block_norm(norm, groups, out)?;
                let conv2 = src.conv([out, out], 3, 1, 1, 1, bias)?;
                let norm2 = src.block_norm(norm, groups, out)?;
                let (shortcut, shortcut_norm) = if layers::has_projection(c, out, stride) {
                    let conv = src.conv([c, out], 1, stride, 0, 1, bias)?;
                    (Some(conv), src.block_norm(norm, groups, out)?)
                } else {
                    (None, None)
                };
                Layer::Block(Block {
                    conv1,
                    norm1,
                    conv2,
                    norm2,
                    shortcut,
                    shortcut_norm,
                })
            }
        });
    }
    let mut gate_at = vec![None; layers.len()];
    let mut gate_src = Vec::with_capacity(points.len());
    for (slot, p) in points.iter().enumerate() {
        gate_at[p.layer] = Some(slot);
        let norm_follows = matches!(built.get(p.layer), Some(Layer::Norm(_)));
        gate_src.push(if norm_follows { p.layer - 1 } else { p.layer });
    }
    Ok(SeqNet {
        layers: built,
        input: input.clone(),
        gate_at,
        gate_src,
        widths_in: ins.iter().map(|s| s.len()).collect(),
        stats: Arc::new(Mutex::new(src.stats)),
    })
}

fn values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))
}

/// Collects a network's tensors in `state_dict` order.
struct Sink<'a> {
    out: Vec<Vec<f32>>,
    stats: &'a [RunningStats],
}

impl Sink<'_> {
    fn conv(&mut self, c: &Conv2d) -> Result<()> {
        self.out.push(values(c.weight.val())?);
        if let Some(b) = &c.bias {
            self.out.push(values(b.val())?);
        }
        Ok(())
    }

    fn norm(&mut self, n: &Norm) -> Result<()> {
        self.out.push(values(n.weight.val())?);
        self.out.push(values(n.bias.val())?);
        if let NormKind::Batch { slot, .. } = n.kind {
            let s = self.stats.get(slot).ok_or_else(|| {
                TrainError::Backend(format!("batch norm {slot} has no running statistics"))
            })?;
            self.out.push(s.mean.clone());
            self.out.push(s.var.clone());
            self.out.push(vec![s.batches]);
        }
        Ok(())
    }
}

/// The network's tensors in `state_dict` order and PyTorch layout, named by `spec`.
pub(crate) fn read(net: &SeqNet, spec: &ModelSpec) -> Result<Params> {
    let stats = lock(&net.stats).clone();
    let mut sink = Sink {
        out: Vec::new(),
        stats: &stats,
    };
    for layer in &net.layers {
        match layer {
            Layer::Conv(c) => sink.conv(c)?,
            Layer::Linear(l) => {
                let [inp, out] = l.weight.val().dims();
                sink.out
                    .push(crate::params::transpose(&values(l.weight.val())?, inp, out));
                if let Some(b) = &l.bias {
                    sink.out.push(values(b.val())?);
                }
            }
            Layer::Norm(n) => sink.norm(n)?,
            Layer::Block(b) => {
                sink.conv(&b.conv1)?;
                if let Some(n) = &b.norm1 {
                    sink.norm(n)?;
                }
                sink.conv(&b.conv2)?;
                if let Some(n) = &b.norm2 {
                    sink.norm(n)?;
                }
                if let Some(c) = &b.shortcut {
                    sink.conv(c)?;
                }
                if let Some(n) = &b.shortcut_norm {
                    sink.norm(n)?;
                }
            }
            Layer::MaxPool(_) | Layer::AvgPool(_) | Layer::Op(_) => {}
        }
    }
    let layout = spec.param_shapes();
    if layout.len() != sink.out.len() {
        return Err(TrainError::Backend(format!(
            "the network holds {} tensors where its spec lists {}",
            sink.out.len(),
            layout.len()
        )));
    }
    let mut params = Params::new();
    for (shape, data) in layout.into_iter().zip(sink.out) {
        params.push(shape.name, shape.shape, data)?;
    }
    Ok(params)
}

impl SeqNet {
    /// Every parameter (not the running statistics), flattened, in order.
    pub(crate) fn flat_params(&self) -> Vec<Tensor<1>> {
        let mut out = Vec::new();
        self.each_param(&mut |_, t| out.push(t));
        out
    }

    /// The ids of [`Self::flat_params`], in the same order: `state_dict` order without the
    /// buffers.
    pub(crate) fn param_ids(&self) -> Vec<ParamId> {
        let mut out = Vec::new();
        self.each_param(&mut |id, _| out.push(id));
        out
    }

    /// Calls `f` on every parameter (not the running statistics), flattened, in order.
    fn each_param(&self, f: &mut dyn FnMut(ParamId, Tensor<1>)) {
        let conv = |f: &mut dyn FnMut(ParamId, Tensor<1>), c: &Conv2d| {
            f(c.weight.id, c.weight.val().reshape([-1]));
            if let Some(b) = &c.bias {
                f(b.id, b.val());
            }
        };
        let norm = |f: &mut dyn FnMut(ParamId, Tensor<1>), n: &Option<Norm>| {
            if let Some(n) = n {
                f(n.weight.id, n.weight.val());
                f(n.bias.id, n.bias.val());
            }
        };
        for layer in &self.layers {
            match layer {
                Layer::Conv(c) => conv(f, c),
                Layer::Linear(l) => {
                    f(l.weight.id, l.weight.val().reshape([-1]));
                    if let Some(b) = &l.bias {
                        f(b.id, b.val());
                    }
                }
                Layer::Norm(n) => {
                    f(n.weight.id, n.weight.val());
                    f(n.bias.id, n.bias.val());
                }
                Layer::Block(b) => {
                    conv(f, &b.conv1);
                    norm(f, &b.norm1);
                    conv(f, &b.conv2);
                    norm(f, &b.norm2);
                    if let Some(c) = &b.shortcut {
                        conv(f, c);
                    }
                    norm(f, &b.shortcut_norm);
                }
                Layer::MaxPool(_) | Layer::AvgPool(_) | Layer::Op(_) => {}
            }
        }
    }

    /// Per gate slot: the weights `[units, fan_in]` with all but the last per-unit tensor as
    /// extra columns, and the last per-unit tensor (zeros when there is none), still tracked:
    /// the values of each group, as [`fedfuse_core::GroupLayout`] counts them.
    pub(crate) fn group_units(&self) -> Vec<(Tensor<2>, Tensor<1>)> {
        self.gate_src
            .iter()
            .map(|&i| {
                let norm_after = |n: Option<&Norm>, cols: &mut Vec<Tensor<1>>| {
                    if let Some(n) = n {
                        cols.push(n.weight.val());
                        cols.push(n.bias.val());
                    }
                };
                let next_norm = match self.layers.get(i + 1) {
                    Some(Layer::Norm(n))
                        if self.gate_at.get(i + 1).copied().flatten().is_some() =>
                    {
                        Some(n)
                    }
                    _ => None,
                };
                let conv_rows = |c: &Conv2d, cols: &mut Vec<Tensor<1>>| {
                    let [out, a, k1, k2] = c.weight.val().dims();
                    if let Some(b) = &c.bias {
                        cols.push(b.val());
                    }
                    c.weight.val().reshape([out, a * k1 * k2])
                };
                let mut cols = Vec::new();
                let w = match &self.layers[i] {
                    Layer::Conv(c) => {
                        let w = conv_rows(c, &mut cols);
                        norm_after(next_norm, &mut cols);
                        w
                    }
                    Layer::Linear(l) => {
                        if let Some(b) = &l.bias {
                            cols.push(b.val());
                        }
                        norm_after(next_norm, &mut cols);
                        l.weight.val().transpose()
                    }
                    Layer::Block(b) => {
                        let w = conv_rows(&b.conv1, &mut cols);
                        norm_after(b.norm1.as_ref(), &mut cols);
                        w
                    }
                    // Gate sources are convolutions, linear layers and blocks only.
                    _ => Tensor::zeros([0, 0], &Device::flex()),
                };
                let [units, _] = w.dims();
                let last = cols.pop();
                let mut parts = vec![w];
                parts.extend(cols.into_iter().map(|c| c.reshape([units, 1])));
                let b = last.unwrap_or_else(|| Tensor::zeros([units], &parts[0].device()));
                (Tensor::cat(parts, 1), b)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
