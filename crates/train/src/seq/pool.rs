//! 2-D max pooling as a custom autodiff op on the Flex (CPU) backend.
//!
//! burn-flex pools through a general 3-D kernel with indices (7 % of a cnn-leaf epoch); this
//! op keeps, per output, the offset of its window's maximum inside the input plane and
//! scatters the output gradient there. Ties go to the first maximum in row-major window
//! order and NaN wins, as in PyTorch. Planes are independent, so the parallel cut changes
//! no bits. Padding (torchvision's ResNet stem) is -inf, so padded places never win. Pools
//! this op does not cover (uneven padding, dilation, ceil mode, another backend or dtype) go
//! through burn's `MaxPool2d::forward`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, Flex};
use burn::nn::PaddingConfig2d;
use burn::nn::pool::MaxPool2d;
use burn::tensor::Tensor;
use rayon::prelude::*;

use super::affine::{AdTensor, contiguous_f32, flex, values};

/// Planes per parallel task.
const PLANES_PER_TASK: usize = 16;

/// `pool.forward(x)`, with the custom op where it applies.
pub(crate) fn forward(pool: &MaxPool2d, x: Tensor<4>) -> Tensor<4> {
    match try_forward(pool, &x) {
        Some(y) => y,
        None => pool.forward(x),
    }
}

fn try_forward(pool: &MaxPool2d, x: &Tensor<4>) -> Option<Tensor<4>> {
    let g = Geom::new(pool, x.dims())?;
    if let Ok(xp) = x.clone().try_into_primitive::<Autodiff<Flex>>() {
        return forward_autodiff(xp, g).map(Tensor::from_primitive::<Autodiff<Flex>>);
    }
    let xp = x.clone().try_into_primitive::<Flex>().ok()?;
    let x = contiguous_f32(&xp)?;
    let (y, _) = pool_forward(values(&x, g.x_len())?, &g);
    Some(Tensor::from_primitive::<Flex>(flex(
        y,
        &[g.batch, g.c, g.ho, g.wo],
    )))
}

/// Sizes of one pooling; all in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geom {
    batch: usize,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    /// Padding above and below, left and right.
    ph: usize,
    pw: usize,
    ho: usize,
    wo: usize,
}

impl Geom {
    fn new(pool: &MaxPool2d, [batch, c, h, w]: [usize; 4]) -> Option<Self> {
        let [kh, kw] = pool.kernel_size;
        let [sh, sw] = pool.stride;
        let (ph, pw) = match pool.padding {
            PaddingConfig2d::Valid => (0, 0),
            PaddingConfig2d::Explicit(t, l, b, r) if t == b && l == r => (t, l),
            PaddingConfig2d::Explicit(..) | PaddingConfig2d::Same => return None,
        };
        let supported = pool.dilation == [1, 1]
            && !pool.ceil_mode
            && kh > 0
            && kw > 0
            && sh > 0
            && sw > 0
            // Every window holds a real value.
            && ph <= kh / 2
            && pw <= kw / 2
            && h + 2 * ph >= kh
            && w + 2 * pw >= kw
            // Offsets in a plane are kept as u32.
            && h.checked_mul(w).is_some_and(|n| n <= u32::MAX as usize);
        supported.then(|| Self {
            batch,
            c,
            h,
            w,
            kh,
            kw,
            sh,
            sw,
            ph,
            pw,
            ho: (h + 2 * ph - kh) / sh + 1,
            wo: (w + 2 * pw - kw) / sw + 1,
        })
    }

    fn planes(&self) -> usize {
        self.batch * self.c
    }

    fn x_len(&self) -> usize {
        self.planes() * self.h * self.w
    }

    fn y_len(&self) -> usize {
        self.planes() * self.ho * self.wo
    }
}

/// The maxima `[batch, c, ho, wo]` and, per output, its maximum's offset in its input plane.
fn pool_forward(x: &[f32], g: &Geom) -> (Vec<f32>, Vec<u32>) {
    let (plane_in, plane_out) = (g.h * g.w, g.ho * g.wo);
    let mut y = vec![0f32; g.y_len()];
    let mut at = vec![0u32; g.y_len()];
    let tasks = x
        .par_chunks(PLANES_PER_TASK * plane_in)
        .zip(y.par_chunks_mut(PLANES_PER_TASK * plane_out))
        .zip(at.par_chunks_mut(PLANES_PER_TASK * plane_out));
    tasks.for_each(|((x, y), at)| {
        let planes = x
            .chunks_exact(plane_in)
            .zip(y.chunks_exact_mut(plane_out))
            .zip(at.chunks_exact_mut(plane_out));
        for ((x, y), at) in planes {
            if (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw) == (2, 2, 2, 2, 0, 0) {
                pool_2x2(x, g, y, at);
                continue;
            }
            for oy in 0..g.ho {
                // The window's rows and columns inside the plane (padding is never a maximum).
                let top = (oy * g.sh).saturating_sub(g.ph);
                let bottom = (oy * g.sh + g.kh - g.ph).min(g.h);
                for ox in 0..g.wo {
                    let left = (ox * g.sw).saturating_sub(g.pw);
                    let right = (ox * g.sw + g.kw - g.pw).min(g.w);
                    let (mut best, mut best_at) = (f32::NEG_INFINITY, None);
                    for iy in top..bottom {
                        let row = iy * g.w;
                        for (ix, &v) in x[row + left..row + right].iter().enumerate() {
                            if best_at.is_none() || beats(v, best) {
                                (best, best_at) = (v, Some(row + left + ix));
                            }
                        }
                    }
                    let o = oy * g.wo + ox;
                    y[o] = best;
                    // Fits: `Geom::new` refuses planes of more than u32::MAX values.
                    at[o] = best_at.unwrap_or(0) as u32;
                }
            }
        }
    });
    (y, at)
}

/// Whether `v` replaces the window's maximum so far `best`: larger, or the first NaN.
#[inline(always)]
fn beats(v: f32, best: f32) -> bool {
    v > best || (v.is_nan() && !best.is_nan())
}

/// [`pool_forward`] of one plane for the usual 2x2 window with stride 2, unrolled (the
/// general loop's per-value bookkeeping cost more than the comparisons); the same rule.
fn pool_2x2(x: &[f32], g: &Geom, y: &mut [f32], at: &mut [u32]) {
    let rows = y.chunks_exact_mut(g.wo).zip(at.chunks_exact_mut(g.wo));
    for (oy, (y, at)) in rows.enumerate() {
        let top = 2 * oy * g.w;
        let (r0, r1) = (&x[top..][..2 * g.wo], &x[top + g.w..][..2 * g.wo]);
        let windows = r0.chunks_exact(2).zip(r1.chunks_exact(2));
        for (ox, ((a, b), (y, at))) in windows.zip(y.iter_mut().zip(at)).enumerate() {
            let c = top + 2 * ox;
            let (mut best, mut best_at) = (a[0], c);
            for (v, i) in [(a[1], c + 1), (b[0], c + g.w), (b[1], c + g.w + 1)] {
                if beats(v, best) {
                    (best, best_at) = (v, i);
                }
            }
            *y = best;
            // Fits: `Geom::new` refuses planes of more than u32::MAX values.
            *at = best_at as u32;
        }
    }
}

/// The input gradient: each output's gradient added at its maximum.
fn pool_backward(dy: &[f32], at: &[u32], g: &Geom) -> Vec<f32> {
    let (plane_in, plane_out) = (g.h * g.w, g.ho * g.wo);
    let mut dx = vec![0f32; g.x_len()];
    dx.par_chunks_mut(PLANES_PER_TASK * plane_in)
        .zip(dy.par_chunks(PLANES_PER_TASK * plane_out))
        .zip(at.par_chunks(PLANES_PER_TASK * plane_out))
        .for_each(|((dx, dy), at)| {
            let planes = dx
                .chunks_exact_mut(plane_in)
                .zip(dy.chunks_exact(plane_out))
                .zip(at.chunks_exact(plane_out));
            for ((dx, dy), at) in planes {
                for (&d, &i) in dy.iter().zip(at) {
                    dx[i as usize] += d;
                }
            }
        });
    dx
}

/// What the backward pass needs: where each maximum was.
#[derive(Clone, Debug)]
struct PoolState {
    at: Vec<u32>,
    geom: Geom,
}

#[derive(Debug)]
struct MaxPoolBackward;

impl Backward<Flex, 1> for MaxPoolBackward {
    type State = PoolState;

    fn backward(self, ops: Ops<PoolState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<Flex>(&ops.node);
        let Some(node) = node_x else { return };
        let g = &ops.state.geom;
        let dy = contiguous_f32(&dy);
        let Some(dy) = dy.as_ref().and_then(|dy| values(dy, g.y_len())) else {
            panic!("max_pool2d backward: gradient does not match the forward geometry {g:?}");
        };
        let dx = pool_backward(dy, &ops.state.at, g);
        grads.register::<Flex>(node.id, flex(dx, &[g.batch, g.c, g.h, g.w]));
    }
}

fn forward_autodiff(x: AdTensor, g: Geom) -> Option<AdTensor> {
    let (x, x_node) = x.into_parts();
    let x = contiguous_f32(&x)?;
    let (y, at) = pool_forward(values(&x, g.x_len())?, &g);
    let y = flex(y, &[g.batch, g.c, g.ho, g.wo]);
    Some(
        match MaxPoolBackward
            .prepare::<NoCheckpointing>([x_node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(PoolState { at, geom: g }, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use crate::seq::tests::noise;
    use burn::nn::PaddingConfig2d;
    use burn::nn::pool::MaxPool2dConfig;
    use burn::tensor::{Device, Tensor, TensorData};

    /// Output and input gradient of `Σ pool(x)·r`, by this op or burn's.
    fn run(shape: [usize; 4], k: usize, s: usize, p: usize, custom: bool) -> (Vec<f32>, Vec<f32>) {
        let device = Device::flex().autodiff();
        let pool = MaxPool2dConfig::new([k, k])
            .with_strides([s, s])
            .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
            .init();
        let x = Tensor::<4>::from_data(
            TensorData::new(noise(shape.iter().product(), 3), shape),
            &device,
        )
        .require_grad();
        let y = match custom {
            true => super::try_forward(&pool, &x).expect("custom op applies"),
            false => pool.forward(x.clone()),
        };
        let dims = y.dims();
        let r = Tensor::<4>::from_data(
            TensorData::new(noise(dims.iter().product(), 5), dims),
            &device,
        );
        let grads = (y.clone() * r).sum().backward();
        let dx = x.grad(&grads).expect("x grad");
        (
            y.into_data().try_to_vec::<f32>().unwrap(),
            dx.into_data().try_to_vec::<f32>().unwrap(),
        )
    }

    #[test]
    fn max_pool_matches_burn() {
        // 2x2/2 (the zoo's), an odd size that drops a border, overlapping 3x3/2 windows, more
        // planes than one task holds, and torchvision's padded 3x3/2 stem pool.
        for (shape, k, s, p) in [
            ([2, 3, 8, 8], 2, 2, 0),
            ([3, 2, 7, 9], 2, 2, 0),
            ([2, 2, 9, 9], 3, 2, 0),
            ([3, 7, 6, 6], 2, 2, 0),
            ([2, 3, 7, 8], 3, 2, 1),
            ([1, 2, 5, 5], 2, 1, 1),
        ] {
            let ours = run(shape, k, s, p, true);
            assert_eq!(ours, run(shape, k, s, p, false), "{shape:?} k{k} s{s} p{p}");
        }
    }

    #[test]
    fn padding_never_wins() {
        // Negative values all round: zero padding would give 0 at every border output.
        let g = super::Geom {
            h: 3,
            w: 3,
            kh: 3,
            kw: 3,
            ph: 1,
            pw: 1,
            ho: 2,
            wo: 2,
            ..geom()
        };
        let x: Vec<f32> = (1..=9).map(|v| -(v as f32)).collect();
        let (y, at) = super::pool_forward(&x, &g);
        // Windows at rows/columns -1..=1 and 1..=3 (clipped to 2): their top-left values.
        assert_eq!(y, vec![-1.0, -2.0, -4.0, -5.0]);
        assert_eq!(at, vec![0, 1, 3, 4]);
    }

    #[test]
    fn ties_go_to_the_first_maximum_and_nan_wins() {
        let device = Device::flex();
        let pool = MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init();
        let x = Tensor::<4>::from_data(
            TensorData::new(
                vec![1.0, 1.0, 0.5, 1.0, f32::NAN, 2.0, 3.0, 4.0],
                [1, 2, 2, 2],
            ),
            &device,
        );
        let y: Vec<f32> = super::try_forward(&pool, &x)
            .unwrap()
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(y[0], 1.0);
        assert!(y[1].is_nan());
        let (_, at) = super::pool_forward(&[1.0, 1.0, 0.5, 1.0], &geom());
        assert_eq!(at, vec![0]);
        // Two windows side by side, rows [1, NaN, 2, 7] and [NaN, 5, 7, 3]: the first NaN
        // (offset 1) wins its window; 7 ties with 7 and the first (offset 3) keeps it.
        let g = super::Geom {
            w: 4,
            wo: 2,
            ..geom()
        };
        let (y, at) = super::pool_forward(&[1.0, f32::NAN, 2.0, 7.0, f32::NAN, 5.0, 7.0, 3.0], &g);
        assert!(y[0].is_nan());
        assert_eq!((y[1], at), (7.0, vec![1, 3]));
    }

    fn geom() -> super::Geom {
        super::Geom {
            batch: 1,
            c: 1,
            h: 2,
            w: 2,
            kh: 2,
            kw: 2,
            sh: 2,
            sw: 2,
            ph: 0,
            pw: 0,
            ho: 1,
            wo: 1,
        }
    }
}
