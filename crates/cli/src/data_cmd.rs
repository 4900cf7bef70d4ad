//! `fedfuse data get|verify|info|partition`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use fedfuse_data::{
    DownloadEvent, VerifyStatus, dataset_info, default_dataset_dir, known_datasets,
};
use fedfuse_lab::Config;
use fedfuse_lab::run::{Federation, FederationData};

/// `fedfuse data ...`
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Download a dataset's files into the cache (or --dir), verifying sha256.
    Get {
        /// Dataset name (`mnist`, `fashion-mnist`, `cifar10`, `cifar100`, `cifar100-coarse`).
        name: String,
        /// Destination folder (default: the cache folder of the dataset).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Check the sha256 of a dataset's files.
    Verify {
        /// Dataset name.
        name: String,
        /// Folder to check (default: the cache folder of the dataset).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Describe the known datasets and where they are cached.
    Info {
        /// One dataset (default: all).
        name: Option<String>,
    },
    /// Show how a run config splits its dataset among clients, exactly as `fedfuse run` does:
    /// one row per client with its size and samples per class.
    Partition {
        /// The run config.
        config: PathBuf,
        /// Override a config key, e.g. `--set partition.alpha=0.1` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Folder holding the dataset files (instead of the cache).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Also write a stacked-bar plot of the table (SVG).
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
    },
}

/// Runs a `data` subcommand.
pub fn run(cmd: DataCommand) -> Result<ExitCode> {
    match cmd {
        DataCommand::Get { name, dir } => {
            let dir = dir.unwrap_or_else(|| default_dataset_dir(&name));
            dataset_info(&name)?;
            if let Some(how) = fedfuse_data::how_to_get(&name) {
                bail!("fedfuse does not download {name}: {how}");
            }
            fedfuse_data::download(&name, &dir, &mut |e| print_event(&e))?;
            eprintln!(
                "{name}: all files present and verified in {}",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Verify { name, dir } => {
            let dir = dir.unwrap_or_else(|| default_dataset_dir(&name));
            let statuses = fedfuse_data::verify(&name, &dir)?;
            let mut ok = true;
            for (file, status) in &statuses {
                match status {
                    VerifyStatus::Ok => outln!("ok        {file}"),
                    VerifyStatus::Missing => {
                        ok = false;
                        outln!("missing   {file}");
                    }
                    VerifyStatus::Mismatch { actual } => {
                        ok = false;
                        outln!("mismatch  {file} (sha256 {actual})");
                    }
                }
            }
            if !ok {
                bail!(
                    "{name} in {} is incomplete or corrupt: run `fedfuse data get {name}`",
                    dir.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Info { name } => {
            let infos: Vec<_> = match name {
                Some(n) => vec![dataset_info(&n)?],
                None => known_datasets().iter().collect(),
            };
            outln!("digits: bundled UCI optical digits (1,797 8x8 images), offline");
            for info in infos {
                match fedfuse_data::how_to_get(info.name) {
                    Some(how) => outln!(
                        "{}: {}; read from --data-dir or {}. {how}",
                        info.name,
                        info.description,
                        default_dataset_dir(info.name).display()
                    ),
                    None => outln!(
                        "{}: {} files, cached in {}",
                        info.name,
                        info.files.len(),
                        default_dataset_dir(info.name).display()
                    ),
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DataCommand::Partition {
            config,
            overrides,
            data_dir,
            plot,
        } => partition(&config, &overrides, data_dir, plot.as_deref()),
    }
}

/// `fedfuse data partition`: the clients' data of the run, built by the run's own code.
fn partition(
    config: &Path,
    overrides: &[String],
    data_dir: Option<PathBuf>,
    plot: Option<&Path>,
) -> Result<ExitCode> {
    if let Some(p) = plot
        && p.extension().and_then(|e| e.to_str()) != Some("svg")
    {
        bail!(
            "--plot {}: the plot is SVG; name the file *.svg",
            p.display()
        );
    }
    if let Some(p) = plot {
        fedfuse_lab::table::prepare_output_path(p).context("--plot")?;
    }
    let mut cfg = Config::load(config, overrides)?;
    if data_dir.is_some() {
        cfg.data_dir = data_dir;
    }
    let fed = Federation::prepare(&cfg)?;
    let FederationData::Labelled { clients, .. } = &fed.data else {
        bail!(
            "{}: this config federates tables ([table]); each client is its own group of rows, \
             there is no labelled partition to show",
            config.display()
        );
    };
    // A client's partition is its local training and test samples together.
    let counts: Vec<Vec<usize>> = clients
        .iter()
        .map(|c| {
            let mut n = c.train.class_counts();
            n.iter_mut()
                .zip(c.test.class_counts())
                .for_each(|(a, b)| *a += b);
            n
        })
        .collect();
    eprintln!("{}", fed.summary);
    out!("{}", histogram_table(&counts));
    if let Some(path) = plot {
        let title = format!("{}: samples per class and client", cfg.partition.kind());
        fedfuse_lab::plot::write_class_histogram(path, &title, &counts)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// One row per client: its id, size and count per class; then the totals.
fn histogram_table(counts: &[Vec<usize>]) -> String {
    let classes = counts.iter().map(Vec::len).max().unwrap_or(0);
    let mut totals = vec![0usize; classes];
    counts.iter().for_each(|row| {
        totals.iter_mut().zip(row).for_each(|(t, &n)| *t += n);
    });
    let grand: usize = totals.iter().sum();
    let width = grand
        .to_string()
        .len()
        .max(classes.to_string().len())
        .max(4)
        + 1;
    let line = |first: String, cells: &[usize]| {
        let mut s = format!("{first:>7} {:>width$}", cells.iter().sum::<usize>());
        for n in cells {
            s += &format!(" {n:>width$}");
        }
        s + "\n"
    };
    let mut out = format!("{:>7} {:>width$}", "client", "size");
    for k in 0..classes {
        out += &format!(" {k:>width$}");
    }
    out += "\n";
    for (c, row) in counts.iter().enumerate() {
        out += &line(c.to_string(), row);
    }
    out + &line("total".into(), &totals)
}

fn print_event(e: &DownloadEvent) {
    match e {
        DownloadEvent::Skipped { file } => eprintln!("{file}: present, sha256 ok"),
        DownloadEvent::Started {
            file,
            url,
            offset,
            total,
        } => {
            let size = total.map_or(String::new(), |t| format!(" ({:.1} MB)", t as f64 / 1e6));
            if *offset > 0 {
                eprintln!("{file}: resuming at byte {offset} from {url}{size}");
            } else {
                eprintln!("{file}: downloading {url}{size}");
            }
        }
        DownloadEvent::Failed { file, url, error } => {
            eprintln!("{file}: {url} failed: {error}; trying the next source")
        }
        DownloadEvent::Finished { file } => eprintln!("{file}: done, sha256 ok"),
        // Byte counts are too chatty for plain lines.
        _ => {}
    }
}
