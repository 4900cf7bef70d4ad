//! `fedfuse._core`: the Rust half of the `fedfuse` Python package. Everything here is a thin
//! conversion around fedfuse-lab and fedfuse-fed; the Python half (`python/fedfuse`) turns
//! these plain tuples into numpy arrays and Flower records.
//!
//! Flower content crosses as `(arrays, config, metrics)`: `arrays` a list of
//! `(key, dtype, shape, stype, data)`, `config` a list of `(key, bool | int | float | str)`,
//! `metrics` a list of `(key, int | float)` ([`fedfuse_core::flower`]).

mod client;
mod convert;
mod fusion;
mod runs;
mod server;

use std::path::Path;

use pyo3::prelude::*;

use client::Client;
use convert::{FedfuseError, err, record_from_flower, record_to_flower};
use fusion::{fuse, pfnm_defaults};
use server::Server;

/// Checks that a run's output folder is new or holds only an earlier run's files, so that
/// writing the run's outputs (which replaces the folder whole) loses nothing else.
#[pyfunction]
fn check_output_folder(out: &str) -> PyResult<()> {
    fedfuse_lab::table::check_replaceable(Path::new(out), &fedfuse_lab::table::RUN_FILES)
        .map_err(err)
}

/// ε at `delta` after `steps` releases of the Gaussian mechanism with `noise_multiplier` on a
/// Poisson sample of rate `q` (RDP accounting), and the order that gave it.
#[pyfunction]
fn rdp_epsilon(q: f64, noise_multiplier: f64, steps: usize, delta: f64) -> PyResult<(f64, f64)> {
    let valid = (0.0..=1.0).contains(&q)
        && (0.0..f64::INFINITY).contains(&noise_multiplier)
        && delta > 0.0
        && delta < 1.0;
    if !valid {
        return Err(err(format!(
            "rdp_epsilon needs q in [0, 1], noise_multiplier >= 0 and delta in (0, 1); got \
             q = {q}, noise_multiplier = {noise_multiplier}, delta = {delta}"
        )));
    }
    let mut acc = fedfuse_fuse::dp::RdpAccountant::default();
    acc.compose(q, noise_multiplier, steps);
    let spent = acc.epsilon(delta);
    Ok((spent.epsilon, spent.order))
}

/// The module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FedfuseError", m.py().get_type::<FedfuseError>())?;
    m.add_function(wrap_pyfunction!(fuse, m)?)?;
    m.add_function(wrap_pyfunction!(runs::run, m)?)?;
    m.add_function(wrap_pyfunction!(runs::evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(runs::compare, m)?)?;
    m.add_function(wrap_pyfunction!(runs::sweep, m)?)?;
    m.add_function(wrap_pyfunction!(pfnm_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_output_folder, m)?)?;
    m.add_function(wrap_pyfunction!(rdp_epsilon, m)?)?;
    m.add_function(wrap_pyfunction!(record_to_flower, m)?)?;
    m.add_function(wrap_pyfunction!(record_from_flower, m)?)?;
    m.add_class::<Server>()?;
    m.add_class::<Client>()?;
    Ok(())
}
