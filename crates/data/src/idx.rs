//! IDX files (the MNIST format), raw or gzip-compressed, and small file helpers.

use std::io::Read;
use std::path::Path;

use crate::error::{DataError, Result};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

/// Reads a whole file, transparently decompressing it when it starts with the gzip magic
/// bytes `1f 8b`.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    maybe_gunzip(read_raw(path)?, path)
}

/// The bytes of the regular file at `path`, at most [`MAX_INFLATED`] of them: a folder, a
/// device (a link to /dev/zero) or a larger file is refused before anything is read.
fn read_raw(path: &Path) -> Result<Vec<u8>> {
    Ok(match fedfuse_core::read_regular_file(path, MAX_INFLATED) {
        Ok(raw) => raw,
        Err(fedfuse_core::CoreError::Io { source, .. }) => {
            return Err(DataError::io("could not read", path, source));
        }
        Err(fedfuse_core::CoreError::Decode { reason, .. }) => {
            return Err(DataError::format(path, reason));
        }
        Err(e) => return Err(DataError::format(path, e.to_string())),
    })
}

/// Most bytes a gzip file or zip member read whole (a CSV table, the CDC file) may inflate to:
/// far above the real ones, far below this machine's memory.
pub(crate) const MAX_INFLATED: u64 = 2 << 30;

/// Decompresses `raw` if it is gzip data; `path` is only used in error messages.
///
/// Inflation is bounded by what the file declares: gzip's trailer holds the inflated size
/// (modulo 2^32), so at most that many bytes (and never more than [`MAX_INFLATED`], nor more
/// than deflate can yield from the file's size) are inflated before a longer stream is
/// refused. A bomb costs its declared size, not what it expands to.
pub(crate) fn maybe_gunzip(raw: Vec<u8>, path: &Path) -> Result<Vec<u8>> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let declared = raw
        .len()
        .checked_sub(4)
        .and_then(|i| raw.get(i..))
        .and_then(|t| <[u8; 4]>::try_from(t).ok())
        .map_or(0, |t| u64::from(u32::from_le_bytes(t)));
    let limit = declared
        .min(MAX_INFLATED)
        .min(DEFLATE_MAX_RATIO.saturating_mul(raw.len() as u64));
    let mut out = Vec::with_capacity(raw.len().saturating_mul(4).min(limit as usize));
    flate2::read::MultiGzDecoder::new(raw.as_slice())
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| {
            DataError::format(
                path,
                format!(
                    "corrupt or truncated gzip data ({e}); delete the file and download it again"
                ),
            )
        })?;
    if out.len() as u64 > limit {
        return Err(DataError::format(
            path,
            format!(
                "inflates to more than {limit} bytes (its gzip trailer declares {declared}; \
                 at most {MAX_INFLATED} are read): a corrupt or hostile file, or several gzip \
                 members, which fedfuse reads only after `gunzip`"
            ),
        ));
    }
    Ok(out)
}

/// The file's magic number is the one expected, or an error saying what the file is.
fn check_magic(found: u32, magic: u32, path: &Path, what: &str) -> Result<()> {
    if found != magic {
        let hint = match found {
            IMAGES_MAGIC => {
                " (this is an IDX images file; did you swap the images and labels files?)"
            }
            LABELS_MAGIC => {
                " (this is an IDX labels file; did you swap the images and labels files?)"
            }
            _ => " (not an IDX file of this kind; check that the file is the right one)",
        };
        return Err(DataError::format(
            path,
            format!("bad magic number 0x{found:08x}, expected 0x{magic:08x} for IDX {what}{hint}"),
        ));
    }
    Ok(())
}

/// Parses an IDX header: checks the magic number and returns the dimensions and the payload.
fn parse_idx<'a>(
    bytes: &'a [u8],
    path: &Path,
    magic: u32,
    what: &str,
) -> Result<(Vec<usize>, &'a [u8])> {
    let ndims = (magic & 0xff) as usize;
    let header_len = 4 + 4 * ndims;
    let word = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    if bytes.len() < 4 {
        return Err(DataError::format(
            path,
            format!(
                "file is {} bytes long, too short to be an IDX {what} file",
                bytes.len()
            ),
        ));
    }
    check_magic(word(0), magic, path, what)?;
    if bytes.len() < header_len {
        return Err(DataError::format(
            path,
            format!(
                "truncated IDX {what} header: {} of {header_len} bytes",
                bytes.len()
            ),
        ));
    }
    let dims: Vec<usize> = (0..ndims).map(|k| word(4 + 4 * k) as usize).collect();
    let payload = &bytes[header_len..];
    let expected = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match expected {
        Some(e) if e == payload.len() => Ok((dims, payload)),
        Some(e) if e > payload.len() => Err(DataError::format(
            path,
            format!(
                "truncated IDX {what} file: header promises {dims:?} = {e} bytes of data but only {} \
                 are present; delete the file and download it again",
                payload.len()
            ),
        )),
        Some(e) => Err(DataError::format(
            path,
            format!(
                "IDX {what} file has {} bytes of data after the header but its dimensions {dims:?} \
                 need {e}",
                payload.len()
            ),
        )),
        None => Err(DataError::format(
            path,
            format!("IDX {what} dimensions {dims:?} overflow"),
        )),
    }
}

/// Most bytes a deflate stream yields per compressed byte (its longest back-reference, 258
/// bytes, in under 2 bits): a header declaring more than this times the file's size lies.
const DEFLATE_MAX_RATIO: u64 = 1032;

/// An IDX file's bytes, gunzipped if compressed, with decompression bounded by what its
/// header declares: the header is inflated first and checked (magic, size), then at most the
/// declared payload and one byte more, so a gzip bomb costs no more memory than the data it
/// claims to be (and never more than deflate can honestly expand the file to).
fn read_idx_bytes(path: &Path, magic: u32, what: &str) -> Result<Vec<u8>> {
    let raw = read_raw(path)?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let corrupt = |e: std::io::Error| {
        DataError::format(
            path,
            format!("corrupt or truncated gzip data ({e}); delete the file and download it again"),
        )
    };
    let mut gz = flate2::read::MultiGzDecoder::new(raw.as_slice());
    let mut head = vec![0u8; 4];
    gz.read_exact(&mut head).map_err(corrupt)?;
    check_magic(
        u32::from_be_bytes([head[0], head[1], head[2], head[3]]),
        magic,
        path,
        what,
    )?;
    let ndims = usize::from(head[3]);
    head.resize(4 + 4 * ndims, 0);
    gz.read_exact(&mut head[4..]).map_err(corrupt)?;
    let dims: Vec<u64> = head[4..]
        .chunks_exact(4)
        .map(|w| u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]])))
        .collect();
    let declared = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= DEFLATE_MAX_RATIO.saturating_mul(raw.len() as u64))
        .ok_or_else(|| {
            DataError::format(
                path,
                format!(
                    "its IDX {what} header declares dimensions {dims:?}, more data than {} \
                     compressed bytes can hold; the file is damaged or hostile",
                    raw.len()
                ),
            )
        })?;
    let mut out = head;
    (&mut gz)
        .take(declared + 1)
        .read_to_end(&mut out)
        .map_err(corrupt)?;
    if out.len() as u64 > 4 + 4 * ndims as u64 + declared {
        return Err(DataError::format(
            path,
            format!(
                "the gzip data holds more than the {declared} bytes its IDX {what} header \
                 declares (reading stopped there); the file is damaged or hostile"
            ),
        ));
    }
    Ok(out)
}

/// Reads an IDX image file (magic `0x00000803`), raw or gzip-compressed.
///
/// Returns `(n, rows, cols, pixels)` with `pixels.len() == n * rows * cols`, row-major.
pub fn read_idx_images(path: &Path) -> Result<(usize, usize, usize, Vec<u8>)> {
    let bytes = read_idx_bytes(path, IMAGES_MAGIC, "images")?;
    let (dims, payload) = parse_idx(&bytes, path, IMAGES_MAGIC, "images")?;
    Ok((dims[0], dims[1], dims[2], payload.to_vec()))
}

/// Reads an IDX label file (magic `0x00000801`), raw or gzip-compressed.
pub fn read_idx_labels(path: &Path) -> Result<Vec<u8>> {
    let bytes = read_idx_bytes(path, LABELS_MAGIC, "labels")?;
    let (_, payload) = parse_idx(&bytes, path, LABELS_MAGIC, "labels")?;
    Ok(payload.to_vec())
}

/// Encodes an IDX file in memory (used by tests and by tools that write MNIST-like data).
///
/// `dims` are the dimensions (1 for labels, 3 for images); `data.len()` must equal their product.
pub fn write_idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 4 * dims.len() + data.len());
    out.extend_from_slice(&[0, 0, 0x08, dims.len() as u8]);
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_inflates_no_further_than_its_trailer_declares() {
        let path = Path::new("bomb.csv.gz");
        let text = b"a,b\n1,2\n".repeat(1000);
        assert_eq!(maybe_gunzip(gzip(&text), path).unwrap(), text);
        // 64 MB of zeros compress to about 64 KB; a trailer claiming 1000 bytes stops the
        // inflation at 1001.
        let mut bomb = gzip(&vec![0u8; 64 << 20]);
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        let n = bomb.len();
        bomb[n - 4..].copy_from_slice(&1000u32.to_le_bytes());
        let e = maybe_gunzip(bomb, path).unwrap_err().to_string();
        assert!(
            e.contains("more than 1000 bytes") && e.contains("bomb.csv.gz"),
            "{e}"
        );
        // Not gzip: as it is.
        assert_eq!(maybe_gunzip(b"x,y".to_vec(), path).unwrap(), b"x,y");
    }

    #[test]
    fn roundtrip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img");
        std::fs::write(
            &p,
            write_idx(&[2, 2, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
        )
        .unwrap();
        let (n, r, c, px) = read_idx_images(&p).unwrap();
        assert_eq!((n, r, c), (2, 2, 3));
        assert_eq!(px[11], 12);
        // the same file is not a labels file
        let e = read_idx_labels(&p).unwrap_err().to_string();
        assert!(e.contains("magic") && e.contains("img"), "{e}");
        std::fs::write(&p, write_idx(&[3], &[1, 2])).unwrap();
        let e = read_idx_labels(&p).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&p, [0u8, 0]).unwrap();
        assert!(read_idx_labels(&p).is_err());
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn gzip_is_inflated_no_further_than_the_header_declares() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("labels.gz");
        // An honest compressed file reads as before.
        std::fs::write(&p, gzip(&write_idx(&[4], &[3, 1, 4, 1]))).unwrap();
        assert_eq!(read_idx_labels(&p).unwrap(), [3, 1, 4, 1]);
        // A bomb: 100 labels declared, 64 MiB of zeros behind them (about 64 KB compressed).
        let mut bomb = write_idx(&[100], &[0; 100]);
        bomb.resize(bomb.len() + (64 << 20), 0);
        let packed = gzip(&bomb);
        assert!(packed.len() < 200_000, "{}", packed.len());
        std::fs::write(&p, &packed).unwrap();
        let e = read_idx_labels(&p).unwrap_err().to_string();
        assert!(
            e.contains("more than the 100 bytes") && e.contains("labels.gz"),
            "{e}"
        );
        // A header declaring far more than the file can expand to is refused before inflating.
        let liar = gzip(&write_idx(&[60_000, 28, 28], &[]));
        std::fs::write(&p, &liar).unwrap();
        let e = read_idx_images(&p).unwrap_err().to_string();
        assert!(
            e.contains("[60000, 28, 28]") && e.contains("compressed bytes"),
            "{e}"
        );
    }
}
