use fedfuse_data::{DataError, Dataset, PartitionSpec, client_splits, partition, read_idx_labels};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::common::mnist_dir;

fn mnist_labels() -> Vec<u32> {
    read_idx_labels(&mnist_dir().join("train-labels-idx1-ubyte.gz"))
        .unwrap()
        .into_iter()
        .map(u32::from)
        .collect()
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Every index in 0..n appears exactly once.
fn is_exact_cover(parts: &[Vec<usize>], n: usize) -> bool {
    let mut seen = vec![false; n];
    for &i in parts.iter().flatten() {
        if i >= n || seen[i] {
            return false;
        }
        seen[i] = true;
    }
    seen.iter().all(|&s| s)
}

fn classes_of(labels: &[u32], part: &[usize]) -> std::collections::BTreeSet<u32> {
    part.iter().map(|&i| labels[i]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn iid_uses_every_sample_once(
        labels in prop::collection::vec(0u32..5, 1..400),
        clients in 1usize..30,
        seed in any::<u64>(),
    ) {
        let clients = clients.min(labels.len());
        let parts = partition(&labels, 5, clients, &PartitionSpec::Iid {}, &mut rng(seed)).unwrap();
        prop_assert_eq!(parts.len(), clients);
        prop_assert!(is_exact_cover(&parts, labels.len()));
        let sizes: Vec<usize> = parts.iter().map(Vec::len).collect();
        prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
    }

    #[test]
    fn dirichlet_uses_every_sample_once(
        labels in prop::collection::vec(0u32..10, 1..400),
        clients in 1usize..20,
        alpha in 0.05f64..50.0,
        balance in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let clients = clients.min(labels.len());
        let spec = PartitionSpec::Dirichlet { alpha, min_partition_size: 0, self_balancing: balance };
        let parts = partition(&labels, 10, clients, &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(parts.len(), clients);
        prop_assert!(is_exact_cover(&parts, labels.len()));
    }

    #[test]
    fn partitions_are_deterministic(seed in any::<u64>(), which in 0usize..4) {
        let labels: Vec<u32> = (0..500u32).map(|i| (i * 7 + i / 3) % 10).collect();
        let spec = [
            PartitionSpec::Iid {},
            PartitionSpec::dirichlet(0.5),
            PartitionSpec::Pathological { classes_per_client: 3 },
            PartitionSpec::Shards { shards_per_client: 2, shard_size: 20 },
        ][which].clone();
        let a = partition(&labels, 10, 8, &spec, &mut rng(seed)).unwrap();
        let b = partition(&labels, 10, 8, &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(&a, &b);
        let c = partition(&labels, 10, 8, &spec, &mut rng(seed.wrapping_add(1))).unwrap();
        prop_assert_ne!(a, c);
    }
}

#[test]
fn dirichlet_self_balancing_respects_min_size() {
    let labels = mnist_labels();
    for seed in 0..3 {
        let spec = PartitionSpec::Dirichlet {
            alpha: 0.3,
            min_partition_size: 500,
            self_balancing: true,
        };
        let parts = partition(&labels, 10, 30, &spec, &mut rng(seed)).unwrap();
        assert!(is_exact_cover(&parts, labels.len()));
        assert!(
            parts.iter().all(|p| p.len() >= 500),
            "{:?}",
            parts.iter().map(Vec::len).collect::<Vec<_>>()
        );
        // balancing caps growth: nobody ends far above the average of 2000
        assert!(parts.iter().all(|p| p.len() < 2 * 2000 + 6742));
    }
}

/// Mean over clients of the share of the client's most common class.
fn mean_max_share(labels: &[u32], parts: &[Vec<usize>]) -> f64 {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = [0usize; 10];
            p.iter().for_each(|&i| c[labels[i] as usize] += 1);
            *c.iter().max().unwrap() as f64 / p.len() as f64
        })
        .sum::<f64>()
        / parts.len() as f64
}

#[test]
fn smaller_alpha_is_more_skewed() {
    let labels = mnist_labels();
    let skew = |alpha: f64| {
        let spec = PartitionSpec::Dirichlet {
            alpha,
            min_partition_size: 10,
            self_balancing: false,
        };
        let parts = partition(&labels, 10, 20, &spec, &mut rng(7)).unwrap();
        assert!(is_exact_cover(&parts, labels.len()));
        mean_max_share(&labels, &parts)
    };
    let (s01, s1, s100) = (skew(0.1), skew(1.0), skew(100.0));
    // IID has a max-class share of about 0.11; alpha = 0.1 concentrates most of a client on one class
    assert!(s100 < 0.16, "alpha 100: {s100}");
    assert!(s01 > 0.5, "alpha 0.1: {s01}");
    assert!(s01 > s1 && s1 > s100, "{s01} {s1} {s100}");
}

#[test]
fn dirichlet_gives_up_with_advice() {
    let labels: Vec<u32> = (0..200).map(|i| (i % 10) as u32).collect();
    let spec = PartitionSpec::Dirichlet {
        alpha: 0.01,
        min_partition_size: 15,
        self_balancing: false,
    };
    let e = partition(&labels, 10, 12, &spec, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("10 tries") && e.contains("alpha") && e.contains("clients"),
        "{e}"
    );
    let spec = PartitionSpec::Dirichlet {
        alpha: 1.0,
        min_partition_size: 30,
        self_balancing: false,
    };
    let e = partition(&labels, 10, 10, &spec, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("exceeds"), "{e}");
}

#[test]
fn pathological_gives_exactly_k_classes() {
    let labels = mnist_labels();
    for (clients, k) in [(20, 2), (5, 2), (7, 3), (3, 1)] {
        let spec = PartitionSpec::Pathological {
            classes_per_client: k,
        };
        let parts = partition(&labels, 10, clients, &spec, &mut rng(clients as u64)).unwrap();
        for p in &parts {
            assert_eq!(classes_of(&labels, p).len(), k);
        }
        let used: std::collections::BTreeSet<u32> =
            parts.iter().flat_map(|p| classes_of(&labels, p)).collect();
        if clients * k >= 10 {
            assert_eq!(used.len(), 10, "every class owned");
            assert!(is_exact_cover(&parts, labels.len()));
        } else {
            assert_eq!(
                used.len(),
                parts
                    .iter()
                    .flat_map(|p| classes_of(&labels, p))
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
            );
        }
    }
    // samples of a class are split evenly among its owners (np.array_split)
    let parts = partition(
        &labels,
        10,
        10,
        &PartitionSpec::Pathological {
            classes_per_client: 10,
        },
        &mut rng(0),
    )
    .unwrap();
    for p in &parts {
        assert!((p.len() as i64 - 6000).abs() <= 10, "{}", p.len());
    }
}

#[test]
fn shards_have_fixed_sizes() {
    let labels = mnist_labels();
    let spec = PartitionSpec::Shards {
        shards_per_client: 2,
        shard_size: 300,
    };
    let parts = partition(&labels, 10, 100, &spec, &mut rng(3)).unwrap();
    assert_eq!(parts.len(), 100);
    assert!(parts.iter().all(|p| p.len() == 600));
    assert!(
        is_exact_cover(&parts, 60000),
        "100 x 2 x 300 = 60000 uses every sample"
    );
    // sorted shards: a client holds at most 2 classes, usually, and never more than 4
    let mean_classes = parts
        .iter()
        .map(|p| classes_of(&labels, p).len())
        .sum::<usize>() as f64
        / 100.0;
    assert!(mean_classes <= 2.5, "{mean_classes}");
    let e = partition(&labels, 10, 101, &spec, &mut rng(3))
        .unwrap_err()
        .to_string();
    assert!(e.contains("60600") && e.contains("exceeds"), "{e}");
}

#[test]
fn error_cases() {
    let labels = vec![0u32, 1, 2, 1];
    let err = |clients: usize, spec: PartitionSpec| {
        let e = partition(&labels, 3, clients, &spec, &mut rng(0)).unwrap_err();
        assert!(matches!(e, DataError::Partition(_)), "{e:?}");
        e.to_string()
    };
    assert!(err(0, PartitionSpec::Iid {}).contains("0 clients"));
    assert!(err(5, PartitionSpec::Iid {}).contains("at most 4"));
    assert!(err(2, PartitionSpec::dirichlet(0.0)).contains("alpha"));
    assert!(
        err(
            2,
            PartitionSpec::Dirichlet {
                alpha: f64::NAN,
                min_partition_size: 0,
                self_balancing: false
            }
        )
        .contains("alpha")
    );
    assert!(
        err(
            2,
            PartitionSpec::Pathological {
                classes_per_client: 4
            }
        )
        .contains("classes_per_client")
    );
    assert!(
        err(
            2,
            PartitionSpec::Pathological {
                classes_per_client: 0
            }
        )
        .contains("classes_per_client")
    );
    assert!(
        err(
            2,
            PartitionSpec::Shards {
                shards_per_client: 0,
                shard_size: 1
            }
        )
        .contains("at least 1")
    );
    assert!(
        partition(&labels, 2, 2, &PartitionSpec::Iid {}, &mut rng(0))
            .unwrap_err()
            .to_string()
            .contains("label 2")
    );
}

#[test]
fn client_splits_split_each_partition() {
    let n = 103;
    let ds = Dataset::new(
        (0..n * 2).map(|v| v as f32).collect(),
        (0..n).map(|i| (i % 3) as u32).collect(),
        vec![2],
        3,
    )
    .unwrap();
    let parts = partition(&ds.y, 3, 4, &PartitionSpec::Iid {}, &mut rng(1)).unwrap();
    let clients = client_splits(&ds, &parts, 0.2, &mut rng(2)).unwrap();
    assert_eq!(clients.len(), 4);
    for (c, p) in clients.iter().zip(&parts) {
        let n_test = (0.2 * p.len() as f64).round() as usize;
        assert_eq!(c.test.len(), n_test);
        assert_eq!(c.train.len() + c.test.len(), p.len());
        // the samples stay paired with their labels
        for d in [&c.train, &c.test] {
            for i in 0..d.len() {
                let orig = d.sample(i)[0] as usize / 2;
                assert_eq!(d.y[i], (orig % 3) as u32);
            }
        }
    }
    // at least one training sample, even with a big test fraction
    let one = client_splits(&ds, &[vec![5]], 0.9, &mut rng(0)).unwrap();
    assert_eq!((one[0].train.len(), one[0].test.len()), (1, 0));
    let e = client_splits(&ds, &[vec![1, 2], vec![]], 0.2, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("client 1"), "{e}");
    let e = client_splits(&ds, &[vec![1, 500]], 0.2, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("client 0") && e.contains("500"), "{e}");
    assert!(client_splits(&ds, &parts, 1.0, &mut rng(0)).is_err());
}
