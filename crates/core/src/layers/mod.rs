//! Layer-list models: the layers of `[model] kind = "sequential"` (`vocabulary`), the shapes
//! they chain and the tensors they hold, named as PyTorch names the same `nn.Sequential`
//! (`shapes`), and the map of which tensor entries hold or read each unit (`units`).
//!
//! Layer `i` of the list is child `i` of an `nn.Sequential`, so its tensors are `{i}.weight`,
//! `{i}.bias`, and for batch norm also the buffers `{i}.running_mean`, `{i}.running_var` and
//! `{i}.num_batches_tracked` (a scalar, I64 in files). Layers without tensors (ReLU, pooling,
//! dropout, flatten) still take their index, as in PyTorch. A [`LayerSpec::Residual`] block is
//! the basic block of He et al. (2016) with children `conv1`, `bn1`, `conv2`, `bn2` and, when
//! the block changes width or stride, a projection `shortcut` (`shortcut.0` the 1x1
//! convolution, `shortcut.1` its norm): the module tree of `scripts/zoo_reference.py`.
//!
//! [`gate_points`] are the layers whose units (filters, linear units, a block's inner channels)
//! methods gate, drop or prune; [`unit_uses`] lists, for each, every tensor entry that holds or
//! reads a unit, so that dropping or permuting units goes through one map.
//!
//! ```
//! use fedfuse_core::{LayerSpec, ModelSpec};
//! let spec = ModelSpec::sequential(
//!     &[1, 28, 28],
//!     vec![
//!         LayerSpec::conv2d(8, 3).with_padding(1),
//!         LayerSpec::Relu,
//!         LayerSpec::max_pool(2),
//!         LayerSpec::Flatten,
//!         LayerSpec::linear(10),
//!     ],
//! );
//! spec.validate()?;
//! let names: Vec<String> = spec.param_shapes().into_iter().map(|p| p.name).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "4.weight", "4.bias"]);
//! assert_eq!(spec.classes(), 10);
//! # Ok::<(), fedfuse_core::CoreError>(())
//! ```

mod shapes;
mod units;
mod vocabulary;

pub use shapes::{
    FeatureShape, MAX_LAYERS, MAX_VALUES, TensorRole, at_widths, bounded_len, chain,
    has_projection, is_counter, norm_affine_names, norm_tensor_names,
};
pub use units::{GatePoint, UnitUse, UnitUses, gate_points, permutation_groups, unit_uses};
pub use vocabulary::{BlockConv, BlockNorm, BlockShape, LayerSpec};
