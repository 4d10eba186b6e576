//! Arbitrary bytes into the RESP2 parser; the properties are in `props.rs`.

#![no_main]

use libfuzzer_sys::fuzz_target;

// Each target uses one of the two checks.
#[allow(dead_code)]
#[path = "../props.rs"]
mod props;

fuzz_target!(|data: &[u8]| props::check_parse(data));
