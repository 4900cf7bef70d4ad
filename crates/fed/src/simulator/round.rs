//! One round's bookkeeping, shared by the simulator and the Flower strategy: the replies offered
//! and checked, the rejections, the fold or the batch aggregate, the metrics.

use std::collections::BTreeMap;
use std::time::Instant;

use fedfuse_core::{Params, Record};
use serde::{Deserialize, Serialize};

use super::ReplyBounds;
use crate::method::LOCAL_ACCURACY;
use crate::{Aggregate, FedError, Method, Reply, Result};

/// A reply left out of the aggregate, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// Client id.
    pub client: usize,
    /// What was wrong.
    pub reason: String,
}

/// What one round measured.
///
/// In a tabular federation ([`Population::Tables`](super::Population::Tables)) the global model is no classifier: the
/// accuracies and `global_loss` are NaN and the method's own scores are in `method`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundMetrics {
    /// Round, from 1.
    pub round: usize,
    /// Accuracy of the global model on the global test set (NaN for tabular methods).
    pub global_accuracy: f64,
    /// Mean cross-entropy of the global model on the global test set (NaN for tabular
    /// methods).
    pub global_loss: f64,
    /// Mean over clients of the global model's accuracy on each client's own test split
    /// (NaN when local evaluation is off, and for tabular methods).
    pub local_accuracy_mean: f64,
    /// Mean over accepted replies of each client's uploaded model on its own test split (the
    /// FedSparse paper's "local accuracy"; NaN when local evaluation is off, and for tabular
    /// methods).
    #[serde(default = "nan")]
    pub client_accuracy_mean: f64,
    /// Mean over every client that has had an upload accepted of its last one's accuracy on
    /// its own test split: the FedSparse paper's "local accuracy" ("the model configuration
    /// that the shard last communicated"), over all shards, not only this round's. NaN until
    /// some client measured one, and in records written before it was kept.
    #[serde(default = "nan")]
    pub client_accuracy_last_mean: f64,
    /// This round's accepted uploads' accuracies on their own test split, by client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_accuracies: Vec<(usize, f64)>,
    /// Mean training loss reported by the accepted clients, weighted by examples.
    pub train_loss: f64,
    /// Bytes of encoded replies (client to server).
    pub bytes_up: u64,
    /// Bytes of encoded instructions (server to client).
    pub bytes_down: u64,
    /// Parameters in the global model after the round.
    pub global_params: usize,
    /// Clients sampled.
    pub clients: usize,
    /// Replies left out of the aggregate.
    pub rejected: Vec<Rejection>,
    /// Method-specific figures ([`Method::round_metrics`]), and its evaluation
    /// ([`Method::evaluate`], [`Method::evaluate_table`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub method: BTreeMap<String, f64>,
    /// Wall time of the round in seconds.
    pub seconds: f64,
}

fn nan() -> f64 {
    f64::NAN
}

/// Each client's accuracy of its last accepted upload, kept across rounds for
/// [`RoundMetrics::client_accuracy_last_mean`]; rebuilt from the rounds on resume.
#[derive(Clone, Debug, Default)]
pub struct LastUploads {
    accuracy: BTreeMap<usize, f64>,
}

impl LastUploads {
    /// The table after `rounds`.
    pub fn replay(rounds: &[RoundMetrics]) -> Self {
        let mut last = Self::default();
        for r in rounds {
            last.note(r);
        }
        last
    }

    fn note(&mut self, round: &RoundMetrics) {
        self.accuracy
            .extend(round.client_accuracies.iter().copied());
    }

    /// Takes in `round`'s uploads and sets its `client_accuracy_last_mean`.
    pub fn update(&mut self, round: &mut RoundMetrics) {
        self.note(round);
        round.client_accuracy_last_mean = if self.accuracy.is_empty() {
            f64::NAN
        } else {
            self.accuracy.values().sum::<f64>() / self.accuracy.len() as f64
        };
    }
}

/// The server's side of one round: each reply checked, folded in the order offered (the
/// simulator and the Flower strategy both offer in client-slot order), traffic and the
/// clients' figures tallied. The simulator and `fedfuse.flwr.Strategy` both run exactly this.
pub struct RoundState {
    round: usize,
    bounds: ReplyBounds,
    clients: usize,
    fold: Option<Box<dyn crate::Fold>>,
    replies: Vec<Reply>,
    bytes_up: u64,
    bytes_down: u64,
    loss_sum: f64,
    examples: f64,
    accepted: usize,
    own: Vec<(usize, f64)>,
    rejected: Vec<Rejection>,
}

/// What is wrong with a reply's metrics, checked as its parameters are: every value finite,
/// and the figures the round reports in their range (a client claiming an accuracy of 5 or a
/// negative loss would otherwise move the round's means at will).
fn metrics_violation(record: &Record) -> Option<String> {
    for (key, &value) in &record.metrics {
        let range = match key.as_str() {
            LOCAL_ACCURACY => Some((0.0, 1.0)),
            "train_loss" => Some((0.0, f64::INFINITY)),
            _ => None,
        };
        if !value.is_finite() {
            return Some(format!("metric `{key}` is {value}, not a finite number"));
        }
        if let Some((lo, hi)) = range
            && !(lo..=hi).contains(&value)
        {
            return Some(format!(
                "metric `{key}` = {value} lies outside [{lo}, {hi}]"
            ));
        }
    }
    None
}

impl RoundState {
    /// Round `round` with `clients` sampled clients.
    pub fn new(method: &dyn Method, round: usize, clients: usize) -> Self {
        Self {
            round,
            bounds: ReplyBounds::default(),
            clients,
            fold: method.fold(),
            replies: Vec::new(),
            bytes_up: 0,
            bytes_down: 0,
            loss_sum: 0.0,
            examples: 0.0,
            accepted: 0,
            own: Vec::new(),
            rejected: Vec::new(),
        }
    }

    /// The round with `bounds` on its replies.
    pub fn bounded(mut self, bounds: ReplyBounds) -> Self {
        self.bounds = bounds;
        self
    }

    /// Whether the method folds replies as they come (so callers may offer them in chunks).
    pub fn folds(&self) -> bool {
        self.fold.is_some()
    }

    /// Counts an instruction of `bytes` sent to a client.
    pub fn count_down(&mut self, bytes: usize) {
        self.bytes_down += bytes as u64;
    }

    /// A client's decoded reply and its size on the wire, or why there is none. A failed or
    /// malformed reply is listed in the round's rejections; only the method's own fold can
    /// fail the round.
    pub fn offer(
        &mut self,
        method: &dyn Method,
        global: &Params,
        client: usize,
        reply: Result<(Record, usize)>,
    ) -> Result<()> {
        let checked = reply.and_then(|(record, bytes)| {
            self.bytes_up += bytes as u64;
            let record = method.restore_reply(global, record)?;
            method.check_reply(global, &record)?;
            let weightless = (record.num_examples == 0 && method.weighs_by_examples())
                .then(|| "it claims 0 examples, so it has no weight in the aggregate".to_string());
            match weightless
                .or_else(|| self.bounds.violation(global, &record))
                .or_else(|| metrics_violation(&record))
            {
                Some(reason) => Err(FedError::BadReply { client, reason }),
                None => Ok(record),
            }
        });
        let record = match checked {
            Ok(record) => record,
            Err(e) => {
                self.reject(client, e.to_string());
                return Ok(());
            }
        };
        if let Some(&acc) = record.metrics.get(LOCAL_ACCURACY) {
            self.own.push((client, acc));
        }
        let n = record.num_examples as f64;
        if let Some(loss) = record.metrics.get("train_loss") {
            self.loss_sum += loss * n;
            self.examples += n;
        }
        self.accepted += 1;
        let reply = Reply { client, record };
        match self.fold.as_mut() {
            Some(f) => f.add(reply),
            None => {
                self.replies.push(reply);
                Ok(())
            }
        }
    }

    /// Lists `client` as sampled but without a usable reply.
    pub fn reject(&mut self, client: usize, reason: String) {
        self.rejected.push(Rejection { client, reason });
    }

    /// Aggregates the accepted replies into `global` (with none, what
    /// [`Method::aggregate_no_replies`] says: kept, for most methods).
    pub fn finish(self, method: &mut dyn Method, global: &mut Params) -> Result<RoundTally> {
        let next = match self.fold {
            Some(f) if self.accepted > 0 => f.finish(self.round, global)?,
            None if self.accepted > 0 => method.aggregate(self.round, global, &self.replies)?,
            _ => method.aggregate_no_replies(self.round, global)?,
        };
        if let Aggregate::Replace(next) = next {
            *global = next;
        }
        Ok(RoundTally {
            round: self.round,
            clients: self.clients,
            train_loss: self.loss_sum / self.examples.max(1.0),
            client_accuracy_mean: if self.own.is_empty() {
                f64::NAN
            } else {
                self.own.iter().map(|o| o.1).sum::<f64>() / self.own.len() as f64
            },
            client_accuracies: self.own,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            rejected: self.rejected,
        })
    }
}

/// What a finished round measured before the global model is evaluated.
#[derive(Clone, Debug)]
pub struct RoundTally {
    round: usize,
    clients: usize,
    train_loss: f64,
    client_accuracy_mean: f64,
    client_accuracies: Vec<(usize, f64)>,
    bytes_up: u64,
    bytes_down: u64,
    rejected: Vec<Rejection>,
}

impl RoundTally {
    /// The round's metrics, given the evaluation of `global` (accuracy, loss and local mean,
    /// NaN where not measured) and the method's own figures.
    pub fn metrics(
        self,
        global: &Params,
        (global_accuracy, global_loss, local_accuracy_mean): (f64, f64, f64),
        method: BTreeMap<String, f64>,
        started: Instant,
    ) -> RoundMetrics {
        RoundMetrics {
            round: self.round,
            global_accuracy,
            global_loss,
            local_accuracy_mean,
            client_accuracy_mean: self.client_accuracy_mean,
            client_accuracy_last_mean: f64::NAN,
            client_accuracies: self.client_accuracies,
            train_loss: self.train_loss,
            bytes_up: self.bytes_up,
            bytes_down: self.bytes_down,
            global_params: global.num_values(),
            clients: self.clients,
            rejected: self.rejected,
            method,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_with_metrics_out_of_range_are_rejected_with_the_metric_named() {
        let method = crate::FedAvg;
        let mut global = Params::new();
        global.push("w", vec![2], vec![0.0, 0.0]).unwrap();
        let mut state = RoundState::new(&method, 1, 4);
        let reply = |key: &str, value: f64| {
            let mut r = Record::from_params(global.clone()).with_num_examples(10);
            r.metrics.insert(key.into(), value);
            Ok((r, 100))
        };
        state
            .offer(&method, &global, 0, reply(LOCAL_ACCURACY, 5.0))
            .unwrap();
        state
            .offer(&method, &global, 1, reply("train_loss", -1e30))
            .unwrap();
        state
            .offer(&method, &global, 2, reply("anything", f64::INFINITY))
            .unwrap();
        state
            .offer(&method, &global, 3, reply("train_loss", 0.5))
            .unwrap();
        let rejected: Vec<(usize, &str)> = state
            .rejected
            .iter()
            .map(|r| (r.client, r.reason.as_str()))
            .collect();
        assert_eq!(rejected.len(), 3, "{rejected:?}");
        assert!(
            rejected[0].1.contains("`local_accuracy` = 5"),
            "{rejected:?}"
        );
        assert!(rejected[1].1.contains("`train_loss`"), "{rejected:?}");
        assert!(rejected[2].1.contains("`anything` is inf"), "{rejected:?}");
        assert_eq!(state.accepted, 1);
    }
}
