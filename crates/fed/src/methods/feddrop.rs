//! Federated dropout (Caldas, Konečný, McMahan & Talwalkar 2018): each round the server drops
//! a fixed fraction of the units of every hidden layer, clients train the smaller dense
//! sub-model, and the averaged sub-model is written back into the kept coordinates. Both
//! directions carry only the sub-model. MLPs; one sub-model per round, shared by its clients.
//!
//! As in (inverted) dropout, the weights leaving a thinned layer are scaled by `1/keep` in the
//! sub-model and by `keep` on the way back, so the next layer sees pre-activations of the same
//! size in the sub-model and the full model. Without it, the full model sums more units than
//! any sub-model was trained with (measured on digits, 64-64-32-10, half the units dropped:
//! 0.53 accuracy after 10 rounds without the scaling).

use fedfuse_core::{ConfigValue, ModelSpec, ParamShape, Params, Record};
use fedfuse_fuse::{WeightedSum, scatter_sub_model, sub_model};
use fedfuse_train::Trainer;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result, derive_seed};

/// FedDrop.
#[derive(Clone, Debug)]
pub struct FedDrop {
    /// Fraction of each hidden layer's units dropped per round, in [0, 1).
    pub fraction: f64,
    /// Hidden widths of the global MLP.
    pub hidden: Vec<usize>,
    /// Seed of the per-round choice of units.
    pub seed: u64,
}

impl FedDrop {
    /// FedDrop for an MLP `spec`; checks the fraction.
    pub fn new(fraction: f64, spec: &ModelSpec, seed: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&fraction) {
            return Err(FedError::InvalidSetting {
                field: "method.fraction",
                reason: format!("{fraction} is not in [0, 1)"),
            });
        }
        let ModelSpec::Mlp { hidden, .. } = spec else {
            return Err(FedError::InvalidSetting {
                field: "model.kind",
                reason: "FedDrop drops hidden units of MLPs; use kind = \"mlp\"".into(),
            });
        };
        Ok(Self {
            fraction,
            hidden: hidden.clone(),
            seed,
        })
    }

    /// Units kept in each hidden layer (at least one), the same for every client of `round`.
    pub fn kept(&self, round: usize) -> Vec<Vec<usize>> {
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX - 1));
        self.hidden
            .iter()
            .map(|&h| {
                let keep = self.keep_count(h);
                let mut units = rand::seq::index::sample(&mut rng, h, keep).into_vec();
                units.sort_unstable();
                units
            })
            .collect()
    }

    /// Scales the weights fed by each thinned hidden layer: by `1/keep` (`down`) or `keep`.
    fn rescale(&self, sub: &mut Params, kept: &[Vec<usize>], down: bool) -> Result<()> {
        for (l, (units, &h)) in kept.iter().zip(&self.hidden).enumerate() {
            let keep = units.len() as f32 / h as f32;
            let factor = if down { 1.0 / keep } else { keep };
            let name = format!("layers.{}.weight", l + 1);
            let w = sub.get_mut(&name).ok_or_else(|| FedError::InvalidSetting {
                field: "model",
                reason: format!("the sub-model has no `{name}`"),
            })?;
            for v in &mut w.data {
                *v *= factor;
            }
        }
        Ok(())
    }

    /// Units kept of a hidden layer of width `h` (at least one).
    fn keep_count(&self, h: usize) -> usize {
        (h - (self.fraction * h as f64).round() as usize).max(1)
    }

    /// The layout of every round's sub-model (only which units differs between rounds),
    /// from the global layout alone: no sub-model is built to check a reply.
    fn sub_layout(&self, global: &Params) -> Vec<ParamShape> {
        let kept: Vec<usize> = self.hidden.iter().map(|&h| self.keep_count(h)).collect();
        global
            .layout()
            .into_iter()
            .enumerate()
            .map(|(t, mut p)| {
                // Tensors come in (weight, bias) pairs, one pair per layer.
                let layer = t / 2;
                if let (Some(&k), Some(rows)) = (kept.get(layer), p.shape.get_mut(0)) {
                    *rows = k;
                }
                if let Some(below) = layer.checked_sub(1)
                    && let (Some(&k), Some(cols)) = (kept.get(below), p.shape.get_mut(1))
                {
                    *cols = k;
                }
                p
            })
            .collect()
    }
}

impl Method for FedDrop {
    fn name(&self) -> &'static str {
        "feddrop"
    }

    /// This round's sub-model.
    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let kept = self.kept(round);
        let mut sub = sub_model(global, &kept)?;
        self.rescale(&mut sub, &kept, true)?;
        Ok(Record::from_params(sub).with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    /// Trains the sub-model as the dense network it is.
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let trainer = Trainer::new(ModelSpec::infer_mlp(&instruction.params)?)?;
        let fitted = trainer.fit_with(
            &instruction.params,
            &ctx.data.train,
            ctx.train,
            None,
            ctx.seed,
        )?;
        let mut reply =
            Record::from_params(fitted.params).with_num_examples(fitted.examples as u64);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        Ok(reply)
    }

    fn check_reply(&self, global: &Params, reply: &Record) -> Result<()> {
        reply.params.check_layout(&self.sub_layout(global))?;
        reply.params.check_finite()?;
        Ok(())
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let mut fold = Box::new(MeanOfSubModels {
            sum: WeightedSum::new(),
            method: self.clone(),
        });
        for r in replies {
            fold.add(r.clone())?;
        }
        fold.finish(round, global)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        Some(Box::new(MeanOfSubModels {
            sum: WeightedSum::new(),
            method: self.clone(),
        }))
    }
}

/// The example-weighted mean of the round's sub-models, written back into the kept
/// coordinates (which are recomputed at `finish`, when the round is known).
struct MeanOfSubModels {
    sum: WeightedSum,
    method: FedDrop,
}

impl Fold for MeanOfSubModels {
    fn add(&mut self, reply: Reply) -> Result<()> {
        let weight = reply.record.num_examples as f64;
        Ok(self.sum.add(&reply.record.params, weight)?)
    }

    fn finish(self: Box<Self>, round: usize, global: &Params) -> Result<Aggregate> {
        let mut mean = self.sum.mean()?;
        let kept = self.method.kept(round);
        self.method.rescale(&mut mean, &kept, false)?;
        let mut next = global.clone();
        scatter_sub_model(&mut next, &mean, &kept)?;
        Ok(Aggregate::Replace(next))
    }
}
