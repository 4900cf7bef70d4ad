//! Residual networks as permutation groups: a stage's stream (the layer that writes it, every
//! block's `conv2` and `bn2`, every reader) moves under one permutation, each block's inner
//! channels under another; permuting every group keeps the logits, and weight matching and
//! PFNM find planted permutations again (weight matching with batch norm, group norm within its
//! groups, or none; PFNM, which widens groups, with batch norm or none).

use fedfuse_core::layers::{LayerSpec, UnitUses, permutation_groups};
use fedfuse_core::{BlockNorm, Params, ZooModel};
use fedfuse_fuse::{
    FusedLayers, MatchOrder, MatchPrior, PfnmConfig, RngOrder, WeightMatchingConfig,
    layerwise_stages, permute_units, pfnm_fuse_layers, pfnm_match_layer, spread_units,
    weight_matching_fuse,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::channels::{assert_close, assert_recovered, f64s, forward, random_params};

/// A stem convolution with its norm, `stages` of residual blocks `(width, stride, blocks)`,
/// global pooling and a linear classifier of 3 classes.
fn resnet(stem: usize, stages: &[(usize, usize, usize)], norm: BlockNorm) -> Vec<LayerSpec> {
    let mut layers = vec![LayerSpec::conv2d(stem, 3).with_padding(1)];
    match norm {
        BlockNorm::Batch => layers.push(LayerSpec::batch_norm2d()),
        BlockNorm::Group => layers.push(LayerSpec::GroupNorm {
            groups: 2,
            eps: 1e-5,
        }),
        BlockNorm::None => {}
    }
    layers.push(LayerSpec::Relu);
    for &(width, stride, blocks) in stages {
        for b in 0..blocks {
            let s = if b == 0 { stride } else { 1 };
            layers.push(LayerSpec::residual(width, s, norm));
        }
    }
    layers.extend([
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ]);
    layers
}

/// A random permutation of `units` that keeps each of `tied` equal parts onto itself.
fn tied_permutation(units: usize, tied: usize, rng: &mut StdRng) -> Vec<usize> {
    let per = units / tied.max(1);
    let mut perm: Vec<usize> = (0..units).collect();
    for part in perm.chunks_mut(per.max(1)) {
        part.shuffle(rng);
    }
    perm
}

/// Every permutation group of `layers` permuted at random; the permutations.
fn permuted(
    input: &[usize],
    layers: &[LayerSpec],
    p: &Params,
    rng: &mut StdRng,
) -> (Params, Vec<Vec<usize>>) {
    let mut q = p.clone();
    let mut perms = Vec::new();
    for group in permutation_groups(input, layers).unwrap() {
        let perm = tied_permutation(group.units, group.tied, rng);
        permute_units(&mut q, &group, &perm).unwrap();
        perms.push(perm);
    }
    (q, perms)
}

fn logits(input: &[usize], layers: &[LayerSpec], p: &Params, xs: &[Vec<f64>]) -> Vec<f64> {
    xs.iter()
        .flat_map(|x| forward(input, layers, p, x))
        .collect()
}

fn samples(input: &[usize], rng: &mut StdRng, n: usize) -> Vec<Vec<f64>> {
    let len: usize = input.iter().product();
    (0..n)
        .map(|_| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect()
}

/// Random tensors for `layers` on [`INPUT`], every permutation group permuted at random: the
/// logits of two random samples do not change.
fn permuting_keeps_the_logits(layers: &[LayerSpec], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let p = random_params(&INPUT, layers, &mut rng);
    let xs = samples(&INPUT, &mut rng, 2);
    let (q, _) = permuted(&INPUT, layers, &p, &mut rng);
    assert_close(
        &logits(&INPUT, layers, &q, &xs),
        &logits(&INPUT, layers, &p, &xs),
        1e-9,
        "logits",
    );
}

fn norm_of(k: u8) -> BlockNorm {
    match k % 3 {
        0 => BlockNorm::Batch,
        1 => BlockNorm::Group,
        _ => BlockNorm::None,
    }
}

const INPUT: [usize; 3] = [2, 6, 6];

#[test]
fn a_stage_is_one_group_with_its_writers_and_readers() {
    // stem 4 | block 4 (identity) | block 6 stride 2 (projection) | block 6 | pool, linear.
    let layers = resnet(4, &[(4, 1, 1), (6, 2, 2)], BlockNorm::Batch);
    let groups = permutation_groups(&INPUT, &layers).unwrap();
    let names = |g: &UnitUses, own: bool| -> Vec<String> {
        let uses = if own { &g.own } else { &g.readers };
        uses.iter()
            .filter(|u| !u.tensor.contains("running") && !u.tensor.ends_with(".bias"))
            .map(|u| u.tensor.clone())
            .collect()
    };
    // The stem's stream, the three blocks' inner channels, the second stage's stream.
    assert_eq!(groups.len(), 5);
    assert_eq!(
        names(&groups[0], true),
        ["0.weight", "1.weight", "3.conv2.weight", "3.bn2.weight"]
    );
    assert_eq!(
        names(&groups[0], false),
        ["3.conv1.weight", "4.conv1.weight", "4.shortcut.0.weight"]
    );
    assert_eq!(names(&groups[1], true), ["3.conv1.weight", "3.bn1.weight"]);
    assert_eq!(names(&groups[1], false), ["3.conv2.weight"]);
    let stage2 = &groups[3];
    assert_eq!(stage2.units, 6);
    assert_eq!(
        names(stage2, true),
        [
            "4.conv2.weight",
            "4.bn2.weight",
            "4.shortcut.0.weight",
            "4.shortcut.1.weight",
            "5.conv2.weight",
            "5.bn2.weight"
        ]
    );
    assert_eq!(names(stage2, false), ["5.conv1.weight", "8.weight"]);
    // The classifier reads the pooled channels one column each.
    assert_eq!(stage2.readers.last().unwrap().block, 1);
}

#[test]
fn group_norm_ties_a_stream_to_its_groups_and_a_list_that_starts_with_a_block_has_no_stream() {
    let gn = resnet(4, &[(4, 1, 2)], BlockNorm::Group);
    let groups = permutation_groups(&INPUT, &gn).unwrap();
    assert!(groups.iter().all(|g| g.tied == 2), "{groups:?}");
    // No layer writes the first stage's stream but the input itself: nothing moves it.
    let bare = [
        LayerSpec::residual(2, 1, BlockNorm::Batch),
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ];
    let groups = permutation_groups(&INPUT, &bare).unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].own[0].tensor, "0.conv1.weight");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random residual lists (one to three stages of one or two blocks, strides 1 or 2,
    /// widths even, batch norm, group norm or none): permuting every permutation group keeps
    /// every logit.
    #[test]
    fn permuting_every_group_keeps_the_logits(
        stem in 1usize..4, stages in prop::collection::vec((1usize..4, 1usize..3, 1usize..3), 1..4),
        norm in any::<u8>(), seed in any::<u64>(),
    ) {
        let stages: Vec<_> = stages.into_iter().map(|(w, s, b)| (2 * w, s, b)).collect();
        let layers = resnet(2 * stem, &stages, norm_of(norm));
        permuting_keeps_the_logits(&layers, seed);
    }
}

/// How two networks are fused in these tests.
#[derive(Clone, Copy, Debug)]
enum Matcher {
    Weights,
    /// PFNM (GPI-FNM when `eps > 0`) at a sharp prior: `sigma` 1e-4.
    Pfnm {
        eps: f64,
    },
}

impl Matcher {
    fn fuse(
        self,
        input: &[usize],
        layers: &[LayerSpec],
        nets: &[&Params],
        seed: u64,
    ) -> FusedLayers {
        let mut rng = StdRng::seed_from_u64(seed);
        match self {
            Self::Weights => weight_matching_fuse(
                input,
                layers,
                nets,
                None,
                &WeightMatchingConfig::default(),
                &mut rng,
            ),
            Self::Pfnm { eps } => {
                let cfg = PfnmConfig {
                    prior: MatchPrior {
                        sigma: 1e-4,
                        ..MatchPrior::default()
                    },
                    eps,
                    order: MatchOrder::BottomUp,
                    ..PfnmConfig::default()
                };
                pfnm_fuse_layers(input, layers, nets, None, &cfg, &mut rng)
            }
        }
        .unwrap()
    }
}

/// `matcher` on a network and a copy with every group permuted (and, with `noise`, every
/// value moved by up to that much): the planted permutations, the widths kept, and the fused
/// model equal to the network (the mean of a value and its copy; PFNM's shrinks it towards the
/// prior by a factor near `1 / (1 + sigma / 2)`).
fn recovers(input: &[usize], layers: &[LayerSpec], noise: f32, seed: u64, matcher: Matcher) {
    let mut rng = StdRng::seed_from_u64(seed);
    let p = random_params(input, layers, &mut rng);
    let (mut q, perm) = permuted(input, layers, &p, &mut rng);
    for (_, t) in q.iter_mut() {
        if !t.data.is_empty() && noise > 0.0 {
            t.data
                .iter_mut()
                .for_each(|v| *v += rng.random_range(-noise..=noise));
        }
    }
    let ident = perm.iter().map(|g| (0..g.len()).collect()).collect();
    let fused = matcher.fuse(input, layers, &[&p, &q], seed);
    assert_eq!(fused.layers, layers, "{matcher:?} noise {noise}: widths");
    assert_recovered(&fused.assignments, &[ident, perm]);
    for (name, t) in p.iter() {
        let got = f64s(&fused.params.get(name).unwrap().data);
        let want = f64s(&t.data);
        let tol = if name.ends_with("num_batches_tracked") {
            0.5
        } else {
            f64::from(noise) / 2.0 + 1e-3
        };
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= tol, "{matcher:?} {name}: {a} vs {b}");
        }
    }
}

#[test]
fn weight_matching_recovers_planted_permutations_of_small_resnets() {
    for (norm, seed) in [
        (BlockNorm::Batch, 1),
        (BlockNorm::Group, 2),
        (BlockNorm::None, 3),
    ] {
        let layers = resnet(4, &[(4, 1, 2), (6, 2, 2)], norm);
        recovers(&INPUT, &layers, 0.0, seed, Matcher::Weights);
        recovers(&INPUT, &layers, 0.01, seed + 10, Matcher::Weights);
    }
}

#[test]
fn weight_matching_recovers_planted_permutations_of_resnet20() {
    // ResNet-20 at width 8 (8, 16, 32 channels), batch and group norm, with noise.
    for (norm, seed) in [(BlockNorm::Batch, 5), (BlockNorm::Group, 6)] {
        let layers = ZooModel::Resnet20.layers(10, norm, 8);
        recovers(&[3, 8, 8], &layers, 0.01, seed, Matcher::Weights);
    }
}

#[test]
fn weight_matching_recovers_planted_permutations_of_resnet18() {
    // torchvision's ResNet-18 at width 4 (4 to 32 channels): its 7x7 stem, padded max-pool
    // and four stages, batch and group norm, with noise.
    for (norm, seed) in [(BlockNorm::Batch, 7), (BlockNorm::Group, 8)] {
        let layers = ZooModel::Resnet18.layers(10, norm, 4);
        permuting_keeps_the_logits(&layers, seed);
        recovers(&[3, 16, 16], &layers, 0.01, seed, Matcher::Weights);
    }
}

/// A layer norm over the whole sample is invariant to a permutation of the channels when its
/// scale and shift move with them (`h * w` values a channel before a flatten): weight matching
/// permutes through it and finds planted permutations again.
#[test]
fn weight_matching_permutes_through_layer_norms() {
    let layers = [
        LayerSpec::conv2d(4, 3).with_padding(1),
        LayerSpec::LayerNorm { eps: 1e-5 },
        LayerSpec::Relu,
        LayerSpec::Flatten,
        LayerSpec::linear(5),
        LayerSpec::LayerNorm { eps: 1e-5 },
        LayerSpec::Relu,
        LayerSpec::linear(3),
    ];
    permuting_keeps_the_logits(&layers, 9);
    recovers(&INPUT, &layers, 0.0, 9, Matcher::Weights);
}

#[test]
fn pfnm_and_gpi_fnm_recover_planted_permutations_of_resnets() {
    // A small two-stage network, ResNet-20 at width 8 and ResNet-18 at width 4, batch norm
    // and none (a group norm's groups would mix once PFNM widens them: refused below). PFNM
    // with noise; GPI-FNM on exact copies only: at eps 0.5 its cost opens new units for
    // copies moved by 0.01, on plain chains as here.
    let gpi = Matcher::Pfnm { eps: 0.5 };
    let pfnm = Matcher::Pfnm { eps: 0.0 };
    for (norm, seed) in [(BlockNorm::Batch, 21), (BlockNorm::None, 22)] {
        let small = resnet(4, &[(4, 1, 2), (6, 2, 2)], norm);
        recovers(&INPUT, &small, 0.0, seed, pfnm);
        recovers(&INPUT, &small, 0.01, seed + 10, pfnm);
        recovers(&INPUT, &small, 0.0, seed, gpi);
    }
    let r20 = ZooModel::Resnet20.layers(10, BlockNorm::Batch, 8);
    recovers(&[3, 8, 8], &r20, 0.01, 23, pfnm);
    recovers(&[3, 8, 8], &r20, 0.0, 23, gpi);
    let r18 = ZooModel::Resnet18.layers(10, BlockNorm::Batch, 4);
    recovers(&[3, 16, 16], &r18, 0.01, 24, pfnm);
}

/// A bottleneck block's two inner convolutions are two groups, and its `conv3` writes the
/// stream: with a stride-1 projection (ResNet-50's `layer1.0`), the stream starts at the
/// projection and runs through the identity blocks after it.
#[test]
fn a_bottleneck_has_two_inner_groups_and_writes_its_stream_from_conv3() {
    let layers = [
        LayerSpec::conv2d(4, 3).with_padding(1).without_bias(),
        LayerSpec::batch_norm2d(),
        LayerSpec::Relu,
        LayerSpec::bottleneck(8, 1, BlockNorm::Batch),
        LayerSpec::bottleneck(8, 1, BlockNorm::Batch),
        LayerSpec::GlobalAvgpool,
        LayerSpec::Flatten,
        LayerSpec::linear(3),
    ];
    let groups = permutation_groups(&INPUT, &layers).unwrap();
    let own = |g: &UnitUses| -> Vec<String> {
        g.own
            .iter()
            .filter(|u| !u.tensor.contains("running") && !u.tensor.ends_with(".bias"))
            .map(|u| u.tensor.clone())
            .collect()
    };
    let readers =
        |g: &UnitUses| -> Vec<String> { g.readers.iter().map(|u| u.tensor.clone()).collect() };
    assert_eq!(groups.len(), 6);
    assert_eq!(
        readers(&groups[0]),
        ["3.conv1.weight", "3.shortcut.0.weight"]
    );
    assert_eq!(own(&groups[1]), ["3.conv1.weight", "3.bn1.weight"]);
    assert_eq!(readers(&groups[1]), ["3.conv2.weight"]);
    assert_eq!((groups[1].units, groups[2].units), (2, 2));
    assert_eq!(own(&groups[2]), ["3.conv2.weight", "3.bn2.weight"]);
    assert_eq!(readers(&groups[2]), ["3.conv3.weight"]);
    assert_eq!(
        own(&groups[3]),
        [
            "3.conv3.weight",
            "3.bn3.weight",
            "3.shortcut.0.weight",
            "3.shortcut.1.weight",
            "4.conv3.weight",
            "4.bn3.weight"
        ]
    );
    assert_eq!(readers(&groups[3]), ["4.conv1.weight", "7.weight"]);
    assert_eq!(own(&groups[4]), ["4.conv1.weight", "4.bn1.weight"]);
    permuting_keeps_the_logits(&layers, 31);
}

/// torchvision's ResNet-50 at width 2 (8 to 64 channels out of its bottlenecks): permuting
/// every group keeps the logits, and weight matching (batch and group norm) and PFNM (batch
/// norm, sharp prior) find planted permutations under noise.
#[test]
fn matchers_recover_planted_permutations_of_resnet50() {
    for (norm, seed) in [(BlockNorm::Batch, 41), (BlockNorm::Group, 42)] {
        let layers = ZooModel::Resnet50.layers(10, norm, 2);
        permuting_keeps_the_logits(&layers, seed);
        recovers(&[3, 16, 16], &layers, 0.01, seed, Matcher::Weights);
    }
    let layers = ZooModel::Resnet50.layers(10, BlockNorm::Batch, 2);
    recovers(&[3, 16, 16], &layers, 0.01, 43, Matcher::Pfnm { eps: 0.0 });
    recovers(&[3, 16, 16], &layers, 0.0, 43, Matcher::Pfnm { eps: 0.5 });
}

/// FedMA's stages without the retraining between them, on a network and two copies with every
/// group permuted: at each stage the group's units pair up with the copies' (the planted
/// permutations), the stage fuses the tensors `layerwise_stages` lists (a block's last
/// convolution at its inner channels' stage, after the stream it writes), and each client,
/// laying the group over the fused units and putting the fused tensors in, keeps computing the
/// network's logits. At the end every client holds the same model.
fn fedma_stages_recover(input: &[usize], layers: &[LayerSpec], seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let p = random_params(input, layers, &mut rng);
    let xs = samples(input, &mut rng, 2);
    let want = logits(input, layers, &p, &xs);
    let mut clients = vec![p.clone()];
    let mut perms = vec![Vec::new()];
    for _ in 0..2 {
        let (q, perm) = permuted(input, layers, &p, &mut rng);
        clients.push(q);
        perms.push(perm);
    }
    perms[0] = perms[1].iter().map(|g| (0..g.len()).collect()).collect();
    let groups = permutation_groups(input, layers).unwrap();
    let stages = layerwise_stages(input, layers).unwrap();
    assert_eq!(stages.len(), groups.len());
    let cfg = PfnmConfig {
        prior: MatchPrior {
            sigma: 1e-4,
            ..MatchPrior::default()
        },
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    for (g, group) in groups.iter().enumerate() {
        let refs: Vec<&Params> = clients.iter().collect();
        let m =
            pfnm_match_layer(input, layers, &refs, g, None, &cfg, &mut RngOrder(&mut rng)).unwrap();
        assert_eq!(m.width, group.units, "stage {g}: width");
        assert_eq!(
            m.tensors.names(),
            stages[g].as_slice(),
            "stage {g}: tensors"
        );
        // Client j's unit perm[u] is the network's unit u: all of them share a fused unit.
        let fused: Vec<Vec<usize>> = perms
            .iter()
            .zip(&m.assignments)
            .map(|(perm, asg)| perm[g].iter().map(|&local| asg[local]).collect())
            .collect();
        assert!(fused.iter().all(|f| f == &fused[0]), "stage {g}: {fused:?}");
        for (j, client) in clients.iter_mut().enumerate() {
            spread_units(client, group, &m.assignments[j], m.width).unwrap();
            for (name, t) in m.tensors.iter() {
                *client.get_mut(name).unwrap() = t.clone();
            }
            // The prior pulls each fused value towards zero by about sigma / (3 sigma0), 3e-5:
            // the logits drift by up to about 5e-5 a stage (ResNet-50 has 37).
            let tol = 2e-4 + 5e-5 * (g + 1) as f64;
            let got = logits(input, layers, client, &xs);
            assert_close(&got, &want, tol, &format!("stage {g}, client {j}: logits"));
        }
    }
    for client in &clients[1..] {
        for (name, t) in client.iter() {
            let b = f64s(&clients[0].get(name).unwrap().data);
            assert_close(&f64s(&t.data), &b, 1e-3, name);
        }
    }
}

#[test]
fn fedma_stages_recover_planted_permutations_of_resnets() {
    // A two-stage network (batch norm and none), ResNet-20 at width 8, ResNet-50 at width 2.
    for (norm, seed) in [(BlockNorm::Batch, 51), (BlockNorm::None, 52)] {
        fedma_stages_recover(&INPUT, &resnet(4, &[(4, 1, 2), (6, 2, 2)], norm), seed);
    }
    fedma_stages_recover(
        &[3, 8, 8],
        &ZooModel::Resnet20.layers(10, BlockNorm::Batch, 8),
        53,
    );
    fedma_stages_recover(
        &[3, 16, 16],
        &ZooModel::Resnet50.layers(10, BlockNorm::Batch, 2),
        54,
    );
}

/// A block's last convolution is fused at its inner channels' stage, after the stream's.
#[test]
fn a_blocks_last_convolution_is_fused_at_its_inner_channels_stage() {
    let layers = resnet(4, &[(4, 1, 1), (6, 2, 1)], BlockNorm::None);
    let stages = layerwise_stages(&INPUT, &layers).unwrap();
    let want: [&[&str]; 4] = [
        &["0.weight", "0.bias"],
        &[
            "2.conv1.weight",
            "2.conv1.bias",
            "2.conv2.weight",
            "2.conv2.bias",
        ],
        &["3.conv1.weight", "3.conv1.bias"],
        &[
            "3.conv2.weight",
            "3.conv2.bias",
            "3.shortcut.0.weight",
            "3.shortcut.0.bias",
        ],
    ];
    assert_eq!(
        stages,
        want.map(|s| s.iter().map(|n| n.to_string()).collect::<Vec<_>>())
    );
}

/// Two unrelated networks share no unit: at a sharp prior PFNM opens a fused unit for every
/// unit of both, so every group doubles and each fused tensor lays the two networks side by
/// side (a block's `conv2`, which writes a stream matched before the block's inner channels,
/// included). The fused network's logits are then the two networks' logits added, less their
/// output biases, plus the fused output bias.
#[test]
fn pfnm_lays_unrelated_resnets_side_by_side() {
    for (norm, seed) in [(BlockNorm::Batch, 31), (BlockNorm::None, 32)] {
        let layers = resnet(4, &[(4, 1, 2), (6, 2, 1)], norm);
        let mut rng = StdRng::seed_from_u64(seed);
        let a = random_params(&INPUT, &layers, &mut rng);
        let b = random_params(&INPUT, &layers, &mut rng);
        let fused = Matcher::Pfnm { eps: 0.0 }.fuse(&INPUT, &layers, &[&a, &b], seed);
        let doubled = resnet(8, &[(8, 1, 2), (12, 2, 1)], norm);
        assert_eq!(fused.layers, doubled, "{norm:?}: every group doubles");
        let xs = samples(&INPUT, &mut rng, 3);
        let out = layers.len() - 1;
        let bias = |p: &Params| p.get(&format!("{out}.bias")).unwrap().data.clone();
        let (ba, bb, bf) = (bias(&a), bias(&b), bias(&fused.params));
        let (la, lb) = (
            logits(&INPUT, &layers, &a, &xs),
            logits(&INPUT, &layers, &b, &xs),
        );
        let want: Vec<f64> = (0..la.len())
            .map(|q| {
                let k = q % 3;
                la[q] - f64::from(ba[k]) + lb[q] - f64::from(bb[k]) + f64::from(bf[k])
            })
            .collect();
        assert_close(
            &logits(&INPUT, &fused.layers, &fused.params, &xs),
            &want,
            1e-2,
            &format!("{norm:?}: logits"),
        );
    }
}

/// A block whose inner channels the clients do not share fuses to a wider inside than its
/// stream: the fused list says so with `inner`, and the fused tensors have its shapes.
#[test]
fn pfnm_widens_a_blocks_inside_apart_from_its_stream() {
    let layers = resnet(4, &[(4, 1, 1)], BlockNorm::Batch);
    let mut rng = StdRng::seed_from_u64(41);
    let a = random_params(&INPUT, &layers, &mut rng);
    let other = random_params(&INPUT, &layers, &mut rng);
    // b is a, but its block's inner channels (conv1 with bn1, and conv2's columns) are another
    // network's: only the stream is shared.
    let mut b = a.clone();
    for name in [
        "3.conv1.weight",
        "3.bn1.weight",
        "3.bn1.bias",
        "3.bn1.running_mean",
        "3.bn1.running_var",
    ] {
        *b.get_mut(name).unwrap() = other.get(name).unwrap().clone();
    }
    let fused = Matcher::Pfnm { eps: 0.0 }.fuse(&INPUT, &layers, &[&a, &b], 41);
    let LayerSpec::Residual { out, inner, .. } = fused.layers[3] else {
        panic!("{:?}", fused.layers[3]);
    };
    assert_eq!((out, inner), (4, Some(8)), "{:?}", fused.layers);
    let shape = |n: &str| fused.params.get(n).unwrap().shape.clone();
    assert_eq!(shape("3.conv1.weight"), [8, 4, 3, 3]);
    assert_eq!(shape("3.bn1.running_var"), [8]);
    assert_eq!(shape("3.conv2.weight"), [4, 8, 3, 3]);
    // The fused list round-trips through its text form with the new key.
    let text = serde_json::to_string(&fused.layers[3]).unwrap();
    assert!(text.contains("\"inner\":8"), "{text}");
    let back: LayerSpec = serde_json::from_str(&text).unwrap();
    assert_eq!(back, fused.layers[3]);
}

/// A client whose classifier has other classes than the list's is refused by name, not fused
/// into a mismatched output layer.
#[test]
fn pfnm_refuses_a_client_with_other_classes() {
    let layers = resnet(4, &[(4, 1, 1)], BlockNorm::Batch);
    let mut rng = StdRng::seed_from_u64(61);
    let a = random_params(&INPUT, &layers, &mut rng);
    let mut other = layers.clone();
    *other.last_mut().unwrap() = LayerSpec::linear(5);
    let b = random_params(&INPUT, &other, &mut rng);
    let err = pfnm_fuse_layers(
        &INPUT,
        &layers,
        &[&a, &b],
        None,
        &PfnmConfig::default(),
        &mut rng,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("client 1"), "{err}");
}
