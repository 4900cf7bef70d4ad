//! One-shot fusion of pre-trained MLPs given as parameter sets: what `fedfuse fuse` does with
//! files and `fedfuse.fuse` with Python dicts, in one place so both give the same bytes.

use fedfuse_core::{ModelSpec, Params};
use fedfuse_fuse::{PfnmConfig, pfnm_fuse, weighted_mean_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

use crate::error::{Context, LabError, Result, bail};

/// Fusion methods for pre-trained models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseMethod {
    /// Probabilistic federated neural matching: hidden units are matched, widths may change.
    Pfnm,
    /// PFNM plus `eps` times the KL cost of the global posterior (Xiao & Cheng).
    GpiFnm,
    /// Coordinate-wise mean (weighted by the clients' example counts when given).
    FedAvg,
}

impl FuseMethod {
    /// The name as the command line and Python write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pfnm => "pfnm",
            Self::GpiFnm => "gpi-fnm",
            Self::FedAvg => "fedavg",
        }
    }

    /// Parses `pfnm`, `gpi-fnm` or `fedavg`.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "pfnm" => Self::Pfnm,
            "gpi-fnm" => Self::GpiFnm,
            "fedavg" => Self::FedAvg,
            other => bail!("method {other:?}: use \"pfnm\", \"gpi-fnm\" or \"fedavg\""),
        })
    }
}

/// One layer's matching: which global unit each client unit joined.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerAssignments {
    /// Hidden layer index.
    pub layer: usize,
    /// Width of the fused layer.
    pub global_units: usize,
    /// Client -> local unit -> global unit.
    pub assignments: Vec<Vec<usize>>,
}

/// The fused model and how it was made (the `.assignments.json` beside a fused file).
#[derive(Clone, Debug, Serialize)]
pub struct Fusion {
    /// The fused parameters.
    #[serde(skip)]
    pub params: Params,
    /// `pfnm`, `gpi-fnm` or `fedavg`.
    pub method: &'static str,
    /// The clients' names (file paths, or `client {j}`), in the order given.
    pub clients: Vec<String>,
    /// Each client's widths, input first.
    pub input_widths: Vec<Vec<usize>>,
    /// The fused model's widths.
    pub fused_widths: Vec<usize>,
    /// Per hidden layer matching (empty for FedAvg).
    pub layers: Vec<LayerAssignments>,
}

/// A client's own tensor names for each Linear layer of its chain: `(weight, bias)`.
type LayerNames = Vec<(String, String)>;

/// `p` renamed to fedfuse's `layers.{i}.weight` / `layers.{i}.bias`, reading the layer chain
/// from whatever names PyTorch produced: `nn.Sequential` (`0.weight`, `2.weight`), named
/// layers (`fc1.weight`), nested modules (`net.0.weight`, `classifier.weight`). Each layer is
/// a `<prefix>.weight` `[out, in]` with its `<prefix>.bias` `[out]`; layers are taken in the
/// order given when their widths chain, else in the one order in which they do. Anything that
/// is not a chain of Linear layers is refused, naming the tensor that broke it.
fn as_layers(p: &Params, name: &str) -> Result<(Params, LayerNames)> {
    let mut layers: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    for (tensor, t) in p.iter() {
        // A bare nn.Linear's state_dict is `weight` and `bias`: its prefix is empty.
        let (prefix, is_weight) = match (tensor.strip_suffix("weight"), tensor.strip_suffix("bias"))
        {
            (Some(prefix), _) if prefix.is_empty() || prefix.ends_with('.') => {
                (prefix.trim_end_matches('.'), true)
            }
            (_, Some(prefix)) if prefix.is_empty() || prefix.ends_with('.') => {
                (prefix.trim_end_matches('.'), false)
            }
            _ => bail!(
                "{name}: tensor `{tensor}` is neither a `.weight` nor a `.bias`: fusion reads a \
                 chain of nn.Linear layers only"
            ),
        };
        let want = if is_weight { 2 } else { 1 };
        if t.shape.len() != want {
            bail!(
                "{name}: tensor `{tensor}` has shape {:?}; a Linear layer's {} has {want} axes \
                 (fusion reads a chain of nn.Linear layers only)",
                t.shape,
                if is_weight { "weight" } else { "bias" }
            );
        }
        let slot = match layers.iter().position(|(p, _, _)| p == prefix) {
            Some(i) => i,
            None => {
                layers.push((prefix.to_string(), None, None));
                layers.len() - 1
            }
        };
        let entry = if is_weight {
            &mut layers[slot].1
        } else {
            &mut layers[slot].2
        };
        *entry = Some(tensor.to_string());
    }
    let mut named: LayerNames = Vec::with_capacity(layers.len());
    for (prefix, weight, bias) in layers {
        match (weight, bias) {
            (Some(w), Some(b)) => named.push((w, b)),
            (Some(w), None) => bail!(
                "{name}: layer `{prefix}` has no bias (`{w}` alone); fusion needs nn.Linear \
                 layers with bias=True"
            ),
            (None, _) => bail!("{name}: `{prefix}.bias` has no `{prefix}.weight`"),
        }
    }
    // (inputs, outputs) of a layer; its weight is known to be 2-D.
    let dims = |(w, _): &(String, String)| -> (usize, usize) {
        let shape = p.get(w).map_or(&[][..], |t| &t.shape[..]);
        (
            shape.get(1).copied().unwrap_or(0),
            shape.first().copied().unwrap_or(0),
        )
    };
    let chains = |order: &[usize]| {
        order
            .windows(2)
            .all(|pair| dims(&named[pair[0]]).1 == dims(&named[pair[1]]).0)
    };
    let given: Vec<usize> = (0..named.len()).collect();
    let order = if chains(&given) {
        given
    } else {
        chain_by_widths(&named.iter().map(dims).collect::<Vec<_>>()).ok_or_else(|| {
            let (before, after) = given
                .windows(2)
                .map(|pair| (&named[pair[0]], &named[pair[1]]))
                .find(|(a, b)| dims(a).1 != dims(b).0)
                .unwrap_or((&named[0], &named[0]));
            LabError::Invalid(format!(
                "{name}: not one chain of Linear layers: `{}` takes {} inputs after `{}` gives \
                 {} outputs, and no other order of the layers chains their widths uniquely",
                after.0,
                dims(after).0,
                before.0,
                dims(before).1
            ))
        })?
    };
    let mut out = Params::new();
    let mut names = Vec::with_capacity(order.len());
    for (i, &k) in order.iter().enumerate() {
        let (w, b) = &named[k];
        for (tensor, kind) in [(w, "weight"), (b, "bias")] {
            let t = p.require(tensor)?;
            out.push(
                format!("layers.{i}.{kind}"),
                t.shape.clone(),
                t.data.clone(),
            )?;
        }
        names.push(named[k].clone());
    }
    Ok((out, names))
}

/// The one order of layers (`(inputs, outputs)` each) in which each layer's outputs are the
/// next one's inputs; `None` when there is none or more than one.
fn chain_by_widths(dims: &[(usize, usize)]) -> Option<Vec<usize>> {
    let n = dims.len();
    let starts: Vec<usize> = (0..n)
        .filter(|&i| !(0..n).any(|j| j != i && dims[j].1 == dims[i].0))
        .collect();
    let [mut at] = starts[..] else { return None };
    let mut order = vec![at];
    while order.len() < n {
        let next: Vec<usize> = (0..n)
            .filter(|j| !order.contains(j) && dims[*j].0 == dims[at].1)
            .collect();
        let [j] = next[..] else { return None };
        order.push(j);
        at = j;
    }
    Some(order)
}

/// `fused` (fedfuse's `layers.{i}` names) under the first client's own names.
fn renamed(fused: Params, names: &LayerNames) -> Result<Params> {
    let mut out = Params::new();
    for (i, (w, b)) in names.iter().enumerate() {
        for (tensor, kind) in [(w, "weight"), (b, "bias")] {
            let t = fused.require(&format!("layers.{i}.{kind}"))?;
            out.push(tensor.clone(), t.shape.clone(), t.data.clone())?;
        }
    }
    Ok(out)
}

/// Widths of the MLP in `p`, input first; errors name the client.
fn mlp_widths(p: &Params, name: &str) -> Result<Vec<usize>> {
    let context = || {
        format!(
            "{name}: not an MLP of PyTorch nn.Linear layers (`layers.{{i}}.weight` [out, in] and \
             `layers.{{i}}.bias`)"
        )
    };
    ModelSpec::infer_mlp(p)
        .with_context(context)?
        .mlp_widths()
        .with_context(context)
}

/// Checks per-client class counts: one list of `classes` finite non-negative counts each.
fn check_class_counts(counts: &[Vec<f64>], clients: usize, classes: usize) -> Result<()> {
    if counts.len() != clients {
        bail!("{} class-count lists for {clients} clients", counts.len());
    }
    for (j, c) in counts.iter().enumerate() {
        if c.len() != classes || c.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("class counts of client {j} must be {classes} non-negative numbers, got {c:?}");
        }
    }
    Ok(())
}

/// Fuses `models` (name, parameters) with `method`. `pfnm.eps` must be 0 for PFNM and
/// positive for GPI-FNM; `seed` seeds PFNM's refinement orders.
pub fn fuse(
    models: &[(String, Params)],
    method: FuseMethod,
    class_counts: Option<&[Vec<f64>]>,
    pfnm: &PfnmConfig,
    seed: u64,
) -> Result<Fusion> {
    let Some((first_name, _)) = models.first() else {
        bail!("no client models given");
    };
    let mut widths = Vec::with_capacity(models.len());
    let mut chains = Vec::with_capacity(models.len());
    let mut own_names = LayerNames::new();
    for (name, p) in models {
        p.check_finite().context(name.clone())?;
        let (chain, names) = as_layers(p, name)?;
        widths.push(mlp_widths(&chain, name)?);
        if own_names.is_empty() {
            own_names = names;
        }
        chains.push(chain);
    }
    let first = &widths[0];
    let (first_in, first_out) = (first[0], first[first.len() - 1]);
    for (w, (name, _)) in widths.iter().zip(models) {
        if w[0] != first_in || w[w.len() - 1] != first_out || w.len() != first.len() {
            bail!(
                "{name}: widths {w:?} do not fit {first_name}'s {first:?}: clients must share \
                 inputs, outputs and depth"
            );
        }
    }
    if let Some(counts) = class_counts {
        check_class_counts(counts, models.len(), first_out)?;
    }
    let refs: Vec<&Params> = chains.iter().collect();
    let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
    let (params, layers) = match method {
        FuseMethod::Pfnm | FuseMethod::GpiFnm => {
            if method == FuseMethod::Pfnm && pfnm.eps != 0.0 {
                bail!("eps is GPI-FNM's coefficient: use method gpi-fnm");
            }
            if method == FuseMethod::GpiFnm && pfnm.eps <= 0.0 {
                bail!(
                    "gpi-fnm needs eps > 0 (eps = 0 is PFNM); to choose eps on validation data, \
                     run the federation with method `gpi-fnm`"
                );
            }
            pfnm.check()?;
            let mut rng = StdRng::seed_from_u64(seed);
            let fused = pfnm_fuse(&refs, class_counts, pfnm, &mut rng).map_err(|e| {
                LabError::Invalid(format!(
                    "{e} (clients are numbered in the order given: {})",
                    names.join(", ")
                ))
            })?;
            let layers = fused
                .assignments
                .into_iter()
                .enumerate()
                .map(|(layer, assignments)| LayerAssignments {
                    layer,
                    global_units: fused
                        .params
                        .get(&format!("layers.{layer}.bias"))
                        .map_or(0, |b| b.data.len()),
                    assignments,
                })
                .collect();
            (fused.params, layers)
        }
        FuseMethod::FedAvg => {
            for (w, name) in widths.iter().zip(&names) {
                if w != first {
                    bail!(
                        "{name}: widths {w:?} differ from {first:?}; fedavg needs identical \
                         shapes (use method pfnm)"
                    );
                }
            }
            let weights: Vec<f64> = match class_counts {
                Some(c) => c.iter().map(|v| v.iter().sum()).collect(),
                None => vec![1.0; refs.len()],
            };
            let pairs: Vec<(&Params, f64)> = refs.iter().copied().zip(weights).collect();
            (weighted_mean_params(&pairs)?, Vec::new())
        }
    };
    let fused_widths = mlp_widths(&params, "the fused model")?;
    Ok(Fusion {
        params: renamed(params, &own_names)?,
        method: method.name(),
        clients: names,
        input_widths: widths,
        fused_widths,
        layers,
    })
}
