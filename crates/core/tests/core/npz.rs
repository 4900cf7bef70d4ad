//! `.npz` input: archives written here byte by byte as numpy writes them, and archives written
//! by numpy itself (`tests/data`, made by `tests/data/make_fixtures.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use fedfuse_core::{Params, load_npz, load_params, params_from_npz, save_safetensors};
use proptest::prelude::*;
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

/// One `.npy` array as numpy writes it: format 1.0, a dict header padded with spaces to a
/// multiple of 64 bytes and ended by a newline, then the raw data.
fn npy(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let fortran = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend(u16::try_from(header.len()).unwrap().to_le_bytes());
    b.extend(header.as_bytes());
    b.extend(data);
    b
}

/// A zip archive of `(member name, bytes)`.
fn zip_of(members: &[(&str, Vec<u8>)], compressed: bool) -> Vec<u8> {
    let method = if compressed {
        CompressionMethod::Deflated
    } else {
        CompressionMethod::Stored
    };
    let options = SimpleFileOptions::default().compression_method(method);
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in members {
        zip.start_file(*name, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn le_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn tensor<'a>(p: &'a Params, name: &str) -> (&'a [usize], &'a [f32]) {
    let t = p.get(name).unwrap_or_else(|| panic!("no tensor `{name}`"));
    (&t.shape, &t.data)
}

#[test]
fn reads_every_float_dtype_and_byte_order() {
    let f64s: Vec<u8> = [1.5f64, -2.25, 1e-3]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    let f16s: Vec<u8> = [0.5f32, 3.0, -65504.0]
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let f32_be: Vec<u8> = [7.25f32].iter().flat_map(|v| v.to_be_bytes()).collect();
    let members = [
        (
            "w32.npy",
            npy("<f4", false, &[2, 2], &le_f32(&[1.0, -2.0, 0.1, 4.5])),
        ),
        ("w64.npy", npy(">f8", false, &[3, 1], &f64s)),
        ("w16.npy", npy("<f2", false, &[3], &f16s)),
        ("scalar.npy", npy(">f4", false, &[], &f32_be)),
        ("empty.npy", npy("<f4", false, &[0, 3], &[])),
    ];
    for compressed in [false, true] {
        let p = params_from_npz(&zip_of(&members, compressed)).unwrap();
        assert_eq!(tensor(&p, "w32"), (&[2, 2][..], &[1.0, -2.0, 0.1, 4.5][..]));
        assert_eq!(
            tensor(&p, "w64"),
            (&[3, 1][..], &[1.5, -2.25, 1e-3f64 as f32][..])
        );
        assert_eq!(tensor(&p, "w16"), (&[3][..], &[0.5, 3.0, -65504.0][..]));
        assert_eq!(tensor(&p, "scalar"), (&[][..], &[7.25][..]));
        assert_eq!(tensor(&p, "empty"), (&[0, 3][..], &[][..]));
    }
}

#[test]
fn fortran_order_is_transposed_to_row_major() {
    // [[1, 2, 3], [4, 5, 6]] column by column, as numpy stores an F-contiguous array.
    let f = npy(
        "<f4",
        true,
        &[2, 3],
        &le_f32(&[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]),
    );
    let p = params_from_npz(&zip_of(&[("w.npy", f)], true)).unwrap();
    assert_eq!(
        tensor(&p, "w"),
        (&[2, 3][..], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0][..])
    );
}

#[test]
fn names_are_ordered_naturally() {
    let one = |v: f32| npy("<f4", false, &[1], &le_f32(&[v]));
    let members = [
        ("layers.10.weight.npy", one(10.0)),
        ("layers.2.weight.npy", one(2.5)),
        ("layers.2.bias.npy", one(2.0)),
        ("layers.1.weight.npy", one(1.0)),
    ];
    let p = params_from_npz(&zip_of(&members, false)).unwrap();
    assert_eq!(
        p.names(),
        [
            "layers.1.weight",
            "layers.2.weight",
            "layers.2.bias",
            "layers.10.weight"
        ]
    );
}

/// The arrays of `tests/data/make_fixtures.py`.
fn check_numpy_fixture(p: &Params) {
    assert_eq!(
        p.names(),
        [
            "empty",
            "fortran",
            "scalar",
            "layers.2.weight",
            "layers.2.bias",
            "layers.10.weight"
        ]
    );
    assert_eq!(
        tensor(p, "layers.10.weight"),
        (&[2, 2][..], &[1.5, -2.25, 0.125, 4.0][..])
    );
    assert_eq!(
        tensor(p, "layers.2.weight"),
        (&[2, 3][..], &[1.0, 2.0, 3.0, -0.5, 1e-3f64 as f32, 6.0][..])
    );
    assert_eq!(
        tensor(p, "layers.2.bias"),
        (&[3][..], &[0.5, -1.0, 65504.0][..])
    );
    let arange: Vec<f32> = (0..24).map(|i| i as f32).collect();
    assert_eq!(tensor(p, "fortran"), (&[2, 3, 4][..], &arange[..]));
    assert_eq!(tensor(p, "scalar"), (&[][..], &[3.5][..]));
    assert_eq!(tensor(p, "empty"), (&[0, 3][..], &[][..]));
}

#[test]
fn reads_numpy_savez_and_savez_compressed() {
    check_numpy_fixture(&load_npz(&fixture("numpy_stored.npz")).unwrap());
    check_numpy_fixture(&load_npz(&fixture("numpy_compressed.npz")).unwrap());
    check_numpy_fixture(&load_params(&fixture("numpy_compressed.npz")).unwrap());
}

#[test]
fn integer_arrays_are_rejected_naming_file_and_array() {
    let path = fixture("numpy_int.npz");
    let err = load_npz(&path).unwrap_err().to_string();
    assert!(
        err.contains("`steps.npy`")
            && err.contains("numpy_int.npz")
            && err.contains("'<i8'")
            && err.contains("int64"),
        "{err}"
    );
    let bools = npy("|b1", false, &[2], &[0, 1]);
    let err = params_from_npz(&zip_of(&[("mask.npy", bools)], false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`mask.npy`") && err.contains("bool"), "{err}");
}

#[test]
fn malformed_archives_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = zip_of(
        &[("w.npy", npy("<f4", false, &[64], &le_f32(&[1.0; 64])))],
        true,
    );
    assert!(params_from_npz(&good).is_ok());
    // Every truncation of a valid archive is an error (never a panic).
    for len in 0..good.len() {
        assert!(params_from_npz(&good[..len]).is_err(), "{len} bytes");
    }
    let path = write(dir.path(), "cut.npz", &good[..good.len() / 2]);
    let err = load_npz(&path).unwrap_err().to_string();
    assert!(err.contains("cut.npz"), "{err}");

    let path = write(dir.path(), "text.npz", b"this is not a zip archive");
    let err = load_npz(&path).unwrap_err().to_string();
    assert!(
        err.contains("text.npz") && err.contains("npz archive"),
        "{err}"
    );

    // A member whose data is shorter than its shape, and one that is not an array.
    let short = npy("<f4", false, &[2, 3], &le_f32(&[1.0; 5]));
    let path = write(dir.path(), "short.npz", &zip_of(&[("w.npy", short)], false));
    let err = load_npz(&path).unwrap_err().to_string();
    assert!(
        err.contains("short.npz") && err.contains("`w.npy`") && err.contains("needs 24 bytes"),
        "{err}"
    );
    let err = params_from_npz(&zip_of(&[("notes.txt", b"hi".to_vec())], false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`notes.txt`") && err.contains(".npy"), "{err}");
    let err = params_from_npz(&zip_of(&[("w.npy", b"garbage".to_vec())], false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`w.npy`") && err.contains("magic"), "{err}");

    assert!(load_npz(&dir.path().join("missing.npz")).is_err());
}

#[test]
fn load_params_chooses_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Params::new();
    p.push("layers.0.weight", vec![1, 2], vec![0.5, -1.0])
        .unwrap();
    let st = dir.path().join("model.safetensors");
    save_safetensors(&p, &st).unwrap();
    assert_eq!(load_params(&st).unwrap(), p);
    let npz = write(
        dir.path(),
        "model.NPZ",
        &zip_of(
            &[(
                "layers.0.weight.npy",
                npy("<f4", false, &[1, 2], &le_f32(&[0.5, -1.0])),
            )],
            true,
        ),
    );
    assert_eq!(load_params(&npz).unwrap(), p);
    for name in ["model.pt", "model"] {
        let path = write(dir.path(), name, b"whatever");
        let err = load_params(&path).unwrap_err().to_string();
        assert!(
            err.contains(name) && err.contains(".safetensors") && err.contains(".npz"),
            "{err}"
        );
    }
    assert!(
        load_params(&dir.path().join("model.pt"))
            .unwrap_err()
            .to_string()
            .contains("`.pt`")
    );
}

/// A random float array: shape, dtype, byte order, memory order, and its row-major values
/// (each exactly representable in its dtype).
#[derive(Debug, Clone)]
struct Array {
    shape: Vec<usize>,
    size: usize,
    big_endian: bool,
    fortran: bool,
    values: Vec<f32>,
}

fn array() -> impl Strategy<Value = Array> {
    (
        prop::collection::vec(0usize..4, 0..4),
        prop::sample::select(vec![2usize, 4, 8]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(shape, size, big_endian, fortran)| {
            let n = shape.iter().product::<usize>();
            let value = (-1.0e4f32..1.0e4).prop_map(move |v| match size {
                2 => half::f16::from_f32(v).to_f32(),
                _ => v,
            });
            prop::collection::vec(value, n).prop_map(move |values| Array {
                shape: shape.clone(),
                size,
                big_endian,
                fortran,
                values,
            })
        })
}

impl Array {
    fn npy(&self) -> Vec<u8> {
        // Storage order: row-major, or column-major (first axis fastest) for Fortran.
        let mut order: Vec<usize> = (0..self.values.len()).collect();
        if self.fortran {
            let col_major_key = |&i: &usize| {
                let mut key = Vec::new();
                let mut rest = i;
                for &d in self.shape.iter().rev() {
                    key.push(rest % d);
                    rest /= d;
                }
                key // last axis first: sorting by it makes the first axis fastest
            };
            order.sort_by_key(col_major_key);
        }
        let mut data = Vec::new();
        for i in order {
            let v = self.values[i];
            match (self.size, self.big_endian) {
                (2, false) => data.extend(half::f16::from_f32(v).to_le_bytes()),
                (2, true) => data.extend(half::f16::from_f32(v).to_be_bytes()),
                (4, false) => data.extend(v.to_le_bytes()),
                (4, true) => data.extend(v.to_be_bytes()),
                (_, false) => data.extend(f64::from(v).to_le_bytes()),
                (_, true) => data.extend(f64::from(v).to_be_bytes()),
            }
        }
        let descr = format!("{}f{}", if self.big_endian { '>' } else { '<' }, self.size);
        npy(&descr, self.fortran, &self.shape, &data)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_archives_read_back_equal(
        arrays in prop::collection::vec(array(), 0..5),
        compressed in any::<bool>(),
    ) {
        let names: Vec<String> = (0..arrays.len()).map(|i| format!("layers.{i}.weight")).collect();
        let members: Vec<(String, Vec<u8>)> = names
            .iter()
            .zip(&arrays)
            .map(|(n, a)| (format!("{n}.npy"), a.npy()))
            .rev()
            .collect();
        let members: Vec<(&str, Vec<u8>)> =
            members.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        let p = params_from_npz(&zip_of(&members, compressed)).unwrap();
        prop_assert_eq!(p.names(), &names[..]);
        for (name, a) in names.iter().zip(&arrays) {
            prop_assert_eq!(tensor(&p, name), (&a.shape[..], &a.values[..]));
        }
    }
}

/// `archive` with every declared uncompressed size (local and central headers) set to `size`.
fn declaring(mut archive: Vec<u8>, size: u32) -> Vec<u8> {
    for (signature, offset) in [(0x0403_4b50u32, 22), (0x0201_4b50u32, 24)] {
        let sig = signature.to_le_bytes();
        let starts: Vec<usize> = archive
            .windows(4)
            .enumerate()
            .filter(|(_, w)| *w == sig)
            .map(|(i, _)| i)
            .collect();
        for i in starts {
            archive[i + offset..i + offset + 4].copy_from_slice(&size.to_le_bytes());
        }
    }
    archive
}

#[test]
fn a_zip_bomb_is_inflated_no_further_than_it_declares() {
    // 64 MiB of zeros behind a valid array header, the zip entry declaring 200 bytes: reading
    // stops at the array header's 8 bytes, before the zip reader's own size check.
    let mut payload = npy("<f4", false, &[2], &le_f32(&[1.0, 2.0]));
    payload.resize(payload.len() + (64 << 20), 0);
    let bomb = declaring(zip_of(&[("w.npy", payload)], true), 200);
    let e = params_from_npz(&bomb).unwrap_err().to_string();
    assert!(
        e.contains("w.npy") && e.contains("more data than its header declares (8 bytes)"),
        "{e}"
    );
}

#[test]
fn a_zip_bomb_member_is_refused_by_its_declared_size() {
    // A (2, 2) float32 header followed by 64 MiB of zeros, deflated to about 64 KB: the
    // member declares 16 bytes of data. Reading stops 17 bytes in (the allocation bound is
    // the unit test `a_member_reads_no_more_than_its_header_declares`).
    let mut bomb = npy("<f4", false, &[2, 2], &[0u8; 16]);
    bomb.resize(bomb.len() + (64 << 20), 0);
    let npz = zip_of(&[("layers.0.weight.npy", bomb)], true);
    assert!(npz.len() < 1 << 20, "{} bytes", npz.len());
    let e = params_from_npz(&npz).unwrap_err().to_string();
    assert!(
        e.contains("layers.0.weight.npy") && e.contains("more data than its header declares"),
        "{e}"
    );
}

#[test]
fn members_sharing_bytes_are_refused_before_inflating() {
    let a = npy("<f4", false, &[1], &le_f32(&[1.0]));
    let b = npy("<f4", false, &[1], &le_f32(&[2.0]));
    let mut npz = zip_of(&[("a.npy", a), ("b.npy", b)], false);
    assert_eq!(params_from_npz(&npz).unwrap().len(), 2);
    // The second central-directory entry (signature PK\x01\x02) points at the first local
    // header: both names read one stream, as an overlapping-member zip bomb does.
    let sig = 0x0201_4b50u32.to_le_bytes();
    let entries: Vec<usize> = (0..npz.len() - 4)
        .filter(|&i| npz[i..i + 4] == sig)
        .collect();
    assert_eq!(entries.len(), 2);
    npz[entries[1] + 42..entries[1] + 46].copy_from_slice(&0u32.to_le_bytes());
    let e = params_from_npz(&npz).unwrap_err().to_string();
    assert!(e.contains("overlap"), "{e}");
}
