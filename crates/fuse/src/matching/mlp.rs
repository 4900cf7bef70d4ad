//! PFNM for MLPs: layers matched from the top hidden layer down (`layer_group_descent` of the
//! reference code) or, as an option, from the input up; absent connections zero-filled with
//! full precision, output-layer precisions weighted by each client's share of every class.

use std::time::Instant;

use fedfuse_core::Params;
use rand::Rng;
use rayon::prelude::*;

use super::layer::{MatchTimings, OrderSource, RngOrder, match_rows};
use super::score::{self, ClientRows};
use super::settings::MatchPrior;
use super::types::{LayerPrior, LayerSettings, Matrix};
use crate::{FuseError, Result};

/// Settings of PFNM: the matcher's [`MatchPrior`] and what the MLP and layer-list matchers
/// add to it. `Default` takes [`MatchPrior`]'s defaults, the one home of the matcher's.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PfnmConfig {
    /// Variances, Beta-process mass, refinement passes and width cap.
    #[serde(flatten)]
    pub prior: MatchPrior,
    /// Prior mean of biases (0.1 in the reference; weights have prior mean 0).
    pub bias_mean: f64,
    /// Weight `eps` of the GPI-FNM term (Xiao & Cheng, eq. 11; finite, non-negative; default 0
    /// = plain PFNM, bit for bit). Every layer's assignment score becomes the PFNM score minus
    /// `eps` times [`gpi_cost`](crate::gpi_cost), the change in the members'
    /// precision-weighted squared distance of global units from the prior mean. Joining a unit
    /// of like members costs more than opening a new (shrunk) one, so a moderate `eps` opens
    /// more units; joining a unit of opposite sign lowers the cost, so a large `eps` merges
    /// unlike units, down to the widest client's width, pulling global units to the prior
    /// mean. Both the PFNM score and the cost grow like 1/sigma, so `eps` is a relative weight:
    /// on the planted network of the tests `eps <= 0.5` changes nothing, `eps = 1` widens the
    /// layer and `eps >= 2` collapses it.
    pub eps: f64,
    /// Order in which the hidden layers of a deep network are matched (one hidden layer: the
    /// same either way).
    pub order: MatchOrder,
}

/// Which way [`pfnm_fuse_mlp`] walks a network of two or more hidden layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchOrder {
    /// The reference code's `layer_group_descent`: the top hidden layer first, each unit as
    /// `[bias, outgoing weights]` (the first layer adds its incoming weights). The top layer's
    /// units are then seen through `1 + classes` numbers alone.
    #[default]
    TopDown,
    /// The input layer first, each unit as `[incoming weights, bias]` over the global units
    /// below it (the top layer adds its outgoing weights into the classes), so every layer is
    /// matched on its full fan-in.
    BottomUp,
}

impl std::str::FromStr for MatchOrder {
    type Err = FuseError;

    /// `"top_down"` or `"bottom_up"`, as written in a config file.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "top_down" => Ok(Self::TopDown),
            "bottom_up" => Ok(Self::BottomUp),
            other => Err(FuseError::InvalidSetting {
                field: "order",
                reason: format!("`{other}` is not `top_down` or `bottom_up`"),
            }),
        }
    }
}

impl Default for PfnmConfig {
    fn default() -> Self {
        Self {
            prior: MatchPrior::default(),
            bias_mean: 0.1,
            eps: 0.0,
            order: MatchOrder::TopDown,
        }
    }
}

impl PfnmConfig {
    /// Checks every setting, naming the first that is out of range.
    pub fn check(&self) -> Result<()> {
        self.prior.check()?;
        if !self.bias_mean.is_finite() {
            return Err(FuseError::InvalidSetting {
                field: "bias_mean",
                reason: format!("{} is not finite", self.bias_mean),
            });
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(FuseError::InvalidSetting {
                field: "eps",
                reason: format!("{} is not a finite non-negative number", self.eps),
            });
        }
        Ok(())
    }
}

/// One fully connected layer in PyTorch layout.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseLayer {
    /// `[out, in]`.
    pub weight: Matrix,
    /// `[out]`.
    pub bias: Vec<f64>,
}

/// An MLP `input -> hidden... -> classes` as f64 matrices (`layers.{i}` of [`Params`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MlpWeights {
    /// Layers from input to output.
    pub layers: Vec<DenseLayer>,
}

impl MlpWeights {
    /// Reads `layers.0.weight`, `layers.0.bias`, ... (exactly these tensors, chained shapes).
    /// `client` names the model in errors.
    pub fn from_params(params: &Params, client: usize) -> Result<Self> {
        let bad = |reason: String| FuseError::InvalidInput(format!("client {client}: {reason}"));
        if params.is_empty() || !params.len().is_multiple_of(2) {
            return Err(bad(format!(
                "{} tensors; an MLP has `layers.{{i}}.weight` and `layers.{{i}}.bias` for each layer",
                params.len()
            )));
        }
        let mut layers = Vec::with_capacity(params.len() / 2);
        for i in 0..params.len() / 2 {
            let (wn, bn) = (format!("layers.{i}.weight"), format!("layers.{i}.bias"));
            let (w, b) = match (params.get(&wn), params.get(&bn)) {
                (Some(w), Some(b)) => (w, b),
                _ => return Err(bad(format!("tensor `{wn}` or `{bn}` is missing"))),
            };
            let &[out, inp] = w.shape.as_slice() else {
                return Err(bad(format!(
                    "tensor `{wn}` has shape {:?}, not [out, in]",
                    w.shape
                )));
            };
            if b.shape != [out] {
                return Err(bad(format!(
                    "tensor `{bn}` has shape {:?} where [{out}] was expected",
                    b.shape
                )));
            }
            if out == 0 || inp == 0 {
                return Err(bad(format!(
                    "tensor `{wn}` has an empty axis ({:?})",
                    w.shape
                )));
            }
            if let Some(prev) = layers.last().map(|l: &DenseLayer| l.weight.rows())
                && prev != inp
            {
                return Err(bad(format!(
                    "tensor `{wn}` takes {inp} inputs but the layer below has {prev} outputs"
                )));
            }
            for (name, t) in [(&wn, w), (&bn, b)] {
                if t.data.iter().any(|v| !v.is_finite()) {
                    return Err(bad(format!("tensor `{name}` has non-finite values")));
                }
            }
            layers.push(DenseLayer {
                weight: Matrix::new(out, inp, w.data.iter().map(|&v| f64::from(v)).collect())?,
                bias: b.data.iter().map(|&v| f64::from(v)).collect(),
            });
        }
        Ok(Self { layers })
    }

    /// `layers.{i}.weight` `[out, in]` and `layers.{i}.bias` `[out]` as f32.
    pub fn to_params(&self) -> Result<Params> {
        let mut p = Params::new();
        for (i, l) in self.layers.iter().enumerate() {
            let w = l.weight.data().iter().map(|&v| v as f32).collect();
            p.push(
                format!("layers.{i}.weight"),
                vec![l.weight.rows(), l.weight.cols()],
                w,
            )?;
            let b = l.bias.iter().map(|&v| v as f32).collect();
            p.push(format!("layers.{i}.bias"), vec![l.bias.len()], b)?;
        }
        Ok(p)
    }

    /// Hidden widths.
    pub fn hidden(&self) -> Vec<usize> {
        let n = self.layers.len().saturating_sub(1);
        self.layers[..n].iter().map(|l| l.weight.rows()).collect()
    }
}

/// A fused MLP and how every client unit was matched.
#[derive(Clone, Debug)]
pub struct FusedMlp {
    /// The global network (hidden widths are what the matching found).
    pub net: MlpWeights,
    /// Hidden layer (input side first) -> client -> local unit -> global unit.
    pub assignments: Vec<Vec<Vec<usize>>>,
    /// Time spent matching each hidden layer (input side first).
    pub timings: Vec<MatchTimings>,
}

/// A fused model as [`Params`] and how every client unit was matched.
#[derive(Clone, Debug)]
pub struct Fused {
    /// The global model, `layers.{i}.weight` / `layers.{i}.bias`, with the new widths.
    pub params: Params,
    /// Hidden layer (input side first) -> client -> local unit -> global unit.
    pub assignments: Vec<Vec<Vec<usize>>>,
    /// Time spent matching each hidden layer (input side first).
    pub timings: Vec<MatchTimings>,
}

/// PFNM of MLP clients given as [`Params`] (`layers.{i}.weight` `[out, in]`, `layers.{i}.bias`);
/// refinement orders are drawn from `rng`.
///
/// `class_counts[j][k]` is client `j`'s number of training examples of class `k` (it weights
/// the output layer); `None` weighs all clients equally.
///
/// ```
/// use fedfuse_core::Params;
/// use fedfuse_fuse::{MatchPrior, PfnmConfig, pfnm_fuse};
/// use rand::{SeedableRng, rngs::StdRng};
///
/// let mut net = Params::new();
/// net.push("layers.0.weight", vec![2, 3], vec![1.0, 0.0, -1.0, 0.5, 0.5, 0.5])?;
/// net.push("layers.0.bias", vec![2], vec![0.1, 0.1])?;
/// net.push("layers.1.weight", vec![1, 2], vec![1.0, -1.0])?;
/// net.push("layers.1.bias", vec![1], vec![0.0])?;
/// let prior = MatchPrior { sigma: 0.01, ..MatchPrior::default() };
/// let cfg = PfnmConfig { prior, ..PfnmConfig::default() };
/// let fused = pfnm_fuse(&[&net, &net], None, &cfg, &mut StdRng::seed_from_u64(0))?;
/// // Two copies of one network match unit for unit.
/// assert_eq!(fused.assignments, vec![vec![vec![0, 1], vec![0, 1]]]);
/// assert_eq!(fused.params.get("layers.0.bias").map(|t| t.shape.clone()), Some(vec![2]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pfnm_fuse<R: Rng + ?Sized>(
    clients: &[&Params],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    rng: &mut R,
) -> Result<Fused> {
    let nets = clients
        .iter()
        .enumerate()
        .map(|(j, p)| MlpWeights::from_params(p, j))
        .collect::<Result<Vec<_>>>()?;
    let fused = pfnm_fuse_mlp(&nets, class_counts, cfg, &mut RngOrder(rng))?;
    Ok(Fused {
        params: fused.net.to_params()?,
        assignments: fused.assignments,
        timings: fused.timings,
    })
}

/// PFNM of MLPs on f64 matrices, with refinement orders from `orders` (one per layer and pass,
/// in the order the layers are matched: top hidden layer first unless `cfg.order` is
/// [`MatchOrder::BottomUp`]).
pub fn pfnm_fuse_mlp(
    nets: &[MlpWeights],
    class_counts: Option<&[Vec<f64>]>,
    cfg: &PfnmConfig,
    orders: &mut dyn OrderSource,
) -> Result<FusedMlp> {
    cfg.check()?;
    let Some(first) = nets.first() else {
        return Err(FuseError::Empty);
    };
    let n_layers = first.layers.len();
    let c_hidden = n_layers.saturating_sub(1);
    if c_hidden == 0 {
        return Err(FuseError::InvalidInput(
            "client 0: PFNM needs at least one hidden layer".into(),
        ));
    }
    let d = first.layers[0].weight.cols();
    let k = first.layers[n_layers - 1].weight.rows();
    for (j, n) in nets.iter().enumerate() {
        let (nd, nk) = (
            n.layers.first().map_or(0, |l| l.weight.cols()),
            n.layers.last().map_or(0, |l| l.weight.rows()),
        );
        if n.layers.len() != n_layers || nd != d || nk != k {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: {} layers, {nd} inputs, {nk} outputs where client 0 has {n_layers}, {d}, {k}",
                n.layers.len()
            )));
        }
    }
    for (j, n) in nets.iter().enumerate() {
        for (i, l) in n.layers.iter().enumerate() {
            let inputs = i
                .checked_sub(1)
                .map_or(d, |below| n.layers[below].weight.rows());
            if l.weight.cols() != inputs || l.bias.len() != l.weight.rows() || l.bias.is_empty() {
                return Err(FuseError::InvalidInput(format!(
                    "client {j}: layer {i} is {} x {} with {} biases; it needs {inputs} inputs \
                     and one bias per output",
                    l.weight.rows(),
                    l.weight.cols(),
                    l.bias.len()
                )));
            }
            if l.weight
                .data()
                .iter()
                .chain(&l.bias)
                .any(|v| !v.is_finite())
            {
                return Err(FuseError::InvalidInput(format!(
                    "client {j}: layer {i} has non-finite values"
                )));
            }
        }
    }
    let shares = class_shares(class_counts, nets.len(), k)?;

    let inv_s = 1.0 / cfg.prior.sigma;
    let inv_s0 = 1.0 / cfg.prior.sigma0;
    let settings = LayerSettings {
        gamma: cfg.prior.gamma,
        iters: cfg.prior.iters,
        max_global: cfg.prior.max_global,
        eps: cfg.eps,
    };

    // `c` is the 0-based hidden layer: its units are rows of layers[c] and columns of
    // layers[c + 1]. A unit's vector is `[incoming, bias, outgoing]`, where a side is present
    // only once the units it connects to have global indices (the input and the classes always
    // do): top-down, a unit carries its outgoing weights scattered to the layer above's global
    // units; bottom-up, its incoming weights scattered to the layer below's.
    let layer_order: Vec<usize> = match cfg.order {
        MatchOrder::TopDown => (0..c_hidden).rev().collect(),
        MatchOrder::BottomUp => (0..c_hidden).collect(),
    };
    let mut weights: Vec<Option<Matrix>> = vec![None; n_layers];
    let mut biases: Vec<Vec<f64>> = vec![Vec::new(); n_layers];
    let out_biases: Vec<&[f64]> = nets
        .iter()
        .map(|n| n.layers.last().map_or(&[][..], |l| l.bias.as_slice()))
        .collect();
    biases[n_layers - 1] = output_bias(&out_biases, &shares, cfg);
    let mut assignments_all: Vec<Vec<Vec<usize>>> = vec![Vec::new(); c_hidden];
    let mut timings: Vec<Option<MatchTimings>> = vec![None; c_hidden];
    // Width and assignment of the neighbouring layer matched just before this one.
    let mut matched: Option<(usize, Vec<Vec<usize>>)> = None;
    for c in layer_order {
        let top = c + 1 == c_hidden;
        let neighbour = matched.as_ref().map(|(l, asg)| (*l, asg.as_slice()));
        let (incoming, outgoing_dim) = match cfg.order {
            MatchOrder::TopDown => (if c == 0 { d } else { 0 }, neighbour.map_or(k, |n| n.0)),
            MatchOrder::BottomUp => (neighbour.map_or(d, |n| n.0), if top { k } else { 0 }),
        };
        let p = incoming + 1 + outgoing_dim;

        let started = Instant::now();
        let precisions: Vec<Vec<f64>> = shares
            .iter()
            .map(|r| {
                let mut precision = vec![inv_s; p];
                if top {
                    for (s, share) in precision[incoming + 1..].iter_mut().zip(r) {
                        *s = share * inv_s;
                    }
                }
                precision
            })
            .collect();
        let mut mean = vec![0.0; p];
        mean[incoming] = cfg.bias_mean;
        let prior = LayerPrior {
            mean,
            precision: vec![inv_s0; p],
        };
        let runs = {
            let slices: Vec<&[f64]> = precisions.iter().map(Vec::as_slice).collect();
            score::precision_runs(&prior, &slices)
        };
        // Each client's unit vectors, absent connections 0 (observed zeros, as in the
        // reference), times the precisions.
        let rows: Vec<ClientRows> = nets
            .par_iter()
            .zip(&precisions)
            .enumerate()
            .map(|(j, (net, precision))| {
                let (own, next) = (&net.layers[c], &net.layers[c + 1]);
                ClientRows::new(
                    own.weight.rows(),
                    precision,
                    &prior,
                    &runs,
                    cfg.eps,
                    |u, x| {
                        x.fill(0.0);
                        match (c, cfg.order, neighbour) {
                            (0, _, _) if incoming > 0 => {
                                x[..d].copy_from_slice(own.weight.row(u));
                            }
                            (_, MatchOrder::BottomUp, Some((_, below))) => {
                                for (v, &g) in below[j].iter().enumerate() {
                                    x[g] = own.weight.get(u, v);
                                }
                            }
                            _ => {}
                        }
                        x[incoming] = own.bias[u];
                        let outgoing = &mut x[incoming + 1..];
                        match (top, cfg.order, neighbour) {
                            (_, MatchOrder::TopDown, Some((_, above))) => {
                                for (v, &g) in above[j].iter().enumerate() {
                                    outgoing[g] = next.weight.get(v, u);
                                }
                            }
                            (true, _, _) => {
                                for (o, kk) in outgoing.iter_mut().zip(0..k) {
                                    *o = next.weight.get(kk, u);
                                }
                            }
                            _ => {}
                        }
                        for (xv, s) in x.iter_mut().zip(precision) {
                            *xv *= s;
                        }
                    },
                )
            })
            .collect();
        let m = match_rows(&rows, &prior, &runs, &settings, orders, started, true)?;
        let post = m.posterior_mean();
        let l_c = m.width();

        // Every weight matrix is estimated once: by the match that carries it.
        if incoming > 0 {
            weights[c] = Some(post.columns(0, incoming));
        }
        if outgoing_dim > 0 {
            weights[c + 1] = Some(post.columns(incoming + 1, p).transpose());
        }
        biases[c] = (0..l_c).map(|i| post.get(i, incoming)).collect();
        matched = Some((l_c, m.assignments.clone()));
        assignments_all[c] = m.assignments;
        timings[c] = Some(m.timings);
    }
    let layers = weights
        .into_iter()
        .zip(biases)
        .enumerate()
        .map(|(i, (weight, bias))| {
            weight
                .map(|weight| DenseLayer { weight, bias })
                .ok_or_else(|| FuseError::InvalidInput(format!("layer {i} was never estimated")))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FusedMlp {
        net: MlpWeights { layers },
        assignments: assignments_all,
        timings: timings.into_iter().flatten().collect(),
    })
}

/// `n_jk / N_k`, or `1/J` without counts.
pub(super) fn class_shares(
    counts: Option<&[Vec<f64>]>,
    clients: usize,
    k: usize,
) -> Result<Vec<Vec<f64>>> {
    let Some(counts) = counts else {
        return Ok(vec![vec![1.0 / clients as f64; k]; clients]);
    };
    if counts.len() != clients {
        return Err(FuseError::InvalidInput(format!(
            "class counts for {} clients but {clients} models were given",
            counts.len()
        )));
    }
    for (j, c) in counts.iter().enumerate() {
        if c.len() != k || c.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(FuseError::InvalidInput(format!(
                "client {j}: class counts must be {k} finite non-negative numbers, got {c:?}"
            )));
        }
    }
    let totals: Vec<f64> = (0..k)
        .map(|kk| counts.iter().map(|c| c[kk]).sum())
        .collect();
    if let Some(kk) = totals.iter().position(|t| *t <= 0.0) {
        return Err(FuseError::InvalidInput(format!(
            "class {kk} has no examples at any client; its output weights cannot be estimated"
        )));
    }
    Ok(counts
        .iter()
        .map(|c| c.iter().zip(&totals).map(|(n, t)| n / t).collect())
        .collect())
}

/// Output bias: precision-weighted average with prior `bias_mean` (`process_softmax_bias`);
/// `biases[j]` is client `j`'s output bias, `shares[j]` its class shares.
pub(super) fn output_bias(biases: &[&[f64]], shares: &[Vec<f64>], cfg: &PfnmConfig) -> Vec<f64> {
    let k = shares.first().map_or(0, Vec::len);
    (0..k)
        .map(|kk| {
            let mut num = cfg.bias_mean / cfg.prior.sigma0;
            let mut den = 1.0 / cfg.prior.sigma0;
            for (bias, r) in biases.iter().zip(shares) {
                if let Some(b) = bias.get(kk) {
                    num += r[kk] * b / cfg.prior.sigma;
                    den += r[kk] / cfg.prior.sigma;
                }
            }
            num / den
        })
        .collect()
}
