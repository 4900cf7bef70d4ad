//! The data path every experiment shares, written once: load -> the server's held-out split
//! -> partition -> each client's train/test split.

use std::borrow::Cow;
use std::sync::Arc;

use anyhow::{Context, Result};
use fedfuse_data::{ClientData, Dataset, PartitionSpec, client_splits, holdout, partition};
use rand::Rng;

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
    let parts = partition(&pool.y, pool.num_classes, clients, spec, rng).context("partition")?;
    client_splits(pool, &parts, local_test_fraction, rng).context("client splits")
}
