//! Tabular data from CSV files: numeric features, one-hot categorical columns, a label column.

use std::collections::BTreeSet;
use std::path::Path;

use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::idx::{maybe_gunzip, read_maybe_gz};
use crate::tabular::Column;

/// Which column holds the class label.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum LabelColumn {
    /// The column at this 0-based index.
    Index(usize),
    /// The column with this header name (needs `has_header`).
    Name(String),
    /// The last column.
    #[default]
    Last,
}

/// A column, by 0-based index or by header name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnRef {
    /// The column at this 0-based index.
    Index(usize),
    /// The column with this header name (needs `has_header`).
    Name(String),
}

impl From<usize> for ColumnRef {
    fn from(i: usize) -> Self {
        ColumnRef::Index(i)
    }
}

impl From<&str> for ColumnRef {
    fn from(s: &str) -> Self {
        ColumnRef::Name(s.to_string())
    }
}

impl From<String> for ColumnRef {
    fn from(s: String) -> Self {
        ColumnRef::Name(s)
    }
}

/// How to read a CSV file. `CsvOptions::default()` is: a header line, comma separated, label in
/// the last column, every other column numeric.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvOptions {
    /// Whether the first non-empty line holds column names (it is never read as data).
    pub has_header: bool,
    /// Which column holds the label.
    pub label_column: LabelColumn,
    /// Columns holding categories (any strings); each becomes one 0/1 feature per distinct value,
    /// values sorted, in place of the column.
    pub categorical: Vec<ColumnRef>,
    /// Field separator, `b','` for CSV, `b'\t'` for TSV, `b';'`...
    pub delimiter: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        CsvOptions {
            has_header: true,
            label_column: LabelColumn::Last,
            categorical: Vec::new(),
            delimiter: b',',
        }
    }
}

/// A CSV file read into a [`Dataset`], with the names of what became features and classes.
#[derive(Clone, Debug, PartialEq)]
pub struct CsvTable {
    /// The samples; `sample_shape` is `[feature_names.len()]`.
    pub dataset: Dataset,
    /// One name per feature: the header name (or `colN`), and `name=value` for one-hot features.
    pub feature_names: Vec<String>,
    /// Class names: the label values, in class-id order.
    pub class_names: Vec<String>,
}

impl CsvTable {
    /// The values of the feature column `name`, one per sample, kept aside for a partitioner
    /// that splits by a column ([`crate::PartitionSpec::column`], [`crate::partition_with`]):
    /// a numeric column as [`Column::Real`], a categorical (one-hot) one as
    /// [`Column::Categorical`] with its sorted values as levels. `None` when no feature column
    /// has that name (the label column is not a feature).
    pub fn column(&self, name: &str) -> Option<Column> {
        let dim = self.feature_names.len();
        let rows = self.dataset.len();
        if let Some(j) = self.feature_names.iter().position(|f| f == name) {
            return Some(Column::Real(
                (0..rows).map(|i| self.dataset.x[i * dim + j]).collect(),
            ));
        }
        let prefix = format!("{name}=");
        let one_hot: Vec<(usize, &str)> = self
            .feature_names
            .iter()
            .enumerate()
            .filter_map(|(j, f)| f.strip_prefix(&prefix).map(|level| (j, level)))
            .collect();
        if one_hot.is_empty() {
            return None;
        }
        let codes = (0..rows)
            .map(|i| {
                let x = self.dataset.sample(i);
                one_hot.iter().position(|&(j, _)| x[j] == 1.0).unwrap_or(0) as u32
            })
            .collect();
        Some(Column::Categorical {
            levels: one_hot.iter().map(|&(_, l)| l.to_string()).collect(),
            codes,
        })
    }
}

/// Reads a CSV file (or a gzip-compressed one) into a [`Dataset`]; see [`read_csv_table`].
pub fn read_csv(path: &Path, opts: &CsvOptions) -> Result<Dataset> {
    Ok(read_csv_table(path, opts)?.dataset)
}

/// Reads a CSV file (or a gzip-compressed one) into a [`CsvTable`].
///
/// * Every column other than the label and the categorical ones must hold finite numbers; an
///   empty, missing or non-numeric cell is an error naming the file, the line and the column.
/// * Categorical columns are one-hot encoded, their distinct values sorted.
/// * Labels that are all integers in `0..=65535` are used as class ids directly
///   (`num_classes = max + 1`); otherwise the distinct values are sorted (numerically when they
///   are all numbers) and numbered from 0.
/// * Empty lines are skipped; fields may be double-quoted (`""` is a literal quote) but may not
///   span lines.
pub fn read_csv_table(path: &Path, opts: &CsvOptions) -> Result<CsvTable> {
    let bytes = read_maybe_gz(path)?;
    parse_csv(&bytes, path, opts)
}

/// Parses CSV bytes (gzip-compressed or not); `path` names the source in error messages.
pub(crate) fn parse_csv(bytes: &[u8], path: &Path, opts: &CsvOptions) -> Result<CsvTable> {
    let bytes = maybe_gunzip(bytes.to_vec(), path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        DataError::format(
            path,
            format!("not UTF-8 text ({e}); is this really a CSV file?"),
        )
    })?;
    let delim = char::from(opts.delimiter);
    let cell_err = |line: usize, column: String, msg: String| DataError::Csv {
        path: path.to_path_buf(),
        line,
        column,
        msg,
    };

    let mut header: Option<Vec<String>> = None;
    let mut rows: Vec<(usize, Vec<String>)> = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() {
            continue;
        }
        let fields = split_fields(line, delim)
            .map_err(|msg| DataError::format(path, format!("line {line_no}: {msg}")))?;
        if opts.has_header && header.is_none() {
            header = Some(fields);
        } else {
            rows.push((line_no, fields));
        }
    }
    let ncols = match (&header, rows.first()) {
        (Some(h), _) => h.len(),
        (None, Some((_, r))) => r.len(),
        (None, None) => 0,
    };
    if rows.is_empty() {
        return Err(DataError::format(
            path,
            "no data rows; the file is empty or holds only a header",
        ));
    }
    if ncols < 2 {
        return Err(DataError::format(
            path,
            format!(
                "only {ncols} column found; need features and a label (is the delimiter {:?} right?)",
                delim
            ),
        ));
    }
    for (line, r) in &rows {
        if r.len() != ncols {
            return Err(DataError::format(
                path,
                format!(
                    "line {line}: {} fields, expected {ncols} like the first line (is the \
                     delimiter {delim:?} right?)",
                    r.len()
                ),
            ));
        }
    }
    let col_name = |c: usize| match &header {
        Some(h) => format!("{} ({:?})", c + 1, h[c]),
        None => format!("{}", c + 1),
    };
    let resolve = |r: &ColumnRef, what: &str| -> Result<usize> {
        match r {
            ColumnRef::Index(i) if *i < ncols => Ok(*i),
            ColumnRef::Index(i) => Err(DataError::InvalidArgument {
                field: "CSV column",
                msg: format!(
                    "{what} column index {i} is out of range: {} has {ncols} columns (indices are 0-based)",
                    path.display()
                ),
            }),
            ColumnRef::Name(n) => {
                match &header {
                    Some(h) => h.iter().position(|x| x == n).ok_or_else(|| {
                        DataError::InvalidArgument {
                            field: "CSV column",
                            msg: format!(
                                "{what} column {n:?} is not in the header of {}; columns are {h:?}",
                                path.display()
                            ),
                        }
                    }),
                    None => Err(DataError::InvalidArgument {
                        field: "CSV column",
                        msg: format!(
                            "{what} column {n:?} is given by name but has_header is false for {}; use an index",
                            path.display()
                        ),
                    }),
                }
            }
        }
    };
    let label_col = match &opts.label_column {
        LabelColumn::Last => ncols - 1,
        LabelColumn::Index(i) => resolve(&ColumnRef::Index(*i), "label")?,
        LabelColumn::Name(n) => resolve(&ColumnRef::Name(n.clone()), "label")?,
    };
    let mut is_cat = vec![false; ncols];
    for c in &opts.categorical {
        let i = resolve(c, "categorical")?;
        if i == label_col {
            return Err(DataError::InvalidArgument {
                field: "CSV column",
                msg: format!(
                    "column {} is both the label and categorical; remove it from `categorical`",
                    col_name(i)
                ),
            });
        }
        is_cat[i] = true;
    }

    // Categories of each categorical column, sorted.
    let mut cats: Vec<Vec<String>> = vec![Vec::new(); ncols];
    for (c, cat) in cats.iter_mut().enumerate() {
        if !is_cat[c] {
            continue;
        }
        let mut set = BTreeSet::new();
        for (line, r) in &rows {
            if r[c].is_empty() {
                return Err(cell_err(
                    *line,
                    col_name(c),
                    "missing category value".into(),
                ));
            }
            set.insert(r[c].clone());
        }
        *cat = set.into_iter().collect();
    }

    // Labels.
    for (line, r) in &rows {
        if r[label_col].is_empty() {
            return Err(cell_err(*line, col_name(label_col), "missing label".into()));
        }
    }
    let (y, class_names) = encode_labels(rows.iter().map(|(_, r)| r[label_col].as_str()));

    // Features.
    let mut feature_names = Vec::new();
    for c in (0..ncols).filter(|&c| c != label_col) {
        let base = header
            .as_ref()
            .map_or_else(|| format!("col{}", c + 1), |h| h[c].clone());
        if is_cat[c] {
            feature_names.extend(cats[c].iter().map(|v| format!("{base}={v}")));
        } else {
            feature_names.push(base);
        }
    }
    let dim = feature_names.len();
    let mut x = Vec::with_capacity(rows.len() * dim);
    for (line, r) in &rows {
        for c in (0..ncols).filter(|&c| c != label_col) {
            let v = &r[c];
            if is_cat[c] {
                x.extend(cats[c].iter().map(|k| if k == v { 1.0 } else { 0.0 }));
                continue;
            }
            if v.is_empty() {
                return Err(cell_err(
                    *line,
                    col_name(c),
                    "missing value; fill it in or drop the row".into(),
                ));
            }
            match v.parse::<f32>() {
                Ok(f) if f.is_finite() => x.push(f),
                Ok(_) => {
                    return Err(cell_err(
                        *line,
                        col_name(c),
                        format!("{v:?} is not a finite number"),
                    ));
                }
                Err(_) => {
                    return Err(cell_err(
                        *line,
                        col_name(c),
                        format!(
                            "{v:?} is not a number; if the column holds categories, list it in \
                             CsvOptions::categorical"
                        ),
                    ));
                }
            }
        }
    }
    let num_classes = class_names.len().max(1);
    let dataset = Dataset::new(x, y, vec![dim], num_classes)?;
    Ok(CsvTable {
        dataset,
        feature_names,
        class_names,
    })
}

/// Largest integer label taken as a class id as it stands (every id up to the largest label
/// gets a class name); past it, integer labels are numbered like any others, so one label of
/// `4294967295` cannot demand four billion classes.
const MAX_CLASS_ID: u32 = 65_535;

/// Maps label strings to class ids; see [`read_csv_table`].
fn encode_labels<'a>(labels: impl Iterator<Item = &'a str> + Clone) -> (Vec<u32>, Vec<String>) {
    let ints: Option<Vec<u32>> = labels.clone().map(|s| s.parse::<u32>().ok()).collect();
    if let Some(ids) = ints.filter(|ids| ids.iter().all(|&id| id <= MAX_CLASS_ID)) {
        let max = ids.iter().copied().max().unwrap_or(0);
        return (ids, (0..=max).map(|i| i.to_string()).collect());
    }
    let mut distinct: Vec<&str> = labels
        .clone()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let nums: Option<Vec<f64>> = distinct.iter().map(|s| s.parse::<f64>().ok()).collect();
    if let Some(nums) = nums {
        let mut pairs: Vec<(f64, &str)> = nums.into_iter().zip(distinct.iter().copied()).collect();
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        distinct = pairs.into_iter().map(|p| p.1).collect();
    }
    let ids = labels
        .map(|s| distinct.iter().position(|d| *d == s).unwrap_or(0) as u32)
        .collect();
    (ids, distinct.into_iter().map(str::to_string).collect())
}

/// Splits one CSV line into trimmed fields, honouring double quotes.
fn split_fields(line: &str, delim: char) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false; // inside a quoted field
    let mut was_quoted = false; // current field was quoted (keep its spaces)
    while let Some(ch) = chars.next() {
        if quoted {
            if ch == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(ch);
            }
        } else if ch == delim {
            out.push(if was_quoted {
                std::mem::take(&mut cur)
            } else {
                cur.trim().to_string()
            });
            cur.clear();
            was_quoted = false;
        } else if ch == '"' && cur.trim().is_empty() && !was_quoted {
            cur.clear();
            quoted = true;
            was_quoted = true;
        } else if was_quoted {
            if !ch.is_whitespace() {
                return Err(format!("unexpected {ch:?} after a closing quote"));
            }
        } else {
            cur.push(ch);
        }
    }
    if quoted {
        return Err("unterminated quoted field (quoted fields may not span lines)".into());
    }
    out.push(if was_quoted {
        cur
    } else {
        cur.trim().to_string()
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        assert_eq!(
            split_fields("a, b ,\"c,d\",\"e\"\"f\"", ',').unwrap(),
            vec!["a", "b", "c,d", "e\"f"]
        );
        assert_eq!(split_fields("1;2", ';').unwrap(), vec!["1", "2"]);
        assert!(split_fields("\"abc", ',').is_err());
        assert_eq!(split_fields("", ',').unwrap(), vec![""]);
    }

    #[test]
    fn labels() {
        let (y, n) = encode_labels(["2", "0", "2"].into_iter());
        assert_eq!((y, n.len()), (vec![2, 0, 2], 3));
        let (y, n) = encode_labels(["b", "a", "b"].into_iter());
        assert_eq!(
            (y, n),
            (vec![1, 0, 1], vec!["a".to_string(), "b".to_string()])
        );
        let (y, _) = encode_labels(["10", "-1", "2"].into_iter());
        assert_eq!(y, vec![2, 0, 1]);
        // Past MAX_CLASS_ID integers are numbered like other labels: no 2^32 class names.
        let (y, n) = encode_labels(["4294967295", "0"].into_iter());
        assert_eq!((y, n), (vec![1, 0], vec!["0".into(), "4294967295".into()]));
    }

    #[test]
    fn parse_in_memory() {
        let t = parse_csv(
            b"a,b,y\n1,x,0\n\n2,z,1\n",
            Path::new("mem.csv"),
            &CsvOptions {
                categorical: vec!["b".into()],
                ..CsvOptions::default()
            },
        )
        .unwrap();
        assert_eq!(t.feature_names, vec!["a", "b=x", "b=z"]);
        assert_eq!(t.dataset.x, vec![1., 1., 0., 2., 0., 1.]);
        let e = parse_csv(
            b"a,y\n1,0\n1,2,3\n",
            Path::new("mem.csv"),
            &CsvOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 3"), "{e}");
    }
}
