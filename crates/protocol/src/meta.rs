//! The meta protocol's keys and flags (`mg ms md ma mn me`).
//!
//! A flag is one letter, optionally followed by a token (`T30`, `Oabc`). The parsed
//! [`MetaFlags`] keeps the raw flag text so that a reply can echo the return flags in the
//! order the client sent them, as memcached does, without allocating.

use base64::Engine as _;

use crate::lex::{parse_i64, parse_u64, valid_key, MAX_KEY_LEN};

/// Which meta command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaCommand {
    /// `mg`: get.
    Get,
    /// `ms`: set (and the other modes).
    Set,
    /// `md`: delete.
    Delete,
    /// `ma`: arithmetic.
    Arith,
    /// `mn`: no-op (ends a pipeline of quiet requests).
    Noop,
    /// `me`: debug (the item's metadata).
    Debug,
}

impl MetaCommand {
    /// Every meta command.
    pub const ALL: [MetaCommand; 6] = [
        MetaCommand::Get,
        MetaCommand::Set,
        MetaCommand::Delete,
        MetaCommand::Arith,
        MetaCommand::Noop,
        MetaCommand::Debug,
    ];

    /// The command's name on the wire.
    pub fn name(self) -> &'static [u8] {
        match self {
            MetaCommand::Get => b"mg",
            MetaCommand::Set => b"ms",
            MetaCommand::Delete => b"md",
            MetaCommand::Arith => b"ma",
            MetaCommand::Noop => b"mn",
            MetaCommand::Debug => b"me",
        }
    }

    pub(crate) fn from_name(name: &[u8]) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The flags memcached accepts for this command.
    fn accepts(self, flag: u8) -> bool {
        let allowed: &[u8] = match self {
            MetaCommand::Get => b"bcfhklOqstuvTNREx",
            MetaCommand::Set => b"bcCEFIklOqsTMN",
            MetaCommand::Delete => b"bCEIklOqTx",
            MetaCommand::Arith => b"bcCEklNJDTMOqtv",
            MetaCommand::Debug => b"b",
            MetaCommand::Noop => b"",
        };
        allowed.contains(&flag)
    }
}

/// Longest opaque token (`O`) memcached accepts.
pub const MAX_OPAQUE_LEN: usize = 32;

/// What was wrong with a meta request's key or flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// `CLIENT_ERROR invalid flag`.
    #[error("invalid flag")]
    InvalidFlag,
    /// `CLIENT_ERROR duplicate flag`.
    #[error("duplicate flag")]
    DuplicateFlag,
    /// `CLIENT_ERROR bad token`.
    #[error("bad token")]
    BadToken,
    /// `CLIENT_ERROR bad token in arithmetic`.
    #[error("bad token in arithmetic")]
    BadArithToken,
    /// `CLIENT_ERROR opaque token too long`.
    #[error("opaque token too long")]
    OpaqueTooLong,
    /// `CLIENT_ERROR error decoding key`.
    #[error("error decoding key")]
    KeyDecode,
    /// `CLIENT_ERROR bad key`.
    #[error("bad key")]
    BadKey,
    /// `CLIENT_ERROR invalid mode for ms`.
    #[error("invalid mode for ms")]
    SetMode,
    /// `CLIENT_ERROR invalid mode for ma`.
    #[error("invalid mode for ma")]
    ArithMode,
    /// `CLIENT_ERROR bad client flags`.
    #[error("bad client flags")]
    ClientFlags,
}

impl MetaError {
    /// memcached 1.6's reply line for this error.
    pub fn reply(&self) -> &'static [u8] {
        match self {
            MetaError::InvalidFlag => b"CLIENT_ERROR invalid flag\r\n",
            MetaError::DuplicateFlag => b"CLIENT_ERROR duplicate flag\r\n",
            MetaError::BadToken => b"CLIENT_ERROR bad token in command line format\r\n",
            MetaError::BadArithToken => b"CLIENT_ERROR invalid or duplicate flag\r\n",
            MetaError::OpaqueTooLong => b"CLIENT_ERROR opaque token too long\r\n",
            MetaError::KeyDecode => b"CLIENT_ERROR error decoding key\r\n",
            MetaError::BadKey | MetaError::ClientFlags => {
                b"CLIENT_ERROR bad command line format\r\n"
            }
            MetaError::SetMode => b"CLIENT_ERROR invalid mode for ms M token\r\n",
            MetaError::ArithMode => b"CLIENT_ERROR invalid mode for ma M token\r\n",
        }
    }
}

/// A meta command's key as sent: plain, or base64 (`b` flag) and decoded on use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaKey<'a> {
    raw: &'a [u8],
    base64: bool,
}

impl<'a> MetaKey<'a> {
    /// A plain (not base64) key, already validated (by the parser, or a binary header's
    /// length checks).
    pub fn plain(raw: &'a [u8]) -> Self {
        MetaKey { raw, base64: false }
    }

    pub(crate) fn empty() -> Self {
        MetaKey {
            raw: &[],
            base64: false,
        }
    }

    /// Validates the key (decoding it once if it is base64). As in memcached, the key as sent
    /// may not exceed [`MAX_KEY_LEN`] bytes even when it is base64 text (so at most 186 bytes
    /// decoded): a longer token is a bad command line, refused before decoding.
    pub fn new(raw: &'a [u8], base64: bool) -> Result<Self, MetaError> {
        let key = MetaKey { raw, base64 };
        if base64 && raw.len() > MAX_KEY_LEN {
            return Err(MetaError::BadKey);
        }
        if base64 {
            let mut buf = [0u8; DECODED_MAX];
            let decoded = key.decode(&mut buf).ok_or(MetaError::KeyDecode)?;
            if !valid_key(decoded) {
                return Err(MetaError::KeyDecode);
            }
        } else if !valid_key(raw) {
            return Err(MetaError::BadKey);
        }
        Ok(key)
    }

    /// The key as the client sent it (base64 text when `b` was given): what `k` echoes.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// Whether the key travels base64-encoded.
    pub fn is_base64(&self) -> bool {
        self.base64
    }

    /// Calls `f` with the binary key: the raw bytes, or the base64 decoding in a stack buffer.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if !self.base64 {
            return f(self.raw);
        }
        let mut buf = [0u8; DECODED_MAX];
        // Invariant: `new` checked that the key decodes into a valid key.
        let decoded = self.decode(&mut buf).unwrap_or(&[]);
        f(decoded)
    }

    fn decode<'b>(&self, buf: &'b mut [u8; DECODED_MAX]) -> Option<&'b [u8]> {
        if self.raw.len() > ENCODED_MAX {
            return None;
        }
        let n = base64::engine::general_purpose::STANDARD
            .decode_slice(self.raw, buf)
            .ok()?;
        Some(&buf[..n])
    }
}

/// Room for a decoded key: base64 text is at most [`MAX_KEY_LEN`] bytes (`new` checks it),
/// which decodes to at most 3/4 of that.
const DECODED_MAX: usize = MAX_KEY_LEN / 4 * 3 + 3;
const ENCODED_MAX: usize = MAX_KEY_LEN;

/// The flags of one meta request, with their tokens parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaFlags<'a> {
    /// The flag text as sent (space separated), for echoing return flags in order.
    raw: &'a [u8],
    present: u64,
    /// `O`: opaque token echoed in the reply.
    pub opaque: Option<&'a [u8]>,
    /// `T`: TTL to set (touch on `mg`, exptime on `ms`, on `md` with `I`, vivify TTL on `ma`).
    pub ttl: Option<i64>,
    /// `N`: vivify on miss with this TTL.
    pub vivify: Option<i64>,
    /// `R`: win a recache token if the remaining TTL is below this.
    pub recache: Option<u64>,
    /// `C`: compare CAS.
    pub compare_cas: Option<u64>,
    /// `E`: explicit new CAS value.
    pub new_cas: Option<u64>,
    /// `F`: client flags (`ms`).
    pub client_flags: Option<u32>,
    /// `M`: mode switch (`ms`: E A P R S; `ma`: I + D -), normalised to upper case.
    pub mode: Option<u8>,
    /// `D`: delta (`ma`).
    pub delta: Option<u64>,
    /// `J`: initial value on vivify (`ma`).
    pub initial: Option<u64>,
    /// `b`: key is base64.
    pub base64: bool,
    /// `q`: quiet mode (suppress the common success/miss reply).
    pub quiet: bool,
    /// `I`: invalidate (mark stale) instead of removing/refusing.
    pub invalidate: bool,
    /// `u`: don't bump the item in the LRU.
    pub no_bump: bool,
}

fn bit(flag: u8) -> u64 {
    match flag {
        b'a'..=b'z' => 1 << (flag - b'a'),
        b'A'..=b'Z' => 1 << (26 + flag - b'A'),
        _ => 0,
    }
}

impl<'a> MetaFlags<'a> {
    /// Parses the flag tokens of `command`.
    pub fn parse(command: MetaCommand, raw: &'a [u8]) -> Result<Self, MetaError> {
        let mut f = MetaFlags {
            raw,
            ..MetaFlags::default()
        };
        let bad = if command == MetaCommand::Arith {
            MetaError::BadArithToken
        } else {
            MetaError::BadToken
        };
        for token in raw.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            let flag = token[0];
            let arg = &token[1..];
            if !command.accepts(flag) {
                return Err(MetaError::InvalidFlag);
            }
            if f.present & bit(flag) != 0 {
                return Err(if command == MetaCommand::Arith {
                    MetaError::BadArithToken
                } else {
                    MetaError::DuplicateFlag
                });
            }
            f.present |= bit(flag);
            match flag {
                b'b' => f.base64 = true,
                b'q' => f.quiet = true,
                b'I' => f.invalidate = true,
                b'u' => f.no_bump = true,
                b'O' => {
                    if arg.len() > MAX_OPAQUE_LEN {
                        return Err(MetaError::OpaqueTooLong);
                    }
                    f.opaque = Some(arg);
                }
                b'T' => f.ttl = Some(parse_i64(arg).ok_or(bad)?),
                b'N' => f.vivify = Some(parse_i64(arg).ok_or(bad)?),
                b'R' => f.recache = Some(parse_u64(arg).ok_or(bad)?),
                b'C' => f.compare_cas = Some(parse_u64(arg).ok_or(bad)?),
                b'E' => f.new_cas = Some(parse_u64(arg).ok_or(bad)?),
                b'D' => f.delta = Some(parse_u64(arg).ok_or(bad)?),
                b'J' => f.initial = Some(parse_u64(arg).ok_or(bad)?),
                b'F' => {
                    f.client_flags = Some(
                        parse_u64(arg)
                            .and_then(|v| u32::try_from(v).ok())
                            .ok_or(MetaError::ClientFlags)?,
                    )
                }
                b'M' => {
                    let mode = arg.first().map(u8::to_ascii_uppercase);
                    let ok: &[u8] = if command == MetaCommand::Set {
                        b"EAPRS"
                    } else {
                        b"I+D-"
                    };
                    match mode {
                        Some(m) if arg.len() == 1 && ok.contains(&m) => f.mode = Some(m),
                        _ if command == MetaCommand::Set => return Err(MetaError::SetMode),
                        _ => return Err(MetaError::ArithMode),
                    }
                }
                _ => {}
            }
        }
        Ok(f)
    }

    /// Whether `flag` was given.
    pub fn has(&self, flag: u8) -> bool {
        self.present & bit(flag) != 0
    }

    /// The flag text as sent (space-separated tokens), for forwarding the request unchanged.
    pub fn text(&self) -> &'a [u8] {
        self.raw
    }

    /// The flag letters in the order the client sent them.
    pub fn letters(&self) -> impl Iterator<Item = u8> + 'a {
        self.raw
            .split(|&b| b == b' ')
            .filter_map(|t| t.first().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_tokens_and_keep_order() {
        let f = MetaFlags::parse(MetaCommand::Get, b"v O123 T30 k c").unwrap();
        assert_eq!(f.opaque, Some(&b"123"[..]));
        assert_eq!(f.ttl, Some(30));
        assert!(f.has(b'v') && f.has(b'k') && !f.has(b'f'));
        assert_eq!(f.letters().collect::<Vec<_>>(), b"vOTkc");
    }

    #[test]
    fn flag_errors_use_memcached_wording() {
        assert_eq!(
            MetaFlags::parse(MetaCommand::Get, b"zz"),
            Err(MetaError::InvalidFlag)
        );
        assert_eq!(
            MetaFlags::parse(MetaCommand::Get, b"v v"),
            Err(MetaError::DuplicateFlag)
        );
        assert_eq!(
            MetaFlags::parse(MetaCommand::Set, b"Tabc"),
            Err(MetaError::BadToken)
        );
        assert_eq!(
            MetaFlags::parse(MetaCommand::Set, b"MX"),
            Err(MetaError::SetMode)
        );
        assert_eq!(
            MetaFlags::parse(MetaCommand::Arith, b"MX"),
            Err(MetaError::ArithMode)
        );
        assert_eq!(
            MetaFlags::parse(MetaCommand::Arith, b"D-1"),
            Err(MetaError::BadArithToken)
        );
        let long = [b'O'; 40];
        assert_eq!(
            MetaFlags::parse(MetaCommand::Get, &long),
            Err(MetaError::OpaqueTooLong)
        );
    }

    #[test]
    fn base64_keys_decode() {
        let k = MetaKey::new(b"a2V5", true).unwrap();
        assert_eq!(k.with(|k| k.to_vec()), b"key");
        assert_eq!(k.raw(), b"a2V5");
        assert_eq!(MetaKey::new(b"!!!", true), Err(MetaError::KeyDecode));
        assert_eq!(MetaKey::new(&[b'a'; 251], false), Err(MetaError::BadKey));
    }
}
