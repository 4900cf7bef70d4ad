//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while reading, downloading or partitioning data.
///
/// Every message names the file, field, client or dataset involved and, where there is one,
/// what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file or directory could not be read, written or renamed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("could not read", "could not create", ...).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file was read but its contents are not in the expected format.
    #[error("{path}: {msg}")]
    Format {
        /// The offending file.
        path: PathBuf,
        /// What is wrong and, where possible, what to do.
        msg: String,
    },

    /// A CSV cell could not be used.
    #[error("{path}, line {line}, column {column}: {msg}")]
    Csv {
        /// The CSV file.
        path: PathBuf,
        /// 1-based line number in the file.
        line: usize,
        /// 1-based column number, with the header name when there is one.
        column: String,
        /// What is wrong with the cell.
        msg: String,
    },

    /// The arrays handed to [`crate::Dataset::new`] (or derived from a file) are inconsistent.
    #[error("invalid dataset: {0}")]
    InvalidDataset(String),

    /// A dataset name that [`crate::dataset_info`] does not know.
    #[error("unknown dataset {name:?}; known datasets: {known}")]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// The names that are known, comma separated.
        known: String,
    },

    /// The files of a downloadable dataset are not on disk.
    #[error("dataset {name:?}: {missing} not found in {dir}; {next}")]
    MissingFiles {
        /// Dataset name.
        name: String,
        /// The directory that was searched.
        dir: PathBuf,
        /// The missing files, comma separated.
        missing: String,
        /// What to do next: download it, or the `--data-dir` that would hold it.
        next: String,
    },

    /// A file could not be downloaded with the right checksum from any mirror.
    #[error(
        "could not download {file} into {dest}: expected sha256 {expected}, {actual}; \
         attempts: {attempts}"
    )]
    Download {
        /// File name.
        file: String,
        /// Destination directory.
        dest: PathBuf,
        /// The expected sha256 (hex).
        expected: String,
        /// "got sha256 ..." for the last complete download, or "no complete download".
        actual: String,
        /// What each attempt ran into, `; ` separated.
        attempts: String,
    },

    /// A partitioner or client split was asked for something impossible.
    #[error("partitioning: {0}")]
    Partition(String),

    /// An option or argument has an invalid value.
    #[error("invalid {field}: {msg}")]
    InvalidArgument {
        /// The option or argument.
        field: &'static str,
        /// What is wrong and what to use instead.
        msg: String,
    },

    /// A [`crate::Table`] was built from inconsistent columns, or asked for a row or column it
    /// does not have.
    #[error("invalid table: {0}")]
    InvalidTable(String),

    /// A column named by a loader or an [`crate::Encoding`] is absent.
    #[error(
        "{source_name}: no column {column:?} ({what}); check the file or table against the \
         documented feature set"
    )]
    MissingColumn {
        /// The file (or "table") that lacks the column.
        source_name: String,
        /// The column that was looked for.
        column: String,
        /// What the column was needed for.
        what: String,
    },

    /// A categorical value is not in the shared vocabulary of an [`crate::Encoding`].
    #[error(
        "column {column:?}: level {level:?} is not in the shared vocabulary [{known}]; rebuild \
         the Encoding from statistics that include every client's levels"
    )]
    UnknownLevel {
        /// The categorical column.
        column: String,
        /// The level that is not in the vocabulary.
        level: String,
        /// The vocabulary, comma separated.
        known: String,
    },

    /// Client statistics or encoded values that cannot make or use an [`crate::Encoding`].
    #[error("encoding: {0}")]
    Encoding(String),
}

/// `Result` with [`DataError`].
pub type Result<T> = std::result::Result<T, DataError>;

impl DataError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        DataError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        DataError::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }
}
