//! Differential privacy over plain parameters, with Flower's semantics
//! (`flwr.supercore.differential_privacy`): flat L2 clipping of a model update over all its
//! tensors (McMahan et al. 2018), Gaussian noise, the geometric clipping-norm update of Andrew
//! et al. (2021), and an RDP accountant for the sampled Gaussian mechanism (Mironov, Talwar &
//! Zhang 2019) with the (ε, δ) conversion of Canonne, Kamath & Steinke (2020), on the order grid
//! of Google's `dp-accounting` (the backend of Flower's own accountant).

use fedfuse_core::Params;
use rand::Rng;
use rand_distr::{Distribution, Normal};

use crate::{FuseError, Result};

/// L2 norm of `model - global` over all tensors, in f64.
pub fn update_norm(global: &Params, model: &Params) -> Result<f64> {
    model.check_layout(&global.layout())?;
    let mut sq = 0f64;
    for ((_, g), (_, m)) in global.iter().zip(model.iter()) {
        for (a, b) in g.data.iter().zip(&m.data) {
            let d = f64::from(*b - *a);
            sq += d * d;
        }
    }
    Ok(sq.sqrt())
}

/// Scales the update `model - global` by `min(1, clipping_norm / ||model - global||)` in place
/// (Flower's `compute_clip_model_update`: the update in f32, the factor from its norm). Returns
/// whether it was scaled down, the "norm bit" of adaptive clipping. A zero update stays as it
/// is.
pub fn clip_update(global: &Params, model: &mut Params, clipping_norm: f64) -> Result<bool> {
    let norm = update_norm(global, model)?;
    if norm <= clipping_norm {
        return Ok(false);
    }
    let scale = (clipping_norm / norm) as f32;
    for ((_, g), (_, m)) in global.iter().zip(model.iter_mut()) {
        for (a, b) in g.data.iter().zip(m.data.iter_mut()) {
            *b = *a + (*b - *a) * scale;
        }
    }
    Ok(true)
}

/// A running sum of clipped updates `model - global`, for central DP: each added update is
/// scaled to norm at most `clipping_norm`, and the result divides by a fixed denominator (the
/// clients sampled) so that one client moves it by at most `clipping_norm / sampled`.
#[derive(Clone, Debug)]
pub struct ClippedSum {
    sums: Vec<Vec<f64>>,
    clipping_norm: f64,
    clipped: usize,
    count: usize,
}

impl ClippedSum {
    /// An empty sum of updates of `global`'s layout, clipped to `clipping_norm`.
    pub fn new(global: &Params, clipping_norm: f64) -> Self {
        Self {
            sums: global
                .iter()
                .map(|(_, t)| vec![0f64; t.data.len()])
                .collect(),
            clipping_norm,
            clipped: 0,
            count: 0,
        }
    }

    /// Adds the clipped update of `model` from `global`; returns whether it was scaled down.
    pub fn add(&mut self, global: &Params, model: &Params) -> Result<bool> {
        let norm = update_norm(global, model)?;
        let clipped = norm > self.clipping_norm;
        let scale = if clipped {
            self.clipping_norm / norm
        } else {
            1.0
        };
        for (sum, ((_, g), (_, m))) in self.sums.iter_mut().zip(global.iter().zip(model.iter())) {
            for (s, (a, b)) in sum.iter_mut().zip(g.data.iter().zip(&m.data)) {
                *s += scale * f64::from(*b - *a);
            }
        }
        self.clipped += usize::from(clipped);
        self.count += 1;
        Ok(clipped)
    }

    /// Updates added so far, and how many of them were scaled down.
    pub fn counts(&self) -> (usize, usize) {
        (self.count, self.clipped)
    }

    /// `global + sum / denominator` (a denominator below 1 counts as 1).
    pub fn step(&self, global: &Params, denominator: f64) -> Result<Params> {
        if self.count == 0 {
            return Err(FuseError::Empty);
        }
        let mut out = global.clone();
        let d = denominator.max(1.0);
        for (sum, (_, t)) in self.sums.iter().zip(out.iter_mut()) {
            for (x, s) in t.data.iter_mut().zip(sum) {
                *x = (f64::from(*x) + s / d) as f32;
            }
        }
        Ok(out)
    }
}

/// Adds independent `N(0, std^2)` noise to every value (Flower's `add_gaussian_noise_inplace`).
pub fn add_gaussian_noise(params: &mut Params, std: f64, rng: &mut impl Rng) -> Result<()> {
    if std == 0.0 {
        return Ok(());
    }
    let normal = Normal::new(0.0, std).map_err(|e| FuseError::InvalidSetting {
        field: "noise",
        reason: format!("standard deviation {std}: {e}"),
    })?;
    for (_, t) in params.iter_mut() {
        for x in &mut t.data {
            *x += normal.sample(rng) as f32;
        }
    }
    Ok(())
}

/// `count + N(0, std^2)`: adaptive clipping's privatised count of clipped updates (noising
/// the clipped or the unclipped count is the same mechanism).
pub fn noisy_count(count: usize, std: f64, rng: &mut impl Rng) -> Result<f64> {
    if std == 0.0 {
        return Ok(count as f64);
    }
    let normal = Normal::new(count as f64, std).map_err(|e| FuseError::InvalidSetting {
        field: "clipped_count_stddev",
        reason: format!("{std}: {e}"),
    })?;
    Ok(normal.sample(rng))
}

/// Standard deviation of central noise on a sum of updates clipped to `clipping_norm` and
/// divided by `denominator` (the clients sampled, or expected under Poisson sampling; Flower's
/// `compute_stdv`): `z * C / m`.
pub fn central_noise_std(noise_multiplier: f64, clipping_norm: f64, denominator: f64) -> f64 {
    noise_multiplier * clipping_norm / denominator.max(1.0)
}

/// Standard deviation of the classical Gaussian mechanism for `(epsilon, delta)` at the given
/// L2 `sensitivity` (Flower's `LocalDpMod`): `sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`.
pub fn gaussian_mechanism_std(sensitivity: f64, epsilon: f64, delta: f64) -> f64 {
    sensitivity * (2.0 * (1.25 / delta).ln()).sqrt() / epsilon
}

/// Adaptive clipping's split of the noise (Andrew et al. 2021, Flower's
/// `compute_adaptive_noise_params`): the clipped-count noise `sigma_b` (default `m / 20`) takes
/// part of the privacy budget of noise multiplier `z`, and the model's own noise multiplier
/// becomes `(z^-2 - (2 sigma_b)^-2)^-1/2`. Returns `(sigma_b, z_model)`.
pub fn adaptive_noise_split(
    noise_multiplier: f64,
    sampled: f64,
    clipped_count_stddev: Option<f64>,
) -> Result<(f64, f64)> {
    if noise_multiplier == 0.0 {
        return Ok((clipped_count_stddev.unwrap_or(0.0), 0.0));
    }
    let sigma_b = clipped_count_stddev.unwrap_or(sampled / 20.0);
    if noise_multiplier >= 2.0 * sigma_b {
        return Err(FuseError::InvalidSetting {
            field: "clipped_count_stddev",
            reason: format!(
                "{sigma_b} (default: clients per round / 20) leaves no budget for noise \
                 multiplier {noise_multiplier}: it must exceed noise_multiplier / 2; raise it, \
                 sample more clients per round, or lower noise_multiplier"
            ),
        });
    }
    let z = (noise_multiplier.powi(-2) - (2.0 * sigma_b).powi(-2)).powf(-0.5);
    Ok((sigma_b, z))
}

/// The geometric update of the clipping norm towards the `target` quantile of update norms
/// (Andrew et al. 2021): `C * exp(-lr * (unclipped_fraction - target))`. More updates inside
/// the ball than the target shrink it, fewer grow it.
///
/// Flower 1.41's wrappers feed the *clipped* fraction into the same formula, which moves `C`
/// away from the quantile (all updates clipped shrinks `C` further); fedfuse follows the
/// paper.
pub fn geometric_clip_update(
    clipping_norm: f64,
    lr: f64,
    unclipped_fraction: f64,
    target: f64,
) -> f64 {
    clipping_norm * (-lr * (unclipped_fraction - target)).exp()
}

/// The RDP orders `dp-accounting` uses by default: 1.1 to 10.9 by 0.1, 11 to 63, 128 to 1024.
pub fn default_rdp_orders() -> Vec<f64> {
    (1..100)
        .map(|x| 1.0 + f64::from(x) / 10.0)
        .chain((11..64).map(f64::from))
        .chain([128.0, 256.0, 512.0, 1024.0])
        .collect()
}

/// Privacy spent: `epsilon` at the accountant's `delta`, and the RDP order that gave it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrivacySpent {
    /// ε (infinite without noise).
    pub epsilon: f64,
    /// The order of the tightest bound.
    pub order: f64,
}

/// Composes Poisson-sampled Gaussian releases in Rényi DP.
#[derive(Clone, Debug)]
pub struct RdpAccountant {
    orders: Vec<f64>,
    rdp: Vec<f64>,
}

impl Default for RdpAccountant {
    fn default() -> Self {
        Self::new(default_rdp_orders())
    }
}

impl RdpAccountant {
    /// An accountant over `orders` (each above 1).
    pub fn new(orders: Vec<f64>) -> Self {
        let rdp = vec![0.0; orders.len()];
        Self { orders, rdp }
    }

    /// Adds `steps` releases of the Gaussian mechanism with `noise_multiplier` on a Poisson
    /// sample of rate `q` (`q = 1`: no amplification).
    pub fn compose(&mut self, q: f64, noise_multiplier: f64, steps: usize) {
        for (r, &a) in self.rdp.iter_mut().zip(&self.orders) {
            *r += steps as f64 * rdp_sampled_gaussian(q, noise_multiplier, a);
        }
    }

    /// ε at `delta` of everything composed, minimised over the orders.
    pub fn epsilon(&self, delta: f64) -> PrivacySpent {
        rdp_to_epsilon(&self.orders, &self.rdp, delta)
    }
}

/// RDP at order `alpha` of the Gaussian mechanism with `noise_multiplier` on a Poisson sample
/// of rate `q`.
pub fn rdp_sampled_gaussian(q: f64, noise_multiplier: f64, alpha: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if alpha.is_infinite() || noise_multiplier == 0.0 {
        return f64::INFINITY;
    }
    if q == 1.0 {
        return alpha / (2.0 * noise_multiplier * noise_multiplier);
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_int(q, noise_multiplier, alpha as u64)
    } else {
        log_a_frac(q, noise_multiplier, alpha)
    };
    log_a / (alpha - 1.0)
}

/// Tightest ε at `delta` over the orders (Canonne, Kamath & Steinke 2020, Prop. 12):
/// `rdp + ln(1 - 1/a) - ln(delta * a) / (a - 1)`, with ε = 0 where the KL bound already gives
/// `delta`.
pub fn rdp_to_epsilon(orders: &[f64], rdp: &[f64], delta: f64) -> PrivacySpent {
    let mut best = PrivacySpent {
        epsilon: f64::INFINITY,
        order: orders.first().copied().unwrap_or(f64::NAN),
    };
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = if r < 0.0 || delta * delta + (-r).exp_m1() > 0.0 {
            0.0
        } else if a > 1.01 {
            r + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0)
        } else {
            f64::INFINITY
        };
        if eps < best.epsilon {
            best = PrivacySpent {
                epsilon: eps,
                order: a,
            };
        }
    }
    best.epsilon = best.epsilon.max(0.0);
    best
}

fn log_add(x: f64, y: f64) -> f64 {
    let (lo, hi) = if x < y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    (lo - hi).exp().ln_1p() + hi
}

/// `ln |C(n, k)|` through log-gamma, for real `n`.
fn log_comb(n: f64, k: f64) -> f64 {
    libm::lgamma(n + 1.0) - libm::lgamma(k + 1.0) - libm::lgamma(n - k + 1.0)
}

/// `ln A_alpha` for an integer order (Mironov et al. 2019, Sec. 3.3).
fn log_a_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let log1mq = (-q).ln_1p();
    let mut log_a = f64::NEG_INFINITY;
    for i in 0..=alpha {
        let i = i as f64;
        let a = alpha as f64;
        let coef = log_comb(a, i) + i * q.ln() + (a - i) * log1mq;
        log_a = log_add(log_a, coef + (i * i - i) / (2.0 * sigma * sigma));
    }
    log_a
}

/// Terms of the fractional-order series at most; `dp-accounting` drops an order that does not
/// converge by then, and so does this.
const MAX_FRAC_TERMS: usize = 1000;

/// `ln A_alpha` for a fractional order: the two halves of the integral split at `z0`, each a
/// series that stops once both terms fall 30 nats below the total.
fn log_a_frac(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let log1mq = (-q).ln_1p();
    let (mut last0, mut last1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for i in 0..MAX_FRAC_TERMS {
        let i = i as f64;
        let coef = log_comb(alpha, i);
        let j = alpha - i;
        let t0 = coef + i * q.ln() + j * log1mq;
        let t1 = coef + j * q.ln() + i * log1mq;
        let e0 = 0.5f64.ln() + log_erfc((i - z0) / (std::f64::consts::SQRT_2 * sigma));
        let e1 = 0.5f64.ln() + log_erfc((z0 - j) / (std::f64::consts::SQRT_2 * sigma));
        let s0 = t0 + (i * i - i) / (2.0 * sigma * sigma) + e0;
        let s1 = t1 + (j * j - j) / (2.0 * sigma * sigma) + e1;
        log_a0 = log_add(log_a0, s0);
        log_a1 = log_add(log_a1, s1);
        let total = log_add(log_a0, log_a1);
        if s0 < last0 && s1 < last1 && s0.max(s1) < total - 30.0 {
            return total;
        }
        (last0, last1) = (s0, s1);
    }
    f64::INFINITY
}

/// `ln erfc(x)`, with the asymptotic series where `erfc` underflows.
fn log_erfc(x: f64) -> f64 {
    let r = libm::erfc(x);
    if r > 0.0 {
        return r.ln();
    }
    let x2 = x * x;
    -std::f64::consts::PI.ln() / 2.0 - x.ln() - x2 - 0.5 / x2 + 0.625 / (x2 * x2)
        - 37.0 / 24.0 / (x2 * x2 * x2)
        + 353.0 / 64.0 / (x2 * x2 * x2 * x2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn params(values: &[f32]) -> Params {
        let mut p = Params::new();
        p.push(
            "w",
            vec![values.len() - 1],
            values[..values.len() - 1].to_vec(),
        )
        .unwrap();
        p.push("b", vec![1], vec![values[values.len() - 1]])
            .unwrap();
        p
    }

    #[test]
    fn clipping_scales_the_update_over_all_tensors() {
        let global = params(&[1.0, 1.0, 1.0]);
        // Update (3, 0, 4): norm 5 over both tensors, clipped to 1 -> (0.6, 0, 0.8).
        let mut m = params(&[4.0, 1.0, 5.0]);
        assert!(clip_update(&global, &mut m, 1.0).unwrap());
        let got: Vec<f32> = m.iter().flat_map(|(_, t)| t.data.clone()).collect();
        for (g, w) in got.iter().zip([1.6f32, 1.0, 1.8]) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        // Inside the ball: untouched.
        let mut m = params(&[4.0, 1.0, 5.0]);
        assert!(!clip_update(&global, &mut m, 5.0).unwrap());
        assert_eq!(m, params(&[4.0, 1.0, 5.0]));
        let mut same = global.clone();
        assert!(!clip_update(&global, &mut same, 1.0).unwrap());
    }

    #[test]
    fn clipped_sum_divides_by_the_clients_sampled() {
        let global = params(&[1.0, 1.0, 1.0]);
        let mut sum = ClippedSum::new(&global, 1.0);
        // (3, 0, 4) clipped to (0.6, 0, 0.8); (0, 0.5, 0) kept.
        assert!(sum.add(&global, &params(&[4.0, 1.0, 5.0])).unwrap());
        assert!(!sum.add(&global, &params(&[1.0, 1.5, 1.0])).unwrap());
        assert_eq!(sum.counts(), (2, 1));
        // Three sampled, two replied: global + (0.6, 0.5, 0.8) / 3.
        let got: Vec<f32> = sum
            .step(&global, 3.0)
            .unwrap()
            .iter()
            .flat_map(|(_, t)| t.data.clone())
            .collect();
        for (g, w) in got.iter().zip([1.2f32, 1.0 + 0.5 / 3.0, 1.0 + 0.8 / 3.0]) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
        assert!(ClippedSum::new(&global, 1.0).step(&global, 3.0).is_err());
    }

    #[test]
    fn noise_has_the_requested_spread_and_follows_the_seed() {
        let mut p = Params::new();
        p.push("w", vec![100_000], vec![0.0; 100_000]).unwrap();
        let std = central_noise_std(1.2, 0.5, 10.0);
        assert!((std - 0.06).abs() < 1e-12);
        let mut a = p.clone();
        add_gaussian_noise(&mut a, std, &mut StdRng::seed_from_u64(3)).unwrap();
        let x = &a.get("w").unwrap().data;
        let mean = x.iter().map(|v| f64::from(*v)).sum::<f64>() / x.len() as f64;
        let var = x
            .iter()
            .map(|v| (f64::from(*v) - mean).powi(2))
            .sum::<f64>()
            / x.len() as f64;
        assert!(
            (var.sqrt() / std - 1.0).abs() < 0.03,
            "{} vs {std}",
            var.sqrt()
        );
        let mut b = p.clone();
        add_gaussian_noise(&mut b, std, &mut StdRng::seed_from_u64(3)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn adaptive_split_and_update_by_hand() {
        // z = 1, sigma_b = 10 / 20 = 0.5 is too small (z >= 2 sigma_b).
        assert!(adaptive_noise_split(1.0, 10.0, None).is_err());
        // z = 1, sigma_b = 2: (1 - 1/16)^-1/2 = 1.0327955...
        let (sb, z) = adaptive_noise_split(1.0, 10.0, Some(2.0)).unwrap();
        assert_eq!(sb, 2.0);
        assert!((z - (16.0f64 / 15.0).sqrt()).abs() < 1e-12);
        assert_eq!(adaptive_noise_split(0.0, 10.0, None).unwrap(), (0.0, 0.0));
        // None inside the ball at target 0.5, lr 0.2: C grows to C e^0.1; all inside: shrinks.
        let c = geometric_clip_update(2.0, 0.2, 0.0, 0.5);
        assert!((c - 2.0 * 0.1f64.exp()).abs() < 1e-12);
        assert!(geometric_clip_update(2.0, 0.2, 1.0, 0.5) < 2.0);
    }

    #[test]
    fn accountant_matches_closed_forms() {
        // No sampling: RDP(a) = steps * a / (2 z^2).
        let mut acc = RdpAccountant::new(vec![2.0, 8.0, 32.0]);
        acc.compose(1.0, 2.0, 10);
        assert_eq!(acc.rdp, vec![2.5, 10.0, 40.0]);
        // eps(a = 8) = 10 + ln(7/8) - ln(1e-5 * 8) / 7 = 11.2147...
        let spent = acc.epsilon(1e-5);
        let want = 10.0 + (7.0f64 / 8.0).ln() - (8e-5f64).ln() / 7.0;
        assert_eq!(spent.order, 8.0);
        assert!((spent.epsilon - want).abs() < 1e-12, "{spent:?}");
        // Order 2 of the sampled Gaussian in closed form: A_2 = 1 + q^2 (e^{1/z^2} - 1).
        let (q, z) = (0.01f64, 1.1f64);
        let want = (q * q * ((1.0 / (z * z)).exp() - 1.0)).ln_1p();
        assert!((rdp_sampled_gaussian(q, z, 2.0) - want).abs() < 1e-12);
        // Fractional orders lie between their integer neighbours (RDP grows with the order).
        let r = |a| rdp_sampled_gaussian(q, z, a);
        assert!(
            r(2.0) < r(2.5) && r(2.5) < r(3.0),
            "{} {} {}",
            r(2.0),
            r(2.5),
            r(3.0)
        );
        assert_eq!(rdp_sampled_gaussian(0.0, 1.0, 3.0), 0.0);
        assert_eq!(rdp_sampled_gaussian(0.5, 0.0, 3.0), f64::INFINITY);
        assert_eq!(RdpAccountant::default().epsilon(1e-5).epsilon, 0.0);
    }
}
