//! Every experiment and example file in the repository loads with the command its name belongs
//! to, so a renamed key or a tightened check cannot leave a shipped file broken until someone
//! runs it for an hour.

use std::path::{Path, PathBuf};

use fedfuse_lab::Config;
use fedfuse_lab::compare::CompareConfig;
use fedfuse_lab::gems_experiment::GemsExperiment;
use fedfuse_lab::ngm_experiment::NgmExperiment;
use fedfuse_lab::sweep::SweepConfig;

fn repo(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(dir)
}

fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn subfolders(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_experiment_file_loads_with_its_command() {
    let files = tomls(&repo("experiments"));
    assert!(files.len() >= 15, "{files:?}");
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The command each file's header names: fedsparse-* `compare`, gems-* `gems`, ngm-*
        // `ngm`, the rest (pfnm-*, digits-smoke) `sweep`.
        let loaded = if name.starts_with("fedsparse-") {
            CompareConfig::load(&path).map(drop)
        } else if name.starts_with("gems-") {
            GemsExperiment::load(&path).map(drop)
        } else if name.starts_with("ngm-") {
            NgmExperiment::load(&path).map(drop)
        } else {
            SweepConfig::load(&path).map(drop)
        };
        if let Err(e) = loaded {
            panic!("{name}: {e:#}");
        }
    }
}

#[test]
fn every_example_loads_as_a_run_config() {
    let files = tomls(&repo("examples"));
    assert!(files.len() >= 5, "{files:?}");
    for path in files {
        if let Err(e) = Config::load(&path, &[]) {
            panic!("{}: {e:#}", path.display());
        }
    }
}

/// A study's files sit in a folder of their own (experiments/fedmix, experiments/matching),
/// where names are free: a file with `[[arms]]` tables is a `fedfuse compare` file, any other a
/// `fedfuse run` config.
#[test]
fn every_experiment_in_a_subfolder_loads_by_its_content() {
    let dirs = subfolders(&repo("experiments"));
    assert!(!dirs.is_empty());
    for dir in dirs {
        let files = tomls(&dir);
        assert!(!files.is_empty(), "{} holds no .toml", dir.display());
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let table: toml::Table = text
                .parse()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let loaded = if table.contains_key("arms") {
                CompareConfig::load(&path).map(drop)
            } else {
                Config::load(&path, &[]).map(drop)
            };
            if let Err(e) = loaded {
                panic!("{}: {e:#}", path.display());
            }
        }
    }
}

/// CIFAR-10 records in the binary format: the label byte, then 3072 pixel bytes.
fn cifar10_file(records: usize, seed: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(records * 3073);
    for i in 0..records {
        b.push(((i + seed) % 10) as u8);
        b.extend((0..3072).map(|j| (i * 31 + j * 7 + seed) as u8));
    }
    b
}

/// CIFAR-100 records: the coarse label (the fine label's superclass), the fine label, 3072
/// pixel bytes.
fn cifar100_file(records: usize, seed: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(records * 3074);
    for i in 0..records {
        let fine = (i * 37 + seed) % 100;
        b.extend([fedfuse_data::CIFAR100_COARSE_OF_FINE[fine], fine as u8]);
        b.extend((0..3072).map(|j| (i * 29 + j * 5 + seed) as u8));
    }
    b
}

/// The CIFAR examples run, as their headers write them, on small files in the real formats
/// (the real ones are a download away), kept tiny by overrides: one round, a few dozen images.
#[test]
fn the_cifar_examples_run_on_small_files_in_the_real_formats() {
    let data = tempfile::tempdir().unwrap();
    let ten = data.path().join("cifar10");
    std::fs::create_dir_all(&ten).unwrap();
    for (i, name) in [
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
        "test_batch.bin",
    ]
    .iter()
    .enumerate()
    {
        std::fs::write(ten.join(name), cifar10_file(12, i)).unwrap();
    }
    let hundred = data.path().join("cifar100");
    std::fs::create_dir_all(&hundred).unwrap();
    std::fs::write(hundred.join("train.bin"), cifar100_file(100, 0)).unwrap();
    std::fs::write(hundred.join("test.bin"), cifar100_file(20, 3)).unwrap();

    for (file, dir, extra) in [
        ("cifar10-vgg9.toml", &ten, &[][..]),
        (
            "cifar100-resnet20.toml",
            &hundred,
            &["clients_per_round=2", "partition.samples_per_client=20"][..],
        ),
    ] {
        let mut set: Vec<String> = [
            "rounds=1",
            "clients=2",
            "dataset.train_samples=48",
            "dataset.test_samples=10",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        set.push(format!("data_dir={:?}", dir.display().to_string()));
        let cfg = Config::load(&repo("examples").join(file), &set)
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
        let out = data.path().join(format!("run-{file}"));
        let result = fedfuse_lab::run::run(&cfg, &out, &fedfuse_lab::Silent)
            .unwrap_or_else(|e| panic!("{file}: {e:#}"));
        assert_eq!(result.rounds.len(), 1, "{file}");
        assert!(out.join("model.safetensors").is_file(), "{file}");
    }
}
