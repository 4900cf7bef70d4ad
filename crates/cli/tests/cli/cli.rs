//! The `fedfuse` binary end to end, on real data.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn mnist_dir() -> PathBuf {
    repo().join("../shared/data/mnist")
}

fn fedfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedfuse"))
        .args(args)
        .current_dir(repo())
        // Keep tests away from the user's cache.
        .env(
            "FEDFUSE_DATA",
            std::env::temp_dir().join("fedfuse-test-empty-cache"),
        )
        .output()
        .expect("the fedfuse binary runs")
}

fn run_ok(config: &str, out: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["run", config, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = fedfuse(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "fedfuse {args:?} failed:\n{stderr}");
    // Not a terminal: plain progress lines.
    assert!(stderr.contains("round 1/"), "{stderr}");
    let text = std::fs::read_to_string(out.join("results.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn final_accuracy(results: &Value) -> f64 {
    results["final"]["global_accuracy"].as_f64().unwrap()
}

#[test]
fn quickstart_on_bundled_digits() {
    let root = tempfile::tempdir().unwrap();
    // Three folders that do not exist yet, as `--out runs/quickstart` in a fresh clone.
    let out = root.path().join("runs/new/quickstart");
    let results = run_ok("examples/quickstart.toml", &out, &[]);
    let dir = &out;
    let acc = final_accuracy(&results);
    assert!(acc >= 0.90, "quickstart accuracy {acc}");
    for f in [
        "config.toml",
        "results.json",
        "metrics.csv",
        "model.safetensors",
        "accuracy_vs_round.png",
        "accuracy_vs_round.svg",
        "accuracy_vs_bytes.png",
        "accuracy_vs_bytes.svg",
    ] {
        let meta = std::fs::metadata(dir.join(f)).unwrap();
        assert!(meta.len() > 0, "{f} is empty");
    }
    let rounds = results["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 20);
    for key in [
        "round",
        "global_accuracy",
        "global_loss",
        "local_accuracy_mean",
        "client_accuracy_mean",
        "bytes_up",
        "bytes_down",
        "global_params",
        "seconds",
        "rejected",
    ] {
        assert!(rounds[0].get(key).is_some(), "rounds[0] lacks {key}");
    }
    assert_eq!(
        rounds[0]["global_params"].as_u64(),
        Some(64 * 64 + 64 + 64 * 10 + 10)
    );
    let total: u64 = rounds
        .iter()
        .map(|r| r["bytes_up"].as_u64().unwrap() + r["bytes_down"].as_u64().unwrap())
        .sum();
    assert_eq!(results["final"]["bytes_total"].as_u64(), Some(total));
    // Each client's own upload on its own test split: trained on that client's data, so above
    // chance by far.
    let own = rounds[19]["client_accuracy_mean"].as_f64().unwrap();
    assert!(own > 0.8 && own <= 1.0, "client accuracy {own}");
    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count(), 21);
    // The saved model is the final global model and loads back.
    let params = fedfuse_core::load_safetensors(&dir.join("model.safetensors")).unwrap();
    assert_eq!(params.names()[0], "layers.0.weight");
    assert_eq!(params.tensor_at(0).unwrap().shape, vec![64, 64]);
}

#[test]
fn fedngm_run_writes_each_rounds_traffic_and_held_out_scores() {
    let dir = tempfile::tempdir().unwrap();
    let results = run_ok("examples/ngm-synthetic-run.toml", dir.path(), &[]);
    assert_eq!(results["config"]["table"]["kind"], "synthetic");
    let rounds = results["rounds"].as_array().unwrap();
    // Statistics, graphs, one model round.
    assert_eq!(rounds.len(), 3);
    for r in rounds {
        let (up, down) = (
            r["bytes_up"].as_u64().unwrap(),
            r["bytes_down"].as_u64().unwrap(),
        );
        assert!(
            up > 0 && down > 0,
            "round {}: {up} B up, {down} B down",
            r["round"]
        );
        assert!(r["rejected"].as_array().unwrap().is_empty(), "{r}");
        // The global model is no classifier: NaN, written as null.
        assert!(r["global_accuracy"].is_null(), "{r}");
    }
    // The model round carries 4 clients' models and 2,000 samples of 8 f32 features each.
    assert!(rounds[2]["bytes_up"].as_u64().unwrap() > 4 * 2000 * 8 * 4);
    let total: u64 = rounds
        .iter()
        .map(|r| r["bytes_up"].as_u64().unwrap() + r["bytes_down"].as_u64().unwrap())
        .sum();
    assert_eq!(results["final"]["bytes_total"].as_u64(), Some(total));
    // The server's held-out RMSE of each feature given the others (unit-variance features).
    for f in 0..8 {
        let rmse = rounds[2]["method"][format!("rmse.x{f}")].as_f64().unwrap();
        assert!(rmse > 0.3 && rmse < 2.0, "x{f}: {rmse}");
    }
    let params = fedfuse_core::load_safetensors(&dir.path().join("model.safetensors")).unwrap();
    assert_eq!(params.tensor_at(0).unwrap().shape, vec![64, 8]);
    let csv = std::fs::read_to_string(dir.path().join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4);
    assert!(!dir.path().join("accuracy_vs_round.png").exists());
}

#[test]
fn same_config_and_seed_give_identical_results() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let set = ["--set", "rounds=4", "--set", "clients_per_round=6"];
    let strip = |mut v: Value| {
        for r in v["rounds"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("seconds");
        }
        v["final"].as_object_mut().unwrap().remove("seconds_total");
        v
    };
    let ra = strip(run_ok("examples/quickstart.toml", a.path(), &set));
    let rb = strip(run_ok("examples/quickstart.toml", b.path(), &set));
    assert_eq!(ra, rb);
    assert_eq!(
        std::fs::read(a.path().join("model.safetensors")).unwrap(),
        std::fs::read(b.path().join("model.safetensors")).unwrap()
    );
    let other = tempfile::tempdir().unwrap();
    let rc = strip(run_ok(
        "examples/quickstart.toml",
        other.path(),
        &[&set[..], &["--set", "seed=7"]].concat(),
    ));
    assert_ne!(ra["rounds"], rc["rounds"]);
}

#[test]
fn mnist_fedavg_iid_and_dirichlet() {
    let data = mnist_dir();
    let data = data.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let iid = run_ok(
        "examples/mnist-fedavg.toml",
        dir.path(),
        &["--data-dir", data],
    );
    let acc = final_accuracy(&iid);
    assert!(acc >= 0.95, "MNIST IID FedAvg accuracy {acc}");

    let dir = tempfile::tempdir().unwrap();
    let dirichlet = run_ok(
        "examples/mnist-fedprox-dirichlet.toml",
        dir.path(),
        &["--data-dir", data, "--set", "method={name=\"fedavg\"}"],
    );
    assert_eq!(dirichlet["config"]["method"]["name"], "fedavg");
    assert_eq!(dirichlet["config"]["partition"]["alpha"], 0.5);
    let acc = final_accuracy(&dirichlet);
    assert!(acc >= 0.90, "MNIST Dirichlet(0.5) FedAvg accuracy {acc}");
}

#[test]
fn bad_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let check = |args: &[&str], needles: &[&str]| {
        let o = fedfuse(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&o.stderr);
        for n in needles {
            assert!(stderr.contains(n), "{args:?}: `{n}` not in:\n{stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    check(
        &[
            "run",
            "examples/quickstart.toml",
            "--out",
            out,
            "--set",
            "train.learnig_rate=0.1",
        ],
        &["learnig_rate"],
    );
    check(
        &[
            "run",
            "examples/quickstart.toml",
            "--out",
            out,
            "--set",
            "partition.kind=iid",
        ],
        &["alpha"],
    );
    check(
        &["run", "examples/mnist-fedavg.toml", "--out", out],
        &["fedfuse data get mnist"],
    );
    check(
        &[
            "run",
            "examples/quickstart.toml",
            "--out",
            out,
            "--set",
            "clients=5000",
        ],
        &["5000"],
    );
    check(&["run", "no-such.toml", "--out", out], &["no-such.toml"]);
    check(
        &["data", "verify", "mnist", "--dir", out],
        &["fedfuse data get mnist"],
    );
}

#[test]
fn an_output_path_that_cannot_be_made_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, "a file where a folder should be").unwrap();
    let out = blocker.join("runs/quickstart");
    let o = fedfuse(&[
        "run",
        "examples/quickstart.toml",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot create folder") && stderr.contains("blocker"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("round 1/"),
        "refused only after training:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Nothing lost: the file in the way is as it was.
    assert_eq!(
        std::fs::read_to_string(&blocker).unwrap(),
        "a file where a folder should be"
    );
}

#[test]
fn newcomer_mistakes_say_what_to_do_next() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let out = out.to_str().unwrap();
    let shared = repo().join("../shared");
    let fails = |args: &[&str], needles: &[&str]| {
        let o = fedfuse(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} should fail:\n{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{args:?}: `{n}` not in:\n{stderr}");
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    // A config path typed from another folder.
    fails(
        &["run", "quickstart.toml", "--out", out],
        &["quickstart.toml does not exist", "examples/"],
    );
    // MNIST not downloaded yet (the tests' cache is empty).
    fails(
        &["run", "examples/mnist-fedavg.toml", "--out", out],
        &["not downloaded yet", "fedfuse data get mnist"],
    );
    // --data-dir: a folder that does not exist, one above the data, one holding other files.
    let above = format!("pass --data-dir {}", shared.join("data/mnist").display());
    for (dir, needle) in [
        (
            Path::new("no/such/folder").to_path_buf(),
            "--data-dir folder no/such/folder does not exist",
        ),
        (shared.clone(), above.as_str()),
        (
            shared.join("data/uci-small"),
            "give --data-dir the folder that holds the files",
        ),
    ] {
        let dir = dir.to_str().unwrap();
        let run = ["run", "examples/mnist-fedavg.toml", "--out", out];
        fails(&[&run[..], &["--data-dir", dir]].concat(), &[needle]);
    }
    // A port no SuperLink can listen on is named as such, not tried.
    fails(
        &[
            "flower-node",
            "--superlink",
            "127.0.0.1:181142",
            "--insecure",
            "--config",
            "examples/quickstart.toml",
            "--partition-id",
            "0",
        ],
        &["`181142` is not a port"],
    );
    assert!(
        !Path::new(out).exists(),
        "a refused run must leave no output"
    );
}

#[test]
fn a_node_keeps_trying_a_superlink_that_is_not_listening_yet_then_says_what_to_check() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let superlink = format!("127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let o = fedfuse(&[
        "flower-node",
        "--superlink",
        &superlink,
        "--insecure",
        "--wait-for-superlink",
        "2",
        "--config",
        "examples/quickstart.toml",
        "--partition-id",
        "0",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(
        stderr.contains("no SuperLink answers"),
        "no retry:\n{stderr}"
    );
    assert!(
        stderr.contains("is a SuperLink listening at this address"),
        "{stderr}"
    );
    // Bounded: 2 s of retries, not the default minute.
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn data_verify_accepts_the_shared_mnist() {
    let o = fedfuse(&[
        "data",
        "verify",
        "mnist",
        "--dir",
        mnist_dir().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok")).count(),
        4,
        "{stdout}"
    );
}

/// Output into a pipe whose reader has gone (`fedfuse groups ... | head` once head has read
/// its lines) ends the command quietly with success, not with a panic: the reader is closed
/// before anything is written, so every command's first write meets the broken pipe.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    for args in [
        &["groups", "--model", "examples/fuse/mnist-vit.toml"][..],
        &["data", "info", "femnist"][..],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_fedfuse"))
            .args(args)
            .current_dir(repo())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}\n{stderr}", out.status);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}
