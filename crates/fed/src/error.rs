/// Errors of `fedfuse-fed`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FedError {
    /// Training failed.
    #[error(transparent)]
    Train(#[from] fedfuse_train::TrainError),
    /// Aggregation failed.
    #[error(transparent)]
    Fuse(#[from] fedfuse_fuse::FuseError),
    /// Data could not be encoded or read.
    #[error(transparent)]
    Data(#[from] fedfuse_data::DataError),
    /// A protocol message could not be read, or a named party sent one that cannot be used
    /// (e.g. a FedNGM client read a malformed instruction from the server).
    #[error("message from {from}: {reason}")]
    BadMessage {
        /// The sender: a client's name or `server`.
        from: String,
        /// What was wrong.
        reason: String,
    },
    /// A record or parameter set was malformed.
    #[error(transparent)]
    Core(#[from] fedfuse_core::CoreError),
    /// A setting is invalid.
    #[error("invalid setting `{field}`: {reason}")]
    InvalidSetting {
        /// The config key.
        field: &'static str,
        /// Why, and what would be valid.
        reason: String,
    },
    /// A setting of the `[method]` table is invalid. Lower crates name a setting by its own
    /// key; this crate, which knows the config file, places it in its table.
    #[error("invalid setting `method.{field}`: {reason}")]
    MethodSetting {
        /// The key in the `[method]` table.
        field: &'static str,
        /// Why, and what would be valid.
        reason: String,
    },
    /// A checkpoint could not be written after a round.
    #[error("checkpoint: {reason}")]
    Checkpoint {
        /// What failed.
        reason: String,
    },
    /// A client's reply cannot be used.
    #[error("client {client}: {reason}")]
    BadReply {
        /// The client id.
        client: usize,
        /// What was wrong.
        reason: String,
    },
}

/// Result with [`FedError`].
pub type Result<T> = std::result::Result<T, FedError>;
