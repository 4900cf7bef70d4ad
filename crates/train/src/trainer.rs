use burn::module::{Module, ParamId};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer, SgdConfig};

use crate::seq::sgd::PlainSgd;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use fedfuse_core::layers::TensorRole;
use fedfuse_core::{GroupLayout, ModelSpec, Params};
use fedfuse_data::Dataset;
use rand::SeedableRng;
use rand::distr::{Distribution, StandardUniform};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rayon::prelude::*;

use crate::memory::EVAL_BATCH;
use crate::net::Net;
use crate::{OptimizerConfig, Result, TrainConfig, TrainError, convert};

/// Trains and evaluates one architecture.
#[derive(Clone, Debug)]
pub struct Trainer {
    spec: ModelSpec,
    groups: GroupLayout,
}

/// The outcome of local training.
#[derive(Clone, Debug)]
pub struct Fitted {
    /// The trained parameters.
    pub params: Params,
    /// Mean training loss over the last epoch (without the proximal term).
    pub loss: f64,
    /// Optimizer steps taken.
    pub steps: usize,
    /// Training examples seen per epoch.
    pub examples: usize,
}

/// Accuracy and mean cross-entropy on a dataset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Fraction of samples whose arg-max class is the label.
    pub accuracy: f64,
    /// Mean cross-entropy (natural log).
    pub loss: f64,
    /// Samples evaluated.
    pub n: usize,
}

impl Trainer {
    /// A trainer for `spec`.
    pub fn new(spec: ModelSpec) -> Result<Self> {
        spec.validate()?;
        Ok(Self {
            groups: GroupLayout::of_model(&spec),
            spec,
        })
    }

    /// The architecture.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The architecture's parameter groups (hidden units and filters), which FedSparse gates,
    /// FedL1 penalises and [`Self::fit_gated`] scales.
    pub fn groups(&self) -> &GroupLayout {
        &self.groups
    }

    /// Per-group values as one tensor per grouped layer (what the network multiplies its
    /// units by); `values` has been checked to hold one entry per group.
    pub(crate) fn per_layer(&self, values: &[f32], device: &Device) -> Vec<Tensor<1>> {
        (0..self.groups.layers().len())
            .map(|l| {
                let g = values.get(self.groups.layer_groups(l)).unwrap_or_default();
                Tensor::from_data(TensorData::new(g.to_vec(), [g.len()]), device)
            })
            .collect()
    }

    pub(crate) fn check_data(&self, data: &Dataset) -> Result<()> {
        if data.dim() != self.spec.input_len() {
            return Err(TrainError::DataMismatch(format!(
                "samples have {} values ({:?}) but the model takes {}",
                data.dim(),
                data.sample_shape,
                self.spec.input_len()
            )));
        }
        if data.num_classes > self.spec.classes() {
            return Err(TrainError::DataMismatch(format!(
                "the data has {} classes but the model outputs {}",
                data.num_classes,
                self.spec.classes()
            )));
        }
        Ok(())
    }

    fn logits(&self, net: &Net, x: Vec<f32>, b: usize, device: &Device) -> Tensor<2> {
        net.forward(Tensor::from_data(
            TensorData::new(x, [b, self.spec.input_len()]),
            device,
        ))
    }

    /// Inputs `[b, input_len]` and labels `[b, 1]` of the samples `batch` of `data`.
    pub(crate) fn batch(
        &self,
        data: &Dataset,
        batch: &[usize],
        device: &Device,
    ) -> (Tensor<2>, Tensor<2, Int>) {
        let b = batch.len();
        let mut x = Vec::with_capacity(b * data.dim());
        let mut y = Vec::with_capacity(b);
        for &i in batch {
            x.extend_from_slice(data.sample(i));
            y.push(i64::from(data.y[i]));
        }
        (
            Tensor::from_data(TensorData::new(x, [b, self.spec.input_len()]), device),
            Tensor::from_data(TensorData::new(y, [b, 1]), device),
        )
    }

    /// Trains from `start` on `data` for `cfg.epochs` epochs.
    ///
    /// With `prox = Some((anchor, mu))` the loss gains `mu/2 ||w - anchor||^2` (FedProx).
    /// Batches are drawn from a generator seeded with `seed`: same inputs, same result.
    pub fn fit_with(
        &self,
        start: &Params,
        data: &Dataset,
        cfg: &TrainConfig,
        prox: Option<(&Params, f64)>,
        seed: u64,
    ) -> Result<Fitted> {
        let anchor = match prox {
            Some((a, mu)) => Anchor::Prox(a, mu),
            None => Anchor::None,
        };
        self.fit_inner(start, data, cfg, anchor, 0.0, None, &[], seed)
    }

    /// [`fit_with`](Self::fit_with) without a proximal term and with the tensors `frozen`
    /// (names of the spec's trainable tensors) left as they are: they get no gradient, so no
    /// step, momentum or weight decay moves them. FedMA's clients retrain the layers above
    /// the matched ones this way. Batch norms still update their running statistics in
    /// training, frozen or not, as PyTorch's do when their parameters stop requiring
    /// gradients.
    pub fn fit_frozen(
        &self,
        start: &Params,
        frozen: &[String],
        data: &Dataset,
        cfg: &TrainConfig,
        seed: u64,
    ) -> Result<Fitted> {
        self.fit_inner(start, data, cfg, Anchor::None, 0.0, None, frozen, seed)
    }

    /// The ids of `net`'s trainable tensors that are not `frozen`; `None` when nothing is.
    fn trainable(&self, net: &Net, frozen: &[String]) -> Result<Option<Vec<ParamId>>> {
        if frozen.is_empty() {
            return Ok(None);
        }
        let names: Vec<String> = self
            .spec
            .param_shapes()
            .into_iter()
            .filter(|p| TensorRole::of(&p.name) == TensorRole::Param)
            .map(|p| p.name)
            .collect();
        if let Some(bad) = frozen.iter().find(|f| !names.contains(f)) {
            return Err(TrainError::InvalidConfig {
                field: "frozen",
                reason: format!("`{bad}` is no trainable tensor of the model"),
            });
        }
        let ids = net.param_ids();
        if ids.len() != names.len() {
            return Err(TrainError::Backend(format!(
                "the network holds {} trainable tensors where its spec lists {}",
                ids.len(),
                names.len()
            )));
        }
        Ok(Some(
            names
                .iter()
                .zip(ids)
                .filter(|(n, _)| !frozen.contains(n))
                .map(|(_, id)| id)
                .collect(),
        ))
    }

    /// Trains from `start` under a Gaussian-mixture prior (fedsparse-em eq. 48): the loss
    /// gains `-log sum_k pi_k exp(-lambda/2 ||w - w_k||^2)`, whose gradient pulls the weights
    /// towards each centre in proportion to its responsibility for them.
    pub fn fit_mixture(
        &self,
        start: &Params,
        data: &Dataset,
        cfg: &TrainConfig,
        prior: &MixturePrior<'_>,
        seed: u64,
    ) -> Result<Fitted> {
        let ok = prior.lambda.is_finite()
            && prior.lambda >= 0.0
            && !prior.centres.is_empty()
            && prior.centres.len() == prior.log_weights.len()
            && prior.log_weights.iter().all(|l| l.is_finite());
        if !ok {
            return Err(TrainError::InvalidConfig {
                field: "mixture",
                reason: format!(
                    "{} centres, {} finite log weights and lambda {}: give one log weight per \
                     centre and lambda >= 0",
                    prior.centres.len(),
                    prior.log_weights.len(),
                    prior.lambda
                ),
            });
        }
        self.fit_inner(
            start,
            data,
            cfg,
            Anchor::Mixture(prior),
            0.0,
            None,
            &[],
            seed,
        )
    }

    /// FedL1 local training: [`fit_with`](Self::fit_with) without a proximal term, the loss
    /// gaining the group-L1 penalty `l1 * sum_g ||w_g||_2` over the [groups](Self::groups)
    /// (hidden units and filters with their biases; the output layer is not penalised). The
    /// result is not thresholded: apply
    /// [`GroupLayout::soft_threshold`] or [`GroupLayout::hard_threshold`] before upload.
    pub fn fit_group_l1(
        &self,
        start: &Params,
        data: &Dataset,
        cfg: &TrainConfig,
        l1: f64,
        seed: u64,
    ) -> Result<Fitted> {
        if !(l1.is_finite() && l1 >= 0.0) {
            return Err(TrainError::InvalidConfig {
                field: "l1",
                reason: format!("{l1} is not >= 0"),
            });
        }
        self.fit_inner(start, data, cfg, Anchor::None, l1, None, &[], seed)
    }

    /// Training with every unit of the grouped layers (see [`Self::groups`]) scaled by a fixed
    /// factor `gates[group]`: federated dropout on a model of full size, with 0 for a dropped
    /// unit or filter (it then gets no gradient, and neither do the weights reading it) and
    /// `1/keep` for a kept one (inverted dropout).
    pub fn fit_gated(
        &self,
        start: &Params,
        gates: &[f32],
        data: &Dataset,
        cfg: &TrainConfig,
        seed: u64,
    ) -> Result<Fitted> {
        self.groups.check_per_group(gates, "unit gates")?;
        if let Some(g) = gates.iter().find(|g| !(g.is_finite() && **g >= 0.0)) {
            return Err(TrainError::InvalidConfig {
                field: "gates",
                reason: format!("{g} is not a finite non-negative factor"),
            });
        }
        self.fit_inner(start, data, cfg, Anchor::None, 0.0, Some(gates), &[], seed)
    }

    #[allow(clippy::too_many_arguments)] // private; the public entry points each fix some
    fn fit_inner(
        &self,
        start: &Params,
        data: &Dataset,
        cfg: &TrainConfig,
        anchor: Anchor<'_>,
        l1: f64,
        gates: Option<&[f32]>,
        frozen: &[String],
        seed: u64,
    ) -> Result<Fitted> {
        cfg.check()?;
        self.check_data(data)?;
        if data.is_empty() {
            return Err(TrainError::DataMismatch("no training samples".into()));
        }
        let device = Device::flex().autodiff();
        let gates: Vec<Tensor<1>> = match gates {
            Some(g) => self.per_layer(g, &device),
            None => Vec::new(),
        };
        let mut net = convert::build(&self.spec, start, &device)?;
        let trainable = self.trainable(&net, frozen)?;
        let fixed =
            |p: &Params| -> Result<Net> { Ok(convert::build(&self.spec, p, &device)?.no_grad()) };
        let prox = match anchor {
            Anchor::Prox(a, mu) if mu > 0.0 => Some((fixed(a)?, mu)),
            _ => None,
        };
        let mixture = match anchor {
            Anchor::Mixture(m) if m.lambda > 0.0 => Some((
                m.centres.iter().map(fixed).collect::<Result<Vec<_>>>()?,
                m.log_weights,
                m.lambda,
            )),
            _ => None,
        };
        let mut optim = optimizer(&cfg.optimizer);
        let widths = net.dropout_layers(cfg.dropout);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..data.len()).collect();
        let mut steps = 0;
        let mut last_loss = f64::NAN;
        for epoch in 1..=cfg.epochs {
            order.shuffle(&mut rng);
            let mut loss_sum = 0.0;
            for batch in order.chunks(cfg.batch_size) {
                let (x, targets) = self.batch(data, batch, &device);
                let drop = dropout_masks(&widths, batch.len(), &mut rng, &device);
                let nll = cross_entropy(net.forward_train(x, &gates, &drop), targets);
                loss_sum += f64::from(nll.clone().into_scalar::<f32>()) * batch.len() as f64;
                let mut loss = match &prox {
                    Some((a, mu)) => nll + net.sq_distance(a).mul_scalar(mu / 2.0),
                    None => nll,
                };
                if let Some((centres, log_weights, lambda)) = &mixture {
                    let terms: Vec<Tensor<1>> = centres
                        .iter()
                        .zip(log_weights.iter())
                        .map(|(c, lw)| net.sq_distance(c).mul_scalar(-lambda / 2.0).add_scalar(*lw))
                        .collect();
                    let terms = Tensor::cat(terms, 0);
                    // Log-sum-exp shifted by its largest term, a constant for the gradient.
                    let top = f64::from(terms.clone().max().into_scalar::<f32>());
                    let lse = terms.sub_scalar(top).exp().sum().log().add_scalar(top);
                    loss = loss - lse;
                }
                if l1 > 0.0
                    && let Some(penalty) = group_l1(&net)
                {
                    loss = loss + penalty.mul_scalar(l1);
                }
                let grads = match &trainable {
                    None => GradientsParams::from_grads(loss.backward(), &net),
                    Some(ids) => GradientsParams::from_params(&mut loss.backward(), &net, ids),
                };
                net = optim.step(cfg.lr, net, grads);
                steps += 1;
            }
            last_loss = loss_sum / data.len() as f64;
            if !last_loss.is_finite() {
                return Err(TrainError::Diverged {
                    loss: last_loss,
                    epoch,
                });
            }
        }
        Ok(Fitted {
            params: convert::read(&net, &self.spec)?,
            loss: last_loss,
            steps,
            examples: data.len(),
        })
    }

    /// `params` with every batch norm's running statistics estimated anew on `data`, the
    /// standard repair of a merged network (averaged statistics describe none of the models
    /// merged): the statistics restarted, then training-mode forward passes over `data` in
    /// order, `batch_size` samples at a time, averaged cumulatively (PyTorch's
    /// `reset_running_stats()` and `momentum=None`), so each batch weighs the same and
    /// `num_batches_tracked` counts the batches. Nothing else changes; a model without batch
    /// norm comes back as it was.
    pub fn reestimate_batch_norm(
        &self,
        params: &Params,
        data: &Dataset,
        batch_size: usize,
    ) -> Result<Params> {
        self.check_data(data)?;
        check_reestimate_batch(&self.spec, batch_size)?;
        let device = Device::flex();
        let net = convert::build(&self.spec, params, &device)?;
        let Net::Seq(seq) = &net else {
            return Ok(params.clone());
        };
        if !seq.has_batch_norm() {
            return Ok(params.clone());
        }
        seq.restart_stats();
        let dim = data.dim();
        for start in (0..data.len()).step_by(batch_size) {
            let end = (start + batch_size).min(data.len());
            let x = data.x[start * dim..end * dim].to_vec();
            let x = Tensor::from_data(TensorData::new(x, [end - start, dim]), &device);
            net.forward_train(x, &[], &[]);
        }
        convert::read(&net, &self.spec)
    }

    /// Accuracy and mean loss of `params` on `data`.
    pub fn evaluate(&self, params: &Params, data: &Dataset) -> Result<Evaluation> {
        let mut score = Score::default();
        self.for_each_logits(params, data, |row, label| score.add_logits(row, label))?;
        Ok(score.finish())
    }

    /// Accuracy and mean loss of the uniform softmax ensemble of `members` on `data`: class
    /// probabilities averaged over members (the PFNM paper's ensemble baseline). Members may
    /// have different hidden widths.
    pub fn evaluate_ensemble(&self, members: &[&Params], data: &Dataset) -> Result<Evaluation> {
        if members.is_empty() {
            return Err(TrainError::DataMismatch(
                "an ensemble needs at least one member".into(),
            ));
        }
        let classes = self.spec.classes();
        let mut mean = vec![0.0f64; data.len() * classes];
        for member in members {
            let spec = match member.check_layout(&self.spec.param_shapes()) {
                Ok(()) => self.spec.clone(),
                Err(_) => self.spec.with_widths_of(member)?,
            };
            let trainer = Trainer::new(spec)?;
            let mut at = 0;
            trainer.for_each_logits(member, data, |row, _| {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let z: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
                for (m, &v) in mean[at..at + classes].iter_mut().zip(row) {
                    *m += f64::from(v - max).exp() / z / members.len() as f64;
                }
                at += classes;
            })?;
        }
        let mut score = Score::default();
        for (probs, &label) in mean.chunks_exact(classes).zip(&data.y) {
            score.add_probabilities(probs, label);
        }
        Ok(score.finish())
    }

    /// Calls `f(logits, label)` for every sample of `data`, in order. The batches run in
    /// parallel (one forward pass uses one core); they, and so every logit, are the same at
    /// any thread count.
    fn for_each_logits(
        &self,
        params: &Params,
        data: &Dataset,
        mut f: impl FnMut(&[f32], u32),
    ) -> Result<()> {
        self.check_data(data)?;
        let classes = self.spec.classes();
        let dim = data.dim();
        let device = Device::flex();
        let net = convert::build(&self.spec, params, &device)?;
        let starts: Vec<usize> = (0..data.len()).step_by(EVAL_BATCH).collect();
        let logits = starts
            .par_iter()
            .map(|&start| {
                let end = (start + EVAL_BATCH).min(data.len());
                let x = data.x[start * dim..end * dim].to_vec();
                self.logits(&net, x, end - start, &device)
                    .into_data()
                    .try_into_vec::<f32>()
                    .map_err(|e| TrainError::Backend(format!("{e:?}")))
            })
            .collect::<Result<Vec<Vec<f32>>>>()?;
        for (batch, start) in logits.iter().zip(starts) {
            for (row, &label) in batch.chunks_exact(classes).zip(&data.y[start..]) {
                f(row, label);
            }
        }
        Ok(())
    }
}

/// Most samples one pass of [`Trainer::reestimate_batch_norm`] may take.
pub const MAX_REESTIMATE_BATCH: usize = 65_536;

/// Most memory one such pass may need, by [`crate::estimate_memory`]: the default of a run's
/// `train.max_memory_mb`.
const MAX_REESTIMATE_BYTES: u64 = 8 << 30;

/// Checks a batch size for [`Trainer::reestimate_batch_norm`] on `spec` before anything runs:
/// at least 1, at most [`MAX_REESTIMATE_BATCH`], and a training-mode pass that fits in 8 GiB.
pub fn check_reestimate_batch(spec: &ModelSpec, batch_size: usize) -> Result<()> {
    let bad = |reason: String| TrainError::InvalidConfig {
        field: "batch_size",
        reason,
    };
    if !(1..=MAX_REESTIMATE_BATCH).contains(&batch_size) {
        return Err(bad(format!(
            "re-estimating batch norm takes 1 to {MAX_REESTIMATE_BATCH} samples a pass, not \
             {batch_size}"
        )));
    }
    let need = crate::estimate_memory(spec, batch_size, 1)?.train_bytes;
    if need > MAX_REESTIMATE_BYTES {
        return Err(bad(format!(
            "a pass of {batch_size} samples needs about {} MiB, above {} MiB: take fewer \
             samples a pass",
            need.div_ceil(1 << 20),
            MAX_REESTIMATE_BYTES >> 20
        )));
    }
    Ok(())
}

/// Inverted-dropout masks `[batch, units]`, one per `(units, p)` in `layers` (the layers of
/// [`Net::dropout_layers`], read once per training call): each entry `1/(1 - p)` with
/// probability `1 - p`, else 0. None without such layers, so that training without dropout
/// draws nothing from `rng`.
pub(crate) fn dropout_masks(
    layers: &[(usize, f64)],
    batch: usize,
    rng: &mut StdRng,
    device: &Device,
) -> Vec<Tensor<2>> {
    layers
        .iter()
        .map(|&(units, p)| {
            let scale = (1.0 / (1.0 - p)) as f32;
            let mask: Vec<f32> = (0..batch * units)
                .map(|_| {
                    let u: f64 = StandardUniform.sample(rng);
                    if u < p { 0.0 } else { scale }
                })
                .collect();
            Tensor::from_data(TensorData::new(mask, [batch, units]), device)
        })
        .collect()
}

/// Running accuracy and cross-entropy.
#[derive(Default)]
struct Score {
    correct: usize,
    loss: f64,
    n: usize,
}

impl Score {
    fn add_logits(&mut self, row: &[f32], label: u32) {
        let (arg, max) = arg_max(row.iter().map(|&v| f64::from(v)));
        let lse = max
            + row
                .iter()
                .map(|&v| (f64::from(v) - max).exp())
                .sum::<f64>()
                .ln();
        self.push(arg == label as usize, lse - f64::from(row[label as usize]));
    }

    fn add_probabilities(&mut self, probs: &[f64], label: u32) {
        let (arg, _) = arg_max(probs.iter().copied());
        // Clamped so that a member that is certain and wrong gives a large, finite loss.
        self.push(
            arg == label as usize,
            -probs[label as usize].max(1e-12).ln(),
        );
    }

    fn push(&mut self, correct: bool, loss: f64) {
        self.correct += usize::from(correct);
        self.loss += loss;
        self.n += 1;
    }

    fn finish(self) -> Evaluation {
        let n = self.n;
        Evaluation {
            accuracy: if n == 0 {
                0.0
            } else {
                self.correct as f64 / n as f64
            },
            loss: if n == 0 { 0.0 } else { self.loss / n as f64 },
            n,
        }
    }
}

/// Index and value of the first maximum.
fn arg_max(values: impl Iterator<Item = f64>) -> (usize, f64) {
    values
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |(ai, am), (i, v)| {
            if v > am { (i, v) } else { (ai, am) }
        })
}

/// A Gaussian-mixture prior over a network's weights: centres of the trained network's
/// layout, their log mixing weights and the components' precision.
pub struct MixturePrior<'a> {
    /// The components' means.
    pub centres: &'a [Params],
    /// `ln pi_k`, one per centre.
    pub log_weights: &'a [f64],
    /// Precision of every component.
    pub lambda: f64,
}

/// What pulls the weights besides the data.
enum Anchor<'a> {
    None,
    /// `mu/2 ||w - anchor||^2`.
    Prox(&'a Params, f64),
    Mixture(&'a MixturePrior<'a>),
}

/// Mean cross-entropy of `logits` `[b, classes]` against labels `[b, 1]`.
pub(crate) fn cross_entropy(logits: Tensor<2>, targets: Tensor<2, Int>) -> Tensor<1> {
    log_softmax(logits, 1).gather(1, targets).neg().mean()
}

/// `sum_g ||w_g||_2` over the network's groups. The small constant under the root keeps the
/// gradient finite (zero) at a zero group, where the norm is not differentiable. `None` for a
/// model without groups.
fn group_l1(net: &Net) -> Option<Tensor<1>> {
    net.group_units()
        .into_iter()
        .map(|(w, b)| {
            let [units, _] = w.dims();
            (w.square().sum_dim(1).reshape([units]) + b.square())
                .add_scalar(1e-12)
                .sqrt()
                .sum()
        })
        .reduce(|s, t| s + t)
}

pub(crate) fn optimizer(cfg: &OptimizerConfig) -> ModuleOptimizer {
    let decay = |wd: f64| (wd > 0.0).then(|| WeightDecayConfig::new(wd as f32));
    match cfg {
        OptimizerConfig::Sgd {
            momentum,
            weight_decay,
        } if *momentum == 0.0 && *weight_decay == 0.0 => ModuleOptimizer::from(PlainSgd),
        OptimizerConfig::Sgd {
            momentum,
            weight_decay,
        } => SgdConfig::new()
            .with_momentum((*momentum > 0.0).then(|| {
                MomentumConfig::new()
                    .with_momentum(*momentum)
                    .with_dampening(0.0)
            }))
            .with_weight_decay(decay(*weight_decay))
            .init(),
        OptimizerConfig::Adam {
            beta1,
            beta2,
            eps,
            weight_decay,
            amsgrad,
        } => AdamConfig::new()
            .with_beta_1(*beta1 as f32)
            .with_beta_2(*beta2 as f32)
            .with_epsilon(*eps as f32)
            .with_amsgrad(*amsgrad)
            .with_weight_decay(decay(*weight_decay))
            .init(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use fedfuse_core::ModelSpec;

    use super::*;
    use crate::{Init, init_params};

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_into_vec::<f32>().unwrap()
    }

    #[test]
    fn dropout_masks_drop_p_and_keep_the_expectation() {
        let device = Device::flex();
        let spec = ModelSpec::mlp(8, &[300, 200], 3);
        let net = convert::build(&spec, &init_params(&spec, Init::Default, 0), &device).unwrap();
        let mut rng = StdRng::seed_from_u64(4);
        for p in [0.2, 0.5, 0.8] {
            let masks = dropout_masks(&net.dropout_layers(p), 64, &mut rng, &device);
            assert_eq!(masks.len(), 2);
            for (mask, units) in masks.into_iter().zip([300, 200]) {
                assert_eq!(mask.dims(), [64, units]);
                let v = values(mask);
                let scale = (1.0 / (1.0 - p)) as f32;
                assert!(v.iter().all(|&m| m == 0.0 || m == scale), "p {p}");
                let dropped = v.iter().filter(|&&m| m == 0.0).count() as f64 / v.len() as f64;
                // 12,800 draws or more: the share is within 0.015 of p with room to spare.
                assert!((dropped - p).abs() < 0.015, "p {p}: dropped {dropped}");
                let mean = v.iter().map(|&m| f64::from(m)).sum::<f64>() / v.len() as f64;
                assert!((mean - 1.0).abs() < 0.05, "p {p}: mean mask {mean}");
            }
        }
        // No dropout draws nothing, so runs without it keep their random stream.
        let (mut used, mut fresh) = (StdRng::seed_from_u64(5), StdRng::seed_from_u64(5));
        assert!(dropout_masks(&net.dropout_layers(0.0), 64, &mut used, &device).is_empty());
        let next = |r: &mut StdRng| -> f64 { StandardUniform.sample(r) };
        assert_eq!(next(&mut used), next(&mut fresh));
    }

    #[test]
    fn lenet5_drops_its_fully_connected_units_only() {
        let device = Device::flex();
        let spec = ModelSpec::LeNet5 {
            channels: 1,
            side: 28,
            classes: 10,
        };
        let net = convert::build(&spec, &init_params(&spec, Init::Default, 0), &device).unwrap();
        assert_eq!(net.dropout_layers(0.5), vec![(120, 0.5), (84, 0.5)]);
    }
}
