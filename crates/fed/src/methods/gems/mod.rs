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

mod checkpoint;
mod client;
mod finetune;
mod server;
mod settings;

use std::collections::BTreeMap;
use std::sync::Arc;

use fedfuse_core::{ModelSpec, Params, Record};
use fedfuse_data::Dataset;
use fedfuse_fuse::gems::Ball;
use fedfuse_fuse::gems::dense::{Layer, mlp_layers};
use fedfuse_train::Init;

use crate::Result;

pub use finetune::{finetune_output_layer, hidden_features};
pub use settings::{
    CriterionKind, GemsSettings, NeuronCriterionKind, NeuronSpace, SearchKind, Shape,
};

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

/// The fused hidden layers a record carries (`fused.{i}.weight`, `fused.{i}.bias`).
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
