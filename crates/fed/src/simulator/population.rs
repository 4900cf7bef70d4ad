//! The clients' side of a simulated round: their data, their training step, and how the
//! global model is scored.

use std::collections::BTreeMap;

use fedfuse_core::{Params, Record};
use fedfuse_data::{ClientData, Dataset, Table};
use fedfuse_train::{TrainConfig, Trainer};
use rayon::prelude::*;

use crate::method::{LOCAL_ACCURACY, TableContext};
use crate::{ClientContext, FedError, Method, Result};

/// The messages of one client in one round, as encoded bytes.
pub(super) struct Exchange {
    /// Length of the instruction sent (counted even when the client then fails).
    pub(super) down: usize,
    /// The encoded reply, or why there is none.
    pub(super) up: Result<Vec<u8>>,
}

/// A global model's `(accuracy, loss, mean local accuracy)`, NaN where not measured.
pub type Scores = (f64, f64, f64);

/// The clients' data, and what the server evaluates the global model on. A Flower server
/// holds the second half only: its population has no clients.
#[derive(Clone, Copy)]
pub enum Population<'a> {
    /// Labelled samples: the global model is a classifier that `trainer` evaluates on `test`.
    Labelled {
        /// Builds, trains and evaluates the classifier.
        trainer: &'a Trainer,
        /// Every client's data, by client slot.
        clients: &'a [ClientData],
        /// The global test set.
        test: &'a Dataset,
    },
    /// Tables: the method scores its own global model on `test`, if any.
    Tables {
        /// Every client's rows, by client slot.
        clients: &'a [Table],
        /// The held-out rows.
        test: Option<&'a Table>,
    },
}

impl<'a> Population<'a> {
    /// Labelled clients and test set, scored by `trainer`.
    pub fn labelled(trainer: &'a Trainer, clients: &'a [ClientData], test: &'a Dataset) -> Self {
        Self::Labelled {
            trainer,
            clients,
            test,
        }
    }

    /// Tabular clients, scored on `test` if given.
    pub fn tables(clients: &'a [Table], test: Option<&'a Table>) -> Self {
        Self::Tables { clients, test }
    }

    /// Client slots.
    pub fn len(&self) -> usize {
        match self {
            Population::Labelled { clients, .. } => clients.len(),
            Population::Tables { clients, .. } => clients.len(),
        }
    }

    /// Whether there are no clients (the server's view on Flower).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Client `id`'s reply to `instruction`: [`client_step`] on labelled data, the method's
    /// tabular procedure on a table. The simulator and a node on Flower both run this.
    pub fn client_reply(
        &self,
        method: &dyn Method,
        instruction: Record,
        id: usize,
        (train, seed): (&TrainConfig, u64),
        local_eval: bool,
    ) -> Result<Record> {
        match *self {
            Population::Labelled {
                trainer, clients, ..
            } => {
                let ctx = ClientContext {
                    id,
                    data: &clients[id],
                    trainer,
                    train,
                    seed,
                };
                client_step(method, instruction, &ctx, local_eval)
            }
            Population::Tables { clients, .. } => {
                let ctx = TableContext {
                    id,
                    table: &clients[id],
                    seed,
                };
                method.fit_table(instruction, &ctx)
            }
        }
    }

    /// The global model's scores after a round: `(global accuracy, global loss, mean local
    /// accuracy)`, NaN where not measured (a table's model is no classifier; the local mean
    /// needs `local_eval` and the clients' data), and the method's own figures.
    pub fn evaluate(
        &self,
        method: &dyn Method,
        global: &Params,
        local_eval: bool,
    ) -> Result<(Scores, BTreeMap<String, f64>)> {
        let mut scores = method.round_metrics();
        let figures = match *self {
            Population::Labelled {
                trainer,
                clients,
                test,
            } => {
                let (eval, local, extra) =
                    evaluate_classifier(method, trainer, clients, test, global, local_eval)?;
                scores.extend(extra);
                (eval.accuracy, eval.loss, local)
            }
            Population::Tables { test, .. } => {
                if let Some(test) = test {
                    scores.extend(method.evaluate_table(global, test)?);
                }
                (f64::NAN, f64::NAN, f64::NAN)
            }
        };
        Ok((figures, scores))
    }
}

/// One client's task: receive, fit, reply.
pub(super) fn client_task(
    method: &dyn Method,
    round: usize,
    id: usize,
    global: &Params,
    ctx: (Population<'_>, &TrainConfig, u64),
    local_eval: bool,
) -> Exchange {
    let down = match method
        .instruct(round, id, global)
        .and_then(|r| Ok(r.encode()?))
    {
        Ok(bytes) => bytes,
        Err(e) => {
            return Exchange {
                down: 0,
                up: Err(e),
            };
        }
    };
    let (population, train, seed) = ctx;
    let up = Record::decode(&down)
        .map_err(FedError::from)
        .and_then(|received| {
            population.client_reply(method, received, id, (train, seed), local_eval)
        })
        .and_then(|reply| Ok(reply.encode()?));
    Exchange {
        down: down.len(),
        up,
    }
}

/// A client's whole step on an instruction: the method's local procedure, plus, when
/// `local_eval` is on, the accuracy of its upload on its own test split (unless the method
/// reported one). The simulator and a client on Flower both run exactly this.
pub fn client_step(
    method: &dyn Method,
    instruction: Record,
    ctx: &ClientContext<'_>,
    local_eval: bool,
) -> Result<Record> {
    let mut reply = method.fit(instruction, ctx)?;
    if local_eval && !reply.metrics.contains_key(LOCAL_ACCURACY) {
        // The model the client runs: under FedBN its upload with its own norms put back.
        let own = method.client_model(ctx.id, &reply.params)?;
        let model = own.as_ref().unwrap_or(&reply.params);
        if let Some(acc) = own_accuracy(model, ctx.data, ctx.trainer) {
            reply.metrics.insert(LOCAL_ACCURACY.into(), acc);
        }
    }
    Ok(reply)
}

/// The accuracy of a client's uploaded model on its own test split, as the client would
/// measure it (the model's own architecture if it differs from the trainer's); `None` when
/// there is no test split or the upload is not a model the trainer can run.
fn own_accuracy(params: &Params, data: &ClientData, trainer: &Trainer) -> Option<f64> {
    if data.test.is_empty() {
        return None;
    }
    if params.check_layout(&trainer.spec().param_shapes()).is_ok() {
        return trainer
            .evaluate(params, &data.test)
            .ok()
            .map(|e| e.accuracy);
    }
    let own = Trainer::new(trainer.spec().with_widths_of(params).ok()?).ok()?;
    own.evaluate(params, &data.test).ok().map(|e| e.accuracy)
}

/// The classifier's evaluation after a round: on the global test set, the mean over clients'
/// own test splits (NaN when `local_eval` is off; a server on Flower has none) and the
/// method's own figures. Each client scores the model it would run
/// ([`Method::client_model`]): the global model, or under FedBN the global model with the
/// client's own normalisation tensors.
pub fn evaluate_classifier(
    method: &dyn Method,
    trainer: &Trainer,
    clients: &[ClientData],
    test: &Dataset,
    global: &Params,
    local_eval: bool,
) -> Result<(fedfuse_train::Evaluation, f64, BTreeMap<String, f64>)> {
    // Matching methods change widths: evaluate the global model as what it now is.
    let reshaped;
    let evaluator = if global.check_layout(&trainer.spec().param_shapes()).is_ok() {
        trainer
    } else {
        reshaped = Trainer::new(trainer.spec().with_widths_of(global)?)?;
        &reshaped
    };
    let eval = evaluator.evaluate(global, test)?;
    let local_accuracy_mean = if local_eval {
        let accs = clients
            .par_iter()
            .enumerate()
            .filter(|(_, c)| !c.test.is_empty())
            .map(|(id, c)| {
                let own = method.client_model(id, global)?;
                let model = own.as_ref().unwrap_or(global);
                Ok(evaluator.evaluate(model, &c.test)?.accuracy)
            })
            .collect::<Result<Vec<f64>>>()?;
        if accs.is_empty() {
            // No client holds a local test sample: nothing was measured (an empty sum is
            // -0.0, which reads as a measured 0).
            f64::NAN
        } else {
            accs.iter().sum::<f64>() / accs.len() as f64
        }
    } else {
        f64::NAN
    };
    let scores = method.evaluate(evaluator, test)?;
    Ok((eval, local_accuracy_mean, scores))
}
