//! NGM learning (Algorithm 1) as one general fit over `(inputs, targets)` pairs: plain NGM
//! fitting uses `targets = inputs`, FedNGM's server distillation uses client-ensemble outputs.

use burn::module::Module;
use burn::nn::Linear;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};
use fedfuse_core::Params;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use super::penalty::{
    PathNorm, PenaltyKind, masked_sq_norm, path_tensor, penalty_tensor, penalty_value,
};
use fedfuse_core::BlockKind;

use super::{CategoricalLoss, Ngm, check_matrix};
use crate::net::Net;
use crate::{Result, TrainError, convert};

/// How the penalty weight `lambda` evolves in phase 2 of Algorithm 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LambdaSchedule {
    /// `lambda` stays at [`NgmConfig::lambda`] (the reference code).
    #[default]
    Fixed,
    /// Algorithm 1: `lambda^e = lambda * ||P ⊙ S^c||_F^2`, recomputed (detached) after the
    /// proximal-init phase and after every epoch; [`NgmConfig::lambda`] scales it (1 is the
    /// paper's).
    Adaptive,
}

/// Settings of NGM training (Algorithm 1). Defaults follow the reference code where it has
/// one (two hidden layers of 20, Adam lr 1e-3, lambda 1, 1200 epochs, full batch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NgmConfig {
    /// Hidden widths of a fresh model; a warm start keeps the widths of its parameters.
    pub hidden: Vec<usize>,
    /// Penalty weight (or its scale under [`LambdaSchedule::Adaptive`]).
    pub lambda: f64,
    /// Fixed or adaptive `lambda`.
    pub schedule: LambdaSchedule,
    /// Entrywise L1 (the paper's) or log-scaled Frobenius penalty.
    pub penalty: PenaltyKind,
    /// Row-normalised path matrix (the reference code's) or the raw product of `|W|`.
    pub path: PathNorm,
    /// Phase-2 epochs (regression + penalty).
    pub epochs: usize,
    /// Phase-1 epochs ("proximal init": regression only, no penalty).
    pub proximal_init_epochs: usize,
    /// Adam learning rate (betas 0.9, 0.999, eps 1e-8 as in PyTorch).
    pub lr: f64,
    /// Mini-batch size; 0 means full batch.
    pub batch_size: usize,
    /// Fraction of rows held out to select the best epoch; 0 keeps the last epoch. The score
    /// is the held-out regression loss plus `lambda` times the current penalty (see
    /// [`Ngm::fit`]).
    pub validation_fraction: f64,
    /// Seeds the initialisation, the split and the batch order.
    pub seed: u64,
}

impl Default for NgmConfig {
    fn default() -> Self {
        Self {
            hidden: vec![20, 20],
            lambda: 1.0,
            schedule: LambdaSchedule::Fixed,
            penalty: PenaltyKind::L1,
            path: PathNorm::RowNormalised,
            epochs: 1200,
            proximal_init_epochs: 0,
            lr: 1e-3,
            batch_size: 0,
            validation_fraction: 0.2,
            seed: 0,
        }
    }
}

impl NgmConfig {
    /// Checks every setting once; training trusts them afterwards.
    pub fn check(&self) -> Result<()> {
        let bad = |field, reason: String| Err(TrainError::InvalidConfig { field, reason });
        if self.hidden.contains(&0) {
            return bad("ngm.hidden", format!("{:?} has a zero width", self.hidden));
        }
        if !(self.lambda.is_finite() && self.lambda >= 0.0) {
            return bad("ngm.lambda", format!("{} is not >= 0", self.lambda));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("ngm.lr", format!("{} is not a positive number", self.lr));
        }
        if self.epochs + self.proximal_init_epochs == 0 {
            return bad(
                "ngm.epochs",
                "no epochs at all; set epochs or proximal_init_epochs".into(),
            );
        }
        if !(0.0..1.0).contains(&self.validation_fraction) {
            return bad(
                "ngm.validation_fraction",
                format!("{} is not in [0, 1)", self.validation_fraction),
            );
        }
        Ok(())
    }
}

/// One epoch of training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochLog {
    /// Epoch, from 1, counting phase 1 first.
    pub epoch: usize,
    /// Whether the penalty was on (phase 2).
    pub penalised: bool,
    /// Mean regression loss on the training rows during the epoch.
    pub train_loss: f64,
    /// Regression loss on the held-out rows after the epoch.
    pub val_loss: Option<f64>,
    /// Penalty (of the configured kind) after the epoch.
    pub penalty: f64,
    /// `lambda` used during the epoch.
    pub lambda: f64,
}

/// The outcome of NGM training.
#[derive(Clone, Debug)]
pub struct NgmFit {
    /// The selected parameters (`layers.{i}.weight` `[out, in]`, `layers.{i}.bias`).
    pub params: Params,
    /// Per-epoch log.
    pub history: Vec<EpochLog>,
    /// The epoch whose parameters were returned.
    pub best_epoch: usize,
    /// Training regression loss of that epoch.
    pub train_loss: f64,
    /// Held-out regression loss of that epoch.
    pub val_loss: Option<f64>,
    /// Entrywise L1 penalty `sum P ⊙ M` of the returned parameters (`P` of `cfg.path`;
    /// `M = S^c` for an NGM, NGR's weights for [`Ngm::fit_ngr`]).
    pub penalty: f64,
}

/// Distillation data: `targets` are what the model should output for `inputs` (FedNGM's
/// `sum_c a_c f_c(x)` on samples `X_s`), optionally with a public set reconstructed `x -> x`
/// with weight `gamma`. Categorical target blocks may be probability vectors.
#[derive(Clone, Copy, Debug)]
pub struct Distill<'a> {
    /// `n x U` inputs.
    pub inputs: &'a [f32],
    /// `n x U` targets.
    pub targets: &'a [f32],
    /// Optional public `m x U` data, fitted as `x -> x`.
    pub public: Option<&'a [f32]>,
    /// Weight of the public term.
    pub gamma: f64,
}

/// Per-unit loss layout: which units take squared error, which blocks cross-entropy.
pub(crate) struct LossLayout {
    /// 1 for squared-error units, 0 for cross-entropy units.
    pub sq_units: Vec<f32>,
    /// `(start, len)` of cross-entropy blocks.
    pub ce_blocks: Vec<(usize, usize)>,
    /// `U`.
    pub units: usize,
}

impl Ngm {
    pub(crate) fn loss_layout(&self) -> LossLayout {
        let mut sq_units = vec![1.0; self.units];
        let mut ce_blocks = Vec::new();
        if self.categorical_loss == CategoricalLoss::CrossEntropy {
            for b in &self.blocks {
                if b.kind == BlockKind::Categorical {
                    sq_units[b.range()].iter_mut().for_each(|v| *v = 0.0);
                    ce_blocks.push((b.start, b.len));
                }
            }
        }
        LossLayout {
            sq_units,
            ce_blocks,
            units: self.units,
        }
    }
}

pub(crate) fn tensor2(data: Vec<f32>, shape: [usize; 2], device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(data, shape), device)
}

pub(crate) fn values<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>> {
    t.into_data()
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))
}

/// Per-row regression loss `[n, 1]`: squared error on units weighted by `sq_w` (broadcast to
/// `[n, U]`; it also carries evidence masks in inference) plus, per cross-entropy block,
/// `-sum t log softmax(out)` weighted by `ce_known[:, start]` when given; all over `U`, so that
/// all-real data gives the reference code's mean squared error.
pub(crate) fn row_loss(
    out: Tensor<2>,
    target: Tensor<2>,
    layout: &LossLayout,
    sq_w: Tensor<2>,
    ce_known: Option<&Tensor<2>>,
) -> Tensor<2> {
    let mut loss = ((out.clone() - target.clone()).square() * sq_w).sum_dim(1);
    for &(start, len) in &layout.ce_blocks {
        let lsm = log_softmax(out.clone().narrow(1, start, len), 1);
        let mut ce = (target.clone().narrow(1, start, len) * lsm)
            .sum_dim(1)
            .neg();
        if let Some(k) = ce_known {
            ce = ce * k.clone().narrow(1, start, 1);
        }
        loss = loss + ce;
    }
    loss.div_scalar(layout.units as f64)
}

/// Outputs as the model means them: softmax probabilities on cross-entropy blocks, raw values
/// elsewhere.
pub(crate) fn read_out(out: Tensor<2>, layout: &LossLayout) -> Tensor<2> {
    if layout.ce_blocks.is_empty() {
        return out;
    }
    let mut pieces = Vec::new();
    let mut at = 0;
    for &(start, len) in &layout.ce_blocks {
        if start > at {
            pieces.push(out.clone().narrow(1, at, start - at));
        }
        pieces.push(softmax(out.clone().narrow(1, start, len), 1));
        at = start + len;
    }
    if at < layout.units {
        pieces.push(out.clone().narrow(1, at, layout.units - at));
    }
    Tensor::cat(pieces, 1)
}

pub(crate) fn mlp_layers(net: &Net) -> &[Linear] {
    match net {
        Net::Mlp(m) => &m.layers,
        Net::LeNet5(_) | Net::Seq(_) => &[],
    }
}

fn net_weights(net: &Net) -> Vec<Tensor<2>> {
    mlp_layers(net).iter().map(|l| l.weight.val()).collect()
}

/// Gathers rows `idx` of an `n x u` matrix.
pub(crate) fn gather(x: &[f32], u: usize, idx: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(idx.len() * u);
    for &i in idx {
        out.extend_from_slice(&x[i * u..(i + 1) * u]);
    }
    out
}

fn index_tensor(idx: &[usize], device: &Device) -> Tensor<1, Int> {
    let data: Vec<i64> = idx.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [idx.len()]), device)
}

/// The frozen block of each layer: `(in, out)` of the copied global weight in burn's `[in,
/// out]` layout; entries `[..in, ..out]` of the weight and `[..out]` of the bias get no
/// gradient.
pub(crate) type Frozen = Vec<(usize, usize)>;

/// Everything a fit needs beyond the config.
pub(crate) struct Task<'a> {
    pub inputs: &'a [f32],
    pub targets: &'a [f32],
    pub public: Option<(&'a [f32], f64)>,
    /// `U x U` penalty weights (row-major, input x output).
    pub weights: Vec<f32>,
    pub frozen: Option<Frozen>,
}

/// Zeroes the gradients of frozen entries, so Adam's moments stay 0 there and the entries do
/// not move (Adam's step `m / (sqrt(v) + eps)` is exactly 0 for a zero gradient history).
fn mask_frozen(net: &Net, grads: &mut GradientsParams, frozen: &Frozen) {
    for (layer, &(fin, fout)) in mlp_layers(net).iter().zip(frozen) {
        if let Some(g) = grads.remove::<2>(layer.weight.id) {
            let [inp, out] = g.dims();
            let mask: Vec<f32> = (0..inp * out)
                .map(|k| f32::from(u8::from(!(k / out < fin && k % out < fout))))
                .collect();
            let device = g.device();
            grads.register(layer.weight.id, g * tensor2(mask, [inp, out], &device));
        }
        if let Some(b) = &layer.bias
            && let Some(g) = grads.remove::<1>(b.id)
        {
            let [out] = g.dims();
            let mask: Vec<f32> = (0..out).map(|k| f32::from(u8::from(k >= fout))).collect();
            let device = g.device();
            let m: Tensor<1> = Tensor::from_data(TensorData::new(mask, [out]), &device);
            grads.register(b.id, g * m);
        }
    }
}

fn adam() -> ModuleOptimizer {
    AdamConfig::new()
        .with_beta_1(0.9)
        .with_beta_2(0.999)
        .with_epsilon(1e-8)
        .init()
}

impl Ngm {
    /// NGM learning (Algorithm 1): fits `x -> x` (`n x U`, normalised) from `start` (a warm
    /// start, e.g. the global model of a FedNGM round) or from a fresh model of `cfg.hidden`.
    ///
    /// Loss per batch: regression (squared error on real units, softmax cross-entropy or
    /// squared error on categorical blocks, summed per row, over `U`, averaged over rows) plus,
    /// after `cfg.proximal_init_epochs` regression-only epochs, `lambda` times the structure
    /// penalty of the path matrix against `S^c`.
    ///
    /// With `cfg.validation_fraction > 0` a seeded share of rows is held out and the returned
    /// parameters are those of the epoch with the lowest held-out regression loss plus
    /// `cfg.lambda` times the penalty. The reference code selects on the regression loss alone,
    /// which, once the penalty starts from a phase-1 model, always picks the first (least
    /// constrained) epoch; adding the penalty keeps the selection on the training objective.
    /// Only penalised epochs compete when there are any.
    pub fn fit(&self, start: Option<&Params>, x: &[f32], cfg: &NgmConfig) -> Result<NgmFit> {
        self.fit_task(
            start,
            Task {
                inputs: x,
                targets: x,
                public: None,
                weights: self.forbidden_weights(),
                frozen: None,
            },
            cfg,
        )
    }

    /// FedNGM's server step: fits `f_W(inputs) ≈ targets` (plus `gamma` times the `x -> x`
    /// loss on `public`) under the same structure penalty as [`fit`](Self::fit):
    /// `(1/|Xs|) sum ||f_W(x) - y||^2 + gamma (1/|Xpub|) sum ||f_W(x) - x||^2 + lambda pen`.
    /// With cross-entropy, categorical target blocks are probability vectors (soft targets),
    /// e.g. averaged [`predict`](Self::predict) outputs from
    /// [`average_predictions`](Self::average_predictions). The held-out split is drawn from
    /// `inputs`.
    pub fn fit_distill(
        &self,
        start: Option<&Params>,
        data: Distill<'_>,
        cfg: &NgmConfig,
    ) -> Result<NgmFit> {
        self.distill_task(start, data, self.forbidden_weights(), cfg)
    }

    /// Distillation under given penalty weights (the graph's `S^c`, or NGR's).
    pub(crate) fn distill_task(
        &self,
        start: Option<&Params>,
        data: Distill<'_>,
        weights: Vec<f32>,
        cfg: &NgmConfig,
    ) -> Result<NgmFit> {
        if !(data.gamma.is_finite() && data.gamma >= 0.0) {
            return Err(TrainError::InvalidConfig {
                field: "distill.gamma",
                reason: format!("{} is not >= 0", data.gamma),
            });
        }
        self.fit_task(
            start,
            Task {
                inputs: data.inputs,
                targets: data.targets,
                public: data.public.map(|p| (p, data.gamma)),
                weights,
                frozen: None,
            },
            cfg,
        )
    }

    /// `S^c` as f32 penalty weights.
    pub(crate) fn forbidden_weights(&self) -> Vec<f32> {
        self.allowed
            .iter()
            .map(|&a| f32::from(u8::from(!a)))
            .collect()
    }

    pub(crate) fn fit_task(
        &self,
        start: Option<&Params>,
        task: Task<'_>,
        cfg: &NgmConfig,
    ) -> Result<NgmFit> {
        cfg.check()?;
        let u = self.units;
        let n = self.check_matrix(task.inputs, "inputs")?;
        let nt = check_matrix(task.targets, u, "targets")?;
        if nt != n {
            return Err(TrainError::DataMismatch(format!(
                "{n} input rows but {nt} target rows; pair every input with one target"
            )));
        }
        if let Some((p, _)) = task.public {
            check_matrix(p, u, "public data")?;
        }
        let start = match start {
            Some(p) => {
                p.check_finite()?;
                p.clone()
            }
            None => self.init(&cfg.hidden, cfg.seed)?,
        };
        let spec = self.spec_of(&start)?;
        let layout = self.loss_layout();
        let mut rng = StdRng::seed_from_u64(cfg.seed);

        let mut perm: Vec<usize> = (0..n).collect();
        perm.shuffle(&mut rng);
        let n_val = if cfg.validation_fraction > 0.0 && n >= 2 {
            ((cfg.validation_fraction * n as f64).round() as usize).clamp(1, n - 1)
        } else {
            0
        };
        let (val_idx, train_idx) = perm.split_at(n_val);
        let n_tr = train_idx.len();

        let device = Device::flex().autodiff();
        let plain = Device::flex();
        let x_tr = tensor2(gather(task.inputs, u, train_idx), [n_tr, u], &device);
        let y_tr = tensor2(gather(task.targets, u, train_idx), [n_tr, u], &device);
        let val = (n_val > 0).then(|| {
            (
                tensor2(gather(task.inputs, u, val_idx), [n_val, u], &plain),
                tensor2(gather(task.targets, u, val_idx), [n_val, u], &plain),
            )
        });
        let public = task.public.map(|(p, gamma)| {
            let m = p.len() / u;
            (tensor2(p.to_vec(), [m, u], &device), m, gamma)
        });
        let m = tensor2(task.weights.clone(), [u, u], &device);
        let sq_w = tensor2(layout.sq_units.clone(), [1, u], &device);
        let sq_w_plain = tensor2(layout.sq_units.clone(), [1, u], &plain);

        let mut net = convert::build(&spec, &start, &device)?;
        let mut optim = adam();
        let bs = if cfg.batch_size == 0 || cfg.batch_size >= n_tr {
            n_tr
        } else {
            cfg.batch_size
        };
        let n_batches = n_tr.div_ceil(bs);
        let mut order: Vec<usize> = (0..n_tr).collect();
        let mut pub_order: Vec<usize> = public.as_ref().map_or(Vec::new(), |p| (0..p.1).collect());

        let total = cfg.proximal_init_epochs + cfg.epochs;
        let mut lambda = 0.0;
        let mut history = Vec::with_capacity(total);
        let mut best: Option<(f64, usize, Net)> = None;
        for epoch in 1..=total {
            let penalised = epoch > cfg.proximal_init_epochs;
            if epoch == cfg.proximal_init_epochs + 1 {
                lambda = match cfg.schedule {
                    LambdaSchedule::Fixed => cfg.lambda,
                    LambdaSchedule::Adaptive => {
                        cfg.lambda
                            * masked_sq_norm(&self.path_values(&net, cfg.path)?, &task.weights)
                    }
                };
            }
            if n_batches > 1 {
                order.shuffle(&mut rng);
                pub_order.shuffle(&mut rng);
            }
            let mut reg_sum = 0.0;
            for b in 0..n_batches {
                let rows = &order[b * bs..((b + 1) * bs).min(n_tr)];
                let (xb, yb) = if n_batches == 1 {
                    (x_tr.clone(), y_tr.clone())
                } else {
                    let idx = index_tensor(rows, &device);
                    (
                        x_tr.clone().select(0, idx.clone()),
                        y_tr.clone().select(0, idx),
                    )
                };
                let reg = row_loss(net.forward(xb), yb, &layout, sq_w.clone(), None).mean();
                reg_sum += f64::from(reg.clone().into_scalar::<f32>()) * rows.len() as f64;
                let mut loss = reg;
                if let Some((p, m_rows, gamma)) = &public
                    && *gamma > 0.0
                {
                    // The public rows are split into as many chunks as there are batches.
                    let chunk = m_rows.div_ceil(n_batches);
                    let lo = (b * chunk).min(*m_rows);
                    let hi = ((b + 1) * chunk).min(*m_rows);
                    if hi > lo {
                        let pb = if n_batches == 1 {
                            p.clone()
                        } else {
                            p.clone()
                                .select(0, index_tensor(&pub_order[lo..hi], &device))
                        };
                        let pr = row_loss(net.forward(pb.clone()), pb, &layout, sq_w.clone(), None);
                        loss = loss + pr.mean().mul_scalar(*gamma);
                    }
                }
                if penalised
                    && lambda > 0.0
                    && let Some(p) = path_tensor(net_weights(&net), cfg.path)
                {
                    loss = loss + penalty_tensor(p, &m, cfg.penalty).mul_scalar(lambda);
                }
                let mut grads = GradientsParams::from_grads(loss.backward(), &net);
                if let Some(frozen) = &task.frozen {
                    mask_frozen(&net, &mut grads, frozen);
                }
                net = optim.step(cfg.lr, net, grads);
            }
            let train_loss = reg_sum / n_tr as f64;
            let p_now = self.path_values(&net, cfg.path)?;
            let penalty = penalty_value(&p_now, &task.weights, cfg.penalty);
            // The log-scaled penalty is -inf when the structure holds exactly; that is fine.
            if !train_loss.is_finite() || penalty.is_nan() {
                return Err(TrainError::Diverged {
                    loss: train_loss + penalty,
                    epoch,
                });
            }
            let val_loss = match &val {
                Some((xv, yv)) => {
                    let vnet = net.valid();
                    let l = row_loss(
                        vnet.forward(xv.clone()),
                        yv.clone(),
                        &layout,
                        sq_w_plain.clone(),
                        None,
                    )
                    .mean()
                    .into_scalar::<f32>();
                    Some(f64::from(l))
                }
                None => None,
            };
            history.push(EpochLog {
                epoch,
                penalised,
                train_loss,
                val_loss,
                penalty,
                lambda: if penalised { lambda } else { 0.0 },
            });
            if penalised && cfg.schedule == LambdaSchedule::Adaptive {
                lambda = cfg.lambda * masked_sq_norm(&p_now, &task.weights);
            }
            if let Some(v) = val_loss {
                // Phase-1 epochs compete only when there is no phase 2.
                if penalised || cfg.epochs == 0 {
                    let w = if penalised { cfg.lambda } else { 0.0 };
                    let score = v + w * penalty;
                    if best.as_ref().is_none_or(|(s, _, _)| score < *s) {
                        best = Some((score, epoch, net.valid()));
                    }
                }
            }
        }
        let (best_epoch, best_net) = match best {
            Some((_, e, b)) => (e, b),
            None => (total, net.valid()),
        };
        let log = history
            .get(best_epoch.saturating_sub(1))
            .copied()
            .ok_or_else(|| TrainError::Backend("empty training history".into()))?;
        let params = convert::read(&best_net, &spec)?;
        let p_best = self.path_values(&best_net, cfg.path)?;
        Ok(NgmFit {
            params,
            history,
            best_epoch,
            train_loss: log.train_loss,
            val_loss: log.val_loss,
            penalty: penalty_value(&p_best, &task.weights, PenaltyKind::L1),
        })
    }

    /// The plain path matrix of a network.
    fn path_values(&self, net: &Net, norm: PathNorm) -> Result<Vec<f32>> {
        match path_tensor(net_weights(&net.valid()), norm) {
            Some(p) => values(p),
            None => Ok(vec![0.0; self.units * self.units]),
        }
    }

    /// The model's outputs for `x` (`n x U`): softmax probabilities on categorical blocks under
    /// cross-entropy, raw values elsewhere (and on categorical blocks under squared error).
    pub fn predict(&self, params: &Params, x: &[f32]) -> Result<Vec<f32>> {
        let n = self.check_matrix(x, "x")?;
        let spec = self.spec_of(params)?;
        let device = Device::flex();
        let net = convert::build(&spec, params, &device)?;
        let out = net.forward(tensor2(x.to_vec(), [n, self.units], &device));
        values(read_out(out, &self.loss_layout()))
    }

    /// `sum_c a_c f_c(x)` with the weights `a_c` normalised to sum to 1: the distillation
    /// targets of FedNGM's server (averaged probabilities on categorical blocks).
    pub fn average_predictions(&self, members: &[(&Params, f64)], x: &[f32]) -> Result<Vec<f32>> {
        let total: f64 = members.iter().map(|(_, a)| a).sum();
        if members.is_empty() || !(total.is_finite() && total > 0.0) {
            return Err(TrainError::InvalidConfig {
                field: "members",
                reason: "need at least one member and positive, finite weights".into(),
            });
        }
        if let Some((_, a)) = members.iter().find(|(_, a)| !(a.is_finite() && *a >= 0.0)) {
            return Err(TrainError::InvalidConfig {
                field: "members",
                reason: format!("member weight {a} is not >= 0"),
            });
        }
        let mut mean = vec![0.0f64; x.len()];
        for (params, a) in members {
            let y = self.predict(params, x)?;
            mean.iter_mut()
                .zip(&y)
                .for_each(|(m, &v)| *m += a / total * f64::from(v));
        }
        Ok(mean.into_iter().map(|v| v as f32).collect())
    }

    /// Mean regression loss of `params` mapping `inputs` to `targets` (the training loss
    /// without penalty).
    pub fn regression_loss(&self, params: &Params, inputs: &[f32], targets: &[f32]) -> Result<f64> {
        let n = self.check_matrix(inputs, "inputs")?;
        let nt = check_matrix(targets, self.units, "targets")?;
        if n != nt {
            return Err(TrainError::DataMismatch(format!(
                "{n} input rows but {nt} target rows"
            )));
        }
        let spec = self.spec_of(params)?;
        let device = Device::flex();
        let net = convert::build(&spec, params, &device)?;
        let layout = self.loss_layout();
        let sq_w = tensor2(layout.sq_units.clone(), [1, self.units], &device);
        let out = net.forward(tensor2(inputs.to_vec(), [n, self.units], &device));
        let y = tensor2(targets.to_vec(), [n, self.units], &device);
        Ok(f64::from(
            row_loss(out, y, &layout, sq_w, None)
                .mean()
                .into_scalar::<f32>(),
        ))
    }
}
