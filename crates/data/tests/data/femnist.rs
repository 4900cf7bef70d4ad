//! FEMNIST from LEAF's JSON shards and from Flower Datasets' Parquet files: counts, labels,
//! pixel order and scale, the writers, the same bits from both forms, and refusals of files
//! that are truncated or lie about themselves.

use fedfuse_data::{
    ParquetFiles, find_femnist, find_parquet_files, load_dataset, read_leaf_femnist,
    read_parquet_femnist,
};
use serde_json::json;

use crate::femnist_files::{
    Row, SCHEMA, label, pixel, png, png_sized, row, shard, write_leaf, write_parquet,
    write_parquet_like_leaf, write_parquet_with,
};

#[test]
fn leaf_shards_read_with_their_writers_pixels_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    write_leaf(dir.path());
    let data = read_leaf_femnist(dir.path()).unwrap();
    assert_eq!((data.train.len(), data.test.len()), (14, 6));
    assert_eq!(data.train.sample_shape, [1, 28, 28]);
    assert_eq!(data.train.num_classes, 62);
    let ids = data.train.ids.as_ref().unwrap();
    assert_eq!(ids.column, "writer_id");
    // One sorted list of names for both splits.
    assert_eq!(
        &ids.names[..],
        ["f0001_40", "f0002_07", "f0003_12", "f0100_99"]
    );
    assert!(std::sync::Arc::ptr_eq(
        &ids.names,
        &data.test.ids.as_ref().unwrap().names
    ));
    // Samples in shard order, writer by writer, pixels row by row as LEAF writes them.
    let expect = [
        (0, "f0003_12", 4),
        (1, "f0001_40", 3),
        (2, "f0002_07", 5),
        (3, "f0100_99", 2),
    ];
    let mut i = 0;
    for (w, name, n) in expect {
        for k in 0..n {
            assert_eq!(data.train.y[i], label(w, k), "sample {i}");
            assert_eq!(ids.names[ids.of[i] as usize], name);
            let img = data.train.sample(i);
            assert_eq!(img[0], pixel(w, k, 0));
            assert_eq!(img[28 * 5 + 3], pixel(w, k, 28 * 5 + 3), "row 5, column 3");
            assert_eq!(img[783], pixel(w, k, 783));
            i += 1;
        }
    }
    let test_ids = data.test.ids.as_ref().unwrap();
    assert_eq!(test_ids.names[test_ids.of[0] as usize], "f0003_12");
    assert_eq!(data.test.y[0], label(0, 10));

    // `load_dataset` finds the same files under --data-dir, or its femnist/ subfolder.
    let loaded = load_dataset("femnist", Some(dir.path())).unwrap();
    assert_eq!(loaded, data);
    let parent = tempfile::tempdir().unwrap();
    std::fs::rename(dir.path(), parent.path().join("femnist")).unwrap();
    assert_eq!(load_dataset("femnist", Some(parent.path())).unwrap(), data);
}

#[test]
fn missing_femnist_says_how_to_make_it() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_dataset("femnist", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("preprocess.sh") && e.contains("train"), "{e}");
    let e = fedfuse_data::download("femnist", dir.path(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("not downloaded by fedfuse"), "{e}");
}

/// A change made to a shard.
type Tamper = Box<dyn Fn(&mut serde_json::Value)>;

#[test]
fn hostile_shards_are_refused_naming_the_file_and_writer() {
    let cases: Vec<(&str, Tamper)> = vec![
        (
            "num_samples says 5",
            Box::new(|v| v["num_samples"][0] = json!(5)),
        ),
        (
            "2 users but 1 num_samples",
            Box::new(|v| v["num_samples"] = json!([4])),
        ),
        (
            "784",
            Box::new(|v| v["user_data"]["f0003_12"]["x"][1] = json!([0.5, 0.5])),
        ),
        (
            "outside [0, 1]",
            Box::new(|v| v["user_data"]["f0003_12"]["x"][2][9] = json!(255.0)),
        ),
        (
            "label 62",
            Box::new(|v| v["user_data"]["f0001_40"]["y"][0] = json!(62)),
        ),
        (
            "label -1",
            Box::new(|v| v["user_data"]["f0001_40"]["y"][0] = json!(-1)),
        ),
        (
            "has no user_data",
            Box::new(|v| {
                v["users"][1] = json!("nobody");
            }),
        ),
        (
            "not a LEAF shard",
            Box::new(|v| *v = json!({ "users": [] })),
        ),
    ];
    for (want, tamper) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_leaf(dir.path());
        let file = dir
            .path()
            .join("train")
            .join("all_data_0_niid_1_keep_0_train_9.json");
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        tamper(&mut v);
        std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
        let e = read_leaf_femnist(dir.path()).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("all_data_0"), "{want}: {e}");
    }
    // A writer twice in one split.
    let dir = tempfile::tempdir().unwrap();
    write_leaf(dir.path());
    let again = shard(&[(0, "f0003_12", 1)], 0);
    std::fs::write(
        dir.path().join("train").join("z.json"),
        serde_json::to_vec(&again).unwrap(),
    )
    .unwrap();
    let e = read_leaf_femnist(dir.path()).unwrap_err().to_string();
    assert!(e.contains("appears twice"), "{e}");
    // A shard over the size bound is refused before it is read (a sparse file: no disk used).
    let dir = tempfile::tempdir().unwrap();
    write_leaf(dir.path());
    let huge = std::fs::File::create(dir.path().join("train").join("huge.json")).unwrap();
    huge.set_len(fedfuse_data::MAX_LEAF_SHARD_BYTES + 1)
        .unwrap();
    let e = read_leaf_femnist(dir.path()).unwrap_err().to_string();
    assert!(e.contains("huge.json") && e.contains("over the"), "{e}");
    // Every truncation of a shard is an error, never a panic.
    let dir = tempfile::tempdir().unwrap();
    write_leaf(dir.path());
    let file = dir
        .path()
        .join("test")
        .join("all_data_0_niid_1_keep_0_test_9.json");
    let whole = std::fs::read(&file).unwrap();
    for cut in (0..whole.len()).step_by(997) {
        std::fs::write(&file, &whole[..cut]).unwrap();
        assert!(read_leaf_femnist(dir.path()).is_err(), "cut at {cut}");
    }
}

#[test]
fn parquet_files_give_the_bits_leaf_shards_give() {
    let dir = tempfile::tempdir().unwrap();
    let (leaf, hub) = (dir.path().join("leaf"), dir.path().join("hub"));
    write_leaf(&leaf);
    write_parquet_like_leaf(&hub.join("data"));
    let from_leaf = read_leaf_femnist(&leaf).unwrap();
    let files = find_parquet_files(&hub).unwrap();
    assert_eq!(
        files,
        ParquetFiles {
            train: vec![
                hub.join("data/train-00000-of-00002.parquet"),
                hub.join("data/train-00001-of-00002.parquet"),
            ],
            test: vec![hub.join("data/test-00000-of-00001.parquet")],
        }
    );
    let from_parquet = read_parquet_femnist(&files).unwrap();
    // The same samples in the same order, the same writers, the same bits.
    assert_eq!(from_parquet, from_leaf);
    assert_eq!(load_dataset("femnist", Some(&hub)).unwrap(), from_leaf);
    // Where both forms lie under one folder, LEAF's shards are read.
    write_parquet_like_leaf(&leaf);
    assert!(matches!(
        find_femnist(&leaf),
        Some(fedfuse_data::FemnistFiles::Leaf(_))
    ));
}

#[test]
fn without_a_test_split_each_writers_every_tenth_image_is_held_out() {
    let dir = tempfile::tempdir().unwrap();
    // Writer 0's samples 0-11, writer 1's 0-8, writer 0's 12-22, in that file order.
    let order: Vec<(usize, usize)> = (0..12)
        .map(|k| (0, k))
        .chain((0..9).map(|k| (1, k)))
        .chain((12..23).map(|k| (0, k)))
        .collect();
    let name = |w: usize| ["f0500_01", "f0501_02"][w];
    let rows: Vec<Row> = order.iter().map(|&(w, k)| row(w, name(w), k)).collect();
    write_parquet(&dir.path().join("train-00000-of-00001.parquet"), &rows);
    let data = load_dataset("femnist", Some(dir.path())).unwrap();
    // Writer 0's 10th and 20th images (samples 9 and 19); writer 1 has 9, none held out.
    let held = [(0, 9), (0, 19)];
    assert_eq!(data.test.len(), 2);
    assert_eq!(data.train.len(), order.len() - 2);
    let kept: Vec<_> = order.iter().filter(|s| !held.contains(s)).collect();
    for (i, &&(w, k)) in kept.iter().enumerate() {
        assert_eq!(data.train.y[i], label(w, k), "train sample {i}");
        assert_eq!(data.train.sample(i)[400], pixel(w, k, 400));
        let ids = data.train.ids.as_ref().unwrap();
        assert_eq!(ids.names[ids.of[i] as usize], name(w));
    }
    for (i, &(w, k)) in held.iter().enumerate() {
        assert_eq!(data.test.y[i], label(w, k));
        assert_eq!(data.test.sample(i)[783], pixel(w, k, 783));
    }
}

/// A change made to the rows of a one-file Parquet dataset.
type Edit = Box<dyn Fn(&mut Vec<Row>)>;

#[test]
fn hostile_parquet_files_are_refused_naming_the_file_and_row() {
    let base = || -> Vec<Row> { (0..5).map(|k| row(0, "f0003_12", k)).collect() };
    let cases: Vec<(&str, Edit)> = vec![
        (
            "row 3: character 62",
            Box::new(|r| r[3].character = Some(62)),
        ),
        (
            "row 0: character -1",
            Box::new(|r| r[0].character = Some(-1)),
        ),
        ("row 1: no character", Box::new(|r| r[1].character = None)),
        ("row 2: no image bytes", Box::new(|r| r[2].png = None)),
        ("row 4: no writer_id", Box::new(|r| r[4].writer = None)),
        (
            "writer_id of 0 bytes",
            Box::new(|r| r[1].writer = Some(String::new())),
        ),
        (
            "a 29x28 image",
            Box::new(|r| {
                r[2].png = Some(png_sized(&[9; 29 * 28], 29, 28, png::ColorType::Grayscale))
            }),
        ),
        (
            "8-bit grey",
            Box::new(|r| r[2].png = Some(png_sized(&[9; 3 * 784], 28, 28, png::ColorType::Rgb))),
        ),
        (
            "not a readable PNG",
            Box::new(|r| r[0].png = Some(b"\x89PNG but not really".to_vec())),
        ),
        (
            "a damaged PNG",
            Box::new(|r| {
                let mut p = png(&[7; 784]);
                let n = p.len();
                p.truncate(n - 20);
                r[4].png = Some(p);
            }),
        ),
        (
            "over the 65536",
            Box::new(|r| r[1].png = Some(vec![0; 70_000])),
        ),
    ];
    for (want, edit) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = base();
        edit(&mut rows);
        write_parquet(&dir.path().join("train-00000-of-00001.parquet"), &rows);
        let e = load_dataset("femnist", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(want) && e.contains("train-00000-of-00001.parquet"),
            "{want}: {e}"
        );
    }

    // Columns missing or of another type.
    let schemas = [
        (
            SCHEMA.replace("optional int64 character;", ""),
            "no `character` column",
        ),
        (
            SCHEMA.replace(
                "optional int64 character;",
                "optional binary character (STRING);",
            ),
            "column `character` holds BYTE_ARRAY",
        ),
    ];
    for (schema, want) in schemas {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("train-00000-of-00001.parquet");
        write_parquet_with(&file, &schema, &base(), 2);
        let e = load_dataset("femnist", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{want}: {e}");
    }

    // Not Parquet at all; over the size bound (a sparse file: no disk used), refused before
    // it is read; a footer claiming more than the file holds.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train-00000-of-00001.parquet");
    std::fs::write(&file, json!({"users": []}).to_string()).unwrap();
    let e = load_dataset("femnist", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a Parquet file"), "{e}");
    let huge = std::fs::File::create(&file).unwrap();
    huge.set_len(fedfuse_data::MAX_PARQUET_FILE_BYTES + 1)
        .unwrap();
    let e = load_dataset("femnist", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("over the"), "{e}");
    write_parquet(&file, &base());
    let mut whole = std::fs::read(&file).unwrap();
    let n = whole.len();
    whole[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&file, &whole).unwrap();
    let e = load_dataset("femnist", Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("footer declares"), "{e}");

    // Every truncation is an error, and no flipped byte panics (most are refused; a flip in
    // a pixel's compressed bytes may still decode).
    write_parquet(&file, &base());
    let whole = std::fs::read(&file).unwrap();
    for cut in 0..whole.len() {
        std::fs::write(&file, &whole[..cut]).unwrap();
        assert!(
            load_dataset("femnist", Some(dir.path())).is_err(),
            "cut at {cut}"
        );
    }
    for at in 0..whole.len() {
        let mut flipped = whole.clone();
        flipped[at] ^= 0x5a;
        std::fs::write(&file, &flipped).unwrap();
        let _ = load_dataset("femnist", Some(dir.path()));
    }
}
