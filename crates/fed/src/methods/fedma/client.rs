//! A FedMA client's stage: train the whole model (stage 0), or put in the layer just fused
//! and retrain the layers above it with everything matched so far frozen; reply with what the
//! server matches next.

use fedfuse_core::layers::TensorRole;
use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fuse::spread_units;
use fedfuse_train::init_params;

use super::{ASSIGN, FedMa, STAGE};
use crate::methods::pfnm::put_class_counts;
use crate::{ClientContext, FedError, Result};

fn bad_instruction(client: usize, reason: String) -> FedError {
    FedError::BadReply { client, reason }
}

/// The fused-unit indices an assignment tensor holds: whole, non-negative, exact in f32;
/// `None` when one is not (their range is checked against the fused width where they are
/// used).
fn unit_indices(values: &[f32]) -> Option<Vec<usize>> {
    const EXACT: f32 = (1u32 << 24) as f32;
    values
        .iter()
        .map(|&v| (v.fract() == 0.0 && (0.0..EXACT).contains(&v)).then_some(v as usize))
        .collect()
}

impl FedMa {
    pub(super) fn fit_stage(
        &self,
        mut instruction: Record,
        ctx: &ClientContext<'_>,
    ) -> Result<Record> {
        let stage = match instruction.config.get(STAGE) {
            Some(ConfigValue::Int(s)) if *s >= 0 && (*s as usize) <= self.view.matched => {
                *s as usize
            }
            _ => {
                return Err(bad_instruction(
                    ctx.id,
                    format!("a FedMA instruction without a valid `{STAGE}`"),
                ));
            }
        };
        if stage == 0 {
            let start = if instruction.params.is_empty() {
                self.view
                    .listed(&init_params(ctx.trainer.spec(), self.init, ctx.seed))?
            } else {
                instruction.params
            };
            let trainer = self.view.trainer_for(&start)?;
            let fitted = trainer.fit_with(&start, &ctx.data.train, ctx.train, None, ctx.seed)?;
            let reply = self.reply(&fitted.params, 0, ctx, fitted.loss)?;
            self.store()?.insert(ctx.id, fitted.params);
            return Ok(reply);
        }
        let Some(assign) = instruction.params.remove(ASSIGN) else {
            return Err(bad_instruction(
                ctx.id,
                format!(
                    "it was not matched at layer {} of this FedMA pass (not sampled, or its \
                     reply was rejected); it takes part again from the next pass",
                    stage - 1
                ),
            ));
        };
        let assign = unit_indices(&assign.data).ok_or_else(|| {
            bad_instruction(
                ctx.id,
                format!("FedMA assignment `{ASSIGN}` holds a value that is no unit index"),
            )
        })?;
        let Some(mut model) = self.store()?.get(&ctx.id).cloned() else {
            return Err(bad_instruction(
                ctx.id,
                "it holds no model of this FedMA pass (it missed its first stage)".into(),
            ));
        };
        let (_, uses) = self.view.at_widths(&model)?;
        let g = stage - 1;
        let width = self.group_width(&instruction.params, g).unwrap_or(0);
        spread_units(&mut model, &uses[g], &assign, width)?;
        for (name, t) in instruction.params.iter() {
            let slot = model.get_mut(name).ok_or_else(|| {
                bad_instruction(
                    ctx.id,
                    format!("the fused group holds `{name}`, no tensor of the model"),
                )
            })?;
            if slot.shape != t.shape {
                return Err(bad_instruction(
                    ctx.id,
                    format!(
                        "the fused `{name}` has shape {:?} where the model laid over the fused \
                         units has {:?}",
                        t.shape, slot.shape
                    ),
                ));
            }
            *slot = t.clone();
        }
        let (layers, _) = self.view.at_widths(&model)?;
        model.check_layout(&self.view.layout(&layers)?)?;
        let frozen: Vec<String> = self.stages[..stage]
            .iter()
            .flatten()
            .filter(|n| TensorRole::of(n) == TensorRole::Param)
            .cloned()
            .collect();
        let trainer = self.view.trainer_for(&model)?;
        let fitted = trainer.fit_frozen(&model, &frozen, &ctx.data.train, ctx.train, ctx.seed)?;
        let reply = self.reply(&fitted.params, stage, ctx, fitted.loss)?;
        self.store()?.insert(ctx.id, fitted.params);
        Ok(reply)
    }

    /// The reply of `stage`: the tensors the server needs, the counts, the loss.
    pub(super) fn reply(
        &self,
        model: &Params,
        stage: usize,
        ctx: &ClientContext<'_>,
        loss: f64,
    ) -> Result<Record> {
        let (layers, _) = self.view.at_widths(model)?;
        let layout = self.view.layout(&layers)?;
        let mut out = Params::new();
        for name in self.sent_names(&layout, stage) {
            let t = model.require(&name)?;
            out.push(name, t.shape.clone(), t.data.clone())?;
        }
        let mut reply = Record::from_params(out).with_num_examples(ctx.data.train.len() as u64);
        reply.metrics.insert("train_loss".into(), loss);
        put_class_counts(&mut reply, &ctx.data.train.class_counts());
        Ok(reply)
    }
}
