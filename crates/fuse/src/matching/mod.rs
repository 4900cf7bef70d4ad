//! Probabilistic federated neural matching (PFNM, Yurochkin et al. 2019).
//!
//! [`match_layer`] matches one layer's hidden units on plain matrices; [`pfnm_fuse`] and
//! [`pfnm_fuse_mlp`] run it over an MLP from the top hidden layer down (or, with
//! [`MatchOrder::BottomUp`], from the input up). Behaviour follows the
//! reference code (IBM/probabilistic-federated-neural-matching `matching/pfnm.py` @ f44cf42)
//! and is checked against fixtures recorded from it. `PfnmConfig::eps > 0` adds the GPI-FNM
//! term of Xiao & Cheng ([`gpi_cost`]) to every layer's score.
//!
//! [`pfnm_fuse_layers`] runs the same per-layer matcher over the channels and units of layer-list
//! models, bottom-up, through the unit map of `fedfuse_core::layers::unit_uses`;
//! [`weight_matching_fuse`] is the fixed-width baseline (Git Re-Basin's weight matching) on the
//! same lists, and [`permute_units`] the one place a permutation of units is applied.

mod channels;
mod layer;
mod lists;
mod mlp;
mod score;
mod settings;
mod transformer;
mod types;
mod vit_pfnm;
mod weight_matching;

pub use channels::{
    MatchedLayer, layerwise_stages, pfnm_fuse_layers, pfnm_fuse_list, pfnm_match_layer,
};
pub use layer::{
    ClientUnits, LayerMatch, MatchTimings, OrderSource, ReplayOrder, RngOrder, match_layer,
};
pub use lists::{
    FusedLayers, at_group_widths, matchable, permutable, permute_units, select_units, spread_units,
};
pub use mlp::{
    DenseLayer, Fused, FusedMlp, MatchOrder, MlpWeights, PfnmConfig, pfnm_fuse, pfnm_fuse_mlp,
};
pub use score::{gpi_cost, pfnm_scores};
pub use settings::{MAX_ITERS, MatchPrior, UnknownKeys};
pub use transformer::{VitGroupView, permute_vit, random_vit_permutations, vit_groups, vit_part};
pub use types::{GlobalUnits, LayerPrior, LayerSettings, Matrix, POPULARITY_CAP};
pub use weight_matching::{WeightMatchingConfig, weight_matching_fuse};
