//! Cross-origin requests from browser pages (`--allowed-origins`): the preflight
//! `OPTIONS` answered before any key check (browsers send no credentials with it), and
//! `Access-Control-Allow-Origin` on the answers to listed origins. None by default: a page
//! served from elsewhere cannot read the API's answers unless the operator says so.

use axum::extract::Request;
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The origins whose pages may call the API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// No cross-origin access (the default).
    #[default]
    None,
    /// Any origin (`*`).
    Any,
    /// These origins (`scheme://host[:port]`, compared without case); an entry
    /// `scheme://*.domain[:port]` stands for every subdomain of `domain` (not `domain`
    /// itself).
    List(Vec<String>),
}

impl AllowedOrigins {
    /// From the option's values: `*` alone allows any origin; an empty list none.
    pub fn new(values: &[String]) -> Result<Self, String> {
        let values: Vec<String> = values
            .iter()
            .map(|v| v.trim().trim_end_matches('/').to_ascii_lowercase())
            .filter(|v| !v.is_empty())
            .collect();
        if values.iter().any(|v| v == "*") {
            return Ok(Self::Any);
        }
        let is_origin = |v: &str| {
            let rest = v
                .strip_prefix("http://")
                .or_else(|| v.strip_prefix("https://"));
            // scheme://host[:port], no path, query or space; a `*` only as a whole
            // first label followed by a domain.
            rest.is_some_and(|r| {
                let host = r.strip_prefix("*.").unwrap_or(r);
                !host.is_empty()
                    && !host.starts_with(['.', ':'])
                    && !host.contains(['/', '?', '#', ' ', '*'])
            })
        };
        if let Some(bad) = values.iter().find(|v| !is_origin(v)) {
            return Err(format!(
                "`{bad}` is not an origin: write scheme://host[:port], such as https://app.example.com, scheme://*.domain for its subdomains, or *"
            ));
        }
        Ok(if values.is_empty() {
            Self::None
        } else {
            Self::List(values)
        })
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if allowed.
    fn allow(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            Self::None => None,
            Self::Any => Some(HeaderValue::from_static("*")),
            Self::List(list) => {
                let origin_text = origin
                    .to_str()
                    .ok()?
                    .trim_end_matches('/')
                    .to_ascii_lowercase();
                list.iter()
                    .any(|o| matches_origin(o, &origin_text))
                    .then(|| origin.clone())
            }
        }
    }
}

/// Whether `origin` (lower case) is the listed `entry`, or one of the subdomains a
/// `scheme://*.domain[:port]` entry stands for.
fn matches_origin(entry: &str, origin: &str) -> bool {
    let Some(star) = entry.find("://*.") else {
        return entry == origin;
    };
    let (scheme, domain) = (&entry[..star + 3], &entry[star + 4..]);
    origin
        .strip_prefix(scheme)
        .and_then(|host| host.strip_suffix(domain))
        .is_some_and(|sub| !sub.is_empty() && !sub.contains(['/', ':', '@', '?', '#', ' ', '*']))
}

/// Methods the API's routes take.
const METHODS: &str = "GET, POST, OPTIONS";
/// Headers a page may send when the preflight names none (the ones the API reads).
const DEFAULT_HEADERS: &str = "authorization, content-type, x-api-key, x-request-id";
/// Headers of the answers a page may read besides the simple ones.
const EXPOSED: &str = "x-request-id, retry-after, x-should-retry";
/// Seconds a browser may keep a preflight's answer.
const MAX_AGE: &str = "600";

/// Answers preflights and marks the answers to allowed origins. Outside the key check:
/// a preflight carries no key.
pub async fn apply(origins: &AllowedOrigins, request: Request, next: Next) -> Response {
    // With a list of origins the answer depends on `Origin`, present or not: a cache
    // must not give one origin's answer to another.
    let varies = matches!(origins, AllowedOrigins::List(_));
    let Some(origin) = request.headers().get(ORIGIN).cloned() else {
        let mut response = next.run(request).await;
        if varies {
            response
                .headers_mut()
                .append(VARY, HeaderValue::from_static("origin"));
        }
        return response;
    };
    let allowed = origins.allow(&origin);
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        return match allowed {
            Some(allow) => preflight_answer(allow, request.headers()),
            None => refused(&origin),
        };
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.append(VARY, HeaderValue::from_static("origin"));
    if let Some(allow) = allowed {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        headers.insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
    }
    response
}

/// 204 with what the page may send: the methods, and the headers it asked for.
fn preflight_answer(allow: HeaderValue, request: &HeaderMap) -> Response {
    let asked = request
        .get(ACCESS_CONTROL_REQUEST_HEADERS)
        .filter(|v| v.to_str().is_ok_and(|s| s.len() <= 4096))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static(DEFAULT_HEADERS));
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow);
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(METHODS),
    );
    headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked);
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static(MAX_AGE));
    headers.insert(
        VARY,
        HeaderValue::from_static("origin, access-control-request-headers"),
    );
    response
}

/// A preflight from an origin not listed: a 403 that names it (the browser then refuses
/// the page's request).
fn refused(origin: &HeaderValue) -> Response {
    let shown: String = String::from_utf8_lossy(origin.as_bytes())
        .chars()
        .take(200)
        .collect();
    ApiError::OriginNotAllowed(shown).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_parsed_and_matched() {
        assert_eq!(AllowedOrigins::new(&[]).unwrap(), AllowedOrigins::None);
        assert_eq!(
            AllowedOrigins::new(&["https://a.example".into(), "*".into()]).unwrap(),
            AllowedOrigins::Any
        );
        for bad in [
            "a.example",
            "https://",
            "https://a.example/app",
            "http://a b",
        ] {
            assert!(AllowedOrigins::new(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(AllowedOrigins::new(&["http://localhost:3000".into()]).is_ok());
        let list = AllowedOrigins::new(&["https://A.example/".into()]).unwrap();
        let origin = HeaderValue::from_static("https://a.example");
        assert_eq!(list.allow(&origin), Some(origin.clone()));
        assert_eq!(
            list.allow(&HeaderValue::from_static("https://b.example")),
            None
        );
        assert_eq!(AllowedOrigins::None.allow(&origin), None);
        // A wildcard stands for subdomains only, of that scheme and port.
        let wild = AllowedOrigins::new(&["https://*.example".into()]).unwrap();
        for ok in ["https://a.example", "https://A.b.example"] {
            assert!(wild.allow(&HeaderValue::from_static(ok)).is_some(), "{ok}");
        }
        for bad in [
            "https://example",
            "http://a.example",
            "https://a.example:8443",
            "https://evil.com/.example",
            "https://a.example.evil",
            "https://evilexample",
        ] {
            assert!(
                wild.allow(&HeaderValue::from_static(bad)).is_none(),
                "{bad}"
            );
        }
        for bad in [
            "https://*example",
            "https://a.*.example",
            "https://*.",
            "https://*",
        ] {
            assert!(AllowedOrigins::new(&[bad.into()]).is_err(), "{bad}");
        }
        assert_eq!(
            AllowedOrigins::Any.allow(&origin),
            Some(HeaderValue::from_static("*"))
        );
    }
}
