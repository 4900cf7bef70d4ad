//! Round 1 without a shared starting point: every client draws its own initial weights, as
//! when pre-trained models are fused; later rounds run the wrapped method unchanged. The PFNM
//! papers' "FedAvg with separate inits" baseline is this around FedAvg.

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_train::{Init, init_params};

use crate::method::SERVER_ROUND;
use crate::{ClientContext, Method, Result};

/// A method whose clients start round 1 from their own initialisation.
pub struct SeparateInits {
    /// The method run every round.
    pub inner: Box<dyn Method>,
    /// How clients draw their own weights (seeded per client).
    pub init: Init,
}

impl Method for SeparateInits {
    crate::method::wraps_inner!();

    /// Round 1 sends no weights.
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        if round <= 1 {
            Ok(Record::default().with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
        } else {
            self.inner.instruct(round, client, global)
        }
    }

    fn fit(&self, mut instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        if instruction.params.is_empty() {
            instruction.params = init_params(ctx.trainer.spec(), self.init, ctx.seed);
        }
        self.inner.fit(instruction, ctx)
    }
}
