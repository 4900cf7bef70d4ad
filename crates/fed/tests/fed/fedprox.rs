//! FedProx where client drift is strong: one class per client, ten local epochs at a large
//! learning rate. The proximal term keeps the replies near the global model, and that is what
//! lets the federation learn.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::sync::Mutex;

use crate::common;

use fedfuse_core::{ModelSpec, Params, Record};
use fedfuse_data::{ClassAssignment, PartitionSpec};
use fedfuse_fed::{Aggregate, ClientContext, FedAvg, FedProx, Method, Reply, Result};
use fedfuse_train::{OptimizerConfig, TrainConfig};

/// Wraps a method and records each round's mean L2 distance of the replies from the global
/// model the clients started from.
struct Drift<M> {
    inner: M,
    per_round: Mutex<Vec<f64>>,
}

impl<M> Drift<M> {
    fn new(inner: M) -> Self {
        Self {
            inner,
            per_round: Mutex::new(Vec::new()),
        }
    }

    /// Mean over the rounds.
    fn mean(self) -> f64 {
        let d = self.per_round.into_inner().unwrap();
        d.iter().sum::<f64>() / d.len() as f64
    }
}

impl<M: Method> Method for Drift<M> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.inner.instruct(round, client, global)
    }
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        self.inner.fit(instruction, ctx)
    }
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let distance = |p: &Params| {
            p.iter()
                .zip(global.iter())
                .flat_map(|((_, a), (_, b))| a.data.iter().zip(&b.data))
                .map(|(x, y)| f64::from(x - y).powi(2))
                .sum::<f64>()
                .sqrt()
        };
        let total: f64 = replies.iter().map(|r| distance(&r.record.params)).sum();
        self.per_round
            .lock()
            .unwrap()
            .push(total / replies.len() as f64);
        self.inner.aggregate(round, global, replies)
    }
}

/// Test accuracy averaged over the last five rounds (one round's accuracy swings by tens of
/// points under FedAvg here) and the replies' mean distance from the global model.
fn run<M: Method>(method: M, seed: u64) -> (f64, f64) {
    let split = PartitionSpec::Pathological {
        classes_per_client: 1,
        class_assignment_mode: ClassAssignment::Random,
    };
    let d = common::digits(10, &split, seed);
    let spec = ModelSpec::mlp(64, &[32], 10);
    let train = TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.1,
        epochs: 10,
        batch_size: 32,
        dropout: 0.0,
    };
    let mut m = Drift::new(method);
    let r = common::run(&mut m, &d, &spec, 20, seed, train);
    let tail = &r.rounds[r.rounds.len() - 5..];
    let acc = tail.iter().map(|r| r.global_accuracy).sum::<f64>() / tail.len() as f64;
    (acc, m.mean())
}

/// 10 clients of one digit class each, 10 local epochs of SGD (lr 0.1, momentum 0.9), 20
/// rounds. `mu = 0.03` was picked from {0.01, 0.03, 0.1} on seeds 0-3 (mean accuracy over the
/// last five rounds 0.779 for 0.03, 0.725 for 0.01, 0.124 for 0.1, 0.413 for FedAvg); the test
/// runs seeds 4-6, which played no part in the choice. Measured there (accuracy over the last
/// five rounds; mean reply distance from the global model):
///
/// | seed | FedAvg       | FedProx 0.03 |
/// |------|--------------|--------------|
/// | 4    | 0.353, 7.12  | 0.798, 2.21  |
/// | 5    | 0.272, 7.18  | 0.835, 2.19  |
/// | 6    | 0.181, 7.90  | 0.814, 2.20  |
///
/// (seeds 7-9 agree: FedAvg 0.591, 0.364, 0.402; FedProx 0.787, 0.778, 0.787). FedProx does
/// not win everywhere: with two classes per client or lr 0.05 the drift is milder, FedAvg
/// reaches 0.85-0.9 and the term only slows it down.
#[test]
fn proximal_term_keeps_replies_near_the_global_model_and_beats_fedavg_under_drift() {
    for seed in 4..7 {
        let (avg, avg_drift) = run(FedAvg, seed);
        let (prox, prox_drift) = run(FedProx { mu: 0.03 }, seed);
        eprintln!(
            "seed {seed}: FedAvg {avg:.3} (reply distance {avg_drift:.2}), FedProx {prox:.3} \
             ({prox_drift:.2})"
        );
        assert!(
            prox_drift < 0.5 * avg_drift,
            "seed {seed}: replies {prox_drift:.2} from the global model with mu 0.03, \
             {avg_drift:.2} without"
        );
        assert!(prox > 0.75, "seed {seed}: FedProx {prox:.3}");
        assert!(
            prox > avg + 0.3,
            "seed {seed}: FedProx {prox:.3} vs FedAvg {avg:.3}"
        );
    }
}
