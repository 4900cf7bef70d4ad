//! The clients' own-model accuracy on their own test splits (fedsparse-em's "local accuracy").

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::ModelSpec;
use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{MethodConfig, Population, SimConfig, simulate};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// FedAvg with `sgd()` on the digits split IID among `clients` (a fifth of each share kept
/// as its test split), under `cfg` with `train` and `seed` filled in.
fn fedavg_on_digits(clients: usize, seed: u64, cfg: SimConfig) -> fedfuse_fed::RunResult {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let parts = partition(&data.train.y, 10, clients, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.2, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[16], 10);
    let mut m = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
        separate_inits: false,
    })
    .build()
    .unwrap();
    let cfg = SimConfig {
        seed,
        train: sgd(),
        ..cfg
    };
    simulate(
        m.as_mut(),
        Population::labelled(&Trainer::new(spec.clone()).unwrap(), &clients, &data.test),
        init_params(&spec, Init::Default, seed),
        &cfg,
        &|_| {},
    )
    .unwrap()
}

#[test]
fn with_one_client_its_upload_is_the_global_model() {
    let run = |local_eval: bool| {
        let cfg = SimConfig {
            rounds: 2,
            local_eval,
            ..SimConfig::default()
        };
        fedavg_on_digits(1, 2, cfg)
    };
    let on = run(true);
    for r in &on.rounds {
        // FedAvg of one client is that client's upload, so both measures coincide.
        assert_eq!(r.client_accuracy_mean, r.local_accuracy_mean);
        assert!(r.client_accuracy_mean > 0.5);
    }
    let off = run(false);
    assert!(off.rounds[1].client_accuracy_mean.is_nan());
    // The metric travels in the reply but does not change the model.
    assert_eq!(on.params, off.params);
}

#[test]
fn eval_every_evaluates_every_kth_round_and_the_last_and_changes_nothing_else() {
    let run = |every: usize| {
        let cfg = SimConfig {
            rounds: 7,
            clients_per_round: fedfuse_fed::ClientsPerRound::Count(2),
            eval_every: std::num::NonZeroUsize::new(every).unwrap(),
            ..SimConfig::default()
        };
        fedavg_on_digits(4, 4, cfg)
    };
    let every = run(1);
    let third = run(3);
    let evaluated: Vec<usize> = third
        .rounds
        .iter()
        .filter(|r| !r.global_accuracy.is_nan())
        .map(|r| r.round)
        .collect();
    assert_eq!(evaluated, [3, 6, 7]);
    for (a, b) in every.rounds.iter().zip(&third.rounds) {
        if evaluated.contains(&a.round) {
            assert_eq!(a.global_accuracy, b.global_accuracy);
            assert_eq!(a.global_loss, b.global_loss);
            assert_eq!(a.local_accuracy_mean, b.local_accuracy_mean);
        } else {
            assert!(b.global_loss.is_nan() && b.local_accuracy_mean.is_nan());
        }
        // The clients measure their own uploads every round.
        assert_eq!(a.client_accuracy_mean, b.client_accuracy_mean);
        assert!(b.client_accuracy_mean.is_finite());
        assert_eq!((a.bytes_up, a.bytes_down), (b.bytes_up, b.bytes_down));
    }
    assert!(every.rounds.iter().all(|r| r.global_accuracy.is_finite()));
    // The paper's local accuracy: every client's last upload, not only this round's.
    let mut last = std::collections::BTreeMap::new();
    for r in &third.rounds {
        assert_eq!(r.client_accuracies.len(), 2);
        let mean = r.client_accuracies.iter().map(|a| a.1).sum::<f64>() / 2.0;
        assert!((mean - r.client_accuracy_mean).abs() < 1e-12);
        last.extend(r.client_accuracies.iter().copied());
        let want = last.values().sum::<f64>() / last.len() as f64;
        assert!(
            (r.client_accuracy_last_mean - want).abs() < 1e-12,
            "round {}",
            r.round
        );
    }
    assert_eq!(last.len(), 4, "every client took part");
    assert!(
        third.rounds[6].global_accuracy > 0.6,
        "{}",
        third.rounds[6].global_accuracy
    );
    assert_eq!(every.params, third.params);
}

/// SGD with momentum 0.9, lr 0.05, batch 32, one epoch.
fn sgd() -> TrainConfig {
    TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs: 1,
        batch_size: 32,
        dropout: 0.0,
    }
}
