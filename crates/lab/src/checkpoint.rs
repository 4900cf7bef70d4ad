//! Checkpoints of `fedfuse run`: after every round, the file `OUT.checkpoint` beside the output
//! folder holds the resolved config, the rounds so far, the global model and the method's
//! server state, in one record written atomically. `fedfuse run --resume` continues from it,
//! and the finished run equals an uninterrupted one: clients' seeds derive from (seed, round,
//! client), the sampler replays the rounds done, and the method restores its state.

use std::path::{Path, PathBuf};

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fed::{Method, RoundMetrics};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{Context, Result, bail};

/// Version of the checkpoint layout; a checkpoint of another version is refused.
const VERSION: i64 = 1;
/// Prefix of the global model's tensors in the record, apart from the method's state.
const GLOBAL: &str = "global:";
/// Prefix of the method's state (tensors, config, metrics) in the record.
const STATE: &str = "state:";
/// Largest checkpoint read: the model and the method's state, far above any run here.
const MAX_BYTES: u64 = 8 << 30;

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

/// A run's state after its last finished round.
pub struct Checkpoint {
    /// Every round finished.
    pub rounds: Vec<RoundMetrics>,
    /// The global model after the last of them.
    pub global: Params,
    /// The method's server state ([`Method::load_state`]).
    pub state: Record,
}

fn resolved(cfg: &Config) -> Result<String> {
    toml::to_string(cfg).context("cannot write the resolved config")
}

/// Writes the checkpoint of `cfg` after `rounds`, atomically.
pub fn write(
    path: &Path,
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
    let rounds = toml::to_string(&Rounds {
        rounds: rounds.to_vec(),
    })
    .context("cannot write the rounds")?;
    record.config.extend([
        ("version".to_string(), ConfigValue::Int(VERSION)),
        ("config".to_string(), ConfigValue::Str(resolved(cfg)?)),
        ("rounds".to_string(), ConfigValue::Str(rounds)),
    ]);
    crate::table::write_atomic(path, &record.encode()?)
}

/// Reads the checkpoint at `path` for a run of `cfg`: `None` when there is none, an error when
/// it is unreadable or was written by another config.
pub fn read(path: &Path, cfg: &Config) -> Result<Option<Checkpoint>> {
    let what = || format!("checkpoint {}", path.display());
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(what),
    };
    if len > MAX_BYTES {
        bail!("{} is {len} bytes, more than any run writes", what());
    }
    let bytes = std::fs::read(path).with_context(what)?;
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
    let rounds: Rounds = toml::from_str(text("rounds")?).with_context(what)?;
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
    if rounds.rounds.len() > cfg.rounds {
        bail!(
            "{} holds {} rounds, more than the config's {}",
            what(),
            rounds.rounds.len(),
            cfg.rounds
        );
    }
    Ok(Some(Checkpoint {
        rounds: rounds.rounds,
        global,
        state,
    }))
}
