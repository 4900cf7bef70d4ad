//! CIFAR-10 and CIFAR-100 binary files, CIFAR-100's fixed fine-to-coarse label map, and the
//! minimal tar reader that unpacks the official archives.

use std::io::Read;
use std::path::Path;

use crate::dataset::Dataset;
use crate::error::{DataError, Result};
use crate::idx::read_maybe_gz;

/// Bytes in one CIFAR-10 image (3 x 32 x 32, channel-major).
const IMAGE_BYTES: usize = 3 * 32 * 32;
/// Bytes in one CIFAR-10 record: one label byte, then the image.
const RECORD_BYTES: usize = 1 + IMAGE_BYTES;

/// Reads one CIFAR-10 binary batch (`data_batch_N.bin`, `test_batch.bin`).
///
/// Each record is one label byte (0..=9) followed by 3072 pixel bytes, channel-major (CHW).
/// Pixels are scaled to `[0, 1]` by dividing by 255; `sample_shape` is `[3, 32, 32]`.
pub fn read_cifar10_batch(path: &Path) -> Result<Dataset> {
    let bytes = read_maybe_gz(path)?;
    if bytes.is_empty() || bytes.len() % RECORD_BYTES != 0 {
        return Err(DataError::format(
            path,
            format!(
                "{} bytes is not a whole number of CIFAR-10 records ({RECORD_BYTES} bytes each: \
                 1 label + 3072 pixels); the file is truncated or not a CIFAR-10 binary batch",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / RECORD_BYTES;
    let mut x = Vec::with_capacity(n * IMAGE_BYTES);
    let mut y = Vec::with_capacity(n);
    for (i, rec) in bytes.chunks_exact(RECORD_BYTES).enumerate() {
        if rec[0] > 9 {
            return Err(DataError::format(
                path,
                format!(
                    "record {i} has label {} (CIFAR-10 labels are 0..=9); is this a CIFAR-100 file?",
                    rec[0]
                ),
            ));
        }
        y.push(u32::from(rec[0]));
        x.extend(rec[1..].iter().map(|&p| f32::from(p) / 255.0));
    }
    Dataset::new(x, y, vec![3, 32, 32], 10)
}

/// Bytes in one CIFAR-100 record: the coarse label, the fine label, then the image.
const RECORD_BYTES_100: usize = 2 + IMAGE_BYTES;

/// CIFAR-100's coarse label (superclass, `0..20`) of each fine label (`0..100`): entry `f` is
/// the coarse label of fine label `f`. The hierarchy is fixed by the dataset (each superclass
/// holds exactly five classes), and [`read_cifar100`] refuses a record that breaks it.
///
/// Taken from public code that builds Reddi et al.'s Pachinko split (GitHub
/// `omarfoq/knn-per`, `data/cifar100/generate_data.py`, `COARSE_LABELS`); the same array
/// appears in other CIFAR-100 loaders (the `sparse2coarse` helper, Continuum's
/// `cifar100_coarse_labels`). Spot-checked against the class names in label order (fine 0
/// `apple` -> 4 `fruit_and_vegetables`, 1 `aquarium_fish` -> 1 `fish`, 4 `beaver` -> 0
/// `aquatic_mammals`, 99 `worm` -> 13 `non-insect_invertebrates`).
pub const CIFAR100_COARSE_OF_FINE: [u8; 100] = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, //
    3, 14, 9, 18, 7, 11, 3, 9, 7, 11, //
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, //
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5, //
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, //
    16, 4, 17, 4, 2, 0, 17, 4, 18, 17, //
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, //
    2, 10, 0, 1, 16, 12, 9, 13, 15, 13, //
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, //
    18, 1, 2, 15, 6, 0, 17, 8, 14, 13, //
];

/// Which of a CIFAR-100 record's two labels [`read_cifar100`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cifar100Label {
    /// The 100 fine classes (dataset `cifar100`).
    Fine,
    /// The 20 superclasses (dataset `cifar100-coarse`).
    Coarse,
}

/// Reads a CIFAR-100 binary file (`train.bin`, `test.bin` of `cifar-100-binary.tar.gz`).
///
/// Each record is one coarse-label byte (0..=19), one fine-label byte (0..=99), then 3072
/// pixel bytes, channel-major (CHW). Pixels are scaled to `[0, 1]` by dividing by 255;
/// `sample_shape` is `[3, 32, 32]`. The dataset holds the fine labels (100 classes) or the
/// coarse ones (20), as `label` says; the other is implied, since every record must follow
/// [`CIFAR100_COARSE_OF_FINE`].
pub fn read_cifar100(path: &Path, label: Cifar100Label) -> Result<Dataset> {
    let bytes = read_maybe_gz(path)?;
    if bytes.is_empty() || bytes.len() % RECORD_BYTES_100 != 0 {
        return Err(DataError::format(
            path,
            format!(
                "{} bytes is not a whole number of CIFAR-100 records ({RECORD_BYTES_100} bytes \
                 each: 1 coarse label + 1 fine label + 3072 pixels); the file is truncated or \
                 not a CIFAR-100 binary file",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / RECORD_BYTES_100;
    let mut x = Vec::with_capacity(n * IMAGE_BYTES);
    let mut y = Vec::with_capacity(n);
    for (i, rec) in bytes.chunks_exact(RECORD_BYTES_100).enumerate() {
        let (coarse, fine) = (rec[0], rec[1]);
        let bad = |msg: String| Err(DataError::format(path, format!("record {i}: {msg}")));
        if fine > 99 {
            return bad(format!(
                "fine label {fine} is outside 0..=99; is this a CIFAR-100 binary file?"
            ));
        }
        let expected = CIFAR100_COARSE_OF_FINE[usize::from(fine)];
        if coarse != expected {
            return bad(format!(
                "coarse label {coarse} does not match fine label {fine}, whose superclass is \
                 {expected}; the file is corrupt or not CIFAR-100 (a CIFAR-10 batch has one \
                 label byte per record, not two)"
            ));
        }
        y.push(u32::from(match label {
            Cifar100Label::Fine => fine,
            Cifar100Label::Coarse => coarse,
        }));
        x.extend(rec[2..].iter().map(|&p| f32::from(p) / 255.0));
    }
    let classes = match label {
        Cifar100Label::Fine => 100,
        Cifar100Label::Coarse => 20,
    };
    Dataset::new(x, y, vec![3, 32, 32], classes)
}

/// Extracts the regular files of a (possibly gzip-compressed) tar archive whose base names are
/// in `wanted` into `dest` (flat). Each file is written as `<name>.part` and renamed, so a
/// crash never leaves a half file under its final name. Returns the names extracted.
pub(crate) fn extract_tar(archive: &Path, dest: &Path, wanted: &[&str]) -> Result<Vec<String>> {
    let file =
        std::fs::File::open(archive).map_err(|e| DataError::io("could not open", archive, e))?;
    let mut magic = [0u8; 2];
    let mut reader: Box<dyn Read> = {
        let mut f = std::io::BufReader::new(file);
        let got = f
            .read(&mut magic)
            .map_err(|e| DataError::io("could not read", archive, e))?;
        let head = std::io::Cursor::new(magic[..got].to_vec()).chain(f);
        if magic == [0x1f, 0x8b] {
            Box::new(flate2::read::MultiGzDecoder::new(head))
        } else {
            Box::new(head)
        }
    };
    let corrupt = |what: String| {
        DataError::format(
            archive,
            format!("{what}; delete the archive and download it again"),
        )
    };
    let mut done = Vec::new();
    let mut header = [0u8; 512];
    loop {
        if let Err(e) = reader.read_exact(&mut header) {
            return Err(corrupt(format!("truncated tar archive ({e})")));
        }
        if header.iter().all(|&b| b == 0) {
            break;
        }
        let field = |r: std::ops::Range<usize>| {
            let s = &header[r];
            let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).trim().to_string()
        };
        let name = field(0..100);
        let size_str = field(124..136);
        let size = u64::from_str_radix(&size_str, 8)
            .map_err(|_| corrupt(format!("bad size field {size_str:?} for entry {name:?}")))?;
        let kind = header[156];
        let base = name.rsplit('/').next().unwrap_or("").to_string();
        let padded = size.div_ceil(512) * 512;
        let mut entry = (&mut reader).take(padded);
        if (kind == b'0' || kind == 0) && wanted.contains(&base.as_str()) {
            let part = dest.join(format!("{base}.part"));
            let mut out = std::fs::File::create(&part)
                .map_err(|e| DataError::io("could not create", &part, e))?;
            let copied = std::io::copy(&mut (&mut entry).take(size), &mut out)
                .map_err(|e| corrupt(format!("could not extract {name} ({e})")))?;
            if copied != size {
                return Err(corrupt(format!("truncated tar entry {name}")));
            }
            drop(out);
            let fin = dest.join(&base);
            std::fs::rename(&part, &fin)
                .map_err(|e| DataError::io("could not rename", &part, e))?;
            done.push(base);
        }
        std::io::copy(&mut entry, &mut std::io::sink())
            .map_err(|e| corrupt(format!("could not read tar entry {name} ({e})")))?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_entry(name: &str, data: &[u8]) -> Vec<u8> {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let size = format!("{:011o}\0", data.len());
        h[124..136].copy_from_slice(size.as_bytes());
        h[156] = b'0';
        let mut out = h.to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    #[test]
    fn every_superclass_holds_five_classes() {
        let mut count = [0usize; 20];
        CIFAR100_COARSE_OF_FINE
            .iter()
            .for_each(|&c| count[usize::from(c)] += 1);
        assert_eq!(count, [5; 20]);
    }

    #[test]
    fn extracts_wanted_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut tar = tar_entry("d/a.bin", b"hello");
        tar.extend(tar_entry("d/skip.txt", &[7u8; 700]));
        tar.extend(tar_entry("d/b.bin", &[1u8; 1024]));
        tar.extend([0u8; 1024]);
        let p = dir.path().join("x.tar");
        std::fs::write(&p, &tar).unwrap();
        let got = extract_tar(&p, dir.path(), &["a.bin", "b.bin"]).unwrap();
        assert_eq!(got, vec!["a.bin", "b.bin"]);
        assert_eq!(std::fs::read(dir.path().join("a.bin")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read(dir.path().join("b.bin")).unwrap(),
            vec![1u8; 1024]
        );
        assert!(!dir.path().join("skip.txt").exists());
        // truncated archive
        std::fs::write(&p, &tar[..600]).unwrap();
        assert!(extract_tar(&p, dir.path(), &["a.bin"]).is_err());
    }
}
