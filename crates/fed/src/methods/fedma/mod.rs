//! FedMA (Wang et al. 2020, "Federated Learning with Matched Averaging"): layer-wise matching
//! with PFNM's matcher, and "FedMA with communication".
//!
//! A pass takes `M + 1` federation rounds for a network with `M` permutation groups (in a plain
//! chain every convolution and linear layer below the output layer; in a residual network
//! also each stage's stream, and each block's inner channels), input side first:
//!
//! - stage 0: each client trains its whole model (in the first pass from its own
//!   initialisation, later from its part of the last global model: the global units it was
//!   matched to, so its widths stay the original ones) and sends the tensors of stage 0
//!   ([`layerwise_stages`]);
//! - stage `s` in `1..M`: the server has matched group `s - 1` ([`pfnm_match_layer`]) and
//!   sends its stage's tensors down with the client's assignment; the client lays everything
//!   that holds or reads the group's units over the fused units ([`spread_units`]), puts the
//!   fused tensors in, retrains with everything fused so far frozen, and sends the tensors of
//!   stage `s` (the group the output layer reads with its weights into the classes, which its
//!   matching reads). A residual block's last convolution writes a stream matched below the
//!   block and reads the block's inner channels: it is fused, and frozen, at the inner
//!   channels' stage;
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

use fedfuse_core::layers::{TensorRole, UnitUses};
use fedfuse_core::{ModelSpec, ParamShape, Params, Record};
use fedfuse_fuse::layerwise_stages;
use fedfuse_train::Init;

use super::in_method;
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
    /// The list's permutation groups at the clients' widths.
    groups: Vec<UnitUses>,
    /// The tensors fused at each stage ([`layerwise_stages`]).
    stages: Vec<Vec<String>>,
    /// The stage whose group the output layer reads (its weights join that matching).
    top: Option<usize>,
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
        let view = ListView::of(spec)?;
        let stages = layerwise_stages(&view.input, &view.layers).map_err(in_method)?;
        let (_, groups) = view.at_widths(&Params::new())?;
        let out_weight = format!("{}.weight", view.output);
        let top = groups
            .iter()
            .position(|u| u.readers.iter().any(|r| r.tensor == out_weight));
        Ok(Self {
            settings: settings.clone(),
            view,
            groups,
            stages,
            top,
            init,
            seed,
            progress: Progress::default(),
            built: Params::new(),
            models: Mutex::new(BTreeMap::new()),
            report: BTreeMap::new(),
        })
    }

    /// The tensors fused at stage `s`, by name.
    pub(super) fn stage_names(&self, s: usize) -> &[String] {
        &self.stages[s]
    }

    /// What a client sends at `stage`.
    pub(super) fn sent_names(&self, layout: &[ParamShape], stage: usize) -> Vec<String> {
        if stage < self.view.matched {
            let mut names = self.stage_names(stage).to_vec();
            if self.top == Some(stage) {
                names.push(format!("{}.weight", self.view.output));
            }
            return names;
        }
        let owned: Vec<&String> = self.stages.iter().flatten().collect();
        layout
            .iter()
            .filter(|s| TensorRole::of(&s.name) != TensorRole::Param || !owned.contains(&&s.name))
            .map(|s| s.name.clone())
            .collect()
    }

    /// The rows of group `g` a model holds: those of the first of its weights present.
    pub(super) fn group_width(&self, params: &Params, g: usize) -> Option<usize> {
        self.groups[g]
            .own
            .iter()
            .filter(|u| u.axis == 0)
            .find_map(|u| params.get(&u.tensor))
            .and_then(|t| t.shape.first().copied())
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
