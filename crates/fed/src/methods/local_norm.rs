//! FedBN (Li et al. 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
//! Normalization") around another method: `model.local_norm = true`.
//!
//! Every normalisation layer's tensors (scale and shift, and batch norm's running mean,
//! variance and batch counter) stay on the clients:
//!
//! - an instruction carries none of them ([`Method::instruct`] drops them); the client puts in
//!   its own (those its last round trained, or the initial global model's the first time it
//!   takes part), runs the wrapped method's procedure, keeps the trained norms and replies
//!   without them;
//! - the server puts the global model's norm tensors back into each reply
//!   ([`Method::restore_reply`]), so the wrapped method checks and aggregates replies of the
//!   global layout unchanged, and keeps the global model's norm tensors as they were after
//!   every aggregate: they stay the initial model's for the whole run;
//! - each client's model ([`Method::client_model`], what local evaluation scores) is the
//!   global model with the client's own norm tensors.
//!
//! The clients' norms are this wrapper's state: in the simulator it holds every client's (a
//! checkpoint saves them), on a Rust Flower node the node's own, in memory; a Python
//! ClientApp, whose process may not outlive a round, takes its client's out after each step
//! ([`Method::client_state`]) into its node's `Context.state` and puts them back before the
//! next ([`Method::set_client_state`]). A client instructed with whole models (a stock
//! Flower strategy sends every tensor) uses its own norms instead of the received ones and
//! replies with a whole model, as it was asked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use fedfuse_core::{ModelSpec, ParamShape, Params, Record};

use crate::method::{nest_state, unnest_state};
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result};

/// Prefix of a client's norm tensors in the saved state: `client.{id}.{tensor}`.
const CLIENT: &str = "client.";

/// FedBN: the normalisation layers' tensors stay on the clients (see the module docs).
pub struct LocalNorm {
    inner: Box<dyn Method>,
    /// The model's tensors, in order.
    layout: Vec<ParamShape>,
    /// The norm tensors' names, in the model's order.
    names: Vec<String>,
    norms: BTreeSet<String>,
    /// The initial global model's norm tensors.
    initial: Params,
    /// Each client's own norm tensors, after its last round.
    own: Mutex<BTreeMap<usize, Params>>,
}

impl LocalNorm {
    /// Wraps `inner` for clients of `spec` whose global model starts at `init`; an error when
    /// `spec` has no normalisation layer.
    pub fn new(inner: Box<dyn Method>, spec: &ModelSpec, init: &Params) -> Result<Self> {
        let names = spec.norm_tensor_names()?;
        if names.is_empty() {
            return Err(FedError::InvalidSetting {
                field: "model.local_norm",
                reason: "the model has no normalisation layer whose tensors clients could \
                         keep: add batchnorm or groupnorm layers, or remove model.local_norm"
                    .into(),
            });
        }
        let layout = spec.param_shapes();
        init.check_layout(&layout)?;
        let initial = pick(init, &names).ok_or_else(|| FedError::InvalidSetting {
            field: "model.local_norm",
            reason: "the initial model lacks a norm tensor".into(),
        })?;
        Ok(Self {
            inner,
            layout,
            norms: names.iter().cloned().collect(),
            names,
            initial,
            own: Mutex::new(BTreeMap::new()),
        })
    }

    /// The norm tensors' names, in the model's order.
    pub fn norm_names(&self) -> &[String] {
        &self.names
    }

    fn store(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<usize, Params>>> {
        self.own.lock().map_err(|_| FedError::MethodState {
            method: self.inner.name(),
            reason: "a client panicked while storing its normalisation tensors",
        })
    }

    /// `params` as a whole model of the layout, its norm tensors taken from `norms` where it
    /// has them, else from `params`, else the initial model's; tensors that are not the
    /// model's follow in their order. `None` when `params` lacks one of the model's other
    /// tensors (it is no model, e.g. an instruction to start from the client's own init).
    fn with_norms(&self, params: &Params, norms: Option<&Params>) -> Result<Option<Params>> {
        let mut out = Params::new();
        for s in &self.layout {
            let t = if self.norms.contains(&s.name) {
                norms
                    .and_then(|n| n.get(&s.name))
                    .or_else(|| params.get(&s.name))
                    .or_else(|| self.initial.get(&s.name))
            } else {
                params.get(&s.name)
            };
            let Some(t) = t else { return Ok(None) };
            out.push(s.name.clone(), t.shape.clone(), t.data.clone())?;
        }
        for (name, t) in params.iter() {
            if out.get(name).is_none() {
                out.push(name, t.shape.clone(), t.data.clone())?;
            }
        }
        Ok(Some(out))
    }

    /// The aggregate with the global model's norm tensors kept as they were.
    fn keep_norms(&self, global: &Params, next: Aggregate) -> Aggregate {
        keep_norms(&self.names, global, next)
    }
}

/// The tensors `names` of `params`, in that order; `None` when one is missing.
fn pick(params: &Params, names: &[String]) -> Option<Params> {
    let mut out = Params::new();
    for n in names {
        let t = params.get(n)?;
        out.push(n.clone(), t.shape.clone(), t.data.clone()).ok()?;
    }
    Some(out)
}

/// `next` with the tensors `names` set back to `global`'s.
fn keep_norms(names: &[String], global: &Params, next: Aggregate) -> Aggregate {
    match next {
        Aggregate::Replace(mut next) => {
            for n in names {
                if let (Some(g), Some(t)) = (global.get(n), next.get_mut(n))
                    && g.shape == t.shape
                {
                    t.data.clone_from(&g.data);
                }
            }
            Aggregate::Replace(next)
        }
        Aggregate::Keep => Aggregate::Keep,
    }
}

/// The wrapped method's fold, with the global model's norm tensors kept.
struct KeepNorms {
    inner: Box<dyn Fold>,
    names: Vec<String>,
}

impl Fold for KeepNorms {
    fn add(&mut self, reply: Reply) -> Result<()> {
        self.inner.add(reply)
    }

    fn finish(self: Box<Self>, round: usize, global: &Params) -> Result<Aggregate> {
        let next = self.inner.finish(round, global)?;
        Ok(keep_norms(&self.names, global, next))
    }
}

impl Method for LocalNorm {
    crate::method::wraps_inner!();

    /// The wrapped method's instruction without the norm tensors.
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        let mut record = self.inner.instruct(round, client, global)?;
        for n in &self.names {
            record.params.remove(n);
        }
        Ok(record)
    }

    /// The wrapped method's procedure from the received model with the client's own norms;
    /// keeps the trained norms and replies without them (with them when the instruction
    /// carried every norm tensor: a whole model from a stock Flower strategy).
    fn fit(&self, mut instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let whole = self
            .names
            .iter()
            .all(|n| instruction.params.get(n).is_some());
        let own = self.store()?.get(&ctx.id).cloned();
        if let Some(start) = self.with_norms(&instruction.params, own.as_ref())? {
            instruction.params = start;
        }
        let mut reply = self.inner.fit(instruction, ctx)?;
        if let Some(trained) = pick(&reply.params, &self.names) {
            if trained.check_finite().is_err() {
                return Err(FedError::BadReply {
                    client: ctx.id,
                    reason: "its normalisation tensors are not finite after training (training \
                             diverged): lower train.lr"
                        .into(),
                });
            }
            self.store()?.insert(ctx.id, trained);
        }
        if !whole {
            for n in &self.names {
                reply.params.remove(n);
            }
        }
        Ok(reply)
    }

    /// The reply with the global model's norm tensors in place of whatever it holds there.
    fn restore_reply(&self, global: &Params, mut reply: Record) -> Result<Record> {
        if let Some(params) = self.with_norms(&reply.params, Some(global))? {
            reply.params = params;
        }
        self.inner.restore_reply(global, reply)
    }

    /// The global model (or an upload) with the client's own norm tensors; `None` for a
    /// client that has none yet when `model` holds every norm tensor.
    fn client_model(&self, client: usize, model: &Params) -> Result<Option<Params>> {
        let own = self.store()?.get(&client).cloned();
        if own.is_none() && self.names.iter().all(|n| model.get(n).is_some()) {
            return Ok(None);
        }
        self.with_norms(model, own.as_ref())
    }

    /// The client's own norm tensors, after its last round.
    fn client_state(&self, client: usize) -> Result<Option<Params>> {
        Ok(self.store()?.get(&client).cloned())
    }

    /// Sets (or, with `None`, forgets) the client's own norm tensors: every norm tensor of
    /// the model once, with its shape, and finite.
    fn set_client_state(&self, client: usize, state: Option<Params>) -> Result<()> {
        let norms = match state {
            Some(norms) => {
                let bad = |e: fedfuse_core::CoreError| FedError::ClientState {
                    client,
                    reason: format!("its normalisation tensors do not fit the model: {e}"),
                };
                // In the model's order, whatever order the store kept them in.
                let norms = norms.arranged(&self.initial.layout()).map_err(bad)?;
                norms.check_finite().map_err(bad)?;
                Some(norms)
            }
            None => None,
        };
        let mut store = self.store()?;
        match norms {
            Some(norms) => store.insert(client, norms),
            None => store.remove(&client),
        };
        Ok(())
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let next = self.inner.aggregate(round, global, replies)?;
        Ok(self.keep_norms(global, next))
    }

    fn aggregate_no_replies(&mut self, round: usize, global: &Params) -> Result<Aggregate> {
        let next = self.inner.aggregate_no_replies(round, global)?;
        Ok(self.keep_norms(global, next))
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        let inner = self.inner.fold()?;
        Some(Box::new(KeepNorms {
            inner,
            names: self.names.clone(),
        }))
    }

    /// Every client's norm tensors (`client.{id}.{tensor}`) and the wrapped method's state.
    fn save_state(&self) -> Option<Result<Record>> {
        let mut own = Record::default();
        let saved = self.store().and_then(|store| {
            for (client, norms) in store.iter() {
                for (name, t) in norms.iter() {
                    own.params.push(
                        format!("{CLIENT}{client}.{name}"),
                        t.shape.clone(),
                        t.data.clone(),
                    )?;
                }
            }
            Ok(())
        });
        if let Err(e) = saved {
            return Some(Err(e));
        }
        nest_state(own, self.inner.as_ref())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let (own, inner) = unnest_state(state)?;
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("local norms: {why}"),
        };
        let mut clients: BTreeMap<usize, Params> = BTreeMap::new();
        for (name, t) in own.params.iter() {
            let (client, tensor) = name
                .strip_prefix(CLIENT)
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(c, n)| Some((c.parse::<usize>().ok()?, n)))
                .filter(|(_, n)| self.norms.contains(*n))
                .ok_or_else(|| bad(format!("unexpected tensor `{name}`")))?;
            clients
                .entry(client)
                .or_default()
                .push(tensor, t.shape.clone(), t.data.clone())?;
        }
        let layout = self.initial.layout();
        for (client, norms) in &clients {
            norms
                .check_layout(&layout)
                .map_err(|e| bad(format!("client {client}: {e}")))?;
            norms
                .check_finite()
                .map_err(|e| bad(format!("client {client}: {e}")))?;
        }
        *self.own.get_mut().map_err(|_| FedError::MethodState {
            method: self.inner.name(),
            reason: "a client panicked while storing its normalisation tensors",
        })? = clients;
        self.inner.load_state(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FedAvg;
    use fedfuse_core::LayerSpec;

    /// linear 3 -> 2 without bias, batch norm, linear 2 -> 2.
    fn spec() -> ModelSpec {
        ModelSpec::sequential(
            &[3],
            vec![
                LayerSpec::Linear {
                    out: 2,
                    bias: false,
                },
                LayerSpec::BatchNorm1d {
                    eps: 1e-5,
                    momentum: 0.1,
                },
                LayerSpec::linear(2),
            ],
        )
    }

    fn model(value: f32) -> Params {
        let mut p = Params::zeros(&spec().param_shapes());
        for (_, t) in p.iter_mut() {
            t.data.iter_mut().for_each(|x| *x = value);
        }
        p
    }

    fn wrapped() -> LocalNorm {
        LocalNorm::new(Box::new(FedAvg), &spec(), &model(0.0)).unwrap()
    }

    #[test]
    fn instructions_and_restored_replies_have_no_and_the_global_norms() {
        let m = wrapped();
        assert_eq!(m.norm_names().len(), 5);
        let global = model(1.0);
        let sent = m.instruct(1, 0, &global).unwrap();
        let names: Vec<&str> = sent.params.iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["0.weight", "2.weight", "2.bias"]);
        // A reply of the same stripped form gets the global's norms back, in the layout's
        // order; norms a client sent anyway are replaced by the global's.
        let mut reply = Record::from_params(model(7.0)).with_num_examples(3);
        reply.params.remove("1.running_mean");
        let restored = m.restore_reply(&global, reply).unwrap();
        restored.params.check_layout(&global.layout()).unwrap();
        assert_eq!(restored.num_examples, 3);
        assert_eq!(
            restored.params.get("1.running_mean").unwrap().data,
            [1.0; 2]
        );
        assert_eq!(restored.params.get("1.weight").unwrap().data, [1.0; 2]);
        assert_eq!(restored.params.get("0.weight").unwrap().data, [7.0; 6]);
    }

    #[test]
    fn aggregates_keep_the_global_norms() {
        let mut m = wrapped();
        let global = model(1.0);
        let reply = |v: f32| Reply {
            client: 0,
            record: Record::from_params(model(v)).with_num_examples(1),
        };
        let Aggregate::Replace(next) = m.aggregate(1, &global, &[reply(3.0), reply(5.0)]).unwrap()
        else {
            panic!("FedAvg replaces the model");
        };
        assert_eq!(next.get("0.weight").unwrap().data, [4.0; 6]);
        assert_eq!(next.get("1.running_var").unwrap().data, [1.0; 2]);
        let mut fold = m.fold().unwrap();
        fold.add(reply(3.0)).unwrap();
        let Aggregate::Replace(folded) = fold.finish(1, &global).unwrap() else {
            panic!("FedAvg replaces the model");
        };
        assert_eq!(folded.get("2.bias").unwrap().data, [3.0; 2]);
        assert_eq!(folded.get("1.bias").unwrap().data, [1.0; 2]);
    }

    #[test]
    fn clients_norms_survive_a_save_and_load() {
        let m = wrapped();
        let mut own = model(2.0);
        own.get_mut("1.running_mean").unwrap().data = vec![0.5, -0.5];
        m.store().unwrap().insert(3, pick(&own, &m.names).unwrap());
        let personal = m.client_model(3, &model(9.0)).unwrap().unwrap();
        assert_eq!(personal.get("1.running_mean").unwrap().data, [0.5, -0.5]);
        assert_eq!(personal.get("0.weight").unwrap().data, [9.0; 6]);
        // A client that never trained runs the global model as it is.
        assert!(m.client_model(1, &model(9.0)).unwrap().is_none());

        let state = m.save_state().unwrap().unwrap();
        let mut again = wrapped();
        again.load_state(state.clone()).unwrap();
        assert_eq!(again.client_model(3, &model(9.0)).unwrap(), Some(personal));
        // A tensor that is no client's norm is refused by name.
        let mut wrong = state;
        wrong
            .params
            .push("client.3.0.weight", vec![1], vec![0.0])
            .unwrap();
        let e = wrapped().load_state(wrong).unwrap_err().to_string();
        assert!(e.contains("client.3.0.weight"), "{e}");
    }

    #[test]
    fn a_clients_norms_leave_and_come_back_as_its_state() {
        let m = wrapped();
        assert_eq!(m.client_state(2).unwrap(), None);
        let mut own = pick(&model(2.0), &m.names).unwrap();
        own.get_mut("1.running_var").unwrap().data = vec![3.0, 4.0];
        m.set_client_state(2, Some(own.clone())).unwrap();
        assert_eq!(m.client_state(2).unwrap(), Some(own.clone()));
        let personal = m.client_model(2, &model(9.0)).unwrap().unwrap();
        assert_eq!(personal.get("1.running_var").unwrap().data, [3.0, 4.0]);
        // A fresh wrapper (a new process) given the state runs the same model.
        let again = wrapped();
        again
            .set_client_state(2, m.client_state(2).unwrap())
            .unwrap();
        assert_eq!(again.client_model(2, &model(9.0)).unwrap(), Some(personal));
        // `None` forgets them: the client starts from the initial norms again.
        again.set_client_state(2, None).unwrap();
        assert_eq!(again.client_state(2).unwrap(), None);

        // State that is not this model's norms is refused, naming the tensor.
        let refused = |state: Params| {
            let e = m.set_client_state(2, Some(state)).unwrap_err().to_string();
            assert!(e.starts_with("client 2's stored state:"), "{e}");
            e
        };
        let mut wrong = own.clone();
        wrong.get_mut("1.weight").unwrap().shape = vec![1, 2];
        let e = refused(wrong);
        assert!(e.contains("`1.weight`") && e.contains("[1, 2]"), "{e}");
        let mut extra = own.clone();
        extra.push("0.weight", vec![2, 3], vec![0.0; 6]).unwrap();
        assert!(refused(extra).contains("0.weight"));
        let mut nan = own;
        nan.get_mut("1.bias").unwrap().data[0] = f32::NAN;
        refused(nan);
        // The refused states left the stored one as it was.
        assert_eq!(
            m.client_state(2)
                .unwrap()
                .unwrap()
                .get("1.running_var")
                .unwrap()
                .data,
            [3.0, 4.0]
        );
    }

    #[test]
    fn a_model_without_norms_is_refused() {
        let mlp = ModelSpec::mlp(3, &[2], 2);
        let init = Params::zeros(&mlp.param_shapes());
        let e = LocalNorm::new(Box::new(FedAvg), &mlp, &init)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("model.local_norm"), "{e}");
    }
}
