//! The types every matching module shares (matrices, priors, settings, global units), so that
//! the layer matcher and the scorer depend on them and not on each other.

use crate::{FuseError, Result};

/// Popularity counts are truncated at this value in the score (as the reference code).
pub const POPULARITY_CAP: usize = 10;

/// A dense row-major f64 matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) data: Vec<f64>,
}

impl Matrix {
    /// A matrix from row-major values; `data.len()` must be `rows * cols`.
    pub fn new(rows: usize, cols: usize, data: Vec<f64>) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(FuseError::InvalidInput(format!(
                "a {rows} x {cols} matrix needs {} values but {} were given",
                rows.saturating_mul(cols),
                data.len()
            )));
        }
        Ok(Self { rows, cols, data })
    }

    /// A matrix of zeros.
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row-major values.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// Row `r`.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row(&self, r: usize) -> &[f64] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Row `r`, mutable.
    ///
    /// # Panics
    /// If `r >= rows`.
    pub fn row_mut(&mut self, r: usize) -> &mut [f64] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// The entry at row `r`, column `c`.
    ///
    /// # Panics
    /// If out of range.
    pub fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    /// The transpose.
    pub fn transpose(&self) -> Matrix {
        let mut t = Matrix::zeros(self.cols, self.rows);
        for r in 0..self.rows {
            for c in 0..self.cols {
                t.data[c * self.rows + r] = self.data[r * self.cols + c];
            }
        }
        t
    }

    /// Columns `from..to` of every row, as a new matrix.
    ///
    /// # Panics
    /// If `from > to` or `to > cols`.
    pub fn columns(&self, from: usize, to: usize) -> Matrix {
        let mut data = Vec::with_capacity(self.rows * (to - from));
        for r in 0..self.rows {
            data.extend_from_slice(&self.row(r)[from..to]);
        }
        Matrix {
            rows: self.rows,
            cols: to - from,
            data,
        }
    }

    /// A matrix from row-major values the caller sized.
    pub(super) fn from_parts(rows: usize, cols: usize, data: Vec<f64>) -> Matrix {
        debug_assert_eq!(rows * cols, data.len());
        Matrix { rows, cols, data }
    }

    /// Row-major values, mutable.
    pub(super) fn data_mut(&mut self) -> &mut [f64] {
        &mut self.data
    }

    pub(super) fn push_row(&mut self, row: impl IntoIterator<Item = f64>) {
        self.data.extend(row);
        self.rows += 1;
        debug_assert_eq!(self.data.len(), self.rows * self.cols);
    }

    pub(super) fn remove_row(&mut self, r: usize) {
        self.data.drain(r * self.cols..(r + 1) * self.cols);
        self.rows -= 1;
    }
}

/// The Gaussian prior of global units, per coordinate.
#[derive(Clone, Debug)]
pub struct LayerPrior {
    /// Prior mean `mu0` (0 for weights, 0.1 for biases in the reference).
    pub mean: Vec<f64>,
    /// Prior precision `tau0 = 1/sigma0` (positive).
    pub precision: Vec<f64>,
}

/// Settings of one layer's matching (already checked).
#[derive(Clone, Copy, Debug)]
pub struct LayerSettings {
    /// Mass parameter of the Beta process (`gamma`, positive).
    pub gamma: f64,
    /// Refinement passes after the greedy pass.
    pub iters: usize,
    /// Soft cap on global units: a client is offered `min(L_j, max(cap - L, 1))` new units.
    pub max_global: usize,
    /// Weight of the GPI-FNM term (finite, non-negative): the score becomes the PFNM score
    /// minus `eps` times [`gpi_cost`](crate::gpi_cost). 0 is plain PFNM.
    pub eps: f64,
}

/// Current global units in natural parameters (all clients but the one being matched).
#[derive(Clone, Debug)]
pub struct GlobalUnits {
    /// `L x P` precision-weighted sums.
    pub eta: Matrix,
    /// `L x P` posterior precisions.
    pub lambda: Matrix,
    /// Clients matched to each unit.
    pub counts: Vec<usize>,
}

/// The global units while a layer is matched: as [`GlobalUnits`] but with `lambda` kept once
/// per run of coordinates (`L x runs`).
pub(super) struct Global {
    pub(super) eta: Matrix,
    pub(super) lambda: Matrix,
    pub(super) counts: Vec<usize>,
}

/// Marks "no client unit" in per-global-unit lookups.
pub(super) const NO_UNIT: usize = usize::MAX;

/// Most bytes the score matrices of one matching step may take (the scores and the
/// assignment solver's copy, f64 each): a file of a few megabytes can declare a layer of a
/// hundred thousand units, whose scores against another client's would take tens of
/// gigabytes, so the sizes are checked before anything is allocated.
pub const MAX_SCORE_BYTES: u64 = 4 << 30;

/// Refuses a `rows x cols` score matrix above [`MAX_SCORE_BYTES`], `what` naming the matching.
pub(super) fn check_score_size(
    rows: usize,
    cols: usize,
    what: impl FnOnce() -> String,
) -> crate::Result<()> {
    let bytes = (rows as u128) * (cols as u128) * 16;
    if bytes <= u128::from(MAX_SCORE_BYTES) {
        return Ok(());
    }
    Err(crate::FuseError::InvalidInput(format!(
        "{}: its {rows} x {cols} score matrices would take {:.1} GiB, above fedfuse's bound of \
         {} GiB; fuse models with fewer units in a layer",
        what(),
        bytes as f64 / f64::from(1u32 << 30),
        MAX_SCORE_BYTES >> 30
    )))
}
