//! FEMNIST from LEAF's JSON shards: counts, labels, pixel order and scale, the writers, and
//! refusals of shards that are truncated or lie about themselves.

use std::path::Path;

use fedfuse_data::{load_dataset, read_leaf_femnist};
use serde_json::json;

/// Pixel `p` of sample `k` of writer `w`: a value in [0, 1] the test can recompute, so that a
/// transposed or shifted image fails.
pub fn pixel(w: usize, k: usize, p: usize) -> f32 {
    ((w * 131 + k * 17 + p * 7) % 256) as f32 / 255.0
}

/// Label of sample `k` of writer `w` (all 62 classes appear across writers).
pub fn label(w: usize, k: usize) -> u32 {
    ((w * 13 + k * 5) % 62) as u32
}

/// A LEAF shard holding `writers` (index, name, samples), samples numbered from `first`.
pub fn shard(writers: &[(usize, &str, usize)], first: usize) -> serde_json::Value {
    let mut users = Vec::new();
    let mut counts = Vec::new();
    let mut data = serde_json::Map::new();
    for &(w, name, n) in writers {
        users.push(json!(name));
        counts.push(json!(n));
        let x: Vec<Vec<f32>> = (first..first + n)
            .map(|k| (0..784).map(|p| pixel(w, k, p)).collect())
            .collect();
        let y: Vec<u32> = (first..first + n).map(|k| label(w, k)).collect();
        data.insert(name.into(), json!({ "x": x, "y": y }));
    }
    json!({ "users": users, "num_samples": counts, "user_data": data })
}

/// LEAF's layout under `dir`: writers 0-2 train on samples 0..n, test on n..n+2; writer 3
/// only in train; two train shards.
pub fn write_leaf(dir: &Path) {
    let train = dir.join("train");
    let test = dir.join("test");
    std::fs::create_dir_all(&train).unwrap();
    std::fs::create_dir_all(&test).unwrap();
    let put = |p: std::path::PathBuf, v: serde_json::Value| {
        std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap()
    };
    put(
        train.join("all_data_0_niid_1_keep_0_train_9.json"),
        shard(&[(0, "f0003_12", 4), (1, "f0001_40", 3)], 0),
    );
    put(
        train.join("all_data_1_niid_1_keep_0_train_9.json"),
        shard(&[(2, "f0002_07", 5), (3, "f0100_99", 2)], 0),
    );
    put(
        test.join("all_data_0_niid_1_keep_0_test_9.json"),
        shard(
            &[(0, "f0003_12", 2), (1, "f0001_40", 2), (2, "f0002_07", 2)],
            10,
        ),
    );
}

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
