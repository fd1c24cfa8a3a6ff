//! See `aker::protocol::fuzz_support::reply_body` for the property.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aker::protocol::fuzz_support::reply_body(data);
});
