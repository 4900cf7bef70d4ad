//! FedOpt server optimizers in the federation, on the bundled digits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::ModelSpec;
use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{BuildContext, MethodConfig, RunResult, ServerOptName, SimConfig, simulate};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn run(method: &MethodConfig, rounds: usize) -> RunResult {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(4);
    let split = PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 10,
        self_balancing: true,
    };
    let parts = partition(&data.train.y, 10, 8, &split, &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let mut m = method.build_with(BuildContext::default()).unwrap();
    let cfg = SimConfig {
        rounds,
        seed: 4,
        local_eval: false,
        train: TrainConfig {
            optimizer: OptimizerConfig::Sgd {
                momentum: 0.0,
                weight_decay: 0.0,
            },
            lr: 0.05,
            epochs: 1,
            batch_size: 32,
        },
        ..SimConfig::default()
    };
    simulate(
        m.as_mut(),
        &Trainer::new(spec.clone()).unwrap(),
        &clients,
        &data.test,
        init_params(&spec, Init::Default, 2),
        &cfg,
        &|_| {},
    )
    .unwrap()
}

fn fedopt(optimizer: ServerOptName, server_lr: Option<f64>, momentum: Option<f64>) -> MethodConfig {
    MethodConfig::FedOpt {
        optimizer,
        server_lr,
        beta1: None,
        beta2: None,
        tau: None,
        momentum,
    }
}

#[test]
fn sgd_with_unit_rate_is_fedavg() {
    let avg = run(
        &MethodConfig::FedAvg {
            separate_inits: false,
        },
        3,
    );
    let sgd = run(&fedopt(ServerOptName::Sgd, None, None), 3);
    assert_eq!(sgd.params, avg.params);
}

#[test]
fn server_momentum_and_adam_speed_up_early_rounds() {
    let rounds = 8;
    let avg = run(
        &MethodConfig::FedAvg {
            separate_inits: false,
        },
        rounds,
    );
    let avgm = run(&fedopt(ServerOptName::Sgd, Some(1.0), Some(0.9)), rounds);
    let adam = run(&fedopt(ServerOptName::Adam, Some(0.01), None), rounds);
    let acc = |r: &RunResult| -> Vec<f64> { r.rounds.iter().map(|m| m.global_accuracy).collect() };
    eprintln!(
        "FedAvg  {:?}\nFedAvgM {:?}\nFedAdam {:?}",
        acc(&avg),
        acc(&avgm),
        acc(&adam)
    );
    // The server step matters: the runs differ, and the adaptive ones learn.
    assert_ne!(adam.params, avg.params);
    assert_ne!(avgm.params, avg.params);
    // With slow local SGD, server momentum and Adam get much further in the same rounds.
    let base = avg.rounds[rounds - 1].global_accuracy;
    for (name, r) in [("FedAvgM", &avgm), ("FedAdam", &adam)] {
        let last = r.rounds[rounds - 1].global_accuracy;
        assert!(
            last > base + 0.15,
            "{name} after {rounds} rounds: {last} vs FedAvg {base}"
        );
    }
}

#[test]
fn settings_an_optimizer_lacks_are_named() {
    let bad = MethodConfig::FedOpt {
        optimizer: ServerOptName::Adagrad,
        server_lr: None,
        beta1: Some(0.9),
        beta2: None,
        tau: None,
        momentum: None,
    };
    let err = bad.build().err().unwrap().to_string();
    assert!(err.contains("method.beta1"), "{err}");
    let err = fedopt(ServerOptName::Adam, Some(-1.0), None)
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("lr"), "{err}");
}
