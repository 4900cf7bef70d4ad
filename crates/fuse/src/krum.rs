//! Krum and Multi-Krum (Blanchard et al. 2017), as Flower's `Krum` aggregates: each model is
//! scored by the sum of squared L2 distances (over all its tensors) to its `n - f - 2`
//! nearest other models, `f` being the number of Byzantine clients tolerated; Krum keeps the
//! best-scored model, Multi-Krum averages the `keep` best.

use fedfuse_core::Params;

use crate::{FuseError, Result};

/// Squared L2 distance between two models of the same layout, over all their values.
fn squared_distance(a: &Params, b: &Params) -> f64 {
    a.iter()
        .zip(b.iter())
        .map(|((_, x), (_, y))| {
            x.data
                .iter()
                .zip(&y.data)
                .map(|(u, v)| {
                    let d = f64::from(*u) - f64::from(*v);
                    d * d
                })
                .sum::<f64>()
        })
        .sum()
}

/// Krum's score of every model: the sum of its `max(1, n - byzantine - 2)` smallest squared
/// distances to the other models (Flower's rule for small `n`).
pub fn krum_scores(models: &[&Params], byzantine: usize) -> Result<Vec<f64>> {
    let n = models.len();
    if n < 2 {
        return Err(FuseError::InvalidSetting {
            field: "clients",
            reason: format!("Krum compares models with each other; {n} given"),
        });
    }
    let layout = models[0].layout();
    for m in &models[1..] {
        m.check_layout(&layout)?;
    }
    let mut dist = vec![0.0f64; n * n];
    for i in 0..n {
        for j in i + 1..n {
            let d = squared_distance(models[i], models[j]);
            dist[i * n + j] = d;
            dist[j * n + i] = d;
        }
    }
    let closest = n.saturating_sub(byzantine + 2).max(1);
    Ok((0..n)
        .map(|i| {
            let mut others: Vec<f64> = (0..n)
                .filter(|&j| j != i)
                .map(|j| dist[i * n + j])
                .collect();
            others.sort_by(f64::total_cmp);
            others.iter().take(closest).sum()
        })
        .collect())
}

/// The `keep` best-scored models' indices, best first (ties to the lower index, as numpy's
/// `argsort` keeps them).
pub fn krum_select(models: &[&Params], byzantine: usize, keep: usize) -> Result<Vec<usize>> {
    if keep == 0 || keep > models.len() {
        return Err(FuseError::InvalidSetting {
            field: "keep",
            reason: format!("{keep} is not between 1 and the {} models", models.len()),
        });
    }
    let scores = krum_scores(models, byzantine)?;
    let mut order: Vec<usize> = (0..models.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order.truncate(keep);
    Ok(order)
}

/// Bulyan (El Mhamdi et al. 2018), as Flower's `Bulyan`: the `n - 2f` best Krum-scored
/// models (one Multi-Krum pass), then per coordinate the mean of the `n - 4f` values nearest
/// the median. Needs `n >= 4f + 3` models; `None` when there are fewer (Flower then skips
/// the round's aggregation).
pub fn bulyan(models: &[&Params], byzantine: usize) -> Result<Option<Params>> {
    let n = models.len();
    if n < 4 * byzantine + 3 {
        return Ok(None);
    }
    let theta = n - 2 * byzantine;
    let beta = theta - 2 * byzantine;
    let selected: Vec<&Params> = krum_select(models, byzantine, theta)?
        .into_iter()
        .map(|i| models[i])
        .collect();
    crate::mean_nearest_median_params(&selected, beta).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(v: f32) -> Params {
        let mut p = Params::new();
        p.push("w", vec![1], vec![v]).unwrap();
        p
    }

    #[test]
    fn bulyan_by_hand() {
        // n = 7, f = 1: the theta = 5 best by Krum are kept, then per coordinate the mean of
        // the beta = 3 values nearest their median.
        let models: Vec<Params> = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 50.0]
            .into_iter()
            .map(scalar)
            .collect();
        let refs: Vec<&Params> = models.iter().collect();
        // Krum scores with f = 1 (4 nearest): 0 -> 1+4+9+16 = 30, 1 -> 1+1+4+9 = 15,
        // 2 -> 1+1+4+4 = 10, 3 -> 10, 4 -> 15, 5 -> 1+4+9+16 = 30, 50 -> huge; the best five
        // are 2, 3, 1, 4, then 0 (tied with 5, lower index first): median 2, the three
        // nearest 2, 1, 3 -> 2.
        let got = bulyan(&refs, 1).unwrap().unwrap();
        assert_eq!(got.get("w").unwrap().data, [2.0]);
        assert!(bulyan(&refs[..6], 1).unwrap().is_none(), "6 < 4f + 3");
    }

    #[test]
    fn scores_and_selection_by_hand() {
        let models: Vec<Params> = [0.0, 1.0, 2.0, 10.0].into_iter().map(scalar).collect();
        let refs: Vec<&Params> = models.iter().collect();
        // f = 1: each model counts its max(1, 4 - 1 - 2) = 1 nearest neighbour.
        assert_eq!(krum_scores(&refs, 1).unwrap(), [1.0, 1.0, 1.0, 64.0]);
        // f = 0: the 2 nearest: 0 -> 1 + 4, 1 -> 1 + 1, 2 -> 1 + 4, 10 -> 64 + 81.
        assert_eq!(krum_scores(&refs, 0).unwrap(), [5.0, 2.0, 5.0, 145.0]);
        assert_eq!(krum_select(&refs, 0, 1).unwrap(), [1]);
        assert_eq!(krum_select(&refs, 0, 3).unwrap(), [1, 0, 2]);
        assert_eq!(krum_select(&refs, 1, 2).unwrap(), [0, 1]);
        assert!(krum_select(&refs, 1, 0).is_err());
        assert!(krum_select(&refs, 1, 5).is_err());
        // Distances run over every tensor of the models.
        let mut a = scalar(0.0);
        a.push("b", vec![2], vec![3.0, 4.0]).unwrap();
        let mut b = scalar(1.0);
        b.push("b", vec![2], vec![0.0, 0.0]).unwrap();
        assert_eq!(krum_scores(&[&a, &b], 0).unwrap(), [26.0, 26.0]);
    }
}
