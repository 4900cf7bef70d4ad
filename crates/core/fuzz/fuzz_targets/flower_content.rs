//! `Record::from_flower` on a reply a client could send the Flower strategy, read from the
//! fuzzer's bytes: per array a dtype and stype picked by one byte each, up to four axes of any
//! size, and the rest of its bytes as data; then metrics. Errors are fine, panics are not.
#![no_main]

use fedfuse_core::Record;
use fedfuse_core::flower::{FlowerArray, FlowerContent, MetricValue};
use libfuzzer_sys::fuzz_target;

const DTYPES: [&str; 5] = ["float32", "float64", "float16", "int64", ""];
const STYPES: [&str; 3] = ["numpy.ndarray", "fedfuse.sparse.v1", "torch.Tensor"];

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    let (head, rest) = data.split_at_checked(n)?;
    *data = rest;
    Some(head)
}

fuzz_target!(|data: &[u8]| {
    let mut data = data;
    let mut content = FlowerContent::default();
    while let Some(head) = take(&mut data, 4) {
        let [dtype, stype, axes, len] = [head[0], head[1], head[2], head[3]];
        let mut shape = Vec::new();
        for _ in 0..axes % 5 {
            let Some(b) = take(&mut data, 8) else { break };
            shape.push(u64::from_le_bytes(b.try_into().unwrap_or_default()) as usize);
        }
        let bytes = take(&mut data, usize::from(len) * 16).unwrap_or(data);
        content.arrays.push(FlowerArray {
            key: format!("layers.{}.weight", content.arrays.len()),
            dtype: DTYPES[usize::from(dtype) % DTYPES.len()].into(),
            shape,
            stype: STYPES[usize::from(stype) % STYPES.len()].into(),
            data: bytes.to_vec(),
        });
        if content.arrays.len() == 4 {
            break;
        }
    }
    while let Some(b) = take(&mut data, 9) {
        let v = i64::from_le_bytes(b[1..].try_into().unwrap_or_default());
        let value = if b[0] % 2 == 0 {
            MetricValue::Int(v)
        } else {
            MetricValue::Float(f64::from_bits(v as u64))
        };
        let key = ["num-examples", "train_loss", "class_count.1"][usize::from(b[0] / 2) % 3];
        content.metrics.push((key.into(), value));
    }
    let _ = Record::from_flower(&content);
});
