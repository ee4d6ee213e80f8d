//! API keys (`--api-key`, `--api-key-file`, `FERRITE_API_KEY`): with any configured, every
//! route but `/health`, `/ready` and `/metrics` needs one, presented as
//! `Authorization: Bearer KEY` or `x-api-key: KEY`, and compared in constant time.

use std::path::Path;

use anyhow::{Context, Result};
use axum::http::HeaderMap;

use crate::error::ApiError;

/// The keys that open the protected routes; none means the server is open.
#[derive(Default)]
pub struct ApiKeys {
    keys: Vec<Vec<u8>>,
}

impl ApiKeys {
    /// The keys given on the command line (or in `FERRITE_API_KEY`) plus those of `file`,
    /// one per line (blank lines and lines starting with `#` skipped).
    pub fn new(keys: &[String], file: Option<&Path>) -> Result<Self> {
        // Surrounding whitespace (a newline from a secret file, say) is not part of a key:
        // the key a client sends is trimmed too.
        let mut all: Vec<String> = keys.iter().map(|k| k.trim().to_string()).collect();
        if let Some(file) = file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading the API key file {}", file.display()))?;
            all.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_string),
            );
            anyhow::ensure!(
                !all.is_empty(),
                "the API key file {} holds no key",
                file.display()
            );
        }
        anyhow::ensure!(
            all.iter().all(|k| !k.trim().is_empty()),
            "an API key is empty"
        );
        Ok(Self {
            keys: all.into_iter().map(String::into_bytes).collect(),
        })
    }

    /// Whether any key is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Whether the request's headers present one of the keys.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if !self.is_enabled() {
            return Ok(());
        }
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                // The scheme's name is case-insensitive (RFC 7235).
                let (scheme, token) = v.trim_start().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then_some(token)
            });
        let header = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        let Some(given) = bearer.or(header) else {
            return Err(ApiError::Unauthorized(
                "no API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`".into(),
            ));
        };
        // Every key is compared, so the time taken says nothing about which matched.
        let matched = self.keys.iter().fold(false, |found, key| {
            constant_time_eq(given.trim().as_bytes(), key) | found
        });
        if matched {
            Ok(())
        } else {
            Err(ApiError::Unauthorized("the API key is not valid".into()))
        }
    }
}

/// Byte-wise equality whose time depends only on the lengths, not on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).copied().unwrap_or(0),
            b.get(i).copied().unwrap_or(0),
        );
        diff |= std::hint::black_box(usize::from(x ^ y));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn keys_open_the_door_on_either_header() {
        let keys = ApiKeys::new(&["k1".into(), "second-key".into()], None).unwrap();
        assert!(keys.check(&headers("authorization", "Bearer k1")).is_ok());
        assert!(keys.check(&headers("x-api-key", "second-key")).is_ok());
        for bad in [
            headers("authorization", "Bearer k2"),
            headers("authorization", "k1"),
            headers("x-api-key", "second"),
            HeaderMap::new(),
        ] {
            let err = keys.check(&bad).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::UNAUTHORIZED);
            assert_eq!(err.body().error.kind, "authentication_error");
        }
        assert!(ApiKeys::default().check(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn padded_keys_match_and_the_scheme_is_case_insensitive() {
        let keys = ApiKeys::new(&[" padded \n".into()], None).unwrap();
        for value in [
            "Bearer padded",
            "BEARER padded",
            "bearer  padded ",
            "bEaReR padded",
        ] {
            assert!(
                keys.check(&headers("authorization", value)).is_ok(),
                "{value}"
            );
        }
        assert!(keys
            .check(&headers("authorization", "Basic padded"))
            .is_err());
        assert!(keys
            .check(&headers("authorization", "Bearerpadded"))
            .is_err());
    }

    #[test]
    fn a_key_file_adds_one_key_per_line() {
        let path = std::env::temp_dir().join(format!("ferrite-keys-{}", std::process::id()));
        std::fs::write(&path, "# keys\nfrom-file\n\n  other  \n").unwrap();
        let keys = ApiKeys::new(&[], Some(&path)).unwrap();
        assert!(keys.check(&headers("x-api-key", "other")).is_ok());
        assert!(keys
            .check(&headers("authorization", "Bearer from-file"))
            .is_ok());
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(ApiKeys::new(&[], Some(&path)).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn equality_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
