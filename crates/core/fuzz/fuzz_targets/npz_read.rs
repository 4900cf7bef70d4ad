//! `params_from_npz` on arbitrary bytes: errors are fine, panics are not. The heap bound (a
//! member read no further than its header declares) is asserted by the property tests
//! (`fuzz::npz_*`), which count allocations.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fedfuse_core::params_from_npz(data);
});
