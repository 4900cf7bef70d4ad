//! FedProx (Li et al. 2020): the server sends `proximal_mu`, each client adds
//! `mu/2 ||w - w_global||^2` to its loss ([`crate::standard_fit`] reads it); the server step is
//! FedAvg's.

use fedfuse_core::{ConfigValue, Params, Record};

use serde::{Deserialize, Serialize};

use super::{BuildContext, FedAvg};
use crate::method::PROXIMAL_MU;
use crate::{Aggregate, FedError, Fold, Method, Reply, Result};

/// FedProx's settings (`[method] name = "fedprox"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedProxSettings {
    /// Proximal coefficient.
    pub mu: f64,
}

impl FedProxSettings {
    /// Checks `mu`.
    pub fn check(&self) -> Result<()> {
        let mu = self.mu;
        if !(mu.is_finite() && mu >= 0.0) {
            return Err(FedError::MethodSetting {
                field: "mu",
                reason: format!("{mu} is not a non-negative number"),
            });
        }
        Ok(())
    }

    /// FedProx (settings checked by [`FedProxSettings::check`]).
    pub fn build(&self, _ctx: &BuildContext) -> Result<FedProx> {
        Ok(FedProx { mu: self.mu })
    }
}

/// FedProx with coefficient `mu`.
#[derive(Clone, Copy, Debug)]
pub struct FedProx {
    /// Proximal coefficient.
    pub mu: f64,
}

impl Method for FedProx {
    fn name(&self) -> &'static str {
        "fedprox"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        let base = FedAvg.instruct(round, client, global)?;
        Ok(base.with_config(PROXIMAL_MU, ConfigValue::Float(self.mu)))
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        FedAvg.aggregate(round, global, replies)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        FedAvg.fold()
    }
}
