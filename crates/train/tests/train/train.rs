//! The trainer against a hand-written reference, and on real data.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::{Dataset, load_dataset};
use fedfuse_train::{Init, MixturePrior, OptimizerConfig, TrainConfig, Trainer, init_params};

/// Hand-written one-hidden-layer MLP (ReLU, softmax cross-entropy averaged over the batch):
/// loss and gradients on plain slices, in f64. PyTorch layout: w1 [h, d], w2 [k, h].
struct Reference<'a> {
    d: usize,
    h: usize,
    k: usize,
    x: &'a [f32],
    y: &'a [u32],
}

impl Reference<'_> {
    fn loss_and_grad(&self, p: &[Vec<f64>; 4]) -> (f64, [Vec<f64>; 4]) {
        let [w1, b1, w2, b2] = p;
        let n = self.y.len();
        let mut g = [
            vec![0.0; w1.len()],
            vec![0.0; b1.len()],
            vec![0.0; w2.len()],
            vec![0.0; b2.len()],
        ];
        let mut loss = 0.0;
        for s in 0..n {
            let xs = &self.x[s * self.d..(s + 1) * self.d];
            let pre: Vec<f64> = (0..self.h)
                .map(|j| {
                    b1[j]
                        + (0..self.d)
                            .map(|i| w1[j * self.d + i] * f64::from(xs[i]))
                            .sum::<f64>()
                })
                .collect();
            let act: Vec<f64> = pre.iter().map(|v| v.max(0.0)).collect();
            let logits: Vec<f64> = (0..self.k)
                .map(|c| {
                    b2[c]
                        + (0..self.h)
                            .map(|j| w2[c * self.h + j] * act[j])
                            .sum::<f64>()
                })
                .collect();
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
            let label = self.y[s] as usize;
            loss += m + z.ln() - logits[label];
            let dlogit: Vec<f64> = (0..self.k)
                .map(|c| ((logits[c] - m).exp() / z - f64::from(u8::from(c == label))) / n as f64)
                .collect();
            for c in 0..self.k {
                g[3][c] += dlogit[c];
                for j in 0..self.h {
                    g[2][c * self.h + j] += dlogit[c] * act[j];
                }
            }
            for j in 0..self.h {
                if pre[j] <= 0.0 {
                    continue;
                }
                let da: f64 = (0..self.k).map(|c| dlogit[c] * w2[c * self.h + j]).sum();
                g[1][j] += da;
                for i in 0..self.d {
                    g[0][j * self.d + i] += da * f64::from(xs[i]);
                }
            }
        }
        (loss / n as f64, g)
    }
}

fn as_f64(p: &Params) -> [Vec<f64>; 4] {
    let v = |i: usize| {
        p.tensor_at(i)
            .unwrap()
            .data
            .iter()
            .map(|x| f64::from(*x))
            .collect()
    };
    [v(0), v(1), v(2), v(3)]
}

fn tiny_data() -> Dataset {
    let digits = load_dataset("digits", None).unwrap().train;
    digits.subset(&(0..40).collect::<Vec<_>>())
}

#[test]
fn reference_gradient_is_right() {
    let data = tiny_data();
    let spec = ModelSpec::mlp(64, &[8], 10);
    let p = as_f64(&init_params(&spec, Init::Default, 1));
    let r = Reference {
        d: 64,
        h: 8,
        k: 10,
        x: &data.x,
        y: &data.y,
    };
    let (_, g) = r.loss_and_grad(&p);
    for (t, idx) in [(0usize, 70usize), (1, 3), (2, 17), (3, 4)] {
        let eps = 1e-6;
        let mut plus = p.clone();
        plus[t][idx] += eps;
        let mut minus = p.clone();
        minus[t][idx] -= eps;
        let fd = (r.loss_and_grad(&plus).0 - r.loss_and_grad(&minus).0) / (2.0 * eps);
        assert!(
            (fd - g[t][idx]).abs() < 1e-6,
            "tensor {t}[{idx}]: fd {fd} vs {}",
            g[t][idx]
        );
    }
}

#[test]
fn one_sgd_step_matches_reference() {
    let data = tiny_data();
    let spec = ModelSpec::mlp(64, &[8], 10);
    let start = init_params(&spec, Init::Default, 2);
    let trainer = Trainer::new(spec).unwrap();
    let lr = 0.5;
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.0,
            weight_decay: 0.0,
        },
        lr,
        epochs: 1,
        batch_size: data.len(),
        dropout: 0.0,
    };
    let fitted = trainer.fit_with(&start, &data, &cfg, None, 0).unwrap();
    let p = as_f64(&start);
    let r = Reference {
        d: 64,
        h: 8,
        k: 10,
        x: &data.x,
        y: &data.y,
    };
    let (loss, g) = r.loss_and_grad(&p);
    assert!(
        (fitted.loss - loss).abs() < 1e-4,
        "loss {} vs reference {loss}",
        fitted.loss
    );
    let after = as_f64(&fitted.params);
    for t in 0..4 {
        for i in 0..p[t].len() {
            let want = p[t][i] - lr * g[t][i];
            assert!(
                (after[t][i] - want).abs() < 1e-4,
                "tensor {t}[{i}]: {} vs {want}",
                after[t][i]
            );
        }
    }
}

#[test]
fn proximal_term_pulls_towards_the_anchor() {
    let data = tiny_data();
    let spec = ModelSpec::mlp(64, &[8], 10);
    let start = init_params(&spec, Init::Default, 3);
    let trainer = Trainer::new(spec).unwrap();
    let cfg = TrainConfig {
        lr: 0.1,
        epochs: 20,
        batch_size: 8,
        ..TrainConfig::default()
    };
    let free = trainer.fit_with(&start, &data, &cfg, None, 1).unwrap();
    let held = trainer
        .fit_with(&start, &data, &cfg, Some((&start, 10.0)), 1)
        .unwrap();
    let (d_free, d_held) = (
        free.params.sq_distance(&start),
        held.params.sq_distance(&start),
    );
    assert!(
        d_held < 0.2 * d_free,
        "prox distance {d_held} vs free {d_free}"
    );
}

#[test]
fn a_mixture_prior_pulls_towards_the_responsible_centre() {
    let data = tiny_data();
    let spec = ModelSpec::mlp(64, &[8], 10);
    let start = init_params(&spec, Init::Default, 3);
    let far = init_params(&spec, Init::Default, 9);
    let trainer = Trainer::new(spec).unwrap();
    let cfg = TrainConfig {
        lr: 0.1,
        epochs: 20,
        batch_size: 8,
        ..TrainConfig::default()
    };
    // One component is FedProx's term with mu = lambda.
    let prox = trainer
        .fit_with(&start, &data, &cfg, Some((&start, 10.0)), 1)
        .unwrap();
    let one = MixturePrior {
        centres: std::slice::from_ref(&start),
        log_weights: &[0.0],
        lambda: 10.0,
    };
    let mixed = trainer.fit_mixture(&start, &data, &cfg, &one, 1).unwrap();
    let gap = prox.params.sq_distance(&mixed.params);
    assert!(gap < 1e-8, "{gap}");
    // With a second, far centre the nearby one stays responsible: almost the same pull.
    let centres = [start.clone(), far.clone()];
    let two = MixturePrior {
        centres: &centres,
        log_weights: &[0.5f64.ln(), 0.5f64.ln()],
        lambda: 10.0,
    };
    let near = trainer.fit_mixture(&start, &data, &cfg, &two, 1).unwrap();
    assert!(near.params.sq_distance(&start) < 0.2 * near.params.sq_distance(&far));
    let free = trainer.fit_with(&start, &data, &cfg, None, 1).unwrap();
    assert!(near.params.sq_distance(&start) < 0.2 * free.params.sq_distance(&start));
    // Mismatched weights are refused.
    let bad = MixturePrior {
        centres: &centres,
        log_weights: &[0.0],
        lambda: 10.0,
    };
    assert!(trainer.fit_mixture(&start, &data, &cfg, &bad, 1).is_err());
}

#[test]
fn params_survive_build_and_read() {
    // Zero epochs: what goes in must come out (transposes undone, order kept).
    for spec in [
        ModelSpec::mlp(5, &[4, 3], 2),
        ModelSpec::LeNet5 {
            channels: 3,
            side: 32,
            classes: 10,
        },
    ] {
        let start = init_params(&spec, Init::Pfnm, 4);
        let trainer = Trainer::new(spec.clone()).unwrap();
        let n = spec.input_len();
        let data = Dataset::new(vec![0.5; 2 * n], vec![0, 1], vec![n], 2).unwrap();
        let cfg = TrainConfig {
            epochs: 0,
            ..TrainConfig::default()
        };
        let out = trainer.fit_with(&start, &data, &cfg, None, 0).unwrap();
        assert_eq!(out.params, start);
        // The forward pass takes this input shape (3x32x32 for the CIFAR LeNet-5).
        let eval = trainer.evaluate(&start, &data).unwrap();
        assert_eq!(eval.n, 2);
        assert!(eval.loss.is_finite() && eval.loss > 0.0);
    }
}

#[test]
fn mlp_learns_digits_with_sgd_and_amsgrad() {
    let data = load_dataset("digits", None).unwrap();
    let spec = ModelSpec::mlp(64, &[64], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    for optimizer in [
        OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 1e-4,
        },
        OptimizerConfig::Adam {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            amsgrad: true,
        },
    ] {
        let lr = if matches!(optimizer, OptimizerConfig::Sgd { .. }) {
            0.05
        } else {
            0.003
        };
        let cfg = TrainConfig {
            optimizer,
            lr,
            epochs: 10,
            batch_size: 32,
            dropout: 0.0,
        };
        let fitted = trainer
            .fit_with(&start, &data.train, &cfg, None, 9)
            .unwrap();
        let eval = trainer.evaluate(&fitted.params, &data.test).unwrap();
        assert!(
            eval.accuracy > 0.93,
            "{:?}: accuracy {}",
            cfg.optimizer,
            eval.accuracy
        );
        let before = trainer.evaluate(&start, &data.test).unwrap();
        assert!(eval.loss < before.loss / 3.0);
    }
}

#[test]
fn dropout_trains_reproducibly_and_leaves_a_model_without_hidden_units_alone() {
    let data = load_dataset("digits", None).unwrap();
    let cfg = |dropout| TrainConfig {
        optimizer: OptimizerConfig::adam(),
        lr: 0.003,
        epochs: 10,
        batch_size: 32,
        dropout,
    };
    let spec = ModelSpec::mlp(64, &[64], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    let fit = |dropout| {
        trainer
            .fit_with(&start, &data.train, &cfg(dropout), None, 9)
            .unwrap()
    };
    let (plain, dropped, again) = (fit(0.0), fit(0.5), fit(0.5));
    assert_eq!(dropped.params, again.params, "same seed, same masks");
    assert_ne!(dropped.params, plain.params, "dropout 0.5 changed nothing");
    // The reported loss is the training loss under the masks: half the units gone costs more
    // than the same network's loss with all of them.
    let full = trainer.evaluate(&dropped.params, &data.train).unwrap();
    assert!(
        dropped.loss > 1.5 * full.loss,
        "{} vs {}",
        dropped.loss,
        full.loss
    );
    let eval = trainer.evaluate(&dropped.params, &data.test).unwrap();
    assert!(
        eval.accuracy > 0.93,
        "accuracy with dropout {}",
        eval.accuracy
    );

    // Logistic regression has no hidden layer: nothing to drop, bit for bit.
    let spec = ModelSpec::mlp(64, &[], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 5);
    let a = trainer
        .fit_with(&start, &data.train, &cfg(0.0), None, 9)
        .unwrap();
    let b = trainer
        .fit_with(&start, &data.train, &cfg(0.5), None, 9)
        .unwrap();
    assert_eq!(a.params, b.params);

    let err = cfg(1.0).check().unwrap_err().to_string();
    assert!(err.contains("train.dropout"), "{err}");
    assert!(cfg(-0.1).check().is_err());
}

#[test]
fn lenet5_learns_mnist_subset() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let train = data.train.subset(&(0..3000).collect::<Vec<_>>());
    let test = data.test.subset(&(0..1000).collect::<Vec<_>>());
    let spec = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let trainer = Trainer::new(spec.clone()).unwrap();
    let start = init_params(&spec, Init::Default, 6);
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs: 4,
        batch_size: 32,
        dropout: 0.0,
    };
    let fitted = trainer.fit_with(&start, &train, &cfg, None, 1).unwrap();
    let eval = trainer.evaluate(&fitted.params, &test).unwrap();
    assert!(eval.accuracy > 0.85, "LeNet-5 accuracy {}", eval.accuracy);
}

#[test]
fn wrong_data_shape_is_an_error_not_a_panic() {
    let spec = ModelSpec::mlp(10, &[4], 2);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let data = Dataset::new(vec![0.0; 12], vec![0, 1], vec![6], 2).unwrap();
    let start = init_params(&spec, Init::Default, 0);
    let err = trainer
        .fit_with(&start, &data, &TrainConfig::default(), None, 0)
        .unwrap_err();
    assert!(err.to_string().contains("model takes 10"), "{err}");
    let mut bad = start.clone();
    bad.get_mut("layers.0.weight").unwrap().shape = vec![10, 4];
    assert!(trainer.evaluate(&bad, &data).is_err());
}

/// 2 -> 2 (identity, ReLU) -> 2 with output weights `w2` ([out, in]).
fn two_by_two(w2: [f32; 4]) -> Params {
    let mut p = Params::new();
    p.push("layers.0.weight", vec![2, 2], vec![1.0, 0.0, 0.0, 1.0])
        .unwrap();
    p.push("layers.0.bias", vec![2], vec![0.0, 0.0]).unwrap();
    p.push("layers.1.weight", vec![2, 2], w2.to_vec()).unwrap();
    p.push("layers.1.bias", vec![2], vec![0.0, 0.0]).unwrap();
    p
}

#[test]
fn ensemble_averages_probabilities() {
    // Sample 1: x = (1, 0), label 0; sample 2: x = (0, 1), label 1.
    let data = Dataset::new(vec![1.0, 0.0, 0.0, 1.0], vec![0, 1], vec![2], 2).unwrap();
    let trainer = Trainer::new(ModelSpec::mlp(2, &[2], 2)).unwrap();
    // A: logits (3, 0) then (0, -1): right, wrong. B: logits (0, 0.5) then (0, 3): wrong, right.
    let a = two_by_two([3.0, 0.0, 0.0, -1.0]);
    let b = two_by_two([0.0, 0.0, 0.5, 3.0]);
    assert_eq!(trainer.evaluate(&a, &data).unwrap().accuracy, 0.5);
    assert_eq!(trainer.evaluate(&b, &data).unwrap().accuracy, 0.5);
    let sig = |z: f64| 1.0 / (1.0 + (-z).exp());
    // Mean probability of the label: sample 1 (sig(3) + sig(-0.5)) / 2, sample 2 (sig(-1) + sig(3)) / 2.
    let p1 = (sig(3.0) + sig(-0.5)) / 2.0;
    let p2 = (sig(-1.0) + sig(3.0)) / 2.0;
    let e = trainer.evaluate_ensemble(&[&a, &b], &data).unwrap();
    assert_eq!(e.accuracy, 1.0);
    assert!(
        (e.loss - -(p1.ln() + p2.ln()) / 2.0).abs() < 1e-6,
        "{}",
        e.loss
    );
    // One member: the model itself.
    let alone = trainer.evaluate_ensemble(&[&a], &data).unwrap();
    let direct = trainer.evaluate(&a, &data).unwrap();
    assert_eq!(alone.accuracy, direct.accuracy);
    assert!((alone.loss - direct.loss).abs() < 1e-6);
    // Members of another width are evaluated as what they are.
    let wide = init_params(&ModelSpec::mlp(2, &[5], 2), Init::Default, 1);
    assert!(trainer.evaluate_ensemble(&[&a, &wide], &data).is_ok());
    assert!(trainer.evaluate_ensemble(&[], &data).is_err());
}

/// FedMA's retraining: the frozen tensors come back bit for bit (momentum and weight decay
/// included), the others move, and a layer list's batch norm still tracks its statistics.
/// A name that is no trainable tensor is refused by name.
#[test]
fn frozen_tensors_stay_as_they_were() {
    use fedfuse_core::LayerSpec;
    let data = tiny_data();
    let cfg = TrainConfig {
        lr: 0.05,
        epochs: 2,
        batch_size: 8,
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 1e-3,
        },
        ..TrainConfig::default()
    };
    let list = ModelSpec::sequential(
        &[1, 8, 8],
        vec![
            LayerSpec::conv2d(4, 3).with_padding(1),
            LayerSpec::batch_norm2d(),
            LayerSpec::Relu,
            LayerSpec::Flatten,
            LayerSpec::linear(6),
            LayerSpec::Relu,
            LayerSpec::linear(10),
        ],
    );
    let frozen_list: Vec<String> = ["0.weight", "0.bias", "1.weight", "1.bias"]
        .map(String::from)
        .to_vec();
    let mlp = ModelSpec::mlp(64, &[8], 10);
    let frozen_mlp = vec!["layers.0.weight".to_string()];
    for (spec, frozen) in [(list, frozen_list), (mlp, frozen_mlp)] {
        let start = init_params(&spec, Init::Default, 3);
        let trainer = Trainer::new(spec.clone()).unwrap();
        let out = trainer
            .fit_frozen(&start, &frozen, &data, &cfg, 1)
            .unwrap()
            .params;
        for (name, t) in start.iter() {
            let after = out.get(name).unwrap();
            let moved = after.data != t.data;
            let expect = !frozen.contains(&name.to_string());
            assert_eq!(moved, expect, "{spec:?}: `{name}` moved {moved}");
        }
        let err = trainer
            .fit_frozen(&start, &["nope".to_string()], &data, &cfg, 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`nope`"), "{err}");
    }
}

/// Re-estimated batch norm statistics against a hand computation: linear(3) on two features
/// (`z = (x0, x1 + 1, x0 + x1 - 1)`), batch norm, ReLU, linear(2), four samples. In batches of
/// two the batch means are (2, 4, 4) and (6, 8, 12), the unbiased variances (2, 2, 8) twice:
/// each batch weighs the same, so the running statistics are their averages and the counter
/// is 2, whatever they were before. In one batch of four: the means (4, 6, 8), the variances
/// 20/3, 20/3, 80/3.
#[test]
fn reestimated_batch_norm_statistics_average_the_batches() {
    use fedfuse_core::LayerSpec;
    let spec = fedfuse_core::ModelSpec::sequential(
        &[2],
        vec![
            LayerSpec::linear(3),
            LayerSpec::BatchNorm1d {
                eps: 1e-5,
                momentum: 0.1,
            },
            LayerSpec::Relu,
            LayerSpec::linear(2),
        ],
    );
    let trainer = Trainer::new(spec.clone()).unwrap();
    let mut p = init_params(&spec, Init::Default, 0);
    let set = |p: &mut fedfuse_core::Params, name: &str, v: &[f32]| {
        p.get_mut(name).unwrap().data = v.to_vec();
    };
    set(&mut p, "0.weight", &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    set(&mut p, "0.bias", &[0.0, 1.0, -1.0]);
    set(&mut p, "1.running_mean", &[100.0; 3]);
    set(&mut p, "1.num_batches_tracked", &[57.0]);
    let data = Dataset::new(
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        vec![0, 1, 0, 1],
        vec![2],
        2,
    )
    .unwrap();
    let close = |got: &[f32], want: &[f32]| {
        assert!(
            got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-4) && got.len() == want.len(),
            "{got:?} vs {want:?}"
        );
    };
    let two = trainer.reestimate_batch_norm(&p, &data, 2).unwrap();
    close(&two.get("1.running_mean").unwrap().data, &[4.0, 6.0, 8.0]);
    close(&two.get("1.running_var").unwrap().data, &[2.0, 2.0, 8.0]);
    close(&two.get("1.num_batches_tracked").unwrap().data, &[2.0]);
    let one = trainer.reestimate_batch_norm(&p, &data, 4).unwrap();
    close(&one.get("1.running_mean").unwrap().data, &[4.0, 6.0, 8.0]);
    let third = 20.0 / 3.0;
    close(
        &one.get("1.running_var").unwrap().data,
        &[third, third, 4.0 * third],
    );
    close(&one.get("1.num_batches_tracked").unwrap().data, &[1.0]);
    // Nothing else moved.
    for (name, t) in p
        .iter()
        .filter(|(n, _)| !n.starts_with("1.running") && !n.ends_with("tracked"))
    {
        assert_eq!(&two.get(name).unwrap().data, &t.data, "{name}");
    }
}
