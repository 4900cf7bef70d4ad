//! GEMS (Guha & Smith, arXiv 1805.07782) as a federated method: one hidden layer per round,
//! then the output layer, then done.
//!
//! - **Hidden layer `l`** (round `l + 1`): each learner passes its data through the fused
//!   layers below `l`, trains the rest of the network from its own initialisation, and sends
//!   one ball per neuron of layer `l` (centre = incoming weights and bias, radius from the
//!   radius search on its validation split). The server merges neurons of different learners
//!   whose balls intersect and keeps the others, so the fused width is at most the sum of the
//!   learners' widths.
//!   With `neuron_space = "incoming-outgoing"` (the paper's "the hypothesis space for a neuron
//!   consists of both the incoming and outgoing weights"), the last hidden layer's balls also
//!   hold each neuron's weights into the output layer, whose units (the classes) are the same
//!   for every learner; the merged neurons then carry the global output layer with them (its
//!   bias the learners' example-weighted mean) and there is no output stage.
//! - **Output layer**: each learner trains softmax regression on the fused hidden features and
//!   sends its ball (sphere or Fisher ellipsoid); the server takes a point in the intersection
//!   of all balls. When there is none, learners retrain from other initialisations (up to
//!   `max_retries` further rounds; the server keeps every ball it was sent and tries their
//!   combinations), then the run stops with an error that says to raise epsilon.
//! - **Fine-tuning** (optional): the server trains only the output layer for a few epochs on
//!   `finetune_samples` public samples (its validation split), from the GEMS point.
//!
//! A model with no hidden layer is shallow GEMS: the output stage alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use fedfuse_core::{ConfigValue, ModelSpec, Params, Record};
use fedfuse_data::{Dataset, holdout};
use fedfuse_fuse::FuseError;
use fedfuse_fuse::gems::dense::{
    Criterion, Layer, NeuronCriterion, NeuronSearch, Validation, layers_to_params, mlp_layers,
    output_layers_good, softmax_fisher,
};
use fedfuse_fuse::gems::{
    Ball, IntersectConfig, MergedUnit, NeuronBall, RadiusSearch, fisher_axes, intersect_balls,
    merge_neurons, search_radius,
};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::{BuildContext, in_method};
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

const STAGE: &str = "gems_stage";
const CENTRES: &str = "centres";
const RADII: &str = "radii";
const AXES: &str = "axes";
/// A learner's output bias, sent with the last hidden layer in the joint neuron space.
const OUTPUT_BIAS: &str = "output_bias";
/// Stage value of the output layer (hidden layers are 0, 1, ...).
const OUTPUT: i64 = -1;
/// Stage value once the model is complete.
const DONE: i64 = -2;

/// What makes the output layer good enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum CriterionKind {
    /// Validation cross-entropy at most epsilon (the paper).
    #[default]
    Loss,
    /// Validation accuracy at least epsilon (the authors' code).
    Accuracy,
}

/// What makes a perturbed hidden neuron good enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NeuronCriterionKind {
    /// The learner's network with only that neuron changed keeps its validation loss at most
    /// `neuron_epsilon` (the paper's Algorithm 2).
    #[default]
    Loss,
    /// The neuron's validation activations move by at most `neuron_epsilon` (L2 norm over the
    /// split, divided by its size: the authors' code, `hidden_slack = 1.0`).
    Activation,
}

/// The coordinates of a hidden neuron's ball.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NeuronSpace {
    /// Incoming weights and bias (the authors' code).
    #[default]
    Incoming,
    /// Incoming weights, bias and, for the last hidden layer, the weights into the output
    /// layer (the paper); lower layers feed units that differ between learners, so they keep
    /// their incoming weights.
    IncomingOutgoing,
}

fn is_incoming(space: &NeuronSpace) -> bool {
    *space == NeuronSpace::Incoming
}

/// How radii are searched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SearchKind {
    /// Bisection on `[0, r_max]` (the authors' code).
    #[default]
    Bisection,
    /// Grow by `step` until a sample fails (the paper's procedure).
    Increasing,
}

/// The shape of the output layer's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Shape {
    /// A ball.
    #[default]
    Sphere,
    /// An ellipsoid whose axes follow the diagonal Fisher (the code's `ellipse_type = 'fisher'`).
    Fisher,
}

/// GEMS settings (`[method] name = "gems"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GemsSettings {
    /// Output-layer criterion.
    pub criterion: CriterionKind,
    /// Output-layer threshold (a loss, or an accuracy in [0, 1]). Left out (the default), it
    /// is found automatically from `epsilon_scales`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// Automatic threshold: each learner measures its own validation loss `L_s` (with
    /// criterion = "accuracy", its error `1 - a_s`) and sends one radius per scale `m` (1.1 to 20), the
    /// region where the loss stays within `m L_s` (the error within `m (1 - a_s)`); the server
    /// takes the smallest scale at which every learner's region meets. Nothing about the test
    /// data enters, so the same settings run on any dataset. Unused when `epsilon` is set.
    #[serde(skip_serializing_if = "is_default_scales")]
    pub epsilon_scales: Vec<f64>,
    /// Per-learner thresholds by client id, overriding `epsilon` (e.g. for very unequal data).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub epsilon_by_client: BTreeMap<String, f64>,
    /// Hidden-neuron criterion.
    pub neuron_criterion: NeuronCriterionKind,
    /// Hidden-neuron coordinates.
    #[serde(skip_serializing_if = "is_incoming")]
    pub neuron_space: NeuronSpace,
    /// Hidden-neuron threshold (a loss, or an activation change).
    pub neuron_epsilon: f64,
    /// Surface samples per tested radius.
    pub samples: usize,
    /// Radius search.
    pub search: SearchKind,
    /// Largest radius.
    pub r_max: f64,
    /// Bisection tolerance for the output layer.
    pub tol: f64,
    /// Bisection tolerance for hidden neurons.
    pub neuron_tol: f64,
    /// Increment of the increasing search.
    pub step: f64,
    /// Output-layer region.
    pub shape: Shape,
    /// Fraction of output-layer coordinates (highest Fisher first) that are constrained; the
    /// rest are free. 1 constrains all.
    pub fisher_prop: f64,
    /// k-means clusters within which neurons are paired (the code's 75); 0 pairs across the
    /// whole layer.
    pub clusters: usize,
    /// Fraction of each learner's training data kept as its validation split.
    pub validation_fraction: f64,
    /// Output-stage retries with new initialisations when the balls do not intersect.
    pub max_retries: usize,
    /// Epochs of the learners' output-layer training (the code's `secondary_epochs`).
    pub output_epochs: usize,
    /// Public samples for fine-tuning the output layer on the server (0: no fine-tuning).
    pub finetune_samples: usize,
    /// Fine-tuning epochs (Adam).
    pub finetune_epochs: usize,
    /// Fine-tuning learning rate.
    pub finetune_lr: f64,
}

fn is_default_scales(scales: &[f64]) -> bool {
    scales == default_epsilon_scales().as_slice()
}
fn default_epsilon_scales() -> Vec<f64> {
    vec![
        1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 15.0, 20.0,
    ]
}

impl Default for GemsSettings {
    fn default() -> Self {
        Self {
            criterion: CriterionKind::Loss,
            epsilon: None,
            epsilon_scales: default_epsilon_scales(),
            epsilon_by_client: BTreeMap::new(),
            neuron_criterion: NeuronCriterionKind::Loss,
            neuron_space: NeuronSpace::Incoming,
            neuron_epsilon: 0.5,
            samples: 500,
            search: SearchKind::Bisection,
            r_max: 4000.0,
            tol: 0.01,
            neuron_tol: 1.0,
            step: 0.5,
            shape: Shape::Sphere,
            fisher_prop: 1.0,
            clusters: 0,
            validation_fraction: 0.2,
            max_retries: 3,
            output_epochs: 10,
            finetune_samples: 0,
            finetune_epochs: 5,
            finetune_lr: 0.01,
        }
    }
}

impl GemsSettings {
    /// Checks the settings and builds GEMS for `ctx`'s architecture (an MLP), fine-tuning on
    /// `ctx.validation` when asked to.
    pub fn build(&self, ctx: &BuildContext) -> Result<Gems> {
        Gems::new(
            self.clone(),
            ctx.spec("GEMS needs the learners' architecture")?.clone(),
            ctx.init,
            ctx.seed,
            ctx.validation.clone(),
        )
    }

    /// Checks every number once.
    pub fn check(&self) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(FedError::MethodSetting { field, reason });
        let eps_ok = |e: f64| match self.criterion {
            CriterionKind::Loss => e.is_finite() && e > 0.0,
            CriterionKind::Accuracy => (0.0..=1.0).contains(&e),
        };
        match self.epsilon {
            Some(e) if !eps_ok(e) => {
                return bad(
                    "epsilon",
                    format!(
                        "{e}: a positive loss, or an accuracy in [0, 1] with criterion = \
                         \"accuracy\" (or leave it out for the automatic threshold)"
                    ),
                );
            }
            Some(_) => {}
            None => {
                let increasing = self.epsilon_scales.windows(2).all(|w| w[0] < w[1]);
                let valid = self
                    .epsilon_scales
                    .iter()
                    .all(|m| m.is_finite() && *m >= 1.0);
                if self.epsilon_scales.is_empty() || !increasing || !valid {
                    return bad(
                        "epsilon_scales",
                        format!(
                            "{:?}: give increasing scales of at least 1 (or set epsilon)",
                            self.epsilon_scales
                        ),
                    );
                }
                if !self.epsilon_by_client.is_empty() {
                    return bad(
                        "epsilon_by_client",
                        "overrides a fixed `epsilon`; set epsilon, or leave both out for the \
                         automatic threshold"
                            .into(),
                    );
                }
            }
        }
        for (client, &e) in &self.epsilon_by_client {
            if client.parse::<usize>().is_err() || !eps_ok(e) {
                return bad(
                    "epsilon_by_client",
                    format!("`{client} = {e}`: keys are client ids, values like `epsilon`"),
                );
            }
        }
        if !(self.neuron_epsilon.is_finite() && self.neuron_epsilon > 0.0) {
            return bad(
                "neuron_epsilon",
                format!("{}: must be a positive number", self.neuron_epsilon),
            );
        }
        if self.samples == 0 {
            return bad("samples", "0; the code uses 500".into());
        }
        self.search(false).check().map_err(in_method)?;
        // The neuron search's tolerance is its own key.
        self.search(true).check().map_err(|e| match in_method(e) {
            FedError::MethodSetting {
                field: "tol",
                reason,
            } => FedError::MethodSetting {
                field: "neuron_tol",
                reason,
            },
            other => other,
        })?;
        if !(self.validation_fraction > 0.0 && self.validation_fraction < 1.0) {
            return bad(
                "validation_fraction",
                format!(
                    "{}: must lie in (0, 1); 0.2 is usual",
                    self.validation_fraction
                ),
            );
        }
        if self.output_epochs == 0 {
            return bad("output_epochs", "0; at least one epoch".into());
        }
        if self.finetune_samples > 0 && !(self.finetune_lr.is_finite() && self.finetune_lr > 0.0) {
            return bad(
                "finetune_lr",
                format!("{}: must be positive", self.finetune_lr),
            );
        }
        fisher_axes(&[1.0], self.fisher_prop, false).map_err(in_method)?;
        Ok(())
    }

    fn search(&self, neuron: bool) -> RadiusSearch {
        match self.search {
            SearchKind::Bisection => RadiusSearch::Bisection {
                r_max: self.r_max,
                tol: if neuron { self.neuron_tol } else { self.tol },
            },
            SearchKind::Increasing => RadiusSearch::Increasing {
                step: self.step,
                r_max: self.r_max,
            },
        }
    }

    /// The output layer's thresholds for `client`, one per radius it sends: the fixed
    /// `epsilon` (or its override), or one per scale of its own validation `(loss, accuracy)`.
    fn output_criteria(&self, client: usize, own: (f64, f64)) -> Vec<Criterion> {
        let fixed = self
            .epsilon_by_client
            .get(&client.to_string())
            .copied()
            .or(self.epsilon);
        let at = |eps| match self.criterion {
            CriterionKind::Loss => Criterion::Loss(eps),
            CriterionKind::Accuracy => Criterion::Accuracy(eps),
        };
        match fixed {
            Some(eps) => vec![at(eps)],
            None => self
                .epsilon_scales
                .iter()
                .map(|m| match self.criterion {
                    CriterionKind::Loss => at(m * own.0),
                    CriterionKind::Accuracy => at(1.0 - m * (1.0 - own.1)),
                })
                .collect(),
        }
    }

    /// Radii per output ball: one, or one per scale.
    fn output_radii(&self) -> usize {
        if self.epsilon.is_some() {
            1
        } else {
            self.epsilon_scales.len()
        }
    }

    fn neuron_criterion(&self) -> NeuronCriterion {
        match self.neuron_criterion {
            NeuronCriterionKind::Loss => NeuronCriterion::Loss(self.neuron_epsilon),
            NeuronCriterionKind::Activation => NeuronCriterion::Activation(self.neuron_epsilon),
        }
    }
}

/// A learner's output-layer region: one radius per threshold it was measured at (one for a
/// fixed epsilon, one per scale for the automatic one).
#[derive(Clone, Debug)]
struct OutputBall {
    centre: Vec<f32>,
    radii: Vec<f64>,
    axes: Option<Vec<f32>>,
}

impl OutputBall {
    fn at(&self, k: usize) -> Ball {
        Ball {
            centre: self.centre.clone(),
            radius: self.radii[k],
            axes: self.axes.clone(),
        }
    }
}

/// GEMS in the federation.
#[derive(Debug)]
pub struct Gems {
    settings: GemsSettings,
    spec: ModelSpec,
    hidden: Vec<usize>,
    init: Init,
    seed: u64,
    public: Option<Arc<Dataset>>,
    /// Fused hidden layers so far.
    fused: Vec<Layer>,
    /// Next stage: hidden layer index, [`OUTPUT`] or [`DONE`].
    stage: i64,
    /// Output-layer balls received so far, per client, one per attempt.
    output_balls: BTreeMap<usize, Vec<OutputBall>>,
    /// Output stages run so far.
    attempts: usize,
    /// The GEMS model before fine-tuning (reported next to the tuned one).
    untuned: Option<Params>,
    report: BTreeMap<String, f64>,
}

impl Gems {
    /// GEMS for clients of architecture `spec` (an MLP); `public` is the server's public set
    /// for fine-tuning.
    pub fn new(
        settings: GemsSettings,
        spec: ModelSpec,
        init: Init,
        seed: u64,
        public: Option<Arc<Dataset>>,
    ) -> Result<Self> {
        settings.check()?;
        let Some(widths) = spec.mlp_widths() else {
            return Err(FedError::InvalidSetting {
                field: "model.kind",
                reason: "GEMS fuses MLPs (neuron balls need dense layers); use kind = \"mlp\""
                    .into(),
            });
        };
        let hidden = widths[1..widths.len() - 1].to_vec();
        if settings.finetune_samples > 0 && public.as_ref().is_none_or(|p| p.is_empty()) {
            return Err(FedError::MethodSetting {
                field: "finetune_samples",
                reason: "fine-tuning needs public data on the server; set \
                         dataset.validation_fraction (e.g. 0.05) or finetune_samples = 0"
                    .into(),
            });
        }
        if hidden.is_empty() && settings.neuron_space == NeuronSpace::IncomingOutgoing {
            return Err(FedError::MethodSetting {
                field: "neuron_space",
                reason: "\"incoming-outgoing\" shapes hidden neurons' balls, and this model has \
                         no hidden layer; leave neuron_space out"
                    .into(),
            });
        }
        let stage = if hidden.is_empty() { OUTPUT } else { 0 };
        Ok(Self {
            settings,
            spec,
            hidden,
            init,
            seed,
            public,
            fused: Vec::new(),
            stage,
            output_balls: BTreeMap::new(),
            attempts: 0,
            untuned: None,
            report: BTreeMap::new(),
        })
    }

    /// Whether hidden stage `l`'s balls carry outgoing weights (and complete the model).
    fn joint(&self, l: usize) -> bool {
        self.settings.neuron_space == NeuronSpace::IncomingOutgoing && l + 1 == self.hidden.len()
    }

    /// The output layer the last hidden layer's merged neurons carry in the joint space:
    /// column `u` is unit `u`'s outgoing weights (a pair's intersection centre, or a lone
    /// neuron's own); the bias is the learners' example-weighted mean.
    fn carried_output_layer(
        &self,
        units: &[MergedUnit],
        d: usize,
        replies: &[Reply],
    ) -> Result<Layer> {
        let classes = self.spec.classes();
        let width = units.len();
        let mut weight = vec![0f32; classes * width];
        for (u, unit) in units.iter().enumerate() {
            for (k, &w) in unit.weights[d + 1..].iter().enumerate() {
                weight[k * width + u] = w;
            }
        }
        let total: f64 = replies.iter().map(|r| r.record.num_examples as f64).sum();
        let mut bias = vec![0f64; classes];
        for r in replies {
            // Equal weights when no learner reports its size.
            let share = if total > 0.0 {
                r.record.num_examples as f64 / total
            } else {
                1.0 / replies.len() as f64
            };
            let b = r.record.params.require(OUTPUT_BIAS)?;
            bias.iter_mut()
                .zip(&b.data)
                .for_each(|(m, &v)| *m += share * f64::from(v));
        }
        Ok(Layer {
            weight,
            bias: bias.into_iter().map(|v| v as f32).collect(),
            out: classes,
            inp: width,
        })
    }

    /// The model from the fused hidden layers and `output`, fine-tuned when asked to (the
    /// untuned one kept for the report); GEMS is then done.
    fn complete(&mut self, output: Layer, round: usize) -> Result<Params> {
        let mut layers = self.fused.clone();
        layers.push(output);
        let gems = layers_to_params(&layers)?;
        let global = match (&self.public, self.settings.finetune_samples) {
            (Some(public), n) if n > 0 => {
                let tuned = finetune_output_layer(
                    &gems,
                    public,
                    n,
                    self.settings.finetune_epochs,
                    self.settings.finetune_lr,
                    derive_seed(self.seed, round, usize::MAX - 1),
                )?;
                self.untuned = Some(gems);
                tuned
            }
            _ => gems,
        };
        self.stage = DONE;
        for (i, l) in self.fused.iter().enumerate() {
            self.report.insert(format!("width.{i}"), l.out as f64);
        }
        Ok(global)
    }

    fn stage_of(record: &Record) -> Result<i64> {
        match record.config.get(STAGE) {
            Some(ConfigValue::Int(s)) => Ok(*s),
            _ => Err(FedError::InvalidSetting {
                field: "gems_stage",
                reason: "the instruction carries no GEMS stage".into(),
            }),
        }
    }

    /// The fused hidden layers as `fused.{i}.weight` / `fused.{i}.bias` (what the clients
    /// build on, and part of the server's state).
    fn fused_record(&self) -> Result<Record> {
        let mut record = Record::default();
        for (i, l) in self.fused.iter().enumerate() {
            record.params.push(
                format!("fused.{i}.weight"),
                vec![l.out, l.inp],
                l.weight.clone(),
            )?;
            record
                .params
                .push(format!("fused.{i}.bias"), vec![l.out], l.bias.clone())?;
        }
        Ok(record)
    }

    /// The server state after a stage: fused layers, stage, output attempts and every output
    /// ball kept (radii as f64 metrics, so a resumed intersection is bit-identical), and the
    /// untuned model once fine-tuned.
    fn state(&self) -> Result<Record> {
        let mut state = self.fused_record()?;
        state
            .config
            .insert(STAGE.into(), ConfigValue::Int(self.stage));
        state
            .config
            .insert("attempts".into(), ConfigValue::Int(self.attempts as i64));
        for (client, balls) in &self.output_balls {
            state.config.insert(
                format!("balls.{client}"),
                ConfigValue::Int(balls.len() as i64),
            );
            for (k, ball) in balls.iter().enumerate() {
                let key = format!("ball.{client}.{k}");
                let len = ball.centre.len();
                state
                    .params
                    .push(format!("{key}.centre"), vec![len], ball.centre.clone())?;
                if let Some(axes) = &ball.axes {
                    state
                        .params
                        .push(format!("{key}.axes"), vec![axes.len()], axes.clone())?;
                }
                for (j, r) in ball.radii.iter().enumerate() {
                    state.metrics.insert(format!("{key}.radius.{j}"), *r);
                }
            }
        }
        if let Some(untuned) = &self.untuned {
            for (name, t) in untuned.iter() {
                state
                    .params
                    .push(format!("untuned.{name}"), t.shape.clone(), t.data.clone())?;
            }
        }
        Ok(state)
    }

    /// Restores [`Gems::state`], checking that the stage and the fused layers agree with this
    /// run's architecture.
    fn restore(&mut self, state: &Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("GEMS state: {why}"),
        };
        let int = |key: &str| match state.config.get(key) {
            Some(ConfigValue::Int(v)) => Ok(*v),
            _ => Err(bad(format!("no integer `{key}`"))),
        };
        let stage = int(STAGE)?;
        let fused = fused_from(state)?;
        let layers_done = match stage {
            OUTPUT | DONE => self.hidden.len(),
            l if (0..self.hidden.len() as i64).contains(&l) => l as usize,
            other => return Err(bad(format!("stage {other} is not one of this model's"))),
        };
        let widths_agree = fused.len() == layers_done
            && fused.first().is_none_or(|l| l.inp == self.spec.input_len());
        if !widths_agree {
            return Err(bad(format!(
                "{} fused layers at stage {stage}; this model needs {layers_done}",
                fused.len()
            )));
        }
        let attempts = usize::try_from(int("attempts")?).map_err(|e| bad(e.to_string()))?;
        let mut output_balls = BTreeMap::new();
        for (key, value) in &state.config {
            let Some(client) = key.strip_prefix("balls.") else {
                continue;
            };
            let client: usize = client.parse().map_err(|_| bad(format!("key `{key}`")))?;
            let count = match value {
                ConfigValue::Int(n) if (0..=attempts as i64).contains(n) => *n as usize,
                _ => return Err(bad(format!("`{key}` must count at most {attempts} balls"))),
            };
            let balls = (0..count)
                .map(|k| {
                    let key = format!("ball.{client}.{k}");
                    let radii = (0..self.settings.output_radii())
                        .map(|j| {
                            state
                                .metrics
                                .get(&format!("{key}.radius.{j}"))
                                .copied()
                                .ok_or_else(|| bad(format!("no `{key}.radius.{j}`")))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(OutputBall {
                        centre: state.params.require(&format!("{key}.centre"))?.data.clone(),
                        radii,
                        axes: state
                            .params
                            .get(&format!("{key}.axes"))
                            .map(|a| a.data.clone()),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            output_balls.insert(client, balls);
        }
        let mut untuned = Params::new();
        for (name, t) in state.params.iter() {
            if let Some(name) = name.strip_prefix("untuned.") {
                untuned.push(name, t.shape.clone(), t.data.clone())?;
            }
        }
        self.fused = fused;
        self.stage = stage;
        self.attempts = attempts;
        self.output_balls = output_balls;
        self.untuned = (!untuned.is_empty()).then_some(untuned);
        Ok(())
    }

    /// A point in one ball per client, and the threshold it was found at: the tightest
    /// threshold first; at each, the newest attempt's balls first, then other combinations of
    /// earlier attempts (at most 256).
    fn intersect_output(&self) -> Result<(Vec<f32>, usize)> {
        let mut last_err = None;
        for k in 0..self.settings.output_radii() {
            match self.intersect_output_at(k) {
                Ok(point) => return Ok((point, k)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| FuseError::Empty.into()))
    }

    fn intersect_output_at(&self, k: usize) -> Result<Vec<f32>> {
        let clients: Vec<&Vec<OutputBall>> = self.output_balls.values().collect();
        let cfg = IntersectConfig::default();
        let mut last_err = None;
        let total: usize = clients.iter().map(|b| b.len()).product();
        for combo in 0..total.min(256) {
            // Mixed-radix index, newest attempt first.
            let mut rest = combo;
            let chosen: Vec<Ball> = clients
                .iter()
                .map(|balls| {
                    let pick = balls.len() - 1 - rest % balls.len();
                    rest /= balls.len();
                    balls[pick].at(k)
                })
                .collect();
            let chosen: Vec<&Ball> = chosen.iter().collect();
            match intersect_balls(&chosen, &cfg) {
                Ok(point) => return Ok(point),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(FuseError::Empty).into())
    }
}

/// Fine-tunes only the output layer of the MLP `params` on the first `samples` of `public`
/// (the hidden layers stay frozen) with Adam at `lr` for `epochs`, batch 32: GEMS's use of a
/// little public data (the authors' notebooks: 5 epochs, lr 0.01).
pub fn finetune_output_layer(
    params: &Params,
    public: &Dataset,
    samples: usize,
    epochs: usize,
    lr: f64,
    seed: u64,
) -> Result<Params> {
    let mut layers = mlp_layers(params)?;
    let output = layers.pop().ok_or(FuseError::Empty)?;
    let idx: Vec<usize> = (0..samples.min(public.len())).collect();
    if idx.is_empty() || epochs == 0 {
        return Ok(params.clone());
    }
    let features = hidden_features(&layers, &public.subset(&idx))?;
    let trainer = Trainer::new(ModelSpec::mlp(output.inp, &[], output.out))?;
    let start = layers_to_params(std::slice::from_ref(&output))?;
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::adam(),
        lr,
        epochs,
        batch_size: 32,
        dropout: 0.0,
    };
    let fitted = trainer.fit_with(&start, &features, &cfg, None, seed)?;
    layers.push(mlp_layers(&fitted.params)?.remove(0));
    Ok(layers_to_params(&layers)?)
}

/// `data` passed through the fused hidden layers (ReLU after each), as a dataset of features.
pub fn hidden_features(fused: &[Layer], data: &Dataset) -> Result<Dataset> {
    if let Some(first) = fused.first()
        && first.inp != data.dim()
    {
        return Err(FedError::InvalidSetting {
            field: "fused",
            reason: format!(
                "the fused layers read {} inputs but the data has {} features per sample",
                first.inp,
                data.dim()
            ),
        });
    }
    let n = data.len();
    let mut h = data.x.clone();
    for l in fused {
        h = l.forward(&h, n, true);
    }
    let dim = fused.last().map_or(data.dim(), |l| l.out);
    Dataset::new(h, data.y.clone(), vec![dim], data.num_classes).map_err(|e| {
        FedError::InvalidSetting {
            field: "dataset",
            reason: e.to_string(),
        }
    })
}

fn fused_from(record: &Record) -> Result<Vec<Layer>> {
    let mut fused = Params::new();
    for (name, t) in record.params.iter() {
        if let Some(rest) = name.strip_prefix("fused.") {
            fused.push(format!("layers.{rest}"), t.shape.clone(), t.data.clone())?;
        }
    }
    if fused.is_empty() {
        return Ok(Vec::new());
    }
    Ok(mlp_layers(&fused)?)
}

impl Method for Gems {
    fn name(&self) -> &'static str {
        "gems"
    }

    fn instruct(&self, round: usize, _client: usize, _global: &Params) -> Result<Record> {
        Ok(self
            .fused_record()?
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
            .with_config(STAGE, ConfigValue::Int(self.stage)))
    }

    fn save_state(&self) -> Option<Result<Record>> {
        Some(self.state())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        self.restore(&state)
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let stage = Self::stage_of(&instruction)?;
        if stage == DONE {
            return Ok(Record::default());
        }
        let fused = fused_from(&instruction)?;
        // A split that stays the same across rounds, so every layer's balls are measured on
        // the same validation data.
        let mut split_rng = StdRng::seed_from_u64(derive_seed(self.seed, 0, ctx.id));
        let (train, val) = holdout(
            &ctx.data.train,
            self.settings.validation_fraction,
            &mut split_rng,
        )
        .map_err(|e| FedError::BadReply {
            client: ctx.id,
            reason: e.to_string(),
        })?;
        if train.is_empty() || val.is_empty() {
            return Err(FedError::BadReply {
                client: ctx.id,
                reason: format!(
                    "{} training samples cannot be split into training and validation data",
                    ctx.data.train.len()
                ),
            });
        }
        let train = hidden_features(&fused, &train)?;
        let val = hidden_features(&fused, &val)?;
        let classes = self.spec.classes();
        let d = train.dim();
        let mut rng = StdRng::seed_from_u64(ctx.seed);
        let mut reply = Record::default().with_num_examples(train.len() as u64);
        if stage == OUTPUT {
            let spec = ModelSpec::mlp(d, &[], classes);
            let trainer = Trainer::new(spec.clone())?;
            let start = init_params(&spec, self.init, ctx.seed);
            let cfg = TrainConfig {
                epochs: self.settings.output_epochs,
                ..ctx.train.clone()
            };
            let fitted = trainer.fit_with(&start, &train, &cfg, None, ctx.seed)?;
            let layer = mlp_layers(&fitted.params)?.remove(0);
            let centre = layer.flat();
            let axes = match self.settings.shape {
                Shape::Sphere if self.settings.fisher_prop >= 1.0 => None,
                shape => {
                    let fisher = softmax_fisher(&layer, &val.x, val.len(), &mut rng);
                    Some(fisher_axes(
                        &fisher,
                        self.settings.fisher_prop,
                        shape == Shape::Fisher,
                    )?)
                }
            };
            let eval = trainer.evaluate(&fitted.params, &val)?;
            let v = Validation {
                x: &val.x,
                y: &val.y,
            };
            let mut radii = Vec::new();
            for criterion in self
                .settings
                .output_criteria(ctx.id, (eval.loss, eval.accuracy))
            {
                let radius = search_radius(
                    &centre,
                    axes.as_deref(),
                    &self.settings.search(false),
                    self.settings.samples,
                    &mut rng,
                    |pts, n| Ok(output_layers_good(pts, n, classes, v, criterion)),
                )?;
                radii.push(radius as f32);
            }
            reply.params.push(CENTRES, vec![centre.len()], centre)?;
            reply.params.push(RADII, vec![radii.len()], radii)?;
            if let Some(a) = axes {
                reply.params.push(AXES, vec![a.len()], a)?;
            }
            reply.metrics.insert("val_accuracy".into(), eval.accuracy);
            reply.metrics.insert("val_loss".into(), eval.loss);
            reply.metrics.insert("train_loss".into(), fitted.loss);
            return Ok(reply);
        }
        let l = usize::try_from(stage)
            .ok()
            .filter(|&l| l < self.hidden.len() && l == fused.len())
            .ok_or_else(|| FedError::BadReply {
                client: ctx.id,
                reason: format!(
                    "stage {stage} with {} fused layers does not fit hidden widths {:?}",
                    fused.len(),
                    self.hidden
                ),
            })?;
        let spec = ModelSpec::mlp(d, &self.hidden[l..], classes);
        let trainer = Trainer::new(spec.clone())?;
        let start = init_params(&spec, self.init, ctx.seed);
        let fitted = trainer.fit_with(&start, &train, ctx.train, None, ctx.seed)?;
        let layers = mlp_layers(&fitted.params)?;
        let v = Validation {
            x: &val.x,
            y: &val.y,
        };
        let mut search = NeuronSearch::new(
            &layers[0],
            &layers[1..],
            v,
            self.settings.neuron_criterion(),
        )?;
        let joint = self.joint(l);
        if joint {
            search = search.with_outgoing()?;
        }
        let h = layers[0].out;
        let dim = search.dim();
        let mut centres = Vec::with_capacity(h * dim);
        let mut radii = Vec::with_capacity(h);
        for j in 0..h {
            let mut centre = layers[0].unit(j);
            if joint {
                centre.extend(Layer::outgoing(&layers[1], j));
            }
            let r = search_radius(
                &centre,
                None,
                &self.settings.search(true),
                self.settings.samples,
                &mut rng,
                |pts, n| Ok(search.all_good(j, pts, n)),
            )?;
            centres.extend_from_slice(&centre);
            radii.push(r as f32);
        }
        let eval = trainer.evaluate(&fitted.params, &val)?;
        reply.params.push(CENTRES, vec![h, dim], centres)?;
        reply.params.push(RADII, vec![h], radii)?;
        if joint {
            reply
                .params
                .push(OUTPUT_BIAS, vec![classes], layers[1].bias.clone())?;
        }
        reply.metrics.insert("val_accuracy".into(), eval.accuracy);
        reply.metrics.insert("val_loss".into(), eval.loss);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        Ok(reply)
    }

    fn check_reply(&self, _global: &Params, reply: &Record) -> Result<()> {
        if self.stage == DONE {
            return Ok(());
        }
        reply.params.check_finite()?;
        let bad = |reason: String| {
            Err(FedError::InvalidSetting {
                field: "reply",
                reason,
            })
        };
        let (Some(c), Some(r)) = (reply.params.get(CENTRES), reply.params.get(RADII)) else {
            return bad("a GEMS reply needs `centres` and `radii`".into());
        };
        let d = self.fused.last().map_or(self.spec.input_len(), |l| l.out);
        let (rows, cols) = if self.stage == OUTPUT {
            (1, self.spec.classes() * (d + 1))
        } else {
            let l = self.stage as usize;
            let outgoing = if self.joint(l) {
                self.spec.classes()
            } else {
                0
            };
            (self.hidden[l], d + 1 + outgoing)
        };
        let hidden_layout_wrong = self.stage != OUTPUT && c.shape != [rows, cols];
        let radii = if self.stage == OUTPUT {
            self.settings.output_radii()
        } else {
            rows
        };
        if c.data.len() != rows * cols || r.data.len() != radii || hidden_layout_wrong {
            return bad(format!(
                "{} centre values and {} radii; stage {} expects {rows} x {cols} and {radii}",
                c.data.len(),
                r.data.len(),
                self.stage
            ));
        }
        if r.data.iter().any(|&x| x < 0.0) {
            return bad("a negative radius".into());
        }
        if self.stage != OUTPUT && self.joint(self.stage as usize) {
            let classes = self.spec.classes();
            match reply.params.get(OUTPUT_BIAS) {
                Some(b) if b.data.len() == classes => {}
                _ => {
                    return bad(format!(
                        "the last hidden layer's reply in the joint neuron space needs \
                         `{OUTPUT_BIAS}` of {classes} values"
                    ));
                }
            }
        }
        if let Some(a) = reply.params.get(AXES)
            && a.data.len() != cols
        {
            return bad(format!("{} axes for {cols} coordinates", a.data.len()));
        }
        Ok(())
    }

    fn aggregate(
        &mut self,
        round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        self.report.clear();
        if self.stage == DONE {
            return Ok(Aggregate::Keep);
        }
        let get = |r: &Reply, name: &str| -> Result<Vec<f32>> {
            Ok(r.record.params.require(name)?.data.clone())
        };
        if self.stage == OUTPUT {
            for r in replies {
                let ball = OutputBall {
                    centre: get(r, CENTRES)?,
                    radii: get(r, RADII)?.into_iter().map(f64::from).collect(),
                    axes: r.record.params.get(AXES).map(|a| a.data.clone()),
                };
                self.output_balls.entry(r.client).or_default().push(ball);
            }
            self.attempts += 1;
            let (point, k) = match self.intersect_output() {
                Ok(p) => p,
                Err(_) if self.attempts <= self.settings.max_retries => {
                    self.report.insert("retry".into(), self.attempts as f64);
                    self.report.insert("intersected".into(), 0.0);
                    return Ok(Aggregate::Keep);
                }
                Err(e) => return Err(e),
            };
            let d = self.fused.last().map_or(self.spec.input_len(), |l| l.out);
            let output = Layer::from_flat(&point, self.spec.classes(), d)?;
            let global = self.complete(output, round)?;
            self.report.insert("intersected".into(), 1.0);
            self.report.insert("attempts".into(), self.attempts as f64);
            if self.settings.epsilon.is_none() {
                self.report
                    .insert("epsilon_scale".into(), self.settings.epsilon_scales[k]);
            }
            let radii: Vec<f64> = self
                .output_balls
                .values()
                .filter_map(|b| b.last())
                .map(|b| b.radii[k])
                .collect();
            self.report.insert(
                "output_radius_mean".into(),
                radii.iter().sum::<f64>() / radii.len().max(1) as f64,
            );
            return Ok(Aggregate::Replace(global));
        }
        // A hidden layer.
        let l = self.stage as usize;
        let mut neurons = Vec::new();
        for r in replies {
            let centres = r.record.params.require(CENTRES)?;
            let radii = get(r, RADII)?;
            // `check_reply` fixed the layout: one row per neuron.
            let cols = centres.shape[1];
            for (j, c) in centres.data.chunks_exact(cols).enumerate() {
                neurons.push(NeuronBall {
                    learner: r.client,
                    ball: Ball::sphere(c.to_vec(), f64::from(radii[j])),
                });
            }
        }
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let units = merge_neurons(
            &neurons,
            self.settings.clusters,
            &IntersectConfig::default(),
            &mut rng,
        );
        let d = self.fused.last().map_or(self.spec.input_len(), |x| x.out);
        let weights: Vec<Vec<f32>> = units.iter().map(|u| u.weights[..=d].to_vec()).collect();
        let merged = units.iter().filter(|u| u.members.len() > 1).count();
        let radii: Vec<f64> = neurons.iter().map(|n| n.ball.radius).collect();
        self.fused.push(Layer::from_units(&weights, d)?);
        self.report.insert(format!("width.{l}"), units.len() as f64);
        self.report
            .insert(format!("merged_units.{l}"), merged as f64);
        self.report.insert(
            format!("neuron_radius_mean.{l}"),
            radii.iter().sum::<f64>() / radii.len().max(1) as f64,
        );
        self.report.insert(
            format!("zero_radius.{l}"),
            radii.iter().filter(|&&r| r == 0.0).count() as f64,
        );
        if self.joint(l) {
            let output = self.carried_output_layer(&units, d, replies)?;
            return Ok(Aggregate::Replace(self.complete(output, round)?));
        }
        self.stage = if l + 1 < self.hidden.len() {
            (l + 1) as i64
        } else {
            OUTPUT
        };
        Ok(Aggregate::Keep)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.report.clone()
    }

    fn evaluate(&self, _trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        if let Some(untuned) = &self.untuned {
            let trainer = Trainer::new(ModelSpec::infer_mlp(untuned)?)?;
            let eval = trainer.evaluate(untuned, test)?;
            out.insert("untuned_accuracy".into(), eval.accuracy);
            out.insert("untuned_loss".into(), eval.loss);
        }
        Ok(out)
    }

    fn finished(&self) -> bool {
        self.stage == DONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_reply(client: usize, centre: f32, radius: f32) -> Reply {
        output_reply_at(client, centre, &[radius])
    }

    fn output_reply_at(client: usize, centre: f32, radii: &[f32]) -> Reply {
        let mut record = Record::default();
        record
            .params
            .push(CENTRES, vec![1, 8], vec![centre; 8])
            .expect("fills");
        record
            .params
            .push(RADII, vec![radii.len()], radii.to_vec())
            .expect("fills");
        Reply { client, record }
    }

    #[test]
    fn the_automatic_threshold_is_the_tightest_scale_at_which_the_regions_meet() {
        let settings = GemsSettings {
            epsilon_scales: vec![1.1, 2.0, 5.0],
            ..GemsSettings::default()
        };
        let mut gems = Gems::new(settings, ModelSpec::mlp(3, &[], 2), Init::Default, 0, None)
            .expect("valid settings");
        let global = Params::new();
        // Centres 1 apart in each of 8 coordinates (distance 2.83): radii 1 + 1 miss, 1.5 +
        // 1.5 meet, 4 + 4 meet too but are looser.
        let replies = [
            output_reply_at(0, 0.0, &[1.0, 1.5, 4.0]),
            output_reply_at(1, 1.0, &[1.0, 1.5, 4.0]),
        ];
        for r in &replies {
            gems.check_reply(&global, &r.record).expect("three radii");
        }
        assert!(
            gems.check_reply(&global, &output_reply(0, 0.0, 1.0).record)
                .is_err()
        );
        let Aggregate::Replace(fused) = gems.aggregate(1, &global, &replies).expect("meets") else {
            panic!("no model");
        };
        assert_eq!(gems.round_metrics()["epsilon_scale"], 2.0);
        let w = &fused.iter().next().expect("a layer").1.data;
        assert!(w.iter().all(|&v| v > 0.0 && v < 1.0), "{w:?}");
    }

    /// A learner's last-hidden-layer reply in the joint space: two neurons of
    /// `[w (2); b; w_out (2)]` with radius 0 (nothing merges), and its output bias.
    fn joint_reply(client: usize, examples: u64, base: f32, output_bias: [f32; 2]) -> Reply {
        let mut record = Record::default().with_num_examples(examples);
        let rows: Vec<f32> = (0..10).map(|i| base + i as f32).collect();
        record
            .params
            .push(CENTRES, vec![2, 5], rows)
            .expect("fills");
        record
            .params
            .push(RADII, vec![2], vec![0.0, 0.0])
            .expect("fills");
        record
            .params
            .push(OUTPUT_BIAS, vec![2], output_bias.to_vec())
            .expect("fills");
        Reply { client, record }
    }

    #[test]
    fn in_the_joint_space_the_neurons_carry_the_output_layer() {
        let settings = GemsSettings {
            neuron_space: NeuronSpace::IncomingOutgoing,
            ..GemsSettings::default()
        };
        let spec = ModelSpec::mlp(2, &[2], 2);
        let mut gems =
            Gems::new(settings.clone(), spec.clone(), Init::Default, 0, None).expect("valid");
        let global = Params::new();
        let replies = [
            joint_reply(0, 1, 0.0, [1.0, 2.0]),
            joint_reply(1, 3, 100.0, [5.0, -2.0]),
        ];
        for r in &replies {
            gems.check_reply(&global, &r.record).expect("joint layout");
        }
        let mut no_bias = replies[0].record.clone();
        no_bias.params.remove(OUTPUT_BIAS);
        assert!(gems.check_reply(&global, &no_bias).is_err());
        let Aggregate::Replace(model) = gems.aggregate(1, &global, &replies).expect("fuses") else {
            panic!("the joint space completes the model in one stage");
        };
        assert!(gems.finished());
        // Four lone neurons; the output layer's column u is neuron u's last two values.
        let hidden = model.require("layers.0.weight").expect("hidden");
        assert_eq!(hidden.shape, [4, 2]);
        assert_eq!(
            model.require("layers.0.bias").expect("bias").data,
            [2.0, 7.0, 102.0, 107.0]
        );
        let out = model.require("layers.1.weight").expect("output");
        assert_eq!(out.shape, [2, 4]);
        assert_eq!(out.data, [3.0, 8.0, 103.0, 108.0, 4.0, 9.0, 104.0, 109.0]);
        // Bias: examples 1 and 3 weigh (1, 2) and (5, -2).
        assert_eq!(
            model.require("layers.1.bias").expect("bias").data,
            [4.0, -1.0]
        );
        // A model with no hidden layer has no neurons to shape.
        assert!(Gems::new(settings, ModelSpec::mlp(2, &[], 2), Init::Default, 0, None).is_err());
    }

    #[test]
    fn output_balls_of_a_missed_attempt_survive_a_checkpoint() {
        let shallow = || {
            Gems::new(
                GemsSettings {
                    epsilon: Some(0.5),
                    ..GemsSettings::default()
                },
                ModelSpec::mlp(3, &[], 2),
                Init::Default,
                0,
                None,
            )
            .expect("valid settings")
        };
        let global = Params::new();
        let mut gems = shallow();
        // Two balls far apart: no common point, so the server keeps them and asks again.
        let missed = [output_reply(0, 0.0, 0.1), output_reply(1, 5.0, 0.1)];
        assert!(matches!(
            gems.aggregate(1, &global, &missed).expect("a retry"),
            Aggregate::Keep
        ));
        let saved = gems.save_state().expect("savable").expect("saved");
        let mut resumed = shallow();
        resumed.load_state(saved.clone()).expect("restores");
        let again = resumed.save_state().expect("savable").expect("saved");
        assert_eq!(again, saved);

        // Client 1's second ball meets client 0's first: only a server that kept the missed
        // attempt's balls finds the point, and both find the same one.
        let second = [output_reply(0, 9.0, 0.1), output_reply(1, 0.05, 0.1)];
        let point = |g: &mut Gems| match g.aggregate(2, &global, &second).expect("intersects") {
            Aggregate::Replace(p) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(point(&mut gems), point(&mut resumed));
        assert!(resumed.finished());
        let forgot = shallow().aggregate(2, &global, &second);
        assert!(forgot.is_ok_and(|a| matches!(a, Aggregate::Keep)));
    }

    #[test]
    fn a_hidden_reply_must_have_one_row_per_neuron() {
        let gems = Gems::new(
            GemsSettings::default(),
            ModelSpec::mlp(3, &[2], 2),
            Init::Default,
            0,
            None,
        )
        .expect("valid settings");
        let reply = |shape: Vec<usize>| {
            let mut r = Record::default();
            r.params.push(CENTRES, shape, vec![0.5; 8]).expect("fills");
            r.params.push(RADII, vec![2], vec![1.0; 2]).expect("fills");
            r
        };
        let global = Params::new();
        assert!(gems.check_reply(&global, &reply(vec![2, 4])).is_ok());
        // The right number of values in the wrong layout would misread the neurons.
        assert!(gems.check_reply(&global, &reply(vec![8])).is_err());
        assert!(gems.check_reply(&global, &reply(vec![4, 2])).is_err());
    }
}
