//! 2-D convolution as a custom autodiff op on the Flex (CPU) backend.
//!
//! burn-flex's own conv2d moves most of its time in data reshuffling: an NHWC transpose of
//! the input, per-call temporaries, a weight gradient computed as a convolution of swapped
//! views (tiny GEMMs that re-pack the output gradient once per input channel) and a scalar
//! col2im (see the profile behind this module). This op works on contiguous NCHW `f32`:
//!
//! - forward, per sample and group: im2col (`col[C_in/g·k·k, Ho·Wo]`, built row by row with
//!   slice copies and zeroed borders), then `W·col` written straight into the output;
//! - weight gradient: `dW += dY·colᵀ`, accumulated by the GEMM over the samples;
//! - input gradient: `col = Wᵀ·dY`, then a row-wise col2im add;
//! - bias gradient: per-channel sums of `dY`.
//!
//! Batching several samples into one wider GEMM (for the 8×8 maps) measured slower than
//! per-sample GEMMs: the gathers and the larger `col` cost more than the packing they save.
//!
//! The batch is cut into tasks of [`SAMPLES_PER_TASK`] samples that rayon runs in parallel
//! (a client uses the cores the other clients of its round leave free); each GEMM runs on its
//! task's thread (`gemm::Parallelism::None`). The cut does not depend on the number of
//! threads, and the weight gradient's per-task sums are added in task order, so every thread
//! count gives the same bits.
//!
//! Layers this op does not cover (another backend, a checkpointing autodiff device, a dtype
//! other than `f32`, dilation, `Same` padding) go through burn's `Conv2d::forward`.

use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;
use burn::tensor::Tensor;
use fedfuse_core::linalg::{Mat, matmul};
use rayon::prelude::*;

use super::affine::{self, AdTensor, AffineState, Grads, contiguous_f32, flex, values};
use super::kernels::{lane_sum, with_kept};
use super::winograd;

/// `conv.forward(x)` for fedfuse's layers, with the custom op where it applies.
pub(crate) fn forward(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    match try_forward(conv, &x) {
        Some(y) => y,
        None => conv.forward(x),
    }
}

/// The custom op's output, or `None` where it does not apply.
fn try_forward(conv: &Conv2d, x: &Tensor<4>) -> Option<Tensor<4>> {
    let geom = Geom::new(conv, x.dims())?;
    let weight = conv.weight.val();
    let bias = conv.bias.as_ref().map(|b| b.val());
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
        if let Some(out) = forward_autodiff(xp, wp, bp, geom) {
            return Some(Tensor::from_primitive::<Autodiff<Flex>>(out));
        }
    } else {
        let plain = (
            x.clone().try_into_primitive::<Flex>(),
            weight.try_into_primitive::<Flex>(),
            bias.map(|b| b.try_into_primitive::<Flex>()).transpose(),
        );
        if let (Ok(xp), Ok(wp), Ok(bp)) = plain
            && let Some(out) = forward_plain(&xp, &wp, bp.as_ref(), &geom)
        {
            return Some(Tensor::from_primitive::<Flex>(out));
        }
    }
    None
}

/// Sizes of one convolution; all in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geom {
    batch: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    groups: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    /// Top and left padding (bottom and right only enter through `ho` and `wo`).
    pt: usize,
    pl: usize,
    ho: usize,
    wo: usize,
}

impl Geom {
    /// The geometry of `conv` on an input of `dims`, or `None` where the op does not apply
    /// (dilation, `Same` padding, inconsistent channels, an empty output).
    fn new(conv: &Conv2d, dims: [usize; 4]) -> Option<Self> {
        let [batch, c_in, h, w] = dims;
        let [c_out, c_in_group, kh, kw] = conv.weight.dims();
        let [sh, sw] = conv.stride;
        let groups = conv.groups;
        let (pt, pl, pb, pr) = match conv.padding {
            PaddingConfig2d::Explicit(top, left, bottom, right) => (top, left, bottom, right),
            PaddingConfig2d::Valid => (0, 0, 0, 0),
            PaddingConfig2d::Same => return None,
        };
        let supported = conv.dilation == [1, 1]
            && groups > 0
            && c_in == c_in_group * groups
            && c_out % groups == 0
            && sh > 0
            && sw > 0
            && kh > 0
            && kw > 0
            && h + pt + pb >= kh
            && w + pl + pr >= kw;
        supported.then(|| Self {
            batch,
            c_in,
            h,
            w,
            c_out,
            groups,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
            ho: (h + pt + pb - kh) / sh + 1,
            wo: (w + pl + pr - kw) / sw + 1,
        })
    }

    /// Input channels per group.
    fn cg(&self) -> usize {
        self.c_in / self.groups
    }

    /// Output channels per group.
    fn og(&self) -> usize {
        self.c_out / self.groups
    }

    /// Rows of `col` (the GEMM's inner dimension): input channels per group × kernel taps.
    fn taps(&self) -> usize {
        self.cg() * self.kh * self.kw
    }

    /// Output pixels per channel.
    fn pixels(&self) -> usize {
        self.ho * self.wo
    }

    /// The Winograd shape of a 3×3 or 5×5 stride-1 convolution without groups, where it pays.
    fn winograd(&self) -> Option<winograd::Shape> {
        let s = winograd::Shape {
            k: self.kh,
            c_in: self.c_in,
            c_out: self.c_out,
            h: self.h,
            w: self.w,
            ho: self.ho,
            wo: self.wo,
            pt: self.pt,
            pl: self.pl,
        };
        let fits = matches!(self.kh, 3 | 5)
            && (self.kw, self.sh, self.sw, self.groups) == (self.kh, 1, 1, 1);
        (fits && s.worth_it()).then_some(s)
    }

    fn x_len(&self) -> usize {
        self.batch * self.c_in * self.h * self.w
    }

    fn w_len(&self) -> usize {
        self.c_out * self.taps()
    }

    fn y_len(&self) -> usize {
        self.batch * self.c_out * self.pixels()
    }

    /// The output columns `lo..hi` whose input column `ox·sw + kx − pl` lies inside the row.
    fn valid_cols(&self, kx: usize) -> (usize, usize) {
        let lo = if kx >= self.pl {
            0
        } else {
            (self.pl - kx).div_ceil(self.sw)
        };
        let hi = if self.w + self.pl <= kx {
            0
        } else {
            ((self.w - 1 + self.pl - kx) / self.sw + 1).min(self.wo)
        };
        (lo.min(hi), hi)
    }

    /// The input row read by output row `oy` at kernel row `ky`, if inside the image.
    fn input_row(&self, oy: usize, ky: usize) -> Option<usize> {
        (oy * self.sh + ky)
            .checked_sub(self.pt)
            .filter(|&iy| iy < self.h)
    }
}

/// The eval path: a plain forward on Flex tensors.
fn forward_plain(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    g: &Geom,
) -> Option<FlexTensor> {
    let (x, w) = (contiguous_f32(x)?, contiguous_f32(w)?);
    let b = match b {
        Some(b) => Some(contiguous_f32(b)?),
        None => None,
    };
    let bias = match &b {
        Some(b) => Some(values(b, g.c_out)?),
        None => None,
    };
    let y = conv_forward(values(&x, g.x_len())?, values(&w, g.w_len())?, bias, g);
    Some(flex(y, &[g.batch, g.c_out, g.ho, g.wo]))
}

/// What the backward pass needs: the op's inputs (kept, as burn's conv keeps them without
/// checkpointing) and its geometry.
#[derive(Clone, Debug)]
struct ConvState {
    x: FlexTensor,
    w: FlexTensor,
    geom: Geom,
}

/// The gradients asked for by `need` (`[x, weight, bias]`) from the output gradient `dy`.
///
/// # Panics
///
/// The forward pass checked the sizes of `x` and `w` and the graph gives `dy` the output's
/// shape; a mismatch (a broken invariant of burn's autodiff) panics rather than computing
/// garbage.
impl AffineState for ConvState {
    fn gradients(&self, dy: &FlexTensor, need: [bool; 3]) -> Grads {
        gradients(self, dy, need)
    }
}

fn gradients(s: &ConvState, dy: &FlexTensor, need: [bool; 3]) -> Grads {
    let g = &s.geom;
    let slices = contiguous_f32(dy).and_then(|dy| {
        let ok = values(&dy, g.y_len()).is_some()
            && values(&s.x, g.x_len()).is_some()
            && values(&s.w, g.w_len()).is_some();
        ok.then_some(dy)
    });
    let Some(dy) = slices else {
        panic!(
            "conv2d backward: gradient {:?} does not match the forward geometry {g:?}",
            dy.layout().shape()
        );
    };
    // Checked just above.
    let dy = values(&dy, g.y_len()).unwrap_or_default();
    let x = values(&s.x, g.x_len()).unwrap_or_default();
    let w = values(&s.w, g.w_len()).unwrap_or_default();
    let [need_x, need_w, need_b] = need;
    let (dx, dw) = conv_backward(x, w, dy, g, need_x, need_w);
    let db = need_b.then(|| flex(bias_grad(dy, g), &[g.c_out]));
    (
        dx.map(|dx| flex(dx, &[g.batch, g.c_in, g.h, g.w])),
        dw.map(|dw| flex(dw, &[g.c_out, g.cg(), g.kh, g.kw])),
        db,
    )
}

/// The autodiff path: computes the output and records the backward step.
fn forward_autodiff(x: AdTensor, w: AdTensor, b: Option<AdTensor>, g: Geom) -> Option<AdTensor> {
    let (x, w, b, nodes) = affine::inputs(x, w, b)?;
    let bias = match &b {
        Some(b) => Some(values(b, g.c_out)?),
        None => None,
    };
    let y = conv_forward(values(&x, g.x_len())?, values(&w, g.w_len())?, bias, &g);
    let y = flex(y, &[g.batch, g.c_out, g.ho, g.wo]);
    Some(nodes.record(ConvState { x, w, geom: g }, y))
}

/// im2col of one sample's group `x` (`[cg, h, w]`) into `col` (`[taps, pixels]`, row-major).
fn im2col(x: &[f32], g: &Geom, col: &mut [f32]) {
    if g.sh == 1 && g.sw == 1 && g.wo == g.w {
        return im2col_shifted(x, g, col);
    }
    let (h, w, wo) = (g.h, g.w, g.wo);
    for c in 0..g.cg() {
        let plane = &x[c * h * w..][..h * w];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let r = (c * g.kh + ky) * g.kw + kx;
                let row = &mut col[r * g.pixels()..][..g.pixels()];
                let (lo, hi) = g.valid_cols(kx);
                for (oy, out) in row.chunks_exact_mut(wo).enumerate() {
                    let Some(iy) = g.input_row(oy, ky) else {
                        out.fill(0.0);
                        continue;
                    };
                    out[..lo].fill(0.0);
                    out[hi..].fill(0.0);
                    if lo == hi {
                        continue;
                    }
                    // Input column of output column `lo` (≥ 0 by the choice of `lo`).
                    let start = lo * g.sw + kx - g.pl;
                    let src = &plane[iy * w..][..w];
                    if g.sw == 1 {
                        out[lo..hi].copy_from_slice(&src[start..][..hi - lo]);
                    } else {
                        for (o, &v) in out[lo..hi]
                            .iter_mut()
                            .zip(src[start..].iter().step_by(g.sw))
                        {
                            *o = v;
                        }
                    }
                }
            }
        }
    }
}

/// One kernel tap of a "same" convolution (stride 1, output rows as long as input rows), as
/// a span of its `col` row: output pixel `i` reads input value `i + shift`.
struct ShiftedTap {
    /// The tap's row in `col`.
    row: usize,
    /// The valid outputs' span `first..last` in the row, and the input index of `first`.
    first: usize,
    last: usize,
    src: usize,
    /// Output rows `oy_lo..oy_hi` and columns `lo..hi` are valid; the rest of each such row
    /// wrapped into a neighbouring row.
    oy_lo: usize,
    oy_hi: usize,
    lo: usize,
    hi: usize,
}

impl ShiftedTap {
    /// The tap of channel `c` at `(ky, kx)`, or its row index alone (`Err`) when no output
    /// sees the input.
    fn new(g: &Geom, c: usize, ky: usize, kx: usize) -> Result<Self, usize> {
        let row = (c * g.kh + ky) * g.kw + kx;
        // Output rows whose input row `oy + ky - pt` lies inside the plane.
        let oy_lo = g.pt.saturating_sub(ky).min(g.ho);
        let oy_hi = (g.h + g.pt).saturating_sub(ky).clamp(oy_lo, g.ho);
        let (lo, hi) = g.valid_cols(kx);
        if oy_lo == oy_hi || lo == hi {
            return Err(row);
        }
        let w = g.w;
        Ok(Self {
            row,
            first: oy_lo * w + lo,
            last: (oy_hi - 1) * w + hi,
            // `iy·w + ix` of the first valid output, both ≥ 0 by the choice of the bounds.
            src: (oy_lo + ky - g.pt) * w + lo + kx - g.pl,
            oy_lo,
            oy_hi,
            lo,
            hi,
        })
    }

    /// Zeros the values of `row` that wrapped into a neighbouring row.
    fn zero_wrapped(&self, row: &mut [f32], w: usize) {
        for out in row[self.oy_lo * w..self.oy_hi * w].chunks_exact_mut(w) {
            out[..self.lo].fill(0.0);
            out[self.hi..].fill(0.0);
        }
    }
}

/// The taps of a "same" convolution, channel by channel.
fn shifted_taps(g: &Geom) -> impl Iterator<Item = (usize, Result<ShiftedTap, usize>)> + '_ {
    (0..g.cg()).flat_map(move |c| {
        (0..g.kh * g.kw).map(move |t| (c, ShiftedTap::new(g, c, t / g.kw, t % g.kw)))
    })
}

/// [`im2col`] where output rows are as long as input rows and the strides are 1 (a "same"
/// convolution): each tap's row is one copy of the plane's valid span, then zeros where a row
/// wrapped into its neighbour. Copying row by row cost a library call per row (8 to 32 values
/// in ResNet-20).
fn im2col_shifted(x: &[f32], g: &Geom, col: &mut [f32]) {
    let (plane_len, pixels) = (g.h * g.w, g.pixels());
    for (c, tap) in shifted_taps(g) {
        let plane = &x[c * plane_len..][..plane_len];
        match tap {
            Err(r) => col[r * pixels..][..pixels].fill(0.0),
            Ok(t) => {
                let row = &mut col[t.row * pixels..][..pixels];
                row[..t.first].fill(0.0);
                row[t.first..t.last].copy_from_slice(&plane[t.src..][..t.last - t.first]);
                row[t.last..].fill(0.0);
                t.zero_wrapped(row, g.w);
            }
        }
    }
}

/// [`col2im_add`] for the convolutions of [`im2col_shifted`]: each tap's row is added as one
/// span, after zeroing the values that wrapped into a neighbouring row.
fn col2im_add_shifted(col: &mut [f32], g: &Geom, dx: &mut [f32]) {
    let (plane_len, pixels) = (g.h * g.w, g.pixels());
    for (c, tap) in shifted_taps(g) {
        let Ok(t) = tap else { continue };
        let plane = &mut dx[c * plane_len..][..plane_len];
        let row = &mut col[t.row * pixels..][..pixels];
        t.zero_wrapped(row, g.w);
        for (d, &v) in plane[t.src..][..t.last - t.first]
            .iter_mut()
            .zip(&row[t.first..t.last])
        {
            *d += v;
        }
    }
}

/// col2im: adds `col` (`[taps, pixels]`) into one sample's group gradient `dx`
/// (`[cg, h, w]`); the transpose of [`im2col`]. `col` is scratch: the shifted path zeroes
/// its wrapped columns.
fn col2im_add(col: &mut [f32], g: &Geom, dx: &mut [f32]) {
    if g.sh == 1 && g.sw == 1 && g.wo == g.w {
        return col2im_add_shifted(col, g, dx);
    }
    let (h, w, wo) = (g.h, g.w, g.wo);
    for c in 0..g.cg() {
        let plane = &mut dx[c * h * w..][..h * w];
        for ky in 0..g.kh {
            for kx in 0..g.kw {
                let r = (c * g.kh + ky) * g.kw + kx;
                let row = &col[r * g.pixels()..][..g.pixels()];
                let (lo, hi) = g.valid_cols(kx);
                if lo == hi {
                    continue;
                }
                let start = lo * g.sw + kx - g.pl;
                for (oy, src) in row.chunks_exact(wo).enumerate() {
                    let Some(iy) = g.input_row(oy, ky) else {
                        continue;
                    };
                    let dst = &mut plane[iy * w..][..w];
                    if g.sw == 1 {
                        for (d, &v) in dst[start..][..hi - lo].iter_mut().zip(&src[lo..hi]) {
                            *d += v;
                        }
                    } else {
                        for (d, &v) in dst[start..].iter_mut().step_by(g.sw).zip(&src[lo..hi]) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// Samples per parallel task. Fixed, so that the weight gradient's partial sums (one per
/// task, added in task order) and hence the results do not depend on the number of threads.
pub(crate) const SAMPLES_PER_TASK: usize = 8;

/// The output `[batch, c_out, ho, wo]` of `x` (`[batch, c_in, h, w]`), `w`
/// (`[c_out, cg, kh, kw]`) and an optional bias, all contiguous.
fn conv_forward(x: &[f32], w: &[f32], bias: Option<&[f32]>, g: &Geom) -> Vec<f32> {
    let (taps, pixels, og) = (g.taps(), g.pixels(), g.og());
    let x_group = g.cg() * g.h * g.w;
    let mut y = vec![0f32; g.y_len()];
    let x_tasks = x.par_chunks(SAMPLES_PER_TASK * g.c_in * g.h * g.w);
    let y_tasks = y.par_chunks_mut(SAMPLES_PER_TASK * g.c_out * pixels);
    if let Some(s) = g.winograd() {
        let u = winograd::weights(w, &s);
        x_tasks
            .zip(y_tasks)
            .for_each(|(x, y)| winograd::forward_task(x, &u, bias, &s, y));
        return y;
    }
    // Each task: per sample and group, im2col, then W·col straight into the output block,
    // which is a row-major [og, pixels] matrix.
    x_tasks.zip(y_tasks).for_each(|(x, y)| {
        with_col(taps * pixels, |col| {
            let blocks = x.chunks_exact(x_group).zip(y.chunks_exact_mut(og * pixels));
            for (gi, (xs, ys)) in (0..g.groups).cycle().zip(blocks) {
                im2col(xs, g, col);
                let wg = Mat::rows(&w[gi * og * taps..][..og * taps], og, taps, taps);
                let cols = Mat::rows(col, taps, pixels, pixels);
                matmul(ys, (pixels, 1), wg, cols, false);
            }
        });
        if let Some(bias) = bias {
            for (row, &b) in y.chunks_exact_mut(pixels).zip(bias.iter().cycle()) {
                for v in row {
                    *v += b;
                }
            }
        }
    });
    y
}

/// The gradients of `x` and `w` (when asked for) from the output gradient `dy`.
fn conv_backward(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    g: &Geom,
    need_x: bool,
    need_w: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    if !need_x && !need_w {
        return (None, None);
    }
    let (x_task, y_task) = (
        SAMPLES_PER_TASK * g.c_in * g.h * g.w,
        SAMPLES_PER_TASK * g.c_out * g.pixels(),
    );
    let mut dx = need_x.then(|| vec![0f32; g.x_len()]);
    let dx_tasks: Vec<Option<&mut [f32]>> = match dx.as_deref_mut() {
        Some(dx) => dx.chunks_mut(x_task).map(Some).collect(),
        None => (0..g.batch.div_ceil(SAMPLES_PER_TASK))
            .map(|_| None)
            .collect(),
    };
    let tasks = dx_tasks
        .into_par_iter()
        .zip(x.par_chunks(x_task))
        .zip(dy.par_chunks(y_task));
    // The tasks' partial weight gradients, added in task order.
    let task_sum = |partial: Vec<Option<Vec<f32>>>, len: usize| {
        let mut sum = vec![0f32; len];
        for p in partial.iter().flatten() {
            for (s, v) in sum.iter_mut().zip(p) {
                *s += v;
            }
        }
        sum
    };
    if let Some(s) = g.winograd() {
        let u = match need_x {
            true => winograd::weights(w, &s),
            false => Vec::new(),
        };
        let partial: Vec<Option<Vec<f32>>> = tasks
            .map(|((dx, x), dy)| winograd::backward_task(x, &u, dy, &s, dx, need_w))
            .collect();
        let dw = need_w
            .then(|| winograd::weight_grad(&task_sum(partial, winograd::transformed_len(&s)), &s));
        return (dx, dw);
    }
    let partial: Vec<Option<Vec<f32>>> = tasks
        .map(|((dx, x), dy)| backward_task(x, w, dy, g, dx, need_w))
        .collect();
    let dw = need_w.then(|| {
        // Back to `[c_out, cg, kh, kw]`.
        let sum = task_sum(partial, g.w_len());
        let (taps, og) = (g.taps(), g.og());
        let mut dw = vec![0f32; g.w_len()];
        for (block_t, block) in sum
            .chunks_exact(og * taps)
            .zip(dw.chunks_exact_mut(og * taps))
        {
            for (t, row) in block_t.chunks_exact(og).enumerate() {
                for (o, &v) in row.iter().enumerate() {
                    block[o * taps + t] = v;
                }
            }
        }
        dw
    });
    (dx, dw)
}

/// One task's share of [`conv_backward`]: its samples' input gradient written into `dx` (when
/// given), and their weight gradient summed (when `need_w`) column-major per group
/// (`[groups][taps, og]`): gemm then packs the small `dY` block rather than the
/// `taps × pixels` col of every sample.
fn backward_task(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    g: &Geom,
    mut dx: Option<&mut [f32]>,
    need_w: bool,
) -> Option<Vec<f32>> {
    let (taps, pixels, og) = (g.taps(), g.pixels(), g.og());
    let x_group = g.cg() * g.h * g.w;
    let mut dw_t = need_w.then(|| vec![0f32; g.w_len()]);
    // im2col of x for dW, then reused for Wᵀ·dY before col2im.
    with_col(taps * pixels, |col| {
        for (i, dys) in dy.chunks_exact(og * pixels).enumerate() {
            // Block i is sample i / groups, group i % groups, in x, dx and dy alike.
            let gi = i % g.groups;
            let dys = Mat::rows(dys, og, pixels, pixels);
            if let Some(dw_t) = dw_t.as_deref_mut() {
                im2col(&x[i * x_group..][..x_group], g, col);
                let cols = Mat::rows(col, taps, pixels, pixels);
                let dwg = &mut dw_t[gi * og * taps..][..og * taps];
                matmul(dwg, (1, og), dys, cols.t(), true);
            }
            if let Some(dx) = dx.as_deref_mut() {
                let wg = Mat::rows(&w[gi * og * taps..][..og * taps], og, taps, taps);
                matmul(col, (pixels, 1), wg.t(), dys, false);
                col2im_add(col, g, &mut dx[i * x_group..][..x_group]);
            }
        }
    });
    dw_t
}

thread_local! {
    /// Each thread's `col` buffer, kept between calls: a fresh one per task was zeroed by the
    /// allocator (up to 1.2 MB for VGG-9) only to be overwritten.
    static COL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's `col` buffer of `len` values, whose contents are stale: every
/// user writes all of it first (im2col, or a GEMM without accumulation). `f` must not reach
/// another task of this module (no rayon calls inside), which would borrow it again.
fn with_col<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_kept(&COL, len, f)
}

/// Per-channel sums of `dy` (`[batch, c_out, pixels]`).
fn bias_grad(dy: &[f32], g: &Geom) -> Vec<f32> {
    let mut sums = vec![0f64; g.c_out];
    for (row, o) in dy.chunks_exact(g.pixels()).zip((0..g.c_out).cycle()) {
        sums[o] += f64::from(lane_sum(row));
    }
    sums.into_iter().map(|s| s as f32).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design
mod tests {
    use crate::seq::tests::noise;
    use burn::module::Param;
    use burn::nn::PaddingConfig2d;
    use burn::nn::conv::{Conv2d, Conv2dConfig};
    use burn::tensor::{Device, Tensor, TensorData};

    struct Case {
        batch: usize,
        c_in: usize,
        c_out: usize,
        hw: usize,
        k: usize,
        stride: usize,
        pad: usize,
        groups: usize,
        bias: bool,
    }

    fn layer(c: &Case, device: &Device, seed: u64) -> Conv2d {
        let mut conv = Conv2dConfig::new([c.c_in, c.c_out], [c.k, c.k])
            .with_stride([c.stride, c.stride])
            .with_padding(PaddingConfig2d::Explicit(c.pad, c.pad, c.pad, c.pad))
            .with_groups(c.groups)
            .with_bias(c.bias)
            .init(device);
        let shape = [c.c_out, c.c_in / c.groups, c.k, c.k];
        let n = shape.iter().product();
        conv.weight = Param::from_tensor(Tensor::from_data(
            TensorData::new(noise(n, seed), shape),
            device,
        ));
        conv.bias = c.bias.then(|| {
            Param::from_tensor(Tensor::from_data(
                TensorData::new(noise(c.c_out, seed + 1), [c.c_out]),
                device,
            ))
        });
        conv
    }

    fn assert_close(what: &str, ours: Tensor<1>, burn: Tensor<1>) {
        let ours: Vec<f32> = ours.into_data().try_to_vec().unwrap();
        let burn: Vec<f32> = burn.into_data().try_to_vec().unwrap();
        assert_eq!(ours.len(), burn.len(), "{what}: lengths");
        let scale = burn.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        for (i, (a, b)) in ours.iter().zip(&burn).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * scale,
                "{what}[{i}]: ours {a} vs burn {b} (scale {scale})"
            );
        }
    }

    /// Output and the gradients of x, weight and bias of `loss = Σ y·r`.
    fn run(c: &Case, custom: bool) -> (Tensor<1>, Tensor<1>, Tensor<1>, Option<Tensor<1>>) {
        let device = Device::flex().autodiff();
        let conv = layer(c, &device, 7);
        let shape = [c.batch, c.c_in, c.hw, c.hw];
        let n = shape.iter().product();
        let x = Tensor::<4>::from_data(TensorData::new(noise(n, 3), shape), &device).require_grad();
        let y = match custom {
            true => super::try_forward(&conv, &x).expect("custom op applies"),
            false => conv.forward(x.clone()),
        };
        let dims = y.dims();
        let r = Tensor::<4>::from_data(
            TensorData::new(noise(dims.iter().product(), 5), dims),
            &device,
        );
        let grads = (y.clone() * r).sum().backward();
        let flat = |t: Tensor<4>| t.flatten::<1>(0, 3);
        let dx = x.grad(&grads).expect("x grad");
        let dw = conv.weight.val().grad(&grads).expect("weight grad");
        let db = conv
            .bias
            .as_ref()
            .map(|b| b.val().grad(&grads).expect("bias grad"));
        (flat(y), dx.flatten(0, 3), dw.flatten(0, 3), db)
    }

    fn check(c: Case) {
        let (y, dx, dw, db) = run(&c, true);
        let (y0, dx0, dw0, db0) = run(&c, false);
        // Same inputs, same bits.
        let again = run(&c, true);
        assert_eq!(y.to_data(), again.0.to_data());
        assert_eq!(dx.to_data(), again.1.to_data());
        assert_eq!(dw.to_data(), again.2.to_data());
        assert_close("y", y, y0);
        assert_close("dx", dx, dx0);
        assert_close("dw", dw, dw0);
        match (db, db0) {
            (Some(db), Some(db0)) => assert_close("db", db, db0),
            (None, None) => {}
            _ => panic!("bias gradient on one side only"),
        }
    }

    fn case(batch: usize, c: [usize; 2], hw: usize, k: usize, stride: usize, pad: usize) -> Case {
        Case {
            batch,
            c_in: c[0],
            c_out: c[1],
            hw,
            k,
            stride,
            pad,
            groups: 1,
            bias: false,
        }
    }

    #[test]
    fn conv_3x3_pad1_matches_burn() {
        check(case(3, [4, 6], 9, 3, 1, 1));
        check(Case {
            bias: true,
            ..case(1, [3, 5], 8, 3, 1, 1)
        });
    }

    #[test]
    fn conv_3x3_stride2_matches_burn() {
        check(case(2, [4, 8], 9, 3, 2, 1));
        check(Case {
            bias: true,
            ..case(1, [3, 4], 8, 3, 2, 1)
        });
    }

    #[test]
    fn conv_1x1_stride2_matches_burn() {
        check(case(4, [6, 12], 8, 1, 2, 0));
        check(Case {
            bias: true,
            ..case(1, [5, 3], 7, 1, 2, 0)
        });
    }

    #[test]
    fn conv_5x5_pad2_matches_burn() {
        check(Case {
            bias: true,
            ..case(2, [3, 6], 12, 5, 1, 2)
        });
        check(case(1, [1, 4], 10, 5, 1, 0));
    }

    #[test]
    fn same_convs_on_planes_smaller_than_the_kernel_match_burn() {
        // Output rows as long as input rows: the shifted im2col, where some taps see no
        // input at all.
        check(case(2, [2, 3], 2, 5, 1, 2));
        check(Case {
            bias: true,
            ..case(3, [3, 2], 1, 3, 1, 1)
        });
        check(case(1, [2, 2], 3, 3, 1, 1));
    }

    #[test]
    fn conv_groups_match_burn() {
        check(Case {
            groups: 2,
            ..case(2, [4, 6], 7, 3, 1, 1)
        });
        // Depthwise, with bias and a stride.
        check(Case {
            groups: 5,
            bias: true,
            ..case(3, [5, 5], 9, 3, 2, 1)
        });
    }

    /// The custom op's output and gradients are bit-identical on one and on three threads.
    fn same_bits_on_1_and_3_threads(c: &Case) {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (y, dx, dw, db) = pool.install(|| run(c, true));
            (
                y.to_data(),
                dx.to_data(),
                dw.to_data(),
                db.unwrap().to_data(),
            )
        };
        assert_eq!(on(1), on(3), "the bits depend on the number of threads");
    }

    #[test]
    fn batches_of_several_tasks_match_burn_and_every_thread_count() {
        // 19 samples: two full tasks and a partial one, with groups and a bias.
        let c = Case {
            groups: 2,
            bias: true,
            ..case(super::SAMPLES_PER_TASK * 2 + 3, [4, 6], 7, 3, 1, 1)
        };
        check(Case { ..c });
        same_bits_on_1_and_3_threads(&c);
    }

    #[test]
    fn winograd_convs_match_burn() {
        // 3×3 stride 1, no groups, 16 channels or more: F(2×2, 3×3).
        assert!(
            super::Geom::new(
                &layer(&case(1, [16, 16], 8, 3, 1, 1), &Device::flex(), 1),
                [1, 16, 8, 8]
            )
            .and_then(|g| g.winograd())
            .is_some()
        );
        check(case(3, [16, 16], 8, 3, 1, 1));
        // Odd planes (half tiles at the edges), with a bias.
        check(Case {
            bias: true,
            ..case(2, [16, 20], 7, 3, 1, 1)
        });
        // No padding, and padding wider than the kernel's reach.
        check(case(2, [17, 16], 9, 3, 1, 0));
        check(case(1, [16, 18], 5, 3, 1, 2));
        // A plane smaller than a tile, and planes of 144 tiles: one sample per chunk.
        check(case(2, [16, 16], 1, 3, 1, 1));
        check(case(3, [16, 16], 23, 3, 1, 1));
    }

    #[test]
    fn winograd_5x5_convs_match_burn() {
        // 5×5 stride 1, no groups, 16 channels or more: F(2×2, 5×5).
        assert!(
            super::Geom::new(
                &layer(&case(1, [16, 16], 8, 5, 1, 2), &Device::flex(), 1),
                [1, 16, 8, 8]
            )
            .and_then(|g| g.winograd())
            .is_some_and(|s| s.k == 5)
        );
        // cnn-leaf's second convolution (14×14, padding 2, 32 -> 64), two samples.
        check(Case {
            bias: true,
            ..case(2, [32, 64], 14, 5, 1, 2)
        });
        // Odd planes, no padding, uneven padding reach, a plane smaller than a tile.
        check(case(2, [16, 20], 9, 5, 1, 2));
        check(case(2, [17, 16], 11, 5, 1, 0));
        check(case(1, [16, 18], 5, 5, 1, 3));
        check(case(2, [16, 16], 1, 5, 1, 2));
        // Planes of 144 tiles: one sample per chunk.
        check(case(2, [16, 16], 24, 5, 1, 2));
    }

    #[test]
    fn winograd_batches_of_several_tasks_give_the_same_bits_on_every_thread_count() {
        let c = Case {
            bias: true,
            ..case(super::SAMPLES_PER_TASK * 2 + 3, [16, 24], 12, 3, 1, 1)
        };
        check(Case { ..c });
        same_bits_on_1_and_3_threads(&c);
        let c = Case {
            bias: true,
            ..case(super::SAMPLES_PER_TASK * 2 + 3, [16, 24], 10, 5, 1, 2)
        };
        check(Case { ..c });
        same_bits_on_1_and_3_threads(&c);
    }

    #[test]
    fn conv_without_input_grad_matches_burn() {
        // A first layer: the input needs no gradient, the parameters do.
        let device = Device::flex().autodiff();
        let c = Case {
            bias: true,
            ..case(2, [3, 4], 8, 3, 1, 1)
        };
        let conv = layer(&c, &device, 17);
        let shape = [c.batch, c.c_in, c.hw, c.hw];
        let x = Tensor::<4>::from_data(
            TensorData::new(noise(shape.iter().product(), 19), shape),
            &device,
        );
        let grads_of = |y: Tensor<4>| {
            let grads = y.sum().backward();
            let dw = conv.weight.val().grad(&grads).expect("weight grad");
            let db = conv.bias.as_ref().and_then(|b| b.val().grad(&grads));
            (
                x.grad(&grads).is_none(),
                dw.flatten(0, 3),
                db.expect("bias grad"),
            )
        };
        let ours = super::try_forward(&conv, &x).expect("custom op applies");
        let (no_dx, dw, db) = grads_of(ours);
        let (no_dx0, dw0, db0) = grads_of(conv.forward(x.clone()));
        assert!(no_dx && no_dx0);
        assert_close("dw", dw, dw0);
        assert_close("db", db, db0);
    }

    #[test]
    fn conv_eval_path_matches_burn_and_is_deterministic() {
        let device = Device::flex();
        let c = Case {
            bias: true,
            groups: 2,
            ..case(3, [4, 6], 8, 3, 2, 1)
        };
        let conv = layer(&c, &device, 11);
        let shape = [c.batch, c.c_in, c.hw, c.hw];
        let x = Tensor::<4>::from_data(
            TensorData::new(noise(shape.iter().product(), 13), shape),
            &device,
        );
        let ours = super::try_forward(&conv, &x).expect("custom op applies");
        let again = super::try_forward(&conv, &x).expect("custom op applies");
        let burn = conv.forward(x);
        assert_eq!(ours.to_data(), again.to_data());
        assert_close("y", ours.flatten(0, 3), burn.flatten(0, 3));
    }
}
