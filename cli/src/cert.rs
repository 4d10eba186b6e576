//! When a server's X.509 certificate expires, read from its DER.
//!
//! This module owns one walk down a certificate's DER to the `Validity`
//! of its `TBSCertificate` (RFC 5280, 4.1), and the calendar arithmetic
//! that turns its times into Unix seconds and back into text. It checks
//! no signature and trusts nothing: rustls has verified the certificate
//! before `probe` asks when it expires. Every input is untrusted bytes: a
//! length is checked against what is left before it is used, nothing is
//! indexed unchecked, and a certificate this walk cannot read is an
//! [`Unreadable`], never a panic. It does no I/O and reads no clock.
//!
//! Only the few DER forms a certificate needs before its validity are
//! read: one-byte tags, definite lengths of at most four bytes, `UTCTime`
//! and `GeneralizedTime` in RFC 5280's `YYMMDDHHMMSSZ` and
//! `YYYYMMDDHHMMSSZ` forms.

use std::fmt;

/// Why a certificate's validity could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unreadable(&'static str);

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "certificate validity unreadable: {}", self.0)
    }
}

impl std::error::Error for Unreadable {}

/// A certificate's validity period, in Unix seconds (UTC), both ends
/// included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
/// `[0] EXPLICIT Version`, absent from version 1 certificates.
const VERSION: u8 = 0xa0;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The validity of the DER certificate `der`.
///
/// # Errors
/// [`Unreadable`] when `der` is not a certificate this walk can read.
pub fn validity(der: &[u8]) -> Result<Validity, Unreadable> {
    let (certificate, _) = expect(der, SEQUENCE, "not a certificate")?;
    let (tbs, _) = expect(certificate, SEQUENCE, "no TBSCertificate")?;
    let rest = match tlv(tbs)? {
        (VERSION, _, rest) => rest,
        _ => tbs,
    };
    let (_serial, rest) = expect(rest, INTEGER, "no serial number")?;
    let (_signature, rest) = expect(rest, SEQUENCE, "no signature algorithm")?;
    let (_issuer, rest) = expect(rest, SEQUENCE, "no issuer")?;
    let (validity, _) = expect(rest, SEQUENCE, "no validity")?;
    let (tag, not_before, rest) = tlv(validity)?;
    let not_before = time(tag, not_before)?;
    let (tag, not_after, _) = tlv(rest)?;
    let not_after = time(tag, not_after)?;
    Ok(Validity {
        not_before,
        not_after,
    })
}

/// One DER element of tag `want` at the start of `input`: its contents
/// and what follows it.
fn expect<'a>(
    input: &'a [u8],
    want: u8,
    missing: &'static str,
) -> Result<(&'a [u8], &'a [u8]), Unreadable> {
    match tlv(input)? {
        (tag, contents, rest) if tag == want => Ok((contents, rest)),
        _ => Err(Unreadable(missing)),
    }
}

/// The element at the start of `input`: tag, contents, what follows.
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), Unreadable> {
    let (&tag, rest) = input.split_first().ok_or(Unreadable("truncated"))?;
    if tag & 0x1f == 0x1f {
        return Err(Unreadable("multi-byte tag"));
    }
    let (&first, mut rest) = rest.split_first().ok_or(Unreadable("truncated"))?;
    let len = match first {
        0..=0x7f => usize::from(first),
        0x80 => return Err(Unreadable("indefinite length")),
        0x81..=0x84 => {
            let octets = usize::from(first & 0x7f);
            let (bytes, after) = rest
                .split_at_checked(octets)
                .ok_or(Unreadable("truncated"))?;
            rest = after;
            bytes
                .iter()
                .try_fold(0usize, |len, &b| {
                    len.checked_mul(256)?.checked_add(usize::from(b))
                })
                .ok_or(Unreadable("length overflows"))?
        }
        _ => return Err(Unreadable("length too long")),
    };
    let (contents, rest) = rest.split_at_checked(len).ok_or(Unreadable("truncated"))?;
    Ok((tag, contents, rest))
}

/// A `UTCTime` or `GeneralizedTime` in Unix seconds.
fn time(tag: u8, text: &[u8]) -> Result<i64, Unreadable> {
    let (year, rest) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let (yy, rest) = digits(text, 2)?;
            // RFC 5280: 50..=99 are 19xx, 00..=49 are 20xx.
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, rest)
        }
        (GENERALIZED_TIME, 15) => digits(text, 4)?,
        (UTC_TIME | GENERALIZED_TIME, _) => return Err(Unreadable("time not in RFC 5280 form")),
        _ => return Err(Unreadable("not a time")),
    };
    let (month, rest) = digits(rest, 2)?;
    let (day, rest) = digits(rest, 2)?;
    let (hour, rest) = digits(rest, 2)?;
    let (minute, rest) = digits(rest, 2)?;
    let (second, rest) = digits(rest, 2)?;
    if rest != b"Z" {
        return Err(Unreadable("time not in UTC"));
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(Unreadable("no such time"));
    }
    Ok(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The decimal number in the first `n` bytes of `text`, and the rest.
fn digits(text: &[u8], n: usize) -> Result<(i64, &[u8]), Unreadable> {
    let (number, rest) = text.split_at_checked(n).ok_or(Unreadable("truncated"))?;
    let mut value = 0i64;
    for &b in number {
        if !b.is_ascii_digit() {
            return Err(Unreadable("time not in RFC 5280 form"));
        }
        value = value * 10 + i64::from(b - b'0');
    }
    Ok((value, rest))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`), for years 0 to 9999.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date of `days` since 1970-01-01 (Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// `unix` seconds as `YYYY-MM-DD HH:MM:SS UTC`. Any time a certificate
/// can hold (years 0 to 9999) prints as such a date; any other value
/// prints as some text, without panicking.
pub fn utc_text(unix: i64) -> String {
    let (year, month, day) = civil_from_days(unix.div_euclid(86_400));
    let second = unix.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        second / 3_600,
        second % 3_600 / 60,
        second % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element of `tag` around `contents`, with a long-form length
    /// when it needs one.
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = contents.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(contents);
        out
    }

    fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
        der(SEQUENCE, &parts.concat())
    }

    /// A certificate with the given version element (or none) and times.
    fn certificate(version: Option<Vec<u8>>, not_before: Vec<u8>, not_after: Vec<u8>) -> Vec<u8> {
        let name = seq(&[der(
            0x31,
            &seq(&[der(0x06, &[0x55, 4, 3]), der(0x0c, b"x")]),
        )]);
        let algorithm = seq(&[der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2])]);
        let mut tbs = Vec::new();
        tbs.extend(version);
        tbs.extend([
            der(INTEGER, &[0x01, 0x02]),
            algorithm.clone(),
            name.clone(),
            seq(&[not_before, not_after]),
            name,
            // Room enough to need a long-form length.
            der(0x30, &[0u8; 300]),
        ]);
        seq(&[seq(&tbs), algorithm, der(0x03, &[0, 1, 2, 3])])
    }

    fn v3() -> Option<Vec<u8>> {
        Some(der(VERSION, &der(INTEGER, &[2])))
    }

    fn utc(text: &str) -> Vec<u8> {
        der(UTC_TIME, text.as_bytes())
    }

    fn generalized(text: &str) -> Vec<u8> {
        der(GENERALIZED_TIME, text.as_bytes())
    }

    /// `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256
    /// -days 36500 -subj /CN=fixture`, which `openssl x509 -noout -dates`
    /// prints as notBefore=Nov 24 15:53:08 2026 GMT (a UTCTime) and
    /// notAfter=Oct 31 15:53:08 2126 GMT (a GeneralizedTime).
    const OPENSSL_PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBezCCASGgAwIBAgIUKbuFK0a643+n46oROOocb9txIS4wCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHZml4dHVyZTAgFw0yNjExMjQxNTUzMDhaGA8yMTI2MTAzMTE1
NTMwOFowEjEQMA4GA1UEAwwHZml4dHVyZTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABIgPF5pGBMpveJz2cIcPcUr9Acb+cwG/C13gkj3qJKFLOqYeki6k3HFBeVAZ
BdSMjqmmTtZO7yjNk13GcHSkJ1WjUzBRMB0GA1UdDgQWBBTOuPlzaRAgECZtZziE
Z51e5Wge1DAfBgNVHSMEGDAWgBTOuPlzaRAgECZtZziEZ51e5Wge1DAPBgNVHRMB
Af8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIEFZVLi7xBhgh60QdPOyZu1JDSzg
evsNR8NOcg8GV//hAiEA8DYg7eEJXDSXCZOBbeyTEO+0qrZDDShwdP5Lk/icImM=
-----END CERTIFICATE-----
";

    fn openssl_der() -> Vec<u8> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(OPENSSL_PEM.as_bytes())
            .expect("the fixture is PEM")
            .to_vec()
    }

    #[test]
    fn a_real_certificate_reads_as_openssl_prints_it() {
        let validity = validity(&openssl_der()).expect("readable");
        assert_eq!(utc_text(validity.not_before), "2026-11-24 15:53:08 UTC");
        assert_eq!(utc_text(validity.not_after), "2126-10-31 15:53:08 UTC");
        // `date -u -d '2126-10-31 15:53:08' +%s`
        assert_eq!(validity.not_after, 4_949_135_588);
    }

    #[test]
    fn validities_read_from_every_form() {
        type Case = (&'static str, Vec<u8>, Result<(i64, i64), Unreadable>);
        let cases: Vec<Case> = vec![
            (
                "a version 3 certificate with UTC times",
                certificate(v3(), utc("700101000000Z"), utc("491231235959Z")),
                Ok((0, 2_524_607_999)),
            ),
            (
                "UTCTime 50 is 1950",
                certificate(v3(), utc("500101000000Z"), utc("500101000000Z")),
                Ok((-631_152_000, -631_152_000)),
            ),
            (
                "a version 1 certificate has no version element",
                certificate(None, utc("000229120000Z"), generalized("20500101000000Z")),
                Ok((951_825_600, 2_524_608_000)),
            ),
            (
                "generalized times far away",
                certificate(
                    v3(),
                    generalized("19750101000000Z"),
                    generalized("40960101000000Z"),
                ),
                Ok((157_766_400, 67_090_118_400)),
            ),
            (
                "fractional seconds are not RFC 5280's form",
                certificate(v3(), utc("700101000000Z"), generalized("20500101000000.5Z")),
                Err(Unreadable("time not in RFC 5280 form")),
            ),
            (
                "a local time",
                certificate(v3(), utc("700101000000Z"), utc("7001010000000")),
                Err(Unreadable("time not in UTC")),
            ),
            (
                "February 29th of a year that is not leap",
                certificate(v3(), utc("700101000000Z"), generalized("21000229000000Z")),
                Err(Unreadable("no such time")),
            ),
            (
                "month 13",
                certificate(v3(), utc("701301000000Z"), utc("700101000000Z")),
                Err(Unreadable("no such time")),
            ),
            (
                "second 60",
                certificate(v3(), utc("700101000060Z"), utc("700101000000Z")),
                Err(Unreadable("no such time")),
            ),
            (
                "digits that are not",
                certificate(v3(), utc("7001010000+0Z"), utc("700101000000Z")),
                Err(Unreadable("time not in RFC 5280 form")),
            ),
            (
                "a validity that holds no times",
                certificate(v3(), der(INTEGER, &[1]), der(INTEGER, &[1])),
                Err(Unreadable("not a time")),
            ),
            ("nothing", Vec::new(), Err(Unreadable("truncated"))),
            (
                "an indefinite length",
                vec![0x30, 0x80, 0, 0],
                Err(Unreadable("indefinite length")),
            ),
            (
                "a five-byte length",
                vec![0x30, 0x85, 0, 0, 0, 0, 1, 0],
                Err(Unreadable("length too long")),
            ),
            (
                "a length past the end",
                vec![0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
                Err(Unreadable("truncated")),
            ),
            (
                "a multi-byte tag",
                vec![0x1f, 0x81, 0x00, 0x00],
                Err(Unreadable("multi-byte tag")),
            ),
            (
                "not a sequence",
                der(INTEGER, &[1]),
                Err(Unreadable("not a certificate")),
            ),
        ];
        for (name, der, want) in cases {
            let got = validity(&der).map(|v| (v.not_before, v.not_after));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn dates_print_and_read_back_alike() {
        let cases = [
            (0, "1970-01-01 00:00:00 UTC"),
            (-631_152_000, "1950-01-01 00:00:00 UTC"),
            (951_825_600, "2000-02-29 12:00:00 UTC"),
            (2_524_607_999, "2049-12-31 23:59:59 UTC"),
            (67_090_118_400, "4096-01-01 00:00:00 UTC"),
            (253_402_300_799, "9999-12-31 23:59:59 UTC"),
            (-62_167_219_200, "0000-01-01 00:00:00 UTC"),
        ];
        for (unix, text) in cases {
            assert_eq!(utc_text(unix), text, "{unix}");
            let generalized: String = text
                .chars()
                .filter(char::is_ascii_digit)
                .chain(['Z'])
                .collect();
            assert_eq!(
                time(GENERALIZED_TIME, generalized.as_bytes()),
                Ok(unix),
                "{text}"
            );
        }
    }

    /// No input panics: every prefix of a real certificate, every one-byte
    /// change of it, and pseudo-random bytes behind a plausible start.
    #[test]
    fn no_input_panics() {
        let real = openssl_der();
        for end in 0..real.len() {
            assert!(validity(&real[..end]).is_err(), "prefix of {end} bytes");
        }
        for at in 0..real.len() {
            for value in [0x00, 0x01, 0x7f, 0x80, 0x81, 0x84, 0x85, 0xff] {
                let mut changed = real.clone();
                changed[at] = value;
                let _ = validity(&changed);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            let mut bytes = vec![0x30, 0x82, 0x01, 0x00, 0x30, 0x81, 0xf0];
            for _ in 0..(state % 64) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(state.to_le_bytes()[0]);
            }
            let _ = validity(&bytes);
        }
        // Far outside any certificate: some text, no panic.
        for extreme in [i64::MIN, -1, i64::MAX] {
            assert!(utc_text(extreme).ends_with(" UTC"));
        }
    }
}
