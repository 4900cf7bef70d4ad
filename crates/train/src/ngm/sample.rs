//! NGM sampling (Algorithm 3), batched over samples.

use fedfuse_core::Params;
use rand::{Rng, RngExt};
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use fedfuse_core::{BlockKind, FeatureBlock};

use super::{InferConfig, InferMethod, Known, Ngm};
use crate::{Result, TrainError};

/// How the first feature of the ordering is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FirstDraw {
    /// From its empirical marginal: the feature's values in a uniformly drawn data row
    /// (Algorithm 3 as written).
    #[default]
    Empirical,
    /// Real units `Uniform(min, max)` of the data (the reference code, which uses the scaler's
    /// range, i.e. `Uniform(0, 1)` after min-max scaling); categorical blocks still from their
    /// empirical frequencies.
    Uniform,
}

/// Noise added to an inferred real value `v`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleNoise {
    /// `v + Uniform(-c|v|, c|v|)` (the reference code: `c = 0.05` in `main.py`).
    Relative(f32),
    /// `v + Normal(0, sd^2)`, `sd` in normalised units, the same for every unit.
    Gaussian(f32),
    /// `v + Normal(0, sd_k^2)` with `sd_k` unit `k`'s residual standard deviation: the spread
    /// of `x_k - f(x)_k` over the data ([`Marginals::with_residuals`]), i.e. the model's own
    /// estimate of how far a value strays from its conditional mean. Unlike the reference
    /// code's 5% relative noise, this keeps samples about as spread as the data, which is what
    /// a model distilled on them needs to see (FedNGM's default).
    Residual,
}

/// Settings of sampling.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SampleConfig {
    /// How the first feature is drawn.
    pub first: FirstDraw,
    /// Noise on each later real feature.
    pub noise: SampleNoise,
    /// The inference run for each later feature. The default is message passing (Algorithm
    /// 2's alternative), which returns conditional means; the gradient-based procedure,
    /// seeing a single known neighbour, inverts its regression instead (`x2 = x1 / rho` in a
    /// standardised chain) and inflates the samples' spread at every step.
    pub infer: InferConfig,
    /// Start feature; `None` draws it uniformly.
    pub start: Option<usize>,
    /// Gibbs sweeps after the sequential pass: each feature in turn redrawn from the model
    /// with every other feature known. The sequential pass conditions each feature on the
    /// earlier ones only, while `residual` noise is the spread given all the others, so its
    /// spreads are off (too narrow or, through the unknowns' fixed point, too wide); sweeps
    /// draw from the full conditionals that this noise describes (0: Algorithm 3 as
    /// published).
    pub gibbs_sweeps: usize,
}

impl Default for SampleConfig {
    fn default() -> Self {
        Self {
            first: FirstDraw::Empirical,
            noise: SampleNoise::Relative(0.05),
            infer: InferConfig {
                method: InferMethod::MessagePassing,
                lr: 1e-2,
                max_itr: 200,
                eps: 1e-8,
            },
            start: None,
            gibbs_sweeps: 0,
        }
    }
}

/// What sampling and inference need from the data: per-unit means (inference's starting
/// point), ranges, and the rows themselves for empirical draws.
#[derive(Clone, Debug)]
pub struct Marginals {
    units: usize,
    means: Vec<f32>,
    min: Vec<f32>,
    max: Vec<f32>,
    rows: Vec<f32>,
    /// Per-unit residual standard deviations; empty until [`Marginals::with_residuals`].
    residual_sd: Vec<f32>,
}

impl Marginals {
    /// Marginals of `x` (`n x U`, normalised), laid out for `ngm`.
    pub fn from_data(ngm: &Ngm, x: &[f32]) -> Result<Self> {
        let n = ngm.check_matrix(x, "x")?;
        let u = ngm.units();
        let mut means = vec![0.0f64; u];
        let mut min = vec![f32::INFINITY; u];
        let mut max = vec![f32::NEG_INFINITY; u];
        for row in x.chunks_exact(u) {
            for (k, &v) in row.iter().enumerate() {
                means[k] += f64::from(v) / n as f64;
                min[k] = min[k].min(v);
                max[k] = max[k].max(v);
            }
        }
        Ok(Self {
            units: u,
            means: means.into_iter().map(|v| v as f32).collect(),
            min,
            max,
            rows: x.to_vec(),
            residual_sd: Vec::new(),
        })
    }

    /// Marginals from summaries alone (per-unit means, minima and maxima, e.g. sent by a
    /// client to a server that samples from the client's NGM): no data rows, so sampling must
    /// use [`FirstDraw::Uniform`]; a categorical first feature is then drawn from its
    /// frequencies (`means`).
    pub fn from_summary(ngm: &Ngm, means: Vec<f32>, min: Vec<f32>, max: Vec<f32>) -> Result<Self> {
        let u = ngm.units();
        if means.len() != u || min.len() != u || max.len() != u {
            return Err(TrainError::DataMismatch(format!(
                "marginal summaries of {}/{}/{} units (means/min/max) for an NGM of {u}",
                means.len(),
                min.len(),
                max.len()
            )));
        }
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        if !(finite(&means) && finite(&min) && finite(&max))
            || min.iter().zip(&max).any(|(a, b)| a > b)
        {
            return Err(TrainError::DataMismatch(
                "marginal summaries must be finite with min <= max".into(),
            ));
        }
        Ok(Self {
            units: u,
            means,
            min,
            max,
            rows: Vec::new(),
            residual_sd: Vec::new(),
        })
    }

    /// These marginals with per-unit residual standard deviations of `params` on the data rows
    /// (the first 4096 at most), for [`SampleNoise::Residual`]: for each real feature `k`,
    /// `sqrt(mean((x_k - m_k)^2))` with `m_k` the model's conditional mean of `x_k` given
    /// every other feature, by message passing with `x_k` unknown (so a model that lets
    /// `x_k` leak into its own output, as an NGR at small `lambda` does, is not credited with
    /// predicting it); 0 on categorical units. Needs the rows ([`from_data`](Self::from_data)).
    pub fn with_residuals(mut self, ngm: &Ngm, params: &Params) -> Result<Self> {
        let u = self.units;
        if self.rows.is_empty() {
            return Err(TrainError::EmptyData("marginal rows for residuals"));
        }
        let rows = &self.rows[..self.rows.len().min(4096 * u)];
        let n = rows.len() / u;
        let infer = InferConfig {
            method: InferMethod::MessagePassing,
            lr: 1e-2,
            max_itr: 100,
            eps: 1e-8,
        };
        let mut sd = vec![0.0f32; u];
        for b in ngm.blocks().iter().filter(|b| b.kind == BlockKind::Real) {
            let mut known = vec![true; u];
            known[b.range()].iter_mut().for_each(|k| *k = false);
            let inf = ngm.infer(params, rows, Known::Units(&known), &self.means, &infer)?;
            for k in b.range() {
                let se: f64 = rows
                    .chunks_exact(u)
                    .zip(inf.x.chunks_exact(u))
                    .map(|(r, m)| (f64::from(r[k]) - f64::from(m[k])).powi(2))
                    .sum();
                sd[k] = (se / n as f64).sqrt() as f32;
            }
        }
        self.residual_sd = sd;
        Ok(self)
    }

    /// Sets the residual standard deviations directly (e.g. received from a client; length
    /// `U`, finite, `>= 0`).
    pub fn with_residual_sd(mut self, sd: Vec<f32>) -> Result<Self> {
        if sd.len() != self.units || sd.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(TrainError::DataMismatch(format!(
                "{} residual deviations for {} units; give one finite value >= 0 per unit",
                sd.len(),
                self.units
            )));
        }
        self.residual_sd = sd;
        Ok(self)
    }

    /// Per-unit residual standard deviations (empty until set).
    pub fn residual_sd(&self) -> &[f32] {
        &self.residual_sd
    }

    /// Per-unit means (category frequencies on one-hot blocks).
    pub fn means(&self) -> &[f32] {
        &self.means
    }

    /// Per-unit minima.
    pub fn min(&self) -> &[f32] {
        &self.min
    }

    /// Per-unit maxima.
    pub fn max(&self) -> &[f32] {
        &self.max
    }
}

/// Draws one category per sample from probability rows `probs` (`n x len`, clipped at 0 and
/// normalised here) and writes its one-hot code into `x` at `block`.
fn draw_categories(
    x: &mut [f32],
    u: usize,
    block: &FeatureBlock,
    probs: &[f32],
    rng: &mut impl Rng,
) {
    for (row, p) in x.chunks_exact_mut(u).zip(probs.chunks_exact(block.len)) {
        let total: f32 = p.iter().map(|v| v.max(0.0)).sum();
        let r = rng.random::<f32>() * total;
        let mut acc = 0.0;
        let mut pick = block.len - 1;
        for (c, v) in p.iter().enumerate() {
            acc += v.max(0.0);
            if r < acc {
                pick = c;
                break;
            }
        }
        if total <= 0.0 {
            pick = rng.random_range(0..block.len);
        }
        for (c, v) in row[block.range()].iter_mut().enumerate() {
            *v = f32::from(u8::from(c == pick));
        }
    }
}

impl Ngm {
    /// Algorithm 3: `n` samples (`n x U`, normalised space), all in one batch.
    ///
    /// The features are visited in BFS order over the graph from a start feature (random
    /// unless `cfg.start` fixes it; the search continues from unvisited features when the
    /// graph is disconnected, so every sample shares one ordering). The first feature is drawn
    /// from the data (`cfg.first`). Each later feature is inferred with all earlier features
    /// known and the rest started at their means; a real feature then gets `cfg.noise` and is
    /// kept within the data range `[min, max]` (a non-finite value becomes the mean), a
    /// categorical one has its inferred probabilities clipped at 0, normalised and sampled,
    /// and is re-one-hot-encoded. Then `cfg.gibbs_sweeps` times, every feature in the same
    /// order is drawn again the same way, with all the others known.
    pub fn sample(
        &self,
        params: &Params,
        marginals: &Marginals,
        n: usize,
        cfg: &SampleConfig,
        rng: &mut impl Rng,
    ) -> Result<Vec<f32>> {
        let u = self.units();
        if marginals.units != u {
            return Err(TrainError::DataMismatch(format!(
                "marginals of {} units for an NGM of {u}; build them with \
                 `Marginals::from_data` for this NGM",
                marginals.units
            )));
        }
        if n == 0 {
            return Err(TrainError::EmptyData("samples requested"));
        }
        cfg.infer.check()?;
        let d = self.blocks().len();
        let start = match cfg.start {
            Some(s) if s < d => s,
            Some(s) => {
                return Err(TrainError::InvalidConfig {
                    field: "sample.start",
                    reason: format!("feature {s} does not exist ({d} features)"),
                });
            }
            None => rng.random_range(0..d),
        };
        let order = self.graph().bfs_order(start);
        let mut x: Vec<f32> = marginals
            .means
            .iter()
            .copied()
            .cycle()
            .take(n * u)
            .collect();
        let mut known = vec![false; u];

        let first = &self.blocks()[start];
        let data_rows = marginals.rows.len() / u;
        match (first.kind, cfg.first) {
            (BlockKind::Real, FirstDraw::Uniform) => {
                for row in x.chunks_exact_mut(u) {
                    for k in first.range() {
                        let (lo, hi) = (marginals.min[k], marginals.max[k]);
                        row[k] = lo + (hi - lo) * rng.random::<f32>();
                    }
                }
            }
            (BlockKind::Categorical, _) if data_rows == 0 => {
                let probs: Vec<f32> = (0..n)
                    .flat_map(|_| marginals.means[first.range()].iter().copied())
                    .collect();
                draw_categories(&mut x, u, first, &probs, rng);
            }
            (BlockKind::Real, FirstDraw::Empirical) if data_rows == 0 => {
                return Err(TrainError::InvalidConfig {
                    field: "sample.first",
                    reason: "an empirical first draw needs data rows, and these marginals \
                             are summaries only; use `uniform`"
                        .into(),
                });
            }
            _ => {
                for row in x.chunks_exact_mut(u) {
                    let r = rng.random_range(0..data_rows);
                    row[first.range()].copy_from_slice(&marginals.rows[r * u..][first.range()]);
                }
            }
        }
        known[first.range()].iter_mut().for_each(|k| *k = true);

        for &f in order.iter().skip(1) {
            self.redraw(params, marginals, &mut x, &known, f, cfg, rng)?;
            known[self.blocks()[f].range()]
                .iter_mut()
                .for_each(|k| *k = true);
        }
        for _ in 0..cfg.gibbs_sweeps {
            for &f in &order {
                let mut known = vec![true; u];
                known[self.blocks()[f].range()]
                    .iter_mut()
                    .for_each(|k| *k = false);
                self.redraw(params, marginals, &mut x, &known, f, cfg, rng)?;
            }
        }
        Ok(x)
    }

    /// Draws feature `f` of every row of `x` given the `known` units: inferred, then noised
    /// and kept within the data range (real), or sampled from the inferred probabilities and
    /// re-one-hot-encoded (categorical).
    #[allow(clippy::too_many_arguments)]
    fn redraw(
        &self,
        params: &Params,
        marginals: &Marginals,
        x: &mut [f32],
        known: &[bool],
        f: usize,
        cfg: &SampleConfig,
        rng: &mut impl Rng,
    ) -> Result<()> {
        let u = self.units();
        let block = &self.blocks()[f];
        let inferred = self.infer(params, x, Known::Units(known), &marginals.means, &cfg.infer)?;
        match block.kind {
            BlockKind::Real => {
                let gauss = match cfg.noise {
                    SampleNoise::Gaussian(sd) => {
                        Some(Normal::new(0.0f32, sd.max(0.0)).map_err(|e| {
                            TrainError::InvalidConfig {
                                field: "sample.noise",
                                reason: format!("{e}"),
                            }
                        })?)
                    }
                    SampleNoise::Relative(_) | SampleNoise::Residual => None,
                };
                if cfg.noise == SampleNoise::Residual && marginals.residual_sd.len() != u {
                    return Err(TrainError::InvalidConfig {
                        field: "sample.noise",
                        reason: "`residual` noise needs residual deviations; build the \
                                 marginals with `with_residuals`"
                            .into(),
                    });
                }
                let std_normal =
                    Normal::new(0.0f32, 1.0).map_err(|e| TrainError::InvalidConfig {
                        field: "sample.noise",
                        reason: format!("{e}"),
                    })?;
                for (row, inf) in x.chunks_exact_mut(u).zip(inferred.x.chunks_exact(u)) {
                    for k in block.range() {
                        let v = inf[k];
                        row[k] = match (cfg.noise, &gauss) {
                            (_, Some(g)) => v + g.sample(rng),
                            (SampleNoise::Relative(c), None) => {
                                let half = c.abs() * v.abs();
                                v + half * (2.0 * rng.random::<f32>() - 1.0)
                            }
                            (SampleNoise::Residual, None) => {
                                v + marginals.residual_sd[k] * std_normal.sample(rng)
                            }
                            (SampleNoise::Gaussian(_), None) => v,
                        };
                        // Within the data's range: a model iterated far from its data can
                        // run off to huge values, and one such sample would wreck a fit.
                        let (lo, hi) = (marginals.min[k], marginals.max[k]);
                        row[k] = if row[k].is_finite() {
                            row[k].clamp(lo, hi)
                        } else {
                            marginals.means[k]
                        };
                    }
                }
            }
            BlockKind::Categorical => {
                let probs: Vec<f32> = inferred
                    .x
                    .chunks_exact(u)
                    .flat_map(|row| row[block.range()].iter().copied())
                    .collect();
                draw_categories(x, u, block, &probs, rng);
            }
        }
        Ok(())
    }
}
