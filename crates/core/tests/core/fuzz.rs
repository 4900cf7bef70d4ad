//! Fuzzing the byte parsers of fedfuse-core: `Record::decode` (dense and sparse), safetensors
//! and npz/npy.
//!
//! Each parser gets arbitrary bytes (some behind a valid magic, to get past the first check)
//! and valid inputs from the crate's own writers, mutated: bit flips, truncation, insertions,
//! removals, JSON tokens and size fields overwritten with huge values. The property: `Ok` or
//! `Err`, never a panic, and a heap peak within a bound proportional to the input (counted by
//! this binary's allocator, per thread). Headers declaring 2^40 elements are refused, fast and
//! without allocating for them. Whatever `Record::decode` accepts re-encodes to the same record
//! bit for bit, the property of the cargo-fuzz target `crates/core/fuzz` (`record_decode`).
//!
//! Cases per test: `PROPTEST_CASES` when set, else a CI-sized default (a few thousand per
//! parser); `scripts/fuzz.sh` runs a million. Each test prints its case count and heap peak
//! (`--nocapture`).

mod harness;

use std::collections::HashMap;
use std::io::{Cursor, Write};

use fedfuse_core::sparse_codec::MAX_SPARSE_VALUES;
use fedfuse_core::{
    ConfigValue, Params, Record, decode_npy_array, encode_npy, params_from_npz,
    params_from_safetensors, params_to_safetensors,
};
use harness::{Budget, arbitrary, framed, fuzz, mutated, refused, within};
use proptest::prelude::*;
use safetensors::tensor::{Dtype, TensorView};
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

/// What a parser of uncompressed bytes may hold: its output (at most 4 bytes of f32 per input
/// byte, F16 and BF16 doubling to f32), the parsed JSON header and the zip directory.
const PLAIN: Budget = Budget {
    per_byte: 64,
    slack: 1 << 20,
};

/// An npz member may inflate to 1032 bytes per deflated byte (deflate's most), held twice while
/// `read_to_end` grows its buffer, then decoded to f32.
const DEFLATED: Budget = Budget {
    per_byte: 5 * 1032,
    slack: 1 << 20,
};

/// A sparse record may declare all-zero tensors of up to `MAX_SPARSE_VALUES` f32 in a few
/// bytes (the format's documented ceiling, 1 GiB); past that it is refused.
const SPARSE: Budget = Budget {
    per_byte: 64,
    slack: (1 << 20) + 4 * MAX_SPARSE_VALUES,
};

/// Tokens spliced into JSON and npy headers.
const TOKENS: &[&str] = &[
    "\"",
    ",",
    ":",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "-1",
    "0",
    "1e999",
    "null",
    "true",
    "False",
    "18446744073709551615",
    "18446744073709551616",
    "1099511627776",
    "4294967296",
    "\"F64\"",
    "\"BF16\"",
    "\"U8\"",
    "\"I64\"",
    "'<f8'",
    "'>f2'",
    "'|b1'",
    "\\u0000",
    "\u{feff}",
    "\"data_offsets\"",
    "\"shape\"",
    "\"dtype\"",
    "\"__metadata__\"",
    "\"fedfuse.sparse\"",
];

fn params(sparse: bool) -> Params {
    let mut p = Params::new();
    let w: Vec<f32> = (0..12)
        .map(|i| {
            if sparse && i % 5 != 0 {
                0.0
            } else {
                i as f32 - 5.5
            }
        })
        .collect();
    p.push("layers.0.weight", vec![3, 4], w).unwrap();
    p.push("layers.0.bias", vec![3], vec![0.0, -0.0, f32::MIN_POSITIVE])
        .unwrap();
    let zeros = vec![0.0; 40];
    p.push("layers.1.weight", vec![2, 20], zeros).unwrap();
    p
}

/// Records as `Record::encode` writes them: dense, sparse (each of the four position codes)
/// and empty.
fn record_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for sparse in [false, true] {
        let mut r = Record::from_params(params(sparse))
            .with_num_examples(17)
            .with_sparse(sparse)
            .with_config("proximal_mu", ConfigValue::Float(0.01))
            .with_config("round", ConfigValue::Int(3))
            .with_config("mode", ConfigValue::Str("train".into()))
            .with_config("last", ConfigValue::Bool(true));
        r.metrics.insert("train_loss".into(), 0.25);
        seeds.push(r.encode().unwrap());
    }
    // Long runs of zeros: positions as varint gaps (few values) and Rice-coded gaps (many).
    let mut p = Params::new();
    let mut long = vec![0.0; 3000];
    for i in [7, 700, 2999] {
        long[i] = 1.5;
    }
    p.push("varint", vec![3000], long).unwrap();
    let rice = (0..2000)
        .map(|i| if i % 23 == 0 { 0.5 } else { 0.0 })
        .collect();
    p.push("rice", vec![2000], rice).unwrap();
    // Whole rows zeroed, as unit pruning leaves a weight: the run code.
    let rows = (0..400)
        .map(|i| if (i / 40) % 3 == 1 { 0.0 } else { 0.25 })
        .collect();
    p.push("runs", vec![10, 40], rows).unwrap();
    seeds.push(Record::from_params(p).with_sparse(true).encode().unwrap());
    seeds.push(Record::default().encode().unwrap());
    seeds
}

/// Safetensors files: ours (with order and metadata) and PyTorch's (F64, F16, BF16, I32).
fn safetensors_seeds() -> Vec<Vec<u8>> {
    let meta = HashMap::from([("note".to_string(), "seed".to_string())]);
    let ours = params_to_safetensors(&params(false), meta).unwrap();
    let f64s: Vec<u8> = [1.5f64, -2.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let halves = [0u8, 0x3c, 0, 0xc0];
    let ints = [1u8, 2, 3, 4];
    let torch = safetensors::serialize(
        vec![
            (
                "layers.10.weight",
                TensorView::new(Dtype::F64, vec![1, 2], &f64s).unwrap(),
            ),
            (
                "layers.2.weight",
                TensorView::new(Dtype::F16, vec![2], &halves).unwrap(),
            ),
            (
                "layers.2.bias",
                TensorView::new(Dtype::BF16, vec![2], &halves).unwrap(),
            ),
            (
                "count",
                TensorView::new(Dtype::I32, vec![1], &ints).unwrap(),
            ),
        ],
        None,
    )
    .unwrap();
    vec![ours, torch]
}

/// `.npy` arrays: `encode_npy`'s (numpy's layout) and hand-made float16 / big-endian float64
/// / Fortran-order ones.
fn npy_seeds() -> Vec<Vec<u8>> {
    let npy = |header: &str, data: &[u8]| {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend(u16::try_from(header.len()).unwrap().to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(data);
        b
    };
    let f64s: Vec<u8> = [1.5f64, -2.0, 3.0, 0.5]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    vec![
        encode_npy(&[2, 3], &[1.0, -0.0, 2.5, 1e30, -7.0, 0.125]).unwrap(),
        encode_npy(&[], &[4.0]).unwrap(),
        npy(
            "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }\n",
            &[0, 0x3c, 0, 0xc0],
        ),
        npy(
            "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 2), }\n",
            &f64s,
        ),
    ]
}

/// A zip archive of `(member, bytes)`.
fn zip_of(members: &[(&str, &[u8])], method: CompressionMethod) -> Vec<u8> {
    let options = SimpleFileOptions::default().compression_method(method);
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in members {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// `.npz` archives as `numpy.savez` (stored) and `numpy.savez_compressed` (deflated) write them.
fn npz_seeds() -> Vec<Vec<u8>> {
    let arrays = npy_seeds();
    let members = [
        ("layers.0.weight.npy", arrays[0].as_slice()),
        ("layers.0.bias.npy", arrays[1].as_slice()),
        ("half.npy", arrays[2].as_slice()),
        ("fortran.npy", arrays[3].as_slice()),
    ];
    vec![
        zip_of(&members, CompressionMethod::Stored),
        zip_of(&members, CompressionMethod::Deflated),
        zip_of(&members[..1], CompressionMethod::Stored),
    ]
}

/// A safetensors buffer with the given JSON header, unpadded, and data.
fn safetensors_with(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

/// A safetensors buffer or `.npy` array cut into its header and data (the parts [`framed`]
/// edits): the header length is a little-endian u64 at 0 (safetensors) or u16 at 8 (npy 1.0).
fn parts(seed: &[u8]) -> Vec<Vec<u8>> {
    let (len, start) = if seed.starts_with(b"\x93NUMPY") {
        (usize::from(u16::from_le_bytes([seed[8], seed[9]])), 10)
    } else {
        let len: [u8; 8] = seed[..8].try_into().unwrap();
        (usize::try_from(u64::from_le_bytes(len)).unwrap(), 8)
    };
    vec![
        seed[start..start + len].to_vec(),
        seed[start + len..].to_vec(),
    ]
}

/// Puts an edited safetensors header and its data back together, with the header's length.
fn frame_safetensors(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut b = (parts[0].len() as u64).to_le_bytes().to_vec();
    b.extend(&parts[0]);
    b.extend(&parts[1]);
    b
}

/// Puts an edited npy header and its data back together (format 1.0, or 2.0 when the header
/// outgrows a u16).
fn frame_npy(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut b = b"\x93NUMPY".to_vec();
    match u16::try_from(parts[0].len()) {
        Ok(len) => {
            b.extend([1, 0]);
            b.extend(len.to_le_bytes());
        }
        Err(_) => {
            b.extend([2, 0]);
            b.extend((parts[0].len() as u32).to_le_bytes());
        }
    }
    b.extend(&parts[0]);
    b.extend(&parts[1]);
    b
}

/// Zips edited npy headers and data (header, data, header, data...) as a stored npz.
fn frame_npz(parts: &[Vec<u8>]) -> Vec<u8> {
    let arrays: Vec<(String, Vec<u8>)> = parts
        .chunks(2)
        .enumerate()
        .map(|(i, pair)| (format!("layers.{i}.weight.npy"), frame_npy(pair)))
        .collect();
    let members: Vec<(&str, &[u8])> = arrays
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect();
    zip_of(&members, CompressionMethod::Stored)
}

/// `Record::decode` holds the cargo-fuzz target's property: a buffer that decodes re-encodes to
/// one that decodes to the same record, bit for bit.
fn record_round_trips(bytes: &[u8]) -> Result<(), TestCaseError> {
    let budget = if bytes.windows(14).any(|w| w == b"fedfuse.sparse") {
        SPARSE
    } else {
        PLAIN
    };
    let Ok(record) = within(budget, bytes.len(), || Record::decode(bytes))? else {
        return Ok(());
    };
    let again = Record::encode(&record)
        .map_err(|e| TestCaseError::fail(format!("a decoded record does not encode: {e}")))?;
    let back = Record::decode(&again)
        .map_err(|e| TestCaseError::fail(format!("a re-encoded record does not decode: {e}")))?;
    let bits = |p: &Params| -> Vec<(String, Vec<usize>, Vec<u32>)> {
        p.iter()
            .map(|(n, t)| {
                let bits = t.data.iter().map(|v| v.to_bits()).collect();
                (n.to_string(), t.shape.clone(), bits)
            })
            .collect()
    };
    prop_assert_eq!(bits(&back.params), bits(&record.params));
    prop_assert_eq!(&back.config, &record.config);
    prop_assert_eq!(&back.metrics, &record.metrics);
    prop_assert_eq!(back.num_examples, record.num_examples);
    prop_assert_eq!(back.sparse, record.sparse);
    Ok(())
}

/// Size fields: safetensors' header length (a u64 at 0).
const SAFETENSORS_FIELDS: &[usize] = &[0];
/// Size fields: the npy header length (a u16 at 8 in format 1, a u32 in format 2).
const NPY_FIELDS: &[usize] = &[8];
/// Size fields: the first zip member's compressed and uncompressed sizes, name and extra
/// lengths (a member's data follows its name: every npy header is past these).
const ZIP_FIELDS: &[usize] = &[18, 22, 26, 28];

/// Magics that get arbitrary bytes past the first check.
const MAGICS: &[&[u8]] = &[
    b"",
    b"PK\x03\x04",
    b"\x93NUMPY\x01\x00",
    b"\x93NUMPY\x02\x00",
    b"\x40\x00\x00\x00\x00\x00\x00\x00{\"",
    b"\x80\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\":{\"fedfuse.sparse\":\"1\"",
];

#[test]
fn record_decode_arbitrary_bytes() {
    fuzz(
        "record_decode_arbitrary_bytes",
        1000,
        arbitrary(MAGICS, 512),
        |b| record_round_trips(&b),
    );
}

#[test]
fn record_decode_mutated() {
    let seeds = prop_oneof![
        mutated(record_seeds(), SAFETENSORS_FIELDS, TOKENS),
        framed(
            record_seeds().iter().map(|s| parts(s)).collect(),
            TOKENS,
            frame_safetensors
        ),
    ];
    fuzz("record_decode_mutated", 2000, seeds, |b| {
        record_round_trips(&b)
    });
}

#[test]
fn safetensors_arbitrary_bytes() {
    fuzz(
        "safetensors_arbitrary_bytes",
        1000,
        arbitrary(MAGICS, 512),
        |b| within(PLAIN, b.len(), || params_from_safetensors(&b)).map(drop),
    );
}

#[test]
fn safetensors_mutated() {
    let seeds = prop_oneof![
        mutated(safetensors_seeds(), SAFETENSORS_FIELDS, TOKENS),
        framed(
            safetensors_seeds().iter().map(|s| parts(s)).collect(),
            TOKENS,
            frame_safetensors
        ),
    ];
    fuzz("safetensors_mutated", 2000, seeds, |b| {
        within(PLAIN, b.len(), || params_from_safetensors(&b)).map(drop)
    });
}

#[test]
fn npz_arbitrary_bytes() {
    fuzz("npz_arbitrary_bytes", 1000, arbitrary(MAGICS, 512), |b| {
        within(DEFLATED, b.len(), || params_from_npz(&b))?.ok();
        within(PLAIN, b.len(), || decode_npy_array(&b)).map(drop)
    });
}

#[test]
fn npz_mutated() {
    let arrays = vec![npy_seeds().iter().flat_map(|s| parts(s)).collect()];
    let seeds = prop_oneof![
        mutated(npz_seeds(), ZIP_FIELDS, TOKENS),
        framed(arrays, TOKENS, frame_npz),
    ];
    fuzz("npz_mutated", 1500, seeds, |b| {
        within(DEFLATED, b.len(), || params_from_npz(&b)).map(drop)
    });
}

#[test]
fn npy_mutated() {
    let seeds = prop_oneof![
        mutated(npy_seeds(), NPY_FIELDS, TOKENS),
        framed(
            npy_seeds().iter().map(|s| parts(s)).collect(),
            TOKENS,
            frame_npy
        ),
    ];
    fuzz("npy_mutated", 1500, seeds, |b| {
        within(PLAIN, b.len(), || decode_npy_array(&b)).map(drop)
    });
}

#[test]
fn safetensors_declaring_huge_sizes_is_refused() {
    let data = [0u8; 16];
    let cases = [
        // A header length of 2^40 bytes.
        {
            let mut b = (1u64 << 40).to_le_bytes().to_vec();
            b.extend(b"{}");
            b
        },
        // 2^40 values whose offsets run far past the buffer.
        safetensors_with(
            r#"{"w":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}}"#,
            &data,
        ),
        // 2^40 values claimed over 16 bytes.
        safetensors_with(
            r#"{"w":{"dtype":"F32","shape":[1048576,1048576],"data_offsets":[0,16]}}"#,
            &data,
        ),
        // A shape whose product overflows.
        safetensors_with(
            r#"{"w":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,16]}}"#,
            &data,
        ),
    ];
    for bytes in &cases {
        refused("safetensors", bytes, || params_from_safetensors(bytes));
        refused("record", bytes, || Record::decode(bytes));
    }
}

#[test]
fn sparse_record_declaring_huge_sizes_is_refused() {
    // A varint-coded blob of rank 1 with no stored values: the shape alone claims its size.
    let blob = |n: u64| {
        let mut b = vec![1u8, 1];
        let mut v = n;
        while v >= 0x80 {
            b.push((v as u8) | 0x80);
            v >>= 7;
        }
        b.push(v as u8);
        b.push(0);
        b
    };
    for n in [1u64 << 40, MAX_SPARSE_VALUES as u64 + 1, u64::MAX] {
        let blob = blob(n);
        let meta = HashMap::from([
            ("fedfuse.sparse".to_string(), "1".to_string()),
            ("fedfuse.order".to_string(), r#"["w"]"#.to_string()),
            ("fedfuse.config".to_string(), "{}".to_string()),
            ("fedfuse.metrics".to_string(), "{}".to_string()),
            ("fedfuse.num_examples".to_string(), "0".to_string()),
        ]);
        let view = TensorView::new(Dtype::U8, vec![blob.len()], &blob).unwrap();
        let bytes = safetensors::serialize(vec![("w", view)], Some(meta)).unwrap();
        refused("sparse record", &bytes, || Record::decode(&bytes));
    }
}

#[test]
fn npz_declaring_huge_sizes_is_refused() {
    let header = |shape: &str| {
        let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend(u16::try_from(h.len()).unwrap().to_le_bytes());
        b.extend(h.as_bytes());
        b.extend([0u8; 16]);
        b
    };
    let mut arrays = vec![
        header("(1099511627776,)"),
        header("(1048576, 1048576)"),
        header("(18446744073709551615, 2)"),
        // Format 2.0 with a header length of 2^32 - 1.
        b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}".to_vec(),
    ];
    for npy in &arrays {
        refused("npy", npy, || decode_npy_array(npy));
    }
    // The same arrays inside archives, and an archive whose member declares 4 GiB.
    let archives: Vec<Vec<u8>> = arrays
        .drain(..)
        .map(|npy| zip_of(&[("w.npy", &npy)], CompressionMethod::Deflated))
        .collect();
    let mut liar = zip_of(&[("w.npy", &npy_seeds()[0])], CompressionMethod::Stored);
    for (signature, offset) in [(0x0403_4b50u32, 22), (0x0201_4b50u32, 24)] {
        let sig = signature.to_le_bytes();
        let starts: Vec<usize> = (0..liar.len() - 4)
            .filter(|&i| liar[i..i + 4] == sig)
            .collect();
        for i in starts {
            liar[i + offset..i + offset + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }
    }
    for npz in &archives {
        refused("npz", npz, || params_from_npz(npz));
    }
    // A bomb: a member whose header declares a (2, 2) float32 array (16 bytes) but which
    // inflates to 256 MiB of zeros, from a 256 KB file. Refused within 1 MiB of heap.
    let mut bomb = encode_npy(&[2, 2], &[0.0; 4]).unwrap();
    bomb.resize(bomb.len() + (256 << 20), 0);
    let bomb = zip_of(&[("w.npy", &bomb)], CompressionMethod::Deflated);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    refused("npz bomb", &bomb, || params_from_npz(&bomb));
    // The declared size is no allocation: the stored member reads as the bytes it has.
    let (read, peak) = harness::peak_heap(|| params_from_npz(&liar));
    assert!(
        peak < 1 << 20,
        "{peak} heap bytes for a member declaring 4 GiB: {read:?}"
    );
}

/// `Record::from_flower` on what a hostile client could reply through the Flower strategy:
/// arrays whose bytes are mutated `.npy` arrays or sparse blobs, with any dtype, stype and
/// shape (huge axes included), and any metrics. Ok or Err, never a panic, within the plain
/// parsers' heap bound (sparse blobs may declare all-zero tensors up to their own ceiling).
#[test]
fn flower_content_mutated() {
    use fedfuse_core::flower::{FlowerArray, FlowerContent, MetricValue};
    use proptest::collection::vec;
    use proptest::sample::select;
    let sparse_blobs: Vec<Vec<u8>> = Record::from_params(params(true))
        .with_sparse(true)
        .to_flower()
        .unwrap()
        .arrays
        .into_iter()
        .map(|a| a.data)
        .collect();
    let mut seeds = npy_seeds();
    seeds.extend(sparse_blobs);
    let array = (
        select(vec![
            "float32",
            "float64",
            "float16",
            "int64",
            "",
            "f\n\u{1b}[2J",
        ]),
        vec(
            prop_oneof![0usize..6, Just(1usize << 40), Just(usize::MAX)],
            0..4,
        ),
        select(vec!["numpy.ndarray", "fedfuse.sparse.v1", "torch.Tensor"]),
        mutated(seeds, NPY_FIELDS, TOKENS),
    )
        .prop_map(|(dtype, shape, stype, data)| FlowerArray {
            key: "layers.0.weight".into(),
            dtype: dtype.into(),
            shape,
            stype: stype.into(),
            data,
        });
    let metric = (
        select(vec!["num-examples", "train_loss", "class_count.3"]),
        prop_oneof![
            any::<i64>().prop_map(MetricValue::Int),
            any::<f64>().prop_map(MetricValue::Float),
        ],
    )
        .prop_map(|(k, v)| (k.to_string(), v));
    let content = (vec(array, 0..3), vec(metric, 0..3));
    fuzz(
        "flower_content_mutated",
        1500,
        content,
        |(arrays, metrics)| {
            let len = arrays.iter().map(|a| a.data.len()).sum();
            let content = FlowerContent {
                arrays,
                config: Vec::new(),
                metrics,
            };
            within(SPARSE, len, || Record::from_flower(&content)).map(drop)
        },
    );
}

/// Issue 49: a model file is judged by its header before the rest is read. A 6 GB sparse file
/// whose header is not safetensors', or whose tensors end before it does, is refused after
/// reading its first bytes; a folder or a link to a device is refused before any read.
#[test]
fn model_files_are_refused_by_their_header_before_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let big = |name: &str, head: &[u8]| {
        let path = dir.path().join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(head).unwrap();
        f.set_len(6 << 30).unwrap();
        path
    };
    let garbage = big("garbage.safetensors", b"not a safetensors header at all");
    let header = b"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    let mut short = (header.len() as u64).to_le_bytes().to_vec();
    short.extend_from_slice(header);
    let short = big("short-data.safetensors", &short);
    for path in [&garbage, &short] {
        let start = std::time::Instant::now();
        let (out, peak) = harness::peak_heap(|| fedfuse_core::load_params(path));
        let e = out.unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert!(
            peak < 1 << 20,
            "{peak} heap bytes to refuse {}: {e}",
            path.display()
        );
        assert!(start.elapsed().as_secs() < 2, "{e}");
    }
    // A model file above the limit is refused by its size alone, whatever its header says.
    let npz = big("huge.npz", b"PK");
    std::fs::File::options()
        .write(true)
        .open(&npz)
        .unwrap()
        .set_len(fedfuse_core::MAX_FILE_BYTES + 1)
        .unwrap();
    let (out, peak) = harness::peak_heap(|| fedfuse_core::load_params(&npz));
    assert!(out.unwrap_err().to_string().contains("above the limit"));
    assert!(peak < 1 << 20);

    let folder = dir.path().join("model.safetensors");
    std::fs::create_dir(&folder).unwrap();
    let e = fedfuse_core::load_params(&folder).unwrap_err().to_string();
    assert!(e.contains("is a folder") && !e.contains("os error"), "{e}");
    #[cfg(unix)]
    {
        let zero = dir.path().join("zero.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = fedfuse_core::load_params(&zero).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
