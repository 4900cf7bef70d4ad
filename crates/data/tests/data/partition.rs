use fedfuse_data::{
    CIFAR100_COARSE_OF_FINE, ClassAssignment, Column, CsvOptions, DataError, Dataset, GroupMode,
    LabelColumn, PartitionSpec, client_splits, partition, partition_with, read_csv_table,
    read_idx_labels,
};
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
            pathological(3, ClassAssignment::Random),
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
            class_assignment_mode: ClassAssignment::Random,
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
            class_assignment_mode: ClassAssignment::Random,
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
                classes_per_client: 4,
                class_assignment_mode: ClassAssignment::Random,
            }
        )
        .contains("classes_per_client")
    );
    assert!(
        err(
            2,
            PartitionSpec::Pathological {
                classes_per_client: 0,
                class_assignment_mode: ClassAssignment::Random,
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
    // and at least one test sample where 0.2 of the partition rounds to none (every client
    // then reports a local accuracy), none with a fraction of 0
    let small = client_splits(&ds, &[vec![1, 2], vec![3, 4, 6]], 0.2, &mut rng(0)).unwrap();
    assert!(
        small.iter().all(|c| c.test.len() == 1),
        "{:?}",
        small.iter().map(|c| c.test.len()).collect::<Vec<_>>()
    );
    let none = client_splits(&ds, &[vec![1, 2]], 0.0, &mut rng(0)).unwrap();
    assert_eq!(none[0].test.len(), 0);
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

// ---- The partitioners added after the first four: each one's defining rule. ----

fn sizes(parts: &[Vec<usize>]) -> Vec<usize> {
    parts.iter().map(Vec::len).collect()
}

/// No index appears twice and every index is below `n`.
fn is_disjoint(parts: &[Vec<usize>], n: usize) -> bool {
    let mut seen = vec![false; n];
    parts
        .iter()
        .flatten()
        .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}

/// Flower's `IdToSizeFncPartitioner` sizes, written out independently of the library:
/// `floor(n * f(id) / sum f)` for ids 1..=m, the rest to the last.
fn flower_sizes(f: fn(f64) -> f64, m: usize, n: usize) -> Vec<usize> {
    let units: Vec<f64> = (1..=m).map(|id| f(id as f64)).collect();
    let total: f64 = units.iter().sum();
    let mut s: Vec<usize> = units
        .iter()
        .map(|u| (u / total * n as f64).floor() as usize)
        .collect();
    let rest = n - s.iter().sum::<usize>();
    *s.last_mut().unwrap() += rest;
    s
}

fn categorical(values: &[u32]) -> Column {
    let names: Vec<String> = values.iter().map(|v| format!("id{v:02}")).collect();
    Column::categorical(&names)
}

/// The distinct values of `column` in the rows of `part`.
fn values_in(column: &Column, part: &[usize]) -> std::collections::BTreeSet<String> {
    part.iter()
        .map(|&r| match column {
            Column::Real(v) => format!("{}", v[r]),
            Column::Categorical { .. } => column.level(r).unwrap().to_string(),
        })
        .collect()
}

fn pathological(k: usize, mode: ClassAssignment) -> PartitionSpec {
    PartitionSpec::Pathological {
        classes_per_client: k,
        class_assignment_mode: mode,
    }
}

/// Partitions rows of `column` (all labelled 0) by a spec that splits by it.
fn by_column(
    column: &Column,
    clients: usize,
    spec: &PartitionSpec,
    seed: u64,
) -> fedfuse_data::Result<Vec<Vec<usize>>> {
    let labels = vec![0u32; column.len()];
    partition_with(&labels, Some(column), 1, clients, spec, &mut rng(seed))
}

const MODES: [ClassAssignment; 3] = [
    ClassAssignment::Random,
    ClassAssignment::Deterministic,
    ClassAssignment::FirstDeterministic,
];
const GROUP_MODES: [GroupMode; 4] = [
    GroupMode::AllowSmaller,
    GroupMode::AllowBigger,
    GroupMode::DropReminder,
    GroupMode::Strict,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn inner_dirichlet_gives_each_client_its_size(
        labels in prop::collection::vec(0u32..6, 320..400),
        sizes_asked in prop::collection::vec(1usize..40, 1..8),
        alpha in 0.01f64..20.0,
        seed in any::<u64>(),
    ) {
        let spec = PartitionSpec::InnerDirichlet { partition_sizes: sizes_asked.clone(), alpha };
        let parts = partition(&labels, 6, sizes_asked.len(), &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(sizes(&parts), sizes_asked);
        prop_assert!(is_disjoint(&parts, labels.len()));
    }

    #[test]
    fn inner_dirichlet_with_sizes_summing_to_n_uses_every_sample(
        labels in prop::collection::vec(0u32..6, 1..300),
        clients in 1usize..10,
        alpha in 0.01f64..20.0,
        seed in any::<u64>(),
    ) {
        let n = labels.len();
        let clients = clients.min(n);
        let sizes_asked: Vec<usize> =
            (0..clients).map(|i| n / clients + usize::from(i < n % clients)).collect();
        let spec = PartitionSpec::InnerDirichlet { partition_sizes: sizes_asked.clone(), alpha };
        let parts = partition(&labels, 6, clients, &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(sizes(&parts), sizes_asked);
        prop_assert!(is_exact_cover(&parts, n));
    }

    #[test]
    fn size_gives_each_client_its_size(
        n in 50usize..400,
        sizes_asked in prop::collection::vec(1usize..10, 1..6),
        seed in any::<u64>(),
    ) {
        let labels: Vec<u32> = (0..n as u32).map(|i| i % 3).collect();
        let spec = PartitionSpec::Size { partition_sizes: sizes_asked.clone() };
        let parts = partition(&labels, 3, sizes_asked.len(), &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(sizes(&parts), sizes_asked.clone());
        prop_assert!(is_disjoint(&parts, n));
        // More samples than there are is refused.
        let too_big = PartitionSpec::Size { partition_sizes: vec![n + 1] };
        let e = partition(&labels, 3, 1, &too_big, &mut rng(seed)).unwrap_err().to_string();
        prop_assert!(e.contains(&format!("sum to {}", n + 1)), "{e}");
    }

    #[test]
    fn quantity_skew_follows_flower_sizes(
        n in 20usize..3000,
        clients in 1usize..8,
        which in 0usize..3,
        seed in any::<u64>(),
    ) {
        let labels: Vec<u32> = (0..n as u32).map(|i| i % 4).collect();
        let (spec, f): (PartitionSpec, fn(f64) -> f64) = [
            (PartitionSpec::Linear {}, (|x| x) as fn(f64) -> f64),
            (PartitionSpec::Square {}, |x| x * x),
            (PartitionSpec::Exponential {}, f64::exp),
        ][which].clone();
        let expected = flower_sizes(f, clients, n);
        match partition(&labels, 4, clients, &spec, &mut rng(seed)) {
            Ok(parts) => {
                prop_assert_eq!(sizes(&parts), expected.clone());
                prop_assert!(is_exact_cover(&parts, n));
                prop_assert!(expected.windows(2).all(|w| w[0] <= w[1]), "{:?}", expected);
            }
            Err(e) => {
                prop_assert!(expected.contains(&0), "{e} but Flower's sizes are {expected:?}");
                prop_assert!(e.to_string().contains("no sample"), "{e}");
            }
        }
    }

    #[test]
    fn pathological_modes_give_exactly_k_classes(
        classes in 2usize..8,
        clients in 1usize..12,
        k in 1usize..8,
        mode in 0usize..3,
        extra in 0usize..30,
        seed in any::<u64>(),
    ) {
        let k = k.min(classes);
        let mode = MODES[mode];
        // Every class has at least `clients` samples, so each owner gets some.
        let n = classes * clients + extra;
        let labels: Vec<u32> = (0..n).map(|i| (i % classes) as u32).collect();
        let spec = pathological(k, mode);
        let parts = partition(&labels, classes, clients, &spec, &mut rng(seed)).unwrap();
        prop_assert!(is_disjoint(&parts, n));
        let owned: Vec<std::collections::BTreeSet<u32>> =
            parts.iter().map(|p| classes_of(&labels, p)).collect();
        for (i, cs) in owned.iter().enumerate() {
            prop_assert_eq!(cs.len(), k);
            match mode {
                ClassAssignment::Deterministic => {
                    let want: std::collections::BTreeSet<u32> =
                        (0..k).map(|j| ((i + j) % classes) as u32).collect();
                    prop_assert_eq!(cs, &want);
                }
                ClassAssignment::FirstDeterministic => {
                    prop_assert!(cs.contains(&((i % classes) as u32)));
                }
                _ => {}
            }
        }
        // Each class is split evenly (np.array_split) among its owners, and an owned class
        // is used whole.
        for c in 0..classes as u32 {
            let shares: Vec<usize> = parts
                .iter()
                .map(|p| p.iter().filter(|&&i| labels[i] == c).count())
                .filter(|&s| s > 0)
                .collect();
            if let (Some(lo), Some(hi)) = (shares.iter().min(), shares.iter().max()) {
                prop_assert!(hi - lo <= 1, "class {c}: {shares:?}");
                let all = labels.iter().filter(|&&l| l == c).count();
                prop_assert_eq!(shares.iter().sum::<usize>(), all);
            }
        }
        // Coverage: which modes use every class.
        let covers = match mode {
            ClassAssignment::Random => clients * k >= classes,
            ClassAssignment::Deterministic => clients + k > classes,
            _ => clients >= classes,
        };
        if covers {
            prop_assert!(is_exact_cover(&parts, n));
        }
    }

    #[test]
    fn natural_id_gives_one_value_per_client(
        raw in prop::collection::vec(0u32..12, 1..200),
        real in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let n = raw.len();
        let column = if real {
            Column::Real(raw.iter().map(|&v| v as f32 * 0.5 - 2.0).collect())
        } else {
            categorical(&raw)
        };
        let distinct: std::collections::BTreeSet<u32> = raw.iter().copied().collect();
        let spec = PartitionSpec::NaturalId { column: "site".into() };
        let parts = by_column(&column, distinct.len(), &spec, seed).unwrap();
        prop_assert!(is_exact_cover(&parts, n));
        // Client i holds exactly the i-th smallest value.
        for (i, (p, v)) in parts.iter().zip(&distinct).enumerate() {
            prop_assert!(p.iter().all(|&r| raw[r] == *v), "client {i}");
        }
        if distinct.len() > 1 {
            let e = by_column(&column, distinct.len() - 1, &spec, seed).unwrap_err().to_string();
            prop_assert!(e.contains(&format!("set clients = {}", distinct.len())), "{e}");
        }
    }

    #[test]
    fn grouped_natural_id_keeps_ids_whole(
        raw in prop::collection::vec(0u32..15, 1..250),
        group_size in 1usize..6,
        mode in 0usize..4,
        sort_unique_ids in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let n = raw.len();
        let mode = GROUP_MODES[mode];
        let column = categorical(&raw);
        let count = raw.iter().collect::<std::collections::BTreeSet<_>>().len();
        let (whole, rest) = (count / group_size, count % group_size);
        // Flower's group counts per mode; None where it refuses.
        let groups = match mode {
            GroupMode::AllowSmaller => Some(whole + usize::from(rest > 0)),
            _ if group_size > count => None,
            GroupMode::Strict if rest > 0 => None,
            _ => Some(whole),
        };
        let spec = PartitionSpec::GroupedNaturalId {
            column: "user".into(),
            group_size,
            mode,
            sort_unique_ids,
        };
        let result = by_column(&column, groups.unwrap_or(1), &spec, seed);
        let Some(groups) = groups else {
            prop_assert!(result.is_err());
            return Ok(());
        };
        let parts = result.unwrap();
        prop_assert_eq!(parts.len(), groups);
        prop_assert!(is_disjoint(&parts, n));
        // A natural id never straddles two clients.
        let ids: Vec<std::collections::BTreeSet<String>> =
            parts.iter().map(|p| values_in(&column, p)).collect();
        let all: usize = ids.iter().map(|s| s.len()).sum();
        let union: std::collections::BTreeSet<&String> = ids.iter().flatten().collect();
        prop_assert_eq!(all, union.len());
        // Ids per client.
        let per: Vec<usize> = ids.iter().map(|s| s.len()).collect();
        match mode {
            GroupMode::AllowSmaller => {
                prop_assert!(per[..groups - 1].iter().all(|&s| s == group_size), "{per:?}");
                prop_assert!(per[groups - 1] <= group_size);
            }
            GroupMode::AllowBigger => {
                prop_assert!(per.iter().all(|&s| s >= group_size && s < 2 * group_size), "{per:?}");
            }
            _ => prop_assert!(per.iter().all(|&s| s == group_size), "{per:?}"),
        }
        // Coverage: every sample, except those of the ids drop-reminder leaves out.
        let used: usize = parts.iter().map(Vec::len).sum();
        if mode == GroupMode::DropReminder {
            prop_assert_eq!(union.len(), whole * group_size);
        } else {
            prop_assert_eq!(used, n);
        }
        if sort_unique_ids && mode != GroupMode::AllowBigger {
            // Ascending ids, group_size at a time.
            let every: Vec<usize> = (0..n).collect();
            let sorted: Vec<String> = values_in(&column, &every).into_iter().collect();
            for (g, s) in ids.iter().enumerate() {
                let end = (g * group_size + group_size).min(count);
                let want: std::collections::BTreeSet<String> =
                    sorted[g * group_size..end].iter().cloned().collect();
                prop_assert_eq!(s, &want);
            }
        }
    }

    #[test]
    fn continuous_strictness_one_sorts_and_zero_ignores_the_column(
        values in prop::collection::vec(-1000.0f32..1000.0, 2..300),
        clients in 1usize..10,
        seed in any::<u64>(),
    ) {
        let n = values.len();
        let clients = clients.min(n);
        prop_assume!(values.iter().any(|&v| v != values[0]));
        let labels = vec![0u32; n];
        let col = Column::Real(values.clone());
        let strict = PartitionSpec::Continuous { column: "age".into(), strictness: 1.0 };
        let parts = by_column(&col, clients, &strict, seed).unwrap();
        prop_assert!(is_exact_cover(&parts, n));
        let s = sizes(&parts);
        prop_assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
        let lo = |p: &[usize]| p.iter().map(|&i| values[i]).fold(f32::INFINITY, f32::min);
        let hi = |p: &[usize]| p.iter().map(|&i| values[i]).fold(f32::NEG_INFINITY, f32::max);
        for w in parts.windows(2) {
            prop_assert!(hi(&w[0]) <= lo(&w[1]), "blocks overlap");
        }
        // strictness 0: the noise alone orders the samples, whatever the column holds.
        let iid = PartitionSpec::Continuous { column: "age".into(), strictness: 0.0 };
        let other = Column::Real(values.iter().map(|v| -v * 3.0).collect());
        let a = partition_with(&labels, Some(&col), 1, clients, &iid, &mut rng(seed)).unwrap();
        let b = partition_with(&labels, Some(&other), 1, clients, &iid, &mut rng(seed)).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn new_partitions_are_deterministic(seed in any::<u64>(), which in 0usize..11) {
        let labels: Vec<u32> = (0..5000u32).map(|i| (i * 7 + i / 3) % 10).collect();
        let ids: Vec<u32> = (0..5000u32).map(|i| (i * 13) % 8).collect();
        let site = categorical(&ids);
        let age = Column::Real((0..5000).map(|i| ((i * 37) % 101) as f32).collect());
        let (spec, column) = [
            (PartitionSpec::InnerDirichlet { partition_sizes: vec![60; 8], alpha: 0.5 }, None),
            (PartitionSpec::Size { partition_sizes: vec![10, 20, 30, 40, 50, 60, 70, 80] }, None),
            (PartitionSpec::Linear {}, None),
            (PartitionSpec::Square {}, None),
            (PartitionSpec::Exponential {}, None),
            (pathological(3, ClassAssignment::Deterministic), None),
            (pathological(3, ClassAssignment::FirstDeterministic), None),
            (PartitionSpec::NaturalId { column: "site".into() }, Some(&site)),
            (
                PartitionSpec::GroupedNaturalId {
                    column: "site".into(),
                    group_size: 1,
                    mode: GroupMode::Strict,
                    sort_unique_ids: false,
                },
                Some(&site),
            ),
            (PartitionSpec::Continuous { column: "age".into(), strictness: 0.7 }, Some(&age)),
            (PartitionSpec::Continuous { column: "age".into(), strictness: 1.0 }, Some(&age)),
        ][which].clone();
        let a = partition_with(&labels, column, 10, 8, &spec, &mut rng(seed)).unwrap();
        let b = partition_with(&labels, column, 10, 8, &spec, &mut rng(seed)).unwrap();
        prop_assert_eq!(&a, &b);
        let next = seed.wrapping_add(1);
        let c = partition_with(&labels, column, 10, 8, &spec, &mut rng(next)).unwrap();
        prop_assert_ne!(a, c);
    }
}

#[test]
fn quantity_skew_sizes_by_hand() {
    // numpy, as flwr-datasets' IdToSizeFncPartitioner computes them:
    //   u = f(np.linspace(1, m, m)); s = np.array(u / u.sum() * n, dtype=np.int64)
    //   s[-1] += n - s.sum()
    // linear m=4: n=100 -> [10, 20, 30, 40]; n=101 -> [10, 20, 30, 41]
    // square m=3, n=100 -> [7, 28, 65]; exponential m=3, n=100 -> [9, 24, 67]
    // exponential m=4, n=1000 -> [32, 87, 236, 645]
    let case = |spec: PartitionSpec, m: usize, n: usize| {
        let labels = vec![0u32; n];
        sizes(&partition(&labels, 1, m, &spec, &mut rng(0)).unwrap())
    };
    assert_eq!(case(PartitionSpec::Linear {}, 4, 100), vec![10, 20, 30, 40]);
    assert_eq!(case(PartitionSpec::Linear {}, 4, 101), vec![10, 20, 30, 41]);
    assert_eq!(case(PartitionSpec::Square {}, 3, 100), vec![7, 28, 65]);
    assert_eq!(case(PartitionSpec::Exponential {}, 3, 100), vec![9, 24, 67]);
    assert_eq!(
        case(PartitionSpec::Exponential {}, 4, 1000),
        vec![32, 87, 236, 645]
    );
    assert_eq!(case(PartitionSpec::Linear {}, 1, 7), vec![7]);
    // e^1 / sum(e^1..e^8) * 100 < 1: Flower refuses a partition without samples.
    let e = partition(&[0; 100], 1, 8, &PartitionSpec::Exponential {}, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("client 0 no sample") && e.contains("fewer clients"),
        "{e}"
    );
}

#[test]
fn inner_dirichlet_skew_follows_alpha() {
    let labels = mnist_labels();
    let skew = |alpha: f64| {
        let spec = PartitionSpec::InnerDirichlet {
            partition_sizes: vec![3000; 20],
            alpha,
        };
        let parts = partition(&labels, 10, 20, &spec, &mut rng(5)).unwrap();
        assert!(parts.iter().all(|p| p.len() == 3000));
        assert!(is_disjoint(&parts, labels.len()));
        mean_max_share(&labels, &parts)
    };
    let (s01, s100) = (skew(0.1), skew(100.0));
    assert!(s100 < 0.16, "alpha 100: {s100}");
    assert!(s01 > 0.5, "alpha 0.1: {s01}");
    // Sizes that sum to all 60000 samples exhaust classes; every sample is still used.
    let spec = PartitionSpec::InnerDirichlet {
        partition_sizes: vec![6000; 10],
        alpha: 0.05,
    };
    let parts = partition(&labels, 10, 10, &spec, &mut rng(1)).unwrap();
    assert!(is_exact_cover(&parts, labels.len()));
}

#[test]
fn settings_are_checked_with_their_names() {
    let field = |spec: PartitionSpec| match spec.check().unwrap_err() {
        DataError::InvalidArgument { field, msg } => format!("{field}: {msg}"),
        e => panic!("{e:?}"),
    };
    let inner = |sizes: Vec<usize>, alpha| PartitionSpec::InnerDirichlet {
        partition_sizes: sizes,
        alpha,
    };
    assert!(field(inner(vec![], 0.5)).starts_with("partition_sizes: is empty"));
    assert!(field(inner(vec![3, 0], 0.5)).contains("entry 1 is 0"));
    assert!(field(inner(vec![3], -1.0)).starts_with("alpha:"));
    assert!(
        field(PartitionSpec::Size {
            partition_sizes: vec![0]
        })
        .starts_with("partition_sizes:")
    );
    assert!(field(PartitionSpec::NaturalId { column: " ".into() }).starts_with("column: is empty"));
    assert!(
        field(PartitionSpec::GroupedNaturalId {
            column: "user".into(),
            group_size: 0,
            mode: GroupMode::AllowSmaller,
            sort_unique_ids: false
        })
        .starts_with("group_size:")
    );
    for s in [-0.1, 1.5, f64::NAN] {
        assert!(
            field(PartitionSpec::Continuous {
                column: "age".into(),
                strictness: s
            })
            .starts_with("strictness:")
        );
    }
    // partition_sizes fixes the number of clients.
    let e = inner(vec![5, 5, 5], 1.0)
        .check_clients(4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("partition_sizes") && e.contains("3 sizes") && e.contains("4 clients"),
        "{e}"
    );
    assert!(inner(vec![5, 5, 5], 1.0).check_clients(3).is_ok());
    let labels = vec![0u32; 20];
    let e = partition(&labels, 1, 4, &inner(vec![5, 5, 5], 1.0), &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("set clients = 3"), "{e}");
    let e = partition(&labels, 1, 2, &inner(vec![15, 15], 1.0), &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sum to 30") && e.contains("20 samples"), "{e}");
}

#[test]
fn column_kinds_need_their_column() {
    let labels = vec![0u32; 10];
    let spec = PartitionSpec::NaturalId {
        column: "writer_id".into(),
    };
    let e = partition(&labels, 1, 2, &spec, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`writer_id`") && e.contains("natural_id"), "{e}");
    let short = Column::Real(vec![1.0; 9]);
    let e = partition_with(&labels, Some(&short), 1, 2, &spec, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("9 values") && e.contains("10 samples"), "{e}");
    let cat = categorical(&[1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
    let cont = PartitionSpec::Continuous {
        column: "writer_id".into(),
        strictness: 0.5,
    };
    let e = partition_with(&labels, Some(&cat), 1, 2, &cont, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("categorical"), "{e}");
    let flat = Column::Real(vec![3.0; 10]);
    let e = partition_with(&labels, Some(&flat), 1, 2, &cont, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("constant"), "{e}");
    // A label-based kind ignores a column.
    assert!(
        partition_with(
            &labels,
            Some(&flat),
            1,
            2,
            &PartitionSpec::Iid {},
            &mut rng(0)
        )
        .is_ok()
    );
    let strict = PartitionSpec::GroupedNaturalId {
        column: "writer_id".into(),
        group_size: 3,
        mode: GroupMode::Strict,
        sort_unique_ids: true,
    };
    let five = categorical(&[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    let e = partition_with(&labels, Some(&five), 1, 1, &strict, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("strict") && e.contains("2 are left over"), "{e}");
}

#[test]
fn pathological_deterministic_refuses_a_class_too_small_to_share() {
    // Class 2 has one sample but the deterministic assignment gives it to clients 0 and 1
    // of 3 (classes 0,1 / 1,2 / 2,0).
    let labels = vec![0u32, 0, 0, 1, 1, 1, 2];
    let spec = PartitionSpec::Pathological {
        classes_per_client: 2,
        class_assignment_mode: ClassAssignment::Deterministic,
    };
    let e = partition(&labels, 3, 3, &spec, &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("class 2 has 1 samples") && e.contains("2 clients"),
        "{e}"
    );
}

#[test]
fn csv_column_feeds_natural_and_continuous_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("visits.csv");
    let mut text = String::from("site,age,bp,label\n");
    for i in 0..30 {
        let site = ["north", "south", "east"][i % 3];
        text += &format!("{site},{},{},{}\n", 20 + i, 100 + (i * 7) % 13, i % 2);
    }
    std::fs::write(&p, text).unwrap();
    let opts = CsvOptions {
        has_header: true,
        label_column: LabelColumn::Name("label".into()),
        categorical: vec!["site".into()],
        delimiter: b',',
    };
    let t = read_csv_table(&p, &opts).unwrap();
    let site = t.column("site").unwrap();
    assert_eq!(site.level(0), Some("north"));
    assert_eq!(site.level(4), Some("south"));
    assert_eq!(
        t.column("age"),
        Some(Column::Real((20..50).map(|v| v as f32).collect()))
    );
    assert!(t.column("label").is_none() && t.column("nope").is_none());
    let y = &t.dataset.y;
    let spec = PartitionSpec::NaturalId {
        column: "site".into(),
    };
    let parts = partition_with(y, Some(&site), 2, 3, &spec, &mut rng(0)).unwrap();
    // ascending: east, north, south
    for (p, name) in parts.iter().zip(["east", "north", "south"]) {
        assert_eq!(p.len(), 10);
        assert!(p.iter().all(|&r| site.level(r) == Some(name)));
    }
    let age = t.column("age").unwrap();
    let spec = PartitionSpec::Continuous {
        column: "age".into(),
        strictness: 1.0,
    };
    let mut parts = partition_with(y, Some(&age), 2, 3, &spec, &mut rng(0)).unwrap();
    parts.iter_mut().for_each(|p| p.sort_unstable());
    assert_eq!(parts[0], (0..10).collect::<Vec<_>>());
    assert_eq!(parts[2], (20..30).collect::<Vec<_>>());
}

#[test]
fn cdc_natural_id_gives_back_the_residence_clients() {
    let zip = crate::common::shared().join(fedfuse_data::CDC_2015_ZIP);
    let data = fedfuse_data::load_cdc(
        &zip,
        &fedfuse_data::CdcOptions::new(fedfuse_data::CdcSplit::ResidenceStatus),
    )
    .unwrap();
    let pooled = data.pooled().unwrap();
    let status = data.client_column();
    assert_eq!(status.len(), pooled.n_rows());
    let labels = vec![0u32; pooled.n_rows()];
    let spec = PartitionSpec::NaturalId {
        column: "residence_status".into(),
    };
    let parts = partition_with(&labels, Some(&status), 1, 3, &spec, &mut rng(0)).unwrap();
    // Clients in ascending name order: interstate_or_foreign, intrastate_nonresident, resident.
    assert_eq!(sizes(&parts), vec![783, 6452, 13058]);
    assert!(is_exact_cover(&parts, pooled.n_rows()));
    // Grouping the two non-resident groups into one silo (sorted ids, groups of 2, the
    // resident group the smaller last one).
    let spec = PartitionSpec::GroupedNaturalId {
        column: "residence_status".into(),
        group_size: 2,
        mode: GroupMode::AllowSmaller,
        sort_unique_ids: true,
    };
    let parts = partition_with(&labels, Some(&status), 1, 2, &spec, &mut rng(0)).unwrap();
    assert_eq!(sizes(&parts), vec![783 + 6452, 13058]);
}

// ---- Pachinko (Reddi et al.'s CIFAR-100 split): coarse, then fine labels. ----

/// CIFAR-100's shape at a tenth of the size: 50 samples of each of the 100 fine labels, in a
/// scrambled order.
fn cifar100_like_labels() -> Vec<u32> {
    (0..5000u32).map(|i| (i * 37 + i / 100) % 100).collect()
}

fn pachinko(alpha: f64, beta: f64, samples_per_client: Option<usize>) -> PartitionSpec {
    PartitionSpec::Pachinko {
        alpha,
        beta,
        samples_per_client,
    }
}

fn coarse(fine: u32) -> usize {
    usize::from(CIFAR100_COARSE_OF_FINE[fine as usize])
}

/// Mean over clients of the number of distinct coarse labels.
fn mean_coarse_labels(labels: &[u32], parts: &[Vec<usize>]) -> f64 {
    let distinct = |p: &Vec<usize>| {
        p.iter()
            .map(|&i| coarse(labels[i]))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    parts.iter().map(distinct).sum::<usize>() as f64 / parts.len() as f64
}

/// Mean, over each client's coarse labels with at least 10 of its samples, of the share of
/// the most common fine label among them.
fn mean_fine_max_share(labels: &[u32], parts: &[Vec<usize>]) -> f64 {
    let mut shares = Vec::new();
    for p in parts {
        let mut counts = [[0usize; 100]; 20];
        p.iter()
            .for_each(|&i| counts[coarse(labels[i])][labels[i] as usize] += 1);
        for c in counts.iter() {
            let total: usize = c.iter().sum();
            if total >= 10 {
                shares.push(*c.iter().max().unwrap() as f64 / total as f64);
            }
        }
    }
    shares.iter().sum::<f64>() / shares.len() as f64
}

#[test]
fn pachinko_gives_each_client_its_count_once() {
    let labels = cifar100_like_labels();
    // 50 clients x 100 use every sample, so fine and coarse labels run out on the way.
    for (clients, per, spec) in [
        (50, 100, PartitionSpec::pachinko()),
        (40, 100, pachinko(0.1, 10.0, Some(100))),
        (30, 7, pachinko(0.5, 1.0, Some(7))),
        (7, 714, pachinko(0.01, 0.01, None)),
    ] {
        let parts = partition(&labels, 100, clients, &spec, &mut rng(3)).unwrap();
        assert_eq!(parts.len(), clients);
        assert!(parts.iter().all(|p| p.len() == per), "{:?}", sizes(&parts));
        assert!(is_disjoint(&parts, labels.len()));
        if clients * per == labels.len() {
            assert!(is_exact_cover(&parts, labels.len()));
        }
        // Same seed, same split; another seed, another.
        assert_eq!(
            partition(&labels, 100, clients, &spec, &mut rng(3)).unwrap(),
            parts
        );
        assert_ne!(
            partition(&labels, 100, clients, &spec, &mut rng(4)).unwrap(),
            parts
        );
    }
}

#[test]
fn pachinko_concentrates_coarse_labels_by_alpha_and_fine_by_beta() {
    let labels = cifar100_like_labels();
    // 20 clients x 100 samples use 40 % of the pool, so exhaustion barely blurs the draw.
    let split = |alpha, beta| {
        let parts = partition(
            &labels,
            100,
            20,
            &pachinko(alpha, beta, Some(100)),
            &mut rng(11),
        )
        .unwrap();
        (
            mean_coarse_labels(&labels, &parts),
            mean_fine_max_share(&labels, &parts),
        )
    };
    let iid = partition(&labels, 100, 50, &PartitionSpec::Iid {}, &mut rng(11)).unwrap();
    // 100 uniform draws over 20 coarse labels hit 20 (1 - 0.95^100) = 19.9 of them.
    let uniform = mean_coarse_labels(&labels, &iid);
    assert!(uniform > 19.0, "iid: {uniform}");
    let (skewed, _) = split(0.1, 10.0);
    let (even, _) = split(1000.0, 10.0);
    // Dir(0.1) over 20 labels puts nearly all of a client's mass on a few of them: each
    // label's weight is Beta(0.1, 1.9), so 100 draws hit on average
    // 20 (1 - E[(1 - p)^100]) = 20 (1 - G(101.9) / (G(1.9) G(102))) = 6.9 labels (G the
    // gamma function); 7.45 with this seed.
    assert!(
        skewed < 10.0,
        "alpha 0.1: {skewed} coarse labels per client"
    );
    assert!(even > 19.0, "alpha 1000: {even} coarse labels per client");
    // Within a coarse label: Dir(0.01) picks one fine label, Dir(1000) spreads over all 5.
    let (_, one_fine) = split(1.0, 0.01);
    let (_, five_fine) = split(1.0, 1000.0);
    assert!(one_fine > 0.9, "beta 0.01: {one_fine}");
    assert!(five_fine < 0.45, "beta 1000: {five_fine}");
}

#[test]
fn pachinko_needs_cifar100_labels_and_valid_settings() {
    // Any other number of classes (CIFAR-10, cifar100-coarse's 20 superclasses) is refused.
    for classes in [10u32, 20] {
        let labels: Vec<u32> = (0..1000).map(|i| i % classes).collect();
        let e = partition(
            &labels,
            classes as usize,
            5,
            &PartitionSpec::pachinko(),
            &mut rng(0),
        )
        .unwrap_err();
        assert!(matches!(e, DataError::Partition(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("partition.kind = \"pachinko\"")
                && e.contains(&format!("{classes} classes"))
                && e.contains("`cifar100`"),
            "{e}"
        );
    }
    let field = |spec: PartitionSpec| match spec.check().unwrap_err() {
        DataError::InvalidArgument { field, .. } => field,
        e => panic!("{e:?}"),
    };
    assert_eq!(field(pachinko(0.0, 10.0, None)), "alpha");
    assert_eq!(field(pachinko(f64::NAN, 10.0, None)), "alpha");
    assert_eq!(field(pachinko(0.1, -1.0, None)), "beta");
    assert_eq!(field(pachinko(0.1, f64::INFINITY, None)), "beta");
    assert_eq!(field(pachinko(0.1, 10.0, Some(0))), "samples_per_client");
    assert!(PartitionSpec::pachinko().check().is_ok());
    assert_eq!(PartitionSpec::pachinko().kind(), "pachinko");
    let labels = cifar100_like_labels();
    let e = partition(
        &labels,
        100,
        50,
        &pachinko(0.1, 10.0, Some(101)),
        &mut rng(0),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("5050") && e.contains("5000 samples"), "{e}");
    // The settings through `partition`: named as in a config.
    let e = partition(&labels, 100, 50, &pachinko(0.1, 0.0, None), &mut rng(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("beta"), "{e}");
}

#[test]
fn pachinko_parses_with_reddi_defaults() {
    use serde::Deserialize;
    use serde::de::value::{Error, MapDeserializer};
    // `partition = { kind = "pachinko" }`: alpha 0.1, beta 10, the samples shared evenly.
    let map = MapDeserializer::<_, Error>::new([("kind", "pachinko")].into_iter());
    assert_eq!(
        PartitionSpec::deserialize(map).unwrap(),
        PartitionSpec::pachinko()
    );
    assert_eq!(
        PartitionSpec::pachinko(),
        pachinko(0.1, 10.0, None),
        "Reddi et al.'s settings"
    );
}
