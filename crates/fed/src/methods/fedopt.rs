//! FedOpt (Reddi et al. 2021): clients train as in FedAvg; the server treats the difference
//! between the clients' example-weighted mean and its model as a pseudo-gradient and takes an
//! optimizer step ([`fedfuse_fuse::ServerOptState`]): FedAdam, FedYogi, FedAdagrad, Adamax, or
//! SGD with momentum (FedAvgM). In the hierarchical-model view (fedsparse-em section 2) it is
//! a partial M-step.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fedfuse_core::{Params, Record};
use fedfuse_data::Dataset;
use fedfuse_fuse::{ServerOptState, ServerOptimizer};

use super::FedAvg;
use fedfuse_train::Trainer;

use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result};

/// FedOpt with one server optimizer; its moments persist across rounds. It is FedAvg followed
/// by a [`ServerStep`].
pub struct FedOpt(ServerStep);

impl FedOpt {
    /// FedOpt with `optimizer` (checked).
    pub fn new(optimizer: ServerOptimizer) -> Result<Self> {
        Ok(Self(ServerStep::new(Box::new(FedAvg), optimizer)?))
    }
}

impl Method for FedOpt {
    fn name(&self) -> &'static str {
        "fedopt"
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        self.0.aggregate(round, global, replies)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        self.0.fold()
    }
}

/// Steps the shared state from `global` towards `target`.
fn step(state: &Mutex<ServerOptState>, global: &Params, target: &Params) -> Result<Aggregate> {
    let mut state = state.lock().map_err(|_| FedError::InvalidSetting {
        field: "method",
        reason: "the server optimizer state was poisoned by an earlier panic".into(),
    })?;
    Ok(Aggregate::Replace(state.step(global, target)?))
}

/// Any method whose aggregate is a model of the global layout, followed by a server optimizer
/// step towards that model (see [`ServerStepConfig`](crate::ServerStepConfig)). The client side
/// and the checks are the inner method's.
pub struct ServerStep {
    inner: Box<dyn Method>,
    state: Arc<Mutex<ServerOptState>>,
}

impl ServerStep {
    /// `inner` followed by steps of `optimizer` (checked).
    pub fn new(inner: Box<dyn Method>, optimizer: ServerOptimizer) -> Result<Self> {
        Ok(Self {
            inner,
            state: Arc::new(Mutex::new(ServerOptState::new(optimizer)?)),
        })
    }
}

fn step_towards(
    state: &Mutex<ServerOptState>,
    global: &Params,
    target: Aggregate,
) -> Result<Aggregate> {
    match target {
        Aggregate::Replace(target) => step(state, global, &target),
        Aggregate::Keep => Ok(Aggregate::Keep),
    }
}

struct StepFold {
    inner: Box<dyn Fold>,
    state: Arc<Mutex<ServerOptState>>,
}

impl Fold for StepFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        self.inner.add(reply)
    }

    fn finish(self: Box<Self>, round: usize, global: &Params) -> Result<Aggregate> {
        let target = self.inner.finish(round, global)?;
        step_towards(&self.state, global, target)
    }
}

impl Method for ServerStep {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.inner.instruct(round, client, global)
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        self.inner.fit(instruction, ctx)
    }

    fn check_reply(&self, global: &Params, reply: &Record) -> Result<()> {
        self.inner.check_reply(global, reply)
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let target = self.inner.aggregate(round, global, replies)?;
        step_towards(&self.state, global, target)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        let inner = self.inner.fold()?;
        Some(Box::new(StepFold {
            inner,
            state: Arc::clone(&self.state),
        }))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.inner.round_metrics()
    }

    fn evaluate(&self, trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        self.inner.evaluate(trainer, test)
    }
}
