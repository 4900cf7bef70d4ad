//! `.npz` input: numpy archives (`numpy.savez`, `numpy.savez_compressed`) read as [`Params`].
//!
//! An `.npz` is a zip archive (stored or deflated) with one `NAME.npy` member per array.
//! Each member becomes the tensor `NAME`. float16, float32 and float64 arrays, little- or
//! big-endian, in C or Fortran order, are read and converted to row-major f32; any other dtype
//! is an error naming the array.

use std::io::{Cursor, Read};
use std::path::Path;

use npyz::{NpyFile, NpyHeader, Order, TypeChar, TypeStr};
use py_literal::Value;

use crate::io::tensor_order_key;
use crate::{CoreError, Params, Result};

/// The first bytes of every `.npy` array.
const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// numpy's own reader refuses longer headers (`max_header_size`); ours leaves ample room.
const MAX_HEADER_LEN: usize = 1 << 20;

/// The most array data one archive may declare over all its members: 1G float32 values, far
/// above any model fedfuse fuses. A deflated member can expand about a thousandfold, so this
/// bound, not the file's size, is what bounds the memory an archive can take.
pub const MAX_NPZ_DATA: usize = 4 << 30;

/// The `.npy` preamble: magic, version and the header's length (4 bytes from version 2).
const NPY_PREAMBLE: usize = 12;

/// Decodes the bytes of an `.npz` archive into [`Params`].
///
/// Members named `NAME.npy` become tensors `NAME`, ordered by name with numbers compared as
/// numbers (`layers.2` before `layers.10`), as [`crate::params_from_safetensors`] orders files
/// from elsewhere. float16 and float64 arrays are converted to f32 and Fortran-order arrays to
/// row-major order. Errors name the member; any other dtype, a member that is not `.npy` and
/// a malformed or truncated archive or array are errors.
pub fn params_from_npz(bytes: &[u8]) -> Result<Params> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| CoreError::Decode {
        what: "npz archive".into(),
        reason: e.to_string(),
    })?;
    refuse_overlaps(&mut archive)?;
    let mut arrays = Vec::with_capacity(archive.len());
    let mut budget = MAX_NPZ_DATA;
    for index in 0..archive.len() {
        let mut member = archive.by_index(index).map_err(|e| CoreError::Decode {
            what: format!("npz member #{index}"),
            reason: e.to_string(),
        })?;
        let member_name = member
            .name()
            .map_err(|e| CoreError::Decode {
                what: format!("npz member #{index}"),
                reason: e.to_string(),
            })?
            .into_owned();
        let decode_err = |reason: String| CoreError::Decode {
            what: format!("npz member `{member_name}`"),
            reason,
        };
        let Some(name) = member_name.strip_suffix(".npy") else {
            return Err(decode_err(
                "not a `.npy` array: an npz archive holds only `NAME.npy` members".into(),
            ));
        };
        let npy = read_member(&mut member, &mut budget).map_err(decode_err)?;
        let (shape, data) = decode_npy(&npy).map_err(decode_err)?;
        arrays.push((name.to_string(), shape, data));
    }
    arrays.sort_by_cached_key(|(name, _, _)| tensor_order_key(name));
    let mut params = Params::new();
    for (name, shape, data) in arrays {
        params.push(name, shape, data)?;
    }
    Ok(params)
}

/// Refuses an archive two of whose members share bytes, before anything is inflated: numpy
/// never writes one, and it is how a small file makes one compressed stream count many times
/// over (an overlapping-member zip bomb).
fn refuse_overlaps(archive: &mut zip::ZipArchive<Cursor<&[u8]>>) -> Result<()> {
    let mut spans = Vec::with_capacity(archive.len());
    for index in 0..archive.len() {
        let member = archive.by_index_raw(index).map_err(|e| CoreError::Decode {
            what: format!("npz member #{index}"),
            reason: e.to_string(),
        })?;
        let start = member.header_start();
        let end = member
            .data_start()
            .unwrap_or(start)
            .saturating_add(member.compressed_size());
        spans.push((start, end, index));
    }
    spans.sort_unstable();
    match spans.windows(2).find(|w| w[1].0 < w[0].1) {
        Some(w) => Err(CoreError::Decode {
            what: format!("npz member #{}", w[1].2),
            reason: format!(
                "its bytes overlap those of member #{}; numpy never writes such an archive",
                w[0].2
            ),
        }),
        None => Ok(()),
    }
}

/// Reads one member's `.npy` bytes, never more than its header declares: the preamble and
/// header first (at most [`MAX_HEADER_LEN`]), then the data the header's shape and dtype call
/// for and one byte more, to tell a member that holds more. Each member's data is taken from
/// `budget`, the bytes left for the whole archive. So a member that inflates to gigabytes
/// behind a small header (a zip bomb) costs a few bytes more than its header says.
fn read_member(member: &mut impl Read, budget: &mut usize) -> std::result::Result<Vec<u8>, String> {
    let read_err = |e: std::io::Error| e.to_string();
    let mut npy = Vec::new();
    member
        .by_ref()
        .take(NPY_PREAMBLE as u64)
        .read_to_end(&mut npy)
        .map_err(read_err)?;
    // Version 1 keeps its header length in 2 bytes: the 2 read beyond are the header's.
    let header_end = match npy.get(6) {
        Some(1) if npy.len() >= 10 => 10 + usize::from(u16::from_le_bytes([npy[8], npy[9]])),
        Some(2 | 3) if npy.len() == NPY_PREAMBLE => {
            let len = u32::from_le_bytes([npy[8], npy[9], npy[10], npy[11]]);
            NPY_PREAMBLE.saturating_add(usize::try_from(len).unwrap_or(usize::MAX))
        }
        // Too short or not `.npy`: decode_npy says which.
        _ => return Ok(npy),
    };
    if header_end > NPY_PREAMBLE + MAX_HEADER_LEN {
        return Err(format!(
            "header of {} bytes is implausibly long",
            header_end - NPY_PREAMBLE
        ));
    }
    member
        .by_ref()
        .take(header_end.saturating_sub(npy.len()) as u64)
        .read_to_end(&mut npy)
        .map_err(read_err)?;
    let (text_start, data_start) = header_bounds(&npy)?;
    let text = &npy[text_start..data_start];
    let needed = match canonical_f4_shape(text) {
        Some(shape) => shape.iter().try_fold(4usize, |acc, &d| acc.checked_mul(d)),
        None => {
            let checked = check_header(text)?;
            checked.len.checked_mul(checked.item_size)
        }
    }
    .ok_or_else(|| "the header's shape is too large".to_string())?;
    let have = npy.len() - data_start;
    if needed > *budget {
        return Err(format!(
            "its header declares {needed} bytes of data, more than the {} left of the \
             {MAX_NPZ_DATA} an archive may hold",
            *budget
        ));
    }
    *budget -= needed;
    let want = needed.saturating_sub(have).saturating_add(1);
    npy.try_reserve_exact(want)
        .map_err(|e| format!("cannot hold {needed} bytes of data: {e}"))?;
    member
        .by_ref()
        .take(want as u64)
        .read_to_end(&mut npy)
        .map_err(read_err)?;
    let held = npy.len() - data_start;
    if held > needed {
        return Err(format!(
            "holds more data than its header declares ({needed} bytes); a crafted or \
             corrupt archive"
        ));
    }
    Ok(npy)
}

/// Reads [`Params`] from an `.npz` file, as written by `numpy.savez` or
/// `numpy.savez_compressed` (see [`params_from_npz`]). Errors name the file.
pub fn load_npz(path: &Path) -> Result<Params> {
    let bytes = read_file(path)?;
    params_from_npz(&bytes).map_err(|e| in_file(e, path))
}

/// Reads [`Params`] from a `.safetensors` or `.npz` file, chosen by the file's extension
/// (in any case); any other extension is an error naming the file.
pub fn load_params(path: &Path) -> Result<Params> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("safetensors") => crate::load_safetensors(path),
        Some("npz") => load_npz(path),
        other => Err(CoreError::Decode {
            what: format!("parameters file {}", path.display()),
            reason: format!(
                "{}; fedfuse reads `.safetensors` and `.npz` (numpy.savez) files",
                match other {
                    Some(ext) => format!("unknown extension `.{ext}`"),
                    None => "no file extension".to_string(),
                }
            ),
        }),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    crate::io::read_regular_file(path, crate::io::MAX_FILE_BYTES)
}

/// Adds the file to an error from decoding it.
fn in_file(e: CoreError, path: &Path) -> CoreError {
    match e {
        CoreError::Decode { what, reason } => CoreError::Decode {
            what: format!("{what} in {}", path.display()),
            reason,
        },
        other => CoreError::Decode {
            what: path.display().to_string(),
            reason: other.to_string(),
        },
    }
}

/// One `.npy` file (what `numpy.save` writes) of a row-major f32 array: the
/// bytes a Flower `Array` of `stype` `numpy.ndarray` carries.
pub fn encode_npy(shape: &[usize], values: &[f32]) -> Result<Vec<u8>> {
    use npyz::WriterBuilder;
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let fail = |e: std::io::Error| CoreError::Decode {
        what: "npy array".into(),
        reason: e.to_string(),
    };
    let mut out = Vec::with_capacity(128 + 4 * values.len());
    npyz::WriteOptions::<f32>::new()
        .dtype(npyz::DType::Plain("<f4".parse().map_err(|e| {
            CoreError::Decode {
                what: "npy array".into(),
                reason: format!("{e}"),
            }
        })?))
        .shape(&shape)
        .writer(&mut out)
        .write_header_only()
        .map_err(fail)?;
    // The data in one pass (npyz's writer takes it value by value through io::Write).
    out.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    Ok(out)
}

/// Shape (row-major) and values of one `.npy` array, checked before anything is allocated.
pub fn decode_npy_array(bytes: &[u8]) -> Result<(Vec<usize>, Vec<f32>)> {
    decode_npy(bytes).map_err(|reason| CoreError::Decode {
        what: "npy array".into(),
        reason,
    })
}

/// Shape (row-major) and values of one `.npy` array.
fn decode_npy(bytes: &[u8]) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
    let (text_start, data_start) = header_bounds(bytes)?;
    let (header_bytes, data) = bytes.split_at(data_start);
    if let Some(shape) = canonical_f4_shape(&header_bytes[text_start..]) {
        // The general path's rule: the product over the non-zero axes fits too.
        let fits = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
            .is_some();
        let needed = shape.iter().try_fold(4usize, |acc, &d| acc.checked_mul(d));
        if fits && needed == Some(data.len()) {
            let values = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            return Ok((shape, values));
        }
        // A size mismatch gets the general path's message.
    }
    let checked = check_header(&header_bytes[text_start..])?;
    let needed = checked
        .len
        .checked_mul(checked.item_size)
        .ok_or_else(|| format!("shape {:?} is too large", checked.shape))?;
    if data.len() != needed {
        return Err(format!(
            "shape {:?} of dtype '{}' needs {needed} bytes of data, but the array holds {}{}",
            checked.shape,
            checked.descr,
            data.len(),
            if data.len() < needed {
                " (truncated?)"
            } else {
                ""
            }
        ));
    }
    // The header is now known to hold a float dtype and a shape whose products fit in
    // usize: npyz's own (unchecked) arithmetic on it cannot overflow.
    let header = NpyHeader::from_reader(header_bytes).map_err(|e| e.to_string())?;
    // What numpy writes by default (and every Flower array fedfuse sends): little-endian
    // float32 in C order, read as one pass over the bytes rather than value by value.
    if checked.descr == "<f4" && header.order() == Order::C {
        let values = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        return Ok((checked.shape, values));
    }
    let order = header.order();
    let npy = NpyFile::with_header(header, data);
    let values: Vec<f32> = match checked.item_size {
        2 => npy
            .into_vec::<half::f16>()
            .map(|v| v.into_iter().map(f32::from).collect()),
        4 => npy.into_vec::<f32>(),
        _ => npy
            .into_vec::<f64>()
            .map(|v| v.into_iter().map(|x| x as f32).collect()),
    }
    .map_err(|e| e.to_string())?;
    let values = match order {
        Order::C => values,
        Order::Fortran => fortran_to_c(&checked.shape, &values),
    };
    Ok((checked.shape, values))
}

/// The shape of a header exactly as `numpy.save` writes it for a little-endian float32 array
/// in C order (`{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` and padding);
/// `None` for any other header, which the general parser then reads. Every Flower array
/// fedfuse receives has this header: reading it directly saves two full parses per array.
fn canonical_f4_shape(text: &[u8]) -> Option<Vec<usize>> {
    let text = std::str::from_utf8(text)
        .ok()?
        .trim_end_matches([' ', '\n']);
    let dims = text
        .strip_prefix("{'descr': '<f4', 'fortran_order': False, 'shape': (")?
        .strip_suffix("), }")?;
    if dims.is_empty() {
        return Some(Vec::new());
    }
    // numpy writes `(n,)` for one axis and `(a, b)` for more; npyz `(a, b, )`.
    let dims = dims
        .strip_suffix(", ")
        .or_else(|| dims.strip_suffix(','))
        .unwrap_or(dims);
    dims.split(", ")
        .map(|d| {
            (!d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .then(|| d.parse().ok())
                .flatten()
        })
        .collect()
}

/// Where the header's dict begins and where the data begins, checked against the length
/// of `bytes`.
fn header_bounds(bytes: &[u8]) -> std::result::Result<(usize, usize), String> {
    let truncated = || format!("truncated .npy header ({} bytes)", bytes.len());
    if !bytes.starts_with(NPY_MAGIC) {
        return Err(
            if bytes.len() < NPY_MAGIC.len() && NPY_MAGIC.starts_with(bytes) {
                truncated()
            } else {
                "not a .npy array (no \\x93NUMPY magic)".to_string()
            },
        );
    }
    let [major, minor] = *bytes.get(6..8).and_then(as_array).ok_or_else(truncated)?;
    let (len, start) = match major {
        1 => {
            let len: [u8; 2] = *bytes.get(8..10).and_then(as_array).ok_or_else(truncated)?;
            (usize::from(u16::from_le_bytes(len)), 10)
        }
        2 | 3 => {
            let len: [u8; 4] = *bytes.get(8..12).and_then(as_array).ok_or_else(truncated)?;
            let len = usize::try_from(u32::from_le_bytes(len)).unwrap_or(usize::MAX);
            (len, 12)
        }
        _ => return Err(format!("unsupported .npy format version {major}.{minor}")),
    };
    if len > MAX_HEADER_LEN {
        return Err(format!("header of {len} bytes is implausibly long"));
    }
    let end = start + len;
    if end > bytes.len() {
        return Err(format!(
            "header needs {end} bytes but the array holds {} (truncated?)",
            bytes.len()
        ));
    }
    Ok((start, end))
}

fn as_array<const N: usize>(s: &[u8]) -> Option<&[u8; N]> {
    s.try_into().ok()
}

/// What [`check_header`] found.
struct Checked {
    descr: String,
    item_size: usize,
    shape: Vec<usize>,
    len: usize,
}

/// Checks a header's dict before npyz reads it: a plain float dtype of 2, 4 or 8 bytes, a
/// boolean `fortran_order`, and a shape of non-negative integers whose products (over the
/// non-zero axes too, which npyz computes strides from) fit in usize.
fn check_header(text: &[u8]) -> std::result::Result<Checked, String> {
    let text = std::str::from_utf8(text).map_err(|_| "header is not text")?;
    let dict = match text.trim().parse::<Value>() {
        Ok(Value::Dict(dict)) => dict,
        Ok(_) => return Err("header is not a Python dict".into()),
        Err(e) => return Err(format!("cannot parse header: {e}")),
    };
    let get = |key: &str| {
        dict.iter()
            .find(|(k, _)| matches!(k, Value::String(s) if s == key))
            .map(|(_, v)| v)
            .ok_or_else(|| format!("header lacks '{key}'"))
    };
    let descr = match get("descr")? {
        Value::String(s) => s.clone(),
        other => {
            return Err(format!(
                "dtype {other} is structured; fedfuse reads float16, float32 and float64 arrays"
            ));
        }
    };
    let ty: TypeStr = descr
        .parse()
        .map_err(|e| format!("invalid dtype '{descr}': {e}"))?;
    let item_size = match (ty.type_char(), ty.size_field()) {
        (TypeChar::Float, size @ (2 | 4 | 8)) => size as usize,
        _ => {
            return Err(format!(
                "dtype '{descr}' ({}) is not supported; fedfuse reads float16, float32 and \
                 float64 arrays ('f2', 'f4', 'f8')",
                dtype_name(&ty)
            ));
        }
    };
    if !matches!(get("fortran_order")?, Value::Boolean(_)) {
        return Err("header's 'fortran_order' is not a bool".into());
    }
    let dims = match get("shape")? {
        Value::Tuple(dims) | Value::List(dims) => dims,
        _ => return Err("header's 'shape' is not a tuple".into()),
    };
    let mut shape = Vec::with_capacity(dims.len());
    for dim in dims {
        match dim {
            Value::Integer(n) => shape.push(
                usize::try_from(n).map_err(|_| format!("invalid dimension {n} in the shape"))?,
            ),
            other => return Err(format!("invalid dimension {other} in the shape")),
        }
    }
    let too_large = || format!("shape {shape:?} is too large");
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d.max(1) as u64))
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(too_large)?;
    let len = shape.iter().product();
    Ok(Checked {
        descr,
        item_size,
        shape,
        len,
    })
}

/// numpy's name of a (rejected) dtype, for error messages.
fn dtype_name(ty: &TypeStr) -> String {
    let bits = ty.size_field().saturating_mul(8);
    match ty.type_char() {
        TypeChar::Bool => "bool".into(),
        TypeChar::Int => format!("int{bits}"),
        TypeChar::Uint => format!("uint{bits}"),
        TypeChar::Float => format!("float{bits}"),
        TypeChar::Complex => format!("complex{bits}"),
        TypeChar::Object => "object".into(),
        other => format!("{other:?}"),
    }
}

/// Reorders values stored in Fortran order (first axis fastest) to row-major order.
fn fortran_to_c(shape: &[usize], values: &[f32]) -> Vec<f32> {
    if shape.len() < 2 || values.is_empty() {
        return values.to_vec();
    }
    // Offsets in the Fortran-order data of a step along each axis.
    let mut strides = Vec::with_capacity(shape.len());
    let mut stride = 1;
    for &d in shape {
        strides.push(stride);
        stride *= d;
    }
    let mut out = Vec::with_capacity(values.len());
    let mut index = vec![0usize; shape.len()];
    let mut offset = 0;
    for _ in 0..values.len() {
        out.push(values[offset]);
        // Next row-major index: the last axis moves fastest.
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            offset += strides[axis];
            if index[axis] < shape[axis] {
                break;
            }
            offset -= strides[axis] * shape[axis];
            index[axis] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that counts the bytes taken from it.
    struct Counted<R> {
        inner: R,
        taken: usize,
    }

    impl<R: Read> Read for Counted<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.taken += n;
            Ok(n)
        }
    }

    #[test]
    fn a_member_reads_no_more_than_its_header_declares() {
        let header = encode_npy(&[2, 2], &[0.0; 4]).unwrap();
        let header = &header[..header.len() - 16];
        // A (2, 2) float32 array followed by a gigabyte: what a zip bomb inflates to.
        let mut bomb = Counted {
            inner: Cursor::new(header.to_vec()).chain(std::io::repeat(0).take(1 << 30)),
            taken: 0,
        };
        let mut budget = MAX_NPZ_DATA;
        let e = read_member(&mut bomb, &mut budget).unwrap_err();
        assert!(
            e.contains("more data than its header declares (16 bytes)"),
            "{e}"
        );
        assert_eq!(
            bomb.taken,
            header.len() + 16 + 1,
            "read past the declared size"
        );

        // The archive's budget: a second member may not take what the first took.
        let mut budget = 20;
        let mut ok = Cursor::new(encode_npy(&[2, 2], &[1.0; 4]).unwrap());
        assert_eq!(
            read_member(&mut ok, &mut budget).unwrap().len(),
            header.len() + 16
        );
        assert_eq!(budget, 4);
        let mut second = Cursor::new(encode_npy(&[2, 2], &[1.0; 4]).unwrap());
        let e = read_member(&mut second, &mut budget).unwrap_err();
        assert!(
            e.contains("declares 16 bytes of data, more than the 4 left"),
            "{e}"
        );
    }

    #[test]
    fn numpys_own_float32_headers_take_the_fast_path_with_the_general_parsers_shape() {
        for header in [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (100, 784), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0, 3), }   \n",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, ), }",
        ] {
            let fast = canonical_f4_shape(header.as_bytes());
            let general = check_header(header.as_bytes()).unwrap().shape;
            assert_eq!(fast, Some(general), "{header}");
        }
        // Anything else goes to the general parser.
        for header in [
            "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }",
            "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }",
            "{'shape': (2, 3), 'descr': '<f4', 'fortran_order': False, }",
        ] {
            assert_eq!(canonical_f4_shape(header.as_bytes()), None, "{header}");
        }
        // What encode_npy writes (numpy's layout) decodes on the fast path, values exact.
        let values = [1.5f32, -0.0, f32::MIN_POSITIVE, 7.25, 1e30, -2.0];
        let bytes = encode_npy(&[2, 3], &values).unwrap();
        let (start, end) = header_bounds(&bytes).unwrap();
        assert!(canonical_f4_shape(&bytes[start..end]).is_some());
        let (shape, got) = decode_npy_array(&bytes).unwrap();
        assert_eq!(shape, [2, 3]);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            values.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn fortran_to_c_transposes() {
        // [[0, 1, 2], [3, 4, 5]] stored column by column.
        let f = [0.0, 3.0, 1.0, 4.0, 2.0, 5.0];
        assert_eq!(fortran_to_c(&[2, 3], &f), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // A 2x3x4 array whose element (i, j, k) is 100i + 10j + k.
        let shape = [2, 3, 4];
        let mut f = vec![0.0; 24];
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    f[i + 2 * j + 6 * k] = (100 * i + 10 * j + k) as f32;
                }
            }
        }
        let c = fortran_to_c(&shape, &f);
        let want: Vec<f32> = (0..2)
            .flat_map(|i| {
                (0..3).flat_map(move |j| (0..4).map(move |k| (100 * i + 10 * j + k) as f32))
            })
            .collect();
        assert_eq!(c, want);
        assert_eq!(fortran_to_c(&[0, 3], &[]), Vec::<f32>::new());
        assert_eq!(fortran_to_c(&[], &[7.0]), [7.0]);
    }

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = NPY_MAGIC.to_vec();
        b.extend([1, 0]);
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn overflowing_shapes_are_errors_not_panics() {
        for shape in [
            "(18446744073709551615, 2)",
            "(0, 4294967296, 4294967296)",
            "(4294967296, 4294967296, 0)",
            "(-1,)",
            "(1.5,)",
            "(99999999999999999999999,)",
            "'x'",
        ] {
            let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}\n");
            let err = decode_npy(&npy(&h, &[])).unwrap_err();
            assert!(
                err.contains("shape") || err.contains("dimension"),
                "{shape}: {err}"
            );
        }
    }

    #[test]
    fn malformed_headers_are_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "truncated"),
            (b"\x93NUM", "truncated"),
            (b"\x93NUMPY\x01", "truncated"),
            (b"PK\x03\x04 not npy", "magic"),
            (b"\x93NUMPY\x09\x00\x00\x00", "version"),
            (b"\x93NUMPY\x01\x00\xff\x00{}", "truncated"),
            (b"\x93NUMPY\x02\x00\xff\xff\xff\xff{}", "implausibly long"),
        ];
        for (bytes, want) in cases {
            let err = decode_npy(bytes).unwrap_err();
            assert!(err.contains(want), "{bytes:?}: {err}");
        }
        for (header, want) in [
            ("[1, 2]", "not a Python dict"),
            ("{'descr': '<f4', 'shape': (1,)}", "fortran_order"),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}",
                "not a bool",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", "'shape'"),
            ("{'descr': '<f4', 'fortran_order': False", "cannot parse"),
            (
                "{'descr': '<q7', 'fortran_order': False, 'shape': ()}",
                "invalid dtype",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}",
                "structured",
            ),
            (
                "{'descr': '<f16', 'fortran_order': False, 'shape': ()}",
                "float128",
            ),
            (
                "{'descr': '|b1', 'fortran_order': False, 'shape': ()}",
                "bool",
            ),
            (
                "{'descr': '<u2', 'fortran_order': False, 'shape': ()}",
                "uint16",
            ),
            (
                "{'descr': '|O', 'fortran_order': False, 'shape': ()}",
                "object",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': ()}",
                "complex64",
            ),
        ] {
            let err = decode_npy(&npy(header, &[0; 16])).unwrap_err();
            assert!(err.contains(want), "{header}: {err}");
        }
    }

    #[test]
    fn data_length_must_match_the_shape() {
        let h = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }\n";
        let ok = decode_npy(&npy(h, &[0; 16])).unwrap();
        assert_eq!(ok, (vec![2], vec![0.0, 0.0]));
        let short = decode_npy(&npy(h, &[0; 15])).unwrap_err();
        assert!(
            short.contains("needs 16 bytes") && short.contains("truncated"),
            "{short}"
        );
        let long = decode_npy(&npy(h, &[0; 17])).unwrap_err();
        assert!(long.contains("holds 17"), "{long}");
    }
}
