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

mod client;
mod server;
mod settings;
mod state;

use std::collections::BTreeMap;
use std::sync::Mutex;

use fedfuse_core::layers::{LayerSpec, TensorRole, UnitUses};
use fedfuse_core::{ModelSpec, ParamShape, Params, Record};
use fedfuse_train::Init;

use super::list_view::ListView;
use crate::{Aggregate, ClientContext, Method, Reply, Result};

pub use settings::FedMaSettings;
use state::Progress;

/// Config key of an instruction's stage within its pass.
const STAGE: &str = "fedma_stage";
/// Tensor of an instruction holding the client's assignment to the fused units of the layer
/// sent: entry `i` is the fused unit of the client's unit `i`.
const ASSIGN: &str = "fedma_assign";
/// Prefix of the server's fused layers in its saved state.
const BUILT: &str = "built.";
/// Prefix of a client's model in the saved state: `client.{id}.{tensor}`.
const CLIENT: &str = "client.";

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
    pub(super) fn new(
        settings: &FedMaSettings,
        spec: &ModelSpec,
        init: Init,
        seed: u64,
    ) -> Result<Self> {
        Ok(Self {
            settings: settings.clone(),
            view: ListView::chain(spec, "fedma")?,
            init,
            seed,
            progress: Progress::default(),
            built: Params::new(),
            models: Mutex::new(BTreeMap::new()),
            report: BTreeMap::new(),
        })
    }

    /// The own tensors of matched layer `g` (weight, bias, norm channels), by name.
    pub(super) fn own_names(&self, uses: &[UnitUses], g: usize) -> Vec<String> {
        uses[g].own.iter().map(|u| u.tensor.clone()).collect()
    }

    /// What a client sends at `stage`.
    pub(super) fn sent_names(
        &self,
        uses: &[UnitUses],
        layout: &[ParamShape],
        stage: usize,
    ) -> Vec<String> {
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
}

pub(super) fn set_out(layer: &mut LayerSpec, width: usize) {
    if let LayerSpec::Conv2d { out, .. } | LayerSpec::Linear { out, .. } = layer {
        *out = width;
    }
}

impl Method for FedMa {
    fn name(&self) -> &'static str {
        "fedma"
    }

    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.instruction(round, client, global)
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        self.fit_stage(instruction, ctx)
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
        self.aggregate_stage(round, replies)
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
        self.kept_model(client)
    }

    fn set_client_state(&self, client: usize, state: Option<Params>) -> Result<()> {
        self.keep_model(client, state)
    }

    /// Progress and assignments (JSON), the fused layers so far and every client's model.
    fn save_state(&self) -> Option<Result<Record>> {
        Some(self.state())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        self.restore(state)
    }
}
