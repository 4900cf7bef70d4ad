//! `fedfuse data get|verify|info`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Subcommand;
use fedfuse_data::{
    DownloadEvent, VerifyStatus, dataset_info, default_dataset_dir, known_datasets,
};

/// `fedfuse data ...`
#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Download a dataset's files into the cache (or --dir), verifying sha256.
    Get {
        /// Dataset name (`mnist`, `fashion-mnist`, `cifar10`).
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
}

/// Runs a `data` subcommand.
pub fn run(cmd: DataCommand) -> Result<ExitCode> {
    match cmd {
        DataCommand::Get { name, dir } => {
            let dir = dir.unwrap_or_else(|| default_dataset_dir(&name));
            dataset_info(&name)?;
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
                    VerifyStatus::Ok => println!("ok        {file}"),
                    VerifyStatus::Missing => {
                        ok = false;
                        println!("missing   {file}");
                    }
                    VerifyStatus::Mismatch { actual } => {
                        ok = false;
                        println!("mismatch  {file} (sha256 {actual})");
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
            println!("digits: bundled UCI optical digits (1,797 8x8 images), offline");
            for info in infos {
                println!(
                    "{}: {} files, cached in {}",
                    info.name,
                    info.files.len(),
                    default_dataset_dir(info.name).display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
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
