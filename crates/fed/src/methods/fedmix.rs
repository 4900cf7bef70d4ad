//! A Gaussian-mixture prior over client models (fedsparse-em, Appendix J.2): `K` server models;
//! each round a client starts from the component most responsible for its last model, and the
//! server runs one EM step (responsibilities from `lambda/2 ||w_s - w_k||^2`, then eq. 52).
//! The global model of a round is the component with the largest responsibility; every
//! component and their uniform softmax ensemble are evaluated too. `K = 1` is FedAvg.

use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_data::Dataset;
use fedfuse_fuse::{GaussianMixture, MixtureConfig};
use fedfuse_train::{MixturePrior, Trainer};
use serde::{Deserialize, Serialize};

use super::{BuildContext, in_method};
use crate::method::{SERVER_ROUND, standard_fit};
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result};

/// FedMix's settings (`[method] name = "fedmix"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FedMixSettings {
    /// Number of server models.
    pub components: usize,
    /// Precision of each component (larger: harder assignments).
    pub lambda: f64,
    /// Learn the mixing weights instead of keeping them equal.
    pub learn_weights: bool,
    /// Clients train under the mixture prior itself (fedsparse-em eq. 48: the loss gains
    /// `-log sum_k pi_k exp(-lambda/2 ||w - w_k||^2)`), so every instruction carries all K
    /// centres. Off: clients start from their component and train freely (hard EM).
    #[serde(skip_serializing_if = "is_false")]
    pub mixture_term: bool,
    /// Precision of the clients' mixture term (default: `lambda`). With one precision for
    /// both, a `lambda` large enough to separate populations pulls as hard as FedProx's mu
    /// would at that value, which plain SGD cannot follow (mu = 100 at lr 0.05 diverges).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_lambda: Option<f64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for FedMixSettings {
    fn default() -> Self {
        Self {
            components: 2,
            lambda: 1.0,
            learn_weights: false,
            mixture_term: false,
            client_lambda: None,
        }
    }
}

impl FedMixSettings {
    fn mixture(&self) -> MixtureConfig {
        MixtureConfig {
            lambda: self.lambda,
            learn_weights: self.learn_weights,
        }
    }

    /// Checks the settings.
    pub fn check(&self) -> Result<()> {
        if self.components == 0 {
            return Err(FedError::MethodSetting {
                field: "components",
                reason: "at least one component".into(),
            });
        }
        self.mixture().check().map_err(in_method)?;
        match (self.mixture_term, self.client_lambda) {
            (false, Some(_)) => Err(FedError::MethodSetting {
                field: "client_lambda",
                reason: "weighs the clients' mixture term; set mixture_term = true".into(),
            }),
            (true, Some(lambda)) if !(lambda.is_finite() && lambda > 0.0) => {
                Err(FedError::MethodSetting {
                    field: "client_lambda",
                    reason: format!("{lambda}: must be a positive number"),
                })
            }
            _ => Ok(()),
        }
    }

    /// FedMix (settings checked by [`FedMixSettings::check`]).
    pub fn build(&self, _ctx: &BuildContext) -> Result<FedMix> {
        let mix = FedMix::new(self.components, self.mixture());
        Ok(if self.mixture_term {
            mix.with_mixture_term(self.client_lambda.unwrap_or(self.lambda))
        } else {
            mix
        })
    }
}

/// FedAvg's clients under a `K`-component mixture prior.
#[derive(Clone, Debug)]
pub struct FedMix {
    /// Number of server models.
    pub components: usize,
    /// Mixture settings (`lambda`, learned mixing weights).
    pub config: MixtureConfig,
    mixture: Option<GaussianMixture>,
    /// Precision of the clients' mixture term, when they train under it.
    client_lambda: Option<f64>,
    /// Client -> component it starts from.
    assigned: BTreeMap<usize, usize>,
    totals: Vec<f64>,
}

impl FedMix {
    /// A mixture of `components` (at least 1) server models, with checked settings
    /// ([`FedMixSettings::check`]).
    pub fn new(components: usize, config: MixtureConfig) -> Self {
        Self {
            components,
            config,
            mixture: None,
            client_lambda: None,
            assigned: BTreeMap::new(),
            totals: Vec::new(),
        }
    }

    /// Clients train under the mixture prior with precision `lambda` (positive, eq. 48).
    pub fn with_mixture_term(mut self, lambda: f64) -> Self {
        self.client_lambda = Some(lambda);
        self
    }
}

/// Prefix of the centres an instruction carries for the clients' mixture term.
const CENTRE: &str = "mixture.";
/// Config key prefix of their log mixing weights.
const LOG_WEIGHT: &str = "mixture_log_weight.";

impl FedMix {
    /// Client -> the component it starts the next round from.
    pub fn assignments(&self) -> &BTreeMap<usize, usize> {
        &self.assigned
    }

    /// The server models (after the first round).
    pub fn centres(&self) -> Option<&[Params]> {
        self.mixture.as_ref().map(GaussianMixture::centres)
    }
}

impl Method for FedMix {
    fn name(&self) -> &'static str {
        "fedmix"
    }

    /// The centres (`c{k}/NAME`), exact `ln pi_k` and last totals, and each client's
    /// component (as JSON).
    fn save_state(&self) -> Option<Result<Record>> {
        let save = || -> Result<Record> {
            let mut r = Record::default();
            let Some(m) = &self.mixture else {
                return Ok(r);
            };
            for (k, c) in m.centres().iter().enumerate() {
                for (name, t) in c.iter() {
                    r.params
                        .push(format!("c{k}/{name}"), t.shape.clone(), t.data.clone())?;
                }
            }
            for (k, l) in m.log_weights().iter().enumerate() {
                r.metrics.insert(format!("log_weight.{k}"), *l);
            }
            for (k, t) in self.totals.iter().enumerate() {
                r.metrics.insert(format!("total.{k}"), *t);
            }
            let assigned =
                serde_json::to_string(&self.assigned).map_err(|source| FedError::SaveState {
                    what: "FedMix's assignments",
                    source,
                })?;
            r.config
                .insert("assigned".into(), ConfigValue::Str(assigned));
            Ok(r)
        };
        Some(save())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("mixture state: {why}"),
        };
        if state.params.is_empty() {
            self.mixture = None;
            self.assigned.clear();
            self.totals.clear();
            return Ok(());
        }
        let mut centres: Vec<Params> = vec![Params::new(); self.components];
        for (name, t) in state.params.iter() {
            let (k, n) = name
                .strip_prefix('c')
                .and_then(|rest| rest.split_once('/'))
                .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n)))
                .filter(|(k, _)| *k < self.components)
                .ok_or_else(|| bad(format!("unexpected tensor `{name}`")))?;
            centres[k].push(n, t.shape.clone(), t.data.clone())?;
        }
        let series = |prefix: &str| -> Result<Vec<f64>> {
            (0..self.components)
                .map(|k| {
                    state
                        .metrics
                        .get(&format!("{prefix}.{k}"))
                        .copied()
                        .ok_or_else(|| bad(format!("no {prefix}.{k}")))
                })
                .collect()
        };
        let log_weights = series("log_weight")?;
        self.totals = series("total")?;
        self.mixture = Some(GaussianMixture::from_parts(
            centres,
            log_weights,
            self.config,
        )?);
        self.assigned = match state.config.get("assigned") {
            Some(ConfigValue::Str(json)) => {
                serde_json::from_str(json).map_err(|e| bad(e.to_string()))?
            }
            _ => return Err(bad("no assignments".into())),
        };
        Ok(())
    }

    /// The client's component (before the first aggregation: the global model); with the
    /// mixture term, also every centre and its log weight.
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        let start = match &self.mixture {
            Some(m) => {
                let k = self.assigned.get(&client).copied().unwrap_or(0);
                m.centres().get(k).unwrap_or(global).clone()
            }
            None => global.clone(),
        };
        let mut record = Record::from_params(start);
        if let (Some(m), Some(_)) = (&self.mixture, self.client_lambda) {
            for (k, (c, lw)) in m.centres().iter().zip(m.log_weights()).enumerate() {
                for (name, t) in c.iter() {
                    record.params.push(
                        format!("{CENTRE}{k}.{name}"),
                        t.shape.clone(),
                        t.data.clone(),
                    )?;
                }
                record
                    .config
                    .insert(format!("{LOG_WEIGHT}{k}"), ConfigValue::Float(*lw));
            }
        }
        Ok(record.with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    /// Trains from the received component, under the mixture prior when the instruction
    /// carries its centres.
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let Some(lambda) = self.client_lambda else {
            return standard_fit(instruction, ctx);
        };
        let mut start = Params::new();
        let mut centres: Vec<Params> = Vec::new();
        for (name, t) in instruction.params.iter() {
            let Some(rest) = name.strip_prefix(CENTRE) else {
                start.push(name, t.shape.clone(), t.data.clone())?;
                continue;
            };
            let (k, inner) = rest
                .split_once('.')
                .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n)))
                .filter(|(k, _)| *k < self.components)
                .ok_or_else(|| FedError::BadMessage {
                    from: "server".into(),
                    reason: format!("unexpected tensor `{name}`"),
                })?;
            if centres.len() <= k {
                centres.resize_with(k + 1, Params::new);
            }
            centres[k].push(inner, t.shape.clone(), t.data.clone())?;
        }
        if centres.is_empty() {
            // Round 1: no mixture yet.
            return standard_fit(Record::from_params(start), ctx);
        }
        let log_weights = (0..centres.len())
            .map(|k| instruction.config_f64(&format!("{LOG_WEIGHT}{k}")))
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(|| FedError::BadMessage {
                from: "server".into(),
                reason: "a mixture centre without its log weight".into(),
            })?;
        let prior = MixturePrior {
            centres: &centres,
            log_weights: &log_weights,
            lambda,
        };
        let fitted =
            ctx.trainer
                .fit_mixture(&start, &ctx.data.train, ctx.train, &prior, ctx.seed)?;
        let mut reply =
            Record::from_params(fitted.params).with_num_examples(fitted.examples as u64);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        Ok(reply)
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<(&Params, f64)> = replies
            .iter()
            .map(|r| (&r.record.params, r.record.num_examples as f64))
            .collect();
        if self.mixture.is_none() {
            // Components start at K mutually far client models of the first round.
            let firsts: Vec<&Params> = models.iter().map(|(p, _)| *p).collect();
            self.mixture = Some(GaussianMixture::farthest_point_init(
                &firsts,
                self.components,
                self.config,
            )?);
        }
        let Some(mixture) = self.mixture.as_mut() else {
            return Ok(Aggregate::Keep);
        };
        let step = mixture.em_step(&models)?;
        for r in replies {
            self.assigned
                .insert(r.client, mixture.assign(&r.record.params)?);
        }
        let best = step
            .totals
            .iter()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &v)| {
                if v > bv { (i, v) } else { (bi, bv) }
            })
            .0;
        self.totals = step.totals;
        let global = mixture.centres()[best].clone();
        Ok(Aggregate::Replace(global))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        let total: f64 = self.totals.iter().sum();
        self.totals
            .iter()
            .enumerate()
            .map(|(k, t)| (format!("share.{k}"), t / total.max(f64::MIN_POSITIVE)))
            .collect()
    }

    fn evaluate(&self, trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        let Some(m) = &self.mixture else {
            return Ok(out);
        };
        for (k, c) in m.centres().iter().enumerate() {
            out.insert(format!("accuracy.{k}"), trainer.evaluate(c, test)?.accuracy);
        }
        let members: Vec<&Params> = m.centres().iter().collect();
        out.insert(
            "ensemble_accuracy".into(),
            trainer.evaluate_ensemble(&members, test)?.accuracy,
        );
        Ok(out)
    }
}
