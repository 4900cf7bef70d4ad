//! The model of `fedfuse fuse --model` / `fedfuse.fuse(model=...)`: a network name or the
//! `[model]` table of a TOML file (the run config's section, plus the sample shape `input`),
//! and how a client file's tensors, under whatever names PyTorch gave them, are read as that
//! layer list: `{i}.weight` and friends, each file's own widths, checked shape by shape.

use std::collections::HashMap;
use std::path::Path;

use fedfuse_core::layers::{self, FeatureShape, LayerSpec};
use fedfuse_core::{ModelSpec, ParamShape, Params, TorchvisionNames, ZooModel};

use crate::config::{ModelKind, ModelSection, read_settings_file};
use crate::error::{Context, LabError, Result, bail};

/// Metadata key of a fused file's layer list (the TOML `--model` reads), so that fused files
/// can be fused again without `--model`.
pub const MODEL_KEY: &str = "fedfuse.model";

/// Metadata key of a fused file's widths (JSON: input first, classes last).
pub const WIDTHS_KEY: &str = "fedfuse.widths";

/// Square sample sides tried when a network name leaves the input open: MNIST's and
/// CIFAR's first, then every other side.
const COMMON_SIDES: [usize; 2] = [28, 32];
const MAX_SIDE: usize = 1024;

/// The network the client files hold.
#[derive(Clone, Debug)]
pub struct FuseModel {
    section: ModelSection,
    /// Shape of one sample; inferred from the files when `None` (network names).
    input: Option<Vec<usize>>,
    /// How it was given (`cnn-leaf`, `net.toml`, the file whose metadata held it), for errors.
    source: String,
    /// Read from a fused file's metadata rather than given: MLP files still take the MLP way.
    pub(super) stored: bool,
}

/// A client file read as the layer list.
pub(super) struct ListClient {
    /// Its tensors under the list's names, in the list's order.
    pub(super) params: Params,
    /// The list with this file's widths.
    pub(super) layers: Vec<LayerSpec>,
    /// List name -> the file's own name.
    pub(super) own: HashMap<String, String>,
}

/// One permutation group of a model: units that one permutation must move together for the
/// network to compute the same function (a layer's units, a residual stage's stream, a block's
/// inner channels), as `fedfuse groups` shows it, under the names the model's files carry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GroupView {
    /// Its units (channels or features).
    pub units: usize,
    /// Group-norm blocks a permutation must keep each unit inside (1: none).
    pub tied: usize,
    /// A transformer block's query-key or value group: its heads, whose features move whole
    /// (a head to a head, its features permuted within it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// Every tensor that holds the units along its first axis.
    pub holds: Vec<String>,
    /// Every tensor that reads them as its inputs.
    pub read_by: Vec<String>,
}

/// The clients read as one layer list.
pub(super) struct Resolved {
    /// Shape of one sample.
    pub(super) input: Vec<usize>,
    /// Per client, in the order given.
    pub(super) clients: Vec<ListClient>,
    /// Whether `input` was inferred from the files rather than given.
    pub(super) input_inferred: bool,
}

fn names_hint() -> String {
    format!("lenet5, {}", ZooModel::NAMES.join(", "))
}

impl FuseModel {
    /// `arg` as `--model` takes it: a network name (`lenet5`, `cnn-leaf`, `vgg9`, `resnet20`,
    /// `resnet18`, `resnet34`) or the path of a TOML file holding a `[model]` table.
    pub fn parse(arg: &str) -> Result<Self> {
        let path = Path::new(arg);
        let looks_like_file = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
            || path.components().count() > 1
            || path.exists();
        if looks_like_file {
            let text = read_settings_file(path, "model file")?;
            return Self::from_toml(&text, &path.display().to_string())
                .with_context(|| format!("model file {}", path.display()));
        }
        let mut table = toml::Table::new();
        table.insert("kind".into(), toml::Value::String(arg.to_string()));
        let section: ModelSection = toml::Value::Table(table).try_into().map_err(|_| {
            LabError::Invalid(format!(
                "model `{arg}` is neither a file nor a network name: use {}, or a TOML file \
                 with [model] kind = \"sequential\", input = [channels, height, width] and \
                 layers = [...] as in a run config",
                names_hint()
            ))
        })?;
        if matches!(section.kind, ModelKind::Mlp | ModelKind::Sequential) {
            bail!(
                "model `{arg}` needs its widths or layers: give a TOML file with [model] \
                 kind = \"{arg}\" (and input = [...]), or leave the model out for MLPs, whose \
                 layers are read from their tensors"
            );
        }
        Ok(Self {
            section,
            input: None,
            source: arg.to_string(),
            stored: false,
        })
    }

    /// The `[model]` table of TOML `text` (or the whole text when it has `kind` at the top):
    /// a run config's `[model]` section plus `input`, the shape of one sample (required for
    /// `sequential` and `mlp`; inferred from the files for network names). `source` names it
    /// in errors.
    pub fn from_toml(text: &str, source: &str) -> Result<Self> {
        let mut root: toml::Table = toml::from_str(text)?;
        let mut table = match root.remove("model") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => bail!("`model` must be a table: [model]"),
            None if root.contains_key("kind") => root,
            None => bail!(
                "no [model] table: write [model] kind = \"sequential\", input = [1, 28, 28] and \
                 layers = [...] (a run config's [model] section with the sample shape), or \
                 kind = one of {}",
                names_hint()
            ),
        };
        let input = match table.remove("input") {
            Some(v) => {
                let dims: Vec<usize> = v.try_into().map_err(|e| {
                    LabError::Invalid(format!(
                        "model.input must be the shape of one sample, e.g. [1, 28, 28]: {e}"
                    ))
                })?;
                FeatureShape::of(&dims).context("model.input")?;
                Some(dims)
            }
            None => None,
        };
        let section: ModelSection = toml::Value::Table(table).try_into()?;
        if input.is_none() && matches!(section.kind, ModelKind::Mlp | ModelKind::Sequential) {
            bail!(
                "model.input is missing: a `{}` model needs the shape of one sample, e.g. \
                 input = [1, 28, 28] or input = [784]",
                section.kind.name()
            );
        }
        Ok(Self {
            section,
            input,
            source: source.to_string(),
            stored: false,
        })
    }

    /// The model stored in a fused file's metadata (`fedfuse.model`), if any.
    pub fn from_metadata(metadata: &HashMap<String, String>, file: &str) -> Result<Option<Self>> {
        let Some(text) = metadata.get(MODEL_KEY) else {
            return Ok(None);
        };
        let mut model = Self::from_toml(text, &format!("{file}'s `{MODEL_KEY}` metadata"))
            .with_context(|| format!("{file}: metadata `{MODEL_KEY}`"))?;
        model.stored = true;
        Ok(Some(model))
    }

    /// A layer list given as a spec (an MLP inferred from its tensors).
    pub(super) fn of_spec(spec: &ModelSpec, source: &str) -> Result<Self> {
        let ModelSpec::Sequential { input, layers } = spec.as_sequential() else {
            bail!("{source}: not a layer list");
        };
        let mut table = toml::Table::new();
        table.insert("kind".into(), toml::Value::String("sequential".into()));
        table.insert("layers".into(), toml::Value::try_from(&layers)?);
        Ok(Self {
            section: toml::Value::Table(table).try_into()?,
            input: Some(input),
            source: source.to_string(),
            stored: false,
        })
    }

    /// How the model was given, for messages.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The layer list at sample shape `input` (a network's classes come from the files: the
    /// output layer's width is read from them like every other).
    fn list_at(&self, input: &[usize]) -> Result<Vec<LayerSpec>> {
        let spec = self.section.spec(input, 1)?;
        Ok(spec.as_sequential().layer_list().to_vec())
    }

    /// A sample shape at which the list chains, for its tensor names (which do not depend on
    /// it): the given one, else an image for networks and a vector for an MLP.
    fn provisional_input(&self) -> Vec<usize> {
        match (&self.input, self.section.kind) {
            (Some(input), _) => input.clone(),
            (None, ModelKind::Mlp) => vec![1],
            (None, _) => vec![1, 32, 32],
        }
    }

    /// Reads every client file as the list, all at one sample shape (the given one, or the
    /// first that the first file's tensors fit), each with its own widths.
    pub(super) fn resolve(&self, models: Vec<(String, Params)>) -> Result<Resolved> {
        let provisional = self.provisional_input();
        let template = self.list_at(&provisional).with_context(|| self.what())?;
        let (_, layout) = layers::chain(FeatureShape::of(&provisional)?, &template)
            .with_context(|| self.what())?;
        let mut models = models.into_iter();
        let Some((first_name, first_params)) = models.next() else {
            bail!("no client models given");
        };
        let first = &first_params;
        let first_name = first_name.as_str();
        let torch = self.section.torchvision_names();
        let first_map = map_names(first, &layout, torch.as_ref(), first_name, &self.source)
            .map_err(|e| self.vit_hint(e))?;
        let candidates: Vec<Vec<usize>> = match &self.input {
            Some(input) => vec![input.clone()],
            None => self.inferred_inputs(&template, first, &first_map),
        };
        let mut found = None;
        let mut first_error = None;
        for input in candidates {
            let Ok(list) = self.list_at(&input) else {
                continue;
            };
            match read_as_list(first, &first_map, &input, &list, first_name, &self.source) {
                Ok(fit) => {
                    found = Some((input, list, fit));
                    break;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let Some((input, list, fit)) = found else {
            return Err(self.vit_hint(first_error.unwrap_or_else(|| {
                LabError::Invalid(format!(
                    "{first_name}: no sample shape fits {} to these tensors; give a TOML file \
                     with model.input",
                    self.what()
                ))
            })));
        };
        let mut clients = vec![take_as_list(first_params, first_map, fit, first_name)?];
        for (name, p) in models {
            let map = map_names(&p, &layout, torch.as_ref(), &name, &self.source)?;
            let fit = read_as_list(&p, &map, &input, &list, &name, &self.source)?;
            clients.push(take_as_list(p, map, fit, &name)?);
        }
        Ok(Resolved {
            input,
            clients,
            input_inferred: self.input.is_none(),
        })
    }

    /// The permutation groups of this model on samples of shape `input` (else the model's
    /// own, else 3x32x32 images), under the names its files carry: torchvision's for
    /// `resnet18` and `resnet34`, the list's (`0.weight`, `4.conv1.weight`) otherwise. Returns
    /// the sample shape used too.
    pub fn groups(&self, input: Option<&[usize]>) -> Result<(Vec<usize>, Vec<GroupView>)> {
        let input = match (input, &self.input) {
            (Some(given), _) => given.to_vec(),
            (None, Some(own)) => own.clone(),
            // Names and groups do not depend on the side; CIFAR's and ImageNet's 3 channels.
            (None, None) if self.section.kind != ModelKind::Mlp => vec![3, 32, 32],
            (None, None) => self.provisional_input(),
        };
        FeatureShape::of(&input).context("--input")?;
        let list = self.list_at(&input).with_context(|| self.what())?;
        let torch = self.section.torchvision_names();
        let name = |n: &str| {
            torch
                .as_ref()
                .and_then(|t| t.torch_name(n))
                .unwrap_or_else(|| n.to_string())
        };
        if list.iter().any(LayerSpec::is_transformer) {
            let groups = fedfuse_fuse::vit_groups(&list)
                .map_err(LabError::from)
                .with_context(|| self.what())?
                .into_iter()
                .map(|g| GroupView {
                    units: g.units,
                    tied: 1,
                    heads: g.heads,
                    holds: g
                        .holds
                        .iter()
                        .map(|(t, at)| match at.is_empty() {
                            true => name(t),
                            false => format!("{} ({at})", name(t)),
                        })
                        .collect(),
                    read_by: g.read_by.iter().map(|t| name(t)).collect(),
                })
                .collect();
            return Ok((input, groups));
        }
        let groups = layers::permutation_groups(&input, &list)
            .with_context(|| self.what())?
            .into_iter()
            .map(|g| GroupView {
                units: g.units,
                tied: g.tied,
                heads: None,
                holds: g.own.iter().map(|u| name(&u.tensor)).collect(),
                read_by: g.readers.iter().map(|u| name(&u.tensor)).collect(),
            })
            .collect();
        Ok((input, groups))
    }

    /// `e`, for `vit` named without its settings, with what to give instead: `vit` alone is
    /// the default ViT, and a file's heads cannot be read from its tensors.
    fn vit_hint(&self, e: LabError) -> LabError {
        if self.section.kind != ModelKind::Vit || self.section.vit.is_some() {
            return e;
        }
        LabError::Invalid(format!(
            "{e}. `vit` is the default ViT (patch 4, hidden 128, 6 layers, 4 heads, mlp 256); \
             for another, give a TOML file with [model] kind = \"vit\", input = [channels, \
             height, width] and a [model.vit] table of patch, hidden, layers, heads and mlp \
             (heads cannot be read from the tensors)"
        ))
    }

    fn what(&self) -> String {
        format!("model `{}`", self.source)
    }

    /// Sample shapes to try for a network named without one: the first layer's inputs as
    /// channels (an MLP's as features), square sides 28 and 32 first.
    fn inferred_inputs(
        &self,
        template: &[LayerSpec],
        file: &Params,
        map: &HashMap<String, String>,
    ) -> Vec<Vec<usize>> {
        let first_weight = template
            .iter()
            .position(|l| matches!(l, LayerSpec::Conv2d { .. } | LayerSpec::Linear { .. }))
            .and_then(|i| map.get(&format!("{i}.weight")))
            .and_then(|n| file.get(n))
            .and_then(|t| t.shape.get(1).copied());
        let Some(c) = first_weight else {
            return Vec::new();
        };
        if self.section.kind == ModelKind::Mlp {
            return vec![vec![c]];
        }
        COMMON_SIDES
            .into_iter()
            .chain((1..=MAX_SIDE).filter(|s| !COMMON_SIDES.contains(s)))
            .map(|s| vec![c, s, s])
            .collect()
    }
}

/// One module's tensors: `(leaf name, axes)`, sorted: what tells a convolution (`weight` of 4
/// axes, `bias`) from a linear layer or a batch norm (`weight`, `bias`, `running_mean`, ...).
type Signature = Vec<(String, usize)>;

/// A module's name prefix and signature.
type Module = (String, Signature);

/// Modules (a name's part before its last dot) in first-appearance order, with their
/// signatures.
fn modules<'a>(names: impl Iterator<Item = (&'a str, usize)>) -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    for (name, rank) in names {
        let (prefix, leaf) = name.rsplit_once('.').unwrap_or(("", name));
        let i = match out.iter().position(|(p, _)| p == prefix) {
            Some(i) => i,
            None => {
                out.push((prefix.to_string(), Vec::new()));
                out.len() - 1
            }
        };
        out[i].1.push((leaf.to_string(), rank));
    }
    for (_, sig) in &mut out {
        sig.sort();
    }
    out
}

/// What a module of this signature is, for messages: "convolution", "batch norm", ...
fn kind_name(sig: &Signature) -> String {
    let weight = sig.iter().find(|(leaf, _)| leaf == "weight").map(|s| s.1);
    let kind = if sig.iter().any(|(leaf, _)| leaf == "running_mean") {
        "batch norm"
    } else {
        match weight {
            Some(4) => "convolution",
            Some(2) => "linear layer",
            Some(1) => "norm",
            _ => "module",
        }
    };
    let bias = if matches!(kind, "convolution" | "linear layer")
        && !sig.iter().any(|(leaf, _)| leaf == "bias")
    {
        " without bias"
    } else {
        ""
    };
    let tensors: Vec<String> = sig
        .iter()
        .map(|(leaf, rank)| format!("`{leaf}` {rank}-D"))
        .collect();
    format!("{kind}{bias} ({})", tensors.join(", "))
}

/// `model.layers[i] (type)` for a list module prefix (`3`, `5.conv1`).
fn list_layer(prefix: &str) -> String {
    let index = prefix.split('.').next().unwrap_or(prefix);
    format!("model.layers[{index}]")
}

/// List name -> the file's name for every tensor of `layout`. The file's names are PyTorch's
/// (`0.weight`, `conv1.weight`, `features.3.bias`): its modules are taken in its order when
/// their tensors fit the list's layers one by one, else each kind of module (same tensors,
/// same axes) in its order, since files saved by safetensors sort their names (`bn1` before
/// `conv1`).
fn map_names(
    file: &Params,
    layout: &[ParamShape],
    torch: Option<&TorchvisionNames>,
    name: &str,
    model: &str,
) -> Result<HashMap<String, String>> {
    // The list's own names, else torchvision's where the network has them.
    let exact = |rename: &dyn Fn(&str) -> Option<String>| -> Option<HashMap<String, String>> {
        if file.len() != layout.len() {
            return None;
        }
        layout
            .iter()
            .map(|p| {
                let theirs = rename(&p.name)?;
                file.get(&theirs).map(|_| (p.name.clone(), theirs))
            })
            .collect()
    };
    if let Some(map) = exact(&|n| Some(n.to_string())) {
        return Ok(map);
    }
    if let Some(map) = torch.and_then(|names| exact(&|n| names.torch_name(n))) {
        return Ok(map);
    }
    let want = modules(layout.iter().map(|p| (p.name.as_str(), p.shape.len())));
    let have = modules(file.iter().map(|(n, t)| (n, t.shape.len())));
    let in_order = want.len() == have.len() && want.iter().zip(&have).all(|(a, b)| a.1 == b.1);
    let pairs: Vec<(&Module, &Module)> = if in_order {
        want.iter().zip(&have).collect()
    } else {
        let mut pairs = Vec::with_capacity(want.len());
        let mut kinds: Vec<&Signature> = want.iter().chain(&have).map(|m| &m.1).collect();
        kinds.sort();
        kinds.dedup();
        for kind in kinds {
            let ours: Vec<&Module> = want.iter().filter(|m| &m.1 == kind).collect();
            let theirs: Vec<&Module> = have.iter().filter(|m| &m.1 == kind).collect();
            if ours.len() != theirs.len() {
                let listed = |ms: &[&Module], list: bool| {
                    ms.iter()
                        .map(|(p, _)| {
                            if list {
                                list_layer(p)
                            } else {
                                format!("`{p}`")
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                bail!(
                    "{name}: its tensors do not fit model `{model}`: the model has {} layer(s) \
                     of kind {}{} where the file has {}{}; pass the model these files were \
                     saved from",
                    ours.len(),
                    kind_name(kind),
                    if ours.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", listed(&ours, true))
                    },
                    theirs.len(),
                    if theirs.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", listed(&theirs, false))
                    },
                );
            }
            pairs.extend(ours.into_iter().zip(theirs));
        }
        pairs
    };
    let mut map = HashMap::with_capacity(layout.len());
    for ((ours, sig), (theirs, _)) in pairs {
        for (leaf, _) in sig {
            let full = |prefix: &str| {
                if prefix.is_empty() {
                    leaf.clone()
                } else {
                    format!("{prefix}.{leaf}")
                }
            };
            map.insert(full(ours), full(theirs));
        }
    }
    Ok(map)
}

/// The file's tensors as the list at sample shape `input`, with the file's own widths (every
/// convolution's and linear layer's `out` read from its weight's rows), each tensor's shape
/// checked against the list's.
fn read_as_list(
    file: &Params,
    map: &HashMap<String, String>,
    input: &[usize],
    list: &[LayerSpec],
    name: &str,
    model: &str,
) -> Result<(Vec<LayerSpec>, Vec<ParamShape>)> {
    let own_layers = layers::at_widths(list, |n| {
        map.get(n)
            .and_then(|f| file.get(f))
            .and_then(|t| t.shape.first().copied())
    });
    let (_, layout) = layers::chain(FeatureShape::of(input)?, &own_layers).map_err(|e| {
        LabError::Invalid(format!(
            "{name}: its tensors do not fit model `{model}` on samples of shape {input:?}: {e}"
        ))
    })?;
    for want in &layout {
        let theirs = map
            .get(&want.name)
            .map_or(want.name.as_str(), String::as_str);
        let t = file.get(theirs).ok_or_else(|| {
            LabError::Invalid(format!(
                "{name}: tensor `{theirs}` is missing ({} of model `{model}`)",
                list_layer(want.name.rsplit_once('.').map_or("", |(p, _)| p))
            ))
        })?;
        if t.shape != want.shape {
            let layer = want.name.split('.').next().unwrap_or("");
            let kind = layer
                .parse::<usize>()
                .ok()
                .and_then(|i| own_layers.get(i))
                .map_or("", LayerSpec::type_name);
            bail!(
                "{name}: tensor `{theirs}` has shape {:?} where model `{model}` \
                 (model.layers[{layer}], {kind}, on samples of shape {input:?}) needs {:?}; \
                 pass the model these files were saved from",
                t.shape,
                want.shape
            );
        }
    }
    Ok((own_layers, layout))
}

/// The client `file` as the list under its names, its tensors moved (not copied) into
/// `layout`'s order, once [`read_as_list`] has found that they fit.
fn take_as_list(
    file: Params,
    map: HashMap<String, String>,
    (own_layers, layout): (Vec<LayerSpec>, Vec<ParamShape>),
    name: &str,
) -> Result<ListClient> {
    let mut tensors = file.into_map();
    let mut params = Params::new();
    for want in layout {
        let theirs = map.get(&want.name).unwrap_or(&want.name);
        let t = tensors.remove(theirs).ok_or_else(|| {
            LabError::Invalid(format!(
                "{name}: tensor `{theirs}` stands for two of the model's tensors"
            ))
        })?;
        params.push(want.name, t.shape, t.data)?;
    }
    Ok(ListClient {
        params,
        layers: own_layers,
        own: map,
    })
}
