//! PFNM (Yurochkin et al. 2019) and GPI-FNM (Xiao & Cheng) as federated methods.
//!
//! Round 1: every client trains from its own random initialisation and sends its network and
//! class counts; the server matches hidden units across clients ([`fedfuse_fuse::pfnm_fuse`])
//! and the global width may grow. Further rounds (gpi-fnm section 4.3): each client starts from
//! its matched sub-model of the global network (the global units its own units were assigned
//! to, so its width stays fixed), trains, and is matched again.
//!
//! GPI-FNM adds `eps` times the KL cost of eq. (11) to every assignment; with an `eps` grid the
//! server fuses once per candidate and keeps the one most accurate on its validation split
//! (never the test set).

use std::collections::BTreeMap;
use std::sync::Arc;

use fedfuse_core::{ConfigValue, ModelSpec, Params, Record};
use fedfuse_data::Dataset;
use fedfuse_fuse::{
    Fused, MatchOrder, MatchPrior, PfnmConfig, UnknownKeys, pfnm_fuse, pfnm_fuse_layers, sub_model,
};
use fedfuse_train::{Init, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rayon::prelude::*;
use serde::{Deserialize, Deserializer, Serialize};

use super::list_view::ListView;
use super::{BuildContext, in_method};
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

/// The settings of both neuron-matching methods (`[method] name = "pfnm"` or `"gpi-fnm"`):
/// the matcher's [`MatchPrior`] (flattened: its keys sit in the method's table) and what the
/// methods add; `eps` and `eps_grid` are GPI-FNM's alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PfnmSettings {
    /// Variances, Beta-process mass, refinement passes and width cap.
    #[serde(flatten)]
    pub prior: MatchPrior,
    /// GPI-FNM: a fixed coefficient of the KL cost (skips the grid search).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    /// GPI-FNM: candidates for `eps`, tried on the server's validation split; unset is
    /// [`default_eps_grid`] (a GPI-FNM table read from a file always holds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps_grid: Option<Vec<f64>>,
    /// Candidates for `sigma`, tried on the server's validation split each round (with every
    /// `eps` candidate, for GPI-FNM); `sigma` is then unused. `sigma` is an absolute variance,
    /// so the right value depends on how far local training moves the weights: chosen here on
    /// held-out data, never on the test set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sigma_grid: Option<Vec<f64>>,
    /// Which way a deep network's hidden layers are matched: `"top_down"` (the reference
    /// code's) or `"bottom_up"` (every layer on its full fan-in).
    #[serde(skip_serializing_if = "is_top_down")]
    pub order: MatchOrder,
    /// Keys of the table no setting took, refused where a table is read.
    #[serde(flatten, skip_serializing)]
    pub unknown: UnknownKeys,
}

fn is_top_down(order: &MatchOrder) -> bool {
    *order == MatchOrder::TopDown
}

/// Ten values on a multiplicative grid (the paper tries "typically 10 values"), from no KL
/// term up to a KL term that dominates the PFNM cost for unit-scale weights.
pub fn default_eps_grid() -> Vec<f64> {
    vec![0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
}

impl Default for PfnmSettings {
    fn default() -> Self {
        Self {
            prior: MatchPrior::default(),
            eps: None,
            eps_grid: None,
            sigma_grid: None,
            order: PfnmConfig::default().order,
            unknown: UnknownKeys::default(),
        }
    }
}

/// A PFNM table's keys, for the error on an unknown one (GPI-FNM's included).
const PFNM_KEYS: [&str; 7] = with_keys(MatchPrior::KEYS, ["sigma_grid", "order"]);

/// A GPI-FNM table's keys.
const GPI_FNM_KEYS: [&str; 9] = with_keys(PFNM_KEYS, ["eps", "eps_grid"]);

/// `a` followed by `b`: a table's keys from those of its flattened parts.
pub(crate) const fn with_keys<const A: usize, const B: usize, const C: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; C] {
    assert!(A + B == C, "with_keys: the lengths do not add up");
    let mut out = [""; C];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < C {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

impl PfnmSettings {
    /// Reads a PFNM table: GPI-FNM's keys are unknown there, as they always were.
    pub(crate) fn deserialize_pfnm<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Self, D::Error> {
        let s = Self::deserialize(d)?;
        s.unknown.refuse(&PFNM_KEYS)?;
        for (key, given) in [("eps", s.eps.is_some()), ("eps_grid", s.eps_grid.is_some())] {
            if given {
                return Err(serde::de::Error::unknown_field(key, &PFNM_KEYS));
            }
        }
        Ok(s)
    }

    /// Reads a GPI-FNM table with the default grid written out, so that a run's recorded
    /// config names the grid it searched.
    pub fn deserialize_gpi_fnm<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Self, D::Error> {
        let mut s = Self::deserialize(d)?;
        s.unknown.refuse(&GPI_FNM_KEYS)?;
        s.eps_grid.get_or_insert_with(default_eps_grid);
        Ok(s)
    }

    fn config(&self, eps: f64) -> PfnmConfig {
        PfnmConfig {
            prior: self.prior,
            eps,
            order: self.order,
            ..PfnmConfig::default()
        }
    }

    /// Checks that the sigma candidates, if given, are positive variances.
    fn check_sigma_grid(&self) -> Result<()> {
        let Some(grid) = &self.sigma_grid else {
            return Ok(());
        };
        if grid.is_empty() {
            return Err(FedError::MethodSetting {
                field: "sigma_grid",
                reason: "give at least one candidate, or remove it and set `sigma`".into(),
            });
        }
        if let Some(bad) = grid.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
            return Err(FedError::MethodSetting {
                field: "sigma_grid",
                reason: format!("{bad} is not a positive variance"),
            });
        }
        Ok(())
    }

    /// GPI-FNM's `eps`, and its candidates when it is chosen on the validation split.
    fn eps_and_grid(&self) -> (f64, Vec<f64>) {
        match (self.eps, &self.eps_grid) {
            (Some(eps), _) => (eps, Vec::new()),
            (None, Some(grid)) => (0.0, grid.clone()),
            (None, None) => (0.0, default_eps_grid()),
        }
    }

    /// Checks the settings as PFNM's, which has no `eps` or `eps_grid`.
    pub fn check_pfnm(&self) -> Result<()> {
        for (key, given) in [
            ("eps", self.eps.is_some()),
            ("eps_grid", self.eps_grid.is_some()),
        ] {
            if given {
                return Err(FedError::MethodSetting {
                    field: key,
                    reason: "PFNM has no such setting; use name = \"gpi-fnm\"".into(),
                });
            }
        }
        self.check_sigma_grid()?;
        self.config(0.0).check().map_err(in_method)
    }

    /// Checks the settings as GPI-FNM's: a fixed `eps`, or candidates to choose it from.
    pub fn check_gpi_fnm(&self) -> Result<()> {
        if self.eps.is_none()
            && let Some(grid) = &self.eps_grid
        {
            if grid.is_empty() {
                return Err(FedError::MethodSetting {
                    field: "eps_grid",
                    reason: "give at least one candidate, or a single `eps`".into(),
                });
            }
            if let Some(bad) = grid.iter().find(|e| !(e.is_finite() && **e >= 0.0)) {
                return Err(FedError::MethodSetting {
                    field: "eps_grid",
                    reason: format!("{bad} is not a non-negative number"),
                });
            }
        }
        self.check_sigma_grid()?;
        self.config(self.eps_and_grid().0)
            .check()
            .map_err(in_method)
    }

    /// PFNM for `ctx`'s architecture, an MLP (settings checked by
    /// [`PfnmSettings::check_pfnm`]).
    pub fn build_pfnm(&self, ctx: &BuildContext) -> Result<Pfnm> {
        self.build_with_eps((0.0, Vec::new()), ctx)
    }

    /// GPI-FNM for `ctx`'s architecture, an MLP, with `eps` fixed or chosen each round from
    /// `eps_grid` on `ctx.validation` (settings checked by [`PfnmSettings::check_gpi_fnm`]).
    pub fn build_gpi_fnm(&self, ctx: &BuildContext) -> Result<Pfnm> {
        self.build_with_eps(self.eps_and_grid(), ctx)
    }

    fn build_with_eps(&self, (eps, grid): (f64, Vec<f64>), ctx: &BuildContext) -> Result<Pfnm> {
        Pfnm::new(
            self.config(eps),
            (grid, self.sigma_grid.clone().unwrap_or_default()),
            ctx.validation.clone(),
            ctx.spec("neuron matching needs the clients' architecture")?
                .clone(),
            ctx.init,
            ctx.seed,
        )
    }
}

/// Metric key prefix of a reply's per-class example counts (`class_count.3`).
const CLASS_COUNT: &str = "class_count.";

/// PFNM, or GPI-FNM when `eps` is positive or chosen from a grid.
#[derive(Clone, Debug)]
pub struct Pfnm {
    /// Matching hyper-parameters (`config.eps` is GPI-FNM's coefficient; 0 is PFNM).
    pub config: PfnmConfig,
    /// Candidate `eps` values; when not empty, each round keeps the one whose fused model is
    /// most accurate on `validation` (ties: the smaller `eps`).
    pub eps_grid: Vec<f64>,
    /// Candidate `sigma` values, searched with the `eps` candidates (ties: the earlier one).
    pub sigma_grid: Vec<f64>,
    /// The server's validation split (needed with an `eps_grid`).
    pub validation: Option<Arc<Dataset>>,
    /// The clients' architecture (their widths stay fixed across rounds).
    pub spec: ModelSpec,
    /// How clients draw their own starting weights in round 1.
    pub init: Init,
    /// Seed of the server's refinement order.
    pub seed: u64,
    /// The clients' model as a layer list, for anything but an MLP (matched bottom-up over
    /// channels and units: `fedfuse_fuse::pfnm_fuse_layers`).
    view: Option<ListView>,
    /// Client -> hidden layer -> local unit -> global unit, from the last fusion.
    matched: BTreeMap<usize, Vec<Vec<usize>>>,
    /// What the last round reports (chosen eps, global widths).
    report: BTreeMap<String, f64>,
    /// Round 1's replies, until the next aggregate: the clients' ensemble, the reference a
    /// one-shot fusion is measured against.
    first_replies: Vec<Params>,
}

impl Pfnm {
    /// A matching method with checked settings ([`PfnmSettings::check_pfnm`],
    /// [`PfnmSettings::check_gpi_fnm`]); checks what they cannot know: a model whose units
    /// matching can follow (an MLP, a ViT, or a layer list without grouped convolutions,
    /// group and layer norms after a matched layer or residual blocks with group norm,
    /// refused naming the layer), and a validation split when a grid needs one. Models other
    /// than MLPs are matched bottom-up whatever `config.order` says.
    pub fn new(
        config: PfnmConfig,
        (eps_grid, sigma_grid): (Vec<f64>, Vec<f64>),
        validation: Option<Arc<Dataset>>,
        spec: ModelSpec,
        init: Init,
        seed: u64,
    ) -> Result<Self> {
        let view = match spec.mlp_widths() {
            Some(_) => None,
            None => Some(ListView::of(&spec)?),
        };
        let no_validation = validation.as_ref().is_none_or(|v| v.is_empty());
        if !eps_grid.is_empty() && no_validation {
            return Err(FedError::MethodSetting {
                field: "eps_grid",
                reason: "choosing eps needs a server validation split; set \
                         dataset.validation_fraction (e.g. 0.1) or give a single `eps`"
                    .into(),
            });
        }
        if !sigma_grid.is_empty() && no_validation {
            return Err(FedError::MethodSetting {
                field: "sigma_grid",
                reason: "choosing sigma needs a server validation split; set \
                         dataset.validation_fraction (e.g. 0.1) or give a single `sigma`"
                    .into(),
            });
        }
        Ok(Self {
            config,
            eps_grid,
            sigma_grid,
            validation,
            spec,
            init,
            seed,
            view,
            matched: BTreeMap::new(),
            report: BTreeMap::new(),
            first_replies: Vec::new(),
        })
    }

    /// Fuses with every candidate `(sigma, eps)` and keeps the most accurate on the validation
    /// split; returns the fusion and its `(sigma, eps)`.
    fn fuse_best(
        &self,
        models: &[&Params],
        counts: &[Vec<f64>],
        seed: u64,
    ) -> Result<(Fused, (f64, f64))> {
        let fuse = |sigma: f64, eps: f64| -> Result<Fused> {
            let cfg = PfnmConfig {
                prior: MatchPrior {
                    sigma,
                    ..(self.config.clone()).prior
                },
                eps,
                ..self.config.clone()
            };
            let mut rng = StdRng::seed_from_u64(seed);
            let Some(view) = &self.view else {
                return Ok(pfnm_fuse(models, Some(counts), &cfg, &mut rng)?);
            };
            let cfg = PfnmConfig {
                order: MatchOrder::BottomUp,
                ..cfg
            };
            let listed = models
                .iter()
                .map(|m| view.listed(m))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<&Params> = listed.iter().collect();
            let fused = pfnm_fuse_layers(
                &view.input,
                &view.layers,
                &refs,
                Some(counts),
                &cfg,
                &mut rng,
            )?;
            Ok(Fused {
                params: fused.params,
                assignments: fused.assignments,
                timings: Vec::new(),
            })
        };
        let sigmas = if self.sigma_grid.is_empty() {
            vec![self.config.prior.sigma]
        } else {
            self.sigma_grid.clone()
        };
        let epses = if self.eps_grid.is_empty() {
            vec![self.config.eps]
        } else {
            self.eps_grid.clone()
        };
        let Some(validation) = self
            .validation
            .as_ref()
            .filter(|_| sigmas.len() * epses.len() > 1)
        else {
            let (sigma, eps) = (sigmas[0], epses[0]);
            return Ok((fuse(sigma, eps)?, (sigma, eps)));
        };
        let candidates: Vec<(f64, f64)> = sigmas
            .iter()
            .flat_map(|&s| epses.iter().map(move |&e| (s, e)))
            .collect();
        let scored = candidates
            .par_iter()
            .map(|&(sigma, eps)| {
                let fused = fuse(sigma, eps)?;
                let trainer = Trainer::new(self.spec.with_widths_of(&fused.params)?)?;
                let eval = trainer.evaluate(&fused.params, validation)?;
                Ok((sigma, eps, eval.accuracy, fused))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut best: Option<(f64, f64, f64, Fused)> = None;
        for (sigma, eps, acc, fused) in scored {
            // Candidates in grid order (sigma, then eps); a later one must be strictly better,
            // or as good with a smaller eps.
            let better = match &best {
                None => true,
                Some((_, be, ba, _)) => acc > *ba || (acc == *ba && eps < *be),
            };
            if better {
                best = Some((sigma, eps, acc, fused));
            }
        }
        let (sigma, eps, _, fused) = best.ok_or(FedError::MethodSetting {
            field: "eps_grid",
            reason: "empty".into(),
        })?;
        Ok((fused, (sigma, eps)))
    }
}

/// Writes per-class counts into a reply's metrics (what matching methods read to weight
/// the output layer).
pub fn put_class_counts(record: &mut Record, counts: &[usize]) {
    for (k, c) in counts.iter().enumerate() {
        record
            .metrics
            .insert(format!("{CLASS_COUNT}{k}"), *c as f64);
    }
}

/// The client step of the matching methods: train from the received model, or from the
/// client's own `init` draw when the instruction holds none (their first round), and reply
/// with the model, the examples, the loss and the per-class counts.
pub(crate) fn own_init_fit(
    instruction: Record,
    ctx: &ClientContext<'_>,
    init: Init,
) -> Result<Record> {
    let start = if instruction.params.is_empty() {
        init_params(ctx.trainer.spec(), init, ctx.seed)
    } else {
        instruction.params
    };
    let fitted = ctx
        .trainer
        .fit_with(&start, &ctx.data.train, ctx.train, None, ctx.seed)?;
    let mut reply = Record::from_params(fitted.params).with_num_examples(fitted.examples as u64);
    reply.metrics.insert("train_loss".into(), fitted.loss);
    put_class_counts(&mut reply, &ctx.data.train.class_counts());
    Ok(reply)
}

/// Every reply's per-class counts ([`class_counts`]).
pub(crate) fn replies_class_counts(replies: &[Reply], classes: usize) -> Result<Vec<Vec<f64>>> {
    replies.iter().map(|r| class_counts(r, classes)).collect()
}

/// Reads per-class counts (`classes` of them) from a reply's metrics. A reply with none of
/// them (a stock Flower ClientApp sends only `num-examples`) counts its examples as spread
/// evenly over the classes; a reply with only some of them is refused.
pub(crate) fn class_counts(reply: &Reply, classes: usize) -> Result<Vec<f64>> {
    let metrics = &reply.record.metrics;
    let counts: Vec<Option<f64>> = (0..classes)
        .map(|k| metrics.get(&format!("{CLASS_COUNT}{k}")).copied())
        .collect();
    if counts.iter().all(Option::is_none) {
        let even = reply.record.num_examples.max(1) as f64 / classes.max(1) as f64;
        return Ok(vec![even; classes]);
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(k, c)| {
            c.filter(|c| c.is_finite() && *c >= 0.0)
                .ok_or_else(|| FedError::BadReply {
                    client: reply.client,
                    reason: format!(
                        "`{CLASS_COUNT}{k}` is missing or not a count: a reply gives the \
                         counts of all {classes} classes or of none"
                    ),
                })
        })
        .collect()
}

impl Method for Pfnm {
    fn name(&self) -> &'static str {
        if self.config.eps > 0.0 || !self.eps_grid.is_empty() {
            "gpi-fnm"
        } else {
            "pfnm"
        }
    }

    /// Which global unit each client's units joined in the last fusion (later rounds send each
    /// client its matched sub-model), as JSON.
    fn save_state(&self) -> Option<Result<Record>> {
        Some(
            serde_json::to_string(&self.matched)
                .map(|json| Record::default().with_config("matched", ConfigValue::Str(json)))
                .map_err(|source| FedError::SaveState {
                    what: "PFNM's matching",
                    source,
                }),
        )
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("matching state: {why}"),
        };
        self.matched = match state.config.get("matched") {
            Some(ConfigValue::Str(json)) => {
                serde_json::from_str(json).map_err(|e| bad(e.to_string()))?
            }
            _ => return Err(bad("no `matched`".into())),
        };
        Ok(())
    }

    /// Round 1: only the round number (clients start from their own initialisation). Later:
    /// the client's matched sub-model of the global network.
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        let record = if round <= 1 {
            Record::default()
        } else {
            // A client left out of the last fusion (its reply was rejected) takes the first
            // units of each global layer.
            let matched = self.matched.get(&client);
            match &self.view {
                Some(view) => Record::from_params(
                    view.native(&view.part(global, matched.map(Vec::as_slice))?)?,
                ),
                None => {
                    let fallback: Vec<Vec<usize>> = match &self.spec {
                        ModelSpec::Mlp { hidden, .. } => {
                            hidden.iter().map(|&w| (0..w).collect()).collect()
                        }
                        ModelSpec::LeNet5 { .. } | ModelSpec::Sequential { .. } => Vec::new(),
                    };
                    Record::from_params(sub_model(global, matched.unwrap_or(&fallback))?)
                }
            }
        };
        Ok(record.with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        own_init_fit(instruction, ctx, self.init)
    }

    /// Replies have the clients' architecture, whatever the global width has become.
    fn check_reply(&self, _global: &Params, reply: &Record) -> Result<()> {
        reply.params.check_layout(&self.spec.param_shapes())?;
        reply.params.check_finite()?;
        Ok(())
    }

    fn aggregate(
        &mut self,
        round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let counts = replies_class_counts(replies, self.spec.classes())?;
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        self.first_replies = if round == 1 {
            replies.iter().map(|r| r.record.params.clone()).collect()
        } else {
            Vec::new()
        };
        let seed = derive_seed(self.seed, round, usize::MAX);
        let (fused, (sigma, eps)) = self.fuse_best(&models, &counts, seed)?;
        self.matched.clear();
        for (slot, reply) in replies.iter().enumerate() {
            let per_layer = fused
                .assignments
                .iter()
                .map(|layer| layer.get(slot).cloned().unwrap_or_default())
                .collect();
            self.matched.insert(reply.client, per_layer);
        }
        self.report.clear();
        if self.name() == "gpi-fnm" {
            self.report.insert("eps".into(), eps);
        }
        if !self.sigma_grid.is_empty() {
            self.report.insert("sigma".into(), sigma);
        }
        for (l, layer) in fused.assignments.iter().enumerate() {
            let width = layer.iter().flatten().max().map_or(0, |m| m + 1);
            self.report.insert(format!("width.{l}"), width as f64);
        }
        Ok(Aggregate::Replace(fused.params))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.report.clone()
    }

    /// After round 1, the accuracy of the clients' ensemble (their mean predicted
    /// probabilities), `ensemble_accuracy`: what one-shot fusion tries to come near.
    fn evaluate(&self, _trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        if !self.first_replies.is_empty() {
            let members: Vec<&Params> = self.first_replies.iter().collect();
            let clients = Trainer::new(self.spec.clone())?;
            out.insert(
                "ensemble_accuracy".into(),
                clients.evaluate_ensemble(&members, test)?.accuracy,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(metrics: &[(&str, f64)], examples: u64) -> Reply {
        let mut record = Record::default().with_num_examples(examples);
        for (k, v) in metrics {
            record.metrics.insert((*k).into(), *v);
        }
        Reply { client: 3, record }
    }

    #[test]
    fn class_counts_are_read_or_spread_evenly_when_absent() {
        let full = reply(&[("class_count.0", 4.0), ("class_count.1", 6.0)], 10);
        assert_eq!(class_counts(&full, 2).unwrap(), vec![4.0, 6.0]);
        let stock = reply(&[("train_loss", 0.5)], 12);
        assert_eq!(class_counts(&stock, 3).unwrap(), vec![4.0, 4.0, 4.0]);
        let partial = reply(&[("class_count.0", 4.0)], 10);
        let e = class_counts(&partial, 2).unwrap_err().to_string();
        assert!(e.contains("class_count.1") && e.contains("client 3"), "{e}");
        let negative = reply(&[("class_count.0", -1.0), ("class_count.1", 1.0)], 10);
        assert!(class_counts(&negative, 2).is_err());
    }

    #[test]
    fn the_width_cap_is_a_setting_that_reaches_the_matching() {
        let default = PfnmSettings::default();
        assert_eq!(default.config(0.0).prior.max_global, 700);
        // The reference cap is left out of a written config, so old files read the same.
        assert!(
            !serde_json::to_string(&default)
                .unwrap()
                .contains("max_global")
        );
        let capped: PfnmSettings = serde_json::from_str(r#"{"max_global": 150}"#).unwrap();
        assert_eq!(capped.config(0.0).prior.max_global, 150);
        let zero: PfnmSettings = serde_json::from_str(r#"{"max_global": 0}"#).unwrap();
        let err = zero.config(0.0).check().unwrap_err().to_string();
        assert!(err.contains("max_global"), "{err}");
    }
}
