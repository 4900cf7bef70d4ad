//! PFNM and GPI-FNM over the channels and units of layer-list models, bottom-up (FedMA's
//! order, Wang et al. 2020): a convolution's unit is one filter, its `in x kh x kw` weights
//! laid out over the fused channels of the layer below plus its bias; a linear layer's unit is
//! a row over the fused units below (a flatten block of `h x w` columns per channel). The top
//! matched layer adds its outgoing weights into the classes, with precisions weighted by each
//! client's share of every class, exactly as [`MatchOrder::BottomUp`] does for MLPs; the
//! output layer is not matched.
//!
//! A client's input channel `v` sits at its fused channel; fused channels a client lacks are
//! observed zeros at full precision (as the MLP code treats absent connections). The
//! per-channel tensors of the norms after a matched layer (scale, shift, running mean and
//! variance) are not matched on: each fused channel takes the example-weighted mean of its
//! members' values. Every other tensor (norms before the first matched layer, batch norms'
//! `num_batches_tracked`) is averaged over the clients, counters rounded to a whole count.

use std::collections::HashMap;
use std::time::Instant;

use fedfuse_core::layers::{LayerSpec, UnitUse, UnitUses};
use fedfuse_core::{Params, Tensor};
use rand::Rng;
use rayon::prelude::*;

use super::layer::{MatchTimings, OrderSource, RngOrder, match_rows};
use super::lists::{
    FusedLayers, ListClients, UnitAxis, assemble, client_weights, mean_tensor, set_width,
};
use super::mlp::{MatchOrder, PfnmConfig, class_shares, output_bias};
use super::score::{self, ClientRows};
use super::types::{LayerPrior, LayerSettings, Matrix};
use crate::{FuseError, Result};

/// PFNM (GPI-FNM when `cfg.eps > 0`) of clients of one layer list, `input` the shape of a
/// sample and `layers` the list (clients may differ in the widths of matched layers: each
/// one's are read from its tensors). Refinement orders are drawn from `rng`.
///
/// `class_counts[j][k]` is client `j`'s number of training examples of class `k` (it weights
/// the output layer and the averages); `None` weighs all clients equally. Refused, naming the
/// layer ([`FuseError::UnsupportedLayer`]): residual blocks, grouped convolutions, group and
/// layer norms after a matched layer; and `cfg.order = top_down` with two or more matched
/// layers (layer lists are matched bottom-up).
///
/// ```
/// use fedfuse_core::{LayerSpec, Params};
/// use fedfuse_fuse::{MatchOrder, PfnmConfig, pfnm_fuse_layers};
/// use rand::{SeedableRng, rngs::StdRng};
///
/// let layers = [
///     LayerSpec::conv2d(2, 1), LayerSpec::Relu, LayerSpec::Flatten, LayerSpec::linear(1),
/// ];
/// let mut net = Params::new();
/// net.push("0.weight", vec![2, 1, 1, 1], vec![1.0, -1.0])?;
/// net.push("0.bias", vec![2], vec![0.1, 0.2])?;
/// net.push("3.weight", vec![1, 2], vec![0.5, 2.0])?;
/// net.push("3.bias", vec![1], vec![0.0])?;
/// let cfg = PfnmConfig { prior: fedfuse_fuse::MatchPrior { sigma: 0.01, ..fedfuse_fuse::MatchPrior::default() }, order: MatchOrder::BottomUp, ..PfnmConfig::default() };
/// let fused = pfnm_fuse_layers(&[1, 1, 1], &layers, &[&net, &net], None, &cfg, &mut StdRng::seed_from_u64(0))?;
/// // Two copies of one network match filter for filter.
/// assert_eq!(fused.assignments, vec![vec![vec![0, 1], vec![0, 1]]]);
/// assert_eq!(fused.layers[0], LayerSpec::conv2d(2, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pfnm_fuse_layers<R: Rng + ?Sized>(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    rng: &mut R,
) -> Result<FusedLayers> {
    pfnm_fuse_list(
        input,
        layers,
        clients,
        class_counts,
        cfg,
        &mut RngOrder(rng),
    )
    .map(|(fused, _)| fused)
}

/// [`pfnm_fuse_layers`] with refinement orders from `orders` (one per matched layer and pass,
/// input side first), and the time spent on each matched layer.
pub fn pfnm_fuse_list(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    orders: &mut dyn OrderSource,
) -> Result<(FusedLayers, Vec<MatchTimings>)> {
    cfg.check()?;
    let list = ListClients::new(input, layers, clients)?;
    let n_matched = list.matched();
    if cfg.order == MatchOrder::TopDown && n_matched > 1 {
        return Err(FuseError::InvalidSetting {
            field: "order",
            reason: format!(
                "layer lists are matched bottom-up (FedMA's order); this one has {n_matched} \
                 matched layers, so set order = \"bottom_up\""
            ),
        });
    }
    let (out_weight, shares, weights) = output_shares(&list, class_counts)?;
    let mut fused: HashMap<String, Tensor> = HashMap::new();
    let mut new_layers = layers.to_vec();
    let mut assignments = Vec::with_capacity(n_matched);
    let mut timings = Vec::with_capacity(n_matched);
    // Width and assignment of the matched layer below (none under the first).
    let mut below: Option<(usize, Vec<Vec<usize>>)> = None;
    for g in 0..n_matched {
        let top = (g + 1 == n_matched).then_some(out_weight.as_str());
        let step = MatchStep {
            list: &list,
            shares: &shares,
            weights: &weights,
            cfg,
        };
        let (width, assigned, timing) = step.run(g, below.as_ref(), top, orders, &mut fused)?;
        set_width(&mut new_layers[list.uses[0][g].layer], width);
        timings.push(timing);
        below = Some((width, assigned.clone()));
        assignments.push(assigned);
    }

    // The output bias, as for MLPs; everything the map does not list, averaged.
    let out_bias = format!("{}.bias", list.output);
    if list.params[0].get(&out_bias).is_some() {
        let biases: Vec<Vec<f64>> = (0..list.len())
            .map(|j| {
                let t = list.tensor(j, &out_bias)?;
                Ok(t.data.iter().map(|&v| f64::from(v)).collect())
            })
            .collect::<Result<_>>()?;
        let slices: Vec<&[f64]> = biases.iter().map(Vec::as_slice).collect();
        let b = output_bias(&slices, &shares, cfg);
        let shape = list.tensor(0, &out_bias)?.shape.clone();
        let b = Tensor::new(&out_bias, shape, b.into_iter().map(|v| v as f32).collect())?;
        fused.insert(out_bias, b);
    }
    average_rest(&list, &weights, &mut fused)?;
    let params = assemble(input, &new_layers, fused)?;
    Ok((
        FusedLayers {
            params,
            layers: new_layers,
            assignments,
        },
        timings,
    ))
}

/// One matched layer of FedMA (Wang et al. 2020, Algorithm 1): the clients share every layer
/// below matched layer `g` (the fused ones, at one width) and have their own from `g` up.
/// Their units of layer `g` (filters or rows over the shared units below; the top matched
/// layer with its outgoing weights into the classes, as [`pfnm_fuse_layers`] matches it) are
/// matched as PFNM matches one layer. Returns the fused layer's own tensors (weight, bias and
/// the per-channel tensors of the norms after it, at the fused width, in the list's order),
/// its width and each client's assignment; the layers above are the clients' to re-lay over
/// the fused units ([`spread_readers`](crate::spread_readers)).
///
/// Arguments as for [`pfnm_fuse_list`]; an error when the clients' widths below `g` differ.
pub fn pfnm_match_layer(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    g: usize,
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    orders: &mut dyn OrderSource,
) -> Result<MatchedLayer> {
    cfg.check()?;
    let list = ListClients::new(input, layers, clients)?;
    let n_matched = list.matched();
    if g >= n_matched {
        return Err(FuseError::InvalidInput(format!(
            "matched layer {g} asked of a list with {n_matched}"
        )));
    }
    let below = match g.checked_sub(1) {
        None => None,
        Some(gb) => {
            let width = list.uses[0][gb].units;
            if let Some(j) = (0..list.len()).find(|&j| list.uses[j][gb].units != width) {
                return Err(FuseError::InvalidInput(format!(
                    "client {j} has {} units in model.layers[{}] where client 0 has {width}; \
                     the layers below the one matched must be shared",
                    list.uses[j][gb].units, list.uses[0][gb].layer
                )));
            }
            Some((width, vec![(0..width).collect(); list.len()]))
        }
    };
    let (out_weight, shares, weights) = output_shares(&list, class_counts)?;
    let step = MatchStep {
        list: &list,
        shares: &shares,
        weights: &weights,
        cfg,
    };
    let top = (g + 1 == n_matched).then_some(out_weight.as_str());
    let mut fused = HashMap::new();
    let (width, assignments, _) = step.run(g, below.as_ref(), top, orders, &mut fused)?;
    let mut tensors = Params::new();
    for own in &list.uses[0][g].own {
        let t = fused.remove(&own.tensor).ok_or_else(|| {
            FuseError::InvalidInput(format!("fused tensor `{}` was never estimated", own.tensor))
        })?;
        tensors.push(own.tensor.clone(), t.shape, t.data)?;
    }
    Ok(MatchedLayer {
        tensors,
        width,
        assignments,
    })
}

/// One layer matched by [`pfnm_match_layer`].
#[derive(Clone, Debug)]
pub struct MatchedLayer {
    /// The fused layer's own tensors, in the list's order.
    pub tensors: Params,
    /// Its fused width.
    pub width: usize,
    /// Client -> local unit -> fused unit.
    pub assignments: Vec<Vec<usize>>,
}

/// The output layer's weight name, each client's share of each class (weighting the top
/// layer's outgoing side) and each client's weight in averages.
fn output_shares(
    list: &ListClients,
    class_counts: Option<&[Vec<f64>]>,
) -> Result<(String, Vec<Vec<f64>>, Vec<f64>)> {
    let out_weight = format!("{}.weight", list.output);
    let k = list
        .tensor(0, &out_weight)?
        .shape
        .first()
        .copied()
        .unwrap_or(0);
    let shares = class_shares(class_counts, list.len(), k)?;
    Ok((out_weight, shares, client_weights(class_counts, list.len())))
}

/// What matching one layer of a list needs besides the layer.
struct MatchStep<'a> {
    list: &'a ListClients,
    /// Per client, its share of each class (weights the outgoing side of the top layer).
    shares: &'a [Vec<f64>],
    /// Per client, its weight in averages.
    weights: &'a [f64],
    cfg: &'a PfnmConfig,
}

impl MatchStep<'_> {
    /// Matches layer `g` over `below` (the fused width under it and each client's assignment
    /// there; `None` for the first), with the output weight `top` for the top matched layer;
    /// writes the fused tensors into `fused`. Returns width, assignments and timings.
    fn run(
        &self,
        g: usize,
        below: Option<&(usize, Vec<Vec<usize>>)>,
        top: Option<&str>,
        orders: &mut dyn OrderSource,
        fused: &mut HashMap<String, Tensor>,
    ) -> Result<(usize, Vec<Vec<usize>>, MatchTimings)> {
        let (list, cfg) = (self.list, self.cfg);
        let started = Instant::now();
        let (inv_s, inv_s0) = (1.0 / cfg.prior.sigma, 1.0 / cfg.prior.sigma0);
        let settings = LayerSettings {
            gamma: cfg.prior.gamma,
            iters: cfg.prior.iters,
            max_global: cfg.prior.max_global,
            eps: cfg.eps,
        };
        let layer = LayerVectors::new(list, g, below, top)?;
        let p = layer.len();
        let precisions: Vec<Vec<f64>> = self
            .shares
            .iter()
            .map(|r| {
                let mut s = vec![inv_s; p];
                if top.is_some() {
                    let out = &mut s[layer.incoming + layer.has_bias..];
                    for (block, share) in out.chunks_mut(layer.span_out.max(1)).zip(r) {
                        block.fill(share * inv_s);
                    }
                }
                s
            })
            .collect();
        let mut mean = vec![0.0; p];
        if layer.has_bias == 1 {
            mean[layer.incoming] = cfg.bias_mean;
        }
        let prior = LayerPrior {
            mean,
            precision: vec![inv_s0; p],
        };
        let runs = {
            let slices: Vec<&[f64]> = precisions.iter().map(Vec::as_slice).collect();
            score::precision_runs(&prior, &slices)
        };
        let rows: Vec<ClientRows> = (0..list.len())
            .into_par_iter()
            .zip(&precisions)
            .map(|(j, s)| {
                ClientRows::new(layer.units[j], s, &prior, &runs, cfg.eps, |u, x| {
                    layer.fill(j, u, x);
                    for (xv, sv) in x.iter_mut().zip(s) {
                        *xv *= sv;
                    }
                })
            })
            .collect();
        let m = match_rows(&rows, &prior, &runs, &settings, orders, started, true)?;
        let post = m.posterior_mean();
        let width = m.width();
        layer.write(list, &post, &m.assignments, self.weights, fused)?;
        Ok((width, m.assignments, m.timings))
    }
}

/// Every tensor not estimated yet, averaged over the clients (same shape at each).
pub(super) fn average_rest(
    list: &ListClients,
    weights: &[f64],
    fused: &mut HashMap<String, Tensor>,
) -> Result<()> {
    for (name, _) in list.params[0].iter() {
        if fused.contains_key(name) {
            continue;
        }
        let at: Vec<&Tensor> = (0..list.len())
            .map(|j| list.tensor(j, name))
            .collect::<Result<_>>()?;
        fused.insert(name.to_string(), mean_tensor(name, &at, weights)?);
    }
    Ok(())
}

/// One matched layer's unit vectors `[incoming over the fused units below, bias, outgoing
/// into the classes]`, read through the unit map.
struct LayerVectors<'a> {
    list: &'a ListClients,
    /// Matched-layer index `g`.
    g: usize,
    /// Units per client.
    units: Vec<usize>,
    /// Fused units below (1 under the first matched layer: the input, as one block).
    below_width: usize,
    /// Client -> unit below -> fused unit below.
    below: Vec<Vec<usize>>,
    /// Values per unit below in one row of this layer's weight.
    span_in: usize,
    /// `below_width * span_in`.
    incoming: usize,
    /// 1 when the layer has a bias.
    has_bias: usize,
    /// Values per unit in one class row of the output weight (0 below the top layer).
    span_out: usize,
    /// Classes (output rows) when this is the top matched layer, else 0.
    classes: usize,
    /// Per client: views of this layer's weight (axis 0), its input side, the output weight.
    weight: Vec<UnitAxis>,
    input: Vec<UnitAxis>,
    output: Vec<Option<UnitAxis>>,
}

impl<'a> LayerVectors<'a> {
    fn new(
        list: &'a ListClients,
        g: usize,
        below: Option<&(usize, Vec<Vec<usize>>)>,
        out_weight: Option<&str>,
    ) -> Result<Self> {
        let first = &list.uses[0][g];
        let weight_name = &first.own[0].tensor;
        let has_bias = usize::from(first.own.iter().any(|u| is_bias(first.layer, &u.tensor)));
        let mut units = Vec::new();
        let (mut weight, mut input, mut output) = (Vec::new(), Vec::new(), Vec::new());
        for j in 0..list.len() {
            let uses = &list.uses[j][g];
            let w = list.tensor(j, weight_name)?;
            weight.push(UnitAxis::of(&uses.own[0], &w.shape)?);
            units.push(uses.units);
            input.push(match g.checked_sub(1) {
                None => UnitAxis {
                    rows: w.shape.first().copied().unwrap_or(0),
                    units: 1,
                    span: w.data.len() / w.shape.first().copied().unwrap_or(1).max(1),
                },
                Some(gb) => {
                    let reader = reader_of(&list.uses[j][gb], weight_name)?;
                    UnitAxis::of(reader, &w.shape)?
                }
            });
            output.push(match out_weight {
                Some(name) => {
                    let reader = reader_of(uses, name)?;
                    Some(UnitAxis::of(reader, &list.tensor(j, name)?.shape)?)
                }
                None => None,
            });
        }
        let span_in = input[0].span;
        if let Some(j) = input.iter().position(|a| a.span != span_in) {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: `{weight_name}` has {} values per input unit where client 0's has \
                 {span_in}",
                input[j].span
            )));
        }
        let (below_width, below) = match below {
            Some((w, a)) => (*w, a.clone()),
            None => (1, vec![vec![0]; list.len()]),
        };
        let (span_out, classes) = output[0].map_or((0, 0), |a| (a.span, a.rows));
        Ok(Self {
            list,
            g,
            units,
            below_width,
            below,
            span_in,
            incoming: below_width * span_in,
            has_bias,
            span_out,
            classes,
            weight,
            input,
            output,
        })
    }

    /// Coordinates per unit.
    fn len(&self) -> usize {
        self.incoming + self.has_bias + self.classes * self.span_out
    }

    /// Writes unit `u` of client `j` (not yet times its precisions) into `x`.
    fn fill(&self, j: usize, u: usize, x: &mut [f64]) {
        x.fill(0.0);
        let uses = &self.list.uses[j][self.g];
        let params = &self.list.params[j];
        // Present: `LayerVectors::new` read these tensors for every client.
        let Some(w) = params.get(&uses.own[0].tensor) else {
            return;
        };
        let inp = &self.input[j];
        let row = &w.data[self.weight[j].at(0, u)..][..self.weight[j].span];
        for (v, &gv) in self.below[j].iter().enumerate() {
            let src = &row[v * inp.span..(v + 1) * inp.span];
            for (xv, wv) in x[gv * self.span_in..].iter_mut().zip(src) {
                *xv = f64::from(*wv);
            }
        }
        if self.has_bias == 1
            && let Some(b) = uses
                .own
                .iter()
                .find(|o| is_bias(uses.layer, &o.tensor))
                .and_then(|o| params.get(&o.tensor))
        {
            x[self.incoming] = f64::from(b.data[u]);
        }
        if let (Some(out), Some(reader)) = (self.output[j], uses.readers.first())
            && let Some(t) = params.get(&reader.tensor)
        {
            let dst = &mut x[self.incoming + self.has_bias..];
            for (kk, block) in dst.chunks_mut(self.span_out).enumerate().take(out.rows) {
                let src = &t.data[out.at(kk, u)..][..out.span];
                for (xv, wv) in block.iter_mut().zip(src) {
                    *xv = f64::from(*wv);
                }
            }
        }
    }

    /// Writes the fused layer: its weight and bias from the posterior means, the output
    /// weight when it is the top layer, and the mean of every member for the norm channels.
    fn write(
        &self,
        list: &ListClients,
        post: &Matrix,
        assignments: &[Vec<usize>],
        weights: &[f64],
        fused: &mut HashMap<String, Tensor>,
    ) -> Result<()> {
        let width = post.rows();
        let uses = &list.uses[0][self.g];
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        for (o, own) in uses.own.iter().enumerate() {
            let t = list.tensor(0, &own.tensor)?;
            let mut shape = UnitAxis::resized(own, &t.shape, width);
            let data = if o == 0 {
                // The weight: its input side over the fused units below.
                if let Some(gb) = self.g.checked_sub(1) {
                    let reader = reader_of(&list.uses[0][gb], &own.tensor)?;
                    shape = UnitAxis::resized(reader, &shape, self.below_width);
                }
                (0..width)
                    .flat_map(|i| f32s(&post.row(i)[..self.incoming]))
                    .collect()
            } else if is_bias(uses.layer, &own.tensor) {
                f32s(
                    &(0..width)
                        .map(|i| post.get(i, self.incoming))
                        .collect::<Vec<_>>(),
                )
            } else {
                member_means(list, self.g, o, assignments, weights, width)?
            };
            fused.insert(own.tensor.clone(), Tensor::new(&own.tensor, shape, data)?);
        }
        if let (Some(out), Some(reader)) = (self.output[0], uses.readers.first()) {
            let t = list.tensor(0, &reader.tensor)?;
            let shape = UnitAxis::resized(reader, &t.shape, width);
            let off = self.incoming + self.has_bias;
            let mut data = Vec::with_capacity(out.rows * width * out.span);
            for kk in 0..out.rows {
                for i in 0..width {
                    let from = off + kk * out.span;
                    data.extend(f32s(&post.row(i)[from..from + out.span]));
                }
            }
            fused.insert(
                reader.tensor.clone(),
                Tensor::new(&reader.tensor, shape, data)?,
            );
        }
        Ok(())
    }
}

/// Whether `tensor` is the bias of list layer `layer` (the one own tensor matched on besides
/// the weight; the rest are norm channels).
fn is_bias(layer: usize, tensor: &str) -> bool {
    tensor.strip_prefix(&format!("{layer}.")) == Some("bias")
}

/// The reader of `uses`'s units that is the tensor `name`.
fn reader_of<'u>(uses: &'u UnitUses, name: &str) -> Result<&'u UnitUse> {
    uses.readers
        .iter()
        .find(|r| r.tensor == name)
        .ok_or_else(|| {
            FuseError::InvalidInput(format!(
                "the units of model.layers[{}] are not read by `{name}`",
                uses.layer
            ))
        })
}

/// Own tensor `own` of matched layer `g`, fused: each fused unit's values are the
/// `weights`-weighted mean of its members' values.
fn member_means(
    list: &ListClients,
    g: usize,
    own: usize,
    assignments: &[Vec<usize>],
    weights: &[f64],
    width: usize,
) -> Result<Vec<f32>> {
    let mut sum: Vec<f64> = Vec::new();
    let mut mass = vec![0.0f64; width];
    for (j, asg) in assignments.iter().enumerate() {
        let u = &list.uses[j][g].own[own];
        let t = list.tensor(j, &u.tensor)?;
        let axis = UnitAxis::of(u, &t.shape)?;
        if sum.is_empty() {
            sum = vec![0.0; width * axis.span];
        }
        for (local, &i) in asg.iter().enumerate() {
            let src = &t.data[axis.at(0, local)..][..axis.span];
            for (s, v) in sum[i * axis.span..].iter_mut().zip(src) {
                *s += weights[j] * f64::from(*v);
            }
            mass[i] += weights[j];
        }
    }
    let span = sum.len() / width.max(1);
    Ok(sum
        .iter()
        .enumerate()
        .map(|(q, s)| (s / mass[q / span.max(1)].max(f64::MIN_POSITIVE)) as f32)
        .collect())
}
