//! A statistics round after every round of a method, in which the clients re-estimate the new
//! global model's batch norm statistics on their own data and the server combines them: the
//! federated form of the repair a merged network needs (averaged running statistics describe
//! none of the models merged; Jordan et al. 2023), with no raw data leaving a client.
//!
//! Federation rounds alternate: odd rounds are the wrapped method's (its round `(r + 1) / 2`),
//! even rounds are statistics rounds. In one, each client runs the global model in training
//! mode over its training split, `batch_size` samples at a time, its statistics restarted and
//! averaged over its batches (`Trainer::reestimate_batch_norm`), and replies with its running
//! means, variances and batch counts. The server's statistics are the batch-weighted means,
//! what the same passes over every client's data give when the batches are equally full; the
//! counter is the clients' batches in all. The other tensors of the global model are unchanged.

use serde::{Deserialize, Serialize};

use fedfuse_core::layers::{TensorRole, is_counter};
use fedfuse_core::{ConfigValue, ModelSpec, Params, Record};

use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result};

/// Config key of a statistics round's instruction.
const STATISTICS: &str = "bn_statistics";

/// `[batch_norm]` of a run config: re-estimate the global model's batch norm statistics on the
/// clients' data after every round of the method.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchNormSettings {
    /// Whether every round of the method is followed by a statistics round.
    pub reestimate: bool,
    /// Samples per training-mode pass on a client.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

fn default_batch() -> usize {
    64
}

impl BatchNormSettings {
    /// Checks the settings against the model they run on: it must hold a batch norm.
    pub fn check(&self, spec: &ModelSpec) -> Result<()> {
        fedfuse_train::check_reestimate_batch(spec, self.batch_size).map_err(|e| {
            FedError::InvalidSetting {
                field: "batch_norm.batch_size",
                reason: e.to_string(),
            }
        })?;
        if self.reestimate && stat_names(spec).is_empty() {
            return Err(FedError::InvalidSetting {
                field: "batch_norm.reestimate",
                reason: "the model has no batch norm whose statistics could be re-estimated; \
                         remove [batch_norm]"
                    .into(),
            });
        }
        Ok(())
    }

    /// `method` with a statistics round after each of its rounds (when `reestimate`).
    pub fn wrap(&self, method: Box<dyn Method>, spec: &ModelSpec) -> Result<Box<dyn Method>> {
        self.check(spec)?;
        if !self.reestimate {
            return Ok(method);
        }
        Ok(Box::new(BatchNormRounds {
            inner: method,
            batch_size: self.batch_size,
            stats: stat_names(spec),
            last: false,
        }))
    }
}

/// Every batch norm's running mean, variance and counter, in the model's order.
fn stat_names(spec: &ModelSpec) -> Vec<String> {
    spec.param_shapes()
        .into_iter()
        .map(|s| s.name)
        .filter(|n| TensorRole::of(n) != TensorRole::Param)
        .collect()
}

/// Whether federation round `round` is a statistics round.
fn statistics_round(round: usize) -> bool {
    round.is_multiple_of(2)
}

/// The wrapped method's own round for an odd federation round.
fn inner_round(round: usize) -> usize {
    round.div_ceil(2)
}

/// A method with statistics rounds between its rounds (see the module docs).
pub struct BatchNormRounds {
    inner: Box<dyn Method>,
    batch_size: usize,
    stats: Vec<String>,
    /// Whether the last aggregated round was a statistics round.
    last: bool,
}

impl Method for BatchNormRounds {
    crate::method::wraps_inner!();

    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        if statistics_round(round) {
            return Ok(Record::from_params(global.clone())
                .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
                .with_config(STATISTICS, ConfigValue::Int(1)));
        }
        self.inner.instruct(inner_round(round), client, global)
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        if !instruction.config.contains_key(STATISTICS) {
            return self.inner.fit(instruction, ctx);
        }
        // A matcher that widens (PFNM) sends a global model wider than the client's own.
        let reshaped;
        let trainer = if instruction
            .params
            .check_layout(&ctx.trainer.spec().param_shapes())
            .is_ok()
        {
            ctx.trainer
        } else {
            reshaped = fedfuse_train::Trainer::new(
                ctx.trainer.spec().with_widths_of(&instruction.params)?,
            )?;
            &reshaped
        };
        let repaired =
            trainer.reestimate_batch_norm(&instruction.params, &ctx.data.train, self.batch_size)?;
        let mut reply = Params::new();
        for name in &self.stats {
            let t = repaired.require(name)?;
            reply.push(name.clone(), t.shape.clone(), t.data.clone())?;
        }
        let mut record = Record::from_params(reply).with_num_examples(ctx.data.train.len() as u64);
        // What the client runs now: the global model with its own statistics.
        if !ctx.data.test.is_empty() {
            let own = trainer.evaluate(&repaired, &ctx.data.test)?;
            record
                .metrics
                .insert(crate::LOCAL_ACCURACY.into(), own.accuracy);
        }
        Ok(record)
    }

    fn check_reply(&self, global: &Params, reply: &Record) -> Result<()> {
        let names: Vec<&str> = reply.params.iter().map(|(n, _)| n).collect();
        if names == self.stats.iter().map(String::as_str).collect::<Vec<_>>() {
            for (name, t) in reply.params.iter() {
                let want = global.require(name)?;
                if t.shape != want.shape {
                    return Err(FedError::BadMessage {
                        from: "a statistics reply".into(),
                        reason: format!(
                            "`{name}` has shape {:?} where the model's is {:?}",
                            t.shape, want.shape
                        ),
                    });
                }
            }
            return Ok(reply.params.check_finite()?);
        }
        self.inner.check_reply(global, reply)
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        if !statistics_round(round) {
            self.last = false;
            return self.inner.aggregate(inner_round(round), global, replies);
        }
        self.last = true;
        // Each client's statistics weigh as many batches as it ran.
        let batches =
            |r: &Reply| -> Result<f64> {
                let counter = self.stats.iter().find(|n| is_counter(n)).ok_or_else(|| {
                    FedError::BadReply {
                        client: r.client,
                        reason: "a statistics reply without a batch count".into(),
                    }
                })?;
                let t = r.record.params.require(counter)?;
                match t.data.as_slice() {
                    [batches] => Ok(f64::from(*batches).max(0.0)),
                    _ => Err(FedError::BadReply {
                        client: r.client,
                        reason: format!("`{counter}` holds {} values, not one count", t.data.len()),
                    }),
                }
            };
        let weights = replies.iter().map(batches).collect::<Result<Vec<f64>>>()?;
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Ok(Aggregate::Keep);
        }
        let mut next = global.clone();
        for name in &self.stats {
            let slot = next.get_mut(name).ok_or_else(|| FedError::MethodState {
                method: "batch_norm",
                reason: "the global model lacks a batch norm tensor of its spec",
            })?;
            if is_counter(name) {
                slot.data = vec![total as f32];
                continue;
            }
            let mut sum = vec![0.0f64; slot.data.len()];
            for (r, w) in replies.iter().zip(&weights) {
                for (s, v) in sum.iter_mut().zip(&r.record.params.require(name)?.data) {
                    *s += w * f64::from(*v);
                }
            }
            slot.data = sum.into_iter().map(|s| (s / total) as f32).collect();
        }
        Ok(Aggregate::Replace(next))
    }

    fn aggregate_no_replies(&mut self, round: usize, global: &Params) -> Result<Aggregate> {
        if statistics_round(round) {
            self.last = true;
            return Ok(Aggregate::Keep);
        }
        self.last = false;
        self.inner.aggregate_no_replies(inner_round(round), global)
    }

    /// Once the method has built its final model, the statistics round after it still runs:
    /// that is the round that repairs the final model (FedMA, GEMS and other methods that
    /// finish early would otherwise end on their averaged statistics).
    fn finished(&self) -> bool {
        self.inner.finished() && self.last
    }

    /// No streaming form: statistics rounds combine by batch counts, not the inner fold.
    fn fold(&self) -> Option<Box<dyn Fold>> {
        None
    }

    fn round_metrics(&self) -> std::collections::BTreeMap<String, f64> {
        match self.last {
            true => [("bn_statistics".to_string(), 1.0)].into(),
            false => self.inner.round_metrics(),
        }
    }
}
