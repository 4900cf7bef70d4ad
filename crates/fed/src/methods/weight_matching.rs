//! Weight matching (Ainsworth et al., "Git Re-Basin", 2023) as a federated method
//! (`[method] name = "weight-matching"`): the data-free fixed-width baseline of the matching
//! methods. Round 1: every client trains from its own initialisation (as PFNM's clients do);
//! the server aligns every reply to the first by one permutation per permutation group (a
//! layer's units, a block's inner channels, or a residual stage's whole stream)
//! ([`weight_matching_fuse`]) and averages, example-weighted. Later rounds: clients train from
//! the global model and the server aligns and averages again (near the identity once they
//! share a start, so it is FedAvg with a guard against permuted replies).

use fedfuse_core::{ConfigValue, ModelSpec, Params, Record};
use fedfuse_fuse::{WeightMatchingConfig, weight_matching_fuse};
use fedfuse_train::Init;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::list_view::ListView;
use super::pfnm::{own_init_fit, replies_class_counts};
use super::{BuildContext, in_method};
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, Method, Reply, Result, derive_seed};

/// Weight matching's settings check, and the method for `ctx`'s model.
pub(crate) fn build(cfg: &WeightMatchingConfig, ctx: &BuildContext) -> Result<WeightMatching> {
    cfg.check().map_err(in_method)?;
    let spec = ctx.spec("weight matching needs the clients' architecture")?;
    Ok(WeightMatching {
        config: cfg.clone(),
        view: ListView::fixed(spec)?,
        spec: spec.clone(),
        init: ctx.init,
        seed: ctx.seed,
    })
}

/// Weight matching (see the module docs).
pub struct WeightMatching {
    config: WeightMatchingConfig,
    view: ListView,
    spec: ModelSpec,
    init: Init,
    seed: u64,
}

impl Method for WeightMatching {
    fn name(&self) -> &'static str {
        "weight-matching"
    }

    /// Round 1: only the round number (clients start from their own initialisation).
    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let record = if round <= 1 {
            Record::default()
        } else {
            Record::from_params(global.clone())
        };
        Ok(record.with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        own_init_fit(instruction, ctx, self.init)
    }

    fn aggregate(
        &mut self,
        round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let counts = replies_class_counts(replies, self.spec.classes())?;
        let listed = replies
            .iter()
            .map(|r| self.view.listed(&r.record.params))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&Params> = listed.iter().collect();
        let mut rng = StdRng::seed_from_u64(derive_seed(self.seed, round, usize::MAX));
        let fused = weight_matching_fuse(
            &self.view.input,
            &self.view.layers,
            &refs,
            Some(&counts),
            &self.config,
            &mut rng,
        )?;
        Ok(Aggregate::Replace(self.view.native(&fused.params)?))
    }

    /// Nothing but the global model carries over.
    fn stateless(&self) -> bool {
        true
    }
}
