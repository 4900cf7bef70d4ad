//! A Flower SuperNode in Rust: joins a Flower SuperLink (flwr 1.41/1.42) over the Fleet API
//! (protobuf over HTTP, optionally TLS), pulls each message and the objects of its content,
//! runs it with a [`node::Handler`] and pushes the reply. Every request is signed with the
//! node's P-384 key, as Flower's own SuperNode signs them.
//!
//! - [`objects`]: Flower's content-addressed message objects, written and read.
//! - [`fleet`]: the HTTP client, its signing key and TLS.
//! - [`node`]: the node loop (heartbeat, TTL, error replies, reconnection).

pub mod fleet;
pub mod node;
pub mod objects;

/// What can go wrong on a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Nothing answered at the SuperLink's address (connection refused or timed out): not
    /// listening yet, or the wrong address.
    #[error("{rpc}: {reason}")]
    Unreachable {
        /// The Fleet call.
        rpc: String,
        /// Why.
        reason: String,
    },
    /// The SuperLink's reply could not be read, or the exchange broke off.
    #[error("{rpc}: {reason}")]
    Transport {
        /// The Fleet call.
        rpc: String,
        /// Why.
        reason: String,
    },
    /// The SuperLink's reply was larger than the call allows: refused, not a passing fault.
    #[error("{rpc}: the SuperLink's reply is larger than the {limit} bytes this call allows")]
    TooLarge {
        /// The Fleet call.
        rpc: String,
        /// The limit, in bytes.
        limit: u64,
    },
    /// The SuperLink refused a call.
    #[error("{rpc}: the SuperLink answered HTTP {status}{}: {detail}", code.map(|c| format!(" (Flower error {c})")).unwrap_or_default())]
    Status {
        /// The Fleet call.
        rpc: String,
        /// HTTP status.
        status: u16,
        /// Flower's error code, when the SuperLink sent one.
        code: Option<i64>,
        /// The SuperLink's explanation.
        detail: String,
    },
    /// The SuperLink will not let this node in; what to do is in the text.
    #[error("{0}")]
    Refused(String),
    /// A message's objects were malformed or incomplete.
    #[error("message objects: {0}")]
    Object(String),
    /// The node's key could not be made or read.
    #[error("node key: {0}")]
    Key(String),
    /// The node's key file could not be read.
    #[error("node key {}", path.display())]
    KeyFile {
        /// The file (`--auth-key`).
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA certificate could not be read.
    #[error("TLS: {0}")]
    Tls(String),
    /// The CA certificate file could not be read.
    #[error("TLS: CA certificate {}", path.display())]
    CaFile {
        /// The file (`--root-certificates`).
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The SuperLink's reply is not the protobuf message the call returns.
    #[error("{rpc}: undecodable reply")]
    Decode {
        /// The Fleet call.
        rpc: String,
        /// What the decoder said.
        #[source]
        source: prost::DecodeError,
    },
}

impl NodeError {
    /// Whether the exchange itself failed (nothing answered, or the connection broke off),
    /// so that the same call may succeed when tried again: the SuperLink did not refuse it.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::Transport { .. })
    }
}

/// Text a peer sent, fit for a log line or an error: at most 300 characters, with control
/// characters (newlines, terminal escapes) escaped, since a SuperLink's reply can be 64 MiB
/// of anything.
pub fn shown(text: &str) -> String {
    const MAX: usize = 300;
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == MAX {
            out.push_str(&format!("... ({} bytes in all)", text.len()));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, NodeError>;
