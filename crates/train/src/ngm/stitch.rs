//! FedNGM stitching (note 1.7, step 7): a client extends the global NGM with its own extra
//! features and retrains on its data.
//!
//! Layout of the extended model: the global units come first (`0..U_g`), the extra units after
//! them; every hidden layer keeps the global units first and appends `new_hidden` units. The
//! global weights and biases are copied into the top-left sub-block of each layer. Every other
//! entry is new and trainable: new inputs feed the old hidden units (extra incoming weights),
//! new hidden units read all inputs / hidden units of the layer below and feed all units of the
//! layer above, and the old hidden units also feed the new outputs. The extended graph's path
//! penalty decides which of these connections survive.

use fedfuse_core::{ModelSpec, Params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Uniform};
use serde::{Deserialize, Serialize};

use super::fit::{Frozen, Task};
use fedfuse_core::FeatureBlock;

use super::{Ngm, NgmConfig, NgmFit};
use crate::{Result, TrainError};

/// What trains after stitching.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StitchMode {
    /// Option (a): the copied global entries get no gradient and stay bit-identical; only new
    /// entries train. Global outputs can still change, since new inputs feed old hidden units.
    Frozen,
    /// Option (b): everything trains at this (low) learning rate, replacing `fit.lr`.
    FineTune {
        /// Adam learning rate.
        lr: f64,
    },
}

/// Settings of stitching.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StitchConfig {
    /// Hidden units appended to every hidden layer.
    pub new_hidden: usize,
    /// Frozen global part or fine-tuning.
    pub mode: StitchMode,
    /// New weights are drawn from `U(-b, b)`, `b = init_scale / sqrt(fan_in)` (1 would be
    /// PyTorch's default); new biases start at 0.
    pub init_scale: f32,
    /// Training settings (`hidden` is ignored; `seed` also seeds the new weights).
    pub fit: NgmConfig,
}

impl Default for StitchConfig {
    fn default() -> Self {
        Self {
            new_hidden: 8,
            mode: StitchMode::Frozen,
            init_scale: 0.1,
            fit: NgmConfig::default(),
        }
    }
}

/// The extended parameters: `global` (an NGM MLP of `U_g` units) widened by `extra_units`
/// inputs and outputs and `new_hidden` units per hidden layer, the global values copied into
/// each layer's leading block (see the module docs), new weights small and random (seeded),
/// new biases 0.
pub fn stitch_params(
    global: &Params,
    extra_units: usize,
    new_hidden: usize,
    init_scale: f32,
    seed: u64,
) -> Result<Params> {
    Ok(stitch_inner(global, extra_units, new_hidden, init_scale, seed)?.0)
}

fn stitch_inner(
    global: &Params,
    extra_units: usize,
    new_hidden: usize,
    init_scale: f32,
    seed: u64,
) -> Result<(Params, Frozen)> {
    let spec = ModelSpec::infer_mlp(global)?;
    let ModelSpec::Mlp {
        input,
        hidden,
        classes,
    } = &spec
    else {
        return Err(TrainError::DataMismatch("stitching needs an MLP".into()));
    };
    if input != classes {
        return Err(TrainError::DataMismatch(format!(
            "the global model maps {input} inputs to {classes} outputs; an NGM maps its units \
             to themselves"
        )));
    }
    if !(init_scale.is_finite() && init_scale >= 0.0) {
        return Err(TrainError::InvalidConfig {
            field: "stitch.init_scale",
            reason: format!("{init_scale} is not >= 0"),
        });
    }
    let old: Vec<usize> = std::iter::once(*input)
        .chain(hidden.iter().copied())
        .chain(std::iter::once(*classes))
        .collect();
    let last = old.len() - 1;
    let new: Vec<usize> = old
        .iter()
        .enumerate()
        .map(|(k, &w)| {
            if k == 0 || k == last {
                w + extra_units
            } else {
                w + new_hidden
            }
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Params::new();
    let mut frozen = Vec::with_capacity(last);
    for l in 0..last {
        let w = global.require(&format!("layers.{l}.weight"))?;
        let b = global.require(&format!("layers.{l}.bias"))?;
        let (gi, go, ni, no) = (old[l], old[l + 1], new[l], new[l + 1]);
        let bound = init_scale / (ni as f32).sqrt();
        let dist =
            Uniform::new_inclusive(-bound, bound).map_err(|e| TrainError::InvalidConfig {
                field: "stitch.init_scale",
                reason: format!("{e}"),
            })?;
        let mut wd = vec![0.0f32; no * ni];
        for o in 0..no {
            for i in 0..ni {
                wd[o * ni + i] = if o < go && i < gi {
                    w.data[o * gi + i]
                } else {
                    dist.sample(&mut rng)
                };
            }
        }
        let mut bd = vec![0.0f32; no];
        bd[..go].copy_from_slice(&b.data);
        out.push(format!("layers.{l}.weight"), vec![no, ni], wd)?;
        out.push(format!("layers.{l}.bias"), vec![no], bd)?;
        frozen.push((gi, go));
    }
    Ok((out, frozen))
}

impl Ngm {
    /// Stitching: this NGM is the *extended* one (global blocks first, then the client's extra
    /// features, with the client's extended graph); `global` holds the global NGM's parameters
    /// over `global_blocks`. Builds the widened model with [`stitch_params`] and trains it on
    /// the client's rows `x` (`n x U`, extended layout) with the NGM loss under the extended
    /// graph, in `cfg.mode`.
    pub fn stitch(
        &self,
        global: &Params,
        global_blocks: &[FeatureBlock],
        x: &[f32],
        cfg: &StitchConfig,
    ) -> Result<NgmFit> {
        let n_g = global_blocks.len();
        if n_g >= self.blocks().len() || self.blocks()[..n_g] != *global_blocks {
            return Err(TrainError::Blocks(format!(
                "the extended NGM's first {n_g} blocks must be the global blocks, in order, \
                 followed by at least one extra block"
            )));
        }
        let u_g: usize = global_blocks.iter().map(|b| b.len).sum();
        let spec = ModelSpec::infer_mlp(global)?;
        if spec.input_len() != u_g {
            return Err(TrainError::DataMismatch(format!(
                "the global parameters take {} units but the global blocks cover {u_g}",
                spec.input_len()
            )));
        }
        let (start, frozen) = stitch_inner(
            global,
            self.units() - u_g,
            cfg.new_hidden,
            cfg.init_scale,
            cfg.fit.seed,
        )?;
        let mut fit = cfg.fit.clone();
        let frozen = match cfg.mode {
            StitchMode::Frozen => Some(frozen),
            StitchMode::FineTune { lr } => {
                fit.lr = lr;
                None
            }
        };
        self.fit_task(
            Some(&start),
            Task {
                inputs: x,
                targets: x,
                public: None,
                weights: self.forbidden_weights(),
                frozen,
            },
            &fit,
        )
    }
}
