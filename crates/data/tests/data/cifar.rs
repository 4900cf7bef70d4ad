use std::io::Write;

use fedfuse_data::{
    CIFAR100_COARSE_OF_FINE, Cifar100Label, DataError, VerifyStatus, dataset_info, load_dataset,
    read_cifar10_batch, read_cifar100, verify,
};

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

// ---- CIFAR-100: two label bytes (coarse, fine) per record, then the pixels. ----

/// `n` CIFAR-100 records whose fine labels step by `stride` from `seed` (each record's coarse
/// label is its fine label's superclass): the bytes, the fine and coarse labels, the pixels.
fn records100(n: usize, seed: u8, stride: usize) -> (Vec<u8>, Vec<u32>, Vec<u32>, Vec<f32>) {
    let (mut bytes, mut fine, mut coarse, mut x) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let f = ((usize::from(seed) + i * stride) % 100) as u8;
        let c = CIFAR100_COARSE_OF_FINE[usize::from(f)];
        bytes.extend([c, f]);
        fine.push(u32::from(f));
        coarse.push(u32::from(c));
        for j in 0..3072usize {
            let v = ((i * 53 + j * 11 + usize::from(seed)) % 256) as u8;
            bytes.push(v);
            x.push(f32::from(v) / 255.0);
        }
    }
    (bytes, fine, coarse, x)
}

#[test]
fn cifar100_file_reads_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("train.bin");
    // Fine labels 0, 7, 14, ..., 98, 5, ...: 100 records cover every class (7 is prime to 100).
    let (bytes, fine, coarse, x) = records100(100, 0, 7);
    std::fs::write(&p, &bytes).unwrap();
    let ds = read_cifar100(&p, Cifar100Label::Fine).unwrap();
    assert_eq!(
        (ds.sample_shape.clone(), ds.num_classes),
        (vec![3, 32, 32], 100)
    );
    assert_eq!(ds.y, fine);
    assert_eq!(ds.x, x);
    assert_eq!(ds.class_counts(), vec![1; 100]);
    // Hand-checked records: apple (fine 0) is fruit_and_vegetables (coarse 4); fine 7
    // (beetle) is insects (7); fine 14 (butterfly) insects (7).
    assert_eq!(
        (&ds.y[..3], &coarse[..3]),
        (&[0, 7, 14][..], &[4, 7, 7][..])
    );
    let cs = read_cifar100(&p, Cifar100Label::Coarse).unwrap();
    assert_eq!(cs.num_classes, 20);
    assert_eq!(cs.x, x);
    assert_eq!(cs.y, coarse);
    // The table and the reader agree: the coarse read is the table applied to the fine read.
    let mapped: Vec<u32> =
        ds.y.iter()
            .map(|&f| u32::from(CIFAR100_COARSE_OF_FINE[f as usize]))
            .collect();
    assert_eq!(cs.y, mapped);
    assert_eq!(cs.class_counts(), vec![5; 20]);
}

#[test]
fn cifar100_refuses_truncated_files_and_bad_labels() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut_train.bin");
    let (bytes, ..) = records100(3, 40, 1);
    let err = |bytes: &[u8]| {
        std::fs::write(&p, bytes).unwrap();
        let e = read_cifar100(&p, Cifar100Label::Fine).unwrap_err();
        assert!(matches!(e, DataError::Format { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("cut_train.bin"), "{e}");
        e
    };
    let e = err(&bytes[..2 * 3074 + 100]);
    assert!(e.contains("3074") && e.contains("truncated"), "{e}");
    assert!(err(&[]).contains("0 bytes"));
    // A CIFAR-10 batch has one label byte per record.
    assert!(err(&batch(2, 0).0[..]).contains("CIFAR-100 records"));
    let mut bad = bytes.clone();
    bad[3074 + 1] = 100;
    let e = err(&bad);
    assert!(
        e.contains("record 1") && e.contains("fine label 100"),
        "{e}"
    );
    let mut bad = bytes.clone();
    bad[2 * 3074] = 19; // record 2 is fine 42 (leopard), coarse 8 (large_carnivores)
    let e = err(&bad);
    assert!(
        e.contains("record 2") && e.contains("coarse label 19") && e.contains("fine label 42"),
        "{e}"
    );
}

/// The fine and the coarse labels of one split.
type Labels = (Vec<u32>, Vec<u32>);

/// A gzipped `cifar-100-binary.tar.gz` with 5 training and 2 test records, and the labels of
/// its train and test splits.
fn cifar100_archive() -> (Vec<u8>, [Labels; 2]) {
    let (train, train_fine, train_coarse, _) = records100(5, 3, 17);
    let (test, test_fine, test_coarse, _) = records100(2, 90, 1);
    let mut tar = tar_entry(
        "cifar-100-binary/coarse_label_names.txt",
        b"aquatic_mammals\n",
    );
    tar.extend(tar_entry(
        "cifar-100-binary/fine_label_names.txt",
        b"apple\n",
    ));
    tar.extend(tar_entry("cifar-100-binary/test.bin", &test));
    tar.extend(tar_entry("cifar-100-binary/train.bin", &train));
    tar.extend([0u8; 1024]);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (
        gz.finish().unwrap(),
        [(train_fine, train_coarse), (test_fine, test_coarse)],
    )
}

#[test]
fn cifar100_loads_from_archive_and_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (archive, [(train_fine, train_coarse), (test_fine, test_coarse)]) = cifar100_archive();
    std::fs::write(dir.path().join("cifar-100-binary.tar.gz"), &archive).unwrap();
    let tt = load_dataset("cifar100", Some(dir.path())).unwrap();
    assert_eq!((tt.train.len(), tt.test.len()), (5, 2));
    assert_eq!((tt.train.num_classes, tt.test.num_classes), (100, 100));
    assert_eq!((&tt.train.y, &tt.test.y), (&train_fine, &test_fine));
    let unpacked = dir.path().join("cifar-100-binary");
    assert!(unpacked.join("train.bin").is_file() && unpacked.join("test.bin").is_file());
    assert!(!unpacked.join("fine_label_names.txt").exists());
    // A second load reads the unpacked folder, even with the archive gone.
    std::fs::remove_file(dir.path().join("cifar-100-binary.tar.gz")).unwrap();
    assert_eq!(load_dataset("cifar100", Some(dir.path())).unwrap(), tt);
    let coarse = load_dataset("cifar100-coarse", Some(dir.path())).unwrap();
    assert_eq!(coarse.train.num_classes, 20);
    assert_eq!(
        (&coarse.train.y, &coarse.test.y),
        (&train_coarse, &test_coarse)
    );
    assert_eq!(coarse.train.x, tt.train.x);

    // `cifar100-coarse` finds a download of `cifar100` in the folder's `cifar100/`.
    let parent = tempfile::tempdir().unwrap();
    std::fs::create_dir(parent.path().join("cifar100")).unwrap();
    std::fs::write(
        parent.path().join("cifar100/cifar-100-binary.tar.gz"),
        &archive,
    )
    .unwrap();
    let coarse2 = load_dataset("cifar100-coarse", Some(parent.path())).unwrap();
    assert_eq!(coarse2, coarse);
    assert_eq!(load_dataset("cifar100", Some(parent.path())).unwrap(), tt);
}

#[test]
fn cifar100_missing_or_unverified_archive() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["cifar100", "cifar100-coarse"] {
        let e = load_dataset(name, Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cifar-100-binary.tar.gz")
                && e.contains(&format!("fedfuse data get {name}")),
            "{e}"
        );
    }
    // One archive for both, checked by its sha256 (TensorFlow Datasets' record of it).
    for name in ["cifar100", "cifar100-coarse"] {
        let info = dataset_info(name).unwrap();
        assert_eq!(info.files.len(), 1);
        assert_eq!(info.files[0].name, "cifar-100-binary.tar.gz");
        assert_eq!(
            info.files[0].sha256,
            "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec"
        );
        assert!(info.files[0].max_bytes > 168_513_733);
    }
    // A file under the archive's name that is not the archive fails verification.
    std::fs::write(
        dir.path().join("cifar-100-binary.tar.gz"),
        cifar100_archive().0,
    )
    .unwrap();
    let status = verify("cifar100", dir.path()).unwrap();
    assert!(
        matches!(&status[..], [(f, VerifyStatus::Mismatch { .. })] if f == "cifar-100-binary.tar.gz"),
        "{status:?}"
    );
    // A CIFAR-10 folder is not mistaken for CIFAR-100, and the message says what it holds.
    let c10 = tempfile::tempdir().unwrap();
    std::fs::write(c10.path().join("cifar-10-binary.tar.gz"), b"x").unwrap();
    let e = load_dataset("cifar100", Some(c10.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds the cifar10 dataset, not cifar100"), "{e}");
}
