//! CIFAR-10 and CIFAR-100 binary files, CIFAR-100's fixed fine-to-coarse label map, and the
//! minimal tar reader that unpacks the official archives.

use std::io::Read;
use std::path::Path;

use crate::dataset::Dataset;
use crate::error::{DataError, Result};

/// Bytes in one CIFAR-10 image (3 x 32 x 32, channel-major).
const IMAGE_BYTES: usize = 3 * 32 * 32;

/// Records in one CIFAR-10 batch file (`data_batch_N.bin`, `test_batch.bin`).
pub const CIFAR10_BATCH_RECORDS: usize = 10_000;
/// Records in CIFAR-100's larger file (`train.bin`; `test.bin` holds 10,000).
pub const CIFAR100_FILE_RECORDS: usize = 50_000;

/// Reads one CIFAR-10 binary batch (`data_batch_N.bin`, `test_batch.bin`), raw or gzip, of at
/// most [`CIFAR10_BATCH_RECORDS`] records.
///
/// Each record is one label byte (0..=9) followed by 3072 pixel bytes, channel-major (CHW).
/// Pixels are scaled to `[0, 1]` by dividing by 255; `sample_shape` is `[3, 32, 32]`.
pub fn read_cifar10_batch(path: &Path) -> Result<Dataset> {
    let (x, y) = read_records(path, 1, CIFAR10_BATCH_RECORDS, "CIFAR-10", |i, labels| {
        if labels[0] > 9 {
            return Err(format!(
                "record {i} has label {} (CIFAR-10 labels are 0..=9); is this a CIFAR-100 file?",
                labels[0]
            ));
        }
        Ok(labels[0])
    })?;
    Dataset::new(x, y, vec![3, 32, 32], 10)
}

/// The records of a CIFAR file, streamed from disk (through gzip when it is compressed)
/// straight into the final pixel buffer: each record is `label_bytes` label bytes, which
/// `label` checks and turns into the kept label (or says what is wrong with record `i`), then
/// an image. A raw file is sized up from its length before anything is allocated; a
/// compressed one is first inflated once without keeping anything, to count and check its
/// records, so that a file holding more than `max_records` (however far it would inflate) is
/// refused at the cost of reading it, not of holding it.
fn read_records(
    path: &Path,
    label_bytes: usize,
    max_records: usize,
    format: &str,
    mut label: impl FnMut(usize, &[u8]) -> std::result::Result<u8, String>,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let record = label_bytes + IMAGE_BYTES;
    let io = |e| DataError::io("could not read", path, e);
    let open = || -> Result<(Box<dyn Read>, bool, u64)> {
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(DataError::format(
                path,
                "is not a regular file (a folder or a device); give the CIFAR file itself",
            ));
        }
        let mut file = std::io::BufReader::new(file);
        let mut magic = [0u8; 2];
        let gzip = file
            .read_exact(&mut magic)
            .is_ok_and(|()| magic == [0x1f, 0x8b]);
        std::io::Seek::rewind(&mut file).map_err(io)?;
        Ok(match gzip {
            true => (
                Box::new(flate2::read::MultiGzDecoder::new(file)),
                true,
                meta.len(),
            ),
            false => (Box::new(file), false, meta.len()),
        })
    };
    let too_many = |what: String| {
        DataError::format(
            path,
            format!(
                "{what}, more than the {max_records} records a {format} file holds (of \
                 {record} bytes each): a corrupt or hostile file, or not a {format} file"
            ),
        )
    };
    let (reader, gzip, len) = open()?;
    let (n, reader) = if gzip {
        let n = each_record(reader, path, record, format, |i, _| {
            if i == max_records {
                return Err(too_many(format!(
                    "it inflates to more than {max_records} records"
                )));
            }
            Ok(())
        })?;
        (n, open()?.0)
    } else {
        if len == 0 || len % record as u64 != 0 {
            return Err(DataError::format(
                path,
                format!(
                    "{len} bytes is not a whole number of {format} records ({record} bytes \
                     each: {label_bytes} label byte(s) + 3072 pixels); the file is truncated \
                     or not a {format} file"
                ),
            ));
        }
        let n = len / record as u64;
        if n > max_records as u64 {
            return Err(too_many(format!("{len} bytes hold {n} records")));
        }
        (n as usize, reader)
    };
    if n == 0 {
        return Err(DataError::format(
            path,
            format!("holds no record; the file is empty or not a {format} file"),
        ));
    }
    let mut x = Vec::with_capacity(n * IMAGE_BYTES);
    let mut y = Vec::with_capacity(n);
    each_record(
        reader.take((n * record) as u64),
        path,
        record,
        format,
        |i, rec| {
            let kept = label(i, &rec[..label_bytes]).map_err(|msg| DataError::format(path, msg))?;
            y.push(u32::from(kept));
            x.extend(rec[label_bytes..].iter().map(|&p| f32::from(p) / 255.0));
            Ok(())
        },
    )?;
    Ok((x, y))
}

/// Calls `f` on each whole record of `reader` in turn and returns how many there were; a
/// cut-off last record is an error.
fn each_record(
    mut reader: impl Read,
    path: &Path,
    record: usize,
    format: &str,
    mut f: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<usize> {
    let mut buf = vec![0u8; record];
    for i in 0.. {
        // Fill one record, telling a clean end (no byte) from a cut one.
        let mut got = 0;
        while got < record {
            match reader.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(DataError::format(
                        path,
                        format!(
                            "corrupt or truncated data ({e}); delete the file and download \
                             it again"
                        ),
                    ));
                }
            }
        }
        if got == 0 {
            return Ok(i);
        }
        if got < record {
            return Err(DataError::format(
                path,
                format!(
                    "record {i} is cut short ({got} of {record} bytes); the file is truncated \
                     or not a {format} file"
                ),
            ));
        }
        f(i, &buf)?;
    }
    Ok(usize::MAX)
}

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
    let (x, y) = read_records(path, 2, CIFAR100_FILE_RECORDS, "CIFAR-100", |i, labels| {
        let (coarse, fine) = (labels[0], labels[1]);
        if fine > 99 {
            return Err(format!(
                "record {i}: fine label {fine} is outside 0..=99; is this a CIFAR-100 binary \
                 file?"
            ));
        }
        let expected = CIFAR100_COARSE_OF_FINE[usize::from(fine)];
        if coarse != expected {
            return Err(format!(
                "record {i}: coarse label {coarse} does not match fine label {fine}, whose \
                 superclass is {expected}; the file is corrupt or not CIFAR-100 (a CIFAR-10 \
                 batch has one label byte per record, not two)"
            ));
        }
        Ok(match label {
            Cifar100Label::Fine => fine,
            Cifar100Label::Coarse => coarse,
        })
    })?;
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
