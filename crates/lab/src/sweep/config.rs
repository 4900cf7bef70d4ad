//! A sweep as written in `experiments/*.toml`: the grid, the methods compared, their settings,
//! and the one check.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result, bail_setting};
use fedfuse_data::PartitionSpec;
use fedfuse_fed::{FedAvgSettings, MethodConfig, PfnmSettings, default_eps_grid};
use fedfuse_fuse::MatchOrder;
use fedfuse_train::Init;
use serde::{Deserialize, Serialize};

use crate::config::TrainSection;

/// Rows of a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SweepMethod {
    /// PFNM.
    Pfnm,
    /// GPI-FNM, eps chosen on the validation split.
    GpiFnm,
    /// PFNM with deep networks matched from the input up ([`MatchOrder::BottomUp`]).
    PfnmBottomUp,
    /// GPI-FNM with deep networks matched from the input up.
    GpiFnmBottomUp,
    /// FedAvg of clients trained from their own initialisations.
    FedavgSeparate,
    /// FedAvg of clients trained from one common initialisation.
    FedavgCommon,
    /// Mean test accuracy of the local models.
    Local,
    /// Uniform softmax ensemble of the local models.
    Ensemble,
    /// One model trained on all clients' data pooled.
    Oracle,
}

impl SweepMethod {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Pfnm => "PFNM",
            Self::GpiFnm => "GPI-FNM",
            Self::PfnmBottomUp => "PFNM (bottom-up)",
            Self::GpiFnmBottomUp => "GPI-FNM (bottom-up)",
            Self::FedavgSeparate => "FedAvg (separate inits)",
            Self::FedavgCommon => "FedAvg (common init)",
            Self::Local => "local (mean)",
            Self::Ensemble => "ensemble",
            Self::Oracle => "oracle (pooled)",
        }
    }
}

fn one_round() -> usize {
    1
}
fn validation() -> f64 {
    0.1
}

/// `[matching]` when the file has none: GPI-FNM's grid written out, as a file's table reads.
fn default_matching() -> PfnmSettings {
    PfnmSettings {
        eps_grid: Some(default_eps_grid()),
        ..PfnmSettings::default()
    }
}

/// A sweep, as written in `experiments/*.toml`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Title of the table and plots.
    pub title: String,
    /// Dataset name (`mnist`, `digits`, ...).
    pub dataset: String,
    /// Folder holding the dataset's files (`--data-dir` overrides this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Seeds; every setting runs once per seed (mean and std are over seeds).
    pub seeds: Vec<u64>,
    /// Numbers of clients.
    pub clients: Vec<usize>,
    /// Hidden widths of the MLPs, one list per architecture (`[[100], [100, 100]]`).
    pub hidden: Vec<Vec<usize>>,
    /// Partitions.
    pub partitions: Vec<PartitionSpec>,
    /// Communication rounds (1: one-shot comparison on shared local models).
    #[serde(default = "one_round")]
    pub rounds: usize,
    /// Rows of the table.
    pub methods: Vec<SweepMethod>,
    /// Fraction of the training set held out by the server to choose eps.
    #[serde(default = "validation")]
    pub validation_fraction: f64,
    /// Initialisation of local models.
    #[serde(default)]
    pub init: Init,
    /// PFNM / GPI-FNM settings: the keys of their `[method]` table, with its defaults.
    /// `order` is each method's (`pfnm-bottom-up`); `eps` and `eps_grid` are GPI-FNM's.
    #[serde(
        default = "default_matching",
        deserialize_with = "PfnmSettings::deserialize_gpi_fnm"
    )]
    pub matching: PfnmSettings,
    /// Local training (per round).
    #[serde(default)]
    pub train: TrainSection,
}

impl SweepConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self> {
        crate::config::load_checked(path, "sweep config", Self::check)
    }

    pub(super) fn check(&self) -> Result<()> {
        for (field, empty) in [
            ("seeds", self.seeds.is_empty()),
            ("clients", self.clients.is_empty()),
            ("hidden", self.hidden.is_empty()),
            ("partitions", self.partitions.is_empty()),
            ("methods", self.methods.is_empty()),
        ] {
            if empty {
                bail_setting!(field, "`{field}` must list at least one value");
            }
        }
        if self.clients.contains(&0) {
            bail_setting!("clients", "`clients` must be at least 1");
        }
        if self.hidden.iter().any(|h| h.is_empty() || h.contains(&0)) {
            bail_setting!(
                "hidden",
                "`hidden`: every architecture needs at least one hidden layer of width >= 1"
            );
        }
        if self.rounds == 0 {
            bail_setting!("rounds", "`rounds` must be at least 1");
        }
        if !(self.validation_fraction > 0.0 && self.validation_fraction < 1.0) {
            bail_setting!(
                "validation_fraction",
                "`validation_fraction` = {} must lie in (0, 1): GPI-FNM chooses eps on it",
                self.validation_fraction
            );
        }
        if self.rounds > 1
            && let Some(m) = self.methods.iter().find(|m| {
                matches!(
                    m,
                    SweepMethod::Local | SweepMethod::Ensemble | SweepMethod::Oracle
                )
            })
        {
            bail_setting!(
                "methods",
                "`methods`: `{}` is a one-round reference; with rounds > 1 use pfnm, gpi-fnm, \
                 pfnm-bottom-up, gpi-fnm-bottom-up, fedavg-separate, fedavg-common",
                method_key(*m)
            );
        }
        if self.matching.order != MatchOrder::TopDown {
            bail_setting!(
                "matching.order",
                "`matching.order`: each method sets its own order; list `pfnm-bottom-up` or \
                 `gpi-fnm-bottom-up` in `methods` instead"
            );
        }
        self.train.to_train_config().check()?;
        // Every federated method's settings, checked once up front.
        for m in &self.methods {
            if let Some(mc) = self.method_config(*m) {
                mc.check()
                    .with_context(|| format!("method `{}`", method_key(*m)))?;
            }
        }
        Ok(())
    }

    pub(super) fn pfnm(&self, order: MatchOrder) -> PfnmSettings {
        PfnmSettings {
            eps: None,
            eps_grid: None,
            order,
            ..self.matching.clone()
        }
    }

    pub(super) fn gpi_fnm(&self, order: MatchOrder) -> PfnmSettings {
        PfnmSettings {
            order,
            ..self.matching.clone()
        }
    }

    pub(super) fn method_config(&self, m: SweepMethod) -> Option<MethodConfig> {
        match m {
            SweepMethod::Pfnm => Some(MethodConfig::Pfnm(self.pfnm(MatchOrder::TopDown))),
            SweepMethod::PfnmBottomUp => Some(MethodConfig::Pfnm(self.pfnm(MatchOrder::BottomUp))),
            SweepMethod::GpiFnm => Some(MethodConfig::GpiFnm(self.gpi_fnm(MatchOrder::TopDown))),
            SweepMethod::GpiFnmBottomUp => {
                Some(MethodConfig::GpiFnm(self.gpi_fnm(MatchOrder::BottomUp)))
            }
            SweepMethod::FedavgSeparate => Some(MethodConfig::FedAvg(FedAvgSettings {
                separate_inits: true,
            })),
            SweepMethod::FedavgCommon => Some(MethodConfig::FedAvg(FedAvgSettings {
                separate_inits: false,
            })),
            SweepMethod::Local | SweepMethod::Ensemble | SweepMethod::Oracle => None,
        }
    }
}

pub(super) fn method_key(m: SweepMethod) -> String {
    toml::Value::try_from(m)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A partition as a short label (`iid`, `dirichlet(0.5)`).
pub(super) fn partition_label(p: &PartitionSpec) -> String {
    match p {
        PartitionSpec::Iid {} => "iid".into(),
        PartitionSpec::Dirichlet { alpha, .. } => format!("dirichlet({alpha})"),
        other => toml::Value::try_from(other)
            .ok()
            .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
            .unwrap_or_else(|| "partition".into()),
    }
}
