//! FedL1 on the bundled digits: sparse uploads that cost fewer bytes, at FedAvg's accuracy.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::ModelSpec;
use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{MethodConfig, RunResult, SimConfig, simulate};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn run(method: &MethodConfig) -> RunResult {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    let parts = partition(&data.train.y, 10, 6, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[64], 10);
    let mut m = method.build().unwrap();
    let cfg = SimConfig {
        rounds: 6,
        seed: 8,
        local_eval: false,
        train: TrainConfig {
            optimizer: OptimizerConfig::Sgd {
                momentum: 0.9,
                weight_decay: 0.0,
            },
            lr: 0.05,
            epochs: 3,
            batch_size: 32,
        },
        ..SimConfig::default()
    };
    simulate(
        m.as_mut(),
        &Trainer::new(spec.clone()).unwrap(),
        &clients,
        &data.test,
        init_params(&spec, Init::Default, 3),
        &cfg,
        &|_| {},
    )
    .unwrap()
}

#[test]
fn group_l1_uploads_fewer_bytes_at_fedavg_accuracy() {
    let avg = run(&MethodConfig::FedAvg {
        separate_inits: false,
    });
    let l1 = run(&MethodConfig::FedL1 {
        l1: 0.02,
        threshold: 0.05,
    });
    let up = |r: &RunResult| r.rounds.iter().map(|m| m.bytes_up).sum::<u64>() as f64;
    let (a, s) = (&avg.rounds[5], &l1.rounds[5]);
    eprintln!(
        "FedAvg {:.4}, {} B up; FedL1 {:.4}, {} B up, {} zero groups per upload",
        a.global_accuracy,
        up(&avg),
        s.global_accuracy,
        up(&l1),
        s.method["upload_zero_groups"]
    );
    assert!(s.method["upload_zero_groups"] >= 10.0);
    // A third of the hidden units zero: their incoming rows cost nothing but index bits (the
    // output layer is not grouped, so it stays dense).
    assert!(up(&l1) < 0.9 * up(&avg), "{} vs {}", up(&l1), up(&avg));
    assert!(s.global_accuracy > a.global_accuracy - 0.03);
}
