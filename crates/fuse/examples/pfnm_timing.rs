//! Times PFNM aggregations on synthetic MLP clients (the reference's `bench_pfnm.py`
//! "structured" mode): a planted 784-120-10 network, each of J clients holds a random 100 of
//! the 120 hidden units in random order plus noise. With more hidden layers every hidden layer
//! is 120 planted units of which each client keeps 100.
//!
//! `cargo run --release -p fedfuse-fuse --example pfnm_timing -- [clients] [iters] [hidden
//! layers] [repeats]` times one configuration; without arguments it times J = 10, 25, 50, 100
//! with one hidden layer and J = 10 with 2 and 4 hidden layers (it = 5, 3 repeats each).
//! Prints the wall time of every repeat, their median, and per hidden layer where the time of
//! the last repeat went (score matrices, assignment solver).

use std::time::Instant;

use fedfuse_core::Params;
use fedfuse_fuse::{PfnmConfig, Result, pfnm_fuse};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

fn main() -> Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if args.is_empty() {
        for (clients, hidden) in [(10, 1), (25, 1), (50, 1), (100, 1), (10, 2), (10, 4)] {
            time(clients, 5, hidden, 3)?;
        }
        return Ok(());
    }
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    time(arg(0, 10), arg(1, 5), arg(2, 1).max(1), arg(3, 1).max(1))
}

/// Fuses `clients` synthetic clients with `hidden` hidden layers `repeats` times and prints
/// the timings.
fn time(clients: usize, iters: usize, hidden: usize, repeats: usize) -> Result<()> {
    let (d, h, keep, k) = (784usize, 120usize, 100usize, 10usize);
    let nets = synthetic_clients(clients, hidden, (d, h, keep, k))?;
    let refs: Vec<&Params> = nets.iter().collect();
    let counts = vec![vec![600.0; k]; clients];
    let cfg = PfnmConfig {
        prior: fedfuse_fuse::MatchPrior {
            iters,
            ..fedfuse_fuse::MatchPrior::default()
        },
        ..PfnmConfig::default()
    };

    let mut times = Vec::with_capacity(repeats);
    let mut last = None;
    for _ in 0..repeats {
        let start = Instant::now();
        let fused = pfnm_fuse(&refs, Some(&counts), &cfg, &mut StdRng::seed_from_u64(1))?;
        times.push(start.elapsed().as_secs_f64());
        last = Some(fused);
    }
    let Some(fused) = last else {
        return Ok(());
    };
    let widths: Vec<usize> = (0..hidden)
        .map(|i| {
            fused
                .params
                .get(&format!("layers.{i}.bias"))
                .map_or(0, |t| t.data.len())
        })
        .collect();
    let runs: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let shape = std::iter::once(d)
        .chain(std::iter::repeat_n(keep, hidden))
        .chain([k])
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
        .join("-");
    println!(
        "{clients} clients of {shape}, it={iters}: {median:.3} s (median of [{}] s), global \
         width {widths:?}",
        runs.join(", ")
    );
    for (i, t) in fused.timings.iter().enumerate() {
        println!("  hidden layer {}: {t:.4}", i + 1);
    }
    Ok(())
}

/// `clients` noisy subsets of a planted `d-h-...-h-k` network (`hidden` layers of `h`), each
/// client keeping `keep` of every hidden layer's units in random order.
fn synthetic_clients(
    clients: usize,
    hidden: usize,
    (d, h, keep, k): (usize, usize, usize, usize),
) -> Result<Vec<Params>> {
    let planted_widths: Vec<usize> = std::iter::once(d)
        .chain(std::iter::repeat_n(h, hidden))
        .chain([k])
        .collect();
    let mut rng = StdRng::seed_from_u64(0);
    let planted: Vec<Vec<f64>> = planted_widths
        .windows(2)
        .map(|w| {
            (0..w[0] * w[1])
                .map(|_| rng.random_range(-0.17..0.17))
                .collect()
        })
        .collect();
    let mut nets = Vec::with_capacity(clients);
    for _ in 0..clients {
        // Which planted units the client holds, per layer (all inputs and outputs).
        let mut kept: Vec<Vec<usize>> = vec![(0..d).collect()];
        for _ in 0..hidden {
            let mut units: Vec<usize> = (0..h).collect();
            units.shuffle(&mut rng);
            units.truncate(keep);
            kept.push(units);
        }
        kept.push((0..k).collect());
        let mut p = Params::new();
        for (i, w) in planted.iter().enumerate() {
            let (rows, cols) = (&kept[i + 1], &kept[i]);
            let n_in = planted_widths[i];
            let weight: Vec<f32> = rows
                .iter()
                .flat_map(|&r| cols.iter().map(move |&c| w[r * n_in + c]))
                .map(|v| (v + rng.random_range(-0.087..0.087)) as f32)
                .collect();
            p.push(
                format!("layers.{i}.weight"),
                vec![rows.len(), cols.len()],
                weight,
            )?;
            let bias = (0..rows.len())
                .map(|_| (0.1 + rng.random_range(-0.087..0.087)) as f32)
                .collect();
            p.push(format!("layers.{i}.bias"), vec![rows.len()], bias)?;
        }
        nets.push(p);
    }
    Ok(nets)
}
