use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::{CoreError, Params, Result, io, sparse_codec};

/// A configuration value carried by a [`Record`] (a Flower `ConfigRecord` entry).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigValue {
    /// A flag.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A real number.
    Float(f64),
    /// Text.
    Str(String),
}

impl ConfigValue {
    /// The value as a real number, if it is numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Int(i) => Some(*i as f64),
            Self::Float(f) => Some(*f),
            _ => None,
        }
    }
}

/// The unit of traffic between server and client: arrays, configuration, metrics and the
/// number of examples behind a reply.
///
/// Its wire form is a safetensors buffer whose header metadata carries the rest, so
/// [`Record::encode`]'s length is the traffic figure fedfuse reports.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Record {
    /// Parameter tensors (global model down, update up).
    pub params: Params,
    /// Instructions or settings (e.g. `proximal_mu`).
    pub config: BTreeMap<String, ConfigValue>,
    /// Scalar metrics (e.g. `train_loss`).
    pub metrics: BTreeMap<String, f64>,
    /// Examples the sender trained on; the FedAvg weight.
    pub num_examples: u64,
    /// Ask [`Record::encode`] to write each tensor sparse (its non-zero values and their
    /// positions, see [`crate::sparse_codec`]) where that is smaller than dense f32. Off by default,
    /// which leaves the wire form as it always was; [`Record::decode`] sets it when the buffer
    /// was written this way. Decoded values are bit-for-bit those encoded (`-0.0` included).
    pub sparse: bool,
}

const CONFIG_KEY: &str = "fedfuse.config";
const METRICS_KEY: &str = "fedfuse.metrics";
const EXAMPLES_KEY: &str = "fedfuse.num_examples";

impl Record {
    /// A record holding `params` and nothing else.
    pub fn from_params(params: Params) -> Self {
        Self {
            params,
            ..Self::default()
        }
    }

    /// Sets `num_examples`.
    pub fn with_num_examples(mut self, n: u64) -> Self {
        self.num_examples = n;
        self
    }

    /// Sets [`Record::sparse`]: whether encoding may write tensors sparse.
    pub fn with_sparse(mut self, sparse: bool) -> Self {
        self.sparse = sparse;
        self
    }

    /// Adds a configuration entry.
    pub fn with_config(mut self, key: &str, value: ConfigValue) -> Self {
        self.config.insert(key.to_string(), value);
        self
    }

    /// A numeric configuration entry.
    pub fn config_f64(&self, key: &str) -> Option<f64> {
        self.config.get(key).and_then(ConfigValue::as_f64)
    }

    /// The wire bytes: a safetensors buffer, with sparse blobs for the tensors they shrink
    /// when [`Record::sparse`] is set.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let json = |what: &str, v: std::result::Result<String, serde_json::Error>| {
            v.map_err(|e| CoreError::Decode {
                what: what.to_string(),
                reason: e.to_string(),
            })
        };
        let mut meta = HashMap::new();
        meta.insert(
            CONFIG_KEY.to_string(),
            json("record config", serde_json::to_string(&self.config))?,
        );
        meta.insert(
            METRICS_KEY.to_string(),
            json("record metrics", serde_json::to_string(&self.metrics))?,
        );
        meta.insert(EXAMPLES_KEY.to_string(), self.num_examples.to_string());
        if self.sparse {
            sparse_codec::params_to_container(&self.params, meta)
        } else {
            io::params_to_safetensors(&self.params, meta)
        }
    }

    /// Parses wire bytes, dense or sparse; any malformed buffer is an error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        // Only a buffer marked sparse takes the sparse path: dense ones decode as they always did.
        let is_sparse = sparse_codec::is_sparse_container(bytes);
        let (params, meta) = if is_sparse {
            sparse_codec::params_from_container(bytes)?
        } else {
            io::params_from_safetensors(bytes)?
        };
        let field = |key: &str| {
            meta.get(key).ok_or_else(|| CoreError::Decode {
                what: "record".into(),
                reason: format!("header metadata lacks `{key}`"),
            })
        };
        let bad = |key: &str, e: String| CoreError::Decode {
            what: format!("record field `{key}`"),
            reason: e,
        };
        let config =
            serde_json::from_str(field(CONFIG_KEY)?).map_err(|e| bad(CONFIG_KEY, e.to_string()))?;
        let metrics = serde_json::from_str(field(METRICS_KEY)?)
            .map_err(|e| bad(METRICS_KEY, e.to_string()))?;
        let num_examples = field(EXAMPLES_KEY)?
            .parse()
            .map_err(|e: std::num::ParseIntError| bad(EXAMPLES_KEY, e.to_string()))?;
        Ok(Self {
            params,
            config,
            metrics,
            num_examples,
            sparse: is_sparse,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut p = Params::new();
        p.push("layers.0.weight", vec![2, 2], vec![1.0, 2.0, 3.0, 4.0])
            .unwrap();
        let mut r = Record::from_params(p)
            .with_num_examples(42)
            .with_config("proximal_mu", ConfigValue::Float(0.01))
            .with_config("round", ConfigValue::Int(3))
            .with_config("mode", ConfigValue::Str("train".into()));
        r.metrics.insert("train_loss".into(), 0.25);
        let bytes = r.encode().unwrap();
        // 16 bytes of data + 8-byte length + header: the traffic figure is the real size.
        assert!(bytes.len() > 24);
        assert_eq!(Record::decode(&bytes).unwrap(), r);
    }

    proptest::proptest! {
        #[test]
        fn any_record_round_trips(
            tensors in proptest::collection::vec(
                (1usize..5, proptest::collection::vec(-1e6f32..1e6, 0..40)), 0..6),
            n in 0u64..1_000_000,
            loss in -10f64..10.0,
        ) {
            let mut p = Params::new();
            for (i, (rows, vals)) in tensors.into_iter().enumerate() {
                let len = vals.len() / rows * rows;
                p.push(format!("t{i}"), vec![rows, len / rows], vals[..len].to_vec()).unwrap();
            }
            let mut r = Record::from_params(p).with_num_examples(n);
            r.metrics.insert("train_loss".into(), loss);
            let back = Record::decode(&r.encode().unwrap()).unwrap();
            proptest::prop_assert_eq!(back, r);
        }
    }

    #[test]
    fn plain_safetensors_is_not_a_record() {
        let bytes = io::params_to_safetensors(&Params::new(), HashMap::new()).unwrap();
        let err = Record::decode(&bytes).unwrap_err().to_string();
        assert!(err.contains("fedfuse.config"), "{err}");
    }
}
