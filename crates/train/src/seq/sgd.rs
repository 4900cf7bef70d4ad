//! Plain SGD (no momentum, no weight decay) as one parallel pass per parameter.
//!
//! burn's `Sgd` takes two serial passes over each parameter (`g·lr`, then `w − g·lr`);
//! cnn-leaf's 6.4 M-weight layer made them 5-6 % of an epoch on one core, and they stayed on
//! one core with two. Here one pass reads `w` and `g` and updates `w` in place, in chunks
//! that rayon runs in parallel (a fresh output buffer measured slower than burn's two passes:
//! the writes to new memory cost a read each). The bits are burn's: in both the product is rounded to `f32`
//! before the subtraction (Rust fuses no multiply-add), element by element, so the thread
//! count does not change them either.

use burn::backend::Flex;
use burn::optim::{LearningRate, Optimizer, SgdState};
use burn::tensor::{DType, Device, Tensor};
use rayon::prelude::*;

use super::affine::{contiguous_f32, values};

/// Values per parallel chunk (256 KB): small parameters stay one task.
const CHUNK: usize = 1 << 16;

/// `w ← w − lr·g` for every parameter: burn's `Sgd` without momentum or weight decay.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlainSgd;

impl Optimizer for PlainSgd {
    type State<const D: usize> = SgdState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        _: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let updated = match step_flex(tensor, grad, lr) {
            Ok(t) => t,
            // Another backend or dtype: burn's two operations, the same arithmetic.
            Err(back) => back.0 - back.1.mul_scalar(lr),
        };
        (updated, None)
    }

    fn to_device<const D: usize>(state: Self::State<D>, _: &Device) -> Self::State<D> {
        state
    }
}

/// The step on Flex `f32` tensors, in place in `w`'s buffer (copied first only if another
/// tensor shares it), or the tensors back where it does not apply.
fn step_flex<const D: usize>(
    w: Tensor<D>,
    g: Tensor<D>,
    lr: LearningRate,
) -> Result<Tensor<D>, Box<(Tensor<D>, Tensor<D>)>> {
    let dims = w.dims();
    let n: usize = dims.iter().product();
    // The downcasts consume their tensor, so they work on clones (reference-count bumps).
    let (Ok(mut wp), Ok(gp)) = (
        w.clone().try_into_primitive::<Flex>(),
        g.clone().try_into_primitive::<Flex>(),
    ) else {
        return Err(Box::new((w, g)));
    };
    let gp = match contiguous_f32(&gp) {
        Some(gp) if g.dims() == dims && values(&gp, n).is_some() => gp,
        _ => return Err(Box::new((w, g))),
    };
    if wp.dtype() != DType::F32 || wp.layout().contiguous_offsets() != Some((0, n)) {
        return Err(Box::new((w, g)));
    }
    // Dropped, so that `wp` holds the parameter's only reference and is updated in place.
    drop((w, g));
    let gs = values(&gp, n).unwrap_or_default();
    let lr = lr as f32;
    wp.storage_mut::<f32>()[..n]
        .par_chunks_mut(CHUNK)
        .zip(gs.par_chunks(CHUNK))
        .for_each(|(w, g)| {
            for (w, &g) in w.iter_mut().zip(g) {
                *w -= g * lr;
            }
        });
    Ok(Tensor::from_primitive::<Flex>(wp))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use burn::tensor::{Device, Tensor, TensorData};

    use crate::seq::tests::noise;

    #[test]
    fn one_pass_gives_burns_bits_on_every_thread_count() {
        let device = Device::flex();
        // Three chunks, the last one partial.
        let n = 2 * super::CHUNK + 124;
        assert_eq!(n % 3, 0);
        let t = |seed| Tensor::<2>::from_data(TensorData::new(noise(n, seed), [n / 3, 3]), &device);
        let (w, g) = (t(1), t(2));
        let lr = 0.0123;
        let burn = (w.clone() - g.clone().mul_scalar(lr)).to_data();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            // A parameter shared with `w` (copied, then updated), and one of its own (in place).
            for param in [w.clone(), t(1)] {
                let ours = pool.install(|| super::step_flex(param, g.clone(), lr));
                let Ok(ours) = ours else {
                    panic!("the one-pass step applies")
                };
                assert_eq!(ours.to_data(), burn, "{threads} threads");
            }
        }
        // The shared one was copied, not written through.
        assert_eq!(w.to_data(), t(1).to_data());
    }
}
