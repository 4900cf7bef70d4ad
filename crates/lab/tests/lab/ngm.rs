//! FedNGR's graph on the shipped synthetic-GGM experiment (issue 34): the global graph read
//! off the distilled weights is at least as good as the graphs of the clients' own NGRs and
//! close to an NGR trained on the pooled rows, with the shipped `[fedngr]` settings (chosen
//! on development seeds 5-9 without the true graph, docs/EXPERIMENTS.md).

use std::path::Path;

use fedfuse_lab::Silent;
use fedfuse_lab::ngm_experiment::{NgmExperiment, run};

/// `model`'s edge F1 on `seed` from an experiment's results.csv.
fn f1(csv: &str, seed: u64, model: &str) -> f64 {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f[0] == seed.to_string() && f[1] == "graph" && f[2] == model && f[4] == "f1")
        .map(|f| f[5].parse().unwrap())
        .unwrap_or_else(|| panic!("no graph F1 of {model} on seed {seed} in\n{csv}"))
}

#[test]
fn fedngr_global_graph_matches_the_pooled_ngr_and_beats_the_clients_ngrs() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/ngm-synthetic.toml");
    let mut cfg = NgmExperiment::load(&file).unwrap();
    // Seeds 0-2 of the reported five (docs/EXPERIMENTS.md), FedNGR's settings as shipped.
    // FedNGM is only along for the ride here: cut to a token run, and one prediction target.
    cfg.seeds = vec![0, 1, 2];
    cfg.targets = vec!["x0".into()];
    cfg.fedngm.samples_per_client = 100;
    cfg.fedngm.local.epochs = 20;
    cfg.fedngm.global.epochs = 20;
    let dir = tempfile::tempdir().unwrap();
    run(&cfg, dir.path(), None, &Silent, false).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    for seed in [0, 1, 2] {
        let global = f1(&csv, seed, "FedNGR global");
        let clients = f1(&csv, seed, "clients' NGR (mean)");
        let pooled = f1(&csv, seed, "pooled NGR");
        eprintln!(
            "seed {seed}: FedNGR global {global:.3}, clients' NGR {clients:.3}, pooled NGR {pooled:.3}"
        );
        // Chance is 0.25 (7 of 28 pairs kept); the broken read-out of issue 34 gave 0.67-0.93.
        assert!(
            global >= clients,
            "seed {seed}: global {global} < clients' NGR {clients}"
        );
        assert!(
            global >= pooled - 0.05,
            "seed {seed}: global {global} vs pooled NGR {pooled}"
        );
        assert!(global >= 0.8, "seed {seed}: global {global}");
    }
}
