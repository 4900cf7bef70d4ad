//! `fedfuse data partition`: the run's split of its dataset, one histogram row per client.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fedfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedfuse"))
        .args(args)
        .current_dir(repo())
        // Keep tests away from the user's cache.
        .env(
            "FEDFUSE_DATA",
            std::env::temp_dir().join("fedfuse-test-empty-cache"),
        )
        .output()
        .expect("the fedfuse binary runs")
}

/// `fedfuse data partition ARGS`, which must succeed; its stdout.
fn partition_ok(args: &[&str]) -> String {
    let mut all = vec!["data", "partition"];
    all.extend_from_slice(args);
    let o = fedfuse(&all);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fedfuse {all:?} failed:\n{stderr}");
    String::from_utf8(o.stdout).unwrap()
}

/// `fedfuse data partition ARGS`, which must fail; its stderr.
fn partition_err(args: &[&str]) -> String {
    let mut all = vec!["data", "partition"];
    all.extend_from_slice(args);
    let o = fedfuse(&all);
    assert!(!o.status.success(), "fedfuse {all:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One row of the table: client, size, count per class.
type Row = (usize, usize, Vec<usize>);

/// The table's client rows and its total row (size, then count per class).
fn rows(table: &str) -> (Vec<Row>, Vec<usize>) {
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[..2], ["client", "size"], "{table}");
    let mut clients = Vec::new();
    let mut total = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells.len(), header.len(), "{line}");
        let nums: Vec<usize> = cells[1..].iter().map(|c| c.parse().unwrap()).collect();
        match cells[0] {
            "total" => total = nums,
            c => clients.push((c.parse().unwrap(), nums[0], nums[1..].to_vec())),
        }
    }
    (clients, total)
}

#[test]
fn partition_of_quickstart_histogram_rows_sum_to_sizes() {
    let dir = tempfile::tempdir().unwrap();
    // Into folders that do not exist yet.
    let svg = dir.path().join("plots/new/split.svg");
    let out = partition_ok(&["examples/quickstart.toml", "--plot", svg.to_str().unwrap()]);
    let (clients, total) = rows(&out);
    assert_eq!(clients.len(), 10, "{out}");
    for (i, (id, size, counts)) in clients.iter().enumerate() {
        assert_eq!(*id, i);
        assert_eq!(counts.len(), 10);
        assert_eq!(counts.iter().sum::<usize>(), *size, "client {id}: {out}");
        // min_partition_size = 10
        assert!(*size >= 10, "client {id}: {out}");
    }
    // Every training sample once: 1,797 digits less the 359 of the test split.
    let sizes: usize = clients.iter().map(|c| c.1).sum();
    assert_eq!(sizes, 1438);
    assert_eq!(total[0], 1438);
    for k in 0..10 {
        assert_eq!(total[1 + k], clients.iter().map(|c| c.2[k]).sum::<usize>());
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("dirichlet: samples per class"));
    // The same config and seed give the same split.
    assert_eq!(partition_ok(&["examples/quickstart.toml"]), out);
}

const PATHOLOGICAL: &str = r#"
seed = 3
rounds = 1
clients = 6

[dataset]
name = "digits"

[partition]
kind = "pathological"
classes_per_client = 2
class_assignment_mode = "first-deterministic"

[method]
name = "fedavg"

[model]
kind = "mlp"
hidden = [8]
"#;

#[test]
fn partition_shows_the_new_kinds_of_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, PATHOLOGICAL).unwrap();
    let cfg = cfg.to_str().unwrap();
    let classes_of =
        |counts: &[usize]| -> Vec<usize> { (0..counts.len()).filter(|&k| counts[k] > 0).collect() };
    // first-deterministic: client i owns class i and one more.
    let (clients, _) = rows(&partition_ok(&[cfg]));
    for (i, _, counts) in &clients {
        let owned = classes_of(counts);
        assert!(
            owned.len() == 2 && owned.contains(i),
            "client {i}: {owned:?}"
        );
    }
    // deterministic: client i owns classes i and i + 1.
    let (clients, _) = rows(&partition_ok(&[
        cfg,
        "--set",
        "partition.class_assignment_mode=deterministic",
    ]));
    for (i, _, counts) in &clients {
        assert_eq!(classes_of(counts), vec![*i, i + 1]);
    }
    // inner_dirichlet: the sizes asked for.
    let inner = [
        cfg,
        "--set",
        "clients=3",
        "--set",
        "partition={kind = \"inner_dirichlet\", partition_sizes = [100, 200, 300], alpha = 0.3}",
    ];
    let (clients, _) = rows(&partition_ok(&inner));
    let sizes: Vec<usize> = clients.iter().map(|c| c.1).collect();
    assert_eq!(sizes, vec![100, 200, 300]);
    // One size per client, or an error that says so.
    let mut four = inner;
    four[2] = "clients=4";
    let e = partition_err(&four);
    assert!(
        e.contains("partition_sizes") && e.contains("clients = 3"),
        "{e}"
    );
    // digits has no per-sample column to split by.
    let e = partition_err(&[
        cfg,
        "--set",
        "partition={kind = \"natural_id\", column = \"writer\"}",
    ]);
    assert!(e.contains("`writer`") && e.contains("natural_id"), "{e}");
    let e = partition_err(&[cfg, "--plot", "split.png"]);
    assert!(e.contains("*.svg"), "{e}");
}
