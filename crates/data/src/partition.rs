//! Partitioners that split a dataset among federated clients, with Flower Datasets semantics
//! (`flwr_datasets.partitioner`), and per-client train/test splits.

use rand::seq::SliceRandom;
use rand::{Rng, RngExt};
use rand_distr::Gamma;

use crate::dataset::{ClientData, Dataset};
use crate::error::{DataError, Result};

/// Resampling rounds of the Dirichlet partitioner before it gives up (Flower uses 10).
const DIRICHLET_TRIES: usize = 10;

/// How to split samples among clients.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum PartitionSpec {
    /// IID: a global shuffle, then contiguous blocks whose sizes differ by at most one
    /// (Flower's `IidPartitioner`).
    Iid {},
    /// Label skew by a Dirichlet prior per class (Flower's `DirichletPartitioner`, the PFNM
    /// "hetero-dir" scheme). Smaller `alpha` gives more skewed clients.
    ///
    /// `self_balancing: true` with a minimum size reproduces PFNM, FedMA and FedLab's
    /// `hetero_dir_partition`; Flower's defaults are `min_partition_size: 10,
    /// self_balancing: false` (see [`PartitionSpec::dirichlet`]).
    Dirichlet {
        /// Concentration, `> 0`.
        alpha: f64,
        /// Resample (up to 10 times) until every client has at least this many samples.
        #[serde(default = "default_min_partition_size")]
        min_partition_size: usize,
        /// Give no more of a class to clients already above the average size.
        #[serde(default)]
        self_balancing: bool,
    },
    /// Every client gets exactly `classes_per_client` distinct classes, and each class's samples
    /// are split evenly among the clients that own it (Flower's `PathologicalPartitioner` with
    /// random class assignment, plus a repair step so that every class is owned when
    /// `clients * classes_per_client >= classes`).
    Pathological {
        /// Distinct classes per client.
        classes_per_client: usize,
    },
    /// McMahan et al.'s shards: sort by label, cut into shards of `shard_size`, give each client
    /// `shards_per_client` random shards (Flower's `ShardPartitioner`).
    Shards {
        /// Shards each client gets.
        shards_per_client: usize,
        /// Samples per shard.
        shard_size: usize,
    },
}

fn default_min_partition_size() -> usize {
    10
}

impl PartitionSpec {
    /// Dirichlet with Flower's defaults: `min_partition_size: 10, self_balancing: false`.
    pub fn dirichlet(alpha: f64) -> Self {
        PartitionSpec::Dirichlet {
            alpha,
            min_partition_size: 10,
            self_balancing: false,
        }
    }

    /// The settings' own ranges, checkable before any data is loaded (what depends on the
    /// data, such as enough samples per client, is checked by [`partition`]).
    pub fn check(&self) -> Result<()> {
        let bad = |field: &'static str, msg: String| Err(DataError::InvalidArgument { field, msg });
        match *self {
            PartitionSpec::Iid {} => Ok(()),
            PartitionSpec::Dirichlet { alpha, .. } => {
                if alpha.is_finite() && alpha > 0.0 {
                    Ok(())
                } else {
                    bad(
                        "alpha",
                        format!(
                            "{alpha} is not a positive number; 0.1 is very skewed, 100 is \
                             nearly IID"
                        ),
                    )
                }
            }
            PartitionSpec::Pathological {
                classes_per_client: 0,
            } => bad("classes_per_client", "must be at least 1".into()),
            PartitionSpec::Shards {
                shards_per_client,
                shard_size,
            } if shards_per_client == 0 || shard_size == 0 => bad(
                if shards_per_client == 0 {
                    "shards_per_client"
                } else {
                    "shard_size"
                },
                "must be at least 1".into(),
            ),
            _ => Ok(()),
        }
    }
}

/// Splits sample indices `0..labels.len()` among `clients` clients.
///
/// Returns one index list per client, each in random order. Every random choice comes from
/// `rng`, so the same seed gives the same partition. Iid and Dirichlet use every sample exactly
/// once; Pathological drops the samples of classes nobody owns; Shards drops what is left over
/// after the shards handed out.
pub fn partition(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    spec: &PartitionSpec,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let err = |msg: String| Err(DataError::Partition(msg));
    if clients == 0 {
        return err("0 clients requested; ask for at least 1".into());
    }
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
    let mut parts = match *spec {
        PartitionSpec::Iid {} => iid(n, clients, rng),
        PartitionSpec::Dirichlet {
            alpha,
            min_partition_size,
            self_balancing,
        } => dirichlet(
            labels,
            num_classes,
            clients,
            alpha,
            min_partition_size,
            self_balancing,
            rng,
        )?,
        PartitionSpec::Pathological { classes_per_client } => {
            pathological(labels, num_classes, clients, classes_per_client, rng)?
        }
        PartitionSpec::Shards {
            shards_per_client,
            shard_size,
        } => shards(labels, clients, shards_per_client, shard_size, rng)?,
    };
    for p in &mut parts {
        p.shuffle(rng);
    }
    Ok(parts)
}

/// Sizes of `n` items cut into `k` near-equal contiguous blocks (`np.array_split`).
fn split_sizes(n: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..k).map(move |i| n / k + usize::from(i < n % k))
}

/// Cuts `items` into `k` near-equal contiguous blocks (`np.array_split`).
fn array_split(items: &[usize], k: usize) -> Vec<Vec<usize>> {
    let mut start = 0;
    split_sizes(items.len(), k)
        .map(|len| {
            let block = items[start..start + len].to_vec();
            start += len;
            block
        })
        .collect()
}

fn iid(n: usize, clients: usize, rng: &mut impl Rng) -> Vec<Vec<usize>> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(rng);
    array_split(&perm, clients)
}

/// Indices of each class, in order.
fn by_class(labels: &[u32], num_classes: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); num_classes];
    for (i, &l) in labels.iter().enumerate() {
        out[l as usize].push(i);
    }
    out
}

/// One draw of `Dir(alpha, ..., alpha)` with `k` components.
fn dirichlet_draw(k: usize, gamma: &Gamma<f64>, rng: &mut impl Rng) -> Vec<f64> {
    let mut p: Vec<f64> = (0..k).map(|_| rng.sample(gamma)).collect();
    let s: f64 = p.iter().sum();
    if s > 0.0 && s.is_finite() {
        p.iter_mut().for_each(|v| *v /= s);
    } else {
        // Every gamma draw underflowed (tiny alpha): all the mass goes to one client.
        p.iter_mut().for_each(|v| *v = 0.0);
        p[rng.random_range(0..k)] = 1.0;
    }
    p
}

#[allow(clippy::too_many_arguments)]
fn dirichlet(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    alpha: f64,
    min_size: usize,
    self_balancing: bool,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(DataError::Partition(format!(
            "Dirichlet alpha must be a positive number, got {alpha}; 0.1 is very skewed, 100 is \
             nearly IID"
        )));
    }
    if clients.saturating_mul(min_size) > n {
        return Err(DataError::Partition(format!(
            "{clients} clients x min_partition_size {min_size} = {} exceeds the {n} samples; \
             lower the number of clients or min_partition_size",
            clients.saturating_mul(min_size)
        )));
    }
    let gamma = Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Partition(format!("Dirichlet alpha {alpha} is not usable: {e}")))?;
    let classes = by_class(labels, num_classes);
    let avg = n as f64 / clients as f64;
    let mut smallest = 0;
    for _ in 0..DIRICHLET_TRIES {
        let mut parts: Vec<Vec<usize>> = vec![Vec::new(); clients];
        for class in &classes {
            if class.is_empty() {
                continue;
            }
            let mut idx = class.clone();
            idx.shuffle(rng);
            let mut p = dirichlet_draw(clients, &gamma, rng);
            if self_balancing {
                let masked: Vec<f64> = p
                    .iter()
                    .zip(&parts)
                    .map(|(&pj, part)| if (part.len() as f64) < avg { pj } else { 0.0 })
                    .collect();
                let s: f64 = masked.iter().sum();
                if s > 0.0 {
                    p = masked.into_iter().map(|v| v / s).collect();
                }
            }
            // Split points: floor(cumsum(p) * n_k), the last one forced to n_k.
            let nk = idx.len();
            let mut cum = 0.0;
            let mut start = 0;
            for (j, pj) in p.iter().enumerate() {
                cum += pj;
                let end = if j + 1 == clients {
                    nk
                } else {
                    ((cum * nk as f64) as usize).clamp(start, nk)
                };
                parts[j].extend_from_slice(&idx[start..end]);
                start = end;
            }
        }
        smallest = parts.iter().map(Vec::len).min().unwrap_or(0);
        if smallest >= min_size {
            return Ok(parts);
        }
    }
    Err(DataError::Partition(format!(
        "Dirichlet(alpha = {alpha}) over {clients} clients left a client with {smallest} samples, \
         below min_partition_size = {min_size}, in each of {DIRICHLET_TRIES} tries; use fewer \
         clients, a larger alpha, a smaller min_partition_size, or self_balancing"
    )))
}

fn pathological(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    k: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let classes = by_class(labels, num_classes);
    let present: Vec<usize> = (0..num_classes)
        .filter(|&c| !classes[c].is_empty())
        .collect();
    if k == 0 || k > present.len() {
        return Err(DataError::Partition(format!(
            "classes_per_client = {k} must be between 1 and the {} classes present in the labels",
            present.len()
        )));
    }
    // Random assignment: each client k distinct classes.
    let mut owned: Vec<Vec<usize>> = (0..clients)
        .map(|_| {
            let mut pool = present.clone();
            pool.shuffle(rng);
            pool.truncate(k);
            pool
        })
        .collect();
    // Repair: while a class is unowned and some class has two owners, hand one of those
    // owners the unowned class instead. Possible whenever clients * k >= classes.
    if clients * k >= present.len() {
        loop {
            let mut count = vec![0usize; num_classes];
            owned.iter().flatten().for_each(|&c| count[c] += 1);
            let unowned: Vec<usize> = present.iter().copied().filter(|&c| count[c] == 0).collect();
            if unowned.is_empty() {
                break;
            }
            let target = unowned[rng.random_range(0..unowned.len())];
            let slots: Vec<(usize, usize)> = owned
                .iter()
                .enumerate()
                .flat_map(|(i, cs)| cs.iter().enumerate().map(move |(j, &c)| (i, j, c)))
                .filter(|&(_, _, c)| count[c] >= 2)
                .map(|(i, j, _)| (i, j))
                .collect();
            if slots.is_empty() {
                break; // cannot happen when clients * k >= classes
            }
            let (i, j) = slots[rng.random_range(0..slots.len())];
            owned[i][j] = target;
        }
    }
    let mut owners: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, cs) in owned.iter().enumerate() {
        for &c in cs {
            owners[c].push(i);
        }
    }
    let mut parts: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (c, own) in owners.iter().enumerate() {
        if own.is_empty() {
            continue;
        }
        let mut idx = classes[c].clone();
        idx.shuffle(rng);
        for (block, &client) in array_split(&idx, own.len()).into_iter().zip(own) {
            parts[client].extend(block);
        }
    }
    Ok(parts)
}

fn shards(
    labels: &[u32],
    clients: usize,
    per_client: usize,
    shard_size: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    if per_client == 0 || shard_size == 0 {
        return Err(DataError::Partition(format!(
            "shards_per_client ({per_client}) and shard_size ({shard_size}) must both be at least 1"
        )));
    }
    let needed = clients
        .saturating_mul(per_client)
        .saturating_mul(shard_size);
    if needed > n {
        return Err(DataError::Partition(format!(
            "{clients} clients x {per_client} shards x {shard_size} samples = {needed} exceeds the \
             {n} samples; lower the number of clients, shards_per_client or shard_size"
        )));
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    order.sort_by_key(|&i| labels[i]); // stable: ties keep the shuffled order
    let mut shard_ids: Vec<usize> = (0..n / shard_size).collect();
    shard_ids.shuffle(rng);
    Ok(shard_ids
        .chunks(per_client)
        .take(clients)
        .map(|ids| {
            ids.iter()
                .flat_map(|&s| order[s * shard_size..(s + 1) * shard_size].iter().copied())
                .collect()
        })
        .collect())
}

/// Turns partitions into per-client local train/test sets.
///
/// Each client's indices are shuffled, then the last `round(test_fraction * len)` become its
/// test set (capped so that at least one training sample remains). Errors name the client whose
/// partition is empty or holds an index outside `ds`.
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
            let n_test = ((test_fraction * idx.len() as f64).round() as usize).min(idx.len() - 1);
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
    fn pathological_covers_every_class() {
        let labels: Vec<u32> = (0..1000).map(|i| (i % 10) as u32).collect();
        for seed in 0..20 {
            let mut rng = StdRng::seed_from_u64(seed);
            let parts = pathological(&labels, 10, 5, 2, &mut rng).unwrap();
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
