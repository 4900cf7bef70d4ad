//! safetensors encoding of [`Params`]: the format of model files and of [`crate::Record`]s.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::Dtype;

use crate::container::{self, FileView};
use crate::{CoreError, Params, Result};

/// Encodes `params` as safetensors bytes (little-endian f32; batch norm's
/// `num_batches_tracked` as I64, as PyTorch stores it), with `metadata` in the header.
pub fn params_to_safetensors(
    params: &Params,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>> {
    let views = params
        .iter()
        .map(|(n, t)| (n.to_string(), FileView::of(n, t)));
    container::serialize(params, views, metadata)
}

/// Decodes safetensors bytes into [`Params`] and the header's metadata.
///
/// Tensors keep the order fedfuse wrote them in; files from elsewhere (PyTorch) are ordered
/// by name with numbers compared as numbers (`layers.2` before `layers.10`). F16, BF16 and F64
/// tensors are converted to f32.
pub fn params_from_safetensors(bytes: &[u8]) -> Result<(Params, HashMap<String, String>)> {
    let c = container::parse(bytes)?;
    let names = c.order.unwrap_or_else(|| {
        let mut names: Vec<String> = c.tensors.names().into_iter().map(str::to_string).collect();
        names.sort_by_key(|n| tensor_order_key(n));
        names
    });
    let mut params = Params::new();
    for name in names {
        let view = c.tensors.tensor(&name).map_err(|e| CoreError::Decode {
            what: format!("tensor `{name}`"),
            reason: e.to_string(),
        })?;
        let data = to_f32(&name, view.dtype(), view.data())?;
        params.push(name, view.shape().to_vec(), data)?;
    }
    Ok((params, c.metadata))
}

fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let out = match dtype {
        Dtype::F32 => match bytemuck::try_cast_slice::<u8, f32>(bytes) {
            // Aligned little-endian bytes: one copy.
            Ok(values) if cfg!(target_endian = "little") => values.to_vec(),
            _ => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        },
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                f64::from_le_bytes(b) as f32
            })
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        // Batch norm's `num_batches_tracked`: a count, held as f32 (exact to 2^24 batches).
        Dtype::I64 if crate::layers::is_counter(name) => bytes
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                i64::from_le_bytes(b) as f32
            })
            .collect(),
        other => {
            return Err(CoreError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    };
    Ok(out)
}

/// Order of tensors read from files without a recorded order: modules in natural order
/// (digit runs compared as numbers, `layers.2` before `layers.10`), and inside a module
/// PyTorch's registration order, `weight` then `bias`, then batch norm's buffers as PyTorch
/// registers them, then the rest by name. (Child modules sort by name, which is PyTorch's order
/// for lists, `0`, `1`, ..., and may not be for named children: a model's known layout
/// rearranges them, [`Params::arranged`].)
pub(crate) fn tensor_order_key(name: &str) -> (NaturalKey, u8, NaturalKey) {
    let (module, leaf) = name.rsplit_once('.').unwrap_or(("", name));
    let rank = match leaf {
        "weight" => 0,
        "bias" => 1,
        "running_mean" => 2,
        "running_var" => 3,
        "num_batches_tracked" => 4,
        _ => 5,
    };
    (natural_key(module), rank, natural_key(leaf))
}

/// Digit runs as numbers, text runs as text.
type NaturalKey = Vec<(u64, String)>;

/// Sort key comparing digit runs as numbers.
fn natural_key(s: &str) -> NaturalKey {
    let mut key = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            let (d, r) = rest.split_at(digits);
            key.push((d.parse().unwrap_or(u64::MAX), String::new()));
            rest = r;
        } else {
            let text = rest.len() - rest.trim_start_matches(|c: char| !c.is_ascii_digit()).len();
            let (t, r) = rest.split_at(text);
            key.push((0, t.to_string()));
            rest = r;
        }
    }
    key
}

/// Writes `params` to a safetensors file (readable by `safetensors.torch.load_file`).
pub fn save_safetensors(params: &Params, path: &Path) -> Result<()> {
    write_safetensors(params, HashMap::new(), path)
}

/// Writes `params` with `metadata` to a safetensors file, as [`params_to_safetensors`]
/// encodes them, streamed through a temporary file beside `path` and renamed into place
/// (atomic, and with no copy of the tensors in memory). The folder must exist.
pub fn write_safetensors(
    params: &Params,
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<()> {
    let views = params
        .iter()
        .map(|(n, t)| (n.to_string(), FileView::of(n, t)));
    container::serialize_to_file(params, views, metadata, path)
}

/// Reads [`Params`] from a safetensors file.
pub fn load_safetensors(path: &Path) -> Result<Params> {
    let bytes = read_safetensors_file(path)?;
    params_from_safetensors(&bytes)
        .map(|(p, _)| p)
        .map_err(|e| match e {
            CoreError::Decode { what, reason } => CoreError::Decode {
                what: format!("{what} in {}", path.display()),
                reason,
            },
            other => other,
        })
}

/// Largest model or checkpoint file read: 8 GiB, twice the f64 copy of the largest model a
/// run accepts. A file above it is refused before a byte of it is read.
pub const MAX_FILE_BYTES: u64 = 8 << 30;

/// The header of a safetensors file may be no longer than this (safetensors' own bound).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// An open regular file at `path` and its length, at most `max` bytes: a directory, a device
/// (a link to /dev/zero) or a file above `max` is refused before anything is read.
pub(crate) fn open_regular(path: &Path, max: u64) -> Result<(std::fs::File, u64)> {
    let io = |source| CoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let refuse = |reason: String| CoreError::Decode {
        what: path.display().to_string(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if meta.is_dir() {
        return Err(refuse("is a folder; give the file itself".into()));
    }
    if !meta.is_file() {
        return Err(refuse("is not a regular file (a device or a pipe)".into()));
    }
    if meta.len() > max {
        return Err(refuse(format!(
            "is {} bytes, above the limit of {max} bytes for this kind of file",
            meta.len()
        )));
    }
    Ok((file, meta.len()))
}

/// The whole of a regular file of at most `max` bytes ([`open_regular`]): never more than its
/// length when opened, even if it grows meanwhile.
pub fn read_regular_file(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path, max)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(|source| CoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

/// The bytes of the safetensors file at `path`, its header checked before the rest is read:
/// a file whose header is not safetensors', or whose tensors do not end where the file does,
/// is refused after reading at most the header.
pub fn read_safetensors_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path, MAX_FILE_BYTES)?;
    let refuse = |reason: String| CoreError::Decode {
        what: format!("safetensors file {}", path.display()),
        reason,
    };
    let io = |source| CoreError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = file.take(len);
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix)
        .map_err(|_| refuse(format!("{len} bytes are too few for a header")))?;
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_BYTES || n > len - 8 {
        return Err(refuse(format!(
            "its first 8 bytes declare a {n}-byte header in a {len}-byte file; this is not a \
             safetensors file, or it was cut short"
        )));
    }
    // n <= len <= MAX_FILE_BYTES, so the casts below are exact.
    let mut bytes = Vec::with_capacity(8 + n as usize);
    bytes.extend_from_slice(&prefix);
    (&mut file).take(n).read_to_end(&mut bytes).map_err(io)?;
    let header: HashMap<String, serde_json::Value> = std::str::from_utf8(&bytes[8..])
        .ok()
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| refuse("its header is not a JSON object".into()))?;
    let data_end = header
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .map(|(_, v)| v["data_offsets"][1].as_u64().unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0);
    if Some(len) != data_end.checked_add(8 + n) {
        return Err(refuse(format!(
            "its header places tensor data up to byte {data_end} after a {n}-byte header, and \
             the file holds {len} bytes; it was cut short or is not a safetensors file"
        )));
    }
    bytes.reserve_exact((len - 8 - n) as usize);
    file.read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{F32View, ORDER_KEY};

    /// A file written in place holds the bytes [`params_to_safetensors`] encodes (the
    /// header's metadata may be in another order), and no temporary file is left beside it.
    #[test]
    fn written_files_read_back_with_their_metadata_and_leave_nothing_else() {
        let dir = std::env::temp_dir().join(format!("fedfuse-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let mut p = Params::new();
        p.push("0.weight", vec![2, 2], vec![1.0, -2.0, 3.5, 0.25])
            .unwrap();
        p.push("1.num_batches_tracked", vec![], vec![7.0]).unwrap();
        let meta = HashMap::from([("fedfuse.model".to_string(), "mlp".to_string())]);
        write_safetensors(&p, meta.clone(), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            params_from_safetensors(&bytes).unwrap(),
            (p.clone(), meta.clone())
        );
        let encoded = params_to_safetensors(&p, meta).unwrap();
        assert_eq!(bytes.len(), encoded.len());
        let header = 8 + u64::from_le_bytes(encoded[..8].try_into().unwrap()) as usize;
        assert_eq!(bytes[header..], encoded[header..]);
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(files.len(), 1);
        let e = write_safetensors(
            &p,
            HashMap::new(),
            &dir.join("no/such/folder/m.safetensors"),
        )
        .unwrap_err();
        assert!(matches!(e, CoreError::Io { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn batch_norm_counters_are_i64_in_files_and_buffers_take_pytorchs_order() {
        let mut p = Params::new();
        p.push("1.weight", vec![2], vec![1.0, 1.0]).unwrap();
        p.push("1.num_batches_tracked", vec![], vec![7.0]).unwrap();
        let bytes = params_to_safetensors(&p, HashMap::new()).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let counter = st.tensor("1.num_batches_tracked").unwrap();
        assert_eq!(counter.dtype(), Dtype::I64);
        assert_eq!(counter.shape(), &[] as &[usize]);
        assert_eq!(counter.data(), 7i64.to_le_bytes());
        assert_eq!(params_from_safetensors(&bytes).unwrap().0, p);
        // PyTorch's files keep no order: a module's buffers follow its weight and bias.
        let mut names = vec![
            "1.num_batches_tracked",
            "1.running_var",
            "0.weight",
            "1.bias",
            "1.running_mean",
            "1.weight",
        ];
        names.sort_by_key(|n| tensor_order_key(n));
        assert_eq!(
            names,
            [
                "0.weight",
                "1.weight",
                "1.bias",
                "1.running_mean",
                "1.running_var",
                "1.num_batches_tracked"
            ]
        );
        // Integers elsewhere are still refused, naming the tensor.
        let ints = 3i64.to_le_bytes();
        let other = safetensors::serialize(
            vec![(
                "0.weight",
                safetensors::tensor::TensorView::new(Dtype::I64, vec![1], &ints).unwrap(),
            )],
            None,
        )
        .unwrap();
        let err = params_from_safetensors(&other).unwrap_err().to_string();
        assert!(err.contains("`0.weight`") && err.contains("I64"), "{err}");
    }

    #[test]
    fn an_order_that_does_not_name_every_tensor_once_is_refused() {
        let mut p = Params::new();
        p.push("a", vec![2], vec![1.0, 2.0]).unwrap();
        p.push("b", vec![1], vec![3.0]).unwrap();
        let with_order = |order: &str| {
            let meta = HashMap::from([(ORDER_KEY.to_string(), order.to_string())]);
            let views = p.iter().map(|(n, t)| (n.to_string(), F32View(t)));
            safetensors::serialize(views, Some(meta)).unwrap()
        };
        let (read, _) = params_from_safetensors(&with_order(r#"["b", "a"]"#)).unwrap();
        assert_eq!(read.names(), ["b", "a"]);
        for order in [r#"["a"]"#, r#"["a", "a"]"#, r#"["a", "b", "c"]"#] {
            let e = params_from_safetensors(&with_order(order))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("fedfuse.order") && e.contains("each tensor once"),
                "{order}: {e}"
            );
        }
    }

    #[test]
    fn an_order_naming_none_of_many_tensors_lists_only_a_few() {
        let n = 20_000;
        let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let tensors: Vec<crate::Tensor> = (0..n)
            .map(|_| crate::Tensor::new("t", vec![1], vec![0.0]).unwrap())
            .collect();
        let other: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
        let meta = HashMap::from([(
            ORDER_KEY.to_string(),
            serde_json::to_string(&other).unwrap(),
        )]);
        let views = names
            .iter()
            .zip(&tensors)
            .map(|(n, t)| (n.clone(), F32View(t)));
        let bytes = safetensors::serialize(views, Some(meta)).unwrap();
        let e = params_from_safetensors(&bytes).unwrap_err().to_string();
        assert!(e.contains("unlisted") && e.contains("\"t0\""), "{e}");
        assert!(e.len() < 1000, "{} bytes of message", e.len());
    }

    #[test]
    fn natural_order() {
        let mut v = vec![
            "layers.10.weight",
            "layers.2.bias",
            "layers.2.weight",
            "layers.1.weight",
            "bn.running_mean",
            "bn.bias",
            "bn.num_batches_tracked",
            "bn.weight",
        ];
        v.sort_by_key(|n| tensor_order_key(n));
        assert_eq!(
            v,
            vec![
                "bn.weight",
                "bn.bias",
                "bn.running_mean",
                "bn.num_batches_tracked",
                "layers.1.weight",
                "layers.2.weight",
                "layers.2.bias",
                "layers.10.weight"
            ]
        );
    }

    #[test]
    fn round_trip_keeps_order_and_values() {
        let mut p = Params::new();
        p.push("z", vec![2], vec![1.5, -2.0]).unwrap();
        p.push("a", vec![1, 3], vec![0.1, 0.2, 0.3]).unwrap();
        let bytes = params_to_safetensors(&p, HashMap::new()).unwrap();
        let (back, meta) = params_from_safetensors(&bytes).unwrap();
        assert_eq!(back, p);
        assert!(meta.is_empty());
    }

    #[test]
    fn pytorch_style_files_convert_and_order_naturally() {
        use safetensors::tensor::TensorView;
        // As torch would write them: no fedfuse metadata, F64 / F16 / BF16 tensors.
        let f64s: Vec<u8> = [1.5f64, -2.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f16s: Vec<u8> = [0.5f32, 3.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16s: Vec<u8> = [-4.0f32]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let tensors = vec![
            (
                "layers.10.weight",
                TensorView::new(Dtype::F64, vec![1, 2], &f64s).unwrap(),
            ),
            (
                "layers.2.weight",
                TensorView::new(Dtype::F16, vec![2], &f16s).unwrap(),
            ),
            (
                "layers.2.bias",
                TensorView::new(Dtype::BF16, vec![1], &bf16s).unwrap(),
            ),
        ];
        let bytes = safetensors::serialize(tensors, None).unwrap();
        let (p, _) = params_from_safetensors(&bytes).unwrap();
        assert_eq!(
            p.names(),
            ["layers.2.weight", "layers.2.bias", "layers.10.weight"]
        );
        assert_eq!(p.get("layers.10.weight").unwrap().data, vec![1.5, -2.25]);
        assert_eq!(p.get("layers.2.weight").unwrap().data, vec![0.5, 3.0]);
        assert_eq!(p.get("layers.2.bias").unwrap().data, vec![-4.0]);
        // A PyTorch MLP saved without our order metadata reads back as an MLP.
        let w0 = [0u8; 4 * 6];
        let b0 = [0u8; 4 * 3];
        let w1 = [0u8; 4 * 6];
        let b1 = [0u8; 4 * 2];
        let torch = safetensors::serialize(
            vec![
                (
                    "layers.1.bias",
                    TensorView::new(Dtype::F32, vec![2], &b1).unwrap(),
                ),
                (
                    "layers.0.bias",
                    TensorView::new(Dtype::F32, vec![3], &b0).unwrap(),
                ),
                (
                    "layers.1.weight",
                    TensorView::new(Dtype::F32, vec![2, 3], &w1).unwrap(),
                ),
                (
                    "layers.0.weight",
                    TensorView::new(Dtype::F32, vec![3, 2], &w0).unwrap(),
                ),
            ],
            None,
        )
        .unwrap();
        let (mlp, _) = params_from_safetensors(&torch).unwrap();
        assert_eq!(
            crate::ModelSpec::infer_mlp(&mlp).unwrap(),
            crate::ModelSpec::mlp(2, &[3], 2)
        );
        let ints = [1u8, 2, 3, 4];
        let bad = safetensors::serialize(
            vec![("w", TensorView::new(Dtype::I32, vec![1], &ints).unwrap())],
            None,
        )
        .unwrap();
        let err = params_from_safetensors(&bad).unwrap_err().to_string();
        assert!(err.contains("`w`") && err.contains("I32"), "{err}");
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(params_from_safetensors(b"not a safetensors file").is_err());
        assert!(params_from_safetensors(&[]).is_err());
    }
}
