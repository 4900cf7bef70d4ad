use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_data::{ClientData, Dataset, Table};
use fedfuse_train::{TrainConfig, Trainer};

use crate::{FedError, Result};

/// What a client has when it runs a method's local procedure.
pub struct ClientContext<'a> {
    /// Client id (index into the partition).
    pub id: usize,
    /// The client's own data.
    pub data: &'a ClientData,
    /// Builds, trains and evaluates the model.
    pub trainer: &'a Trainer,
    /// Local training settings.
    pub train: &'a TrainConfig,
    /// Seed for this client in this round.
    pub seed: u64,
}

/// What a client of a tabular federation ([`Method::tabular`], e.g. FedNGM) has when it runs
/// the method's local procedure: a table and no classifier.
pub struct TableContext<'a> {
    /// Client id (index into the clients).
    pub id: usize,
    /// The client's own rows.
    pub table: &'a Table,
    /// Seed for this client in this round.
    pub seed: u64,
}

/// A client's decoded reply.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Client id.
    pub client: usize,
    /// What it sent.
    pub record: Record,
}

/// The server step's outcome.
#[derive(Clone, Debug)]
pub enum Aggregate {
    /// The next global model.
    Replace(Params),
    /// Keep the global model as it is (e.g. no usable reply).
    Keep,
}

/// A server step that folds replies in as they arrive, so that a round over many clients holds
/// only a few replies at a time.
pub trait Fold: Send {
    /// Takes one accepted reply.
    fn add(&mut self, reply: Reply) -> Result<()>;
    /// The next global model, after at least one reply.
    fn finish(self: Box<Self>, round: usize, global: &Params) -> Result<Aggregate>;
}

/// Config key for the proximal coefficient a server sends (Flower's `proximal-mu`).
pub const PROXIMAL_MU: &str = "proximal_mu";
/// Metric key of a reply's accuracy on the client's own test split (its uploaded model), which
/// the simulator adds when local evaluation is on.
pub const LOCAL_ACCURACY: &str = "local_accuracy";
/// Config key for the round number a server sends (Flower's `server-round`).
pub const SERVER_ROUND: &str = "server_round";

/// A federated method: a client procedure and a server aggregator that exchange [`Record`]s.
///
/// A method of its own gives [`Method::name`] and [`Method::aggregate`]; the client half
/// defaults to "train from the received model" ([`standard_fit`]).
///
/// A wrapper (a `[server]` step, central or local DP, FedBN's local norms, separate inits)
/// gives [`Method::inner`] and [`Method::inner_mut`] and only the calls it changes: every
/// other call reaches the wrapped method. One rule comes with that: a wrapper that changes
/// the server step ([`Method::aggregate`]) changes [`Method::fold`] too (its own, or `None`),
/// or the streaming path would run the inner step alone; one that keeps state of its own
/// saves it with [`nest_state`] and [`unnest_state`].
pub trait Method: Send + Sync {
    /// The method's name as written in configs (`fedavg`, ...).
    fn name(&self) -> &'static str;

    /// The method this one wraps, for a wrapper; `None` (the default) for a method of its own.
    fn inner(&self) -> Option<&dyn Method> {
        None
    }

    /// [`Method::inner`], to change: a wrapper gives both.
    fn inner_mut(&mut self) -> Option<&mut dyn Method> {
        None
    }

    /// What `client` receives in `round`: by default the global model and the round number.
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        match self.inner() {
            Some(inner) => inner.instruct(round, client, global),
            None => Ok(Record::from_params(global.clone())
                .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))),
        }
    }

    /// The local procedure, run on the client.
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        match self.inner() {
            Some(inner) => inner.fit(instruction, ctx),
            None => standard_fit(instruction, ctx),
        }
    }

    /// Whether the method's clients hold tables ([`Method::fit_table`], run by
    /// [`Population::Tables`](crate::Population::Tables)) rather than labelled samples. Its global
    /// model is then no classifier: the simulator reports no accuracy or loss of it, only the
    /// method's own figures ([`Method::evaluate_table`]). `false` by default.
    fn tabular(&self) -> bool {
        self.inner().is_some_and(|inner| inner.tabular())
    }

    /// The local procedure of a tabular method, run on a client holding a table. Methods that
    /// train classifiers have none.
    fn fit_table(&self, instruction: Record, ctx: &TableContext<'_>) -> Result<Record> {
        match self.inner() {
            Some(inner) => inner.fit_table(instruction, ctx),
            None => Err(FedError::BadReply {
                client: ctx.id,
                reason: format!("`{}` trains on labelled samples, not tables", self.name()),
            }),
        }
    }

    /// Whether a reply's `num_examples` is its weight (the default), so that one claiming
    /// none is left out of the round rather than failing the weighted mean. FedNGM's
    /// statistics replies carry no count.
    fn weighs_by_examples(&self) -> bool {
        self.inner().is_none_or(|inner| inner.weighs_by_examples())
    }

    /// A reply as the server's checks ([`Method::check_reply`], the `[replies]` bounds) and
    /// its aggregate see it, made from the reply as received: by default unchanged. FedBN's
    /// wrapper ([`LocalNorm`](crate::LocalNorm)) puts the global model's normalisation tensors
    /// back, which its clients keep and do not send, so that the method it wraps gets replies
    /// of the global model's layout.
    fn restore_reply(&self, global: &Params, reply: Record) -> Result<Record> {
        match self.inner() {
            Some(inner) => inner.restore_reply(global, reply),
            None => Ok(reply),
        }
    }

    /// The model client `client` runs when given `model` (the global model, or its own
    /// upload): `None` when that is `model` itself, as for every method but FedBN's wrapper
    /// ([`LocalNorm`](crate::LocalNorm)), whose clients put in their own normalisation
    /// tensors. Local evaluation scores this model on the client's test split.
    fn client_model(&self, client: usize, model: &Params) -> Result<Option<Params>> {
        match self.inner() {
            Some(inner) => inner.client_model(client, model),
            None => Ok(None),
        }
    }

    /// What client `client` keeps from one of its rounds to the next (FedBN's wrapper,
    /// [`LocalNorm`](crate::LocalNorm): its own normalisation tensors), for a client whose
    /// process does not outlive a round: a Python Flower ClientApp stores it in its node's
    /// `Context.state` and puts it back with [`Method::set_client_state`]. `None` when the
    /// client keeps nothing, yet or at all (every other method).
    fn client_state(&self, client: usize) -> Result<Option<Params>> {
        match self.inner() {
            Some(inner) => inner.client_state(client),
            None => Ok(None),
        }
    }

    /// Puts back what [`Method::client_state`] gave, before the client's next step; `None`
    /// when it has kept nothing yet. An error, naming what does not fit, when `state` cannot
    /// be this method's for this model.
    fn set_client_state(&self, client: usize, state: Option<Params>) -> Result<()> {
        if let Some(inner) = self.inner() {
            return inner.set_client_state(client, state);
        }
        match state {
            None => Ok(()),
            Some(_) => Err(FedError::ClientState {
                client,
                reason: format!("`{}` keeps no state on its clients", self.name()),
            }),
        }
    }

    /// Checks a reply before aggregation; by default it must have the global model's layout
    /// and finite values.
    fn check_reply(&self, global: &Params, reply: &Record) -> Result<()> {
        if let Some(inner) = self.inner() {
            return inner.check_reply(global, reply);
        }
        reply.params.check_layout(&global.layout())?;
        reply.params.check_finite()?;
        Ok(())
    }

    /// The server step over the accepted replies (never empty). Every method of its own gives
    /// it; a wrapper's default is its inner method's.
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let name = self.name();
        match self.inner_mut() {
            Some(inner) => inner.aggregate(round, global, replies),
            None => Err(FedError::MethodState {
                method: name,
                reason: "it has no server step (a method of its own gives `aggregate`)",
            }),
        }
    }

    /// The server step of a round in which no reply was accepted (nobody sampled, or every
    /// reply rejected): the global model is kept by default. Central DP releases a noised
    /// model every round instead, so that an empty round reveals nothing.
    fn aggregate_no_replies(&mut self, round: usize, global: &Params) -> Result<Aggregate> {
        match self.inner_mut() {
            Some(inner) => inner.aggregate_no_replies(round, global),
            None => Ok(Aggregate::Keep),
        }
    }

    /// A streaming form of [`Method::aggregate`], for methods whose server step is a running
    /// sum; the simulator then never holds all replies of a round. `None` by default.
    fn fold(&self) -> Option<Box<dyn Fold>> {
        self.inner()?.fold()
    }

    /// Method-specific figures of the round just aggregated (a chosen coefficient, layer
    /// widths, sparsity), recorded in [`RoundMetrics::method`](crate::RoundMetrics). Empty by
    /// default.
    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.inner()
            .map_or_else(BTreeMap::new, |inner| inner.round_metrics())
    }

    /// Method-specific evaluation on the test set after a round (e.g. a mixture's ensemble),
    /// merged into [`RoundMetrics::method`](crate::RoundMetrics). Nothing by default.
    fn evaluate(&self, trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        match self.inner() {
            Some(inner) => inner.evaluate(trainer, test),
            None => Ok(BTreeMap::new()),
        }
    }

    /// A tabular method's evaluation of the global model on the server's held-out table after
    /// a round, merged into [`RoundMetrics::method`](crate::RoundMetrics). Nothing by default.
    fn evaluate_table(&self, global: &Params, test: &Table) -> Result<BTreeMap<String, f64>> {
        match self.inner() {
            Some(inner) => inner.evaluate_table(global, test),
            None => Ok(BTreeMap::new()),
        }
    }

    /// Whether the server keeps nothing from one round to the next but the global model (what
    /// it remembers for [`Method::round_metrics`] of the round just aggregated excepted), so
    /// that a checkpoint needs no state of its own. `false` by default. Only the defaults of
    /// a method of its own read it: a wrapper's [`Method::save_state`] and
    /// [`Method::load_state`] reach its inner method's.
    fn stateless(&self) -> bool {
        false
    }

    /// The server state a resumed run needs besides the global model, after a round: an empty
    /// record for a [stateless](Method::stateless) method, `None` for a method whose state
    /// cannot be saved (a run of it cannot resume).
    fn save_state(&self) -> Option<Result<Record>> {
        match self.inner() {
            Some(inner) => inner.save_state(),
            None => self.stateless().then(|| Ok(Record::default())),
        }
    }

    /// Restores what [`Method::save_state`] saved.
    fn load_state(&mut self, state: Record) -> Result<()> {
        let (name, stateless) = (self.name(), self.stateless());
        if let Some(inner) = self.inner_mut() {
            return inner.load_state(state);
        }
        if stateless {
            Ok(())
        } else {
            Err(FedError::CannotResume { method: name })
        }
    }

    /// Whether the method has built its final model, so that the run can stop before
    /// `rounds` (one-shot methods with a few stages, such as GEMS). `false` by default.
    fn finished(&self) -> bool {
        self.inner().is_some_and(|inner| inner.finished())
    }
}

/// The calls every wrapper makes the same way, inside its `impl Method`: its `inner` field is
/// the wrapped method, and it goes by that method's name.
macro_rules! wraps_inner {
    () => {
        fn inner(&self) -> Option<&dyn $crate::Method> {
            Some(self.inner.as_ref())
        }

        fn inner_mut(&mut self) -> Option<&mut dyn $crate::Method> {
            Some(self.inner.as_mut())
        }

        fn name(&self) -> &'static str {
            self.inner.name()
        }
    };
}
pub(crate) use wraps_inner;

/// Prefix of a wrapped method's state inside its wrapper's ([`nest_state`]).
const INNER_STATE: &str = "inner:";

/// A wrapper's checkpoint state: its own `own`, and its inner method's under a prefix (or
/// `None` when the inner method cannot be saved).
pub(crate) fn nest_state(own: Record, inner: &dyn Method) -> Option<Result<Record>> {
    let inner = inner.save_state()?;
    Some(inner.and_then(|inner| nest(own, inner)))
}

fn nest(mut out: Record, inner: Record) -> Result<Record> {
    for (name, t) in inner.params.iter() {
        out.params.push(
            format!("{INNER_STATE}{name}"),
            t.shape.clone(),
            t.data.clone(),
        )?;
    }
    for (k, v) in inner.config {
        out.config.insert(format!("{INNER_STATE}{k}"), v);
    }
    for (k, v) in inner.metrics {
        out.metrics.insert(format!("{INNER_STATE}{k}"), v);
    }
    Ok(out)
}

/// Splits a state written by [`nest_state`] into the wrapper's own and the inner method's.
pub(crate) fn unnest_state(state: Record) -> Result<(Record, Record)> {
    let (mut own, mut inner) = (Record::default(), Record::default());
    for (name, t) in state.params.iter() {
        match name.strip_prefix(INNER_STATE) {
            Some(n) => inner.params.push(n, t.shape.clone(), t.data.clone())?,
            None => own.params.push(name, t.shape.clone(), t.data.clone())?,
        }
    }
    for (k, v) in state.config {
        match k.strip_prefix(INNER_STATE) {
            Some(n) => inner.config.insert(n.to_string(), v),
            None => own.config.insert(k, v),
        };
    }
    for (k, v) in state.metrics {
        match k.strip_prefix(INNER_STATE) {
            Some(n) => inner.metrics.insert(n.to_string(), v),
            None => own.metrics.insert(k, v),
        };
    }
    Ok((own, inner))
}

/// Trains from the received parameters on the client's training split, adding the proximal
/// term when the instruction carries `proximal_mu`; replies with the trained parameters,
/// `num_examples` and `train_loss`.
pub fn standard_fit(instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
    let mu = instruction.config_f64(PROXIMAL_MU).unwrap_or(0.0);
    let start = &instruction.params;
    let prox = (mu > 0.0).then_some((start, mu));
    let fitted = ctx
        .trainer
        .fit_with(start, &ctx.data.train, ctx.train, prox, ctx.seed)?;
    let mut reply = Record::from_params(fitted.params).with_num_examples(fitted.examples as u64);
    reply.metrics.insert("train_loss".into(), fitted.loss);
    Ok(reply)
}
