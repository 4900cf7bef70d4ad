//! FedOpt (Reddi et al. 2021): clients train as in FedAvg; the server treats the difference
//! between the clients' example-weighted mean and its model as a pseudo-gradient and takes an
//! optimizer step ([`fedfuse_fuse::ServerOptState`]): FedAdam, FedYogi, FedAdagrad, Adamax, or
//! SGD with momentum (FedAvgM). In the hierarchical-model view (fedsparse-em section 2) it is
//! a partial M-step.

use std::sync::{Arc, Mutex};

use fedfuse_core::{Params, Record};
use fedfuse_fuse::{FuseError, ServerOptState, ServerOptimizer};
use serde::{Deserialize, Serialize};

use super::{BuildContext, FedAvg, MethodConfig};
use crate::method::{nest_state, unnest_state};
use crate::{Aggregate, FedError, Fold, Method, Reply, Result};

/// Server optimizers of FedOpt and of a [`ServerStepConfig`].
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

/// FedOpt's settings (`[method] name = "fedopt"`). Unset hyper-parameters take the
/// optimizer's defaults (Flower's for adam, yogi, adagrad; Kingma & Ba's for adamax; FedAvg's
/// for sgd).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedOptSettings {
    /// `adam`, `kingma-adam`, `yogi`, `adagrad`, `adamax` or `sgd` (with `momentum`:
    /// FedAvgM).
    pub optimizer: ServerOptName,
    /// Server learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_lr: Option<f64>,
    /// First-moment decay (adam, yogi, adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    /// Second-moment decay (adam, yogi, adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    /// Adaptivity `tau` (adam, yogi, adagrad) or `eps` (adamax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tau: Option<f64>,
    /// Heavy-ball momentum (sgd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
}

impl FedOptSettings {
    /// The server optimizer these settings name; its settings checked.
    fn optimizer(&self) -> Result<ServerOptimizer> {
        let knobs = Knobs {
            lr: self.server_lr,
            beta1: self.beta1,
            beta2: self.beta2,
            tau: self.tau,
            momentum: self.momentum,
        };
        server_optimizer(self.optimizer, knobs, Table::Method)
    }

    /// Checks the optimizer's settings.
    pub fn check(&self) -> Result<()> {
        self.optimizer().map(drop)
    }

    /// FedOpt (settings checked by [`FedOptSettings::check`]).
    pub fn build(&self, _ctx: &BuildContext) -> Result<FedOpt> {
        FedOpt::new(self.optimizer()?)
    }
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
        let knobs = Knobs {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            tau: self.tau,
            momentum: self.momentum,
        };
        server_optimizer(self.optimizer, knobs, Table::Server)
    }

    /// Checks the optimizer's settings, and that `config`'s method can take a server step:
    /// methods that already step their own server state (FedOpt, FedSparse) or change widths
    /// (neuron matching) cannot.
    pub fn check_for(&self, config: &MethodConfig) -> Result<()> {
        if config.matching()
            || matches!(
                config,
                MethodConfig::FedOpt(_)
                    | MethodConfig::FedSparse(_)
                    | MethodConfig::FedNgm(_)
                    | MethodConfig::FedNgr(_)
            )
        {
            return Err(FedError::InvalidSetting {
                field: "server",
                reason: format!(
                    "`{}` has its own server step; remove the [server] table",
                    config.name()
                ),
            });
        }
        self.optimizer().map(drop)
    }

    /// `method` with this server step after its aggregate (checked with its config by
    /// [`ServerStepConfig::check_for`]).
    pub fn wrap(&self, method: Box<dyn Method>) -> Result<Box<dyn Method>> {
        Ok(Box::new(ServerStep::new(method, self.optimizer()?)?))
    }
}

/// The hyper-parameters a table gives a server optimizer; unset ones keep its defaults.
#[derive(Clone, Copy)]
struct Knobs {
    lr: Option<f64>,
    beta1: Option<f64>,
    beta2: Option<f64>,
    tau: Option<f64>,
    momentum: Option<f64>,
}

/// The table a server optimizer's settings come from, which decides the keys errors name.
#[derive(Clone, Copy)]
enum Table {
    /// FedOpt's `[method]`: `server_lr`, `beta1`, `beta2`, `tau`, `momentum`.
    Method,
    /// `[server]`: `lr`, `beta1`, `beta2`, `tau`, `momentum`.
    Server,
}

impl Table {
    /// The error for the setting `knob` (`lr`, `beta1`, `beta2`, `tau`, `eps` or `momentum`,
    /// as the optimizer calls it) in this table.
    fn error(self, knob: &'static str, reason: String) -> FedError {
        match self {
            Self::Method => FedError::MethodSetting {
                field: match knob {
                    "lr" => "server_lr",
                    "eps" => "tau",
                    other => other,
                },
                reason,
            },
            Self::Server => FedError::InvalidSetting {
                field: match knob {
                    "lr" => "server.lr",
                    "beta1" => "server.beta1",
                    "beta2" => "server.beta2",
                    "tau" | "eps" => "server.tau",
                    "momentum" => "server.momentum",
                    _ => "server",
                },
                reason,
            },
        }
    }
}

/// The optimizer `name` with its defaults replaced by the settings given, checked; a setting
/// the optimizer does not have is an error.
fn server_optimizer(name: ServerOptName, knobs: Knobs, table: Table) -> Result<ServerOptimizer> {
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
            set(l, knobs.lr);
            set(b1, knobs.beta1);
            set(b2, knobs.beta2);
            set(t, knobs.tau);
            (b1_used, b2_used, tau_used) = (true, true, true);
        }
        ServerOptimizer::Adagrad { lr: l, tau: t } => {
            set(l, knobs.lr);
            set(t, knobs.tau);
            tau_used = true;
        }
        ServerOptimizer::Sgd { lr: l, momentum: m } => {
            set(l, knobs.lr);
            set(m, knobs.momentum);
            momentum_used = true;
        }
    }
    for (knob, given, used) in [
        ("beta1", knobs.beta1.is_some(), b1_used),
        ("beta2", knobs.beta2.is_some(), b2_used),
        ("tau", knobs.tau.is_some(), tau_used),
        ("momentum", knobs.momentum.is_some(), momentum_used),
    ] {
        if given && !used {
            return Err(table.error(
                knob,
                format!("the {name:?} server optimizer has no such setting"),
            ));
        }
    }
    match opt.check() {
        // The optimizer names a setting `server.<knob>`, and `eps` where the tables say `tau`.
        Err(FuseError::InvalidSetting { field, reason }) => {
            let knob = field.rsplit('.').next().unwrap_or(field);
            Err(table.error(knob, reason))
        }
        Err(e) => Err(e.into()),
        Ok(()) => Ok(opt),
    }
}

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

    fn save_state(&self) -> Option<Result<Record>> {
        self.0.save_state()
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        self.0.load_state(state)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        self.0.fold()
    }
}

/// Steps the shared state from `global` towards `target`.
fn poisoned() -> FedError {
    FedError::MethodState {
        method: "fedopt",
        reason: "the server optimizer's state was poisoned by an earlier panic",
    }
}

fn step(state: &Mutex<ServerOptState>, global: &Params, target: &Params) -> Result<Aggregate> {
    let mut state = state.lock().map_err(|_| poisoned())?;
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
    crate::method::wraps_inner!();

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let target = self.inner.aggregate(round, global, replies)?;
        step_towards(&self.state, global, target)
    }

    fn aggregate_no_replies(&mut self, round: usize, global: &Params) -> Result<Aggregate> {
        let target = self.inner.aggregate_no_replies(round, global)?;
        step_towards(&self.state, global, target)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        let inner = self.inner.fold()?;
        Some(Box::new(StepFold {
            inner,
            state: Arc::clone(&self.state),
        }))
    }

    fn save_state(&self) -> Option<Result<Record>> {
        let own = match self.state.lock() {
            Ok(state) => state.save().map_err(FedError::from),
            Err(_) => Err(poisoned()),
        };
        match own {
            Ok(own) => nest_state(own, self.inner.as_ref()),
            Err(e) => Some(Err(e)),
        }
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let (own, inner) = unnest_state(state)?;
        self.state.lock().map_err(|_| poisoned())?.restore(&own)?;
        self.inner.load_state(inner)
    }
}
