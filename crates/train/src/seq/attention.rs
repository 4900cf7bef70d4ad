//! Multi-head self-attention's core, `softmax(q kᵀ / sqrt(d)) v` per head, from the packed
//! `[n, seq, 3 · hidden]` output of `in_proj` (q, k, v in that order, head `h` on features
//! `h · d .. (h + 1) · d` of each), as a custom autodiff op on the Flex backend. With burn's
//! operations each head's q, k and v were copied out of the packed tensor and back, the
//! softmax was five tensors and the exponentials were scalar libm calls. Here each sample is
//! one task (rayon; the bits do not depend on the thread count), its heads' products read and
//! write the packed rows in place through strided matrices, and the softmax is one vectorised
//! loop per row. The attention dropout's mask (if any) multiplies the weights.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use fedfuse_core::linalg::{Mat, Parallelism, matmul_on};
use rayon::prelude::*;

use super::affine::{AdTensor, contiguous_f32, flex, values};
use super::gelu::exp_nonpositive;
use super::kernels::{LANES, lane_sum};

/// Sizes of one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims {
    n: usize,
    seq: usize,
    hidden: usize,
    heads: usize,
}

impl Dims {
    fn head(&self) -> usize {
        self.hidden / self.heads
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head() as f32).sqrt()
    }

    /// Attention weights per sample.
    fn weights(&self) -> usize {
        self.heads * self.seq * self.seq
    }
}

/// `row` scaled by `scale`, then its softmax, in place. Separate loops, so that the scaling,
/// the exponentials and the division vectorise (a running sum beside `exp` would not).
#[inline(always)]
fn softmax_body(row: &mut [f32], scale: f32) {
    let mut max = f32::NEG_INFINITY;
    for v in row.iter_mut() {
        *v *= scale;
        max = max.max(*v);
    }
    for v in row.iter_mut() {
        *v = exp_nonpositive(*v - max);
    }
    let inv = 1.0 / lane_sum(row);
    for v in row.iter_mut() {
        *v *= inv;
    }
}

widest!(fn softmax_row => softmax_body(row: &mut [f32], scale: f32));

/// `ds = p ⊙ (dp − Σ dp ⊙ p) · scale` for one row of weights.
#[inline(always)]
fn softmax_grad_body(p: &[f32], dp: &mut [f32], scale: f32) {
    let mut acc = [0f32; LANES];
    let (mut pc, mut gc) = (p.chunks_exact(LANES), dp.chunks_exact(LANES));
    for (pc, gc) in (&mut pc).zip(&mut gc) {
        for ((a, &p), &g) in acc.iter_mut().zip(pc).zip(gc) {
            *a += p * g;
        }
    }
    let tail: f32 = pc
        .remainder()
        .iter()
        .zip(gc.remainder())
        .map(|(p, g)| p * g)
        .sum();
    let dot = acc.iter().sum::<f32>() + tail;
    for (g, &p) in dp.iter_mut().zip(p) {
        *g = p * (*g - dot) * scale;
    }
}

widest!(fn softmax_grad_row => softmax_grad_body(p: &[f32], dp: &mut [f32], scale: f32));

/// Head `h`'s part `part` (0 q, 1 k, 2 v) of a sample's packed rows, `[seq, d]`.
fn packed<'a>(qkv: &'a [f32], d: &Dims, part: usize, h: usize) -> Mat<'a, f32> {
    let at = part * d.hidden + h * d.head();
    Mat::rows(&qkv[at..], d.seq, d.head(), 3 * d.hidden)
}

/// The weights `p` (`[heads, seq, seq]`, softmax before the mask) and output (`[seq, hidden]`)
/// of one sample.
fn forward_sample(qkv: &[f32], mask: Option<&[f32]>, p: &mut [f32], out: &mut [f32], d: &Dims) {
    let (seq, hd) = (d.seq, d.head());
    let mut masked = vec![0f32; if mask.is_some() { seq * seq } else { 0 }];
    for h in 0..d.heads {
        let ph = &mut p[h * seq * seq..(h + 1) * seq * seq];
        let (q, k, v) = (
            packed(qkv, d, 0, h),
            packed(qkv, d, 1, h),
            packed(qkv, d, 2, h),
        );
        matmul_on(ph, (seq, 1), q, k.t(), false, Parallelism::None);
        for row in ph.chunks_exact_mut(seq) {
            softmax_row(row, d.scale());
        }
        let weights: &[f32] = match mask {
            Some(m) => {
                let mh = &m[h * seq * seq..(h + 1) * seq * seq];
                for ((w, &p), &m) in masked.iter_mut().zip(ph.iter()).zip(mh) {
                    *w = p * m;
                }
                &masked
            }
            None => ph,
        };
        let weights = Mat::rows(weights, seq, seq, seq);
        matmul_on(
            &mut out[h * hd..],
            (d.hidden, 1),
            weights,
            v,
            false,
            Parallelism::None,
        );
    }
}

/// The gradient of one sample's packed rows (`[seq, 3 · hidden]`) from its output's.
fn backward_sample(
    qkv: &[f32],
    p: &[f32],
    mask: Option<&[f32]>,
    dy: &[f32],
    dqkv: &mut [f32],
    d: &Dims,
) {
    let (seq, hd) = (d.seq, d.head());
    let mut masked = vec![0f32; if mask.is_some() { seq * seq } else { 0 }];
    let mut dp = vec![0f32; seq * seq];
    for h in 0..d.heads {
        let ph = &p[h * seq * seq..(h + 1) * seq * seq];
        let mh = mask.map(|m| &m[h * seq * seq..(h + 1) * seq * seq]);
        let weights: &[f32] = match mh {
            Some(m) => {
                for ((w, &p), &m) in masked.iter_mut().zip(ph).zip(m) {
                    *w = p * m;
                }
                &masked
            }
            None => ph,
        };
        let dyh = Mat::rows(&dy[h * hd..], seq, hd, d.hidden);
        let (q, k, v) = (
            packed(qkv, d, 0, h),
            packed(qkv, d, 1, h),
            packed(qkv, d, 2, h),
        );
        // dv = weightsᵀ dy.
        let at_v = 2 * d.hidden + h * hd;
        matmul_on(
            &mut dqkv[at_v..],
            (3 * d.hidden, 1),
            Mat::rows(weights, seq, seq, seq).t(),
            dyh,
            false,
            Parallelism::None,
        );
        // d(weights) = dy vᵀ, through the mask, then through the softmax and the scale.
        matmul_on(&mut dp, (seq, 1), dyh, v.t(), false, Parallelism::None);
        if let Some(m) = mh {
            for (g, &m) in dp.iter_mut().zip(m) {
                *g *= m;
            }
        }
        for (prow, grow) in ph.chunks_exact(seq).zip(dp.chunks_exact_mut(seq)) {
            softmax_grad_row(prow, grow, d.scale());
        }
        let ds = Mat::rows(&dp, seq, seq, seq);
        // dq = ds k, dk = dsᵀ q.
        matmul_on(
            &mut dqkv[h * hd..],
            (3 * d.hidden, 1),
            ds,
            k,
            false,
            Parallelism::None,
        );
        matmul_on(
            &mut dqkv[d.hidden + h * hd..],
            (3 * d.hidden, 1),
            ds.t(),
            q,
            false,
            Parallelism::None,
        );
    }
}

/// What the backward pass needs.
#[derive(Clone, Debug)]
struct AttentionState {
    qkv: FlexTensor,
    /// Softmax weights, `[n, heads, seq, seq]`, before the mask.
    p: Vec<f32>,
    mask: Option<FlexTensor>,
    dims: Dims,
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Flex, 1> for AttentionBackward {
    type State = AttentionState;

    /// # Panics
    ///
    /// The forward pass checked the sizes and the graph gives `dy` the output's shape; a
    /// mismatch (a broken invariant of burn's autodiff) panics rather than computing garbage.
    fn backward(self, ops: Ops<AttentionState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let Some(node) = node else {
            return;
        };
        let s = &ops.state;
        let d = s.dims;
        let (row, out_row) = (d.seq * 3 * d.hidden, d.seq * d.hidden);
        let dy = contiguous_f32(&dy);
        let (Some(qkv), Some(dy)) = (
            values(&s.qkv, d.n * row),
            dy.as_ref().and_then(|t| values(t, d.n * out_row)),
        ) else {
            panic!("attention backward: the gradient does not match the forward sizes {d:?}");
        };
        let mask = s.mask.as_ref().and_then(|m| values(m, d.n * d.weights()));
        let mut dqkv = vec![0f32; d.n * row];
        dqkv.par_chunks_mut(row).enumerate().for_each(|(i, dq)| {
            let w = d.weights();
            backward_sample(
                &qkv[i * row..(i + 1) * row],
                &s.p[i * w..(i + 1) * w],
                mask.map(|m| &m[i * w..(i + 1) * w]),
                &dy[i * out_row..(i + 1) * out_row],
                dq,
                &d,
            );
        });
        grads.register::<Flex>(node.id, flex(dqkv, &[d.n, d.seq, 3 * d.hidden]));
    }
}

/// Weights and output of every sample.
fn forward_values(qkv: &[f32], mask: Option<&[f32]>, d: &Dims) -> (Vec<f32>, Vec<f32>) {
    let (row, out_row, w) = (d.seq * 3 * d.hidden, d.seq * d.hidden, d.weights());
    let mut p = vec![0f32; d.n * w];
    let mut out = vec![0f32; d.n * out_row];
    p.par_chunks_mut(w)
        .zip(out.par_chunks_mut(out_row))
        .enumerate()
        .for_each(|(i, (p, out))| {
            forward_sample(
                &qkv[i * row..(i + 1) * row],
                mask.map(|m| &m[i * w..(i + 1) * w]),
                p,
                out,
                d,
            );
        });
    (p, out)
}

/// The attention of `heads` heads over packed `qkv` (`[n, seq, 3 · hidden]`), `[n, seq,
/// hidden]`, with the custom op where it applies (`None` otherwise: the caller computes it
/// with burn's operations). `mask` (`[n, heads · seq · seq]`) multiplies the weights.
pub(crate) fn attend(qkv: &Tensor<3>, heads: usize, mask: Option<&Tensor<2>>) -> Option<Tensor<3>> {
    let [n, seq, packed_width] = qkv.dims();
    let hidden = packed_width / 3;
    if heads == 0 || hidden % heads != 0 || packed_width != 3 * hidden {
        return None;
    }
    let d = Dims {
        n,
        seq,
        hidden,
        heads,
    };
    let mask_len = n * d.weights();
    if mask.is_some_and(|m| m.dims() != [n, d.weights()]) {
        return None;
    }
    if let Ok(p) = qkv.clone().try_into_primitive::<Autodiff<Flex>>() {
        let (input, node) = p.into_parts();
        let input = contiguous_f32(&input)?;
        let mask = match mask {
            Some(m) => {
                let (m, _) = m
                    .clone()
                    .try_into_primitive::<Autodiff<Flex>>()
                    .ok()?
                    .into_parts();
                Some(contiguous_f32(&m)?)
            }
            None => None,
        };
        let m = match &mask {
            Some(m) => Some(values(m, mask_len)?),
            None => None,
        };
        let (p, out) = forward_values(values(&input, n * seq * packed_width)?, m, &d);
        let out = flex(out, &[n, seq, hidden]);
        let state = AttentionState {
            qkv: input,
            p,
            mask,
            dims: d,
        };
        let y: AdTensor = match AttentionBackward
            .prepare::<NoCheckpointing>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        return Some(Tensor::from_primitive::<Autodiff<Flex>>(y));
    }
    let input = contiguous_f32(&qkv.clone().try_into_primitive::<Flex>().ok()?)?;
    let mask = match mask {
        Some(m) => Some(contiguous_f32(
            &m.clone().try_into_primitive::<Flex>().ok()?,
        )?),
        None => None,
    };
    let m = match &mask {
        Some(m) => Some(values(m, mask_len)?),
        None => None,
    };
    let (_, out) = forward_values(values(&input, n * seq * packed_width)?, m, &d);
    Some(Tensor::from_primitive::<Flex>(flex(out, &[n, seq, hidden])))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::attend;
    use crate::seq::tests::close;
    use crate::seq::tests::noise;
    use crate::seq::vit::Encoder;
    use burn::nn::LinearConfig;
    use burn::tensor::{Device, Tensor, TensorData};

    /// Output and the gradient of the packed input of `loss = Σ y·r` against burn's
    /// operations, with and without a dropout mask on the weights.
    #[test]
    fn attention_and_its_gradient_match_burns() {
        let device = Device::flex().autodiff();
        let (n, seq, hidden, heads) = (3, 17, 24, 4);
        let lin = || LinearConfig::new(hidden, hidden).init(&device);
        let norm = || crate::seq::vit::TokenNorm {
            weight: burn::module::Param::from_tensor(Tensor::ones([hidden], &device)),
            bias: burn::module::Param::from_tensor(Tensor::zeros([hidden], &device)),
            eps: 1e-6,
        };
        let encoder = Encoder {
            ln_1: norm(),
            in_proj: LinearConfig::new(hidden, 3 * hidden).init(&device),
            out_proj: lin(),
            ln_2: norm(),
            mlp_0: lin(),
            mlp_3: lin(),
            heads,
            dropout: 0.0,
            attention_dropout: 0.5,
        };
        let len = n * seq * 3 * hidden;
        let r = Tensor::<1>::from_data(
            TensorData::new(noise(n * seq * hidden, 4), [n * seq * hidden]),
            &device,
        )
        .reshape([n, seq, hidden]);
        let w = heads * seq * seq;
        let mask = Tensor::<2>::from_data(
            TensorData::new(
                noise(n * w, 6)
                    .into_iter()
                    .map(|v| if v < 0.0 { 0.0 } else { 2.0 })
                    .collect::<Vec<f32>>(),
                [n, w],
            ),
            &device,
        );
        for with_mask in [false, true] {
            let run = |custom: bool| {
                let qkv = Tensor::<1>::from_data(TensorData::new(noise(len, 5), [len]), &device)
                    .mul_scalar(2.0)
                    .reshape([n, seq, 3 * hidden])
                    .require_grad();
                let m = with_mask.then_some(&mask);
                let y = match custom {
                    true => attend(&qkv, heads, m).unwrap(),
                    false => encoder.attend_burn(qkv.clone(), m),
                };
                let grads = (y.clone() * r.clone()).sum().backward();
                let vec = |t: Tensor<3>| -> Vec<f32> {
                    let [a, b, c] = t.dims();
                    t.reshape([a * b * c]).into_data().try_into_vec().unwrap()
                };
                (vec(y), vec(qkv.grad(&grads).unwrap()))
            };
            let (mine, theirs) = (run(true), run(false));
            for (what, a, b) in [("y", &mine.0, &theirs.0), ("dqkv", &mine.1, &theirs.1)] {
                // Float rounding: the sums run in another order.
                close(&format!("{what} (mask {with_mask})"), a, b, 5e-5);
            }
        }
    }
}
