//! Batch normalisation in training mode as a custom autodiff op on the Flex (CPU) backend.
//!
//! Written with burn's tensor ops, a training forward and backward of batch norm makes about
//! a dozen full passes over the activations (means along two axes, centring, squares,
//! products, and their gradients); here it is two passes forward (sums, then the scaled
//! output) and two backward (the two sums, then the input gradient), with the usual closed
//! form of the gradient. Sums are taken per channel in `f64`, in a fixed order, so any thread
//! count gives the same bits. Inputs this op does not cover (another backend or dtype) go
//! through the tensor-op version in `seq/mod.rs`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::affine::{AdTensor, contiguous_f32, flex, values};

/// Samples per parallel task of the element-wise passes.
const SAMPLES_PER_TASK: usize = 4;

/// A training step's output and the batch's per-channel mean and biased variance.
pub(crate) struct Normalised {
    pub(crate) y: Tensor<3>,
    pub(crate) mean: Vec<f32>,
    pub(crate) var: Vec<f32>,
}

/// Batch norm of `x` (`[n, c, m]`) with scale `w` and shift `b` (`[c]`) in training mode,
/// or `None` where the op does not apply.
pub(crate) fn train(x: &Tensor<3>, w: &Tensor<1>, b: &Tensor<1>, eps: f64) -> Option<Normalised> {
    let [n, c, m] = x.dims();
    let g = Geom { n, c, m, eps };
    let parts = (
        x.clone().try_into_primitive::<Autodiff<Flex>>().ok()?,
        w.clone().try_into_primitive::<Autodiff<Flex>>().ok()?,
        b.clone().try_into_primitive::<Autodiff<Flex>>().ok()?,
    );
    let (y, mean, var) = forward_autodiff(parts, g)?;
    Some(Normalised {
        y: Tensor::from_primitive::<Autodiff<Flex>>(y),
        mean,
        var,
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Geom {
    n: usize,
    c: usize,
    m: usize,
    eps: f64,
}

impl Geom {
    fn len(&self) -> usize {
        self.n * self.c * self.m
    }

    /// Values per channel.
    fn count(&self) -> usize {
        self.n * self.m
    }
}

/// Per channel `ch`, `Σ_i f(offset, ch)` over the samples `i` in order, in `f64`, where
/// `offset` is where row `[i, ch, :]` starts.
fn channel_sums(g: &Geom, f: impl Fn(usize, usize) -> f64 + Sync) -> Vec<f64> {
    (0..g.c)
        .into_par_iter()
        .map(|ch| (0..g.n).map(|i| f((i * g.c + ch) * g.m, ch)).sum())
        .collect()
}

/// `Σ f(a_k, b_k)` over a row, in eight `f32` lanes (so that it vectorises; a row is one
/// sample's channel, at most a few thousand values) added up in `f64`.
fn row_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f64 {
    let mut lanes = [0f32; 8];
    let ((a8, a_rest), (b8, b_rest)) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    for (x, y) in a8.iter().zip(b8) {
        for j in 0..8 {
            lanes[j] += f(x[j], y[j]);
        }
    }
    let rest: f64 = a_rest
        .iter()
        .zip(b_rest)
        .map(|(&x, &y)| f64::from(f(x, y)))
        .sum();
    lanes.iter().map(|&v| f64::from(v)).sum::<f64>() + rest
}

/// `out[i, ch, :] = op(x[i, ch, :], ch)` per sample and channel, in parallel over samples.
fn map_rows(g: &Geom, out: &mut [f32], op: impl Fn(&mut [f32], usize, usize) + Sync) {
    let per_sample = g.c * g.m;
    out.par_chunks_mut(SAMPLES_PER_TASK * per_sample)
        .enumerate()
        .for_each(|(task, chunk)| {
            for (j, row) in chunk.chunks_exact_mut(g.m).enumerate() {
                let flat = task * SAMPLES_PER_TASK * g.c + j;
                op(row, flat / g.c, flat % g.c);
            }
        });
}

/// Mean, biased variance and `1/sqrt(var + eps)` per channel.
fn moments(x: &[f32], g: &Geom) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let count = g.count() as f64;
    let row = |at: usize| &x[at..][..g.m];
    let mean: Vec<f64> = channel_sums(g, |at, _| row_sum(row(at), row(at), |v, _| v))
        .into_iter()
        .map(|s| s / count)
        .collect();
    // Squared deviations from the f32 mean, in row_sum's f32 lanes: an f64 sum element by
    // element was one dependent add per value, 5 % of a ResNet-20 epoch.
    let var: Vec<f64> = channel_sums(g, |at, ch| {
        let m = mean[ch] as f32;
        row_sum(row(at), row(at), |v, _| (v - m) * (v - m))
    })
    .into_iter()
    .map(|s| s / count)
    .collect();
    let inv = var.iter().map(|v| 1.0 / (v + g.eps).sqrt()).collect();
    (mean, var, inv)
}

#[derive(Clone, Debug)]
struct State {
    x: FlexTensor,
    w: Vec<f32>,
    mean: Vec<f64>,
    inv: Vec<f64>,
    geom: Geom,
}

#[derive(Debug)]
struct BatchNormBackward;

impl Backward<Flex, 3> for BatchNormBackward {
    type State = State;

    fn backward(self, ops: Ops<State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w, node_b] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let s = &ops.state;
        let g = &s.geom;
        let dy = contiguous_f32(&dy);
        let (Some(dy), Some(x)) = (
            dy.as_ref().and_then(|dy| values(dy, g.len())),
            values(&s.x, g.len()),
        ) else {
            panic!("batch_norm backward: gradient does not match the forward geometry {g:?}");
        };
        // Per channel: Σ dy, and Σ dy·x̂ with x̂ = (x − mean)·inv.
        let sum_dy = channel_sums(g, |at, _| {
            let d = &dy[at..][..g.m];
            row_sum(d, d, |v, _| v)
        });
        let sum_dy_xhat: Vec<f64> = channel_sums(g, |at, ch| {
            let m = s.mean[ch] as f32;
            row_sum(&dy[at..][..g.m], &x[at..][..g.m], |d, v| d * (v - m))
        })
        .iter()
        .zip(&s.inv)
        .map(|(v, inv)| v * inv)
        .collect();
        if let Some(node) = node_x {
            // dx = w·inv/N · (N·dy − Σdy − x̂·Σ(dy·x̂)) with x̂ = (x − mean)·inv, as
            // dy·k1 + x·k2 + k3 per channel.
            let count = g.count() as f64;
            let coef: Vec<[f32; 3]> = (0..g.c)
                .map(|ch| {
                    let k = f64::from(s.w[ch]) * s.inv[ch] / count;
                    let k2 = -k * s.inv[ch] * sum_dy_xhat[ch];
                    let k3 = -k * sum_dy[ch] - k2 * s.mean[ch];
                    [(k * count) as f32, k2 as f32, k3 as f32]
                })
                .collect();
            let mut dx = dy.to_vec();
            map_rows(g, &mut dx, |row, i, ch| {
                let xs = &x[(i * g.c + ch) * g.m..][..g.m];
                let [k1, k2, k3] = coef[ch];
                for (d, &v) in row.iter_mut().zip(xs) {
                    *d = *d * k1 + v * k2 + k3;
                }
            });
            grads.register::<Flex>(node.id, flex(dx, &[g.n, g.c, g.m]));
        }
        if let Some(node) = node_w {
            let dw = sum_dy_xhat.iter().map(|&v| v as f32).collect();
            grads.register::<Flex>(node.id, flex(dw, &[g.c]));
        }
        if let Some(node) = node_b {
            let db = sum_dy.iter().map(|&v| v as f32).collect();
            grads.register::<Flex>(node.id, flex(db, &[g.c]));
        }
    }
}

type Moments = (AdTensor, Vec<f32>, Vec<f32>);

fn forward_autodiff((x, w, b): (AdTensor, AdTensor, AdTensor), g: Geom) -> Option<Moments> {
    let (x, x_node) = x.into_parts();
    let (w, w_node) = w.into_parts();
    let (b, b_node) = b.into_parts();
    let (x, w, b) = (
        contiguous_f32(&x)?,
        contiguous_f32(&w)?,
        contiguous_f32(&b)?,
    );
    let xs = values(&x, g.len())?;
    let (wv, bv) = (values(&w, g.c)?.to_vec(), values(&b, g.c)?);
    let (mean, var, inv) = moments(xs, &g);
    // y = x·scale + shift per channel.
    let scale: Vec<f64> = inv
        .iter()
        .zip(&wv)
        .map(|(i, &w)| i * f64::from(w))
        .collect();
    let shift: Vec<f64> = (0..g.c)
        .map(|ch| f64::from(bv[ch]) - mean[ch] * scale[ch])
        .collect();
    let mut y = xs.to_vec();
    map_rows(&g, &mut y, |row, _, ch| {
        let (a, s) = (scale[ch] as f32, shift[ch] as f32);
        for v in row {
            *v = *v * a + s;
        }
    });
    let y = flex(y, &[g.n, g.c, g.m]);
    let stats = (
        mean.iter().map(|&v| v as f32).collect(),
        var.iter().map(|&v| v as f32).collect(),
    );
    let state = State {
        x,
        w: wv,
        mean,
        inv,
        geom: g,
    };
    let out = match BatchNormBackward
        .prepare::<NoCheckpointing>([x_node, w_node, b_node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Some((out, stats.0, stats.1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use crate::seq::tests::noise;
    use burn::tensor::{Device, Tensor, TensorData};

    type Run = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    /// y, dx, dw, db, mean and variance of `Σ bn(x)·r`, by this op or by burn's tensor ops.
    fn run([n, c, m]: [usize; 3], custom: bool) -> Run {
        let device = Device::flex().autodiff();
        let t3 = |seed, shift: f32| {
            let v = noise(n * c * m, seed)
                .iter()
                .map(|v| v * 3.0 + shift)
                .collect();
            Tensor::<3>::from_data(TensorData::new(v, [n, c, m]), &device)
        };
        let t1 = |seed| Tensor::<1>::from_data(TensorData::new(noise(c, seed), [c]), &device);
        let (x, r) = (t3(1, 0.7).require_grad(), t3(2, 0.0));
        let (w, b) = (t1(3).require_grad(), t1(4).require_grad());
        let eps = 1e-5;
        let (y, mean, var) = if custom {
            let out = super::train(&x, &w, &b, eps).expect("the op applies");
            (out.y, out.mean, out.var)
        } else {
            let mean = x.clone().mean_dim(2).mean_dim(0);
            let centred = x.clone() - mean.clone();
            let var = centred.clone().square().mean_dim(2).mean_dim(0);
            let vals = |t: &Tensor<3>| t.clone().into_data().try_to_vec::<f32>().unwrap();
            let (mv, vv) = (vals(&mean), vals(&var));
            let scale = var.add_scalar(eps).sqrt().recip() * w.clone().reshape([1, c, 1]);
            (centred * scale + b.clone().reshape([1, c, 1]), mv, vv)
        };
        let grads = (y.clone() * r).sum().backward();
        let v = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
        let flat = |t: Tensor<3>| v(t.flatten(0, 2));
        (
            flat(y),
            flat(x.grad(&grads).unwrap()),
            v(w.grad(&grads).unwrap()),
            v(b.grad(&grads).unwrap()),
            mean,
            var,
        )
    }

    fn close(what: &str, ours: &[f32], theirs: &[f32]) {
        assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
        let scale = theirs.iter().fold(1e-6f32, |a, v| a.max(v.abs()));
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            assert!(
                (a - b).abs() <= 2e-5 * scale,
                "{what}[{i}]: ours {a}, burn {b}"
            );
        }
    }

    #[test]
    fn batch_norm_matches_the_tensor_op_version() {
        // Image activations over several tasks, and flat features (one value per row).
        for shape in [[9, 3, 10], [2, 5, 4], [7, 6, 1]] {
            let ours = run(shape, true);
            let theirs = run(shape, false);
            close("y", &ours.0, &theirs.0);
            close("dx", &ours.1, &theirs.1);
            close("dw", &ours.2, &theirs.2);
            close("db", &ours.3, &theirs.3);
            close("mean", &ours.4, &theirs.4);
            close("var", &ours.5, &theirs.5);
        }
    }

    #[test]
    fn batch_norm_bits_do_not_depend_on_the_thread_count() {
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run([9, 3, 10], true))
        };
        assert_eq!(on(1), on(3));
    }
}
