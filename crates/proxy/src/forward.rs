//! A request as the proxy forwards it to a backend: its own wire form, re-composed from the
//! parsed fields, without `noreply` (the proxy drops the reply instead, so that every request
//! a backend gets has a reply to wait for). Used by the network stage (what it queues) and
//! by the workers (a `cas` followed up on the other replicas as a `set`).

use kvlab_protocol::request::StoreCommand;
use kvlab_protocol::{MetaCommand, Request};

/// Writes `req` as it is forwarded: its own wire form, minus `noreply`.
pub fn compose(req: &Request<'_>, out: &mut Vec<u8>) {
    let mut num = itoa::Buffer::new();
    match *req {
        Request::Get { keys, cas } => {
            out.extend_from_slice(if cas { b"gets " } else { b"get " });
            out.extend_from_slice(keys.text());
        }
        Request::Gat { exptime, keys, cas } => {
            out.extend_from_slice(if cas { b"gats " } else { b"gat " });
            out.extend_from_slice(num.format(exptime).as_bytes());
            out.push(b' ');
            out.extend_from_slice(keys.text());
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
            out.extend_from_slice(command.name());
            out.push(b' ');
            out.extend_from_slice(key);
            out.push(b' ');
            out.extend_from_slice(num.format(flags).as_bytes());
            out.push(b' ');
            out.extend_from_slice(num.format(exptime).as_bytes());
            out.push(b' ');
            out.extend_from_slice(num.format(data.len()).as_bytes());
            if command == StoreCommand::Cas {
                out.push(b' ');
                out.extend_from_slice(num.format(cas_unique).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(data);
        }
        Request::Arith {
            incr, key, delta, ..
        } => {
            out.extend_from_slice(if incr { b"incr " } else { b"decr " });
            out.extend_from_slice(key);
            out.push(b' ');
            out.extend_from_slice(num.format(delta).as_bytes());
        }
        Request::Delete { key, .. } => {
            out.extend_from_slice(b"delete ");
            out.extend_from_slice(key);
        }
        Request::Touch { key, exptime, .. } => {
            out.extend_from_slice(b"touch ");
            out.extend_from_slice(key);
            out.push(b' ');
            out.extend_from_slice(num.format(exptime).as_bytes());
        }
        Request::SlabsAutomove { mode } => {
            out.extend_from_slice(b"slabs automove ");
            out.extend_from_slice(num.format(mode).as_bytes());
        }
        Request::FlushAll { delay, .. } => {
            out.extend_from_slice(b"flush_all ");
            out.extend_from_slice(num.format(delay).as_bytes());
        }
        Request::Meta {
            command,
            key,
            flags,
            data,
        } => {
            out.extend_from_slice(command.name());
            out.push(b' ');
            out.extend_from_slice(key.raw());
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
        }
        Request::Verbosity { .. }
        | Request::Version
        | Request::Quit
        | Request::Stats { .. }
        | Request::Admin(_)
        | Request::Cluster { .. } => {}
    }
    out.extend_from_slice(b"\r\n");
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
}
