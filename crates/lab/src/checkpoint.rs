//! Checkpoints of `fedfuse run`: after every round, the file `OUT.checkpoint` beside the output
//! folder holds the resolved config, the rounds so far, the global model and the method's
//! server state, in one record written atomically. `fedfuse run --resume` continues from it,
//! and the finished run equals an uninterrupted one: clients' seeds derive from (seed, round,
//! client), the sampler replays the rounds done, and the method restores its state.
//!
//! The rounds' metrics live in a second file, `OUT.checkpoint.rounds`, to which each round
//! appends its own (TOML `[[rounds]]` tables, which concatenate into one document): a round
//! costs the same at round 10 as at round 100,000. The record names how many rounds and bytes
//! of that file it covers, so a round appended by a run killed before its record was written
//! is ignored, and cut off when the run resumes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fed::{Method, RoundMetrics};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{Context, Result, bail};

/// Version of the checkpoint layout; a checkpoint of another version is refused.
const VERSION: i64 = 2;
/// Prefix of the global model's tensors in the record, apart from the method's state.
const GLOBAL: &str = "global:";
/// Prefix of the method's state (tensors, config, metrics) in the record.
const STATE: &str = "state:";
/// Largest checkpoint read: the model and the method's state, far above any run here.
const MAX_BYTES: u64 = 8 << 30;
/// Largest history read: a million rounds of a thousand clients' accuracies.
const MAX_HISTORY_BYTES: u64 = 32 << 30;

/// The rounds done, as TOML (which keeps NaN, unlike JSON).
#[derive(Serialize, Deserialize)]
struct Rounds {
    rounds: Vec<RoundMetrics>,
}

/// The checkpoint file of a run writing to `out`: `OUT.checkpoint`, beside the folder (which
/// is replaced whole only when the run ends).
pub fn path_for(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".checkpoint");
    out.with_file_name(name)
}

/// The history file beside the checkpoint at `path`: `OUT.checkpoint.rounds`.
pub fn history_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".rounds");
    path.with_file_name(name)
}

/// Removes a finished run's checkpoint and history; what could not be removed, with why.
pub fn remove(path: &Path) -> Vec<String> {
    [path.to_path_buf(), history_path(path)]
        .iter()
        .filter_map(|p| match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Some(format!("could not remove {}: {e}", p.display()))
            }
            _ => None,
        })
        .collect()
}

/// A run's state after its last finished round.
pub struct Checkpoint {
    /// Every round finished.
    pub rounds: Vec<RoundMetrics>,
    /// The global model after the last of them.
    pub global: Params,
    /// The method's server state ([`Method::load_state`]).
    pub state: Record,
    /// Bytes of the history file that hold `rounds`.
    pub history_bytes: u64,
}

fn resolved(cfg: &Config) -> Result<String> {
    toml::to_string(cfg).context("cannot write the resolved config")
}

/// Writes the checkpoint of `cfg` after `rounds`, atomically, its history whole: for one
/// checkpoint; a run writes through a [`Checkpointer`], which appends.
pub fn write(
    path: &Path,
    cfg: &Config,
    global: &Params,
    rounds: &[RoundMetrics],
    method: &dyn Method,
) -> Result<()> {
    Checkpointer::new(path).write(cfg, global, rounds, method)
}

/// Writes a run's checkpoints, appending each round's metrics to the history file.
pub struct Checkpointer {
    path: PathBuf,
    /// Rounds and bytes of the history file that the last record written covers.
    covered: Mutex<Option<(usize, u64)>>,
}

impl Checkpointer {
    /// Checkpoints at `path` (the history beside it).
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            covered: Mutex::new(None),
        }
    }

    /// Continues after `checkpoint`, read from this path: the next round is appended after
    /// the bytes it covers.
    pub fn resume_after(&self, checkpoint: &Checkpoint) {
        self.set_covered(Some((checkpoint.rounds.len(), checkpoint.history_bytes)));
    }

    /// The history file holding `rounds`: one round appended when the file holds the rounds
    /// before it, else written whole. Returns its length.
    fn history(&self, rounds: &[RoundMetrics]) -> Result<u64> {
        let file = history_path(&self.path);
        let what = || format!("cannot write {}", file.display());
        let toml_of = |rounds: &[RoundMetrics]| {
            toml::to_string(&Rounds {
                rounds: rounds.to_vec(),
            })
            .context("cannot write the rounds")
        };
        // A poisoned lock only loses the shortcut: the history is then written whole.
        let covered = self.covered.lock().map_or(None, |c| *c);
        match (covered, rounds.split_last()) {
            (Some((n, bytes)), Some((last, before))) if n == before.len() => {
                let text = toml_of(std::slice::from_ref(last))?;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .with_context(what)?;
                // Cut off a round appended by a run killed before its record was written.
                f.set_len(bytes).with_context(what)?;
                std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(bytes)).with_context(what)?;
                f.write_all(text.as_bytes()).with_context(what)?;
                Ok(bytes + text.len() as u64)
            }
            _ => {
                let text = toml_of(rounds)?;
                crate::table::write_atomic(&file, text.as_bytes())?;
                Ok(text.len() as u64)
            }
        }
    }

    /// Writes the checkpoint of `cfg` after `rounds`: the history first, then the record
    /// naming how much of it belongs to this checkpoint, atomically.
    pub fn write(
        &self,
        cfg: &Config,
        global: &Params,
        rounds: &[RoundMetrics],
        method: &dyn Method,
    ) -> Result<()> {
        let Some(state) = method.save_state() else {
            bail!("`{}` cannot save its server state", method.name());
        };
        let state = state?;
        let mut record = Record::default();
        for (name, t) in global.iter() {
            record
                .params
                .push(format!("{GLOBAL}{name}"), t.shape.clone(), t.data.clone())?;
        }
        for (name, t) in state.params.iter() {
            record
                .params
                .push(format!("{STATE}{name}"), t.shape.clone(), t.data.clone())?;
        }
        for (k, v) in &state.config {
            record.config.insert(format!("{STATE}{k}"), v.clone());
        }
        for (k, v) in &state.metrics {
            record.metrics.insert(format!("{STATE}{k}"), *v);
        }
        let bytes = self.history(rounds)?;
        let as_int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        record.config.extend([
            ("version".to_string(), ConfigValue::Int(VERSION)),
            ("config".to_string(), ConfigValue::Str(resolved(cfg)?)),
            (
                "rounds".to_string(),
                ConfigValue::Int(as_int(rounds.len() as u64)),
            ),
            ("rounds_bytes".to_string(), ConfigValue::Int(as_int(bytes))),
        ]);
        crate::table::write_atomic(&self.path, &record.encode()?)?;
        self.set_covered(Some((rounds.len(), bytes)));
        Ok(())
    }

    fn set_covered(&self, covered: Option<(usize, u64)>) {
        if let Ok(mut c) = self.covered.lock() {
            *c = covered;
        }
    }
}

/// Reads the checkpoint at `path` for a run of `cfg`: `None` when there is none, an error when
/// it is unreadable or was written by another config.
pub fn read(path: &Path, cfg: &Config) -> Result<Option<Checkpoint>> {
    let what = || format!("checkpoint {}", path.display());
    if let Err(e) = std::fs::symlink_metadata(path)
        && e.kind() == std::io::ErrorKind::NotFound
    {
        return Ok(None);
    }
    // A regular file of at most MAX_BYTES: a link to a device is refused, not read forever.
    let bytes = fedfuse_core::read_regular_file(path, MAX_BYTES).with_context(what)?;
    let record = Record::decode(&bytes).with_context(what)?;
    let text = |key: &str| match record.config.get(key) {
        Some(ConfigValue::Str(s)) => Ok(s.as_str()),
        _ => Err(crate::LabError::Invalid(format!("{}: no `{key}`", what()))),
    };
    if record.config.get("version") != Some(&ConfigValue::Int(VERSION)) {
        bail!(
            "{} was written by another version of fedfuse; delete it to start over",
            what()
        );
    }
    if text("config")? != resolved(cfg)? {
        bail!(
            "{} belongs to a run of another config (or other --set values); run without \
             --resume to start over, or resume with the config it was written by",
            what()
        );
    }
    let count = |key: &str| match record.config.get(key) {
        Some(ConfigValue::Int(n)) => u64::try_from(*n)
            .map_err(|_| crate::LabError::Invalid(format!("{}: `{key}` = {n}", what()))),
        _ => Err(crate::LabError::Invalid(format!("{}: no `{key}`", what()))),
    };
    let (n_rounds, history_bytes) = (count("rounds")?, count("rounds_bytes")?);
    if n_rounds > cfg.rounds as u64 {
        bail!(
            "{} holds {n_rounds} rounds, more than the config's {}",
            what(),
            cfg.rounds
        );
    }
    let rounds = read_history(&history_path(path), history_bytes)?;
    if rounds.rounds.len() as u64 != n_rounds {
        bail!(
            "{} covers {n_rounds} rounds, and its history {} holds {} in the bytes it names; \
             delete both to start over",
            what(),
            history_path(path).display(),
            rounds.rounds.len()
        );
    }
    let mut global = Params::new();
    let mut state = Record::default();
    for (name, t) in record.params.iter() {
        if let Some(n) = name.strip_prefix(GLOBAL) {
            global.push(n, t.shape.clone(), t.data.clone())?;
        } else if let Some(n) = name.strip_prefix(STATE) {
            state.params.push(n, t.shape.clone(), t.data.clone())?;
        }
    }
    for (k, v) in record.config {
        if let Some(n) = k.strip_prefix(STATE) {
            state.config.insert(n.to_string(), v);
        }
    }
    for (k, v) in record.metrics {
        if let Some(n) = k.strip_prefix(STATE) {
            state.metrics.insert(n.to_string(), v);
        }
    }
    Ok(Some(Checkpoint {
        rounds: rounds.rounds,
        global,
        state,
        history_bytes,
    }))
}

/// The first `bytes` of the history file at `path`, parsed: what the checkpoint covers (a
/// round appended after it is left out).
fn read_history(path: &Path, bytes: u64) -> Result<Rounds> {
    let what = || format!("checkpoint history {}", path.display());
    if bytes > MAX_HISTORY_BYTES {
        bail!(
            "{}: {bytes} bytes is above the limit of {MAX_HISTORY_BYTES}",
            what()
        );
    }
    let file = std::fs::File::open(path).with_context(what)?;
    let meta = file.metadata().with_context(what)?;
    if !meta.is_file() || meta.len() < bytes {
        bail!(
            "{} is not a file of at least the {bytes} bytes its checkpoint names; delete the \
             checkpoint to start over",
            what()
        );
    }
    let mut text = String::with_capacity(usize::try_from(bytes).unwrap_or(0));
    file.take(bytes)
        .read_to_string(&mut text)
        .with_context(what)?;
    if text.is_empty() {
        return Ok(Rounds { rounds: Vec::new() });
    }
    toml::from_str(&text).with_context(what)
}
