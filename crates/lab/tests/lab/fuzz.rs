//! Fuzzing `Config::parse`: the TOML of `fedfuse run` and its `--set key.path=value`
//! overrides.
//!
//! Arbitrary text, the example configs mutated (bytes flipped, tokens and numbers spliced in,
//! lines cut), and well-formed overrides of real keys with edge values. The property: `Ok` or
//! `Err`, never a panic, and a heap peak within a bound proportional to the text; settings
//! declaring 2^40 rounds, clients, units or rows are answered at once, without allocating for
//! them (`parse` only validates: it trains nothing, loads no data).
//!
//! Cases per test: `PROPTEST_CASES` when set, else a CI-sized default (a few thousand per
//! parser); `scripts/fuzz.sh` runs a million. Each test prints its case count and heap peak
//! (`--nocapture`).

#[path = "../../../core/tests/core/fuzz/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use fedfuse_lab::Config;
use harness::{Budget, arbitrary, fuzz, mutated, within};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

/// TOML parsed into tables (tens of bytes per byte of text), the config and the method it
/// builds to check itself.
const TOML: Budget = Budget {
    per_byte: 512,
    slack: 4 << 20,
};

/// The example configs of `fedfuse run`.
const EXAMPLES: &[&str] = &[
    include_str!("../../../../examples/quickstart.toml"),
    include_str!("../../../../examples/mnist-fedavg.toml"),
    include_str!("../../../../examples/mnist-fedprox-dirichlet.toml"),
    include_str!("../../../../examples/mnist-fedsparse.toml"),
    include_str!("../../../../examples/mnist-gems.toml"),
    include_str!("../../../../examples/mnist-gpi-fnm-rounds.toml"),
    include_str!("../../../../examples/mnist-pfnm.toml"),
    include_str!("../../../../examples/ngm-synthetic-run.toml"),
];

/// Keys of the config (docs/CONFIG.md's tables), for overrides.
const KEYS: &[&str] = &[
    "seed",
    "rounds",
    "clients",
    "clients_per_round",
    "local_eval",
    "data_dir",
    "dataset",
    "dataset.name",
    "dataset.local_test_fraction",
    "dataset.validation_fraction",
    "partition.kind",
    "partition.alpha",
    "partition.min_partition_size",
    "partition.self_balancing",
    "partition.classes_per_client",
    "method",
    "method.name",
    "method.mu",
    "method.eps",
    "method.eps_grid",
    "method.iters",
    "method.sigma",
    "method.byzantine",
    "method.keep",
    "method.samples_per_client",
    "method.graph.rho",
    "method.graph.sparsity",
    "server.optimizer",
    "server.lr",
    "server.tau",
    "replies.max_examples",
    "replies.max_update_norm",
    "privacy.kind",
    "privacy.noise_multiplier",
    "privacy.clipping_norm",
    "privacy.delta",
    "privacy.epsilon",
    "privacy.sensitivity",
    "model.kind",
    "model.hidden",
    "model.init",
    "train",
    "train.optimizer",
    "train.lr",
    "train.epochs",
    "train.batch_size",
    "train.momentum",
    "train.weight_decay",
    "table.kind",
    "table.features",
    "table.rows_per_client",
    "table.test_rows",
    "table.edge_prob",
    "table.split",
    "table.test_every",
    "a.b.c",
    "rounds.x",
];

/// Values for overrides: edge numbers, wrong types, method and kind names.
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "0.5",
    "1.0",
    "2.5",
    "1e-300",
    "1e300",
    "nan",
    "inf",
    "-inf",
    "1000000",
    "10000000",
    "1099511627776",
    "9223372036854775807",
    "18446744073709551616",
    "true",
    "\"\"",
    "\"x\"",
    "[]",
    "[0]",
    "[1000000, 1000000]",
    "[1099511627776]",
    "[[1]]",
    "{}",
    "{ kind = \"iid\" }",
    "{ kind = \"cdc\" }",
    "fedavg",
    "fedprox",
    "fedmedian",
    "fedtrimmedavg",
    "fedl1",
    "fedmix",
    "fedopt",
    "feddrop",
    "fedsparse",
    "krum",
    "bulyan",
    "pfnm",
    "gpi_fnm",
    "gems",
    "fedngm",
    "fedngr",
    "mlp",
    "lenet5",
    "adam",
    "sgd",
    "digits",
    "mnist",
    "cifar10",
    "dirichlet",
    "pathological",
    "central-fixed",
    "central-adaptive",
    "local",
    "synthetic",
    "1979-05-27T07:32:00Z",
    "= =",
    "[",
];

/// Tokens spliced into TOML text.
const TOKENS: &[&str] = &[
    "=",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    ",",
    ".",
    "\"",
    "'",
    "\"\"\"",
    "#",
    "\n",
    "\\",
    "-",
    "+",
    "_",
    "nan",
    "inf",
    "true",
    "false",
    "1e999",
    "0x7f",
    "0o7",
    "0b1",
    "1979-05-27",
    "[table]",
    "[method]",
    "[privacy]",
    "[server]",
    "[replies]",
    "[[x]]",
    "\u{feff}",
    "é",
    "\0",
];

/// One override: a real key with an edge value, or arbitrary text.
fn override_() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (select(KEYS), select(VALUES)).prop_map(|(k, v)| format!("{k}={v}")),
        1 => "[a-z_.=\\[\\]\"0-9 ,{}-]{0,24}",
        1 => ".{0,24}",
    ]
}

/// `Config::parse` on `text` with `overrides`, within the heap budget.
fn parse(text: &str, overrides: &[String]) -> Result<(), TestCaseError> {
    let len = text.len() + overrides.iter().map(String::len).sum::<usize>();
    within(TOML, len, || {
        Config::parse(text, overrides).map(drop).map_err(drop)
    })
    .map(drop)
}

#[test]
fn config_arbitrary_text() {
    let toml = "[a-z_.=\\[\\]\"0-9 \\n{},-]{0,300}".prop_map(String::into_bytes);
    let text = prop_oneof![arbitrary(&[b""], 300), toml]
        .prop_map(|b| String::from_utf8_lossy(&b).into_owned());
    fuzz(
        "config_arbitrary_text",
        1000,
        (text, vec(override_(), 0..3)),
        |(text, overrides)| parse(&text, &overrides),
    );
}

#[test]
fn config_mutated() {
    let seeds = EXAMPLES.iter().map(|t| t.as_bytes().to_vec()).collect();
    let text = mutated(seeds, &[0], TOKENS).prop_map(|b| String::from_utf8_lossy(&b).into_owned());
    fuzz(
        "config_mutated",
        1500,
        (text, vec(override_(), 0..2)),
        |(text, overrides)| parse(&text, &overrides),
    );
}

#[test]
fn config_overrides() {
    let example = select(EXAMPLES);
    fuzz(
        "config_overrides",
        1500,
        (example, vec(override_(), 1..5)),
        |(text, overrides)| parse(text, &overrides),
    );
}

#[test]
fn config_declaring_huge_sizes_is_answered_at_once() {
    let huge = [
        "rounds=1099511627776",
        "clients=1099511627776",
        "clients_per_round=1099511627776",
        "model.hidden=[1000000, 1000000, 1000000]",
        "model.hidden=[1099511627776]",
        "train.epochs=1099511627776",
        "train.batch_size=1099511627776",
        "partition.min_partition_size=1099511627776",
        "method.samples_per_client=1099511627776",
        "table.features=1099511627776",
        "table.rows_per_client=1099511627776",
        "table.test_rows=1099511627776",
        "replies.max_examples=18446744073709551615",
    ];
    for text in EXAMPLES {
        for o in huge {
            let overrides = [o.to_string()];
            let start = Instant::now();
            let (out, peak) = harness::peak_heap(|| {
                Config::parse(text, &overrides)
                    .map(drop)
                    .map_err(|e| e.to_string())
            });
            let took = start.elapsed();
            let first = text.lines().next().unwrap_or("");
            assert!(
                peak < 16 << 20,
                "{o} on {first}: {peak} heap bytes, {out:?}"
            );
            assert!(took < Duration::from_secs(1), "{o} on {first}: {took:?}");
        }
    }
}

/// Layer lists: any list, however wild its numbers, is checked without a panic, and the
/// memory estimate of a valid one bounds the heap a real training step allocates.
mod layer_lists {
    use super::harness::{self, fuzz};
    use fedfuse_core::layers::LayerSpec;
    use fedfuse_core::{BlockNorm, ModelSpec};
    use fedfuse_data::Dataset;
    use fedfuse_train::{Init, TrainConfig, Trainer, estimate_memory, init_params};
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;

    /// How far above the real peak the estimate may be: it counts every tensor a step could
    /// keep at once, which the engine frees sooner (1.0x to 3.0x seen on these lists).
    const OVER: u64 = 8;
    /// Heap of a step outside the estimate's model, whatever the network: burn's module and
    /// autodiff bookkeeping, the batch's index lists, buffers that follow the CPU's cache sizes
    /// (the smallest lists took about 1.1 MiB on an AMD EPYC with 1 MiB of L2 a core, 2.03 MiB
    /// on an Intel Xeon with 2 MiB).
    const SLACK: u64 = 4 << 20;

    fn norm() -> impl Strategy<Value = BlockNorm> {
        select(vec![BlockNorm::None, BlockNorm::Batch, BlockNorm::Group])
    }

    /// A layer with small numbers (mostly valid lists).
    fn small_layer() -> impl Strategy<Value = LayerSpec> {
        prop_oneof![
            (1usize..33, 1usize..4, 1usize..3, 0usize..3).prop_map(|(out, k, s, p)| {
                LayerSpec::Conv2d {
                    out,
                    kernel: k,
                    stride: s,
                    padding: p,
                    groups: 1,
                    bias: true,
                }
            }),
            Just(LayerSpec::max_pool(2)),
            Just(LayerSpec::AvgPool2d {
                kernel: 2,
                stride: None
            }),
            Just(LayerSpec::Relu),
            Just(LayerSpec::batch_norm2d()),
            Just(LayerSpec::Dropout { p: 0.25 }),
            (1usize..33, 1usize..3, norm()).prop_map(|(out, s, n)| {
                let out = if n == BlockNorm::Group { 2 * out } else { out };
                LayerSpec::residual(out, s, n)
            }),
        ]
    }

    /// Numbers from the edges of `usize`.
    fn wild() -> impl Strategy<Value = usize> {
        select(vec![
            0,
            1,
            2,
            3,
            1 << 20,
            1 << 31,
            1 << 32,
            1 << 62,
            usize::MAX,
        ])
    }

    fn wild_layer() -> impl Strategy<Value = LayerSpec> {
        prop_oneof![
            (wild(), wild(), wild(), wild(), wild()).prop_map(|(out, k, s, p, g)| {
                LayerSpec::Conv2d {
                    out,
                    kernel: k,
                    stride: s,
                    padding: p,
                    groups: g,
                    bias: false,
                }
            }),
            (wild(), any::<bool>()).prop_map(|(out, bias)| LayerSpec::Linear { out, bias }),
            (wild(), wild(), norm()).prop_map(|(out, s, n)| LayerSpec::residual(out, s, n)),
            Just(LayerSpec::Flatten),
            Just(LayerSpec::GlobalAvgpool),
            small_layer(),
        ]
    }

    fn with_head(mut layers: Vec<LayerSpec>, classes: usize) -> Vec<LayerSpec> {
        layers.push(LayerSpec::Flatten);
        layers.push(LayerSpec::linear(classes));
        layers
    }

    #[test]
    fn wild_layer_lists_are_checked_without_a_panic() {
        let input = (select(vec![
            vec![1, 28, 28],
            vec![3, 32, 32],
            vec![1 << 22, 1 << 21, 1 << 21],
            vec![64],
        ]),);
        let valid = std::cell::Cell::new(0usize);
        fuzz(
            "layer lists (wild numbers)",
            4000,
            (input, vec(wild_layer(), 1..8), any::<bool>(), 1usize..5000),
            |((input,), layers, head, batch)| {
                // Half the lists end in a classifier head, so that some are valid.
                let layers = if head { with_head(layers, 3) } else { layers };
                let spec = ModelSpec::sequential(&input, layers);
                if spec.validate().is_ok() {
                    valid.set(valid.get() + 1);
                    // A valid list has a bounded size, and an estimate.
                    prop_assert!(spec.num_params() <= 1 << 40);
                    let e = estimate_memory(&spec, batch, 2)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(e.train_bytes > 0);
                }
                Ok(())
            },
        );
        assert!(valid.get() > 0, "no valid list among the cases");
    }

    /// One training epoch of one batch on a single thread (so that this thread's heap counter
    /// sees every allocation), and its heap peak.
    fn step_peak(spec: &ModelSpec, batch: usize, seed: u64) -> u64 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("a one-thread pool");
        let n = spec.input_len();
        let classes = spec.classes();
        let x: Vec<f32> = (0..batch * n)
            .map(|i| ((i * 7919) % 97) as f32 / 97.0)
            .collect();
        let y: Vec<u32> = (0..batch).map(|i| (i % classes) as u32).collect();
        let shape = match spec {
            ModelSpec::Sequential { input, .. } => input.clone(),
            _ => vec![n],
        };
        let data = Dataset::new(x, y, shape, classes).expect("a dataset");
        let trainer = Trainer::new(spec.clone()).expect("a trainer");
        let start = init_params(spec, Init::Default, seed);
        let cfg = TrainConfig {
            epochs: 1,
            batch_size: batch,
            ..TrainConfig::default()
        };
        pool.install(|| {
            let (fit, peak) =
                harness::peak_heap(|| trainer.fit_with(&start, &data, &cfg, None, seed));
            fit.expect("training a valid list");
            peak as u64
        })
    }

    #[test]
    fn the_memory_estimate_bounds_a_real_training_step() {
        fuzz(
            "layer lists (memory estimate)",
            48,
            (
                1usize..4,
                6usize..33,
                vec(small_layer(), 1..6),
                1usize..40,
                1usize..6,
                any::<u64>(),
            ),
            |(c, side, layers, batch, classes, seed)| {
                let spec = ModelSpec::sequential(&[c, side, side], with_head(layers, classes));
                if spec.validate().is_err() {
                    return Ok(());
                }
                let est = estimate_memory(&spec, batch, 1)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?
                    .train_bytes;
                let peak = step_peak(&spec, batch, seed);
                prop_assert!(
                    peak <= est + SLACK,
                    "a step of {spec:?} at batch {batch} took {peak} heap bytes, above its \
                     estimate {est}"
                );
                prop_assert!(
                    est <= OVER * peak + SLACK,
                    "the estimate {est} of {spec:?} at batch {batch} is over {OVER}x the \
                     {peak} heap bytes a step took"
                );
                Ok(())
            },
        );
    }
}

/// Checkpoints: a FedMA run's checkpoint with its bytes mutated is read without a panic, and
/// with its progress and fused layers set to wild values it is refused or resumed, never
/// panicking (a stage of 99 indexed past the layers).
mod checkpoints {
    use super::harness::{fuzz, mutated};
    use crate::hostile::{LAYERS, interrupted, tamper};
    use fedfuse_core::ConfigValue;
    use fedfuse_lab::Silent;
    use proptest::prelude::*;
    use proptest::sample::select;

    const SETS: [&str; 4] = [
        "method.name=\"fedma\"",
        "rounds=2",
        "clients=3",
        "train.epochs=1",
    ];

    #[test]
    fn mutated_checkpoint_bytes_are_read_without_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (saved, cfg) = interrupted(dir.path(), LAYERS, &SETS, 1);
        let seed = std::fs::read(&saved).unwrap();
        let path = dir.path().join("mutated.checkpoint");
        fuzz(
            "checkpoint bytes",
            300,
            mutated(vec![seed], &[0, 8, 16], &["99", "-1", "1e300", "[]", "{}"]),
            |bytes| {
                std::fs::write(&path, &bytes).unwrap();
                let _ = fedfuse_lab::checkpoint::read(&path, &cfg);
                Ok(())
            },
        );
    }

    fn wild() -> impl Strategy<Value = serde_json::Value> {
        select(vec![
            serde_json::json!(0),
            serde_json::json!(1),
            serde_json::json!(2),
            serde_json::json!(99),
            serde_json::json!(4_000_000_000u64),
            serde_json::json!(u64::MAX),
            serde_json::json!([]),
            serde_json::json!([0]),
            serde_json::json!([99, 1]),
            serde_json::json!([[0, 1], [5]]),
            serde_json::json!({"0": [[0, 1, 2]]}),
            serde_json::json!({"7": [[9999]]}),
        ])
    }

    #[test]
    fn wild_fedma_progress_is_refused_or_resumed_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (saved, cfg) = interrupted(dir.path(), LAYERS, &SETS, 1);
        let seed = std::fs::read(&saved).unwrap();
        let history = fedfuse_lab::checkpoint::history_path(&saved);
        let rounds = std::fs::read(&history).unwrap();
        let keys = select(vec!["passes", "stage", "widths", "current", "last"]);
        fuzz(
            "FedMA progress",
            40,
            proptest::collection::vec((keys, wild()), 1..3),
            |edits| {
                // A resumed run removes both files when it ends.
                std::fs::write(&saved, &seed).unwrap();
                std::fs::write(&history, &rounds).unwrap();
                tamper(&saved, |r| {
                    let Some(ConfigValue::Str(json)) = r.config.get("state:progress") else {
                        return;
                    };
                    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
                    for (key, value) in &edits {
                        v[*key] = value.clone();
                    }
                    r.config
                        .insert("state:progress".into(), ConfigValue::Str(v.to_string()));
                });
                let out = saved.with_file_name("out");
                let _ = std::fs::remove_dir_all(&out);
                let _ = fedfuse_lab::run::run_with(&cfg, &out, &Silent, true);
                Ok(())
            },
        );
    }
}
