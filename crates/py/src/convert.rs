//! Python values to fedfuse's and back: tensors, Flower content, config values, the error
//! type, and the record round trip the strategy and ClientApp make.

use std::path::Path;

use fedfuse_core::flower::{FlowerArray, FlowerContent, MetricValue};
use fedfuse_core::{ConfigValue, Params, Record};
use fedfuse_lab::Config;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

create_exception!(
    _core,
    FedfuseError,
    PyValueError,
    "A fedfuse setting, input or reply was invalid; the message says which and why."
);

pub(crate) fn err(e: impl std::fmt::Display) -> PyErr {
    FedfuseError::new_err(e.to_string())
}

/// A JSON value as the Python object `json.loads` would make of it, so that Python gets
/// dicts and lists from Rust rather than text to parse.
pub(crate) fn json_to_py<'py>(
    py: Python<'py>,
    value: &serde_json::Value,
) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(json_to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(fields) => {
            let dict = PyDict::new(py);
            for (k, v) in fields {
                dict.set_item(k, json_to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// The Python object of `value` serialised: dicts, lists, numbers, strings, None.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    json_to_py(py, &serde_json::to_value(value).map_err(err)?)
}

/// A Flower config value as Python gives it (bool before int: Python's bools are ints).
#[derive(FromPyObject, IntoPyObject)]
pub(crate) enum PyConfigValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl From<PyConfigValue> for ConfigValue {
    fn from(v: PyConfigValue) -> Self {
        match v {
            PyConfigValue::Bool(b) => Self::Bool(b),
            PyConfigValue::Int(i) => Self::Int(i),
            PyConfigValue::Float(f) => Self::Float(f),
            PyConfigValue::Str(s) => Self::Str(s),
        }
    }
}

impl From<ConfigValue> for PyConfigValue {
    fn from(v: ConfigValue) -> Self {
        match v {
            ConfigValue::Bool(b) => Self::Bool(b),
            ConfigValue::Int(i) => Self::Int(i),
            ConfigValue::Float(f) => Self::Float(f),
            ConfigValue::Str(s) => Self::Str(s),
        }
    }
}

/// A metric value as Python gives it.
#[derive(FromPyObject, IntoPyObject)]
pub(crate) enum PyMetric {
    Int(i64),
    Float(f64),
}

pub(crate) type PyArray<'py> = (String, String, Vec<usize>, String, Bound<'py, PyBytes>);
pub(crate) type PyArrays<'py> = Vec<PyArray<'py>>;
pub(crate) type PyContent<'py> = (
    PyArrays<'py>,
    Vec<(String, PyConfigValue)>,
    Vec<(String, PyMetric)>,
);

pub(crate) fn arrays_from_py(arrays: PyArrays<'_>) -> Vec<FlowerArray> {
    arrays
        .into_iter()
        .map(|(key, dtype, shape, stype, data)| FlowerArray {
            key,
            dtype,
            shape,
            stype,
            data: data.as_bytes().to_vec(),
        })
        .collect()
}

pub(crate) fn arrays_to_py(py: Python<'_>, arrays: Vec<FlowerArray>) -> PyArrays<'_> {
    arrays
        .into_iter()
        .map(|a| (a.key, a.dtype, a.shape, a.stype, PyBytes::new(py, &a.data)))
        .collect()
}

pub(crate) fn content_from_py(c: PyContent<'_>) -> FlowerContent {
    let (arrays, config, metrics) = c;
    FlowerContent {
        arrays: arrays_from_py(arrays),
        config: config.into_iter().map(|(k, v)| (k, v.into())).collect(),
        metrics: metrics
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    PyMetric::Int(i) => MetricValue::Int(i),
                    PyMetric::Float(f) => MetricValue::Float(f),
                };
                (k, v)
            })
            .collect(),
    }
}

pub(crate) fn content_to_py(py: Python<'_>, c: FlowerContent) -> PyContent<'_> {
    let arrays = arrays_to_py(py, c.arrays);
    let config = c.config.into_iter().map(|(k, v)| (k, v.into())).collect();
    let metrics = c
        .metrics
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                MetricValue::Int(i) => PyMetric::Int(i),
                MetricValue::Float(f) => PyMetric::Float(f),
            };
            (k, v)
        })
        .collect();
    (arrays, config, metrics)
}

/// Bytes a content puts on Flower's wire: its arrays' encoded data (records and protobuf
/// framing add a few dozen bytes per array).
pub(crate) fn wire_bytes(c: &FlowerContent) -> usize {
    c.arrays.iter().map(|a| a.data.len()).sum()
}

/// Tensors as `(name, shape, little-endian f32 bytes)` triples.
pub(crate) type PyTensors<'py> = Vec<(String, Vec<usize>, Bound<'py, PyBytes>)>;

pub(crate) fn params_from_py(model: PyTensors<'_>, client: usize) -> PyResult<Params> {
    let mut p = Params::new();
    for (name, shape, bytes) in model {
        let raw = bytes.as_bytes();
        if raw.len() % 4 != 0 {
            return Err(err(format!(
                "model {client}, tensor `{name}`: {} bytes are not whole float32 values",
                raw.len()
            )));
        }
        let data: Vec<f32> = raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        p.push(name.clone(), shape, data)
            .map_err(|e| err(format!("model {client}, tensor `{name}`: {e}")))?;
    }
    Ok(p)
}

pub(crate) fn params_to_py<'py>(py: Python<'py>, p: &Params) -> PyTensors<'py> {
    p.iter()
        .map(|(name, t)| {
            let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name.to_string(), t.shape.clone(), PyBytes::new(py, &bytes))
        })
        .collect()
}

/// A record's tensors, config and metrics as Flower content (`sparse`: tensors may travel
/// sparse), and back: the round trip the Flower strategy and ClientApp make.
#[pyfunction]
pub(crate) fn record_to_flower<'py>(
    py: Python<'py>,
    tensors: PyTensors<'py>,
    config: Vec<(String, PyConfigValue)>,
    metrics: Vec<(String, f64)>,
    num_examples: u64,
    sparse: bool,
) -> PyResult<PyContent<'py>> {
    let mut r = Record::from_params(params_from_py(tensors, 0)?)
        .with_num_examples(num_examples)
        .with_sparse(sparse);
    r.config = config.into_iter().map(|(k, v)| (k, v.into())).collect();
    r.metrics = metrics.into_iter().collect();
    Ok(content_to_py(py, r.to_flower().map_err(err)?))
}

/// The record in Flower content: `(tensors, config, metrics, num_examples, sparse)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn record_from_flower<'py>(
    py: Python<'py>,
    content: PyContent<'py>,
) -> PyResult<(
    PyTensors<'py>,
    Vec<(String, PyConfigValue)>,
    Vec<(String, f64)>,
    u64,
    bool,
)> {
    let r = Record::from_flower(&content_from_py(content)).map_err(err)?;
    let config = r.config.into_iter().map(|(k, v)| (k, v.into())).collect();
    let metrics = r.metrics.into_iter().collect();
    Ok((
        params_to_py(py, &r.params),
        config,
        metrics,
        r.num_examples,
        r.sparse,
    ))
}

/// The run config at `config` with `--set`-style `overrides`, as `fedfuse run` reads it.
pub(crate) fn load_config(config: &str, overrides: Vec<String>) -> PyResult<Config> {
    Config::load(Path::new(config), &overrides).map_err(err)
}
