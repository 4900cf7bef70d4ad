//! GEMS's server state in a checkpoint: the fused layers, the stage, every output ball kept.

use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, Params, Record};

use crate::{FedError, Result};

use super::{DONE, Gems, OUTPUT, OutputBall, STAGE, fused_from};

impl Gems {
    /// The server state after a stage: fused layers, stage, output attempts and every output
    /// ball kept (radii as f64 metrics, so a resumed intersection is bit-identical), and the
    /// untuned model once fine-tuned.
    pub(super) fn state(&self) -> Result<Record> {
        let mut state = self.fused_record()?;
        state
            .config
            .insert(STAGE.into(), ConfigValue::Int(self.stage));
        state
            .config
            .insert("attempts".into(), ConfigValue::Int(self.attempts as i64));
        for (client, balls) in &self.output_balls {
            state.config.insert(
                format!("balls.{client}"),
                ConfigValue::Int(balls.len() as i64),
            );
            for (k, ball) in balls.iter().enumerate() {
                let key = format!("ball.{client}.{k}");
                let len = ball.centre.len();
                state
                    .params
                    .push(format!("{key}.centre"), vec![len], ball.centre.clone())?;
                if let Some(axes) = &ball.axes {
                    state
                        .params
                        .push(format!("{key}.axes"), vec![axes.len()], axes.clone())?;
                }
                for (j, r) in ball.radii.iter().enumerate() {
                    state.metrics.insert(format!("{key}.radius.{j}"), *r);
                }
            }
        }
        if let Some(untuned) = &self.untuned {
            for (name, t) in untuned.iter() {
                state
                    .params
                    .push(format!("untuned.{name}"), t.shape.clone(), t.data.clone())?;
            }
        }
        Ok(state)
    }

    /// Restores [`Gems::state`], checking that the stage and the fused layers agree with this
    /// run's architecture.
    pub(super) fn restore(&mut self, state: &Record) -> Result<()> {
        let bad = |why: String| FedError::BadMessage {
            from: "checkpoint".into(),
            reason: format!("GEMS state: {why}"),
        };
        let int = |key: &str| match state.config.get(key) {
            Some(ConfigValue::Int(v)) => Ok(*v),
            _ => Err(bad(format!("no integer `{key}`"))),
        };
        let stage = int(STAGE)?;
        let fused = fused_from(state)?;
        let layers_done = match stage {
            OUTPUT | DONE => self.hidden.len(),
            l if (0..self.hidden.len() as i64).contains(&l) => l as usize,
            other => return Err(bad(format!("stage {other} is not one of this model's"))),
        };
        let widths_agree = fused.len() == layers_done
            && fused.first().is_none_or(|l| l.inp == self.spec.input_len());
        if !widths_agree {
            return Err(bad(format!(
                "{} fused layers at stage {stage}; this model needs {layers_done}",
                fused.len()
            )));
        }
        let attempts = usize::try_from(int("attempts")?).map_err(|e| bad(e.to_string()))?;
        let mut output_balls = BTreeMap::new();
        for (key, value) in &state.config {
            let Some(client) = key.strip_prefix("balls.") else {
                continue;
            };
            let client: usize = client.parse().map_err(|_| bad(format!("key `{key}`")))?;
            let count = match value {
                ConfigValue::Int(n) if (0..=attempts as i64).contains(n) => *n as usize,
                _ => return Err(bad(format!("`{key}` must count at most {attempts} balls"))),
            };
            let balls = (0..count)
                .map(|k| {
                    let key = format!("ball.{client}.{k}");
                    let radii = (0..self.settings.output_radii())
                        .map(|j| {
                            state
                                .metrics
                                .get(&format!("{key}.radius.{j}"))
                                .copied()
                                .ok_or_else(|| bad(format!("no `{key}.radius.{j}`")))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    Ok(OutputBall {
                        centre: state.params.require(&format!("{key}.centre"))?.data.clone(),
                        radii,
                        axes: state
                            .params
                            .get(&format!("{key}.axes"))
                            .map(|a| a.data.clone()),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            output_balls.insert(client, balls);
        }
        let mut untuned = Params::new();
        for (name, t) in state.params.iter() {
            if let Some(name) = name.strip_prefix("untuned.") {
                untuned.push(name, t.shape.clone(), t.data.clone())?;
            }
        }
        self.fused = fused;
        self.stage = stage;
        self.attempts = attempts;
        self.output_balls = output_balls;
        self.untuned = (!untuned.is_empty()).then_some(untuned);
        Ok(())
    }
}
