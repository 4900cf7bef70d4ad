//! `lab::run::Federation` as a Flower node and server use it: a node's own samples in place
//! of its partition, and the server scoring a model given as Flower content.

use fedfuse_core::Record;
use fedfuse_data::Dataset;
use fedfuse_lab::Config;
use fedfuse_lab::run::Federation;

const DIGITS: &str = r#"
seed = 3
rounds = 1
clients = 3
[dataset]
name = "digits"
local_test_fraction = 0.2
[method]
name = "fedavg"
[model]
kind = "mlp"
hidden = [16]
[train]
epochs = 1
"#;

fn samples(n: usize, dim: usize, label: u32) -> Dataset {
    let x = (0..n * dim).map(|i| (i % 17) as f32 / 16.0).collect();
    let y = (0..n as u32).map(|i| (i + label) % 10).collect();
    // The file's own class count (what a CSV with labels 0..=9 reads as).
    Dataset::new(x, y, vec![dim], 10).unwrap()
}

#[test]
fn own_samples_replace_a_partition_split_like_one() {
    let cfg = Config::parse(DIGITS, &[]).unwrap();
    let mut fed = Federation::prepare(&cfg).unwrap();
    let before = fed.data.num_examples(0);
    fed.use_own_data(&cfg, 1, samples(50, 64, 0), "own.csv")
        .unwrap();
    // 20% of 50 held out as the local test split, as a partition's is.
    assert_eq!(fed.data.num_examples(1), 40);
    assert_eq!(
        fed.data.num_examples(0),
        before,
        "other slots keep their partitions"
    );

    let e = fed
        .use_own_data(&cfg, 1, samples(50, 63, 0), "narrow.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("narrow.csv") && e.contains("63 features") && e.contains("64"),
        "{e}"
    );
    let mut wide_labels = samples(50, 64, 0);
    wide_labels.y[7] = 12;
    wide_labels.num_classes = 13;
    let e = fed
        .use_own_data(&cfg, 1, wide_labels, "labels.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("labels.csv") && e.contains("below 10"), "{e}");
    let e = fed
        .use_own_data(&cfg, 7, samples(50, 64, 0), "own.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("client 7"), "{e}");
}

#[test]
fn the_server_scores_flower_content_as_it_scores_its_own_model() {
    let cfg = Config::parse(DIGITS, &[]).unwrap();
    let fed = Federation::prepare(&cfg).unwrap();
    let content = Record::from_params(fed.init.clone()).to_flower().unwrap();
    let (loss, accuracy) = fed.server_evaluate(&content).unwrap();
    // An untrained 10-class model: near chance, with a loss near ln 10.
    assert!((0.0..0.3).contains(&accuracy), "{accuracy}");
    assert!((loss - 10f64.ln()).abs() < 0.5, "{loss}");
    let view = fed.data.server_view();
    let (figures, _) = view
        .evaluate(fed.method.as_ref(), &fed.init, false)
        .unwrap();
    assert_eq!((figures.0, figures.1), (accuracy, loss));
}

#[test]
fn a_run_whose_every_reply_is_rejected_fails_and_says_why() {
    // A learning rate no weights survive: every client's update is non-finite, every round.
    let cfg = Config::parse(DIGITS, &["train.lr=1e30".into(), "rounds=2".into()]).unwrap();
    let out = std::env::temp_dir().join(format!("fedfuse-all-rejected-{}", std::process::id()));
    let e = fedfuse_lab::run::run(&cfg, &out, &fedfuse_lab::Silent)
        .unwrap_err()
        .to_string();
    assert!(e.contains("every client's reply was rejected"), "{e}");
    assert!(
        e.contains("client 0: training diverged") && e.contains("lower train.lr"),
        "{e}"
    );
    // The outputs that say which replies were rejected are written.
    assert!(out.join("results.json").is_file());
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn a_runs_folder_is_replaced_whole_or_not_at_all() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["config.toml", "results.json", "accuracy_vs_bytes.svg"] {
        std::fs::write(out.join(f), "from an earlier run").unwrap();
    }
    // A run that fails (MNIST is not where the config says) changes nothing.
    let failing = Config::parse(
        DIGITS,
        &[
            "dataset.name=mnist".into(),
            format!(
                "data_dir={:?}",
                tmp.path().join("nowhere").display().to_string()
            ),
        ],
    )
    .unwrap();
    assert!(fedfuse_lab::run::run(&failing, &out, &fedfuse_lab::Silent).is_err());
    for f in ["config.toml", "results.json", "accuracy_vs_bytes.svg"] {
        assert_eq!(
            std::fs::read_to_string(out.join(f)).unwrap(),
            "from an earlier run"
        );
    }
    // A run that succeeds replaces every file, the earlier run's leftovers included.
    let cfg = Config::parse(DIGITS, &[]).unwrap();
    fedfuse_lab::run::run(&cfg, &out, &fedfuse_lab::Silent).unwrap();
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(config.contains("digits"), "{config}");
    assert!(
        std::fs::read_to_string(out.join("results.json"))
            .unwrap()
            .contains("rounds")
    );
    assert!(out.join("model.safetensors").is_file());
    // No staging or old folders are left beside it.
    let beside: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(beside, ["run"]);
    // A folder holding anything a run does not write is refused before the run starts.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let e = fedfuse_lab::run::run(&cfg, &out, &fedfuse_lab::Silent)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("notes.txt") && e.contains("new or empty folder"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
}

/// Over Flower a torchvision ResNet carries torchvision's names (what a stock PyTorch
/// ClientApp on `torchvision.models.resnet18` loads by name): a node takes an instruction under
/// them and replies under them, and the server scores a model under either.
#[test]
fn torchvision_resnets_travel_under_torchvisions_names() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let sets: Vec<String> = [
        "dataset.name=mnist",
        "dataset.train_samples=60",
        "dataset.test_samples=20",
        "dataset.local_test_fraction=0",
        "model={kind=\"resnet18\", width=2}",
        "train.batch_size=10",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("data_dir={dir:?}")])
    .collect();
    let cfg = Config::parse(DIGITS, &sets).unwrap();
    let fed = Federation::prepare(&cfg).unwrap();
    let inside = Record::from_params(fed.init.clone());
    let outside = fed.wire.outgoing(inside.clone()).unwrap();
    let names: Vec<&str> = outside.arrays.iter().map(|a| a.key.as_str()).collect();
    for want in [
        "conv1.weight",
        "bn1.running_mean",
        "layer1.0.conv2.weight",
        "layer2.0.downsample.0.weight",
        "layer4.1.bn2.num_batches_tracked",
        "fc.bias",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    assert!(
        names.iter().all(|n| !n.starts_with(char::is_numeric)),
        "{names:?}"
    );
    let round = Record::from_params(fed.init.clone())
        .with_config("server-round", fedfuse_core::ConfigValue::Int(1));
    let reply = fed
        .client_fit(0, &fed.wire.outgoing(round).unwrap())
        .unwrap();
    let replied: Vec<&str> = reply.arrays.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(replied, names);
    // The same model under either name set scores the same.
    let listed = inside.to_flower().unwrap();
    assert_eq!(
        fed.server_evaluate(&outside).unwrap(),
        fed.server_evaluate(&listed).unwrap()
    );
    // A peer that sends one tensor under both names is refused, naming it.
    let mut twice = outside.clone();
    let stem = listed.arrays.iter().find(|a| a.key == "0.weight").unwrap();
    twice.arrays.push(stem.clone());
    let e = fed.server_evaluate(&twice).unwrap_err().to_string();
    assert!(e.contains("0.weight"), "{e}");
    let e = fed.client_fit(0, &twice).unwrap_err().to_string();
    assert!(e.contains("0.weight"), "{e}");
}
