//! The one error type of `fedfuse-lab`, so code and the Python package can match on what went
//! wrong instead of parsing a message.

use std::fmt;

/// Errors of `fedfuse-lab`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A setting of a config or experiment file is invalid; the message names the key and what
    /// would be valid.
    #[error("{0}")]
    Invalid(String),
    /// A setting of a config or experiment file is invalid: `key` is its dotted path
    /// (`train.epochs`, `method.name`, `partition.alpha`), `reason` the message, which names
    /// the key and what would be valid.
    #[error("{reason}")]
    Setting {
        /// The setting's dotted path in the file.
        key: String,
        /// What is wrong and what would be valid.
        reason: String,
    },
    /// A file could not be read or written (wrapped in a [`LabError::Context`] naming it).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// An error inside a named part of an experiment (a file, a seed, an arm, a table). Its
    /// message carries the whole chain, so printing it alone loses nothing.
    #[error("{context}: {}", Chain(cause.as_ref()))]
    Context {
        /// Where: `config examples/a.toml`, `seed 3`, `arm "pfnm"`.
        context: String,
        /// What went wrong there (not a `source`: the message already holds the chain).
        cause: Box<LabError>,
    },
    /// A config file is not valid TOML or does not match the schema.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// Settings could not be written back as TOML.
    #[error(transparent)]
    TomlOut(#[from] toml::ser::Error),
    /// Results could not be serialised.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A plot could not be drawn.
    #[error("plot `{title}`: {reason}")]
    Plot {
        /// The plot's title.
        title: String,
        /// What the drawing backend said.
        reason: String,
    },
    /// Federation or a method failed.
    #[error(transparent)]
    Fed(#[from] fedfuse_fed::FedError),
    /// Data could not be loaded or split.
    #[error(transparent)]
    Data(#[from] fedfuse_data::DataError),
    /// Training failed.
    #[error(transparent)]
    Train(#[from] fedfuse_train::TrainError),
    /// Fusion failed.
    #[error(transparent)]
    Fuse(#[from] fedfuse_fuse::FuseError),
    /// A record or parameter set was malformed.
    #[error(transparent)]
    Core(#[from] fedfuse_core::CoreError),
}

/// `Result` with [`LabError`].
pub type Result<T, E = LabError> = std::result::Result<T, E>;

/// An error's message followed by those of its sources, `: `-separated.
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        // `Context` already prints its own chain; walking it again would repeat it.
        if matches!(
            self.0.downcast_ref::<LabError>(),
            Some(LabError::Context { .. })
        ) {
            return Ok(());
        }
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

/// Names where an error happened, like `anyhow::Context` but into [`LabError::Context`].
pub trait Context<T> {
    /// Wraps the error with `context`.
    fn context(self, context: impl Into<String>) -> Result<T>;
    /// Wraps the error with a context computed only on failure.
    fn with_context<S: Into<String>>(self, context: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<LabError>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|e| LabError::Context {
            context: context.into(),
            cause: Box::new(e.into()),
        })
    }

    fn with_context<S: Into<String>>(self, context: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| LabError::Context {
            context: context().into(),
            cause: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| LabError::Invalid(context.into()))
    }

    fn with_context<S: Into<String>>(self, context: impl FnOnce() -> S) -> Result<T> {
        self.ok_or_else(|| LabError::Invalid(context().into()))
    }
}

/// Returns early with [`LabError::Invalid`] and a formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::LabError::Invalid(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// Returns [`LabError::Setting`] for the setting `key`, the reason formatted as by `format!`.
macro_rules! bail_setting {
    ($key:expr, $($arg:tt)*) => {
        return Err($crate::error::LabError::Setting {
            key: ($key).into(),
            reason: format!($($arg)*),
        })
    };
}
pub(crate) use bail_setting;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_prints_the_whole_chain_once() {
        let inner: Result<()> = Err(LabError::Invalid("`rounds` must be at least 1".into()));
        let e = inner
            .context("config a.toml")
            .context("arm `x`")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "arm `x`: config a.toml: `rounds` must be at least 1"
        );
        assert_eq!(format!("{e:#}"), e.to_string());
        let e = std::fs::read("/nonexistent/fedfuse").context("cannot read /nonexistent/fedfuse");
        let e = e.context("seed 1").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("seed 1: cannot read /nonexistent/fedfuse: "),
            "{e}"
        );
        assert_eq!(e.to_string().matches("No such file").count(), 1, "{e}");
    }
}
