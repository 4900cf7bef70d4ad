//! FedAvg (McMahan et al. 2017), as Flower: mean of client models weighted by `num_examples`.
//! In the hierarchical-model view (fedsparse-em) it is the hard-EM server step under a
//! Gaussian prior.

use fedfuse_core::Params;
use fedfuse_fuse::{WeightedSum, weighted_mean_params};
use serde::{Deserialize, Serialize};

use super::{BuildContext, SeparateInits};
use crate::{Aggregate, Fold, Method, Reply, Result};

/// FedAvg's settings (`[method] name = "fedavg"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedAvgSettings {
    /// Clients start round 1 from their own initialisations instead of a common one
    /// (the PFNM papers' "FedAvg, separate inits" baseline).
    #[serde(default, skip_serializing_if = "is_false")]
    pub separate_inits: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl FedAvgSettings {
    /// FedAvg, or FedAvg whose clients start from their own `ctx.init` weights.
    pub fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Method>> {
        Ok(if self.separate_inits {
            Box::new(SeparateInits {
                inner: Box::new(FedAvg),
                init: ctx.init,
            })
        } else {
            Box::new(FedAvg)
        })
    }
}

/// FedAvg.
#[derive(Clone, Copy, Debug, Default)]
pub struct FedAvg;

/// The same mean as a running sum (bounded memory over many clients).
struct MeanFold(WeightedSum);

impl Fold for MeanFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        let weight = reply.record.num_examples as f64;
        Ok(self.0.add(&reply.record.params, weight)?)
    }

    fn finish(self: Box<Self>, _round: usize, _global: &Params) -> Result<Aggregate> {
        Ok(Aggregate::Replace(self.0.mean()?))
    }
}

impl Method for FedAvg {
    fn name(&self) -> &'static str {
        "fedavg"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<(&Params, f64)> = replies
            .iter()
            .map(|r| (&r.record.params, r.record.num_examples as f64))
            .collect();
        Ok(Aggregate::Replace(weighted_mean_params(&models)?))
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        Some(Box::new(MeanFold(WeightedSum::new())))
    }
}
