//! The methods, one file each, and their config.

mod fedavg;
mod fedmedian;
mod fedprox;
mod fedtrimmedavg;

pub use fedavg::FedAvg;
pub use fedmedian::FedMedian;
pub use fedprox::FedProx;
pub use fedtrimmedavg::FedTrimmedAvg;

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
}

fn default_beta() -> f64 {
    0.2
}

impl MethodConfig {
    /// Checks the settings and builds the method.
    pub fn build(&self) -> Result<Box<dyn Method>> {
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
        })
    }
}
