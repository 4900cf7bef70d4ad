//! Sparse wire encoding of records: exact round trips, size against the information bound,
//! unchanged dense bytes, and corrupted buffers (errors or valid records, never panics).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::sync::OnceLock;

use fedfuse_core::sparse_codec::{self, IndexCode, MAX_SPARSE_VALUES};
use fedfuse_core::{ConfigValue, Params, Record, Tensor};
use proptest::prelude::*;
use safetensors::tensor::{Dtype, TensorView};

/// xorshift64: reproducible positions and values without a dev-dependency on `rand`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// A finite value, sometimes one whose bits test the zero convention.
    fn value(&mut self) -> f32 {
        match self.below(8) {
            0 => -0.0,
            1 => 1.0,
            2 => -1.5,
            _ => loop {
                let v = f32::from_bits(self.next() as u32);
                if v.is_finite() {
                    break v;
                }
            },
        }
    }
}

/// `len` values, each stored (non-`+0.0` bits) with probability `density`.
fn random_data(len: usize, density: f64, rng: &mut Rng) -> Vec<f32> {
    (0..len)
        .map(|_| {
            if rng.unit() < density {
                rng.value()
            } else {
                0.0
            }
        })
        .collect()
}

/// Exactly `k` stored values at uniformly random positions of `n`.
fn exact_k(n: usize, k: usize, rng: &mut Rng) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut data = vec![0.0f32; n];
    for i in 0..k {
        let j = i + rng.below(n - i);
        order.swap(i, j);
        data[order[i]] = loop {
            let v = rng.value();
            if v.to_bits() != 0 {
                break v;
            }
        };
    }
    data
}

/// Tensors as bit patterns: `f32`'s `==` would equate `-0.0` with `0.0`.
fn bits(p: &Params) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    p.iter()
        .map(|(name, t)| {
            (
                name.to_string(),
                t.shape.clone(),
                t.data.iter().map(|v| v.to_bits()).collect(),
            )
        })
        .collect()
}

fn assert_same(a: &Record, b: &Record) {
    assert_eq!(bits(&a.params), bits(&b.params));
    assert_eq!(
        (&a.config, &a.metrics, a.num_examples, a.sparse),
        (&b.config, &b.metrics, b.num_examples, b.sparse)
    );
}

/// What the fuzz target checks: whatever decodes re-encodes to a buffer that decodes to it.
fn assert_stable(r: &Record) {
    let again = Record::decode(&r.encode().expect("a decoded record encodes")).expect("re-decodes");
    assert_same(&again, r);
}

fn record_of(tensors: Vec<(Vec<usize>, Vec<f32>)>) -> Record {
    let mut p = Params::new();
    for (i, (shape, data)) in tensors.into_iter().enumerate() {
        p.push(format!("layers.{i}.weight"), shape, data).unwrap();
    }
    let mut r = Record::from_params(p)
        .with_num_examples(600)
        .with_config("round", ConfigValue::Int(4))
        .with_sparse(true);
    r.metrics.insert("train_loss".into(), 0.125);
    r
}

/// The header JSON and data section of a safetensors buffer.
fn split(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        &bytes[8 + n..],
    )
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        proptest::collection::vec(0usize..12, 0..4),
        (0usize..3000).prop_map(|n| vec![n]),
    ]
}

fn density_strategy() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0, 0.0f64..0.05]
}

proptest! {
    #[test]
    fn records_round_trip_bit_for_bit(
        tensors in proptest::collection::vec((shape_strategy(), density_strategy()), 0..5),
        seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let r = record_of(tensors.into_iter().map(|(shape, d)| {
            let n = shape.iter().product();
            (shape, random_data(n, d, &mut rng))
        }).collect());
        let bytes = r.encode().unwrap();
        let back = Record::decode(&bytes).unwrap();
        prop_assert!(back.sparse);
        assert_same(&back, &r);
        // Each tensor takes its smaller form: only the marker key, a JSON entry per tensor
        // ("U8" and a blob length for "F32" and a shape) and padding can cost more than dense.
        let dense = r.clone().with_sparse(false).encode().unwrap();
        prop_assert!(bytes.len() <= dense.len() + 28 + 4 * r.params.len(),
            "sparse {} vs dense {}", bytes.len(), dense.len());
    }

    #[test]
    fn tensors_round_trip_bit_for_bit(
        shape in shape_strategy(),
        density in density_strategy(),
        seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let n = shape.iter().product();
        let t = Tensor::new("t", shape, random_data(n, density, &mut rng)).unwrap();
        let blob = sparse_codec::encode_tensor(&t);
        let back = sparse_codec::decode_tensor(&blob.bytes).unwrap();
        prop_assert_eq!(&back.shape, &t.shape);
        let want: Vec<u32> = t.data.iter().map(|v| v.to_bits()).collect();
        let got: Vec<u32> = back.data.iter().map(|v| v.to_bits()).collect();
        prop_assert_eq!(got, want);
        prop_assert_eq!(blob.nonzeros, t.data.iter().filter(|v| v.to_bits() != 0).count());
        prop_assert!(blob.header_len + 4 * blob.nonzeros <= blob.bytes.len());
    }
}

#[test]
fn negative_zero_is_a_stored_value() {
    let r = record_of(vec![(
        vec![2, 4],
        vec![0.0, -0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    )]);
    let blob = sparse_codec::encode_tensor(r.params.tensor_at(0).unwrap());
    assert_eq!(blob.nonzeros, 1);
    let back = Record::decode(&r.encode().unwrap()).unwrap();
    assert_eq!(
        back.params.tensor_at(0).unwrap().data[1].to_bits(),
        (-0f32).to_bits()
    );
    assert_same(&back, &r);
}

/// For n = 100 000 and random positions, the size chosen (the smaller of dense and the blob) is
/// within 5% of `ceil(log2 C(n, k)) + 32 k` bits plus the blob header: code tag, Rice shift,
/// rank, dimensions and count as varints, at most 9 bytes for shape [100000] and 10 for
/// [100, 1000].
#[test]
fn size_is_within_five_percent_of_the_information_bound() {
    let n = 100_000;
    let mut rng = Rng::new(7);
    for shape in [vec![n], vec![100, 1000]] {
        for density in [0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0] {
            let k = (n as f64 * density).round() as usize;
            let t = Tensor::new("t", shape.clone(), exact_k(n, k, &mut rng)).unwrap();
            let blob = sparse_codec::encode_tensor(&t);
            assert!(
                blob.header_len <= 1 + shape.len() * 3 + 3 + 2,
                "{}",
                blob.header_len
            );
            let chosen = blob.bytes.len().min(4 * n);
            let bound = sparse_codec::information_bound_bits(n, k);
            let allowed = 1.05 * bound + 8.0 * blob.header_len as f64;
            assert!(
                8.0 * chosen as f64 <= allowed,
                "{shape:?} density {density}: {chosen} bytes ({}) vs bound {:.0} bytes",
                blob.index,
                bound / 8.0
            );
            if density <= 0.9 {
                // The record writes it sparse and its traffic shrinks accordingly.
                let r = Record::from_params({
                    let mut p = Params::new();
                    p.push("w", shape.clone(), t.data.clone()).unwrap();
                    p
                })
                .with_sparse(true);
                let sparse_len = r.encode().unwrap().len();
                let dense_len = r.clone().with_sparse(false).encode().unwrap().len();
                assert!(sparse_len < dense_len - (4 * n - blob.bytes.len()) + 64);
            }
        }
    }
}

#[test]
fn each_code_is_chosen_at_its_density() {
    let n = 100_000;
    let mut rng = Rng::new(3);
    let code = |k: usize, rng: &mut Rng| {
        sparse_codec::encode_tensor(&Tensor::new("t", vec![n], exact_k(n, k, rng)).unwrap()).index
    };
    assert!(matches!(code(1000, &mut rng), IndexCode::Rice { .. }));
    assert_eq!(code(50_000, &mut rng), IndexCode::Bitmap);
    assert_eq!(code(0, &mut rng), IndexCode::Varint);
    // Evenly spaced gaps of 99 fill one varint byte exactly.
    let even: Vec<f32> = (0..n)
        .map(|i| if i % 100 == 0 { 1.0 } else { 0.0 })
        .collect();
    let t = Tensor::new("t", vec![n], even).unwrap();
    assert_eq!(sparse_codec::encode_tensor(&t).index, IndexCode::Varint);
}

/// A `[rows, cols]` weight of non-zero values with the rows `pruned` zeroed, as FedSparse,
/// FedL1 and FedDrop send it.
fn pruned_rows(rows: usize, cols: usize, pruned: &[usize]) -> Vec<f32> {
    (0..rows * cols)
        .map(|p| {
            if pruned.contains(&(p / cols)) {
                0.0
            } else {
                0.5 + p as f32
            }
        })
        .collect()
}

/// Whole rows pruned (a unit's incoming weights): the run code spends a byte or two per run
/// where a bitmap spends a bit per value, so a 200 x 784 layer with half its units pruned
/// costs a few hundred index bytes, not 19,600.
#[test]
fn unit_pruned_weights_take_the_run_code_and_round_trip() {
    let pruned: Vec<usize> = (0..200).filter(|u| u % 3 != 0 && u % 7 != 1).collect();
    let data = pruned_rows(200, 784, &pruned);
    let t = Tensor::new("w", vec![200, 784], data).unwrap();
    let blob = sparse_codec::encode_tensor(&t);
    assert_eq!(blob.index, IndexCode::Runs);
    let kept = 200 - pruned.len();
    assert_eq!(blob.nonzeros, kept * 784);
    let index = blob.bytes.len() - blob.header_len - 4 * blob.nonzeros;
    // One (zeros, stored) pair per kept stretch of rows, each varint at most 3 bytes.
    assert!(
        index <= 6 * kept && index < 784 * 200 / 8 / 20,
        "{index} index bytes"
    );
    assert_eq!(sparse_codec::decode_tensor(&blob.bytes).unwrap(), t);
}

/// Captured from `Record::encode` before sparse encoding existed. Metadata key order follows a
/// `HashMap` and varies run to run, so the header is compared as JSON, the rest byte for byte.
#[test]
fn dense_records_are_unchanged() {
    let mut p = Params::new();
    p.push(
        "layers.0.weight",
        vec![2, 3],
        vec![0.0, -1.5, 0.0, 2.25, -0.0, 0.0],
    )
    .unwrap();
    p.push("layers.0.bias", vec![2], vec![0.0, 0.0]).unwrap();
    let mut r = Record::from_params(p)
        .with_num_examples(7)
        .with_config("round", ConfigValue::Int(3));
    r.metrics.insert("train_loss".into(), 0.5);
    assert!(!r.sparse);
    let bytes = r.encode().unwrap();
    assert_eq!(bytes.len(), 352);
    assert_eq!(u64::from_le_bytes(bytes[..8].try_into().unwrap()), 312);
    let (header, data) = split(&bytes);
    let want: serde_json::Value = serde_json::from_str(
        r#"{"__metadata__":{"fedfuse.metrics":"{\"train_loss\":0.5}","fedfuse.order":"[\"layers.0.weight\",\"layers.0.bias\"]","fedfuse.num_examples":"7","fedfuse.config":"{\"round\":3}"},"layers.0.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"layers.0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}}"#,
    )
    .unwrap();
    assert_eq!(header, want);
    assert_eq!(
        data,
        [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0xbf, 0, 0, 0, 0, 0, 0, 0x10, 0x40, 0,
            0, 0, 0x80, 0, 0, 0, 0
        ]
    );
    let back = Record::decode(&bytes).unwrap();
    assert!(!back.sparse);
    assert_same(&back, &r);
}

#[test]
fn a_sparse_record_with_nothing_to_shrink_stays_dense_and_sparse() {
    let r = record_of(vec![(vec![3], vec![1.0, 2.0, 3.0])]);
    let bytes = r.encode().unwrap();
    let (header, _) = split(&bytes);
    assert_eq!(header["layers.0.weight"]["dtype"], "F32");
    assert_eq!(header["__metadata__"]["fedfuse.sparse"], "1");
    let back = Record::decode(&bytes).unwrap();
    assert!(back.sparse);
    assert_same(&back, &r);
}

/// Tensors whose blobs use each index code, a dense one and an empty one.
fn mixed_record() -> &'static (Record, Vec<u8>) {
    static MIXED: OnceLock<(Record, Vec<u8>)> = OnceLock::new();
    MIXED.get_or_init(|| {
        let mut rng = Rng::new(11);
        let mut even = vec![0.0; 600];
        for i in (0..600).step_by(50) {
            even[i] = 2.0;
        }
        let r = record_of(vec![
            (vec![20, 30], exact_k(600, 300, &mut rng)),
            (vec![600], even),
            (vec![4000], exact_k(4000, 40, &mut rng)),
            (vec![10, 100], pruned_rows(10, 100, &[0, 3, 4, 9])),
            (vec![3, 2], vec![1.0, -2.0, 3.0, -0.0, 5.0, 6.0]),
            (vec![2, 0], vec![]),
            (vec![50], vec![0.0; 50]),
        ]);
        let codes: Vec<IndexCode> = r
            .params
            .iter()
            .take(4)
            .map(|(_, t)| sparse_codec::encode_tensor(t).index)
            .collect();
        assert_eq!(codes[..2], [IndexCode::Bitmap, IndexCode::Varint]);
        assert!(matches!(codes[2], IndexCode::Rice { .. }));
        assert_eq!(codes[3], IndexCode::Runs);
        let bytes = r.encode().unwrap();
        (r, bytes)
    })
}

#[test]
fn every_truncation_is_an_error() {
    let (r, bytes) = mixed_record();
    assert_same(&Record::decode(bytes).unwrap(), r);
    for len in 0..bytes.len() {
        assert!(Record::decode(&bytes[..len]).is_err(), "prefix of {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(Record::decode(&longer).is_err());
    for (name, t) in r.params.iter() {
        let blob = sparse_codec::encode_tensor(t).bytes;
        for len in 0..blob.len() {
            assert!(
                sparse_codec::decode_tensor(&blob[..len]).is_err(),
                "`{name}` prefix of {len}"
            );
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(
            sparse_codec::decode_tensor(&longer).is_err(),
            "`{name}` + 1 byte"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn flipped_records_are_errors_or_valid(at in 0usize..1 << 20, mask in 1u8..=255) {
        let (_, bytes) = mixed_record();
        let mut bad = bytes.clone();
        bad[at % bytes.len()] ^= mask;
        if let Ok(r) = Record::decode(&bad) {
            assert_stable(&r);
        }
    }

    #[test]
    fn flipped_blobs_are_errors_or_valid(
        which in 0usize..3, at in 0usize..1 << 20, mask in 1u8..=255,
    ) {
        let (r, _) = mixed_record();
        let t = r.params.tensor_at(which).unwrap();
        let blob = sparse_codec::encode_tensor(t);
        let at = at % blob.bytes.len();
        let mut bad = blob.bytes.clone();
        bad[at] ^= mask;
        let values_at = blob.bytes.len() - 4 * blob.nonzeros;
        match sparse_codec::decode_tensor(&bad) {
            Ok(back) => {
                prop_assert_eq!(back.data.len(), back.shape.iter().product::<usize>());
                if at >= values_at {
                    // A value's byte: the same positions, that one value's bits changed.
                    let changed: Vec<usize> = (0..t.data.len())
                        .filter(|&i| back.data[i].to_bits() != t.data[i].to_bits())
                        .collect();
                    prop_assert_eq!(changed.len(), 1);
                }
            }
            Err(_) => prop_assert!(at < values_at, "a value flip must decode"),
        }
    }

    #[test]
    fn random_bytes_are_errors_or_valid(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(r) = Record::decode(&bytes) {
            assert_stable(&r);
        }
        if let Ok(t) = sparse_codec::decode_tensor(&bytes) {
            prop_assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
        }
    }

    /// Random bytes behind a plausible blob header, inside a valid sparse container: this gets
    /// past the container and header checks to the index decoders.
    #[test]
    fn random_blob_bodies_are_errors_or_valid(
        tag in 0u8..4,
        shift in 0u8..34,
        shape in proptest::collection::vec(0u8..40, 0..3),
        k in 0u8..20,
        body in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut blob = vec![tag];
        if tag == 2 {
            blob.push(shift);
        }
        blob.push(shape.len() as u8);
        blob.extend(&shape);
        blob.push(k);
        blob.extend(&body);
        if let Ok(t) = sparse_codec::decode_tensor(&blob) {
            prop_assert_eq!(t.data.len(), t.shape.iter().product::<usize>());
        }
        if let Ok(r) = Record::decode(&container(&[("w", Dtype::U8, vec![blob.len()], &blob)], None)) {
            assert_stable(&r);
        }
    }
}

/// A sparse-marked container holding `tensors`, listed in order unless `order` says otherwise.
fn container(tensors: &[(&str, Dtype, Vec<usize>, &[u8])], order: Option<&str>) -> Vec<u8> {
    let names: Vec<&str> = tensors.iter().map(|t| t.0).collect();
    let meta = HashMap::from([
        ("fedfuse.config".to_string(), "{}".to_string()),
        ("fedfuse.metrics".to_string(), "{}".to_string()),
        ("fedfuse.num_examples".to_string(), "0".to_string()),
        ("fedfuse.sparse".to_string(), "1".to_string()),
        (
            "fedfuse.order".to_string(),
            order.map_or_else(|| serde_json::to_string(&names).unwrap(), str::to_string),
        ),
    ]);
    let views: Vec<(&str, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                *name,
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, Some(meta)).unwrap()
}

#[test]
fn malformed_containers_are_errors() {
    let err = |bytes: &[u8]| Record::decode(bytes).unwrap_err().to_string();
    // A blob of `n` zeros: varint code, rank 1, n, no values.
    let zeros = |n: usize| {
        let mut b = vec![1, 1];
        let mut v = n as u64;
        while v >= 0x80 {
            b.push(v as u8 | 0x80);
            v >>= 7;
        }
        b.push(v as u8);
        b.push(0);
        b
    };
    let small = zeros(10);
    assert_eq!(
        Record::decode(&container(
            &[("w", Dtype::U8, vec![small.len()], &small)],
            None
        ))
        .unwrap()
        .params
        .get("w")
        .unwrap()
        .data,
        vec![0.0; 10]
    );
    // Unknown format version.
    let mut bytes = container(&[], None);
    let at = bytes.windows(3).position(|w| w == b"\"1\"").unwrap();
    bytes[at + 1] = b'2';
    assert!(
        err(&bytes).contains("format version `2`"),
        "{}",
        err(&bytes)
    );
    // An order list that misses a tensor.
    let e = err(&container(
        &[("w", Dtype::U8, vec![small.len()], &small)],
        Some("[]"),
    ));
    assert!(e.contains("lists 0 tensors"), "{e}");
    // A blob must be one-dimensional, and only F32 is dense.
    let e = err(&container(
        &[("w", Dtype::U8, vec![1, small.len()], &small)],
        None,
    ));
    assert!(e.contains("neither"), "{e}");
    let e = err(&container(
        &[("w", Dtype::F16, vec![2], &[0, 0, 0, 0])],
        None,
    ));
    assert!(e.contains("neither"), "{e}");
    // A broken blob names its tensor.
    let e = err(&container(&[("w", Dtype::U8, vec![2], &[7, 0])], None));
    assert!(
        e.contains("sparse tensor `w`") && e.contains("index code 7"),
        "{e}"
    );
    // Tiny blobs may not claim more zeros, together, than the limit.
    let half = zeros(MAX_SPARSE_VALUES / 2 + 1);
    let e = err(&container(
        &[
            ("a", Dtype::U8, vec![half.len()], &half),
            ("b", Dtype::U8, vec![half.len()], &half),
        ],
        None,
    ));
    assert!(e.contains("sparse limit"), "{e}");
    // A dense record is read by the dense path, which knows nothing of blobs.
    let plain = safetensors::serialize(
        [(
            "w",
            TensorView::new(Dtype::U8, vec![small.len()], &small).unwrap(),
        )],
        None,
    )
    .unwrap();
    assert!(Record::decode(&plain).is_err());
}
