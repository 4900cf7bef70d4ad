//! The memory one local training step and one evaluation batch take, estimated from the
//! layer shapes before anything is allocated, so that a network whose activations cannot fit
//! (a 1x1 convolution padded by 1024 on MNIST wants 35 GB a batch) is refused at load with the
//! layer to blame, instead of aborting on an allocation mid-round.
//!
//! The estimate is an upper bound on the heap a step allocates, built the way the engine
//! works (`seq`): a training step keeps every layer's output for the backward pass, plus what
//! each op saves of its own (batch norm its normalised input and statistics, max pooling its
//! indices, ReLU and dropout their masks), and at one time during the backward pass two
//! activation gradients, one convolution's per-task partial weight gradients and its im2col
//! or Winograd scratch (one per thread, kept between calls); the parameters take a copy each
//! for the weights, their gradients, two optimizer moments and the copies in and out of the
//! module. Evaluation runs forward only, [`EVAL_BATCH`] samples a chunk, one chunk per
//! thread: a layer's input and output at a time. `tests/` checks the bound against the heap a
//! real step allocates (within a stated factor).

use fedfuse_core::layers::{FeatureShape, LayerSpec};
use fedfuse_core::{ModelSpec, TensorRole};

use crate::Result;

/// Samples the server scores at a time, per thread (the trainer's evaluation chunks).
pub const EVAL_BATCH: usize = 1024;
/// Samples a convolution's parallel task covers.
const CONV_SAMPLES_PER_TASK: u128 = crate::seq::conv::SAMPLES_PER_TASK as u128;
/// Copies of the parameters alive in a step: the module's, their gradients, two moments, the
/// Params in and out.
const PARAM_COPIES: u128 = 6;

/// What a model needs per local training step and per evaluation chunk, in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// One local training step (forward and backward) on a batch.
    pub train_bytes: u64,
    /// One evaluation chunk of [`EVAL_BATCH`] samples on each thread.
    pub eval_bytes: u64,
    /// The layer whose activations weigh most in the larger of the two: index in the layer
    /// list, type and its share in bytes.
    pub heaviest: (usize, &'static str, u64),
}

impl MemoryEstimate {
    /// The larger of the training and evaluation needs.
    pub fn peak(&self) -> u64 {
        self.train_bytes.max(self.eval_bytes)
    }
}

/// Output-sized tensors a layer keeps for the backward pass, its output included.
fn kept_per_output(layer: &LayerSpec, input: FeatureShape) -> u128 {
    match layer {
        // Normalised input and the output; per-channel statistics are small.
        LayerSpec::BatchNorm1d { .. }
        | LayerSpec::BatchNorm2d { .. }
        | LayerSpec::GroupNorm { .. }
        | LayerSpec::LayerNorm { .. } => 3,
        // Output and mask (or indices, up to 8 bytes each).
        LayerSpec::Relu | LayerSpec::Dropout { .. } => 2,
        LayerSpec::MaxPool2d { .. } => 3,
        // Each convolution with its norm and ReLU (at most the output's size each), the
        // shortcut (projected and normed when the shape changes), the sum and its ReLU.
        LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. } => {
            let Some(block) = layer.block() else { return 1 };
            let projected = block.has_projection(input.channels());
            7 * block.convs.len() as u128 + if projected { 4 } else { 0 }
        }
        LayerSpec::Flatten
        | LayerSpec::Conv2d { .. }
        | LayerSpec::Linear { .. }
        | LayerSpec::AvgPool2d { .. }
        | LayerSpec::GlobalAvgpool
        | LayerSpec::ClassToken => 1,
        // The patch convolution's output, its transpose, the tokens with the class token and
        // the sum with the positional embedding.
        LayerSpec::Tokens { .. } => 4,
        // In units of the block's `[seq, hidden]` output: both layer norms (3 each), q, k, v
        // and their per-head copies, the attended values, the two residual sums and the
        // output projection (about 11); the MLP's hidden units before and after GELU (2
        // `mlp / hidden`); the attention scores and their softmax (`heads * seq` per token,
        // twice, and a third for the gradient).
        LayerSpec::Encoder { heads, mlp, .. } => match input {
            FeatureShape::Tokens { seq, hidden } => {
                let per = |v: usize| (v as u128).div_ceil(hidden.max(1) as u128);
                17 + per(2 * mlp) + per(3 * heads * seq)
            }
            _ => 1,
        },
    }
}

/// Values of one convolution's per-sample scratch (im2col columns, or Winograd's
/// transformed input and output, whichever is larger) and of its weights, for the
/// convolutions inside `layer` on `input`.
fn conv_scratch(layer: &LayerSpec, input: FeatureShape, out: FeatureShape) -> (u128, u128) {
    let FeatureShape::Image { c, .. } = input else {
        return (0, 0);
    };
    let c_in = c as u128;
    let (c_out, pixels) = match out {
        FeatureShape::Image { c, h, w } => (c as u128, h as u128 * w as u128),
        // The patch convolution's outputs: every token but the class token.
        FeatureShape::Tokens { seq, hidden } => (hidden as u128, seq.saturating_sub(1) as u128),
        FeatureShape::Flat(_) => return (0, 0),
    };
    let one = |cg: u128, k: u128, c_out: u128, pixels: u128| {
        // Winograd's (k+1)x(k+1) tiles over 2x2 outputs: 4 values per output pixel and
        // channel for 3x3 kernels, 9 for 5x5 (other sizes keep im2col, which then dominates).
        let winograd = (k + 1).pow(2) / 4 * (cg + c_out) * pixels;
        (cg * k * k * pixels).max(winograd)
    };
    match *layer {
        LayerSpec::Tokens { patch, .. } => {
            let k = patch as u128;
            (c_in * k * k * pixels, c_out * c_in * k * k)
        }
        LayerSpec::Conv2d { kernel, groups, .. } => {
            let cg = c_in / groups as u128;
            (
                one(cg, kernel as u128, c_out, pixels),
                c_out * cg * (kernel as u128).pow(2),
            )
        }
        LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. } => {
            let Some(block) = layer.block() else {
                return (0, 0);
            };
            // The convolutions before the strided one run at the input's size.
            let mut px = pixels * (block.stride as u128).pow(2);
            let mut cin = c_in;
            let (mut scratch, mut weights) = (0u128, 0u128);
            for conv in &block.convs {
                if conv.stride > 1 {
                    px = pixels;
                }
                let (rows, k) = (conv.rows as u128, conv.kernel as u128);
                scratch = scratch.max(one(cin, k, rows, px));
                weights = weights.max(rows * cin * k * k);
                cin = rows;
            }
            (scratch, weights)
        }
        _ => (0, 0),
    }
}

/// The memory `spec` needs to train on batches of `batch` samples, and to be evaluated, with
/// `threads` worker threads (each keeps its own convolution scratch, and evaluates its own
/// chunk).
pub fn estimate(spec: &ModelSpec, batch: usize, threads: usize) -> Result<MemoryEstimate> {
    // Computed in u128: a million-sample batch of a wide list would pass u64.
    const F32: u128 = 4;
    let list = spec.as_sequential();
    let (ModelSpec::Sequential { input, .. }, Some((shapes, tensors))) = (&list, list.chain()?)
    else {
        // as_sequential always gives a layer list.
        return Ok(MemoryEstimate {
            train_bytes: 0,
            eval_bytes: 0,
            heaviest: (0, "none", 0),
        });
    };
    let input = FeatureShape::of(input)?;
    let (batch, threads) = (batch as u128, threads.max(1) as u128);
    let eval_batch = EVAL_BATCH as u128;
    let numel = |shape: &[usize]| shape.iter().map(|&d| d as u128).product::<u128>();
    let params: u128 = tensors.iter().map(|t| numel(&t.shape)).sum();
    let trainable: u128 = tensors
        .iter()
        .filter(|t| TensorRole::of(&t.name) == TensorRole::Param)
        .map(|t| numel(&t.shape))
        .sum();

    let mut kept = input.len() as u128; // the batch itself, as a tensor
    let mut widest = input.len() as u128;
    let mut eval_pair = 0u128;
    let mut scratch = 0u128;
    let mut partials = 0u128;
    let mut heaviest = (0usize, "none", 0u128);
    let mut at = input;
    for (i, (layer, &out)) in list.layer_list().iter().zip(&shapes).enumerate() {
        let values = out.len() as u128;
        let layer_kept = kept_per_output(layer, at) * values;
        kept += layer_kept;
        widest = widest.max(values);
        eval_pair = eval_pair.max(at.len() as u128 + values);
        let (col, weights) = conv_scratch(layer, at, out);
        scratch = scratch.max(col);
        // Per-task partial weight gradients (Winograd's are 16/9 the weights), added after
        // the tasks end.
        partials = partials.max(batch.div_ceil(CONV_SAMPLES_PER_TASK) * weights * 16 / 9);
        let share = (batch * layer_kept).max(threads * eval_batch * values) * F32;
        if share > heaviest.2 {
            heaviest = (i, layer.type_name(), share);
        }
        at = out;
    }
    let per_task = CONV_SAMPLES_PER_TASK.min(batch.max(1));
    let train_values = batch * kept
        + 2 * batch * widest
        + partials
        + threads * per_task * scratch
        + PARAM_COPIES * trainable
        + params;
    let eval_values =
        threads * (eval_batch * eval_pair + CONV_SAMPLES_PER_TASK * scratch) + 2 * params;
    let bytes = |v: u128| u64::try_from(v * F32).unwrap_or(u64::MAX);
    Ok(MemoryEstimate {
        train_bytes: bytes(train_values),
        eval_bytes: bytes(eval_values),
        heaviest: (
            heaviest.0,
            heaviest.1,
            u64::try_from(heaviest.2).unwrap_or(u64::MAX),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedfuse_core::{BlockNorm, ZooModel};

    #[test]
    fn a_linear_layer_by_hand() {
        // [4] -> linear 3: 12 + 3 parameters; a batch of 2.
        let spec = ModelSpec::sequential(&[4], vec![LayerSpec::linear(3)]);
        let e = estimate(&spec, 2, 1).unwrap();
        // kept: input 4 + output 3 = 7 per sample (x2); gradients 2 x 2 x 4 (widest);
        // parameters 6 x 15 + 15.
        assert_eq!(e.train_bytes, 4 * (2 * 7 + 2 * 2 * 4 + 6 * 15 + 15));
        // One chunk of 1024 samples: input and output, plus twice the parameters.
        assert_eq!(e.eval_bytes, 4 * (1024 * 7 + 2 * 15));
        assert_eq!(e.heaviest.1, "linear");
    }

    #[test]
    fn a_wide_padded_convolution_needs_tens_of_gigabytes_and_is_named() {
        // The case: 64 channels of 2076x2076 per MNIST sample.
        let spec = ModelSpec::sequential(
            &[1, 28, 28],
            vec![
                LayerSpec::conv2d(64, 1).with_padding(1024),
                LayerSpec::GlobalAvgpool,
                LayerSpec::Flatten,
                LayerSpec::linear(10),
            ],
        );
        let e = estimate(&spec, 32, 2).unwrap();
        assert!(e.train_bytes > 32 << 30, "{e:?}");
        assert_eq!((e.heaviest.0, e.heaviest.1), (0, "conv2d"));
    }

    #[test]
    fn the_zoo_needs_under_a_gigabyte_per_thread() {
        for (zoo, input, batch) in [
            (ZooModel::Resnet20, [3, 32, 32], 64),
            (ZooModel::Vgg9, [3, 32, 32], 64),
            (ZooModel::CnnLeaf, [1, 28, 28], 64),
        ] {
            let spec = ModelSpec::sequential(&input, zoo.layers(100, BlockNorm::Batch, 16));
            let e = estimate(&spec, batch, 1).unwrap();
            assert!(e.peak() < 1 << 30, "{zoo:?}: {e:?}");
        }
    }
}
