//! Parameter groups, the hard-concrete gates, FedSparse and FedL1 local training.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::load_dataset;
use fedfuse_train::{
    GroupLayout, Init, OptimizerConfig, SparseConfig, TrainConfig, TrainError, Trainer,
    gate_probabilities, group_norms, groups, hard_concrete, hard_threshold_groups, init_params,
    initial_thresholds, mask_groups, soft_threshold_groups,
};
use rand::SeedableRng;
use rand::distr::{Distribution, StandardUniform};
use rand::rngs::StdRng;

fn layout(weight: &str, bias: &str, units: usize, fan_in: usize) -> GroupLayout {
    GroupLayout {
        weight: weight.into(),
        bias: bias.into(),
        units,
        fan_in,
    }
}

#[test]
fn groups_are_hidden_units_and_filters() {
    let mlp = groups(&ModelSpec::mlp(64, &[32, 16], 10));
    assert_eq!(
        mlp,
        vec![
            layout("layers.0.weight", "layers.0.bias", 32, 64),
            layout("layers.1.weight", "layers.1.bias", 16, 32),
        ]
    );
    assert_eq!(mlp[0].size(), 65);
    let lenet = groups(&ModelSpec::LeNet5 {
        channels: 3,
        side: 32,
        classes: 10,
    });
    assert_eq!(
        lenet,
        vec![
            layout("conv1.weight", "conv1.bias", 6, 3 * 25),
            layout("conv2.weight", "conv2.bias", 16, 6 * 25),
            layout("fc1.weight", "fc1.bias", 120, 400),
            layout("fc2.weight", "fc2.bias", 84, 120),
        ]
    );
    assert_eq!(lenet[1].size(), 151);
    // Logistic regression: only an output layer, nothing to gate.
    assert!(groups(&ModelSpec::mlp(4, &[], 3)).is_empty());
}

/// 2 -> 2 -> 2 with hidden rows (3, 0 | bias 4) and (0, 0 | bias 0): group norms 5 and 0.
fn hand_mlp() -> (ModelSpec, Params) {
    let mut p = Params::new();
    p.push("layers.0.weight", vec![2, 2], vec![3.0, 0.0, 0.0, 0.0])
        .unwrap();
    p.push("layers.0.bias", vec![2], vec![4.0, 0.0]).unwrap();
    p.push("layers.1.weight", vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])
        .unwrap();
    p.push("layers.1.bias", vec![2], vec![0.5, 0.5]).unwrap();
    (ModelSpec::mlp(2, &[2], 2), p)
}

#[test]
fn group_norms_by_hand() {
    let (spec, p) = hand_mlp();
    assert_eq!(group_norms(&spec, &p).unwrap(), vec![vec![5.0, 0.0]]);

    // LeNet-5 on one channel: filter 1 of conv1 all 0.5 with bias 1 (25 * 0.25 + 1 = 7.25),
    // unit 2 of fc2 a single 2 (norm 2); everything else zero.
    let spec = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let mut p = Params::zeros(&spec.param_shapes());
    p.get_mut("conv1.weight").unwrap().data[25..50].fill(0.5);
    p.get_mut("conv1.bias").unwrap().data[1] = 1.0;
    p.get_mut("fc2.weight").unwrap().data[2 * 120 + 7] = 2.0;
    p.get_mut("fc3.weight").unwrap().data.fill(9.0); // not a group
    let norms = group_norms(&spec, &p).unwrap();
    assert_eq!(
        norms.iter().map(Vec::len).collect::<Vec<_>>(),
        [6, 16, 120, 84]
    );
    assert!((norms[0][1] - 7.25f32.sqrt()).abs() < 1e-6);
    assert_eq!(norms[3][2], 2.0);
    let nonzero = norms.iter().flatten().filter(|&&n| n != 0.0).count();
    assert_eq!(nonzero, 2);
    // A layout that is not the spec's is an error.
    let (_, mlp) = hand_mlp();
    assert!(group_norms(&spec, &mlp).is_err());
}

#[test]
fn thresholding_and_masking_by_hand() {
    let (spec, p) = hand_mlp();
    let output = (
        p.get("layers.1.weight").unwrap().clone(),
        p.get("layers.1.bias").unwrap().clone(),
    );

    // Soft: the norm-5 group shrinks by 1 - 1/5, the zero group stays zero.
    let mut soft = p.clone();
    assert_eq!(soft_threshold_groups(&spec, &mut soft, 1.0).unwrap(), 1);
    assert_eq!(
        soft.get("layers.0.weight").unwrap().data,
        [2.4, 0.0, 0.0, 0.0]
    );
    assert_eq!(soft.get("layers.0.bias").unwrap().data, [3.2, 0.0]);
    assert_eq!(group_norms(&spec, &soft).unwrap()[0][0], 4.0);
    // The output layer is not a group.
    assert_eq!(soft.get("layers.1.weight").unwrap(), &output.0);
    assert_eq!(soft.get("layers.1.bias").unwrap(), &output.1);
    // A threshold at the norm zeroes the group exactly.
    let mut gone = p.clone();
    assert_eq!(soft_threshold_groups(&spec, &mut gone, 5.0).unwrap(), 2);
    assert!(
        gone.get("layers.0.weight")
            .unwrap()
            .data
            .iter()
            .all(|&v| v == 0.0)
    );
    assert!(
        gone.get("layers.0.bias")
            .unwrap()
            .data
            .iter()
            .all(|&v| v == 0.0)
    );

    // Hard: kept groups are not shrunk.
    let mut hard = p.clone();
    assert_eq!(hard_threshold_groups(&spec, &mut hard, 4.9).unwrap(), 1);
    assert_eq!(hard, p);
    assert_eq!(hard_threshold_groups(&spec, &mut hard, 5.0).unwrap(), 2);
    assert_eq!(hard.get("layers.0.bias").unwrap().data, [0.0, 0.0]);

    let mut masked = p.clone();
    mask_groups(&spec, &mut masked, &[vec![false, true]]).unwrap();
    assert_eq!(masked.get("layers.0.weight").unwrap().data, [0.0; 4]);
    assert_eq!(masked.get("layers.0.bias").unwrap().data, [0.0; 2]);
    assert_eq!(masked.get("layers.1.weight").unwrap(), &output.0);

    assert!(matches!(
        mask_groups(&spec, &mut masked, &[vec![true]]),
        Err(TrainError::GroupMismatch(_))
    ));
    let err = soft_threshold_groups(&spec, &mut masked, -1.0).unwrap_err();
    assert!(matches!(err, TrainError::InvalidConfig { .. }), "{err}");
}

#[test]
fn hard_concrete_is_on_with_probability_pi() {
    let mut rng = StdRng::seed_from_u64(3);
    let n = 200_000;
    for pi in [0.02f64, 0.3, 0.5, 0.9, 0.99] {
        let logit = (pi / (1.0 - pi)).ln();
        let la = hard_concrete::log_alpha(logit);
        assert!((hard_concrete::prob_nonzero(la) - pi).abs() < 1e-12);
        let (mut on, mut one, mut hard) = (0usize, 0usize, 0usize);
        for _ in 0..n {
            let z = hard_concrete::sample(la, StandardUniform.sample(&mut rng));
            assert!((0.0..=1.0).contains(&z));
            on += usize::from(z > 0.0);
            one += usize::from(z == 1.0);
            hard += usize::from(hard_concrete::sample_hard(
                logit,
                StandardUniform.sample(&mut rng),
            ));
        }
        let (on, hard) = (on as f64 / n as f64, hard as f64 / n as f64);
        assert!((on - pi).abs() < 0.01, "pi {pi}: P(z > 0) = {on}");
        assert!(
            (hard - pi).abs() < 0.01,
            "pi {pi}: zero-temperature mean {hard}"
        );
        // The stretch puts real mass on exactly 1 (and on exactly 0): a hard-concrete, not a
        // plain concrete.
        assert!(one > 0 && one < n, "pi {pi}: {one} gates at exactly 1");
    }
}

#[test]
fn initial_thresholds_give_theta0() {
    let spec = ModelSpec::mlp(64, &[32], 10);
    let mut p = init_params(&spec, Init::Default, 4);
    // One dead unit: no threshold can make it 0.99-likely; it gets the smallest threshold.
    p.get_mut("layers.0.weight").unwrap().data[..64].fill(0.0);
    p.get_mut("layers.0.bias").unwrap().data[0] = 0.0;
    let cfg = SparseConfig::default();
    let v = cfg.initial_thresholds(&spec, &p).unwrap();
    let theta = gate_probabilities(&spec, &p, &v, cfg.temperature).unwrap();
    assert_eq!(theta.len(), 1);
    assert!(theta[0][0] < 0.5, "dead unit theta {}", theta[0][0]);
    for &t in &theta[0][1..] {
        assert!((t - 0.99).abs() < 2e-3, "theta {t}");
    }
    let v = initial_thresholds(&spec, &p, 0.5, 0.1).unwrap();
    let theta = gate_probabilities(&spec, &p, &v, 0.1).unwrap();
    assert!(theta[0][1..].iter().all(|t| (t - 0.5).abs() < 1e-4));
    assert!(initial_thresholds(&spec, &p, 1.0, 0.1).is_err());
}

#[test]
fn sparse_config_errors_name_the_field() {
    let cases = [
        (
            SparseConfig {
                lambda0: -1.0,
                ..SparseConfig::default()
            },
            "method.lambda0",
        ),
        (
            SparseConfig {
                temperature: 0.0,
                ..SparseConfig::default()
            },
            "method.temperature",
        ),
        (
            SparseConfig {
                drift: f64::NAN,
                ..SparseConfig::default()
            },
            "method.drift",
        ),
        (
            SparseConfig {
                threshold_lr: 0.0,
                ..SparseConfig::default()
            },
            "method.threshold_lr",
        ),
        (
            SparseConfig {
                prior_scale: -1e-4,
                ..SparseConfig::default()
            },
            "method.prior_scale",
        ),
        (
            SparseConfig {
                initial_theta: 1.0,
                ..SparseConfig::default()
            },
            "method.initial_theta",
        ),
    ];
    for (cfg, field) in cases {
        let err = cfg.check().unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
    SparseConfig::default().check().unwrap();
}

fn sgd(epochs: usize) -> TrainConfig {
    TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs,
        batch_size: 32,
    }
}

#[test]
fn fit_sparse_rejects_thresholds_of_another_model() {
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 1);
    let data = load_dataset("digits", None).unwrap().train;
    let cfg = SparseConfig::default();
    for v in [
        vec![vec![0.1; 31]],
        vec![vec![0.1; 32], vec![0.1; 10]],
        vec![vec![f32::NAN; 32]],
    ] {
        let err = trainer
            .fit_sparse(&start, &v, &data, &sgd(1), &cfg, 0)
            .unwrap_err();
        assert!(matches!(err, TrainError::GroupMismatch(_)), "{err}");
    }
}

#[test]
fn fedsparse_without_l0_trains_like_dense_and_keeps_units() {
    let data = load_dataset("digits", None).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    let cfg = sgd(5);
    let dense = trainer
        .fit_with(&start, &data.train, &cfg, None, 9)
        .unwrap();
    let dense_acc = trainer
        .evaluate(&dense.params, &data.test)
        .unwrap()
        .accuracy;

    let sparse = SparseConfig {
        lambda0: 0.0,
        ..SparseConfig::default()
    };
    let v = sparse.initial_thresholds(&spec, &start).unwrap();
    let fit = trainer
        .fit_sparse(&start, &v, &data.train, &cfg, &sparse, 9)
        .unwrap();
    let acc = trainer.evaluate(&fit.params, &data.test).unwrap().accuracy;
    let (kept, total) = fit.kept();
    eprintln!("dense {dense_acc:.4}, fedsparse(lambda0 = 0) {acc:.4}, kept {kept}/{total}");
    assert!(
        acc > dense_acc - 0.05,
        "fedsparse {acc} vs dense {dense_acc}"
    );
    // "Almost nothing": the gate probabilities follow the weight norms at T = 1e-3, so a unit
    // whose norm dips by a few T early in training is switched off even without the L0 term
    // (here 2 of 32; compare 14 of 32 with lambda0 = 1e-2 below).
    assert!(kept as f64 >= 0.85 * total as f64, "kept {kept} of {total}");
    assert!(fit.pi[0].iter().filter(|&&p| p > 0.9).count() as f64 >= 0.85 * total as f64);
    assert_eq!((fit.examples, fit.steps), (data.train.len(), dense.steps));
    // Same seed, same result.
    let again = trainer
        .fit_sparse(&start, &v, &data.train, &cfg, &sparse, 9)
        .unwrap();
    assert_eq!(again.params, fit.params);
    assert_eq!(again.v, fit.v);
}

#[test]
fn fedsparse_with_strong_l0_prunes_units() {
    let data = load_dataset("digits", None).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    let sparse = SparseConfig {
        lambda0: 1e-2,
        ..SparseConfig::default()
    };
    let v = sparse.initial_thresholds(&spec, &start).unwrap();
    let fit = trainer
        .fit_sparse(&start, &v, &data.train, &sgd(5), &sparse, 9)
        .unwrap();
    let acc = trainer.evaluate(&fit.params, &data.test).unwrap().accuracy;
    let (kept, total) = fit.kept();
    eprintln!("fedsparse(lambda0 = 1e-2): accuracy {acc:.4}, kept {kept}/{total}");
    assert!(kept as f64 <= 0.8 * total as f64, "kept {kept} of {total}");
    assert!(acc > 0.8, "accuracy {acc}");
    // Thresholds moved up: the L0 term pushes pi down.
    let tau = |v: f32| fedfuse_train::softplus_f64(f64::from(v));
    let raised = fit.v[0]
        .iter()
        .zip(&v[0])
        .filter(|(a, b)| tau(**a) > tau(**b))
        .count();
    assert!(raised > total / 2, "{raised} thresholds raised");
    // Groups with z = 0 are exactly zero, the others are not.
    let w = &fit.params.get("layers.0.weight").unwrap().data;
    let b = &fit.params.get("layers.0.bias").unwrap().data;
    for (u, &z) in fit.z[0].iter().enumerate() {
        let row = &w[u * 64..(u + 1) * 64];
        if z {
            assert!(row.iter().any(|&x| x != 0.0), "unit {u} kept but zero");
        } else {
            // +0.0 exactly, not -0.0: sparse encoders see plain zeros.
            assert!(
                row.iter().all(|&x| x.to_bits() == 0) && b[u].to_bits() == 0,
                "unit {u} not zeroed"
            );
        }
    }
    // The pruned units are the improbable ones.
    for (&z, &pi) in fit.z[0].iter().zip(&fit.pi[0]) {
        if !z {
            assert!(pi < 0.5, "pruned a unit with pi {pi}");
        }
    }
    // The output layer is never gated.
    assert!(
        fit.params
            .get("layers.1.bias")
            .unwrap()
            .data
            .iter()
            .any(|&x| x != 0.0)
    );
}

#[test]
fn group_l1_drives_groups_to_zero() {
    let data = load_dataset("digits", None).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    let cfg = sgd(8);
    let plain = trainer
        .fit_group_l1(&start, &data.train, &cfg, 0.0, 3)
        .unwrap();
    let same = trainer
        .fit_with(&start, &data.train, &cfg, None, 3)
        .unwrap();
    assert_eq!(plain.params, same.params, "l1 = 0 must be plain training");
    let l1 = 0.02;
    let fit = trainer
        .fit_group_l1(&start, &data.train, &cfg, l1, 3)
        .unwrap();
    let small = |p: &Params| {
        group_norms(&spec, p).unwrap()[0]
            .iter()
            .filter(|&&n| n < 0.02)
            .count()
    };
    let (before, free) = (small(&fit.params), small(&plain.params));
    eprintln!("group l1 {l1}: {before}/32 groups below 0.02 (none without: {free})");
    assert_eq!(free, 0);
    assert!(before >= 8, "{before} groups near zero");
    let mut sparse = fit.params.clone();
    let zeroed = soft_threshold_groups(&spec, &mut sparse, 0.02).unwrap();
    assert_eq!(zeroed, before);
    let norms = group_norms(&spec, &sparse).unwrap();
    assert_eq!(norms[0].iter().filter(|&&n| n == 0.0).count(), before);
    let acc = trainer.evaluate(&sparse, &data.test).unwrap().accuracy;
    eprintln!("group l1 accuracy after thresholding {acc:.4}");
    assert!(acc > 0.85, "accuracy {acc}");
    let err = trainer
        .fit_group_l1(&start, &data.train, &cfg, -1.0, 3)
        .unwrap_err();
    assert!(err.to_string().contains("method.l1"), "{err}");
}
