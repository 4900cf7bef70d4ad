//! A [`Record`] as the content of a Flower message (a `RecordDict`): its tensors as one
//! `ArrayRecord`, its settings as one `ConfigRecord`, its metrics and example count as one
//! `MetricRecord`. The Python package and the Rust node both convert through here, so the two
//! speak the same keys and encodings.
//!
//! - A dense tensor is a Flower `Array` of `stype` [`DENSE_STYPE`], dtype `float32`, whose
//!   bytes are a `.npy` file, as `flwr.app.Array` makes from a numpy array.
//! - In a record with [`Record::sparse`] set, a tensor whose sparse blob
//!   ([`crate::sparse_codec`]) is smaller than its dense values travels as an `Array` of `stype`
//!   [`SPARSE_STYPE`] whose bytes are the blob, so the bytes on Flower's wire are the traffic
//!   fedfuse reports; the config record then holds [`SPARSE_FLAG`].
//! - fedfuse's `server_round`, `proximal_mu` and `num_examples` are Flower's `server-round`,
//!   `proximal-mu` and `num-examples`; other keys pass unchanged.

use crate::sparse_codec::{MAX_SPARSE_VALUES, blob_if_smaller, decode_blob};
use crate::{ConfigValue, CoreError, Params, Record, Result, npz};

/// `stype` of a dense array: the bytes are a `.npy` file.
pub const DENSE_STYPE: &str = "numpy.ndarray";
/// `stype` of a sparse array: the bytes are a fedfuse sparse blob, format version 1.
pub const SPARSE_STYPE: &str = "fedfuse.sparse.v1";
/// Config key that marks a record whose tensors may travel sparse.
pub const SPARSE_FLAG: &str = "fedfuse.sparse";
/// Flower's metric key of the examples behind a reply.
pub const NUM_EXAMPLES: &str = "num-examples";
/// The only dtype fedfuse sends and accepts.
pub const DTYPE: &str = "float32";

/// fedfuse's config keys and Flower's spelling of them.
const RENAMED: [(&str, &str); 2] = [
    ("server_round", "server-round"),
    ("proximal_mu", "proximal-mu"),
];

/// One Flower `Array` with its key in the `ArrayRecord`.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowerArray {
    /// The tensor's name (a PyTorch `state_dict` key).
    pub key: String,
    /// numpy's name of the element type.
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// How `data` is encoded.
    pub stype: String,
    /// The encoded tensor.
    pub data: Vec<u8>,
}

/// A metric value as Flower's `MetricRecord` holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MetricValue {
    /// A real number.
    Float(f64),
    /// An integer (`num-examples`).
    Int(i64),
}

/// The three records of a Flower message's content, in the order their keys were given.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlowerContent {
    /// The `ArrayRecord`.
    pub arrays: Vec<FlowerArray>,
    /// The `ConfigRecord`.
    pub config: Vec<(String, ConfigValue)>,
    /// The `MetricRecord`.
    pub metrics: Vec<(String, MetricValue)>,
}

fn to_flower_key(key: &str) -> &str {
    RENAMED
        .iter()
        .find(|(ours, _)| *ours == key)
        .map_or(key, |(_, theirs)| theirs)
}

fn from_flower_key(key: &str) -> &str {
    RENAMED
        .iter()
        .find(|(_, theirs)| *theirs == key)
        .map_or(key, |(ours, _)| ours)
}

fn bad(key: &str, reason: impl Into<String>) -> CoreError {
    CoreError::Decode {
        what: format!("Flower array `{key}`"),
        reason: reason.into(),
    }
}

impl Record {
    /// The record as Flower content; dense tensors become `.npy` arrays, and in a sparse
    /// record those whose blob is smaller become sparse arrays.
    pub fn to_flower(&self) -> Result<FlowerContent> {
        let mut budget = MAX_SPARSE_VALUES;
        let mut arrays = Vec::with_capacity(self.params.len());
        for (name, t) in self.params.iter() {
            let blob = if self.sparse {
                blob_if_smaller(t, &mut budget)
            } else {
                None
            };
            let (stype, data) = match blob {
                Some(blob) => (SPARSE_STYPE, blob),
                None => (DENSE_STYPE, npz::encode_npy(&t.shape, &t.data)?),
            };
            arrays.push(FlowerArray {
                key: name.to_string(),
                dtype: DTYPE.into(),
                shape: t.shape.clone(),
                stype: stype.into(),
                data,
            });
        }
        let mut config: Vec<(String, ConfigValue)> = self
            .config
            .iter()
            .map(|(k, v)| (to_flower_key(k).to_string(), v.clone()))
            .collect();
        if self.sparse {
            config.push((SPARSE_FLAG.into(), ConfigValue::Bool(true)));
        }
        let examples = i64::try_from(self.num_examples).map_err(|_| CoreError::Decode {
            what: "record".into(),
            reason: format!("{} examples do not fit Flower's sint64", self.num_examples),
        })?;
        let mut metrics = vec![(NUM_EXAMPLES.to_string(), MetricValue::Int(examples))];
        metrics.extend(
            self.metrics
                .iter()
                .map(|(k, v)| (k.clone(), MetricValue::Float(*v))),
        );
        Ok(FlowerContent {
            arrays,
            config,
            metrics,
        })
    }

    /// A record from Flower content. Arrays must be `float32` dense `.npy` arrays or fedfuse
    /// sparse blobs whose shape matches the declared one; the blobs of one record expand to
    /// at most [`MAX_SPARSE_VALUES`] values. A missing `num-examples` is 0; a negative one or
    /// a non-finite metric is an error.
    pub fn from_flower(content: &FlowerContent) -> Result<Record> {
        let mut params = Params::new();
        let mut budget = MAX_SPARSE_VALUES;
        for a in &content.arrays {
            if a.dtype != DTYPE {
                return Err(bad(
                    &a.key,
                    format!("dtype {:?}; fedfuse exchanges float32", a.dtype),
                ));
            }
            let (shape, data) = match a.stype.as_str() {
                DENSE_STYPE => {
                    npz::decode_npy_array(&a.data).map_err(|e| bad(&a.key, e.to_string()))?
                }
                SPARSE_STYPE => {
                    let t = decode_blob(&a.data, budget).map_err(|e| bad(&a.key, e))?;
                    budget -= t.data.len();
                    (t.shape, t.data)
                }
                other => {
                    return Err(bad(
                        &a.key,
                        format!(
                            "stype {other:?}; fedfuse reads {DENSE_STYPE:?} and {SPARSE_STYPE:?}"
                        ),
                    ));
                }
            };
            if shape != a.shape {
                return Err(bad(
                    &a.key,
                    format!("declared shape {:?}, but its bytes hold {shape:?}", a.shape),
                ));
            }
            params.push(a.key.clone(), shape, data)?;
        }
        let mut record = Record::from_params(params);
        for (k, v) in &content.config {
            if k == SPARSE_FLAG {
                record.sparse = matches!(v, ConfigValue::Bool(true));
            } else {
                record
                    .config
                    .insert(from_flower_key(k).to_string(), v.clone());
            }
        }
        for (k, v) in &content.metrics {
            match (k.as_str(), *v) {
                (NUM_EXAMPLES, MetricValue::Int(n)) => {
                    record.num_examples = u64::try_from(n).map_err(|_| CoreError::Decode {
                        what: "metric `num-examples`".into(),
                        reason: format!("{n} is negative"),
                    })?;
                }
                (NUM_EXAMPLES, MetricValue::Float(f)) => {
                    return Err(CoreError::Decode {
                        what: "metric `num-examples`".into(),
                        reason: format!("{f} is not an integer count"),
                    });
                }
                (_, MetricValue::Float(f)) if f.is_finite() => {
                    record.metrics.insert(k.clone(), f);
                }
                (_, MetricValue::Int(i)) => {
                    record.metrics.insert(k.clone(), i as f64);
                }
                (_, MetricValue::Float(f)) => {
                    return Err(CoreError::Decode {
                        what: format!("metric `{k}`"),
                        reason: format!("{f} is not finite"),
                    });
                }
            }
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(sparse: bool) -> Record {
        let mut p = Params::new();
        let mut w = vec![0.0f32; 64];
        w[3] = 1.5;
        w[40] = -0.0;
        w[41] = -2.25;
        p.push("layers.0.weight", vec![8, 8], w).unwrap();
        p.push("layers.0.bias", vec![8], vec![0.5; 8]).unwrap();
        Record::from_params(p)
            .with_num_examples(17)
            .with_sparse(sparse)
            .with_config("server_round", ConfigValue::Int(3))
            .with_config("proximal_mu", ConfigValue::Float(0.01))
            .with_config("note", ConfigValue::Str("x".into()))
    }

    #[test]
    fn dense_and_sparse_round_trip_bit_for_bit() {
        for sparse in [false, true] {
            let mut r = sample(sparse);
            r.metrics.insert("train_loss".into(), 0.25);
            let c = r.to_flower().unwrap();
            assert_eq!(Record::from_flower(&c).unwrap(), r);
            let stypes: Vec<&str> = c.arrays.iter().map(|a| a.stype.as_str()).collect();
            // The mostly-zero weight goes sparse; the full bias stays dense.
            let want = if sparse {
                [SPARSE_STYPE, DENSE_STYPE]
            } else {
                [DENSE_STYPE, DENSE_STYPE]
            };
            assert_eq!(stypes, want);
            let keys: Vec<&str> = c.config.iter().map(|(k, _)| k.as_str()).collect();
            assert!(keys.contains(&"server-round") && keys.contains(&"proximal-mu"));
            assert_eq!(
                c.metrics[0],
                (NUM_EXAMPLES.to_string(), MetricValue::Int(17))
            );
        }
    }

    #[test]
    fn dense_arrays_are_npy_files_numpy_reads() {
        let c = sample(false).to_flower().unwrap();
        let bias = &c.arrays[1];
        assert!(bias.data.starts_with(b"\x93NUMPY"));
        // numpy's header names the dtype and shape; the data is the last 32 bytes.
        let text = String::from_utf8_lossy(&bias.data[10..bias.data.len() - 32]).to_string();
        assert!(
            text.contains("'descr': '<f4'") && text.contains("'shape': (8,"),
            "{text}"
        );
        assert_eq!(&bias.data[bias.data.len() - 4..], &0.5f32.to_le_bytes());
    }

    #[test]
    fn foreign_or_inconsistent_arrays_are_refused() {
        let good = sample(false).to_flower().unwrap();
        let mut f64s = good.clone();
        f64s.arrays[0].dtype = "float64".into();
        let mut torch = good.clone();
        torch.arrays[0].stype = "torch.Tensor".into();
        let mut lying = good.clone();
        lying.arrays[1].shape = vec![4, 2];
        let mut negative = good.clone();
        negative.metrics[0].1 = MetricValue::Int(-1);
        let mut nan = good.clone();
        nan.metrics
            .push(("loss".into(), MetricValue::Float(f64::NAN)));
        let mut truncated = good;
        truncated.arrays[1].data.pop();
        for (c, needle) in [
            (f64s, "float64"),
            (torch, "torch.Tensor"),
            (lying, "[4, 2]"),
            (negative, "negative"),
            (nan, "not finite"),
            (truncated, "layers.0.bias"),
        ] {
            let e = Record::from_flower(&c).unwrap_err().to_string();
            assert!(e.contains(needle), "`{needle}` not in: {e}");
        }
    }

    proptest! {
        #[test]
        fn any_record_round_trips(
            values in proptest::collection::vec(
                prop_oneof![Just(0.0f32), Just(-0.0f32), any::<f32>().prop_filter("finite", |v| v.is_finite())],
                1..200,
            ),
            sparse in any::<bool>(),
            n in 0u64..1_000_000,
        ) {
            let mut p = Params::new();
            p.push("w", vec![values.len()], values).unwrap();
            let r = Record::from_params(p).with_num_examples(n).with_sparse(sparse);
            let back = Record::from_flower(&r.to_flower().unwrap()).unwrap();
            prop_assert_eq!(back.params.get("w").map(|t| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()),
                r.params.get("w").map(|t| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()));
            prop_assert_eq!(back, r);
        }
    }
}
