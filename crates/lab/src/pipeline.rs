//! The data path every experiment shares, written once: load -> the server's held-out split
//! -> partition -> each client's train/test split; and for tabular methods, each client's
//! table and held-out rows.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Context, Result, bail};
use fedfuse_data::{
    CDC_2015_ZIP, CdcOptions, ClientData, Dataset, Ggm, GgmConfig, GraphShape, PartitionSpec,
    Table, client_splits, holdout, load_cdc, partition_with, sample_ggm,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The training set after the server took its validation split.
pub struct ServerSplit<'a> {
    /// What the clients share out.
    pub pool: Cow<'a, Dataset>,
    /// The server's held-out samples (`None` for a fraction of 0).
    pub validation: Option<Arc<Dataset>>,
}

/// Holds out `fraction` of `train` for the server (drawn with `rng`, before any partition);
/// a fraction of 0 takes nothing and draws nothing.
pub fn server_split<'a>(
    train: &'a Dataset,
    fraction: f64,
    rng: &mut impl Rng,
) -> Result<ServerSplit<'a>> {
    if fraction > 0.0 {
        let (pool, held) = holdout(train, fraction, rng)?;
        Ok(ServerSplit {
            pool: Cow::Owned(pool),
            validation: Some(Arc::new(held)),
        })
    } else {
        Ok(ServerSplit {
            pool: Cow::Borrowed(train),
            validation: None,
        })
    }
}

/// Splits `pool` among `clients` by `spec`, each client keeping `local_test_fraction` of its
/// share as its local test split.
pub fn client_data(
    pool: &Dataset,
    clients: usize,
    spec: &PartitionSpec,
    local_test_fraction: f64,
    rng: &mut impl Rng,
) -> Result<Vec<ClientData>> {
    let parts = partition_of(pool, clients, spec, rng)?;
    client_splits(pool, &parts, local_test_fraction, rng).context("client splits")
}

/// The clients of a dataset whose samples carry natural ids (FEMNIST's writers), split by
/// them, keeping the dataset's own per-id train/test split (LEAF's): each client trains on its
/// ids' samples of `pool` and tests on their samples of `test`.
pub fn client_data_by_ids(
    pool: &Dataset,
    test: &Dataset,
    clients: usize,
    spec: &PartitionSpec,
    rng: &mut impl Rng,
) -> Result<Vec<ClientData>> {
    let parts = partition_of(pool, clients, spec, rng)?;
    let (Some(pool_ids), Some(test_ids)) = (&pool.ids, &test.ids) else {
        bail!("the test split carries no natural ids to split it by");
    };
    // Each id's test samples, in order.
    let mut tests_of: Vec<Vec<usize>> = vec![Vec::new(); test_ids.names.len()];
    for (i, &id) in test_ids.of.iter().enumerate() {
        tests_of[id as usize].push(i);
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(client, mut part)| {
            if part.is_empty() {
                bail!("client {client} has no training sample");
            }
            part.shuffle(rng);
            let mut ids: Vec<u32> = part.iter().map(|&i| pool_ids.of[i]).collect();
            ids.sort_unstable();
            ids.dedup();
            let held: Vec<usize> = ids
                .iter()
                .flat_map(|&id| tests_of.get(id as usize).into_iter().flatten().copied())
                .collect();
            Ok(ClientData {
                train: pool.subset(&part),
                test: test.subset(&held),
            })
        })
        .collect()
}

/// The partition of `pool` by `spec`, by its natural ids when `spec` names their column.
fn partition_of(
    pool: &Dataset,
    clients: usize,
    spec: &PartitionSpec,
    rng: &mut impl Rng,
) -> Result<Vec<Vec<usize>>> {
    let column = match (spec.column(), &pool.ids) {
        (None, _) => None,
        (Some(name), Some(ids)) if ids.column == name => Some(ids.to_column()),
        (Some(name), _) => bail!(
            "`partition.kind = \"{}\"` splits by `{name}`, which this dataset's samples do \
             not carry",
            spec.kind()
        ),
    };
    partition_with(
        &pool.y,
        column.as_ref(),
        pool.num_classes,
        clients,
        spec,
        rng,
    )
    .context("partition")
}

/// The clients' tables.
pub struct ClientTables {
    /// Client names, for messages and tables.
    pub names: Vec<String>,
    /// Each client's training rows.
    pub train: Vec<Table>,
    /// Held-out rows: each client's (CDC), or one set for all (synthetic).
    pub test: Vec<Table>,
    /// Each client's own extra features (columns only it has), if any.
    pub extras: Vec<Vec<String>>,
}

/// Rows of one Gaussian graphical model with a random graph (`[table] kind = "synthetic"`):
/// `rows_per_client` for each client, then `test_rows` held out.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticTables {
    /// Features.
    pub features: usize,
    /// Rows per client.
    pub rows_per_client: usize,
    /// Held-out rows after the clients' rows.
    #[serde(default = "test_rows")]
    pub test_rows: usize,
    /// Edge probability of the random graph.
    pub edge_prob: f64,
    /// Off-diagonal precision magnitudes `[lo, hi]`.
    #[serde(default = "ggm_weight")]
    pub weight: (f64, f64),
    /// Diagonal-dominance margin (larger: weaker partial correlations).
    #[serde(default = "ggm_margin")]
    pub diag_margin: f64,
}

/// Default held-out rows of a synthetic table.
pub(crate) fn test_rows() -> usize {
    1000
}
/// Default off-diagonal precision magnitudes of a synthetic table.
pub(crate) fn ggm_weight() -> (f64, f64) {
    (0.4, 0.9)
}
/// Default diagonal-dominance margin of a synthetic table.
pub(crate) fn ggm_margin() -> f64 {
    0.3
}

/// Default split of the CDC file into clients.
pub(crate) fn cdc_split_name() -> String {
    "residence_status".into()
}
/// Default: every fifth row of each CDC client is held out.
pub(crate) fn test_every() -> usize {
    5
}

/// Draws one GGM and its rows with `seed`: `rows_per_client` for each client in turn, then the
/// held-out rows. Returns the model too (its graph and precision are the truth).
pub fn ggm_tables(
    spec: &SyntheticTables,
    clients: usize,
    seed: u64,
) -> Result<(ClientTables, Ggm)> {
    let n = clients * spec.rows_per_client;
    let mut g = GgmConfig::new(
        spec.features,
        n + spec.test_rows,
        GraphShape::Random {
            edge_prob: spec.edge_prob,
        },
    );
    g.weight = spec.weight;
    g.diag_margin = spec.diag_margin;
    let ggm = sample_ggm(&g, &mut StdRng::seed_from_u64(seed))?;
    let per = spec.rows_per_client;
    let train = (0..clients)
        .map(|c| ggm.table(c * per..(c + 1) * per))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let test = ggm.table(n..n + spec.test_rows)?;
    let tables = ClientTables {
        names: (0..clients).map(|c| format!("client {c}")).collect(),
        train,
        test: vec![test],
        extras: vec![Vec::new(); clients],
    };
    Ok((tables, ggm))
}

/// The CDC file under `data_dir`, one client per group of `opts.split`, without the `drop`
/// columns; every `test_every`-th row of each client is held out.
pub fn cdc_tables(
    data_dir: &Path,
    opts: &CdcOptions,
    drop: &[String],
    test_every: usize,
) -> Result<ClientTables> {
    let path = data_dir.join(CDC_2015_ZIP);
    let data = load_cdc(&path, opts).with_context(|| format!("CDC file {}", path.display()))?;
    let mut tables = ClientTables {
        names: Vec::new(),
        train: Vec::new(),
        test: Vec::new(),
        extras: Vec::new(),
    };
    for c in &data.clients {
        let keep: Vec<&str> = c
            .table
            .names()
            .iter()
            .map(String::as_str)
            .filter(|n| !drop.iter().any(|d| d == n))
            .collect();
        let t = c.table.select_columns(&keep)?;
        let (test, train): (Vec<usize>, Vec<usize>) =
            (0..t.n_rows()).partition(|r| r % test_every.max(1) == 0);
        tables.names.push(c.name.clone());
        tables.train.push(t.select_rows(&train)?);
        tables.test.push(t.select_rows(&test)?);
        tables.extras.push(c.extras.clone());
    }
    Ok(tables)
}
