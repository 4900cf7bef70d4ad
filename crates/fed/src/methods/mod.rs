//! The methods, one file each, and their config.

mod fedavg;
mod fedmedian;
mod fedprox;
mod fedtrimmedavg;
mod pfnm;

pub use fedavg::FedAvg;
pub use fedmedian::FedMedian;
pub use fedprox::FedProx;
pub use fedtrimmedavg::FedTrimmedAvg;
pub use pfnm::Pfnm;

use fedfuse_fuse::PfnmConfig;
use fedfuse_train::Init;
use serde::{Deserialize, Serialize};

use crate::{FedError, Method, Result};

/// A method and its settings, as written in a config's `[method]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
pub enum MethodConfig {
    /// FedAvg: mean weighted by examples (hard-EM with a Gaussian prior).
    FedAvg {},
    /// FedProx: FedAvg whose clients add `mu/2 ||w - w_global||^2`.
    FedProx {
        /// Proximal coefficient.
        mu: f64,
    },
    /// FedMedian: coordinate-wise median (hard-EM with a Laplace prior).
    FedMedian {},
    /// FedTrimmedAvg: coordinate-wise mean without the `beta` tails.
    FedTrimmedAvg {
        /// Fraction cut at each end, in [0, 0.5).
        #[serde(default = "default_beta")]
        beta: f64,
    },
    /// PFNM: one-shot neuron matching of clients trained from their own initialisations
    /// (Yurochkin et al. 2019); MLPs only, one round.
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
}

fn default_beta() -> f64 {
    0.2
}
fn one() -> f64 {
    1.0
}
fn five() -> usize {
    5
}

/// What building a method may need from the rest of the experiment.
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildContext {
    /// How clients that start from their own weights draw them.
    pub init: Init,
    /// The run's seed.
    pub seed: u64,
}

impl MethodConfig {
    /// Checks the settings and builds the method (clients' own inits are `Init::Default`,
    /// seed 0; see [`MethodConfig::build_with`]).
    pub fn build(&self) -> Result<Box<dyn Method>> {
        self.build_with(BuildContext::default())
    }

    /// Whether the method is one-shot (exactly one round).
    pub fn one_shot(&self) -> bool {
        matches!(self, Self::Pfnm { .. })
    }

    /// Checks the settings and builds the method.
    pub fn build_with(&self, ctx: BuildContext) -> Result<Box<dyn Method>> {
        Ok(match self {
            Self::FedAvg {} => Box::new(FedAvg),
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
            } => {
                let config = PfnmConfig {
                    sigma: *sigma,
                    sigma0: *sigma0,
                    gamma: *gamma,
                    iters: *iters,
                    ..PfnmConfig::default()
                };
                config.check()?;
                Box::new(Pfnm {
                    config,
                    init: ctx.init,
                    seed: ctx.seed,
                })
            }
        })
    }
}
