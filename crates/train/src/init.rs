use std::collections::HashSet;

use fedfuse_core::{ModelSpec, Params, TensorRole, layers};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Normal, Uniform};
use serde::{Deserialize, Serialize};

/// Parameter initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Init {
    /// PyTorch's default: weights and biases `U(-1/sqrt(fan_in), 1/sqrt(fan_in))`
    /// (Kaiming-uniform with `a = sqrt(5)`).
    #[default]
    Default,
    /// The PFNM reference code's: weights `N(0, 0.1)`, biases `0.1`.
    Pfnm,
}

/// Fresh parameters for `spec`, drawn from a generator seeded with `seed`. Norms start as
/// PyTorch's do: scale 1, shift 0, running mean 0, running variance 1, no batches tracked.
pub fn init_params(spec: &ModelSpec, init: Init, seed: u64) -> Params {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params = Params::zeros(&spec.param_shapes());
    let norms: HashSet<String> = match spec {
        ModelSpec::Sequential { input, layers } => layers::norm_affine_names(input, layers)
            .unwrap_or_default()
            .into_iter()
            .collect(),
        ModelSpec::Mlp { .. } | ModelSpec::LeNet5 { .. } => HashSet::new(),
    };
    // fan_in of a layer is its weight's row length; biases take their weight's fan_in.
    let mut fan_in = 1usize;
    for (name, t) in params.iter_mut() {
        let constant = match TensorRole::of(name) {
            TensorRole::Stat if name.ends_with("running_var") => Some(1.0),
            TensorRole::Stat | TensorRole::Counter => Some(0.0),
            TensorRole::Param if norms.contains(name) => {
                Some(if name.ends_with(".weight") { 1.0 } else { 0.0 })
            }
            TensorRole::Param => None,
        };
        if let Some(c) = constant {
            t.data.iter_mut().for_each(|v| *v = c);
            continue;
        }
        let is_bias = name.ends_with(".bias");
        if !is_bias {
            fan_in = t.row_len().max(1);
        }
        match (init, is_bias) {
            (Init::Default, _) => {
                let bound = 1.0 / (fan_in as f32).sqrt();
                if let Ok(u) = Uniform::new_inclusive(-bound, bound) {
                    t.data.iter_mut().for_each(|v| *v = u.sample(&mut rng));
                }
            }
            (Init::Pfnm, false) => {
                if let Ok(n) = Normal::new(0.0f32, 0.1) {
                    t.data.iter_mut().for_each(|v| *v = n.sample(&mut rng));
                }
            }
            (Init::Pfnm, true) => t.data.iter_mut().for_each(|v| *v = 0.1),
        }
    }
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_init_is_bounded_by_fan_in() {
        let spec = ModelSpec::mlp(100, &[50], 10);
        let p = init_params(&spec, Init::Default, 1);
        let w0 = p.get("layers.0.weight").unwrap();
        assert!(w0.data.iter().all(|v| v.abs() <= 0.1 + 1e-6));
        let w1 = p.get("layers.1.weight").unwrap();
        let bound = 1.0 / 50f32.sqrt();
        assert!(w1.data.iter().all(|v| v.abs() <= bound + 1e-6));
        // Spread close to the uniform's: max |w| near the bound.
        assert!(w1.data.iter().fold(0f32, |m, v| m.max(v.abs())) > 0.9 * bound);
    }

    #[test]
    fn pfnm_init_matches_reference() {
        let spec = ModelSpec::mlp(784, &[100], 10);
        let p = init_params(&spec, Init::Pfnm, 3);
        assert!(
            p.get("layers.0.bias")
                .unwrap()
                .data
                .iter()
                .all(|v| *v == 0.1)
        );
        let w = &p.get("layers.0.weight").unwrap().data;
        let mean = w.iter().map(|v| f64::from(*v)).sum::<f64>() / w.len() as f64;
        let sd = (w
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / w.len() as f64)
            .sqrt();
        assert!(
            mean.abs() < 0.002 && (sd - 0.1).abs() < 0.002,
            "mean {mean} sd {sd}"
        );
    }

    #[test]
    fn norms_start_as_pytorchs() {
        let spec = ModelSpec::sequential(
            &[3, 8, 8],
            vec![
                fedfuse_core::LayerSpec::conv2d(4, 3).without_bias(),
                fedfuse_core::LayerSpec::batch_norm2d(),
                fedfuse_core::LayerSpec::residual(6, 2, fedfuse_core::BlockNorm::Group),
                fedfuse_core::LayerSpec::Flatten,
                fedfuse_core::LayerSpec::linear(3),
            ],
        );
        let p = init_params(&spec, Init::Default, 1);
        let all = |name: &str, v: f32| p.get(name).unwrap().data.iter().all(|&x| x == v);
        for (name, v) in [
            ("1.weight", 1.0),
            ("1.bias", 0.0),
            ("1.running_mean", 0.0),
            ("1.running_var", 1.0),
            ("1.num_batches_tracked", 0.0),
            ("2.bn1.weight", 1.0),
            ("2.bn2.bias", 0.0),
            ("2.shortcut.1.weight", 1.0),
        ] {
            assert!(all(name, v), "{name}");
        }
        // Weights are drawn, bounded by their fan-in: conv 4x3x3x3 has fan-in 27.
        let w = &p.get("0.weight").unwrap().data;
        assert!(w.iter().all(|v| v.abs() <= 1.0 / 27f32.sqrt()) && w.iter().any(|&v| v != 0.0));
    }

    #[test]
    fn seeded() {
        let spec = ModelSpec::mlp(4, &[3], 2);
        assert_eq!(
            init_params(&spec, Init::Default, 5),
            init_params(&spec, Init::Default, 5)
        );
        assert_ne!(
            init_params(&spec, Init::Default, 5),
            init_params(&spec, Init::Default, 6)
        );
    }
}
