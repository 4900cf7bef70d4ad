//! Which tensor entries hold or read each unit of a layer list's grouped layers: the one map
//! that dropping, gating and permuting units go through.

use std::ops::Range;

use super::shapes::{FeatureShape, chain};
use super::vocabulary::{BlockNorm, BlockShape, LayerSpec};
use crate::{GroupedLayer, Result};

/// A grouped layer of a layer list (see [`crate::groups`]) and where its gate acts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatePoint {
    /// The groups: filters or units, with their biases and the per-channel scale and shift of
    /// a batch or group norm that directly follows.
    pub group: GroupedLayer,
    /// The layer whose output the gates multiply: the norm when one follows, else the layer;
    /// for a residual block, the block itself, whose gates act inside it, after `bn1`; for an
    /// encoder block, the block itself, whose gates multiply each head's output (before
    /// `out_proj`) and each MLP unit's (after the GELU).
    pub layer: usize,
}

/// The groups of a layer list: every convolution and linear layer but the last (the one that
/// writes the logits), the inner channels of every residual block (`conv1`'s filters with
/// `bn1`), and each transformer encoder block's attention heads, then its MLP units. A block's
/// output channels are not grouped: the identity path carries them on, so zeroing `conv2` or
/// the shortcut would not remove them; nor is a transformer's residual stream, for the same
/// reason (every block adds to it, and the class token and positional embedding write it
/// too). A convolution before a block is grouped, but zeroing one of its filters removes only
/// that filter's contribution, for the blocks add to the channel.
pub fn gate_points(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<GatePoint>> {
    Ok(grouped_layers(input, layers)?
        .into_iter()
        .map(|(_, _, point)| point)
        .collect())
}

/// [`gate_points`], each with the index of the layer whose units it groups (the convolution,
/// linear layer, residual or encoder block, not the norm after it) and, for a block, which of
/// its inner convolutions writes them (for an encoder block, 0 for the heads and 1 for the MLP
/// units; 0 otherwise).
fn grouped_layers(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<(usize, usize, GatePoint)>> {
    let (shapes, _) = chain(FeatureShape::of(input)?, layers)?;
    let last = layers
        .iter()
        .rposition(|l| matches!(l, LayerSpec::Conv2d { .. } | LayerSpec::Linear { .. }));
    let mut points = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let input = if i == 0 {
            FeatureShape::of(input)?
        } else {
            shapes[i - 1]
        };
        if let Some(block) = layer.block() {
            let mut fan_in = input.channels();
            for (k, conv) in block.convs.iter().enumerate() {
                let cols = fan_in * conv.kernel * conv.kernel;
                fan_in = conv.rows;
                if k + 1 == block.convs.len() {
                    break;
                }
                let mut per_unit = Vec::new();
                match block.norm {
                    BlockNorm::None => {
                        per_unit.push(format!("{i}.{}.bias", BlockShape::conv_name(k)))
                    }
                    BlockNorm::Batch | BlockNorm::Group => {
                        let bn = BlockShape::norm_name(k);
                        per_unit.push(format!("{i}.{bn}.weight"));
                        per_unit.push(format!("{i}.{bn}.bias"));
                    }
                }
                points.push((
                    i,
                    k,
                    GatePoint {
                        group: GroupedLayer::rows(
                            &format!("{i}.{}.weight", BlockShape::conv_name(k)),
                            per_unit,
                            conv.rows,
                            cols,
                        ),
                        layer: i,
                    },
                ));
            }
            continue;
        }
        if let LayerSpec::Encoder { heads, mlp, .. } = *layer {
            let hidden = input.channels();
            let attention = format!("{i}.self_attention");
            let heads = GroupedLayer::heads(
                &format!("{attention}.in_proj_weight"),
                &format!("{attention}.in_proj_bias"),
                heads,
                hidden,
            );
            let units = GroupedLayer::dense(
                &format!("{i}.mlp.0.weight"),
                &format!("{i}.mlp.0.bias"),
                mlp,
                hidden,
            );
            for (k, group) in [heads, units].into_iter().enumerate() {
                points.push((i, k, GatePoint { group, layer: i }));
            }
            continue;
        }
        let next_norm = |flat: bool| match layers.get(i + 1) {
            Some(LayerSpec::BatchNorm2d { .. } | LayerSpec::GroupNorm { .. }) if !flat => true,
            Some(LayerSpec::BatchNorm1d { .. }) => flat,
            _ => false,
        };
        let (weight, fan_in, units, bias, flat) = match *layer {
            LayerSpec::Conv2d {
                out,
                kernel,
                groups,
                bias,
                ..
            } => (
                format!("{i}.weight"),
                input.channels() / groups * kernel * kernel,
                out,
                bias,
                false,
            ),
            LayerSpec::Linear { out, bias } => {
                (format!("{i}.weight"), input.len(), out, bias, true)
            }
            _ => continue,
        };
        if Some(i) == last {
            continue;
        }
        let mut per_unit = Vec::new();
        if bias {
            per_unit.push(format!("{i}.bias"));
        }
        let mut at = i;
        if next_norm(flat) {
            per_unit.push(format!("{}.weight", i + 1));
            per_unit.push(format!("{}.bias", i + 1));
            at = i + 1;
        }
        points.push((
            i,
            0,
            GatePoint {
                group: GroupedLayer::rows(&weight, per_unit, units, fan_in),
                layer: at,
            },
        ));
    }
    Ok(points)
}

/// Where the units of a grouped layer sit in one tensor: unit `u` owns `block` consecutive
/// indices of axis `axis`, `p * block .. (p + 1) * block` with `p = u`, and with them every
/// value along the other axes.
///
/// A convolution of `groups > 1` channel groups reading the units splits them (axis 1 of its
/// weight `[out, in / groups, kh, kw]` holds `in / groups` of them): unit `u` is input
/// `p = u % (in / groups)` of channel group `j = u / (in / groups)`, read only by that group's
/// output channels, rows `j * out / groups .. (j + 1) * out / groups` of axis 0. A permutation
/// of the units keeps such a reader's weights right only when it maps every channel group
/// onto itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitUse {
    /// The tensor's name.
    pub tensor: String,
    /// The axis that indexes the units.
    pub axis: usize,
    /// Indices of `axis` per unit: 1, or `h * w` for the columns of a linear layer that reads
    /// flattened `[c, h, w]` feature maps (channel `c`'s block is `c * h * w .. (c + 1) * h * w`).
    pub block: usize,
    /// Channel groups of a reading convolution (1 otherwise); see the type's docs.
    pub groups: usize,
    /// Equal sections of `axis` that each hold every unit's block (the unit owns its block in
    /// each): 3 for an attention's packed q, k and v rows, else 1.
    pub sections: usize,
}

impl UnitUse {
    fn new(tensor: String, axis: usize, block: usize) -> Self {
        Self {
            tensor,
            axis,
            block,
            groups: 1,
            sections: 1,
        }
    }

    /// The values of unit `unit` in a row-major tensor of shape `shape` (this use's tensor),
    /// as ranges of flat indices in increasing order; empty for a unit the tensor does not
    /// hold.
    pub fn ranges(&self, shape: &[usize], unit: usize) -> Vec<Range<usize>> {
        let Some(&full) = shape.get(self.axis) else {
            return Vec::new();
        };
        let sections = self.sections.max(1);
        let len = full / sections;
        let per_group = len / self.block.max(1);
        let groups = if self.axis == 0 {
            1
        } else {
            self.groups.max(1)
        };
        if per_group == 0 || unit / per_group >= groups {
            return Vec::new();
        }
        let (part, p) = (unit / per_group, unit % per_group);
        let inner: usize = shape[self.axis + 1..].iter().product();
        let span = self.block * inner;
        // Outer index `o` runs over the axes before `axis`; its axis-0 row is `o / per_row`.
        let outer: usize = shape[..self.axis].iter().product();
        let per_row: usize = shape.get(1..self.axis).map_or(1, |s| s.iter().product());
        let rows_per_part = shape.first().map_or(0, |&r| r / groups);
        (0..outer)
            .filter(|o| groups == 1 || (o / per_row) / rows_per_part.max(1) == part)
            .flat_map(|o| {
                (0..sections).map(move |q| {
                    let start = o * full * inner + q * len * inner + p * span;
                    start..start + span
                })
            })
            .collect()
    }
}

/// Every tensor entry that belongs to the units of one grouped layer of a layer list (one
/// [`GatePoint`], in the same order): what "unit `u` of this layer" means for dropping it
/// (FedDrop zeroes all of it) or for permuting units (every use moves together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitUses {
    /// The grouped layer's index in the list: a convolution, a linear layer, or a residual
    /// block (whose units are its `conv1`'s channels).
    pub layer: usize,
    /// Its units.
    pub units: usize,
    /// What the layer holds per unit: its weight's rows (axis 0), its bias, and the per-channel
    /// tensors of every norm between it and its readers (scale, shift, batch norm's running
    /// mean and variance; not the scalar counter).
    pub own: Vec<UnitUse>,
    /// The inputs of the layers that read the units: the next convolution's input channels
    /// (axis 1), the next linear layer's input columns (axis 1, blocks of `h * w` after a
    /// flatten), a residual block's `conv1` and projection `shortcut.0` input channels, a
    /// block's `conv2` input channels for its inner units.
    pub readers: Vec<UnitUse>,
    /// The layers between this one and its readers, in order (norms, activations, pooling,
    /// dropout, flatten); empty for a block's inner units (`bn1` and ReLU, inside the block).
    pub between: Vec<usize>,
    /// Whether the units also enter a residual block's identity path: the block adds its own
    /// output to them, so they live on in the block's output channels, which are not grouped.
    /// [`Self::readers`] then holds this layer's readers only (the block's `conv1`); removing
    /// a unit takes out this layer's contribution to the channel, and a permutation would have
    /// to reach every block of the identity path up to its next projection, which this map
    /// does not list.
    pub identity: bool,
    /// Channel groups a permutation of the units must map each onto itself: 1 when any
    /// permutation keeps the network's function; `g` when a group norm of `g` groups
    /// normalises the units (channel `c` in group `c / (units / g)`), so only permutations
    /// within each group do.
    pub tied: usize,
}

impl UnitUses {
    /// [`Self::own`], then [`Self::readers`].
    pub fn all(&self) -> impl Iterator<Item = &UnitUse> {
        self.own.iter().chain(&self.readers)
    }
}

/// Who holds and who reads the units of each grouped layer of a layer list: one [`UnitUses`]
/// per [`GatePoint`], in the order of [`gate_points`] and [`crate::GroupLayout::of_model`].
///
/// From a grouped convolution or linear layer the map walks forward through layers that keep
/// the unit axis (activations, pooling, dropout, flatten, norms), and stops at the first layer
/// that mixes units: a convolution, a linear layer or a residual block, whose inputs are the
/// readers.
pub fn unit_uses(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<UnitUses>> {
    let first = FeatureShape::of(input)?;
    let (shapes, _) = chain(first, layers)?;
    let input_of = |i: usize| if i == 0 { first } else { shapes[i - 1] };
    let mut out = Vec::new();
    for (i, k, point) in grouped_layers(input, layers)? {
        let units = point.group.units;
        let mut uses = UnitUses {
            layer: i,
            units,
            own: vec![UnitUse::new(point.group.weight.clone(), 0, 1)],
            readers: Vec::new(),
            between: Vec::new(),
            identity: false,
            tied: 1,
        };
        if let LayerSpec::Encoder { .. } = layers[i] {
            // The heads (k = 0) own their q, k and v rows and are read by `out_proj`'s
            // columns, `head_dim` per head; the MLP units (k = 1) own `mlp.0`'s rows and are
            // read by `mlp.3`'s columns.
            let g = &point.group;
            let reader = match k {
                0 => "self_attention.out_proj.weight",
                _ => "mlp.3.weight",
            };
            let sectioned = |tensor: String, axis: usize, sections: usize| UnitUse {
                sections,
                ..UnitUse::new(tensor, axis, g.unit_rows)
            };
            uses.own = std::iter::once(&g.weight)
                .chain(&g.per_unit)
                .map(|t| sectioned(t.clone(), 0, g.sections))
                .collect();
            uses.readers.push(sectioned(format!("{i}.{reader}"), 1, 1));
            out.push(uses);
            continue;
        }
        if let Some(block) = layers[i].block() {
            let conv = BlockShape::conv_name(k);
            if block.norm == BlockNorm::None {
                uses.own
                    .push(UnitUse::new(format!("{i}.{conv}.bias"), 0, 1));
            }
            for t in block_norm_tensors(block.norm) {
                let bn = BlockShape::norm_name(k);
                uses.own.push(UnitUse::new(format!("{i}.{bn}.{t}"), 0, 1));
            }
            if block.norm == BlockNorm::Group {
                uses.tied = block.groups;
            }
            let next = BlockShape::conv_name(k + 1);
            uses.readers
                .push(UnitUse::new(format!("{i}.{next}.weight"), 1, 1));
            out.push(uses);
            continue;
        }
        if let LayerSpec::Conv2d { bias: true, .. } | LayerSpec::Linear { bias: true, .. } =
            layers[i]
        {
            uses.own.push(UnitUse::new(format!("{i}.bias"), 0, 1));
        }
        // Indices of the unit axis per unit: `h * w` once a flatten has laid the channels out.
        let mut block = 1;
        for (j, layer) in layers.iter().enumerate().skip(i + 1) {
            let at = input_of(j);
            let reader = |name: &str, groups: usize| UnitUse {
                groups,
                ..UnitUse::new(format!("{j}.{name}"), 1, block)
            };
            match *layer {
                LayerSpec::Conv2d { groups, .. } => {
                    uses.readers.push(reader("weight", groups));
                    break;
                }
                LayerSpec::Linear { .. } => {
                    uses.readers.push(reader("weight", 1));
                    break;
                }
                // A convolution that cuts the channels into patch tokens.
                LayerSpec::Tokens { .. } => {
                    uses.readers.push(reader("conv_proj.weight", 1));
                    break;
                }
                LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. } => {
                    uses.readers.push(reader("conv1.weight", 1));
                    if layer
                        .block()
                        .is_some_and(|b| b.has_projection(at.channels()))
                    {
                        uses.readers.push(reader("shortcut.0.weight", 1));
                    } else {
                        uses.identity = true;
                    }
                    break;
                }
                _ => pass_channelwise(&mut uses, j, layer, at, &mut block),
            }
            uses.between.push(j);
        }
        out.push(uses);
    }
    Ok(out)
}

/// The per-channel tensors of a residual block's norm (`bn1`, `bn2`, `shortcut.1`).
fn block_norm_tensors(norm: BlockNorm) -> &'static [&'static str] {
    match norm {
        BlockNorm::Batch => &["weight", "bias", "running_mean", "running_var"],
        BlockNorm::Group => &["weight", "bias"],
        BlockNorm::None => &[],
    }
}

/// The channel groups a permutation of `units` must keep when it already keeps `tied` and a
/// group norm of `groups` groups normalises them too: the common refinement of the two
/// partitions, or every channel alone when they do not nest evenly.
fn tie(tied: usize, groups: usize, units: usize) -> usize {
    let lcm = |a: usize, b: usize| {
        let (mut x, mut y) = (a, b);
        while y != 0 {
            (x, y) = (y, x % y);
        }
        a / x.max(1) * b
    };
    let both = lcm(tied.max(1), groups.max(1));
    if units > 0 && units.is_multiple_of(both) {
        both
    } else {
        units.max(1)
    }
}

/// The permutation groups of a layer list: every set of units that one permutation must move
/// together for the network to compute the same function, each as a [`UnitUses`] (its
/// `layer` the first layer that writes the units), in the order of their first writer.
///
/// In a plain chain each grouped layer of [`unit_uses`] is a group. A residual block's output
/// is its `conv2` (with `bn2`) added to its input, so the channels of a stage's stream are
/// one group: the layer that writes the stream (the convolution before the first block, or a
/// block's projection `shortcut.0` with `shortcut.1`, together with that block's `conv2` and
/// `bn2`), every identity block's `conv2` and `bn2` on the way, and every reader (each
/// block's `conv1`, the next projection, the convolution or linear layer after the stage).
/// Each block's inner channels stay a group of their own. A stream that nothing permutable
/// writes (a list that starts with a block) or that no layer reads (a block that writes the
/// logits) is no group: its channels stay where they are.
///
/// A new block type adds what it writes to its output stream and what it reads from its
/// input stream here, and nothing else changes.
pub fn permutation_groups(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<UnitUses>> {
    let first = FeatureShape::of(input)?;
    let (shapes, _) = chain(first, layers)?;
    let input_of = |i: usize| if i == 0 { first } else { shapes[i - 1] };
    let mut out = Vec::new();
    for uses in unit_uses(input, layers)? {
        let i = uses.layer;
        // A transformer's heads are not a plain permutation (q, k and v move together, and
        // features within a head may move too), and its stream runs through every block:
        // `fedfuse_fuse`'s transformer matching owns those groups.
        if let LayerSpec::Encoder { .. } = layers[i] {
            continue;
        }
        if let Some(b) = layers[i].block() {
            // A block's inner groups come first; after its last, the stream it projects.
            let last_inner = uses.own.first().map(|u| u.tensor.as_str())
                == Some(&format!(
                    "{i}.{}.weight",
                    BlockShape::conv_name(b.convs.len() - 2)
                ));
            out.push(uses);
            if last_inner && b.has_projection(input_of(i).channels()) {
                let mut stream = UnitUses {
                    layer: i,
                    units: b.out,
                    own: Vec::new(),
                    readers: Vec::new(),
                    between: Vec::new(),
                    identity: false,
                    tied: 1,
                };
                write_block_output(&mut stream, i, &b);
                write_conv(
                    &mut stream,
                    &format!("{i}.shortcut.0"),
                    &format!("{i}.shortcut.1"),
                    b.norm,
                );
                if follow_stream(&mut stream, i + 1, layers, &input_of) {
                    out.push(stream);
                }
            }
            continue;
        }
        if !uses.identity {
            out.push(uses);
            continue;
        }
        // The units enter a block's identity path: the stream goes on from that block.
        let mut stream = uses;
        stream.identity = false;
        stream.readers.clear();
        let block = stream.between.last().map_or(i + 1, |&b| b + 1);
        if follow_stream(&mut stream, block, layers, &input_of) {
            out.push(stream);
        }
    }
    Ok(out)
}

/// Adds a block's convolution `conv` writing the stream's channels to `stream`: its rows, and
/// its bias (no norm) or the channels of the norm `norm_name` after it.
fn write_conv(stream: &mut UnitUses, conv: &str, norm_name: &str, norm: BlockNorm) {
    stream
        .own
        .push(UnitUse::new(format!("{conv}.weight"), 0, 1));
    if norm == BlockNorm::None {
        stream.own.push(UnitUse::new(format!("{conv}.bias"), 0, 1));
    }
    for t in block_norm_tensors(norm) {
        stream
            .own
            .push(UnitUse::new(format!("{norm_name}.{t}"), 0, 1));
    }
}

/// Adds a residual block's last convolution (with its bias or norm) to `stream`.
fn write_block_output(stream: &mut UnitUses, at: usize, block: &BlockShape) {
    let last = block.convs.len() - 1;
    write_conv(
        stream,
        &format!("{at}.{}", BlockShape::conv_name(last)),
        &format!("{at}.{}", BlockShape::norm_name(last)),
        block.norm,
    );
    if block.norm == BlockNorm::Group {
        stream.tied = tie(stream.tied, block.groups, stream.units);
    }
}

/// Walks `stream` forward from layer `from` (the first layer that reads it) through identity
/// blocks and channel-wise layers to its readers; `false` when no layer reads it (it reaches
/// the end of the list, so its channels are the outputs).
fn follow_stream(
    stream: &mut UnitUses,
    from: usize,
    layers: &[LayerSpec],
    input_of: &dyn Fn(usize) -> FeatureShape,
) -> bool {
    let mut block = 1;
    for (j, layer) in layers.iter().enumerate().skip(from) {
        let at = input_of(j);
        let reader = |name: &str, groups: usize| UnitUse {
            groups,
            ..UnitUse::new(format!("{j}.{name}"), 1, block)
        };
        match *layer {
            LayerSpec::Residual { .. } | LayerSpec::Bottleneck { .. } => {
                let Some(b) = layer.block() else { continue };
                stream.readers.push(reader("conv1.weight", 1));
                if b.has_projection(at.channels()) {
                    stream.readers.push(reader("shortcut.0.weight", 1));
                    return true;
                }
                write_block_output(stream, j, &b);
                continue;
            }
            LayerSpec::Conv2d { groups, .. } => {
                stream.readers.push(reader("weight", groups));
                return true;
            }
            LayerSpec::Linear { .. } => {
                stream.readers.push(reader("weight", 1));
                return true;
            }
            LayerSpec::Tokens { .. } => {
                stream.readers.push(reader("conv_proj.weight", 1));
                return true;
            }
            _ => pass_channelwise(stream, j, layer, at, &mut block),
        }
        stream.between.push(j);
    }
    false
}

/// Adds what a layer that keeps the unit axis holds per unit (a norm's channels, at `block`
/// indices a unit) to `uses`, and widens `block` past a flatten. Layers that mix units (a
/// convolution, a linear layer, a residual block) are their caller's to handle.
fn pass_channelwise(
    uses: &mut UnitUses,
    j: usize,
    layer: &LayerSpec,
    at: FeatureShape,
    block: &mut usize,
) {
    let hold = |uses: &mut UnitUses, tensors: &[&str], per_unit: usize| {
        for t in tensors {
            uses.own.push(UnitUse::new(format!("{j}.{t}"), 0, per_unit));
        }
    };
    match *layer {
        LayerSpec::Flatten => {
            if let FeatureShape::Image { h, w, .. } = at {
                *block *= h * w;
            }
        }
        LayerSpec::BatchNorm2d { .. } | LayerSpec::BatchNorm1d { .. } => hold(
            uses,
            &["weight", "bias", "running_mean", "running_var"],
            *block,
        ),
        LayerSpec::GroupNorm { groups, .. } => {
            hold(uses, &["weight", "bias"], *block);
            uses.tied = tie(uses.tied, groups, uses.units);
        }
        // Its scale and shift have the sample's shape: a channel's row, or its flatten block.
        LayerSpec::LayerNorm { .. } => hold(uses, &["weight", "bias"], *block),
        LayerSpec::MaxPool2d { .. }
        | LayerSpec::AvgPool2d { .. }
        | LayerSpec::GlobalAvgpool
        | LayerSpec::Relu
        | LayerSpec::Dropout { .. }
        | LayerSpec::Conv2d { .. }
        | LayerSpec::Linear { .. }
        | LayerSpec::Residual { .. }
        | LayerSpec::Bottleneck { .. }
        | LayerSpec::Tokens { .. } => {}
        // They read tokens, which no walk from a grouped layer reaches (a tokens layer,
        // which starts them, is a reader).
        LayerSpec::Encoder { .. } | LayerSpec::ClassToken => {}
    }
}
