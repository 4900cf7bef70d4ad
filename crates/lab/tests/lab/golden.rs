//! Behaviour lock: every example (digits-sized), the digits sweep and the FedNGM synthetic
//! experiment give exactly the outputs recorded in `tests/golden/` (timing fields aside), and
//! `fedfuse run` saves the same model bytes. `scripts/golden.sh` rewrites the files for a
//! change that is meant to alter results.

use std::path::{Path, PathBuf};

use fedfuse_lab::{Config, Silent};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

struct Case {
    name: String,
    command: String,
    file: PathBuf,
    sets: Vec<String>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(golden().join("cases.txt")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            assert_eq!(f.len(), 4, "cases.txt line `{l}`");
            Case {
                name: f[0].into(),
                command: f[1].into(),
                file: repo().join(f[2]),
                sets: f[3]
                    .split(" ; ")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            }
        })
        .collect()
}

/// Removes wall-clock fields, which differ from run to run.
fn without_timing(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("seconds");
            m.remove("seconds_total");
            m.values_mut().for_each(without_timing);
        }
        Value::Array(a) => a.iter_mut().for_each(without_timing),
        _ => {}
    }
}

/// The CSV without its `seconds` column.
fn csv_without_timing(text: &str) -> Vec<String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let drop = header.iter().position(|h| *h == "seconds");
    std::iter::once(header.join(","))
        .chain(lines.map(String::from))
        .map(|l| match drop {
            Some(i) => l
                .split(',')
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, f)| f)
                .collect::<Vec<_>>()
                .join(","),
            None => l,
        })
        .collect()
}

fn compare(case: &str, expected_dir: &Path, out: &Path) -> Vec<String> {
    let mut diffs = Vec::new();
    for entry in std::fs::read_dir(expected_dir).unwrap() {
        let expected = entry.unwrap().path();
        let name = expected.file_name().unwrap().to_string_lossy().into_owned();
        if name == "model.sha256" {
            let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
            let got = format!("{:x}", Sha256::digest(&bytes));
            if got != std::fs::read_to_string(&expected).unwrap().trim() {
                diffs.push(format!("{case}: model.safetensors bytes differ"));
            }
            continue;
        }
        let want = std::fs::read_to_string(&expected).unwrap();
        let got = std::fs::read_to_string(out.join(&name))
            .unwrap_or_else(|e| panic!("{case}: {name} was not written: {e}"));
        let same = if name.ends_with(".json") {
            let mut a: Value = serde_json::from_str(&want).unwrap();
            let mut b: Value = serde_json::from_str(&got).unwrap();
            without_timing(&mut a);
            without_timing(&mut b);
            a == b
        } else {
            csv_without_timing(&want) == csv_without_timing(&got)
        };
        if !same {
            diffs.push(format!(
                "{case}: {name} differs from tests/golden/{case}/{name}"
            ));
        }
    }
    diffs
}

#[test]
fn outputs_equal_the_recorded_golden_files() {
    let mut diffs = Vec::new();
    let cases = cases();
    assert!(cases.len() >= 18, "{} cases", cases.len());
    for case in &cases {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join(&case.name);
        match case.command.as_str() {
            "run" => {
                let cfg = Config::load(&case.file, &case.sets).unwrap();
                fedfuse_lab::run::run(&cfg, &out, &Silent).unwrap();
            }
            "sweep" => {
                let cfg = fedfuse_lab::sweep::SweepConfig::load(&case.file).unwrap();
                fedfuse_lab::sweep::run(&cfg, &out, None, &Silent, false).unwrap();
            }
            "ngm" => {
                let mut cfg = fedfuse_lab::ngm_experiment::NgmExperiment::load(&case.file).unwrap();
                let seeds = case.sets.iter().find_map(|s| s.strip_prefix("seeds="));
                if let Some(seeds) = seeds {
                    cfg.seeds = seeds.split(',').map(|s| s.parse().unwrap()).collect();
                }
                fedfuse_lab::ngm_experiment::run(&cfg, &out, None, &Silent, false).unwrap();
            }
            other => panic!("unknown command `{other}` in cases.txt"),
        }
        diffs.extend(compare(&case.name, &golden().join(&case.name), &out));
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}
