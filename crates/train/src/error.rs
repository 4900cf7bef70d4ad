/// Errors of `fedfuse-train`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// Parameters do not fit the model.
    #[error(transparent)]
    Core(#[from] fedfuse_core::CoreError),
    /// The data does not fit the model.
    #[error("data does not fit the model: {0}")]
    DataMismatch(String),
    /// A training setting is invalid.
    #[error("invalid training setting `{field}`: {reason}")]
    InvalidConfig {
        /// The setting, as named in the config file (`train.lr`, ...).
        field: &'static str,
        /// Why it is invalid and what would be valid.
        reason: String,
    },
    /// Training diverged.
    #[error("training diverged (loss {loss}) at epoch {epoch}; lower train.lr")]
    Diverged {
        /// The non-finite loss.
        loss: f64,
        /// Epoch, from 1.
        epoch: usize,
    },
    /// The tensor library failed to hand back values.
    #[error("tensor library: {0}")]
    Backend(String),
    /// NGM feature blocks do not tile the units.
    #[error("feature blocks do not fit the units: {0}")]
    Blocks(String),
    /// An NGM feature graph is malformed or does not match the feature blocks.
    #[error("feature graph: {0}")]
    Graph(String),
    /// Data holds a NaN or infinity where a value is needed.
    #[error(
        "{what} holds a non-finite value at row {row}, unit {unit}; impute or drop it before \
         calling (only unknown entries of inference input may be NaN)"
    )]
    NonFinite {
        /// The argument (`x`, `targets`, ...).
        what: &'static str,
        /// Row, from 0.
        row: usize,
        /// Unit (column), from 0.
        unit: usize,
    },
    /// An argument that needs rows has none.
    #[error("{0} has no rows; pass at least one sample")]
    EmptyData(&'static str),
}

/// Result with [`TrainError`].
pub type Result<T> = std::result::Result<T, TrainError>;
