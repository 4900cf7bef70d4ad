//! Helpers shared by the test modules: the shared data folder and a loopback HTTP server.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The read-only shared data folder (/work/shared/data).
pub fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data"))
}

pub fn mnist_dir() -> PathBuf {
    shared().join("mnist")
}

/// Runs `f` on another thread and fails the test if it takes longer than `secs`.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("timed out (or the closure panicked)")
}

/// How the test server misbehaves.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// Files whose served bytes have one byte flipped.
    pub corrupt: Vec<String>,
    /// Answer Range requests with 200 and the whole file.
    pub ignore_range: bool,
    /// On the first request for this file, send only this many body bytes and hang up.
    pub cut_first: Option<(String, usize)>,
    /// For this file, send 100 body bytes and then nothing for this long (a trickling mirror).
    pub stall: Option<(String, Duration)>,
}

/// One request the server received: path and Range header.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
}

pub struct Server {
    /// Base URL ending in '/'.
    pub base: String,
    pub log: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    pub fn requests(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

/// Starts a minimal HTTP/1.1 server on 127.0.0.1 serving `files` (name -> bytes) at `/name`.
pub fn serve(files: HashMap<String, Vec<u8>>, behaviour: Behaviour) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = Arc::clone(&log);
    let cut_done = Arc::new(Mutex::new(false));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let _ = handle(stream, &files, &behaviour, &log2, &cut_done);
        }
    });
    Server { base, log }
}

fn handle(
    mut stream: TcpStream,
    files: &HashMap<String, Vec<u8>>,
    b: &Behaviour,
    log: &Mutex<Vec<Seen>>,
    cut_done: &Mutex<bool>,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let path = first
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .trim_start_matches('/')
        .to_string();
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    log.lock().unwrap().push(Seen {
        path: path.clone(),
        range: range.clone(),
    });
    let Some(data) = files.get(&path) else {
        stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return Ok(());
    };
    let mut data = data.clone();
    if b.corrupt.contains(&path) {
        let mid = data.len() / 2;
        data[mid] ^= 0xff;
    }
    let start = range
        .as_deref()
        .filter(|_| !b.ignore_range)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    let total = data.len();
    let (status, body, extra) = match start {
        Some(s) if s >= total => {
            let h = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(h.as_bytes())?;
            return Ok(());
        }
        Some(s) => (
            "206 Partial Content",
            &data[s..],
            format!("Content-Range: bytes {s}-{}/{total}\r\n", total - 1),
        ),
        None => ("200 OK", &data[..], String::new()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    let mut cut = None;
    if let Some((name, n)) = &b.cut_first {
        let mut done = cut_done.lock().unwrap();
        if *name == path && !*done {
            *done = true;
            cut = Some((*n).min(body.len()));
        }
    }
    if let Some((name, pause)) = &b.stall
        && *name == path
    {
        stream.write_all(&body[..100.min(body.len())])?;
        stream.flush()?;
        std::thread::sleep(*pause);
        return Ok(());
    }
    match cut {
        Some(n) => {
            stream.write_all(&body[..n])?;
            stream.flush()?;
            stream.shutdown(std::net::Shutdown::Both)?;
        }
        None => stream.write_all(body)?,
    }
    Ok(())
}

/// The four MNIST files from the shared folder, by name.
pub fn mnist_files() -> HashMap<String, Vec<u8>> {
    let info = fedfuse_data::dataset_info("mnist").unwrap();
    info.files
        .iter()
        .map(|f| {
            (
                f.name.to_string(),
                std::fs::read(mnist_dir().join(f.name)).unwrap(),
            )
        })
        .collect()
}
