//! Differential privacy around a method, with the semantics of Flower's DP strategy wrappers
//! and `LocalDpMod` (`[privacy]` in a run config):
//!
//! - `central-fixed`: every reply's update from the global model is clipped to L2 norm `C`
//!   over all tensors, the clipped updates are summed and divided by the clients sampled `m`
//!   (not by the replies, so one client moves the model by at most `C / m` however many
//!   replied), and `N(0, (z C / m)^2)` is added to every coordinate. Replies weigh the same
//!   whatever their `num_examples`: a weight a client claims would scale its sensitivity.
//! - `central-adaptive`: the same, with `C` following the `target_quantile` of update norms
//!   (the fraction of updates left unclipped) through a noisy count of clipped replies (Andrew
//!   et al. 2021); the count's noise takes part of the budget, as in Flower. Two departures
//!   from Flower 1.41's wrapper, both towards the paper: `C` moves towards the quantile (Flower
//!   feeds the clipped fraction into the paper's update, so `C` runs away from it), and the
//!   model's noise uses the `C` the round clipped with (Flower's uses the updated one, which
//!   under-noises a round whose `C` shrank).
//! - `local`: each client clips its update to `C` and adds the Gaussian mechanism's noise for
//!   `(epsilon, delta)` at `sensitivity` before replying.
//!
//! Central noise comes from a seeded stream per round, local noise from the client's seed, so
//! a run stays reproducible. An RDP accountant reports ε at `delta` after every round
//! (`dp_epsilon`). Under fixed-size sampling (Flower's) no amplification is claimed: the bound
//! holds however the clients were picked. Under Poisson sampling (`sampling = "poisson"`,
//! each client with probability `q`) the mean's denominator is the expected `q n` whatever the
//! draw (McMahan et al. 2018), every round releases a noised model even when nobody was
//! sampled, and the accountant composes the sampled Gaussian at rate `q`.

use std::collections::BTreeMap;

use fedfuse_core::{Params, Record};
use fedfuse_fuse::dp::{self, ClippedSum, RdpAccountant};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

use super::MethodConfig;
use crate::method::{nest_state, unnest_state};
use crate::{
    Aggregate, ClientContext, FedError, Fold, Method, Reply, Result, Sampling, SimConfig,
    derive_seed,
};

/// Stream of the central noise in [`derive_seed`]'s client slot, apart from every client's
/// and from the methods' own server streams (`usize::MAX`, `usize::MAX - 1`).
const CENTRAL_NOISE_STREAM: usize = usize::MAX - 16;
/// Stream of a client's local noise, derived from its round seed.
const LOCAL_NOISE_STREAM: usize = usize::MAX - 2;

fn default_delta() -> f64 {
    1e-5
}
fn default_initial_clipping_norm() -> f64 {
    0.1
}
fn default_target_quantile() -> f64 {
    0.5
}
fn default_clip_lr() -> f64 {
    0.2
}

/// Who takes part in a round, as central DP needs it: the clipped mean's denominator and the
/// rate its accountant may amplify by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DpSampling {
    /// Clients per round (fixed-size sampling) or expected per round (`q n`, Poisson).
    pub clients: f64,
    /// The Poisson rate `q`; `None` under fixed-size sampling, where no amplification holds.
    pub poisson_rate: Option<f64>,
}

impl DpSampling {
    /// The sampling of a run of `sim` over `n` clients.
    pub fn of(sim: &SimConfig, n: usize) -> Result<Self> {
        Ok(match sim.sampling {
            Sampling::Fixed => Self::fixed(sim.sample_size(n)?),
            Sampling::Poisson => {
                let q = sim.sampling_rate(n)?;
                Self {
                    clients: q * n as f64,
                    poisson_rate: Some(q),
                }
            }
        })
    }

    /// Exactly `per_round` clients each round.
    pub fn fixed(per_round: usize) -> Self {
        Self {
            clients: per_round.max(1) as f64,
            poisson_rate: None,
        }
    }

    /// The accountant's sampling rate: `q`, or 1 (no amplification).
    fn accounted_rate(&self) -> f64 {
        self.poisson_rate.unwrap_or(1.0)
    }
}

/// The `[privacy]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PrivacySettings {
    /// Central DP with a fixed clipping norm (Flower's
    /// `DifferentialPrivacyServerSideFixedClipping`).
    CentralFixed {
        /// `z`: the noise's standard deviation in units of `clipping_norm / m`.
        noise_multiplier: f64,
        /// `C`: the largest L2 norm of one client's update.
        clipping_norm: f64,
        /// δ at which ε is reported.
        #[serde(default = "default_delta")]
        delta: f64,
    },
    /// Central DP with adaptive clipping (Flower's
    /// `DifferentialPrivacyServerSideAdaptiveClipping`, Andrew et al. 2021).
    CentralAdaptive {
        /// `z` of the whole mechanism (model and clipped count together).
        noise_multiplier: f64,
        /// `C` of round 1.
        #[serde(default = "default_initial_clipping_norm")]
        initial_clipping_norm: f64,
        /// The quantile of update norms `C` follows: the fraction of updates it leaves
        /// unclipped (0.5: the median norm).
        #[serde(default = "default_target_quantile")]
        target_quantile: f64,
        /// Step size of the geometric update of `C`.
        #[serde(default = "default_clip_lr")]
        clip_lr: f64,
        /// Noise on the count of clipped replies (default: clients per round / 20).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clipped_count_stddev: Option<f64>,
        /// δ at which ε is reported.
        #[serde(default = "default_delta")]
        delta: f64,
    },
    /// Local DP on every client (Flower's `LocalDpMod`).
    Local {
        /// `C`: the largest L2 norm of the client's update.
        clipping_norm: f64,
        /// L2 sensitivity the noise is calibrated to.
        sensitivity: f64,
        /// ε of one reply.
        epsilon: f64,
        /// δ of one reply.
        delta: f64,
    },
}

impl PrivacySettings {
    fn check(&self) -> Result<()> {
        let bad =
            |field: &'static str, reason: String| Err(FedError::InvalidSetting { field, reason });
        let positive = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                bad(field, format!("{v} must be a positive number"))
            }
        };
        let probability = |field: &'static str, v: f64| {
            if v > 0.0 && v < 1.0 {
                Ok(())
            } else {
                bad(field, format!("{v} must lie in (0, 1); 1e-5 is usual"))
            }
        };
        let multiplier = |v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(
                    "privacy.noise_multiplier",
                    format!("{v} must be a non-negative number (0: clipping only, no privacy)"),
                )
            }
        };
        match *self {
            Self::CentralFixed {
                noise_multiplier,
                clipping_norm,
                delta,
            } => {
                multiplier(noise_multiplier)?;
                positive("privacy.clipping_norm", clipping_norm)?;
                probability("privacy.delta", delta)
            }
            Self::CentralAdaptive {
                noise_multiplier,
                initial_clipping_norm,
                target_quantile,
                clip_lr,
                clipped_count_stddev,
                delta,
            } => {
                multiplier(noise_multiplier)?;
                positive("privacy.initial_clipping_norm", initial_clipping_norm)?;
                positive("privacy.clip_lr", clip_lr)?;
                if !(0.0..=1.0).contains(&target_quantile) {
                    return bad(
                        "privacy.target_quantile",
                        format!("{target_quantile} must lie in [0, 1]"),
                    );
                }
                if let Some(s) = clipped_count_stddev
                    && !(s.is_finite() && s >= 0.0)
                {
                    return bad(
                        "privacy.clipped_count_stddev",
                        format!("{s} must be a non-negative number"),
                    );
                }
                probability("privacy.delta", delta)
            }
            Self::Local {
                clipping_norm,
                sensitivity,
                epsilon,
                delta,
            } => {
                positive("privacy.clipping_norm", clipping_norm)?;
                positive("privacy.sensitivity", sensitivity)?;
                positive("privacy.epsilon", epsilon)?;
                probability("privacy.delta", delta)
            }
        }
    }

    /// Checks the settings, and that `config`'s method can take them.
    pub fn check_for(&self, config: &MethodConfig) -> Result<()> {
        self.check()?;
        let name = config.name();
        let separate = matches!(config, MethodConfig::FedAvg(s) if s.separate_inits);
        match self {
            Self::Local { .. } => {
                let ok = matches!(
                    config,
                    MethodConfig::FedAvg(_)
                        | MethodConfig::FedProx(_)
                        | MethodConfig::FedOpt(_)
                        | MethodConfig::FedMedian {}
                        | MethodConfig::FedTrimmedAvg(_)
                        | MethodConfig::Krum(_)
                        | MethodConfig::Bulyan(_)
                );
                if !ok || separate {
                    return Err(FedError::InvalidSetting {
                        field: "privacy",
                        reason: format!(
                            "local DP clips and noises a client's update from the model it \
                             received, but `{name}`'s clients send {}; local DP runs with \
                             fedavg, fedprox, fedopt, fedmedian, fedtrimmedavg, krum and bulyan",
                            if separate {
                                "models trained from their own initialisations in round 1"
                            } else {
                                "something else (own-init, sparse or sub-models, statistics)"
                            }
                        ),
                    });
                }
                Ok(())
            }
            Self::CentralFixed { .. } | Self::CentralAdaptive { .. } => {
                if !matches!(config, MethodConfig::FedAvg(_) | MethodConfig::FedProx(_)) || separate
                {
                    return Err(FedError::InvalidSetting {
                        field: "privacy",
                        reason: format!(
                            "central DP bounds one client's effect on a mean of clipped \
                             updates, and `{name}`'s server step is not that mean{}; use \
                             fedavg or fedprox (a [server] optimizer may follow), or \
                             kind = \"local\"",
                            if separate {
                                " in round 1 (its clients start from their own weights)"
                            } else {
                                ""
                            }
                        ),
                    });
                }
                Ok(())
            }
        }
    }

    /// Wraps `method` (settings checked with its config by [`PrivacySettings::check_for`]).
    /// `sampling` says who takes part in a round (the central noise's denominator and the
    /// accountant's rate), `seed` is the run's.
    pub fn wrap(
        &self,
        method: Box<dyn Method>,
        sampling: DpSampling,
        seed: u64,
    ) -> Result<Box<dyn Method>> {
        match self {
            Self::Local {
                clipping_norm,
                sensitivity,
                epsilon,
                delta,
            } => Ok(Box::new(LocalDp {
                inner: method,
                clipping_norm: *clipping_norm,
                std: dp::gaussian_mechanism_std(*sensitivity, *epsilon, *delta),
                epsilon: *epsilon,
            })),
            Self::CentralFixed { .. } | Self::CentralAdaptive { .. } => {
                Ok(Box::new(CentralDp::new(self, method, sampling, seed)?))
            }
        }
    }
}

/// How the clipping norm evolves.
#[derive(Clone, Copy, Debug)]
enum Clipping {
    Fixed,
    Adaptive {
        target: f64,
        lr: f64,
        count_std: f64,
    },
}

/// Central DP around a mean-of-updates method (FedAvg, FedProx): the client side is the
/// inner method's, the server step is the clipped, noised mean.
pub struct CentralDp {
    inner: Box<dyn Method>,
    clipping: Clipping,
    clipping_norm: f64,
    /// The model noise's multiplier (for adaptive clipping, what the count's noise leaves).
    model_noise: f64,
    /// The mechanism's multiplier, which the accountant composes.
    accounted_noise: f64,
    sampling: DpSampling,
    seed: u64,
    delta: f64,
    accountant: RdpAccountant,
    /// Rounds composed into the accountant (what a checkpoint restores it from).
    releases: usize,
    last: BTreeMap<String, f64>,
}

impl CentralDp {
    fn new(
        settings: &PrivacySettings,
        inner: Box<dyn Method>,
        sampling: DpSampling,
        seed: u64,
    ) -> Result<Self> {
        let (clipping, clipping_norm, model_noise, accounted_noise, delta) = match *settings {
            PrivacySettings::CentralFixed {
                noise_multiplier,
                clipping_norm,
                delta,
            } => (
                Clipping::Fixed,
                clipping_norm,
                noise_multiplier,
                noise_multiplier,
                delta,
            ),
            PrivacySettings::CentralAdaptive {
                noise_multiplier,
                initial_clipping_norm,
                target_quantile,
                clip_lr,
                clipped_count_stddev,
                delta,
            } => {
                let (count_std, z) = dp::adaptive_noise_split(
                    noise_multiplier,
                    sampling.clients,
                    clipped_count_stddev,
                )
                .map_err(|e| FedError::InvalidSetting {
                    field: "privacy.clipped_count_stddev",
                    reason: e.to_string(),
                })?;
                (
                    Clipping::Adaptive {
                        target: target_quantile,
                        lr: clip_lr,
                        count_std,
                    },
                    initial_clipping_norm,
                    z,
                    noise_multiplier,
                    delta,
                )
            }
            PrivacySettings::Local { .. } => {
                return Err(FedError::InvalidSetting {
                    field: "privacy",
                    reason: "local DP is not central".into(),
                });
            }
        };
        Ok(Self {
            inner,
            clipping,
            clipping_norm,
            model_noise,
            accounted_noise,
            sampling,
            seed,
            delta,
            accountant: RdpAccountant::default(),
            releases: 0,
            last: BTreeMap::new(),
        })
    }
}

impl CentralDp {
    /// The round's noised mean of the clipped updates in `sum` (none: the global model plus
    /// noise), the clipping norm's update and the accountant's step.
    fn release(&mut self, round: usize, global: &Params, sum: &ClippedSum) -> Result<Aggregate> {
        let c = self.clipping_norm;
        let (n, clipped) = sum.counts();
        let m = match self.sampling.poisson_rate {
            // McMahan et al.'s fixed denominator: one client moves the mean by at most
            // C / (q n) whoever was drawn.
            Some(_) => self.sampling.clients,
            // More replies than sampled would break the C / m bound: divide by the larger.
            None => self.sampling.clients.max(n as f64),
        };
        let mut next = if n == 0 {
            global.clone()
        } else {
            sum.step(global, m)?
        };
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, CENTRAL_NOISE_STREAM));
        let std = dp::central_noise_std(self.model_noise, c, m);
        dp::add_gaussian_noise(&mut next, std, &mut rng)?;
        self.last = BTreeMap::from([
            ("dp_clipping_norm".to_string(), c),
            ("dp_noise_std".to_string(), std),
        ]);
        if let Clipping::Adaptive {
            target,
            lr,
            count_std,
        } = self.clipping
        {
            let noisy = dp::noisy_count(clipped, count_std, &mut rng)?;
            // Flower divides by the replies; under Poisson sampling Andrew et al. divide by
            // the expected count, which does not reveal how many were drawn.
            let base = match self.sampling.poisson_rate {
                Some(_) => m,
                None if n > 0 => n as f64,
                None => m,
            };
            let clipped_fraction = noisy / base;
            self.clipping_norm = dp::geometric_clip_update(c, lr, 1.0 - clipped_fraction, target);
            self.last
                .insert("dp_clipped_fraction".to_string(), clipped_fraction);
        }
        if self.accounted_noise > 0.0 {
            self.accountant
                .compose(self.sampling.accounted_rate(), self.accounted_noise, 1);
            self.releases += 1;
            let spent = self.accountant.epsilon(self.delta);
            self.last.insert("dp_epsilon".to_string(), spent.epsilon);
        }
        Ok(Aggregate::Replace(next))
    }
}

impl Method for CentralDp {
    crate::method::wraps_inner!();

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let mut sum = ClippedSum::new(global, self.clipping_norm);
        for r in replies {
            sum.add(global, &r.record.params)?;
        }
        self.release(round, global, &sum)
    }

    fn aggregate_no_replies(&mut self, round: usize, global: &Params) -> Result<Aggregate> {
        self.release(round, global, &ClippedSum::new(global, self.clipping_norm))
    }

    /// No streaming form: the server step is the clipped sum's release, not the inner one's.
    fn fold(&self) -> Option<Box<dyn Fold>> {
        None
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        let mut m = self.inner.round_metrics();
        m.extend(self.last.clone());
        m
    }

    fn save_state(&self) -> Option<Result<Record>> {
        let mut own = Record::default();
        own.metrics
            .insert("dp_clipping_norm".into(), self.clipping_norm);
        own.metrics
            .insert("dp_releases".into(), self.releases as f64);
        nest_state(own, self.inner.as_ref())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        let (own, inner) = unnest_state(state)?;
        let bad = |why: &str| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("privacy state: {why}"),
        };
        let c = *own
            .metrics
            .get("dp_clipping_norm")
            .ok_or_else(|| bad("no clipping norm"))?;
        let releases = *own
            .metrics
            .get("dp_releases")
            .ok_or_else(|| bad("no release count"))?;
        if !(c.is_finite() && c > 0.0 && releases >= 0.0 && releases.fract() == 0.0) {
            return Err(bad("clipping norm or release count out of range"));
        }
        self.clipping_norm = c;
        self.releases = releases as usize;
        self.accountant = RdpAccountant::default();
        if self.releases > 0 {
            self.accountant.compose(
                self.sampling.accounted_rate(),
                self.accounted_noise,
                self.releases,
            );
        }
        self.inner.load_state(inner)
    }
}

/// Local DP around a method whose clients send a model trained from the one they received:
/// each reply's update is clipped and noised on the client.
pub struct LocalDp {
    inner: Box<dyn Method>,
    clipping_norm: f64,
    std: f64,
    epsilon: f64,
}

impl Method for LocalDp {
    crate::method::wraps_inner!();

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        // The model received, to clip the update against (the inner fit consumes it).
        let start = instruction.params.clone();
        let mut reply = self.inner.fit(instruction, ctx)?;
        dp::clip_update(&start, &mut reply.params, self.clipping_norm)?;
        let mut rng = StdRng::seed_from_u64(derive_seed(ctx.seed, 0, LOCAL_NOISE_STREAM));
        dp::add_gaussian_noise(&mut reply.params, self.std, &mut rng)?;
        Ok(reply)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        let mut m = self.inner.round_metrics();
        m.insert("dp_local_epsilon".into(), self.epsilon);
        m.insert("dp_local_noise_std".into(), self.std);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FedAvgSettings, PfnmSettings};

    fn model(values: &[f32]) -> Params {
        let mut p = Params::new();
        p.push("w", vec![values.len()], values.to_vec()).unwrap();
        p
    }

    fn reply(client: usize, values: &[f32], examples: u64) -> Reply {
        Reply {
            client,
            record: Record::from_params(model(values)).with_num_examples(examples),
        }
    }

    fn central(settings: &PrivacySettings, sampled: usize) -> Box<dyn Method> {
        central_sampled(settings, DpSampling::fixed(sampled))
    }

    fn central_sampled(settings: &PrivacySettings, sampling: DpSampling) -> Box<dyn Method> {
        let fedavg = MethodConfig::FedAvg(FedAvgSettings::default());
        settings.check_for(&fedavg).unwrap();
        settings.wrap(fedavg.build().unwrap(), sampling, 7).unwrap()
    }

    fn replaced(a: Aggregate) -> Vec<f32> {
        match a {
            Aggregate::Replace(p) => p.get("w").unwrap().data.clone(),
            Aggregate::Keep => panic!("kept"),
        }
    }

    #[test]
    fn central_fixed_is_the_clipped_sum_over_the_clients_sampled() {
        let s = PrivacySettings::CentralFixed {
            noise_multiplier: 0.0,
            clipping_norm: 1.0,
            delta: 1e-5,
        };
        let mut m = central(&s, 4);
        let global = model(&[0.0, 0.0]);
        // Updates (3, 4) -> (0.6, 0.8) and (0, 0.5); examples do not weigh; 4 sampled.
        let got = replaced(
            m.aggregate(
                1,
                &global,
                &[reply(0, &[3.0, 4.0], 1), reply(1, &[0.0, 0.5], 1000)],
            )
            .unwrap(),
        );
        assert!(
            (got[0] - 0.15).abs() < 1e-7 && (got[1] - 0.325).abs() < 1e-7,
            "{got:?}"
        );
        let metrics = m.round_metrics();
        assert_eq!(metrics["dp_clipping_norm"], 1.0);
        assert!(!metrics.contains_key("dp_epsilon"));
    }

    #[test]
    fn central_noise_has_spread_z_c_over_m_and_epsilon_grows() {
        let s = PrivacySettings::CentralFixed {
            noise_multiplier: 2.0,
            clipping_norm: 0.5,
            delta: 1e-5,
        };
        let mut m = central(&s, 10);
        let global = model(&vec![0.0; 50_000]);
        let same = Reply {
            client: 0,
            record: Record::from_params(global.clone()),
        };
        let noise = replaced(
            m.aggregate(1, &global, std::slice::from_ref(&same))
                .unwrap(),
        );
        let sd =
            (noise.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / noise.len() as f64).sqrt();
        assert!((sd / 0.1 - 1.0).abs() < 0.03, "{sd} vs z C / m = 0.1");
        let eps1 = m.round_metrics()["dp_epsilon"];
        // Another round draws other noise; the same seed and round draw the same.
        let again = replaced(
            m.aggregate(2, &global, std::slice::from_ref(&same))
                .unwrap(),
        );
        assert_ne!(noise, again);
        let eps2 = m.round_metrics()["dp_epsilon"];
        assert!(eps1 > 0.0 && eps2 > eps1, "{eps1} {eps2}");
        let mut fresh = central(&s, 10);
        assert_eq!(
            replaced(
                fresh
                    .aggregate(1, &global, std::slice::from_ref(&same))
                    .unwrap()
            ),
            noise
        );
    }

    #[test]
    fn poisson_sampling_divides_by_q_n_and_noises_an_empty_round() {
        let s = PrivacySettings::CentralFixed {
            noise_multiplier: 0.0,
            clipping_norm: 1.0,
            delta: 1e-5,
        };
        let poisson = DpSampling {
            clients: 2.5,
            poisson_rate: Some(0.25),
        };
        let mut m = central_sampled(&s, poisson);
        let global = model(&[0.0, 0.0]);
        // One reply of update (3, 4), clipped to (0.6, 0.8), over q n = 2.5 (not over the one
        // drawn, nor over more replies than expected).
        let got = replaced(
            m.aggregate(1, &global, &[reply(0, &[3.0, 4.0], 1)])
                .unwrap(),
        );
        assert!(
            (got[0] - 0.24).abs() < 1e-7 && (got[1] - 0.32).abs() < 1e-7,
            "{got:?}"
        );
        let three: Vec<Reply> = (0..3).map(|c| reply(c, &[0.0, 1.0], 1)).collect();
        let got = replaced(m.aggregate(2, &global, &three).unwrap());
        assert!((got[1] - 1.2).abs() < 1e-6, "{got:?}");

        // Nobody drawn: the release is the global model plus noise of z C / (q n), and the
        // accountant composes the round at rate q.
        let noisy = PrivacySettings::CentralFixed {
            noise_multiplier: 2.0,
            clipping_norm: 0.5,
            delta: 1e-5,
        };
        let mut m = central_sampled(&noisy, poisson);
        let global = model(&vec![0.0; 50_000]);
        let noise = replaced(m.aggregate_no_replies(1, &global).unwrap());
        let sd =
            (noise.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / noise.len() as f64).sqrt();
        assert!((sd / 0.4 - 1.0).abs() < 0.03, "{sd} vs z C / (q n) = 0.4");
        let mut accountant = RdpAccountant::default();
        accountant.compose(0.25, 2.0, 1);
        assert_eq!(
            m.round_metrics()["dp_epsilon"],
            accountant.epsilon(1e-5).epsilon
        );
        // Fixed-size sampling claims no amplification: the same round costs more.
        let mut fixed = central(&noisy, 3);
        fixed.aggregate_no_replies(1, &global).unwrap();
        assert!(fixed.round_metrics()["dp_epsilon"] > m.round_metrics()["dp_epsilon"]);
    }

    #[test]
    fn adaptive_norm_follows_the_clipped_fraction() {
        let s = PrivacySettings::CentralAdaptive {
            noise_multiplier: 0.0,
            initial_clipping_norm: 1.0,
            target_quantile: 0.5,
            clip_lr: 0.2,
            clipped_count_stddev: Some(0.0),
            delta: 1e-5,
        };
        let mut m = central(&s, 2);
        let global = model(&[0.0]);
        let replies = [reply(0, &[5.0], 1), reply(1, &[4.0], 1)];
        m.aggregate(1, &global, &replies).unwrap();
        assert_eq!(m.round_metrics()["dp_clipped_fraction"], 1.0);
        m.aggregate(2, &global, &replies).unwrap();
        // Both clipped at 1.0, none inside against a target of half: C = e^{0.2 * 0.5}.
        let c2 = m.round_metrics()["dp_clipping_norm"];
        assert!((c2 - 0.1f64.exp()).abs() < 1e-12, "{c2}");
        // Updates of norm 4 and 5: C climbs to them and settles between, as the median.
        for round in 3..60 {
            m.aggregate(round, &global, &replies).unwrap();
        }
        let c = m.round_metrics()["dp_clipping_norm"];
        assert!((3.5..5.5).contains(&c), "{c}");
    }

    #[test]
    fn methods_whose_server_step_is_no_mean_are_refused_with_the_reason() {
        let s = PrivacySettings::CentralFixed {
            noise_multiplier: 1.0,
            clipping_norm: 1.0,
            delta: 1e-5,
        };
        let pfnm = MethodConfig::Pfnm(PfnmSettings::default());
        let median = MethodConfig::FedMedian {};
        for cfg in [&pfnm, &median] {
            let e = s.check_for(cfg).err().unwrap().to_string();
            assert!(
                e.contains("central DP") && e.contains("kind = \"local\""),
                "{e}"
            );
        }
        // Local DP suits a median, not PFNM's own-init clients.
        let local = PrivacySettings::Local {
            clipping_norm: 1.0,
            sensitivity: 1.0,
            epsilon: 1.0,
            delta: 1e-5,
        };
        assert!(local.check_for(&median).is_ok());
        let e = local.check_for(&pfnm).err().unwrap();
        assert!(e.to_string().contains("local DP clips"), "{e}");
        let bad = PrivacySettings::CentralFixed {
            noise_multiplier: 1.0,
            clipping_norm: 0.0,
            delta: 1e-5,
        };
        let fedavg = MethodConfig::FedAvg(FedAvgSettings::default());
        let e = bad.check_for(&fedavg).err().unwrap();
        assert!(e.to_string().contains("privacy.clipping_norm"), "{e}");
    }
}
