//! Times matching conv nets over their channels: J clients of a zoo network (default VGG-9 on
//! 32x32x3 inputs, FedMA's CIFAR-10 model), each a copy of one planted network with every
//! matched layer's units permuted at random and noise on every weight, fused by PFNM
//! (bottom-up, as FedMA matches) and by weight matching.
//!
//! `cargo run --release -p fedfuse-fuse --example conv_timing -- [clients] [repeats] [model]
//! [clients' weights] [sigma]` (defaults 16, 3, `vgg9`, `copies`, PFNM's default sigma; or
//! `cnn-leaf` on 28x28x1, or `vit`, the default ViT on 32x32x3 (patch 4, hidden 128, 6 blocks
//! of 4 heads, MLP 256, every group permuted as a ViT allows); and `independent`: every
//! client its own random weights, nothing to
//! match; with a small sigma PFNM then opens new units up to its `max_global` cap, the slow
//! extreme). Prints every repeat's wall time, their
//! median, the fused widths (the planted widths when the copies are matched unit for unit)
//! and, for PFNM, where the last repeat's time went per matched layer.

use std::time::Instant;

use fedfuse_core::layers::{FeatureShape, chain, unit_uses};
use fedfuse_core::{BlockNorm, LayerSpec, Params, VitShape, ZooModel};
use fedfuse_fuse::{
    MatchOrder, PfnmConfig, Result, RngOrder, WeightMatchingConfig, permute_units, permute_vit,
    pfnm_fuse_list, random_vit_permutations, weight_matching_fuse,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let clients: usize = args.first().map_or(Ok(16), |a| a.parse())?;
    let repeats: usize = args.get(1).map_or(Ok(3), |a| a.parse())?;
    let name = args.get(2).map_or("vgg9", String::as_str);
    let classes = 10;
    let (layers, input) = match name {
        "vgg9" => (
            ZooModel::Vgg9.layers(classes, BlockNorm::Batch, 16),
            vec![3, 32, 32],
        ),
        "cnn-leaf" => (
            ZooModel::CnnLeaf.layers(classes, BlockNorm::Batch, 16),
            vec![1, 28, 28],
        ),
        "vit" => (VitShape::default().layers(classes), vec![3, 32, 32]),
        _ => return Err(format!("model `{name}`: vgg9, cnn-leaf or vit").into()),
    };
    let independent = match args.get(3).map_or("copies", String::as_str) {
        "copies" => false,
        "independent" => true,
        other => return Err(format!("clients' weights `{other}`: copies or independent").into()),
    };
    let nets = permuted_copies(&input, &layers, clients.max(1), independent)?;
    let refs: Vec<&Params> = nets.iter().collect();
    let counts = vec![vec![100.0; classes]; refs.len()];
    let mut cfg = PfnmConfig {
        order: MatchOrder::BottomUp,
        ..PfnmConfig::default()
    };
    if let Some(sigma) = args.get(4) {
        cfg.prior.sigma = sigma.parse()?;
    }
    let mut timings = Vec::new();
    let mut widths = Vec::new();
    let pfnm = time(repeats, || {
        let mut rng = StdRng::seed_from_u64(1);
        let (fused, t) = pfnm_fuse_list(
            &input,
            &layers,
            &refs,
            Some(&counts),
            &cfg,
            &mut RngOrder(&mut rng),
        )?;
        widths = out_widths(&fused.layers);
        timings = t;
        Ok(())
    })?;
    report(
        &format!("PFNM, {clients} clients of {name}"),
        &pfnm,
        &widths,
    );
    for (i, t) in timings.iter().enumerate() {
        println!("  matched layer {}: {t}", i + 1);
    }
    let wm = time(repeats, || {
        let fused = weight_matching_fuse(
            &input,
            &layers,
            &refs,
            Some(&counts),
            &WeightMatchingConfig::default(),
            &mut StdRng::seed_from_u64(1),
        )?;
        widths = out_widths(&fused.layers);
        Ok(())
    })?;
    report(
        &format!("weight matching, {clients} clients of {name}"),
        &wm,
        &widths,
    );
    Ok(())
}

/// Wall times of `repeats` calls of `f`.
fn time(repeats: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f().map(|()| start.elapsed().as_secs_f64())
        })
        .collect()
}

fn report(what: &str, times: &[f64], widths: &[usize]) {
    let runs: Vec<String> = times.iter().map(|t| format!("{t:.2}")).collect();
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!(
        "{what}: {median:.2} s (median of [{}] s), fused widths {widths:?}",
        runs.join(", ")
    );
}

fn out_widths(layers: &[LayerSpec]) -> Vec<usize> {
    layers
        .iter()
        .filter_map(|l| match l {
            LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } => Some(*out),
            LayerSpec::Tokens { hidden, .. } => Some(*hidden),
            LayerSpec::Encoder { mlp, .. } => Some(*mlp),
            _ => None,
        })
        .collect()
}

/// One planted network (uniform weights at PyTorch's default scale, 1/sqrt(fan-in)) and
/// `clients` copies of it, each with its own random permutation of every matched layer's
/// units and uniform noise of a tenth of the weights' scale; with `independent`, every
/// client draws its own planted network.
fn permuted_copies(
    input: &[usize],
    layers: &[LayerSpec],
    clients: usize,
    independent: bool,
) -> Result<Vec<Params>> {
    let (_, layout) = chain(FeatureShape::of(input)?, layers)?;
    let mut rng = StdRng::seed_from_u64(0);
    let draw = |rng: &mut StdRng| {
        let mut p = Params::zeros(&layout);
        for (_, t) in p.iter_mut() {
            let fan_in: usize = t.shape.iter().skip(1).product::<usize>().max(1);
            let bound = 1.0 / (fan_in as f32).sqrt();
            for v in &mut t.data {
                *v = rng.random_range(-bound..bound);
            }
        }
        p
    };
    let planted = draw(&mut rng);
    let vit = layers.iter().any(LayerSpec::is_transformer);
    let uses = match vit {
        true => Vec::new(),
        false => unit_uses(input, layers)?,
    };
    let mut nets = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut p = if independent {
            draw(&mut rng)
        } else {
            planted.clone()
        };
        for (_, t) in p.iter_mut() {
            let fan_in: usize = t.shape.iter().skip(1).product::<usize>().max(1);
            let noise = 0.1 / (fan_in as f32).sqrt();
            for v in &mut t.data {
                *v += rng.random_range(-noise..noise);
            }
        }
        for u in &uses {
            let mut perm: Vec<usize> = (0..u.units).collect();
            perm.shuffle(&mut rng);
            permute_units(&mut p, u, &perm)?;
        }
        if vit {
            p = permute_vit(layers, &p, &random_vit_permutations(layers, &mut rng)?)?;
        }
        nets.push(p);
    }
    Ok(nets)
}
