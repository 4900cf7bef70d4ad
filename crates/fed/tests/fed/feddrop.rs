//! FedDrop on the bundled digits: sub-model traffic and training.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::common;

use fedfuse_core::ModelSpec;
use fedfuse_data::PartitionSpec;
use fedfuse_fed::{BuildContext, FedDrop, MethodConfig, Population, RunResult};

fn run(method: &MethodConfig, rounds: usize) -> RunResult {
    let d = common::digits(5, &PartitionSpec::Iid {}, 9);
    let spec = ModelSpec::mlp(64, &[64, 32], 10);
    let mut m = method
        .build_with(BuildContext {
            spec: Some(spec.clone()),
            seed: 9,
            ..BuildContext::default()
        })
        .unwrap();
    common::run(m.as_mut(), &d, &spec, rounds, 9, common::sgd(0.9, 2))
}

#[test]
fn dropping_nothing_is_fedavg() {
    let drop = run(
        &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.0 }),
        3,
    );
    let avg = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
        3,
    );
    assert_eq!(drop.params, avg.params);
    assert_eq!(drop.rounds[2].bytes_down, avg.rounds[2].bytes_down);
}

#[test]
fn thinner_traffic_and_still_learns() {
    let drop = run(
        &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.5 }),
        1,
    );
    let avg = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
        20,
    );
    // 64-64-32-10 has 6,570 parameters, its half-width sub-model 64-32-16-10 2,778 (0.42),
    // plus the same headers.
    let (d, a) = (&drop.rounds[0], &avg.rounds[0]);
    let ratio = d.bytes_down as f64 / a.bytes_down as f64;
    assert!((0.42..0.46).contains(&ratio), "down ratio {ratio}");
    assert!((0.42..0.46).contains(&(d.bytes_up as f64 / a.bytes_up as f64)));

    // A quarter of the units dropped: a noisier path, but it gets there.
    let drop = run(
        &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.25 }),
        20,
    );
    let last: Vec<f64> = drop.rounds[15..]
        .iter()
        .map(|r| r.global_accuracy)
        .collect();
    let mean = last.iter().sum::<f64>() / 5.0;
    eprintln!(
        "rounds 16-20: FedDrop(0.25) {last:?}, FedAvg {:.4}",
        avg.rounds[19].global_accuracy
    );
    assert!(mean > 0.8, "FedDrop(0.25) mean of rounds 16-20 {mean}");
    assert!(last.iter().copied().fold(0.0, f64::max) > 0.9);
    // Units outside the first round's sub-model were trained too.
    assert_ne!(
        drop.params,
        run(
            &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.25 }),
            1
        )
        .params
    );
}

#[test]
fn kept_units_are_sorted_distinct_and_change_per_round() {
    let m = FedDrop::new(0.25, &ModelSpec::mlp(4, &[100, 8], 2), 3).unwrap();
    let (a, b) = (m.kept(1), m.kept(2));
    assert_eq!(a[0].len(), 75);
    assert_eq!(a[1].len(), 6);
    assert!(a[0].windows(2).all(|w| w[0] < w[1]) && a[0][74] < 100);
    assert_ne!(a, b);
    assert_eq!(a, m.kept(1));
    // The fraction is a setting, checked with the others of its table.
    let all = fedfuse_fed::FedDropSettings { fraction: 1.0 }
        .check()
        .unwrap_err();
    assert!(
        matches!(
            all,
            fedfuse_fed::FedError::MethodSetting {
                field: "fraction",
                ..
            }
        ),
        "{all}"
    );
    // The architecture is the build's to check: no hidden layer, no units to drop.
    assert!(FedDrop::new(0.5, &ModelSpec::mlp(4, &[], 2), 0).is_err());
}

/// LeNet-5 keeps its shapes: dropped filters and units travel as zeros of a sparse record,
/// train gated off, and keep their values in the global model.
#[test]
fn lenet5_drops_filters_and_units_with_sparse_traffic() {
    use fedfuse_data::{client_splits, load_dataset, partition};
    use fedfuse_fed::{SimConfig, simulate};
    use fedfuse_train::{Init, Trainer, init_params};
    use rand::SeedableRng;

    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let train = data.train.subset(&(0..3000).collect::<Vec<_>>());
    let test = data.test.subset(&(0..1000).collect::<Vec<_>>());
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let parts = partition(&train.y, 10, 5, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let clients = client_splits(&train, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::LeNet5 {
        channels: 1,
        side: 28,
        classes: 10,
    };
    let init = init_params(&spec, Init::Default, 4);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let run = |method: &MethodConfig, rounds: usize| {
        let mut m = method
            .build_with(BuildContext {
                spec: Some(spec.clone()),
                seed: 4,
                ..BuildContext::default()
            })
            .unwrap();
        let cfg = SimConfig {
            rounds,
            seed: 4,
            local_eval: false,
            // Momentum 0.5: at 0.9 (effective step 0.5) FedDrop's 4-round trajectory here was
            // chaotic (0.30, 0.56, 0.15, 0.54 on this seed), so a rounding-level change in
            // training flipped the accuracy check below.
            train: common::sgd(0.5, 2),
            ..SimConfig::default()
        };
        simulate(
            m.as_mut(),
            Population::labelled(&trainer, &clients, &test),
            init.clone(),
            &cfg,
            &|_| {},
        )
        .unwrap()
    };
    let half = run(
        &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.5 }),
        1,
    );
    let avg = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
        1,
    );
    // Half of every layer's units: 15,738 of LeNet-5's 61,706 values (0.255) travel, plus one
    // index bit per value.
    let (h, a) = (&half.rounds[0], &avg.rounds[0]);
    for ratio in [
        h.bytes_down as f64 / a.bytes_down as f64,
        h.bytes_up as f64 / a.bytes_up as f64,
    ] {
        assert!((0.255..0.32).contains(&ratio), "traffic ratio {ratio}");
    }
    assert!(h.rejected.is_empty(), "{:?}", h.rejected);
    // Dropped filters keep their initial weights; kept ones were trained.
    let m = FedDrop::new(0.5, &spec, 4).unwrap();
    let kept = &m.kept(1)[0];
    let (before, after) = (
        init.require("conv1.weight").unwrap(),
        half.params.require("conv1.weight").unwrap(),
    );
    for f in 0..6 {
        let same = before.data[f * 25..(f + 1) * 25] == after.data[f * 25..(f + 1) * 25];
        assert_eq!(same, !kept.contains(&f), "filter {f}");
    }
    // Dropping nothing is FedAvg, bit for bit (gates of 1 change no value).
    let avg2 = run(
        &MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
            separate_inits: false,
        }),
        2,
    );
    assert_eq!(
        run(
            &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.0 }),
            2
        )
        .params,
        avg2.params
    );
    // A quarter of the units dropped still learns: 0.77 on this seed (FedAvg 0.74), and 0.76-0.86
    // on seeds 1-6 (measured 2026-12-02), each trajectory rising.
    let quarter = run(
        &MethodConfig::FedDrop(fedfuse_fed::FedDropSettings { fraction: 0.25 }),
        4,
    )
    .rounds[3]
        .global_accuracy;
    assert!(
        quarter > 0.7,
        "LeNet-5 FedDrop(0.25) after 4 rounds: {quarter}"
    );
}
