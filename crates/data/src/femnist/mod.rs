//! FEMNIST (Caldas et al. 2018, LEAF): handwritten digits and letters by writer, 28x28
//! grayscale, 62 classes (`0`-`9`, then `A`-`Z`, then `a`-`z`), in the two forms users have:
//! LEAF's JSON shards ([`leaf`]) and Flower Datasets' `flwrlabs/femnist` Parquet files
//! ([`parquet`]). Both give pixels as `value / 255` (LEAF's scaling: the background is 1) and
//! each sample's writer as its natural id (`writer_id`), for a `natural_id` partition: one
//! client per writer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dataset::{Dataset, SampleIds, TrainTest};
use crate::error::Result;

pub(crate) mod leaf;
pub(crate) mod parquet;

/// Pixels per image (28 x 28).
pub const FEMNIST_PIXELS: usize = 784;
/// Classes: 10 digits, 26 upper-case and 26 lower-case letters.
pub const FEMNIST_CLASSES: usize = 62;
/// The column FEMNIST's writers go by (Flower Datasets' name).
pub const WRITER_COLUMN: &str = "writer_id";

/// One split's samples before the writers are numbered.
#[derive(Default)]
pub(crate) struct Samples {
    pub(crate) x: Vec<f32>,
    pub(crate) y: Vec<u32>,
    pub(crate) writers: Vec<String>,
}

/// FEMNIST as found under a folder: which reader applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FemnistFiles {
    /// LEAF's output: the folder holding `train/` and `test/` (see [`find_leaf_dir`]).
    Leaf(PathBuf),
    /// Flower Datasets' Parquet files (see [`find_parquet_files`]).
    Parquet(ParquetFiles),
}

/// Flower Datasets' Parquet files of one download, by split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParquetFiles {
    /// `train-*.parquet`, in name order.
    pub train: Vec<PathBuf>,
    /// `test-*.parquet`, in name order; empty for `flwrlabs/femnist` as published (one
    /// `train` split), in which case every writer's every tenth image is held out.
    pub test: Vec<PathBuf>,
}

/// The FEMNIST files under `dir`: LEAF's shards (see [`find_leaf_dir`]) if there are any, else
/// Flower Datasets' Parquet files (see [`find_parquet_files`]).
pub fn find_femnist(dir: &Path) -> Option<FemnistFiles> {
    find_leaf_dir(dir)
        .map(FemnistFiles::Leaf)
        .or_else(|| find_parquet_files(dir).map(FemnistFiles::Parquet))
}

/// Reads FEMNIST from the files [`find_femnist`] found.
pub fn read_femnist(files: &FemnistFiles) -> Result<TrainTest> {
    match files {
        FemnistFiles::Leaf(dir) => leaf::read_leaf_femnist(dir),
        FemnistFiles::Parquet(files) => parquet::read_parquet_femnist(files),
    }
}

/// The folder of LEAF's output that holds `train/` and `test/`: `dir` itself, `dir/femnist`,
/// `dir/femnist/data` or `dir/data` (LEAF's own `data/femnist/data`).
pub fn find_leaf_dir(dir: &Path) -> Option<PathBuf> {
    candidates(dir).find(|d| d.join("train").is_dir() && d.join("test").is_dir())
}

/// Flower Datasets' Parquet files in the first of `dir`, `dir/femnist`, `dir/femnist/data`
/// and `dir/data` (the dataset repository's own folder) that holds a `train-*.parquet`.
pub fn find_parquet_files(dir: &Path) -> Option<ParquetFiles> {
    candidates(dir).find_map(|d| {
        let mut train = Vec::new();
        let mut test = Vec::new();
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !name.ends_with(".parquet") {
                continue;
            }
            if name.starts_with("train-") {
                train.push(path);
            } else if name.starts_with("test-") {
                test.push(path);
            }
        }
        train.sort();
        test.sort();
        (!train.is_empty()).then_some(ParquetFiles { train, test })
    })
}

fn candidates(dir: &Path) -> impl Iterator<Item = PathBuf> {
    [
        dir.to_path_buf(),
        dir.join("femnist"),
        dir.join("femnist").join("data"),
        dir.join("data"),
    ]
    .into_iter()
}

/// Both splits as datasets of `[1, 28, 28]` images, labels `0..62`, each sample carrying its
/// writer as `writer_id` (the writers of both splits share one sorted list of names).
pub(crate) fn assemble(train: Samples, test: Samples) -> Result<TrainTest> {
    let mut names: Vec<String> = train.writers.iter().chain(&test.writers).cloned().collect();
    names.sort_unstable();
    names.dedup();
    let names: Arc<[String]> = names.into();
    let dataset = |s: Samples| -> Result<Dataset> {
        let of = s
            .writers
            .iter()
            .map(|w| names.binary_search(w).unwrap_or_default() as u32)
            .collect();
        Dataset::new(s.x, s.y, vec![1, 28, 28], FEMNIST_CLASSES)?.with_ids(SampleIds {
            column: WRITER_COLUMN.into(),
            names: Arc::clone(&names),
            of,
        })
    };
    Ok(TrainTest {
        train: dataset(train)?,
        test: dataset(test)?,
    })
}
