//! The bounds a parser enforces ([`Limits`]) and the protocol a connection may speak
//! ([`Binding`]).

/// Bounds the parser enforces so that a connection's memory stays bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest value accepted by storage commands (memcached `-I`); larger ones are
    /// answered `SERVER_ERROR object too large for cache` and their data is swallowed.
    pub item_size_max: usize,
    /// Most bytes of a command line (except a retrieval's) buffered before its newline:
    /// memcached closes a connection, silently, whose input passes 2048 bytes without a
    /// newline. A complete line that arrived whole is parsed whatever its length (up to
    /// [`Limits::max_get_line`]), as memcached does.
    pub max_line: usize,
    /// Longest retrieval line (`get`, `gets`, `gat`, `gats` with many keys).
    pub max_get_line: usize,
    /// Which protocol a connection may speak (memcached's `-B`).
    pub binding: Binding,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            item_size_max: 1024 * 1024,
            max_line: 2048,
            max_get_line: 256 * 1024,
            binding: Binding::Auto,
        }
    }
}

/// memcached's `-B`: the protocol every connection speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Binding {
    /// Decided by a connection's first byte: the binary protocol's magic (0x80), else
    /// the text protocol (memcached's default, `auto`).
    #[default]
    Auto,
    /// The text (and meta) protocol only: binary requests are read as text lines.
    Ascii,
    /// The binary protocol only: a connection whose first request does not start with
    /// the magic byte is closed without a reply, once a whole header (24 bytes) is in.
    Binary,
}

impl std::fmt::Display for Binding {
    /// As memcached's `stats settings` shows it (`binding_protocol`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Binding::Auto => "auto-negotiate",
            Binding::Ascii => "ascii",
            Binding::Binary => "binary",
        })
    }
}
