use std::collections::HashSet;

use fedfuse_core::{LayerSpec, ModelSpec, Params, TensorRole, layers};
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
    // A Vision Transformer's layers start as torchvision's (drawn after the loop below).
    let vit: HashSet<String> = match (spec, init) {
        (ModelSpec::Sequential { layers, .. }, Init::Default) => vit_tensors(layers),
        _ => HashSet::new(),
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
            (Init::Default, _) if vit.contains(name) => {}
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
    if let ModelSpec::Sequential { layers, .. } = spec
        && !vit.is_empty()
    {
        init_vit(layers, &mut params, &mut rng);
    }
    params
}

/// The tensors of a Vision Transformer's tokens and encoder layers, and the head after its
/// class token: what [`init_vit`] draws.
fn vit_tensors(layers: &[LayerSpec]) -> HashSet<String> {
    let mut names = HashSet::new();
    let mut after_class = false;
    for (i, layer) in layers.iter().enumerate() {
        let own: &[&str] = match layer {
            LayerSpec::Tokens { .. } => &[
                "class_token",
                "conv_proj.weight",
                "conv_proj.bias",
                "pos_embedding",
            ],
            LayerSpec::Encoder { .. } => &[
                "self_attention.in_proj_weight",
                "self_attention.in_proj_bias",
                "self_attention.out_proj.weight",
                "self_attention.out_proj.bias",
                "mlp.0.weight",
                "mlp.0.bias",
                "mlp.3.weight",
                "mlp.3.bias",
            ],
            LayerSpec::ClassToken => {
                after_class = true;
                &[]
            }
            LayerSpec::Linear { .. } if after_class => &["weight", "bias"],
            _ => &[],
        };
        names.extend(own.iter().map(|t| format!("{i}.{t}")));
    }
    names
}

/// torchvision's initialisation of a Vision Transformer (its distributions, not its random
/// stream): the patch convolution `N(0, 1 / fan_in)` (torchvision's truncation at +-2 never
/// bites at these scales) with a zero bias, a zero class token, the positional embedding
/// `N(0, 0.02^2)`, the packed q/k/v projection Xavier-uniform over its whole `[3h, h]` matrix
/// with a zero bias, the output projection `nn.Linear`'s default with a zero bias, the MLP's
/// weights Xavier-uniform and biases `N(0, 1e-12)`, the head after the class token zeros. The
/// layer norms are set where every norm is (scale 1, shift 0).
fn init_vit(layers: &[LayerSpec], params: &mut Params, rng: &mut StdRng) {
    type Draw = Box<dyn Fn(&mut StdRng) -> f32>;
    let set = |params: &mut Params, rng: &mut StdRng, name: String, draw: Draw| {
        if let Some(t) = params.get_mut(&name) {
            t.data.iter_mut().for_each(|v| *v = draw(rng));
        }
    };
    let normal = |sd: f32| -> Draw {
        Box::new(move |rng| Normal::new(0.0f32, sd).map_or(0.0, |n| n.sample(rng)))
    };
    let uniform = |bound: f32| -> Draw {
        Box::new(move |rng| Uniform::new_inclusive(-bound, bound).map_or(0.0, |u| u.sample(rng)))
    };
    let xavier = |fan_in: usize, fan_out: usize| uniform((6.0 / (fan_in + fan_out) as f32).sqrt());
    let zero = || -> Draw { Box::new(|_| 0.0) };
    let row = |params: &Params, name: &str| params.get(name).map_or(1, |t| t.row_len().max(1));
    let mut after_class = false;
    for (i, layer) in layers.iter().enumerate() {
        let n = |t: &str| format!("{i}.{t}");
        match *layer {
            LayerSpec::Tokens { .. } => {
                let fan_in = row(params, &n("conv_proj.weight"));
                set(params, rng, n("class_token"), zero());
                set(
                    params,
                    rng,
                    n("conv_proj.weight"),
                    normal((1.0 / fan_in as f32).sqrt()),
                );
                set(params, rng, n("conv_proj.bias"), zero());
                set(params, rng, n("pos_embedding"), normal(0.02));
            }
            LayerSpec::Encoder { mlp, .. } => {
                let hidden = row(params, &n("self_attention.out_proj.weight"));
                let out_bound = 1.0 / (hidden as f32).sqrt();
                set(
                    params,
                    rng,
                    n("self_attention.in_proj_weight"),
                    xavier(hidden, 3 * hidden),
                );
                set(params, rng, n("self_attention.in_proj_bias"), zero());
                set(
                    params,
                    rng,
                    n("self_attention.out_proj.weight"),
                    uniform(out_bound),
                );
                set(params, rng, n("self_attention.out_proj.bias"), zero());
                set(params, rng, n("mlp.0.weight"), xavier(hidden, mlp));
                set(params, rng, n("mlp.0.bias"), normal(1e-6));
                set(params, rng, n("mlp.3.weight"), xavier(mlp, hidden));
                set(params, rng, n("mlp.3.bias"), normal(1e-6));
            }
            LayerSpec::ClassToken => after_class = true,
            LayerSpec::Linear { .. } if after_class => {
                set(params, rng, n("weight"), zero());
                set(params, rng, n("bias"), zero());
            }
            _ => {}
        }
    }
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
