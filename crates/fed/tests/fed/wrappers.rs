//! The method wrappers (a `[server]` step, central and local DP, separate inits, FedBN's local
//! norms) around a method that records every call it gets: each call a wrapper does not
//! change reaches the wrapped method, and a wrapper's streaming server step gives what its
//! `aggregate` gives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fedfuse_core::{LayerSpec, ModelSpec, Params, Record};
use fedfuse_data::{ClientData, Dataset, Table};
use fedfuse_fed::{
    Aggregate, ClientContext, DpSampling, Fold, LocalNorm, Method, PrivacySettings, Reply, Result,
    SeparateInits, ServerStep, TableContext,
};
use fedfuse_fuse::ServerOptimizer;
use fedfuse_train::{Init, TrainConfig, Trainer, init_params};

/// Every call of [`Method`] but `name` (which only labels) and `stateless` (read by a method
/// of its own's defaults only, never delegated).
const CALLS: [&str; 19] = [
    "instruct",
    "fit",
    "tabular",
    "fit_table",
    "weighs_by_examples",
    "restore_reply",
    "client_model",
    "client_state",
    "set_client_state",
    "check_reply",
    "aggregate",
    "aggregate_no_replies",
    "fold",
    "round_metrics",
    "evaluate",
    "evaluate_table",
    "save_state",
    "load_state",
    "finished",
];

type Log = Arc<Mutex<Vec<&'static str>>>;

/// A method that answers every call plainly and writes its name down.
struct Recording {
    log: Log,
}

impl Recording {
    fn note(&self, call: &'static str) {
        self.log.lock().unwrap().push(call);
    }
}

/// The element-wise sum of the replies' models.
fn sum(replies: &[Params]) -> Params {
    let mut out = replies[0].clone();
    for r in &replies[1..] {
        for ((_, o), (_, t)) in out.iter_mut().zip(r.iter()) {
            o.data.iter_mut().zip(&t.data).for_each(|(a, b)| *a += b);
        }
    }
    out
}

struct SumFold {
    log: Log,
    seen: Vec<Params>,
}

impl Fold for SumFold {
    fn add(&mut self, reply: Reply) -> Result<()> {
        self.seen.push(reply.record.params);
        Ok(())
    }

    fn finish(self: Box<Self>, _round: usize, _global: &Params) -> Result<Aggregate> {
        self.log.lock().unwrap().push("fold.finish");
        Ok(Aggregate::Replace(sum(&self.seen)))
    }
}

impl Method for Recording {
    fn name(&self) -> &'static str {
        "fedavg"
    }

    fn instruct(&self, _round: usize, _client: usize, global: &Params) -> Result<Record> {
        self.note("instruct");
        Ok(Record::from_params(global.clone()))
    }

    fn fit(&self, instruction: Record, _ctx: &ClientContext<'_>) -> Result<Record> {
        self.note("fit");
        Ok(Record::from_params(instruction.params).with_num_examples(4))
    }

    fn tabular(&self) -> bool {
        self.note("tabular");
        false
    }

    fn fit_table(&self, instruction: Record, _ctx: &TableContext<'_>) -> Result<Record> {
        self.note("fit_table");
        Ok(instruction)
    }

    fn weighs_by_examples(&self) -> bool {
        self.note("weighs_by_examples");
        true
    }

    fn restore_reply(&self, _global: &Params, reply: Record) -> Result<Record> {
        self.note("restore_reply");
        Ok(reply)
    }

    fn client_model(&self, _client: usize, _model: &Params) -> Result<Option<Params>> {
        self.note("client_model");
        Ok(None)
    }

    fn client_state(&self, _client: usize) -> Result<Option<Params>> {
        self.note("client_state");
        Ok(None)
    }

    fn set_client_state(&self, _client: usize, _state: Option<Params>) -> Result<()> {
        self.note("set_client_state");
        Ok(())
    }

    fn check_reply(&self, _global: &Params, _reply: &Record) -> Result<()> {
        self.note("check_reply");
        Ok(())
    }

    fn aggregate(
        &mut self,
        _round: usize,
        _global: &Params,
        replies: &[Reply],
    ) -> Result<Aggregate> {
        self.note("aggregate");
        let models: Vec<Params> = replies.iter().map(|r| r.record.params.clone()).collect();
        Ok(Aggregate::Replace(sum(&models)))
    }

    fn aggregate_no_replies(&mut self, _round: usize, _global: &Params) -> Result<Aggregate> {
        self.note("aggregate_no_replies");
        Ok(Aggregate::Keep)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        self.note("fold");
        Some(Box::new(SumFold {
            log: Arc::clone(&self.log),
            seen: Vec::new(),
        }))
    }

    fn round_metrics(&self) -> BTreeMap<String, f64> {
        self.note("round_metrics");
        BTreeMap::new()
    }

    fn evaluate(&self, _trainer: &Trainer, _test: &Dataset) -> Result<BTreeMap<String, f64>> {
        self.note("evaluate");
        Ok(BTreeMap::new())
    }

    fn evaluate_table(&self, _global: &Params, _test: &Table) -> Result<BTreeMap<String, f64>> {
        self.note("evaluate_table");
        Ok(BTreeMap::new())
    }

    fn save_state(&self) -> Option<Result<Record>> {
        self.note("save_state");
        Some(Ok(Record::default()))
    }

    fn load_state(&mut self, _state: Record) -> Result<()> {
        self.note("load_state");
        Ok(())
    }

    fn finished(&self) -> bool {
        self.note("finished");
        false
    }
}

/// A linear layer, batch norm (FedBN's wrapper needs norms) and the classifier.
fn spec() -> ModelSpec {
    ModelSpec::sequential(
        &[3],
        vec![
            LayerSpec::linear(2),
            LayerSpec::BatchNorm1d {
                eps: 1e-5,
                momentum: 0.1,
            },
            LayerSpec::linear(2),
        ],
    )
}

fn data() -> Dataset {
    let x = vec![0.1, 0.2, 0.3, -0.1, 0.0, 0.5, 0.2, 0.2, -0.3, 0.4, 0.1, 0.0];
    Dataset::new(x, vec![0, 1, 1, 0], vec![3], 2).unwrap()
}

/// A wrapper around a fresh [`Recording`], and the calls it may keep from it.
struct Case {
    name: &'static str,
    build: fn(Box<dyn Method>) -> Box<dyn Method>,
    changes: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "server step",
            build: |inner| Box::new(ServerStep::new(inner, ServerOptimizer::fedadam()).unwrap()),
            changes: &[],
        },
        Case {
            name: "central DP",
            build: |inner| {
                let dp = PrivacySettings::CentralFixed {
                    noise_multiplier: 0.5,
                    clipping_norm: 1.0,
                    delta: 1e-5,
                };
                dp.wrap(inner, DpSampling::fixed(2), 7).unwrap()
            },
            // Its server step is the clipped sum's noised release, streamed or not.
            changes: &["aggregate", "aggregate_no_replies", "fold"],
        },
        Case {
            name: "local DP",
            build: |inner| {
                let dp = PrivacySettings::Local {
                    clipping_norm: 1.0,
                    sensitivity: 1.0,
                    epsilon: 1.0,
                    delta: 1e-5,
                };
                dp.wrap(inner, DpSampling::fixed(2), 7).unwrap()
            },
            changes: &[],
        },
        Case {
            name: "separate inits",
            build: |inner| {
                Box::new(SeparateInits {
                    inner,
                    init: Init::Default,
                })
            },
            changes: &[],
        },
        Case {
            name: "batch norm statistics rounds",
            build: |inner| {
                let bn = fedfuse_fed::BatchNormSettings {
                    reestimate: true,
                    batch_size: 2,
                };
                bn.wrap(inner, &spec()).unwrap()
            },
            // Round 2 is a statistics round: its instruction, the clients' step, the check of
            // their replies and the round's figures are the wrapper's; it streams nothing.
            changes: &[
                "instruct",
                "fit",
                "check_reply",
                "aggregate_no_replies",
                "fold",
                "round_metrics",
            ],
        },
        Case {
            name: "local norms",
            build: |inner| {
                let init = init_params(&spec(), Init::Default, 3);
                Box::new(LocalNorm::new(inner, &spec(), &init).unwrap())
            },
            // The clients' own norms are the wrapper's alone.
            changes: &["client_model", "client_state", "set_client_state"],
        },
    ]
}

/// Makes every call of [`CALLS`] on `m` once.
fn call_everything(m: &mut dyn Method) {
    let spec = spec();
    let trainer = Trainer::new(spec.clone()).unwrap();
    let global = init_params(&spec, Init::Default, 1);
    let client = ClientData {
        train: data(),
        test: data(),
    };
    let train = TrainConfig::default();
    let ctx = ClientContext {
        id: 0,
        data: &client,
        trainer: &trainer,
        train: &train,
        seed: 5,
    };
    let table = Table::default();
    // Round 2: separate inits changes round 1's instruction only.
    let instruction = m.instruct(2, 0, &global).unwrap();
    let reply = m.fit(instruction, &ctx).unwrap();
    m.tabular();
    let table_ctx = TableContext {
        id: 0,
        table: &table,
        seed: 5,
    };
    m.fit_table(Record::default(), &table_ctx).unwrap();
    m.weighs_by_examples();
    let reply = m.restore_reply(&global, reply).unwrap();
    m.client_model(0, &global).unwrap();
    m.client_state(0).unwrap();
    m.set_client_state(0, None).unwrap();
    m.check_reply(&global, &reply).unwrap();
    let replies = [Reply {
        client: 0,
        record: reply,
    }];
    m.aggregate(1, &global, &replies).unwrap();
    m.aggregate_no_replies(2, &global).unwrap();
    m.fold();
    m.round_metrics();
    m.evaluate(&trainer, &data()).unwrap();
    m.evaluate_table(&global, &table).unwrap();
    let saved = m.save_state().unwrap().unwrap();
    m.load_state(saved).unwrap();
    m.finished();
}

#[test]
fn every_call_a_wrapper_does_not_change_reaches_the_wrapped_method() {
    for case in cases() {
        let log = Log::default();
        let mut wrapper = (case.build)(Box::new(Recording {
            log: Arc::clone(&log),
        }));
        call_everything(wrapper.as_mut());
        let seen = log.lock().unwrap().clone();
        for call in CALLS {
            if !case.changes.contains(&call) {
                assert!(
                    seen.contains(&call),
                    "{}: `{call}` never reached the wrapped method (it saw {seen:?})",
                    case.name
                );
            }
        }
    }
}

#[test]
fn a_wrappers_streaming_server_step_gives_its_aggregate() {
    let spec = spec();
    let global = init_params(&spec, Init::Default, 1);
    let replies: Vec<Reply> = (0..3)
        .map(|i| Reply {
            client: i,
            record: Record::from_params(init_params(&spec, Init::Default, 10 + i as u64))
                .with_num_examples(4),
        })
        .collect();
    for case in cases() {
        let fresh = || {
            (case.build)(Box::new(Recording {
                log: Log::default(),
            }))
        };
        let Some(mut fold) = fresh().fold() else {
            continue;
        };
        for r in &replies {
            fold.add(r.clone()).unwrap();
        }
        let streamed = fold.finish(1, &global).unwrap();
        let whole = fresh().aggregate(1, &global, &replies).unwrap();
        match (streamed, whole) {
            (Aggregate::Replace(a), Aggregate::Replace(b)) => {
                assert_eq!(a, b, "{}: fold and aggregate differ", case.name)
            }
            (Aggregate::Keep, Aggregate::Keep) => {}
            _ => panic!("{}: fold and aggregate differ in kind", case.name),
        }
    }
}

/// A statistics round's server step: the batch-weighted means of the clients' running
/// statistics, the batches counted in all, every other tensor the global model's.
#[test]
fn statistics_rounds_combine_the_clients_statistics_by_their_batches() {
    let bn = fedfuse_fed::BatchNormSettings {
        reestimate: true,
        batch_size: 2,
    };
    let mut m = bn
        .wrap(
            Box::new(Recording {
                log: Log::default(),
            }),
            &spec(),
        )
        .unwrap();
    let global = init_params(&spec(), Init::Default, 1);
    let stats = |mean: [f32; 2], var: [f32; 2], batches: f32| {
        let mut p = Params::new();
        p.push("1.running_mean", vec![2], mean.to_vec()).unwrap();
        p.push("1.running_var", vec![2], var.to_vec()).unwrap();
        p.push("1.num_batches_tracked", vec![], vec![batches])
            .unwrap();
        Record::from_params(p)
    };
    let replies = [
        Reply {
            client: 0,
            record: stats([1.0, 2.0], [1.0, 1.0], 1.0),
        },
        Reply {
            client: 1,
            record: stats([4.0, -1.0], [3.0, 5.0], 3.0),
        },
    ];
    for r in &replies {
        m.check_reply(&global, &r.record).unwrap();
    }
    let Aggregate::Replace(next) = m.aggregate(2, &global, &replies).unwrap() else {
        panic!("a statistics round replaces the model")
    };
    assert_eq!(next.get("1.running_mean").unwrap().data, [3.25, -0.25]);
    assert_eq!(next.get("1.running_var").unwrap().data, [2.5, 4.0]);
    assert_eq!(next.get("1.num_batches_tracked").unwrap().data, [4.0]);
    for name in ["0.weight", "1.weight", "2.bias"] {
        assert_eq!(next.get(name), global.get(name), "{name}");
    }
    assert_eq!(m.round_metrics().get("bn_statistics"), Some(&1.0));
}

/// Statistics replies from a hostile peer: a non-finite value or a tensor of another shape is
/// refused by the check; a counter of several values reaching the server step is an error,
/// not a panic; negative counts weigh nothing, and a round where nothing weighs keeps the
/// model.
#[test]
fn hostile_statistics_replies_are_refused_or_weigh_nothing() {
    let bn = fedfuse_fed::BatchNormSettings {
        reestimate: true,
        batch_size: 2,
    };
    let mut m = bn
        .wrap(
            Box::new(Recording {
                log: Log::default(),
            }),
            &spec(),
        )
        .unwrap();
    let global = init_params(&spec(), Init::Default, 1);
    let stats = |mean: Vec<f32>, counter: Vec<f32>, counter_shape: Vec<usize>| {
        let mut p = Params::new();
        p.push("1.running_mean", vec![mean.len()], mean).unwrap();
        p.push("1.running_var", vec![2], vec![1.0, 1.0]).unwrap();
        p.push("1.num_batches_tracked", counter_shape, counter)
            .unwrap();
        Record::from_params(p)
    };
    let reply = |record| Reply { client: 3, record };
    assert!(
        m.check_reply(&global, &stats(vec![f32::NAN, 0.0], vec![1.0], vec![]))
            .is_err()
    );
    assert!(
        m.check_reply(&global, &stats(vec![0.0; 3], vec![1.0], vec![]))
            .is_err()
    );
    let e = m
        .aggregate(
            2,
            &global,
            &[reply(stats(vec![0.0; 2], vec![1.0, 2.0], vec![2]))],
        )
        .unwrap_err();
    assert!(e.to_string().contains("not one count"), "{e}");
    let none = m
        .aggregate(
            2,
            &global,
            &[reply(stats(vec![5.0; 2], vec![-7.0], vec![]))],
        )
        .unwrap();
    assert!(matches!(none, Aggregate::Keep));
}
