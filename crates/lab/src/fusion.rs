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
    for (name, p) in models {
        p.check_finite().context(name.clone())?;
        widths.push(mlp_widths(p, name)?);
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
    let refs: Vec<&Params> = models.iter().map(|(_, p)| p).collect();
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
        params,
        method: method.name(),
        clients: names,
        input_widths: widths,
        fused_widths,
        layers,
    })
}
