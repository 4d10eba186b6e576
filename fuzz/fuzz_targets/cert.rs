//! Arbitrary bytes, as a server's certificate, into `redlock probe`'s walk
//! to its validity (`cli/src/cert.rs`, included as it is: it depends on
//! nothing but std).
//!
//! Properties: no input panics; a validity read holds times a certificate
//! can hold (years 0 to 9999: a GeneralizedTime has four digits) that
//! print as dates of one length; and bytes after the certificate change
//! nothing, since only its own DER element is read.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../cli/src/cert.rs"]
mod cert;

/// 0000-01-01 and 9999-12-31 23:59:59, in Unix seconds.
const EARLIEST: i64 = -62_167_219_200;
const LATEST: i64 = 253_402_300_799;

fuzz_target!(|data: &[u8]| {
    let Ok(validity) = cert::validity(data) else {
        return;
    };
    for time in [validity.not_before, validity.not_after] {
        assert!((EARLIEST..=LATEST).contains(&time), "{time}");
        let text = cert::utc_text(time);
        assert_eq!(text.len(), "YYYY-MM-DD HH:MM:SS UTC".len(), "{text}");
    }
    let mut longer = data.to_vec();
    longer.extend_from_slice(&[0x30, 0x80, 0xff]);
    assert_eq!(cert::validity(&longer), Ok(validity));
});
