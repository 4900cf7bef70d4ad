//! The CDC/NCHS 2015 birth-cohort linked birth/infant death file (numerator: every infant death
//! of the 2015 cohort), as converted to CSV by NBER (`linkco2015usnum.zip`, 23,357 records x 343
//! columns), read into mixed-type [`Table`]s with a natural client split for FedNGM.
//!
//! The zip is read in memory (no extraction); an unzipped (or gzip-compressed) CSV works too.
//!
//! # Feature set
//!
//! Core features (every client has them; codes from the NCHS 2015 cohort linked file user
//! guide; the NBER header spells PREVIS as `revis` — its leading `p`s were lost):
//!
//! | feature | source | type | values / levels | missing (row dropped) |
//! |---|---|---|---|---|
//! | `mother_age` | `mager` | real, years | 12-50 | outside 12-50 |
//! | `mother_race` | `mrace6` | categorical | white, black, aian, asian, nhopi, multiracial (codes 1-6) | other codes (9) |
//! | `mother_education` | `meduc` | categorical | 8th_or_less, no_diploma, high_school, some_college, associate, bachelor, master, doctorate (1-8) | 9 unknown, 0/blank not stated |
//! | `prenatal_visits` | `revis` (PREVIS) | real, visits | 0-98 | 99 unknown, blank |
//! | `plurality` | `dplural` | categorical | single, twin, triplet_plus (3-5) | other |
//! | `infant_sex` | `sex` | categorical | female, male | U, blank |
//! | `gestation_weeks` | `combgest` | real, weeks | 17-47 | 99 unknown |
//! | `birth_weight_g` | `brthwgt` (DBWT) | real, grams | 227-8165 | 9999 not stated |
//! | `age_at_death_days` | `aged` | real, days | 0-364 | other |
//! | `death_age` | `aged` | categorical | early_neonatal (0-6 d), late_neonatal (7-27 d), postneonatal (28-364 d) | other |
//! | `cause_of_death` | `ucod` (ICD-10) | categorical | perinatal (P), congenital (Q), sids (R95), ill_defined (other R), external (V-Y), infectious (A-B), respiratory (J), circulatory (I), other | blank |
//!
//! The cause groups follow ICD-10 chapters of the underlying cause rather than the 130-cause
//! recode (`ucodr130`), whose numbering is not needed to reproduce them.
//!
//! Client-only extra features ([`CdcExtra`]), given to the clients named in
//! [`CdcOptions::extras`]; rows of such a client missing an extra are dropped from that client:
//!
//! | feature | source | type | values | missing |
//! |---|---|---|---|---|
//! | `marital_status` | `dmar` | categorical | married (1), unmarried (2) | blank |
//! | `birth_order` | `tbo_rec` | real | total birth order 1-8 (8 = 8 or more) | 9 unknown |
//! | `smoking` | `cig_rec` | categorical | yes (Y), no (N) | U unknown, blank |
//!
//! # Cleaning (counts on the 2015 file)
//!
//! 357 records whose maternal 2003-revision block is not usable are dropped first: their `wic`
//! field is not Y/N/U but 0 (334 records: items not reported) or a stray number (23 records whose
//! block `meduc`..`bmi` holds shifted digits in the NBER conversion). Of the other 23,000,
//! 2,707 lack a core feature (`revis` 1,836, `meduc` 975, `combgest` 201, `brthwgt` 143; a row
//! can lack several), leaving **20,293** rows.
//!
//! # Client split
//!
//! The public file has no state or region of residence, so the split uses what it has
//! ([`CdcSplit`]): by default `restatus` (resident: state and county of birth = residence;
//! intrastate nonresident; interstate or foreign resident), sizes 13,058 / 6,452 / 783.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::idx::{maybe_gunzip, read_maybe_gz};
use crate::tabular::{Column, Table};

/// Where the 2015 file lives inside a data folder laid out like the shared one.
pub const CDC_2015_ZIP: &str = "cdc-infant-2015/linkco2015usnum.zip";

/// How the kept rows are split into clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CdcSplit {
    /// By `restatus`: `resident`, `intrastate_nonresident`, `interstate_or_foreign` (codes 3
    /// and 4 merged: 4 has only 24 rows). The closest the public file comes to geography.
    #[default]
    ResidenceStatus,
    /// By birth month `dob_mm`: `q1` (Jan-Mar) .. `q4` (Oct-Dec); four nearly equal clients.
    BirthQuarter,
}

impl CdcSplit {
    fn source(self) -> &'static str {
        match self {
            CdcSplit::ResidenceStatus => "restatus",
            CdcSplit::BirthQuarter => "dob_mm",
        }
    }

    /// The client names, in client order.
    pub fn clients(self) -> &'static [&'static str] {
        match self {
            CdcSplit::ResidenceStatus => &[
                "resident",
                "intrastate_nonresident",
                "interstate_or_foreign",
            ],
            CdcSplit::BirthQuarter => &["q1", "q2", "q3", "q4"],
        }
    }

    fn client_of(self, v: &str) -> std::result::Result<usize, String> {
        let code = int(v)?.ok_or("blank client key")?;
        match (self, code) {
            (CdcSplit::ResidenceStatus, 1..=2) => Ok(code as usize - 1),
            (CdcSplit::ResidenceStatus, 3..=4) => Ok(2),
            (CdcSplit::BirthQuarter, 1..=12) => Ok((code as usize - 1) / 3),
            _ => Err(format!("code {code} is not a valid {}", self.source())),
        }
    }
}

/// A client-only extra feature (see the module docs for codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CdcExtra {
    /// `marital_status` from `dmar`: married / unmarried.
    MaritalStatus,
    /// `birth_order` from `tbo_rec`: total birth order 1-8, real.
    BirthOrder,
    /// `smoking` from `cig_rec`: yes / no.
    Smoking,
}

impl CdcExtra {
    /// The feature (column) name.
    pub fn name(self) -> &'static str {
        self.def().name
    }

    fn index(self) -> usize {
        match self {
            CdcExtra::MaritalStatus => 0,
            CdcExtra::BirthOrder => 1,
            CdcExtra::Smoking => 2,
        }
    }

    fn def(self) -> &'static Def {
        &EXTRAS[self.index()]
    }
}

/// What to load.
#[derive(Clone, Debug, PartialEq)]
pub struct CdcOptions {
    /// The client split.
    pub split: CdcSplit,
    /// Per client name (one of [`CdcSplit::clients`]), its client-only extra features.
    pub extras: BTreeMap<String, Vec<CdcExtra>>,
}

impl CdcOptions {
    /// The given split, no extras.
    pub fn new(split: CdcSplit) -> CdcOptions {
        CdcOptions {
            split,
            extras: BTreeMap::new(),
        }
    }
}

impl Default for CdcOptions {
    /// Residence-status split; `resident` also has `marital_status` and `smoking`,
    /// `intrastate_nonresident` also has `birth_order`, `interstate_or_foreign` nothing extra.
    fn default() -> Self {
        let extras = BTreeMap::from([
            (
                "resident".to_string(),
                vec![CdcExtra::MaritalStatus, CdcExtra::Smoking],
            ),
            (
                "intrastate_nonresident".to_string(),
                vec![CdcExtra::BirthOrder],
            ),
        ]);
        CdcOptions {
            split: CdcSplit::ResidenceStatus,
            extras,
        }
    }
}

/// One client's data.
#[derive(Clone, Debug, PartialEq)]
pub struct CdcClient {
    /// Client name (a [`CdcSplit::clients`] entry).
    pub name: String,
    /// The core features ([`CDC_FEATURES`] order), then this client's extras.
    pub table: Table,
    /// Names of this client's extra columns.
    pub extras: Vec<String>,
    /// Rows of this client dropped because an extra feature was missing.
    pub dropped_for_extras: usize,
}

/// How the file was cleaned.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CdcSummary {
    /// Data records in the file.
    pub records: usize,
    /// Records dropped because their maternal 2003-revision block is unusable (`wic` not Y/N/U).
    pub unusable_block: usize,
    /// Per core source column, how many of the remaining records lack it.
    pub missing: Vec<(String, usize)>,
    /// Records dropped for lacking at least one core feature.
    pub incomplete: usize,
    /// Records kept (before any client drops rows for its extras).
    pub kept: usize,
}

/// The loaded file: clients in [`CdcSplit::clients`] order (empty clients left out).
#[derive(Clone, Debug, PartialEq)]
pub struct CdcData {
    /// Per-client tables.
    pub clients: Vec<CdcClient>,
    /// Cleaning counts.
    pub summary: CdcSummary,
}

impl CdcData {
    /// All clients' core features in one table (client order), e.g. for a centralised baseline.
    pub fn pooled(&self) -> Result<Table> {
        let core: Vec<Table> = self
            .clients
            .iter()
            .map(|c| c.table.select_columns(CDC_FEATURES))
            .collect::<Result<_>>()?;
        Table::concat(&core)
    }

    /// The client of each row of [`CdcData::pooled`] (the split's natural id, e.g. residence
    /// status), as a categorical column: what a `natural_id` partition of the pooled rows
    /// splits by ([`crate::partition_with`]) to give back these clients.
    pub fn client_column(&self) -> Column {
        let names: Vec<&str> = self
            .clients
            .iter()
            .flat_map(|c| std::iter::repeat_n(c.name.as_str(), c.table.n_rows()))
            .collect();
        Column::categorical(&names)
    }

    /// A human-readable account: cleaning counts, client sizes and the features with their
    /// types and levels.
    pub fn describe(&self) -> String {
        let s = &self.summary;
        let mut out = format!(
            "records {}, unusable maternal block {}, lacking a core feature {} ({}), kept {}\n",
            s.records,
            s.unusable_block,
            s.incomplete,
            s.missing
                .iter()
                .map(|(c, n)| format!("{c} {n}"))
                .collect::<Vec<_>>()
                .join(", "),
            s.kept
        );
        for c in &self.clients {
            out += &format!(
                "client {}: {} rows, extras {:?} (dropped {} rows for missing extras)\n",
                c.name,
                c.table.n_rows(),
                c.extras,
                c.dropped_for_extras
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.clients {
            for (name, col) in c.table.iter() {
                if seen.insert(name.to_string()) {
                    out += &match col {
                        Column::Real(_) => format!("feature {name}: real\n"),
                        Column::Categorical { levels, .. } => {
                            format!("feature {name}: categorical {levels:?}\n")
                        }
                    };
                }
            }
        }
        out
    }
}

/// The core feature names, in table order.
pub const CDC_FEATURES: &[&str] = &[
    "mother_age",
    "mother_race",
    "mother_education",
    "prenatal_visits",
    "plurality",
    "infant_sex",
    "gestation_weeks",
    "birth_weight_g",
    "age_at_death_days",
    "death_age",
    "cause_of_death",
];

/// The column whose value tells whether the maternal 2003-revision block is usable.
const BLOCK_CHECK: &str = "wic";

enum Val {
    Real(f32),
    Cat(u32),
}

/// Parses one cell: `Ok(None)` is a documented missing code, `Err` a malformed cell.
type Parse = fn(&str) -> std::result::Result<Option<Val>, String>;

struct Def {
    name: &'static str,
    source: &'static str,
    /// Empty for a real feature.
    levels: &'static [&'static str],
    parse: Parse,
}

fn int(v: &str) -> std::result::Result<Option<i64>, String> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse::<i64>()
        .map(Some)
        .map_err(|_| format!("expected an integer code, found {v:?}"))
}

fn real_in(v: &str, lo: i64, hi: i64) -> std::result::Result<Option<Val>, String> {
    Ok(int(v)?
        .filter(|x| (lo..=hi).contains(x))
        .map(|x| Val::Real(x as f32)))
}

fn code_in(v: &str, n: i64) -> std::result::Result<Option<Val>, String> {
    Ok(int(v)?
        .filter(|x| (1..=n).contains(x))
        .map(|x| Val::Cat(x as u32 - 1)))
}

const CORE: [Def; 11] = [
    Def {
        name: "mother_age",
        source: "mager",
        levels: &[],
        parse: |v| real_in(v, 12, 50),
    },
    Def {
        name: "mother_race",
        source: "mrace6",
        levels: &["white", "black", "aian", "asian", "nhopi", "multiracial"],
        parse: |v| code_in(v, 6),
    },
    Def {
        name: "mother_education",
        source: "meduc",
        levels: &[
            "8th_or_less",
            "no_diploma",
            "high_school",
            "some_college",
            "associate",
            "bachelor",
            "master",
            "doctorate",
        ],
        parse: |v| code_in(v, 8),
    },
    Def {
        name: "prenatal_visits",
        source: "revis",
        levels: &[],
        parse: |v| real_in(v, 0, 98),
    },
    Def {
        name: "plurality",
        source: "dplural",
        levels: &["single", "twin", "triplet_plus"],
        parse: |v| {
            Ok(int(v)?.and_then(|x| match x {
                1 => Some(Val::Cat(0)),
                2 => Some(Val::Cat(1)),
                3..=5 => Some(Val::Cat(2)),
                _ => None,
            }))
        },
    },
    Def {
        name: "infant_sex",
        source: "sex",
        levels: &["female", "male"],
        parse: |v| match v {
            "F" => Ok(Some(Val::Cat(0))),
            "M" => Ok(Some(Val::Cat(1))),
            "U" | "" => Ok(None),
            _ => Err(format!("expected M, F or U, found {v:?}")),
        },
    },
    Def {
        name: "gestation_weeks",
        source: "combgest",
        levels: &[],
        parse: |v| real_in(v, 17, 47),
    },
    Def {
        name: "birth_weight_g",
        source: "brthwgt",
        levels: &[],
        parse: |v| real_in(v, 227, 8165),
    },
    Def {
        name: "age_at_death_days",
        source: "aged",
        levels: &[],
        parse: |v| real_in(v, 0, 364),
    },
    Def {
        name: "death_age",
        source: "aged",
        levels: &["early_neonatal", "late_neonatal", "postneonatal"],
        parse: |v| {
            Ok(int(v)?.and_then(|d| match d {
                0..=6 => Some(Val::Cat(0)),
                7..=27 => Some(Val::Cat(1)),
                28..=364 => Some(Val::Cat(2)),
                _ => None,
            }))
        },
    },
    Def {
        name: "cause_of_death",
        source: "ucod",
        levels: &[
            "perinatal",
            "congenital",
            "sids",
            "ill_defined",
            "external",
            "infectious",
            "respiratory",
            "circulatory",
            "other",
        ],
        parse: cause_group,
    },
];

const EXTRAS: [Def; 3] = [
    Def {
        name: "marital_status",
        source: "dmar",
        levels: &["married", "unmarried"],
        parse: |v| code_in(v, 2),
    },
    Def {
        name: "birth_order",
        source: "tbo_rec",
        levels: &[],
        parse: |v| real_in(v, 1, 8),
    },
    Def {
        name: "smoking",
        source: "cig_rec",
        levels: &["yes", "no"],
        parse: |v| match v {
            "Y" => Ok(Some(Val::Cat(0))),
            "N" => Ok(Some(Val::Cat(1))),
            _ => Ok(None),
        },
    },
];

/// ICD-10 underlying cause to a chapter group (index into the `cause_of_death` levels).
fn cause_group(v: &str) -> std::result::Result<Option<Val>, String> {
    let Some(first) = v.chars().next() else {
        return Ok(None);
    };
    let group = match first {
        'P' => 0,
        'Q' => 1,
        'R' if v.starts_with("R95") => 2,
        'R' => 3,
        'V' | 'W' | 'X' | 'Y' => 4,
        'A' | 'B' => 5,
        'J' => 6,
        'I' => 7,
        'C'..='Z' => 8,
        _ => return Err(format!("expected an ICD-10 code, found {v:?}")),
    };
    Ok(Some(Val::Cat(group)))
}

/// Reads the CDC linked file (the NBER zip, or its CSV, plain or gzip-compressed) into per-client
/// tables; see the module docs for the features, cleaning and split.
///
/// Errors name the file: a zip without a `.csv` member, a missing column
/// ([`DataError::MissingColumn`]), a row with the wrong number of fields, or a malformed cell
/// ([`DataError::Csv`] with its line and column).
pub fn load_cdc(path: &Path, opts: &CdcOptions) -> Result<CdcData> {
    let clients = opts.split.clients();
    for name in opts.extras.keys() {
        if !clients.contains(&name.as_str()) {
            return Err(DataError::InvalidArgument {
                field: "cdc.extras",
                msg: format!(
                    "client {name:?} is not a client of split {:?}; clients are {clients:?}",
                    opts.split
                ),
            });
        }
    }
    let (text, source) = read_text(path)?;
    parse_cdc(&text, &source, opts)
}

/// Reads the CSV text, from inside a zip if the file is one; returns the text and the name to
/// use in errors (`ZIP!MEMBER` for a zip member).
fn read_text(path: &Path) -> Result<(String, PathBuf)> {
    let bytes = read_maybe_gz(path)?;
    let (bytes, source) = if bytes.starts_with(b"PK\x03\x04") {
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| DataError::format(path, format!("not a readable zip archive: {e}")))?;
        let mut names = Vec::new();
        let mut found = None;
        for i in 0..archive.len() {
            let member = archive
                .by_index(i)
                .map_err(|e| DataError::format(path, format!("zip member #{i}: {e}")))?;
            let name = member
                .name()
                .map_err(|e| DataError::format(path, format!("zip member #{i}: {e}")))?
                .into_owned();
            if found.is_none() && name.to_ascii_lowercase().ends_with(".csv") {
                found = Some(i);
            }
            names.push(name);
        }
        let Some(i) = found else {
            return Err(DataError::format(
                path,
                format!(
                    "the zip holds no .csv member (members: {names:?}); expected the NBER \
                     linkco2015usnum.csv"
                ),
            ));
        };
        let mut member = archive
            .by_index(i)
            .map_err(|e| DataError::format(path, format!("zip member {}: {e}", names[i])))?;
        // The member's header declares its inflated size: read no more than that.
        let declared = member.size();
        if declared > crate::idx::MAX_INFLATED {
            return Err(DataError::format(
                path,
                format!(
                    "zip member {} declares {declared} bytes, more than the {} fedfuse reads",
                    names[i],
                    crate::idx::MAX_INFLATED
                ),
            ));
        }
        let mut out = Vec::new();
        (&mut member)
            .take(declared + 1)
            .read_to_end(&mut out)
            .map_err(|e| DataError::format(path, format!("zip member {}: {e}", names[i])))?;
        if out.len() as u64 > declared {
            return Err(DataError::format(
                path,
                format!(
                    "zip member {} inflates to more than the {declared} bytes its header \
                     declares: a corrupt or hostile archive",
                    names[i]
                ),
            ));
        }
        (
            maybe_gunzip(out, path)?,
            PathBuf::from(format!("{}!{}", path.display(), names[i])),
        )
    } else {
        (bytes, path.to_path_buf())
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        DataError::format(
            &source,
            format!("not UTF-8 text ({e}); is this the NBER CSV?"),
        )
    })?;
    Ok((text, source))
}

/// One kept row before the split: core values, then extras (`None` when missing).
struct Row {
    core: Vec<Val>,
    extras: Vec<Option<Val>>,
}

fn parse_cdc(text: &str, source: &Path, opts: &CdcOptions) -> Result<CdcData> {
    let mut lines = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((_, header)) = lines.next() else {
        return Err(DataError::format(source, "empty file: no header line"));
    };
    let header: Vec<&str> = header.split(',').map(clean).collect();
    let col = |name: &str, what: &str| -> Result<usize> {
        header
            .iter()
            .position(|h| h.eq_ignore_ascii_case(name))
            .ok_or_else(|| DataError::MissingColumn {
                source_name: source.display().to_string(),
                column: name.to_string(),
                what: what.to_string(),
            })
    };
    let core_idx: Vec<usize> = CORE
        .iter()
        .map(|d| col(d.source, &format!("source of feature {}", d.name)))
        .collect::<Result<_>>()?;
    let extra_idx: Vec<usize> = EXTRAS
        .iter()
        .map(|d| col(d.source, &format!("source of extra feature {}", d.name)))
        .collect::<Result<_>>()?;
    let check_idx = col(BLOCK_CHECK, "check of the maternal 2003-revision block")?;
    let split_idx = col(opts.split.source(), "client split key")?;

    let ncols = header.len();
    let cell_err = |line: usize, c: usize, msg: String| DataError::Csv {
        path: source.to_path_buf(),
        line,
        column: format!("{} ({:?})", c + 1, header[c]),
        msg,
    };
    let mut summary = CdcSummary::default();
    let mut missing = vec![0usize; CORE.len()];
    let mut per_client: Vec<Vec<Row>> = (0..opts.split.clients().len())
        .map(|_| Vec::new())
        .collect();
    for (i, line) in lines {
        let line_no = i + 1;
        summary.records += 1;
        let fields: Vec<&str> = line.split(',').map(clean).collect();
        if fields.len() != ncols {
            return Err(DataError::format(
                source,
                format!(
                    "line {line_no}: {} fields, expected {ncols} like the header (quoted commas \
                     are not supported)",
                    fields.len()
                ),
            ));
        }
        if !matches!(fields[check_idx], "Y" | "N" | "U") {
            summary.unusable_block += 1;
            continue;
        }
        let mut core = Vec::with_capacity(CORE.len());
        let mut complete = true;
        for (k, (def, &c)) in CORE.iter().zip(&core_idx).enumerate() {
            match (def.parse)(fields[c]).map_err(|m| cell_err(line_no, c, m))? {
                Some(v) => core.push(v),
                None => {
                    missing[k] += 1;
                    complete = false;
                }
            }
        }
        if !complete {
            summary.incomplete += 1;
            continue;
        }
        let extras = EXTRAS
            .iter()
            .zip(&extra_idx)
            .map(|(def, &c)| (def.parse)(fields[c]).map_err(|m| cell_err(line_no, c, m)))
            .collect::<Result<Vec<_>>>()?;
        let client = opts
            .split
            .client_of(fields[split_idx])
            .map_err(|m| cell_err(line_no, split_idx, m))?;
        per_client[client].push(Row { core, extras });
        summary.kept += 1;
    }
    // Features sharing a source (aged) would double count; report per source column.
    let mut by_source: Vec<(String, usize)> = Vec::new();
    for (def, n) in CORE.iter().zip(missing) {
        if n > 0 && !by_source.iter().any(|(s, _)| s == def.source) {
            by_source.push((def.source.to_string(), n));
        }
    }
    by_source.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    summary.missing = by_source;

    let mut clients = Vec::new();
    for (name, rows) in opts.split.clients().iter().zip(per_client) {
        let extras: Vec<CdcExtra> = opts.extras.get(*name).cloned().unwrap_or_default();
        let extra_pos: Vec<usize> = extras.iter().map(|e| e.index()).collect();
        let before = rows.len();
        let rows: Vec<Row> = rows
            .into_iter()
            .filter(|r| extra_pos.iter().all(|&p| r.extras[p].is_some()))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let mut cols: Vec<(String, Column)> = CORE
            .iter()
            .enumerate()
            .map(|(k, def)| {
                (
                    def.name.to_string(),
                    column(def, rows.iter().map(|r| Some(&r.core[k]))),
                )
            })
            .collect();
        for &p in &extra_pos {
            let def = &EXTRAS[p];
            cols.push((
                def.name.to_string(),
                column(def, rows.iter().map(|r| r.extras[p].as_ref())),
            ));
        }
        clients.push(CdcClient {
            name: name.to_string(),
            table: Table::new(cols)?,
            extras: extras.iter().map(|e| e.name().to_string()).collect(),
            dropped_for_extras: before - rows.len(),
        });
    }
    Ok(CdcData { clients, summary })
}

/// Builds a column from parsed values (all present: rows were filtered beforehand).
fn column<'a>(def: &Def, values: impl Iterator<Item = Option<&'a Val>>) -> Column {
    if def.levels.is_empty() {
        Column::Real(
            values
                .map(|v| match v {
                    Some(Val::Real(x)) => *x,
                    _ => f32::NAN,
                })
                .collect(),
        )
    } else {
        Column::Categorical {
            levels: def.levels.iter().map(|s| s.to_string()).collect(),
            codes: values
                .map(|v| match v {
                    Some(Val::Cat(c)) => *c,
                    _ => u32::MAX,
                })
                .collect(),
        }
    }
}

/// Trims blanks and surrounding double quotes from a cell.
fn clean(s: &str) -> &str {
    let s = s.trim();
    s.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cause_groups_follow_icd10_chapters() {
        let g = |v: &str| match cause_group(v).unwrap() {
            Some(Val::Cat(c)) => CORE[10].levels[c as usize],
            _ => "missing",
        };
        assert_eq!(g("P072"), "perinatal");
        assert_eq!(g("R95"), "sids");
        assert_eq!(g("R99"), "ill_defined");
        assert_eq!(g("W75"), "external");
        assert_eq!(g("G931"), "other");
        assert_eq!(g(""), "missing");
        assert!(cause_group("7").is_err());
    }

    #[test]
    fn plurality_groups_three_and_more() {
        for (code, level) in [("1", 0), ("2", 1), ("3", 2), ("5", 2)] {
            assert!(matches!((CORE[4].parse)(code).unwrap(), Some(Val::Cat(c)) if c == level));
        }
        assert!((CORE[4].parse)("9").unwrap().is_none());
    }
}
