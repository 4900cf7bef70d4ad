//! `fedfuse fuse`: one-shot fusion of pre-trained MLPs from safetensors or npz files; the
//! fusion itself is [`fedfuse_lab::fusion`], which Python's `fedfuse.fuse` calls too.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use fedfuse_core::{load_params, params_to_safetensors};
use fedfuse_fuse::PfnmConfig;
use fedfuse_lab::fusion::{self, FuseMethod as Method};

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

/// PFNM's order over a deep network's hidden layers (spelt as in a config file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum FuseOrder {
    /// The reference code's: the top hidden layer first, seen through its bias and outgoing
    /// weights.
    TopDown,
    /// The input side first: every layer matched on its full fan-in.
    BottomUp,
}

impl From<FuseOrder> for fedfuse_fuse::MatchOrder {
    fn from(o: FuseOrder) -> Self {
        match o {
            FuseOrder::TopDown => Self::TopDown,
            FuseOrder::BottomUp => Self::BottomUp,
        }
    }
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

fn read_class_counts(path: &Path) -> Result<Vec<Vec<f64>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read class counts {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected a JSON list with one list of class counts per client",
            path.display()
        )
    })
}

/// Runs `fedfuse fuse`.
pub fn run(args: &FuseArgs) -> Result<ExitCode> {
    if args.inputs.is_empty() {
        bail!("no client files given");
    }
    fedfuse_lab::table::prepare_output_path(&args.out).context("--out")?;
    let mut models = Vec::with_capacity(args.inputs.len());
    for file in &args.inputs {
        let p = load_params(file).with_context(|| format!("client model {}", file.display()))?;
        models.push((file.display().to_string(), p));
    }
    let counts = match &args.class_counts {
        Some(path) => Some(read_class_counts(path)?),
        None => None,
    };
    let method = match args.method {
        FuseMethod::Pfnm => Method::Pfnm,
        FuseMethod::GpiFnm => Method::GpiFnm,
        FuseMethod::Fedavg => Method::FedAvg,
    };
    let fused = fusion::fuse(&models, method, counts.as_deref(), &args.pfnm, args.seed)
        .with_context(|| match &args.class_counts {
            Some(path) => format!("class counts from {}", path.display()),
            None => "fusing the client files".to_string(),
        })?;
    let bytes = params_to_safetensors(&fused.params, Default::default())?;
    fedfuse_lab::table::write_atomic(&args.out, &bytes)?;
    let assignments_path = args.out.with_extension("assignments.json");
    fedfuse_lab::table::write_atomic(
        &assignments_path,
        serde_json::to_string_pretty(&fused)?.as_bytes(),
    )?;
    eprintln!(
        "fused {} clients with {}: widths {:?} -> {:?}; wrote {} and {}",
        models.len(),
        fused.method,
        fused.input_widths[0],
        fused.fused_widths,
        args.out.display(),
        assignments_path.display()
    );
    Ok(ExitCode::SUCCESS)
}
