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
