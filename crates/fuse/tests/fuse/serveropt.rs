#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Server optimizers: one or two steps worked out by hand, FedAvg as the lr = 1 SGD step,
//! layout and setting errors.

use fedfuse_core::Params;
use fedfuse_fuse::{FuseError, ServerOptState, ServerOptimizer, weighted_mean_params};

fn vec2(a: f32, b: f32) -> Params {
    let mut p = Params::new();
    p.push("w", vec![2], vec![a, b]).unwrap();
    p
}

fn values(p: &Params) -> Vec<f64> {
    p.get("w")
        .unwrap()
        .data
        .iter()
        .map(|x| f64::from(*x))
        .collect()
}

fn close(got: &Params, want: [f64; 2], tol: f64) {
    let got = values(got);
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "got {got:?}, want {want:?}");
    }
}

// All hand examples start from x = [1, 2] with client mean [1.5, 1], so D = [0.5, -1].

#[test]
fn fedadam_two_steps_by_hand() {
    let mut opt = ServerOptState::new(ServerOptimizer::fedadam()).unwrap();
    let mean = vec2(1.5, 1.0);
    // Step 1: m = 0.1 D = [0.05, -0.1]; v = 0.01 D^2 = [0.0025, 0.01]; sqrt v = [0.05, 0.1];
    // x += 0.1 m / sqrt v = [0.1, -0.1] (tau = 1e-9 is negligible) -> [1.1, 1.9].
    let x1 = opt.step(&vec2(1.0, 2.0), &mean).unwrap();
    close(&x1, [1.1, 1.9], 1e-6);
    // Step 2: D = [0.4, -0.9]; m = 0.9 [0.05, -0.1] + 0.1 D = [0.085, -0.18];
    // v = 0.99 [0.0025, 0.01] + 0.01 [0.16, 0.81] = [0.004075, 0.018];
    // x += 0.1 [0.085 / sqrt 0.004075, -0.18 / sqrt 0.018] = [0.1331543, -0.1341641].
    let x2 = opt.step(&x1, &mean).unwrap();
    close(&x2, [1.2331543, 1.7658359], 1e-6);
    assert_eq!(opt.steps(), 2);
}

#[test]
fn fedadagrad_two_steps_by_hand() {
    let mut opt = ServerOptState::new(ServerOptimizer::fedadagrad()).unwrap();
    let mean = vec2(1.5, 1.0);
    // Step 1: m = D; v = D^2; x += 0.1 D / |D| -> [1.1, 1.9].
    let x1 = opt.step(&vec2(1.0, 2.0), &mean).unwrap();
    close(&x1, [1.1, 1.9], 1e-6);
    // Step 2: D = [0.4, -0.9]; v = [0.25 + 0.16, 1 + 0.81] = [0.41, 1.81];
    // x += 0.1 [0.4 / 0.6403124, -0.9 / 1.3453624] = [0.0624695, -0.0668965].
    let x2 = opt.step(&x1, &mean).unwrap();
    close(&x2, [1.1624695, 1.8331035], 1e-6);
}

#[test]
fn fedyogi_two_steps_by_hand() {
    let yogi = ServerOptimizer::Yogi {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.99,
        tau: 1e-3,
    };
    let mut opt = ServerOptState::new(yogi).unwrap();
    // Step 1 (v = 0 < D^2, so v rises by 0.01 D^2, like Adam): m = [0.05, -0.1],
    // v = [0.0025, 0.01]; x += 0.1 [0.05 / 0.051, -0.1 / 0.101] = [0.0980392, -0.0990099].
    let x1 = opt.step(&vec2(1.0, 2.0), &vec2(1.5, 1.0)).unwrap();
    close(&x1, [1.0980392, 1.9009901], 1e-6);
    // Step 2 with D = [0.01, 0] (mean = x1 + [0.01, 0]): D^2 = [1e-4, 0] < v, so Yogi lowers v
    // by 0.01 D^2 where Adam would shrink it by 1%: v = [0.0025 - 1e-6, 0.01].
    // m = 0.9 [0.05, -0.1] + 0.1 [0.01, 0] = [0.046, -0.09];
    // x += 0.1 [0.046 / (sqrt 0.002499 + 0.001), -0.09 / (0.1 + 0.001)]
    //    = [0.0902138, -0.0891089].
    let x1v = values(&x1);
    let mean2 = vec2((x1v[0] + 0.01) as f32, x1v[1] as f32);
    let d0 = f64::from(mean2.get("w").unwrap().data[0]) - x1v[0];
    let x2 = opt.step(&x1, &mean2).unwrap();
    let v0: f64 = 0.0025 - 0.01 * d0 * d0;
    let m0 = 0.9 * 0.05 + 0.1 * d0;
    let want0 = x1v[0] + 0.1 * m0 / (v0.sqrt() + 1e-3);
    close(&x2, [want0, x1v[1] - 0.0891089], 1e-6);
    assert!((want0 - x1v[0] - 0.0902138).abs() < 1e-5);
}

#[test]
fn adamax_two_steps_by_hand() {
    let adamax = ServerOptimizer::Adamax {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    let mut opt = ServerOptState::new(adamax).unwrap();
    // Step 1: m = [0.05, -0.1]; u = |D| = [0.5, 1]; 1 - b1 = 0.1;
    // x += 0.1 / 0.1 [0.05 / 0.5, -0.1 / 1] = [0.1, -0.1] -> [1.1, 1.9].
    let x1 = opt.step(&vec2(1.0, 2.0), &vec2(1.5, 1.0)).unwrap();
    close(&x1, [1.1, 1.9], 1e-6);
    // Step 2 with D = [0.2, 0]: m = [0.045 + 0.02, -0.09] = [0.065, -0.09];
    // u = max(0.999 [0.5, 1], [0.2, 0]) = [0.4995, 0.999]; 1 - b1^2 = 0.19;
    // x += 0.1 / 0.19 [0.065 / 0.4995, -0.09 / 0.999] = [0.0684895, -0.0474158].
    let delta = vec2(0.2, 0.0);
    let x2 = opt.step_with_delta(&x1, &delta).unwrap();
    close(&x2, [1.1 + 0.0684895, 1.9 - 0.0474158], 1e-6);
}

#[test]
fn kingma_adam_first_step_is_lr_times_sign() {
    let mut opt = ServerOptState::new(ServerOptimizer::KingmaAdam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    })
    .unwrap();
    // m_hat = D, v_hat = D^2: the first step is lr * sign(D).
    let x1 = opt.step(&vec2(1.0, 2.0), &vec2(1.5, 1.0)).unwrap();
    close(&x1, [1.01, 1.99], 1e-6);
}

#[test]
fn fedavgm_two_steps_by_hand() {
    let mut opt = ServerOptState::new(ServerOptimizer::Sgd {
        lr: 1.0,
        momentum: 0.9,
    })
    .unwrap();
    let mean = vec2(1.5, 1.0);
    // Step 1: m = D -> x = mean. Step 2: D = 0, m = 0.9 [0.5, -1] -> x = [1.95, 0.1].
    let x1 = opt.step(&vec2(1.0, 2.0), &mean).unwrap();
    close(&x1, [1.5, 1.0], 1e-7);
    let x2 = opt.step(&x1, &mean).unwrap();
    close(&x2, [1.95, 0.1], 1e-6);
}

fn model(seed: u32) -> Params {
    let mut p = Params::new();
    let f = |i: u32| ((seed * 7919 + i * 104_729) % 1000) as f32 / 37.0 - 13.0;
    p.push("fc.weight", vec![2, 3], (0..6).map(f).collect())
        .unwrap();
    p.push("fc.bias", vec![2], (6..8).map(f).collect()).unwrap();
    p
}

#[test]
fn sgd_lr_one_is_fedavg_exactly() {
    let mut opt = ServerOptState::new(ServerOptimizer::fedavg()).unwrap();
    let mut global = model(0);
    for round in 0..3 {
        let clients: Vec<Params> = (1..5).map(|s| model(s + 10 * round)).collect();
        let weighted: Vec<(&Params, f64)> = clients.iter().zip([3.0, 1.0, 7.0, 2.0]).collect();
        let mean = weighted_mean_params(&weighted).unwrap();
        global = opt.step(&global, &mean).unwrap();
        assert_eq!(global, mean, "round {round}");
    }
}

#[test]
fn layout_change_is_an_error_and_leaves_state() {
    let mut opt = ServerOptState::new(ServerOptimizer::fedadam()).unwrap();
    opt.step(&model(0), &model(1)).unwrap();
    let mut other = Params::new();
    other.push("fc.weight", vec![3, 2], vec![0.0; 6]).unwrap();
    other.push("fc.bias", vec![2], vec![0.0; 2]).unwrap();
    let err = opt.step(&other, &other).unwrap_err();
    assert!(matches!(err, FuseError::Layout(_)), "{err}");
    assert!(err.to_string().contains("fc.weight"), "{err}");
    // Client mean in another layout than the global model.
    assert!(opt.step(&model(0), &other).is_err());
    assert_eq!(opt.steps(), 1);
    // The state still works in its own layout, and its moments were not touched: the same
    // second step as a fresh replay.
    let mut replay = ServerOptState::new(ServerOptimizer::fedadam()).unwrap();
    replay.step(&model(0), &model(1)).unwrap();
    assert_eq!(
        opt.step(&model(2), &model(3)).unwrap(),
        replay.step(&model(2), &model(3)).unwrap()
    );
}

#[test]
fn non_finite_inputs_are_refused() {
    let mut opt = ServerOptState::new(ServerOptimizer::fedadam()).unwrap();
    let err = opt
        .step(&vec2(1.0, 2.0), &vec2(f32::NAN, 1.0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`w`"), "{err}");
    assert_eq!(opt.steps(), 0);
}

#[test]
fn check_names_the_field() {
    let cases = [
        (
            ServerOptimizer::Sgd {
                lr: 0.0,
                momentum: 0.0,
            },
            "server.lr",
        ),
        (
            ServerOptimizer::Sgd {
                lr: 1.0,
                momentum: 1.0,
            },
            "server.momentum",
        ),
        (
            ServerOptimizer::Adam {
                lr: 0.1,
                beta1: -0.1,
                beta2: 0.99,
                tau: 1e-9,
            },
            "server.beta1",
        ),
        (
            ServerOptimizer::Yogi {
                lr: 0.1,
                beta1: 0.9,
                beta2: f64::NAN,
                tau: 1e-3,
            },
            "server.beta2",
        ),
        (ServerOptimizer::Adagrad { lr: 0.1, tau: 0.0 }, "server.tau"),
        (
            ServerOptimizer::Adamax {
                lr: 0.1,
                beta1: 0.9,
                beta2: 0.999,
                eps: -1.0,
            },
            "server.eps",
        ),
        (
            ServerOptimizer::KingmaAdam {
                lr: f64::INFINITY,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            "server.lr",
        ),
    ];
    for (opt, field) in cases {
        match ServerOptState::new(opt) {
            Err(FuseError::InvalidSetting { field: f, .. }) => assert_eq!(f, field, "{opt:?}"),
            other => panic!("{opt:?}: {other:?}"),
        }
    }
    for ok in [
        ServerOptimizer::fedavg(),
        ServerOptimizer::fedadam(),
        ServerOptimizer::fedyogi(),
        ServerOptimizer::fedadagrad(),
        ServerOptimizer::adamax(),
        ServerOptimizer::kingma_adam(),
    ] {
        ok.check().unwrap();
    }
}

#[test]
fn adaptive_optimizers_move_towards_a_fixed_mean() {
    // With the clients always agreeing on the same model, every optimizer closes the gap.
    for opt in [
        ServerOptimizer::fedadam(),
        ServerOptimizer::fedyogi(),
        ServerOptimizer::fedadagrad(),
        ServerOptimizer::adamax(),
        ServerOptimizer::kingma_adam(),
        ServerOptimizer::Sgd {
            lr: 0.5,
            momentum: 0.5,
        },
    ] {
        let mut state = ServerOptState::new(opt).unwrap();
        let target = vec2(0.3, -0.2);
        let mut x = vec2(1.0, 1.0);
        let start = x.sq_distance(&target);
        for _ in 0..5 {
            x = state.step(&x, &target).unwrap();
        }
        assert!(x.sq_distance(&target) < start, "{opt:?}");
    }
}
