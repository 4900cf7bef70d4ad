//! `fedfuse fuse`: one-shot fusion of pre-trained MLPs from safetensors or npz files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use fedfuse_core::{ModelSpec, Params, load_params, save_safetensors};
use fedfuse_fuse::{PfnmConfig, pfnm_fuse, weighted_mean_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

/// Fusion methods for files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseMethod {
    /// Probabilistic federated neural matching: hidden units are matched, widths may change.
    Pfnm,
    /// PFNM plus `--eps` times the KL cost of the global posterior (Xiao & Cheng).
    GpiFnm,
    /// Coordinate-wise mean (weighted by the clients' example counts when given).
    Fedavg,
}

/// What `fedfuse fuse` was asked.
pub struct FuseArgs {
    /// The method.
    pub method: FuseMethod,
    /// Client model files.
    pub inputs: Vec<PathBuf>,
    /// Fused model file.
    pub out: PathBuf,
    /// JSON list of per-client class counts.
    pub class_counts: Option<PathBuf>,
    /// PFNM settings.
    pub pfnm: PfnmConfig,
    /// Seed of PFNM's refinement orders.
    pub seed: u64,
}

/// Widths of the MLP in `p`, input first; errors name the file.
fn mlp_widths(p: &Params, file: &Path) -> Result<Vec<usize>> {
    let context = || {
        format!(
            "{}: not an MLP of PyTorch nn.Linear layers (`layers.{{i}}.weight` [out, in] and \
             `layers.{{i}}.bias`)",
            file.display()
        )
    };
    ModelSpec::infer_mlp(p)
        .with_context(context)?
        .mlp_widths()
        .with_context(context)
}

#[derive(Serialize)]
struct LayerAssignments {
    layer: usize,
    global_units: usize,
    /// Client -> local unit -> global unit.
    assignments: Vec<Vec<usize>>,
}

#[derive(Serialize)]
struct AssignmentsFile<'a> {
    method: &'static str,
    clients: Vec<String>,
    input_widths: &'a [Vec<usize>],
    fused_widths: Vec<usize>,
    layers: Vec<LayerAssignments>,
}

fn read_class_counts(path: &Path, clients: usize, classes: usize) -> Result<Vec<Vec<f64>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read class counts {}", path.display()))?;
    let counts: Vec<Vec<f64>> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON list with one list of {classes} class counts per client",
            path.display()
        )
    })?;
    if counts.len() != clients {
        bail!(
            "{}: {} count lists for {clients} client files",
            path.display(),
            counts.len()
        );
    }
    for (j, c) in counts.iter().enumerate() {
        if c.len() != classes || c.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!(
                "{}: entry {j} must hold {classes} non-negative counts, got {c:?}",
                path.display()
            );
        }
    }
    Ok(counts)
}

/// Runs `fedfuse fuse`.
pub fn run(args: &FuseArgs) -> Result<ExitCode> {
    if args.inputs.is_empty() {
        bail!("no client files given");
    }
    let mut models = Vec::with_capacity(args.inputs.len());
    let mut widths = Vec::with_capacity(args.inputs.len());
    for file in &args.inputs {
        let p = load_params(file).with_context(|| format!("client model {}", file.display()))?;
        p.check_finite()
            .with_context(|| format!("client model {}", file.display()))?;
        widths.push(mlp_widths(&p, file)?);
        models.push(p);
    }
    let (first_in, first_out) = (widths[0][0], widths[0][widths[0].len() - 1]);
    for (w, file) in widths.iter().zip(&args.inputs) {
        if w[0] != first_in || w[w.len() - 1] != first_out || w.len() != widths[0].len() {
            bail!(
                "{}: widths {w:?} do not fit {}'s {:?}: clients must share inputs, outputs and depth",
                file.display(),
                args.inputs[0].display(),
                widths[0]
            );
        }
    }
    let counts = args
        .class_counts
        .as_deref()
        .map(|p| read_class_counts(p, models.len(), first_out))
        .transpose()?;
    let refs: Vec<&Params> = models.iter().collect();
    let names: Vec<String> = args
        .inputs
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let (fused, layers, method) = match args.method {
        FuseMethod::Pfnm | FuseMethod::GpiFnm => {
            let method = if args.method == FuseMethod::Pfnm {
                if args.pfnm.eps != 0.0 {
                    bail!("--eps is GPI-FNM's coefficient: use --method gpi-fnm");
                }
                "pfnm"
            } else {
                if args.pfnm.eps <= 0.0 {
                    bail!(
                        "--method gpi-fnm needs --eps E > 0 (eps = 0 is PFNM); to choose eps on \
                         validation data, run the federation with method `gpi-fnm`"
                    );
                }
                "gpi-fnm"
            };
            args.pfnm.check()?;
            let mut rng = StdRng::seed_from_u64(args.seed);
            let fused = pfnm_fuse(&refs, counts.as_deref(), &args.pfnm, &mut rng).map_err(|e| {
                anyhow::anyhow!(
                    "{e} (clients are numbered in the order given: {})",
                    names.join(", ")
                )
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
            (fused.params, layers, method)
        }
        FuseMethod::Fedavg => {
            for (w, file) in widths.iter().zip(&args.inputs) {
                if *w != widths[0] {
                    bail!(
                        "{}: widths {w:?} differ from {:?}; fedavg needs identical shapes (use --method pfnm)",
                        file.display(),
                        widths[0]
                    );
                }
            }
            let weights: Vec<f64> = match &counts {
                Some(c) => c.iter().map(|v| v.iter().sum()).collect(),
                None => vec![1.0; refs.len()],
            };
            let pairs: Vec<(&Params, f64)> = refs.iter().copied().zip(weights).collect();
            (weighted_mean_params(&pairs)?, Vec::new(), "fedavg")
        }
    };
    let fused_widths = mlp_widths(&fused, &args.out)?;
    save_safetensors(&fused, &args.out)?;
    let assignments_path = args.out.with_extension("assignments.json");
    let report = AssignmentsFile {
        method,
        clients: names,
        input_widths: &widths,
        fused_widths: fused_widths.clone(),
        layers,
    };
    std::fs::write(&assignments_path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", assignments_path.display()))?;
    eprintln!(
        "fused {} clients with {method}: widths {:?} -> {fused_widths:?}; wrote {} and {}",
        models.len(),
        widths[0],
        args.out.display(),
        assignments_path.display()
    );
    Ok(ExitCode::SUCCESS)
}
