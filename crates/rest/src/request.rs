//! Reading a REST request: keys, values and query parameters.

use axum::http::{header, HeaderMap, StatusCode, Uri};
use base64::Engine as _;
use serde_json::{Map, Value as Json};

use crate::{ApiError, JSON_TYPE, OCTET_TYPE};

/// Decodes `%XX` escapes; anything else after a `%` is an error (unlike lenient decoders,
/// which would silently store a different key than the client meant).
pub(super) fn percent_decode_strict(s: &str) -> Result<Vec<u8>, String> {
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
pub(super) fn key_segments(uri: &Uri) -> Vec<&str> {
    uri.path()
        .strip_prefix("/key/")
        .map(|rest| rest.split('/').collect())
        .unwrap_or_default()
}

pub(super) fn decode_key(raw: &str) -> Result<Vec<u8>, ApiError> {
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

pub(super) async fn missing_key() -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "bad key: empty (want /key/{k})")
}

/// The key of a `/key/{k}` request.
pub(super) fn key_of(uri: &Uri) -> Result<Vec<u8>, ApiError> {
    match key_segments(uri).first() {
        Some(raw) => decode_key(raw),
        None => Err(ApiError::new(StatusCode::BAD_REQUEST, "missing key")),
    }
}

/// Puts `bytes` into `obj[field]`: a string if UTF-8, else base64 with `{field}encoding`.
pub(super) fn put_bytes(obj: &mut Map<String, Json>, field: &str, enc_field: &str, bytes: &[u8]) {
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

pub(super) fn key_json(key: &[u8]) -> Map<String, Json> {
    let mut obj = Map::new();
    put_bytes(&mut obj, "key", "key_encoding", key);
    obj
}

/// `?ttl=` and `?flags=` of a PUT.
#[derive(Default)]
pub(super) struct PutOptions {
    pub(super) exptime: i64,
    pub(super) flags: u32,
}

pub(super) fn put_options(uri: &Uri) -> Result<PutOptions, ApiError> {
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
pub(super) fn wants_raw(headers: &HeaderMap) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
}
