//! Krum and Multi-Krum (Blanchard et al. 2017), as Flower's `Krum` and `MultiKrum`: the
//! replies nearest to the most others are kept (see `fedfuse_fuse::krum_scores`), and the
//! `keep` best are averaged weighted by their examples; `keep = 1` is Krum, which takes the
//! one best reply as it is. Bulyan (El Mhamdi et al. 2018), as Flower's `Bulyan`, on top.

use std::collections::BTreeMap;

use fedfuse_core::Params;
use fedfuse_fuse::{bulyan, krum_select, weighted_mean_params};
use serde::{Deserialize, Serialize};

use super::BuildContext;
use crate::{Aggregate, FedError, Method, Reply, Result};

/// Krum's settings (`[method] name = "krum"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KrumSettings {
    /// Byzantine clients tolerated (`f`): each reply is scored on its `n - f - 2` nearest.
    pub byzantine: usize,
    /// Best-scored replies averaged (Flower's `num_nodes_to_select`); 1 is Krum.
    pub keep: usize,
}

impl Default for KrumSettings {
    fn default() -> Self {
        Self {
            byzantine: 0,
            keep: 1,
        }
    }
}

impl KrumSettings {
    /// Checks `keep`.
    pub fn check(&self) -> Result<()> {
        if self.keep == 0 {
            return Err(FedError::MethodSetting {
                field: "keep",
                reason: "0 keeps no reply; 1 is Krum, more is Multi-Krum".into(),
            });
        }
        Ok(())
    }

    /// Krum (settings checked by [`KrumSettings::check`]).
    pub fn build(&self, _ctx: &BuildContext) -> Result<Krum> {
        Ok(Krum {
            settings: *self,
            chosen: None,
        })
    }
}

/// Krum / Multi-Krum.
#[derive(Clone, Debug)]
pub struct Krum {
    settings: KrumSettings,
    /// The last round's best-scored client.
    chosen: Option<usize>,
}

impl Method for Krum {
    fn name(&self) -> &'static str {
        "krum"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        // Rejected replies can leave fewer than `keep`: keep what there is.
        let keep = self.settings.keep.min(models.len());
        let best = krum_select(&models, self.settings.byzantine, keep)?;
        self.chosen = best.first().map(|&i| replies[i].client);
        if let [only] = best[..] {
            return Ok(Aggregate::Replace(models[only].clone()));
        }
        let weighted: Vec<(&Params, f64)> = best
            .iter()
            .map(|&i| (models[i], replies[i].record.num_examples as f64))
            .collect();
        Ok(Aggregate::Replace(weighted_mean_params(&weighted)?))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.chosen
            .map(|c| BTreeMap::from([("best_client".to_string(), c as f64)]))
            .unwrap_or_default()
    }
}

/// Bulyan's settings (`[method] name = "bulyan"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BulyanSettings {
    /// Byzantine clients tolerated (`f`); a round needs at least `4f + 3` replies.
    pub byzantine: usize,
}

impl BulyanSettings {
    /// Builds Bulyan.
    pub fn build(&self, _ctx: &BuildContext) -> Result<Bulyan> {
        Ok(Bulyan {
            byzantine: self.byzantine,
            skipped: false,
        })
    }
}

/// Bulyan: Multi-Krum keeps `n - 2f` replies, then per coordinate the mean of the `n - 4f`
/// values nearest their median.
#[derive(Clone, Debug)]
pub struct Bulyan {
    byzantine: usize,
    /// Whether the last round had too few replies (fewer than `4f + 3`) and kept the model.
    skipped: bool,
}

impl Method for Bulyan {
    fn name(&self) -> &'static str {
        "bulyan"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        let fused = bulyan(&models, self.byzantine)?;
        self.skipped = fused.is_none();
        // Too few replies: the model stays, as Flower's Bulyan skips the round.
        Ok(fused.map_or(Aggregate::Keep, Aggregate::Replace))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([("skipped".to_string(), f64::from(u8::from(self.skipped)))])
    }
}
