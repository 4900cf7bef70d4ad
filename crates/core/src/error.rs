use std::path::PathBuf;

/// Errors of `fedfuse-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// A tensor's data length does not match its shape.
    #[error("tensor `{name}`: shape {shape:?} needs {expected} values but {actual} were given")]
    ShapeMismatch {
        /// Tensor name.
        name: String,
        /// Declared shape.
        shape: Vec<usize>,
        /// Values the shape needs.
        expected: usize,
        /// Values given.
        actual: usize,
    },
    /// Two parameter sets do not have the same layout.
    #[error("parameter layout differs: {0}")]
    LayoutMismatch(String),
    /// A tensor name appears twice.
    #[error("tensor `{0}` appears twice")]
    DuplicateTensor(String),
    /// More tensors than one set may hold.
    #[error("more than {0} tensors in one model; no network has that many layers")]
    TooManyTensors(usize),
    /// A tensor that was asked for is absent.
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    /// A tensor holds NaN or infinite values.
    #[error("tensor `{name}` holds {count} non-finite value(s) (NaN or Inf)")]
    NonFinite {
        /// Tensor name.
        name: String,
        /// How many values are not finite.
        count: usize,
    },
    /// A batch-norm buffer holds a value outside its domain (a negative variance or count).
    #[error("tensor `{name}` holds {value} at index {index}: {reason}")]
    OutOfDomain {
        /// Tensor name.
        name: String,
        /// Index of the first bad value.
        index: usize,
        /// The value.
        value: f32,
        /// What the tensor's values must be.
        reason: &'static str,
    },
    /// A record or safetensors buffer could not be decoded.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A tensor has a dtype fedfuse does not read.
    #[error(
        "tensor `{name}` has dtype {dtype}; fedfuse reads F32, F16, BF16 and F64 tensors, and \
         I64 for batch norm's `num_batches_tracked`"
    )]
    UnsupportedDtype {
        /// Tensor name.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// Per-group values (thresholds, gates, probabilities) do not match a model's groups.
    #[error("per-group values do not fit the model: {0}")]
    GroupMismatch(String),
    /// A numeric setting is out of its range.
    #[error("invalid setting `{field}`: {reason}")]
    InvalidSetting {
        /// The setting, by its own name (callers that know the config file add its table).
        field: &'static str,
        /// Why, and what would be valid.
        reason: String,
    },
    /// A model specification is invalid.
    #[error("invalid model: {0}")]
    InvalidSpec(String),
    /// File I/O failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Result with [`CoreError`].
pub type Result<T> = std::result::Result<T, CoreError>;
