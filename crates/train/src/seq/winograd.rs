//! Winograd's minimal filtering F(2×2, 3×3) for the 3×3 stride-1 convolutions (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", 2016), and F(2×2, 5×5) for the
//! 5×5 ones ([`five`]: 6×6 tiles, 36 products per channel pair where im2col does 100).
//!
//! Each 2×2 block of outputs (a *tile*) comes from a 4×4 input patch `d` and a 3×3 kernel `g`
//! as `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`: 16 products per channel pair instead of im2col's 36. Summed
//! over input channels, each of the 16 positions `e` of the 4×4 transformed tile is one GEMM
//! over channels, `M[e] = U[e]·V[e]` (`[c_out, c_in]·[c_in, tiles]`). The backward pass is this
//! map's transpose, with `Z = A dY Aᵀ`:
//!
//! - input gradient: `dV[e] = U[e]ᵀ·Z[e]`, then `B dV Bᵀ` added back into the overlapping
//!   4×4 patches;
//! - weight gradient: `dU[e] = Z[e]·V[e]ᵀ` summed over the tiles, then `Gᵀ dU G`.
//!
//! So all three GEMMs of a training step do 16/36 of im2col's multiplications. The transforms
//! use only ±1 and ½, and F(2×2, 3×3)'s rounding error stays near plain summation's; the
//! results still differ from im2col's in the last bits, which is why the choice is made by
//! shape alone (never by the machine or the thread count).
//!
//! Arrays: `U` is `[16][c_out][c_in]`, `dU` `[16][c_in][c_out]` (each block column-major);
//! `V` and `dV` `[16][c_in][n]`, `M` and `Z` `[16][c_out][n]`, their blocks `BLOCK_PAD` floats
//! apart, with a chunk's `n` tiles numbered sample by sample, then row-major over the grid
//! (36 blocks for F(2×2, 5×5)). The GEMMs and the chunking are shared; each kernel size has
//! its own transforms ([`Transforms`]).

use fedfuse_core::linalg::{Mat, matmul};

use super::kernels::with_kept;

/// Declares a kernel size's four plane transforms, each running its `*_at` body (an
/// `#[inline(always)]` function of the calling module) compiled for the widest vector unit
/// (`widest!`); its table `$table` of [`Transforms`]; and, for the tests, `widths()`, the
/// pairs of copies whose bits must agree.
macro_rules! plane_transforms {
    ($vis:vis $table:ident: $weights:ident, $weight_grad:ident, $scratch:ident) => {
        widest! {
            /// `V = Bᵀ d B` of every tile of every input channel.
            fn input_transform => input_transform_at(
                x: &[f32], s: &Shape, ch: &Chunk, v: &mut [f32], scratch: &mut [f32],
            )
        }

        widest! {
            /// The transpose of [`input_transform`]: `B dV Bᵀ` of every tile added into its
            /// patch of the padded plane, whose inside is written to `dx`.
            fn input_transform_t => input_transform_t_at(
                dv: &[f32], s: &Shape, ch: &Chunk, dx: &mut [f32], scratch: &mut [f32],
            )
        }

        widest! {
            /// `Y = Aᵀ M A` of every tile, plus the bias, written into the outputs.
            fn output_transform => output_transform_at(
                m: &[f32], s: &Shape, ch: &Chunk, bias: Option<&[f32]>, y: &mut [f32],
                scratch: &mut [f32],
            )
        }

        widest! {
            /// `Z = A dY Aᵀ` of every tile of the output gradient (zeros past odd edges).
            fn grad_transform => grad_transform_at(
                dy: &[f32], s: &Shape, ch: &Chunk, z: &mut [f32], scratch: &mut [f32],
            )
        }

        $vis const $table: Transforms = Transforms {
            weights: $weights,
            weight_grad: $weight_grad,
            input: input_transform,
            input_t: input_transform_t,
            output: output_transform,
            grad: grad_transform,
            scratch: $scratch,
        };

        /// The widest and the baseline copies of the transforms (`_at`, inlined here and
        /// compiled for the baseline CPU: SSE2 on x86-64).
        #[cfg(test)]
        $vis fn widths() -> crate::seq::winograd::tests::Pair {
            crate::seq::winograd::tests::Pair {
                input: [input_transform, |x, s, c, v, r| input_transform_at(x, s, c, v, r)],
                input_t: [input_transform_t, |d, s, c, x, r| {
                    input_transform_t_at(d, s, c, x, r)
                }],
                output: [output_transform, |m, s, c, b, y, r| {
                    output_transform_at(m, s, c, b, y, r)
                }],
                grad: [grad_transform, |d, s, c, z, r| grad_transform_at(d, s, c, z, r)],
            }
        }
    };
}

mod five;

/// Input and output channels below which im2col stays: the GEMMs' inner dimension is the
/// channel count here (9× the channels with im2col), and the transforms cost per channel.
const MIN_CHANNELS: usize = 16;

/// A convolution Winograd covers: a 3×3 or 5×5 kernel, stride 1, no groups or dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shape {
    /// Kernel side: 3 or 5.
    pub k: usize,
    pub c_in: usize,
    pub c_out: usize,
    pub h: usize,
    pub w: usize,
    pub ho: usize,
    pub wo: usize,
    /// Top and left padding.
    pub pt: usize,
    pub pl: usize,
}

impl Shape {
    /// Whether Winograd is worth it for these channels (the geometry is the caller's check).
    pub(super) fn worth_it(&self) -> bool {
        self.c_in >= MIN_CHANNELS && self.c_out >= MIN_CHANNELS
    }

    /// Transformed tile positions: `(k + 1)²`.
    fn e(&self) -> usize {
        (self.k + 1) * (self.k + 1)
    }

    fn transforms(&self) -> &'static Transforms {
        match self.k {
            5 => &five::TRANSFORMS,
            _ => &THREE,
        }
    }

    fn th(&self) -> usize {
        self.ho.div_ceil(2)
    }

    fn tw(&self) -> usize {
        self.wo.div_ceil(2)
    }

    fn tiles(&self) -> usize {
        self.th() * self.tw()
    }

    /// The zero-padded input plane the tiles read: padded `(py, px)` is input
    /// `(py − pt, px − pl)`. It holds the whole input, since `ho = h + pt + pb − k + 1`.
    fn ph(&self) -> usize {
        2 * self.th() + self.k - 1
    }

    fn pw(&self) -> usize {
        2 * self.tw() + self.k - 1
    }
}

/// A plane-wise transform: input, its transpose, or the output gradient's (source, shape,
/// chunk, destination, scratch).
type PlaneTransform = fn(&[f32], &Shape, &Chunk, &mut [f32], &mut [f32]);

/// The output transform: [`PlaneTransform`] with the bias.
type OutputTransform = fn(&[f32], &Shape, &Chunk, Option<&[f32]>, &mut [f32], &mut [f32]);

/// One kernel size's transforms (see [`input_transform`] and the others for what each does).
struct Transforms {
    weights: fn(&[f32], &Shape) -> Vec<f32>,
    weight_grad: fn(&[f32], &Shape) -> Vec<f32>,
    input: PlaneTransform,
    input_t: PlaneTransform,
    output: OutputTransform,
    grad: PlaneTransform,
    /// Scratch the transforms of one plane use.
    scratch: fn(&Shape) -> usize,
}

/// Length of `U` and `dU`.
pub(super) fn transformed_len(s: &Shape) -> usize {
    s.e() * s.c_out * s.c_in
}

/// The transformed weights `U` of `w` (`[c_out, c_in, k, k]`).
pub(super) fn weights(w: &[f32], s: &Shape) -> Vec<f32> {
    (s.transforms().weights)(w, s)
}

/// The weight gradient (`[c_out, c_in, k, k]`) from the summed `dU`, whose blocks are
/// column-major (`dU[e]` entry `(o, c)` at `c·c_out + o`).
pub(super) fn weight_grad(du: &[f32], s: &Shape) -> Vec<f32> {
    (s.transforms().weight_grad)(du, s)
}

/// `U = G g Gᵀ` for every kernel of `w` (`[c_out, c_in, 3, 3]`).
fn weights3(w: &[f32], s: &Shape) -> Vec<f32> {
    let pairs = s.c_out * s.c_in;
    let mut u = vec![0f32; transformed_len(s)];
    for (p, g) in w.chunks_exact(9).enumerate().take(pairs) {
        // Rows: s_i = Σ_r G[i][r] g_r, then the same over columns.
        let rows: [[f32; 3]; 4] = [
            std::array::from_fn(|j| g[j]),
            std::array::from_fn(|j| 0.5 * (g[j] + g[3 + j] + g[6 + j])),
            std::array::from_fn(|j| 0.5 * (g[j] - g[3 + j] + g[6 + j])),
            std::array::from_fn(|j| g[6 + j]),
        ];
        for (i, r) in rows.iter().enumerate() {
            let cols = [
                r[0],
                0.5 * (r[0] + r[1] + r[2]),
                0.5 * (r[0] - r[1] + r[2]),
                r[2],
            ];
            for (k, v) in cols.into_iter().enumerate() {
                u[(i * 4 + k) * pairs + p] = v;
            }
        }
    }
    u
}

/// The weight gradient `Gᵀ dU G` of a 3×3 kernel.
fn weight_grad3(du: &[f32], s: &Shape) -> Vec<f32> {
    let pairs = s.c_out * s.c_in;
    let mut dw = vec![0f32; 9 * pairs];
    for (p, out) in dw.chunks_exact_mut(9).enumerate() {
        let (o, c) = (p / s.c_in, p % s.c_in);
        let at = |i: usize, k: usize| du[(i * 4 + k) * pairs + c * s.c_out + o];
        // Rows: t_r = Σ_i G[i][r] dU_i, then the same over columns.
        let rows: [[f32; 4]; 3] = [
            std::array::from_fn(|k| at(0, k) + 0.5 * (at(1, k) + at(2, k))),
            std::array::from_fn(|k| 0.5 * (at(1, k) - at(2, k))),
            std::array::from_fn(|k| 0.5 * (at(1, k) + at(2, k)) + at(3, k)),
        ];
        for (t, out) in rows.iter().zip(out.chunks_exact_mut(3)) {
            out[0] = t[0] + 0.5 * (t[1] + t[2]);
            out[1] = 0.5 * (t[1] - t[2]);
            out[2] = 0.5 * (t[1] + t[2]) + t[3];
        }
    }
    dw
}

thread_local! {
    /// Each thread's transform buffers, kept between calls (see `conv::with_col`).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    with_kept(&SCRATCH, len, f)
}

/// Tiles transformed at a time: enough for long GEMMs, few enough that `V` and `M` stay in
/// the core's cache between the transforms and the GEMMs (VGG-9's 32×32 planes: one sample).
const TILES_PER_CHUNK: usize = 256;

/// Floats between consecutive `[16]` blocks beyond their contents: blocks a power of two
/// apart would map the transforms' 16 write streams onto the same cache sets.
const BLOCK_PAD: usize = 16;

/// The samples of a task transformed together, and the sizes of their arrays.
#[derive(Clone, Copy)]
struct Chunk {
    /// Tiles in the chunk.
    n: usize,
    /// Distance between `V`'s (`dV`'s) blocks and between `M`'s (`Z`'s).
    v_stride: usize,
    m_stride: usize,
}

impl Chunk {
    fn new(s: &Shape, samples: usize) -> Self {
        let n = samples * s.tiles();
        Self {
            n,
            v_stride: s.c_in * n + BLOCK_PAD,
            m_stride: s.c_out * n + BLOCK_PAD,
        }
    }

    /// Samples per chunk for a task of `samples`.
    fn samples(s: &Shape, samples: usize) -> usize {
        (TILES_PER_CHUNK / s.tiles().max(1)).clamp(1, samples.max(1))
    }

    /// `V[e]` (or `dV[e]`) as a matrix `[c_in, n]`.
    fn v<'a>(&self, v: &'a [f32], e: usize, s: &Shape) -> Mat<'a, f32> {
        Mat::rows(
            &v[e * self.v_stride..][..s.c_in * self.n],
            s.c_in,
            self.n,
            self.n,
        )
    }

    /// `M[e]` (or `Z[e]`) as a matrix `[c_out, n]`.
    fn m<'a>(&self, m: &'a [f32], e: usize, s: &Shape) -> Mat<'a, f32> {
        Mat::rows(
            &m[e * self.m_stride..][..s.c_out * self.n],
            s.c_out,
            self.n,
            self.n,
        )
    }
}

/// `U[e]` as a matrix `[c_out, c_in]`.
fn u_block<'a>(u: &'a [f32], e: usize, s: &Shape) -> Mat<'a, f32> {
    let len = s.c_out * s.c_in;
    Mat::rows(&u[e * len..][..len], s.c_out, s.c_in, s.c_in)
}

/// One task's forward: `x` holds `samples` inputs (`[c_in, h, w]` each), `y` receives their
/// outputs (`[c_out, ho, wo]` each), bias included.
pub(super) fn forward_task(x: &[f32], u: &[f32], bias: Option<&[f32]>, s: &Shape, y: &mut [f32]) {
    let (x_len, y_len) = (s.c_in * s.h * s.w, s.c_out * s.ho * s.wo);
    let per = Chunk::samples(s, x.len() / x_len);
    let full = Chunk::new(s, per);
    let t = s.transforms();
    let (v_len, m_len) = (s.e() * full.v_stride, s.e() * full.m_stride);
    with_scratch(v_len + m_len + (t.scratch)(s), |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (m, rows) = rest.split_at_mut(m_len);
        for (x, y) in x.chunks(per * x_len).zip(y.chunks_mut(per * y_len)) {
            let ch = Chunk::new(s, x.len() / x_len);
            (t.input)(x, s, &ch, v, rows);
            for e in 0..s.e() {
                let dst = &mut m[e * ch.m_stride..][..s.c_out * ch.n];
                matmul(dst, (ch.n, 1), u_block(u, e, s), ch.v(v, e, s), false);
            }
            (t.output)(m, s, &ch, bias, y, rows);
        }
    });
}

/// One task's backward from its outputs' gradient `dy`: the input gradient written into `dx`
/// (when given), and the task's `dU` (when `need_w`).
pub(super) fn backward_task(
    x: &[f32],
    u: &[f32],
    dy: &[f32],
    s: &Shape,
    mut dx: Option<&mut [f32]>,
    need_w: bool,
) -> Option<Vec<f32>> {
    let (x_len, y_len) = (s.c_in * s.h * s.w, s.c_out * s.ho * s.wo);
    let per = Chunk::samples(s, x.len() / x_len);
    let full = Chunk::new(s, per);
    let t = s.transforms();
    let (v_len, z_len) = (s.e() * full.v_stride, s.e() * full.m_stride);
    let mut du = need_w.then(|| vec![0f32; transformed_len(s)]);
    with_scratch(v_len + z_len + (t.scratch)(s), |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (z, rows) = rest.split_at_mut(z_len);
        for (ci, (x, dy)) in x
            .chunks(per * x_len)
            .zip(dy.chunks(per * y_len))
            .enumerate()
        {
            let ch = Chunk::new(s, x.len() / x_len);
            (t.grad)(dy, s, &ch, z, rows);
            if let Some(du) = du.as_deref_mut() {
                (t.input)(x, s, &ch, v, rows);
                for e in 0..s.e() {
                    // Column-major, so that gemm packs `Z[e]` and `V[e]` as they lie; summed
                    // over the chunks in order.
                    let due = &mut du[e * s.c_out * s.c_in..][..s.c_out * s.c_in];
                    matmul(due, (1, s.c_out), ch.m(z, e, s), ch.v(v, e, s).t(), ci > 0);
                }
            }
            if let Some(dx) = dx.as_deref_mut() {
                // `V` is spent: it now receives dV.
                for e in 0..s.e() {
                    let dst = &mut v[e * ch.v_stride..][..s.c_in * ch.n];
                    matmul(dst, (ch.n, 1), u_block(u, e, s).t(), ch.m(z, e, s), false);
                }
                let dx = &mut dx[ci * per * x_len..][..x.len()];
                (t.input_t)(v, s, &ch, dx, rows);
            }
        }
    });
    du
}

plane_transforms!(THREE: weights3, weight_grad3, rows_len);

/// Scratch of one plane's transforms: 8 tap arrays (`[ph][tw]` each), 16 tile runs and
/// two padded rows.
fn rows_len(s: &Shape) -> usize {
    8 * s.ph() * s.tw() + 16 * s.tiles() + 2 * s.pw()
}

/// The `K` blocks `first, first + step, …` of an `[E][len]` array, each from `at` for `n`
/// values.
fn blocks<const K: usize>(
    a: &[f32],
    first: usize,
    step: usize,
    len: usize,
    at: usize,
    n: usize,
) -> [&[f32]; K] {
    std::array::from_fn(|j| &a[(first + j * step) * len + at..][..n])
}

/// [`blocks`], mutable.
fn blocks_mut<const K: usize>(
    a: &mut [f32],
    first: usize,
    step: usize,
    len: usize,
    at: usize,
    n: usize,
) -> [&mut [f32]; K] {
    // Cut front to back: block j starts at `(first + j·step)·len + at`, past block j − 1.
    let mut rest = a;
    let mut start = 0;
    std::array::from_fn(|j| {
        let begin = (first + j * step) * len + at;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(begin - start);
        let (block, tail) = tail.split_at_mut(n);
        rest = tail;
        start = begin + n;
        block
    })
}

/// `a[k] = src[2k]`, `b[k] = src[2k + 1]`, as far as `a` and `b` reach.
#[inline(always)]
fn deinterleave(src: &[f32], a: &mut [f32], b: &mut [f32]) {
    let pairs = src.chunks_exact(2);
    if let (Some(&last), Some(d)) = (pairs.remainder().first(), a.get_mut(src.len() / 2)) {
        *d = last;
    }
    for ((x, y), pair) in a.iter_mut().zip(b.iter_mut()).zip(pairs) {
        *x = pair[0];
        *y = pair[1];
    }
}

/// `dst[2k] = a[k]`, `dst[2k + 1] = b[k]`, as far as `a` and `b` reach.
#[inline(always)]
fn interleave(a: &[f32], b: &[f32], dst: &mut [f32]) {
    let half = dst.len() / 2;
    let mut pairs = dst.chunks_exact_mut(2);
    for ((x, y), pair) in a.iter().zip(b).zip(&mut pairs) {
        pair[0] = *x;
        pair[1] = *y;
    }
    if let (Some(d), Some(&v)) = (pairs.into_remainder().first_mut(), a.get(half)) {
        *d = v;
    }
}

// The 1-D transforms over runs of tiles. Each takes its runs as separate slice arguments,
// which Rust marks as not aliasing, so that LLVM vectorizes the loop (inside one function,
// eight slices cut from one buffer would need more run-time overlap checks than it makes).

/// `Bᵀ·(a, b, c, d)`: `(a − c, b + c, c − b, b − d)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bt(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: &[f32],
    o0: &mut [f32],
    o1: &mut [f32],
    o2: &mut [f32],
    o3: &mut [f32],
) {
    let n = o0.len();
    let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    for j in 0..n {
        o0[j] = a[j] - c[j];
        o1[j] = b[j] + c[j];
        o2[j] = c[j] - b[j];
        o3[j] = b[j] - d[j];
    }
}

/// `B·(a, b, c, d)`: `(a, b − c + d, −a + b + c, −d)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn b_(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: &[f32],
    o0: &mut [f32],
    o1: &mut [f32],
    o2: &mut [f32],
    o3: &mut [f32],
) {
    let n = o0.len();
    let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    for j in 0..n {
        o0[j] = a[j];
        o1[j] = b[j] - c[j] + d[j];
        o2[j] = -a[j] + b[j] + c[j];
        o3[j] = -d[j];
    }
}

/// `Aᵀ·(a, b, c, d) + bias`: `(a + b + c, b − c − d) + bias`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn at_(a: &[f32], b: &[f32], c: &[f32], d: &[f32], bias: f32, o0: &mut [f32], o1: &mut [f32]) {
    let n = o0.len();
    let (a, b, c, d, o1) = (&a[..n], &b[..n], &c[..n], &d[..n], &mut o1[..n]);
    for j in 0..n {
        o0[j] = a[j] + b[j] + c[j] + bias;
        o1[j] = b[j] - c[j] - d[j] + bias;
    }
}

/// `A·(a, b)`: `(a, a + b, a − b, −b)`.
#[inline(always)]
fn a_(a: &[f32], b: &[f32], o0: &mut [f32], o1: &mut [f32], o2: &mut [f32], o3: &mut [f32]) {
    let n = o0.len();
    let (a, b) = (&a[..n], &b[..n]);
    let (o1, o2, o3) = (&mut o1[..n], &mut o2[..n], &mut o3[..n]);
    for j in 0..n {
        o0[j] = a[j];
        o1[j] = a[j] + b[j];
        o2[j] = a[j] - b[j];
        o3[j] = -b[j];
    }
}

/// Output rows `2·ty + a` of a plane, from its tiles' columns 0 (`y0`) and 1 (`y1`), each
/// `[th][tw]`: the last step of every output transform (a tile is 2×2 outputs).
#[inline(always)]
fn scatter_rows(y0: &[f32], y1: &[f32], a: usize, s: &Shape, yo: &mut [f32]) {
    let tw = s.tw();
    for ty in 0..s.th() {
        let oy = 2 * ty + a;
        if oy < s.ho {
            let (e, o) = (&y0[ty * tw..][..tw], &y1[ty * tw..][..tw]);
            interleave(e, o, &mut yo[oy * s.wo..][..s.wo]);
        }
    }
}

/// The four outputs of every tile of one plane of `dY` (row a, column b at
/// `d[(a·2 + b)·tiles..]`), zeros past odd edges: the first step of every gradient transform.
#[inline(always)]
fn gather_taps(dyo: &[f32], s: &Shape, d: &mut [f32]) {
    let (tiles, tw) = (s.tiles(), s.tw());
    d.fill(0.0);
    for ty in 0..s.th() {
        for a in 0..2 {
            let oy = 2 * ty + a;
            if oy < s.ho {
                let (d0, d1) = d[2 * a * tiles..][..2 * tiles].split_at_mut(tiles);
                let src = &dyo[oy * s.wo..][..s.wo];
                deinterleave(src, &mut d0[ty * tw..][..tw], &mut d1[ty * tw..][..tw]);
            }
        }
    }
}

/// `dst += src`.
#[inline(always)]
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, v) in dst.iter_mut().zip(src) {
        *d += v;
    }
}

/// The first `K` `len`-long runs of `buf`.
fn split<const K: usize>(buf: &mut [f32], len: usize) -> [&mut [f32]; K] {
    let mut runs = buf.chunks_exact_mut(len);
    std::array::from_fn(|_| match runs.next() {
        Some(r) => r,
        None => unreachable!("the buffer holds K runs"),
    })
}

// The 2-D transforms run the 1-D ones over whole planes, not tile rows: ResNet-20's 8×8
// planes have rows of four tiles, too short for vector code. A plane's taps are first laid
// out as four `[ph][tw]` arrays, tap `k` of tile column `tx` at `[py][tx]` (padded column
// `2·tx + k`), rows split by parity (even rows, then odd): the column pass is then one run
// of `ph·tw`, and in the row pass, rows `2·ty + i` of every tile row are the contiguous run
// of `tiles` starting at even or odd row `0` or `1`.

/// The padded row `py` (`0..ph`) of a `[ph][tw]` tap array: even rows first (`ph` is even).
fn tap_row(py: usize, s: &Shape) -> usize {
    (py % 2) * (s.ph() / 2) + py / 2
}

/// The taps of a padded row (`2·tw + 2` long): `p_k[tx] = row[2·tx + k]`.
#[inline(always)]
fn taps(row: &[f32], p0: &mut [f32], p1: &mut [f32], p2: &mut [f32], p3: &mut [f32]) {
    let (cur, next) = (row.chunks_exact(2), row[2..].chunks_exact(2));
    let outs = p0
        .iter_mut()
        .zip(p1.iter_mut())
        .zip(p2.iter_mut().zip(p3.iter_mut()));
    for ((c, n), ((o0, o1), (o2, o3))) in cur.zip(next).zip(outs) {
        *o0 = c[0];
        *o1 = c[1];
        *o2 = n[0];
        *o3 = n[1];
    }
}

/// The transpose of [`taps`]: `row[2·tx + k]` is the sum of the `p_k[tx]` that read it.
#[inline(always)]
fn untaps(p0: &[f32], p1: &[f32], p2: &[f32], p3: &[f32], row: &mut [f32]) {
    let n = p0.len();
    let (p1, p2, p3) = (&p1[..n], &p2[..n], &p3[..n]);
    let row = &mut row[..2 * n + 2];
    row[0] = p0[0];
    row[1] = p1[0];
    row[2 * n] = p2[n - 1];
    row[2 * n + 1] = p3[n - 1];
    let inner = row[2..2 * n].chunks_exact_mut(2);
    let ins = p0[1..].iter().zip(&p1[1..]).zip(p2.iter().zip(p3));
    for (r, ((a, b), (c, d))) in inner.zip(ins) {
        r[0] = a + c;
        r[1] = b + d;
    }
}

/// [`input_transform`], inlined into each width's copy.
#[inline(always)]
fn input_transform_at(x: &[f32], s: &Shape, ch: &Chunk, v: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw, th) = (s.tiles(), s.tw(), s.th());
    let plane = s.ph() * tw;
    let (taps_buf, rest) = scratch.split_at_mut(4 * plane);
    let (cols, rest) = rest.split_at_mut(4 * plane);
    let row = &mut rest[..s.pw()];
    let [p0, p1, p2, p3] = split(taps_buf, plane);
    let [c0, c1, c2, c3] = split(cols, plane);
    for (b, xc) in x.chunks_exact(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        for py in 0..s.ph() {
            let at = tap_row(py, s) * tw;
            // Input column ix at padded ix + pl.
            row.fill(0.0);
            if let Some(iy) = py.checked_sub(s.pt).filter(|&iy| iy < s.h) {
                row[s.pl..s.pl + s.w].copy_from_slice(&xc[iy * s.w..][..s.w]);
            }
            let (p0, p1, p2, p3) = (&mut p0[at..], &mut p1[at..], &mut p2[at..], &mut p3[at..]);
            taps(row, &mut p0[..tw], p1, p2, p3);
        }
        // Columns: d B.
        bt(p0, p1, p2, p3, c0, c1, c2, c3);
        // Rows: Bᵀ (d B), tile row ty from padded rows 2ty..2ty + 3.
        let at = c * ch.n + si * tiles;
        let odd = (th + 1) * tw;
        for (k, ck) in [&*c0, &*c1, &*c2, &*c3].into_iter().enumerate() {
            let (r0, r1, r2, r3) = (ck, &ck[odd..], &ck[tw..], &ck[odd + tw..]);
            let [v0, v1, v2, v3] = blocks_mut(v, k, 4, ch.v_stride, at, tiles);
            bt(r0, r1, r2, r3, v0, v1, v2, v3);
        }
    }
}

/// [`input_transform_t`], inlined into each width's copy.
#[inline(always)]
fn input_transform_t_at(dv: &[f32], s: &Shape, ch: &Chunk, dx: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw, th) = (s.tiles(), s.tw(), s.th());
    let plane = s.ph() * tw;
    let (cols, rest) = scratch.split_at_mut(4 * plane);
    let (taps_buf, rest) = rest.split_at_mut(4 * plane);
    let (q, rest) = rest.split_at_mut(2 * tiles);
    let (q2, q3) = q.split_at_mut(tiles);
    let row = &mut rest[..s.pw()];
    let [c0, c1, c2, c3] = split(cols, plane);
    let [p0, p1, p2, p3] = split(taps_buf, plane);
    let odd = (th + 1) * tw;
    for (b, dxc) in dx.chunks_exact_mut(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        let at = c * ch.n + si * tiles;
        // Rows: B dV, tile row ty adding into padded rows 2ty..2ty + 3.
        for (k, ck) in [&mut *c0, &mut *c1, &mut *c2, &mut *c3]
            .into_iter()
            .enumerate()
        {
            let [a0, a1, a2, a3] = blocks(dv, k, 4, ch.v_stride, at, tiles);
            let (even, odd_rows) = ck.split_at_mut(odd);
            let (e0, o0) = (&mut even[..tiles], &mut odd_rows[..tiles]);
            b_(a0, a1, a2, a3, e0, o0, q2, q3);
            even[tiles..].fill(0.0);
            odd_rows[tiles..].fill(0.0);
            add_into(&mut even[tw..], q2);
            add_into(&mut odd_rows[tw..], q3);
        }
        // Columns: (B dV) Bᵀ.
        b_(c0, c1, c2, c3, p0, p1, p2, p3);
        for (iy, dst) in dxc.chunks_exact_mut(s.w).enumerate() {
            let at = tap_row(iy + s.pt, s) * tw;
            untaps(&p0[at..at + tw], &p1[at..], &p2[at..], &p3[at..], row);
            dst.copy_from_slice(&row[s.pl..s.pl + s.w]);
        }
    }
}

/// [`output_transform`], inlined into each width's copy.
#[inline(always)]
fn output_transform_at(
    m: &[f32],
    s: &Shape,
    ch: &Chunk,
    bias: Option<&[f32]>,
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let tiles = s.tiles();
    let (r, rest) = scratch.split_at_mut(8 * tiles);
    let (ya, _) = rest.split_at_mut(2 * tiles);
    let (y0, y1) = ya.split_at_mut(tiles);
    for (b, yo) in y.chunks_exact_mut(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        let bias = bias.map_or(0.0, |bias| bias[o]);
        let at = o * ch.n + si * tiles;
        // Rows: Aᵀ M; output row a's column k goes to r[(a·4 + k)·tiles..].
        for k in 0..4 {
            let [a0, a1, a2, a3] = blocks(m, k, 4, ch.m_stride, at, tiles);
            let (ra, rb) = r.split_at_mut(4 * tiles);
            at_(
                a0,
                a1,
                a2,
                a3,
                0.0,
                &mut ra[k * tiles..][..tiles],
                &mut rb[k * tiles..][..tiles],
            );
        }
        // Columns: (Aᵀ M) A, then the tile rows interleaved into output rows.
        for (a, ra) in r.chunks_exact(4 * tiles).enumerate() {
            let [c0, c1, c2, c3] = std::array::from_fn(|k| &ra[k * tiles..][..tiles]);
            at_(c0, c1, c2, c3, bias, y0, y1);
            scatter_rows(y0, y1, a, s, yo);
        }
    }
}

/// [`grad_transform`], inlined into each width's copy.
#[inline(always)]
fn grad_transform_at(dy: &[f32], s: &Shape, ch: &Chunk, z: &mut [f32], scratch: &mut [f32]) {
    let tiles = s.tiles();
    // dY's four taps (row a, column b at [(a·2 + b)·tiles..]), then the rows of A dY.
    let (d, rest) = scratch.split_at_mut(4 * tiles);
    let (r, _) = rest.split_at_mut(8 * tiles);
    for (b, dyo) in dy.chunks_exact(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        gather_taps(dyo, s, d);
        // Rows: A dY, for tap columns 0 and 1.
        let (da, db) = d.split_at(2 * tiles);
        let (ra, rb) = r.split_at_mut(4 * tiles);
        for (col, rc) in [ra, rb].into_iter().enumerate() {
            let (d0, d1) = (&da[col * tiles..][..tiles], &db[col * tiles..][..tiles]);
            let [r0, r1, r2, r3] = split(rc, tiles);
            a_(d0, d1, r0, r1, r2, r3);
        }
        // Columns: (A dY) Aᵀ.
        let at = o * ch.n + si * tiles;
        for i in 0..4 {
            let (even, odd) = (&r[i * tiles..][..tiles], &r[(4 + i) * tiles..][..tiles]);
            let [z0, z1, z2, z3] = blocks_mut(z, 4 * i, 1, ch.m_stride, at, tiles);
            a_(even, odd, z0, z1, z2, z3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seq::tests::noise as values;

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// This machine's widest and the baseline copy of every transform of a kernel size.
    pub(super) struct Pair {
        pub(super) input: [PlaneTransform; 2],
        pub(super) input_t: [PlaneTransform; 2],
        pub(super) output: [OutputTransform; 2],
        pub(super) grad: [PlaneTransform; 2],
    }

    fn check_widths(k: usize, pair: &Pair) {
        for (h, w, [pt, pb, pl, pr]) in [
            (8, 8, [1, 1, 1, 1]),
            (7, 9, [1, 1, 0, 2]),
            (5, 6, [0, 0, 2, 2]),
            (1, 1, [1, 1, 1, 1]),
            (16, 16, [1, 1, 1, 1]),
            (14, 14, [2, 2, 2, 2]),
        ] {
            if h + pt + pb < k || w + pl + pr < k {
                continue;
            }
            let s = Shape {
                k,
                c_in: 3,
                c_out: 2,
                h,
                w,
                ho: h + pt + pb + 1 - k,
                wo: w + pl + pr + 1 - k,
                pt,
                pl,
            };
            let samples = 2;
            let ch = Chunk::new(&s, samples);
            let mut scratch = vec![0f32; (s.transforms().scratch)(&s)];
            let e = s.e();
            let x = values(samples * s.c_in * h * w, 1);
            let (mut v1, mut v2) = (vec![0f32; e * ch.v_stride], vec![0f32; e * ch.v_stride]);
            (pair.input[0])(&x, &s, &ch, &mut v1, &mut scratch);
            (pair.input[1])(&x, &s, &ch, &mut v2, &mut scratch);
            assert!(same_bits(&v1, &v2), "V of {s:?}");

            let dv = values(e * ch.v_stride, 2);
            let (mut dx1, mut dx2) = (vec![0f32; x.len()], vec![0f32; x.len()]);
            (pair.input_t[0])(&dv, &s, &ch, &mut dx1, &mut scratch);
            (pair.input_t[1])(&dv, &s, &ch, &mut dx2, &mut scratch);
            assert!(same_bits(&dx1, &dx2), "dX of {s:?}");

            let m = values(e * ch.m_stride, 3);
            let bias = values(s.c_out, 4);
            let y_len = samples * s.c_out * s.ho * s.wo;
            let (mut y1, mut y2) = (vec![0f32; y_len], vec![0f32; y_len]);
            (pair.output[0])(&m, &s, &ch, Some(&bias), &mut y1, &mut scratch);
            (pair.output[1])(&m, &s, &ch, Some(&bias), &mut y2, &mut scratch);
            assert!(same_bits(&y1, &y2), "Y of {s:?}");

            let dy = values(y_len, 5);
            let (mut z1, mut z2) = (vec![0f32; e * ch.m_stride], vec![0f32; e * ch.m_stride]);
            (pair.grad[0])(&dy, &s, &ch, &mut z1, &mut scratch);
            (pair.grad[1])(&dy, &s, &ch, &mut z2, &mut scratch);
            assert!(same_bits(&z1, &z2), "Z of {s:?}");
        }
    }

    #[test]
    fn every_vector_width_gives_the_same_bits() {
        check_widths(3, &widths());
        check_widths(5, &five::widths());
    }
}
