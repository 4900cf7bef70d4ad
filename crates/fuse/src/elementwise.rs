//! Coordinate-wise aggregators: weighted mean (FedAvg), median (FedMedian), trimmed mean
//! (FedTrimmedAvg).

use fedfuse_core::Params;

use crate::{FuseError, Result};

/// Weighted mean of equally long vectors; weights need not sum to one.
///
/// Accumulates in f64 so that thousands of clients do not lose precision.
pub fn weighted_mean(items: &[(&[f32], f64)]) -> Vec<f32> {
    let Some((first, _)) = items.first() else {
        return Vec::new();
    };
    let total: f64 = items.iter().map(|(_, w)| w).sum();
    let mut acc = vec![0f64; first.len()];
    for (v, w) in items {
        let scale = w / total;
        for (a, x) in acc.iter_mut().zip(v.iter()) {
            *a += scale * f64::from(*x);
        }
    }
    acc.into_iter().map(|a| a as f32).collect()
}

/// Coordinate-wise median (mean of the two middle values for an even count, as numpy).
pub fn median(items: &[&[f32]]) -> Vec<f32> {
    per_coordinate(items, |column| {
        let n = column.len();
        let mid = n / 2;
        let (_, upper, _) = column.select_nth_unstable_by(mid, f32::total_cmp);
        let upper = *upper;
        if n % 2 == 1 {
            upper
        } else {
            let lower = column[..mid]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            (lower + upper) / 2.0
        }
    })
}

/// Bulyan's coordinate rule (Flower's `aggregate_n_closest_weights`): per coordinate, the
/// mean of the `beta` values nearest the coordinate-wise median.
pub fn mean_nearest_median(items: &[&[f32]], beta: usize) -> Result<Vec<f32>> {
    if beta == 0 || beta > items.len() {
        return Err(FuseError::InvalidSetting {
            field: "beta",
            reason: format!("{beta} is not between 1 and the {} models", items.len()),
        });
    }
    let mid = median(items);
    let mut j = 0;
    Ok(per_coordinate(items, |column| {
        let m = mid[j];
        j += 1;
        column.sort_by(|a, b| (a - m).abs().total_cmp(&(b - m).abs()));
        let sum: f64 = column[..beta].iter().map(|&v| f64::from(v)).sum();
        (sum / beta as f64) as f32
    }))
}

/// Coordinate-wise mean after dropping the `floor(beta * n)` smallest and largest values
/// (Flower's `FedTrimmedAvg`, scipy's `trim_mean`).
pub fn trimmed_mean(items: &[&[f32]], beta: f64) -> Result<Vec<f32>> {
    if !(0.0..0.5).contains(&beta) {
        return Err(FuseError::InvalidSetting {
            field: "beta",
            reason: format!("{beta} is not in [0, 0.5)"),
        });
    }
    let cut = (beta * items.len() as f64).floor() as usize;
    Ok(per_coordinate(items, |column| {
        column.sort_unstable_by(f32::total_cmp);
        let kept = &column[cut..column.len() - cut];
        (kept.iter().map(|v| f64::from(*v)).sum::<f64>() / kept.len() as f64) as f32
    }))
}

fn per_coordinate(items: &[&[f32]], mut f: impl FnMut(&mut [f32]) -> f32) -> Vec<f32> {
    let Some(first) = items.first() else {
        return Vec::new();
    };
    let mut column = vec![0f32; items.len()];
    (0..first.len())
        .map(|j| {
            for (c, v) in column.iter_mut().zip(items) {
                *c = v[j];
            }
            f(&mut column)
        })
        .collect()
}

/// Applies a vector aggregator tensor by tensor; all inputs must share the first's layout.
fn per_tensor(
    models: &[&Params],
    mut f: impl FnMut(&[&[f32]]) -> Result<Vec<f32>>,
) -> Result<Params> {
    let first = models.first().ok_or(FuseError::Empty)?;
    let layout = first.layout();
    for m in models {
        m.check_layout(&layout)?;
    }
    let mut out = Params::new();
    for (i, (name, t)) in first.iter().enumerate() {
        let columns: Vec<&[f32]> = models
            .iter()
            .filter_map(|m| m.tensor_at(i).map(|t| t.data.as_slice()))
            .collect();
        out.push(name, t.shape.clone(), f(&columns)?)?;
    }
    Ok(out)
}

/// A running example-weighted sum of models, for a mean that never holds more than one model
/// besides the sum (FedAvg over thousands of clients in bounded memory).
#[derive(Clone, Debug, Default)]
pub struct WeightedSum {
    layout: Vec<fedfuse_core::ParamShape>,
    sums: Vec<Vec<f64>>,
    total: f64,
    count: usize,
}

impl WeightedSum {
    /// An empty sum.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `weight * model`; the first model fixes the layout, later ones must match it.
    pub fn add(&mut self, model: &Params, weight: f64) -> Result<()> {
        if !(weight.is_finite() && weight >= 0.0) {
            return Err(FuseError::InvalidSetting {
                field: "num_examples",
                reason: format!("weight {weight} is not a non-negative number"),
            });
        }
        if self.count == 0 {
            self.layout = model.layout();
            self.sums = model
                .iter()
                .map(|(_, t)| vec![0f64; t.data.len()])
                .collect();
        } else {
            model.check_layout(&self.layout)?;
        }
        for (sum, (_, t)) in self.sums.iter_mut().zip(model.iter()) {
            for (s, x) in sum.iter_mut().zip(&t.data) {
                *s += weight * f64::from(*x);
            }
        }
        self.total += weight;
        self.count += 1;
        Ok(())
    }

    /// Models added so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The weighted mean of the models added.
    pub fn mean(&self) -> Result<Params> {
        if self.count == 0 {
            return Err(FuseError::Empty);
        }
        if self.total <= 0.0 {
            return Err(FuseError::InvalidSetting {
                field: "num_examples",
                reason: "all weights are zero".into(),
            });
        }
        let mut out = Params::new();
        for (shape, sum) in self.layout.iter().zip(&self.sums) {
            let data = sum.iter().map(|s| (s / self.total) as f32).collect();
            out.push(shape.name.clone(), shape.shape.clone(), data)?;
        }
        Ok(out)
    }
}

/// [`weighted_mean`] over whole models (FedAvg with weights = examples).
pub fn weighted_mean_params(models: &[(&Params, f64)]) -> Result<Params> {
    let mut sum = WeightedSum::new();
    for (p, w) in models {
        sum.add(p, *w)?;
    }
    sum.mean()
}

/// [`median`] over whole models (FedMedian).
pub fn median_params(models: &[&Params]) -> Result<Params> {
    per_tensor(models, |cols| Ok(median(cols)))
}

/// [`mean_nearest_median`] over whole models (Bulyan's last step).
pub fn mean_nearest_median_params(models: &[&Params], beta: usize) -> Result<Params> {
    per_tensor(models, |cols| mean_nearest_median(cols, beta))
}

/// [`trimmed_mean`] over whole models (FedTrimmedAvg).
pub fn trimmed_mean_params(models: &[&Params], beta: f64) -> Result<Params> {
    per_tensor(models, |cols| trimmed_mean(cols, beta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn median_matches_numpy() {
        // np.median([[1, 9], [5, 2], [3, 4]], axis=0) -> [3., 4.]
        // np.median([[1, 9], [5, 2], [3, 4], [10, 0]], axis=0) -> [4., 3.]
        let (a, b, c, d) = ([1.0, 9.0], [5.0, 2.0], [3.0, 4.0], [10.0, 0.0]);
        assert_eq!(median(&[&a, &b, &c]), vec![3.0, 4.0]);
        assert_eq!(median(&[&a, &b, &c, &d]), vec![4.0, 3.0]);
    }

    #[test]
    fn mean_nearest_median_by_hand() {
        // Column [1, 2, 3, 4, 100]: median 3; the 3 nearest are 3, 2, 4 -> 3.
        // Column [0, 0, 10, 10, 11]: median 10; the 3 nearest are 10, 10, 11 -> 31 / 3.
        let vals = [
            [1.0f32, 0.0],
            [2.0, 0.0],
            [3.0, 10.0],
            [4.0, 10.0],
            [100.0, 11.0],
        ];
        let items: Vec<&[f32]> = vals.iter().map(|v| v.as_slice()).collect();
        let got = mean_nearest_median(&items, 3).unwrap();
        assert_eq!(got[0], 3.0);
        assert!((got[1] - 31.0 / 3.0).abs() < 1e-6, "{got:?}");
        assert_eq!(mean_nearest_median(&items, 5).unwrap()[0], 22.0);
        assert!(mean_nearest_median(&items, 0).is_err());
        assert!(mean_nearest_median(&items, 6).is_err());
    }

    #[test]
    fn trimmed_mean_matches_scipy() {
        // scipy.stats.trim_mean([1, 2, 3, 4, 100], 0.2) -> 3.0
        let vals = [[1.0f32], [2.0], [3.0], [4.0], [100.0]];
        let items: Vec<&[f32]> = vals.iter().map(|v| v.as_slice()).collect();
        assert_eq!(trimmed_mean(&items, 0.2).unwrap(), vec![3.0]);
        assert_eq!(trimmed_mean(&items, 0.0).unwrap(), vec![22.0]);
        assert!(trimmed_mean(&items, 0.5).is_err());
    }

    #[test]
    fn weighted_mean_by_hand() {
        let (a, b) = ([0.0f32, 10.0], [4.0f32, 2.0]);
        // (1*0 + 3*4)/4 = 3, (1*10 + 3*2)/4 = 4
        assert_eq!(weighted_mean(&[(&a, 1.0), (&b, 3.0)]), vec![3.0, 4.0]);
    }

    #[test]
    fn weighted_sum_is_the_weighted_mean() {
        let mut p = Params::new();
        p.push("w", vec![2], vec![0.0, 10.0]).unwrap();
        let mut q = Params::new();
        q.push("w", vec![2], vec![4.0, 2.0]).unwrap();
        let m = weighted_mean_params(&[(&p, 1.0), (&q, 3.0)]).unwrap();
        assert_eq!(m.get("w").unwrap().data, vec![3.0, 4.0]);
        assert!(weighted_mean_params(&[(&p, 0.0)]).is_err());
        assert!(weighted_mean_params(&[(&p, f64::NAN)]).is_err());
    }

    #[test]
    fn layouts_must_agree() {
        let mut p = Params::new();
        p.push("w", vec![2], vec![1.0, 2.0]).unwrap();
        let mut q = Params::new();
        q.push("w", vec![1, 2], vec![1.0, 2.0]).unwrap();
        assert!(median_params(&[&p, &q]).is_err());
        assert!(matches!(median_params(&[]), Err(FuseError::Empty)));
    }

    proptest! {
        #[test]
        fn aggregators_are_order_free_and_bounded(
            rows in proptest::collection::vec(proptest::collection::vec(-1e3f32..1e3, 5), 1..9),
            w in proptest::collection::vec(0.1f64..10.0, 9),
        ) {
            let items: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
            let mut rev = items.clone();
            rev.reverse();
            prop_assert_eq!(median(&items), median(&rev));
            let weighted: Vec<(&[f32], f64)> = items.iter().copied().zip(w.iter().copied()).collect();
            let m = weighted_mean(&weighted);
            let t = trimmed_mean(&items, 0.2).unwrap();
            for j in 0..5 {
                let lo = rows.iter().map(|r| r[j]).fold(f32::INFINITY, f32::min);
                let hi = rows.iter().map(|r| r[j]).fold(f32::NEG_INFINITY, f32::max);
                for v in [m[j], median(&items)[j], t[j]] {
                    prop_assert!(v >= lo - 1e-2 && v <= hi + 1e-2);
                }
            }
        }
    }
}
