//! Flower's Fleet API over HTTP: `POST /v1/fleet/<rpc>` with a protobuf body, every request
//! signed with the node's P-384 key (`flwr-public-key`, `flwr-timestamp`, `flwr-signature`),
//! TLS through rustls with the given CA.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use p384::ecdsa::signature::hazmat::PrehashSigner;
use p384::ecdsa::{Signature, SigningKey};
use p384::pkcs8::{DecodePrivateKey, EncodePublicKey, LineEnding};
use prost::Message;
use sha2::{Digest, Sha256};

use crate::{NodeError, Result};

/// Largest reply body read from the SuperLink (one object chunk plus framing, or a message
/// list): replies past it are refused before they are buffered.
pub const MAX_REPLY: u64 = 64 << 20;

/// The node's identity: a P-384 key whose public half (PEM SubjectPublicKeyInfo) the
/// SuperLink knows the node by.
pub struct NodeKey {
    key: SigningKey,
    public_pem: Vec<u8>,
}

impl NodeKey {
    /// A fresh key, as a Python SuperNode draws when it registers itself.
    pub fn generate() -> Result<Self> {
        let mut bytes = [0u8; 48];
        loop {
            getrandom::fill(&mut bytes).map_err(|e| NodeError::Key(e.to_string()))?;
            // Almost every 48-byte string is a valid scalar; retry the rare one that is not.
            if let Ok(key) = SigningKey::from_slice(&bytes) {
                return Self::from_key(key);
            }
        }
    }

    /// The key in a PKCS#8 PEM file (`openssl genpkey -algorithm EC -pkeyopt
    /// ec_paramgen_curve:P-384`).
    pub fn from_pem_file(path: &Path) -> Result<Self> {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| NodeError::Key(format!("{}: {e}", path.display())))?;
        let key = SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
            NodeError::Key(format!(
                "{}: not a PKCS#8 PEM P-384 private key ({e})",
                path.display()
            ))
        })?;
        Self::from_key(key)
    }

    fn from_key(key: SigningKey) -> Result<Self> {
        let public_pem = key
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .map_err(|e| NodeError::Key(e.to_string()))?
            .into_bytes();
        Ok(Self { key, public_pem })
    }

    /// The public key as the SuperLink stores it.
    pub fn public_pem(&self) -> &[u8] {
        &self.public_pem
    }

    /// ECDSA over SHA-256 of `message`, DER-encoded (what Flower verifies).
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>> {
        let digest = Sha256::digest(message);
        let sig: Signature = self
            .key
            .sign_prehash(&digest)
            .map_err(|e| NodeError::Key(e.to_string()))?;
        Ok(sig.to_der().as_bytes().to_vec())
    }
}

/// Flower's timestamp: Python's `datetime.now(timezone.utc).isoformat()`.
fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.microsecond()
    )
}

/// How to reach the SuperLink.
#[derive(Clone, Debug)]
pub struct Connection {
    /// `HOST:PORT`.
    pub superlink: String,
    /// Plain HTTP (loopback tests); otherwise HTTPS.
    pub insecure: bool,
    /// PEM file of the CA that signed the SuperLink's certificate (HTTPS).
    pub root_certificates: Option<std::path::PathBuf>,
}

/// A Fleet API client.
pub struct Fleet {
    agent: ureq::Agent,
    base: String,
    key: NodeKey,
}

impl Fleet {
    /// A client of `conn` that signs with `key`.
    pub fn new(conn: &Connection, key: NodeKey) -> Result<Self> {
        let mut cfg = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(120)))
            .proxy(None);
        if let Some(ca) = &conn.root_certificates {
            let pem =
                std::fs::read(ca).map_err(|e| NodeError::Tls(format!("{}: {e}", ca.display())))?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| NodeError::Tls(format!("{}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(NodeError::Tls(format!(
                    "{}: no certificate in the file",
                    ca.display()
                )));
            }
            cfg = cfg.tls_config(
                ureq::tls::TlsConfig::builder()
                    .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
                    .build(),
            );
        }
        let scheme = if conn.insecure { "http" } else { "https" };
        Ok(Self {
            agent: ureq::Agent::new_with_config(cfg.build()),
            base: format!("{scheme}://{}/v1/fleet", conn.superlink),
            key,
        })
    }

    /// The node's key.
    pub fn key(&self) -> &NodeKey {
        &self.key
    }

    /// Calls `rpc` (kebab-case, e.g. `pull-messages`) with `request`.
    pub fn call<Req: Message, Resp: Message + Default>(
        &self,
        rpc: &str,
        request: &Req,
    ) -> Result<Resp> {
        let stamp = timestamp();
        let signature = self.key.sign(stamp.as_bytes())?;
        let url = format!("{}/{rpc}", self.base);
        let response = self
            .agent
            .post(&url)
            .header("content-type", "application/protobuf")
            .header("accept", "application/protobuf")
            .header("flwr-public-key", B64.encode(self.key.public_pem()))
            .header("flwr-timestamp", &stamp)
            .header("flwr-signature", B64.encode(signature))
            .send(&request.encode_to_vec()[..])
            .map_err(|e| NodeError::Transport {
                rpc: rpc.to_string(),
                reason: e.to_string(),
            })?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .with_config()
            .limit(MAX_REPLY)
            .read_to_vec()
            .map_err(|e| NodeError::Transport {
                rpc: rpc.to_string(),
                reason: e.to_string(),
            })?;
        if status != 200 {
            return Err(NodeError::Status {
                rpc: rpc.to_string(),
                status,
                detail: String::from_utf8_lossy(&body[..body.len().min(2000)]).into_owned(),
            });
        }
        Resp::decode(body.as_slice()).map_err(|e| NodeError::Transport {
            rpc: rpc.to_string(),
            reason: format!("undecodable reply: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p384::ecdsa::VerifyingKey;
    use p384::ecdsa::signature::hazmat::PrehashVerifier;
    use p384::pkcs8::DecodePublicKey;

    #[test]
    fn signatures_verify_against_the_published_key() {
        let key = NodeKey::generate().unwrap();
        let pem = std::str::from_utf8(key.public_pem()).unwrap();
        assert!(pem.starts_with("-----BEGIN PUBLIC KEY-----"), "{pem}");
        let stamp = timestamp();
        let der = key.sign(stamp.as_bytes()).unwrap();
        let verifier = VerifyingKey::from_public_key_pem(pem).unwrap();
        let sig = Signature::from_der(&der).unwrap();
        let digest = Sha256::digest(stamp.as_bytes());
        assert!(verifier.verify_prehash(&digest, &sig).is_ok());
        assert!(
            verifier
                .verify_prehash(&Sha256::digest(b"other"), &sig)
                .is_err()
        );
    }

    #[test]
    fn timestamps_look_like_pythons_isoformat() {
        let t = timestamp();
        // 2026-11-23T22:48:22.123456+00:00
        assert_eq!(t.len(), 32, "{t}");
        assert!(t.ends_with("+00:00") && t.as_bytes()[10] == b'T', "{t}");
    }
}
