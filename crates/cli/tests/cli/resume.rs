//! `fedfuse run --resume`: a run killed with SIGKILL part-way and resumed ends with the same
//! results and model bytes as one never interrupted.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn command<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fedfuse"));
    c.args(args).current_dir(repo()).env(
        "FEDFUSE_DATA",
        std::env::temp_dir().join("fedfuse-test-empty-cache"),
    );
    c
}

fn fedfuse<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    command(args).output().expect("the fedfuse binary runs")
}

/// A run's results without wall-clock times, which no two runs share.
fn results(out: &Path) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.retain(|k, _| k != "seconds" && k != "seconds_total");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(out.join("results.json")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    strip(&mut v);
    v
}

/// Starts fedfuse with `args` and kills it with SIGKILL (no clean-up of any kind) as soon as
/// `appears` exists, checking that it had not ended by itself.
fn kill_when_written(args: &[String], appears: &Path) {
    kill_when(args, appears, |_| true);
}

/// [`kill_when_written`], once the file also passes `ready`.
fn kill_when(args: &[String], appears: &Path, ready: impl Fn(&[u8]) -> bool) {
    let mut child = command(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // Files are written by rename, so a read sees a whole one.
    while !std::fs::read(appears).is_ok_and(|bytes| ready(&bytes)) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "{} never appeared",
            appears.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "fedfuse ended before it could be killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Runs the quickstart with `sets` twice: once whole, once killed with SIGKILL as soon as a
/// checkpoint exists (after round 1 or a little later: the result may not depend on where)
/// and resumed; both must end with the same results and model bytes.
fn killed_and_resumed_equals_whole(sets: &[&str]) {
    run_killed_and_resumed_equals_whole("examples/quickstart.toml", sets, 1);
}

/// [`killed_and_resumed_equals_whole`] for the run config `config`, killed once the
/// checkpoint holds at least `rounds` rounds.
fn run_killed_and_resumed_equals_whole(config: &str, sets: &[&str], rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    let args = |out: &Path| {
        let mut a: Vec<String> = ["run", config, "--quiet", "--out"]
            .map(String::from)
            .to_vec();
        a.push(out.to_str().unwrap().to_string());
        for s in sets {
            a.extend(["--set".to_string(), s.to_string()]);
        }
        a
    };
    let o = fedfuse(&args(&whole));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !dir.path().join("whole.checkpoint").exists(),
        "a finished run leaves none"
    );

    let saved = dir.path().join("cut.checkpoint");
    // The checkpoint record names the rounds it covers (their metrics are appended to
    // `cut.checkpoint.rounds`).
    kill_when(&args(&cut), &saved, |bytes| {
        fedfuse_core::Record::decode(bytes).is_ok_and(|r| {
            matches!(r.config.get("rounds"),
                Some(fedfuse_core::ConfigValue::Int(n)) if *n >= rounds as i64)
        })
    });
    assert!(!cut.exists(), "a killed run writes no output folder");

    // Another config cannot take the checkpoint over.
    let mut other = args(&cut);
    other.extend(["--resume", "--set", "seed=7"].map(String::from));
    let o = fedfuse(&other);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another config"),
        "{err}"
    );

    let mut resumed = args(&cut);
    resumed.push("--resume".into());
    let o = fedfuse(&resumed);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resuming from"), "{err}");
    assert_eq!(results(&cut), results(&whole));
    assert_eq!(
        std::fs::read(cut.join("model.safetensors")).unwrap(),
        std::fs::read(whole.join("model.safetensors")).unwrap()
    );
    assert!(!saved.exists());
}

#[test]
fn fedavg_with_adaptive_dp_and_fedadam_resumes_to_the_uninterrupted_result() {
    // Central DP's clipping norm adapts and its accountant composes; FedAdam keeps moments.
    killed_and_resumed_equals_whole(&[
        "rounds=12",
        "train.epochs=4",
        "server.optimizer=\"adam\"",
        "privacy.kind=\"central-adaptive\"",
        "privacy.noise_multiplier=0.2",
        "privacy.initial_clipping_norm=0.5",
    ]);
}

#[test]
fn fedsparse_resumes_to_the_uninterrupted_result() {
    // Weights, thresholds, both server optimizers and the open round's gate probabilities.
    killed_and_resumed_equals_whole(&["rounds=12", "train.epochs=3", "method.name=\"fedsparse\""]);
}

#[test]
fn fedmix_resumes_to_the_uninterrupted_result() {
    // The mixture's centres, exact log weights and each client's component.
    killed_and_resumed_equals_whole(&["rounds=12", "train.epochs=4", "method.name=\"fedmix\""]);
}

#[test]
fn pfnm_over_rounds_resumes_to_the_uninterrupted_result() {
    // Later rounds send each client its matched sub-model: the matching is server state.
    killed_and_resumed_equals_whole(&[
        "rounds=6",
        "clients=5",
        "train.epochs=3",
        "method.name=\"pfnm\"",
        "method.sigma=0.1",
    ]);
}

#[test]
fn fedma_resumes_within_a_pass_to_the_uninterrupted_result() {
    // Mid-pass the server holds the fused layers and assignments, each client its model.
    killed_and_resumed_equals_whole(&[
        "rounds=4",
        "clients=5",
        "method.name=\"fedma\"",
        "method.rounds=2",
        "method.sigma=0.1",
    ]);
}

#[test]
fn fedma_on_a_resnet_resumes_within_a_pass_to_the_uninterrupted_result() {
    // ResNet-20's third round fuses a block's inner channels while the stream's norm after
    // that block's last convolution is fused already and the convolution is not (once the
    // checkpoint of such a stage was refused for the norm's width).
    let data = format!(
        "data_dir={:?}",
        repo().join("../shared/data/mnist").display().to_string()
    );
    run_killed_and_resumed_equals_whole(
        "examples/mnist-fedavg.toml",
        &[
            &data,
            "rounds=13",
            "clients=2",
            "dataset.train_samples=300",
            "dataset.test_samples=100",
            "model={kind=\"resnet20\", width=2}",
            "method={name=\"fedma\", sigma=0.1}",
        ],
        3,
    );
}

#[test]
fn deep_gems_resumes_between_its_stages_to_the_uninterrupted_result() {
    // Fused hidden layers and the stage reached; each stage is one round.
    // Three near-IID learners and a looser criterion than the defaults, so the balls meet;
    // killed after both hidden layers are fused, before the output stage.
    run_killed_and_resumed_equals_whole(
        "examples/quickstart.toml",
        &[
            "method.name=\"gems\"",
            "model.hidden=[32, 16]",
            "train.epochs=10",
            "clients=3",
            "partition.alpha=100",
            "method.criterion=\"accuracy\"",
            "method.epsilon=0.5",
            "method.neuron_criterion=\"activation\"",
            "method.neuron_epsilon=0.05",
        ],
        2,
    );
}

#[test]
fn fedngm_resumes_between_its_stages_to_the_uninterrupted_result() {
    // The merged encoding, the clients' graphs (the consensus is rebuilt from them), the last
    // model round's client models and the samples' means; two model rounds, so the resumed
    // run warm-starts from the restored global model.
    // Killed after the first model round.
    run_killed_and_resumed_equals_whole(
        "examples/ngm-synthetic-run.toml",
        &["rounds=4", "method.rounds=2"],
        3,
    );
}

const COMPARISON: &str = r#"
title = "resume test"
seeds = [0, 1]

[base]
rounds = 8
clients = 5
[base.dataset]
name = "digits"
[base.model]
kind = "mlp"
hidden = [32]
[base.train]
epochs = 3

[[arms]]
label = "FedAvg"
method = { name = "fedavg" }

[[arms]]
label = "FedProx"
method = { name = "fedprox", mu = 0.1 }
"#;

#[test]
fn a_comparison_killed_between_runs_resumes_and_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("compare.toml");
    std::fs::write(&file, COMPARISON).unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    let args = |out: &Path| {
        vec![
            "compare".to_string(),
            file.to_str().unwrap().to_string(),
            "--out".to_string(),
            out.to_str().unwrap().to_string(),
        ]
    };
    let o = fedfuse(&args(&whole));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    kill_when_written(&args(&cut), &cut.join("runs.toml"));
    // What a killed comparison leaves is one consistent set: its finished runs' tables.
    let partial = std::fs::read_to_string(cut.join("results.csv")).unwrap();
    assert!(partial.lines().count() < 1 + 4 * 8, "{partial}");

    let mut resumed = args(&cut);
    resumed.push("--resume".into());
    let o = fedfuse(&resumed);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("finished before"), "{err}");
    for name in ["results.csv", "summary.csv", "summary.md"] {
        assert_eq!(
            std::fs::read_to_string(cut.join(name)).unwrap(),
            std::fs::read_to_string(whole.join(name)).unwrap(),
            "{name}"
        );
    }

    // A folder holding someone else's file is refused before anything runs.
    std::fs::write(cut.join("notes.txt"), "mine").unwrap();
    let o = fedfuse(&args(&cut));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("notes.txt"), "{err}");
}

/// A sweep's results.csv without its wall-time column.
fn without_seconds(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(',').map_or(l, |(head, _)| head).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_sweep_killed_between_settings_resumes_and_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    let args = |out: &Path| {
        vec![
            "sweep".to_string(),
            "experiments/digits-smoke.toml".to_string(),
            "--out".to_string(),
            out.to_str().unwrap().to_string(),
        ]
    };
    let o = fedfuse(&args(&whole));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    kill_when_written(&args(&cut), &cut.join("runs.toml"));
    assert!(
        !cut.join("summary.csv").exists(),
        "a killed sweep has no summary yet"
    );

    let mut resumed = args(&cut);
    resumed.push("--resume".into());
    let o = fedfuse(&resumed);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("finished before"), "{err}");
    assert_eq!(
        without_seconds(&cut.join("results.csv")),
        without_seconds(&whole.join("results.csv"))
    );
    assert_eq!(
        std::fs::read_to_string(cut.join("summary.csv")).unwrap(),
        std::fs::read_to_string(whole.join("summary.csv")).unwrap()
    );
}

/// Runs `fedfuse COMMAND FILE --out OUT` whole, then killed once its first seed is in
/// OUT/runs.toml and resumed: `files` must end equal.
fn experiment_killed_after_a_seed_resumes_to_the_whole_result(
    command_name: &str,
    file: &Path,
    files: &[&str],
) {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    let args = |out: &Path| {
        vec![
            command_name.to_string(),
            file.to_str().unwrap().to_string(),
            "--out".to_string(),
            out.to_str().unwrap().to_string(),
        ]
    };
    let o = fedfuse(&args(&whole));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    kill_when_written(&args(&cut), &cut.join("runs.toml"));
    let mut resumed = args(&cut);
    resumed.push("--resume".into());
    let o = fedfuse(&resumed);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("seed 0: finished before"), "{err}");
    for name in files {
        assert_eq!(
            std::fs::read_to_string(cut.join(name)).unwrap(),
            std::fs::read_to_string(whole.join(name)).unwrap(),
            "{name}"
        );
    }

    // Other settings do not take the finished seeds over: everything runs again.
    let text = std::fs::read_to_string(file).unwrap();
    let changed = dir.path().join("changed.toml");
    std::fs::write(&changed, text.replace("title = \"", "title = \"changed: ")).unwrap();
    let mut other = args(&cut);
    other[1] = changed.to_str().unwrap().to_string();
    other.push("--resume".into());
    let o = fedfuse(&other);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("finished before"), "{err}");
}

#[test]
fn a_gems_experiment_killed_between_seeds_resumes_and_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gems.toml");
    std::fs::write(
        &file,
        r#"
title = "resume test"
dataset = "digits"
seeds = [0, 1, 2, 3]
hidden = []
public_samples = [50]
setting = { kind = "class-split", groups = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], parity = true, featurizer_hidden = 16 }
[method]
criterion = "accuracy"
epsilon = 0.4
[train]
epochs = 40
"#,
    )
    .unwrap();
    experiment_killed_after_a_seed_resumes_to_the_whole_result(
        "gems",
        &file,
        &["results.csv", "summary.csv", "summary.md"],
    );
}

#[test]
fn an_ngm_experiment_killed_between_seeds_resumes_and_ends_as_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ngm.toml");
    let text = std::fs::read_to_string(repo().join("experiments/ngm-synthetic.toml")).unwrap();
    let seeds = text
        .lines()
        .find(|l| l.starts_with("seeds"))
        .expect("the experiment lists its seeds");
    // Fewer distillation samples and a tenth of the epochs of the experiment, and no masked
    // copies, to keep the test short: it checks resuming, not quality (the experiment as
    // written took 6 minutes here).
    let short = text
        .replace(seeds, "seeds = [0, 1]")
        .replace("samples_per_client = 8000", "samples_per_client = 2000")
        .replace("masked_copies = 1", "masked_copies = 0")
        .replace("epochs = 3000", "epochs = 300")
        .replace("epochs = 2000", "epochs = 200")
        .replace("epochs = 1000", "epochs = 100");
    assert!(short.contains("samples_per_client = 2000"));
    assert!(short.contains("masked_copies = 0"));
    assert!(!short.contains("epochs = 1000") && short.contains("epochs = 300"));
    std::fs::write(&file, short).unwrap();
    experiment_killed_after_a_seed_resumes_to_the_whole_result(
        "ngm",
        &file,
        &["results.csv", "summary.csv", "summary.md", "results.json"],
    );
}
