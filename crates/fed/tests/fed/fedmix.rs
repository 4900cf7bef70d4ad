//! The Gaussian-mixture prior on a federation of two populations (digits and pixel-permuted
//! digits): K = 1 is FedAvg; K = 2 separates the populations and serves each better.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use fedfuse_core::{ModelSpec, Params};
use fedfuse_data::{ClientData, Dataset, PartitionSpec, client_splits, load_dataset, partition};
use fedfuse_fed::{FedMix, Method, MethodConfig, Population, SimConfig, simulate};
use fedfuse_fuse::MixtureConfig;
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// The same samples with their pixels in a fixed shuffled order.
fn permuted(ds: &Dataset, perm: &[usize]) -> Dataset {
    let x =
        ds.x.chunks_exact(ds.dim())
            .flat_map(|s| perm.iter().map(move |&p| s[p]))
            .collect();
    Dataset::new(x, ds.y.clone(), ds.sample_shape.clone(), ds.num_classes).unwrap()
}

struct World {
    clients: Vec<ClientData>,
    test_plain: Dataset,
    test_perm: Dataset,
    /// The permuted population's pixel order.
    perm: Vec<usize>,
    spec: ModelSpec,
}

fn world() -> World {
    let data = load_dataset("digits", None).unwrap();
    two_populations(data.train, data.test, ModelSpec::mlp(64, &[32], 10))
}

/// Eight IID clients of `train`; clients 4..8 see its pixels in a fixed shuffled order.
fn two_populations(train: Dataset, test: Dataset, spec: ModelSpec) -> World {
    let mut rng = StdRng::seed_from_u64(6);
    let mut perm: Vec<usize> = (0..train.dim()).collect();
    perm.shuffle(&mut rng);
    let parts = partition(&train.y, 10, 8, &PartitionSpec::Iid {}, &mut rng).unwrap();
    let mut clients = client_splits(&train, &parts, 0.0, &mut rng).unwrap();
    for c in &mut clients[4..] {
        c.train = permuted(&c.train, &perm);
    }
    World {
        clients,
        test_perm: permuted(&test, &perm),
        test_plain: test,
        perm,
        spec,
    }
}

fn sim(rounds: usize) -> SimConfig {
    SimConfig {
        rounds,
        seed: 6,
        local_eval: false,
        train: TrainConfig {
            optimizer: OptimizerConfig::Sgd {
                momentum: 0.9,
                weight_decay: 0.0,
            },
            lr: 0.05,
            epochs: 2,
            batch_size: 32,
            dropout: 0.0,
        },
        ..SimConfig::default()
    }
}

fn run(w: &World, method: &mut dyn Method, rounds: usize) -> Params {
    simulate(
        method,
        Population::labelled(
            &Trainer::new(w.spec.clone()).unwrap(),
            &w.clients,
            &w.test_plain,
        ),
        init_params(&w.spec, Init::Default, 1),
        &sim(rounds),
        &|_| {},
    )
    .unwrap()
    .params
}

fn acc(w: &World, p: &Params, test: &Dataset) -> f64 {
    Trainer::new(w.spec.clone())
        .unwrap()
        .evaluate(p, test)
        .unwrap()
        .accuracy
}

#[test]
fn one_component_is_fedavg() {
    let w = world();
    let mut fedavg = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
        separate_inits: false,
    })
    .build()
    .unwrap();
    let mut mix = MethodConfig::FedMix(fedfuse_fed::FedMixSettings {
        components: 1,
        lambda: 1.0,
        ..Default::default()
    })
    .build()
    .unwrap();
    assert_eq!(run(&w, mix.as_mut(), 3), run(&w, fedavg.as_mut(), 3));
}

#[test]
fn two_components_separate_two_populations() {
    let w = world();
    // lambda sets how far apart models must be to belong to different components: with
    // lambda = 1 these 2,410-parameter models are all "close" and both centres stay at the
    // FedAvg mean.
    let mut mix = FedMix::new(
        2,
        MixtureConfig {
            lambda: 100.0,
            learn_weights: false,
        },
    );
    run(&w, &mut mix, 8);
    let a = mix.assignments();
    let plain = a[&0];
    assert!((0..4).all(|c| a[&c] == plain), "{a:?}");
    assert!((4..8).all(|c| a[&c] != plain), "{a:?}");
    let centres = mix.centres().unwrap();
    let (mine, theirs) = (&centres[plain], &centres[1 - plain]);

    let mut fedavg = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
        separate_inits: false,
    })
    .build()
    .unwrap();
    let avg = run(&w, fedavg.as_mut(), 8);
    let (avg_plain, avg_perm) = (acc(&w, &avg, &w.test_plain), acc(&w, &avg, &w.test_perm));
    let (mix_plain, mix_perm) = (acc(&w, mine, &w.test_plain), acc(&w, theirs, &w.test_perm));
    eprintln!(
        "plain / permuted test: FedAvg {avg_plain:.3} / {avg_perm:.3}, each population's \
         component {mix_plain:.3} / {mix_perm:.3}"
    );
    assert!(mix_plain > avg_plain + 0.02 && mix_perm > avg_perm + 0.02);
    assert!(mix_plain > 0.85 && mix_perm > 0.85);
}

#[test]
fn clients_under_the_mixture_term_still_separate_the_populations() {
    let config = MixtureConfig {
        lambda: 100.0,
        learn_weights: false,
    };
    // The clients' precision is chosen on a validation set (a fifth of the training set,
    // held out before the clients' shards; each component scored on its own population),
    // never on the test set, from a grid of decades fixed before any run (issue 34: the
    // earlier 0.1 was the smallest value of a grid made after seeing the test split).
    let data = load_dataset("digits", None).unwrap();
    let mut order: Vec<usize> = (0..data.train.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(7));
    let (val_idx, train_idx) = order.split_at(data.train.len() / 5);
    let w = two_populations(
        data.train.subset(train_idx),
        data.test,
        ModelSpec::mlp(64, &[32], 10),
    );
    let val_plain = data.train.subset(val_idx);
    let val_perm = permuted(&val_plain, &w.perm);
    let sim = sim(8);
    let trainer = Trainer::new(w.spec.clone()).unwrap();
    let bytes_down = |mix: &mut FedMix| {
        simulate(
            mix,
            Population::labelled(&trainer, &w.clients, &w.test_plain),
            init_params(&w.spec, Init::Default, 1),
            &sim,
            &|_| {},
        )
        .unwrap()
        .rounds
        .pop()
        .unwrap()
        .bytes_down
    };
    let with_term = |lambda: f64| {
        let mut mix = FedMix::new(2, config).with_mixture_term(lambda);
        let down = bytes_down(&mut mix);
        let plain = mix.assignments()[&0];
        let centres = mix.centres().unwrap();
        let val =
            (acc(&w, &centres[plain], &val_plain) + acc(&w, &centres[1 - plain], &val_perm)) / 2.0;
        (val, mix, down)
    };
    let mut tried: Vec<(f64, f64, FedMix, u64)> = [0.001, 0.01, 0.1, 1.0, 10.0]
        .into_iter()
        .map(|lambda| {
            let (val, mix, down) = with_term(lambda);
            (lambda, val, mix, down)
        })
        .collect();
    let scores: Vec<(f64, f64)> = tried.iter().map(|t| (t.0, t.1)).collect();
    let best = (0..tried.len())
        .max_by(|&a, &b| tried[a].1.total_cmp(&tried[b].1))
        .unwrap();
    let (lambda, _, mix, mix_down) = tried.swap_remove(best);
    eprintln!("validation accuracy by client precision: {scores:?}; chose {lambda}");
    let mut free = FedMix::new(2, config);
    let free_down = bytes_down(&mut free);
    let free_val = {
        let plain = free.assignments()[&0];
        let centres = free.centres().unwrap();
        (acc(&w, &centres[plain], &val_plain) + acc(&w, &centres[1 - plain], &val_perm)) / 2.0
    };
    eprintln!("validation accuracy without the term: {free_val}");
    // The instruction carries both centres besides the start: three models down, not one.
    assert!(mix_down > 2 * free_down, "{mix_down} vs {free_down}");
    let a = mix.assignments();
    let plain = a[&0];
    assert!((0..4).all(|c| a[&c] == plain), "{a:?}");
    assert!((4..8).all(|c| a[&c] != plain), "{a:?}");
    let centres = mix.centres().unwrap();
    let (mix_plain, mix_perm) = (
        acc(&w, &centres[plain], &w.test_plain),
        acc(&w, &centres[1 - plain], &w.test_perm),
    );
    let mut fedavg = MethodConfig::FedAvg(fedfuse_fed::FedAvgSettings {
        separate_inits: false,
    })
    .build()
    .unwrap();
    let avg = run(&w, fedavg.as_mut(), 8);
    let (avg_plain, avg_perm) = (acc(&w, &avg, &w.test_plain), acc(&w, &avg, &w.test_perm));
    eprintln!(
        "test: components {mix_plain:.3} / {mix_perm:.3}, FedAvg {avg_plain:.3} / {avg_perm:.3}"
    );
    // Measured: validation 0.873 / 0.871 / 0.841 / 0.584 / 0.218 at 0.001 / 0.01 / 0.1 / 1 /
    // 10, so 0.001 (the validation score falls as the term grows: the weakest term is best);
    // test 0.841 / 0.858 under the term, FedAvg 0.735 / 0.646.
    assert!(
        mix_plain > avg_plain + 0.02 && mix_perm > avg_perm + 0.05,
        "each population's component {mix_plain:.3} / {mix_perm:.3}, FedAvg {avg_plain:.3} / \
         {avg_perm:.3}"
    );
    // The term changes the training: not the free run's centres; and a strong one costs
    // accuracy, while the chosen one does no better than no term (measured 0.218 at 10, 0.873
    // at 0.001 and without the term).
    assert_ne!(free.centres().unwrap()[plain], centres[plain]);
    let strongest = scores.last().unwrap().1;
    let chosen = scores.iter().map(|s| s.1).fold(f64::MIN, f64::max);
    assert!(
        strongest < free_val - 0.3 && chosen < free_val + 0.01,
        "validation {scores:?}, without the term {free_val:.3}"
    );
}
