//! Aggregation maths of fedfuse on plain f32 slices and [`Params`](fedfuse_core::Params).
//!
//! Pure functions: no I/O, no tensor library. Each method of `fedfuse-fed` wraps one of them.
//! Coordinate-wise means and medians work on slices; PFNM neuron matching ([`pfnm_fuse`],
//! [`match_layer`]) on f64 matrices.
//!
//! ```
//! use fedfuse_fuse::weighted_mean;
//! let a = [1.0f32, 2.0];
//! let b = [3.0f32, 6.0];
//! assert_eq!(weighted_mean(&[(&a, 1.0), (&b, 3.0)]), vec![2.5, 5.0]);
//! ```
#![deny(missing_docs)]

pub mod dp;
mod elementwise;
mod error;
mod fedsparse_server;
pub mod gems;
mod graph;
mod krum;
mod matching;
mod mixture;
mod serveropt;
mod submodel;

pub use elementwise::{
    WeightedSum, mean_nearest_median, mean_nearest_median_params, median, median_params,
    trimmed_mean, trimmed_mean_params, weighted_mean, weighted_mean_params,
};
pub use error::{FuseError, Result};
pub use fedsparse_server::{
    FedSparseConfig, FedSparseServer, RoundStart, SparseGradSum, SparseGradients, SparseReply,
    Stationary, TotalVariation, fedsparse_gradients, fedsparse_stationary, prune, total_variation,
};
pub use graph::{
    EdgeMetrics, Glasso, GlassoConfig, Graph, GraphRecovery, consensus, covariance,
    edge_precision_recall, expand_to_units, graph_from_scores, graphical_lasso,
    partial_correlations, recover_graph,
};
pub use krum::{bulyan, krum_scores, krum_select};
pub use matching::{
    ClientUnits, DenseLayer, Fused, FusedLayers, FusedMlp, GlobalUnits, LayerMatch, LayerPrior,
    LayerSettings, MAX_ITERS, MatchOrder, MatchPrior, MatchTimings, MatchedLayer, Matrix,
    MlpWeights, OrderSource, POPULARITY_CAP, PfnmConfig, ReplayOrder, RngOrder, UnknownKeys,
    VitGroupView, WeightMatchingConfig, at_group_widths, gpi_cost, layerwise_stages, match_layer,
    matchable, permutable, permute_units, permute_vit, pfnm_fuse, pfnm_fuse_layers, pfnm_fuse_list,
    pfnm_fuse_mlp, pfnm_match_layer, pfnm_scores, random_vit_permutations, select_units,
    spread_units, vit_groups, vit_part, weight_matching_fuse,
};
pub use mixture::{
    GaussianMixture, MixtureConfig, MixtureStep, responsibilities_from_sq_distances,
};
pub use serveropt::{ServerOptState, ServerOptimizer};
pub use submodel::{scatter_sub_model, sub_model};
