//! Mixed-type tables (real and categorical columns) and their shared encoding: min-max scaling
//! with a global range and a one-hot vocabulary, agreed federatedly from per-client statistics.
//!
//! The federated protocol (FedNGM's shared preprocessing) is:
//! 1. each client computes [`Table::stats`] (per real column min/max, per categorical column the
//!    levels that occur) and sends it;
//! 2. the server calls [`Encoding::merge`] (global min/max, union of levels sorted) and
//!    broadcasts the [`Encoding`];
//! 3. each client calls [`Encoding::encode`], so every client's rows live in the same units.
//!
//! ```
//! use fedfuse_data::{Column, Encoding, Table};
//! # fn main() -> fedfuse_data::Result<()> {
//! let a = Table::new(vec![
//!     ("age".into(), Column::Real(vec![20.0, 40.0])),
//!     ("sex".into(), Column::categorical(&["f", "m"])),
//! ])?;
//! let b = Table::new(vec![
//!     ("age".into(), Column::Real(vec![30.0])),
//!     ("sex".into(), Column::categorical(&["x"])),
//! ])?;
//! // The server sees only the statistics.
//! let enc = Encoding::merge(&[a.stats(), b.stats()])?;
//! let e = enc.encode(&b)?;
//! assert_eq!(e.x, vec![0.5, 0.0, 0.0, 1.0]); // age (30-20)/20, then one-hot over [f, m, x]
//! let back = enc.decode(&e.x, e.n)?;
//! assert_eq!(back.column("sex").and_then(|c| c.level(0)), Some("x"));
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{DataError, Result};

pub use fedfuse_core::{BlockKind, FeatureBlock};

/// One column of a [`Table`].
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    /// Real values, all finite.
    Real(Vec<f32>),
    /// Categories: row `i` has level `levels[codes[i]]`. Levels are distinct; their order is the
    /// table's own (an [`Encoding`] imposes the shared order).
    Categorical {
        /// The level names.
        levels: Vec<String>,
        /// One index into `levels` per row.
        codes: Vec<u32>,
    },
}

impl Column {
    /// A categorical column from one string per row; levels are the distinct values, sorted.
    pub fn categorical<S: AsRef<str>>(values: &[S]) -> Column {
        let set: BTreeSet<&str> = values.iter().map(AsRef::as_ref).collect();
        let levels: Vec<String> = set.into_iter().map(str::to_string).collect();
        let index: HashMap<&str, u32> = levels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.as_str(), i as u32))
            .collect();
        let codes = values.iter().map(|v| index[v.as_ref()]).collect();
        Column::Categorical { levels, codes }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        match self {
            Column::Real(v) => v.len(),
            Column::Categorical { codes, .. } => codes.len(),
        }
    }

    /// Whether the column has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Real or categorical.
    pub fn kind(&self) -> BlockKind {
        match self {
            Column::Real(_) => BlockKind::Real,
            Column::Categorical { .. } => BlockKind::Categorical,
        }
    }

    /// The level of row `row` of a categorical column (`None` for a real column or a row out of
    /// range).
    pub fn level(&self, row: usize) -> Option<&str> {
        match self {
            Column::Categorical { levels, codes } => {
                codes.get(row).map(|&c| levels[c as usize].as_str())
            }
            Column::Real(_) => None,
        }
    }

    fn select(&self, rows: &[usize]) -> Column {
        match self {
            Column::Real(v) => Column::Real(rows.iter().map(|&r| v[r]).collect()),
            Column::Categorical { levels, codes } => Column::Categorical {
                levels: levels.clone(),
                codes: rows.iter().map(|&r| codes[r]).collect(),
            },
        }
    }

    fn check(&self, name: &str) -> Result<()> {
        match self {
            Column::Real(v) => {
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    return Err(DataError::InvalidTable(format!(
                        "real column {name:?} holds {} at row {i}; tables hold finite values only \
                         (drop or impute missing values first)",
                        v[i]
                    )));
                }
            }
            Column::Categorical { levels, codes } => {
                let distinct: BTreeSet<&String> = levels.iter().collect();
                if distinct.len() != levels.len() {
                    return Err(DataError::InvalidTable(format!(
                        "categorical column {name:?} repeats a level in {levels:?}"
                    )));
                }
                if let Some(i) = codes.iter().position(|&c| c as usize >= levels.len()) {
                    return Err(DataError::InvalidTable(format!(
                        "categorical column {name:?}: row {i} has code {} but only {} levels",
                        codes[i],
                        levels.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

/// Named, row-aligned columns of mixed type.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Table {
    names: Vec<String>,
    columns: Vec<Column>,
    rows: usize,
}

impl Table {
    /// Builds a table, checking that names are distinct and non-empty, columns equally long,
    /// reals finite and categorical codes in range.
    pub fn new(columns: Vec<(String, Column)>) -> Result<Table> {
        let rows = columns.first().map_or(0, |(_, c)| c.len());
        let mut seen = BTreeSet::new();
        for (name, col) in &columns {
            if name.is_empty() {
                return Err(DataError::InvalidTable("a column has an empty name".into()));
            }
            if !seen.insert(name.as_str()) {
                return Err(DataError::InvalidTable(format!(
                    "column {name:?} appears twice"
                )));
            }
            if col.len() != rows {
                return Err(DataError::InvalidTable(format!(
                    "column {name:?} has {} rows but the first column has {rows}",
                    col.len()
                )));
            }
            col.check(name)?;
        }
        let (names, columns) = columns.into_iter().unzip();
        Ok(Table {
            names,
            columns,
            rows,
        })
    }

    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn n_cols(&self) -> usize {
        self.columns.len()
    }

    /// Column names, in table order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The column called `name`, if any.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.columns[i])
    }

    /// `(name, column)` pairs in table order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Column)> {
        self.names.iter().map(String::as_str).zip(&self.columns)
    }

    /// A table of the given rows, in the given order (repeats allowed). Categorical columns keep
    /// all their levels.
    pub fn select_rows(&self, rows: &[usize]) -> Result<Table> {
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.rows) {
            return Err(DataError::InvalidTable(format!(
                "row {bad} asked for but the table has {} rows",
                self.rows
            )));
        }
        Ok(Table {
            names: self.names.clone(),
            columns: self.columns.iter().map(|c| c.select(rows)).collect(),
            rows: rows.len(),
        })
    }

    /// A table of the named columns, in the order given.
    pub fn select_columns<S: AsRef<str>>(&self, names: &[S]) -> Result<Table> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_ref();
            let col = self
                .column(name)
                .ok_or_else(|| self.missing(name, "selected"))?;
            out.push((name.to_string(), col.clone()));
        }
        Table::new(out)
    }

    /// This table with one more column at the end.
    pub fn with_column(mut self, name: impl Into<String>, column: Column) -> Result<Table> {
        let name = name.into();
        let rows = if self.columns.is_empty() {
            column.len()
        } else {
            self.rows
        };
        if column.len() != rows || self.column(&name).is_some() || name.is_empty() {
            return Err(DataError::InvalidTable(format!(
                "cannot add column {name:?} with {} rows to a table of {} rows with columns \
                 {:?} (names must be new and non-empty, lengths equal)",
                column.len(),
                self.rows,
                self.names
            )));
        }
        column.check(&name)?;
        self.names.push(name);
        self.columns.push(column);
        self.rows = rows;
        Ok(self)
    }

    /// Stacks tables with the same column names (in the same order) and types row-wise (e.g. the
    /// clients of a split back into one pooled table). Categorical levels are the first table's,
    /// followed by any new ones in order of appearance.
    pub fn concat(tables: &[Table]) -> Result<Table> {
        let Some(first) = tables.first() else {
            return Ok(Table::default());
        };
        let mut cols = Vec::with_capacity(first.n_cols());
        for (c, name) in first.names.iter().enumerate() {
            let mut out = first.columns[c].clone();
            for (t, other) in tables.iter().enumerate().skip(1) {
                if other.names != first.names {
                    return Err(DataError::InvalidTable(format!(
                        "table {t} has columns {:?} but table 0 has {:?}; concat needs the same \
                         columns in the same order",
                        other.names, first.names
                    )));
                }
                match (&mut out, &other.columns[c]) {
                    (Column::Real(acc), Column::Real(v)) => acc.extend_from_slice(v),
                    (
                        Column::Categorical { levels, codes },
                        Column::Categorical {
                            levels: l2,
                            codes: c2,
                        },
                    ) => {
                        let map: Vec<u32> = l2
                            .iter()
                            .map(|l| match levels.iter().position(|x| x == l) {
                                Some(i) => i as u32,
                                None => {
                                    levels.push(l.clone());
                                    (levels.len() - 1) as u32
                                }
                            })
                            .collect();
                        codes.extend(c2.iter().map(|&k| map[k as usize]));
                    }
                    _ => {
                        return Err(DataError::InvalidTable(format!(
                            "column {name:?} is real in one table and categorical in another"
                        )));
                    }
                }
            }
            cols.push((name.clone(), out));
        }
        Table::new(cols)
    }

    /// Splits the rows by the level of categorical column `key` (the row-group key of a natural
    /// client split). Returns `(level, rows of that level without the key column)` in the key's
    /// level order, leaving out levels with no rows.
    pub fn group_by(&self, key: &str) -> Result<Vec<(String, Table)>> {
        let Some(Column::Categorical { levels, codes }) = self.column(key) else {
            return Err(match self.column(key) {
                None => self.missing(key, "group key"),
                Some(_) => DataError::InvalidTable(format!(
                    "group key {key:?} is a real column; group by a categorical column"
                )),
            });
        };
        let mut groups = vec![Vec::new(); levels.len()];
        for (row, &c) in codes.iter().enumerate() {
            groups[c as usize].push(row);
        }
        let rest: Vec<&str> = self
            .names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != key)
            .collect();
        let without_key = self.select_columns(&rest)?;
        let mut out = Vec::new();
        for (level, rows) in levels.iter().zip(groups) {
            if !rows.is_empty() {
                out.push((level.clone(), without_key.select_rows(&rows)?));
            }
        }
        Ok(out)
    }

    /// The statistics a client shares to agree an [`Encoding`]: per real column its min and max,
    /// per categorical column the levels that occur in its rows (not merely declared).
    pub fn stats(&self) -> TableStats {
        let mut columns = BTreeMap::new();
        for (name, col) in self.iter() {
            let s = match col {
                Column::Real(v) => {
                    let (min, max) = v
                        .iter()
                        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
                            (lo.min(x), hi.max(x))
                        });
                    if v.is_empty() {
                        ColumnStats::Real {
                            min: 0.0,
                            max: 0.0,
                            count: 0,
                        }
                    } else {
                        ColumnStats::Real {
                            min,
                            max,
                            count: v.len(),
                        }
                    }
                }
                Column::Categorical { levels, codes } => {
                    let used: BTreeSet<u32> = codes.iter().copied().collect();
                    let present: BTreeSet<String> =
                        used.iter().map(|&c| levels[c as usize].clone()).collect();
                    ColumnStats::Categorical {
                        levels: present.into_iter().collect(),
                    }
                }
            };
            columns.insert(name.to_string(), s);
        }
        TableStats {
            rows: self.rows,
            columns,
        }
    }

    fn missing(&self, name: &str, what: &str) -> DataError {
        DataError::MissingColumn {
            source_name: format!("table with columns {:?}", self.names),
            column: name.to_string(),
            what: what.to_string(),
        }
    }
}

/// What a client reports about one column.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnStats {
    /// A real column's range over the client's rows (`count == 0`: no rows, range meaningless).
    Real {
        /// Smallest value.
        min: f32,
        /// Largest value.
        max: f32,
        /// Rows the range was taken over.
        count: usize,
    },
    /// The levels occurring in a categorical column, sorted.
    Categorical {
        /// Sorted, distinct level names.
        levels: Vec<String>,
    },
}

/// A client's statistics for agreeing an [`Encoding`] (serialisable, to travel in a record).
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct TableStats {
    /// Rows of the client's table.
    pub rows: usize,
    /// Per column, by name.
    pub columns: BTreeMap<String, ColumnStats>,
}

/// How one feature is encoded.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Coding {
    /// `(x - min) / (max - min)`, so the global range maps to [0, 1]; 0 when `min == max`.
    Real {
        /// Global minimum.
        min: f32,
        /// Global maximum.
        max: f32,
    },
    /// One-hot over `levels`, in this order.
    Categorical {
        /// The shared vocabulary.
        levels: Vec<String>,
    },
}

/// One feature of an [`Encoding`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FeatureCoding {
    /// Column name.
    pub name: String,
    /// How it is encoded.
    pub coding: Coding,
}

impl FeatureCoding {
    /// Units the feature occupies.
    pub fn width(&self) -> usize {
        match &self.coding {
            Coding::Real { .. } => 1,
            Coding::Categorical { levels } => levels.len(),
        }
    }
}

/// A shared normalisation and one-hot vocabulary: an ordered list of features and their coding.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Encoding {
    features: Vec<FeatureCoding>,
}

/// Rows encoded by an [`Encoding`].
#[derive(Clone, Debug, PartialEq)]
pub struct Encoded {
    /// Row-major values, `n * width`.
    pub x: Vec<f32>,
    /// Number of rows.
    pub n: usize,
    /// Where each feature lives in a row.
    pub blocks: Vec<FeatureBlock>,
}

impl Encoded {
    /// Units per row.
    pub fn width(&self) -> usize {
        self.blocks.last().map_or(0, |b| b.start + b.len)
    }
}

impl Encoding {
    /// Checks and wraps an explicit list of features: names distinct, ranges finite with
    /// `min <= max`, vocabularies non-empty and distinct.
    pub fn new(features: Vec<FeatureCoding>) -> Result<Encoding> {
        let mut seen = BTreeSet::new();
        for f in &features {
            if !seen.insert(f.name.as_str()) {
                return Err(DataError::Encoding(format!(
                    "feature {:?} appears twice",
                    f.name
                )));
            }
            match &f.coding {
                Coding::Real { min, max } => {
                    if !(min.is_finite() && max.is_finite() && min <= max) {
                        return Err(DataError::Encoding(format!(
                            "feature {:?}: range [{min}, {max}] is not finite with min <= max",
                            f.name
                        )));
                    }
                }
                Coding::Categorical { levels } => {
                    let distinct: BTreeSet<&String> = levels.iter().collect();
                    if levels.is_empty() || distinct.len() != levels.len() {
                        return Err(DataError::Encoding(format!(
                            "feature {:?}: vocabulary {levels:?} is empty or repeats a level",
                            f.name
                        )));
                    }
                }
            }
        }
        Ok(Encoding { features })
    }

    /// Merges client statistics into the shared encoding: every column any client reports,
    /// ordered by name; reals get the global min and max over clients with rows, categoricals
    /// the sorted union of levels. A column that is real for one client and categorical for
    /// another, or real with no rows anywhere, is an error.
    pub fn merge(stats: &[TableStats]) -> Result<Encoding> {
        if stats.is_empty() {
            return Err(DataError::Encoding(
                "no client statistics to merge; pass at least one client's Table::stats()".into(),
            ));
        }
        // BTreeMap: name order is the canonical feature order, independent of client order.
        // A real column's range starts empty (inf, -inf) so clients without rows change nothing.
        let mut merged: BTreeMap<&str, Coding> = BTreeMap::new();
        for (client, s) in stats.iter().enumerate() {
            for (name, col) in &s.columns {
                let entry = merged.entry(name.as_str()).or_insert_with(|| match col {
                    ColumnStats::Real { .. } => Coding::Real {
                        min: f32::INFINITY,
                        max: f32::NEG_INFINITY,
                    },
                    ColumnStats::Categorical { .. } => Coding::Categorical { levels: Vec::new() },
                });
                match (entry, col) {
                    (
                        Coding::Real { min, max },
                        ColumnStats::Real {
                            min: lo,
                            max: hi,
                            count,
                        },
                    ) => {
                        if *count > 0 {
                            *min = min.min(*lo);
                            *max = max.max(*hi);
                        }
                    }
                    (Coding::Categorical { levels }, ColumnStats::Categorical { levels: more }) => {
                        levels.extend(more.iter().cloned());
                    }
                    _ => return Err(type_conflict(name, client)),
                }
            }
        }
        let features = merged
            .into_iter()
            .map(|(name, mut coding)| {
                if let Coding::Categorical { levels } = &mut coding {
                    levels.sort();
                    levels.dedup();
                }
                FeatureCoding {
                    name: name.to_string(),
                    coding,
                }
            })
            .collect();
        Encoding::new(features).map_err(|e| match e {
            DataError::Encoding(msg) => DataError::Encoding(format!(
                "{msg} after merging {} clients (a real column needs rows in at least one \
                 client, a categorical one at least one level)",
                stats.len()
            )),
            other => other,
        })
    }

    /// The features, in encoding order.
    pub fn features(&self) -> &[FeatureCoding] {
        &self.features
    }

    /// Feature names, in encoding order.
    pub fn names(&self) -> Vec<&str> {
        self.features.iter().map(|f| f.name.as_str()).collect()
    }

    /// The coding of feature `name`, if present.
    pub fn feature(&self, name: &str) -> Option<&FeatureCoding> {
        self.features.iter().find(|f| f.name == name)
    }

    /// The encoding restricted to `names`, in the order given: e.g. the consensus features, or
    /// the consensus features followed by a client's extras for a stitched model.
    pub fn subset<S: AsRef<str>>(&self, names: &[S]) -> Result<Encoding> {
        let features = names
            .iter()
            .map(|n| {
                self.feature(n.as_ref())
                    .cloned()
                    .ok_or_else(|| DataError::MissingColumn {
                        source_name: format!("encoding of {:?}", self.names()),
                        column: n.as_ref().to_string(),
                        what: "asked for in a subset".into(),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Encoding::new(features)
    }

    /// Units per encoded row.
    pub fn width(&self) -> usize {
        self.features.iter().map(FeatureCoding::width).sum()
    }

    /// Where each feature lives in an encoded row.
    pub fn blocks(&self) -> Vec<FeatureBlock> {
        let mut start = 0;
        self.features
            .iter()
            .map(|f| {
                let len = f.width();
                let kind = match f.coding {
                    Coding::Real { .. } => BlockKind::Real,
                    Coding::Categorical { .. } => BlockKind::Categorical,
                };
                let b = FeatureBlock {
                    name: f.name.clone(),
                    start,
                    len,
                    kind,
                };
                start += len;
                b
            })
            .collect()
    }

    /// Encodes the table's columns named by this encoding (other columns are ignored): reals
    /// min-max scaled with the global range (values outside it map outside [0, 1], unclamped),
    /// categoricals one-hot over the shared vocabulary. A missing column, a type mismatch or a
    /// level outside the vocabulary is an error.
    pub fn encode(&self, table: &Table) -> Result<Encoded> {
        let n = table.n_rows();
        let width = self.width();
        let blocks = self.blocks();
        let mut x = vec![0f32; n * width];
        for (f, b) in self.features.iter().zip(&blocks) {
            let col = table
                .column(&f.name)
                .ok_or_else(|| DataError::MissingColumn {
                    source_name: format!("table with columns {:?}", table.names()),
                    column: f.name.clone(),
                    what: "needed by the encoding".into(),
                })?;
            match (&f.coding, col) {
                (Coding::Real { min, max }, Column::Real(v)) => {
                    let (lo, span) = (f64::from(*min), f64::from(*max) - f64::from(*min));
                    for (r, &val) in v.iter().enumerate() {
                        x[r * width + b.start] = if span > 0.0 {
                            ((f64::from(val) - lo) / span) as f32
                        } else {
                            0.0
                        };
                    }
                }
                (Coding::Categorical { levels: vocab }, Column::Categorical { levels, codes }) => {
                    let index: HashMap<&str, usize> = vocab
                        .iter()
                        .enumerate()
                        .map(|(i, l)| (l.as_str(), i))
                        .collect();
                    // Map the table's level ids to vocabulary ids once; an unknown level is an
                    // error only if some row uses it.
                    let map: Vec<Option<usize>> = levels
                        .iter()
                        .map(|l| index.get(l.as_str()).copied())
                        .collect();
                    for (r, &c) in codes.iter().enumerate() {
                        let Some(j) = map[c as usize] else {
                            return Err(DataError::UnknownLevel {
                                column: f.name.clone(),
                                level: levels[c as usize].clone(),
                                known: vocab.join(", "),
                            });
                        };
                        x[r * width + b.start + j] = 1.0;
                    }
                }
                (coding, col) => {
                    return Err(DataError::Encoding(format!(
                        "column {:?} is {:?} in the table but {} in the encoding",
                        f.name,
                        col.kind(),
                        match coding {
                            Coding::Real { .. } => "real",
                            Coding::Categorical { .. } => "categorical",
                        }
                    )));
                }
            }
        }
        Ok(Encoded { x, n, blocks })
    }

    /// Decodes `n` encoded rows back to a table with this encoding's columns: reals by the
    /// inverse scaling, categoricals by the argmax of their block (first on ties), so model
    /// outputs that are not exactly one-hot decode too. Non-finite values are an error.
    pub fn decode(&self, x: &[f32], n: usize) -> Result<Table> {
        let width = self.width();
        if x.len() != n * width {
            return Err(DataError::Encoding(format!(
                "{} values cannot be {n} rows of width {width}",
                x.len()
            )));
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(DataError::Encoding(format!(
                "value {} at row {}, unit {} is not finite",
                x[i],
                i / width.max(1),
                i % width.max(1)
            )));
        }
        let mut cols = Vec::with_capacity(self.features.len());
        for (f, b) in self.features.iter().zip(self.blocks()) {
            let col = match &f.coding {
                Coding::Real { min, max } => {
                    let (lo, span) = (f64::from(*min), f64::from(*max) - f64::from(*min));
                    Column::Real(
                        (0..n)
                            .map(|r| (lo + f64::from(x[r * width + b.start]) * span) as f32)
                            .collect(),
                    )
                }
                Coding::Categorical { levels } => Column::Categorical {
                    levels: levels.clone(),
                    codes: (0..n)
                        .map(|r| argmax(&x[r * width + b.start..r * width + b.start + b.len]))
                        .collect(),
                },
            };
            cols.push((f.name.clone(), col));
        }
        Table::new(cols)
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn type_conflict(name: &str, client: usize) -> DataError {
    DataError::Encoding(format!(
        "column {name:?} is real for some clients and categorical for others (first seen \
         differing at client {client}); every client must type a column the same way"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_of_ties() {
        assert_eq!(argmax(&[0.2, 0.7, 0.7]), 1);
        assert_eq!(argmax(&[1.0]), 0);
    }

    #[test]
    fn constant_real_encodes_to_zero() {
        let t = Table::new(vec![("a".into(), Column::Real(vec![3.0, 3.0]))]).unwrap();
        let enc = Encoding::merge(&[t.stats()]).unwrap();
        assert_eq!(enc.encode(&t).unwrap().x, vec![0.0, 0.0]);
        assert_eq!(enc.decode(&[0.0, 0.0], 2).unwrap(), t);
    }
}
