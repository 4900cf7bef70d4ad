//! Parameter groups and their gates: the one definition that clients (fedfuse-train, on
//! tensors) and the server (fedfuse-fuse, on plain values) share, for FedSparse, FedL1 and
//! FedDrop.
//!
//! A group is one output unit of a layer: row `u` of a dense weight `[out, in]` (or filter `u`
//! of a convolution weight `[out, in, kh, kw]`) together with `bias[u]`. Zeroing a group
//! removes the unit: its output is `relu(0) = 0` for every input. An attention head is one
//! group too: its `head_dim` rows in each of the q, k and v sections of the packed
//! `in_proj_weight`, with their `in_proj_bias` entries. Zeroed, its queries and keys are 0 (the
//! weights uniform) and so are its values, so the head's output is 0 ([`GroupedLayer::heads`]).
//!
//! [`GroupLayout::of_model`] groups every layer but the output layer. The paper gates every
//! unit, but a gate on the final classifier can switch off a class for good (its logit stuck
//! at 0), and the paper itself leaves the output layer ungated for CIFAR-100.
//!
//! Groups are numbered layer by layer in forward order, units in order within a layer; every
//! per-group vector (norms, thresholds, gates) uses that numbering.
//!
//! FedSparse's gate of group `g` (fedsparse-em eq. 23) is on with probability
//! `sigmoid((||w_g|| - softplus(v_g)) / T)`: [`gate_probability`].
//!
//! ```
//! use fedfuse_core::{GroupLayout, ModelSpec, Params};
//! let spec = ModelSpec::mlp(4, &[3], 2);
//! let layout = GroupLayout::of_model(&spec);
//! assert_eq!(layout.num_groups(), 3); // the hidden units; the output layer is ungated
//! let params = Params::zeros(&spec.param_shapes());
//! assert_eq!(layout.norms(&params)?, vec![0.0; 3]);
//! # Ok::<(), fedfuse_core::CoreError>(())
//! ```

use std::ops::Range;

use crate::{CoreError, ModelSpec, ParamShape, Params, Result};

/// The groups of one layer: `units` groups, each `unit_rows` rows of `fan_in` weights and
/// `unit_rows` values of each per-unit tensor (the bias, and the scale and shift of a norm
/// that follows) in each of `sections` sections.
///
/// The weight's first axis is `sections` equal sections, each holding every unit's
/// `unit_rows` rows in unit order; each per-unit tensor is laid out the same way. A neuron or
/// filter is one row of one section; an attention head is `head_dim` rows in each of the
/// q, k and v sections of `in_proj_weight`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupedLayer {
    /// Name of the weight tensor; its first axis indexes the groups' rows.
    pub weight: String,
    /// Names of the `[sections * units * unit_rows]` tensors whose entries line up with the
    /// weight's rows: the bias, and a following norm's weight and bias (zeroing those too
    /// makes the unit's output 0).
    pub per_unit: Vec<String>,
    /// Groups (output units, filters or heads) in the layer.
    pub units: usize,
    /// The weight's row length (`in`, or `in * kh * kw`).
    pub fan_in: usize,
    /// Sections of the weight's first axis: 3 for q, k and v packed together, else 1.
    pub sections: usize,
    /// Rows of each unit in each section: a head's `head_dim`, else 1.
    pub unit_rows: usize,
}

impl GroupedLayer {
    /// A layer whose groups are rows of `weight` with their entry of `bias`.
    pub fn dense(weight: &str, bias: &str, units: usize, fan_in: usize) -> Self {
        Self::rows(weight, vec![bias.into()], units, fan_in)
    }

    /// A layer whose groups are the rows of `weight` with their entries of `per_unit`.
    pub fn rows(weight: &str, per_unit: Vec<String>, units: usize, fan_in: usize) -> Self {
        Self {
            weight: weight.into(),
            per_unit,
            units,
            fan_in,
            sections: 1,
            unit_rows: 1,
        }
    }

    /// The heads of a multi-head attention whose packed projection `weight`
    /// (`[3 * hidden, hidden]`, q then k then v) and `bias` (`[3 * hidden]`) have `heads`
    /// heads of `hidden / heads` features each.
    pub fn heads(weight: &str, bias: &str, heads: usize, hidden: usize) -> Self {
        Self {
            sections: 3,
            unit_rows: hidden / heads.max(1),
            ..Self::rows(weight, vec![bias.into()], heads, hidden)
        }
    }

    /// Rows of the weight (entries of each per-unit tensor).
    pub fn total_rows(&self) -> usize {
        self.sections * self.units * self.unit_rows
    }

    /// Values per group, the bias included: `|g|` in the L0 penalty.
    pub fn size(&self) -> usize {
        self.sections * self.unit_rows * (self.fan_in + self.per_unit.len())
    }
}

/// How the values of one grouped tensor map to groups: the tensor is `sections` sections of
/// `rows` blocks each, every block `block` rows of `row_len` values; block `r` of every section
/// belongs to group `first + r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupedRows {
    /// Group of block 0.
    pub first: usize,
    /// Blocks (groups) in each section.
    pub rows: usize,
    /// Values per row: `fan_in` for a weight, 1 for a bias.
    pub row_len: usize,
    /// Rows per block: [`GroupedLayer::unit_rows`].
    pub block: usize,
    /// [`GroupedLayer::sections`].
    pub sections: usize,
}

impl GroupedRows {
    /// `(group, range of values)` of each block, section by section.
    pub fn spans(self) -> impl Iterator<Item = (usize, Range<usize>)> {
        let len = self.block * self.row_len;
        (0..self.sections * self.rows)
            .map(move |b| (self.first + b % self.rows, b * len..(b + 1) * len))
    }
}

/// Which values of a model form which group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLayout {
    shapes: Vec<ParamShape>,
    layers: Vec<GroupedLayer>,
    /// First group of each layer, then the number of groups.
    starts: Vec<usize>,
    /// Per tensor of `shapes`: its rows' groups, `None` when it is ungated.
    rows: Vec<Option<GroupedRows>>,
}

impl GroupLayout {
    /// The groups of `spec`: every weight/bias pair but the last (the output layer), in forward
    /// order. An MLP without hidden layers has none.
    pub fn of_model(spec: &ModelSpec) -> Self {
        let shapes = spec.param_shapes();
        if let ModelSpec::Sequential { input, layers } = spec {
            // A checked spec chains; one that does not has no groups to gate.
            let layers = crate::layers::gate_points(input, layers)
                .map(|points| points.into_iter().map(|p| p.group).collect())
                .unwrap_or_default();
            return Self::from_parts(shapes, layers);
        }
        let mut layers: Vec<GroupedLayer> = shapes
            .chunks_exact(2)
            .map(|pair| {
                GroupedLayer::dense(
                    &pair[0].name,
                    &pair[1].name,
                    pair[0].shape.first().copied().unwrap_or(0),
                    pair[0].shape.iter().skip(1).product(),
                )
            })
            .collect();
        layers.pop();
        // A spec's weights and biases agree by construction; nothing to check.
        Self::from_parts(shapes, layers)
    }

    /// A layout over the tensors `shapes` with the grouped `layers` (each weight
    /// [`GroupedLayer::total_rows`] rows of `fan_in` values, each per-unit tensor that many
    /// entries, no tensor in two layers); every other tensor is ungated.
    pub fn new(shapes: Vec<ParamShape>, layers: Vec<GroupedLayer>) -> Result<Self> {
        let find = |name: &str| shapes.iter().position(|s| s.name == name);
        let mut used = vec![false; shapes.len()];
        for l in &layers {
            let bad = |what: String| {
                Err(CoreError::LayoutMismatch(format!(
                    "grouped layer `{}` / {:?} ({} groups of {} weights): {what}",
                    l.weight, l.per_unit, l.units, l.fan_in
                )))
            };
            let Some(w) = find(&l.weight) else {
                return bad("a tensor is not in the layout".into());
            };
            let ws = &shapes[w].shape;
            let rows = l.total_rows();
            if l.sections == 0
                || l.unit_rows == 0
                || ws.first() != Some(&rows)
                || ws.iter().skip(1).product::<usize>() != l.fan_in
            {
                return bad(format!("the weight has shape {ws:?}"));
            }
            let mut members = vec![w];
            for name in &l.per_unit {
                let Some(b) = find(name) else {
                    return bad(format!("`{name}` is not in the layout"));
                };
                if shapes[b].shape != [rows] {
                    return bad(format!("`{name}` has shape {:?}", shapes[b].shape));
                }
                members.push(b);
            }
            for t in members {
                if std::mem::replace(&mut used[t], true) {
                    return bad(format!("`{}` is grouped twice", shapes[t].name));
                }
            }
        }
        Ok(Self::from_parts(shapes, layers))
    }

    fn from_parts(shapes: Vec<ParamShape>, layers: Vec<GroupedLayer>) -> Self {
        let mut starts = Vec::with_capacity(layers.len() + 1);
        let mut rows = vec![None; shapes.len()];
        let mut next = 0;
        for l in &layers {
            starts.push(next);
            let tensors =
                std::iter::once((&l.weight, l.fan_in)).chain(l.per_unit.iter().map(|b| (b, 1)));
            for (name, row_len) in tensors {
                if let Some(t) = shapes.iter().position(|s| &s.name == name) {
                    rows[t] = Some(GroupedRows {
                        first: next,
                        rows: l.units,
                        row_len,
                        block: l.unit_rows,
                        sections: l.sections,
                    });
                }
            }
            next += l.units;
        }
        starts.push(next);
        Self {
            shapes,
            layers,
            starts,
            rows,
        }
    }

    /// The grouped layers, in forward order.
    pub fn layers(&self) -> &[GroupedLayer] {
        &self.layers
    }

    /// The model layout this grouping is for.
    pub fn shapes(&self) -> &[ParamShape] {
        &self.shapes
    }

    /// Number of groups.
    pub fn num_groups(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The groups of layer `layer` (empty past the last layer).
    pub fn layer_groups(&self, layer: usize) -> Range<usize> {
        match (self.starts.get(layer), self.starts.get(layer + 1)) {
            (Some(&a), Some(&b)) => a..b,
            _ => 0..0,
        }
    }

    /// How tensor `tensor` (its index in [`Self::shapes`]) is grouped; `None` when ungated.
    pub fn grouped_rows(&self, tensor: usize) -> Option<GroupedRows> {
        self.rows.get(tensor).copied().flatten()
    }

    /// Checks that `params` has this layout, naming the first tensor that differs.
    pub fn check(&self, params: &Params) -> Result<()> {
        params.check_layout(&self.shapes)
    }

    /// Checks that `values` holds one entry per group; `what` names them in the error.
    pub fn check_per_group<T>(&self, values: &[T], what: &str) -> Result<()> {
        if values.len() == self.num_groups() {
            Ok(())
        } else {
            Err(CoreError::GroupMismatch(format!(
                "{} {what} for {} groups (per layer: {:?})",
                values.len(),
                self.num_groups(),
                self.layers.iter().map(|l| l.units).collect::<Vec<_>>()
            )))
        }
    }

    /// Euclidean norm of each group, `||(w[u, ..], b[u], ...)||_2`, accumulated in f64.
    pub fn norms(&self, params: &Params) -> Result<Vec<f64>> {
        self.check(params)?;
        let mut sq = vec![0.0f64; self.num_groups()];
        for (i, (_, t)) in params.iter().enumerate() {
            if let Some(rows) = self.grouped_rows(i) {
                for (g, span) in rows.spans() {
                    sq[g] += t.data[span]
                        .iter()
                        .map(|&v| f64::from(v).powi(2))
                        .sum::<f64>();
                }
            }
        }
        Ok(sq.into_iter().map(f64::sqrt).collect())
    }

    /// Multiplies each group by `factor(group, norm)`, in place.
    fn scale(&self, params: &mut Params, mut factor: impl FnMut(usize, f64) -> f64) -> Result<()> {
        let norms = self.norms(params)?;
        let scales: Vec<f64> = norms
            .iter()
            .enumerate()
            .map(|(g, &n)| factor(g, n))
            .collect();
        self.for_each_span_mut(params, |g, values| {
            let s = scales[g];
            values.iter_mut().for_each(|v| *v = scaled(*v, s));
        });
        Ok(())
    }

    /// Calls `f(group, values)` on every row of every grouped tensor of `params` (whose
    /// layout has been checked).
    fn for_each_span_mut(&self, params: &mut Params, mut f: impl FnMut(usize, &mut [f32])) {
        for (i, (_, t)) in params.iter_mut().enumerate() {
            if let Some(rows) = self.grouped_rows(i) {
                for (g, span) in rows.spans() {
                    f(g, &mut t.data[span]);
                }
            }
        }
    }

    /// Zeroes (to +0.0) every group whose `keep` entry is false; the others are untouched.
    pub fn mask(&self, params: &mut Params, keep: &[bool]) -> Result<()> {
        self.check_per_group(keep, "gates")?;
        self.check(params)?;
        self.for_each_span_mut(params, |g, values| {
            if !keep[g] {
                values.fill(0.0);
            }
        });
        Ok(())
    }

    /// Group soft-thresholding, the proximal step of the group-L1 penalty:
    /// `w_g *= max(0, 1 - threshold / ||w_g||)`. Groups with norm at most `threshold` become
    /// exactly zero; the others shrink. Returns how many groups are zero afterwards.
    pub fn soft_threshold(&self, params: &mut Params, threshold: f64) -> Result<usize> {
        self.threshold(params, threshold, |norm| 1.0 - threshold / norm)
    }

    /// Group hard-thresholding (the FedL1 paper's eq. 25, which it found to work better than
    /// soft-thresholding): groups with norm at most `threshold` become exactly zero, the
    /// others are kept as they are. Returns how many groups are zero afterwards.
    pub fn hard_threshold(&self, params: &mut Params, threshold: f64) -> Result<usize> {
        self.threshold(params, threshold, |_| 1.0)
    }

    /// Zeroes the groups with norm at most `threshold` and scales the others by `kept(norm)`.
    fn threshold(
        &self,
        params: &mut Params,
        threshold: f64,
        kept: impl Fn(f64) -> f64,
    ) -> Result<usize> {
        if !(threshold.is_finite() && threshold >= 0.0) {
            return Err(CoreError::InvalidSetting {
                field: "threshold",
                reason: format!("{threshold} is not a non-negative number"),
            });
        }
        let mut zero = 0;
        self.scale(params, |_, norm| {
            if norm <= threshold {
                zero += 1;
                0.0
            } else {
                kept(norm)
            }
        })?;
        Ok(zero)
    }

    /// Gate logits `(||w_g|| - softplus(v_g)) / T` of `params` with thresholds `v`.
    pub fn gate_logits(&self, params: &Params, v: &[f32], temperature: f64) -> Result<Vec<f64>> {
        check_temperature(temperature)?;
        self.check_thresholds(v)?;
        Ok(self
            .norms(params)?
            .iter()
            .zip(v)
            .map(|(&n, &v)| gate_logit(n, f64::from(v), temperature))
            .collect())
    }

    /// Gate probabilities (eq. 23): the server's `theta` from its `(w, v)`, or a client's
    /// `pi_s` from `(w_s, v_s)`.
    pub fn gate_probabilities(
        &self,
        params: &Params,
        v: &[f32],
        temperature: f64,
    ) -> Result<Vec<f64>> {
        Ok(self
            .gate_logits(params, v, temperature)?
            .into_iter()
            .map(sigmoid)
            .collect())
    }

    /// Thresholds `v` that give every group of `params` the gate probability `theta0`
    /// (see [`initial_threshold`]).
    pub fn initial_thresholds(
        &self,
        params: &Params,
        theta0: f64,
        temperature: f64,
    ) -> Result<Vec<f32>> {
        check_temperature(temperature)?;
        if !(theta0 > 0.0 && theta0 < 1.0) {
            return Err(CoreError::InvalidSetting {
                field: "initial_theta",
                reason: format!("{theta0} is not in (0, 1)"),
            });
        }
        Ok(self
            .norms(params)?
            .into_iter()
            .map(|n| initial_threshold(n, theta0, temperature) as f32)
            .collect())
    }

    /// Checks one finite threshold per group.
    pub fn check_thresholds(&self, v: &[f32]) -> Result<()> {
        self.check_per_group(v, "thresholds")?;
        match v.iter().position(|x| !x.is_finite()) {
            Some(g) => Err(CoreError::GroupMismatch(format!(
                "threshold `v` of group {g} is {}",
                v[g]
            ))),
            None => Ok(()),
        }
    }
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

fn check_temperature(t: f64) -> Result<()> {
    if t.is_finite() && t > 0.0 {
        Ok(())
    } else {
        Err(CoreError::InvalidSetting {
            field: "temperature",
            reason: format!("{t} is not a positive number"),
        })
    }
}

/// `ln(1 + e^x)`, stable for large `|x|`.
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The inverse of [`softplus`] for `y > 0`: `ln(e^y - 1)`.
pub fn softplus_inv(y: f64) -> f64 {
    // Written as `y + ln(1 - e^-y)` so that nothing overflows for large `y`, with `exp_m1` so
    // that `1 - e^-y` keeps its precision for small `y`.
    y + (-(-y).exp_m1()).ln()
}

/// The logistic function, stable for large `|x|`.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// The gate logit `(norm - softplus(v)) / T` of a group with norm `norm` and threshold
/// parameter `v` (the threshold itself is `softplus(v) > 0`).
pub fn gate_logit(norm: f64, v: f64, temperature: f64) -> f64 {
    (norm - softplus(v)) / temperature
}

/// FedSparse's gate probability (fedsparse-em eq. 23): `sigmoid((norm - softplus(v)) / T)`.
pub fn gate_probability(norm: f64, v: f64, temperature: f64) -> f64 {
    sigmoid(gate_logit(norm, v, temperature))
}

/// The threshold parameter `v` that gives a group of norm `norm` the gate probability
/// `theta0` at temperature `T`: `v = softplus^-1(norm - T logit(theta0))`. A threshold must be
/// positive, so a group too small for that (norm at most `T logit(theta0)`, e.g. a zero group)
/// gets the threshold `1e-6` and so a lower probability (about 0.5 for a zero group).
pub fn initial_threshold(norm: f64, theta0: f64, temperature: f64) -> f64 {
    let offset = temperature * (theta0 / (1.0 - theta0)).ln();
    softplus_inv((norm - offset).max(1e-6))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn softplus_inv_inverts_softplus_over_the_whole_range() {
        for y in [
            1e-12, 1e-6, 1e-3, 0.1, 0.5, 1.0, 2.0, 10.0, 30.0, 40.0, 700.0, 1e5,
        ] {
            let x = softplus_inv(y);
            assert!(x.is_finite(), "{y}");
            // Round trips are as good as softplus's conditioning allows.
            let back = softplus(x);
            assert!((back - y).abs() <= 1e-13 * y, "{y} -> {x} -> {back}");
            if (1e-3..30.0).contains(&y) {
                let direct = y.exp_m1().ln();
                assert!((x - direct).abs() <= 1e-13 * direct.abs().max(1e-3), "{y}");
            }
        }
        // ln(e - 1) is the v with softplus(v) = 1.
        let v1 = (std::f64::consts::E - 1.0).ln();
        assert!((softplus_inv(1.0) - v1).abs() < 1e-15);
    }

    #[test]
    fn sigmoid_is_stable_and_symmetric() {
        for x in [-800.0, -40.0, -3.0, -1e-9, 0.0, 2.5, 40.0, 800.0] {
            let (p, q) = (sigmoid(x), sigmoid(-x));
            assert!((0.0..=1.0).contains(&p));
            assert!((p + q - 1.0).abs() < 1e-15, "{x}");
        }
        assert!(sigmoid(-800.0) > 0.0 || sigmoid(-800.0) == 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }

    #[test]
    fn initial_threshold_gives_theta0() {
        for (norm, theta0, t) in [(1.0, 0.99, 1e-3), (5.0, 0.5, 0.1), (0.3, 0.9, 0.1)] {
            let v = initial_threshold(norm, theta0, t);
            let p = gate_probability(norm, v, t);
            assert!((p - theta0).abs() < 1e-9, "{norm} {theta0} {t}: {p}");
        }
        // A zero group gets the smallest threshold and so a probability of about 0.5.
        let v = initial_threshold(0.0, 0.99, 1.0);
        assert!((softplus(v) - 1e-6).abs() < 1e-15);
        let p = gate_probability(0.0, v, 1.0);
        assert!(p > 0.4999 && p < 0.5, "{p}");
    }

    #[test]
    fn layouts_name_what_does_not_fit() {
        let shapes = ModelSpec::mlp(3, &[2], 5).param_shapes();
        let layer = GroupedLayer::dense;
        let ok = GroupLayout::new(
            shapes.clone(),
            vec![layer("layers.0.weight", "layers.0.bias", 2, 3)],
        )
        .unwrap();
        assert_eq!(ok, GroupLayout::of_model(&ModelSpec::mlp(3, &[2], 5)));
        for (bad, word) in [
            (layer("layers.0.weight", "nope", 2, 3), "not in the layout"),
            (layer("layers.0.weight", "layers.0.bias", 2, 4), "weight"),
            (layer("layers.0.weight", "layers.1.bias", 2, 3), "bias"),
        ] {
            let err = GroupLayout::new(shapes.clone(), vec![bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains(word), "{err}");
        }
        let twice = vec![
            layer("layers.0.weight", "layers.0.bias", 2, 3),
            layer("layers.0.weight", "layers.0.bias", 2, 3),
        ];
        assert!(
            GroupLayout::new(shapes, twice)
                .unwrap_err()
                .to_string()
                .contains("twice")
        );
    }

    #[test]
    fn groups_are_numbered_layer_by_layer() {
        let layout = GroupLayout::of_model(&ModelSpec::mlp(3, &[4, 2], 5));
        assert_eq!(layout.num_groups(), 6);
        assert_eq!(layout.layer_groups(0), 0..4);
        assert_eq!(layout.layer_groups(1), 4..6);
        assert_eq!(layout.layer_groups(2), 0..0);
        let rows = |t| layout.grouped_rows(t);
        assert_eq!(
            rows(0),
            Some(GroupedRows {
                first: 0,
                rows: 4,
                row_len: 3,
                block: 1,
                sections: 1,
            })
        );
        assert_eq!(
            rows(1),
            Some(GroupedRows {
                first: 0,
                rows: 4,
                row_len: 1,
                block: 1,
                sections: 1,
            })
        );
        assert_eq!(
            rows(2),
            Some(GroupedRows {
                first: 4,
                rows: 2,
                row_len: 4,
                block: 1,
                sections: 1,
            })
        );
        assert_eq!(rows(4), None);
        assert_eq!(rows(5), None);
        let spans: Vec<_> = rows(2).unwrap().spans().collect();
        assert_eq!(spans, vec![(4, 0..4), (5, 4..8)]);
    }

    #[test]
    fn a_head_owns_its_rows_of_q_k_and_v() {
        // 2 heads of 2 features over hidden 4: in_proj [12, 4], bias [12].
        let shape = |name: &str, shape: &[usize]| ParamShape {
            name: name.into(),
            shape: shape.to_vec(),
        };
        let shapes = vec![shape("w", &[12, 4]), shape("b", &[12])];
        let layout = GroupLayout::new(shapes, vec![GroupedLayer::heads("w", "b", 2, 4)]).unwrap();
        assert_eq!(layout.num_groups(), 2);
        assert_eq!(layout.layers()[0].size(), 3 * 2 * (4 + 1));
        let bias: Vec<_> = layout.grouped_rows(1).unwrap().spans().collect();
        assert_eq!(
            bias,
            [
                (0, 0..2),
                (1, 2..4),
                (0, 4..6),
                (1, 6..8),
                (0, 8..10),
                (1, 10..12)
            ]
        );
        let weight: Vec<_> = layout.grouped_rows(0).unwrap().spans().collect();
        assert_eq!(weight[3], (1, 24..32));
        let mut params = Params::zeros(layout.shapes());
        params.get_mut("b").unwrap().data = (1..=12).map(|v| v as f32).collect();
        let norms = layout.norms(&params).unwrap();
        let want = |vals: &[f64]| vals.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norms[0] - want(&[1., 2., 5., 6., 9., 10.])).abs() < 1e-9);
        layout.mask(&mut params, &[true, false]).unwrap();
        assert_eq!(
            params.get("b").unwrap().data,
            [1., 2., 0., 0., 5., 6., 0., 0., 9., 10., 0., 0.]
        );
    }
}
