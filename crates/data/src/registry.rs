//! Named datasets: where they come from, where they are cached, how they are loaded.

use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::cifar::{Cifar100Label, extract_tar, read_cifar10_batch, read_cifar100};
use crate::csv::{CsvOptions, LabelColumn, parse_csv};
use crate::dataset::{Dataset, TrainTest};
use crate::error::{DataError, Result};
use crate::idx::{read_idx_images, read_idx_labels};

/// One file of a downloadable dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// File name, both on the mirrors and on disk.
    pub name: &'static str,
    /// Expected sha256 of the file, lower-case hex.
    pub sha256: &'static str,
    /// A bound above the file's real size: a mirror announcing or sending more is cut off
    /// before the disk fills (the sha256 check comes only at the end).
    pub max_bytes: u64,
}

/// A named dataset that [`load_dataset`] knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatasetInfo {
    /// Name used by [`load_dataset`], [`crate::download`] and `fedfuse data get NAME`.
    pub name: &'static str,
    /// Files to download (empty for bundled datasets).
    pub files: &'static [RemoteFile],
    /// Base URLs, tried in order; a file's URL is the mirror followed by its name.
    pub mirrors: &'static [&'static str],
    /// One-line description.
    pub description: &'static str,
    /// Who to cite, and the licence.
    pub citation: &'static str,
}

const MNIST_FILES: &[RemoteFile] = &[
    RemoteFile {
        name: "train-images-idx3-ubyte.gz",
        sha256: "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
        max_bytes: 10_000_000,
    },
    RemoteFile {
        name: "train-labels-idx1-ubyte.gz",
        sha256: "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
        max_bytes: 64 << 10,
    },
    RemoteFile {
        name: "t10k-images-idx3-ubyte.gz",
        sha256: "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        max_bytes: 2_000_000,
    },
    RemoteFile {
        name: "t10k-labels-idx1-ubyte.gz",
        sha256: "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        max_bytes: 64 << 10,
    },
];

const FASHION_FILES: &[RemoteFile] = &[
    RemoteFile {
        name: "train-images-idx3-ubyte.gz",
        sha256: "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        max_bytes: 32 << 20,
    },
    RemoteFile {
        name: "train-labels-idx1-ubyte.gz",
        sha256: "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        max_bytes: 64 << 10,
    },
    RemoteFile {
        name: "t10k-images-idx3-ubyte.gz",
        sha256: "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        max_bytes: 8 << 20,
    },
    RemoteFile {
        name: "t10k-labels-idx1-ubyte.gz",
        sha256: "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        max_bytes: 64 << 10,
    },
];

const CIFAR10_ARCHIVE: &str = "cifar-10-binary.tar.gz";
const CIFAR10_FILES: &[RemoteFile] = &[RemoteFile {
    name: CIFAR10_ARCHIVE,
    sha256: "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
    // About 162 MiB.
    max_bytes: 200 << 20,
}];
const CIFAR10_BATCHES: &[&str] = &[
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
    "test_batch.bin",
];

const CIFAR100_ARCHIVE: &str = "cifar-100-binary.tar.gz";
const CIFAR100_FILES: &[RemoteFile] = &[RemoteFile {
    name: CIFAR100_ARCHIVE,
    // The sha256 that TensorFlow Datasets records for this file
    // (`tensorflow_datasets/url_checksums/cifar100.txt`: 168,513,733 bytes; its entry for
    // cifar-10-binary.tar.gz is the sha256 above), and other public loaders that verify this
    // file (Julia, Go) record the same; the CIFAR page itself publishes only the MD5,
    // 03b5dce01913d631647c71ecec9e9cb8.
    sha256: "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec",
    // About 161 MiB.
    max_bytes: 200 << 20,
}];
const CIFAR100_PARTS: &[&str] = &["train.bin", "test.bin"];

const CIFAR_MIRRORS: &[&str] = &["https://www.cs.toronto.edu/~kriz/"];
const CIFAR_CITATION: &str = "A. Krizhevsky, Learning Multiple Layers of Features from Tiny \
                              Images, technical report, University of Toronto, 2009";

static DATASETS: &[DatasetInfo] = &[
    DatasetInfo {
        name: "digits",
        files: &[],
        mirrors: &[],
        description: "UCI optical recognition of handwritten digits: 1,797 8x8 images, 10 classes \
                      (bundled, works offline)",
        citation: "E. Alpaydin and C. Kaynak, Optical Recognition of Handwritten Digits, UCI \
                   Machine Learning Repository, 1998, doi:10.24432/C50P49. CC BY 4.0",
    },
    DatasetInfo {
        name: "mnist",
        files: MNIST_FILES,
        mirrors: &[
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ],
        description: "MNIST handwritten digits: 60,000 + 10,000 28x28 grey images, 10 classes",
        citation: "Y. LeCun, C. Cortes and C. J. C. Burges, The MNIST database of handwritten \
                   digits. CC BY-SA 3.0",
    },
    DatasetInfo {
        name: "fashion-mnist",
        files: FASHION_FILES,
        mirrors: &["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
        description: "Fashion-MNIST Zalando article images: 60,000 + 10,000 28x28 grey images, \
                      10 classes",
        citation: "H. Xiao, K. Rasul and R. Vollgraf, Fashion-MNIST: a Novel Image Dataset for \
                   Benchmarking Machine Learning Algorithms, arXiv:1708.07747, 2017. MIT licence",
    },
    DatasetInfo {
        name: "cifar10",
        files: CIFAR10_FILES,
        mirrors: CIFAR_MIRRORS,
        description: "CIFAR-10: 50,000 + 10,000 32x32 colour images, 10 classes (binary version)",
        citation: CIFAR_CITATION,
    },
    DatasetInfo {
        name: "cifar100",
        files: CIFAR100_FILES,
        mirrors: CIFAR_MIRRORS,
        description: "CIFAR-100: 50,000 + 10,000 32x32 colour images, 100 fine classes in 20 \
                      superclasses (binary version); the one dataset `partition.kind = \
                      \"pachinko\"` splits",
        citation: CIFAR_CITATION,
    },
    DatasetInfo {
        name: "femnist",
        files: &[],
        mirrors: &[],
        description: "FEMNIST (LEAF): 28x28 grey images of digits and letters by writer, 62 \
                      classes, as Flower Datasets' Parquet files (flwrlabs/femnist: 814,277 \
                      images, 3,597 writers) or LEAF's JSON shards (train/ and test/); not \
                      downloaded by fedfuse (`fedfuse data info femnist` says where to get \
                      them)",
        citation: "S. Caldas et al., LEAF: A Benchmark for Federated Settings, arXiv:1812.01097, \
                   2018; from NIST Special Database 19 (P. Grother and K. Hanaoka, 2016)",
    },
    DatasetInfo {
        name: "cifar100-coarse",
        files: CIFAR100_FILES,
        mirrors: CIFAR_MIRRORS,
        description: "CIFAR-100 labelled by its 20 superclasses (the same archive as cifar100, \
                      also found in cifar100's folder)",
        citation: CIFAR_CITATION,
    },
];

/// How to obtain FEMNIST, which no stable public location publishes in a form fedfuse reads
/// with checksums.
pub const FEMNIST_HOW_TO_GET: &str = "FEMNIST comes in two forms fedfuse reads. (1) Flower \
    Datasets' flwrlabs/femnist, a dataset repository on the Hugging Face Hub: its Parquet files \
    data/train-*.parquet (814,277 images of 3,597 writers, about 200 MB; the Hub lists each \
    file's size and SHA-256), e.g. `huggingface-cli download flwrlabs/femnist --repo-type \
    dataset --local-dir DIR`, then --data-dir DIR. Published as one train split: each \
    writer's every tenth image is held out as its test samples (files named test-*.parquet \
    beside them are read as the test split instead). (2) LEAF's JSON shards: clone LEAF (its \
    repository is TalwalkarLab/leaf on GitHub), run `./preprocess.sh -s niid --sf 1.0 -k 0 -t \
    sample` in data/femnist (it downloads NIST SD 19, about 1.5 GB, and writes shards into \
    data/train/ and data/test/), then pass --data-dir LEAF/data/femnist/data. Either can also \
    be copied into the cache folder femnist/. fedfuse downloads neither: it downloads only files \
    whose SHA-256 it carries, and has none recorded for the Hub's files; LEAF's output depends \
    on its sampling settings and has no published checksums. Every file is checked as it is \
    read instead.";

/// How to obtain the dataset `name` where fedfuse downloads nothing, if it is one of those.
pub fn how_to_get(name: &str) -> Option<&'static str> {
    (name == "femnist").then_some(FEMNIST_HOW_TO_GET)
}

/// Every dataset [`load_dataset`] knows, bundled ones included.
pub fn known_datasets() -> &'static [DatasetInfo] {
    DATASETS
}

/// Looks a dataset up by name (`"digits"`, `"mnist"`, `"fashion-mnist"`, `"cifar10"`,
/// `"cifar100"`, `"cifar100-coarse"`).
pub fn dataset_info(name: &str) -> Result<&'static DatasetInfo> {
    DATASETS
        .iter()
        .find(|d| d.name == name)
        .ok_or_else(|| DataError::UnknownDataset {
            name: name.to_string(),
            known: DATASETS
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Where downloaded datasets live: `$FEDFUSE_DATA` if set, else `$XDG_CACHE_HOME/fedfuse`, else
/// `$HOME/.cache/fedfuse`, else `.fedfuse-cache` in the current directory.
pub fn cache_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = var("FEDFUSE_DATA") {
        p
    } else if let Some(p) = var("XDG_CACHE_HOME") {
        p.join("fedfuse")
    } else if let Some(p) = var("HOME") {
        p.join(".cache").join("fedfuse")
    } else {
        PathBuf::from(".fedfuse-cache")
    }
}

/// The folder `fedfuse data get NAME` downloads into: `cache_dir()/NAME`.
pub fn default_dataset_dir(name: &str) -> PathBuf {
    cache_dir().join(name)
}

/// Loads a named dataset's train and test splits.
///
/// * `"digits"` is bundled: 1,797 samples of 64 features scaled to `[0, 1]`
///   (`sample_shape [64]`), 10 classes, split by a fixed shuffle (seed 0) with the last 20 %
///   as the test set. `data_dir` is ignored.
/// * `"mnist"` and `"fashion-mnist"` read the four IDX files (`.gz` or uncompressed) from
///   `data_dir`, or from `data_dir/NAME`, or from [`default_dataset_dir`] when `data_dir` is
///   `None`. Pixels are scaled to `[0, 1]`; `sample_shape` is `[1, 28, 28]`.
/// * `"cifar10"` reads `data_batch_1..5.bin` and `test_batch.bin` from the same places (or their
///   `cifar-10-batches-bin/` subfolder), unpacking `cifar-10-binary.tar.gz` first if only the
///   archive is there. `sample_shape` is `[3, 32, 32]`.
/// * `"cifar100"` (the 100 fine labels) and `"cifar100-coarse"` (the 20 superclasses) read
///   `train.bin` and `test.bin` the same way, from the folder or its `cifar-100-binary/`
///   subfolder, unpacking `cifar-100-binary.tar.gz` if only the archive is there;
///   `cifar100-coarse` also looks in `cifar100`'s folder (`data_dir/cifar100`, or its cache
///   folder), so one download serves both. See [`crate::read_cifar100`].
///
/// Missing files give [`DataError::MissingFiles`], whose message names the folder and the
/// `fedfuse data get NAME` command.
pub fn load_dataset(name: &str, data_dir: Option<&Path>) -> Result<TrainTest> {
    let info = dataset_info(name)?;
    match info.name {
        "digits" => load_digits(),
        "mnist" | "fashion-mnist" => {
            let dir = find_dir(info, data_dir, &[info.files[0].name])?;
            let file = |i: usize| locate(&dir, info.files[i].name);
            Ok(TrainTest {
                train: idx_dataset(&file(0), &file(1))?,
                test: idx_dataset(&file(2), &file(3))?,
            })
        }
        "cifar10" => load_cifar10(info, data_dir),
        "cifar100" => load_cifar100(info, data_dir, Cifar100Label::Fine),
        "cifar100-coarse" => load_cifar100(info, data_dir, Cifar100Label::Coarse),
        "femnist" => {
            let base = data_dir.map_or_else(|| default_dataset_dir(info.name), Path::to_path_buf);
            match crate::femnist::find_femnist(&base) {
                Some(files) => crate::femnist::read_femnist(&files),
                None => Err(DataError::MissingFiles {
                    name: info.name.into(),
                    dir: base,
                    missing: "LEAF's train/*.json and test/*.json, or Flower Datasets' \
                              train-*.parquet"
                        .into(),
                    next: FEMNIST_HOW_TO_GET.into(),
                }),
            }
        }
        _ => Err(DataError::UnknownDataset {
            name: name.to_string(),
            known: DATASETS
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// A file, or its uncompressed twin if only that exists.
fn locate(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    match name.strip_suffix(".gz") {
        Some(raw) if !p.exists() && dir.join(raw).exists() => dir.join(raw),
        _ => p,
    }
}

/// Picks the directory holding a dataset: `data_dir`, `data_dir/NAME` or the cache; errors
/// naming the directory and the fetch command when none has all the `probe` files.
fn find_dir(info: &DatasetInfo, data_dir: Option<&Path>, probe: &[&str]) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = match data_dir {
        Some(d) => vec![d.to_path_buf(), d.join(info.name)],
        None => vec![default_dataset_dir(info.name)],
    };
    let has_all = |d: &Path| probe.iter().all(|f| locate(d, f).is_file());
    if let Some(d) = candidates
        .iter()
        .find(|d| has_all(d) && info.files.iter().all(|f| locate(d, f.name).is_file()))
    {
        return Ok(d.clone());
    }
    if let Some(d) = candidates.iter().find(|d| has_all(d)) {
        return Ok(d.clone());
    }
    let dir = candidates[0].clone();
    let missing: Vec<&str> = info
        .files
        .iter()
        .map(|f| f.name)
        .filter(|f| !locate(&dir, f).is_file())
        .collect();
    Err(DataError::MissingFiles {
        name: info.name.to_string(),
        dir,
        missing: if missing.is_empty() {
            probe.join(", ")
        } else {
            missing.join(", ")
        },
        next: next_step(info, data_dir, probe),
    })
}

/// What a newcomer whose dataset was not found should do next: download it when no folder
/// was given; otherwise name the folder below the given one that holds the files, or the
/// dataset the given folder holds instead.
fn next_step(info: &DatasetInfo, data_dir: Option<&Path>, probe: &[&str]) -> String {
    let get = format!("`fedfuse data get {}`", info.name);
    let Some(given) = data_dir else {
        return format!(
            "it is not downloaded yet: run {get} (into {}), or pass --data-dir with a folder \
             that holds the files",
            default_dataset_dir(info.name).display()
        );
    };
    if !given.is_dir() {
        return format!(
            "the --data-dir folder {} does not exist: give the folder that holds the files, or \
             run {get} and leave --data-dir out",
            given.display()
        );
    }
    let holds = |d: &Path, files: &[&str]| files.iter().all(|f| locate(d, f).is_file());
    // Two levels down covers `--data-dir ..` for `../data/mnist`.
    let below = std::fs::read_dir(given)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .flat_map(|p| {
            let inner: Vec<PathBuf> = std::fs::read_dir(&p)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .filter(|q| q.is_dir())
                .collect();
            std::iter::once(p).chain(inner)
        })
        .filter(|d| holds(d, probe))
        .min();
    if let Some(d) = below {
        return format!(
            "{} holds them: pass --data-dir {}",
            d.display(),
            d.display()
        );
    }
    let other = DATASETS.iter().find(|o| {
        o.name != info.name
            && o.files.first().is_some_and(|f| f.name != probe[0])
            && [given.to_path_buf(), given.join(o.name)]
                .iter()
                .any(|d| o.files.iter().all(|f| locate(d, f.name).is_file()))
    });
    match other {
        Some(o) => format!(
            "{} holds the {} dataset, not {}: check `dataset.name` in the config and the \
             --data-dir folder",
            given.display(),
            o.name,
            info.name
        ),
        None => format!(
            "give --data-dir the folder that holds the files, or run {get} and leave \
             --data-dir out"
        ),
    }
}

/// Reads an IDX image file and its label file into a dataset with pixels in `[0, 1]`.
fn idx_dataset(images: &Path, labels: &Path) -> Result<Dataset> {
    let (n, rows, cols, px) = read_idx_images(images)?;
    let y = read_idx_labels(labels)?;
    if y.len() != n {
        return Err(DataError::format(
            labels,
            format!(
                "{} labels but {} has {n} images; the files do not belong together",
                y.len(),
                images.display()
            ),
        ));
    }
    if let Some(bad) = y.iter().find(|&&l| l > 9) {
        return Err(DataError::format(
            labels,
            format!("label {bad} is outside 0..=9"),
        ));
    }
    let x = px.iter().map(|&p| f32::from(p) / 255.0).collect();
    Dataset::new(
        x,
        y.into_iter().map(u32::from).collect(),
        vec![1, rows, cols],
        10,
    )
}

/// Where a CIFAR archive unpacks, and the files `load_dataset` reads from it.
struct CifarLayout {
    archive: &'static str,
    /// The archive's folder, which holds the files.
    sub: &'static str,
    files: &'static [&'static str],
}

const CIFAR10_LAYOUT: CifarLayout = CifarLayout {
    archive: CIFAR10_ARCHIVE,
    sub: "cifar-10-batches-bin",
    files: CIFAR10_BATCHES,
};

const CIFAR100_LAYOUT: CifarLayout = CifarLayout {
    archive: CIFAR100_ARCHIVE,
    sub: "cifar-100-binary",
    files: CIFAR100_PARTS,
};

/// The folder holding a CIFAR dataset's unpacked files: `roots` or their `sub` folder,
/// unpacking the archive found in a root first when no folder has them all.
fn cifar_dir(
    info: &DatasetInfo,
    data_dir: Option<&Path>,
    roots: &[PathBuf],
    layout: &CifarLayout,
) -> Result<PathBuf> {
    let complete = |d: &Path| layout.files.iter().all(|f| d.join(f).is_file());
    let mut found = roots
        .iter()
        .flat_map(|r| [r.clone(), r.join(layout.sub)])
        .find(|d| complete(d));
    if found.is_none()
        && let Some(root) = roots.iter().find(|r| r.join(layout.archive).is_file())
    {
        let dest = root.join(layout.sub);
        std::fs::create_dir_all(&dest).map_err(|e| DataError::io("could not create", &dest, e))?;
        extract_tar(&root.join(layout.archive), &dest, layout.files)?;
        found = Some(dest).filter(|d| complete(d));
    }
    found.ok_or_else(|| DataError::MissingFiles {
        name: info.name.to_string(),
        dir: roots[0].clone(),
        missing: format!(
            "{} (or {}/{})",
            layout.archive,
            layout.sub,
            layout.files.join(", ")
        ),
        next: next_step(info, data_dir, &[layout.archive]),
    })
}

/// The folders a dataset may be in: `data_dir` and `data_dir/NAME`, or its cache folder.
fn roots(name: &str, data_dir: Option<&Path>) -> Vec<PathBuf> {
    match data_dir {
        Some(d) => vec![d.to_path_buf(), d.join(name)],
        None => vec![default_dataset_dir(name)],
    }
}

fn load_cifar10(info: &DatasetInfo, data_dir: Option<&Path>) -> Result<TrainTest> {
    let dir = cifar_dir(info, data_dir, &roots(info.name, data_dir), &CIFAR10_LAYOUT)?;
    let mut train = read_cifar10_batch(&dir.join(CIFAR10_BATCHES[0]))?;
    for f in &CIFAR10_BATCHES[1..5] {
        train.extend(&read_cifar10_batch(&dir.join(f))?)?;
    }
    let test = read_cifar10_batch(&dir.join(CIFAR10_BATCHES[5]))?;
    Ok(TrainTest { train, test })
}

fn load_cifar100(
    info: &DatasetInfo,
    data_dir: Option<&Path>,
    label: Cifar100Label,
) -> Result<TrainTest> {
    let mut candidates = roots(info.name, data_dir);
    if info.name != "cifar100" {
        // One archive, two datasets: `cifar100-coarse` reads a download of `cifar100` too.
        candidates
            .push(data_dir.map_or_else(|| default_dataset_dir("cifar100"), |d| d.join("cifar100")));
    }
    let dir = cifar_dir(info, data_dir, &candidates, &CIFAR100_LAYOUT)?;
    Ok(TrainTest {
        train: read_cifar100(&dir.join(CIFAR100_PARTS[0]), label)?,
        test: read_cifar100(&dir.join(CIFAR100_PARTS[1]), label)?,
    })
}

/// The bundled UCI digits file (1,797 rows: 64 features in 0..=16, then the label).
static DIGITS_CSV_GZ: &[u8] = include_bytes!("../assets/digits.csv.gz");

/// The bundled digits dataset, all 1,797 samples, features scaled to `[0, 1]`.
pub fn digits() -> Result<Dataset> {
    let opts = CsvOptions {
        has_header: false,
        label_column: LabelColumn::Last,
        ..CsvOptions::default()
    };
    let mut ds = parse_csv(DIGITS_CSV_GZ, Path::new("<bundled digits.csv.gz>"), &opts)?.dataset;
    if ds.dim() != 64 || ds.num_classes != 10 {
        return Err(DataError::InvalidDataset(format!(
            "bundled digits file has {} features and {} classes, expected 64 and 10",
            ds.dim(),
            ds.num_classes
        )));
    }
    ds.x.iter_mut().for_each(|v| *v /= 16.0);
    Ok(ds)
}

fn load_digits() -> Result<TrainTest> {
    let ds = digits()?;
    let mut perm: Vec<usize> = (0..ds.len()).collect();
    perm.shuffle(&mut StdRng::seed_from_u64(0));
    let n_test = ds.len() / 5;
    let (train_idx, test_idx) = perm.split_at(ds.len() - n_test);
    Ok(TrainTest {
        train: ds.subset(train_idx),
        test: ds.subset(test_idx),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry() {
        assert_eq!(dataset_info("mnist").unwrap().files.len(), 4);
        let e = dataset_info("imagenet").unwrap_err().to_string();
        assert!(e.contains("fashion-mnist"), "{e}");
        for d in known_datasets() {
            for f in d.files {
                assert_eq!(f.sha256.len(), 64);
                assert!(
                    f.sha256
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
                );
            }
            assert!(d.mirrors.iter().all(|m| m.ends_with('/')));
        }
    }

    #[test]
    fn missing_files_message() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_dataset("fashion-mnist", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&dir.path().display().to_string()), "{e}");
        assert!(e.contains("fedfuse data get fashion-mnist"), "{e}");
        let e = load_dataset("cifar10", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("fedfuse data get cifar10"), "{e}");
    }
}
