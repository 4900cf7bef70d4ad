//! GEMS, good-enough model spaces (Guha & Smith, arXiv 1805.07782): each learner approximates
//! the set of models that are good enough on its validation data by a ball around its own
//! model; the server picks a point in the intersection of the learners' balls.
//!
//! Everything here is plain maths on f32 slices: the ball, the radius search ([`search_radius`]:
//! the authors' bisection or the paper's increasing radius), surface sampling (spheres or
//! Fisher-weighted ellipsoids, optionally on a subset of coordinates), the intersection of two
//! balls in closed form and of K balls by minimising `sum_k max(0, ||theta - c_k|| - R_k)`
//! ([`intersect_balls`]), neuron-wise merging for deep GEMS ([`merge_neurons`]) and the
//! good-enough criteria a learner evaluates on its validation split ([`dense`]).

pub mod dense;
mod merge;

pub use merge::{MergedUnit, NeuronBall, kmeans, merge_neurons};

use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::{FuseError, Result};

/// A learner's good-enough region: `{theta : sum_i (w_i (theta_i - c_i))^2 <= R^2}`.
///
/// `axes` are the per-coordinate weights `w_i` (inverse axis scales): `None` is a sphere
/// (`w_i = 1`); a weight of 0 leaves that coordinate free (the Fisher mask's unimportant
/// coordinates).
#[derive(Clone, Debug, PartialEq)]
pub struct Ball {
    /// Centre (the learner's trained parameters).
    pub centre: Vec<f32>,
    /// Radius, in the weighted norm.
    pub radius: f64,
    /// Per-coordinate weights of the norm; `None` for a sphere.
    pub axes: Option<Vec<f32>>,
}

impl Ball {
    /// A sphere.
    pub fn sphere(centre: Vec<f32>, radius: f64) -> Self {
        Self {
            centre,
            radius,
            axes: None,
        }
    }

    /// Weighted distance of `theta` from the centre.
    pub fn distance(&self, theta: &[f32]) -> f64 {
        let sq: f64 = match &self.axes {
            None => theta
                .iter()
                .zip(&self.centre)
                .map(|(&t, &c)| (f64::from(t) - f64::from(c)).powi(2))
                .sum(),
            Some(w) => theta
                .iter()
                .zip(&self.centre)
                .zip(w)
                .map(|((&t, &c), &w)| (f64::from(w) * (f64::from(t) - f64::from(c))).powi(2))
                .sum(),
        };
        sq.sqrt()
    }

    /// Whether `theta` lies in the ball, allowing a relative slack `rel` for rounding.
    pub fn contains(&self, theta: &[f32], rel: f64) -> bool {
        self.distance(theta) <= self.radius * (1.0 + rel) + 1e-9
    }
}

/// How a learner finds its radius: all `samples` points drawn on the sphere of radius `R` must
/// be good enough.
#[derive(Clone, Debug, PartialEq)]
pub enum RadiusSearch {
    /// The authors' code: bisection on `[0, r_max]` until the bracket is narrower than `tol`.
    Bisection {
        /// Upper end of the bracket (the code's 4000).
        r_max: f64,
        /// Bracket width at which the search stops (the code's 0.01 for spheres, 1.0 for
        /// neurons).
        tol: f64,
    },
    /// The paper's procedure: grow `R` by `step` until a sample fails (or `r_max`).
    Increasing {
        /// Increment (the code's remnant `delta = 0.5`).
        step: f64,
        /// Largest radius tried.
        r_max: f64,
    },
}

impl RadiusSearch {
    /// Checks the numbers once.
    pub fn check(&self) -> Result<()> {
        let (a, b, names) = match *self {
            Self::Bisection { r_max, tol } => (r_max, tol, ("r_max", "tol")),
            Self::Increasing { step, r_max } => (r_max, step, ("r_max", "step")),
        };
        for (v, field) in [(a, names.0), (b, names.1)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(FuseError::InvalidSetting {
                    field,
                    reason: format!("{v} must be a positive number"),
                });
            }
        }
        if let Self::Increasing { step, r_max } = *self
            && r_max / step > 1e6
        {
            return Err(FuseError::InvalidSetting {
                field: "step",
                reason: format!("{step} would take over a million steps to reach r_max {r_max}"),
            });
        }
        Ok(())
    }
}

/// `n` points on the surface `{theta : ||w (theta - c)|| = radius}`, row-major `n x P`.
///
/// Directions are Gaussian with per-coordinate scale `1 / w_i` (the authors' ellipsoid
/// sampling), so a sphere gets uniform directions; free coordinates (`w_i = 0`) stay at the
/// centre.
pub fn surface_points<R: Rng + ?Sized>(
    centre: &[f32],
    axes: Option<&[f32]>,
    radius: f64,
    n: usize,
    rng: &mut R,
) -> Vec<f32> {
    let p = centre.len();
    let mut out = vec![0f32; n * p];
    let mut g = vec![0f64; p];
    for row in out.chunks_exact_mut(p.max(1)).take(n) {
        let mut norm = 0.0f64;
        for (i, gi) in g.iter_mut().enumerate() {
            let w = axes.map_or(1.0, |a| f64::from(a[i]));
            *gi = if w > 0.0 {
                let z: f64 = StandardNormal.sample(rng);
                norm += z * z;
                z / w
            } else {
                0.0
            };
        }
        let scale = if norm > 0.0 {
            radius / norm.sqrt()
        } else {
            0.0
        };
        for ((o, &c), &gi) in row.iter_mut().zip(centre).zip(&g) {
            *o = (f64::from(c) + gi * scale) as f32;
        }
    }
    out
}

/// The largest radius (by `search`) at which `all_good` accepts every one of `samples` surface
/// points; 0 when the centre itself is not good enough.
///
/// `all_good(points, n)` receives `n` candidate parameter vectors row-major and says whether
/// all of them are good enough (batching lets the caller evaluate them as one matrix product).
/// The returned radius was itself tested (the bisection returns the bracket's lower end, not
/// its midpoint as the authors' code does, so every sample at the reported radius passed).
pub fn search_radius<R: Rng + ?Sized>(
    centre: &[f32],
    axes: Option<&[f32]>,
    search: &RadiusSearch,
    samples: usize,
    rng: &mut R,
    mut all_good: impl FnMut(&[f32], usize) -> Result<bool>,
) -> Result<f64> {
    search.check()?;
    if samples == 0 {
        return Err(FuseError::InvalidSetting {
            field: "samples",
            reason: "0; at least one surface sample is needed per radius (the code uses 500)"
                .into(),
        });
    }
    if !all_good(centre, 1)? {
        return Ok(0.0);
    }
    let mut test = |r: f64, rng: &mut R| -> Result<bool> {
        let pts = surface_points(centre, axes, r, samples, rng);
        all_good(&pts, samples)
    };
    match *search {
        RadiusSearch::Bisection { r_max, tol } => {
            let (mut lo, mut hi) = (0.0, r_max);
            while hi - lo >= tol {
                let mid = 0.5 * (lo + hi);
                if test(mid, rng)? {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            Ok(lo)
        }
        RadiusSearch::Increasing { step, r_max } => {
            let mut r = 0.0;
            while r + step <= r_max && test(r + step, rng)? {
                r += step;
            }
            Ok(r)
        }
    }
}

/// Settings of the K-ball program.
#[derive(Clone, Debug, PartialEq)]
pub struct IntersectConfig {
    /// Most descent steps.
    pub steps: usize,
    /// The program aims at balls shrunk by this fraction, so that the point it returns lies
    /// strictly inside the real ones despite rounding.
    pub margin: f64,
}

impl Default for IntersectConfig {
    fn default() -> Self {
        Self {
            steps: 5000,
            margin: 1e-3,
        }
    }
}

/// The authors' point for two intersecting spheres, `(R2 c1 + R1 c2) / (R1 + R2)`: on the
/// segment between the centres, at distance `R1 d / (R1 + R2) <= R1` from `c1` (and likewise
/// from `c2`). `None` when `||c1 - c2|| > R1 + R2`.
pub fn two_ball_point(a: &Ball, b: &Ball) -> Option<Vec<f32>> {
    let d = a.distance(&b.centre);
    let sum = a.radius + b.radius;
    if d > sum || sum <= 0.0 {
        return (d == 0.0).then(|| a.centre.clone());
    }
    let (wa, wb) = (b.radius / sum, a.radius / sum);
    Some(
        a.centre
            .iter()
            .zip(&b.centre)
            .map(|(&x, &y)| (wa * f64::from(x) + wb * f64::from(y)) as f32)
            .collect(),
    )
}

/// Objective `sum_k max(0, d_k(theta) - r_k)` and, when `grad` is given, a subgradient.
fn hinge_sum(balls: &[&Ball], radii: &[f64], theta: &[f32], grad: Option<&mut [f64]>) -> f64 {
    violations(balls, radii, theta, grad, false)
}

/// `sum_k v_k` (or `sum_k v_k^2` when `squared`) of the violations `v_k = max(0, d_k - R_k)`,
/// and its gradient in `grad`.
fn violations(
    balls: &[&Ball],
    radii: &[f64],
    theta: &[f32],
    grad: Option<&mut [f64]>,
    squared: bool,
) -> f64 {
    let mut total = 0.0;
    let mut grad = grad;
    if let Some(g) = grad.as_deref_mut() {
        g.fill(0.0);
    }
    for (ball, &r) in balls.iter().zip(radii) {
        let d = ball.distance(theta);
        if d <= r {
            continue;
        }
        let v = d - r;
        total += if squared { v * v } else { v };
        let scale = if squared { 2.0 * v / d } else { 1.0 / d };
        if let Some(g) = grad.as_deref_mut() {
            for (i, gi) in g.iter_mut().enumerate() {
                let w = ball.axes.as_ref().map_or(1.0, |a| f64::from(a[i]));
                *gi += w * w * (f64::from(theta[i]) - f64::from(ball.centre[i])) * scale;
            }
        }
    }
    total
}

/// Descends `violations` from `theta` with an adaptive step, for at most `steps` steps.
fn descend(balls: &[&Ball], radii: &[f64], theta: &mut Vec<f32>, steps: usize, squared: bool) {
    let k = balls.len() as f64;
    let mut grad = vec![0f64; theta.len()];
    let mut f = violations(balls, radii, theta, Some(&mut grad), squared);
    let mut step = (radii.iter().sum::<f64>() / k).max(1e-3) * 0.1;
    let mut trial = vec![0f32; theta.len()];
    for _ in 0..steps {
        if f <= 0.0 || step < 1e-12 {
            break;
        }
        for ((t, &x), &g) in trial.iter_mut().zip(theta.iter()).zip(&grad) {
            *t = (f64::from(x) - step * g) as f32;
        }
        let ft = violations(balls, radii, &trial, None, squared);
        if ft < f {
            std::mem::swap(theta, &mut trial);
            f = violations(balls, radii, theta, Some(&mut grad), squared);
            step *= 1.5;
        } else {
            step *= 0.5;
        }
    }
}

/// A point in every ball: the closed form for two spheres, otherwise the minimiser of
/// `sum_k max(0, ||w_k (theta - c_k)|| - R_k)` by descent from the mean of the centres (the
/// authors' K-ball program, with a step size that adapts instead of their fixed 0.01); where
/// that stalls at a kink outside some ball, descent on the squared violations goes on from
/// there.
///
/// Errors with [`FuseError::NoIntersection`] when the program ends outside some ball.
pub fn intersect_balls(balls: &[&Ball], cfg: &IntersectConfig) -> Result<Vec<f32>> {
    let Some(first) = balls.first() else {
        return Err(FuseError::Empty);
    };
    let p = first.centre.len();
    if let Some(bad) = balls.iter().position(|b| {
        b.centre.len() != p
            || b.axes.as_ref().is_some_and(|a| a.len() != p)
            || !(b.radius.is_finite() && b.radius >= 0.0)
    }) {
        return Err(FuseError::InvalidInput(format!(
            "ball {bad}: centre of {} values (expected {p}) or radius {} not a finite non-negative number",
            balls[bad].centre.len(),
            balls[bad].radius
        )));
    }
    let inside_all = |t: &[f32]| balls.iter().all(|b| b.contains(t, 1e-6));
    if balls.len() == 1 {
        return Ok(first.centre.clone());
    }
    if balls.len() == 2
        && balls.iter().all(|b| b.axes.is_none())
        && let Some(point) = two_ball_point(balls[0], balls[1])
        && inside_all(&point)
    {
        return Ok(point);
    }
    let k = balls.len() as f64;
    let mut theta: Vec<f32> = (0..p)
        .map(|i| (balls.iter().map(|b| f64::from(b.centre[i])).sum::<f64>() / k) as f32)
        .collect();
    let radii: Vec<f64> = balls
        .iter()
        .map(|b| b.radius * (1.0 - cfg.margin))
        .collect();
    descend(balls, &radii, &mut theta, cfg.steps, false);
    if !inside_all(&theta) {
        // The sum of hinges has kinks where its subgradient is no descent direction (a small
        // intersection of many balls); their squares are smooth, so descent on them goes on.
        descend(balls, &radii, &mut theta, cfg.steps, true);
    }
    if inside_all(&theta) {
        Ok(theta)
    } else {
        let radii: Vec<f64> = balls.iter().map(|b| b.radius).collect();
        Err(FuseError::NoIntersection {
            balls: balls.len(),
            violation: hinge_sum(balls, &radii, &theta, None),
        })
    }
}

/// Per-coordinate weights of the authors' Fisher ellipsoid: axis scale
/// `sigma_i = 1 / (|F_i| + 1e-5)`, divided by its maximum and floored at 0.1; weight
/// `1 / sigma_i`. With `keep < 1` only the top `keep` fraction of coordinates by Fisher value
/// is constrained (the others get weight 0, i.e. free), as the code's `fisher_prop` does; with
/// `ellipsoid = false` the constrained coordinates get weight 1 (a sphere in that subspace).
pub fn fisher_axes(fisher: &[f32], keep: f64, ellipsoid: bool) -> Result<Vec<f32>> {
    if !(keep > 0.0 && keep <= 1.0) {
        return Err(FuseError::InvalidSetting {
            field: "fisher_prop",
            reason: format!("{keep}; the kept fraction of coordinates must lie in (0, 1]"),
        });
    }
    if let Some(i) = fisher.iter().position(|f| !f.is_finite()) {
        return Err(FuseError::InvalidInput(format!(
            "Fisher value {i} is {}; the model or its data has non-finite values",
            fisher[i]
        )));
    }
    let mut sorted: Vec<f32> = fisher.iter().map(|f| f.abs()).collect();
    sorted.sort_by(f32::total_cmp);
    let cut = if keep >= 1.0 || sorted.is_empty() {
        f32::NEG_INFINITY
    } else {
        let idx = ((1.0 - keep) * sorted.len() as f64).floor() as usize;
        sorted[idx.min(sorted.len() - 1)]
    };
    let sigma: Vec<f64> = fisher
        .iter()
        .map(|f| 1.0 / (f64::from(f.abs()) + 1e-5))
        .collect();
    let max = sigma
        .iter()
        .copied()
        .fold(0.0f64, f64::max)
        .max(f64::MIN_POSITIVE);
    Ok(fisher
        .iter()
        .zip(&sigma)
        .map(|(f, s)| {
            if f.abs() < cut {
                0.0
            } else if ellipsoid {
                (1.0 / (s / max).max(0.1)) as f32
            } else {
                1.0
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn surface_points_lie_on_the_surface() {
        let mut rng = StdRng::seed_from_u64(1);
        let c = vec![1.0f32, -2.0, 0.5];
        for axes in [None, Some(vec![2.0f32, 0.5, 0.0])] {
            let pts = surface_points(&c, axes.as_deref(), 3.0, 20, &mut rng);
            let ball = Ball {
                centre: c.clone(),
                radius: 3.0,
                axes: axes.clone(),
            };
            for p in pts.chunks(3) {
                assert!((ball.distance(p) - 3.0).abs() < 1e-5);
                if axes.is_some() {
                    assert_eq!(p[2], 0.5, "free coordinates stay at the centre");
                }
            }
        }
    }

    #[test]
    fn two_ball_point_is_the_radius_weighted_point() {
        let a = Ball::sphere(vec![0.0, 0.0], 1.0);
        let b = Ball::sphere(vec![3.0, 0.0], 2.0);
        // (R2 c1 + R1 c2) / (R1 + R2) = (2*0 + 1*3) / 3 = 1.
        assert_eq!(two_ball_point(&a, &b), Some(vec![1.0, 0.0]));
        let far = Ball::sphere(vec![3.5, 0.0], 2.0);
        assert_eq!(two_ball_point(&a, &far), None);
    }

    #[test]
    fn fisher_axes_floor_and_mask() {
        let f = [10.0f32, 1.0, 0.0, 5.0];
        let w = fisher_axes(&f, 1.0, true).expect("valid");
        // sigma = 1/(F+1e-5), divided by the max (F = 0), floored at 0.1 -> weight <= 10.
        assert!((w[2] - 1.0).abs() < 1e-6);
        assert!((w[0] - 10.0).abs() < 1e-6);
        let half = fisher_axes(&f, 0.5, false).expect("valid");
        assert_eq!(half, vec![1.0, 0.0, 0.0, 1.0]);
    }
}
