//! Matching over the channels of layer-list models: a permutation through the unit map keeps
//! the function; fusing permuted copies of a network gives it back (PFNM, GPI-FNM, weight
//! matching); refused lists name the layer; PFNM's posterior on a hand-computed case.

use fedfuse_core::layers::{self, FeatureShape, LayerSpec, TensorRole, unit_uses};
use fedfuse_core::{BlockNorm, Params};
use fedfuse_fuse::{
    FuseError, MatchOrder, PfnmConfig, WeightMatchingConfig, permute_units, pfnm_fuse_layers,
    weight_matching_fuse,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

/// One sample between layers: feature maps `[c, h, w]` or a flat vector, row-major.
enum X {
    Image(usize, usize, usize, Vec<f64>),
    Flat(Vec<f64>),
}

/// A plain forward pass in eval mode (conv, pools, batch norm on running statistics, ReLU,
/// dropout as identity, flatten, linear): the reference the invariance tests run.
pub(crate) fn forward(
    input: &[usize],
    layers: &[LayerSpec],
    p: &Params,
    sample: &[f64],
) -> Vec<f64> {
    let t = |name: String| {
        p.get(&name)
            .unwrap_or_else(|| panic!("{name}"))
            .data
            .iter()
            .map(|&v| f64::from(v))
            .collect::<Vec<f64>>()
    };
    let mut x = match *input {
        [c, h, w] => X::Image(c, h, w, sample.to_vec()),
        _ => X::Flat(sample.to_vec()),
    };
    for (i, layer) in layers.iter().enumerate() {
        x = match (layer, x) {
            (
                &LayerSpec::Conv2d {
                    out,
                    kernel: k,
                    stride,
                    padding,
                    groups: 1,
                    bias,
                },
                X::Image(c, h, w, v),
            ) => {
                let b = bias.then(|| t(format!("{i}.bias")));
                conv2d(
                    (c, h, w, &v),
                    &t(format!("{i}.weight")),
                    b.as_deref(),
                    out,
                    k,
                    stride,
                    padding,
                )
            }
            (
                l @ (LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. }),
                X::Image(c, h, w, v),
            ) => {
                let block = l.block().unwrap();
                let (out, stride, norm, groups) =
                    (block.out, block.stride, block.norm, block.groups);
                let bias =
                    |name: &str| (norm == BlockNorm::None).then(|| t(format!("{i}.{name}.bias")));
                let normed = |x: X, name: &str| match norm {
                    BlockNorm::None => x,
                    BlockNorm::Batch => batch_norm(
                        x,
                        &t(format!("{i}.{name}.weight")),
                        &t(format!("{i}.{name}.bias")),
                        &t(format!("{i}.{name}.running_mean")),
                        &t(format!("{i}.{name}.running_var")),
                        1e-5,
                    ),
                    BlockNorm::Group => group_norm(
                        x,
                        groups,
                        &t(format!("{i}.{name}.weight")),
                        &t(format!("{i}.{name}.bias")),
                        1e-5,
                    ),
                };
                let mut y = X::Image(c, h, w, v.clone());
                for (k, conv) in block.convs.iter().enumerate() {
                    let X::Image(yc, yh, yw, yv) = y else {
                        unreachable!()
                    };
                    let name = format!("conv{}", k + 1);
                    y = normed(
                        conv2d(
                            (yc, yh, yw, &yv),
                            &t(format!("{i}.{name}.weight")),
                            bias(&name).as_deref(),
                            conv.rows,
                            conv.kernel,
                            conv.stride,
                            conv.kernel / 2,
                        ),
                        &format!("bn{}", k + 1),
                    );
                    if k + 1 < block.convs.len() {
                        y = relu(y);
                    }
                }
                let short = if block.has_projection(c) {
                    normed(
                        conv2d(
                            (c, h, w, &v),
                            &t(format!("{i}.shortcut.0.weight")),
                            bias("shortcut.0").as_deref(),
                            out,
                            1,
                            stride,
                            0,
                        ),
                        "shortcut.1",
                    )
                } else {
                    X::Image(c, h, w, v)
                };
                match (y, short) {
                    (X::Image(c, h, w, a), X::Image(_, _, _, b)) => relu(X::Image(
                        c,
                        h,
                        w,
                        a.iter().zip(&b).map(|(x, y)| x + y).collect(),
                    )),
                    _ => unreachable!(),
                }
            }
            (&LayerSpec::LayerNorm { eps }, x) => {
                let (scale, shift) = (t(format!("{i}.weight")), t(format!("{i}.bias")));
                let v = match &x {
                    X::Image(_, _, _, v) | X::Flat(v) => v.clone(),
                };
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let var = v.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / v.len() as f64;
                let y: Vec<f64> = v
                    .iter()
                    .enumerate()
                    .map(|(q, a)| (a - mean) / (var + eps).sqrt() * scale[q] + shift[q])
                    .collect();
                match x {
                    X::Image(c, h, w, _) => X::Image(c, h, w, y),
                    X::Flat(_) => X::Flat(y),
                }
            }
            (&LayerSpec::GroupNorm { groups, eps }, x) => group_norm(
                x,
                groups,
                &t(format!("{i}.weight")),
                &t(format!("{i}.bias")),
                eps,
            ),
            (
                &(LayerSpec::MaxPool2d { kernel, stride, .. }
                | LayerSpec::AvgPool2d { kernel, stride }),
                X::Image(c, h, w, v),
            ) => {
                let s = stride.unwrap_or(kernel);
                let p = match *layer {
                    LayerSpec::MaxPool2d { padding, .. } => padding,
                    _ => 0,
                };
                let (oh, ow) = ((h + 2 * p - kernel) / s + 1, (w + 2 * p - kernel) / s + 1);
                let max = matches!(layer, LayerSpec::MaxPool2d { .. });
                let mut y = Vec::with_capacity(c * oh * ow);
                for ci in 0..c {
                    for (yy, xx) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
                        // Padded places (max-pool only) are left out: -inf never wins.
                        let window = (0..kernel).flat_map(|dy| {
                            let v = &v;
                            (0..kernel).filter_map(move |dx| {
                                let (r, q) =
                                    ((yy * s + dy).checked_sub(p)?, (xx * s + dx).checked_sub(p)?);
                                (r < h && q < w).then(|| v[(ci * h + r) * w + q])
                            })
                        });
                        y.push(if max {
                            window.fold(f64::NEG_INFINITY, f64::max)
                        } else {
                            window.sum::<f64>() / (kernel * kernel) as f64
                        });
                    }
                }
                X::Image(c, oh, ow, y)
            }
            (LayerSpec::GlobalAvgpool, X::Image(c, h, w, v)) => X::Image(
                c,
                1,
                1,
                v.chunks(h * w)
                    .map(|ch| ch.iter().sum::<f64>() / (h * w) as f64)
                    .collect(),
            ),
            (&(LayerSpec::BatchNorm2d { eps, .. } | LayerSpec::BatchNorm1d { eps, .. }), x) => {
                batch_norm(
                    x,
                    &t(format!("{i}.weight")),
                    &t(format!("{i}.bias")),
                    &t(format!("{i}.running_mean")),
                    &t(format!("{i}.running_var")),
                    eps,
                )
            }
            (LayerSpec::Relu, X::Image(c, h, w, v)) => {
                X::Image(c, h, w, v.into_iter().map(|a| a.max(0.0)).collect())
            }
            (LayerSpec::Relu, X::Flat(v)) => X::Flat(v.into_iter().map(|a| a.max(0.0)).collect()),
            (LayerSpec::Dropout { .. }, x) => x,
            (LayerSpec::Flatten, X::Image(_, _, _, v)) => X::Flat(v),
            (&LayerSpec::Linear { out, bias }, X::Flat(v)) => {
                let wt = t(format!("{i}.weight"));
                let b = if bias {
                    t(format!("{i}.bias"))
                } else {
                    vec![0.0; out]
                };
                X::Flat(
                    (0..out)
                        .map(|o| {
                            b[o] + wt[o * v.len()..(o + 1) * v.len()]
                                .iter()
                                .zip(&v)
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                        })
                        .collect(),
                )
            }
            (l, _) => panic!("the reference forward has no {l:?} here"),
        };
    }
    match x {
        X::Flat(v) | X::Image(_, _, _, v) => v,
    }
}

/// A convolution of one sample `[c, h, w]` (groups 1, zero padding).
fn conv2d(
    (c, h, w, v): (usize, usize, usize, &[f64]),
    wt: &[f64],
    b: Option<&[f64]>,
    out: usize,
    k: usize,
    stride: usize,
    padding: usize,
) -> X {
    let (oh, ow) = (
        (h + 2 * padding - k) / stride + 1,
        (w + 2 * padding - k) / stride + 1,
    );
    let mut y = vec![0.0; out * oh * ow];
    for o in 0..out {
        for (yy, xx) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
            let mut s = b.map_or(0.0, |b| b[o]);
            for ci in 0..c {
                for (dy, dx) in (0..k).flat_map(|a| (0..k).map(move |b| (a, b))) {
                    let (sy, sx) = (yy * stride + dy, xx * stride + dx);
                    if sy < padding || sx < padding {
                        continue;
                    }
                    let (sy, sx) = (sy - padding, sx - padding);
                    if sy >= h || sx >= w {
                        continue;
                    }
                    s += wt[((o * c + ci) * k + dy) * k + dx] * v[(ci * h + sy) * w + sx];
                }
            }
            y[(o * oh + yy) * ow + xx] = s;
        }
    }
    X::Image(out, oh, ow, y)
}

/// Batch norm on running statistics.
fn batch_norm(x: X, scale: &[f64], shift: &[f64], mean: &[f64], var: &[f64], eps: f64) -> X {
    let norm = |v: Vec<f64>, per: usize| -> Vec<f64> {
        v.iter()
            .enumerate()
            .map(|(q, &a)| {
                let ch = q / per;
                (a - mean[ch]) / (var[ch] + eps).sqrt() * scale[ch] + shift[ch]
            })
            .collect()
    };
    match x {
        X::Image(c, h, w, v) => X::Image(c, h, w, norm(v, h * w)),
        X::Flat(v) => X::Flat(norm(v, 1)),
    }
}

/// Group norm of one sample: each group of channels to mean 0 and variance 1 (biased), then
/// the channel's scale and shift.
fn group_norm(x: X, groups: usize, scale: &[f64], shift: &[f64], eps: f64) -> X {
    let X::Image(c, h, w, v) = x else {
        panic!("group norm of flat features")
    };
    let per = c / groups * h * w;
    let mut y = v.clone();
    for g in 0..groups {
        let part = &v[g * per..(g + 1) * per];
        let mean = part.iter().sum::<f64>() / per as f64;
        let var = part.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / per as f64;
        for (q, out) in y[g * per..(g + 1) * per].iter_mut().enumerate() {
            let ch = (g * per + q) / (h * w);
            *out = (*out - mean) / (var + eps).sqrt() * scale[ch] + shift[ch];
        }
    }
    X::Image(c, h, w, y)
}

fn relu(x: X) -> X {
    match x {
        X::Image(c, h, w, v) => X::Image(c, h, w, v.into_iter().map(|a| a.max(0.0)).collect()),
        X::Flat(v) => X::Flat(v.into_iter().map(|a| a.max(0.0)).collect()),
    }
}

/// Random tensors for `layers`: weights in (-1, 1), norm scales in (0.5, 1.5), running
/// variances in (0.5, 2), counters 7.
pub(crate) fn random_params(input: &[usize], layers: &[LayerSpec], rng: &mut StdRng) -> Params {
    let (_, layout) = layers::chain(FeatureShape::of(input).unwrap(), layers).unwrap();
    let affine = layers::norm_affine_names(input, layers).unwrap();
    let mut p = Params::new();
    for s in layout {
        let n: usize = s.shape.iter().product();
        let range = match TensorRole::of(&s.name) {
            TensorRole::Counter => 7.0..7.0001,
            TensorRole::Stat if s.name.ends_with("running_var") => 0.5..2.0,
            TensorRole::Stat => -0.5..0.5,
            TensorRole::Param if affine.contains(&s.name) && s.name.ends_with("weight") => 0.5..1.5,
            TensorRole::Param => -1.0..1.0,
        };
        let data = (0..n)
            .map(|_| {
                let v: f32 = rng.random_range(range.clone());
                if TensorRole::of(&s.name) == TensorRole::Counter {
                    v.floor()
                } else {
                    v
                }
            })
            .collect();
        p.push(s.name, s.shape, data).unwrap();
    }
    p
}

/// conv(w1, 3x3, pad 1) [bn] relu pool(2) conv(w2, 2x2) [bn] relu flatten linear(w3) [bn1d]
/// relu linear(3) on 2x6x6 inputs.
fn conv_net(widths: [usize; 3], norms: [bool; 3], max_pool: bool) -> Vec<LayerSpec> {
    let [bn1, bn2, bn3] = norms;
    let bn = |on: bool| on.then(LayerSpec::batch_norm2d);
    let pool = if max_pool {
        LayerSpec::max_pool(2)
    } else {
        LayerSpec::AvgPool2d {
            kernel: 2,
            stride: None,
        }
    };
    let mut l = vec![LayerSpec::conv2d(widths[0], 3).with_padding(1)];
    l.extend(bn(bn1));
    l.extend([LayerSpec::Relu, pool, LayerSpec::conv2d(widths[1], 2)]);
    l.extend(bn(bn2));
    l.extend([
        LayerSpec::Relu,
        LayerSpec::Flatten,
        LayerSpec::linear(widths[2]),
    ]);
    l.extend(bn3.then_some(LayerSpec::BatchNorm1d {
        eps: 1e-5,
        momentum: 0.1,
    }));
    l.extend([
        LayerSpec::Relu,
        LayerSpec::Dropout { p: 0.5 },
        LayerSpec::linear(3),
    ]);
    l
}

const INPUT: [usize; 3] = [2, 6, 6];

fn samples(rng: &mut StdRng, n: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|_| (0..72).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect()
}

fn logits(layers: &[LayerSpec], p: &Params, xs: &[Vec<f64>]) -> Vec<f64> {
    xs.iter()
        .flat_map(|x| forward(&INPUT, layers, p, x))
        .collect()
}

/// A tensor's values in f64, for comparisons.
pub(crate) fn f64s(data: &[f32]) -> Vec<f64> {
    data.iter().map(|&v| f64::from(v)).collect()
}

pub(crate) fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    let scale = b.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (q, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * scale, "{what}[{q}]: {x} vs {y}");
    }
    assert_eq!(a.len(), b.len(), "{what}");
}

/// Every matched layer's units permuted at random (through the unit map); the permutations.
fn permuted(layers: &[LayerSpec], p: &Params, rng: &mut StdRng) -> (Params, Vec<Vec<usize>>) {
    let mut q = p.clone();
    let mut perms = Vec::new();
    for uses in unit_uses(&INPUT, layers).unwrap() {
        let mut perm: Vec<usize> = (0..uses.units).collect();
        perm.shuffle(rng);
        permute_units(&mut q, &uses, &perm).unwrap();
        perms.push(perm);
    }
    (q, perms)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Permuting every matched layer's channels through the unit map (filters, biases, norm
    /// channels, the next convolution's input channels, the flatten blocks of the first linear
    /// layer) leaves the logits unchanged.
    #[test]
    fn permuting_channels_through_the_map_keeps_the_logits(
        w1 in 1usize..5, w2 in 1usize..5, w3 in 1usize..6,
        norms in any::<[bool; 3]>(), max_pool in any::<bool>(), seed in any::<u64>(),
    ) {
        let layers = conv_net([w1, w2, w3], norms, max_pool);
        let mut rng = StdRng::seed_from_u64(seed);
        let p = random_params(&INPUT, &layers, &mut rng);
        let xs = samples(&mut rng, 3);
        let (q, perms) = permuted(&layers, &p, &mut rng);
        let (a, b) = (logits(&layers, &q, &xs), logits(&layers, &p, &xs));
        assert_close(&a, &b, 1e-9, "logits");
        // The permutation moved something whenever a layer has two units.
        if perms.iter().any(|perm| perm.iter().enumerate().any(|(u, &v)| u != v)) {
            prop_assert!(q != p);
        }
    }
}

/// The model, two permuted copies of it, and the permutations.
fn copies(
    widths: [usize; 3],
    norms: [bool; 3],
    seed: u64,
) -> (Vec<LayerSpec>, Vec<Params>, Vec<Vec<Vec<usize>>>) {
    let layers = conv_net(widths, norms, true);
    let mut rng = StdRng::seed_from_u64(seed);
    let p = random_params(&INPUT, &layers, &mut rng);
    let (a, pa) = permuted(&layers, &p, &mut rng);
    let (b, pb) = permuted(&layers, &p, &mut rng);
    let ident = pa.iter().map(|perm| (0..perm.len()).collect()).collect();
    (layers, vec![p, a, b], vec![ident, pa, pb])
}

/// Client `j`'s unit `perm[u]` is unit `u` of the model: matched to fused unit `u`.
pub(crate) fn assert_recovered(assignments: &[Vec<Vec<usize>>], perms: &[Vec<Vec<usize>>]) {
    for (g, per_client) in assignments.iter().enumerate() {
        for (j, asg) in per_client.iter().enumerate() {
            for (u, &local) in perms[j][g].iter().enumerate() {
                assert_eq!(asg[local], u, "layer {g}, client {j}, unit {u}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A network and two copies with every matched layer permuted: PFNM, GPI-FNM (eps > 0)
    /// and weight matching pair every unit with its copies, keep the widths and give the
    /// network back (PFNM's up to the prior's shrinkage, a factor near 1 / (1 + sigma / 3)).
    #[test]
    fn fusing_permuted_copies_gives_the_network_back(
        w1 in 1usize..6, w2 in 1usize..6, w3 in 1usize..7,
        norms in any::<[bool; 3]>(), seed in any::<u64>(),
    ) {
        let (layers, clients, perms) = copies([w1, w2, w3], norms, seed);
        let refs: Vec<&Params> = clients.iter().collect();
        let xs = samples(&mut StdRng::seed_from_u64(seed ^ 1), 4);
        let want = logits(&layers, &clients[0], &xs);
        let counts = vec![
            vec![10.0, 20.0, 30.0],
            vec![5.0, 5.0, 5.0],
            vec![1.0, 0.0, 9.0],
        ];
        for eps in [0.0, 0.5] {
            let cfg = PfnmConfig { prior: fedfuse_fuse::MatchPrior { sigma: 1e-4, ..fedfuse_fuse::MatchPrior::default() }, eps, order: MatchOrder::BottomUp, ..PfnmConfig::default() };
            let mut rng = StdRng::seed_from_u64(seed);
            let fused =
                pfnm_fuse_layers(&INPUT, &layers, &refs, Some(&counts), &cfg, &mut rng).unwrap();
            prop_assert_eq!(&fused.layers, &layers, "eps {}: widths", eps);
            assert_recovered(&fused.assignments, &perms);
            let got = logits(&fused.layers, &fused.params, &xs);
            assert_close(&got, &want, 1e-3, &format!("eps {eps}: logits"));
            // Client 0 opens the fused units in its order: the fused model is client 0's.
            for (name, t) in clients[0].iter() {
                let f = fused.params.get(name).unwrap();
                let (want, got) = (f64s(&t.data), f64s(&f.data));
                assert_close(&got, &want, 1e-3, name);
            }
        }
        let cfg = WeightMatchingConfig::default();
        let mut rng = StdRng::seed_from_u64(seed);
        let fused =
            weight_matching_fuse(&INPUT, &layers, &refs, Some(&counts), &cfg, &mut rng).unwrap();
        prop_assert_eq!(&fused.layers, &layers);
        assert_recovered(&fused.assignments, &perms);
        // The mean of three copies of each value: the model itself.
        for (name, t) in clients[0].iter() {
            prop_assert_eq!(fused.params.get(name).unwrap(), t, "{}", name);
        }
    }
}

/// Weight matching aligns each client to client 0, then averages: on two clients whose
/// filters are client 0's swapped and scaled, the fused filters are the example-weighted means.
#[test]
fn weight_matching_averages_aligned_units() {
    // conv(2, 1x1) relu flatten linear(1) on one pixel: filter u is w[u], read by v[u].
    let layers = [
        LayerSpec::conv2d(2, 1),
        LayerSpec::Relu,
        LayerSpec::Flatten,
        LayerSpec::linear(1),
    ];
    let net = |w: [f32; 2], b: [f32; 2], v: [f32; 2], c: f32| {
        let mut p = Params::new();
        p.push("0.weight", vec![2, 1, 1, 1], w.to_vec()).unwrap();
        p.push("0.bias", vec![2], b.to_vec()).unwrap();
        p.push("3.weight", vec![1, 2], v.to_vec()).unwrap();
        p.push("3.bias", vec![1], vec![c]).unwrap();
        p
    };
    let a = net([1.0, -2.0], [0.5, 0.0], [3.0, 1.0], 0.25);
    // Client 1: client 0's units swapped, values doubled.
    let b = net([-4.0, 2.0], [0.0, 1.0], [2.0, 6.0], 0.75);
    let counts = vec![vec![3.0], vec![1.0]];
    let fused = weight_matching_fuse(
        &[1, 1, 1],
        &layers,
        &[&a, &b],
        Some(&counts),
        &WeightMatchingConfig::default(),
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap();
    assert_eq!(fused.assignments, vec![vec![vec![0, 1], vec![1, 0]]]);
    // (3 a + 1 b) / 4 with b = 2 a: 1.25 a.
    let data = |n: &str| fused.params.get(n).unwrap().data.clone();
    assert_eq!(data("0.weight"), [1.25, -2.5]);
    assert_eq!(data("0.bias"), [0.625, 0.0]);
    assert_eq!(data("3.weight"), [3.75, 1.25]);
    assert_eq!(data("3.bias"), [0.375]);
}

/// PFNM's posteriors on a case worked by hand. Two clients, one conv layer of two 1x1 filters
/// on one pixel, a batch norm, a linear output; client 1 holds client 0's filters swapped
/// with other running statistics. With sigma = sigma0 = 1, gamma = 1 and J = 2, a matched
/// unit has precision 1 (prior) + 1 + 1 per incoming weight and bias, so its posterior mean
/// is (mu0 + w + w) / 3 (mu0 = 0 for weights, 0.1 for the bias); its outgoing weights have
/// precision 1 + r_0 + r_1 = 2 with class shares r summing to 1, so (r_0 v + r_1 v) / 2 = v / 2.
/// The output bias is (0.1 + r_0 c_0 + r_1 c_1) / 2, the norm channels the example-weighted
/// mean of the members (3 : 1).
#[test]
fn pfnm_posteriors_on_a_hand_computed_case() {
    let layers = [
        LayerSpec::conv2d(2, 1),
        LayerSpec::batch_norm2d(),
        LayerSpec::Relu,
        LayerSpec::Flatten,
        LayerSpec::linear(1),
    ];
    let net = |w: [f32; 2], b: [f32; 2], mean: [f32; 2], v: [f32; 2], c: f32, n: f32| {
        let mut p = Params::new();
        p.push("0.weight", vec![2, 1, 1, 1], w.to_vec()).unwrap();
        p.push("0.bias", vec![2], b.to_vec()).unwrap();
        p.push("1.weight", vec![2], vec![1.0, 2.0]).unwrap();
        p.push("1.bias", vec![2], vec![0.0, 0.5]).unwrap();
        p.push("1.running_mean", vec![2], mean.to_vec()).unwrap();
        p.push("1.running_var", vec![2], vec![1.0, 1.0]).unwrap();
        p.push("1.num_batches_tracked", vec![], vec![n]).unwrap();
        p.push("4.weight", vec![1, 2], v.to_vec()).unwrap();
        p.push("4.bias", vec![1], vec![c]).unwrap();
        p
    };
    let a = net([3.0, -3.0], [0.4, -0.2], [1.0, 2.0], [2.0, -1.0], 0.3, 10.0);
    let mut b = net([-3.0, 3.0], [-0.2, 0.4], [4.0, 2.0], [-1.0, 2.0], 0.7, 11.0);
    // Client 1's batch norm scale and shift follow its swapped filters.
    b.get_mut("1.weight").unwrap().data = vec![2.0, 1.0];
    b.get_mut("1.bias").unwrap().data = vec![0.5, 0.0];
    let cfg = PfnmConfig {
        prior: fedfuse_fuse::MatchPrior {
            sigma: 1.0,
            sigma0: 1.0,
            gamma: 1.0,
            ..fedfuse_fuse::MatchPrior::default()
        },
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    let counts = vec![vec![3.0], vec![1.0]];
    let fused = pfnm_fuse_layers(
        &[1, 1, 1],
        &layers,
        &[&a, &b],
        Some(&counts),
        &cfg,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap();
    assert_eq!(fused.assignments, vec![vec![vec![0, 1], vec![1, 0]]]);
    let data = |n: &str| fused.params.get(n).unwrap().data.clone();
    let close = |got: Vec<f32>, want: &[f64]| {
        for (g, w) in got.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    };
    close(data("0.weight"), &[6.0 / 3.0, -6.0 / 3.0]);
    close(data("0.bias"), &[(0.1 + 0.8) / 3.0, (0.1 - 0.4) / 3.0]);
    close(data("1.weight"), &[1.0, 2.0]);
    close(data("1.bias"), &[0.0, 0.5]);
    // Unit 0: client 0's mean 1, client 1's (its unit 1) 2: (3 * 1 + 2) / 4.
    close(data("1.running_mean"), &[1.25, 2.5]);
    close(data("1.num_batches_tracked"), &[10.0]);
    close(data("4.weight"), &[1.0, -0.5]);
    close(data("4.bias"), &[(0.1 + 0.75 * 0.3 + 0.25 * 0.7) / 2.0]);
}

/// Clients of other widths: the narrower one's units join the wider one's, and the fused
/// widths are the wider client's.
#[test]
fn pfnm_matches_clients_of_other_widths() {
    let layers = conv_net([4, 5, 6], [true, true, false], true);
    let mut rng = StdRng::seed_from_u64(9);
    let mut p = random_params(&INPUT, &layers, &mut rng);
    let uses = unit_uses(&INPUT, &layers).unwrap();
    // Client 1: the model without conv unit 3, conv unit 0 and linear unit 5. Absent inputs are
    // observed zeros, so the wide client's filters match the narrow one's only where they
    // read the missing channels with zeros: set those readers to 0.
    for (u, gone) in uses.iter().zip([3, 0]) {
        for r in &u.readers {
            let t = p.get_mut(&r.tensor).unwrap();
            for span in r.ranges(&t.shape, gone) {
                t.data[span].fill(0.0);
            }
        }
    }
    let keep = [vec![0, 1, 2], vec![1, 2, 3, 4], vec![0, 1, 2, 3, 4]];
    let mut q = Params::new();
    for (name, t) in p.iter() {
        let mut shape = t.shape.clone();
        let mut data = t.data.clone();
        for (u, kept) in uses.iter().zip(&keep) {
            for use_ in u.all().filter(|x| x.tensor == name) {
                // Keep the listed units' values along this use's axis.
                let spans: Vec<std::ops::Range<usize>> =
                    kept.iter().flat_map(|&k| use_.ranges(&shape, k)).collect();
                let mut order: Vec<_> = spans.clone();
                order.sort_by_key(|r| r.start);
                data = order
                    .iter()
                    .flat_map(|r| data[r.clone()].to_vec())
                    .collect();
                shape[use_.axis] = kept.len() * use_.block;
            }
        }
        q.push(name, shape, data).unwrap();
    }
    let cfg = PfnmConfig {
        prior: fedfuse_fuse::MatchPrior {
            sigma: 1e-4,
            ..fedfuse_fuse::MatchPrior::default()
        },
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    let fused = pfnm_fuse_layers(
        &INPUT,
        &layers,
        &[&p, &q],
        None,
        &cfg,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap();
    assert_eq!(fused.layers, layers);
    // The narrow client's unit `l` joins the wide one's unit `keep[g][l]` (refinement may
    // renumber the fused units).
    for (g, kept) in keep.iter().enumerate() {
        let (wide, narrow) = (&fused.assignments[g][0], &fused.assignments[g][1]);
        for (l, &k) in kept.iter().enumerate() {
            assert_eq!(narrow[l], wide[k], "layer {g}, unit {l}");
        }
    }
    // Every fused unit is the wide client's (alone or joined by an equal one).
    let xs = samples(&mut rng, 3);
    assert_close(
        &logits(&fused.layers, &fused.params, &xs),
        &logits(&layers, &p, &xs),
        1e-3,
        "logits",
    );
}

/// A fused width from a hostile server: past any tensor's bound, or one whose reader would
/// outgrow it once laid over the fused units, is refused before anything that size is
/// allocated; the client's model is left as it was.
#[test]
fn spreading_over_a_hostile_width_is_refused() {
    let layers = conv_net([3, 4, 5], [true, false, false], true);
    let mut rng = StdRng::seed_from_u64(7);
    let p = random_params(&INPUT, &layers, &mut rng);
    let uses = unit_uses(&INPUT, &layers).unwrap();
    let to: Vec<usize> = (0..uses[0].units).collect();
    // The next convolution (4 filters of 3x3 taps) laid over 2^30 units would hold 2^32 * 9
    // values.
    for width in [usize::MAX, 1 << 40, (1 << 31) + 1, 1 << 30] {
        let mut q = p.clone();
        let e = fedfuse_fuse::spread_units(&mut q, &uses[0], &to, width).unwrap_err();
        assert!(e.to_string().contains("more than"), "{width}: {e}");
        assert_eq!(q, p, "{width}");
    }
}

#[test]
fn refused_lists_name_the_layer() {
    let cfg = PfnmConfig {
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    let fuse = |input: &[usize], layers: &[LayerSpec]| {
        let p = random_params(input, layers, &mut StdRng::seed_from_u64(0));
        pfnm_fuse_layers(
            input,
            layers,
            &[&p, &p],
            None,
            &cfg,
            &mut StdRng::seed_from_u64(0),
        )
        .unwrap_err()
    };
    let layer_of = |e: &FuseError| match e {
        FuseError::UnsupportedLayer { layer, kind, .. } => (*layer, *kind),
        other => panic!("{other}"),
    };
    let conv = LayerSpec::conv2d(4, 3).with_padding(1);
    let head = [
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ];

    // Residual blocks whose norm is a group norm: its groups would mix widened channels.
    let mut l = vec![conv.clone(), LayerSpec::residual(8, 2, BlockNorm::Group)];
    l.extend(head.clone());
    let e = fuse(&[2, 6, 6], &l);
    assert_eq!(layer_of(&e), (1, "residual"));
    assert!(e.to_string().contains("norm = \"group\""), "{e}");
    // A width change at stride 1 fuses, keeping its projection (the fused list's `project`
    // where the fused widths meet: `core::spec` tests that case).
    let mut l = vec![conv.clone(), LayerSpec::residual(8, 1, BlockNorm::Batch)];
    l.extend(head.clone());
    let (p, q) = (
        random_params(&[2, 6, 6], &l, &mut StdRng::seed_from_u64(0)),
        random_params(&[2, 6, 6], &l, &mut StdRng::seed_from_u64(1)),
    );
    let fused = pfnm_fuse_layers(
        &[2, 6, 6],
        &l,
        &[&p, &q],
        None,
        &cfg,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap();
    let spec = fedfuse_core::ModelSpec::sequential(&[2, 6, 6], fused.layers.clone());
    fused.params.check_layout(&spec.param_shapes()).unwrap();
    assert!(fused.params.get("1.shortcut.0.weight").is_some());

    // Group norm and layer norm after a matched layer.
    let mut l = vec![
        conv.clone(),
        LayerSpec::GroupNorm {
            groups: 2,
            eps: 1e-5,
        },
    ];
    l.extend(head.clone());
    assert_eq!(layer_of(&fuse(&[2, 6, 6], &l)), (1, "groupnorm"));
    let l = [
        LayerSpec::linear(5),
        LayerSpec::Relu,
        LayerSpec::LayerNorm { eps: 1e-5 },
        LayerSpec::linear(3),
    ];
    let e = fuse(&[4], &l);
    assert_eq!(layer_of(&e), (2, "layernorm"));
    assert!(e.to_string().contains("model.layers[0]"), "{e}");
    // A layer norm on the input, before any matched layer, is averaged like any tensor.
    let l = [
        LayerSpec::LayerNorm { eps: 1e-5 },
        LayerSpec::linear(5),
        LayerSpec::Relu,
        LayerSpec::linear(3),
    ];
    let p = random_params(&[4], &l, &mut StdRng::seed_from_u64(0));
    pfnm_fuse_layers(
        &[4],
        &l,
        &[&p, &p],
        None,
        &cfg,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap();

    // A grouped convolution reading matched channels.
    let mut l = vec![
        conv.clone(),
        LayerSpec::Conv2d {
            out: 4,
            kernel: 1,
            stride: 1,
            padding: 0,
            groups: 2,
            bias: true,
        },
    ];
    l.extend(head.clone());
    assert_eq!(layer_of(&fuse(&[2, 6, 6], &l)), (1, "conv2d"));

    // No hidden layer.
    let l = [LayerSpec::Flatten, LayerSpec::linear(3)];
    assert_eq!(layer_of(&fuse(&[2, 2, 2], &l)), (1, "linear"));

    // Top-down with two matched layers is refused; with one it is bottom-up by definition.
    let top_down = PfnmConfig::default();
    let l = conv_net([2, 2, 2], [false; 3], true);
    let p = random_params(&INPUT, &l, &mut StdRng::seed_from_u64(0));
    let e = pfnm_fuse_layers(
        &INPUT,
        &l,
        &[&p],
        None,
        &top_down,
        &mut StdRng::seed_from_u64(0),
    )
    .unwrap_err();
    assert!(
        matches!(e, FuseError::InvalidSetting { field: "order", .. }),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// FedMA's step on a client: its layer `g` laid over a wider fused layer at `to`
    /// (`spread_units`) and the fused units it lacks filled in arbitrarily: the logits stay the
    /// same, and picking the units at `to` gives the client back.
    #[test]
    fn spreading_a_layer_over_fused_units_keeps_the_logits(
        w1 in 1usize..5, w2 in 1usize..5, w3 in 1usize..6, extra in 0usize..3,
        g in 0usize..3, norms in any::<[bool; 3]>(), seed in any::<u64>(),
    ) {
        let layers = conv_net([w1, w2, w3], norms, true);
        let mut rng = StdRng::seed_from_u64(seed);
        let p = random_params(&INPUT, &layers, &mut rng);
        let uses = unit_uses(&INPUT, &layers).unwrap();
        let units = uses[g].units;
        let width = units + extra;
        let mut slots: Vec<usize> = (0..width).collect();
        slots.shuffle(&mut rng);
        let to = &slots[..units];
        let mut wide_layers = layers.clone();
        if let LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } =
            &mut wide_layers[uses[g].layer]
        {
            *out = width;
        }
        let mut wide = random_params(&INPUT, &wide_layers, &mut rng);
        let mut spread = p.clone();
        fedfuse_fuse::spread_units(&mut spread, &uses[g], to, width).unwrap();
        let own: Vec<&str> = uses[g].own.iter().map(|u| u.tensor.as_str()).collect();
        for (name, t) in spread.iter() {
            let w = wide.get_mut(name).unwrap();
            prop_assert_eq!(&w.shape, &t.shape, "{}", name);
            if own.contains(&name) {
                // The client's unit u sits at fused unit to[u]; the others keep random values.
                let span = t.data.len() / width;
                for &at in to {
                    w.data[at * span..(at + 1) * span]
                        .copy_from_slice(&t.data[at * span..(at + 1) * span]);
                }
            } else {
                w.data.clone_from(&t.data);
            }
        }
        let xs = samples(&mut rng, 3);
        let (a, b) = (logits(&wide_layers, &wide, &xs), logits(&layers, &p, &xs));
        assert_close(&a, &b, 1e-9, "logits");
        let wide_uses = unit_uses(&INPUT, &wide_layers).unwrap();
        fedfuse_fuse::select_units(&mut wide, &wide_uses[g], to).unwrap();
        prop_assert_eq!(wide, p);
    }

    /// FedMA's matching of one layer: clients that share the layers below and hold permuted
    /// copies of the same layer `g` (and of everything above it) are matched unit for unit,
    /// and the fused layer is the shared one.
    #[test]
    fn matching_one_layer_over_shared_layers_below_pairs_the_copies(
        w1 in 1usize..5, w2 in 1usize..5, w3 in 1usize..6, g in 0usize..3,
        norms in any::<[bool; 3]>(), seed in any::<u64>(),
    ) {
        let layers = conv_net([w1, w2, w3], norms, true);
        let mut rng = StdRng::seed_from_u64(seed);
        let p = random_params(&INPUT, &layers, &mut rng);
        let uses = unit_uses(&INPUT, &layers).unwrap();
        let mut clients = vec![p.clone()];
        let mut perms = vec![(0..uses[g].units).collect::<Vec<usize>>()];
        for _ in 0..2 {
            let mut q = p.clone();
            for (h, u) in uses.iter().enumerate().skip(g) {
                let mut perm: Vec<usize> = (0..u.units).collect();
                perm.shuffle(&mut rng);
                permute_units(&mut q, u, &perm).unwrap();
                if h == g {
                    perms.push(perm);
                }
            }
            clients.push(q);
        }
        let refs: Vec<&Params> = clients.iter().collect();
        let cfg = PfnmConfig { prior: fedfuse_fuse::MatchPrior { sigma: 1e-4, ..fedfuse_fuse::MatchPrior::default() }, order: MatchOrder::BottomUp, ..PfnmConfig::default() };
        let mut orders = fedfuse_fuse::RngOrder(&mut rng);
        let m = fedfuse_fuse::pfnm_match_layer(&INPUT, &layers, &refs, g, None, &cfg, &mut orders)
            .unwrap();
        prop_assert_eq!(m.width, uses[g].units);
        for (j, perm) in perms.iter().enumerate() {
            for (u, &local) in perm.iter().enumerate() {
                prop_assert_eq!(m.assignments[j][local], u, "client {}, unit {}", j, u);
            }
        }
        let names: Vec<&str> = m.tensors.iter().map(|(n, _)| n).collect();
        let want: Vec<&str> = uses[g].own.iter().map(|u| u.tensor.as_str()).collect();
        prop_assert_eq!(names, want);
        for (name, t) in m.tensors.iter() {
            let (want, got) = (f64s(&p.get(name).unwrap().data), f64s(&t.data));
            assert_close(&got, &want, 1e-3, name);
        }
    }
}

/// A layer of 100,000 units is a 2 MB file, and its score matrices against another client's
/// would take hundreds of gigabytes: PFNM (an MLP and a layer list) and weight matching refuse
/// it, saying why, before allocating them.
#[test]
fn a_layer_too_wide_to_score_is_refused_before_allocating() {
    let wide = 100_000;
    let mut p = Params::new();
    p.push("0.weight", vec![wide, 2], vec![0.5; wide * 2])
        .unwrap();
    p.push("0.bias", vec![wide], vec![0.0; wide]).unwrap();
    p.push("2.weight", vec![3, wide], vec![0.5; 3 * wide])
        .unwrap();
    p.push("2.bias", vec![3], vec![0.0; 3]).unwrap();
    let layers = [
        LayerSpec::linear(wide),
        LayerSpec::Relu,
        LayerSpec::linear(3),
    ];
    let mut rng = StdRng::seed_from_u64(0);
    let refused = |e: fedfuse_fuse::FuseError| {
        let e = e.to_string();
        assert!(e.contains("GiB") && e.contains("fewer units"), "{e}");
    };
    let cfg = PfnmConfig {
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    refused(pfnm_fuse_layers(&[2], &layers, &[&p, &p], None, &cfg, &mut rng).unwrap_err());
    refused(
        weight_matching_fuse(
            &[2],
            &layers,
            &[&p, &p],
            None,
            &WeightMatchingConfig::default(),
            &mut rng,
        )
        .unwrap_err(),
    );
    let mut mlp = Params::new();
    for ((_, t), name) in p.iter().zip([
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
    ]) {
        mlp.push(name, t.shape.clone(), t.data.clone()).unwrap();
    }
    let cfg = PfnmConfig::default();
    refused(fedfuse_fuse::pfnm_fuse(&[&mlp, &mlp], None, &cfg, &mut rng).unwrap_err());
}
