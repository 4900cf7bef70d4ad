//! Federation for fedfuse: the [`Method`] contract, the round loop and the in-process simulator.
//!
//! A method's client half ([`Method::fit`]) and server half ([`Method::aggregate`]) talk only
//! through encoded [`Record`](fedfuse_core::Record)s, so the traffic the simulator reports is the
//! size of real messages, and a network transport can replace the simulator without touching
//! a method.
//!
//! ```no_run
//! use fedfuse_fed::{MethodConfig, Population, SimConfig, simulate};
//! # fn demo(clients: &[fedfuse_data::ClientData], test: &fedfuse_data::Dataset,
//! #         trainer: &fedfuse_train::Trainer, init: fedfuse_core::Params) -> fedfuse_fed::Result<()> {
//! let mut method = MethodConfig::FedAvg(Default::default()).build()?;
//! let population = Population::labelled(trainer, clients, test);
//! let run = simulate(method.as_mut(), population, init, &SimConfig::default(), &|_| {})?;
//! println!("final accuracy {:.3}", run.rounds.last().map_or(0.0, |r| r.global_accuracy));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod error;
mod method;
mod methods;
mod seed;
mod simulator;

pub use error::{FedError, Result};
pub use fedfuse_fuse::MatchPrior;
pub use method::{
    Aggregate, ClientContext, Fold, LOCAL_ACCURACY, Method, PROXIMAL_MU, Reply, SERVER_ROUND,
    TableContext, standard_fit,
};
pub use methods::put_class_counts;
pub use methods::{
    BatchNormRounds, BatchNormSettings, BuildContext, Bulyan, BulyanSettings, CentralDp,
    CheckedMethod, CriterionKind, DpSampling, FedAvg, FedAvgSettings, FedDrop, FedDropSettings,
    FedL1, FedL1Settings, FedMa, FedMaSettings, FedMedian, FedMix, FedMixSettings, FedNgm,
    FedNgmClient, FedNgmConfig, FedNgmRound, FedNgmRun, FedNgmVariant, FedNgrConfig, FedOpt,
    FedOptSettings, FedProx, FedProxSettings, FedSparse, FedSparseSettings, FedTrimmedAvg,
    FedTrimmedAvgSettings, Gems, GemsSettings, GemsShape, Krum, KrumSettings, LocalDp, LocalNorm,
    MethodConfig, NeuronCriterionKind, NeuronSpace, PI_TENSOR, Pfnm, PfnmSettings, PrivacySettings,
    SearchKind, SeparateInits, ServerOptName, ServerStep, ServerStepConfig, SparsityPreset,
    V_TENSOR, WeightMatching, Z_TENSOR, default_eps_grid, finetune_output_layer, hidden_features,
};
pub use methods::{
    ClientWeighting, GraphSettings, PredictionScore, SampleSite, Stitched, Traffic, run_fedngm,
    score_ensemble, score_marginal, score_prediction, score_rows, stitch_client,
};
pub use seed::derive_seed;
pub use simulator::{
    AfterRound, BoxError, ClientsPerRound, LastUploads, Population, Progress, Rejection,
    ReplyBounds, RoundMetrics, RoundState, RoundTally, RunResult, Sampler, Sampling, Session,
    SimConfig, client_step, evaluate_classifier, simulate, simulate_session,
};
