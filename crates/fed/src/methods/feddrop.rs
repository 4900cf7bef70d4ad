//! Federated dropout (Caldas, Konečný, McMahan & Talwalkar 2018): each round the server drops
//! a fixed fraction of the units of every hidden layer (the filters of conv layers), clients
//! train what is left, and the averaged result is written back into the kept coordinates. Both
//! directions carry only the kept part. One sub-model per round, shared by its clients.
//!
//! MLPs travel as the smaller dense sub-model and train as one (faster). Other models (LeNet-5,
//! layer lists) keep their shapes: the dropped units' weights in and out are zeroed, the record
//! is sparse (zeros cost only their index bits), and the client trains with the dropped units
//! gated off ([`Trainer::fit_gated`]), which gives them and the weights reading them no
//! gradient. On a layer list "a unit's weights in and out" are those of
//! [`fedfuse_core::layers::unit_uses`]: its filter or row, its bias, the per-channel tensors of
//! the norm after it, and the next layer's input slices that read it.
//!
//! As in (inverted) dropout, a thinned layer's kept units count `1/keep` times, so the next
//! layer sees pre-activations of the same size in the sub-model and the full model. Without it,
//! the full model sums more units than any sub-model was trained with (measured on digits,
//! 64-64-32-10, half the units dropped: 0.53 accuracy after 10 rounds without the scaling). A
//! dense sub-model scales the weights leaving a thinned layer, by `1/keep` on the way out and
//! `keep` on the way back; a gated model gates its kept units by `1/keep` instead, which is
//! PyTorch's inverted dropout, and also scales what a unit passes on along a residual block's
//! identity path, which has no weight to scale.
//!
//! Batch norm on a layer list: a dropped channel's scale, shift and running statistics travel
//! as zeros and come back masked, so the global model keeps its running mean and variance for
//! the round (the channel saw no data; on the client they only decay towards its zero output).
//! Group and layer norm are refused after a dropped layer: a dropped unit's zeros would enter
//! the kept units' mean and variance, which the full model computes without them. So is a batch
//! norm that does not directly follow the layer, whose statistics would take in the `1/keep`.

use fedfuse_core::layers::{UnitUses, unit_uses};
use fedfuse_core::{
    BlockNorm, ConfigValue, GroupLayout, LayerSpec, ModelSpec, ParamShape, Params, Record,
};
use fedfuse_fuse::{WeightedSum, scatter_sub_model, sub_model};
use fedfuse_train::Trainer;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::BuildContext;
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result, derive_seed};

/// FedDrop's settings (`[method] name = "feddrop"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedDropSettings {
    /// Fraction of hidden units dropped per round, in [0, 1).
    #[serde(default = "quarter")]
    pub fraction: f64,
}

fn quarter() -> f64 {
    0.25
}

impl Default for FedDropSettings {
    fn default() -> Self {
        Self {
            fraction: quarter(),
        }
    }
}

impl FedDropSettings {
    /// Checks the fraction.
    pub fn check(&self) -> Result<()> {
        let fraction = self.fraction;
        if !(0.0..1.0).contains(&fraction) {
            return Err(FedError::MethodSetting {
                field: "fraction",
                reason: format!("{fraction} is not in [0, 1)"),
            });
        }
        Ok(())
    }

    /// FedDrop for `ctx.spec`, its units drawn from `ctx.seed` (settings checked by
    /// [`FedDropSettings::check`]).
    pub fn build(&self, ctx: &BuildContext) -> Result<FedDrop> {
        FedDrop::new(
            self.fraction,
            ctx.spec("FedDrop needs the model's architecture")?,
            ctx.seed,
        )
    }
}

/// FedDrop.
#[derive(Clone, Debug)]
pub struct FedDrop {
    /// Fraction of each hidden layer's units dropped per round, in [0, 1).
    pub fraction: f64,
    /// Units (or filters) of each grouped layer ([`GroupLayout::of_model`]): the hidden widths
    /// of an MLP.
    pub hidden: Vec<usize>,
    /// Seed of the per-round choice of units.
    pub seed: u64,
    /// `None` for an MLP (dense sub-models); otherwise the model, trained masked.
    masked: Option<Masked>,
}

/// A model that keeps its shapes, and where its units' weights in and out are.
#[derive(Clone, Debug)]
enum Masked {
    /// LeNet-5: each grouped layer's weight and bias, and the next tensor after the bias, the
    /// weight of the layer reading its units.
    LeNet(ModelSpec),
    /// A layer list: every tensor holding or reading each grouped layer's units.
    List {
        shapes: Vec<ParamShape>,
        uses: Vec<UnitUses>,
    },
}

impl Masked {
    /// Whether each value of each tensor belongs to a kept unit (or to no unit).
    fn kept_values(&self, kept: &[Vec<usize>]) -> Vec<Vec<bool>> {
        match self {
            Self::LeNet(spec) => kept_values(spec, kept),
            Self::List { shapes, uses } => list_kept_values(shapes, uses, kept),
        }
    }
}

impl FedDrop {
    /// FedDrop for `spec`, dropping a `fraction` in [0, 1) ([`FedDropSettings::check`]);
    /// the model needs a hidden layer.
    pub fn new(fraction: f64, spec: &ModelSpec, seed: u64) -> Result<Self> {
        let hidden: Vec<usize> = GroupLayout::of_model(spec)
            .layers()
            .iter()
            .map(|g| g.units)
            .collect();
        if hidden.is_empty() {
            return Err(FedError::InvalidSetting {
                field: "model",
                reason: "FedDrop drops hidden units; the model has no hidden layer".into(),
            });
        }
        let masked = match spec {
            ModelSpec::Mlp { .. } => None,
            ModelSpec::Sequential { input, layers } => {
                let uses = unit_uses(input, layers)?;
                check_list(layers, &uses)?;
                Some(Masked::List {
                    shapes: spec.param_shapes(),
                    uses,
                })
            }
            other => Some(Masked::LeNet(other.clone())),
        };
        Ok(Self {
            fraction,
            hidden,
            seed,
            masked,
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

/// Whether each value of each LeNet-5 tensor belongs to a kept unit: a grouped layer's rows
/// (and bias entries) of dropped units are out, and so are the next layer's input columns that
/// read them (for a conv output flattened into a dense layer, its block of `h * w` columns).
fn kept_values(spec: &ModelSpec, kept: &[Vec<usize>]) -> Vec<Vec<bool>> {
    let shapes = spec.param_shapes();
    let mut mask: Vec<Vec<bool>> = shapes
        .iter()
        .map(|s| vec![true; s.shape.iter().product()])
        .collect();
    let index = |name: &str| shapes.iter().position(|s| s.name == name);
    for (g, units) in GroupLayout::of_model(spec).layers().iter().zip(kept) {
        let mut on = vec![false; g.units];
        for &u in units {
            if let Some(o) = on.get_mut(u) {
                *o = true;
            }
        }
        if let (Some(w), Some(b)) = (index(&g.weight), g.per_unit.first().and_then(|b| index(b))) {
            // Only ever clear: the previous layer has already cleared some of these columns.
            for (u, _) in on.iter().enumerate().filter(|(_, keep)| !**keep) {
                mask[w][u * g.fan_in..(u + 1) * g.fan_in].fill(false);
                mask[b][u] = false;
            }
            // The next tensor after the bias is the weight of the layer reading these units.
            if let Some(next) = shapes.get(b + 1) {
                let rows = next.shape.first().copied().unwrap_or(0);
                let row_len: usize = next.shape.iter().skip(1).product();
                let per_unit = row_len / g.units.max(1);
                for r in 0..rows {
                    for (u, &keep) in on.iter().enumerate() {
                        if !keep {
                            let start = r * row_len + u * per_unit;
                            mask[b + 1][start..start + per_unit].fill(false);
                        }
                    }
                }
            }
        }
    }
    mask
}

/// [`kept_values`] of a layer list: every use of a dropped unit (see [`unit_uses`]) is out.
fn list_kept_values(
    shapes: &[ParamShape],
    uses: &[UnitUses],
    kept: &[Vec<usize>],
) -> Vec<Vec<bool>> {
    let mut mask: Vec<Vec<bool>> = shapes
        .iter()
        .map(|s| vec![true; s.shape.iter().product()])
        .collect();
    for (layer, units) in uses.iter().zip(kept) {
        let mut on = vec![false; layer.units];
        for &u in units {
            if let Some(o) = on.get_mut(u) {
                *o = true;
            }
        }
        for used in layer.all() {
            let Some(t) = shapes.iter().position(|s| s.name == used.tensor) else {
                continue;
            };
            for unit in (0..layer.units).filter(|&u| !on[u]) {
                for span in used.ranges(&shapes[t].shape, unit) {
                    mask[t][span].fill(false);
                }
            }
        }
    }
    mask
}

/// Refuses a layer list whose dropped units would not leave cleanly (see the module docs),
/// naming the layers.
fn check_list(layers: &[LayerSpec], uses: &[UnitUses]) -> Result<()> {
    let name = |i: usize| format!("model.layers[{i}] ({})", layers[i].type_name());
    let refuse = |reason: String| {
        Err(FedError::InvalidSetting {
            field: "model.layers",
            reason: format!("method `feddrop`: {reason}; or use fedsparse or fedl1"),
        })
    };
    let mixes = "a dropped unit's zeros would enter the kept units' mean and variance, which \
                 the full model computes without them";
    for u in uses {
        if let LayerSpec::Residual {
            norm: BlockNorm::Group,
            ..
        } = layers[u.layer]
        {
            return refuse(format!(
                "{} normalises the channels FedDrop drops (its conv1's) with group norm: \
                 {mixes}; use norm = \"batch\" or \"none\"",
                name(u.layer)
            ));
        }
        for &k in &u.between {
            match layers[k] {
                LayerSpec::GroupNorm { .. } | LayerSpec::LayerNorm { .. } => {
                    return refuse(format!(
                        "{} normalises the units of {}, which FedDrop drops, together: \
                         {mixes}; use batch norm there, or none",
                        name(k),
                        name(u.layer)
                    ));
                }
                LayerSpec::BatchNorm2d { .. } | LayerSpec::BatchNorm1d { .. }
                    if k != u.layer + 1 =>
                {
                    return refuse(format!(
                        "{} normalises the units of {}, which FedDrop drops, but does not \
                         directly follow it: the kept units' 1/keep scaling (applied at the \
                         layer's output) would enter its running statistics; put the norm \
                         directly after the layer",
                        name(k),
                        name(u.layer)
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Zeroes the values outside `mask`.
fn apply_mask(params: &mut Params, mask: &[Vec<bool>]) {
    for ((_, t), m) in params.iter_mut().zip(mask) {
        for (v, &keep) in t.data.iter_mut().zip(m) {
            if !keep {
                *v = 0.0;
            }
        }
    }
}

impl FedDrop {
    /// The gate factors of `round` for [`Trainer::fit_gated`], one per group (the hidden
    /// layers' units in order): `1/keep` on kept units, 0 on dropped ones.
    fn gates(&self, round: usize) -> Vec<f32> {
        self.kept(round)
            .iter()
            .zip(&self.hidden)
            .flat_map(|(units, &h)| {
                let scale = h as f32 / units.len().max(1) as f32;
                let mut g = vec![0.0; h];
                for &u in units {
                    if let Some(x) = g.get_mut(u) {
                        *x = scale;
                    }
                }
                g
            })
            .collect()
    }
}

impl Method for FedDrop {
    fn name(&self) -> &'static str {
        "feddrop"
    }

    /// Each round's dropped units follow from the seed and the round.
    fn stateless(&self) -> bool {
        true
    }

    /// This round's sub-model.
    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let kept = self.kept(round);
        if let Some(masked) = &self.masked {
            let mut params = global.clone();
            apply_mask(&mut params, &masked.kept_values(&kept));
            return Ok(Record::from_params(params)
                .with_sparse(true)
                .with_config(SERVER_ROUND, ConfigValue::Int(round as i64)));
        }
        let mut sub = sub_model(global, &kept)?;
        self.rescale(&mut sub, &kept, true)?;
        Ok(Record::from_params(sub).with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    /// Trains the sub-model as the dense network it is (MLPs), or the full model with the
    /// dropped units gated off.
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        if let Some(masked) = &self.masked {
            let round = instruction
                .config
                .get(SERVER_ROUND)
                .and_then(ConfigValue::as_f64)
                .ok_or(FedError::InvalidSetting {
                    field: "instruction",
                    reason: format!("FedDrop needs `{SERVER_ROUND}` to know the dropped units"),
                })? as usize;
            let fitted = ctx.trainer.fit_gated(
                &instruction.params,
                &self.gates(round),
                &ctx.data.train,
                ctx.train,
                ctx.seed,
            )?;
            let mut params = fitted.params;
            apply_mask(&mut params, &masked.kept_values(&self.kept(round)));
            let mut reply = Record::from_params(params)
                .with_num_examples(fitted.examples as u64)
                .with_sparse(true);
            reply.metrics.insert("train_loss".into(), fitted.loss);
            return Ok(reply);
        }
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
        let layout = match self.masked {
            Some(_) => global.layout(),
            None => self.sub_layout(global),
        };
        reply.params.check_layout(&layout)?;
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
        if let Some(masked) = &self.method.masked {
            let mask = masked.kept_values(&kept);
            let mut next = global.clone();
            for (((_, n), (_, m)), keep) in next.iter_mut().zip(mean.iter()).zip(&mask) {
                for ((x, y), &k) in n.data.iter_mut().zip(&m.data).zip(keep) {
                    if k {
                        *x = *y;
                    }
                }
            }
            return Ok(Aggregate::Replace(next));
        }
        self.method.rescale(&mut mean, &kept, false)?;
        let mut next = global.clone();
        scatter_sub_model(&mut next, &mean, &kept)?;
        Ok(Aggregate::Replace(next))
    }
}
