//! What a partition is: the kinds (Flower Datasets' partitioners) with their settings, and
//! the checks of those settings.

use crate::error::{DataError, Result};

/// Resampling rounds of the Dirichlet partitioner before it gives up (Flower uses 10).
pub(super) const DIRICHLET_TRIES: usize = 10;

/// How to split samples among clients.
///
/// Every kind has the name and semantics of a Flower Datasets partitioner. The label-based
/// kinds read only the labels; `natural_id`, `grouped_natural_id` and `continuous` split by
/// the values of one more per-sample column (Flower's `partition_by`), which the caller passes
/// to [`partition_with`](crate::partition_with).
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
    /// Reddi et al. 2021's CIFAR-100 split ("Adaptive Federated Optimization", ICLR 2021;
    /// TensorFlow Federated's `tff.simulation.datasets.cifar100`: 500 clients of 100 images):
    /// a two-level Pachinko allocation over CIFAR-100's superclasses, then their classes. It
    /// needs each class's superclass, so it splits only `cifar100` (100 fine labels, grouped
    /// by [`crate::CIFAR100_COARSE_OF_FINE`]); other datasets are refused.
    ///
    /// Clients are filled one after another. Client `c` draws a distribution over the 20
    /// coarse labels from `Dir(alpha)` and, for each coarse label, one over its 5 fine labels
    /// from `Dir(beta)`. Each of its samples then draws a coarse label from the first, a fine
    /// label from that coarse label's distribution, and a sample of that fine label uniformly
    /// without replacement from those left. A fine label whose samples are all gone gets
    /// probability zero, its coarse label's distribution renormalised (TFF's description);
    /// a coarse label whose fine labels are all gone is dropped from the coarse distribution
    /// of this and every later client, renormalised (TFF's text does not say; the public
    /// reference code, GitHub `omarfoq/knn-per`'s `pachinko_allocation_split`, does this).
    ///
    /// fedfuse's own choices: the draws come from the run's seeded RNG, so the clients are
    /// not those of TFF's published file, only drawn the same way; renormalising by
    /// drawing in proportion to the remaining weights is the same as drawing a client's
    /// prior over the remaining labels only (a Dirichlet restricted to some components and
    /// renormalised is the Dirichlet of those components); should the remaining weights all
    /// be zero (underflow at tiny `alpha`), the draw is uniform over what remains. Samples
    /// beyond `clients * samples_per_client` are unused.
    Pachinko {
        /// Concentration of each client's distribution over coarse labels, `> 0` (Reddi et
        /// al.: 0.1).
        #[serde(default = "default_pachinko_alpha")]
        alpha: f64,
        /// Concentration of each coarse label's distribution over its fine labels, `> 0`
        /// (Reddi et al.: 10).
        #[serde(default = "default_pachinko_beta")]
        beta: f64,
        /// Samples each client gets (Reddi et al.: 100); by default the samples divided by
        /// the clients, rounded down.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        samples_per_client: Option<usize>,
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
    pub(super) fn name(self) -> &'static str {
        match self {
            GroupMode::AllowSmaller => "allow-smaller",
            GroupMode::AllowBigger => "allow-bigger",
            GroupMode::DropReminder => "drop-reminder",
            GroupMode::Strict => "strict",
        }
    }
}

pub(super) fn default_min_partition_size() -> usize {
    10
}

fn default_pachinko_alpha() -> f64 {
    0.1
}

fn default_pachinko_beta() -> f64 {
    10.0
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
            PartitionSpec::Pachinko { .. } => "pachinko",
        }
    }

    /// The per-sample column this spec splits by (`natural_id`, `grouped_natural_id`,
    /// `continuous`), which a loader must keep aside for [`partition_with`](crate::partition_with).
    pub fn column(&self) -> Option<&str> {
        match self {
            PartitionSpec::NaturalId { column }
            | PartitionSpec::GroupedNaturalId { column, .. }
            | PartitionSpec::Continuous { column, .. } => Some(column),
            _ => None,
        }
    }

    /// Pachinko with Reddi et al.'s settings: `alpha = 0.1`, `beta = 10`, the samples shared
    /// evenly.
    pub fn pachinko() -> Self {
        PartitionSpec::Pachinko {
            alpha: default_pachinko_alpha(),
            beta: default_pachinko_beta(),
            samples_per_client: None,
        }
    }

    /// The settings' own ranges, checkable before any data is loaded (what depends on the
    /// data, such as enough samples per client, is checked by [`partition`](crate::partition)). Errors are
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
            PartitionSpec::Pachinko {
                alpha,
                beta,
                samples_per_client,
            } => {
                check_alpha(*alpha)?;
                if !(beta.is_finite() && *beta > 0.0) {
                    return bad(
                        "beta",
                        format!(
                            "{beta} is not a positive number; it spreads each coarse label over \
                             its fine labels (10 is Reddi et al.'s, nearly even)"
                        ),
                    );
                }
                if *samples_per_client == Some(0) {
                    return bad(
                        "samples_per_client",
                        "is 0; every client needs at least one sample (Reddi et al. give 100), \
                         or leave it out to share the samples evenly"
                            .into(),
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
    /// [`partition_with`](crate::partition_with).
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

pub(super) fn check_alpha(alpha: f64) -> Result<()> {
    if alpha.is_finite() && alpha > 0.0 {
        Ok(())
    } else {
        Err(DataError::InvalidArgument {
            field: "alpha",
            msg: format!("{alpha} is not a positive number; 0.1 is very skewed, 100 is nearly IID"),
        })
    }
}

pub(super) fn check_sizes(sizes: &[usize]) -> Result<()> {
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

pub(super) fn check_column(column: &str) -> Result<()> {
    if column.trim().is_empty() {
        Err(DataError::InvalidArgument {
            field: "column",
            msg: "is empty; name the per-sample column to split by (e.g. a CSV header)".into(),
        })
    } else {
        Ok(())
    }
}
