//! Neural Graphical Models: structure penalty, training, inference, sampling, NGR, stitching.
//!
//! Gaussian ground truth comes from `fedfuse_data::sample_ggm` (a chain or random GGM with a
//! known precision matrix) and `conditional_mean`. Data are min-max scaled per variable as the
//! NGM code does; in that space the precision becomes `Θ'_ij = Θ_ij s_i s_j` (`s` the ranges)
//! and the mean `μ'_i = -lo_i / s_i`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::{BlockKind, FeatureBlock, Params};
use fedfuse_data::{GgmConfig, GraphShape, conditional_mean, sample_ggm};
use fedfuse_train::{
    BlockAggregate, Distill, FeatureGraph, InferConfig, InferMethod, Known, LambdaSchedule,
    Marginals, Ngm, NgmConfig, PathNorm, SampleConfig, SampleNoise, StitchConfig, StitchMode,
    TrainError, ngr_graph, path_matrix, structure_penalty, structure_report, unit_mask,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn real(name: &str, start: usize) -> FeatureBlock {
    FeatureBlock {
        name: name.into(),
        start,
        len: 1,
        kind: BlockKind::Real,
    }
}

fn cat(name: &str, start: usize, len: usize) -> FeatureBlock {
    FeatureBlock {
        name: name.into(),
        start,
        len,
        kind: BlockKind::Categorical,
    }
}

fn reals(d: usize) -> Vec<FeatureBlock> {
    (0..d).map(|i| real(&format!("x{i}"), i)).collect()
}

/// A Gaussian, min-max scaled: samples (f32), precision and mean in the scaled space.
struct Scaled {
    d: usize,
    x: Vec<f32>,
    precision: Vec<f64>,
    mean: Vec<f64>,
    covariance: Vec<f64>,
    adjacency: Vec<bool>,
}

fn scaled_ggm(cfg: &GgmConfig, seed: u64) -> Scaled {
    let g = sample_ggm(cfg, &mut StdRng::seed_from_u64(seed)).unwrap();
    let d = g.d;
    let mut lo = vec![f64::INFINITY; d];
    let mut hi = vec![f64::NEG_INFINITY; d];
    for row in g.samples.chunks_exact(d) {
        for k in 0..d {
            lo[k] = lo[k].min(row[k]);
            hi[k] = hi[k].max(row[k]);
        }
    }
    let s: Vec<f64> = (0..d).map(|k| hi[k] - lo[k]).collect();
    let x = g
        .samples
        .chunks_exact(d)
        .flat_map(|row| {
            (0..d)
                .map(|k| ((row[k] - lo[k]) / s[k]) as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    let precision = (0..d * d)
        .map(|k| g.precision[k] * s[k / d] * s[k % d])
        .collect();
    let covariance = (0..d * d)
        .map(|k| g.covariance[k] / (s[k / d] * s[k % d]))
        .collect();
    Scaled {
        d,
        x,
        precision,
        mean: (0..d).map(|k| -lo[k] / s[k]).collect(),
        covariance,
        adjacency: g.adjacency,
    }
}

fn corr(x: &[f32], u: usize, a: usize, b: usize) -> f64 {
    let n = (x.len() / u) as f64;
    let col = |k: usize| x.chunks_exact(u).map(move |r| f64::from(r[k]));
    let (ma, mb) = (col(a).sum::<f64>() / n, col(b).sum::<f64>() / n);
    let cov: f64 = col(a).zip(col(b)).map(|(p, q)| (p - ma) * (q - mb)).sum();
    let va: f64 = col(a).map(|p| (p - ma).powi(2)).sum();
    let vb: f64 = col(b).map(|q| (q - mb).powi(2)).sum();
    cov / (va * vb).sqrt()
}

fn fast_cfg(hidden: &[usize], epochs: usize, seed: u64) -> NgmConfig {
    NgmConfig {
        hidden: hidden.to_vec(),
        lambda: 1.0,
        epochs,
        lr: 1e-2,
        batch_size: 0,
        validation_fraction: 0.2,
        seed,
        ..NgmConfig::default()
    }
}

mod penalty {
    use super::*;

    /// One hidden layer of 4 units over 4 real features with edges 0-1 and 2-3: hidden unit
    /// `h` reads input `h` and feeds its partner's output, so every path respects S.
    fn block_params(extra: Option<f32>) -> Params {
        let mut w0 = vec![0.0f32; 16]; // [hidden 4, in 4]
        let mut w1 = vec![0.0f32; 16]; // [out 4, hidden 4]
        for h in 0..4 {
            w0[h * 4 + h] = 1.0;
            let partner = h ^ 1;
            w1[partner * 4 + h] = 1.0;
        }
        if let Some(v) = extra {
            w0[2] = v; // hidden 0 also reads input 2, and feeds output 1: 2 -> 1 is forbidden.
        }
        let mut p = Params::new();
        p.push("layers.0.weight", vec![4, 4], w0).unwrap();
        p.push("layers.0.bias", vec![4], vec![0.1; 4]).unwrap();
        p.push("layers.1.weight", vec![4, 4], w1).unwrap();
        p.push("layers.1.bias", vec![4], vec![0.0; 4]).unwrap();
        p
    }

    #[test]
    fn zero_when_paths_respect_s_and_hand_computed_otherwise() {
        let graph = FeatureGraph::from_edges(4, &[(0, 1), (2, 3)]).unwrap();
        let mask = unit_mask(&graph, &reals(4)).unwrap();
        assert_eq!(structure_penalty(&block_params(None), &mask).unwrap(), 0.0);
        // Input 2's row of rownorm(|W0|^T) is [0.5, 0, 1, 0] / sqrt(1.25); |W1|^T has one 1 per
        // row, so P[2] = [0, 0.5, 0, 1] / sqrt(1.25): the forbidden entry P[2, 1] = 1/sqrt(5).
        let with = block_params(Some(0.5));
        let pen = structure_penalty(&with, &mask).unwrap();
        assert!((pen - 1.0 / 5f64.sqrt()).abs() < 1e-6, "penalty {pen}");
        let p = path_matrix(&with).unwrap();
        assert!((p[2 * 4 + 3] - 2.0 / 5f32.sqrt()).abs() < 1e-6);
        let report = structure_report(&with, &mask).unwrap();
        assert!((f64::from(report.max_forbidden) - 1.0 / 5f64.sqrt()).abs() < 1e-6);
        // Total path mass: rows 0, 1, 3 are unit vectors (1 each) and row 2 sums 3/sqrt(5).
        let total = 3.0 + 3.0 / 5f64.sqrt();
        assert!((report.forbidden_fraction - (1.0 / 5f64.sqrt()) / total).abs() < 1e-6);
    }

    #[test]
    fn unit_mask_forbids_a_categorical_features_own_block() {
        let blocks = vec![real("a", 0), cat("c", 1, 3)];
        let graph = FeatureGraph::from_edges(2, &[(0, 1)]).unwrap();
        let m = unit_mask(&graph, &blocks).unwrap();
        let u = 4;
        for a in 0..u {
            for b in 0..u {
                let same = (a == 0) == (b == 0);
                assert_eq!(m[a * u + b], !same, "({a}, {b})");
            }
        }
    }

    #[test]
    fn bad_layouts_are_typed_errors() {
        let graph = FeatureGraph::from_edges(2, &[(0, 1)]).unwrap();
        let gap = vec![real("a", 0), real("b", 2)];
        assert!(matches!(
            unit_mask(&graph, &gap),
            Err(TrainError::Blocks(_))
        ));
        let short_cat = vec![real("a", 0), cat("c", 1, 1)];
        assert!(matches!(
            unit_mask(&graph, &short_cat),
            Err(TrainError::Blocks(_))
        ));
        assert!(matches!(
            FeatureGraph::new(2, vec![false, true, false, false]),
            Err(TrainError::Graph(_))
        ));
        let ngm = Ngm::new(reals(2), graph).unwrap();
        let x = vec![0.1, f32::NAN, 0.3, 0.4];
        assert!(matches!(
            ngm.fit(None, &x, &fast_cfg(&[4], 1, 0)),
            Err(TrainError::NonFinite {
                row: 0,
                unit: 1,
                ..
            })
        ));
        assert!(matches!(
            ngm.fit(None, &[0.1, 0.2, 0.3], &fast_cfg(&[4], 1, 0)),
            Err(TrainError::DataMismatch(_))
        ));
        assert!(matches!(
            ngm.fit(None, &[], &fast_cfg(&[4], 1, 0)),
            Err(TrainError::EmptyData(_))
        ));
    }
}

mod training {
    use super::*;

    #[test]
    fn penalty_falls_while_regression_stays_good() {
        let mut g = GgmConfig::new(4, 1500, GraphShape::Chain);
        g.diag_margin = 0.3;
        let data = scaled_ggm(&g, 3);
        let ngm = Ngm::new(
            reals(4),
            FeatureGraph::new(4, data.adjacency.clone()).unwrap(),
        )
        .unwrap();
        let phase1 = NgmConfig {
            proximal_init_epochs: 300,
            epochs: 0,
            ..fast_cfg(&[24], 0, 1)
        };
        let p1 = ngm.fit(None, &data.x, &phase1).unwrap();
        let full = NgmConfig {
            proximal_init_epochs: 300,
            epochs: 2000,
            schedule: LambdaSchedule::Fixed,
            ..fast_cfg(&[24], 0, 1)
        };
        let fit = ngm.fit(None, &data.x, &full).unwrap();
        // Regression loss of predicting each unit by its mean (per-unit variance, averaged),
        // and of the Bayes regression E[x_k | x_-k] (residual variance 1 / Θ_kk).
        let var: f64 = (0..4).map(|k| data.covariance[k * 4 + k]).sum::<f64>() / 4.0;
        let bayes: f64 = (0..4).map(|k| 1.0 / data.precision[k * 4 + k]).sum::<f64>() / 4.0;
        eprintln!(
            "phase-1 penalty {:.4} (reg {:.5}), after fit {:.4} (reg {:.5}, held-out {:.5}); \
             mean predictor {var:.5}, Bayes {bayes:.5}",
            p1.penalty,
            p1.train_loss,
            fit.penalty,
            fit.train_loss,
            fit.val_loss.unwrap_or(f64::NAN)
        );
        assert!(
            p1.penalty > 0.5,
            "phase 1 learns the identity: {}",
            p1.penalty
        );
        assert!(fit.penalty < 0.05 * p1.penalty);
        let val = fit.val_loss.unwrap();
        // Below the Bayes loss would prove that x_k leaks into its own output; the L1 penalty
        // at lambda = 1 costs some accuracy (about 25% here).
        assert!(
            val > 0.95 * bayes && val < 1.35 * bayes && val < var,
            "held-out {val}, Bayes {bayes}, mean {var}"
        );
        let report = structure_report(&fit.params, ngm.allowed_units()).unwrap();
        eprintln!("{report:?}");
        assert!(report.forbidden_fraction < 0.01, "{report:?}");
        assert!(report.max_forbidden_sensitivity < 0.1, "{report:?}");
    }

    #[test]
    fn same_seed_same_params() {
        let data = scaled_ggm(&GgmConfig::new(3, 200, GraphShape::Chain), 5);
        let ngm = Ngm::new(
            reals(3),
            FeatureGraph::new(3, data.adjacency.clone()).unwrap(),
        )
        .unwrap();
        let cfg = NgmConfig {
            batch_size: 32,
            ..fast_cfg(&[8], 5, 9)
        };
        let a = ngm.fit(None, &data.x, &cfg).unwrap();
        let b = ngm.fit(None, &data.x, &cfg).unwrap();
        assert_eq!(a.params, b.params);
        assert_eq!(a.best_epoch, b.best_epoch);
        let c = ngm
            .fit(None, &data.x, &NgmConfig { seed: 10, ..cfg })
            .unwrap();
        assert_ne!(a.params, c.params);
    }

    #[test]
    fn distillation_matches_the_ensemble_average() {
        let data = scaled_ggm(&GgmConfig::new(3, 600, GraphShape::Chain), 8);
        let ngm = Ngm::new(
            reals(3),
            FeatureGraph::new(3, data.adjacency.clone()).unwrap(),
        )
        .unwrap();
        let (a, b) = data.x.split_at(300 * 3);
        let fa = ngm.fit(None, a, &fast_cfg(&[12], 300, 1)).unwrap();
        let fb = ngm.fit(None, b, &fast_cfg(&[12], 300, 2)).unwrap();
        let members = [(&fa.params, 1.0), (&fb.params, 1.0)];
        let targets = ngm.average_predictions(&members, &data.x).unwrap();
        let cfg = fast_cfg(&[12], 400, 3);
        let global = ngm
            .fit_distill(
                None,
                Distill {
                    inputs: &data.x,
                    targets: &targets,
                    public: None,
                    gamma: 0.0,
                },
                &cfg,
            )
            .unwrap();
        let gap = ngm
            .regression_loss(&global.params, &data.x, &targets)
            .unwrap();
        let own = ngm
            .regression_loss(&global.params, &data.x, &data.x)
            .unwrap();
        let members_own = ngm.regression_loss(&fa.params, &data.x, &data.x).unwrap();
        eprintln!("distill gap {gap:.2e}, global x->x {own:.5}, member A x->x {members_own:.5}");
        assert!(
            gap < 0.1 * own,
            "the global model reproduces the members' average"
        );
        assert!(global.penalty < 0.1, "and respects S: {}", global.penalty);
    }
}

mod inference {
    use super::*;

    /// The gradient method's target for one unknown `u` with a linear-Gaussian model: the `x_u`
    /// minimising `sum_{k known} (E[x_k | x_-k] - x_k)^2`, i.e. `sum_k ((Θ x~)_k / Θ_kk)^2`.
    fn self_consistent(s: &Scaled, row: &[f32], u: usize) -> f64 {
        let d = s.d;
        let xt: Vec<f64> = (0..d).map(|j| f64::from(row[j]) - s.mean[j]).collect();
        let (mut num, mut den) = (0.0, 0.0);
        for k in (0..d).filter(|&k| k != u) {
            let t = &s.precision[k * d..(k + 1) * d];
            let a = t[u] / t[k];
            let c: f64 = (0..d)
                .filter(|&j| j != u)
                .map(|j| t[j] * xt[j])
                .sum::<f64>()
                / t[k];
            num += a * c;
            den += a * a;
        }
        s.mean[u] - num / den
    }

    #[test]
    fn recovers_gaussian_conditional_means() {
        let mut g = GgmConfig::new(3, 3000, GraphShape::Chain);
        g.weight = (0.9, 0.9);
        g.diag_margin = 0.4;
        let s = scaled_ggm(&g, 11);
        let ngm = Ngm::new(reals(3), FeatureGraph::new(3, s.adjacency.clone()).unwrap()).unwrap();
        let fit = ngm.fit(None, &s.x, &fast_cfg(&[24], 600, 4)).unwrap();
        let marg = Marginals::from_data(&ngm, &s.x).unwrap();
        let test = &s.x[..200 * 3];
        let mp = InferConfig {
            method: InferMethod::MessagePassing,
            max_itr: 200,
            eps: 1e-10,
            ..InferConfig::default()
        };
        let grad = InferConfig {
            lr: 1e-2,
            max_itr: 1500,
            eps: 1e-9,
            ..InferConfig::default()
        };
        for u in [2usize, 1] {
            let known: Vec<bool> = (0..3).map(|k| k != u).collect();
            let kidx: Vec<usize> = (0..3).filter(|&k| k != u).collect();
            let truth: Vec<f64> = test
                .chunks_exact(3)
                .map(|r| {
                    let vals: Vec<f64> = kidx.iter().map(|&k| f64::from(r[k])).collect();
                    conditional_mean(&s.precision, &s.mean, &kidx, &vals).unwrap()[0]
                })
                .collect();
            let err = |x: &[f32], t: &[f64]| {
                x.chunks_exact(3)
                    .zip(t)
                    .map(|(r, t)| (f64::from(r[u]) - t).abs())
                    .sum::<f64>()
                    / t.len() as f64
            };
            let baseline = truth
                .iter()
                .map(|t| (f64::from(marg.means()[u]) - t).abs())
                .sum::<f64>()
                / truth.len() as f64;
            let inf = ngm
                .infer(&fit.params, test, Known::Units(&known), marg.means(), &mp)
                .unwrap();
            let mp_err = err(&inf.x, &truth);
            // Known entries come back untouched.
            assert!(
                inf.x
                    .chunks_exact(3)
                    .zip(test.chunks_exact(3))
                    .all(|(a, b)| kidx.iter().all(|&k| a[k] == b[k]))
            );
            let inf = ngm
                .infer(&fit.params, test, Known::Units(&known), marg.means(), &grad)
                .unwrap();
            let target: Vec<f64> = test
                .chunks_exact(3)
                .map(|r| self_consistent(&s, r, u))
                .collect();
            let grad_err = err(&inf.x, &target);
            let grad_vs_truth = err(&inf.x, &truth);
            eprintln!(
                "x{u}: message passing vs E[x|rest] {mp_err:.4}; gradient vs its \
                 self-consistent target {grad_err:.4} (vs E[x|rest] {grad_vs_truth:.4}); \
                 marginal mean {baseline:.4}"
            );
            assert!(mp_err < 0.02, "message passing error {mp_err}");
            assert!(mp_err < 0.25 * baseline);
            assert!(grad_err < 0.05, "gradient inference error {grad_err}");
        }
    }
}

mod sampling {
    use super::*;

    #[test]
    fn samples_keep_correlation_and_category_frequencies() {
        // x0 - x1 strongly correlated reals, c a 3-level category driven by x1.
        let mut g = GgmConfig::new(2, 2000, GraphShape::Chain);
        g.weight = (1.0, 1.0);
        g.diag_margin = 0.3;
        let s = scaled_ggm(&g, 21);
        let true_corr = corr(&s.x, 2, 0, 1);
        let mut x = Vec::with_capacity(2000 * 5);
        let mut freq = [0.0f64; 3];
        for r in s.x.chunks_exact(2) {
            let level = if r[1] < 0.4 {
                0
            } else if r[1] < 0.6 {
                1
            } else {
                2
            };
            freq[level] += 1.0 / 2000.0;
            x.extend_from_slice(r);
            x.extend((0..3).map(|c| f32::from(u8::from(c == level))));
        }
        let blocks = vec![real("x0", 0), real("x1", 1), cat("c", 2, 3)];
        let ngm = Ngm::new(
            blocks,
            FeatureGraph::from_edges(3, &[(0, 1), (1, 2)]).unwrap(),
        )
        .unwrap();
        let fit = ngm.fit(None, &x, &fast_cfg(&[24], 500, 2)).unwrap();
        let marg = Marginals::from_data(&ngm, &x).unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        // Conditional standard deviation of one real given the other, normalised units.
        let (v0, v1) = (s.covariance[0], s.covariance[3]);
        let cond_sd = ((v0 + v1) / 2.0 * (1.0 - true_corr * true_corr)).sqrt() as f32;
        let run = |noise: SampleNoise, rng: &mut StdRng| {
            let mut all = Vec::new();
            let mut per_start = Vec::new();
            for start in 0..3 {
                let cfg = SampleConfig {
                    start: Some(start),
                    noise,
                    ..SampleConfig::default()
                };
                let part = ngm.sample(&fit.params, &marg, 400, &cfg, rng).unwrap();
                per_start.push(corr(&part, 5, 0, 1));
                all.extend(part);
            }
            let n = (all.len() / 5) as f64;
            let freq: Vec<f64> = (0..3)
                .map(|c| {
                    all.chunks_exact(5)
                        .map(|r| f64::from(r[2 + c]))
                        .sum::<f64>()
                        / n
                })
                .collect();
            let pooled = corr(&all, 5, 0, 1);
            (all, per_start, pooled, freq)
        };
        // The reference code's noise, v + U(-0.05|v|, 0.05|v|): each sample is nearly the
        // conditional mean, so within one ordering the correlation is close to +-1.
        let (code, code_starts, code_corr, code_freq) = run(SampleNoise::Relative(0.05), &mut rng);
        // Gaussian noise of the true conditional spread reproduces the joint law.
        let (samples, starts, sampled_corr, sampled_freq) =
            run(SampleNoise::Gaussian(cond_sd), &mut rng);
        eprintln!(
            "corr data {true_corr:.3}; relative noise: per start {code_starts:.3?}, pooled \
             {code_corr:.3}, levels {code_freq:.3?}; gaussian noise (sd {cond_sd:.3}): per start \
             {starts:.3?}, pooled {sampled_corr:.3}, levels {sampled_freq:.3?}; data levels \
             {freq:.3?}"
        );
        assert!(true_corr.abs() > 0.5);
        for c in &code_starts {
            assert!(c.signum() == true_corr.signum() && c.abs() >= true_corr.abs() - 0.05);
        }
        assert!(
            code.chunks_exact(5)
                .all(|r| r.iter().all(|v| v.is_finite()))
        );
        // Within each ordering the correlation is reproduced; pooling orderings mixes
        // slightly different marginals (each ordering shrinks its later features towards
        // conditional means fed with soft categorical inputs), which weakens it.
        for c in &starts {
            assert!((c - true_corr).abs() < 0.2);
        }
        assert!(sampled_corr.signum() == true_corr.signum() && sampled_corr.abs() > 0.4);
        // Category frequencies roughly (measured off by up to 0.11 for the top level).
        for c in 0..3 {
            assert!((sampled_freq[c] - freq[c]).abs() < 0.15, "level {c}");
        }
        // Every categorical block is a one-hot code.
        assert!(
            samples
                .chunks_exact(5)
                .all(|r| r[2..].iter().sum::<f32>() == 1.0
                    && r[2..].iter().all(|&v| v == 0.0 || v == 1.0))
        );
    }

    #[test]
    fn gibbs_sweeps_bring_the_samples_spread_closer_to_the_data() {
        // A chain x0 - x1 - x2 - x3, visited from x0: x1 is drawn given x0 alone (x2 and x3
        // at the model's fixed point), but residual noise is its spread given x0 and x2, so
        // the sequential pass gets the spreads wrong; sweeps draw from full conditionals.
        let mut g = GgmConfig::new(4, 3000, GraphShape::Chain);
        g.weight = (0.9, 0.9);
        g.diag_margin = 0.3;
        let s = scaled_ggm(&g, 4);
        let ngm = Ngm::new(
            reals(4),
            FeatureGraph::from_edges(4, &[(0, 1), (1, 2), (2, 3)]).unwrap(),
        )
        .unwrap();
        let fit = ngm.fit(None, &s.x, &fast_cfg(&[24], 400, 3)).unwrap();
        let marg = Marginals::from_data(&ngm, &s.x)
            .unwrap()
            .with_residuals(&ngm, &fit.params)
            .unwrap();
        let var = |x: &[f32], k: usize| {
            let col: Vec<f64> = x.chunks_exact(4).map(|r| f64::from(r[k])).collect();
            let m = col.iter().sum::<f64>() / col.len() as f64;
            col.iter().map(|v| (v - m).powi(2)).sum::<f64>() / col.len() as f64
        };
        let ratios = |sweeps: usize| -> Vec<f64> {
            let cfg = SampleConfig {
                start: Some(0),
                noise: SampleNoise::Residual,
                gibbs_sweeps: sweeps,
                ..SampleConfig::default()
            };
            let mut rng = StdRng::seed_from_u64(8);
            let x = ngm
                .sample(&fit.params, &marg, 3000, &cfg, &mut rng)
                .unwrap();
            (0..4).map(|k| var(&x, k) / var(&s.x, k)).collect()
        };
        let (none, swept) = (ratios(0), ratios(5));
        eprintln!("sample / data variance: no sweeps {none:.3?}, 5 sweeps {swept:.3?}");
        // Measured: no sweeps [1.004, 1.273, 0.841, 0.961], 5 sweeps [0.993, 1.165, 1.100,
        // 1.007].
        let worst = |r: &[f64]| r.iter().map(|v| (v - 1.0).abs()).fold(0.0, f64::max);
        assert!(worst(&none) > 0.2, "{none:?}");
        assert!(
            worst(&swept) < 0.2 && worst(&swept) < worst(&none),
            "{swept:?}"
        );
    }
}

mod ngr {
    use super::*;

    #[test]
    fn recovers_a_sparse_graph_better_than_chance() {
        let mut g = GgmConfig::new(6, 2000, GraphShape::Chain);
        g.weight = (0.8, 1.0);
        g.diag_margin = 0.3;
        let s = scaled_ggm(&g, 31);
        let truth = FeatureGraph::new(6, s.adjacency.clone()).unwrap();
        let ngm = Ngm::new(reals(6), FeatureGraph::complete(6)).unwrap();
        // The raw path product: with the row-normalised P the all-entries L1 term is met by
        // routing every input to one output (the readout becomes a star; see `PathNorm`).
        let cfg = NgmConfig {
            lambda: 0.1,
            path: PathNorm::Raw,
            ..fast_cfg(&[32], 600, 6)
        };
        let fit = ngm.fit_ngr(None, &s.x, &cfg).unwrap();
        let edges = truth.edges().len();
        let sparsity = edges as f64 / 15.0;
        let est = ngr_graph(
            &fit.params,
            ngm.blocks(),
            sparsity,
            PathNorm::Raw,
            BlockAggregate::Max,
        )
        .unwrap();
        let tp = est
            .edges()
            .iter()
            .filter(|&&(i, j)| truth.has_edge(i, j))
            .count();
        let precision = tp as f64 / est.edges().len() as f64;
        let recall = tp as f64 / edges as f64;
        eprintln!(
            "NGR: {tp} of {edges} true edges; precision {precision:.2}, recall {recall:.2}; chance {sparsity:.2}"
        );
        assert!(precision >= 0.8 && recall >= 0.8);
    }
}

mod stitching {
    use super::*;

    #[test]
    fn frozen_keeps_global_weights_and_adds_the_new_feature() {
        let mut g = GgmConfig::new(3, 1500, GraphShape::Chain);
        g.weight = (0.9, 0.9);
        g.diag_margin = 0.3;
        let s = scaled_ggm(&g, 41);
        // The global model knows x0 - x1; the client also has x2 (linked to x1).
        let global_blocks = reals(2);
        let global_ngm = Ngm::new(
            global_blocks.clone(),
            FeatureGraph::from_edges(2, &[(0, 1)]).unwrap(),
        )
        .unwrap();
        let xg: Vec<f32> = s.x.chunks_exact(3).flat_map(|r| [r[0], r[1]]).collect();
        let global = global_ngm.fit(None, &xg, &fast_cfg(&[16], 300, 1)).unwrap();
        let ext = Ngm::new(
            reals(3),
            FeatureGraph::from_edges(3, &[(0, 1), (1, 2)]).unwrap(),
        )
        .unwrap();
        let cfg = StitchConfig {
            new_hidden: 8,
            mode: StitchMode::Frozen,
            init_scale: 0.1,
            fit: fast_cfg(&[], 400, 2),
        };
        let (train, test) = s.x.split_at(1200 * 3);
        let st = ext
            .stitch(&global.params, &global_blocks, train, &cfg)
            .unwrap();
        // Every copied global entry is bit-identical.
        for (name, t) in global.params.iter() {
            let new = st.params.get(name).unwrap();
            let (out, inp) = (t.rows(), t.row_len());
            let new_in = new.row_len();
            for o in 0..out {
                for i in 0..inp {
                    assert_eq!(
                        t.data[o * inp + i].to_bits(),
                        new.data[o * new_in + i].to_bits(),
                        "{name}[{o}, {i}]"
                    );
                }
            }
        }
        // The stitched model predicts the added feature from the others.
        let marg = Marginals::from_data(&ext, train).unwrap();
        let known = [true, true, false];
        let mp = InferConfig {
            method: InferMethod::MessagePassing,
            max_itr: 100,
            eps: 1e-10,
            ..InferConfig::default()
        };
        let inf = ext
            .infer(&st.params, test, Known::Units(&known), marg.means(), &mp)
            .unwrap();
        let n = test.len() / 3;
        let truth: Vec<f64> = test
            .chunks_exact(3)
            .map(|r| {
                let v = [f64::from(r[0]), f64::from(r[1])];
                conditional_mean(&s.precision, &s.mean, &[0, 1], &v).unwrap()[0]
            })
            .collect();
        let mae = |pred: &dyn Fn(usize) -> f64| {
            (0..n).map(|r| (pred(r) - truth[r]).abs()).sum::<f64>() / n as f64
        };
        let stitched = mae(&|r| f64::from(inf.x[r * 3 + 2]));
        let mean_only = mae(&|_| f64::from(marg.means()[2]));
        eprintln!(
            "E[x2 | x0, x1] from the stitched model: MAE {stitched:.4}; from x2's mean: \
             {mean_only:.4}"
        );
        assert!(stitched < 0.03 && stitched < 0.3 * mean_only);
        // Fine-tuning moves the global weights.
        let ft = ext
            .stitch(
                &global.params,
                &global_blocks,
                train,
                &StitchConfig {
                    mode: StitchMode::FineTune { lr: 1e-3 },
                    fit: fast_cfg(&[], 20, 2),
                    ..cfg.clone()
                },
            )
            .unwrap();
        let w = ft.params.get("layers.0.weight").unwrap();
        let gw = global.params.get("layers.0.weight").unwrap();
        assert_ne!(w.data[0], gw.data[0]);
    }
}
