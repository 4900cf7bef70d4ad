//! Parameter groups for structured sparsity, shared by FedSparse and FedL1, client and server.
//!
//! A group is one output unit of a layer: row `u` of a dense weight `[out, in]` (or filter `u`
//! of a convolution weight `[out, in, kh, kw]`) together with `bias[u]`. Zeroing a group
//! removes the unit: its output is `relu(0) = 0` for every input.
//!
//! Every layer but the output layer is grouped. The paper gates every unit, but a gate on the
//! final classifier can switch off a class for good (its logit stuck at 0), and the paper
//! itself leaves the output layer ungated for CIFAR-100; so the output layer stays dense here.
//!
//! Everything in this module is plain arithmetic on [`Params`]; no tensor library.

use fedfuse_core::{CoreError, ModelSpec, Params};

use crate::{Result, TrainError};

/// The groups of one layer: `units` groups of `fan_in + 1` values each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLayout {
    /// Name of the weight tensor; its first axis indexes the groups.
    pub weight: String,
    /// Name of the bias tensor, one value per group.
    pub bias: String,
    /// Groups (output units or filters) in the layer.
    pub units: usize,
    /// Weights per group: the weight's row length (`in`, or `in * kh * kw`).
    pub fan_in: usize,
}

impl GroupLayout {
    /// Values per group, the bias included: `|g|` in the L0 penalty.
    pub fn size(&self) -> usize {
        self.fan_in + 1
    }
}

/// The grouped layers of `spec`, in forward order: every weight/bias pair but the last (the
/// output layer). An MLP without hidden layers has none.
pub fn groups(spec: &ModelSpec) -> Vec<GroupLayout> {
    let shapes = spec.param_shapes();
    let layers: Vec<GroupLayout> = shapes
        .chunks_exact(2)
        .map(|pair| {
            let (w, b) = (&pair[0], &pair[1]);
            GroupLayout {
                weight: w.name.clone(),
                bias: b.name.clone(),
                units: w.shape.first().copied().unwrap_or(0),
                fan_in: w.shape.iter().skip(1).product(),
            }
        })
        .collect();
    let gated = layers.len().saturating_sub(1);
    layers.into_iter().take(gated).collect()
}

/// Weight rows and bias of one grouped layer, checked against its layout.
fn layer<'a>(params: &'a Params, g: &GroupLayout) -> Result<(&'a [f32], &'a [f32])> {
    let w = params.require(&g.weight)?;
    let b = params.require(&g.bias)?;
    if w.rows() != g.units || w.row_len() != g.fan_in || b.data.len() != g.units {
        return Err(CoreError::LayoutMismatch(format!(
            "`{}` {:?} / `{}` {:?} do not hold {} groups of {} weights",
            g.weight, w.shape, g.bias, b.shape, g.units, g.fan_in
        ))
        .into());
    }
    Ok((&w.data, &b.data))
}

/// Euclidean norm of each group, per grouped layer: `||(w[u, ..], b[u])||_2`.
pub fn group_norms(spec: &ModelSpec, params: &Params) -> Result<Vec<Vec<f32>>> {
    groups(spec)
        .iter()
        .map(|g| {
            let (w, b) = layer(params, g)?;
            Ok((0..g.units)
                .map(|u| unit_norm(&w[u * g.fan_in..(u + 1) * g.fan_in], b[u]) as f32)
                .collect())
        })
        .collect()
}

fn unit_norm(row: &[f32], bias: f32) -> f64 {
    (row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() + f64::from(bias).powi(2)).sqrt()
}

/// `v * s`, with a factor of 0 giving +0.0 (never -0.0), so that zeroed groups are plain zeros
/// for sparse encoders.
fn scaled(v: f32, s: f64) -> f32 {
    if s == 0.0 {
        0.0
    } else {
        (f64::from(v) * s) as f32
    }
}

/// Multiplies each group by `factor(layer, unit, norm)`, in place.
fn scale_groups(
    spec: &ModelSpec,
    params: &mut Params,
    mut factor: impl FnMut(usize, usize, f64) -> f64,
) -> Result<()> {
    for (l, g) in groups(spec).iter().enumerate() {
        layer(params, g)?;
        let mut scales = Vec::with_capacity(g.units);
        if let (Some(w), Some(b)) = (params.get(&g.weight), params.get(&g.bias)) {
            for u in 0..g.units {
                let norm = unit_norm(&w.data[u * g.fan_in..(u + 1) * g.fan_in], b.data[u]);
                scales.push(factor(l, u, norm));
            }
        }
        if let Some(w) = params.get_mut(&g.weight) {
            for (row, s) in w.data.chunks_exact_mut(g.fan_in.max(1)).zip(&scales) {
                row.iter_mut().for_each(|v| *v = scaled(*v, *s));
            }
        }
        if let Some(b) = params.get_mut(&g.bias) {
            for (v, s) in b.data.iter_mut().zip(&scales) {
                *v = scaled(*v, *s);
            }
        }
    }
    Ok(())
}

/// Group soft-thresholding, the proximal step of the group-L1 penalty:
/// `w_g *= max(0, 1 - threshold / ||w_g||)`. Groups with norm at most `threshold` become
/// exactly zero; the others shrink. Returns how many groups are zero afterwards.
pub fn soft_threshold_groups(
    spec: &ModelSpec,
    params: &mut Params,
    threshold: f64,
) -> Result<usize> {
    threshold_groups(spec, params, threshold, |norm| 1.0 - threshold / norm)
}

/// Group hard-thresholding (the FedL1 paper's eq. 25, which it found to work better than
/// soft-thresholding): groups with norm at most `threshold` become exactly zero, the others
/// are kept as they are. Returns how many groups are zero afterwards.
pub fn hard_threshold_groups(
    spec: &ModelSpec,
    params: &mut Params,
    threshold: f64,
) -> Result<usize> {
    threshold_groups(spec, params, threshold, |_| 1.0)
}

/// Zeroes the groups with norm at most `threshold` and scales the others by `kept(norm)`;
/// returns how many groups are zero afterwards.
fn threshold_groups(
    spec: &ModelSpec,
    params: &mut Params,
    threshold: f64,
    kept: impl Fn(f64) -> f64,
) -> Result<usize> {
    check_threshold(threshold)?;
    let mut zero = 0;
    scale_groups(spec, params, |_, _, norm| {
        if norm <= threshold {
            zero += 1;
            0.0
        } else {
            kept(norm)
        }
    })?;
    Ok(zero)
}

fn check_threshold(threshold: f64) -> Result<()> {
    if threshold.is_finite() && threshold >= 0.0 {
        Ok(())
    } else {
        Err(TrainError::InvalidConfig {
            field: "method.threshold",
            reason: format!("{threshold} is not a non-negative number"),
        })
    }
}

/// Zeroes (exactly) every group whose `keep` entry is false; `keep` holds one entry per group,
/// per grouped layer, as [`group_norms`] returns them.
pub fn mask_groups(spec: &ModelSpec, params: &mut Params, keep: &[Vec<bool>]) -> Result<()> {
    check_per_group(spec, keep, "gates")?;
    scale_groups(spec, params, |l, u, _| if keep[l][u] { 1.0 } else { 0.0 })
}

/// Checks that `values` holds one entry per group of `spec`.
pub(crate) fn check_per_group<T>(spec: &ModelSpec, values: &[Vec<T>], what: &str) -> Result<()> {
    let layout = groups(spec);
    let fits =
        values.len() == layout.len() && values.iter().zip(&layout).all(|(v, g)| v.len() == g.units);
    if fits {
        Ok(())
    } else {
        Err(TrainError::GroupMismatch(format!(
            "{what} have per-layer lengths {:?}; the model's groups are {:?}",
            values.iter().map(Vec::len).collect::<Vec<_>>(),
            layout.iter().map(|g| g.units).collect::<Vec<_>>()
        )))
    }
}
