//! TensorBoard event files: a run's per-round figures as scalars and its resolved config as
//! text, in the format TensorBoard's reader takes (`events.out.tfevents.*`: `Event` protobuf
//! records, each framed by its length and masked CRC-32C checksums).
//!
//! The messages are written with prost from the fields TensorBoard's `event.proto` and
//! `summary.proto` number (only those used here); the framing is TFRecord's.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use fedfuse_fed::RoundMetrics;

use crate::error::{Context, Result};

/// `tensorboard.Event`.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorboard.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// `tensorboard.Summary.Value`: a scalar (`simple_value`) or a tensor with its plugin.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "8")]
    tensor: Option<TensorProto>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
}

/// `tensorboard.SummaryMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

/// `tensorboard.SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, prost::Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
}

/// `tensorboard.TensorProto`, for one string.
#[derive(Clone, PartialEq, prost::Message)]
struct TensorProto {
    /// `DT_STRING`.
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

/// `tensorboard.TensorShapeProto` of a scalar (no dimensions).
#[derive(Clone, PartialEq, prost::Message)]
struct TensorShape {}

const DT_STRING: i32 = 7;

/// TFRecord's masked CRC-32C: a checksum of data that holds checksums stays apart from theirs.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One event file, appended to as the run goes (each record flushed, so TensorBoard shows a
/// round as soon as it ends).
pub struct EventLog {
    out: BufWriter<File>,
    path: PathBuf,
    /// Bytes up and down so far, for the cumulative traffic.
    traffic: u64,
}

impl EventLog {
    /// A new event file in `dir` (created if missing), starting at the traffic of the
    /// rounds `done` (a resumed run's).
    pub fn create(dir: &Path, done: &[RoundMetrics]) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the TensorBoard folder {}", dir.display()))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        // A name of its own per file: TensorBoard reads every `*tfevents*` file of a run's
        // folder, so a resumed run's file joins the first one's.
        let mut path;
        let mut n = 0;
        loop {
            path = dir.join(format!(
                "events.out.tfevents.{}.fedfuse.{}.{n}",
                now.as_secs(),
                std::process::id()
            ));
            if !path.exists() {
                break;
            }
            n += 1;
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut log = Self {
            out: BufWriter::new(file),
            path,
            traffic: done.iter().map(|r| r.bytes_up + r.bytes_down).sum(),
        };
        log.write(&Event {
            wall_time: now.as_secs_f64(),
            file_version: Some("brain.Event:2".into()),
            ..Event::default()
        })?;
        Ok(log)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `text` under `tag` at `step`, as TensorBoard's text plugin shows it.
    pub fn text(&mut self, step: i64, tag: &str, text: &str) -> Result<()> {
        let value = SummaryValue {
            tag: tag.into(),
            tensor: Some(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShape {}),
                string_val: vec![text.as_bytes().to_vec()],
            }),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".into(),
                }),
            }),
            ..SummaryValue::default()
        };
        self.summary(step, vec![value])
    }

    /// Scalars at `step`; non-finite values (a figure not measured) are left out.
    pub fn scalars(&mut self, step: i64, values: &[(String, f64)]) -> Result<()> {
        let value = values
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|(tag, v)| SummaryValue {
                tag: tag.clone(),
                simple_value: Some(*v as f32),
                ..SummaryValue::default()
            })
            .collect();
        self.summary(step, value)
    }

    /// A round's figures at step `round`: global accuracy and loss, the clients' accuracies,
    /// the training loss, bytes up, down and so far, rejected replies, the model's size, and
    /// every figure of the method's (`method/{name}`: sparsity, widths, privacy spent, ...).
    pub fn round(&mut self, m: &RoundMetrics) -> Result<()> {
        self.traffic += m.bytes_up + m.bytes_down;
        let mut values: Vec<(String, f64)> = vec![
            ("global/accuracy".into(), m.global_accuracy),
            ("global/loss".into(), m.global_loss),
            ("local/accuracy_mean".into(), m.local_accuracy_mean),
            ("clients/accuracy_mean".into(), m.client_accuracy_mean),
            (
                "clients/accuracy_last_mean".into(),
                m.client_accuracy_last_mean,
            ),
            ("train/loss".into(), m.train_loss),
            ("traffic/bytes_up".into(), m.bytes_up as f64),
            ("traffic/bytes_down".into(), m.bytes_down as f64),
            ("traffic/bytes_total".into(), self.traffic as f64),
            ("clients/sampled".into(), m.clients as f64),
            ("clients/rejected".into(), m.rejected.len() as f64),
            ("model/params".into(), m.global_params as f64),
        ];
        values.extend(m.method.iter().map(|(k, v)| (format!("method/{k}"), *v)));
        self.scalars(m.round as i64, &values)
    }

    fn summary(&mut self, step: i64, value: Vec<SummaryValue>) -> Result<()> {
        let wall_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.write(&Event {
            wall_time,
            step,
            summary: Some(Summary { value }),
            ..Event::default()
        })
    }

    /// One record: the length (u64, little-endian), its masked CRC, the event, its masked CRC.
    fn write(&mut self, event: &Event) -> Result<()> {
        let data = prost::Message::encode_to_vec(event);
        let len = (data.len() as u64).to_le_bytes();
        let what = || format!("cannot write {}", self.path.display());
        let mut record = Vec::with_capacity(data.len() + 16);
        record.extend_from_slice(&len);
        record.extend_from_slice(&masked_crc(&len).to_le_bytes());
        record.extend_from_slice(&data);
        record.extend_from_slice(&masked_crc(&data).to_le_bytes());
        self.out.write_all(&record).with_context(what)?;
        self.out.flush().with_context(what)
    }
}

/// `label` as one folder name of a TensorBoard run: letters, digits, `.`, `_` and `-` kept,
/// anything else `_`.
pub fn folder_name(label: &str) -> String {
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.trim_matches('.') {
        "" => "_".into(),
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C's check value ("123456789" gives 0xE3069283, RFC 3720), masked as TFRecord
    /// does: rotated right by 15 bits, plus 0xa282ead8.
    #[test]
    fn records_carry_masked_crc32c() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let masked = 0xE306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc(b"123456789"), masked);

        let dir = tempfile::tempdir().unwrap();
        let mut log = EventLog::create(dir.path(), &[]).unwrap();
        log.scalars(3, &[("a".into(), 0.5), ("nan".into(), f64::NAN)])
            .unwrap();
        let bytes = std::fs::read(log.path()).unwrap();
        // Two records, each framed: length, its CRC, the event, its CRC.
        let mut at = 0;
        let mut events = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc(data));
            events.push(<Event as prost::Message>::decode(data).unwrap());
            at += 16 + len;
        }
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert_eq!(events[1].step, 3);
        let values = &events[1].summary.as_ref().unwrap().value;
        assert_eq!(values.len(), 1, "the NaN is left out");
        assert_eq!(
            (values[0].tag.as_str(), values[0].simple_value),
            ("a", Some(0.5))
        );
    }
}
