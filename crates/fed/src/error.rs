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
    /// A method was given the other kind of data: tabular methods (FedNGM) federate tables,
    /// all others labelled samples.
    #[error(
        "`{method}` {}",
        if *tabular {
            "federates tables, not labelled samples; run it on a `[table]`"
        } else {
            "trains classifiers on labelled samples; it cannot run on a `[table]`"
        }
    )]
    WrongData {
        /// The method's name.
        method: &'static str,
        /// Whether the method is the tabular kind.
        tabular: bool,
    },
    /// The callback after a round (a checkpoint) failed; the run stops there.
    #[error("checkpoint after round {round}")]
    Checkpoint {
        /// The round just finished.
        round: usize,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A method's server state cannot go on: a panic poisoned it, or the round loop called
    /// it out of order. Not a setting: report it as a bug.
    #[error("`{method}`'s server state: {reason}")]
    MethodState {
        /// The method's name.
        method: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A method's state could not be written for a checkpoint.
    #[error("cannot save {what}")]
    SaveState {
        /// What was being saved.
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint holds state for a method that cannot resume.
    #[error("`{method}` cannot resume from a checkpoint; run without --resume")]
    CannotResume {
        /// The method's name.
        method: &'static str,
    },
    /// A reply that fails the method's own checks (the round loop adds which client sent
    /// it when it lists the rejection).
    #[error("{method} reply: {reason}")]
    InvalidReply {
        /// The method's name.
        method: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// What a client stored between its rounds
    /// ([`Method::set_client_state`](crate::Method::set_client_state)) does not fit the method
    /// or the model.
    #[error("client {client}'s stored state: {reason}")]
    ClientState {
        /// The client id.
        client: usize,
        /// What does not fit.
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
