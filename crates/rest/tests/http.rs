//! The REST interface (`--http-port`) through a real HTTP client (`ureq`) and raw sockets:
//! every endpoint and error case, binary values, percent-encoded keys, oversize bodies,
//! keep-alive and pipelining, data shared with the memcached port, `largest` eviction, and
//! shutdown by admin token.

#[path = "../../server/tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use kvlab_server::{Server, ServerConfig};
use kvlab_store::{ManualClock, Policy};
use serde_json::Value as Json;
use ureq::http::{Method, Request};

const TOKEN: &str = "s3cret-token";

/// A server with the REST interface on a free port and an admin token.
fn start_http(tweak: impl FnOnce(&mut ServerConfig)) -> (Server, std::sync::Arc<ManualClock>) {
    start(ServerConfig::default().io, |c| {
        let mut rest = kvlab_rest::Rest::on(SocketAddr::from(([127, 0, 0, 1], 0)));
        rest.admin_token = Some(TOKEN.into());
        c.front_ends = vec![std::sync::Arc::new(rest)];
        tweak(c);
    })
}

fn base(server: &Server) -> String {
    format!(
        "http://{}",
        kvlab_rest::rest_addr(server).expect("http enabled")
    )
}

/// An agent that returns 4xx/5xx as responses rather than errors.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

struct Reply {
    status: u16,
    headers: ureq::http::HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Json {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {} body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .expect("ascii header")
    }

    /// Asserts an error status with the JSON error body.
    fn assert_error(&self, status: u16) -> Json {
        assert_eq!(
            self.status,
            status,
            "body {:?}",
            String::from_utf8_lossy(&self.body)
        );
        assert!(
            self.header("content-type").starts_with("application/json"),
            "{:?}",
            self.headers
        );
        let j = self.json();
        assert!(j["error"].is_string(), "{j}");
        assert_eq!(j["status"], status);
        j
    }
}

fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut b = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("method"))
        .uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = if body.is_empty() && method != "PUT" && method != "POST" {
        agent.run(b.body(()).expect("request"))
    } else {
        agent.run(b.body(body.to_vec()).expect("request"))
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .with_config()
        .limit(64 << 20)
        .read_to_vec()
        .expect("body");
    Reply {
        status,
        headers,
        body,
    }
}

fn get(a: &ureq::Agent, url: &str) -> Reply {
    send(a, "GET", url, &[], b"")
}

fn put(a: &ureq::Agent, url: &str, body: &[u8]) -> Reply {
    send(a, "PUT", url, &[], body)
}

/// Percent-encodes every byte outside the unreserved set.
fn enc(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

// ---- raw HTTP/1.1 over a socket, for keep-alive, pipelining and malformed input ----------

struct RawReply {
    status: u16,
    head: String,
    body: Vec<u8>,
}

impl RawReply {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Reads one response (Content-Length or chunked body; none for HEAD) from `s`, keeping
/// bytes of the next response in `buf`.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>, head_request: bool) -> RawReply {
    fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) {
        let mut chunk = [0u8; 64 * 1024];
        let n = s.read(&mut chunk).expect("read reply");
        assert!(
            n > 0,
            "connection closed mid-reply; have {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        fill(s, buf);
    };
    let head = String::from_utf8(buf[..end].to_vec()).expect("ascii head");
    buf.drain(..end + 4);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let mut reply = RawReply {
        status,
        head,
        body: Vec::new(),
    };
    if head_request {
        return reply;
    }
    if let Some(n) = reply.header("content-length") {
        let n: usize = n.parse().expect("content-length");
        while buf.len() < n {
            fill(s, buf);
        }
        reply.body = buf.drain(..n).collect();
    } else if reply
        .header("transfer-encoding")
        .is_some_and(|t| t.eq_ignore_ascii_case("chunked"))
    {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                fill(s, buf);
            };
            let size = usize::from_str_radix(
                std::str::from_utf8(&buf[..line_end]).expect("chunk size"),
                16,
            )
            .expect("chunk size");
            buf.drain(..line_end + 2);
            while buf.len() < size + 2 {
                fill(s, buf);
            }
            reply.body.extend(buf.drain(..size));
            buf.drain(..2);
            if size == 0 {
                break;
            }
        }
    }
    reply
}

/// The server still answers a well-formed request.
fn assert_alive(server: &Server) {
    let r = get(&agent(), &format!("{}/stats", base(server)));
    assert_eq!(r.status, 200);
    let mut mc = connect(server.addr());
    assert_eq!(
        exchange(&mut mc, b"version\r\n", b"\r\n")[..8],
        *b"VERSION "
    );
}

// ---- the endpoints ---------------------------------------------------------------------------

#[test]
fn put_get_delete_round_trip_with_status_codes() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);

    let r = put(&a, &format!("{b}/key/greeting/hello"), b"");
    assert_eq!(r.status, 201, "created");
    assert_eq!(r.json()["key"], "greeting");
    assert_eq!(r.json()["created"], true);
    let r = put(&a, &format!("{b}/key/greeting/hello%20world"), b"");
    assert_eq!(r.status, 200, "replaced");
    assert_eq!(r.json()["created"], false);

    let r = get(&a, &format!("{b}/key/greeting"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").starts_with("application/json"));
    let j = r.json();
    assert_eq!(j["key"], "greeting");
    assert_eq!(j["value"], "hello world");
    assert_eq!(j["flags"], 0);
    assert!(j.get("encoding").is_none());

    // A body value, with flags.
    let r = put(
        &a,
        &format!("{b}/key/greeting?flags=42"),
        b"{\"json\": true}",
    );
    assert_eq!(r.status, 200);
    let j = get(&a, &format!("{b}/key/greeting")).json();
    assert_eq!(j["value"], "{\"json\": true}");
    assert_eq!(j["flags"], 42);

    let r = send(&a, "DELETE", &format!("{b}/key/greeting"), &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["deleted"], true);
    send(&a, "DELETE", &format!("{b}/key/greeting"), &[], b"").assert_error(404);
    get(&a, &format!("{b}/key/greeting")).assert_error(404);

    // An empty body stores an empty value.
    assert_eq!(put(&a, &format!("{b}/key/empty"), b"").status, 201);
    assert_eq!(get(&a, &format!("{b}/key/empty")).json()["value"], "");
}

#[test]
fn binary_values_round_trip_as_base64_and_raw_bytes() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    let value: Vec<u8> = (0..=255u8).chain([0xff, 0xfe, 0, 0x80]).collect();
    assert_eq!(put(&a, &format!("{b}/key/bin"), &value).status, 201);

    let j = get(&a, &format!("{b}/key/bin")).json();
    assert_eq!(j["encoding"], "base64");
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(j["value"].as_str().expect("string"))
        .expect("base64");
    assert_eq!(decoded, value);

    let r = send(
        &a,
        "GET",
        &format!("{b}/key/bin"),
        &[("accept", "application/octet-stream")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), "application/octet-stream");
    assert_eq!(r.body, value);

    // Binary through the path form too.
    assert_eq!(
        put(&a, &format!("{b}/key/bin2/{}", enc(&value)), b"").status,
        201
    );
    let r = send(
        &a,
        "GET",
        &format!("{b}/key/bin2"),
        &[("accept", "application/octet-stream")],
        b"",
    );
    assert_eq!(r.body, value);

    // And the memcached port sees the same bytes.
    let mut mc = connect(server.addr());
    let mut want = format!("VALUE bin 0 {}\r\n", value.len()).into_bytes();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(exchange(&mut mc, b"get bin\r\n", b"END\r\n"), want);
}

#[test]
fn keys_needing_percent_encoding() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    // '/', '?', '#', '%', non-ASCII: all legal memcached key bytes.
    let key = "a/b?ü%#";
    let url = format!("{b}/key/{}", enc(key.as_bytes()));
    assert_eq!(put(&a, &url, b"v1").status, 201);
    let j = get(&a, &url).json();
    assert_eq!(j["key"], key);
    assert_eq!(j["value"], "v1");
    // The memcached port reads the same (decoded) key.
    let mut mc = connect(server.addr());
    let got = exchange(&mut mc, format!("get {key}\r\n").as_bytes(), b"END\r\n");
    assert_eq!(
        got,
        format!("VALUE {key} 0 2\r\nv1\r\nEND\r\n").into_bytes()
    );

    // A key that is not UTF-8 is legal too; JSON reports it in base64.
    let url = format!("{b}/key/%FF%FE");
    assert_eq!(put(&a, &url, b"x").status, 201);
    let j = get(&a, &url).json();
    assert_eq!(j["key"], "//4=");
    assert_eq!(j["key_encoding"], "base64");

    // memcached's key rules: a space ("a b/ü%" encoded), a control byte, or > 250 bytes is 400.
    for bad in [
        enc("a b/ü%".as_bytes()),
        "a%0Ab".into(),
        "x".repeat(251),
        "%7F".into(),
    ] {
        for method in ["GET", "PUT", "DELETE"] {
            let j = send(&a, method, &format!("{b}/key/{bad}"), &[], b"v").assert_error(400);
            assert!(j["error"].as_str().unwrap_or("").contains("key"), "{j}");
        }
        let r = send(&a, "HEAD", &format!("{b}/key/{bad}"), &[], b"");
        assert_eq!(r.status, 400);
    }
    // 250 bytes is fine.
    assert_eq!(
        put(&a, &format!("{b}/key/{}/v", "k".repeat(250)), b"").status,
        201
    );
    // Bad percent-encoding: 400, in the key or the value.
    for path in ["/key/%zz", "/key/abc%", "/key/a%2", "/key/ok/%g0"] {
        put(&a, &format!("{b}{path}"), b"").assert_error(400);
    }
    // No key at all.
    get(&a, &format!("{b}/key/")).assert_error(400);
    put(&a, &format!("{b}/key/"), b"v").assert_error(400);
}

#[test]
fn ttl_flags_and_query_errors() {
    let (server, clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    assert_eq!(put(&a, &format!("{b}/key/short?ttl=100"), b"v").status, 201);
    assert_eq!(
        put(&a, &format!("{b}/key/forever?ttl=0&flags=7"), b"v").status,
        201
    );
    assert_eq!(get(&a, &format!("{b}/key/short")).status, 200);
    clock.advance(101);
    get(&a, &format!("{b}/key/short")).assert_error(404);
    let j = get(&a, &format!("{b}/key/forever")).json();
    assert_eq!(j["flags"], 7);
    // Negative: stored already expired, as memcached does.
    put(&a, &format!("{b}/key/gone?ttl=-1"), b"v");
    get(&a, &format!("{b}/key/gone")).assert_error(404);

    for q in [
        "ttl=abc",
        "ttl=",
        "ttl=1.5",
        "flags=-1",
        "flags=4294967296",
        "colour=red",
    ] {
        put(&a, &format!("{b}/key/k?{q}"), b"v").assert_error(400);
        put(&a, &format!("{b}/key/k/v?{q}"), b"").assert_error(400);
    }
    get(&a, &format!("{b}/key/k")).assert_error(404);
}

#[test]
fn oversize_values_are_413_and_the_connection_survives() {
    let item_max = 64 * 1024;
    let (server, _clock) = start_http(|c| c.item_size_max = item_max);
    let a = agent();
    let b = base(&server);
    let key = "big";
    let fits = item_max - key.len() - kvlab_store::ITEM_OVERHEAD;
    assert_eq!(
        put(&a, &format!("{b}/key/{key}"), &vec![b'a'; fits]).status,
        201
    );
    // Over the item limit (key + value + overhead) but not the body limit.
    let j = put(&a, &format!("{b}/key/{key}"), &vec![b'b'; fits + 1]).assert_error(413);
    assert!(j["error"].as_str().unwrap_or("").contains("limit"), "{j}");
    // Over the body limit: refused from Content-Length, body discarded.
    put(&a, &format!("{b}/key/{key}"), &vec![b'c'; item_max + 1]).assert_error(413);
    put(&a, &format!("{b}/key/{key}"), &vec![b'c'; 3 * item_max]).assert_error(413);
    // Too large through the path form.
    put(&a, &format!("{b}/key/{key}/{}", "d".repeat(fits + 1)), b"").assert_error(413);
    // The old value stays.
    let r = send(
        &a,
        "GET",
        &format!("{b}/key/{key}"),
        &[("accept", "application/octet-stream")],
        b"",
    );
    assert_eq!(r.body, vec![b'a'; fits]);

    // Chunked (no Content-Length): refused while streaming; the connection stays usable.
    let http = kvlab_rest::rest_addr(&server).expect("http");
    let mut s = raw_connect(http);
    let mut req =
        b"PUT /key/chunky HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        req.extend_from_slice(format!("{:x}\r\n", 32 * 1024).as_bytes());
        req.extend_from_slice(&vec![b'e'; 32 * 1024]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\nGET /key/chunky HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(&req).expect("write");
    let mut buf = Vec::new();
    let r = read_reply(&mut s, &mut buf, false);
    assert_eq!(r.status, 413, "{}", r.head);
    assert!(
        r.body.starts_with(b"{"),
        "{:?}",
        String::from_utf8_lossy(&r.body)
    );
    let r = read_reply(&mut s, &mut buf, false);
    assert_eq!(
        r.status, 404,
        "the next request on the connection is answered"
    );
}

/// A PUT refused for its query keeps its connection when its body comes a moment after its
/// head: the body is read and dropped, and the next request on the connection is answered
/// (a keep-alive client whose body went out after the refusal found the connection gone).
#[test]
fn a_put_refused_for_its_query_keeps_its_connection() {
    let (server, _clock) = start_http(|_| {});
    let mut s = raw_connect(kvlab_rest::rest_addr(&server).expect("http"));
    s.write_all(b"PUT /key/k?ttl=abc HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n")
        .expect("write");
    std::thread::sleep(Duration::from_millis(100));
    s.write_all(b"vGET /key/k HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut buf = Vec::new();
    let r = read_reply(&mut s, &mut buf, false);
    assert_eq!(r.status, 400, "{}", r.head);
    let r = read_reply(&mut s, &mut buf, false);
    assert_eq!(
        r.status, 404,
        "the next request on the connection is answered"
    );
}

#[test]
fn out_of_memory_without_eviction_is_507() {
    let (server, _clock) = start_http(|c| {
        c.memory_limit = 1 << 20;
        c.item_size_max = 512 * 1024;
        c.policy = Policy::None;
    });
    let a = agent();
    let b = base(&server);
    let value = vec![b'v'; 400 * 1024];
    let mut codes = Vec::new();
    for i in 0..4 {
        codes.push(put(&a, &format!("{b}/key/k{i}"), &value).status);
    }
    assert_eq!(codes[..2], [201, 201], "{codes:?}");
    put(&a, &format!("{b}/key/k9"), &value).assert_error(507);
}

#[test]
fn head_sends_headers_only() {
    let (server, _clock) = start_http(|c| c.memory_limit = 8 << 20);
    let a = agent();
    let b = base(&server);
    put(&a, &format!("{b}/key/h"), b"12345");
    for path in ["/", "/key/h"] {
        let r = send(&a, "HEAD", &format!("{b}{path}"), &[], b"");
        assert_eq!(r.status, 200, "{path}");
        assert!(r.body.is_empty());
        httpdate::parse_http_date(r.header("date")).expect("RFC 7231 date");
        assert_eq!(r.header("content-type"), "application/json");
        assert!(r.header("accept").contains("application/json"));
        assert!(r.header("accept").contains("application/octet-stream"));
        assert_eq!(r.header("http-version"), "HTTP/1.1");
        let used: u64 = r.header("space-used").parse().expect("number");
        let limit: u64 = r.header("space-limit").parse().expect("number");
        assert_eq!(limit, 8 << 20);
        assert!(used > 0 && used < limit, "{used}");
    }
    let r = send(&a, "HEAD", &format!("{b}/key/h"), &[], b"");
    assert_eq!(r.header("value-length"), "5");
    let r = send(&a, "HEAD", &format!("{b}/key/missing"), &[], b"");
    assert_eq!(r.status, 404);
    assert!(r.body.is_empty());
    // HTTP/1.0 is reported as such.
    let http = kvlab_rest::rest_addr(&server).expect("http");
    let mut s = raw_connect(http);
    s.write_all(b"HEAD / HTTP/1.0\r\n\r\n").expect("write");
    let r = read_reply(&mut s, &mut Vec::new(), true);
    assert_eq!(r.header("http-version").as_deref(), Some("HTTP/1.0"));
    // GET / has a JSON body with the same figures.
    let j = get(&a, &format!("{b}/")).json();
    assert_eq!(j["space_limit"], 8 << 20);
}

#[test]
fn stats_and_metrics() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    put(&a, &format!("{b}/key/s1/v"), b"");
    put(&a, &format!("{b}/key/s2/v"), b"");
    get(&a, &format!("{b}/key/s1"));
    get(&a, &format!("{b}/key/nope"));
    let r = get(&a, &format!("{b}/stats"));
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["curr_items"], 2);
    assert_eq!(j["get_hits"], 1);
    assert_eq!(j["get_misses"], 1);
    assert!(j["bytes"].as_u64().expect("number") > 0);
    assert!(j["limit_maxbytes"].is_u64());
    assert!(j["rusage_user"].is_number());
    assert!(j["version"].as_str().expect("string").contains("kvlab"));

    let r = get(&a, &format!("{b}/metrics"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").starts_with("text/plain"));
    let text = String::from_utf8(r.body).expect("utf8");
    assert!(
        text.contains("# TYPE kvlab_get_hits counter\nkvlab_get_hits 1\n"),
        "{text}"
    );
    assert!(text.contains("kvlab_curr_items 2\n"), "{text}");
    // A memory-only store has no disk figures.
    assert!(!text.contains("durable_"), "{text}");
    assert!(!j
        .as_object()
        .expect("object")
        .keys()
        .any(|k| k.starts_with("durable_")));
}

#[test]
fn unknown_paths_404_and_wrong_methods_405_with_allow() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    for path in ["/nope", "/keys/a", "/key", "/key/a/b/c", "/stats/x"] {
        get(&a, &format!("{b}{path}")).assert_error(404);
    }
    let cases: &[(&str, &str, &[&str])] = &[
        ("POST", "/key/a", &["GET", "HEAD", "PUT", "DELETE"]),
        ("PATCH", "/key/a", &["GET", "HEAD", "PUT", "DELETE"]),
        ("GET", "/key/a/b", &["PUT"]),
        ("DELETE", "/stats", &["GET", "HEAD"]),
        ("PUT", "/metrics", &["GET", "HEAD"]),
        ("GET", "/shutdown", &["POST"]),
        ("DELETE", "/", &["GET", "HEAD"]),
    ];
    for (method, path, allowed) in cases {
        let r = send(&a, method, &format!("{b}{path}"), &[], b"");
        r.assert_error(405);
        let allow: Vec<&str> = r.header("allow").split(',').map(str::trim).collect();
        let mut got = allow.clone();
        got.sort_unstable();
        let mut want = allowed.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{method} {path}");
    }
    // An extension method (ureq refuses to send one).
    let mut s = raw_connect(kvlab_rest::rest_addr(&server).expect("http"));
    s.write_all(b"BREW /key/a HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let r = read_reply(&mut s, &mut Vec::new(), false);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow").as_deref(), Some("GET,HEAD,PUT,DELETE"));
    let j: Json = serde_json::from_slice(&r.body).expect("JSON error body");
    assert_eq!(j["status"], 405);
}

#[test]
fn keep_alive_and_pipelining() {
    let (server, _clock) = start_http(|_| {});
    let http = kvlab_rest::rest_addr(&server).expect("http");
    // Several requests, one after another, on one connection.
    let mut s = raw_connect(http);
    let mut buf = Vec::new();
    for i in 0..5 {
        s.write_all(
            format!("PUT /key/ka{i}/v{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        )
        .expect("write");
        let r = read_reply(&mut s, &mut buf, false);
        assert_eq!(r.status, 201);
        s.write_all(format!("GET /key/ka{i} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .expect("write");
        let r = read_reply(&mut s, &mut buf, false);
        assert_eq!(r.status, 200);
        let j: Json = serde_json::from_slice(&r.body).expect("json");
        assert_eq!(j["value"], format!("v{i}"));
    }
    // Pipelined: three requests in one write; replies come back in request order.
    let mut s = raw_connect(http);
    s.write_all(
        b"PUT /key/p1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none\
          GET /key/p1 HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /key/p2 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .expect("write");
    let mut buf = Vec::new();
    let statuses: Vec<u16> = (0..3)
        .map(|_| read_reply(&mut s, &mut buf, false))
        .map(|r| r.status)
        .collect();
    assert_eq!(statuses, [201, 200, 404]);
    // A HEAD in a pipeline has no body and does not confuse the next reply.
    s.write_all(b"HEAD /key/p1 HTTP/1.1\r\nHost: x\r\n\r\nGET /key/p1 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert_eq!(read_reply(&mut s, &mut buf, true).status, 200);
    let r = read_reply(&mut s, &mut buf, false);
    assert_eq!(
        serde_json::from_slice::<Json>(&r.body).expect("json")["value"],
        "one"
    );
}

#[test]
fn both_protocols_share_one_store() {
    let (server, _clock) = start_http(|_| {});
    let a = agent();
    let b = base(&server);
    let mut mc = connect(server.addr());
    // memcached port → HTTP.
    assert_eq!(
        exchange(&mut mc, b"set from_mc 5 0 6\r\nmc\r\nok\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    let j = get(&a, &format!("{b}/key/from_mc")).json();
    assert_eq!(j["value"], "mc\r\nok");
    assert_eq!(j["flags"], 5);
    // HTTP → memcached port.
    assert_eq!(
        put(&a, &format!("{b}/key/from_http?flags=9"), b"via\0http").status,
        201
    );
    assert_eq!(
        exchange(&mut mc, b"get from_http\r\n", b"END\r\n"),
        b"VALUE from_http 9 8\r\nvia\0http\r\nEND\r\n"
    );
    // A delete on one is a miss on the other.
    assert_eq!(
        exchange(&mut mc, b"delete from_mc\r\n", b"\r\n"),
        b"DELETED\r\n"
    );
    get(&a, &format!("{b}/key/from_mc")).assert_error(404);
    send(&a, "DELETE", &format!("{b}/key/from_http"), &[], b"");
    assert_eq!(
        exchange(&mut mc, b"get from_http\r\n", b"END\r\n"),
        b"END\r\n"
    );
}

#[test]
fn largest_policy_keeps_memory_under_the_limit_and_evicts_large_values_first() {
    let limit = 2 << 20;
    let (server, _clock) = start_http(|c| {
        c.memory_limit = limit;
        c.policy = Policy::Largest;
    });
    let a = agent();
    let b = base(&server);
    // Interleave 1500 small (64 B) and 700 large (4 KiB) values: ~3 MiB in all, 1.5x the
    // limit. The store evicts per shard (and the server runs at least 64 shards), so the
    // sizes are kept small next to a shard's share of memory; there `largest` picks large
    // values, whereas LRU would lose about a third of the small ones (they are as old).
    let (n_small, n_large) = (1500, 700);
    let (mut si, mut li) = (0, 0);
    while si < n_small || li < n_large {
        if si < n_small && si * n_large <= li * n_small {
            assert_eq!(put(&a, &format!("{b}/key/s{si}"), &[b's'; 64]).status, 201);
            si += 1;
        } else {
            assert_eq!(
                put(&a, &format!("{b}/key/L{li}"), &[b'L'; 4096]).status,
                201
            );
            li += 1;
        }
        if (si + li) % 100 == 0 {
            let r = send(&a, "HEAD", &format!("{b}/"), &[], b"");
            let used: usize = r.header("space-used").parse().expect("number");
            assert!(used <= limit, "{used} > {limit}");
        }
    }
    let st = get(&a, &format!("{b}/stats")).json();
    assert!(st["bytes"].as_u64().expect("bytes") <= limit as u64, "{st}");
    let evictions = st["evictions"].as_u64().expect("evictions");
    assert!(evictions > 0, "{st}");
    let alive = |prefix: &str, n: usize| {
        (0..n)
            .filter(|i| send(&a, "HEAD", &format!("{b}/key/{prefix}{i}"), &[], b"").status == 200)
            .count()
    };
    let small_lost = n_small - alive("s", n_small);
    let large_lost = n_large - alive("L", n_large);
    assert_eq!(small_lost + large_lost, evictions as usize);
    assert!(
        large_lost >= 10 * small_lost.max(1) && small_lost * 20 <= n_small,
        "evicted {large_lost} of {n_large} large and {small_lost} of {n_small} small"
    );
}

#[test]
fn shutdown_needs_the_admin_token() {
    // No token configured: always 403.
    let (server, _clock) = start(ServerConfig::default().io, |c| {
        c.front_ends = vec![std::sync::Arc::new(kvlab_rest::Rest::on(SocketAddr::from(
            ([127, 0, 0, 1], 0),
        )))];
    });
    let a = agent();
    let url = format!("{}/shutdown", base(&server));
    send(&a, "POST", &url, &[("authorization", "Bearer x")], b"").assert_error(403);
    send(&a, "POST", &url, &[], b"").assert_error(403);
    drop(server);

    let (server, _clock) = start_http(|_| {});
    let url = format!("{}/shutdown", base(&server));
    let mc_addr = server.addr();
    send(&a, "POST", &url, &[], b"").assert_error(403);
    send(&a, "POST", &url, &[("authorization", "Bearer wrong")], b"").assert_error(403);
    send(&a, "POST", &url, &[("authorization", TOKEN)], b"").assert_error(403);
    send(
        &a,
        "POST",
        &url,
        &[("authorization", &format!("Basic {TOKEN}"))],
        b"",
    )
    .assert_error(403);
    assert_alive(&server);

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let owner = std::thread::spawn(move || {
        server.wait();
        server.shutdown();
        let _ = done_tx.send(());
    });
    let r = send(
        &a,
        "POST",
        &url,
        &[("authorization", &format!("Bearer {TOKEN}"))],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["shutting_down"], true);
    done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("Server::wait returned and the server shut down");
    owner.join().expect("owner thread");
    assert!(
        TcpStream::connect(mc_addr).is_err(),
        "memcached port closed"
    );
}

#[test]
fn malformed_requests_get_4xx_and_the_server_keeps_answering() {
    let (server, _clock) = start_http(|_| {});
    let http = kvlab_rest::rest_addr(&server).expect("http");
    let huge_key = format!(
        "GET /key/{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "k".repeat(10_000)
    );
    let huge_path = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "p".repeat(200_000));
    let cases: Vec<Vec<u8>> = vec![
        b"GET /key/%zz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"GET /key/%E0%A4%A HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"PUT /key/%/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".to_vec(),
        huge_key.into_bytes(),
        huge_path.into_bytes(),
        b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
        b"GET /\x01\x02 HTTP/1.1\r\n\r\n".to_vec(),
        b"PUT /key/a HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n".to_vec(),
        b"PUT /key/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"
            .to_vec(),
        b"PUT /key/a?ttl=%zz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".to_vec(),
        b"\x00\xff\xfe garbage\r\n\r\n".to_vec(),
    ];
    for req in &cases {
        let mut s = raw_connect(http);
        s.write_all(req).expect("write");
        let mut buf = Vec::new();
        let mut got = Vec::new();
        // Hyper may answer and close at once; read what comes.
        let r = loop {
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => break None,
                Ok(n) => {
                    got.extend_from_slice(&chunk[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        buf.extend_from_slice(&got);
                        break Some(read_reply(&mut s, &mut buf, true));
                    }
                }
            }
        };
        let r = r.unwrap_or_else(|| {
            panic!(
                "no reply to {:?}",
                String::from_utf8_lossy(&req[..req.len().min(80)])
            )
        });
        assert!(
            (400..500).contains(&r.status),
            "{} for {:?}",
            r.head,
            String::from_utf8_lossy(&req[..req.len().min(80)])
        );
        assert_alive(&server);
    }
    // A few well-formed requests with every byte value as the key are answered, not panicked on.
    let a = agent();
    let b = base(&server);
    for byte in 0..=255u8 {
        let r = get(&a, &format!("{b}/key/{}", enc(&[b'k', byte])));
        assert!(r.status == 404 || r.status == 400, "{byte}: {}", r.status);
        r.assert_error(r.status);
    }
    assert_alive(&server);
}

/// Over a durable store the REST port keeps the memcached port's guarantees: a write under
/// `sync` is on disk when acknowledged, a miss reads through after a restart, and a delete
/// stays deleted.
#[test]
fn durable_store_reads_through_and_persists_over_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    let durable = || {
        Some(kvlab_store::DurableConfig {
            dir: dir.path().to_path_buf(),
            durability: kvlab_store::Durability::Sync,
            flush_interval: std::time::Duration::from_secs(60),
        })
    };
    let a = agent();
    {
        let (server, _clock) = start_http(|c| c.durable = durable());
        assert_eq!(
            put(&a, &format!("{}/key/kept", base(&server)), b"v1").status,
            201
        );
        assert_eq!(
            put(&a, &format!("{}/key/gone", base(&server)), b"v2").status,
            201
        );
        server.shutdown();
    }
    {
        let (server, _clock) = start_http(|c| c.durable = durable());
        // Not in memory after the restart: GET reads it through from disk.
        let r = get(&a, &format!("{}/key/kept", base(&server)));
        assert_eq!((r.status, r.json()["value"].clone()), (200, "v1".into()));
        // PUT on a key only on disk is a replacement (200), not a creation.
        assert_eq!(
            put(&a, &format!("{}/key/kept", base(&server)), b"v3").status,
            200
        );
        assert_eq!(
            send(
                &a,
                "DELETE",
                &format!("{}/key/gone", base(&server)),
                &[],
                b""
            )
            .status,
            200
        );
        server.shutdown();
    }
    let (server, _clock) = start_http(|c| c.durable = durable());
    let r = get(&a, &format!("{}/key/kept", base(&server)));
    assert_eq!((r.status, r.json()["value"].clone()), (200, "v3".into()));
    assert_eq!(get(&a, &format!("{}/key/gone", base(&server))).status, 404);
    let stats = get(&a, &format!("{}/stats", base(&server))).json();
    assert!(stats["cmd_get"].as_u64().expect("cmd_get") >= 2, "{stats}");
    // The engine's figures: both GETs read through (`kept` found, `gone` not).
    assert_eq!(stats["durable_reads"], 2, "{stats}");
    for f in [
        "durable_commits",
        "durable_fsyncs",
        "durable_queued_bytes",
        "durable_purged",
    ] {
        assert!(stats[f].is_u64(), "{f}: {stats}");
    }
    let text =
        String::from_utf8(get(&a, &format!("{}/metrics", base(&server))).body).expect("utf8");
    assert!(
        text.contains("# TYPE kvlab_durable_reads counter\nkvlab_durable_reads 2\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE kvlab_durable_queued_bytes gauge\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE kvlab_durable_purged counter\n"),
        "{text}"
    );
}

/// With `-Y`, the REST port takes the same users (Basic or `Bearer user:password`); any
/// other request is 401 with a challenge and changes nothing; wrong passwords are counted.
#[test]
fn rest_takes_the_auth_file_users() {
    let users = kvlab_server::auth::AuthFile::parse(b"alice:s3cret\n").expect("parses");
    let (server, _clock) = start_http(|c| c.auth = Some(users));
    let (a, url) = (agent(), format!("{}/key/k", base(&server)));
    let r = send(&a, "PUT", &url, &[], b"v");
    r.assert_error(401);
    assert_eq!(r.header("www-authenticate"), "Basic realm=\"kvlab\"");
    // alice:wrong, then alice:s3cret, base64.
    send(
        &a,
        "GET",
        &url,
        &[("Authorization", "Basic YWxpY2U6d3Jvbmc=")],
        b"",
    )
    .assert_error(401);
    assert!(server.store().get(b"k").is_none());
    let basic = [("Authorization", "Basic YWxpY2U6czNjcmV0")];
    assert_eq!(send(&a, "PUT", &url, &basic, b"v").status, 201);
    let bearer = [("Authorization", "Bearer alice:s3cret")];
    let got = send(&a, "GET", &url, &bearer, b"");
    assert_eq!((got.status, got.json()["value"].as_str()), (200, Some("v")));
    let st = send(&a, "GET", &format!("{}/stats", base(&server)), &bearer, b"").json();
    assert_eq!(
        (st["auth_cmds"].as_u64(), st["auth_errors"].as_u64()),
        (Some(4), Some(1))
    );
}
