//! Sparse record sizes against the information bound, and encode/decode times.
//!
//! For n values with k = density * n at uniformly random positions, the bound is
//! `ceil(log2 C(n, k)) + 32 k` bits. Prints a markdown table: the blob (header + index +
//! values), the bound, their ratio, the index code chosen, the whole record on the wire
//! against its dense form, and the median of 5 `Record::encode` / `Record::decode` times.
//!
//! A second table is for what pruning units leaves (FedSparse, FedL1): a `[units, fan_in]`
//! weight with a fraction of its rows zero, where the positions are not random and the bound
//! above does not apply; it shows the index the blob spends against a bitmap's `n / 8`.
//!
//! `cargo run --release -p fedfuse-core --example sparse_bound`

use std::time::{Duration, Instant};

use fedfuse_core::sparse_codec::{self, information_bound_bits};
use fedfuse_core::{Params, Record, Result, Tensor};

/// xorshift64, seeded: the same positions every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `k` values in (-1, 1), none zero, at uniformly random positions of `n`.
fn random_sparse(n: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut data = vec![0.0f32; n];
    for i in 0..k {
        let j = i + (rng.next() % (n - i) as u64) as usize;
        order.swap(i, j);
        let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32;
        data[order[i]] = if u == 0.0 { 0.5 } else { 2.0 * u - 1.0 };
    }
    data
}

/// A `[rows, cols]` weight in (-1, 1), none zero, with each row zeroed with probability `p`.
fn unit_pruned(rows: usize, cols: usize, p: f64, rng: &mut Rng) -> Vec<f32> {
    let mut data = random_sparse(rows * cols, rows * cols, rng);
    for row in data.chunks_exact_mut(cols) {
        if ((rng.next() >> 11) as f64 / (1u64 << 53) as f64) < p {
            row.fill(0.0);
        }
    }
    data
}

fn median_of_5(mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    let mut times = Vec::with_capacity(5);
    for _ in 0..5 {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times[2])
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn main() -> Result<()> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    println!(
        "| n | density | k | blob bytes | header | bound bytes | blob / bound | index | record bytes | dense record bytes | encode ms | decode ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|:---|---:|---:|---:|---:|");
    for n in [100_000usize, 1_000_000] {
        for density in [0.001, 0.01, 0.1, 0.5, 0.9] {
            let k = (n as f64 * density).round() as usize;
            let data = random_sparse(n, k, &mut rng);
            let blob = sparse_codec::encode_tensor(&Tensor::new("w", vec![n], data.clone())?);
            let bound = information_bound_bits(n, k) / 8.0;
            let mut params = Params::new();
            params.push("w", vec![n], data)?;
            let record = Record::from_params(params).with_sparse(true);
            let bytes = record.encode()?;
            let dense = record.clone().with_sparse(false).encode()?.len();
            let encode = median_of_5(|| record.encode().map(drop))?;
            let decode = median_of_5(|| Record::decode(&bytes).map(drop))?;
            println!(
                "| {n} | {density} | {k} | {} | {} | {bound:.0} | {:.4} | {} | {} | {dense} | {} | {} |",
                blob.bytes.len(),
                blob.header_len,
                blob.bytes.len() as f64 / bound,
                blob.index,
                bytes.len(),
                ms(encode),
                ms(decode),
            );
        }
    }
    println!();
    println!(
        "| shape | rows pruned | blob bytes | index | index bytes | bitmap bytes | encode ms | decode ms |"
    );
    println!("|---|---:|---:|:---|---:|---:|---:|---:|");
    for (rows, cols) in [(200usize, 784usize), (200, 200), (120, 400)] {
        for p in [0.1, 0.5, 0.9] {
            let data = unit_pruned(rows, cols, p, &mut rng);
            let t = Tensor::new("w", vec![rows, cols], data.clone())?;
            let blob = sparse_codec::encode_tensor(&t);
            let pruned = data.chunks_exact(cols).filter(|r| r[0] == 0.0).count();
            let index = blob.bytes.len() - blob.header_len - 4 * blob.nonzeros;
            let mut params = Params::new();
            params.push("w", vec![rows, cols], data)?;
            let record = Record::from_params(params).with_sparse(true);
            let bytes = record.encode()?;
            let encode = median_of_5(|| record.encode().map(drop))?;
            let decode = median_of_5(|| Record::decode(&bytes).map(drop))?;
            println!(
                "| {rows} x {cols} | {pruned} | {} | {} | {index} | {} | {} | {} |",
                blob.bytes.len(),
                blob.index,
                (rows * cols).div_ceil(8),
                ms(encode),
                ms(decode),
            );
        }
    }
    Ok(())
}
