//! `fedfuse run`: config -> data -> federation -> output folder.

use std::borrow::Cow;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use fedfuse_data::{client_splits, holdout, load_dataset, partition};
use fedfuse_fed::{BuildContext, Progress, RunResult, SimConfig, derive_seed, simulate};
use fedfuse_train::{Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::config::Config;
use crate::progress::Reporter;

/// Runs the experiment of `cfg`, writing everything under `out`.
pub fn run(cfg: &Config, out: &Path, quiet: bool) -> Result<ExitCode> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create output folder {}", out.display()))?;
    let resolved = toml::to_string_pretty(cfg).context("cannot serialise the resolved config")?;
    std::fs::write(out.join("config.toml"), resolved)
        .with_context(|| format!("cannot write {}", out.join("config.toml").display()))?;

    let reporter = Reporter::new(cfg.rounds, quiet);
    let result = federate(cfg, &|p| reporter.event(p))?;
    reporter.finish();

    crate::output::write_results(out, cfg, &result)?;
    crate::plot::write_plots(out, &result.rounds)?;
    let model_path = out.join("model.safetensors");
    fedfuse_core::save_safetensors(&result.params, &model_path)?;
    if let Some(last) = result.rounds.last() {
        eprintln!(
            "final global accuracy {:.4}; results in {}",
            last.global_accuracy,
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads the data of `cfg`, splits it among clients and runs the federation.
pub fn federate(cfg: &Config, progress: &(dyn Fn(Progress<'_>) + Sync)) -> Result<RunResult> {
    let data = load_dataset(&cfg.dataset.name, cfg.data_dir.as_deref())
        .with_context(|| format!("dataset `{}`", cfg.dataset.name))?;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let validation_fraction = cfg.validation_fraction();
    let (pool, validation) = if validation_fraction > 0.0 {
        let (pool, held) = holdout(&data.train, validation_fraction, &mut rng)?;
        (Cow::Owned(pool), Some(Arc::new(held)))
    } else {
        (Cow::Borrowed(&data.train), None)
    };
    let parts = partition(
        &pool.y,
        pool.num_classes,
        cfg.clients,
        &cfg.partition,
        &mut rng,
    )
    .context("partition")?;
    let clients = client_splits(&pool, &parts, cfg.dataset.local_test_fraction, &mut rng)
        .context("client splits")?;

    let spec = cfg
        .model
        .spec(&data.train.sample_shape, data.train.num_classes)?;
    let trainer = Trainer::new(spec.clone())?;
    let init = init_params(&spec, cfg.model.init, derive_seed(cfg.seed, 0, usize::MAX));
    let mut method = cfg.method.build_with(BuildContext {
        init: cfg.model.init,
        seed: cfg.seed,
        spec: Some(spec.clone()),
        validation,
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
    eprintln!(
        "{} on {} ({} train / {} test samples), {} clients, {} rounds, model {} params",
        method.name(),
        cfg.dataset.name,
        data.train.len(),
        data.test.len(),
        cfg.clients,
        cfg.rounds,
        spec.num_params()
    );
    Ok(simulate(
        method.as_mut(),
        &trainer,
        &clients,
        &data.test,
        init,
        &sim,
        progress,
    )?)
}
