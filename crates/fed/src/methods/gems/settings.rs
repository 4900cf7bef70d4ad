//! GEMS's settings (`[method] name = "gems"`), their defaults and their one check.

use std::collections::BTreeMap;

use fedfuse_fuse::gems::dense::{Criterion, NeuronCriterion};
use fedfuse_fuse::gems::{RadiusSearch, fisher_axes};
use serde::{Deserialize, Serialize};

use super::Gems;
use crate::methods::{BuildContext, in_method};
use crate::{FedError, Result};

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

pub(super) fn is_incoming(space: &NeuronSpace) -> bool {
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
    /// GEMS for `ctx`'s architecture (an MLP), fine-tuning on `ctx.validation` when asked to
    /// (settings checked by [`GemsSettings::check`]).
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

    pub(super) fn search(&self, neuron: bool) -> RadiusSearch {
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
    pub(super) fn output_criteria(&self, client: usize, own: (f64, f64)) -> Vec<Criterion> {
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
    pub(super) fn output_radii(&self) -> usize {
        if self.epsilon.is_some() {
            1
        } else {
            self.epsilon_scales.len()
        }
    }

    pub(super) fn neuron_criterion(&self) -> NeuronCriterion {
        match self.neuron_criterion {
            NeuronCriterionKind::Loss => NeuronCriterion::Loss(self.neuron_epsilon),
            NeuronCriterionKind::Activation => NeuronCriterion::Activation(self.neuron_epsilon),
        }
    }
}
