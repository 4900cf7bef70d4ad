//! The GEMS server: what each stage sends, the checks on replies, merging hidden neurons and
//! intersecting the output-layer balls.

use std::collections::BTreeMap;
use std::sync::Arc;

use fedfuse_core::{ConfigValue, ModelSpec, Params, Record};
use fedfuse_data::Dataset;
use fedfuse_fuse::FuseError;
use fedfuse_fuse::gems::dense::{Layer, layers_to_params};
use fedfuse_fuse::gems::{
    Ball, IntersectConfig, MergedUnit, NeuronBall, intersect_balls, merge_neurons,
};
use fedfuse_train::{Init, Trainer};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

use super::{
    AXES, CENTRES, DONE, Gems, GemsSettings, NeuronSpace, OUTPUT, OUTPUT_BIAS, OutputBall, RADII,
    STAGE, finetune_output_layer,
};

impl Gems {
    /// GEMS with checked `settings` ([`GemsSettings::check`]) for clients of architecture
    /// `spec` (an MLP with a hidden layer); `public` is the server's public set for
    /// fine-tuning.
    pub fn new(
        settings: GemsSettings,
        spec: ModelSpec,
        init: Init,
        seed: u64,
        public: Option<Arc<Dataset>>,
    ) -> Result<Self> {
        let Some(widths) = spec.mlp_widths() else {
            return Err(FedError::InvalidSetting {
                field: "model.kind",
                reason: "GEMS fuses MLPs (neuron balls need dense layers); use kind = \"mlp\""
                    .into(),
            });
        };
        let hidden = widths[1..widths.len() - 1].to_vec();
        if settings.finetune_samples > 0 && public.as_ref().is_none_or(|p| p.is_empty()) {
            return Err(FedError::MethodSetting {
                field: "finetune_samples",
                reason: "fine-tuning needs public data on the server; set \
                         dataset.validation_fraction (e.g. 0.05) or finetune_samples = 0"
                    .into(),
            });
        }
        if hidden.is_empty() && settings.neuron_space == NeuronSpace::IncomingOutgoing {
            return Err(FedError::MethodSetting {
                field: "neuron_space",
                reason: "\"incoming-outgoing\" shapes hidden neurons' balls, and this model has \
                         no hidden layer; leave neuron_space out"
                    .into(),
            });
        }
        let stage = if hidden.is_empty() { OUTPUT } else { 0 };
        Ok(Self {
            settings,
            spec,
            hidden,
            init,
            seed,
            public,
            fused: Vec::new(),
            stage,
            output_balls: BTreeMap::new(),
            attempts: 0,
            untuned: None,
            report: BTreeMap::new(),
        })
    }

    /// Whether hidden stage `l`'s balls carry outgoing weights (and complete the model).
    pub(super) fn joint(&self, l: usize) -> bool {
        self.settings.neuron_space == NeuronSpace::IncomingOutgoing && l + 1 == self.hidden.len()
    }

    /// The output layer the last hidden layer's merged neurons carry in the joint space:
    /// column `u` is unit `u`'s outgoing weights (a pair's intersection centre, or a lone
    /// neuron's own); the bias is the learners' example-weighted mean.
    pub(super) fn carried_output_layer(
        &self,
        units: &[MergedUnit],
        d: usize,
        replies: &[Reply],
    ) -> Result<Layer> {
        let classes = self.spec.classes();
        let width = units.len();
        let mut weight = vec![0f32; classes * width];
        for (u, unit) in units.iter().enumerate() {
            for (k, &w) in unit.weights[d + 1..].iter().enumerate() {
                weight[k * width + u] = w;
            }
        }
        let total: f64 = replies.iter().map(|r| r.record.num_examples as f64).sum();
        let mut bias = vec![0f64; classes];
        for r in replies {
            // Equal weights when no learner reports its size.
            let share = if total > 0.0 {
                r.record.num_examples as f64 / total
            } else {
                1.0 / replies.len() as f64
            };
            let b = r.record.params.require(OUTPUT_BIAS)?;
            bias.iter_mut()
                .zip(&b.data)
                .for_each(|(m, &v)| *m += share * f64::from(v));
        }
        Ok(Layer {
            weight,
            bias: bias.into_iter().map(|v| v as f32).collect(),
            out: classes,
            inp: width,
        })
    }

    /// The model from the fused hidden layers and `output`, fine-tuned when asked to (the
    /// untuned one kept for the report); GEMS is then done.
    pub(super) fn complete(&mut self, output: Layer, round: usize) -> Result<Params> {
        let mut layers = self.fused.clone();
        layers.push(output);
        let gems = layers_to_params(&layers)?;
        let global = match (&self.public, self.settings.finetune_samples) {
            (Some(public), n) if n > 0 => {
                let tuned = finetune_output_layer(
                    &gems,
                    public,
                    n,
                    self.settings.finetune_epochs,
                    self.settings.finetune_lr,
                    derive_seed(self.seed, round, usize::MAX - 1),
                )?;
                self.untuned = Some(gems);
                tuned
            }
            _ => gems,
        };
        self.stage = DONE;
        for (i, l) in self.fused.iter().enumerate() {
            self.report.insert(format!("width.{i}"), l.out as f64);
        }
        Ok(global)
    }

    pub(super) fn stage_of(record: &Record) -> Result<i64> {
        match record.config.get(STAGE) {
            Some(ConfigValue::Int(s)) => Ok(*s),
            _ => Err(FedError::InvalidSetting {
                field: "gems_stage",
                reason: "the instruction carries no GEMS stage".into(),
            }),
        }
    }

    /// The fused hidden layers as `fused.{i}.weight` / `fused.{i}.bias` (what the clients
    /// build on, and part of the server's state).
    pub(super) fn fused_record(&self) -> Result<Record> {
        let mut record = Record::default();
        for (i, l) in self.fused.iter().enumerate() {
            record.params.push(
                format!("fused.{i}.weight"),
                vec![l.out, l.inp],
                l.weight.clone(),
            )?;
            record
                .params
                .push(format!("fused.{i}.bias"), vec![l.out], l.bias.clone())?;
        }
        Ok(record)
    }

    /// A point in one ball per client, and the threshold it was found at: the tightest
    /// threshold first; at each, the newest attempt's balls first, then other combinations of
    /// earlier attempts (at most 256).
    pub(super) fn intersect_output(&self) -> Result<(Vec<f32>, usize)> {
        let mut last_err = None;
        for k in 0..self.settings.output_radii() {
            match self.intersect_output_at(k) {
                Ok(point) => return Ok((point, k)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| FuseError::Empty.into()))
    }

    pub(super) fn intersect_output_at(&self, k: usize) -> Result<Vec<f32>> {
        let clients: Vec<&Vec<OutputBall>> = self.output_balls.values().collect();
        let cfg = IntersectConfig::default();
        let mut last_err = None;
        let total: usize = clients.iter().map(|b| b.len()).product();
        for combo in 0..total.min(256) {
            // Mixed-radix index, newest attempt first.
            let mut rest = combo;
            let chosen: Vec<Ball> = clients
                .iter()
                .map(|balls| {
                    let pick = balls.len() - 1 - rest % balls.len();
                    rest /= balls.len();
                    balls[pick].at(k)
                })
                .collect();
            let chosen: Vec<&Ball> = chosen.iter().collect();
            match intersect_balls(&chosen, &cfg) {
                Ok(point) => return Ok(point),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(FuseError::Empty).into())
    }
}

impl Method for Gems {
    fn name(&self) -> &'static str {
        "gems"
    }

    fn instruct(&self, round: usize, _client: usize, _global: &Params) -> Result<Record> {
        Ok(self
            .fused_record()?
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
            .with_config(STAGE, ConfigValue::Int(self.stage)))
    }

    fn save_state(&self) -> Option<Result<Record>> {
        Some(self.state())
    }

    fn load_state(&mut self, state: Record) -> Result<()> {
        self.restore(&state)
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        self.fit_learner(instruction, ctx)
    }

    fn check_reply(&self, _global: &Params, reply: &Record) -> Result<()> {
        if self.stage == DONE {
            return Ok(());
        }
        reply.params.check_finite()?;
        let bad = |reason: String| {
            Err(FedError::InvalidReply {
                method: "gems",
                reason,
            })
        };
        let (Some(c), Some(r)) = (reply.params.get(CENTRES), reply.params.get(RADII)) else {
            return bad("a GEMS reply needs `centres` and `radii`".into());
        };
        let d = self.fused.last().map_or(self.spec.input_len(), |l| l.out);
        let (rows, cols) = if self.stage == OUTPUT {
            (1, self.spec.classes() * (d + 1))
        } else {
            let l = self.stage as usize;
            let outgoing = if self.joint(l) {
                self.spec.classes()
            } else {
                0
            };
            (self.hidden[l], d + 1 + outgoing)
        };
        let hidden_layout_wrong = self.stage != OUTPUT && c.shape != [rows, cols];
        let radii = if self.stage == OUTPUT {
            self.settings.output_radii()
        } else {
            rows
        };
        if c.data.len() != rows * cols || r.data.len() != radii || hidden_layout_wrong {
            return bad(format!(
                "{} centre values and {} radii; stage {} expects {rows} x {cols} and {radii}",
                c.data.len(),
                r.data.len(),
                self.stage
            ));
        }
        if r.data.iter().any(|&x| x < 0.0) {
            return bad("a negative radius".into());
        }
        if self.stage != OUTPUT && self.joint(self.stage as usize) {
            let classes = self.spec.classes();
            match reply.params.get(OUTPUT_BIAS) {
                Some(b) if b.data.len() == classes => {}
                _ => {
                    return bad(format!(
                        "the last hidden layer's reply in the joint neuron space needs \
                         `{OUTPUT_BIAS}` of {classes} values"
                    ));
                }
            }
        }
        if let Some(a) = reply.params.get(AXES)
            && a.data.len() != cols
        {
            return bad(format!("{} axes for {cols} coordinates", a.data.len()));
        }
        Ok(())
    }

    fn aggregate(
        &mut self,
        round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        self.report.clear();
        if self.stage == DONE {
            return Ok(Aggregate::Keep);
        }
        let get = |r: &Reply, name: &str| -> Result<Vec<f32>> {
            Ok(r.record.params.require(name)?.data.clone())
        };
        if self.stage == OUTPUT {
            for r in replies {
                let ball = OutputBall {
                    centre: get(r, CENTRES)?,
                    radii: get(r, RADII)?.into_iter().map(f64::from).collect(),
                    axes: r.record.params.get(AXES).map(|a| a.data.clone()),
                };
                self.output_balls.entry(r.client).or_default().push(ball);
            }
            self.attempts += 1;
            let (point, k) = match self.intersect_output() {
                Ok(p) => p,
                Err(_) if self.attempts <= self.settings.max_retries => {
                    self.report.insert("retry".into(), self.attempts as f64);
                    self.report.insert("intersected".into(), 0.0);
                    return Ok(Aggregate::Keep);
                }
                Err(e) => return Err(e),
            };
            let d = self.fused.last().map_or(self.spec.input_len(), |l| l.out);
            let output = Layer::from_flat(&point, self.spec.classes(), d)?;
            let global = self.complete(output, round)?;
            self.report.insert("intersected".into(), 1.0);
            self.report.insert("attempts".into(), self.attempts as f64);
            if self.settings.epsilon.is_none() {
                self.report
                    .insert("epsilon_scale".into(), self.settings.epsilon_scales[k]);
            }
            let radii: Vec<f64> = self
                .output_balls
                .values()
                .filter_map(|b| b.last())
                .map(|b| b.radii[k])
                .collect();
            self.report.insert(
                "output_radius_mean".into(),
                radii.iter().sum::<f64>() / radii.len().max(1) as f64,
            );
            return Ok(Aggregate::Replace(global));
        }
        // A hidden layer.
        let l = self.stage as usize;
        let mut neurons = Vec::new();
        for r in replies {
            let centres = r.record.params.require(CENTRES)?;
            let radii = get(r, RADII)?;
            // `check_reply` fixed the layout: one row per neuron.
            let cols = centres.shape[1];
            for (j, c) in centres.data.chunks_exact(cols).enumerate() {
                neurons.push(NeuronBall {
                    learner: r.client,
                    ball: Ball::sphere(c.to_vec(), f64::from(radii[j])),
                });
            }
        }
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let units = merge_neurons(
            &neurons,
            self.settings.clusters,
            &IntersectConfig::default(),
            &mut rng,
        );
        let d = self.fused.last().map_or(self.spec.input_len(), |x| x.out);
        let weights: Vec<Vec<f32>> = units.iter().map(|u| u.weights[..=d].to_vec()).collect();
        let merged = units.iter().filter(|u| u.members.len() > 1).count();
        let radii: Vec<f64> = neurons.iter().map(|n| n.ball.radius).collect();
        self.fused.push(Layer::from_units(&weights, d)?);
        self.report.insert(format!("width.{l}"), units.len() as f64);
        self.report
            .insert(format!("merged_units.{l}"), merged as f64);
        self.report.insert(
            format!("neuron_radius_mean.{l}"),
            radii.iter().sum::<f64>() / radii.len().max(1) as f64,
        );
        self.report.insert(
            format!("zero_radius.{l}"),
            radii.iter().filter(|&&r| r == 0.0).count() as f64,
        );
        if self.joint(l) {
            let output = self.carried_output_layer(&units, d, replies)?;
            return Ok(Aggregate::Replace(self.complete(output, round)?));
        }
        self.stage = if l + 1 < self.hidden.len() {
            (l + 1) as i64
        } else {
            OUTPUT
        };
        Ok(Aggregate::Keep)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.report.clone()
    }

    fn evaluate(&self, _trainer: &Trainer, test: &Dataset) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        if let Some(untuned) = &self.untuned {
            let trainer = Trainer::new(ModelSpec::infer_mlp(untuned)?)?;
            let eval = trainer.evaluate(untuned, test)?;
            out.insert("untuned_accuracy".into(), eval.accuracy);
            out.insert("untuned_loss".into(), eval.loss);
        }
        Ok(out)
    }

    fn finished(&self) -> bool {
        self.stage == DONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output_reply(client: usize, centre: f32, radius: f32) -> Reply {
        output_reply_at(client, centre, &[radius])
    }

    fn output_reply_at(client: usize, centre: f32, radii: &[f32]) -> Reply {
        let mut record = Record::default();
        record
            .params
            .push(CENTRES, vec![1, 8], vec![centre; 8])
            .expect("fills");
        record
            .params
            .push(RADII, vec![radii.len()], radii.to_vec())
            .expect("fills");
        Reply { client, record }
    }

    #[test]
    fn the_automatic_threshold_is_the_tightest_scale_at_which_the_regions_meet() {
        let settings = GemsSettings {
            epsilon_scales: vec![1.1, 2.0, 5.0],
            ..GemsSettings::default()
        };
        let mut gems = Gems::new(settings, ModelSpec::mlp(3, &[], 2), Init::Default, 0, None)
            .expect("valid settings");
        let global = Params::new();
        // Centres 1 apart in each of 8 coordinates (distance 2.83): radii 1 + 1 miss, 1.5 +
        // 1.5 meet, 4 + 4 meet too but are looser.
        let replies = [
            output_reply_at(0, 0.0, &[1.0, 1.5, 4.0]),
            output_reply_at(1, 1.0, &[1.0, 1.5, 4.0]),
        ];
        for r in &replies {
            gems.check_reply(&global, &r.record).expect("three radii");
        }
        assert!(
            gems.check_reply(&global, &output_reply(0, 0.0, 1.0).record)
                .is_err()
        );
        let Aggregate::Replace(fused) = gems.aggregate(1, &global, &replies).expect("meets") else {
            panic!("no model");
        };
        assert_eq!(gems.round_metrics()["epsilon_scale"], 2.0);
        let w = &fused.iter().next().expect("a layer").1.data;
        assert!(w.iter().all(|&v| v > 0.0 && v < 1.0), "{w:?}");
    }

    /// A learner's last-hidden-layer reply in the joint space: two neurons of
    /// `[w (2); b; w_out (2)]` with radius 0 (nothing merges), and its output bias.
    fn joint_reply(client: usize, examples: u64, base: f32, output_bias: [f32; 2]) -> Reply {
        let mut record = Record::default().with_num_examples(examples);
        let rows: Vec<f32> = (0..10).map(|i| base + i as f32).collect();
        record
            .params
            .push(CENTRES, vec![2, 5], rows)
            .expect("fills");
        record
            .params
            .push(RADII, vec![2], vec![0.0, 0.0])
            .expect("fills");
        record
            .params
            .push(OUTPUT_BIAS, vec![2], output_bias.to_vec())
            .expect("fills");
        Reply { client, record }
    }

    #[test]
    fn in_the_joint_space_the_neurons_carry_the_output_layer() {
        let settings = GemsSettings {
            neuron_space: NeuronSpace::IncomingOutgoing,
            ..GemsSettings::default()
        };
        let spec = ModelSpec::mlp(2, &[2], 2);
        let mut gems =
            Gems::new(settings.clone(), spec.clone(), Init::Default, 0, None).expect("valid");
        let global = Params::new();
        let replies = [
            joint_reply(0, 1, 0.0, [1.0, 2.0]),
            joint_reply(1, 3, 100.0, [5.0, -2.0]),
        ];
        for r in &replies {
            gems.check_reply(&global, &r.record).expect("joint layout");
        }
        let mut no_bias = replies[0].record.clone();
        no_bias.params.remove(OUTPUT_BIAS);
        assert!(gems.check_reply(&global, &no_bias).is_err());
        let Aggregate::Replace(model) = gems.aggregate(1, &global, &replies).expect("fuses") else {
            panic!("the joint space completes the model in one stage");
        };
        assert!(gems.finished());
        // Four lone neurons; the output layer's column u is neuron u's last two values.
        let hidden = model.require("layers.0.weight").expect("hidden");
        assert_eq!(hidden.shape, [4, 2]);
        assert_eq!(
            model.require("layers.0.bias").expect("bias").data,
            [2.0, 7.0, 102.0, 107.0]
        );
        let out = model.require("layers.1.weight").expect("output");
        assert_eq!(out.shape, [2, 4]);
        assert_eq!(out.data, [3.0, 8.0, 103.0, 108.0, 4.0, 9.0, 104.0, 109.0]);
        // Bias: examples 1 and 3 weigh (1, 2) and (5, -2).
        assert_eq!(
            model.require("layers.1.bias").expect("bias").data,
            [4.0, -1.0]
        );
        // A model with no hidden layer has no neurons to shape.
        assert!(Gems::new(settings, ModelSpec::mlp(2, &[], 2), Init::Default, 0, None).is_err());
    }

    #[test]
    fn output_balls_of_a_missed_attempt_survive_a_checkpoint() {
        let shallow = || {
            Gems::new(
                GemsSettings {
                    epsilon: Some(0.5),
                    ..GemsSettings::default()
                },
                ModelSpec::mlp(3, &[], 2),
                Init::Default,
                0,
                None,
            )
            .expect("valid settings")
        };
        let global = Params::new();
        let mut gems = shallow();
        // Two balls far apart: no common point, so the server keeps them and asks again.
        let missed = [output_reply(0, 0.0, 0.1), output_reply(1, 5.0, 0.1)];
        assert!(matches!(
            gems.aggregate(1, &global, &missed).expect("a retry"),
            Aggregate::Keep
        ));
        let saved = gems.save_state().expect("savable").expect("saved");
        let mut resumed = shallow();
        resumed.load_state(saved.clone()).expect("restores");
        let again = resumed.save_state().expect("savable").expect("saved");
        assert_eq!(again, saved);

        // Client 1's second ball meets client 0's first: only a server that kept the missed
        // attempt's balls finds the point, and both find the same one.
        let second = [output_reply(0, 9.0, 0.1), output_reply(1, 0.05, 0.1)];
        let point = |g: &mut Gems| match g.aggregate(2, &global, &second).expect("intersects") {
            Aggregate::Replace(p) => p,
            other => panic!("{other:?}"),
        };
        assert_eq!(point(&mut gems), point(&mut resumed));
        assert!(resumed.finished());
        let forgot = shallow().aggregate(2, &global, &second);
        assert!(forgot.is_ok_and(|a| matches!(a, Aggregate::Keep)));
    }

    #[test]
    fn a_hidden_reply_must_have_one_row_per_neuron() {
        let gems = Gems::new(
            GemsSettings::default(),
            ModelSpec::mlp(3, &[2], 2),
            Init::Default,
            0,
            None,
        )
        .expect("valid settings");
        let reply = |shape: Vec<usize>| {
            let mut r = Record::default();
            r.params.push(CENTRES, shape, vec![0.5; 8]).expect("fills");
            r.params.push(RADII, vec![2], vec![1.0; 2]).expect("fills");
            r
        };
        let global = Params::new();
        assert!(gems.check_reply(&global, &reply(vec![2, 4])).is_ok());
        // The right number of values in the wrong layout would misread the neurons.
        assert!(gems.check_reply(&global, &reply(vec![8])).is_err());
        assert!(gems.check_reply(&global, &reply(vec![4, 2])).is_err());
    }
}
