//! FedTrimmedAvg (Yin et al. 2018), as Flower: coordinate-wise mean after cutting the
//! `floor(beta * n)` largest and smallest values.

use fedfuse_core::Params;
use fedfuse_fuse::trimmed_mean_params;
use serde::{Deserialize, Serialize};

use super::BuildContext;
use crate::{Aggregate, FedError, Method, Reply, Result};

/// FedTrimmedAvg's settings (`[method] name = "fedtrimmedavg"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedTrimmedAvgSettings {
    /// Fraction cut at each end, in [0, 0.5).
    #[serde(default = "default_beta")]
    pub beta: f64,
}

fn default_beta() -> f64 {
    0.2
}

impl Default for FedTrimmedAvgSettings {
    fn default() -> Self {
        Self {
            beta: default_beta(),
        }
    }
}

impl FedTrimmedAvgSettings {
    /// Checks `beta`.
    pub fn check(&self) -> Result<()> {
        let beta = self.beta;
        if !(0.0..0.5).contains(&beta) {
            return Err(FedError::MethodSetting {
                field: "beta",
                reason: format!("{beta} is not in [0, 0.5)"),
            });
        }
        Ok(())
    }

    /// FedTrimmedAvg (settings checked by [`FedTrimmedAvgSettings::check`]).
    pub fn build(&self, _ctx: &BuildContext) -> Result<FedTrimmedAvg> {
        Ok(FedTrimmedAvg { beta: self.beta })
    }
}

/// FedTrimmedAvg with trim fraction `beta`.
#[derive(Clone, Copy, Debug)]
pub struct FedTrimmedAvg {
    /// Fraction cut at each end, in [0, 0.5).
    pub beta: f64,
}

impl Method for FedTrimmedAvg {
    fn name(&self) -> &'static str {
        "fedtrimmedavg"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        Ok(Aggregate::Replace(trimmed_mean_params(&models, self.beta)?))
    }
}
