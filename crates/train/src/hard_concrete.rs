//! The hard-concrete relaxation of Bernoulli gates (Louizos, Welling & Kingma 2018), in plain
//! f64; training uses the same formulas on tensors.
//!
//! A gate is parameterised by the logit of its probability of being on, `logit(pi)`.
//! [`log_alpha`] turns it into the relaxation's location so that `P(z > 0) = pi` exactly;
//! FedSparse's eq. 41 then uses `pi` itself for `R(z > 0)`.

/// Lower end of the stretched interval.
pub const GAMMA: f64 = -0.1;
/// Upper end of the stretched interval.
pub const ZETA: f64 = 1.1;
/// Temperature of the relaxation.
pub const BETA: f64 = 2.0 / 3.0;
/// Uniform noise is drawn from `[EPS, 1 - EPS]` so that its logit stays finite.
pub const EPS: f64 = 1e-6;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `beta * ln(-gamma / zeta)`: the shift between `log alpha` and `logit P(z > 0)`.
pub fn shift() -> f64 {
    BETA * (-GAMMA / ZETA).ln()
}

/// The `log alpha` whose gate is non-zero with probability `sigmoid(logit_pi)`.
pub fn log_alpha(logit_pi: f64) -> f64 {
    logit_pi + shift()
}

/// `P(z > 0) = sigmoid(log alpha - beta ln(-gamma / zeta))`.
pub fn prob_nonzero(log_alpha: f64) -> f64 {
    sigmoid(log_alpha - shift())
}

/// The logistic noise `ln u - ln(1 - u)` of a uniform draw `u`, clamped to `[EPS, 1 - EPS]`.
pub fn logistic_noise(u: f64) -> f64 {
    let u = u.clamp(EPS, 1.0 - EPS);
    u.ln() - (1.0 - u).ln()
}

/// A gate in [0, 1] from uniform `u`: `clamp(sigmoid((noise(u) + log alpha) / beta) *
/// (zeta - gamma) + gamma, 0, 1)`.
pub fn sample(log_alpha: f64, u: f64) -> f64 {
    let s = sigmoid((logistic_noise(u) + log_alpha) / BETA);
    (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)
}

/// A hard 0/1 gate from uniform `u`, the zero-temperature sample used before upload:
/// `noise(u) + logit(pi) > 0`, i.e. a Bernoulli(pi) draw. The limit `beta -> 0` is taken with
/// the location `logit(pi)` rather than `log alpha`, so that the upload is distributed as
/// `q_pi(z)` (the paper's Algorithm 2) rather than as `Bernoulli(sigmoid(log alpha))`.
pub fn sample_hard(logit_pi: f64, u: f64) -> bool {
    logistic_noise(u) + logit_pi > 0.0
}
