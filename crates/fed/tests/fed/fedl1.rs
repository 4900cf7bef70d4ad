//! FedL1 on the bundled digits: sparse uploads and downloads that cost fewer bytes, at FedAvg's
//! accuracy.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use crate::common;

use fedfuse_core::ModelSpec;
use fedfuse_data::PartitionSpec;
use fedfuse_fed::{BuildContext, MethodConfig, RunResult};

fn run(method: &MethodConfig) -> RunResult {
    let d = common::digits(6, &PartitionSpec::Iid {}, 8);
    let spec = ModelSpec::mlp(64, &[64], 10);
    common::run(
        method
            .build_with(BuildContext {
                spec: Some(spec.clone()),
                ..BuildContext::default()
            })
            .unwrap()
            .as_mut(),
        &d,
        &spec,
        6,
        8,
        common::sgd(0.9, 3),
    )
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
    let down = |r: &RunResult| r.rounds.iter().map(|m| m.bytes_down).sum::<u64>() as f64;
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
    // The server zeroes the same small groups before it sends: downloads shrink as well.
    assert!(
        down(&l1) < 0.95 * down(&avg),
        "{} vs {}",
        down(&l1),
        down(&avg)
    );
    assert!(s.global_accuracy > a.global_accuracy - 0.03);
}
