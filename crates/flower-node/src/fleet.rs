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
use ssh_key::private::{EcdsaKeypair, KeypairData};

use crate::{NodeError, Result};

/// Largest reply body read from the SuperLink, for an object pull (one object chunk plus
/// framing): replies past it are refused before they are buffered.
pub const MAX_REPLY: u64 = 64 << 20;
/// Largest `pull-messages` reply: a message's metadata and object tree (about 100 bytes an
/// object). Protobuf turns each 2-byte empty entry into a struct of a hundred bytes or more,
/// so this limit, not the object pulls', bounds what a hostile reply can inflate to.
pub const MAX_MESSAGES_REPLY: u64 = 16 << 20;
/// Largest reply of every other call (register, heartbeat, push confirmations).
pub const MAX_SMALL_REPLY: u64 = 1 << 20;

/// The most bytes `rpc`'s reply may have.
fn reply_limit(rpc: &str) -> u64 {
    match rpc {
        "pull-object" => MAX_REPLY,
        "pull-messages" => MAX_MESSAGES_REPLY,
        _ => MAX_SMALL_REPLY,
    }
}

const OPENSSH_BEGIN: &str = "-----BEGIN OPENSSH PRIVATE KEY-----";
const OPENSSH_END: &str = "-----END OPENSSH PRIVATE KEY-----";

/// Refuses a private key file that its group or others may read, as OpenSSH does: anyone
/// who can read it can act as the node.
#[cfg(unix)]
fn refuse_shared_key(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|source| NodeError::KeyFile {
            path: path.to_path_buf(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(NodeError::Key(format!(
            "{}: the private key is readable by others (mode {:o}); run `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn refuse_shared_key(_: &Path) -> Result<()> {
    Ok(())
}

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

    /// The key in a file: OpenSSH format, as Flower's docs make node keys
    /// (`ssh-keygen -t ecdsa -b 384 -N "" -f KEY`), or PKCS#8 PEM (`openssl genpkey
    /// -algorithm EC -pkeyopt ec_paramgen_curve:P-384`).
    pub fn from_file(path: &Path) -> Result<Self> {
        refuse_shared_key(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| NodeError::KeyFile {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |why: String| NodeError::Key(format!("{}: {why}", path.display()));
        if let Some(body) = text
            .split_once(OPENSSH_BEGIN)
            .and_then(|(_, rest)| rest.split_once(OPENSSH_END))
            .map(|(body, _)| body)
        {
            // ssh-keygen wraps the base64 at 70 columns, Python's `cryptography` at 64; the
            // PEM reader takes only the first, so the body is decoded here.
            let body: String = body.split_whitespace().collect();
            let bytes = B64
                .decode(body)
                .map_err(|e| bad(format!("not a readable OpenSSH private key ({e})")))?;
            let keypair = match ssh_key::PrivateKey::from_bytes(&bytes) {
                Ok(key) if key.is_encrypted() => return Err(bad(ENCRYPTED.into())),
                Ok(key) => key.key_data().clone(),
                Err(_) => openssh_keypair(&bytes)
                    .map_err(|e| bad(format!("not a readable OpenSSH private key ({e})")))?,
            };
            let KeypairData::Ecdsa(EcdsaKeypair::NistP384 { private, .. }) = &keypair else {
                let kind = keypair
                    .algorithm()
                    .map_or_else(|_| "an unknown".into(), |a| format!("a {a}"));
                return Err(bad(format!(
                    "{kind} key; Flower node keys are ECDSA P-384 (ssh-keygen -t ecdsa -b 384)"
                )));
            };
            let key = SigningKey::from_slice(private.as_slice())
                .map_err(|e| bad(format!("not a valid P-384 scalar ({e})")))?;
            return Self::from_key(key);
        }
        let key = SigningKey::from_pkcs8_pem(&text).map_err(|e| {
            bad(format!(
                "neither an OpenSSH nor a PKCS#8 PEM P-384 private key ({e})"
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

const ENCRYPTED: &str = "the key is passphrase-protected; the node reads unencrypted keys \
                         (ssh-keygen -p -N \"\" -f KEY removes the passphrase)";

/// The key pair of an unencrypted OpenSSH private key, read envelope by envelope. ssh-key 0.6
/// refuses a whole block of padding after the comment, which Python's `cryptography` writes
/// and OpenSSH reads; the envelope is simple, the key pair itself is ssh-key's to decode.
fn openssh_keypair(bytes: &[u8]) -> std::result::Result<KeypairData, String> {
    use ssh_encoding::Decode as Ssh;
    let fail = |e: ssh_encoding::Error| e.to_string();
    let mut r = bytes
        .strip_prefix(b"openssh-key-v1\0")
        .ok_or("no openssh-key-v1 header")?;
    let cipher = <String as Ssh>::decode(&mut r).map_err(fail)?;
    if cipher != "none" {
        return Err(ENCRYPTED.into());
    }
    let _kdf = <String as Ssh>::decode(&mut r).map_err(fail)?;
    let _kdf_options = <Vec<u8> as Ssh>::decode(&mut r).map_err(fail)?;
    let keys = <u32 as Ssh>::decode(&mut r).map_err(fail)?;
    if keys != 1 {
        return Err(format!(
            "{keys} keys in one file; a node key file holds one"
        ));
    }
    let _public = <Vec<u8> as Ssh>::decode(&mut r).map_err(fail)?;
    let private = <Vec<u8> as Ssh>::decode(&mut r).map_err(fail)?;
    let mut p = private.as_slice();
    let (check1, check2) = (
        <u32 as Ssh>::decode(&mut p).map_err(fail)?,
        <u32 as Ssh>::decode(&mut p).map_err(fail)?,
    );
    if check1 != check2 {
        return Err("its check numbers differ (a damaged or encrypted key)".into());
    }
    <KeypairData as Ssh>::decode(&mut p).map_err(|e| e.to_string())
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
            // A redirect would turn the signed POST into a GET to anywhere, plain HTTP
            // included, carrying the node's signature headers: none is followed.
            .max_redirects(0)
            .proxy(None);
        if let Some(ca) = &conn.root_certificates {
            let pem = std::fs::read(ca).map_err(|source| NodeError::CaFile {
                path: ca.clone(),
                source,
            })?;
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
            .map_err(|e| {
                let rpc = rpc.to_string();
                let reason = e.to_string();
                if is_unreachable(&e) {
                    NodeError::Unreachable { rpc, reason }
                } else {
                    NodeError::Transport { rpc, reason }
                }
            })?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .with_config()
            .limit(reply_limit(rpc))
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(limit) => NodeError::TooLarge {
                    rpc: rpc.to_string(),
                    limit,
                },
                e => NodeError::Transport {
                    rpc: rpc.to_string(),
                    reason: e.to_string(),
                },
            })?;
        if status != 200 {
            let (code, detail) = explain(&body);
            return Err(NodeError::Status {
                rpc: rpc.to_string(),
                status,
                code,
                detail,
            });
        }
        Resp::decode(body.as_slice()).map_err(|source| NodeError::Decode {
            rpc: rpc.to_string(),
            source,
        })
    }
}

/// Whether `e` says nothing answered at the address, as opposed to a broken exchange: a
/// SuperLink that is still starting (or a wrong port) refuses the connection.
fn is_unreachable(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset | ErrorKind::NotConnected
        ),
        ureq::Error::ConnectionFailed | ureq::Error::Timeout(ureq::Timeout::Connect) => true,
        _ => false,
    }
}

/// The SuperLink's explanation of a refusal: Flower's JSON error (`code`, `detail`) when it
/// sent one, else the start of the body.
fn explain(body: &[u8]) -> (Option<i64>, String) {
    #[derive(serde::Deserialize)]
    struct FlowerError {
        code: Option<i64>,
        detail: Option<String>,
    }
    match serde_json::from_slice::<FlowerError>(body) {
        Ok(FlowerError {
            code,
            detail: Some(detail),
        }) => (code, crate::shown(&detail)),
        _ => (
            None,
            crate::shown(&String::from_utf8_lossy(&body[..body.len().min(2000)])),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedfuse_flower_proto::flwr::proto;
    use p384::ecdsa::VerifyingKey;
    use p384::ecdsa::signature::hazmat::PrehashVerifier;
    use p384::pkcs8::DecodePublicKey;

    /// A one-connection HTTP server on 127.0.0.1 that answers the first request with
    /// `response`; returns its address.
    fn answering(response: Vec<u8>) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            if let Ok((mut stream, _)) = listener.accept() {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(&response);
            }
        });
        addr
    }

    /// An HTTP 200 reply carrying `body` as protobuf.
    fn ok_response(body: &[u8]) -> Vec<u8> {
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/protobuf\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(body);
        response
    }

    fn fleet_at(addr: String) -> Fleet {
        let conn = Connection {
            superlink: addr,
            insecure: true,
            root_certificates: None,
        };
        Fleet::new(&conn, NodeKey::generate().unwrap()).unwrap()
    }

    #[test]
    fn redirects_are_not_followed() {
        // Followed, the signed POST would go as a GET to wherever Location points.
        let addr = answering(
            b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/steal\r\nContent-Length: 0\r\n\r\n"
                .to_vec(),
        );
        let e = fleet_at(addr)
            .call::<_, proto::SendNodeHeartbeatResponse>(
                "send-node-heartbeat",
                &proto::SendNodeHeartbeatRequest::default(),
            )
            .err()
            .unwrap();
        assert!(matches!(e, NodeError::Status { status: 302, .. }), "{e}");
    }

    /// The chain of an error's messages, as the binary prints it.
    fn chain(e: &NodeError) -> String {
        let mut text = e.to_string();
        let mut next = std::error::Error::source(e);
        while let Some(s) = next {
            text += &format!(": {s}");
            next = s.source();
        }
        text
    }

    #[test]
    fn a_reply_that_is_not_the_calls_message_keeps_the_decoders_error() {
        let e = fleet_at(answering(ok_response(b"\xff\xff\xff")))
            .call::<_, proto::SendNodeHeartbeatResponse>(
                "send-node-heartbeat",
                &proto::SendNodeHeartbeatRequest::default(),
            )
            .err()
            .unwrap();
        assert!(matches!(e, NodeError::Decode { .. }), "{e:?}");
        let text = chain(&e);
        assert!(
            text.starts_with("send-node-heartbeat: undecodable reply: ") && text.len() > 40,
            "{text}"
        );
    }

    #[test]
    fn missing_key_and_ca_files_are_named_with_the_os_error() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("no-such-key");
        let e = NodeKey::from_file(&key).err().unwrap();
        assert!(matches!(e, NodeError::KeyFile { .. }), "{e:?}");
        let text = chain(&e);
        assert!(
            text.starts_with(&format!("node key {}: ", key.display()))
                && text.contains("No such file"),
            "{text}"
        );
        let ca = dir.path().join("no-such-ca.pem");
        let conn = Connection {
            superlink: "127.0.0.1:9".into(),
            insecure: false,
            root_certificates: Some(ca.clone()),
        };
        let e = Fleet::new(&conn, NodeKey::generate().unwrap())
            .err()
            .unwrap();
        assert!(matches!(e, NodeError::CaFile { .. }), "{e:?}");
        assert!(
            chain(&e).starts_with(&format!("TLS: CA certificate {}: ", ca.display())),
            "{}",
            chain(&e)
        );
    }

    #[test]
    fn a_small_call_refuses_a_large_reply() {
        // A valid heartbeat reply padded with 2 MiB of an unknown field (which protobuf
        // skips): fine for a 64 MiB limit, refused by the heartbeat's own.
        let mut body = proto::SendNodeHeartbeatResponse { success: true }.encode_to_vec();
        let pad = vec![0u8; 2 << 20];
        prost::encoding::bytes::encode(99, &pad, &mut body);
        let e = fleet_at(answering(ok_response(&body)))
            .call::<_, proto::SendNodeHeartbeatResponse>(
                "send-node-heartbeat",
                &proto::SendNodeHeartbeatRequest::default(),
            )
            .err()
            .unwrap();
        // Refused as such, not as a broken exchange that a retry might mend.
        assert!(
            matches!(
                e,
                NodeError::TooLarge {
                    limit: MAX_SMALL_REPLY,
                    ..
                }
            ),
            "{e}"
        );
        assert!(!e.is_transient());
        assert_eq!(reply_limit("send-node-heartbeat"), MAX_SMALL_REPLY);
        assert_eq!(reply_limit("pull-object"), MAX_REPLY);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node-key");
        std::fs::write(&path, OPENSSH_P384).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = NodeKey::from_file(&path).err().unwrap().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(NodeKey::from_file(&path).is_ok());
    }

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

    /// `ssh-keygen -q -t ecdsa -b 384 -N "" -C test` (a throwaway test key).
    const OPENSSH_P384: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAiAAAABNlY2RzYS\n1zaGEyLW5pc3RwMzg0AAAACG5pc3RwMzg0AAAAYQTeekvITSMGf2b2sQi3nknx2uZ4Ydd2\niboT1yXe2vcyi8SHyRdAPsFMdcUrnJEOf9P3la3zRZG6ZVbyd9ZRSOmW0lVPX9MNMBjcp+\nPyX5RapN6Gm8qqy3+NtoXizR4Xle8AAADQrMWyfqzFsn4AAAATZWNkc2Etc2hhMi1uaXN0\ncDM4NAAAAAhuaXN0cDM4NAAAAGEE3npLyE0jBn9m9rEIt55J8drmeGHXdom6E9cl3tr3Mo\nvEh8kXQD7BTHXFK5yRDn/T95Wt80WRumVW8nfWUUjpltJVT1/TDTAY3Kfj8l+UWqTehpvK\nqst/jbaF4s0eF5XvAAAAMQDoZUpLmOve5P8uR7ds8mVpoU6ZtNoBMwfvfRnM4ZOjoiqmq4\nMhOvRmLtWH83IizmMAAAAEdGVzdAECAw==\n-----END OPENSSH PRIVATE KEY-----\n";
    /// Its public half as `ssh-keygen -e -m PKCS8` prints it.
    const OPENSSH_P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAE3npLyE0jBn9m9rEIt55J8drmeGHXdom6\nE9cl3tr3MovEh8kXQD7BTHXFK5yRDn/T95Wt80WRumVW8nfWUUjpltJVT1/TDTAY\n3Kfj8l+UWqTehpvKqst/jbaF4s0eF5Xv\n-----END PUBLIC KEY-----\n";
    /// `ssh-keygen -q -t ecdsa -b 256 -N "" -C test`: the wrong curve for Flower.
    const OPENSSH_P256: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAaAAAABNlY2RzYS\n1zaGEyLW5pc3RwMjU2AAAACG5pc3RwMjU2AAAAQQTpoTvb2fPwkg3/S/gw6h8DtVWCeJv/\nSpf+JhyQh1BmfcncWmkvQK1us4YcItjp8qsq81UUDcsO39m74ip8GE57AAAAoGqC929qgv\ndvAAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBOmhO9vZ8/CSDf9L\n+DDqHwO1VYJ4m/9Kl/4mHJCHUGZ9ydxaaS9ArW6zhhwi2OnyqyrzVRQNyw7f2bviKnwYTn\nsAAAAgeRCHWNz3yLavv6/mWsS+1NqSrXULB6i7q6pES2HBAUoAAAAEdGVzdAECAwQ=\n-----END OPENSSH PRIVATE KEY-----\n";

    /// What Python's `cryptography` writes for a P-384 key in OpenSSH format (64 columns,
    /// a whole block of padding), and its public half from `ssh-keygen -y | ssh-keygen -e -m
    /// PKCS8`.
    const CRYPTOGRAPHY_P384: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAiAAAABNl\nY2RzYS1zaGEyLW5pc3RwMzg0AAAACG5pc3RwMzg0AAAAYQTLQdl1nfyJz7VFhTvn\n1D7qS2acVsEeP6Tv39UmWI5WV129qOtso7/gc0g44SSRmrSMm9Lb149BzK7zD7Au\nQWGGDT/F1scKKTGeMOSlGJb2Zz5vioMUh7lskO2ewcljaBoAAADQ+QR3NPkEdzQA\nAAATZWNkc2Etc2hhMi1uaXN0cDM4NAAAAAhuaXN0cDM4NAAAAGEEy0HZdZ38ic+1\nRYU759Q+6ktmnFbBHj+k79/VJliOVlddvajrbKO/4HNIOOEkkZq0jJvS29ePQcyu\n8w+wLkFhhg0/xdbHCikxnjDkpRiW9mc+b4qDFIe5bJDtnsHJY2gaAAAAMElfdtDC\nFMnM6VaISDmq9+gsrdN77SL1avz3IB09/f85GmvbdjHzVjMzOZnWoPsFUQAAAAAB\nAgMEBQYHCA==\n-----END OPENSSH PRIVATE KEY-----\n";
    const CRYPTOGRAPHY_P384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEy0HZdZ38ic+1RYU759Q+6ktmnFbBHj+k\n79/VJliOVlddvajrbKO/4HNIOOEkkZq0jJvS29ePQcyu8w+wLkFhhg0/xdbHCikx\nnjDkpRiW9mc+b4qDFIe5bJDtnsHJY2ga\n-----END PUBLIC KEY-----\n";

    /// Writes `text` to `fedfuse-NAME` in `dir`, which the test holds and removes.
    fn key_file(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.path().join(format!("fedfuse-{name}"));
        std::fs::write(&path, text).unwrap();
        // As ssh-keygen leaves a private key: the node refuses one others can read.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        path
    }

    #[test]
    fn openssh_keys_are_read_with_the_public_half_ssh_keygen_derives() {
        let dir = tempfile::tempdir().unwrap();
        let key = NodeKey::from_file(&key_file(&dir, "p384", OPENSSH_P384)).unwrap();
        assert_eq!(
            std::str::from_utf8(key.public_pem()).unwrap(),
            OPENSSH_P384_PUBLIC
        );
        // The same key wrapped at 64 columns, as Python's `cryptography` writes it.
        let body: String = OPENSSH_P384
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let wrapped: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let rewrapped = format!("{OPENSSH_BEGIN}\n{}\n{OPENSSH_END}\n", wrapped.join("\n"));
        let key = NodeKey::from_file(&key_file(&dir, "p384-64", &rewrapped)).unwrap();
        assert_eq!(
            std::str::from_utf8(key.public_pem()).unwrap(),
            OPENSSH_P384_PUBLIC
        );
        let key = NodeKey::from_file(&key_file(&dir, "cryptography", CRYPTOGRAPHY_P384)).unwrap();
        assert_eq!(
            std::str::from_utf8(key.public_pem()).unwrap(),
            CRYPTOGRAPHY_P384_PUBLIC
        );
        let e = NodeKey::from_file(&key_file(&dir, "p256", OPENSSH_P256))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("ecdsa-sha2-nistp256") && e.contains("P-384"),
            "{e}"
        );
        let e = NodeKey::from_file(&key_file(&dir, "junk", "not a key"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("fedfuse-") && e.contains("PKCS#8"), "{e}");
    }

    #[test]
    fn flower_errors_are_read_from_their_json() {
        assert_eq!(
            explain(br#"{"code": 2004, "detail": "Node activation failed"}"#),
            (Some(2004), "Node activation failed".to_string())
        );
        assert_eq!(explain(b"Bad Gateway"), (None, "Bad Gateway".to_string()));
    }

    #[test]
    fn timestamps_look_like_pythons_isoformat() {
        let t = timestamp();
        // 2026-11-23T22:48:22.123456+00:00
        assert_eq!(t.len(), 32, "{t}");
        assert!(t.ends_with("+00:00") && t.as_bytes()[10] == b'T', "{t}");
    }
}
