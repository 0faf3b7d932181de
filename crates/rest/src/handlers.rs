//! The REST handlers, one per endpoint, and the durable store's rules they follow: the REST
//! front end keeps the same guarantees as the memcached port.

use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use kvlab_store::{ItemView, SetMode, SetRequest, SetStatus, Store};
use serde_json::{json, Map, Value as Json};

use crate::request::{
    decode_key, key_json, key_of, key_segments, percent_decode_strict, put_bytes, put_options,
    wants_raw, PutOptions,
};
use crate::{json_response, ApiError, App, ACCEPT_VALUE, DRAIN_MAX, JSON_TYPE, OCTET_TYPE};
use kvlab_server::cache::{Blocking, DiskRules};
use kvlab_server::stats::StatValue;

/// With a durable store, brings `key` into memory from disk before a command that depends
/// on it (a miss reads through), by the rules the memcached engine follows
/// ([`kvlab_server::cache`]). Runs on this runtime's worker thread, marked as blocking.
/// Returns the item read through, if any: a get serves it should it have left memory
/// again ([`Store::get_loaded`]).
fn read_through(app: &App, key: &[u8]) -> Result<Option<ItemView>, ApiError> {
    let store = &app.shared.store;
    match DiskRules::of(store).load(store, key) {
        Some(work) => {
            run_blocking(store, &work)?;
            match work {
                Blocking::Load(read) => Ok(read.found().cloned()),
                _ => Ok(None),
            }
        }
        None => Ok(None),
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
    kvlab_server::stats::WorkerStats::add(counter, 1);
}

// ---------------------------------------------------------------------------------------------
// Handlers.

pub(super) async fn get_key(State(app): State<App>, uri: Uri, headers: HeaderMap) -> Response {
    let key = match key_of(&uri) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    count(&app.shared.stats.http.cmd_get);
    let found = match read_through(&app, &key) {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let store = &app.shared.store;
    let item = match &found {
        Some(found) => store.get_loaded(&key, found),
        None => store.get(&key),
    };
    let Some(item) = item else {
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

pub(super) async fn head_key(State(app): State<App>, uri: Uri, version: Version) -> Response {
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

pub(super) async fn root(State(app): State<App>, version: Version) -> Response {
    let (headers, used, limit) = info_headers(&app, version);
    let body = json!({
        "server": kvlab_server::stats::VERSION,
        "space_used": used,
        "space_limit": limit,
        "endpoints": ["/key/{k}", "/key/{k}/{v}", "/stats", "/metrics", "/shutdown"],
    });
    (StatusCode::OK, headers, body.to_string()).into_response()
}

pub(super) async fn put_body(State(app): State<App>, uri: Uri, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    // Refused for its key or query, the request's body is still read (and dropped, as a
    // too-large one's is): with it unread the connection would close after the reply, and
    // a client's next request on it find it gone.
    let (key, opts) = match key_of(&uri).and_then(|k| Ok((k, put_options(&uri)?))) {
        Ok(v) => v,
        Err(e) => {
            drain(body, 0).await;
            return e.into_response();
        }
    };
    let limit = app.shared.store.config().item_size_max;
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

pub(super) async fn put_path(State(app): State<App>, uri: Uri) -> Response {
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

pub(super) async fn delete_key(State(app): State<App>, uri: Uri) -> Response {
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

pub(super) async fn stats(State(app): State<App>) -> Response {
    let snapshot = app.shared.stats.snapshot(&app.shared.store);
    let mut obj = Map::new();
    for stat in snapshot.all() {
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

pub(super) async fn metrics(State(app): State<App>) -> Response {
    let body = kvlab_server::stats::prometheus(&app.shared.stats.snapshot(&app.shared.store));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

pub(super) async fn shutdown(State(app): State<App>, headers: HeaderMap) -> Response {
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
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
