#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Gaussian-mixture prior (App. J.2): K = 1 is FedAvg, two clusters are recovered, the
//! responsibilities are stable in log space, EM never lowers the likelihood.

use fedfuse_core::Params;
use fedfuse_fuse::{
    FuseError, GaussianMixture, MixtureConfig, responsibilities_from_sq_distances,
    weighted_mean_params,
};

fn model(values: &[f32]) -> Params {
    let mut p = Params::new();
    p.push("fc.weight", vec![values.len() - 1], values[1..].to_vec())
        .unwrap();
    p.push("fc.bias", vec![1], vec![values[0]]).unwrap();
    p
}

/// Deterministic small noise in [-0.5, 0.5).
fn noise(i: usize) -> f32 {
    ((i * 7919 + 13) % 1000) as f32 / 1000.0 - 0.5
}

/// `n` clients around `centre` (4 values each).
fn cluster(centre: f32, n: usize, salt: usize) -> Vec<Params> {
    (0..n)
        .map(|s| {
            let v: Vec<f32> = (0..4).map(|j| centre + noise(salt + 10 * s + j)).collect();
            model(&v)
        })
        .collect()
}

#[test]
fn responsibilities_by_hand() {
    // d = [0, 2], lambda = 1, equal weights: r = [1, e^-1] / (1 + e^-1).
    let r = responsibilities_from_sq_distances(&[0.0, 2.0], &[0.5f64.ln(); 2], 1.0).unwrap();
    let e = (-1f64).exp();
    assert!((r[0] - 1.0 / (1.0 + e)).abs() < 1e-15 && (r[1] - e / (1.0 + e)).abs() < 1e-15);
    // Unequal weights shift the odds by pi_0 / pi_1 = 3: r_0 / r_1 = 3 e.
    let r = responsibilities_from_sq_distances(&[0.0, 2.0], &[0.75f64.ln(), 0.25f64.ln()], 1.0)
        .unwrap();
    assert!((r[0] / r[1] - 3.0 / e).abs() < 1e-12);
}

#[test]
fn responsibilities_ignore_a_common_offset_and_survive_huge_distances() {
    let lw = [(1.0f64 / 3.0).ln(); 3];
    let d = [1.0, 2.5, 4.0];
    let base = responsibilities_from_sq_distances(&d, &lw, 0.7).unwrap();
    for c in [1e3, 1e6, 1e9, 1e12] {
        let shifted: Vec<f64> = d.iter().map(|x| x + c).collect();
        let r = responsibilities_from_sq_distances(&shifted, &lw, 0.7).unwrap();
        for (a, b) in base.iter().zip(&r) {
            // Only the rounding of x + c differs: ~c * 2^-52.
            assert!(
                (a - b).abs() < 1e-15 * c.max(1.0) * 10.0,
                "c = {c}: {base:?} {r:?}"
            );
        }
    }
    // exp(-lambda/2 d) underflows to 0 for every component here; the naive ratio is 0/0.
    let r = responsibilities_from_sq_distances(&[1e300, 1e300], &lw[..2], 1.0).unwrap();
    assert_eq!(r, vec![0.5, 0.5]);
    let r = responsibilities_from_sq_distances(&[f64::MAX, 1e300], &lw[..2], 10.0).unwrap();
    assert_eq!(r, vec![0.0, 1.0]);
    let r = responsibilities_from_sq_distances(&[5e307, 1.7e308], &lw[..2], 1e10).unwrap();
    assert!(r.iter().all(|x| x.is_finite()) && (r.iter().sum::<f64>() - 1.0).abs() < 1e-15);
    // A zero mixing weight is never responsible, even when nearest.
    let r =
        responsibilities_from_sq_distances(&[0.0, 1e6], &[f64::NEG_INFINITY, 0.0], 1.0).unwrap();
    assert_eq!(r, vec![0.0, 1.0]);
    assert!(responsibilities_from_sq_distances(&[0.0, f64::NAN], &lw[..2], 1.0).is_err());
    assert!(responsibilities_from_sq_distances(&[0.0], &[f64::NEG_INFINITY], 1.0).is_err());
    assert!(matches!(
        responsibilities_from_sq_distances(&[0.0], &[0.0], 0.0),
        Err(FuseError::InvalidSetting {
            field: "mixture.lambda",
            ..
        })
    ));
}

#[test]
fn one_component_is_fedavg() {
    let clients = cluster(1.0, 5, 0);
    let weights = [10.0, 3.0, 1.0, 7.0, 2.0];
    let pairs: Vec<(&Params, f64)> = clients.iter().zip(weights).collect();
    let mut mix =
        GaussianMixture::new(vec![model(&[9.0, 9.0, 9.0, 9.0])], MixtureConfig::default()).unwrap();
    let step = mix.em_step(&pairs).unwrap();
    assert!(step.responsibilities.iter().all(|r| r == &vec![1.0]));
    let fedavg = weighted_mean_params(&pairs).unwrap();
    assert_eq!(mix.centres()[0], fedavg);
    assert!(mix.centres()[0].sq_distance(&fedavg) < 1e-12);
}

#[test]
fn two_separated_clusters_are_recovered() {
    let a = cluster(-5.0, 4, 0);
    let b = cluster(5.0, 3, 100);
    // Interleave the clusters so that the order gives no hint.
    let clients: Vec<&Params> = vec![&a[0], &b[0], &a[1], &a[2], &b[1], &b[2], &a[3]];
    let in_a = [true, false, true, true, false, false, true];
    let pairs: Vec<(&Params, f64)> = clients.iter().map(|c| (*c, 1.0)).collect();
    let mut mix =
        GaussianMixture::farthest_point_init(&clients, 2, MixtureConfig::default()).unwrap();
    let mut step = mix.em_step(&pairs).unwrap();
    for _ in 0..3 {
        step = mix.em_step(&pairs).unwrap();
    }
    // Cluster distance ~ 4 * 10^2 = 400 against noise < 4: hard responsibilities.
    let ka = mix.assign(&a[0]).unwrap();
    let kb = 1 - ka;
    for (r, is_a) in step.responsibilities.iter().zip(in_a) {
        let own = if is_a { ka } else { kb };
        assert!(r[own] > 1.0 - 1e-12, "{r:?}");
    }
    for c in &a {
        assert_eq!(mix.assign(c).unwrap(), ka);
    }
    for c in &b {
        assert_eq!(mix.assign(c).unwrap(), kb);
    }
    let mean = |cs: &[Params]| {
        let pairs: Vec<(&Params, f64)> = cs.iter().map(|c| (c, 1.0)).collect();
        weighted_mean_params(&pairs).unwrap()
    };
    assert!(mix.centres()[ka].sq_distance(&mean(&a)) < 1e-10);
    assert!(mix.centres()[kb].sq_distance(&mean(&b)) < 1e-10);
    assert!(mix.weights().iter().all(|w| (w - 0.5).abs() < 1e-15));
}

#[test]
fn learned_weights_follow_the_cluster_sizes() {
    let a = cluster(-5.0, 6, 0);
    let b = cluster(5.0, 2, 100);
    let clients: Vec<&Params> = a.iter().chain(&b).collect();
    let pairs: Vec<(&Params, f64)> = clients.iter().map(|c| (*c, 1.0)).collect();
    let config = MixtureConfig {
        lambda: 1.0,
        learn_weights: true,
    };
    let mut mix = GaussianMixture::farthest_point_init(&clients, 2, config).unwrap();
    mix.em_step(&pairs).unwrap();
    let ka = mix.assign(&a[0]).unwrap();
    let pi = mix.weights();
    assert!(
        (pi[ka] - 0.75).abs() < 1e-9 && (pi[1 - ka] - 0.25).abs() < 1e-9,
        "{pi:?}"
    );
}

#[test]
fn em_never_lowers_the_likelihood() {
    // Overlapping clusters and soft responsibilities (small lambda), both weight modes.
    let clients: Vec<Params> = (0..12)
        .map(|s| {
            let v: Vec<f32> = (0..4)
                .map(|j| 3.0 * noise(31 * s + j) + if s % 3 == 0 { 1.0 } else { -1.0 })
                .collect();
            model(&v)
        })
        .collect();
    let pairs: Vec<(&Params, f64)> = clients
        .iter()
        .enumerate()
        .map(|(s, c)| (c, 1.0 + (s % 4) as f64))
        .collect();
    for learn_weights in [false, true] {
        let config = MixtureConfig {
            lambda: 0.3,
            learn_weights,
        };
        let refs: Vec<&Params> = clients.iter().collect();
        let mut mix = GaussianMixture::farthest_point_init(&refs, 3, config).unwrap();
        let mut ll = mix.log_likelihood(&pairs).unwrap();
        for _ in 0..20 {
            mix.em_step(&pairs).unwrap();
            let next = mix.log_likelihood(&pairs).unwrap();
            // f32 centres: allow their rounding.
            assert!(next >= ll - 1e-5 * ll.abs().max(1.0), "{ll} -> {next}");
            ll = next;
        }
    }
}

#[test]
fn a_component_nobody_supports_is_kept() {
    let clients = cluster(0.0, 3, 0);
    let pairs: Vec<(&Params, f64)> = clients.iter().map(|c| (c, 2.0)).collect();
    let far = model(&[1e6, 1e6, 1e6, 1e6]);
    let mut mix = GaussianMixture::new(
        vec![model(&[0.0, 0.0, 0.0, 0.0]), far.clone()],
        MixtureConfig::default(),
    )
    .unwrap();
    let step = mix.em_step(&pairs).unwrap();
    assert_eq!(step.unchanged, vec![false, true]);
    assert_eq!(step.totals[1], 0.0);
    assert!((step.totals[0] - 6.0).abs() < 1e-12);
    assert_eq!(mix.centres()[1], far);
    assert_eq!(mix.centres()[0], weighted_mean_params(&pairs).unwrap());
}

#[test]
fn inputs_are_checked() {
    let clients = cluster(0.0, 2, 0);
    assert!(matches!(
        GaussianMixture::new(vec![], MixtureConfig::default()),
        Err(FuseError::Empty)
    ));
    let bad_lambda = MixtureConfig {
        lambda: f64::NAN,
        learn_weights: false,
    };
    assert!(matches!(
        GaussianMixture::new(vec![clients[0].clone()], bad_lambda),
        Err(FuseError::InvalidSetting {
            field: "mixture.lambda",
            ..
        })
    ));
    // Duplicates cannot seed two components.
    assert!(
        GaussianMixture::farthest_point_init(
            &[&clients[0], &clients[0]],
            2,
            MixtureConfig::default()
        )
        .is_err()
    );
    assert!(
        GaussianMixture::farthest_point_init(&[&clients[0]], 2, MixtureConfig::default()).is_err()
    );
    let mut mix = GaussianMixture::new(vec![clients[0].clone()], MixtureConfig::default()).unwrap();
    let other = model(&[1.0, 2.0]);
    let err = mix.em_step(&[(&other, 1.0)]).unwrap_err();
    assert!(matches!(err, FuseError::Layout(_)), "{err}");
    assert!(mix.assign(&other).is_err());
    assert!(mix.em_step(&[(&clients[1], -1.0)]).is_err());
    assert!(mix.em_step(&[(&clients[1], 0.0)]).is_err());
    assert!(matches!(mix.em_step(&[]), Err(FuseError::Empty)));
    assert_eq!(mix.centres()[0], clients[0]);
    assert!(mix.set_weights(&[0.0]).is_err());
    assert!(mix.set_weights(&[0.5, 0.5]).is_err());
}
