//! One-shot comparisons on the same local models: clients train once (from their own or a
//! common initialisation), and every aggregator and baseline is computed from those models,
//! as the PFNM and GPI-FNM papers compare them.

use fedfuse_core::Params;
use fedfuse_data::ClientData;
use fedfuse_fed::{
    ClientContext, FedAvg, Method, Reply, SeparateInits, client_step, derive_seed, put_class_counts,
};
use fedfuse_train::{Init, TrainConfig, Trainer, init_params};
use rayon::prelude::*;

use crate::error::{Result, bail};

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

/// Trains every client's model for `train.epochs`, clients in parallel: round 1's client step
/// of a federation with `seed` ([`client_step`], what the simulator and a Flower node run),
/// for FedAvg from its own initial weights or from a common one.
///
/// With [`Start::Separate`] client `j` starts from `init_params(spec, init, derive_seed(seed, 1,
/// j))`, as the matching methods' clients do in round 1. With [`Start::Common`] all start from
/// the global initial model of the simulator (`derive_seed(seed, 0, usize::MAX)`).
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
    let (method, global): (Box<dyn Method>, Params) = match start {
        Start::Separate => (
            Box::new(SeparateInits {
                inner: Box::new(FedAvg),
                init,
            }),
            Params::new(),
        ),
        Start::Common => (
            Box::new(FedAvg),
            init_params(trainer.spec(), init, derive_seed(seed, 0, usize::MAX)),
        ),
    };
    const ROUND: usize = 1;
    clients
        .par_iter()
        .enumerate()
        .map(|(id, data)| {
            let ctx = ClientContext {
                id,
                data,
                trainer,
                train,
                seed: derive_seed(seed, ROUND, id),
            };
            let instruction = method.instruct(ROUND, id, &global)?;
            let reply = client_step(method.as_ref(), instruction, &ctx, false)?;
            Ok(LocalModel {
                params: reply.params,
                class_counts: data
                    .train
                    .class_counts()
                    .into_iter()
                    .map(|c| c as f64)
                    .collect(),
                examples: reply.num_examples as usize,
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
