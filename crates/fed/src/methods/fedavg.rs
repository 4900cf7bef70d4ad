//! FedAvg (McMahan et al. 2017), as Flower: mean of client models weighted by `num_examples`.
//! In the hierarchical-model view (fedsparse-em) it is the hard-EM server step under a
//! Gaussian prior.

use fedfuse_core::Params;
use fedfuse_fuse::{WeightedSum, weighted_mean_params};

use crate::{Aggregate, Fold, Method, Reply, Result};

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

/// The same mean as a running sum (bounded memory over many clients).
pub(crate) struct MeanFold(WeightedSum);

impl MeanFold {
    pub(crate) fn boxed() -> Box<dyn Fold> {
        Box::new(Self(WeightedSum::new()))
    }
}

impl Fold for MeanFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        Ok(self
            .0
            .add(&reply.record.params, reply.record.num_examples as f64)?)
    }

    fn finish(self: Box<Self>, _round: usize, _global: &Params) -> Result<Aggregate> {
        Ok(Aggregate::Replace(self.0.mean()?))
    }
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

    fn fold(&self) -> Option<Box<dyn Fold>> {
        Some(MeanFold::boxed())
    }
}
