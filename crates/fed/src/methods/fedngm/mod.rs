//! FedNGM and FedNGR (note 1.7): federated neural graphical models over mixed-type tables.
//!
//! One run, in the order of the protocol (every message an encoded [`Record`], so the traffic
//! figures are real message sizes):
//! 1. **Shared preprocessing.** Clients send column statistics ([`TableStats`]); the server
//!    merges them into one normalisation and one-hot vocabulary ([`Encoding::merge`]).
//! 2. **Graphs.** Each client recovers a feature graph from its own encoded rows
//!    ([`recover_graph`]: graphical lasso, top fraction of pairs) and sends it. The server
//!    forms the consensus graph ([`consensus`]: features every client has, union of edges).
//!    FedNGR sends feature lists only: its graph is learnt.
//! 3. **Local models.** Each client trains an NGM on the consensus features under the
//!    consensus graph (FedNGR: an NGR, complete graph and sparsity penalty), warm-started from
//!    the global model after the first round, and sends its weights.
//! 4. **Global model.** Samples are drawn from every client model (Algorithm 3; by the client
//!    from its own data's marginals, or by the server from summaries), the server averages
//!    the client models' outputs on them (weights uniform or by examples) and distils one
//!    global NGM of the same, constant size onto that average, plus `gamma` times the
//!    reconstruction loss on optional public rows. FedNGR reads the global graph off the
//!    distilled weights ([`ngr_graph`](fedfuse_train::ngr_graph)).
//! 5. Further rounds repeat 3-4.
//!
//! The protocol is the [`FedNgm`] method, one stage per round of the simulator
//! ([`simulate`](crate::simulate) on [`Population::Tables`](crate::Population::Tables)); [`run_fedngm`] runs it over named clients and gathers what it
//! built into a [`FedNgmRun`]. [`stitch_client`] then extends the global model with a
//! client's own features.
//!
//! [`TableStats`]: fedfuse_data::TableStats
//! [`recover_graph`]: fedfuse_fuse::recover_graph
//! [`consensus`]: fedfuse_fuse::consensus
//!

mod protocol;
mod records;
mod run;
mod scoring;
mod settings;

pub use protocol::FedNgm;
pub use run::{FedNgmClient, FedNgmRound, FedNgmRun, Stitched, Traffic, run_fedngm, stitch_client};
pub use scoring::{PredictionScore, score_ensemble, score_marginal, score_prediction, score_rows};
pub use settings::{
    ClientWeighting, FedNgmConfig, FedNgmVariant, FedNgrConfig, GraphSettings, SampleSite,
};
