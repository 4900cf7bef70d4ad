//! A model as the matching methods on layer lists see it (FedMA, and PFNM, GPI-FNM and weight
//! matching on anything but an MLP): its layer list ([`ModelSpec::as_sequential`]), read at
//! whatever widths a model's tensors hold, under the list's tensor names (`{i}.weight`).

use fedfuse_core::layers::{self, FeatureShape, LayerSpec, UnitUses};
use fedfuse_core::{ModelSpec, ParamShape, Params};
use fedfuse_fuse::{matchable, permutable, select_units, vit_groups, vit_part};

/// What a matcher can follow in a list: its units and the layer that writes the logits.
type Units = fn(&[usize], &[LayerSpec]) -> fedfuse_fuse::Result<(Vec<UnitUses>, usize)>;
use fedfuse_train::Trainer;

use super::in_method;
use crate::Result;

/// The clients' model as a layer list whose units matching can follow (checked).
#[derive(Clone, Debug)]
pub(crate) struct ListView {
    /// Shape of one sample.
    pub(crate) input: Vec<usize>,
    /// The list at the clients' widths.
    pub(crate) layers: Vec<LayerSpec>,
    /// The model's own tensor names and the list's, in the same order.
    native: Vec<String>,
    listed: Vec<String>,
    /// Matched layers (every convolution and linear layer below the output layer).
    pub(crate) matched: usize,
    /// Index of the output layer in the list.
    pub(crate) output: usize,
}

impl ListView {
    /// The view of `spec`; refused, naming the layer, when matching cannot follow its units.
    pub(crate) fn of(spec: &ModelSpec) -> Result<Self> {
        Self::checked(spec, matchable)
    }

    /// The view of a matcher that keeps the widths (weight matching): its units are the
    /// list's permutation groups, residual streams included.
    pub(crate) fn fixed(spec: &ModelSpec) -> Result<Self> {
        Self::checked(spec, permutable)
    }

    fn checked(spec: &ModelSpec, units: Units) -> Result<Self> {
        let (input, layers) = match spec.as_sequential() {
            ModelSpec::Sequential { input, layers } => (input, layers),
            ModelSpec::Mlp { .. } | ModelSpec::LeNet5 { .. } => (Vec::new(), Vec::new()),
        };
        let (uses, output) = units(&input, &layers).map_err(in_method)?;
        let names = |s: &ModelSpec| -> Vec<String> {
            s.param_shapes().into_iter().map(|p| p.name).collect()
        };
        let list = ModelSpec::sequential(&input, layers.clone());
        Ok(Self {
            native: names(spec),
            listed: names(&list),
            matched: uses.len(),
            output,
            input,
            layers,
        })
    }

    /// `params` under the list's names (a model in the spec's own names is renamed in order).
    pub(crate) fn listed(&self, params: &Params) -> Result<Params> {
        if params.names() == self.native.as_slice() && self.native != self.listed {
            let mut out = Params::new();
            for (name, (_, t)) in self.listed.iter().zip(params.iter()) {
                out.push(name.clone(), t.shape.clone(), t.data.clone())?;
            }
            return Ok(out);
        }
        Ok(params.clone())
    }

    /// `params` (list names, the clients' widths) under the model's own names, for the
    /// clients' trainer.
    pub(crate) fn native(&self, params: &Params) -> Result<Params> {
        if params.names() == self.listed.as_slice() && self.native != self.listed {
            let mut out = Params::new();
            for (name, (_, t)) in self.native.iter().zip(params.iter()) {
                out.push(name.clone(), t.shape.clone(), t.data.clone())?;
            }
            return Ok(out);
        }
        Ok(params.clone())
    }

    /// The list at the widths `params` holds ([`layers::at_widths`]; the clients' where a
    /// weight is absent), and its permutation groups.
    pub(crate) fn at_widths(&self, params: &Params) -> Result<(Vec<LayerSpec>, Vec<UnitUses>)> {
        let layers = layers::at_widths(&self.layers, |n| {
            params.get(n).and_then(|t| t.shape.first().copied())
        });
        let uses = layers::permutation_groups(&self.input, &layers)?;
        Ok((layers, uses))
    }

    /// The tensors of `layers`, in order.
    pub(crate) fn layout(&self, layers: &[LayerSpec]) -> Result<Vec<ParamShape>> {
        Ok(layers::chain(FeatureShape::of(&self.input)?, layers)?.1)
    }

    /// The part of `global` (list names, or the model's own at the clients' widths) a client
    /// matched to the fused units `picks` (per matched layer, local unit -> fused unit) runs:
    /// those units, in its own order. Without `picks` (a client not in the last fusion), the
    /// first units of each layer, as many as the clients' widths.
    pub(crate) fn part(&self, global: &Params, picks: Option<&[Vec<usize>]>) -> Result<Params> {
        if self.layers.iter().any(LayerSpec::is_transformer) {
            return self.vit_part(global, picks);
        }
        let mut part = self.listed(global)?;
        let widths: Vec<usize> = layers::permutation_groups(&self.input, &self.layers)?
            .iter()
            .map(|u| u.units)
            .collect();
        for (g, &width) in widths.iter().enumerate() {
            let (_, uses) = self.at_widths(&part)?;
            let kept = match picks.and_then(|p| p.get(g)) {
                Some(a) if a.iter().all(|&u| u < uses[g].units) => a.clone(),
                _ => (0..width.min(uses[g].units)).collect(),
            };
            select_units(&mut part, &uses[g], &kept)?;
        }
        Ok(part)
    }

    /// [`Self::part`] of a ViT: its groups are `fedfuse_fuse::vit_groups`' (the stream, per
    /// block its query-key, value and MLP groups), whose units a client takes in its own
    /// order; the first units of each without `picks`.
    fn vit_part(&self, global: &Params, picks: Option<&[Vec<usize>]>) -> Result<Params> {
        let global = self.listed(global)?;
        let fused = layers::at_widths(&self.layers, |n| {
            global.get(n).and_then(|t| t.shape.first().copied())
        });
        let own = vit_groups(&self.layers).map_err(in_method)?;
        let picks: Vec<Vec<usize>> = own
            .iter()
            .enumerate()
            .map(|(g, group)| match picks.and_then(|p| p.get(g)) {
                Some(a) if a.len() == group.units => a.clone(),
                _ => (0..group.units).collect(),
            })
            .collect();
        vit_part(&fused, &global, &picks).map_err(in_method)
    }

    /// The model at the widths `params` holds.
    pub(crate) fn spec_at(&self, params: &Params) -> Result<ModelSpec> {
        let (layers, _) = self.at_widths(params)?;
        Ok(ModelSpec::sequential(&self.input, layers))
    }

    /// A trainer for the model at the widths `params` holds.
    pub(crate) fn trainer_for(&self, params: &Params) -> Result<Trainer> {
        Ok(Trainer::new(self.spec_at(params)?)?)
    }
}
