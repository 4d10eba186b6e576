//! Master addresses, parsed from URLs.
//!
//! This module owns the URL grammar and the secrecy of passwords: a
//! [`ServerAddr`] never shows its password in `Debug` or `Display`, and no
//! error built here repeats the URL it failed on. It resolves nothing and
//! opens nothing.
//!
//! Accepted forms:
//! - `redis://[user[:password]@]host[:port][/db]`, with `host` a name, an
//!   IPv4 address or a bracketed IPv6 address, port 6379 by default; user
//!   and password are percent-decoded; a password alone is written
//!   `redis://:password@host`.
//! - `rediss://...`, the same over TLS (with the `tls` feature).
//! - `unix:///path/to/socket[?db=N]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a master listens.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// A TCP address: host name or IP literal, and port.
    Tcp {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// TCP port.
        port: u16,
    },
    /// A Unix domain socket path.
    Unix(PathBuf),
}

/// A password, hidden from every formatted output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The password itself, for the AUTH command only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// One master's address and credentials, parsed from a URL
/// (`"redis://..".parse::<ServerAddr>()`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerAddr {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// ACL user name, sent with the password as `AUTH user password`.
    pub user: Option<String>,
    /// Password, sent as `AUTH password` (or with the user).
    pub password: Option<Secret>,
    /// Database number; `SELECT` is sent when it is not 0.
    pub db: u32,
    /// Speak TLS (`rediss://`), the server's name checked against the
    /// URL's host (a name or an IP address).
    pub tls: bool,
}

/// Why a URL was refused. The URL itself is not repeated, since it may
/// carry a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddrError {
    /// Not `redis://`, `rediss://` nor `unix://`.
    UnsupportedScheme,
    /// `rediss://` in a build without the `tls` feature.
    TlsNotBuilt,
    /// `redis://` with nothing where the host goes.
    MissingHost,
    /// A `[` without its `]`, or text between `]` and the port.
    BadIpv6,
    /// A port that is not a number in 1..=65535.
    BadPort,
    /// A database that is not a non-negative 32-bit number.
    BadDb,
    /// A `%` not followed by two hex digits, or decoded bytes that are not
    /// UTF-8.
    BadPercentEncoding,
    /// `unix://` without an absolute path.
    MissingSocketPath,
    /// A query parameter other than `db` on a unix URL, or any query on a
    /// redis URL.
    UnknownParameter,
    /// A user name given with no password.
    UserWithoutPassword,
}

impl fmt::Display for AddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddrError::UnsupportedScheme => {
                "unsupported URL scheme (expected redis://, rediss:// or unix://)"
            }
            AddrError::TlsNotBuilt => {
                "rediss:// needs TLS, and this build of redlock-mio has no `tls` feature"
            }
            AddrError::MissingHost => "URL has no host",
            AddrError::BadIpv6 => "malformed bracketed IPv6 host",
            AddrError::BadPort => "port is not a number between 1 and 65535",
            AddrError::BadDb => "database is not a number between 0 and 4294967295",
            AddrError::BadPercentEncoding => "malformed percent-encoding in user or password",
            AddrError::MissingSocketPath => "unix:// URL needs an absolute socket path",
            AddrError::UnknownParameter => "unknown URL parameter (only ?db=N on unix:// URLs)",
            AddrError::UserWithoutPassword => "a user name needs a password (user:password@)",
        })
    }
}

impl std::error::Error for AddrError {}

impl FromStr for ServerAddr {
    type Err = AddrError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = url.strip_prefix("redis://") {
            parse_tcp(rest)
        } else if let Some(rest) = url.strip_prefix("rediss://") {
            if !cfg!(feature = "tls") {
                return Err(AddrError::TlsNotBuilt);
            }
            parse_tcp(rest).map(|addr| ServerAddr { tls: true, ..addr })
        } else if let Some(rest) = url.strip_prefix("unix://") {
            parse_unix(rest)
        } else {
            Err(AddrError::UnsupportedScheme)
        }
    }
}

fn parse_tcp(rest: &str) -> Result<ServerAddr, AddrError> {
    if rest.contains('?') || rest.contains('#') {
        return Err(AddrError::UnknownParameter);
    }
    // The password may hold '@' or '/' when not percent-encoded; the host
    // part never does, so split at the last '@'.
    let (userinfo, hostpart) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let (authority, db) = match hostpart.split_once('/') {
        Some((authority, "")) => (authority, 0),
        Some((authority, db)) => (authority, parse_db(db)?),
        None => (hostpart, 0),
    };
    let (host, port) = split_host_port(authority)?;
    let (user, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = (!user.is_empty())
                .then(|| percent_decode(user))
                .transpose()?;
            let password = password.map(percent_decode).transpose()?.map(Secret);
            if user.is_some() && password.is_none() {
                return Err(AddrError::UserWithoutPassword);
            }
            (user, password)
        }
    };
    Ok(ServerAddr {
        endpoint: Endpoint::Tcp { host, port },
        user,
        password,
        db,
        tls: false,
    })
}

fn split_host_port(authority: &str) -> Result<(String, u16), AddrError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']').ok_or(AddrError::BadIpv6)?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':').ok_or(AddrError::BadIpv6)?),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(AddrError::MissingHost);
    }
    let port = match port {
        None => 6379,
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(AddrError::BadPort),
            Ok(port) => port,
        },
        Some(_) => return Err(AddrError::BadPort),
    };
    Ok((host.to_owned(), port))
}

fn parse_unix(rest: &str) -> Result<ServerAddr, AddrError> {
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    if !path.starts_with('/') || path.len() < 2 {
        return Err(AddrError::MissingSocketPath);
    }
    let mut db = 0;
    if let Some(query) = query {
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("db", value)) => db = parse_db(value)?,
                _ => return Err(AddrError::UnknownParameter),
            }
        }
    }
    Ok(ServerAddr {
        endpoint: Endpoint::Unix(PathBuf::from(path)),
        user: None,
        password: None,
        db,
        tls: false,
    })
}

fn parse_db(text: &str) -> Result<u32, AddrError> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AddrError::BadDb);
    }
    text.parse().map_err(|_| AddrError::BadDb)
}

fn percent_decode(text: &str) -> Result<String, AddrError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or(AddrError::BadPercentEncoding)?;
            let digit = |b: u8| {
                (b as char)
                    .to_digit(16)
                    .ok_or(AddrError::BadPercentEncoding)
            };
            out.push((digit(hex[0])? * 16 + digit(hex[1])?) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| AddrError::BadPercentEncoding)
}

impl fmt::Display for ServerAddr {
    /// The URL with any password replaced by `***`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                f.write_str(if self.tls { "rediss://" } else { "redis://" })?;
                match (&self.user, &self.password) {
                    (Some(user), _) => write!(f, "{user}:***@")?,
                    (None, Some(_)) => f.write_str(":***@")?,
                    (None, None) => {}
                }
                if host.contains(':') {
                    write!(f, "[{host}]:{port}")?;
                } else {
                    write!(f, "{host}:{port}")?;
                }
                if self.db != 0 {
                    write!(f, "/{}", self.db)?;
                }
                Ok(())
            }
            Endpoint::Unix(path) => {
                write!(f, "unix://{}", path.display())?;
                if self.db != 0 {
                    write!(f, "?db={}", self.db)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Endpoint {
        Endpoint::Tcp {
            host: host.to_owned(),
            port,
        }
    }

    /// URL, endpoint, user, password, db.
    type UrlCase = (
        &'static str,
        Endpoint,
        Option<&'static str>,
        Option<&'static str>,
        u32,
    );

    #[test]
    fn valid_urls_parse_to_their_parts() {
        let cases: &[UrlCase] = &[
            ("redis://127.0.0.1", tcp("127.0.0.1", 6379), None, None, 0),
            (
                "redis://localhost:7000",
                tcp("localhost", 7000),
                None,
                None,
                0,
            ),
            (
                "redis://localhost:7000/",
                tcp("localhost", 7000),
                None,
                None,
                0,
            ),
            ("redis://h:1/15", tcp("h", 1), None, None, 15),
            ("redis://[::1]:6380/2", tcp("::1", 6380), None, None, 2),
            ("redis://[::1]", tcp("::1", 6379), None, None, 0),
            ("redis://:secret@h", tcp("h", 6379), None, Some("secret"), 0),
            (
                "redis://alice:pw@h:2/3",
                tcp("h", 2),
                Some("alice"),
                Some("pw"),
                3,
            ),
            (
                "redis://:p%40ss%2Fw%3a@h",
                tcp("h", 6379),
                None,
                Some("p@ss/w:"),
                0,
            ),
            ("redis://:a@b@h", tcp("h", 6379), None, Some("a@b"), 0),
            (
                "unix:///tmp/r.sock",
                Endpoint::Unix("/tmp/r.sock".into()),
                None,
                None,
                0,
            ),
            (
                "unix:///tmp/r.sock?db=4",
                Endpoint::Unix("/tmp/r.sock".into()),
                None,
                None,
                4,
            ),
        ];
        for (url, endpoint, user, password, db) in cases {
            let addr: ServerAddr = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(&addr.endpoint, endpoint, "{url}");
            assert_eq!(addr.user.as_deref(), *user, "{url}");
            assert_eq!(
                addr.password.as_ref().map(Secret::expose),
                *password,
                "{url}"
            );
            assert_eq!(addr.db, *db, "{url}");
        }
    }

    #[test]
    fn rediss_is_the_tcp_form_over_tls_and_displays_as_such() {
        let addr: Result<ServerAddr, _> = "rediss://:pw@10.0.0.1:6380/2".parse();
        if !cfg!(feature = "tls") {
            assert_eq!(addr, Err(AddrError::TlsNotBuilt));
            return;
        }
        let addr = addr.unwrap();
        assert!(addr.tls);
        assert_eq!(addr.endpoint, tcp("10.0.0.1", 6380));
        assert_eq!(addr.db, 2);
        assert_eq!(addr.to_string(), "rediss://:***@10.0.0.1:6380/2");
        let plain: ServerAddr = "redis://10.0.0.1".parse().unwrap();
        assert!(!plain.tls);
    }

    #[test]
    fn malformed_urls_are_clear_errors() {
        let cases: &[(&str, AddrError)] = &[
            ("", AddrError::UnsupportedScheme),
            ("localhost:6379", AddrError::UnsupportedScheme),
            ("rediss:/h", AddrError::UnsupportedScheme),
            ("rediss://", AddrError::MissingHost),
            ("http://h", AddrError::UnsupportedScheme),
            ("redis://", AddrError::MissingHost),
            ("redis://:6379", AddrError::MissingHost),
            ("redis://h:", AddrError::BadPort),
            ("redis://h:0", AddrError::BadPort),
            ("redis://h:65536", AddrError::BadPort),
            ("redis://h:+1", AddrError::BadPort),
            ("redis://h:x", AddrError::BadPort),
            ("redis://[::1", AddrError::BadIpv6),
            ("redis://[::1]x", AddrError::BadIpv6),
            ("redis://h/x", AddrError::BadDb),
            ("redis://h/-1", AddrError::BadDb),
            ("redis://h/99999999999", AddrError::BadDb),
            ("redis://:%zz@h", AddrError::BadPercentEncoding),
            ("redis://:%4@h", AddrError::BadPercentEncoding),
            ("redis://:%ff@h", AddrError::BadPercentEncoding),
            ("redis://alice@h", AddrError::UserWithoutPassword),
            ("redis://h?timeout=1", AddrError::UnknownParameter),
            ("unix://", AddrError::MissingSocketPath),
            ("unix://relative.sock", AddrError::MissingSocketPath),
            ("unix:///s?db=x", AddrError::BadDb),
            ("unix:///s?pw=x", AddrError::UnknownParameter),
        ];
        for (url, want) in cases {
            assert_eq!(url.parse::<ServerAddr>(), Err(*want), "{url:?}");
        }
    }

    #[test]
    fn the_password_never_shows_in_debug_or_display() {
        let addr: ServerAddr = "redis://alice:hunter2@h:1/2".parse().unwrap();
        let debug = format!("{addr:?}");
        let display = addr.to_string();
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(!display.contains("hunter2"), "{display}");
        assert_eq!(display, "redis://alice:***@h:1/2");
        let only_pw: ServerAddr = "redis://:hunter2@[::1]".parse().unwrap();
        assert_eq!(only_pw.to_string(), "redis://:***@[::1]:6379");
    }

    #[test]
    fn display_parses_back_to_the_same_address_without_credentials() {
        for url in [
            "redis://h:7/3",
            "redis://[::1]:6379",
            "unix:///tmp/x.sock?db=9",
        ] {
            let addr: ServerAddr = url.parse().unwrap();
            assert_eq!(addr.to_string().parse::<ServerAddr>(), Ok(addr));
        }
    }
}
