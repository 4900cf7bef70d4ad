//! PFNM (Yurochkin et al. 2019) as a one-shot federated method: every client trains from its
//! own random initialisation, sends its network and class counts once, and the server matches
//! hidden units across clients ([`fedfuse_fuse::pfnm_fuse`]); the global width may grow.

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fuse::{PfnmConfig, pfnm_fuse};
use fedfuse_train::{Init, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Method, Reply, Result, derive_seed};

/// Metric key prefix of a reply's per-class example counts (`class_count.3`).
const CLASS_COUNT: &str = "class_count.";

/// One-shot PFNM.
#[derive(Clone, Debug)]
pub struct Pfnm {
    /// Matching hyper-parameters.
    pub config: PfnmConfig,
    /// How clients draw their own starting weights.
    pub init: Init,
    /// Seed of the server's refinement order.
    pub seed: u64,
}

/// Writes per-class counts into a reply's metrics.
pub(crate) fn put_class_counts(record: &mut Record, counts: &[usize]) {
    for (k, c) in counts.iter().enumerate() {
        record
            .metrics
            .insert(format!("{CLASS_COUNT}{k}"), *c as f64);
    }
}

/// Reads per-class counts (`classes` of them) from a reply's metrics.
pub(crate) fn class_counts(reply: &Reply, classes: usize) -> Result<Vec<f64>> {
    (0..classes)
        .map(|k| {
            reply
                .record
                .metrics
                .get(&format!("{CLASS_COUNT}{k}"))
                .copied()
                .ok_or_else(|| FedError::BadReply {
                    client: reply.client,
                    reason: format!("no `{CLASS_COUNT}{k}` metric: PFNM needs class counts"),
                })
        })
        .collect()
}

impl Method for Pfnm {
    fn name(&self) -> &'static str {
        "pfnm"
    }

    /// Only the round: clients start from their own initialisation, so no weights go down.
    fn instruct(&self, round: usize, _client: usize, _global: &Params) -> Result<Record> {
        Ok(Record::default().with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    fn fit(&self, _instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let start = init_params(ctx.trainer.spec(), self.init, ctx.seed);
        let fitted = ctx
            .trainer
            .fit_with(&start, &ctx.data.train, ctx.train, None, ctx.seed)?;
        let mut reply =
            Record::from_params(fitted.params).with_num_examples(fitted.examples as u64);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        put_class_counts(&mut reply, &ctx.data.train.class_counts());
        Ok(reply)
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let classes = global.iter().last().map_or(0, |(_, bias)| bias.data.len());
        let counts = replies
            .iter()
            .map(|r| class_counts(r, classes))
            .collect::<Result<Vec<_>>>()?;
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let fused = pfnm_fuse(&models, Some(&counts), &self.config, &mut rng)?;
        Ok(Aggregate::Replace(fused.params))
    }
}
