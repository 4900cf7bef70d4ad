//! The one wrapper around gemm's matrix product, for every strided product of training
//! (convolutions, linear layers, Winograd tiles) and of the server (matching scores, GEMS).
//!
//! gemm picks its SIMD kernels at run time; with `Parallelism::None` one product is summed in
//! a fixed order, and with `Parallelism::Rayon` each output tile is, so the bits do not depend
//! on the thread count.

pub use gemm::Parallelism;

/// A scalar gemm multiplies: `f32` (training) or `f64` (matching scores).
pub trait Scalar: Copy + 'static {
    /// The additive identity.
    const ZERO: Self;
    /// The multiplicative identity.
    const ONE: Self;
}

impl Scalar for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

impl Scalar for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
}

/// A strided read-only matrix.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a, T> {
    data: &'a [T],
    rows: usize,
    cols: usize,
    /// Row and column strides.
    rs: usize,
    cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major matrix with row stride `rs`.
    pub fn rows(data: &'a [T], rows: usize, cols: usize, rs: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs,
            cs: 1,
        }
    }

    /// The transpose, as a view of the same values.
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Elements spanned from the first to the last entry, inclusive.
    fn span(&self) -> usize {
        span(self.rows, self.cols, self.rs, self.cs)
    }
}

fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    match rows == 0 || cols == 0 {
        true => 0,
        false => (rows - 1) * rs + (cols - 1) * cs + 1,
    }
}

/// `dst = lhs·rhs`, or `dst += lhs·rhs` with `accumulate`, on the calling thread; `dst` has
/// row and column strides `(rs, cs)`.
///
/// gemm packs a left operand that is not column-major, so callers choose the layout that
/// leaves the smaller operand to pack.
///
/// # Panics
///
/// If the shapes disagree or a matrix runs past its slice (a bug in the caller).
pub fn matmul<T: Scalar>(
    dst: &mut [T],
    dst_strides: (usize, usize),
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
) {
    matmul_on(dst, dst_strides, lhs, rhs, accumulate, Parallelism::None);
}

/// [`matmul`] with gemm's threads: `Parallelism::Rayon` splits the output into tiles, each
/// summed over the inner dimension in the same order, so the bits do not depend on the
/// thread count.
///
/// # Panics
///
/// As [`matmul`].
pub fn matmul_on<T: Scalar>(
    dst: &mut [T],
    (dst_rs, dst_cs): (usize, usize),
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(
        rhs.rows == k
            && lhs.span() <= lhs.data.len()
            && rhs.span() <= rhs.data.len()
            && span(m, n, dst_rs, dst_cs) <= dst.len(),
        "matmul: operands of {m}x{k} and {}x{n} out of bounds or disagreeing",
        rhs.rows
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                for c in 0..n {
                    dst[r * dst_rs + c * dst_cs] = T::ZERO;
                }
            }
        }
        return;
    }
    // SAFETY: the assertion keeps every access in bounds: dst (r, c) at r·rs + c·cs,
    // lhs (r, q) at r·rs + q·cs and rhs (q, c) likewise, each below its slice's length; dst
    // does not alias the operands (it is borrowed mutably) and is initialised.
    unsafe {
        gemm_raw(
            dst.as_mut_ptr(),
            (dst_rs, dst_cs),
            lhs,
            rhs,
            accumulate,
            parallelism,
        )
    }
}

/// `lhs·rhs` in a new vector, row-major or column-major, on gemm's threads as
/// [`matmul_on`]: every value is written by the product alone, with no zeroing first (for
/// cnn-leaf's 3136 x 2048 weight gradient that memset was 2 % of an epoch).
///
/// # Panics
///
/// As [`matmul`].
pub fn product_on<T: Scalar>(
    lhs: Mat<T>,
    rhs: Mat<T>,
    row_major: bool,
    parallelism: Parallelism,
) -> Vec<T> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(
        rhs.rows == k && lhs.span() <= lhs.data.len() && rhs.span() <= rhs.data.len(),
        "product: operands of {m}x{k} and {}x{n} out of bounds or disagreeing",
        rhs.rows
    );
    let len = m * n;
    if k == 0 || len == 0 {
        return vec![T::ZERO; len];
    }
    let strides = match row_major {
        true => (n, 1),
        false => (1, m),
    };
    let mut out = Vec::with_capacity(len);
    // SAFETY: the operands are in bounds (asserted), `out` has room for the m·n values
    // at (r, c) ↦ r·rs + c·cs, which cover `0..len` exactly once, and gemm without
    // `read_dst` only writes them (a later block of the inner dimension reads back what an
    // earlier one wrote). So all `len` values are initialised before `set_len`.
    unsafe {
        gemm_raw(out.as_mut_ptr(), strides, lhs, rhs, false, parallelism);
        out.set_len(len);
    }
    out
}

/// gemm's product into `dst`.
///
/// # Safety
///
/// `dst` must be valid for writes (and, with `accumulate`, initialised reads) at every
/// (r, c) ↦ r·rs + c·cs of the `lhs.rows × rhs.cols` output, must not overlap the operands,
/// and the operands must be in bounds, with `lhs.cols = rhs.rows > 0`.
unsafe fn gemm_raw<T: Scalar>(
    dst: *mut T,
    (dst_rs, dst_cs): (usize, usize),
    lhs: Mat<T>,
    rhs: Mat<T>,
    accumulate: bool,
    parallelism: Parallelism,
) {
    // SAFETY: the caller's contract.
    unsafe {
        gemm::gemm(
            lhs.rows,
            rhs.cols,
            lhs.cols,
            dst,
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product by the definition, in f64.
    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|q| a[r * k + q] * b[q * n + c]).sum();
            }
        }
        out
    }

    #[test]
    fn products_of_transposed_and_strided_views_match_the_definition() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f64> = (0..m * k).map(|i| i as f64 * 0.5 - 2.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i % 7) as f64 - 3.0).collect();
        let want = naive(&a, &b, m, k, n);
        let mut out = vec![0.0; m * n];
        matmul(
            &mut out,
            (n, 1),
            Mat::rows(&a, m, k, k),
            Mat::rows(&b, k, n, n),
            false,
        );
        assert_eq!(out, want);
        // b stored transposed (n x k) and read through `t()`; the output column-major.
        let bt: Vec<f64> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut col_major = vec![0.0; m * n];
        let rhs = Mat::rows(&bt, n, k, k).t();
        matmul(&mut col_major, (1, m), Mat::rows(&a, m, k, k), rhs, false);
        for r in 0..m {
            for c in 0..n {
                assert_eq!(col_major[c * m + r], want[r * n + c]);
            }
        }
        // Accumulating adds; an empty inner dimension zeroes or keeps.
        matmul(
            &mut out,
            (n, 1),
            Mat::rows(&a, m, k, k),
            Mat::rows(&b, k, n, n),
            true,
        );
        assert!(out.iter().zip(&want).all(|(o, w)| *o == 2.0 * w));
        let mut kept = vec![7.0f32; 6];
        matmul(
            &mut kept,
            (3, 1),
            Mat::rows(&[], 2, 0, 0),
            Mat::rows(&[], 0, 3, 3),
            true,
        );
        assert_eq!(kept, vec![7.0; 6]);
        matmul(
            &mut kept,
            (3, 1),
            Mat::rows(&[], 2, 0, 0),
            Mat::rows(&[], 0, 3, 3),
            false,
        );
        assert_eq!(kept, vec![0.0; 6]);
    }

    #[test]
    fn new_products_equal_the_definition_in_either_layout() {
        // Large enough for gemm's blocked paths (inner blocks that read back what an earlier
        // one wrote), on one thread and on gemm's threads.
        let (m, k, n) = (37, 600, 29);
        let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
        let want = naive(&a, &b, m, k, n);
        for par in [Parallelism::None, Parallelism::Rayon(2)] {
            let (lhs, rhs) = (Mat::rows(&a, m, k, k), Mat::rows(&b, k, n, n));
            assert_eq!(product_on(lhs, rhs, true, par), want);
            let col = product_on(lhs, rhs, false, par);
            for r in 0..m {
                for c in 0..n {
                    assert_eq!(col[c * m + r], want[r * n + c]);
                }
            }
        }
        let empty = product_on(
            Mat::<f32>::rows(&[], 2, 0, 0),
            Mat::rows(&[], 0, 3, 3),
            true,
            Parallelism::None,
        );
        assert_eq!(empty, vec![0.0f32; 6]);
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_view_past_its_slice_is_refused() {
        let a = [1.0f32; 5];
        let mut out = [0.0f32; 4];
        matmul(
            &mut out,
            (2, 1),
            Mat::rows(&a, 2, 3, 3),
            Mat::rows(&a, 3, 2, 2),
            false,
        );
    }
}
