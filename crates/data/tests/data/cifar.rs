use std::io::Write;

use fedfuse_data::{load_dataset, read_cifar10_batch};

fn batch(n: usize, seed: u8) -> (Vec<u8>, Vec<u32>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut y = Vec::new();
    let mut x = Vec::new();
    for i in 0..n {
        let label = (i as u8 + seed) % 10;
        bytes.push(label);
        y.push(u32::from(label));
        for j in 0..3072usize {
            let v = ((i * 31 + j * 7 + seed as usize) % 256) as u8;
            bytes.push(v);
            x.push(f32::from(v) / 255.0);
        }
    }
    (bytes, y, x)
}

#[test]
fn batches_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    for (name, n, seed) in [("data_batch_1.bin", 3, 0u8), ("test_batch.bin", 2, 5)] {
        let (bytes, y, x) = batch(n, seed);
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        let ds = read_cifar10_batch(&p).unwrap();
        assert_eq!(ds.sample_shape, vec![3, 32, 32]);
        assert_eq!(ds.num_classes, 10);
        assert_eq!(ds.y, y);
        assert_eq!(ds.x, x);
    }
}

#[test]
fn wrong_size_and_bad_label() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("short_batch.bin");
    std::fs::write(&p, vec![0u8; 3073 + 100]).unwrap();
    let e = read_cifar10_batch(&p).unwrap_err().to_string();
    assert!(e.contains("short_batch.bin") && e.contains("3073"), "{e}");
    let mut rec = vec![0u8; 3073];
    rec[0] = 42;
    std::fs::write(&p, rec).unwrap();
    assert!(
        read_cifar10_batch(&p)
            .unwrap_err()
            .to_string()
            .contains("label 42")
    );
}

fn tar_entry(name: &str, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    h[156] = b'0';
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

#[test]
fn load_from_archive_and_folder() {
    let names = [
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
        "test_batch.bin",
    ];
    let mut tar = Vec::new();
    for (i, n) in names.iter().enumerate() {
        tar.extend(tar_entry(
            &format!("cifar-10-batches-bin/{n}"),
            &batch(2, i as u8).0,
        ));
    }
    tar.extend(tar_entry("cifar-10-batches-bin/readme.html", b"<html/>"));
    tar.extend([0u8; 1024]);
    let dir = tempfile::tempdir().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    std::fs::write(
        dir.path().join("cifar-10-binary.tar.gz"),
        gz.finish().unwrap(),
    )
    .unwrap();
    let tt = load_dataset("cifar10", Some(dir.path())).unwrap();
    assert_eq!(tt.train.len(), 10);
    assert_eq!(tt.test.len(), 2);
    assert_eq!(tt.test.y, batch(2, 5).1);
    assert!(
        dir.path()
            .join("cifar-10-batches-bin/test_batch.bin")
            .is_file()
    );
    // second load reads the unpacked folder
    assert_eq!(load_dataset("cifar10", Some(dir.path())).unwrap(), tt);
}
