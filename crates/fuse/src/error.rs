/// Errors of `fedfuse-fuse`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FuseError {
    /// Nothing to aggregate.
    #[error("no client models to aggregate")]
    Empty,
    /// Inputs disagree in layout.
    #[error(transparent)]
    Layout(#[from] fedfuse_core::CoreError),
    /// A parameter is out of its range.
    #[error("invalid aggregation setting `{field}`: {reason}")]
    InvalidSetting {
        /// The setting (`method.beta`, ...).
        field: &'static str,
        /// Why, and what is valid.
        reason: String,
    },
    /// A client model or matrix cannot be matched (wrong layout, non-finite values, ...).
    #[error("invalid matching input: {0}")]
    InvalidInput(String),
    /// A saved server state (a checkpoint's) that does not fit: the reason.
    #[error("invalid saved state: {0}")]
    InvalidState(String),
    /// GEMS: the learners' good-enough balls have no common point.
    #[error(
        "the good-enough balls of {balls} learners do not intersect (remaining violation \
         {violation:.4}); raise epsilon (a looser criterion gives larger balls), or retrain the \
         learners from other initialisations"
    )]
    NoIntersection {
        /// How many balls.
        balls: usize,
        /// `sum_k max(0, ||theta - c_k|| - R_k)` where the search stopped.
        violation: f64,
    },
    /// A graph is malformed or two graphs cannot be compared (FedNGM graph maths).
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
    /// A layer of a layer list that matching cannot permute (named by its index and type).
    #[error("model.layers[{layer}] ({kind}): {reason}")]
    UnsupportedLayer {
        /// Index of the layer in the list.
        layer: usize,
        /// Its type (`residual`, `groupnorm`, ...).
        kind: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// The linear sum assignment could not be solved.
    #[error("linear sum assignment failed: {0}")]
    Solver(String),
}

/// Result with [`FuseError`].
pub type Result<T> = std::result::Result<T, FuseError>;
