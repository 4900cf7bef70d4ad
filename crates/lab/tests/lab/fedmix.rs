//! FedMix (fedsparse-em App. J.2) on two client populations of MNIST: half the clients see
//! every image through one fixed pixel permutation (`dataset.permuted_clients`).
//! `experiments/fedmix/mnist-permuted.toml` is the run; this file runs its protocol.

use std::path::{Path, PathBuf};

use fedfuse_data::Dataset;
use fedfuse_fed::{RunResult, simulate};
use fedfuse_lab::Config;
use fedfuse_lab::run::{Federation, FederationData};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The experiment's config under `sets` (`--set` assignments), reading MNIST beside the
/// repository.
fn config(sets: &[&str]) -> Config {
    let dir = repo().join("../shared/data/mnist");
    let mut all = vec![format!("data_dir=\"{}\"", dir.display())];
    all.extend(sets.iter().map(|s| s.to_string()));
    Config::load(&repo().join("experiments/fedmix/mnist-permuted.toml"), &all).unwrap()
}

/// A finished run and the federation it ran in (the method holds its final state).
struct Ran {
    result: RunResult,
    fed: Federation,
    /// Samples in each half of the scored set.
    half: usize,
}

/// Runs `cfg`, whose last `clients / 2` clients see permuted pixels
/// (`dataset.permuted_clients`) and whose scored set is its plain copy followed by its
/// permuted copy.
fn run(cfg: &Config) -> Ran {
    let mut fed = Federation::prepare(cfg).unwrap();
    let FederationData::Labelled { test, .. } = &fed.data else {
        panic!("a labelled federation");
    };
    let half = test.len() / 2;
    let result = simulate(
        fed.method.as_mut(),
        fed.data.population(),
        fed.init.clone(),
        &fed.sim,
        &|_| {},
    )
    .unwrap();
    Ran { result, fed, half }
}

impl Ran {
    /// The figure FedMix reports for its server models after `round` (1-based): the uniform
    /// ensemble of its components; for other methods, the global model.
    fn score(&self, round: usize) -> f64 {
        let m = &self.result.rounds[round - 1];
        m.method
            .get("ensemble_accuracy")
            .copied()
            .unwrap_or(m.global_accuracy)
    }

    /// The last round's share of the clients' weight on each of `k` components.
    fn shares(&self, k: usize) -> Vec<f64> {
        let m = &self.result.rounds.last().unwrap().method;
        (0..k).map(|i| m[&format!("share.{i}")]).collect()
    }

    /// The scored set's plain half and permuted half.
    fn populations(&self) -> [Dataset; 2] {
        let FederationData::Labelled { test, .. } = &self.fed.data else {
            unreachable!()
        };
        let idx: Vec<usize> = (0..2 * self.half).collect();
        [
            test.subset(&idx[..self.half]),
            test.subset(&idx[self.half..]),
        ]
    }

    /// The final global model's accuracy on the plain and on the permuted half.
    fn global_by_population(&self) -> [f64; 2] {
        let FederationData::Labelled { trainer, .. } = &self.fed.data else {
            unreachable!()
        };
        self.populations()
            .map(|d| trainer.evaluate(&self.result.params, &d).unwrap().accuracy)
    }

    /// Accuracy of each of FedMix's `k` components on the plain half, then on the permuted
    /// half.
    fn components_by_population(&self, k: usize) -> [Vec<f64>; 2] {
        let FederationData::Labelled { trainer, .. } = &self.fed.data else {
            unreachable!()
        };
        self.populations().map(|d| {
            let m = self.fed.method.evaluate(trainer, &d).unwrap();
            (0..k).map(|i| m[&format!("accuracy.{i}")]).collect()
        })
    }
}

/// One FedMix setting of the grid: hidden width, components, server precision, clients'
/// precision (`None`: no mixture term in their loss).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Setting {
    hidden: usize,
    components: usize,
    lambda: f64,
    client_lambda: Option<f64>,
}

impl Setting {
    fn method(&self) -> String {
        let term = match self.client_lambda {
            Some(c) => format!(", mixture_term=true, client_lambda={c:?}"),
            None => String::new(),
        };
        format!(
            "method={{name=\"fedmix\", components={}, lambda={:?}{term}}}",
            self.components, self.lambda
        )
    }
}

const FEDAVG: &str = "method={name=\"fedavg\"}";

/// `method` (a `--set` assignment) at `hidden` units, `rounds` rounds and `seed`, scored on
/// `score` (`test` or `validation`).
fn config_for(method: &str, hidden: usize, rounds: usize, seed: u64, score: &str) -> Config {
    config(&[
        method,
        &format!("model.hidden=[{hidden}]"),
        &format!("rounds={rounds}"),
        &format!("seed={seed}"),
        &format!("dataset.score=\"{score}\""),
    ])
}

/// The index of the row with the largest mean.
fn best<K>(rows: &[(K, Vec<f64>)]) -> usize {
    (0..rows.len())
        .max_by(|&a, &b| mean_sd(&rows[a].1).0.total_cmp(&mean_sd(&rows[b].1).0))
        .unwrap()
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (m, var.sqrt())
}

fn push<K: PartialEq>(rows: &mut Vec<(K, Vec<f64>)>, key: K, value: f64) {
    match rows.iter_mut().find(|(k, _)| *k == key) {
        Some((_, v)) => v.push(value),
        None => rows.push((key, vec![value])),
    }
}

/// The whole protocol: every setting of the grid and FedAvg on the server's validation split
/// (seeds 0 and 1), the best of each by mean validation accuracy (FedMix: its ensemble, as it
/// reports it), then both on the test set over seeds 10-14, beside the hard mixture fixed in
/// advance (K = 2, lambda = 100, no clients' term). Prints one line per run.
#[test]
#[ignore = "the experiment: about 20 minutes on one core"]
fn fedmix_mnist_protocol() {
    let val_seeds = [0u64, 1];
    let test_seeds = [10u64, 11, 12, 13, 14];
    let checkpoints = [4usize, 8, 12];
    let max_rounds = 12;
    let hiddens = [8usize, 16, 32, 64];
    let timer = std::time::Instant::now();
    let secs = || timer.elapsed().as_secs_f64();
    // (hidden, rounds) and (setting, rounds) -> validation accuracy on each seed.
    let mut fedavg_val: Vec<((usize, usize), Vec<f64>)> = Vec::new();
    let mut fedmix_val: Vec<((Setting, usize), Vec<f64>)> = Vec::new();
    for &hidden in &hiddens {
        for &seed in &val_seeds {
            let r = run(&config_for(FEDAVG, hidden, max_rounds, seed, "validation"));
            let accs: Vec<f64> = checkpoints.iter().map(|&k| r.score(k)).collect();
            eprintln!(
                "VAL fedavg h={hidden} seed={seed} {accs:.4?} t={:.0}s",
                secs()
            );
            for (&k, &a) in checkpoints.iter().zip(&accs) {
                push(&mut fedavg_val, (hidden, k), a);
            }
        }
    }
    for &hidden in &hiddens {
        for components in [2usize, 3, 4] {
            for lambda in [0.01, 0.1, 1.0, 100.0] {
                for client_lambda in [None, Some(0.01), Some(0.1), Some(1.0)] {
                    let s = Setting {
                        hidden,
                        components,
                        lambda,
                        client_lambda,
                    };
                    for &seed in &val_seeds {
                        let r = run(&config_for(
                            &s.method(),
                            hidden,
                            max_rounds,
                            seed,
                            "validation",
                        ));
                        let accs: Vec<f64> = checkpoints.iter().map(|&k| r.score(k)).collect();
                        eprintln!(
                            "VAL fedmix h={hidden} K={components} lambda={lambda} \
                             client_lambda={client_lambda:?} seed={seed} ensemble {accs:.4?} \
                             global {:.4} shares {:.2?} t={:.0}s",
                            r.result.rounds[max_rounds - 1].global_accuracy,
                            r.shares(components),
                            secs()
                        );
                        for (&k, &a) in checkpoints.iter().zip(&accs) {
                            push(&mut fedmix_val, (s, k), a);
                        }
                    }
                }
            }
        }
    }
    let ((mix, mix_rounds), mix_val) = fedmix_val[best(&fedmix_val)].clone();
    let ((avg_hidden, avg_rounds), avg_val) = fedavg_val[best(&fedavg_val)].clone();
    eprintln!(
        "CHOSEN fedmix {mix:?} rounds={mix_rounds} val {:.4} | fedavg h={avg_hidden} \
         rounds={avg_rounds} val {:.4}",
        mean_sd(&mix_val).0,
        mean_sd(&avg_val).0,
    );
    let hard = Setting {
        components: 2,
        lambda: 100.0,
        client_lambda: None,
        ..mix
    };
    let mut rows: Vec<(&str, Vec<f64>)> = Vec::new();
    for &seed in &test_seeds {
        let chosen = run(&config_for(
            &mix.method(),
            mix.hidden,
            mix_rounds,
            seed,
            "test",
        ));
        let avg = run(&config_for(FEDAVG, avg_hidden, avg_rounds, seed, "test"));
        let matched = (avg_hidden, avg_rounds) != (mix.hidden, mix_rounds);
        let avg_matched = matched.then(|| {
            run(&config_for(FEDAVG, mix.hidden, mix_rounds, seed, "test")).score(mix_rounds)
        });
        let fixed = run(&config_for(
            &hard.method(),
            mix.hidden,
            mix_rounds,
            seed,
            "test",
        ));
        let [plain, permuted] = fixed.components_by_population(2);
        let [avg_plain, avg_permuted] = avg.global_by_population();
        let line = [
            ("fedmix chosen, ensemble", chosen.score(mix_rounds)),
            (
                "fedmix chosen, global",
                chosen.result.rounds[mix_rounds - 1].global_accuracy,
            ),
            ("fedavg chosen", avg.score(avg_rounds)),
            ("fedavg chosen, plain half", avg_plain),
            ("fedavg chosen, permuted half", avg_permuted),
            ("hard mixture, ensemble", fixed.score(mix_rounds)),
            (
                "hard mixture, global",
                fixed.result.rounds[mix_rounds - 1].global_accuracy,
            ),
            (
                "hard mixture, best component on plain half",
                plain.iter().copied().fold(0.0, f64::max),
            ),
            (
                "hard mixture, best component on permuted half",
                permuted.iter().copied().fold(0.0, f64::max),
            ),
        ];
        eprintln!(
            "TEST seed={seed} {:.4?} fedavg at fedmix's width and rounds {avg_matched:.4?} \
             hard shares {:.2?} plain {plain:.4?} permuted {permuted:.4?} t={:.0}s",
            line.map(|l| l.1),
            fixed.shares(2),
            secs()
        );
        for (label, a) in line {
            push(&mut rows, label, a);
        }
        if let Some(a) = avg_matched {
            push(&mut rows, "fedavg at fedmix's width and rounds", a);
        }
    }
    for (label, v) in &rows {
        let (m, sd) = mean_sd(v);
        eprintln!("TABLE {label}: {m:.4} ± {sd:.4} {v:.4?}");
    }
}

/// On MNIST and permuted MNIST (the experiment's federation and 12 rounds, seed 10, scored on
/// the first 2,000 test images and their permuted copies), the hard mixture (K = 2,
/// lambda = 100, no clients' term) gives each population its own component, but the uniform
/// ensemble that FedMix reports trails both FedAvg and each component on its own population:
/// the wrong specialist's vote costs more than specialising gains. Measured here: components
/// 0.895 / 0.080 on plain, 0.101 / 0.897 on permuted, ensemble 0.871, FedAvg 0.886 (the
/// ensemble trails FedAvg by 0.006-0.022 on seeds 10-14; docs/EXPERIMENTS.md has the whole
/// test set). After 4 rounds the ensemble was still ahead (0.861 vs 0.850 on seed 10).
#[test]
fn hard_mixture_separates_mnist_populations_but_its_ensemble_trails_fedavg() {
    let sets = |method: &str| {
        config(&[
            method,
            "model.hidden=[64]",
            "rounds=12",
            "seed=10",
            "dataset.test_samples=2000",
        ])
    };
    let hard = Setting {
        hidden: 64,
        components: 2,
        lambda: 100.0,
        client_lambda: None,
    };
    let mix = run(&sets(&hard.method()));
    let avg = run(&sets(FEDAVG));
    let [plain, permuted] = mix.components_by_population(2);
    let mine = usize::from(plain[1] > plain[0]);
    let (ensemble, fedavg) = (mix.score(12), avg.score(12));
    eprintln!(
        "components on plain {plain:.3?}, on permuted {permuted:.3?}; ensemble {ensemble:.4}, \
         FedAvg {fedavg:.4}"
    );
    // Each population has its own component: good on it, near chance on the other.
    assert!(
        plain[mine] > 0.85 && permuted[1 - mine] > 0.85,
        "{plain:?} {permuted:?}"
    );
    assert!(
        plain[1 - mine] < 0.25 && permuted[mine] < 0.25,
        "{plain:?} {permuted:?}"
    );
    assert!(
        mix.shares(2).iter().all(|s| (s - 0.5).abs() < 1e-9),
        "{:?}",
        mix.shares(2)
    );
    assert!(ensemble < fedavg, "ensemble {ensemble} vs FedAvg {fedavg}");
    assert!(
        ensemble < plain[mine].min(permuted[1 - mine]),
        "ensemble {ensemble} vs components {plain:?} {permuted:?}"
    );
}
