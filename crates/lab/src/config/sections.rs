//! The sections of a run config below its top-level keys: `[dataset]`, `[table]`, `[model]`
//! and `[train]`, each with its defaults and its own checks.

use super::MAX_PARAMS;
use crate::error::{Context, Result, bail_setting};
use crate::pipeline::SyntheticTables;
use std::path::PathBuf;

use fedfuse_core::{BlockNorm, LayerSpec, ModelSpec, TorchvisionNames, VitShape, ZooModel};
use fedfuse_data::CdcSplit;
use fedfuse_train::{Init, OptimizerConfig, TrainConfig};
use serde::{Deserialize, Serialize};

/// `[dataset]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// `digits` (bundled), `mnist`, `fashion-mnist`, `cifar10`, `cifar100`, `cifar100-coarse`.
    pub name: String,
    /// Fraction of each client's partition kept as its local test split.
    #[serde(default = "test_fraction")]
    pub local_test_fraction: f64,
    /// Fraction of the training set the server holds out as its validation split before the
    /// rest is partitioned (used to choose GPI-FNM's `eps`; default 0.1 for methods that need
    /// it, else 0). Never the test set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_fraction: Option<f64>,
    /// Use only this many training samples, drawn with the run's seed, before anything is
    /// split off (quick runs of slow networks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_samples: Option<usize>,
    /// Score the global model on only the first this-many test samples (quick runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_samples: Option<usize>,
    /// What the global accuracy is measured on: `test` (default) or `validation`, the
    /// server's held-out training samples (`validation_fraction`), for choosing settings
    /// without looking at the test set.
    #[serde(default, skip_serializing_if = "Score::is_test")]
    pub score: Score,
    /// Two client populations (MNIST vs permuted MNIST): the last this-many clients see every
    /// sample, train and local test, through one fixed permutation of the feature positions,
    /// drawn from `seed + 1000`; the server's test set and validation split become their plain
    /// copy followed by their permuted copy, so both populations weigh the same. 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub permuted_clients: usize,
    /// FEMNIST's classes: `all` 62 (default), `digits` (10) or `letters` (52, relabelled
    /// from 0).
    #[serde(default, skip_serializing_if = "FemnistClasses::is_all")]
    pub classes: FemnistClasses,
}

/// Which of FEMNIST's classes a run keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FemnistClasses {
    /// All 62: digits, upper-case, lower-case letters.
    #[default]
    All,
    /// The 10 digits.
    Digits,
    /// The 52 letters, labels 10..62 relabelled 0..52.
    Letters,
}

impl FemnistClasses {
    fn is_all(&self) -> bool {
        *self == Self::All
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}

/// The seed of the permutation `dataset.permuted_clients` applies, from the run's seed.
pub fn permutation_seed(seed: u64) -> u64 {
    seed.wrapping_add(1000)
}

/// The samples a run scores its global model on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Score {
    /// The dataset's test set.
    #[default]
    Test,
    /// The server's validation split.
    Validation,
}

impl Score {
    fn is_test(&self) -> bool {
        *self == Self::Test
    }
}

impl DatasetSection {
    /// The training and test sets the run uses: all of `data`, or the subsets that
    /// `train_samples` (drawn with `rng`) and `test_samples` ask for.
    pub fn limit(
        &self,
        data: fedfuse_data::TrainTest,
        rng: &mut rand::rngs::StdRng,
    ) -> Result<fedfuse_data::TrainTest> {
        use rand::seq::SliceRandom;
        let mut data = data;
        if self.classes != FemnistClasses::All {
            let (keep, first): (Vec<u32>, u32) = match self.classes {
                FemnistClasses::Digits => ((0..10).collect(), 0),
                _ => ((10..62).collect(), 10),
            };
            for set in [&mut data.train, &mut data.test] {
                let mut kept = fedfuse_data::select_classes(set, &keep);
                kept.y.iter_mut().for_each(|y| *y -= first);
                kept.num_classes = keep.len();
                *set = kept;
            }
        }
        for (key, want, set) in [
            ("train_samples", self.train_samples, &mut data.train),
            ("test_samples", self.test_samples, &mut data.test),
        ] {
            let Some(n) = want else { continue };
            if n == 0 || n > set.len() {
                bail_setting!(
                    format!("dataset.{key}"),
                    "`dataset.{key}` = {n}, but `{}` has {} such samples: give 1 to {}, or \
                     remove the key to use them all",
                    self.name,
                    set.len(),
                    set.len()
                );
            }
            let mut idx: Vec<usize> = (0..set.len()).collect();
            if key == "train_samples" {
                idx.shuffle(rng);
            }
            idx.truncate(n);
            *set = set.subset(&idx);
        }
        Ok(data)
    }
}

fn test_fraction() -> f64 {
    0.2
}

/// `[table]`: a tabular dataset, each client's rows and the held-out rows the server scores
/// the global model on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TableSection {
    /// Rows of one Gaussian graphical model with a random graph (drawn with the run's seed),
    /// `rows_per_client` for each client, then `test_rows` held out.
    Synthetic(SyntheticTables),
    /// The CDC 2015 linked infant-death file (`cdc-infant-2015/` under `data_dir`): one
    /// client per group of `split`, every `test_every`-th row of each held out.
    Cdc {
        /// `residence_status` (3 clients) or `birth_quarter` (4).
        #[serde(default = "crate::pipeline::cdc_split_name")]
        split: String,
        /// Features left out (e.g. `age_at_death_days`, which gives the death-age bucket
        /// away).
        #[serde(default)]
        drop: Vec<String>,
        /// Every `test_every`-th row of each client is held out.
        #[serde(default = "crate::pipeline::test_every")]
        test_every: usize,
    },
}

impl TableSection {
    /// Checks the settings against `clients`.
    pub(super) fn check(&self, clients: usize) -> Result<()> {
        match self {
            TableSection::Synthetic(SyntheticTables {
                features,
                rows_per_client,
                test_rows,
                edge_prob,
                ..
            }) => {
                if *features < 2 || *rows_per_client < 2 || *test_rows == 0 {
                    bail_setting!(
                        "table",
                        "[table]: need features >= 2, rows_per_client >= 2 and test_rows >= 1"
                    );
                }
                if !(0.0..=1.0).contains(edge_prob) {
                    bail_setting!(
                        "table.edge_prob",
                        "`table.edge_prob` = {edge_prob} is not a probability"
                    );
                }
            }
            TableSection::Cdc {
                split, test_every, ..
            } => {
                let n = cdc_split(split).context("[table]")?.clients().len();
                if clients != n {
                    bail_setting!(
                        "clients",
                        "the CDC file split by {split} has {n} clients; set `clients = {n}`"
                    );
                }
                if *test_every < 2 {
                    bail_setting!(
                        "table.test_every",
                        "`table.test_every` = {test_every}: use 2 or more"
                    );
                }
            }
        }
        Ok(())
    }
}

/// The CDC client split called `name`.
pub fn cdc_split(name: &str) -> Result<CdcSplit> {
    match name {
        "residence_status" => Ok(CdcSplit::ResidenceStatus),
        "birth_quarter" => Ok(CdcSplit::BirthQuarter),
        other => {
            bail_setting!(
                "table.split",
                "split = {other:?}: use \"residence_status\" or \"birth_quarter\""
            )
        }
    }
}

/// Network kinds: the two named architectures, a layer list, or a zoo network (which expands
/// to a layer list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelKind {
    /// Fully connected, ReLU.
    #[serde(rename = "mlp")]
    Mlp,
    /// LeNet-5.
    #[serde(rename = "lenet5")]
    Lenet5,
    /// `model.layers`, PyTorch's `nn.Sequential` of them.
    #[serde(rename = "sequential")]
    Sequential,
    /// LEAF's FEMNIST CNN.
    #[serde(rename = "cnn-leaf")]
    CnnLeaf,
    /// FedMA's VGG-9.
    #[serde(rename = "vgg9")]
    Vgg9,
    /// CIFAR ResNet-20 (`model.norm`, `model.width`).
    #[serde(rename = "resnet20")]
    Resnet20,
    /// torchvision's ResNet-18, with its tensor names (`model.norm`, `model.width`).
    #[serde(rename = "resnet18")]
    Resnet18,
    /// torchvision's ResNet-34, with its tensor names (`model.norm`, `model.width`).
    #[serde(rename = "resnet34")]
    Resnet34,
    /// torchvision's ResNet-50 (bottleneck blocks), with its tensor names (`model.norm`,
    /// `model.width`).
    #[serde(rename = "resnet50")]
    Resnet50,
    /// torchvision's Vision Transformer (`[model.vit]`), with its tensor names.
    #[serde(rename = "vit")]
    Vit,
}

impl ModelKind {
    /// The zoo network of this kind, if it is one.
    pub fn zoo(self) -> Option<ZooModel> {
        match self {
            Self::CnnLeaf => Some(ZooModel::CnnLeaf),
            Self::Vgg9 => Some(ZooModel::Vgg9),
            Self::Resnet20 => Some(ZooModel::Resnet20),
            Self::Resnet18 => Some(ZooModel::Resnet18),
            Self::Resnet34 => Some(ZooModel::Resnet34),
            Self::Resnet50 => Some(ZooModel::Resnet50),
            Self::Mlp | Self::Lenet5 | Self::Sequential | Self::Vit => None,
        }
    }

    /// The name `[model] kind` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mlp => "mlp",
            Self::Lenet5 => "lenet5",
            Self::Sequential => "sequential",
            Self::CnnLeaf => "cnn-leaf",
            Self::Vgg9 => "vgg9",
            Self::Resnet20 => "resnet20",
            Self::Resnet18 => "resnet18",
            Self::Resnet34 => "resnet34",
            Self::Resnet50 => "resnet50",
            Self::Vit => "vit",
        }
    }

    /// Whether the network is a layer list (`sequential` or a zoo network).
    pub fn is_list(self) -> bool {
        !matches!(self, Self::Mlp | Self::Lenet5)
    }
}

/// `[model]`
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// `mlp`, `lenet5`, `sequential`, or a zoo network: `cnn-leaf`, `vgg9`, `resnet20`.
    pub kind: ModelKind,
    /// Hidden widths (MLP only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<usize>,
    /// The layers of `kind = "sequential"`; a zoo network's run folder lists its expansion
    /// here, which must then match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerSpec>,
    /// The residual networks' normalisation: `batch` (default), `group` (2 groups) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm: Option<BlockNorm>,
    /// The residual networks' first-stage width (16 for ResNet-20, 64 for ResNet-18, 34 and 50;
    /// later stages have 2, 4 (and 8) times it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<usize>,
    /// `kind = "vit"`'s settings: `patch`, `hidden`, `layers` (encoder blocks), `heads`, `mlp`,
    /// `dropout`, `attention_dropout`, torchvision's `VisionTransformer` arguments (patch 4,
    /// hidden 128, 6 layers, 4 heads, mlp 256 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vit: Option<VitShape>,
    /// Initialisation: `default` (PyTorch's) or `pfnm` (N(0, 0.1) weights, 0.1 biases).
    #[serde(default)]
    pub init: Init,
    /// Start from these weights (a PyTorch `state_dict` as `.safetensors`, or `.npz`) instead
    /// of a fresh initialisation; their names and shapes must be the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// FedBN (Li et al. 2021): every normalisation layer's tensors (scales, shifts, running
    /// statistics) stay on the clients, neither sent nor aggregated; layer lists with norms
    /// only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local_norm: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Optimizer names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    /// SGD with optional momentum.
    #[default]
    Sgd,
    /// Adam.
    Adam,
    /// AMSGrad.
    Amsgrad,
}

/// `[train]`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// `sgd`, `adam` or `amsgrad`.
    pub optimizer: OptimizerName,
    /// Learning rate.
    pub lr: f64,
    /// Local epochs per round.
    pub epochs: usize,
    /// Mini-batch size.
    pub batch_size: usize,
    /// SGD momentum.
    pub momentum: f64,
    /// L2 weight decay.
    pub weight_decay: f64,
    /// Adam beta1.
    pub beta1: f64,
    /// Adam beta2.
    pub beta2: f64,
    /// Adam epsilon.
    pub eps: f64,
    /// Dropout probability on the fully connected hidden layers, 0 for none.
    pub dropout: f64,
    /// Most memory, in MiB, one worker thread may need to train a batch or score an
    /// evaluation chunk ([`fedfuse_train::estimate_memory`]); a model and batch size that need
    /// more are refused at load, naming the heaviest layer.
    #[serde(skip_serializing_if = "is_default_memory")]
    pub max_memory_mb: u64,
}

/// Default of `train.max_memory_mb`: 8 GiB a thread, ten times what VGG-9 needs at batch 64.
pub const DEFAULT_MAX_MEMORY_MB: u64 = 8192;

fn is_default_memory(mb: &u64) -> bool {
    *mb == DEFAULT_MAX_MEMORY_MB
}

impl Default for TrainSection {
    /// The trainer's defaults, with Adam's moments for when `optimizer` names it.
    fn default() -> Self {
        let train = TrainConfig::default();
        let (momentum, weight_decay) = match train.optimizer {
            OptimizerConfig::Sgd {
                momentum,
                weight_decay,
            } => (momentum, weight_decay),
            OptimizerConfig::Adam { weight_decay, .. } => (0.0, weight_decay),
        };
        Self {
            optimizer: OptimizerName::Sgd,
            lr: train.lr,
            epochs: train.epochs,
            batch_size: train.batch_size,
            momentum,
            weight_decay,
            beta1: OptimizerConfig::ADAM_BETA1,
            beta2: OptimizerConfig::ADAM_BETA2,
            eps: OptimizerConfig::ADAM_EPS,
            dropout: train.dropout,
            max_memory_mb: DEFAULT_MAX_MEMORY_MB,
        }
    }
}

impl TrainSection {
    /// Refuses keys in `[train]` that the chosen optimizer does not read (they would silently
    /// do nothing): `beta1`, `beta2`, `eps` with SGD, `momentum` with Adam or AMSGrad.
    pub(super) fn check_keys_used(&self, given: &toml::Table) -> Result<()> {
        // A default value is let through: a resolved config.toml lists every key.
        let defaults = TrainSection::default();
        let unused: &[(&str, f64, f64)] = match self.optimizer {
            OptimizerName::Sgd => &[
                ("beta1", self.beta1, defaults.beta1),
                ("beta2", self.beta2, defaults.beta2),
                ("eps", self.eps, defaults.eps),
            ],
            OptimizerName::Adam | OptimizerName::Amsgrad => {
                &[("momentum", self.momentum, defaults.momentum)]
            }
        };
        if let Some((key, ..)) = unused
            .iter()
            .find(|(k, v, d)| given.contains_key(*k) && v != d)
        {
            bail_setting!(
                format!("train.{key}"),
                "`train.{key}` does nothing with `train.optimizer = \"{}\"`; remove it or choose \
                 an optimizer that uses it",
                match self.optimizer {
                    OptimizerName::Sgd => "sgd",
                    OptimizerName::Adam => "adam",
                    OptimizerName::Amsgrad => "amsgrad",
                }
            );
        }
        Ok(())
    }

    /// Refuses a model whose batch of `train.batch_size` (or evaluation chunk) needs more
    /// than `train.max_memory_mb` on one thread, naming the heaviest layer and what to lower.
    pub fn check_memory(&self, spec: &ModelSpec) -> Result<()> {
        let need = fedfuse_train::estimate_memory(spec, self.batch_size, 1)
            .map_err(crate::LabError::from)?;
        let limit = self.max_memory_mb.saturating_mul(1 << 20);
        if need.peak() > limit {
            let mib = |b: u64| b.div_ceil(1 << 20);
            let (i, kind, bytes) = need.heaviest;
            let layer = match spec.layer_list().is_empty() {
                true => format!("layer {i} of the network ({kind}"),
                false => format!("model.layers[{i}] ({kind}"),
            };
            bail_setting!(
                "train.max_memory_mb",
                "the model needs about {} MiB per thread to train a batch of {} ({} MiB) or to \
                 score {} samples at a time ({} MiB), above `train.max_memory_mb` = {}; its \
                 heaviest layer is {layer}, about {} MiB): lower \
                 `train.batch_size`, or that layer's width, padding or kernel (or raise \
                 `train.max_memory_mb` on a machine that has the memory)",
                mib(need.peak()),
                self.batch_size,
                mib(need.train_bytes),
                fedfuse_train::memory::EVAL_BATCH,
                mib(need.eval_bytes),
                self.max_memory_mb,
                mib(bytes)
            );
        }
        Ok(())
    }

    /// The trainer's typed settings.
    pub fn to_train_config(&self) -> TrainConfig {
        let optimizer = match self.optimizer {
            OptimizerName::Sgd => OptimizerConfig::Sgd {
                momentum: self.momentum,
                weight_decay: self.weight_decay,
            },
            OptimizerName::Adam | OptimizerName::Amsgrad => OptimizerConfig::Adam {
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                weight_decay: self.weight_decay,
                amsgrad: self.optimizer == OptimizerName::Amsgrad,
            },
        };
        TrainConfig {
            optimizer,
            lr: self.lr,
            epochs: self.epochs,
            batch_size: self.batch_size,
            dropout: self.dropout,
        }
    }
}

impl ModelSection {
    /// Refuses keys the kind does not read: they would silently do nothing.
    pub(super) fn check_keys(&self) -> Result<()> {
        let kind = self.kind.name();
        if !self.hidden.is_empty() && self.kind != ModelKind::Mlp {
            bail_setting!(
                "model.hidden",
                "model.hidden applies to `mlp` only; remove it for `{kind}`"
            );
        }
        if !self.layers.is_empty() && !self.kind.is_list() {
            bail_setting!(
                "model.layers",
                "model.layers applies to `sequential` (and lists a zoo network's expansion); \
                 remove it for `{kind}`, or set model.kind = \"sequential\""
            );
        }
        if self.kind == ModelKind::Sequential && self.layers.is_empty() {
            bail_setting!(
                "model.kind",
                "model.kind = \"sequential\" needs model.layers, e.g. [{{ type = \"flatten\" }}, \
                 {{ type = \"linear\", out = 10 }}]"
            );
        }
        if !self.kind.zoo().is_some_and(ZooModel::is_resnet) {
            for (key, given) in [
                ("norm", self.norm.is_some()),
                ("width", self.width.is_some()),
            ] {
                if given {
                    bail_setting!(
                        format!("model.{key}"),
                        "model.{key} applies to the residual networks (resnet20, resnet18, \
                         resnet34, resnet50) only; remove it for `{kind}`"
                    );
                }
            }
        }
        if self.vit.is_some() && self.kind != ModelKind::Vit {
            bail_setting!(
                "model.vit",
                "[model.vit] applies to `vit` only; remove it for `{kind}`"
            );
        }
        if let Some(v) = &self.vit {
            // Bounds before any list is built: the layer list has `layers` entries.
            for (key, value, most) in [
                ("patch", v.patch, 1024),
                ("hidden", v.hidden, 1 << 16),
                ("layers", v.layers, 256),
                ("heads", v.heads, 1024),
                ("mlp", v.mlp, 1 << 18),
            ] {
                if !(1..=most).contains(&value) {
                    bail_setting!(
                        format!("model.vit.{key}"),
                        "model.vit.{key} = {value} must lie in 1..={most}"
                    );
                }
            }
            if !v.mlps.is_empty() && v.mlps.len() != v.layers {
                bail_setting!(
                    "model.vit.mlps",
                    "model.vit.mlps has {} widths for {} blocks: give one per block, or none \
                     (every block then has model.vit.mlp)",
                    v.mlps.len(),
                    v.layers
                );
            }
            if let Some(m) = v.mlps.iter().find(|m| !(1..=1 << 18).contains(*m)) {
                bail_setting!(
                    "model.vit.mlps",
                    "model.vit.mlps holds {m}; each width must lie in 1..={}",
                    1 << 18
                );
            }
            if v.hidden % v.heads != 0 {
                bail_setting!(
                    "model.vit.heads",
                    "model.vit.heads = {} must divide model.vit.hidden = {} (each head reads \
                     hidden / heads features)",
                    v.heads,
                    v.hidden
                );
            }
            for (key, p) in [
                ("dropout", v.dropout),
                ("attention_dropout", v.attention_dropout),
            ] {
                if !(0.0..1.0).contains(&p) {
                    bail_setting!(
                        format!("model.vit.{key}"),
                        "model.vit.{key} = {p} must lie in [0, 1)"
                    );
                }
            }
        }
        if let Some(w) = self.width
            && !(1..=1024).contains(&w)
        {
            bail_setting!(
                "model.width",
                "model.width = {w} must lie in 1..=1024 (16 for resnet20, 64 for resnet18, \
                 resnet34 and resnet50)"
            );
        }
        if self.init_from.is_some() && self.init != Init::Default {
            bail_setting!(
                "model.init",
                "model.init_from gives the weights; remove model.init"
            );
        }
        Ok(())
    }

    /// Whether the network has batch norms (whose running statistics are data statistics).
    pub fn has_batch_norm(&self) -> bool {
        match self.kind {
            ModelKind::Resnet20
            | ModelKind::Resnet18
            | ModelKind::Resnet34
            | ModelKind::Resnet50 => self.norm.unwrap_or_default() == BlockNorm::Batch,
            ModelKind::Sequential => self.layers.iter().any(|l| match l {
                LayerSpec::BatchNorm1d { .. } | LayerSpec::BatchNorm2d { .. } => true,
                _ => l.block().is_some_and(|b| b.norm == BlockNorm::Batch),
            }),
            ModelKind::Mlp
            | ModelKind::Lenet5
            | ModelKind::CnnLeaf
            | ModelKind::Vgg9
            | ModelKind::Vit => false,
        }
    }

    /// Whether the network has normalisation layers (batch, group or layer norms, in the list
    /// or inside residual blocks): what `local_norm` keeps on the clients.
    pub fn has_norm(&self) -> bool {
        let has = |layers: &[LayerSpec]| {
            layers.iter().any(|l| match l.block() {
                Some(b) => b.norm != BlockNorm::None,
                None => l.is_norm(),
            })
        };
        // The class count does not change which layers a network has.
        match self.zoo_layers(10) {
            Some(layers) => has(&layers),
            None => has(&self.layers),
        }
    }

    /// torchvision's tensor names for this network (ResNet-18, 34 and 50, the Vision
    /// Transformer), which its files use.
    pub fn torchvision_names(&self) -> Option<TorchvisionNames> {
        // The names follow from the list's structure, which the class count does not change.
        let layers = self.zoo_layers(1)?;
        match self.kind.zoo() {
            Some(zoo) => zoo.torchvision_names(&layers),
            None => Some(TorchvisionNames::of(&layers)),
        }
    }

    /// The layer list a zoo network or the Vision Transformer expands to for `classes`
    /// classes; `None` for the other kinds.
    fn zoo_layers(&self, classes: usize) -> Option<Vec<LayerSpec>> {
        match (self.kind, self.kind.zoo()) {
            (ModelKind::Vit, _) => Some(self.vit.clone().unwrap_or_default().layers(classes)),
            (_, Some(zoo)) => {
                Some(zoo.layers(classes, self.norm.unwrap_or_default(), self.width(zoo)))
            }
            (_, None) => None,
        }
    }

    /// A residual network's first-stage width: `model.width`, else the paper's.
    fn width(&self, zoo: ZooModel) -> usize {
        self.width.unwrap_or(zoo.default_width())
    }

    /// This section as a run folder's config.toml shows it: a zoo network with the layer list
    /// it expanded to.
    pub fn showing_layers(&self, spec: &ModelSpec) -> Self {
        let mut shown = self.clone();
        if self.kind.zoo().is_some() || self.kind == ModelKind::Vit {
            shown.layers = spec.layer_list().to_vec();
        }
        shown
    }

    /// The architecture for samples of `sample_shape` and `classes` classes.
    pub fn spec(&self, sample_shape: &[usize], classes: usize) -> Result<ModelSpec> {
        self.check_keys()?;
        let kind = self.kind.name();
        let image = || match sample_shape {
            [c, h, w] => Ok([*c, *h, *w]),
            _ => Err(crate::LabError::Invalid(format!(
                "model.kind = \"{kind}\" needs image samples [channels, height, width]; this \
                 dataset's samples have shape {sample_shape:?}: use model.kind = \"mlp\""
            ))),
        };
        let spec = match self.kind {
            ModelKind::Mlp => ModelSpec::mlp(sample_shape.iter().product(), &self.hidden, classes),
            ModelKind::Lenet5 => {
                let [c, h, w] = image()?;
                if h != w {
                    bail_setting!(
                        "model.kind",
                        "model.kind = \"lenet5\" needs square images, got {h}x{w}"
                    );
                }
                ModelSpec::LeNet5 {
                    channels: c,
                    side: h,
                    classes,
                }
            }
            ModelKind::Sequential => ModelSpec::sequential(sample_shape, self.layers.clone()),
            ModelKind::CnnLeaf
            | ModelKind::Vgg9
            | ModelKind::Resnet20
            | ModelKind::Resnet18
            | ModelKind::Resnet34
            | ModelKind::Resnet50
            | ModelKind::Vit => {
                image()?;
                let layers = self.zoo_layers(classes).unwrap_or_default();
                if !self.layers.is_empty() && self.layers != layers {
                    bail_setting!(
                        "model.layers",
                        "model.layers differs from `{kind}`'s layers for this data; remove \
                         model.layers, or set model.kind = \"sequential\" to change them"
                    );
                }
                ModelSpec::sequential(sample_shape, layers)
            }
        };
        spec.validate().context("model")?;
        if spec.classes() < classes {
            bail_setting!(
                "model.layers",
                "the model gives {} outputs but the data has {classes} classes: make the last \
                 layer's `out` {classes}",
                spec.classes()
            );
        }
        if spec.num_params() > MAX_PARAMS {
            // The tensor holding most parameters, named as the config names its layer.
            let largest = spec
                .param_shapes()
                .into_iter()
                .max_by_key(|t| t.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d)));
            let what = match (&largest, self.kind) {
                (Some(t), ModelKind::Mlp) => format!(
                    "its largest tensor is `{}` {:?}: use smaller `model.hidden` widths",
                    t.name, t.shape
                ),
                (Some(t), _) => {
                    let layer = t.name.split('.').next().unwrap_or_default();
                    let kind = layer
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| spec.layer_list().get(i))
                        .map_or("", |l| l.type_name());
                    format!(
                        "its largest tensor is `{}` {:?}, of model.layers[{layer}] ({kind}): \
                         lower that layer's width",
                        t.name, t.shape
                    )
                }
                (None, _) => String::new(),
            };
            bail_setting!(
                "model",
                "the model has {} parameters, above the limit of {MAX_PARAMS}; {what}",
                spec.num_params()
            );
        }
        Ok(spec)
    }
}
