//! FedMA's settings: the matcher's prior, the passes, and the rules of the run around it.

use fedfuse_core::ModelSpec;
use fedfuse_fuse::{MatchOrder, MatchPrior, PfnmConfig, UnknownKeys, layerwise_stages};
use serde::{Deserialize, Serialize};

use super::FedMa;
use crate::methods::list_view::ListView;
use crate::methods::pfnm::with_keys;
use crate::methods::{BuildContext, in_method};
use crate::{ClientsPerRound, FedError, Result};

/// `[method] name = "fedma"`: the matcher's [`MatchPrior`] (flattened: its keys sit in the
/// method's table, as for `pfnm`) and the number of passes ("FedMA with communication" when
/// more than one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FedMaSettings {
    /// Variances, Beta-process mass, refinement passes and width cap.
    #[serde(flatten)]
    pub prior: MatchPrior,
    /// FedMA passes (its "communication rounds"), each `M + 1` federation rounds for `M`
    /// matched layers; the run stops after the last.
    pub rounds: usize,
    /// Keys of the table no setting took, refused where a table is read.
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownKeys,
}

impl Default for FedMaSettings {
    fn default() -> Self {
        Self {
            prior: MatchPrior::default(),
            rounds: 1,
            unknown: UnknownKeys::default(),
        }
    }
}

/// A FedMA table's keys, for the error on an unknown one.
const FEDMA_KEYS: [&str; 6] = with_keys(MatchPrior::KEYS, ["rounds"]);

impl FedMaSettings {
    /// Reads a FedMA table, refusing a key it does not know.
    pub(crate) fn deserialize_checked<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = Self::deserialize(d)?;
        s.unknown.refuse(&FEDMA_KEYS)?;
        Ok(s)
    }

    pub(super) fn config(&self) -> PfnmConfig {
        PfnmConfig {
            prior: self.prior,
            order: MatchOrder::BottomUp,
            ..PfnmConfig::default()
        }
    }

    /// Checks the settings alone.
    pub fn check(&self) -> Result<()> {
        if self.rounds == 0 {
            return Err(FedError::MethodSetting {
                field: "rounds",
                reason: "give at least one FedMA pass".into(),
            });
        }
        self.config().check().map_err(in_method)
    }

    /// FedMA for `ctx`'s architecture (settings checked by [`Self::check`]): refused, naming
    /// the layer, when its layer list cannot be matched.
    pub fn build(&self, ctx: &BuildContext) -> Result<FedMa> {
        let spec = ctx.spec("FedMA needs the clients' architecture")?;
        FedMa::new(self, spec, ctx.init, ctx.seed)
    }

    /// FedMA's rules for the run around it, checked once where the run is prepared: every
    /// client takes part in every round (each layer is matched over the clients that trained
    /// the layers below it), and the run's `rounds` (at most `max_rounds`) cover every pass on
    /// `spec`.
    pub fn check_run(
        &self,
        clients_per_round: ClientsPerRound,
        clients: usize,
        rounds: usize,
        max_rounds: usize,
        spec: &ModelSpec,
    ) -> Result<()> {
        let every_client = match clients_per_round {
            ClientsPerRound::Count(c) => c == clients,
            ClientsPerRound::Fraction(f) => f >= 1.0,
        };
        if !every_client {
            return Err(FedError::InvalidSetting {
                field: "clients_per_round",
                reason: format!(
                    "FedMA matches each layer over the clients that trained the layers below \
                     it, so every client takes part in every round: set `clients_per_round` = \
                     {clients} (or 1.0)"
                ),
            });
        }
        let per_pass = Self::rounds_per_pass(spec)?;
        // `method.rounds` is the user's: the product saturates rather than wraps.
        let needed = self.rounds.saturating_mul(per_pass);
        if needed > max_rounds {
            return Err(FedError::MethodSetting {
                field: "rounds",
                reason: format!(
                    "{} passes take {per_pass} federation rounds each on this model, above the \
                     limit of {max_rounds} rounds: lower `method.rounds`",
                    self.rounds
                ),
            });
        }
        if rounds < needed {
            return Err(FedError::InvalidSetting {
                field: "rounds",
                reason: format!(
                    "{rounds} is too few for FedMA: each of its `method.rounds` = {} passes \
                     takes {per_pass} federation rounds on this model (one per matched layer, \
                     and one for the output layer); set `rounds` = {needed}",
                    self.rounds
                ),
            });
        }
        Ok(())
    }

    /// Federation rounds one pass takes on `spec`: its permutation groups (one stage each)
    /// plus one; a model FedMA cannot follow (a transformer) is refused, naming the layer.
    pub fn rounds_per_pass(spec: &ModelSpec) -> Result<usize> {
        let view = ListView::of(spec)?;
        let stages = layerwise_stages(&view.input, &view.layers).map_err(in_method)?;
        Ok(stages.len() + 1)
    }
}
