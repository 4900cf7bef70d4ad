//! The in-memory dataset type.

use std::sync::Arc;

use crate::error::{DataError, Result};

/// A labelled dataset held in memory.
///
/// Samples are stored row-major and contiguous:
/// `x.len() == len() * sample_shape.iter().product()`, and sample `i` is
/// `x[i * dim() .. (i + 1) * dim()]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Features, row-major, one sample after another.
    pub x: Vec<f32>,
    /// Class ids, one per sample, each `< num_classes`.
    pub y: Vec<u32>,
    /// Shape of one sample (e.g. `[1, 28, 28]` for MNIST, `[64]` for digits).
    pub sample_shape: Vec<usize>,
    /// Number of classes; labels lie in `0..num_classes`.
    pub num_classes: usize,
    /// A natural id per sample (FEMNIST's writer), which a `natural_id` partition splits by;
    /// `None` for datasets without one.
    pub ids: Option<SampleIds>,
}

/// One categorical value per sample: the column a natural partition reads (FEMNIST's
/// `writer_id`).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleIds {
    /// The column's name, as `partition.column` names it.
    pub column: String,
    /// The distinct values, sorted; shared by the splits of one dataset.
    pub names: Arc<[String]>,
    /// Per sample, an index into `names`.
    pub of: Vec<u32>,
}

impl SampleIds {
    /// The ids as a categorical column, for the partitioners.
    pub fn to_column(&self) -> crate::Column {
        crate::Column::Categorical {
            levels: self.names.to_vec(),
            codes: self.of.clone(),
        }
    }
}

/// A dataset's standard train and test splits.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainTest {
    /// Training split.
    pub train: Dataset,
    /// Test split.
    pub test: Dataset,
}

/// One federated client's local data: its partition split into local train and test sets.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientData {
    /// Local training data.
    pub train: Dataset,
    /// Local held-out data.
    pub test: Dataset,
}

impl Dataset {
    /// Builds a dataset, checking that `x` holds exactly `y.len()` samples of shape
    /// `sample_shape` and that every label is `< num_classes`.
    pub fn new(
        x: Vec<f32>,
        y: Vec<u32>,
        sample_shape: Vec<usize>,
        num_classes: usize,
    ) -> Result<Dataset> {
        let dim = sample_shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                DataError::InvalidDataset(format!("sample_shape {sample_shape:?} overflows usize"))
            })?;
        if dim == 0 {
            return Err(DataError::InvalidDataset(format!(
                "sample_shape {sample_shape:?} has a zero dimension; every sample needs at least one feature"
            )));
        }
        let expected = y.len().checked_mul(dim).ok_or_else(|| {
            DataError::InvalidDataset(format!(
                "{} samples of {dim} features overflow usize",
                y.len()
            ))
        })?;
        if x.len() != expected {
            return Err(DataError::InvalidDataset(format!(
                "x has {} values but {} labels x {dim} features (sample_shape {sample_shape:?}) need {expected}",
                x.len(),
                y.len()
            )));
        }
        if num_classes == 0 {
            return Err(DataError::InvalidDataset(
                "num_classes is 0; it must be at least 1".into(),
            ));
        }
        if let Some((i, &bad)) = y
            .iter()
            .enumerate()
            .find(|&(_, &l)| l as usize >= num_classes)
        {
            return Err(DataError::InvalidDataset(format!(
                "label {bad} of sample {i} is not below num_classes = {num_classes}"
            )));
        }
        Ok(Dataset {
            x,
            y,
            sample_shape,
            num_classes,
            ids: None,
        })
    }

    /// This dataset with a natural id per sample; an error when the counts differ or an id
    /// has no name.
    pub fn with_ids(mut self, ids: SampleIds) -> Result<Dataset> {
        if ids.of.len() != self.len() {
            return Err(DataError::InvalidDataset(format!(
                "{} `{}` values for {} samples",
                ids.of.len(),
                ids.column,
                self.len()
            )));
        }
        if let Some(bad) = ids.of.iter().find(|&&i| i as usize >= ids.names.len()) {
            return Err(DataError::InvalidDataset(format!(
                "`{}` value {bad} has no name ({} names)",
                ids.column,
                ids.names.len()
            )));
        }
        self.ids = Some(ids);
        Ok(self)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Number of features per sample (the product of `sample_shape`).
    pub fn dim(&self) -> usize {
        self.sample_shape.iter().product()
    }

    /// The features of sample `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`, like slice indexing.
    pub fn sample(&self, i: usize) -> &[f32] {
        let d = self.dim();
        &self.x[i * d..(i + 1) * d]
    }

    /// A new dataset holding the samples at `idx`, in that order (repeats allowed).
    ///
    /// # Panics
    /// If an index is `>= self.len()`, like slice indexing. Use [`Dataset::try_subset`] for
    /// indices that come from outside the program.
    pub fn subset(&self, idx: &[usize]) -> Dataset {
        let d = self.dim();
        let mut x = Vec::with_capacity(idx.len() * d);
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            x.extend_from_slice(&self.x[i * d..(i + 1) * d]);
            y.push(self.y[i]);
        }
        Dataset {
            x,
            y,
            sample_shape: self.sample_shape.clone(),
            num_classes: self.num_classes,
            ids: self.ids.as_ref().map(|ids| SampleIds {
                column: ids.column.clone(),
                names: Arc::clone(&ids.names),
                of: idx.iter().map(|&i| ids.of[i]).collect(),
            }),
        }
    }

    /// Like [`Dataset::subset`], but returns an error naming the first out-of-range index.
    pub fn try_subset(&self, idx: &[usize]) -> Result<Dataset> {
        if let Some(&bad) = idx.iter().find(|&&i| i >= self.len()) {
            return Err(DataError::InvalidArgument {
                field: "subset index",
                msg: format!(
                    "index {bad} is out of range for a dataset of {} samples",
                    self.len()
                ),
            });
        }
        Ok(self.subset(idx))
    }

    /// Number of samples of each class, `num_classes` entries.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0usize; self.num_classes];
        for &l in &self.y {
            if let Some(c) = counts.get_mut(l as usize) {
                *c += 1;
            }
        }
        counts
    }

    /// Appends the samples of `other`, which must have the same sample shape and class count.
    pub fn extend(&mut self, other: &Dataset) -> Result<()> {
        if other.sample_shape != self.sample_shape || other.num_classes != self.num_classes {
            return Err(DataError::InvalidDataset(format!(
                "cannot append samples of shape {:?} with {} classes to a dataset of shape {:?} with {} classes",
                other.sample_shape, other.num_classes, self.sample_shape, self.num_classes
            )));
        }
        match (&mut self.ids, &other.ids) {
            (None, None) => {}
            (Some(a), Some(b)) if a.column == b.column && a.names == b.names => {
                a.of.extend_from_slice(&b.of)
            }
            _ => {
                return Err(DataError::InvalidDataset(
                    "cannot append samples whose natural ids differ from this dataset's".into(),
                ));
            }
        }
        self.x.extend_from_slice(&other.x);
        self.y.extend_from_slice(&other.y);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Dataset {
        Dataset::new(vec![0., 1., 2., 3., 4., 5.], vec![0, 1, 1], vec![2], 2).unwrap()
    }

    #[test]
    fn accessors() {
        let d = toy();
        assert_eq!(d.len(), 3);
        assert!(!d.is_empty());
        assert_eq!(d.dim(), 2);
        assert_eq!(d.sample(1), &[2., 3.]);
        assert_eq!(d.class_counts(), vec![1, 2]);
        let s = d.subset(&[2, 0]);
        assert_eq!(s.x, vec![4., 5., 0., 1.]);
        assert_eq!(s.y, vec![1, 0]);
        assert!(d.try_subset(&[3]).is_err());
    }

    #[test]
    fn validation() {
        assert!(Dataset::new(vec![0.; 5], vec![0, 0, 0], vec![2], 1).is_err());
        let e = Dataset::new(vec![0.; 6], vec![0, 2, 0], vec![2], 2).unwrap_err();
        assert!(e.to_string().contains("label 2 of sample 1"), "{e}");
        assert!(Dataset::new(vec![], vec![], vec![0], 1).is_err());
        assert!(Dataset::new(vec![], vec![], vec![3], 0).is_err());
        assert!(Dataset::new(vec![], vec![], vec![3], 4).unwrap().is_empty());
    }

    #[test]
    fn extend_checks_shape() {
        let mut d = toy();
        d.extend(&toy()).unwrap();
        assert_eq!(d.len(), 6);
        let other = Dataset::new(vec![0.; 3], vec![0], vec![3], 2).unwrap();
        assert!(d.extend(&other).is_err());
    }
}
