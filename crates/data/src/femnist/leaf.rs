//! LEAF's JSON shards. A shard is `{"users": [...], "num_samples": [...], "user_data": {user:
//! {"x": [[784 values], ...], "y": [labels]}}}`; `x` holds each image row by row, scaled to
//! `[0, 1]` (LEAF's `pixel / 255`). LEAF splits every writer's samples into its `train/` and
//! `test/` folders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{FEMNIST_CLASSES, FEMNIST_PIXELS, Samples, assemble};
use crate::dataset::TrainTest;
use crate::error::{DataError, Result};

/// The largest shard read (LEAF's are a few hundred MB): a bigger file is refused before it
/// is read.
pub const MAX_LEAF_SHARD_BYTES: u64 = 1 << 30;

#[derive(Deserialize)]
struct Shard {
    users: Vec<String>,
    num_samples: Vec<u64>,
    user_data: BTreeMap<String, UserData>,
}

#[derive(Deserialize)]
struct UserData {
    x: Vec<Vec<f32>>,
    y: Vec<i64>,
}

/// Reads FEMNIST from LEAF's JSON shards under `dir` (which holds `train/` and `test/`, see
/// [`super::find_leaf_dir`]): every `*.json` file of each folder, in name order. Samples are
/// `[1, 28, 28]`, labels `0..62`, and each carries its writer as `writer_id` (the writers of
/// both splits share one sorted list of names). Errors name the file, the writer and what is
/// wrong: a shard over [`MAX_LEAF_SHARD_BYTES`], counts that disagree, an image of another
/// size, a value outside `[0, 1]`, a label outside `0..62`, a writer listed twice.
pub fn read_leaf_femnist(dir: &Path) -> Result<TrainTest> {
    let train = read_split(&dir.join("train"))?;
    let test = read_split(&dir.join("test"))?;
    assemble(train, test)
}

/// Every shard of one split's folder, in name order.
fn read_split(dir: &Path) -> Result<Samples> {
    let io = |action, source| DataError::Io {
        action,
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io("could not list", e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(DataError::Format {
            path: dir.to_path_buf(),
            msg: "no *.json shard here; LEAF's preprocessing writes them (see `fedfuse data \
                  info femnist`)"
                .into(),
        });
    }
    let mut out = Samples::default();
    let mut seen = std::collections::BTreeSet::new();
    for file in files {
        read_shard(&file, &mut out, &mut seen)?;
    }
    Ok(out)
}

/// Appends the samples of the shard `path` to `out`; `seen` holds the writers read so far in
/// this split (a writer in two shards of one split is refused).
fn read_shard(
    path: &Path,
    out: &mut Samples,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<()> {
    let bad = |msg: String| DataError::Format {
        path: path.to_path_buf(),
        msg,
    };
    let size = std::fs::metadata(path)
        .map_err(|source| DataError::Io {
            action: "could not read",
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if size > MAX_LEAF_SHARD_BYTES {
        return Err(bad(format!(
            "{size} bytes, over the {MAX_LEAF_SHARD_BYTES} a LEAF shard may have; split it \
             (LEAF writes several)"
        )));
    }
    let text = std::fs::read(path).map_err(|source| DataError::Io {
        action: "could not read",
        path: path.to_path_buf(),
        source,
    })?;
    let shard: Shard = serde_json::from_slice(&text).map_err(|e| {
        bad(format!(
            "not a LEAF shard ({{\"users\", \"num_samples\", \"user_data\"}}): {e}"
        ))
    })?;
    drop(text);
    if shard.users.len() != shard.num_samples.len() {
        return Err(bad(format!(
            "{} users but {} num_samples",
            shard.users.len(),
            shard.num_samples.len()
        )));
    }
    if shard.user_data.len() != shard.users.len() {
        return Err(bad(format!(
            "{} users listed but user_data holds {}",
            shard.users.len(),
            shard.user_data.len()
        )));
    }
    let mut user_data = shard.user_data;
    for (user, &n) in shard.users.iter().zip(&shard.num_samples) {
        let Some(data) = user_data.remove(user) else {
            return Err(bad(format!("user `{user}` has no user_data")));
        };
        if !seen.insert(user.clone()) {
            return Err(bad(format!("user `{user}` appears twice in this split")));
        }
        if data.x.len() as u64 != n || data.y.len() as u64 != n {
            return Err(bad(format!(
                "user `{user}`: num_samples says {n}, but x holds {} images and y {} labels",
                data.x.len(),
                data.y.len()
            )));
        }
        for (k, (img, &label)) in data.x.iter().zip(&data.y).enumerate() {
            if img.len() != FEMNIST_PIXELS {
                return Err(bad(format!(
                    "user `{user}`, sample {k}: {} values where a 28x28 image has \
                     {FEMNIST_PIXELS}",
                    img.len()
                )));
            }
            if let Some(v) = img.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                return Err(bad(format!(
                    "user `{user}`, sample {k}: pixel {v} outside [0, 1] (LEAF scales pixels \
                     by 1/255)"
                )));
            }
            if !(0..FEMNIST_CLASSES as i64).contains(&label) {
                return Err(bad(format!(
                    "user `{user}`, sample {k}: label {label} outside 0..{FEMNIST_CLASSES}"
                )));
            }
            out.x.extend_from_slice(img);
            out.y.push(label as u32);
            out.writers.push(user.clone());
        }
    }
    Ok(())
}
