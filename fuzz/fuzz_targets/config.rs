//! See `aker::protocol::fuzz_support::config` for the property.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aker::protocol::fuzz_support::config(data);
});
