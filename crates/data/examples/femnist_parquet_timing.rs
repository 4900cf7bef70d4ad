//! Times reading FEMNIST from Flower Datasets' Parquet form: writes `writers` x `images`
//! synthetic rows in `flwrlabs/femnist`'s schema (one 28x28 PNG each, snappy, row groups of
//! 10,000), then reads them back with `load_dataset("femnist", ..)` and prints the seconds,
//! the images per second and the bytes per image.
//!
//! `cargo run --release -p fedfuse-data --example femnist_parquet_timing -- 3597 20`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[allow(dead_code)]
#[path = "../tests/data/femnist_files.rs"]
mod femnist_files;

use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("writers and images per writer, as numbers")
        })
        .collect();
    let (writers, images) = match args[..] {
        [w, i] => (w, i),
        _ => (3597, 20),
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train-00000-of-00001.parquet");
    let names: Vec<String> = (0..writers).map(|w| format!("f{w:04}_00")).collect();
    let rows: Vec<femnist_files::Row> = (0..writers)
        .flat_map(|w| (0..images).map(move |k| (w, k)))
        .map(|(w, k)| femnist_files::row(w, &names[w], k))
        .collect();
    femnist_files::write_parquet_with(&file, femnist_files::SCHEMA, &rows, 10_000);
    drop(rows);
    let bytes = std::fs::metadata(&file).unwrap().len();
    let start = Instant::now();
    let data = fedfuse_data::load_dataset("femnist", Some(dir.path())).unwrap();
    let seconds = start.elapsed().as_secs_f64();
    let n = data.train.len() + data.test.len();
    println!(
        "{n} images of {writers} writers, {bytes} bytes ({:.0} an image): read in {seconds:.2} s, \
         {:.0} images/s; {} train, {} held out",
        bytes as f64 / n as f64,
        n as f64 / seconds,
        data.train.len(),
        data.test.len()
    );
}
