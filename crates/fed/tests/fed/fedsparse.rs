//! FedSparse in the federation: real sparsity and smaller uploads on heterogeneous MNIST, and
//! FedAdam-like training when the L0 term and pruning are off.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::common;

use fedfuse_core::ModelSpec;
use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{
    BuildContext, ClientsPerRound, MethodConfig, Population, RunResult, ServerOptName, SimConfig,
    SparsityPreset, simulate,
};
use fedfuse_train::{Init, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn fedsparse(
    preset: SparsityPreset,
    lambda0: Option<f64>,
    prune_eps: f64,
    lr: f64,
) -> MethodConfig {
    MethodConfig::FedSparse(fedfuse_fed::FedSparseSettings {
        preset,
        lambda0,
        temperature: 1e-3,
        prune_eps,
        server_lr: lr,
        threshold_server_lr: 1e-2,
        threshold_lr: 1e-3,
        prior_scale: 1e-4,
        drift: 0.0,
        initial_theta: 0.99,
    })
}

fn fedadam(lr: f64) -> MethodConfig {
    MethodConfig::FedOpt(fedfuse_fed::FedOptSettings {
        optimizer: ServerOptName::Adam,
        server_lr: Some(lr),
        beta1: None,
        beta2: Some(0.999),
        tau: Some(1e-8),
        momentum: None,
    })
}

fn build(method: &MethodConfig, spec: &ModelSpec) -> Box<dyn fedfuse_fed::Method> {
    method
        .build_with(BuildContext {
            spec: Some(spec.clone()),
            ..BuildContext::default()
        })
        .unwrap()
}

/// 100 Dirichlet(0.5) MNIST clients, 10 per round, one epoch: the paper's protocol.
fn mnist_run(method: &MethodConfig, rounds: usize) -> RunResult {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let parts = partition(&data.train.y, 10, 100, &common::dirichlet(), &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(784, &[100], 10);
    let cfg = SimConfig {
        rounds,
        clients_per_round: ClientsPerRound::Count(10),
        seed: 3,
        local_eval: false,
        train: common::sgd(0.0, 1),
        ..SimConfig::default()
    };
    simulate(
        build(method, &spec).as_mut(),
        Population::labelled(&Trainer::new(spec.clone()).unwrap(), &clients, &data.test),
        init_params(&spec, Init::Default, 3),
        &cfg,
        &|_| {},
    )
    .unwrap()
}

/// Low and mid presets against FedSparse's own dense training (`lambda0 = 0`, no pruning) on
/// the same 8 rounds of the paper's protocol (one seed; the runs are deterministic). Measured:
///
/// | run   | round 1 | round 8 | groups pruned | weights zero |
/// |-------|---------|---------|---------------|--------------|
/// | dense | 0.167   | 0.651   | 0             | 0            |
/// | low   | 0.167   | 0.618   | 0.06          | 0.06         |
/// | mid   | 0.151   | 0.264   | 0.60          | 0.59         |
///
/// Low keeps up with dense while pruning 6% of the units; mid prunes 60% by round 4 and then
/// learns more slowly (0.654 against dense's 0.761 after 20 rounds), so its bar is absolute.
#[test]
fn presets_prune_units_and_shrink_uploads_while_accuracy_holds() {
    let dense_upload = 10.0 * 4.0 * (784.0 * 100.0 + 100.0 + 100.0 * 10.0 + 10.0);
    let dense = mnist_run(&fedsparse(SparsityPreset::Mid, Some(0.0), 0.0, 1e-3), 8);
    let dense_acc = dense.rounds.last().unwrap().global_accuracy;
    eprintln!("dense: accuracy {dense_acc:.3}");
    let runs: Vec<(SparsityPreset, RunResult)> = [SparsityPreset::Low, SparsityPreset::Mid]
        .into_iter()
        .map(|p| (p, mnist_run(&fedsparse(p, None, 0.1, 1e-3), 8)))
        .collect();
    let mut pruned = Vec::new();
    let mut accuracy = Vec::new();
    for (preset, run) in &runs {
        let last = run.rounds.last().unwrap();
        let m = &last.method;
        eprintln!(
            "{preset:?}: accuracy {:.3}, {:.1}% groups pruned, {:.1}% weights zero, \
             {} B up in the last round ({:.2} of dense), TV {:.4}",
            last.global_accuracy,
            100.0 * m["groups_pruned"],
            100.0 * m["weights_zero"],
            last.bytes_up,
            last.bytes_up as f64 / dense_upload,
            m["tv_mean"]
        );
        assert!(last.rejected.is_empty(), "{:?}", last.rejected);
        // Uploads carry only the groups a client kept: the bytes follow the zeros.
        let expected = dense_upload * (1.0 - m["weights_zero"]);
        assert!(
            (last.bytes_up as f64) < expected + 0.05 * dense_upload,
            "{} B up, {expected:.0} B expected from the sparsity",
            last.bytes_up
        );
        pruned.push(m["groups_pruned"]);
        accuracy.push(last.global_accuracy);
    }
    assert!(
        pruned[0] > 0.03,
        "low pruned only {:.3} of the groups",
        pruned[0]
    );
    assert!(
        pruned[1] > 0.4,
        "mid pruned only {:.3} of the groups",
        pruned[1]
    );
    assert!(
        pruned[1] > pruned[0],
        "mid {:.3} vs low {:.3}",
        pruned[1],
        pruned[0]
    );
    assert!(
        accuracy[0] > dense_acc - 0.05,
        "low {:.3} vs dense {dense_acc:.3}",
        accuracy[0]
    );
    assert!(accuracy[1] > 0.24, "mid reached only {:.3}", accuracy[1]);
}

#[test]
fn without_l0_and_pruning_it_trains_like_fedadam() {
    let d = common::digits(6, &PartitionSpec::Iid {}, 5);
    let spec = ModelSpec::mlp(64, &[64], 10);
    let run = |m: &MethodConfig| {
        common::run(
            build(m, &spec).as_mut(),
            &d,
            &spec,
            10,
            5,
            common::sgd(0.9, 2),
        )
    };
    let dense = run(&fedsparse(SparsityPreset::Mid, Some(0.0), 0.0, 0.02));
    let adam = run(&fedadam(0.02));
    let (s, a) = (dense.rounds.last().unwrap(), adam.rounds.last().unwrap());
    eprintln!(
        "FedSparse (lambda0 0, no pruning) {:.4}, {:.3} groups pruned; FedAdam {:.4}",
        s.global_accuracy, s.method["groups_pruned"], a.global_accuracy
    );
    assert_eq!(s.method["groups_pruned"], 0.0);
    assert!(
        a.global_accuracy > 0.8,
        "FedAdam reached only {}",
        a.global_accuracy
    );
    assert!(
        s.global_accuracy > 0.85 && (s.global_accuracy - a.global_accuracy).abs() < 0.06,
        "FedSparse {} vs FedAdam {}",
        s.global_accuracy,
        a.global_accuracy
    );
}
