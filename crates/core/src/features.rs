//! Where each input feature lives in an encoded row: the layout that a tabular encoder writes and
//! a neural graphical model reads (one unit for a real feature, one unit per level for a one-hot
//! categorical feature).

/// How a feature is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// One unit holding a (normalised) real value.
    Real,
    /// One unit per level, one-hot.
    Categorical,
}

/// The units `start..start + len` of an encoded row belong to feature `name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FeatureBlock {
    /// Feature name (a column name of the source table).
    pub name: String,
    /// First unit of the block.
    pub start: usize,
    /// Units in the block: 1 for [`BlockKind::Real`], the number of levels for
    /// [`BlockKind::Categorical`].
    pub len: usize,
    /// How the feature is encoded.
    pub kind: BlockKind,
}

impl FeatureBlock {
    /// The units of this block, `start..start + len`.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.len
    }
}

/// How a feature pair's unit scores become one score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockAggregate {
    /// The largest `|score|` over the pair's units: a pair is as connected as its strongest
    /// unit link.
    #[default]
    Max,
    /// The sum of `|score|` over the pair's units (favours features with many units).
    Sum,
}

/// Symmetric `D x D` feature scores (zero diagonal) from `U x U` unit scores (row-major; a
/// unit pair counts as `|s[a][b] + s[b][a]| / 2`), aggregated over each pair of `blocks`: the
/// readout of a graph over features from unit-level partial correlations or NGR path products.
/// A block reaching past unit `U` is an error.
pub fn block_scores(
    unit_scores: &[f64],
    units: usize,
    blocks: &[FeatureBlock],
    aggregate: BlockAggregate,
) -> crate::Result<Vec<f64>> {
    if unit_scores.len() != units * units {
        return Err(crate::CoreError::LayoutMismatch(format!(
            "{} unit scores for {units} units; give a {units} x {units} matrix",
            unit_scores.len()
        )));
    }
    if let Some(b) = blocks.iter().find(|b| b.start + b.len > units) {
        return Err(crate::CoreError::LayoutMismatch(format!(
            "block `{}` covers units {:?} but there are only {units}",
            b.name,
            b.range()
        )));
    }
    let d = blocks.len();
    let mut scores = vec![0.0f64; d * d];
    for (i, bi) in blocks.iter().enumerate() {
        for (j, bj) in blocks.iter().enumerate().skip(i + 1) {
            let mut s = 0.0f64;
            for a in bi.range() {
                for b in bj.range() {
                    let v = 0.5 * (unit_scores[a * units + b] + unit_scores[b * units + a]).abs();
                    s = match aggregate {
                        BlockAggregate::Max => s.max(v),
                        BlockAggregate::Sum => s + v,
                    };
                }
            }
            scores[i * d + j] = s;
            scores[j * d + i] = s;
        }
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(name: &str, start: usize, len: usize) -> FeatureBlock {
        let kind = if len == 1 {
            BlockKind::Real
        } else {
            BlockKind::Categorical
        };
        FeatureBlock {
            name: name.into(),
            start,
            len,
            kind,
        }
    }

    #[test]
    fn block_scores_by_hand() {
        // Units: a = 0, b = 1..3 (two levels), c = 3.
        #[rustfmt::skip]
        let s = [
            0.0, 0.2, -0.4, 0.1,
            0.2, 0.0, 0.0, 0.3,
            -0.4, 0.0, 0.0, 0.0,
            0.1, 0.3, 0.0, 0.0,
        ];
        let blocks = [block("a", 0, 1), block("b", 1, 2), block("c", 3, 1)];
        let max = block_scores(&s, 4, &blocks, BlockAggregate::Max).unwrap();
        assert_eq!(max, vec![0.0, 0.4, 0.1, 0.4, 0.0, 0.3, 0.1, 0.3, 0.0]);
        let sum = block_scores(&s, 4, &blocks, BlockAggregate::Sum).unwrap();
        assert!((sum[1] - 0.6).abs() < 1e-12 && (sum[5] - 0.3).abs() < 1e-12);
        assert!(block_scores(&s, 3, &blocks, BlockAggregate::Max).is_err());
        assert!(block_scores(&s, 4, &[block("x", 3, 2)], BlockAggregate::Max).is_err());
    }
}
