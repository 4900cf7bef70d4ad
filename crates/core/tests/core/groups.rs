//! Parameter groups by hand: which values form a group, their norms, thresholding and masking,
//! and FedSparse's gate probabilities and initial thresholds.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::groups::{gate_probability, softplus};
use fedfuse_core::{CoreError, GroupLayout, GroupedLayer, ModelSpec, Params};

fn layer(weight: &str, bias: &str, units: usize, fan_in: usize) -> GroupedLayer {
    GroupedLayer::dense(weight, bias, units, fan_in)
}

#[test]
fn groups_are_hidden_units_and_filters() {
    let mlp = GroupLayout::of_model(&ModelSpec::mlp(64, &[32, 16], 10));
    assert_eq!(
        mlp.layers(),
        &[
            layer("layers.0.weight", "layers.0.bias", 32, 64),
            layer("layers.1.weight", "layers.1.bias", 16, 32),
        ]
    );
    assert_eq!(mlp.layers()[0].size(), 65);
    assert_eq!(mlp.num_groups(), 48);
    let lenet = GroupLayout::of_model(&ModelSpec::LeNet5 {
        channels: 3,
        side: 32,
        classes: 10,
    });
    assert_eq!(
        lenet.layers(),
        &[
            layer("conv1.weight", "conv1.bias", 6, 3 * 25),
            layer("conv2.weight", "conv2.bias", 16, 6 * 25),
            layer("fc1.weight", "fc1.bias", 120, 400),
            layer("fc2.weight", "fc2.bias", 84, 120),
        ]
    );
    assert_eq!(lenet.layers()[1].size(), 151);
    assert_eq!(lenet.layer_groups(2), 22..142);
    // The output layer is ungated.
    assert_eq!(lenet.grouped_rows(8), None);
    assert_eq!(lenet.grouped_rows(9), None);
    // Logistic regression: only an output layer, nothing to gate.
    let none = GroupLayout::of_model(&ModelSpec::mlp(4, &[], 3));
    assert!(none.layers().is_empty());
    assert_eq!(none.num_groups(), 0);
}

/// 2 -> 2 -> 2 with hidden rows (3, 0 | bias 4) and (0, 0 | bias 0): group norms 5 and 0.
fn hand_mlp() -> (GroupLayout, Params) {
    let mut p = Params::new();
    p.push("layers.0.weight", vec![2, 2], vec![3.0, 0.0, 0.0, 0.0])
        .unwrap();
    p.push("layers.0.bias", vec![2], vec![4.0, 0.0]).unwrap();
    p.push("layers.1.weight", vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])
        .unwrap();
    p.push("layers.1.bias", vec![2], vec![0.5, 0.5]).unwrap();
    (GroupLayout::of_model(&ModelSpec::mlp(2, &[2], 2)), p)
}

#[test]
fn group_norms_by_hand() {
    let (layout, p) = hand_mlp();
    assert_eq!(layout.norms(&p).unwrap(), vec![5.0, 0.0]);

    // LeNet-5 on one channel: filter 1 of conv1 all 0.5 with bias 1 (25 * 0.25 + 1 = 7.25),
    // unit 2 of fc2 a single 2 (norm 2); everything else zero.
    let spec = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let lenet = GroupLayout::of_model(&spec);
    let mut p = Params::zeros(&spec.param_shapes());
    p.get_mut("conv1.weight").unwrap().data[25..50].fill(0.5);
    p.get_mut("conv1.bias").unwrap().data[1] = 1.0;
    p.get_mut("fc2.weight").unwrap().data[2 * 120 + 7] = 2.0;
    p.get_mut("fc3.weight").unwrap().data.fill(9.0); // not a group
    let norms = lenet.norms(&p).unwrap();
    assert_eq!(norms.len(), 6 + 16 + 120 + 84);
    assert!((norms[1] - 7.25f64.sqrt()).abs() < 1e-12);
    assert_eq!(norms[lenet.layer_groups(3).start + 2], 2.0);
    assert_eq!(norms.iter().filter(|&&n| n != 0.0).count(), 2);
    // Parameters of another model are an error that names a tensor.
    let (_, mlp) = hand_mlp();
    let err = lenet.norms(&mlp).unwrap_err().to_string();
    assert!(err.contains("conv1.weight"), "{err}");
    let mut wide = p.clone();
    wide.remove("fc3.bias");
    wide.push("fc3.bias", vec![11], vec![0.0; 11]).unwrap();
    let err = lenet.norms(&wide).unwrap_err().to_string();
    assert!(err.contains("fc3.bias"), "{err}");
}

#[test]
fn thresholding_and_masking_by_hand() {
    let (layout, p) = hand_mlp();
    let output = (
        p.get("layers.1.weight").unwrap().clone(),
        p.get("layers.1.bias").unwrap().clone(),
    );

    // Soft: the norm-5 group shrinks by 1 - 1/5, the zero group stays zero.
    let mut soft = p.clone();
    assert_eq!(layout.soft_threshold(&mut soft, 1.0).unwrap(), 1);
    assert_eq!(
        soft.get("layers.0.weight").unwrap().data,
        [2.4, 0.0, 0.0, 0.0]
    );
    assert_eq!(soft.get("layers.0.bias").unwrap().data, [3.2, 0.0]);
    assert!((layout.norms(&soft).unwrap()[0] - 4.0).abs() < 1e-6);
    // The output layer is not a group.
    assert_eq!(soft.get("layers.1.weight").unwrap(), &output.0);
    assert_eq!(soft.get("layers.1.bias").unwrap(), &output.1);
    // A threshold at the norm zeroes the group exactly.
    let mut gone = p.clone();
    assert_eq!(layout.soft_threshold(&mut gone, 5.0).unwrap(), 2);
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
    assert_eq!(layout.hard_threshold(&mut hard, 4.9).unwrap(), 1);
    assert_eq!(hard, p);
    assert_eq!(layout.hard_threshold(&mut hard, 5.0).unwrap(), 2);
    assert_eq!(hard.get("layers.0.bias").unwrap().data, [0.0, 0.0]);

    let mut masked = p.clone();
    masked.get_mut("layers.0.weight").unwrap().data[0] = -3.0;
    layout.mask(&mut masked, &[false, true]).unwrap();
    // +0.0, not -0.0: sparse encoders see plain zeros.
    assert!(
        masked
            .get("layers.0.weight")
            .unwrap()
            .data
            .iter()
            .all(|v| v.to_bits() == 0)
    );
    assert_eq!(masked.get("layers.0.bias").unwrap().data, [0.0; 2]);
    assert_eq!(masked.get("layers.1.weight").unwrap(), &output.0);

    assert!(matches!(
        layout.mask(&mut masked, &[true]),
        Err(CoreError::GroupMismatch(_))
    ));
    let err = layout.soft_threshold(&mut masked, -1.0).unwrap_err();
    assert!(
        matches!(
            err,
            CoreError::InvalidSetting {
                field: "threshold",
                ..
            }
        ),
        "{err}"
    );
}

/// `fc` (2 units, 2 inputs, gated per unit with its bias) and an ungated output layer.
fn mlp(fc_w: [f32; 4], fc_b: [f32; 2], out: [f32; 2]) -> (GroupLayout, Params) {
    let mut p = Params::new();
    p.push("fc.weight", vec![2, 2], fc_w.to_vec()).unwrap();
    p.push("fc.bias", vec![2], fc_b.to_vec()).unwrap();
    p.push("out.weight", vec![1, 2], out.to_vec()).unwrap();
    let layout = GroupLayout::new(p.layout(), vec![layer("fc.weight", "fc.bias", 2, 2)]).unwrap();
    (layout, p)
}

/// `v` with `softplus(v) = 1`.
fn v_one() -> f32 {
    (std::f64::consts::E - 1.0).ln() as f32
}

#[test]
fn gate_probabilities_by_hand() {
    // Unit 0: weights [3, 4], bias 0 -> norm 5. Unit 1: weights [0, 0.6], bias 0.8 -> norm 1.
    let (layout, w) = mlp([3.0, 4.0, 0.0, 0.6], [0.0, 0.8], [5.0, 5.0]);
    let norms = layout.norms(&w).unwrap();
    assert!((norms[0] - 5.0).abs() < 1e-6 && (norms[1] - 1.0).abs() < 1e-6);
    // softplus(v) = 1, T = 1: theta = [sigmoid(5 - 1), sigmoid(1 - 1)] = [0.9820138, 0.5].
    let th = layout.gate_probabilities(&w, &[v_one(); 2], 1.0).unwrap();
    assert!((th[0] - 0.982_013_8).abs() < 1e-6, "{th:?}");
    assert!((th[1] - 0.5).abs() < 1e-6, "{th:?}");
    assert_eq!(th[0], gate_probability(norms[0], f64::from(v_one()), 1.0));
    // T = 0.1 sharpens: sigmoid(40) ~ 1, sigmoid(0) = 0.5 still.
    let sharp = layout.gate_probabilities(&w, &[v_one(); 2], 0.1).unwrap();
    assert!(sharp[0] > 1.0 - 1e-12 && (sharp[1] - 0.5).abs() < 1e-6);

    // Bad inputs.
    assert!(matches!(
        layout.gate_probabilities(&w, &[0.0; 2], 0.0),
        Err(CoreError::InvalidSetting {
            field: "temperature",
            ..
        })
    ));
    assert!(layout.gate_probabilities(&w, &[0.0; 3], 1.0).is_err());
    assert!(
        layout
            .gate_probabilities(&w, &[f32::NAN, 0.0], 1.0)
            .is_err()
    );
}

#[test]
fn initial_thresholds_give_theta0() {
    let (layout, w) = mlp([0.3, 0.4, 0.1, 0.2], [0.0, 0.1], [1.0, 1.0]);
    let v = layout.initial_thresholds(&w, 0.99, 1e-3).unwrap();
    let th = layout.gate_probabilities(&w, &v, 1e-3).unwrap();
    // f32 thresholds: softplus(v) is off by ~1e-8, times 1/T = 1e3 in the logit.
    assert!(th.iter().all(|t| (t - 0.99).abs() < 1e-4), "{th:?}");
    // A zero group cannot reach theta0 with a positive threshold: it gets the smallest one,
    // 1e-6, and starts at theta = sigmoid(-1e-6 / T), just below 0.5.
    let (_, zero) = mlp([0.0; 4], [0.0; 2], [1.0, 1.0]);
    let v = layout.initial_thresholds(&zero, 0.99, 1.0).unwrap();
    assert!(
        v.iter()
            .all(|&v| (softplus(f64::from(v)) - 1e-6).abs() < 1e-9)
    );
    let th = layout.gate_probabilities(&zero, &v, 1.0).unwrap();
    assert!(th.iter().all(|t| *t >= 0.499 && *t < 0.5), "{th:?}");
    // Hidden units of an MLP, one dead: every other unit starts at theta0.
    let spec = ModelSpec::mlp(3, &[4], 2);
    let layout = GroupLayout::of_model(&spec);
    let mut p = Params::zeros(&spec.param_shapes());
    let data: Vec<f32> = (0..12).map(|i| 0.1 * i as f32 - 0.3).collect();
    p.get_mut("layers.0.weight").unwrap().data = data;
    p.get_mut("layers.0.weight").unwrap().data[..3].fill(0.0);
    let v = layout.initial_thresholds(&p, 0.5, 0.1).unwrap();
    let th = layout.gate_probabilities(&p, &v, 0.1).unwrap();
    assert!(th[0] < 0.5, "dead unit theta {}", th[0]);
    assert!(th[1..].iter().all(|t| (t - 0.5).abs() < 1e-5), "{th:?}");
    assert!(matches!(
        layout.initial_thresholds(&p, 1.0, 0.1),
        Err(CoreError::InvalidSetting {
            field: "initial_theta",
            ..
        })
    ));
}
