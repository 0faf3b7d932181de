//! The client side of kvlab's REST interface (`kvlab server --http-port`): compose HTTP/1.1
//! requests, parse responses incrementally.
//!
//! The same shape as the memcached side in `kvlab_protocol::client`: requests are appended to
//! a caller-owned output buffer (one `write` per pipelined batch, no allocation per request),
//! and [`parse_response`] looks at the start of the input buffer and answers either one
//! complete response (status, body borrowed from the buffer, bytes used) or
//! [`ParsedResponse::Incomplete`] — the ordinary outcome of a partial read, not an error.
//!
//! The endpoints: `GET /key/{k}` (sent with `Accept: application/octet-stream`, so a hit's
//! body is the value's raw bytes, binary-safe, no JSON to decode), `PUT /key/{k}[?ttl=S]` with
//! the value as the body, `DELETE /key/{k}`. A miss is `404`. Keys are percent-encoded: every
//! byte outside RFC 3986's unreserved set and a few safe sub-delimiters becomes `%XX`, so any
//! memcached key (including `/`, `%`, `?`, `#` and non-ASCII bytes) names exactly itself.
//!
//! Responses are framed by `Content-Length`, `Transfer-Encoding: chunked` (the body is then
//! skipped, not returned: kvlab's server never chunks a value), or no body (`HEAD`, 1xx,
//! 204, 304). Interim 1xx responses are reported like any other so that the caller can skip
//! them. The parser bounds what it waits for: a header block longer than [`MAX_HEAD_LEN`] or a
//! body larger than [`MAX_BODY_LEN`] is an error, never an unbounded buffer.

use memchr::{memchr, memmem};
use thiserror::Error;

/// Longest status line plus headers we wait for, in bytes.
pub const MAX_HEAD_LEN: usize = 16 * 1024;

/// Largest body we accept, in bytes.
pub const MAX_BODY_LEN: usize = 1 << 30;

/// Why response bytes are not a valid HTTP/1.1 response; the stream is then out of step.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HttpError {
    /// The status line is not `HTTP/1.x NNN reason`.
    #[error("bad status line {0:?}")]
    StatusLine(String),
    /// A header line without a colon, or with bytes HTTP does not allow.
    #[error("bad header line {0:?}")]
    Header(String),
    /// `Content-Length` is not a number, or appears twice with different values.
    #[error("bad Content-Length {0:?}")]
    ContentLength(String),
    /// A chunk size line that is not hexadecimal, or a chunk not followed by CRLF.
    #[error("bad chunked encoding: {0}")]
    Chunked(String),
    /// The head (status line and headers) is longer than [`MAX_HEAD_LEN`].
    #[error("response head longer than {MAX_HEAD_LEN} bytes")]
    HeadTooLong,
    /// The body is larger than [`MAX_BODY_LEN`].
    #[error("response body of {0} bytes exceeds the limit")]
    BodyTooLarge(u64),
}

/// One complete response, borrowing from the input buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response<'a> {
    /// The status code.
    pub status: u16,
    /// The body (`Content-Length` framing); empty for a chunked body, which is skipped.
    pub body: &'a [u8],
    /// The server said `Connection: close` (or spoke HTTP/1.0 without keep-alive).
    pub close: bool,
}

/// The outcome of [`parse_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedResponse<'a> {
    /// One response and the number of input bytes it used.
    Complete {
        /// The response.
        response: Response<'a>,
        /// Bytes consumed from the start of the input.
        len: usize,
    },
    /// The input holds only a prefix of a response: read more and call again.
    Incomplete,
}

/// How the body of the response to a request is framed: a response to `HEAD` has none
/// whatever its headers say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `HEAD`
    Head,
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(100)]).into_owned()
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t' | b'\r'] = s {
        s = rest;
    }
    s
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    kvlab_protocol::client::parse_u64(s)
}

/// Parses the response at the start of `buf` to a request of `method`.
pub fn parse_response(buf: &[u8], method: Method) -> Result<ParsedResponse<'_>, HttpError> {
    // The head ends at the first empty line.
    let Some(head_end) = memmem::find(&buf[..buf.len().min(MAX_HEAD_LEN + 4)], b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD_LEN + 3 {
            return Err(HttpError::HeadTooLong);
        }
        // A malformed status line is reported as soon as it is visible, not after 16 KiB.
        if let Some(nl) = memchr(b'\n', buf) {
            check_status_line(&buf[..nl])?;
        } else {
            check_status_prefix(buf)?;
        }
        return Ok(ParsedResponse::Incomplete);
    };
    let head = &buf[..head_end];
    let body_start = head_end + 4;
    let mut lines = head.split(|&b| b == b'\n');
    let status_line = lines.next().unwrap_or(b"");
    let (minor, status) = check_status_line(status_line)?;
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    // HTTP/1.0 closes unless it asks to keep alive; HTTP/1.1 keeps alive unless it says close.
    let mut close = minor == 0;
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr(b':', line) else {
            return Err(HttpError::Header(lossy(line)));
        };
        let name = &line[..colon];
        if name.is_empty() || name.iter().any(|&b| b <= b' ' || b == 0x7f) {
            return Err(HttpError::Header(lossy(line)));
        }
        let value = trim(&line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_dec(value).ok_or_else(|| HttpError::ContentLength(lossy(value)))?;
            if content_length.is_some_and(|m| m != n) {
                return Err(HttpError::ContentLength(lossy(value)));
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = value
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for t in value.split(|&b| b == b',') {
                let t = trim(t);
                if t.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if t.eq_ignore_ascii_case(b"keep-alive") {
                    close = false;
                }
            }
        }
    }
    let no_body =
        method == Method::Head || (100..200).contains(&status) || status == 204 || status == 304;
    fn complete(status: u16, body: &[u8], close: bool, len: usize) -> ParsedResponse<'_> {
        ParsedResponse::Complete {
            response: Response {
                status,
                body,
                close,
            },
            len,
        }
    }
    if no_body {
        return Ok(complete(status, &[], close, body_start));
    }
    if chunked {
        // Chunked takes precedence over Content-Length (RFC 9112 §6.3).
        return match skip_chunked(buf, body_start)? {
            Some(end) => Ok(complete(status, &[], close, end)),
            None => Ok(ParsedResponse::Incomplete),
        };
    }
    let Some(n) = content_length else {
        // Neither: the body runs to the end of the connection. We never wait for that;
        // kvlab's server always frames its bodies.
        return Err(HttpError::ContentLength("missing".into()));
    };
    if n > MAX_BODY_LEN as u64 {
        return Err(HttpError::BodyTooLarge(n));
    }
    // Cannot truncate: n <= MAX_BODY_LEN.
    let end = body_start + n as usize;
    if buf.len() < end {
        return Ok(ParsedResponse::Incomplete);
    }
    Ok(complete(status, &buf[body_start..end], close, end))
}

/// Checks what can be checked of a status line that has not ended yet.
fn check_status_prefix(buf: &[u8]) -> Result<(), HttpError> {
    let want = b"HTTP/1.";
    let n = buf.len().min(want.len());
    if buf[..n] != want[..n] {
        return Err(HttpError::StatusLine(lossy(buf)));
    }
    Ok(())
}

/// `HTTP/1.x NNN reason` → (x, NNN).
fn check_status_line(line: &[u8]) -> Result<(u8, u16), HttpError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let bad = || HttpError::StatusLine(lossy(line));
    let rest = line.strip_prefix(b"HTTP/1.").ok_or_else(bad)?;
    let (&minor, rest) = rest.split_first().ok_or_else(bad)?;
    if !(minor == b'0' || minor == b'1') {
        return Err(bad());
    }
    let rest = rest.strip_prefix(b" ").ok_or_else(bad)?;
    if rest.len() < 3 || rest.len() > 3 && rest[3] != b' ' {
        return Err(bad());
    }
    let code = &rest[..3];
    if !code.iter().all(u8::is_ascii_digit) || code[0] == b'0' {
        return Err(bad());
    }
    let status = code.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    Ok((minor - b'0', status))
}

/// The end of a chunked body starting at `at`, or `None` when not all of it is here.
fn skip_chunked(buf: &[u8], mut at: usize) -> Result<Option<usize>, HttpError> {
    let mut total: u64 = 0;
    loop {
        let Some(nl) = memchr(b'\n', &buf[at..]) else {
            if buf.len() - at > 1024 {
                return Err(HttpError::Chunked("chunk size line too long".into()));
            }
            return Ok(None);
        };
        let line = &buf[at..at + nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        // Chunk extensions after ';' are ignored.
        let size = trim(line.split(|&b| b == b';').next().unwrap_or(b""));
        if size.is_empty() || size.len() > 15 {
            return Err(HttpError::Chunked(format!("size line {:?}", lossy(line))));
        }
        let mut n: u64 = 0;
        for &b in size {
            let d = (b as char)
                .to_digit(16)
                .ok_or_else(|| HttpError::Chunked(format!("size line {:?}", lossy(line))))?;
            n = n * 16 + u64::from(d);
        }
        at += nl + 1;
        if n == 0 {
            // Trailers, then an empty line.
            loop {
                let Some(nl) = memchr(b'\n', &buf[at..]) else {
                    return Ok(None);
                };
                let empty = nl == 0 || (nl == 1 && buf[at] == b'\r');
                at += nl + 1;
                if empty {
                    return Ok(Some(at));
                }
            }
        }
        total += n;
        if total > MAX_BODY_LEN as u64 {
            return Err(HttpError::BodyTooLarge(total));
        }
        // Cannot truncate: n <= total <= MAX_BODY_LEN.
        let end = at + n as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(HttpError::Chunked("chunk not followed by CRLF".into()));
        }
        at = end + 2;
    }
}

/// True for bytes written as themselves in a key's path segment: RFC 3986 unreserved
/// characters and the sub-delimiters and `:`/`@` allowed in a segment — except `+`, `&`, `=`
/// and `;`, which some servers and proxies treat specially, and `%`, which starts an escape.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b','
                | b':'
                | b'@'
        )
}

/// Appends `key` percent-encoded as one path segment.
pub fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    // "." and ".." are path navigation to normalising servers: escape them.
    if key == b"." || key == b".." {
        for _ in key {
            out.extend_from_slice(b"%2E");
        }
        return;
    }
    for &b in key {
        if plain(b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    kvlab_protocol::client::push_u64(out, n);
}

/// Appends `GET /key/{k}`, asking for the raw value (`Accept: application/octet-stream`).
/// `host` is the `Host` header's value (HTTP/1.1 requires one).
pub fn get(out: &mut Vec<u8>, host: &[u8], key: &[u8]) {
    out.extend_from_slice(b"GET /key/");
    push_key(out, key);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\nAccept: application/octet-stream\r\n\r\n");
}

/// Appends the head of `PUT /key/{k}[?ttl=S]` for a body of `len` bytes; the caller then
/// appends exactly `len` bytes (nothing else ends the request).
pub fn put_header(out: &mut Vec<u8>, host: &[u8], key: &[u8], ttl: u32, len: usize) {
    out.extend_from_slice(b"PUT /key/");
    push_key(out, key);
    if ttl > 0 {
        out.extend_from_slice(b"?ttl=");
        push_u64(out, u64::from(ttl));
    }
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\nContent-Length: ");
    push_u64(out, len as u64);
    out.extend_from_slice(b"\r\n\r\n");
}

/// Appends a whole `PUT /key/{k}` with `value` as the body.
pub fn put(out: &mut Vec<u8>, host: &[u8], key: &[u8], ttl: u32, value: &[u8]) {
    put_header(out, host, key, ttl, value.len());
    out.extend_from_slice(value);
}

/// Appends `DELETE /key/{k}`.
pub fn delete(out: &mut Vec<u8>, host: &[u8], key: &[u8]) {
    out.extend_from_slice(b"DELETE /key/");
    push_key(out, key);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\n\r\n");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn complete(buf: &[u8], m: Method) -> (Response<'_>, usize) {
        match parse_response(buf, m).unwrap() {
            ParsedResponse::Complete { response, len } => (response, len),
            ParsedResponse::Incomplete => panic!("incomplete: {:?}", String::from_utf8_lossy(buf)),
        }
    }

    #[test]
    fn composes_requests_with_encoded_keys() {
        let mut out = Vec::new();
        get(&mut out, b"h:1", b"key:1xx");
        put(&mut out, b"h:1", b"a/b c%", 30, b"v\r\n");
        delete(&mut out, b"h:1", &[0xff, b'?', b'#', b'+']);
        push_key(&mut out, b"..");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /key/key:1xx HTTP/1.1\r\nHost: h:1\r\nAccept: application/octet-stream\r\n\r\n\
PUT /key/a%2Fb%20c%25?ttl=30 HTTP/1.1\r\nHost: h:1\r\nContent-Type: application/octet-stream\r\nContent-Length: 3\r\n\r\nv\r\n\
DELETE /key/%FF%3F%23%2B HTTP/1.1\r\nHost: h:1\r\n\r\n%2E%2E"
        );
    }

    #[test]
    fn parses_framings() {
        let (r, len) = complete(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nContent-Type: x\r\n\r\nhelloHTTP/1.1",
            Method::Get,
        );
        assert_eq!(
            (r.status, r.body, r.close, len),
            (200, &b"hello"[..], false, 60)
        );
        let (r, _) = complete(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            Method::Get,
        );
        assert_eq!((r.status, r.close), (404, true));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: 1\r\n\r\n";
        let (r, len) = complete(chunked, Method::Get);
        assert_eq!((r.status, r.body, len), (200, &b""[..], chunked.len()));
        let (r, len) = complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            Method::Head,
        );
        assert_eq!((r.status, len), (200, 38));
        let (r, _) = complete(b"HTTP/1.1 204 No Content\r\n\r\n", Method::Delete);
        assert_eq!(r.status, 204);
        let (r, _) = complete(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", Method::Get);
        assert!(r.close);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = |b: &[u8]| parse_response(b, Method::Get).unwrap_err();
        assert!(matches!(e(b"STORED\r\n"), HttpError::StatusLine(_)));
        assert!(matches!(e(b"HTTX"), HttpError::StatusLine(_)));
        assert!(matches!(
            e(b"HTTP/1.1 2x0 OK\r\n"),
            HttpError::StatusLine(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            HttpError::ContentLength(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            HttpError::ContentLength(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"),
            HttpError::Header(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\n\r\n"),
            HttpError::ContentLength(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n"),
            HttpError::BodyTooLarge(_)
        ));
        assert!(matches!(
            e(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            HttpError::Chunked(_)
        ));
        let mut long = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        long.resize(MAX_HEAD_LEN + 10, b'a');
        assert_eq!(
            parse_response(&long, Method::Get),
            Err(HttpError::HeadTooLong)
        );
    }
}
