//! Issue 49: hostile configs, model files and checkpoints are refused at load, naming what is
//! wrong, instead of panicking, aborting on an allocation, running until killed or training
//! on silently wrong values.

use std::path::{Path, PathBuf};

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_lab::run::Federation;
use fedfuse_lab::{Config, Silent};

const QUICKSTART: &str = include_str!("../../../../examples/quickstart.toml");
pub(crate) const LAYERS: &str = include_str!("../../../../examples/digits-layers.toml");

/// `text` with `--set` values `sets`, or the error with its causes.
pub(crate) fn parse(text: &str, sets: &[&str]) -> Result<Config, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(text, &sets).map_err(|e| format!("{e:#}"))
}

fn refused(text: &str, sets: &[&str]) -> String {
    let prepared =
        parse(text, sets).and_then(|cfg| Federation::prepare(&cfg).map_err(|e| format!("{e:#}")));
    match prepared {
        Ok(_) => panic!("accepted {sets:?}"),
        Err(e) => e,
    }
}

fn mnist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/mnist")
}

#[test]
fn unbounded_counts_are_refused_at_load() {
    // Item 10: zero epochs would reject every reply; item 6: 10^12 epochs would run forever.
    let e = refused(QUICKSTART, &["train.epochs=0"]);
    assert!(
        e.contains("train.epochs") && e.contains("at least 1"),
        "{e}"
    );
    let e = refused(QUICKSTART, &["train.epochs=1000000000000"]);
    assert!(e.contains("train.epochs") && e.contains("100000"), "{e}");
    // Item 6: a matching's refinement passes.
    for method in ["pfnm", "fedma"] {
        let e = refused(
            LAYERS,
            &[
                &format!("method.name=\"{method}\""),
                "method.iters=1000000000",
                "rounds=40",
            ],
        );
        assert!(e.contains("iters") && e.contains("10000"), "{method}: {e}");
    }
    // Item 1: FedMA's passes times its rounds per pass must not wrap.
    let e = refused(
        LAYERS,
        &["method.name=\"fedma\"", "method.rounds=4611686018427387904"],
    );
    assert!(e.contains("method.rounds") && e.contains("lower"), "{e}");
}

#[test]
fn parameter_counts_that_overflow_are_refused_naming_the_layer() {
    // Item 1: 2^58 outputs wrapped to a small count and passed the parameter limit.
    let e = refused(
        LAYERS,
        &[
            "model.layers=[{type=\"linear\",out=288230376151711744,bias=false},{type=\"linear\",out=64,bias=false},{type=\"linear\",out=10}]",
        ],
    );
    assert!(e.contains("model.layers[0] (linear"), "{e}");
    // The limit's message names the largest layer, not an MLP-only key.
    let e = refused(
        LAYERS,
        &["model.layers=[{type=\"linear\",out=9000000},{type=\"relu\"},{type=\"linear\",out=10}]"],
    );
    assert!(
        e.contains("model.layers[0] (linear") && !e.contains("hidden"),
        "{e}"
    );
}

#[test]
fn activations_beyond_the_memory_budget_are_refused_naming_the_layer() {
    // Item 2: 778 parameters, and 35 GB of activations a batch.
    let mnist = format!("data_dir=\"{}\"", mnist().display());
    let e = refused(
        QUICKSTART,
        &[
            "dataset.name=\"mnist\"",
            &mnist,
            "model.kind=\"sequential\"",
            "model.hidden=[]",
            "model.layers=[{type=\"conv2d\",out=64,kernel=1,padding=1024},{type=\"global_avgpool\"},{type=\"flatten\"},{type=\"linear\",out=10}]",
            "train.batch_size=32",
        ],
    );
    assert!(
        e.contains("model.layers[0] (conv2d")
            && e.contains("train.batch_size")
            && e.contains("train.max_memory_mb"),
        "{e}"
    );
    // The budget is a setting: a 4096-wide layer on digits fits 8 GiB, not 1 MiB.
    let wide = "model.layers=[{type=\"linear\",out=4096},{type=\"relu\"},{type=\"linear\",out=10}]";
    assert!(Federation::prepare(&parse(LAYERS, &[wide]).unwrap()).is_ok());
    let e = refused(LAYERS, &[wide, "train.max_memory_mb=1"]);
    assert!(e.contains("above `train.max_memory_mb` = 1"), "{e}");
    // The key itself: zero and negative budgets are refused, the largest one saturates.
    let e = refused(LAYERS, &["train.max_memory_mb=0"]);
    assert!(
        e.contains("train.max_memory_mb") && e.contains("at least 1"),
        "{e}"
    );
    assert!(parse(LAYERS, &["train.max_memory_mb=-5"]).is_err());
    let most = format!("train.max_memory_mb={}", i64::MAX);
    assert!(Federation::prepare(&parse(LAYERS, &[wide, &most]).unwrap()).is_ok());
    assert!(Federation::prepare(&parse(LAYERS, &[]).unwrap()).is_ok());
}

/// A model file holding the digits-layers network's tensors, with `edit` applied, as
/// PyTorch writes one: F32 tensors, batch norm's counters as I64 (which may be negative).
fn init_file(dir: &Path, edit: impl Fn(&mut Params)) -> PathBuf {
    use safetensors::tensor::{Dtype, TensorView};
    let fed = Federation::prepare(&parse(LAYERS, &[]).unwrap()).unwrap();
    let mut p = fed.init.clone();
    edit(&mut p);
    let bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = p
        .iter()
        .map(|(name, t)| {
            let (dtype, data) = if name.ends_with("num_batches_tracked") {
                let v = t
                    .data
                    .iter()
                    .flat_map(|&x| (x as i64).to_le_bytes())
                    .collect();
                (Dtype::I64, v)
            } else {
                (
                    Dtype::F32,
                    t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            };
            (name.to_string(), dtype, t.shape.clone(), data)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let path = dir.join("init.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &path).unwrap();
    path
}

/// Sets the first value of tensor `name`.
fn set(p: &mut Params, name: &str, value: f32) {
    p.get_mut(name).unwrap().data[0] = value;
}

#[test]
fn batch_norm_buffers_outside_their_domain_are_refused() {
    // Item 8: a negative variance trained to NaN losses; a negative count was written as 0.
    let dir = tempfile::tempdir().unwrap();
    for (tensor, value) in [("1.running_var", -1.0), ("1.num_batches_tracked", -3.0)] {
        let path = init_file(dir.path(), |p| set(p, tensor, value));
        let e = refused(
            LAYERS,
            &[&format!("model.init_from=\"{}\"", path.display())],
        );
        assert!(e.contains(tensor) && e.contains("at least 0"), "{e}");
        let fed = Federation::prepare(&parse(LAYERS, &[]).unwrap()).unwrap();
        let models = [
            ("a".to_string(), fedfuse_core::load_params(&path).unwrap()),
            ("b".to_string(), fed.init.clone()),
        ];
        let settings = fedfuse_lab::fusion::FuseSettings {
            method: fedfuse_lab::fusion::FuseMethod::FedAvg,
            pfnm: fedfuse_fuse::PfnmConfig::default(),
            order: None,
            weight_matching: fedfuse_fuse::WeightMatchingConfig::default(),
            seed: 0,
        };
        let e = fedfuse_lab::fusion::fuse_with(Vec::from(models), None, None, &settings)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains(tensor), "fuse: {e}");
    }
    // Within the domain, the same file is taken.
    let ok = init_file(dir.path(), |p| set(p, "1.running_var", 0.0));
    let cfg = parse(LAYERS, &[&format!("model.init_from=\"{}\"", ok.display())]).unwrap();
    assert!(Federation::prepare(&cfg).is_ok());
}

/// Runs `text` with `sets` for `rounds` rounds into `dir/out`, interrupted after the last
/// round so that its checkpoint stays; returns the checkpoint's path and the config.
pub(crate) fn interrupted(
    dir: &Path,
    text: &str,
    sets: &[&str],
    rounds: usize,
) -> (PathBuf, Config) {
    let cfg = parse(text, sets).unwrap();
    let out = dir.join("out");
    let saved = fedfuse_lab::checkpoint::path_for(&out);
    let stop = |global: &Params,
                done: &[fedfuse_fed::RoundMetrics],
                method: &dyn fedfuse_fed::Method|
     -> Result<(), fedfuse_fed::BoxError> {
        fedfuse_lab::checkpoint::write(&saved, &cfg, global, done, method)?;
        if done.len() == rounds {
            return Err("interrupted".into());
        }
        Ok(())
    };
    assert!(simulate_with(&cfg, &stop).is_err());
    (saved, cfg)
}

/// The federation of `cfg` from round 1, with `after` called after every round (an error
/// from it stops the run there).
fn simulate_with(
    cfg: &Config,
    after: fedfuse_fed::AfterRound<'_>,
) -> Result<fedfuse_fed::RunResult, fedfuse_fed::FedError> {
    let mut fed = Federation::prepare(cfg).unwrap();
    fedfuse_fed::simulate_session(
        fed.method.as_mut(),
        fed.data.population(),
        fed.init.clone(),
        &fed.sim,
        &|_| {},
        fedfuse_fed::Session {
            done: Vec::new(),
            after_round: Some(after),
        },
    )
}

/// The checkpoint at `path` with `edit` applied to its record.
pub(crate) fn tamper(path: &Path, edit: impl Fn(&mut Record)) {
    let mut record = Record::decode(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut record);
    std::fs::write(path, record.encode().unwrap()).unwrap();
}

fn resume_error(cfg: &Config, saved: &Path) -> String {
    let out = saved.with_file_name("out");
    match fedfuse_lab::run::run_with(cfg, &out, &Silent, true) {
        Ok(_) => panic!("resumed from a tampered checkpoint"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn a_tampered_fedma_checkpoint_is_refused() {
    // Item 4: `progress.stage = 99` indexed past the layers.
    let dir = tempfile::tempdir().unwrap();
    let sets = [
        "method.name=\"fedma\"",
        "rounds=2",
        "clients=3",
        "train.epochs=1",
    ];
    let (saved, cfg) = interrupted(dir.path(), LAYERS, &sets, 1);
    tamper(&saved, |r| {
        let Some(ConfigValue::Str(json)) = r.config.get("state:progress") else {
            panic!("no FedMA progress in {:?}", r.config.keys());
        };
        let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
        v["stage"] = 99.into();
        r.config
            .insert("state:progress".into(), ConfigValue::Str(v.to_string()));
    });
    let e = resume_error(&cfg, &saved);
    assert!(e.contains("stage 99") && e.contains("checkpoint"), "{e}");
}

#[test]
fn a_resumed_checkpoint_is_checked_against_the_config() {
    // Item 9.
    let dir = tempfile::tempdir().unwrap();
    let sets = ["rounds=3", "clients=3", "train.epochs=1"];
    let fresh = |dir: &Path| interrupted(dir, QUICKSTART, &sets, 2);

    // A global model of other widths.
    let (saved, cfg) = fresh(dir.path());
    tamper(&saved, |r| {
        let t = r.params.get_mut("global:layers.0.weight").unwrap();
        t.shape = vec![t.shape[0] / 2, t.shape[1] * 2];
    });
    let e = resume_error(&cfg, &saved);
    assert!(e.contains("does not fit the config's model"), "{e}");

    // NaN in the global model.
    let (saved, cfg) = fresh(dir.path());
    tamper(&saved, |r| {
        set(&mut r.params, "global:layers.0.bias", f32::NAN)
    });
    let e = resume_error(&cfg, &saved);
    assert!(
        e.contains("non-finite") && e.contains("global model"),
        "{e}"
    );

    // A history of no rounds, or of round 1 twice.
    for doubled in [false, true] {
        let (saved, cfg) = fresh(dir.path());
        let history = fedfuse_lab::checkpoint::history_path(&saved);
        let text = std::fs::read_to_string(&history).unwrap();
        let first = text.split("[[rounds]]").nth(1).unwrap();
        let forged = if doubled {
            format!("[[rounds]]{first}[[rounds]]{first}")
        } else {
            "rounds = []\n".to_string()
        };
        std::fs::write(&history, &forged).unwrap();
        tamper(&saved, |r| {
            let n = if doubled { 2 } else { 0 };
            r.config.insert("rounds".into(), ConfigValue::Int(n));
            r.config
                .insert("rounds_bytes".into(), ConfigValue::Int(forged.len() as i64));
        });
        let e = resume_error(&cfg, &saved);
        assert!(e.contains("history"), "doubled {doubled}: {e}");
    }

    // Adam's second moment below zero.
    let adam = [
        "rounds=3",
        "clients=3",
        "train.epochs=1",
        "server.optimizer=\"adam\"",
    ];
    let (saved, cfg) = interrupted(dir.path(), QUICKSTART, &adam, 2);
    tamper(&saved, |r| {
        let name = r
            .params
            .names()
            .iter()
            .find(|n| n.contains("v/"))
            .cloned()
            .expect("a second moment");
        set(&mut r.params, &name, -1.0);
    });
    let e = resume_error(&cfg, &saved);
    assert!(
        e.contains("second moment") && !e.contains("matching"),
        "{e}"
    );
}

#[test]
fn the_checkpoint_appends_each_round_and_ignores_what_it_does_not_cover() {
    // Item 7: the history grows by appending, so a round's cost does not grow with the run.
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(QUICKSTART, &["rounds=4", "clients=3", "train.epochs=1"]).unwrap();
    let out = dir.path().join("out");
    let saved = fedfuse_lab::checkpoint::path_for(&out);
    let history = fedfuse_lab::checkpoint::history_path(&saved);
    let writer = fedfuse_lab::checkpoint::Checkpointer::new(&saved);
    let seen = std::sync::Mutex::new(Vec::<Vec<u8>>::new());
    let after = |global: &Params,
                 done: &[fedfuse_fed::RoundMetrics],
                 method: &dyn fedfuse_fed::Method|
     -> Result<(), fedfuse_fed::BoxError> {
        writer.write(&cfg, global, done, method)?;
        seen.lock().unwrap().push(std::fs::read(&history)?);
        if done.len() == 3 {
            return Err("interrupted".into());
        }
        Ok(())
    };
    assert!(simulate_with(&cfg, &after).is_err());
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 3);
    for pair in seen.windows(2) {
        assert!(pair[1].len() > pair[0].len() && pair[1].starts_with(&pair[0]));
    }
    // A round appended by a run killed before its record was written is not read, and the
    // resumed run cuts it off.
    let mut junk = seen[2].clone();
    junk.extend_from_slice(b"[[rounds]]\nround = 4\ngarbage = ");
    std::fs::write(&history, &junk).unwrap();
    let c = fedfuse_lab::checkpoint::read(&saved, &cfg)
        .unwrap()
        .unwrap();
    assert_eq!(c.rounds.len(), 3);
    // A history cut shorter than its record names is refused, naming it.
    std::fs::write(&history, &seen[2][..seen[2].len() / 2]).unwrap();
    let e = fedfuse_lab::checkpoint::read(&saved, &cfg)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(e.contains("history") && e.contains("bytes"), "{e}");
    std::fs::write(&history, &junk).unwrap();
    let resumed = fedfuse_lab::run::run_with(&cfg, &out, &Silent, true).unwrap();
    let whole = fedfuse_lab::run::run(&cfg, &dir.path().join("whole"), &Silent).unwrap();
    assert_eq!(resumed.params, whole.params);
    assert_eq!(resumed.rounds.len(), 4);
    assert!(
        !saved.exists() && !history.exists(),
        "a finished run leaves no checkpoint"
    );
}

#[test]
fn a_local_accuracy_nobody_measured_is_null_with_the_reason() {
    // Item 11: the mean of no clients was -0.0.
    let dir = tempfile::tempdir().unwrap();
    let cfg = parse(
        QUICKSTART,
        &["rounds=1", "clients=3", "dataset.local_test_fraction=0"],
    )
    .unwrap();
    let out = dir.path().join("out");
    let run = fedfuse_lab::run::run(&cfg, &out, &Silent).unwrap();
    assert!(run.rounds[0].local_accuracy_mean.is_nan());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(json["final"]["local_accuracy_mean"].is_null(), "{json}");
    let why = json["final"]["unmeasured"]["local_accuracy_mean"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("local_test_fraction"), "{json}");
}

/// `[batch_norm]`: a batch size of zero, a negative or huge one, an unknown key, a model
/// without batch norm and FedBN's local norms are refused at load, naming the key.
#[test]
fn batch_norm_rounds_refuse_bad_settings_at_load() {
    let on = |rest: &str| format!("batch_norm={{reestimate=true{rest}}}");
    for (sets, want) in [
        (vec![on(", batch_size=0")], "batch_norm.batch_size"),
        (vec![on(", batch_size=1000000000000")], "1 to 65536"),
        (vec![on(", batch_size=-4")], "batch_size"),
        (vec![on(", batch=4")], "unknown field `batch`"),
        (
            vec![on(""), "model.local_norm=true".into()],
            "model.local_norm",
        ),
        (
            vec![on(""), "replies.max_update_norm=1.0".into()],
            "replies.max_update_norm",
        ),
    ] {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let e = refused(LAYERS, &sets);
        assert!(e.contains(want), "{sets:?}: {e}");
    }
    let e = refused(QUICKSTART, &[&on("")]);
    assert!(e.contains("no batch norm"), "{e}");
}

/// `[model.vit]` and the ViT layer types: huge, zero, negative, NaN and non-dividing values
/// are refused at load, naming the key or layer, before any list or tensor is built.
#[test]
fn hostile_vit_settings_are_refused_by_name() {
    const VIT: &str = include_str!("../../../../examples/mnist-vit.toml");
    let data = format!("data_dir={:?}", mnist().display().to_string());
    let cases: &[(&str, &str)] = &[
        ("model.vit.layers=100000000", "model.vit.layers"),
        ("model.vit.layers=0", "model.vit.layers"),
        ("model.vit.heads=0", "model.vit.heads"),
        ("model.vit.heads=3", "must divide"),
        ("model.vit.hidden=0", "model.vit.hidden"),
        ("model.vit.mlp=1000000000000", "model.vit.mlp"),
        ("model.vit.patch=-1", "patch"),
        ("model.vit.patch=5", "does not divide"),
        ("model.vit.dropout=nan", "model.vit.dropout"),
        (
            "model.vit.attention_dropout=-0.5",
            "model.vit.attention_dropout",
        ),
        ("model.vit.dropout=1.0", "model.vit.dropout"),
        // Within every key's bound: past a tensor's bound, or the parameter limit.
        (
            "model.vit={hidden=65536, mlp=262144, layers=256}",
            "holds more than",
        ),
        (
            "model.vit={hidden=4096, mlp=16384, layers=256}",
            "parameters",
        ),
        (
            "model.vit.mlps=[64]",
            "model.vit.mlps has 1 widths for 2 blocks",
        ),
        ("model.vit.mlps=[64, 0]", "model.vit.mlps holds 0"),
        ("model.vit.mlps=[64, 1000000000000]", "model.vit.mlps"),
        ("model.vit.bogus=1", "bogus"),
        ("model.kind=\"mlp\"", "[model.vit] applies to `vit` only"),
    ];
    for (set, want) in cases {
        let e = refused(VIT, &[&data, set]);
        assert!(e.contains(want), "{set}: {e}");
    }
    let list = |layers: &str| {
        refused(
            VIT,
            &[
                &data,
                "model={kind=\"sequential\"}",
                &format!("model.layers={layers}"),
            ],
        )
    };
    let e = list("[{type=\"tokens\", hidden=0, patch=7}]");
    assert!(e.contains("hidden = 0"), "{e}");
    let e = list("[{type=\"tokens\", hidden=8, patch=7}, {type=\"encoder\", heads=0, mlp=4}]");
    assert!(e.contains("heads = 0"), "{e}");
    let e = list("[{type=\"tokens\", hidden=8, patch=7}, {type=\"encoder\", heads=2, mlp=0}]");
    assert!(e.contains("mlp = 0"), "{e}");
    let e = list("[{type=\"encoder\", heads=2, mlp=4}]");
    assert!(e.contains("model.layers[0]"), "{e}");
}
