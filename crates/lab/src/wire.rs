//! The names a model's tensors carry outside fedfuse: torchvision's for its ResNets
//! (`layer1.0.conv1.weight`), so that a stock PyTorch ClientApp, strategy or `load_state_dict`
//! on `torchvision.models.resnet18` finds them by name; the layer list's (`4.conv1.weight`)
//! otherwise. Inside fedfuse a model always holds the list's names.

use std::collections::HashMap;

use fedfuse_core::flower::FlowerContent;
use fedfuse_core::{ModelSpec, Params, Record, TorchvisionNames};

/// The two-way map between a model's list names and the names it carries outside.
#[derive(Clone, Debug, Default)]
pub struct WireNames {
    outside: HashMap<String, String>,
    inside: HashMap<String, String>,
}

impl WireNames {
    /// The names of `spec`'s tensors under `names` (none: the list's own, unchanged).
    pub fn of(spec: &ModelSpec, names: Option<&TorchvisionNames>) -> Self {
        let Some(names) = names else {
            return Self::default();
        };
        let pairs: Vec<(String, String)> = spec
            .param_shapes()
            .into_iter()
            .filter_map(|s| Some((s.name.clone(), names.torch_name(&s.name)?)))
            .collect();
        Self {
            inside: pairs.iter().map(|(l, t)| (t.clone(), l.clone())).collect(),
            outside: pairs.into_iter().collect(),
        }
    }

    /// `params` under the outside names (tensors the model does not hold keep theirs).
    pub fn to_outside(&self, params: Params) -> fedfuse_core::Result<Params> {
        params.renamed(|n| self.outside.get(n).cloned())
    }

    /// `params` under the list's names, from the outside names or the list's own.
    pub fn to_inside(&self, params: Params) -> fedfuse_core::Result<Params> {
        params.renamed(|n| self.inside.get(n).cloned())
    }

    /// A record as Flower content, its tensors under the outside names.
    pub fn outgoing(&self, mut record: Record) -> fedfuse_core::Result<FlowerContent> {
        record.params = self.to_outside(record.params)?;
        record.to_flower()
    }

    /// A record from Flower content, its tensors under the list's names.
    pub fn incoming(&self, content: &FlowerContent) -> fedfuse_core::Result<Record> {
        let mut record = Record::from_flower(content)?;
        record.params = self.to_inside(record.params)?;
        Ok(record)
    }
}
