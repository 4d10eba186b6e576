//! Lock tokens: the value a lock key holds, unique per lock request.
//!
//! This module owns token format and generation. A [`TokenSource`] draws
//! 128 bits from the OS random source once, when it is made, and appends a
//! counter for each token, so that minting a token is a few instructions
//! and no system call. Tokens are printable ASCII (lowercase hex), 48 bytes,
//! and stored inline: making or copying one allocates nothing.

use std::fmt;

/// The longest token accepted, in bytes.
pub const TOKEN_MAX_LEN: usize = 64;

/// A lock value: printable, at most [`TOKEN_MAX_LEN`] bytes, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    len: u8,
    bytes: [u8; TOKEN_MAX_LEN],
}

/// Why a string cannot be a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// Empty, or longer than [`TOKEN_MAX_LEN`] bytes.
    BadLength,
    /// Holds a byte that is not printable ASCII.
    NotPrintable,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::BadLength => write!(f, "a token is 1 to {TOKEN_MAX_LEN} bytes long"),
            TokenError::NotPrintable => f.write_str("a token is printable ASCII without spaces"),
        }
    }
}

impl std::error::Error for TokenError {}

impl Token {
    /// Takes a token printed earlier (by `redlock acquire`, say).
    ///
    /// # Errors
    /// [`TokenError`] when `text` is empty, too long, or not printable ASCII.
    pub fn parse(text: &str) -> Result<Token, TokenError> {
        let raw = text.as_bytes();
        if raw.is_empty() || raw.len() > TOKEN_MAX_LEN {
            return Err(TokenError::BadLength);
        }
        if !raw.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable);
        }
        let mut bytes = [0u8; TOKEN_MAX_LEN];
        bytes[..raw.len()].copy_from_slice(raw);
        Ok(Token {
            len: raw.len() as u8,
            bytes,
        })
    }

    /// The token's bytes, as stored in Redis.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Whether the token starts with `prefix` (see [`TokenSource::prefix`]).
    pub(crate) fn has_prefix(&self, prefix: &[u8]) -> bool {
        self.as_bytes().starts_with(prefix)
    }

    /// The token as text; always printable ASCII.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({})", self.as_str())
    }
}

/// Mints unique, unguessable tokens: a random 128-bit prefix per source and
/// a counter.
#[derive(Debug)]
pub(crate) struct TokenSource {
    prefix: [u8; 32],
    counter: u64,
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl TokenSource {
    /// Draws the prefix from the OS random source.
    ///
    /// # Errors
    /// When the OS random source fails.
    pub(crate) fn new() -> Result<TokenSource, getrandom::Error> {
        let mut seed = [0u8; 16];
        getrandom::fill(&mut seed)?;
        Ok(TokenSource::from_seed(seed))
    }

    /// A source with a given prefix: for tests that need repeatable tokens.
    pub(crate) fn from_seed(seed: [u8; 16]) -> TokenSource {
        let mut prefix = [0u8; 32];
        for (pair, byte) in prefix.chunks_exact_mut(2).zip(seed) {
            pair[0] = HEX[usize::from(byte >> 4)];
            pair[1] = HEX[usize::from(byte & 0x0f)];
        }
        TokenSource { prefix, counter: 0 }
    }

    /// The prefix every token of this source starts with: a token without
    /// it is another source's (another client's).
    pub(crate) fn prefix(&self) -> [u8; 32] {
        self.prefix
    }

    /// The next token: the prefix followed by the counter in 16 hex digits.
    pub(crate) fn next_token(&mut self) -> Token {
        self.counter = self.counter.wrapping_add(1);
        let mut bytes = [0u8; TOKEN_MAX_LEN];
        bytes[..32].copy_from_slice(&self.prefix);
        for (i, slot) in bytes[32..48].iter_mut().enumerate() {
            *slot = HEX[((self.counter >> (60 - 4 * i)) & 0xf) as usize];
        }
        Token { len: 48, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_from_one_source_differ_and_share_the_prefix() {
        let mut source = TokenSource::from_seed([0xab; 16]);
        let a = source.next_token();
        let b = source.next_token();
        assert_ne!(a, b);
        assert_eq!(a.as_str(), format!("{}{:016x}", "ab".repeat(16), 1));
        assert_eq!(b.as_str(), format!("{}{:016x}", "ab".repeat(16), 2));
    }

    #[test]
    fn sources_from_the_os_differ() {
        let a = TokenSource::new().unwrap().next_token();
        let b = TokenSource::new().unwrap().next_token();
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_parse_back_and_bad_ones_are_refused() {
        let token = TokenSource::from_seed([1; 16]).next_token();
        assert_eq!(Token::parse(token.as_str()), Ok(token));
        assert_eq!(Token::parse(""), Err(TokenError::BadLength));
        assert_eq!(Token::parse(&"x".repeat(65)), Err(TokenError::BadLength));
        assert!(Token::parse(&"x".repeat(64)).is_ok());
        assert_eq!(Token::parse("a b"), Err(TokenError::NotPrintable));
        assert_eq!(Token::parse("é"), Err(TokenError::NotPrintable));
    }
}
