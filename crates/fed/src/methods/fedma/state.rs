//! What FedMA keeps between rounds: its progress through a pass, the fused layers so far,
//! and each client's model within the pass; saved for a checkpoint and checked when loaded.

use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, Params, Record};
use serde::{Deserialize, Serialize};

use super::{BUILT, CLIENT, FedMa};
use crate::{FedError, Result};

/// Where a run of FedMA stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Progress {
    /// Passes completed.
    pub(super) passes: usize,
    /// Stage of the next round within the current pass.
    pub(super) stage: usize,
    /// The fused width of each matched layer of the current pass so far.
    pub(super) widths: Vec<usize>,
    /// Client -> matched layer -> local unit -> fused unit, in the current pass.
    pub(super) current: BTreeMap<usize, Vec<Vec<usize>>>,
    /// The same for the last completed pass (each client's part of the global model).
    pub(super) last: BTreeMap<usize, Vec<Vec<usize>>>,
}

impl FedMa {
    pub(super) fn store(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<usize, Params>>> {
        self.models.lock().map_err(|_| FedError::MethodState {
            method: "fedma",
            reason: "a client panicked while storing its model",
        })
    }

    pub(super) fn kept_model(&self, client: usize) -> Result<Option<Params>> {
        Ok(self.store()?.get(&client).cloned())
    }

    pub(super) fn keep_model(&self, client: usize, state: Option<Params>) -> Result<()> {
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
    pub(super) fn state(&self) -> Result<Record> {
        let json = serde_json::to_string(&self.progress).map_err(|source| FedError::SaveState {
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
    }

    pub(super) fn restore(&mut self, state: Record) -> Result<()> {
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
        // The fused groups at their widths (a block's norm after its last convolution is fused
        // with the stream, before the convolution itself: the widths come from the groups).
        let layers = self.layers_at(&p.widths, None);
        let layout = self.view.layout(&layers).map_err(|e| e.to_string())?;
        let fused: Vec<&String> = self.stages[..p.stage].iter().flatten().collect();
        if let Some(missing) = fused.iter().find(|n| built.get(n).is_none()) {
            return Err(format!(
                "fused tensor `{missing}` of the {} stages done is missing",
                p.stage
            ));
        }
        for (name, t) in built.iter() {
            if !fused.contains(&&name.to_string()) {
                return Err(format!(
                    "fused tensor `{name}` is not one of the {} stages done",
                    p.stage
                ));
            }
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
            if self.group_width(built, g) != Some(w) {
                return Err(format!(
                    "fused group {g} (model.layers[{}]) is missing or not {w} units wide",
                    self.groups[g].layer
                ));
            }
        }
        built.check_finite().map_err(|e| e.to_string())
    }
}
