//! FedOpt (Reddi et al. 2021): clients train as in FedAvg; the server treats the difference
//! between the clients' example-weighted mean and its model as a pseudo-gradient and takes an
//! optimizer step ([`fedfuse_fuse::ServerOptState`]): FedAdam, FedYogi, FedAdagrad, Adamax, or
//! SGD with momentum (FedAvgM). In the hierarchical-model view (fedsparse-em section 2) it is
//! a partial M-step.

use std::sync::{Arc, Mutex};

use fedfuse_core::Params;
use fedfuse_fuse::{ServerOptState, ServerOptimizer, WeightedSum};

use crate::{Aggregate, FedError, Fold, Method, Reply, Result};

/// FedOpt with one server optimizer; its moments persist across rounds.
pub struct FedOpt {
    state: Arc<Mutex<ServerOptState>>,
}

impl FedOpt {
    /// FedOpt with `optimizer` (checked).
    pub fn new(optimizer: ServerOptimizer) -> Result<Self> {
        Ok(Self {
            state: Arc::new(Mutex::new(ServerOptState::new(optimizer)?)),
        })
    }
}

/// Steps the shared state from `global` towards `mean`.
fn step(state: &Mutex<ServerOptState>, global: &Params, mean: &Params) -> Result<Aggregate> {
    let mut state = state.lock().map_err(|_| FedError::InvalidSetting {
        field: "method",
        reason: "the server optimizer state was poisoned by an earlier panic".into(),
    })?;
    Ok(Aggregate::Replace(state.step(global, mean)?))
}

struct OptFold {
    sum: WeightedSum,
    state: Arc<Mutex<ServerOptState>>,
}

impl Fold for OptFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        let weight = reply.record.num_examples as f64;
        Ok(self.sum.add(&reply.record.params, weight)?)
    }

    fn finish(self: Box<Self>, _round: usize, global: &Params) -> Result<Aggregate> {
        step(&self.state, global, &self.sum.mean()?)
    }
}

impl Method for FedOpt {
    fn name(&self) -> &'static str {
        "fedopt"
    }

    fn aggregate(
        &mut self,
        _round: usize,
        global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let mut sum = WeightedSum::new();
        for r in replies {
            sum.add(&r.record.params, r.record.num_examples as f64)?;
        }
        step(&self.state, global, &sum.mean()?)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        Some(Box::new(OptFold {
            sum: WeightedSum::new(),
            state: Arc::clone(&self.state),
        }))
    }
}
