//! How well a model predicts a feature from evidence: FedNGM's test scores, used by the
//! server each round and by the experiments.

use fedfuse_core::Params;
use fedfuse_data::{Column, Encoding, Table};
use fedfuse_train::{InferConfig, Known, Ngm};
use serde::Serialize;

use crate::{FedError, Result};
/// How well one feature is predicted from evidence.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PredictionScore {
    /// The predicted feature.
    pub feature: String,
    /// Rows scored.
    pub rows: usize,
    /// Real feature: root mean squared error, in the feature's own units.
    pub rmse: Option<f64>,
    /// Real feature: mean absolute error, in the feature's own units.
    pub mae: Option<f64>,
    /// Categorical feature: share of rows whose most probable level is the true one.
    pub accuracy: Option<f64>,
}

/// Scores predictions of `target` given as encoded rows `predicted` (`n x width` of
/// `encoding`; only the target's block is read) against the rows of `test`: reals decoded to
/// their own units, categoricals by their most probable level.
pub fn score_rows(
    encoding: &Encoding,
    target: &str,
    predicted: &[f32],
    test: &Table,
) -> Result<PredictionScore> {
    let one = encoding.subset(&[target])?;
    let block = encoding
        .blocks()
        .into_iter()
        .find(|b| b.name == target)
        .ok_or_else(|| FedError::InvalidSetting {
            field: "target",
            reason: format!("`{target}` is not a feature of the model"),
        })?;
    let n = test.n_rows();
    let w = encoding.width();
    if predicted.len() != n * w {
        return Err(FedError::InvalidSetting {
            field: "predicted",
            reason: format!("{} values for {n} rows of {w} units", predicted.len()),
        });
    }
    let cut: Vec<f32> = predicted
        .chunks_exact(w)
        .flat_map(|r| r[block.range()].iter().copied())
        .collect();
    let pred = one.decode(&cut, n)?;
    let missing = || FedError::InvalidSetting {
        field: "target",
        reason: format!("the test rows have no column `{target}`"),
    };
    let (p, t) = (
        pred.column(target).ok_or_else(missing)?,
        test.column(target).ok_or_else(missing)?,
    );
    let mut score = PredictionScore {
        feature: target.to_string(),
        rows: n,
        rmse: None,
        mae: None,
        accuracy: None,
    };
    match (p, t) {
        (Column::Real(p), Column::Real(t)) => {
            let (mut se, mut ae) = (0.0f64, 0.0f64);
            for (a, b) in p.iter().zip(t) {
                let e = f64::from(*a) - f64::from(*b);
                se += e * e;
                ae += e.abs();
            }
            score.rmse = Some((se / n as f64).sqrt());
            score.mae = Some(ae / n as f64);
        }
        _ => {
            let hits = (0..n)
                .filter(|&r| p.level(r).is_some() && p.level(r) == t.level(r))
                .count();
            score.accuracy = Some(hits as f64 / n as f64);
        }
    }
    Ok(score)
}

/// Predicts `target` on every row of `test` with `params` of `ngm` (laid out by `encoding`),
/// every other feature known except those in `hidden` (e.g. a column derived from the
/// target), by `infer` (message passing gives conditional means) from the starting point
/// `means`, and scores it with [`score_rows`].
#[allow(clippy::too_many_arguments)]
pub fn score_prediction(
    ngm: &Ngm,
    params: &Params,
    encoding: &Encoding,
    test: &Table,
    target: &str,
    hidden: &[String],
    means: &[f32],
    infer: &InferConfig,
) -> Result<PredictionScore> {
    score_ensemble(ngm, &[params], encoding, test, target, hidden, means, infer)
}

/// Every unit known except the target's and the `hidden` features'.
fn known_units(ngm: &Ngm, target: &str, hidden: &[String]) -> Vec<bool> {
    let mut known = vec![true; ngm.units()];
    for b in ngm
        .blocks()
        .iter()
        .filter(|b| b.name == target || hidden.contains(&b.name))
    {
        known[b.range()].iter_mut().for_each(|k| *k = false);
    }
    known
}

/// Like [`score_prediction`] for the uniform ensemble of `members`: each completes the rows
/// on its own, and the completions are averaged (probabilities on categorical blocks, so the
/// ensemble's level is the most probable on average). What FedNGM's distillation imitates.
#[allow(clippy::too_many_arguments)]
pub fn score_ensemble(
    ngm: &Ngm,
    members: &[&Params],
    encoding: &Encoding,
    test: &Table,
    target: &str,
    hidden: &[String],
    means: &[f32],
    infer: &InferConfig,
) -> Result<PredictionScore> {
    let x = encoding.encode(test)?;
    let known = known_units(ngm, target, hidden);
    let mut mean = vec![0f64; x.x.len()];
    for params in members {
        let inf = ngm.infer(params, &x.x, Known::Units(&known), means, infer)?;
        mean.iter_mut()
            .zip(&inf.x)
            .for_each(|(m, &v)| *m += f64::from(v) / members.len() as f64);
    }
    let mean: Vec<f32> = mean.into_iter().map(|v| v as f32).collect();
    score_rows(encoding, target, &mean, test)
}

/// The no-model baseline: every test row predicted by the training mean (real) or most
/// frequent level (categorical), i.e. `means` read as a prediction.
pub fn score_marginal(
    encoding: &Encoding,
    target: &str,
    means: &[f32],
    test: &Table,
) -> Result<PredictionScore> {
    let rows: Vec<f32> = means
        .iter()
        .copied()
        .cycle()
        .take(test.n_rows() * means.len())
        .collect();
    score_rows(encoding, target, &rows, test)
}
