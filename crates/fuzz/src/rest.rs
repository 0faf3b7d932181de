//! The REST handlers, driven in-process through the same router the server serves.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use base64::Engine as _;
use http_body_util::BodyExt as _;
use kvlab_protocol::Limits;
use kvlab_rest::rest_router;
use kvlab_server::admin::AdminState;
use kvlab_server::auth::AuthFile;
use kvlab_server::stats::{ServerStats, WorkerStats};
use kvlab_server::ServerState;
use kvlab_store::{ManualClock, Store, StoreConfig};
use tower::ServiceExt as _;

const METHODS: [Method; 8] = [
    Method::GET,
    Method::HEAD,
    Method::PUT,
    Method::DELETE,
    Method::POST,
    Method::PATCH,
    Method::OPTIONS,
    Method::GET,
];

/// How the request authenticates (bits 3 and 4 of the first byte).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Auth {
    /// No `-Y`: nothing is asked.
    Off,
    /// `-Y`, and the request sends valid HTTP basic credentials.
    Basic,
    /// `-Y`, and the request sends valid bearer credentials.
    Bearer,
    /// `-Y`, and the request sends the fuzzer's `Authorization` line (or none if empty).
    Fuzzed,
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

/// Byte 0: method (bits 0–2), authentication (bits 3–4), `Accept: application/octet-stream`
/// (bit 5), an admin token (bit 6). Then the path up to a newline (relative paths go under
/// `/key/`), the `Authorization` value up to a newline, and the body.
pub fn check(data: &[u8]) {
    let (select, rest) = crate::selector(data);
    let (path, rest) = line(rest);
    let (authorization, body) = line(rest);
    let method = METHODS[usize::from(select & 7)].clone();
    let auth = [Auth::Off, Auth::Basic, Auth::Bearer, Auth::Fuzzed][usize::from(select >> 3 & 3)];
    let raw = select & 32 != 0;
    let token = (select & 64 != 0).then(|| "admin-token".to_owned());
    let mut uri = if path.starts_with(b"/") {
        path.to_vec()
    } else {
        [&b"/key/"[..], path].concat()
    };
    uri.truncate(8 * 1024);
    let Ok(uri) = Uri::try_from(uri) else {
        return;
    };
    let Some(authorization) = (match auth {
        Auth::Off => Some(None),
        Auth::Basic => Some(Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("user:secret")
        ))),
        Auth::Bearer => Some(Some("Bearer user:secret".to_owned())),
        Auth::Fuzzed if authorization.is_empty() => Some(None),
        Auth::Fuzzed => String::from_utf8(authorization.to_vec()).ok().map(Some),
    }) else {
        return;
    };
    let Some(authorization) = authorization
        .map(|a| HeaderValue::from_str(&a).ok())
        .map_or(Some(None), |v| v.map(Some))
    else {
        return;
    };
    let shared = shared(auth != Auth::Off);
    let router = rest_router(shared.clone(), token);
    let request = |method: Method, body: Vec<u8>| {
        let mut req = Request::builder().method(method).uri(uri.clone());
        if let Some(a) = &authorization {
            req = req.header(header::AUTHORIZATION, a.clone());
        }
        if raw {
            req = req.header(header::ACCEPT, "application/octet-stream");
        }
        req.body(Body::from(body))
            .expect("a request from valid parts")
    };
    let (status, _) = call(&router, request(method.clone(), body.to_vec()));
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{method} {uri}");
    let credentials_valid = match auth {
        Auth::Off | Auth::Basic | Auth::Bearer => true,
        Auth::Fuzzed => false,
    };
    if auth == Auth::Fuzzed && status != StatusCode::UNAUTHORIZED {
        // Only the one valid user gets past `-Y`: the fuzzer found its credentials.
        let a = authorization
            .as_ref()
            .and_then(|a| a.to_str().ok())
            .unwrap_or("");
        assert!(
            names_the_user(a),
            "{method} {uri} with {a:?} was let through: {status}"
        );
    }
    if credentials_valid && auth != Auth::Off {
        assert_ne!(
            status,
            StatusCode::UNAUTHORIZED,
            "valid credentials refused"
        );
    }
    // A value stored whole by `PUT /key/{k}` reads back unchanged.
    let one_key = uri
        .path()
        .strip_prefix("/key/")
        .is_some_and(|k| !k.contains('/'));
    if method == Method::PUT && status.is_success() && one_key && uri.query().is_none() {
        let mut get = request(Method::GET, Vec::new());
        get.headers_mut().insert(
            header::ACCEPT,
            HeaderValue::from_static("application/octet-stream"),
        );
        let (status, stored) = call(&router, get);
        assert_eq!(status, StatusCode::OK, "GET {uri} after PUT");
        assert_eq!(stored, body, "GET {uri} after PUT");
    }
}

/// Whether an `Authorization` value carries `user:secret` (basic or bearer, spacing aside).
fn names_the_user(value: &str) -> bool {
    if let Some(b64) = value.strip_prefix("Basic ") {
        return base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .is_ok_and(|d| d == b"user:secret");
    }
    value
        .strip_prefix("Bearer ")
        .is_some_and(|t| t.trim() == "user:secret")
}

fn line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(nl) => (&data[..nl], &data[nl + 1..]),
        None => (data, &[]),
    }
}

fn shared(auth: bool) -> Arc<ServerState> {
    let config = StoreConfig {
        memory_limit: 4 << 20,
        item_size_max: 64 * 1024,
        shards: 1,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::new(
        config,
        Arc::new(ManualClock::new(1_800_000_000)),
    ));
    let mut stats = ServerStats::for_tests(vec![Arc::new(WorkerStats::default())]);
    if auth {
        let mut admin = AdminState::new(Arc::default());
        admin.auth = AuthFile::parse(b"user:secret\n").ok();
        stats.admin = Arc::new(admin);
    }
    Arc::new(ServerState {
        store,
        stats: Arc::new(stats),
        limits: Limits {
            item_size_max: 64 * 1024,
            ..Limits::default()
        },
        shutdown: AtomicBool::new(false),
    })
}

/// Runs one request; its status and whole body.
fn call(router: &axum::Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    RUNTIME.with(|rt| {
        rt.block_on(async {
            let response = router
                .clone()
                .oneshot(req)
                .await
                .expect("the router is infallible");
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            (status, body)
        })
    })
}
