//! FedSparse (fedsparse-em section 3, Appendix I Algorithms 1 and 2): a spike-and-slab prior
//! with one gate per group (hidden unit or conv filter), learned thresholds, and sparse
//! traffic both ways.
//!
//! The client half is [`Trainer::fit_sparse`](fedfuse_train::Trainer::fit_sparse), the server
//! half [`FedSparseServer`]; this module carries what travels between them:
//!
//! - down: the pruned server weights `w` (a sparse record: pruned groups cost nothing) and the
//!   thresholds `v` as the tensor [`V_TENSOR`], one value per group;
//! - up: `w_s * z_s` (sparse: dropped groups cost nothing), the gates `z_s` as the tensor
//!   [`Z_TENSOR`] (0/1) and the client's gate probabilities `pi_s` as [`PI_TENSOR`] (for the
//!   total variation of Appendix C; one value per group, under 1% of a LeNet-5 upload).
//!
//! Both halves use one [`GroupLayout`] (every layer but the output layer, see
//! [`GroupLayout::of_model`]), so they agree on the groups and their order by construction;
//! every per-group vector travels flat, in that order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use fedfuse_core::{ConfigValue, GroupLayout, ModelSpec, ParamShape, Params, Record};
use fedfuse_fuse::{
    FedSparseConfig, FedSparseServer, ServerOptimizer, SparseReply, total_variation,
};
use fedfuse_train::SparseConfig;
pub use fedfuse_train::SparsityPreset;
use serde::{Deserialize, Serialize};

use super::{BuildContext, in_method};
use crate::method::{LOCAL_ACCURACY, SERVER_ROUND};
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result};

/// FedSparse's settings (`[method] name = "fedsparse"`): clients upload one gate sample and
/// only the kept units, the server prunes units whose inclusion probability falls below
/// `prune_eps` and sends only the rest. Defaults are the paper's Appendix A.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedSparseSettings {
    /// `low`, `mid` or `high` sparsity: `lambda0` = 5e-7, 5e-6 or 5e-5.
    pub preset: SparsityPreset,
    /// L0 strength per value of a kept group; overrides `preset`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lambda0: Option<f64>,
    /// Gate temperature `T` of `sigmoid((||w_g|| - softplus(v_g)) / T)`.
    pub temperature: f64,
    /// The server prunes groups whose inclusion probability is below this.
    pub prune_eps: f64,
    /// Learning rate of the server's Adam on the weights (Kingma & Ba's default).
    pub server_lr: f64,
    /// Learning rate of the server's Adamax on the thresholds.
    pub threshold_server_lr: f64,
    /// Learning rate of the clients' Adamax on their thresholds.
    pub threshold_lr: f64,
    /// Factor on the cross-entropy between client and server gate probabilities.
    pub prior_scale: f64,
    /// Precision of the drift term towards the server weights (paper: 0).
    pub drift: f64,
    /// Inclusion probability of every group at the start (0.99: a dense start).
    pub initial_theta: f64,
}

impl Default for FedSparseSettings {
    fn default() -> Self {
        let client = SparseConfig::default();
        Self {
            preset: SparsityPreset::default(),
            lambda0: None,
            temperature: client.temperature,
            prune_eps: FedSparseConfig::default().prune_eps,
            server_lr: 1e-3,
            threshold_server_lr: 1e-2,
            threshold_lr: client.threshold_lr,
            prior_scale: client.prior_scale,
            drift: client.drift,
            initial_theta: client.initial_theta,
        }
    }
}

impl FedSparseSettings {
    /// The clients' settings and the server's: Kingma-Adam on the weights, Adamax on the
    /// thresholds.
    fn configs(&self) -> (SparseConfig, FedSparseConfig) {
        let client = SparseConfig {
            lambda0: self.lambda0.unwrap_or(self.preset.lambda0()),
            temperature: self.temperature,
            drift: self.drift,
            threshold_lr: self.threshold_lr,
            prior_scale: self.prior_scale,
            initial_theta: self.initial_theta,
        };
        let server = FedSparseConfig {
            temperature: self.temperature,
            prune_eps: self.prune_eps,
            weights_opt: ServerOptimizer::KingmaAdam {
                lr: self.server_lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
            thresholds_opt: ServerOptimizer::Adamax {
                lr: self.threshold_server_lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        };
        (client, server)
    }

    /// Checks every setting, the clients' and the server's.
    pub fn check(&self) -> Result<()> {
        for (field, lr) in [
            ("server_lr", self.server_lr),
            ("threshold_server_lr", self.threshold_server_lr),
        ] {
            if !(lr.is_finite() && lr > 0.0) {
                return Err(FedError::MethodSetting {
                    field,
                    reason: format!("{lr} is not a positive number"),
                });
            }
        }
        let (client, server) = self.configs();
        client.check().map_err(in_method)?;
        server.check().map_err(in_method)?;
        Ok(())
    }

    /// FedSparse for `ctx.spec` (settings checked by [`FedSparseSettings::check`]).
    pub fn build(&self, ctx: &BuildContext) -> Result<FedSparse> {
        let (client, server) = self.configs();
        FedSparse::new(
            client,
            server,
            ctx.spec("FedSparse needs the model's architecture")?,
        )
    }
}

/// Name of the thresholds tensor in an instruction.
pub const V_TENSOR: &str = "fedsparse.v";
/// Name of the gates tensor in a reply.
pub const Z_TENSOR: &str = "fedsparse.z";
/// Name of the gate-probabilities tensor in a reply.
pub const PI_TENSOR: &str = "fedsparse.pi";

/// FedSparse: client and server settings, and the server's state across rounds.
pub struct FedSparse {
    client: SparseConfig,
    server_config: FedSparseConfig,
    spec: ModelSpec,
    layout: GroupLayout,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// Created from the first global model the method sees.
    server: Option<FedSparseServer>,
    /// `theta` of the open round (what the clients were sent), for the total variation.
    theta: Vec<f64>,
    figures: BTreeMap<String, f64>,
}

impl FedSparse {
    /// FedSparse for `spec` with the client settings `client` and the server settings
    /// `server` (both checked: [`FedSparseSettings::check`]).
    pub fn new(client: SparseConfig, server: FedSparseConfig, spec: &ModelSpec) -> Result<Self> {
        if (client.temperature - server.temperature).abs() > 0.0 {
            return Err(FedError::MethodSetting {
                field: "temperature",
                reason: "client and server must use the same gate temperature".into(),
            });
        }
        let layout = GroupLayout::of_model(spec);
        if layout.layers().is_empty() {
            return Err(FedError::InvalidSetting {
                field: "model",
                reason: "FedSparse gates hidden units; the model has no hidden layer".into(),
            });
        }
        Ok(Self {
            client,
            server_config: server,
            spec: spec.clone(),
            layout,
            state: Arc::new(Mutex::new(State::default())),
        })
    }

    /// Groups (gates) of the model.
    pub fn num_groups(&self) -> usize {
        self.layout.num_groups()
    }

    /// The server state, created from `global` (thresholds giving every group
    /// `initial_theta`) and with its first round begun, on first use.
    fn server<'a>(&self, state: &'a mut State, global: &Params) -> Result<&'a FedSparseServer> {
        if state.server.is_none() {
            let mut server = FedSparseServer::with_initial_theta(
                self.server_config,
                self.layout.clone(),
                global.clone(),
                self.client.initial_theta,
            )?;
            let start = server.begin_round()?;
            state.theta = start.theta;
            state.server = Some(server);
        }
        state.server.as_ref().ok_or(FedError::MethodState {
            method: "fedsparse",
            reason: "the server could not be created",
        })
    }
}

fn lock(state: &Mutex<State>) -> Result<MutexGuard<'_, State>> {
    state.lock().map_err(|_| FedError::MethodState {
        method: "fedsparse",
        reason: "poisoned by an earlier panic",
    })
}

/// Takes a one-axis tensor of `groups` values out of `params`.
fn take_vector(params: &mut Params, name: &str, groups: usize) -> Result<Vec<f32>> {
    let t = params
        .remove(name)
        .ok_or_else(|| fedfuse_core::CoreError::MissingTensor(name.to_string()))?;
    if t.shape != [groups] {
        return Err(fedfuse_core::CoreError::GroupMismatch(format!(
            "`{name}` has shape {:?}; the model has {groups} groups",
            t.shape
        ))
        .into());
    }
    Ok(t.data)
}

impl Method for FedSparse {
    fn name(&self) -> &'static str {
        "fedsparse"
    }

    fn save_state(&self) -> Option<Result<Record>> {
        Some(lock(&self.state).and_then(|state| match &state.server {
            Some(server) => Ok(server.save()?),
            None => Ok(Record::default()),
        }))
    }

    fn load_state(&mut self, saved: Record) -> Result<()> {
        let mut state = lock(&self.state)?;
        if saved.params.is_empty() {
            *state = State::default();
            return Ok(());
        }
        let server = FedSparseServer::restore(self.server_config, self.layout.clone(), &saved)?;
        state.theta = server.theta_of_open_round().to_vec();
        state.server = Some(server);
        state.figures.clear();
        Ok(())
    }

    /// The pruned server weights and the thresholds `v`, sparse on the wire.
    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let mut state = lock(&self.state)?;
        let server = self.server(&mut state, global)?;
        let mut params = server.weights().clone();
        params.push(
            V_TENSOR,
            vec![self.num_groups()],
            server.thresholds().to_vec(),
        )?;
        Ok(Record::from_params(params)
            .with_sparse(true)
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    /// Algorithm 2: local training with hard-concrete gates from the server's `w` and `v`;
    /// uploads `w_s * z_s`, `z_s` and `pi_s`.
    fn fit(&self, mut instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let v = take_vector(&mut instruction.params, V_TENSOR, self.num_groups())?;
        let start = instruction.params;
        start.check_layout(&self.spec.param_shapes())?;
        let fit = ctx.trainer.fit_sparse(
            &start,
            &v,
            &ctx.data.train,
            ctx.train,
            &self.client,
            ctx.seed,
        )?;
        let (on, all) = fit.kept();
        let own_accuracy = if ctx.data.test.is_empty() {
            None
        } else {
            Some(ctx.trainer.evaluate(&fit.params, &ctx.data.test)?.accuracy)
        };
        let mut params = fit.params;
        let z: Vec<f32> = fit.z.iter().map(|&z| f32::from(u8::from(z))).collect();
        let pi = fit.pi;
        params.push(Z_TENSOR, vec![z.len()], z)?;
        params.push(PI_TENSOR, vec![pi.len()], pi)?;
        let mut reply = Record::from_params(params)
            .with_num_examples(fit.examples as u64)
            .with_sparse(true);
        reply.metrics.insert("train_loss".into(), fit.loss);
        reply
            .metrics
            .insert("groups_on".into(), on as f64 / all.max(1) as f64);
        if let Some(acc) = own_accuracy {
            reply.metrics.insert(LOCAL_ACCURACY.into(), acc);
        }
        Ok(reply)
    }

    fn check_reply(&self, global: &Params, reply: &Record) -> Result<()> {
        let g = self.num_groups();
        let mut layout = global.layout();
        for name in [Z_TENSOR, PI_TENSOR] {
            layout.push(ParamShape {
                name: name.into(),
                shape: vec![g],
            });
        }
        reply.params.check_layout(&layout)?;
        reply.params.check_finite()?;
        let bad = |what: &str| FedError::InvalidReply {
            method: "fedsparse",
            reason: format!("`{what}` holds values outside its range"),
        };
        let z = reply.params.require(Z_TENSOR)?;
        if z.data.iter().any(|&x| x != 0.0 && x != 1.0) {
            return Err(bad(Z_TENSOR));
        }
        let pi = reply.params.require(PI_TENSOR)?;
        if pi.data.iter().any(|x| !(0.0..=1.0).contains(x)) {
            return Err(bad(PI_TENSOR));
        }
        Ok(())
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let mut fold = self.new_fold();
        for r in replies {
            fold.add(r.clone())?;
        }
        Box::new(fold).finish(round, global)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        Some(Box::new(self.new_fold()))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        lock(&self.state)
            .map(|s| s.figures.clone())
            .unwrap_or_default()
    }
}

impl FedSparse {
    fn new_fold(&self) -> GradientFold {
        GradientFold {
            state: Arc::clone(&self.state),
            groups: self.num_groups(),
            pis: Vec::new(),
            groups_on: 0.0,
        }
    }
}

/// Adds each reply to the server's open round as it arrives (Algorithm 1's sums).
struct GradientFold {
    state: Arc<Mutex<State>>,
    groups: usize,
    pis: Vec<Vec<f64>>,
    groups_on: f64,
}

impl Fold for GradientFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        let Reply { client, record } = reply;
        let mut params = record.params;
        let z = take_vector(&mut params, Z_TENSOR, self.groups)?;
        let pi = take_vector(&mut params, PI_TENSOR, self.groups)?;
        let z: Vec<bool> = z.iter().map(|&x| x != 0.0).collect();
        self.groups_on += z.iter().filter(|&&z| z).count() as f64 / self.groups.max(1) as f64;
        self.pis.push(pi.iter().map(|&p| f64::from(p)).collect());
        let mut state = lock(&self.state)?;
        let server = state.server.as_mut().ok_or(FedError::BadReply {
            client,
            reason: "a FedSparse reply arrived before any instruction was sent".into(),
        })?;
        server.add_reply(SparseReply {
            z: &z,
            w_hat: &params,
        })?;
        Ok(())
    }

    fn finish(self: Box<Self>, _round: usize, _global: &Params) -> Result<Aggregate> {
        let mut guard = lock(&self.state)?;
        let state = &mut *guard;
        let server = state.server.as_mut().ok_or(FedError::MethodState {
            method: "fedsparse",
            reason: "asked to finish a round it never began",
        })?;
        let tv = {
            let pis: Vec<&[f64]> = self.pis.iter().map(Vec::as_slice).collect();
            total_variation(&pis, &state.theta)?
        };
        server.finish_round()?;
        // The next round starts here: prune, so that the global model evaluated now is the
        // one the clients will receive.
        let start = server.begin_round()?;
        let next = server.weights().clone();
        let groups = start.kept.len().max(1) as f64;
        let kept = start.kept.iter().filter(|&&k| k).count() as f64;
        let zero = next
            .iter()
            .flat_map(|(_, t)| &t.data)
            .filter(|&&x| x == 0.0)
            .count() as f64;
        let replies = self.pis.len().max(1) as f64;
        state.figures = BTreeMap::from([
            ("groups_pruned".to_string(), 1.0 - kept / groups),
            (
                "weights_zero".to_string(),
                zero / next.num_values().max(1) as f64,
            ),
            ("client_groups_on".to_string(), self.groups_on / replies),
            (
                "theta_mean".to_string(),
                start.theta.iter().sum::<f64>() / groups,
            ),
            ("tv_mean".to_string(), tv.mean),
            ("tv_max".to_string(), tv.max),
        ]);
        state.theta = start.theta;
        Ok(Aggregate::Replace(next))
    }
}
