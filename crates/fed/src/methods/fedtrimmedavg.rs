//! FedTrimmedAvg (Yin et al. 2018), as Flower: coordinate-wise mean after cutting the
//! `floor(beta * n)` largest and smallest values.

use fedfuse_core::Params;
use fedfuse_fuse::trimmed_mean_params;

use crate::{Aggregate, Method, Reply, Result};

/// FedTrimmedAvg with trim fraction `beta`.
#[derive(Clone, Copy, Debug)]
pub struct FedTrimmedAvg {
    /// Fraction cut at each end, in [0, 0.5).
    pub beta: f64,
}

impl Method for FedTrimmedAvg {
    fn name(&self) -> &'static str {
        "fedtrimmedavg"
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        Ok(Aggregate::Replace(trimmed_mean_params(&models, self.beta)?))
    }
}
