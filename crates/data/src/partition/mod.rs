//! Partitioners that split a dataset among federated clients, with Flower Datasets semantics
//! (`flwr_datasets.partitioner`), and per-client train/test splits.
//!
//! Flower's `FederatedDataset` shuffles the whole split before a partitioner sees it; here each
//! partitioner that cuts contiguous blocks draws that shuffle itself, from the same seeded RNG.
mod kinds;
mod spec;

pub use spec::{ClassAssignment, GroupMode, PartitionSpec};

use rand::Rng;
use rand::seq::SliceRandom;

use crate::cifar::CIFAR100_COARSE_OF_FINE;
use crate::dataset::{ClientData, Dataset};
use crate::error::{DataError, Result};
use crate::tabular::Column;
use kinds::{
    contiguous, continuous, dirichlet, grouped_natural_id, id_to_size, iid, inner_dirichlet,
    natural_ids, pachinko, pathological, rows_by_group, shards,
};

/// Splits sample indices `0..labels.len()` among `clients` clients by a label-based spec.
///
/// The same as [`partition_with`] without a column: the kinds that split by a column
/// (`natural_id`, `grouped_natural_id`, `continuous`) are an error here.
pub fn partition(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    spec: &PartitionSpec,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    partition_with(labels, None, num_classes, clients, spec, rng)
}

/// Splits sample indices `0..labels.len()` among `clients` clients.
///
/// `column` holds one value per sample of the column named by [`PartitionSpec::column`]
/// (e.g. [`crate::CsvTable::column`], [`crate::Table::column`] or
/// [`crate::CdcData::client_column`]); kinds that split by labels ignore it.
///
/// Returns one index list per client, each in random order. Every random choice comes from
/// `rng`, so the same seed gives the same partition. Iid, Dirichlet, Linear, Square,
/// Exponential, NaturalId and Continuous use every sample exactly once; InnerDirichlet and
/// Size use `sum(partition_sizes)` samples; Pathological drops the samples of classes nobody
/// owns; Shards drops what is left over after the shards handed out; GroupedNaturalId with
/// `drop-reminder` drops the samples of the ids left out; Pachinko uses
/// `clients * samples_per_client`.
///
/// Pachinko reads `labels` as CIFAR-100's fine labels (`num_classes` must be 100) and takes
/// each one's coarse label from [`crate::CIFAR100_COARSE_OF_FINE`]; any other number of
/// classes is an error naming `partition.kind`.
pub fn partition_with(
    labels: &[u32],
    column: Option<&Column>,
    num_classes: usize,
    clients: usize,
    spec: &PartitionSpec,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let err = |msg: String| Err(DataError::Partition(msg));
    let as_partition_error = |e: DataError| match e {
        DataError::InvalidArgument { field, msg } => DataError::Partition(format!("{field} {msg}")),
        e => e,
    };
    spec.check().map_err(as_partition_error)?;
    if clients == 0 {
        return err("0 clients requested; ask for at least 1".into());
    }
    spec.check_clients(clients).map_err(as_partition_error)?;
    if clients > n {
        return err(format!(
            "{clients} clients but only {n} samples; use at most {n} clients"
        ));
    }
    if num_classes == 0 {
        return err("num_classes is 0".into());
    }
    if let Some((i, l)) = labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l as usize >= num_classes)
    {
        return err(format!(
            "label {l} of sample {i} is not below num_classes = {num_classes}"
        ));
    }
    let column = match (spec.column(), column) {
        (None, _) => None,
        (Some(name), None) => {
            return err(format!(
                "`{}` splits by the column `{name}`, but no values of it were given for the {n} \
                 samples (labelled image datasets have no such column); load a table or CSV \
                 that has it, or use a kind that splits by label (iid, dirichlet, pathological, \
                 shards, ...)",
                spec.kind()
            ));
        }
        (Some(name), Some(c)) if c.len() != n => {
            return err(format!(
                "column `{name}` has {} values but there are {n} samples; pass the column of \
                 the same rows, in the same order",
                c.len()
            ));
        }
        (Some(name), Some(c)) => Some((name, c)),
    };
    let mut parts = match (spec, column) {
        (PartitionSpec::Iid {}, _) => iid(n, clients, rng),
        (
            &PartitionSpec::Dirichlet {
                alpha,
                min_partition_size,
                self_balancing,
            },
            _,
        ) => dirichlet(
            labels,
            num_classes,
            clients,
            alpha,
            min_partition_size,
            self_balancing,
            rng,
        )?,
        (
            PartitionSpec::InnerDirichlet {
                partition_sizes,
                alpha,
            },
            _,
        ) => inner_dirichlet(labels, num_classes, partition_sizes, *alpha, rng)?,
        (
            &PartitionSpec::Pathological {
                classes_per_client,
                class_assignment_mode,
            },
            _,
        ) => pathological(
            labels,
            num_classes,
            clients,
            classes_per_client,
            class_assignment_mode,
            rng,
        )?,
        (
            &PartitionSpec::Shards {
                shards_per_client,
                shard_size,
            },
            _,
        ) => shards(labels, clients, shards_per_client, shard_size, rng)?,
        (PartitionSpec::Size { partition_sizes }, _) => {
            let total = partition_sizes.iter().sum::<usize>();
            if total > n {
                return err(format!(
                    "partition_sizes sum to {total} but there are only {n} samples; lower them"
                ));
            }
            contiguous(n, partition_sizes, rng)
        }
        (PartitionSpec::Linear {}, _) => id_to_size(spec, |id| id, n, clients, rng)?,
        (PartitionSpec::Square {}, _) => id_to_size(spec, |id| id * id, n, clients, rng)?,
        (PartitionSpec::Exponential {}, _) => id_to_size(spec, f64::exp, n, clients, rng)?,
        (PartitionSpec::NaturalId { .. }, Some((name, c))) => {
            let (ids, count) = natural_ids(c);
            if count != clients {
                return err(format!(
                    "column `{name}` has {count} distinct values, so natural_id makes {count} \
                     clients, but {clients} were asked for; set clients = {count}"
                ));
            }
            rows_by_group(&ids, &(0..count).map(Some).collect::<Vec<_>>(), count)
        }
        (
            &PartitionSpec::GroupedNaturalId {
                group_size,
                mode,
                sort_unique_ids,
                ..
            },
            Some((name, c)),
        ) => grouped_natural_id(name, c, clients, group_size, mode, sort_unique_ids, rng)?,
        (
            &PartitionSpec::Pachinko {
                alpha,
                beta,
                samples_per_client,
            },
            _,
        ) => {
            if num_classes != CIFAR100_COARSE_OF_FINE.len() {
                return err(format!(
                    "partition.kind = \"pachinko\" draws a coarse label, then a fine label \
                     under it, so it needs each class's coarse label; fedfuse knows them for \
                     CIFAR-100's 100 fine labels only (dataset `cifar100`), and these labels \
                     have {num_classes} classes. Use dataset `cifar100` (not \
                     `cifar100-coarse`, whose labels are the coarse ones already), or a kind \
                     without a label hierarchy such as `dirichlet` or `inner_dirichlet`"
                ));
            }
            let per_client = samples_per_client.unwrap_or(n / clients);
            pachinko(
                labels,
                &CIFAR100_COARSE_OF_FINE,
                clients,
                per_client,
                (alpha, beta),
                rng,
            )?
        }
        (&PartitionSpec::Continuous { strictness, .. }, Some((name, c))) => {
            continuous(name, c, clients, strictness, rng)?
        }
        // The column kinds always have a column here (checked above).
        (spec, _) => {
            return err(format!(
                "partition kind `{}` is not supported here",
                spec.kind()
            ));
        }
    };
    for p in &mut parts {
        p.shuffle(rng);
    }
    Ok(parts)
}

/// Turns partitions into per-client local train/test sets.
///
/// Each client's indices are shuffled, then the last `round(test_fraction * len)` become its
/// test set: at least one when `test_fraction` is positive, and never all (at least one
/// training sample remains). Errors name the client whose partition is empty or holds an
/// index outside `ds`.
pub fn client_splits(
    ds: &Dataset,
    parts: &[Vec<usize>],
    test_fraction: f64,
    rng: &mut impl Rng,
) -> Result<Vec<ClientData>> {
    if !(0.0..1.0).contains(&test_fraction) {
        return Err(DataError::InvalidArgument {
            field: "test_fraction",
            msg: format!("{test_fraction} is not in [0, 1); 0.1 or 0.2 are usual"),
        });
    }
    parts
        .iter()
        .enumerate()
        .map(|(client, part)| {
            if part.is_empty() {
                return Err(DataError::Partition(format!(
                    "client {client} has an empty partition; use fewer clients or a partitioner \
                     that gives every client data"
                )));
            }
            if let Some(&bad) = part.iter().find(|&&i| i >= ds.len()) {
                return Err(DataError::Partition(format!(
                    "client {client}: index {bad} is out of range for a dataset of {} samples",
                    ds.len()
                )));
            }
            let mut idx = part.clone();
            idx.shuffle(rng);
            // At least one test row when there are any: a client whose share rounds to none
            // would report no local accuracy while the others do.
            let share = (test_fraction * idx.len() as f64).round() as usize;
            let n_test = if test_fraction > 0.0 { share.max(1) } else { 0 }.min(idx.len() - 1);
            let (train, test) = idx.split_at(idx.len() - n_test);
            Ok(ClientData {
                train: ds.subset(train),
                test: ds.subset(test),
            })
        })
        .collect()
}

/// Splits `ds` into `(rest, held)`: a random `round(fraction * len)` samples are held out (a
/// server's validation split, carved before the rest is partitioned among clients), both in
/// their original order.
pub fn holdout(ds: &Dataset, fraction: f64, rng: &mut impl Rng) -> Result<(Dataset, Dataset)> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(DataError::InvalidArgument {
            field: "validation_fraction",
            msg: format!("{fraction} is not in [0, 1); 0.1 is usual"),
        });
    }
    let mut idx: Vec<usize> = (0..ds.len()).collect();
    idx.shuffle(rng);
    let n_held = (fraction * ds.len() as f64).round() as usize;
    let (held, rest) = idx.split_at_mut(n_held);
    held.sort_unstable();
    rest.sort_unstable();
    Ok((ds.subset(rest), ds.subset(held)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use rand_distr::Gamma;

    use super::kinds::{array_split, dirichlet_draw, id_to_size_sizes};

    #[test]
    fn holdout_splits_disjointly() {
        let ds = Dataset::new(
            (0..100).map(|v| v as f32).collect(),
            (0..100).map(|v| v % 10).collect(),
            vec![1],
            10,
        )
        .unwrap();
        let (rest, held) = holdout(&ds, 0.1, &mut StdRng::seed_from_u64(3)).unwrap();
        assert_eq!((rest.len(), held.len()), (90, 10));
        let mut all: Vec<f32> = rest.x.iter().chain(&held.x).copied().collect();
        all.sort_by(f32::total_cmp);
        assert_eq!(all, (0..100).map(|v| v as f32).collect::<Vec<_>>());
        assert!(holdout(&ds, 1.0, &mut StdRng::seed_from_u64(3)).is_err());
    }

    #[test]
    fn array_split_matches_numpy() {
        // np.array_split(np.arange(10), 3) -> sizes [4, 3, 3]
        let v: Vec<usize> = (0..10).collect();
        let s = array_split(&v, 3);
        assert_eq!(s, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7, 8, 9]]);
        assert_eq!(
            array_split(&v[..2], 3)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            vec![1, 1, 0]
        );
    }

    #[test]
    fn dirichlet_draw_sums_to_one() {
        let mut rng = StdRng::seed_from_u64(1);
        for alpha in [0.001, 0.1, 1.0, 100.0] {
            let g = Gamma::new(alpha, 1.0).unwrap();
            let p = dirichlet_draw(7, &g, &mut rng);
            assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn id_to_size_matches_numpy() {
        // u = f(np.linspace(1, m, m)); s = np.array(u / u.sum() * n, dtype=np.int64);
        // s[-1] += n - s.sum()
        assert_eq!(
            id_to_size_sizes(|x| x, 1437, 5),
            vec![95, 191, 287, 383, 481]
        );
        assert_eq!(id_to_size_sizes(|x| x * x, 100, 3), vec![7, 28, 65]);
        assert_eq!(id_to_size_sizes(f64::exp, 1000, 4), vec![32, 87, 236, 645]);
    }

    #[test]
    fn natural_ids_rank_values_ascending() {
        let c = Column::categorical(&["b", "a", "c", "a"]);
        assert_eq!(natural_ids(&c), (vec![1, 0, 2, 0], 3));
        // unused levels are no ids
        let c = Column::Categorical {
            levels: vec!["z".into(), "y".into(), "x".into()],
            codes: vec![0, 2, 0],
        };
        assert_eq!(natural_ids(&c), (vec![1, 0, 1], 2));
        let r = Column::Real(vec![2.5, -0.0, 0.0, -1.0, 2.5]);
        assert_eq!(natural_ids(&r), (vec![2, 1, 1, 0, 2], 3));
    }

    #[test]
    fn pathological_covers_every_class() {
        let labels: Vec<u32> = (0..1000).map(|i| (i % 10) as u32).collect();
        for seed in 0..20 {
            let mut rng = StdRng::seed_from_u64(seed);
            let parts = pathological(&labels, 10, 5, 2, ClassAssignment::Random, &mut rng).unwrap();
            let mut seen = [false; 10];
            parts
                .iter()
                .flatten()
                .for_each(|&i| seen[labels[i] as usize] = true);
            assert!(seen.iter().all(|&s| s), "seed {seed}");
            // with 5 clients x 2 classes covering 10 classes, every sample is used once
            assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 1000);
        }
    }
}
