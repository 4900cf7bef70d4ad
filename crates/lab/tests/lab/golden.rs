//! Behaviour lock: every example (digits-sized), the digits sweep and the FedNGM synthetic
//! experiment give exactly the outputs recorded in `tests/golden/` (timing fields aside), and
//! `fedfuse run` saves the same model bytes. `scripts/golden.sh` rewrites the files for a
//! change that is meant to alter results.
//!
//! Bits are only reproducible on gemm's kernels of the machine that wrote the files
//! (`tests/golden/KERNELS`, from `fedfuse --version`). Elsewhere every number must agree
//! within [`LOOSE_ABS`] + [`LOOSE_REL`]·|value|, and the rest (names, structure, text)
//! exactly: a broken method still fails, rounding differences do not.

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

/// Tolerance of the comparison on other kernels (accuracies of these short digits runs move
/// by about 0.01 between AVX2 and AVX-512 kernels).
const LOOSE_ABS: f64 = 0.05;
const LOOSE_REL: f64 = 0.1;

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= LOOSE_ABS + LOOSE_REL * a.abs().max(b.abs())
}

/// Equal structure and text, numbers [`close`].
fn json_close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => close(x, y),
            _ => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_close(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_close(v, w)))
        }
        _ => a == b,
    }
}

/// Equal rows and text fields, numeric fields [`close`].
fn csv_close(a: &[String], b: &[String]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| {
            let (a, b): (Vec<&str>, Vec<&str>) = (a.split(',').collect(), b.split(',').collect());
            a.len() == b.len()
                && a.iter().zip(&b).all(|(x, y)| {
                    x == y
                        || match (x.parse::<f64>(), y.parse::<f64>()) {
                            (Ok(x), Ok(y)) => close(x, y),
                            _ => false,
                        }
                })
        })
}

/// Whether the golden files were written on this machine's gemm kernels.
fn same_kernels() -> bool {
    let recorded = std::fs::read_to_string(golden().join("KERNELS")).unwrap_or_default();
    recorded.trim() == fedfuse_train::gemm_kernels()
}

fn compare(case: &str, expected_dir: &Path, out: &Path, exact: bool) -> Vec<String> {
    let mut diffs = Vec::new();
    for entry in std::fs::read_dir(expected_dir).unwrap() {
        let expected = entry.unwrap().path();
        let name = expected.file_name().unwrap().to_string_lossy().into_owned();
        if name == "model.sha256" {
            if !exact {
                continue;
            }
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
            if exact { a == b } else { json_close(&a, &b) }
        } else {
            let (a, b) = (csv_without_timing(&want), csv_without_timing(&got));
            if exact { a == b } else { csv_close(&a, &b) }
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
    let exact = same_kernels();
    if !exact {
        eprintln!(
            "golden files were written on other gemm kernels than this machine's ({}): \
             comparing numbers within {LOOSE_ABS} + {LOOSE_REL}·|value|",
            fedfuse_train::gemm_kernels()
        );
    }
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
                fedfuse_lab::sweep::run(&cfg, &out, None, &Silent, false, None, None).unwrap();
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
        diffs.extend(compare(&case.name, &golden().join(&case.name), &out, exact));
    }
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

#[test]
fn the_loose_comparison_takes_rounding_and_refuses_a_changed_result() {
    let want: Value =
        serde_json::json!({"method": "fedavg", "accuracy": [0.80, 0.91], "bytes": 1000});
    let near: Value =
        serde_json::json!({"method": "fedavg", "accuracy": [0.81, 0.9], "bytes": 1040});
    assert!(json_close(&want, &near));
    for far in [
        serde_json::json!({"method": "fedavg", "accuracy": [0.80, 0.5], "bytes": 1000}),
        serde_json::json!({"method": "fedprox", "accuracy": [0.80, 0.91], "bytes": 1000}),
        serde_json::json!({"method": "fedavg", "accuracy": [0.80], "bytes": 1000}),
        serde_json::json!({"method": "fedavg", "accuracy": [0.80, 0.91], "bytes": 2000}),
    ] {
        assert!(!json_close(&want, &far), "{far}");
    }
    let rows = |t: &str| t.lines().map(String::from).collect::<Vec<_>>();
    let want = rows("round,method,accuracy\n1,fedavg,0.80");
    assert!(csv_close(
        &want,
        &rows("round,method,accuracy\n1,fedavg,0.80")
    ));
    let nan = rows("round,method,accuracy\n1,fedavg,NaN");
    assert!(csv_close(&nan, &nan));
    assert!(csv_close(
        &want,
        &rows("round,method,accuracy\n1,fedavg,0.82")
    ));
    assert!(!csv_close(
        &want,
        &rows("round,method,accuracy\n1,fedavg,0.60")
    ));
    assert!(!csv_close(
        &want,
        &rows("round,method,accuracy\n1,fedprox,0.80")
    ));
}
