//! A linear layer as a custom autodiff op on the Flex (CPU) backend.
//!
//! burn-flex's matmul writes every product row-major, so gemm computes the input gradient
//! `dX = dY·Wᵀ` as its transpose `W·dYᵀ` and packs all of `W` (`[in, out]`, row-major) for
//! every batch: a full read and write of the weight matrix, 9 % of a cnn-leaf epoch whose
//! 3136 × 2048 layer holds 6.4 M weights. Written column-major, the product leaves gemm the
//! small `dY` to pack and reads `W` in place; a transpose of the `[batch, in]` result costs a
//! batch's worth of values. The forward product is written row-major: with gemm's AVX-512
//! kernels it reads `W` in place that way, and the column-major product measured 1.27x
//! slower for cnn-leaf's layer on a Zen 4 (8.0 against 6.3 ms a batch; with the AVX2 kernels
//! it had been 3-5 % faster). The weight gradient keeps burn's layout, whose packed operands
//! are batch-sized already.
//!
//! Each GEMM runs on gemm's threads ([`product_on`]), which split the output into tiles and
//! keep the bits independent of the thread count. Layers this op does not cover (another
//! backend, a dtype other than `f32`) go through burn's `Linear::forward`.

use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::Linear;
use burn::tensor::Tensor;

use super::affine::{self, AdTensor, AffineState, Grads, contiguous_f32, flex, values};
use fedfuse_core::linalg::{Mat, Parallelism, product_on};

/// `lin.forward(x)` for fedfuse's layers, with the custom op where it applies.
pub(crate) fn forward(lin: &Linear, x: Tensor<2>) -> Tensor<2> {
    match try_forward(lin, &x) {
        Some(y) => y,
        None => lin.forward(x),
    }
}

/// The custom op's output, or `None` where it does not apply.
fn try_forward(lin: &Linear, x: &Tensor<2>) -> Option<Tensor<2>> {
    let [batch, d_in] = x.dims();
    let [w_in, d_out] = lin.weight.dims();
    if w_in != d_in {
        return None;
    }
    let dims = Dims { batch, d_in, d_out };
    let weight = lin.weight.val();
    let bias = lin.bias.as_ref().map(|b| b.val());
    // The downcasts consume their tensor, so they work on clones (reference-count bumps) and
    // the caller keeps `x` for the fallback.
    let ad = (
        x.clone().try_into_primitive::<Autodiff<Flex>>(),
        weight.clone().try_into_primitive::<Autodiff<Flex>>(),
        bias.clone()
            .map(|b| b.try_into_primitive::<Autodiff<Flex>>())
            .transpose(),
    );
    if let (Ok(xp), Ok(wp), Ok(bp)) = ad {
        let out = forward_autodiff(xp, wp, bp, dims)?;
        return Some(Tensor::from_primitive::<Autodiff<Flex>>(out));
    }
    let plain = (
        x.clone().try_into_primitive::<Flex>(),
        weight.try_into_primitive::<Flex>(),
        bias.map(|b| b.try_into_primitive::<Flex>()).transpose(),
    );
    let (Ok(xp), Ok(wp), Ok(bp)) = plain else {
        return None;
    };
    let (x, w) = (contiguous_f32(&xp)?, contiguous_f32(&wp)?);
    let b = bp.as_ref().map(contiguous_f32);
    let bias = match &b {
        Some(b) => Some(values(b.as_ref()?, d_out)?),
        None => None,
    };
    let y = linear_forward(
        values(&x, dims.x_len())?,
        values(&w, dims.w_len())?,
        bias,
        &dims,
    );
    Some(Tensor::from_primitive::<Flex>(flex(y, &[batch, d_out])))
}

/// Sizes of one linear layer on one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dims {
    batch: usize,
    d_in: usize,
    d_out: usize,
}

impl Dims {
    fn x_len(&self) -> usize {
        self.batch * self.d_in
    }

    fn w_len(&self) -> usize {
        self.d_in * self.d_out
    }

    fn y_len(&self) -> usize {
        self.batch * self.d_out
    }

    /// Whether the input gradient is written row-major directly: when the batch outnumbers
    /// the weight's sides (a transformer's per-token layers: thousands of tokens, a few
    /// hundred features), packing the weight is cheap and transposing a batch-sized result is
    /// not.
    fn row_major(&self) -> bool {
        self.batch >= self.d_in.max(self.d_out)
    }

    /// gemm's threads for a product of this layer's size: one thread below the size where
    /// burn-flex starts splitting (its `PARALLEL_THRESHOLD`, 2^18 multiply-adds).
    fn parallelism(&self) -> Parallelism {
        match self.batch * self.d_in * self.d_out >= 1 << 18 {
            true => Parallelism::Rayon(0),
            false => Parallelism::None,
        }
    }
}

/// `y = x·w + b`: `x` is `[batch, d_in]`, `w` burn's `[d_in, d_out]`, all row-major.
fn linear_forward(x: &[f32], w: &[f32], bias: Option<&[f32]>, d: &Dims) -> Vec<f32> {
    let xs = Mat::rows(x, d.batch, d.d_in, d.d_in);
    let ws = Mat::rows(w, d.d_in, d.d_out, d.d_out);
    let mut y = product_on(xs, ws, true, d.parallelism());
    if let Some(bias) = bias {
        for row in y.chunks_exact_mut(d.d_out) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
    }
    y
}

/// What the backward pass needs: the op's inputs, as burn's linear keeps them.
#[derive(Clone, Debug)]
struct LinearState {
    x: FlexTensor,
    w: FlexTensor,
    dims: Dims,
}

impl AffineState for LinearState {
    /// # Panics
    ///
    /// The forward pass checked the sizes of `x` and `w` and the graph gives `dy` the
    /// output's shape; a mismatch (a broken invariant of burn's autodiff) panics rather than
    /// computing garbage.
    fn gradients(&self, dy: &FlexTensor, need: [bool; 3]) -> Grads {
        let d = &self.dims;
        let dy = contiguous_f32(dy).filter(|dy| {
            values(dy, d.y_len()).is_some()
                && values(&self.x, d.x_len()).is_some()
                && values(&self.w, d.w_len()).is_some()
        });
        let Some(dy) = dy else {
            panic!("linear backward: the gradient does not match the forward sizes {d:?}");
        };
        // Checked just above.
        let dy = values(&dy, d.y_len()).unwrap_or_default();
        let x = values(&self.x, d.x_len()).unwrap_or_default();
        let w = values(&self.w, d.w_len()).unwrap_or_default();
        let [need_x, need_w, need_b] = need;
        let dys = Mat::rows(dy, d.batch, d.d_out, d.d_out);
        let dx = need_x.then(|| {
            let wt = Mat::rows(w, d.d_in, d.d_out, d.d_out).t();
            if d.row_major() {
                let dx = product_on(dys, wt, true, d.parallelism());
                return flex(dx, &[d.batch, d.d_in]);
            }
            // `dX = dY·Wᵀ` written column-major (`dxt` is `dXᵀ`, `[d_in, batch]`): gemm packs
            // `dY` and reads `Wᵀ` (column-major) in place.
            let dxt = product_on(dys, wt, false, d.parallelism());
            let mut dx = vec![0f32; d.x_len()];
            for (i, row) in dxt.chunks_exact(d.batch).enumerate() {
                for (s, &v) in row.iter().enumerate() {
                    dx[s * d.d_in + i] = v;
                }
            }
            flex(dx, &[d.batch, d.d_in])
        });
        let dw = need_w.then(|| {
            let xt = Mat::rows(x, d.batch, d.d_in, d.d_in).t();
            let dw = product_on(xt, dys, true, d.parallelism());
            flex(dw, &[d.d_in, d.d_out])
        });
        let db = need_b.then(|| {
            let mut sums = vec![0f64; d.d_out];
            for row in dy.chunks_exact(d.d_out) {
                for (s, &v) in sums.iter_mut().zip(row) {
                    *s += f64::from(v);
                }
            }
            flex(sums.into_iter().map(|s| s as f32).collect(), &[d.d_out])
        });
        (dx, dw, db)
    }
}

/// The autodiff path: computes the output and records the backward step.
fn forward_autodiff(x: AdTensor, w: AdTensor, b: Option<AdTensor>, d: Dims) -> Option<AdTensor> {
    let (x, w, b, nodes) = affine::inputs(x, w, b)?;
    let bias = match &b {
        Some(b) => Some(values(b, d.d_out)?),
        None => None,
    };
    let y = linear_forward(values(&x, d.x_len())?, values(&w, d.w_len())?, bias, &d);
    let y = flex(y, &[d.batch, d.d_out]);
    Some(nodes.record(LinearState { x, w, dims: d }, y))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use crate::seq::tests::noise;
    use burn::module::Param;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Device, Tensor, TensorData};

    fn layer(d_in: usize, d_out: usize, bias: bool, device: &Device) -> Linear {
        let mut lin = LinearConfig::new(d_in, d_out).with_bias(bias).init(device);
        lin.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(noise(d_in * d_out, 7), [d_in, d_out]),
            device,
        ));
        lin.bias = bias.then(|| {
            Param::from_tensor(Tensor::from_data(
                TensorData::new(noise(d_out, 8), [d_out]),
                device,
            ))
        });
        lin
    }

    type Run = (Vec<f32>, Vec<f32>, Vec<f32>, Option<Vec<f32>>);

    /// Output and the gradients of x, weight and bias of `loss = Σ y·r`.
    fn run(batch: usize, d_in: usize, d_out: usize, bias: bool, custom: bool) -> Run {
        let device = Device::flex().autodiff();
        let lin = layer(d_in, d_out, bias, &device);
        let x = Tensor::<2>::from_data(
            TensorData::new(noise(batch * d_in, 3), [batch, d_in]),
            &device,
        )
        .require_grad();
        let y = match custom {
            true => super::try_forward(&lin, &x).expect("custom op applies"),
            false => lin.forward(x.clone()),
        };
        let r = Tensor::<2>::from_data(
            TensorData::new(noise(batch * d_out, 5), [batch, d_out]),
            &device,
        );
        let grads = (y.clone() * r).sum().backward();
        let vals = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let dx = x.grad(&grads).expect("x grad");
        let dw = lin.weight.val().grad(&grads).expect("weight grad");
        let db = lin.bias.as_ref().map(|b| {
            let g = b.val().grad(&grads).expect("bias grad");
            g.into_data().try_to_vec::<f32>().unwrap()
        });
        (vals(y), vals(dx), vals(dw), db)
    }

    fn assert_close(what: &str, ours: &[f32], burn: &[f32]) {
        assert_eq!(ours.len(), burn.len(), "{what}: lengths");
        let scale = burn.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        for (i, (a, b)) in ours.iter().zip(burn).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{what}[{i}]: ours {a} vs burn {b} (scale {scale})"
            );
        }
    }

    fn check(batch: usize, d_in: usize, d_out: usize, bias: bool) {
        let ours = run(batch, d_in, d_out, bias, true);
        let burn = run(batch, d_in, d_out, bias, false);
        assert_close("y", &ours.0, &burn.0);
        assert_close("dx", &ours.1, &burn.1);
        assert_close("dw", &ours.2, &burn.2);
        match (&ours.3, &burn.3) {
            (Some(a), Some(b)) => assert_close("db", a, b),
            (None, None) => {}
            _ => panic!("bias gradient on one side only"),
        }
    }

    #[test]
    fn linear_matches_burn() {
        check(3, 5, 4, true);
        check(1, 7, 2, false);
        // Sizes that take gemm's packed and threaded paths and ragged tiles.
        check(33, 300, 70, true);
    }

    #[test]
    fn linear_values_by_hand() {
        // y = x·w + b with x = [1, 2], w = [[1, 2, 3], [4, 5, 6]], b = [0.5, 0, -1]:
        // y = [9.5, 12, 14]; loss Σy: dx = row sums of w = [6, 15], dw = xᵀ·1 = [[1]*3, [2]*3].
        let device = Device::flex().autodiff();
        let mut lin = LinearConfig::new(2, 3).init(&device);
        lin.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![1f32, 2., 3., 4., 5., 6.], [2, 3]),
            &device,
        ));
        lin.bias = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![0.5f32, 0., -1.], [3]),
            &device,
        )));
        let x =
            Tensor::<2>::from_data(TensorData::new(vec![1f32, 2.], [1, 2]), &device).require_grad();
        let y = super::try_forward(&lin, &x).expect("custom op applies");
        let grads = y.clone().sum().backward();
        let vals = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(vals(y), [9.5, 12., 14.]);
        assert_eq!(vals(x.grad(&grads).unwrap()), [6., 15.]);
        assert_eq!(
            vals(lin.weight.val().grad(&grads).unwrap()),
            [1., 1., 1., 2., 2., 2.]
        );
    }

    #[test]
    fn linear_bits_do_not_depend_on_the_thread_count() {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run(64, 700, 96, true, true))
        };
        assert_eq!(on(1), on(3));
    }
}
