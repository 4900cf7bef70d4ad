//! A node with a deterministic step, for the loopback tests against Flower's own strategies:
//! `train` adds `--add` to every value of the arrays it receives and reports `--examples`
//! examples; `evaluate` reports `loss = --add` over the same examples.
//!
//!     cargo run --example adder -- --superlink 127.0.0.1:9092 --add 0.5 --examples 10

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fedfuse_core::Record;
use fedfuse_core::flower::{FlowerContent, MetricValue, NUM_EXAMPLES};
use fedfuse_flower_node::fleet::Connection;
use fedfuse_flower_node::node::{Handler, HandlerError, NodeOptions, run};
use fedfuse_flower_node::objects::{METRICS, Record as FlowerRecord, RecordDict};

struct Adder {
    add: f32,
    examples: i64,
}

impl Handler for Adder {
    fn handle(&mut self, kind: &str, content: &RecordDict) -> Result<RecordDict, HandlerError> {
        let content = content.to_content()?;
        match kind {
            "train" => {
                let mut record = Record::from_flower(&FlowerContent {
                    config: Vec::new(),
                    ..content
                })?;
                for (_, t) in record.params.iter_mut() {
                    t.data.iter_mut().for_each(|v| *v += self.add);
                }
                let mut reply = record.to_flower()?;
                reply.config.clear();
                reply.metrics = vec![(NUM_EXAMPLES.into(), MetricValue::Int(self.examples))];
                Ok(RecordDict::from_content(reply))
            }
            "evaluate" => Ok(RecordDict(vec![(
                METRICS.into(),
                FlowerRecord::Metrics(vec![
                    (NUM_EXAMPLES.into(), MetricValue::Int(self.examples)),
                    ("loss".into(), MetricValue::Float(f64::from(self.add))),
                ]),
            )])),
            other => Err(format!("no `{other}` step here").into()),
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let superlink = arg(&args, "--superlink").ok_or("--superlink HOST:PORT is required")?;
    let add: f32 = arg(&args, "--add").ok_or("--add is required")?.parse()?;
    let examples: i64 = arg(&args, "--examples")
        .ok_or("--examples is required")?
        .parse()?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))?;
    let opts = NodeOptions::new(Connection {
        superlink,
        insecure: true,
        root_certificates: None,
    });
    let log = |line: &str| eprintln!("adder: {line}");
    run(&opts, None, &mut Adder { add, examples }, &stop, &log)?;
    Ok(())
}
