//! FEMNIST in a run: LEAF's shards or Flower Datasets' Parquet files under --data-dir, one
//! client per writer (`partition.kind = "natural_id"` on `writer_id`), each testing on its own
//! test samples, and the digits or letters alone.

use std::path::Path;

use fedfuse_lab::Config;
use fedfuse_lab::run::{Federation, FederationData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// LEAF's layout under `dir`: `train` samples per writer in two shards, `test` samples in one
/// (writer `f0004` has none); images random in [0, 1], labels cycling through all 62 classes.
fn leaf_files(dir: &Path, writers: &[(&str, usize, usize)]) {
    let mut rng = StdRng::seed_from_u64(5);
    for split in ["train", "test"] {
        std::fs::create_dir_all(dir.join(split)).unwrap();
    }
    let mut label = 0u32;
    let mut user = |n: usize, rng: &mut StdRng| {
        let x: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..784).map(|_| rng.random_range(0.0..=1.0)).collect())
            .collect();
        let y: Vec<u32> = (0..n)
            .map(|_| {
                label = (label + 7) % 62;
                label
            })
            .collect();
        serde_json::json!({ "x": x, "y": y })
    };
    for (split, shards) in [("train", 2), ("test", 1)] {
        for s in 0..shards {
            let mine: Vec<_> = writers.iter().skip(s).step_by(shards).collect();
            let mut data = serde_json::Map::new();
            let mut users = Vec::new();
            let mut counts = Vec::new();
            for (name, train, test) in mine {
                let n = if split == "train" { *train } else { *test };
                if n == 0 {
                    continue;
                }
                users.push(name.to_string());
                counts.push(n);
                data.insert(name.to_string(), user(n, &mut rng));
            }
            let shard =
                serde_json::json!({ "users": users, "num_samples": counts, "user_data": data });
            let path = dir
                .join(split)
                .join(format!("all_data_{s}_niid_1_keep_0_{split}_9.json"));
            std::fs::write(path, serde_json::to_vec(&shard).unwrap()).unwrap();
        }
    }
}

const WRITERS: [(&str, usize, usize); 5] = [
    ("f0000_01", 30, 4),
    ("f0001_02", 24, 3),
    ("f0002_03", 40, 5),
    ("f0003_04", 18, 2),
    ("f0004_05", 12, 0),
];

const BY_WRITER: &str = "kind = \"natural_id\"\ncolumn = \"writer_id\"";
const IID: &str = "kind = \"iid\"";

fn config(dir: &Path, partition: &str, sets: &[&str]) -> Config {
    let text = format!(
        r#"
seed = 3
rounds = 2
clients = 5
clients_per_round = 3
data_dir = "{}"
[dataset]
name = "femnist"
[partition]
{partition}
[method]
name = "fedavg"
[model]
kind = "mlp"
hidden = [16]
[train]
lr = 0.05
batch_size = 8
"#,
        dir.display()
    );
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(&text, &sets).unwrap()
}

#[test]
fn each_writer_is_a_client_with_its_own_leaf_test_samples() {
    let dir = tempfile::tempdir().unwrap();
    leaf_files(dir.path(), &WRITERS);
    let cfg = config(dir.path(), BY_WRITER, &[]);
    let fed = Federation::prepare(&cfg).unwrap();
    let FederationData::Labelled { clients, test, .. } = &fed.data else {
        panic!("not labelled");
    };
    // Clients in the writers' sorted order, each with its LEAF train and test samples.
    let sizes: Vec<(usize, usize)> = clients
        .iter()
        .map(|c| (c.train.len(), c.test.len()))
        .collect();
    assert_eq!(sizes, WRITERS.map(|(_, tr, te)| (tr, te)));
    for c in clients {
        let ids = c.train.ids.as_ref().unwrap();
        assert!(
            ids.of.iter().all(|&w| w == ids.of[0]),
            "one writer per client"
        );
        if let Some(t) = &c.test.ids {
            assert!(t.of.iter().all(|&w| w == ids.of[0]));
        }
    }
    // The server scores on every writer's test samples.
    assert_eq!(test.len(), 14);
    assert_eq!(test.num_classes, 62);

    // The run goes end to end.
    let out = dir.path().join("runs/femnist");
    let result = fedfuse_lab::run::run(&cfg, &out, &fedfuse_lab::Silent).unwrap();
    assert_eq!(result.rounds.len(), 2);
    assert!(
        result
            .rounds
            .iter()
            .all(|r| r.clients == 3 && r.rejected.is_empty())
    );

    // A writer count other than `clients` is refused, saying how many there are.
    let wrong = config(dir.path(), BY_WRITER, &["clients=4"]);
    let e = format!("{:#}", Federation::prepare(&wrong).err().unwrap());
    assert!(e.contains('5'), "{e}");
}

#[test]
fn digits_or_letters_alone_and_what_other_datasets_refuse() {
    let dir = tempfile::tempdir().unwrap();
    leaf_files(dir.path(), &WRITERS);
    let all = Federation::prepare(&config(dir.path(), IID, &[])).unwrap();
    let digits =
        Federation::prepare(&config(dir.path(), IID, &["dataset.classes=\"digits\""])).unwrap();
    let letters =
        Federation::prepare(&config(dir.path(), IID, &["dataset.classes=\"letters\""])).unwrap();
    let test_of = |f: &Federation| match &f.data {
        FederationData::Labelled { test, .. } => test.clone(),
        _ => panic!(),
    };
    let (all, digits, letters) = (test_of(&all), test_of(&digits), test_of(&letters));
    assert_eq!((digits.num_classes, letters.num_classes), (10, 52));
    assert_eq!(digits.len() + letters.len(), all.len());
    assert_eq!(
        digits.y,
        all.y
            .iter()
            .copied()
            .filter(|&y| y < 10)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        letters.y,
        all.y
            .iter()
            .filter(|&&y| y >= 10)
            .map(|&y| y - 10)
            .collect::<Vec<_>>()
    );

    // Other datasets have no writers, nor FEMNIST's classes.
    let text = "rounds = 1\nclients = 2\n[dataset]\nname = \"digits\"\n[method]\nname = \"fedavg\"\n\
                [model]\nkind = \"mlp\"\n";
    let e = format!(
        "{:#}",
        Config::parse(
            text,
            &[
                "partition.kind=\"natural_id\"".into(),
                "partition.column=\"writer_id\"".into()
            ]
        )
        .unwrap_err()
    );
    assert!(e.contains("only femnist"), "{e}");
    let e = format!(
        "{:#}",
        Config::parse(text, &["dataset.classes=\"digits\"".into()]).unwrap_err()
    );
    assert!(e.contains("dataset.classes"), "{e}");
}

/// The same samples as LEAF's shards and as Flower Datasets' Parquet files: the same clients,
/// the same samples, and a run with the same bits.
#[test]
fn parquet_and_leaf_files_make_the_same_federation() {
    let dir = tempfile::tempdir().unwrap();
    let (leaf, hub) = (dir.path().join("leaf"), dir.path().join("hub"));
    crate::femnist_files::write_leaf(&leaf);
    crate::femnist_files::write_parquet_like_leaf(&hub.join("data"));
    let writers = crate::femnist_files::WRITERS.len();
    let sets = [format!("clients={writers}"), "clients_per_round=2".into()];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let (from_leaf, from_parquet) = (
        config(&leaf, BY_WRITER, &sets),
        config(&hub, BY_WRITER, &sets),
    );
    let clients = |cfg: &Config| match Federation::prepare(cfg).unwrap().data {
        FederationData::Labelled { clients, test, .. } => (clients, test),
        _ => panic!("not labelled"),
    };
    let (leaf_clients, leaf_test) = clients(&from_leaf);
    let (parquet_clients, parquet_test) = clients(&from_parquet);
    assert_eq!(leaf_clients.len(), writers);
    assert_eq!(parquet_clients, leaf_clients);
    assert_eq!(parquet_test, leaf_test);
    let run = |cfg: &Config, out: &str| {
        fedfuse_lab::run::run(cfg, &dir.path().join(out), &fedfuse_lab::Silent).unwrap()
    };
    let (a, b) = (
        run(&from_leaf, "runs/leaf"),
        run(&from_parquet, "runs/parquet"),
    );
    assert_eq!(a.rounds.len(), 2);
    assert_eq!(a.params, b.params);
    // Every round's figures but its wall time.
    let untimed = |r: &fedfuse_fed::RoundMetrics| fedfuse_fed::RoundMetrics {
        seconds: 0.0,
        ..r.clone()
    };
    for (x, y) in a.rounds.iter().zip(&b.rounds) {
        assert_eq!(untimed(x), untimed(y));
    }
}
