//! Layer lists and the model zoo in runs: a conv net learns MNIST better than the MLP,
//! FedSparse prunes a ResNet's filters and sends less than FedAvg, PyTorch's weights start a
//! run and the run's model keeps PyTorch's names and dtypes, and what a list cannot do is
//! refused by name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fedfuse_core::{ModelSpec, Params};
use fedfuse_fed::RunResult;
use fedfuse_lab::{Config, Silent};

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn mnist_dir() -> PathBuf {
    repo().join("../shared/data/mnist")
}

fn example(file: &str, sets: &[&str]) -> Config {
    let mut all = vec![format!("data_dir={:?}", mnist_dir().display().to_string())];
    all.extend(sets.iter().map(|s| s.to_string()));
    Config::load(&repo().join(file), &all).unwrap()
}

fn run(cfg: &Config) -> RunResult {
    fedfuse_lab::run::federate(cfg, &Silent).unwrap()
}

fn last_accuracy(r: &RunResult) -> f64 {
    r.rounds.last().unwrap().global_accuracy
}

fn traffic(r: &RunResult) -> u64 {
    r.rounds.iter().map(|m| m.bytes_up + m.bytes_down).sum()
}

/// A quick version of examples/mnist-cnn-leaf.toml (seed 1, 5 rounds, 10 Dirichlet(0.5)
/// clients): 6,000 training samples, 1,000 test samples.
const QUICK: [&str; 2] = ["dataset.train_samples=6000", "dataset.test_samples=1000"];

#[test]
fn cnn_leaf_under_fedavg_beats_the_mlp_on_mnist() {
    // One seed, the example's (a CNN run is a minute on 2 cores): cnn-leaf 0.876 and the MLP
    // 0.765 on 2,000 test samples; seed 2 gave 0.906 and 0.791.
    let cnn = run(&example("examples/mnist-cnn-leaf.toml", &QUICK));
    let mut sets = QUICK.to_vec();
    sets.extend(["model.kind=\"mlp\"", "model.hidden=[100]"]);
    let mlp = run(&example("examples/mnist-cnn-leaf.toml", &sets));
    let (c, m) = (last_accuracy(&cnn), last_accuracy(&mlp));
    assert!(c > 0.8 && c > m + 0.05, "cnn-leaf {c:.4}, MLP {m:.4}");
}

#[test]
fn fedsparse_prunes_a_resnets_filters_and_sends_less_than_fedavg() {
    let sets = [
        "dataset.train_samples=1000",
        "dataset.test_samples=500",
        "rounds=2",
        "clients=10",
        "clients_per_round=5",
        "model.kind=\"resnet20\"",
        "model.width=4",
        "method.preset=\"high\"",
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sparse");
    let sparse = fedfuse_lab::run::run(
        &example("examples/mnist-fedsparse.toml", &sets),
        &out,
        &Silent,
    )
    .unwrap();
    // The run's config.toml shows the layer list resnet20 expanded to, and runs as it is.
    let shown = Config::load(&out.join("config.toml"), &[]).unwrap();
    let layers = &shown.model.as_ref().unwrap().layers;
    assert_eq!(layers.len(), 3 + 9 + 3, "{layers:?}");
    fedfuse_lab::run::Federation::prepare(&shown).unwrap();
    let mut dense_sets = sets[..7].to_vec();
    dense_sets.push("method={name=\"fedavg\"}");
    let dense = run(&example("examples/mnist-fedsparse.toml", &dense_sets));
    let last = sparse.rounds.last().unwrap();
    let pruned = last.method["groups_pruned"];
    let on = last.method["client_groups_on"];
    assert!(
        pruned > 0.0 || on < 0.9,
        "pruned {pruned}, clients' groups on {on}"
    );
    assert!(
        traffic(&sparse) < traffic(&dense),
        "FedSparse {} bytes, FedAvg {}",
        traffic(&sparse),
        traffic(&dense)
    );
    // Pruned groups are whole filters: every value of a group is zero, or none is.
    let spec = fedfuse_core::ZooModel::Resnet20
        .spec(&[1, 28, 28], 10, fedfuse_core::BlockNorm::Batch, 4)
        .unwrap();
    let layout = fedfuse_core::GroupLayout::of_model(&spec);
    let norms = layout.norms(&sparse.params).unwrap();
    let zero = norms.iter().filter(|&&n| n == 0.0).count();
    assert!(
        pruned == 0.0 || zero > 0,
        "{pruned} of the groups pruned but no group is zero"
    );
}

/// A PyTorch-style file: no recorded order, tensors sorted as safetensors sorts them, batch
/// norm's counter as I64.
fn pytorch_file(params: &Params, path: &Path) {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes: Vec<(String, Vec<u8>, Vec<usize>, Dtype)> = params
        .iter()
        .map(|(name, t)| {
            if name.ends_with("num_batches_tracked") {
                let v = (t.data[0] as i64).to_le_bytes().to_vec();
                (name.to_string(), v, t.shape.clone(), Dtype::I64)
            } else {
                let v = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
                (name.to_string(), v, t.shape.clone(), Dtype::F32)
            }
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, b, s, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

const DIGITS_LIST: &str = r#"
seed = 4
rounds = 2
clients = 4
[dataset]
name = "digits"
[method]
name = "fedavg"
[model]
kind = "sequential"
layers = [
    { type = "linear", out = 32, bias = false },
    { type = "batchnorm1d" },
    { type = "relu" },
    { type = "dropout", p = 0.1 },
    { type = "linear", out = 10 },
]
[train]
lr = 0.1
epochs = 2
"#;

#[test]
fn pytorch_weights_start_a_run_whose_model_keeps_pytorchs_names_and_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::parse(DIGITS_LIST, &[]).unwrap();
    let fed = fedfuse_lab::run::Federation::prepare(&cfg).unwrap();
    let spec: ModelSpec = fed.spec.clone().unwrap();
    // Start from weights a PyTorch user saved, with a counter of 5 batches.
    let mut start = fed.init.clone();
    start.get_mut("1.num_batches_tracked").unwrap().data[0] = 5.0;
    start.get_mut("1.running_var").unwrap().data[3] = 2.5;
    let file = dir.path().join("torch.safetensors");
    pytorch_file(&start, &file);
    let from = Config::parse(
        DIGITS_LIST,
        &[format!("model.init_from={:?}", file.display().to_string())],
    )
    .unwrap();
    let out = dir.path().join("runs/new/list");
    let result = fedfuse_lab::run::run(&from, &out, &Silent).unwrap();
    let acc = last_accuracy(&result);
    assert!(acc > 0.8, "accuracy {acc}");

    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let names: HashMap<String, (Vec<usize>, String)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.shape().to_vec(), format!("{:?}", v.dtype()))))
        .collect();
    for s in spec.param_shapes() {
        let (shape, dtype) = &names[&s.name];
        assert_eq!(shape, &s.shape, "{}", s.name);
        let want = if s.name.ends_with("num_batches_tracked") {
            "I64"
        } else {
            "F32"
        };
        assert_eq!(dtype, want, "{}", s.name);
    }
    assert_eq!(names.len(), spec.param_shapes().len());
    // Every client counted its batches on top of the 5 it started from: the mean is more.
    let counter = st.tensor("1.num_batches_tracked").unwrap();
    let batches = i64::from_le_bytes(counter.data().try_into().unwrap());
    assert!(batches > 5, "{batches}");

    // Names or shapes that are not the model's are refused before round 1, naming them.
    let mut wrong = start.clone();
    let t = wrong.remove("4.bias").unwrap();
    wrong.push("4.bias_typo", t.shape, t.data).unwrap();
    pytorch_file(&wrong, &file);
    let e = fedfuse_lab::run::federate(&from, &Silent)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.init_from") && e.contains("4.bias") && e.contains("4.bias_typo"),
        "{e}"
    );
}

#[test]
fn what_a_list_cannot_do_is_refused_by_name() {
    let err = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        match Config::parse(DIGITS_LIST, &sets) {
            Err(e) => e.to_string(),
            Ok(cfg) => fedfuse_lab::run::Federation::prepare(&cfg)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        }
    };
    assert!(err(&["method={name=\"feddrop\", fraction=0.25}"]).contains("fedsparse"));
    assert!(err(&["method={name=\"pfnm\"}"]).contains("model.kind = \"mlp\""));
    assert!(err(&["train.dropout=0.2"]).contains("type = \"dropout\""));
    let e = err(&["privacy={kind=\"central-fixed\", noise_multiplier=1.0, clipping_norm=1.0}"]);
    assert!(e.contains("running statistics"), "{e}");
    assert!(err(&["model.hidden=[10]"]).contains("mlp"));
    // A zoo network needs images; digits are flat.
    let e = err(&["model.kind=\"cnn-leaf\"", "model.layers=[]"]);
    assert!(e.contains("image samples"), "{e}");
    assert!(err(&["model.norm=\"group\""]).contains("resnet20"));
    // The Pachinko split needs CIFAR-100's superclasses.
    assert!(err(&["partition={kind=\"pachinko\"}"]).contains("dataset.name = \"cifar100\""));
    // The layer that does not fit is named.
    let e = err(&["model.layers=[{type=\"conv2d\", out=4, kernel=3}]"]);
    assert!(e.contains("model.layers[0] (conv2d"), "{e}");
}

#[test]
fn every_classifier_method_runs_on_a_layer_list_or_is_refused_by_name() {
    // Layer norm instead of batch norm, so that [privacy] may wrap it too.
    let layernorm = "model.layers=[{type=\"linear\", out=32}, {type=\"layernorm\"}, \
                     {type=\"relu\"}, {type=\"linear\", out=10}]";
    let runs: &[(&str, &[&str])] = &[
        ("fedavg", &[]),
        ("fedprox", &["method={name=\"fedprox\", mu=0.01}"]),
        ("fedmedian", &["method={name=\"fedmedian\"}"]),
        (
            "fedtrimmedavg",
            &["method={name=\"fedtrimmedavg\", beta=0.1}"],
        ),
        ("krum", &["method={name=\"krum\", byzantine=0, keep=2}"]),
        (
            "bulyan",
            &["clients=8", "method={name=\"bulyan\", byzantine=1}"],
        ),
        ("fedopt", &["method={name=\"fedopt\", optimizer=\"adam\"}"]),
        (
            "fedavg + [server]",
            &["server={optimizer=\"kingma-adam\", lr=0.01}"],
        ),
        (
            "fedmix",
            &["method={name=\"fedmix\", components=2, lambda=100.0}"],
        ),
        (
            "fedl1",
            &["method={name=\"fedl1\", l1=0.0001, threshold=0.001}"],
        ),
        (
            "fedsparse",
            &["method={name=\"fedsparse\", preset=\"high\", server_lr=0.01}"],
        ),
        (
            "central dp",
            &[
                layernorm,
                "privacy={kind=\"central-fixed\", noise_multiplier=0.01, clipping_norm=10.0}",
            ],
        ),
    ];
    for (name, sets) in runs {
        let mut all: Vec<String> = vec!["rounds=3".into()];
        all.extend(sets.iter().map(|s| s.to_string()));
        let cfg = Config::parse(DIGITS_LIST, &all).unwrap_or_else(|e| panic!("{name}: {e}"));
        let result =
            fedfuse_lab::run::federate(&cfg, &Silent).unwrap_or_else(|e| panic!("{name}: {e}"));
        let acc = last_accuracy(&result);
        // Chance is 0.1; three rounds on digits reach far above it when the method works.
        assert!(acc > 0.5, "{name}: accuracy {acc:.3}");
        result.params.check_finite().unwrap();
    }
}
