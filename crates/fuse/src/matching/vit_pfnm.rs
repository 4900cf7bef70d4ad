//! PFNM and GPI-FNM of Vision Transformers, over the permutation groups of
//! [`VitGroups`] (the residual stream, each block's query-key and value features, each
//! block's MLP units).
//!
//! torchvision's `MultiheadAttention` ties the query, key and value widths to the stream's
//! width (`embed_dim`), and the head count and the scale `1/sqrt(head_dim)` to both, so a fused
//! ViT that loads back into torchvision keeps its stream and its heads. Those groups are
//! matched at their width: every fused unit takes exactly one unit of every client, chosen by
//! PFNM's (or GPI-FNM's) score against the posterior of the other clients' units, by one
//! assignment for the stream and by whole heads (each head's features permuted within it)
//! for the attention. Each block's MLP units, whose count torchvision takes per model as
//! `mlp_dim`, are matched as PFNM matches a hidden layer, growing by the Beta-Bernoulli
//! process (`gamma`, `max_global`): the fused list then has one `mlp` per block.
//!
//! Order, input side first (FedMA's): the stream on the tensors that read the image
//! (`conv_proj`'s filters and bias, the class token, the positional embedding), then per
//! block its heads (rows of `in_proj` over the fused stream: a query-key unit is its query
//! and key rows and biases, a value unit its value row and bias) and its MLP units (rows of
//! `mlp.0` over the fused stream, with their biases).
//!
//! Fused values: every tensor of a fixed-width group is the posterior mean of the clients'
//! aligned values under the prior (mean 0, `bias_mean` for biases; all clients observe every
//! unit), as are the writers of the stream that read heads or MLP units (`out_proj`, `mlp.3`,
//! fused once those are: an MLP unit a client lacks is an observed zero in its row, as PFNM
//! treats an absent connection). A block's `mlp.0` rows and biases are the MLP matching's
//! posterior means over its members. Layer norms' scales and shifts are not matched on: each
//! fused feature takes the example-weighted mean of its members' values. The head's rows are
//! weighted by each client's share of their class, its bias as PFNM's output bias.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use fedfuse_core::layers::{self, LayerSpec};
use fedfuse_core::{ModelSpec, Params, Tensor};
use std::collections::HashMap;

use super::layer::{ClientUnits, MatchTimings, OrderSource, match_layer};
use super::lists::{FusedLayers, assemble, client_weights, mean_tensor};
use super::mlp::{PfnmConfig, class_shares, output_bias};
use super::score::pfnm_scores;
use super::transformer::{Hold, VitGroups, assign, heads_assignment, missing};
use super::types::{GlobalUnits, LayerPrior, LayerSettings, Matrix, check_score_size};
use crate::{FuseError, Result};

/// PFNM (GPI-FNM when `cfg.eps > 0`) of ViT clients of the list `layers` on samples of shape
/// `input`: the clients may differ in their MLP widths (each one's are read from its
/// tensors), not in the stream's width or the heads. Refinement orders come from `orders`,
/// one per matched step and pass (the stream, then per block its attention and its MLP);
/// returns the fusion and each step's time.
pub(super) fn pfnm_fuse_vit(
    input: &[usize],
    layers: &[LayerSpec],
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    orders: &mut dyn OrderSource,
) -> Result<(FusedLayers, Vec<MatchTimings>)> {
    cfg.check()?;
    if clients.is_empty() {
        return Err(FuseError::Empty);
    }
    let vits: Vec<VitGroups> = clients
        .iter()
        .enumerate()
        .map(|(j, p)| client_groups(input, layers, j, p))
        .collect::<Result<_>>()?;
    let prior = Prior {
        s: 1.0 / cfg.prior.sigma,
        tau0: 1.0 / cfg.prior.sigma0,
        bias_mean: cfg.bias_mean,
    };
    let settings = LayerSettings {
        gamma: cfg.prior.gamma,
        iters: cfg.prior.iters,
        max_global: cfg.prior.max_global,
        eps: cfg.eps,
    };
    let vit = &vits[0];
    let mut timings = Vec::new();

    // The stream, on the tensors that read the image.
    let hidden = vit.groups[0].units;
    let inputs = &vit.groups[0].holds[..vit.stream_inputs];
    let stream = Part::new(inputs, clients, hidden, &prior)?;
    let (mut fixed, t) = match_fixed(&[stream], &prior, &settings, orders, |scores| {
        Ok(vec![assign(&scores[0], hidden)?.0])
    })?;
    timings.push(t);
    let stream = fixed.remove(0);

    // Everything after reads the stream in its fused order.
    let identity = |units: usize| (0..units).collect::<Vec<usize>>();
    let streamed: Vec<Params> = vits
        .iter()
        .zip(clients)
        .zip(&stream)
        .map(|((v, p), perm)| {
            let mut perms: Vec<Vec<usize>> = v.groups.iter().map(|g| identity(g.units)).collect();
            perms[0] = perm.clone();
            v.apply(p, &perms, &[])
        })
        .collect::<Result<_>>()?;
    let streamed_refs: Vec<&Params> = streamed.iter().collect();

    let mut assignments = vec![stream];
    let mut mlp_means = BTreeMap::new();
    for b in 0..vit.blocks() {
        let (qk, vo, mlp) = (1 + 3 * b, 2 + 3 * b, 3 + 3 * b);
        let own = |g: usize| own_holds(&vit.groups[g].holds);
        let parts = [
            Part::new(&own(qk), &streamed_refs, hidden, &prior)?,
            Part::new(&own(vo), &streamed_refs, hidden, &prior)?,
        ];
        let heads = vit.heads[b];
        let (attention, t) = match_fixed(&parts, &prior, &settings, orders, |scores| {
            let (q, v) = heads_assignment(&scores[0], &scores[1], hidden, heads)?;
            Ok(vec![q, v])
        })?;
        timings.push(t);
        assignments.extend(attention);

        // The MLP's units grow as a hidden layer's do.
        let started = Instant::now();
        let unit_holds = own(mlp);
        let mut units = Vec::with_capacity(clients.len());
        let mut widths = Vec::new();
        for (p, v) in streamed.iter().zip(&vits) {
            let (x, w) = unit_vectors(&unit_holds, p, v.groups[mlp].units)?;
            units.push(ClientUnits {
                precision: vec![prior.s; x.cols()],
                units: x,
            });
            widths = w;
        }
        let mean = prior_mean(&unit_holds, &widths, &prior);
        let p = mean.len();
        let layer_prior = LayerPrior {
            mean,
            precision: vec![prior.tau0; p],
        };
        let mut m = match_layer(&units, &layer_prior, &settings, orders)?;
        m.timings.total = started.elapsed();
        timings.push(m.timings);
        mlp_means.insert(mlp, (unit_holds, widths, m.posterior_mean()));
        assignments.push(m.assignments);
    }

    // Each client at the fused widths, in the fused order.
    let aligned: Vec<Params> = vits
        .iter()
        .zip(clients)
        .enumerate()
        .map(|(j, (v, p))| {
            let perms: Vec<Vec<usize>> = assignments.iter().map(|a| a[j].clone()).collect();
            let mlps: Vec<usize> = mlp_means.keys().copied().collect();
            let mut out = v.apply(p, &perms, &mlps)?;
            for (&g, (.., post)) in &mlp_means {
                for hold in &v.groups[g].holds {
                    let t = out
                        .get_mut(&hold.tensor)
                        .ok_or_else(|| missing(&hold.tensor))?;
                    *t = hold.spread(t, &perms[g], post.rows())?;
                }
            }
            Ok(out)
        })
        .collect::<Result<_>>()?;

    let mut fused: HashMap<String, Tensor> = HashMap::new();
    for (holds, widths, post) in mlp_means.values() {
        write_rows(holds, widths, post, &mut fused)?;
    }
    let weights = client_weights(class_counts, clients.len());
    let norms = norm_tensors(layers);
    let head = vit.head;
    let (head_w, head_b) = (format!("{head}.weight"), format!("{head}.bias"));
    for (name, _) in aligned[0].iter() {
        if fused.contains_key(name) {
            continue;
        }
        let at: Vec<&Tensor> = aligned
            .iter()
            .map(|p| p.require(name))
            .collect::<std::result::Result<_, _>>()?;
        let t = if norms.contains(name) {
            mean_tensor(name, &at, &weights)?
        } else if *name == head_w || *name == head_b {
            let classes = at[0].shape.first().copied().unwrap_or(0);
            let shares = class_shares(class_counts, clients.len(), classes)?;
            head_tensor(name, &at, &shares, cfg, *name == head_b)?
        } else {
            posterior_mean(name, &at, &prior)?
        };
        fused.insert(name.to_string(), t);
    }
    let new_layers = layers::at_widths(layers, |name| {
        fused.get(name).and_then(|t| t.shape.first().copied())
    });
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

/// The matcher's precisions and prior, per coordinate alike.
struct Prior {
    /// Clients' precision `1/sigma`.
    s: f64,
    /// The prior's precision `1/sigma0`.
    tau0: f64,
    bias_mean: f64,
}

/// Client `j`'s groups: `layers` at its MLP widths, checked against its tensors.
fn client_groups(
    input: &[usize],
    layers: &[LayerSpec],
    j: usize,
    params: &Params,
) -> Result<VitGroups> {
    let own = layers::at_widths(layers, |name| {
        params.get(name).and_then(|t| t.shape.first().copied())
    });
    let in_client = |e: String| FuseError::InvalidInput(format!("client {j}: {e}"));
    let spec = ModelSpec::sequential(input, own.clone());
    params
        .check_layout(&spec.param_shapes())
        .map_err(|e| in_client(e.to_string()))?;
    params
        .check_finite()
        .map_err(|e| in_client(e.to_string()))?;
    let vit = VitGroups::of(&own)?;
    if let Some(b) = (0..vit.blocks()).find(|&b| vit.groups[3 + 3 * b].units == 0) {
        return Err(in_client(format!("block {b} has no MLP units")));
    }
    Ok(vit)
}

/// The holds of a group's own units (not those reading them as inputs).
fn own_holds(holds: &[Hold]) -> Vec<Hold> {
    holds.iter().filter(|h| h.axis != 1).cloned().collect()
}

/// `units` rows: each unit's values in every hold, one hold after another; and each hold's
/// values per unit.
fn unit_vectors(holds: &[Hold], params: &Params, units: usize) -> Result<(Matrix, Vec<usize>)> {
    let parts: Vec<Vec<f64>> = holds
        .iter()
        .map(|h| h.rows(params.require(&h.tensor)?, units))
        .collect::<Result<_>>()?;
    let widths: Vec<usize> = parts.iter().map(|p| p.len() / units.max(1)).collect();
    let p: usize = widths.iter().sum();
    let mut data = Vec::with_capacity(units * p);
    for u in 0..units {
        for (part, &k) in parts.iter().zip(&widths) {
            data.extend_from_slice(&part[u * k..(u + 1) * k]);
        }
    }
    Ok((Matrix::new(units, p, data)?, widths))
}

/// The prior mean of each coordinate of unit vectors laid out by `holds` (`widths` values
/// each): `bias_mean` for a bias, else 0.
fn prior_mean(holds: &[Hold], widths: &[usize], prior: &Prior) -> Vec<f64> {
    holds
        .iter()
        .zip(widths)
        .flat_map(|(h, &k)| {
            let m = match h.tensor.ends_with("bias") {
                true => prior.bias_mean,
                false => 0.0,
            };
            std::iter::repeat_n(m, k)
        })
        .collect()
}

/// One part of a fixed-width group: its unit vectors at every client and their prior mean.
struct Part {
    xs: Vec<Matrix>,
    mean: Vec<f64>,
}

impl Part {
    fn new(holds: &[Hold], clients: &[&Params], units: usize, prior: &Prior) -> Result<Self> {
        let mut xs = Vec::with_capacity(clients.len());
        let mut widths = Vec::new();
        for p in clients {
            let (x, w) = unit_vectors(holds, p, units)?;
            xs.push(x);
            widths = w;
        }
        let mean = prior_mean(holds, &widths, prior);
        Ok(Self { xs, mean })
    }
}

/// Fixed-width matching of one step's parts (one group, or a block's query-key and value
/// groups): client 0's units open the fused units, each later client is assigned to the
/// posterior of those before it, then `settings.iters` passes (orders from `orders`) each
/// assign every client again against all the others. `solve` turns one score matrix per
/// part (`n x n`, fused units as rows, the client's as columns) into one assignment per part
/// (client unit -> fused unit). Returns them per part and client.
fn match_fixed(
    parts: &[Part],
    prior: &Prior,
    settings: &LayerSettings,
    orders: &mut dyn OrderSource,
    solve: impl Fn(&[Vec<f64>]) -> Result<Vec<Vec<usize>>>,
) -> Result<(Vec<Vec<Vec<usize>>>, MatchTimings)> {
    let started = Instant::now();
    let clients = parts[0].xs.len();
    let n = parts[0].xs[0].rows();
    check_score_size(n, n, || format!("PFNM of a ViT group of {n} units"))?;
    let mut timings = MatchTimings::default();
    let mut sums: Vec<Vec<f64>> = parts
        .iter()
        .map(|p| vec![0.0; n * p.xs[0].cols()])
        .collect();
    let mut count = 0usize;
    let identity: Vec<usize> = (0..n).collect();
    let mut asg: Vec<Vec<Vec<usize>>> = vec![vec![identity; clients]; parts.len()];
    let add = |sums: &mut [Vec<f64>], asg: &[Vec<Vec<usize>>], j: usize, sign: f64| {
        for ((sum, part), a) in sums.iter_mut().zip(parts).zip(asg) {
            let x = &part.xs[j];
            let p = x.cols();
            for (u, &i) in a[j].iter().enumerate() {
                for (s, v) in sum[i * p..(i + 1) * p].iter_mut().zip(x.row(u)) {
                    *s += sign * v;
                }
            }
        }
    };
    let mut match_one = |sums: &[Vec<f64>], count: usize, j: usize| -> Result<Vec<Vec<usize>>> {
        let t = Instant::now();
        let scores = parts
            .iter()
            .zip(sums)
            .map(|(part, sum)| {
                let p = part.xs[0].cols();
                let global = GlobalUnits {
                    eta: Matrix::new(
                        n,
                        p,
                        sum.iter()
                            .enumerate()
                            .map(|(k, s)| prior.tau0 * part.mean[k % p] + prior.s * s)
                            .collect(),
                    )?,
                    lambda: Matrix::new(n, p, vec![prior.tau0 + prior.s * count as f64; n * p])?,
                    counts: vec![count; n],
                };
                let x = &part.xs[j];
                let weighted = Matrix::new(n, p, x.data().iter().map(|v| v * prior.s).collect())?;
                let layer_prior = LayerPrior {
                    mean: part.mean.clone(),
                    precision: vec![prior.tau0; p],
                };
                let s = pfnm_scores(
                    &global,
                    &weighted,
                    &vec![prior.s; p],
                    &layer_prior,
                    settings,
                    clients,
                    0,
                )?;
                // Fused units as rows, the client's as columns.
                Ok(s.transpose().data().to_vec())
            })
            .collect::<Result<Vec<_>>>()?;
        let solving = Instant::now();
        timings.score += solving - t;
        let out = solve(&scores)?;
        timings.solve += solving.elapsed();
        timings.solves += 1;
        Ok(out)
    };

    add(&mut sums, &asg, 0, 1.0);
    count += 1;
    for j in 1..clients {
        let new = match_one(&sums, count, j)?;
        for (a, p) in asg.iter_mut().zip(new) {
            a[j] = p;
        }
        add(&mut sums, &asg, j, 1.0);
        count += 1;
    }
    let mut settled = clients < 2;
    for _ in 0..settings.iters {
        let order = orders.next_order(clients)?;
        if settled {
            // Drawn all the same, so the order source ends where the full run would.
            continue;
        }
        let before = asg.clone();
        for j in order {
            add(&mut sums, &asg, j, -1.0);
            let new = match_one(&sums, count - 1, j)?;
            for (a, p) in asg.iter_mut().zip(new) {
                a[j] = p;
            }
            add(&mut sums, &asg, j, 1.0);
        }
        settled = asg == before;
    }
    timings.total = started.elapsed();
    Ok((asg, timings))
}

/// Writes the posterior means `post` (fused units as rows, `holds`' values one after
/// another, `widths` each) as the holds' tensors: rows of a weight, or a vector.
fn write_rows(
    holds: &[Hold],
    widths: &[usize],
    post: &Matrix,
    fused: &mut HashMap<String, Tensor>,
) -> Result<()> {
    let units = post.rows();
    let mut at = 0;
    for (h, &k) in holds.iter().zip(widths) {
        let mut data = Vec::with_capacity(units * k);
        for i in 0..units {
            data.extend(post.row(i)[at..at + k].iter().map(|&v| v as f32));
        }
        // An MLP group's own holds are `mlp.0`'s rows and its bias (whole axes 0).
        let shape = match h.tensor.ends_with("bias") {
            true => vec![units],
            false => vec![units, k],
        };
        fused.insert(h.tensor.clone(), Tensor::new(&h.tensor, shape, data)?);
        at += k;
    }
    Ok(())
}

/// The names of every layer norm's scale and shift in `layers`.
fn norm_tensors(layers: &[LayerSpec]) -> HashSet<String> {
    let mut out = HashSet::new();
    for (i, layer) in layers.iter().enumerate() {
        let names: &[&str] = match layer {
            LayerSpec::Encoder { .. } => &["ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"],
            LayerSpec::LayerNorm { .. } => &["weight", "bias"],
            _ => &[],
        };
        out.extend(names.iter().map(|n| format!("{i}.{n}")));
    }
    out
}

/// `(tau0 mu0 + s sum_j x_j) / (tau0 + J s)` per value: the posterior mean when every client
/// observes every value (`mu0` = `bias_mean` for a bias, else 0).
fn posterior_mean(name: &str, at: &[&Tensor], prior: &Prior) -> Result<Tensor> {
    let mu0 = match name.ends_with("bias") {
        true => prior.bias_mean,
        false => 0.0,
    };
    let mut sum = vec![0.0f64; at[0].data.len()];
    for t in at {
        if t.shape != at[0].shape {
            return Err(FuseError::InvalidInput(format!(
                "tensor `{name}` has shapes {:?} and {:?} once aligned",
                at[0].shape, t.shape
            )));
        }
        for (s, &v) in sum.iter_mut().zip(&t.data) {
            *s += f64::from(v);
        }
    }
    let den = prior.tau0 + prior.s * at.len() as f64;
    let data = sum
        .into_iter()
        .map(|s| ((prior.tau0 * mu0 + prior.s * s) / den) as f32)
        .collect();
    Ok(Tensor::new(name, at[0].shape.clone(), data)?)
}

/// The head's weight (`bias` false) or bias: each class's row is the posterior mean with
/// each client's precision scaled by its share of the class (prior mean 0); the bias as
/// PFNM's output bias.
fn head_tensor(
    name: &str,
    at: &[&Tensor],
    shares: &[Vec<f64>],
    cfg: &PfnmConfig,
    bias: bool,
) -> Result<Tensor> {
    let values: Vec<Vec<f64>> = at
        .iter()
        .map(|t| t.data.iter().map(|&v| f64::from(v)).collect())
        .collect();
    let data: Vec<f64> = if bias {
        let slices: Vec<&[f64]> = values.iter().map(Vec::as_slice).collect();
        output_bias(&slices, shares, cfg)
    } else {
        let classes = shares.first().map_or(0, Vec::len);
        let row = at[0].data.len() / classes.max(1);
        let (s, tau0) = (1.0 / cfg.prior.sigma, 1.0 / cfg.prior.sigma0);
        (0..classes * row)
            .map(|k| {
                let c = k / row.max(1);
                let (mut num, mut den) = (0.0, tau0);
                for (v, r) in values.iter().zip(shares) {
                    num += r[c] * s * v[k];
                    den += r[c] * s;
                }
                num / den
            })
            .collect()
    };
    Ok(Tensor::new(
        name,
        at[0].shape.clone(),
        data.into_iter().map(|v| v as f32).collect(),
    )?)
}
