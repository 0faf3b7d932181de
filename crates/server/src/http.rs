//! The REST interface (`--http-port`): the cache over HTTP/JSON, sharing the store with the
//! memcached port (a value set on one is read on the other).
//!
//! ```text
//!  Server::start ──► thread "kvlab-http" ── block_on(axum::serve) ── accept loop (at most
//!                        HttpLimits::max_connections open; each closed after
//!                        HttpLimits::idle_timeout without a byte either way)
//!                        tokio multi-thread runtime, 2 workers ("kvlab-http-rt"):
//!                        one task per connection (hyper HTTP/1.1: keep-alive, pipelining)
//!                            └─► handler ──► Store (shard locks, like a memcached worker)
//!  HttpServer::stop ──► watch signal ──► graceful shutdown: idle connections close, busy ones
//!                        finish their request; after GRACE the runtime drops what is left
//! ```
//!
//! HTTP never runs on the memcached worker threads: a slow HTTP client costs those threads
//! nothing but CPU time and the store's own shard locks.
//!
//! # Endpoints
//!
//! | method and path          | success                             | errors                  |
//! |--------------------------|-------------------------------------|-------------------------|
//! | `GET /key/{k}`           | 200 `{"key","value","flags","cas"}` | 400, 404                |
//! | `HEAD /key/{k}`          | 200 headers only (see below)        | 400, 404 (no body)      |
//! | `PUT /key/{k}` (body)    | 201 created / 200 replaced          | 400, 413, 507           |
//! | `PUT /key/{k}/{v}`       | 201 created / 200 replaced          | 400, 413, 507           |
//! | `DELETE /key/{k}`        | 200 `{"key","deleted":true}`        | 400, 404                |
//! | `GET`/`HEAD /`           | 200 `{"server","space_used",…}`     |                         |
//! | `GET /stats`             | 200 memcached's `stats` as JSON     |                         |
//! | `GET /metrics`           | 200 Prometheus text                 |                         |
//! | `POST /shutdown`         | 200, then the server stops          | 403                     |
//!
//! Every error carries a JSON body `{"error": "…", "status": N}` (except on `HEAD`, which has
//! no body, and the few malformed requests hyper refuses before routing). Unknown paths are
//! 404; a known path with a wrong method is 405 with `Allow`.
//!
//! - **Keys** are one path segment, percent-decoded strictly (a `%` not followed by two hex
//!   digits is 400), then checked with memcached's rules: 1..=250 bytes, no space or control
//!   character (`/key/` with an empty key is 400 too). Keys may hold any other byte, `/`
//!   included (as `%2F`).
//! - **Values** are binary-safe: the raw request body, or the percent-decoded second segment.
//!   JSON cannot carry arbitrary bytes, so `GET` returns `"value"` as a string when the bytes
//!   are valid UTF-8, else as standard base64 with `"encoding": "base64"` (keys that are not
//!   UTF-8 likewise get `"key_encoding": "base64"`). `Accept: application/octet-stream` on
//!   `GET` returns the raw bytes instead, with the item's flags in a `Flags` header.
//! - **PUT** stores with flags 0 unless `?flags=N` (u32), and `?ttl=S` with memcached's
//!   exptime meaning (0 never, negative already expired, up to 30 days relative, else unix
//!   time). Other query parameters are 400; `PUT /key/{k}/{v}` ignores any body. It answers
//!   201 when the key had no live item and 200 when it replaced one (an `add`, then a `set`
//!   if the add found the key). A body larger than the item limit (`-I`) is 413 without being
//!   buffered: it is discarded as it arrives (up to [`DRAIN_MAX`], after which the connection
//!   is closed). A value that fits the body limit but not the item limit (key + value +
//!   overhead) is 413 too; a store that cannot make room (`--eviction none`) is 507
//!   Insufficient Storage.
//! - **HEAD** `/` and `/key/{k}` send `Date`, `Content-Type`, `Accept` (what `GET` can produce),
//!   `Http-Version` (the request's), `Space-Used` and `Space-Limit` (the store's `bytes` and
//!   `limit_maxbytes`), and for a key `Value-Length`. A key's HEAD does not count as a get.
//! - **POST /shutdown** needs the server's admin token (`--admin-token`) as
//!   `Authorization: Bearer <token>`; without a configured token, or with a wrong or missing
//!   one, it is 403. It replies, then asks the server's owner to stop ([`Shared::request_stop`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::Router;
use base64::Engine as _;
use http_body_util::BodyExt;
use kvlab_store::{SetMode, SetRequest, SetStatus, Store};
use serde_json::{json, Map, Value as Json};
use tokio::sync::watch;

use crate::cache::{Blocking, DiskRules};
use crate::stats::{StatValue, WorkerStats};
use crate::Shared;

/// How long [`HttpServer::stop`] lets open requests finish before dropping them.
const GRACE: Duration = Duration::from_secs(5);

/// How many bytes of a refused (oversize) body are read and discarded so the client sees the
/// 413 on an intact connection; past this the connection is closed instead.
pub const DRAIN_MAX: usize = 16 << 20;

/// What `GET` can produce (sent as `Accept` on `HEAD`).
const ACCEPT_VALUE: &str = "application/json, application/octet-stream";
const JSON_TYPE: &str = "application/json";
const OCTET_TYPE: &str = "application/octet-stream";

/// A running REST endpoint.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

/// What every handler sees.
#[derive(Clone)]
struct App {
    shared: Arc<Shared>,
    admin_token: Option<Arc<str>>,
}

impl HttpServer {
    /// Binds `at` and serves the REST interface under `limits` until [`HttpServer::stop`].
    pub fn start(
        at: SocketAddr,
        shared: Arc<Shared>,
        admin_token: Option<String>,
        limits: HttpLimits,
    ) -> io::Result<HttpServer> {
        Self::serve_with(at, rest_router(shared, admin_token), "kvlab-http", limits)
    }

    /// Binds `at` and serves `app` on a thread named `name` with its own two-worker tokio
    /// runtime, until [`HttpServer::stop`], under the default [`HttpLimits`]. Shared by the
    /// REST interface, `/metrics`, and the proxy's `/metrics`.
    pub fn serve(at: SocketAddr, app: Router, name: &str) -> io::Result<HttpServer> {
        Self::serve_with(at, app, name, HttpLimits::default())
    }

    /// [`HttpServer::serve`] under `limits`.
    pub fn serve_with(
        at: SocketAddr,
        app: Router,
        name: &str,
        limits: HttpLimits,
    ) -> io::Result<HttpServer> {
        let listener = std::net::TcpListener::bind(at)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("{name}-rt"))
            .enable_io()
            .enable_time()
            .build()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(%e, "HTTP listener unusable");
                            return;
                        }
                    };
                    let mut graceful = stop_rx.clone();
                    let listener = Bounded::new(listener, limits);
                    let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                        let _ = graceful.wait_for(|stop| *stop).await;
                    });
                    let served = tokio::spawn(async move {
                        if let Err(e) = serve.await {
                            tracing::error!(%e, "HTTP interface failed");
                        }
                    });
                    // Wait for the stop signal (or a dropped sender), then give open requests
                    // GRACE to finish; what is left is dropped with the runtime.
                    let mut stop = stop_rx;
                    let _ = stop.wait_for(|stop| *stop).await;
                    if tokio::time::timeout(GRACE, served).await.is_err() {
                        tracing::warn!("HTTP connections still open after {GRACE:?}; closing");
                    }
                });
            })?;
        Ok(HttpServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and joins its thread.
    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
    }
}

/// Bounds on an HTTP endpoint's connections, so that slow, stalled or idle clients cannot
/// hold the process's file descriptors: the memcached port must always accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Most connections open at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// A connection that neither reads nor writes a byte for this long is closed: an idle
    /// keep-alive connection, and a request whose header or body stalls, alike.
    pub idle_timeout: Duration,
}

impl Default for HttpLimits {
    /// 256 connections per endpoint (the REST port and `/metrics` together hold at most
    /// 512 descriptors, whatever clients do), closed after 30 s without a byte.
    fn default() -> Self {
        HttpLimits {
            max_connections: 256,
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// A listener that accepts only while fewer than [`HttpLimits::max_connections`] of its
/// connections are open, and hands out connections that close after
/// [`HttpLimits::idle_timeout`] without a byte either way.
struct Bounded {
    inner: tokio::net::TcpListener,
    open: Arc<tokio::sync::Semaphore>,
    idle: Duration,
}

impl Bounded {
    fn new(inner: tokio::net::TcpListener, limits: HttpLimits) -> Bounded {
        Bounded {
            inner,
            open: Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1))),
            idle: limits.idle_timeout,
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = Timed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Timed, SocketAddr) {
        // At the limit, wait for a connection to close before accepting another.
        let permit = loop {
            // The semaphore is never closed, so acquiring only fails if it were.
            if let Ok(p) = self.open.clone().acquire_owned().await {
                break p;
            }
        };
        loop {
            match self.inner.accept().await {
                Ok((tcp, peer)) => {
                    // Without TCP_NODELAY, Nagle holds a reply that follows another on the
                    // same connection until the client's delayed ACK (~40 ms).
                    let _ = tcp.set_nodelay(true);
                    let deadline = Box::pin(tokio::time::sleep(self.idle));
                    return (
                        Timed {
                            tcp,
                            _permit: permit,
                            idle: self.idle,
                            deadline,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::warn!(%e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An HTTP connection that fails with `TimedOut` (and so is closed) once it has neither
/// read nor written a byte for its idle timeout; it holds one of its listener's permits.
struct Timed {
    tcp: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
    idle: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Timed {
    fn active(&mut self) {
        let next = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }
}

impl tokio::io::AsyncRead for Timed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::future::Future as _;
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.tcp).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.active();
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "HTTP connection idle past its timeout",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl tokio::io::AsyncWrite for Timed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.tcp).poll_write(cx, buf);
        if r.is_ready() {
            self.active();
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        if r.is_ready() {
            self.active();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

/// The REST interface's routes over `shared`, as [`HttpServer::start`] serves them, for
/// callers that drive it in-process (the fuzz targets).
pub fn rest_router(shared: Arc<Shared>, admin_token: Option<String>) -> Router {
    router(App {
        shared,
        admin_token: admin_token.map(Arc::from),
    })
}

fn router(app: App) -> Router {
    Router::new()
        .route("/", get(root).head(root))
        .route(
            "/key/{k}",
            get(get_key).head(head_key).put(put_body).delete(delete_key),
        )
        .route("/key/{k}/{v}", put(put_path))
        .route("/key/", any(missing_key))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/shutdown", post(shutdown))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), require_user))
        .layer(middleware::from_fn(json_errors))
        .with_state(app)
}

/// With `-Y`, every request names one of its users: `Authorization: Basic
/// base64(user:password)` or `Authorization: Bearer user:password`; otherwise 401 with a
/// `WWW-Authenticate` challenge. Counted like the memcached port's logins: a request that
/// names a user in `auth_cmds`, a wrong password also in `auth_errors`.
async fn require_user(State(app): State<App>, req: Request, next: Next) -> Response {
    let Some(users) = app.shared.stats.admin.auth.as_ref() else {
        return next.run(req).await;
    };
    let offered = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            if let Some(b64) = v.strip_prefix("Basic ") {
                base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .ok()
            } else {
                v.strip_prefix("Bearer ")
                    .map(|t| t.trim().as_bytes().to_vec())
            }
        });
    let http = &app.shared.stats.http;
    let ok = match offered.as_deref().and_then(|o| {
        let colon = o.iter().position(|&b| b == b':')?;
        Some((&o[..colon], &o[colon + 1..]))
    }) {
        Some((user, password)) => {
            WorkerStats::add(&http.auth_cmds, 1);
            let ok = users.check(user, password);
            if !ok {
                WorkerStats::add(&http.auth_errors, 1);
            }
            ok
        }
        None => false,
    };
    if ok {
        return next.run(req).await;
    }
    let mut resp =
        ApiError::new(StatusCode::UNAUTHORIZED, "authentication required").into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"kvlab\""),
    );
    resp
}

/// An error reply: status and message, rendered as `{"error": …, "status": …}`.
#[derive(Debug)]
struct ApiError(StatusCode, String);

impl ApiError {
    fn new(status: StatusCode, msg: impl Into<String>) -> ApiError {
        ApiError(status, msg.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error_response(self.0, &self.1)
    }
}

fn error_response(status: StatusCode, msg: &str) -> Response {
    let body = json!({ "error": msg, "status": status.as_u16() });
    (
        status,
        [(header::CONTENT_TYPE, JSON_TYPE)],
        body.to_string(),
    )
        .into_response()
}

fn json_response(status: StatusCode, body: &Json) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, JSON_TYPE)],
        body.to_string(),
    )
        .into_response()
}

/// Gives the error replies axum composes itself (405, rejections) a JSON body, keeping their
/// headers (`Allow`).
async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(JSON_TYPE.as_bytes()));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // Axum's own error bodies are short texts; read at most a little of them.
    let text = match http_body_util::Limited::new(body, 1024).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let mut msg = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    if status == StatusCode::METHOD_NOT_ALLOWED {
        if let Some(allow) = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
        {
            msg = format!("method not allowed; allowed: {allow}");
        }
    }
    let body = json!({ "error": msg, "status": status.as_u16() }).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_TYPE));
    Response::from_parts(parts, Body::from(body))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such resource: {}", uri.path()),
    )
}

// ---------------------------------------------------------------------------------------------
// Keys, values and query parameters.

/// Decodes `%XX` escapes; anything else after a `%` is an error (unlike lenient decoders,
/// which would silently store a different key than the client meant).
fn percent_decode_strict(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| (c as char).to_digit(16);
            match (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    // Both digits are < 16, so the byte fits.
                    out.push((h * 16 + l) as u8);
                    i += 3;
                }
                _ => return Err(format!("bad percent-encoding at byte {i} of {s:?}")),
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// The raw (still percent-encoded) segments after `/key/`.
fn key_segments(uri: &Uri) -> Vec<&str> {
    uri.path()
        .strip_prefix("/key/")
        .map(|rest| rest.split('/').collect())
        .unwrap_or_default()
}

fn decode_key(raw: &str) -> Result<Vec<u8>, ApiError> {
    let key = percent_decode_strict(raw).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    check_key(&key).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("bad key: {e}")))?;
    Ok(key)
}

/// memcached's key rules, so that every key stored over HTTP is usable on the memcached port:
/// 1..=250 bytes, no space or control character.
fn check_key(key: &[u8]) -> Result<(), String> {
    if key.is_empty() || key.len() > kvlab_protocol::MAX_KEY_LEN {
        return Err(format!(
            "key length {} is outside 1..={}",
            key.len(),
            kvlab_protocol::MAX_KEY_LEN
        ));
    }
    match key.iter().position(|&b| b <= b' ' || b == 0x7f) {
        Some(i) => Err(format!(
            "key contains a space or control character at byte {i}"
        )),
        None => Ok(()),
    }
}

async fn missing_key() -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad key: empty (want /key/{k})")
}

/// The key of a `/key/{k}` request.
fn key_of(uri: &Uri) -> Result<Vec<u8>, ApiError> {
    match key_segments(uri).first() {
        Some(raw) => decode_key(raw),
        None => Err(ApiError::new(StatusCode::BAD_REQUEST, "missing key")),
    }
}

/// Puts `bytes` into `obj[field]`: a string if UTF-8, else base64 with `{field}encoding`.
fn put_bytes(obj: &mut Map<String, Json>, field: &str, enc_field: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            obj.insert(field.into(), Json::String(s.into()));
        }
        Err(_) => {
            obj.insert(
                field.into(),
                Json::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
            );
            obj.insert(enc_field.into(), Json::String("base64".into()));
        }
    }
}

fn key_json(key: &[u8]) -> Map<String, Json> {
    let mut obj = Map::new();
    put_bytes(&mut obj, "key", "key_encoding", key);
    obj
}

/// `?ttl=` and `?flags=` of a PUT.
#[derive(Default)]
struct PutOptions {
    exptime: i64,
    flags: u32,
}

fn put_options(uri: &Uri) -> Result<PutOptions, ApiError> {
    let mut opts = PutOptions::default();
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, m);
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode_strict(raw).map_err(bad)?;
        let value = String::from_utf8_lossy(&value);
        match name {
            "ttl" => {
                opts.exptime = value
                    .parse()
                    .map_err(|_| bad(format!("bad ttl {value:?}: want integer seconds")))?
            }
            "flags" => {
                opts.flags = value
                    .parse()
                    .map_err(|_| bad(format!("bad flags {value:?}: want 0..=4294967295")))?
            }
            other => return Err(bad(format!("unknown query parameter {other:?}"))),
        }
    }
    Ok(opts)
}

/// Prefers raw bytes when the client lists `application/octet-stream` and does not list
/// `application/json` before it (q-values are not weighed).
fn wants_raw(headers: &HeaderMap) -> bool {
    let mut listed = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|r| r.split(';').next().unwrap_or("").trim());
    listed
        .find(|r| r.eq_ignore_ascii_case(OCTET_TYPE) || r.eq_ignore_ascii_case(JSON_TYPE))
        .is_some_and(|r| r.eq_ignore_ascii_case(OCTET_TYPE))
}

// ---------------------------------------------------------------------------------------------
// Durable store: the REST front end keeps the same guarantees as the memcached port.

/// With a durable store, brings `key` into memory from disk before a command that depends
/// on it (a miss reads through), by the rules the memcached engine follows
/// ([`crate::cache`]). Runs on this runtime's worker thread, marked as blocking.
fn read_through(app: &App, key: &[u8]) -> Result<(), ApiError> {
    let store = &app.shared.store;
    match DiskRules::of(store).load(store, key) {
        Some(work) => run_blocking(store, &work),
        None => Ok(()),
    }
}

/// Under `--durability sync`, makes a write durable before it is acknowledged.
fn persist(app: &App, key: &[u8]) -> Result<(), ApiError> {
    let store = &app.shared.store;
    match DiskRules::of(store).persist(key) {
        Some(work) => run_blocking(store, &work),
        None => Ok(()),
    }
}

/// Does disk work in place, telling the runtime this thread blocks.
fn run_blocking(store: &Store, work: &Blocking) -> Result<(), ApiError> {
    tokio::task::block_in_place(|| work.run_on(store)).map_err(disk_error)
}

fn disk_error(e: std::io::Error) -> ApiError {
    tracing::warn!(%e, "disk operation failed");
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("disk: {e}"))
}

fn count(counter: &std::sync::atomic::AtomicU64) {
    crate::stats::WorkerStats::add(counter, 1);
}

// ---------------------------------------------------------------------------------------------
// Handlers.

async fn get_key(State(app): State<App>, uri: Uri, headers: HeaderMap) -> Response {
    let key = match key_of(&uri) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    count(&app.shared.stats.http.cmd_get);
    if let Err(e) = read_through(&app, &key) {
        return e.into_response();
    }
    let Some(item) = app.shared.store.get(&key) else {
        return ApiError::new(StatusCode::NOT_FOUND, "no such key").into_response();
    };
    if wants_raw(&headers) {
        // Zero-copy: the body holds a reference to the item's block.
        let flags = HeaderValue::from(item.flags);
        let body = Body::from(Bytes::from_owner(item.value));
        return (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(OCTET_TYPE)),
                (HeaderName::from_static("flags"), flags),
            ],
            body,
        )
            .into_response();
    }
    let mut obj = key_json(&key);
    put_bytes(&mut obj, "value", "encoding", &item.value);
    obj.insert("flags".into(), item.flags.into());
    obj.insert("cas".into(), item.cas.into());
    json_response(StatusCode::OK, &Json::Object(obj))
}

/// The headers `HEAD` sends, with the store's memory used and limit.
fn info_headers(app: &App, version: Version) -> (HeaderMap, u64, u64) {
    let s = app.shared.store.stats();
    let mut h = HeaderMap::new();
    let date = httpdate::fmt_http_date(SystemTime::now());
    if let Ok(v) = HeaderValue::from_str(&date) {
        h.insert(header::DATE, v);
    }
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON_TYPE));
    h.insert(header::ACCEPT, HeaderValue::from_static(ACCEPT_VALUE));
    let version = match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "unknown",
    };
    h.insert(
        HeaderName::from_static("http-version"),
        HeaderValue::from_static(version),
    );
    h.insert(HeaderName::from_static("space-used"), s.bytes.into());
    h.insert(
        HeaderName::from_static("space-limit"),
        s.limit_maxbytes.into(),
    );
    (h, s.bytes, s.limit_maxbytes)
}

async fn head_key(State(app): State<App>, uri: Uri, version: Version) -> Response {
    let key = match key_of(&uri) {
        Ok(k) => k,
        Err(e) => return e.0.into_response(),
    };
    if let Err(e) = read_through(&app, &key) {
        return e.0.into_response();
    }
    // `peek` neither counts a get nor bumps recency: HEAD only looks.
    let Some(view) = app.shared.store.peek(&key) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (mut headers, _, _) = info_headers(&app, version);
    headers.insert(
        HeaderName::from_static("value-length"),
        view.item.value.len().into(),
    );
    (StatusCode::OK, headers).into_response()
}

async fn root(State(app): State<App>, version: Version) -> Response {
    let (headers, used, limit) = info_headers(&app, version);
    let body = json!({
        "server": crate::stats::VERSION,
        "space_used": used,
        "space_limit": limit,
        "endpoints": ["/key/{k}", "/key/{k}/{v}", "/stats", "/metrics", "/shutdown"],
    });
    (StatusCode::OK, headers, body.to_string()).into_response()
}

async fn put_body(State(app): State<App>, uri: Uri, req: Request) -> Response {
    let key = match key_of(&uri) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let opts = match put_options(&uri) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let limit = app.shared.store.config().item_size_max;
    let (parts, body) = req.into_parts();
    let value = match read_body(&parts.headers, body, limit).await {
        Ok(v) => v,
        Err(e) => {
            if e.0 == StatusCode::PAYLOAD_TOO_LARGE {
                app.shared.store.count_too_large();
            }
            return e.into_response();
        }
    };
    store_value(&app, &key, &value, &opts)
}

async fn put_path(State(app): State<App>, uri: Uri) -> Response {
    let segs = key_segments(&uri);
    let (Some(raw_key), Some(raw_value)) = (segs.first(), segs.get(1)) else {
        return ApiError::new(StatusCode::BAD_REQUEST, "want /key/{k}/{v}").into_response();
    };
    let key = match decode_key(raw_key) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let value = match percent_decode_strict(raw_value) {
        Ok(v) => v,
        Err(e) => return ApiError::new(StatusCode::BAD_REQUEST, e).into_response(),
    };
    let opts = match put_options(&uri) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    store_value(&app, &key, &value, &opts)
}

/// Reads a body of at most `limit` bytes. A longer one is discarded as it arrives (up to
/// [`DRAIN_MAX`]) and refused with 413, so memory stays bounded whatever the client sends.
async fn read_body(headers: &HeaderMap, mut body: Body, limit: usize) -> Result<Vec<u8>, ApiError> {
    let too_large = |n: String| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("value of {n} bytes exceeds the item size limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        drain(body, 0).await;
        return Err(too_large(n.to_string()));
    }
    let mut value = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if value.len() + data.len() > limit {
                let seen = value.len() + data.len();
                drop(value);
                drain(body, seen).await;
                return Err(too_large(format!("more than {}", seen - 1)));
            }
            value.extend_from_slice(&data);
        }
    }
    Ok(value)
}

/// Reads and drops the rest of a refused body, up to [`DRAIN_MAX`] bytes in all.
async fn drain(mut body: Body, mut seen: usize) {
    while seen <= DRAIN_MAX {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    seen += data.len();
                }
            }
            _ => return,
        }
    }
}

fn store_value(app: &App, key: &[u8], value: &[u8], opts: &PutOptions) -> Response {
    count(&app.shared.stats.http.cmd_set);
    // Whether the key exists decides 201 or 200, so a durable store looks on disk first.
    if let Err(e) = read_through(app, key) {
        return e.into_response();
    }
    let store = &app.shared.store;
    let mut req = SetRequest::new(SetMode::Add, key, value);
    req.flags = opts.flags;
    req.exptime = opts.exptime;
    let mut created = true;
    let mut status = store.set(&req);
    if status == SetStatus::NotStored {
        // The key has a live item: replace it.
        created = false;
        req.mode = SetMode::Set;
        status = store.set(&req);
    }
    match status {
        SetStatus::Stored { cas } => {
            if let Err(e) = persist(app, key) {
                return e.into_response();
            }
            let mut obj = key_json(key);
            obj.insert("created".into(), created.into());
            obj.insert("cas".into(), cas.into());
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            json_response(code, &Json::Object(obj))
        }
        SetStatus::TooLarge => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "item of {} bytes (key + value + overhead) exceeds the item size limit of {} bytes",
                key.len() + value.len() + kvlab_store::ITEM_OVERHEAD,
                store.config().item_size_max
            ),
        )
        .into_response(),
        SetStatus::OutOfMemory => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "out of memory storing object",
        )
        .into_response(),
        // Not reachable for add/set without CAS; answered rather than assumed.
        SetStatus::NotStored | SetStatus::Exists | SetStatus::NotFound => {
            ApiError::new(StatusCode::CONFLICT, "the item changed concurrently; retry")
                .into_response()
        }
    }
}

async fn delete_key(State(app): State<App>, uri: Uri) -> Response {
    let key = match key_of(&uri) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = read_through(&app, &key) {
        return e.into_response();
    }
    if !app.shared.store.delete(&key) {
        return ApiError::new(StatusCode::NOT_FOUND, "no such key").into_response();
    }
    if let Err(e) = persist(&app, &key) {
        return e.into_response();
    }
    let mut obj = key_json(&key);
    obj.insert("deleted".into(), true.into());
    json_response(StatusCode::OK, &Json::Object(obj))
}

async fn stats(State(app): State<App>) -> Response {
    let snapshot = app.shared.stats.snapshot(&app.shared.store);
    let mut obj = Map::new();
    for stat in snapshot.fields {
        let v = match stat.value {
            StatValue::Int(n) => Json::from(n),
            StatValue::Real(x, _) => {
                serde_json::Number::from_f64(x).map_or(Json::Null, Json::Number)
            }
            StatValue::Text(t) => Json::String(t),
        };
        obj.insert(stat.name.to_string(), v);
    }
    json_response(StatusCode::OK, &Json::Object(obj))
}

async fn metrics(State(app): State<App>) -> Response {
    let body = crate::stats::prometheus(&app.shared.stats.snapshot(&app.shared.store));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn shutdown(State(app): State<App>, headers: HeaderMap) -> Response {
    let Some(token) = app.admin_token.as_deref() else {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "shutdown is disabled: the server has no admin token",
        )
        .into_response();
    };
    let offered = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if !offered.is_some_and(|o| constant_time_eq(o.as_bytes(), token.as_bytes())) {
        return ApiError::new(StatusCode::FORBIDDEN, "missing or wrong admin token")
            .into_response();
    }
    app.shared.request_stop();
    json_response(StatusCode::OK, &json!({ "shutting_down": true }))
}

/// Compares without returning early at the first differing byte (the length still shows).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_percent_decoding() {
        assert_eq!(
            percent_decode_strict("a%20b%2F%C3%BC%25").unwrap(),
            "a b/ü%".as_bytes()
        );
        assert_eq!(percent_decode_strict("%ff").unwrap(), vec![0xff]);
        assert!(percent_decode_strict("%").is_err());
        assert!(percent_decode_strict("%2").is_err());
        assert!(percent_decode_strict("%zz").is_err());
        assert!(percent_decode_strict("a%2g").is_err());
    }

    #[test]
    fn accept_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!wants_raw(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/octet-stream"),
        );
        assert!(wants_raw(&h));
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, application/octet-stream;q=0.5"),
        );
        assert!(!wants_raw(&h));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        assert!(!wants_raw(&h));
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
