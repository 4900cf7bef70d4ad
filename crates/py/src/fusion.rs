//! `fedfuse.fuse`: fusion of pre-trained models, and the matcher's keyword defaults.

use fedfuse_fuse::{MatchOrder, MatchPrior, PfnmConfig, WeightMatchingConfig};
use fedfuse_lab::fusion::{FuseMethod, FuseModel, FuseSettings, fuse_with};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::convert::*;

/// PFNM's defaults (`PfnmConfig::default()`) as a dict: the Python package's keyword
/// defaults.
#[pyfunction]
pub(crate) fn pfnm_defaults(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let defaults = PfnmConfig::default();
    let dict = to_py(py, &defaults)?;
    // A written config leaves the default width cap out; a keyword default needs it.
    dict.set_item("max_global", defaults.prior.max_global)?;
    Ok(dict)
}

/// Fuses pre-trained models (MLPs, or layer lists with `model`: a network name or a TOML
/// file); returns the fused tensors and the assignments as a dict (what `fedfuse fuse` writes
/// to `.assignments.json`), with `metadata`: what `fedfuse fuse` writes into the file's header.
#[pyfunction]
#[pyo3(signature = (models, method, class_counts, sigma, sigma0, gamma, iters, eps, max_global, bias_mean, order, seed, model, reset_bn))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fuse<'py>(
    py: Python<'py>,
    models: Vec<PyTensors<'py>>,
    method: &str,
    class_counts: Option<Vec<Vec<f64>>>,
    sigma: f64,
    sigma0: f64,
    gamma: f64,
    iters: usize,
    eps: f64,
    max_global: usize,
    bias_mean: f64,
    order: Option<&str>,
    seed: u64,
    model: Option<&str>,
    reset_bn: Option<(Vec<usize>, Bound<'py, PyBytes>, usize)>,
) -> PyResult<(PyTensors<'py>, Bound<'py, PyAny>)> {
    let method = FuseMethod::parse(method).map_err(err)?;
    let order = order
        .map(str::parse::<MatchOrder>)
        .transpose()
        .map_err(err)?;
    let model = model.map(FuseModel::parse).transpose().map_err(err)?;
    let models = models
        .into_iter()
        .enumerate()
        .map(|(j, m)| Ok((format!("model {j}"), params_from_py(m, j)?)))
        .collect::<PyResult<Vec<_>>>()?;
    let settings = FuseSettings {
        method,
        pfnm: PfnmConfig {
            prior: MatchPrior {
                sigma,
                sigma0,
                gamma,
                iters,
                max_global,
            },
            bias_mean,
            eps,
            ..PfnmConfig::default()
        },
        order,
        weight_matching: WeightMatchingConfig::default(),
        seed,
    };
    // Inputs for the batch norms (`[n, ...]`, little-endian f32) and the samples per pass.
    let reset_bn = match reset_bn {
        Some((shape, bytes, batch)) => {
            let data: Vec<f32> = bytes
                .as_bytes()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let samples = fedfuse_core::Tensor::new("reset_bn", shape, data).map_err(err)?;
            Some((samples, batch))
        }
        None => None,
    };
    let (fused, metadata) = py
        .detach(|| {
            let mut fused = fuse_with(models, model.as_ref(), class_counts.as_deref(), &settings)
                .map_err(|e| e.to_string())?;
            if let Some((samples, batch)) = &reset_bn {
                fused
                    .reestimate_batch_norm(samples, *batch)
                    .map_err(|e| format!("reset_bn: {e}"))?;
            }
            let metadata = fused.metadata().map_err(|e| e.to_string())?;
            Ok::<_, String>((fused, metadata))
        })
        .map_err(err)?;
    let report = to_py(py, &fused)?;
    report.set_item("metadata", to_py(py, &metadata)?)?;
    Ok((params_to_py(py, &fused.params), report))
}
