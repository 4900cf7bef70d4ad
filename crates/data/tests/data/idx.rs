use std::io::Read;

use fedfuse_data::{load_dataset, read_idx_images, read_idx_labels, write_idx};

use crate::common::mnist_dir;

#[test]
fn real_mnist_files() {
    let d = mnist_dir();
    let (n, r, c, px) = read_idx_images(&d.join("train-images-idx3-ubyte.gz")).unwrap();
    assert_eq!((n, r, c, px.len()), (60000, 28, 28, 60000 * 784));
    let y = read_idx_labels(&d.join("train-labels-idx1-ubyte.gz")).unwrap();
    assert_eq!(y.len(), 60000);
    let mut counts = [0usize; 10];
    y.iter().for_each(|&l| counts[l as usize] += 1);
    // np.bincount(train_labels) = [5923 6742 5958 6131 5842 5421 5918 6265 5851 5949]
    assert_eq!(
        counts,
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    );
    let (n, ..) = read_idx_images(&d.join("t10k-images-idx3-ubyte.gz")).unwrap();
    assert_eq!(n, 10000);
}

#[test]
fn load_mnist_dataset() {
    let tt = load_dataset("mnist", Some(&mnist_dir())).unwrap();
    assert_eq!(tt.train.len(), 60000);
    assert_eq!(tt.test.len(), 10000);
    assert_eq!(tt.train.sample_shape, vec![1, 28, 28]);
    assert_eq!(tt.train.num_classes, 10);
    assert!(tt.train.x.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert_eq!(tt.train.x.iter().cloned().fold(0.0f32, f32::max), 1.0);
    assert_eq!(tt.test.class_counts()[0], 980); // np.bincount(test_labels)[0]
}

fn gunzip(path: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn raw_idx_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // a small raw (uncompressed) file
    let p = dir.path().join("small-images-idx3-ubyte");
    let px: Vec<u8> = (0..2 * 3 * 4).map(|i| i as u8).collect();
    std::fs::write(&p, write_idx(&[2, 3, 4], &px)).unwrap();
    assert_eq!(read_idx_images(&p).unwrap(), (2, 3, 4, px));

    // a truncated raw label file
    let labels = gunzip(&mnist_dir().join("t10k-labels-idx1-ubyte.gz"));
    let p = dir.path().join("cut-labels-idx1-ubyte");
    std::fs::write(&p, &labels[..5000]).unwrap();
    let e = read_idx_labels(&p).unwrap_err().to_string();
    assert!(
        e.contains("cut-labels-idx1-ubyte") && e.contains("truncated"),
        "{e}"
    );

    // a truncated gzip file
    let gz = std::fs::read(mnist_dir().join("t10k-images-idx3-ubyte.gz")).unwrap();
    let p = dir.path().join("half.gz");
    std::fs::write(&p, &gz[..gz.len() / 2]).unwrap();
    let e = read_idx_images(&p).unwrap_err().to_string();
    assert!(e.contains("half.gz"), "{e}");

    // a labels file handed to the images reader: wrong magic
    let p = dir.path().join("labels-as-images");
    std::fs::write(&p, &labels).unwrap();
    let e = read_idx_images(&p).unwrap_err().to_string();
    assert!(e.contains("labels-as-images") && e.contains("magic"), "{e}");

    // a foreign file
    let p = dir.path().join("foreign.txt");
    std::fs::write(&p, "hello, world").unwrap();
    let e = read_idx_labels(&p).unwrap_err().to_string();
    assert!(e.contains("foreign.txt"), "{e}");

    // missing file
    let e = read_idx_labels(&dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn missing_mnist_names_dir_and_command() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_dataset("mnist", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
    assert!(e.contains("fedfuse data get mnist"), "{e}");
    assert!(e.contains("train-images-idx3-ubyte.gz"), "{e}");
}

#[test]
fn uncompressed_mnist_layout_in_subfolder() {
    // data_dir/NAME with uncompressed files also works
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("mnist");
    std::fs::create_dir(&sub).unwrap();
    let img: Vec<u8> = (0..3 * 28 * 28).map(|i| (i % 256) as u8).collect();
    for (name, bytes) in [
        ("train-images-idx3-ubyte", write_idx(&[3, 28, 28], &img)),
        ("train-labels-idx1-ubyte", write_idx(&[3], &[1, 2, 3])),
        (
            "t10k-images-idx3-ubyte",
            write_idx(&[1, 28, 28], &img[..784]),
        ),
        ("t10k-labels-idx1-ubyte", write_idx(&[1], &[9])),
    ] {
        std::fs::write(sub.join(name), bytes).unwrap();
    }
    let tt = load_dataset("mnist", Some(dir.path())).unwrap();
    assert_eq!(tt.train.y, vec![1, 2, 3]);
    assert_eq!(tt.test.y, vec![9]);
    assert_eq!(tt.train.x[255], 1.0);
}
