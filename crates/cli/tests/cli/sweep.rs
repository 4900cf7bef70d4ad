//! `fedfuse sweep` end to end on the bundled digits: every row of the PFNM comparison.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::process::Command;

#[test]
fn digits_sweep_writes_the_comparison_table() {
    let dir = tempfile::tempdir().unwrap();
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/digits-smoke.toml"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_fedfuse"))
        .args(["sweep", config, "--seeds", "0,1", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let summary = std::fs::read_to_string(dir.path().join("summary.csv")).unwrap();
    let mut acc = BTreeMap::new();
    for line in summary.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f[6], "2", "two seeds per row: {line}");
        acc.insert(f[5].to_string(), f[7].parse::<f64>().unwrap());
    }
    eprintln!("{acc:?}");
    for m in [
        "pfnm",
        "gpi-fnm",
        "fedavg-separate",
        "fedavg-common",
        "local",
        "ensemble",
        "oracle",
    ] {
        assert!(acc.contains_key(m), "no `{m}` row in {summary}");
    }
    // The papers' ordering on heterogeneous splits: matching beats averaging separately
    // initialised networks and the local models; the pooled oracle bounds everything.
    assert!(acc["pfnm"] > acc["fedavg-separate"] + 0.1);
    assert!(acc["pfnm"] > acc["local"] + 0.05);
    assert!(acc["gpi-fnm"] > acc["local"] + 0.05);
    for (m, a) in &acc {
        assert!(acc["oracle"] >= *a, "{m} {a} above the oracle");
    }
    let results = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    assert_eq!(results.lines().count(), 1 + 2 * 7);
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        md.contains("| GPI-FNM |") && md.contains("eps chosen"),
        "{md}"
    );
    assert!(
        dir.path()
            .join("accuracy_dirichlet_0.5___hidden_32.png")
            .exists()
    );
}

#[test]
fn bad_sweep_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("seeds = []", "seeds"),
        ("bogus = 1", "bogus"),
        ("rounds = 3", "local"),
        ("validation_fraction = 0.0", "validation_fraction"),
    ];
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../experiments/digits-smoke.toml"
    ))
    .unwrap();
    for (i, (line, needle)) in cases.iter().enumerate() {
        // Top-level keys go before the first table.
        let key = line.split(" = ").next().unwrap();
        let mut text: String = base
            .lines()
            .filter(|l| !l.starts_with(&format!("{key} =")))
            .map(|l| format!("{l}\n"))
            .collect();
        text.insert_str(0, &format!("{line}\n"));
        let file = dir.path().join(format!("s{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_fedfuse"))
            .args(["sweep", file.to_str().unwrap(), "--out"])
            .arg(dir.path().join("o"))
            .output()
            .unwrap();
        assert!(!o.status.success());
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains(needle) && stderr.contains(&format!("s{i}.toml")),
            "{stderr}"
        );
    }
}
