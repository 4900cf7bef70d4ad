use fedfuse_core::{ModelSpec, Params};
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

/// Fresh parameters for `spec`, drawn from a generator seeded with `seed`.
pub fn init_params(spec: &ModelSpec, init: Init, seed: u64) -> Params {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params = Params::zeros(&spec.param_shapes());
    // fan_in of a layer is its weight's row length; biases take their weight's fan_in.
    let mut fan_in = 1usize;
    for (name, t) in params.iter_mut() {
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
