use serde::{Deserialize, Serialize};

use crate::{Result, TrainError};

/// Local optimizer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
pub enum OptimizerConfig {
    /// Stochastic gradient descent (PyTorch semantics: no dampening).
    Sgd {
        /// Heavy-ball momentum, 0 for none.
        #[serde(default)]
        momentum: f64,
        /// L2 weight decay added to the gradient.
        #[serde(default)]
        weight_decay: f64,
    },
    /// Adam, or AMSGrad with `amsgrad = true`.
    Adam {
        /// First-moment decay.
        #[serde(default = "beta1")]
        beta1: f64,
        /// Second-moment decay.
        #[serde(default = "beta2")]
        beta2: f64,
        /// Numerical stabiliser.
        #[serde(default = "eps")]
        eps: f64,
        /// L2 weight decay added to the gradient.
        #[serde(default)]
        weight_decay: f64,
        /// Use the AMSGrad variant.
        #[serde(default)]
        amsgrad: bool,
    },
}

fn beta1() -> f64 {
    OptimizerConfig::ADAM_BETA1
}
fn beta2() -> f64 {
    OptimizerConfig::ADAM_BETA2
}
fn eps() -> f64 {
    OptimizerConfig::ADAM_EPS
}

impl OptimizerConfig {
    /// Adam's default first-moment decay.
    pub const ADAM_BETA1: f64 = 0.9;
    /// Adam's default second-moment decay.
    pub const ADAM_BETA2: f64 = 0.999;
    /// Adam's default stabiliser.
    pub const ADAM_EPS: f64 = 1e-8;

    /// Adam with the usual defaults (0.9, 0.999, 1e-8), no weight decay.
    pub fn adam() -> Self {
        Self::Adam {
            beta1: beta1(),
            beta2: beta2(),
            eps: eps(),
            weight_decay: 0.0,
            amsgrad: false,
        }
    }
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self::Sgd {
            momentum: 0.0,
            weight_decay: 0.0,
        }
    }
}

/// How one client trains locally.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// Learning rate.
    pub lr: f64,
    /// Passes over the local data.
    pub epochs: usize,
    /// Mini-batch size (the last batch of an epoch may be smaller).
    pub batch_size: usize,
    /// Probability of dropping each unit of the fully connected hidden layers in a training
    /// step (inverted dropout: kept units are scaled by `1/(1 - dropout)`); 0 for none.
    pub dropout: f64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            optimizer: OptimizerConfig::default(),
            lr: 0.01,
            epochs: 1,
            batch_size: 32,
            dropout: 0.0,
        }
    }
}

/// Most local epochs per round: a typo such as `epochs = 1e12` is refused instead of training
/// until killed.
pub const MAX_EPOCHS: usize = 100_000;

impl TrainConfig {
    /// The PFNM paper's local recipe (its Table 1 and reference code): AMSGrad at lr 0.01,
    /// 10 epochs, weight decay 1e-6, batches of 32.
    pub fn pfnm_paper() -> Self {
        Self {
            optimizer: OptimizerConfig::Adam {
                beta1: beta1(),
                beta2: beta2(),
                eps: eps(),
                weight_decay: 1e-6,
                amsgrad: true,
            },
            lr: 0.01,
            epochs: 10,
            batch_size: 32,
            dropout: 0.0,
        }
    }

    /// Checks every setting once; training trusts them afterwards.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::InvalidConfig { field, reason });
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("train.lr", format!("{} is not a positive number", self.lr));
        }
        if self.batch_size == 0 {
            return bad("train.batch_size", "must be at least 1".into());
        }
        if self.epochs > MAX_EPOCHS {
            return bad(
                "train.epochs",
                format!("{} is above the limit of {MAX_EPOCHS}", self.epochs),
            );
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(
                "train.dropout",
                format!("{} is not a probability in [0, 1)", self.dropout),
            );
        }
        match &self.optimizer {
            OptimizerConfig::Sgd {
                momentum,
                weight_decay,
            } => {
                if !(0.0..1.0).contains(momentum) {
                    return bad(
                        "train.optimizer.momentum",
                        format!("{momentum} is not in [0, 1)"),
                    );
                }
                if !(weight_decay.is_finite() && *weight_decay >= 0.0) {
                    return bad(
                        "train.optimizer.weight_decay",
                        format!("{weight_decay} is negative"),
                    );
                }
            }
            OptimizerConfig::Adam {
                beta1,
                beta2,
                eps,
                weight_decay,
                ..
            } => {
                if !(0.0..1.0).contains(beta1) || !(0.0..1.0).contains(beta2) {
                    return bad("train.optimizer.beta1", "betas must lie in [0, 1)".into());
                }
                if !(eps.is_finite() && *eps > 0.0) {
                    return bad("train.optimizer.eps", format!("{eps} is not positive"));
                }
                if !(weight_decay.is_finite() && *weight_decay >= 0.0) {
                    return bad(
                        "train.optimizer.weight_decay",
                        format!("{weight_decay} is negative"),
                    );
                }
            }
        }
        Ok(())
    }
}
