//! A simulation's settings: rounds, who is sampled and how, the bounds on replies.

use std::num::NonZeroUsize;

use fedfuse_core::{Params, Record};
use fedfuse_train::TrainConfig;
use serde::{Deserialize, Serialize};

use crate::{FedError, Result};

/// How many clients take part in a round.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClientsPerRound {
    /// Exactly this many (at most all).
    Count(usize),
    /// This fraction of all clients, at least one (Flower's `fraction_train`).
    Fraction(f64),
}

/// How a round's clients are drawn (`sampling` in a run config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sampling {
    /// Exactly `clients_per_round` of them, uniformly without replacement (as Flower's
    /// strategies sample).
    #[default]
    Fixed,
    /// Each client on its own with probability `clients_per_round` (a count `c` of `n`
    /// clients: `c / n`), so a round's size varies and may be zero. This is the sampling
    /// differential privacy's accountant amplifies by.
    Poisson,
}

/// Bounds a reply must keep to be aggregated (`[replies]` in a run config); none by default.
/// A reply outside them is listed with the reason in the round's rejections, as a malformed
/// one is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyBounds {
    /// Most examples a reply may claim: its FedAvg weight, which a client could otherwise
    /// inflate at will.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_examples: Option<u64>,
    /// Longest update a reply may carry: the L2 norm of reply minus global model over all
    /// tensors (methods whose replies are models of the global model's layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_update_norm: Option<f64>,
}

impl ReplyBounds {
    /// Whether no bound is set.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the bounds' own ranges.
    pub fn check(&self) -> Result<()> {
        if self.max_examples == Some(0) {
            return Err(FedError::InvalidSetting {
                field: "replies.max_examples",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(n) = self.max_update_norm
            && !(n.is_finite() && n > 0.0)
        {
            return Err(FedError::InvalidSetting {
                field: "replies.max_update_norm",
                reason: format!("{n} must be a positive number"),
            });
        }
        Ok(())
    }

    /// These bounds with `max_examples`, when unset, at the largest client's example count
    /// (`sizes`, one per client): no honest client of the run holds more, and without a bound
    /// one reply claiming 2^63 examples would take the whole of any example-weighted mean.
    pub fn or_largest_client(self, sizes: impl IntoIterator<Item = usize>) -> Self {
        let largest = sizes.into_iter().max().map(|n| (n as u64).max(1));
        Self {
            max_examples: self.max_examples.or(largest),
            ..self
        }
    }

    /// Why `reply` breaks a bound, if it does.
    pub(super) fn violation(&self, global: &Params, reply: &Record) -> Option<String> {
        if let Some(max) = self.max_examples
            && reply.num_examples > max
        {
            return Some(format!(
                "it claims {} examples, more than max_examples = {max} (by default the run's \
                 largest client; set `replies.max_examples` for nodes holding more)",
                reply.num_examples
            ));
        }
        let max = self.max_update_norm?;
        match fedfuse_fuse::dp::update_norm(global, &reply.params) {
            Ok(norm) if norm <= max => None,
            Ok(norm) => Some(format!(
                "its update has L2 norm {norm:.4e}, more than max_update_norm = {max}"
            )),
            Err(e) => Some(format!("its update cannot be measured: {e}")),
        }
    }
}

/// Simulation settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Communication rounds.
    pub rounds: usize,
    /// Clients per round.
    pub clients_per_round: ClientsPerRound,
    /// Seed of every random choice (client sampling, batches).
    pub seed: u64,
    /// Local training.
    pub train: TrainConfig,
    /// Evaluate the global model on every client's local test split each round.
    pub local_eval: bool,
    /// Bounds on replies.
    pub bounds: ReplyBounds,
    /// How each round's clients are drawn.
    pub sampling: Sampling,
    /// Evaluate the global model (test set, clients' splits, the method's own scores) after
    /// every `eval_every`-th round and after the last; the rounds between report NaN there.
    /// Long runs spend most of a round evaluating otherwise. The clients' accuracies of their
    /// own uploads are measured every round.
    pub eval_every: NonZeroUsize,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            rounds: 5,
            clients_per_round: ClientsPerRound::Fraction(1.0),
            seed: 0,
            train: TrainConfig::default(),
            local_eval: true,
            bounds: ReplyBounds::default(),
            sampling: Sampling::Fixed,
            eval_every: NonZeroUsize::MIN,
        }
    }
}

impl SimConfig {
    /// Whether the global model is evaluated after `round` (1-based).
    pub fn evaluates_after(&self, round: usize) -> bool {
        round.is_multiple_of(self.eval_every.get()) || round >= self.rounds
    }

    /// Clients sampled per round out of `n`, checking the setting.
    pub fn sample_size(&self, n: usize) -> Result<usize> {
        let bad = |reason: String| FedError::InvalidSetting {
            field: "clients_per_round",
            reason,
        };
        match self.clients_per_round {
            ClientsPerRound::Count(0) => Err(bad("must be at least 1".into())),
            ClientsPerRound::Count(c) => Ok(c.min(n)),
            ClientsPerRound::Fraction(f) if f > 0.0 && f <= 1.0 => {
                Ok(((f * n as f64).floor() as usize).clamp(1, n))
            }
            ClientsPerRound::Fraction(f) => Err(bad(format!(
                "{f} is neither a count (integer) nor a fraction in (0, 1]"
            ))),
        }
    }

    /// The chance that a given client of `n` takes part in a round under Poisson sampling:
    /// the fraction, or a count over `n`.
    pub fn sampling_rate(&self, n: usize) -> Result<f64> {
        let k = self.sample_size(n)?;
        Ok(match self.clients_per_round {
            ClientsPerRound::Fraction(f) => f,
            ClientsPerRound::Count(_) => k as f64 / n.max(1) as f64,
        })
    }
}
