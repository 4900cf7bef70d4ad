//! Local training for fedfuse: the only crate that touches the tensor library (burn).
//!
//! A [`Trainer`] builds a network from a [`ModelSpec`](fedfuse_core::ModelSpec), loads
//! [`Params`](fedfuse_core::Params) into it, trains on a client's data (SGD with momentum and
//! weight decay, or Adam/AMSGrad; optional proximal term `mu/2 ||w - w_anchor||^2`) and reads
//! the parameters back. Two sparsifying local methods train over the parameter groups of
//! [`fedfuse_core::GroupLayout`] (hidden units and filters; [`Trainer::groups`]): FedSparse
//! ([`Trainer::fit_sparse`], learned gates) and FedL1 ([`Trainer::fit_group_l1`], then
//! [`GroupLayout::soft_threshold`](fedfuse_core::GroupLayout::soft_threshold)). Continuing from
//! a given model is the normal case:
//!
//! ```no_run
//! use fedfuse_core::ModelSpec;
//! use fedfuse_train::{Init, TrainConfig, Trainer, init_params};
//! # fn demo(data: &fedfuse_data::Dataset) -> fedfuse_train::Result<()> {
//! let trainer = Trainer::new(ModelSpec::mlp(64, &[32], 10))?;
//! let start = init_params(trainer.spec(), Init::Default, 7);
//! let fitted = trainer.fit_with(&start, data, &TrainConfig::default(), None, 7)?;
//! let eval = trainer.evaluate(&fitted.params, data)?;
//! println!("accuracy {:.3}", eval.accuracy);
//! # Ok(()) }
//! ```
//!
//! Neural Graphical Models ([`Ngm`]): an MLP over normalised feature units whose input-output
//! paths are penalised off a feature graph ([`Ngm::fit`], Algorithm 1), with inference
//! ([`Ngm::infer`]), sampling ([`Ngm::sample`]), FedNGM's server distillation
//! ([`Ngm::fit_distill`]) and stitching ([`Ngm::stitch`]), and graph recovery with Neural Graph
//! Revealers ([`Ngm::fit_ngr`], [`ngr_graph`]).
#![deny(missing_docs)]

mod config;
mod convert;
mod error;
mod fedsparse_client;
pub mod hard_concrete;
mod init;
pub mod memory;
mod net;
mod ngm;
mod seq;
mod trainer;

pub use config::{MAX_EPOCHS, OptimizerConfig, TrainConfig};
pub use error::{Result, TrainError};
pub use fedsparse_client::{SparseConfig, SparseFit, SparsityPreset};
pub use init::{Init, init_params};
pub use memory::{MemoryEstimate, estimate as estimate_memory};
pub use ngm::{
    BlockAggregate, CategoricalLoss, Distill, EpochLog, FeatureGraph, FirstDraw, InferConfig,
    InferMethod, Inference, Known, LambdaSchedule, Marginals, Ngm, NgmConfig, NgmFit, PathNorm,
    PenaltyKind, SampleConfig, SampleNoise, StitchConfig, StitchMode, StructureReport, ngr_graph,
    ngr_scores, path_matrix, sensitivity_bounds, stitch_params, structure_penalty,
    structure_report, unit_mask,
};
pub use trainer::{
    Evaluation, Fitted, MAX_REESTIMATE_BATCH, MixturePrior, Trainer, check_reestimate_batch,
};

/// The SIMD kernels gemm (every matrix product of training and matching) runs on this
/// machine, as gemm picks them at run time: results are bit-identical between runs, thread
/// counts and machines with the same kernels and the same L1 cache shape, and differ at
/// rounding level otherwise (docs/DESIGN-NOTES.md, "gemm's AVX-512 kernels").
pub fn gemm_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "x86-64 avx512f";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "x86-64 fma";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return "aarch64 neon";
        }
    }
    std::env::consts::ARCH
}
