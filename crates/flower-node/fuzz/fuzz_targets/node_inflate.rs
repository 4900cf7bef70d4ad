//! `Pulled::inflate` on objects a SuperLink could serve, read from the fuzzer's bytes: the
//! input split at `\x01` into objects; in each, `#k` (one digit) stands for the id of object
//! k before it, so the fuzzer can build heads, references and JSON bodies that point at real
//! objects without computing SHA-256. Each object is stored under the id it hashes to (as
//! the node checks), and the last one is inflated as the message. Errors are fine, panics are
//! not.
#![no_main]

use fedfuse_flower_node::objects::{Pulled, object_id};
use libfuzzer_sys::fuzz_target;

/// `object` with each `#k` replaced by `ids[k]`, where there is one.
fn linked(object: &[u8], ids: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(object.len());
    let mut i = 0;
    while i < object.len() {
        let k = object
            .get(i + 1)
            .and_then(|d| d.checked_sub(b'0'))
            .map(usize::from);
        match (object[i], k.and_then(|k| ids.get(k))) {
            (b'#', Some(id)) => {
                out.extend_from_slice(id.as_bytes());
                i += 2;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let mut pulled = Pulled::new();
    let mut ids = Vec::new();
    for object in data.split(|&b| b == 1).take(64) {
        let object = linked(object, &ids);
        let id = object_id(&object);
        if pulled.insert(&id, object).is_err() {
            return;
        }
        ids.push(id);
    }
    if let Some(id) = ids.last() {
        let _ = pulled.inflate(id);
    }
});
