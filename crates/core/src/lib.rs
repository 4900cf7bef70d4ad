//! Core types of fedfuse: the interface every other crate speaks.
//!
//! - [`ModelSpec`]: an architecture (layer kinds and widths) and the parameter layout it implies.
//! - [`Params`]: ordered, named f32 tensors with shapes, PyTorch naming (`layers.0.weight` is
//!   `[out, in]`).
//! - [`Record`]: the unit of traffic between a client and the server (arrays + config + metrics +
//!   `num_examples`), with a wire encoding whose length is the traffic figure; [`sparse_codec`] writes
//!   mostly-zero tensors as their non-zero values and a compact index when a record asks.
//! - [`GroupLayout`]: the parameter groups (hidden units, conv filters) that structured
//!   sparsity switches on and off, and FedSparse's gate maths over them ([`groups`]).
//! - safetensors file I/O for [`Params`], and `.npz` input (numpy's `savez`), with
//!   [`load_params`] choosing by extension.
//!
//! ```
//! use fedfuse_core::{ModelSpec, Params, Record};
//! let spec = ModelSpec::mlp(4, &[3], 2);
//! let params = Params::zeros(&spec.param_shapes());
//! assert_eq!(params.num_values(), 4 * 3 + 3 + 3 * 2 + 2);
//! let record = Record::from_params(params.clone()).with_num_examples(10);
//! let bytes = record.encode()?;
//! let back = Record::decode(&bytes)?;
//! assert_eq!(back.params, params);
//! assert_eq!(back.num_examples, 10);
//! # Ok::<(), fedfuse_core::CoreError>(())
//! ```
#![deny(missing_docs)]

mod container;
mod error;
mod features;
pub mod flower;
pub mod groups;
mod io;
pub mod layers;
pub mod linalg;
mod npz;
mod params;
mod record;
pub mod sparse_codec;
mod spec;
pub mod zoo;

pub use error::{CoreError, Result};
pub use features::{BlockAggregate, BlockKind, FeatureBlock, block_scores};
pub use groups::{GroupLayout, GroupedLayer, GroupedRows};
pub use io::{
    MAX_FILE_BYTES, load_safetensors, params_from_safetensors, params_to_safetensors,
    read_regular_file, read_safetensors_file, save_safetensors, write_safetensors,
};
pub use layers::{BlockNorm, FeatureShape, LayerSpec, TensorRole};
pub use npz::{decode_npy_array, encode_npy, load_npz, load_params, params_from_npz};
pub use params::{Params, Tensor};
pub use record::{ConfigValue, Record};
pub use spec::{Activation, ModelSpec, ParamShape};
pub use zoo::{TorchvisionNames, VitShape, ZooModel};
