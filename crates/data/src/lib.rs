//! fedfuse datasets: loaders (IDX/MNIST, CIFAR-10, CIFAR-100, CSV, the bundled UCI digits),
//! verified downloads with mirrors and resume, and federated partitioners with Flower Datasets
//! semantics (and Reddi et al.'s Pachinko split of CIFAR-100).
//!
//! Everything random takes an explicitly seeded RNG, so a seed pins a whole experiment's data.
//!
//! ```
//! use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
//! use rand::SeedableRng;
//!
//! # fn main() -> fedfuse_data::Result<()> {
//! // The bundled digits dataset needs no download.
//! let data = load_dataset("digits", None)?;
//! assert_eq!(data.train.len() + data.test.len(), 1797);
//!
//! // Label-skewed partition over 10 clients, then local train/test splits.
//! let mut rng = rand::rngs::StdRng::seed_from_u64(42);
//! let spec = PartitionSpec::Dirichlet { alpha: 0.5, min_partition_size: 10, self_balancing: true };
//! let parts = partition(&data.train.y, data.train.num_classes, 10, &spec, &mut rng)?;
//! let clients = client_splits(&data.train, &parts, 0.2, &mut rng)?;
//! assert_eq!(clients.len(), 10);
//! assert_eq!(clients.iter().map(|c| c.train.len() + c.test.len()).sum::<usize>(), data.train.len());
//! # Ok(())
//! # }
//! ```
//!
//! MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 are read from a folder filled by [`download`]
//! (`fedfuse data get NAME`), [`cache_dir`] by default.
#![deny(missing_docs)]

mod cdc;
mod cifar;
mod csv;
mod dataset;
mod download;
mod error;
mod femnist;
mod ggm;
mod idx;
mod partition;
mod registry;
mod tabular;
mod transform;

pub use cdc::{
    CDC_2015_ZIP, CDC_FEATURES, CdcClient, CdcData, CdcExtra, CdcOptions, CdcSplit, CdcSummary,
    load_cdc,
};
pub use cifar::{CIFAR100_COARSE_OF_FINE, Cifar100Label, read_cifar10_batch, read_cifar100};
pub use csv::{ColumnRef, CsvOptions, CsvTable, LabelColumn, read_csv, read_csv_table};
pub use dataset::{ClientData, Dataset, SampleIds, TrainTest};
pub use download::{
    DownloadEvent, DownloadLimits, VerifyStatus, download, download_from, download_with,
    sha256_file, verify, verify_files,
};
pub use error::{DataError, Result};
pub use femnist::leaf::{MAX_LEAF_SHARD_BYTES, read_leaf_femnist};
pub use femnist::parquet::{MAX_FEMNIST_IMAGES, MAX_PARQUET_FILE_BYTES, read_parquet_femnist};
pub use femnist::{
    FEMNIST_CLASSES, FEMNIST_PIXELS, FemnistFiles, ParquetFiles, WRITER_COLUMN, find_femnist,
    find_leaf_dir, find_parquet_files, read_femnist,
};
pub use ggm::{Ggm, GgmConfig, GraphShape, cholesky, conditional_mean, sample_ggm};
pub use idx::{read_idx_images, read_idx_labels, write_idx};
pub use partition::{
    ClassAssignment, GroupMode, PartitionSpec, client_splits, holdout, partition, partition_with,
};
pub use registry::{
    DatasetInfo, FEMNIST_HOW_TO_GET, RemoteFile, cache_dir, dataset_info, default_dataset_dir,
    digits, how_to_get, known_datasets, load_dataset,
};
pub use tabular::{
    BlockKind, Coding, Column, ColumnStats, Encoded, Encoding, FeatureBlock, FeatureCoding, Table,
    TableStats,
};
pub use transform::{map_labels, permute_clients, permute_features, select_classes};
