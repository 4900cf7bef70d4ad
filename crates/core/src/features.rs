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
