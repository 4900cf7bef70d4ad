//! Matching methods in the federation on real data (the bundled UCI digits; MNIST for deep
//! PFNM): GPI-FNM's eps choice, extra communication rounds, FedAvg from separate
//! initialisations, the matching order of deep networks.

use std::sync::Arc;

use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::{
    ClientData, Dataset, PartitionSpec, client_splits, holdout, load_dataset, partition,
};
use fedfuse_fed::{
    Aggregate, BuildContext, ClientsPerRound, MethodConfig, Population, SimConfig, simulate,
};
use fedfuse_fuse::MatchOrder;
use fedfuse_lab::oneshot::{Start, replies, train_locals};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;

struct Setup {
    clients: Vec<ClientData>,
    validation: Arc<Dataset>,
    test: Dataset,
    spec: ModelSpec,
    trainer: Trainer,
}

/// Digits, 10% held out for the server, the rest split Dirichlet(0.5) over `j` clients.
fn setup(j: usize, seed: u64) -> Setup {
    let data = load_dataset("digits", None).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let (pool, validation) = holdout(&data.train, 0.1, &mut rng).unwrap();
    let split = PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 10,
        self_balancing: true,
    };
    let parts = partition(&pool.y, 10, j, &split, &mut rng).unwrap();
    let clients = client_splits(&pool, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(64, &[32], 10);
    Setup {
        clients,
        validation: Arc::new(validation),
        test: data.test,
        trainer: Trainer::new(spec.clone()).unwrap(),
        spec,
    }
}

fn train(epochs: usize) -> TrainConfig {
    TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        lr: 0.05,
        epochs,
        batch_size: 32,
        dropout: 0.0,
    }
}

fn ctx(s: &Setup, seed: u64) -> BuildContext {
    BuildContext {
        init: Init::Pfnm,
        seed,
        spec: Some(s.spec.clone()),
        validation: Some(Arc::clone(&s.validation)),
    }
}

fn fused(method: &MethodConfig, s: &Setup, sent: &[fedfuse_fed::Reply]) -> (Params, f64) {
    let mut m = method.build_with(ctx(s, 4)).unwrap();
    let init = init_params(&s.spec, Init::Pfnm, 0);
    let Aggregate::Replace(p) = m.aggregate(1, &init, sent).unwrap() else {
        panic!("kept");
    };
    let eps = m.round_metrics().get("eps").copied().unwrap_or(f64::NAN);
    (p, eps)
}

fn accuracy(p: &Params, data: &Dataset) -> f64 {
    Trainer::new(ModelSpec::infer_mlp(p).unwrap())
        .unwrap()
        .evaluate(p, data)
        .unwrap()
        .accuracy
}

fn gpi(eps: Option<f64>, eps_grid: Vec<f64>) -> MethodConfig {
    MethodConfig::GpiFnm(fedfuse_fed::PfnmSettings {
        prior: fedfuse_fed::MatchPrior {
            sigma: 1.0,
            sigma0: 1.0,
            gamma: 1.0,
            iters: 5,
            ..fedfuse_fed::MatchPrior::default()
        },
        eps,
        eps_grid: Some(eps_grid),
        sigma_grid: None,
        ..fedfuse_fed::PfnmSettings::default()
    })
}

#[test]
fn gpi_fnm_chooses_eps_on_validation_and_eps_zero_is_pfnm() {
    let s = setup(5, 2);
    let locals = train_locals(
        &s.trainer,
        &s.clients,
        &train(20),
        Init::Pfnm,
        Start::Separate,
        2,
    )
    .unwrap();
    let sent = replies(&locals);
    let pfnm = MethodConfig::Pfnm(fedfuse_fed::PfnmSettings {
        prior: fedfuse_fed::MatchPrior {
            sigma: 1.0,
            sigma0: 1.0,
            gamma: 1.0,
            iters: 5,
            ..fedfuse_fed::MatchPrior::default()
        },
        ..Default::default()
    });
    let (p_pfnm, _) = fused(&pfnm, &s, &sent);

    // eps = 0, as a grid of one, is PFNM bit for bit.
    let (p_zero, eps) = fused(&gpi(None, vec![0.0]), &s, &sent);
    assert_eq!(eps, 0.0);
    assert_eq!(p_zero, p_pfnm);

    // The chosen eps is the grid's best on the validation split (first best on ties), and
    // the fused model is the one fused with it.
    let grid = vec![0.0, 0.01, 0.1, 1.0, 10.0];
    let by_eps: Vec<(f64, Params)> = grid
        .iter()
        .map(|&e| (e, fused(&gpi(Some(e), Vec::new()), &s, &sent).0))
        .collect();
    let val: Vec<f64> = by_eps
        .iter()
        .map(|(_, p)| accuracy(p, &s.validation))
        .collect();
    let best = val.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let expected = grid[val.iter().position(|&v| v == best).unwrap()];
    let (p_grid, chosen) = fused(&gpi(None, grid.clone()), &s, &sent);
    assert_eq!(chosen, expected, "validation accuracies {val:?}");
    let i = grid.iter().position(|&e| e == chosen).unwrap();
    assert_eq!(p_grid, by_eps[i].1);

    // The KL term has a real effect on the assignment.
    assert_ne!(by_eps[0].1, by_eps[4].1, "eps = 10 fused exactly as PFNM");
    eprintln!(
        "validation accuracy per eps {grid:?}: {val:?}; test PFNM {:.4}, GPI-FNM {:.4} (eps {chosen})",
        accuracy(&p_pfnm, &s.test),
        accuracy(&p_grid, &s.test)
    );
}

fn sim(rounds: usize, epochs: usize) -> SimConfig {
    SimConfig {
        rounds,
        clients_per_round: ClientsPerRound::Fraction(1.0),
        seed: 3,
        train: train(epochs),
        local_eval: false,
        ..SimConfig::default()
    }
}

#[test]
fn extra_matching_rounds_improve_on_one_shot() {
    let s = setup(5, 3);
    // sigma 0.3: PFNM opens a few units beyond one client's 32 (at sigma 1 it merges all of
    // them, as a matcher that always merges would).
    let pfnm = MethodConfig::Pfnm(fedfuse_fed::PfnmSettings {
        prior: fedfuse_fed::MatchPrior {
            sigma: 0.3,
            sigma0: 1.0,
            gamma: 1.0,
            iters: 5,
            ..fedfuse_fed::MatchPrior::default()
        },
        ..Default::default()
    });
    let mut method = pfnm.build_with(ctx(&s, 3)).unwrap();
    let init = init_params(&s.spec, Init::Pfnm, 0);
    let run = simulate(
        method.as_mut(),
        Population::labelled(&s.trainer, &s.clients, &s.test),
        init,
        &sim(6, 5),
        &|_| {},
    )
    .unwrap();
    let acc: Vec<f64> = run.rounds.iter().map(|r| r.global_accuracy).collect();
    let widths: Vec<f64> = run.rounds.iter().map(|r| r.method["width.0"]).collect();
    eprintln!("PFNM accuracy per round: {acc:?}, width {widths:?}");
    for r in &run.rounds {
        // Clients keep their own width, so every reply fits: none is rejected.
        assert!(r.rejected.is_empty(), "round {}: {:?}", r.round, r.rejected);
        // Five 32-unit clients: 32 if every unit were merged, 160 if none were. Measured 36
        // in every round (a matcher that always merges: 32; one that never merges: 160).
        let width = r.method["width.0"];
        assert!(
            (34.0..=48.0).contains(&width),
            "round {}: global width {width}",
            r.round
        );
        // Round 1 sends no weights; later rounds send each client a 64-32-10 sub-model.
        let j = s.clients.len() as u64;
        if r.round == 1 {
            assert!(r.bytes_down < j * 1024, "{}", r.bytes_down);
        } else {
            assert!(
                r.bytes_down > j * (64 * 32 + 32 * 10) * 4,
                "{}",
                r.bytes_down
            );
        }
    }
    // Measured: 0.791 after round 1, 0.939 after round 6.
    let last = acc[acc.len() - 1];
    assert!(last > acc[0] + 0.1, "round 1 {} -> round 6 {last}", acc[0]);
}

#[test]
fn fedavg_of_separate_inits_sends_nothing_first_and_trails_a_common_init() {
    let s = setup(5, 5);
    let one_round = |separate_inits: bool| {
        let mut m = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings { separate_inits })
            .build_with(ctx(&s, 5))
            .unwrap();
        simulate(
            m.as_mut(),
            Population::labelled(&s.trainer, &s.clients, &s.test),
            init_params(&s.spec, Init::Pfnm, 0),
            &sim(1, 20),
            &|_| {},
        )
        .unwrap()
        .rounds
        .remove(0)
    };
    let separate = one_round(true);
    let common = one_round(false);
    assert!(separate.bytes_down < 5 * 1024, "{}", separate.bytes_down);
    assert!(common.bytes_down > 5 * (64 * 32 + 32 * 10) * 4);
    eprintln!(
        "one round: FedAvg separate inits {:.4}, common init {:.4}",
        separate.global_accuracy, common.global_accuracy
    );
    assert!(separate.global_accuracy + 0.05 < common.global_accuracy);
}

/// MNIST, J = 10, Dirichlet(0.5), 784-100-100-10 trained with the paper's local recipe; sigma
/// chosen on the server's validation split. Matched bottom-up, the top hidden layer grows and
/// the one fused network keeps up with the ten clients' ensemble. Matched top-down (the
/// reference's order) the top layer is seen through its bias and ten outgoing weights only,
/// every unit finds a partner, the layer stays at one client's 100 units and accuracy falls
/// far behind (docs/EXPERIMENTS.md, Fig. 3).
#[test]
fn deep_pfnm_matched_bottom_up_keeps_up_with_the_ensemble() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/mnist");
    let data = load_dataset("mnist", Some(std::path::Path::new(dir))).unwrap();
    let mut rng = StdRng::seed_from_u64(0);
    let (pool, validation) = holdout(&data.train, 0.1, &mut rng).unwrap();
    let split = PartitionSpec::Dirichlet {
        alpha: 0.5,
        min_partition_size: 10,
        self_balancing: true,
    };
    let parts = partition(&pool.y, 10, 10, &split, &mut rng).unwrap();
    let clients = client_splits(&pool, &parts, 0.0, &mut rng).unwrap();
    let spec = ModelSpec::mlp(784, &[100, 100], 10);
    let trainer = Trainer::new(spec.clone()).unwrap();
    let recipe = TrainConfig::pfnm_paper();
    let locals = train_locals(&trainer, &clients, &recipe, Init::Pfnm, Start::Separate, 0).unwrap();
    let sent = replies(&locals);
    let members: Vec<&Params> = locals.iter().map(|m| &m.params).collect();
    let ensemble = trainer
        .evaluate_ensemble(&members, &data.test)
        .unwrap()
        .accuracy;
    let validation = Arc::new(validation);
    let fuse = |order| {
        let method = MethodConfig::Pfnm(fedfuse_fed::PfnmSettings {
            sigma_grid: Some(vec![0.1, 0.3, 1.0]),
            order,
            ..Default::default()
        });
        let mut m = method
            .build_with(BuildContext {
                init: Init::Pfnm,
                seed: 0,
                spec: Some(spec.clone()),
                validation: Some(Arc::clone(&validation)),
            })
            .unwrap();
        let init = init_params(&spec, Init::Pfnm, 0);
        let Aggregate::Replace(p) = m.aggregate(1, &init, &sent).unwrap() else {
            panic!("kept");
        };
        let top_width = p.get("layers.1.bias").unwrap().data.len();
        (accuracy(&p, &data.test), top_width)
    };
    let (bottom_up, bottom_up_top) = fuse(MatchOrder::BottomUp);
    let (top_down, top_down_top) = fuse(MatchOrder::TopDown);
    eprintln!(
        "deep PFNM: bottom-up {bottom_up:.4} (top layer {bottom_up_top}), top-down \
         {top_down:.4} (top layer {top_down_top}), ensemble {ensemble:.4}"
    );
    assert!(bottom_up_top > 100, "top layer {bottom_up_top}");
    assert!(
        bottom_up >= ensemble - 0.01,
        "bottom-up {bottom_up} vs ensemble {ensemble}"
    );
    assert_eq!(top_down_top, 100);
    assert!(
        top_down < bottom_up - 0.03,
        "top-down {top_down} vs bottom-up {bottom_up}"
    );
}

#[test]
fn a_sweep_records_the_sigma_and_eps_it_chose_for_every_seed() {
    let smoke = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../experiments/digits-smoke.toml"),
    )
    .unwrap();
    let text = smoke
        .replace(
            "methods = [\"pfnm\", \"gpi-fnm\", \"fedavg-separate\", \"fedavg-common\", \"local\", \"ensemble\", \"oracle\"]",
            "methods = [\"gpi-fnm\"]",
        )
        .replace("[matching]", "[matching]\nsigma_grid = [0.3, 1.0, 3.0]");
    assert!(text.contains("sigma_grid") && text.contains("methods = [\"gpi-fnm\"]"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sweep.toml");
    std::fs::write(&file, &text).unwrap();
    let cfg = fedfuse_lab::sweep::SweepConfig::load(&file).unwrap();
    let out = dir.path().join("out");
    fedfuse_lab::sweep::run(&cfg, &out, None, &fedfuse_lab::Silent, false, None, None).unwrap();
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (eps, sigma) = (col("eps"), col("sigma"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    for r in &rows {
        assert!(["0.3", "1", "3"].contains(&r[sigma]), "{csv}");
        assert!(["0", "0.01", "0.1", "1"].contains(&r[eps]), "{csv}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("sigma chosen"), "{summary}");
}

/// PFNM's prior is declared once: the run config's `[method]` table and the sweep's
/// `[matching]` read the same settings with the same defaults (`PfnmConfig::default()`).
#[test]
fn the_run_config_and_the_sweep_share_pfnms_settings_and_defaults() {
    let defaults = fedfuse_fuse::PfnmConfig::default();
    let table: fedfuse_fed::PfnmSettings = toml::from_str("").unwrap();
    assert_eq!(
        (
            table.prior.sigma,
            table.prior.sigma0,
            table.prior.gamma,
            table.prior.iters
        ),
        (
            defaults.prior.sigma,
            defaults.prior.sigma0,
            defaults.prior.gamma,
            defaults.prior.iters
        )
    );
    assert_eq!(table.prior.max_global, defaults.prior.max_global);
    assert_eq!(table.order, defaults.order);

    let smoke = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../experiments/digits-smoke.toml"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let load = |extra: &str| {
        let file = dir.path().join("sweep.toml");
        std::fs::write(
            &file,
            smoke.replace("[matching]", &format!("[matching]\n{extra}")),
        )
        .unwrap();
        fedfuse_lab::sweep::SweepConfig::load(&file).map_err(|e| format!("{e:#}"))
    };
    // A key of the method table that the old `[matching]` lacked is read alike.
    let cfg = load("max_global = 50").unwrap();
    assert_eq!(cfg.matching.prior.max_global, 50);
    assert_eq!(cfg.matching.prior.sigma0, defaults.prior.sigma0);
    // The grid the file gives is kept; the order is each method's own.
    assert_eq!(cfg.matching.eps_grid, Some(vec![0.0, 0.01, 0.1, 1.0]));
    let err = load("order = \"bottom_up\"").unwrap_err();
    assert!(
        err.contains("matching.order") && err.contains("pfnm-bottom-up"),
        "{err}"
    );
}

/// A small CNN with batch norm on 2,000 MNIST samples split Dirichlet(0.5) over 4 clients.
const FEDMA_MNIST: &str = r#"
seed = 1
rounds = 4
clients = 4
clients_per_round = 1.0

[dataset]
name = "mnist"
train_samples = 2000
test_samples = 1000

[partition]
kind = "dirichlet"
alpha = 0.5
min_partition_size = 10
self_balancing = true

[method]
name = "fedma"

[model]
kind = "sequential"
layers = [
    { type = "conv2d", out = 8, kernel = 5, padding = 2 },
    { type = "batchnorm2d" },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "conv2d", out = 16, kernel = 5 },
    { type = "relu" },
    { type = "maxpool2d", kernel = 2 },
    { type = "flatten" },
    { type = "linear", out = 32 },
    { type = "relu" },
    { type = "linear", out = 10 },
]

[train]
optimizer = "sgd"
lr = 0.05
momentum = 0.9
epochs = 2
batch_size = 32
"#;

fn fedma_mnist(sets: &[&str]) -> Vec<fedfuse_fed::RoundMetrics> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    all.push(format!(
        "data_dir={:?}",
        dir.join("../../../shared/data").display().to_string()
    ));
    let cfg = fedfuse_lab::Config::parse(FEDMA_MNIST, &all).unwrap();
    fedfuse_lab::run::federate(&cfg, &fedfuse_lab::Silent)
        .unwrap()
        .rounds
}

/// FedMA on a conv net from separate initialisations: one pass (three matched layers, then
/// the output layer) gives a model far above FedAvg of the same separately trained clients,
/// on both seeds; the global model exists only after the pass, and each stage reports the
/// width it matched.
#[test]
fn fedma_fuses_separately_initialised_cnns_on_mnist() {
    for seed in [1, 2] {
        let seed_set = format!("seed={seed}");
        let rounds = fedma_mnist(&[&seed_set, "method.sigma=1.0"]);
        assert_eq!(rounds.len(), 4);
        let first = rounds[0].global_accuracy;
        assert!(
            rounds[..3].iter().all(|r| r.global_accuracy == first),
            "the global model changes only when the pass completes"
        );
        for (stage, r) in rounds[..3].iter().enumerate() {
            let width = r.method[&format!("width.{stage}")];
            assert!(
                width >= [8.0, 16.0, 32.0][stage],
                "seed {seed}: {:?}",
                r.method
            );
        }
        let fedma = rounds[3].global_accuracy;
        let separate = fedma_mnist(&[
            &seed_set,
            "rounds=1",
            "method.name=\"fedavg\"",
            "method.separate_inits=true",
        ])[0]
            .global_accuracy;
        assert!(
            fedma >= 0.7 && separate <= 0.5,
            "seed {seed}: FedMA {fedma:.3}, FedAvg of separate inits {separate:.3}"
        );
    }
}

/// PFNM (sigma chosen on the server's validation split) and weight matching as federated
/// methods on a conv net from separate initialisations: channels are matched bottom-up, the
/// global widths grow under PFNM, a second PFNM round starts each client from its matched part
/// of the global model, and both stay far above FedAvg of the same clients on both seeds.
#[test]
fn pfnm_and_weight_matching_fuse_cnn_channels_in_the_federation() {
    for seed in [1, 2] {
        let seed_set = format!("seed={seed}");
        let common = [seed_set.as_str(), "dataset.validation_fraction=0.1"];
        let with = |extra: &[&str]| -> Vec<fedfuse_fed::RoundMetrics> {
            let sets: Vec<&str> = common.iter().chain(extra).copied().collect();
            fedma_mnist(&sets)
        };
        let pfnm = with(&[
            "rounds=2",
            "method.name=\"pfnm\"",
            "method.sigma_grid=[0.03, 0.1, 0.3]",
            "method.sigma0=10",
        ]);
        let wm = with(&["rounds=1", "method.name=\"weight-matching\""]);
        let separate = with(&[
            "rounds=1",
            "method.name=\"fedavg\"",
            "method.separate_inits=true",
        ]);
        let (p1, p2) = (pfnm[0].global_accuracy, pfnm[1].global_accuracy);
        let (w, s) = (wm[0].global_accuracy, separate[0].global_accuracy);
        let grew = (0..3).any(|g| pfnm[0].method[&format!("width.{g}")] > [8.0, 16.0, 32.0][g]);
        assert!(
            grew && p1 >= s + 0.3 && p2 >= 0.7 && w >= s + 0.1,
            "seed {seed}: PFNM {p1:.3} then {p2:.3} ({:?}), weight matching {w:.3}, FedAvg of \
             separate inits {s:.3}",
            pfnm[0].method
        );
    }
}
