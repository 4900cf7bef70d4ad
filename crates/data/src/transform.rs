//! Dataset transforms used to build the papers' learner splits: pixel-permuted copies
//! (MNIST vs permuted MNIST, for whole datasets or for some of the clients), class subsets
//! and relabelling (e.g. parity).

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use crate::error::{DataError, Result};
use crate::{ClientData, Dataset};

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
        ids: ds.ids.clone(),
    }
}

/// Two client populations over one dataset: the last `permuted` of `clients` see every sample
/// (local train and local test) through [`permute_features`] with `seed`, the others as they
/// are. Score the server's models on a plain copy of the evaluation set extended by its
/// `permute_features(.., seed)` copy to weigh both populations equally.
///
/// `permuted` must lie in `1..=clients.len()`.
pub fn permute_clients(clients: &mut [ClientData], permuted: usize, seed: u64) -> Result<()> {
    if permuted == 0 || permuted > clients.len() {
        return Err(DataError::InvalidArgument {
            field: "permuted_clients",
            msg: format!(
                "{permuted} of {} clients; give 1 to {} (the last ones see permuted features)",
                clients.len(),
                clients.len()
            ),
        });
    }
    let first = clients.len() - permuted;
    for c in &mut clients[first..] {
        c.train = permute_features(&c.train, seed);
        c.test = permute_features(&c.test, seed);
    }
    Ok(())
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
    fn the_last_clients_see_one_permutation() {
        let d = Dataset::new((0..12).map(|v| v as f32).collect(), vec![0; 3], vec![4], 3).unwrap();
        let client = ClientData {
            train: d.clone(),
            test: d.subset(&[0]),
        };
        let mut clients = vec![client.clone(); 3];
        permute_clients(&mut clients, 2, 5).unwrap();
        assert_eq!(clients[0], client);
        let perm = permute_features(&d, 5);
        assert_ne!(perm, d);
        for c in &clients[1..] {
            assert_eq!(c.train, perm);
            assert_eq!(c.test, perm.subset(&[0]));
        }
        for bad in [0, 4] {
            let e = permute_clients(&mut clients, bad, 5)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("permuted_clients") && e.contains("give 1 to 3"),
                "{e}"
            );
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
