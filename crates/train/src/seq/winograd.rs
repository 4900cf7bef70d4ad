//! Winograd's minimal filtering F(2×2, 3×3) for the 3×3 stride-1 convolutions (Lavin and
//! Gray, "Fast Algorithms for Convolutional Neural Networks", 2016).
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
//! apart, with a chunk's `n` tiles numbered sample by sample, then row-major over the grid.

use super::conv::{Mat, matmul};

/// Input and output channels below which im2col stays: the GEMMs' inner dimension is the
/// channel count here (9× the channels with im2col), and the transforms cost per channel.
const MIN_CHANNELS: usize = 16;

/// Transformed tile positions (4×4).
const E: usize = 16;

/// A convolution Winograd covers: 3×3 kernel, stride 1, no groups or dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shape {
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
    /// `(py − pt, px − pl)`. It holds the whole input, since `ho = h + pt + pb − 2`.
    fn ph(&self) -> usize {
        2 * self.th() + 2
    }

    fn pw(&self) -> usize {
        2 * self.tw() + 2
    }
}

/// Length of `U` and `dU`.
pub(super) fn transformed_len(s: &Shape) -> usize {
    E * s.c_out * s.c_in
}

/// `U = G g Gᵀ` for every kernel of `w` (`[c_out, c_in, 3, 3]`).
pub(super) fn weights(w: &[f32], s: &Shape) -> Vec<f32> {
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

/// The weight gradient `Gᵀ dU G` (`[c_out, c_in, 3, 3]`) from the summed `dU`, whose blocks
/// are column-major (`dU[e]` entry `(o, c)` at `c·c_out + o`).
pub(super) fn weight_grad(du: &[f32], s: &Shape) -> Vec<f32> {
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
    super::conv::with_kept(&SCRATCH, len, f)
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
    fn v<'a>(&self, v: &'a [f32], e: usize, s: &Shape) -> Mat<'a> {
        Mat::rows(
            &v[e * self.v_stride..][..s.c_in * self.n],
            s.c_in,
            self.n,
            self.n,
        )
    }

    /// `M[e]` (or `Z[e]`) as a matrix `[c_out, n]`.
    fn m<'a>(&self, m: &'a [f32], e: usize, s: &Shape) -> Mat<'a> {
        Mat::rows(
            &m[e * self.m_stride..][..s.c_out * self.n],
            s.c_out,
            self.n,
            self.n,
        )
    }
}

/// `U[e]` as a matrix `[c_out, c_in]`.
fn u_block<'a>(u: &'a [f32], e: usize, s: &Shape) -> Mat<'a> {
    let len = s.c_out * s.c_in;
    Mat::rows(&u[e * len..][..len], s.c_out, s.c_in, s.c_in)
}

/// One task's forward: `x` holds `samples` inputs (`[c_in, h, w]` each), `y` receives their
/// outputs (`[c_out, ho, wo]` each), bias included.
pub(super) fn forward_task(x: &[f32], u: &[f32], bias: Option<&[f32]>, s: &Shape, y: &mut [f32]) {
    let (x_len, y_len) = (s.c_in * s.h * s.w, s.c_out * s.ho * s.wo);
    let per = Chunk::samples(s, x.len() / x_len);
    let full = Chunk::new(s, per);
    let (v_len, m_len) = (E * full.v_stride, E * full.m_stride);
    with_scratch(v_len + m_len + rows_len(s), |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (m, rows) = rest.split_at_mut(m_len);
        for (x, y) in x.chunks(per * x_len).zip(y.chunks_mut(per * y_len)) {
            let ch = Chunk::new(s, x.len() / x_len);
            input_transform(x, s, &ch, v, rows);
            for e in 0..E {
                let dst = &mut m[e * ch.m_stride..][..s.c_out * ch.n];
                matmul(dst, (ch.n, 1), u_block(u, e, s), ch.v(v, e, s), false);
            }
            output_transform(m, s, &ch, bias, y, rows);
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
    let (v_len, z_len) = (E * full.v_stride, E * full.m_stride);
    let mut du = need_w.then(|| vec![0f32; transformed_len(s)]);
    with_scratch(v_len + z_len + rows_len(s), |buf| {
        let (v, rest) = buf.split_at_mut(v_len);
        let (z, rows) = rest.split_at_mut(z_len);
        for (ci, (x, dy)) in x
            .chunks(per * x_len)
            .zip(dy.chunks(per * y_len))
            .enumerate()
        {
            let ch = Chunk::new(s, x.len() / x_len);
            grad_transform(dy, s, &ch, z, rows);
            if let Some(du) = du.as_deref_mut() {
                input_transform(x, s, &ch, v, rows);
                for e in 0..E {
                    // Column-major, so that gemm packs `Z[e]` and `V[e]` as they lie; summed
                    // over the chunks in order.
                    let due = &mut du[e * s.c_out * s.c_in..][..s.c_out * s.c_in];
                    matmul(due, (1, s.c_out), ch.m(z, e, s), ch.v(v, e, s).t(), ci > 0);
                }
            }
            if let Some(dx) = dx.as_deref_mut() {
                // `V` is spent: it now receives dV.
                for e in 0..E {
                    let dst = &mut v[e * ch.v_stride..][..s.c_in * ch.n];
                    matmul(dst, (ch.n, 1), u_block(u, e, s).t(), ch.m(z, e, s), false);
                }
                let dx = &mut dx[ci * per * x_len..][..x.len()];
                input_transform_t(v, s, &ch, dx, rows);
            }
        }
    });
    du
}

/// Scratch for one padded plane and sixteen tile rows.
fn rows_len(s: &Shape) -> usize {
    s.ph() * s.pw() + 16 * s.pw()
}

/// The four blocks `e..e + 4` of an `[16][len]` array, each from `at` for `n` values.
fn four_mut(a: &mut [f32], e: usize, len: usize, at: usize, n: usize) -> [&mut [f32]; 4] {
    let mut blocks = a[e * len..(e + 4) * len].chunks_exact_mut(len);
    std::array::from_fn(|_| match blocks.next() {
        Some(b) => &mut b[at..at + n],
        None => unreachable!("four blocks were cut"),
    })
}

/// The four blocks `e, e + 4, e + 8, e + 12` (one column of the 4×4 tile) of an
/// `[16][len]` array, each from `at` for `n` values.
fn column(a: &[f32], k: usize, len: usize, at: usize, n: usize) -> [&[f32]; 4] {
    std::array::from_fn(|i| &a[(i * 4 + k) * len + at..][..n])
}

/// Copies one input channel into the zero-padded plane, each row stored deinterleaved (its
/// even columns, then its odd ones), so that the tiles' column transforms, which combine
/// columns two apart, read contiguous runs.
fn pad_plane(xc: &[f32], s: &Shape, plane: &mut [f32]) {
    let (pw, half) = (s.pw(), s.tw() + 1);
    plane.fill(0.0);
    for (iy, src) in xc.chunks_exact(s.w).enumerate() {
        let py = iy + s.pt;
        if py >= s.ph() {
            break;
        }
        let (even, odd) = plane[py * pw..][..pw].split_at_mut(half);
        // Input column `ix` lands in padded column `ix + pl`.
        match s.pl % 2 {
            0 => deinterleave(src, &mut even[s.pl / 2..], &mut odd[s.pl / 2..]),
            _ => deinterleave(src, &mut odd[s.pl / 2..], &mut even[s.pl / 2 + 1..]),
        }
    }
}

/// `a[k] = src[2k]`, `b[k] = src[2k + 1]`, as far as `a` and `b` reach.
#[inline]
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
#[inline]
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
#[inline]
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
#[inline]
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
#[inline]
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
#[inline]
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

/// `dst += src`.
#[inline]
fn add_into(dst: &mut [f32], src: &[f32]) {
    for (d, v) in dst.iter_mut().zip(src) {
        *d += v;
    }
}

/// The first four `len`-long runs of `buf`.
fn split4(buf: &mut [f32], len: usize) -> [&mut [f32]; 4] {
    let mut runs = buf.chunks_exact_mut(len);
    std::array::from_fn(|_| match runs.next() {
        Some(r) => r,
        None => unreachable!("the buffer holds four runs"),
    })
}

/// `V = Bᵀ d B` of every tile of every input channel.
fn input_transform(x: &[f32], s: &Shape, ch: &Chunk, v: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw, pw) = (s.tiles(), s.tw(), s.pw());
    let (n, len) = (ch.n, ch.v_stride);
    let (plane, t) = scratch.split_at_mut(s.ph() * pw);
    let [t0, t1, t2, t3] = split4(&mut t[..4 * pw], pw);
    for (b, xc) in x.chunks_exact(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        pad_plane(xc, s, plane);
        for ty in 0..s.th() {
            let r = &plane[2 * ty * pw..][..4 * pw];
            // Rows of Bᵀ d.
            let (r0, r1, r2, r3) = (&r[..pw], &r[pw..2 * pw], &r[2 * pw..3 * pw], &r[3 * pw..]);
            bt(r0, r1, r2, r3, t0, t1, t2, t3);
            let at = c * n + si * tiles + ty * tw;
            for (i, ti) in [&*t0, &*t1, &*t2, &*t3].into_iter().enumerate() {
                // Columns: tile j reads even[j], odd[j], even[j + 1], odd[j + 1].
                let (even, odd) = ti.split_at(tw + 1);
                let [d0, d1, d2, d3] = four_mut(v, i * 4, len, at, tw);
                bt(
                    &even[..tw],
                    &odd[..tw],
                    &even[1..],
                    &odd[1..],
                    d0,
                    d1,
                    d2,
                    d3,
                );
            }
        }
    }
}

/// The transpose of [`input_transform`]: `B dV Bᵀ` of every tile added into its patch of a
/// padded plane (deinterleaved rows), whose inside is then written to `dx`.
fn input_transform_t(dv: &[f32], s: &Shape, ch: &Chunk, dx: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw, pw, half) = (s.tiles(), s.tw(), s.pw(), s.tw() + 1);
    let (n, len) = (ch.n, ch.v_stride);
    let (plane, q) = scratch.split_at_mut(s.ph() * pw);
    let (q, cols) = q[..20 * tw].split_at_mut(16 * tw);
    let [s0, s1, s2, s3] = split4(cols, tw);
    for (b, dxc) in dx.chunks_exact_mut(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        plane.fill(0.0);
        for ty in 0..s.th() {
            let at = c * n + si * tiles + ty * tw;
            // Rows of B dV per column k; row r's column k goes to q[(r·4 + k)·tw..].
            for k in 0..4 {
                let [a0, a1, a2, a3] = column(dv, k, len, at, tw);
                let [q0, q1, q2, q3] = four_strided(q, k, tw);
                b_(a0, a1, a2, a3, q0, q1, q2, q3);
            }
            for r in 0..4 {
                let [c0, c1, c2, c3] = split4(&mut q[r * 4 * tw..][..4 * tw], tw);
                b_(c0, c1, c2, c3, s0, s1, s2, s3);
                // Columns: tile j adds into even[j], odd[j], even[j + 1], odd[j + 1].
                let (even, odd) = plane[(2 * ty + r) * pw..][..pw].split_at_mut(half);
                add_into(&mut even[..tw], s0);
                add_into(&mut odd[..tw], s1);
                add_into(&mut even[1..], s2);
                add_into(&mut odd[1..], s3);
            }
        }
        for (iy, row) in dxc.chunks_exact_mut(s.w).enumerate() {
            let (even, odd) = plane[(iy + s.pt) * pw..][..pw].split_at(half);
            match s.pl % 2 {
                0 => interleave(&even[s.pl / 2..], &odd[s.pl / 2..], row),
                _ => interleave(&odd[s.pl / 2..], &even[s.pl / 2 + 1..], row),
            }
        }
    }
}

/// The four `tw`-long rows `k, k + 4, k + 8, k + 12` of `q` (`[16][tw]`).
fn four_strided(q: &mut [f32], k: usize, tw: usize) -> [&mut [f32]; 4] {
    let mut rows = q.chunks_exact_mut(tw).skip(k).step_by(4);
    std::array::from_fn(|_| match rows.next() {
        Some(r) => r,
        None => unreachable!("q holds 16 rows"),
    })
}

/// `Y = Aᵀ M A` of every tile, plus the bias, written into the outputs.
fn output_transform(
    m: &[f32],
    s: &Shape,
    ch: &Chunk,
    bias: Option<&[f32]>,
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let (tiles, tw) = (s.tiles(), s.tw());
    let (n, len) = (ch.n, ch.m_stride);
    let (p, out) = scratch[..10 * tw].split_at_mut(8 * tw);
    let (even, odd) = out.split_at_mut(tw);
    for (b, yo) in y.chunks_exact_mut(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        let bias = bias.map_or(0.0, |bias| bias[o]);
        for ty in 0..s.th() {
            let at = o * n + si * tiles + ty * tw;
            // Rows of Aᵀ M per column k; row a's column k goes to p[(a·4 + k)·tw..].
            for k in 0..4 {
                let [a0, a1, a2, a3] = column(m, k, len, at, tw);
                let (p0, p1) = p.split_at_mut(4 * tw);
                at_(
                    a0,
                    a1,
                    a2,
                    a3,
                    0.0,
                    &mut p0[k * tw..][..tw],
                    &mut p1[k * tw..][..tw],
                );
            }
            for a in 0..2 {
                let oy = 2 * ty + a;
                if oy >= s.ho {
                    break;
                }
                let pa = &p[a * 4 * tw..][..4 * tw];
                let (c0, c1, c2, c3) = (
                    &pa[..tw],
                    &pa[tw..2 * tw],
                    &pa[2 * tw..3 * tw],
                    &pa[3 * tw..],
                );
                at_(c0, c1, c2, c3, bias, even, odd);
                interleave(even, odd, &mut yo[oy * s.wo..][..s.wo]);
            }
        }
    }
}

/// `Z = A dY Aᵀ` of every tile of the output gradient (zeros past odd edges).
fn grad_transform(dy: &[f32], s: &Shape, ch: &Chunk, z: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw) = (s.tiles(), s.tw());
    let (n, len) = (ch.n, ch.m_stride);
    // Two output rows, deinterleaved (even columns, then odd), and four rows of A dY.
    let (d, r) = scratch[..12 * tw].split_at_mut(4 * tw);
    let [r0, r1, r2, r3] = split4(r, 2 * tw);
    for (b, dyo) in dy.chunks_exact(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        for ty in 0..s.th() {
            for (a, da) in d.chunks_exact_mut(2 * tw).enumerate() {
                let oy = 2 * ty + a;
                da.fill(0.0);
                if oy < s.ho {
                    let (even, odd) = da.split_at_mut(tw);
                    deinterleave(&dyo[oy * s.wo..][..s.wo], even, odd);
                }
            }
            // Rows of A dY.
            let (d0, d1) = d.split_at(2 * tw);
            a_(d0, d1, r0, r1, r2, r3);
            let at = o * n + si * tiles + ty * tw;
            for (i, ri) in [&*r0, &*r1, &*r2, &*r3].into_iter().enumerate() {
                // Columns: tile j combines even[j] and odd[j].
                let (even, odd) = ri.split_at(tw);
                let [z0, z1, z2, z3] = four_mut(z, i * 4, len, at, tw);
                a_(even, odd, z0, z1, z2, z3);
            }
        }
    }
}
