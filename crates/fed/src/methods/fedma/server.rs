//! The FedMA server: what each stage sends, the matching of each layer over the clients'
//! replies, and the last stage's average that completes the global model.

use fedfuse_core::layers::{LayerSpec, TensorRole};
use fedfuse_core::{ConfigValue, ParamShape, Params, Record, Tensor};
use fedfuse_fuse::{RngOrder, at_group_widths, pfnm_match_layer};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{ASSIGN, FedMa, STAGE};
use crate::method::SERVER_ROUND;
use crate::methods::pfnm::replies_class_counts;
use crate::{Aggregate, FedError, Reply, Result, derive_seed};

impl FedMa {
    pub(super) fn instruction(
        &self,
        round: usize,
        client: usize,
        global: &Params,
    ) -> Result<Record> {
        let stage = self.progress.stage;
        let record = if stage == 0 {
            if self.progress.passes == 0 {
                Record::default()
            } else {
                Record::from_params(
                    self.view
                        .part(global, self.progress.last.get(&client).map(Vec::as_slice))?,
                )
            }
        } else {
            let mut layer = Params::new();
            for name in self.stage_names(stage - 1) {
                let t = self.built.require(name)?;
                layer.push(name, t.shape.clone(), t.data.clone())?;
            }
            let mut record = Record::from_params(layer);
            if let Some(a) = self
                .progress
                .current
                .get(&client)
                .and_then(|a| a.get(stage - 1))
            {
                // Fused-unit indices travel as f32, exact below 2^24 (a fused layer is far
                // narrower: its weights hold at most 2^31 values).
                let units = a.iter().map(|&u| u as f32).collect();
                record.params.push(ASSIGN, vec![a.len()], units)?;
            }
            record
        };
        Ok(record
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64))
            .with_config(STAGE, ConfigValue::Int(stage as i64)))
    }

    /// Each replying client's whole model as matching reads it at `stage < M`: the fused
    /// layers below, its reply's tensors, zeros for what it did not send (the matcher reads
    /// none of them).
    pub(super) fn padded(&self, reply: &Reply, stage: usize) -> Result<Params> {
        let bad = |reason: String| FedError::BadReply {
            client: reply.client,
            reason,
        };
        let rows = self
            .group_width(&reply.record.params, stage)
            .ok_or_else(|| {
                bad(format!(
                    "FedMA stage {stage}: no weight of the matched group among {:?}",
                    reply.record.params.names()
                ))
            })?;
        let layers = self.layers_at(&self.progress.widths, Some(rows));
        let layout = self.view.layout(&layers).map_err(|e| bad(e.to_string()))?;
        let sent = self.sent_names(&layout, stage);
        let names: Vec<&str> = reply.record.params.iter().map(|(n, _)| n).collect();
        if names != sent.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(bad(format!(
                "FedMA stage {stage} expects tensors {sent:?}, got {names:?}"
            )));
        }
        let mut out = Params::new();
        for s in layout {
            let t = match reply.record.params.get(&s.name) {
                Some(t) => t.clone(),
                None => match self.built.get(&s.name) {
                    Some(t) => t.clone(),
                    None => Tensor::new(
                        &s.name,
                        s.shape.clone(),
                        vec![0.0; s.shape.iter().product()],
                    )?,
                },
            };
            if t.shape != s.shape {
                return Err(bad(format!(
                    "FedMA stage {stage}: tensor `{}` has shape {:?} where {:?} fits",
                    s.name, t.shape, s.shape
                )));
            }
            out.push(s.name, t.shape, t.data)?;
        }
        out.check_finite()?;
        Ok(out)
    }

    /// The last stage: output rows weighted by each client's count of their class, every
    /// other tensor sent by examples; with the fused layers, the global model.
    pub(super) fn complete(&self, replies: &[Reply]) -> Result<Params> {
        let layers = self.layers_at(&self.progress.widths, None);
        let layout = self.view.layout(&layers)?;
        let sent = self.sent_names(&layout, self.view.matched);
        let classes = self.layers_classes(&layout);
        let counts = replies_class_counts(replies, classes)?;
        let examples: Vec<f64> = replies
            .iter()
            .map(|r| r.record.num_examples as f64)
            .collect();
        let out_names = [
            format!("{}.weight", self.view.output),
            format!("{}.bias", self.view.output),
        ];
        let mut global = Params::new();
        for s in &layout {
            if !sent.contains(&s.name) {
                let t = self.built.require(&s.name)?;
                global.push(s.name.clone(), t.shape.clone(), t.data.clone())?;
                continue;
            }
            let mut sum = vec![0.0f64; s.shape.iter().product()];
            let rows = if out_names.contains(&s.name) {
                classes
            } else {
                1
            };
            let span = sum.len() / rows.max(1);
            // A class no client holds is weighted by examples, as every other tensor.
            let weight = |j: usize, k: usize| {
                let held = rows > 1 && counts.iter().any(|c| c[k] > 0.0);
                if held { counts[j][k] } else { examples[j] }
            };
            let mut total = vec![0.0f64; rows];
            for (j, r) in replies.iter().enumerate() {
                let t = r.record.params.require(&s.name)?;
                if t.shape != s.shape {
                    return Err(FedError::BadReply {
                        client: r.client,
                        reason: format!(
                            "FedMA's last stage: tensor `{}` has shape {:?} where {:?} fits",
                            s.name, t.shape, s.shape
                        ),
                    });
                }
                for (k, chunk) in sum.chunks_mut(span).enumerate() {
                    let w = weight(j, k);
                    total[k] += w;
                    for (acc, v) in chunk.iter_mut().zip(&t.data[k * span..]) {
                        *acc += w * f64::from(*v);
                    }
                }
            }
            let counter = TensorRole::of(&s.name) == TensorRole::Counter;
            let data = sum
                .chunks(span)
                .zip(&total)
                .flat_map(|(chunk, &w)| {
                    chunk.iter().map(move |v| {
                        let m = if w > 0.0 { v / w } else { 0.0 };
                        if counter { m.round() as f32 } else { m as f32 }
                    })
                })
                .collect();
            global.push(s.name.clone(), s.shape.clone(), data)?;
        }
        Ok(global)
    }

    /// The list with the groups below at `fused` widths, the next at `next` rows (when given)
    /// and the rest at the clients' widths.
    pub(super) fn layers_at(&self, fused: &[usize], next: Option<usize>) -> Vec<LayerSpec> {
        let widths: Vec<usize> = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, u)| match fused.get(g) {
                Some(&w) => w,
                None if g == fused.len() => next.unwrap_or(u.units),
                None => u.units,
            })
            .collect();
        at_group_widths(&self.view.layers, &self.groups, &widths)
    }

    pub(super) fn layers_classes(&self, layout: &[ParamShape]) -> usize {
        let name = format!("{}.weight", self.view.output);
        layout
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.shape.first().copied())
            .unwrap_or(0)
    }

    pub(super) fn advance(&mut self, stage_done: bool) {
        if !stage_done {
            // A stage nobody answered leaves the pass without a layer: start it again.
            self.progress.stage = 0;
            self.progress.widths.clear();
            self.progress.current.clear();
            self.built = Params::new();
            return;
        }
        if self.progress.stage == self.view.matched {
            self.progress.passes += 1;
            self.progress.stage = 0;
            self.progress.widths.clear();
            self.progress.last = std::mem::take(&mut self.progress.current);
            self.built = Params::new();
        } else {
            self.progress.stage += 1;
        }
    }

    /// The server step of the current stage over its replies.
    pub(super) fn aggregate_stage(&mut self, round: usize, replies: &[Reply]) -> Result<Aggregate> {
        let stage = self.progress.stage;
        self.report.clear();
        self.report
            .insert("pass".into(), (self.progress.passes + 1) as f64);
        self.report.insert("stage".into(), stage as f64);
        if stage == self.view.matched {
            let global = self.complete(replies)?;
            self.advance(true);
            return Ok(Aggregate::Replace(global));
        }
        let padded = replies
            .iter()
            .map(|r| self.padded(r, stage))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Params> = padded.iter().collect();
        let classes = self.layers_classes(&self.view.layout(&self.view.layers)?);
        let counts = replies_class_counts(replies, classes)?;
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let (layers, _) = self.view.at_widths(&padded[0])?;
        let m = pfnm_match_layer(
            &self.view.input,
            &layers,
            &refs,
            stage,
            Some(&counts),
            &self.settings.config(),
            &mut RngOrder(&mut rng),
        )?;
        for (name, t) in m.tensors.iter() {
            self.built.remove(name);
            self.built.push(name, t.shape.clone(), t.data.clone())?;
        }
        for (slot, reply) in replies.iter().enumerate() {
            let entry = self.progress.current.entry(reply.client).or_default();
            entry.truncate(stage);
            entry.resize(stage, Vec::new());
            entry.push(m.assignments[slot].clone());
        }
        self.progress.widths.truncate(stage);
        self.progress.widths.push(m.width);
        self.report.insert(format!("width.{stage}"), m.width as f64);
        self.advance(true);
        Ok(Aggregate::Keep)
    }
}
