//! FedOpt server optimizers in the federation, on the bundled digits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::common;

use fedfuse_core::ModelSpec;
use fedfuse_fed::{MethodConfig, RunResult, ServerOptName};

fn run(method: &MethodConfig, rounds: usize) -> RunResult {
    let d = common::digits(8, &common::dirichlet(), 4);
    let spec = ModelSpec::mlp(64, &[32], 10);
    let mut m = method.build().unwrap();
    common::run(m.as_mut(), &d, &spec, rounds, 4, common::sgd(0.0, 1))
}

fn fedopt(optimizer: ServerOptName, server_lr: Option<f64>, momentum: Option<f64>) -> MethodConfig {
    MethodConfig::FedOpt(fedfuse_fed::FedOptSettings {
        optimizer,
        server_lr,
        beta1: None,
        beta2: None,
        tau: None,
        momentum,
    })
}

#[test]
fn sgd_with_unit_rate_is_fedavg() {
    let avg = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
        3,
    );
    let sgd = run(&fedopt(ServerOptName::Sgd, None, None), 3);
    assert_eq!(sgd.params, avg.params);
}

#[test]
fn server_momentum_and_adam_speed_up_early_rounds() {
    let rounds = 8;
    let avg = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
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
    let bad = MethodConfig::FedOpt(fedfuse_fed::FedOptSettings {
        optimizer: ServerOptName::Adagrad,
        server_lr: None,
        beta1: Some(0.9),
        beta2: None,
        tau: None,
        momentum: None,
    });
    let err = bad.build().err().unwrap().to_string();
    assert!(err.contains("method.beta1"), "{err}");
    let err = fedopt(ServerOptName::Adam, Some(-1.0), None)
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("lr"), "{err}");
}

fn stepped(
    method: &MethodConfig,
    optimizer: ServerOptName,
    lr: Option<f64>,
    rounds: usize,
) -> RunResult {
    let d = common::digits(8, &common::dirichlet(), 4);
    let spec = ModelSpec::mlp(64, &[32], 10);
    let server = fedfuse_fed::ServerStepConfig {
        optimizer,
        lr,
        beta1: None,
        beta2: None,
        tau: None,
        momentum: None,
    };
    let inner = method
        .build_with(fedfuse_fed::BuildContext {
            spec: Some(spec.clone()),
            seed: 4,
            ..Default::default()
        })
        .unwrap();
    server.check_for(method).unwrap();
    let mut m = server.wrap(inner).unwrap();
    common::run(m.as_mut(), &d, &spec, rounds, 4, common::sgd(0.0, 1))
}

#[test]
fn a_server_step_on_any_method_is_fedopt_on_fedavg_and_identity_at_unit_sgd() {
    let avg = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
        separate_inits: false,
    });
    // FedAvg + a Kingma-Adam step is FedOpt with that optimizer.
    let adam = stepped(&avg, ServerOptName::KingmaAdam, Some(0.01), 3);
    let fedopt_adam = run(&fedopt(ServerOptName::KingmaAdam, Some(0.01), None), 3);
    assert_eq!(adam.params, fedopt_adam.params);
    // SGD at rate 1 leaves FedDrop's aggregate as it is.
    let drop = MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.25 });
    let plain = {
        let d = common::digits(8, &common::dirichlet(), 4);
        let spec = ModelSpec::mlp(64, &[32], 10);
        let mut m = drop
            .build_with(fedfuse_fed::BuildContext {
                spec: Some(spec.clone()),
                seed: 4,
                ..Default::default()
            })
            .unwrap();
        common::run(m.as_mut(), &d, &spec, 2, 4, common::sgd(0.0, 1))
    };
    assert_eq!(
        stepped(&drop, ServerOptName::Sgd, None, 2).params,
        plain.params
    );
    assert_ne!(
        stepped(&drop, ServerOptName::KingmaAdam, None, 2).params,
        plain.params
    );
    // Methods with their own server step refuse another one.
    let server = fedfuse_fed::ServerStepConfig {
        optimizer: ServerOptName::Adam,
        lr: None,
        beta1: None,
        beta2: None,
        tau: None,
        momentum: None,
    };
    let own = fedopt(ServerOptName::Adam, None, None);
    assert!(server.check_for(&own).is_err());
}
