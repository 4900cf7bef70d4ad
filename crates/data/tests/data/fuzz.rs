//! Fuzzing the file parsers of fedfuse-data: IDX, CIFAR-10 and CIFAR-100 (binary files and the
//! tar archives `load_dataset` unpacks), CSV and the CDC zip.
//!
//! Each parser gets arbitrary bytes (some behind a valid magic or header) and valid files
//! mutated: bit flips, truncation, insertions, removals, tokens, numbers and size fields
//! overwritten with huge values, gzip around the result or not. The property: `Ok` or `Err`,
//! never a panic, and a heap peak within a bound proportional to the file (deflate's most
//! expansion for gzip and zip files). Headers declaring 2^40 elements are refused, fast and
//! without allocating for them. The parsers read paths: each case writes its bytes to a file.
//!
//! Cases per test: `PROPTEST_CASES` when set, else a CI-sized default (a few thousand per
//! parser); `scripts/fuzz.sh` runs a million. Each test prints its case count and heap peak
//! (`--nocapture`).

#[path = "../../../core/tests/core/fuzz/harness.rs"]
mod harness;

use std::io::Write;
use std::path::Path;

use fedfuse_data::{
    CIFAR100_COARSE_OF_FINE, CdcOptions, CdcSplit, Cifar100Label, ColumnRef, CsvOptions,
    LabelColumn, load_cdc, load_dataset, read_cifar10_batch, read_cifar100, read_csv_table,
    read_idx_images, read_idx_labels, write_idx,
};
use harness::{Budget, arbitrary, framed, fuzz, mutated, refused, within};
use proptest::prelude::*;
use proptest::strategy::Union;
use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

/// What a parser of an uncompressed file may hold: the file, its fields as strings, its
/// samples as f32 (CSV's one-hot columns grow as rows times categories, small here).
const PLAIN: Budget = Budget {
    per_byte: 256,
    slack: 1 << 20,
};

/// A CSV file's integer labels up to 65,535 are class ids, each named: one such label costs
/// some 2 MB of class names.
const CSV: Budget = Budget {
    per_byte: 256,
    slack: 4 << 20,
};

/// A gzip or zip file may inflate to 1032 bytes per compressed byte (deflate's most), held
/// while its buffer grows, then as f32 samples.
const DEFLATED: Budget = Budget {
    per_byte: 16 * 1032,
    slack: 1 << 20,
};

/// The budget of a file: `plain`'s, or deflate's for gzip and zip files.
fn budget(bytes: &[u8], plain: Budget) -> Budget {
    if bytes.starts_with(&[0x1f, 0x8b]) || bytes.starts_with(b"PK") {
        Budget {
            slack: DEFLATED.slack.max(plain.slack),
            ..DEFLATED
        }
    } else {
        plain
    }
}

/// A scratch folder for the files the cases write, in memory where the system has a place for
/// it (`/dev/shm`): rewriting a file on ext4 flushes it to disk (`auto_da_alloc`), which makes
/// a case some ninety times slower.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    shm.is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten()
        .unwrap_or_else(|| tempfile::tempdir().unwrap())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// `bytes`, gzip-compressed when `gz` is set.
fn maybe_gzip((bytes, gz): (Vec<u8>, bool)) -> Vec<u8> {
    if gz { gzip(&bytes) } else { bytes }
}

/// Writes `bytes` to `path` and runs `parse` on it within `plain`, or deflate's budget when
/// the file is compressed.
fn parse_file<T, E>(
    path: &Path,
    bytes: &[u8],
    plain: Budget,
    parse: impl FnOnce() -> Result<T, E>,
) -> Result<Result<T, E>, TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    within(budget(bytes, plain), bytes.len(), parse)
}

/// Tokens spliced into text files.
const TOKENS: &[&str] = &[
    ",",
    ";",
    "\t",
    "\"",
    "\"\"",
    "\n",
    "\r\n",
    " ",
    "=",
    "-",
    ".",
    "e",
    "nan",
    "inf",
    "-inf",
    "1e39",
    "-0",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "\u{feff}",
    "é",
    "\0",
    "\u{fffd}",
];

/// The IDX type code and number of dimensions (bytes 2 and 3) and the first three
/// dimensions (big-endian u32 at 4, 8, 12).
const IDX_FIELDS: &[usize] = &[2, 3, 4, 8, 12];

fn idx_seeds() -> Vec<Vec<u8>> {
    let pixels: Vec<u8> = (0..12).collect();
    let raw = vec![
        write_idx(&[2, 2, 3], &pixels),
        write_idx(&[4], &[3, 1, 4, 1]),
        write_idx(&[0, 28, 28], &[]),
    ];
    let gz: Vec<Vec<u8>> = raw.iter().map(|b| gzip(b)).collect();
    raw.into_iter().chain(gz).collect()
}

/// Both IDX readers on one file.
fn read_idx(path: &Path, bytes: &[u8]) -> Result<(), TestCaseError> {
    parse_file(path, bytes, PLAIN, || read_idx_images(path))?.ok();
    parse_file(path, bytes, PLAIN, || read_idx_labels(path))?.ok();
    Ok(())
}

#[test]
fn idx_arbitrary_bytes() {
    let dir = scratch();
    let path = dir.path().join("idx");
    let magics: &[&[u8]] = &[
        b"",
        b"\0\0\x08\x03",
        b"\0\0\x08\x01",
        b"\0\0\x08\x03\0\0\0\x01",
    ];
    let bytes = (arbitrary(magics, 256), any::<bool>()).prop_map(maybe_gzip);
    fuzz("idx_arbitrary_bytes", 1500, bytes, |b| read_idx(&path, &b));
}

#[test]
fn idx_mutated() {
    let dir = scratch();
    let path = dir.path().join("idx");
    let bytes = (mutated(idx_seeds(), IDX_FIELDS, TOKENS), any::<bool>()).prop_map(maybe_gzip);
    fuzz("idx_mutated", 2500, bytes, |b| read_idx(&path, &b));
}

#[test]
fn idx_declaring_huge_sizes_is_refused() {
    let dir = scratch();
    let path = dir.path().join("idx");
    let big = [1 << 20, 1 << 10, 1 << 10];
    for bytes in [
        write_idx(&big, &[0; 64]),
        gzip(&write_idx(&big, &[0; 64])),
        write_idx(&[u32::MAX; 3], &[0; 64]),
        gzip(&write_idx(&[u32::MAX; 3], &[])),
        write_idx(&[1 << 30], &[0; 64]),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        refused("IDX images", &bytes, || read_idx_images(&path));
        refused("IDX labels", &bytes, || read_idx_labels(&path));
    }
}

/// One CIFAR-10 record per label: the label byte, then 3072 pixels.
fn cifar_batch(records: usize, seed: u8) -> Vec<u8> {
    let mut b = Vec::with_capacity(records * 3073);
    for i in 0..records {
        b.push((i as u8 + seed) % 10);
        b.extend((0..3072).map(|j| (i * 31 + j * 7 + usize::from(seed)) as u8));
    }
    b
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

const CIFAR_BATCHES: [&str; 6] = [
    "data_batch_1.bin",
    "data_batch_2.bin",
    "data_batch_3.bin",
    "data_batch_4.bin",
    "data_batch_5.bin",
    "test_batch.bin",
];

/// The official archive's layout, one record per batch.
fn cifar_tar() -> Vec<u8> {
    let mut tar = tar_entry("cifar-10-batches-bin/readme.html", b"<html></html>");
    for (i, name) in CIFAR_BATCHES.iter().enumerate() {
        tar.extend(tar_entry(
            &format!("cifar-10-batches-bin/{name}"),
            &cifar_batch(1, i as u8),
        ));
    }
    tar.extend([0u8; 1024]);
    tar
}

/// Size and type fields of the first tar entries (each entry of a batch spans 4096 bytes).
const TAR_FIELDS: &[usize] = &[124, 130, 156, 512 + 124, 512 + 156, 1024 + 4096 + 124];

/// `load_dataset("cifar10")` on a folder holding only `archive`: unpacks it, then reads the
/// batches.
fn load_cifar_archive(dir: &Path, archive: &[u8]) -> Result<(), TestCaseError> {
    let unpacked = dir.join("cifar-10-batches-bin");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked).unwrap();
    }
    let path = dir.join("cifar-10-binary.tar.gz");
    parse_file(&path, archive, PLAIN, || load_dataset("cifar10", Some(dir)))?.ok();
    Ok(())
}

#[test]
fn cifar_arbitrary_bytes() {
    let dir = scratch();
    let batch = dir.path().join("batch.bin");
    let header = &tar_entry("cifar-10-batches-bin/test_batch.bin", &[0; 3073])[..512];
    let magics: &[&[u8]] = &[b"", &[3], header];
    let bytes = (arbitrary(magics, 1024), any::<bool>()).prop_map(maybe_gzip);
    fuzz("cifar_arbitrary_bytes", 1000, bytes, |b| {
        parse_file(&batch, &b, PLAIN, || read_cifar10_batch(&batch))?.ok();
        load_cifar_archive(dir.path(), &b)
    });
}

#[test]
fn cifar_batch_mutated() {
    let dir = scratch();
    let path = dir.path().join("batch.bin");
    let seeds = vec![
        cifar_batch(1, 0),
        cifar_batch(2, 9),
        gzip(&cifar_batch(2, 3)),
    ];
    let bytes = (mutated(seeds, &[0, 3073], TOKENS), any::<bool>()).prop_map(maybe_gzip);
    fuzz("cifar_batch_mutated", 1000, bytes, |b| {
        parse_file(&path, &b, PLAIN, || read_cifar10_batch(&path)).map(drop)
    });
}

#[test]
fn cifar_tar_mutated() {
    let dir = scratch();
    let seeds = vec![cifar_tar(), gzip(&cifar_tar())];
    let bytes = (mutated(seeds, TAR_FIELDS, TOKENS), any::<bool>()).prop_map(maybe_gzip);
    fuzz("cifar_tar_mutated", 1000, bytes, |b| {
        load_cifar_archive(dir.path(), &b)
    });
}

#[test]
fn cifar_tar_declaring_huge_sizes_is_refused() {
    let dir = scratch();
    // An entry declaring 64 GiB (the largest 11-digit octal size) over 512 bytes.
    let mut tar = tar_entry("cifar-10-batches-bin/data_batch_1.bin", &[0; 512]);
    tar[124..136].copy_from_slice(b"77777777777\0");
    for bytes in [tar.clone(), gzip(&tar)] {
        let unpacked = dir.path().join("cifar-10-batches-bin");
        if unpacked.exists() {
            std::fs::remove_dir_all(&unpacked).unwrap();
        }
        let path = dir.path().join("cifar-10-binary.tar.gz");
        std::fs::write(&path, &bytes).unwrap();
        refused("CIFAR-10 archive", &bytes, || {
            load_dataset("cifar10", Some(dir.path()))
        });
    }
}

/// CIFAR-100 records: the coarse label (the fine label's superclass), the fine label, 3072
/// pixels.
fn cifar100_file(records: usize, seed: u8) -> Vec<u8> {
    let mut b = Vec::with_capacity(records * 3074);
    for i in 0..records {
        let fine = ((i * 37 + usize::from(seed)) % 100) as u8;
        b.extend([CIFAR100_COARSE_OF_FINE[usize::from(fine)], fine]);
        b.extend((0..3072).map(|j| (i * 29 + j * 5 + usize::from(seed)) as u8));
    }
    b
}

/// `cifar-100-binary.tar.gz`'s layout, a record or two per file.
fn cifar100_tar() -> Vec<u8> {
    let mut tar = tar_entry("cifar-100-binary/fine_label_names.txt", b"apple\n");
    tar.extend(tar_entry("cifar-100-binary/test.bin", &cifar100_file(1, 3)));
    tar.extend(tar_entry(
        "cifar-100-binary/train.bin",
        &cifar100_file(2, 60),
    ));
    tar.extend([0u8; 1024]);
    tar
}

/// Size and type fields of the first tar entries, and the label bytes of the first record.
const TAR100_FIELDS: &[usize] = &[124, 156, 1024 + 124, 1024 + 156, 1536, 1537];

#[test]
fn cifar_100_file_mutated() {
    let dir = scratch();
    let path = dir.path().join("train.bin");
    let seeds = vec![
        cifar100_file(1, 0),
        cifar100_file(2, 42),
        gzip(&cifar100_file(2, 7)),
    ];
    let bytes = (mutated(seeds, &[0, 1, 3074, 3075], TOKENS), any::<bool>()).prop_map(maybe_gzip);
    fuzz("cifar_100_file_mutated", 1000, bytes, |b| {
        parse_file(&path, &b, PLAIN, || {
            read_cifar100(&path, Cifar100Label::Fine)
        })
        .map(drop)
    });
}

#[test]
fn cifar_100_tar_mutated() {
    let dir = scratch();
    let seeds = vec![cifar100_tar(), gzip(&cifar100_tar())];
    let bytes = (mutated(seeds, TAR100_FIELDS, TOKENS), any::<bool>()).prop_map(maybe_gzip);
    fuzz("cifar_100_tar_mutated", 1000, bytes, |b| {
        let unpacked = dir.path().join("cifar-100-binary");
        if unpacked.exists() {
            std::fs::remove_dir_all(&unpacked).unwrap();
        }
        let path = dir.path().join("cifar-100-binary.tar.gz");
        parse_file(&path, &b, PLAIN, || {
            load_dataset("cifar100", Some(dir.path()))
        })?
        .ok();
        Ok(())
    });
}

/// CSV files and the options they are read with.
fn csv_seeds() -> Vec<(Vec<u8>, CsvOptions)> {
    let opts = |has_header, label_column, categorical: &[&str], delimiter| CsvOptions {
        has_header,
        label_column,
        categorical: categorical.iter().map(|&c| ColumnRef::from(c)).collect(),
        delimiter,
    };
    let seeds = [
        (
            "a,b,y\n1,x,0\n\n2,z,1\n3,x,2\n",
            opts(true, LabelColumn::Last, &["b"], b','),
        ),
        (
            "sepal,petal,species\n5.1,3.5,setosa\n4.9,3.0,versicolor\n6.2,2.9,virginica\n",
            opts(true, LabelColumn::Name("species".into()), &[], b','),
        ),
        (
            "\"a\",\"b c\",y\n\"1.5\", \"x,y\" ,2\n-3e2,\"q\"\"r\",0\n",
            opts(true, LabelColumn::Index(2), &["b c"], b','),
        ),
        (
            "1;2;0\r\n3;4;1\r\n",
            opts(false, LabelColumn::Last, &[], b';'),
        ),
        (
            "y\tx\n7\t0.5\n3\t-1\n",
            opts(true, LabelColumn::Index(0), &[], b'\t'),
        ),
    ];
    let mut seeds: Vec<(Vec<u8>, CsvOptions)> = seeds
        .into_iter()
        .map(|(text, opts)| (text.as_bytes().to_vec(), opts))
        .collect();
    seeds.push((gzip(&seeds[0].0), seeds[0].1.clone()));
    seeds
}

/// CSV options worth varying: header or not, label by index or name, categorical columns,
/// delimiter.
fn csv_options() -> impl Strategy<Value = CsvOptions> {
    let label = prop_oneof![
        Just(LabelColumn::Last),
        (0usize..4).prop_map(LabelColumn::Index),
        prop_oneof![Just("y"), Just("species"), Just("a")]
            .prop_map(|n| LabelColumn::Name(n.to_string())),
    ];
    let categorical = proptest::collection::vec(
        prop_oneof![
            (0usize..4).prop_map(ColumnRef::Index),
            prop_oneof![Just("b"), Just("petal"), Just("b c")].prop_map(ColumnRef::from),
        ],
        0..3,
    );
    let delimiter = prop_oneof![Just(b','), Just(b';'), Just(b'\t'), Just(b'"'), any::<u8>()];
    (any::<bool>(), label, categorical, delimiter).prop_map(
        |(has_header, label_column, categorical, delimiter)| CsvOptions {
            has_header,
            label_column,
            categorical,
            delimiter,
        },
    )
}

#[test]
fn csv_arbitrary_bytes() {
    let dir = scratch();
    let path = dir.path().join("t.csv");
    // Arbitrary text as well as arbitrary bytes: most bytes are not UTF-8.
    let text = "[a-z0-9,;\"\\t\\r\\n .e+-]{0,300}".prop_map(String::into_bytes);
    let bytes = prop_oneof![arbitrary(&[b""], 300), text];
    fuzz(
        "csv_arbitrary_bytes",
        1500,
        ((bytes, any::<bool>()).prop_map(maybe_gzip), csv_options()),
        |(b, opts)| parse_file(&path, &b, CSV, || read_csv_table(&path, &opts)).map(drop),
    );
}

#[test]
fn csv_mutated() {
    let dir = scratch();
    let path = dir.path().join("t.csv");
    // Each file mutated, read mostly with its own options, sometimes with others.
    let cases = Union::new(csv_seeds().into_iter().map(|(bytes, opts)| {
        let bytes = (mutated(vec![bytes], &[0], TOKENS), any::<bool>()).prop_map(maybe_gzip);
        let opts = prop_oneof![3 => Just(opts), 1 => csv_options()];
        (bytes, opts).boxed()
    }));
    fuzz("csv_mutated", 2500, cases, |(b, opts)| {
        parse_file(&path, &b, CSV, || read_csv_table(&path, &opts)).map(drop)
    });
}

#[test]
fn csv_declaring_huge_class_ids_is_bounded() {
    let dir = scratch();
    let path = dir.path().join("t.csv");
    // Integer labels are class ids: one of 2^32 - 1 must not make 2^32 class names.
    for label in ["4294967295", "1000000"] {
        let text = format!("a,y\n1,0\n2,{label}\n");
        std::fs::write(&path, &text).unwrap();
        let (table, peak) = harness::peak_heap(|| read_csv_table(&path, &CsvOptions::default()));
        assert!(peak < 1 << 20, "{peak} heap bytes for a label {label}");
        let table = table.unwrap();
        assert_eq!(table.class_names, ["0", label]);
        assert_eq!(table.dataset.y, [0, 1]);
    }
}

const CDC_HEADER: &str = "mager,mrace6,meduc,revis,dplural,sex,combgest,brthwgt,aged,ucod,wic,\
                          restatus,dob_mm,dmar,tbo_rec,cig_rec";

/// The NBER CSV's columns (fedfuse's part of them), a row of each client and of each kind of
/// missing value.
fn cdc_text() -> String {
    let rows = [
        "25,1,3,10,1,M,39,3200,5,P072,N,1,3,1,2,N",
        "31,2,6,12,2,F,37,2800,40,R95,Y,2,8,2,1,Y",
        "19,6,2,99,3,U,33,9999,400,Q211,U,3,12,,9,U",
        "44,4,8,7,1,F,41,4100,0,W75,0,4,1,1,3,N",
        "\"28\",\"5\",\"4\",\"9\",\"1\",\"M\",\"40\",\"3500\",\"2\",\"J189\",\"N\",\"1\",\"6\",\"1\",\"1\",\"N\"",
    ];
    format!("{CDC_HEADER}\n{}\n", rows.join("\n"))
}

fn cdc_zip(text: &[u8], method: CompressionMethod) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(method);
    z.start_file("linkco2015usnum.csv", opts).unwrap();
    z.write_all(text).unwrap();
    z.finish().unwrap().into_inner()
}

fn frame_cdc_zip(parts: &[Vec<u8>]) -> Vec<u8> {
    cdc_zip(&parts[0], CompressionMethod::Stored)
}

fn frame_cdc_csv(parts: &[Vec<u8>]) -> Vec<u8> {
    parts[0].clone()
}

/// The zip's first member: compressed and uncompressed sizes, name and extra lengths.
const ZIP_FIELDS: &[usize] = &[18, 22, 26, 28];

fn cdc_options() -> impl Strategy<Value = CdcOptions> {
    prop_oneof![
        Just(CdcOptions::default()),
        Just(CdcOptions::new(CdcSplit::ResidenceStatus)),
        Just(CdcOptions::new(CdcSplit::BirthQuarter)),
    ]
}

/// `load_cdc` on a file holding `bytes`, and the tables' helpers on what it loads.
fn read_cdc(path: &Path, bytes: &[u8], opts: &CdcOptions) -> Result<(), TestCaseError> {
    if let Ok(data) = parse_file(path, bytes, PLAIN, || load_cdc(path, opts))? {
        prop_assert!(!data.describe().is_empty());
        within(budget(bytes, PLAIN), bytes.len(), || data.pooled())?.ok();
    }
    Ok(())
}

#[test]
fn cdc_arbitrary_bytes() {
    let dir = scratch();
    let path = dir.path().join("cdc.zip");
    let header = format!("{CDC_HEADER}\n");
    let magics = [b"".as_slice(), b"PK\x03\x04", header.as_bytes()];
    let bytes = (arbitrary(&magics, 512), any::<bool>()).prop_map(maybe_gzip);
    fuzz(
        "cdc_arbitrary_bytes",
        1500,
        (bytes, cdc_options()),
        |(b, opts)| read_cdc(&path, &b, &opts),
    );
}

#[test]
fn cdc_mutated() {
    let dir = scratch();
    let path = dir.path().join("cdc.zip");
    let text = cdc_text().into_bytes();
    let zips = vec![
        cdc_zip(&text, CompressionMethod::Stored),
        cdc_zip(&text, CompressionMethod::Deflated),
        gzip(&text),
    ];
    let bytes = prop_oneof![
        mutated(zips, ZIP_FIELDS, TOKENS),
        framed(vec![vec![text.clone()]], TOKENS, frame_cdc_zip),
        framed(vec![vec![text]], TOKENS, frame_cdc_csv),
    ];
    fuzz("cdc_mutated", 2500, (bytes, cdc_options()), |(b, opts)| {
        read_cdc(&path, &b, &opts)
    });
}

#[test]
fn cdc_zip_declaring_huge_sizes_is_bounded() {
    let dir = scratch();
    let path = dir.path().join("cdc.zip");
    // The member's sizes in both headers overwritten with 4 GiB - 1.
    let mut liar = cdc_zip(cdc_text().as_bytes(), CompressionMethod::Stored);
    for (signature, offsets) in [(0x0403_4b50u32, [18, 22]), (0x0201_4b50u32, [20, 24])] {
        let sig = signature.to_le_bytes();
        let starts: Vec<usize> = (0..liar.len() - 4)
            .filter(|&i| liar[i..i + 4] == sig)
            .collect();
        for i in starts {
            for o in offsets {
                liar[i + o..i + o + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            }
        }
    }
    std::fs::write(&path, &liar).unwrap();
    let (read, peak) = harness::peak_heap(|| load_cdc(&path, &CdcOptions::default()));
    assert!(peak < 1 << 20, "{peak} heap bytes: {read:?}");
}

/// Issue 49: a CIFAR file larger than any real one is refused by its size or record count,
/// before the records are held: a sparse 2 GB batch, a 2 GB CIFAR-100 file, and a gzip batch
/// that inflates to 1 GB of valid records. Each is refused with heap far below its size.
#[test]
fn cifar_files_beyond_their_record_count_are_refused_without_holding_them() {
    let dir = scratch();
    let sparse = |name: &str, len: u64| {
        let path = dir.path().join(name);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(len).unwrap();
        path
    };
    // Whole records of label 0 and black pixels: only the count is wrong.
    let batch = sparse("data_batch_1.bin", 3073 * 700_000);
    let (out, peak) = harness::peak_heap(|| read_cifar10_batch(&batch));
    let e = out.unwrap_err().to_string();
    assert!(e.contains("700000 records") && e.contains("10000"), "{e}");
    assert!(peak < 1 << 20, "{peak} heap bytes to refuse a 2 GB batch");

    let train = sparse("train.bin", 3074 * 700_000);
    let (out, peak) = harness::peak_heap(|| read_cifar100(&train, Cifar100Label::Fine));
    let e = out.unwrap_err().to_string();
    assert!(e.contains("50000"), "{e}");
    assert!(
        peak < 1 << 20,
        "{peak} heap bytes to refuse a 2 GB train.bin"
    );

    // 10,001 valid records (label 0, coarse 4 for fine 0 in CIFAR-100) inflate past the count.
    let record = |labels: &[u8]| {
        let mut r = labels.to_vec();
        r.resize(labels.len() + 3072, 0);
        r
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let one = record(&[0]);
    for _ in 0..10_001 {
        gz.write_all(&one).unwrap();
    }
    let bomb = dir.path().join("bomb.bin");
    std::fs::write(&bomb, gz.finish().unwrap()).unwrap();
    let (out, peak) = harness::peak_heap(|| read_cifar10_batch(&bomb));
    let e = out.unwrap_err().to_string();
    assert!(e.contains("more than 10000 records"), "{e}");
    assert!(
        !e.contains("download it again"),
        "too large is not corrupt: {e}"
    );
    assert!(
        peak < 1 << 20,
        "{peak} heap bytes to refuse an inflating batch"
    );

    // A link to a device is refused, not read.
    #[cfg(unix)]
    {
        let zero = dir.path().join("zero.bin");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_cifar10_batch(&zero).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
