//! `fedfuse flower-node`: a Flower SuperNode that trains its client slot with fedfuse.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use fedfuse_core::ConfigValue;
use fedfuse_core::flower::{MetricValue, NUM_EXAMPLES};
use fedfuse_data::{CsvOptions, read_csv};
use fedfuse_flower_node::fleet::{Connection, NodeKey};
use fedfuse_flower_node::node::{Handler, HandlerError, NodeOptions, run};
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
    /// Seconds between polls for work while idle (Flower's SuperNode polls every 3; each
    /// pause is drawn within 25% of it). Each poll costs the SuperLink an HTTP request.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0, value_parser = parse_poll)]
    pub poll: f64,
}

fn parse_poll(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.1..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "`{text}` is not a number of seconds from 0.1 to 3600"
        )),
    }
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
    ) -> std::result::Result<RecordDict, HandlerError> {
        let content = content.to_content()?;
        match kind {
            "train" => {
                let mut reply = self
                    .fed
                    .client_fit(self.id, &content)
                    .with_context(|| format!("client {}", self.id))?;
                reply.config.push(self.slot());
                Ok(RecordDict::from_content(reply))
            }
            "evaluate" => {
                let (loss, accuracy, n) = self
                    .fed
                    .client_evaluate(self.id, &content)
                    .with_context(|| format!("client {}", self.id))?;
                // The same keys from every node, whatever its data.
                let metrics = vec![
                    (NUM_EXAMPLES.into(), MetricValue::Int(n as i64)),
                    ("loss".into(), MetricValue::Float(loss)),
                    ("accuracy".into(), MetricValue::Float(accuracy)),
                ];
                Ok(RecordDict(vec![
                    (METRICS.into(), Record::Metrics(metrics)),
                    (CONFIG.into(), Record::Config(vec![self.slot()])),
                ]))
            }
            "query" => Ok(RecordDict(vec![(
                CONFIG.into(),
                Record::Config(vec![self.slot()]),
            )])),
            other => {
                Err(format!("fedfuse nodes answer train, evaluate and query, not `{other}`").into())
            }
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
    // Flower's strategies need the same metric keys from every node: where clients measure
    // their local accuracy, this one must be able to.
    let measured = cfg.local_eval
        && cfg
            .dataset
            .as_ref()
            .is_some_and(|d| d.local_test_fraction > 0.0);
    if measured && fed.data.local_test_len(args.partition_id) == 0 {
        bail!(
            "client {} has no local test sample (a partition of one sample), so its train replies \
             could not carry `local_accuracy` as the other nodes' do; give every client at least 2 \
             samples (`partition.min_partition_size`), or set `local_eval = false`",
            args.partition_id
        );
    }
    let key = match &args.auth_key {
        Some(path) => Some(NodeKey::from_file(path)?),
        None => None,
    };
    let opts = NodeOptions {
        first_contact_wait: std::time::Duration::from_secs(args.wait_for_superlink),
        poll: std::time::Duration::from_secs_f64(args.poll),
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

    use super::*;
    use std::path::Path;

    /// A node's handler for the digits quickstart with `sets`, and round 1's train
    /// instruction as the SuperLink would carry it.
    fn quickstart_client(sets: &[&str]) -> (FedfuseClient, RecordDict) {
        let quickstart = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/quickstart.toml"
        );
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let cfg = Config::load(Path::new(quickstart), &sets).unwrap();
        let client = FedfuseClient {
            fed: Federation::prepare(&cfg).unwrap(),
            id: 0,
        };
        let instruction = client
            .fed
            .method
            .instruct(1, 0, &client.fed.init)
            .unwrap()
            .to_flower()
            .unwrap();
        (client, RecordDict::from_content(instruction))
    }

    /// Flower's stock strategies refuse a round whose replies differ in their metric keys
    /// (`InconsistentMessageReplies`). Here 200 clients of the digits share 1,438 samples, so
    /// many partitions hold 2 or 3, whose 20% local test split once rounded to nothing.
    #[test]
    fn every_nodes_replies_carry_the_same_metric_keys() {
        let (mut client, instruction) = quickstart_client(&[
            "clients=200",
            "partition.min_partition_size=2",
            "partition.alpha=2",
            "train.epochs=1",
        ]);
        let sizes: Vec<usize> = (0..200)
            .map(|id| client.fed.data.num_examples(id))
            .collect();
        let smallest = sizes.iter().min().copied().unwrap_or_default();
        assert!(
            smallest <= 3,
            "the test needs tiny partitions; smallest has {smallest}"
        );
        let mut keys = |kind: &str, id: usize| -> Vec<String> {
            client.id = id;
            let reply = client.handle(kind, &instruction).unwrap();
            let content = reply.to_content().unwrap();
            let mut keys: Vec<String> = content.metrics.iter().map(|(k, _)| k.clone()).collect();
            keys.sort();
            keys
        };
        let ids: Vec<usize> = (0..200)
            .filter(|&id| sizes[id] <= 2 || id % 50 == 0)
            .collect();
        assert!(ids.len() > 4, "{ids:?}");
        for kind in ["train", "evaluate"] {
            let first = keys(kind, ids[0]);
            for &id in &ids[1..] {
                assert_eq!(keys(kind, id), first, "{kind} reply of client {id}");
            }
        }
        // The train replies carry the local accuracy Flower's FedAvg averages.
        assert!(keys("train", ids[0]).iter().any(|k| k == "local_accuracy"));
    }

    /// Without local test samples nobody measures a local accuracy, and every evaluate reply
    /// still carries `loss` and `accuracy` (with 0 examples, which weigh nothing).
    #[test]
    fn without_local_test_samples_no_node_sends_a_local_accuracy() {
        let (mut client, instruction) =
            quickstart_client(&["dataset.local_test_fraction=0", "train.epochs=1"]);
        for id in 0..client.fed.data.num_clients() {
            client.id = id;
            for (kind, expected) in [
                ("train", &["num-examples", "train_loss"][..]),
                ("evaluate", &["accuracy", "loss", "num-examples"][..]),
            ] {
                let reply = client.handle(kind, &instruction).unwrap();
                let content = reply.to_content().unwrap();
                let mut keys: Vec<&str> = content.metrics.iter().map(|(k, _)| k.as_str()).collect();
                keys.sort_unstable();
                assert_eq!(keys, expected, "{kind} reply of client {id}");
            }
        }
    }
}
