//! FedMA (Wang et al. 2020, "Federated Learning with Matched Averaging"): layer-wise matching
//! with PFNM's matcher, and "FedMA with communication".
//!
//! A pass takes `M + 1` federation rounds for a network with `M` matched layers (every
//! convolution and linear layer below the output layer):
//!
//! - stage 0: each client trains its whole model (in the first pass from its own
//!   initialisation, later from its part of the last global model: the global units it was
//!   matched to, so its widths stay the original ones) and sends matched layer 0;
//! - stage `s` in `1..M`: the server has matched layer `s - 1` ([`pfnm_match_layer`]) and
//!   sends it down with the client's assignment; the client puts it in, lays the layer above
//!   over the fused units ([`spread_readers`]), retrains the layers above with everything
//!   matched so far frozen, and sends matched layer `s` (the top one with its weights into
//!   the classes, which its matching reads);
//! - stage `M`: after the same step for the top matched layer, the client sends the output
//!   layer and every buffer (batch norms' running statistics and counters) and every tensor no
//!   matched layer owns; the server averages them (the output rows weighted by each client's
//!   count of that class, the rest by examples) and the global model is complete.
//!
//! Between the passes' ends the global model stays the last complete one (the initial model
//! during the first pass). Each client keeps its model within a pass: in the simulator and on
//! a Rust node this method holds it, a Python ClientApp stores it in its node's
//! `Context.state` ([`Method::client_state`]). Everything runs on the model's layer list
//! ([`ModelSpec::as_sequential`]), so the global model's tensors carry the list's names.

use std::collections::BTreeMap;
use std::sync::Mutex;

use fedfuse_core::layers::{self, LayerSpec, TensorRole, UnitUses};
use fedfuse_core::{ConfigValue, ModelSpec, ParamShape, Params, Record, Tensor};
use fedfuse_fuse::{PfnmConfig, RngOrder, pfnm_match_layer, spread_readers};
use fedfuse_train::{Init, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::list_view::ListView;
use super::pfnm::{put_class_counts, replies_class_counts};
use super::{BuildContext, in_method};
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

/// Config key of an instruction's stage within its pass.
const STAGE: &str = "fedma_stage";
/// Config key of the client's assignment to the fused units of the layer sent (JSON).
const ASSIGN: &str = "fedma_assign";
/// Prefix of the server's fused layers in its saved state.
const BUILT: &str = "built.";
/// Prefix of a client's model in the saved state: `client.{id}.{tensor}`.
const CLIENT: &str = "client.";

/// `[method] name = "fedma"`: PFNM's matching settings (variances, as for `pfnm`) and the
/// number of passes ("FedMA with communication" when more than one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedMaSettings {
    /// Variance of client units around their global unit.
    pub sigma: f64,
    /// Prior variance of global units.
    pub sigma0: f64,
    /// Beta-process mass (larger opens new global units more readily).
    pub gamma: f64,
    /// Refinement passes per layer.
    pub iters: usize,
    /// Soft cap on each fused layer's width.
    pub max_global: usize,
    /// FedMA passes (its "communication rounds"), each `M + 1` federation rounds for `M`
    /// matched layers; the run stops after the last.
    pub rounds: usize,
}

impl Default for FedMaSettings {
    fn default() -> Self {
        let c = PfnmConfig::default();
        Self {
            sigma: c.sigma,
            sigma0: c.sigma0,
            gamma: c.gamma,
            iters: c.iters,
            max_global: c.max_global,
            rounds: 1,
        }
    }
}

impl FedMaSettings {
    fn config(&self) -> PfnmConfig {
        PfnmConfig {
            sigma: self.sigma,
            sigma0: self.sigma0,
            gamma: self.gamma,
            iters: self.iters,
            max_global: self.max_global,
            order: fedfuse_fuse::MatchOrder::BottomUp,
            ..PfnmConfig::default()
        }
    }

    /// Checks the settings alone.
    pub fn check(&self) -> Result<()> {
        if self.rounds == 0 {
            return Err(FedError::MethodSetting {
                field: "rounds",
                reason: "give at least one FedMA pass".into(),
            });
        }
        self.config().check().map_err(in_method)
    }

    /// FedMA for `ctx`'s architecture (settings checked by [`Self::check`]): refused, naming
    /// the layer, when its layer list cannot be matched.
    pub fn build(&self, ctx: &BuildContext) -> Result<FedMa> {
        let spec = ctx.spec("FedMA needs the clients' architecture")?;
        FedMa::new(self, spec, ctx.init, ctx.seed)
    }

    /// Federation rounds one pass takes on `spec`: its matched layers plus one.
    pub fn rounds_per_pass(spec: &ModelSpec) -> Result<usize> {
        Ok(ListView::of(spec)?.matched + 1)
    }
}

/// Where a run of FedMA stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Progress {
    /// Passes completed.
    passes: usize,
    /// Stage of the next round within the current pass.
    stage: usize,
    /// The fused width of each matched layer of the current pass so far.
    widths: Vec<usize>,
    /// Client -> matched layer -> local unit -> fused unit, in the current pass.
    current: BTreeMap<usize, Vec<Vec<usize>>>,
    /// The same for the last completed pass (each client's part of the global model).
    last: BTreeMap<usize, Vec<Vec<usize>>>,
}

/// FedMA (see the module docs).
pub struct FedMa {
    settings: FedMaSettings,
    view: ListView,
    init: Init,
    seed: u64,
    progress: Progress,
    /// The fused layers' own tensors of the current pass, list names.
    built: Params,
    /// Each client's model within the pass (list names).
    models: Mutex<BTreeMap<usize, Params>>,
    report: BTreeMap<String, f64>,
}

impl FedMa {
    fn new(settings: &FedMaSettings, spec: &ModelSpec, init: Init, seed: u64) -> Result<Self> {
        Ok(Self {
            settings: settings.clone(),
            view: ListView::of(spec)?,
            init,
            seed,
            progress: Progress::default(),
            built: Params::new(),
            models: Mutex::new(BTreeMap::new()),
            report: BTreeMap::new(),
        })
    }

    fn store(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<usize, Params>>> {
        self.models.lock().map_err(|_| FedError::MethodState {
            method: "fedma",
            reason: "a client panicked while storing its model",
        })
    }

    /// The own tensors of matched layer `g` (weight, bias, norm channels), by name.
    fn own_names(&self, uses: &[UnitUses], g: usize) -> Vec<String> {
        uses[g].own.iter().map(|u| u.tensor.clone()).collect()
    }

    /// What a client sends at `stage`.
    fn sent_names(&self, uses: &[UnitUses], layout: &[ParamShape], stage: usize) -> Vec<String> {
        if stage < self.view.matched {
            let mut names = self.own_names(uses, stage);
            if stage + 1 == self.view.matched {
                names.push(format!("{}.weight", self.view.output));
            }
            return names;
        }
        let owned: Vec<String> = (0..self.view.matched)
            .flat_map(|g| self.own_names(uses, g))
            .collect();
        layout
            .iter()
            .filter(|s| TensorRole::of(&s.name) != TensorRole::Param || !owned.contains(&s.name))
            .map(|s| s.name.clone())
            .collect()
    }

    /// The reply of `stage`: the tensors the server needs, the counts, the loss.
    fn reply(
        &self,
        model: &Params,
        stage: usize,
        ctx: &ClientContext<'_>,
        loss: f64,
    ) -> Result<Record> {
        let (layers, uses) = self.view.at_widths(model)?;
        let layout = self.view.layout(&layers)?;
        let mut out = Params::new();
        for name in self.sent_names(&uses, &layout, stage) {
            let t = model.require(&name)?;
            out.push(name, t.shape.clone(), t.data.clone())?;
        }
        let mut reply = Record::from_params(out).with_num_examples(ctx.data.train.len() as u64);
        reply.metrics.insert("train_loss".into(), loss);
        put_class_counts(&mut reply, &ctx.data.train.class_counts());
        Ok(reply)
    }

    /// Each replying client's whole model as matching reads it at `stage < M`: the fused
    /// layers below, its reply's tensors, zeros for what it did not send (the matcher reads
    /// none of them).
    fn padded(&self, reply: &Reply, stage: usize) -> Result<Params> {
        let bad = |reason: String| FedError::BadReply {
            client: reply.client,
            reason,
        };
        let mut layers = self.view.layers.clone();
        let (_, uses) = self.view.at_widths(&self.built)?;
        for (g, &w) in self.progress.widths.iter().enumerate().take(stage) {
            set_out(&mut layers[uses[g].layer], w);
        }
        let weight = format!("{}.weight", uses[stage].layer);
        let rows = reply
            .record
            .params
            .get(&weight)
            .and_then(|t| t.shape.first().copied())
            .ok_or_else(|| bad(format!("FedMA stage {stage}: tensor `{weight}` is missing")))?;
        set_out(&mut layers[uses[stage].layer], rows);
        let layout = self.view.layout(&layers).map_err(|e| bad(e.to_string()))?;
        let uses = layers::unit_uses(&self.view.input, &layers).map_err(|e| bad(e.to_string()))?;
        let sent = self.sent_names(&uses, &layout, stage);
        let names: Vec<&str> = reply.record.params.iter().map(|(n, _)| n).collect();
        if names != sent.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(bad(format!(
                "FedMA stage {stage} expects tensors {sent:?}, got {names:?}"
            )));
        }
        let mut out = Params::new();
        for s in layout {
            let t = match reply.record.params.get(&s.name) {
                Some(t) => t.clone(),
                None => match self.built.get(&s.name) {
                    Some(t) => t.clone(),
                    None => Tensor::new(
                        &s.name,
                        s.shape.clone(),
                        vec![0.0; s.shape.iter().product()],
                    )?,
                },
            };
            if t.shape != s.shape {
                return Err(bad(format!(
                    "FedMA stage {stage}: tensor `{}` has shape {:?} where {:?} fits",
                    s.name, t.shape, s.shape
                )));
            }
            out.push(s.name, t.shape, t.data)?;
        }
        out.check_finite()?;
        Ok(out)
    }

    /// The last stage: output rows weighted by each client's count of their class, every
    /// other tensor sent by examples; with the fused layers, the global model.
    fn complete(&self, replies: &[Reply]) -> Result<Params> {
        let mut layers = self.view.layers.clone();
        let (_, uses) = self.view.at_widths(&self.built)?;
        for (g, &w) in self.progress.widths.iter().enumerate() {
            set_out(&mut layers[uses[g].layer], w);
        }
        let layout = self.view.layout(&layers)?;
        let (_, uses) = self.view.at_widths(&Params::zeros(&layout))?;
        let sent = self.sent_names(&uses, &layout, self.view.matched);
        let classes = self.layers_classes(&layout);
        let counts = replies_class_counts(replies, classes)?;
        let examples: Vec<f64> = replies
            .iter()
            .map(|r| r.record.num_examples as f64)
            .collect();
        let out_names = [
            format!("{}.weight", self.view.output),
            format!("{}.bias", self.view.output),
        ];
        let mut global = Params::new();
        for s in &layout {
            if !sent.contains(&s.name) {
                let t = self.built.require(&s.name)?;
                global.push(s.name.clone(), t.shape.clone(), t.data.clone())?;
                continue;
            }
            let mut sum = vec![0.0f64; s.shape.iter().product()];
            let rows = if out_names.contains(&s.name) {
                classes
            } else {
                1
            };
            let span = sum.len() / rows.max(1);
            // A class no client holds is weighted by examples, as every other tensor.
            let weight = |j: usize, k: usize| {
                let held = rows > 1 && counts.iter().any(|c| c[k] > 0.0);
                if held { counts[j][k] } else { examples[j] }
            };
            let mut total = vec![0.0f64; rows];
            for (j, r) in replies.iter().enumerate() {
                let t = r.record.params.require(&s.name)?;
                if t.shape != s.shape {
                    return Err(FedError::BadReply {
                        client: r.client,
                        reason: format!(
                            "FedMA's last stage: tensor `{}` has shape {:?} where {:?} fits",
                            s.name, t.shape, s.shape
                        ),
                    });
                }
                for (k, chunk) in sum.chunks_mut(span).enumerate() {
                    let w = weight(j, k);
                    total[k] += w;
                    for (acc, v) in chunk.iter_mut().zip(&t.data[k * span..]) {
                        *acc += w * f64::from(*v);
                    }
                }
            }
            let counter = TensorRole::of(&s.name) == TensorRole::Counter;
            let data = sum
                .chunks(span)
                .zip(&total)
                .flat_map(|(chunk, &w)| {
                    chunk.iter().map(move |v| {
                        let m = if w > 0.0 { v / w } else { 0.0 };
                        if counter { m.round() as f32 } else { m as f32 }
                    })
                })
                .collect();
            global.push(s.name.clone(), s.shape.clone(), data)?;
        }
        Ok(global)
    }

    fn layers_classes(&self, layout: &[ParamShape]) -> usize {
        let name = format!("{}.weight", self.view.output);
        layout
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.shape.first().copied())
            .unwrap_or(0)
    }

    fn advance(&mut self, stage_done: bool) {
        if !stage_done {
            // A stage nobody answered leaves the pass without a layer: start it again.
            self.progress.stage = 0;
            self.progress.widths.clear();
            self.progress.current.clear();
            self.built = Params::new();
            return;
        }
        if self.progress.stage == self.view.matched {
            self.progress.passes += 1;
            self.progress.stage = 0;
            self.progress.widths.clear();
            self.progress.last = std::mem::take(&mut self.progress.current);
            self.built = Params::new();
        } else {
            self.progress.stage += 1;
        }
    }
}

fn set_out(layer: &mut LayerSpec, width: usize) {
    if let LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } = layer {
        *out = width;
    }
}

fn bad_instruction(client: usize, reason: String) -> FedError {
    FedError::BadReply { client, reason }
}

impl Method for FedMa {
    fn name(&self) -> &'static str {
        "fedma"
    }

    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        let stage = self.progress.stage;
        let record = if stage == 0 {
            if self.progress.passes == 0 {
                Record::default()
            } else {
                Record::from_params(
                    self.view
                        .part(global, self.progress.last.get(&client).map(Vec::as_slice))?,
                )
            }
        } else {
            let (_, uses) = self.view.at_widths(&self.built)?;
            let mut layer = Params::new();
            for name in self.own_names(&uses, stage - 1) {
                let t = self.built.require(&name)?;
                layer.push(name, t.shape.clone(), t.data.clone())?;
            }
            let mut record = Record::from_params(layer);
            if let Some(a) = self
                .progress
                .current
                .get(&client)
                .and_then(|a| a.get(stage - 1))
            {
                let json = serde_json::to_string(a).map_err(|source| FedError::SaveState {
                    what: "a FedMA assignment",
                    source,
                })?;
                record = record.with_config(ASSIGN, ConfigValue::Str(json));
            }
            record
        };
        Ok(record
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
            .with_config(STAGE, ConfigValue::Int(stage as i64)))
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let stage = match instruction.config.get(STAGE) {
            Some(ConfigValue::Int(s)) if *s >= 0 && (*s as usize) <= self.view.matched => {
                *s as usize
            }
            _ => {
                return Err(bad_instruction(
                    ctx.id,
                    format!("a FedMA instruction without a valid `{STAGE}`"),
                ));
            }
        };
        if stage == 0 {
            let start = if instruction.params.is_empty() {
                self.view
                    .listed(&init_params(ctx.trainer.spec(), self.init, ctx.seed))?
            } else {
                instruction.params
            };
            let trainer = self.view.trainer_for(&start)?;
            let fitted = trainer.fit_with(&start, &ctx.data.train, ctx.train, None, ctx.seed)?;
            let reply = self.reply(&fitted.params, 0, ctx, fitted.loss)?;
            self.store()?.insert(ctx.id, fitted.params);
            return Ok(reply);
        }
        let assign: Vec<usize> = match instruction.config.get(ASSIGN) {
            Some(ConfigValue::Str(json)) => serde_json::from_str(json).map_err(|e| {
                bad_instruction(ctx.id, format!("FedMA assignment `{ASSIGN}`: {e}"))
            })?,
            _ => {
                return Err(bad_instruction(
                    ctx.id,
                    format!(
                        "it was not matched at layer {} of this FedMA pass (not sampled, or its \
                         reply was rejected); it takes part again from the next pass",
                        stage - 1
                    ),
                ));
            }
        };
        let Some(mut model) = self.store()?.get(&ctx.id).cloned() else {
            return Err(bad_instruction(
                ctx.id,
                "it holds no model of this FedMA pass (it missed its first stage)".into(),
            ));
        };
        let (_, uses) = self.view.at_widths(&model)?;
        let g = stage - 1;
        let width = instruction
            .params
            .get(&format!("{}.weight", uses[g].layer))
            .and_then(|t| t.shape.first().copied())
            .unwrap_or(0);
        spread_readers(&mut model, &uses[g], &assign, width)?;
        for (name, t) in instruction.params.iter() {
            let slot = model.get_mut(name).ok_or_else(|| {
                bad_instruction(
                    ctx.id,
                    format!("the fused layer holds `{name}`, no tensor of the model"),
                )
            })?;
            *slot = t.clone();
        }
        let (layers, uses) = self.view.at_widths(&model)?;
        model.check_layout(&self.view.layout(&layers)?)?;
        let frozen: Vec<String> = (0..stage)
            .flat_map(|h| self.own_names(&uses, h))
            .filter(|n| TensorRole::of(n) == TensorRole::Param)
            .collect();
        let trainer = self.view.trainer_for(&model)?;
        let fitted = trainer.fit_frozen(&model, &frozen, &ctx.data.train, ctx.train, ctx.seed)?;
        let reply = self.reply(&fitted.params, stage, ctx, fitted.loss)?;
        self.store()?.insert(ctx.id, fitted.params);
        Ok(reply)
    }

    /// Replies hold what their stage sends; their shapes are checked when the server lays
    /// them over the fused layers.
    fn check_reply(&self, _global: &Params, reply: &Record) -> Result<()> {
        reply.params.check_finite()?;
        Ok(())
    }

    fn aggregate(
        &mut self,
        round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let stage = self.progress.stage;
        self.report.clear();
        self.report
            .insert("pass".into(), (self.progress.passes + 1) as f64);
        self.report.insert("stage".into(), stage as f64);
        if stage == self.view.matched {
            let global = self.complete(replies)?;
            self.advance(true);
            return Ok(Aggregate::Replace(global));
        }
        let padded = replies
            .iter()
            .map(|r| self.padded(r, stage))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Params> = padded.iter().collect();
        let classes = self.layers_classes(&self.view.layout(&self.view.layers)?);
        let counts = replies_class_counts(replies, classes)?;
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let (layers, _) = self.view.at_widths(&padded[0])?;
        let m = pfnm_match_layer(
            &self.view.input,
            &layers,
            &refs,
            stage,
            Some(&counts),
            &self.settings.config(),
            &mut RngOrder(&mut rng),
        )?;
        for (name, t) in m.tensors.iter() {
            self.built.remove(name);
            self.built.push(name, t.shape.clone(), t.data.clone())?;
        }
        for (slot, reply) in replies.iter().enumerate() {
            let entry = self.progress.current.entry(reply.client).or_default();
            entry.truncate(stage);
            entry.resize(stage, Vec::new());
            entry.push(m.assignments[slot].clone());
        }
        self.progress.widths.truncate(stage);
        self.progress.widths.push(m.width);
        self.report.insert(format!("width.{stage}"), m.width as f64);
        self.advance(true);
        Ok(Aggregate::Keep)
    }

    fn aggregate_no_replies(&mut self, _round: usize, _global: &Params) -> Result<Aggregate> {
        self.advance(false);
        Ok(Aggregate::Keep)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.report.clone()
    }

    fn finished(&self) -> bool {
        self.progress.passes >= self.settings.rounds
    }

    fn client_state(&self, client: usize) -> Result<Option<Params>> {
        Ok(self.store()?.get(&client).cloned())
    }

    fn set_client_state(&self, client: usize, state: Option<Params>) -> Result<()> {
        let mut store = self.store()?;
        match state {
            Some(model) => {
                let bad = |e: String| FedError::ClientState {
                    client,
                    reason: format!("its FedMA model does not fit the layer list: {e}"),
                };
                let (layers, _) = self
                    .view
                    .at_widths(&model)
                    .map_err(|e| bad(e.to_string()))?;
                let layout = self.view.layout(&layers).map_err(|e| bad(e.to_string()))?;
                let model = model.arranged(&layout).map_err(|e| bad(e.to_string()))?;
                model.check_finite().map_err(|e| bad(e.to_string()))?;
                store.insert(client, model);
            }
            None => {
                store.remove(&client);
            }
        }
        Ok(())
    }

    /// Progress and assignments (JSON), the fused layers so far and every client's model.
    fn save_state(&self) -> Option<Result<Record>> {
        let save = || -> Result<Record> {
            let json =
                serde_json::to_string(&self.progress).map_err(|source| FedError::SaveState {
                    what: "FedMA's progress",
                    source,
                })?;
            let mut state = Record::default().with_config("progress", ConfigValue::Str(json));
            for (name, t) in self.built.iter() {
                state
                    .params
                    .push(format!("{BUILT}{name}"), t.shape.clone(), t.data.clone())?;
            }
            for (client, model) in self.store()?.iter() {
                for (name, t) in model.iter() {
                    state.params.push(
                        format!("{CLIENT}{client}.{name}"),
                        t.shape.clone(),
                        t.data.clone(),
                    )?;
                }
            }
            Ok(state)
        };
        Some(save())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("FedMA state: {why}"),
        };
        self.progress = match state.config.get("progress") {
            Some(ConfigValue::Str(json)) => {
                serde_json::from_str(json).map_err(|e| bad(e.to_string()))?
            }
            _ => return Err(bad("no `progress`".into())),
        };
        let mut built = Params::new();
        let mut models: BTreeMap<usize, Params> = BTreeMap::new();
        for (name, t) in state.params.iter() {
            if let Some(n) = name.strip_prefix(BUILT) {
                built.push(n, t.shape.clone(), t.data.clone())?;
            } else if let Some(rest) = name.strip_prefix(CLIENT) {
                let (id, n) = rest
                    .split_once('.')
                    .and_then(|(id, n)| Some((id.parse::<usize>().ok()?, n)))
                    .ok_or_else(|| bad(format!("tensor `{name}`")))?;
                models
                    .entry(id)
                    .or_default()
                    .push(n, t.shape.clone(), t.data.clone())?;
            } else {
                return Err(bad(format!("unknown tensor `{name}`")));
            }
        }
        self.check_progress(&built).map_err(bad)?;
        self.built = built;
        *self.store()? = models;
        Ok(())
    }
}

impl FedMa {
    /// Whether a restored `progress` and fused layers `built` fit this model and settings:
    /// every later index (stage, layer, fused unit) is then in range.
    fn check_progress(&self, built: &Params) -> std::result::Result<(), String> {
        let p = &self.progress;
        let matched = self.view.matched;
        if p.stage > matched {
            return Err(format!(
                "stage {} is past the model's {matched} matched layers",
                p.stage
            ));
        }
        if p.passes > self.settings.rounds {
            return Err(format!(
                "{} passes done, more than the {} set",
                p.passes, self.settings.rounds
            ));
        }
        if p.widths.len() != p.stage {
            return Err(format!(
                "{} fused widths at stage {} (one per layer matched so far)",
                p.widths.len(),
                p.stage
            ));
        }
        for (client, layers) in &p.current {
            if layers.len() > p.stage {
                return Err(format!(
                    "client {client} has assignments for {} layers at stage {}",
                    layers.len(),
                    p.stage
                ));
            }
            for (g, a) in layers.iter().enumerate() {
                if let Some(u) = a.iter().find(|&&u| u >= p.widths[g]) {
                    return Err(format!(
                        "client {client} is assigned to fused unit {u} of layer {g}, which has \
                         {} units",
                        p.widths[g]
                    ));
                }
            }
        }
        if let Some((client, _)) = p.last.iter().find(|(_, l)| l.len() > matched) {
            return Err(format!(
                "client {client}'s last assignments cover more than {matched} layers"
            ));
        }
        let (layers, uses) = self.view.at_widths(built).map_err(|e| e.to_string())?;
        let layout = self.view.layout(&layers).map_err(|e| e.to_string())?;
        for (name, t) in built.iter() {
            match layout.iter().find(|s| s.name == name) {
                Some(s) if s.shape == t.shape => {}
                Some(s) => {
                    return Err(format!(
                        "fused tensor `{name}` has shape {:?} where {:?} fits",
                        t.shape, s.shape
                    ));
                }
                None => return Err(format!("fused tensor `{name}` is not in the model")),
            }
        }
        for (g, &w) in p.widths.iter().enumerate() {
            let weight = format!("{}.weight", uses[g].layer);
            if built.get(&weight).and_then(|t| t.shape.first()) != Some(&w) {
                return Err(format!(
                    "fused layer {g} (`{weight}`) is missing or not {w} units wide"
                ));
            }
        }
        built.check_finite().map_err(|e| e.to_string())
    }
}
