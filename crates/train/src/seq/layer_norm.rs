//! Layer norm over the last axis of `[rows, features]` (a transformer's per-token norm) as a
//! custom autodiff op on the Flex backend. Written with burn's tensor operations it was ten
//! operations forward, each a tensor, and more backward; here each pass is one loop over the
//! rows, split over rayon's threads in fixed chunks (the scale and shift gradients are summed
//! chunk by chunk in chunk order, so the bits do not depend on the thread count).

use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::affine::{self, AffineState, Grads, contiguous_f32, flex, values};

/// Rows per rayon task.
const ROWS: usize = 64;

/// Sizes and settings of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Dims {
    rows: usize,
    features: usize,
    eps: f64,
}

/// Each row's mean and `1 / sqrt(var + eps)` (biased variance, as PyTorch's), in f64.
fn moments(row: &[f32], eps: f64) -> (f64, f64) {
    let n = row.len().max(1) as f64;
    let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = row
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, 1.0 / (var + eps).sqrt())
}

fn forward_values(x: &[f32], w: &[f32], b: &[f32], d: Dims) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(ROWS * d.features)
        .zip(x.par_chunks(ROWS * d.features))
        .for_each(|(y, x)| {
            for (y, x) in y
                .chunks_exact_mut(d.features)
                .zip(x.chunks_exact(d.features))
            {
                let (mean, inv) = moments(x, d.eps);
                for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                    *y = ((f64::from(x) - mean) * inv) as f32 * w + b;
                }
            }
        });
    y
}

/// What the backward pass needs: the op's input and scale.
#[derive(Clone, Debug)]
struct NormState {
    x: FlexTensor,
    w: FlexTensor,
    dims: Dims,
}

impl AffineState for NormState {
    /// # Panics
    ///
    /// The forward pass checked the sizes and the graph gives `dy` the output's shape; a
    /// mismatch (a broken invariant of burn's autodiff) panics rather than computing garbage.
    fn gradients(&self, dy: &FlexTensor, need: [bool; 3]) -> Grads {
        let d = self.dims;
        let len = d.rows * d.features;
        let dy = contiguous_f32(dy);
        let (Some(dy), Some(x), Some(w)) = (
            dy.as_ref().and_then(|t| values(t, len)),
            values(&self.x, len),
            values(&self.w, d.features),
        ) else {
            panic!("layer norm backward: the gradient does not match the forward sizes {d:?}");
        };
        let f = d.features;
        let chunk = ROWS * f;
        let mut dx = vec![0f32; if need[0] { len } else { 0 }];
        // Per chunk of rows: its sums of dy * x̂ and of dy, per feature.
        let partial = |x: &[f32], dy: &[f32], dx: Option<&mut [f32]>| {
            let mut sums = vec![0f64; 2 * f];
            let mut dx = dx;
            for (r, (x, dy)) in x.chunks_exact(f).zip(dy.chunks_exact(f)).enumerate() {
                let (mean, inv) = moments(x, d.eps);
                let (mut g_mean, mut gx_mean) = (0.0, 0.0);
                for (k, (&x, &dy)) in x.iter().zip(dy).enumerate() {
                    let xhat = (f64::from(x) - mean) * inv;
                    let g = f64::from(dy) * f64::from(w[k]);
                    sums[k] += f64::from(dy) * xhat;
                    sums[f + k] += f64::from(dy);
                    g_mean += g;
                    gx_mean += g * xhat;
                }
                let (g_mean, gx_mean) = (g_mean / f as f64, gx_mean / f as f64);
                if let Some(dx) = dx.as_deref_mut() {
                    let row = &mut dx[r * f..(r + 1) * f];
                    for (k, (out, (&x, &dy))) in row.iter_mut().zip(x.iter().zip(dy)).enumerate() {
                        let xhat = (f64::from(x) - mean) * inv;
                        let g = f64::from(dy) * f64::from(w[k]);
                        *out = (inv * (g - g_mean - xhat * gx_mean)) as f32;
                    }
                }
            }
            sums
        };
        let partials: Vec<Vec<f64>> = if need[0] {
            dx.par_chunks_mut(chunk)
                .zip(x.par_chunks(chunk).zip(dy.par_chunks(chunk)))
                .map(|(dx, (x, dy))| partial(x, dy, Some(dx)))
                .collect()
        } else {
            x.par_chunks(chunk)
                .zip(dy.par_chunks(chunk))
                .map(|(x, dy)| partial(x, dy, None))
                .collect()
        };
        let mut sums = vec![0f64; 2 * f];
        for p in &partials {
            for (s, v) in sums.iter_mut().zip(p) {
                *s += v;
            }
        }
        let as_f32 = |s: &[f64]| s.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        (
            need[0].then(|| flex(dx, &[d.rows, f])),
            need[1].then(|| flex(as_f32(&sums[..f]), &[f])),
            need[2].then(|| flex(as_f32(&sums[f..]), &[f])),
        )
    }
}

/// Layer norm of each row of `x` (`[rows, features]`) with scale `w` and shift `b`, with the
/// custom op where it applies (`None` otherwise: the caller computes it with burn's ops).
pub(crate) fn forward(x: &Tensor<2>, w: &Tensor<1>, b: &Tensor<1>, eps: f64) -> Option<Tensor<2>> {
    let [rows, features] = x.dims();
    if w.dims() != [features] || b.dims() != [features] {
        return None;
    }
    let d = Dims {
        rows,
        features,
        eps,
    };
    let len = rows * features;
    let ad = (
        x.clone().try_into_primitive::<Autodiff<Flex>>(),
        w.clone().try_into_primitive::<Autodiff<Flex>>(),
        b.clone().try_into_primitive::<Autodiff<Flex>>(),
    );
    if let (Ok(xp), Ok(wp), Ok(bp)) = ad {
        let (x, w, b, nodes) = affine::inputs(xp, wp, Some(bp))?;
        let y = forward_values(
            values(&x, len)?,
            values(&w, features)?,
            values(b.as_ref()?, features)?,
            d,
        );
        let out = nodes.record(NormState { x, w, dims: d }, flex(y, &[rows, features]));
        return Some(Tensor::from_primitive::<Autodiff<Flex>>(out));
    }
    let (xp, wp, bp) = (
        x.clone().try_into_primitive::<Flex>().ok()?,
        w.clone().try_into_primitive::<Flex>().ok()?,
        b.clone().try_into_primitive::<Flex>().ok()?,
    );
    let (x, w, b) = (
        contiguous_f32(&xp)?,
        contiguous_f32(&wp)?,
        contiguous_f32(&bp)?,
    );
    let y = forward_values(
        values(&x, len)?,
        values(&w, features)?,
        values(&b, features)?,
        d,
    );
    Some(Tensor::from_primitive::<Flex>(flex(y, &[rows, features])))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use crate::seq::tests::{close, noise};
    use crate::seq::vit::TokenNorm;
    use burn::module::Param;
    use burn::tensor::{Device, Tensor, TensorData};

    /// Values and the gradients of x, scale and shift of `loss = Σ y·r` against burn's ops.
    #[test]
    fn layer_norm_and_its_gradients_match_burns() {
        let device = Device::flex().autodiff();
        let (n, seq, f) = (3, 70, 48);
        let len = n * seq * f;
        let t = |v: Vec<f32>, shape: &[usize]| {
            Tensor::<1>::from_data(
                TensorData::new(v, [shape.iter().product::<usize>()]),
                &device,
            )
        };
        let norm = TokenNorm {
            weight: Param::from_tensor(t(noise(f, 2), &[f]).add_scalar(1.0)),
            bias: Param::from_tensor(t(noise(f, 3), &[f])),
            eps: 1e-6,
        };
        let r = t(noise(len, 4), &[len]).reshape([n, seq, f]);
        let run = |custom: bool| {
            let x = t(
                noise(len, 5).iter().map(|v| v * 3.0 + 0.5).collect(),
                &[len],
            )
            .reshape([n, seq, f])
            .require_grad();
            let y = match custom {
                true => norm.forward(x.clone()),
                false => norm.forward_burn(x.clone()),
            };
            let grads = (y.clone() * r.clone()).sum().backward();
            let vec = |t: Tensor<1>| -> Vec<f32> { t.into_data().try_into_vec().unwrap() };
            [
                vec(y.reshape([len])),
                vec(x.grad(&grads).unwrap().reshape([len])),
                vec(norm.weight.val().grad(&grads).unwrap()),
                vec(norm.bias.val().grad(&grads).unwrap()),
            ]
        };
        let (mine, theirs) = (run(true), run(false));
        for (what, (a, b)) in ["y", "dx", "dw", "db"].iter().zip(mine.iter().zip(&theirs)) {
            close(what, a, b, 1e-4);
        }
    }
}
