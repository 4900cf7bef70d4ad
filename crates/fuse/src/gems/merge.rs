//! Deep GEMS: hidden neurons of all learners, each with its ball, merged where balls of
//! different learners intersect; the others are kept as they are.

use rand::{Rng, RngExt};

use super::{Ball, IntersectConfig, intersect_balls};

/// A hidden neuron (incoming weights then bias) of one learner, with its good-enough ball.
#[derive(Clone, Debug, PartialEq)]
pub struct NeuronBall {
    /// Which learner it comes from.
    pub learner: usize,
    /// Its ball (centre = `[w; b]`).
    pub ball: Ball,
}

/// A unit of the fused layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedUnit {
    /// Indices (into the input slice) of the neurons it stands for, ascending.
    pub members: Vec<usize>,
    /// Its parameters: the intersection point, or the single member's centre.
    pub weights: Vec<f32>,
}

/// Lloyd's k-means with k-means++ seeding on `points` (`n x dim`, row-major); returns each
/// point's cluster. `k` is capped at `n`.
pub fn kmeans<R: Rng + ?Sized>(
    points: &[f32],
    dim: usize,
    k: usize,
    iters: usize,
    rng: &mut R,
) -> Vec<usize> {
    let n = points.len().checked_div(dim).unwrap_or(0);
    let k = k.min(n).max(1);
    if n == 0 {
        return Vec::new();
    }
    let row = |i: usize| &points[i * dim..(i + 1) * dim];
    let sq = |a: &[f32], b: &[f32]| -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum()
    };
    // k-means++: each next centre with probability proportional to its squared distance.
    let mut centres: Vec<Vec<f32>> = vec![row(rng.random_range(0..n)).to_vec()];
    let mut nearest: Vec<f64> = (0..n).map(|i| sq(row(i), &centres[0])).collect();
    while centres.len() < k {
        let total: f64 = nearest.iter().sum();
        let pick = if total > 0.0 {
            let mut u = rng.random::<f64>() * total;
            nearest
                .iter()
                .position(|&d| {
                    u -= d;
                    u <= 0.0
                })
                .unwrap_or(n - 1)
        } else {
            rng.random_range(0..n)
        };
        centres.push(row(pick).to_vec());
        let c = centres.len() - 1;
        for (i, d) in nearest.iter_mut().enumerate() {
            *d = d.min(sq(row(i), &centres[c]));
        }
    }
    let mut labels = vec![0usize; n];
    for _ in 0..iters.max(1) {
        let mut changed = false;
        for (i, label) in labels.iter_mut().enumerate() {
            let best = (0..k)
                .map(|c| (c, sq(row(i), &centres[c])))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(c, _)| c);
            changed |= best != *label;
            *label = best;
        }
        let mut sums = vec![vec![0f64; dim]; k];
        let mut counts = vec![0usize; k];
        for (i, &c) in labels.iter().enumerate() {
            counts[c] += 1;
            for (s, &x) in sums[c].iter_mut().zip(row(i)) {
                *s += f64::from(x);
            }
        }
        for c in 0..k {
            if counts[c] > 0 {
                for (m, s) in centres[c].iter_mut().zip(&sums[c]) {
                    *m = (*s / counts[c] as f64) as f32;
                }
            }
        }
        if !changed {
            break;
        }
    }
    labels
}

/// Fuses one hidden layer: neurons of different learners whose balls intersect are merged at a
/// point inside all their balls; every other neuron is kept.
///
/// Candidate pairs are taken most-overlapping first (`||c_i - c_j|| / (R_i + R_j)` ascending);
/// two groups join when they share no learner and every cross pair intersects (a group holds
/// at most one neuron per learner, so a learner's own units are never collapsed into one).
/// Each group's point comes from the K-ball program; a group the program cannot satisfy
/// (pairwise-intersecting balls need not share a point) is kept as separate neurons.
/// With `clusters > 0` only neurons in the same k-means cluster are paired, as in the authors'
/// code (k = 75); 0 pairs across the whole layer.
pub fn merge_neurons<R: Rng + ?Sized>(
    neurons: &[NeuronBall],
    clusters: usize,
    cfg: &IntersectConfig,
    rng: &mut R,
) -> Vec<MergedUnit> {
    let n = neurons.len();
    let dim = neurons.first().map_or(0, |u| u.ball.centre.len());
    let labels = if clusters > 0 && dim > 0 {
        let flat: Vec<f32> = neurons
            .iter()
            .flat_map(|u| u.ball.centre.iter().copied())
            .collect();
        kmeans(&flat, dim, clusters, 50, rng)
    } else {
        vec![0; n]
    };
    let mut pairs: Vec<(f64, usize, usize)> = Vec::new();
    let mut meets = vec![false; n * n];
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = (&neurons[i], &neurons[j]);
            if a.learner == b.learner || labels[i] != labels[j] {
                continue;
            }
            let sum = a.ball.radius + b.ball.radius;
            let d = a.ball.distance(&b.ball.centre);
            if d <= sum && sum > 0.0 {
                meets[i * n + j] = true;
                meets[j * n + i] = true;
                pairs.push((d / sum, i, j));
            }
        }
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    let mut group_of: Vec<usize> = (0..n).collect();
    let mut groups: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    for (_, i, j) in pairs {
        let (gi, gj) = (group_of[i], group_of[j]);
        if gi == gj {
            continue;
        }
        let compatible = groups[gi].iter().all(|&a| {
            groups[gj]
                .iter()
                .all(|&b| neurons[a].learner != neurons[b].learner && meets[a * n + b])
        });
        if !compatible {
            continue;
        }
        let moved = std::mem::take(&mut groups[gj]);
        for &m in &moved {
            group_of[m] = gi;
        }
        groups[gi].extend(moved);
    }
    let mut units = Vec::new();
    for mut members in groups.into_iter().filter(|g| !g.is_empty()) {
        members.sort_unstable();
        if members.len() == 1 {
            units.push(MergedUnit {
                weights: neurons[members[0]].ball.centre.clone(),
                members,
            });
            continue;
        }
        let balls: Vec<&Ball> = members.iter().map(|&m| &neurons[m].ball).collect();
        match intersect_balls(&balls, cfg) {
            Ok(weights) => units.push(MergedUnit { members, weights }),
            Err(_) => units.extend(members.into_iter().map(|m| MergedUnit {
                weights: neurons[m].ball.centre.clone(),
                members: vec![m],
            })),
        }
    }
    units.sort_by_key(|u| u.members[0]);
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn neuron(learner: usize, c: [f32; 2], r: f64) -> NeuronBall {
        NeuronBall {
            learner,
            ball: Ball::sphere(c.to_vec(), r),
        }
    }

    #[test]
    fn intersecting_neurons_of_different_learners_merge() {
        let neurons = vec![
            neuron(0, [0.0, 0.0], 1.0),
            neuron(0, [0.5, 0.0], 1.0), // same learner as 0: never merged with it
            neuron(1, [1.5, 0.0], 1.0),
            neuron(1, [10.0, 10.0], 1.0), // far from everything
        ];
        let mut rng = StdRng::seed_from_u64(0);
        let units = merge_neurons(&neurons, 0, &IntersectConfig::default(), &mut rng);
        // 1 and 2 overlap most (d/sum = 0.5), so they merge; 0 stays alone.
        let members: Vec<Vec<usize>> = units.iter().map(|u| u.members.clone()).collect();
        assert_eq!(members, vec![vec![0], vec![1, 2], vec![3]]);
        let merged = &units[1].weights;
        assert!(neurons[1].ball.contains(merged, 1e-6) && neurons[2].ball.contains(merged, 1e-6));
    }

    #[test]
    fn kmeans_separates_two_blobs() {
        let pts = [0.0f32, 0.1, 0.2, 10.0, 10.1, 10.2];
        let mut rng = StdRng::seed_from_u64(3);
        let labels = kmeans(&pts, 1, 2, 20, &mut rng);
        assert_eq!(labels[0], labels[1]);
        assert_eq!(labels[1], labels[2]);
        assert_ne!(labels[0], labels[3]);
        assert_eq!(labels[3], labels[5]);
    }
}
