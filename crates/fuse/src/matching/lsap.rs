//! Rectangular linear sum assignment: the shortest augmenting path algorithm of scipy's
//! `linear_sum_assignment` (Crouse 2016), step for step as the `lsap` crate ports it, so that
//! ties are broken the same way. Unlike that port it minimises the matrix it is given (no
//! negated copy), keeps its buffers from one solve to the next and reads rows as slices.

use std::fmt;

/// Why an assignment could not be solved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LsapError {
    /// More rows than columns.
    Shape,
    /// A cost is NaN or infinite.
    NotFinite,
    /// No augmenting path (cannot happen with finite costs and rows <= columns).
    Infeasible,
}

impl fmt::Display for LsapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Shape => "more rows than columns",
            Self::NotFinite => "a cost is not finite",
            Self::Infeasible => "no feasible assignment",
        })
    }
}

/// Marks "no row" / "no column".
const NONE: usize = usize::MAX;

/// Per-column state, kept together: the search reads all of it for each column it scans.
#[derive(Clone, Copy, Debug)]
struct Col {
    /// Dual variable.
    v: f64,
    /// Length of the shortest path found to this column in the current search.
    shortest: f64,
    /// The row before this column on that path.
    path: usize,
    /// The row assigned to this column.
    row: usize,
}

const FRESH: Col = Col {
    v: 0.0,
    shortest: f64::INFINITY,
    path: NONE,
    row: NONE,
};

/// A reusable solver.
#[derive(Debug, Default)]
pub(super) struct Lsap {
    u: Vec<f64>,
    cols: Vec<Col>,
    col4row: Vec<usize>,
    visited_rows: Vec<bool>,
    visited_cols: Vec<bool>,
    remaining: Vec<usize>,
}

impl Lsap {
    /// The minimum-cost assignment of every row of the `nr x nc` row-major `cost`
    /// (`nr <= nc`): the column of each row.
    pub(super) fn solve(
        &mut self,
        nr: usize,
        nc: usize,
        cost: &[f64],
    ) -> Result<&[usize], LsapError> {
        debug_assert_eq!(cost.len(), nr * nc);
        if nr > nc {
            return Err(LsapError::Shape);
        }
        if !cost.iter().all(|c| c.is_finite()) {
            return Err(LsapError::NotFinite);
        }
        reset(&mut self.u, nr, 0.0);
        reset(&mut self.cols, nc, FRESH);
        reset(&mut self.col4row, nr, NONE);
        reset(&mut self.visited_rows, nr, false);
        reset(&mut self.visited_cols, nc, false);
        reset(&mut self.remaining, nc, NONE);

        for cur_row in 0..nr {
            let (sink, min_val) = self.augmenting_path(nc, cost, cur_row);
            if sink == NONE {
                return Err(LsapError::Infeasible);
            }
            // Update the dual variables.
            self.u[cur_row] += min_val;
            for i in 0..nr {
                if self.visited_rows[i] && i != cur_row {
                    self.u[i] += min_val - self.cols[self.col4row[i]].shortest;
                }
            }
            for (c, &seen) in self.cols.iter_mut().zip(&self.visited_cols) {
                if seen {
                    c.v -= min_val - c.shortest;
                }
            }
            // Augment the previous solution.
            let mut j = sink;
            loop {
                let i = self.cols[j].path;
                self.cols[j].row = i;
                std::mem::swap(&mut self.col4row[i], &mut j);
                if i == cur_row {
                    break;
                }
            }
        }
        Ok(&self.col4row)
    }

    /// Dijkstra from row `i` over reduced costs to the nearest free column: `(sink, length)`,
    /// `sink == NONE` when there is none.
    fn augmenting_path(&mut self, nc: usize, cost: &[f64], mut i: usize) -> (usize, f64) {
        let mut min_val = 0.0;
        // Filled in reverse so that a constant matrix gives the identity (scipy #11602).
        for (it, r) in self.remaining.iter_mut().enumerate() {
            *r = nc - it - 1;
        }
        let mut num_remaining = nc;
        self.visited_rows.fill(false);
        self.visited_cols.fill(false);
        for c in &mut self.cols {
            c.shortest = f64::INFINITY;
        }

        let mut sink = NONE;
        while sink == NONE {
            let mut index = NONE;
            let mut lowest = f64::INFINITY;
            self.visited_rows[i] = true;
            let row = &cost[i * nc..(i + 1) * nc];
            let ui = self.u[i];
            for (it, &j) in self.remaining[..num_remaining].iter().enumerate() {
                let c = &mut self.cols[j];
                let r = min_val + row[j] - ui - c.v;
                if r < c.shortest {
                    c.path = i;
                    c.shortest = r;
                }
                // Among equally short, prefer a free column: it ends the search.
                if c.shortest < lowest || (c.shortest == lowest && c.row == NONE) {
                    lowest = c.shortest;
                    index = it;
                }
            }
            min_val = lowest;
            if min_val == f64::INFINITY {
                return (NONE, min_val);
            }
            let j = self.remaining[index];
            if self.cols[j].row == NONE {
                sink = j;
            } else {
                i = self.cols[j].row;
            }
            self.visited_cols[j] = true;
            num_remaining -= 1;
            self.remaining[index] = self.remaining[num_remaining];
        }
        (sink, min_val)
    }
}

/// Empties `v` and fills it with `n` copies of `x`, keeping its allocation.
fn reset<T: Clone>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    v.resize(n, x);
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use super::*;

    /// The same columns as the `lsap` crate (scipy's algorithm), ties included.
    #[test]
    fn agrees_with_the_lsap_crate() {
        let mut rng = StdRng::seed_from_u64(9);
        let mut solver = Lsap::default();
        for case in 0..300 {
            let nr = rng.random_range(1..12usize);
            let nc = nr + rng.random_range(0..12usize);
            // Small integers give many ties; continuous values give none.
            let cost: Vec<f64> = (0..nr * nc)
                .map(|_| {
                    if case % 2 == 0 {
                        f64::from(rng.random_range(0..4u8))
                    } else {
                        rng.random_range(-10.0..10.0)
                    }
                })
                .collect();
            let (rows, cols) = lsap::solve(nr, nc, &cost, false).expect("lsap solves it");
            let mut want = vec![NONE; nr];
            for (r, c) in rows.into_iter().zip(cols) {
                want[r] = c;
            }
            let got = solver.solve(nr, nc, &cost).expect("solves it");
            assert_eq!(got, want.as_slice(), "case {case}: {nr} x {nc}");
        }
    }

    #[test]
    fn rejects_bad_input() {
        let mut solver = Lsap::default();
        assert_eq!(solver.solve(2, 1, &[0.0, 1.0]), Err(LsapError::Shape));
        assert_eq!(
            solver.solve(1, 2, &[0.0, f64::NAN]),
            Err(LsapError::NotFinite)
        );
        assert_eq!(solver.solve(0, 3, &[]), Ok(&[][..]));
    }
}
