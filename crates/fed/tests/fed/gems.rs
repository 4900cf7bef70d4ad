//! GEMS in the federation: MNIST vs pixel-permuted MNIST (gems Table 1) and the
//! no-intersection error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;

use fedfuse_core::ModelSpec;
use fedfuse_data::{ClientData, Dataset, load_dataset, permute_features};
use fedfuse_fed::{
    CriterionKind, Gems, GemsSettings, Method, NeuronCriterionKind, NeuronSpace, Population,
    RunResult, SimConfig, simulate,
};
use fedfuse_train::{Init, TrainConfig, Trainer, init_params};

fn mnist() -> fedfuse_data::TrainTest {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    load_dataset("mnist", Some(Path::new(dir))).unwrap()
}

fn range(ds: &Dataset, from: usize, to: usize) -> Dataset {
    ds.subset(&(from..to).collect::<Vec<_>>())
}

fn train_cfg(epochs: usize) -> TrainConfig {
    common::sgd(0.9, epochs)
}

/// Learner 0 sees MNIST, learner 1 the same task with permuted pixels; the test set is both.
struct Permuted {
    clients: Vec<ClientData>,
    test: Dataset,
}

fn permuted(n: usize, n_test: usize) -> Permuted {
    two_populations(&mnist(), n, n_test)
}

/// Learner 0 sees the first `n` training samples, learner 1 the next `n` with permuted
/// pixels; the test set is `n_test` of each.
fn two_populations(data: &fedfuse_data::TrainTest, n: usize, n_test: usize) -> Permuted {
    let a = range(&data.train, 0, n);
    let b = permute_features(&range(&data.train, n, 2 * n), 1);
    let mut test = range(&data.test, 0, n_test);
    test.extend(&permute_features(&range(&data.test, n_test, 2 * n_test), 1))
        .unwrap();
    let empty = |d: &Dataset| d.subset(&[]);
    Permuted {
        clients: vec![
            ClientData {
                test: empty(&a),
                train: a,
            },
            ClientData {
                test: empty(&b),
                train: b,
            },
        ],
        test,
    }
}

fn run_gems(
    method: &mut dyn Method,
    p: &Permuted,
    spec: &ModelSpec,
    seed: u64,
) -> fedfuse_fed::Result<RunResult> {
    let cfg = SimConfig {
        rounds: 10,
        seed,
        local_eval: false,
        train: train_cfg(5),
        ..SimConfig::default()
    };
    simulate(
        method,
        Population::labelled(&Trainer::new(spec.clone()).unwrap(), &p.clients, &p.test),
        init_params(spec, Init::Default, seed),
        &cfg,
        &|_| {},
    )
}

#[test]
fn deep_gems_beats_each_local_model_on_mnist_and_permuted_mnist() {
    let p = permuted(6000, 1000);
    let spec = ModelSpec::mlp(784, &[50], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let locals: Vec<f64> = p
        .clients
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let start = init_params(&spec, Init::Default, 100 + k as u64);
            let fitted = trainer
                .fit_with(&start, &c.train, &train_cfg(5), None, 7)
                .unwrap();
            trainer.evaluate(&fitted.params, &p.test).unwrap().accuracy
        })
        .collect();
    // The authors' neuron criterion (activation change): a smooth knob on the width.
    let code = GemsSettings {
        criterion: CriterionKind::Loss,
        epsilon: Some(1.0),
        neuron_criterion: NeuronCriterionKind::Activation,
        neuron_epsilon: 0.02,
        samples: 100,
        r_max: 50.0,
        neuron_tol: 0.25,
        ..GemsSettings::default()
    };
    // The paper's (the network's validation loss with one neuron changed): a sharper knob,
    // since one neuron of 50 moves the loss little; 0.27 is just above the learners' own.
    let paper = GemsSettings {
        neuron_criterion: NeuronCriterionKind::Loss,
        neuron_epsilon: 0.27,
        ..code.clone()
    };
    // The paper's neuron space: each neuron's ball also holds its weights into the output
    // layer, which the merged neurons then carry (no output stage).
    let joint = GemsSettings {
        neuron_space: NeuronSpace::IncomingOutgoing,
        neuron_epsilon: 0.03,
        ..code.clone()
    };
    for (name, settings, min_gain) in [
        ("code", code, 0.2),
        ("paper", paper, 0.1),
        ("joint", joint, 0.2),
    ] {
        let mut gems = Gems::new(settings, spec.clone(), Init::Default, 3, None).unwrap();
        let result = run_gems(&mut gems, &p, &spec, 3).unwrap();
        let last = result.rounds.last().unwrap();
        eprintln!(
            "{name}: locals {locals:?}; GEMS {:.3} (loss {:.3}); {:?} {:?}",
            last.global_accuracy, last.global_loss, result.rounds[0].method, last.method
        );
        // Measured: code 0.845 at width 68 (the paper's Table 1: GEMS 0.83 at 68 units, its
        // averaged model 0.66); paper 0.676 at width 52 after one output retry; joint 0.778
        // at width 70 in one stage; local models 0.51.
        // One hidden layer, then the output layer (again after each retry); in the joint
        // space the hidden layer completes the model.
        let stages = if name == "joint" {
            1
        } else {
            1 + last.method["attempts"] as usize
        };
        assert_eq!(result.rounds.len(), stages, "{name}");
        let width = ModelSpec::infer_mlp(&result.params)
            .unwrap()
            .mlp_widths()
            .unwrap()[1];
        assert!(
            width > 50 && width < 100,
            "{name}: fused width {width}: some neurons merge, not all"
        );
        for acc in &locals {
            assert!(
                last.global_accuracy > acc + min_gain,
                "{name}: GEMS {} vs local {acc}",
                last.global_accuracy
            );
        }
    }
}

#[test]
fn balls_that_cannot_meet_end_the_run_with_advice_after_the_retries() {
    let p = permuted(1000, 200);
    let spec = ModelSpec::mlp(784, &[], 10);
    let settings = GemsSettings {
        epsilon: Some(1e-4), // no learner's own model reaches it: every ball is a point
        samples: 20,
        max_retries: 1,
        ..GemsSettings::default()
    };
    let mut gems = Gems::new(settings, spec.clone(), Init::Default, 1, None).unwrap();
    let err = run_gems(&mut gems, &p, &spec, 1).expect_err("no common point");
    assert!(err.to_string().contains("raise epsilon"), "{err}");
}

/// Digits against pixel-permuted digits, as [`permuted`] does for MNIST.
fn permuted_digits() -> Permuted {
    let data = load_dataset("digits", None).unwrap();
    let (n, n_test) = (data.train.len() / 2, data.test.len() / 2);
    two_populations(&data, n, n_test)
}

#[test]
fn the_automatic_epsilon_fuses_mnist_and_digits_with_the_same_settings() {
    // No epsilon: each learner sends radii at 1.1-20 times its own validation loss and the
    // server takes the tightest scale at which the regions meet.
    let auto = GemsSettings {
        neuron_criterion: NeuronCriterionKind::Activation,
        neuron_epsilon: 0.02,
        samples: 100,
        r_max: 50.0,
        neuron_tol: 0.25,
        ..GemsSettings::default()
    };
    for (name, p, spec) in [
        (
            "mnist",
            permuted(6000, 1000),
            ModelSpec::mlp(784, &[50], 10),
        ),
        ("digits", permuted_digits(), ModelSpec::mlp(64, &[32], 10)),
    ] {
        let trainer = Trainer::new(spec.clone()).unwrap();
        let locals: Vec<f64> = p
            .clients
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let start = init_params(&spec, Init::Default, 100 + k as u64);
                let fitted = trainer
                    .fit_with(&start, &c.train, &train_cfg(5), None, 7)
                    .unwrap();
                trainer.evaluate(&fitted.params, &p.test).unwrap().accuracy
            })
            .collect();
        let mut gems = Gems::new(auto.clone(), spec.clone(), Init::Default, 3, None).unwrap();
        let result = run_gems(&mut gems, &p, &spec, 3).unwrap();
        let last = result.rounds.last().unwrap();
        eprintln!(
            "{name}: locals {locals:?}; GEMS {:.3}; {:?}",
            last.global_accuracy, last.method
        );
        assert_eq!(last.method["intersected"], 1.0, "{name}");
        let scale = last.method["epsilon_scale"];
        assert!(auto.epsilon_scales.contains(&scale), "{name}: {scale}");
        // Measured: MNIST 0.843 at scale 5 (locals 0.51), digits 0.654 at scale 10 (locals
        // 0.48-0.51).
        for acc in &locals {
            assert!(
                last.global_accuracy > acc + 0.1,
                "{name}: GEMS {} vs local {acc}",
                last.global_accuracy
            );
        }
    }
    // The fixed threshold that fuses MNIST (the deep test's epsilon = 1) finds no common point
    // on digits: what the automatic one is for.
    let fixed = GemsSettings {
        epsilon: Some(1.0),
        ..auto
    };
    let (p, spec) = (permuted_digits(), ModelSpec::mlp(64, &[32], 10));
    let mut gems = Gems::new(fixed, spec.clone(), Init::Default, 3, None).unwrap();
    let err = run_gems(&mut gems, &p, &spec, 3).expect_err("no common point on digits");
    assert!(err.to_string().contains("raise epsilon"), "{err}");
}
