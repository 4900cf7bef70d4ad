//! FedAvg (McMahan et al. 2017), as Flower: mean of client models weighted by `num_examples`.
//! In the hierarchical-model view (fedsparse-em) it is the hard-EM server step under a
//! Gaussian prior.

use fedfuse_core::Params;
use fedfuse_fuse::weighted_mean_params;

use crate::{Aggregate, Method, Reply, Result};

/// FedAvg.
#[derive(Clone, Copy, Debug, Default)]
pub struct FedAvg;

/// Example-weighted mean of the replies' parameters, shared by FedAvg and FedProx.
pub(crate) fn example_weighted_mean(replies: &[Reply]) -> Result<Aggregate> {
    let models: Vec<(&Params, f64)> = replies
        .iter()
        .map(|r| (&r.record.params, r.record.num_examples as f64))
        .collect();
    Ok(Aggregate::Replace(weighted_mean_params(&models)?))
}

impl Method for FedAvg {
    fn name(&self) -> &'static str {
        "fedavg"
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        example_weighted_mean(replies)
    }
}
