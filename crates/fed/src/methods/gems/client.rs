//! A GEMS learner's round: train from the fused layers below, then measure each neuron's
//! (or the output layer's) ball on its own validation split.

use fedfuse_core::{ModelSpec, Record};
use fedfuse_data::holdout;
use fedfuse_fuse::gems::dense::{
    Layer, NeuronSearch, Validation, mlp_layers, output_layers_good, softmax_fisher,
};
use fedfuse_fuse::gems::{fisher_axes, search_radius};
use fedfuse_train::{TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::{ClientContext, FedError, Result, derive_seed};

use super::{
    AXES, CENTRES, DONE, Gems, OUTPUT, OUTPUT_BIAS, RADII, Shape, fused_from, hidden_features,
};

impl Gems {
    /// A learner's round: the balls of the stage's layer, measured on its validation split.
    pub(super) fn fit_learner(
        &self,
        instruction: Record,
        ctx: &ClientContext<'_>,
    ) -> Result<Record> {
        let stage = Self::stage_of(&instruction)?;
        if stage == DONE {
            return Ok(Record::default());
        }
        let fused = fused_from(&instruction)?;
        // A split that stays the same across rounds, so every layer's balls are measured on
        // the same validation data.
        let mut split_rng = StdRng::seed_from_u64(derive_seed(self.seed, 0, ctx.id));
        let (train, val) = holdout(
            &ctx.data.train,
            self.settings.validation_fraction,
            &mut split_rng,
        )
        .map_err(|e| FedError::BadReply {
            client: ctx.id,
            reason: e.to_string(),
        })?;
        if train.is_empty() || val.is_empty() {
            return Err(FedError::BadReply {
                client: ctx.id,
                reason: format!(
                    "{} training samples cannot be split into training and validation data",
                    ctx.data.train.len()
                ),
            });
        }
        let train = hidden_features(&fused, &train)?;
        let val = hidden_features(&fused, &val)?;
        let classes = self.spec.classes();
        let d = train.dim();
        let mut rng = StdRng::seed_from_u64(ctx.seed);
        let mut reply = Record::default().with_num_examples(train.len() as u64);
        if stage == OUTPUT {
            let spec = ModelSpec::mlp(d, &[], classes);
            let trainer = Trainer::new(spec.clone())?;
            let start = init_params(&spec, self.init, ctx.seed);
            let cfg = TrainConfig {
                epochs: self.settings.output_epochs,
                ..ctx.train.clone()
            };
            let fitted = trainer.fit_with(&start, &train, &cfg, None, ctx.seed)?;
            let layer = mlp_layers(&fitted.params)?.remove(0);
            let centre = layer.flat();
            let axes = match self.settings.shape {
                Shape::Sphere if self.settings.fisher_prop >= 1.0 => None,
                shape => {
                    let fisher = softmax_fisher(&layer, &val.x, val.len(), &mut rng);
                    Some(fisher_axes(
                        &fisher,
                        self.settings.fisher_prop,
                        shape == Shape::Fisher,
                    )?)
                }
            };
            let eval = trainer.evaluate(&fitted.params, &val)?;
            let v = Validation {
                x: &val.x,
                y: &val.y,
            };
            let mut radii = Vec::new();
            for criterion in self
                .settings
                .output_criteria(ctx.id, (eval.loss, eval.accuracy))
            {
                let radius = search_radius(
                    &centre,
                    axes.as_deref(),
                    &self.settings.search(false),
                    self.settings.samples,
                    &mut rng,
                    |pts, n| Ok(output_layers_good(pts, n, classes, v, criterion)),
                )?;
                radii.push(radius as f32);
            }
            reply.params.push(CENTRES, vec![centre.len()], centre)?;
            reply.params.push(RADII, vec![radii.len()], radii)?;
            if let Some(a) = axes {
                reply.params.push(AXES, vec![a.len()], a)?;
            }
            reply.metrics.insert("val_accuracy".into(), eval.accuracy);
            reply.metrics.insert("val_loss".into(), eval.loss);
            reply.metrics.insert("train_loss".into(), fitted.loss);
            return Ok(reply);
        }
        let l = usize::try_from(stage)
            .ok()
            .filter(|&l| l < self.hidden.len() && l == fused.len())
            .ok_or_else(|| FedError::BadReply {
                client: ctx.id,
                reason: format!(
                    "stage {stage} with {} fused layers does not fit hidden widths {:?}",
                    fused.len(),
                    self.hidden
                ),
            })?;
        let spec = ModelSpec::mlp(d, &self.hidden[l..], classes);
        let trainer = Trainer::new(spec.clone())?;
        let start = init_params(&spec, self.init, ctx.seed);
        let fitted = trainer.fit_with(&start, &train, ctx.train, None, ctx.seed)?;
        let layers = mlp_layers(&fitted.params)?;
        let v = Validation {
            x: &val.x,
            y: &val.y,
        };
        let mut search = NeuronSearch::new(
            &layers[0],
            &layers[1..],
            v,
            self.settings.neuron_criterion(),
        )?;
        let joint = self.joint(l);
        if joint {
            search = search.with_outgoing()?;
        }
        let h = layers[0].out;
        let dim = search.dim();
        let mut centres = Vec::with_capacity(h * dim);
        let mut radii = Vec::with_capacity(h);
        for j in 0..h {
            let mut centre = layers[0].unit(j);
            if joint {
                centre.extend(Layer::outgoing(&layers[1], j));
            }
            let r = search_radius(
                &centre,
                None,
                &self.settings.search(true),
                self.settings.samples,
                &mut rng,
                |pts, n| Ok(search.all_good(j, pts, n)),
            )?;
            centres.extend_from_slice(&centre);
            radii.push(r as f32);
        }
        let eval = trainer.evaluate(&fitted.params, &val)?;
        reply.params.push(CENTRES, vec![h, dim], centres)?;
        reply.params.push(RADII, vec![h], radii)?;
        if joint {
            reply
                .params
                .push(OUTPUT_BIAS, vec![classes], layers[1].bias.clone())?;
        }
        reply.metrics.insert("val_accuracy".into(), eval.accuracy);
        reply.metrics.insert("val_loss".into(), eval.loss);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        Ok(reply)
    }
}
