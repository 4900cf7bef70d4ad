//! GELU, exact form (`x Φ(x)`, PyTorch's `approximate='none'`), as a custom autodiff op on the
//! Flex backend. burn's `gelu` evaluates `erf` through scalar libm calls in the forward pass
//! and again in the backward pass, with a tensor for every intermediate: 12 % of a ViT epoch.
//! Here `erf` is a rational approximation of the argument (no exponential), within 1e-6 of
//! libm's in f32, both passes are one loop each, split over rayon's threads for large tensors
//! (each value alone, so the bits do not depend on the thread count).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::affine::{AdTensor, contiguous_f32, flex};

/// Values per rayon task.
const CHUNK: usize = 1 << 14;

/// `erf(x)` in f32: `x P(x^2) / Q(x^2)` on `x` clamped to [-4, 4] (where erf is 1 to f32's
/// precision), the odd rational form and coefficients of Eigen's `generic_fast_erf_float`.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    // Plain products and sums: `mul_add` is a libm call on a baseline x86-64 build, and
    // unfused arithmetic gives the same bits at every vector width.
    let mut p = x2 * -2.726_142_3e-10 + 2.770_681_4e-8;
    for c in [
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.9546e-3,
        -1.609_603_3e-2,
    ] {
        p = x2 * p + c;
    }
    let mut q = x2 * -1.456_607_2e-5 - 2.133_740_6e-4;
    for c in [-1.682_827e-3, -7.373_329_2e-3, -1.426_474e-2] {
        q = x2 * q + c;
    }
    x * p / q
}

/// `exp(x)` for `x <= 0`, in arithmetic the compiler vectorises (libm's `expf` is a call per
/// value): `2^n e^r` with `n` the nearest integer to `x / ln 2` and `|r| <= ln 2 / 2`, `e^r`
/// by its Taylor polynomial of degree 6 (within 3e-7 of libm's, relatively); e^-87 below -87.
#[inline(always)]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // ln 2 in two parts, so that `n * LN2_HI` is exact.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut e = r * (1.0 / 720.0) + 1.0 / 120.0;
    for c in [1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        e = r * e + c;
    }
    // n >= -126: a normal power of two.
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `Φ(x)`, the standard normal's distribution function.
#[inline(always)]
fn cdf(x: f32) -> f32 {
    0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn forward_body(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x * cdf(x);
    }
}

/// `dy (Φ(x) + x φ(x))`.
#[inline(always)]
fn backward_body(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    // 1 / sqrt(2π).
    const NORM: f32 = 0.398_942_3;
    for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
        *dx = dy * (cdf(x) + x * NORM * exp_nonpositive(-0.5 * x * x));
    }
}

widest!(fn forward_chunk => forward_body(x: &[f32], y: &mut [f32]));
widest!(fn backward_chunk => backward_body(x: &[f32], dy: &[f32], dx: &mut [f32]));

fn forward_values(x: &[f32]) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    y.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .for_each(|(y, x)| forward_chunk(x, y));
    y
}

fn backward_values(x: &[f32], dy: &[f32]) -> Vec<f32> {
    let mut dx = vec![0f32; x.len()];
    dx.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK).zip(dy.par_chunks(CHUNK)))
        .for_each(|(dx, (x, dy))| backward_chunk(x, dy, dx));
    dx
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    /// The op's input.
    type State = FlexTensor;

    /// # Panics
    ///
    /// The graph gives `dy` the output's shape, the input's; a mismatch (a broken invariant
    /// of burn's autodiff) panics rather than computing garbage.
    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let Some(node) = node else {
            return;
        };
        let x = &ops.state;
        let dy = contiguous_f32(&dy);
        let (Some(xs), Some(dys)) = (
            x.as_slice::<f32>(),
            dy.as_ref().and_then(|d| d.as_slice::<f32>()),
        ) else {
            panic!("gelu backward: the input or gradient is not contiguous f32");
        };
        assert_eq!(xs.len(), dys.len(), "gelu backward: gradient size");
        let shape = x.layout().shape().to_vec();
        grads.register::<Flex>(node.id, flex(backward_values(xs, dys), &shape));
    }
}

/// GELU of `x`, with the custom op where it applies (burn's otherwise).
pub(crate) fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let shape = x.dims().to_vec();
    if let Ok(p) = x.clone().try_into_primitive::<Autodiff<Flex>>() {
        let (input, node) = p.into_parts();
        if let Some(input) = contiguous_f32(&input)
            && let Some(xs) = input.as_slice::<f32>()
        {
            let y = flex(forward_values(xs), &shape);
            let out: AdTensor = match GeluBackward
                .prepare::<NoCheckpointing>([node])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(input, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            };
            return Tensor::from_primitive::<Autodiff<Flex>>(out);
        }
    }
    if let Ok(p) = x.clone().try_into_primitive::<Flex>()
        && let Some(input) = contiguous_f32(&p)
        && let Some(xs) = input.as_slice::<f32>()
    {
        return Tensor::from_primitive::<Flex>(flex(forward_values(xs), &shape));
    }
    burn::tensor::activation::gelu(x)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;
    use crate::seq::tests::noise;
    use burn::tensor::{Device, TensorData};

    #[test]
    fn exp_is_within_3e_7_of_libm_relatively() {
        let worst = (0..=86_900)
            .map(|i| -(i as f32) * 1e-3)
            .map(|x| ((exp_nonpositive(x) - libm::expf(x)) / libm::expf(x)).abs())
            .fold(0f32, f32::max);
        assert!(worst < 3e-7, "largest relative difference {worst:e}");
        // Below -87 (clamped there): e^-87 at most, which no gradient notices.
        assert!(exp_nonpositive(-1000.0) < 2e-38);
    }

    #[test]
    fn erf_is_within_1e_6_of_libm() {
        let worst = (-60_000..=60_000)
            .map(|i| i as f32 * 1e-4)
            .map(|x| (erf(x) - libm::erff(x)).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-6, "largest difference {worst:e}");
    }

    /// Values and gradients of `loss = Σ gelu(x)·r` against burn's GELU.
    #[test]
    fn gelu_and_its_gradient_match_burns() {
        let device = Device::flex().autodiff();
        let n = 3 * 50_000;
        let x = || {
            let v: Vec<f32> = noise(n, 5).into_iter().map(|v| v * 6.0).collect();
            Tensor::<2>::from_data(TensorData::new(v, [3, n / 3]), &device).require_grad()
        };
        let r = Tensor::<2>::from_data(TensorData::new(noise(n, 9), [3, n / 3]), &device);
        let run = |custom: bool| {
            let x = x();
            let y = match custom {
                true => gelu(x.clone()),
                false => burn::tensor::activation::gelu(x.clone()),
            };
            let grads = (y.clone() * r.clone()).sum().backward();
            let dx: Vec<f32> = x.grad(&grads).unwrap().into_data().try_into_vec().unwrap();
            let y: Vec<f32> = y.into_data().try_into_vec().unwrap();
            (y, dx)
        };
        let (mine, theirs) = (run(true), run(false));
        for (what, a, b) in [("y", &mine.0, &theirs.0), ("dx", &mine.1, &theirs.1)] {
            let worst = a
                .iter()
                .zip(b)
                .map(|(p, q)| (p - q).abs())
                .fold(0f32, f32::max);
            assert!(worst < 2e-6, "{what}: largest difference {worst:e}");
        }
    }
}
