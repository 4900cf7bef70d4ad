//! Times one PFNM aggregation on synthetic MLP clients (the reference's `bench_pfnm.py`
//! "structured" mode): a 784-120-10 network, each of J clients holds a random 100 of the 120
//! hidden units in random order plus noise.
//!
//! `cargo run --release -p fedfuse-fuse --example pfnm_timing -- [clients] [iters]`

use std::time::Instant;

use fedfuse_core::Params;
use fedfuse_fuse::{PfnmConfig, Result, pfnm_fuse};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let iters: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let (d, h, keep, k) = (784usize, 120usize, 100usize, 10usize);
    let mut rng = StdRng::seed_from_u64(0);
    let w0: Vec<f64> = (0..h * d).map(|_| rng.random_range(-0.17..0.17)).collect();
    let w1: Vec<f64> = (0..k * h).map(|_| rng.random_range(-0.17..0.17)).collect();
    let mut nets = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut units: Vec<usize> = (0..h).collect();
        units.shuffle(&mut rng);
        units.truncate(keep);
        let mut noise = |v: f64| (v + rng.random_range(-0.087..0.087)) as f32;
        let mut p = Params::new();
        let a: Vec<f32> = units
            .iter()
            .flat_map(|&u| w0[u * d..(u + 1) * d].to_vec())
            .map(&mut noise)
            .collect();
        p.push("layers.0.weight", vec![keep, d], a)?;
        p.push(
            "layers.0.bias",
            vec![keep],
            (0..keep).map(|_| noise(0.1)).collect(),
        )?;
        let b: Vec<f32> = (0..k)
            .flat_map(|kk| units.iter().map(move |&u| (kk, u)))
            .map(|(kk, u)| noise(w1[kk * h + u]))
            .collect();
        p.push("layers.1.weight", vec![k, keep], b)?;
        p.push(
            "layers.1.bias",
            vec![k],
            (0..k).map(|_| noise(0.1)).collect(),
        )?;
        nets.push(p);
    }
    let refs: Vec<&Params> = nets.iter().collect();
    let counts = vec![vec![600.0; k]; clients];
    let cfg = PfnmConfig {
        iters,
        ..PfnmConfig::default()
    };
    let start = Instant::now();
    let fused = pfnm_fuse(&refs, Some(&counts), &cfg, &mut StdRng::seed_from_u64(1))?;
    let secs = start.elapsed().as_secs_f64();
    let width = fused
        .params
        .get("layers.0.bias")
        .map_or(0, |t| t.data.len());
    println!("{clients} clients of {d}-{keep}-{k}, it={iters}: {secs:.3} s, global width {width}");
    Ok(())
}
