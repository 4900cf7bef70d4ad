//! Command-line arguments and dispatch.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use fedfuse_lab::Config;

use crate::data_cmd::DataCommand;
use crate::progress::Reporter;

/// The version, with the matrix kernels this machine runs (results are bit-identical only
/// between machines with the same ones).
fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        format!(
            "{} (gemm kernels: {})",
            env!("CARGO_PKG_VERSION"),
            fedfuse_train::gemm_kernels()
        )
    })
}

/// fedfuse: federated learning that fuses client networks.
#[derive(Parser, Debug)]
#[command(name = "fedfuse", version = version_line(), about)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the experiment a TOML config describes.
    Run {
        /// The config file.
        config: PathBuf,
        /// Output folder (created): resolved config, results.json, metrics.csv, model, plots.
        #[arg(long)]
        out: PathBuf,
        /// Folder holding the dataset files (instead of the cache).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Override a config key, e.g. `--set partition.alpha=0.1` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        quiet: bool,
        /// Continue an interrupted run from the checkpoint beside OUT (`OUT.checkpoint`,
        /// written after every round); the same config and --set values are required.
        #[arg(long)]
        resume: bool,
        /// Also write TensorBoard event files into this folder (created): every round's
        /// figures as scalars, the resolved config as text (`[logging] tensorboard` in the
        /// config does the same).
        #[arg(long, value_name = "DIR")]
        tensorboard: Option<PathBuf>,
    },
    /// Compare methods on one federation set-up over seeds (e.g. FedSparse against FedAvg,
    /// FedDrop and FedL1): per-round rows, a summary table of accuracy, traffic and sparsity,
    /// and plots of accuracy against traffic.
    Compare {
        /// The comparison file (see experiments/, files with `[[arms]]`).
        config: PathBuf,
        #[command(flatten)]
        grid: GridArgs,
    },
    /// Run a grid of experiments (seeds x partitions x clients x depths) and write a table
    /// (results.csv, summary.csv, summary.md) and plots.
    Sweep {
        /// The sweep file (see experiments/).
        config: PathBuf,
        #[command(flatten)]
        grid: GridArgs,
    },
    /// Run a GEMS experiment (learner data, local models, averaging, GEMS, fine-tuning, the
    /// pooled gold model) and write a table (results.csv, summary.csv, summary.md).
    Gems {
        /// The experiment file (see experiments/gems-*.toml).
        config: PathBuf,
        #[command(flatten)]
        grid: GridArgs,
    },
    /// Run a FedNGM experiment (synthetic GGM or the CDC file: client graphs, consensus,
    /// local / global / pooled NGMs, FedNGR, stitching) and write a table (results.csv,
    /// results.json, summary.csv, summary.md).
    Ngm {
        /// The experiment file (see experiments/ngm-*.toml).
        config: PathBuf,
        #[command(flatten)]
        grid: GridArgs,
    },
    /// Fetch, verify and describe datasets.
    Data {
        #[command(subcommand)]
        command: DataCommand,
    },
    /// Fuse pre-trained models (safetensors or npz PyTorch state dicts: MLPs, or CNNs with
    /// --model) into one model.
    Fuse {
        /// Client model files.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The fused model (a FUSED.assignments.json is written beside it).
        #[arg(long)]
        out: PathBuf,
        /// Fusion method.
        #[arg(long, value_enum, default_value = "pfnm")]
        method: crate::fuse_cmd::FuseMethod,
        /// The network the files hold: lenet5, cnn-leaf, vgg9, resnet20, resnet18, resnet34 or resnet50
        /// (torchvision's, read by its tensor names), or a TOML file with [model] kind =
        /// "sequential", input = [c, h, w] and layers = [...] (needed for anything but MLPs;
        /// fused files carry theirs).
        #[arg(long)]
        model: Option<String>,
        /// JSON list of per-client class counts (weights the output layer / the mean).
        #[arg(long)]
        class_counts: Option<PathBuf>,
        /// The matcher's priors and iterations (PFNM, GPI-FNM).
        #[command(flatten)]
        prior: fedfuse_fuse::MatchPrior,
        /// GPI-FNM: weight of the global-posterior KL cost (0 is PFNM).
        #[arg(long, default_value_t = fedfuse_fuse::PfnmConfig::default().eps)]
        eps: f64,
        /// PFNM: which way a deep network's hidden layers are matched (default top_down for
        /// MLPs; layer lists are matched bottom_up).
        #[arg(long, value_enum)]
        order: Option<crate::fuse_cmd::FuseOrder>,
        /// Seed of the refinement order.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Re-estimate every batch norm's running statistics of the fused model on these
        /// inputs (one array, N x C x H x W or N x D, in .npz or .safetensors), in
        /// training-mode passes averaged over the batches: the repair a merged network needs
        /// (averaged statistics describe none of the models merged).
        #[arg(long, value_name = "SAMPLES")]
        reset_bn: Option<PathBuf>,
        /// Samples per pass of `--reset-bn`.
        #[arg(long, default_value_t = 64, requires = "reset_bn")]
        reset_bn_batch: usize,
    },
    /// Show a model's permutation groups: the units that weight matching, PFNM and GPI-FNM
    /// match together (a layer's units, a residual stage's stream, a block's inner channels),
    /// each with every tensor that holds them and every tensor that reads them.
    Groups {
        /// The network: a zoo name (lenet5, cnn-leaf, vgg9, resnet20, resnet18, resnet34, resnet50) or
        /// a TOML file with a [model] table, as `fuse --model` takes it.
        #[arg(long)]
        model: String,
        /// The shape of one sample, e.g. `--input 3,32,32` (default: the model file's, else
        /// 3x32x32 images).
        #[arg(long, value_delimiter = ',')]
        input: Option<Vec<usize>>,
        /// Print JSON (a list of {units, tied, holds, read_by}) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Join a Flower federation as a SuperNode that trains one client slot of a run config
    /// with fedfuse (docs/FLOWER.md): fedfuse's strategies and Flower's own both work.
    FlowerNode(crate::node_cmd::NodeArgs),
    /// Measure throughput (see docs/BENCHMARKS.md).
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// One epoch of local training: MLP 784-100-10, LeNet-5 and cnn-leaf on MNIST, VGG-9 and
    /// ResNet-20 on 32x32x3 batches.
    Train {
        /// Folder with the MNIST files (default: the cache).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Timed repeats; the median is reported.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Worker threads for the tensor library.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// The networks to time, comma-separated: mlp, lenet5, cnn-leaf, vgg9, resnet20, vit
        /// (the default ViT on 32x32x3 images; not in the default list).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "mlp,lenet5,cnn-leaf,vgg9,resnet20"
        )]
        models: Vec<String>,
    },
    /// Simulator throughput: many clients, a tiny local step, FedAvg.
    Sim {
        /// Clients, all taking part every round.
        #[arg(long, default_value_t = 1000)]
        clients: usize,
        /// Rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Hidden width of the 64-WIDTH-10 model (1400: about 100,000 parameters).
        #[arg(long, default_value_t = 1400)]
        width: usize,
        /// `add` (add 0.01 to every parameter, as Flower's benchmark) or `sgd` (one real step).
        #[arg(long, default_value = "add")]
        step: String,
        /// Hold all replies of a round before aggregating (no streaming fold), to compare.
        #[arg(long)]
        collect: bool,
    },
}

/// Dispatches a parsed command line.
pub fn run(args: Args) -> Result<ExitCode> {
    match args.command {
        Command::Run {
            config,
            out,
            data_dir,
            overrides,
            quiet,
            resume,
            tensorboard,
        } => {
            let mut cfg = Config::load(&config, &overrides)?;
            if data_dir.is_some() {
                cfg.data_dir = data_dir;
            }
            if tensorboard.is_some() {
                cfg.logging.tensorboard = tensorboard;
            }
            fedfuse_lab::run::run_with(&cfg, &out, &Reporter::new(quiet), resume)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Compare { config, grid } => {
            let mut cfg = fedfuse_lab::compare::CompareConfig::load(&config)?;
            replace_seeds(&mut cfg.seeds, grid.seeds)?;
            let reporter = Reporter::new(true);
            fedfuse_lab::compare::run(
                &cfg,
                &grid.out,
                grid.data_dir.as_deref(),
                &reporter,
                grid.resume,
                grid.tensorboard.as_deref(),
                None,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sweep { config, grid } => {
            let mut cfg = fedfuse_lab::sweep::SweepConfig::load(&config)?;
            replace_seeds(&mut cfg.seeds, grid.seeds)?;
            let reporter = Reporter::new(true);
            fedfuse_lab::sweep::run(
                &cfg,
                &grid.out,
                grid.data_dir.as_deref(),
                &reporter,
                grid.resume,
                None,
                grid.tensorboard.as_deref(),
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Gems { config, grid } => {
            no_tensorboard(&grid, "gems")?;
            let mut cfg = fedfuse_lab::gems_experiment::GemsExperiment::load(&config)?;
            replace_seeds(&mut cfg.seeds, grid.seeds)?;
            let reporter = Reporter::new(true);
            fedfuse_lab::gems_experiment::run(
                &cfg,
                &grid.out,
                grid.data_dir.as_deref(),
                &reporter,
                grid.resume,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ngm { config, grid } => {
            no_tensorboard(&grid, "ngm")?;
            let mut cfg = fedfuse_lab::ngm_experiment::NgmExperiment::load(&config)?;
            replace_seeds(&mut cfg.seeds, grid.seeds)?;
            let reporter = Reporter::new(true);
            fedfuse_lab::ngm_experiment::run(
                &cfg,
                &grid.out,
                grid.data_dir.as_deref(),
                &reporter,
                grid.resume,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Data { command } => crate::data_cmd::run(command),
        Command::Fuse {
            inputs,
            out,
            method,
            model,
            class_counts,
            prior,
            eps,
            order,
            seed,
            reset_bn,
            reset_bn_batch,
        } => crate::fuse_cmd::run(&crate::fuse_cmd::FuseArgs {
            method,
            inputs,
            out,
            class_counts,
            model,
            pfnm: fedfuse_fuse::PfnmConfig {
                prior,
                eps,
                ..fedfuse_fuse::PfnmConfig::default()
            },
            order: order.map(Into::into),
            seed,
            reset_bn: reset_bn.map(|file| (file, reset_bn_batch)),
        }),
        Command::Groups { model, input, json } => {
            crate::fuse_cmd::show_groups(&model, input.as_deref(), json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::FlowerNode(args) => {
            crate::node_cmd::run_node(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { command } => match command {
            BenchCommand::Train {
                data_dir,
                repeats,
                threads,
                models,
            } => crate::bench::train(
                &data_dir.unwrap_or_else(crate::bench::default_mnist),
                repeats.max(1),
                threads.max(1),
                &models,
            ),
            BenchCommand::Sim {
                clients,
                rounds,
                width,
                step,
                collect,
            } => crate::bench::sim(clients, rounds, width, &step, collect),
        },
    }
}

/// What `compare` and `sweep` take besides their file.
#[derive(Debug, clap::Args)]
pub struct GridArgs {
    /// Output folder (created).
    #[arg(long)]
    out: PathBuf,
    /// Folder holding the dataset files (instead of the cache).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Replace the seeds, e.g. `--seeds 0,1,2`.
    #[arg(long, value_delimiter = ',')]
    seeds: Option<Vec<u64>>,
    /// Take the runs (compare), settings (sweep) or seeds (gems, ngm) an interrupted one
    /// finished (OUT/runs.toml, under the same settings) instead of running them again.
    #[arg(long)]
    resume: bool,
    /// `compare` and `sweep`: also write TensorBoard event files, one run per arm and seed
    /// (`DIR/{arm}/seed-{seed}`) or per setting and method (`DIR/{setting}/{method}`).
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
}

/// Refuses `--tensorboard` where no federation's rounds are logged.
fn no_tensorboard(grid: &GridArgs, command: &str) -> anyhow::Result<()> {
    if grid.tensorboard.is_some() {
        anyhow::bail!(
            "--tensorboard logs the rounds of `fedfuse run`, `compare` and `sweep`; `fedfuse \
             {command}` reports stages, not rounds, and writes no TensorBoard events"
        );
    }
    Ok(())
}

/// `--seeds`, when given, replaces the file's seeds.
fn replace_seeds(seeds: &mut Vec<u64>, given: Option<Vec<u64>>) -> anyhow::Result<()> {
    if let Some(given) = given {
        if given.is_empty() {
            anyhow::bail!("--seeds needs at least one seed");
        }
        *seeds = given;
    }
    Ok(())
}
