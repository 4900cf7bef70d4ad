//! FedMedian (Yin et al. 2018), as Flower: unweighted coordinate-wise median. It is the hard-EM
//! server step under a Laplace prior (fedsparse-em, App. J.1): the server parameter that
//! maximises `sum_s log Laplace(w_s | theta, b)` is the coordinate-wise median of the `w_s`.

use fedfuse_core::Params;
use fedfuse_fuse::median_params;

use crate::{Aggregate, Method, Reply, Result};

/// FedMedian.
#[derive(Clone, Copy, Debug, Default)]
pub struct FedMedian;

impl Method for FedMedian {
    fn name(&self) -> &'static str {
        "fedmedian"
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
        let models: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
        Ok(Aggregate::Replace(median_params(&models)?))
    }
}
