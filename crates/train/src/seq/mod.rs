//! Layer-list networks ([`ModelSpec::Sequential`](fedfuse_core::ModelSpec)) as a burn
//! module: the layer types, the forward pass, and the views of their parameters that
//! training needs (flattened, by id, by gated group). Moving values between a network and
//! `Params` is `crate::convert`'s; each layer kind's kernel is a module of its own.

use burn::module::{Module, ParamId};
use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::nn::pool::{AvgPool2d, MaxPool2d};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};

#[macro_use]
pub(crate) mod kernels;

mod act;
mod affine;
mod attention;
mod batch_norm;
pub(crate) mod conv;
mod gelu;
mod layer_norm;
mod linear;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod sgd;
pub(crate) mod vit;
mod winograd;

use act::Act;
pub(crate) use act::Mode;
use norm::{Norm, SharedStats};

/// A layer without parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    GlobalAvg,
    Relu,
    Dropout {
        p: f64,
    },
    Flatten,
    /// Token 0 of a transformer's tokens.
    ClassToken,
}

/// A parameter-free layer.
#[derive(Module, Debug)]
pub(crate) struct Op {
    #[module(skip)]
    pub(crate) kind: OpKind,
}

/// A residual block (basic or bottleneck): its main path's convolutions, each with its norm.
#[derive(Module, Debug)]
pub(crate) struct Block {
    pub(crate) convs: Vec<Conv2d>,
    pub(crate) norms: Vec<Option<Norm>>,
    pub(crate) shortcut: Option<Conv2d>,
    pub(crate) shortcut_norm: Option<Norm>,
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
    Tokens(vit::Tokens),
    Encoder(vit::Encoder),
    Op(Op),
}

/// A layer-list network.
#[derive(Module, Debug)]
pub(crate) struct SeqNet {
    pub(crate) layers: Vec<Layer>,
    /// Shape of one sample.
    #[module(skip)]
    pub(crate) input: Vec<usize>,
    /// Per layer, the gate slot that multiplies its output (for a block: the first of its
    /// inner convolutions' slots, which follow one another).
    #[module(skip)]
    pub(crate) gate_at: Vec<Option<usize>>,
    /// Per gate slot, the layer whose filters or units it gates, and for a block which of its
    /// inner convolutions (0 otherwise).
    #[module(skip)]
    pub(crate) gate_src: Vec<(usize, usize)>,
    /// Values per sample entering each layer.
    #[module(skip)]
    pub(crate) widths_in: Vec<usize>,
    #[module(skip)]
    pub(crate) stats: SharedStats,
}

impl Block {
    /// `gates` (when given) multiply the inner channels after each inner convolution's norm,
    /// one per inner convolution.
    fn forward(
        &self,
        x: Tensor<4>,
        gates: Option<&[Tensor<1>]>,
        mode: Mode,
        s: &SharedStats,
    ) -> Tensor<4> {
        let norm = |n: &Option<Norm>, y: Tensor<4>| match n {
            Some(n) => n.forward(Act::Img(y), mode, s).img(),
            None => y,
        };
        let last = self.convs.len() - 1;
        let mut y = x.clone();
        for (k, (c, n)) in self.convs.iter().zip(&self.norms).enumerate() {
            y = norm(n, conv::forward(c, y));
            if k < last {
                let mut a = Act::Img(y);
                if let Some(g) = gates.and_then(|g| g.get(k)) {
                    a = a.scale(g);
                }
                y = relu(a.img());
            }
        }
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
                Layer::Block(block) => {
                    let own = self.gate_at[i].and_then(|slot| gates.get(slot..));
                    Act::Img(block.forward(a.img(), own, mode, &self.stats))
                }
                Layer::Tokens(t) => {
                    let own = drop.get(next_drop..).unwrap_or_default();
                    let mut masks = vit::Masks::new(own);
                    let y = t.forward(a.img(), &mut masks);
                    next_drop += masks.taken(own);
                    Act::Tokens(y)
                }
                Layer::Encoder(e) => {
                    let own = drop.get(next_drop..).unwrap_or_default();
                    let mut masks = vit::Masks::new(own);
                    let gates = self.gate_at[i].and_then(|slot| gates.get(slot..));
                    let y = e.forward(a.tokens(), &mut masks, gates);
                    next_drop += masks.taken(own);
                    Act::Tokens(y)
                }
                Layer::Op(op) => match op.kind {
                    OpKind::Relu => match a {
                        Act::Img(x) => Act::Img(relu(x)),
                        Act::Flat(x) => Act::Flat(relu(x)),
                        Act::Tokens(x) => Act::Tokens(relu(x)),
                    },
                    OpKind::ClassToken => Act::Flat(vit::class_token(a.tokens())),
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
                            (Some(m), Act::Tokens(x)) => {
                                let d = x.dims();
                                Act::Tokens((x.flatten(1, 2) * m.clone()).reshape(d))
                            }
                            (None, a) => a,
                        }
                    }
                    OpKind::Dropout { .. } => a,
                },
            };
            // A block's gates act inside it.
            if let (Some(g), false) = (gate, matches!(layer, Layer::Block(_) | Layer::Encoder(_))) {
                a = a.scale(g);
            }
        }
        a.flat()
    }

    /// Whether the network holds a batch norm (inside blocks too).
    pub(crate) fn has_batch_norm(&self) -> bool {
        !norm::lock(&self.stats).is_empty()
    }

    /// Restarts every batch norm's running statistics for a cumulative re-estimate
    /// ([`norm::RunningStats::restart`]).
    pub(crate) fn restart_stats(&self) {
        norm::lock(&self.stats)
            .iter_mut()
            .for_each(norm::RunningStats::restart);
    }

    /// `(values per sample, p)` of each dropout with `p > 0`, in the order the forward pass
    /// meets them: dropout layers, and the dropouts inside a transformer's layers.
    pub(crate) fn dropout_layers(&self) -> Vec<(usize, f64)> {
        self.layers
            .iter()
            .zip(&self.widths_in)
            .flat_map(|(layer, &width)| match layer {
                Layer::Op(Op {
                    kind: OpKind::Dropout { p },
                }) if *p > 0.0 => vec![(width, *p)],
                Layer::Tokens(t) => t.drop_sites(),
                Layer::Encoder(e) => {
                    let [hidden, _] = e.out_proj.weight.dims();
                    e.drop_sites(width / hidden.max(1))
                }
                _ => Vec::new(),
            })
            .collect()
    }
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
                    for (c, n) in b.convs.iter().zip(&b.norms) {
                        conv(f, c);
                        norm(f, n);
                    }
                    if let Some(c) = &b.shortcut {
                        conv(f, c);
                    }
                    norm(f, &b.shortcut_norm);
                }
                Layer::Tokens(t) => {
                    f(t.class_token.id, t.class_token.val());
                    conv(f, &t.conv_proj);
                    f(t.pos_embedding.id, t.pos_embedding.val().reshape([-1]));
                }
                Layer::Encoder(e) => {
                    let lin = |f: &mut dyn FnMut(ParamId, Tensor<1>), l: &Linear| {
                        f(l.weight.id, l.weight.val().reshape([-1]));
                        if let Some(b) = &l.bias {
                            f(b.id, b.val());
                        }
                    };
                    f(e.ln_1.weight.id, e.ln_1.weight.val());
                    f(e.ln_1.bias.id, e.ln_1.bias.val());
                    lin(f, &e.in_proj);
                    lin(f, &e.out_proj);
                    f(e.ln_2.weight.id, e.ln_2.weight.val());
                    f(e.ln_2.bias.id, e.ln_2.bias.val());
                    lin(f, &e.mlp_0);
                    lin(f, &e.mlp_3);
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
            .map(|&(i, k)| {
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
                    // A head's rows of q, k and v and their biases, as one row; no tensor
                    // holds one value per head.
                    Layer::Encoder(e) if k == 0 => {
                        let heads = e.heads;
                        let mut parts = vec![by_head(e.in_proj.weight.val().transpose(), heads)];
                        if let Some(b) = &e.in_proj.bias {
                            parts.push(by_head(b.val(), heads));
                        }
                        let device = parts[0].device();
                        return (Tensor::cat(parts, 1), Tensor::zeros([heads], &device));
                    }
                    Layer::Encoder(e) => {
                        if let Some(b) = &e.mlp_0.bias {
                            cols.push(b.val());
                        }
                        e.mlp_0.weight.val().transpose()
                    }
                    Layer::Block(b) => match (b.convs.get(k), b.norms.get(k)) {
                        (Some(c), Some(n)) => {
                            let w = conv_rows(c, &mut cols);
                            norm_after(n.as_ref(), &mut cols);
                            w
                        }
                        _ => Tensor::zeros([0, 0], &Device::flex()),
                    },
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

/// A packed q, k, v tensor (`[3 * hidden, ..]`, each section head by head) as one row per head:
/// `[heads, 3 * values per section per head]`.
fn by_head<const D: usize>(t: Tensor<D>, heads: usize) -> Tensor<2> {
    let per_head = t.shape().num_elements() / (3 * heads).max(1);
    t.reshape([3, heads, per_head])
        .swap_dims(0, 1)
        .reshape([heads, 3 * per_head])
}

#[cfg(test)]
mod tests;
