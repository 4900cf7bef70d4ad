//! What an interrupted `gems` or `ngm` experiment finished: `OUT/runs.toml` keeps each finished
//! seed's rows with the settings it ran under, and `--resume` takes a seed's rows from it only
//! under identical settings (the experiment's file, seeds aside).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Context, Result};

/// The file, inside the experiment's output folder.
const FILE: &str = "runs.toml";

/// One finished seed.
#[derive(Serialize, Deserialize)]
#[serde(bound = "R: Serialize + DeserializeOwned")]
struct Seed<R> {
    seed: u64,
    settings: String,
    rows: Vec<R>,
}

/// Finished seeds, as `runs.toml` keeps them (TOML keeps the NaN of unmeasured figures, which
/// JSON cannot).
#[derive(Serialize, Deserialize)]
#[serde(bound = "R: Serialize + DeserializeOwned")]
pub(crate) struct Finished<R> {
    seeds: Vec<Seed<R>>,
}

impl<R: Serialize + DeserializeOwned> Finished<R> {
    /// None yet.
    pub(crate) fn new() -> Self {
        Self { seeds: Vec::new() }
    }

    /// With `resume`, what `out/runs.toml` holds (nothing when it is absent); without, nothing.
    pub(crate) fn earlier(out: &Path, resume: bool) -> Result<Self> {
        let path = out.join(FILE);
        if !resume || !path.exists() {
            return Ok(Self::new());
        }
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("{}", path.display()))
    }

    /// The rows of `seed` finished under `settings`, taken out.
    fn take(&mut self, seed: u64, settings: &str) -> Option<Vec<R>> {
        let i = self
            .seeds
            .iter()
            .position(|s| s.seed == seed && s.settings == settings)?;
        Some(self.seeds.remove(i).rows)
    }

    /// The rows of `seed` under `settings`: taken from an earlier run (saying so), or from
    /// `run`.
    pub(crate) fn take_or_run(
        &mut self,
        seed: u64,
        settings: &str,
        out: &Path,
        observer: &dyn crate::Observer,
        run: impl FnOnce() -> Result<Vec<R>>,
    ) -> Result<Vec<R>> {
        match self.take(seed, settings) {
            Some(rows) => {
                observer.note(&format!(
                    "seed {seed}: finished before, from {}",
                    out.join(FILE).display()
                ));
                Ok(rows)
            }
            None => run(),
        }
    }

    /// Records `rows` as `seed`'s, finished under `settings`.
    pub(crate) fn push(&mut self, seed: u64, settings: &str, rows: Vec<R>) {
        self.seeds.push(Seed {
            seed,
            settings: settings.to_string(),
            rows,
        });
    }

    /// Writes `runs.toml` into `dir` (a folder being published), atomically.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let text = toml::to_string(self).context("cannot write runs.toml")?;
        crate::table::write_atomic(&dir.join(FILE), text.as_bytes())
    }
}

/// An experiment's settings apart from its seeds, as TOML: what a finished seed must have run
/// under to be reused.
pub(crate) fn settings_of<T: Serialize + Clone>(
    cfg: &T,
    clear_seeds: impl FnOnce(&mut T),
) -> Result<String> {
    let mut cfg = cfg.clone();
    clear_seeds(&mut cfg);
    toml::to_string(&cfg).context("cannot write the experiment's settings")
}
