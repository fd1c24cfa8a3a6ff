//! Arbitrary bytes into both frame decoders, walking the buffer as a connection would; every
//! frame that decodes must re-encode to the same bytes (see `protocol::fuzz_support`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    aker::protocol::fuzz_support::frame_decode(data);
});
