//! Rows over seeds -> `results.csv`, `summary.csv`, `summary.md`: the statistics, grouping,
//! formatting and atomic writing every experiment shares.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Context, LabError, Result, bail};

/// The hidden-layer widths of an MLP, written `100-100` in tables and saved rows (empty: no
/// hidden layer, or no single model).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HiddenWidths(pub Vec<usize>);

impl HiddenWidths {
    /// The hidden widths of the MLP `params`; empty when `params` is no MLP.
    pub fn of(params: &fedfuse_core::Params) -> Self {
        let widths = fedfuse_core::ModelSpec::infer_mlp(params)
            .ok()
            .and_then(|s| s.mlp_widths())
            .map(|w| w[1..w.len() - 1].to_vec())
            .unwrap_or_default();
        Self(widths)
    }

    /// The units of all hidden layers; `None` when there are none.
    pub fn total(&self) -> Option<usize> {
        (!self.0.is_empty()).then(|| self.0.iter().sum())
    }
}

impl std::fmt::Display for HiddenWidths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, w) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("-")?;
            }
            write!(f, "{w}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for HiddenWidths {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        if s.is_empty() {
            return Ok(Self::default());
        }
        s.split('-')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .map(Self)
    }
}

impl serde::Serialize for HiddenWidths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HiddenWidths {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|e| serde::de::Error::custom(format!("hidden widths `{text}`: {e}")))
    }
}

/// Mean and sample standard deviation of a non-empty slice (0 for one value).
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    // Sample standard deviation; 0 for a single seed.
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Mean, sample standard deviation and count of the finite values (a failed run is a NaN
/// row and counts as missing); NaN statistics when none is finite.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Mean of the finite values.
    pub mean: f64,
    /// Their sample standard deviation.
    pub std: f64,
    /// How many were finite.
    pub n: usize,
}

impl Stats {
    /// The statistics of the finite `values`.
    pub fn of_finite(values: impl IntoIterator<Item = f64>) -> Self {
        let v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Self {
                mean: f64::NAN,
                std: f64::NAN,
                n: 0,
            };
        }
        let (mean, std) = mean_std(&v);
        Self {
            mean,
            std,
            n: v.len(),
        }
    }

    /// `(mean, std)`.
    pub fn pair(self) -> (f64, f64) {
        (self.mean, self.std)
    }
}

/// `mean ± std` with `digits` decimals after scaling both by `scale`; `-` when missing.
pub fn pm(v: (f64, f64), scale: f64, digits: usize) -> String {
    if v.0.is_nan() {
        "-".into()
    } else {
        format!("{:.digits$} ± {:.digits$}", v.0 * scale, v.1 * scale)
    }
}

/// Items grouped by `key`, groups in the order their first item appears.
pub fn group_first_seen<T, K: Ord + Clone>(
    items: &[T],
    key: impl Fn(&T) -> K,
) -> Vec<(K, Vec<&T>)> {
    let mut order: Vec<K> = Vec::new();
    let mut groups: BTreeMap<K, Vec<&T>> = BTreeMap::new();
    for item in items {
        let k = key(item);
        if !groups.contains_key(&k) {
            order.push(k.clone());
        }
        groups.entry(k).or_default().push(item);
    }
    order
        .into_iter()
        .map(|k| {
            let g = groups.remove(&k).unwrap_or_default();
            (k, g)
        })
        .collect()
}

/// A CSV field, quoted when it holds a comma, quote or newline.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so a
/// reader (or a run killed mid-write) never sees half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    create_parent(path)?;
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}", path.display())
    })
}

/// Writes `params` with `metadata` as a safetensors file at `path`, atomically as
/// [`write_atomic`] and streamed from the tensors, with no encoded copy in memory
/// ([`fedfuse_core::write_safetensors`]).
pub fn write_model_atomic(
    path: &Path,
    params: &fedfuse_core::Params,
    metadata: std::collections::HashMap<String, String>,
) -> Result<()> {
    create_parent(path)?;
    fedfuse_core::write_safetensors(params, metadata, path)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The folder `path` is written into (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates the folders above `path` that do not exist yet (`--out runs/new/a` in a fresh
/// clone), with an error naming the folder that could not be made.
fn create_parent(path: &Path) -> Result<()> {
    let parent = parent_of(path);
    std::fs::create_dir_all(parent).with_context(|| {
        let in_the_way = parent.ancestors().find(|a| a.is_file());
        let why = in_the_way.map_or(String::new(), |f| {
            format!(" ({} is a file, not a folder)", f.display())
        });
        format!(
            "cannot create folder {}{why} to write {} into",
            parent.display(),
            path.display()
        )
    })
}

/// Makes sure, before any work starts, that an output can be written at `path` when the work
/// ends: creates its missing parent folders and checks that a file can be made there (no
/// permission, a read-only disk and a file in the way are refused now, naming the folder,
/// rather than after an hour of training).
pub fn prepare_output_path(path: &Path) -> Result<()> {
    create_parent(path)?;
    let parent = parent_of(path);
    let probe = parent.join(format!(".fedfuse-probe.{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .with_context(|| {
            format!(
                "cannot write into folder {} (for {}); give an output path you can write",
                parent.display(),
                path.display()
            )
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Creates the output folder `out` and records the settings that produced it as `file` (TOML),
/// so a folder always says what it holds.
pub fn start_output<T: serde::Serialize>(out: &Path, file: &str, settings: &T) -> Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create output folder {}", out.display()))?;
    let text = toml::to_string_pretty(settings).context("cannot serialise the settings")?;
    write_atomic(&out.join(file), text.as_bytes())
}

/// What a run's folder holds (`fedfuse run` and a Flower strategy's `out`): a folder holding
/// anything else is not replaced.
pub const RUN_FILES: [&str; 8] = [
    "config.toml",
    "results.json",
    "metrics.csv",
    "model.safetensors",
    "accuracy_vs_round.png",
    "accuracy_vs_round.svg",
    "accuracy_vs_bytes.png",
    "accuracy_vs_bytes.svg",
];

/// Whether an experiment's folder (`fedfuse compare`, `sweep`, `gems`, `ngm`) may hold `name`:
/// its settings, tables, finished runs and plots.
pub fn is_experiment_file(name: &str) -> bool {
    const FILES: [&str; 8] = [
        "experiment.toml",
        "sweep.toml",
        "compare.toml",
        "runs.toml",
        "results.csv",
        "results.json",
        "summary.csv",
        "summary.md",
    ];
    FILES.contains(&name) || name.ends_with(".png") || name.ends_with(".svg")
}

/// Checks, before a run starts, that its output folder can be replaced when it ends: `out`
/// is new, or holds only files named in `allowed` (an earlier run's), and the folder above it
/// exists (it is created) and can be written. Errors name the files that would be lost.
pub fn check_replaceable(out: &Path, allowed: &[&str]) -> Result<()> {
    check_replaceable_by(out, |name| allowed.contains(&name))
}

/// [`check_replaceable`] with a rule for the names allowed.
pub fn check_replaceable_by(out: &Path, allowed: impl Fn(&str) -> bool) -> Result<()> {
    let entries = match std::fs::read_dir(out) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return prepare_output_path(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory && out.is_file() => {
            bail!("{} is a file; give a folder for the outputs", out.display())
        }
        // A file where a folder above `out` should be: named by the attempt to create it.
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return prepare_output_path(out);
        }
        Err(e) => bail!("cannot read output folder {}: {e}", out.display()),
    };
    prepare_output_path(out)?;
    let mut foreign = Vec::new();
    for entry in entries {
        let entry =
            entry.with_context(|| format!("cannot read output folder {}", out.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !allowed(&name) {
            foreign.push(name);
        }
    }
    if !foreign.is_empty() {
        foreign.sort();
        bail!(
            "output folder {} holds files a run does not write ({}); a run replaces its whole \
             folder, so give a new or empty folder",
            out.display(),
            foreign.join(", ")
        );
    }
    Ok(())
}

/// Writes a folder's files into a fresh sibling folder and then swaps it in whole, so that
/// `out` holds either the earlier set of files or the new one, never a mix, even if the
/// process dies part-way. `write` fills the folder it is given.
pub fn replace_folder(out: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let name = out
        .file_name()
        .with_context(|| format!("{} is not a folder path", out.display()))?
        .to_string_lossy()
        .into_owned();
    create_parent(out)?;
    let parent = parent_of(out);
    let pid = std::process::id();
    let staging = parent.join(format!(".{name}.new-{pid}"));
    let old = parent.join(format!(".{name}.old-{pid}"));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)
        .with_context(|| format!("cannot create folder {}", staging.display()))?;
    if let Err(e) = write(&staging) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let had_old = out.exists();
    if had_old {
        std::fs::rename(out, &old).with_context(|| {
            format!(
                "cannot move the earlier {} aside; the new files are in {}",
                out.display(),
                staging.display()
            )
        })?;
    }
    if let Err(e) = std::fs::rename(&staging, out) {
        if had_old {
            let _ = std::fs::rename(&old, out);
        }
        return Err(LabError::Invalid(format!(
            "cannot move the new files into {} ({e}); they are in {}",
            out.display(),
            staging.display()
        )));
    }
    if had_old {
        let _ = std::fs::remove_dir_all(&old);
    }
    Ok(())
}

/// The three tables of an experiment, written together into its output folder.
pub struct Tables {
    /// One row per seed (and round, where there are rounds).
    pub results_csv: String,
    /// Mean and spread over seeds.
    pub summary_csv: String,
    /// The same for a reader, as Markdown.
    pub summary_md: String,
}

impl Tables {
    /// Writes `results.csv`, `summary.csv` and `summary.md` into `out`.
    pub fn write(&self, out: &Path) -> Result<()> {
        write_atomic(&out.join("results.csv"), self.results_csv.as_bytes())?;
        write_atomic(&out.join("summary.csv"), self.summary_csv.as_bytes())?;
        write_atomic(&out.join("summary.md"), self.summary_md.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_sample_std_by_hand() {
        let (m, s) = mean_std(&[1.0, 2.0, 4.0]);
        assert!((m - 7.0 / 3.0).abs() < 1e-12);
        // Squared deviations 16/9, 1/9, 25/9 sum to 42/9; over n - 1 = 2.
        assert!((s - (21.0f64 / 9.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
    }

    #[test]
    fn stats_skip_failed_runs() {
        let s = Stats::of_finite([1.0, f64::NAN, 3.0]);
        assert_eq!((s.mean, s.std, s.n), (2.0, 2f64.sqrt(), 2));
        assert!(Stats::of_finite([f64::NAN]).mean.is_nan());
        assert_eq!(pm((0.5, 0.25), 100.0, 1), "50.0 ± 25.0");
        assert_eq!(pm((f64::NAN, 0.0), 1.0, 1), "-");
    }

    #[test]
    fn groups_keep_first_seen_order() {
        let g = group_first_seen(&["b1", "a1", "b2"], |s| s.as_bytes()[0]);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].0, b'b');
        assert_eq!(g[0].1, vec![&"b1", &"b2"]);
        assert_eq!(g[1].1, vec![&"a1"]);
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn atomic_write_replaces_whole_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.csv");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
