//! The methods, one file each, and their config.

mod fedavg;
mod feddrop;
mod fedl1;
mod fedmedian;
mod fedmix;
mod fedngm;
mod fedopt;
mod fedprox;
mod fedsparse;
mod fedtrimmedavg;
mod gems;
mod pfnm;
mod separate_inits;

pub use fedavg::FedAvg;
pub use feddrop::FedDrop;
pub use fedl1::FedL1;
pub use fedmedian::FedMedian;
pub use fedmix::FedMix;
pub(crate) use fedngm::member_weights;
pub use fedngm::{
    ClientWeighting, FedNgm, FedNgmConfig, FedNgmVariant, FedNgrConfig, GraphSettings, SampleSite,
};
pub use fedopt::{FedOpt, ServerStep};
pub use fedprox::FedProx;
pub use fedsparse::{FedSparse, PI_TENSOR, V_TENSOR, Z_TENSOR};
pub use fedtrimmedavg::FedTrimmedAvg;
pub use gems::{
    CriterionKind, Gems, GemsSettings, NeuronCriterionKind, SearchKind, Shape as GemsShape,
    finetune_output_layer, hidden_features,
};
pub use pfnm::Pfnm;
pub use pfnm::put_class_counts;
pub use separate_inits::SeparateInits;

use std::sync::Arc;

use fedfuse_core::ModelSpec;
use fedfuse_data::Dataset;
use fedfuse_fuse::{FedSparseConfig, MixtureConfig, PfnmConfig, ServerOptimizer};
use fedfuse_train::{Init, SparseConfig};
use serde::{Deserialize, Serialize};

use crate::{FedError, Method, Result};

/// A method and its settings, as written in a config's `[method]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "kebab-case", deny_unknown_fields)]
pub enum MethodConfig {
    /// FedAvg: mean weighted by examples (hard-EM with a Gaussian prior).
    #[serde(rename = "fedavg")]
    FedAvg {
        /// Clients start round 1 from their own initialisations instead of a common one
        /// (the PFNM papers' "FedAvg, separate inits" baseline).
        #[serde(default, skip_serializing_if = "is_false")]
        separate_inits: bool,
    },
    /// FedProx: FedAvg whose clients add `mu/2 ||w - w_global||^2`.
    #[serde(rename = "fedprox")]
    FedProx {
        /// Proximal coefficient.
        mu: f64,
    },
    /// FedMedian: coordinate-wise median (hard-EM with a Laplace prior).
    #[serde(rename = "fedmedian")]
    FedMedian {},
    /// FedL1: clients train with a group-L1 penalty; groups with small norms are zeroed before
    /// every upload and download (sparse records); the server averages.
    #[serde(rename = "fedl1")]
    FedL1 {
        /// Group-L1 coefficient.
        l1: f64,
        /// Groups with a norm at most this are zeroed before upload and download.
        threshold: f64,
    },
    /// A Gaussian-mixture prior (fedsparse-em App. J.2): `components` server models, clients
    /// start from their most responsible one; `components = 1` is FedAvg.
    #[serde(rename = "fedmix")]
    FedMix {
        /// Number of server models.
        #[serde(default = "two")]
        components: usize,
        /// Precision of each component (larger: harder assignments).
        #[serde(default = "one")]
        lambda: f64,
        /// Learn the mixing weights instead of keeping them equal.
        #[serde(default)]
        learn_weights: bool,
    },
    /// FedOpt (Reddi et al.): FedAvg's clients, a server optimizer on the mean update.
    /// Unset hyper-parameters take the optimizer's defaults (Flower's for adam, yogi, adagrad;
    /// Kingma & Ba's for adamax; FedAvg's for sgd).
    #[serde(rename = "fedopt")]
    FedOpt {
        /// `adam`, `kingma-adam`, `yogi`, `adagrad`, `adamax` or `sgd` (with `momentum`:
        /// FedAvgM).
        optimizer: ServerOptName,
        /// Server learning rate.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        server_lr: Option<f64>,
        /// First-moment decay (adam, yogi, adamax).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        beta1: Option<f64>,
        /// Second-moment decay (adam, yogi, adamax).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        beta2: Option<f64>,
        /// Adaptivity `tau` (adam, yogi, adagrad) or `eps` (adamax).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tau: Option<f64>,
        /// Heavy-ball momentum (sgd).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        momentum: Option<f64>,
    },
    /// Federated dropout: each round clients train a sub-model without `fraction` of every
    /// hidden layer's units (MLPs); traffic is the sub-model's.
    #[serde(rename = "feddrop")]
    FedDrop {
        /// Fraction of hidden units dropped per round, in [0, 1).
        #[serde(default = "quarter")]
        fraction: f64,
    },
    /// FedSparse (fedsparse-em section 3): a gate per hidden unit / conv filter with learned
    /// thresholds; clients upload one gate sample and only the kept units, the server prunes
    /// units whose inclusion probability falls below `prune_eps` and sends only the rest.
    /// Defaults are the paper's Appendix A.
    #[serde(rename = "fedsparse")]
    FedSparse {
        /// `low`, `mid` or `high` sparsity: `lambda0` = 5e-7, 5e-6 or 5e-5.
        #[serde(default)]
        preset: SparsityPreset,
        /// L0 strength per value of a kept group; overrides `preset`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lambda0: Option<f64>,
        /// Gate temperature `T` of `sigmoid((||w_g|| - softplus(v_g)) / T)`.
        #[serde(default = "sparse_temperature")]
        temperature: f64,
        /// The server prunes groups whose inclusion probability is below this.
        #[serde(default = "tenth")]
        prune_eps: f64,
        /// Learning rate of the server's Adam on the weights (Kingma & Ba's default).
        #[serde(default = "milli")]
        server_lr: f64,
        /// Learning rate of the server's Adamax on the thresholds.
        #[serde(default = "centi")]
        threshold_server_lr: f64,
        /// Learning rate of the clients' Adamax on their thresholds.
        #[serde(default = "milli")]
        threshold_lr: f64,
        /// Factor on the cross-entropy between client and server gate probabilities.
        #[serde(default = "sparse_prior_scale")]
        prior_scale: f64,
        /// Precision of the drift term towards the server weights (paper: 0).
        #[serde(default)]
        drift: f64,
        /// Inclusion probability of every group at the start (0.99: a dense start).
        #[serde(default = "sparse_initial_theta")]
        initial_theta: f64,
    },
    /// FedTrimmedAvg: coordinate-wise mean without the `beta` tails.
    #[serde(rename = "fedtrimmedavg")]
    FedTrimmedAvg {
        /// Fraction cut at each end, in [0, 0.5).
        #[serde(default = "default_beta")]
        beta: f64,
    },
    /// PFNM: neuron matching of clients trained from their own initialisations (Yurochkin et
    /// al. 2019); MLPs only. One round is the one-shot method; further rounds start every
    /// client from its matched sub-model (gpi-fnm section 4.3).
    Pfnm {
        /// Variance of client units around their global unit.
        #[serde(default = "one")]
        sigma: f64,
        /// Prior variance of global units.
        #[serde(default = "one")]
        sigma0: f64,
        /// Beta-process mass (larger opens new global units more readily).
        #[serde(default = "one")]
        gamma: f64,
        /// Refinement passes per layer.
        #[serde(default = "five")]
        iters: usize,
    },
    /// GPI-FNM (Xiao & Cheng): PFNM's assignment cost plus `eps` times the KL cost of the
    /// global posterior (eq. 11). `eps` is chosen each round from `eps_grid` on the server's
    /// validation split unless a single `eps` is given.
    GpiFnm {
        /// Variance of client units around their global unit.
        #[serde(default = "one")]
        sigma: f64,
        /// Prior variance of global units.
        #[serde(default = "one")]
        sigma0: f64,
        /// Beta-process mass (larger opens new global units more readily).
        #[serde(default = "one")]
        gamma: f64,
        /// Refinement passes per layer.
        #[serde(default = "five")]
        iters: usize,
        /// A fixed coefficient (skips the grid search).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eps: Option<f64>,
        /// Candidates for `eps`, tried on the validation split.
        #[serde(default = "default_eps_grid")]
        eps_grid: Vec<f64>,
    },
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

fn pfnm_config(sigma: f64, sigma0: f64, gamma: f64, iters: usize, eps: f64) -> PfnmConfig {
    PfnmConfig {
        sigma,
        sigma0,
        gamma,
        iters,
        eps,
        ..PfnmConfig::default()
    }
}

/// Ten values on a multiplicative grid (the paper tries "typically 10 values"), from no KL
/// term up to a KL term that dominates the PFNM cost for unit-scale weights.
pub fn default_eps_grid() -> Vec<f64> {
    vec![0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_beta() -> f64 {
    0.2
}
/// FedSparse's sparsity presets (the paper's LeNet-5 `lambda0` values, Appendix A).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SparsityPreset {
    /// `lambda0 = 5e-7`.
    Low,
    /// `lambda0 = 5e-6`.
    #[default]
    Mid,
    /// `lambda0 = 5e-5`.
    High,
}

impl SparsityPreset {
    /// The preset's `lambda0`.
    pub fn lambda0(self) -> f64 {
        match self {
            Self::Low => 5e-7,
            Self::Mid => 5e-6,
            Self::High => 5e-5,
        }
    }
}

fn sparse_temperature() -> f64 {
    SparseConfig::default().temperature
}
fn sparse_prior_scale() -> f64 {
    SparseConfig::default().prior_scale
}
fn sparse_initial_theta() -> f64 {
    SparseConfig::default().initial_theta
}
fn tenth() -> f64 {
    0.1
}
fn milli() -> f64 {
    1e-3
}
fn centi() -> f64 {
    1e-2
}

/// Server optimizers of [`MethodConfig::FedOpt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerOptName {
    /// FedAdam.
    Adam,
    /// FedYogi.
    Yogi,
    /// FedAdagrad.
    Adagrad,
    /// Adamax.
    Adamax,
    /// SGD with momentum (FedAvgM).
    Sgd,
    /// Adam with Kingma & Ba's bias correction and defaults (`lr = 1e-3`, `beta2 = 0.999`,
    /// `tau` as their `eps = 1e-8`): the server optimizer of fedsparse-em's experiments.
    #[serde(rename = "kingma-adam")]
    KingmaAdam,
}

/// A server optimizer step on top of another method's aggregate (`[server]` in a run config):
/// the method's next global model becomes a target, and the server moves towards it by one
/// step on the difference (Reddi et al.; fedsparse-em App. A runs every method this way).
/// Unset hyper-parameters take the optimizer's defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerStepConfig {
    /// `adam`, `kingma-adam`, `yogi`, `adagrad`, `adamax` or `sgd`.
    pub optimizer: ServerOptName,
    /// Server learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// First-moment decay (adam, kingma-adam, yogi, adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    /// Second-moment decay (adam, kingma-adam, yogi, adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    /// Adaptivity `tau` (adam, yogi, adagrad) or `eps` (kingma-adam, adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau: Option<f64>,
    /// Heavy-ball momentum (sgd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
}

impl ServerStepConfig {
    /// The checked optimizer.
    pub fn optimizer(&self) -> Result<ServerOptimizer> {
        let opt = server_optimizer(
            self.optimizer,
            self.lr,
            self.beta1,
            self.beta2,
            self.tau,
            self.momentum,
        )?;
        opt.check()?;
        Ok(opt)
    }

    /// `method` with this server step after its aggregate. Methods that already step their
    /// own server state (FedOpt, FedSparse) or change widths (neuron matching) cannot take it.
    pub fn wrap(&self, config: &MethodConfig, method: Box<dyn Method>) -> Result<Box<dyn Method>> {
        if config.matching()
            || matches!(
                config,
                MethodConfig::FedOpt { .. }
                    | MethodConfig::FedSparse { .. }
                    | MethodConfig::FedNgm(_)
                    | MethodConfig::FedNgr(_)
            )
        {
            return Err(FedError::InvalidSetting {
                field: "server",
                reason: format!(
                    "`{}` has its own server step; remove the [server] table",
                    method.name()
                ),
            });
        }
        Ok(Box::new(ServerStep::new(method, self.optimizer()?)?))
    }
}

/// The optimizer `name` with its defaults replaced by the settings given; a setting the
/// optimizer does not have is an error.
fn server_optimizer(
    name: ServerOptName,
    lr: Option<f64>,
    beta1: Option<f64>,
    beta2: Option<f64>,
    tau: Option<f64>,
    momentum: Option<f64>,
) -> Result<ServerOptimizer> {
    let mut opt = match name {
        ServerOptName::Adam => ServerOptimizer::fedadam(),
        ServerOptName::Yogi => ServerOptimizer::fedyogi(),
        ServerOptName::Adagrad => ServerOptimizer::fedadagrad(),
        ServerOptName::Adamax => ServerOptimizer::adamax(),
        ServerOptName::Sgd => ServerOptimizer::fedavg(),
        ServerOptName::KingmaAdam => ServerOptimizer::kingma_adam(),
    };
    let set = |slot: &mut f64, value: Option<f64>| {
        if let Some(v) = value {
            *slot = v;
        }
    };
    let (mut b1_used, mut b2_used, mut tau_used, mut momentum_used) = (false, false, false, false);
    match &mut opt {
        ServerOptimizer::Adam {
            lr: l,
            beta1: b1,
            beta2: b2,
            tau: t,
        }
        | ServerOptimizer::Yogi {
            lr: l,
            beta1: b1,
            beta2: b2,
            tau: t,
        }
        | ServerOptimizer::Adamax {
            lr: l,
            beta1: b1,
            beta2: b2,
            eps: t,
        }
        | ServerOptimizer::KingmaAdam {
            lr: l,
            beta1: b1,
            beta2: b2,
            eps: t,
        } => {
            set(l, lr);
            set(b1, beta1);
            set(b2, beta2);
            set(t, tau);
            (b1_used, b2_used, tau_used) = (true, true, true);
        }
        ServerOptimizer::Adagrad { lr: l, tau: t } => {
            set(l, lr);
            set(t, tau);
            tau_used = true;
        }
        ServerOptimizer::Sgd { lr: l, momentum: m } => {
            set(l, lr);
            set(m, momentum);
            momentum_used = true;
        }
    }
    for (field, given, used) in [
        ("method.beta1", beta1.is_some(), b1_used),
        ("method.beta2", beta2.is_some(), b2_used),
        ("method.tau", tau.is_some(), tau_used),
        ("method.momentum", momentum.is_some(), momentum_used),
    ] {
        if given && !used {
            return Err(FedError::InvalidSetting {
                field,
                reason: format!("the {name:?} server optimizer has no such setting"),
            });
        }
    }
    Ok(opt)
}

fn two() -> usize {
    2
}
fn quarter() -> f64 {
    0.25
}
fn one() -> f64 {
    1.0
}
fn five() -> usize {
    5
}

/// What building a method may need from the rest of the experiment.
#[derive(Clone, Debug, Default)]
pub struct BuildContext {
    /// How clients that start from their own weights draw them.
    pub init: Init,
    /// The run's seed.
    pub seed: u64,
    /// The clients' architecture (needed by matching methods).
    pub spec: Option<ModelSpec>,
    /// The server's validation split (needed to choose GPI-FNM's `eps`).
    pub validation: Option<Arc<Dataset>>,
}

impl MethodConfig {
    /// Checks the settings and builds the method (clients' own inits are `Init::Default`,
    /// seed 0, no architecture or validation split; see [`MethodConfig::build_with`]).
    pub fn build(&self) -> Result<Box<dyn Method>> {
        self.build_with(BuildContext::default())
    }

    /// Whether the method fuses networks whose hidden units may be permuted (MLPs only, the
    /// global width may change).
    pub fn matching(&self) -> bool {
        matches!(
            self,
            Self::Pfnm { .. } | Self::GpiFnm { .. } | Self::Gems(_)
        )
    }

    /// Whether the method needs a server validation split.
    pub fn needs_validation(&self) -> bool {
        match self {
            Self::GpiFnm { eps: None, .. } => true,
            Self::Gems(s) => s.finetune_samples > 0,
            _ => false,
        }
    }

    /// Checks the settings and builds the method.
    pub fn build_with(&self, ctx: BuildContext) -> Result<Box<dyn Method>> {
        let matcher = |config: PfnmConfig, grid: Vec<f64>| -> Result<Box<dyn Method>> {
            let spec = ctx.spec.clone().ok_or(FedError::InvalidSetting {
                field: "model",
                reason: "neuron matching needs the clients' architecture".into(),
            })?;
            Ok(Box::new(Pfnm::new(
                config,
                grid,
                ctx.validation.clone(),
                spec,
                ctx.init,
                ctx.seed,
            )?))
        };
        Ok(match self {
            Self::FedAvg { separate_inits } => {
                if *separate_inits {
                    Box::new(SeparateInits {
                        inner: Box::new(FedAvg),
                        init: ctx.init,
                    })
                } else {
                    Box::new(FedAvg)
                }
            }
            Self::FedProx { mu } => {
                if !(mu.is_finite() && *mu >= 0.0) {
                    return Err(FedError::InvalidSetting {
                        field: "method.mu",
                        reason: format!("{mu} is not a non-negative number"),
                    });
                }
                Box::new(FedProx { mu: *mu })
            }
            Self::FedMedian {} => Box::new(FedMedian),
            Self::FedL1 { l1, threshold } => {
                let spec = ctx.spec.as_ref().ok_or(FedError::InvalidSetting {
                    field: "model",
                    reason: "FedL1 needs the model's architecture".into(),
                })?;
                Box::new(FedL1::new(*l1, *threshold, spec)?)
            }
            Self::FedMix {
                components,
                lambda,
                learn_weights,
            } => Box::new(FedMix::new(
                *components,
                MixtureConfig {
                    lambda: *lambda,
                    learn_weights: *learn_weights,
                },
            )?),
            Self::FedOpt {
                optimizer,
                server_lr,
                beta1,
                beta2,
                tau,
                momentum,
            } => Box::new(FedOpt::new(server_optimizer(
                *optimizer, *server_lr, *beta1, *beta2, *tau, *momentum,
            )?)?),
            Self::FedDrop { fraction } => {
                let spec = ctx.spec.as_ref().ok_or(FedError::InvalidSetting {
                    field: "model",
                    reason: "FedDrop needs the model's architecture".into(),
                })?;
                Box::new(FedDrop::new(*fraction, spec, ctx.seed)?)
            }
            Self::FedSparse {
                preset,
                lambda0,
                temperature,
                prune_eps,
                server_lr,
                threshold_server_lr,
                threshold_lr,
                prior_scale,
                drift,
                initial_theta,
            } => {
                let spec = ctx.spec.as_ref().ok_or(FedError::InvalidSetting {
                    field: "model",
                    reason: "FedSparse needs the model's architecture".into(),
                })?;
                let client = SparseConfig {
                    lambda0: lambda0.unwrap_or(preset.lambda0()),
                    temperature: *temperature,
                    drift: *drift,
                    threshold_lr: *threshold_lr,
                    prior_scale: *prior_scale,
                    initial_theta: *initial_theta,
                };
                let server = FedSparseConfig {
                    temperature: *temperature,
                    prune_eps: *prune_eps,
                    weights_opt: ServerOptimizer::KingmaAdam {
                        lr: *server_lr,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                    },
                    thresholds_opt: ServerOptimizer::Adamax {
                        lr: *threshold_server_lr,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-8,
                    },
                };
                Box::new(FedSparse::new(client, server, spec)?)
            }
            Self::FedTrimmedAvg { beta } => {
                if !(0.0..0.5).contains(beta) {
                    return Err(FedError::InvalidSetting {
                        field: "method.beta",
                        reason: format!("{beta} is not in [0, 0.5)"),
                    });
                }
                Box::new(FedTrimmedAvg { beta: *beta })
            }
            Self::Pfnm {
                sigma,
                sigma0,
                gamma,
                iters,
            } => matcher(
                pfnm_config(*sigma, *sigma0, *gamma, *iters, 0.0),
                Vec::new(),
            )?,
            Self::GpiFnm {
                sigma,
                sigma0,
                gamma,
                iters,
                eps,
                eps_grid,
            } => match eps {
                Some(eps) => matcher(
                    pfnm_config(*sigma, *sigma0, *gamma, *iters, *eps),
                    Vec::new(),
                )?,
                None => {
                    if eps_grid.is_empty() {
                        return Err(FedError::InvalidSetting {
                            field: "method.eps_grid",
                            reason: "give at least one candidate, or a single `eps`".into(),
                        });
                    }
                    matcher(
                        pfnm_config(*sigma, *sigma0, *gamma, *iters, 0.0),
                        eps_grid.clone(),
                    )?
                }
            },
            Self::Gems(settings) => {
                let spec = ctx.spec.clone().ok_or(FedError::InvalidSetting {
                    field: "model",
                    reason: "GEMS needs the learners' architecture".into(),
                })?;
                Box::new(Gems::new(
                    settings.clone(),
                    spec,
                    ctx.init,
                    ctx.seed,
                    ctx.validation.clone(),
                )?)
            }
            // The run's seed seeds FedNGM too.
            Self::FedNgm(cfg) | Self::FedNgr(FedNgrConfig(cfg)) => Box::new(FedNgm::new(
                FedNgmConfig {
                    seed: ctx.seed,
                    ..cfg.clone()
                },
                None,
            )?),
        })
    }
}
