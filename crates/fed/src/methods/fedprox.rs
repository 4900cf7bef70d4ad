//! FedProx (Li et al. 2020): the server sends `proximal_mu`, each client adds
//! `mu/2 ||w - w_global||^2` to its loss ([`crate::standard_fit`] reads it); the server step is
//! FedAvg's.

use fedfuse_core::{ConfigValue, Params, Record};

use super::FedAvg;
use crate::method::PROXIMAL_MU;
use crate::{Aggregate, Fold, Method, Reply, Result};

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
