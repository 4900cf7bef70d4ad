//! The experiment config: TOML with `deny_unknown_fields`, `--set` overrides, one `check()`.
mod file;
mod sections;

use file::apply_override;
pub use file::{load_checked, read_settings_file};
pub use sections::{
    DatasetSection, FemnistClasses, ModelKind, ModelSection, OptimizerName, Score, TableSection,
    TrainSection, cdc_split, permutation_seed,
};

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use crate::error::{Context, Result, bail_setting};
use fedfuse_core::Params;
use fedfuse_data::PartitionSpec;
use fedfuse_fed::{
    BatchNormSettings, BuildContext, ClientsPerRound, DpSampling, FedNgmConfig, FedNgrConfig,
    LocalNorm, Method, MethodConfig, PrivacySettings, ReplyBounds, Sampling, ServerStepConfig,
    SimConfig,
};
use serde::{Deserialize, Serialize};

/// At most this many rounds: a typo such as `rounds = 1e15` is refused at load instead of
/// aborting on an allocation later.
pub const MAX_ROUNDS: usize = 1_000_000;
/// At most this many clients.
pub const MAX_CLIENTS: usize = 10_000_000;
/// At most this many units in one hidden layer.
pub const MAX_WIDTH: usize = 1_000_000;
/// At most this many parameters in the model (2 GB of f32 per copy); checked once the data
/// fixes the input size, before anything is allocated.
pub const MAX_PARAMS: usize = 500_000_000;

/// A whole experiment, as written in `CONFIG.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Seed of every random choice.
    #[serde(default)]
    pub seed: u64,
    /// Communication rounds.
    pub rounds: usize,
    /// Number of clients the data is split into.
    pub clients: usize,
    /// Clients per round: an integer count or a fraction in (0, 1].
    #[serde(default = "all_clients")]
    pub clients_per_round: ClientsPerRound,
    /// How each round's clients are drawn: exactly `clients_per_round` (`fixed`, Flower's
    /// way), or each client with probability `clients_per_round` (`poisson`, what DP's
    /// accountant amplifies by).
    #[serde(default, skip_serializing_if = "is_fixed")]
    pub sampling: Sampling,
    /// Folder holding the dataset's files (overrides the cache; `--data-dir` overrides this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Evaluate the global model on every client's local test split each round (classifier
    /// methods).
    #[serde(default = "yes")]
    pub local_eval: bool,
    /// Evaluate the global model after every `eval_every`-th round and after the last (1:
    /// every round); the rounds between report NaN accuracies. For long runs, where the
    /// evaluation costs more than the clients' training.
    #[serde(default = "every_round", skip_serializing_if = "is_every_round")]
    pub eval_every: NonZeroUsize,
    /// The dataset of labelled samples (classifier methods); tabular methods take `table`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetSection>,
    /// The clients' tables (tabular methods: `fedngm`, `fedngr`) instead of a dataset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableSection>,
    /// How the training set is split among clients.
    #[serde(default = "iid")]
    pub partition: PartitionSpec,
    /// The federated method and its parameters.
    pub method: MethodConfig,
    /// A server optimizer step after the method's aggregate (e.g. Adam on the difference, as
    /// fedsparse-em runs FedDrop and FedL1); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerStepConfig>,
    /// Bounds on replies (`max_examples`, `max_update_norm`); a reply outside them is
    /// rejected with the reason. None by default.
    #[serde(default, skip_serializing_if = "ReplyBounds::is_none")]
    pub replies: ReplyBounds,
    /// Differential privacy (central with fixed or adaptive clipping, or local); none by
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<PrivacySettings>,
    /// A statistics round after every round of the method, re-estimating the global model's
    /// batch norm statistics on the clients' data; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_norm: Option<BatchNormSettings>,
    /// The network (classifier methods; FedNGM's networks are set in `[method.local]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSection>,
    /// Local training.
    #[serde(default)]
    pub train: TrainSection,
    /// Where the run also writes its figures (`[logging]`): an output location like `--out`,
    /// not a setting of the run, so it stays out of the resolved config (a resumed run may
    /// log elsewhere).
    #[serde(default, skip_serializing)]
    pub logging: LoggingSection,
}

/// `[logging]`: extra outputs of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSection {
    /// A folder for TensorBoard event files (created if missing).
    #[serde(default)]
    pub tensorboard: Option<PathBuf>,
}

fn all_clients() -> ClientsPerRound {
    ClientsPerRound::Fraction(1.0)
}

fn is_fixed(s: &Sampling) -> bool {
    *s == Sampling::Fixed
}
fn yes() -> bool {
    true
}
fn every_round() -> NonZeroUsize {
    NonZeroUsize::MIN
}
fn is_every_round(n: &NonZeroUsize) -> bool {
    *n == NonZeroUsize::MIN
}
fn iid() -> PartitionSpec {
    PartitionSpec::Iid {}
}

impl Config {
    /// Reads `path`, applies `--set key.path=value` overrides, and checks the result.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = read_settings_file(path, "config")?;
        Self::parse(&text, overrides).with_context(|| format!("config {}", path.display()))
    }

    /// Parses TOML text with overrides.
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        let mut value: toml::Table = toml::from_str(text)?;
        for o in overrides {
            apply_override(&mut value, o)?;
        }
        let cfg: Config = toml::Value::Table(value.clone()).try_into()?;
        if let Some(toml::Value::Table(train)) = value.get("train") {
            cfg.train.check_keys_used(train)?;
        }
        cfg.check()?;
        Ok(cfg)
    }

    /// Range checks that serde cannot express; everything after trusts them.
    pub fn check(&self) -> Result<()> {
        if self.rounds == 0 {
            bail_setting!("rounds", "`rounds` must be at least 1");
        }
        if self.rounds > MAX_ROUNDS {
            bail_setting!(
                "rounds",
                "`rounds` = {} is above the limit of {MAX_ROUNDS}; split a longer study into \
                 runs",
                self.rounds
            );
        }
        if self.clients == 0 {
            bail_setting!("clients", "`clients` must be at least 1");
        }
        if self.clients > MAX_CLIENTS {
            bail_setting!(
                "clients",
                "`clients` = {} is above the limit of {MAX_CLIENTS}",
                self.clients
            );
        }
        match self.clients_per_round {
            ClientsPerRound::Count(0) => bail_setting!(
                "clients_per_round",
                "`clients_per_round` must be at least 1"
            ),
            ClientsPerRound::Count(c) if c > self.clients => bail_setting!(
                "clients_per_round",
                "`clients_per_round` = {c} is more than the {} clients; use at most {} (or a \
                 fraction such as 0.1)",
                self.clients,
                self.clients
            ),
            ClientsPerRound::Fraction(f) if !(f > 0.0 && f <= 1.0) => bail_setting!(
                "clients_per_round",
                "`clients_per_round` = {f} is neither a count (an integer) nor a fraction in (0, 1]"
            ),
            _ => {}
        }
        self.replies.check()?;
        if self.replies.max_update_norm.is_some()
            && (self.method.matching()
                || matches!(
                    self.method,
                    MethodConfig::FedSparse(_)
                        | MethodConfig::FedDrop(_)
                        | MethodConfig::FedMix(_)
                        | MethodConfig::FedNgm(_)
                        | MethodConfig::FedNgr(_)
                ))
        {
            bail_setting!(
                "replies.max_update_norm",
                "`replies.max_update_norm` measures a reply against the global model, and \
                 `{}`'s replies are not models of its layout (own-init, sparse or sub-models, \
                 statistics); remove it",
                self.method.name()
            );
        }
        if self.partition.kind() == "pachinko"
            && let Some(d) = &self.dataset
            && d.name != "cifar100"
        {
            bail_setting!(
                "partition.kind",
                "`partition.kind = \"pachinko\"` splits CIFAR-100 by its superclasses, then its \
                 classes: set `dataset.name = \"cifar100\"` (dataset `{}` has no superclasses)",
                d.name
            );
        }
        let femnist = self.dataset.as_ref().is_some_and(|d| d.name == "femnist");
        if let Some(column) = self.partition.column() {
            let by_writer = femnist
                && column == fedfuse_data::WRITER_COLUMN
                && !matches!(self.partition, PartitionSpec::Continuous { .. });
            if !by_writer {
                bail_setting!(
                    "partition.kind",
                    "`partition.kind` = \"{}\" splits by the column `{column}`; of the datasets \
                     of `fedfuse run` only femnist has a per-sample column, `{}` (its writers, \
                     for `natural_id` and `grouped_natural_id`); use it through the library \
                     (`partition_with` on a CSV table's column) or pick a label- or size-based \
                     kind",
                    self.partition.kind(),
                    fedfuse_data::WRITER_COLUMN
                );
            }
        }
        if let Some(d) = &self.dataset
            && d.classes != FemnistClasses::All
            && !femnist
        {
            bail_setting!(
                "dataset.classes",
                "`dataset.classes` chooses FEMNIST's digits or letters; dataset `{}` keeps \
                 its classes: remove the key",
                d.name
            );
        }
        if let Err(e) = self
            .partition
            .check()
            .and_then(|()| self.partition.check_clients(self.clients))
        {
            match e {
                fedfuse_data::DataError::InvalidArgument { field, msg } => {
                    bail_setting!(format!("partition.{field}"), "`partition.{field}`: {msg}")
                }
                other => return Err(other.into()),
            }
        }
        if let Some(fedngm) = self.tabular() {
            return self.check_tabular(fedngm);
        }
        if self.table.is_some() {
            bail_setting!(
                "method.name",
                "method `{}` trains classifiers on labelled samples; [table] is for `fedngm` and \
                 `fedngr`: give [dataset] and [model] instead",
                self.method.name()
            );
        }
        let (Some(dataset), Some(model)) = (&self.dataset, &self.model) else {
            bail_setting!(
                "method.name",
                "method `{}` needs a [dataset] and a [model] section",
                self.method.name()
            );
        };
        if let Some((i, &w)) = model
            .hidden
            .iter()
            .enumerate()
            .find(|&(_, &w)| w > MAX_WIDTH)
        {
            bail_setting!(
                "model.hidden",
                "`model.hidden[{i}]` = {w} is above the limit of {MAX_WIDTH} units per layer"
            );
        }
        if dataset.permuted_clients > self.clients {
            bail_setting!(
                "dataset.permuted_clients",
                "`dataset.permuted_clients` = {} is more than the {} clients: give at most {} \
                 (the last clients see permuted features), or 0 for none",
                dataset.permuted_clients,
                self.clients,
                self.clients
            );
        }
        if !(0.0..1.0).contains(&dataset.local_test_fraction) {
            bail_setting!(
                "dataset.local_test_fraction",
                "`dataset.local_test_fraction` = {} must lie in [0, 1)",
                dataset.local_test_fraction
            );
        }
        self.train
            .to_train_config()
            .check()
            .map_err(crate::LabError::from)?;
        if self.train.max_memory_mb == 0 {
            bail_setting!(
                "train.max_memory_mb",
                "`train.max_memory_mb` must be at least 1 (MiB per thread)"
            );
        }
        if self.train.epochs == 0 {
            // Zero epochs trains nothing, and every method's reply then lacks the training
            // metrics it reports: refused here rather than as a rejected reply per client.
            bail_setting!("train.epochs", "`train.epochs` must be at least 1");
        }
        if let Some(f) = dataset.validation_fraction
            && !(0.0..1.0).contains(&f)
        {
            bail_setting!(
                "dataset.validation_fraction",
                "`dataset.validation_fraction` = {f} must lie in [0, 1)"
            );
        }
        if dataset.score == Score::Validation && self.validation_fraction() == 0.0 {
            bail_setting!(
                "dataset.score",
                "`dataset.score = \"validation\"` scores on the server's validation split: set \
                 `dataset.validation_fraction` above 0 (e.g. 0.1)"
            );
        }
        if self.method.needs_validation() && self.validation_fraction() == 0.0 {
            bail_setting!(
                "method.name",
                "method `{}` chooses eps on a server validation split: set \
                 `dataset.validation_fraction` above 0 (e.g. 0.1), or a single `method.eps`",
                self.method.name()
            );
        }
        if self.method.mlp_only() && model.kind != ModelKind::Mlp {
            bail_setting!(
                "method.name",
                "method `{}` matches the hidden units of MLPs: set `model.kind = \"mlp\"`",
                self.method.name()
            );
        }
        model.check_keys()?;
        if model.kind.is_list() {
            self.check_list_model(model)?;
        }
        if model.local_norm {
            self.check_local_norm(model, dataset)?;
        }
        self.check_method()
    }

    /// `model.local_norm` (FedBN): a model with norms, a method whose server step does not
    /// need the norms, and the clients' own test splits to score their models on.
    fn check_local_norm(&self, model: &ModelSection, dataset: &DatasetSection) -> Result<()> {
        let kind = model.kind.name();
        let name = self.method.name();
        if !model.has_norm() {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` keeps every normalisation layer's tensors on the clients \
                 (FedBN), and `{kind}` has no normalisation layer: add batchnorm1d, \
                 batchnorm2d, groupnorm or layernorm layers to a layer list (or use resnet20 \
                 with its norms), or remove model.local_norm"
            );
        }
        if !self.local_eval {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` is scored as FedBN reports it, each client's model (the \
                 global weights with its own norms) on its own test split: set \
                 `local_eval = true` (the global model alone keeps the initial norms)"
            );
        }
        if dataset.local_test_fraction == 0.0 {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` is scored on the clients' own test splits, and \
                 `dataset.local_test_fraction` = 0 leaves them none: set it above 0 (e.g. 0.2)"
            );
        }
        let grouped = matches!(
            self.method,
            MethodConfig::FedSparse(_) | MethodConfig::FedL1(_)
        );
        if grouped {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` with method `{name}`: its groups are a filter or unit \
                 together with the norm channel after it, and under local_norm that channel's \
                 scale and shift stay on the clients, so the server could neither measure nor \
                 zero a whole group (a zeroed filter would still pass the client's shift); use \
                 fedavg, fedprox, fedopt, fedmedian, fedtrimmedavg, krum, bulyan or fedmix, or \
                 remove model.local_norm"
            );
        }
        if matches!(self.method, MethodConfig::FedDrop(_)) {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` with method `feddrop`: it drops a filter or unit together \
                 with the norm channel after it, and under local_norm that channel's scale, \
                 shift and statistics stay on the clients, where the dropped channel's would \
                 come back as the zeros it trained with; use fedavg, fedprox, fedopt, \
                 fedmedian, fedtrimmedavg, krum, bulyan or fedmix, or remove model.local_norm"
            );
        }
        if matches!(&self.method, MethodConfig::FedMix(s) if s.mixture_term) {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` with `method.mixture_term = true`: the prior would pull the \
                 clients' own norms towards the server's centres, which FedBN leaves \
                 unaggregated; set mixture_term = false or remove model.local_norm"
            );
        }
        if matches!(self.privacy, Some(PrivacySettings::Local { .. })) {
            bail_setting!(
                "model.local_norm",
                "`model.local_norm` with local DP: the clients would clip and noise their own \
                 norms too, which never leave them; use central DP (kind = \"central-fixed\" or \
                 \"central-adaptive\") or remove model.local_norm"
            );
        }
        Ok(())
    }

    /// What layer lists cannot do yet, or cannot do by design, refused by name.
    fn check_list_model(&self, model: &ModelSection) -> Result<()> {
        if self.train.dropout > 0.0 {
            bail_setting!(
                "train.dropout",
                "`train.dropout` acts on the hidden layers of `mlp` and `lenet5`; a layer list \
                 has its own: add {{ type = \"dropout\", p = {} }} layers to model.layers (or \
                 remove train.dropout)",
                self.train.dropout
            );
        }
        // GEMS was refused above: it fuses MLPs. PFNM, GPI-FNM, weight matching and FedMA
        // refuse, at build, the layers they cannot match (naming the layer). FedDrop refuses, at
        // build, the norms it cannot drop a unit from (it names the layer).
        if let Some(bn) = &self.batch_norm {
            if model.local_norm {
                bail_setting!(
                    "batch_norm",
                    "[batch_norm] re-estimates the global model's batch norm statistics, which \
                     `model.local_norm` keeps on each client; remove one of them"
                );
            }
            if bn.reestimate && self.replies.max_update_norm.is_some() {
                bail_setting!(
                    "replies.max_update_norm",
                    "`replies.max_update_norm` measures a reply against the global model, and \
                     [batch_norm]'s statistics replies hold only the batch norms' statistics; \
                     remove it"
                );
            }
        }
        if self.privacy.is_some() && model.has_batch_norm() {
            bail_setting!(
                "privacy",
                "[privacy] clips and noises the model's parameters, but batch norm's running \
                 statistics are statistics of the clients' data that it would not cover: use \
                 group norm (`model.norm = \"group\"` for resnet20, `groupnorm` layers) or none"
            );
        }
        Ok(())
    }

    /// The `[method]` table's settings, and the `[privacy]` and `[server]` tables with the
    /// method they wrap; the architecture and validation split come at run time.
    fn check_method(&self) -> Result<()> {
        self.method.check()?;
        if let Some(privacy) = &self.privacy {
            privacy.check_for(&self.method)?;
            DpSampling::of(&self.sim_sampling(), self.clients)?;
        }
        if let Some(server) = &self.server {
            server.check_for(&self.method)?;
        }
        Ok(())
    }

    /// Who takes part in a round, as the privacy accountant needs it.
    fn sim_sampling(&self) -> SimConfig {
        SimConfig {
            clients_per_round: self.clients_per_round,
            sampling: self.sampling,
            ..SimConfig::default()
        }
    }

    /// The method of `[method]`, inside its `[privacy]` wrapper, then its `[server]` step,
    /// then FedBN's (`model.local_norm`), outermost, whose clients start their norms from
    /// `init`'s.
    pub fn build_method(&self, ctx: BuildContext, init: &Params) -> Result<Box<dyn Method>> {
        let seed = ctx.seed;
        let spec = ctx.spec.clone();
        let mut method = self.method.build_with(ctx)?;
        if let Some(privacy) = &self.privacy {
            let sampling = DpSampling::of(&self.sim_sampling(), self.clients)?;
            method = privacy.wrap(method, sampling, seed)?;
        }
        if let Some(server) = &self.server {
            method = server.wrap(method)?;
        }
        if let Some(bn) = &self.batch_norm {
            let Some(spec) = &spec else {
                bail_setting!(
                    "batch_norm",
                    "[batch_norm] needs the model's architecture to find its batch norms"
                );
            };
            method = bn.wrap(method, spec)?;
        }
        if self.model.as_ref().is_some_and(|m| m.local_norm) {
            let Some(spec) = spec else {
                bail_setting!(
                    "model.local_norm",
                    "`model.local_norm` needs the model's architecture to find its norms"
                );
            };
            method = Box::new(LocalNorm::new(method, &spec, init)?);
        }
        Ok(method)
    }

    /// The settings of a tabular method (FedNGM, FedNGR), `None` for classifier methods.
    pub fn tabular(&self) -> Option<&FedNgmConfig> {
        match &self.method {
            MethodConfig::FedNgm(c) | MethodConfig::FedNgr(FedNgrConfig(c)) => Some(c),
            _ => None,
        }
    }

    /// The checks of a run of the tabular method `fedngm`.
    fn check_tabular(&self, fedngm: &FedNgmConfig) -> Result<()> {
        let name = self.method.name();
        let Some(table) = &self.table else {
            bail_setting!(
                "method.name",
                "method `{name}` federates tables: give a [table] section (kind = \"synthetic\" \
                 or \"cdc\") instead of [dataset]"
            );
        };
        if self.dataset.is_some()
            || self.model.is_some()
            || self.server.is_some()
            || self.privacy.is_some()
        {
            bail_setting!(
                "method.name",
                "method `{name}` takes its data from [table] and its networks from \
                 [method.local], and has its own server step: remove [dataset], [model], \
                 [server] and [privacy]"
            );
        }
        table.check(self.clients)?;
        // Settings for classifiers would silently do nothing (their defaults are harmless: a
        // resolved config writes them out).
        if self.partition != iid() || self.train != TrainSection::default() {
            bail_setting!(
                "partition",
                "[partition] and [train] do nothing for method `{name}`: the clients' tables come \
                 from [table] and its training settings are [method.local]; remove them"
            );
        }
        // Every stage needs every client: the consensus is over the clients' shared features
        // (Poisson sampling at rate 1 draws everyone too).
        let all = match self.clients_per_round {
            ClientsPerRound::Count(c) => c == self.clients,
            ClientsPerRound::Fraction(f) => f == 1.0,
        };
        if !all {
            bail_setting!(
                "method.name",
                "method `{name}` needs every client in every round: set clients_per_round = 1.0"
            );
        }
        if self.rounds < fedngm.stages() {
            bail_setting!(
                "method.name",
                "method `{name}` needs {} rounds (statistics, graphs, then {} model round(s) of \
                 `method.rounds`); `rounds` = {}",
                fedngm.stages(),
                fedngm.rounds,
                self.rounds
            );
        }
        self.method.check()?;
        if fedngm.gamma.is_some() {
            bail_setting!(
                "method.gamma",
                "`method.gamma` weighs the distillation's loss on public rows, and a run has \
                 none; remove it"
            );
        }
        Ok(())
    }

    /// The server's validation fraction: as set, else 0.1 when the method needs one, else 0.
    pub fn validation_fraction(&self) -> f64 {
        self.dataset
            .as_ref()
            .and_then(|d| d.validation_fraction)
            .unwrap_or(if self.method.needs_validation() {
                0.1
            } else {
                0.0
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LabError;

    const BASE: &str = r#"
seed = 1
rounds = 2
clients = 4
[dataset]
name = "digits"
[partition]
kind = "iid"
[method]
name = "fedavg"
[model]
kind = "mlp"
hidden = [16]
"#;

    #[test]
    fn overrides_reach_nested_keys() {
        let cfg = Config::parse(
            BASE,
            &[
                "partition.kind=dirichlet".into(),
                "partition.alpha=0.1".into(),
                "rounds=3".into(),
                "method.name=fedprox".into(),
                "method.mu=0.5".into(),
                "clients_per_round=2".into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.rounds, 3);
        assert!(matches!(cfg.partition, PartitionSpec::Dirichlet { alpha, .. } if alpha == 0.1));
        assert_eq!(
            cfg.method,
            MethodConfig::FedProx(fedfuse_fed::FedProxSettings { mu: 0.5 })
        );
        assert_eq!(cfg.clients_per_round, ClientsPerRound::Count(2));
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::parse(BASE, &["train.learning_rate=0.1".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("learning_rate"), "{err:#}");
        let err = Config::parse(BASE, &["method.mu=0.1".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("mu"), "{err:#}");
        let err = Config::parse(&format!("{BASE}\nbogus = 1\n"), &[]).unwrap_err();
        assert!(format!("{err:#}").contains("bogus"), "{err:#}");
    }

    #[test]
    fn a_bad_setting_carries_its_key_and_reason() {
        let key_of = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            match Config::parse(BASE, &sets).unwrap_err() {
                LabError::Setting { key, reason } => {
                    assert!(reason.contains(&key), "{key}: {reason}");
                    key
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(key_of(&["train.epochs=0"]), "train.epochs");
        assert_eq!(key_of(&["clients_per_round=9"]), "clients_per_round");
        assert_eq!(
            key_of(&["dataset.local_test_fraction=1.5"]),
            "dataset.local_test_fraction"
        );
        assert_eq!(key_of(&["model.local_norm=true"]), "model.local_norm");
    }

    #[test]
    fn ranges_are_checked() {
        assert!(Config::parse(BASE, &["rounds=0".into()]).is_err());
        assert!(Config::parse(BASE, &["train.lr=-1".into()]).is_err());
        let err = Config::parse(BASE, &["train.dropout=1".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("train.dropout"), "{err:#}");
        assert!(
            Config::parse(
                BASE,
                &["method.name=fedtrimmedavg".into(), "method.beta=0.7".into()]
            )
            .is_err()
        );
        let pfnm = |extra: &[&str]| {
            let mut o: Vec<String> = vec!["method.name=pfnm".into()];
            o.extend(extra.iter().map(|s| s.to_string()));
            Config::parse(BASE, &o).map_err(|e| format!("{e:#}"))
        };
        assert!(pfnm(&[]).is_ok());
        // PFNM matches conv channels too; GEMS stays with MLP hidden units.
        assert!(pfnm(&["model.kind=lenet5", "model.hidden=[]"]).is_ok());
        let gems_on_lenet = Config::parse(
            BASE,
            &[
                "method.name=gems".into(),
                "model.kind=lenet5".into(),
                "model.hidden=[]".into(),
            ],
        );
        assert!(format!("{:#}", gems_on_lenet.unwrap_err()).contains("mlp"));
        assert!(
            pfnm(&["rounds=1", "method.sigma=0"])
                .unwrap_err()
                .contains("sigma")
        );
        let gpi = |extra: &[&str]| {
            let mut o: Vec<String> = vec!["method.name=gpi-fnm".into()];
            o.extend(extra.iter().map(|s| s.to_string()));
            Config::parse(BASE, &o).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(gpi(&[]).unwrap().validation_fraction(), 0.1);
        assert!(
            gpi(&["dataset.validation_fraction=0"])
                .unwrap_err()
                .contains("validation_fraction")
        );
        assert!(gpi(&["dataset.validation_fraction=0", "method.eps=0.1"]).is_ok());
        assert!(gpi(&["method.eps=-1"]).unwrap_err().contains("eps"));
        assert!(
            gpi(&["method.eps_grid=[]"])
                .unwrap_err()
                .contains("eps_grid")
        );
        assert!(
            gpi(&["method.eps_grid=[0.1, -2]"])
                .unwrap_err()
                .contains("eps_grid")
        );
    }

    #[test]
    fn hostile_and_silent_settings_are_refused_at_load() {
        let err = |o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            format!("{:#}", Config::parse(BASE, &o).unwrap_err())
        };
        assert!(err(&["clients_per_round=5"]).contains("more than the 4 clients"));
        assert!(err(&["clients_per_round=0"]).contains("clients_per_round"));
        assert!(err(&["clients_per_round=1.5"]).contains("clients_per_round"));
        assert!(Config::parse(BASE, &["clients_per_round=4".into()]).is_ok());
        assert!(
            err(&["partition.kind=dirichlet", "partition.alpha=0"]).contains("partition.alpha")
        );
        assert!(
            err(&["partition.kind=dirichlet", "partition.alpha=-1"]).contains("partition.alpha")
        );
        assert!(err(&["rounds=1000000000000000"]).contains("rounds"));
        assert!(
            err(&["eval_every=0"]).contains("eval_every"),
            "{}",
            err(&["eval_every=0"])
        );
        let every = Config::parse(BASE, &["eval_every=10".into()]).unwrap();
        assert_eq!(every.eval_every.get(), 10);
        // The default is left out of a resolved config, so older checkpoints still resume.
        let resolved = toml::to_string(&Config::parse(BASE, &[]).unwrap()).unwrap();
        assert!(!resolved.contains("eval_every"));
        assert!(err(&["model.hidden=[400000000]"]).contains("model.hidden[0]"));
        assert!(err(&["train.beta1=0.5"]).contains("train.beta1"));
        assert!(err(&["replies.max_examples=0"]).contains("replies.max_examples"));
        assert!(err(&["replies.max_update_norm=-1.0"]).contains("replies.max_update_norm"));
        assert!(
            err(&["method.name=\"pfnm\"", "replies.max_update_norm=10.0"])
                .contains("not models of its layout")
        );
        assert!(
            err(&["partition.kind=\"natural_id\"", "partition.column=\"site\""])
                .contains("only femnist has a per-sample column")
        );
        assert!(
            err(&[
                "partition.kind=\"size\"",
                "partition.partition_sizes=[10, 10]"
            ])
            .contains("set clients = 2")
        );
        // The resolved config a run writes lists defaults for every key, and reloads.
        let resolved = toml::to_string_pretty(&Config::parse(BASE, &[]).unwrap()).unwrap();
        assert!(Config::parse(&resolved, &[]).is_ok());
        assert!(err(&["train.optimizer=adam", "train.momentum=0.9"]).contains("train.momentum"));
        assert!(
            Config::parse(
                BASE,
                &["train.optimizer=adam".into(), "train.beta1=0.5".into()]
            )
            .is_ok()
        );
        // Within the width limit but too many parameters once the input size is known.
        let cfg = Config::parse(BASE, &["model.hidden=[40000, 40000]".into()]).unwrap();
        let e = cfg.model.unwrap().spec(&[64], 10).unwrap_err();
        assert!(format!("{e:#}").contains("parameters"), "{e:#}");
    }

    const TABLE: &str = r#"
seed = 1
rounds = 3
clients = 2
[table]
kind = "synthetic"
features = 4
rows_per_client = 50
edge_prob = 0.5
[method]
name = "fedngm"
"#;

    #[test]
    fn tabular_methods_take_a_table_and_classifiers_a_dataset() {
        let err = |text: &str, o: &[&str]| {
            let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
            format!("{:#}", Config::parse(text, &o).unwrap_err())
        };
        let cfg = Config::parse(TABLE, &[]).unwrap();
        assert_eq!(cfg.tabular().map(|c| c.stages()), Some(3));
        let ngr = Config::parse(TABLE, &["method={name=\"fedngr\"}".into()]).unwrap();
        assert_eq!(
            ngr.tabular().map(|c| c.variant),
            Some(fedfuse_fed::FedNgmVariant::Ngr)
        );
        assert!(err(TABLE, &["rounds=2"]).contains("needs 3 rounds"));
        assert!(err(TABLE, &["method.rounds=2"]).contains("needs 4 rounds"));
        assert!(err(TABLE, &["clients_per_round=1"]).contains("every client"));
        assert!(err(TABLE, &["model.kind=mlp"]).contains("remove [dataset], [model]"));
        assert!(
            err(TABLE, &["partition.kind=dirichlet", "partition.alpha=1"]).contains("[partition]")
        );
        assert!(err(TABLE, &["train.lr=0.1"]).contains("[train]"));
        assert!(err(TABLE, &["table={kind=\"cdc\"}"]).contains("set `clients = 3`"));
        assert!(err(TABLE, &["table.features=1"]).contains("features >= 2"));
        assert!(err(TABLE, &["method.samples_per_client=0"]).contains("samples"));
        // Settings FedNGM would ignore are refused: runs have no public rows, the global
        // model has the local architecture, and seeds come from the run's.
        assert!(err(TABLE, &["method.gamma=2"]).contains("has none"));
        let hidden = err(TABLE, &["method.global={hidden=[8]}"]);
        assert!(hidden.contains("set `local.hidden`"), "{hidden}");
        assert!(err(TABLE, &["method.local={seed=3}"]).contains("derived from the run"));
        let small = Config::parse(TABLE, &["method.local={hidden=[8]}".into()]).unwrap();
        assert_eq!(
            small.tabular().map(|c| c.local.hidden.clone()),
            Some(vec![8])
        );
        // Classifiers need [dataset] and [model]; a table is not for them.
        assert!(err(BASE, &["method.name=fedngm"]).contains("[table]"));
        let fedavg_on_table = err(TABLE, &["method={name=\"fedavg\"}"]);
        assert!(
            fedavg_on_table.contains("[dataset] and [model]"),
            "{fedavg_on_table}"
        );
        // The resolved config a run writes out (defaults of [partition] and [train] included)
        // reads back and passes the checks.
        let again: Config = toml::from_str(&toml::to_string_pretty(&cfg).unwrap()).unwrap();
        again.check().unwrap();
        assert_eq!(again.method, cfg.method);
        assert_eq!(again.table, cfg.table);
    }

    #[test]
    fn every_example_config_is_valid() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 5, "{n} example configs");
    }
}
