//! torchvision's Vision Transformer layers: the tokens layer (patch convolution, class token,
//! positional embedding) and the pre-norm encoder block (multi-head self-attention and an MLP,
//! each behind a per-token layer norm and added back). Written with burn's tensor operations,
//! so autodiff gives the backward pass; the four products run through [`super::linear`].

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::tensor::Tensor;
use burn::tensor::activation::softmax;

use super::gelu::gelu;
use super::{conv, linear};

/// `conv_proj`, `class_token` and `pos_embedding`: images to `[n, seq, hidden]` tokens.
#[derive(Module, Debug)]
pub(crate) struct Tokens {
    /// `[hidden]` (torchvision's `[1, 1, hidden]`).
    pub(crate) class_token: Param<Tensor<1>>,
    pub(crate) conv_proj: Conv2d,
    /// `[seq, hidden]` (torchvision's `[1, seq, hidden]`).
    pub(crate) pos_embedding: Param<Tensor<2>>,
    /// Dropout after the positional embedding.
    #[module(skip)]
    pub(crate) dropout: f64,
}

/// `x` times a per-sample inverted-dropout mask over all its values (`[n, values]`), or `x`
/// when there is none (evaluation, or p = 0).
fn masked<const D: usize>(x: Tensor<D>, mask: Option<&Tensor<2>>) -> Tensor<D> {
    match mask {
        Some(m) => {
            let dims = x.dims();
            let [n, values] = m.dims();
            (x.reshape([n, values]) * m.clone()).reshape(dims)
        }
        None => x,
    }
}

/// Hands out a layer's dropout masks in [`Tokens::drop_sites`] / [`Encoder::drop_sites`]
/// order: a site whose `p` is 0 has no mask.
pub(crate) struct Masks<'a> {
    masks: std::slice::Iter<'a, Tensor<2>>,
}

impl<'a> Masks<'a> {
    /// `masks` holds this layer's masks first; none at all means evaluation.
    pub(crate) fn new(masks: &'a [Tensor<2>]) -> Self {
        Self {
            masks: masks.iter(),
        }
    }

    fn next(&mut self, p: f64) -> Option<&'a Tensor<2>> {
        if p > 0.0 { self.masks.next() } else { None }
    }

    /// How many masks were taken.
    pub(crate) fn taken(&self, from: &[Tensor<2>]) -> usize {
        from.len() - self.masks.len()
    }
}

impl Tokens {
    /// `(values per sample, p)` of each dropout this layer applies in training.
    pub(crate) fn drop_sites(&self) -> Vec<(usize, f64)> {
        let [seq, hidden] = self.pos_embedding.dims();
        sites(&[(seq * hidden, self.dropout)])
    }

    pub(crate) fn forward(&self, x: Tensor<4>, masks: &mut Masks) -> Tensor<3> {
        let y = conv::forward(&self.conv_proj, x);
        let [n, hidden, gh, gw] = y.dims();
        // Patches in row-major order, as torchvision's reshape and permute lay them.
        let patches = y.reshape([n, hidden, gh * gw]).swap_dims(1, 2);
        let class = self
            .class_token
            .val()
            .reshape([1, 1, hidden])
            .repeat_dim(0, n);
        let tokens = Tensor::cat(vec![class, patches], 1);
        let [seq, _] = self.pos_embedding.dims();
        let x = tokens + self.pos_embedding.val().reshape([1, seq, hidden]);
        masked(x, masks.next(self.dropout))
    }
}

/// The sites with `p > 0`.
fn sites(all: &[(usize, f64)]) -> Vec<(usize, f64)> {
    all.iter().copied().filter(|&(_, p)| p > 0.0).collect()
}

/// A layer norm over each token's features.
#[derive(Module, Debug)]
pub(crate) struct TokenNorm {
    pub(crate) weight: Param<Tensor<1>>,
    pub(crate) bias: Param<Tensor<1>>,
    #[module(skip)]
    pub(crate) eps: f64,
}

impl TokenNorm {
    pub(crate) fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [n, seq, hidden] = x.dims();
        let rows = x.clone().reshape([n * seq, hidden]);
        let (w, b) = (self.weight.val(), self.bias.val());
        match super::layer_norm::forward(&rows, &w, &b, self.eps) {
            Some(y) => y.reshape([n, seq, hidden]),
            None => self.forward_burn(x),
        }
    }

    /// The same with burn's operations (other backends, and the custom op's reference).
    pub(crate) fn forward_burn(&self, x: Tensor<3>) -> Tensor<3> {
        let [_, _, hidden] = x.dims();
        let mean = x.clone().mean_dim(2);
        let centred = x - mean;
        let var = centred.clone().square().mean_dim(2);
        let scaled = centred * var.add_scalar(self.eps).sqrt().recip();
        scaled * self.weight.val().reshape([1, 1, hidden]) + self.bias.val().reshape([1, 1, hidden])
    }
}

/// torchvision's `EncoderBlock`: `x + out_proj(attention(ln_1(x)))`, then `y + mlp(ln_2(y))`.
/// The linear layers are burn's (`weight` `[in, out]`): `in_proj` packs q, k and v along its
/// outputs, in that order.
#[derive(Module, Debug)]
pub(crate) struct Encoder {
    pub(crate) ln_1: TokenNorm,
    pub(crate) in_proj: Linear,
    pub(crate) out_proj: Linear,
    pub(crate) ln_2: TokenNorm,
    pub(crate) mlp_0: Linear,
    pub(crate) mlp_3: Linear,
    #[module(skip)]
    pub(crate) heads: usize,
    /// After the attention and after each MLP linear (torchvision's `mlp.2`, `mlp.4`).
    #[module(skip)]
    pub(crate) dropout: f64,
    /// Of the attention weights.
    #[module(skip)]
    pub(crate) attention_dropout: f64,
}

/// `lin` on every token of `[n, seq, d]`.
fn per_token(lin: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [n, seq, d] = x.dims();
    let y = linear::forward(lin, x.reshape([n * seq, d]));
    let [_, out] = y.dims();
    y.reshape([n, seq, out])
}

impl Encoder {
    /// `(values per sample, p)` of each dropout this block applies in training to `seq`
    /// tokens, in the order the forward pass meets them: the attention weights, the
    /// attention's output, the MLP's hidden units, the MLP's output.
    pub(crate) fn drop_sites(&self, seq: usize) -> Vec<(usize, f64)> {
        let [hidden, _] = self.out_proj.weight.dims();
        let [_, mlp] = self.mlp_0.weight.dims();
        sites(&[
            (self.heads * seq * seq, self.attention_dropout),
            (seq * hidden, self.dropout),
            (seq * mlp, self.dropout),
            (seq * hidden, self.dropout),
        ])
    }

    /// `gates` (when given) are the block's two gate slots: `[heads]`, multiplying each head's
    /// output before `out_proj`, and `[mlp]`, multiplying each MLP unit after the GELU. A gate
    /// of 0 removes the head or unit, as zeroing its group of weights does.
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        masks: &mut Masks,
        gates: Option<&[Tensor<1>]>,
    ) -> Tensor<3> {
        let gate = |k: usize| gates.and_then(|g| g.get(k));
        let qkv = per_token(&self.in_proj, self.ln_1.forward(x.clone()));
        let mask = masks.next(self.attention_dropout);
        let mut attended = match super::attention::attend(&qkv, self.heads, mask) {
            Some(a) => a,
            None => self.attend_burn(qkv, mask),
        };
        if let Some(g) = gate(0) {
            // Head h's features are h * head_dim .. (h + 1) * head_dim.
            let [n, seq, hidden] = attended.dims();
            let heads = self.heads;
            attended = (attended.reshape([n, seq, heads, hidden / heads])
                * g.clone().reshape([1, 1, heads, 1]))
            .reshape([n, seq, hidden]);
        }
        let attention = per_token(&self.out_proj, attended);
        let y = x + masked(attention, masks.next(self.dropout));
        let mut hidden_units = gelu(per_token(&self.mlp_0, self.ln_2.forward(y.clone())));
        if let Some(g) = gate(1) {
            let [units] = g.dims();
            hidden_units = hidden_units * g.clone().reshape([1, 1, units]);
        }
        let hidden_units = masked(hidden_units, masks.next(self.dropout));
        let out = per_token(&self.mlp_3, hidden_units);
        y + masked(out, masks.next(self.dropout))
    }
}

impl Encoder {
    /// The attention of packed `qkv` (`[n, seq, 3 · hidden]`) with burn's operations (other
    /// backends, and the custom op's reference): `mask` multiplies the weights.
    pub(crate) fn attend_burn(&self, qkv: Tensor<3>, mask: Option<&Tensor<2>>) -> Tensor<3> {
        let [n, seq, packed] = qkv.dims();
        let hidden = packed / 3;
        let (heads, hd) = (self.heads, hidden / self.heads);
        // [n, seq, hidden] -> [n, heads, seq, head_dim]: head h holds features h*hd..(h+1)*hd.
        let split = |k: usize| {
            qkv.clone()
                .narrow(2, k * hidden, hidden)
                .reshape([n, seq, heads, hd])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let scores = q.matmul(k.swap_dims(2, 3)) / (hd as f64).sqrt();
        let weights = masked(softmax(scores, 3), mask);
        weights.matmul(v).swap_dims(1, 2).reshape([n, seq, hidden])
    }
}

/// Token 0 of `[n, seq, hidden]`: `[n, hidden]`.
pub(crate) fn class_token(x: Tensor<3>) -> Tensor<2> {
    let [n, _, hidden] = x.dims();
    x.narrow(1, 0, 1).reshape([n, hidden])
}
