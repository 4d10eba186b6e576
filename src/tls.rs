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
//! it. rustls holds at most 64 KiB of it, and of records the socket has not
//! taken: a write it cannot take yet is `WouldBlock`, and the rest waits in
//! the connection's own buffer, as for a socket that refused it. A TLS
//! failure (an untrusted, expired or misnamed certificate, a peer that does
//! not speak TLS) is an I/O error carrying the rustls error, which the
//! driver turns into [`Cause::Tls`]: one failed vote, never a panic. It
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
    /// let settings = TlsConfig::default().with_ca_file("/etc/redis/ca.pem");
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

    /// Plaintext write: as much of `buf` as rustls takes, then as many
    /// records as the socket takes. rustls holds at most 64 KiB: of
    /// plaintext until the handshake is done, of records the socket has not
    /// taken after it; what it does not take stays with the caller, as
    /// what a socket refuses does.
    ///
    /// # Errors
    /// `WouldBlock` when rustls took nothing: the records it holds must
    /// leave first, and the socket's next readiness says when (writable
    /// once it refused them; readable for the handshake's next flight,
    /// which frees the plaintext). Never `Ok(0)` for a non-empty `buf`,
    /// which a caller would take for a broken socket.
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            let n = self.session.writer().write(buf)?;
            let sent = self.write_records()?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // Records the socket just took made room for more plaintext;
            // with none taken, only the socket or the peer can make some.
            // Each pass around writes bytes, and rustls makes no new
            // records without plaintext or input, so this ends.
            if sent == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Writes the records rustls has ready until the socket refuses more;
    /// what it refuses waits for the next call. Returns how many bytes the
    /// socket took.
    pub(crate) fn write_records(&mut self) -> io::Result<usize> {
        let mut sent = 0usize;
        while self.session.wants_write() {
            match self.session.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => sent = sent.saturating_add(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }
}

/// The failure an I/O error of a TLS stream stands for: [`Cause::Tls`]
/// when rustls refused the session, naming why.
pub(crate) fn cause_of(error: &io::Error) -> Option<Cause> {
    let tls = error.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(Cause::Tls(tls.to_string().into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    /// A session over a socket to `listener`, which never answers: its
    /// handshake cannot end.
    fn unanswered(listener: &TcpListener) -> TlsStream {
        let addr = listener.local_addr().expect("listener address");
        let tcp = TcpStream::connect(addr).expect("connect");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(RootCertStore::empty())
            .with_no_client_auth();
        TlsStream::new(tcp, &Arc::new(config), "127.0.0.1").expect("session")
    }

    #[test]
    fn a_write_rustls_cannot_take_during_the_handshake_would_block_and_never_writes_zero() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        let mut stream = unanswered(&listener);
        let request = vec![b'x'; 200 * 1024];
        let mut taken = 0;
        let refused = loop {
            match stream.write(&request[taken..]) {
                Ok(0) => panic!("Ok(0) after {taken} bytes: a caller reads it as a broken socket"),
                Ok(n) => taken += n,
                Err(e) => break e,
            }
        };
        assert_eq!(refused.kind(), io::ErrorKind::WouldBlock, "{refused}");
        assert!(
            0 < taken && taken < request.len(),
            "rustls took {taken} of {} bytes before the handshake",
            request.len()
        );
        // Asked again, with nothing changed: the same answer, at once.
        let again = stream.write(&request[taken..]).map_err(|e| e.kind());
        assert_eq!(again, Err(io::ErrorKind::WouldBlock));
        assert_eq!(
            stream.write(&[]).map_err(|e| e.kind()),
            Ok(0),
            "an empty write"
        );
    }
}
