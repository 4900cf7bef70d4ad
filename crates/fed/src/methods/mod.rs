//! The methods, one file (or folder) each. Each file holds its method, the method's `[method]` settings
//! (serde, with their defaults) and their one check, `build`, which validates every setting
//! once and returns the method; the layers below then trust the values they are given. This
//! file is the tagged enum of the settings and the dispatch.

mod bn_statistics;
mod fedavg;
mod feddrop;
mod fedl1;
mod fedma;
mod fedmedian;
mod fedmix;
mod fedngm;
mod fedopt;
mod fedprox;
mod fedsparse;
mod fedtrimmedavg;
mod gems;
mod krum;
mod list_view;
mod local_norm;
mod pfnm;
mod privacy;
mod separate_inits;
mod weight_matching;

pub use bn_statistics::{BatchNormRounds, BatchNormSettings};
pub use fedavg::{FedAvg, FedAvgSettings};
pub use feddrop::{FedDrop, FedDropSettings};
pub use fedl1::{FedL1, FedL1Settings};
pub use fedma::{FedMa, FedMaSettings};
pub use fedmedian::FedMedian;
pub use fedmix::{FedMix, FedMixSettings};
pub use fedngm::{
    ClientWeighting, FedNgm, FedNgmClient, FedNgmConfig, FedNgmRound, FedNgmRun, FedNgmVariant,
    FedNgrConfig, GraphSettings, PredictionScore, SampleSite, Stitched, Traffic, run_fedngm,
    score_ensemble, score_marginal, score_prediction, score_rows, stitch_client,
};
pub use fedopt::{FedOpt, FedOptSettings, ServerOptName, ServerStep, ServerStepConfig};
pub use fedprox::{FedProx, FedProxSettings};
pub use fedsparse::{FedSparse, FedSparseSettings, PI_TENSOR, SparsityPreset, V_TENSOR, Z_TENSOR};
pub use fedtrimmedavg::{FedTrimmedAvg, FedTrimmedAvgSettings};
pub use gems::{
    CriterionKind, Gems, GemsSettings, NeuronCriterionKind, NeuronSpace, SearchKind,
    Shape as GemsShape, finetune_output_layer, hidden_features,
};
pub use krum::{Bulyan, BulyanSettings, Krum, KrumSettings};
pub use local_norm::LocalNorm;
pub use pfnm::{Pfnm, PfnmSettings, default_eps_grid, put_class_counts};
pub use privacy::{CentralDp, DpSampling, LocalDp, PrivacySettings};
pub use separate_inits::SeparateInits;
pub use weight_matching::WeightMatching;

use std::sync::Arc;

use fedfuse_core::{CoreError, ModelSpec};
use fedfuse_data::Dataset;
use fedfuse_fuse::{FuseError, WeightMatchingConfig};
use fedfuse_train::{Init, TrainError};
use serde::{Deserialize, Serialize};

use crate::{FedError, Method, Result};

/// A method and its settings, as written in a config's `[method]` table: `name` picks the
/// method, the other keys are its settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MethodConfig {
    /// FedAvg: mean weighted by examples (hard-EM with a Gaussian prior).
    #[serde(rename = "fedavg")]
    FedAvg(FedAvgSettings),
    /// FedProx: FedAvg whose clients add `mu/2 ||w - w_global||^2`.
    #[serde(rename = "fedprox")]
    FedProx(FedProxSettings),
    /// FedMedian: coordinate-wise median (hard-EM with a Laplace prior); no settings.
    #[serde(rename = "fedmedian")]
    FedMedian {},
    /// FedL1: clients train with a group-L1 penalty; groups with small norms are zeroed before
    /// every upload and download (sparse records); the server averages.
    #[serde(rename = "fedl1")]
    FedL1(FedL1Settings),
    /// A Gaussian-mixture prior (fedsparse-em App. J.2): `components` server models, clients
    /// start from their most responsible one; `components = 1` is FedAvg.
    #[serde(rename = "fedmix")]
    FedMix(FedMixSettings),
    /// FedOpt (Reddi et al.): FedAvg's clients, a server optimizer on the mean update.
    #[serde(rename = "fedopt")]
    FedOpt(FedOptSettings),
    /// Federated dropout: each round clients train a sub-model without `fraction` of every
    /// hidden layer's units; traffic is the sub-model's.
    #[serde(rename = "feddrop")]
    FedDrop(FedDropSettings),
    /// FedSparse (fedsparse-em section 3): a gate per hidden unit / conv filter with learned
    /// thresholds, sparse traffic both ways.
    #[serde(rename = "fedsparse")]
    FedSparse(FedSparseSettings),
    /// FedTrimmedAvg: coordinate-wise mean without the `beta` tails.
    #[serde(rename = "fedtrimmedavg")]
    FedTrimmedAvg(FedTrimmedAvgSettings),
    /// Krum / Multi-Krum: the `keep` replies nearest to the most others, averaged; tolerates
    /// `byzantine` clients.
    #[serde(rename = "krum")]
    Krum(KrumSettings),
    /// Bulyan: Multi-Krum keeps `n - 2f` replies, then per coordinate the mean of the
    /// `n - 4f` nearest the median; needs `4f + 3` replies a round.
    #[serde(rename = "bulyan")]
    Bulyan(BulyanSettings),
    /// PFNM: neuron matching of clients trained from their own initialisations (Yurochkin et
    /// al. 2019); MLPs, and conv nets' channels bottom-up. Takes no `eps` nor `eps_grid`.
    #[serde(deserialize_with = "PfnmSettings::deserialize_pfnm")]
    Pfnm(PfnmSettings),
    /// GPI-FNM (Xiao & Cheng): PFNM's assignment cost plus `eps` times the KL cost of the
    /// global posterior; `eps` is chosen from `eps_grid` unless given.
    #[serde(deserialize_with = "PfnmSettings::deserialize_gpi_fnm")]
    GpiFnm(PfnmSettings),
    /// FedMA (Wang et al. 2020): PFNM's matching layer by layer from the input side, the
    /// clients retraining the layers above each matched one; `rounds` passes ("FedMA with
    /// communication"), each one federation round per matched layer plus one.
    #[serde(rename = "fedma")]
    #[serde(deserialize_with = "FedMaSettings::deserialize_checked")]
    FedMa(FedMaSettings),
    /// Weight matching (Ainsworth et al., Git Re-Basin): clients from their own
    /// initialisations, each aligned to the first by one permutation per layer, then
    /// averaged; fixed widths.
    #[serde(rename = "weight-matching")]
    WeightMatching(WeightMatchingConfig),
    /// GEMS (Guha & Smith): good-enough balls per learner, neurons merged where balls
    /// intersect, one hidden layer per round, then the output layer; MLPs only.
    Gems(GemsSettings),
    /// FedNGM (note 1.7): neural graphical models over clients' tables, distilled into one
    /// global model; needs a tabular dataset.
    #[serde(rename = "fedngm")]
    FedNgm(FedNgmConfig),
    /// FedNGR: FedNGM with neural graph revealers, the graph read off the global weights.
    #[serde(rename = "fedngr")]
    FedNgr(FedNgrConfig),
}

/// What building a method may need from the rest of the experiment.
#[derive(Clone, Debug, Default)]
pub struct BuildContext {
    /// How clients that start from their own weights draw them.
    pub init: Init,
    /// The run's seed.
    pub seed: u64,
    /// The clients' architecture (needed by matching and group-sparsity methods).
    pub spec: Option<ModelSpec>,
    /// The server's validation split (needed to choose GPI-FNM's `eps`).
    pub validation: Option<Arc<Dataset>>,
}

impl BuildContext {
    /// The architecture; `missing` says who needs it when it is absent.
    pub(crate) fn spec(&self, missing: &str) -> Result<&ModelSpec> {
        self.spec.as_ref().ok_or_else(|| FedError::InvalidSetting {
            field: "model",
            reason: missing.into(),
        })
    }
}

/// A lower crate's settings error as an error of the `[method]` table. fedfuse-fuse,
/// fedfuse-train and fedfuse-core name a setting by its own key (`sigma0`); only this crate
/// knows that the key sits in `[method]`. Dotted names are config paths already (the
/// `[server]` optimizer's `server.lr`) and pass unchanged, as does every other error.
pub(crate) fn in_method(e: impl Into<FedError>) -> FedError {
    match e.into() {
        FedError::Fuse(FuseError::InvalidSetting { field, reason })
        | FedError::Train(TrainError::InvalidConfig { field, reason })
        | FedError::Core(CoreError::InvalidSetting { field, reason })
            if !field.contains('.') =>
        {
            FedError::MethodSetting { field, reason }
        }
        other => other,
    }
}

impl MethodConfig {
    /// Checks the settings and builds the method (clients' own inits are `Init::Default`,
    /// seed 0, no architecture or validation split; see [`MethodConfig::build_with`]).
    pub fn build(&self) -> Result<Box<dyn Method>> {
        self.build_with(BuildContext::default())
    }

    /// Checks the settings and builds the method for `ctx`.
    pub fn build_with(&self, ctx: BuildContext) -> Result<Box<dyn Method>> {
        self.check()?.build(ctx)
    }

    /// Checks every setting of the table, alone: nothing here needs the data or the
    /// architecture. The result is what builds the method.
    pub fn check(&self) -> Result<CheckedMethod> {
        match self {
            Self::FedAvg(_) | Self::FedMedian {} | Self::Bulyan(_) => Ok(()),
            Self::FedProx(s) => s.check(),
            Self::FedL1(s) => s.check(),
            Self::FedMix(s) => s.check(),
            Self::FedOpt(s) => s.check(),
            Self::FedDrop(s) => s.check(),
            Self::FedSparse(s) => s.check(),
            Self::FedTrimmedAvg(s) => s.check(),
            Self::Krum(s) => s.check(),
            Self::Pfnm(s) => s.check_pfnm(),
            Self::GpiFnm(s) => s.check_gpi_fnm(),
            Self::FedMa(s) => s.check(),
            Self::WeightMatching(s) => s.check().map_err(in_method),
            Self::Gems(s) => s.check(),
            Self::FedNgm(cfg) | Self::FedNgr(FedNgrConfig(cfg)) => cfg.check(),
        }?;
        Ok(CheckedMethod(self.clone()))
    }

    /// The method's name, as `name` writes it in the table.
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.get("name")?.as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// Whether the method fuses networks whose hidden units may be permuted (the global width
    /// may change).
    pub fn matching(&self) -> bool {
        matches!(
            self,
            Self::Pfnm(_)
                | Self::GpiFnm(_)
                | Self::Gems(_)
                | Self::FedMa(_)
                | Self::WeightMatching(_)
        )
    }

    /// Whether the method fuses MLPs only.
    pub fn mlp_only(&self) -> bool {
        matches!(self, Self::Gems(_))
    }

    /// Whether the method needs a server validation split.
    pub fn needs_validation(&self) -> bool {
        match self {
            Self::Pfnm(s) => s.sigma_grid.is_some(),
            Self::GpiFnm(s) => s.eps.is_none() || s.sigma_grid.is_some(),
            Self::Gems(s) => s.finetune_samples > 0,
            _ => false,
        }
    }
}

/// A `[method]` table whose settings passed [`MethodConfig::check`]: what builds the method,
/// so that no layer below checks a setting again.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckedMethod(MethodConfig);

impl CheckedMethod {
    /// The settings.
    pub fn config(&self) -> &MethodConfig {
        &self.0
    }

    /// Builds the method for `ctx`; what is checked here is only what the settings cannot
    /// know: the architecture and validation split a method needs.
    pub fn build(&self, ctx: BuildContext) -> Result<Box<dyn Method>> {
        Ok(match &self.0 {
            MethodConfig::FedAvg(s) => s.build(&ctx)?,
            MethodConfig::FedProx(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedMedian {} => Box::new(FedMedian),
            MethodConfig::FedL1(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedMix(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedOpt(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedDrop(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedSparse(s) => Box::new(s.build(&ctx)?),
            MethodConfig::FedTrimmedAvg(s) => Box::new(s.build(&ctx)?),
            MethodConfig::Krum(s) => Box::new(s.build(&ctx)?),
            MethodConfig::Bulyan(s) => Box::new(s.build(&ctx)?),
            MethodConfig::Pfnm(s) => Box::new(s.build_pfnm(&ctx)?),
            MethodConfig::GpiFnm(s) => Box::new(s.build_gpi_fnm(&ctx)?),
            MethodConfig::FedMa(s) => Box::new(s.build(&ctx)?),
            MethodConfig::WeightMatching(s) => Box::new(weight_matching::build(s, &ctx)?),
            MethodConfig::Gems(s) => Box::new(s.build(&ctx)?),
            // The run's seed seeds FedNGM too.
            MethodConfig::FedNgm(cfg) | MethodConfig::FedNgr(FedNgrConfig(cfg)) => {
                Box::new(FedNgm::new(
                    FedNgmConfig {
                        seed: ctx.seed,
                        ..cfg.clone()
                    },
                    None,
                )?)
            }
        })
    }
}
