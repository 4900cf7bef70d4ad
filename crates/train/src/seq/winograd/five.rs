//! F(2×2, 5×5): each 2×2 block of outputs from a 6×6 input patch, `Aᵀ[(G g Gᵀ) ⊙ (Bᵀ d B)]A`,
//! 36 products per channel pair where im2col does 100. The interpolation points are 0, ±1,
//! ±2 and ∞, those of F(4, 3); the matrices follow from them (Lavin and Gray's construction):
//!
//! ```text
//! Bᵀ = [4  0 -5  0 1 0]   G = [ 1/4     0     0     0    0 ]   Aᵀ = [1 1  1 1  1 0]
//!      [0 -4 -4  1 1 0]       [-1/6 -1/6  -1/6  -1/6 -1/6 ]        [0 1 -1 2 -2 1]
//!      [0  4 -4 -1 1 0]       [-1/6  1/6  -1/6   1/6 -1/6 ]
//!      [0 -2 -1  2 1 0]       [1/24  1/12  1/6   1/3  2/3 ]
//!      [0  2 -1 -2 1 0]       [1/24 -1/12  1/6  -1/3  2/3 ]
//!      [0  4  0 -5 0 1]       [  0     0     0     0    1 ]
//! ```
//!
//! The layout and the passes are those of the 3×3 transforms (see the parent module): a
//! plane's taps in `[ph][tw]` arrays with rows split by parity, a column pass over the whole
//! plane, then a row pass over runs of `tiles`; a tile row reads six padded rows instead of
//! four.

use super::{
    Chunk, Shape, Transforms, add_into, blocks, blocks_mut, gather_taps, scatter_rows, split,
    tap_row,
};

/// Tile side: `2 + 5 − 1`.
const N: usize = 6;

/// `G`, in f64 for the weight transforms (done once per step, so precision is cheap).
const G: [[f64; 5]; N] = [
    [0.25, 0.0, 0.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0, 1.0 / 3.0, 2.0 / 3.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0, -1.0 / 3.0, 2.0 / 3.0],
    [0.0, 0.0, 0.0, 0.0, 1.0],
];

/// `M·X` for a `[R][K]` and a `[K][C]` array, summed in order of `K`.
#[inline(always)]
fn product<const R: usize, const K: usize, const C: usize>(
    m: &[[f64; K]; R],
    x: &[[f64; C]; K],
) -> [[f64; C]; R] {
    let mut out = [[0.0; C]; R];
    for (row, mr) in out.iter_mut().zip(m) {
        for (&a, xr) in mr.iter().zip(x) {
            for (o, &b) in row.iter_mut().zip(xr) {
                *o += a * b;
            }
        }
    }
    out
}

/// The transpose of a `[R][C]` array.
#[inline(always)]
fn transposed<const R: usize, const C: usize>(m: &[[f64; C]; R]) -> [[f64; R]; C] {
    std::array::from_fn(|c| std::array::from_fn(|r| m[r][c]))
}

/// `U = G g Gᵀ` for every kernel of `w` (`[c_out, c_in, 5, 5]`).
fn weights(w: &[f32], s: &Shape) -> Vec<f32> {
    let pairs = s.c_out * s.c_in;
    let gt = transposed(&G);
    let mut u = vec![0f32; N * N * pairs];
    for (p, g) in w.chunks_exact(25).enumerate().take(pairs) {
        let g: [[f64; 5]; 5] =
            std::array::from_fn(|r| std::array::from_fn(|c| f64::from(g[r * 5 + c])));
        let ui = product(&product(&G, &g), &gt);
        for (i, row) in ui.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                u[(i * N + k) * pairs + p] = v as f32;
            }
        }
    }
    u
}

/// The weight gradient `Gᵀ dU G` (`[c_out, c_in, 5, 5]`) from the summed, column-major `dU`.
fn weight_grad(du: &[f32], s: &Shape) -> Vec<f32> {
    let pairs = s.c_out * s.c_in;
    let gt = transposed(&G);
    let mut dw = vec![0f32; 25 * pairs];
    // In dU's order (entry `c·c_out + o` of each block), so that each of its 36 blocks is
    // read front to back.
    for q in 0..pairs {
        let (c, o) = (q / s.c_out, q % s.c_out);
        let d: [[f64; N]; N] = std::array::from_fn(|i| {
            std::array::from_fn(|k| f64::from(du[(i * N + k) * pairs + q]))
        });
        let g = product(&product(&gt, &d), &G);
        let out = &mut dw[(o * s.c_in + c) * 25..][..25];
        for (o, &v) in out.iter_mut().zip(g.iter().flatten()) {
            *o = v as f32;
        }
    }
    dw
}

/// Scratch of one plane's transforms: 12 plane-sized arrays (taps and columns), 16 tile
/// runs and two padded rows.
fn scratch_len(s: &Shape) -> usize {
    12 * s.ph() * s.tw() + 16 * s.tiles() + 2 * s.pw()
}

plane_transforms!(pub(super) TRANSFORMS: weights, weight_grad, scratch_len);

// The 1-D transforms over runs, each run a separate slice argument (see the parent module).

/// `Bᵀ·d`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bt(
    [d0, d1, d2, d3, d4, d5]: [&[f32]; N],
    o0: &mut [f32],
    o1: &mut [f32],
    o2: &mut [f32],
    o3: &mut [f32],
    o4: &mut [f32],
    o5: &mut [f32],
) {
    let n = o0.len();
    let (d0, d1, d2, d3, d4, d5) = (&d0[..n], &d1[..n], &d2[..n], &d3[..n], &d4[..n], &d5[..n]);
    let (o1, o2, o3, o4, o5) = (
        &mut o1[..n],
        &mut o2[..n],
        &mut o3[..n],
        &mut o4[..n],
        &mut o5[..n],
    );
    for j in 0..n {
        o0[j] = 4.0 * d0[j] - 5.0 * d2[j] + d4[j];
        o1[j] = (d3[j] + d4[j]) - 4.0 * (d1[j] + d2[j]);
        o2[j] = (d4[j] - d3[j]) + 4.0 * (d1[j] - d2[j]);
        o3[j] = (d4[j] - d2[j]) + 2.0 * (d3[j] - d1[j]);
        o4[j] = (d4[j] - d2[j]) - 2.0 * (d3[j] - d1[j]);
        o5[j] = 4.0 * d1[j] - 5.0 * d3[j] + d5[j];
    }
}

/// `B·v`, the transpose of [`bt`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn b_(
    [v0, v1, v2, v3, v4, v5]: [&[f32]; N],
    o0: &mut [f32],
    o1: &mut [f32],
    o2: &mut [f32],
    o3: &mut [f32],
    o4: &mut [f32],
    o5: &mut [f32],
) {
    let n = o0.len();
    let (v0, v1, v2, v3, v4, v5) = (&v0[..n], &v1[..n], &v2[..n], &v3[..n], &v4[..n], &v5[..n]);
    let (o1, o2, o3, o4, o5) = (
        &mut o1[..n],
        &mut o2[..n],
        &mut o3[..n],
        &mut o4[..n],
        &mut o5[..n],
    );
    for j in 0..n {
        o0[j] = 4.0 * v0[j];
        o1[j] = 4.0 * (v2[j] - v1[j] + v5[j]) + 2.0 * (v4[j] - v3[j]);
        o2[j] = -5.0 * v0[j] - 4.0 * (v1[j] + v2[j]) - (v3[j] + v4[j]);
        o3[j] = (v1[j] - v2[j]) + 2.0 * (v3[j] - v4[j]) - 5.0 * v5[j];
        o4[j] = v0[j] + v1[j] + v2[j] + v3[j] + v4[j];
        o5[j] = v5[j];
    }
}

/// `Aᵀ·m + bias`: `(m0 + m1 + m2 + m3 + m4, m1 − m2 + 2(m3 − m4) + m5) + bias`.
#[inline(always)]
fn at_([m0, m1, m2, m3, m4, m5]: [&[f32]; N], bias: f32, o0: &mut [f32], o1: &mut [f32]) {
    let n = o0.len();
    let (m0, m1, m2, m3, m4, m5) = (&m0[..n], &m1[..n], &m2[..n], &m3[..n], &m4[..n], &m5[..n]);
    let o1 = &mut o1[..n];
    for j in 0..n {
        o0[j] = m0[j] + m1[j] + m2[j] + m3[j] + m4[j] + bias;
        o1[j] = m1[j] - m2[j] + 2.0 * (m3[j] - m4[j]) + m5[j] + bias;
    }
}

/// `A·(a, b)`: `(a, a + b, a − b, a + 2b, a − 2b, b)`.
#[inline(always)]
fn a_(a: &[f32], b: &[f32], [o0, o1, o2, o3, o4, o5]: [&mut [f32]; N]) {
    let n = o0.len();
    let (a, b) = (&a[..n], &b[..n]);
    let (o1, o2, o3, o4, o5) = (
        &mut o1[..n],
        &mut o2[..n],
        &mut o3[..n],
        &mut o4[..n],
        &mut o5[..n],
    );
    for j in 0..n {
        o0[j] = a[j];
        o1[j] = a[j] + b[j];
        o2[j] = a[j] - b[j];
        o3[j] = a[j] + 2.0 * b[j];
        o4[j] = a[j] - 2.0 * b[j];
        o5[j] = b[j];
    }
}

/// The taps of a padded row (`2·tw + 4` long): `p_k[tx] = row[2·tx + k]`.
#[inline(always)]
fn taps(row: &[f32], tw: usize, at: usize, [p0, p1, p2, p3, p4, p5]: [&mut [f32]; N]) {
    let (p0, p1, p2, p3, p4, p5) = (
        &mut p0[at..at + tw],
        &mut p1[at..at + tw],
        &mut p2[at..at + tw],
        &mut p3[at..at + tw],
        &mut p4[at..at + tw],
        &mut p5[at..at + tw],
    );
    for (tx, r) in row.windows(N).step_by(2).take(tw).enumerate() {
        p0[tx] = r[0];
        p1[tx] = r[1];
        p2[tx] = r[2];
        p3[tx] = r[3];
        p4[tx] = r[4];
        p5[tx] = r[5];
    }
}

/// The transpose of [`taps`]: `row[2·tx + k]` is the sum of the `p_k[tx]` that read it, added
/// in order of `k`, then `tx`.
#[inline(always)]
fn untaps(p: [&[f32]; N], tw: usize, row: &mut [f32]) {
    row.fill(0.0);
    for (k, pk) in p.into_iter().enumerate() {
        for (tx, &v) in pk[..tw].iter().enumerate() {
            row[2 * tx + k] += v;
        }
    }
}

/// [`input_transform`], inlined into each width's copy.
#[inline(always)]
fn input_transform_at(x: &[f32], s: &Shape, ch: &Chunk, v: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw) = (s.tiles(), s.tw());
    let plane = s.ph() * tw;
    let odd = (s.ph() / 2) * tw;
    let (taps_buf, rest) = scratch.split_at_mut(N * plane);
    let (cols, rest) = rest.split_at_mut(N * plane);
    let row = &mut rest[..s.pw()];
    let [p0, p1, p2, p3, p4, p5] = split(taps_buf, plane);
    let [c0, c1, c2, c3, c4, c5] = split(cols, plane);
    for (b, xc) in x.chunks_exact(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        for py in 0..s.ph() {
            // Input column ix at padded ix + pl.
            row.fill(0.0);
            if let Some(iy) = py.checked_sub(s.pt).filter(|&iy| iy < s.h) {
                row[s.pl..s.pl + s.w].copy_from_slice(&xc[iy * s.w..][..s.w]);
            }
            let p = [&mut *p0, &mut *p1, &mut *p2, &mut *p3, &mut *p4, &mut *p5];
            taps(row, tw, tap_row(py, s) * tw, p);
        }
        // Columns: d B.
        bt([&*p0, &*p1, &*p2, &*p3, &*p4, &*p5], c0, c1, c2, c3, c4, c5);
        // Rows: Bᵀ (d B), tile row ty from padded rows 2ty..2ty + 5.
        let at = c * ch.n + si * tiles;
        for (k, ck) in [&*c0, &*c1, &*c2, &*c3, &*c4, &*c5].into_iter().enumerate() {
            let r = std::array::from_fn(|i| &ck[(i % 2) * odd + (i / 2) * tw..]);
            let [v0, v1, v2, v3, v4, v5] = blocks_mut(v, k, N, ch.v_stride, at, tiles);
            bt(r, v0, v1, v2, v3, v4, v5);
        }
    }
}

/// [`input_transform_t`], inlined into each width's copy.
#[inline(always)]
fn input_transform_t_at(dv: &[f32], s: &Shape, ch: &Chunk, dx: &mut [f32], scratch: &mut [f32]) {
    let (tiles, tw) = (s.tiles(), s.tw());
    let plane = s.ph() * tw;
    let odd = (s.ph() / 2) * tw;
    let (cols, rest) = scratch.split_at_mut(N * plane);
    let (taps_buf, rest) = rest.split_at_mut(N * plane);
    let (q, rest) = rest.split_at_mut(4 * tiles);
    let row = &mut rest[..s.pw()];
    let [q2, q3, q4, q5] = split(q, tiles);
    let [c0, c1, c2, c3, c4, c5] = split(cols, plane);
    let [p0, p1, p2, p3, p4, p5] = split(taps_buf, plane);
    for (b, dxc) in dx.chunks_exact_mut(s.h * s.w).enumerate() {
        let (si, c) = (b / s.c_in, b % s.c_in);
        let at = c * ch.n + si * tiles;
        // Rows: B dV, tile row ty adding into padded rows 2ty..2ty + 5.
        for (k, ck) in [&mut *c0, &mut *c1, &mut *c2, &mut *c3, &mut *c4, &mut *c5]
            .into_iter()
            .enumerate()
        {
            let a = blocks(dv, k, N, ch.v_stride, at, tiles);
            let (even, odd_rows) = ck.split_at_mut(odd);
            let (e0, o0) = (&mut even[..tiles], &mut odd_rows[..tiles]);
            b_(a, e0, o0, q2, q3, q4, q5);
            even[tiles..].fill(0.0);
            odd_rows[tiles..].fill(0.0);
            add_into(&mut even[tw..], q2);
            add_into(&mut odd_rows[tw..], q3);
            add_into(&mut even[2 * tw..], q4);
            add_into(&mut odd_rows[2 * tw..], q5);
        }
        // Columns: (B dV) Bᵀ.
        b_([&*c0, &*c1, &*c2, &*c3, &*c4, &*c5], p0, p1, p2, p3, p4, p5);
        for (iy, dst) in dxc.chunks_exact_mut(s.w).enumerate() {
            let at = tap_row(iy + s.pt, s) * tw;
            let p = [&*p0, &*p1, &*p2, &*p3, &*p4, &*p5].map(|p| &p[at..]);
            untaps(p, tw, row);
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
    let (r, rest) = scratch.split_at_mut(2 * N * tiles);
    let (y0, y1) = rest[..2 * tiles].split_at_mut(tiles);
    for (b, yo) in y.chunks_exact_mut(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        let bias = bias.map_or(0.0, |bias| bias[o]);
        let at = o * ch.n + si * tiles;
        // Rows: Aᵀ M; output row a's column k goes to r[(a·6 + k)·tiles..].
        for k in 0..N {
            let mk = blocks(m, k, N, ch.m_stride, at, tiles);
            let (ra, rb) = r.split_at_mut(N * tiles);
            at_(
                mk,
                0.0,
                &mut ra[k * tiles..][..tiles],
                &mut rb[k * tiles..][..tiles],
            );
        }
        // Columns: (Aᵀ M) A, then the tile rows interleaved into output rows.
        for (a, ra) in r.chunks_exact(N * tiles).enumerate() {
            at_(
                std::array::from_fn(|k| &ra[k * tiles..][..tiles]),
                bias,
                y0,
                y1,
            );
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
    let r = &mut rest[..2 * N * tiles];
    for (b, dyo) in dy.chunks_exact(s.ho * s.wo).enumerate() {
        let (si, o) = (b / s.c_out, b % s.c_out);
        gather_taps(dyo, s, d);
        // Rows: A dY, for tap columns 0 and 1.
        let (da, db) = d.split_at(2 * tiles);
        let (ra, rb) = r.split_at_mut(N * tiles);
        for (col, rc) in [ra, rb].into_iter().enumerate() {
            let (d0, d1) = (&da[col * tiles..][..tiles], &db[col * tiles..][..tiles]);
            a_(d0, d1, split(rc, tiles));
        }
        // Columns: (A dY) Aᵀ.
        let at = o * ch.n + si * tiles;
        for i in 0..N {
            let (even, odd) = (&r[i * tiles..][..tiles], &r[(N + i) * tiles..][..tiles]);
            a_(even, odd, blocks_mut(z, N * i, 1, ch.m_stride, at, tiles));
        }
    }
}
