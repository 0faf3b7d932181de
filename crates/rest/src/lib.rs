//! kvlab server's HTTP front ends, beside its memcached port: the REST interface
//! (`--http-port`, [`Rest`]) and the Prometheus endpoint (`--metrics-port`, [`Metrics`]).
//! Each is a [`kvlab_server::FrontEnd`] the binary puts in the server's configuration, so
//! the cache server itself builds without an HTTP stack or an async runtime.
//!
//! The REST interface is the cache over HTTP/JSON, sharing the store with the memcached port
//! (a value set on one is read on the other). `GET /metrics` (on either port) returns the same
//! figures as `stats`, in the Prometheus text format.
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
//! The listener, its bounds ([`HttpLimits`]) and the thread ([`HttpServer`]) are
//! `kvlab_net::http`'s, shared with `/metrics` and the proxy's `/metrics`.
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
//!   one, it is 403. It replies, then asks the server's owner to stop ([`ServerState::request_stop`]).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post, put};
use axum::Router;
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::{json, Value as Json};

use handlers::{delete_key, get_key, head_key, metrics, put_body, put_path, root, shutdown, stats};
use kvlab_server::stats::WorkerStats;
use kvlab_server::{FrontEnd, RunningFrontEnd, Server, ServerState};
use request::missing_key;

pub use kvlab_net::http::{HttpLimits, HttpServer};

mod handlers;
mod request;

/// How many bytes of a refused (oversize) body are read and discarded so the client sees the
/// 413 on an intact connection; past this the connection is closed instead.
pub const DRAIN_MAX: usize = 16 << 20;

/// What `GET` can produce (sent as `Accept` on `HEAD`).
const ACCEPT_VALUE: &str = "application/json, application/octet-stream";
const JSON_TYPE: &str = "application/json";
const OCTET_TYPE: &str = "application/octet-stream";

/// [`Rest`]'s name among a server's front ends.
pub const REST: &str = "rest";
/// [`Metrics`]' name among a server's front ends.
pub const METRICS: &str = "metrics";

/// The REST interface as a server's front end: where it listens, the token that authorises
/// `POST /shutdown`, and its connections' bounds.
#[derive(Clone, Debug)]
pub struct Rest {
    /// Address to listen on (port 0 picks a free one).
    pub at: SocketAddr,
    /// Bearer token that authorises `POST /shutdown` (`--admin-token`); none: 403.
    pub admin_token: Option<String>,
    /// Its connections' bounds.
    pub limits: HttpLimits,
}

impl Rest {
    /// The REST interface on `at`, with no admin token and the default bounds.
    pub fn on(at: SocketAddr) -> Rest {
        Rest {
            at,
            admin_token: None,
            limits: HttpLimits::default(),
        }
    }
}

/// The Prometheus endpoint as a server's front end: `GET /metrics` alone on its own port.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Address to listen on (port 0 picks a free one).
    pub at: SocketAddr,
    /// Its connections' bounds.
    pub limits: HttpLimits,
}

impl Metrics {
    /// The endpoint on `at`, with the default bounds.
    pub fn on(at: SocketAddr) -> Metrics {
        Metrics {
            at,
            limits: HttpLimits::default(),
        }
    }
}

/// A started [`Rest`] or [`Metrics`]: its listener's thread.
struct Running(HttpServer);

impl RunningFrontEnd for Running {
    fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    fn stop(self: Box<Self>) {
        self.0.stop();
    }
}

impl FrontEnd for Rest {
    fn name(&self) -> &'static str {
        REST
    }

    fn descriptors(&self) -> usize {
        self.limits.max_connections
    }

    fn start(&self, shared: Arc<ServerState>) -> io::Result<Box<dyn RunningFrontEnd>> {
        let router = rest_router(shared, self.admin_token.clone());
        let server = HttpServer::serve_with(self.at, router, "kvlab-http", self.limits)?;
        Ok(Box::new(Running(server)))
    }
}

impl FrontEnd for Metrics {
    fn name(&self) -> &'static str {
        METRICS
    }

    fn descriptors(&self) -> usize {
        self.limits.max_connections
    }

    /// Served on its own thread and runtime, so scraping never takes time from the cache's
    /// worker threads beyond summing their counters.
    fn start(&self, shared: Arc<ServerState>) -> io::Result<Box<dyn RunningFrontEnd>> {
        let server = kvlab_net::http::serve_metrics(self.at, "kvlab-metrics", self.limits, {
            move || kvlab_server::stats::prometheus(&shared.stats.snapshot(&shared.store))
        })?;
        Ok(Box::new(Running(server)))
    }
}

/// The address `server`'s REST interface listens on, if it has one.
pub fn rest_addr(server: &Server) -> Option<SocketAddr> {
    server.front_end_addr(REST)
}

/// The address `server`'s `/metrics` endpoint listens on, if it has one.
pub fn metrics_addr(server: &Server) -> Option<SocketAddr> {
    server.front_end_addr(METRICS)
}

/// What every handler sees.
#[derive(Clone)]
struct App {
    shared: Arc<ServerState>,
    admin_token: Option<Arc<str>>,
}

/// The REST interface's routes over `shared`, as [`Rest`] serves them, for
/// callers that drive it in-process (the fuzz targets).
pub fn rest_router(shared: Arc<ServerState>, admin_token: Option<String>) -> Router {
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
