//! The clients' own-model accuracy on their own test splits (fedsparse-em's "local accuracy").

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::ModelSpec;
use fedfuse_data::{PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{MethodConfig, SimConfig, simulate};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

#[test]
fn with_one_client_its_upload_is_the_global_model() {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(2);
    let parts = partition(&data.train.y, 10, 1, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.2, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[16], 10);
    let run = |local_eval: bool| {
        let mut m = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        })
        .build()
        .unwrap();
        let cfg = SimConfig {
            rounds: 2,
            seed: 2,
            local_eval,
            train: TrainConfig {
                optimizer: OptimizerConfig::Sgd {
                    momentum: 0.9,
                    weight_decay: 0.0,
                },
                lr: 0.05,
                epochs: 1,
                batch_size: 32,
                dropout: 0.0,
            },
            ..SimConfig::default()
        };
        simulate(
            m.as_mut(),
            &Trainer::new(spec.clone()).unwrap(),
            &clients,
            &data.test,
            init_params(&spec, Init::Default, 2),
            &cfg,
            &|_| {},
        )
        .unwrap()
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
