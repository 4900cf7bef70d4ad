//! Flower Datasets' `flwrlabs/femnist`: Parquet files of one row per image, with the columns
//! `image` (a struct of the PNG's `bytes` and its `path`), `writer_id` (a string), `hsf_id`
//! (NIST's collection) and `character` (the class, `0..62` in LEAF's order). The images are
//! 28x28 8-bit grey PNGs. The dataset is published as one `train` split; files named
//! `test-*.parquet` beside them are read as the test split.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Type as Physical;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use parquet::schema::types::{SchemaDescriptor, Type};

use super::{FEMNIST_CLASSES, FEMNIST_PIXELS, ParquetFiles, Samples, assemble};
use crate::dataset::TrainTest;
use crate::error::{DataError, Result};

/// The largest Parquet file read (`flwrlabs/femnist`'s are about 200 MB together).
pub const MAX_PARQUET_FILE_BYTES: u64 = 4 << 30;
/// The most images read in all (`flwrlabs/femnist` has 814,277): 6 GiB of pixels as `f32`.
pub const MAX_FEMNIST_IMAGES: usize = 2_000_000;
/// The largest footer (the file's metadata) read; a few kB in `flwrlabs/femnist`.
const MAX_FOOTER_BYTES: u64 = 64 << 20;
/// The largest column chunk a row group may declare, compressed or not.
const MAX_CHUNK_BYTES: i64 = 1 << 30;
/// The largest PNG decoded: a 28x28 grey image takes a few hundred bytes.
const MAX_PNG_BYTES: usize = 1 << 16;
/// The longest writer id (`flwrlabs/femnist`'s have 8 characters).
const MAX_WRITER_BYTES: usize = 256;
/// Without a test split, each writer's every tenth image is held out (LEAF's `-t sample`
/// keeps 90% of each writer's samples for training).
const HOLD_OUT_EVERY: usize = 10;

/// Reads FEMNIST from Flower Datasets' Parquet files: every file of each split, in name
/// order, rows in file order. Without test files, each writer's every tenth image (its
/// 10th, 20th, ... in file order) is the test split. Errors name the file, the row and what
/// is wrong: a file or footer over its bound, a missing column or one of another type, a null,
/// an image that is not a 28x28 8-bit grey PNG, a label outside `0..62`.
pub fn read_parquet_femnist(files: &ParquetFiles) -> Result<TrainTest> {
    let mut train = Samples::default();
    for path in &files.train {
        read_file(path, &mut train)?;
    }
    let test = if files.test.is_empty() {
        hold_out(&mut train)
    } else {
        let mut test = Samples::default();
        for path in &files.test {
            read_file(path, &mut test)?;
        }
        test
    };
    assemble(train, test)
}

/// Moves each writer's every [`HOLD_OUT_EVERY`]th sample out of `train`; returns them.
fn hold_out(train: &mut Samples) -> Samples {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let held: Vec<bool> = train
        .writers
        .iter()
        .map(|w| {
            let k = seen.entry(w.as_str()).or_default();
            *k += 1;
            k.is_multiple_of(HOLD_OUT_EVERY)
        })
        .collect();
    let mut test = Samples::default();
    let mut kept = 0;
    for (i, &out) in held.iter().enumerate() {
        let pixels = i * FEMNIST_PIXELS..(i + 1) * FEMNIST_PIXELS;
        if out {
            test.x.extend_from_slice(&train.x[pixels]);
            test.y.push(train.y[i]);
            test.writers.push(train.writers[i].clone());
        } else {
            train.x.copy_within(pixels, kept * FEMNIST_PIXELS);
            train.y[kept] = train.y[i];
            train.writers.swap(kept, i);
            kept += 1;
        }
    }
    train.x.truncate(kept * FEMNIST_PIXELS);
    train.y.truncate(kept);
    train.writers.truncate(kept);
    test
}

/// Appends the rows of the Parquet file `path` to `out`.
fn read_file(path: &Path, out: &mut Samples) -> Result<()> {
    let bad = |msg: String| DataError::format(path, msg);
    let mut file = File::open(path).map_err(|e| DataError::io("could not open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| DataError::io("could not read", path, e))?
        .len();
    if len > MAX_PARQUET_FILE_BYTES {
        return Err(bad(format!(
            "{len} bytes, over the {MAX_PARQUET_FILE_BYTES} a FEMNIST Parquet file may have; \
             split it into several train-*.parquet files"
        )));
    }
    check_footer(&mut file, len).map_err(&bad)?;
    // The `parquet` crate asserts on some damaged pages instead of returning an error (a byte
    // flipped in a page header, found by this reader's tests): a panic there is caught and
    // reported as the damaged file it is. Nothing of this file is kept then.
    let start = out.y.len();
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_rows(file, len, out).map_err(&bad)
    }));
    read.unwrap_or_else(|_| {
        out.x.truncate(start * FEMNIST_PIXELS);
        out.y.truncate(start);
        out.writers.truncate(start);
        Err(bad(
            "damaged: the Parquet decoder stopped on inconsistent data (fetch the file again)"
                .into(),
        ))
    })
}

/// Appends the rows of the Parquet file `file` (of `len` bytes) to `out`.
fn read_rows(file: File, len: u64, out: &mut Samples) -> std::result::Result<(), String> {
    let reader = SerializedFileReader::new(file)
        .map_err(|e| format!("not a Parquet file fedfuse can read: {e}"))?;
    let meta = reader.metadata();
    let schema = meta.file_metadata().schema_descr();
    let projection = projection(schema)?;
    for (g, group) in meta.row_groups().iter().enumerate() {
        for chunk in group.columns() {
            let (packed, unpacked) = (chunk.compressed_size(), chunk.uncompressed_size());
            if !(0..=MAX_CHUNK_BYTES).contains(&packed)
                || !(0..=MAX_CHUNK_BYTES).contains(&unpacked)
                || packed as u64 > len
            {
                return Err(format!(
                    "row group {g}, column {}: declares {packed} bytes compressed and \
                     {unpacked} uncompressed (at most {MAX_CHUNK_BYTES} each, within the \
                     file's {len})",
                    chunk.column_path()
                ));
            }
        }
    }
    let mut row_no = 0usize;
    for g in 0..reader.num_row_groups() {
        let group = reader
            .get_row_group(g)
            .map_err(|e| format!("row group {g}: {e}"))?;
        let rows = group
            .get_row_iter(Some(projection.clone()))
            .map_err(|e| format!("row group {g}: {e}"))?;
        for row in rows {
            let row = row.map_err(|e| format!("row {row_no}: {e}"))?;
            if out.y.len() >= MAX_FEMNIST_IMAGES {
                return Err(format!(
                    "more than {MAX_FEMNIST_IMAGES} images in all; FEMNIST has 814,277"
                ));
            }
            read_row(&row, out).map_err(|msg| format!("row {row_no}: {msg}"))?;
            row_no += 1;
        }
    }
    Ok(())
}

/// Checks Parquet's magic at both ends and the footer length the file declares, before the
/// reader allocates for it.
fn check_footer(file: &mut File, len: u64) -> std::result::Result<(), String> {
    const MAGIC: &[u8; 4] = b"PAR1";
    if len < 12 {
        return Err(format!("{len} bytes, too short for a Parquet file"));
    }
    let mut head = [0u8; 4];
    let mut tail = [0u8; 8];
    file.read_exact(&mut head)
        .and_then(|()| file.seek(SeekFrom::Start(len - 8)))
        .and_then(|_| file.read_exact(&mut tail))
        .and_then(|()| file.rewind())
        .map_err(|e| format!("could not read its ends: {e}"))?;
    if &head != MAGIC || &tail[4..] != MAGIC {
        return Err("not a Parquet file (no PAR1 at both ends)".into());
    }
    let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if footer > MAX_FOOTER_BYTES || footer > len - 12 {
        return Err(format!(
            "its footer declares {footer} bytes of metadata, more than the file's {len} or the \
             {MAX_FOOTER_BYTES} read (truncated or damaged?)"
        ));
    }
    Ok(())
}

/// The columns read (`image`, `writer_id`, `character`), checked against what
/// `flwrlabs/femnist` stores.
fn projection(schema: &SchemaDescriptor) -> std::result::Result<Type, String> {
    let leaf = |path: &str| {
        schema
            .columns()
            .iter()
            .find(|c| c.path().string() == path)
            .map(|c| c.physical_type())
    };
    let expect = |path: &str, types: &[Physical]| match leaf(path) {
        Some(t) if types.contains(&t) => Ok(()),
        Some(t) => Err(format!(
            "column `{path}` holds {t}, where flwrlabs/femnist has {types:?}"
        )),
        None => Err(format!(
            "no `{path}` column (found {}); flwrlabs/femnist's files have image.bytes, \
             writer_id, hsf_id and character",
            schema
                .columns()
                .iter()
                .map(|c| c.path().string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    };
    expect("image.bytes", &[Physical::BYTE_ARRAY])?;
    expect("writer_id", &[Physical::BYTE_ARRAY])?;
    expect("character", &[Physical::INT64, Physical::INT32])?;
    let fields: Vec<Arc<Type>> = schema
        .root_schema()
        .get_fields()
        .iter()
        .filter(|f| ["image", "writer_id", "character"].contains(&f.name()))
        .cloned()
        .collect();
    Type::group_type_builder("schema")
        .with_fields(fields)
        .build()
        .map_err(|e| e.to_string())
}

/// Appends one row's image, label and writer to `out`.
fn read_row(row: &Row, out: &mut Samples) -> std::result::Result<(), String> {
    let (mut png, mut writer, mut label) = (None, None, None);
    for (name, field) in row.get_column_iter() {
        match (name.as_str(), field) {
            ("image", Field::Group(image)) => {
                png = image
                    .get_column_iter()
                    .find_map(|(n, f)| match (n.as_str(), f) {
                        ("bytes", Field::Bytes(b)) => Some(b.data()),
                        _ => None,
                    });
            }
            ("writer_id", Field::Str(w)) => writer = Some(w),
            ("character", Field::Long(c)) => label = Some(*c),
            ("character", Field::Int(c)) => label = Some(i64::from(*c)),
            _ => {}
        }
    }
    let png = png.ok_or("no image bytes (null); flwrlabs/femnist embeds each PNG")?;
    let writer = writer.ok_or("no writer_id (null)")?;
    let label = label.ok_or("no character (null)")?;
    if writer.is_empty() || writer.len() > MAX_WRITER_BYTES {
        return Err(format!(
            "writer_id of {} bytes (1 to {MAX_WRITER_BYTES})",
            writer.len()
        ));
    }
    if !(0..FEMNIST_CLASSES as i64).contains(&label) {
        return Err(format!("character {label} outside 0..{FEMNIST_CLASSES}"));
    }
    decode_png(png, &mut out.x).map_err(|e| format!("writer `{writer}`: {e}"))?;
    out.y.push(label as u32);
    out.writers.push(writer.clone());
    Ok(())
}

/// Appends a 28x28 8-bit grey PNG's pixels, row by row, as `pixel / 255`.
fn decode_png(bytes: &[u8], x: &mut Vec<f32>) -> std::result::Result<(), String> {
    if bytes.len() > MAX_PNG_BYTES {
        return Err(format!(
            "a {}-byte image, over the {MAX_PNG_BYTES} a 28x28 PNG may take",
            bytes.len()
        ));
    }
    // The decoder's own allocations are bounded too (a 28x28 image needs a few kB).
    let limits = png::Limits { bytes: 1 << 20 };
    let mut decoder = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder
        .read_info()
        .map_err(|e| format!("not a readable PNG: {e}"))?;
    let (w, h) = reader.info().size();
    if (w, h) != (28, 28) {
        return Err(format!("a {w}x{h} image, where FEMNIST's are 28x28"));
    }
    let (color, depth) = reader.output_color_type();
    if color != png::ColorType::Grayscale || depth != png::BitDepth::Eight {
        return Err(format!(
            "a {color:?} image of {depth:?} bits, where FEMNIST's are 8-bit grey"
        ));
    }
    let mut pixels = [0u8; FEMNIST_PIXELS];
    reader
        .next_frame(&mut pixels)
        .map_err(|e| format!("a damaged PNG: {e}"))?;
    // Through f64, as LEAF's JSON (Python's `pixel / 255`) reads into f32: both forms of a
    // file give the same bits.
    x.extend(pixels.iter().map(|&p| (f64::from(p) / 255.0) as f32));
    Ok(())
}
