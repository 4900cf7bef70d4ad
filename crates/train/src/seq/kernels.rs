//! The leaf of the layer engine: what its kernels share and nothing of burn's. Matrix
//! products go through [`fedfuse_core::linalg`], the one gemm wrapper.

/// Defines `$name` to run `$body` (an `#[inline(always)]` function) compiled for the widest
/// vector unit of this machine: AVX-512F, AVX2 or the baseline. Only for loops whose
/// results do not depend on the width: element by element, or sums over lanes the code
/// itself fixes (Rust fuses no multiply-add on its own), so every copy gives the same bits.
macro_rules! widest {
    ($(#[$doc:meta])* fn $name:ident => $body:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: this CPU has AVX-512F.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: this CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

/// Lanes of [`lane_sum`]: fixed here, so every vector width adds in the same order.
pub(crate) const LANES: usize = 8;

/// The sum of `row` over [`LANES`] partial sums (then the remainder), vectorisable: a plain
/// `sum` is one chain of dependent adds.
#[inline(always)]
pub(crate) fn lane_sum(row: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    acc.iter().sum::<f32>() + tail
}

/// Runs `f` on `len` values of the calling thread's buffer `key`, grown as needed and kept
/// between calls; its contents are stale.
pub(crate) fn with_kept<R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<Vec<f32>>>,
    len: usize,
    f: impl FnOnce(&mut [f32]) -> R,
) -> R {
    key.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(&mut buf[..len])
    })
}

/// `data` (`rows x cols`, row-major) transposed. In square blocks, so that reads and writes
/// both stay within a few cache lines: cnn-leaf's 3136x2048 weight is transposed twice per
/// local fit, and element by element the writes missed the cache every time.
pub(crate) fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const BLOCK: usize = 32;
    let mut out = vec![0.0; data.len()];
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..cols).step_by(BLOCK) {
            for r in r0..(r0 + BLOCK).min(rows) {
                let src = &data[r * cols..][c0..(c0 + BLOCK).min(cols)];
                for (c, &v) in (c0..).zip(src) {
                    out[c * rows + r] = v;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_moves_every_element_across_block_edges() {
        for (rows, cols) in [(1, 1), (3, 70), (37, 33), (64, 32)] {
            let data: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = crate::seq::kernels::transpose(&data, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        data[r * cols + c],
                        "{rows}x{cols} at ({r}, {c})"
                    );
                }
            }
        }
    }
}
