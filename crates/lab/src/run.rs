//! `fedfuse run`: config -> data -> federation -> output folder.

use std::path::Path;

use anyhow::{Context, Result};
use fedfuse_data::load_dataset;
use fedfuse_fed::{BuildContext, RunResult, SimConfig, derive_seed, simulate};
use fedfuse_train::{Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::Observer;
use crate::config::Config;
use crate::pipeline::{client_data, server_split};

/// Runs the experiment of `cfg`, writing the resolved config, results.json, metrics.csv, the
/// final model and the plots under `out`.
pub fn run(cfg: &Config, out: &Path, observer: &dyn Observer) -> Result<RunResult> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create output folder {}", out.display()))?;
    let resolved = toml::to_string_pretty(cfg).context("cannot serialise the resolved config")?;
    crate::table::write_atomic(&out.join("config.toml"), resolved.as_bytes())?;

    let result = federate(cfg, observer)?;

    crate::output::write_results(out, cfg, &result)?;
    crate::plot::write_plots(out, &result.rounds)?;
    let model_path = out.join("model.safetensors");
    fedfuse_core::save_safetensors(&result.params, &model_path)?;
    if let Some(last) = result.rounds.last() {
        observer.note(&format!(
            "final global accuracy {:.4}; results in {}",
            last.global_accuracy,
            out.display()
        ));
    }
    Ok(result)
}

/// Loads the data of `cfg`, splits it among clients and runs the federation.
pub fn federate(cfg: &Config, observer: &dyn Observer) -> Result<RunResult> {
    let data = load_dataset(&cfg.dataset.name, cfg.data_dir.as_deref())
        .with_context(|| format!("dataset `{}`", cfg.dataset.name))?;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let split = server_split(&data.train, cfg.validation_fraction(), &mut rng)?;
    let clients = client_data(
        &split.pool,
        cfg.clients,
        &cfg.partition,
        cfg.dataset.local_test_fraction,
        &mut rng,
    )?;

    let spec = cfg
        .model
        .spec(&data.train.sample_shape, data.train.num_classes)?;
    let trainer = Trainer::new(spec.clone())?;
    let init = init_params(&spec, cfg.model.init, derive_seed(cfg.seed, 0, usize::MAX));
    let mut method = cfg.method.build_with(BuildContext {
        init: cfg.model.init,
        seed: cfg.seed,
        spec: Some(spec.clone()),
        validation: split.validation,
    })?;
    if let Some(server) = &cfg.server {
        method = server.wrap(&cfg.method, method)?;
    }
    let sim = SimConfig {
        rounds: cfg.rounds,
        clients_per_round: cfg.clients_per_round,
        seed: cfg.seed,
        train: cfg.train.to_train_config(),
        local_eval: cfg.local_eval,
    };
    observer.note(&format!(
        "{} on {} ({} train / {} test samples), {} clients, {} rounds, model {} params",
        method.name(),
        cfg.dataset.name,
        data.train.len(),
        data.test.len(),
        cfg.clients,
        cfg.rounds,
        spec.num_params()
    ));
    observer.run_started(cfg.rounds);
    let result = simulate(
        method.as_mut(),
        &trainer,
        &clients,
        &data.test,
        init,
        &sim,
        &|p| observer.progress(p),
    );
    observer.run_finished();
    Ok(result?)
}
