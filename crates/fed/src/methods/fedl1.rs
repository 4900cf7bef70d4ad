//! FedL1, the group-sparsity baseline of fedsparse-em (Appendix A, eqs. 24-25): clients add a
//! group-L1 penalty `l1 * sum_g ||w_g||` (groups: hidden units and conv filters) to their loss;
//! both sides zero every group whose norm is at most `threshold` before they send (hard
//! thresholding, which the paper found better than soft), so uploads and downloads are sparse
//! records. The server averages as FedAvg.

use std::collections::BTreeMap;

use fedfuse_core::{ConfigValue, GroupLayout, ModelSpec, Params, Record};
use serde::{Deserialize, Serialize};

use super::{BuildContext, FedAvg};
use crate::method::SERVER_ROUND;
use crate::{Aggregate, ClientContext, FedError, Fold, Method, Reply, Result};

/// FedL1's settings (`[method] name = "fedl1"`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedL1Settings {
    /// Group-L1 coefficient.
    pub l1: f64,
    /// Groups with a norm at most this are zeroed before upload and download.
    pub threshold: f64,
}

impl FedL1Settings {
    /// Checks `l1` and `threshold`.
    pub fn check(&self) -> Result<()> {
        for (field, v) in [("l1", self.l1), ("threshold", self.threshold)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(FedError::MethodSetting {
                    field,
                    reason: format!("{v} is not a non-negative number"),
                });
            }
        }
        Ok(())
    }

    /// FedL1 for `ctx.spec` (settings checked by [`FedL1Settings::check`]).
    pub fn build(&self, ctx: &BuildContext) -> Result<FedL1> {
        FedL1::new(
            self.l1,
            self.threshold,
            ctx.spec("FedL1 needs the model's architecture")?,
        )
    }
}

/// Metric key of the number of all-zero groups in a reply.
const ZERO_GROUPS: &str = "zero_groups";

/// FedL1.
#[derive(Clone, Debug)]
pub struct FedL1 {
    /// Group-L1 coefficient.
    pub l1: f64,
    /// The architecture's groups.
    groups: GroupLayout,
    /// Groups with a norm at most this are zeroed before upload and download.
    pub threshold: f64,
    zero_groups: f64,
}

impl FedL1 {
    /// FedL1 for `spec`, with a non-negative `l1` and `threshold` ([`FedL1Settings::check`]).
    pub fn new(l1: f64, threshold: f64, spec: &ModelSpec) -> Result<Self> {
        Ok(Self {
            l1,
            groups: GroupLayout::of_model(spec),
            threshold,
            zero_groups: f64::NAN,
        })
    }
}

impl Method for FedL1 {
    fn name(&self) -> &'static str {
        "fedl1"
    }

    fn stateless(&self) -> bool {
        true
    }

    /// The global model with its small groups zeroed, sparse on the wire.
    fn instruct(&self, round: usize, _client: usize, global: &Params) -> Result<Record> {
        let mut params = global.clone();
        self.groups.hard_threshold(&mut params, self.threshold)?;
        Ok(Record::from_params(params)
            .with_sparse(true)
            .with_config(SERVER_ROUND, ConfigValue::Int(round as i64)))
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let fitted = ctx.trainer.fit_group_l1(
            &instruction.params,
            &ctx.data.train,
            ctx.train,
            self.l1,
            ctx.seed,
        )?;
        let mut params = fitted.params;
        let zero = ctx
            .trainer
            .groups()
            .hard_threshold(&mut params, self.threshold)?;
        let mut reply = Record::from_params(params)
            .with_num_examples(fitted.examples as u64)
            .with_sparse(true);
        reply.metrics.insert("train_loss".into(), fitted.loss);
        reply.metrics.insert(ZERO_GROUPS.into(), zero as f64);
        Ok(reply)
    }

    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        let zero: f64 = replies
            .iter()
            .filter_map(|r| r.record.metrics.get(ZERO_GROUPS))
            .sum();
        self.zero_groups = zero / replies.len().max(1) as f64;
        FedAvg.aggregate(round, global, replies)
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        BTreeMap::from([("upload_zero_groups".to_string(), self.zero_groups)])
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        // `aggregate` counts zero groups; the mean itself is FedAvg's.
        None
    }
}
