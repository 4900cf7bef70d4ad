//! Probabilistic federated neural matching (PFNM, Yurochkin et al. 2019).
//!
//! [`match_layer`] matches one layer's hidden units on plain matrices; [`pfnm_fuse`] and
//! [`pfnm_fuse_mlp`] run it over an MLP from the top hidden layer down. Behaviour follows the
//! reference code (IBM/probabilistic-federated-neural-matching `matching/pfnm.py` @ f44cf42)
//! and is checked against fixtures recorded from it.

mod layer;
mod mlp;

pub use layer::{
    ClientUnits, GlobalUnits, LayerMatch, LayerPrior, LayerSettings, Matrix, OrderSource,
    POPULARITY_CAP, ReplayOrder, RngOrder, match_layer, pfnm_scores,
};
pub use mlp::{DenseLayer, Fused, FusedMlp, MlpWeights, PfnmConfig, pfnm_fuse, pfnm_fuse_mlp};
