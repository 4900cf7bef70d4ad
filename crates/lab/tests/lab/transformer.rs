//! Vision Transformers fused, measured on MNIST. A practitioner's case: one ViT (patch 7, 2
//! blocks of 4 heads, width 32) trained, then fine-tuned twice on label-skewed halves, and one
//! copy saved with its units relabelled (every permutation group permuted at random; the same
//! network). Averaging the two files coordinate by coordinate mixes unrelated units; weight
//! matching over a ViT's groups finds the relabelling again and fuses as if the files had
//! kept one order. (Two ViTs trained from separate initialisations: docs/EXPERIMENTS.md.)

use fedfuse_core::{ModelSpec, Params, VitShape};
use fedfuse_data::{Dataset, load_dataset};
use fedfuse_fuse::{
    WeightMatchingConfig, permute_vit, random_vit_permutations, weight_matching_fuse,
    weighted_mean_params,
};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::residual::skewed;

const SHAPE: VitShape = VitShape {
    patch: 7,
    hidden: 32,
    layers: 2,
    heads: 4,
    mlp: 64,
    mlps: Vec::new(),
    dropout: 0.0,
    attention_dropout: 0.0,
};

/// Accuracies on 1,000 test images of: the two fine-tuned copies averaged as saved (one
/// relabelled), weight-matched, averaged in one order (what matching should reach), and each
/// copy's own.
fn one_seed(seed: u64) -> (f64, f64, f64, [f64; 2]) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let all: Vec<u32> = (0..10).collect();
    let base = skewed(&data.train, &all, 3000, &mut rng);
    let a = skewed(&data.train, &[0, 1, 2, 3, 4], 1000, &mut rng);
    let b = skewed(&data.train, &[5, 6, 7, 8, 9], 1000, &mut rng);
    let test = data.test.subset(&(0..1000).collect::<Vec<_>>());
    let layers = SHAPE.layers(10);
    let spec = ModelSpec::sequential(&data.train.sample_shape, layers.clone());
    let trainer = Trainer::new(spec.clone()).unwrap();
    let cfg = |epochs| TrainConfig {
        optimizer: OptimizerConfig::Adam {
            beta1: OptimizerConfig::ADAM_BETA1,
            beta2: OptimizerConfig::ADAM_BETA2,
            eps: OptimizerConfig::ADAM_EPS,
            weight_decay: 0.0,
            amsgrad: false,
        },
        lr: 0.002,
        epochs,
        batch_size: 32,
        ..TrainConfig::default()
    };
    let fit = |start: &Params, d: &Dataset, epochs, s| {
        trainer
            .fit_with(start, d, &cfg(epochs), None, s)
            .unwrap()
            .params
    };
    let pretrained = fit(&init_params(&spec, Init::Default, seed), &base, 3, seed);
    let (pa, pb) = (
        fit(&pretrained, &a, 2, seed + 1),
        fit(&pretrained, &b, 2, seed + 2),
    );
    let relabelling = random_vit_permutations(&layers, &mut rng).unwrap();
    let pb_saved = permute_vit(&layers, &pb, &relabelling).unwrap();
    let acc = |p: &Params| trainer.evaluate(p, &test).unwrap().accuracy;
    let mean = |x: &Params, y: &Params| weighted_mean_params(&[(x, 1.0), (y, 1.0)]).unwrap();
    let matched = weight_matching_fuse(
        &data.train.sample_shape,
        &layers,
        &[&pa, &pb_saved],
        None,
        &WeightMatchingConfig::default(),
        &mut StdRng::seed_from_u64(seed),
    )
    .unwrap()
    .params;
    (
        acc(&mean(&pa, &pb_saved)),
        acc(&matched),
        acc(&mean(&pa, &pb)),
        [acc(&pa), acc(&pb_saved)],
    )
}

/// On both seeds: weight matching reaches the one-order average (within 0.02) and beats the
/// averaged files by far.
#[test]
fn weight_matching_fuses_relabelled_fine_tuned_vits_as_if_in_one_order() {
    for seed in [1, 2] {
        let (average, matching, one_order, own) = one_seed(seed);
        eprintln!(
            "seed {seed}: files averaged {average:.3}, weight matching {matching:.3}, \
             averaged in one order {one_order:.3}, each {own:?}"
        );
        assert!(
            matching > average + 0.2,
            "seed {seed}: {matching} vs {average}"
        );
        assert!(
            matching > one_order - 0.02,
            "seed {seed}: {matching} vs {one_order}"
        );
    }
}
