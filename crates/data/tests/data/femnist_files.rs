//! Small FEMNIST files in both real forms, holding the same samples: LEAF's JSON shards and
//! Flower Datasets' Parquet files (the `flwrlabs/femnist` schema, snappy, PNG images). Shared
//! by the data tests and the lab's (`#[path]`), so both forms are written one way.

use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::SchemaDescriptor;
use serde_json::json;

/// Byte value of pixel `p` of sample `k` of writer `w`, one the test can recompute, so that a
/// transposed or shifted image fails.
pub fn byte(w: usize, k: usize, p: usize) -> u8 {
    ((w * 131 + k * 17 + p * 7) % 256) as u8
}

/// Pixel `p` of sample `k` of writer `w` as FEMNIST's readers give it: LEAF's `byte / 255`
/// (Python's float division, read into f32).
pub fn pixel(w: usize, k: usize, p: usize) -> f32 {
    (f64::from(byte(w, k, p)) / 255.0) as f32
}

/// Label of sample `k` of writer `w` (all 62 classes appear across writers).
pub fn label(w: usize, k: usize) -> u32 {
    ((w * 13 + k * 5) % 62) as u32
}

/// Writers (index, name, training samples, test samples numbered from [`TEST_FROM`]): writer 3
/// has no test samples.
pub const WRITERS: [(usize, &str, usize, usize); 4] = [
    (0, "f0003_12", 4, 2),
    (1, "f0001_40", 3, 2),
    (2, "f0002_07", 5, 2),
    (3, "f0100_99", 2, 0),
];
/// The first test sample's number, per writer.
pub const TEST_FROM: usize = 10;

/// A LEAF shard holding `writers` (index, name, samples), samples numbered from `first`.
pub fn shard(writers: &[(usize, &str, usize)], first: usize) -> serde_json::Value {
    let mut users = Vec::new();
    let mut counts = Vec::new();
    let mut data = serde_json::Map::new();
    for &(w, name, n) in writers {
        users.push(json!(name));
        counts.push(json!(n));
        let x: Vec<Vec<f64>> = (first..first + n)
            .map(|k| (0..784).map(|p| f64::from(byte(w, k, p)) / 255.0).collect())
            .collect();
        let y: Vec<u32> = (first..first + n).map(|k| label(w, k)).collect();
        data.insert(name.into(), json!({ "x": x, "y": y }));
    }
    json!({ "users": users, "num_samples": counts, "user_data": data })
}

/// LEAF's layout under `dir`: [`WRITERS`] in two train shards (0-1, 2-3) and one test shard.
pub fn write_leaf(dir: &Path) {
    let train = dir.join("train");
    let test = dir.join("test");
    std::fs::create_dir_all(&train).unwrap();
    std::fs::create_dir_all(&test).unwrap();
    let put = |p: std::path::PathBuf, v: serde_json::Value| {
        std::fs::write(p, serde_json::to_vec(&v).unwrap()).unwrap()
    };
    fn of(
        ws: &[(usize, &'static str, usize, usize)],
        split_test: bool,
    ) -> Vec<(usize, &'static str, usize)> {
        ws.iter()
            .map(|&(w, name, tr, te)| (w, name, if split_test { te } else { tr }))
            .filter(|&(_, _, n)| n > 0)
            .collect()
    }
    put(
        train.join("all_data_0_niid_1_keep_0_train_9.json"),
        shard(&of(&WRITERS[..2], false), 0),
    );
    put(
        train.join("all_data_1_niid_1_keep_0_train_9.json"),
        shard(&of(&WRITERS[2..], false), 0),
    );
    put(
        test.join("all_data_0_niid_1_keep_0_test_9.json"),
        shard(&of(&WRITERS, true), TEST_FROM),
    );
}

/// A 28x28 8-bit grey PNG of `pixels` (row by row).
pub fn png(pixels: &[u8]) -> Vec<u8> {
    png_sized(pixels, 28, 28, png::ColorType::Grayscale)
}

/// A PNG of any size and colour type, for the refusals.
pub fn png_sized(pixels: &[u8], w: u32, h: u32, color: png::ColorType) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(pixels).unwrap();
    writer.finish().unwrap();
    out
}

/// One row of a `flwrlabs/femnist` Parquet file; `None` writes a null.
pub struct Row {
    pub png: Option<Vec<u8>>,
    pub writer: Option<String>,
    pub character: Option<i64>,
}

/// The row of sample `k` of writer `w`.
pub fn row(w: usize, name: &str, k: usize) -> Row {
    let bytes: Vec<u8> = (0..784).map(|p| byte(w, k, p)).collect();
    Row {
        png: Some(png(&bytes)),
        writer: Some(name.into()),
        character: Some(i64::from(label(w, k))),
    }
}

/// `flwrlabs/femnist`'s schema as pyarrow writes it (every field nullable).
pub const SCHEMA: &str = "message schema {
    optional group image {
        optional binary bytes;
        optional binary path (STRING);
    }
    optional binary writer_id (STRING);
    optional int64 hsf_id;
    optional int64 character;
}";

/// Writes `rows` as a Parquet file of `schema` (snappy), `per_group` rows a row group. Leaf
/// columns are filled by name: `image.bytes`, `image.path`, `writer_id`, `hsf_id` and
/// `character` (as INT64, or as its decimal string where the schema makes it a string).
pub fn write_parquet_with(path: &Path, schema: &str, rows: &[Row], per_group: usize) {
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let leaves: Vec<(String, i16)> = SchemaDescriptor::new(Arc::clone(&schema))
        .columns()
        .iter()
        .map(|c| (c.path().string(), c.max_def_level()))
        .collect();
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, props).unwrap();
    for group in rows.chunks(per_group) {
        let mut rg = writer.next_row_group().unwrap();
        let mut index = 0;
        while let Some(mut column) = rg.next_column().unwrap() {
            let (name, max_def) = &leaves[index];
            let bytes = |of: &dyn Fn(&Row) -> Option<Vec<u8>>| -> Vec<Option<ByteArray>> {
                group.iter().map(|r| of(r).map(ByteArray::from)).collect()
            };
            let cells: Result<Vec<Option<ByteArray>>, Vec<Option<i64>>> = match name.as_str() {
                "image.bytes" => Ok(bytes(&|r| r.png.clone())),
                "image.path" => Ok(bytes(&|r| r.png.as_ref().map(|_| b"x.png".to_vec()))),
                "writer_id" => Ok(bytes(&|r| r.writer.clone().map(String::into_bytes))),
                "hsf_id" => Err(group.iter().map(|_| Some(3)).collect()),
                "character" if leaves_are_strings(&mut column) => {
                    Ok(bytes(&|r| r.character.map(|c| c.to_string().into_bytes())))
                }
                "character" => Err(group.iter().map(|r| r.character).collect()),
                other => panic!("no values for column {other}"),
            };
            // A null image nulls the whole struct (level 0); other nulls sit one level down.
            let def = |present: Vec<bool>| -> Option<Vec<i16>> {
                (*max_def > 0).then(|| {
                    present
                        .into_iter()
                        .map(|p| if p { *max_def } else { 0 })
                        .collect()
                })
            };
            match cells {
                Ok(cells) => {
                    let d = def(cells.iter().map(Option::is_some).collect());
                    let values: Vec<ByteArray> = cells.into_iter().flatten().collect();
                    column
                        .typed::<ByteArrayType>()
                        .write_batch(&values, d.as_deref(), None)
                        .unwrap();
                }
                Err(cells) => {
                    let d = def(cells.iter().map(Option::is_some).collect());
                    let values: Vec<i64> = cells.into_iter().flatten().collect();
                    column
                        .typed::<Int64Type>()
                        .write_batch(&values, d.as_deref(), None)
                        .unwrap();
                }
            }
            column.close().unwrap();
            index += 1;
        }
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

fn leaves_are_strings(column: &mut parquet::file::writer::SerializedColumnWriter<'_>) -> bool {
    matches!(
        column.untyped(),
        parquet::column::writer::ColumnWriter::ByteArrayColumnWriter(_)
    )
}

/// Writes `rows` in `flwrlabs/femnist`'s schema, two rows a row group.
pub fn write_parquet(path: &Path, rows: &[Row]) {
    write_parquet_with(path, SCHEMA, rows, 2)
}

/// The samples of [`write_leaf`] as Flower Datasets' files under `dir`: the train split in
/// two files (writers 0-1, 2-3), the test split in one.
pub fn write_parquet_like_leaf(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let rows = |ws: &[(usize, &str, usize, usize)], test: bool| -> Vec<Row> {
        ws.iter()
            .flat_map(|&(w, name, tr, te)| {
                let ks = if test {
                    TEST_FROM..TEST_FROM + te
                } else {
                    0..tr
                };
                ks.map(move |k| row(w, name, k))
            })
            .collect()
    };
    write_parquet(
        &dir.join("train-00000-of-00002.parquet"),
        &rows(&WRITERS[..2], false),
    );
    write_parquet(
        &dir.join("train-00001-of-00002.parquet"),
        &rows(&WRITERS[2..], false),
    );
    write_parquet(
        &dir.join("test-00000-of-00001.parquet"),
        &rows(&WRITERS, true),
    );
}
