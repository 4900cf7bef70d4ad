//! `fedfuse fuse`: one-shot fusion of pre-trained models (MLPs, or CNNs with `--model`) from
//! safetensors or npz files; the fusion itself is [`fedfuse_lab::fusion`], which Python's
//! `fedfuse.fuse` calls too.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use fedfuse_core::{Params, load_params, params_from_safetensors};
use fedfuse_fuse::{PfnmConfig, WeightMatchingConfig};
use fedfuse_lab::fusion::{self, FuseMethod as Method, FuseModel, FuseSettings};

/// Fusion methods for files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseMethod {
    /// Probabilistic federated neural matching: hidden units are matched, widths may change.
    Pfnm,
    /// PFNM plus `--eps` times the KL cost of the global posterior (Xiao & Cheng).
    GpiFnm,
    /// Git Re-Basin's weight matching: each client aligned to the first by one permutation per
    /// layer, then averaged; widths fixed.
    WeightMatching,
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
    /// The network the files hold (a name or a TOML layer list); `None` for MLPs.
    pub model: Option<String>,
    /// PFNM settings (`order` is [`Self::order`]).
    pub pfnm: PfnmConfig,
    /// PFNM's order; `None`: top-down for MLPs, bottom-up for layer lists.
    pub order: Option<fedfuse_fuse::MatchOrder>,
    /// Seed of PFNM's refinement orders and weight matching's layer orders.
    pub seed: u64,
    /// Inputs to re-estimate the fused model's batch norms on, and the samples per pass.
    pub reset_bn: Option<(PathBuf, usize)>,
}

/// The one array of a samples file (`--reset-bn`).
fn load_samples(file: &Path) -> Result<fedfuse_core::Tensor> {
    let what = || format!("--reset-bn {}", file.display());
    let params = load_params(file).with_context(what)?;
    let mut arrays = params.iter();
    match (arrays.next(), arrays.next()) {
        (Some((_, t)), None) => Ok(t.clone()),
        _ => bail!(
            "--reset-bn {}: expected one array of inputs (N x C x H x W or N x D), found {}",
            file.display(),
            params.len()
        ),
    }
}

/// A client file's tensors and, for safetensors written by `fedfuse fuse`, the layer list
/// stored in its metadata.
fn load_client(file: &Path) -> Result<(Params, Option<FuseModel>)> {
    let what = || format!("client model {}", file.display());
    let is_safetensors = file
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("safetensors"));
    if !is_safetensors {
        return Ok((load_params(file).with_context(what)?, None));
    }
    let bytes = fedfuse_core::read_safetensors_file(file).with_context(what)?;
    let (params, metadata) = params_from_safetensors(&bytes).with_context(what)?;
    let stored = FuseModel::from_metadata(&metadata, &file.display().to_string())?;
    Ok((params, stored))
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
    let model = args
        .model
        .as_deref()
        .map(FuseModel::parse)
        .transpose()
        .context("--model")?;
    let mut models = Vec::with_capacity(args.inputs.len());
    let mut stored = None;
    for file in &args.inputs {
        let (p, from_file) = load_client(file)?;
        if stored.is_none() {
            stored = from_file;
        }
        models.push((file.display().to_string(), p));
    }
    let counts = match &args.class_counts {
        Some(path) => Some(read_class_counts(path)?),
        None => None,
    };
    let method = match args.method {
        FuseMethod::Pfnm => Method::Pfnm,
        FuseMethod::GpiFnm => Method::GpiFnm,
        FuseMethod::WeightMatching => Method::WeightMatching,
        FuseMethod::Fedavg => Method::FedAvg,
    };
    let settings = FuseSettings {
        method,
        pfnm: args.pfnm.clone(),
        order: args.order,
        weight_matching: WeightMatchingConfig::default(),
        seed: args.seed,
    };
    // A fused file's stored list stands in for `--model` (used only where the files are not
    // MLPs).
    let model = model.or(stored);
    let clients = models.len();
    let fused = fusion::fuse_with(models, model.as_ref(), counts.as_deref(), &settings)
        .with_context(|| match &args.class_counts {
            Some(path) => format!("class counts from {}", path.display()),
            None => "fusing the client files".to_string(),
        })?;
    let mut fused = fused;
    if let Some((file, batch)) = &args.reset_bn {
        let samples = load_samples(file)?;
        let norms = fused
            .reestimate_batch_norm(&samples, *batch)
            .with_context(|| format!("--reset-bn {}", file.display()))?;
        eprintln!(
            "re-estimated {norms} batch norms on {} samples of {}",
            samples.shape.first().copied().unwrap_or(0),
            file.display()
        );
    }
    fedfuse_lab::table::write_model_atomic(&args.out, &fused.params, fused.metadata()?)?;
    let assignments_path = args.out.with_extension("assignments.json");
    fedfuse_lab::table::write_atomic(
        &assignments_path,
        serde_json::to_string_pretty(&fused)?.as_bytes(),
    )?;
    eprintln!(
        "fused {} clients with {}: widths {:?} -> {:?}{}; wrote {} and {}",
        clients,
        fused.method,
        fused.input_widths[0],
        fused.fused_widths,
        match &fused.model {
            Some(_) => " (the fused layer list is in the file's `fedfuse.model` metadata)",
            None => "",
        },
        args.out.display(),
        assignments_path.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `fedfuse groups`: the permutation groups of `model` on samples of shape `input`, as text
/// or JSON on stdout.
pub fn show_groups(model: &str, input: Option<&[usize]>, json: bool) -> Result<()> {
    let model = FuseModel::parse(model)?;
    let (input, groups) = model.groups(input)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&groups)?);
        return Ok(());
    }
    outln!(
        "model `{}` on samples of shape {input:?}: {} permutation groups",
        model.source(),
        groups.len()
    );
    for (g, group) in groups.iter().enumerate() {
        let tied = match group.tied {
            1 => String::new(),
            t => format!(
                ", moved only within each of {t} group-norm blocks of {}",
                group.units / t
            ),
        };
        let heads = match group.heads {
            Some(h) => format!(
                ", in {h} heads of {}: a head moves whole, its features within it",
                group.units / h.max(1)
            ),
            None => String::new(),
        };
        outln!("group {g}: {} units{tied}{heads}", group.units);
        outln!("  holds:   {}", group.holds.join(", "));
        match (group.read_by.is_empty(), group.heads) {
            (true, Some(_)) => outln!("  read by: the attention's q . k products (no tensor)"),
            _ => outln!("  read by: {}", group.read_by.join(", ")),
        }
    }
    Ok(())
}
