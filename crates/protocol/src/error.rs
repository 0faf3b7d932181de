//! What was wrong with a request, and memcached's reply to it.

use crate::meta::MetaError;

/// What was wrong with a request; [`ProtocolError::reply`] is memcached's answer to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Unknown command or wrong number of arguments (see [`ProtocolError::reply`]).
    #[error("unknown command or wrong number of arguments")]
    UnknownCommand,
    /// Bad command line format (see [`ProtocolError::reply`]).
    #[error("bad command line format")]
    BadFormat,
    /// Bad data chunk (see [`ProtocolError::reply`]).
    #[error("bad data chunk")]
    BadDataChunk,
    /// Object too large for cache (see [`ProtocolError::reply`]).
    #[error("object too large for cache")]
    TooLarge,
    /// Invalid exptime argument (see [`ProtocolError::reply`]).
    #[error("invalid exptime argument")]
    InvalidExptime,
    /// Invalid numeric delta argument (see [`ProtocolError::reply`]).
    #[error("invalid numeric delta argument")]
    InvalidDelta,
    /// Bad delete usage (see [`ProtocolError::reply`]).
    #[error("bad delete usage")]
    DeleteUsage,
    /// Line too long (see [`ProtocolError::reply`]).
    #[error("line too long")]
    LineTooLong,
    /// An unknown command whose last token starts with `HTTP/`: an HTTP client on the
    /// memcached port. memcached closes the connection without a reply.
    #[error("an HTTP request on the memcached port")]
    Http,
    /// A meta command's key or flags were bad.
    #[error("meta: {0}")]
    Meta(MetaError),
}

impl ProtocolError {
    /// The reply line, with its `\r\n`, exactly as memcached 1.6 writes it.
    pub fn reply(&self) -> &'static [u8] {
        match self {
            ProtocolError::UnknownCommand => b"ERROR\r\n",
            ProtocolError::BadFormat => b"CLIENT_ERROR bad command line format\r\n",
            ProtocolError::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            ProtocolError::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
            ProtocolError::InvalidExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            ProtocolError::InvalidDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            ProtocolError::DeleteUsage => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            // memcached closes without a word.
            ProtocolError::LineTooLong => b"",
            ProtocolError::Http => b"",
            ProtocolError::Meta(e) => e.reply(),
        }
    }

    /// Whether the connection is closed after the reply (the input can't be resynchronised).
    pub fn closes(&self) -> bool {
        matches!(self, ProtocolError::LineTooLong | ProtocolError::Http)
    }
}
