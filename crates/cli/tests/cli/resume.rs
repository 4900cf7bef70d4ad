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

// FedAvg with central DP (its clipping norm adapts, its accountant composes) and a FedAdam
// server step (its moments): every piece of server state a checkpoint must carry.
const SETS: [&str; 12] = [
    "--set",
    "rounds=12",
    "--set",
    "train.epochs=4",
    "--set",
    "server.optimizer=\"adam\"",
    "--set",
    "privacy.kind=\"central-adaptive\"",
    "--set",
    "privacy.noise_multiplier=0.2",
    "--set",
    "privacy.initial_clipping_norm=0.5",
];

#[test]
fn a_run_killed_after_some_rounds_resumes_to_the_uninterrupted_result() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, cut) = (dir.path().join("whole"), dir.path().join("cut"));
    let args = |out: &Path| {
        let mut a: Vec<String> = ["run", "examples/quickstart.toml", "--quiet", "--out"]
            .map(String::from)
            .to_vec();
        a.push(out.to_str().unwrap().to_string());
        a.extend(SETS.map(String::from));
        a
    };
    let o = fedfuse(&args(&whole));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !dir.path().join("whole.checkpoint").exists(),
        "a finished run leaves none"
    );

    // Kill the second run with SIGKILL as soon as a checkpoint exists (after round 1 or a
    // little later: the resumed result may not depend on where).
    let saved = dir.path().join("cut.checkpoint");
    let mut child = command(&args(&cut))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !saved.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before it could be killed"
    );
    child.kill().unwrap(); // SIGKILL: no clean-up of any kind
    child.wait().unwrap();
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
fn a_method_whose_state_cannot_be_saved_refuses_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = fedfuse(&[
        "run",
        "examples/quickstart.toml",
        "--out",
        out.to_str().unwrap(),
        "--resume",
        "--set",
        "method.name=\"fedmix\"",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("cannot resume"),
        "{err}"
    );
}
