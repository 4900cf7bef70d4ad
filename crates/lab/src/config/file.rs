//! Reading a settings file: the text (a missing file named with where the shipped ones are),
//! `--set key.path=value` overrides, and the check, every error naming the file.

use std::path::Path;

use crate::error::{Context, Result, bail};

/// Sets `key.path` to `value` (parsed as TOML, else taken as a string).
pub(super) fn apply_override(root: &mut toml::Table, assignment: &str) -> Result<()> {
    let Some((path, raw)) = assignment.split_once('=') else {
        bail!("--set `{assignment}`: expected key.path=value");
    };
    let keys: Vec<&str> = path.trim().split('.').collect();
    if keys.iter().any(|k| k.is_empty()) {
        bail!("--set `{assignment}`: empty key in `{path}`");
    }
    let raw = raw.trim();
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let (last, parents) = keys.split_last().context("empty --set key")?;
    let mut table = root;
    for k in parents {
        let entry = table
            .entry(k.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => bail!("--set `{assignment}`: `{k}` is not a table"),
        };
    }
    table.insert(last.to_string(), value);
    Ok(())
}

/// The text of the settings file `path` (a `what`: "config", "comparison"); a missing file
/// is named with where the shipped ones are, since a newcomer's first mistake is a path typed
/// from another folder.
pub fn read_settings_file(path: &Path, what: &str) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{what} {} does not exist (looked from {}); the shipped ones are in the \
             repository's examples/ and experiments/ folders",
            path.display(),
            std::env::current_dir().map_or_else(|_| "here".into(), |d| d.display().to_string())
        ),
        Err(e) => Err(e).with_context(|| format!("cannot read {what} {}", path.display())),
    }
}

/// Reads the TOML file `path` as a `what` (e.g. "sweep config") and checks it with `check`;
/// every error names the file.
pub fn load_checked<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
    check: impl FnOnce(&T) -> Result<()>,
) -> Result<T> {
    let text = read_settings_file(path, what)?;
    let cfg: T = toml::from_str(&text).with_context(|| format!("{what} {}", path.display()))?;
    check(&cfg).with_context(|| format!("{what} {}", path.display()))?;
    Ok(cfg)
}
