//! `model.local_norm = true` (FedBN) on the bundled digits: the norms never travel and the
//! global model's never change, each client keeps its own across rounds (and across a
//! resume), every method that composes runs, what cannot is refused at load, and on clients
//! whose features are shifted FedBN's own models beat FedAvg's global one.

use std::path::Path;

use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_fed::{Method, RoundMetrics, RunResult, SERVER_ROUND, Session, simulate_session};
use fedfuse_lab::run::{Federation, FederationData};
use fedfuse_lab::{Config, Silent};
use serde_json::Value;

/// 64 digit features, a hidden layer of 32 with batch norm, 10 classes.
const FEDBN: &str = r#"
seed = 4
rounds = 3
clients = 4
[dataset]
name = "digits"
[method]
name = "fedavg"
[model]
kind = "sequential"
local_norm = true
layers = [
    { type = "linear", out = 32, bias = false },
    { type = "batchnorm1d" },
    { type = "relu" },
    { type = "linear", out = 10 },
]
[train]
lr = 0.1
epochs = 1
"#;

/// Batch norm's five tensors of 32 channels: what a message under local_norm leaves out.
const NORMS: [&str; 5] = [
    "1.weight",
    "1.bias",
    "1.running_mean",
    "1.running_var",
    "1.num_batches_tracked",
];

fn config(sets: &[&str]) -> Config {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Config::parse(FEDBN, &sets).unwrap()
}

fn run(cfg: &Config) -> RunResult {
    fedfuse_lab::run::federate(cfg, &Silent).unwrap()
}

fn norms_of(params: &Params) -> Vec<Vec<f32>> {
    NORMS
        .iter()
        .map(|n| params.get(n).unwrap().data.clone())
        .collect()
}

/// Simulates `fed` as `fedfuse run` would, from its initial model.
fn simulate(fed: &mut Federation) -> RunResult {
    simulate_session(
        fed.method.as_mut(),
        fed.data.population(),
        fed.init.clone(),
        &fed.sim,
        &|_| {},
        Session::default(),
    )
    .unwrap()
}

/// Client `id`'s model under local_norm: the global weights with its own norms.
fn own_model(fed: &Federation, id: usize, global: &Params) -> Params {
    fed.method.client_model(id, global).unwrap().unwrap()
}

#[test]
fn norms_never_travel_and_the_global_models_never_change() {
    let cfg = config(&[]);
    let fedbn = run(&cfg);
    let fedavg = run(&config(&["model.local_norm=false"]));
    let init = Federation::prepare(&cfg).unwrap().init;

    // An instruction is the global model and the round: without the norms it is shorter by
    // exactly their encoded size, to every client, every round.
    let instruction = |params: Params| {
        Record::from_params(params)
            .with_config(SERVER_ROUND, ConfigValue::Int(1))
            .encode()
            .unwrap()
            .len() as u64
    };
    let mut stripped = init.clone();
    for n in NORMS {
        stripped.remove(n);
    }
    let saved = instruction(init.clone()) - instruction(stripped);
    // 4 x 32 floats and a counter, with their names in the header.
    assert!(saved >= 129 * 4, "{saved}");
    for (b, a) in fedbn.rounds.iter().zip(&fedavg.rounds) {
        assert_eq!(b.clients, 4);
        assert_eq!(a.bytes_down - b.bytes_down, 4 * saved, "round {}", b.round);
        // Replies differ by the same tensors, give or take their metrics' digits.
        let up = a.bytes_up as i64 - b.bytes_up as i64;
        assert!(
            (4 * saved as i64 - 4 * 64..=4 * saved as i64 + 4 * 64).contains(&up),
            "round {}: replies {up} bytes smaller, norms {saved} a message",
            b.round
        );
    }
    // The global model's norms are the initial ones after every aggregate; its other weights
    // trained.
    assert_eq!(norms_of(&fedbn.params), norms_of(&init));
    assert_ne!(
        fedbn.params.get("0.weight").unwrap().data,
        init.get("0.weight").unwrap().data
    );
    // FedAvg averages them instead.
    assert_ne!(norms_of(&fedavg.params), norms_of(&init));
    // FedBN's figure is each client's model on its own split, and it learned.
    let last = fedbn.rounds.last().unwrap();
    assert!(last.local_accuracy_mean > 0.85, "{last:?}");
    assert!(last.client_accuracy_mean > 0.85, "{last:?}");
    assert_eq!(last.client_accuracies.len(), 4);
}

#[test]
fn each_client_keeps_its_own_norms_across_rounds() {
    // Clients 1-3 see features scaled and shifted (FedBN's feature shift); client 0 the data
    // as it is.
    let shifted = |rounds: &str| {
        let mut fed = Federation::prepare(&config(&[rounds])).unwrap();
        let FederationData::Labelled { clients, .. } = &mut fed.data else {
            unreachable!()
        };
        for (i, c) in clients.iter_mut().enumerate() {
            for x in c.train.x.iter_mut().chain(c.test.x.iter_mut()) {
                *x = *x * (1 + i) as f32 + i as f32;
            }
        }
        fed
    };
    let mut one = shifted("rounds=1");
    let after_one = simulate(&mut one);
    let mut three = shifted("rounds=3");
    let after_three = simulate(&mut three);
    let counter = |fed: &Federation, r: &RunResult, id: usize| {
        own_model(fed, id, &r.params)
            .get("1.num_batches_tracked")
            .unwrap()
            .data[0]
    };
    let means: Vec<Vec<f32>> = (0..4)
        .map(|id| {
            own_model(&three, id, &after_three.params)
                .get("1.running_mean")
                .unwrap()
                .data
                .clone()
        })
        .collect();
    for id in 0..4 {
        // Every client takes part every round and counts its batches on from where its last
        // round left them: three rounds count three times one round's.
        let (c1, c3) = (
            counter(&one, &after_one, id),
            counter(&three, &after_three, id),
        );
        assert!(c1 > 0.0 && c3 == 3.0 * c1, "client {id}: {c1} then {c3}");
    }
    // The global model kept the initial statistics; each client has its own, and the more
    // its features are shifted, the farther its running means are from client 0's.
    let global = after_three.params.get("1.running_mean").unwrap();
    assert!(global.data.iter().all(|&m| m == 0.0), "{:?}", global.data);
    let distance =
        |a: &[f32], b: &[f32]| -> f32 { a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum() };
    let from_first: Vec<f32> = means.iter().map(|m| distance(m, &means[0])).collect();
    assert!(
        from_first.windows(2).all(|w| w[1] > w[0]),
        "running means' distance from client 0: {from_first:?}"
    );
}

/// A run's results without wall-clock times.
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

#[test]
fn a_resumed_run_equals_an_uninterrupted_one() {
    // Two clients of four a round: some take part for the first time after the interruption,
    // others again with the norms the checkpoint kept.
    let cfg = config(&["rounds=4", "clients_per_round=2"]);
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    fedfuse_lab::run::run(&cfg, &whole, &Silent).unwrap();

    // The same run, stopped after round 2 with its checkpoint written, then resumed.
    let out = dir.path().join("resumed");
    let saved = fedfuse_lab::checkpoint::path_for(&out);
    let mut fed = Federation::prepare(&cfg).unwrap();
    let stop = |global: &Params,
                rounds: &[RoundMetrics],
                method: &dyn Method|
     -> Result<(), fedfuse_fed::BoxError> {
        fedfuse_lab::checkpoint::write(&saved, &cfg, global, rounds, method)?;
        if rounds.len() == 2 {
            return Err("interrupted".into());
        }
        Ok(())
    };
    let stopped = simulate_session(
        fed.method.as_mut(),
        fed.data.population(),
        fed.init.clone(),
        &fed.sim,
        &|_| {},
        Session {
            done: Vec::new(),
            after_round: Some(&stop),
        },
    );
    assert!(stopped.is_err());
    // The checkpoint holds the clients' norms.
    let checkpoint = fedfuse_lab::checkpoint::read(&saved, &cfg)
        .unwrap()
        .unwrap();
    assert_eq!(checkpoint.rounds.len(), 2);
    let kept = checkpoint
        .state
        .params
        .names()
        .iter()
        .filter(|n| n.starts_with("client.") && n.ends_with(".1.running_mean"))
        .count();
    assert!(kept >= 2, "{:?}", checkpoint.state.params.names());

    fedfuse_lab::run::run_with(&cfg, &out, &Silent, true).unwrap();
    assert_eq!(results(&out), results(&whole));
    assert_eq!(
        std::fs::read(out.join("model.safetensors")).unwrap(),
        std::fs::read(whole.join("model.safetensors")).unwrap()
    );
    // And the same config and seed give the same results again.
    let again = dir.path().join("again");
    fedfuse_lab::run::run(&cfg, &again, &Silent).unwrap();
    assert_eq!(results(&again), results(&whole));
    // The run folder's config.toml shows the setting.
    let shown = std::fs::read_to_string(whole.join("config.toml")).unwrap();
    assert!(shown.contains("local_norm = true"), "{shown}");
}

#[test]
fn every_method_that_composes_runs_and_keeps_the_global_norms() {
    let own: &[(&str, &[&str])] = &[
        (
            "separate inits",
            &["method={name=\"fedavg\", separate_inits=true}"],
        ),
        ("max_update_norm", &["replies.max_update_norm=1000.0"]),
    ];
    let runs = crate::zoo::AGGREGATOR_RUNS.iter().chain(own);
    for (name, sets) in runs {
        let cfg = config(sets);
        let init = Federation::prepare(&cfg).unwrap().init;
        let result =
            fedfuse_lab::run::federate(&cfg, &Silent).unwrap_or_else(|e| panic!("{name}: {e}"));
        let last = result.rounds.last().unwrap();
        assert!(
            last.rejected.is_empty(),
            "{name}: rejected {:?}",
            last.rejected
        );
        assert!(
            last.local_accuracy_mean > 0.5,
            "{name}: local accuracy {:.3}",
            last.local_accuracy_mean
        );
        for n in ["1.weight", "1.bias"] {
            assert_eq!(
                result.params.get(n).unwrap().data,
                init.get(n).unwrap().data,
                "{name}: {n}"
            );
        }
    }
}

#[test]
fn what_local_norm_cannot_do_is_refused_at_load() {
    let err = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        match Config::parse(FEDBN, &sets) {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("{sets:?} was accepted"),
        }
    };
    let no_norm = |e: String| {
        assert!(
            e.contains("model.local_norm") && e.contains("no normalisation layer"),
            "{e}"
        );
    };
    no_norm(err(&[
        "model.kind=\"mlp\"",
        "model.layers=[]",
        "model.hidden=[16]",
    ]));
    no_norm(err(&[
        "model.layers=[{type=\"flatten\"}, {type=\"linear\", out=10}]",
    ]));
    no_norm(err(&[
        "model.kind=\"resnet20\"",
        "model.layers=[]",
        "model.norm=\"none\"",
    ]));
    assert!(err(&["local_eval=false"]).contains("local_eval = true"));
    assert!(err(&["dataset.local_test_fraction=0.0"]).contains("local_test_fraction"));
    for method in [
        "method={name=\"fedsparse\"}",
        "method={name=\"fedl1\", l1=0.0001, threshold=0.001}",
    ] {
        let e = err(&[method]);
        assert!(
            e.contains("model.local_norm") && e.contains("whole group"),
            "{e}"
        );
    }
    let e = err(&["method={name=\"fedmix\", mixture_term=true}"]);
    assert!(e.contains("mixture_term = false"), "{e}");
    let e = err(&[
        "model.layers=[{type=\"linear\", out=8}, {type=\"layernorm\"}, {type=\"linear\", out=10}]",
        "privacy={kind=\"local\", clipping_norm=1.0, sensitivity=1.0, epsilon=1.0, delta=1e-5}",
    ]);
    assert!(e.contains("local DP"), "{e}");
    // FedDrop drops a unit with its norm channel, which stays on the clients.
    let e = err(&["method={name=\"feddrop\"}"]);
    assert!(
        e.contains("model.local_norm") && e.contains("feddrop") && e.contains("zeros"),
        "{e}"
    );
    // Without local_norm, the resolved config leaves the key out (older checkpoints resume).
    let plain = config(&["model.local_norm=false"]);
    assert!(!toml::to_string(&plain).unwrap().contains("local_norm"));
}

#[test]
fn on_shifted_features_fedbns_own_models_beat_fedavgs_global_one() {
    // FedBN's setting: each client's features in units of their own (client i: x (1 + i) +
    // 3 i). FedAvg's global batch norm holds the mean of the clients' statistics, right for
    // none of them; FedBN's clients normalise with their own. After 5 rounds, seeds 1, 2, 3:
    // FedBN 0.885, 0.920, 0.910; FedAvg 0.524, 0.361, 0.566 (seed 4: 0.899 and 0.403).
    for seed in [1, 2, 3] {
        let accuracy = |local_norm: bool| {
            let mut fed = Federation::prepare(&config(&[
                &format!("seed={seed}"),
                &format!("model.local_norm={local_norm}"),
                "rounds=5",
            ]))
            .unwrap();
            let FederationData::Labelled { clients, .. } = &mut fed.data else {
                unreachable!()
            };
            for (i, c) in clients.iter_mut().enumerate() {
                for x in c.train.x.iter_mut().chain(c.test.x.iter_mut()) {
                    *x = *x * (1 + i) as f32 + 3.0 * i as f32;
                }
            }
            simulate(&mut fed)
                .rounds
                .last()
                .unwrap()
                .local_accuracy_mean
        };
        let (fedbn, fedavg) = (accuracy(true), accuracy(false));
        assert!(
            fedbn > 0.85 && fedbn > fedavg + 0.25,
            "seed {seed}: FedBN {fedbn:.3}, FedAvg {fedavg:.3}"
        );
    }
}

#[test]
fn a_flower_node_keeps_its_clients_norms_between_rounds() {
    // What `fedfuse flower-node` runs: one Federation for the whole run, its method's
    // client step on each train message.
    let fed = Federation::prepare(&config(&[])).unwrap();
    let id = 2;
    let counter = |content: &fedfuse_core::flower::FlowerContent| {
        Record::from_flower(content)
            .unwrap()
            .params
            .get("1.num_batches_tracked")
            .map(|t| t.data[0])
    };
    // fedfuse's strategy sends no norms, and the node replies with none.
    let stripped = fed.method.instruct(1, id, &fed.init).unwrap();
    assert!(stripped.params.get("1.running_mean").is_none());
    let first = fed.client_fit(id, &stripped.to_flower().unwrap()).unwrap();
    assert_eq!(counter(&first), None);
    let batches = own_model(&fed, id, &fed.init)
        .get("1.num_batches_tracked")
        .unwrap()
        .data[0];
    assert!(batches > 0.0);
    // A stock Flower strategy sends whole models: the node trains from its own norms, not
    // the received ones, and replies with a whole model.
    let mut whole = Record::from_params(fed.init.clone())
        .with_config(SERVER_ROUND, ConfigValue::Int(2))
        .to_flower()
        .unwrap();
    let second = fed.client_fit(id, &whole).unwrap();
    assert_eq!(counter(&second), Some(2.0 * batches));
    // Its evaluation scores the received model with its own norms: received norms that
    // would wreck the model change nothing.
    let before = fed.client_evaluate(id, &whole).unwrap();
    assert!(before.1 > 0.0 && before.2 > 0, "{before:?}");
    let mut wrecked = fed.init.clone();
    wrecked.get_mut("1.running_mean").unwrap().data.fill(1e6);
    whole = Record::from_params(wrecked).to_flower().unwrap();
    assert_eq!(fed.client_evaluate(id, &whole).unwrap(), before);
}
