//! Weight matching of Vision Transformers: Git Re-Basin's coordinate descent
//! ([`super::weight_matching`]) over the permutation groups a ViT has. A ViT list (a `tokens`
//! layer, `encoder` blocks, `class_token`, an optional `layernorm`, a `linear` head: what
//! `fedfuse_core::VitShape` builds, torchvision's `VisionTransformer`) keeps its function
//! under:
//! - one permutation of the residual stream's `hidden` features, shared by everything that
//!   writes or reads it: `conv_proj`'s filters, the class token, the positional embedding,
//!   every layer norm, every block's `in_proj` and `mlp.0` inputs and `out_proj` and `mlp.3`
//!   outputs, the head's inputs (a layer norm normalises over all features, so it commutes
//!   with a permutation of them);
//! - per block, a permutation of the MLP's hidden units (`mlp.0` rows, `mlp.3` columns);
//! - per block, a permutation of whole heads, and within each head one permutation of the
//!   query and key features (`q . k` is unchanged) and one of the value features with
//!   `out_proj`'s inputs.
//!
//! The attention's step is solved exactly over those block-structured permutations: for every
//! pair of heads the best within-head permutations (two assignments), then the heads by one
//! assignment on those scores. A group here holds a part of an axis (a third of `in_proj`'s
//! rows) or a token's features (axis 2 of the positional embedding), which the unit map of
//! `fedfuse_core::layers` (whole axes 0 and 1) does not express; hence [`Hold`].

use std::borrow::Cow;
use std::collections::HashMap;

use fedfuse_core::layers::LayerSpec;
use fedfuse_core::{Params, Tensor};
use rand::Rng;
use rand::seq::SliceRandom;

use super::lists::{FusedLayers, client_weights, fuse_aligned};
use super::score::product_nt;
use super::types::check_score_size;
use crate::{FuseError, Result};

/// One group's hold on one axis of a tensor: indices `offset + u * block .. + block` of `axis`
/// are unit `u`'s.
#[derive(Clone, Debug)]
pub(super) struct Hold {
    pub(super) tensor: String,
    pub(super) axis: usize,
    offset: usize,
    block: usize,
}

impl Hold {
    fn new(tensor: String, axis: usize) -> Self {
        Self {
            tensor,
            axis,
            offset: 0,
            block: 1,
        }
    }

    fn at(tensor: String, axis: usize, offset: usize) -> Self {
        Self {
            offset,
            ..Self::new(tensor, axis)
        }
    }

    /// `(outer, len, inner)` of the tensor around the axis, checked to hold `units` units.
    fn frame(&self, t: &Tensor, units: usize) -> Result<(usize, usize, usize)> {
        let bad = || {
            FuseError::InvalidInput(format!(
                "tensor `{}` {:?} does not hold {units} units of {} on axis {} from {}",
                self.tensor, t.shape, self.block, self.axis, self.offset
            ))
        };
        let len = *t.shape.get(self.axis).ok_or_else(bad)?;
        if self.offset + units * self.block > len {
            return Err(bad());
        }
        let outer = t.shape[..self.axis].iter().product();
        let inner = t.shape[self.axis + 1..].iter().product();
        Ok((outer, len, inner))
    }

    /// Moves unit `u` of `t` to `perm[u]`.
    fn permute(&self, t: &mut Tensor, perm: &[usize]) -> Result<()> {
        *t = self.spread(t, perm, perm.len())?;
        Ok(())
    }

    /// `t` (`to.len()` units here) with its unit `u` at unit `to[u]` of `width`, zeros at the
    /// units none goes to.
    pub(super) fn spread(&self, t: &Tensor, to: &[usize], width: usize) -> Result<Tensor> {
        let mut src_of = vec![None; width];
        for (u, &d) in to.iter().enumerate() {
            match src_of.get_mut(d) {
                Some(s) => *s = Some(u),
                None => {
                    return Err(FuseError::InvalidInput(format!(
                        "tensor `{}`: unit {u} sent to {d} of {width}",
                        self.tensor
                    )));
                }
            }
        }
        self.relayout(t, to.len(), &src_of)
    }

    /// `t` with `src_of.len()` units here, unit `u` being `t`'s unit `src_of[u]` (of `units`)
    /// or zeros for `None`. The count may change only where the hold spans its whole axis.
    pub(super) fn relayout(
        &self,
        t: &Tensor,
        units: usize,
        src_of: &[Option<usize>],
    ) -> Result<Tensor> {
        let (outer, len, inner) = self.frame(t, units)?;
        let whole = self.offset == 0 && len == units * self.block;
        if src_of.len() != units && !whole || src_of.iter().flatten().any(|&u| u >= units) {
            return Err(FuseError::InvalidInput(format!(
                "tensor `{}` {:?}: {} units asked of {units} on axis {}",
                self.tensor,
                t.shape,
                src_of.len(),
                self.axis
            )));
        }
        let new_len = len - units * self.block + src_of.len() * self.block;
        let mut shape = t.shape.clone();
        shape[self.axis] = new_len;
        // Outside the hold (other thirds of `in_proj`) the values stay where they are.
        let mut data = if whole {
            vec![0.0; outer * new_len * inner]
        } else {
            t.data.clone()
        };
        for o in 0..outer {
            for (u, src) in src_of.iter().enumerate() {
                for j in 0..self.block {
                    let dst = (o * new_len + self.offset + u * self.block + j) * inner;
                    let to = &mut data[dst..dst + inner];
                    match src {
                        Some(v) => {
                            let at = (o * len + self.offset + v * self.block + j) * inner;
                            to.copy_from_slice(&t.data[at..at + inner]);
                        }
                        None => to.fill(0.0),
                    }
                }
            }
        }
        Ok(Tensor::new(&self.tensor, shape, data)?)
    }

    /// The `units` units of `t` as rows of `outer * block * inner` values, in f64.
    pub(super) fn rows(&self, t: &Tensor, units: usize) -> Result<Vec<f64>> {
        let (outer, len, inner) = self.frame(t, units)?;
        let k = outer * self.block * inner;
        let mut out = vec![0.0; units * k];
        for u in 0..units {
            for o in 0..outer {
                for j in 0..self.block {
                    let src = (o * len + self.offset + u * self.block + j) * inner;
                    let dst = u * k + (o * self.block + j) * inner;
                    for (d, &s) in out[dst..dst + inner]
                        .iter_mut()
                        .zip(&t.data[src..src + inner])
                    {
                        *d = f64::from(s);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// A permutation group: its units and every hold on them.
#[derive(Clone, Debug)]
pub(super) struct Group {
    pub(super) units: usize,
    pub(super) holds: Vec<Hold>,
}

/// A step's outcome: the new permutations of its groups (`(group, permutation)`), the
/// objective they reach, and the one the current permutations reach.
type StepResult = Result<(Vec<(usize, Vec<usize>)>, f64, f64)>;

/// A coordinate of the descent: the stream, a block's attention (its query-key and value
/// groups at once) or a block's MLP units.
#[derive(Clone, Copy, Debug)]
enum Step {
    Stream,
    Attention(usize),
    Mlp(usize),
}

/// The permutation groups of a ViT list: group 0 is the stream, then per block its
/// query-key, value and MLP groups.
#[derive(Clone, Debug)]
pub(crate) struct VitGroups {
    pub(super) groups: Vec<Group>,
    /// Heads of each block.
    pub(super) heads: Vec<usize>,
    /// Holds of the stream on tensors whose inputs are the image (the first bottom-up step).
    pub(super) stream_inputs: usize,
    /// Index of the head (the layer that writes the logits).
    pub(crate) head: usize,
}

impl VitGroups {
    /// The groups of `layers`; refuses, naming the layer, a list that is not a ViT's.
    pub(crate) fn of(layers: &[LayerSpec]) -> Result<Self> {
        let refuse = |i: usize, reason: &str| FuseError::UnsupportedLayer {
            layer: i,
            kind: layers
                .get(i)
                .map_or("end of the list", LayerSpec::type_name),
            reason: format!(
                "{reason}: weight matching of a transformer follows a tokens layer, encoder \
                 blocks, class_token, an optional layernorm and a linear head \
                 (torchvision's VisionTransformer, model.kind = \"vit\")"
            ),
        };
        let Some(LayerSpec::Tokens { hidden, .. }) = layers.first() else {
            return Err(refuse(0, "the list does not start with its tokens layer"));
        };
        let hidden = *hidden;
        let stream_of = |i: usize, name: &str, axis: usize| Hold::new(format!("{i}.{name}"), axis);
        let mut stream = vec![
            stream_of(0, "conv_proj.weight", 0),
            stream_of(0, "conv_proj.bias", 0),
            stream_of(0, "class_token", 2),
            stream_of(0, "pos_embedding", 2),
        ];
        let stream_inputs = stream.len();
        let mut groups = vec![Group {
            units: hidden,
            holds: Vec::new(),
        }];
        let mut heads = Vec::new();
        let mut i = 1;
        while let Some(&LayerSpec::Encoder { heads: h, mlp, .. }) = layers.get(i) {
            let attn = |name: &str| format!("{i}.self_attention.{name}");
            for (name, axis) in [
                ("ln_1.weight", 0),
                ("ln_1.bias", 0),
                ("self_attention.in_proj_weight", 1),
                ("self_attention.out_proj.weight", 0),
                ("self_attention.out_proj.bias", 0),
                ("ln_2.weight", 0),
                ("ln_2.bias", 0),
                ("mlp.0.weight", 1),
                ("mlp.3.weight", 0),
                ("mlp.3.bias", 0),
            ] {
                stream.push(stream_of(i, name, axis));
            }
            let qk = [0, hidden]
                .into_iter()
                .flat_map(|at| {
                    [
                        Hold::at(attn("in_proj_weight"), 0, at),
                        Hold::at(attn("in_proj_bias"), 0, at),
                    ]
                })
                .collect();
            let vo = vec![
                Hold::at(attn("in_proj_weight"), 0, 2 * hidden),
                Hold::at(attn("in_proj_bias"), 0, 2 * hidden),
                Hold::new(attn("out_proj.weight"), 1),
            ];
            let units = vec![
                stream_of(i, "mlp.0.weight", 0),
                stream_of(i, "mlp.0.bias", 0),
                stream_of(i, "mlp.3.weight", 1),
            ];
            groups.extend([
                Group {
                    units: hidden,
                    holds: qk,
                },
                Group {
                    units: hidden,
                    holds: vo,
                },
                Group {
                    units: mlp,
                    holds: units,
                },
            ]);
            heads.push(h);
            i += 1;
        }
        if layers.get(i) != Some(&LayerSpec::ClassToken) {
            return Err(refuse(i, "expected class_token after the encoder blocks"));
        }
        i += 1;
        if let Some(LayerSpec::LayerNorm { .. }) = layers.get(i) {
            stream.push(stream_of(i, "weight", 0));
            stream.push(stream_of(i, "bias", 0));
            i += 1;
        }
        let Some(LayerSpec::Linear { .. }) = layers.get(i) else {
            return Err(refuse(i, "expected the linear head"));
        };
        if i + 1 != layers.len() {
            return Err(refuse(i + 1, "the linear head must be the last layer"));
        }
        stream.push(stream_of(i, "weight", 1));
        groups[0].holds = stream;
        Ok(Self {
            groups,
            heads,
            stream_inputs,
            head: i,
        })
    }

    pub(super) fn blocks(&self) -> usize {
        self.heads.len()
    }

    /// The tensors the groups `step` hold, each with every other group's permutation
    /// applied: what a step scores, without a copy of the rest of the model.
    fn apply_for_step(
        &self,
        params: &Params,
        perms: &[Vec<usize>],
        step: &[usize],
    ) -> Result<Params> {
        let mut out = Params::new();
        for hold in step.iter().flat_map(|&g| &self.groups[g].holds) {
            if out.get(&hold.tensor).is_none() {
                let t = params.require(&hold.tensor)?;
                out.push(hold.tensor.clone(), t.shape.clone(), t.data.clone())?;
            }
        }
        for (g, group) in self.groups.iter().enumerate() {
            if step.contains(&g) || is_identity(&perms[g]) {
                continue;
            }
            for hold in &group.holds {
                if let Some(t) = out.get_mut(&hold.tensor) {
                    hold.permute(t, &perms[g])?;
                }
            }
        }
        Ok(out)
    }

    /// `params` with every group's permutation applied but those in `skip`.
    pub(super) fn apply(
        &self,
        params: &Params,
        perms: &[Vec<usize>],
        skip: &[usize],
    ) -> Result<Params> {
        let mut out = params.clone();
        for (g, group) in self.groups.iter().enumerate() {
            if skip.contains(&g) || is_identity(&perms[g]) {
                continue;
            }
            for hold in &group.holds {
                let t = out
                    .get_mut(&hold.tensor)
                    .ok_or_else(|| missing(&hold.tensor))?;
                hold.permute(t, &perms[g])?;
            }
        }
        Ok(out)
    }

    /// `n x n` inner products of reference unit `a` (row) with client unit `b` (column) over
    /// `holds`, `client` already in the reference's order on every other axis.
    fn similarity(
        &self,
        reference: &Params,
        client: &Params,
        holds: &[Hold],
        n: usize,
    ) -> Result<Vec<f64>> {
        check_score_size(n, n, || {
            format!("weight matching of a ViT group of {n} units")
        })?;
        let mut cost = vec![0.0; n * n];
        for hold in holds {
            let a = hold.rows(reference.require(&hold.tensor)?, n)?;
            let b = hold.rows(client.require(&hold.tensor)?, n)?;
            let k = a.len() / n.max(1);
            if k > 0 {
                product_nt(&mut cost, n, &a, &b, k);
            }
        }
        Ok(cost)
    }

    /// One step of the descent ([`StepResult`]).
    fn step(
        &self,
        reference: &Params,
        client: &Params,
        perms: &[Vec<usize>],
        step: Step,
        first: bool,
    ) -> StepResult {
        match step {
            Step::Stream | Step::Mlp(_) => {
                let g = match step {
                    Step::Mlp(b) => 3 + 3 * b,
                    _ => 0,
                };
                let group = &self.groups[g];
                let holds = match (step, first) {
                    (Step::Stream, true) => &group.holds[..self.stream_inputs],
                    _ => &group.holds[..],
                };
                let others = self.apply_for_step(client, perms, &[g])?;
                let cost = self.similarity(reference, &others, holds, group.units)?;
                let (perm, value) = assign(&cost, group.units)?;
                let old = total(&cost, group.units, &perms[g]);
                Ok((vec![(g, perm)], value, old))
            }
            Step::Attention(b) => {
                let (qk, vo) = (1 + 3 * b, 2 + 3 * b);
                let n = self.groups[qk].units;
                let others = self.apply_for_step(client, perms, &[qk, vo])?;
                let cost_qk = self.similarity(reference, &others, &self.groups[qk].holds, n)?;
                let cost_vo = self.similarity(reference, &others, &self.groups[vo].holds, n)?;
                let (perm_qk, perm_vo) = heads_assignment(&cost_qk, &cost_vo, n, self.heads[b])?;
                let value = |c: &[f64], p: &[usize]| total(c, n, p);
                let new = value(&cost_qk, &perm_qk) + value(&cost_vo, &perm_vo);
                let old = value(&cost_qk, &perms[qk]) + value(&cost_vo, &perms[vo]);
                Ok((vec![(qk, perm_qk), (vo, perm_vo)], new, old))
            }
        }
    }

    /// One permutation per group taking `client`'s units onto `reference`'s (`perm[u]` = the
    /// reference unit of client unit `u`): a bottom-up pass (the stream on the tensors that
    /// read the image, then each block's attention and MLP), then passes over every step in
    /// an order drawn from `rng` until none improves (or `max_iters`).
    fn align<R: Rng + ?Sized>(
        &self,
        reference: &Params,
        client: &Params,
        max_iters: usize,
        rng: &mut R,
    ) -> Result<Vec<Vec<usize>>> {
        let mut perms: Vec<Vec<usize>> =
            self.groups.iter().map(|g| (0..g.units).collect()).collect();
        let mut steps = vec![Step::Stream];
        for b in 0..self.blocks() {
            steps.extend([Step::Attention(b), Step::Mlp(b)]);
        }
        for &step in &steps {
            let (new, ..) = self.step(reference, client, &perms, step, true)?;
            for (g, p) in new {
                perms[g] = p;
            }
        }
        for _ in 0..max_iters {
            steps.shuffle(rng);
            let mut improved = false;
            for &step in &steps {
                let (new, value, old) = self.step(reference, client, &perms, step, false)?;
                if value > old + 1e-12 * old.abs().max(1.0) {
                    for (g, p) in new {
                        perms[g] = p;
                    }
                    improved = true;
                }
            }
            if !improved {
                break;
            }
        }
        Ok(perms)
    }
}

pub(super) fn missing(name: &str) -> FuseError {
    FuseError::InvalidInput(format!("tensor `{name}` is missing"))
}

pub(super) fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(u, &p)| u == p)
}

/// `sum_b cost[perm[b], b]`.
fn total(cost: &[f64], n: usize, perm: &[usize]) -> f64 {
    perm.iter().enumerate().map(|(b, &a)| cost[a * n + b]).sum()
}

/// The assignment maximising `sum_b cost[perm[b], b]` of an `n x n` score (reference units
/// as rows): `perm[b]` is the reference unit of client unit `b`, and the score it reaches.
pub(super) fn assign(cost: &[f64], n: usize) -> Result<(Vec<usize>, f64)> {
    if n == 0 {
        return Ok((Vec::new(), 0.0));
    }
    // The solver takes a Vec.
    let (_, cols) = lsap::solve(n, n, &cost.to_vec(), true)
        .map_err(|e| FuseError::Solver(format!("weight matching of {n} units: {e}")))?;
    let mut perm = vec![0; n];
    for (a, &b) in cols.iter().enumerate() {
        perm[b] = a;
    }
    let value = total(cost, n, &perm);
    Ok((perm, value))
}

/// The best block-structured permutations of a block's query-key and value features
/// (`n` features in `heads` heads): a head goes whole to one head, its query-key features and
/// its value features each permuted within it.
pub(super) fn heads_assignment(
    cost_qk: &[f64],
    cost_vo: &[f64],
    n: usize,
    heads: usize,
) -> Result<(Vec<usize>, Vec<usize>)> {
    let hd = n / heads.max(1);
    let within = |cost: &[f64], x: usize, y: usize| -> Result<(Vec<usize>, f64)> {
        let mut sub = vec![0.0; hd * hd];
        for i in 0..hd {
            for j in 0..hd {
                sub[i * hd + j] = cost[(x * hd + i) * n + y * hd + j];
            }
        }
        assign(&sub, hd)
    };
    let mut score = vec![0.0; heads * heads];
    let mut best = HashMap::new();
    for x in 0..heads {
        for y in 0..heads {
            let (pq, vq) = within(cost_qk, x, y)?;
            let (pv, vv) = within(cost_vo, x, y)?;
            score[x * heads + y] = vq + vv;
            best.insert((x, y), (pq, pv));
        }
    }
    let (head_of, _) = assign(&score, heads)?;
    let (mut qk, mut vo) = (vec![0; n], vec![0; n]);
    for (y, &x) in head_of.iter().enumerate() {
        let (pq, pv) = &best[&(x, y)];
        for j in 0..hd {
            qk[y * hd + j] = x * hd + pq[j];
            vo[y * hd + j] = x * hd + pv[j];
        }
    }
    Ok((qk, vo))
}

/// Weight matching of ViT clients (`clients`, checked: the list's tensors at its widths, in
/// its order): each client aligned to client 0 ([`VitGroups::align`]), then the aligned models
/// averaged with `weights`. `assignments[g][j][u]`: group `g` (the stream, then per block its
/// query-key, value and MLP groups), client `j`, its unit `u`'s unit in client 0.
pub(crate) fn weight_matching_vit<R: Rng + ?Sized>(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[Cow<'_, Params>],
    weights: Option<&[Vec<f64>]>,
    max_iters: usize,
    rng: &mut R,
) -> Result<FusedLayers> {
    let vit = VitGroups::of(layers)?;
    let Some(reference) = clients.first() else {
        return Err(FuseError::Empty);
    };
    let mut aligned = vec![Cow::Borrowed(&**reference)];
    let mut assignments: Vec<Vec<Vec<usize>>> = vit
        .groups
        .iter()
        .map(|g| vec![(0..g.units).collect()])
        .collect();
    for client in &clients[1..] {
        let perms = vit.align(reference, client, max_iters, rng)?;
        aligned.push(Cow::Owned(vit.apply(client, &perms, &[])?));
        for (g, p) in perms.into_iter().enumerate() {
            assignments[g].push(p);
        }
    }
    let weights = client_weights(weights, clients.len());
    fuse_aligned(input, layers, aligned, &weights, assignments)
}

/// Applies one permutation per group of a ViT list to `params` (`perms[g][u]`: where unit `u`
/// of group `g` goes; groups as [`weight_matching_vit`]'s assignments order them): the same
/// network, its units relabelled. For tests and planted permutations.
pub fn permute_vit(layers: &[LayerSpec], params: &Params, perms: &[Vec<usize>]) -> Result<Params> {
    let vit = VitGroups::of(layers)?;
    if perms.len() != vit.groups.len()
        || perms
            .iter()
            .zip(&vit.groups)
            .any(|(p, g)| !is_permutation(p, g.units))
    {
        return Err(FuseError::InvalidInput(format!(
            "a ViT of {} blocks needs {} permutations of its groups' units",
            vit.blocks(),
            vit.groups.len()
        )));
    }
    vit.check_whole_heads(perms)?;
    vit.apply(params, perms, &[])
}

impl VitGroups {
    /// Refuses query-key and value permutations (`perms` in [`permute_vit`]'s order) that
    /// split a head or send its two parts to different heads.
    fn check_whole_heads(&self, perms: &[Vec<usize>]) -> Result<()> {
        for (b, &h) in self.heads.iter().enumerate() {
            let hd = self.groups[1 + 3 * b].units / h.max(1);
            let (qk, vo) = (&perms[1 + 3 * b], &perms[2 + 3 * b]);
            let whole = (0..h).all(|y| {
                let x = qk[y * hd] / hd.max(1);
                (0..hd).all(|j| qk[y * hd + j] / hd == x && vo[y * hd + j] / hd == x)
            });
            if !whole {
                return Err(FuseError::InvalidInput(format!(
                    "block {b}: the query-key and value permutations must move whole heads, \
                     the same way"
                )));
            }
        }
        Ok(())
    }
}

/// The part of a fused ViT that a client runs (PFNM's later rounds): `global` holds `layers`
/// at the fused widths, and `picks[g][u]` is the fused unit of the client's unit `u` of group
/// `g` ([`permute_vit`]'s order): the client's unit `u` takes it, so the part has the
/// client's widths and order. Fixed-width groups (the stream and the heads) take
/// permutations that move whole heads; an MLP group takes distinct fused units.
pub fn vit_part(layers: &[LayerSpec], global: &Params, picks: &[Vec<usize>]) -> Result<Params> {
    let vit = VitGroups::of(layers)?;
    let bad = |g: usize, why: &str| {
        FuseError::InvalidInput(format!("group {g} of the fused ViT: the picks {why}"))
    };
    if picks.len() != vit.groups.len() {
        return Err(bad(picks.len(), "are not one per group"));
    }
    for (g, (p, group)) in picks.iter().zip(&vit.groups).enumerate() {
        let mlp = g % 3 == 0 && g > 0;
        let mut seen = vec![false; group.units];
        let distinct = p
            .iter()
            .all(|&u| seen.get_mut(u).is_some_and(|s| !std::mem::replace(s, true)));
        if !distinct || (!mlp && p.len() != group.units) || p.is_empty() {
            return Err(bad(g, "are not distinct units of it, as many as it keeps"));
        }
    }
    vit.check_whole_heads(picks)?;
    let mut out = global.clone();
    for (group, p) in vit.groups.iter().zip(picks) {
        if p.len() == group.units && is_identity(p) {
            continue;
        }
        let src_of: Vec<Option<usize>> = p.iter().map(|&u| Some(u)).collect();
        for hold in &group.holds {
            let t = out
                .get_mut(&hold.tensor)
                .ok_or_else(|| missing(&hold.tensor))?;
            *t = hold.relayout(t, group.units, &src_of)?;
        }
    }
    Ok(out)
}

/// One of a ViT's permutation groups as `fedfuse groups` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VitGroupView {
    /// Its units (features).
    pub units: usize,
    /// For a block's query-key and value groups, its heads: a head's features move whole, to
    /// one head, permuted within it.
    pub heads: Option<usize>,
    /// The tensors that hold the units, with where: `""` for the first axis, `"rows a:b"` for
    /// a part of it (a third of `in_proj`), `"last axis"` for the class token and the
    /// positional embedding.
    pub holds: Vec<(String, String)>,
    /// The tensors that read the units as their inputs.
    pub read_by: Vec<String>,
}

/// The permutation groups of a ViT list (the stream, then per block its query-key, value and
/// MLP groups: `permute_vit`'s order); refused, naming the layer, for another list.
pub fn vit_groups(layers: &[LayerSpec]) -> Result<Vec<VitGroupView>> {
    let vit = VitGroups::of(layers)?;
    Ok(vit
        .groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            let (holds, read_by): (Vec<&Hold>, Vec<&Hold>) =
                group.holds.iter().partition(|h| h.axis != 1);
            VitGroupView {
                units: group.units,
                heads: (g % 3 != 0).then(|| vit.heads[(g - 1) / 3]),
                holds: holds
                    .into_iter()
                    .map(|h| {
                        let at = match h.axis {
                            0 if h.tensor.contains("in_proj") => {
                                format!("rows {}:{}", h.offset, h.offset + group.units * h.block)
                            }
                            0 => String::new(),
                            _ => "last axis".to_string(),
                        };
                        (h.tensor.clone(), at)
                    })
                    .collect(),
                read_by: read_by.into_iter().map(|h| h.tensor.clone()).collect(),
            }
        })
        .collect())
}

/// Random permutations of every group of a ViT list, in [`permute_vit`]'s order: the stream;
/// per block whole heads, each head's query-key and value features within it (the same head
/// mapping for both), and the MLP units. A relabelling that keeps the network's function.
pub fn random_vit_permutations<R: Rng + ?Sized>(
    layers: &[LayerSpec],
    rng: &mut R,
) -> Result<Vec<Vec<usize>>> {
    let vit = VitGroups::of(layers)?;
    let mut shuffled = |n: usize| {
        let mut p: Vec<usize> = (0..n).collect();
        p.shuffle(rng);
        p
    };
    let mut perms = vec![shuffled(vit.groups[0].units)];
    for (b, &heads) in vit.heads.iter().enumerate() {
        let e = vit.groups[1 + 3 * b].units;
        let hd = e / heads.max(1);
        let head_to = shuffled(heads);
        let (mut qk, mut vo) = (vec![0; e], vec![0; e]);
        for (y, &x) in head_to.iter().enumerate() {
            let (wq, wv) = (shuffled(hd), shuffled(hd));
            for j in 0..hd {
                qk[y * hd + j] = x * hd + wq[j];
                vo[y * hd + j] = x * hd + wv[j];
            }
        }
        perms.extend([qk, vo, shuffled(vit.groups[3 + 3 * b].units)]);
    }
    Ok(perms)
}

pub(super) fn is_permutation(p: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    p.len() == n
        && p.iter()
            .all(|&u| u < n && !std::mem::replace(&mut seen[u], true))
}
