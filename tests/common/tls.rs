//! Certificates made at test time for the TLS tests, with rcgen: a CA and
//! the certificates it signs (a good server certificate, an expired one,
//! one that expires in ten days, one for another host name only, a client
//! certificate for mutual TLS), and a second CA that signed none of them.
//! The library's TLS tests and the command line's `probe` tests include
//! this file. All are PEM files in a
//! private temporary directory that goes away with the [`Certs`].
//!
//! Every certificate is ECDSA P-256 and fresh per [`Certs::generate`], so
//! that no test trusts another test's CA by accident.

// Each test binary that includes this file uses its own subset of it.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};
use redlock_test::{TempDir, TlsOptions};

/// The host a good server certificate names besides 127.0.0.1.
pub const SERVER_DNS: &str = "localhost";
/// The only name of the wrong-host certificate.
pub const WRONG_HOST: &str = "wrong-host.invalid";
/// How long from its making [`Certs::expiring`] stays valid.
pub const EXPIRING_IN: Duration = Duration::from_secs(10 * 86_400);

/// One certificate and its private key, as PEM files.
#[derive(Debug, Clone)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// A test's certificates, removed with it.
#[derive(Debug)]
pub struct Certs {
    /// The CA that signed every pair below.
    pub ca: PathBuf,
    /// A CA that signed nothing here: trusting it alone trusts no master.
    pub other_ca: PathBuf,
    /// A server certificate for IP 127.0.0.1 and DNS `localhost`.
    pub server: Pair,
    /// The same names, valid only in 2000.
    pub expired: Pair,
    /// The same names, valid until [`EXPIRING_IN`] from its making.
    pub expiring: Pair,
    /// A server certificate for [`WRONG_HOST`] only: neither 127.0.0.1 nor
    /// `localhost`.
    pub wrong_host: Pair,
    /// A client certificate, for masters that ask for one.
    pub client: Pair,
    // Declared last: the files go once nothing above is used.
    dir: TempDir,
}

impl Certs {
    /// Makes every certificate and writes them to a fresh directory.
    pub fn generate() -> Certs {
        let dir = TempDir::create().unwrap_or_else(|e| panic!("{e}"));
        let ca = authority("redlock-mio test CA");
        let other_ca = authority("redlock-mio unrelated CA");

        let server = leaf("127.0.0.1", &["127.0.0.1", SERVER_DNS]);
        let mut expired = leaf("127.0.0.1 (expired)", &["127.0.0.1", SERVER_DNS]);
        expired.not_before = date_time_ymd(2000, 1, 1);
        expired.not_after = date_time_ymd(2001, 1, 1);
        let mut expiring = leaf("127.0.0.1 (expiring)", &["127.0.0.1", SERVER_DNS]);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_else(|e| panic!("the clock is before 1970: {e}"));
        expiring.not_after = date_time_ymd(1970, 1, 1) + now + EXPIRING_IN;
        let wrong_host = leaf(WRONG_HOST, &[WRONG_HOST]);
        let mut client = leaf("redlock-mio test client", &[]);
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];

        Certs {
            ca: write(dir.path(), "ca.pem", &ca.pem()),
            other_ca: write(dir.path(), "other-ca.pem", &other_ca.pem()),
            server: sign(dir.path(), "server", &server, &ca),
            expired: sign(dir.path(), "expired", &expired, &ca),
            expiring: sign(dir.path(), "expiring", &expiring, &ca),
            wrong_host: sign(dir.path(), "wrong-host", &wrong_host, &ca),
            client: sign(dir.path(), "client", &client, &ca),
            dir,
        }
    }

    /// A master with the good certificate that asks clients for none.
    pub fn server_options(&self) -> TlsOptions {
        self.options(&self.server)
    }

    /// A master serving `pair`, trusting [`Certs::ca`] for client
    /// certificates, asking clients for none.
    pub fn options(&self, pair: &Pair) -> TlsOptions {
        TlsOptions::new(&pair.cert, &pair.key, &self.ca)
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A self-signed CA certificate that may sign certificates.
fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
    CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("CA certificate: {e}"))
}

/// The parameters of an end-entity certificate for `names` (IP addresses
/// or DNS names), for a server unless changed.
fn leaf(common_name: &str, names: &[&str]) -> CertificateParams {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params =
        CertificateParams::new(names).unwrap_or_else(|e| panic!("certificate names: {e}"));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params
}

/// Signs `params` with `issuer` under a new key and writes both.
fn sign(dir: &Path, name: &str, params: &CertificateParams, issuer: &Issuer<'_, KeyPair>) -> Pair {
    let key = KeyPair::generate().unwrap_or_else(|e| panic!("{name} key: {e}"));
    let cert = params
        .signed_by(&key, issuer)
        .unwrap_or_else(|e| panic!("{name} certificate: {e}"));
    Pair {
        cert: write(dir, &format!("{name}.pem"), &cert.pem()),
        key: write(dir, &format!("{name}.key"), &key.serialize_pem()),
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}
