//! Federation on real data (the bundled UCI digits): robustness, rejection, determinism.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::{ModelSpec, Params, Record};
use fedfuse_data::{ClientData, PartitionSpec, TrainTest, client_splits, load_dataset, partition};
use fedfuse_fed::{
    Aggregate, BuildContext, BulyanSettings, ClientContext, FedAvg, FedMedian, FedProx,
    KrumSettings, Method, MethodConfig, Population, Reply, ReplyBounds, Result, SimConfig,
    simulate,
};
use fedfuse_train::{Init, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn setup(clients: usize) -> (TrainTest, Vec<ClientData>, Trainer, Params) {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    let parts = partition(&data.train.y, 10, clients, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let splits = client_splits(&data.train, &parts, 0.2, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    let init = init_params(&spec, Init::Default, 11);
    (data, splits, Trainer::new(spec).unwrap(), init)
}

/// The global model's test accuracy after a run of `method` on `setup`.
fn final_accuracy(
    method: &mut dyn Method,
    (data, clients, trainer, init): &(TrainTest, Vec<ClientData>, Trainer, Params),
    cfg: &SimConfig,
) -> f64 {
    simulate(
        method,
        Population::labelled(trainer, clients, &data.test),
        init.clone(),
        cfg,
        &|_| {},
    )
    .unwrap()
    .rounds
    .last()
    .unwrap()
    .global_accuracy
}

fn sim(rounds: usize) -> SimConfig {
    SimConfig {
        rounds,
        seed: 5,
        train: TrainConfig {
            lr: 0.05,
            epochs: 2,
            batch_size: 16,
            dropout: 0.0,
            optimizer: fedfuse_train::OptimizerConfig::Sgd {
                momentum: 0.9,
                weight_decay: 0.0,
            },
        },
        ..SimConfig::default()
    }
}

/// Wraps a method; the clients in `bad` reply with `corrupt(params)` instead of its real update.
struct Faulty<M> {
    inner: M,
    bad: &'static [usize],
    corrupt: fn(&mut Params),
}

impl<M: Method> Method for Faulty<M> {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.inner.instruct(round, client, global)
    }
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let mut reply = self.inner.fit(instruction, ctx)?;
        if self.bad.contains(&ctx.id) {
            (self.corrupt)(&mut reply.params);
        }
        Ok(reply)
    }
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        self.inner.aggregate(round, global, replies)
    }
}

fn blow_up(p: &mut Params) {
    for (_, t) in p.iter_mut() {
        t.data.iter_mut().for_each(|v| *v = 1e4);
    }
}

fn nan(p: &mut Params) {
    if let Some((_, t)) = p.iter_mut().next() {
        t.data[0] = f32::NAN;
    }
}

#[test]
fn fedmedian_ignores_one_wild_client_where_fedavg_does_not() {
    let setup = setup(7);
    let cfg = sim(3);
    let run = |method: &mut dyn Method| final_accuracy(method, &setup, &cfg);
    let clean_median = run(&mut FedMedian);
    let attacked_median = run(&mut Faulty {
        inner: FedMedian,
        bad: &[2],
        corrupt: blow_up,
    });
    let attacked_avg = run(&mut Faulty {
        inner: FedAvg,
        bad: &[2],
        corrupt: blow_up,
    });
    assert!(clean_median > 0.85, "clean FedMedian {clean_median}");
    assert!(
        attacked_median > 0.85 && (clean_median - attacked_median).abs() < 0.05,
        "FedMedian under attack {attacked_median} vs clean {clean_median}"
    );
    assert!(
        attacked_avg < 0.3,
        "FedAvg under attack should collapse: {attacked_avg}"
    );
}

#[test]
fn nan_reply_is_rejected_and_the_round_goes_on() {
    let (data, clients, trainer, init) = setup(5);
    let cfg = sim(3);
    let mut method = Faulty {
        inner: FedAvg,
        bad: &[1],
        corrupt: nan,
    };
    let run = simulate(
        &mut method,
        Population::labelled(&trainer, &clients, &data.test),
        init,
        &cfg,
        &|_| {},
    )
    .unwrap();
    for r in &run.rounds {
        assert_eq!(r.rejected.len(), 1, "round {}", r.round);
        assert_eq!(r.rejected[0].client, 1);
        assert!(
            r.rejected[0].reason.contains("non-finite"),
            "{}",
            r.rejected[0].reason
        );
    }
    let acc = run.rounds[2].global_accuracy;
    assert!(acc > 0.85, "accuracy {acc} with one client rejected");
    assert!(run.params.check_finite().is_ok());
}

fn drop_last_tensor(p: &mut Params) {
    let mut shorter = Params::new();
    for (name, t) in p.iter().take(p.len() - 1) {
        shorter.push(name, t.shape.clone(), t.data.clone()).unwrap();
    }
    *p = shorter;
}

fn transpose_first(p: &mut Params) {
    if let Some((_, t)) = p.iter_mut().next() {
        t.shape.reverse();
    }
}

#[test]
fn wrong_shapes_are_rejected_with_the_client_id() {
    let (data, clients, trainer, init) = setup(4);
    for (corrupt, needle) in [
        (drop_last_tensor as fn(&mut Params), "tensors where"),
        (transpose_first, "layers.0.weight"),
    ] {
        let mut method = Faulty {
            inner: FedMedian,
            bad: &[3],
            corrupt,
        };
        let run = simulate(
            &mut method,
            Population::labelled(&trainer, &clients, &data.test),
            init.clone(),
            &sim(1),
            &|_| {},
        )
        .unwrap();
        let r = &run.rounds[0];
        assert_eq!(r.rejected.len(), 1);
        assert_eq!(r.rejected[0].client, 3);
        assert!(
            r.rejected[0].reason.contains(needle),
            "{}",
            r.rejected[0].reason
        );
        assert!(r.global_accuracy > 0.5);
    }
}

/// Client `bad`'s procedure fails outright.
struct Crashes {
    bad: usize,
}

impl Method for Crashes {
    fn name(&self) -> &'static str {
        "crashes"
    }
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        if ctx.id == self.bad {
            return Err(fedfuse_fed::FedError::BadReply {
                client: ctx.id,
                reason: "disk full".into(),
            });
        }
        fedfuse_fed::standard_fit(instruction, ctx)
    }
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        FedAvg.aggregate(round, global, replies)
    }
}

#[test]
fn a_failing_client_is_rejected_but_its_download_counted() {
    let (data, clients, trainer, init) = setup(4);
    let instruction = FedAvg
        .instruct(1, 0, &init)
        .unwrap()
        .encode()
        .unwrap()
        .len() as u64;
    let model_bytes = 4 * init.num_values() as u64;
    let run = simulate(
        &mut Crashes { bad: 2 },
        Population::labelled(&trainer, &clients, &data.test),
        init,
        &sim(1),
        &|_| {},
    )
    .unwrap();
    let r = &run.rounds[0];
    assert_eq!(r.rejected.len(), 1);
    assert!(r.rejected[0].reason.contains("disk full"));
    // Four instructions went down, three replies came up.
    assert_eq!(r.bytes_down, 4 * instruction);
    assert!(r.bytes_up > 3 * model_bytes && r.bytes_up < 3 * (model_bytes + 1024));
}

/// Wraps a method; the clients in `liars` claim `examples` examples in their replies.
struct Claiming<M> {
    inner: M,
    liars: &'static [usize],
    examples: u64,
}

impl<M: Method> Method for Claiming<M> {
    fn name(&self) -> &'static str {
        "claiming"
    }
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.inner.instruct(round, client, global)
    }
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        let mut reply = self.inner.fit(instruction, ctx)?;
        if self.liars.contains(&ctx.id) {
            reply.num_examples = self.examples;
        }
        Ok(reply)
    }
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        self.inner.aggregate(round, global, replies)
    }
}

#[test]
fn no_single_claim_takes_the_mean_and_weightless_rounds_keep_the_model() {
    let setup = setup(5);
    let (data, clients, trainer, init) = &setup;
    // The default bound `fedfuse run` and the Flower strategy apply: the largest client.
    let bounded = SimConfig {
        bounds: ReplyBounds::default().or_largest_client(clients.iter().map(|c| c.train.len())),
        ..sim(3)
    };
    let largest = clients.iter().map(|c| c.train.len()).max().unwrap() as u64;
    assert_eq!(bounded.bounds.max_examples, Some(largest));
    let liar = || Claiming {
        inner: FedAvg,
        liars: &[3],
        examples: i64::MAX as u64,
    };
    // Unbounded, client 3's claim is the whole mean: the model is client 3's alone.
    let clean = final_accuracy(&mut FedAvg, &setup, &bounded);
    let run = |m: &mut dyn Method, cfg: &SimConfig| {
        simulate(
            m,
            Population::labelled(trainer, clients, &data.test),
            init.clone(),
            cfg,
            &|_| {},
        )
        .unwrap()
    };
    let bounded_run = run(&mut liar(), &bounded);
    for r in &bounded_run.rounds {
        let who: Vec<usize> = r.rejected.iter().map(|x| x.client).collect();
        assert_eq!(who, vec![3], "round {}", r.round);
        assert!(
            r.rejected[0].reason.contains("replies.max_examples"),
            "{:?}",
            r.rejected
        );
    }
    let acc = bounded_run.rounds.last().unwrap().global_accuracy;
    assert!(acc > clean - 0.05, "bounded {acc} vs clean {clean}");

    // Every reply claiming nothing: each is rejected, and the model stays where it was.
    let mut nobody = Claiming {
        inner: FedAvg,
        liars: &[0, 1, 2, 3, 4],
        examples: 0,
    };
    let weightless = run(&mut nobody, &bounded);
    assert_eq!(weightless.params, *init);
    for r in &weightless.rounds {
        assert_eq!(r.rejected.len(), 5, "round {}", r.round);
        assert!(
            r.rejected[0].reason.contains("0 examples"),
            "{:?}",
            r.rejected
        );
    }
}

#[test]
fn all_replies_rejected_keeps_the_global_model() {
    let (data, clients, trainer, init) = setup(1);
    let mut method = Faulty {
        inner: FedAvg,
        bad: &[0],
        corrupt: nan,
    };
    let run = simulate(
        &mut method,
        Population::labelled(&trainer, &clients, &data.test),
        init.clone(),
        &sim(2),
        &|_| {},
    )
    .unwrap();
    assert_eq!(run.params, init);
    assert!(run.rounds.iter().all(|r| r.rejected.len() == 1));
}

#[test]
fn same_seed_same_run() {
    let (data, clients, trainer, init) = setup(6);
    let mut cfg = sim(2);
    cfg.clients_per_round = fedfuse_fed::ClientsPerRound::Count(4);
    let go = || {
        let mut m = MethodConfig::FedProx(fedfuse_fed::FedProxSettings { mu: 0.1 })
            .build()
            .unwrap();
        simulate(
            m.as_mut(),
            Population::labelled(&trainer, &clients, &data.test),
            init.clone(),
            &cfg,
            &|_| {},
        )
        .unwrap()
    };
    let (a, b) = (go(), go());
    assert_eq!(a.params, b.params);
    for (x, y) in a.rounds.iter().zip(&b.rounds) {
        assert_eq!(x.global_accuracy, y.global_accuracy);
        assert_eq!(x.bytes_up, y.bytes_up);
        assert_eq!(x.clients, 4);
    }
}

#[test]
fn traffic_is_the_encoded_size() {
    let (data, clients, trainer, init) = setup(4);
    let run = simulate(
        &mut FedProx { mu: 0.01 },
        Population::labelled(&trainer, &clients, &data.test),
        init.clone(),
        &sim(1),
        &|_| {},
    )
    .unwrap();
    let r = &run.rounds[0];
    // Each message carries at least the model's f32 values, plus a small header.
    let model_bytes = 4 * init.num_values() as u64;
    assert!(r.bytes_down >= 4 * model_bytes && r.bytes_down < 4 * (model_bytes + 1024));
    assert!(r.bytes_up >= 4 * model_bytes && r.bytes_up < 4 * (model_bytes + 1024));
}

/// Keeps a copy of the replies the wrapped method aggregates.
struct Recorder {
    inner: Box<dyn Method>,
    seen: std::sync::Mutex<Vec<Reply>>,
}

impl Method for Recorder {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn instruct(&self, round: usize, client: usize, global: &Params) -> Result<Record> {
        self.inner.instruct(round, client, global)
    }
    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> Result<Record> {
        self.inner.fit(instruction, ctx)
    }
    fn aggregate(&mut self, round: usize, global: &Params, replies: &[Reply]) -> Result<Aggregate> {
        self.seen.lock().unwrap().extend_from_slice(replies);
        self.inner.aggregate(round, global, replies)
    }
}

#[test]
fn pfnm_one_shot_beats_averaging_and_local_models_on_heterogeneous_mnist() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let split = PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 10,
        self_balancing: true,
    };
    let parts = partition(&data.train.y, 10, 10, &split, &mut rng).unwrap();
    let clients = client_splits(&data.train, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(784, &[100], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let method = MethodConfig::Pfnm(fedfuse_fed::PfnmSettings {
        prior: fedfuse_fed::MatchPrior {
            sigma: 1.0,
            sigma0: 1.0,
            gamma: 1.0,
            iters: 5,
            ..fedfuse_fed::MatchPrior::default()
        },
        ..Default::default()
    });
    let mut recorder = Recorder {
        inner: method
            .build_with(BuildContext {
                init: Init::Default,
                seed: 1,
                spec: Some(spec.clone()),
                validation: None,
            })
            .unwrap(),
        seen: std::sync::Mutex::new(Vec::new()),
    };
    let cfg = SimConfig {
        rounds: 1,
        seed: 1,
        local_eval: false,
        train: TrainConfig::pfnm_paper(),
        ..SimConfig::default()
    };
    // The initial global model only fixes the architecture: PFNM clients start from their own.
    let init = init_params(&spec, Init::Default, 0);
    let run = simulate(
        &mut recorder,
        Population::labelled(&trainer, &clients, &data.test),
        init,
        &cfg,
        &|_| {},
    )
    .unwrap();
    let pfnm = run.rounds[0].global_accuracy;
    let width = run.params.get("layers.0.bias").unwrap().data.len();

    let replies = recorder.seen.into_inner().unwrap();
    assert_eq!(replies.len(), 10);
    let locals: Vec<f64> = replies
        .iter()
        .map(|r| {
            trainer
                .evaluate(&r.record.params, &data.test)
                .unwrap()
                .accuracy
        })
        .collect();
    let mean_local = locals.iter().sum::<f64>() / locals.len() as f64;
    let models: Vec<(&Params, f64)> = replies
        .iter()
        .map(|r| (&r.record.params, r.record.num_examples as f64))
        .collect();
    let averaged = fedfuse_fuse::weighted_mean_params(&models).unwrap();
    let separate_avg = trainer.evaluate(&averaged, &data.test).unwrap().accuracy;
    let members: Vec<&Params> = replies.iter().map(|r| &r.record.params).collect();
    let ensemble = trainer
        .evaluate_ensemble(&members, &data.test)
        .unwrap()
        .accuracy;
    eprintln!(
        "MNIST Dirichlet(0.5), J = 10: PFNM {pfnm:.4} (width {width}), ensemble {ensemble:.4}, \
         FedAvg of separate inits {separate_avg:.4}, mean local {mean_local:.4}"
    );
    // One fused network as good as the ten clients' softmax ensemble (within half a point).
    assert!(
        pfnm >= ensemble - 0.005,
        "PFNM {pfnm} vs ensemble {ensemble}"
    );
    assert!(
        pfnm > separate_avg + 0.1,
        "PFNM {pfnm} vs FedAvg separate inits {separate_avg}"
    );
    assert!(
        pfnm > mean_local + 0.05,
        "PFNM {pfnm} vs mean local {mean_local}"
    );
    // Matching merges some units and opens others: wider than one client (a matcher that
    // merges everything gives 100), narrower than no merging (1,000, capped at 700).
    assert!(width > 150 && width < 600, "global width {width}");
}

#[test]
fn krum_and_bulyan_keep_the_honest_replies_where_fedavg_collapses() {
    // 10 clients, 1 to 3 of them Byzantine (every value 1e4); Krum told to tolerate 3. One
    // federation seed: the bounds below hold for it with margin.
    let setup = setup(10);
    let cfg = sim(3);
    let run = |method: &mut dyn Method| final_accuracy(method, &setup, &cfg);
    let krum = |keep: usize| {
        KrumSettings { byzantine: 3, keep }
            .build(&BuildContext::default())
            .unwrap()
    };
    let clean = run(&mut FedAvg);
    assert!(clean > 0.8, "clean FedAvg {clean}");
    // Bulyan with f = 1 needs 7 replies of the 10: one Byzantine client.
    let bulyan = BulyanSettings { byzantine: 1 }
        .build(&BuildContext::default())
        .unwrap();
    let acc = run(&mut Faulty {
        inner: bulyan,
        bad: &[4],
        corrupt: blow_up,
    });
    assert!(
        acc > clean - 0.05,
        "Bulyan with one Byzantine client: {acc} (clean {clean})"
    );
    for bad in [&[4][..], &[1, 6], &[0, 5, 9]] {
        let attacked_avg = run(&mut Faulty {
            inner: FedAvg,
            bad,
            corrupt: blow_up,
        });
        assert!(
            attacked_avg < 0.3,
            "FedAvg with {bad:?} Byzantine: {attacked_avg}"
        );
        for keep in [1, 5] {
            let acc = run(&mut Faulty {
                inner: krum(keep),
                bad,
                corrupt: blow_up,
            });
            // Krum takes one client's model (a tenth of the data): about 0.70-0.79 here;
            // Multi-Krum averages five honest ones: 0.81-0.84, FedAvg's clean 0.84.
            let floor = if keep == 1 { 0.65 } else { clean - 0.05 };
            assert!(
                acc > floor,
                "Krum keep={keep} with {bad:?} Byzantine: {acc} (clean FedAvg {clean})"
            );
        }
    }
}

#[test]
fn an_update_norm_bound_rejects_absurd_updates_where_fedavg_collapses() {
    // Two of 10 clients send every value 1e4 (an update of norm ~5e5; honest ones are a few
    // units long). FedAvg takes them in and collapses; with max_update_norm = 1000 they are
    // listed as rejected with the reason, and the model trains as without them.
    let setup = setup(10);
    let bounded = SimConfig {
        bounds: ReplyBounds {
            max_update_norm: Some(1000.0),
            ..ReplyBounds::default()
        },
        ..sim(3)
    };
    let attacked = || Faulty {
        inner: FedAvg,
        bad: &[2, 7],
        corrupt: blow_up,
    };
    let clean = final_accuracy(&mut FedAvg, &setup, &bounded);
    let open = final_accuracy(&mut attacked(), &setup, &sim(3));
    assert!(open < 0.3, "FedAvg taking the absurd updates: {open}");
    let (data, clients, trainer, init) = &setup;
    let run = simulate(
        &mut attacked(),
        Population::labelled(trainer, clients, &data.test),
        init.clone(),
        &bounded,
        &|_| {},
    )
    .unwrap();
    let acc = run.rounds.last().unwrap().global_accuracy;
    assert!(acc > clean - 0.05, "bounded {acc} vs clean {clean}");
    for r in &run.rounds {
        let who: Vec<usize> = r.rejected.iter().map(|x| x.client).collect();
        assert_eq!(who, vec![2, 7], "round {}", r.round);
        assert!(
            r.rejected[0].reason.contains("max_update_norm = 1000"),
            "{:?}",
            r.rejected
        );
    }
}
