#![allow(clippy::unwrap_used, clippy::expect_used)]
//! FedSparse server maths: pruning, one round and the stationary point by hand, the direction
//! of the threshold gradient, and input errors (the groups and eq. 23 are fedfuse-core's,
//! tested there).

use fedfuse_core::{GroupLayout, GroupedLayer, Params};
use fedfuse_fuse::{
    FedSparseConfig, FedSparseServer, FuseError, ServerOptimizer, SparseGradSum, SparseReply,
    fedsparse_gradients, fedsparse_stationary, prune, total_variation,
};

/// `v` with `softplus(v) = 1`.
fn v_one() -> f32 {
    (std::f64::consts::E - 1.0).ln() as f32
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `fc` (2 units, 2 inputs, gated per unit with its bias) and an ungated output layer.
fn mlp(fc_w: [f32; 4], fc_b: [f32; 2], out: [f32; 2]) -> Params {
    let mut p = Params::new();
    p.push("fc.weight", vec![2, 2], fc_w.to_vec()).unwrap();
    p.push("fc.bias", vec![2], fc_b.to_vec()).unwrap();
    p.push("out.weight", vec![1, 2], out.to_vec()).unwrap();
    p
}

fn layer(weight: &str, bias: &str, units: usize, fan_in: usize) -> GroupedLayer {
    GroupedLayer::dense(weight, bias, units, fan_in)
}

/// The units of `fc` are its groups (2 input weights and a bias each); `out` is ungated.
fn mlp_layout() -> GroupLayout {
    let p = mlp([0.0; 4], [0.0; 2], [0.0; 2]);
    GroupLayout::new(p.layout(), vec![layer("fc.weight", "fc.bias", 2, 2)]).unwrap()
}

#[test]
fn prune_by_hand() {
    let layout = mlp_layout();
    // Unit 0: weights [3, 4], bias 0 -> norm 5. Unit 1: weights [0, 0.6], bias 0.8 -> norm 1.
    let mut w = mlp([3.0, 4.0, 0.0, 0.6], [0.0, 0.8], [5.0, 5.0]);
    // softplus(v) = 1, T = 1: theta = [sigmoid(5 - 1), sigmoid(1 - 1)] = [0.9820138, 0.5].
    let th = layout.gate_probabilities(&w, &[v_one(); 2], 1.0).unwrap();

    // eps = 0.1 keeps both; eps = 0.6 prunes unit 1 (its weight row and its bias), never the
    // ungated output layer.
    let mut kept = w.clone();
    assert_eq!(
        prune(&mut kept, &th, 0.1, &layout).unwrap(),
        vec![true, true]
    );
    assert_eq!(kept, w);
    assert_eq!(prune(&mut w, &th, 0.6, &layout).unwrap(), vec![true, false]);
    assert_eq!(w, mlp([3.0, 4.0, 0.0, 0.0], [0.0, 0.0], [5.0, 5.0]));
    // theta == eps is kept (pruned only below eps).
    let mut same = w.clone();
    assert_eq!(
        prune(&mut same, &[0.5, 0.5], 0.5, &layout).unwrap(),
        vec![true, true]
    );
}

/// One group: the row `w` and the bias `b`, which stays 0 here.
fn one_group_layout() -> GroupLayout {
    GroupLayout::new(row(0.0, 0.0).layout(), vec![layer("w", "b", 1, 2)]).unwrap()
}

fn row(a: f32, b: f32) -> Params {
    let mut p = Params::new();
    p.push("w", vec![1, 2], vec![a, b]).unwrap();
    p.push("b", vec![1], vec![0.0]).unwrap();
    p
}

#[test]
fn one_server_step_by_hand() {
    // One group of two weights w = [3, 4], T = 1, softplus(v) = 1:
    // theta = sigmoid(5 - 1) = 0.9820138, sigmoid(v) = 1 - 1/e = 0.6321206.
    let config = FedSparseConfig {
        temperature: 1.0,
        prune_eps: 0.1,
        weights_opt: ServerOptimizer::KingmaAdam {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        thresholds_opt: ServerOptimizer::Adamax {
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
    };
    let mut server =
        FedSparseServer::new(config, one_group_layout(), row(3.0, 4.0), vec![v_one()]).unwrap();
    let start = server.begin_round().unwrap();
    assert!((start.theta[0] - 0.982_013_8).abs() < 1e-6);
    assert_eq!(start.kept, vec![true]);

    // Client 1 keeps the group and trained it to [4, 4]; client 2 drops it.
    let (w1, w2) = (row(4.0, 4.0), row(0.0, 0.0));
    server
        .add_reply(SparseReply {
            z: &[true],
            w_hat: &w1,
        })
        .unwrap();
    server
        .add_reply(SparseReply {
            z: &[false],
            w_hat: &w2,
        })
        .unwrap();
    assert_eq!(server.replies(), 2);
    let grads = server.finish_round().unwrap();
    // grad_w = ((4 - 3, 4 - 4) + 0) / 2 = [0.5, 0]; the bias did not move.
    assert_eq!(grads.w, vec![vec![0.5, 0.0], vec![0.0]]);
    // grad_v = (-(1 - theta) + theta) sigmoid(v) / (2 T) = 0.9640276 * 0.6321206 / 2 = 0.304691.
    assert!((grads.v[0] - 0.304_691).abs() < 1e-6, "{:?}", grads.v);
    let th = sigmoid(4.0);
    let by_formula = (2.0 * th - 1.0) * (1.0 - (-1f64).exp()) / 2.0;
    assert!((grads.v[0] - by_formula).abs() < 1e-7);

    // First bias-corrected Adam / Adamax steps move by lr * sign(gradient):
    // w = [3.01, 4] (no gradient on the second weight), v = ln(e - 1) + 0.01.
    let w = &server.weights().get("w").unwrap().data;
    assert!((w[0] - 3.01).abs() < 1e-6 && w[1] == 4.0, "{w:?}");
    assert!((server.thresholds()[0] - (v_one() + 0.01)).abs() < 1e-6);
    // The threshold rose, so theta fell (towards the clients' mean gate 0.5).
    assert!(server.theta().unwrap()[0] < start.theta[0]);
}

#[test]
fn stationary_point_by_hand() {
    // Two units gated per row (their biases `b` stay 0), plus an ungated tensor.
    let mut server = Params::new();
    server
        .push("w", vec![2, 2], vec![9.0, 9.0, 7.0, 7.0])
        .unwrap();
    server.push("b", vec![2], vec![0.0, 0.0]).unwrap();
    server.push("out", vec![2], vec![0.0, 0.0]).unwrap();
    let layout = GroupLayout::new(server.layout(), vec![layer("w", "b", 2, 2)]).unwrap();
    let client = |r0: [f32; 2], out: [f32; 2]| {
        let mut p = Params::new();
        p.push("w", vec![2, 2], vec![r0[0], r0[1], 0.0, 0.0])
            .unwrap();
        p.push("b", vec![2], vec![0.0, 0.0]).unwrap();
        p.push("out", vec![2], out.to_vec()).unwrap();
        p
    };
    let (a, b, c) = (
        client([2.0, 4.0], [1.0, 2.0]),
        client([4.0, 8.0], [3.0, 4.0]),
        client([0.0, 0.0], [5.0, 6.0]),
    );
    let replies = [
        SparseReply {
            z: &[true, false],
            w_hat: &a,
        },
        SparseReply {
            z: &[true, false],
            w_hat: &b,
        },
        SparseReply {
            z: &[false, false],
            w_hat: &c,
        },
    ];
    let st = fedsparse_stationary(&server, &layout, &replies).unwrap();
    // Group 0: ([2, 4] + [4, 8]) / 2 = [3, 6], theta = 2/3. Group 1: nobody kept it, so the
    // server's [7, 7] stays, theta = 0. Ungated: the mean of all three, [3, 4].
    assert_eq!(st.weights.get("w").unwrap().data, vec![3.0, 6.0, 7.0, 7.0]);
    assert_eq!(st.weights.get("out").unwrap().data, vec![3.0, 4.0]);
    assert!((st.theta[0] - 2.0 / 3.0).abs() < 1e-12 && st.theta[1] == 0.0);

    // It is where the gradients vanish: grad_w = 0 at w = stationary, grad_v = 0 at
    // theta = mean z (since -(z (1 - theta) - (1 - z) theta) = theta - z).
    let g =
        fedsparse_gradients(&st.weights, &[0.0, 0.0], &st.theta, 1.0, &layout, &replies).unwrap();
    assert!(g.w.iter().flatten().all(|x| x.abs() < 1e-12), "{g:?}");
    assert!(g.v.iter().all(|x| x.abs() < 1e-12), "{g:?}");
}

fn unchanged_server(z: bool) -> (Vec<f64>, Vec<f64>, Vec<f32>, Vec<f32>) {
    let layout = mlp_layout();
    let w = mlp([0.3, 0.4, 0.1, 0.2], [0.0, 0.1], [1.0, 1.0]);
    let config = FedSparseConfig::default();
    let mut server = FedSparseServer::with_initial_theta(config, layout, w, 0.9).unwrap();
    let before = server.begin_round().unwrap().theta;
    let v_before = server.thresholds().to_vec();
    let sent = server.weights().clone();
    for _ in 0..3 {
        // The clients send the weights back unchanged, so only the gates move the thresholds.
        server
            .add_reply(SparseReply {
                z: &[z, z],
                w_hat: &sent,
            })
            .unwrap();
    }
    let g = server.finish_round().unwrap();
    assert!(g.w.iter().flatten().all(|x| *x == 0.0));
    (
        before,
        server.theta().unwrap(),
        v_before,
        server.thresholds().to_vec(),
    )
}

#[test]
fn gates_move_thresholds_the_right_way() {
    // Every client keeps every group: grad_v = -(1 - theta) sigmoid(v) / T < 0, v falls,
    // the threshold softplus(v) falls and theta rises.
    let (t0, t1, v0, v1) = unchanged_server(true);
    for g in 0..2 {
        assert!(v1[g] < v0[g], "{v0:?} -> {v1:?}");
        assert!(t1[g] > t0[g], "{t0:?} -> {t1:?}");
    }
    // Every client drops every group: the opposite.
    let (t0, t1, v0, v1) = unchanged_server(false);
    for g in 0..2 {
        assert!(v1[g] > v0[g], "{v0:?} -> {v1:?}");
        assert!(t1[g] < t0[g], "{t0:?} -> {t1:?}");
    }
}

#[test]
fn streaming_sum_equals_batch_and_ungated_is_plain_mean() {
    let layout = mlp_layout();
    let w = mlp([1.0, 1.0, 1.0, 1.0], [1.0, 1.0], [1.0, 1.0]);
    let a = mlp([2.0, 3.0, 9.0, 9.0], [4.0, 9.0], [3.0, 1.0]);
    let b = mlp([0.0, 0.0, 5.0, 7.0], [0.0, 3.0], [5.0, 3.0]);
    let replies = [
        SparseReply {
            z: &[true, false],
            w_hat: &a,
        },
        SparseReply {
            z: &[false, true],
            w_hat: &b,
        },
    ];
    let th = [0.9, 0.2];
    let v = [0.5f32, -0.5];
    let batch = fedsparse_gradients(&w, &v, &th, 0.5, &layout, &replies).unwrap();
    let mut sum = SparseGradSum::new(&layout, th.to_vec(), &v, 0.5).unwrap();
    for r in replies {
        sum.add(&layout, &w, r).unwrap();
    }
    assert_eq!(sum.finish().unwrap(), batch);
    // fc.weight: row 0 from a only, row 1 from b only, each / 2 clients.
    assert_eq!(batch.w[0], vec![0.5, 1.0, 2.0, 3.0]);
    assert_eq!(batch.w[1], vec![1.5, 1.0]);
    // Ungated: mean of (w_s - w) over both clients = ([2, 0] + [4, 2]) / 2.
    assert_eq!(batch.w[2], vec![3.0, 1.0]);
    // grad_v: group 0 kept by a, dropped by b: (-(1 - 0.9) + 0.9) sigmoid(0.5) / 0.5 / 2.
    let s0 = sigmoid(0.5) / 0.5;
    let s1 = sigmoid(-0.5) / 0.5;
    assert!((batch.v[0] - 0.8 * s0 / 2.0).abs() < 1e-12);
    // Group 1 dropped by a, kept by b: (0.2 - (1 - 0.2)) sigmoid(-0.5) / 0.5 / 2.
    assert!((batch.v[1] - (-0.6) * s1 / 2.0).abs() < 1e-12);
}

#[test]
fn pruned_groups_are_sent_as_zeros() {
    let layout = mlp_layout();
    // Unit 1 has a tiny norm; with T = 1e-3 and softplus(v) = 1 its theta is ~0.
    let w = mlp([3.0, 4.0, 0.01, 0.0], [0.0, 0.0], [1.0, 1.0]);
    let mut server =
        FedSparseServer::new(FedSparseConfig::default(), layout, w, vec![v_one(); 2]).unwrap();
    let start = server.begin_round().unwrap();
    assert_eq!(start.kept, vec![true, false]);
    assert_eq!(
        server.weights(),
        &mlp([3.0, 4.0, 0.0, 0.0], [0.0, 0.0], [1.0, 1.0])
    );
}

#[test]
fn total_variation_by_hand() {
    // |1 - 0.75| + |0.5 - 0.5| + |0.5 - 0.75| + |0.5 - 0.5| = 0.5 over 4 pairs.
    let tv = total_variation(&[&[1.0, 0.5], &[0.5, 0.5]], &[0.75, 0.5]).unwrap();
    assert!((tv.mean - 0.125).abs() < 1e-12 && (tv.max - 0.25).abs() < 1e-12);
    assert!(total_variation(&[&[1.0]], &[0.5, 0.5]).is_err());
    assert!(total_variation(&[&[1.5, 0.0]], &[0.5, 0.5]).is_err());
    assert!(matches!(
        total_variation(&[], &[0.5]),
        Err(FuseError::Empty)
    ));
}

#[test]
fn inputs_are_checked() {
    let layout = mlp_layout();
    let w = mlp([1.0; 4], [1.0; 2], [1.0; 2]);
    // Layout errors name the tensor or the group.
    let mut bad = Params::new();
    bad.push("fc.weight", vec![2, 2], vec![0.0; 4]).unwrap();
    bad.push("fc.bias", vec![3], vec![0.0; 3]).unwrap();
    bad.push("out.weight", vec![1, 2], vec![0.0; 2]).unwrap();
    let err = prune(&mut bad.clone(), &[0.5, 0.5], 0.1, &layout)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fc.bias"), "{err}");
    let err = GroupLayout::new(bad.layout(), vec![layer("fc.weight", "fc.bias", 2, 2)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("fc.bias"), "{err}");

    // Settings.
    let mut w2 = w.clone();
    assert!(matches!(
        prune(&mut w2, &[0.5, 0.5], 1.5, &layout),
        Err(FuseError::InvalidSetting {
            field: "prune_eps",
            ..
        })
    ));
    let hot = FedSparseConfig {
        temperature: 0.0,
        ..FedSparseConfig::default()
    };
    assert!(matches!(
        hot.check(),
        Err(FuseError::InvalidSetting {
            field: "temperature",
            ..
        })
    ));
    assert!(
        FedSparseServer::new(
            FedSparseConfig::default(),
            mlp_layout(),
            w.clone(),
            vec![0.0; 3]
        )
        .is_err()
    );
    assert!(
        FedSparseServer::new(
            FedSparseConfig::default(),
            mlp_layout(),
            w.clone(),
            vec![f32::NAN, 0.0]
        )
        .is_err()
    );
    assert!(prune(&mut w2, &[0.5, f64::NAN], 0.1, &layout).is_err());

    // Server round protocol.
    let mut server =
        FedSparseServer::new(FedSparseConfig::default(), layout, w.clone(), vec![0.0; 2]).unwrap();
    let reply = SparseReply {
        z: &[true, true],
        w_hat: &w,
    };
    assert!(server.add_reply(reply).is_err());
    server.begin_round().unwrap();
    assert!(matches!(server.finish_round(), Err(FuseError::Empty)));
    let short = SparseReply {
        z: &[true],
        w_hat: &w,
    };
    assert!(
        server
            .add_reply(short)
            .unwrap_err()
            .to_string()
            .contains("gates")
    );
    let bad_reply = SparseReply {
        z: &[true, true],
        w_hat: &bad,
    };
    assert!(server.add_reply(bad_reply).is_err());
    assert_eq!(server.replies(), 0);
    server.add_reply(reply).unwrap();
    server.finish_round().unwrap();
    let bad_config = FedSparseConfig {
        weights_opt: ServerOptimizer::Adam {
            lr: -1.0,
            beta1: 0.9,
            beta2: 0.99,
            tau: 1e-9,
        },
        ..FedSparseConfig::default()
    };
    assert!(matches!(
        FedSparseServer::new(bad_config, mlp_layout(), w, vec![0.0; 2]),
        Err(FuseError::InvalidSetting {
            field: "server.lr",
            ..
        })
    ));
}
