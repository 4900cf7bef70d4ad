#![allow(clippy::unwrap_used, clippy::expect_used)]
//! PFNM: parity with the reference code, invariance, recovery of a planted network.

use fedfuse_core::Params;
use fedfuse_fuse::{
    DenseLayer, FuseError, FusedMlp, MatchOrder, Matrix, MlpWeights, PfnmConfig, ReplayOrder,
    RngOrder, pfnm_fuse, pfnm_fuse_mlp,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::Value;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures/pfnm");

fn matrix(v: &Value) -> Matrix {
    let rows: Vec<Vec<f64>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    let cols = rows.first().map_or(0, Vec::len);
    Matrix::new(rows.len(), cols, rows.concat()).unwrap()
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Reference layout `[W1 (in x out), b1, W2, b2, ...]` -> PyTorch layout.
fn net_from_reference(tensors: &Value) -> MlpWeights {
    let t = tensors.as_array().unwrap();
    let layers = t
        .chunks(2)
        .map(|wb| DenseLayer {
            weight: matrix(&wb[0]).transpose(),
            bias: vector(&wb[1]),
        })
        .collect();
    MlpWeights { layers }
}

/// A fixture recorded from `layer_group_descent` of
/// IBM/probabilistic-federated-neural-matching `matching/pfnm.py` @ f44cf42
/// (`/work/shared/notes/pfnm-reference.md` §6, `make_fixtures.py`).
struct Fixture {
    f: Value,
    nets: Vec<MlpWeights>,
    counts: Vec<Vec<f64>>,
    orders: Vec<Vec<usize>>,
    cfg: PfnmConfig,
}

const FIXTURE_NAMES: [&str; 4] = [
    "one_layer_it0",
    "one_layer_shared_it3",
    "one_layer_random_it3_small_sigma",
    "two_layer_shared_it2",
];

fn load_fixture(name: &str) -> Fixture {
    let path = format!("{FIXTURES}/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let f: Value = serde_json::from_str(&text).unwrap();
    let nets: Vec<MlpWeights> = f["client_weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(net_from_reference)
        .collect();
    let counts: Vec<Vec<f64>> = f["batch_frequencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(vector)
        .collect();
    let orders: Vec<Vec<usize>> = f["refinement_permutations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            o.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect()
        })
        .collect();
    let cfg = PfnmConfig {
        prior: fedfuse_fuse::MatchPrior {
            sigma: f["sigma"].as_f64().unwrap(),
            sigma0: f["sigma0"].as_f64().unwrap(),
            gamma: f["gamma"].as_f64().unwrap(),
            iters: f["it"].as_u64().unwrap() as usize,
            ..fedfuse_fuse::MatchPrior::default()
        },
        ..PfnmConfig::default()
    };
    Fixture {
        f,
        nets,
        counts,
        orders,
        cfg,
    }
}

/// Replays one fixture and compares with the reference's fused network.
fn check_fixture(name: &str) {
    let Fixture {
        f,
        nets,
        counts,
        orders,
        cfg,
    } = load_fixture(name);
    let mut replay = ReplayOrder::new(orders);
    let fused = pfnm_fuse_mlp(&nets, Some(&counts), &cfg, &mut replay).unwrap();
    assert_eq!(
        replay.remaining(),
        0,
        "{name}: not every recorded order was used"
    );

    let want = net_from_reference(&f["global_weights"]);
    let shapes: Vec<Vec<usize>> = f["global_shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect()
        })
        .collect();
    assert_eq!(
        fused.net.layers.len(),
        want.layers.len(),
        "{name}: layer count"
    );
    let mut max_diff = 0f64;
    for (i, (got, exp)) in fused.net.layers.iter().zip(&want.layers).enumerate() {
        // Reference shapes are (in x out) for weights.
        assert_eq!(
            vec![got.weight.cols(), got.weight.rows()],
            shapes[2 * i],
            "{name}: layer {i} weight shape"
        );
        assert_eq!(
            vec![got.bias.len()],
            shapes[2 * i + 1],
            "{name}: layer {i} bias shape"
        );
        assert_eq!(
            (got.weight.rows(), got.weight.cols()),
            (exp.weight.rows(), exp.weight.cols())
        );
        for (a, b) in got
            .weight
            .data()
            .iter()
            .chain(&got.bias)
            .zip(exp.weight.data().iter().chain(&exp.bias))
        {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    assert!(max_diff <= 1e-6, "{name}: max |diff| {max_diff:e}");
    // Every client unit is assigned, within the global width.
    for (c, layer) in fused.assignments.iter().enumerate() {
        let width = fused.net.layers[c].weight.rows();
        for (j, a) in layer.iter().enumerate() {
            assert_eq!(a.len(), nets[j].layers[c].weight.rows());
            assert!(a.iter().all(|&g| g < width));
        }
    }
    eprintln!(
        "{name}: max |diff| {max_diff:e}, hidden {:?}",
        fused.net.hidden()
    );
}

mod parity {
    use super::check_fixture;

    #[test]
    fn one_layer_it0() {
        check_fixture("one_layer_it0");
    }

    #[test]
    fn one_layer_shared_it3() {
        check_fixture("one_layer_shared_it3");
    }

    #[test]
    fn one_layer_random_it3_small_sigma() {
        check_fixture("one_layer_random_it3_small_sigma");
    }

    #[test]
    fn two_layer_shared_it2() {
        check_fixture("two_layer_shared_it2");
    }
}

fn random_net(rng: &mut StdRng, widths: &[usize], scale: f64) -> MlpWeights {
    let layers = widths
        .windows(2)
        .map(|w| DenseLayer {
            weight: Matrix::new(
                w[1],
                w[0],
                (0..w[0] * w[1])
                    .map(|_| rng.random_range(-scale..scale))
                    .collect(),
            )
            .unwrap(),
            bias: (0..w[1]).map(|_| rng.random_range(-scale..scale)).collect(),
        })
        .collect();
    MlpWeights { layers }
}

/// Hidden unit `perm[u]` of `net` becomes unit `u` (rows of layer 0, columns of layer 1).
fn permute_hidden(net: &MlpWeights, perm: &[usize]) -> MlpWeights {
    let (l0, l1) = (&net.layers[0], &net.layers[1]);
    let d = l0.weight.cols();
    let k = l1.weight.rows();
    let w0: Vec<f64> = perm
        .iter()
        .flat_map(|&u| l0.weight.row(u).to_vec())
        .collect();
    let b0 = perm.iter().map(|&u| l0.bias[u]).collect();
    let w1: Vec<f64> = (0..k)
        .flat_map(|kk| perm.iter().map(move |&u| (kk, u)))
        .map(|(kk, u)| l1.weight.get(kk, u))
        .collect();
    MlpWeights {
        layers: vec![
            DenseLayer {
                weight: Matrix::new(perm.len(), d, w0).unwrap(),
                bias: b0,
            },
            DenseLayer {
                weight: Matrix::new(k, perm.len(), w1).unwrap(),
                bias: l1.bias.clone(),
            },
        ],
    }
}

/// Hidden unit vectors `[W0 row, b0, W1 column]` of a one-hidden-layer net.
fn hidden_units(net: &MlpWeights) -> Vec<Vec<f64>> {
    let (l0, l1) = (&net.layers[0], &net.layers[1]);
    (0..l0.weight.rows())
        .map(|u| {
            let mut v = l0.weight.row(u).to_vec();
            v.push(l0.bias[u]);
            v.extend((0..l1.weight.rows()).map(|k| l1.weight.get(k, u)));
            v
        })
        .collect()
}

mod invariance {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(8))]
        #[test]
        fn permuting_a_clients_units_permutes_global_units(
            seed in 0u64..1000,
            client in 0usize..3,
            sigma in prop::sample::select(vec![0.02, 0.1, 1.0]),
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let widths = [5usize, 4, 6, 3];
            let nets: Vec<MlpWeights> = widths[..3]
                .iter()
                .map(|&h| random_net(&mut rng, &[widths[0], h, widths[3]], 0.5))
                .collect();
            let mut perm: Vec<usize> = (0..nets[client].layers[0].weight.rows()).collect();
            rand::seq::SliceRandom::shuffle(perm.as_mut_slice(), &mut rng);
            let mut permuted = nets.clone();
            permuted[client] = permute_hidden(&nets[client], &perm);
            let cfg = PfnmConfig { prior: fedfuse_fuse::MatchPrior { sigma, iters: 3, ..fedfuse_fuse::MatchPrior::default() }, ..PfnmConfig::default() };
            let orders: Vec<Vec<usize>> = (0..3).map(|i| vec![(i + 1) % 3, i % 3, (i + 2) % 3]).collect();
            let a = pfnm_fuse_mlp(&nets, None, &cfg, &mut ReplayOrder::new(orders.clone())).unwrap();
            let b = pfnm_fuse_mlp(&permuted, None, &cfg, &mut ReplayOrder::new(orders)).unwrap();
            prop_assert_eq!(a.net.hidden(), b.net.hidden());
            prop_assert_eq!(&a.net.layers[1].bias, &b.net.layers[1].bias);
            let (ua, ub) = (hidden_units(&a.net), hidden_units(&b.net));
            let mut used = vec![false; ub.len()];
            for u in &ua {
                let hit = ub.iter().enumerate().position(|(i, v)| {
                    !used[i] && u.iter().zip(v).all(|(x, y)| (x - y).abs() < 1e-9)
                });
                prop_assert!(hit.is_some(), "global unit {:?} has no counterpart", u);
                if let Some(i) = hit {
                    used[i] = true;
                }
            }
        }
    }
}

/// A random `d-h-k` network and `clients` noisy copies, each keeping a random `keep` of its
/// hidden units in random order (noise uniform in ±0.02).
fn planted_clients(
    rng: &mut StdRng,
    [d, h, k]: [usize; 3],
    keep: usize,
    clients: usize,
) -> (MlpWeights, Vec<MlpWeights>) {
    let planted = random_net(rng, &[d, h, k], 1.0);
    let mut nets = Vec::new();
    for _ in 0..clients {
        let mut units: Vec<usize> = (0..h).collect();
        rand::seq::SliceRandom::shuffle(units.as_mut_slice(), rng);
        units.truncate(keep);
        let mut net = permute_hidden(&planted, &units);
        for l in &mut net.layers {
            let noisy: Vec<f64> = l
                .weight
                .data()
                .iter()
                .map(|v| v + rng.random_range(-0.02..0.02))
                .collect();
            l.weight = Matrix::new(l.weight.rows(), l.weight.cols(), noisy).unwrap();
            for b in &mut l.bias {
                *b += rng.random_range(-0.02..0.02);
            }
        }
        nets.push(net);
    }
    (planted, nets)
}

mod recovery {
    use super::*;

    #[test]
    fn noisy_permuted_subsets_fuse_back_to_the_planted_network() {
        let mut rng = StdRng::seed_from_u64(42);
        let (d, h, k, keep, clients) = (12, 10, 4, 7, 8);
        let (planted, nets) = planted_clients(&mut rng, [d, h, k], keep, clients);
        let params: Vec<Params> = nets.iter().map(|n| n.to_params().unwrap()).collect();
        let refs: Vec<&Params> = params.iter().collect();
        let cfg = PfnmConfig {
            prior: fedfuse_fuse::MatchPrior {
                sigma: 0.01,
                ..fedfuse_fuse::MatchPrior::default()
            },
            ..PfnmConfig::default()
        };
        let fused = pfnm_fuse(&refs, None, &cfg, &mut StdRng::seed_from_u64(3)).unwrap();
        let net = MlpWeights::from_params(&fused.params, 0).unwrap();
        assert_eq!(net.hidden(), vec![h]);
        assert_eq!(fused.assignments.len(), 1);
        assert!(fused.assignments[0].iter().all(|a| a.len() == keep));

        // Input side and bias of every planted unit are recovered (the output weights of a
        // unit are shrunk by clients that lack it: absent connections count as zeros).
        let want = hidden_units(&planted);
        let got = hidden_units(&net);
        for w in &want {
            let best = got
                .iter()
                .map(|g| {
                    g[..=d]
                        .iter()
                        .zip(&w[..=d])
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0, f64::max)
                })
                .fold(f64::INFINITY, f64::min);
            assert!(best < 0.05, "planted unit not recovered: max error {best}");
        }
        let max_bias_err = net.layers[1]
            .bias
            .iter()
            .zip(&planted.layers[1].bias)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(max_bias_err < 0.05, "output bias error {max_bias_err}");
    }
}

/// Deep networks: the order in which hidden layers are matched.
mod order {
    use super::*;

    /// The sub-network of `net` made of hidden units `units[c]` (in that order) of every
    /// hidden layer `c`, plus noise uniform in ±`noise` on every weight and bias.
    fn sub_net(net: &MlpWeights, units: &[Vec<usize>], noise: f64, rng: &mut StdRng) -> MlpWeights {
        let n = net.layers.len();
        let d = net.layers[0].weight.cols();
        let all_inputs: Vec<usize> = (0..d).collect();
        let all_classes: Vec<usize> = (0..net.layers[n - 1].weight.rows()).collect();
        let layers = (0..n)
            .map(|i| {
                let rows = units.get(i).unwrap_or(&all_classes);
                let cols = if i == 0 { &all_inputs } else { &units[i - 1] };
                let l = &net.layers[i];
                let w: Vec<f64> = rows
                    .iter()
                    .flat_map(|&r| cols.iter().map(move |&c| (r, c)))
                    .map(|(r, c)| l.weight.get(r, c) + rng.random_range(-noise..noise))
                    .collect();
                DenseLayer {
                    weight: Matrix::new(rows.len(), cols.len(), w).unwrap(),
                    bias: rows
                        .iter()
                        .map(|&r| l.bias[r] + rng.random_range(-noise..noise))
                        .collect(),
                }
            })
            .collect();
        MlpWeights { layers }
    }

    /// Largest error of the recovered incoming weights and bias of each planted unit of
    /// hidden layer 1, reading the fused layer-0 units through their nearest planted unit.
    fn worst_layer1_unit(planted: &MlpWeights, fused: &MlpWeights) -> f64 {
        let nearest = |a: &[f64], rows: &Matrix| -> usize {
            (0..rows.rows())
                .min_by(|&x, &y| {
                    let dist = |r: usize| -> f64 {
                        rows.row(r)
                            .iter()
                            .zip(a)
                            .map(|(p, q)| (p - q).powi(2))
                            .sum()
                    };
                    dist(x).total_cmp(&dist(y))
                })
                .unwrap()
        };
        let (p0, p1, f0, f1) = (
            &planted.layers[0],
            &planted.layers[1],
            &fused.layers[0],
            &fused.layers[1],
        );
        // planted layer-0 unit -> fused layer-0 unit
        let map0: Vec<usize> = (0..p0.weight.rows())
            .map(|u| nearest(p0.weight.row(u), &f0.weight))
            .collect();
        (0..p1.weight.rows())
            .map(|u| {
                (0..f1.weight.rows())
                    .map(|g| {
                        map0.iter()
                            .enumerate()
                            .map(|(v, &gv)| (p1.weight.get(u, v) - f1.weight.get(g, gv)).abs())
                            .fold((p1.bias[u] - f1.bias[g]).abs(), f64::max)
                    })
                    .fold(f64::INFINITY, f64::min)
            })
            .fold(0.0, f64::max)
    }

    fn fuse_in_order(nets: &[MlpWeights], sigma: f64, order: MatchOrder) -> FusedMlp {
        let cfg = PfnmConfig {
            prior: fedfuse_fuse::MatchPrior {
                sigma,
                ..fedfuse_fuse::MatchPrior::default()
            },
            order,
            ..PfnmConfig::default()
        };
        pfnm_fuse_mlp(
            nets,
            None,
            &cfg,
            &mut RngOrder(&mut StdRng::seed_from_u64(3)),
        )
        .unwrap()
    }

    #[test]
    fn bottom_up_tells_top_units_apart_by_their_fan_in() {
        // Planted 12-10-6-2 network whose top hidden units 0 and 1 have the same bias and
        // outgoing weights but different incoming weights: seen through `[bias, outgoing]`
        // (top-down) they are one unit; seen through their fan-in (bottom-up) they are two.
        let mut rng = StdRng::seed_from_u64(11);
        let mut planted = random_net(&mut rng, &[12, 10, 6, 2], 1.0);
        planted.layers[1].bias[1] = planted.layers[1].bias[0];
        for k in 0..2 {
            let w = planted.layers[2].weight.get(k, 0);
            let mut out = planted.layers[2].weight.data().to_vec();
            out[k * 6 + 1] = w;
            planted.layers[2].weight = Matrix::new(2, 6, out).unwrap();
        }
        let nets: Vec<MlpWeights> = (0..8)
            .map(|_| {
                let mut units: Vec<Vec<usize>> = vec![(0..10).collect(), (0..6).collect()];
                for u in &mut units {
                    rand::seq::SliceRandom::shuffle(u.as_mut_slice(), &mut rng);
                }
                sub_net(&planted, &units, 0.02, &mut rng)
            })
            .collect();
        let fuse = |order| fuse_in_order(&nets, 0.01, order);
        let bottom_up = fuse(MatchOrder::BottomUp);
        assert_eq!(bottom_up.net.hidden(), vec![10, 6]);
        let err = worst_layer1_unit(&planted, &bottom_up.net);
        assert!(
            err < 0.05,
            "bottom-up: a top unit recovered with error {err}"
        );
        for layer in &bottom_up.assignments {
            assert!(
                layer
                    .iter()
                    .all(|a| a.len() == a.iter().collect::<std::collections::BTreeSet<_>>().len())
            );
        }

        let top_down = fuse(MatchOrder::TopDown);
        let err = worst_layer1_unit(&planted, &top_down.net);
        assert!(err > 0.2, "top-down recovered the twin units (error {err})");
    }

    #[test]
    fn one_hidden_layer_is_the_same_either_way() {
        let mut rng = StdRng::seed_from_u64(8);
        let nets: Vec<MlpWeights> = [5usize, 4, 6]
            .iter()
            .map(|&h| random_net(&mut rng, &[7, h, 3], 0.5))
            .collect();
        let fuse = |order| fuse_in_order(&nets, 0.1, order);
        let (a, b) = (fuse(MatchOrder::TopDown), fuse(MatchOrder::BottomUp));
        assert_eq!(a.net, b.net);
        assert_eq!(a.assignments, b.assignments);
    }
}

mod errors {
    use super::*;

    #[test]
    fn mismatched_inputs_name_the_client() {
        let mut rng = StdRng::seed_from_u64(0);
        let a = random_net(&mut rng, &[4, 3, 2], 1.0).to_params().unwrap();
        let b = random_net(&mut rng, &[5, 3, 2], 1.0).to_params().unwrap();
        let err = pfnm_fuse(&[&a, &b], None, &PfnmConfig::default(), &mut rng).unwrap_err();
        assert!(err.to_string().contains("client 1"), "{err}");

        let mut c = Params::new();
        c.push("layers.0.weight", vec![3, 4], vec![0.0; 12])
            .unwrap();
        c.push("layers.0.bias", vec![2], vec![0.0; 2]).unwrap();
        let err = pfnm_fuse(&[&a, &c], None, &PfnmConfig::default(), &mut rng).unwrap_err();
        assert!(err.to_string().contains("client 1") && err.to_string().contains("layers.0.bias"));

        let bad = PfnmConfig {
            prior: fedfuse_fuse::MatchPrior {
                sigma: 0.0,
                ..fedfuse_fuse::MatchPrior::default()
            },
            ..PfnmConfig::default()
        };
        assert!(pfnm_fuse(&[&a], None, &bad, &mut rng).is_err());
        for eps in [-1e-3, f64::NAN, f64::INFINITY] {
            let bad = PfnmConfig {
                eps,
                ..PfnmConfig::default()
            };
            let err = pfnm_fuse(&[&a], None, &bad, &mut rng).unwrap_err();
            assert!(
                matches!(err, FuseError::InvalidSetting { field: "eps", .. }),
                "{err}"
            );
        }
        let err = pfnm_fuse(
            &[&a, &a],
            Some(&[vec![1.0, 0.0], vec![2.0, 0.0]]),
            &PfnmConfig::default(),
            &mut rng,
        )
        .unwrap_err();
        assert!(err.to_string().contains("class 1"), "{err}");
    }

    /// Hand-built `MlpWeights` are checked too (they skip `from_params`).
    #[test]
    fn inconsistent_or_non_finite_weights_are_errors() {
        let mut rng = StdRng::seed_from_u64(1);
        let good = random_net(&mut rng, &[4, 3, 2], 1.0);
        let mut chained_wrong = random_net(&mut rng, &[4, 3, 2], 1.0);
        chained_wrong.layers[1].weight = Matrix::new(2, 5, vec![0.0; 10]).unwrap();
        let err = pfnm_fuse_mlp(
            &[good.clone(), chained_wrong],
            None,
            &PfnmConfig::default(),
            &mut RngOrder(&mut rng),
        )
        .unwrap_err();
        assert!(err.to_string().contains("client 1: layer 1"), "{err}");

        let mut nan = good.clone();
        nan.layers[0].bias[2] = f64::NAN;
        let err = pfnm_fuse_mlp(
            &[good, nan],
            None,
            &PfnmConfig::default(),
            &mut RngOrder(&mut rng),
        )
        .unwrap_err();
        assert!(err.to_string().contains("non-finite"), "{err}");
    }

    #[test]
    fn params_round_trip_and_two_hidden_layers() {
        let mut rng = StdRng::seed_from_u64(5);
        let nets: Vec<Params> = [6usize, 5, 7]
            .iter()
            .map(|&h| {
                random_net(&mut rng, &[8, h, 4, 3], 0.5)
                    .to_params()
                    .unwrap()
            })
            .collect();
        let refs: Vec<&Params> = nets.iter().collect();
        let cfg = PfnmConfig {
            prior: fedfuse_fuse::MatchPrior {
                sigma: 0.1,
                iters: 2,
                ..fedfuse_fuse::MatchPrior::default()
            },
            ..PfnmConfig::default()
        };
        let fused = pfnm_fuse(
            &refs,
            Some(&[vec![1.0; 3], vec![2.0; 3], vec![0.0, 1.0, 1.0]]),
            &cfg,
            &mut rng,
        )
        .unwrap();
        let names: Vec<&str> = fused.params.names().iter().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.0.bias",
                "layers.1.weight",
                "layers.1.bias",
                "layers.2.weight",
                "layers.2.bias"
            ]
        );
        let net = MlpWeights::from_params(&fused.params, 0).unwrap();
        let hidden = net.hidden();
        assert_eq!(net.layers[0].weight.cols(), 8);
        assert_eq!(net.layers[2].weight.rows(), 3);
        assert_eq!(fused.assignments.len(), 2);
        for (c, layer) in fused.assignments.iter().enumerate() {
            for a in layer {
                assert!(a.iter().all(|&g| g < hidden[c]));
                let mut s = a.clone();
                s.sort_unstable();
                s.dedup();
                assert_eq!(
                    s.len(),
                    a.len(),
                    "two units of one client share a global unit"
                );
            }
        }
    }
}

/// GPI-FNM: PFNM score minus `eps` times the cost of eq. 11 of Xiao & Cheng.
mod gpi {
    use super::*;

    fn same_bits(a: &FusedMlp, b: &FusedMlp) -> bool {
        let bits = |f: &FusedMlp| -> Vec<u64> {
            f.net
                .layers
                .iter()
                .flat_map(|l| l.weight.data().iter().chain(&l.bias).map(|v| v.to_bits()))
                .collect()
        };
        a.assignments == b.assignments && a.net.hidden() == b.net.hidden() && bits(a) == bits(b)
    }

    /// `eps = 0` is plain PFNM (the parity tests check it against the reference), and the
    /// GPI-FNM code path itself, at the smallest positive `eps`, gives the same bits: the term is
    /// purely added to PFNM's arithmetic. That comparison alone would also pass if `eps` were
    /// ignored, so each input must change under `eps = 2` (measured: `eps = 1` leaves
    /// `one_layer_shared_it3` as it is; 2 changes the fused weights of all ten inputs, the
    /// width of five).
    #[test]
    fn eps_zero_is_pfnm_bit_for_bit() {
        assert_eq!(
            PfnmConfig::default().eps,
            0.0,
            "the default is documented as PFNM"
        );
        let tiny = f64::from_bits(1); // 5e-324: every eps * cost product underflows to 0
        for name in FIXTURE_NAMES {
            let fx = load_fixture(name);
            let run = |eps: f64| {
                let cfg = PfnmConfig {
                    eps,
                    ..fx.cfg.clone()
                };
                let mut replay = ReplayOrder::new(fx.orders.clone());
                pfnm_fuse_mlp(&fx.nets, Some(&fx.counts), &cfg, &mut replay).unwrap()
            };
            let pfnm = run(0.0);
            assert!(same_bits(&pfnm, &run(tiny)), "{name}: GPI path at eps -> 0");
            assert!(
                !same_bits(&pfnm, &run(2.0)),
                "{name}: eps 2 changed nothing"
            );
        }
        for seed in 0..6u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let widths: &[usize] = if seed % 2 == 0 {
                &[20, 8, 5]
            } else {
                &[20, 8, 6, 4]
            };
            let nets: Vec<MlpWeights> = (0..5).map(|_| random_net(&mut rng, widths, 0.5)).collect();
            let k = widths[widths.len() - 1];
            let counts: Vec<Vec<f64>> = (0..5)
                .map(|_| (0..k).map(|_| rng.random_range(1.0..10.0)).collect())
                .collect();
            let sigma = [0.02, 0.1, 1.0][seed as usize % 3];
            let run = |eps: f64| {
                let cfg = PfnmConfig {
                    prior: fedfuse_fuse::MatchPrior {
                        sigma,
                        iters: 3,
                        ..fedfuse_fuse::MatchPrior::default()
                    },
                    eps,
                    ..PfnmConfig::default()
                };
                let mut orders = StdRng::seed_from_u64(seed + 100);
                pfnm_fuse_mlp(&nets, Some(&counts), &cfg, &mut RngOrder(&mut orders)).unwrap()
            };
            let pfnm = run(0.0);
            assert!(
                same_bits(&pfnm, &run(tiny)),
                "seed {seed}: GPI path at eps -> 0"
            );
            assert!(
                !same_bits(&pfnm, &run(2.0)),
                "seed {seed}: eps 2 changed nothing"
            );
        }
    }

    /// Two clients with one identical hidden unit `v = [1, -1, 1 | bias 1 | outgoing 0, 0]`,
    /// prior mean 0 (`bias_mean: 0`), `t = 1/sigma0 = 1`, `s = 1/sigma = 100`, `x = s v`,
    /// `|v|^2 = 4` (the zero outgoing weights add nothing to either score). Client 1 chooses
    /// between joining client 0's unit (`eta = x`, `lambda = t + s`) and opening a new one:
    ///
    /// - PFNM favours joining by `|x|^2 (4/(t+2s) - 2/(t+s)) + 0 (popularity ln(1/1)) - 2
    ///   ln(gamma/J) = 2 t s^2 |v|^2 / ((t+2s)(t+s)) + 2 ln 2 = 3.941 + 1.386 = 5.327`;
    /// - GPI-FNM charges joining `Q(2x, t+2s) - Q(x, t+s) = 8 s |x|^2/(t+2s)^2 - s |x|^2/(t+s)^2`
    ///   and a new unit `Q(x, t+s) = s |x|^2/(t+s)^2`, i.e. joining costs `2 s t |x|^2 (3t +
    ///   4s) / ((t+2s)^2 (t+s)^2) = 7.823` more.
    ///
    /// So the clients merge while `eps < 5.327 / 7.823 = 0.681` and stay apart above it.
    #[test]
    fn eps_splits_identical_units_above_a_hand_computed_threshold() {
        let unit = MlpWeights {
            layers: vec![
                DenseLayer {
                    weight: Matrix::new(1, 3, vec![1.0, -1.0, 1.0]).unwrap(),
                    bias: vec![1.0],
                },
                DenseLayer {
                    weight: Matrix::new(2, 1, vec![0.0, 0.0]).unwrap(),
                    bias: vec![0.0, 0.0],
                },
            ],
        };
        let nets = [unit.clone(), unit];
        let width = |eps: f64| {
            let cfg = PfnmConfig {
                prior: fedfuse_fuse::MatchPrior {
                    sigma: 0.01,
                    ..fedfuse_fuse::MatchPrior::default()
                },
                bias_mean: 0.0,
                eps,
                ..PfnmConfig::default()
            };
            let mut orders = StdRng::seed_from_u64(0);
            pfnm_fuse_mlp(&nets, None, &cfg, &mut RngOrder(&mut orders))
                .unwrap()
                .net
                .hidden()[0]
        };
        for (eps, want) in [(0.0, 1), (0.67, 1), (0.69, 2), (1.0, 2)] {
            assert_eq!(width(eps), want, "eps {eps}");
        }
    }

    /// On the planted example of `recovery` (PFNM finds the 10 planted units): the GPI term
    /// charges a global unit for its members' distance from the prior mean. Joining a like
    /// unit costs more than opening a shrunk new one, so a moderate eps opens more units; a
    /// large eps instead merges unlike units whose means cancel, down to the widest client's
    /// 7 units, and the fused units are pulled to the prior mean (0 for weights).
    #[test]
    fn eps_changes_the_width_of_a_planted_network() {
        let mut rng = StdRng::seed_from_u64(42);
        let (d, h, k, keep, clients) = (12, 10, 4, 7, 8);
        let (planted, nets) = planted_clients(&mut rng, [d, h, k], keep, clients);
        let fuse = |eps: f64| {
            let cfg = PfnmConfig {
                prior: fedfuse_fuse::MatchPrior {
                    sigma: 0.01,
                    ..fedfuse_fuse::MatchPrior::default()
                },
                eps,
                ..PfnmConfig::default()
            };
            pfnm_fuse_mlp(
                &nets,
                None,
                &cfg,
                &mut RngOrder(&mut StdRng::seed_from_u64(3)),
            )
            .unwrap()
        };
        // Mean |w| of the input weights.
        let size = |n: &MlpWeights| {
            let w = n.layers[0].weight.data();
            w.iter().map(|v| v.abs()).sum::<f64>() / w.len() as f64
        };
        let pfnm = fuse(0.0);
        assert_eq!(pfnm.net.hidden(), vec![h]);
        let moderate = fuse(1.0);
        assert!(
            moderate.net.hidden()[0] > h,
            "eps 1: {:?}",
            moderate.net.hidden()
        );
        for eps in [5.0, 50.0] {
            let large = fuse(eps);
            assert_eq!(large.net.hidden(), vec![keep], "eps {eps}");
            assert!(
                size(&large.net) < 0.5 * size(&planted),
                "eps {eps}: mean |w| {} vs planted {}",
                size(&large.net),
                size(&planted)
            );
        }
        assert!((size(&pfnm.net) - size(&planted)).abs() < 0.05 * size(&planted));
    }
}
