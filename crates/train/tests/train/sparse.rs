//! The hard-concrete gates, FedSparse and FedL1 local training (the groups themselves are
//! fedfuse-core's, tested there).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::groups::softplus;
use fedfuse_core::{CoreError, GroupLayout, ModelSpec, Params};
use fedfuse_data::load_dataset;
use fedfuse_train::{
    Init, OptimizerConfig, SparseConfig, TrainConfig, TrainError, Trainer, hard_concrete,
    init_params,
};
use rand::SeedableRng;
use rand::distr::{Distribution, StandardUniform};
use rand::rngs::StdRng;

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
fn sparse_config_errors_name_the_field() {
    let cases = [
        (
            SparseConfig {
                lambda0: -1.0,
                ..SparseConfig::default()
            },
            "lambda0",
        ),
        (
            SparseConfig {
                temperature: 0.0,
                ..SparseConfig::default()
            },
            "temperature",
        ),
        (
            SparseConfig {
                drift: f64::NAN,
                ..SparseConfig::default()
            },
            "drift",
        ),
        (
            SparseConfig {
                threshold_lr: 0.0,
                ..SparseConfig::default()
            },
            "threshold_lr",
        ),
        (
            SparseConfig {
                prior_scale: -1e-4,
                ..SparseConfig::default()
            },
            "prior_scale",
        ),
        (
            SparseConfig {
                initial_theta: 1.0,
                ..SparseConfig::default()
            },
            "initial_theta",
        ),
    ];
    for (cfg, field) in cases {
        let err = cfg.check().unwrap_err();
        assert!(
            matches!(&err, TrainError::InvalidConfig { field: f, .. } if *f == field),
            "{err}"
        );
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
        dropout: 0.0,
    }
}

#[test]
fn fit_sparse_rejects_thresholds_of_another_model() {
    let spec = ModelSpec::mlp(64, &[32], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 1);
    let data = load_dataset("digits", None).unwrap().train;
    let cfg = SparseConfig::default();
    for v in [vec![0.1; 31], vec![0.1; 42], vec![f32::NAN; 32]] {
        let err = trainer
            .fit_sparse(&start, &v, &data, &sgd(1), &cfg, 0)
            .unwrap_err();
        assert!(
            matches!(err, TrainError::Core(CoreError::GroupMismatch(_))),
            "{err}"
        );
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
    let v = trainer
        .groups()
        .initial_thresholds(&start, sparse.initial_theta, sparse.temperature)
        .unwrap();
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
    assert!(fit.pi.iter().filter(|&&p| p > 0.9).count() as f64 >= 0.85 * total as f64);
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
    let v = trainer
        .groups()
        .initial_thresholds(&start, sparse.initial_theta, sparse.temperature)
        .unwrap();
    let fit = trainer
        .fit_sparse(&start, &v, &data.train, &sgd(5), &sparse, 9)
        .unwrap();
    let acc = trainer.evaluate(&fit.params, &data.test).unwrap().accuracy;
    let (kept, total) = fit.kept();
    eprintln!("fedsparse(lambda0 = 1e-2): accuracy {acc:.4}, kept {kept}/{total}");
    assert!(kept as f64 <= 0.8 * total as f64, "kept {kept} of {total}");
    assert!(acc > 0.8, "accuracy {acc}");
    // Thresholds moved up: the L0 term pushes pi down.
    let tau = |v: f32| softplus(f64::from(v));
    let raised = fit
        .v
        .iter()
        .zip(&v)
        .filter(|(a, b)| tau(**a) > tau(**b))
        .count();
    assert!(raised > total / 2, "{raised} thresholds raised");
    // Groups with z = 0 are exactly zero, the others are not.
    let w = &fit.params.get("layers.0.weight").unwrap().data;
    let b = &fit.params.get("layers.0.bias").unwrap().data;
    for (u, &z) in fit.z.iter().enumerate() {
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
    for (&z, &pi) in fit.z.iter().zip(&fit.pi) {
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
    let groups = GroupLayout::of_model(&spec);
    let small = |p: &Params| {
        groups
            .norms(p)
            .unwrap()
            .iter()
            .filter(|&&n| n < 0.02)
            .count()
    };
    let (before, free) = (small(&fit.params), small(&plain.params));
    eprintln!("group l1 {l1}: {before}/32 groups below 0.02 (none without: {free})");
    assert_eq!(free, 0);
    assert!(before >= 8, "{before} groups near zero");
    let mut sparse = fit.params.clone();
    let zeroed = groups.soft_threshold(&mut sparse, 0.02).unwrap();
    assert_eq!(zeroed, before);
    let norms = groups.norms(&sparse).unwrap();
    assert_eq!(norms.iter().filter(|&&n| n == 0.0).count(), before);
    let acc = trainer.evaluate(&sparse, &data.test).unwrap().accuracy;
    eprintln!("group l1 accuracy after thresholding {acc:.4}");
    assert!(acc > 0.85, "accuracy {acc}");
    let err = trainer
        .fit_group_l1(&start, &data.train, &cfg, -1.0, 3)
        .unwrap_err();
    assert!(
        matches!(err, TrainError::InvalidConfig { field: "l1", .. }),
        "{err}"
    );
}
