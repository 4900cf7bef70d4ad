//! `fedfuse flower-node`: a Flower SuperNode that trains its client slot with fedfuse.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use fedfuse_core::ConfigValue;
use fedfuse_core::flower::{MetricValue, NUM_EXAMPLES};
use fedfuse_data::{CsvOptions, read_csv};
use fedfuse_flower_node::fleet::{Connection, NodeKey};
use fedfuse_flower_node::node::{Handler, NodeOptions, run};
use fedfuse_flower_node::objects::{CONFIG, METRICS, Record, RecordDict};
use fedfuse_lab::Config;
use fedfuse_lab::run::Federation;

/// The node's settings from the command line.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// The SuperLink's Fleet API, HOST:PORT.
    #[arg(long, value_parser = parse_superlink)]
    pub superlink: String,
    /// Seconds to keep trying a SuperLink that does not answer yet on first contact (one
    /// started just before the node needs a second or two); 0 gives up at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub wait_for_superlink: u64,
    /// A `fedfuse run` config: dataset, partition, model and local training.
    #[arg(long)]
    pub config: PathBuf,
    /// This node's client slot (Flower's `partition-id`).
    #[arg(long)]
    pub partition_id: usize,
    /// Override a config key (repeatable), as for `fedfuse run`.
    #[arg(long = "set")]
    pub sets: Vec<String>,
    /// Folder holding the dataset files (instead of the cache).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The node's own samples, a CSV file (a header line; numeric features in the run
    /// dataset's units, then the class id in the last column), in place of its partition of
    /// the run's dataset. They never leave the node.
    #[arg(long, value_name = "FILE.csv")]
    pub own_data: Option<PathBuf>,
    /// PEM file of the CA that signed the SuperLink's certificate (TLS).
    #[arg(long)]
    pub root_certificates: Option<PathBuf>,
    /// The node's P-384 private key (OpenSSH, as `ssh-keygen -t ecdsa -b 384` writes it, or
    /// PKCS#8 PEM) whose public half was registered with `flwr supernode register`; without
    /// it the node makes a key and registers itself (SuperLinks without node authentication).
    #[arg(long)]
    pub auth_key: Option<PathBuf>,
    /// Plain HTTP, no TLS (loopback and tests).
    #[arg(long)]
    pub insecure: bool,
}

/// `--superlink` as HOST:PORT with a port Flower could listen on (1-65535), so a mistyped
/// address is named as such rather than reported as a refused connection.
fn parse_superlink(text: &str) -> std::result::Result<String, String> {
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!(
            "`{text}` is not HOST:PORT (for example 127.0.0.1:9092, the SuperLink's Fleet API)"
        ));
    };
    let host_ok = !host.is_empty() && !host.contains(['/', ' ']);
    if !host_ok {
        return Err(format!("`{text}`: `{host}` is not a host name or address"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(text.to_string()),
        _ => Err(format!("`{text}`: `{port}` is not a port (1 to 65535)")),
    }
}

/// Flower's node-config key for the client slot, which fedfuse's strategy asks for.
const PARTITION_ID: &str = "partition-id";

/// Answers a fedfuse strategy's messages (`train`, `evaluate`, `query`) and Flower's own
/// strategies' (`train`, `evaluate`), for one client slot of a run config.
struct FedfuseClient {
    fed: Federation,
    id: usize,
}

impl FedfuseClient {
    fn slot(&self) -> (String, ConfigValue) {
        (PARTITION_ID.into(), ConfigValue::Int(self.id as i64))
    }
}

impl Handler for FedfuseClient {
    fn handle(
        &mut self,
        kind: &str,
        content: &RecordDict,
    ) -> std::result::Result<RecordDict, String> {
        let content = content.to_content().map_err(|e| e.to_string())?;
        match kind {
            "train" => {
                let mut reply = self
                    .fed
                    .client_fit(self.id, &content)
                    .map_err(|e| format!("client {}: {e}", self.id))?;
                reply.config.push(self.slot());
                Ok(RecordDict::from_content(reply))
            }
            "evaluate" => {
                let (loss, accuracy, n) = self
                    .fed
                    .client_evaluate(self.id, &content)
                    .map_err(|e| format!("client {}: {e}", self.id))?;
                let mut metrics = vec![(NUM_EXAMPLES.into(), MetricValue::Int(n as i64))];
                if n > 0 {
                    metrics.push(("loss".into(), MetricValue::Float(loss)));
                    metrics.push(("accuracy".into(), MetricValue::Float(accuracy)));
                }
                Ok(RecordDict(vec![
                    (METRICS.into(), Record::Metrics(metrics)),
                    (CONFIG.into(), Record::Config(vec![self.slot()])),
                ]))
            }
            "query" => Ok(RecordDict(vec![(
                CONFIG.into(),
                Record::Config(vec![self.slot()]),
            )])),
            other => Err(format!(
                "fedfuse nodes answer train, evaluate and query, not `{other}`"
            )),
        }
    }
}

pub fn run_node(args: NodeArgs) -> Result<()> {
    if args.insecure && args.root_certificates.is_some() {
        bail!("--insecure and --root-certificates exclude each other: pick plain HTTP or TLS");
    }
    if args.insecure && args.auth_key.is_some() {
        // Flower's signatures cover only a timestamp: over plain HTTP anyone on the path can
        // replay one as this node.
        bail!(
            "--auth-key needs TLS (--root-certificates): over plain HTTP (--insecure) a captured \
             signature can be replayed as this node"
        );
    }
    let mut cfg = Config::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    if args.data_dir.is_some() {
        cfg.data_dir = args.data_dir.clone();
    }
    let mut fed =
        Federation::prepare(&cfg).with_context(|| format!("config {}", args.config.display()))?;
    let clients = fed.data.num_clients();
    if args.partition_id >= clients {
        bail!(
            "--partition-id {} is out of range: {} has {clients} clients (0 to {})",
            args.partition_id,
            args.config.display(),
            clients.saturating_sub(1)
        );
    }
    if let Some(path) = &args.own_data {
        let source = path.display().to_string();
        let data = read_csv(path, &CsvOptions::default())
            .with_context(|| format!("--own-data {source}"))?;
        fed.use_own_data(&cfg, args.partition_id, data, &source)?;
    }
    let key = match &args.auth_key {
        Some(path) => Some(NodeKey::from_file(path)?),
        None => None,
    };
    let opts = NodeOptions {
        first_contact_wait: std::time::Duration::from_secs(args.wait_for_superlink),
        ..NodeOptions::new(Connection {
            superlink: args.superlink.clone(),
            insecure: args.insecure,
            root_certificates: args.root_certificates.clone(),
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
        .context("installing the SIGINT/SIGTERM handler")?;
    let origin = match &args.own_data {
        Some(path) => format!("its own data in {}", path.display()),
        None => "its partition".into(),
    };
    eprintln!(
        "fedfuse node: client {} of {} ({}), {} training examples from {origin}",
        args.partition_id,
        clients,
        fed.summary,
        fed.data.num_examples(args.partition_id)
    );
    let mut client = FedfuseClient {
        fed,
        id: args.partition_id,
    };
    let log = |line: &str| eprintln!("fedfuse node: {line}");
    run(&opts, key, &mut client, &stop, &log)
        .with_context(|| format!("SuperLink {}", args.superlink))?;
    Ok(())
}
