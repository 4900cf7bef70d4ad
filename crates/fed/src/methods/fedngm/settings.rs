//! FedNGM's and FedNGR's settings (`[method] name = "fedngm"` / `"fedngr"`): the NGM
//! tables are read over FedNGM's own defaults, and checked once.

use fedfuse_core::Params;
use fedfuse_fuse::GraphRecovery;
use fedfuse_train::{BlockAggregate, NgmConfig, PathNorm, SampleConfig, SampleNoise};
use serde::{Deserialize, Serialize};

use crate::{FedError, Result};
/// Which model family is federated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FedNgmVariant {
    /// FedNGM: client graphs, consensus graph, graph-constrained NGMs.
    #[default]
    Ngm,
    /// FedNGR: neural graph revealers (complete graph, sparsity penalty); the global graph is
    /// read off the global weights.
    Ngr,
}

/// Who draws the distillation samples from a client's model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleSite {
    /// The client, with Algorithm 3 as written (first feature from its own rows), and uploads
    /// the samples with its model.
    #[default]
    Client,
    /// The server, from the client's model and per-unit summaries (means, ranges) the client
    /// sends instead: no value of any row leaves the client, and the first feature is drawn
    /// uniformly over its range (the reference code's choice).
    Server,
}

/// How client models are weighted in the averaged outputs the global model is distilled onto.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientWeighting {
    /// `a_c = 1 / C`.
    #[default]
    Uniform,
    /// `a_c = n_c / sum n`.
    Examples,
}

/// How a client recovers its feature graph (see [`fedfuse_fuse::recover_graph`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GraphSettings {
    /// Graphical-lasso penalty on the unit correlation matrix.
    pub rho: f64,
    /// Fraction of feature pairs kept as edges.
    pub sparsity: f64,
    /// How a pair of multi-unit features scores from its unit links.
    pub aggregate: BlockAggregate,
}

impl Default for GraphSettings {
    fn default() -> Self {
        let r = GraphRecovery::default();
        GraphSettings {
            rho: r.rho,
            sparsity: r.sparsity,
            aggregate: r.aggregate,
        }
    }
}

impl GraphSettings {
    /// As the graph library's settings.
    pub fn recovery(&self) -> GraphRecovery {
        GraphRecovery {
            rho: self.rho,
            sparsity: self.sparsity,
            aggregate: self.aggregate,
        }
    }
}

/// Settings of a FedNGM run (`[method] name = "fedngm"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedNgmConfig {
    /// FedNGM or FedNGR.
    pub variant: FedNgmVariant,
    /// Client graph recovery (FedNGM only).
    pub graph: GraphSettings,
    /// Local training. Its `hidden` fixes the architecture of every model, the global one
    /// included; its `seed` is derived from [`seed`](Self::seed) per client and round, so a
    /// config file may not set it. Keys left out of a config file take FedNGM's defaults (one
    /// hidden layer of 64, 1000 epochs, lr 0.01), not those of a bare NGM.
    #[serde(
        deserialize_with = "local_over_defaults",
        serialize_with = "serialize_local"
    )]
    pub local: NgmConfig,
    /// The server's distillation. Its architecture is `local.hidden` and its seed derived as
    /// for `local`, so a config file may set neither; missing keys default as for `local`.
    #[serde(
        deserialize_with = "global_over_defaults",
        serialize_with = "serialize_global"
    )]
    pub global: NgmConfig,
    /// Rounds of local training and distillation; rounds after the first warm-start the
    /// clients from the global model. The federation runs two set-up rounds before them.
    pub rounds: usize,
    /// Samples drawn from each client's model per round.
    pub samples_per_client: usize,
    /// Who draws them.
    pub sample_at: SampleSite,
    /// Sampling (Algorithm 3). With `sample_at = "server"`, `first` is always `uniform`. The
    /// default noise is `residual` (each real value strays from its conditional mean by the
    /// model's residual spread), not the reference code's 5% relative noise, whose samples
    /// are far narrower than the data, so a model distilled on them extrapolates on real rows.
    /// `gibbs_sweeps` (0 by default, as Algorithm 3) redraws every feature from its full
    /// conditional, the spread `residual` noise describes. Keys left out of a config file
    /// take these defaults.
    #[serde(deserialize_with = "sample_over_defaults")]
    pub sample: SampleConfig,
    /// Copies of each sample added to the distillation inputs, each with one feature (drawn
    /// at random) set to the samples' mean, with the averaged outputs at the copy as its
    /// target. Inference starts an unknown feature at its mean and moves it from there, so
    /// the global model is then fitted where it will be read, not only on the samples.
    #[serde(skip_serializing_if = "is_zero")]
    pub masked_copies: usize,
    /// Weights of the client models in the distillation targets.
    pub weighting: ClientWeighting,
    /// Weight of the reconstruction loss on public rows (1 when not given). Setting it
    /// without public rows is an error, not a silent no-op.
    pub gamma: Option<f64>,
    /// FedNGR: fraction of feature pairs read off the global weights as edges.
    pub ngr_sparsity: f64,
    /// Seeds every random choice of the run. In a run config the run's `seed` replaces it.
    pub seed: u64,
}

/// FedNGM's NGM training defaults: one hidden layer of 64, 1000 full-batch epochs at lr
/// 0.01 (the reference code's two layers of 20 at lr 0.001 for 1200 epochs underfit here),
/// and the paper's raw path product with `lambda` 0.01 rather than the reference code's
/// row-normalised one at 1. Under row normalisation a penalty term is a path's *share* of its
/// input's mass, which a few hub outputs with large weights dilute; the other outputs are
/// then pushed to constants and predict the marginal mean (measured on the synthetic GGM:
/// one to four of eight features per model, docs/EXPERIMENTS.md).
pub(crate) fn fedngm_ngm_defaults() -> NgmConfig {
    NgmConfig {
        hidden: vec![64],
        epochs: 1000,
        lr: 1e-2,
        lambda: 0.01,
        path: PathNorm::Raw,
        ..NgmConfig::default()
    }
}

/// Keys of an [`NgmConfig`] that FedNGM sets itself: every model's architecture is
/// `local.hidden`, and every seed is derived from the run's.
const DERIVED_KEYS: [(&str, &str); 2] = [
    (
        "hidden",
        "the global model has the local models' architecture: set `local.hidden`",
    ),
    (
        "seed",
        "seeds are derived from the run's `seed` per client and round",
    ),
];

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Bound on [`FedNgmConfig::masked_copies`]: the distillation holds `1 + copies` times the
/// samples in memory.
const MAX_MASKED_COPIES: usize = 16;

/// FedNGM's sampling defaults: residual noise, no Gibbs sweeps.
fn fedngm_sample_defaults() -> SampleConfig {
    SampleConfig {
        noise: SampleNoise::Residual,
        ..SampleConfig::default()
    }
}

fn local_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<NgmConfig, D::Error> {
    over_defaults(deserializer, fedngm_ngm_defaults(), &DERIVED_KEYS[1..])
}

fn global_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<NgmConfig, D::Error> {
    over_defaults(deserializer, fedngm_ngm_defaults(), &DERIVED_KEYS)
}

fn sample_over_defaults<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<SampleConfig, D::Error> {
    over_defaults(deserializer, fedngm_sample_defaults(), &[])
}

fn serialize_local<S: serde::Serializer>(
    cfg: &NgmConfig,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serialize_without(cfg, &DERIVED_KEYS[1..], serializer)
}

fn serialize_global<S: serde::Serializer>(
    cfg: &NgmConfig,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    serialize_without(cfg, &DERIVED_KEYS, serializer)
}

/// Writes an [`NgmConfig`] without the keys FedNGM derives, so a written config reads back.
fn serialize_without<S: serde::Serializer>(
    cfg: &NgmConfig,
    derived: &[(&str, &str)],
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::Error;
    let mut map = match serde_json::to_value(cfg) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(S::Error::custom("cannot lay out the NGM settings")),
    };
    for (key, _) in derived {
        map.remove(*key);
    }
    map.serialize(serializer)
}

/// Reads settings whose missing keys come from FedNGM's `defaults`; unknown keys and the
/// `refused` ones (with why) are errors.
fn over_defaults<'de, D: serde::Deserializer<'de>, T: Serialize + serde::de::DeserializeOwned>(
    deserializer: D,
    defaults: T,
    refused: &[(&str, &str)],
) -> std::result::Result<T, D::Error> {
    use serde::de::Error;
    let given = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    if let Some((key, why)) = refused.iter().find(|(k, _)| given.contains_key(*k)) {
        return Err(D::Error::custom(format!(
            "`{key}` cannot be set here: {why}"
        )));
    }
    let mut merged = match serde_json::to_value(defaults) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => return Err(D::Error::custom("cannot lay out the defaults")),
    };
    merged.extend(given);
    serde_json::from_value(serde_json::Value::Object(merged)).map_err(D::Error::custom)
}

impl Default for FedNgmConfig {
    fn default() -> Self {
        let ngm = fedngm_ngm_defaults();
        FedNgmConfig {
            variant: FedNgmVariant::Ngm,
            graph: GraphSettings::default(),
            local: ngm.clone(),
            global: ngm,
            rounds: 1,
            samples_per_client: 2000,
            sample_at: SampleSite::Client,
            sample: fedngm_sample_defaults(),
            masked_copies: 0,
            weighting: ClientWeighting::Uniform,
            gamma: None,
            ngr_sparsity: 1.0 / 3.0,
            seed: 0,
        }
    }
}

impl FedNgmConfig {
    /// Checks the settings that the parts do not check themselves. Errors name the key
    /// within the table ([`FedError::MethodSetting`]: `method.rounds` in a run config; the
    /// FedNGM experiment's `[fedngm]` names its own table).
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(FedError::MethodSetting { field, reason });
        if self.rounds == 0 {
            return bad("rounds", "0 rounds; use at least 1".into());
        }
        if self.samples_per_client == 0 {
            return bad(
                "samples_per_client",
                "0 samples: the global model would have nothing to learn from".into(),
            );
        }
        if self.masked_copies > MAX_MASKED_COPIES {
            return bad(
                "masked_copies",
                format!(
                    "{} copies of every sample; use at most {MAX_MASKED_COPIES} (each copy \
                     adds the whole sample set to the distillation)",
                    self.masked_copies
                ),
            );
        }
        if let Some(gamma) = self.gamma.filter(|g| !(g.is_finite() && *g >= 0.0)) {
            return bad("gamma", format!("{gamma} is not >= 0"));
        }
        if !(0.0..=1.0).contains(&self.ngr_sparsity) {
            return bad(
                "ngr_sparsity",
                format!("{} is not a fraction in [0, 1]", self.ngr_sparsity),
            );
        }
        if self.variant == FedNgmVariant::Ngr
            && (self.local.path != PathNorm::Raw || self.global.path != PathNorm::Raw)
        {
            return bad(
                "local.path",
                "FedNGR needs path = \"raw\" in both [local] and [global]: with the row-normalised path matrix the \
                 sparsity penalty routes every input to one output and the graph reads out as \
                 a star"
                    .into(),
            );
        }
        self.local.check()?;
        self.global.check()?;
        Ok(())
    }

    /// Rounds of a whole run: statistics, graphs, then [`rounds`](Self::rounds) model rounds.
    pub fn stages(&self) -> usize {
        2 + self.rounds
    }
}

/// FedNGR's settings as written under `[method] name = "fedngr"`: a [`FedNgmConfig`] whose
/// `variant` is `ngr`; every other key defaults as for FedNGM (raw paths included, which
/// FedNGR needs).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(transparent)]
pub struct FedNgrConfig(pub FedNgmConfig);

impl<'de> Deserialize<'de> for FedNgrConfig {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        use serde_json::Value;
        let mut given = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        match given.get("variant") {
            None => {
                given.insert("variant".into(), Value::from("ngr"));
            }
            Some(v) if v == "ngr" => {}
            Some(v) => {
                return Err(D::Error::custom(format!(
                    "`variant = {v}` under name = \"fedngr\": FedNGR is variant \"ngr\"; \
                     use name = \"fedngm\" for the other"
                )));
            }
        }
        serde_json::from_value(Value::Object(given))
            .map(FedNgrConfig)
            .map_err(D::Error::custom)
    }
}

/// Client models paired with their averaging weights `a_c` (unnormalised).
pub(crate) fn member_weights<'a>(
    locals: &'a [Params],
    examples: &[usize],
    weighting: ClientWeighting,
) -> Vec<(&'a Params, f64)> {
    locals
        .iter()
        .zip(examples)
        .map(|(p, &n)| {
            let a = match weighting {
                ClientWeighting::Uniform => 1.0,
                ClientWeighting::Examples => n as f64,
            };
            (p, a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_ngm_keys_take_fedngm_defaults_and_unknown_keys_fail() {
        let cfg: FedNgmConfig =
            serde_json::from_str(r#"{"local": {"lambda": 0.1}, "rounds": 2}"#).unwrap();
        assert_eq!(cfg.local.lambda, 0.1);
        assert_eq!(cfg.local.hidden, vec![64]);
        assert_eq!(cfg.local.epochs, 1000);
        assert_eq!(cfg.global, fedngm_ngm_defaults());
        assert_eq!((cfg.global.path, cfg.global.lambda), (PathNorm::Raw, 0.01));
        assert_eq!(cfg.rounds, 2);
        let err = serde_json::from_str::<FedNgmConfig>(r#"{"local": {"lamda": 0.1}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lamda"), "{err}");
        // A partial sampling table keeps FedNGM's residual noise.
        let cfg: FedNgmConfig = serde_json::from_str(r#"{"sample": {"gibbs_sweeps": 3}}"#).unwrap();
        assert_eq!(cfg.sample.gibbs_sweeps, 3);
        assert_eq!(cfg.sample.noise, SampleNoise::Residual);
        assert!(serde_json::from_str::<FedNgmConfig>(r#"{"sample": {"sweeps": 3}}"#).is_err());
    }

    #[test]
    fn fedngr_defaults_to_its_variant_and_raw_paths() {
        let ngr: FedNgrConfig = serde_json::from_str(r#"{"local": {"lambda": 0.05}}"#).unwrap();
        assert_eq!(ngr.0.variant, FedNgmVariant::Ngr);
        assert_eq!(ngr.0.local.path, PathNorm::Raw);
        assert_eq!(ngr.0.global.path, PathNorm::Raw);
        assert_eq!(ngr.0.local.lambda, 0.05);
        ngr.0.check().unwrap();
        let err = serde_json::from_str::<FedNgrConfig>(r#"{"variant": "ngm"}"#).unwrap_err();
        assert!(err.to_string().contains("fedngm"), "{err}");
        // What it writes, it reads back.
        let again: FedNgrConfig =
            serde_json::from_str(&serde_json::to_string(&ngr).unwrap()).unwrap();
        assert_eq!(again, ngr);
    }
}
