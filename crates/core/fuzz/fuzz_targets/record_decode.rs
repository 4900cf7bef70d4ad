//! `Record::decode` on arbitrary bytes: errors are fine, panics are not, and whatever decodes
//! must encode to a buffer that decodes to the same record, bit for bit.
#![no_main]

use fedfuse_core::{Params, Record};
use libfuzzer_sys::fuzz_target;

/// Tensors as bit patterns: `f32`'s `==` would equate `-0.0` with `0.0` and fail on NaN.
fn bits(p: &Params) -> Vec<(&str, &[usize], Vec<u32>)> {
    p.iter()
        .map(|(name, t)| {
            (
                name,
                t.shape.as_slice(),
                t.data.iter().map(|v| v.to_bits()).collect(),
            )
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(record) = Record::decode(data) else {
        return;
    };
    let bytes = record.encode().expect("a decoded record encodes");
    let again = Record::decode(&bytes).expect("an encoded record decodes");
    assert_eq!(bits(&again.params), bits(&record.params));
    assert_eq!(again.config, record.config);
    assert_eq!(again.metrics, record.metrics);
    assert_eq!(again.num_examples, record.num_examples);
    assert_eq!(again.sparse, record.sparse);
});
