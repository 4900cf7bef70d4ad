//! Regenerates `src/generated/flwr.proto.rs` from `proto/flwr/proto/*.proto`.
//!
//! Run through `scripts/gen-flower-proto.sh`, which supplies protoc (grpcio-tools in the pinned
//! Flower venv) through the `PROTOC` environment variable and formats the output.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto_root = crate_dir.join("proto");
    let mut protos: Vec<PathBuf> = std::fs::read_dir(proto_root.join("flwr/proto"))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    protos.retain(|p| p.extension().is_some_and(|ext| ext == "proto"));
    protos.sort();
    if protos.is_empty() {
        return Err(format!("no .proto files under {}", proto_root.display()).into());
    }
    let out_dir = crate_dir.join("src/generated");
    std::fs::create_dir_all(&out_dir)?;
    prost_build::Config::new()
        .out_dir(&out_dir)
        .compile_protos(&protos, &[proto_root])?;
    println!("wrote {}", out_dir.join("flwr.proto.rs").display());
    Ok(())
}
