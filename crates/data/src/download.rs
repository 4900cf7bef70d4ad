//! Downloads with mirrors, resume, retries and sha256 verification.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};
use crate::registry::{DatasetInfo, RemoteFile, dataset_info};

/// Attempts per mirror (the first try plus retries) before moving on to the next mirror.
const ATTEMPTS_PER_MIRROR: u32 = 3;

/// Limits of one download beyond each file's own size bound ([`RemoteFile::max_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DownloadLimits {
    /// Time allowed for one file, every mirror and attempt included: a mirror that trickles
    /// bytes slowly enough to dodge the per-read timeout still ends.
    pub deadline: Duration,
}

impl Default for DownloadLimits {
    /// 30 minutes a file: CIFAR-10's 162 MiB at 100 kB/s.
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(30 * 60),
        }
    }
}

/// What [`download`] is doing, for progress bars and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DownloadEvent {
    /// The file is already present with the right checksum; nothing to do.
    Skipped {
        /// File name.
        file: String,
    },
    /// A request was sent; `offset > 0` means a partial `.part` file is being resumed.
    Started {
        /// File name.
        file: String,
        /// Full URL.
        url: String,
        /// Bytes already on disk that the server agreed to skip.
        offset: u64,
        /// Total file size, when the server said.
        total: Option<u64>,
    },
    /// Bytes of the file now on disk.
    Progress {
        /// File name.
        file: String,
        /// Bytes on disk so far, resumed bytes included.
        bytes: u64,
        /// Total file size, when the server said.
        total: Option<u64>,
    },
    /// An attempt failed; the download is retried or the next mirror tried.
    Failed {
        /// File name.
        file: String,
        /// Full URL.
        url: String,
        /// What went wrong.
        error: String,
    },
    /// The file was downloaded, verified and moved to its final name.
    Finished {
        /// File name.
        file: String,
    },
}

/// The state of one dataset file on disk, as reported by [`verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyStatus {
    /// Present with the expected sha256.
    Ok,
    /// Not there.
    Missing,
    /// Present but with another sha256.
    Mismatch {
        /// The sha256 actually found, lower-case hex.
        actual: String,
    },
}

/// The sha256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).map_err(|e| DataError::io("could not open", path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| DataError::io("could not read", path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks the files of dataset `name` in `dir` against their sha256 sums.
///
/// Bundled datasets (no files to download) give an empty list.
pub fn verify(name: &str, dir: &Path) -> Result<Vec<(String, VerifyStatus)>> {
    verify_files(dataset_info(name)?, dir)
}

/// Like [`verify`], for a [`DatasetInfo`].
pub fn verify_files(info: &DatasetInfo, dir: &Path) -> Result<Vec<(String, VerifyStatus)>> {
    info.files
        .iter()
        .map(|f| {
            let p = dir.join(f.name);
            let status = if !p.is_file() {
                VerifyStatus::Missing
            } else {
                let actual = sha256_file(&p)?;
                if actual.eq_ignore_ascii_case(f.sha256) {
                    VerifyStatus::Ok
                } else {
                    VerifyStatus::Mismatch { actual }
                }
            };
            Ok((f.name.to_string(), status))
        })
        .collect()
}

/// Downloads dataset `name` into `dest_dir` from its standard mirrors; see [`download_from`].
///
/// Bundled datasets (`digits`) need no download and return `Ok(())` at once.
pub fn download(
    name: &str,
    dest_dir: &Path,
    progress: &mut dyn FnMut(DownloadEvent),
) -> Result<()> {
    let info = dataset_info(name)?;
    if let Some(how) = crate::registry::how_to_get(name) {
        return Err(DataError::InvalidArgument {
            field: "dataset",
            msg: format!("`{name}` is not downloaded by fedfuse: {how}"),
        });
    }
    download_from(info, info.mirrors, dest_dir, progress)
}

/// Downloads the files of `info` into `dest_dir`, trying `mirrors` in order.
///
/// For each file: if it is present with the right sha256, it is skipped. Otherwise it is
/// downloaded to `<file>.part` (resuming an existing `.part` with an HTTP `Range` request, and
/// starting over if the server ignores the range), with a few attempts per mirror; the result
/// is checked against the sha256 and only then renamed to its final name, so a half or corrupt
/// file never sits under the final name. A download with the wrong sha256 is deleted and the
/// next mirror tried. If every mirror fails, the error names the file, the expected and the
/// last actual sha256, and what each attempt ran into.
///
/// `mirrors` are base URLs (`http://` or `https://`); the file's URL is the mirror followed by
/// the file name.
pub fn download_from(
    info: &DatasetInfo,
    mirrors: &[&str],
    dest_dir: &Path,
    progress: &mut dyn FnMut(DownloadEvent),
) -> Result<()> {
    download_with(info, mirrors, dest_dir, DownloadLimits::default(), progress)
}

/// [`download_from`] under the given `limits`.
pub fn download_with(
    info: &DatasetInfo,
    mirrors: &[&str],
    dest_dir: &Path,
    limits: DownloadLimits,
    progress: &mut dyn FnMut(DownloadEvent),
) -> Result<()> {
    if info.files.is_empty() {
        return Ok(());
    }
    if mirrors.is_empty() {
        return Err(DataError::InvalidArgument {
            field: "mirrors",
            msg: format!("no mirror URLs given to download {:?}", info.name),
        });
    }
    std::fs::create_dir_all(dest_dir)
        .map_err(|e| DataError::io("could not create", dest_dir, e))?;
    for file in info.files {
        download_file(file, mirrors, dest_dir, limits, progress)?;
    }
    Ok(())
}

/// Whether a URL's authority (`user@host:port`) names this machine: `localhost`, an IPv4
/// address in 127.0.0.0/8 or `[::1]`; never a name that merely starts like one
/// (`localhost.example.com`, `127.0.0.1.example.com`).
fn is_loopback(authority: &str) -> bool {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host_port.strip_prefix('[') {
        return v6
            .split_once(']')
            .and_then(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().ok())
            .is_some_and(|ip| ip.is_loopback());
    }
    let host = host_port.split_once(':').map_or(host_port, |(h, _)| h);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn agent_for(url: &str, remaining: Duration) -> ureq::Agent {
    let authority = url
        .split("://")
        .nth(1)
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("");
    let loopback = is_loopback(authority);
    let cfg = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .timeout_global(Some(remaining));
    // Never send loopback traffic to a proxy from the environment.
    let cfg = if loopback { cfg.proxy(None) } else { cfg };
    ureq::Agent::new_with_config(cfg.build())
}

fn download_file(
    file: &RemoteFile,
    mirrors: &[&str],
    dest: &Path,
    limits: DownloadLimits,
    progress: &mut dyn FnMut(DownloadEvent),
) -> Result<()> {
    let deadline = Instant::now() + limits.deadline;
    let name = file.name.to_string();
    let fin = dest.join(file.name);
    let part = dest.join(format!("{}.part", file.name));
    let matches =
        |p: &Path| -> Result<bool> { Ok(sha256_file(p)?.eq_ignore_ascii_case(file.sha256)) };
    if fin.is_file() && matches(&fin)? {
        progress(DownloadEvent::Skipped { file: name });
        return Ok(());
    }
    let finish = |progress: &mut dyn FnMut(DownloadEvent)| -> Result<()> {
        std::fs::rename(&part, &fin).map_err(|e| DataError::io("could not rename", &part, e))?;
        progress(DownloadEvent::Finished {
            file: file.name.to_string(),
        });
        Ok(())
    };
    // A complete .part left by an interrupted run only needs the rename.
    if part.is_file() && matches(&part)? {
        return finish(progress);
    }
    let mut attempts: Vec<String> = Vec::new();
    let mut last_actual: Option<String> = None;
    'mirrors: for mirror in mirrors {
        let sep = if mirror.ends_with('/') { "" } else { "/" };
        let url = format!("{mirror}{sep}{}", file.name);
        let mut attempt = 0;
        while attempt < ATTEMPTS_PER_MIRROR {
            attempt += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                attempts.push(format!(
                    "the deadline of {} s for this file passed",
                    limits.deadline.as_secs()
                ));
                break 'mirrors;
            }
            let agent = agent_for(&url, remaining);
            let mut fail = |progress: &mut dyn FnMut(DownloadEvent), error: String| {
                progress(DownloadEvent::Failed {
                    file: name.clone(),
                    url: url.clone(),
                    error: error.clone(),
                });
                attempts.push(format!("{url}: {error}"));
            };
            match fetch(&agent, &url, &part, (&name, file.max_bytes), progress) {
                Ok(resumed) => {
                    let actual = sha256_file(&part)?;
                    if actual.eq_ignore_ascii_case(file.sha256) {
                        return finish(progress);
                    }
                    remove_if_exists(&part)?;
                    fail(progress, format!("sha256 mismatch: got {actual}"));
                    last_actual = Some(actual);
                    // A resumed file may have been spoilt by a stale .part: retry this mirror
                    // from scratch once; a fresh download with a bad sum means a bad mirror.
                    if !resumed {
                        break;
                    }
                }
                Err(FetchError { msg, retry }) => {
                    fail(progress, msg);
                    if !retry {
                        break;
                    }
                    if attempt < ATTEMPTS_PER_MIRROR {
                        std::thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
                    }
                }
            }
        }
    }
    // Leave a partial download (never a corrupt complete one) for a later resume.
    Err(DataError::Download {
        file: name,
        dest: dest.to_path_buf(),
        expected: file.sha256.to_string(),
        actual: last_actual.map_or_else(
            || "no complete download".to_string(),
            |a| format!("got {a}"),
        ),
        attempts: attempts.join("; "),
    })
}

fn remove_if_exists(p: &Path) -> Result<()> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DataError::io("could not delete", p, e)),
    }
}

struct FetchError {
    msg: String,
    /// Whether trying the same URL again may help.
    retry: bool,
}

impl FetchError {
    fn retry(msg: impl Into<String>) -> Self {
        FetchError {
            msg: msg.into(),
            retry: true,
        }
    }
}

/// One HTTP request writing into `part` (appending when the server honours the range).
/// Returns whether the download resumed an existing partial file.
fn fetch(
    agent: &ureq::Agent,
    url: &str,
    part: &Path,
    (name, max_bytes): (&str, u64),
    progress: &mut dyn FnMut(DownloadEvent),
) -> std::result::Result<bool, FetchError> {
    let offset = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    let mut req = agent.get(url).header("Accept-Encoding", "identity");
    if offset > 0 {
        req = req.header("Range", format!("bytes={offset}-"));
    }
    let resp = req
        .call()
        .map_err(|e| FetchError::retry(format!("request failed: {e}")))?;
    let status = resp.status().as_u16();
    let header = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let length: Option<u64> = header("content-length").and_then(|v| v.trim().parse().ok());
    let resume = match status {
        206 if offset > 0 => {
            let start = header("content-range")
                .and_then(|v| v.trim().strip_prefix("bytes ").map(str::to_string))
                .and_then(|v| {
                    v.split('-')
                        .next()
                        .and_then(|s| s.trim().parse::<u64>().ok())
                });
            if start != Some(offset) {
                let _ = std::fs::remove_file(part);
                return Err(FetchError::retry(format!(
                    "server answered the resume request with an unexpected Content-Range {:?}; \
                     starting over",
                    header("content-range")
                )));
            }
            true
        }
        200 => false,
        416 => {
            let _ = std::fs::remove_file(part);
            return Err(FetchError::retry(
                "server refused to resume (HTTP 416); starting over",
            ));
        }
        s @ (400..=499) if s != 408 && s != 429 => {
            return Err(FetchError {
                msg: format!("HTTP {s}"),
                retry: false,
            });
        }
        s => return Err(FetchError::retry(format!("HTTP {s}"))),
    };
    let (start, total) = if resume {
        (offset, length.map(|l| l.saturating_add(offset)))
    } else {
        (0, length)
    };
    let too_big = |bytes: u64| FetchError {
        msg: format!(
            "the mirror sends {bytes} bytes or more, above the {max_bytes} this file can have; \
             a wrong or hostile mirror"
        ),
        retry: false,
    };
    if let Some(t) = total
        && t > max_bytes
    {
        let _ = std::fs::remove_file(part);
        return Err(too_big(t));
    }
    let mut out = if resume {
        OpenOptions::new().append(true).open(part)
    } else {
        File::create(part)
    }
    .map_err(|e| FetchError {
        msg: format!("could not write {}: {e}", part.display()),
        retry: false,
    })?;
    progress(DownloadEvent::Started {
        file: name.to_string(),
        url: url.to_string(),
        offset: start,
        total,
    });
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = start;
    let mut last_report = start;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(FetchError::retry(format!(
                    "connection broke after {bytes} bytes: {e}"
                )));
            }
        };
        if bytes + n as u64 > max_bytes {
            drop(out);
            let _ = std::fs::remove_file(part);
            return Err(too_big(bytes + n as u64));
        }
        out.write_all(&buf[..n]).map_err(|e| FetchError {
            msg: format!("could not write {}: {e}", part.display()),
            retry: false,
        })?;
        bytes += n as u64;
        if bytes - last_report >= 1 << 20 {
            last_report = bytes;
            progress(DownloadEvent::Progress {
                file: name.to_string(),
                bytes,
                total,
            });
        }
    }
    out.sync_all().map_err(|e| FetchError {
        msg: format!("could not write {}: {e}", part.display()),
        retry: false,
    })?;
    if let Some(t) = total
        && bytes != t
    {
        return Err(FetchError::retry(format!(
            "connection closed after {bytes} of {t} bytes"
        )));
    }
    progress(DownloadEvent::Progress {
        file: name.to_string(),
        bytes,
        total,
    });
    Ok(resume)
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn only_this_machine_counts_as_loopback() {
        for yes in [
            "localhost",
            "localhost:8080",
            "LocalHost:1",
            "127.0.0.1",
            "127.3.2.1:9",
            "[::1]",
            "[::1]:8000",
            "user:pw@127.0.0.1:80",
        ] {
            assert!(is_loopback(yes), "{yes}");
        }
        for no in [
            "localhost.example.com",
            "localhost.example.com:80",
            "127.0.0.1.example.com",
            "127.example.com",
            "[::2]",
            "10.0.0.1",
            "example.com@evil",
            "",
        ] {
            assert!(!is_loopback(no), "{no}");
        }
    }
}
