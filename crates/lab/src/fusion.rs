//! One-shot fusion of pre-trained models given as parameter sets: what `fedfuse fuse` does with
//! files and `fedfuse.fuse` with Python dicts, in one place so both give the same bytes. MLPs
//! are read from their tensors alone; other networks (convolutions, batch norms) need their
//! layer list, [`FuseModel`].

mod model;

use std::collections::HashMap;

use fedfuse_core::layers::{self, LayerSpec, is_counter};
use fedfuse_core::{ModelSpec, Params, Tensor, VitShape};
use fedfuse_fuse::{
    FusedLayers, MatchOrder, PfnmConfig, WeightMatchingConfig, pfnm_fuse, pfnm_fuse_layers,
    weight_matching_fuse, weighted_mean_params,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

pub use model::{FuseModel, GroupView, MODEL_KEY, WIDTHS_KEY};

use crate::error::{Context, LabError, Result, bail};

/// Fusion methods for pre-trained models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseMethod {
    /// Probabilistic federated neural matching: hidden units are matched, widths may change.
    Pfnm,
    /// PFNM plus `eps` times the KL cost of the global posterior (Xiao & Cheng).
    GpiFnm,
    /// Git Re-Basin's weight matching (Ainsworth et al.): every client aligned to the first by
    /// one permutation per layer, then averaged; widths fixed.
    WeightMatching,
    /// Coordinate-wise mean (weighted by the clients' example counts when given).
    FedAvg,
}

impl FuseMethod {
    /// The name as the command line and Python write it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pfnm => "pfnm",
            Self::GpiFnm => "gpi-fnm",
            Self::WeightMatching => "weight-matching",
            Self::FedAvg => "fedavg",
        }
    }

    /// Parses `pfnm`, `gpi-fnm`, `weight-matching` or `fedavg`.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "pfnm" => Self::Pfnm,
            "gpi-fnm" => Self::GpiFnm,
            "weight-matching" => Self::WeightMatching,
            "fedavg" => Self::FedAvg,
            other => bail!(
                "method {other:?}: use \"pfnm\", \"gpi-fnm\", \"weight-matching\" or \"fedavg\""
            ),
        })
    }
}

/// How to fuse: the method and its settings.
#[derive(Clone, Debug)]
pub struct FuseSettings {
    /// The method.
    pub method: FuseMethod,
    /// PFNM's and GPI-FNM's settings; `order` is read from [`Self::order`].
    pub pfnm: PfnmConfig,
    /// PFNM's order over hidden layers; `None`: top-down for MLPs read from their tensors (the
    /// reference code's), bottom-up for layer lists (the only order they are matched in).
    pub order: Option<MatchOrder>,
    /// Weight matching's settings.
    pub weight_matching: WeightMatchingConfig,
    /// Seed of PFNM's refinement orders and of weight matching's layer orders.
    pub seed: u64,
}

/// One layer's matching: which global unit each client unit joined.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerAssignments {
    /// Matched layer index (hidden layers from the input side).
    pub layer: usize,
    /// Its weight, under the fused file's (the first client's) names.
    pub tensor: String,
    /// Width of the fused layer.
    pub global_units: usize,
    /// Client -> local unit -> global unit (weight matching: the first client's unit it was
    /// aligned to).
    pub assignments: Vec<Vec<usize>>,
    /// What moves with these units (layer lists): every tensor that holds them along its
    /// first axis (weights, biases, norm channels; a residual stage's stream lists each
    /// block's `conv2` and `bn2` and the projection), under the fused file's names.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<String>,
    /// Every tensor that reads these units as its inputs (the next layers' input channels).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read_by: Vec<String>,
}

/// The fused model and how it was made (the `.assignments.json` beside a fused file).
#[derive(Clone, Debug, Serialize)]
pub struct Fusion {
    /// The fused parameters.
    #[serde(skip)]
    pub params: Params,
    /// `pfnm`, `gpi-fnm`, `weight-matching` or `fedavg`.
    pub method: &'static str,
    /// The clients' names (file paths, or `client {j}`), in the order given.
    pub clients: Vec<String>,
    /// Each client's widths: its input (a sample's channels or features), then every
    /// convolution's and linear layer's outputs.
    pub input_widths: Vec<Vec<usize>>,
    /// The fused model's widths, in the same form.
    pub fused_widths: Vec<usize>,
    /// Per hidden layer matching (empty for FedAvg).
    pub layers: Vec<LayerAssignments>,
    /// The fused layer list (`kind = "sequential"`, `input`, `layers` at the fused widths),
    /// when the clients were read as one: what `--model` takes to fuse the result again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// Whether the model's sample shape was inferred from the files (a network named without
    /// one) rather than given: the batch-norm samples may then say it.
    #[serde(skip)]
    pub input_inferred: bool,
}

impl Fusion {
    /// The safetensors metadata of the fused file: its widths (JSON) and, for layer lists, the
    /// fused list as the TOML `[model]` table that `--model` reads.
    pub fn metadata(&self) -> Result<HashMap<String, String>> {
        let mut out = HashMap::new();
        out.insert(
            WIDTHS_KEY.to_string(),
            serde_json::to_string(&self.fused_widths)?,
        );
        if let Some(spec) = &self.model {
            let mut root = toml::Table::new();
            // A ViT is stored by its settings (`kind = "vit"`), under which its files'
            // torchvision names are read back; other lists as the list.
            let model = match spec {
                ModelSpec::Sequential { input, layers } => match VitShape::of_layers(layers) {
                    Some(vit) => {
                        let mut t = toml::Table::new();
                        t.insert("kind".into(), "vit".into());
                        t.insert("input".into(), toml::Value::try_from(input)?);
                        t.insert("vit".into(), toml::Value::try_from(vit)?);
                        toml::Value::Table(t)
                    }
                    None => toml::Value::try_from(spec)?,
                },
                _ => toml::Value::try_from(spec)?,
            };
            root.insert("model".into(), model);
            out.insert(MODEL_KEY.to_string(), toml::to_string(&root)?);
        }
        Ok(out)
    }
}

impl Fusion {
    /// Every batch norm of the fused model with its running statistics estimated anew on
    /// `samples` (`[n, c, h, w]` images or `[n, d]` vectors, the model's input): the standard
    /// repair after a merge (Jordan et al. 2023, "REPAIR"), whose averaged statistics
    /// describe none of the merged models. Training-mode passes of `batch` samples, averaged
    /// cumulatively as PyTorch does with `momentum=None` (`Trainer::reestimate_batch_norm`).
    /// Returns how many batch norms were re-estimated; a model without one is unchanged.
    pub fn reestimate_batch_norm(&mut self, samples: &Tensor, batch: usize) -> Result<usize> {
        let Some(spec) = &self.model else {
            // MLPs read from their tensors hold no batch norm.
            return Ok(0);
        };
        let layout = spec.param_shapes();
        let ModelSpec::Sequential { input, layers } = spec else {
            return Ok(0);
        };
        let n = samples.shape.first().copied().unwrap_or(0);
        let fits = |input: &[usize]| {
            let per: usize = input.iter().product();
            samples.shape.len() == input.len() + 1
                && samples.shape[1..] == input[..]
                && n.checked_mul(per) == Some(samples.data.len())
        };
        // A network named without a sample shape was read at the first side its tensors fit
        // (28 for a globally pooled ResNet): the samples' side is as good where the list has
        // the same tensors there, and it is the side the model is used at.
        let their_input = samples.shape.get(1..).unwrap_or(&[]).to_vec();
        let theirs = ModelSpec::sequential(&their_input, layers.clone());
        let (spec, input) = if self.input_inferred
            && !fits(input)
            && theirs.validate().is_ok()
            && theirs.param_shapes() == layout
        {
            (theirs, their_input)
        } else {
            (spec.clone(), input.clone())
        };
        if !fits(&input) || n == 0 {
            bail!(
                "the samples for batch norm have shape {:?}; the model takes samples of shape \
                 {input:?}: give an array [n, {}] with n >= 1",
                samples.shape,
                input
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        if let Some(v) = samples.data.iter().find(|v| !v.is_finite()) {
            bail!("the samples for batch norm hold {v}; give finite inputs");
        }
        let norms = layout
            .iter()
            .filter(|s| s.name.ends_with("running_mean"))
            .count();
        if norms == 0 {
            return Ok(0);
        }
        // The trainer reads the list's names; the fused file keeps the first client's.
        let mut listed = Params::new();
        for (shape, (_, t)) in layout.iter().zip(self.params.iter()) {
            listed.push(shape.name.clone(), t.shape.clone(), t.data.clone())?;
        }
        let data = fedfuse_data::Dataset::new(
            samples.data.clone(),
            vec![0; n],
            input.clone(),
            spec.classes().max(1),
        )?;
        let trainer = fedfuse_train::Trainer::new(spec.clone())?;
        let repaired = trainer.reestimate_batch_norm(&listed, &data, batch)?;
        for ((_, slot), (_, t)) in self.params.iter_mut().zip(repaired.iter()) {
            slot.data.clone_from(&t.data);
        }
        self.model = Some(spec);
        Ok(norms)
    }
}

/// What to do with tensors that are not an MLP's.
const NEEDS_MODEL: &str = "give the model (`--model`, Python `model=`): a network name \
     (lenet5, cnn-leaf, vgg9, resnet20, resnet18, resnet34) or a TOML file with [model] kind = \"sequential\", input = \
     [channels, height, width] and layers = [...] as in a run config";

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
            _ if layers::TensorRole::of(tensor) != layers::TensorRole::Param => bail!(
                "{name}: tensor `{tensor}` is a batch norm's; without a model, fusion reads a \
                 chain of nn.Linear layers only: {NEEDS_MODEL}"
            ),
            _ => bail!(
                "{name}: tensor `{tensor}` is neither a `.weight` nor a `.bias`: fusion reads a \
                 chain of nn.Linear layers only"
            ),
        };
        let want = if is_weight { 2 } else { 1 };
        if t.shape.len() > 2 {
            bail!(
                "{name}: tensor `{tensor}` has shape {:?}, a convolution's; without a model, \
                 fusion reads a chain of nn.Linear layers only: {NEEDS_MODEL}",
                t.shape
            );
        }
        if t.shape.len() != want {
            bail!(
                "{name}: tensor `{tensor}` has shape {:?}; a Linear layer's {} has {want} axes \
                 (without a model, fusion reads a chain of nn.Linear layers only; for other \
                 networks {NEEDS_MODEL})",
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

/// Fuses MLPs `models` (name, parameters) with `method`. `pfnm.eps` must be 0 for PFNM and
/// positive for GPI-FNM; `seed` seeds PFNM's refinement orders. [`fuse_with`] with no model
/// and `pfnm.order`.
pub fn fuse(
    models: Vec<(String, Params)>,
    method: FuseMethod,
    class_counts: Option<&[Vec<f64>]>,
    pfnm: &PfnmConfig,
    seed: u64,
) -> Result<Fusion> {
    let settings = FuseSettings {
        method,
        pfnm: pfnm.clone(),
        order: Some(pfnm.order),
        weight_matching: WeightMatchingConfig::default(),
        seed,
    };
    fuse_with(models, None, class_counts, &settings)
}

/// Fuses `models` (name, parameters). Without `model` they must be MLPs (read from their
/// tensors, under any PyTorch names; weight matching reads them as a layer list); with it,
/// each is read as `model`'s layer list with its own widths ([`FuseModel`]) and matched
/// over channels bottom-up. A model read from a fused file's metadata is used only where the
/// files are not MLPs.
pub fn fuse_with(
    models: Vec<(String, Params)>,
    model: Option<&FuseModel>,
    class_counts: Option<&[Vec<f64>]>,
    settings: &FuseSettings,
) -> Result<Fusion> {
    if models.is_empty() {
        bail!("no client models given");
    }
    for (name, p) in &models {
        p.check_values().context(name.clone())?;
    }
    check_eps(settings.method, &settings.pfnm)?;
    let model = match model {
        Some(m) if m.stored => {
            // Files fused before as MLPs take the MLP way whatever their metadata says.
            let all_mlps = models.iter().all(|(name, p)| as_layers(p, name).is_ok());
            (!all_mlps).then_some(m)
        }
        other => other,
    };
    if let Some(model) = model {
        return fuse_list(models, model, class_counts, settings);
    }
    let mut chains = Vec::with_capacity(models.len());
    let mut own_names = LayerNames::new();
    for (name, p) in &models {
        let (chain, names) = as_layers(p, name)?;
        if own_names.is_empty() {
            own_names = names;
        }
        chains.push((name.clone(), chain));
    }
    if settings.method == FuseMethod::WeightMatching {
        // Weight matching works on layer lists: the MLP read as one, names put back.
        let spec = ModelSpec::infer_mlp(&chains[0].1)
            .with_context(|| format!("{}: not an MLP of PyTorch nn.Linear layers", chains[0].0))?;
        let list = FuseModel::of_spec(&spec, "the MLP of the first file")?;
        let mut fused = fuse_list(chains, &list, class_counts, settings)?;
        fused.params = renamed(fused.params, &own_names)?;
        let by_chain: HashMap<String, String> = own_names
            .iter()
            .enumerate()
            .map(|(i, (w, _))| (format!("layers.{i}.weight"), w.clone()))
            .collect();
        for l in &mut fused.layers {
            if let Some(own) = by_chain.get(&l.tensor) {
                l.tensor = own.clone();
            }
        }
        return Ok(fused);
    }
    fuse_mlps(&models, chains, own_names, class_counts, settings)
}

/// `eps` belongs to GPI-FNM, and GPI-FNM needs one.
fn check_eps(method: FuseMethod, pfnm: &PfnmConfig) -> Result<()> {
    if method == FuseMethod::Pfnm && pfnm.eps != 0.0 {
        bail!("eps is GPI-FNM's coefficient: use method gpi-fnm");
    }
    if method == FuseMethod::GpiFnm && pfnm.eps <= 0.0 {
        bail!(
            "gpi-fnm needs eps > 0 (eps = 0 is PFNM); to choose eps on validation data, run the \
             federation with method `gpi-fnm`"
        );
    }
    Ok(())
}

/// `e` with the clients named in the order given.
fn numbered(e: impl std::fmt::Display, names: &[String]) -> LabError {
    LabError::Invalid(format!(
        "{e} (clients are numbered in the order given: {})",
        names.join(", ")
    ))
}

/// PFNM, GPI-FNM or FedAvg of MLP chains (`layers.{i}` names; `own_names` the first file's).
fn fuse_mlps(
    models: &[(String, Params)],
    chains: Vec<(String, Params)>,
    own_names: LayerNames,
    class_counts: Option<&[Vec<f64>]>,
    settings: &FuseSettings,
) -> Result<Fusion> {
    let first_name = &models[0].0;
    let mut widths = Vec::with_capacity(models.len());
    for (name, chain) in &chains {
        widths.push(mlp_widths(chain, name)?);
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
    let refs: Vec<&Params> = chains.iter().map(|(_, p)| p).collect();
    let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
    let (params, layers) = match settings.method {
        FuseMethod::Pfnm | FuseMethod::GpiFnm => {
            let pfnm = PfnmConfig {
                order: settings.order.unwrap_or(MatchOrder::TopDown),
                ..settings.pfnm.clone()
            };
            pfnm.check()?;
            let mut rng = StdRng::seed_from_u64(settings.seed);
            let fused =
                pfnm_fuse(&refs, class_counts, &pfnm, &mut rng).map_err(|e| numbered(e, &names))?;
            let layers = fused
                .assignments
                .into_iter()
                .enumerate()
                .map(|(layer, assignments)| LayerAssignments {
                    layer,
                    tensor: own_names
                        .get(layer)
                        .map_or_else(String::new, |n| n.0.clone()),
                    global_units: fused
                        .params
                        .get(&format!("layers.{layer}.bias"))
                        .map_or(0, |b| b.data.len()),
                    assignments,
                    holds: Vec::new(),
                    read_by: Vec::new(),
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
        FuseMethod::WeightMatching => bail!("weight matching reads MLPs as layer lists"),
    };
    let fused_widths = mlp_widths(&params, "the fused model")?;
    Ok(Fusion {
        params: renamed(params, &own_names)?,
        method: settings.method.name(),
        clients: names,
        input_widths: widths,
        fused_widths,
        layers,
        model: None,
        input_inferred: false,
    })
}

/// A layer list's widths: a sample's channels (or features), then every convolution's and
/// linear layer's outputs (a residual block's inner channels and its outputs).
fn list_widths(input: &[usize], layers: &[LayerSpec]) -> Vec<usize> {
    input
        .first()
        .copied()
        .into_iter()
        .chain(layers.iter().flat_map(|l| {
            match l {
                LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } => vec![*out],
                // A ViT: the stream's width, then each block's MLP units.
                LayerSpec::Tokens { hidden, .. } => vec![*hidden],
                LayerSpec::Encoder { mlp, .. } => vec![*mlp],
                // A residual block: its inner channels, then its output stream.
                _ => l
                    .block()
                    .map(|b| b.convs.iter().map(|c| c.rows).collect())
                    .unwrap_or_default(),
            }
        }))
        .collect()
}

/// `message` with the first client's own names for the list's (`` `3.weight` `` becomes
/// `` `fc1.weight` ``), so that errors name the file's tensors.
fn with_own_names(message: &str, own: &HashMap<String, String>) -> String {
    let mut out = message.to_string();
    for (ours, theirs) in own {
        if ours != theirs {
            out = out.replace(&format!("`{ours}`"), &format!("`{theirs}`"));
        }
    }
    out
}

/// Fuses the clients read as `model`'s layer list.
fn fuse_list(
    models: Vec<(String, Params)>,
    model: &FuseModel,
    class_counts: Option<&[Vec<f64>]>,
    settings: &FuseSettings,
) -> Result<Fusion> {
    let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
    let clients = models.len();
    let resolved = model.resolve(models)?;
    let input = &resolved.input;
    let first = &resolved.clients[0];
    let classes = list_widths(input, &first.layers)
        .last()
        .copied()
        .unwrap_or(0);
    if let Some(counts) = class_counts {
        check_class_counts(counts, clients, classes)?;
    }
    let refs: Vec<&Params> = resolved.clients.iter().map(|c| &c.params).collect();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let failed = |e: fedfuse_fuse::FuseError| {
        LabError::Invalid(with_own_names(
            &numbered(format!("model `{}`: {e}", model.source()), &names).to_string(),
            &first.own,
        ))
    };
    let fused = match settings.method {
        FuseMethod::Pfnm | FuseMethod::GpiFnm => {
            let pfnm = PfnmConfig {
                order: settings.order.unwrap_or(MatchOrder::BottomUp),
                ..settings.pfnm.clone()
            };
            pfnm.check()?;
            pfnm_fuse_layers(input, &first.layers, &refs, class_counts, &pfnm, &mut rng)
                .map_err(failed)?
        }
        FuseMethod::WeightMatching => weight_matching_fuse(
            input,
            &first.layers,
            &refs,
            class_counts,
            &settings.weight_matching,
            &mut rng,
        )
        .map_err(failed)?,
        FuseMethod::FedAvg => {
            for (c, name) in resolved.clients.iter().zip(&names) {
                if c.layers != first.layers {
                    bail!(
                        "{name}: widths {:?} differ from {}'s {:?}; fedavg needs identical \
                         shapes (use method pfnm)",
                        list_widths(input, &c.layers),
                        names[0],
                        list_widths(input, &first.layers)
                    );
                }
            }
            let weights: Vec<f64> = match class_counts {
                Some(c) => c.iter().map(|v| v.iter().sum()).collect(),
                None => vec![1.0; refs.len()],
            };
            let pairs: Vec<(&Params, f64)> = refs.iter().copied().zip(weights).collect();
            let mut params = weighted_mean_params(&pairs)?;
            // Batch norm's counters are counts: a whole number, as the matchers give them.
            for (name, t) in params.iter_mut() {
                if is_counter(name) {
                    t.data.iter_mut().for_each(|v| *v = v.round());
                }
            }
            FusedLayers {
                params,
                layers: first.layers.clone(),
                assignments: Vec::new(),
            }
        }
    };
    // The groups the assignments are of: the list's permutation groups (a plain chain's
    // layers; a residual stage's stream is one; a ViT's stream, heads and MLP units), as
    // (units, holds, read by) under the list's names.
    let groups: Vec<(usize, Vec<String>, Vec<String>)> =
        if fused.layers.iter().any(LayerSpec::is_transformer) {
            fedfuse_fuse::vit_groups(&fused.layers)?
                .into_iter()
                .map(|g| {
                    let holds = g.holds.into_iter().map(|(t, _)| t).collect();
                    (g.units, holds, g.read_by)
                })
                .collect()
        } else {
            layers::permutation_groups(input, &fused.layers)?
                .into_iter()
                .map(|u| {
                    let names =
                        |us: &[layers::UnitUse]| us.iter().map(|o| o.tensor.clone()).collect();
                    (u.units, names(&u.own), names(&u.readers))
                })
                .collect()
        };
    let own = |list_name: &str| {
        first
            .own
            .get(list_name)
            .cloned()
            .unwrap_or_else(|| list_name.to_string())
    };
    let layers = fused
        .assignments
        .into_iter()
        .enumerate()
        .map(|(g, assignments)| {
            let (units, holds, read_by) = groups.get(g).cloned().unwrap_or_default();
            LayerAssignments {
                layer: g,
                tensor: holds.first().map_or_else(String::new, |t| own(t)),
                global_units: units,
                assignments,
                holds: holds.iter().map(|t| own(t)).collect(),
                read_by: read_by.iter().map(|t| own(t)).collect(),
            }
        })
        .collect();
    let mut params = Params::new();
    for (name, t) in fused.params.iter() {
        params.push(own(name), t.shape.clone(), t.data.clone())?;
    }
    let spec = ModelSpec::sequential(input, fused.layers);
    Ok(Fusion {
        params,
        method: settings.method.name(),
        clients: names,
        input_widths: resolved
            .clients
            .iter()
            .map(|c| list_widths(input, &c.layers))
            .collect(),
        fused_widths: list_widths(input, spec.layer_list()),
        layers,
        model: Some(spec),
        input_inferred: resolved.input_inferred,
    })
}
