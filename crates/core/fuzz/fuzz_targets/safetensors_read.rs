//! `params_from_safetensors` on arbitrary bytes: errors are fine, panics are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedfuse_core::params_from_safetensors(data);
});
