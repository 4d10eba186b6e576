//! TLS to the masters (`rediss://`), with rustls over our own sockets.
//!
//! This module owns the TLS settings' loading (CA, client certificate and
//! key files, or the system's roots; public as [`TlsConfig::client_config`]
//! for tools that connect on their own) and one connection's TLS session over
//! a non-blocking mio socket: plaintext in and out for the
//! [`Driver`](crate::driver::Driver), records on the wire. rustls is itself
//! sans-IO, so the event loop, the reconnects and the backoff stay exactly
//! as for plain TCP; the handshake starts with the first write, and the
//! connection's first flight (AUTH, SELECT, SCRIPT LOAD, INFO and the first
//! request) is queued in rustls and leaves as soon as the handshake lets
//! it. A TLS failure (an untrusted, expired or misnamed certificate, a peer
//! that does not speak TLS) is an I/O error carrying the rustls error, which
//! the driver turns into [`Cause::Tls`]: one failed vote, never a panic. It
//! decides nothing else.

use std::io::{self, Read, Write};
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

use crate::config::{ConfigError, TlsConfig};
use crate::conn::Cause;

/// The rustls client settings for `settings`: the CA file's certificates,
/// or else the system's roots; TLS 1.2 and 1.3 on ring; a client
/// certificate when one is given.
///
/// # Errors
/// [`ConfigError::Tls`] naming the file and the problem.
pub(crate) fn client_config(settings: &TlsConfig) -> Result<Arc<ClientConfig>, ConfigError> {
    let mut roots = RootCertStore::empty();
    match &settings.ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| file_error("CA", path, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error("CA", path, &e))?;
            if certs.is_empty() {
                return Err(file_error("CA", path, &"no certificate in it"));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| file_error("CA", path, &e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(ConfigError::Tls(
                    "no root certificate found on this system: give a CA file".into(),
                ));
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| ConfigError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    let config = match (&settings.cert_file, &settings.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert_path), Some(key_path)) => {
            let chain = CertificateDer::pem_file_iter(cert_path)
                .map_err(|e| file_error("client certificate", cert_path, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error("client certificate", cert_path, &e))?;
            if chain.is_empty() {
                return Err(file_error(
                    "client certificate",
                    cert_path,
                    &"no certificate in it",
                ));
            }
            let key = PrivateKeyDer::from_pem_file(key_path)
                .map_err(|e| file_error("client key", key_path, &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ConfigError::Tls(format!("client certificate and key: {e}")))?
        }
        _ => {
            return Err(ConfigError::Tls(
                "a client certificate needs its key, and a key its certificate".into(),
            ));
        }
    };
    Ok(Arc::new(config))
}

impl TlsConfig {
    /// The rustls client settings these files make: exactly what a
    /// [`Redlock`](crate::Redlock) or [`SharedRedlock`](crate::SharedRedlock)
    /// trusts and presents on its `rediss://` connections (the CA file's
    /// certificates, or else the system's roots; TLS 1.2 and 1.3 on ring; a
    /// client certificate when one is given). For a tool that opens its own
    /// TLS connections to the same masters, such as the `redlock probe`
    /// command, and must trust them by the client's rules. Available with
    /// the `tls` feature; the types are those of rustls 0.23, which a
    /// caller then depends on too. Each call reads the files again.
    ///
    /// # Errors
    /// [`ConfigError::Tls`] naming the file and the problem: a file that
    /// cannot be read or holds no certificate, a client certificate
    /// without its key, or no root certificate on the system when no CA
    /// file is given.
    ///
    /// # Example
    /// ```no_run
    /// use redlock_mio::TlsConfig;
    ///
    /// # fn main() -> Result<(), redlock_mio::ConfigError> {
    /// let settings = TlsConfig {
    ///     ca_file: Some("/etc/redis/ca.pem".into()),
    ///     ..TlsConfig::default()
    /// };
    /// let rustls_config = settings.client_config()?;
    /// assert!(rustls_config.alpn_protocols.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, ConfigError> {
        client_config(self)
    }
}

fn file_error(what: &str, path: &std::path::Path, error: &dyn std::fmt::Display) -> ConfigError {
    ConfigError::Tls(format!("{what} file {}: {error}", path.display()))
}

/// One TLS connection over a non-blocking TCP socket.
#[derive(Debug)]
pub(crate) struct TlsStream {
    tcp: TcpStream,
    session: ClientConnection,
}

impl TlsStream {
    /// A session to `host` (a name or an IP address, checked against the
    /// server's certificate) over `tcp`, which may still be connecting.
    ///
    /// # Errors
    /// [`Cause::Tls`] when `host` cannot be a server name.
    pub(crate) fn new(
        tcp: TcpStream,
        config: &Arc<ClientConfig>,
        host: &str,
    ) -> Result<TlsStream, Cause> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| Cause::Tls(format!("server name {host:?}: {e}").into()))?;
        let session = ClientConnection::new(Arc::clone(config), name)
            .map_err(|e| Cause::Tls(e.to_string().into()))?;
        Ok(TlsStream { tcp, session })
    }

    /// The socket, to register and to ask about its connect.
    pub(crate) fn tcp(&mut self) -> &mut TcpStream {
        &mut self.tcp
    }

    /// Plaintext read: what rustls has decrypted, after taking in what the
    /// socket holds. `WouldBlock` once both are drained (TLS readers must
    /// read to `WouldBlock`: a short read does not drain the socket).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.session.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match self.session.read_tls(&mut self.tcp) {
                Ok(0) => return Ok(0),
                Ok(_) => {
                    self.session
                        .process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    // The handshake's next flight, or an alert.
                    self.write_records()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Plaintext write: queued in rustls (which holds it until the
    /// handshake is done), then as many records as the socket takes.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.session.writer().write(buf)?;
        self.write_records()?;
        Ok(n)
    }

    /// Writes the records rustls has ready until the socket refuses more;
    /// what it refuses waits for the next call.
    pub(crate) fn write_records(&mut self) -> io::Result<()> {
        while self.session.wants_write() {
            match self.session.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The failure an I/O error of a TLS stream stands for: [`Cause::Tls`]
/// when rustls refused the session, naming why.
pub(crate) fn cause_of(error: &io::Error) -> Option<Cause> {
    let tls = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(Cause::Tls(tls.to_string().into()))
}
