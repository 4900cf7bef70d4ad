//! Dataset transforms used to build the papers' learner splits: pixel-permuted copies
//! (MNIST vs permuted MNIST), class subsets and relabelling (e.g. parity).

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::Dataset;
use crate::error::{DataError, Result};

/// The same fixed permutation of feature positions applied to every sample (a seeded shuffle;
/// the same `seed` always gives the same permutation), as in the "permuted MNIST" task.
pub fn permute_features(ds: &Dataset, seed: u64) -> Dataset {
    let d = ds.dim();
    let mut perm: Vec<usize> = (0..d).collect();
    perm.shuffle(&mut StdRng::seed_from_u64(seed));
    let mut x = Vec::with_capacity(ds.x.len());
    for row in ds.x.chunks_exact(d) {
        x.extend(perm.iter().map(|&p| row[p]));
    }
    Dataset {
        x,
        y: ds.y.clone(),
        sample_shape: ds.sample_shape.clone(),
        num_classes: ds.num_classes,
    }
}

/// The samples whose label is in `classes` (labels unchanged).
pub fn select_classes(ds: &Dataset, classes: &[u32]) -> Dataset {
    let idx: Vec<usize> = (0..ds.len())
        .filter(|&i| classes.contains(&ds.y[i]))
        .collect();
    ds.subset(&idx)
}

/// Every label `y` replaced by `map[y]`, over `num_classes` new classes (parity:
/// `map = [0, 1, 0, 1, ...]`, `num_classes = 2`).
pub fn map_labels(ds: &Dataset, map: &[u32], num_classes: usize) -> Result<Dataset> {
    if map.len() != ds.num_classes {
        return Err(DataError::InvalidArgument {
            field: "label map",
            msg: format!(
                "{} entries for {} classes; give one new label per class",
                map.len(),
                ds.num_classes
            ),
        });
    }
    if let Some(bad) = map.iter().find(|&&m| m as usize >= num_classes) {
        return Err(DataError::InvalidArgument {
            field: "label map",
            msg: format!("label {bad} is not below num_classes {num_classes}"),
        });
    }
    Dataset::new(
        ds.x.clone(),
        ds.y.iter().map(|&y| map[y as usize]).collect(),
        ds.sample_shape.clone(),
        num_classes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Dataset {
        Dataset::new(vec![1., 2., 3., 4., 5., 6.], vec![0, 1, 2], vec![2], 3).unwrap()
    }

    #[test]
    fn permutation_is_fixed_and_per_sample() {
        let d = tiny();
        let a = permute_features(&d, 9);
        assert_eq!(a, permute_features(&d, 9));
        for (orig, perm) in d.x.chunks(2).zip(a.x.chunks(2)) {
            let (mut o, mut p) = (orig.to_vec(), perm.to_vec());
            o.sort_by(f32::total_cmp);
            p.sort_by(f32::total_cmp);
            assert_eq!(o, p);
        }
    }

    #[test]
    fn select_and_relabel() {
        let d = tiny();
        let s = select_classes(&d, &[0, 2]);
        assert_eq!(s.y, vec![0, 2]);
        let parity = map_labels(&d, &[0, 1, 0], 2).unwrap();
        assert_eq!(parity.y, vec![0, 1, 0]);
        assert!(map_labels(&d, &[0, 1], 2).is_err());
    }
}
