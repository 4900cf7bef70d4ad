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

/// `model`'s accuracy on `target` for `seed` from an experiment's results.csv.
fn accuracy(csv: &str, seed: u64, model: &str, target: &str) -> f64 {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| {
            f[0] == seed.to_string()
                && f[1] == "prediction"
                && f[2] == model
                && f[3] == target
                && f[4] == "accuracy"
        })
        .map(|f| f[5].parse().unwrap())
        .unwrap_or_else(|| panic!("no accuracy of {model} on {target}, seed {seed} in\n{csv}"))
}

/// FedNGR on the CDC file (issue 34): with the shipped `[fedngr]` lambdas (chosen on a
/// validation split of the training rows, docs/EXPERIMENTS.md) the global model predicts both
/// categorical targets well above the majority rate and close to an NGR trained on the pooled
/// rows, where before it predicted the majority class on every row. The pooled NGR's margin
/// over the majority is checked first: it is what says the data allow it.
#[test]
fn fedngr_on_cdc_predicts_the_categorical_targets_above_the_majority() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cfg = NgmExperiment::load(&repo.join("experiments/ngm-cdc.toml")).unwrap();
    cfg.seeds = vec![0, 1];
    cfg.targets = vec!["death_age".into(), "cause_of_death".into()];
    // FedNGM and stitching are only along for the ride here: cut to a token run, and off.
    cfg.stitch = None;
    cfg.fedngm.samples_per_client = 100;
    cfg.fedngm.local.hidden = vec![8];
    cfg.fedngm.local.epochs = 1;
    cfg.fedngm.global.epochs = 1;
    // FedNGR's lambdas as shipped, the clients' epochs cut from 120 to 30 for time (FedNGR
    // global on the validation rows, death age and cause: 0.762 and 0.588 at 30, 0.760 and
    // 0.595 at 120).
    cfg.fedngr.as_mut().unwrap().local.epochs = 30;
    let data = repo.join("../shared/data");
    let dir = tempfile::tempdir().unwrap();
    run(&cfg, dir.path(), Some(data.as_path()), &Silent, false).unwrap();
    let csv = std::fs::read_to_string(dir.path().join("results.csv")).unwrap();
    for seed in [0, 1] {
        for target in ["death_age", "cause_of_death"] {
            let majority = accuracy(&csv, seed, "marginal", target);
            let pooled = accuracy(&csv, seed, "pooled NGR", target);
            let global = accuracy(&csv, seed, "FedNGR global", target);
            eprintln!(
                "seed {seed} {target}: FedNGR global {global:.3}, pooled NGR {pooled:.3}, \
                 majority {majority:.3}"
            );
            assert!(
                pooled >= majority + 0.05,
                "seed {seed} {target}: the pooled NGR ({pooled}) is not clear of the majority \
                 rate ({majority}), so the data do not show a margin to hold FedNGR to"
            );
            // Before issue 34 the global model was the majority class exactly (global = majority).
            assert!(
                global >= majority + 0.05,
                "seed {seed} {target}: FedNGR global {global} vs majority {majority}"
            );
            assert!(
                global >= pooled - 0.03,
                "seed {seed} {target}: FedNGR global {global} vs pooled NGR {pooled}"
            );
        }
    }
}
