//! Flower's content-addressed objects: a message's content travels as a tree of objects
//! (Message -> RecordDict -> records -> Array -> ArrayChunk), each stored and fetched by id.
//!
//! An object is `"<Type> <child ids, comma-separated> <body length>"`, a NUL byte, then the
//! body; its id is the hex sha256 of those bytes. Bodies: `ArrayChunk` raw bytes (at most
//! [`MAX_CHUNK`]); `Array` JSON metadata whose `arraychunk_ids` index the head's child ids;
//! `ArrayRecord` and `RecordDict` JSON maps from names to child ids; `ConfigRecord`,
//! `MetricRecord` and `Message` (metadata and error, no content) protobuf. JSON is written
//! as Python's `json.dumps` writes it, so an object Flower re-deflates keeps its id.

use std::cell::Cell;
use std::collections::HashMap;

use fedfuse_core::ConfigValue;
use fedfuse_core::flower::{FlowerArray, FlowerContent, MetricValue};
use fedfuse_flower_proto::flwr::proto;
use prost::Message as _;
use sha2::{Digest, Sha256};

use crate::{NodeError, Result};

/// Largest `ArrayChunk` body Flower writes (5 MiB).
pub const MAX_CHUNK: usize = 5_242_880;
/// Objects a message may hold: bounds the work a hostile tree can ask for.
pub const MAX_OBJECTS: usize = 100_000;
/// Most bytes the arrays of one message may assemble to: a chunk may be named many times
/// (equal chunks share an id), so without a budget a few megabytes of objects could expand
/// to terabytes. 2 GiB is 500M float32 values, far above any model fedfuse trains.
pub const MAX_MESSAGE_BYTES: usize = 2 << 30;
/// Room an array's bytes may take beyond its values: a `.npy` header, or a sparse blob's
/// indices and framing (at most 8 bytes per value more, plus this).
const ARRAY_FRAMING: usize = 1 << 20;

/// The hex sha256 of an object's bytes: its id.
pub fn object_id(content: &[u8]) -> String {
    let digest = Sha256::digest(content);
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex
}

/// A malformed-message error. Its text quotes the SuperLink's ids, kinds and keys, so it is
/// shortened and escaped like any peer text.
fn bad(what: impl Into<String>) -> NodeError {
    NodeError::Object(crate::shown(&what.into()))
}

/// A Flower record.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// An `ArrayRecord`.
    Arrays(Vec<FlowerArray>),
    /// A `ConfigRecord` (fedfuse's scalar settings).
    Config(Vec<(String, ConfigValue)>),
    /// A `MetricRecord`.
    Metrics(Vec<(String, MetricValue)>),
}

/// A Flower `RecordDict`: named records, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordDict(pub Vec<(String, Record)>);

/// Record names of the stock strategy contract.
pub const ARRAYS: &str = "arrays";
/// See [`ARRAYS`].
pub const CONFIG: &str = "config";
/// See [`ARRAYS`].
pub const METRICS: &str = "metrics";

impl RecordDict {
    /// fedfuse's content: at most one record of each kind, whatever their names (a stock
    /// instruction holds `"arrays"` and `"config"`).
    pub fn to_content(&self) -> Result<FlowerContent> {
        let mut content = FlowerContent::default();
        let mut seen = [false; 3];
        for (name, record) in &self.0 {
            let (slot, kind) = match record {
                Record::Arrays(a) => {
                    content.arrays = a.clone();
                    (0, "ArrayRecord")
                }
                Record::Config(c) => {
                    content.config = c.clone();
                    (1, "ConfigRecord")
                }
                Record::Metrics(m) => {
                    content.metrics = m.clone();
                    (2, "MetricRecord")
                }
            };
            if std::mem::replace(&mut seen[slot], true) {
                return Err(bad(format!(
                    "the message holds more than one {kind} (second: `{name}`); fedfuse reads one"
                )));
            }
        }
        Ok(content)
    }

    /// The stock reply layout: `"arrays"`, `"metrics"`, then `"config"` when not empty.
    pub fn from_content(content: FlowerContent) -> Self {
        let mut records = vec![(ARRAYS.to_string(), Record::Arrays(content.arrays))];
        records.push((METRICS.to_string(), Record::Metrics(content.metrics)));
        if !content.config.is_empty() {
            records.push((CONFIG.to_string(), Record::Config(content.config)));
        }
        Self(records)
    }
}

// -- writing -------------------------------------------------------------------------------

/// A deflated message: the message itself (metadata with its id, no content), its object
/// tree and the bytes of every object, by id.
#[derive(Clone, Debug)]
pub struct Deflated {
    /// The message to push (its `message_id` is its object id).
    pub message: proto::Message,
    /// Its tree of object ids.
    pub tree: proto::ObjectTree,
    /// Every object of the tree.
    pub objects: HashMap<String, Vec<u8>>,
}

struct Writer {
    objects: HashMap<String, Vec<u8>>,
}

impl Writer {
    /// Stores one object and returns its id and tree.
    fn put(
        &mut self,
        kind: &str,
        children: Vec<proto::ObjectTree>,
        body: &[u8],
    ) -> proto::ObjectTree {
        let ids: Vec<&str> = unique(children.iter().map(|c| c.object_id.as_str()));
        let mut content = format!("{kind} {} {}", ids.join(","), body.len()).into_bytes();
        content.push(0);
        content.extend_from_slice(body);
        let id = object_id(&content);
        self.objects.insert(id.clone(), content);
        let mut seen = std::collections::HashSet::new();
        let children = children
            .into_iter()
            .filter(|c| seen.insert(c.object_id.clone()))
            .collect();
        proto::ObjectTree {
            object_id: id,
            children,
        }
    }

    fn array(&mut self, a: &FlowerArray) -> proto::ObjectTree {
        let chunks: Vec<proto::ObjectTree> = a
            .data
            .chunks(MAX_CHUNK)
            .map(|c| self.put("ArrayChunk", Vec::new(), c))
            .collect();
        let unique_ids = unique(chunks.iter().map(|c| c.object_id.as_str()));
        let indices: Vec<String> = chunks
            .iter()
            .map(|c| {
                unique_ids
                    .iter()
                    .position(|u| *u == c.object_id)
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let shape: Vec<String> = a.shape.iter().map(usize::to_string).collect();
        let body = format!(
            "{{\"dtype\": {}, \"shape\": [{}], \"stype\": {}, \"arraychunk_ids\": [{}]}}",
            json_str(&a.dtype),
            shape.join(", "),
            json_str(&a.stype),
            indices.join(", ")
        );
        self.put("Array", chunks, body.as_bytes())
    }

    fn record(&mut self, record: &Record) -> proto::ObjectTree {
        match record {
            Record::Arrays(arrays) => {
                let children: Vec<proto::ObjectTree> =
                    arrays.iter().map(|a| self.array(a)).collect();
                let names = arrays.iter().map(|a| a.key.as_str());
                let body = json_map(names.zip(children.iter().map(|c| c.object_id.as_str())));
                self.put("ArrayRecord", children, body.as_bytes())
            }
            Record::Config(items) => {
                let body = proto::ConfigRecord {
                    items: items
                        .iter()
                        .map(|(k, v)| proto::config_record::Item {
                            key: k.clone(),
                            value: Some(config_value(v)),
                        })
                        .collect(),
                }
                .encode_to_vec();
                self.put("ConfigRecord", Vec::new(), &body)
            }
            Record::Metrics(items) => {
                let body = proto::MetricRecord {
                    items: items
                        .iter()
                        .map(|(k, v)| proto::metric_record::Item {
                            key: k.clone(),
                            value: Some(metric_value(*v)),
                        })
                        .collect(),
                }
                .encode_to_vec();
                self.put("MetricRecord", Vec::new(), &body)
            }
        }
    }
}

/// Ids in order of first appearance (a Python dict's keys); a set keeps it linear on the
/// millions of references a hostile object may hold.
fn unique<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = std::collections::HashSet::new();
    ids.filter(|id| seen.insert(*id)).collect()
}

/// `arraychunk_ids`, refused past [`MAX_OBJECTS`] entries while it is read: a 64 MiB body of
/// `0,0,0,...` would otherwise become a list of 32 million indices before any check.
fn capped_ids<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<usize>, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Vec<usize>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_OBJECTS} chunk indices")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut ids = Vec::new();
            while let Some(i) = seq.next_element()? {
                if ids.len() == MAX_OBJECTS {
                    return Err(serde::de::Error::custom(format!(
                        "more than {MAX_OBJECTS} chunk indices"
                    )));
                }
                ids.push(i);
            }
            Ok(ids)
        }
    }
    d.deserialize_seq(Visit)
}

/// Bytes per value of a numpy dtype (`float32`, `int64`, `<f4`); 16, the largest numpy
/// has (complex128), for one it cannot read, so the bound it feeds stays an upper one.
fn item_size(dtype: &str) -> usize {
    let digits: String = dtype.chars().filter(char::is_ascii_digit).collect();
    let Ok(n) = digits.parse::<usize>() else {
        return if dtype == "bool" { 1 } else { 16 };
    };
    // Type strings (`<f4`) count bytes, names (`float32`) bits.
    let bytes = if dtype.starts_with(['<', '>', '|', '=']) {
        n
    } else {
        n / 8
    };
    if (1..=16).contains(&bytes) { bytes } else { 16 }
}

/// A JSON string as Python's `json.dumps` writes it (`ensure_ascii`).
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_map<'a>(items: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let parts: Vec<String> = items
        .map(|(k, v)| format!("{}: {}", json_str(k), json_str(v)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

fn config_value(v: &ConfigValue) -> proto::ConfigRecordValue {
    use proto::config_record_value::Value;
    let value = match v {
        ConfigValue::Bool(b) => Value::Bool(*b),
        ConfigValue::Int(i) => Value::Sint64(*i),
        ConfigValue::Float(f) => Value::Double(*f),
        ConfigValue::Str(s) => Value::String(s.clone()),
    };
    proto::ConfigRecordValue { value: Some(value) }
}

fn metric_value(v: MetricValue) -> proto::MetricRecordValue {
    use proto::metric_record_value::Value;
    let value = match v {
        MetricValue::Int(i) => Value::Sint64(i),
        MetricValue::Float(f) => Value::Double(f),
    };
    proto::MetricRecordValue { value: Some(value) }
}

/// Deflates a message: `metadata` (its `message_id` is replaced by the object id) with
/// `content` or `error`.
pub fn deflate(
    mut metadata: proto::Metadata,
    content: Option<&RecordDict>,
    error: Option<proto::Error>,
) -> Deflated {
    let mut w = Writer {
        objects: HashMap::new(),
    };
    let children = match content {
        Some(rd) => {
            let records: Vec<proto::ObjectTree> = rd.0.iter().map(|(_, r)| w.record(r)).collect();
            let names = rd.0.iter().map(|(n, _)| n.as_str());
            let body = json_map(names.zip(records.iter().map(|c| c.object_id.as_str())));
            vec![w.put("RecordDict", records, body.as_bytes())]
        }
        None => Vec::new(),
    };
    metadata.message_id.clear();
    let body = proto::Message {
        metadata: Some(metadata.clone()),
        content: None,
        error: error.clone(),
    }
    .encode_to_vec();
    let tree = w.put("Message", children, &body);
    metadata.message_id = tree.object_id.clone();
    // The pushed message carries an empty content in place of the tree (none with an error),
    // as Flower's own nodes send it.
    let content = error.is_none().then(proto::RecordDict::default);
    Deflated {
        message: proto::Message {
            metadata: Some(metadata),
            content,
            error,
        },
        tree,
        objects: w.objects,
    }
}

// -- reading -------------------------------------------------------------------------------

/// One object's head and body.
struct Parsed<'a> {
    kind: &'a str,
    children: Vec<&'a str>,
    body: &'a [u8],
}

fn parse<'a>(id: &str, content: &'a [u8]) -> Result<Parsed<'a>> {
    let split = content
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| bad(format!("object {id}: no head")))?;
    let head = std::str::from_utf8(&content[..split])
        .map_err(|_| bad(format!("object {id}: the head is not UTF-8")))?;
    let body = &content[split + 1..];
    let mut parts = head.split(' ');
    let (Some(kind), Some(children), Some(len), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(format!("object {id}: malformed head `{head}`")));
    };
    if len.parse::<usize>().ok() != Some(body.len()) {
        return Err(bad(format!(
            "object {id}: the head declares {len} body bytes, the object has {}",
            body.len()
        )));
    }
    let children = if children.is_empty() {
        Vec::new()
    } else {
        children.split(',').collect()
    };
    Ok(Parsed {
        kind,
        children,
        body,
    })
}

/// Pulled objects by id, checked against their ids.
pub struct Pulled {
    objects: HashMap<String, Vec<u8>>,
}

impl Pulled {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            objects: HashMap::new(),
        }
    }

    /// Adds an object after checking that `content` hashes to `id`.
    pub fn insert(&mut self, id: &str, content: Vec<u8>) -> Result<()> {
        let actual = object_id(&content);
        if actual != id {
            return Err(bad(format!("object {id}: its bytes hash to {actual}")));
        }
        if self.objects.len() >= MAX_OBJECTS {
            return Err(bad(format!(
                "more than {MAX_OBJECTS} objects in one message"
            )));
        }
        self.objects.insert(id.to_string(), content);
        Ok(())
    }

    fn get(&self, id: &str, kind: &str) -> Result<Parsed<'_>> {
        let content = self
            .objects
            .get(id)
            .ok_or_else(|| bad(format!("object {id} ({kind}) was not pulled")))?;
        let p = parse(id, content)?;
        if p.kind != kind {
            return Err(bad(format!("object {id}: a {}, expected a {kind}", p.kind)));
        }
        Ok(p)
    }

    /// Rebuilds the message whose object id is `id`: its metadata and error, and its content
    /// (empty when it carries an error).
    pub fn inflate(&self, id: &str) -> Result<(proto::Message, RecordDict)> {
        let m = self.get(id, "Message")?;
        let mut message =
            proto::Message::decode(m.body).map_err(|e| bad(format!("message {id}: {e}")))?;
        if let Some(meta) = message.metadata.as_mut() {
            meta.message_id = id.to_string();
        }
        let content = match m.children.as_slice() {
            [] => RecordDict::default(),
            [rd] => self.record_dict(rd, &Cell::new(0))?,
            _ => return Err(bad(format!("message {id}: more than one content"))),
        };
        Ok((message, content))
    }

    /// `budget`: the bytes the message's arrays have assembled to so far.
    fn record_dict(&self, id: &str, budget: &Cell<usize>) -> Result<RecordDict> {
        let p = self.get(id, "RecordDict")?;
        let refs = json_refs(id, p.body)?;
        check_children(id, &p.children, refs.iter().map(|(_, v)| v.as_str()))?;
        let mut records = Vec::with_capacity(refs.len());
        for (name, child) in refs {
            let content = self
                .objects
                .get(&child)
                .ok_or_else(|| bad(format!("record `{name}` ({child}) was not pulled")))?;
            let record = match parse(&child, content)?.kind {
                "ArrayRecord" => self.array_record(&child, budget)?,
                "ConfigRecord" => self.config_record(&child)?,
                "MetricRecord" => self.metric_record(&child)?,
                other => return Err(bad(format!("record `{name}`: a {other}"))),
            };
            records.push((name, record));
        }
        Ok(RecordDict(records))
    }

    fn array_record(&self, id: &str, budget: &Cell<usize>) -> Result<Record> {
        let p = self.get(id, "ArrayRecord")?;
        let refs = json_refs(id, p.body)?;
        check_children(id, &p.children, refs.iter().map(|(_, v)| v.as_str()))?;
        refs.into_iter()
            .map(|(key, child)| self.array(key, &child, budget))
            .collect::<Result<Vec<_>>>()
            .map(Record::Arrays)
    }

    fn array(&self, key: String, id: &str, budget: &Cell<usize>) -> Result<FlowerArray> {
        #[derive(serde::Deserialize)]
        struct Meta {
            dtype: String,
            shape: Vec<usize>,
            stype: String,
            #[serde(deserialize_with = "capped_ids")]
            arraychunk_ids: Vec<usize>,
        }
        let p = self.get(id, "Array")?;
        let meta: Meta = serde_json::from_slice(p.body)
            .map_err(|e| bad(format!("array `{key}` ({id}): {e}")))?;
        // The assembled length, summed before anything is copied, against what the declared
        // shape and dtype can need and against the message's budget.
        let values = meta
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let most = values
            .and_then(|n| n.checked_mul(item_size(&meta.dtype) + 8))
            .and_then(|n| n.checked_add(ARRAY_FRAMING))
            .unwrap_or(0);
        let mut chunks = Vec::with_capacity(meta.arraychunk_ids.len());
        let mut len = 0usize;
        for &i in &meta.arraychunk_ids {
            let chunk = p
                .children
                .get(i)
                .ok_or_else(|| bad(format!("array `{key}`: chunk index {i} out of range")))?;
            let body = self.get(chunk, "ArrayChunk")?.body;
            len = len.saturating_add(body.len());
            // Stopped at the first chunk past the bound, not after listing them all.
            if len > most {
                return Err(bad(format!(
                    "array `{key}`: its chunks assemble to more than the {most} bytes shape \
                     {:?} of {} can hold",
                    meta.shape,
                    crate::shown(&meta.dtype)
                )));
            }
            chunks.push(body);
        }
        let left = MAX_MESSAGE_BYTES.saturating_sub(budget.get());
        if len > left {
            return Err(bad(format!(
                "array `{key}`: the message's arrays assemble to more than {MAX_MESSAGE_BYTES} \
                 bytes"
            )));
        }
        budget.set(budget.get() + len);
        let mut data = Vec::with_capacity(len);
        for body in chunks {
            data.extend_from_slice(body);
        }
        Ok(FlowerArray {
            key,
            dtype: meta.dtype,
            shape: meta.shape,
            stype: meta.stype,
            data,
        })
    }

    fn config_record(&self, id: &str) -> Result<Record> {
        use proto::config_record_value::Value;
        let p = self.get(id, "ConfigRecord")?;
        let record = proto::ConfigRecord::decode(p.body)
            .map_err(|e| bad(format!("config record {id}: {e}")))?;
        record
            .items
            .into_iter()
            .map(|item| {
                let v = match item.value.and_then(|v| v.value) {
                    Some(Value::Bool(b)) => ConfigValue::Bool(b),
                    Some(Value::Sint64(i)) => ConfigValue::Int(i),
                    Some(Value::Uint64(u)) => ConfigValue::Int(i64::try_from(u).map_err(|_| {
                        bad(format!(
                            "config `{}`: {u} is out of fedfuse's range",
                            item.key
                        ))
                    })?),
                    Some(Value::Double(f)) => ConfigValue::Float(f),
                    Some(Value::String(s)) => ConfigValue::Str(s),
                    _ => {
                        return Err(bad(format!(
                            "config `{}`: lists and bytes are not fedfuse settings",
                            item.key
                        )));
                    }
                };
                Ok((item.key, v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Record::Config)
    }

    fn metric_record(&self, id: &str) -> Result<Record> {
        use proto::metric_record_value::Value;
        let p = self.get(id, "MetricRecord")?;
        let record = proto::MetricRecord::decode(p.body)
            .map_err(|e| bad(format!("metric record {id}: {e}")))?;
        record
            .items
            .into_iter()
            .map(|item| {
                let v = match item.value.and_then(|v| v.value) {
                    Some(Value::Sint64(i)) => MetricValue::Int(i),
                    Some(Value::Uint64(u)) => MetricValue::Float(u as f64),
                    Some(Value::Double(f)) => MetricValue::Float(f),
                    _ => {
                        return Err(bad(format!(
                            "metric `{}`: fedfuse reads scalar metrics",
                            item.key
                        )));
                    }
                };
                Ok((item.key, v))
            })
            .collect::<Result<Vec<_>>>()
            .map(Record::Metrics)
    }
}

impl Default for Pulled {
    fn default() -> Self {
        Self::new()
    }
}

/// A JSON map of names to object ids, in the order written (a Python dict's order).
struct Refs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Refs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Refs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of names to object ids")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Refs, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, String>()? {
                    out.push(entry);
                }
                Ok(Refs(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

fn json_refs(id: &str, body: &[u8]) -> Result<Vec<(String, String)>> {
    serde_json::from_slice::<Refs>(body)
        .map(|r| r.0)
        .map_err(|e| bad(format!("object {id}: {e}")))
}

fn check_children<'a>(
    id: &str,
    head: &[&str],
    referenced: impl Iterator<Item = &'a str>,
) -> Result<()> {
    // No object of a message has more children than a message has objects.
    let mut want: Vec<&str> = unique(referenced.take(MAX_OBJECTS + 1));
    if want.len() > MAX_OBJECTS || head.len() > MAX_OBJECTS {
        return Err(bad(format!(
            "object {id}: more than {MAX_OBJECTS} references in one object"
        )));
    }
    let mut have: Vec<&str> = head.to_vec();
    want.sort_unstable();
    have.sort_unstable();
    if want != have {
        return Err(bad(format!(
            "object {id}: its head's children differ from the ids its body names"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content() -> RecordDict {
        let mut data = vec![7u8; MAX_CHUNK + 10];
        data[MAX_CHUNK] = 1;
        RecordDict(vec![
            (
                ARRAYS.into(),
                Record::Arrays(vec![
                    FlowerArray {
                        key: "layers.0.weight".into(),
                        dtype: "float32".into(),
                        shape: vec![3, 2],
                        stype: "numpy.ndarray".into(),
                        data: vec![1, 2, 3],
                    },
                    // Two chunks; and the same bytes under a second name share their objects.
                    FlowerArray {
                        key: "big".into(),
                        dtype: "float32".into(),
                        shape: vec![data.len() / 4],
                        stype: "fedfuse.sparse.v1".into(),
                        data: data.clone(),
                    },
                    FlowerArray {
                        key: "big.copy".into(),
                        dtype: "float32".into(),
                        shape: vec![data.len() / 4],
                        stype: "fedfuse.sparse.v1".into(),
                        data,
                    },
                ]),
            ),
            (
                CONFIG.into(),
                Record::Config(vec![
                    ("server-round".into(), ConfigValue::Int(3)),
                    ("name \u{e9}\"".into(), ConfigValue::Str("x".into())),
                ]),
            ),
            (
                METRICS.into(),
                Record::Metrics(vec![("num-examples".into(), MetricValue::Int(12))]),
            ),
        ])
    }

    fn metadata() -> proto::Metadata {
        proto::Metadata {
            run_id: 5,
            src_node_id: 9,
            dst_node_id: 1,
            group_id: "2".into(),
            ttl: 100.0,
            message_type: "train".into(),
            created_at: 1.5,
            ..Default::default()
        }
    }

    fn store(d: &Deflated) -> Pulled {
        let mut p = Pulled::new();
        for (id, bytes) in &d.objects {
            p.insert(id, bytes.clone()).unwrap();
        }
        p
    }

    #[test]
    fn a_deflated_message_inflates_to_itself() {
        let rd = content();
        let d = deflate(metadata(), Some(&rd), None);
        let id = d.tree.object_id.clone();
        assert_eq!(d.message.metadata.as_ref().unwrap().message_id, id);
        assert!(d.message.content.is_some());
        // Objects: message, record dict, 3 records, 2 distinct arrays (big and big.copy are
        // one object), 1 + 2 distinct chunks (the big array's two chunks differ).
        assert_eq!(
            d.objects.len(),
            1 + 1 + 3 + 2 + 1 + 2,
            "{:?}",
            d.objects.keys()
        );
        let (message, back) = store(&d).inflate(&id).unwrap();
        assert_eq!(back, rd);
        assert_eq!(message.metadata.unwrap().group_id, "2");
    }

    #[test]
    fn object_ids_are_those_the_pinned_flwr_computes() {
        // The same message built with flwr 1.41.0 (`Message(metadata=Metadata(run_id=5,
        // src_node_id=9, dst_node_id=1, group_id="2", created_at=1.5, ttl=100.0,
        // message_type="train", ...), content=RecordDict({...}))`, the arrays as
        // `Array(dtype, shape, stype, data)`), its `object_id`s printed.
        let d = deflate(metadata(), Some(&content()), None);
        let content = &d.tree.children[0];
        let ids: Vec<&str> = content
            .children
            .iter()
            .map(|c| c.object_id.as_str())
            .collect();
        assert_eq!(
            ids,
            [
                "6afd892803ca61a5173586eaeaa0e6e76259989533854a23d5faf48868a09a34",
                "bad4ba719ae85d5f02b0e96f70f6496a09f98adcbb24c684ef39d5a1f54d5cfe",
                "c8b3029a84af8608039faa06108728b2e49b68cb3c5103d68163e61cb666b95e",
            ]
        );
        assert_eq!(
            content.object_id,
            "27fd70cfb3fa2f8f1bda88a703381df9949357412bfb40c0ecb0f7adbf62d25e"
        );
        assert_eq!(
            d.tree.object_id,
            "b6c0109bdbd6fb0f2aa44041892e4b04f223d67a6c6fd34c07a4c44da53cee97"
        );
        assert_eq!(
            d.message.metadata.as_ref().map(|m| m.message_id.as_str()),
            Some(d.tree.object_id.as_str())
        );
    }

    #[test]
    fn heads_and_json_are_written_as_flower_writes_them() {
        let d = deflate(metadata(), Some(&content()), None);
        let chunk = d
            .objects
            .values()
            .find(|o| o.starts_with(b"ArrayChunk  3\0"))
            .unwrap();
        assert_eq!(&chunk[chunk.len() - 3..], &[1, 2, 3]);
        let array = d
            .objects
            .values()
            .find(|o| o.starts_with(b"Array ") && o.ends_with(b"\"arraychunk_ids\": [0]}"))
            .unwrap();
        let text = String::from_utf8_lossy(array);
        assert!(
            text.contains(
                "{\"dtype\": \"float32\", \"shape\": [3, 2], \"stype\": \"numpy.ndarray\""
            ),
            "{text}"
        );
        assert_eq!(json_str("name \u{e9}\"\n"), "\"name \\u00e9\\\"\\n\"");
        assert_eq!(json_str("\u{1F600}"), "\"\\ud83d\\ude00\"");
    }

    #[test]
    fn an_error_reply_has_no_content() {
        let err = proto::Error {
            code: 2,
            reason: "boom".into(),
        };
        let d = deflate(metadata(), None, Some(err.clone()));
        assert!(d.message.content.is_none());
        assert_eq!(d.objects.len(), 1);
        let (message, content) = store(&d).inflate(&d.tree.object_id).unwrap();
        assert_eq!(message.error, Some(err));
        assert!(content.0.is_empty());
    }

    #[test]
    fn tampered_or_malformed_objects_are_refused() {
        let d = deflate(metadata(), Some(&content()), None);
        let (id, bytes) = d.objects.iter().next().unwrap();
        let mut bad_bytes = bytes.clone();
        bad_bytes.push(0);
        let e = Pulled::new().insert(id, bad_bytes).unwrap_err().to_string();
        assert!(e.contains("hash"), "{e}");

        let mut lying = b"ArrayChunk  99\0abc".to_vec();
        let lying_id = object_id(&lying);
        let mut p = Pulled::new();
        p.insert(&lying_id, lying.clone()).unwrap();
        let e = p.get(&lying_id, "ArrayChunk").err().unwrap().to_string();
        assert!(e.contains("declares 99"), "{e}");

        lying.clear();
        lying.extend_from_slice(b"no head at all");
        let id2 = object_id(&lying);
        p.insert(&id2, lying).unwrap();
        assert!(p.inflate(&id2).is_err());
        // A message whose content was not pulled.
        let mut partial = Pulled::new();
        partial
            .insert(&d.tree.object_id, d.objects[&d.tree.object_id].clone())
            .unwrap();
        let e = partial.inflate(&d.tree.object_id).unwrap_err().to_string();
        assert!(e.contains("was not pulled"), "{e}");
    }

    /// An object of `kind` with `children` and `body`, as Flower writes one: (id, bytes).
    fn object(kind: &str, children: &[&str], body: &[u8]) -> (String, Vec<u8>) {
        let mut content = format!("{kind} {} {}", children.join(","), body.len()).into_bytes();
        content.push(0);
        content.extend_from_slice(body);
        (object_id(&content), content)
    }

    /// A message whose one array (`shape`, float32) names `chunk` `repeats` times.
    fn repeating(chunk: &[u8], repeats: usize, shape: &[usize]) -> (Pulled, String) {
        let mut p = Pulled::new();
        let mut add = |(id, bytes): (String, Vec<u8>)| {
            p.insert(&id, bytes).unwrap();
            id
        };
        let chunk = add(object("ArrayChunk", &[], chunk));
        let meta = serde_json::json!({
            "dtype": "float32",
            "shape": shape,
            "stype": "numpy.ndarray",
            "arraychunk_ids": vec![0; repeats],
        });
        let array = add(object("Array", &[&chunk], meta.to_string().as_bytes()));
        let record = add(object(
            "ArrayRecord",
            &[&array],
            format!("{{\"w\": \"{array}\"}}").as_bytes(),
        ));
        let dict = add(object(
            "RecordDict",
            &[&record],
            format!("{{\"arrays\": \"{record}\"}}").as_bytes(),
        ));
        let message = proto::Message {
            metadata: Some(metadata()),
            ..Default::default()
        }
        .encode_to_vec();
        let id = add(object("Message", &[&dict], &message));
        (p, id)
    }

    #[test]
    fn a_chunk_named_again_and_again_cannot_amplify_a_message() {
        // Equal chunks share an id, so naming one chunk twice is legitimate.
        let (p, id) = repeating(&[1, 2, 3, 4], 2, &[2]);
        let (_, rd) = p.inflate(&id).unwrap();
        let Record::Arrays(arrays) = &rd.0[0].1 else {
            panic!("{rd:?}")
        };
        assert_eq!(arrays[0].data, [1, 2, 3, 4, 1, 2, 3, 4]);
        // One 1 MiB chunk named 100,000 times would assemble 100 GB: refused by the
        // declared shape before anything is copied.
        let (p, id) = repeating(&vec![0; 1 << 20], 100_000, &[2, 2]);
        let e = p.inflate(&id).unwrap_err().to_string();
        assert!(e.contains("bytes shape [2, 2] of float32 can hold"), "{e}");
        // A shape that claims the room is stopped by the message's budget.
        let (p, id) = repeating(&vec![0; 1 << 20], 4_000, &[1 << 30]);
        let e = p.inflate(&id).unwrap_err().to_string();
        assert!(e.contains(&MAX_MESSAGE_BYTES.to_string()), "{e}");
    }

    #[test]
    fn an_object_with_more_references_than_a_message_has_objects_is_refused() {
        // As many chunk indices as a message may have objects, plus one.
        let (p, id) = repeating(&[0; 4], MAX_OBJECTS + 1, &[1 << 40]);
        let e = p.inflate(&id).unwrap_err().to_string();
        assert!(e.contains("chunk indices"), "{e}");
        // A record naming more children than that.
        let mut store = Pulled::new();
        let names: Vec<String> = (0..=MAX_OBJECTS)
            .map(|i| format!("\"k{i}\": \"{i:064x}\""))
            .collect();
        let (record, bytes) = object(
            "ArrayRecord",
            &[],
            format!("{{{}}}", names.join(", ")).as_bytes(),
        );
        store.insert(&record, bytes).unwrap();
        let e = store
            .array_record(&record, &Cell::new(0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("references in one object"), "{e}");
    }

    #[test]
    fn references_are_deduplicated_in_first_seen_order() {
        // 200,000 distinct ids, each named twice: a list scan per id would take minutes.
        let ids: Vec<String> = (0..200_000).map(|i| format!("{i:064x}")).collect();
        let named = ids.iter().chain(ids.iter().rev()).map(String::as_str);
        let got = unique(named);
        assert_eq!(got.len(), ids.len());
        assert!(got.iter().zip(&ids).all(|(a, b)| a == b));
    }

    #[test]
    fn peer_text_in_errors_is_shortened_and_escaped() {
        // A head of four parts (one too many), the second a terminal escape and 100 kB.
        let head = format!("Array \x1b[2J{} 3 4", "x".repeat(100_000));
        let mut content = head.into_bytes();
        content.push(0);
        content.extend_from_slice(b"abc");
        let id = object_id(&content);
        let mut p = Pulled::new();
        p.insert(&id, content).unwrap();
        let e = p.get(&id, "Array").err().unwrap().to_string();
        assert!(e.len() < 1000, "{} bytes", e.len());
        assert!(!e.contains('\x1b') && e.contains("\\u{1b}"), "{e}");
    }

    #[test]
    fn content_takes_one_record_of_each_kind() {
        let c = content().to_content().unwrap();
        assert_eq!(c.arrays.len(), 3);
        let twice = RecordDict(vec![
            ("a".into(), Record::Metrics(Vec::new())),
            ("b".into(), Record::Metrics(Vec::new())),
        ]);
        let e = twice.to_content().unwrap_err().to_string();
        assert!(e.contains("`b`"), "{e}");
    }
}
