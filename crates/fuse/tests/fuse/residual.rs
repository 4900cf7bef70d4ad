//! Residual networks as permutation groups: a stage's stream (the layer that writes it, every
//! block's `conv2` and `bn2`, every reader) moves under one permutation, each block's inner
//! channels under another; permuting every group keeps the logits, and weight matching finds
//! planted permutations again, with batch norm, group norm (within its groups) or none.

use fedfuse_core::layers::{LayerSpec, UnitUses, permutation_groups};
use fedfuse_core::{BlockNorm, Params, ZooModel};
use fedfuse_fuse::{WeightMatchingConfig, permute_units, weight_matching_fuse};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::channels::{assert_close, assert_recovered, forward, random_params};

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

/// Weight matching of a network and a copy with every group permuted (and, with `noise`,
/// every value moved by up to that much): the planted permutations, and the fused model
/// equal to the network.
fn recovers(input: &[usize], layers: &[LayerSpec], noise: f32, seed: u64) {
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
    let fused = weight_matching_fuse(
        input,
        layers,
        &[&p, &q],
        None,
        &WeightMatchingConfig::default(),
        &mut rng,
    )
    .unwrap();
    assert_recovered(&fused.assignments, &[ident, perm]);
    for (name, t) in p.iter() {
        let got: Vec<f64> = fused
            .params
            .get(name)
            .unwrap()
            .data
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let want: Vec<f64> = t.data.iter().map(|&v| f64::from(v)).collect();
        // The mean of the value and its copy moved by at most `noise`.
        let tol = if name.ends_with("num_batches_tracked") {
            0.5
        } else {
            f64::from(noise) / 2.0 + 1e-6
        };
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= tol, "{name}: {a} vs {b}");
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
        recovers(&INPUT, &layers, 0.0, seed);
        recovers(&INPUT, &layers, 0.01, seed + 10);
    }
}

#[test]
fn weight_matching_recovers_planted_permutations_of_resnet20() {
    // ResNet-20 at width 8 (8, 16, 32 channels), batch and group norm, with noise.
    for (norm, seed) in [(BlockNorm::Batch, 5), (BlockNorm::Group, 6)] {
        let layers = ZooModel::Resnet20.layers(10, norm, 8);
        recovers(&[3, 8, 8], &layers, 0.01, seed);
    }
}

#[test]
fn weight_matching_recovers_planted_permutations_of_resnet18() {
    // torchvision's ResNet-18 at width 4 (4 to 32 channels): its 7x7 stem, padded max-pool
    // and four stages, batch and group norm, with noise.
    for (norm, seed) in [(BlockNorm::Batch, 7), (BlockNorm::Group, 8)] {
        let layers = ZooModel::Resnet18.layers(10, norm, 4);
        permuting_keeps_the_logits(&layers, seed);
        recovers(&[3, 16, 16], &layers, 0.01, seed);
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
    recovers(&INPUT, &layers, 0.0, 9);
}
