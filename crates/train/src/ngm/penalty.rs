//! The path-dependency matrix and the structure penalty (note 1.2, code version).
//!
//! `P = rownorm(|W_1|^T)`, then `P = rownorm(P . rownorm(|W_l|^T))` for each later layer, with
//! `W_l` in PyTorch layout `[out, in]` (so `|W_l|^T` is `in x out`) and `rownorm` scaling each
//! row to unit L2 norm (rows of norm below 1e-12 are left as they are, as `F.normalize` does).
//! Biases are ignored. `P[a, b]` is the strength of the paths from input unit `a` to output
//! unit `b`; it is zero exactly when every such path has a zero weight.

use burn::tensor::Tensor;
use fedfuse_core::{ModelSpec, Params};
use serde::{Deserialize, Serialize};

use crate::{Result, TrainError};

/// Which norm of the forbidden path mass `P ⊙ S^c` is penalised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PenaltyKind {
    /// Entrywise L1 `sum_ij P_ij S^c_ij` (the paper's Algorithm 1; the note's recommendation).
    #[default]
    L1,
    /// `log(||P ⊙ S^c||_F / U^2)` (the reference code's scaling, but with the Frobenius norm:
    /// the code's `torch.linalg.norm(ord=2)` is the spectral norm, which needs an SVD and its
    /// gradient and is not what the paper describes).
    LogScaled,
}

/// Which path matrix the penalty (and NGR's readout) uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathNorm {
    /// `P` as in the reference code: row-normalised after every factor ([`path_matrix`]).
    #[default]
    RowNormalised,
    /// The paper's `prod_l |W_l|^T` without normalisation ([`sensitivity_bounds`]): its entries
    /// bound `|d f_b / d x_a|`, and rescaling layers cannot shrink it without changing the
    /// function. Needed for NGR, whose all-entries L1 term the row-normalised `P` satisfies by
    /// routing every input to a single output (measured: the readout collapses to a star).
    Raw,
}

/// Row-normalises a row-major `rows x cols` matrix in place.
fn rownorm(m: &mut [f64], cols: usize) {
    for row in m.chunks_exact_mut(cols) {
        let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        row.iter_mut().for_each(|v| *v /= norm);
    }
}

/// The path matrix of an MLP's parameters (`layers.{i}.weight` `[out, in]`), row-major
/// `inputs x outputs`, as defined in the module docs.
pub fn path_matrix(params: &Params) -> Result<Vec<f32>> {
    path_product(params, true)
}

/// `prod_l |W_l|^T` without normalisation, row-major `inputs x outputs`: entry `(a, b)` bounds
/// `|d f_b / d x_a|` everywhere for a ReLU network.
pub fn sensitivity_bounds(params: &Params) -> Result<Vec<f32>> {
    path_product(params, false)
}

/// The path matrix of `params` of the given kind.
pub(crate) fn path_of(params: &Params, norm: PathNorm) -> Result<Vec<f32>> {
    path_product(params, norm == PathNorm::RowNormalised)
}

fn path_product(params: &Params, normalise: bool) -> Result<Vec<f32>> {
    let spec = ModelSpec::infer_mlp(params)?;
    let layers = match &spec {
        ModelSpec::Mlp { hidden, .. } => hidden.len() + 1,
        ModelSpec::LeNet5 { .. } | ModelSpec::Sequential { .. } => 0,
    };
    let mut p: Vec<f64> = Vec::new();
    let mut cols = 0;
    for l in 0..layers {
        let w = params.require(&format!("layers.{l}.weight"))?;
        let (out, inp) = (w.rows(), w.row_len());
        // |W_l|^T, in x out, row-normalised.
        let mut q = vec![0.0f64; inp * out];
        for o in 0..out {
            for i in 0..inp {
                q[i * out + o] = f64::from(w.data[o * inp + i]).abs();
            }
        }
        if normalise {
            rownorm(&mut q, out);
        }
        if l == 0 {
            p = q;
        } else {
            let rows = p.len() / cols;
            let mut next = vec![0.0f64; rows * out];
            for r in 0..rows {
                for k in 0..cols {
                    let a = p[r * cols + k];
                    if a != 0.0 {
                        let (dst, src) = (&mut next[r * out..(r + 1) * out], &q[k * out..]);
                        dst.iter_mut().zip(src).for_each(|(d, s)| *d += a * s);
                    }
                }
            }
            if normalise {
                rownorm(&mut next, out);
            }
            p = next;
        }
        cols = out;
    }
    Ok(p.into_iter().map(|v| v as f32).collect())
}

fn check_mask(p: &[f32], allowed: &[bool]) -> Result<()> {
    if p.len() != allowed.len() {
        return Err(TrainError::DataMismatch(format!(
            "the unit mask has {} entries but the model's path matrix has {}; \
             build the mask with `unit_mask` for the model's blocks",
            allowed.len(),
            p.len()
        )));
    }
    Ok(())
}

/// The entrywise L1 structure penalty `sum_ij P_ij [not allowed_ij]` of `params` against the
/// `U x U` unit mask `allowed` (see [`unit_mask`](crate::unit_mask)), in f64.
pub fn structure_penalty(params: &Params, allowed: &[bool]) -> Result<f64> {
    Ok(structure_report(params, allowed)?.penalty)
}

/// How well a model's paths respect a unit mask.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StructureReport {
    /// Entrywise L1 penalty: path mass on forbidden entries.
    pub penalty: f64,
    /// Forbidden path mass over all path mass (0: the structure is respected exactly).
    pub forbidden_fraction: f64,
    /// Largest forbidden entry of `P`.
    pub max_forbidden: f32,
    /// Largest allowed entry of `P` (the scale `max_forbidden` is to be read against).
    pub max_allowed: f32,
    /// The [`PenaltyKind::LogScaled`] value `log(||P ⊙ S^c||_F / U^2)` (`-inf` at zero).
    pub log_scaled: f64,
    /// Largest forbidden entry of the *unnormalised* product `prod_l |W_l|^T`, a bound on
    /// `|d f_b / d x_a|` over all inputs for a ReLU network: below 0.01, say, a forbidden input
    /// moves its output by at most 1% of its own change. `P`'s row normalisation discards
    /// scale, so a forbidden path can carry a real effect with a small `P` entry (a hidden unit
    /// feeding a huge weight to an allowed output and a moderate one to a forbidden output);
    /// this bound exposes that.
    pub max_forbidden_sensitivity: f32,
}

/// [`StructureReport`] of `params` against the unit mask `allowed`.
pub fn structure_report(params: &Params, allowed: &[bool]) -> Result<StructureReport> {
    let p = path_matrix(params)?;
    check_mask(&p, allowed)?;
    let units = (p.len() as f64).sqrt().max(1.0);
    let (mut forbidden, mut total, mut sq) = (0.0f64, 0.0f64, 0.0f64);
    let (mut max_forbidden, mut max_allowed) = (0.0f32, 0.0f32);
    for (&v, &ok) in p.iter().zip(allowed) {
        total += f64::from(v);
        if ok {
            max_allowed = max_allowed.max(v);
        } else {
            forbidden += f64::from(v);
            sq += f64::from(v) * f64::from(v);
            max_forbidden = max_forbidden.max(v);
        }
    }
    let raw = sensitivity_bounds(params)?;
    let max_forbidden_sensitivity = raw
        .iter()
        .zip(allowed)
        .filter(|(_, ok)| !**ok)
        .fold(0.0f32, |m, (&v, _)| m.max(v));
    Ok(StructureReport {
        max_forbidden_sensitivity,
        penalty: forbidden,
        forbidden_fraction: if total > 0.0 { forbidden / total } else { 0.0 },
        max_forbidden,
        max_allowed,
        log_scaled: (sq.sqrt() / (units * units)).ln(),
    })
}

/// Differentiable row normalisation of `[rows, cols]`; the tiny constant under the root keeps
/// the gradient finite (zero) for an all-zero row.
fn rownorm_t(m: Tensor<2>) -> Tensor<2> {
    let norm = m.clone().square().sum_dim(1).add_scalar(1e-24).sqrt();
    m / norm
}

/// The path matrix of burn weights (each `[in, out]`, i.e. already `W^T` in PyTorch terms),
/// still tracked by autodiff.
pub(crate) fn path_tensor(weights: Vec<Tensor<2>>, norm: PathNorm) -> Option<Tensor<2>> {
    let f = |m: Tensor<2>| match norm {
        PathNorm::RowNormalised => rownorm_t(m),
        PathNorm::Raw => m,
    };
    let mut it = weights.into_iter();
    let mut p = f(it.next()?.abs());
    for w in it {
        p = f(p.matmul(f(w.abs())));
    }
    Some(p)
}

/// The penalty of a path tensor against penalty weights `m` (`[U, U]`: 1 on forbidden
/// entries for an NGM, NGR's weights for NGR).
pub(crate) fn penalty_tensor(p: Tensor<2>, m: &Tensor<2>, kind: PenaltyKind) -> Tensor<1> {
    let [u, _] = p.dims();
    let masked = p * m.clone();
    match kind {
        PenaltyKind::L1 => masked.sum(),
        PenaltyKind::LogScaled => masked
            .square()
            .sum()
            .add_scalar(1e-24)
            .sqrt()
            .div_scalar((u * u) as f64)
            .log(),
    }
}

/// `||P ⊙ M||_F^2` in f64 from plain values (Algorithm 1's adaptive `lambda`).
pub(crate) fn masked_sq_norm(p: &[f32], m: &[f32]) -> f64 {
    p.iter()
        .zip(m)
        .map(|(&a, &b)| f64::from(a * b).powi(2))
        .sum()
}

/// Penalty value from plain values.
pub(crate) fn penalty_value(p: &[f32], m: &[f32], kind: PenaltyKind) -> f64 {
    match kind {
        PenaltyKind::L1 => p.iter().zip(m).map(|(&a, &b)| f64::from(a * b)).sum(),
        PenaltyKind::LogScaled => (masked_sq_norm(p, m).sqrt() / (p.len() as f64)).ln(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use burn::tensor::{Device, TensorData};
    use fedfuse_core::ModelSpec;

    use super::*;
    use crate::{Init, init_params};

    /// The differentiable path matrix (burn layout) equals the plain one (PyTorch layout).
    #[test]
    fn tensor_path_matches_plain_path() {
        let params = init_params(&ModelSpec::mlp(5, &[7, 6], 5), Init::Default, 3);
        let device = Device::flex();
        let weights: Vec<Tensor<2>> = (0..3)
            .map(|l| {
                let w = params.get(&format!("layers.{l}.weight")).unwrap();
                let (o, i) = (w.rows(), w.row_len());
                let t: Tensor<2> =
                    Tensor::from_data(TensorData::new(w.data.clone(), [o, i]), &device);
                t.transpose()
            })
            .collect();
        for norm in [PathNorm::RowNormalised, PathNorm::Raw] {
            let t = path_tensor(weights.clone(), norm).unwrap();
            let got = t.into_data().try_into_vec::<f32>().unwrap();
            let want = path_of(&params, norm).unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-5 * b.abs().max(1.0),
                    "{norm:?}: {a} vs {b}"
                );
            }
        }
    }
}
