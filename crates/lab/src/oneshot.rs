//! One-shot comparisons on the same local models: clients train once (from their own or a
//! common initialisation), and every aggregator and baseline is computed from those models,
//! as the PFNM and GPI-FNM papers compare them.

use fedfuse_core::Params;
use fedfuse_data::ClientData;
use fedfuse_train::{Init, TrainConfig, Trainer, init_params};
use rayon::prelude::*;

use crate::error::{Result, bail};
use fedfuse_fed::{Reply, derive_seed, put_class_counts};

/// Where the clients' local training starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Each client draws its own weights (seeded by the run seed and client id).
    Separate,
    /// Every client starts from the same weights (seeded by the run seed).
    Common,
}

/// A client's trained model and what the server may know of its data.
#[derive(Clone, Debug)]
pub struct LocalModel {
    /// Trained parameters.
    pub params: Params,
    /// Training examples per class.
    pub class_counts: Vec<f64>,
    /// Training examples.
    pub examples: usize,
}

/// Trains every client's model for `train.epochs`, clients in parallel.
///
/// With [`Start::Separate`] client `j` starts from `init_params(spec, init, derive_seed(seed, 1,
/// j))` and batches with the same seed: exactly what the matching methods' clients do in round
/// 1 of a federation with that seed. With [`Start::Common`] all start from the global initial
/// model of the simulator (`derive_seed(seed, 0, usize::MAX)`).
pub fn train_locals(
    trainer: &Trainer,
    clients: &[ClientData],
    train: &TrainConfig,
    init: Init,
    start: Start,
    seed: u64,
) -> Result<Vec<LocalModel>> {
    if clients.is_empty() {
        bail!("no clients to train");
    }
    let common = init_params(trainer.spec(), init, derive_seed(seed, 0, usize::MAX));
    clients
        .par_iter()
        .enumerate()
        .map(|(j, data)| {
            let task_seed = derive_seed(seed, 1, j);
            let own;
            let from = match start {
                Start::Common => &common,
                Start::Separate => {
                    own = init_params(trainer.spec(), init, task_seed);
                    &own
                }
            };
            let fitted = trainer.fit_with(from, &data.train, train, None, task_seed)?;
            Ok(LocalModel {
                params: fitted.params,
                class_counts: data
                    .train
                    .class_counts()
                    .into_iter()
                    .map(|c| c as f64)
                    .collect(),
                examples: fitted.examples,
            })
        })
        .collect()
}

/// The local models as the replies a server would receive in round 1 (parameters, example
/// counts and class counts), so that any method's server step can run on them.
pub fn replies(locals: &[LocalModel]) -> Vec<Reply> {
    locals
        .iter()
        .enumerate()
        .map(|(client, m)| {
            let mut record = fedfuse_core::Record::from_params(m.params.clone())
                .with_num_examples(m.examples as u64);
            let counts: Vec<usize> = m.class_counts.iter().map(|&c| c as usize).collect();
            put_class_counts(&mut record, &counts);
            Reply { client, record }
        })
        .collect()
}
