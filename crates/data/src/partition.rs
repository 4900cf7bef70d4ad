//! Partitioners that split a dataset among federated clients, with Flower Datasets semantics
//! (`flwr_datasets.partitioner`), and per-client train/test splits.
//!
//! Flower's `FederatedDataset` shuffles the whole split before a partitioner sees it; here each
//! partitioner that cuts contiguous blocks draws that shuffle itself, from the same seeded RNG.

use rand::seq::SliceRandom;
use rand::{Rng, RngExt};
use rand_distr::{Gamma, StandardNormal};

use crate::dataset::{ClientData, Dataset};
use crate::error::{DataError, Result};
use crate::tabular::Column;

/// Resampling rounds of the Dirichlet partitioner before it gives up (Flower uses 10).
const DIRICHLET_TRIES: usize = 10;

/// How to split samples among clients.
///
/// Every kind has the name and semantics of a Flower Datasets partitioner. The label-based
/// kinds read only the labels; `natural_id`, `grouped_natural_id` and `continuous` split by
/// the values of one more per-sample column (Flower's `partition_by`), which the caller passes
/// to [`partition_with`].
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
    /// FedDyn's scheme (Flower's `InnerDirichletPartitioner`): client `i` gets exactly
    /// `partition_sizes[i]` samples. Each client draws a class prior from `Dir(alpha)`; then,
    /// sample by sample, a client that still needs samples is picked uniformly and the
    /// sample's class is drawn from that client's prior, with exhausted classes at zero
    /// probability and the rest renormalised. Samples beyond the sum of the sizes are unused.
    InnerDirichlet {
        /// Samples per client, one entry per client.
        partition_sizes: Vec<usize>,
        /// Concentration of each client's class prior, `> 0`.
        alpha: f64,
    },
    /// Every client gets exactly `classes_per_client` distinct classes, and each class's samples
    /// are split evenly among the clients that own it (Flower's `PathologicalPartitioner`;
    /// see [`ClassAssignment`] for how the classes are chosen).
    Pathological {
        /// Distinct classes per client.
        classes_per_client: usize,
        /// How each client's classes are chosen (`random` by default).
        #[serde(default, skip_serializing_if = "ClassAssignment::is_random")]
        class_assignment_mode: ClassAssignment,
    },
    /// McMahan et al.'s shards: sort by label, cut into shards of `shard_size`, give each client
    /// `shards_per_client` random shards (Flower's `ShardPartitioner`).
    Shards {
        /// Shards each client gets.
        shards_per_client: usize,
        /// Samples per shard.
        shard_size: usize,
    },
    /// Explicit sizes (Flower's `SizePartitioner`): after the global shuffle, client `i` gets
    /// the next `partition_sizes[i]` samples; samples beyond their sum are unused.
    Size {
        /// Samples per client, one entry per client.
        partition_sizes: Vec<usize>,
    },
    /// Quantity skew with sizes proportional to the client id `1..=M` (Flower's
    /// `LinearPartitioner`); see [`PartitionSpec::Exponential`] for the rounding.
    Linear {},
    /// Quantity skew with sizes proportional to `id²`, ids `1..=M` (Flower's
    /// `SquarePartitioner`); see [`PartitionSpec::Exponential`] for the rounding.
    Square {},
    /// Quantity skew with sizes proportional to `e^id`, ids `1..=M` (Flower's
    /// `ExponentialPartitioner`). As Flower's `IdToSizeFncPartitioner` does, each size is
    /// `floor(n * f(id) / sum f)`, the samples left over go to the last client, and clients
    /// take contiguous blocks of the shuffled samples. A client left with no sample is an error.
    Exponential {},
    /// One client per distinct value of a per-sample column (Flower's `NaturalIdPartitioner`:
    /// a writer, a speaker, a hospital), values in ascending order: client 0 holds the
    /// smallest. The number of clients must equal the number of distinct values.
    NaturalId {
        /// The column holding each sample's natural id (Flower's `partition_by`).
        #[serde(alias = "partition_by")]
        column: String,
    },
    /// Natural ids grouped `group_size` at a time into clients, turning a cross-device split
    /// into a cross-silo one (Flower's `GroupedNaturalIdPartitioner`). The ids are taken in
    /// order of first appearance in the shuffled samples, or ascending with
    /// `sort_unique_ids`; [`GroupMode`] says what happens to the remainder.
    GroupedNaturalId {
        /// The column holding each sample's natural id (Flower's `partition_by`).
        #[serde(alias = "partition_by")]
        column: String,
        /// Natural ids per client.
        group_size: usize,
        /// What to do when the ids do not divide into whole groups.
        #[serde(default)]
        mode: GroupMode,
        /// Group the ids in ascending order instead of order of first appearance.
        #[serde(default)]
        sort_unique_ids: bool,
    },
    /// Skew along a real-valued column (Flower's `ContinuousPartitioner`): each sample scores
    /// `b = strictness * z + (1 - strictness) * e`, with `z` the column standardised (mean 0,
    /// population standard deviation 1) and `e` standard normal noise; samples sorted by `b`
    /// are cut into near-equal contiguous blocks. `strictness = 0` is IID, `1` a strict sort.
    Continuous {
        /// The real-valued column (Flower's `partition_by`).
        #[serde(alias = "partition_by")]
        column: String,
        /// How strongly the column orders the samples, in `[0, 1]`.
        strictness: f64,
    },
}

/// How [`PartitionSpec::Pathological`] picks each client's classes (Flower's
/// `class_assignment_mode`). Classes are the distinct labels present, in ascending order;
/// `L` below is their number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ClassAssignment {
    /// Each client draws its classes without replacement; then, while some class has no owner
    /// and another has two, one of the two owners takes the unowned class instead, so that
    /// every class is used whenever `clients * classes_per_client >= L` (Flower leaves such
    /// classes unused).
    #[default]
    Random,
    /// Client `i` gets classes `i, i+1, ..., i+k-1` (mod `L`): no randomness in the choice.
    Deterministic,
    /// Client `i`'s first class is `i mod L`, its other `k - 1` drawn at random from the rest:
    /// Li et al. 2021 (NIID-Bench, `#C=k`). Every class is used when `clients >= L`.
    FirstDeterministic,
}

impl ClassAssignment {
    fn is_random(&self) -> bool {
        *self == ClassAssignment::Random
    }
}

/// What [`PartitionSpec::GroupedNaturalId`] does with natural ids that do not fill a whole
/// group (Flower's `mode`, spelling included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum GroupMode {
    /// The last group holds the remainder (fewer than `group_size` ids); fewer ids than
    /// `group_size` make one group.
    #[default]
    AllowSmaller,
    /// `floor(ids / group_size)` groups, the remainder spread one each over the first groups.
    AllowBigger,
    /// The ids that do not fill a whole group, and their samples, are left out.
    #[serde(alias = "drop-remainder")]
    DropReminder,
    /// The ids must divide into whole groups; a remainder is an error.
    Strict,
}

impl GroupMode {
    fn name(self) -> &'static str {
        match self {
            GroupMode::AllowSmaller => "allow-smaller",
            GroupMode::AllowBigger => "allow-bigger",
            GroupMode::DropReminder => "drop-reminder",
            GroupMode::Strict => "strict",
        }
    }
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

    /// The `kind` name, as written in a config.
    pub fn kind(&self) -> &'static str {
        match self {
            PartitionSpec::Iid {} => "iid",
            PartitionSpec::Dirichlet { .. } => "dirichlet",
            PartitionSpec::InnerDirichlet { .. } => "inner_dirichlet",
            PartitionSpec::Pathological { .. } => "pathological",
            PartitionSpec::Shards { .. } => "shards",
            PartitionSpec::Size { .. } => "size",
            PartitionSpec::Linear {} => "linear",
            PartitionSpec::Square {} => "square",
            PartitionSpec::Exponential {} => "exponential",
            PartitionSpec::NaturalId { .. } => "natural_id",
            PartitionSpec::GroupedNaturalId { .. } => "grouped_natural_id",
            PartitionSpec::Continuous { .. } => "continuous",
        }
    }

    /// The per-sample column this spec splits by (`natural_id`, `grouped_natural_id`,
    /// `continuous`), which a loader must keep aside for [`partition_with`].
    pub fn column(&self) -> Option<&str> {
        match self {
            PartitionSpec::NaturalId { column }
            | PartitionSpec::GroupedNaturalId { column, .. }
            | PartitionSpec::Continuous { column, .. } => Some(column),
            _ => None,
        }
    }

    /// The settings' own ranges, checkable before any data is loaded (what depends on the
    /// data, such as enough samples per client, is checked by [`partition`]). Errors are
    /// [`DataError::InvalidArgument`] naming the setting.
    pub fn check(&self) -> Result<()> {
        let bad = |field: &'static str, msg: String| Err(DataError::InvalidArgument { field, msg });
        match self {
            PartitionSpec::Iid {}
            | PartitionSpec::Linear {}
            | PartitionSpec::Square {}
            | PartitionSpec::Exponential {} => Ok(()),
            PartitionSpec::Dirichlet { alpha, .. } => check_alpha(*alpha),
            PartitionSpec::InnerDirichlet {
                partition_sizes,
                alpha,
            } => {
                check_sizes(partition_sizes)?;
                check_alpha(*alpha)
            }
            PartitionSpec::Pathological {
                classes_per_client: 0,
                ..
            } => bad("classes_per_client", "must be at least 1".into()),
            PartitionSpec::Pathological { .. } => Ok(()),
            PartitionSpec::Shards {
                shards_per_client,
                shard_size,
            } if *shards_per_client == 0 || *shard_size == 0 => bad(
                if *shards_per_client == 0 {
                    "shards_per_client"
                } else {
                    "shard_size"
                },
                "must be at least 1".into(),
            ),
            PartitionSpec::Shards { .. } => Ok(()),
            PartitionSpec::Size { partition_sizes } => check_sizes(partition_sizes),
            PartitionSpec::NaturalId { column } => check_column(column),
            PartitionSpec::GroupedNaturalId {
                column, group_size, ..
            } => {
                check_column(column)?;
                if *group_size == 0 {
                    return bad(
                        "group_size",
                        "must be at least 1: the number of natural ids per client".into(),
                    );
                }
                Ok(())
            }
            PartitionSpec::Continuous { column, strictness } => {
                check_column(column)?;
                if (0.0..=1.0).contains(strictness) {
                    Ok(())
                } else {
                    bad(
                        "strictness",
                        format!("{strictness} is not in [0, 1]; 0 is IID, 1 sorts strictly"),
                    )
                }
            }
        }
    }

    /// Checks that the spec can make `clients` partitions, where the spec alone fixes their
    /// number (`partition_sizes` has one entry per client). Kinds whose number of partitions
    /// depends on the data (`natural_id`, `grouped_natural_id`) are checked by
    /// [`partition_with`].
    pub fn check_clients(&self, clients: usize) -> Result<()> {
        match self {
            PartitionSpec::InnerDirichlet {
                partition_sizes, ..
            }
            | PartitionSpec::Size { partition_sizes }
                if partition_sizes.len() != clients =>
            {
                let m = partition_sizes.len();
                Err(DataError::InvalidArgument {
                    field: "partition_sizes",
                    msg: format!(
                        "lists {m} sizes but there are {clients} clients; give one size per \
                         client, or set clients = {m}"
                    ),
                })
            }
            _ => Ok(()),
        }
    }
}

fn check_alpha(alpha: f64) -> Result<()> {
    if alpha.is_finite() && alpha > 0.0 {
        Ok(())
    } else {
        Err(DataError::InvalidArgument {
            field: "alpha",
            msg: format!("{alpha} is not a positive number; 0.1 is very skewed, 100 is nearly IID"),
        })
    }
}

fn check_sizes(sizes: &[usize]) -> Result<()> {
    let msg = if sizes.is_empty() {
        "is empty; give each client's number of samples, e.g. [600, 300, 100]".to_string()
    } else if let Some(i) = sizes.iter().position(|&s| s == 0) {
        format!("entry {i} is 0; every client needs at least one sample")
    } else {
        return Ok(());
    };
    Err(DataError::InvalidArgument {
        field: "partition_sizes",
        msg,
    })
}

fn check_column(column: &str) -> Result<()> {
    if column.trim().is_empty() {
        Err(DataError::InvalidArgument {
            field: "column",
            msg: "is empty; name the per-sample column to split by (e.g. a CSV header)".into(),
        })
    } else {
        Ok(())
    }
}

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
/// `drop-reminder` drops the samples of the ids left out.
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

/// A global shuffle, then contiguous blocks of the given sizes (which sum to at most `n`).
fn contiguous(n: usize, sizes: &[usize], rng: &mut impl Rng) -> Vec<Vec<usize>> {
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(rng);
    let mut start = 0;
    sizes
        .iter()
        .map(|&len| {
            let block = perm[start..start + len].to_vec();
            start += len;
            block
        })
        .collect()
}

/// Client sizes of Flower's `IdToSizeFncPartitioner`: `floor(n * f(id) / sum f)` for ids
/// `1..=clients`, the left-over samples to the last client.
fn id_to_size_sizes(f: impl Fn(f64) -> f64, n: usize, clients: usize) -> Vec<usize> {
    let units: Vec<f64> = (1..=clients).map(|id| f(id as f64)).collect();
    // numpy's pairwise sum equals this left-to-right sum for fewer than 9 terms and for the
    // integer-valued units of linear and square.
    let total: f64 = units.iter().sum();
    let mut sizes: Vec<usize> = units
        .iter()
        .map(|u| (u / total * n as f64) as usize)
        .collect();
    let assigned: usize = sizes.iter().sum();
    if let Some(last) = sizes.last_mut() {
        *last += n.saturating_sub(assigned);
    }
    sizes
}

fn id_to_size(
    spec: &PartitionSpec,
    f: impl Fn(f64) -> f64,
    n: usize,
    clients: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let sizes = id_to_size_sizes(f, n, clients);
    if let Some(i) = sizes.iter().position(|&s| s == 0) {
        return Err(DataError::Partition(format!(
            "{} over {clients} clients of {n} samples gives client {i} no sample (sizes {sizes:?}); \
             use fewer clients",
            spec.kind()
        )));
    }
    if sizes.iter().sum::<usize>() != n {
        return Err(DataError::Partition(format!(
            "{} over {clients} clients of {n} samples gives sizes {sizes:?}, which do not sum \
             to {n}; use fewer clients",
            spec.kind()
        )));
    }
    Ok(contiguous(n, &sizes, rng))
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

fn gamma(alpha: f64) -> Result<Gamma<f64>> {
    Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Partition(format!("Dirichlet alpha {alpha} is not usable: {e}")))
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
    if clients.saturating_mul(min_size) > n {
        return Err(DataError::Partition(format!(
            "{clients} clients x min_partition_size {min_size} = {} exceeds the {n} samples; \
             lower the number of clients or min_partition_size",
            clients.saturating_mul(min_size)
        )));
    }
    let gamma = gamma(alpha)?;
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

fn inner_dirichlet(
    labels: &[u32],
    num_classes: usize,
    sizes: &[usize],
    alpha: f64,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
    let total = sizes.iter().sum::<usize>();
    if total > n {
        return Err(DataError::Partition(format!(
            "inner_dirichlet: partition_sizes sum to {total} but there are only {n} samples; \
             lower them"
        )));
    }
    let gamma = gamma(alpha)?;
    // The classes present, each with its samples; a class's samples are handed out from the
    // end of its list.
    let classes: Vec<Vec<usize>> = by_class(labels, num_classes)
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    let priors: Vec<Vec<f64>> = sizes
        .iter()
        .map(|_| dirichlet_draw(classes.len(), &gamma, rng))
        .collect();
    let mut class_left: Vec<usize> = classes.iter().map(Vec::len).collect();
    let mut left = sizes.to_vec();
    let mut open: Vec<usize> = (0..sizes.len()).filter(|&p| left[p] > 0).collect();
    let mut parts: Vec<Vec<usize>> = sizes.iter().map(|&s| Vec::with_capacity(s)).collect();
    while !open.is_empty() {
        let slot = rng.random_range(0..open.len());
        let p = open[slot];
        // The prior with exhausted classes at zero, renormalised: a draw proportional to the
        // remaining classes' weights. Should every remaining class have underflowed to zero
        // weight (tiny alpha), the draw is uniform over the remaining classes.
        let weight = |c: usize| if class_left[c] > 0 { priors[p][c] } else { 0.0 };
        let mass: f64 = (0..classes.len()).map(weight).sum();
        let c = if mass > 0.0 {
            let u = rng.random::<f64>() * mass;
            let mut cum = 0.0;
            let mut pick = None;
            for c in (0..classes.len()).filter(|&c| weight(c) > 0.0) {
                cum += weight(c);
                pick = Some(c);
                if u < cum {
                    break;
                }
            }
            pick
        } else {
            let remaining: Vec<usize> = (0..classes.len()).filter(|&c| class_left[c] > 0).collect();
            (!remaining.is_empty()).then(|| remaining[rng.random_range(0..remaining.len())])
        };
        let Some(c) = c else {
            break; // cannot happen: the sizes sum to at most n
        };
        class_left[c] -= 1;
        parts[p].push(classes[c][class_left[c]]);
        left[p] -= 1;
        if left[p] == 0 {
            open.remove(slot);
        }
    }
    Ok(parts)
}

fn pathological(
    labels: &[u32],
    num_classes: usize,
    clients: usize,
    k: usize,
    mode: ClassAssignment,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let classes = by_class(labels, num_classes);
    let present: Vec<usize> = (0..num_classes)
        .filter(|&c| !classes[c].is_empty())
        .collect();
    let n_present = present.len();
    if k == 0 || k > n_present {
        return Err(DataError::Partition(format!(
            "classes_per_client = {k} must be between 1 and the {n_present} classes present in \
             the labels"
        )));
    }
    let owned = match mode {
        ClassAssignment::Random => random_classes(&present, num_classes, clients, k, rng),
        ClassAssignment::Deterministic => (0..clients)
            .map(|i| (0..k).map(|j| present[(i + j) % n_present]).collect())
            .collect(),
        ClassAssignment::FirstDeterministic => (0..clients)
            .map(|i| {
                let first = present[i % n_present];
                let mut rest: Vec<usize> =
                    present.iter().copied().filter(|&c| c != first).collect();
                rest.shuffle(rng);
                rest.truncate(k - 1);
                std::iter::once(first).chain(rest).collect()
            })
            .collect(),
    };
    let mut owners: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, cs) in owned.iter().enumerate() {
        for &c in cs {
            owners[c].push(i);
        }
    }
    if mode != ClassAssignment::Random
        && let Some(c) = (0..num_classes).find(|&c| owners[c].len() > classes[c].len())
    {
        return Err(DataError::Partition(format!(
            "class {c} has {} samples but class_assignment_mode `{}` gives it to {} clients; \
             use fewer clients or classes_per_client",
            classes[c].len(),
            if mode == ClassAssignment::Deterministic {
                "deterministic"
            } else {
                "first-deterministic"
            },
            owners[c].len()
        )));
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

/// Random class assignment: each client `k` distinct classes of `present`, then repaired so
/// that every class is owned when `clients * k >= present.len()`.
fn random_classes(
    present: &[usize],
    num_classes: usize,
    clients: usize,
    k: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<usize>> {
    let mut owned: Vec<Vec<usize>> = (0..clients)
        .map(|_| {
            let mut pool = present.to_vec();
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
    owned
}

fn shards(
    labels: &[u32],
    clients: usize,
    per_client: usize,
    shard_size: usize,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let n = labels.len();
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

/// Each row's natural id, as the rank of its value among the column's distinct values in
/// ascending order (strings for a categorical column, numbers for a real one), and the number
/// of distinct values.
fn natural_ids(column: &Column) -> (Vec<usize>, usize) {
    match column {
        Column::Categorical { levels, codes } => {
            let mut used: Vec<usize> = codes.iter().map(|&c| c as usize).collect();
            used.sort_unstable();
            used.dedup();
            used.sort_by(|&a, &b| levels[a].cmp(&levels[b]));
            let mut rank = vec![0; levels.len()];
            for (r, &code) in used.iter().enumerate() {
                rank[code] = r;
            }
            (
                codes.iter().map(|&c| rank[c as usize]).collect(),
                used.len(),
            )
        }
        Column::Real(values) => {
            // `+ 0.0` makes -0 and 0 one value, as numpy's unique does.
            let key = |v: f32| v + 0.0;
            let mut distinct: Vec<f32> = values.iter().map(|&v| key(v)).collect();
            distinct.sort_by(f32::total_cmp);
            distinct.dedup_by(|a, b| a.total_cmp(b).is_eq());
            let ids = values
                .iter()
                .map(|&v| {
                    distinct
                        .binary_search_by(|d| d.total_cmp(&key(v)))
                        .unwrap_or_default()
                })
                .collect();
            (ids, distinct.len())
        }
    }
}

/// The rows of each group: row `r` goes to `group_of[ids[r]]` (or nowhere for `None`).
fn rows_by_group(ids: &[usize], group_of: &[Option<usize>], groups: usize) -> Vec<Vec<usize>> {
    let mut parts = vec![Vec::new(); groups];
    for (row, &id) in ids.iter().enumerate() {
        if let Some(g) = group_of[id] {
            parts[g].push(row);
        }
    }
    parts
}

#[allow(clippy::too_many_arguments)]
fn grouped_natural_id(
    name: &str,
    column: &Column,
    clients: usize,
    group_size: usize,
    mode: GroupMode,
    sort_unique_ids: bool,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let (ids, count) = natural_ids(column);
    let err = |msg: String| Err(DataError::Partition(format!("grouped_natural_id: {msg}")));
    // The ids in the order they are grouped.
    let order: Vec<usize> = if sort_unique_ids {
        (0..count).collect()
    } else {
        let mut rows: Vec<usize> = (0..ids.len()).collect();
        rows.shuffle(rng);
        let mut seen = vec![false; count];
        rows.iter()
            .filter_map(|&r| (!std::mem::replace(&mut seen[ids[r]], true)).then_some(ids[r]))
            .collect()
    };
    if mode != GroupMode::AllowSmaller && group_size > count {
        return err(format!(
            "group_size {group_size} exceeds the {count} distinct values of column `{name}`; \
             lower group_size or use mode allow-smaller (one client)"
        ));
    }
    let whole = count / group_size;
    let groups: Vec<Vec<usize>> = match mode {
        GroupMode::AllowSmaller => order.chunks(group_size).map(<[usize]>::to_vec).collect(),
        GroupMode::AllowBigger => array_split(&order, whole),
        GroupMode::DropReminder => order[..whole * group_size]
            .chunks(group_size)
            .map(<[usize]>::to_vec)
            .collect(),
        GroupMode::Strict if count % group_size != 0 => {
            return err(format!(
                "mode strict needs the {count} distinct values of column `{name}` to divide into \
                 groups of {group_size}, but {} are left over; pick a group_size that divides \
                 {count}, or another mode",
                count % group_size
            ));
        }
        GroupMode::Strict => order.chunks(group_size).map(<[usize]>::to_vec).collect(),
    };
    if groups.len() != clients {
        return err(format!(
            "the {count} distinct values of column `{name}` in groups of {group_size} ({}) make \
             {} clients, but {clients} were asked for; set clients = {}",
            mode.name(),
            groups.len(),
            groups.len()
        ));
    }
    let mut group_of = vec![None; count];
    for (g, members) in groups.iter().enumerate() {
        for &id in members {
            group_of[id] = Some(g);
        }
    }
    Ok(rows_by_group(&ids, &group_of, groups.len()))
}

fn continuous(
    name: &str,
    column: &Column,
    clients: usize,
    strictness: f64,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let err = |msg: String| Err(DataError::Partition(format!("continuous: {msg}")));
    let Column::Real(values) = column else {
        return err(format!(
            "column `{name}` is categorical; continuous needs a real-valued column (use \
             natural_id or grouped_natural_id for categories)"
        ));
    };
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return err(format!(
            "column `{name}` holds {} at row {i}; drop or fill such rows first",
            values[i]
        ));
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let std = (values
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    if std < 1e-6 && strictness > 0.0 {
        return err(format!(
            "column `{name}` is (nearly) constant (standard deviation {std:e}), so it cannot \
             order the samples; pick another column, or strictness = 0 for IID"
        ));
    }
    let score: Vec<f64> = values
        .iter()
        .map(|&v| {
            let z = if strictness > 0.0 {
                (f64::from(v) - mean) / std
            } else {
                0.0
            };
            let noise: f64 = rng.sample(StandardNormal);
            strictness * z + (1.0 - strictness) * noise
        })
        .collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| score[a].total_cmp(&score[b]));
    Ok(array_split(&order, clients))
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
