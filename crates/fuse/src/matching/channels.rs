//! PFNM and GPI-FNM over the channels and units of layer-list models, bottom-up (FedMA's
//! order, Wang et al. 2020): a convolution's unit is one filter, its `in x kh x kw` weights
//! laid out over the fused channels of the layer below plus its bias; a linear layer's unit is
//! a row over the fused units below (a flatten block of `h x w` columns per channel). The top
//! matched layer adds its outgoing weights into the classes, with precisions weighted by each
//! client's share of every class, exactly as [`MatchOrder::BottomUp`] does for MLPs; the
//! output layer is not matched.
//!
//! What is matched is a permutation group (`fedfuse_core::layers::permutation_groups`): in a
//! plain chain a layer's units, in a residual network also a stage's stream, written by the stem
//! or a projection and by every block's `conv2`. A unit's vector joins its rows in every writer
//! whose inputs are fused already; a writer that reads a group matched later (an identity
//! block's `conv2`, whose inner channels read the stream) is fused once every group is, as the
//! posterior mean of its members' rows under the group's assignment.
//!
//! A client's input channel `v` sits at its fused channel; fused channels a client lacks are
//! observed zeros at full precision (as the MLP code treats absent connections). The
//! per-channel tensors of the norms after a matched layer (scale, shift, running mean and
//! variance) are not matched on: each fused channel takes the example-weighted mean of its
//! members' values. Every other tensor (norms before the first matched layer, batch norms'
//! `num_batches_tracked`) is averaged over the clients, counters rounded to a whole count.

use std::collections::HashMap;
use std::time::Instant;

use fedfuse_core::layers::{self, FeatureShape, LayerSpec, UnitUse, UnitUses};
use fedfuse_core::{Params, Tensor};
use rand::Rng;
use rayon::prelude::*;

use super::layer::{MatchTimings, OrderSource, RngOrder, match_rows};
use super::lists::{
    FusedLayers, ListClients, UnitAxis, assemble, at_group_widths, client_weights, matchable,
    mean_tensor, refuse_layerwise_transformers,
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
/// layer ([`FuseError::UnsupportedLayer`]): grouped convolutions, group and layer norms after a
/// matched layer, residual blocks with group norm or a width change at stride 1; and
/// `cfg.order = top_down` with two or more matched groups (layer lists are matched bottom-up).
/// A residual block's inner channels may fuse to another width than its stream: the fused
/// list's block then says `inner`. A Vision Transformer's list is fused over its own groups:
/// the stream and the heads at their widths, each block's MLP growing (`vit_pfnm`'s module
/// documentation says how and why); its assignments are per group in
/// [`permute_vit`](crate::permute_vit)'s order.
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

/// [`pfnm_fuse_layers`] with refinement orders from `orders` (one per matched group and
/// pass, input side first), and the time spent on each matched group (a ViT's: on the stream,
/// then on each block's attention and its MLP).
pub fn pfnm_fuse_list(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    orders: &mut dyn OrderSource,
) -> Result<(FusedLayers, Vec<MatchTimings>)> {
    cfg.check()?;
    if layers.iter().any(LayerSpec::is_transformer) {
        return super::vit_pfnm::pfnm_fuse_vit(input, layers, clients, class_counts, cfg, orders);
    }
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
    let step = MatchStep::new(&list, class_counts, cfg)?;
    let mut fused: HashMap<String, Tensor> = HashMap::new();
    let mut done: Vec<Option<Fused>> = vec![None; n_matched];
    let mut timings = Vec::with_capacity(n_matched);
    for g in 0..n_matched {
        let (matched, timing) = step.run(g, &done, orders, &mut fused)?;
        timings.push(timing);
        done[g] = Some(matched);
    }
    step.write_deferred(&done, |_, _| true, &mut fused)?;
    let done: Vec<Fused> = done.into_iter().flatten().collect();
    let widths: Vec<usize> = done.iter().map(|f| f.width).collect();
    let new_layers = at_group_widths(layers, &list.uses[0], &widths);
    let assignments = done.into_iter().map(|f| f.assignments).collect();

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
        let b = output_bias(&slices, &step.shares, cfg);
        let shape = list.tensor(0, &out_bias)?.shape.clone();
        let b = Tensor::new(&out_bias, shape, b.into_iter().map(|v| v as f32).collect())?;
        fused.insert(out_bias, b);
    }
    average_rest(&list, &step.weights, &mut fused)?;
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

/// One stage of FedMA (Wang et al. 2020, Algorithm 1) over permutation group `g`: the clients
/// share every group below (the fused ones, at one width) and have their own from `g` up.
/// Their units of group `g` (rows over the shared units below in every writer whose inputs are
/// fused; the top group with its outgoing weights into the classes, as [`pfnm_fuse_layers`]
/// matches it) are matched as PFNM matches one group. The writers of earlier groups that read
/// group `g` (a residual block's last convolution) are then fused as posterior means under
/// `g`'s assignment. Returns the tensors of stage `g` ([`layerwise_stages`]) at the fused
/// width, in the list's order, the width and each client's assignment; everything else that
/// holds or reads the group's units is the clients' to re-lay
/// ([`spread_units`](crate::spread_units)).
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
    refuse_layerwise_transformers(layers)?;
    let list = ListClients::new(input, layers, clients)?;
    let n_matched = list.matched();
    if g >= n_matched {
        return Err(FuseError::InvalidInput(format!(
            "matched layer {g} asked of a list with {n_matched}"
        )));
    }
    // The layers below are shared: each one's units sit where they are.
    let mut done: Vec<Option<Fused>> = vec![None; n_matched];
    for (gb, slot) in done.iter_mut().enumerate().take(g) {
        let width = list.uses[0][gb].units;
        if let Some(j) = (0..list.len()).find(|&j| list.uses[j][gb].units != width) {
            return Err(FuseError::InvalidInput(format!(
                "client {j} has {} units in model.layers[{}] where client 0 has {width}; \
                 the layers below the one matched must be shared",
                list.uses[j][gb].units, list.uses[0][gb].layer
            )));
        }
        *slot = Some(Fused {
            width,
            assignments: vec![(0..width).collect(); list.len()],
        });
    }
    let step = MatchStep::new(&list, class_counts, cfg)?;
    let mut fused = HashMap::new();
    let (matched, _) = step.run(g, &done, orders, &mut fused)?;
    done[g] = Some(matched.clone());
    // The writers below that read group `g` (a block's last convolution, into a stream
    // fused at an earlier stage); group `g`'s own writers that read groups above wait.
    step.write_deferred(&done, |h, w| Plan::stage_of(h, w) == g && h < g, &mut fused)?;
    let stage = step.plan.stage_tensors(&list.uses[0], g);
    let mut tensors = Params::new();
    for name in list.params[0]
        .names()
        .iter()
        .filter(|n| stage.contains(&n.as_str()))
    {
        let t = fused.remove(name).ok_or_else(|| {
            FuseError::InvalidInput(format!("fused tensor `{name}` was never estimated"))
        })?;
        tensors.push(name.clone(), t.shape, t.data)?;
    }
    Ok(MatchedLayer {
        tensors,
        width: matched.width,
        assignments: matched.assignments,
    })
}

/// One group matched by [`pfnm_match_layer`].
#[derive(Clone, Debug)]
pub struct MatchedLayer {
    /// The tensors of the stage, fused, in the list's order.
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

/// A matched group: its fused width and each client's assignment (local unit -> fused unit).
#[derive(Clone, Debug)]
struct Fused {
    width: usize,
    assignments: Vec<Vec<usize>>,
}

/// One weight whose rows hold a group's units: a convolution's or linear layer's, a block's
/// `conv1`, `conv2` or projection.
#[derive(Clone, Debug)]
struct Writer {
    /// Its index in the group's `own`.
    own: usize,
    /// Its bias's index in `own`, when it has one (a norm follows it otherwise).
    bias: Option<usize>,
    /// The group its input columns read, with the use that says where; `None` when it reads
    /// the input (or channels no permutation moves), taken whole.
    input: Option<(usize, UnitUse)>,
}

impl Writer {
    /// Whether the units it reads are fused already (or never move).
    fn ready(&self, done: &[Option<Fused>]) -> bool {
        self.input.as_ref().is_none_or(|(h, _)| done[*h].is_some())
    }
}

/// Per permutation group: its writers, and whether the output layer reads it.
struct GroupPlan {
    writers: Vec<Writer>,
    /// Indices in `own` of the per-channel tensors (norm channels): fused as member means.
    channels: Vec<usize>,
    /// Whether the output layer reads the units (its outgoing weights join the vectors).
    top: bool,
}

/// Who writes and who reads each group of a list, from its unit map.
struct Plan {
    groups: Vec<GroupPlan>,
    out_weight: String,
}

impl Plan {
    fn of(list: &ListClients, out_weight: &str) -> Result<Self> {
        Self::of_groups(&list.uses[0], out_weight, |name| {
            Ok(list.tensor(0, name)?.shape.len())
        })
    }

    /// The plan of groups `uses`, `dims` giving a tensor's rank.
    fn of_groups(
        uses: &[UnitUses],
        out_weight: &str,
        dims: impl Fn(&str) -> Result<usize>,
    ) -> Result<Self> {
        let mut reads: HashMap<&str, (usize, &UnitUse)> = HashMap::new();
        for (h, u) in uses.iter().enumerate() {
            for r in &u.readers {
                reads.insert(r.tensor.as_str(), (h, r));
            }
        }
        let mut groups = Vec::with_capacity(uses.len());
        for u in uses {
            let mut writers = Vec::new();
            let mut channels = Vec::new();
            for (o, own) in u.own.iter().enumerate() {
                // Norm channels are vectors; a layer norm's scale has the sample's shape, but
                // `matchable` refuses layer norms after a matched layer.
                if own.axis == 0 && dims(&own.tensor)? >= 2 {
                    writers.push(Writer {
                        own: o,
                        bias: None,
                        input: reads.get(own.tensor.as_str()).map(|&(h, r)| (h, r.clone())),
                    });
                } else {
                    channels.push(o);
                }
            }
            // A writer's bias is the own tensor of its name with `bias` for `weight`.
            for w in &mut writers {
                let bias = u.own[w.own]
                    .tensor
                    .strip_suffix("weight")
                    .map(|stem| format!("{stem}bias"));
                if let Some(b) = channels
                    .iter()
                    .position(|&o| Some(&u.own[o].tensor) == bias.as_ref())
                {
                    w.bias = Some(channels.remove(b));
                }
            }
            if writers.is_empty() {
                return Err(FuseError::InvalidInput(format!(
                    "no weight writes the units of model.layers[{}]",
                    u.layer
                )));
            }
            groups.push(GroupPlan {
                writers,
                channels,
                top: u.readers.iter().any(|r| r.tensor == out_weight),
            });
        }
        Ok(Self {
            groups,
            out_weight: out_weight.to_string(),
        })
    }

    /// The stage of a layer-wise matching at which writer `w` of group `g` is fused: its own
    /// group's, or the later one its inputs belong to (a residual block's last convolution
    /// writes a stream matched before the block's inner channels it reads).
    fn stage_of(g: usize, w: &Writer) -> usize {
        w.input.as_ref().map_or(g, |(h, _)| g.max(*h))
    }

    /// The own tensors of every group fused at stage `s` (see [`layerwise_stages`]), by name.
    fn stage_tensors<'u>(&self, uses: &'u [UnitUses], s: usize) -> Vec<&'u str> {
        let mut names = Vec::new();
        for (g, plan) in self.groups.iter().enumerate() {
            let own = |o: usize| uses[g].own[o].tensor.as_str();
            for w in plan.writers.iter().filter(|w| Self::stage_of(g, w) == s) {
                names.push(own(w.own));
                names.extend(w.bias.map(own));
            }
            if g == s {
                names.extend(plan.channels.iter().map(|&o| own(o)));
            }
        }
        names
    }
}

/// The tensors a layer-wise matching (FedMA) fixes at each of its stages, one stage per
/// permutation group of the list, input side first: stage `s` fuses group `s`'s writers whose
/// inputs are fused by then (with their biases) and the per-channel tensors of its norms, and
/// every earlier group's writer that reads group `s` (a residual block's last convolution,
/// which writes a stream matched below the block). Each stage's names are in the list's order;
/// the output layer is in none. Refused as [`pfnm_fuse_layers`] refuses a list.
///
/// ```
/// use fedfuse_core::LayerSpec;
/// use fedfuse_fuse::layerwise_stages;
///
/// let layers = [LayerSpec::linear(3), LayerSpec::Relu, LayerSpec::linear(2)];
/// let stages = layerwise_stages(&[4], &layers)?;
/// assert_eq!(stages, vec![vec!["0.weight".to_string(), "0.bias".to_string()]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layerwise_stages(input: &[usize], layers: &[LayerSpec]) -> Result<Vec<Vec<String>>> {
    refuse_layerwise_transformers(layers)?;
    let (uses, output) = matchable(input, layers)?;
    let (_, layout) = layers::chain(FeatureShape::of(input)?, layers)?;
    let order: HashMap<&str, (usize, usize)> = layout
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), (i, s.shape.len())))
        .collect();
    let dims = |name: &str| {
        order.get(name).map(|&(_, d)| d).ok_or_else(|| {
            FuseError::InvalidInput(format!("tensor `{name}` is not in the layer list"))
        })
    };
    let plan = Plan::of_groups(&uses, &format!("{output}.weight"), dims)?;
    Ok((0..uses.len())
        .map(|s| {
            let mut names = plan.stage_tensors(&uses, s);
            names.sort_by_key(|n| order.get(n).map(|&(i, _)| i));
            names.into_iter().map(str::to_string).collect()
        })
        .collect())
}

/// What matching one group of a list needs besides the group.
struct MatchStep<'a> {
    list: &'a ListClients<'a>,
    plan: Plan,
    /// Per client, its share of each class (weights the outgoing side of the top group).
    shares: Vec<Vec<f64>>,
    /// Per client, its weight in averages.
    weights: Vec<f64>,
    cfg: &'a PfnmConfig,
}

impl<'a> MatchStep<'a> {
    fn new(
        list: &'a ListClients<'a>,
        class_counts: Option<&[Vec<f64>]>,
        cfg: &'a PfnmConfig,
    ) -> Result<Self> {
        let (out_weight, shares, weights) = output_shares(list, class_counts)?;
        Ok(Self {
            plan: Plan::of(list, &out_weight)?,
            list,
            shares,
            weights,
            cfg,
        })
    }

    /// Matches group `g` on its writers whose inputs are fused in `done` (those that read
    /// groups above it wait for [`Self::write_deferred`]), with the output weight when the
    /// output layer reads it; writes those writers' tensors, the output weight and the norm
    /// channels into `fused`.
    fn run(
        &self,
        g: usize,
        done: &[Option<Fused>],
        orders: &mut dyn OrderSource,
        fused: &mut HashMap<String, Tensor>,
    ) -> Result<(Fused, MatchTimings)> {
        let (list, cfg) = (self.list, self.cfg);
        let started = Instant::now();
        let (inv_s, inv_s0) = (1.0 / cfg.prior.sigma, 1.0 / cfg.prior.sigma0);
        let settings = LayerSettings {
            gamma: cfg.prior.gamma,
            iters: cfg.prior.iters,
            max_global: cfg.prior.max_global,
            eps: cfg.eps,
        };
        let plan = &self.plan.groups[g];
        let ready: Vec<&Writer> = plan.writers.iter().filter(|w| w.ready(done)).collect();
        if ready.is_empty() {
            return Err(FuseError::InvalidInput(format!(
                "every weight that writes the units of model.layers[{}] reads units not \
                 matched yet",
                list.uses[0][g].layer
            )));
        }
        let top = plan.top.then_some(self.plan.out_weight.as_str());
        let vectors = GroupVectors::new(list, g, &ready, done, top)?;
        let p = vectors.len();
        let precisions: Vec<Vec<f64>> = self
            .shares
            .iter()
            .map(|r| {
                let mut s = vec![inv_s; p];
                if top.is_some() {
                    let out = &mut s[vectors.out_at..];
                    for (block, share) in out.chunks_mut(vectors.span_out.max(1)).zip(r) {
                        block.fill(share * inv_s);
                    }
                }
                s
            })
            .collect();
        let prior = LayerPrior {
            mean: vectors.prior_mean(cfg.bias_mean),
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
                ClientRows::new(vectors.units[j], s, &prior, &runs, cfg.eps, |u, x| {
                    vectors.fill(j, u, x);
                    for (xv, sv) in x.iter_mut().zip(s) {
                        *xv *= sv;
                    }
                })
            })
            .collect();
        let m = match_rows(&rows, &prior, &runs, &settings, orders, started, true)?;
        let post = m.posterior_mean();
        vectors.write(&post, fused)?;
        for &o in &plan.channels {
            let own = &list.uses[0][g].own[o];
            let t = list.tensor(0, &own.tensor)?;
            let shape = UnitAxis::resized(own, &t.shape, post.rows());
            let data = member_means(list, g, o, &m.assignments, &self.weights, post.rows())?;
            fused.insert(own.tensor.clone(), Tensor::new(&own.tensor, shape, data)?);
        }
        Ok((
            Fused {
                width: m.width(),
                assignments: m.assignments,
            },
            m.timings,
        ))
    }

    /// The writers left for later that `pick` (group, writer) chooses (a residual block's last
    /// convolution, which writes a stream matched before the block's inner channels), once
    /// their group and inputs are fused in `done`: each fused unit's row is the posterior mean
    /// of its members' rows under the prior, as a matched writer's is, with the assignment
    /// its group's matching chose.
    fn write_deferred(
        &self,
        done: &[Option<Fused>],
        pick: impl Fn(usize, &Writer) -> bool,
        fused: &mut HashMap<String, Tensor>,
    ) -> Result<()> {
        let (list, cfg) = (self.list, self.cfg);
        let (inv_s, inv_s0) = (1.0 / cfg.prior.sigma, 1.0 / cfg.prior.sigma0);
        for (g, plan) in self.plan.groups.iter().enumerate() {
            let Some(group) = &done[g] else {
                continue;
            };
            let waiting: Vec<&Writer> = plan
                .writers
                .iter()
                .filter(|w| {
                    !fused.contains_key(&list.uses[0][g].own[w.own].tensor)
                        && w.ready(done)
                        && pick(g, w)
                })
                .collect();
            if waiting.is_empty() {
                continue;
            }
            let vectors = GroupVectors::new(list, g, &waiting, done, None)?;
            let (p, width) = (vectors.len(), group.width);
            let mean = vectors.prior_mean(cfg.bias_mean);
            let mut eta: Vec<f64> = (0..width)
                .flat_map(|_| mean.iter().map(|m| m * inv_s0))
                .collect();
            let mut lambda = vec![inv_s0; width];
            let mut x = vec![0.0; p];
            for (j, asg) in group.assignments.iter().enumerate() {
                for (u, &i) in asg.iter().enumerate() {
                    vectors.fill(j, u, &mut x);
                    for (e, v) in eta[i * p..(i + 1) * p].iter_mut().zip(&x) {
                        *e += inv_s * v;
                    }
                    lambda[i] += inv_s;
                }
            }
            for (i, row) in eta.chunks_mut(p.max(1)).enumerate() {
                row.iter_mut().for_each(|e| *e /= lambda[i]);
            }
            vectors.write(&Matrix::new(width, p, eta)?, fused)?;
        }
        Ok(())
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

/// One writer's part of a group's unit vectors: its row over the fused units below, then its
/// bias.
struct Segment {
    /// Index in the group's `own` of its weight, and of its bias.
    weight_own: usize,
    bias_own: Option<usize>,
    /// Where its coordinates start.
    at: usize,
    /// Fused units below (1 for the input, read whole).
    below_width: usize,
    /// Client -> unit below -> fused unit below.
    below: Vec<Vec<usize>>,
    /// Values per unit below in one row.
    span_in: usize,
    /// The use of the group below that says where its columns are (`None`: the input).
    reader: Option<UnitUse>,
    /// Per client: its weight's unit view (axis 0) and its input side.
    weight: Vec<UnitAxis>,
    input: Vec<UnitAxis>,
}

impl Segment {
    /// `below_width * span_in`.
    fn incoming(&self) -> usize {
        self.below_width * self.span_in
    }

    /// Its coordinates: the incoming row and the bias.
    fn len(&self) -> usize {
        self.incoming() + usize::from(self.bias_own.is_some())
    }
}

/// One group's unit vectors: `[writer 1's row over the fused units below, its bias, writer 2's
/// ..., outgoing into the classes]` (a plain chain's layer has one writer), read through the
/// unit map.
struct GroupVectors<'a> {
    list: &'a ListClients<'a>,
    /// Group index `g`.
    g: usize,
    /// Units per client.
    units: Vec<usize>,
    segments: Vec<Segment>,
    /// Where the outgoing coordinates start (the segments' total).
    out_at: usize,
    /// Values per unit in one class row of the output weight (0 below the top group).
    span_out: usize,
    /// Classes (output rows) when the output layer reads the group, else 0.
    classes: usize,
    /// The output weight's name and per client its view, for the top group.
    out_weight: Option<&'a str>,
    output: Vec<Option<UnitAxis>>,
}

impl<'a> GroupVectors<'a> {
    fn new(
        list: &'a ListClients<'a>,
        g: usize,
        writers: &[&Writer],
        done: &[Option<Fused>],
        out_weight: Option<&'a str>,
    ) -> Result<Self> {
        let own_of = |j: usize, o: usize| &list.uses[j][g].own[o];
        let mut segments = Vec::with_capacity(writers.len());
        let mut at = 0;
        for w in writers {
            let name = &own_of(0, w.own).tensor;
            let (mut weight, mut input) = (Vec::new(), Vec::new());
            for j in 0..list.len() {
                let t = list.tensor(j, name)?;
                weight.push(UnitAxis::of(own_of(j, w.own), &t.shape)?);
                input.push(match &w.input {
                    None => UnitAxis {
                        rows: t.shape.first().copied().unwrap_or(0),
                        units: 1,
                        span: t.data.len() / t.shape.first().copied().unwrap_or(1).max(1),
                    },
                    Some((h, _)) => UnitAxis::of(reader_of(&list.uses[j][*h], name)?, &t.shape)?,
                });
            }
            let span_in = input[0].span;
            if let Some(j) = input.iter().position(|a| a.span != span_in) {
                return Err(FuseError::InvalidInput(format!(
                    "client {j}: `{name}` has {} values per input unit where client 0's has \
                     {span_in}",
                    input[j].span
                )));
            }
            let (below_width, below) = match &w.input {
                Some((h, _)) => {
                    let f = done[*h].as_ref().ok_or_else(|| {
                        FuseError::InvalidInput(format!("`{name}` reads units not fused yet"))
                    })?;
                    (f.width, f.assignments.clone())
                }
                None => (1, vec![vec![0]; list.len()]),
            };
            let seg = Segment {
                weight_own: w.own,
                bias_own: w.bias,
                at,
                below_width,
                below,
                span_in,
                reader: w.input.as_ref().map(|(_, r)| r.clone()),
                weight,
                input,
            };
            at += seg.len();
            segments.push(seg);
        }
        let mut output = Vec::with_capacity(list.len());
        for j in 0..list.len() {
            output.push(match out_weight {
                Some(name) => {
                    let reader = reader_of(&list.uses[j][g], name)?;
                    Some(UnitAxis::of(reader, &list.tensor(j, name)?.shape)?)
                }
                None => None,
            });
        }
        let (span_out, classes) = output[0].map_or((0, 0), |a| (a.span, a.rows));
        Ok(Self {
            list,
            g,
            units: (0..list.len()).map(|j| list.uses[j][g].units).collect(),
            segments,
            out_at: at,
            span_out,
            classes,
            out_weight,
            output,
        })
    }

    /// Coordinates per unit.
    fn len(&self) -> usize {
        self.out_at + self.classes * self.span_out
    }

    /// The prior's mean: `bias_mean` at every bias, zero elsewhere.
    fn prior_mean(&self, bias_mean: f64) -> Vec<f64> {
        let mut mean = vec![0.0; self.len()];
        for seg in self.segments.iter().filter(|s| s.bias_own.is_some()) {
            mean[seg.at + seg.incoming()] = bias_mean;
        }
        mean
    }

    /// Writes unit `u` of client `j` (not yet times its precisions) into `x`.
    fn fill(&self, j: usize, u: usize, x: &mut [f64]) {
        x.fill(0.0);
        let uses = &self.list.uses[j][self.g];
        let params = &self.list.params[j];
        for seg in &self.segments {
            // Present: `GroupVectors::new` read these tensors for every client.
            let Some(w) = params.get(&uses.own[seg.weight_own].tensor) else {
                continue;
            };
            let inp = &seg.input[j];
            let row = &w.data[seg.weight[j].at(0, u)..][..seg.weight[j].span];
            let x = &mut x[seg.at..];
            for (v, &gv) in seg.below[j].iter().enumerate() {
                let src = &row[v * inp.span..(v + 1) * inp.span];
                for (xv, wv) in x[gv * seg.span_in..].iter_mut().zip(src) {
                    *xv = f64::from(*wv);
                }
            }
            if let Some(b) = seg.bias_own.and_then(|o| params.get(&uses.own[o].tensor)) {
                x[seg.incoming()] = f64::from(b.data[u]);
            }
        }
        if let (Some(out), Some(name)) = (self.output[j], self.out_weight)
            && let Some(t) = params.get(name)
        {
            let dst = &mut x[self.out_at..];
            for (kk, block) in dst.chunks_mut(self.span_out).enumerate().take(out.rows) {
                let src = &t.data[out.at(kk, u)..][..out.span];
                for (xv, wv) in block.iter_mut().zip(src) {
                    *xv = f64::from(*wv);
                }
            }
        }
    }

    /// Writes the fused writers' weights and biases and, for the top group, the output weight,
    /// from `post` (one row per fused unit).
    fn write(&self, post: &Matrix, fused: &mut HashMap<String, Tensor>) -> Result<()> {
        let list = self.list;
        let width = post.rows();
        let uses = &list.uses[0][self.g];
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        for seg in &self.segments {
            let own = &uses.own[seg.weight_own];
            let t = list.tensor(0, &own.tensor)?;
            let mut shape = UnitAxis::resized(own, &t.shape, width);
            if let Some(reader) = &seg.reader {
                shape = UnitAxis::resized(reader, &shape, seg.below_width);
            }
            let data = (0..width)
                .flat_map(|i| f32s(&post.row(i)[seg.at..seg.at + seg.incoming()]))
                .collect();
            fused.insert(own.tensor.clone(), Tensor::new(&own.tensor, shape, data)?);
            if let Some(o) = seg.bias_own {
                let bias = &uses.own[o];
                let t = list.tensor(0, &bias.tensor)?;
                let shape = UnitAxis::resized(bias, &t.shape, width);
                let at = seg.at + seg.incoming();
                let data = f32s(&(0..width).map(|i| post.get(i, at)).collect::<Vec<_>>());
                fused.insert(bias.tensor.clone(), Tensor::new(&bias.tensor, shape, data)?);
            }
        }
        if let (Some(out), Some(name)) = (self.output[0], self.out_weight) {
            let reader = reader_of(uses, name)?;
            let t = list.tensor(0, name)?;
            let shape = UnitAxis::resized(reader, &t.shape, width);
            let mut data = Vec::with_capacity(out.rows * width * out.span);
            for kk in 0..out.rows {
                for i in 0..width {
                    let from = self.out_at + kk * out.span;
                    data.extend(f32s(&post.row(i)[from..from + out.span]));
                }
            }
            fused.insert(name.to_string(), Tensor::new(name, shape, data)?);
        }
        Ok(())
    }
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
