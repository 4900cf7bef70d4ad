//! Layer-list models (`[model] kind = "sequential"`) as matching sees them: each client's
//! widths read from its tensors, the unit map of `fedfuse_core::layers::unit_uses` checked for
//! what a permutation of units can follow, views of one unit's values in a tensor, and the
//! fused tensors put back in the list's order under the new widths.
//!
//! Everything that moves with a unit (a filter or row, its bias, the norm channels after it,
//! the next layer's input channels or flatten block) comes from the map; nothing here guesses
//! layers from tensor names.

use std::borrow::Cow;
use std::collections::HashMap;

use fedfuse_core::layers::{
    self, BlockNorm, FeatureShape, LayerSpec, TensorRole, UnitUse, UnitUses,
};
use fedfuse_core::{Params, Tensor};

use crate::{FuseError, Result};

/// A layer-list model fused by matching.
#[derive(Clone, Debug)]
pub struct FusedLayers {
    /// The fused tensors, named and ordered as the list names them, at the new widths.
    pub params: Params,
    /// The list with every matched layer's `out` set to its fused width.
    pub layers: Vec<LayerSpec>,
    /// Matched layer (in the order of `unit_uses`) -> client -> local unit -> fused unit.
    pub assignments: Vec<Vec<Vec<usize>>>,
}

/// The clients of one layer-list fusion, checked.
pub(super) struct ListClients<'a> {
    /// Per client: its tensors in the list's order, borrowed where they were in it already.
    pub(super) params: Vec<Cow<'a, Params>>,
    /// Per client: its unit map (the same tensors for every client; only unit counts differ).
    pub(super) uses: Vec<Vec<UnitUses>>,
    /// Index of the layer that writes the logits (the last convolution or linear layer).
    pub(super) output: usize,
}

impl<'a> ListClients<'a> {
    /// Checks the list for what matching supports and reads each client's widths from its
    /// tensors ([`layers::at_widths`]). Every client's permutation groups must hold the same
    /// tensors.
    pub(super) fn new(
        input: &[usize],
        layers: &[LayerSpec],
        clients: &[&'a Params],
    ) -> Result<Self> {
        if clients.is_empty() {
            return Err(FuseError::Empty);
        }
        let (groups, output) = matchable(input, layers)?;
        let mut params = Vec::with_capacity(clients.len());
        let mut client_uses = Vec::with_capacity(clients.len());
        for (j, &p) in clients.iter().enumerate() {
            let bad =
                |e: &dyn std::fmt::Display| FuseError::InvalidInput(format!("client {j}: {e}"));
            let mut own =
                layers::at_widths(layers, |n| p.get(n).and_then(|t| t.shape.first().copied()));
            // The output layer keeps the list's classes: a client with others is refused below.
            own[output] = layers[output].clone();
            let (_, layout) = layers::chain(FeatureShape::of(input)?, &own).map_err(|e| bad(&e))?;
            let arranged = p.in_layout(&layout).map_err(|e| bad(&e))?;
            arranged.check_finite().map_err(|e| bad(&e))?;
            let uses = layers::permutation_groups(input, &own).map_err(|e| bad(&e))?;
            let same = uses.len() == groups.len()
                && uses
                    .iter()
                    .zip(&groups)
                    .all(|(a, b)| a.all().map(|u| &u.tensor).eq(b.all().map(|u| &u.tensor)));
            if !same {
                return Err(bad(
                    &"its widths change which tensors move together (a block's \
                                shortcut appears or goes); give every client the list's layout",
                ));
            }
            client_uses.push(uses);
            params.push(arranged);
        }
        Ok(Self {
            params,
            uses: client_uses,
            output,
        })
    }

    /// The clients of a fusion that keeps the list's widths (weight matching): every client
    /// holds the list's tensors at its widths, and the units are the list's permutation
    /// groups ([`permutable`]), residual streams included.
    pub(super) fn fixed(
        input: &[usize],
        layers: &[LayerSpec],
        clients: &[&'a Params],
    ) -> Result<Self> {
        if clients.is_empty() {
            return Err(FuseError::Empty);
        }
        let (uses, output) = permutable(input, layers)?;
        let (_, layout) = layers::chain(FeatureShape::of(input)?, layers)?;
        let mut params = Vec::with_capacity(clients.len());
        for (j, &p) in clients.iter().enumerate() {
            let bad = |e: &dyn std::fmt::Display| {
                FuseError::InvalidInput(format!(
                    "client {j}: {e}; weight matching keeps the widths fixed (PFNM matches \
                     clients of other widths)"
                ))
            };
            let arranged = p.in_layout(&layout).map_err(|e| bad(&e))?;
            arranged
                .check_finite()
                .map_err(|e| FuseError::InvalidInput(format!("client {j}: {e}")))?;
            params.push(arranged);
        }
        Ok(Self {
            uses: vec![uses; params.len()],
            params,
            output,
        })
    }

    /// Number of clients.
    pub(super) fn len(&self) -> usize {
        self.params.len()
    }

    /// Number of matched layers.
    pub(super) fn matched(&self) -> usize {
        self.uses[0].len()
    }

    /// The tensor `name` of client `j` (present: the layout was checked).
    pub(super) fn tensor(&self, j: usize, name: &str) -> Result<&Tensor> {
        Ok(self.params[j].require(name)?)
    }
}

/// Checks that matching can follow every unit of the list (see [`crate::pfnm_fuse_layers`]
/// for what it refuses, naming the layer); returns its permutation groups
/// ([`layers::permutation_groups`]: a plain chain's are its layers, a residual stage's stream
/// is one group) and the index of the layer that writes the logits.
pub fn matchable(input: &[usize], layers: &[LayerSpec]) -> Result<(Vec<UnitUses>, usize)> {
    if layers.iter().any(LayerSpec::is_transformer) {
        // A ViT's groups hold parts of axes, which unit uses do not express: PFNM takes them
        // from `transformer::VitGroups`, and this list gives none.
        let vit = super::transformer::VitGroups::of(layers)?;
        return Ok((Vec::new(), vit.head));
    }
    let groups = layers::permutation_groups(input, layers)?;
    refuse_unsupported(input, layers, &groups)?;
    let Some(output) = layers
        .iter()
        .rposition(|l| matches!(l, LayerSpec::Conv2d { .. } | LayerSpec::Linear { .. }))
    else {
        return Err(FuseError::InvalidInput(
            "the layer list has no convolution or linear layer to match".into(),
        ));
    };
    if groups.is_empty() {
        return Err(FuseError::UnsupportedLayer {
            layer: output,
            kind: layers[output].type_name(),
            reason: "the only convolution or linear layer writes the logits; matching needs \
                     a hidden layer below it"
                .into(),
        });
    }
    Ok((groups, output))
}

/// `layers` with each permutation group's writers at its width (`groups[g]`'s own weights,
/// `widths[g]`): a convolution's or linear layer's `out`, a residual block's `out` (its `conv2`
/// and projection) or inner width (its `conv1`).
pub fn at_group_widths(
    layers: &[LayerSpec],
    groups: &[UnitUses],
    widths: &[usize],
) -> Vec<LayerSpec> {
    let mut width_of: HashMap<&str, usize> = HashMap::new();
    for (g, &w) in groups.iter().zip(widths) {
        for own in g.own.iter().filter(|o| o.axis == 0) {
            width_of.insert(own.tensor.as_str(), w);
        }
    }
    // The rows each writer's weight will have: what a model at these widths holds.
    layers::at_widths(layers, |name| width_of.get(name).copied())
}

/// The permutation groups of a list whose widths stay fixed
/// ([`layers::permutation_groups`]: a residual stage's stream is one group), with the index
/// of the layer that writes the logits. Refuses, naming the layer, grouped convolutions
/// (their channel groups would need permutations within each).
pub fn permutable(input: &[usize], layers: &[LayerSpec]) -> Result<(Vec<UnitUses>, usize)> {
    if layers.iter().any(LayerSpec::is_transformer) {
        // A ViT's groups hold parts of axes, which unit uses do not express: weight matching
        // takes them from `transformer::VitGroups`, and this list gives none.
        let vit = super::transformer::VitGroups::of(layers)?;
        return Ok((Vec::new(), vit.head));
    }
    for (i, layer) in layers.iter().enumerate() {
        if let LayerSpec::Conv2d { groups, .. } = *layer
            && groups > 1
        {
            return Err(FuseError::UnsupportedLayer {
                layer: i,
                kind: layer.type_name(),
                reason: format!(
                    "groups = {groups}: a grouped convolution ties channels to groups, and \
                     matching would move channels between them; use groups = 1"
                ),
            });
        }
    }
    let groups = layers::permutation_groups(input, layers)?;
    let Some(output) = layers.iter().rposition(|l| {
        matches!(l, LayerSpec::Conv2d { .. } | LayerSpec::Linear { .. }) || l.block().is_some()
    }) else {
        return Err(FuseError::InvalidInput(
            "the layer list has no convolution or linear layer to match".into(),
        ));
    };
    if groups.is_empty() {
        return Err(FuseError::UnsupportedLayer {
            layer: output,
            kind: layers[output].type_name(),
            reason: "nothing below the layer that writes the logits can be permuted; matching \
                     needs a hidden layer"
                .into(),
        });
    }
    Ok((groups, output))
}

/// Refuses, naming the first, a Vision Transformer's layers for layer-wise matching (FedMA's
/// stages follow unit maps, which a ViT's groups, parts of axes, do not fit).
pub(super) fn refuse_layerwise_transformers(layers: &[LayerSpec]) -> Result<()> {
    match layers.iter().position(LayerSpec::is_transformer) {
        Some(i) => Err(FuseError::UnsupportedLayer {
            layer: i,
            kind: layers[i].type_name(),
            reason: "layer-wise matching (FedMA) of a transformer is not built: its stages \
                     would retrain each block's heads and MLP units in turn; PFNM, GPI-FNM and \
                     weight matching fuse it, as do the averaging methods (fedavg, fedprox, \
                     fedmedian, the robust aggregators, fedopt)"
                .into(),
        }),
        None => Ok(()),
    }
}

/// Refuses, naming the layer, what neuron matching (which widens groups) cannot follow.
fn refuse_unsupported(input: &[usize], layers: &[LayerSpec], uses: &[UnitUses]) -> Result<()> {
    layers::chain(FeatureShape::of(input)?, layers)?;
    let refuse = |layer: usize, reason: String| FuseError::UnsupportedLayer {
        layer,
        kind: layers[layer].type_name(),
        reason,
    };
    for (i, layer) in layers.iter().enumerate() {
        match *layer {
            _ if layer.block().is_some_and(|b| b.norm == BlockNorm::Group) => {
                return Err(refuse(
                    i,
                    "norm = \"group\": a group norm's groups would mix channels of different \
                     clients once matching widens them; use norm = \"batch\" or \"none\" (or \
                     weight matching, which keeps the widths)"
                        .into(),
                ));
            }
            LayerSpec::Conv2d { groups, .. } if groups > 1 => {
                return Err(refuse(
                    i,
                    format!(
                        "groups = {groups}: a grouped convolution ties channels to groups, \
                         and matching would move channels between them; use groups = 1"
                    ),
                ));
            }
            _ => {}
        }
    }
    for u in uses {
        for &j in &u.between {
            if matches!(
                layers[j],
                LayerSpec::GroupNorm { .. } | LayerSpec::LayerNorm { .. }
            ) {
                return Err(refuse(
                    j,
                    format!(
                        "normalises across the channels of model.layers[{}], which matching \
                         permutes and widens: a group norm's groups would mix channels of \
                         different clients and a layer norm's statistics would change with \
                         the width; use batch norm or none",
                        u.layer
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Where the units of one [`UnitUse`] sit in its tensor, for uses along axis 0 (a unit's
/// rows) or axis 1 (a unit's input columns in every row) without channel groups: unit `u` of
/// row `r` is `span` values from `(r * units + u) * span`. The same values as
/// [`UnitUse::ranges`], in one multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UnitAxis {
    /// Rows the units repeat over (1 for axis 0).
    pub(super) rows: usize,
    /// Units.
    pub(super) units: usize,
    /// Values of one unit in one row.
    pub(super) span: usize,
}

impl UnitAxis {
    pub(super) fn of(u: &UnitUse, shape: &[usize]) -> Result<Self> {
        let bad = |why: &str| {
            FuseError::InvalidInput(format!(
                "tensor `{}` {shape:?}: {why} (axis {}, block {}, groups {})",
                u.tensor, u.axis, u.block, u.groups
            ))
        };
        if u.groups != 1 || u.block == 0 {
            return Err(bad("channel groups cannot be permuted"));
        }
        let (rows, len, inner) = match u.axis {
            0 => (1, shape.first(), shape.iter().skip(1).product::<usize>()),
            1 => (
                shape.first().copied().unwrap_or(0),
                shape.get(1),
                shape.iter().skip(2).product(),
            ),
            _ => return Err(bad("units on an axis past 1")),
        };
        let Some(&len) = len else {
            return Err(bad("the tensor has no unit axis"));
        };
        if len % u.block != 0 {
            return Err(bad("the unit axis is not a whole number of blocks"));
        }
        Ok(Self {
            rows,
            units: len / u.block,
            span: u.block * inner,
        })
    }

    /// Start of unit `unit` in row `row`.
    pub(super) fn at(&self, row: usize, unit: usize) -> usize {
        (row * self.units + unit) * self.span
    }

    /// `shape` with the unit axis of `u` holding `units` units.
    pub(super) fn resized(u: &UnitUse, shape: &[usize], units: usize) -> Vec<usize> {
        let mut s = shape.to_vec();
        if let Some(a) = s.get_mut(u.axis) {
            *a = units * u.block;
        }
        s
    }
}

/// Moves unit `u` of one matched layer to position `perm[u]` in every tensor that holds or
/// reads it (`uses`, one entry of [`fedfuse_core::layers::unit_uses`] for this model): the one
/// place a permutation of units is applied, so the model computes the same function.
///
/// ```
/// use fedfuse_core::{LayerSpec, Params};
/// use fedfuse_core::layers::unit_uses;
/// use fedfuse_fuse::permute_units;
///
/// let layers = [LayerSpec::linear(2), LayerSpec::Relu, LayerSpec::linear(1)];
/// let mut p = Params::new();
/// p.push("0.weight", vec![2, 1], vec![1.0, 2.0])?;
/// p.push("0.bias", vec![2], vec![0.1, 0.2])?;
/// p.push("2.weight", vec![1, 2], vec![3.0, 4.0])?;
/// p.push("2.bias", vec![1], vec![0.0])?;
/// let uses = unit_uses(&[1], &layers)?;
/// permute_units(&mut p, &uses[0], &[1, 0])?;
/// assert_eq!(p.get("0.weight").map(|t| t.data.clone()), Some(vec![2.0, 1.0]));
/// assert_eq!(p.get("2.weight").map(|t| t.data.clone()), Some(vec![4.0, 3.0]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn permute_units(params: &mut Params, uses: &UnitUses, perm: &[usize]) -> Result<()> {
    let not_perm = || {
        FuseError::InvalidInput(format!(
            "{perm:?} is not a permutation of the {} units of model.layers[{}]",
            uses.units, uses.layer
        ))
    };
    if perm.len() != uses.units {
        return Err(not_perm());
    }
    let mut picks = vec![usize::MAX; uses.units];
    for (from, &to) in perm.iter().enumerate() {
        match picks.get_mut(to) {
            Some(p) if *p == usize::MAX => *p = from,
            _ => return Err(not_perm()),
        }
    }
    select_units(params, uses, &picks)
}

/// Keeps unit `picks[k]` of one matched layer as its unit `k`, in every tensor that holds or
/// reads the units (`uses`, for the model as `params` has it): the sub-network of the chosen
/// units, which computes what the whole one does with the others' outputs left out. A
/// client's part of a fused model (its matched units, `picks` its assignment) is this, layer
/// after layer from the input side.
///
/// ```
/// use fedfuse_core::{LayerSpec, Params};
/// use fedfuse_core::layers::unit_uses;
/// use fedfuse_fuse::select_units;
///
/// let layers = [LayerSpec::linear(3), LayerSpec::Relu, LayerSpec::linear(1)];
/// let mut p = Params::new();
/// p.push("0.weight", vec![3, 1], vec![1.0, 2.0, 3.0])?;
/// p.push("0.bias", vec![3], vec![0.1, 0.2, 0.3])?;
/// p.push("2.weight", vec![1, 3], vec![4.0, 5.0, 6.0])?;
/// p.push("2.bias", vec![1], vec![0.0])?;
/// let uses = unit_uses(&[1], &layers)?;
/// select_units(&mut p, &uses[0], &[2, 0])?;
/// assert_eq!(p.get("0.weight").map(|t| t.data.clone()), Some(vec![3.0, 1.0]));
/// assert_eq!(p.get("2.weight").map(|t| t.data.clone()), Some(vec![6.0, 4.0]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn select_units(params: &mut Params, uses: &UnitUses, picks: &[usize]) -> Result<()> {
    if let Some(bad) = picks.iter().find(|&&p| p >= uses.units) {
        return Err(FuseError::InvalidInput(format!(
            "unit {bad} picked of the {} units of model.layers[{}]",
            uses.units, uses.layer
        )));
    }
    for u in uses.all() {
        remap_units(params, u, uses, picks.len(), |k| Some(picks[k]))?;
    }
    Ok(())
}

/// Lays one matched group's units (`uses`: its own tensors and its readers) over `width`
/// fused units: what held or read local unit `u` holds or reads fused unit `to[u]`, and fused
/// units no local unit joined hold and are read with zero weights. A FedMA client then puts in
/// the tensors its server fused; with them in place the network computes what it did, the new
/// units ignored.
pub fn spread_units(
    params: &mut Params,
    uses: &UnitUses,
    to: &[usize],
    width: usize,
) -> Result<()> {
    if to.len() != uses.units {
        return Err(FuseError::InvalidInput(format!(
            "an assignment of {} units for the {} units of model.layers[{}]",
            to.len(),
            uses.units,
            uses.layer
        )));
    }
    // The width comes from the server's message: every tensor laid over it must stay within
    // a tensor's bound, checked before anything that size is allocated.
    for u in uses.all() {
        let t = params
            .get(&u.tensor)
            .ok_or_else(|| FuseError::InvalidInput(format!("tensor `{}` is missing", u.tensor)))?;
        laid_len(u, UnitAxis::of(u, &t.shape)?, width)?;
    }
    let mut from = vec![None; width];
    for (u, &g) in to.iter().enumerate() {
        match from.get_mut(g) {
            Some(slot) if slot.is_none() => *slot = Some(u),
            _ => {
                return Err(FuseError::InvalidInput(format!(
                    "fused unit {g} is out of {width} or taken twice in the assignment of \
                     model.layers[{}]",
                    uses.layer
                )));
            }
        }
    }
    for u in uses.all() {
        remap_units(params, u, uses, width, |k| from[k])?;
    }
    Ok(())
}

/// Rewrites the unit axis of one use of a layer's units (`uses.units` of them now) to `units`
/// units, new unit `k` taking old unit `source(k)` or zeros.
fn remap_units(
    params: &mut Params,
    u: &UnitUse,
    uses: &UnitUses,
    units: usize,
    source: impl Fn(usize) -> Option<usize>,
) -> Result<()> {
    let t = params
        .get_mut(&u.tensor)
        .ok_or_else(|| FuseError::InvalidInput(format!("tensor `{}` is missing", u.tensor)))?;
    let axis = UnitAxis::of(u, &t.shape)?;
    if axis.units != uses.units {
        return Err(FuseError::InvalidInput(format!(
            "tensor `{}` {:?} holds {} units where model.layers[{}] has {}",
            u.tensor, t.shape, axis.units, uses.layer, uses.units
        )));
    }
    let new = UnitAxis { units, ..axis };
    let len = laid_len(u, axis, units)?;
    let mut data = vec![0.0; len];
    for r in 0..axis.rows {
        for k in 0..units {
            if let Some(old) = source(k) {
                let (src, dst) = (axis.at(r, old), new.at(r, k));
                data[dst..dst + axis.span].copy_from_slice(&t.data[src..src + axis.span]);
            }
        }
    }
    t.shape = UnitAxis::resized(u, &t.shape, units);
    t.data = data;
    Ok(())
}

/// Values of the tensor of `u` (unit view `axis`) laid over `units` units, within a tensor's
/// bound ([`layers::MAX_VALUES`]).
fn laid_len(u: &UnitUse, axis: UnitAxis, units: usize) -> Result<usize> {
    axis.rows
        .checked_mul(units)
        .and_then(|v| v.checked_mul(axis.span))
        .filter(|&v| v <= layers::MAX_VALUES)
        .ok_or_else(|| {
            FuseError::InvalidInput(format!(
                "tensor `{}` over {units} units would hold more than {} values",
                u.tensor,
                layers::MAX_VALUES
            ))
        })
}

/// Each client's weight in averages: its share of the examples (`class_counts` summed), or
/// `1/J` without counts.
pub(super) fn client_weights(class_counts: Option<&[Vec<f64>]>, clients: usize) -> Vec<f64> {
    let totals: Option<Vec<f64>> =
        class_counts.map(|c| c.iter().map(|row| row.iter().sum()).collect());
    match totals {
        Some(t) if t.len() == clients && t.iter().sum::<f64>() > 0.0 => {
            let all: f64 = t.iter().sum();
            t.iter().map(|n| n / all).collect()
        }
        _ => vec![1.0 / clients as f64; clients],
    }
}

/// The fixed-width fusion of clients already aligned to the first: every tensor's weighted
/// mean (`weights` from [`client_weights`]), as the list at `input` lays them out. The mean is
/// written over the last client's tensors when the fusion owns them (a permuted copy), so no
/// model-sized buffer is added.
pub(super) fn fuse_aligned(
    input: &[usize],
    layers: &[LayerSpec],
    mut aligned: Vec<Cow<'_, Params>>,
    weights: &[f64],
    assignments: Vec<Vec<Vec<usize>>>,
) -> Result<FusedLayers> {
    let Some(last) = aligned.pop() else {
        return Err(FuseError::Empty);
    };
    let mut fused = last.into_owned();
    for (name, t) in fused.iter_mut() {
        let others: Vec<&Tensor> = aligned
            .iter()
            .map(|p| p.require(name))
            .collect::<std::result::Result<_, _>>()?;
        mean_into(name, t, &others, weights)?;
    }
    if let Some(extra) = aligned
        .first()
        .and_then(|p| p.iter().find(|(n, _)| fused.get(n).is_none()))
    {
        return Err(FuseError::InvalidInput(format!(
            "client 0: tensor `{}` is not in the last client",
            extra.0
        )));
    }
    Ok(FusedLayers {
        params: assemble(input, layers, fused.into_map())?,
        layers: layers.to_vec(),
        assignments,
    })
}

/// Weighted mean of one tensor over clients (same shape at each), in f64; batch norm's
/// `num_batches_tracked` is rounded to a whole count.
pub(super) fn mean_tensor(name: &str, tensors: &[&Tensor], weights: &[f64]) -> Result<Tensor> {
    let Some((last, others)) = tensors.split_last() else {
        return Err(FuseError::Empty);
    };
    let mut out = (*last).clone();
    mean_into(name, &mut out, others, weights)?;
    Ok(out)
}

/// [`mean_tensor`] of `others` and then `last`, written over `last` (weights in that order).
fn mean_into(name: &str, last: &mut Tensor, others: &[&Tensor], weights: &[f64]) -> Result<()> {
    let first = others.first().map_or(&last.shape, |t| &t.shape);
    let shapes = others.iter().map(|t| &t.shape).chain([&last.shape]);
    if let Some((j, shape)) = shapes.enumerate().find(|(_, s)| *s != first) {
        return Err(FuseError::InvalidInput(format!(
            "client {j}: tensor `{name}` has shape {shape:?} where client 0's has {first:?}"
        )));
    }
    if weights.len() != others.len() + 1 {
        return Err(FuseError::InvalidInput(format!(
            "{} weights for {} clients",
            weights.len(),
            others.len() + 1
        )));
    }
    let total: f64 = weights.iter().sum();
    let counter = TensorRole::of(name) == TensorRole::Counter;
    let last_weight = weights[others.len()];
    // Summed in f64 a chunk at a time, clients in order: a model-sized f64 buffer would be
    // twice the fused tensor in fresh pages.
    const CHUNK: usize = 1024;
    let mut sum = [0.0f64; CHUNK];
    for (start, out) in (0..).step_by(CHUNK).zip(last.data.chunks_mut(CHUNK)) {
        let sum = &mut sum[..out.len()];
        sum.fill(0.0);
        for (t, w) in others.iter().zip(weights) {
            for (d, v) in sum.iter_mut().zip(&t.data[start..start + out.len()]) {
                *d += w / total * f64::from(*v);
            }
        }
        for (d, v) in sum.iter_mut().zip(out.iter_mut()) {
            *d += last_weight / total * f64::from(*v);
            *v = if counter { d.round() as f32 } else { *d as f32 };
        }
    }
    Ok(())
}

/// The tensors of a model with layers `layers`, in the list's order, taken from `tensors`
/// (which must hold each with the list's shape, and nothing else).
pub(super) fn assemble(
    input: &[usize],
    layers: &[LayerSpec],
    mut tensors: HashMap<String, Tensor>,
) -> Result<Params> {
    let (_, layout) = layers::chain(FeatureShape::of(input)?, layers)?;
    let mut out = Params::new();
    for want in &layout {
        let t = tensors.remove(&want.name).ok_or_else(|| {
            FuseError::InvalidInput(format!("fused tensor `{}` was never estimated", want.name))
        })?;
        if t.shape != want.shape {
            return Err(FuseError::InvalidInput(format!(
                "fused tensor `{}` has shape {:?} where the fused list has {:?}",
                want.name, t.shape, want.shape
            )));
        }
        out.push(want.name.clone(), t.shape, t.data)?;
    }
    if let Some(extra) = tensors.keys().next() {
        return Err(FuseError::InvalidInput(format!(
            "fused tensor `{extra}` is not in the fused list"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use fedfuse_core::layers::unit_uses;

    use super::*;

    /// Means are weighted, summed in f64 client by client whatever the chunking (a tensor
    /// longer than a chunk), counters rounded, and written over the last client's tensors
    /// when the fusion owns them; a shape that differs is refused naming the client.
    #[test]
    fn means_are_weighted_rounded_and_written_over_an_owned_copy() {
        let len = 2500;
        let values = |j: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7 + j * 13) % 101) as f32 / 9.0 - 5.0)
                .collect()
        };
        let t = |j: usize| Tensor::new("0.weight", vec![len], values(j)).unwrap();
        let (a, b, c) = (t(0), t(1), t(2));
        let weights = [1.0, 2.0, 4.5];
        let mean = mean_tensor("0.weight", &[&a, &b, &c], &weights).unwrap();
        for i in 0..len {
            let mut d = 0.0f64;
            for (x, w) in [&a, &b, &c].iter().zip(weights) {
                d += w / 7.5 * f64::from(x.data[i]);
            }
            assert_eq!(mean.data[i].to_bits(), (d as f32).to_bits(), "value {i}");
        }
        let counters = [
            Tensor::new("1.num_batches_tracked", vec![], vec![3.0]).unwrap(),
            Tensor::new("1.num_batches_tracked", vec![], vec![4.0]).unwrap(),
        ];
        let counter = mean_tensor(
            "1.num_batches_tracked",
            &[&counters[0], &counters[1]],
            &[1.0, 1.0],
        )
        .unwrap();
        assert_eq!(counter.data, [4.0]);
        let e = mean_tensor(
            "0.weight",
            &[&a, &Tensor::new("0.weight", vec![2], vec![0.0; 2]).unwrap()],
            &[1.0, 1.0],
        )
        .unwrap_err();
        assert!(e.to_string().contains("client 1"), "{e}");

        let layers = [LayerSpec::linear(len)];
        let params = |j: usize| {
            let mut p = Params::new();
            p.push("0.weight", vec![len, 1], values(j)).unwrap();
            p.push("0.bias", vec![len], values(j + 5)).unwrap();
            p
        };
        let (p0, p1) = (params(0), params(1));
        let aligned = vec![Cow::Borrowed(&p0), Cow::Owned(p1.clone())];
        let fused = fuse_aligned(&[1], &layers, aligned, &[1.0, 3.0], Vec::new()).unwrap();
        for name in ["0.weight", "0.bias"] {
            let (x, y) = (p0.require(name).unwrap(), p1.require(name).unwrap());
            let want = mean_tensor(name, &[x, y], &[1.0, 3.0]).unwrap();
            assert_eq!(fused.params.require(name).unwrap(), &want);
        }
    }

    /// The view's offsets are the map's own ranges, on a list with a flatten block and a
    /// batch norm.
    #[test]
    fn unit_axis_agrees_with_the_maps_ranges() {
        let layers = [
            LayerSpec::conv2d(3, 3).with_padding(1),
            LayerSpec::batch_norm2d(),
            LayerSpec::Relu,
            LayerSpec::max_pool(2),
            LayerSpec::Flatten,
            LayerSpec::linear(4),
            LayerSpec::Relu,
            LayerSpec::linear(2),
        ];
        let input = [2, 4, 4];
        let (_, layout) = layers::chain(FeatureShape::of(&input).unwrap(), &layers).unwrap();
        let shapes: HashMap<_, _> = layout.into_iter().map(|p| (p.name, p.shape)).collect();
        for uses in unit_uses(&input, &layers).unwrap() {
            for u in uses.all() {
                let shape = &shapes[&u.tensor];
                let axis = UnitAxis::of(u, shape).unwrap();
                assert_eq!(axis.units, uses.units, "{}", u.tensor);
                for unit in 0..uses.units {
                    let ours: Vec<_> = (0..axis.rows)
                        .map(|r| axis.at(r, unit)..axis.at(r, unit) + axis.span)
                        .collect();
                    assert_eq!(ours, u.ranges(shape, unit), "{} unit {unit}", u.tensor);
                }
            }
        }
    }
}
