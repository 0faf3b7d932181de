//! A request as the proxy forwards it to a backend: its own wire form, re-composed from the
//! parsed fields, without `noreply` (the proxy drops the reply instead, so that every request
//! a backend gets has a reply to wait for), and its [`Shape`], noted while composing: what the
//! workers need to route it and to hand out its replies, so that they never parse it again.
//! Used by the network stage (what it queues) and by the workers (a `cas` followed up on the
//! other replicas as a `set`).

use kvlab_protocol::request::{Keys, StoreCommand};
use kvlab_protocol::{MetaCommand, MetaFlags, MetaKey, Request};

/// What a worker needs of a request as forwarded: its kind and where its key (a retrieval's
/// key list) lies in the composed bytes. Like memcached's proxy, which keeps a request's
/// bytes with the offsets of its tokens, the request is parsed once, by the network stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// What kind of request it is.
    pub kind: Kind,
    /// The key (a retrieval's keys as sent, space separated) is `bytes[key_at..key_end]`.
    pub key_at: usize,
    /// See `key_at`.
    pub key_end: usize,
    /// How many keys it names: one, several for a retrieval, none for `flush_all` and
    /// settings.
    pub keys: u32,
}

/// The kinds of request the workers tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `get gets gat gats`: `cas` for the `s` forms, `exptime` for the `gat` forms.
    Get {
        /// `gets`/`gats`.
        cas: bool,
        /// The `gat` forms' expiry.
        exptime: Option<i64>,
    },
    /// A write of one key: a storage command, `incr decr delete touch`; `cas`: it is a `cas`.
    Write {
        /// It is a `cas`.
        cas: bool,
    },
    /// A meta command.
    Meta(MetaShape),
    /// `flush_all`.
    FlushAll,
    /// A setting every backend takes (`slabs automove`).
    Setting,
    /// Not forwarded (answered by the network stage).
    Other,
}

/// What routing needs of a meta command's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaShape {
    /// Which command.
    pub command: MetaCommand,
    /// The key is base64 text (`b`).
    pub base64: bool,
    /// `q`: the proxy follows it with `mn`.
    pub quiet: bool,
    /// `C`: a compare-and-set.
    pub compare: bool,
    /// `c`: it returns the item's CAS value.
    pub returns_cas: bool,
    /// It changes the item or reports its access history (`N T R h l`).
    pub touches: bool,
}

impl MetaShape {
    /// What routing needs of meta command `command` on `key` with `flags`.
    pub fn of(command: MetaCommand, key: &MetaKey<'_>, flags: &MetaFlags<'_>) -> MetaShape {
        MetaShape {
            command,
            base64: key.is_base64(),
            quiet: flags.quiet,
            compare: flags.compare_cas.is_some(),
            returns_cas: flags.has(b'c'),
            touches: flags.vivify.is_some()
                || flags.ttl.is_some()
                || flags.recache.is_some()
                || flags.has(b'h')
                || flags.has(b'l'),
        }
    }
}

impl Shape {
    /// The shape of what is not forwarded.
    pub const OTHER: Shape = Shape {
        kind: Kind::Other,
        key_at: 0,
        key_end: 0,
        keys: 0,
    };

    /// The key as composed (a meta key as sent: maybe base64 text; a retrieval's key list).
    pub fn raw_key<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        bytes.get(self.key_at..self.key_end).unwrap_or_default()
    }

    /// A retrieval's keys, in request order.
    pub fn keys<'a>(&self, bytes: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.raw_key(bytes)
            .split(|&b| b == b' ')
            .filter(|k| !k.is_empty())
    }

    /// Calls `f` with the key as stored: a base64 meta key decoded.
    pub fn with_key<R>(&self, bytes: &[u8], f: impl FnOnce(&[u8]) -> R) -> R {
        let raw = self.raw_key(bytes);
        match self.kind {
            Kind::Meta(MetaShape { base64: true, .. }) => match MetaKey::new(raw, true) {
                Ok(key) => key.with(f),
                // It decoded when the request was parsed.
                Err(_) => f(&[]),
            },
            _ => f(raw),
        }
    }
}

/// Writes `req` as it is forwarded, its own wire form minus `noreply`, and returns its shape
/// (offsets into `out`): one step per family of commands, each writing the command line
/// (and a storage command's data) and noting the shape; the line's end is written here.
pub fn compose(req: &Request<'_>, out: &mut Vec<u8>) -> Shape {
    let mut num = itoa::Buffer::new();
    let shape = match *req {
        Request::Get { keys, cas } => compose_retrieval(b"get", cas, None, keys, out, &mut num),
        Request::Gat { exptime, keys, cas } => {
            compose_retrieval(b"gat", cas, Some(exptime), keys, out, &mut num)
        }
        Request::Store {
            command,
            key,
            flags,
            exptime,
            data,
            cas_unique,
            ..
        } => {
            let cas = (command == StoreCommand::Cas).then_some(cas_unique);
            compose_storage(command, key, (flags, exptime, cas), data, out, &mut num)
        }
        Request::Arith {
            incr, key, delta, ..
        } => {
            let name: &[u8] = if incr { b"incr" } else { b"decr" };
            compose_key_command(name, key, Some(delta), out, &mut num)
        }
        Request::Delete { key, .. } => {
            compose_key_command(b"delete", key, None::<u64>, out, &mut num)
        }
        Request::Touch { key, exptime, .. } => {
            compose_key_command(b"touch", key, Some(exptime), out, &mut num)
        }
        Request::SlabsAutomove { mode } => compose_server(
            Kind::Setting,
            b"slabs automove ",
            i64::from(mode),
            out,
            &mut num,
        ),
        Request::FlushAll { delay, .. } => {
            compose_server(Kind::FlushAll, b"flush_all ", delay, out, &mut num)
        }
        Request::Meta {
            command,
            key,
            flags,
            data,
        } => compose_meta(command, key, &flags, data, out, &mut num),
        Request::Verbosity { .. }
        | Request::Version
        | Request::Quit
        | Request::Stats { .. }
        | Request::Admin(_)
        | Request::Cluster { .. } => Shape::OTHER,
    };
    out.extend_from_slice(b"\r\n");
    shape
}

/// `get`/`gets KEYS`, `gat`/`gats EXPTIME KEYS` (`name` the form without `s`).
fn compose_retrieval(
    name: &[u8],
    cas: bool,
    exptime: Option<i64>,
    keys: Keys<'_>,
    out: &mut Vec<u8>,
    num: &mut itoa::Buffer,
) -> Shape {
    out.extend_from_slice(name);
    if cas {
        out.push(b's');
    }
    out.push(b' ');
    if let Some(exptime) = exptime {
        out.extend_from_slice(num.format(exptime).as_bytes());
        out.push(b' ');
    }
    let (key_at, key_end) = put(out, keys.text());
    Shape {
        kind: Kind::Get { cas, exptime },
        key_at,
        key_end,
        keys: keys.iter().count() as u32,
    }
}

/// A storage command: `COMMAND KEY FLAGS EXPTIME BYTES [CAS]`, then its data (the tuple:
/// the flags, the expiry and a `cas`'s compare value).
fn compose_storage(
    command: StoreCommand,
    key: &[u8],
    (flags, exptime, cas): (u32, i64, Option<u64>),
    data: &[u8],
    out: &mut Vec<u8>,
    num: &mut itoa::Buffer,
) -> Shape {
    out.extend_from_slice(command.name());
    out.push(b' ');
    let (key_at, key_end) = put(out, key);
    out.push(b' ');
    out.extend_from_slice(num.format(flags).as_bytes());
    out.push(b' ');
    out.extend_from_slice(num.format(exptime).as_bytes());
    out.push(b' ');
    out.extend_from_slice(num.format(data.len()).as_bytes());
    if let Some(cas) = cas {
        out.push(b' ');
        out.extend_from_slice(num.format(cas).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    Shape {
        kind: Kind::Write { cas: cas.is_some() },
        key_at,
        key_end,
        keys: 1,
    }
}

/// A write of one key by name: `incr`/`decr KEY DELTA`, `delete KEY`, `touch KEY EXPTIME`
/// (`arg`: the number after the key, if any).
fn compose_key_command(
    name: &[u8],
    key: &[u8],
    arg: Option<impl itoa::Integer>,
    out: &mut Vec<u8>,
    num: &mut itoa::Buffer,
) -> Shape {
    out.extend_from_slice(name);
    out.push(b' ');
    let (key_at, key_end) = put(out, key);
    if let Some(arg) = arg {
        out.push(b' ');
        out.extend_from_slice(num.format(arg).as_bytes());
    }
    Shape {
        kind: Kind::Write { cas: false },
        key_at,
        key_end,
        keys: 1,
    }
}

/// A server-wide command every backend takes: `head` (its name, a space), then `arg`.
fn compose_server(
    kind: Kind,
    head: &[u8],
    arg: i64,
    out: &mut Vec<u8>,
    num: &mut itoa::Buffer,
) -> Shape {
    out.extend_from_slice(head);
    out.extend_from_slice(num.format(arg).as_bytes());
    Shape {
        kind,
        keys: 0,
        ..Shape::OTHER
    }
}

/// A meta command: `COMMAND KEY [BYTES] FLAGS`, then an `ms`'s data.
fn compose_meta(
    command: MetaCommand,
    key: MetaKey<'_>,
    flags: &MetaFlags<'_>,
    data: &[u8],
    out: &mut Vec<u8>,
    num: &mut itoa::Buffer,
) -> Shape {
    out.extend_from_slice(command.name());
    out.push(b' ');
    let (key_at, key_end) = put(out, key.raw());
    if command == MetaCommand::Set {
        out.push(b' ');
        out.extend_from_slice(num.format(data.len()).as_bytes());
    }
    if !flags.text().is_empty() {
        out.push(b' ');
        out.extend_from_slice(flags.text());
    }
    if command == MetaCommand::Set {
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(data);
    }
    Shape {
        kind: Kind::Meta(MetaShape::of(command, &key, flags)),
        key_at,
        key_end,
        keys: 1,
    }
}

/// Appends `key` to `out`; returns where it lies.
fn put(out: &mut Vec<u8>, key: &[u8]) -> (usize, usize) {
    let at = out.len();
    out.extend_from_slice(key);
    (at, out.len())
}

/// Writes `delete KEY` (a key's stale value dropped on its backends) and returns its shape.
pub fn compose_delete(key: &[u8], out: &mut Vec<u8>) -> Shape {
    out.extend_from_slice(b"delete ");
    let key_at = out.len();
    out.extend_from_slice(key);
    let shape = Shape {
        kind: Kind::Write { cas: false },
        key_at,
        key_end: out.len(),
        keys: 1,
    };
    out.extend_from_slice(b"\r\n");
    shape
}

#[cfg(test)]
mod tests {
    use kvlab_protocol::{parse, Limits, Parsed};

    use super::*;

    /// Parses `line`, composes it, and returns what would be forwarded.
    fn forwarded(line: &[u8]) -> String {
        let Parsed::Request { request, .. } = parse(line, &Limits::default()) else {
            panic!("{line:?} does not parse")
        };
        let mut out = Vec::new();
        compose(&request, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn requests_are_forwarded_in_their_own_form_without_noreply() {
        for (sent, forwarded_as) in [
            ("get a  b\r\n", "get a  b\r\n"),
            ("gats -1 a\r\n", "gats -1 a\r\n"),
            ("set k 5 100 2 noreply\r\nhi\r\n", "set k 5 100 2\r\nhi\r\n"),
            ("cas k 0 0 1 77\r\nx\r\n", "cas k 0 0 1 77\r\nx\r\n"),
            (
                "incr n 18446744073709551615\r\n",
                "incr n 18446744073709551615\r\n",
            ),
            ("delete k noreply\r\n", "delete k\r\n"),
            ("touch k -5\r\n", "touch k -5\r\n"),
            ("flush_all\r\n", "flush_all 0\r\n"),
            ("ms a2V5 2 b T5 q\r\nhi\r\n", "ms a2V5 2 b T5 q\r\nhi\r\n"),
            ("mg k v f Oab\r\n", "mg k v f Oab\r\n"),
            ("md k\r\n", "md k\r\n"),
        ] {
            assert_eq!(forwarded(sent.as_bytes()), forwarded_as, "{sent:?}");
        }
    }

    /// What the workers once parsed out of the forwarded bytes, as a shape: the shape noted
    /// while composing must say the same.
    fn reparsed(bytes: &[u8]) -> (Kind, Vec<Vec<u8>>) {
        let Parsed::Request { request, .. } = parse(bytes, &Limits::default()) else {
            panic!("{bytes:?} does not parse again")
        };
        let mut keys = Vec::new();
        request.keys().for_each(|k| keys.push(k.to_vec()));
        let kind = match request {
            Request::Get { cas, .. } => Kind::Get { cas, exptime: None },
            Request::Gat { exptime, cas, .. } => Kind::Get {
                cas,
                exptime: Some(exptime),
            },
            Request::Store { command, .. } => Kind::Write {
                cas: command == StoreCommand::Cas,
            },
            Request::Arith { .. } | Request::Delete { .. } | Request::Touch { .. } => {
                Kind::Write { cas: false }
            }
            Request::FlushAll { .. } => Kind::FlushAll,
            Request::SlabsAutomove { .. } => Kind::Setting,
            Request::Meta {
                command,
                key,
                flags,
                ..
            } => Kind::Meta(MetaShape::of(command, &key, &flags)),
            Request::Verbosity { .. }
            | Request::Cluster { .. }
            | Request::Version
            | Request::Quit
            | Request::Stats { .. }
            | Request::Admin(_) => Kind::Other,
        };
        (kind, keys)
    }

    #[test]
    fn the_shape_says_what_parsing_the_forwarded_bytes_again_would() {
        for sent in [
            "get a  b\r\n",
            "get k\r\n",
            "gets  a b c \r\n",
            "gat 10 a b\r\n",
            "gats -1 a\r\n",
            "set k 5 100 2 noreply\r\nhi\r\n",
            "append k 0 0 2\r\nhi\r\n",
            "cas k 0 0 1 77\r\nx\r\n",
            "incr n 18446744073709551615\r\n",
            "decr n 1 noreply\r\n",
            "delete k noreply\r\n",
            "touch k -5\r\n",
            "flush_all\r\n",
            "flush_all 10 noreply\r\n",
            "slabs automove 1\r\n",
            "ms a2V5 2 b T5 q\r\nhi\r\n",
            "ms k 2 C99\r\nhi\r\n",
            "mg k v f Oab\r\n",
            "mg k c v\r\n",
            "mg k N30 v\r\n",
            "mg k h l\r\n",
            "mg k R10 t\r\n",
            "mg a2V5 b v\r\n",
            "md k q C5\r\n",
            "ma k D2\r\n",
            "me k\r\n",
        ] {
            let Parsed::Request { request, .. } = parse(sent.as_bytes(), &Limits::default()) else {
                panic!("{sent:?} does not parse")
            };
            let mut out = b"earlier bytes".to_vec();
            let start = out.len();
            let shape = compose(&request, &mut out);
            let (kind, keys) = reparsed(&out[start..]);
            assert_eq!(shape.kind, kind, "{sent:?}");
            let mut got = Vec::new();
            match kind {
                Kind::Get { .. } => got.extend(shape.keys(&out).map(<[u8]>::to_vec)),
                Kind::Write { .. } | Kind::Meta(_) => {
                    got.push(shape.with_key(&out, <[u8]>::to_vec))
                }
                _ => {}
            }
            assert_eq!(got, keys, "{sent:?}");
            assert_eq!(shape.keys as usize, keys.len(), "{sent:?}");
        }
        // A base64 meta key is routed by its decoding, forwarded as sent.
        let Parsed::Request { request, .. } = parse(b"mg a2V5 b v\r\n", &Limits::default()) else {
            panic!()
        };
        let mut out = Vec::new();
        let shape = compose(&request, &mut out);
        assert_eq!(shape.raw_key(&out), b"a2V5");
        assert_eq!(shape.with_key(&out, <[u8]>::to_vec), b"key");
        // A stale value dropped after a refused set.
        let mut out = Vec::new();
        let shape = compose_delete(b"k1", &mut out);
        assert_eq!(out, b"delete k1\r\n");
        assert_eq!(reparsed(&out), (shape.kind, vec![b"k1".to_vec()]));
        assert_eq!(shape.raw_key(&out), b"k1");
    }
}
