//! `fedfuse bench`: local-training and simulation throughput (results go in docs/BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use fedfuse_core::{BlockNorm, ModelSpec, Params, Record, VitShape, ZooModel};
use fedfuse_data::{ClientData, Dataset, load_dataset};
use fedfuse_fed::{
    Aggregate, ClientContext, ClientsPerRound, FedAvg, Fold, Method, Population, Reply, SimConfig,
    simulate, standard_fit,
};
use fedfuse_train::{Init, OptimizerConfig, TrainConfig, Trainer, init_params};

/// Median, min and max of `xs`.
fn summary(xs: &mut [f64]) -> (f64, f64, f64) {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    let median = if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    };
    (median, xs[0], xs[n - 1])
}

/// Peak resident memory of this process in MiB (Linux; NaN elsewhere).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU seconds this process has used, all threads, user and system (`/proc/self/stat`'s
/// `utime + stime`, in clock ticks of 1/100 s on Linux); `NaN` where unreadable. Unlike wall
/// time, a one-thread epoch's CPU time barely moves when other work shares the machine.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name, which is in parentheses and may hold spaces:
            // utime and stime are fields 14 and 15 of the line, 12 and 13 after it.
            let rest = s.rsplit_once(')')?.1;
            let mut fields = rest.split_whitespace().skip(11);
            let utime = fields.next()?.parse::<f64>().ok()?;
            let stime = fields.next()?.parse::<f64>().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn time_epochs(
    name: &str,
    spec: ModelSpec,
    data: &Dataset,
    batch_size: usize,
    repeats: usize,
) -> Result<()> {
    let trainer = Trainer::new(spec.clone())?;
    let start = init_params(&spec, Init::Default, 0);
    let cfg = TrainConfig {
        optimizer: OptimizerConfig::Sgd {
            momentum: 0.0,
            weight_decay: 0.0,
        },
        lr: 0.01,
        epochs: 1,
        batch_size,

        dropout: 0.0,
    };
    let mut secs = Vec::with_capacity(repeats);
    let mut cpu = Vec::with_capacity(repeats);
    for r in 0..repeats {
        let (t, c) = (Instant::now(), cpu_seconds());
        trainer.fit_with(&start, data, &cfg, None, r as u64)?;
        secs.push(t.elapsed().as_secs_f64());
        cpu.push(cpu_seconds() - c);
    }
    let (median, min, max) = summary(&mut secs);
    let (cpu_median, ..) = summary(&mut cpu);
    outln!(
        "{name}: {} samples, batch {batch_size}: median {median:.3} s/epoch (min {min:.3}, max {max:.3}) \
         = {:.0} samples/s; CPU {cpu_median:.2} s/epoch",
        data.len(),
        data.len() as f64 / median
    );
    Ok(())
}

/// The networks `fedfuse bench train` times, with the samples and batch size of each: what
/// `scripts/bench_torch_train.py` runs in PyTorch.
pub const TRAIN_MODELS: [&str; 6] = ["mlp", "lenet5", "cnn-leaf", "vgg9", "resnet20", "vit"];

/// `n` samples of 32x32x3 values in [0, 1) and 10 classes from a seeded generator: the
/// conv benchmarks time arithmetic, which does not depend on what the pixels show.
fn synthetic_images(n: usize) -> Result<Dataset> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let x = (0..n * 3 * 32 * 32).map(|_| rng.random::<f32>()).collect();
    let y = (0..n).map(|i| (i % 10) as u32).collect();
    Ok(Dataset::new(x, y, vec![3, 32, 32], 10)?)
}

/// One epoch of local training on each of `models` (see [`TRAIN_MODELS`]).
pub fn train(
    data_dir: &Path,
    repeats: usize,
    threads: usize,
    models: &[String],
) -> Result<ExitCode> {
    if let Some(bad) = models.iter().find(|m| !TRAIN_MODELS.contains(&m.as_str())) {
        bail!(
            "unknown model `{bad}`; choose from {}",
            TRAIN_MODELS.join(", ")
        );
    }
    let data = load_dataset("mnist", Some(data_dir)).context("MNIST for the benchmark")?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("thread pool")?;
    outln!(
        "local training, {threads} thread(s), {repeats} repeats, gemm kernels {}",
        fedfuse_train::gemm_kernels()
    );
    let mnist = |n: usize| data.train.subset(&(0..n).collect::<Vec<_>>());
    let zoo = |z: ZooModel, input: &[usize]| z.spec(input, 10, BlockNorm::Batch, 16);
    pool.install(|| -> Result<()> {
        for name in models {
            match name.as_str() {
                "mlp" => time_epochs(
                    "MLP 784-100-10",
                    ModelSpec::mlp(784, &[100], 10),
                    &data.train,
                    64,
                    repeats,
                )?,
                "lenet5" => time_epochs(
                    "LeNet-5 28x28x1",
                    ModelSpec::LeNet5 {
                        channels: 1,
                        side: 28,
                        classes: 10,
                    },
                    &mnist(5000),
                    32,
                    repeats,
                )?,
                "cnn-leaf" => time_epochs(
                    "cnn-leaf 28x28x1",
                    zoo(ZooModel::CnnLeaf, &[1, 28, 28])?,
                    &mnist(2000),
                    32,
                    repeats,
                )?,
                "vgg9" => time_epochs(
                    "VGG-9 32x32x3",
                    zoo(ZooModel::Vgg9, &[3, 32, 32])?,
                    &synthetic_images(1000)?,
                    32,
                    repeats,
                )?,
                "vit" => time_epochs(
                    "ViT (default) 32x32x3",
                    ModelSpec::sequential(&[3, 32, 32], VitShape::default().layers(10)),
                    &synthetic_images(500)?,
                    32,
                    repeats,
                )?,
                _ => time_epochs(
                    "ResNet-20 32x32x3",
                    zoo(ZooModel::Resnet20, &[3, 32, 32])?,
                    &synthetic_images(1000)?,
                    32,
                    repeats,
                )?,
            }
        }
        Ok(())
    })?;
    outln!("peak memory {:.0} MiB", peak_rss_mib());
    Ok(ExitCode::SUCCESS)
}

/// The benchmark's client step, with FedAvg on the server: `add` is Flower's benchmark step
/// (add 0.01 to every parameter), `sgd` one real local epoch over the client's one sample.
/// `collect` holds all replies before aggregating instead of folding them (to measure what
/// folding saves).
struct BenchStep {
    sgd: bool,
    collect: bool,
}

impl Method for BenchStep {
    fn name(&self) -> &'static str {
        "bench"
    }

    fn fit(&self, instruction: Record, ctx: &ClientContext<'_>) -> fedfuse_fed::Result<Record> {
        if self.sgd {
            return standard_fit(instruction, ctx);
        }
        let mut params = instruction.params;
        for (_, t) in params.iter_mut() {
            t.data.iter_mut().for_each(|v| *v += 0.01);
        }
        Ok(Record::from_params(params).with_num_examples(1))
    }

    fn aggregate(
        &mut self,
        round: usize,
        global: &Params,
        replies: &[Reply],
    ) -> fedfuse_fed::Result<Aggregate> {
        FedAvg.aggregate(round, global, replies)
    }

    fn fold(&self) -> Option<Box<dyn Fold>> {
        if self.collect { None } else { FedAvg.fold() }
    }
}

/// Simulation throughput: many clients, a tiny local step.
pub fn sim(
    clients: usize,
    rounds: usize,
    width: usize,
    step: &str,
    collect: bool,
) -> Result<ExitCode> {
    if clients == 0 || rounds == 0 {
        bail!("--clients and --rounds must be at least 1");
    }
    let data = load_dataset("digits", None)?;
    // One sample per client, reused cyclically: the step's cost, not the data, is measured.
    let pool: Vec<ClientData> = (0..clients)
        .map(|c| {
            let i = c % data.train.len();
            ClientData {
                train: data.train.subset(&[i]),
                test: data.train.subset(&[]),
            }
        })
        .collect();
    let spec = ModelSpec::mlp(64, &[width], 10);
    let trainer = Trainer::new(spec.clone())?;
    let init = init_params(&spec, Init::Default, 0);
    let cfg = SimConfig {
        rounds,
        clients_per_round: ClientsPerRound::Fraction(1.0),
        seed: 0,
        train: TrainConfig::default(),
        local_eval: false,
        ..SimConfig::default()
    };
    let mut method = match step {
        "add" => BenchStep {
            sgd: false,
            collect,
        },
        "sgd" => BenchStep { sgd: true, collect },
        other => bail!("--step `{other}`: use `add` or `sgd`"),
    };
    let t = Instant::now();
    let run = simulate(
        &mut method,
        Population::labelled(&trainer, &pool, &data.test),
        init,
        &cfg,
        &|_| {},
    )?;
    let total = t.elapsed().as_secs_f64();
    let mut rates: Vec<f64> = run
        .rounds
        .iter()
        .map(|r| r.clients as f64 / r.seconds)
        .collect();
    let (median, min, max) = summary(&mut rates);
    outln!(
        "simulation: {clients} clients x {rounds} rounds, model {} params, step `{step}`, {} threads{}",
        spec.num_params(),
        rayon::current_num_threads(),
        if collect { ", all replies held" } else { "" }
    );
    outln!(
        "client updates/s per round: median {median:.0} (min {min:.0}, max {max:.0}); \
         total {total:.2} s; peak RSS {:.0} MiB",
        peak_rss_mib()
    );
    Ok(ExitCode::SUCCESS)
}

/// Where the bench's MNIST lives by default.
pub fn default_mnist() -> PathBuf {
    fedfuse_data::default_dataset_dir("mnist")
}
