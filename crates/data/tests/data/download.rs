use std::collections::HashMap;

use fedfuse_data::{
    DatasetInfo, DownloadEvent, DownloadLimits, RemoteFile, VerifyStatus, dataset_info,
    download_from, download_with, sha256_file, verify,
};

use crate::common::{Behaviour, mnist_dir, mnist_files, serve, within};

/// An MNIST-like dataset made of some of MNIST's files (slices of a 'static list are 'static).
fn info_with(files: std::ops::Range<usize>) -> DatasetInfo {
    let m = dataset_info("mnist").unwrap();
    DatasetInfo {
        files: &m.files[files],
        ..*m
    }
}

fn run(
    info: DatasetInfo,
    mirrors: Vec<String>,
    dest: std::path::PathBuf,
) -> (fedfuse_data::Result<()>, Vec<DownloadEvent>) {
    within(60, move || {
        let mut events = Vec::new();
        let m: Vec<&str> = mirrors.iter().map(String::as_str).collect();
        let r = download_from(&info, &m, &dest, &mut |e| events.push(e));
        (r, events)
    })
}

#[test]
fn sums_in_registry_match_shared_files() {
    let sums = std::fs::read_to_string(mnist_dir().join("SHA256SUMS")).unwrap();
    for f in dataset_info("mnist").unwrap().files {
        assert!(
            sums.contains(&format!("{}  {}", f.sha256, f.name)),
            "{}",
            f.name
        );
    }
    let v = verify("mnist", &mnist_dir()).unwrap();
    assert!(v.iter().all(|(_, s)| *s == VerifyStatus::Ok), "{v:?}");
}

#[test]
fn downloads_mnist_from_loopback() {
    let server = serve(mnist_files(), Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let (r, events) = run(
        *dataset_info("mnist").unwrap(),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    let v = verify("mnist", dir.path()).unwrap();
    assert_eq!(v.len(), 4);
    assert!(v.iter().all(|(_, s)| *s == VerifyStatus::Ok), "{v:?}");
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, DownloadEvent::Finished { .. }))
            .count(),
        4
    );
    assert!(events.iter().any(|e| matches!(
        e,
        DownloadEvent::Progress {
            total: Some(9912422),
            ..
        }
    )));
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".part"))
    );
    // the files load
    let tt = fedfuse_data::load_dataset("mnist", Some(dir.path())).unwrap();
    assert_eq!(tt.test.len(), 10000);
    // a second run skips everything without a request
    let before = server.requests().len();
    let (r, events) = run(
        *dataset_info("mnist").unwrap(),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert!(
        events
            .iter()
            .all(|e| matches!(e, DownloadEvent::Skipped { .. })),
        "{events:?}"
    );
    assert_eq!(server.requests().len(), before);
}

#[test]
fn corrupt_file_fails_and_leaves_nothing_under_final_name() {
    let name = "t10k-labels-idx1-ubyte.gz";
    let server = serve(
        mnist_files(),
        Behaviour {
            corrupt: vec![name.into()],
            ..Behaviour::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let info = info_with(3..4);
    let (r, _) = run(info, vec![server.base.clone()], dir.path().to_path_buf());
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains(name), "{msg}");
    assert!(msg.contains(info.files[0].sha256), "{msg}");
    assert!(msg.contains("got "), "{msg}");
    assert!(!dir.path().join(name).exists());
    assert!(!dir.path().join(format!("{name}.part")).exists());
    // one fresh download per mirror: a bad sum is not retried on the same mirror
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn second_mirror_is_tried() {
    let bad = serve(
        mnist_files(),
        Behaviour {
            corrupt: vec!["t10k-labels-idx1-ubyte.gz".into()],
            ..Behaviour::default()
        },
    );
    let empty = serve(HashMap::new(), Behaviour::default()); // 404 for everything
    let good = serve(mnist_files(), Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let (r, events) = run(
        info_with(1..4),
        vec![bad.base.clone(), empty.base.clone(), good.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert!(
        verify("mnist", dir.path()).unwrap()[1..]
            .iter()
            .all(|(_, s)| *s == VerifyStatus::Ok)
    );
    // the corrupt file went on to the 404 mirror (one try: 404 is final) and then the good one
    assert_eq!(empty.requests().len(), 1);
    assert_eq!(good.requests().len(), 1);
    assert!(events.iter().any(
        |e| matches!(e, DownloadEvent::Failed { error, .. } if error.contains("sha256 mismatch"))
    ));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, DownloadEvent::Failed { error, .. } if error.contains("404")))
    );
}

#[test]
fn resumes_from_part_file() {
    let name = "t10k-images-idx3-ubyte.gz";
    let full = std::fs::read(mnist_dir().join(name)).unwrap();
    let half = full.len() / 2;
    let server = serve(mnist_files(), Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{name}.part")), &full[..half]).unwrap();
    let (r, events) = run(
        info_with(2..3),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), full);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].path, name);
    assert_eq!(
        reqs[0].range.as_deref(),
        Some(format!("bytes={half}-").as_str())
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, DownloadEvent::Started { offset, .. } if *offset == half as u64))
    );
}

#[test]
fn server_ignoring_range_gives_full_download() {
    let name = "t10k-images-idx3-ubyte.gz";
    let full = std::fs::read(mnist_dir().join(name)).unwrap();
    let server = serve(
        mnist_files(),
        Behaviour {
            ignore_range: true,
            ..Behaviour::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{name}.part")), &full[..1000]).unwrap();
    let (r, _) = run(
        info_with(2..3),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert_eq!(
        sha256_file(&dir.path().join(name)).unwrap(),
        info_with(2..3).files[0].sha256
    );
    assert!(server.requests()[0].range.is_some());
}

#[test]
fn broken_connection_is_retried_and_resumed() {
    let name = "t10k-images-idx3-ubyte.gz";
    let server = serve(
        mnist_files(),
        Behaviour {
            cut_first: Some((name.into(), 300_000)),
            ..Behaviour::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let (r, events) = run(
        info_with(2..3),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, DownloadEvent::Failed { .. })),
        "{events:?}"
    );
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert_eq!(reqs[1].range.as_deref(), Some("bytes=300000-"));
    assert_eq!(verify("mnist", dir.path()).unwrap()[2].1, VerifyStatus::Ok);
}

#[test]
fn stale_corrupt_part_is_replaced() {
    let name = "t10k-labels-idx1-ubyte.gz";
    let server = serve(mnist_files(), Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(format!("{name}.part")), vec![0u8; 1000]).unwrap();
    let (r, _) = run(
        info_with(3..4),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    r.unwrap();
    assert_eq!(verify("mnist", dir.path()).unwrap()[3].1, VerifyStatus::Ok);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs[0].range.is_some() && reqs[1].range.is_none(),
        "{reqs:?}"
    );
}

#[test]
fn verify_reports_missing_and_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train-labels-idx1-ubyte.gz"), b"junk").unwrap();
    let v = verify("mnist", dir.path()).unwrap();
    assert_eq!(v[0].1, VerifyStatus::Missing);
    assert!(matches!(&v[1].1, VerifyStatus::Mismatch { actual } if actual.len() == 64));
    assert!(verify("digits", dir.path()).unwrap().is_empty());
    assert!(verify("nope", dir.path()).is_err());
}

/// MNIST's small test-label file under a size bound of `max_bytes`.
fn labels_bounded(max_bytes: u64) -> DatasetInfo {
    let m = dataset_info("mnist").unwrap();
    let real = m.files[3];
    let files: &'static [RemoteFile] = Box::leak(Box::new([RemoteFile { max_bytes, ..real }]));
    DatasetInfo { files, ..*m }
}

#[test]
fn a_mirror_sending_more_than_the_file_can_have_is_cut_off() {
    // The real file is 4,542 bytes; a bound of 1,000 makes the honest server an oversized one.
    let server = serve(mnist_files(), Behaviour::default());
    let dir = tempfile::tempdir().unwrap();
    let (r, _) = run(
        labels_bounded(1000),
        vec![server.base.clone()],
        dir.path().to_path_buf(),
    );
    let e = r.unwrap_err().to_string();
    assert!(e.contains("above the 1000 this file can have"), "{e}");
    // Not retried, and nothing left on disk.
    assert_eq!(server.requests().len(), 1);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_trickling_mirror_ends_at_the_deadline() {
    let name = dataset_info("mnist").unwrap().files[3].name.to_string();
    let server = serve(
        mnist_files(),
        Behaviour {
            stall: Some((name, std::time::Duration::from_secs(20))),
            ..Behaviour::default()
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().to_path_buf();
    let base = server.base.clone();
    let started = std::time::Instant::now();
    let r = within(15, move || {
        let limits = DownloadLimits {
            deadline: std::time::Duration::from_secs(2),
        };
        download_with(
            &labels_bounded(1 << 20),
            &[&base],
            &dest,
            limits,
            &mut |_| {},
        )
    });
    let e = r.unwrap_err().to_string();
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
    assert!(e.contains("deadline") || e.contains("imeout"), "{e}");
}
