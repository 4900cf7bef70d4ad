//! Shared set-up of the federation tests: the bundled digits split among clients, SGD, a run.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // each test file uses a part

use fedfuse_core::ModelSpec;
use fedfuse_data::{ClientData, Dataset, PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{Method, Population, RunResult, SimConfig, simulate};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Digits split among clients (all of each client's share is training data).
pub struct Digits {
    pub clients: Vec<ClientData>,
    pub test: Dataset,
}

pub fn digits(clients: usize, split: &PartitionSpec, seed: u64) -> Digits {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let parts = partition(&data.train.y, 10, clients, split, &mut rng).unwrap();
    Digits {
        clients: client_splits(&data.train, &parts, 0.0, &mut rng).unwrap(),
        test: data.test,
    }
}

/// PFNM's heterogeneous split.
pub fn dirichlet() -> PartitionSpec {
    PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 10,
        self_balancing: true,
    }
}

/// SGD, lr 0.05, batch 32.
pub fn sgd(momentum: f64, epochs: usize) -> TrainConfig {
    TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs,
        batch_size: 32,
        dropout: 0.0,
    }
}

/// `rounds` rounds of `method` from `spec`'s default initialisation (seeded by `seed`).
pub fn run(
    method: &mut dyn Method,
    d: &Digits,
    spec: &ModelSpec,
    rounds: usize,
    seed: u64,
    train: TrainConfig,
) -> RunResult {
    let cfg = SimConfig {
        rounds,
        seed,
        local_eval: false,
        train,
        ..SimConfig::default()
    };
    simulate(
        method,
        Population::labelled(&Trainer::new(spec.clone()).unwrap(), &d.clients, &d.test),
        init_params(spec, Init::Default, seed),
        &cfg,
        &|_| {},
    )
    .unwrap()
}
