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

/// Keys of the config (README's table), for overrides.
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
