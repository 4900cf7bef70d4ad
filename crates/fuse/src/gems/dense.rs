//! What a GEMS learner evaluates on its validation split, as plain matrix products: whether
//! candidate output layers or candidate neurons are good enough, and the diagonal Fisher of a
//! softmax layer.

use fedfuse_core::Params;
use fedfuse_core::linalg::{Mat, matmul};
use rand::{Rng, RngExt};

use crate::{FuseError, Result};

/// A dense layer `[out, in]` (PyTorch layout) and its bias.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    /// Weights, row-major `[out, in]`.
    pub weight: Vec<f32>,
    /// Bias `[out]`.
    pub bias: Vec<f32>,
    /// Output width.
    pub out: usize,
    /// Input width.
    pub inp: usize,
}

impl Layer {
    /// The layer's parameters as one vector per output unit: incoming weights, then bias (a
    /// neuron's GEMS coordinates).
    pub fn unit(&self, j: usize) -> Vec<f32> {
        let mut v = self.weight[j * self.inp..(j + 1) * self.inp].to_vec();
        v.push(self.bias[j]);
        v
    }

    /// Unit `j`'s outgoing weights in `next` (column `j` of its weight matrix): with
    /// [`Layer::unit`], the paper's neuron space "incoming and outgoing weights".
    pub fn outgoing(next: &Layer, j: usize) -> Vec<f32> {
        (0..next.out)
            .map(|k| next.weight[k * next.inp + j])
            .collect()
    }

    /// A layer from per-unit vectors `[w; b]` of length `inp + 1`.
    pub fn from_units(units: &[Vec<f32>], inp: usize) -> Result<Self> {
        let mut weight = Vec::with_capacity(units.len() * inp);
        let mut bias = Vec::with_capacity(units.len());
        for (j, u) in units.iter().enumerate() {
            if u.len() != inp + 1 {
                return Err(FuseError::InvalidInput(format!(
                    "unit {j} has {} values; expected {} weights and a bias",
                    u.len(),
                    inp
                )));
            }
            weight.extend_from_slice(&u[..inp]);
            bias.push(u[inp]);
        }
        Ok(Self {
            weight,
            bias,
            out: units.len(),
            inp,
        })
    }

    /// The layer as one flat vector (weights then bias), the coordinates of a shallow ball.
    pub fn flat(&self) -> Vec<f32> {
        let mut v = self.weight.clone();
        v.extend_from_slice(&self.bias);
        v
    }

    /// A layer of `out x inp` from a flat vector (weights then bias).
    pub fn from_flat(flat: &[f32], out: usize, inp: usize) -> Result<Self> {
        if flat.len() != out * inp + out {
            return Err(FuseError::InvalidInput(format!(
                "{} values for a {out} x {inp} layer with bias (expected {})",
                flat.len(),
                out * inp + out
            )));
        }
        Ok(Self {
            weight: flat[..out * inp].to_vec(),
            bias: flat[out * inp..].to_vec(),
            out,
            inp,
        })
    }

    /// `x W^T + b` for `n` rows of `x`, then ReLU when `relu`.
    pub fn forward(&self, x: &[f32], n: usize, relu: bool) -> Vec<f32> {
        let mut y = matmul_nt(x, &self.weight, n, self.out, self.inp);
        for row in y.chunks_exact_mut(self.out.max(1)) {
            for (v, &b) in row.iter_mut().zip(&self.bias) {
                *v += b;
                if relu && *v < 0.0 {
                    *v = 0.0;
                }
            }
        }
        y
    }
}

/// The layers `layers.0 ..` of an MLP's [`Params`].
pub fn mlp_layers(params: &Params) -> Result<Vec<Layer>> {
    let mut layers: Vec<Layer> = Vec::new();
    let mut i = 0;
    while let Some(w) = params.get(&format!("layers.{i}.weight")) {
        let b = params.get(&format!("layers.{i}.bias")).ok_or_else(|| {
            FuseError::InvalidInput(format!("`layers.{i}.weight` has no `layers.{i}.bias`"))
        })?;
        if w.shape.len() != 2 || b.shape != [w.shape[0]] {
            return Err(FuseError::InvalidInput(format!(
                "layer {i}: weight {:?} and bias {:?} are not [out, in] and [out]",
                w.shape, b.shape
            )));
        }
        if let Some(prev) = layers.last()
            && prev.out != w.shape[1]
        {
            return Err(FuseError::InvalidInput(format!(
                "layer {i} reads {} inputs but layer {} has {} outputs",
                w.shape[1],
                i - 1,
                prev.out
            )));
        }
        layers.push(Layer {
            weight: w.data.clone(),
            bias: b.data.clone(),
            out: w.shape[0],
            inp: w.shape[1],
        });
        i += 1;
    }
    if layers.is_empty() || params.len() != 2 * layers.len() {
        return Err(FuseError::InvalidInput(format!(
            "not an MLP of `layers.{{i}}.weight`/`bias` pairs: {}",
            params.names().join(", ")
        )));
    }
    Ok(layers)
}

/// Back to [`Params`] with PyTorch names.
pub fn layers_to_params(layers: &[Layer]) -> Result<Params> {
    let mut p = Params::new();
    for (i, l) in layers.iter().enumerate() {
        p.push(
            format!("layers.{i}.weight"),
            vec![l.out, l.inp],
            l.weight.clone(),
        )?;
        p.push(format!("layers.{i}.bias"), vec![l.out], l.bias.clone())?;
    }
    Ok(p)
}

/// Runs `layers` (ReLU between them, none after the last) on `n` rows.
pub fn forward(layers: &[Layer], x: &[f32], n: usize) -> Vec<f32> {
    let mut h = x.to_vec();
    for (i, l) in layers.iter().enumerate() {
        h = l.forward(&h, n, i + 1 < layers.len());
    }
    h
}

/// `a (m x k) * b^T` where `b` is `n x k`: `m x n`, row-major.
pub fn matmul_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    let (lhs, rhs) = (Mat::rows(a, m, k, k), Mat::rows(b, n, k, k).t());
    matmul(&mut out, (n, 1), lhs, rhs, false);
    out
}

/// Mean softmax cross-entropy and accuracy of `logits` (`n x c`) against labels `y`.
pub fn softmax_loss_accuracy(logits: &[f32], c: usize, y: &[u32]) -> (f64, f64) {
    let n = y.len();
    if n == 0 || c == 0 {
        return (0.0, 0.0);
    }
    let (mut loss, mut hits) = (0.0f64, 0usize);
    for (row, &label) in logits.chunks_exact(c).zip(y) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&v| f64::from(v - max).exp())
                .sum::<f64>()
                .ln();
        let label = label as usize;
        loss += lse - f64::from(row[label]);
        let top = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i);
        hits += usize::from(top == label);
    }
    (loss / n as f64, hits as f64 / n as f64)
}

/// When a model is good enough on a validation split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Criterion {
    /// Mean cross-entropy at most `epsilon` (the paper's definition).
    Loss(f64),
    /// Accuracy at least `epsilon` (the authors' code, `final_epsilon = 0.70`).
    Accuracy(f64),
}

impl Criterion {
    /// Whether a model with this validation loss and accuracy is good enough.
    pub fn accepts(self, loss: f64, accuracy: f64) -> bool {
        match self {
            Self::Loss(eps) => loss.is_finite() && loss <= eps,
            Self::Accuracy(eps) => accuracy >= eps,
        }
    }
}

/// A learner's validation split as seen by one layer: its inputs (the outputs of the layers
/// below) and labels.
#[derive(Clone, Copy, Debug)]
pub struct Validation<'a> {
    /// Layer inputs, `n x d` row-major.
    pub x: &'a [f32],
    /// Labels.
    pub y: &'a [u32],
}

impl Validation<'_> {
    fn n(&self) -> usize {
        self.y.len()
    }
}

/// Whether every candidate output layer (`count` rows of `flat` weights-then-bias, each an
/// `classes x d` layer) is good enough on `val`: one matrix product for all of them.
pub fn output_layers_good(
    candidates: &[f32],
    count: usize,
    classes: usize,
    val: Validation<'_>,
    criterion: Criterion,
) -> bool {
    let n = val.n();
    let d = val.x.len().checked_div(n).unwrap_or(0);
    let per = classes * d + classes;
    // All candidates' weight rows stacked: (count * classes) x d, biases alongside.
    let mut w = Vec::with_capacity(count * classes * d);
    let mut b = Vec::with_capacity(count * classes);
    for cand in candidates.chunks_exact(per).take(count) {
        w.extend_from_slice(&cand[..classes * d]);
        b.extend_from_slice(&cand[classes * d..]);
    }
    let wide = count * classes;
    let logits = matmul_nt(val.x, &w, n, wide, d);
    let mut own = vec![0f32; n * classes];
    (0..count).all(|s| {
        for (r, row) in own.chunks_exact_mut(classes).enumerate() {
            let src = &logits[r * wide + s * classes..r * wide + (s + 1) * classes];
            for ((o, &v), &bb) in row.iter_mut().zip(src).zip(&b[s * classes..]) {
                *o = v + bb;
            }
        }
        let (loss, acc) = softmax_loss_accuracy(&own, classes, val.y);
        criterion.accepts(loss, acc)
    })
}

/// When a perturbed hidden neuron is still good enough.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NeuronCriterion {
    /// The learner's network, with only this neuron replaced, keeps its validation
    /// cross-entropy at most `epsilon` (the paper's Algorithm 2: "all produce loss less than
    /// epsilon").
    Loss(f64),
    /// The neuron's activations on the validation inputs move by at most `slack`:
    /// `||relu(V w + b) - relu(V w* + b*)||_2 / n` (the authors' code, `hidden_slack = 1.0`).
    Activation(f64),
}

/// One hidden layer of a learner's network, ready for its neurons' radius searches.
pub struct NeuronSearch<'a> {
    /// The layer (its units are the neurons).
    pub layer: &'a Layer,
    /// The learner's layers above it, output layer last.
    pub upper: &'a [Layer],
    /// Validation inputs to `layer` and labels.
    pub val: Validation<'a>,
    /// The criterion.
    pub criterion: NeuronCriterion,
    /// Whether a candidate also carries the neuron's outgoing weights into the output layer
    /// (`[w; b; w_out]`), the paper's neuron space; otherwise `[w; b]`.
    outgoing: bool,
    /// `layer`'s activations on the validation inputs (`n x out`).
    activations: Vec<f32>,
    /// The first upper layer's pre-activations (`n x out_1`).
    upper_pre: Vec<f32>,
}

impl<'a> NeuronSearch<'a> {
    /// Precomputes the unperturbed activations.
    pub fn new(
        layer: &'a Layer,
        upper: &'a [Layer],
        val: Validation<'a>,
        criterion: NeuronCriterion,
    ) -> Result<Self> {
        let n = val.n();
        if val.x.len() != n * layer.inp {
            return Err(FuseError::InvalidInput(format!(
                "validation inputs hold {} values, not {n} rows of {}",
                val.x.len(),
                layer.inp
            )));
        }
        if upper.is_empty() {
            return Err(FuseError::InvalidInput(
                "a hidden layer needs the layers above it (at least the output layer)".into(),
            ));
        }
        let activations = layer.forward(val.x, n, true);
        let upper_pre = upper[0].forward(&activations, n, false);
        Ok(Self {
            layer,
            upper,
            val,
            criterion,
            outgoing: false,
            activations,
            upper_pre,
        })
    }

    /// Candidates in the paper's neuron space: incoming weights, bias and the outgoing
    /// weights into the output layer, so `layer` must be the last hidden layer.
    pub fn with_outgoing(mut self) -> Result<Self> {
        if self.upper.len() != 1 {
            return Err(FuseError::InvalidInput(format!(
                "outgoing weights are comparable across learners only into the output layer; \
                 this layer has {} layers above it",
                self.upper.len()
            )));
        }
        self.outgoing = true;
        Ok(self)
    }

    /// Values per candidate: `d + 1`, plus the output width with outgoing weights.
    pub fn dim(&self) -> usize {
        self.layer.inp + 1 + if self.outgoing { self.upper[0].out } else { 0 }
    }

    /// Whether all `count` candidate vectors for neuron `j` (`[w; b]`, or `[w; b; w_out]`
    /// with outgoing weights) are good enough.
    pub fn all_good(&self, j: usize, candidates: &[f32], count: usize) -> bool {
        let n = self.val.n();
        let d = self.layer.inp;
        let h = self.layer.out;
        let dim = self.dim();
        let (w, b): (Vec<f32>, Vec<f32>) = {
            let mut w = Vec::with_capacity(count * d);
            let mut b = Vec::with_capacity(count);
            for c in candidates.chunks_exact(dim).take(count) {
                w.extend_from_slice(&c[..d]);
                b.push(c[d]);
            }
            (w, b)
        };
        let first = &self.upper[0];
        let o1 = first.out;
        let old_out = Layer::outgoing(first, j);
        // Candidate `s`'s outgoing weights: its own in the joint space, else the learner's.
        let out_of = |s: usize| -> &[f32] {
            if self.outgoing {
                &candidates[s * dim + d + 1..(s + 1) * dim]
            } else {
                &old_out
            }
        };
        // n x count: the candidates' activations, one column each.
        let mut acts = matmul_nt(self.val.x, &w, n, count, d);
        for row in acts.chunks_exact_mut(count) {
            for (v, &bb) in row.iter_mut().zip(&b) {
                *v = (*v + bb).max(0.0);
            }
        }
        match self.criterion {
            NeuronCriterion::Activation(slack) if !self.outgoing => (0..count).all(|s| {
                let sq: f64 = (0..n)
                    .map(|r| f64::from(acts[r * count + s] - self.activations[r * h + j]).powi(2))
                    .sum();
                sq.sqrt() / n.max(1) as f64 <= slack
            }),
            // In the joint space the neuron's effect is what it sends on: the change of its
            // contribution `a w_out` to the output layer, measured as above.
            NeuronCriterion::Activation(slack) => (0..count).all(|s| {
                let out = out_of(s);
                let sq: f64 = (0..n)
                    .map(|r| {
                        let (a, a0) = (acts[r * count + s], self.activations[r * h + j]);
                        out.iter()
                            .zip(&old_out)
                            .map(|(&w, &w0)| f64::from(a * w - a0 * w0).powi(2))
                            .sum::<f64>()
                    })
                    .sum();
                sq.sqrt() / n.max(1) as f64 <= slack
            }),
            NeuronCriterion::Loss(eps) => {
                let mut pre = vec![0f32; n * o1];
                (0..count).all(|s| {
                    // Only neuron j changes: a rank-one update of the next layer's
                    // pre-activations, `a' w_out' - a w_out`.
                    let out = out_of(s);
                    for r in 0..n {
                        let (a, a0) = (acts[r * count + s], self.activations[r * h + j]);
                        let dst = &mut pre[r * o1..(r + 1) * o1];
                        let src = &self.upper_pre[r * o1..(r + 1) * o1];
                        for (k, (p, &z)) in dst.iter_mut().zip(src).enumerate() {
                            // `(a - a0) w' + a0 (w' - w)`: no cancellation near the
                            // centre, and the plain rank-one update when `w' = w`.
                            *p = z + (a - a0) * out[k] + a0 * (out[k] - old_out[k]);
                        }
                    }
                    // The output layer's pre-activations are the logits; deeper nets run on.
                    let deeper;
                    let logits: &[f32] = if self.upper.len() == 1 {
                        &pre
                    } else {
                        let relu: Vec<f32> = pre.iter().map(|v| v.max(0.0)).collect();
                        deeper = forward(&self.upper[1..], &relu, n);
                        &deeper
                    };
                    let classes = self.upper.last().map_or(1, |l| l.out);
                    let (loss, _) = softmax_loss_accuracy(logits, classes, self.val.y);
                    loss.is_finite() && loss <= eps
                })
            }
        }
    }
}

/// Diagonal empirical Fisher of a softmax layer (weights then bias, the flat order):
/// `F_i = mean_x (d log p(y_hat | x) / d theta_i)^2` with `y_hat` drawn from the model's own
/// softmax, as the authors' code does.
pub fn softmax_fisher<R: Rng + ?Sized>(
    layer: &Layer,
    x: &[f32],
    n: usize,
    rng: &mut R,
) -> Vec<f32> {
    let c = layer.out;
    let d = layer.inp;
    let logits = layer.forward(x, n, false);
    let mut fisher = vec![0f64; c * d + c];
    let mut g = vec![0f64; c];
    for (r, row) in logits.chunks_exact(c.max(1)).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row.iter().map(|&v| f64::from(v - max).exp()).collect();
        let z: f64 = e.iter().sum();
        let mut u = rng.random::<f64>() * z;
        let drawn = e
            .iter()
            .position(|&p| {
                u -= p;
                u <= 0.0
            })
            .unwrap_or(c.saturating_sub(1));
        for (k, gk) in g.iter_mut().enumerate() {
            *gk = f64::from(u8::from(k == drawn)) - e[k] / z;
        }
        let xr = &x[r * d..(r + 1) * d];
        for (k, &gk) in g.iter().enumerate() {
            for (f, &xi) in fisher[k * d..(k + 1) * d].iter_mut().zip(xr) {
                *f += (gk * f64::from(xi)).powi(2);
            }
            fisher[c * d + k] += gk * gk;
        }
    }
    fisher
        .iter()
        .map(|f| (f / n.max(1) as f64) as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_nt_matches_hand_values() {
        // [[1,2],[3,4]] * [[1,0],[1,1],[0,2]]^T = [[1,3,4],[3,7,8]]
        let c = matmul_nt(&[1., 2., 3., 4.], &[1., 0., 1., 1., 0., 2.], 2, 3, 2);
        assert_eq!(c, vec![1., 3., 4., 3., 7., 8.]);
    }

    #[test]
    fn softmax_loss_is_log_classes_for_flat_logits() {
        let (loss, _) = softmax_loss_accuracy(&[0.0; 6], 3, &[0, 2]);
        assert!((loss - 3f64.ln()).abs() < 1e-9);
    }

    /// A 2-3-2 network: a hidden layer of three units and the layer above it.
    fn two_layers() -> (Layer, Layer) {
        let layer = Layer {
            weight: vec![0.5, -1.0, 1.0, 0.25, -0.3, 0.7],
            bias: vec![0.1, -0.2, 0.05],
            out: 3,
            inp: 2,
        };
        let top = Layer {
            weight: vec![1.0, -0.5, 0.2, 0.3, 0.8, -1.0],
            bias: vec![0.0, 0.1],
            out: 2,
            inp: 3,
        };
        (layer, top)
    }

    #[test]
    fn rank_one_update_equals_full_forward() {
        let (layer, top) = two_layers();
        let x = [1.0f32, 2.0, -1.0, 0.5, 0.3, -0.7];
        let y = [0u32, 1, 1];
        let upper = [top.clone()];
        let val = Validation { x: &x, y: &y };
        let cand = vec![0.9f32, -0.4, 0.3];
        // Loss of the full network with unit 1 replaced by `cand`.
        let mut changed = layer.clone();
        changed.weight[2..4].copy_from_slice(&cand[..2]);
        changed.bias[1] = cand[2];
        let logits = forward(&[changed, top], &x, 3);
        let (loss, _) = softmax_loss_accuracy(&logits, 2, &y);
        let just_above = NeuronSearch::new(&layer, &upper, val, NeuronCriterion::Loss(loss + 1e-6))
            .expect("shapes");
        let just_below = NeuronSearch::new(&layer, &upper, val, NeuronCriterion::Loss(loss - 1e-6))
            .expect("shapes");
        assert!(just_above.all_good(1, &cand, 1));
        assert!(!just_below.all_good(1, &cand, 1));
    }

    #[test]
    fn joint_space_update_equals_full_forward() {
        let (layer, top) = two_layers();
        assert_eq!(Layer::outgoing(&top, 1), vec![-0.5, 0.8]);
        let x = [1.0f32, 2.0, -1.0, 0.5, 0.3, -0.7];
        let y = [0u32, 1, 1];
        let upper = [top.clone()];
        let val = Validation { x: &x, y: &y };
        // Unit 1 moved in both its incoming weights, bias and outgoing weights.
        let cand = vec![0.9f32, -0.4, 0.3, 0.6, -1.2];
        let mut changed = layer.clone();
        changed.weight[2..4].copy_from_slice(&cand[..2]);
        changed.bias[1] = cand[2];
        let mut changed_top = top.clone();
        changed_top.weight[1] = cand[3];
        changed_top.weight[4] = cand[4];
        let logits = forward(&[changed.clone(), changed_top], &x, 3);
        let (loss, _) = softmax_loss_accuracy(&logits, 2, &y);
        let at = |eps: f64| {
            NeuronSearch::new(&layer, &upper, val, NeuronCriterion::Loss(eps))
                .and_then(NeuronSearch::with_outgoing)
                .expect("shapes")
        };
        assert_eq!(at(loss).dim(), 5);
        assert!(at(loss + 1e-6).all_good(1, &cand, 1));
        assert!(!at(loss - 1e-6).all_good(1, &cand, 1));
        // The activation criterion measures the contribution `a w_out` to the logits.
        let a_new = changed.forward(&x, 3, true);
        let a_old = layer.forward(&x, 3, true);
        let sq: f64 = (0..3)
            .flat_map(|r| {
                let (a, a0) = (a_new[r * 3 + 1], a_old[r * 3 + 1]);
                [(a * 0.6 - a0 * -0.5), (a * -1.2 - a0 * 0.8)]
            })
            .map(|v| f64::from(v).powi(2))
            .sum();
        let change = sq.sqrt() / 3.0;
        let by_activation = |slack: f64| {
            NeuronSearch::new(&layer, &upper, val, NeuronCriterion::Activation(slack))
                .and_then(NeuronSearch::with_outgoing)
                .expect("shapes")
        };
        assert!(by_activation(change + 1e-6).all_good(1, &cand, 1));
        assert!(!by_activation(change - 1e-6).all_good(1, &cand, 1));
        // Outgoing weights into a hidden layer are not comparable across learners.
        let two = [
            top.clone(),
            Layer {
                weight: vec![1.0; 4],
                bias: vec![0.0; 2],
                out: 2,
                inp: 2,
            },
        ];
        assert!(
            NeuronSearch::new(&layer, &two, val, NeuronCriterion::Loss(1.0))
                .and_then(NeuronSearch::with_outgoing)
                .is_err()
        );
    }
}
