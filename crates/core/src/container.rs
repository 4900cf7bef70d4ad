//! The safetensors container that model files and both record encodings share: little-endian
//! f32 tensors, and their order in the header (safetensors itself sorts tensors by name).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use safetensors::tensor::{SafeTensors, View};

use crate::{CoreError, Params, Result, Tensor};

/// Metadata key holding the tensor order.
pub(crate) const ORDER_KEY: &str = "fedfuse.order";

/// `t`'s values as the container stores them, little-endian f32: on such machines the memory
/// is the bytes.
pub(crate) fn le_bytes(t: &Tensor) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(&t.data))
    } else {
        Cow::Owned(t.data.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}

/// A dense tensor as a safetensors view.
pub(crate) struct F32View<'a>(pub(crate) &'a Tensor);

impl View for F32View<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        le_bytes(self.0)
    }
    fn data_len(&self) -> usize {
        self.0.data.len() * 4
    }
}

/// Batch norm's `num_batches_tracked`, stored as PyTorch stores it: a little-endian I64.
pub(crate) struct CounterView<'a> {
    shape: &'a [usize],
    bytes: Vec<u8>,
}

impl<'a> CounterView<'a> {
    /// The counts of `t`, rounded, negatives as 0 (a count held in f32 is exact to 2^24).
    pub(crate) fn of(t: &'a Tensor) -> Self {
        let bytes = t
            .data
            .iter()
            .flat_map(|v| (v.round().max(0.0) as i64).to_le_bytes())
            .collect();
        Self {
            shape: &t.shape,
            bytes,
        }
    }
}

impl View for CounterView<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        safetensors::Dtype::I64
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// A tensor of a model file: f32, or I64 for batch norm's counters.
pub(crate) enum FileView<'a> {
    F32(F32View<'a>),
    Counter(CounterView<'a>),
}

impl<'a> FileView<'a> {
    pub(crate) fn of(name: &str, t: &'a Tensor) -> Self {
        if crate::layers::is_counter(name) {
            Self::Counter(CounterView::of(t))
        } else {
            Self::F32(F32View(t))
        }
    }
}

impl View for FileView<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self {
            Self::F32(v) => v.dtype(),
            Self::Counter(v) => v.dtype(),
        }
    }
    fn shape(&self) -> &[usize] {
        match self {
            Self::F32(v) => v.shape(),
            Self::Counter(v) => v.shape(),
        }
    }
    fn data(&self) -> Cow<'_, [u8]> {
        match self {
            Self::F32(v) => v.data(),
            Self::Counter(v) => v.data(),
        }
    }
    fn data_len(&self) -> usize {
        match self {
            Self::F32(v) => v.data_len(),
            Self::Counter(v) => v.data_len(),
        }
    }
}

/// Serialises `views`, one per tensor of `params` in its order, with that order and
/// `metadata` in the header.
pub(crate) fn serialize<V: View>(
    params: &Params,
    views: impl IntoIterator<Item = (String, V)>,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    safetensors::serialize(views, Some(with_order(params, metadata)?)).map_err(|e| {
        CoreError::Decode {
            what: "parameters".into(),
            reason: e.to_string(),
        }
    })
}

/// [`serialize`] straight into the file at `path`, through a temporary file beside it and a
/// rename: no copy of the tensors is made in memory (a fused ResNet-50 is 94 MB), and a
/// reader never sees half a file.
pub(crate) fn serialize_to_file<V: View>(
    params: &Params,
    views: impl IntoIterator<Item = (String, V)>,
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<()> {
    safetensors::serialize_to_file(views, Some(with_order(params, metadata)?), path).map_err(|e| {
        match e {
            safetensors::SafeTensorError::IoError(source) => CoreError::Io {
                path: path.to_path_buf(),
                source,
            },
            other => CoreError::Decode {
                what: format!("parameters for {}", path.display()),
                reason: other.to_string(),
            },
        }
    })
}

/// `metadata` with the tensors' order added.
fn with_order(
    params: &Params,
    mut metadata: HashMap<String, String>,
) -> Result<HashMap<String, String>> {
    let order = serde_json::to_string(params.names()).map_err(|e| CoreError::Decode {
        what: "tensor names".into(),
        reason: e.to_string(),
    })?;
    metadata.insert(ORDER_KEY.to_string(), order);
    Ok(metadata)
}

/// A parsed container.
pub(crate) struct Container<'a> {
    /// The tensors.
    pub(crate) tensors: SafeTensors<'a>,
    /// The header's metadata, without the order.
    pub(crate) metadata: HashMap<String, String>,
    /// The recorded order, which names every tensor once; `None` when the header has none
    /// (files written elsewhere).
    pub(crate) order: Option<Vec<String>>,
}

/// Parses `bytes`, checking that a recorded order names every tensor once: a partial list
/// would drop tensors silently, a repeated name would read one twice.
pub(crate) fn parse(bytes: &[u8]) -> Result<Container<'_>> {
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| CoreError::Decode {
        what: "safetensors buffer".into(),
        reason: e.to_string(),
    })?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| CoreError::Decode {
        what: "safetensors header".into(),
        reason: e.to_string(),
    })?;
    let mut metadata = header.metadata().clone().unwrap_or_default();
    let bad_order = |reason: String| CoreError::Decode {
        what: format!("`{ORDER_KEY}` metadata"),
        reason,
    };
    let order = match metadata.remove(ORDER_KEY) {
        None => None,
        Some(json) => {
            let names: Vec<String> =
                serde_json::from_str(&json).map_err(|e| bad_order(e.to_string()))?;
            // Sets: scanning one list per name of the other is quadratic on a header of
            // millions of names.
            let listed: HashSet<&str> = names.iter().map(String::as_str).collect();
            let stored = tensors.names();
            if listed.len() != names.len()
                || names.len() != stored.len()
                || stored.iter().any(|n| !listed.contains(n))
            {
                // The first 20 unlisted say enough.
                let mut unlisted: Vec<&str> = stored
                    .iter()
                    .copied()
                    .filter(|n| !listed.contains(n))
                    .collect();
                unlisted.sort_unstable();
                unlisted.truncate(20);
                return Err(bad_order(format!(
                    "it lists {} tensors for the buffer's {} (unlisted: {unlisted:?}); it must \
                     name each tensor once",
                    names.len(),
                    stored.len()
                )));
            }
            Some(names)
        }
    };
    Ok(Container {
        tensors,
        metadata,
        order,
    })
}
